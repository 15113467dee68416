/*
 * GPT-2 layout search: the context's helpers, collective geometry, the cost walk of the
 * model graph per item and option (compute, boxing, collectives, memory) and the
 * boundary plans between stages (edge and tied-embedding exchange times).
 * See docs/SEARCH.md for the formulas.
 */
#include "search/search.h"
#include "search/search_gpt_priv.h"
#include "search/search_priv.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "models/gpt2_graph.h"
#include "models/gpt2_par.h"
#include "nn/strategy.h"
#include "sched/schedule.h"
#include "xm_core.h"
#include "util/xmp_err.h"

/* ------------------------------------------------------------ contexts */

int xmp_search__ctx_fail(ctx_t *c, const char *fmt, ...)
{
    if (!c->failed) {
        va_list ap;
        va_start(ap, fmt);
        xmp_verr_buf(c->err, c->errlen, fmt, ap);
        va_end(ap);
    }
    c->failed = 1;
    return -1;
}

/* Local elements of a tensor (dims, nd) with per-axis SBPs on a mesh (ceil per split). */
double xmp_search__local_elems(const int64_t *dim, int nd, const xmp_sbp_t *sbp, const int *shape,
                               int nax)
{
    double e = 1;
    for (int d = 0; d < nd; d++) {
        int64_t split = 1;
        for (int a = 0; a < nax; a++)
            if (sbp[a].kind == XMP_S && sbp[a].dim == d)
                split *= shape[a];
        e *= (double)((dim[d] + split - 1) / split);
    }
    return e;
}

/* 1 when every split of every dim is even. */
int xmp_search__even_splits(const int64_t *dim, int nd, const xmp_sbp_t *sbp, const int *shape,
                            int nax)
{
    for (int d = 0; d < nd; d++) {
        int64_t split = 1;
        for (int a = 0; a < nax; a++)
            if (sbp[a].kind == XMP_S && sbp[a].dim == d)
                split *= shape[a];
        if (dim[d] % split)
            return 0;
    }
    return 1;
}

/* ---------------------------------------------------- collective geometry */

/* Geometry of the groups of mesh axis a of a stage on ranks rank0.. */
static void axis_geom(const ctx_t *c, int rank0, const int *shape, int nax, int a,
                      xm_coll_geom_t *g);

void xmp_search_axis_geom(int nranks, int hosts, int rank0, int ndim, const int *shape, int axis,
                          xm_coll_geom_t *g)
{
    ctx_t c;
    memset(&c, 0, sizeof c);
    c.rph = nranks / hosts;
    axis_geom(&c, rank0, shape, ndim, axis, g);
}

static void axis_geom(const ctx_t *c, int rank0, const int *shape, int nax, int a,
                      xm_coll_geom_t *g)
{
    int stride = 1, size = 1;
    for (int b = nax - 1; b > a; b--)
        stride *= shape[b];
    for (int b = 0; b < nax; b++)
        size *= shape[b];
    int p = shape[a], rph = c->rph;
    /* the group of the stage's first rank: rank0 + k * stride */
    int hosts = 0, most = 0, first_host = rank0 / rph, on_first = 0;
    int last_host = -1, run = 0;
    for (int k = 0; k < p; k++) {
        int h = (rank0 + k * stride) / rph;
        if (h != last_host) {
            hosts++;
            run = 0;
            last_host = h;
        }
        run++;
        if (run > most)
            most = run;
        if (h == first_host)
            on_first++;
    }
    /* stage ranks on the first host */
    int lo = rank0, hi = rank0 + size; /* [lo, hi) */
    int hl = first_host * rph, hh = hl + rph;
    int stage_on_first = (hi < hh ? hi : hh) - (lo > hl ? lo : hl);
    g->group_size = p;
    g->ranks_per_host = most;
    g->hosts = hosts;
    g->share = on_first > 0 ? stage_on_first / on_first : 1;
    if (g->share < 1)
        g->share = 1;
    if (c->o && c->o->no_share)
        g->share = 1;
}

