/* The MPI executor at every MPI thread level.
 *
 *   mpiexec -n 4 test_levels single|funneled|serialized|multiple [--per-host N] [--seed S]
 *
 * Calls MPI_Init_thread with the level named on the command line, checks
 * that xmesh_ctx_create_mpi accepts it, then runs a matrix of reshards
 * (strategies x shardings x dtypes x chunk sizes, blocking xmesh_reshard)
 * checking every destination element, and start / compute / test / wait:
 * the caller computes while polling xmesh_test (the only progress below
 * MPI_THREAD_MULTIPLE), then waits. At MULTIPLE it also checks that a
 * reshard completes while the caller computes without calling xmesh_test
 * (progress thread). Exit 0 iff every element of every case is right. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <xmesh.h>
#include <xmesh/mpi.h>
#ifdef __linux__
#include <errno.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

static int g_rank, g_size, g_fail;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "rank %d: %s:%d: ", g_rank, __FILE__, __LINE__);                       \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            g_fail = 1;                                                                            \
        }                                                                                          \
    } while (0)

/* Value of global element `gi` of a tensor of dtype dt: small integers so
 * that every dtype (f16/bf16 included) represents them exactly. */
static double value_of(int64_t gi, int salt)
{
    return (double)((gi * 7 + salt) % 251);
}

static void put(void *buf, int64_t i, xmesh_dtype_t dt, double v)
{
    switch (dt) {
    case XMESH_I32:
        ((int32_t *)buf)[i] = (int32_t)v;
        break;
    case XMESH_F32:
        ((float *)buf)[i] = (float)v;
        break;
    case XMESH_F64:
        ((double *)buf)[i] = v;
        break;
    default:
        ((uint8_t *)buf)[i] = (uint8_t)v;
        break;
    }
}

static double get(const void *buf, int64_t i, xmesh_dtype_t dt)
{
    switch (dt) {
    case XMESH_I32:
        return ((const int32_t *)buf)[i];
    case XMESH_F32:
        return ((const float *)buf)[i];
    case XMESH_F64:
        return ((const double *)buf)[i];
    default:
        return ((const uint8_t *)buf)[i];
    }
}

typedef struct {
    int ndim;
    int64_t shape[3], lo[3], ext[3], vol;
    int holds;
    void *buf;
} block_t;

static void block_init(block_t *b, const xmesh_layout_t *l, int fill, int salt)
{
    memset(b, 0, sizeof *b);
    b->ndim = l->ndim;
    xmesh_layout_local_shape(l, g_rank, b->ext, &b->holds);
    xmesh_layout_local_offset(l, g_rank, b->lo, &b->holds);
    b->vol = 1;
    for (int d = 0; d < l->ndim; d++) {
        b->shape[d] = l->shape[d];
        b->vol *= b->ext[d];
    }
    if (!b->holds)
        return;
    size_t es = xmesh_dtype_size(l->dtype);
    b->buf = malloc((size_t)(b->vol ? b->vol : 1) * es);
    for (int64_t i = 0; i < b->vol; i++) {
        int64_t rem = i, gi = 0, mul = 1;
        int64_t idx[3];
        for (int d = l->ndim - 1; d >= 0; d--) {
            idx[d] = b->lo[d] + rem % b->ext[d];
            rem /= b->ext[d];
        }
        for (int d = l->ndim - 1; d >= 0; d--) {
            gi += idx[d] * mul;
            mul *= b->shape[d];
        }
        put(b->buf, i, l->dtype, fill ? value_of(gi, salt) : 255.0);
    }
}

/* Number of destination elements that differ from their global value. */
static int64_t block_wrong(const block_t *b, xmesh_dtype_t dt, int salt)
{
    int64_t bad = 0;
    for (int64_t i = 0; b->holds && i < b->vol; i++) {
        int64_t rem = i, gi = 0, mul = 1, idx[3];
        for (int d = b->ndim - 1; d >= 0; d--) {
            idx[d] = b->lo[d] + rem % b->ext[d];
            rem /= b->ext[d];
        }
        for (int d = b->ndim - 1; d >= 0; d--) {
            gi += idx[d] * mul;
            mul *= b->shape[d];
        }
        bad += get(b->buf, i, dt) != value_of(gi, salt);
    }
    return bad;
}

