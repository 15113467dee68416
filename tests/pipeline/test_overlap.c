/* Overlap inside a stage (nn/overlap.h): nonblocking boxing equals xmp_box element by element
 * (bitwise) for random SBP pairs on 1- to 4-axis meshes, several requests in flight at once,
 * the input changed after the start; each overlap switch on gives the same bits as off (linear
 * backward, deferred gradient queue, prefetch); switch parsing. Usage: test_overlap [--seed S]
 * [--break] (--break corrupts one nonblocking result on purpose: the test must fail). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/overlap.h"
#include "nn/sbp_ops.h"
#include "sbp_test_util.h"

static int g_break;
static uint64_t g_seed = 2468;

static void busy(void)
{
    volatile double s = 0;
    for (int i = 0; i < 20000; i++)
        s += i * 1e-9;
}

static void test_box(xmp_mesh_t *m, int trials)
{
    for (int t = 0; t < trials; t++) {
        int nd = 1 + irand(3), k = 1 + irand(3);
        int64_t shape[3];
        for (int d = 0; d < nd; d++)
            shape[d] = irand(7); /* uneven, empty blocks included */
        xmp_tensor_t x[3], ref[3], got[3];
        xmp_sbp_t dst[3][XMP_MAX_MESH_DIMS];
        xmp_box_req_t *req[3];
        for (int i = 0; i < k; i++) {
            xmp_sbp_t s[XMP_MAX_MESH_DIMS];
            rand_sbp(m, nd, 1, s);
            rand_sbp(m, nd, 1, dst[i]);
            rand_tensor(&x[i], m, nd, shape, s);
            OK(xmp_box(&x[i], dst[i], &ref[i]));
        }
        for (int i = 0; i < k; i++)
            OK(xmp_box_start(&x[i], dst[i], &req[i]));
        for (int i = 0; i < k; i++) { /* the input may change after the start */
            for (int64_t e = 0; e < x[i].lcount; e++)
                xmp_f32(&x[i])[e] = -7.f;
        }
        for (int r = 0; r < 3; r++) {
            busy();
            for (int i = 0; i < k; i++) {
                int done;
                OK(xmp_box_test(req[i], &done));
            }
        }
        int rev = irand(2);
        for (int j = 0; j < k; j++) { /* wait in start order or reversed (same on all ranks) */
            int i = rev ? k - 1 - j : j;
            OK(xmp_box_wait(req[i], &got[i]));
        }
        for (int i = 0; i < k; i++) {
            static int broken;
            if (g_break && !broken && got[i].lcount) {
                xmp_f32(&got[i])[0] += 1.f;
                broken = 1;
            }
            same(&got[i], &ref[i], "xmp_box_start/wait vs xmp_box", t);
            xmp_tensor_free(&x[i]);
            xmp_tensor_free(&ref[i]);
            xmp_tensor_free(&got[i]);
        }
    }
}

