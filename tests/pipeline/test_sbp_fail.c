/* Failure and timeout of the nn/ collectives (nn/sbp.h), 4 ranks, XMESH_TIMEOUT_S = T set by
 * the caller:
 *  1. rank 2 fails before a boxing (xmp_fail); ranks 0, 1, 3, already waiting in the
 *     all-reduce of P -> B, return XMESH_ERR_REMOTE naming rank 2 and its message well
 *     within the timeout (< T / 2), their output untouched; a later collective fails at once
 *     without being posted; so does a layer (layer norm with a channel split);
 *  2. rank 3 never arrives at a boxing (S(0),S(1) -> B,B on a fresh 2x2 mesh): ranks 0, 1, 2
 *     return XMESH_ERR_TIMEOUT naming the collective and rank 3 (it does not answer the
 *     engine's liveness ping) within [T, T + 2.5 s].
 * Nobody calls MPI_Abort: every rank reaches MPI_Finalize and the exit code says it all. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fail_test.h"
#include "nn/sbp_layers.h"

int main(int argc, char **argv)
{
    double T = fail_test_init(&argc, &argv, "test_sbp_fail", 0);

    /* ---- 1: rank 2 fails before a boxing P -> B */
    int s1[1] = {4};
    xmp_mesh_t *m1 = fail_mesh(1, s1);
    int64_t shape[2] = {6, 5};
    xmp_sbp_t p[1] = {xmp_sbp_p()}, b[1] = {xmp_sbp_b()};
    xmp_tensor_t x, y, y0;
    xmp_tensor_alloc(&x, m1, 2, shape, XMESH_F32, p);
    memset(&y, 0x5a, sizeof y);
    y0 = y;
    MPI_Barrier(MPI_COMM_WORLD);
    if (g_rank == 2) {
        usleep(200000); /* the others are inside the all-reduce by now */
        xmp_fail(MPI_COMM_WORLD, "rank 2: injected failure before boxing");
        char msg[XMP_NOTICE_BYTES];
        EXPECT(xmp_failed_rank(msg, sizeof msg) == 2 && strstr(msg, "injected"),
               "the failing rank does not know it failed: %d '%s'", xmp_failed_rank(NULL, 0), msg);
    } else {
        double t0 = MPI_Wtime();
        xmesh_result_t r = xmp_box(&x, b, &y);
        double el = MPI_Wtime() - t0;
        const char *msg = xmp_last_error();
        EXPECT(r == XMESH_ERR_REMOTE, "boxing returned %d (%s), expected REMOTE", (int)r, msg);
        EXPECT(strstr(msg, "rank 2 failed") && strstr(msg, "injected failure"),
               "message does not name rank 2 and its notice: %s", msg);
        EXPECT(strstr(msg, "MPI_Iallreduce"), "message does not name the collective: %s", msg);
        EXPECT(el < T / 2, "returned after %.3f s, not well within the timeout %g s", el, T);
        EXPECT(!memcmp(&y, &y0, sizeof y), "output written on error");
        printf("[rank %d] case 1: %.3f s: %s\n", g_rank, el, msg);
        /* once a failure is known, later collectives fail at once (nothing posted) */
        t0 = MPI_Wtime();
        r = xmp_box(&x, b, &y);
        EXPECT(r == XMESH_ERR_REMOTE && strstr(xmp_last_error(), "not started") &&
                   MPI_Wtime() - t0 < 0.5,
               "second boxing: %d: %s", (int)r, xmp_last_error());
    }
    { /* a layer after the failure: layer norm with the channel split all-reduces */
        int64_t xs[2] = {3, 8}, ws[1] = {8};
        xmp_sbp_t sc[1] = {xmp_sbp_s(1)};
        xmp_tensor_t lx, lw, lb, ly;
        xmp_norm_cache_t c;
        xmp_tensor_alloc(&lx, m1, 2, xs, XMESH_F32, sc);
        xmp_tensor_alloc(&lw, m1, 1, ws, XMESH_F32, b);
        xmp_tensor_alloc(&lb, m1, 1, ws, XMESH_F32, b);
        double t0 = MPI_Wtime();
        xmesh_result_t r = xmp_layernorm_forward(&lx, &lw, &lb, &ly, &c);
        EXPECT(r == XMESH_ERR_REMOTE && strstr(xmp_last_error(), "rank 2") &&
                   MPI_Wtime() - t0 < T / 2,
               "layer norm after the failure: %d: %s", (int)r, xmp_last_error());
        xmp_tensor_free(&lx);
        xmp_tensor_free(&lw);
        xmp_tensor_free(&lb);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    xmp_fail_clear();
    MPI_Barrier(MPI_COMM_WORLD);

    /* ---- 2: rank 3 never arrives at a boxing S(0),S(1) -> B,B on a fresh 2x2 mesh */
    int s2[2] = {2, 2};
    xmp_mesh_t *m2 = fail_mesh(2, s2);
    xmp_sbp_t ss[2] = {xmp_sbp_s(0), xmp_sbp_s(1)}, bb[2] = {xmp_sbp_b(), xmp_sbp_b()};
    xmp_tensor_t x2, y2;
    xmp_tensor_alloc(&x2, m2, 2, shape, XMESH_F32, ss);
    memset(&y2, 0x5a, sizeof y2);
    y0 = y2;
    MPI_Barrier(MPI_COMM_WORLD);
    if (g_rank == 3) {
        usleep((useconds_t)((T + 1.5) * 1e6)); /* busy elsewhere; never joins */
    } else {
        double t0 = MPI_Wtime();
        xmesh_result_t r = xmp_box(&x2, bb, &y2);
        double el = MPI_Wtime() - t0;
        const char *msg = xmp_last_error();
        EXPECT(r == XMESH_ERR_TIMEOUT, "boxing returned %d (%s), expected TIMEOUT", (int)r, msg);
        EXPECT(strstr(msg, "MPI_Iallgatherv") && strstr(msg, "timed out") &&
                   strstr(msg, "XMESH_TIMEOUT_S"),
               "message does not name the collective and the timeout: %s", msg);
        /* the rank it waited for: the liveness ping finds the one that does not answer */
        EXPECT(strstr(msg, ": rank 3 does not answer"), "message does not name rank 3: %s", msg);
        EXPECT_TIMEOUT_WINDOW(el, T);
        EXPECT(!memcmp(&y2, &y0, sizeof y2), "output written on error");
        printf("[rank %d] case 2: %.3f s: %s\n", g_rank, el, msg);
    }
    xmp_tensor_free(&x);
    xmp_tensor_free(&x2);
    /* m1 and m2 are not destroyed: collectives were abandoned on their communicators */
    return fail_test_finish("test_sbp_fail");
}
