/*
 * Throughput of one large reshard vs a raw MPI_Send of the same bytes.
 * Not a test: a measurement program (see docs/EXECUTOR.md).
 *
 *   mpiexec -n 2 --oversubscribe mpi_throughput [MiB] [iters] [chunk_bytes...]
 *
 * Rank 0 holds the tensor (mesh {0}, "R"), rank 1 receives it (mesh {1},
 * "R"); each rank is its own fake host. Figures: GB/s = bytes / seconds
 * (1 GB = 1e9 bytes), medians over iters with min/max, after one warm-up.
 */
#include <mpi.h>
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

static void stats(double *t, int n, double bytes, const char *what, int rank)
{
    qsort(t, n, sizeof *t, cmp_d);
    if (rank == 0)
        printf("%-28s median %7.3f GB/s  (min %7.3f, max %7.3f)  median time %8.2f ms\n", what,
               bytes / t[n / 2] / 1e9, bytes / t[n - 1] / 1e9, bytes / t[0] / 1e9, t[n / 2] * 1e3);
}

int main(int argc, char **argv)
{
    int provided, rank, size;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 2) {
        if (rank == 0)
            fprintf(stderr, "run with exactly 2 ranks\n");
        MPI_Finalize();
        return 2;
    }
    int64_t mib = argc > 1 ? atoll(argv[1]) : 256;
    int iters = argc > 2 ? atoi(argv[2]) : 5;
    int64_t bytes = mib << 20, n = bytes / 4;
    float *buf = malloc(bytes);
    memset(buf, 1, bytes);
    double *t = malloc(sizeof(double) * iters);

    /* raw MPI_Send / MPI_Recv of the same bytes, one message */
    for (int it = -1; it < iters; it++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        if (rank == 0)
            MPI_Send(buf, (int)bytes, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
        else
            MPI_Recv(buf, (int)bytes, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        double dt = MPI_Wtime() - t0, mx;
        MPI_Allreduce(&dt, &mx, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (it >= 0)
            t[it] = mx;
    }
    if (rank == 0)
        printf("%lld MiB f32, 2 ranks on 2 fake hosts, %d iterations\n", (long long)mib, iters);
    stats(t, iters, (double)bytes, "raw MPI_Send", rank);

    xmesh_ctx_params_t cp = XMESH_CTX_PARAMS_INITIALIZER;
    cp.host_id = rank;
    xmesh_ctx_t ctx;
    if (xmesh_ctx_create_mpi(MPI_COMM_WORLD, &cp, &ctx)) {
        fprintf(stderr, "ctx: %s\n", xmesh_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    int one = 1, r0 = 0, r1 = 1;
    xmesh_mesh_t ma, mb;
    xmesh_mesh_create(ctx, 1, &one, &r0, &ma);
    xmesh_mesh_create(ctx, 1, &one, &r1, &mb);
    int64_t shape[1] = {n};
    xmesh_layout_t la = {1, shape, XMESH_F32, ma, "R"}, lb = {1, shape, XMESH_F32, mb, "R"};
    int64_t chunks[16] = {1 << 20};
    int nchunks = 1;
    if (argc > 3)
        for (nchunks = 0; nchunks < 16 && 3 + nchunks < argc; nchunks++)
            chunks[nchunks] = atoll(argv[3 + nchunks]);
    for (int k = 0; k < nchunks; k++) {
        xmesh_plan_params_t pp = XMESH_PLAN_PARAMS_INITIALIZER;
        pp.chunk_bytes = chunks[k];
        pp.strategy = XMESH_STRATEGY_BROADCAST;
        xmesh_plan_t plan;
        if (xmesh_plan_create(ctx, &la, &lb, &pp, &plan)) {
            fprintf(stderr, "plan: %s\n", xmesh_last_error());
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        for (int it = -1; it < iters; it++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            xmesh_result_t r = xmesh_reshard(plan, rank == 0 ? buf : NULL, rank == 1 ? buf : NULL);
            double dt = MPI_Wtime() - t0, mx;
            if (r)
                fprintf(stderr, "reshard: %s\n", xmesh_last_error());
            MPI_Allreduce(&dt, &mx, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            if (it >= 0)
                t[it] = mx;
        }
        char what[64];
        snprintf(what, sizeof what, "xmesh broadcast chunk %lldK", (long long)(chunks[k] >> 10));
        stats(t, iters, (double)bytes, what, rank);
        xmesh_plan_destroy(plan);
    }
    xmesh_mesh_destroy(ma);
    xmesh_mesh_destroy(mb);
    xmesh_ctx_destroy(ctx);
    free(buf);
    free(t);
    MPI_Finalize();
    return 0;
}
