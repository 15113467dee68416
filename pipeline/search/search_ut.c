/*
 * U-Transformer layout search (issue 21 item 3): the per-layer model, the stage-graph
 * evaluation through the pipeline simulator, coordinate descent + Metropolis-Hastings, and
 * the exhaustive oracle. Contract in search_ut.h, formulas in docs/SEARCH.md.
 */
#include "search/search_ut.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "models/utransformer_graph.h"
#include "models/utransformer_sbp.h"
#include "nn/strategy.h"
#include "sched/schedule.h"
#include "search/search.h"
#include "search/search_priv.h"
#include "util/xmp_err.h"

#define L_ (XMP_UT_LAYERS)
#define F32 4.0
#define MAXOPT 64
#define MAXM 32
#define NTENS (2 * L_) /* edge tensors: main output and skip of each layer */
#define EHASH (1 << 16)
/* Over the memory limit: OVER x (memory / limit), so that descent and Metropolis-Hastings
 * move towards feasible configurations instead of stalling on an infeasible start. */
#define OVER 1e30

static const char *const g_default[] = {"dp", "megatron", "3d", "axonn"};

int xmp_uts_nstrat(const xmp_uts_opts_t *o)
{
    return o->nstrat > 0 ? o->nstrat : 4;
}

const char *xmp_uts_strategy_name(const xmp_uts_opts_t *o, int i)
{
    if (i < 0 || i >= xmp_uts_nstrat(o))
        return NULL;
    return o->nstrat > 0 ? o->strategies[i] : g_default[i];
}

/* ------------------------------------------------------------ context */

typedef struct {
    int dp, tp, strat;
    unsigned valid; /* bit l: the strategy passes the model's check for layer l on this mesh */
    xmp_ut_strategy_t s;
} uopt_t;

typedef struct {
    double f, b, comp, box_bytes, r, r_bytes, o, param_bytes, act_bytes;
} lcost_t;

typedef struct {
    uint64_t key;
    double v;
} ehent_t;

typedef struct {
    const xmp_uts_opts_t *o;
    int S, n, nopt, nM, nk;
    int Ms[MAXM], kinds[3];
    uopt_t *opt;
    lcost_t *lc;           /* [s][l][oi][mi] */
    char *lcdone;          /* same */
    ehent_t *eh;           /* edge memo (open addressing; key 0: empty) */
    struct vmemo *vm;      /* visited configurations (search only) */
    double act_img[L_];    /* saved activation floats per image */
    xmp_graph_t graph[L_]; /* each layer's graph of one image (models/utransformer_graph.h) */
    xmp_ut_params_t par;
    double gemm_rate;
    xmp_uts_stats_t *st;
    char *err;
    size_t errlen;
    int failed;
} uctx_t;