/* The latency of one collective over axis a: its predicted time for 0 bytes (the fit's alpha,
 * scaled to the group as xm_cost_collective does). */
static double coll_alpha(ctx_t *c, int rank0, const int *shape, int nax, int a, xm_coll_t kind)
{
    if (shape[a] <= 1)
        return 0;
    xm_coll_geom_t g;
    axis_geom(c, rank0, shape, nax, a, &g);
    xm_cost_pred_t p;
    return xm_cost_collective(c->o->cost, kind, &g, 0, &p) ? 0 : p.seconds;
}

/* Adds the time of one collective over axis a (bytes = n of xm_costmodel.h). */
static double coll(ctx_t *c, int rank0, const int *shape, int nax, int a, xm_coll_t kind,
                   double bytes, double *vol)
{
    if (shape[a] <= 1 || bytes <= 0)
        return 0;
    xm_coll_geom_t g;
    axis_geom(c, rank0, shape, nax, a, &g);
    xm_cost_pred_t p;
    xmesh_result_t r = xm_cost_collective(c->o->cost, kind, &g, bytes, &p);
    if (r) {
        xmp_search__ctx_fail(c, "cost model: %s over %d ranks (%d per host, %d hosts): %s",
                             xm_coll_name(kind), g.group_size, g.ranks_per_host, g.hosts,
                             xmesh_last_error());
        return 0;
    }
    if (vol)
        *vol += xm_coll_volume(kind, bytes, shape[a]);
    return p.seconds;
}

static double gemm(ctx_t *c, double m, double n, double k)
{
    if (m <= 0 || n <= 0 || k <= 0)
        return 0;
    xm_cost_pred_t p;
    if (xm_cost_gemm(c->o->cost, (int64_t)m, (int64_t)n, (int64_t)k, &p)) {
        xmp_search__ctx_fail(c, "cost model: sgemm %.0fx%.0fx%.0f: %s", m, n, k,
                             xmesh_last_error());
        return 0;
    }
    return p.seconds * c->cf;
}

/* Accumulator of one item's walk. */
typedef struct {
    int rank0, nax;
    const int *shape;
    double f, b, comp, compf, vol;
    double ncf, ncb; /* collectives added to f, to b */
} walk_t;

/* One collective over axis a in the forward (fcoll) or backward (bcoll) of the walk: its time
 * into w->f or w->b, counted in w->ncf or w->ncb. */
static void fcoll(ctx_t *c, walk_t *w, int a, xm_coll_t kind, double bytes, double *vol)
{
    double t = coll(c, w->rank0, w->shape, w->nax, a, kind, bytes, vol);
    if (t > 0) {
        w->f += t;
        w->ncf++;
    }
}

static void bcoll(ctx_t *c, walk_t *w, int a, xm_coll_t kind, double bytes, double *vol)
{
    double t = coll(c, w->rank0, w->shape, w->nax, a, kind, bytes, vol);
    if (t > 0) {
        w->b += t;
        w->ncb++;
    }
}

/* Element-wise work of `units` (xm_costmodel.h's units of kind) at the calibrated rate of the
 * trainer's kernels: forward into w->f, backward into w->b, both into w->comp. Returns 1 when
 * the cluster file has that rate, 0 when not (nothing added: files from before the eltwise
 * records, and the nominal model). */
static int elt(ctx_t *c, walk_t *w, xm_elt_t kind, double units)
{
    double f = 0, b = 0;
    int have = xm_cost_elt(c->o->cost, kind, units, &f, &b);
    if (have <= 0)
        return 0;
    f *= c->cf;
    b *= c->cf;
    w->f += f;
    w->b += b;
    w->comp += f + b;
    w->compf += f;
    return 1;
}

