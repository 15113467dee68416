/*
 * pipeline.search.ut (unit): the U-Transformer layout search (pipeline/search/search_ut.h).
 *  - coordinate descent + Metropolis-Hastings finds the exhaustive optimum on small spaces
 *    (1-4 ranks, 1-2 hosts, batch 2-4, schedule / strategy subsets, with and without a memory
 *    limit), for several search seeds (base seed printed; XMESH_TEST_SEED replays);
 *  - the smallest memory the refusal names is exact: a limit at it finds a configuration, a
 *    limit one byte below is refused with that number in the message;
 *  - every result re-evaluated from its description gives the same figures;
 *  - the strategy list is data: an unknown name is never chosen, results equal the list
 *    without it; errors (hosts, ranks that cannot be factorized, microbatches, big spaces).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched/schedule.h"
#include "search/search_ut.h"

static int g_fail;
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                        \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            g_fail++;                                                                              \
        }                                                                                          \
    } while (0)

static xm_costmodel_t *g_cm;
static xm_cluster_t g_cl;

static void opts(xmp_uts_opts_t *o, int N, int H, int B)
{
    memset(o, 0, sizeof *o);
    xmp_ut_config_init(&o->model, 8, 0, 0);
    o->B = B;
    o->nranks = N;
    o->hosts = H;
    o->cost = g_cm;
    o->cluster = &g_cl;
}

static int same_cfg(const xmp_uts_cand_t *a, const xmp_uts_cand_t *b)
{
    if (a->nstages != b->nstages || a->M != b->M || a->sched != b->sched)
        return 0;
    for (int s = 0; s < a->nstages; s++)
        if (a->count[s] != b->count[s] || a->dp[s] != b->dp[s] || a->tp[s] != b->tp[s] ||
            a->strategy[s] != b->strategy[s])
            return 0;
    return 1;
}

/* The search's best equals the exhaustive best for space (N, H, B) and seeds. */
static void oracle(int N, int H, int B, unsigned sched, double limit_frac, uint64_t seed)
{
    xmp_uts_opts_t o;
    opts(&o, N, H, B);
    o.schedules = sched;
    xmp_uts_cand_t ex[4], se[4];
    xmp_uts_stats_t st;
    int ne = 0, ns = 0;
    char err[1024];
    if (limit_frac > 0) { /* a limit between the smallest need and the unconstrained best's */
        if (xmp_uts_exhaustive(&o, 1e6, 1, ex, &ne, &st, err, sizeof err)) {
            CHECK(0, "N %d: %s", N, err);
            return;
        }
        o.memory_limit = st.min_mem_bytes + limit_frac * (ex[0].mem_bytes - st.min_mem_bytes);
    }
    int r = xmp_uts_exhaustive(&o, 1e6, 4, ex, &ne, &st, err, sizeof err);
    CHECK(r == 0 && ne >= 1, "N %d H %d B %d: exhaustive: %s", N, H, B, err);
    if (r)
        return;
    for (int k = 0; k < 3; k++) {
        o.seed = seed + (uint64_t)k;
        xmp_uts_stats_t ss;
        r = xmp_uts_search(&o, 4, se, &ns, &ss, err, sizeof err);
        CHECK(r == 0 && ns >= 1, "search seed %llu: %s", (unsigned long long)o.seed, err);
        if (r)
            continue;
        CHECK(fabs(se[0].step_s - ex[0].step_s) <= 1e-12 * ex[0].step_s,
              "N %d H %d B %d sched %u limit %.0f seed %llu: search %.9g (S %d M %d) vs "
              "exhaustive %.9g (S %d M %d)",
              N, H, B, sched, o.memory_limit, (unsigned long long)o.seed, se[0].step_s,
              se[0].nstages, se[0].M, ex[0].step_s, ex[0].nstages, ex[0].M);
        CHECK(o.memory_limit == 0 || se[0].mem_bytes <= o.memory_limit, "over the limit");
    }
    printf("  N %d H %d B %d sched %u limit %.0f: best %.6g s (%d stages, M %d), %ld "
           "configurations enumerated\n",
           N, H, B, sched, o.memory_limit, ex[0].step_s, ex[0].nstages, ex[0].M, st.evals);
}

