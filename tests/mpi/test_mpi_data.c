/*
 * One-process unit tests of the MPI executor's data layer (lib/plan/geom.c):
 * f16/bf16 conversions against references, box geometry pack/unpack/copy
 * against naive index loops, partial-sum accumulation and the checksum's
 * independence of how a box splits into runs. Random cases print their
 * seed; XMESH_TEST_SEED replays.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "xm_mpi.h"

static uint64_t seed, rs;
static uint64_t rnd(void)
{
    uint64_t z = (rs += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float bits_f(uint32_t b)
{
    float f;
    memcpy(&f, &b, 4);
    return f;
}

/* Every half value survives half -> float -> half (NaNs stay NaN). */
static void test_half_roundtrip(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = xm_f16_to_f32((uint16_t)h);
        uint16_t back = xm_f32_to_f16(f);
        if (((h >> 10) & 0x1f) == 0x1f && (h & 0x3ff))
            assert_true(isnan(f) && ((back >> 10) & 0x1f) == 0x1f && (back & 0x3ff));
        else
            assert_int_equal(back, h);
    }
}

/* float -> half rounds to nearest even, like the compiler's _Float16. */
static void test_half_rounding(void **state)
{
    (void)state;
#if defined(__FLT16_MAX__)
    rs = seed;
    for (int i = 0; i < 2000000; i++) {
        uint32_t b = (uint32_t)rnd();
        if (i % 4 == 0) /* bias towards the half range, subnormals included */
            b = (b & 0x80000000u) | ((uint32_t)(0x30000000u + (rnd() % 0x18000000u)));
        float f = bits_f(b);
        if (isnan(f))
            continue;
        _Float16 ref = (_Float16)f;
        uint16_t rb;
        memcpy(&rb, &ref, 2);
        uint16_t got = xm_f32_to_f16(f);
        if (got != rb)
            fail_msg("float %a (0x%08x): got 0x%04x, want 0x%04x (seed %llu)", (double)f, b, got,
                     rb, (unsigned long long)seed);
    }
#else
    skip();
#endif
}

/* float -> bf16: nearest of the two neighbours, ties to even. */
static void test_bf16(void **state)
{
    (void)state;
    rs = seed + 1;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = xm_bf16_to_f32((uint16_t)h);
        if (!isnan(f))
            assert_int_equal(xm_f32_to_bf16(f), h);
    }
    for (int i = 0; i < 2000000; i++) {
        uint32_t b = (uint32_t)rnd();
        float f = bits_f(b);
        if (isnan(f) || isinf(f))
            continue;
        uint32_t lo = b & 0xffff0000u, hi = lo + 0x10000u;
        double dl = fabs((double)f - (double)bits_f(lo));
        double dh = isinf(bits_f(hi)) ? INFINITY : fabs((double)bits_f(hi) - (double)f);
        uint16_t want;
        if (dl < dh || (dl == dh && !((lo >> 16) & 1)))
            want = (uint16_t)(lo >> 16);
        else
            want = (uint16_t)(hi >> 16);
        if (isinf(bits_f(hi)) && dl >= fabs((double)bits_f(lo) - (double)bits_f(lo - 0x10000u)) / 2)
            want = (uint16_t)(hi >> 16); /* rounds up to infinity */
        uint16_t got = xm_f32_to_bf16(f);
        if (got != want)
            fail_msg("float %a: got 0x%04x, want 0x%04x (seed %llu)", (double)f, got, want,
                     (unsigned long long)seed);
    }
}

/* A random block [blo, bhi) and a box inside it. */
static int random_geom(int *nd, int64_t *blo, int64_t *bhi, xm_box_t *box)
{
    *nd = (int)(rnd() % 5);
    for (int d = 0; d < *nd; d++) {
        blo[d] = (int64_t)(rnd() % 7);
        bhi[d] = blo[d] + 1 + (int64_t)(rnd() % 6);
        int64_t a = blo[d] + (int64_t)(rnd() % (uint64_t)(bhi[d] - blo[d]));
        int64_t b = a + 1 + (int64_t)(rnd() % (uint64_t)(bhi[d] - a));
        if (rnd() % 3 == 0) { /* full extent: exercises merged dims */
            a = blo[d];
            b = bhi[d];
        }
        box->lo[d] = a;
        box->hi[d] = b;
    }
    return 0;
}

/* Element offset in the block of the box-linear element k (naive). */
static int64_t naive_off(int nd, const int64_t *blo, const int64_t *bhi, const xm_box_t *box,
                         int64_t k)
{
    int64_t idx[XM_MAX_DIMS], off = 0;
    for (int d = nd - 1; d >= 0; d--) {
        int64_t e = box->hi[d] - box->lo[d];
        idx[d] = box->lo[d] + k % e;
        k /= e;
    }
    for (int d = 0; d < nd; d++)
        off = off * (bhi[d] - blo[d]) + idx[d] - blo[d];
    return off;
}

