/*
 * Unit tests of the dtype converter (lib/core/half.c, xm_convert), the one
 * conversion every converting plan and every partial sum uses. Exhaustive:
 * all 2^32 f32 bit patterns to bf16 and to f16, all 2^16 f16 and bf16
 * patterns to f32 and to each other, each result compared bit for bit with
 * a reference written here from the definition of the formats (not from
 * the library's code): round to nearest, ties to even, by comparing the
 * dropped bits with half a unit in the last place; overflow to infinity;
 * NaN stays NaN with its sign; subnormals of the target where it has them.
 * No randomness.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dtype_ref.h"
#include "xm_core.h"

#define BLOCK 65536

/* The 2^31 f32 inputs of one sign to a 16-bit dtype (bf: bf16, else f16). */
static void exhaustive_narrow(int bf, int neg)
{
    xmesh_dtype_t to = bf ? XMESH_BF16 : XMESH_F16;
    float *in = malloc(sizeof(float) * BLOCK);
    uint16_t *out = malloc(sizeof(uint16_t) * BLOCK);
    assert_true(in && out);
    uint64_t nan_in = 0, bad = 0, classes[5] = {0}; /* zero, sub, normal, inf, nan results */
    const unsigned minnorm = bf ? 0x80u : 0x400u, inf = bf ? 0x7f80u : 0x7c00u;
    for (uint64_t base = (uint64_t)neg << 31; base < (uint64_t)(neg + 1) << 31; base += BLOCK) {
        for (int i = 0; i < BLOCK; i++)
            in[i] = bitsf((uint32_t)(base + (uint64_t)i));
        xm_convert(to, out, XMESH_F32, in, BLOCK);
        for (int i = 0; i < BLOCK; i++) {
            uint32_t x = (uint32_t)(base + (uint64_t)i);
            uint16_t got = out[i];
            int ok;
            if ((x & 0x7fffffffu) > 0x7f800000u) { /* NaN: a NaN of the same sign */
                nan_in++;
                ok = nan16(got, bf) && (got >> 15) == (x >> 31);
            } else {
                ok = got == (bf ? ref_bf16(x) : ref_f16(x));
            }
            if (!ok && bad++ < 5)
                print_error("%s(0x%08x = %.9g) = 0x%04x, reference 0x%04x\n", bf ? "bf16" : "f16",
                            x, (double)bitsf(x), got, bf ? ref_bf16(x) : ref_f16(x));
            unsigned ab = got & 0x7fffu;
            classes[0] += ab == 0;
            classes[1] += ab != 0 && ab < minnorm;
            classes[3] += ab == inf;
            classes[4] += ab > inf;
        }
    }
    classes[2] = (1ull << 31) - classes[0] - classes[1] - classes[3] - classes[4];
    printf("f32 -> %s: the 2^31 %s inputs, %llu NaN inputs; results: %llu zeros, %llu subnormals, "
           "%llu "
           "normals, %llu infinities, %llu NaNs; %llu mismatches\n",
           bf ? "bf16" : "f16", neg ? "negative" : "positive", (unsigned long long)nan_in,
           (unsigned long long)classes[0], (unsigned long long)classes[1],
           (unsigned long long)classes[2], (unsigned long long)classes[3],
           (unsigned long long)classes[4], (unsigned long long)bad);
    free(in);
    free(out);
    assert_int_equal(bad, 0);
    /* every class of result was produced */
    for (int c = 0; c < 5; c++)
        assert_true(classes[c] > 0);
}

static void test_f32_to_bf16_pos(void **state)
{
    (void)state;
    exhaustive_narrow(1, 0);
}

static void test_f32_to_bf16_neg(void **state)
{
    (void)state;
    exhaustive_narrow(1, 1);
}

static void test_f32_to_f16_pos(void **state)
{
    (void)state;
    exhaustive_narrow(0, 0);
}

static void test_f32_to_f16_neg(void **state)
{
    (void)state;
    exhaustive_narrow(0, 1);
}

/* Known values, written out (the reference above could share a mistake
 * with the library; these cannot). */
