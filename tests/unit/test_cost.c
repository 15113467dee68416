/* Cost models (scheduler/xm_cost.h): the least-squares fit on exact and
 * noisy synthetic data, its errors, and the strategy models on instances
 * small enough to time by hand. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "xm_cost.h"

static void test_fit_exact(void **state)
{
    (void)state;
    double x[8], y[8];
    for (int i = 0; i < 8; i++) {
        x[i] = 4096.0 * (1 << i);
        y[i] = 35e-6 + x[i] * 2.7e-8;
    }
    xm_fit_t f;
    assert_int_equal(xm_fit_linear(x, y, 8, &f), XMESH_SUCCESS);
    assert_int_equal(f.n, 8);
    assert_true(fabs(f.alpha - 35e-6) < 1e-12);
    assert_true(fabs(f.beta - 2.7e-8) / 2.7e-8 < 1e-9);
    assert_true(f.r2 > 1 - 1e-12);
    assert_true(f.worst_rel < 1e-9);
}

/* Hand-computed: x = 0,1,2, y = 0,2,1: beta 0.5, alpha 0.5, SSE 1.5,
 * SST 2, R^2 0.25, residuals 0.5/2 and 0.5/1 relative. */
static void test_fit_hand(void **state)
{
    (void)state;
    const double x[3] = {0, 1, 2}, y[3] = {0, 2, 1};
    xm_fit_t f;
    assert_int_equal(xm_fit_linear(x, y, 3, &f), XMESH_SUCCESS);
    assert_true(fabs(f.beta - 0.5) < 1e-12);
    assert_true(fabs(f.alpha - 0.5) < 1e-12);
    assert_true(fabs(f.r2 - 0.25) < 1e-12);
    assert_true(fabs(f.worst_rel - 0.5) < 1e-12);
}

/* Multiplicative noise of at most 3%: the fit stays close and reports it. */
static void test_fit_noisy(void **state)
{
    (void)state;
    uint64_t seed = 0x5eed1234u;
    printf("test_fit_noisy: seed %llu\n", (unsigned long long)seed);
    uint64_t s = seed;
    for (int rep = 0; rep < 50; rep++) {
        double x[12], y[12], maxn = 0;
        for (int i = 0; i < 12; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            double u = (double)(s >> 11) / 9007199254740992.0; /* [0, 1) */
            double noise = (u - 0.5) * 0.06;
            if (fabs(noise) > maxn)
                maxn = fabs(noise);
            x[i] = 65536.0 * pow(2, i / 1.5);
            y[i] = (50e-6 + x[i] * 2.7e-8) * (1 + noise);
        }
        xm_fit_t f;
        assert_int_equal(xm_fit_linear(x, y, 12, &f), XMESH_SUCCESS);
        assert_true(fabs(f.beta - 2.7e-8) / 2.7e-8 < 0.05);
        assert_true(f.r2 > 0.99 && f.r2 <= 1);
        /* worst_rel is the largest relative residual, recomputed here */
        double w = 0;
        for (int i = 0; i < 12; i++) {
            double e = fabs(f.alpha + f.beta * x[i] - y[i]) / y[i];
            w = e > w ? e : w;
        }
        assert_true(w > 0 && fabs(f.worst_rel - w) < 1e-12);
        assert_true(maxn > 0.01); /* the noise was there */
    }
}

static void test_fit_errors(void **state)
{
    (void)state;
    double x[3] = {1, 1, 1}, y[3] = {1, 2, 3};
    xm_fit_t f = {42, 42, 42, 42, 42};
    assert_int_equal(xm_fit_linear(x, y, 3, &f), XMESH_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(xmesh_last_error(), "all 3 x values equal"));
    assert_int_equal(xm_fit_linear(x, y, 1, &f), XMESH_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(xmesh_last_error(), "1 point(s)"));
    x[1] = 2;
    y[2] = NAN;
    assert_int_equal(xm_fit_linear(x, y, 3, &f), XMESH_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(xmesh_last_error(), "point 2"));
    assert_int_equal(xm_fit_linear(NULL, y, 3, &f), XMESH_ERR_INVALID_ARGUMENT);
    assert_int_equal(xm_fit_linear(x, y, 3, NULL), XMESH_ERR_INVALID_ARGUMENT);
    assert_true(f.alpha == 42 && f.beta == 42 && f.r2 == 42 && f.n == 42); /* untouched */
}

