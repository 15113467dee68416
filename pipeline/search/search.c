/*
 * GPT-2 layout search (issue 21 items 2 and 3): one configuration evaluated (model,
 * chain DP, simulator), the DP checked against the exhaustive oracle, the search over
 * stage and microbatch counts with its ranking, and the command lines of a candidate.
 * The cost walk is in search_walk.c, options and the chain DP in search_dp.c, the
 * CPU-sharing simulation in search_sim.c.
 * See search.h for the contract and docs/SEARCH.md for the formulas.
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

/* Fills c's predictions inside ctx (options chosen by index). */

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
        xmp_search__stage_cost(x, s, oi[s], nb[s], c->sched, &sc);
        if (x->failed)
            return -1;
        f[s] = sc.f;
        b[s] = sc.b;
        double e = 0;
        if (s + 1 < S) {
            e = xmp_search__edge_time(x, s, oi[s], oi[s + 1]);
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
        double xb =
            F32 * xmp_search__local_elems(d, 3, xmp_search__cls(o, "act.x"), o->shape, o->ndim);
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
    c->chain_s = xmp_search__objective(x, sum, mb, mr);
    c->step_s = NAN;
    c->bubble = NAN;
    if (!simulate)
        return 0;
    xmp_sedge_t edges[XMP_SEARCH_MAX_STAGES];
    int ne = xmp_sched_chain_edges(S, edges);
    xmp_schedule_t *sch = NULL;
    char msg[512];
    if (xmp_sched_generate(c->sched, S, x->M, ne, edges, NULL, &sch, msg, sizeof msg))
        return xmp_search__ctx_fail(x, "schedule %s S=%d M=%d: %s", xmp_sched_kind_name(c->sched),
                                    S, x->M, msg);
    xmp_sim_costs_t sc = {.f = f, .b = b, .xfer = xfer, .r = rmax, .o = omax, .share_nic = 1};
    /* the NICs' token buckets (cluster file nic_burst_bytes): seconds at the slower direction */
    const xm_cluster_t *cl = x->o->cluster;
    if (cl && cl->nic_burst_bytes > 0 && !x->o->no_burst)
        sc.nic_burst_s = cl->nic_burst_bytes / fmin(cl->nic_send_Bps, cl->nic_recv_Bps);
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
        return xmp_search__ctx_fail(x, "simulator: %s", msg);
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
    if (xmp_search__ctx_init(&x, &oo, S, M, xmp_search__step_factor(&oo), NULL, e2, sizeof e2)) {
        xmp_search__ctx_free(&x);
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
            xmp_search__ctx_free(&x);
            return xmp_err_buf(err, errlen,
                               "configuration: stage %d: strategy %s on that mesh is not a "
                               "valid option (an SBP rule or an even split is missing)",
                               s, xmp_search_strategy_name(c->strategy[s]));
        }
    }
    int r = eval_ctx(&x, c->nblocks, oi, c, 1);
    xmp_search__ctx_free(&x);
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
    if (xmp_search__ctx_init(&x, o, S, M, xmp_search__step_factor(o), NULL, err, errlen)) {
        xmp_search__ctx_free(&x);
        return -1;
    }
    int nb[XMP_SEARCH_MAX_STAGES], oi[XMP_SEARCH_MAX_STAGES];
    unsigned mask = o->strategies ? o->strategies : 0xFu;
    *dp_best =
        x.nopt && valid_SMk(S, M, kind) ? xmp_search__dp_run(&x, kind, mask, nb, oi) : INFINITY;
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
                        xmp_search__stage_cost(&x, s, sel[s], part[s], kind, &sc);
                        feas &= xmp_search__mem_ok(&x, sc.mem);
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
    xmp_search__ctx_free(&x);
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
    const double cf = xmp_search__step_factor(o);
    for (int S = 1; S <= maxS; S++) {
        if (o->nranks % S || S > L)
            continue;
        for (int M = 1; M <= o->B; M++) {
            if (o->B % M || (o->fixed_M > 0 && M != o->fixed_M))
                continue;
            ctx_t x;
            if (xmp_search__ctx_init(&x, o, S, M, cf, &st, err, errlen)) {
                xmp_search__ctx_free(&x);
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
                double mm = xmp_search__min_memory(&x, kind);
                if (mm < st.min_mem_bytes)
                    st.min_mem_bytes = mm;
                /* the unrestricted optimum, then the best of each built-in alone */
                for (int fam = -1; fam < XMP_SEARCH_NSTRAT; fam++) {
                    unsigned fm = fam < 0 ? mask : (mask & (1u << fam));
                    if (!fm)
                        continue;
                    int nb[XMP_SEARCH_MAX_STAGES], oi[XMP_SEARCH_MAX_STAGES];
                    double v = xmp_search__dp_run(&x, kind, fm, nb, oi);
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
            xmp_search__ctx_free(&x);
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
