/*
 * Broadcast bandwidth sweep, xmesh (NCCL backend) against ncclBroadcast,
 * in the manner of nccl-tests' broadcast_perf. Rank 0 holds a replicated
 * 1-d u8 tensor (mesh (1)); ranks 1..N-1 receive it replicated (mesh
 * (N-1)): xmesh builds a pipelined chain of grouped ncclSend/ncclRecv,
 * the reference is one ncclBroadcast from root 0 over all N ranks.
 *
 * Figures (per size; medians over -n iterations after -w warm-up, with min
 * and max): time = wall time from a barrier until the last rank's stream
 * finished (max over ranks); algbw = bytes / time; for a broadcast
 * nccl-tests' busbw equals algbw. #wrong counts bytes of the xmesh result
 * that differ from the source on the receivers (checked once per size).
 *
 * usage: mpiexec -n N xmesh-gpu-bcast-bench [-b min] [-e max] [-f factor]
 *                      [-n iters] [-w warmup] [-c chunk_bytes] [-J out.json]
 */
#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "xmesh.h"
#include "xmesh/cuda.h"

static int rank, size;

static void die(const char *what, const char *why)
{
    fprintf(stderr, "rank %d: %s: %s\n", rank, what, why);
    MPI_Abort(MPI_COMM_WORLD, 1);
}
#define CU(c)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (c);                                                                      \
        if (e_ != cudaSuccess)                                                                     \
            die(#c, cudaGetErrorString(e_));                                                       \
    } while (0)
#define NC(c)                                                                                      \
    do {                                                                                           \
        ncclResult_t e_ = (c);                                                                     \
        if (e_ != ncclSuccess)                                                                     \
            die(#c, ncclGetErrorString(e_));                                                       \
    } while (0)
#define XM(c)                                                                                      \
    do {                                                                                           \
        if ((c) != XMESH_SUCCESS)                                                                  \
            die(#c, xmesh_last_error());                                                           \
    } while (0)

static int64_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'K':
    case 'k':
        v *= 1024;
        break;
    case 'M':
    case 'm':
        v *= 1024 * 1024;
        break;
    case 'G':
    case 'g':
        v *= 1024.0 * 1024 * 1024;
        break;
    default:
        break;
    }
    return (int64_t)v;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct {
    double med, min, max;
} stat_t;

static stat_t stats(double *t, int n)
{
    qsort(t, n, sizeof *t, cmp_d);
    stat_t s = {n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]), t[0], t[n - 1]};
    return s;
}