static int cfail(uctx_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int cfail(uctx_t *c, const char *fmt, ...)
{
    if (!c->failed && c->err && c->errlen) {
        va_list ap;
        va_start(ap, fmt);
        xmp_verr_buf(c->err, c->errlen, fmt, ap);
        va_end(ap);
    }
    c->failed = 1;
    return -1;
}

static double gemm(uctx_t *c, double m, double n, double k)
{
    if (m <= 0 || n <= 0 || k <= 0)
        return 0;
    xm_cost_pred_t p;
    if (xm_cost_gemm(c->o->cost, (int64_t)ceil(m), (int64_t)ceil(n), (int64_t)ceil(k), &p)) {
        cfail(c, "cost model: sgemm %.0fx%.0fx%.0f: %s", m, n, k, xmesh_last_error());
        return 0;
    }
    return p.seconds;
}

static double coll(uctx_t *c, int rank0, const int *shape, int a, xm_coll_t kind, double bytes,
                   double *vol)
{
    if (shape[a] <= 1 || bytes <= 0)
        return 0;
    xm_coll_geom_t g;
    xmp_search_axis_geom(c->o->nranks, c->o->hosts, rank0, 2, shape, a, &g);
    xm_cost_pred_t p;
    if (xm_cost_collective(c->o->cost, kind, &g, bytes, &p)) {
        cfail(c, "cost model: %s over %d ranks: %s", xm_coll_name(kind), g.group_size,
              xmesh_last_error());
        return 0;
    }
    if (vol)
        *vol += xm_coll_volume(kind, bytes, shape[a]);
    return p.seconds;
}

/* SBP of parameter class cls (e.g. "conv1.w") of layer l on axis a; B when absent. */
static xmp_sbp_t psbp(const uopt_t *u, int l, const char *cls, int a)
{
    const xmp_sbp_t *s = xmp_ut_strategy_get(&u->s, xmp_ut_layer_name(l), cls);
    xmp_sbp_t b = {XMP_B, 0};
    return s ? s[a] : b;
}

/* Product of the axes on which class cls (layer l) is S(dim). */
static int split_of(const uopt_t *u, int l, const char *cls, int dim)
{
    int shape[2] = {u->dp, u->tp}, p = 1;
    for (int a = 0; a < 2; a++) {
        xmp_sbp_t s = psbp(u, l, cls, a);
        if (s.kind == XMP_S && s.dim == dim)
            p *= shape[a];
    }
    return p;
}

/* The cost of layer l on option oi of stage s at microbatch Ms[mi]. */
static void layer_cost(uctx_t *c, int s, int l, int oi, int mi, lcost_t *lc)
{
    const uopt_t *u = &c->opt[oi];
    const xmp_ut_config_t *cf = &c->o->model;
    int shape[2] = {u->dp, u->tp}, rank0 = s * c->n;
    double Bm = (double)c->o->B / c->Ms[mi];
    double imgs = Bm / split_of(u, l, "act.x", 0);
    int in[3];
    xmp_ut_layer_in_shape(cf, l, in);
    double hw = (double)in[1] * in[2];
    memset(lc, 0, sizeof *lc);
    double vol = 0;
    const char *lname = xmp_ut_layer_name(l);
    size_t ln = strlen(lname);
    for (int k = 0; k < c->par.ntensors; k++) {
        const xmp_ut_tensor_t *t = &c->par.t[k];
        if (t->layer != l)
            continue;
        const char *cls = t->name + ln + 1;
        /* local parameter elements and reduction */
        double loc = (double)t->count;
        for (int d = 0; d < t->ndim; d++)
            loc /= split_of(u, l, cls, d);
        lc->param_bytes += F32 * loc;
        for (int a = 0; a < 2; a++) {
            xmp_sbp_t xs = psbp(u, l, "act.x", a), ps = psbp(u, l, cls, a);
            if (xs.kind == XMP_S && xs.dim == 0 && ps.kind == XMP_B)
                lc->r += coll(c, rank0, shape, a, XM_COLL_ALLREDUCE, F32 * loc, &lc->r_bytes);
        }
        lc->o += 4.0 * loc / c->gemm_rate;
        if (t->ndim < 2)
            continue;
        /* the node this weight feeds (a conv or a linear) and its neighbours in the graph */
        xmp_ut_wuse_t wu;
        if (xmp_ut_graph_weight_use(&c->graph[l], cls, &wu)) {
            cfail(c, "layer %s: weight %s feeds no conv or linear", lname, cls);
            return;
        }
        /* the GEMM of this weight: rows (output positions x images), N outputs, K inputs */
        int co = t->shape[0], ci = t->shape[1];
        double kk = t->ndim == 4 ? (double)t->shape[2] * t->shape[3] : 1;
        double pos = wu.pos;
        int so = split_of(u, l, cls, 0), si = split_of(u, l, cls, 1);
        double rows = imgs * pos, N = (double)co / so, K = ci * kk / si;
        double fwd = gemm(c, rows, N, K), bwd = gemm(c, rows, K, N) + gemm(c, N, K, rows);
        lc->f += fwd;
        lc->b += bwd;
        lc->comp += fwd + bwd;
        /* boxing on the tensor-parallel axes: a pair (output split, then input split: a block's
         * two convs, attention's projections) boxes nothing between its two halves */
        for (int a = 0; a < 2; a++) {
            xmp_sbp_t ps = psbp(u, l, cls, a);
            if (ps.kind != XMP_S || shape[a] <= 1)
                continue;
            double out_b = F32 * imgs * pos * co;
            double in_b = F32 * imgs * wu.in_pos * ci;
            if (ps.dim == 1) { /* input split: partial output, all-reduced forward */
                lc->f += coll(c, rank0, shape, a, XM_COLL_ALLREDUCE, out_b, &vol);
            } else {
                /* output split: the replicated input's gradient is partial (not for the keys
                 * and values, whose input is the conditioning or shared with the query) */
                if (!wu.kv)
                    lc->b += coll(c, rank0, shape, a, XM_COLL_ALLREDUCE, in_b, &vol);
                if (!wu.paired_out && !wu.paired_in)
                    lc->f += coll(c, rank0, shape, a, XM_COLL_ALLGATHER, out_b, &vol);
            }
        }
        /* attention products (once, at the query's projection) */
        if (wu.query) {
            int heads = co / (cf->head_dim > 0 ? cf->head_dim : cf->base);
            if (heads < 1)
                heads = 1;
            double hl = (double)heads / so, hd = (double)co / heads, tk = wu.kv_pos;
            double af = gemm(c, imgs * hl * hw, tk, hd) + gemm(c, imgs * hl * hw, hd, tk);
            lc->f += af;
            lc->b += 2 * af;
            lc->comp += 3 * af;
        }
    }
    lc->box_bytes = vol;
    lc->act_bytes = F32 * c->act_img[l] * imgs;
}

static const lcost_t *lcost(uctx_t *c, int s, int l, int oi, int mi)
{
    size_t i = (((size_t)s * L_ + l) * c->nopt + oi) * c->nM + mi;
    if (!c->lcdone[i]) {
        layer_cost(c, s, l, oi, mi, &c->lc[i]);
        c->lcdone[i] = 1;
    }
    return &c->lc[i];
}

/* Edge tensor t (2l: main output of l, 2l+1: its skip) from stage sa (option oa) to sb (ob). */
static double edge_time(uctx_t *c, int t, int sa, int oa, int sb, int ob, int mi)
{
    if (c->o->no_boundary)
        return 0;
    uint64_t key = 1 + (((((uint64_t)t * 16 + sa) * 16 + sb) * MAXOPT + oa) * MAXOPT + ob) * MAXM +
                   (uint64_t)mi;
    size_t h = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 48) & (EHASH - 1);
    for (int probe = 0; probe < EHASH; probe++) {
        ehent_t *e = &c->eh[(h + (size_t)probe) & (EHASH - 1)];
        if (e->key == key)
            return e->v;
        if (e->key == 0) {
            int l = t / 2, chw[3];
            if (t % 2)
                xmp_ut_layer_skip_shape(&c->o->model, l, chw);
            else
                xmp_ut_layer_out_shape(&c->o->model, l, chw);
            int64_t d[4] = {c->o->B / c->Ms[mi], chw[0], chw[1], chw[2]};
            char spa[64], spb[64];
            const uopt_t *A = &c->opt[oa], *Bo = &c->opt[ob];
            xmp_strategy_sbp_string(xmp_ut_strategy_get(&A->s, NULL, "act.x"), 2, spa, sizeof spa);
            xmp_strategy_sbp_string(xmp_ut_strategy_get(&Bo->s, NULL, "act.x"), 2, spb, sizeof spb);
            int sha[2] = {A->dp, A->tp}, shb[2] = {Bo->dp, Bo->tp};
            double v = 0;
            char msg[512];
            if (xmp_search__plan_seconds(c->o->nranks, c->o->hosts, c->o->cluster, c->o->max_evals,
                                         4, d, 2, sha, sa * c->n, spa, 2, shb, sb * c->n, spb, &v,
                                         msg, sizeof msg)) {
                cfail(c, "edge %s of %s: %s", t % 2 ? "skip" : "main", xmp_ut_layer_name(l), msg);
                return 0;
            }
            if (c->st)
                c->st->edge_plans++;
            e->key = key;
            e->v = v;
            return v;
        }
    }
    return 0;
}

