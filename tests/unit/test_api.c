/* The generic API layer over an in-process test backend (a unit-test double
 * for the transport, never used outside this test): argument checks, error
 * messages, lifetimes, and that rejected calls leave outputs untouched. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "xm_api.h"

typedef struct {
    xmesh_plan_t plan;
    int done;
} test_req_t;

static int setup_calls, teardown_calls, start_calls;

static xmesh_result_t t_agree(xmesh_ctx_t ctx, xmesh_result_t local, uint64_t hash)
{
    (void)ctx;
    (void)hash;
    return local ? XMESH_ERR_REMOTE : XMESH_SUCCESS;
}
static xmesh_result_t t_setup(xmesh_plan_t p)
{
    (void)p;
    setup_calls++;
    return XMESH_SUCCESS;
}
static void t_teardown(xmesh_plan_t p)
{
    (void)p;
    teardown_calls++;
}
static xmesh_result_t t_start(xmesh_plan_t p, const void *const *s, void *const *d,
                              xmesh_request_t *req)
{
    (void)s;
    (void)d;
    test_req_t *r = calloc(1, sizeof *r);
    r->plan = p;
    p->inflight++;
    start_calls++;
    *req = (xmesh_request_t)r;
    return XMESH_SUCCESS;
}
static xmesh_result_t t_wait(xmesh_request_t req)
{
    test_req_t *r = (test_req_t *)req;
    r->plan->inflight--;
    free(r);
    return XMESH_SUCCESS;
}
static void t_free(xmesh_ctx_t ctx)
{
    (void)ctx;
}
static const xm_backend_ops_t test_ops = {"test", t_agree, t_setup, t_teardown, t_start,
                                          t_wait, t_wait,  t_free,  NULL,       0};

static xmesh_ctx_t make_ctx(int size, int per_host)
{
    xmesh_ctx_t c = calloc(1, sizeof *c);
    c->ops = &test_ops;
    c->rank = 0;
    c->size = size;
    c->hosts.ndev = size;
    c->hosts.host_of = malloc(sizeof(int) * size);
    for (int i = 0; i < size; i++)
        c->hosts.host_of[i] = i / per_host;
    c->hosts.nhosts = (size + per_host - 1) / per_host;
    return c;
}

static void expect_msg(const char *needle)
{
    if (!strstr(xmesh_last_error(), needle))
        fail_msg("message '%s' does not contain '%s'", xmesh_last_error(), needle);
}

/* xmesh_ctx_get_stats: a backend without counters reports zeros; NULL
 * arguments are refused naming them. */
static void test_ctx_stats(void **state)
{
    (void)state;
    xmesh_ctx_t c = make_ctx(4, 2);
    xmesh_ctx_stats_t st;
    memset(&st, 0x5a, sizeof st);
    assert_int_equal(xmesh_ctx_get_stats(c, &st), XMESH_SUCCESS);
    assert_true(st.progress_cpu_s == 0 && st.wait_cpu_s == 0);
    assert_int_equal(st.staged_bytes, 0);
    assert_int_equal(st.rounds, 0);
    assert_int_equal(st.idle_rounds, 0);
    assert_int_equal(xmesh_ctx_get_stats(c, NULL), XMESH_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(xmesh_last_error(), "stats"));
    assert_int_equal(xmesh_ctx_get_stats(NULL, &st), XMESH_ERR_INVALID_ARGUMENT);
    assert_int_equal(xmesh_ctx_destroy(c), XMESH_SUCCESS);
}

