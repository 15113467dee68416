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
