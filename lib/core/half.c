/* f16 / bf16 <-> f32 conversions (round to nearest even) and the
 * accumulator width of partial sums, shared by every backend. */
#include <string.h>

#include "xm_core.h"

size_t xm_dtype_acc_size(xmesh_dtype_t dtype)
{
    return dtype == XMESH_F16 || dtype == XMESH_BF16 ? 4 : xmesh_dtype_size(dtype);
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

float xm_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0) {
        if (m == 0)
            return bits_f32(sign);
        e = 113; /* subnormal: normalise */
        while (!(m & 0x400)) {
            m <<= 1;
            e--;
        }
        return bits_f32(sign | (e << 23) | ((m & 0x3ff) << 13));
    }
    if (e == 31)
        return bits_f32(sign | 0x7f800000 | (m << 13));
    return bits_f32(sign | ((e + 112) << 23) | (m << 13));
}

uint16_t xm_f32_to_f16(float f)
{
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffff;
    if (ax > 0x7f800000) /* NaN: keep it quiet and non-zero */
        return sign | 0x7e00 | (uint16_t)((ax >> 13) & 0x1ff);
    if (ax >= 0x477ff000) /* >= 65520 rounds to infinity */
        return sign | 0x7c00;
    if (ax < 0x38800000) { /* below 2^-14: subnormal half */
        int e = (int)(ax >> 23);
        int shift = 126 - e;
        if (shift > 25)
            return sign;
        uint32_t m = (ax & 0x7fffff) | 0x800000;
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1)))
            q++;
        return sign | (uint16_t)q;
    }
    uint32_t r = ax - 0x38000000;
    r += 0xfff + ((r >> 13) & 1);
    return sign | (uint16_t)(r >> 13);
}

float xm_bf16_to_f32(uint16_t h)
{
    return bits_f32((uint32_t)h << 16);
}

uint16_t xm_f32_to_bf16(float f)
{
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffff) > 0x7f800000)
        return (uint16_t)((x >> 16) | 0x40);
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

xmesh_dtype_t xm_dtype_acc(xmesh_dtype_t dtype)
{
    return dtype == XMESH_F16 || dtype == XMESH_BF16 ? XMESH_F32 : dtype;
}

static int is_float_family(xmesh_dtype_t dt)
{
    return dt == XMESH_F16 || dt == XMESH_BF16 || dt == XMESH_F32;
}

int xm_dtype_pair_ok(xmesh_dtype_t src, xmesh_dtype_t dst)
{
    return src == dst || (is_float_family(src) && is_float_family(dst));
}

xmesh_dtype_t xm_wire_dtype(xmesh_dtype_t src, xmesh_dtype_t dst, int partial, int from_dst)
{
    size_t s = xmesh_dtype_size(src), d = xmesh_dtype_size(dst);
    if (partial || d < s || (from_dst && d == s))
        return dst;
    return src;
}

/* One loop per pair, the dtype tests hoisted out of it. Every conversion
 * goes through f32 (exact for f16 and bf16), so a narrowing rounds once. */
#define XM_CONV_LOOP(LOAD, STORE, DOWN)                                                            \
    do {                                                                                           \
        for (int64_t k = 0; k < n; k++) {                                                          \
            int64_t i = (DOWN) ? n - 1 - k : k;                                                    \
            LOAD;                                                                                  \
            STORE;                                                                                 \
        }                                                                                          \
    } while (0)
#define XM_LD32                                                                                    \
    float f;                                                                                       \
    memcpy(&f, (const char *)in + 4 * i, 4)
#define XM_LD16(CV)                                                                                \
    uint16_t h;                                                                                    \
    memcpy(&h, (const char *)in + 2 * i, 2);                                                       \
    float f = CV(h)
#define XM_ST32 memcpy((char *)out + 4 * i, &f, 4)
#define XM_ST16(CV)                                                                                \
    uint16_t o = CV(f);                                                                            \
    memcpy((char *)out + 2 * i, &o, 2)

void xm_convert(xmesh_dtype_t to, void *out, xmesh_dtype_t from, const void *in, int64_t n)
{
    if (to == from) {
        if (out != in)
            memmove(out, in, (size_t)n * xmesh_dtype_size(to));
        return;
    }
    /* In place: widening walks down, narrowing (or equal widths) walks up,
     * so no element is overwritten before it is read. */
    if (from == XMESH_F32 && to == XMESH_BF16)
        XM_CONV_LOOP(XM_LD32, XM_ST16(xm_f32_to_bf16), 0);
    else if (from == XMESH_F32 && to == XMESH_F16)
        XM_CONV_LOOP(XM_LD32, XM_ST16(xm_f32_to_f16), 0);
    else if (from == XMESH_BF16 && to == XMESH_F32)
        XM_CONV_LOOP(XM_LD16(xm_bf16_to_f32), XM_ST32, 1);
    else if (from == XMESH_F16 && to == XMESH_F32)
        XM_CONV_LOOP(XM_LD16(xm_f16_to_f32), XM_ST32, 1);
    else if (from == XMESH_F16 && to == XMESH_BF16)
        XM_CONV_LOOP(XM_LD16(xm_f16_to_f32), XM_ST16(xm_f32_to_bf16), 0);
    else if (from == XMESH_BF16 && to == XMESH_F16)
        XM_CONV_LOOP(XM_LD16(xm_bf16_to_f32), XM_ST16(xm_f32_to_f16), 0);
    /* other pairs are not supported: callers validated them */
}

xmesh_result_t xmesh_convert(xmesh_dtype_t to, void *out, xmesh_dtype_t from, const void *in,
                             int64_t n)
{
    if (!xmesh_dtype_size(to) || !xmesh_dtype_size(from))
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xmesh_convert: unknown dtype %d",
                      !xmesh_dtype_size(to) ? (int)to : (int)from);
    if (!xm_dtype_pair_ok(from, to))
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                      "xmesh_convert: dtype %s -> dtype %s: converts only between f16, bf16 and "
                      "f32",
                      xmesh_dtype_name(from), xmesh_dtype_name(to));
    if (n < 0)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xmesh_convert: n = %lld is negative",
                      (long long)n);
    if (n == 0)
        return XMESH_SUCCESS;
    if (!out || !in)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xmesh_convert: %s is NULL with n = %lld",
                      !out ? "out" : "in", (long long)n);
    uintptr_t o0 = (uintptr_t)out, i0 = (uintptr_t)in;
    uintptr_t o1 = o0 + (uintptr_t)n * xmesh_dtype_size(to),
              i1 = i0 + (uintptr_t)n * xmesh_dtype_size(from);
    if (o0 != i0 && o0 < i1 && i0 < o1)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                      "xmesh_convert: out and in overlap without being the same buffer");
    xm_convert(to, out, from, in, n);
    return XMESH_SUCCESS;
}