/* Weighted sum of squared residuals of the line (alpha, beta). */
static double sse_of(const double *x, const double *y, const double *w, int n, double alpha,
                     double beta)
{
    double s = 0;
    for (int i = 0; i < n; i++) {
        double e = alpha + beta * x[i] - y[i];
        s += (w ? w[i] : 1) * e * e;
    }
    return s;
}

/* Exact lines with a negative coefficient, by hand. y = 2x - 1 at x = 1..5: alpha = 0, beta =
 * sum xy / sum x^2 = 2 - 15/55 = 19/11 (residuals 8, 5, 2, -1, -4 over 11: SSE 10/11, against
 * 40 for the flat line at the mean 5; R^2 1 - (10/11)/40, worst 8/11 at y = 1). y = 10 - x at
 * x = 1..4: beta = 0, alpha = the mean 7.5 (SSE 5 = SST: R^2 0; worst 1.5/6), against SSE
 * 66.7 for the line through 0. y = -1 - x: both 0. */
static void test_fit_nonneg_hand(void **state)
{
    (void)state;
    const double x[5] = {1, 2, 3, 4, 5}, y1[5] = {1, 3, 5, 7, 9}, y2[4] = {9, 8, 7, 6},
                 y3[3] = {-2, -3, -4};
    xm_fit_t f;
    assert_int_equal(xm_fit_linear(x, y1, 5, &f), XMESH_SUCCESS);
    assert_true(f.alpha == 0);
    assert_true(fabs(f.beta - 19.0 / 11) < 1e-12);
    assert_true(fabs(f.r2 - (1 - 1.0 / 44)) < 1e-12);
    assert_true(fabs(f.worst_rel - 8.0 / 11) < 1e-12);
    assert_int_equal(f.n, 5);
    assert_int_equal(xm_fit_linear(x, y2, 4, &f), XMESH_SUCCESS);
    assert_true(f.beta == 0);
    assert_true(fabs(f.alpha - 7.5) < 1e-12);
    assert_true(fabs(f.r2) < 1e-12);
    assert_true(fabs(f.worst_rel - 0.25) < 1e-12);
    assert_int_equal(xm_fit_linear(x, y3, 3, &f), XMESH_SUCCESS);
    assert_true(f.alpha == 0 && f.beta == 0);
    /* the weighted fit the same way: y = 2x - 1 with w = 1 / y^2 */
    double w[5];
    for (int i = 0; i < 5; i++)
        w[i] = 1 / (y1[i] * y1[i]);
    assert_int_equal(xm_fit_weighted(x, y1, w, 5, &f), XMESH_SUCCESS);
    double sxy = 0, sxx = 0;
    for (int i = 0; i < 5; i++)
        sxy += w[i] * x[i] * y1[i], sxx += w[i] * x[i] * x[i];
    assert_true(f.alpha == 0);
    assert_true(fabs(f.beta - sxy / sxx) < 1e-12);
}

/* Random points of every shape (rising, falling, noisy, negative intercepts and slopes,
 * weighted or not): the fit is never negative, equals the free least squares when that is
 * non-negative, and no non-negative line on a fine grid around it does better. Seeded. */
