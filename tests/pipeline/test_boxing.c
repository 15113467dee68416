/* Boxing under MPI: every pair of SBP signatures on the meshes that fit the
 * world size, uneven and empty shards, checked element by element against
 * (a) blocks cut from the global array with this file's own index math and
 * (b) xmesh_reshard between the same two layouts (when the destination has
 * no P). Backward boxings too. Usage: test_boxing [--seed S]. */
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

static void check_xmesh(const xmp_tensor_t *x, const xmp_tensor_t *y, const char *what)
{
    xmesh_layout_t ls, ld;
    xmesh_plan_t plan = NULL;
    xmesh_plan_params_t pp = XMESH_PLAN_PARAMS_INITIALIZER;
    pp.scheduler = XMESH_SCHEDULER_NAIVE;
    xmp_tensor_layout(x, &ls);
    xmp_tensor_layout(y, &ld);
    if (xmesh_plan_create(g_ctx, &ls, &ld, &pp, &plan)) {
        FAIL("%s: xmesh_plan_create: %s", what, xmesh_last_error());
        return;
    }
    float *buf = calloc((size_t)(y->lcount + 1), sizeof(float));
    if (xmesh_reshard(plan, x->mesh->member ? x->data : NULL, y->mesh->member ? buf : NULL))
        FAIL("%s: xmesh_reshard: %s", what, xmesh_last_error());
    for (int64_t e = 0; e < y->lcount; e++)
        if (!close_enough(buf[e], xmp_f32(y)[e])) {
            FAIL("%s: local element %lld: boxing %g, xmesh_reshard %g", what, (long long)e,
                 xmp_f32(y)[e], buf[e]);
            break;
        }
    free(buf);
    xmesh_plan_destroy(plan);
}

static int enum_sbps(int nd, xmp_sbp_t *out)
{
    int k = 0;
    out[k++] = xmp_sbp_b();
    out[k++] = xmp_sbp_p();
    for (int d = 0; d < nd; d++)
        out[k++] = xmp_sbp_s(d);
    return k;
}

static int g_cases;

static void run_pair(xmp_mesh_t *m, int nd, const int64_t *shape, const xmp_sbp_t *src,
                     const xmp_sbp_t *dst, int with_xmesh)
{
    char what[160], s1[64], s2[64];
    int64_t n = 1;
    for (int d = 0; d < nd; d++)
        n *= shape[d];
    xmp_sbp_string(src, m->ndim, s1, sizeof s1);
    xmp_sbp_string(dst, m->ndim, s2, sizeof s2);
    snprintf(what, sizeof what, "mesh %dx%d shape (%lld,%lld,%lld) %s -> %s", m->shape[0],
             m->ndim > 1 ? m->shape[1] : 1, (long long)shape[0], (long long)shape[1],
             nd > 2 ? (long long)shape[2] : 0LL, s1, s2);
    float *F = malloc(sizeof(float) * (size_t)(n + 1));
    xmp_tensor_t x, y, dy, dx;
    uint64_t tag = (uint64_t)g_cases++ * 2;
    if (xmp_tensor_alloc(&x, m, nd, shape, XMESH_F32, src)) {
        FAIL("%s: alloc: %s", what, xmp_last_error());
        return;
    }
    fill_src(&x, tag);
    make_full(m, src, n, tag, F);
    if (xmp_box(&x, dst, &y)) {
        FAIL("%s: xmp_box: %s", what, xmp_last_error());
    } else {
        check_against_full(&y, F, what);
        for (int a = 0; a < m->ndim && m->member; a++) /* B -> P: holder is coordinate 0 */
            if (src[a].kind == XMP_B && dst[a].kind == XMP_P && m->coord[a] != 0)
                for (int64_t e = 0; e < y.lcount; e++)
                    if (xmp_f32(&y)[e] != 0.0f) {
                        FAIL("%s: non-holder (axis %d coord %d) holds %g", what, a, m->coord[a],
                             xmp_f32(&y)[e]);
                        break;
                    }
        int dst_p = 0;
        for (int a = 0; a < m->ndim; a++)
            dst_p |= dst[a].kind == XMP_P;
        if (!dst_p && with_xmesh)
            check_xmesh(&x, &y, what);
        /* backward: dy has the gradient SBP of dst; dx must equal it globally
         * with the gradient SBP of src */
        xmp_sbp_t g[4];
        for (int a = 0; a < m->ndim; a++)
            g[a] = xmp_sbp_grad(dst[a]);
        xmp_tensor_alloc(&dy, m, nd, shape, XMESH_F32, g);
        fill_src(&dy, tag + 1);
        make_full(m, g, n, tag + 1, F);
        strncat(what, " (backward)", sizeof what - strlen(what) - 1);
        if (xmp_box_backward(&dy, src, &dx)) {
            FAIL("%s: %s", what, xmp_last_error());
        } else {
            for (int a = 0; a < m->ndim; a++)
                if (!xmp_sbp_eq(dx.sbp[a], xmp_sbp_grad(src[a])))
                    FAIL("%s: dx SBP %s on axis %d", what, dx.spec, a);
            check_against_full(&dx, F, what);
            xmp_tensor_free(&dx);
        }
        xmp_tensor_free(&dy);
        xmp_tensor_free(&y);
    }
    xmp_tensor_free(&x);
    free(F);
}