/* Boxing from -> to of a tensor whose local size under `from` is elems:
 * forward time into w->f, the dual (all-gather <-> reduce-scatter) into w->b. */
static void box(ctx_t *c, walk_t *w, const xmp_sbp_t *from, const xmp_sbp_t *to, double elems)
{
    double cur = elems * F32, v = 0;
    for (int pass = 0; pass < 4; pass++)
        for (int a = 0; a < w->nax; a++) {
            xmp_sbp_t x = from[a], y = to[a];
            if (xmp_sbp_eq(x, y) || w->shape[a] <= 1)
                continue;
            int p = w->shape[a];
            if (pass == 0 && x.kind == XMP_P && y.kind == XMP_S) {
                fcoll(c, w, a, XM_COLL_REDUCE_SCATTER, cur, &v);
                bcoll(c, w, a, XM_COLL_ALLGATHER, cur, NULL);
                cur /= p;
            } else if (pass == 0 && x.kind == XMP_P && y.kind == XMP_B) {
                fcoll(c, w, a, XM_COLL_ALLREDUCE, cur, &v);
                bcoll(c, w, a, XM_COLL_ALLREDUCE, cur, NULL);
            } else if (pass == 1 && x.kind == XMP_S && y.kind == XMP_S) {
                fcoll(c, w, a, XM_COLL_ALLTOALL, cur, &v);
                bcoll(c, w, a, XM_COLL_ALLTOALL, cur, NULL);
            } else if (pass == 2 && x.kind == XMP_S && y.kind == XMP_B) {
                cur *= p;
                fcoll(c, w, a, XM_COLL_ALLGATHER, cur, &v);
                bcoll(c, w, a, XM_COLL_REDUCE_SCATTER, cur, NULL);
            } else if (pass == 3 && x.kind == XMP_B && y.kind == XMP_S) {
                cur /= p; /* a local slice */
            }
        }
    w->vol += 2 * v; /* forward and backward */
}

const xmp_sbp_t *xmp_search__cls(const opt_t *o, const char *name)
{
    const xmp_strategy_entry_t *e = xmp_strategy_get(&o->s, name);
    static const xmp_sbp_t bb[NAX] = {{XMP_B, 0}, {XMP_B, 0}, {XMP_B, 0}, {XMP_B, 0}};
    return e ? e->sbp : bb;
}

/* P axes of an input boxed to B first; returns the SBP the op sees in x2. */
static void unpartial(ctx_t *c, walk_t *w, const xmp_sbp_t *x, double elems, xmp_sbp_t *x2)
{
    int any = 0;
    for (int a = 0; a < w->nax; a++) {
        x2[a] = x[a];
        if (x[a].kind == XMP_P) {
            x2[a] = xmp_sbp_b();
            any = 1;
        }
    }
    if (any)
        box(c, w, x, x2, elems);
}

/* y = x w^T: x (rows..., K) with xnd dims, w (N..., K) with wnd dims; output
 * boxed to the class SBP outc. */