static void test_fit_nonneg_random(void **state)
{
    (void)state;
    uint64_t s = 0x0dd5eedull;
    printf("test_fit_nonneg_random: seed %llu\n", (unsigned long long)s);
    int constrained = 0, free_fits = 0;
    for (int rep = 0; rep < 400; rep++) {
        double x[9], y[9], w[9];
        int n = 3 + rep % 7, weighted = rep % 2;
        double u[4];
        for (int k = 0; k < 4; k++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            u[k] = (double)(s >> 11) / 9007199254740992.0; /* [0, 1) */
        }
        double alpha = (u[0] - 0.4) * 2e-3, beta = (u[1] - 0.3) * 1e-8, noise = u[2] * 0.5;
        for (int i = 0; i < n; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            double v = (double)(s >> 11) / 9007199254740992.0 - 0.5;
            x[i] = 4096.0 * (1 << i);
            y[i] = alpha + beta * x[i] + noise * 1e-3 * v;
            w[i] = weighted ? 1 / (1e-6 + y[i] * y[i]) : 1;
        }
        const double *wp = weighted ? w : NULL;
        xm_fit_t f;
        assert_int_equal(xm_fit_weighted(x, y, wp, n, &f), XMESH_SUCCESS);
        if (!(f.alpha >= 0 && f.beta >= 0))
            fail_msg("rep %d: alpha %g beta %g", rep, f.alpha, f.beta);
        /* the free optimum, by the normal equations */
        double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
        for (int i = 0; i < n; i++) {
            double wi = wp ? w[i] : 1;
            sw += wi, sx += wi * x[i], sy += wi * y[i];
        }
        for (int i = 0; i < n; i++) {
            double wi = wp ? w[i] : 1;
            sxx += wi * (x[i] - sx / sw) * (x[i] - sx / sw);
            sxy += wi * (x[i] - sx / sw) * (y[i] - sy / sw);
        }
        double fb = sxy / sxx, fa = sy / sw - fb * sx / sw;
        double got = sse_of(x, y, wp, n, f.alpha, f.beta);
        if (fa >= 0 && fb >= 0) {
            free_fits++;
            if (fabs(f.alpha - fa) > 1e-9 * (fabs(fa) + 1e-6) || fabs(f.beta - fb) > 1e-9 * fb)
                fail_msg("rep %d: free fit (%g, %g), got (%g, %g)", rep, fa, fb, f.alpha, f.beta);
            continue;
        }
        constrained++;
        /* grid over alpha in [0, 2 max|y|], beta in [0, 2 max|y| / min x] */
        double ymax = 0;
        for (int i = 0; i < n; i++)
            ymax = fabs(y[i]) > ymax ? fabs(y[i]) : ymax;
        for (int a = 0; a <= 200; a++)
            for (int b = 0; b <= 200; b++) {
                double ga = 2 * ymax * a / 200, gb = 2 * ymax / x[0] * b / 200;
                double g = sse_of(x, y, wp, n, ga, gb);
                if (g < got * (1 - 1e-9) - 1e-30)
                    fail_msg("rep %d: fit (%g, %g) SSE %g, but (%g, %g) has %g", rep, f.alpha,
                             f.beta, got, ga, gb, g);
            }
    }
    /* both branches were exercised */
    assert_true(constrained > 50 && free_fits > 50);
}

/* One task of 1e6 bytes held by device 0, received by rcv[0..1]; NICs and
 * the intra-host link at 1e9 B/s, no latency, one chunk. */
typedef struct {
    int host_of[6];
    xm_cluster_t c;
    xm_task_t task;
    int holders[1], recvs[2];
    xm_taskset_t ts;
} inst_t;

static void inst_make(inst_t *in, int ndev, const int *hosts, int r0, int r1)
{
    memset(in, 0, sizeof *in);
    memcpy(in->host_of, hosts, sizeof(int) * ndev);
    xm_hostmap_t hm = {ndev, hosts[ndev - 1] + 1, in->host_of};
    assert_int_equal(xm_cluster_init(&in->c, &hm), XMESH_SUCCESS);
    in->c.nic_send_Bps = in->c.nic_recv_Bps = in->c.intra_Bps = 1e9;
    in->c.latency_s = 0;
    in->c.chunk_bytes = 1 << 22;
    in->holders[0] = 0;
    in->recvs[0] = r0;
    in->recvs[1] = r1;
    in->task.bytes = 1000000;
    in->task.ngroups = in->task.group_size = 1;
    in->task.nrecv = 2;
    in->ts.ntasks = 1;
    in->ts.tasks = &in->task;
    in->ts.holders = in->holders;
    in->ts.recvs = in->recvs;
}

