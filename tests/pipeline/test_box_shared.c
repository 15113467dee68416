/* Boxing where two or more mesh axes split the same tensor dim ("shared split", sbp.h design
 * note) on meshes of 2, 3 and 4 axes with uneven axis sizes and uneven tensor sizes:
 *  - every element of xmp_box (and of xmp_box_start/xmp_box_test/xmp_box_wait, which must be
 *    bitwise equal to it) against blocks cut from the global array with this file's own index
 *    math, for random source/destination SBPs that favour one shared dim;
 *  - bytes: for every change of ONE mesh axis a (size p), the ring-equivalent bytes summed over
 *    all ranks (xmp_comm_counts) equal the analytic minimum computed here from the blocks
 *    alone, with X_r / Y_r rank r's source / destination block:
 *      P -> B     sum_r 2 (p-1)/p |X_r|                   (all-reduce over axis a)
 *      P -> S(d)  sum_r ((p-1) |Y_r| + |Y_r \ X_r|)         (each element needs the p-1
 *                 partials its holder lacks, plus its own when the holder's X lacks it)
 *      S(d) -> P  sum_r |X_r \ G_r|, G_r = Y_r             (what cannot be placed locally)
 *      B -> P     0
 *      otherwise  sum_r |Y_r \ X_r|                         (what each rank lacks)
 *    times 4 bytes; and at most one collective call per rank for the step.
 * Usage: test_box_shared [--seed S] [--cases N]. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xmesh/mpi.h>

#include "nn/overlap.h"
#include "nn/sbp.h"

#include "boxing_check.h"

static int64_t vol_box(int nd, const int64_t *lo, const int64_t *hi)
{
    int64_t v = 1;
    for (int d = 0; d < nd; d++)
        v *= hi[d] > lo[d] ? hi[d] - lo[d] : 0;
    return v;
}

/* |A \ B| for boxes A, B. */
static int64_t minus(int nd, const int64_t *alo, const int64_t *ahi, const int64_t *blo,
                     const int64_t *bhi)
{
    int64_t ilo[8], ihi[8];
    for (int d = 0; d < nd; d++) {
        ilo[d] = alo[d] > blo[d] ? alo[d] : blo[d];
        ihi[d] = ahi[d] < bhi[d] ? ahi[d] : bhi[d];
    }
    return vol_box(nd, alo, ahi) - vol_box(nd, ilo, ihi);
}

/* Analytic minimum of the ring-equivalent bytes, summed over all ranks, of changing axis a. */
static double min_bytes(const xmp_mesh_t *m, int nd, const int64_t *shape, const xmp_sbp_t *src,
                        const xmp_sbp_t *dst, int a)
{
    double tot = 0, p = m->shape[a];
    xmp_sbp_t f = src[a], t = dst[a];
    for (int i = 0; i < m->size; i++) {
        int c[4];
        int64_t xlo[8], xhi[8], ylo[8], yhi[8];
        coords_of(m->shape, m->ndim, i, c);
        ref_block(m->shape, m->ndim, src, c, nd, shape, xlo, xhi);
        ref_block(m->shape, m->ndim, dst, c, nd, shape, ylo, yhi);
        double X = (double)vol_box(nd, xlo, xhi), Y = (double)vol_box(nd, ylo, yhi);
        if (f.kind == XMP_P && t.kind == XMP_B)
            tot += 2 * (p - 1) / p * X;
        else if (f.kind == XMP_P)
            tot += (p - 1) * Y + (double)minus(nd, ylo, yhi, xlo, xhi);
        else if (t.kind == XMP_P)
            tot += f.kind == XMP_B ? 0 : (double)minus(nd, xlo, xhi, ylo, yhi);
        else
            tot += (double)minus(nd, ylo, yhi, xlo, xhi);
    }
    return tot * 4;
}

static int g_cases, g_byte_cases, g_shared_cases;

static void sbp_str(const xmp_sbp_t *s, int n, char *buf)
{
    xmp_sbp_string(s, n, buf, 64);
}

