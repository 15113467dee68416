/* Calibrated collective and compute costs (scheduler/xm_costmodel.h): the
 * per-collective fits on exact and noisy synthetic data and their refusals,
 * the cluster file's [collectives] and [compute] sections (round trip, old
 * and newer files, malformed lines named), and the predictions. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "xm_cluster_file.h"
#include "xm_costmodel.h"

static int rel_close(double a, double b, double tol)
{
    return fabs(a - b) <= tol * fmax(fabs(a), fabs(b)) || (a == 0 && b == 0);
}

#define assert_close(a, b, tol)                                                                    \
    do {                                                                                           \
        double a_ = (a), b_ = (b);                                                                 \
        if (!rel_close(a_, b_, tol))                                                               \
            fail_msg("%s = %.17g, expected %.17g (rel tol %g)", #a, a_, b_, (double)(tol));        \
    } while (0)

static void test_volume(void **state)
{
    (void)state;
    /* the per-algorithm factors, by hand */
    assert_close(xm_coll_volume(XM_COLL_ALLREDUCE, 1000, 4), 1500, 1e-15);
    assert_close(xm_coll_volume(XM_COLL_ALLGATHER, 1000, 4), 750, 1e-15);
    assert_close(xm_coll_volume(XM_COLL_REDUCE_SCATTER, 900, 3), 600, 1e-15);
    assert_close(xm_coll_volume(XM_COLL_ALLTOALL, 800, 8), 700, 1e-15);
    assert_true(xm_coll_volume(XM_COLL_ALLREDUCE, 1000, 1) == 0);
    assert_true(isnan(xm_coll_volume(XM_COLL_NKINDS, 1000, 4)));
    assert_true(isnan(xm_coll_volume(XM_COLL_ALLGATHER, -1, 4)));
    assert_int_equal(xm_coll_steps(XM_COLL_ALLREDUCE, 5), 8);
    assert_int_equal(xm_coll_steps(XM_COLL_ALLTOALL, 5), 4);
    for (int k = 0; k < XM_COLL_NKINDS; k++)
        assert_int_equal(xm_coll_from_name(xm_coll_name((xm_coll_t)k)), k);
    assert_int_equal(xm_coll_from_name("all_reduce"), -1);
    assert_null(xm_coll_name(XM_COLL_NKINDS));
}

/* Exact data of every kind and several group sizes: alpha and beta come
 * back to rounding, R^2 1, residual 0. */
static void test_fit_exact(void **state)
{
    (void)state;
    const int ps[] = {2, 3, 8, 64};
    for (int k = 0; k < XM_COLL_NKINDS; k++)
        for (size_t pi = 0; pi < sizeof ps / sizeof *ps; pi++) {
            int p = ps[pi];
            double n[7], t[7], alpha = 20e-6 * (k + 1), beta = 1.0 / (1.25e9 * (pi + 1));
            for (int i = 0; i < 7; i++) {
                n[i] = 4096.0 * p * (1 << i);
                t[i] = alpha + beta * xm_coll_volume((xm_coll_t)k, n[i], p);
            }
            xm_fit_t f;
            assert_int_equal(xm_coll_fit((xm_coll_t)k, p, n, t, 7, &f), XMESH_SUCCESS);
            assert_close(f.alpha, alpha, 1e-7);
            assert_close(f.beta, beta, 1e-9);
            assert_true(f.r2 > 1 - 1e-12);
            assert_true(f.worst_rel < 1e-9);
            assert_int_equal(f.n, 7);
        }
}

static double uniform(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(*s >> 11) / 9007199254740992.0; /* [0, 1) */
}

/* Multiplicative noise of at most +-3% on every time: beta within 5%, R^2
 * high and the worst residual reported about the noise. XMESH_TEST_SEED
 * replays a run. */
static void test_fit_noisy(void **state)
{
    (void)state;
    uint64_t seed = 0x21c0ffeeu;
    const char *env = getenv("XMESH_TEST_SEED");
    if (env)
        seed = strtoull(env, NULL, 0);
    printf("test_fit_noisy: seed %llu (XMESH_TEST_SEED replays)\n", (unsigned long long)seed);
    uint64_t s = seed;
    for (int rep = 0; rep < 40; rep++) {
        xm_coll_t k = (xm_coll_t)(rep % XM_COLL_NKINDS);
        int p = 2 + rep % 7;
        double n[10], t[10], alpha = 50e-6, beta = 8e-9, maxnoise = 0;
        for (int i = 0; i < 10; i++) {
            n[i] = 65536.0 * p * (1 << i);
            double noise = (uniform(&s) - 0.5) * 0.06;
            maxnoise = fmax(maxnoise, fabs(noise));
            t[i] = (alpha + beta * xm_coll_volume(k, n[i], p)) * (1 + noise);
        }
        xm_fit_t f;
        assert_int_equal(xm_coll_fit(k, p, n, t, 10, &f), XMESH_SUCCESS);
        if (!rel_close(f.beta, beta, 0.05) || !(f.r2 > 0.99) || f.worst_rel > 0.08 ||
            fabs(f.alpha - alpha) > 0.05 * t[0])
            fail_msg("seed %llu rep %d (%s p %d): beta %g (true %g) r2 %g worst_rel %g",
                     (unsigned long long)seed, rep, xm_coll_name(k), p, f.beta, beta, f.r2,
                     f.worst_rel);
    }
}