static int divides_all(int n, int d)
{
    return d > 0 && n % d == 0;
}

static void uctx_free(uctx_t *c)
{
    free(c->opt);
    free(c->lc);
    free(c->lcdone);
    free(c->eh);
    free(c->vm);
    for (int l = 0; l < L_; l++)
        xmp_graph_free(&c->graph[l]);
    memset(c, 0, sizeof *c);
}

/* 1 when a and b (one mesh) give every class the same SBP on every axis of size > 1 and
 * accept the same layers: the same configuration under two names (megatron on tp = 1 is dp). */
static int same_splits(const uopt_t *a, const uopt_t *b)
{
    if (a->valid != b->valid)
        return 0;
    int shape[2] = {a->dp, a->tp};
    for (int pass = 0; pass < 2; pass++) {
        const uopt_t *x = pass ? b : a, *y = pass ? a : b;
        for (int k = 0; k < x->s.n; k++) {
            const xmp_sbp_t *sx = x->s.e[k].sbp;
            const xmp_sbp_t *sy = xmp_ut_strategy_get(&y->s, NULL, x->s.e[k].cls);
            for (int ax = 0; ax < 2; ax++) {
                if (shape[ax] <= 1)
                    continue;
                xmp_sbp_t bx = sx[ax], by = sy ? sy[ax] : (xmp_sbp_t){XMP_B, 0};
                if (!xmp_sbp_eq(bx, by))
                    return 0;
            }
        }
    }
    return 1;
}

/* Options for stages of n = N/S ranks. */
static int uctx_init(uctx_t *c, const xmp_uts_opts_t *o, int S, int dedupe, xmp_uts_stats_t *st,
                     char *err, size_t errlen)
{
    memset(c, 0, sizeof *c);
    c->o = o;
    c->S = S;
    c->n = o->nranks / S;
    c->st = st;
    c->err = err;
    c->errlen = errlen;
    xm_cost_pred_t p;
    if (xm_cost_gemm(o->cost, 256, 256, 256, &p) || !(p.seconds > 0))
        return cfail(c, "cost model: sgemm: %s", xmesh_last_error());
    c->gemm_rate = 2.0 * 256 * 256 * 256 / p.seconds;
    for (int M = 1; M <= o->B && c->nM < MAXM; M++)
        if (o->B % M == 0 && (o->fixed_M <= 0 || o->fixed_M == M))
            c->Ms[c->nM++] = M;
    for (int k = 0; k < 3; k++)
        if (!o->schedules || (o->schedules & (1u << k)))
            if (S > 1 || c->nk == 0) /* one stage: every schedule is the same */
                c->kinds[c->nk++] = k;
    xmp_ut_params_layout(&o->model, &c->par);
    for (int l = 0; l < L_; l++) {
        xmp_ut_layer_t *ly = xmp_ut_layer_create(&o->model, l, 1);
        if (!ly)
            return cfail(c, "layer %s: %s", xmp_ut_layer_name(l), xmp_last_error());
        c->act_img[l] = (double)xmp_ut_layer_activation_floats(ly);
        xmp_ut_layer_destroy(ly);
        if (xmp_ut_graph(&o->model, l, &c->graph[l]))
            return cfail(c, "layer %s: %s", xmp_ut_layer_name(l), xmp_last_error());
    }
    c->opt = calloc(MAXOPT, sizeof(uopt_t));
    if (!c->opt)
        return cfail(c, "out of memory");
    for (int dp = 1; dp <= c->n; dp++) {
        if (!divides_all(c->n, dp))
            continue;
        int shape[2] = {dp, c->n / dp};
        for (int k = 0; k < xmp_uts_nstrat(o) && c->nopt < MAXOPT; k++) {
            uopt_t *u = &c->opt[c->nopt];
            memset(u, 0, sizeof *u);
            u->dp = dp;
            u->tp = c->n / dp;
            u->strat = k;
            if (xmp_ut_strategy_load(xmp_uts_strategy_name(o, k), &o->model, 2, shape, &u->s))
                continue; /* not built for this mesh (or unknown to the model) */
            for (int l = 0; l < L_; l++)
                if (xmp_ut_strategy_check(&u->s, &o->model, l, l, shape) == 0)
                    u->valid |= 1u << l;
            int dup = 0;
            for (int j = 0; j < c->nopt && !dup && dedupe; j++)
                dup = c->opt[j].dp == dp && same_splits(&c->opt[j], u);
            if (u->valid && !dup)
                c->nopt++;
        }
    }
    size_t nl = (size_t)S * L_ * (size_t)(c->nopt ? c->nopt : 1) * (size_t)c->nM;
    c->lc = calloc(nl, sizeof(lcost_t));
    c->lcdone = calloc(nl, 1);
    c->eh = calloc(EHASH, sizeof(ehent_t));
    if (!c->lc || !c->lcdone || !c->eh)
        return cfail(c, "out of memory");
    return 0;
}

/* ------------------------------------------------------ configurations */

/* A configuration in option indices (cuts: first layer of each stage). */
typedef struct {
    int first[XMP_UTS_MAX_STAGES + 1];
    int oi[XMP_UTS_MAX_STAGES];
    int ki, mi;
} ucfg_t;

static int inflight(int kind, int s, int S, int M)
{
    int k = kind == XMP_SCHED_GPIPE ? M : kind == XMP_SCHED_1F1B ? S - s : 2 * (S - s) - 1;
    return k < M ? k : M;
}

/* Structural validity: options valid for their layers, microbatch split by dp, M vs S. */
static int cfg_valid(const uctx_t *c, const ucfg_t *g)
{
    int M = c->Ms[g->mi], kind = c->kinds[g->ki];
    if (kind != XMP_SCHED_GPIPE && M < c->S)
        return 0;
    int mbs = c->o->B / M;
    for (int s = 0; s < c->S; s++) {
        if (g->first[s + 1] <= g->first[s])
            return 0;
        const uopt_t *u = &c->opt[g->oi[s]];
        if (mbs % u->dp)
            return 0;
        for (int l = g->first[s]; l < g->first[s + 1]; l++)
            if (!(u->valid & (1u << l)))
                return 0;
    }
    return 1;
}

