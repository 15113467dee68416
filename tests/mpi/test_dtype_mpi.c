/* Converting reshards under mpiexec (docs/DTYPES.md).
 *
 *   mpiexec -n N test_dtype_mpi [--per-host H]
 *
 * Every ordered pair of different dtypes among f32, f16 and bf16, over a few
 * mesh / sharding pairs (split to split on other devices, split to
 * replicated with forwarding chains, a partial (P) source, the same mesh so
 * that blocks convert in place) and every strategy: each destination
 * element is compared with the reference conversion of its source value
 * (tests/common/dtype_ref.h, written from the formats' definitions), values
 * that cover NaN, infinities, signed zeros, subnormals, f16 overflow and
 * rounding ties; partial sums are exact in f32 and rounded once.
 *
 * Bytes on the wire: MPI_Isend is wrapped (PMPI) to count the bytes this
 * rank sends to other (fake) hosts during a reshard. With one rank per host
 * and no partial sums every receiver gets each of its boxes exactly once
 * across hosts, so the counted bytes, summed over ranks, must equal
 * xmesh_plan_get_info's bytes_cross_host, which must equal the f32 -> f32
 * plan's scaled to the narrower dtype: the narrow dtype is what crosses.
 *
 * --expect-corrupt (with XMESH_CHECK=1 XMESH_TEST_CORRUPT=1, 2 ranks): rank
 * 1 damages the first chunk it receives in every reshard; XMESH_CHECK must
 * report it on every converting pair (receivers that convert checksum the
 * bytes they received, the others their written block).
 *
 * Refusals: pairs outside f32/f16/bf16 fail plan creation with
 * INVALID_ARGUMENT and a message naming both dtypes, the plan handle
 * untouched. Deterministic (no random cases). Exit 0 iff all checks pass. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xmesh.h>
#include <xmesh/mpi.h>

#include "dtype_ref.h"

static int g_rank, g_size, g_fail, g_per_host = 1;
/* --expect-corrupt (with XMESH_CHECK=1 XMESH_TEST_CORRUPT=r): a reshard may
 * fail, only with XMESH_CHECK's corruption report; per dtype pair the
 * failures seen on this rank. */
static int g_expect_corrupt;
static int64_t g_corrupt_seen[3][3];

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "rank %d: %s:%d: ", g_rank, __FILE__, __LINE__);                       \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            g_fail = 1;                                                                            \
        }                                                                                          \
    } while (0)

/* ------------------------------------------------ counting MPI_Isend */

static int g_counting;
static int64_t g_cross_bytes;

static void count_send(int count, MPI_Datatype dt, int dest)
{
    if (__atomic_load_n(&g_counting, __ATOMIC_ACQUIRE)) {
        int sz = 0;
        PMPI_Type_size(dt, &sz);
        /* plan communicators duplicate MPI_COMM_WORLD: same rank numbers */
        if (dest / g_per_host != g_rank / g_per_host)
            __atomic_fetch_add(&g_cross_bytes, (int64_t)count * sz, __ATOMIC_RELAXED);
    }
}

/* The executor's chunk sends: MPI_Issend between hosts (XMESH_SYNC_SEND=1),
 * MPI_Isend otherwise; both are counted. */
int MPI_Isend(const void *buf, int count, MPI_Datatype dt, int dest, int tag, MPI_Comm comm,
              MPI_Request *req)
{
    count_send(count, dt, dest);
    return PMPI_Isend(buf, count, dt, dest, tag, comm, req);
}

int MPI_Issend(const void *buf, int count, MPI_Datatype dt, int dest, int tag, MPI_Comm comm,
               MPI_Request *req)
{
    count_send(count, dt, dest);
    return PMPI_Issend(buf, count, dt, dest, tag, comm, req);
}

/* ------------------------------------------------------------ values */

/* f32 bit pattern of element g (no partial sums): every class. */
static uint32_t value_bits(int64_t g)
{
    uint64_t h = (uint64_t)(g + 1) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
    uint32_t u = (uint32_t)(h >> 32);
    switch (g % 11) {
    case 0:
        return (u & 0x80000000u) | 0x7fc00000u | (u & 0x3fffffu); /* quiet NaN */
    case 1:
        return (u & 0x80000000u) | 0x7f800000u; /* +-inf */
    case 2:
        return u & 0x807fffffu; /* f32 subnormal */
    case 3:
        return (u & 0x80ffffffu) | (0x67u << 23); /* f16 subnormal range */
    case 4:
        return (u & 0x807fffffu) | (0x8eu << 23); /* f16 max and overflow */
    case 5:
        return (u & 0xffff0000u) | 0x8000u; /* a bf16 tie */
    case 6:
        return g % 2 ? 0x80000000u : 0u;
    default:
        return (u & 0x81ffffffu) | (0x7cu << 23);
    }
}