static void test_known(void **state)
{
    (void)state;
    static const struct {
        uint32_t f32;
        uint16_t bf16, f16;
    } v[] = {
        {0x3f800000u, 0x3f80u, 0x3c00u}, /* 1 */
        {0x80000000u, 0x8000u, 0x8000u}, /* -0 */
        {0x477fe000u, 0x4780u, 0x7bffu}, /* 65504: f16 max; bf16 rounds to 65536 */
        {0x477fefffu, 0x4780u, 0x7bffu}, /* just below 65520 */
        {0x477ff000u, 0x4780u, 0x7c00u}, /* 65520: tie, even is infinity in f16 */
        {0x33800000u, 0x3380u, 0x0001u}, /* 2^-24: smallest f16 subnormal */
        {0x33000000u, 0x3300u, 0x0000u}, /* 2^-25: tie between 0 and 2^-24, even is 0 */
        {0x33000001u, 0x3300u, 0x0001u}, /* just above: rounds up */
        {0x33c00000u, 0x33c0u, 0x0002u}, /* 1.5 * 2^-24: tie, even is 2 */
        {0x387fe000u, 0x3880u, 0x0400u}, /* 1023.5 * 2^-24: tie, even is the smallest normal */
        {0x3f808000u, 0x3f80u, 0x3c04u}, /* 1 + 2^-8: bf16 tie, even is 1 */
        {0x3f818000u, 0x3f82u, 0x3c0cu}, /* 1 + 3 * 2^-8: bf16 tie, even is up */
        {0x7f7fffffu, 0x7f80u, 0x7c00u}, /* f32 max: infinity in both */
        {0x00000001u, 0x0000u, 0x0000u}, /* f32 smallest subnormal */
        {0x00400000u, 0x0040u, 0x0000u}, /* f32 subnormal exact in bf16 */
        {0xff800000u, 0xff80u, 0xfc00u}, /* -inf */
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        float f = bitsf(v[i].f32);
        uint16_t b, h;
        xm_convert(XMESH_BF16, &b, XMESH_F32, &f, 1);
        xm_convert(XMESH_F16, &h, XMESH_F32, &f, 1);
        if (b != v[i].bf16 || h != v[i].f16)
            fail_msg("0x%08x: bf16 0x%04x (want 0x%04x), f16 0x%04x (want 0x%04x)", v[i].f32, b,
                     v[i].bf16, h, v[i].f16);
    }
}

/* All 2^16 f16 and bf16 patterns: to f32 (exact), to each other (one
 * rounding: the widening is exact), and back (a round trip is the
 * identity for every non-NaN value). */
static void test_16bit_all(void **state)
{
    (void)state;
    static uint16_t h[65536], out16[65536], back[65536];
    static float f[65536];
    for (int i = 0; i < 65536; i++)
        h[i] = (uint16_t)i;
    /* f16 -> f32 */
    xm_convert(XMESH_F32, f, XMESH_F16, h, 65536);
    for (int i = 0; i < 65536; i++)
        if (fbits(f[i]) != ref_f16_to_f32(h[i]))
            fail_msg("f16 0x%04x -> f32 0x%08x, reference 0x%08x", i, fbits(f[i]),
                     ref_f16_to_f32(h[i]));
    xm_convert(XMESH_F16, back, XMESH_F32, f, 65536);
    for (int i = 0; i < 65536; i++)
        if (!nan16(h[i], 0) && back[i] != h[i])
            fail_msg("f16 0x%04x -> f32 -> f16 0x%04x", i, back[i]);
    /* f16 -> bf16 */
    xm_convert(XMESH_BF16, out16, XMESH_F16, h, 65536);
    for (int i = 0; i < 65536; i++) {
        uint32_t x = ref_f16_to_f32(h[i]);
        int ok = nan16(h[i], 0) ? nan16(out16[i], 1) && (out16[i] >> 15) == (h[i] >> 15)
                                : out16[i] == ref_bf16(x);
        if (!ok)
            fail_msg("f16 0x%04x -> bf16 0x%04x, reference 0x%04x", i, out16[i], ref_bf16(x));
    }
    /* bf16 -> f32: the top half of the f32 */
    xm_convert(XMESH_F32, f, XMESH_BF16, h, 65536);
    for (int i = 0; i < 65536; i++)
        if (fbits(f[i]) != (uint32_t)i << 16)
            fail_msg("bf16 0x%04x -> f32 0x%08x", i, fbits(f[i]));
    xm_convert(XMESH_BF16, back, XMESH_F32, f, 65536);
    for (int i = 0; i < 65536; i++)
        if (!nan16(h[i], 1) && back[i] != h[i])
            fail_msg("bf16 0x%04x -> f32 -> bf16 0x%04x", i, back[i]);
    /* bf16 -> f16 */
    xm_convert(XMESH_F16, out16, XMESH_BF16, h, 65536);
    for (int i = 0; i < 65536; i++) {
        uint32_t x = (uint32_t)i << 16;
        int ok = nan16(h[i], 1) ? nan16(out16[i], 0) && (out16[i] >> 15) == (h[i] >> 15)
                                : out16[i] == ref_f16(x);
        if (!ok)
            fail_msg("bf16 0x%04x -> f16 0x%04x, reference 0x%04x", i, out16[i], ref_f16(x));
    }
}