/* Peak memory of g (no simulation). */
static double cfg_mem(uctx_t *c, const ucfg_t *g, double *stage_mem)
{
    int M = c->Ms[g->mi], kind = c->kinds[g->ki];
    double peak = 0;
    for (int s = 0; s < c->S; s++) {
        double m = 0;
        int inf = inflight(kind, s, c->S, M);
        for (int l = g->first[s]; l < g->first[s + 1]; l++) {
            const lcost_t *lc = lcost(c, s, l, g->oi[s], g->mi);
            m += 3 * lc->param_bytes + inf * lc->act_bytes;
        }
        if (stage_mem)
            stage_mem[s] = m;
        peak = fmax(peak, m);
    }
    return peak;
}

/* Evaluates g: fills cand (if not NULL); returns the step time, INFINITY when invalid,
 * >= OVER when over the memory limit, NAN on error (c->failed). */
static double cfg_eval(uctx_t *c, const ucfg_t *g, xmp_uts_cand_t *cand)
{
    if (!cfg_valid(c, g))
        return INFINITY;
    int S = c->S, M = c->Ms[g->mi], kind = c->kinds[g->ki];
    double stage_mem[XMP_UTS_MAX_STAGES];
    double mem = cfg_mem(c, g, stage_mem);
    if (c->failed)
        return NAN;
    if (c->o->memory_limit > 0 && mem > c->o->memory_limit && !cand)
        return OVER * mem / c->o->memory_limit;
    double f[XMP_UTS_MAX_STAGES], b[XMP_UTS_MAX_STAGES], rmax = 0, omax = 0;
    double comp = 0, box = 0, boxb = 0, bndb[XMP_UTS_MAX_STAGES] = {0};
    int stage_of[L_];
    for (int s = 0; s < S; s++) {
        f[s] = b[s] = 0;
        double r = 0, o = 0, cs = 0, bx = 0, bxb = 0, rb = 0;
        for (int l = g->first[s]; l < g->first[s + 1]; l++) {
            const lcost_t *lc = lcost(c, s, l, g->oi[s], g->mi);
            stage_of[l] = s;
            f[s] += lc->f;
            b[s] += lc->b;
            r += lc->r;
            o += lc->o;
            cs += lc->comp;
            bx += fmax(0, lc->f + lc->b - lc->comp - 1e-12 * (lc->f + lc->b));
            bxb += lc->box_bytes;
            rb += lc->r_bytes;
        }
        rmax = fmax(rmax, r);
        omax = fmax(omax, o);
        comp = fmax(comp, M * cs);
        box = fmax(box, M * bx + r);
        boxb = fmax(boxb, M * bxb + rb);
    }
    if (c->failed)
        return NAN;
    /* stage graph edges: distinct (src, dst) pairs, each the sum of its tensors */
    xmp_sedge_t edges[2 * L_];
    double xfer[4 * L_], bnd = 0;
    int ne = 0;
    for (int t = 0; t < NTENS; t++) {
        int l = t / 2, dst = t % 2 ? xmp_ut_skip_dest(l) : (l + 1 < L_ ? l + 1 : -1);
        if (dst < 0 || stage_of[dst] == stage_of[l])
            continue;
        int sa = stage_of[l], sb = stage_of[dst];
        double x = edge_time(c, t, sa, g->oi[sa], sb, g->oi[sb], g->mi);
        if (c->failed)
            return NAN;
        int e = 0;
        while (e < ne && !(edges[e].src == sa && edges[e].dst == sb))
            e++;
        if (e == ne) {
            edges[ne].src = sa;
            edges[ne].dst = sb;
            xfer[2 * ne] = xfer[2 * ne + 1] = 0;
            ne++;
        }
        xfer[2 * e] += x;
        xfer[2 * e + 1] += x;
        bnd = fmax(bnd, xfer[2 * e]);
        int chw[3];
        if (t % 2)
            xmp_ut_layer_skip_shape(&c->o->model, l, chw);
        else
            xmp_ut_layer_out_shape(&c->o->model, l, chw);
        const uopt_t *ua = &c->opt[g->oi[sa]], *ub = &c->opt[g->oi[sb]];
        double per = F32 * (double)(c->o->B / M) * chw[0] * chw[1] * chw[2];
        bndb[sa] += 2.0 * M * per / ua->dp;
        bndb[sb] += 2.0 * M * per / ub->dp;
    }
    xmp_schedule_t *sch = NULL;
    char msg[512];
    if (xmp_sched_generate(kind, S, M, ne, edges, NULL, &sch, msg, sizeof msg)) {
        cfail(c, "schedule %s S=%d M=%d: %s", xmp_sched_kind_name(kind), S, M, msg);
        return NAN;
    }
    xmp_sim_costs_t sc;
    memset(&sc, 0, sizeof sc);
    sc.f = f;
    sc.b = b;
    sc.xfer = xfer;
    sc.r = rmax;
    sc.o = omax;
    sc.share_nic = 1; /* the skip edges leave through the same NICs, as in xmesh-train */
    xmp_sim_result_t res;
    memset(&res, 0, sizeof res);
    int r = xmp_sim_run(sch, &sc, &res, msg, sizeof msg);
    double step = r == 0 ? res.step_s : NAN, bubble = 0;
    if (r == 0)
        for (int s = 0; s < S; s++)
            bubble = fmax(bubble, res.bubble[s]);
    xmp_sim_result_free(&res);
    xmp_sched_destroy(sch);
    if (r != 0) {
        cfail(c, "simulator: %s", r < 0 ? msg : "deadlock");
        return NAN;
    }
    if (c->st)
        c->st->evals++;
    if (cand) {
        memset(cand, 0, sizeof *cand);
        cand->nstages = S;
        cand->M = M;
        cand->sched = kind;
        for (int s = 0; s < S; s++) {
            cand->count[s] = g->first[s + 1] - g->first[s];
            cand->dp[s] = c->opt[g->oi[s]].dp;
            cand->tp[s] = c->opt[g->oi[s]].tp;
            cand->strategy[s] = c->opt[g->oi[s]].strat;
            cand->stage_mem[s] = stage_mem[s];
            cand->boundary_bytes = fmax(cand->boundary_bytes, bndb[s]);
        }
        cand->step_s = step;
        cand->bubble = bubble;
        cand->compute_s = comp;
        cand->boxing_s = box;
        cand->boxing_bytes = boxb;
        cand->boundary_s = bnd;
        cand->mem_bytes = mem;
    }
    if (c->o->memory_limit > 0 && mem > c->o->memory_limit)
        return OVER * mem / c->o->memory_limit;
    return step;
}

