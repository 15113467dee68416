/*
 * GPT-2 layout search (issue 21 items 2 and 3): the model of a configuration,
 * the exact chain DP, the exhaustive oracle and the simulator re-ranking.
 * See search.h for the contract and docs/SEARCH.md for the formulas.
 */
#include "search/search.h"
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

#define NAX 4
#define XMP_SEARCH_MAX_SIG 4096 /* act.x placements per stage size (<= options) */
#define F32 4.0
/* AdamW: flops per stored element priced at the sgemm rate (a rough term). */
#define ADAMW_FLOPS 12.0

static const char *const g_strat[XMP_SEARCH_NSTRAT] = {"dp", "megatron", "3d", "axonn"};

const char *xmp_search_strategy_name(int i)
{
    return i >= 0 && i < XMP_SEARCH_NSTRAT ? g_strat[i] : NULL;
}

/* ------------------------------------------------------------ contexts */

/* The items priced apart: the model graph's groups (gpt2_graph.h), and IT_W: the tied wte alone
 * (the L stage's copy). */
enum { IT_E = XMP_GPT2_G_EMBED, IT_T = XMP_GPT2_G_BLOCK, IT_L = XMP_GPT2_G_HEAD, IT_W, NIT };

typedef struct {
    double f, b;      /* seconds per microbatch: forward, backward (compute + boxing) */
    double comp;      /* of which compute (f + b) */
    double compf;     /* of comp, the forward's */
    double box_bytes; /* per-rank boxing volume per microbatch (f + b) */
    double ncf, ncb;  /* collectives per microbatch in f, in b */
    double r, o;      /* per step: gradient reduction (+ gathers), optimizer */
    double r_bytes;   /* per-rank volume of r */
    double r_alpha_sum, r_alpha_max; /* the latencies (alpha) of r's collectives: sum, largest */
    double mem_static;               /* parameters, optimizer, gradients (bytes) */
    double stored, grad, compute;    /* bytes: stored parameters, gradients, compute copies */
    double act;                      /* activation bytes per microbatch in flight */
} icost_t;

typedef struct {
    int ndim, shape[NAX], strat, sig;
    xmp_strategy_t s;
} opt_t;

typedef struct {
    const xmp_search_opts_t *o;
    int S, n, M, Bm, rph;
    int nopt;
    opt_t *opt;
    icost_t *ic;  /* [S][nopt][NIT] */
    char *icdone; /* [S][nopt] */
    int nsig;
    uint64_t *sighash;
    double *edge;      /* [S][nsig][nsig], NAN: not computed (edge s -> s+1) */
    double *tied;      /* [nopt]: tied wte exchange of the last stage, NAN: not computed */
    double gemm_rate;  /* flop/s of a 256^3 sgemm (optimizer term) */
    double cf;         /* compute factor of the gptstep record (step_factor; 1: none) */
    xmp_graph_t graph; /* the model of one microbatch with one block (gpt2_graph.h) */
    char *err;
    size_t errlen;
    int failed;
    xmp_search_stats_t *st;
} ctx_t;

static int ctx_fail(ctx_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int ctx_fail(ctx_t *c, const char *fmt, ...)
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
static double local_elems(const int64_t *dim, int nd, const xmp_sbp_t *sbp, const int *shape,
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
static int even_splits(const int64_t *dim, int nd, const xmp_sbp_t *sbp, const int *shape, int nax)
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
        ctx_fail(c, "cost model: %s over %d ranks (%d per host, %d hosts): %s", xm_coll_name(kind),
                 g.group_size, g.ranks_per_host, g.hosts, xmesh_last_error());
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
        ctx_fail(c, "cost model: sgemm %.0fx%.0fx%.0f: %s", m, n, k, xmesh_last_error());
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

static const xmp_sbp_t *cls(const opt_t *o, const char *name)
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
    unpartial(c, w, xs, local_elems(xd, xnd, xs, w->shape, w->nax), x);
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
    box(c, w, out, outc, local_elems(od, ond, out, w->shape, w->nax));
}

/* Layer norm over the last dim: statistics all-reduced where it is split. */
static void layernorm(ctx_t *c, walk_t *w, const xmp_sbp_t *xs, const int64_t *xd,
                      const xmp_sbp_t *outc)
{
    xmp_sbp_t x[NAX];
    unpartial(c, w, xs, local_elems(xd, 3, xs, w->shape, w->nax), x);
    /* rows of this rank: local elements over local channels */
    int64_t cs = 1;
    for (int a = 0; a < w->nax; a++)
        if (x[a].kind == XMP_S && x[a].dim == 2)
            cs *= w->shape[a];
    double rl = local_elems(xd, 3, x, w->shape, w->nax) / ceil((double)xd[2] / (double)cs);
    double v = 0;
    elt(c, w, XM_ELT_LAYERNORM, local_elems(xd, 3, x, w->shape, w->nax));
    for (int a = 0; a < w->nax; a++)
        if (x[a].kind == XMP_S && x[a].dim == 2) {
            fcoll(c, w, a, XM_COLL_ALLREDUCE, 2 * rl * F32, &v);
            bcoll(c, w, a, XM_COLL_ALLREDUCE, 2 * rl * F32, NULL);
        }
    w->vol += 2 * v;
    box(c, w, x, outc, local_elems(xd, 3, x, w->shape, w->nax));
}

/* Causal attention on qkv (Bm, T, 3, NH, hs) -> (Bm, T, C) boxed to outc. */
static void attention(ctx_t *c, walk_t *w, const xmp_sbp_t *qs, const int64_t *qd,
                      const int64_t *yd, const xmp_sbp_t *outc, double *probs_elems)
{
    xmp_sbp_t q[NAX], y[NAX];
    double qel = local_elems(qd, 5, qs, w->shape, w->nax);
    unpartial(c, w, qs, qel, q);
    qel = local_elems(qd, 5, q, w->shape, w->nax);
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
    box(c, w, y, outc, local_elems(yd, 3, y, w->shape, w->nax));
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
    double comp = local_elems(dim, nd, cs, w->shape, w->nax);
    double stored = local_elems(dim, nd, ss, w->shape, w->nax);
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
    const xmp_sbp_t *xs = cls(o, x->cls), *ys = cls(o, y->cls);
    const int nax = o->ndim;
    double probs = 0;
    switch (n->kind) {
    case XMP_GOP_EMBEDDING: { /* the table's split turned into the output's, then + wpe */
        const xmp_sbp_t *ws = cls(o, g->param[n->in[1].id].cls);
        xmp_sbp_t e[NAX];
        for (int a = 0; a < nax; a++)
            e[a] =
                ws[a].kind == XMP_S ? (ws[a].dim == 0 ? xmp_sbp_p() : xmp_sbp_s(2)) : xmp_sbp_b();
        box(c, w, e, ys, local_elems(y->dim, y->nd, e, o->shape, nax));
        /* token + position embedding: one sum per element */
        elt(c, w, XM_ELT_RESIDUAL, local_elems(y->dim, y->nd, ys, o->shape, nax));
        break;
    }
    case XMP_GOP_LAYERNORM:
        layernorm(c, w, xs, x->dim, ys);
        break;
    case XMP_GOP_LINEAR: {
        const xmp_gparam_t *wp = &g->param[n->in[1].id];
        linear(c, w, xs, x->dim, x->nd, cls(o, wp->cls), wp->dim, wp->nd, ys);
        break;
    }
    case XMP_GOP_ATTENTION:
        attention(c, w, xs, x->dim, y->dim, ys, &probs);
        break;
    case XMP_GOP_GELU: {
        xmp_sbp_t u[NAX];
        unpartial(c, w, xs, local_elems(x->dim, x->nd, xs, o->shape, nax), u);
        elt(c, w, XM_ELT_GELU, local_elems(x->dim, x->nd, u, o->shape, nax));
        box(c, w, u, ys, local_elems(x->dim, x->nd, u, o->shape, nax));
        break;
    }
    case XMP_GOP_ADD: /* the residual sums */
        elt(c, w, XM_ELT_RESIDUAL, local_elems(y->dim, y->nd, ys, o->shape, nax));
        break;
    case XMP_GOP_XENT: { /* softmax statistics all-reduced where the vocabulary is split */
        double le = local_elems(x->dim, x->nd, xs, o->shape, nax), v = 0;
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
        ctx_fail(c, "search: GPT graph node '%s' of kind %s has no cost", n->what,
                 xmp_gop_name(n->kind));
        return;
    }
    double kept = probs;
    for (int k = 0; k < n->nin; k++)
        if (!n->in[k].is_param && (n->saves >> k & 1u)) {
            const xmp_gvalue_t *v = &g->val[n->in[k].id];
            kept += local_elems(v->dim, v->nd, cls(o, v->cls), o->shape, nax);
        }
    if (n->saves & XMP_G_SAVE_OUT)
        kept += local_elems(y->dim, y->nd, ys, o->shape, nax);
    ic->act += F32 * kept;
}

/* The costs of one item kind (E, t, L) of option oi on stage s: the nodes and parameters of
 * the model graph's group of that item (gpt2_graph.h: the groups are E, t, L), in graph order;
 * IT_W is the tied wte alone (the L stage's copy when E is elsewhere: stage_cost adds it only
 * then). */
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

static const icost_t *icost(ctx_t *c, int s, int oi)
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
        ctx_fail(c, "out of memory");
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
        ctx_fail(c, "boundary plan: %s", xmesh_last_error());
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

static void spec_of(const opt_t *o, const char *cl, int store, char *buf, size_t n)
{
    const xmp_strategy_entry_t *e = xmp_strategy_get(&o->s, cl);
    xmp_strategy_sbp_string(store && e->has_store ? e->store : e->sbp, o->ndim, buf, n);
}

/* Boundary s -> s+1 between signatures ga and gb (options ia, ib carry them). */
static double edge_time(ctx_t *c, int s, int ia, int ib)
{
    if (c->o->no_boundary)
        return 0;
    int ga = c->opt[ia].sig, gb = c->opt[ib].sig;
    double *e = &c->edge[((size_t)s * c->nsig + ga) * c->nsig + gb];
    if (isnan(*e)) {
        char sa[64], sb[64];
        spec_of(&c->opt[ia], "act.x", 0, sa, sizeof sa);
        spec_of(&c->opt[ib], "act.x", 0, sb, sizeof sb);
        int64_t d[3] = {c->Bm, c->o->T, c->o->model.channels};
        *e = plan_time(c, 3, d, &c->opt[ia], s * c->n, sa, &c->opt[ib], (s + 1) * c->n, sb);
    }
    return *e;
}

/* The last stage's tied-wte exchange with the first, priced as a plan between
 * the last stage's wte storage and the same layout on stage 0's ranks. */
static double tied_time(ctx_t *c, int oi)
{
    if (c->o->no_boundary)
        return 0;
    if (isnan(c->tied[oi])) {
        char sp[64];
        spec_of(&c->opt[oi], "wte", 1, sp, sizeof sp);
        int64_t d[2] = {c->o->model.padded_vocab_size, c->o->model.channels};
        c->tied[oi] = plan_time(c, 2, d, &c->opt[oi], (c->S - 1) * c->n, sp, &c->opt[oi], 0, sp);
    }
    return c->tied[oi];
}

/* ------------------------------------------------------------ options */

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 1099511628211ull;
    }
    return h;
}

