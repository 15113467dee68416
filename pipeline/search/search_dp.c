/*
 * GPT-2 layout search: the strategy names, the per-stage-size options (meshes x
 * strategies), the search context's setup and teardown, stage costs and the exact
 * chain DP over stage sizes and options.
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

static const char *const g_strat[XMP_SEARCH_NSTRAT] = {"dp", "megatron", "3d", "axonn"};

const char *xmp_search_strategy_name(int i)
{
    return i >= 0 && i < XMP_SEARCH_NSTRAT ? g_strat[i] : NULL;
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
    xmp_search__spec_of(o, "act.x", 0, sp, sizeof sp);
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
        return xmp_search__ctx_fail(c, "out of memory");
    }
    int nf = factorizations(c->n, fac, nd, 512);
    c->opt = calloc((size_t)nf * XMP_SEARCH_NSTRAT + 1, sizeof(opt_t));
    if (!c->opt) {
        free(fac);
        free(nd);
        return xmp_search__ctx_fail(c, "out of memory");
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
                if (e && !xmp_search__even_splits(d, chk[q].nd, e->sbp, o->shape, o->ndim))
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
                    return xmp_search__ctx_fail(c, "out of memory");
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

void xmp_search__ctx_free(ctx_t *c)
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
double xmp_search__step_factor(const xmp_search_opts_t *o)
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

/* cf: xmp_search__step_factor(o), computed once by the caller (a search inits a context per S and
 * M). */
int xmp_search__ctx_init(ctx_t *c, const xmp_search_opts_t *o, int S, int M, double cf,
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
        return xmp_search__ctx_fail(c, "cost model: sgemm: %s", xmesh_last_error());
    c->gemm_rate = 2.0 * 256 * 256 * 256 / p.seconds;
    c->cf = cf;
    if (xmp_gpt2_graph(&o->model, c->Bm, o->T, 1, &c->graph))
        return xmp_search__ctx_fail(c, "%s", xmp_last_error());
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
        return xmp_search__ctx_fail(c, "out of memory");
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

/* Stage s with nb blocks on option oi (E on stage 0, L on the last). */
void xmp_search__stage_cost(ctx_t *c, int s, int oi, int nb, int kind, scost_t *sc)
{
    const icost_t *ic = xmp_search__icost(c, s, oi);
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
        sc->r += ic[IT_W].r + xmp_search__tied_time(c, oi);
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

int xmp_search__mem_ok(const ctx_t *c, double mem)
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

double xmp_search__objective(const ctx_t *c, double sum, double mb, double mr)
{
    return sum + (c->M - 1) * mb + mr;
}

/* The exact chain DP for (S, M, kind) over options whose strategy is in mask.
 * Fills best (nstages, nblocks, opts) and returns its xmp_search__objective (INFINITY if
 * none is feasible). State (k stages placed from the right, blocks [i, L)
 * covered, signature of the leftmost placed stage). */
double xmp_search__dp_run(ctx_t *c, int kind, unsigned mask, int *best_nb, int *best_opt)
{
    int S = c->S, L = c->o->model.num_layers, G = c->nsig > 0 ? c->nsig : 1;
    size_t nstate = (size_t)(S + 1) * (size_t)(L + 1) * (size_t)G;
    front_t *fr = calloc(nstate, sizeof(front_t));
    double best = INFINITY;
    if (!fr) {
        xmp_search__ctx_fail(c, "out of memory");
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
                        xmp_search__stage_cost(c, s, oi, i - j, kind, &sc);
                        if (c->failed)
                            goto out;
                        if (!xmp_search__mem_ok(c, sc.mem))
                            continue;
                        double cfb = sc.f + sc.b;
                        double e = 0;
                        if (k > 0) {
                            /* the right neighbour's signature is g; any option of that
                             * signature carries it */
                            e = xmp_search__edge_time(c, s, oi, rep[g]);
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
                double v = xmp_search__objective(c, f->e[q].sum, f->e[q].mb, f->e[q].mr);
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
    xmp_search__ctx_fail(c, "out of memory");
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
double xmp_search__min_memory(ctx_t *c, int kind)
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
                    xmp_search__stage_cost(c, s, oi, i - j, kind, &sc);
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