static void run_case(xmp_mesh_t *m, int nd, const int64_t *shape, const xmp_sbp_t *src,
                     const xmp_sbp_t *dst)
{
    char what[200], s1[64], s2[64];
    int64_t n = 1;
    for (int d = 0; d < nd; d++)
        n *= shape[d];
    sbp_str(src, m->ndim, s1);
    sbp_str(dst, m->ndim, s2);
    snprintf(what, sizeof what, "mesh %dx%dx%dx%d (%d axes) shape (%lld,%lld,%lld) %s -> %s",
             m->shape[0], m->ndim > 1 ? m->shape[1] : 1, m->ndim > 2 ? m->shape[2] : 1,
             m->ndim > 3 ? m->shape[3] : 1, m->ndim, (long long)shape[0], (long long)shape[1],
             nd > 2 ? (long long)shape[2] : 0LL, s1, s2);
    int changed = 0, ca = -1, shared = 0;
    for (int a = 0; a < m->ndim; a++)
        if (!xmp_sbp_eq(src[a], dst[a])) {
            changed++;
            ca = a;
        }
    for (int a = 0; a < m->ndim; a++)
        for (int b = 0; b < m->ndim; b++)
            if (a != b &&
                ((src[a].kind == XMP_S && src[b].kind == XMP_S && src[a].dim == src[b].dim) ||
                 (dst[a].kind == XMP_S && dst[b].kind == XMP_S && dst[a].dim == dst[b].dim)))
                shared = 1;
    g_shared_cases += shared;
    float *F = malloc(sizeof(float) * (size_t)(n + 1));
    xmp_tensor_t x, y, y2;
    uint64_t tag = (uint64_t)g_cases++ * 2;
    if (xmp_tensor_alloc(&x, m, nd, shape, XMESH_F32, src)) {
        FAIL("%s: alloc: %s", what, xmp_last_error());
        free(F);
        return;
    }
    fill_src(&x, tag);
    make_full(m, src, n, tag, F);
    xmp_comm_counts_t c0, c1;
    xmp_comm_counts(&c0);
    if (xmp_box(&x, dst, &y)) {
        FAIL("%s: xmp_box: %s", what, xmp_last_error());
        xmp_tensor_free(&x);
        free(F);
        return;
    }
    xmp_comm_counts(&c1);
    check_against_full(&y, F, what);
    if (changed == 1 && m->member) {
        double mine = 0, all = 0;
        int64_t calls = 0;
        for (int k = 0; k < XMP_COLL_NKINDS; k++) {
            mine += c1.bytes[k] - c0.bytes[k];
            calls += c1.calls[k] - c0.calls[k];
        }
        MPI_Allreduce(&mine, &all, 1, MPI_DOUBLE, MPI_SUM, m->comm);
        double want = min_bytes(m, nd, shape, src, dst, ca);
        if (fabs(all - want) > 1e-6 * (1 + want))
            FAIL("%s: axis %d: %.1f bytes over all ranks, analytic minimum %.1f", what, ca, all,
                 want);
        if (calls > 1)
            FAIL("%s: axis %d: %lld collective calls on this rank, want at most 1", what, ca,
                 (long long)calls);
        g_byte_cases++;
    }
    /* nonblocking boxing: bitwise the blocking result */
    xmp_box_req_t *q = NULL;
    int done = 0;
    if (xmp_box_start(&x, dst, &q)) {
        FAIL("%s: xmp_box_start: %s", what, xmp_last_error());
    } else {
        for (int i = 0; i < 8 && !done; i++)
            if (xmp_box_test(q, &done))
                FAIL("%s: xmp_box_test: %s", what, xmp_last_error());
        if (xmp_box_wait(q, &y2)) {
            FAIL("%s: xmp_box_wait: %s", what, xmp_last_error());
        } else {
            if (y2.lcount != y.lcount ||
                (y.lcount && memcmp(y2.data, y.data, sizeof(float) * (size_t)y.lcount)))
                FAIL("%s: xmp_box_start/wait differs from xmp_box", what);
            xmp_tensor_free(&y2);
        }
    }
    xmp_tensor_free(&y);
    xmp_tensor_free(&x);
    free(F);
}

static uint64_t g_rng;
static int urand(int k)
{
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (int)((g_rng >> 33) % (uint64_t)k);
}

/* Random SBP that favours S(d0) on several axes. */
static xmp_sbp_t pick(int nd, int d0, int allow_p)
{
    int r = urand(10);
    if (r < 4)
        return xmp_sbp_s(d0);
    if (r < 6)
        return xmp_sbp_s(urand(nd));
    if (r < 8 || !allow_p)
        return xmp_sbp_b();
    return xmp_sbp_p();
}