static void test_mpi_models(void **state)
{
    (void)state;
    inst_t in;
    const int hosts[4] = {0, 0, 1, 1};
    inst_make(&in, 4, hosts, 2, 3);
    int sender[1] = {0};
    /* alltoallv: host 0's send direction carries both copies: 2 ms */
    assert_true(fabs(xm_cost_mpi(&in.ts, &in.c, sender, XM_COST_MPI_ALLTOALLV) - 2e-3) < 1e-9);
    /* Alpa: two half slices over the NIC (1 ms), then each receiver sends
     * its half to the other over the intra link (0.5 ms) */
    assert_true(fabs(xm_cost_mpi(&in.ts, &in.c, sender, XM_COST_MPI_SENDRECV_ALLGATHER) - 1.5e-3) <
                1e-9);
    /* bcast: 0 -> leader 2 (1 ms), then 2 -> 3 inside host 1 (1 ms) */
    assert_true(fabs(xm_cost_mpi(&in.ts, &in.c, sender, XM_COST_MPI_BCAST) - 2e-3) < 1e-9);
    /* latency: one per message level */
    in.c.latency_s = 1e-5;
    assert_true(fabs(xm_cost_mpi(&in.ts, &in.c, sender, XM_COST_MPI_BCAST) - 2.02e-3) < 1e-9);
    /* bad sender */
    sender[0] = 9;
    assert_true(isnan(xm_cost_mpi(&in.ts, &in.c, sender, XM_COST_MPI_ALLTOALLV)));
    xm_cluster_free(&in.c);
}

static void test_allgather_model(void **state)
{
    (void)state;
    inst_t in;
    const int hosts[6] = {0, 0, 1, 1, 2, 2};
    inst_make(&in, 6, hosts, 2, 4); /* one receiver on each of hosts 1 and 2 */
    int order[1] = {0}, snd[1] = {0};
    xm_schedule_t s;
    memset(&s, 0, sizeof s);
    s.ntasks = 1;
    s.order = order;
    s.sender = snd;
    s.max_groups = 1;
    /* per host: groups of one receiver: two full copies leave host 0: 2 ms */
    assert_true(fabs(xm_cost_allgather(&in.ts, &in.c, &s, 1) - 2e-3) < 1e-9);
    /* global: halves to each (1 MB out of host 0: 1 ms), the ring swap of the
     * halves (0.5 ms chains) overlaps within the NIC bound: stages 0.5 + 0.5 */
    assert_true(fabs(xm_cost_allgather(&in.ts, &in.c, &s, 0) - 1e-3) < 1e-9);
    /* two receivers on one host: same as the per-host variant */
    in.recvs[1] = 3;
    double ph = xm_cost_allgather(&in.ts, &in.c, &s, 1),
           gl = xm_cost_allgather(&in.ts, &in.c, &s, 0);
    assert_true(fabs(ph - 1e-3) < 1e-9 && fabs(gl - 1e-3) < 1e-9);
    /* an order entry out of range */
    order[0] = 3;
    assert_true(isnan(xm_cost_allgather(&in.ts, &in.c, &s, 1)));
    xm_cluster_free(&in.c);
}

/* The chain model's fill (xm_hop_fill, xm_cost_chain): chain 0 -> 2 -> 4 ->
 * 6 over hosts 0..3 (three NIC hops), K = 8 chunks of c = 125000 bytes at
 * 1e9 B/s (c / bw = 125 us), no latency. The head keeps send_ahead = 2
 * chunks on its wire; the two forwarders are paced by their input and keep
 * forward_ahead = 1: 2 + 1 + 1 chunk times of fill, then K - 2 more at the
 * slowest hop: (4 + 6) * 125 us. With forward_ahead 2 (every hop 2):
 * (6 + 6) * 125 us. */