/* Weighted least squares by hand: x 0 1 2, y 0 2 1, w 1 1 2: weighted means
 * 1.25 and 1, sxx 2.75, sxy 1: beta 4/11, alpha 1 - 5/11 = 6/11. */
static void test_fit_weighted_hand(void **state)
{
    (void)state;
    const double x[3] = {0, 1, 2}, y[3] = {0, 2, 1}, w[3] = {1, 1, 2}, bad[3] = {1, 0, 1};
    xm_fit_t f;
    assert_int_equal(xm_fit_weighted(x, y, w, 3, &f), XMESH_SUCCESS);
    assert_close(f.beta, 4.0 / 11, 1e-14);
    assert_close(f.alpha, 6.0 / 11, 1e-14);
    assert_int_equal(xm_fit_weighted(x, y, bad, 3, &f), XMESH_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(xmesh_last_error(), "weight 1 is 0"));
}

/* Points whose free fit has a negative coefficient, as a busy machine gives them: an
 * all-to-all whose times fall with size (free beta < 0) comes back flat, beta 0 and alpha the
 * weighted mean time; one whose small sizes ride a burst allowance (free alpha < 0) comes back
 * through the origin with beta sum w x t / sum w x^2. Every kind, two group sizes. */
static void test_coll_fit_nonneg(void **state)
{
    (void)state;
    for (int k = 0; k < XM_COLL_NKINDS; k++)
        for (int p = 2; p <= 8; p += 6) {
            double n[5], fall[5], burst[5], x[5];
            for (int i = 0; i < 5; i++) {
                n[i] = 16384.0 * p * (1 << (2 * i));
                x[i] = xm_coll_volume((xm_coll_t)k, n[i], p);
                fall[i] = 1e-3 - 1.9e-9 * x[i] / (4 * x[0]) * 1e3; /* 1 ms, falling */
                burst[i] = -2e-4 + 3e-8 * x[i];
            }
            xm_fit_t f;
            assert_int_equal(xm_coll_fit((xm_coll_t)k, p, n, fall, 5, &f), XMESH_SUCCESS);
            double sw = 0, swt = 0;
            for (int i = 0; i < 5; i++)
                sw += 1 / (fall[i] * fall[i]), swt += 1 / fall[i];
            if (!(f.beta == 0) || !rel_close(f.alpha, swt / sw, 1e-12))
                fail_msg("%s p %d falling: alpha %g beta %g, expected %g 0",
                         xm_coll_name((xm_coll_t)k), p, f.alpha, f.beta, swt / sw);
            assert_int_equal(xm_coll_fit((xm_coll_t)k, p, n, burst, 5, &f), XMESH_SUCCESS);
            double sxt = 0, sxx = 0;
            for (int i = 0; i < 5; i++) {
                double w = 1 / (burst[i] * burst[i]);
                sxt += w * x[i] * burst[i], sxx += w * x[i] * x[i];
            }
            if (!(f.alpha == 0) || !rel_close(f.beta, sxt / sxx, 1e-12))
                fail_msg("%s p %d burst: alpha %g beta %g, expected 0 %g",
                         xm_coll_name((xm_coll_t)k), p, f.alpha, f.beta, sxt / sxx);
            assert_true(f.r2 <= 1 && isfinite(f.worst_rel) && f.n == 5);
        }
}