/* ------------------------------------------------------------ the pool */

typedef struct {
    int k, n;
    xmp_uts_cand_t *c;
} pool_t;

static int same(const xmp_uts_cand_t *a, const xmp_uts_cand_t *b)
{
    if (a->nstages != b->nstages || a->M != b->M || a->sched != b->sched)
        return 0;
    for (int s = 0; s < a->nstages; s++)
        if (a->count[s] != b->count[s] || a->dp[s] != b->dp[s] || a->tp[s] != b->tp[s] ||
            a->strategy[s] != b->strategy[s])
            return 0;
    return 1;
}

/* Keeps the k best distinct configurations (ties: less memory first). */
static void pool_add(pool_t *p, const xmp_uts_cand_t *x)
{
    for (int i = 0; i < p->n; i++)
        if (same(&p->c[i], x))
            return;
    int pos = p->n;
    while (pos > 0 &&
           (x->step_s < p->c[pos - 1].step_s ||
            (x->step_s == p->c[pos - 1].step_s && x->mem_bytes < p->c[pos - 1].mem_bytes)))
        pos--;
    if (pos >= p->k)
        return;
    int last = p->n < p->k ? p->n : p->k - 1;
    memmove(&p->c[pos + 1], &p->c[pos], sizeof *x * (size_t)(last - pos));
    p->c[pos] = *x;
    if (p->n < p->k)
        p->n++;
}

static double visit_eval(uctx_t *c, const ucfg_t *g, pool_t *p);

/* Visited configurations: a revisit (descent sweeps, Metropolis-Hastings going back) costs a
 * lookup, not a simulation. */
#define VMEMO (1 << 15)
struct vmemo {
    int used;
    ucfg_t g;
    double t;
};

static uint64_t cfg_hash(const uctx_t *c, const ucfg_t *g)
{
    uint64_t h = 1469598103934665603ull;
    for (int s = 0; s <= c->S; s++)
        h = (h ^ (uint64_t)g->first[s]) * 1099511628211ull;
    for (int s = 0; s < c->S; s++)
        h = (h ^ (uint64_t)g->oi[s]) * 1099511628211ull;
    h = (h ^ (uint64_t)g->ki) * 1099511628211ull;
    return (h ^ (uint64_t)g->mi) * 1099511628211ull;
}

static int cfg_eq(const uctx_t *c, const ucfg_t *a, const ucfg_t *b)
{
    return !memcmp(a->first, b->first, sizeof(int) * (size_t)(c->S + 1)) &&
           !memcmp(a->oi, b->oi, sizeof(int) * (size_t)c->S) && a->ki == b->ki && a->mi == b->mi;
}

/* Evaluates g and adds it to the pool when feasible. */
static double visit(uctx_t *c, const ucfg_t *g, pool_t *p)
{
    if (!cfg_valid(c, g))
        return INFINITY;
    struct vmemo *slot = NULL;
    if (c->vm) {
        size_t h = (size_t)(cfg_hash(c, g) & (VMEMO - 1));
        for (int k = 0; k < 64; k++) {
            struct vmemo *m = &c->vm[(h + (size_t)k) & (VMEMO - 1)];
            if (m->used && cfg_eq(c, &m->g, g))
                return m->t;
            if (!m->used) {
                slot = m;
                break;
            }
        }
    }
    double t = visit_eval(c, g, p);
    if (slot && !isnan(t)) {
        slot->used = 1;
        slot->g = *g;
        slot->t = t;
    }
    return t;
}

static double visit_eval(uctx_t *c, const ucfg_t *g, pool_t *p)
{
    xmp_uts_cand_t x;
    double t = cfg_eval(c, g, p ? &x : NULL);
    if (t < OVER && p)
        pool_add(p, &x);
    return t;
}

/* ------------------------------------------------------- option checks */