/* Times one iteration: barrier, enqueue, wait for the stream, max over ranks. */
static double time_one(int which, xmesh_plan_t plan, ncclComm_t nc, void *buf, void *dst,
                       int64_t bytes, cudaStream_t st)
{
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    if (which == 0)
        XM(xmesh_reshard_start_on_stream(plan, rank == 0 ? buf : NULL, rank == 0 ? NULL : dst, st));
    else
        NC(ncclBroadcast(buf, buf, (size_t)bytes, ncclUint8, 0, nc, st));
    CU(cudaStreamSynchronize(st));
    double dt = MPI_Wtime() - t0, mx = 0;
    MPI_Allreduce(&dt, &mx, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return mx;
}

int main(int argc, char **argv)
{
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        fprintf(stderr, "xmesh-gpu-bcast-bench: no CUDA device: nothing measured\n");
        return 77;
    }
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int64_t minb = 1024, maxb = 256 << 20, chunk = -1;
    int factor = 4, iters = 20, warm = 5, opt;
    const char *json = NULL;
    while ((opt = getopt(argc, argv, "b:e:f:n:w:c:J:")) != -1) {
        switch (opt) {
        case 'b':
            minb = parse_size(optarg);
            break;
        case 'e':
            maxb = parse_size(optarg);
            break;
        case 'f':
            factor = atoi(optarg);
            break;
        case 'n':
            iters = atoi(optarg);
            break;
        case 'w':
            warm = atoi(optarg);
            break;
        case 'c':
            chunk = parse_size(optarg);
            break;
        case 'J':
            json = optarg;
            break;
        default:
            if (rank == 0)
                fprintf(stderr,
                        "usage: %s [-b min] [-e max] [-f factor] [-n iters] [-w warmup] "
                        "[-c chunk] [-J out.json]\n",
                        argv[0]);
            MPI_Finalize();
            return 2;
        }
    }
    if (size < 2 || factor < 2 || iters < 1 || minb < 1 || maxb < minb) {
        if (rank == 0)
            fprintf(stderr, "xmesh-gpu-bcast-bench: needs >= 2 ranks (one per GPU), -f >= 2, "
                            "-n >= 1, 1 <= -b <= -e\n");
        MPI_Finalize();
        return 2;
    }
    xmesh_ctx_t ctx;
    XM(xmesh_ctx_create_nccl(MPI_COMM_WORLD, -1, NULL, &ctx));
    int dev;
    XM(xmesh_ctx_cuda_device(ctx, &dev));
    CU(cudaSetDevice(dev));
    ncclUniqueId id;
    if (rank == 0)
        NC(ncclGetUniqueId(&id));
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    ncclComm_t nc;
    NC(ncclCommInitRank(&nc, size, id, rank));
    cudaStream_t st;
    CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    int src_rank = 0, one = 1, nrecv = size - 1;
    int *recv_ranks = malloc(sizeof(int) * nrecv);
    for (int i = 0; i < nrecv; i++)
        recv_ranks[i] = i + 1;
    xmesh_mesh_t sm, dm;
    XM(xmesh_mesh_create(ctx, 1, &one, &src_rank, &sm));
    XM(xmesh_mesh_create(ctx, 1, &nrecv, recv_ranks, &dm));

    FILE *jf = NULL;
    if (rank == 0) {
        printf("# broadcast 1 -> %d ranks; time = max over ranks, median over %d iters "
               "[min, max]; algbw = busbw = bytes / time\n",
               nrecv, iters);
        printf("%12s  %28s %9s  %28s %9s  %7s %7s\n", "bytes", "xmesh time us [min,max]",
               "algbw GB/s", "ncclBroadcast us [min,max]", "algbw GB/s", "xm/nccl", "#wrong");
        if (json && !(jf = fopen(json, "w")))
            die("fopen", json);
        if (jf)
            fprintf(jf, "{\"ranks\": %d, \"iters\": %d, \"warmup\": %d, \"results\": [", size,
                    iters, warm);
    }
    double *t = malloc(sizeof(double) * iters);
    int first = 1;
    for (int64_t bytes = minb; bytes <= maxb; bytes *= factor) {
        void *buf, *dst;
        CU(cudaMalloc(&buf, bytes));
        CU(cudaMalloc(&dst, bytes));
        unsigned char *h = malloc(bytes);
        for (int64_t i = 0; i < bytes; i++)
            h[i] = (unsigned char)(i * 131 + 7);
        CU(cudaMemcpy(buf, h, bytes, cudaMemcpyHostToDevice));
        int64_t shape = bytes;
        xmesh_layout_t sl = {1, &shape, XMESH_U8, sm, "R"}, dl = {1, &shape, XMESH_U8, dm, "R"};
        xmesh_plan_params_t pp = XMESH_PLAN_PARAMS_INITIALIZER;
        pp.strategy = XMESH_STRATEGY_BROADCAST;
        if (chunk > 0)
            pp.chunk_bytes = chunk;
        xmesh_plan_t plan;
        XM(xmesh_plan_create(ctx, &sl, &dl, &pp, &plan));
        stat_t s[2];
        for (int which = 0; which < 2; which++) {
            for (int i = 0; i < warm; i++)
                time_one(which, plan, nc, buf, dst, bytes, st);
            for (int i = 0; i < iters; i++)
                t[i] = time_one(which, plan, nc, buf, dst, bytes, st);
            s[which] = stats(t, iters);
        }
        /* correctness of the xmesh result on every receiver */
        CU(cudaMemset(dst, 0, bytes));
        time_one(0, plan, nc, buf, dst, bytes, st);
        long long wrong = 0, all = 0;
        if (rank != 0) {
            unsigned char *g = malloc(bytes);
            CU(cudaMemcpy(g, dst, bytes, cudaMemcpyDeviceToHost));
            for (int64_t i = 0; i < bytes; i++)
                wrong += g[i] != (unsigned char)(i * 131 + 7);
            free(g);
        }
        MPI_Reduce(&wrong, &all, 1, MPI_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
        if (rank == 0) {
            printf("%12lld  %10.1f [%7.1f,%8.1f] %9.2f  %10.1f [%7.1f,%8.1f] %9.2f  %7.2f %7lld\n",
                   (long long)bytes, s[0].med * 1e6, s[0].min * 1e6, s[0].max * 1e6,
                   bytes / s[0].med / 1e9, s[1].med * 1e6, s[1].min * 1e6, s[1].max * 1e6,
                   bytes / s[1].med / 1e9, s[0].med / s[1].med, all);
            if (jf)
                fprintf(jf,
                        "%s\n  {\"bytes\": %lld, \"xmesh_s\": {\"median\": %.9g, \"min\": %.9g, "
                        "\"max\": %.9g}, \"nccl_broadcast_s\": {\"median\": %.9g, \"min\": %.9g, "
                        "\"max\": %.9g}, \"wrong\": %lld}",
                        first ? "" : ",", (long long)bytes, s[0].med, s[0].min, s[0].max, s[1].med,
                        s[1].min, s[1].max, all);
            first = 0;
        }
        XM(xmesh_plan_destroy(plan));
        free(h);
        CU(cudaFree(buf));
        CU(cudaFree(dst));
        if (bytes > INT64_MAX / factor)
            break;
    }
    if (jf) {
        fprintf(jf, "\n]}\n");
        fclose(jf);
    }
    free(t);
    free(recv_ranks);
    XM(xmesh_mesh_destroy(sm));
    XM(xmesh_mesh_destroy(dm));
    ncclCommDestroy(nc);
    cudaStreamDestroy(st);
    XM(xmesh_ctx_destroy(ctx));
    MPI_Finalize();
    return 0;
}