static void test_fit_refused(void **state)
{
    (void)state;
    double n[3] = {1024, 2048, 4096}, t[3] = {1e-5, 2e-5, 4e-5};
    xm_fit_t f, before;
    memset(&f, 0x77, sizeof f);
    before = f;
    struct {
        xm_coll_t k;
        int p, npts;
        double n1, t1;
        const char *needle;
    } bad[] = {
        {XM_COLL_ALLREDUCE, 1, 3, 2048, 2e-5, "group size 1"},
        {XM_COLL_NKINDS, 2, 3, 2048, 2e-5, "kind 4"},
        {XM_COLL_ALLGATHER, 4, 1, 2048, 2e-5, "1 point"},
        {XM_COLL_ALLGATHER, 4, 3, 0, 2e-5, "point 1: 0 bytes"},
        {XM_COLL_ALLTOALL, 4, 3, 2048, 0, "point 1: 0 seconds"},
        {XM_COLL_ALLTOALL, 4, 3, 2048, NAN, "point 1: nan seconds"},
        {XM_COLL_REDUCE_SCATTER, 4, 3, INFINITY, 2e-5, "point 1: inf bytes"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        n[1] = bad[i].n1;
        t[1] = bad[i].t1;
        assert_int_equal(xm_coll_fit(bad[i].k, bad[i].p, n, t, bad[i].npts, &f),
                         XMESH_ERR_INVALID_ARGUMENT);
        assert_memory_equal(&f, &before, sizeof f);
        if (!strstr(xmesh_last_error(), bad[i].needle))
            fail_msg("case %zu: '%s' lacks '%s'", i, xmesh_last_error(), bad[i].needle);
    }
    /* every size equal: no slope */
    double same[3] = {4096, 4096, 4096};
    t[1] = 2e-5;
    assert_int_equal(xm_coll_fit(XM_COLL_ALLREDUCE, 2, same, t, 3, &f), XMESH_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(xmesh_last_error(), "slope is undefined"));
    assert_memory_equal(&f, &before, sizeof f);
}

/* ------------------------------------------------------------ file */

static xm_coll_rec_t crec(xm_coll_t k, int p, int rph, int hosts, int share, double alpha,
                          double beta)
{
    xm_coll_rec_t r;
    memset(&r, 0, sizeof r);
    r.kind = k;
    r.g = (xm_coll_geom_t){p, rph, hosts, share};
    r.fit = (xm_fit_t){alpha, beta, 0.987654321, 0.0123456789, 5};
    r.min_bytes = 4096;
    r.max_bytes = 524288;
    return r;
}

static xm_gemm_rec_t grec(int64_t m, int64_t n, int64_t k, int busy, double s, const char *label)
{
    xm_gemm_rec_t g;
    memset(&g, 0, sizeof g);
    g.m = m;
    g.n = n;
    g.k = k;
    g.busy = busy;
    g.seconds = s;
    snprintf(g.label, sizeof g.label, "%s", label);
    return g;
}

/* A model with every kind on one host and across hosts, two shares, and
 * two sgemm shapes plus the fit. */
static xm_costmodel_t *sample(void)
{
    xm_costmodel_t *m = xm_costmodel_create();
    assert_non_null(m);
    for (int k = 0; k < XM_COLL_NKINDS; k++) {
        xm_coll_rec_t r[] = {
            crec((xm_coll_t)k, 2, 2, 1, 1, 3e-6 * (k + 1), 1e-10 * (k + 1)),
            crec((xm_coll_t)k, 4, 1, 4, 1, 40e-6 + k * 1e-6, 8e-9 + k * 1e-10),
            crec((xm_coll_t)k, 4, 1, 4, 2, 45e-6, 1.6e-8),
            crec((xm_coll_t)k, 8, 2, 4, 1, -7e-6, 9e-9),
        };
        for (size_t i = 0; i < sizeof r / sizeof *r; i++)
            assert_int_equal(xm_costmodel_add_coll(m, &r[i]), XMESH_SUCCESS);
    }
    xm_gemm_rec_t g1 = grec(1024, 2304, 768, 2, 0.0125, "gpt-qkv");
    xm_gemm_rec_t g2 = grec(16, 1024, 72, 2, 2.5e-5, "conv3x3-32x32-8to16");
    assert_int_equal(xm_costmodel_add_gemm(m, &g1), XMESH_SUCCESS);
    assert_int_equal(xm_costmodel_add_gemm(m, &g2), XMESH_SUCCESS);
    m->has_gemm_fit = 1;
    m->gemm_fit = (xm_fit_t){1.5e-6, 3.3e-12, 0.999, 0.25, 2};
    return m;
}

static char *write_text(const xm_costmodel_t *m, const char *prefix)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    fputs(prefix, f);
    assert_int_equal(xm_costmodel_write(m, f), XMESH_SUCCESS);
    fclose(f);
    return buf;
}