/* In place (out == in), both directions, equals out of place; equal dtypes
 * copy. */
static void test_in_place(void **state)
{
    (void)state;
    enum { N = 1000 };
    static const xmesh_dtype_t fam[] = {XMESH_F32, XMESH_F16, XMESH_BF16};
    float src[N];
    for (int i = 0; i < N; i++)
        src[i] = bitsf(0x3a000000u + (uint32_t)i * 0x12345u) * (i % 2 ? -1.f : 1.f);
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++) {
            char from[4 * N], ref[4 * N], buf[4 * N];
            xm_convert(fam[a], from, XMESH_F32, src, N);
            xm_convert(fam[b], ref, fam[a], from, N);
            memcpy(buf, from, sizeof from);
            xm_convert(fam[b], buf, fam[a], buf, N);
            if (memcmp(buf, ref, N * xmesh_dtype_size(fam[b])))
                fail_msg("%s -> %s in place differs", xmesh_dtype_name(fam[a]),
                         xmesh_dtype_name(fam[b]));
        }
    /* the accumulator of partial sums (xm_acc_to_native is xm_convert) */
    assert_int_equal(xm_dtype_acc(XMESH_F16), XMESH_F32);
    assert_int_equal(xm_dtype_acc(XMESH_BF16), XMESH_F32);
    assert_int_equal(xm_dtype_acc(XMESH_F32), XMESH_F32);
    assert_int_equal(xm_dtype_acc(XMESH_F64), XMESH_F64);
    assert_int_equal(xm_dtype_acc(XMESH_I32), XMESH_I32);
}

/* Which pairs a plan may convert, and the wire rule. */
static void test_pairs(void **state)
{
    (void)state;
    for (int a = 0; a < XMESH_DTYPE_COUNT_; a++)
        for (int b = 0; b < XMESH_DTYPE_COUNT_; b++) {
            int fa = a == XMESH_F16 || a == XMESH_BF16 || a == XMESH_F32;
            int fb = b == XMESH_F16 || b == XMESH_BF16 || b == XMESH_F32;
            assert_int_equal(xm_dtype_pair_ok((xmesh_dtype_t)a, (xmesh_dtype_t)b),
                             a == b || (fa && fb));
        }
    assert_int_equal(xm_wire_dtype(XMESH_F32, XMESH_BF16, 0, 0), XMESH_BF16); /* sender */
    assert_int_equal(xm_wire_dtype(XMESH_BF16, XMESH_F32, 0, 0), XMESH_BF16); /* receiver */
    assert_int_equal(xm_wire_dtype(XMESH_F16, XMESH_BF16, 0, 0), XMESH_F16);
    assert_int_equal(xm_wire_dtype(XMESH_F16, XMESH_BF16, 0, 1), XMESH_BF16); /* ring */
    assert_int_equal(xm_wire_dtype(XMESH_BF16, XMESH_F32, 0, 1), XMESH_BF16);
    assert_int_equal(xm_wire_dtype(XMESH_BF16, XMESH_F32, 1, 0), XMESH_F32); /* partial */
    assert_int_equal(xm_wire_dtype(XMESH_F32, XMESH_F16, 1, 0), XMESH_F16);
    assert_int_equal(xm_wire_dtype(XMESH_I32, XMESH_I32, 0, 0), XMESH_I32);
}

/* The public entry point: same results as xm_convert, refusals with
 * nothing written. */