static void test_memory_limit(void)
{
    xmp_uts_opts_t o;
    opts(&o, 4, 2, 4);
    xmp_uts_cand_t c[2];
    xmp_uts_stats_t st;
    int n = 0;
    char err[1024], want[64];
    CHECK(xmp_uts_search(&o, 2, c, &n, &st, err, sizeof err) == 0, "%s", err);
    double need = st.min_mem_bytes;
    CHECK(isfinite(need) && need > 0, "min memory %g", need);
    o.memory_limit = need;
    CHECK(xmp_uts_exhaustive(&o, 1e6, 2, c, &n, &st, err, sizeof err) == 0 && n >= 1 &&
              c[0].mem_bytes <= need,
          "a limit at the smallest need %.0f finds nothing: %s", need, err);
    /* the smallest need is attained: some configuration has exactly that peak */
    o.memory_limit = need - 1;
    n = -7;
    int r = xmp_uts_exhaustive(&o, 1e6, 2, c, &n, &st, err, sizeof err);
    snprintf(want, sizeof want, "needs is %.0f bytes", need);
    CHECK(r == -1 && n == -7 && strstr(err, "--memory-limit") && strstr(err, want),
          "limit %.0f: r %d n %d message: %s (want '%s')", o.memory_limit, r, n, err, want);
    r = xmp_uts_search(&o, 2, c, &n, &st, err, sizeof err);
    CHECK(r == -1 && strstr(err, want), "search: %s", err);
    printf("  memory: smallest need %.0f bytes; refusal: %s\n", need, err);
}

static void test_eval_roundtrip(void)
{
    xmp_uts_opts_t o;
    opts(&o, 8, 4, 8);
    o.seed = 7;
    o.mh_steps = 100;
    xmp_uts_cand_t c[5];
    xmp_uts_stats_t st;
    int n = 0;
    char err[1024];
    CHECK(xmp_uts_search(&o, 5, c, &n, &st, err, sizeof err) == 0 && n == 5, "%s", err);
    for (int i = 0; i < n; i++) {
        xmp_uts_cand_t x = c[i];
        x.step_s = x.mem_bytes = -1;
        CHECK(xmp_uts_eval(&o, &x, err, sizeof err) == 0, "eval %d: %s", i, err);
        CHECK(x.step_s == c[i].step_s && x.mem_bytes == c[i].mem_bytes &&
                  x.boundary_bytes == c[i].boundary_bytes && same_cfg(&x, &c[i]),
              "candidate %d: step %.9g vs %.9g, mem %.0f vs %.0f", i, x.step_s, c[i].step_s,
              x.mem_bytes, c[i].mem_bytes);
        if (i)
            CHECK(c[i].step_s >= c[i - 1].step_s, "order %d", i);
        int layers = 0;
        for (int s = 0; s < c[i].nstages; s++)
            layers += c[i].count[s];
        CHECK(layers == XMP_UT_LAYERS, "candidate %d: %d layers", i, layers);
    }
    /* the edges are priced: a 2-stage split with the skips crossing has boundary time, and the
     * boundary ablation makes it 0 and the step no slower */
    xmp_uts_cand_t x;
    memset(&x, 0, sizeof x);
    x.nstages = 2;
    x.M = 2;
    x.sched = XMP_SCHED_1F1B;
    x.count[0] = 3; /* conv_in..down2 | down3..conv_out: skips s1, s2 cross */
    x.count[1] = 10;
    x.dp[0] = x.dp[1] = 4;
    x.tp[0] = x.tp[1] = 1;
    opts(&o, 8, 4, 8);
    CHECK(xmp_uts_eval(&o, &x, err, sizeof err) == 0 && x.boundary_s > 0, "boundary %g: %s",
          x.boundary_s, err);
    double with = x.step_s, bnd = x.boundary_s;
    xmp_uts_cand_t y = x;
    y.count[0] = 7; /* conv_in..up1 | up2..: skips s1, s2, s3 cross, not s4 */
    y.count[1] = 6;
    CHECK(xmp_uts_eval(&o, &y, err, sizeof err) == 0 && y.boundary_s > 0, "%s", err);
    o.no_boundary = 1;
    CHECK(xmp_uts_eval(&o, &x, err, sizeof err) == 0 && x.boundary_s == 0 && x.step_s < with,
          "ablated: boundary %g step %g vs %g", x.boundary_s, x.step_s, with);
    printf("  edges: split 3|10 %.3g s per microbatch, 7|6 %.3g s; step %.4g s, %.4g without\n",
           bnd, y.boundary_s, with, x.step_s);
}