static void test_round_trip(void **state)
{
    (void)state;
    xm_costmodel_t *m = sample();
    char *text = write_text(m, "# calibrated\nnic_gbps = 0.3\nlatency_us = 12\nintra_gbps = 40\n");
    xm_costmodel_t *b = NULL;
    if (xm_costmodel_parse(text, &b))
        fail_msg("%s\n%s", xmesh_last_error(), text);
    assert_int_equal(b->ncoll, m->ncoll);
    assert_int_equal(b->ngemm, m->ngemm);
    for (int i = 0; i < m->ncoll; i++) {
        const xm_coll_rec_t *x = &m->coll[i], *y = &b->coll[i];
        assert_int_equal(x->kind, y->kind);
        assert_memory_equal(&x->g, &y->g, sizeof x->g);
        assert_close(y->fit.alpha, x->fit.alpha, 1e-9);
        assert_close(y->fit.beta, x->fit.beta, 1e-9);
        assert_close(y->fit.r2, x->fit.r2, 1e-9);
        assert_close(y->fit.worst_rel, x->fit.worst_rel, 1e-9);
        assert_int_equal(y->fit.n, x->fit.n);
        assert_true(y->min_bytes == x->min_bytes && y->max_bytes == x->max_bytes);
        assert_true(y->line > 0);
    }
    for (int i = 0; i < m->ngemm; i++) {
        const xm_gemm_rec_t *x = &m->gemm[i], *y = &b->gemm[i];
        assert_true(x->m == y->m && x->n == y->n && x->k == y->k && x->busy == y->busy);
        assert_close(y->seconds, x->seconds, 1e-9);
        assert_string_equal(y->label, x->label);
    }
    assert_true(b->has_gemm_fit);
    assert_close(b->gemm_fit.alpha, m->gemm_fit.alpha, 1e-9);
    assert_close(b->gemm_fit.beta, m->gemm_fit.beta, 1e-9);
    assert_close(b->gemm_fit.r2, m->gemm_fit.r2, 1e-9);
    assert_int_equal(b->gemm_fit.n, 2);
    /* the plans' reader takes the base keys of the same file and checks the sections */
    static int host_of[4] = {0, 0, 1, 1};
    xm_hostmap_t hm = {.ndev = 4, .nhosts = 2, .host_of = host_of};
    xm_cluster_t c;
    assert_int_equal(xm_cluster_init(&c, &hm), XMESH_SUCCESS);
    assert_int_equal(xm_cluster_parse(text, &c), XMESH_SUCCESS);
    assert_true(c.nic_send_Bps == 0.3e9 / 8 && c.intra_Bps == 40e9 / 8);
    assert_close(c.latency_s, 12e-6, 1e-12);
    /* ... and written again, the same text */
    char *again = write_text(b, "# calibrated\nnic_gbps = 0.3\nlatency_us = 12\nintra_gbps = 40\n");
    assert_string_equal(again, text);
    xm_cluster_free(&c);
    free(again);
    free(text);
    xm_costmodel_destroy(b);
    xm_costmodel_destroy(m);
}

/* A file from before sections loads with no records, and predictions say
 * "not calibrated"; sections of a later version are skipped by both
 * readers; "[cluster]" returns to the base keys. */
static void test_old_and_newer_files(void **state)
{
    (void)state;
    const char *old = "# cluster file written by xmesh-calibrate\nnic_gbps = 0.3\n"
                      "latency_us = 0\n\n\nintra_gbps = 10.5\n";
    xm_costmodel_t *m = NULL;
    assert_int_equal(xm_costmodel_parse(old, &m), XMESH_SUCCESS);
    assert_int_equal(m->ncoll, 0);
    assert_int_equal(m->ngemm, 0);
    xm_cost_pred_t p;
    xm_coll_geom_t g = {4, 1, 4, 1};
    assert_int_equal(xm_cost_collective(m, XM_COLL_ALLREDUCE, &g, 1e6, &p), XMESH_ERR_UNSUPPORTED);
    assert_non_null(strstr(xmesh_last_error(), "not calibrated"));
    assert_non_null(strstr(xmesh_last_error(), "allreduce"));
    assert_int_equal(xm_cost_gemm(m, 64, 64, 64, &p), XMESH_ERR_UNSUPPORTED);
    assert_non_null(strstr(xmesh_last_error(), "not calibrated"));
    xm_costmodel_destroy(m);

    const char *newer = "nic_gbps = 1\n"
                        "[topology-v3]\n"
                        "switch 0 { ports = 48 }   # anything at all\n"
                        "[collectives]\n"
                        "allgather 2 1 2 1 10 2.5 0.99 0.01 4 1024 65536\n"
                        "[cluster]\n"
                        "latency_us = 7\n";
    assert_int_equal(xm_costmodel_parse(newer, &m), XMESH_SUCCESS);
    assert_int_equal(m->ncoll, 1);
    assert_int_equal(m->coll[0].line, 5);
    static int host_of[2] = {0, 1};
    xm_hostmap_t hm = {.ndev = 2, .nhosts = 2, .host_of = host_of};
    xm_cluster_t c;
    assert_int_equal(xm_cluster_init(&c, &hm), XMESH_SUCCESS);
    assert_int_equal(xm_cluster_parse(newer, &c), XMESH_SUCCESS);
    assert_true(c.nic_send_Bps == 1e9 / 8);
    assert_close(c.latency_s, 7e-6, 1e-12);
    xm_cluster_free(&c);
    xm_costmodel_destroy(m);
}