static void linear(ctx_t *c, walk_t *w, const xmp_sbp_t *xs, const int64_t *xd, int xnd,
                   const xmp_sbp_t *ws, const int64_t *wd, int wnd, const xmp_sbp_t *outc)
{
    xmp_sbp_t x[NAX], out[NAX];
    unpartial(c, w, xs, xmp_search__local_elems(xd, xnd, xs, w->shape, w->nax), x);
    double rows = 1, N = 1, K = (double)xd[xnd - 1];
    for (int d = 0; d < xnd - 1; d++)
        rows *= (double)xd[d];
    for (int d = 0; d < wnd - 1; d++)
        N *= (double)wd[d];
    double rs = 1, ks = 1, ns = 1;
    for (int a = 0; a < w->nax; a++) {
        int p = w->shape[a];
        int xrow = x[a].kind == XMP_S && x[a].dim < xnd - 1;
        int xk = x[a].kind == XMP_S && x[a].dim == xnd - 1;
        int wk = ws[a].kind == XMP_S && ws[a].dim == wnd - 1;
        int wn = ws[a].kind == XMP_S && ws[a].dim < wnd - 1;
        if (xk || wk) {
            ks *= p;
            out[a] = xmp_sbp_p();
        } else if (xrow) {
            rs *= p;
            out[a] = x[a];
        } else if (wn) {
            ns *= p;
            out[a] = xmp_sbp_s(xnd - 1 + ws[a].dim);
        } else {
            out[a] = xmp_sbp_b();
        }
    }
    double rl = ceil(rows / rs), nl = ceil(N / ns), kl = ceil(K / ks);
    double tf = gemm(c, rl, nl, kl);
    double tb = gemm(c, rl, kl, nl) + gemm(c, nl, kl, rl);
    w->f += tf;
    w->b += tb;
    w->comp += tf + tb;
    w->compf += tf;
    int64_t od[8];
    int ond = 0;
    for (int d = 0; d < xnd - 1; d++)
        od[ond++] = xd[d];
    for (int d = 0; d < wnd - 1; d++)
        od[ond++] = wd[d];
    box(c, w, out, outc, xmp_search__local_elems(od, ond, out, w->shape, w->nax));
}

/* Layer norm over the last dim: statistics all-reduced where it is split. */
static void layernorm(ctx_t *c, walk_t *w, const xmp_sbp_t *xs, const int64_t *xd,
                      const xmp_sbp_t *outc)
{
    xmp_sbp_t x[NAX];
    unpartial(c, w, xs, xmp_search__local_elems(xd, 3, xs, w->shape, w->nax), x);
    /* rows of this rank: local elements over local channels */
    int64_t cs = 1;
    for (int a = 0; a < w->nax; a++)
        if (x[a].kind == XMP_S && x[a].dim == 2)
            cs *= w->shape[a];
    double rl =
        xmp_search__local_elems(xd, 3, x, w->shape, w->nax) / ceil((double)xd[2] / (double)cs);
    double v = 0;
    elt(c, w, XM_ELT_LAYERNORM, xmp_search__local_elems(xd, 3, x, w->shape, w->nax));
    for (int a = 0; a < w->nax; a++)
        if (x[a].kind == XMP_S && x[a].dim == 2) {
            fcoll(c, w, a, XM_COLL_ALLREDUCE, 2 * rl * F32, &v);
            bcoll(c, w, a, XM_COLL_ALLREDUCE, 2 * rl * F32, NULL);
        }
    w->vol += 2 * v;
    box(c, w, x, outc, xmp_search__local_elems(xd, 3, x, w->shape, w->nax));
}

/* Causal attention on qkv (Bm, T, 3, NH, hs) -> (Bm, T, C) boxed to outc. */
static void attention(ctx_t *c, walk_t *w, const xmp_sbp_t *qs, const int64_t *qd,
                      const int64_t *yd, const xmp_sbp_t *outc, double *probs_elems)
{
    xmp_sbp_t q[NAX], y[NAX];
    double qel = xmp_search__local_elems(qd, 5, qs, w->shape, w->nax);
    unpartial(c, w, qs, qel, q);
    qel = xmp_search__local_elems(qd, 5, q, w->shape, w->nax);
    double bs = 1, hsplit = 1, ts = 1, v = 0;
    for (int a = 0; a < w->nax; a++) {
        y[a] = xmp_sbp_b();
        if (q[a].kind != XMP_S)
            continue;
        if (q[a].dim == 0) {
            bs *= w->shape[a];
            y[a] = xmp_sbp_s(0);
        } else if (q[a].dim == 3) {
            hsplit *= w->shape[a];
            y[a] = xmp_sbp_s(2);
        } else if (q[a].dim == 1) {
            ts *= w->shape[a];
            y[a] = xmp_sbp_s(1);
        }
    }
    for (int a = 0; a < w->nax; a++)
        if (q[a].kind == XMP_S && q[a].dim == 1) { /* K and V gathered over the sequence */
            double n = qel * 2.0 / 3.0 * F32 * w->shape[a];
            fcoll(c, w, a, XM_COLL_ALLGATHER, n, &v);
            bcoll(c, w, a, XM_COLL_REDUCE_SCATTER, n, NULL);
        }
    w->vol += 2 * v;
    double T = (double)qd[1], hs = (double)qd[4];
    double bl = ceil((double)qd[0] / bs), hl = ceil((double)qd[3] / hsplit), tq = ceil(T / ts);
    /* the trainer's attention loops (scores, softmax, values) at their calibrated rate; without
     * it, the two products as sgemm (forward; twice that backward) */
    if (!elt(c, w, XM_ELT_ATTENTION, bl * hl * tq * T * hs)) {
        double tf = bl * hl * (gemm(c, tq, T, hs) + gemm(c, tq, hs, T));
        w->f += tf;
        w->b += 2 * tf;
        w->comp += 3 * tf;
        w->compf += tf;
    }
    *probs_elems = bl * hl * tq * T;
    box(c, w, y, outc, xmp_search__local_elems(yd, 3, y, w->shape, w->nax));
}

