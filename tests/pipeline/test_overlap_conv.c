/* The convolution forms of the overlap switches (nn/overlap.h (a') and (e')) against the
 * blocking path, every element, on meshes of 1 to 4 axes with random SBPs (the U-Transformer's
 * convs, issue 20 item 4):
 *   xmp_conv2d_backward_ov (bwd-input on)  == xmp_conv2d_backward_input + xmp_box(dx_sbp),
 *                                             xmp_conv2d_backward_weight (bitwise)
 *   xmp_conv2d_forward_box (coll-matmul on) == xmp_conv2d_forward + xmp_box(dst), and the SBP the
 *                                             convolution produced (was); bitwise on one BLAS
 *                                             thread (each output element the same sum)
 * Trials whose SBPs a convolution refuses must be refused by both paths. The test also counts
 * the forward trials that really ran in pieces and fails when there are none.
 * Usage: test_overlap_conv [--seed S] [--break] (--break corrupts one overlapped result on
 * purpose: the test must then fail). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/overlap.h"
#include "nn/sbp_conv.h"
#include "nn/sbp_ops.h"
#include "sbp_test_util.h"

static int g_break;
static uint64_t g_seed = 1357;

static void corrupt(xmp_tensor_t *t)
{
    if (g_break && t->lcount)
        xmp_f32(t)[t->lcount - 1] += 1e-3f;
}

/* One conv trial's shapes: x (N, C, H, W), w (O, C, 3, 3), stride 1 or 2. */
typedef struct {
    int64_t xs[4], ws[4];
    int stride;
} shp_t;

static void rand_shape(shp_t *s)
{
    static const int64_t nb[] = {4, 8, 6, 3};
    s->xs[0] = nb[irand(4)];
    s->xs[1] = 2 + 2 * irand(3);
    s->xs[2] = s->xs[3] = 4 + 2 * irand(2);
    s->ws[0] = 2 + 2 * irand(3);
    s->ws[1] = s->xs[1];
    s->ws[2] = s->ws[3] = 3;
    s->stride = 1 + irand(2);
}

static void test_backward(xmp_mesh_t *m, int trials)
{
    xmp_overlap_t on = {1, 0, 0, 0};
    int ran = 0;
    for (int t = 0; t < trials; t++) {
        shp_t s;
        rand_shape(&s);
        xmp_sbp_t sx[XMP_MAX_MESH_DIMS], sw[XMP_MAX_MESH_DIMS], dxs[XMP_MAX_MESH_DIMS];
        rand_sbp(m, 2, 0, sx);
        rand_sbp(m, 2, 0, sw);
        rand_sbp(m, 2, 0, dxs);
        xmp_tensor_t x = {0}, w = {0}, y = {0}, dy = {0};
        rand_tensor(&x, m, 4, s.xs, sx);
        rand_tensor(&w, m, 4, s.ws, sw);
        if (xmp_conv2d_forward(&x, &w, NULL, s.stride, 1, &y) != XMESH_SUCCESS) {
            xmp_tensor_free(&x), xmp_tensor_free(&w);
            continue; /* a layout the convolution refuses (the same on every rank) */
        }
        rand_tensor(&dy, m, 4, y.shape, y.sbp);
        int wsbp = irand(2); /* dx boxed to a given SBP, or left as produced */
        xmp_tensor_t raw = {0}, rdx = {0}, rdw = {0}, rdb = {0}, gdx = {0}, gdw = {0}, gdb = {0};
        OK(xmp_conv2d_backward_input(&dy, &x, &w, s.stride, 1, &raw));
        if (wsbp)
            OK(xmp_box(&raw, dxs, &rdx));
        OK(xmp_conv2d_backward_weight(&dy, &x, &w, s.stride, 1, &rdw, &rdb));
        OK(xmp_conv2d_backward_ov(&on, &dy, &x, &w, s.stride, 1, wsbp ? dxs : NULL, &gdx, &gdw,
                                  &gdb));
        if (t == trials / 2)
            corrupt(&gdx);
        same(wsbp ? &rdx : &raw, &gdx, "conv backward dx", t);
        same(&rdw, &gdw, "conv backward dw", t);
        same(&rdb, &gdb, "conv backward db", t);
        ran++;
        xmp_tensor_t *all[] = {&x, &w, &y, &dy, &raw, &rdx, &rdw, &rdb, &gdx, &gdw, &gdb};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            xmp_tensor_free(all[i]);
    }
    if (!ran)
        FAIL("conv backward: no trial ran (every layout refused)");
}