static void expect_bad(const char *text, const char *needle)
{
    xm_costmodel_t *m = (xm_costmodel_t *)(uintptr_t)0x1234;
    assert_int_equal(xm_costmodel_parse(text, &m), XMESH_ERR_INVALID_ARGUMENT);
    assert_true(m == (xm_costmodel_t *)(uintptr_t)0x1234);
    if (!strstr(xmesh_last_error(), needle))
        fail_msg("costmodel: message '%s' lacks '%s'", xmesh_last_error(), needle);
    /* the plans' reader refuses the same file, the cluster untouched */
    static int host_of[2] = {0, 1};
    xm_hostmap_t hm = {.ndev = 2, .nhosts = 2, .host_of = host_of};
    xm_cluster_t c, before;
    assert_int_equal(xm_cluster_init(&c, &hm), XMESH_SUCCESS);
    before = c;
    assert_int_equal(xm_cluster_parse(text, &c), XMESH_ERR_INVALID_ARGUMENT);
    assert_memory_equal(&c, &before, sizeof c);
    if (!strstr(xmesh_last_error(), needle))
        fail_msg("cluster: message '%s' lacks '%s'", xmesh_last_error(), needle);
    xm_cluster_free(&c);
}

static void test_malformed(void **state)
{
    (void)state;
    const char *H = "nic_gbps = 1\n[collectives]\n";
    char t[512];
#define BAD(body, needle)                                                                          \
    do {                                                                                           \
        snprintf(t, sizeof t, "%s%s", H, body);                                                    \
        expect_bad(t, needle);                                                                     \
    } while (0)
    BAD("allreduce 2 2 1 1 10 2.5 0.99 0.01 4 1024\n",
        "line 3: allreduce record has 11 fields, expected 12: kind p ranks_per_host");
    BAD("allreduce 2 2 1 1 10 2.5 0.99 0.01 4 1024 65536 9\n", "has 13 fields, expected 12");
    BAD("allreduse 2 2 1 1 10 2.5 0.99 0.01 4 1024 65536\n",
        "line 3: [collectives] field kind: unknown collective 'allreduse'");
    BAD("allreduce 2 2 1 1 fast 2.5 0.99 0.01 4 1024 65536\n",
        "line 3: allreduce field alpha_us: 'fast' is not a finite number");
    BAD("allreduce 2 2 1 1 10 nan 0.99 0.01 4 1024 65536\n",
        "field beta_ns_per_byte: 'nan' is not a finite number");
    BAD("\n# comment\nalltoall 2.5 2 1 1 10 2 0.99 0.01 4 1024 65536\n",
        "line 5: alltoall field p: '2.5' is not a whole number");
    BAD("allgather 4 2 1 1 10 2 0.99 0.01 4 1024 65536\n",
        "line 3: p 4 != ranks_per_host 2 * hosts 1");
    BAD("allgather 2 2 1 0 10 2 0.99 0.01 4 1024 65536\n", "line 3: field share must be >= 1");
    BAD("allgather 1 1 1 1 10 2 0.99 0.01 4 1024 65536\n",
        "line 3: field p: 1, a fit needs p >= 2");
    BAD("allgather 2 2 1 1 10 2 1.5 0.01 4 1024 65536\n", "line 3: field r2: 1.5");
    BAD("allgather 2 2 1 1 10 2 0.9 -1 4 1024 65536\n", "line 3: field worst_rel: -1");
    BAD("allgather 2 2 1 1 10 2 0.9 0.1 1 1024 65536\n", "line 3: field points: 1");
    BAD("allgather 2 2 1 1 10 2 0.9 0.1 4 4096 1024\n", "line 3: fields min_bytes 4096, max_bytes "
                                                        "1024");
    BAD("allgather 2 2 1 1 10 2 0.9 0.1 4 1024 4096\nallgather 2 2 1 1 11 2 0.9 0.1 4 1024 4096\n",
        "line 4: allgather p 2 ranks_per_host 2 hosts 1 share 1 repeats line 3");
    BAD("[compute]\nsgemm 64 64 64 2 0.001\n", "line 4: sgemm record has 6 fields, expected 7");
    BAD("[compute]\nsgemm 64 -1 64 2 0.001 x\n", "line 4: sgemm field n: '-1' is not a whole");
    BAD("[compute]\nsgemm 64 0 64 2 0.001 x\n", "line 4: field n must be >= 1");
    BAD("[compute]\nsgemm 64 64 64 2 0 x\n", "line 4: field seconds: 0");
    BAD("[compute]\nsgemm 64 64 64 0 1 x\n", "line 4: field busy: 0");
    BAD("[compute]\nsgemm 64 64 64 1 1 "
        "a-label-that-is-far-too-long-for-the-forty-eight-limit\n",
        "line 4: sgemm field label");
    BAD("[compute]\ndgemm 64 64 64 1 1 x\n", "line 4: [compute] unknown record 'dgemm'");
    BAD("[compute]\nsgemm_fit 1 2 3 0.1 4\n", "line 4: sgemm_fit field r2 (> 1) out of range");
    BAD("[compute]\nsgemm_fit 1 2 0.5 0.1 4\nsgemm_fit 1 2 0.5 0.1 4\n",
        "line 5: a second sgemm_fit record");
    BAD("[Collectives]\n", "line 3: section name in '[Collectives]' has the character 'C'");
    BAD("[collectives\n", "line 3: '[collectives' is not a section header");
    BAD("[]\n", "line 3: '[]' is not a section header");
    /* base keys are still checked, before and after sections */
    expect_bad("nic_gbps = 1\n[collectives]\n[cluster]\nnic_gpbs = 3\n",
               "line 4: unknown key 'nic_gpbs'");
#undef BAD
}