static void test_public(void **state)
{
    (void)state;
    float in[5] = {1.0f, -0.0f, 65520.0f, 3.0e-8f, 1.00390625f};
    uint16_t h[5], want[5];
    xm_convert(XMESH_F16, want, XMESH_F32, in, 5);
    assert_int_equal(xmesh_convert(XMESH_F16, h, XMESH_F32, in, 5), XMESH_SUCCESS);
    assert_memory_equal(h, want, sizeof h);
    float back[5];
    assert_int_equal(xmesh_convert(XMESH_F32, NULL, XMESH_BF16, NULL, 0), XMESH_SUCCESS);
    /* in place, widening: bf16 values in the first half of back become f32 */
    uint16_t b16[5];
    assert_int_equal(xmesh_convert(XMESH_BF16, b16, XMESH_F32, in, 5), XMESH_SUCCESS);
    memcpy(back, b16, sizeof b16);
    assert_int_equal(xmesh_convert(XMESH_F32, back, XMESH_BF16, back, 5), XMESH_SUCCESS);
    for (int i = 0; i < 5; i++)
        assert_int_equal(fbits(back[i]), (uint32_t)b16[i] << 16);
    /* refusals: nothing written */
    uint16_t keep[5];
    memset(keep, 0x5A, sizeof keep);
    memcpy(h, keep, sizeof h);
    int32_t iv[5] = {0};
    assert_int_equal(xmesh_convert(XMESH_F16, h, XMESH_I32, iv, 5), XMESH_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(xmesh_last_error(), "dtype i32 -> dtype f16"));
    assert_int_equal(xmesh_convert(XMESH_F64, h, XMESH_F32, in, 1), XMESH_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(xmesh_last_error(), "dtype f32 -> dtype f64"));
    assert_int_equal(xmesh_convert((xmesh_dtype_t)42, h, XMESH_F32, in, 1),
                     XMESH_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(xmesh_last_error(), "unknown dtype 42"));
    assert_int_equal(xmesh_convert(XMESH_F16, h, XMESH_F32, in, -1), XMESH_ERR_INVALID_ARGUMENT);
    assert_int_equal(xmesh_convert(XMESH_F16, NULL, XMESH_F32, in, 1), XMESH_ERR_INVALID_ARGUMENT);
    assert_int_equal(xmesh_convert(XMESH_F16, (char *)in + 2, XMESH_F32, in, 2),
                     XMESH_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(xmesh_last_error(), "overlap"));
    assert_memory_equal(h, keep, sizeof h);
    assert_true(in[0] == 1.0f && in[2] == 65520.0f);
}

/* usage: test_convert [small | all | bf16+ | bf16- | f16+ | f16-]: the quick
 * tests, or one exhaustive sweep over the f32 inputs of one sign (CTest
 * runs them as five tests); "all" runs everything, no argument the quick tests
 * (valgrind and the sanitizer passes run the unit binaries without arguments). */
int main(int argc, char **argv)
{
    const struct CMUnitTest small[] = {
        cmocka_unit_test(test_known),    cmocka_unit_test(test_16bit_all),
        cmocka_unit_test(test_in_place), cmocka_unit_test(test_pairs),
        cmocka_unit_test(test_public),
    };
    const struct CMUnitTest sweeps[][1] = {
        {cmocka_unit_test(test_f32_to_bf16_pos)},
        {cmocka_unit_test(test_f32_to_bf16_neg)},
        {cmocka_unit_test(test_f32_to_f16_pos)},
        {cmocka_unit_test(test_f32_to_f16_neg)},
    };
    static const char *const names[] = {"bf16+", "bf16-", "f16+", "f16-"};
    const char *what = argc > 1 ? argv[1] : "small";
    int r = 0, all = !strcmp(what, "all"), known = all || !strcmp(what, "small");
    if (known)
        r |= cmocka_run_group_tests(small, NULL, NULL);
    for (int k = 0; k < 4; k++)
        if (all || !strcmp(what, names[k])) {
            known = 1;
            r |= _cmocka_run_group_tests(names[k], sweeps[k], 1, NULL, NULL);
        }
    if (!known) {
        fprintf(stderr, "usage: %s [small | bf16+ | bf16- | f16+ | f16-]\n", argv[0]);
        return 2;
    }
    return r;
}
