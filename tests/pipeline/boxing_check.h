/* The checking harness shared by the boxing tests (test_boxing.c, test_box_shared.c): a seeded
 * value per (tag, element), reference blocks cut from the global array with the tests' own
 * index math (independent of nn/sbp.c's), the partial-sum split of a P tensor, and an
 * every-element comparison of a boxed tensor against the global array. Included by one test
 * file each (static definitions); FAIL counts into g_fail. */
#ifndef XMP_TEST_BOXING_CHECK_H
#define XMP_TEST_BOXING_CHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xmesh/mpi.h>

#include "nn/sbp.h"

static int g_rank, g_fail;
static uint64_t g_seed = 1234;
static xmesh_ctx_t g_ctx;

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        if (g_fail++ < 20) {                                                                       \
            fprintf(stderr, "[rank %d] FAIL %s:%d: ", g_rank, __FILE__, __LINE__);                 \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
        }                                                                                          \
    } while (0)

static float rnd(uint64_t tag, int64_t i)
{
    uint64_t z = g_seed * 0x9e3779b97f4a7c15ull + tag * 0xbf58476d1ce4e5b9ull + (uint64_t)i;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)((z >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}

/* Test-side block math: the per-dim piece list of numpy.array_split over the
 * axes splitting d, lower axis major, computed by walking piece sizes. */
static void ref_block(const int *mshape, int mnd, const xmp_sbp_t *sbp, const int *coord, int nd,
                      const int64_t *shape, int64_t *lo, int64_t *hi)
{
    for (int d = 0; d < nd; d++) {
        int64_t k = 1, idx = 0;
        for (int a = 0; a < mnd; a++)
            if (sbp[a].kind == XMP_S && sbp[a].dim == d) {
                idx = idx * mshape[a] + coord[a];
                k *= mshape[a];
            }
        int64_t start = 0;
        for (int64_t p = 0; p < idx; p++)
            start += shape[d] / k + (p < shape[d] % k);
        lo[d] = start;
        hi[d] = start + shape[d] / k + (idx < shape[d] % k);
    }
}

static void coords_of(const int *mshape, int mnd, int i, int *c)
{
    for (int a = mnd - 1; a >= 0; a--) {
        c[a] = i % mshape[a];
        i /= mshape[a];
    }
}

/* Source value: device with coords c holds R_{P-coords of c} on its block;
 * the global value F is the sum of R over all P-coordinate tuples. */
static uint64_t ptag(const xmp_mesh_t *m, const xmp_sbp_t *sbp, const int *c, uint64_t tag)
{
    uint64_t k = 0;
    for (int a = 0; a < m->ndim; a++)
        k = k * 8 + (uint64_t)(sbp[a].kind == XMP_P ? c[a] + 1 : 0);
    return tag * 4096 + k;
}

static void make_full(const xmp_mesh_t *m, const xmp_sbp_t *sbp, int64_t n, uint64_t tag, float *F)
{
    memset(F, 0, sizeof(float) * (size_t)n);
    for (int i = 0; i < m->size; i++) {
        int c[4];
        coords_of(m->shape, m->ndim, i, c);
        int rep = 1; /* one device per distinct P tuple: zero on non-P axes */
        for (int a = 0; a < m->ndim; a++)
            if (sbp[a].kind != XMP_P && c[a] != 0)
                rep = 0;
        if (rep)
            for (int64_t e = 0; e < n; e++)
                F[e] += rnd(ptag(m, sbp, c, tag), e);
    }
}

static void fill_src(xmp_tensor_t *t, uint64_t tag)
{
    if (!t->mesh->member)
        return;
    uint64_t k = ptag(t->mesh, t->sbp, t->mesh->coord, tag);
    float *p = xmp_f32(t);
    int64_t idx[8] = {0};
    for (int64_t e = 0; e < t->lcount; e++) {
        int64_t g = 0;
        for (int d = 0; d < t->ndim; d++)
            g = g * t->shape[d] + t->loff[d] + idx[d];
        p[e] = rnd(k, g);
        for (int d = t->ndim - 1; d >= 0; d--) {
            if (++idx[d] < t->lshape[d])
                break;
            idx[d] = 0;
        }
    }
}

static int close_enough(float a, float b)
{
    return fabsf(a - b) <= 1e-5f * (1.0f + fabsf(b));
}

/* Checks y (all members) against F: every device's block (own math); P
 * groups summed. Also checks lshape/loff against libxmesh. */
static void check_against_full(const xmp_tensor_t *y, const float *F, const char *what)
{
    const xmp_mesh_t *m = y->mesh;
    if (!m->member)
        return;
    int n = m->size, *cnt = malloc(sizeof(int) * 2 * (size_t)n), lc = (int)y->lcount;
    MPI_Allgather(&lc, 1, MPI_INT, cnt, 1, MPI_INT, m->comm);
    int *dis = cnt + n, tot = 0;
    for (int i = 0; i < n; i++) {
        dis[i] = tot;
        tot += cnt[i];
    }
    float *all = malloc(sizeof(float) * (size_t)(tot + 1));
    MPI_Allgatherv(y->data, lc, MPI_FLOAT, all, cnt, dis, MPI_FLOAT, m->comm);
    int64_t lo[8], hi[8];
    ref_block(m->shape, m->ndim, y->sbp, m->coord, y->ndim, y->shape, lo, hi);
    for (int d = 0; d < y->ndim; d++)
        if (lo[d] != y->loff[d] || hi[d] - lo[d] != y->lshape[d])
            FAIL("%s: dim %d block [%lld,%lld) vs tensor off %lld len %lld", what, d,
                 (long long)lo[d], (long long)hi[d], (long long)y->loff[d],
                 (long long)y->lshape[d]);
    if (m->xmesh) {
        xmesh_layout_t l;
        int64_t xs[8], xo[8];
        int holds = 0;
        xmp_tensor_layout(y, &l);
        if (xmesh_layout_local_shape(&l, m->ranks[m->index], xs, &holds) ||
            xmesh_layout_local_offset(&l, m->ranks[m->index], xo, &holds))
            FAIL("%s: xmesh layout query: %s", what, xmesh_last_error());
        for (int d = 0; d < y->ndim; d++)
            if (xs[d] != y->lshape[d] || xo[d] != y->loff[d])
                FAIL("%s: dim %d libxmesh block off %lld len %lld, ours %lld %lld", what, d,
                     (long long)xo[d], (long long)xs[d], (long long)y->loff[d],
                     (long long)y->lshape[d]);
    }
    for (int i = 0; i < n; i++) {
        int c[4], rep = 1;
        coords_of(m->shape, m->ndim, i, c);
        for (int a = 0; a < m->ndim; a++)
            if (y->sbp[a].kind == XMP_P && c[a] != 0)
                rep = 0;
        if (!rep)
            continue;
        ref_block(m->shape, m->ndim, y->sbp, c, y->ndim, y->shape, lo, hi);
        int64_t vol = 1, ext[8];
        for (int d = 0; d < y->ndim; d++) {
            ext[d] = hi[d] - lo[d];
            vol *= ext[d];
        }
        if (cnt[i] != vol) {
            FAIL("%s: device %d holds %d elements, expected %lld", what, i, cnt[i], (long long)vol);
            continue;
        }
        int64_t idx[8] = {0};
        for (int64_t e = 0; e < vol; e++) {
            int64_t g = 0;
            for (int d = 0; d < y->ndim; d++)
                g = g * y->shape[d] + lo[d] + idx[d];
            float s = 0;
            for (int j = 0; j < n; j++) { /* sum over my P group */
                int cj[4], same = 1;
                coords_of(m->shape, m->ndim, j, cj);
                for (int a = 0; a < m->ndim; a++)
                    if (y->sbp[a].kind != XMP_P && cj[a] != c[a])
                        same = 0;
                if (same)
                    s += all[dis[j] + e];
            }
            if (!close_enough(s, F[g])) {
                FAIL("%s: device %d element %lld (global %lld): %g, expected %g", what, i,
                     (long long)e, (long long)g, s, F[g]);
                break;
            }
            for (int d = y->ndim - 1; d >= 0; d--) {
                if (++idx[d] < ext[d])
                    break;
                idx[d] = 0;
            }
        }
    }
    free(all);
    free(cnt);
}

#endif /* XMP_TEST_BOXING_CHECK_H */
