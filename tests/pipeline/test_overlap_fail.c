/* Nonblocking boxing under failure (nn/overlap.h), 4 ranks, XMESH_TIMEOUT_S = T > 0:
 *  1. rank 2 fails (xmp_fail) while ranks 0, 1, 3 have a P -> B box in flight: xmp_box_wait
 *     returns XMESH_ERR_REMOTE naming rank 2 well within T, y untouched; a later
 *     xmp_box_start fails at once ("not started");
 *  2. rank 3 never starts an S(0) -> B box on a fresh mesh: ranks 0, 1, 2 get
 *     XMESH_ERR_TIMEOUT from xmp_box_wait naming rank 3 within [T, T + 2.5 s], y untouched.
 * Every rank reaches MPI_Finalize; the exit code says it all. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fail_test.h"
#include "nn/overlap.h"

int main(int argc, char **argv)
{
    double T = fail_test_init(&argc, &argv, "test_overlap_fail", 0);
    int shape1[1] = {4};
    int64_t shape[2] = {6, 5};
    xmp_sbp_t p[1] = {xmp_sbp_p()}, b[1] = {xmp_sbp_b()}, s0[1] = {xmp_sbp_s(0)};
    xmp_tensor_t x, y, y0;
    xmp_box_req_t *req = NULL;
    xmp_mesh_t *m1 = fail_mesh(1, shape1);
    xmp_tensor_alloc(&x, m1, 2, shape, XMESH_F32, p);
    memset(&y, 0x5a, sizeof y);
    y0 = y;
    MPI_Barrier(MPI_COMM_WORLD);
    if (g_rank == 2) {
        usleep(200000);
        xmp_fail(MPI_COMM_WORLD, "rank 2: injected failure during a nonblocking box");
    } else {
        double t0 = MPI_Wtime();
        xmesh_result_t r = xmp_box_start(&x, b, &req);
        EXPECT(r == XMESH_SUCCESS, "start: %s", xmp_last_error());
        r = xmp_box_wait(req, &y);
        double el = MPI_Wtime() - t0;
        const char *msg = xmp_last_error();
        EXPECT(r == XMESH_ERR_REMOTE && strstr(msg, "rank 2") && strstr(msg, "injected") &&
                   strstr(msg, "MPI_Iallreduce"),
               "wait returned %d (%s), expected REMOTE naming rank 2", (int)r, msg);
        EXPECT(el < T / 2, "returned after %.3f s, not well within %g s", el, T);
        EXPECT(!memcmp(&y, &y0, sizeof y), "output written on error");
        printf("[rank %d] case 1: %.3f s: %s\n", g_rank, el, msg);
        r = xmp_box_start(&x, b, &req);
        EXPECT(r == XMESH_ERR_REMOTE && strstr(xmp_last_error(), "not started"),
               "start after the failure: %d: %s", (int)r, xmp_last_error());
    }
    MPI_Barrier(MPI_COMM_WORLD);
    xmp_fail_clear();
    MPI_Barrier(MPI_COMM_WORLD);

    xmp_mesh_t *m2 = fail_mesh(1, shape1);
    xmp_tensor_t x2, y2;
    xmp_tensor_alloc(&x2, m2, 2, shape, XMESH_F32, s0);
    memset(&y2, 0x5a, sizeof y2);
    y0 = y2;
    MPI_Barrier(MPI_COMM_WORLD);
    if (g_rank == 3) {
        usleep((useconds_t)((T + 1.5) * 1e6)); /* never joins */
    } else {
        double t0 = MPI_Wtime();
        xmesh_result_t r = xmp_box_start(&x2, b, &req);
        EXPECT(r == XMESH_SUCCESS, "start: %s", xmp_last_error());
        int done = 1;
        r = xmp_box_test(req, &done);
        EXPECT(r == XMESH_SUCCESS && !done, "test: %d done %d", (int)r, done);
        r = xmp_box_wait(req, &y2);
        double el = MPI_Wtime() - t0;
        const char *msg = xmp_last_error();
        EXPECT(r == XMESH_ERR_TIMEOUT && strstr(msg, "timed out") && strstr(msg, "MPI_Iallgatherv"),
               "wait returned %d (%s), expected TIMEOUT", (int)r, msg);
        EXPECT(strstr(msg, ": rank 3 does not answer"), "message does not name rank 3: %s", msg);
        EXPECT_TIMEOUT_WINDOW(el, T);
        EXPECT(!memcmp(&y2, &y0, sizeof y2), "output written on error");
        printf("[rank %d] case 2: %.3f s: %s\n", g_rank, el, msg);
    }
    xmp_tensor_free(&x);
    xmp_tensor_free(&x2);
    /* the meshes are not destroyed: collectives were abandoned on their communicators */
    return fail_test_finish("test_overlap_fail");
}
