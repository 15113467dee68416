/* Sharding spec parser and printer: both notations, canonical equality,
 * and bad input (clear message naming the token, output untouched). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "test_util.h"
#include "xm_core.h"

static void parse_ok(const char *s, int ndim, int mesh_ndim, xm_spec_t *out)
{
    xmesh_result_t r = xm_spec_parse(s, ndim, mesh_ndim, out);
    if (r)
        fail_msg("'%s' failed: %s", s, xmesh_last_error());
}

static void test_gspmd_basic(void **state)
{
    (void)state;
    xm_spec_t sp;
    parse_ok("S01RR", 3, 2, &sp);
    assert_int_equal(sp.naxes[0], 2);
    assert_int_equal(sp.axes[0][0], 0);
    assert_int_equal(sp.axes[0][1], 1);
    assert_int_equal(sp.naxes[1], 0);
    assert_int_equal(sp.naxes[2], 0);
    assert_int_equal(sp.partial_mask, 0);
    parse_ok("RS1R", 3, 2, &sp);
    assert_int_equal(sp.naxes[1], 1);
    assert_int_equal(sp.axes[1][0], 1);
    parse_ok("S10,R", 2, 2, &sp); /* axis 1 major */
    assert_int_equal(sp.axes[0][0], 1);
    assert_int_equal(sp.axes[0][1], 0);
    parse_ok("", 0, 1, &sp); /* 0-d tensor */
    assert_int_equal(sp.ndim, 0);
    parse_ok("S0123", 1, 4, &sp);
    assert_int_equal(sp.naxes[0], 4);
}

static void test_sbp_basic(void **state)
{
    (void)state;
    xm_spec_t a, b;
    parse_ok("S(0),S(0)", 3, 2, &a);
    parse_ok("S01RR", 3, 2, &b);
    assert_true(xm_spec_equal(&a, &b));
    parse_ok("S(1),B", 2, 2, &a);
    parse_ok("RS0", 2, 2, &b);
    assert_true(xm_spec_equal(&a, &b));
    parse_ok("B,P", 2, 2, &a);
    assert_int_equal(a.partial_mask, 2u);
    assert_int_equal(a.naxes[0] + a.naxes[1], 0);
    parse_ok("S(2), P, S(0)", 3, 3, &a);
    assert_int_equal(a.partial_mask, 2u);
    assert_int_equal(a.axes[2][0], 0);
    assert_int_equal(a.axes[0][0], 2);
    parse_ok("B", 0, 1, &a);
}

/* Every spec printed in both notations parses back to itself. */
static void test_roundtrip(void **state)
{
    (void)state;
    uint64_t seed = xt_seed("spec_roundtrip");
    for (int it = 0; it < 5000; it++) {
        xm_spec_t sp;
        memset(&sp, 0, sizeof sp);
        sp.ndim = xt_range(&seed, 0, XM_MAX_DIMS);
        sp.mesh_ndim = xt_range(&seed, 1, XM_MAX_MESH_DIMS);
        int ascending = xt_range(&seed, 0, 1);
        for (int a = 0; a < sp.mesh_ndim; a++) {
            int what = xt_range(&seed, 0, 2); /* 0: B, 1: S, 2: P */
            if (what == 2) {
                sp.partial_mask |= 1u << a;
            } else if (what == 1 && sp.ndim > 0) {
                int d = xt_range(&seed, 0, sp.ndim - 1);
                if (ascending || sp.naxes[d] == 0)
                    sp.axes[d][sp.naxes[d]++] = a;
                else { /* prepend: non-ascending order */
                    memmove(&sp.axes[d][1], &sp.axes[d][0], sizeof(int) * sp.naxes[d]);
                    sp.axes[d][0] = a;
                    sp.naxes[d]++;
                }
            }
        }
        char buf[128];
        xm_spec_t back;
        int n = xm_spec_format_sbp(&sp, buf, sizeof buf);
        if (n >= 0) {
            parse_ok(buf, sp.ndim, sp.mesh_ndim, &back);
            if (!xm_spec_equal(&sp, &back))
                fail_msg("SBP round trip of '%s' changed the spec (iteration %d)", buf, it);
        }
        if (!sp.partial_mask) {
            assert_true(xm_spec_format_gspmd(&sp, buf, sizeof buf) >= 0);
            parse_ok(buf, sp.ndim, sp.mesh_ndim, &back);
            if (!xm_spec_equal(&sp, &back))
                fail_msg("GSPMD round trip of '%s' changed the spec (iteration %d)", buf, it);
        }
    }
}

static void expect_bad(const char *s, int ndim, int mesh_ndim, const char *needle)
{
    xm_spec_t sp;
    memset(&sp, 0x5a, sizeof sp);
    xm_spec_t before = sp;
    xmesh_result_t r = xm_spec_parse(s, ndim, mesh_ndim, &sp);
    if (r != XMESH_ERR_INVALID_ARGUMENT)
        fail_msg("'%s' (ndim %d, mesh %d) returned %d, expected INVALID_ARGUMENT", s ? s : "NULL",
                 ndim, mesh_ndim, (int)r);
    if (memcmp(&sp, &before, sizeof sp))
        fail_msg("'%s': output changed on error", s);
    if (!strstr(xmesh_last_error(), needle))
        fail_msg("'%s': message '%s' does not name '%s'", s, xmesh_last_error(), needle);
}

static void test_bad_input(void **state)
{
    (void)state;
    expect_bad("S0S0R", 3, 2, "mesh axis 0 used twice");
    expect_bad("S00RR", 3, 2, "mesh axis 0 used twice");
    expect_bad("S2RR", 3, 2, "mesh axis 2 out of range");
    expect_bad("S0R", 3, 2, "2 dim tokens for a 3-d tensor");
    expect_bad("S0RRR", 3, 2, "more than 3 dim tokens");
    expect_bad("SRR", 2, 2, "names no mesh axis");
    expect_bad("S0XR", 3, 2, "unexpected character 'X'");
    expect_bad("S(3),B", 3, 2, "S(3): tensor dim 3 out of range");
    expect_bad("S(0),S(0),B", 3, 2, "more than 2 SBP tokens");
    expect_bad("S(0)", 3, 2, "1 SBP tokens for a 2-d mesh");
    expect_bad("S(x),B", 3, 2, "malformed token");
    expect_bad("S(0)B", 3, 2, "expected ','");
    expect_bad("Q,B", 3, 2, "unexpected character 'Q'");
    expect_bad("S0RR", 9, 2, "tensor ndim 9 out of range");
    expect_bad("S0RR", 3, 5, "mesh ndim 5 out of range");
    expect_bad(NULL, 3, 2, "sharding is NULL");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gspmd_basic),
        cmocka_unit_test(test_sbp_basic),
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
