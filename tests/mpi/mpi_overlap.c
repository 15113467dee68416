/* Overlap of a reshard with compute (a measurement program, not a test).
 *
 *   mpiexec -n 2 mpi_overlap [MiB] [iters] [compute_ms] [level] [poll_us]
 *
 * Rank 0 (host 0) sends MiB of int32 to rank 1 (host 1, fake host ids), and
 * every rank computes compute_ms of arithmetic. Per iteration it measures
 * t_xfer (xmesh_reshard alone), t_comp (compute alone) and t_both
 * (xmesh_reshard_start, compute, xmesh_wait; with poll_us > 0 the compute is
 * cut into slices with an xmesh_test between them, which is what gives
 * overlap below MPI_THREAD_MULTIPLE). Prints medians over iterations of the
 * slowest rank and overlap efficiency
 *   (t_xfer + t_comp - t_both) / min(t_xfer, t_comp)
 * (1: fully hidden, 0: serial). The compute is a fixed amount of work
 * calibrated to compute_ms (see compute()). level: single|funneled|serialized|multiple
 * (default multiple). Every destination element is checked once. On the
 * emulated cluster:
 *   microbench/cluster/cluster.sh -H 2 -d 1 -r 300mbit -- bash -c \
 *     '$XMH_MPIRUN -np $XMH_NP build/tests/mpi/mpi_overlap 16 5 400 multiple 0'
 * With more than 2 ranks (an even number) the source mesh is the first half
 * of the ranks (1-D) holding a (rows, 1024) int32 tensor as S0R, and the
 * destination the second half as RR (every destination rank gets all of it);
 * hosts are the real ones (shared-memory split), e.g. the issue-14 setting:
 *   microbench/cluster/cluster.sh -H 4 -d 2 -r 200mbit -- bash -c \
 *     '$XMH_MPIRUN -np $XMH_NP build/tests/mpi/mpi_overlap 16 5 700 multiple 0'
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xmesh.h"
#include "xmesh/mpi.h"

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static volatile double g_sink;

/* Compute is a fixed amount of work, not a fixed time: the warm-up
 * iteration counts how many blocks of arithmetic fit in compute_ms while
 * every rank computes (g_blocks), and every timed run does that many. So
 * CPU taken by the transfer (progress thread, TCP, copies) shows up as a
 * longer t_both instead of being hidden by a time-based loop. An
 * xmesh_test runs between blocks every poll_us when req and poll_us > 0.
 * Returns the request's final result if it finished. */
static long g_blocks = -1;

static xmesh_result_t compute(double ms, xmesh_request_t *req, double poll_us)
{
    double t0 = MPI_Wtime(), next = t0, acc = 0;
    xmesh_result_t r = XMESH_IN_PROGRESS;
    long done = 0;
    for (;;) {
        if (g_blocks < 0 ? MPI_Wtime() - t0 >= ms * 1e-3 : done >= g_blocks)
            break;
        for (int i = 0; i < 2000; i++)
            acc += (double)i * 1e-9 * (acc < 1e9);
        done++;
        if (req && *req && poll_us > 0 && MPI_Wtime() >= next) {
            r = xmesh_test(*req);
            if (r != XMESH_IN_PROGRESS)
                *req = NULL;
            next = MPI_Wtime() + poll_us * 1e-6;
        }
    }
    if (g_blocks < 0)
        g_blocks = done;
    g_sink = acc;
    return r;
}

