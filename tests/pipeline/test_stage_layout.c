/* Stage layouts: explicit strings, even splits, meshes, and bad input. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "models/stage_layout.h"

static const char *gpt6 = "EttttttL"; /* GPT-2 with 6 blocks */

static void test_explicit(void **state)
{
    (void)state;
    xmp_stage_layout_t l;
    char err[256], back[128];
    assert_int_equal(
        xmp_stage_layout_build(gpt6, 1, 1, "E,t*3|t*3,L", 0, NULL, NULL, NULL, &l, err, sizeof err),
        0);
    assert_int_equal(l.nstages, 2);
    assert_int_equal(l.first[1], 4);
    assert_int_equal(l.count[0], 4);
    assert_int_equal(l.count[1], 4);
    assert_int_equal(l.stage_of[0], 0);
    assert_int_equal(l.stage_of[7], 1);
    xmp_stage_layout_format(&l, back, sizeof back);
    assert_string_equal(back, "E,t*3|t*3,L");
}

static void test_even(void **state)
{
    (void)state;
    xmp_stage_layout_t l;
    char err[256], back[128];
    /* 6 blocks over 4 stages: 2,2,1,1 blocks, E on the first, L on the last. */
    assert_int_equal(
        xmp_stage_layout_build(gpt6, 1, 1, NULL, 4, NULL, NULL, NULL, &l, err, sizeof err), 0);
    xmp_stage_layout_format(&l, back, sizeof back);
    assert_string_equal(back, "E,t*2|t*2|t|t,L");
    /* U-Transformer style: 13 layers, nothing fixed, 3 stages: 5,4,4. */
    assert_int_equal(xmp_stage_layout_build("uuuuuuuuuuuuu", 0, 0, NULL, 3, NULL, NULL, NULL, &l,
                                            err, sizeof err),
                     0);
    assert_int_equal(l.count[0], 5);
    assert_int_equal(l.count[1], 4);
    assert_int_equal(l.count[2], 4);
}

static void test_meshes(void **state)
{
    (void)state;
    xmp_stage_layout_t l;
    char err[256];
    assert_int_equal(
        xmp_stage_layout_build(gpt6, 1, 1, NULL, 2, "2x1,1x2", "2,1", "1,2", &l, err, sizeof err),
        0);
    assert_int_equal(l.dp[0], 2);
    assert_int_equal(l.tp[1], 2);
    assert_int_equal(l.rank0[1], 2);
    assert_int_equal(l.nranks, 4);
    assert_int_equal(xmp_stage_layout_stage_of_rank(&l, 3), 1);
    assert_int_equal(xmp_stage_layout_stage_of_rank(&l, 4), -1);
    /* Meshes alone give the degrees. */
    assert_int_equal(
        xmp_stage_layout_build(gpt6, 1, 1, NULL, 3, "2x2,1x1,1x2", NULL, NULL, &l, err, sizeof err),
        0);
    assert_int_equal(l.nranks, 7);
    assert_int_equal(l.tp[2], 2);
    /* One value for every stage. */
    assert_int_equal(
        xmp_stage_layout_build(gpt6, 1, 1, NULL, 3, NULL, "2", NULL, &l, err, sizeof err), 0);
    assert_int_equal(l.nranks, 6);
}