static void test_linear(xmp_mesh_t *m, int trials)
{
    for (int t = 0; t < trials; t++) {
        int64_t xs[2] = {1 + irand(6), 1 + irand(6)}, ws[2] = {1 + irand(6), xs[1]};
        xmp_sbp_t sx[XMP_MAX_MESH_DIMS], sw[XMP_MAX_MESH_DIMS], gx[XMP_MAX_MESH_DIMS];
        rand_sbp(m, 2, 0, sx);
        rand_sbp(m, 2, 0, sw);
        for (int a = 0; a < XMP_MAX_MESH_DIMS; a++)
            gx[a] = xmp_sbp_grad(sx[a]);
        xmp_tensor_t x, w, b, y, dy;
        int64_t bs[1] = {ws[0]};
        xmp_sbp_t sb[XMP_MAX_MESH_DIMS];
        for (int a = 0; a < XMP_MAX_MESH_DIMS; a++)
            sb[a] = xmp_sbp_b();
        rand_tensor(&x, m, 2, xs, sx);
        rand_tensor(&w, m, 2, ws, sw);
        rand_tensor(&b, m, 1, bs, sb);
        OK(xmp_linear_forward(&x, &w, &b, &y));
        xmp_sbp_t sdy[XMP_MAX_MESH_DIMS];
        for (int a = 0; a < XMP_MAX_MESH_DIMS; a++)
            sdy[a] = xmp_sbp_grad(y.sbp[a]);
        rand_tensor(&dy, m, 2, y.shape, sdy);
        xmp_overlap_t off = {0, 0, 0, 0}, on = {1, 0, 0, 0};
        xmp_tensor_t dx0, dw0, db0, dx1, dw1, db1;
        OK(xmp_linear_backward_ov(&off, &dy, &x, &w, gx, &dx0, &dw0, &db0));
        OK(xmp_linear_backward_ov(&on, &dy, &x, &w, gx, &dx1, &dw1, &db1));
        if (g_break && t == 0 && dx1.lcount)
            xmp_f32(&dx1)[0] += 1.f;
        same(&dx1, &dx0, "bwd-input dx", t);
        same(&dw1, &dw0, "bwd-input dw", t);
        same(&db1, &db0, "bwd-input db", t);
        /* (b) deferred gradient reductions: dW, db to B (or S(0)) in a queue */
        xmp_sbp_t gd[XMP_MAX_MESH_DIMS];
        for (int a = 0; a < XMP_MAX_MESH_DIMS; a++)
            gd[a] = a < m->ndim && irand(2) ? xmp_sbp_s(0) : xmp_sbp_b();
        xmp_overlap_t dg = {0, 1, 0, 0};
        xmp_gradq_t *q0, *q1;
        OK(xmp_gradq_create(&off, &q0));
        OK(xmp_gradq_create(&dg, &q1));
        OK(xmp_gradq_add(q0, &dw0, gd));
        OK(xmp_gradq_add(q0, &db0, gd));
        OK(xmp_gradq_add(q1, &dw1, gd));
        OK(xmp_gradq_add(q1, &db1, gd));
        busy();
        OK(xmp_gradq_progress(q1));
        OK(xmp_gradq_finish(q0));
        OK(xmp_gradq_finish(q1));
        xmp_gradq_destroy(q0);
        xmp_gradq_destroy(q1);
        same(&dw1, &dw0, "defer-grad dw", t);
        same(&db1, &db0, "defer-grad db", t);
        /* (c) prefetch: w kept S(0) on every axis, used as it was */
        xmp_sbp_t shard[XMP_MAX_MESH_DIMS];
        for (int a = 0; a < XMP_MAX_MESH_DIMS; a++)
            shard[a] = xmp_sbp_s(0);
        xmp_tensor_t ws0, wu0, wu1;
        OK(xmp_box(&w, shard, &ws0));
        xmp_overlap_t pf = {0, 0, 1, 0};
        xmp_prefetch_t *p0, *p1;
        OK(xmp_prefetch_start(&off, &ws0, sw, &p0));
        OK(xmp_prefetch_start(&pf, &ws0, sw, &p1));
        busy();
        OK(xmp_prefetch_get(p0, &wu0));
        OK(xmp_prefetch_get(p1, &wu1));
        same(&wu1, &wu0, "prefetch", t);
        same(&wu1, &w, "prefetch vs the unsharded weight", t);
        xmp_tensor_t *all[] = {&x,   &w,   &b,   &y,   &dy,  &dx0, &dw0,
                               &db0, &dx1, &dw1, &db1, &ws0, &wu0, &wu1};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++)
            xmp_tensor_free(all[i]);
    }
}

/* (d) collective matmul on vs off, every mesh axis as the sharding axis. */
static void test_cm(xmp_mesh_t *m, int trials)
{
    for (int t = 0; t < trials; t++) {
        int axis = irand(m->ndim);
        int64_t xs[3] = {1 + irand(4), 1 + irand(5), 1 + irand(7)};
        int64_t ws[2] = {irand(9), xs[2]}, bs[1] = {ws[0]};
        xmp_sbp_t sx[XMP_MAX_MESH_DIMS], sw[XMP_MAX_MESH_DIMS], sb[XMP_MAX_MESH_DIMS];
        rand_sbp(m, 3, 0, sx);
        for (int a = 0; a < XMP_MAX_MESH_DIMS; a++) {
            sw[a] = a == axis ? xmp_sbp_s(0) : irand(2) ? xmp_sbp_s(1) : xmp_sbp_b();
            sb[a] = xmp_sbp_b();
        }
        xmp_tensor_t x, w, b, y0, y1;
        rand_tensor(&x, m, 3, xs, sx);
        rand_tensor(&w, m, 2, ws, sw);
        rand_tensor(&b, m, 1, bs, sb);
        xmp_overlap_t off = {0, 0, 0, 0}, on = {0, 0, 0, 1};
        int bias = irand(2);
        OK(xmp_linear_forward_cm(&off, &x, &w, axis, bias ? &b : NULL, &y0));
        OK(xmp_linear_forward_cm(&on, &x, &w, axis, bias ? &b : NULL, &y1));
        static int broken;
        if (g_break && !broken && y1.lcount) {
            xmp_f32(&y1)[y1.lcount - 1] += 1.f;
            broken = 1;
        }
        same(&y1, &y0, "coll-matmul y", t);
        xmp_tensor_free(&x);
        xmp_tensor_free(&w);
        xmp_tensor_free(&b);
        xmp_tensor_free(&y0);
        xmp_tensor_free(&y1);
    }
    /* a weight not S(0) on the axis is refused by name */
    int64_t ws[2] = {4, 3};
    xmp_sbp_t sb[XMP_MAX_MESH_DIMS];
    for (int a = 0; a < XMP_MAX_MESH_DIMS; a++)
        sb[a] = xmp_sbp_b();
    xmp_tensor_t w, y;
    xmp_overlap_t on = {0, 0, 0, 1};
    rand_tensor(&w, m, 2, ws, sb);
    memset(&y, 0x5a, sizeof y);
    if (xmp_linear_forward_cm(&on, &w, &w, 0, NULL, &y) != XMESH_ERR_INVALID_ARGUMENT ||
        !strstr(xmp_last_error(), "not S(0) on mesh axis 0") || y.ndim != 0x5a5a5a5a)
        FAIL("coll-matmul with a B weight not refused: %s", xmp_last_error());
    xmp_tensor_free(&w);
}