/* Part p of element g (partial sums): 8 significant bits, multiples of
 * 2^-4, below 2^8: exact in every dtype, and any sum of a few is exact in
 * f32. */
static float part_value(int64_t g, int p)
{
    int k = (int)((g * 37 + p * 11) % 255) - 127;
    return ldexpf((float)k, (int)((g + p) % 5) - 4);
}

static int is_nan32(uint32_t x)
{
    return (x & 0x7fffffffu) > 0x7f800000u;
}

/* f32 bits to dtype dt (reference; NaN: the quiet NaN of the sign). */
static void encode(xmesh_dtype_t dt, uint32_t x, void *out)
{
    if (dt == XMESH_F32) {
        memcpy(out, &x, 4);
        return;
    }
    uint16_t h;
    if (is_nan32(x))
        h = (uint16_t)(((x >> 16) & 0x8000u) | (dt == XMESH_BF16 ? 0x7fc0u : 0x7e00u));
    else
        h = dt == XMESH_BF16 ? ref_bf16(x) : ref_f16(x);
    memcpy(out, &h, 2);
}

static uint32_t decode(xmesh_dtype_t dt, const void *p)
{
    return ref_to_f32((int)xmesh_dtype_size(dt), dt == XMESH_BF16, p);
}

/* ------------------------------------------------------------- cases */

typedef struct {
    const char *name;
    int ndim;
    int64_t shape[2];
    int src_nd, src_shape[2], src_rank0, src_step; /* ranks src_rank0 + i * src_step */
    const char *src_spec;
    int dst_nd, dst_shape[2], dst_rank0, dst_step;
    const char *dst_spec;
    int partial; /* the source spec has P */
} case_t;

static int mesh_of(xmesh_ctx_t ctx, int nd, const int *shape, int r0, int step, xmesh_mesh_t *m)
{
    int n = 1, ranks[64];
    for (int a = 0; a < nd; a++)
        n *= shape[a];
    for (int i = 0; i < n; i++)
        ranks[i] = r0 + i * step;
    return xmesh_mesh_create(ctx, nd, shape, ranks, m);
}

/* Local block of layout l on this rank: element count, and its global
 * row-major index of local element k (2-d tensors). */
static int64_t block_of(const xmesh_layout_t *l, int64_t *lshape, int64_t *loff)
{
    int holds = 0;
    if (xmesh_layout_local_shape(l, g_rank, lshape, &holds) ||
        xmesh_layout_local_offset(l, g_rank, loff, &holds) || !holds)
        return -1;
    return lshape[0] * lshape[1];
}

static int64_t global_index(const xmesh_layout_t *l, const int64_t *lshape, const int64_t *loff,
                            int64_t k)
{
    return (loff[0] + k / lshape[1]) * l->shape[1] + loff[1] + k % lshape[1];
}

/* Partial group of this rank in a "P,S(0)" 2 x n/2 mesh or a "P" 1-d mesh. */
static int part_group(const case_t *c, int *G)
{
    int i = (g_rank - c->src_rank0) / c->src_step;
    if (c->src_nd == 2) {
        *G = c->src_shape[0];
        return i / c->src_shape[1];
    }
    *G = c->src_shape[0];
    return i;
}

/* Runs case c from dtype sdt to ddt with strategy st; checks every element
 * and returns the plan's bytes_cross_host (through *info) and the counted
 * cross-host bytes summed over ranks. */
