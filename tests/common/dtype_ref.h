/*
 * Reference conversions between f32, f16 and bf16 for the tests, written
 * from the definitions of the formats (not from the library's code): round
 * to nearest, ties to even, by comparing the dropped bits with half a unit
 * in the last place; overflow to infinity; subnormals of the target where it
 * has them. NaN inputs are the caller's to handle (the library keeps NaN a
 * NaN of the same sign; its payload is not specified). Used by
 * tests/unit/test_convert.c (exhaustively against xm_convert) and
 * tests/mpi/test_dtype_mpi.c (every element of converting reshards).
 */
#ifndef XMESH_TESTS_DTYPE_REF_H
#define XMESH_TESTS_DTYPE_REF_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float bitsf(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Rounds the integer m (a value m * 2^e) to a multiple of 2^shift, ties
 * to even: returns m / 2^shift rounded. */
static inline uint64_t round_shift(uint64_t m, int shift)
{
    if (shift <= 0)
        return m << -shift;
    if (shift >= 63)
        return 0;
    uint64_t q = m >> shift, rem = m & ((1ull << shift) - 1), half = 1ull << (shift - 1);
    if (rem > half || (rem == half && (q & 1)))
        q++;
    return q;
}

/* f32 -> bf16 for a non-NaN input: bf16 is the top half of an f32, so the
 * result is the top 16 bits rounded on the bottom 16 (an overflow carries
 * into the exponent and lands on infinity). */
static inline uint16_t ref_bf16(uint32_t x)
{
    uint32_t sign = x & 0x80000000u, ax = x & 0x7fffffffu;
    return (uint16_t)((sign >> 16) | round_shift(ax, 16));
}

/* f32 -> f16 for a non-NaN input: the value m * 2^e (m the f32 significand
 * with its hidden bit) rounded to a multiple of f16's unit in the last
 * place at that magnitude, 2^(floor(log2 v) - 10), at least 2^-24
 * (subnormals); then encoded; 65504 is the largest finite f16. */
static inline uint16_t ref_f16(uint32_t x)
{
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax == 0x7f800000u)
        return sign | 0x7c00u;
    int E = (int)(ax >> 23);
    uint64_t m = ax & 0x7fffffu;
    int e = E ? E - 150 : -149;
    if (E)
        m |= 0x800000u;
    if (m == 0)
        return sign;
    int top = 63 - __builtin_clzll(m); /* v in [2^(top + e), 2^(top + e + 1)) */
    int k = top + e - 10;
    if (k < -24)
        k = -24;
    uint64_t n = round_shift(m, k - e); /* v ~ n * 2^k */
    uint64_t bits;
    if (k == -24)
        bits = n; /* subnormal; n == 1024 is the smallest normal */
    else          /* n in [1024, 2048]: 2048 carries into the exponent */
        bits = ((uint64_t)(k + 25) << 10) + (n - 1024);
    if (bits >= 0x7c00u)
        bits = 0x7c00u;
    return sign | (uint16_t)bits;
}

/* f16 -> f32 from the format's definition (exact in double). */
static inline uint32_t ref_f16_to_f32(uint16_t h)
{
    int E = (h >> 10) & 31, m = h & 0x3ff;
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    if (E == 31)
        return sign | 0x7f800000u | ((uint32_t)m << 13); /* inf; NaN keeps its payload */
    double v = E ? ldexp(1024 + m, E - 25) : ldexp(m, -24);
    return sign | fbits((float)v);
}

static inline int nan16(uint16_t h, int bf)
{
    return bf ? (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) : (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu);
}

/* Any of f32 (4 bytes), f16 and bf16 (2 bytes, bf = 1 for bf16) to f32. */
static inline uint32_t ref_to_f32(int size, int bf, const void *p)
{
    if (size == 4) {
        uint32_t u;
        memcpy(&u, p, 4);
        return u;
    }
    uint16_t h;
    memcpy(&h, p, 2);
    return bf ? (uint32_t)h << 16 : ref_f16_to_f32(h);
}

#endif
