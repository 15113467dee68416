/*
 * pipeline.search (unit, one process): the GPT-2 layout search.
 *  - the chain DP equals exhaustive enumeration of every configuration (all
 *    splits x all options per stage) for every stage count, microbatch count
 *    and schedule, on random small models, rank counts, host counts and memory
 *    limits (seed printed; XMESH_TEST_SEED replays);
 *  - model terms by hand: one rank (no collectives, memory = 16 bytes per
 *    parameter + activations), dp on 2 ranks (gradient all-reduce volume);
 *  - the search's best equals the least DP objective; candidates re-evaluated
 *    from their description give the same figures; their flags build the same
 *    stage layout (models/stage_layout.h) and strategies load for their meshes;
 *  - errors: ranks that cannot be factorized, hosts not dividing ranks, a
 *    memory limit nothing meets (message gives the smallest memory, equal to
 *    the search's own figure), a bad configuration for eval.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/gpt2_par.h"
#include "models/stage_layout.h"
#include "nn/strategy.h"
#include "sched/schedule.h"
#include "search/search.h"

static int g_fail;
#define CHECK(c, ...)                                                                              \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #c);                           \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            g_fail++;                                                                              \
        }                                                                                          \
    } while (0)

static uint64_t g_rng;
static uint32_t rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 11);
}

static xm_costmodel_t *g_cm;
static xm_cluster_t g_cl;

static void base_opts(xmp_search_opts_t *o, int L, int NH, int C, int V, int B, int T, int N, int H)
{
    memset(o, 0, sizeof *o);
    o->model.num_layers = L;
    o->model.num_heads = NH;
    o->model.channels = C;
    o->model.max_seq_len = 64;
    o->model.vocab_size = V;
    o->model.padded_vocab_size = xmp_gpt2_pad_vocab(V, 128);
    o->vocab = V;
    o->B = B;
    o->T = T;
    o->nranks = N;
    o->hosts = H;
    o->cost = g_cm;
    o->cluster = &g_cl;
    o->max_evals = 300;
}

static int rel_eq(double a, double b)
{
    if (isinf(a) || isinf(b))
        return a == b;
    return fabs(a - b) <= 1e-12 * fmax(fabs(a), fabs(b));
}

/* DP == exhaustive for every (S, M, kind) of one problem. */
static void dp_vs_exhaustive(const xmp_search_opts_t *o, const char *what)
{
    long total = 0;
    int cases = 0;
    for (int S = 1; S <= o->model.num_layers && S <= o->nranks; S++) {
        if (o->nranks % S)
            continue;
        for (int M = 1; M <= o->B; M++) {
            if (o->B % M)
                continue;
            for (int k = 0; k < 3; k++) {
                double dp = NAN, ex = NAN;
                long n = 0;
                char err[512];
                int r = xmp_search_gpt_check(o, S, M, k, &dp, &ex, &n, err, sizeof err);
                CHECK(r == 0, "%s S=%d M=%d %s: %s", what, S, M, xmp_sched_kind_name(k), err);
                CHECK(rel_eq(dp, ex), "%s S=%d M=%d %s: DP %.17g, exhaustive %.17g over %ld", what,
                      S, M, xmp_sched_kind_name(k), dp, ex, n);
                total += n;
                cases++;
            }
        }
    }
    printf("  %s: %d (S, M, schedule) cases, %ld configurations enumerated\n", what, cases, total);
}