/* Busy compute (no MPI): about `us` microseconds of arithmetic. */
static double compute_us(double us)
{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    volatile double acc = 0;
    do {
        for (int i = 0; i < 1000; i++)
            acc += i * 1e-9;
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while ((t.tv_sec - t0.tv_sec) * 1e6 + (t.tv_nsec - t0.tv_nsec) * 1e-3 < us);
    return acc;
}

enum { MODE_BLOCKING, MODE_TEST_LOOP, MODE_NO_TEST };

static void run_case(xmesh_ctx_t ctx, xmesh_mesh_t A, xmesh_mesh_t B, const char *ss,
                     const char *ds, xmesh_dtype_t dt, xmesh_strategy_t st, int64_t chunk, int mode,
                     int salt)
{
    int64_t shape[3] = {12, 10, 6};
    xmesh_layout_t src = {3, shape, dt, A, ss}, dst = {3, shape, dt, B, ds};
    xmesh_plan_params_t pp = XMESH_PLAN_PARAMS_INITIALIZER;
    pp.strategy = st;
    pp.chunk_bytes = chunk;
    pp.timeout_s = 20;
    xmesh_plan_t plan;
    xmesh_result_t r = xmesh_plan_create(ctx, &src, &dst, &pp, &plan);
    CHECK(r == XMESH_SUCCESS, "plan %s -> %s: %s", ss, ds, xmesh_last_error());
    if (r)
        return;
    block_t sb, db;
    block_init(&sb, &src, 1, salt);
    block_init(&db, &dst, 0, salt);
#ifdef __linux__
    /* A blocking wait raises the caller's priority (XMESH_WAIT_NICE) only
     * while it drives the transfer: the thread's nice value is the same after. */
    errno = 0;
    int nice_before = getpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid));
    CHECK(errno == 0, "getpriority failed");
#endif
    xmesh_ctx_stats_t st0, st1;
    CHECK(xmesh_ctx_get_stats(ctx, &st0) == XMESH_SUCCESS, "stats: %s", xmesh_last_error());
    if (mode == MODE_BLOCKING) {
        r = xmesh_reshard(plan, sb.buf, db.buf);
    } else {
        xmesh_request_t req;
        r = xmesh_reshard_start(plan, sb.buf, db.buf, &req);
        CHECK(r == XMESH_SUCCESS, "start: %s", xmesh_last_error());
        if (!r && mode == MODE_TEST_LOOP) {
            int polls = 0;
            for (int k = 0; k < 100000; k++) { /* compute in slices, poll between */
                compute_us(50);
                polls++;
                if ((r = xmesh_test(req)) != XMESH_IN_PROGRESS)
                    break;
            }
            if (r == XMESH_IN_PROGRESS)
                r = xmesh_wait(req);
        } else if (!r) {
            compute_us(2000); /* no xmesh call: only the progress thread moves data */
            r = xmesh_wait(req);
        }
    }
    CHECK(r == XMESH_SUCCESS, "reshard %s -> %s (%s, %s, chunk %lld, mode %d): %s", ss, ds,
          xmesh_strategy_name(st), xmesh_dtype_name(dt), (long long)chunk, mode,
          xmesh_last_error());
#ifdef __linux__
    int nice_after = getpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid));
    CHECK(nice_after == nice_before, "the thread's nice value is %d after the reshard, %d before",
          nice_after, nice_before);
#endif
    /* The CPU counters moved: progress rounds ran here, and over all ranks
     * the executor copied at least every destination element once (staged
     * unpack or local copy; XMESH_ZERO_COPY is off). */
    CHECK(xmesh_ctx_get_stats(ctx, &st1) == XMESH_SUCCESS, "stats: %s", xmesh_last_error());
    CHECK(st1.rounds > st0.rounds, "no progress round counted (%lld -> %lld)",
          (long long)st0.rounds, (long long)st1.rounds);
    CHECK(st1.idle_rounds >= st0.idle_rounds && st1.idle_rounds <= st1.rounds,
          "idle rounds %lld of %lld", (long long)st1.idle_rounds, (long long)st1.rounds);
    CHECK(st1.wait_cpu_s >= st0.wait_cpu_s && st1.progress_cpu_s >= st0.progress_cpu_s,
          "CPU counters went back");
    if (st == XMESH_STRATEGY_BROADCAST) {
        int64_t d[2] = {st1.staged_bytes - st0.staged_bytes,
                        db.holds ? db.vol * (int64_t)xmesh_dtype_size(dt) : 0};
        MPI_Allreduce(MPI_IN_PLACE, d, 2, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
        CHECK(d[0] >= d[1], "staged bytes %lld over all ranks < %lld destination bytes",
              (long long)d[0], (long long)d[1]);
    }
    int64_t bad = block_wrong(&db, dt, salt);
    CHECK(bad == 0, "%lld wrong elements: %s -> %s (%s, %s, chunk %lld, mode %d)", (long long)bad,
          ss, ds, xmesh_strategy_name(st), xmesh_dtype_name(dt), (long long)chunk, mode);
    int64_t sbad = block_wrong(&sb, dt, salt);
    CHECK(sbad == 0, "source changed: %lld elements", (long long)sbad);
    CHECK(xmesh_plan_destroy(plan) == XMESH_SUCCESS, "plan destroy: %s", xmesh_last_error());
    free(sb.buf);
    free(db.buf);
}

