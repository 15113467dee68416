/*
 * The four strategies of the MPI executor on one 1-to-m case (paper 002,
 * Fig. 5 shape): host 0's D ranks hold a tensor sharded S(0) over a (1, D)
 * mesh; hosts 1..H-1 (D ranks each) need it replicated ("B,B"). Not a test:
 * a measurement program, meant for the emulated cluster:
 *
 *   microbench/cluster/cluster.sh -H 3 -d 2 -r 1000mbit -- bash -c \
 *     '$XMH_MPIRUN -np $XMH_NP build/tests/mpi/mpi_strategies 2 16 3'
 *
 * args: ranks per host D, MiB, iterations. Every destination element is
 * checked once per strategy. Times: median (min, max) over iterations of
 * the slowest rank; GB/s = tensor bytes / time.
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

int main(int argc, char **argv)
{
    int provided, rank, size;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int D = argc > 1 ? atoi(argv[1]) : 2;
    int64_t mib = argc > 2 ? atoll(argv[2]) : 16;
    int iters = argc > 3 ? atoi(argv[3]) : 3;
    int H = size / D;
    if (H < 2 || H * D != size) {
        if (rank == 0)
            fprintf(stderr, "need H*D ranks with H >= 2 (D = %d, size = %d)\n", D, size);
        MPI_Finalize();
        return 2;
    }
    xmesh_ctx_params_t cp = XMESH_CTX_PARAMS_INITIALIZER;
    cp.host_id = rank / D;
    xmesh_ctx_t ctx;
    if (xmesh_ctx_create_mpi(MPI_COMM_WORLD, &cp, &ctx))
        MPI_Abort(MPI_COMM_WORLD, 1);
    int sshape[2] = {1, D}, dshape[2] = {H - 1, D};
    int *sr = malloc(sizeof(int) * D), *dr = malloc(sizeof(int) * (H - 1) * D);
    for (int i = 0; i < D; i++)
        sr[i] = i;
    for (int i = 0; i < (H - 1) * D; i++)
        dr[i] = D + i;
    xmesh_mesh_t sm, dm;
    xmesh_mesh_create(ctx, 2, sshape, sr, &sm);
    xmesh_mesh_create(ctx, 2, dshape, dr, &dm);
    int64_t n = (mib << 20) / 4, shape[1] = {n};
    xmesh_layout_t sl = {1, shape, XMESH_I32, sm, "B,S(0)"}, dl = {1, shape, XMESH_I32, dm, "B,B"};
    int64_t lshape[1], loff[1];
    int hs, hd;
    xmesh_layout_local_shape(&sl, rank, lshape, &hs);
    xmesh_layout_local_offset(&sl, rank, loff, &hs);
    int32_t *src = hs ? malloc(sizeof(int32_t) * (lshape[0] + 1)) : NULL;
    for (int64_t i = 0; hs && i < lshape[0]; i++)
        src[i] = (int32_t)(loff[0] + i);
    xmesh_layout_local_shape(&dl, rank, lshape, &hd);
    int32_t *dst = hd ? malloc(sizeof(int32_t) * n) : NULL;
    double *t = malloc(sizeof(double) * iters);
    if (rank == 0)
        printf("1-to-m: (1,%d) on host 0 -> (%d,%d) on hosts 1..%d, %lld MiB i32, %d iterations\n",
               D, H - 1, D, H - 1, (long long)mib, iters);
    for (int st = 0; st < XMESH_STRATEGY_COUNT_; st++) {
        xmesh_plan_params_t pp = XMESH_PLAN_PARAMS_INITIALIZER;
        pp.strategy = (xmesh_strategy_t)st;
        xmesh_plan_t plan;
        if (xmesh_plan_create(ctx, &sl, &dl, &pp, &plan)) {
            if (rank == 0)
                printf("%-20s plan failed: %s\n", xmesh_strategy_name(pp.strategy),
                       xmesh_last_error());
            continue;
        }
        xmesh_plan_info_t info;
        xmesh_plan_get_info(plan, &info);
        int64_t wrong = 0;
        for (int it = -1; it < iters; it++) {
            if (dst)
                memset(dst, 0xff, sizeof(int32_t) * n);
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            if (xmesh_reshard(plan, src, dst))
                fprintf(stderr, "rank %d: %s\n", rank, xmesh_last_error());
            double dt = MPI_Wtime() - t0, mx;
            MPI_Allreduce(&dt, &mx, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            if (it >= 0)
                t[it] = mx;
            if (it == 0)
                for (int64_t i = 0; dst && i < n; i++)
                    wrong += dst[i] != (int32_t)i;
        }
        int64_t allwrong = 0;
        MPI_Allreduce(&wrong, &allwrong, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
        qsort(t, iters, sizeof *t, cmp_d);
        if (rank == 0)
            printf("%-20s median %8.2f ms (min %8.2f, max %8.2f)  %6.3f GB/s  model %8.2f ms  "
                   "wrong %lld\n",
                   xmesh_strategy_name(pp.strategy), t[iters / 2] * 1e3, t[0] * 1e3,
                   t[iters - 1] * 1e3, (double)n * 4 / t[iters / 2] / 1e9, info.predicted_s * 1e3,
                   (long long)allwrong);
        xmesh_plan_destroy(plan);
    }
    xmesh_mesh_destroy(sm);
    xmesh_mesh_destroy(dm);
    xmesh_ctx_destroy(ctx);
    free(src);
    free(dst);
    free(sr);
    free(dr);
    free(t);
    MPI_Finalize();
    return 0;
}
