/*
 * The NCCL context without MPI (xmesh_ctx_create_nccl_oob), started by
 * tests/ucx/xmesh-launch.py: no mpirun, no MPI_Init.
 *
 * Without a CUDA device (this machine): creation through the environment
 * bootstrap must fail on every rank with UNSUPPORTED naming the missing
 * device, *out untouched (every rank reaches the same verdict through the
 * out-of-band agreement, none waits in NCCL's init); a caller's all-gather
 * that fails is reported as BACKEND; bad arguments are refused. Then it
 * exits 77 (skipped) with a message: the device half has not run here.
 *
 * With at least one device per rank: a context from the environment, the
 * ncclUniqueId through the bootstrap, and an S(0) -> B reshard of device
 * memory over every rank, every element checked.
 */
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xmesh.h"
#include "xmesh/cuda.h"

static int failing_allgather(void *user, const void *send, void *recv, size_t bytes)
{
    (void)user;
    (void)send;
    (void)recv;
    (void)bytes;
    return 5;
}

static int nodev(const char *who)
{
    int fail = 0;
    xmesh_ctx_t sentinel = (xmesh_ctx_t)(uintptr_t)0x10, ctx = sentinel;
    xmesh_result_t r = xmesh_ctx_create_nccl_oob(NULL, -1, NULL, &ctx);
    if (r != XMESH_ERR_UNSUPPORTED || ctx != sentinel ||
        !strstr(xmesh_last_error(), "no CUDA device")) {
        printf("FAIL rank %s: create_nccl_oob(environment): %s (%s)\n", who, xmesh_result_string(r),
               xmesh_last_error());
        fail = 1;
    }
    xmesh_oob_t bad = {0, 1, failing_allgather, NULL};
    r = xmesh_ctx_create_nccl_oob(&bad, -1, NULL, &ctx);
    if (r != XMESH_ERR_BACKEND || ctx != sentinel || !strstr(xmesh_last_error(), "all-gather")) {
        printf("FAIL rank %s: a failing all-gather: %s (%s)\n", who, xmesh_result_string(r),
               xmesh_last_error());
        fail = 1;
    }
    xmesh_oob_t wrong = {3, 2, failing_allgather, NULL};
    r = xmesh_ctx_create_nccl_oob(&wrong, -1, NULL, &ctx);
    if (r != XMESH_ERR_INVALID_ARGUMENT || !strstr(xmesh_last_error(), "rank 3")) {
        printf("FAIL rank %s: oob rank 3 of 2 accepted: %s\n", who, xmesh_last_error());
        fail = 1;
    }
    if (!fail)
        printf("rank %s: no CUDA device: refused cleanly on this rank; SKIP: the device half "
               "needs a GPU per rank\n",
               who);
    fflush(stdout);
    return fail ? 1 : 77;
}

int main(void)
{
    int ndev = 0;
    const char *who = getenv("RANK") ? getenv("RANK") : "?";
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1)
        return nodev(who);
    xmesh_ctx_t ctx;
    xmesh_result_t r = xmesh_ctx_create_nccl_oob(NULL, -1, NULL, &ctx);
    if (r == XMESH_ERR_UNSUPPORTED) {
        printf("SKIP rank %s: %s\n", who, xmesh_last_error());
        return 77;
    }
    if (r) {
        printf("FAIL rank %s: create_nccl_oob: %s\n", who, xmesh_last_error());
        return 1;
    }
    int rank, size;
    xmesh_ctx_rank(ctx, &rank);
    xmesh_ctx_size(ctx, &size);
    int *ranks = malloc(sizeof(int) * size), shape[1] = {size};
    for (int i = 0; i < size; i++)
        ranks[i] = i;
    xmesh_mesh_t m;
    xmesh_plan_t p;
    int64_t n = 4096 + 3 * size, ls[1], off[1];
    int holds, ok = 0;
    xmesh_layout_t sl = {1, &n, XMESH_I32, NULL, "S(0)"}, dl = {1, &n, XMESH_I32, NULL, "B"};
    int32_t *hsrc = NULL, *hdst = malloc(sizeof(int32_t) * n);
    void *dsrc = NULL, *ddst = NULL;
    if (xmesh_mesh_create(ctx, 1, shape, ranks, &m))
        goto out;
    sl.mesh = dl.mesh = m;
    if (xmesh_plan_create(ctx, &sl, &dl, NULL, &p))
        goto out_mesh;
    xmesh_layout_local_shape(&sl, rank, ls, &holds);
    xmesh_layout_local_offset(&sl, rank, off, &holds);
    hsrc = malloc(sizeof(int32_t) * (ls[0] + 1));
    for (int64_t i = 0; i < ls[0]; i++)
        hsrc[i] = (int32_t)(5 * (off[0] + i) - 7);
    cudaMalloc(&dsrc, sizeof(int32_t) * (ls[0] + 1));
    cudaMalloc(&ddst, sizeof(int32_t) * n);
    cudaMemcpy(dsrc, hsrc, sizeof(int32_t) * ls[0], cudaMemcpyHostToDevice);
    cudaMemset(ddst, 0xff, sizeof(int32_t) * n);
    if (!xmesh_reshard(p, dsrc, ddst)) {
        cudaMemcpy(hdst, ddst, sizeof(int32_t) * n, cudaMemcpyDeviceToHost);
        ok = 1;
        for (int64_t i = 0; i < n && ok; i++)
            ok = hdst[i] == (int32_t)(5 * i - 7);
    }
    xmesh_plan_destroy(p);
out_mesh:
    xmesh_mesh_destroy(m);
out:
    printf("%s rank %d: NCCL context without MPI, S(0) -> B of %lld i32 on the device: %s\n",
           ok ? "PASS" : "FAIL", rank, (long long)n,
           ok ? "every element right" : xmesh_last_error());
    cudaFree(dsrc);
    cudaFree(ddst);
    free(hsrc);
    free(hdst);
    free(ranks);
    xmesh_ctx_destroy(ctx);
    return ok ? 0 : 1;
}
