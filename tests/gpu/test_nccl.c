/*
 * GPU correctness matrix of the NCCL backend: run under mpiexec with one rank
 * per GPU (tests/gpu/run.sh does). Exits 77 (skipped) when this rank sees
 * no CUDA device. Every element of every destination block is checked, for
 * both completion styles (request + xmesh_wait, and stream-ordered
 * xmesh_reshard_start_on_stream + cudaStreamSynchronize).
 *
 * The cases are the kinds of the MPI matrix scaled to the ranks available:
 * the source mesh is the first half of the ranks, the destination the
 * second half (the same rank when there is only one), ranks are put on
 * hosts of two (XMESH_HOST_ID-style host_id) so chains cross "hosts".
 * Random data uses a seed printed at start (XMESH_TEST_SEED replays).
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xmesh.h"
#include "xmesh/cuda.h"

static int g_rank, g_size, g_fail;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "rank %d: %s:%d: ", g_rank, __FILE__, __LINE__);                       \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            g_fail = 1;                                                                            \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)
#define XM_OK(call) CHECK((call) == XMESH_SUCCESS, "%s: %s", #call, xmesh_last_error())
#define CU_OK(call)                                                                                \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        CHECK(e_ == cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_));                         \
    } while (0)

/* Host-side f16/bf16 (round to nearest even; values here are small integers,
 * exact in both formats). */