/* Signature of act.x's placement: the block of every rank (same blocks, same
 * boundary cost). */
static uint64_t xsig(const opt_t *o, int64_t Bm, int64_t T, int64_t C, int n)
{
    char sp[64];
    spec_of(o, "act.x", 0, sp, sizeof sp);
    xm_layout_t l;
    memset(&l, 0, sizeof l);
    int64_t d[3] = {Bm, T, C};
    int devs[256];
    for (int i = 0; i < n && i < 256; i++)
        devs[i] = i;
    l.ndim = 3;
    memcpy(l.shape, d, sizeof d);
    l.elem_size = 4;
    l.mesh.ndim = o->ndim;
    memcpy(l.mesh.shape, o->shape, sizeof(int) * (size_t)o->ndim);
    l.mesh.ndev = n;
    l.mesh.devs = devs;
    uint64_t h = 1469598103934665603ull;
    if (n > 256 || xm_spec_parse(sp, 3, o->ndim, &l.spec)) {
        /* no canonical form: its own signature */
        h = fnv(h, o->shape, sizeof o->shape);
        return fnv(h, &o->strat, sizeof o->strat);
    }
    for (int i = 0; i < n; i++) {
        int64_t lo[XM_MAX_DIMS], hi[XM_MAX_DIMS];
        xm_layout_block(&l, i, lo, hi);
        h = fnv(h, lo, sizeof(int64_t) * 3);
        h = fnv(h, hi, sizeof(int64_t) * 3);
    }
    return h;
}

/* Ordered factorizations of n into 1..4 factors >= 2 ("1" for n = 1). */
static void fact_rec(int rest, int depth, int *f, int (*out)[NAX], int *nd, int *cnt, int cap)
{
    if (rest == 1) {
        if (depth > 0 && *cnt < cap) {
            memcpy(out[*cnt], f, sizeof(int) * NAX);
            nd[*cnt] = depth;
            (*cnt)++;
        }
        return;
    }
    if (depth == NAX)
        return;
    for (int k = 2; k <= rest; k++)
        if (rest % k == 0) {
            f[depth] = k;
            fact_rec(rest / k, depth + 1, f, out, nd, cnt, cap);
            f[depth] = 1;
        }
}

static int factorizations(int n, int (*out)[NAX], int *nd, int cap)
{
    int f[NAX] = {1, 1, 1, 1}, cnt = 0;
    if (n == 1) {
        memcpy(out[0], f, sizeof f);
        nd[0] = 1;
        return 1;
    }
    fact_rec(n, 0, f, out, nd, &cnt, cap);
    return cnt;
}

/* Builds the valid (mesh, strategy) options of stages of n ranks at Bm rows. */
static int build_options(ctx_t *c)
{
    int(*fac)[NAX] = malloc(sizeof(int[NAX]) * 512);
    int *nd = malloc(sizeof(int) * 512);
    if (!fac || !nd) {
        free(fac);
        free(nd);
        return ctx_fail(c, "out of memory");
    }
    int nf = factorizations(c->n, fac, nd, 512);
    c->opt = calloc((size_t)nf * XMP_SEARCH_NSTRAT + 1, sizeof(opt_t));
    if (!c->opt) {
        free(fac);
        free(nd);
        return ctx_fail(c, "out of memory");
    }
    const xmp_gpt2_config_t *m = &c->o->model;
    int64_t C = m->channels, NH = m->num_heads, hs = C / NH, T = c->o->T, Bm = c->Bm;
    int64_t Vp = m->padded_vocab_size;
    for (int i = 0; i < nf; i++)
        for (int k = 0; k < XMP_SEARCH_NSTRAT; k++) {
            unsigned mask = c->o->strategies ? c->o->strategies : 0xFu;
            if (!(mask & (1u << k)))
                continue;
            opt_t *o = &c->opt[c->nopt];
            memset(o, 0, sizeof *o);
            o->ndim = nd[i];
            memcpy(o->shape, fac[i], sizeof(int) * NAX);
            for (int a = o->ndim; a < NAX; a++)
                o->shape[a] = 1;
            o->strat = k;
            char text[8192], msg[512];
            if (xmp_gpt2_strategy_builtin(g_strat[k], o->ndim, text, sizeof text, msg,
                                          sizeof msg) != 0)
                continue;
            if (xmp_strategy_parse(text, g_strat[k], &o->s, msg, sizeof msg))
                continue;
            if (xmp_gpt2_strategy_check(&o->s, m, 0, o->ndim, o->shape, msg, sizeof msg))
                continue;
            /* every class split evenly at these sizes */
            static const struct {
                const char *cl;
                int nd;
                int kind; /* dims below */
            } chk[] = {{"act.x", 3, 0},   {"act.ln1", 3, 0},  {"act.ln2", 3, 0},
                       {"act.lnf", 3, 0}, {"act.att", 3, 0},  {"act.qkv", 5, 1},
                       {"act.fch", 3, 2}, {"act.gelu", 3, 2}, {"act.logits", 3, 3},
                       {"qkv.w", 4, 4},   {"qkv.b", 3, 5},    {"attproj.w", 2, 6},
                       {"fc.w", 2, 7},    {"fc.b", 1, 8},     {"fcproj.w", 2, 9},
                       {"wte", 2, 10},    {"ln1.w", 1, 11}};
            int ok = 1;
            for (size_t q = 0; ok && q < sizeof chk / sizeof chk[0]; q++) {
                int64_t d[5];
                switch (chk[q].kind) {
                case 0:
                    d[0] = Bm, d[1] = T, d[2] = C;
                    break;
                case 1:
                    d[0] = Bm, d[1] = T, d[2] = 3, d[3] = NH, d[4] = hs;
                    break;
                case 2:
                    d[0] = Bm, d[1] = T, d[2] = 4 * C;
                    break;
                case 3:
                    d[0] = Bm, d[1] = T, d[2] = Vp;
                    break;
                case 4:
                    d[0] = 3, d[1] = NH, d[2] = hs, d[3] = C;
                    break;
                case 5:
                    d[0] = 3, d[1] = NH, d[2] = hs;
                    break;
                case 6:
                    d[0] = C, d[1] = C;
                    break;
                case 7:
                    d[0] = 4 * C, d[1] = C;
                    break;
                case 8:
                    d[0] = 4 * C;
                    break;
                case 9:
                    d[0] = C, d[1] = 4 * C;
                    break;
                case 10:
                    d[0] = Vp, d[1] = C;
                    break;
                default:
                    d[0] = C;
                    break;
                }
                const xmp_strategy_entry_t *e = xmp_strategy_get(&o->s, chk[q].cl);
                if (e && !even_splits(d, chk[q].nd, e->sbp, o->shape, o->ndim))
                    ok = 0;
                /* storage may split unevenly (boxing follows numpy.array_split) */
            }
            if (!ok)
                continue;
            uint64_t h = xsig(o, Bm, T, C, c->n);
            int g = 0;
            while (g < c->nsig && c->sighash[g] != h)
                g++;
            if (g == c->nsig) {
                uint64_t *nh = realloc(c->sighash, sizeof(uint64_t) * (size_t)(c->nsig + 1));
                if (!nh) {
                    free(fac);
                    free(nd);
                    return ctx_fail(c, "out of memory");
                }
                c->sighash = nh;
                c->sighash[c->nsig++] = h;
            }
            o->sig = g;
            c->nopt++;
        }
    free(fac);
    free(nd);
    return 0;
}