/* Returns the number of trials that ran in pieces. */
static int test_forward(xmp_mesh_t *m, int trials)
{
    xmp_overlap_t on = {0, 0, 0, 1};
    int pieces = 0;
    for (int t = 0; t < trials; t++) {
        shp_t s;
        rand_shape(&s);
        xmp_sbp_t sx[XMP_MAX_MESH_DIMS], sw[XMP_MAX_MESH_DIMS], dst[XMP_MAX_MESH_DIMS];
        /* the U-Transformer's forms: x split on images or channels, w on out or in channels */
        rand_sbp(m, 2, 0, sx);
        rand_sbp(m, 2, 0, sw);
        rand_sbp(m, 2, 0, dst);
        xmp_tensor_t x = {0}, w = {0}, b = {0}, y = {0}, ref = {0}, got = {0};
        rand_tensor(&x, m, 4, s.xs, sx);
        rand_tensor(&w, m, 4, s.ws, sw);
        xmp_sbp_t bs[XMP_MAX_MESH_DIMS];
        for (int a = 0; a < XMP_MAX_MESH_DIMS; a++)
            bs[a] = a < m->ndim && sw[a].kind == XMP_S && sw[a].dim == 0 ? sw[a] : xmp_sbp_b();
        rand_tensor(&b, m, 1, s.ws, bs);
        xmesh_result_t r0 = xmp_conv2d_forward(&x, &w, &b, s.stride, 1, &y);
        if (!r0)
            r0 = xmp_box(&y, dst, &ref);
        xmp_sbp_t was[XMP_MAX_MESH_DIMS];
        memset(was, 0, sizeof was);
        xmesh_result_t r1 = xmp_conv2d_forward_box(&on, &x, &w, &b, s.stride, 1, dst, was, &got);
        if (!r0 != !r1) {
            FAIL("conv forward box trial %d: blocking path %d, overlapped path %d (%s)", t, r0, r1,
                 xmp_last_error());
        } else if (!r0) {
            if (t == trials / 2)
                corrupt(&got);
            same(&ref, &got, "conv forward box", t);
            for (int a = 0; a < m->ndim; a++)
                if (!xmp_sbp_eq(was[a], y.sbp[a]))
                    FAIL("conv forward box trial %d: was differs on axis %d", t, a);
            /* did it run in pieces? (dim 0 kept split the same way, 2 pieces per block fit) */
            int64_t sp = 1;
            int keep = 1;
            for (int a = 0; a < m->ndim; a++) {
                int i0 = x.sbp[a].kind == XMP_S && x.sbp[a].dim == 0;
                int y0 = y.sbp[a].kind == XMP_S && y.sbp[a].dim == 0;
                int d0 = dst[a].kind == XMP_S && dst[a].dim == 0;
                sp *= i0 ? m->shape[a] : 1;
                keep &= i0 == y0 && y0 == d0;
            }
            pieces += keep && s.xs[0] % (2 * sp) == 0;
        }
        xmp_tensor_t *all[] = {&x, &w, &b, &y, &ref, &got};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            xmp_tensor_free(all[i]);
    }
    return pieces;
}

int main(int argc, char **argv)
{
    int n = sbp_test_start(&argc, &argv, "test_overlap_conv", &g_seed, &g_break);
    /* meshes of 1..4 axes whose sizes multiply to n */
    int shapes[6][4], ns = 0, nd[6];
    shapes[ns][0] = n, nd[ns++] = 1;
    for (int f = 2; f < n && ns < 3; f++)
        if (n % f == 0) {
            shapes[ns][0] = f, shapes[ns][1] = n / f, nd[ns++] = 2;
            shapes[ns][0] = n / f, shapes[ns][1] = 1, shapes[ns][2] = f, nd[ns++] = 3;
        }
    if (n == 8)
        shapes[ns][0] = shapes[ns][1] = shapes[ns][2] = 2, nd[ns++] = 3;
    shapes[ns][0] = 1, shapes[ns][1] = n, shapes[ns][2] = 1, shapes[ns][3] = 1, nd[ns++] = 4;
    int *ranks = malloc(sizeof(int) * (size_t)n), pieces = 0;
    for (int i = 0; i < n; i++)
        ranks[i] = i;
    for (int s = 0; s < ns && !g_fail; s++) {
        xmp_mesh_t *m;
        OK(xmp_mesh_create(MPI_COMM_WORLD, NULL, nd[s], shapes[s], ranks, &m));
        if (g_fail)
            break;
        test_backward(m, 12);
        pieces += test_forward(m, 12);
        xmp_mesh_destroy(m);
    }
    free(ranks);
    if (!pieces)
        FAIL("no forward trial ran in pieces");
    int bad = g_fail, any;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (g_rank == 0)
        printf("test_overlap_conv: %s (%d meshes, %d forward trials in pieces)\n",
               any ? "FAILED" : "OK", ns, pieces);
    MPI_Finalize();
    return any ? 1 : 0;
}