int main(int argc, char **argv)
{
    const char *names[] = {"single", "funneled", "serialized", "multiple"};
    const int levels[] = {MPI_THREAD_SINGLE, MPI_THREAD_FUNNELED, MPI_THREAD_SERIALIZED,
                          MPI_THREAD_MULTIPLE};
    int want = -1, per_host = 2;
    unsigned seed = (unsigned)time(NULL);
    for (int i = 1; i < argc; i++) {
        for (int k = 0; k < 4; k++)
            if (!strcmp(argv[i], names[k]))
                want = k;
        if (!strcmp(argv[i], "--per-host") && i + 1 < argc)
            per_host = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
            seed = (unsigned)strtoul(argv[++i], NULL, 0);
    }
    if (want < 0) {
        fprintf(stderr, "usage: test_levels single|funneled|serialized|multiple [--per-host N] "
                        "[--seed S]\n");
        return 2;
    }
    int provided = -1;
    MPI_Init_thread(&argc, &argv, levels[want], &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    MPI_Bcast(&seed, 1, MPI_UNSIGNED, 0, MPI_COMM_WORLD);
    if (g_rank == 0)
        printf("test_levels: asked %s, provided %d, seed %u (--seed to replay)\n", names[want],
               provided, seed);
    if (g_size < 4) {
        if (g_rank == 0)
            fprintf(stderr, "test_levels needs 4 ranks\n");
        MPI_Finalize();
        return 2;
    }
    xmesh_ctx_params_t cp = XMESH_CTX_PARAMS_INITIALIZER;
    cp.host_id = g_rank / per_host;
    xmesh_ctx_t ctx;
    xmesh_result_t r = xmesh_ctx_create_mpi(MPI_COMM_WORLD, &cp, &ctx);
    if (r) {
        fprintf(stderr, "rank %d: ctx at level %s: %s\n", g_rank, names[want], xmesh_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    /* Two disjoint 1x2 meshes and one overlapping 2x2 mesh over 4 ranks. */
    int s12[2] = {1, 2}, s22[2] = {2, 2};
    int ra[2] = {0, 1}, rb[2] = {2, 3}, rall[4] = {3, 1, 2, 0};
    xmesh_mesh_t A, B, C;
    xmesh_mesh_create(ctx, 2, s12, ra, &A);
    xmesh_mesh_create(ctx, 2, s12, rb, &B);
    xmesh_mesh_create(ctx, 2, s22, rall, &C);
    const char *specs[][2] = {
        {"S0RR", "RS1R"}, {"RRR", "S01RR"}, {"S1RR", "RRS1"}, {"S(0),B", "B,S(2)"}};
    const xmesh_dtype_t dts[] = {XMESH_I32, XMESH_F32, XMESH_F64, XMESH_U8};
    const int64_t chunks[] = {8, 100, 1 << 20};
    srand(seed);
    int ncases = 0;
    for (int st = 0; st < XMESH_STRATEGY_COUNT_; st++)
        for (int s = 0; s < 4; s++) {
            xmesh_mesh_t dstm = s == 1 ? C : B;
            const char *ds = s == 1 ? "S01RR" : specs[s][1];
            xmesh_dtype_t dt = dts[rand() % 4];
            int64_t ch = chunks[rand() % 3];
            run_case(ctx, A, dstm, specs[s][0], ds, dt, (xmesh_strategy_t)st, ch, MODE_BLOCKING,
                     ncases);
            run_case(ctx, A, dstm, specs[s][0], ds, dt, (xmesh_strategy_t)st, ch, MODE_TEST_LOOP,
                     ncases + 1);
            ncases += 2;
        }
    /* Overlap through the progress thread, MULTIPLE only. */
    if (provided >= MPI_THREAD_MULTIPLE) {
        run_case(ctx, A, B, "S0RR", "RS1R", XMESH_I32, XMESH_STRATEGY_BROADCAST, 64, MODE_NO_TEST,
                 7);
        ncases++;
    }
    xmesh_mesh_destroy(A);
    xmesh_mesh_destroy(B);
    xmesh_mesh_destroy(C);
    CHECK(xmesh_ctx_destroy(ctx) == XMESH_SUCCESS, "ctx destroy: %s", xmesh_last_error());
    int any = 0;
    MPI_Allreduce(&g_fail, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (g_rank == 0)
        printf("test_levels %s: %d cases, %s\n", names[want], ncases, any ? "FAILED" : "ok");
    MPI_Finalize();
    return any ? 1 : 0;
}