static void test_dp_exhaustive(uint64_t seed)
{
    static const int ranks[] = {1, 2, 3, 4, 6, 8};
    static const struct {
        int L, NH, C, V;
    } models[] = {{2, 2, 32, 64}, {3, 4, 64, 100}, {4, 4, 32, 256}, {4, 2, 48, 50}};
    {
        /* a fixed larger space: 8 ranks on 2 hosts, every strategy, 4 blocks, B 8 */
        xmp_search_opts_t o;
        base_opts(&o, 4, 4, 64, 256, 8, 16, 8, 2);
        dp_vs_exhaustive(&o, "L=4 NH=4 C=64 V=256 B=8 N=8 H=2 all strategies");
    }
    for (int t = 0; t < 10; t++) {
        int mi = (int)(rnd() % 4), N = ranks[rnd() % 6];
        int H = 1;
        if (N % 2 == 0 && rnd() % 2)
            H = 2;
        if (N == 8 && rnd() % 2)
            H = 4;
        int B = (int)(1u << (rnd() % 3)) * (N % 3 == 0 ? 3 : 1);
        xmp_search_opts_t o;
        base_opts(&o, models[mi].L, models[mi].NH, models[mi].C, models[mi].V, B, 16, N, H);
        if (N == 8 && models[mi].L == 4)
            o.strategies = (rnd() % 2) ? 0x3u : 0xDu; /* keep the space small */
        char what[160];
        /* unconstrained, then a memory limit between the smallest need and 1.5x */
        snprintf(what, sizeof what, "L=%d NH=%d C=%d V=%d B=%d N=%d H=%d strat=%x",
                 o.model.num_layers, o.model.num_heads, o.model.channels, o.vocab, B, N, H,
                 o.strategies);
        dp_vs_exhaustive(&o, what);
        xmp_search_cand_t c[4];
        int n = 0;
        xmp_search_stats_t st;
        char err[1024];
        if (xmp_search_gpt(&o, 4, c, &n, &st, err, sizeof err) == 0 && isfinite(st.min_mem_bytes)) {
            o.memory_limit = st.min_mem_bytes * (1.0 + 0.5 * (rnd() % 1000) / 1000.0);
            snprintf(what, sizeof what, "  ... with --memory-limit %.0f", o.memory_limit);
            dp_vs_exhaustive(&o, what);
        }
    }
    (void)seed;
}

/* One rank: no collective; memory 16 bytes per parameter + activations. */
static void test_one_rank(void)
{
    xmp_search_opts_t o;
    base_opts(&o, 2, 2, 32, 64, 2, 16, 1, 1);
    xmp_search_cand_t c;
    memset(&c, 0, sizeof c);
    c.nstages = 1;
    c.M = 1;
    c.sched = XMP_SCHED_1F1B;
    c.nblocks[0] = 2;
    c.ndim[0] = 1;
    c.shape[0][0] = 1;
    c.strategy[0] = 0; /* dp */
    char err[512];
    CHECK(xmp_search_gpt_eval(&o, &c, err, sizeof err) == 0, "%s", err);
    xmp_gpt2_param_info_t tab[XMP_GPT2_NUM_PARAM_TENSORS];
    size_t total = 0;
    xmp_gpt2_param_table(&o.model, tab, &total);
    CHECK(c.mem_param_bytes == 16.0 * (double)total, "param memory %.0f, 16 x %zu params = %.0f",
          c.mem_param_bytes, total, 16.0 * (double)total);
    CHECK(c.boxing_bytes == 0 && c.boxing_s == 0, "boxing %g bytes %g s on one rank",
          c.boxing_bytes, c.boxing_s);
    CHECK(c.boundary_bytes == 0 && c.boundary_s == 0, "boundary on one stage");
    CHECK(c.compute_s > 0 && isfinite(c.step_s) && c.step_s >= c.compute_s, "compute %g step %g",
          c.compute_s, c.step_s);
    /* dp on 2 ranks of one host: the gradient all-reduce of every parameter,
     * per-rank volume 2 (p-1)/p x 4 bytes x params = 4 x params */
    base_opts(&o, 2, 2, 32, 64, 2, 16, 2, 1);
    c.shape[0][0] = 2;
    CHECK(xmp_search_gpt_eval(&o, &c, err, sizeof err) == 0, "%s", err);
    CHECK(fabs(c.boxing_bytes - 4.0 * (double)total) < 1e-6 * (double)total,
          "dp x2 boxing %.0f bytes, expected 4 x %zu", c.boxing_bytes, total);
    CHECK(c.mem_param_bytes == 16.0 * (double)total, "dp keeps every parameter: %.0f",
          c.mem_param_bytes);
    /* axonn on 2x2x2 keeps its weight matrices sharded: less parameter memory
     * than 3d on the same mesh */
    base_opts(&o, 2, 4, 32, 64, 4, 16, 8, 2);
    c.ndim[0] = 3;
    c.shape[0][0] = c.shape[0][1] = c.shape[0][2] = 2;
    c.strategy[0] = 2;
    CHECK(xmp_search_gpt_eval(&o, &c, err, sizeof err) == 0, "3d: %s", err);
    double m3d = c.mem_param_bytes;
    c.strategy[0] = 3;
    CHECK(xmp_search_gpt_eval(&o, &c, err, sizeof err) == 0, "axonn: %s", err);
    CHECK(c.mem_param_bytes < m3d, "axonn %.0f bytes, 3d %.0f", c.mem_param_bytes, m3d);
    /* ablations: boundaries free; NIC sharing ignored (a 2x4 stage on 2 hosts: axis 0's
     * groups cross hosts 4 to a NIC) */
    base_opts(&o, 2, 4, 32, 64, 16, 16, 8, 2);
    memset(&c, 0, sizeof c);
    c.nstages = 2;
    c.M = 2;
    c.sched = XMP_SCHED_1F1B;
    c.nblocks[0] = c.nblocks[1] = 1;
    c.ndim[0] = c.ndim[1] = 1;
    c.shape[0][0] = c.shape[1][0] = 4;
    c.strategy[0] = c.strategy[1] = 0;
    CHECK(xmp_search_gpt_eval(&o, &c, err, sizeof err) == 0, "%s", err);
    CHECK(c.boundary_s > 0, "boundary %g", c.boundary_s);
    double with_b = c.step_s;
    o.no_boundary = 1;
    CHECK(xmp_search_gpt_eval(&o, &c, err, sizeof err) == 0, "%s", err);
    CHECK(c.boundary_s == 0 && c.step_s < with_b, "no_boundary: %g s, step %g vs %g", c.boundary_s,
          c.step_s, with_b);
    o.no_boundary = 0;
    c.nstages = 1;
    c.nblocks[0] = 2;
    c.ndim[0] = 2;
    c.shape[0][0] = 2;
    c.shape[0][1] = 4;
    CHECK(xmp_search_gpt_eval(&o, &c, err, sizeof err) == 0, "%s", err);
    double shared = c.boxing_s;
    o.no_share = 1;
    CHECK(xmp_search_gpt_eval(&o, &c, err, sizeof err) == 0, "%s", err);
    CHECK(c.boxing_s < shared, "no_share: boxing %g s, with sharing %g s", c.boxing_s, shared);
    printf("  one rank: %zu params, %.0f bytes; dp x2 boxing %.0f bytes; 3d %.0f axonn %.0f\n",
           total, 16.0 * (double)total, 4.0 * (double)total, m3d, c.mem_param_bytes);
}