static void run(xmesh_ctx_t ctx, const case_t *c, xmesh_dtype_t sdt, xmesh_dtype_t ddt,
                xmesh_strategy_t st, xmesh_plan_info_t *info, int64_t *counted)
{
    xmesh_mesh_t ms = NULL, md = NULL;
    xmesh_plan_t plan = NULL;
    char what[160];
    snprintf(what, sizeof what, "%s %s -> %s strategy %s", c->name, xmesh_dtype_name(sdt),
             xmesh_dtype_name(ddt), xmesh_strategy_name(st));
    if (mesh_of(ctx, c->src_nd, c->src_shape, c->src_rank0, c->src_step, &ms) ||
        mesh_of(ctx, c->dst_nd, c->dst_shape, c->dst_rank0, c->dst_step, &md)) {
        CHECK(0, "%s: mesh: %s", what, xmesh_last_error());
        goto out;
    }
    xmesh_layout_t src = {c->ndim, c->shape, sdt, ms, c->src_spec};
    xmesh_layout_t dst = {c->ndim, c->shape, ddt, md, c->dst_spec};
    xmesh_plan_params_t pp = XMESH_PLAN_PARAMS_INITIALIZER;
    pp.strategy = st;
    pp.chunk_bytes = 24; /* several chunks per box, odd element counts */
    xmesh_result_t r = xmesh_plan_create(ctx, &src, &dst, &pp, &plan);
    if (r) {
        CHECK(0, "%s: plan: %s", what, xmesh_last_error());
        goto out;
    }
    CHECK(xmesh_plan_get_info(plan, info) == XMESH_SUCCESS, "%s: info", what);
    int64_t sshape[2], soff[2], dshape[2], doff[2];
    int64_t ns = block_of(&src, sshape, soff), nd = block_of(&dst, dshape, doff);
    size_t ses = xmesh_dtype_size(sdt), des = xmesh_dtype_size(ddt);
    char *sb = ns > 0 ? malloc((size_t)ns * ses) : NULL;
    char *db = nd > 0 ? malloc((size_t)nd * des) : NULL;
    int G = 1, pg = ns >= 0 && c->partial ? part_group(c, &G) : 0;
    for (int64_t k = 0; k < ns; k++) {
        int64_t g = global_index(&src, sshape, soff, k);
        uint32_t x;
        if (c->partial) {
            float f = part_value(g, pg);
            memcpy(&x, &f, 4);
        } else {
            x = value_bits(g);
        }
        encode(sdt, x, sb + k * (int64_t)ses);
    }
    if (nd > 0)
        memset(db, 0xA5, (size_t)nd * des);
    g_cross_bytes = 0;
    MPI_Barrier(MPI_COMM_WORLD);
    __atomic_store_n(&g_counting, 1, __ATOMIC_RELEASE);
    r = xmesh_reshard(plan, sb, db);
    __atomic_store_n(&g_counting, 0, __ATOMIC_RELEASE);
    if (g_expect_corrupt && r) {
        CHECK(r == XMESH_ERR_BACKEND && strstr(xmesh_last_error(), "XMESH_CHECK") &&
                  strstr(xmesh_last_error(), "corrupt"),
              "%s: reshard: %s", what, xmesh_last_error());
        g_corrupt_seen[sdt == XMESH_F32   ? 0
                       : sdt == XMESH_F16 ? 1
                                          : 2][ddt == XMESH_F32   ? 0
                                               : ddt == XMESH_F16 ? 1
                                                                  : 2]++;
        nd = 0; /* the received values are undefined */
    } else {
        CHECK(r == XMESH_SUCCESS, "%s: reshard: %s", what, xmesh_last_error());
    }
    MPI_Allreduce(&g_cross_bytes, counted, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    int64_t wrong = 0;
    for (int64_t k = 0; k < nd && !r; k++) {
        int64_t g = global_index(&dst, dshape, doff, k);
        char want[4], *got = db + k * (int64_t)des;
        uint32_t v; /* the source value as f32 (exact), or the exact sum */
        if (c->partial) {
            double sum = 0;
            for (int p = 0; p < G; p++) {
                char sv[4];
                float f = part_value(g, p);
                uint32_t pb;
                memcpy(&pb, &f, 4);
                encode(sdt, pb, sv);
                pb = decode(sdt, sv);
                memcpy(&f, &pb, 4);
                sum += f;
            }
            float fs = (float)sum;
            CHECK((double)fs == sum, "%s: test values: sum not exact", what);
            memcpy(&v, &fs, 4);
        } else {
            char sv[4];
            encode(sdt, value_bits(g), sv);
            v = decode(sdt, sv);
        }
        encode(ddt, v, want);
        uint32_t gb = decode(ddt, got), wb = decode(ddt, want);
        int ok =
            is_nan32(wb) ? is_nan32(gb) && (gb >> 31) == (wb >> 31) : memcmp(got, want, des) == 0;
        if (!ok && wrong++ < 3)
            CHECK(0, "%s: dst element %lld (global %lld): got f32 0x%08x, want 0x%08x", what,
                  (long long)k, (long long)g, gb, wb);
    }
    CHECK(wrong == 0, "%s: %lld of %lld elements wrong", what, (long long)wrong, (long long)nd);
    free(sb);
    free(db);
out:
    xmesh_plan_destroy(plan);
    xmesh_mesh_destroy(ms);
    xmesh_mesh_destroy(md);
}

static void refusals(xmesh_ctx_t ctx)
{
    static const xmesh_dtype_t bad[][2] = {{XMESH_I32, XMESH_F32},
                                           {XMESH_F64, XMESH_F32},
                                           {XMESH_F32, XMESH_I8},
                                           {XMESH_U8, XMESH_F16},
                                           {XMESH_BF16, XMESH_F64}};
    int shape[1] = {g_size}, ranks[64];
    for (int i = 0; i < g_size; i++)
        ranks[i] = i;
    xmesh_mesh_t m = NULL;
    CHECK(xmesh_mesh_create(ctx, 1, shape, ranks, &m) == XMESH_SUCCESS, "mesh");
    int64_t ts[1] = {4 * (int64_t)g_size};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        xmesh_layout_t src = {1, ts, bad[i][0], m, "S0"}, dst = {1, ts, bad[i][1], m, "R"};
        xmesh_plan_t plan = (xmesh_plan_t)&src; /* must stay as it is */
        xmesh_result_t r = xmesh_plan_create(ctx, &src, &dst, NULL, &plan);
        const char *msg = xmesh_last_error();
        char s1[32], s2[32];
        snprintf(s1, sizeof s1, "dtype %s", xmesh_dtype_name(bad[i][0]));
        snprintf(s2, sizeof s2, "dtype %s", xmesh_dtype_name(bad[i][1]));
        CHECK(r == XMESH_ERR_INVALID_ARGUMENT && strstr(msg, s1) && strstr(msg, s2) &&
                  plan == (xmesh_plan_t)&src,
              "refusal %s -> %s: result %d, message '%s'", xmesh_dtype_name(bad[i][0]),
              xmesh_dtype_name(bad[i][1]), (int)r, msg);
    }
    xmesh_mesh_destroy(m);
}