static void test_strategy_list(void)
{
    xmp_uts_opts_t o;
    opts(&o, 4, 2, 4);
    xmp_uts_cand_t a[3], b[3];
    xmp_uts_stats_t st;
    int na = 0, nb = 0;
    char err[1024];
    o.nstrat = 1;
    o.strategies[0] = "dp";
    CHECK(xmp_uts_exhaustive(&o, 1e6, 3, a, &na, &st, err, sizeof err) == 0, "%s", err);
    o.nstrat = 2;
    o.strategies[0] = "nosuch";
    o.strategies[1] = "dp";
    CHECK(xmp_uts_exhaustive(&o, 1e6, 3, b, &nb, &st, err, sizeof err) == 0, "%s", err);
    CHECK(na == nb, "%d vs %d", na, nb);
    for (int i = 0; i < na && i < nb; i++) {
        CHECK(a[i].step_s == b[i].step_s, "%d: %g vs %g", i, a[i].step_s, b[i].step_s);
        for (int s = 0; s < b[i].nstages; s++)
            CHECK(b[i].strategy[s] == 1, "the unknown strategy was chosen (stage %d)", s);
    }
}

static void test_errors(void)
{
    xmp_uts_opts_t o;
    xmp_uts_cand_t c[2];
    xmp_uts_stats_t st;
    int n = -7;
    char err[1024];
    opts(&o, 8, 3, 8);
    CHECK(xmp_uts_search(&o, 2, c, &n, &st, err, sizeof err) == -1 && strstr(err, "--hosts 3") &&
              n == -7,
          "message: %s", err);
    opts(&o, 7, 1,
         8); /* megatron on one stage of 7: 7x1 does not split 8 images, 1x7 not 4 groups */
    o.max_stages = 1;
    o.nstrat = 1;
    o.strategies[0] = "nosuch"; /* a name the model does not build: nothing is valid */
    CHECK(xmp_uts_search(&o, 2, c, &n, &st, err, sizeof err) == -1 &&
              strstr(err, "7 ranks cannot be factorized") && n == -7,
          "message: %s", err);
    opts(&o, 4, 1, 6);
    o.fixed_M = 4;
    CHECK(xmp_uts_search(&o, 2, c, &n, &st, err, sizeof err) == -1 &&
              strstr(err, "--microbatches 4"),
          "message: %s", err);
    opts(&o, 64, 8, 64);
    CHECK(xmp_uts_exhaustive(&o, 1000, 2, c, &n, &st, err, sizeof err) == -1 &&
              strstr(err, "more than 1000"),
          "message: %s", err);
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    uint64_t seed = 0x5eed21u;
    const char *e = getenv("XMESH_TEST_SEED");
    if (e)
        seed = strtoull(e, NULL, 0);
    printf("pipeline.search.ut: seed %llu (XMESH_TEST_SEED replays)\n", (unsigned long long)seed);
    int one = 0;
    xm_hostmap_t hm = {1, 1, &one};
    if (xm_cluster_init(&g_cl, &hm) || xm_costmodel_nominal(&g_cl, 5e10, &g_cm)) {
        fprintf(stderr, "setup: %s\n", xmesh_last_error());
        return 1;
    }
    g_cl.nic_send_Bps = g_cl.nic_recv_Bps = 1.25e8; /* 1 Gbit/s: edges and collectives matter */
    xm_costmodel_destroy(g_cm);
    if (xm_costmodel_nominal(&g_cl, 5e10, &g_cm)) {
        fprintf(stderr, "setup: %s\n", xmesh_last_error());
        return 1;
    }
    oracle(1, 1, 2, 0, 0, seed);
    oracle(2, 1, 4, 0, 0, seed);
    oracle(2, 2, 4, 0, 0.3, seed);
    oracle(4, 2, 4, 0, 0, seed);
    oracle(4, 2, 4, 1u << XMP_SCHED_1F1B, 0.5, seed);
    oracle(4, 4, 2, 0, 0, seed);
    test_memory_limit();
    test_eval_roundtrip();
    test_strategy_list();
    test_errors();
    xm_costmodel_destroy(g_cm);
    xm_cluster_free(&g_cl);
    if (g_fail) {
        fprintf(stderr, "pipeline.search.ut: %d failures (seed %llu)\n", g_fail,
                (unsigned long long)seed);
        return 1;
    }
    printf("pipeline.search.ut: all checks passed\n");
    return 0;
}