/* The cluster's NIC burst (nic_burst_bytes) reaches the search's simulator as nic_burst_s =
 * bytes / the slower NIC direction: two one-rank stages on two hosts, 1F1B M=2, no cpuset
 * records (the plain simulation), so the step must equal xmp_sim_run of the same schedule fed
 * the candidate's own stage costs and boundary time with that burst; half a transfer's burst
 * shortens the step; --ablate burst (no_burst) and burst 0 price as before. */
static double replay(const xmp_search_cand_t *c, double burst_s)
{
    xmp_sedge_t edges[XMP_SEARCH_MAX_STAGES];
    int ne = xmp_sched_chain_edges(c->nstages, edges);
    xmp_schedule_t *sch = NULL;
    char msg[256];
    if (xmp_sched_generate(c->sched, c->nstages, c->M, ne, edges, NULL, &sch, msg, sizeof msg)) {
        CHECK(0, "schedule: %s", msg);
        return NAN;
    }
    double xfer[2] = {c->boundary_s, c->boundary_s}, r = 0, o = 0;
    for (int s = 0; s < c->nstages; s++) {
        r = fmax(r, c->stage_r_s[s]);
        o = fmax(o, c->stage_o_s[s]);
    }
    xmp_sim_costs_t k = {.f = c->stage_f_s,
                         .b = c->stage_b_s,
                         .xfer = xfer,
                         .r = r,
                         .o = o,
                         .share_nic = 1,
                         .nic_burst_s = burst_s};
    xmp_sim_result_t res;
    double t = NAN;
    if (xmp_sim_run(sch, &k, &res, msg, sizeof msg) == 0)
        t = res.step_s;
    else
        CHECK(0, "simulator: %s", msg);
    xmp_sim_result_free(&res);
    xmp_sched_destroy(sch);
    return t;
}