static void test_mesh_bad_input(void **state)
{
    (void)state;
    xmesh_ctx_t ctx = make_ctx(8, 4);
    xmesh_mesh_t m = (xmesh_mesh_t)0x1234, keep = m;
    int shape[2] = {2, 2}, dup[4] = {0, 1, 1, 3}, big[4] = {0, 1, 2, 8}, ok[4] = {4, 5, 6, 7};
    assert_int_equal(xmesh_mesh_create(ctx, 2, shape, dup, &m), XMESH_ERR_INVALID_ARGUMENT);
    expect_msg("rank 1 listed twice");
    assert_ptr_equal(m, keep);
    assert_int_equal(xmesh_mesh_create(ctx, 2, shape, big, &m), XMESH_ERR_INVALID_ARGUMENT);
    expect_msg("rank 8");
    assert_int_equal(xmesh_mesh_create(ctx, 5, shape, ok, &m), XMESH_ERR_INVALID_ARGUMENT);
    expect_msg("ndim 5");
    int zero[2] = {2, 0};
    assert_int_equal(xmesh_mesh_create(ctx, 2, zero, ok, &m), XMESH_ERR_INVALID_ARGUMENT);
    expect_msg("shape[1] = 0");
    assert_int_equal(xmesh_mesh_create(NULL, 2, shape, ok, &m), XMESH_ERR_INVALID_ARGUMENT);
    expect_msg("ctx is NULL");
    assert_int_equal(xmesh_mesh_create(ctx, 2, shape, NULL, &m), XMESH_ERR_INVALID_ARGUMENT);
    expect_msg("ranks is NULL");
    assert_ptr_equal(m, keep);
    assert_int_equal(ctx->nmeshes, 0);
    assert_int_equal(xmesh_mesh_create(ctx, 2, shape, ok, &m), XMESH_SUCCESS);
    assert_int_equal(xmesh_ctx_destroy(ctx), XMESH_ERR_INVALID_USAGE);
    expect_msg("1 mesh");
    assert_int_equal(xmesh_mesh_destroy(m), XMESH_SUCCESS);
    assert_int_equal(xmesh_ctx_destroy(ctx), XMESH_SUCCESS);
}

static void test_layout_local_shape(void **state)
{
    (void)state;
    xmesh_ctx_t ctx = make_ctx(8, 4);
    int shape[2] = {2, 3}, ranks[6] = {0, 1, 2, 3, 4, 5};
    xmesh_mesh_t m;
    assert_int_equal(xmesh_mesh_create(ctx, 2, shape, ranks, &m), XMESH_SUCCESS);
    int64_t tshape[2] = {7, 5};
    xmesh_layout_t l = {2, tshape, XMESH_F32, m, "S1,S0"};
    int64_t got[2], off[2];
    int holds = -1;
    /* rank 4: coordinate (1, 1): dim 0 split 3 ways (3,2,2) -> [3,5); dim 1 split 2 -> [3,5) */
    assert_int_equal(xmesh_layout_local_shape(&l, 4, got, &holds), XMESH_SUCCESS);
    assert_int_equal(holds, 1);
    assert_int_equal(got[0], 2);
    assert_int_equal(got[1], 2);
    assert_int_equal(xmesh_layout_local_offset(&l, 4, off, &holds), XMESH_SUCCESS);
    assert_int_equal(off[0], 3);
    assert_int_equal(off[1], 3);
    assert_int_equal(xmesh_layout_local_shape(&l, 7, got, &holds), XMESH_SUCCESS);
    assert_int_equal(holds, 0);
    l.sharding = "S0,S0";
    got[0] = 99;
    assert_int_equal(xmesh_layout_local_shape(&l, 4, got, &holds), XMESH_ERR_INVALID_ARGUMENT);
    expect_msg("mesh axis 0 used twice");
    assert_int_equal(got[0], 99);
    l.sharding = "S1,S0";
    l.dtype = (xmesh_dtype_t)42;
    assert_int_equal(xmesh_layout_local_shape(&l, 4, got, &holds), XMESH_ERR_INVALID_ARGUMENT);
    expect_msg("unknown dtype 42");
    /* 2^32 x 2^32 f32 elements: 2^66 bytes, refused naming the shape */
    l.dtype = XMESH_F32;
    int64_t huge[2] = {(int64_t)1 << 32, (int64_t)1 << 32};
    l.shape = huge;
    got[0] = 99;
    assert_int_equal(xmesh_layout_local_shape(&l, 4, got, &holds), XMESH_ERR_INVALID_ARGUMENT);
    expect_msg("shape [4294967296, 4294967296] of 4-byte elements");
    assert_int_equal(got[0], 99);
    /* torch.chunk split: dim 0, 7 over 3 -> 3, 3, 1, so rank 4 (coordinate
     * (1, 1)) holds rows [3, 6); dim 1, 5 over 2 -> 3, 2: [3, 5) */
    l.shape = tshape;
    l.split = XMESH_SPLIT_TORCH;
    assert_int_equal(xmesh_layout_local_shape(&l, 4, got, &holds), XMESH_SUCCESS);
    assert_int_equal(got[0], 3);
    assert_int_equal(got[1], 2);
    assert_int_equal(xmesh_layout_local_offset(&l, 5, off, &holds), XMESH_SUCCESS);
    assert_int_equal(off[0], 6); /* rank 5: (1, 2): the last row */
    assert_int_equal(xmesh_layout_local_shape(&l, 5, got, &holds), XMESH_SUCCESS);
    assert_int_equal(got[0], 1);
    /* an unknown rule is refused by name, nothing written */
    l.split = 7;
    got[0] = 99;
    assert_int_equal(xmesh_layout_local_shape(&l, 4, got, &holds), XMESH_ERR_INVALID_ARGUMENT);
    expect_msg("split 7 is neither XMESH_SPLIT_NUMPY (0) nor XMESH_SPLIT_TORCH (1)");
    assert_int_equal(got[0], 99);
    xmesh_mesh_destroy(m);
    xmesh_ctx_destroy(ctx);
}