int main(int argc, char **argv)
{
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--expect-corrupt"))
            g_expect_corrupt = 1;
        else if (!strcmp(argv[i], "--per-host") && i + 1 < argc)
            g_per_host = atoi(argv[++i]);
    if (g_per_host < 1 || g_size < 2 || g_size > 64) {
        if (!g_rank)
            fprintf(stderr, "usage: mpiexec -n 2..64 %s [--per-host H]\n", argv[0]);
        MPI_Finalize();
        return 2;
    }
#ifndef XMESH_TEST_HOOKS
    if (g_expect_corrupt) { /* XMESH_TEST_CORRUPT exists only in test builds */
        if (!g_rank)
            printf("SKIP: --expect-corrupt: library built without XMESH_TEST_HOOKS\n");
        MPI_Finalize();
        return 0;
    }
#endif
    xmesh_ctx_params_t cp = XMESH_CTX_PARAMS_INITIALIZER;
    cp.host_id = g_rank / g_per_host;
    xmesh_ctx_t ctx = NULL;
    if (xmesh_ctx_create_mpi(MPI_COMM_WORLD, &cp, &ctx)) {
        fprintf(stderr, "rank %d: ctx: %s\n", g_rank, xmesh_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    int n = g_size, h = n / 2;
    /* name, ndim, shape, src mesh (nd, shape, rank0, step), spec, dst mesh, spec, P */
    const case_t cases[] = {
        {"split->split",
         2,
         {11, 2 * n + 3},
         1,
         {n, 0},
         0,
         1,
         "S(0)",
         1,
         {n, 0},
         n - 1,
         -1,
         "S(1)",
         0},
        {"split->bcast", 2, {9, 7}, 1, {h, 0}, 0, 1, "S(1)", 1, {n - h, 0}, h, 1, "B", 0},
        {"same-mesh", 2, {6, 2 * n + 1}, 1, {n, 0}, 0, 1, "S(1)", 1, {n, 0}, 0, 1, "S(1)", 0},
        n % 2 == 0 ? (case_t){"partial",
                              2,
                              {7, 2 * n + 1},
                              2,
                              {2, h},
                              0,
                              1,
                              "P,S(1)",
                              1,
                              {n, 0},
                              n - 1,
                              -1,
                              "S(0)",
                              1}
                   : (case_t){"partial",
                              2,
                              {7, 2 * n + 1},
                              1,
                              {n, 0},
                              0,
                              1,
                              "P",
                              1,
                              {n, 0},
                              n - 1,
                              -1,
                              "S(0)",
                              1},
    };
    static const xmesh_dtype_t fam[] = {XMESH_F32, XMESH_F16, XMESH_BF16};
    static const xmesh_strategy_t strategies[] = {XMESH_STRATEGY_BROADCAST, XMESH_STRATEGY_SENDRECV,
                                                  XMESH_STRATEGY_SENDRECV_ALLGATHER,
                                                  XMESH_STRATEGY_GLOBAL_ALLGATHER};
    int nruns = 0, nbytes_checks = 0;
    /* XMESH_CHECK=1 adds checksum messages to what crosses hosts */
    const char *ck = getenv("XMESH_CHECK");
    int checksums = ck && *ck && strcmp(ck, "0");
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (int k = 0; k < (g_expect_corrupt ? 2 : 4); k++) {
            /* (--expect-corrupt: the point-to-point strategies; in the
             * all-gather ones a rank that stops on corrupt data leaves the
             * ring it feeds to the timeout) */
            xmesh_plan_info_t same, info;
            int64_t counted_same = 0, counted = 0;
            /* the f32 -> f32 plan, for the byte comparison */
            run(ctx, &cases[ci], XMESH_F32, XMESH_F32, strategies[k], &same, &counted_same);
            for (int a = 0; a < 3; a++)
                for (int b = 0; b < 3; b++) {
                    if (a == b)
                        continue;
                    run(ctx, &cases[ci], fam[a], fam[b], strategies[k], &info, &counted);
                    nruns++;
                    const case_t *c = &cases[ci];
                    size_t sa = xmesh_dtype_size(fam[a]), sb = xmesh_dtype_size(fam[b]);
                    size_t wire = c->partial ? sb : sa < sb ? sa : sb;
                    CHECK(info.bytes_cross_host == same.bytes_cross_host / 4 * (int64_t)wire,
                          "%s %s -> %s: bytes_cross_host %lld, f32 plan's %lld: want %zu bytes "
                          "per element",
                          c->name, xmesh_dtype_name(fam[a]), xmesh_dtype_name(fam[b]),
                          (long long)info.bytes_cross_host, (long long)same.bytes_cross_host, wire);
                    CHECK(info.bytes_total == same.bytes_total / 4 * (int64_t)sa,
                          "bytes_total %lld", (long long)info.bytes_total);
                    /* what crossed hosts: one rank per host, no partial
                     * sums, point-to-point strategies: each receiver gets
                     * each box once */
                    if (g_per_host == 1 && !c->partial && k < 2 && !checksums) {
                        CHECK(counted == info.bytes_cross_host &&
                                  counted_same == same.bytes_cross_host,
                              "%s %s -> %s strategy %d: counted %lld cross-host bytes (f32 plan "
                              "%lld), bytes_cross_host %lld (f32 plan %lld)",
                              c->name, xmesh_dtype_name(fam[a]), xmesh_dtype_name(fam[b]), k,
                              (long long)counted, (long long)counted_same,
                              (long long)info.bytes_cross_host, (long long)same.bytes_cross_host);
                        nbytes_checks++;
                    }
                }
        }
    refusals(ctx);
    if (g_expect_corrupt) { /* the checksums caught damage on every converting pair */
        int64_t seen[3][3];
        MPI_Allreduce(g_corrupt_seen, seen, 9, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
        for (int a = 0; a < 3; a++)
            for (int b = 0; b < 3; b++)
                CHECK((a == b && a) || seen[a][b] > 0,
                      "--expect-corrupt: no corruption reported for %s -> %s",
                      xmesh_dtype_name(fam[a]), xmesh_dtype_name(fam[b]));
    }
    xmesh_ctx_destroy(ctx);
    int fail = 0;
    MPI_Allreduce(&g_fail, &fail, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (!g_rank)
        printf("test_dtype_mpi: %d ranks, %d per host: %d converting reshards, %d byte counts: "
               "%s\n",
               g_size, g_per_host, nruns, nbytes_checks, fail ? "FAILED" : "ok");
    MPI_Finalize();
    return fail ? 1 : 0;
}