static void test_chain_fill(void **state)
{
    (void)state;
    inst_t in;
    const int hosts[6] = {0, 0, 1, 1, 2, 2};
    inst_make(&in, 6, hosts, 2, 4);
    int host8[8] = {0, 0, 1, 1, 2, 2, 3, 3};
    free(in.c.hosts.host_of);
    in.c.hosts.host_of = malloc(sizeof host8);
    memcpy(in.c.hosts.host_of, host8, sizeof host8);
    in.c.hosts.ndev = 8;
    in.c.hosts.nhosts = 4;
    in.c.chunk_bytes = 125000;
    in.c.send_ahead = 2;
    in.c.forward_ahead = 1;
    assert_int_equal(xm_hop_fill(&in.c, 8, 0, 1), 2);
    assert_int_equal(xm_hop_fill(&in.c, 8, 1, 1), 1);
    assert_int_equal(xm_hop_fill(&in.c, 8, 1, 0), 2); /* intra hop: send_ahead */
    assert_int_equal(xm_hop_fill(&in.c, 1, 0, 1), 1); /* at most K */
    const int chain[4] = {0, 2, 4, 6};
    double t = xm_cost_chain(&in.c, chain, 4, 1000000);
    assert_true(fabs(t - 10 * 125e-6) < 1e-12);
    in.c.forward_ahead = 2;
    t = xm_cost_chain(&in.c, chain, 4, 1000000);
    assert_true(fabs(t - 12 * 125e-6) < 1e-12);
    /* an intra hop in the middle (2 -> 3 inside host 1) does not reset the
     * pacing: 4 -> 6 is still a forwarder (fill 1); the intra hop costs
     * 2 chunks at the intra rate (1e10 B/s: 25 us) */
    in.c.forward_ahead = 1;
    in.c.intra_Bps = 1e10;
    const int chain2[5] = {0, 2, 3, 4, 6};
    t = xm_cost_chain(&in.c, chain2, 5, 1000000);
    assert_true(fabs(t - (10 * 125e-6 + 25e-6)) < 1e-12);
    /* synchronous chunks (XMESH_SYNC_SEND): a hop between hosts fills with
     * one chunk whatever is in flight (they leave whole and in order), so 4
     * sends in flight cost 3 fills + 7 paced chunks = 10 chunk times on the
     * chain 0 -> 2 -> 4 -> 6; rendezvous chunks with 4 in flight share the
     * wire: 4 + 4 + 4 + (8 - 4) = 16 */
    in.c.intra_Bps = 1e9;
    in.c.send_ahead = 4;
    in.c.forward_ahead = 4;
    in.c.sync_send = 1;
    assert_int_equal(xm_hop_fill(&in.c, 8, 0, 1), 1);
    assert_int_equal(xm_hop_fill(&in.c, 8, 1, 1), 1);
    assert_int_equal(xm_hop_fill(&in.c, 8, 1, 0), 4); /* intra hop: not synchronous */
    t = xm_cost_chain(&in.c, chain, 4, 1000000);
    assert_true(fabs(t - 10 * 125e-6) < 1e-12);
    in.c.sync_send = 0;
    t = xm_cost_chain(&in.c, chain, 4, 1000000);
    assert_true(fabs(t - 16 * 125e-6) < 1e-12);
    xm_cluster_free(&in.c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fit_exact),         cmocka_unit_test(test_fit_hand),
        cmocka_unit_test(test_fit_noisy),         cmocka_unit_test(test_fit_errors),
        cmocka_unit_test(test_mpi_models),        cmocka_unit_test(test_allgather_model),
        cmocka_unit_test(test_chain_fill),        cmocka_unit_test(test_fit_nonneg_hand),
        cmocka_unit_test(test_fit_nonneg_random),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
