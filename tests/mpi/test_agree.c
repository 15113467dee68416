/* Plan agreement over the cluster model (2+ ranks, each rank may run with a
 * different environment: `mpiexec -n 1 env XMESH_NIC_GBPS=5 test_agree
 * mismatch : -n 1 test_agree mismatch`).
 *
 *   test_agree ok|mismatch [--cluster-latency US]
 *
 * Every rank rebuilds the routes from its own cluster model, so model inputs
 * that differ between ranks (XMESH_NIC_GBPS, XMESH_LATENCY_US,
 * XMESH_NICS_PER_HOST, XMESH_INTRA_GBPS, XMESH_SEND_AHEAD, the cluster
 * file's contents) must make xmesh_plan_create return XMESH_ERR_MISMATCH on
 * every rank, at once, instead of hanging until the timeout.
 * --cluster-latency writes a per-rank cluster file with that latency and
 * points XMESH_CLUSTER_FILE at it. With `ok` the plan must be created and a
 * reshard must deliver every element. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <xmesh.h>
#include <xmesh/mpi.h>

int main(int argc, char **argv)
{
    int expect_ok = -1;
    const char *lat = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "ok"))
            expect_ok = 1;
        else if (!strcmp(argv[i], "mismatch"))
            expect_ok = 0;
        else if (!strcmp(argv[i], "--cluster-latency") && i + 1 < argc)
            lat = argv[++i];
    }
    if (expect_ok < 0) {
        fprintf(stderr, "usage: test_agree ok|mismatch [--cluster-latency US]\n");
        return 2;
    }
    int provided, rank, size, bad = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    char path[256] = "";
    if (lat) {
        snprintf(path, sizeof path, "/tmp/xmesh-agree-%d-%d.txt", (int)getpid(), rank);
        FILE *f = fopen(path, "w");
        if (!f) {
            perror(path);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
        fprintf(f, "# test_agree, rank %d\nlatency_us = %s\n", rank, lat);
        fclose(f);
        setenv("XMESH_CLUSTER_FILE", path, 1);
    }
    xmesh_ctx_params_t cp = XMESH_CTX_PARAMS_INITIALIZER;
    cp.host_id = rank; /* one rank per host: every hop crosses a NIC */
    xmesh_ctx_t ctx;
    if (xmesh_ctx_create_mpi(MPI_COMM_WORLD, &cp, &ctx)) {
        fprintf(stderr, "rank %d: ctx: %s\n", rank, xmesh_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    int half = size / 2, sh[1] = {half}, sh2[1] = {size - half};
    int *ra = malloc(sizeof(int) * size), *rb = malloc(sizeof(int) * size);
    for (int i = 0; i < size; i++) {
        if (i < half)
            ra[i] = i;
        else
            rb[i - half] = i;
    }
    xmesh_mesh_t A, B;
    xmesh_mesh_create(ctx, 1, sh, ra, &A);
    xmesh_mesh_create(ctx, 1, sh2, rb, &B);
    int64_t shape[2] = {64, 48};
    xmesh_layout_t src = {2, shape, XMESH_I32, A, "S0R"}, dst = {2, shape, XMESH_I32, B, "RR"};
    xmesh_plan_params_t pp = XMESH_PLAN_PARAMS_INITIALIZER;
    pp.timeout_s = 10;
    pp.chunk_bytes = 512;
    xmesh_plan_t plan = NULL;
    double t0 = MPI_Wtime();
    xmesh_result_t r = xmesh_plan_create(ctx, &src, &dst, &pp, &plan);
    double dt = MPI_Wtime() - t0;
    if (!expect_ok) {
        if (r != XMESH_ERR_MISMATCH) {
            fprintf(stderr, "rank %d: expected XMESH_ERR_MISMATCH, got %s (%s)\n", rank,
                    xmesh_result_string(r), r ? xmesh_last_error() : "plan created");
            bad = 1;
        } else if (rank == 0) {
            printf("rank 0: MISMATCH after %.3f s: %s\n", dt, xmesh_last_error());
        }
    } else if (r) {
        fprintf(stderr, "rank %d: plan: %s\n", rank, xmesh_last_error());
        bad = 1;
    } else {
        int64_t ls[2], lo[2];
        int holds_s, holds_d;
        int32_t *sb = NULL, *db = NULL;
        xmesh_layout_local_shape(&src, rank, ls, &holds_s);
        xmesh_layout_local_offset(&src, rank, lo, &holds_s);
        if (holds_s) {
            sb = malloc(sizeof(int32_t) * ls[0] * ls[1]);
            for (int64_t i = 0; i < ls[0] * ls[1]; i++)
                sb[i] = (int32_t)((lo[0] + i / ls[1]) * shape[1] + i % ls[1]);
        }
        xmesh_layout_local_shape(&dst, rank, ls, &holds_d);
        if (holds_d) {
            db = malloc(sizeof(int32_t) * shape[0] * shape[1]);
            memset(db, 0xff, sizeof(int32_t) * shape[0] * shape[1]);
        }
        r = xmesh_reshard(plan, sb, db);
        if (r) {
            fprintf(stderr, "rank %d: reshard: %s\n", rank, xmesh_last_error());
            bad = 1;
        }
        for (int64_t i = 0; holds_d && i < shape[0] * shape[1]; i++)
            if (db[i] != (int32_t)i) {
                fprintf(stderr, "rank %d: element %lld is %d\n", rank, (long long)i, db[i]);
                bad = 1;
                break;
            }
        free(sb);
        free(db);
        xmesh_plan_destroy(plan);
    }
    xmesh_mesh_destroy(A);
    xmesh_mesh_destroy(B);
    xmesh_ctx_destroy(ctx);
    if (*path)
        unlink(path);
    free(ra);
    free(rb);
    int any = 0;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0)
        printf("test_agree %s: %s\n", expect_ok ? "ok" : "mismatch", any ? "FAILED" : "passed");
    MPI_Finalize();
    return any;
}
