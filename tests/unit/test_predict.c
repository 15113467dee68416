/* xmesh_plan_predict (include/xmesh.h): one boundary priced offline. Hand-timed transfers (one
 * chunk over one NIC, inside a host, or copied on one rank), the model's rates and the
 * XMESH_* model when none is given, determinism with a fixed evaluation budget, and refusals
 * that name the bad field and write nothing. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "xm_core.h"

static const xmesh_cluster_model_t model = {1, 1e9, 1e9, 4e9, 5e-6, 1 << 30, 1};
static const xmesh_predict_opts_t greedy = {XMESH_SCHEDULER_GREEDY, XMESH_STRATEGY_BROADCAST, 1,
                                            2000};

/* n f32 elements on rank src (mesh [1], "R") to rank dst (mesh [1], "R"); ranks 0..3, two per
 * host. */
static xmesh_placement_problem_t one_to_one(const int64_t *n, const int *src, const int *dst)
{
    static const int one[1] = {1}, hosts[4] = {0, 0, 1, 1};
    xmesh_placement_problem_t pb = {1, n, XMESH_F32, 1, one, src, "R", 1, one, dst, "R", 4, hosts};
    return pb;
}

static void expect_msg(const char *needle)
{
    if (!strstr(xmesh_last_error(), needle))
        fail_msg("message '%s' does not contain '%s'", xmesh_last_error(), needle);
}

static void test_hand_timed(void **state)
{
    (void)state;
    int64_t n[1] = {1 << 20}; /* 4 MiB, one chunk */
    int r0[1] = {0}, r1[1] = {1}, r2[1] = {2};
    xmesh_prediction_t p;
    /* across hosts: latency + bytes / NIC rate */
    xmesh_placement_problem_t pb = one_to_one(n, r0, r2);
    assert_int_equal(xmesh_plan_predict(&pb, &model, &greedy, &p), XMESH_SUCCESS);
    double want = 5e-6 + 4.0 * (1 << 20) / 1e9;
    if (fabs(p.predicted_s - want) > 1e-9 * want)
        fail_msg("across hosts: %.9g s, expected %.9g", p.predicted_s, want);
    assert_int_equal(p.bytes_total, 4 << 20);
    assert_int_equal(p.bytes_cross_host, 4 << 20);
    assert_true(p.lower_bound_s <= p.predicted_s * (1 + 1e-12) && p.lower_bound_s > 0);
    /* twice the NIC rate (and no latency): half the time */
    xmesh_cluster_model_t fast = model;
    fast.latency_s = 0;
    xmesh_prediction_t a, b;
    assert_int_equal(xmesh_plan_predict(&pb, &fast, &greedy, &a), XMESH_SUCCESS);
    fast.nic_send_Bps = fast.nic_recv_Bps = 2e9;
    assert_int_equal(xmesh_plan_predict(&pb, &fast, &greedy, &b), XMESH_SUCCESS);
    assert_true(fabs(a.predicted_s - 2 * b.predicted_s) < 1e-12 * a.predicted_s);
    /* inside a host: the intra-host rate, nothing crosses */
    pb = one_to_one(n, r0, r1);
    assert_int_equal(xmesh_plan_predict(&pb, &model, &greedy, &p), XMESH_SUCCESS);
    want = 5e-6 + 4.0 * (1 << 20) / 4e9;
    if (fabs(p.predicted_s - want) > 1e-9 * want)
        fail_msg("inside a host: %.9g s, expected %.9g", p.predicted_s, want);
    assert_int_equal(p.bytes_cross_host, 0);
    /* the same rank on both sides: a local copy between its buffers, at the same rate */
    pb = one_to_one(n, r2, r2);
    assert_int_equal(xmesh_plan_predict(&pb, &model, &greedy, &p), XMESH_SUCCESS);
    if (fabs(p.predicted_s - want) > 1e-9 * want)
        fail_msg("local copy: %.9g s, expected %.9g", p.predicted_s, want);
    assert_int_equal(p.bytes_cross_host, 0);
}

/* A 2x2 -> 2x2 resharding over two hosts: deterministic with max_evals, never below its bound;
 * without a model the XMESH_* values apply (the same figure as the model spelled out). */