static double slowest(double t)
{
    double m = 0;
    MPI_Allreduce(&t, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return m;
}

int main(int argc, char **argv)
{
    double mib = argc > 1 ? atof(argv[1]) : 16;
    int iters = argc > 2 ? atoi(argv[2]) : 5;
    double comp_ms = argc > 3 ? atof(argv[3]) : 200;
    const char *lv = argc > 4 ? argv[4] : "multiple";
    double poll_us = argc > 5 ? atof(argv[5]) : 0;
    int want = !strcmp(lv, "single")       ? MPI_THREAD_SINGLE
               : !strcmp(lv, "funneled")   ? MPI_THREAD_FUNNELED
               : !strcmp(lv, "serialized") ? MPI_THREAD_SERIALIZED
                                           : MPI_THREAD_MULTIPLE;
    int provided, rank, size;
    MPI_Init_thread(&argc, &argv, want, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size < 2 || size % 2 || iters < 1) {
        if (rank == 0)
            fprintf(stderr, "usage: mpiexec -n 2k mpi_overlap [MiB] [iters>=1] [compute_ms] "
                            "[level] [poll_us]\n");
        MPI_Finalize();
        return 2;
    }
    xmesh_ctx_params_t cp = XMESH_CTX_PARAMS_INITIALIZER;
    if (size == 2)
        cp.host_id = rank; /* two fake hosts; with more ranks the real ones */
    xmesh_ctx_t ctx;
    if (xmesh_ctx_create_mpi(MPI_COMM_WORLD, &cp, &ctx)) {
        fprintf(stderr, "rank %d: %s\n", rank, xmesh_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    int half = size / 2, *ranks = malloc(sizeof(int) * (size_t)size);
    for (int i = 0; i < size; i++)
        ranks[i] = i;
    int in_src = rank < half, in_dst = !in_src;
    xmesh_mesh_t A, B;
    xmesh_mesh_create(ctx, 1, &half, ranks, &A);
    xmesh_mesh_create(ctx, 1, &half, ranks + half, &B);
    const int64_t cols = 1024;
    int64_t rows = (int64_t)(mib * (1 << 20) / 4 / cols), shape[2] = {rows, cols};
    xmesh_layout_t sl = {2, shape, XMESH_I32, A, "S0R"}, dl = {2, shape, XMESH_I32, B, "RR"};
    xmesh_plan_t plan;
    if (xmesh_plan_create(ctx, &sl, &dl, NULL, &plan)) {
        fprintf(stderr, "rank %d: %s\n", rank, xmesh_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    /* Source rank k holds rows [k*rows/half + min(k, rows%half), ...) (array_split). */
    int64_t n = rows * cols, r0 = 0, nr = rows;
    if (in_src) {
        int k = rank;
        nr = rows / half + (k < rows % half);
        r0 = (int64_t)k * (rows / half) + (k < rows % half ? k : rows % half);
    }
    int64_t cnt = in_src ? nr * cols : n;
    int32_t *buf = malloc(sizeof(int32_t) * (size_t)(cnt ? cnt : 1));
    for (int64_t i = 0; i < cnt; i++)
        buf[i] = in_src ? (int32_t)(r0 * cols + i) : -1;
    const void *src = in_src ? buf : NULL;
    void *dst = in_dst ? buf : NULL;
    double *tx = malloc(sizeof(double) * 3 * iters), *tc = tx + iters, *tb = tc + iters;
    int64_t wrong = 0;
    for (int it = -1; it < iters; it++) { /* iteration -1: warm-up and check */
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        xmesh_result_t r = xmesh_reshard(plan, src, dst);
        double t_x = slowest(MPI_Wtime() - t0);
        if (r) {
            fprintf(stderr, "rank %d: %s\n", rank, xmesh_last_error());
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        if (it < 0) {
            for (int64_t i = 0; in_dst && i < n; i++)
                wrong += buf[i] != (int32_t)i;
            MPI_Barrier(MPI_COMM_WORLD);
            compute(comp_ms, NULL, 0); /* calibrates g_blocks with every rank computing */
            continue;
        }
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = MPI_Wtime();
        compute(comp_ms, NULL, 0);
        double t_c = slowest(MPI_Wtime() - t0);
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = MPI_Wtime();
        xmesh_request_t req;
        if (xmesh_reshard_start(plan, src, dst, &req)) {
            fprintf(stderr, "rank %d: %s\n", rank, xmesh_last_error());
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        r = compute(comp_ms, &req, poll_us);
        if (req)
            r = xmesh_wait(req);
        double t_b = slowest(MPI_Wtime() - t0);
        if (r) {
            fprintf(stderr, "rank %d: %s\n", rank, xmesh_last_error());
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        tx[it] = t_x;
        tc[it] = t_c;
        tb[it] = t_b;
    }
    qsort(tx, iters, sizeof *tx, cmp_d);
    qsort(tc, iters, sizeof *tc, cmp_d);
    qsort(tb, iters, sizeof *tb, cmp_d);
    double x = tx[iters / 2], c = tc[iters / 2], b = tb[iters / 2];
    double lo = x < c ? x : c;
    int64_t wrong_all = 0;
    MPI_Allreduce(&wrong, &wrong_all, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    wrong = wrong_all;
    if (rank == 0)
        printf(
            "mpi_overlap: %d ranks, %.1f MiB, level %s (provided %d), poll %g us, %d iterations: "
            "t_xfer %.3f s, t_comp %.3f s, t_both %.3f s, overlap efficiency %.2f, "
            "wrong elements %lld\n",
            size, mib, lv, provided, poll_us, iters, x, c, b, lo > 0 ? (x + c - b) / lo : 0.0,
            (long long)wrong);
    free(tx);
    free(buf);
    free(ranks);
    xmesh_plan_destroy(plan);
    xmesh_mesh_destroy(A);
    xmesh_mesh_destroy(B);
    xmesh_ctx_destroy(ctx);
    MPI_Finalize();
    return wrong != 0;
}