/* Parameter of shape (dims) with the strategy entry of class name: memory and
 * the per-step reduction (+ the gathers of sharded storage). */
static void param(ctx_t *c, walk_t *w, const opt_t *o, const char *name, const int64_t *dim, int nd,
                  icost_t *ic)
{
    const xmp_strategy_entry_t *e = xmp_strategy_get(&o->s, name);
    if (!e)
        return;
    const xmp_sbp_t *cs = e->sbp, *ss = e->has_store ? e->store : e->sbp;
    double comp = xmp_search__local_elems(dim, nd, cs, w->shape, w->nax);
    double stored = xmp_search__local_elems(dim, nd, ss, w->shape, w->nax);
    int sharded = 0;
    for (int a = 0; a < w->nax; a++)
        sharded |= !xmp_sbp_eq(cs[a], ss[a]);
    ic->mem_static += F32 * (3 * stored + comp + (sharded ? comp : 0));
    ic->stored += F32 * stored;
    ic->grad += F32 * comp;
    ic->compute += F32 * comp;
    double cur = comp * F32, v = 0;
    for (int a = 0; a < w->nax; a++) {
        if (cs[a].kind != XMP_B || w->shape[a] <= 1)
            continue;
        xm_coll_t k[2] = {XM_COLL_ALLREDUCE, XM_COLL_ALLREDUCE};
        int nk = 1;
        if (ss[a].kind == XMP_S) {
            k[0] = XM_COLL_REDUCE_SCATTER;
            k[1] = XM_COLL_ALLGATHER;
            nk = 2;
        }
        for (int j = 0; j < nk; j++) {
            ic->r += coll(c, w->rank0, w->shape, w->nax, a, k[j], cur, &v);
            double al = coll_alpha(c, w->rank0, w->shape, w->nax, a, k[j]);
            ic->r_alpha_sum += al;
            ic->r_alpha_max = fmax(ic->r_alpha_max, al);
        }
        if (ss[a].kind == XMP_S)
            cur /= w->shape[a];
    }
    ic->r_bytes += v;
    double upd = 0;
    if (xm_cost_elt(c->o->cost, XM_ELT_ADAMW, stored, &upd, NULL) > 0)
        ic->o += upd * c->cf; /* the trainer's xmp_adamw at its calibrated rate */
    else
        ic->o += ADAMW_FLOPS * stored / c->gemm_rate;
}

/* One node of the model graph (nn/graph.h) priced by its kind under option o: compute,
 * boxing and collectives into w; the bytes of what it keeps for the backward (the value
 * operands it saves, attention's probabilities) into ic->act. */