static void run_mesh(int ndim, const int *shape, const int *ranks)
{
    xmp_mesh_t *m;
    if (xmp_mesh_create(MPI_COMM_WORLD, g_ctx, ndim, shape, ranks, &m)) {
        FAIL("mesh create: %s", xmp_last_error());
        return;
    }
    if (m->member) { /* axis communicators: size, order, membership */
        for (int a = 0; a < ndim; a++) {
            int r, s, *idx = malloc(sizeof(int) * (size_t)shape[a]);
            MPI_Comm_rank(m->axis[a], &r);
            MPI_Comm_size(m->axis[a], &s);
            if (r != m->coord[a] || s != shape[a])
                FAIL("axis %d comm: rank %d size %d, coord %d shape %d", a, r, s, m->coord[a],
                     shape[a]);
            MPI_Allgather(&m->index, 1, MPI_INT, idx, 1, MPI_INT, m->axis[a]);
            for (int j = 0; j < s; j++) {
                int c[4];
                coords_of(m->shape, ndim, idx[j], c);
                for (int b = 0; b < ndim; b++)
                    if ((b == a && c[b] != j) || (b != a && c[b] != m->coord[b]))
                        FAIL("axis %d comm member %d has index %d", a, j, idx[j]);
            }
            free(idx);
        }
    }
    int64_t shapes[4][3] = {{5, 7, 0}, {3, 4, 5}, {1, 3, 0}, {2, 1, 6}};
    int nds[4] = {2, 3, 2, 3};
    xmp_sbp_t opts[6], src[2], dst[2];
    for (int s = 0; s < 4; s++) {
        int nd = nds[s], k = enum_sbps(nd, opts);
        if (ndim == 1) {
            for (int i = 0; i < k; i++)
                for (int j = 0; j < k; j++)
                    run_pair(m, nd, shapes[s], &opts[i], &opts[j], 1);
        } else if (s < 2) { /* 2-D: every pair of full signatures, xmesh on every 3rd */
            int cnt = 0;
            for (int i = 0; i < k * k; i++)
                for (int j = 0; j < k * k; j++) {
                    src[0] = opts[i / k];
                    src[1] = opts[i % k];
                    dst[0] = opts[j / k];
                    dst[1] = opts[j % k];
                    run_pair(m, nd, shapes[s], src, dst, cnt++ % 3 == 0);
                }
        }
    }
    /* bad input: names the value, y untouched */
    int64_t sh[2] = {5, 7};
    xmp_tensor_t x, y;
    xmp_sbp_t bad[4];
    memset(&y, 0x5a, sizeof y);
    xmp_tensor_t ycopy = y;
    for (int a = 0; a < ndim; a++)
        bad[a] = xmp_sbp_b();
    xmp_tensor_alloc(&x, m, 2, sh, XMESH_F32, bad);
    bad[ndim - 1] = xmp_sbp_s(5);
    if (xmp_box(&x, bad, &y) != XMESH_ERR_INVALID_ARGUMENT || !strstr(xmp_last_error(), "S(5)") ||
        memcmp(&y, &ycopy, sizeof y))
        FAIL("bad split dim: '%s'", xmp_last_error());
    bad[ndim - 1].kind = (xmp_sbp_kind_t)7;
    if (xmp_box(&x, bad, &y) != XMESH_ERR_INVALID_ARGUMENT || !strstr(xmp_last_error(), "kind 7"))
        FAIL("bad kind: '%s'", xmp_last_error());
    xmp_tensor_free(&x);
    if (xmp_mesh_destroy(m))
        FAIL("mesh destroy: %s", xmp_last_error());
}

int main(int argc, char **argv)
{
    int provided, size;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--seed"))
            g_seed = strtoull(argv[i + 1], NULL, 0);
    if (g_rank == 0)
        printf("test_boxing: %d ranks, seed %llu (replay: --seed %llu)\n", size,
               (unsigned long long)g_seed, (unsigned long long)g_seed);
    if (xmesh_ctx_create_mpi(MPI_COMM_WORLD, NULL, &g_ctx)) {
        fprintf(stderr, "ctx: %s\n", xmesh_last_error());
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int all[6] = {0, 1, 2, 3, 4, 5};
    if (size == 2 || size == 3) {
        run_mesh(1, &size, all);
    } else if (size == 4) {
        int s22[2] = {2, 2}, s3 = 3, r3[3] = {3, 1, 2};
        run_mesh(2, s22, all);
        run_mesh(1, &s3, r3); /* rank 0 outside, devices out of rank order */
    } else if (size == 6) {
        int s23[2] = {2, 3}, s32[2] = {3, 2};
        run_mesh(2, s23, all);
        run_mesh(2, s32, all);
    }
    int fails = 0;
    MPI_Allreduce(&g_fail, &fails, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (g_rank == 0)
        printf("test_boxing: %d cases, %s (%d failures)\n", g_cases, fails ? "FAILED" : "ok",
               fails);
    xmesh_ctx_destroy(g_ctx);
    MPI_Finalize();
    return fails ? 1 : 0;
}