static void ctx_free(ctx_t *c)
{
    free(c->opt);
    free(c->ic);
    free(c->icdone);
    free(c->sighash);
    free(c->edge);
    free(c->tied);
    xmp_graph_free(&c->graph);
    memset(c, 0, sizeof *c);
}

/* The compute factor of the cost model's gptstep record: its measured step (the serial GPT-2,
 * every rank busy) over the same model priced here from the kernel records (one rank, one
 * stage, one microbatch: compute + optimizer). 1 without a record, under no_step (which the
 * probe itself runs with), or when the probe cannot be priced. */
static double step_factor(const xmp_search_opts_t *o)
{
    xmp_gptstep_t gs;
    const xmp_gptstep_t *g = o->cost && !xmp_gptstep_get(o->cost, &gs) ? &gs : NULL;
    if (!g || g->busy <= 0 || o->no_step)
        return 1;
    xmp_search_opts_t p;
    memset(&p, 0, sizeof p);
    p.model = (xmp_gpt2_config_t){g->seq,    g->vocab, xmp_gpt2_pad_vocab(g->vocab, 128),
                                  g->layers, g->heads, g->channels};
    p.vocab = g->vocab;
    p.B = g->rows;
    p.T = g->seq;
    p.nranks = p.hosts = 1;
    p.cost = o->cost;
    p.cluster = o->cluster;
    p.fixed_M = 1;
    p.max_evals = o->max_evals;
    p.no_boundary = p.no_cpu_share = p.no_step = 1;
    xmp_search_cand_t c;
    memset(&c, 0, sizeof c);
    c.nstages = 1;
    c.M = 1;
    c.sched = XMP_SCHED_1F1B;
    c.nblocks[0] = g->layers;
    c.ndim[0] = 1;
    c.shape[0][0] = 1;
    c.strategy[0] = 0; /* dp */
    char e[256];
    if (xmp_search_gpt_eval(&p, &c, e, sizeof e))
        return 1;
    double composed = c.stage_compute_s[0] + c.stage_o_s[0];
    return composed > 0 && isfinite(composed) ? g->seconds / composed : 1;
}

/* cf: step_factor(o), computed once by the caller (a search inits a context per S and M). */
static int ctx_init(ctx_t *c, const xmp_search_opts_t *o, int S, int M, double cf,
                    xmp_search_stats_t *st, char *err, size_t errlen)
{
    memset(c, 0, sizeof *c);
    c->o = o;
    c->S = S;
    c->n = o->nranks / S;
    c->M = M;
    c->Bm = o->B / M;
    c->rph = o->nranks / o->hosts;
    c->err = err;
    c->errlen = errlen;
    c->st = st;
    xm_cost_pred_t p;
    if (xm_cost_gemm(o->cost, 256, 256, 256, &p) || !(p.seconds > 0))
        return ctx_fail(c, "cost model: sgemm: %s", xmesh_last_error());
    c->gemm_rate = 2.0 * 256 * 256 * 256 / p.seconds;
    c->cf = cf;
    if (xmp_gpt2_graph(&o->model, c->Bm, o->T, 1, &c->graph))
        return ctx_fail(c, "%s", xmp_last_error());
    if (build_options(c))
        return -1;
    if (c->nopt == 0)
        return 0;
    size_t ns = (size_t)c->nsig;
    c->ic = calloc((size_t)S * (size_t)c->nopt * NIT, sizeof(icost_t));
    c->icdone = calloc((size_t)S * (size_t)c->nopt, 1);
    c->edge = malloc(sizeof(double) * (size_t)S * ns * ns);
    c->tied = malloc(sizeof(double) * (size_t)c->nopt);
    if (!c->ic || !c->icdone || !c->edge || !c->tied)
        return ctx_fail(c, "out of memory");
    for (size_t i = 0; i < (size_t)S * ns * ns; i++)
        c->edge[i] = NAN;
    for (int i = 0; i < c->nopt; i++)
        c->tied[i] = NAN;
    return 0;
}

/* ------------------------------------------------------ stage costs */

static int inflight(int kind, int s, int S, int M)
{
    int k = kind == XMP_SCHED_GPIPE ? M : kind == XMP_SCHED_1F1B ? S - s : 2 * (S - s) - 1;
    return k < M ? k : M;
}

typedef struct {
    double f, b, comp, compf, box, r, o, ro, mem, memp, mema, box_bytes, r_bytes, ncf, ncb;
    double stored, grad, compute;
    double r_alpha_sum, r_alpha_max;
} scost_t;

/* Stage s with nb blocks on option oi (E on stage 0, L on the last). */
static void stage_cost(ctx_t *c, int s, int oi, int nb, int kind, scost_t *sc)
{
    const icost_t *ic = icost(c, s, oi);
    int hasE = s == 0, hasL = s == c->S - 1;
    memset(sc, 0, sizeof *sc);
    double w[NIT] = {hasE, nb, hasL, 0};
    for (int it = 0; it < NIT; it++) {
        sc->f += w[it] * ic[it].f;
        sc->b += w[it] * ic[it].b;
        sc->comp += w[it] * ic[it].comp;
        sc->compf += w[it] * ic[it].compf;
        sc->r += w[it] * ic[it].r;
        sc->r_alpha_sum += w[it] * ic[it].r_alpha_sum;
        if (w[it] > 0)
            sc->r_alpha_max = fmax(sc->r_alpha_max, ic[it].r_alpha_max);
        sc->o += w[it] * ic[it].o;
        sc->memp += w[it] * ic[it].mem_static;
        sc->mema += w[it] * ic[it].act;
        sc->box_bytes += w[it] * ic[it].box_bytes;
        sc->ncf += w[it] * ic[it].ncf;
        sc->ncb += w[it] * ic[it].ncb;
        sc->r_bytes += w[it] * ic[it].r_bytes;
        sc->stored += w[it] * ic[it].stored;
        sc->grad += w[it] * ic[it].grad;
        sc->compute += w[it] * ic[it].compute;
    }
    if (hasL && !hasE) {
        /* the L stage keeps its own copy of the tied wte: memory, reduction,
         * optimizer (the E item's wte figures), and the exchange with stage 0 */
        sc->memp += ic[IT_W].mem_static;
        sc->stored += ic[IT_W].stored;
        sc->grad += ic[IT_W].grad;
        sc->compute += ic[IT_W].compute;
        sc->r += ic[IT_W].r + tied_time(c, oi);
        sc->r_alpha_sum += ic[IT_W].r_alpha_sum;
        sc->r_alpha_max = fmax(sc->r_alpha_max, ic[IT_W].r_alpha_max);
        sc->r_bytes += ic[IT_W].r_bytes;
        sc->o += ic[IT_W].o;
    }
    /* --overlap defer-grad: the reductions posted at once overlap their latencies */
    if (c->o->defer_grad && !c->o->no_overlap)
        sc->r -= sc->r_alpha_sum - sc->r_alpha_max;
    sc->box = sc->f + sc->b - sc->comp;
    sc->ro = sc->r + sc->o;
    sc->mema *= inflight(kind, s, c->S, c->M);
    sc->mem = sc->memp + sc->mema;
}