static void node_cost(ctx_t *c, walk_t *w, const opt_t *o, const xmp_gnode_t *n, icost_t *ic)
{
    const xmp_graph_t *g = &c->graph;
    const xmp_gvalue_t *y = &g->val[n->out], *x = &g->val[n->in[0].id];
    const xmp_sbp_t *xs = xmp_search__cls(o, x->cls), *ys = xmp_search__cls(o, y->cls);
    const int nax = o->ndim;
    double probs = 0;
    switch (n->kind) {
    case XMP_GOP_EMBEDDING: { /* the table's split turned into the output's, then + wpe */
        const xmp_sbp_t *ws = xmp_search__cls(o, g->param[n->in[1].id].cls);
        xmp_sbp_t e[NAX];
        for (int a = 0; a < nax; a++)
            e[a] =
                ws[a].kind == XMP_S ? (ws[a].dim == 0 ? xmp_sbp_p() : xmp_sbp_s(2)) : xmp_sbp_b();
        box(c, w, e, ys, xmp_search__local_elems(y->dim, y->nd, e, o->shape, nax));
        /* token + position embedding: one sum per element */
        elt(c, w, XM_ELT_RESIDUAL, xmp_search__local_elems(y->dim, y->nd, ys, o->shape, nax));
        break;
    }
    case XMP_GOP_LAYERNORM:
        layernorm(c, w, xs, x->dim, ys);
        break;
    case XMP_GOP_LINEAR: {
        const xmp_gparam_t *wp = &g->param[n->in[1].id];
        linear(c, w, xs, x->dim, x->nd, xmp_search__cls(o, wp->cls), wp->dim, wp->nd, ys);
        break;
    }
    case XMP_GOP_ATTENTION:
        attention(c, w, xs, x->dim, y->dim, ys, &probs);
        break;
    case XMP_GOP_GELU: {
        xmp_sbp_t u[NAX];
        unpartial(c, w, xs, xmp_search__local_elems(x->dim, x->nd, xs, o->shape, nax), u);
        elt(c, w, XM_ELT_GELU, xmp_search__local_elems(x->dim, x->nd, u, o->shape, nax));
        box(c, w, u, ys, xmp_search__local_elems(x->dim, x->nd, u, o->shape, nax));
        break;
    }
    case XMP_GOP_ADD: /* the residual sums */
        elt(c, w, XM_ELT_RESIDUAL, xmp_search__local_elems(y->dim, y->nd, ys, o->shape, nax));
        break;
    case XMP_GOP_XENT: { /* softmax statistics all-reduced where the vocabulary is split */
        double le = xmp_search__local_elems(x->dim, x->nd, xs, o->shape, nax), v = 0;
        int64_t vs = 1;
        for (int a = 0; a < nax; a++)
            if (xs[a].kind == XMP_S && xs[a].dim == x->nd - 1)
                vs *= o->shape[a];
        double rl = le / ceil((double)x->dim[x->nd - 1] / (double)vs);
        elt(c, w, XM_ELT_XENT, le);
        for (int a = 0; a < nax; a++)
            if (xs[a].kind == XMP_S && xs[a].dim == x->nd - 1)
                fcoll(c, w, a, XM_COLL_ALLREDUCE, 2 * rl * F32, &v);
        w->vol += v;
        break;
    }
    default:
        xmp_search__ctx_fail(c, "search: GPT graph node '%s' of kind %s has no cost", n->what,
                             xmp_gop_name(n->kind));
        return;
    }
    double kept = probs;
    for (int k = 0; k < n->nin; k++)
        if (!n->in[k].is_param && (n->saves >> k & 1u)) {
            const xmp_gvalue_t *v = &g->val[n->in[k].id];
            kept +=
                xmp_search__local_elems(v->dim, v->nd, xmp_search__cls(o, v->cls), o->shape, nax);
        }
    if (n->saves & XMP_G_SAVE_OUT)
        kept += xmp_search__local_elems(y->dim, y->nd, ys, o->shape, nax);
    ic->act += F32 * kept;
}