static void test_burst(void)
{
    xm_cluster_t keep = g_cl;
    g_cl.nic_send_Bps = 25e6; /* 200 Mbit/s out, 400 in: the burst is timed at the slower */
    g_cl.nic_recv_Bps = 50e6;
    xmp_search_opts_t o;
    base_opts(&o, 2, 2, 32, 64, 4, 16, 2, 2);
    xmp_search_cand_t c;
    memset(&c, 0, sizeof c);
    c.nstages = 2;
    c.M = 2;
    c.sched = XMP_SCHED_1F1B;
    c.nblocks[0] = c.nblocks[1] = 1;
    c.ndim[0] = c.ndim[1] = 1;
    c.shape[0][0] = c.shape[1][0] = 1;
    char err[512];
    g_cl.nic_burst_bytes = 0;
    CHECK(xmp_search_gpt_eval(&o, &c, err, sizeof err) == 0, "%s", err);
    double step0 = c.step_s, e = c.boundary_s;
    CHECK(e > 0 && rel_eq(step0, replay(&c, 0)), "no burst: step %.9g, replayed %.9g (x %g)", step0,
          replay(&c, 0), e);
    /* half a transfer's bytes at the slower direction */
    g_cl.nic_burst_bytes = 0.5 * e * 25e6;
    CHECK(xmp_search_gpt_eval(&o, &c, err, sizeof err) == 0, "%s", err);
    double step1 = c.step_s;
    CHECK(rel_eq(step1, replay(&c, 0.5 * e)), "burst %.0f B: step %.9g, replayed with %g s %.9g",
          g_cl.nic_burst_bytes, step1, 0.5 * e, replay(&c, 0.5 * e));
    CHECK(step1 < step0 - 0.5 * e,
          "burst: step %.9g, without %.9g (x %g: two transfers on the "
          "critical path)",
          step1, step0, e);
    o.no_burst = 1;
    CHECK(xmp_search_gpt_eval(&o, &c, err, sizeof err) == 0, "%s", err);
    CHECK(rel_eq(c.step_s, step0), "no_burst: step %.9g, without a burst %.9g", c.step_s, step0);
    printf("  burst: x %.6g s, step %.6g s -> %.6g s with %.0f B\n", e, step0, step1,
           g_cl.nic_burst_bytes);
    g_cl = keep;
}

/* The search's results: consistent with eval, flags that build. */
static void test_search_results(void)
{
    xmp_search_opts_t o;
    base_opts(&o, 4, 4, 64, 256, 4, 16, 8, 2);
    xmp_search_cand_t c[10];
    int n = 0;
    xmp_search_stats_t st;
    char err[1024];
    CHECK(xmp_search_gpt(&o, 10, c, &n, &st, err, sizeof err) == 0, "%s", err);
    CHECK(n == 10, "%d candidates", n);
    for (int i = 1; i < n; i++)
        CHECK(c[i - 1].step_s <= c[i].step_s, "order %d: %g > %g", i, c[i - 1].step_s, c[i].step_s);
    /* the least chain objective over every (S, M, kind) is the pool's least */
    double best = INFINITY, pool = INFINITY;
    for (int S = 1; S <= 4; S++)
        for (int M = 1; M <= 4; M *= 2)
            for (int k = 0; k < 3; k++) {
                double dp, ex;
                long cnt;
                if (8 % S || xmp_search_gpt_check(&o, S, M, k, &dp, &ex, &cnt, err, sizeof err))
                    continue;
                best = fmin(best, dp);
            }
    xmp_search_cand_t all[64];
    int na = 0;
    CHECK(xmp_search_gpt(&o, 64, all, &na, &st, err, sizeof err) == 0, "%s", err);
    for (int i = 0; i < na; i++)
        pool = fmin(pool, all[i].chain_s);
    CHECK(rel_eq(best, pool), "least chain objective %.17g, search pool %.17g", best, pool);
    for (int i = 0; i < n; i++) {
        xmp_search_cand_t d = c[i];
        CHECK(xmp_search_gpt_eval(&o, &d, err, sizeof err) == 0, "eval %d: %s", i, err);
        CHECK(rel_eq(d.step_s, c[i].step_s) && rel_eq(d.mem_bytes, c[i].mem_bytes) &&
                  rel_eq(d.chain_s, c[i].chain_s),
              "candidate %d re-evaluated: step %g vs %g, mem %g vs %g", i, d.step_s, c[i].step_s,
              d.mem_bytes, c[i].mem_bytes);
        char lay[512], mesh[512], strat[512];
        xmp_search_gpt_flags(&c[i], lay, mesh, strat, sizeof lay);
        xmp_stage_layout_t sl;
        memset(&sl, 0, sizeof sl);
        CHECK(xmp_stage_layout_build("EttttL", 1, 1, lay, 0, mesh, NULL, NULL, &sl, err,
                                     sizeof err) == 0,
              "candidate %d: layout '%s' mesh '%s': %s", i, lay, mesh, err);
        CHECK(sl.nstages == c[i].nstages && sl.nranks == 8, "candidate %d: %d stages, %d ranks", i,
              sl.nstages, sl.nranks);
        for (int s = 0; s < sl.nstages && s < c[i].nstages; s++) {
            int blocks = 0;
            for (int k = sl.first[s]; k < sl.first[s] + sl.count[s]; k++)
                blocks += sl.kind[k] == 't';
            CHECK(blocks == c[i].nblocks[s] && sl.ndim[s] == c[i].ndim[s] &&
                      !memcmp(sl.shape[s], c[i].shape[s], sizeof(int) * (size_t)sl.ndim[s]),
                  "candidate %d stage %d: layout disagrees", i, s);
            xmp_strategy_t sg;
            CHECK(xmp_strategy_load(xmp_search_strategy_name(c[i].strategy[s]),
                                    xmp_gpt2_strategy_builtin, XMP_GPT2_BUILTIN_STRATEGIES,
                                    sl.ndim[s], &sg, err, sizeof err) == 0 &&
                      xmp_gpt2_strategy_check(&sg, &o.model, s, sl.ndim[s], sl.shape[s], err,
                                              sizeof err) == 0,
                  "candidate %d stage %d: %s", i, s, err);
        }
        char cmd[2048];
        xmp_search_gpt_command(&o, &c[i], cmd, sizeof cmd);
        CHECK(strstr(cmd, lay) && strstr(cmd, mesh) && strstr(cmd, "--microbatches"),
              "command '%s'", cmd);
        if (i == 0)
            printf("  best: %s\n", cmd);
    }
}