static void run_mesh(int ndim, const int *shape, int ncases)
{
    int ranks[8];
    int size = 1;
    for (int a = 0; a < ndim; a++)
        size *= shape[a];
    for (int i = 0; i < size; i++)
        ranks[i] = i;
    xmp_mesh_t *m;
    if (xmp_mesh_create(MPI_COMM_WORLD, g_ctx, ndim, shape, ranks, &m)) {
        FAIL("mesh create: %s", xmp_last_error());
        return;
    }
    /* even sizes (divisible by every product of axis sizes up to 8) and uneven ones */
    int64_t shapes[4][3] = {{8, 16, 8}, {7, 5, 3}, {5, 9, 2}, {3, 1, 11}};
    for (int k = 0; k < ncases; k++) {
        int s = k % 4, nd = 3, d0 = urand(nd);
        xmp_sbp_t src[4], dst[4];
        for (int a = 0; a < ndim; a++)
            src[a] = pick(nd, d0, 1);
        if (k % 2 == 0) { /* one axis changes: the byte check */
            memcpy(dst, src, sizeof dst);
            int a = urand(ndim);
            do
                dst[a] = pick(nd, d0, 1);
            while (xmp_sbp_eq(dst[a], src[a]));
        } else {
            for (int a = 0; a < ndim; a++)
                dst[a] = pick(nd, d0, 1);
        }
        run_case(m, nd, shapes[s], src, dst);
    }
    /* the 3-D matmul's boxes (issue 20): fixed cases, both axis orders */
    static const char *fixed[][2] = {
        {"S(0),S(2),P", "S(0),S(2),S(2)"},    {"S(0),P,S(2)", "S(0),S(2),S(2)"},
        {"S(0),S(2),S(2)", "S(0),S(2),B"},    {"S(0),S(2),S(2)", "S(0),B,S(2)"},
        {"S(0),S(1),S(2)", "S(0),S(1),S(1)"}, {"S(0),S(2),S(1)", "S(0),S(1),S(1)"},
        {"P,S(0),S(1)", "S(0),S(0),S(1)"},    {"S(0),S(0),S(1)", "B,S(0),S(1)"},
        {"S(0),S(0),S(1)", "P,S(0),S(1)"},    {"S(2),S(2),S(2)", "S(2),P,S(2)"}};
    if (ndim == 3)
        for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
            for (int s = 0; s < 2; s++) {
                xmp_sbp_t src[4], dst[4];
                if (xmp_sbp_parse(fixed[i][0], 3, 3, src) ||
                    xmp_sbp_parse(fixed[i][1], 3, 3, dst)) {
                    FAIL("parse %s: %s", fixed[i][0], xmp_last_error());
                    continue;
                }
                int64_t sh[2][3] = {{8, 16, 8}, {6, 7, 5}};
                run_case(m, 3, sh[s], src, dst);
            }
    if (xmp_mesh_destroy(m))
        FAIL("mesh destroy: %s", xmp_last_error());
}

int main(int argc, char **argv)
{
    int provided, size, ncases = 60;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    for (int i = 1; i + 1 < argc; i++) {
        if (!strcmp(argv[i], "--seed"))
            g_seed = strtoull(argv[i + 1], NULL, 0);
        if (!strcmp(argv[i], "--cases"))
            ncases = atoi(argv[i + 1]);
    }
    g_rng = g_seed;
    if (g_rank == 0)
        printf("test_box_shared: %d ranks, seed %llu (replay: --seed %llu)\n", size,
               (unsigned long long)g_seed, (unsigned long long)g_seed);
    if (xmesh_ctx_create_mpi(MPI_COMM_WORLD, NULL, &g_ctx)) {
        fprintf(stderr, "ctx: %s\n", xmesh_last_error());
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    if (size == 8) {
        int m24[2] = {2, 4}, m42[2] = {4, 2}, m222[3] = {2, 2, 2}, m2122[4] = {2, 1, 2, 2},
            m2222[4] = {2, 2, 2, 1};
        run_mesh(2, m24, ncases);
        run_mesh(2, m42, ncases);
        run_mesh(3, m222, ncases);
        run_mesh(4, m2122, ncases);
        run_mesh(4, m2222, ncases);
    } else if (size == 6) {
        int m23[2] = {2, 3}, m132[3] = {1, 3, 2}, m213[3] = {2, 1, 3}, m1231[4] = {1, 2, 3, 1};
        run_mesh(2, m23, ncases);
        run_mesh(3, m132, ncases);
        run_mesh(3, m213, ncases);
        run_mesh(4, m1231, ncases);
    } else if (size == 4) {
        int m22[2] = {2, 2}, m122[3] = {1, 2, 2}, m2112[4] = {2, 1, 1, 2};
        run_mesh(2, m22, ncases);
        run_mesh(3, m122, ncases);
        run_mesh(4, m2112, ncases);
    }
    int fails = 0, cases = 0;
    MPI_Allreduce(&g_fail, &fails, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(&g_cases, &cases, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (g_rank == 0)
        printf("test_box_shared: %d cases (%d shared splits, %d byte checks on rank 0), %s (%d "
               "failures)\n",
               cases, g_shared_cases, g_byte_cases, fails ? "FAILED" : "ok", fails);
    xmesh_ctx_destroy(g_ctx);
    MPI_Finalize();
    return fails || cases == 0 ? 1 : 0;
}