/* ------------------------------------------------------------ predictions */

static void test_predict_collective(void **state)
{
    (void)state;
    xm_costmodel_t *m = sample();
    xm_cost_pred_t p;
    /* exact geometry, inside the range: alpha + beta f */
    xm_coll_geom_t g = {4, 1, 4, 1};
    assert_int_equal(xm_cost_collective(m, XM_COLL_ALLREDUCE, &g, 65536, &p), XMESH_SUCCESS);
    assert_close(p.seconds, 40e-6 + 8e-9 * 2 * 3.0 / 4 * 65536, 1e-12);
    assert_true(p.exact);
    /* the same outside the measured range: same formula, not exact */
    assert_int_equal(xm_cost_collective(m, XM_COLL_ALLREDUCE, &g, 1 << 24, &p), XMESH_SUCCESS);
    assert_close(p.seconds, 40e-6 + 8e-9 * 2 * 3.0 / 4 * (1 << 24), 1e-12);
    assert_false(p.exact);
    assert_non_null(strstr(p.basis, "outside the measured range"));
    /* share 2 measured: used as is */
    g.share = 2;
    assert_int_equal(xm_cost_collective(m, XM_COLL_ALLGATHER, &g, 65536, &p), XMESH_SUCCESS);
    assert_close(p.seconds, 45e-6 + 1.6e-8 * 3.0 / 4 * 65536, 1e-12);
    /* share 4 not measured: nearest (share 2), beta x 4/2 */
    g.share = 4;
    assert_int_equal(xm_cost_collective(m, XM_COLL_ALLGATHER, &g, 65536, &p), XMESH_SUCCESS);
    assert_close(p.seconds, 45e-6 + 2 * 1.6e-8 * 3.0 / 4 * 65536, 1e-12);
    assert_false(p.exact);
    assert_non_null(strstr(p.basis, "nearest"));
    /* p 16 across 16 hosts alone: nearest is p 4 ranks_per_host 1 (same
     * ranks_per_host, p distance 2) over p 8 ranks_per_host 2 (p distance
     * 1 but ranks_per_host differs); alpha x 15/3 */
    xm_coll_geom_t g16 = {16, 1, 16, 1};
    assert_int_equal(xm_cost_collective(m, XM_COLL_ALLTOALL, &g16, 1e6, &p), XMESH_SUCCESS);
    assert_close(p.seconds, (43e-6) * 15 / 3 + (8.3e-9) * 15.0 / 16 * 1e6, 1e-12);
    /* two ranks per host over 16 hosts: the ranks_per_host 2 record, alpha
     * 0 (negative), beta 9e-9, f = 31/32 n */
    xm_coll_geom_t g32 = {32, 2, 16, 1};
    assert_int_equal(xm_cost_collective(m, XM_COLL_ALLTOALL, &g32, 1e6, &p), XMESH_SUCCESS);
    assert_close(p.seconds, 9e-9 * 31.0 / 32 * 1e6, 1e-12);
    assert_non_null(strstr(p.basis, "p 8 ranks_per_host 2"));
    /* an uneven group (3 ranks on one host, 1 on another): ranks_per_host 3
     * is nearest the ranks_per_host 2 record (|log2 1.5| < |log2 3|) */
    xm_coll_geom_t gu = {4, 3, 2, 1};
    assert_int_equal(xm_cost_collective(m, XM_COLL_ALLTOALL, &gu, 1e6, &p), XMESH_SUCCESS);
    assert_close(p.seconds, 9e-9 * 3.0 / 4 * 1e6, 1e-12);
    assert_false(p.exact);
    /* negative fitted alpha counts as 0 */
    xm_coll_geom_t g8 = {8, 2, 4, 1};
    assert_int_equal(xm_cost_collective(m, XM_COLL_REDUCE_SCATTER, &g8, 8192, &p), XMESH_SUCCESS);
    assert_close(p.seconds, 9e-9 * 7.0 / 8 * 8192, 1e-12);
    assert_non_null(strstr(p.basis, "negative alpha taken as 0"));
    /* inside one host: p 4 from p 2, alpha x 6/2 for allreduce, beta unscaled */
    xm_coll_geom_t gi = {4, 4, 1, 1};
    assert_int_equal(xm_cost_collective(m, XM_COLL_ALLREDUCE, &gi, 4096, &p), XMESH_SUCCESS);
    assert_close(p.seconds, 3e-6 * 3 + 1e-10 * 2 * 3.0 / 4 * 4096, 1e-12);
    /* one rank: nothing to do */
    xm_coll_geom_t g1 = {1, 1, 1, 1};
    assert_int_equal(xm_cost_collective(m, XM_COLL_ALLREDUCE, &g1, 4096, &p), XMESH_SUCCESS);
    assert_true(p.seconds == 0 && p.exact);
    /* bad input named, *out untouched */
    xm_cost_pred_t before;
    memset(&p, 0x55, sizeof p);
    before = p;
    xm_coll_geom_t gb = {9, 4, 2, 1};
    assert_int_equal(xm_cost_collective(m, XM_COLL_ALLREDUCE, &gb, 4096, &p),
                     XMESH_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(xmesh_last_error(), "p 9 ranks cannot span 2 hosts with at most 4"));
    gb = (xm_coll_geom_t){4, 4, 2, 1};
    assert_int_equal(xm_cost_collective(m, XM_COLL_ALLREDUCE, &gb, 4096, &p),
                     XMESH_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(xmesh_last_error(), "p 4 ranks cannot span 2 hosts"));
    assert_int_equal(xm_cost_collective(m, XM_COLL_ALLREDUCE, &g, -1, &p),
                     XMESH_ERR_INVALID_ARGUMENT);
    assert_int_equal(xm_cost_collective(m, XM_COLL_NKINDS, &g, 1, &p), XMESH_ERR_INVALID_ARGUMENT);
    assert_memory_equal(&p, &before, sizeof p);
    xm_costmodel_destroy(m);

    /* only records with beta <= 0 across hosts: not usable, said so */
    xm_costmodel_t *z = xm_costmodel_create();
    xm_coll_rec_t r = crec(XM_COLL_ALLREDUCE, 2, 1, 2, 1, 1e-5, -1e-9);
    assert_int_equal(xm_costmodel_add_coll(z, &r), XMESH_SUCCESS);
    xm_coll_geom_t g2 = {2, 1, 2, 1};
    assert_int_equal(xm_cost_collective(z, XM_COLL_ALLREDUCE, &g2, 4096, &p),
                     XMESH_ERR_UNSUPPORTED);
    assert_non_null(strstr(xmesh_last_error(), "not calibrated: the cluster file has no usable"));
    /* and one host only asked across hosts */
    r = crec(XM_COLL_ALLREDUCE, 2, 2, 1, 1, 1e-5, 1e-9);
    assert_int_equal(xm_costmodel_add_coll(z, &r), XMESH_SUCCESS);
    assert_int_equal(xm_cost_collective(z, XM_COLL_ALLGATHER, &g2, 4096, &p),
                     XMESH_ERR_UNSUPPORTED);
    assert_non_null(strstr(xmesh_last_error(), "no allgather fit for groups spanning several"));
    assert_memory_equal(&p, &before, sizeof p);
    xm_costmodel_destroy(z);
}