static void test_nd_meshes(void **state)
{
    (void)state;
    xmp_stage_layout_t l;
    char err[256], back[128];
    /* Any axis count per stage: 3, 2, 1 and 4 axes. */
    assert_int_equal(xmp_stage_layout_build(gpt6, 1, 1, NULL, 4, "2x2x2,1x4,3,1x2x1x2", NULL, NULL,
                                            &l, err, sizeof err),
                     0);
    int nd[4] = {3, 2, 1, 4}, sz[4] = {8, 4, 3, 4}, r0[4] = {0, 8, 12, 15};
    for (int s = 0; s < 4; s++) {
        assert_int_equal(l.ndim[s], nd[s]);
        assert_int_equal(xmp_stage_layout_size(&l, s), sz[s]);
        assert_int_equal(l.rank0[s], r0[s]);
    }
    assert_int_equal(l.shape[0][2], 2);
    assert_int_equal(l.shape[3][3], 2);
    assert_int_equal(l.shape[3][1], 2);
    assert_int_equal(l.nranks, 19);
    /* dp/tp: 2 axes as before; otherwise last axis and the rest; 1 axis: dp = size. */
    assert_int_equal(l.dp[1], 1);
    assert_int_equal(l.tp[1], 4);
    assert_int_equal(l.dp[0], 4);
    assert_int_equal(l.tp[0], 2);
    assert_int_equal(l.dp[2], 3);
    assert_int_equal(l.tp[2], 1);
    assert_int_equal(xmp_stage_layout_stage_of_rank(&l, 7), 0);
    assert_int_equal(xmp_stage_layout_stage_of_rank(&l, 8), 1);
    assert_int_equal(xmp_stage_layout_stage_of_rank(&l, 14), 2);
    assert_int_equal(xmp_stage_layout_stage_of_rank(&l, 18), 3);
    assert_int_equal(xmp_stage_layout_stage_of_rank(&l, 19), -1);
    xmp_stage_layout_format_meshes(&l, back, sizeof back);
    assert_string_equal(back, "2x2x2,1x4,3,1x2x1x2");
    /* The shorthands give 2-axis meshes. */
    assert_int_equal(
        xmp_stage_layout_build(gpt6, 1, 1, NULL, 2, NULL, "2,1", "1,2", &l, err, sizeof err), 0);
    assert_int_equal(l.ndim[0], 2);
    assert_int_equal(l.shape[0][0], 2);
    assert_int_equal(l.shape[1][1], 2);
    xmp_stage_layout_format_meshes(&l, back, sizeof back);
    assert_string_equal(back, "2x1,1x2");
    assert_int_equal(
        xmp_stage_layout_build(gpt6, 1, 1, NULL, 1, "4", "4", NULL, &l, err, sizeof err), 0);
    assert_int_equal(l.ndim[0], 2); /* "R" with --stage-dp is R x 1 as before */
    assert_int_equal(l.shape[0][1], 1);
}

static void expect_error(const char *layout, int stages, const char *meshes, const char *dps,
                         const char *tps, const char *needle)
{
    xmp_stage_layout_t l, before;
    memset(&l, 0x5a, sizeof l);
    before = l;
    char err[256] = "";
    assert_int_equal(
        xmp_stage_layout_build(gpt6, 1, 1, layout, stages, meshes, dps, tps, &l, err, sizeof err),
        -1);
    if (!strstr(err, needle))
        fail_msg("error '%s' does not name '%s'", err, needle);
    assert_memory_equal(&l, &before, sizeof l); /* unchanged */
}

static void test_errors(void **state)
{
    (void)state;
    expect_error("E,t*3|t*2,L", 0, NULL, NULL, NULL, "layer 6");
    expect_error("E,t*3|t*3", 0, NULL, NULL, NULL, "names 7 layers");
    expect_error("E,t*3|t*3,L,L", 0, NULL, NULL, NULL, "more layers");
    expect_error("t*3,E|t*3,L", 0, NULL, NULL, NULL, "layer 0");
    expect_error("E,t*3||t*3,L", 0, NULL, NULL, NULL, "empty");
    expect_error("E,t*x|t*3,L", 0, NULL, NULL, NULL, "repeat");
    expect_error(NULL, 7, NULL, NULL, NULL, "--stages 7");
    expect_error(NULL, 2, "2x1,1x2", "1,1", "1,2", "stage 0 mesh 2x1");
    expect_error(NULL, 2, NULL, "2,1,1", NULL, "2,1,1");
    expect_error(NULL, 2, "2x1", NULL, NULL, "fewer meshes");
    expect_error("E,t*3|t*3,L", 3, NULL, NULL, NULL, "--stages 3");
    expect_error(NULL, 2, "2x2x2x2x2,1", NULL, NULL, "stage 0: expected a mesh AxB.. of 1 to 4");
    expect_error(NULL, 2, "2x2,1x0", NULL, NULL, "stage 1: expected a mesh");
    expect_error(NULL, 2, "2x2,2x", NULL, NULL, "stage 1: expected a mesh");
    expect_error(NULL, 2, "2x2,2,2", NULL, NULL, "more meshes than the 2 stages");
    expect_error(NULL, 1, "2x2x2", "2", NULL, "stage 0: expected RxC");
    expect_error(NULL, 1, "1024x1024x2", NULL, NULL, "too large");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_explicit), cmocka_unit_test(test_even),
        cmocka_unit_test(test_meshes),   cmocka_unit_test(test_nd_meshes),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