static int mem_ok(const ctx_t *c, double mem)
{
    return !(c->o->memory_limit > 0) || mem <= c->o->memory_limit;
}

/* ------------------------------------------------------------------ DP */

typedef struct {
    double sum, mb, mr;
    int prev_state, prev_entry, opt, j;
} entry_t;

typedef struct {
    entry_t *e;
    int n, cap;
} front_t;

static int front_add(front_t *f, const entry_t *x)
{
    for (int i = 0; i < f->n; i++) {
        const entry_t *y = &f->e[i];
        if (y->sum <= x->sum && y->mb <= x->mb && y->mr <= x->mr)
            return 0; /* dominated */
    }
    int k = 0;
    for (int i = 0; i < f->n; i++) {
        const entry_t *y = &f->e[i];
        if (!(x->sum <= y->sum && x->mb <= y->mb && x->mr <= y->mr))
            f->e[k++] = *y;
    }
    f->n = k;
    if (f->n == f->cap) {
        int nc = f->cap ? 2 * f->cap : 4;
        entry_t *ne = realloc(f->e, sizeof(entry_t) * (size_t)nc);
        if (!ne)
            return -1;
        f->e = ne;
        f->cap = nc;
    }
    f->e[f->n++] = *x;
    return 0;
}

static double objective(const ctx_t *c, double sum, double mb, double mr)
{
    return sum + (c->M - 1) * mb + mr;
}

/* The exact chain DP for (S, M, kind) over options whose strategy is in mask.
 * Fills best (nstages, nblocks, opts) and returns its objective (INFINITY if
 * none is feasible). State (k stages placed from the right, blocks [i, L)
 * covered, signature of the leftmost placed stage). */
static double dp_run(ctx_t *c, int kind, unsigned mask, int *best_nb, int *best_opt)
{
    int S = c->S, L = c->o->model.num_layers, G = c->nsig > 0 ? c->nsig : 1;
    size_t nstate = (size_t)(S + 1) * (size_t)(L + 1) * (size_t)G;
    front_t *fr = calloc(nstate, sizeof(front_t));
    double best = INFINITY;
    if (!fr) {
        ctx_fail(c, "out of memory");
        return INFINITY;
    }
#define SID(k, i, g) (((size_t)(k) * (size_t)(L + 1) + (size_t)(i)) * (size_t)G + (size_t)(g))
    int rep[XMP_SEARCH_MAX_SIG];
    for (int g = 0; g < G && g < XMP_SEARCH_MAX_SIG; g++)
        rep[g] = -1;
    for (int q = c->nopt - 1; q >= 0; q--)
        rep[c->opt[q].sig] = q;
    entry_t e0 = {0, 0, 0, -1, -1, -1, -1};
    if (front_add(&fr[SID(0, L, 0)], &e0))
        goto out_oom;
    for (int k = 0; k < S && !c->failed; k++) {
        int s = S - 1 - k;
        for (int i = 1; i <= L; i++)
            for (int g = 0; g < G; g++) {
                front_t *f = &fr[SID(k, i, g)];
                if (!f->n)
                    continue;
                int jlo = s == 0 ? 0 : s, jhi = s == 0 ? 0 : i - 1;
                for (int j = jlo; j <= jhi; j++)
                    for (int oi = 0; oi < c->nopt; oi++) {
                        if (!(mask & (1u << c->opt[oi].strat)))
                            continue;
                        scost_t sc;
                        stage_cost(c, s, oi, i - j, kind, &sc);
                        if (c->failed)
                            goto out;
                        if (!mem_ok(c, sc.mem))
                            continue;
                        double cfb = sc.f + sc.b;
                        double e = 0;
                        if (k > 0) {
                            /* the right neighbour's signature is g; any option of that
                             * signature carries it */
                            e = edge_time(c, s, oi, rep[g]);
                            if (c->failed)
                                goto out;
                        }
                        size_t to = SID(k + 1, j, c->opt[oi].sig);
                        for (int q = 0; q < f->n; q++) {
                            const entry_t *x = &f->e[q];
                            entry_t y;
                            y.sum = x->sum + cfb + 2 * e;
                            y.mb = fmax(x->mb, fmax(cfb, e));
                            y.mr = fmax(x->mr, sc.ro);
                            y.prev_state = (int)SID(k, i, g);
                            y.prev_entry = q;
                            y.opt = oi;
                            y.j = j;
                            if (c->st)
                                c->st->transitions++;
                            if (front_add(&fr[to], &y))
                                goto out_oom;
                        }
                    }
            }
    }
    /* best over the final states (S stages, all blocks) */
    {
        size_t bs = 0;
        int be = -1;
        for (int g = 0; g < G; g++) {
            front_t *f = &fr[SID(S, 0, g)];
            for (int q = 0; q < f->n; q++) {
                double v = objective(c, f->e[q].sum, f->e[q].mb, f->e[q].mr);
                if (v < best) {
                    best = v;
                    bs = SID(S, 0, g);
                    be = q;
                }
            }
        }
        /* reconstruct: the entry at (k, ..) holds the stage s = S - k */
        for (int k = S; be >= 0 && k > 0; k--) {
            const entry_t *x = &fr[bs].e[be];
            int s = S - k;
            best_opt[s] = x->opt;
            /* blocks: from x->j to the previous state's i */
            size_t ps = (size_t)x->prev_state;
            int pi = (int)((ps / (size_t)G) % (size_t)(L + 1));
            best_nb[s] = pi - x->j;
            bs = ps;
            be = x->prev_entry;
        }
    }
    goto out;
out_oom:
    ctx_fail(c, "out of memory");
out:
    for (size_t i = 0; i < nstate; i++)
        free(fr[i].e);
    free(fr);
    if (c->st)
        c->st->dp_runs++;
#undef SID
    return c->failed ? INFINITY : best;
}

/* Smallest peak memory per rank of any configuration of (S, M, kind). */
static double min_memory(ctx_t *c, int kind)
{
    int S = c->S, L = c->o->model.num_layers;
    double *b = malloc(sizeof(double) * (size_t)(S + 1) * (size_t)(L + 1));
    if (!b)
        return INFINITY;
    for (int i = 0; i < (S + 1) * (L + 1); i++)
        b[i] = INFINITY;
    b[0 * (L + 1) + L] = 0;
    for (int k = 0; k < S; k++) {
        int s = S - 1 - k;
        for (int i = 1; i <= L; i++) {
            double v = b[k * (L + 1) + i];
            if (!isfinite(v))
                continue;
            int jlo = s == 0 ? 0 : s, jhi = s == 0 ? 0 : i - 1;
            for (int j = jlo; j <= jhi; j++)
                for (int oi = 0; oi < c->nopt; oi++) {
                    scost_t sc;
                    stage_cost(c, s, oi, i - j, kind, &sc);
                    double m = fmax(v, sc.mem);
                    if (m < b[(k + 1) * (L + 1) + j])
                        b[(k + 1) * (L + 1) + j] = m;
                }
        }
    }
    double r = b[S * (L + 1) + 0];
    free(b);
    return r;
}

/* ---------------------------------------------------- evaluation */

/* Fills c's predictions inside ctx (options chosen by index). */
static int is_compute(const xmp_action_t *a)
{
    return a->kind == XMP_ACT_F || a->kind == XMP_ACT_B || a->kind == XMP_ACT_I ||
           a->kind == XMP_ACT_W;
}