static void test_predict_gemm(void **state)
{
    (void)state;
    xm_costmodel_t *m = sample();
    xm_cost_pred_t p;
    assert_int_equal(xm_cost_gemm(m, 1024, 2304, 768, &p), XMESH_SUCCESS);
    assert_true(p.seconds == 0.0125 && p.exact);
    assert_non_null(strstr(p.basis, "gpt-qkv"));
    /* nearest shape's flop rate: 1024 x 3072 x 768 is 4/3 of gpt-qkv's flops */
    assert_int_equal(xm_cost_gemm(m, 1024, 3072, 768, &p), XMESH_SUCCESS);
    assert_close(p.seconds, 0.0125 * 4 / 3, 1e-12);
    assert_false(p.exact);
    /* a small conv shape is nearer the conv record */
    assert_int_equal(xm_cost_gemm(m, 32, 1024, 144, &p), XMESH_SUCCESS);
    assert_close(p.seconds, 2.5e-5 * 4, 1e-12);
    assert_non_null(strstr(p.basis, "conv3x3"));
    /* the same shape at more busy ranks wins */
    xm_gemm_rec_t g = grec(1024, 2304, 768, 4, 0.02, "gpt-qkv");
    assert_int_equal(xm_costmodel_add_gemm(m, &g), XMESH_SUCCESS);
    assert_int_equal(xm_cost_gemm(m, 1024, 2304, 768, &p), XMESH_SUCCESS);
    assert_true(p.seconds == 0.02);
    assert_int_equal(xm_costmodel_add_gemm(m, &g), XMESH_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(xmesh_last_error(), "repeats"));
    assert_int_equal(xm_cost_gemm(m, 0, 5, 5, &p), XMESH_SUCCESS);
    assert_true(p.seconds == 0);
    assert_int_equal(xm_cost_gemm(m, -1, 5, 5, &p), XMESH_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(xmesh_last_error(), "m -1"));
    xm_costmodel_destroy(m);
}