static uint16_t to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t s = (x >> 16) & 0x8000, a = x & 0x7fffffff;
    if (a == 0)
        return (uint16_t)s;
    uint32_t r = a - 0x38000000;
    r += 0xfff + ((r >> 13) & 1);
    return (uint16_t)(s | (r >> 13));
}
static float from_f16(uint16_t h)
{
    uint32_t s = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, x;
    x = e == 0 && m == 0 ? s : s | ((e + 112) << 23) | (m << 13);
    float f;
    memcpy(&f, &x, 4);
    return f;
}
static uint16_t to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}
static float from_bf16(uint16_t h)
{
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static int64_t value(int64_t gidx, int p, int G, uint64_t seed)
{
    int64_t T = (int64_t)((gidx * 37 + 11 + seed) % 201) - 100;
    int64_t D = (int64_t)((gidx * 13 + p + seed) % 7) - 3;
    return p == 0 ? T - (G - 1) * D : D;
}

static void store(xmesh_dtype_t dt, void *b, int64_t i, int64_t v)
{
    switch (dt) {
    case XMESH_U8:
    case XMESH_I8:
        ((uint8_t *)b)[i] = (uint8_t)v;
        break;
    case XMESH_I32:
        ((int32_t *)b)[i] = (int32_t)v;
        break;
    case XMESH_I64:
        ((int64_t *)b)[i] = v;
        break;
    case XMESH_F16:
        ((uint16_t *)b)[i] = to_f16((float)v);
        break;
    case XMESH_BF16:
        ((uint16_t *)b)[i] = to_bf16((float)v);
        break;
    case XMESH_F32:
        ((float *)b)[i] = (float)v;
        break;
    case XMESH_F64:
        ((double *)b)[i] = (double)v;
        break;
    default:
        break;
    }
}

static int64_t load(xmesh_dtype_t dt, const void *b, int64_t i)
{
    switch (dt) {
    case XMESH_U8:
    case XMESH_I8:
        return ((const uint8_t *)b)[i];
    case XMESH_I32:
        return ((const int32_t *)b)[i];
    case XMESH_I64:
        return ((const int64_t *)b)[i];
    case XMESH_F16:
        return llroundf(from_f16(((const uint16_t *)b)[i]));
    case XMESH_BF16:
        return llroundf(from_bf16(((const uint16_t *)b)[i]));
    case XMESH_F32:
        return llroundf(((const float *)b)[i]);
    case XMESH_F64:
        return llround(((const double *)b)[i]);
    default:
        return 0;
    }
}

typedef struct {
    const char *name;
    int ndim;
    int64_t shape[3];
    xmesh_dtype_t dt;
    int src_2d; /* source mesh (2, a/2) instead of (a) when a is even */
    const char *src_spec, *src_spec_2d;
    unsigned pmask; /* P axes of the source mesh */
    const char *dst_spec;
    int overlap; /* both meshes over all ranks */
    xmesh_strategy_t strategy;
    int64_t chunk;
} gcase_t;

static const gcase_t cases[] = {
    {"S0R->S0R", 2, {64, 48}, XMESH_I32, 0, "S0R", NULL, 0, "S0R", 0, XMESH_STRATEGY_BROADCAST, 0},
    {"RR->S0R", 2, {64, 48}, XMESH_F32, 0, "RR", NULL, 0, "S0R", 0, XMESH_STRATEGY_BROADCAST, 512},
    {"RS0->S0R",
     2,
     {64, 48},
     XMESH_I32,
     0,
     "RS0",
     NULL,
     0,
     "S0R",
     0,
     XMESH_STRATEGY_BROADCAST,
     256},
    {"RS0->S0R sendrecv",
     2,
     {64, 48},
     XMESH_F64,
     0,
     "RS0",
     NULL,
     0,
     "S0R",
     0,
     XMESH_STRATEGY_SENDRECV,
     0},
    {"RR->RR bcast",
     1,
     {1 << 16},
     XMESH_U8,
     0,
     "R",
     NULL,
     0,
     "R",
     0,
     XMESH_STRATEGY_BROADCAST,
     4096},
    {"uneven 7x5", 2, {7, 5}, XMESH_I32, 0, "S0R", NULL, 0, "RS0", 0, XMESH_STRATEGY_BROADCAST, 8},
    {"uneven 3-d",
     3,
     {9, 7, 5},
     XMESH_BF16,
     0,
     "RS0R",
     NULL,
     0,
     "RRS0",
     0,
     XMESH_STRATEGY_BROADCAST,
     64},
    {"P->B f16", 2, {32, 24}, XMESH_F16, 0, "P", NULL, 1, "B", 0, XMESH_STRATEGY_BROADCAST, 128},
    {"S(0),P->S(1) bf16",
     2,
     {32, 24},
     XMESH_BF16,
     1,
     "P",
     "S(0),P",
     2,
     "S(1)",
     0,
     XMESH_STRATEGY_BROADCAST,
     96},
    {"P->S(0) f32 sr",
     2,
     {30, 10},
     XMESH_F32,
     0,
     "P",
     NULL,
     1,
     "S(0)",
     0,
     XMESH_STRATEGY_SENDRECV,
     64},
    {"overlap S0R->RS0",
     2,
     {40, 36},
     XMESH_I64,
     0,
     "S0R",
     NULL,
     0,
     "RS0",
     1,
     XMESH_STRATEGY_BROADCAST,
     0},
    {"overlap RR->S0R",
     2,
     {40, 36},
     XMESH_F16,
     0,
     "RR",
     NULL,
     0,
     "S0R",
     1,
     XMESH_STRATEGY_BROADCAST,
     200},
};

static int run(const gcase_t *c, uint64_t seed, xmesh_ctx_t ctx, cudaStream_t stream, int *ran)
{
    int a = g_size >= 2 ? g_size / 2 : 1, b = g_size >= 2 ? g_size - a : 1;
    int src_ranks[64], dst_ranks[64], sshape[2], dshape[1], snd = 1;
    const char *sspec = c->src_spec;
    unsigned pmask = c->pmask;
    xmesh_mesh_t sm = NULL, dm = NULL;
    xmesh_plan_t plan = NULL;
    void *hs = NULL, *hd = NULL, *ds = NULL, *dd = NULL;
    *ran = 0;
    if (c->overlap)
        a = b = g_size;
    for (int i = 0; i < a; i++)
        src_ranks[i] = i;
    for (int i = 0; i < b; i++)
        dst_ranks[i] = c->overlap || g_size == 1 ? i : a + i;
    sshape[0] = a;
    if (c->src_2d) {
        if (a % 2)
            return 0; /* needs an even source mesh */
        snd = 2;
        sshape[0] = 2;
        sshape[1] = a / 2;
        sspec = c->src_spec_2d;
    }
    dshape[0] = b;
    const char *dspec = c->dst_spec;
    int G = 1;
    for (int x = 0; x < snd; x++)
        if (pmask & (1u << x))
            G *= sshape[x];
    XM_OK(xmesh_mesh_create(ctx, snd, sshape, src_ranks, &sm));
    XM_OK(xmesh_mesh_create(ctx, 1, dshape, dst_ranks, &dm));
    xmesh_layout_t sl = {c->ndim, c->shape, c->dt, sm, sspec};
    xmesh_layout_t dl = {c->ndim, c->shape, c->dt, dm, dspec};
    xmesh_plan_params_t pp = XMESH_PLAN_PARAMS_INITIALIZER;
    pp.strategy = c->strategy;
    if (c->chunk)
        pp.chunk_bytes = c->chunk;
    XM_OK(xmesh_plan_create(ctx, &sl, &dl, &pp, &plan));

    size_t es = xmesh_dtype_size(c->dt);
    int64_t sshp[3], soff[3], dshp[3], doff[3], sn = 1, dn = 1;
    int sh, dh;
    XM_OK(xmesh_layout_local_shape(&sl, g_rank, sshp, &sh));
    XM_OK(xmesh_layout_local_offset(&sl, g_rank, soff, &sh));
    XM_OK(xmesh_layout_local_shape(&dl, g_rank, dshp, &dh));
    XM_OK(xmesh_layout_local_offset(&dl, g_rank, doff, &dh));
    for (int d = 0; d < c->ndim; d++) {
        sn *= sshp[d];
        dn *= dshp[d];
    }
    hs = calloc(sn + 1, es);
    hd = calloc(dn + 1, es);
    CHECK(hs && hd, "out of memory");
    if (sh) {
        /* partial coordinate: row-major over the P axes of our mesh index */
        int idx = 0, coord[2] = {0, 0}, p = 0;
        while (src_ranks[idx] != g_rank)
            idx++;
        coord[snd - 1] = idx % sshape[snd - 1];
        if (snd == 2)
            coord[0] = idx / sshape[1];
        for (int x = 0; x < snd; x++)
            if (pmask & (1u << x))
                p = p * sshape[x] + coord[x];
        for (int64_t k = 0; k < sn; k++) {
            int64_t rem = k, g = 0, m[3];
            for (int d = c->ndim - 1; d >= 0; d--) {
                m[d] = soff[d] + rem % sshp[d];
                rem /= sshp[d];
            }
            for (int d = 0; d < c->ndim; d++)
                g = g * c->shape[d] + m[d];
            store(c->dt, hs, k, value(g, p, G, seed));
        }
        CU_OK(cudaMalloc(&ds, sn * es + 1));
        CU_OK(cudaMemcpy(ds, hs, sn * es, cudaMemcpyHostToDevice));
    }
    if (dh)
        CU_OK(cudaMalloc(&dd, dn * es + 1));
    for (int style = 0; style < 2; style++) {
        if (dh)
            CU_OK(cudaMemset(dd, 0xA5, dn * es)); /* poison */
        CU_OK(cudaDeviceSynchronize());
        if (style == 0) {
            XM_OK(xmesh_reshard(plan, ds, dd));
        } else {
            XM_OK(xmesh_reshard_start_on_stream(plan, ds, dd, stream));
            CU_OK(cudaStreamSynchronize(stream));
        }
        if (!dh)
            continue;
        CU_OK(cudaMemcpy(hd, dd, dn * es, cudaMemcpyDeviceToHost));
        for (int64_t k = 0; k < dn; k++) {
            int64_t rem = k, g = 0, m[3], want = 0;
            for (int d = c->ndim - 1; d >= 0; d--) {
                m[d] = doff[d] + rem % dshp[d];
                rem /= dshp[d];
            }
            for (int d = 0; d < c->ndim; d++)
                g = g * c->shape[d] + m[d];
            for (int p = 0; p < G; p++)
                want += value(g, p, G, seed);
            if (c->dt == XMESH_U8 || c->dt == XMESH_I8)
                want &= 0xff;
            int64_t got = load(c->dt, hd, k);
            CHECK(got == want, "%s (%s): dst element %lld (global %lld): got %lld want %lld",
                  c->name, style ? "on_stream" : "wait", (long long)k, (long long)g, (long long)got,
                  (long long)want);
        }
    }
    *ran = 1;
out:
    cudaFree(ds);
    cudaFree(dd);
    free(hs);
    free(hd);
    xmesh_plan_destroy(plan);
    xmesh_mesh_destroy(sm);
    xmesh_mesh_destroy(dm);
    return g_fail;
}

int main(int argc, char **argv)
{
    int ndev = 0;
    cudaError_t ce = cudaGetDeviceCount(&ndev);
    if (ce != cudaSuccess || ndev == 0) {
        printf("SKIP: no CUDA device (%s): the NCCL matrix needs a GPU per rank\n",
               ce != cudaSuccess ? cudaGetErrorString(ce) : "0 devices");
        return 77;
    }
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    const char *e = getenv("XMESH_TEST_SEED");
    uint64_t seed = e && *e ? strtoull(e, NULL, 0) : 7;
    if (g_rank == 0)
        printf("test_nccl: %d rank(s), seed %llu (replay with XMESH_TEST_SEED)\n", g_size,
               (unsigned long long)seed);
    xmesh_ctx_t ctx = NULL;
    xmesh_ctx_params_t cp = XMESH_CTX_PARAMS_INITIALIZER;
    cp.host_id = g_rank / 2; /* two ranks per "host": chains cross hosts */
    cudaStream_t stream = NULL;
    int passed = 0, skipped = 0;
    XM_OK(xmesh_ctx_create_nccl(MPI_COMM_WORLD, -1, &cp, &ctx));
    CU_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int ran = 0;
        g_fail = 0;
        run(&cases[i], seed, ctx, stream, &ran);
        int bad = g_fail, any_bad = 0;
        MPI_Allreduce(&bad, &any_bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        if (g_rank == 0)
            printf("  %-22s %s\n", cases[i].name,
                   any_bad ? "FAIL"
                   : ran   ? "ok"
                           : "skipped (needs an even source mesh)");
        if (any_bad) {
            g_fail = 1;
            break;
        }
        passed += ran;
        skipped += !ran;
    }
out:
    if (stream)
        cudaStreamDestroy(stream);
    xmesh_ctx_destroy(ctx);
    if (g_rank == 0)
        printf("test_nccl: %s (%d passed, %d not applicable)\n", g_fail ? "FAILED" : "passed",
               passed, skipped);
    MPI_Finalize();
    return g_fail ? 1 : 0;
}
