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

#include "boxing_check.h"

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