/* Seconds during which group g's and group h's compute actions (F, B, I, W) overlap in res. */
static double overlap_s(const xmp_sim_result_t *res, int g, int h)
{
    double o = 0;
    int i = 0, j = 0;
    while (i < res->len[g] && j < res->len[h]) {
        if (!is_compute(&res->acts[g][i])) {
            i++;
            continue;
        }
        if (!is_compute(&res->acts[h][j])) {
            j++;
            continue;
        }
        double lo = fmax(res->t0[g][i], res->t0[h][j]), hi = fmin(res->t1[g][i], res->t1[h][j]);
        if (hi > lo)
            o += hi - lo;
        if (res->t1[g][i] < res->t1[h][j])
            i++;
        else
            j++;
    }
    return o;
}

/* Each stage's F and B seconds with its compute scaled by factor[s] and its collectives
 * charged pen[s] each (ncf, ncb: NULL for none). */
static void scaled_costs(const xmp_sim_costs_t *c, int S, const double *compf, const double *compb,
                         const double *ncf, const double *ncb, const double *factor,
                         const double *pen, double *f, double *b)
{
    for (int s = 0; s < S; s++) {
        f[s] = c->f[s] - compf[s] * (1 - factor[s]) + (ncf ? ncf[s] * pen[s] : 0);
        b[s] = (c->b ? c->b[s] : 0) - compb[s] * (1 - factor[s]) + (ncb ? ncb[s] * pen[s] : 0);
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* CPU factors from res's timeline, time-resolved: the compute time is cut at every start and
 * end of any stage's compute action; in each piece, a stage s computing there gets the largest
 * over its ranks of xm_cost_cpu_share with s's ranks busy and every other stage's ranks busy
 * at that stage's compute fraction cf[h] when it is in a compute action there, else waiting;
 * the work s does in the piece is its length / that factor (its rate against the calibrated
 * one). factor[s]: s's compute time / its work; afac (NULL: not wanted; else a row per stage,
 * indexed as res->acts[s]): the same per compute action (1 for the others). So a stage that
 * computes half its time alone (factor 0.5) and half together with a stage on the same cpu
 * (1) gets 1 / (0.5 / 0.5 + 0.5 / 1) = 2/3, not the 0.75 of the mean number of busy ranks
 * (the rate averages over time, not the ranks competing; docs/SEARCH.md "CPU sharing"), and
 * per action, its lone actions 0.5 and its shared ones 1. busy: nranks scratch. 1 where s has
 * no compute or on failure (out of memory). */
static void share_factors(const xmp_sim_result_t *res, int S, const double *cf, const int *rank0,
                          const int *nr, int nranks, const xm_costmodel_t *cost, double *busy,
                          double *factor, double *const *afac)
{
    int np = 0;
    for (int s = 0; s < S; s++) {
        factor[s] = 1;
        np += 2 * res->len[s];
        for (int i = 0; afac && i < res->len[s]; i++)
            afac[s][i] = 0; /* work so far */
    }
    double *pt = malloc(((size_t)np + 1) * sizeof *pt);
    if (!pt) {
        for (int s = 0; afac && s < S; s++)
            for (int i = 0; i < res->len[s]; i++)
                afac[s][i] = 1;
        return;
    }
    int n = 0, at[XMP_SEARCH_MAX_STAGES], on[XMP_SEARCH_MAX_STAGES];
    double work[XMP_SEARCH_MAX_STAGES], tot[XMP_SEARCH_MAX_STAGES];
    for (int s = 0; s < S; s++) {
        at[s] = 0;
        work[s] = tot[s] = 0;
        for (int i = 0; i < res->len[s]; i++)
            if (is_compute(&res->acts[s][i]) && res->t1[s][i] > res->t0[s][i]) {
                pt[n++] = res->t0[s][i];
                pt[n++] = res->t1[s][i];
            }
    }
    qsort(pt, (size_t)n, sizeof *pt, cmp_double);
    for (int p = 0; p + 1 < n; p++) {
        double len = pt[p + 1] - pt[p], mid = 0.5 * (pt[p] + pt[p + 1]);
        if (!(len > 0))
            continue;
        /* which stages compute over the piece (a stage's compute actions are in time order) */
        for (int s = 0; s < S; s++) {
            while (at[s] < res->len[s] &&
                   (!is_compute(&res->acts[s][at[s]]) || res->t1[s][at[s]] <= mid))
                at[s]++;
            on[s] = at[s] < res->len[s] && res->t0[s][at[s]] <= mid;
        }
        for (int s = 0; s < S; s++) {
            if (!on[s])
                continue;
            for (int h = 0; h < S; h++)
                for (int q = rank0[h]; q < rank0[h] + nr[h] && q < nranks; q++)
                    busy[q] = h == s ? 1.0 : on[h] ? fmin(1.0, fmax(0.0, cf[h])) : 0.0;
            double worst = 0;
            for (int q = rank0[s]; q < rank0[s] + nr[s] && q < nranks; q++) {
                double g = 1;
                if (xm_cost_cpu_share(cost, nranks, busy, q, &g) == 1 && g > worst)
                    worst = g;
            }
            if (!(worst > 0))
                worst = 1;
            work[s] += len / worst;
            tot[s] += len;
            if (afac)
                afac[s][at[s]] += len / worst;
        }
    }
    for (int s = 0; s < S; s++) {
        factor[s] = work[s] > 0 ? tot[s] / work[s] : 1;
        for (int i = 0; afac && i < res->len[s]; i++)
            afac[s][i] = afac[s][i] > 0 ? (res->t1[s][i] - res->t0[s][i]) / afac[s][i] : 1;
    }
    free(pt);
}

int xmp_search__sim_shared(const xmp_schedule_t *sch, const xmp_sim_costs_t *c, int S,
                           const double *compf, const double *compb, const double *ncf,
                           const double *ncb, const int *rank0, const int *nr, int nranks,
                           const xm_costmodel_t *cost, int off, double *factor, double *sync_s,
                           xmp_sim_result_t *res, char *err, size_t errlen)
{
    double pen[XMP_SEARCH_MAX_STAGES]; /* extra seconds per collective of stage s */
    double one[XMP_SEARCH_MAX_STAGES];
    for (int s = 0; s < S; s++) {
        factor[s] = 1;
        one[s] = 1;
        pen[s] = 0;
        if (sync_s)
            sync_s[s] = 0;
    }
    double *busy = NULL, *af = NULL;
    int shared = !off && S >= 1 && cost && cost->ncpusets > 0 && cost->cpu_nranks == nranks &&
                 !xmp_sched_is_virtual(sch) && sch->ngroups == S;
    /* one stage: nothing to lend, only the collectives' sync can apply */
    int any_sync = 0;
    for (int k = 0; shared && ncf && ncb && k < cost->ncpusets; k++)
        any_sync |= cost->cpusets[k].sync > 0;
    if (S == 1 && !any_sync)
        shared = 0;
    /* per action (S > 1): each F and B its own factor, from the contention over its own span
     * (a stage's lone actions in the fill and drain run faster than its shared ones in the
     * steady phase, and they are the ones on the critical path); af: the factors, then the
     * seconds added (xmp_sim_costs_t.act_add), a row per stage as sch->acts[s] */
    size_t na = 0;
    for (int s = 0; shared && s < S; s++)
        na += (size_t)sch->len[s];
    if (shared && ((busy = malloc((size_t)nranks * sizeof *busy)) == NULL ||
                   (S > 1 && (af = malloc(3 * (na + 1) * sizeof *af)) == NULL)))
        shared = 0; /* out of memory: the plain simulation */
    double *arow[XMP_SEARCH_MAX_STAGES], *anew[XMP_SEARCH_MAX_STAGES], *aadd[XMP_SEARCH_MAX_STAGES];
    const double *crow[XMP_SEARCH_MAX_STAGES];
    for (int s = 0, o = 0; af && s < S; o += sch->len[s], s++) {
        arow[s] = af + o;
        anew[s] = af + (na + 1) + o;
        aadd[s] = af + 2 * (na + 1) + o;
        crow[s] = aadd[s];
        for (int i = 0; i < sch->len[s]; i++)
            arow[s][i] = 1;
    }
    xmp_sim_costs_t k = *c;
    double f[XMP_SEARCH_MAX_STAGES], b[XMP_SEARCH_MAX_STAGES];
    int r = 0, per_action = af != NULL && !c->act_add;
    /* damped fixed point: at most 40 runs, stop when no factor or penalty moves by 1e-6 */
    for (int it = 0; it <= (shared ? 40 : 0); it++) {
        /* per action: the stages' compute at the calibrated rate, each action's own factor
         * added as seconds; else each stage's compute scaled by its factor */
        scaled_costs(c, S, compf, compb, ncf, ncb, per_action ? one : factor, pen, f, b);
        for (int s = 0; per_action && s < S; s++)
            for (int i = 0; i < sch->len[s]; i++) {
                int kd = sch->acts[s][i].kind;
                double comp = kd == XMP_ACT_F ? compf[s] : kd == XMP_ACT_B ? compb[s] : 0;
                aadd[s][i] = -comp * (1 - arow[s][i]);
            }
        k.f = f;
        k.b = c->b ? b : NULL;
        k.act_add = per_action ? crow : c->act_add;
        if (it > 0)
            xmp_sim_result_free(res);
        memset(res, 0, sizeof *res);
        r = xmp_sim_run(sch, &k, res, err, errlen);
        if (r != 0 || !shared || !(res->step_s > 0) || it == 40)
            break;
        for (int s = 0; per_action && s < S; s++)
            if (res->len[s] != sch->len[s])
                per_action = 0; /* W inserted: the stage factors (the next run's costs) */
        /* the compute fraction of a stage's F/B actions (they also hold its boxing) */
        double cf[XMP_SEARCH_MAX_STAGES], busy_s[XMP_SEARCH_MAX_STAGES];
        double wf[XMP_SEARCH_MAX_STAGES];
        scaled_costs(c, S, compf, compb, ncf, ncb, factor, pen, f, b);
        for (int s = 0; s < S; s++) {
            double tot = f[s] + (c->b ? b[s] : 0);
            cf[s] = tot > 0 ? fmin(1.0, (compf[s] + compb[s]) * factor[s] / tot) : 0;
            busy_s[s] = overlap_s(res, s, s);
        }
        /* the factors, time-resolved over each stage's compute and each action's */
        share_factors(res, S, cf, rank0, nr, nranks, cost, busy, wf, per_action ? anew : NULL);
        double moved = 0;
        for (int s = 0; s < S; s++) {
            double worst = 1, sync = 0;
            if (busy_s[s] > 0) {
                /* conditional on s computing: each other stage computes for the part of s's
                 * compute time their actions overlap, at its compute fraction (stages of a
                 * pipeline compute together in the steady phase and reduce together at the
                 * end: their busy times are correlated, not independent); the collectives'
                 * sync below takes these probabilities */
                for (int h = 0; h < S; h++) {
                    double u = h == s ? 1.0 : cf[h] * overlap_s(res, s, h) / busy_s[s];
                    u = u < 0 ? 0 : u > 1 ? 1 : u;
                    for (int q = rank0[h]; q < rank0[h] + nr[h] && q < nranks; q++)
                        busy[q] = u;
                }
                worst = wf[s];
                /* in a collective of s, s's other ranks compute at its compute fraction */
                for (int q = rank0[s]; ncf && ncb && q < rank0[s] + nr[s] && q < nranks; q++)
                    busy[q] = cf[s];
                for (int q = rank0[s]; ncf && ncb && q < rank0[s] + nr[s] && q < nranks; q++) {
                    double x = 0;
                    if (xm_cost_cpu_sync(cost, nranks, busy, q, &x) == 1 && x > sync)
                        sync = x;
                }
            }
            double nf = S > 1 ? 0.5 * (factor[s] + worst) : 1, np = 0.5 * (pen[s] + sync);
            moved = fmax(moved, fmax(fabs(nf - factor[s]), fabs(np - pen[s])));
            factor[s] = nf;
            pen[s] = np;
            for (int i = 0; per_action && i < sch->len[s]; i++) {
                double na_ = 0.5 * (arow[s][i] + anew[s][i]);
                moved = fmax(moved, fabs(na_ - arow[s][i]));
                arow[s][i] = na_;
            }
        }
        /* converged: run once more with these (the last run used the previous values) */
        if (moved < 1e-6)
            it = 39;
    }
    for (int s = 0; sync_s && ncf && ncb && s < S; s++)
        sync_s[s] = (ncf[s] + ncb[s]) * pen[s];
    free(busy);
    free(af);
    return r;
}

static int eval_ctx(ctx_t *x, const int *nb, const int *oi, xmp_search_cand_t *c, int simulate)
{
    int S = x->S;
    double f[XMP_SEARCH_MAX_STAGES], b[XMP_SEARCH_MAX_STAGES], xfer[2 * XMP_SEARCH_MAX_STAGES];
    double ncf[XMP_SEARCH_MAX_STAGES], ncb[XMP_SEARCH_MAX_STAGES];
    double sum = 0, mb = 0, mr = 0, rmax = 0, omax = 0;
    c->compute_s = c->boxing_s = c->boundary_s = c->boxing_bytes = c->boundary_bytes = 0;
    c->step_factor = x->cf;
    c->mem_bytes = c->mem_param_bytes = c->mem_act_bytes = 0;
    for (int s = 0; s < S; s++) {
        scost_t sc;
        stage_cost(x, s, oi[s], nb[s], c->sched, &sc);
        if (x->failed)
            return -1;
        f[s] = sc.f;
        b[s] = sc.b;
        double e = 0;
        if (s + 1 < S) {
            e = edge_time(x, s, oi[s], oi[s + 1]);
            if (x->failed)
                return -1;
            xfer[2 * s] = xfer[2 * s + 1] = e;
        }
        sum += sc.f + sc.b + 2 * e;
        mb = fmax(mb, fmax(sc.f + sc.b, e));
        mr = fmax(mr, sc.ro);
        rmax = fmax(rmax, sc.r);
        omax = fmax(omax, sc.o);
        c->compute_s = fmax(c->compute_s, x->M * sc.comp);
        c->boxing_s = fmax(c->boxing_s, x->M * sc.box + sc.r);
        c->boundary_s = fmax(c->boundary_s, e);
        c->boxing_bytes = fmax(c->boxing_bytes, x->M * sc.box_bytes + sc.r_bytes);
        const opt_t *o = &x->opt[oi[s]];
        int64_t d[3] = {x->Bm, x->o->T, x->o->model.channels};
        double xb = F32 * local_elems(d, 3, cls(o, "act.x"), o->shape, o->ndim);
        double nbnd = (s > 0) + (s + 1 < S);
        c->boundary_bytes = fmax(c->boundary_bytes, 2.0 * x->M * xb * nbnd);
        c->stage_param_bytes[s] = sc.memp;
        c->stage_act_bytes[s] = sc.mema;
        c->stage_f_s[s] = sc.f;
        c->stage_b_s[s] = sc.b;
        c->stage_compute_s[s] = sc.comp;
        c->stage_compf_s[s] = sc.compf;
        c->stage_cpu_factor[s] = 1;
        c->stage_sync_s[s] = 0;
        ncf[s] = sc.ncf;
        ncb[s] = sc.ncb;
        c->stage_r_s[s] = sc.r;
        c->stage_o_s[s] = sc.o;
        c->stage_stored_bytes[s] = sc.stored;
        c->stage_grad_bytes[s] = sc.grad;
        c->stage_compute_bytes[s] = sc.compute;
        if (sc.mem > c->mem_bytes) {
            c->mem_bytes = sc.mem;
            c->mem_param_bytes = sc.memp;
            c->mem_act_bytes = sc.mema;
        }
        c->nblocks[s] = nb[s];
        c->ndim[s] = o->ndim;
        memcpy(c->shape[s], o->shape, sizeof(int) * NAX);
        c->strategy[s] = o->strat;
    }
    c->nstages = S;
    c->M = x->M;
    c->chain_s = objective(x, sum, mb, mr);
    c->step_s = NAN;
    c->bubble = NAN;
    if (!simulate)
        return 0;
    xmp_sedge_t edges[XMP_SEARCH_MAX_STAGES];
    int ne = xmp_sched_chain_edges(S, edges);
    xmp_schedule_t *sch = NULL;
    char msg[512];
    if (xmp_sched_generate(c->sched, S, x->M, ne, edges, NULL, &sch, msg, sizeof msg))
        return ctx_fail(x, "schedule %s S=%d M=%d: %s", xmp_sched_kind_name(c->sched), S, x->M,
                        msg);
    xmp_sim_costs_t sc = {.f = f, .b = b, .xfer = xfer, .r = rmax, .o = omax, .share_nic = 1};
    xmp_sim_result_t res;
    memset(&res, 0, sizeof res);
    double compf[XMP_SEARCH_MAX_STAGES], compb[XMP_SEARCH_MAX_STAGES];
    int rank0[XMP_SEARCH_MAX_STAGES], nr[XMP_SEARCH_MAX_STAGES];
    for (int s = 0; s < S; s++) {
        compf[s] = c->stage_compf_s[s];
        compb[s] = c->stage_compute_s[s] - c->stage_compf_s[s];
        rank0[s] = s * x->n;
        nr[s] = x->n;
    }
    int r = xmp_search__sim_shared(sch, &sc, S, compf, compb, ncf, ncb, rank0, nr, x->o->nranks,
                                   x->o->cost, x->o->no_cpu_share, c->stage_cpu_factor,
                                   c->stage_sync_s, &res, msg, sizeof msg);
    if (r == 0) {
        c->step_s = res.step_s;
        c->bubble = 0;
        for (int s = 0; s < S; s++)
            c->bubble = fmax(c->bubble, res.bubble[s]);
    }
    xmp_sim_result_free(&res);
    xmp_sched_destroy(sch);
    if (r < 0)
        return ctx_fail(x, "simulator: %s", msg);
    if (x->st)
        x->st->candidates++;
    return 0;
}

static int check_opts(const xmp_search_opts_t *o, char *err, size_t errlen)
{
    if (!o || !o->cost)
        return xmp_err_buf(err, errlen, "search: no cost model");
    if (o->nranks < 1 || o->nranks > 4096)
        return xmp_err_buf(err, errlen, "--ranks %d: must be 1..4096", o->nranks);
    if (o->hosts < 1 || o->nranks % o->hosts)
        return xmp_err_buf(err, errlen,
                           "--hosts %d does not divide --ranks %d (ranks per host = N/H)", o->hosts,
                           o->nranks);
    if (xmp_gpt2_config_check(&o->model))
        return xmp_err_buf(
            err, errlen,
            "bad model: layers %d, heads %d, channels %d, vocab %d (heads must divide "
            "channels)",
            o->model.num_layers, o->model.num_heads, o->model.channels, o->model.padded_vocab_size);
    if (o->B < 1 || o->T < 1 || o->T > o->model.max_seq_len)
        return xmp_err_buf(err, errlen,
                           "--batch %d / --seq %d: need batch >= 1, 1 <= seq <= max-seq %d", o->B,
                           o->T, o->model.max_seq_len);
    if (o->memory_limit < 0)
        return xmp_err_buf(err, errlen, "--memory-limit %.0f: must be >= 0", o->memory_limit);
    if (o->fixed_M > 0 && o->B % o->fixed_M)
        return xmp_err_buf(err, errlen, "--microbatches %d does not divide --batch %d", o->fixed_M,
                           o->B);
    return 0;
}

static int kinds_of(const xmp_search_opts_t *o, int *k)
{
    int n = 0;
    unsigned m = o->schedules ? o->schedules : 7u;
    for (int i = 0; i < 3; i++)
        if (m & (1u << i))
            k[n++] = i;
    return n;
}

static int valid_SMk(int S, int M, int kind)
{
    return kind == XMP_SCHED_GPIPE || M >= S;
}

int xmp_search_gpt_eval(const xmp_search_opts_t *o, xmp_search_cand_t *c, char *err, size_t errlen)
{
    if (check_opts(o, err, errlen))
        return -1;
    int S = c->nstages, M = c->M;
    if (S < 1 || S > XMP_SEARCH_MAX_STAGES || o->nranks % S || M < 1 || o->B % M)
        return xmp_err_buf(err, errlen, "configuration: %d stages, %d microbatches on %d ranks", S,
                           M, o->nranks);
    int tot = 0;
    for (int s = 0; s < S; s++) {
        if (c->nblocks[s] < 1)
            return xmp_err_buf(err, errlen, "configuration: stage %d has no block", s);
        tot += c->nblocks[s];
    }
    if (tot != o->model.num_layers)
        return xmp_err_buf(err, errlen,
                           "configuration: %d blocks over the stages, the model has %d", tot,
                           o->model.num_layers);
    ctx_t x;
    xmp_search_opts_t oo = *o;
    oo.strategies = 0;
    oo.memory_limit = 0;
    char e2[512];
    if (ctx_init(&x, &oo, S, M, step_factor(&oo), NULL, e2, sizeof e2)) {
        ctx_free(&x);
        return xmp_err_buf(err, errlen, "%s", e2);
    }
    int oi[XMP_SEARCH_MAX_STAGES];
    for (int s = 0; s < S; s++) {
        oi[s] = -1;
        for (int q = 0; q < x.nopt && oi[s] < 0; q++)
            if (x.opt[q].strat == c->strategy[s] && x.opt[q].ndim == c->ndim[s] &&
                !memcmp(x.opt[q].shape, c->shape[s], sizeof(int) * (size_t)c->ndim[s]))
                oi[s] = q;
        if (oi[s] < 0) {
            ctx_free(&x);
            return xmp_err_buf(err, errlen,
                               "configuration: stage %d: strategy %s on that mesh is not a "
                               "valid option (an SBP rule or an even split is missing)",
                               s, xmp_search_strategy_name(c->strategy[s]));
        }
    }
    int r = eval_ctx(&x, c->nblocks, oi, c, 1);
    ctx_free(&x);
    return r ? xmp_err_buf(err, errlen, "%s", e2) : 0;
}

int xmp_search_gpt_check(const xmp_search_opts_t *o, int S, int M, int kind, double *dp_best,
                         double *exhaustive_best, long *enumerated, char *err, size_t errlen)
{
    if (check_opts(o, err, errlen))
        return -1;
    if (S < 1 || o->nranks % S || S > o->model.num_layers || o->B % M)
        return xmp_err_buf(err, errlen, "check: S=%d M=%d", S, M);
    ctx_t x;
    if (ctx_init(&x, o, S, M, step_factor(o), NULL, err, errlen)) {
        ctx_free(&x);
        return -1;
    }
    int nb[XMP_SEARCH_MAX_STAGES], oi[XMP_SEARCH_MAX_STAGES];
    unsigned mask = o->strategies ? o->strategies : 0xFu;
    *dp_best = x.nopt && valid_SMk(S, M, kind) ? dp_run(&x, kind, mask, nb, oi) : INFINITY;
    double best = INFINITY;
    long cnt = 0;
    int L = o->model.num_layers;
    /* every composition of L into S parts >= 1 (odometer over the first S - 1
     * parts), every option per stage (odometer over the stages) */
    int part[XMP_SEARCH_MAX_STAGES];
    for (int s = 0; s < S; s++)
        part[s] = 1;
    int go = x.nopt > 0 && valid_SMk(S, M, kind);
    while (go && !x.failed) {
        int used = 0;
        for (int s = 0; s < S - 1; s++)
            used += part[s];
        part[S - 1] = L - used;
        if (part[S - 1] >= 1) {
            int sel[XMP_SEARCH_MAX_STAGES] = {0};
            for (;;) {
                int okm = 1;
                for (int s = 0; s < S; s++)
                    okm &= !!(mask & (1u << x.opt[sel[s]].strat));
                if (okm) {
                    xmp_search_cand_t c;
                    memset(&c, 0, sizeof c);
                    c.sched = kind;
                    if (eval_ctx(&x, part, sel, &c, 0))
                        break;
                    int feas = 1;
                    for (int s = 0; s < S; s++) {
                        scost_t sc;
                        stage_cost(&x, s, sel[s], part[s], kind, &sc);
                        feas &= mem_ok(&x, sc.mem);
                    }
                    cnt++;
                    if (feas && c.chain_s < best)
                        best = c.chain_s;
                }
                int s = 0;
                while (s < S && ++sel[s] == x.nopt)
                    sel[s++] = 0;
                if (s == S)
                    break;
            }
        }
        int s = 0;
        while (s < S - 1 && ++part[s] > L)
            part[s++] = 1;
        if (s >= S - 1)
            go = 0;
    }
    int failed = x.failed;
    ctx_free(&x);
    if (failed)
        return -1;
    *exhaustive_best = best;
    if (enumerated)
        *enumerated = cnt;
    return 0;
}

/* ---------------------------------------------------------- the search */

static int same_config(const xmp_search_cand_t *a, const xmp_search_cand_t *b)
{
    if (a->nstages != b->nstages || a->M != b->M || a->sched != b->sched)
        return 0;
    for (int s = 0; s < a->nstages; s++)
        if (a->nblocks[s] != b->nblocks[s] || a->ndim[s] != b->ndim[s] ||
            a->strategy[s] != b->strategy[s] ||
            memcmp(a->shape[s], b->shape[s], sizeof(int) * (size_t)a->ndim[s]))
            return 0;
    return 1;
}

static int cand_cmp(const void *pa, const void *pb)
{
    const xmp_search_cand_t *a = pa, *b = pb;
    double x = isnan(a->step_s) ? INFINITY : a->step_s, y = isnan(b->step_s) ? INFINITY : b->step_s;
    if (x != y)
        return x < y ? -1 : 1;
    if (a->chain_s != b->chain_s)
        return a->chain_s < b->chain_s ? -1 : 1;
    return a->mem_bytes < b->mem_bytes ? -1 : a->mem_bytes > b->mem_bytes;
}

static double clock_s(clockid_t id)
{
    struct timespec t;
    clock_gettime(id, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int xmp_search_gpt(const xmp_search_opts_t *o, int topk, xmp_search_cand_t *out, int *nout,
                   xmp_search_stats_t *stats, char *err, size_t errlen)
{
    if (check_opts(o, err, errlen))
        return -1;
    if (topk < 1)
        return xmp_err_buf(err, errlen, "--top %d: must be >= 1", topk);
    double t0 = now_s(), c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
    xmp_search_stats_t st;
    memset(&st, 0, sizeof st);
    st.nominal = o->cost->nominal;
    st.min_mem_bytes = INFINITY;
    int kinds[3], nk = kinds_of(o, kinds);
    int has1f1b = 0;
    for (int q = 0; q < nk; q++)
        has1f1b |= kinds[q] == XMP_SCHED_1F1B;
    int L = o->model.num_layers;
    int maxS = o->max_stages > 0 ? o->max_stages : L;
    if (maxS > XMP_SEARCH_MAX_STAGES)
        maxS = XMP_SEARCH_MAX_STAGES;
    unsigned mask = o->strategies ? o->strategies : 0xFu;
    xmp_search_cand_t *pool = NULL;
    int npool = 0, cap = 0, any_option = 0;
    const double cf = step_factor(o);
    for (int S = 1; S <= maxS; S++) {
        if (o->nranks % S || S > L)
            continue;
        for (int M = 1; M <= o->B; M++) {
            if (o->B % M || (o->fixed_M > 0 && M != o->fixed_M))
                continue;
            ctx_t x;
            if (ctx_init(&x, o, S, M, cf, &st, err, errlen)) {
                ctx_free(&x);
                free(pool);
                return -1;
            }
            st.options += x.nopt;
            if (x.nopt)
                any_option = 1;
            for (int q = 0; q < nk && x.nopt; q++) {
                int kind = kinds[q];
                if (!valid_SMk(S, M, kind))
                    continue;
                /* one stage: every schedule runs the same; keep one (1f1b if asked) */
                if (S == 1 && kind != (has1f1b ? XMP_SCHED_1F1B : kinds[0]))
                    continue;
                double mm = min_memory(&x, kind);
                if (mm < st.min_mem_bytes)
                    st.min_mem_bytes = mm;
                /* the unrestricted optimum, then the best of each built-in alone */
                for (int fam = -1; fam < XMP_SEARCH_NSTRAT; fam++) {
                    unsigned fm = fam < 0 ? mask : (mask & (1u << fam));
                    if (!fm)
                        continue;
                    int nb[XMP_SEARCH_MAX_STAGES], oi[XMP_SEARCH_MAX_STAGES];
                    double v = dp_run(&x, kind, fm, nb, oi);
                    if (x.failed)
                        break;
                    if (!isfinite(v))
                        continue;
                    xmp_search_cand_t c;
                    memset(&c, 0, sizeof c);
                    c.sched = kind;
                    if (eval_ctx(&x, nb, oi, &c, 1))
                        break;
                    int dup = 0;
                    for (int i = 0; i < npool && !dup; i++)
                        dup = same_config(&pool[i], &c);
                    if (dup)
                        continue;
                    if (npool == cap) {
                        int nc = cap ? 2 * cap : 64;
                        xmp_search_cand_t *np = realloc(pool, sizeof *np * (size_t)nc);
                        if (!np) {
                            x.failed = 1;
                            xmp_err_buf(err, errlen, "out of memory");
                            break;
                        }
                        pool = np;
                        cap = nc;
                    }
                    pool[npool++] = c;
                }
                if (x.failed)
                    break;
            }
            int failed = x.failed;
            ctx_free(&x);
            if (failed) {
                free(pool);
                return -1;
            }
        }
    }
    if (!any_option) {
        free(pool);
        return xmp_err_buf(
            err, errlen,
            "%d ranks cannot be factorized into stage meshes for this model: no stage "
            "count S dividing %d (S <= %d blocks) gives stages of N/S ranks with a mesh "
            "of 1-4 axes on which a built-in strategy (%s) splits batch rows (%d / M), "
            "heads (%d), channels (%d) and vocabulary (%d) evenly",
            o->nranks, o->nranks, L, "dp, megatron, 3d, axonn", o->B, o->model.num_heads,
            o->model.channels, o->model.padded_vocab_size);
    }
    if (npool == 0) {
        free(pool);
        return xmp_err_buf(err, errlen,
                           "no configuration fits --memory-limit %.0f bytes per rank: the smallest "
                           "memory any configuration needs is %.0f bytes (%.1f MiB) per rank",
                           o->memory_limit, st.min_mem_bytes, st.min_mem_bytes / 1048576.0);
    }
    qsort(pool, (size_t)npool, sizeof *pool, cand_cmp);
    int k = npool < topk ? npool : topk;
    memcpy(out, pool, sizeof *pool * (size_t)k);
    *nout = k;
    free(pool);
    st.seconds = now_s() - t0;
    st.cpu_seconds = clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
    if (stats)
        *stats = st;
    return 0;
}

/* ------------------------------------------------------ command lines */

void xmp_search_gpt_flags(const xmp_search_cand_t *c, char *layout, char *meshes, char *strats,
                          size_t n)
{
    size_t a = 0, b = 0, d = 0;
    layout[0] = meshes[0] = strats[0] = 0;
    for (int s = 0; s < c->nstages; s++) {
        char blk[32];
        if (c->nblocks[s] == 1)
            snprintf(blk, sizeof blk, "t");
        else
            snprintf(blk, sizeof blk, "t*%d", c->nblocks[s]);
        if (a < n)
            a += (size_t)snprintf(layout + a, n - a, "%s%s%s%s", s ? "|" : "", s == 0 ? "E," : "",
                                  blk, s == c->nstages - 1 ? ",L" : "");
        for (int x = 0; x < c->ndim[s] && b < n; x++)
            b += (size_t)snprintf(meshes + b, n - b, "%s%d", x ? "x" : (s ? "," : ""),
                                  c->shape[s][x]);
        if (d < n)
            d += (size_t)snprintf(strats + d, n - d, "%s%s", s ? "," : "",
                                  xmp_search_strategy_name(c->strategy[s]));
    }
}

void xmp_search_gpt_command(const xmp_search_opts_t *o, const xmp_search_cand_t *c, char *buf,
                            size_t n)
{
    char lay[512], mesh[512], strat[512];
    xmp_search_gpt_flags(c, lay, mesh, strat, sizeof lay);
    int same = 1;
    for (int s = 1; s < c->nstages; s++)
        same &= c->strategy[s] == c->strategy[0];
    snprintf(buf, n,
             "mpirun -np %d xmesh-train gpt --layers %d --heads %d --channels %d --vocab %d "
             "--max-seq %d --batch %d --seq %d --layout '%s' --stage-mesh %s %s %s --schedule %s "
             "--microbatches %d",
             o->nranks, o->model.num_layers, o->model.num_heads, o->model.channels, o->vocab,
             o->model.max_seq_len, o->B, o->T, lay, mesh, same ? "--strategy" : "--stage-strategy",
             same ? xmp_search_strategy_name(c->strategy[0]) : strat, xmp_sched_kind_name(c->sched),
             c->M);
    size_t len = strlen(buf);
    if (o->defer_grad && len < n)
        snprintf(buf + len, n - len, " --overlap defer-grad");
}