static void test_meshes_and_env(void **state)
{
    (void)state;
    int64_t t[2] = {256, 128};
    int sh[2] = {2, 2}, a[4] = {0, 1, 2, 3}, b[4] = {4, 5, 6, 7},
        hosts[8] = {0, 0, 0, 0, 1, 1, 1, 1};
    xmesh_placement_problem_t pb = {2, t,  XMESH_F32, 2,        sh, a,    "S0S1",
                                    2, sh, b,         "S(1),B", 8,  hosts};
    xmesh_prediction_t p, q;
    assert_int_equal(xmesh_plan_predict(&pb, &model, &greedy, &p), XMESH_SUCCESS);
    assert_int_equal(xmesh_plan_predict(&pb, &model, &greedy, &q), XMESH_SUCCESS);
    assert_true(p.predicted_s == q.predicted_s);
    assert_true(p.predicted_s >= p.lower_bound_s * (1 - 1e-12) && p.lower_bound_s > 0);
    assert_int_equal(p.bytes_total, 256 * 128 * 4);
    /* every destination block comes from the other host */
    assert_true(p.bytes_cross_host >= p.bytes_total);

    setenv("XMESH_NIC_GBPS", "8", 1); /* 1e9 bytes/s */
    setenv("XMESH_INTRA_GBPS", "32", 1);
    setenv("XMESH_LATENCY_US", "5", 1);
    setenv("XMESH_CHUNK_BYTES", "1G", 1);
    setenv("XMESH_SEND_AHEAD", "1", 1);
    setenv("XMESH_FORWARD_AHEAD", "1", 1);
    setenv("XMESH_SYNC_SEND", "0", 1);
    xm_param_reset();
    assert_int_equal(xmesh_plan_predict(&pb, NULL, &greedy, &q), XMESH_SUCCESS);
    if (fabs(q.predicted_s - p.predicted_s) > 1e-12 * p.predicted_s)
        fail_msg("XMESH_* model: %.12g s, the same model given: %.12g s", q.predicted_s,
                 p.predicted_s);
    setenv("XMESH_NIC_GBPS", "16", 1);
    xm_param_reset();
    assert_int_equal(xmesh_plan_predict(&pb, NULL, &greedy, &q), XMESH_SUCCESS);
    assert_true(q.predicted_s < p.predicted_s); /* the environment is what it read */
    static const char *const vars[] = {
        "XMESH_NIC_GBPS",   "XMESH_INTRA_GBPS",    "XMESH_LATENCY_US", "XMESH_CHUNK_BYTES",
        "XMESH_SEND_AHEAD", "XMESH_FORWARD_AHEAD", "XMESH_SYNC_SEND"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
        unsetenv(vars[i]);
    xm_param_reset();
}

static void test_refusals(void **state)
{
    (void)state;
    int64_t n[1] = {1024};
    int r0[1] = {0}, r2[1] = {2}, r9[1] = {9};
    xmesh_placement_problem_t pb = one_to_one(n, r0, r2);
    xmesh_prediction_t p, keep;
    memset(&p, 0x5a, sizeof p);
    keep = p;
    assert_int_equal(xmesh_plan_predict(NULL, &model, &greedy, &p), XMESH_ERR_INVALID_ARGUMENT);
    expect_msg("problem is NULL");
    assert_int_equal(xmesh_plan_predict(&pb, &model, NULL, &p), XMESH_ERR_INVALID_ARGUMENT);
    expect_msg("opts is NULL");
    assert_int_equal(xmesh_plan_predict(&pb, &model, &greedy, NULL), XMESH_ERR_INVALID_ARGUMENT);
    xmesh_cluster_model_t m = model;
    m.intra_Bps = 0;
    assert_int_equal(xmesh_plan_predict(&pb, &m, &greedy, &p), XMESH_ERR_INVALID_ARGUMENT);
    expect_msg("intra_Bps (> 0)");
    m = model;
    m.latency_s = NAN;
    assert_int_equal(xmesh_plan_predict(&pb, &m, &greedy, &p), XMESH_ERR_INVALID_ARGUMENT);
    expect_msg("latency_s (>= 0)");
    m = model;
    m.send_ahead = 0;
    assert_int_equal(xmesh_plan_predict(&pb, &m, &greedy, &p), XMESH_ERR_INVALID_ARGUMENT);
    expect_msg("send_ahead");
    xmesh_predict_opts_t o = greedy;
    o.strategy = XMESH_STRATEGY_GLOBAL_ALLGATHER;
    assert_int_equal(xmesh_plan_predict(&pb, &model, &o, &p), XMESH_ERR_INVALID_ARGUMENT);
    expect_msg("broadcast or sendrecv");
    o = greedy;
    o.scheduler = (xmesh_scheduler_t)42;
    assert_int_equal(xmesh_plan_predict(&pb, &model, &o, &p), XMESH_ERR_INVALID_ARGUMENT);
    expect_msg("scheduler 42 unknown");
    o = greedy;
    o.max_evals = -1;
    assert_int_equal(xmesh_plan_predict(&pb, &model, &o, &p), XMESH_ERR_INVALID_ARGUMENT);
    pb = one_to_one(n, r0, r9);
    assert_int_equal(xmesh_plan_predict(&pb, &model, &greedy, &p), XMESH_ERR_INVALID_ARGUMENT);
    expect_msg("destination rank 9 outside [0, 4)");
    pb = one_to_one(n, r0, r2);
    pb.dst_sharding = "S0S0";
    assert_int_equal(xmesh_plan_predict(&pb, &model, &greedy, &p), XMESH_ERR_INVALID_ARGUMENT);
    expect_msg("S0S0");
    pb.dst_sharding = "R";
    pb.dtype = (xmesh_dtype_t)77;
    assert_int_equal(xmesh_plan_predict(&pb, &model, &greedy, &p), XMESH_ERR_INVALID_ARGUMENT);
    expect_msg("unknown dtype 77");
    assert_memory_equal(&p, &keep, sizeof p); /* nothing written */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hand_timed),
        cmocka_unit_test(test_meshes_and_env),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