static int check_opts(const xmp_uts_opts_t *o, char *err, size_t errlen)
{
    if (!o || !o->cost)
        return xmp_err_buf(err, errlen, "utransformer search: no cost model");
    if (o->nranks < 1 || o->nranks > 4096)
        return xmp_err_buf(err, errlen, "--ranks %d: between 1 and 4096", o->nranks);
    if (o->hosts < 1 || o->nranks % o->hosts)
        return xmp_err_buf(err, errlen, "--hosts %d does not divide --ranks %d", o->hosts,
                           o->nranks);
    if (o->B < 1)
        return xmp_err_buf(err, errlen, "--batch %d: at least 1", o->B);
    if (o->nstrat < 0 || o->nstrat > XMP_UTS_MAX_STRAT)
        return xmp_err_buf(err, errlen, "%d strategies: at most %d", o->nstrat, XMP_UTS_MAX_STRAT);
    if (o->fixed_M > 0 && o->B % o->fixed_M)
        return xmp_err_buf(err, errlen, "--microbatches %d does not divide --batch %d", o->fixed_M,
                           o->B);
    return 0;
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int rnd(uint64_t *s, int n)
{
    return n > 0 ? (int)(rng_next(s) % (uint64_t)n) : 0;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Smallest peak memory over every configuration of c: min-max DP over the layer chain for each
 * (M, kind) (memory of a stage depends only on its own layers, option and index). */
static double min_memory(uctx_t *c)
{
    double best = INFINITY;
    for (int mi = 0; mi < c->nM; mi++)
        for (int ki = 0; ki < c->nk; ki++) {
            int M = c->Ms[mi], kind = c->kinds[ki];
            if (kind != XMP_SCHED_GPIPE && M < c->S)
                continue;
            /* f[s][l]: least max memory of stages s.. when stage s starts at layer l */
            double f[XMP_UTS_MAX_STAGES + 1][L_ + 1];
            for (int s = 0; s <= c->S; s++)
                for (int l = 0; l <= L_; l++)
                    f[s][l] = INFINITY;
            f[c->S][L_] = 0;
            for (int s = c->S - 1; s >= 0; s--)
                for (int l = 0; l < L_; l++)
                    for (int e = l + 1; e <= L_; e++) {
                        if (!isfinite(f[s + 1][e]))
                            continue;
                        for (int oi = 0; oi < c->nopt; oi++) {
                            const uopt_t *u = &c->opt[oi];
                            if ((c->o->B / M) % u->dp)
                                continue;
                            double m = 0;
                            int ok = 1;
                            for (int k = l; k < e && ok; k++) {
                                if (!(u->valid & (1u << k)))
                                    ok = 0;
                                else {
                                    const lcost_t *lc = lcost(c, s, k, oi, mi);
                                    m += 3 * lc->param_bytes +
                                         inflight(kind, s, c->S, M) * lc->act_bytes;
                                }
                            }
                            if (ok)
                                f[s][l] = fmin(f[s][l], fmax(m, f[s + 1][e]));
                        }
                    }
            best = fmin(best, f[0][0]);
        }
    return best;
}

/* Random valid configuration (tries); 0 if found. */
static int random_cfg(uctx_t *c, uint64_t *rs, ucfg_t *g)
{
    for (int tries = 0; tries < 2000; tries++) {
        /* S-1 distinct cuts in 1..12 */
        int cut[L_] = {0}, k = 0;
        while (k < c->S - 1) {
            int x = 1 + rnd(rs, L_ - 1);
            if (!cut[x]) {
                cut[x] = 1;
                k++;
            }
        }
        g->first[0] = 0;
        int s = 1;
        for (int x = 1; x < L_; x++)
            if (cut[x])
                g->first[s++] = x;
        g->first[c->S] = L_;
        for (s = 0; s < c->S; s++)
            g->oi[s] = rnd(rs, c->nopt);
        g->ki = rnd(rs, c->nk);
        g->mi = rnd(rs, c->nM);
        if (cfg_valid(c, g))
            return 0;
    }
    return -1;
}

/* Coordinate descent from g: each coordinate (cuts, stage options, schedule, M) set to its
 * best value in turn until a full sweep improves nothing. Returns g's final time. */
static double descend(uctx_t *c, ucfg_t *g, pool_t *p)
{
    double cur = visit(c, g, p);
    for (int sweep = 0; sweep < 50 && !c->failed; sweep++) {
        int improved = 0;
        for (int s = 1; s < c->S; s++) { /* cut between stage s-1 and s */
            int keep = g->first[s];
            for (int x = g->first[s - 1] + 1; x < g->first[s + 1]; x++) {
                g->first[s] = x;
                double t = visit(c, g, p);
                if (t < cur) {
                    cur = t;
                    keep = x;
                    improved = 1;
                }
            }
            g->first[s] = keep;
        }
        for (int s = 0; s < c->S; s++) {
            int keep = g->oi[s];
            for (int oi = 0; oi < c->nopt; oi++) {
                g->oi[s] = oi;
                double t = visit(c, g, p);
                if (t < cur) {
                    cur = t;
                    keep = oi;
                    improved = 1;
                }
            }
            g->oi[s] = keep;
        }
        /* schedule and M jointly (the 1F1B kinds need M >= S: one alone can be stuck) */
        int kk = g->ki, km = g->mi;
        for (int ki = 0; ki < c->nk; ki++)
            for (int mi = 0; mi < c->nM; mi++) {
                g->ki = ki;
                g->mi = mi;
                double t = visit(c, g, p);
                if (t < cur) {
                    cur = t;
                    kk = ki;
                    km = mi;
                    improved = 1;
                }
            }
        g->ki = kk;
        g->mi = km;
        /* a stage's window shifted: both of its cuts by the same amount */
        for (int s = 1; s + 1 < c->S; s++) {
            int a0 = g->first[s], b0 = g->first[s + 1], best = 0;
            for (int d = -(a0 - g->first[s - 1] - 1); b0 + d < g->first[s + 2]; d++) {
                if (d == 0)
                    continue;
                g->first[s] = a0 + d;
                g->first[s + 1] = b0 + d;
                double t = visit(c, g, p);
                if (t < cur) {
                    cur = t;
                    best = d;
                    improved = 1;
                }
            }
            g->first[s] = a0 + best;
            g->first[s + 1] = b0 + best;
        }
        if (!improved)
            break;
    }
    return cur;
}

/* One random single-coordinate move of g. */
static void propose(uctx_t *c, uint64_t *rs, ucfg_t *g)
{
    int what = rnd(rs, 4);
    if (what == 0 && c->S > 1) { /* a cut anywhere between its neighbours, or one step */
        int s = 1 + rnd(rs, c->S - 1);
        int lo = g->first[s - 1] + 1, hi = g->first[s + 1] - 1;
        if (rnd(rs, 2))
            g->first[s] = lo + rnd(rs, hi - lo + 1);
        else if (g->first[s] + 1 <= hi && (rnd(rs, 2) || g->first[s] - 1 < lo))
            g->first[s]++;
        else if (g->first[s] - 1 >= lo)
            g->first[s]--;
    } else if (what <= 1) {
        g->oi[rnd(rs, c->S)] = rnd(rs, c->nopt);
    } else if (what == 2) {
        g->ki = rnd(rs, c->nk);
    } else {
        g->mi = rnd(rs, c->nM);
    }
}

static int stage_counts(const xmp_uts_opts_t *o, int *Ss)
{
    int n = 0, maxS = o->max_stages > 0 && o->max_stages < L_ ? o->max_stages : L_;
    for (int S = 1; S <= maxS && S <= o->nranks; S++)
        if (o->nranks % S == 0)
            Ss[n++] = S;
    return n;
}

/* The search over one stage count (exhaustive when ex). */
static int search_S(uctx_t *c, int ex, uint64_t *rs, pool_t *p, double *space)
{
    int S = c->S;
    /* space size: splits x options^S x kinds x M */
    double splits = 1;
    for (int i = 0; i < S - 1; i++)
        splits = splits * (L_ - 1 - i) / (i + 1);
    *space = splits * pow(c->nopt, S) * c->nk * c->nM;
    if (c->nopt == 0)
        return 0;
    if (ex) {
        ucfg_t g;
        memset(&g, 0, sizeof g);
        /* odometer over cuts (combinations), options, kinds, M */
        int cuts[L_];
        for (int i = 0; i < S - 1; i++)
            cuts[i] = i + 1;
        for (;;) {
            g.first[0] = 0;
            for (int i = 0; i < S - 1; i++)
                g.first[i + 1] = cuts[i];
            g.first[S] = L_;
            int oi[XMP_UTS_MAX_STAGES] = {0};
            for (;;) {
                memcpy(g.oi, oi, sizeof oi);
                for (g.ki = 0; g.ki < c->nk; g.ki++)
                    for (g.mi = 0; g.mi < c->nM; g.mi++) {
                        visit(c, &g, p);
                        if (c->failed)
                            return -1;
                    }
                int d = 0;
                while (d < S && ++oi[d] == c->nopt)
                    oi[d++] = 0;
                if (d == S)
                    break;
            }
            int i = S - 2;
            while (i >= 0 && cuts[i] == L_ - 1 - (S - 2 - i))
                i--;
            if (i < 0)
                break;
            cuts[i]++;
            for (int j = i + 1; j < S - 1; j++)
                cuts[j] = cuts[j - 1] + 1;
        }
        return 0;
    }
    int restarts = c->o->restarts > 0 ? c->o->restarts : 4;
    int steps = c->o->mh_steps > 0 ? c->o->mh_steps : 4000;
    c->vm = calloc(VMEMO, sizeof *c->vm); /* NULL: no memo, the same result slower */
    double bt = INFINITY;
    for (int r = 0; r < restarts && !c->failed; r++) {
        ucfg_t g;
        memset(&g, 0, sizeof g);
        if (r == 0) { /* even split, first options */
            for (int s = 0; s <= S; s++)
                g.first[s] = s * L_ / S;
            if (!cfg_valid(c, &g) && random_cfg(c, rs, &g))
                return 0;
        } else if (random_cfg(c, rs, &g)) {
            return 0;
        }
        double cur = descend(c, &g, p);
        bt = fmin(bt, cur);
        /* Metropolis-Hastings from the descent's end: a worse proposal is accepted with
         * probability exp(-(relative loss) / 0.05); every new best is polished by descent */
        for (int i = 0; i < steps / restarts && !c->failed; i++) {
            ucfg_t h = g;
            propose(c, rs, &h);
            double t = visit(c, &h, p);
            if (!isfinite(t))
                continue;
            double u = (double)(rng_next(rs) >> 11) / 9007199254740992.0;
            if (!isfinite(cur) || t <= cur || u < exp(-(t - cur) / cur / 0.05)) {
                g = h;
                cur = t;
            }
            if (t < bt) {
                bt = t;
                ucfg_t q = h;
                descend(c, &q, p);
            }
        }
    }
    return c->failed ? -1 : 0;
}

static int run(const xmp_uts_opts_t *o, int ex, double max_space, int topk, xmp_uts_cand_t *out,
               int *nout, xmp_uts_stats_t *stats, char *err, size_t errlen)
{
    if (check_opts(o, err, errlen))
        return -1;
    if (topk < 1)
        return xmp_err_buf(err, errlen, "top %d: at least 1", topk);
    xmp_uts_stats_t st;
    memset(&st, 0, sizeof st);
    st.seed = o->seed;
    st.min_mem_bytes = INFINITY;
    double t0 = now_s();
    pool_t p = {topk, 0, calloc((size_t)topk, sizeof(xmp_uts_cand_t))};
    if (!p.c)
        return xmp_err_buf(err, errlen, "out of memory");
    int Ss[L_], nS = stage_counts(o, Ss), rc = -1, anyopt = 0;
    uint64_t rs = o->seed;
    if (ex) { /* the space first: refuse a big one before any work */
        double total = 0;
        for (int i = 0; i < nS; i++) {
            uctx_t c;
            if (uctx_init(&c, o, Ss[i], 1, NULL, err, errlen)) {
                uctx_free(&c);
                goto out;
            }
            double sp = 1;
            for (int k = 0; k < Ss[i] - 1; k++)
                sp = sp * (L_ - 1 - k) / (k + 1);
            total += sp * pow(c.nopt, Ss[i]) * c.nk * c.nM;
            uctx_free(&c);
        }
        if (total > max_space) {
            xmp_err_buf(err, errlen, "exhaustive enumeration: %.0f configurations, more than %.0f",
                        total, max_space);
            goto out;
        }
    }
    for (int i = 0; i < nS; i++) {
        uctx_t c;
        double sp = 0;
        if (uctx_init(&c, o, Ss[i], 1, &st, err, errlen) || search_S(&c, ex, &rs, &p, &sp) != 0) {
            uctx_free(&c);
            goto out;
        }
        st.space += sp;
        if (c.nopt) {
            anyopt = 1;
            st.min_mem_bytes = fmin(st.min_mem_bytes, min_memory(&c));
        }
        uctx_free(&c);
    }
    st.seconds = now_s() - t0;
    if (p.n == 0) {
        if (!anyopt || !isfinite(st.min_mem_bytes))
            xmp_err_buf(
                err, errlen,
                "%d ranks cannot be factorized into stage meshes for this model: no stage count, "
                "dp x tp mesh and strategy runs the U-Transformer (batch %d, base %d)",
                o->nranks, o->B, o->model.base);
        else if (o->memory_limit > 0 && st.min_mem_bytes > o->memory_limit)
            xmp_err_buf(
                err, errlen,
                "no configuration fits --memory-limit %.0f bytes per rank: the smallest memory "
                "any configuration needs is %.0f bytes (%.1f MiB) per rank",
                o->memory_limit, st.min_mem_bytes, st.min_mem_bytes / 1048576.0);
        else
            xmp_err_buf(err, errlen, "the search found no configuration (seed %llu)",
                        (unsigned long long)o->seed);
        goto out;
    }
    memcpy(out, p.c, sizeof *out * (size_t)p.n);
    *nout = p.n;
    if (stats)
        *stats = st;
    rc = 0;
out:
    free(p.c);
    return rc;
}

int xmp_uts_search(const xmp_uts_opts_t *o, int topk, xmp_uts_cand_t *out, int *nout,
                   xmp_uts_stats_t *stats, char *err, size_t errlen)
{
    return run(o, 0, 0, topk, out, nout, stats, err, errlen);
}

int xmp_uts_exhaustive(const xmp_uts_opts_t *o, double max_space, int topk, xmp_uts_cand_t *out,
                       int *nout, xmp_uts_stats_t *stats, char *err, size_t errlen)
{
    return run(o, 1, max_space, topk, out, nout, stats, err, errlen);
}

int xmp_uts_eval(const xmp_uts_opts_t *o, xmp_uts_cand_t *cand, char *err, size_t errlen)
{
    if (check_opts(o, err, errlen))
        return -1;
    int S = cand->nstages;
    if (S < 1 || S > XMP_UTS_MAX_STAGES || o->nranks % S)
        return xmp_err_buf(err, errlen, "%d stages: between 1 and %d, dividing --ranks %d", S,
                           XMP_UTS_MAX_STAGES, o->nranks);
    uctx_t c;
    if (uctx_init(&c, o, S, 0, NULL, err, errlen)) {
        uctx_free(&c);
        return -1;
    }
    ucfg_t g;
    memset(&g, 0, sizeof g);
    int rc = -1, l = 0;
    for (int s = 0; s < S; s++) {
        g.first[s] = l;
        l += cand->count[s];
        g.oi[s] = -1;
        for (int k = 0; k < c.nopt; k++)
            if (c.opt[k].dp == cand->dp[s] && c.opt[k].tp == cand->tp[s] &&
                c.opt[k].strat == cand->strategy[s])
                g.oi[s] = k;
        if (g.oi[s] < 0) {
            xmp_err_buf(err, errlen, "stage %d: mesh %dx%d with strategy %s is not an option", s,
                        cand->dp[s], cand->tp[s],
                        xmp_uts_strategy_name(o, cand->strategy[s])
                            ? xmp_uts_strategy_name(o, cand->strategy[s])
                            : "?");
            goto out;
        }
    }
    g.first[S] = l;
    if (l != L_) {
        xmp_err_buf(err, errlen, "the stages hold %d layers, the model has %d", l, L_);
        goto out;
    }
    g.ki = g.mi = -1;
    for (int k = 0; k < c.nk; k++)
        if (c.kinds[k] == cand->sched)
            g.ki = k;
    for (int k = 0; k < c.nM; k++)
        if (c.Ms[k] == cand->M)
            g.mi = k;
    if (g.ki < 0 || g.mi < 0) {
        xmp_err_buf(err, errlen, "schedule %d / microbatches %d not in the space", cand->sched,
                    cand->M);
        goto out;
    }
    if (!cfg_valid(&c, &g)) {
        xmp_err_buf(err, errlen,
                    "invalid configuration (a strategy does not fit a layer, dp does not "
                    "divide the microbatch, or a 1F1B schedule with M < S)");
        goto out;
    }
    xmp_uts_cand_t x;
    double t = cfg_eval(&c, &g, &x);
    if (isnan(t))
        goto out;
    *cand = x;
    rc = 0;
out:
    uctx_free(&c);
    return rc;
}

void xmp_uts_flags(const xmp_uts_opts_t *o, const xmp_uts_cand_t *c, char *layout, char *meshes,
                   char *strats, size_t n)
{
    size_t a = 0, b = 0, d = 0;
    layout[0] = meshes[0] = strats[0] = 0;
    for (int s = 0; s < c->nstages; s++) {
        a += (size_t)snprintf(layout + a, a < n ? n - a : 0, "%su*%d", s ? "|" : "", c->count[s]);
        b += (size_t)snprintf(meshes + b, b < n ? n - b : 0, "%s%dx%d", s ? "," : "", c->dp[s],
                              c->tp[s]);
        const char *nm = xmp_uts_strategy_name(o, c->strategy[s]);
        d += (size_t)snprintf(strats + d, d < n ? n - d : 0, "%s%s", s ? "," : "", nm ? nm : "?");
        if (a >= n || b >= n || d >= n)
            break;
    }
}

void xmp_uts_command(const xmp_uts_opts_t *o, const xmp_uts_cand_t *c, char *buf, size_t n)
{
    char lay[256], mesh[256], st[256];
    xmp_uts_flags(o, c, lay, mesh, st, sizeof lay);
    snprintf(buf, n,
             "mpirun -np %d xmesh-train utransformer --base-channels %d --groups %d --head-dim %d "
             "--batch %d --layout '%s' --stage-mesh %s --stage-strategy %s --schedule %s "
             "--microbatches %d",
             o->nranks, o->model.base, o->model.groups, o->model.head_dim, o->B, lay, mesh, st,
             xmp_sched_kind_name(c->sched), c->M);
}