static void test_geom_pack_unpack(void **state)
{
    (void)state;
    rs = seed + 2;
    for (int it = 0; it < 3000; it++) {
        int nd;
        int64_t blo[XM_MAX_DIMS], bhi[XM_MAX_DIMS];
        xm_box_t box;
        memset(&box, 0, sizeof box);
        random_geom(&nd, blo, bhi, &box);
        int64_t bv = 1, v = xm_box_volume(&box, nd);
        for (int d = 0; d < nd; d++)
            bv *= bhi[d] - blo[d];
        xm_geom_t g;
        xm_geom_init(&g, nd, blo, bhi, &box);
        int32_t *block = malloc(sizeof(int32_t) * bv), *buf = malloc(sizeof(int32_t) * (v + 1));
        for (int64_t i = 0; i < bv; i++)
            block[i] = (int32_t)i;
        /* random sub-range of the box */
        int64_t a = (int64_t)(rnd() % (uint64_t)v), c = 1 + (int64_t)(rnd() % (uint64_t)(v - a));
        memset(buf, 0xff, sizeof(int32_t) * (v + 1));
        xm_geom_copy(XM_COPY_PACK, &g, XMESH_I32, block, buf, a, c);
        for (int64_t k = 0; k < c; k++)
            assert_int_equal(buf[k], naive_off(nd, blo, bhi, &box, a + k));
        assert_int_equal(buf[c], -1);
        int64_t off;
        int contig = xm_geom_contig(&g, a, c, &off);
        int naive_contig = 1;
        for (int64_t k = 1; k < c; k++)
            naive_contig &=
                naive_off(nd, blo, bhi, &box, a + k) == naive_off(nd, blo, bhi, &box, a) + k;
        /* contig may only be claimed when true (it is exact for single runs) */
        if (contig) {
            assert_true(naive_contig);
            assert_int_equal(off, naive_off(nd, blo, bhi, &box, a));
        }
        /* unpack writes exactly the range */
        for (int64_t k = 0; k < c; k++)
            buf[k] = -2 - (int32_t)k;
        xm_geom_copy(XM_COPY_UNPACK, &g, XMESH_I32, block, buf, a, c);
        for (int64_t k = 0; k < v; k++) {
            int64_t o = naive_off(nd, blo, bhi, &box, k);
            assert_int_equal(block[o], k >= a && k < a + c ? -2 - (int32_t)(k - a) : (int32_t)o);
        }
        /* checksum: the same over the box as over its packed bytes */
        for (int64_t i = 0; i < bv; i++)
            block[i] = (int32_t)(i * 2654435761u);
        xm_geom_copy(XM_COPY_PACK, &g, XMESH_I32, block, buf, a, c);
        assert_true(xm_geom_hash(&g, block, 4, a, c) == xm_geom_hash(NULL, buf, 1, 0, c * 4));
        free(block);
        free(buf);
    }
}

static void test_geom_copy2(void **state)
{
    (void)state;
    rs = seed + 3;
    for (int it = 0; it < 2000; it++) {
        int nd;
        int64_t slo[XM_MAX_DIMS], shi[XM_MAX_DIMS], dlo[XM_MAX_DIMS], dhi[XM_MAX_DIMS];
        xm_box_t box;
        memset(&box, 0, sizeof box);
        random_geom(&nd, slo, shi, &box);
        /* a destination block that also contains the box */
        for (int d = 0; d < nd; d++) {
            dlo[d] = box.lo[d] - (int64_t)(rnd() % 3);
            dhi[d] = box.hi[d] + (int64_t)(rnd() % 3);
        }
        int64_t sv = 1, dv = 1, v = xm_box_volume(&box, nd);
        for (int d = 0; d < nd; d++) {
            sv *= shi[d] - slo[d];
            dv *= dhi[d] - dlo[d];
        }
        xm_geom_t gs, gd;
        xm_geom_init(&gs, nd, slo, shi, &box);
        xm_geom_init(&gd, nd, dlo, dhi, &box);
        int64_t *src = malloc(8 * sv), *dst = malloc(8 * dv);
        for (int64_t i = 0; i < sv; i++)
            src[i] = i;
        for (int64_t i = 0; i < dv; i++)
            dst[i] = -1;
        xm_geom_copy2(&gs, src, &gd, dst, 8, 0, v);
        int64_t written = 0;
        for (int64_t k = 0; k < v; k++) {
            int64_t so = naive_off(nd, slo, shi, &box, k), dof = naive_off(nd, dlo, dhi, &box, k);
            assert_int_equal(dst[dof], so);
        }
        for (int64_t i = 0; i < dv; i++)
            written += dst[i] != -1;
        assert_int_equal(written, v);
        free(src);
        free(dst);
    }
}