static void test_parse(void)
{
    xmp_overlap_t o = {9, 9, 9, 9};
    char s[80];
    OK(xmp_overlap_parse("all", &o));
    if (!o.bwd_input || !o.defer_grad || !o.prefetch || !o.coll_matmul)
        FAIL("parse all");
    OK(xmp_overlap_parse("bwd-input,prefetch", &o));
    xmp_overlap_string(&o, s, sizeof s);
    if (strcmp(s, "bwd-input,prefetch"))
        FAIL("parse/string gave '%s'", s);
    OK(xmp_overlap_parse("none", &o));
    xmp_overlap_string(&o, s, sizeof s);
    if (strcmp(s, "none"))
        FAIL("none gave '%s'", s);
    o.prefetch = 5;
    if (xmp_overlap_parse("defer-grad,bogus", &o) != XMESH_ERR_INVALID_ARGUMENT ||
        !strstr(xmp_last_error(), "'bogus'") || o.prefetch != 5)
        FAIL("bad switch not refused by name / output changed: %s", xmp_last_error());
    OK(xmp_overlap_parse("coll-matmul", &o));
    if (!o.coll_matmul || o.prefetch)
        FAIL("coll-matmul alone");
}

int main(int argc, char **argv)
{
    int n = sbp_test_start(&argc, &argv, "test_overlap", &g_seed, &g_break);
    test_parse();
    /* meshes of 1..4 axes whose sizes multiply to n (axes of size 1 pad to 4 axes) */
    int shapes[8][4], ns = 0, nd[8];
    shapes[ns][0] = n, nd[ns++] = 1;
    for (int f = 2; f < n; f++)
        if (n % f == 0 && ns < 4) {
            shapes[ns][0] = f, shapes[ns][1] = n / f, nd[ns++] = 2;
            shapes[ns][0] = n / f, shapes[ns][1] = 1, shapes[ns][2] = f, nd[ns++] = 3;
        }
    if (n == 8)
        shapes[ns][0] = shapes[ns][1] = shapes[ns][2] = 2, nd[ns++] = 3;
    shapes[ns][0] = 1, shapes[ns][1] = n, shapes[ns][2] = 1, shapes[ns][3] = 1, nd[ns++] = 4;
    if (n % 2 == 0)
        shapes[ns][0] = 2, shapes[ns][1] = 1, shapes[ns][2] = n / 2, shapes[ns][3] = 1,
        nd[ns++] = 4;
    int *ranks = malloc(sizeof(int) * (size_t)n);
    for (int i = 0; i < n; i++)
        ranks[i] = i;
    for (int s = 0; s < ns; s++) {
        xmp_mesh_t *m;
        OK(xmp_mesh_create(MPI_COMM_WORLD, NULL, nd[s], shapes[s], ranks, &m));
        if (g_fail)
            break;
        test_box(m, 40);
        test_linear(m, 10);
        test_cm(m, 10);
        xmp_mesh_destroy(m);
    }
    free(ranks);
    int bad = g_fail, any;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (g_rank == 0)
        printf("test_overlap: %s (%d meshes)\n", any ? "FAILED" : "OK", ns);
    MPI_Finalize();
    return any ? 1 : 0;
}
