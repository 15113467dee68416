/* Caller's blocks after a failed reshard (2 ranks: rank 0 sends, rank 1
 * receives).
 *
 *   mpiexec -n 2 test_late [--timeout S]
 *
 * Contract (include/xmesh.h): once a failed xmesh_reshard returns, the
 * executor never reads or writes the caller's blocks again.
 *
 * 1. Late receiver: rank 0's reshard times out while its first chunk sends
 *    wait for rank 1 (which starts late). Rank 0 then overwrites its source
 *    block with a poison value and keeps MPI progressing (MPI_Barrier) while
 *    rank 1 runs the reshard and receives whatever rank 0's MPI still sends.
 *    Rank 1 must never see the poison: a send still reading the caller's
 *    source after the error would deliver it.
 * 2. Late sender: rank 1 times out first and poisons its destination; rank 0
 *    then sends. Rank 1's destination must still hold only the poison.
 *
 * Exit 0 iff both hold. With XMESH_ZERO_COPY=1 (MPI works on the caller's
 * blocks directly) part 1 is expected to fail. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <xmesh.h>
#include <xmesh/mpi.h>

#define N (1 << 20) /* int32 elements: 4 MiB, 64 chunks of 64 KiB */
#define POISON (-559038737)
#define OLD (-1)

static int run(xmesh_ctx_t ctx, int rank, double timeout, int late_rank, int part)
{
    int one[1] = {1}, r0[1] = {0}, r1[1] = {1}, bad = 0;
    xmesh_mesh_t A, B;
    xmesh_mesh_create(ctx, 1, one, r0, &A);
    xmesh_mesh_create(ctx, 1, one, r1, &B);
    int64_t shape[1] = {N};
    xmesh_layout_t src = {1, shape, XMESH_I32, A, "R"}, dst = {1, shape, XMESH_I32, B, "R"};
    xmesh_plan_params_t pp = XMESH_PLAN_PARAMS_INITIALIZER;
    pp.chunk_bytes = 65536;
    pp.timeout_s = timeout;
    xmesh_plan_t plan;
    if (xmesh_plan_create(ctx, &src, &dst, &pp, &plan)) {
        fprintf(stderr, "rank %d: plan: %s\n", rank, xmesh_last_error());
        return 1;
    }
    int32_t *buf = malloc(sizeof(int32_t) * N);
    for (int i = 0; i < N; i++)
        buf[i] = rank == 0 ? i : OLD;
    if (rank == late_rank)
        usleep((useconds_t)((timeout + 0.5) * 1e6));
    xmesh_result_t r = rank == 0 ? xmesh_reshard(plan, buf, NULL) : xmesh_reshard(plan, NULL, buf);
    if (r != XMESH_ERR_TIMEOUT) {
        fprintf(stderr, "rank %d, part %d: expected XMESH_ERR_TIMEOUT, got %s (%s)\n", rank, part,
                xmesh_result_string(r), r ? xmesh_last_error() : "");
        bad = 1;
    }
    int poisoned = rank != late_rank; /* the rank that failed first poisons its block */
    if (poisoned)
        for (int i = 0; i < N; i++)
            buf[i] = POISON;
    /* Progress MPI on the failed rank while its peer runs the reshard. */
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 1) {
        int64_t n_poison = 0, n_new = 0, n_other = 0;
        for (int i = 0; i < N; i++) {
            if (buf[i] == POISON)
                n_poison++;
            else if (buf[i] == i)
                n_new++;
            else if (buf[i] != OLD)
                n_other++;
        }
        printf("part %d (%s): rank 1 holds %lld new, %lld poison, %lld other elements\n", part,
               part == 1 ? "late receiver" : "late sender", (long long)n_new, (long long)n_poison,
               (long long)n_other);
        if (part == 1 && (n_poison || n_other)) {
            fprintf(stderr,
                    "part 1: rank 0's MPI read its source block after the failed "
                    "reshard returned (%lld poisoned elements arrived)\n",
                    (long long)n_poison);
            bad = 1;
        }
        if (part == 2 && n_poison != N) {
            fprintf(stderr,
                    "part 2: %lld elements of rank 1's destination were written after "
                    "the failed reshard returned\n",
                    (long long)(N - n_poison));
            bad = 1;
        }
    }
    if (xmesh_plan_destroy(plan)) {
        fprintf(stderr, "rank %d: plan destroy: %s\n", rank, xmesh_last_error());
        bad = 1;
    }
    free(buf); /* freed: nothing may touch it any more (ASan builds check) */
    xmesh_mesh_destroy(A);
    xmesh_mesh_destroy(B);
    return bad;
}

int main(int argc, char **argv)
{
    double timeout = 1.0;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--timeout") && i + 1 < argc)
            timeout = atof(argv[++i]);
    int provided, rank, size;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 2) {
        if (rank == 0)
            fprintf(stderr, "test_late needs exactly 2 ranks\n");
        MPI_Finalize();
        return 2;
    }
    xmesh_ctx_params_t cp = XMESH_CTX_PARAMS_INITIALIZER;
    cp.host_id = rank; /* two hosts */
    xmesh_ctx_t ctx;
    if (xmesh_ctx_create_mpi(MPI_COMM_WORLD, &cp, &ctx)) {
        fprintf(stderr, "rank %d: ctx: %s\n", rank, xmesh_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    int bad = run(ctx, rank, timeout, 1, 1);
    bad |= run(ctx, rank, timeout, 0, 2);
    /* Give late completions a last chance to land before checking memory. */
    MPI_Barrier(MPI_COMM_WORLD);
    xmesh_ctx_destroy(ctx);
    int any = 0;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0)
        printf("test_late: %s\n", any ? "FAILED" : "ok");
    MPI_Finalize();
    return any;
}