/* Axis geometry by hand: 8 ranks on 2 hosts (4 per host). */
static void test_geometry(void)
{
    static const struct {
        int N, H, rank0, nd, shape[4], axis, p, rph, hosts, share;
    } t[] = {
        {8, 2, 0, 2, {2, 4}, 0, 2, 1, 2, 4}, /* across hosts, 4 groups share each NIC */
        {8, 2, 0, 2, {2, 4}, 1, 4, 4, 1, 1}, /* inside a host, alone on it */
        {8, 2, 0, 2, {4, 2}, 1, 2, 2, 1, 2}, /* inside a host, 2 groups at once */
        {8, 2, 0, 2, {4, 2}, 0, 4, 2, 2, 2}, /* ranks 0,2,4,6: 2 per host, 2 groups */
        {8, 2, 4, 1, {4}, 0, 4, 4, 1, 1},    /* stage 1 of 2: host 1 alone */
        {8, 4, 2, 1, {2}, 0, 2, 2, 1, 1},    /* 2 per host: stage on host 1 */
        {8, 2, 2, 1, {4}, 0, 4, 2, 2, 1},    /* ranks 2..5 straddle hosts 0 and 1 */
        {8, 2, 0, 3, {2, 2, 2}, 0, 2, 1, 2, 4}, {8, 2, 0, 3, {2, 2, 2}, 1, 2, 2, 1, 2},
        {8, 1, 0, 1, {8}, 0, 8, 8, 1, 1},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        xm_coll_geom_t g;
        xmp_search_axis_geom(t[i].N, t[i].H, t[i].rank0, t[i].nd, t[i].shape, t[i].axis, &g);
        CHECK(g.group_size == t[i].p && g.ranks_per_host == t[i].rph && g.hosts == t[i].hosts &&
                  g.share == t[i].share,
              "case %zu: p %d rph %d hosts %d share %d, want %d %d %d %d", i, g.group_size,
              g.ranks_per_host, g.hosts, g.share, t[i].p, t[i].rph, t[i].hosts, t[i].share);
    }
}