/* The costs of one item kind (E, t, L) of option oi on stage s: the nodes and parameters of
 * the model graph's group of that item (gpt2_graph.h: the groups are E, t, L), in graph order;
 * IT_W is the tied wte alone (the L stage's copy when E is elsewhere: xmp_search__stage_cost adds
 * it only then). */
static void item_costs(ctx_t *c, int s, int oi)
{
    const opt_t *o = &c->opt[oi];
    const xmp_graph_t *g = &c->graph;
    for (int it = 0; it < NIT; it++) {
        icost_t *ic = &c->ic[((size_t)s * c->nopt + oi) * NIT + it];
        memset(ic, 0, sizeof *ic);
        walk_t w = {s * c->n, o->ndim, o->shape, 0, 0, 0, 0, 0, 0, 0};
        for (int i = 0; it != IT_W && i < g->nnode; i++)
            if (g->node[i].group == it)
                node_cost(c, &w, o, &g->node[i], ic);
        for (int i = 0; i < g->nparam; i++) {
            const xmp_gparam_t *p = &g->param[i];
            if (it == IT_W ? !strcmp(p->cls, "wte") : p->group == it)
                param(c, &w, o, p->cls, p->dim, p->nd, ic);
        }
        ic->f = w.f;
        ic->b = w.b;
        ic->comp = w.comp;
        ic->compf = w.compf;
        ic->box_bytes = w.vol;
        ic->ncf = w.ncf;
        ic->ncb = w.ncb;
    }
    c->icdone[(size_t)s * c->nopt + oi] = 1;
}

const icost_t *xmp_search__icost(ctx_t *c, int s, int oi)
{
    if (!c->icdone[(size_t)s * c->nopt + oi])
        item_costs(c, s, oi);
    return &c->ic[((size_t)s * c->nopt + oi) * NIT];
}

/* ------------------------------------------------------- boundary plans */

/* Predicted time of moving a tensor (nd, dims) from the mesh of option a on
 * ranks ra.. (spec sa) to option b on ranks rb.. (spec sb), by xmesh's
 * decomposer, scheduler and simulator (xmesh_plan_predict: the two meshes as
 * distinct devices, on the hosts of their ranks). */
static double plan_time(ctx_t *c, int nd, const int64_t *dims, const opt_t *a, int ra,
                        const char *sa, const opt_t *b, int rb, const char *sb)
{
    int na = 1, nb = 1;
    for (int i = 0; i < a->ndim; i++)
        na *= a->shape[i];
    for (int i = 0; i < b->ndim; i++)
        nb *= b->shape[i];
    int ndev = na + nb;
    int *host = malloc(sizeof(int) * (size_t)ndev), *devs = malloc(sizeof(int) * (size_t)ndev);
    int *hid = calloc((size_t)(c->o->hosts + 1), sizeof(int));
    double t = NAN;
    if (!host || !devs || !hid) {
        xmp_search__ctx_fail(c, "out of memory");
        goto out_free;
    }
    int nh = 0;
    for (int i = 0; i < c->o->hosts; i++)
        hid[i] = -1;
    for (int i = 0; i < ndev; i++) {
        int r = i < na ? ra + i : rb + (i - na);
        int h = r / c->rph;
        if (hid[h] < 0)
            hid[h] = nh++;
        host[i] = hid[h];
        devs[i] = i;
    }
    xmesh_placement_problem_t pb = {nd,      dims,     XMESH_F32, a->ndim, a->shape, devs, sa,
                                    b->ndim, b->shape, devs + na, sb,      ndev,     host};
    const xm_cluster_t *k = c->o->cluster;
    xmesh_cluster_model_t model;
    if (k)
        model = (xmesh_cluster_model_t){k->nics_per_host, k->nic_send_Bps, k->nic_recv_Bps,
                                        k->intra_Bps,     k->latency_s,    k->chunk_bytes,
                                        k->send_ahead};
    xmesh_predict_opts_t po = {XMESH_SCHEDULER_GREEDY, XMESH_STRATEGY_BROADCAST, 1,
                               c->o->max_evals > 0 ? c->o->max_evals : 2000};
    xmesh_prediction_t pr;
    if (xmesh_plan_predict(&pb, k ? &model : NULL, &po, &pr)) {
        xmp_search__ctx_fail(c, "boundary plan: %s", xmesh_last_error());
        goto out_free;
    }
    t = pr.predicted_s;
    if (c->st)
        c->st->boundary_plans++;
out_free:
    free(host);
    free(devs);
    free(hid);
    return t;
}