/* Accumulation: acc = p0 + p1 + p2 in the accumulation type, then native. */
static void test_accumulate(void **state)
{
    (void)state;
    int64_t blo[1] = {0}, bhi[1] = {16};
    xm_box_t box = {.lo = {0}, .hi = {16}};
    xm_geom_t g;
    xm_geom_init(&g, 1, blo, bhi, &box);
    for (int dt = 0; dt < XMESH_DTYPE_COUNT_; dt++) {
        size_t es = xmesh_dtype_size((xmesh_dtype_t)dt), as = xm_dtype_acc_size((xmesh_dtype_t)dt);
        unsigned char parts[3][16 * 8], acc[16 * 8];
        for (int p = 0; p < 3; p++)
            for (int i = 0; i < 16; i++) {
                double v = (p + 1) * 0.5 * i - 3; /* exact in every float type */
                switch (dt) {
                case XMESH_U8:
                case XMESH_I8: {
                    uint8_t x = (uint8_t)(200 + 7 * i + p);
                    memcpy(parts[p] + i, &x, 1);
                    break;
                }
                case XMESH_I32: {
                    int32_t x = 2000000000 + i * p;
                    memcpy(parts[p] + 4 * i, &x, 4);
                    break;
                }
                case XMESH_I64: {
                    int64_t x = ((int64_t)1 << 62) + i * p;
                    memcpy(parts[p] + 8 * i, &x, 8);
                    break;
                }
                case XMESH_F16: {
                    uint16_t x = xm_f32_to_f16((float)v);
                    memcpy(parts[p] + 2 * i, &x, 2);
                    break;
                }
                case XMESH_BF16: {
                    uint16_t x = xm_f32_to_bf16((float)v);
                    memcpy(parts[p] + 2 * i, &x, 2);
                    break;
                }
                case XMESH_F32: {
                    float x = (float)v;
                    memcpy(parts[p] + 4 * i, &x, 4);
                    break;
                }
                default:
                    memcpy(parts[p] + 8 * i, &v, 8);
                }
            }
        xm_geom_copy(XM_COPY_TO_ACC, &g, (xmesh_dtype_t)dt, parts[0], acc, 0, 16);
        xm_geom_copy(XM_COPY_ADD_ACC, &g, (xmesh_dtype_t)dt, parts[1], acc, 0, 16);
        xm_geom_copy(XM_COPY_ADD_ACC, &g, (xmesh_dtype_t)dt, parts[2], acc, 0, 16);
        xm_acc_to_native((xmesh_dtype_t)dt, acc, 16);
        for (int i = 0; i < 16; i++) {
            double want = 0.5 * i * 6 - 9;
            switch (dt) {
            case XMESH_U8:
            case XMESH_I8:
                assert_int_equal(acc[i], (uint8_t)(600 + 21 * i + 3));
                break;
            case XMESH_I32: {
                int32_t x;
                memcpy(&x, acc + 4 * i, 4);
                assert_int_equal((uint32_t)x, (uint32_t)(6000000000ull + 3 * (uint64_t)i));
                break;
            }
            case XMESH_I64: {
                uint64_t x;
                memcpy(&x, acc + 8 * i, 8);
                assert_true(x == 3 * ((uint64_t)1 << 62) + 3 * (uint64_t)i);
                break;
            }
            case XMESH_F16: {
                uint16_t x;
                memcpy(&x, acc + 2 * i, 2);
                assert_true(xm_f16_to_f32(x) == (float)want);
                break;
            }
            case XMESH_BF16: {
                uint16_t x;
                memcpy(&x, acc + 2 * i, 2);
                assert_true(xm_bf16_to_f32(x) == (float)want);
                break;
            }
            case XMESH_F32: {
                float x;
                memcpy(&x, acc + 4 * i, 4);
                assert_true(x == (float)want);
                break;
            }
            default: {
                double x;
                memcpy(&x, acc + 8 * i, 8);
                assert_true(x == want);
            }
            }
        }
        (void)es;
        (void)as;
    }
}

int main(void)
{
    seed = (uint64_t)time(NULL);
    const char *env = getenv("XMESH_TEST_SEED");
    if (env && *env)
        seed = strtoull(env, NULL, 0);
    printf("test_mpi_data: seed %llu (XMESH_TEST_SEED replays)\n", (unsigned long long)seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_half_roundtrip), cmocka_unit_test(test_half_rounding),
        cmocka_unit_test(test_bf16),           cmocka_unit_test(test_geom_pack_unpack),
        cmocka_unit_test(test_geom_copy2),     cmocka_unit_test(test_accumulate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