static void test_errors(void)
{
    xmp_search_opts_t o;
    xmp_search_cand_t c[2];
    int n = 0;
    xmp_search_stats_t st;
    char err[1024];
    /* 7 ranks: S = 1 only (7 > 4 blocks); a 7-rank mesh splits nothing evenly */
    base_opts(&o, 4, 4, 128, 256, 4, 16, 7, 1);
    CHECK(xmp_search_gpt(&o, 2, c, &n, &st, err, sizeof err) == -1, "7 ranks accepted");
    CHECK(strstr(err, "7 ranks cannot be factorized") != NULL, "message: %s", err);
    printf("  error: %s\n", err);
    base_opts(&o, 4, 4, 128, 256, 4, 16, 8, 3);
    CHECK(xmp_search_gpt(&o, 2, c, &n, &st, err, sizeof err) == -1 &&
              strstr(err, "--hosts 3 does not divide --ranks 8"),
          "message: %s", err);
    printf("  error: %s\n", err);
    /* memory: the smallest need from an unconstrained search; a limit 1 byte
     * below it is refused with that number; at it, accepted */
    base_opts(&o, 4, 4, 64, 256, 4, 16, 4, 1);
    CHECK(xmp_search_gpt(&o, 2, c, &n, &st, err, sizeof err) == 0, "%s", err);
    double need = st.min_mem_bytes;
    o.memory_limit = floor(need) - 1;
    CHECK(xmp_search_gpt(&o, 2, c, &n, &st, err, sizeof err) == -1, "limit below need accepted");
    char want[128];
    snprintf(want, sizeof want, "needs is %.0f bytes", need);
    CHECK(strstr(err, "no configuration fits --memory-limit") && strstr(err, want),
          "message: %s (want '%s')", err, want);
    printf("  error: %s\n", err);
    o.memory_limit = ceil(need);
    CHECK(xmp_search_gpt(&o, 2, c, &n, &st, err, sizeof err) == 0, "at the need: %s", err);
    for (int i = 0; i < n; i++)
        CHECK(c[i].mem_bytes <= o.memory_limit, "candidate %d: %.0f > limit", i, c[i].mem_bytes);
    /* eval refuses a bad configuration, naming it */
    base_opts(&o, 4, 4, 64, 256, 4, 16, 4, 1);
    xmp_search_cand_t d;
    memset(&d, 0, sizeof d);
    d.nstages = 1;
    d.M = 1;
    d.nblocks[0] = 3;
    d.ndim[0] = 1;
    d.shape[0][0] = 4;
    CHECK(xmp_search_gpt_eval(&o, &d, err, sizeof err) == -1 && strstr(err, "3 blocks"),
          "message: %s", err);
    d.nblocks[0] = 4;
    d.ndim[0] = 1;
    d.shape[0][0] = 4;
    d.strategy[0] = 3; /* axonn on 1 axis */
    CHECK(xmp_search_gpt_eval(&o, &d, err, sizeof err) == -1 && strstr(err, "axonn"), "message: %s",
          err);
    o.hosts = 0;
    CHECK(xmp_search_gpt(&o, 2, c, &n, &st, err, sizeof err) == -1 && strstr(err, "--hosts 0"),
          "message: %s", err);
}

int main(int argc, char **argv)
{
    uint64_t seed = 0x5eed2111;
    const char *e = getenv("XMESH_TEST_SEED");
    if (e)
        seed = strtoull(e, NULL, 0);
    printf("pipeline.search: seed %llu (XMESH_TEST_SEED replays)\n", (unsigned long long)seed);
    g_rng = seed ? seed : 1;
    int one = 0;
    xm_hostmap_t hm = {1, 1, &one};
    if (xm_cluster_init(&g_cl, &hm) || xm_costmodel_nominal(&g_cl, 5e10, &g_cm)) {
        fprintf(stderr, "setup: %s\n", xmesh_last_error());
        return 1;
    }
    test_geometry();
    test_one_rank();
    test_burst();
    test_errors();
    test_search_results();
    test_dp_exhaustive(seed);
    if (argc > 1) { /* a calibrated file: its collectives and sgemm records */
        xm_costmodel_t *cal = NULL;
        if (xm_costmodel_load(argv[1], &cal)) {
            fprintf(stderr, "%s: %s\n", argv[1], xmesh_last_error());
            return 1;
        }
        printf("  calibrated model: %s\n", argv[1]);
        xm_costmodel_destroy(g_cm);
        g_cm = cal;
        test_dp_exhaustive(seed + 1);
    }
    xm_costmodel_destroy(g_cm);
    xm_cluster_free(&g_cl);
    if (g_fail) {
        fprintf(stderr, "pipeline.search: %d failures (seed %llu)\n", g_fail,
                (unsigned long long)seed);
        return 1;
    }
    printf("pipeline.search: OK\n");
    return 0;
}