/* The nominal (uncalibrated) model: the cluster's rates with the same
 * formulas, labelled, never exact, never written. */
static void test_nominal(void **state)
{
    (void)state;
    static int host_of[4] = {0, 0, 1, 1};
    xm_hostmap_t hm = {.ndev = 4, .nhosts = 2, .host_of = host_of};
    xm_cluster_t c;
    assert_int_equal(xm_cluster_init(&c, &hm), XMESH_SUCCESS);
    c.nic_send_Bps = 1.25e9;
    c.nic_recv_Bps = 2.5e9;
    c.intra_Bps = 10e9;
    c.latency_s = 5e-6;
    xm_costmodel_t *m = NULL;
    assert_int_equal(xm_costmodel_nominal(&c, 1e11, &m), XMESH_SUCCESS);
    assert_true(m->nominal);
    xm_cost_pred_t p;
    /* all-reduce over 8 hosts sharing the NIC 2 ways: 14 latencies, the slower direction / 2 */
    xm_coll_geom_t g = {8, 1, 8, 2};
    assert_int_equal(xm_cost_collective(m, XM_COLL_ALLREDUCE, &g, 8e6, &p), XMESH_SUCCESS);
    assert_close(p.seconds, 14 * 5e-6 + 2 * 2 * 7.0 / 8 * 8e6 / 1.25e9, 1e-12);
    assert_false(p.exact);
    assert_non_null(strstr(p.basis, "nominal (uncalibrated)"));
    /* inside a host, exact geometry of the record: still not exact */
    xm_coll_geom_t gi = {2, 2, 1, 1};
    assert_int_equal(xm_cost_collective(m, XM_COLL_ALLGATHER, &gi, 1e6, &p), XMESH_SUCCESS);
    assert_close(p.seconds, 5e-6 + 0.5 * 1e6 / 10e9, 1e-12);
    assert_false(p.exact);
    assert_int_equal(xm_cost_gemm(m, 1024, 1024, 1024, &p), XMESH_SUCCESS);
    assert_close(p.seconds, 2.0 * 1024 * 1024 * 1024 / 1e11, 1e-12);
    assert_non_null(strstr(p.basis, "nominal (uncalibrated)"));
    FILE *f = tmpfile();
    assert_non_null(f);
    assert_int_equal(xm_costmodel_write(m, f), XMESH_ERR_INVALID_USAGE);
    fclose(f);
    xm_costmodel_destroy(m);
    /* no flop rate: sgemm not calibrated */
    assert_int_equal(xm_costmodel_nominal(&c, 0, &m), XMESH_SUCCESS);
    assert_int_equal(xm_cost_gemm(m, 8, 8, 8, &p), XMESH_ERR_UNSUPPORTED);
    xm_costmodel_destroy(m);
    xm_costmodel_t *keep = (xm_costmodel_t *)(uintptr_t)0x99;
    c.intra_Bps = 0;
    assert_int_equal(xm_costmodel_nominal(&c, 1e9, &keep), XMESH_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(xmesh_last_error(), "intra 0 B/s"));
    assert_true(keep == (xm_costmodel_t *)(uintptr_t)0x99);
    xm_cluster_free(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_volume),          cmocka_unit_test(test_fit_exact),
        cmocka_unit_test(test_fit_noisy),       cmocka_unit_test(test_fit_weighted_hand),
        cmocka_unit_test(test_coll_fit_nonneg), cmocka_unit_test(test_fit_refused),
        cmocka_unit_test(test_round_trip),      cmocka_unit_test(test_old_and_newer_files),
        cmocka_unit_test(test_malformed),       cmocka_unit_test(test_predict_collective),
        cmocka_unit_test(test_predict_gemm),    cmocka_unit_test(test_nominal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