static void test_plan_lifecycle(void **state)
{
    (void)state;
    xmesh_ctx_t ctx = make_ctx(16, 4);
    int shape[2] = {2, 4}, a[8], b[8];
    for (int i = 0; i < 8; i++) {
        a[i] = i;
        b[i] = 8 + i;
    }
    xmesh_mesh_t ma, mb;
    assert_int_equal(xmesh_mesh_create(ctx, 2, shape, a, &ma), XMESH_SUCCESS);
    assert_int_equal(xmesh_mesh_create(ctx, 2, shape, b, &mb), XMESH_SUCCESS);
    int64_t t[3] = {64, 64, 8};
    xmesh_layout_t src = {3, t, XMESH_I32, ma, "RS01R"}, dst = {3, t, XMESH_I32, mb, "S01RR"};
    xmesh_plan_t plan = (xmesh_plan_t)0x77, keep = plan;
    /* bad params: no initializer */
    xmesh_plan_params_t bad;
    memset(&bad, 0, sizeof bad);
    assert_int_equal(xmesh_plan_create(ctx, &src, &dst, &bad, &plan), XMESH_ERR_INVALID_ARGUMENT);
    expect_msg("magic");
    xmesh_plan_params_t pp = XMESH_PLAN_PARAMS_INITIALIZER;
    pp.chunk_bytes = 0;
    assert_int_equal(xmesh_plan_create(ctx, &src, &dst, &pp, &plan), XMESH_ERR_INVALID_ARGUMENT);
    expect_msg("chunk_bytes 0");
    dst.dtype = XMESH_F32;
    assert_int_equal(xmesh_plan_create(ctx, &src, &dst, NULL, &plan), XMESH_ERR_INVALID_ARGUMENT);
    expect_msg("source dtype i32 != destination dtype f32");
    dst.dtype = XMESH_I32;
    dst.sharding = "S01S0R";
    assert_int_equal(xmesh_plan_create(ctx, &src, &dst, NULL, &plan), XMESH_ERR_INVALID_ARGUMENT);
    expect_msg("S01S0R");
    assert_ptr_equal(plan, keep);
    assert_int_equal(setup_calls, 0);
    dst.sharding = "S01RR";
    src.split = -1;
    assert_int_equal(xmesh_plan_create(ctx, &src, &dst, NULL, &plan), XMESH_ERR_INVALID_ARGUMENT);
    expect_msg("source layout: split -1 is neither");
    assert_ptr_equal(plan, keep);
    src.split = XMESH_SPLIT_NUMPY;
    pp.chunk_bytes = 4096;
    pp.scheduler = XMESH_SCHEDULER_NAIVE;
    assert_int_equal(xmesh_plan_create(ctx, &src, &dst, &pp, &plan), XMESH_SUCCESS);
    xmesh_plan_info_t info;
    assert_int_equal(xmesh_plan_get_info(plan, &info), XMESH_SUCCESS);
    assert_int_equal(info.unit_tasks, 64);
    assert_int_equal(info.bytes_total, 64 * 64 * 8 * 4);
    assert_int_equal(info.chunk_bytes, 4096);
    assert_true(info.predicted_s >= info.lower_bound_s);
    assert_true(info.lower_bound_s > 0);
    /* meshes and ctx are pinned by the plan */
    assert_int_equal(xmesh_mesh_destroy(ma), XMESH_ERR_INVALID_USAGE);
    assert_int_equal(xmesh_ctx_destroy(ctx), XMESH_ERR_INVALID_USAGE);
    /* rank 0 holds a source block: a NULL source is refused before the backend sees it */
    xmesh_request_t req;
    int buf[8];
    assert_int_equal(xmesh_reshard_start(plan, NULL, NULL, &req), XMESH_ERR_INVALID_ARGUMENT);
    expect_msg("src_local is NULL but rank 0 holds a source block");
    assert_int_equal(xmesh_reshard_start(plan, buf, buf, &req), XMESH_ERR_INVALID_ARGUMENT);
    assert_int_equal(start_calls, 0);
    assert_int_equal(xmesh_reshard_start(plan, buf, NULL, &req), XMESH_SUCCESS);
    assert_int_equal(xmesh_plan_destroy(plan), XMESH_ERR_INVALID_USAGE);
    expect_msg("in flight");
    assert_int_equal(xmesh_wait(req), XMESH_SUCCESS);
    assert_int_equal(xmesh_plan_destroy(plan), XMESH_SUCCESS);
    assert_int_equal(teardown_calls, 1);
    assert_int_equal(xmesh_mesh_destroy(ma), XMESH_SUCCESS);
    assert_int_equal(xmesh_mesh_destroy(mb), XMESH_SUCCESS);
    assert_int_equal(xmesh_ctx_destroy(ctx), XMESH_SUCCESS);
}