/* For search_ut.c (search/search_priv.h): plan_time on raw meshes. */
int xmp_search__plan_seconds(int nranks, int hosts, const xm_cluster_t *cluster, int max_evals,
                             int nd, const int64_t *dims, int nda, const int *sha, int ra,
                             const char *sa, int ndb, const int *shb, int rb, const char *sb,
                             double *out, char *err, size_t errlen)
{
    xmp_search_opts_t o;
    memset(&o, 0, sizeof o);
    o.nranks = nranks;
    o.hosts = hosts;
    o.cluster = cluster;
    o.max_evals = max_evals;
    ctx_t c;
    memset(&c, 0, sizeof c);
    c.o = &o;
    c.rph = nranks / hosts;
    c.err = err;
    c.errlen = errlen;
    opt_t a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    a.ndim = nda;
    b.ndim = ndb;
    memcpy(a.shape, sha, sizeof(int) * (size_t)nda);
    memcpy(b.shape, shb, sizeof(int) * (size_t)ndb);
    double t = plan_time(&c, nd, dims, &a, ra, sa, &b, rb, sb);
    if (c.failed)
        return -1;
    *out = t;
    return 0;
}

void xmp_search__spec_of(const opt_t *o, const char *cl, int store, char *buf, size_t n)
{
    const xmp_strategy_entry_t *e = xmp_strategy_get(&o->s, cl);
    xmp_strategy_sbp_string(store && e->has_store ? e->store : e->sbp, o->ndim, buf, n);
}

/* Boundary s -> s+1 between signatures ga and gb (options ia, ib carry them). */
double xmp_search__edge_time(ctx_t *c, int s, int ia, int ib)
{
    if (c->o->no_boundary)
        return 0;
    int ga = c->opt[ia].sig, gb = c->opt[ib].sig;
    double *e = &c->edge[((size_t)s * c->nsig + ga) * c->nsig + gb];
    if (isnan(*e)) {
        char sa[64], sb[64];
        xmp_search__spec_of(&c->opt[ia], "act.x", 0, sa, sizeof sa);
        xmp_search__spec_of(&c->opt[ib], "act.x", 0, sb, sizeof sb);
        int64_t d[3] = {c->Bm, c->o->T, c->o->model.channels};
        *e = plan_time(c, 3, d, &c->opt[ia], s * c->n, sa, &c->opt[ib], (s + 1) * c->n, sb);
    }
    return *e;
}

/* The last stage's tied-wte exchange with the first, priced as a plan between
 * the last stage's wte storage and the same layout on stage 0's ranks. */
double xmp_search__tied_time(ctx_t *c, int oi)
{
    if (c->o->no_boundary)
        return 0;
    if (isnan(c->tied[oi])) {
        char sp[64];
        xmp_search__spec_of(&c->opt[oi], "wte", 1, sp, sizeof sp);
        int64_t d[2] = {c->o->model.padded_vocab_size, c->o->model.channels};
        c->tied[oi] = plan_time(c, 2, d, &c->opt[oi], (c->S - 1) * c->n, sp, &c->opt[oi], 0, sp);
    }
    return c->tied[oi];
}
