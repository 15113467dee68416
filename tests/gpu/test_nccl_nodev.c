/*
 * The NCCL entry points on a machine without a usable CUDA device: context
 * creation must fail cleanly on every rank (UNSUPPORTED, a message naming
 * the cause, *out untouched, no rank left waiting in NCCL's collective
 * init), and the argument checks of the other entry points must hold. This
 * is the one NCCL-path behaviour that can run here; on a machine with a GPU
 * it exits 77 (the matrix in test_nccl.c covers that case).
 */
#include <cuda_runtime_api.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xmesh.h"
#include "xmesh/cuda.h"

int main(int argc, char **argv)
{
    int ndev = 0, rank, fail = 0;
    if (cudaGetDeviceCount(&ndev) == cudaSuccess && ndev > 0) {
        printf("SKIP: %d CUDA device(s) present: this test covers the no-device path\n", ndev);
        return 77;
    }
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    xmesh_ctx_t sentinel = (xmesh_ctx_t)(uintptr_t)0x10, ctx = sentinel;
    xmesh_result_t r = xmesh_ctx_create_nccl(MPI_COMM_WORLD, -1, NULL, &ctx);
    if (r != XMESH_ERR_UNSUPPORTED || ctx != sentinel ||
        !strstr(xmesh_last_error(), "no CUDA device")) {
        fprintf(stderr, "rank %d: ctx_create_nccl: got %s (%s), ctx %p\n", rank,
                xmesh_result_string(r), xmesh_last_error(), (void *)ctx);
        fail = 1;
    }
    xmesh_ctx_params_t bad = XMESH_CTX_PARAMS_INITIALIZER;
    bad.magic = 0;
    if (xmesh_ctx_create_nccl(MPI_COMM_WORLD, 0, &bad, &ctx) != XMESH_ERR_INVALID_ARGUMENT ||
        !strstr(xmesh_last_error(), "magic")) {
        fprintf(stderr, "rank %d: bad params accepted: %s\n", rank, xmesh_last_error());
        fail = 1;
    }
    if (xmesh_ctx_create_nccl(MPI_COMM_WORLD, 0, NULL, NULL) != XMESH_ERR_INVALID_ARGUMENT) {
        fprintf(stderr, "rank %d: NULL out accepted\n", rank);
        fail = 1;
    }
    if (xmesh_reshard_start_on_stream(NULL, NULL, NULL, 0) != XMESH_ERR_INVALID_ARGUMENT) {
        fprintf(stderr, "rank %d: NULL plan accepted\n", rank);
        fail = 1;
    }
    int dev = -5;
    if (xmesh_ctx_cuda_device(NULL, &dev) != XMESH_ERR_INVALID_ARGUMENT || dev != -5) {
        fprintf(stderr, "rank %d: ctx_cuda_device(NULL) accepted\n", rank);
        fail = 1;
    }
    /* A bad XMESH_HOST_ID on one rank fails every rank, before any device
     * or NCCL call: INVALID_ARGUMENT there, REMOTE elsewhere. */
    if (rank == 1)
        setenv("XMESH_HOST_ID", "rank/0", 1);
    ctx = sentinel;
    r = xmesh_ctx_create_nccl(MPI_COMM_WORLD, -1, NULL, &ctx);
    xmesh_result_t want = rank == 1 ? XMESH_ERR_INVALID_ARGUMENT : XMESH_ERR_REMOTE;
    int size = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size > 1 && (r != want || ctx != sentinel)) {
        fprintf(stderr, "rank %d: bad XMESH_HOST_ID on rank 1: got %s (%s)\n", rank,
                xmesh_result_string(r), xmesh_last_error());
        fail = 1;
    }
    unsetenv("XMESH_HOST_ID");
    int any = 0;
    MPI_Allreduce(&fail, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0)
        printf("test_nccl_nodev: %s (context creation refused on every rank: %s)\n",
               any ? "FAILED" : "passed", r == XMESH_ERR_UNSUPPORTED ? "yes" : "no");
    MPI_Finalize();
    return any;
}