/* Converting plans: f32 <-> f16 <-> bf16 are accepted and the info counts
 * the narrower dtype's bytes crossing hosts; other pairs are refused naming
 * both dtypes, before the backend sees anything. */
static void test_plan_dtypes(void **state)
{
    (void)state;
    xmesh_ctx_t ctx = make_ctx(16, 4);
    int shape[2] = {2, 4}, a[8], b[8];
    for (int i = 0; i < 8; i++) {
        a[i] = i;
        b[i] = 8 + i;
    }
    xmesh_mesh_t ma, mb;
    assert_int_equal(xmesh_mesh_create(ctx, 2, shape, a, &ma), XMESH_SUCCESS);
    assert_int_equal(xmesh_mesh_create(ctx, 2, shape, b, &mb), XMESH_SUCCESS);
    int64_t t[3] = {64, 64, 8};
    xmesh_layout_t src = {3, t, XMESH_F32, ma, "RS01R"}, dst = {3, t, XMESH_F32, mb, "S01RR"};
    xmesh_plan_t plan = NULL;
    xmesh_plan_info_t same, info;
    assert_int_equal(xmesh_plan_create(ctx, &src, &dst, NULL, &plan), XMESH_SUCCESS);
    assert_int_equal(xmesh_plan_get_info(plan, &same), XMESH_SUCCESS);
    assert_int_equal(xmesh_plan_destroy(plan), XMESH_SUCCESS);
    assert_true(same.bytes_cross_host > 0);
    static const struct {
        xmesh_dtype_t s, d;
        int64_t wire;
    } ok[] = {{XMESH_F32, XMESH_BF16, 2}, {XMESH_BF16, XMESH_F32, 2}, {XMESH_F32, XMESH_F16, 2},
              {XMESH_F16, XMESH_F32, 2},  {XMESH_F16, XMESH_BF16, 2}, {XMESH_BF16, XMESH_F16, 2}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        src.dtype = ok[i].s;
        dst.dtype = ok[i].d;
        plan = NULL;
        assert_int_equal(xmesh_plan_create(ctx, &src, &dst, NULL, &plan), XMESH_SUCCESS);
        assert_int_equal(xmesh_plan_get_info(plan, &info), XMESH_SUCCESS);
        assert_int_equal(info.bytes_cross_host, same.bytes_cross_host / 4 * ok[i].wire);
        assert_int_equal(info.bytes_total,
                         same.bytes_total / 4 * (int64_t)xmesh_dtype_size(ok[i].s));
        assert_int_equal(xmesh_plan_destroy(plan), XMESH_SUCCESS);
    }
    static const xmesh_dtype_t bad[][2] = {
        {XMESH_I32, XMESH_F32}, {XMESH_F64, XMESH_F32}, {XMESH_F16, XMESH_I8}};
    int calls = setup_calls;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        src.dtype = bad[i][0];
        dst.dtype = bad[i][1];
        plan = (xmesh_plan_t)0x77;
        assert_int_equal(xmesh_plan_create(ctx, &src, &dst, NULL, &plan),
                         XMESH_ERR_INVALID_ARGUMENT);
        char want[64];
        snprintf(want, sizeof want, "source dtype %s != destination dtype %s",
                 xmesh_dtype_name(bad[i][0]), xmesh_dtype_name(bad[i][1]));
        expect_msg(want);
        assert_ptr_equal(plan, (xmesh_plan_t)0x77);
    }
    assert_int_equal(setup_calls, calls);
    assert_int_equal(xmesh_mesh_destroy(ma), XMESH_SUCCESS);
    assert_int_equal(xmesh_mesh_destroy(mb), XMESH_SUCCESS);
    assert_int_equal(xmesh_ctx_destroy(ctx), XMESH_SUCCESS);
}

/* A message that wraps the previous last error (XM_ERR(r, "ctx: %s",
 * xmesh_last_error()), as plan creation does for a refused XMESH_STRATEGY or
 * XMESH_SCHEDULER) keeps that message whole after its prefix: the buffer is
 * both the destination and an argument of the formatting. */
static void expect_wrapped(const char *prefix, const char *inner)
{
    char want[1024];
    snprintf(want, sizeof want, "%s%s", prefix, inner);
    if (strcmp(xmesh_last_error(), want))
        fail_msg("message '%s', expected '%s'", xmesh_last_error(), want);
}

static void test_error_wraps_last_error(void **state)
{
    (void)state;
    /* directly: a prefix, then the whole previous message; one that fills
     * the buffer is cut at 1023 bytes, not smeared */
    xmesh_strategy_t st;
    assert_int_equal(xmesh_strategy_parse("bogus-strategy", &st), XMESH_ERR_INVALID_ARGUMENT);
    char inner[1024];
    snprintf(inner, sizeof inner, "%s", xmesh_last_error());
    assert_true(strlen(inner) > 8);
    assert_int_equal(XM_ERR(XMESH_ERR_INTERNAL, "outer: %s", xmesh_last_error()),
                     XMESH_ERR_INTERNAL);
    expect_wrapped("outer: ", inner);
    char longmsg[1100];
    memset(longmsg, 'a', sizeof longmsg - 1);
    longmsg[sizeof longmsg - 1] = '\0';
    for (int i = 0; i < 26; i++)
        longmsg[i * 40] = (char)('A' + i);
    XM_ERR(XMESH_ERR_INTERNAL, "%s", longmsg);
    assert_int_equal(strlen(xmesh_last_error()), 1023);
    XM_ERR(XMESH_ERR_INTERNAL, "%.5s|%s", xmesh_last_error(), xmesh_last_error());
    char want[1024];
    memcpy(want, longmsg, 5);
    want[5] = '|';
    memcpy(want + 6, longmsg, sizeof want - 7);
    want[sizeof want - 1] = '\0';
    assert_string_equal(xmesh_last_error(), want);

    /* through plan creation: a bad XMESH_STRATEGY / XMESH_SCHEDULER */
    xmesh_ctx_t ctx = make_ctx(8, 4);
    int shape[1] = {4}, a[4] = {0, 1, 2, 3}, b[4] = {4, 5, 6, 7};
    xmesh_mesh_t ma, mb;
    assert_int_equal(xmesh_mesh_create(ctx, 1, shape, a, &ma), XMESH_SUCCESS);
    assert_int_equal(xmesh_mesh_create(ctx, 1, shape, b, &mb), XMESH_SUCCESS);
    int64_t t[1] = {64};
    xmesh_layout_t src = {1, t, XMESH_F32, ma, "S0"}, dst = {1, t, XMESH_F32, mb, "R"};
    xmesh_plan_t plan = (xmesh_plan_t)0x77;
    int calls = setup_calls;
    setenv("XMESH_STRATEGY", "bogus-strategy", 1);
    xm_param_reset();
    assert_int_equal(xmesh_plan_create(ctx, &src, &dst, NULL, &plan), XMESH_ERR_INVALID_ARGUMENT);
    expect_wrapped("XMESH_STRATEGY: ", inner);
    unsetenv("XMESH_STRATEGY");
    xmesh_scheduler_t sc;
    assert_int_equal(xmesh_scheduler_parse("bogus-scheduler", &sc), XMESH_ERR_INVALID_ARGUMENT);
    snprintf(inner, sizeof inner, "%s", xmesh_last_error());
    setenv("XMESH_SCHEDULER", "bogus-scheduler", 1);
    xm_param_reset();
    assert_int_equal(xmesh_plan_create(ctx, &src, &dst, NULL, &plan), XMESH_ERR_INVALID_ARGUMENT);
    expect_wrapped("XMESH_SCHEDULER: ", inner);
    unsetenv("XMESH_SCHEDULER");
    xm_param_reset();
    assert_ptr_equal(plan, (xmesh_plan_t)0x77);
    assert_int_equal(setup_calls, calls);
    assert_int_equal(xmesh_mesh_destroy(ma), XMESH_SUCCESS);
    assert_int_equal(xmesh_mesh_destroy(mb), XMESH_SUCCESS);
    assert_int_equal(xmesh_ctx_destroy(ctx), XMESH_SUCCESS);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ctx_stats),          cmocka_unit_test(test_mesh_bad_input),
        cmocka_unit_test(test_layout_local_shape), cmocka_unit_test(test_plan_lifecycle),
        cmocka_unit_test(test_plan_dtypes),        cmocka_unit_test(test_error_wraps_last_error),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
