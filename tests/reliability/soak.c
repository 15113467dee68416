/*
 * Soak: many reshards over a rotating set of plans (all four strategies,
 * all five schedulers, P sources, overlapping meshes, 1-D and 2-D meshes,
 * seven dtypes, chunk sizes 16 B .. 1 MiB), every destination element
 * checked every time, resident memory and open file descriptors watched.
 *
 *   mpiexec -n N soak [--iterations K] [--per-host H] [--recreate R]
 *                     [--rss-bound-kib B] [--seed S]
 *
 * N >= 4. Iteration i runs plan i % P; values depend on the iteration, so a
 * stale destination is caught. Destinations are poisoned (0xff bytes)
 * before each reshard. Every third reshard goes through reshard_start +
 * xmesh_wait, every third through reshard_start + an xmesh_test loop. Every
 * R iterations one plan is destroyed and created again (plan setup and
 * teardown leak too if anything does). VmRSS (/proc/self/status) and the
 * number of entries of /proc/self/fd are taken at the start (plans built,
 * one round done), after 10 % of the iterations (warm-up) and at the end;
 * the run fails if, on any rank, the end exceeds the 10 % mark by more than
 * B KiB of RSS (default 1024; not enforced under AddressSanitizer) or by
 * any file descriptor. The seed only
 * shifts the values (XMESH_TEST_SEED also sets it).
 */
#include <dirent.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "xmesh.h"
#include "xmesh/mpi.h"

/* AddressSanitizer keeps freed memory in quarantine, so RSS grows with
 * every free: the RSS bound is only reported there, not enforced. */
#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifndef UNDER_ASAN
#define UNDER_ASAN 0
#endif

static int g_rank, g_size;
static xmesh_ctx_t g_ctx;

typedef struct {
    const char *name;
    xmesh_dtype_t dtype;
    int ndim;
    int64_t shape[3];
    char smesh, dmesh; /* 'A' first half, 'B' second half, 'F' all, '2' first half as 2-D */
    const char *sspec, *dspec;
    xmesh_strategy_t strategy;
    xmesh_scheduler_t scheduler;
    int64_t chunk;
} pspec_t;

static const pspec_t g_specs[] = {
    {"f32 S0->S1",
     XMESH_F32,
     2,
     {24, 20},
     'A',
     'B',
     "S(0)",
     "S(1)",
     XMESH_STRATEGY_BROADCAST,
     XMESH_SCHEDULER_NAIVE,
     256},
    {"i32 S0->B",
     XMESH_I32,
     1,
     {30},
     'A',
     'B',
     "S(0)",
     "B",
     XMESH_STRATEGY_SENDRECV,
     XMESH_SCHEDULER_GREEDY,
     64},
    {"f64 B->S0",
     XMESH_F64,
     2,
     {17, 5},
     'A',
     'B',
     "B",
     "S(0)",
     XMESH_STRATEGY_SENDRECV_ALLGATHER,
     XMESH_SCHEDULER_LB,
     1 << 20},
    {"i32 P->S0",
     XMESH_I32,
     2,
     {16, 6},
     'A',
     'B',
     "P",
     "S(0)",
     XMESH_STRATEGY_GLOBAL_ALLGATHER,
     XMESH_SCHEDULER_DFS,
     128},
    {"u8 overlap S0->S1",
     XMESH_U8,
     2,
     {32, 16},
     'F',
     'F',
     "S(0)",
     "S(1)",
     XMESH_STRATEGY_BROADCAST,
     XMESH_SCHEDULER_ENSEMBLE,
     100},
    {"f32 reverse S1->B",
     XMESH_F32,
     2,
     {9, 33},
     'B',
     'A',
     "S(1)",
     "B",
     XMESH_STRATEGY_GLOBAL_ALLGATHER,
     XMESH_SCHEDULER_NAIVE,
     1 << 20},
    {"bf16 S1->S0",
     XMESH_BF16,
     2,
     {40, 8},
     'A',
     'B',
     "S(1)",
     "S(0)",
     XMESH_STRATEGY_SENDRECV,
     XMESH_SCHEDULER_LB,
     32},
    {"i64 2-D mesh",
     XMESH_I64,
     3,
     {12, 10, 3},
     '2',
     'B',
     "S(0),S(2)",
     "S(1)",
     XMESH_STRATEGY_BROADCAST,
     XMESH_SCHEDULER_GREEDY,
     48},
    {"i8 B->S0",
     XMESH_I8,
     1,
     {50},
     'B',
     'A',
     "B",
     "S(0)",
     XMESH_STRATEGY_SENDRECV_ALLGATHER,
     XMESH_SCHEDULER_DFS,
     16},
    {"f32 P->B",
     XMESH_F32,
     2,
     {8, 8},
     'A',
     'B',
     "P",
     "B",
     XMESH_STRATEGY_BROADCAST,
     XMESH_SCHEDULER_LB,
     64},
};
#define NPLANS ((int)(sizeof g_specs / sizeof g_specs[0]))

typedef struct {
    const pspec_t *sp;
    xmesh_mesh_t sm, dm;
    xmesh_layout_t sl, dl;
    xmesh_plan_t plan;
    int sgroup, ngroups; /* partial-sum group of this rank's source block */
    int hold_src, hold_dst;
    int64_t sshape[3], soff[3], dshape[3], doff[3], sn, dn;
    void *src, *dst;
} plan_t;

static uint64_t g_seed;

/* Value of global element gi at iteration it (exact in every dtype). */
static int64_t value(const pspec_t *sp, int64_t gi, int64_t it)
{
    int64_t m = sp->dtype == XMESH_U8 || sp->dtype == XMESH_I8 ? 100
                : sp->dtype == XMESH_BF16                      ? 200
                                                               : 1000;
    return (gi * 7 + it * 13 + (int64_t)(g_seed % 97)) % m;
}

static void store(xmesh_dtype_t t, void *p, int64_t v)
{
    switch (t) {
    case XMESH_U8:
        *(uint8_t *)p = (uint8_t)v;
        break;
    case XMESH_I8:
        *(int8_t *)p = (int8_t)v;
        break;
    case XMESH_I32:
        *(int32_t *)p = (int32_t)v;
        break;
    case XMESH_I64:
        *(int64_t *)p = v;
        break;
    case XMESH_F32:
        *(float *)p = (float)v;
        break;
    case XMESH_F64:
        *(double *)p = (double)v;
        break;
    case XMESH_BF16: { /* small integers are exact: the top half of the f32 */
        float f = (float)v;
        uint32_t u;
        memcpy(&u, &f, 4);
        *(uint16_t *)p = (uint16_t)(u >> 16);
        break;
    }
    default:
        break;
    }
}

static int equal(xmesh_dtype_t t, const void *p, int64_t v)
{
    char want[8];
    store(t, want, v);
    return !memcmp(p, want, xmesh_dtype_size(t));
}

static int64_t global_index(const pspec_t *sp, const int64_t *bshape, const int64_t *boff,
                            int64_t k)
{
    int64_t idx[3], g = 0;
    for (int d = sp->ndim - 1; d >= 0; d--) {
        idx[d] = k % bshape[d];
        k /= bshape[d];
    }
    for (int d = 0; d < sp->ndim; d++)
        g = g * sp->shape[d] + boff[d] + idx[d];
    return g;
}

static xmesh_result_t make_mesh(char which, xmesh_mesh_t *out, int *ndim, int *shape, int *ranks)
{
    int h = g_size / 2, n = 0;
    if (which == 'A' || which == '2')
        for (int r = 0; r < h; r++)
            ranks[n++] = r;
    else if (which == 'B')
        for (int r = h; r < g_size; r++)
            ranks[n++] = r;
    else
        for (int r = 0; r < g_size; r++)
            ranks[n++] = r;
    if (which == '2' && h % 2 == 0) {
        *ndim = 2;
        shape[0] = 2;
        shape[1] = h / 2;
    } else {
        *ndim = 1;
        shape[0] = n;
    }
    return xmesh_mesh_create(g_ctx, *ndim, shape, ranks, out);
}

/* Collective: meshes, plan and buffers of spec sp. */
static xmesh_result_t plan_open(plan_t *p, const pspec_t *sp)
{
    memset(p, 0, sizeof *p);
    p->sp = sp;
    int sn, dn, sshape[4], dshape[4], sranks[64], dranks[64];
    xmesh_result_t r;
    if ((r = make_mesh(sp->smesh, &p->sm, &sn, sshape, sranks)) ||
        (r = make_mesh(sp->dmesh, &p->dm, &dn, dshape, dranks)))
        return r;
    const char *sspec = sp->sspec;
    if (sp->smesh == '2' && sn == 1)
        sspec = "S(0)"; /* odd half: 1-D fallback */
    p->sl = (xmesh_layout_t){sp->ndim, sp->shape, sp->dtype, p->sm, sspec};
    p->dl = (xmesh_layout_t){sp->ndim, sp->shape, sp->dtype, p->dm, sp->dspec};
    xmesh_plan_params_t pp = XMESH_PLAN_PARAMS_INITIALIZER;
    pp.strategy = sp->strategy;
    pp.scheduler = sp->scheduler;
    pp.chunk_bytes = sp->chunk;
    pp.budget_us = 2000;
    pp.timeout_s = 60;
    if ((r = xmesh_plan_create(g_ctx, &p->sl, &p->dl, &pp, &p->plan)))
        return r;
    size_t es = xmesh_dtype_size(sp->dtype);
    xmesh_layout_local_shape(&p->sl, g_rank, p->sshape, &p->hold_src);
    xmesh_layout_local_offset(&p->sl, g_rank, p->soff, &p->hold_src);
    xmesh_layout_local_shape(&p->dl, g_rank, p->dshape, &p->hold_dst);
    xmesh_layout_local_offset(&p->dl, g_rank, p->doff, &p->hold_dst);
    p->sn = p->dn = 1;
    for (int d = 0; d < sp->ndim; d++) {
        p->sn *= p->sshape[d];
        p->dn *= p->dshape[d];
    }
    /* "P" on a 1-D mesh: the group is the position in the mesh. */
    p->ngroups = strchr(sspec, 'P') ? sshape[0] : 1;
    for (int i = 0; i < sshape[0] * (sn > 1 ? sshape[1] : 1); i++)
        if (sranks[i] == g_rank)
            p->sgroup = p->ngroups > 1 ? i : 0;
    p->src = p->hold_src ? malloc(p->sn * es + 1) : NULL;
    p->dst = p->hold_dst ? malloc(p->dn * es + 1) : NULL;
    return XMESH_SUCCESS;
}

static void plan_close(plan_t *p)
{
    if (xmesh_plan_destroy(p->plan) || xmesh_mesh_destroy(p->sm) || xmesh_mesh_destroy(p->dm))
        fprintf(stderr, "rank %d: soak: destroy: %s\n", g_rank, xmesh_last_error());
    free(p->src);
    free(p->dst);
    memset(p, 0, sizeof *p);
}

/* One reshard of p at iteration it; returns the number of wrong elements
 * (or -1 if the reshard failed, message on stderr). */
static int64_t plan_run(plan_t *p, int64_t it)
{
    const pspec_t *sp = p->sp;
    size_t es = xmesh_dtype_size(sp->dtype);
    int G = p->ngroups;
    for (int64_t k = 0; p->src && k < p->sn; k++)
        store(sp->dtype, (char *)p->src + k * es,
              value(sp, global_index(sp, p->sshape, p->soff, k), it) * (p->sgroup + 1));
    if (p->dst)
        memset(p->dst, 0xff, p->dn * es);
    xmesh_result_t r;
    xmesh_request_t rq;
    switch (it % 3) {
    case 0:
        r = xmesh_reshard(p->plan, p->src, p->dst);
        break;
    case 1:
        r = xmesh_reshard_start(p->plan, p->src, p->dst, &rq);
        if (!r)
            r = xmesh_wait(rq);
        break;
    default:
        r = xmesh_reshard_start(p->plan, p->src, p->dst, &rq);
        while (!r && (r = xmesh_test(rq)) == XMESH_IN_PROGRESS) {
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
            r = XMESH_SUCCESS; /* still ours: test again */
        }
        break;
    }
    if (r) {
        fprintf(stderr, "rank %d: soak: iteration %lld (%s): %s: %s\n", g_rank, (long long)it,
                sp->name, xmesh_result_string(r), xmesh_last_error());
        return -1;
    }
    int64_t bad = 0;
    for (int64_t k = 0; p->dst && k < p->dn; k++) {
        int64_t gi = global_index(sp, p->dshape, p->doff, k);
        int64_t want = value(sp, gi, it) * (G * (G + 1) / 2);
        if (!equal(sp->dtype, (char *)p->dst + k * es, want)) {
            if (!bad)
                fprintf(stderr,
                        "rank %d: soak: iteration %lld (%s): element %lld (global %lld) wrong\n",
                        g_rank, (long long)it, sp->name, (long long)k, (long long)gi);
            bad++;
        }
    }
    return bad;
}

static long rss_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6))
            v = atol(line + 6);
    if (f)
        fclose(f);
    return v;
}

static int fd_count(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.')
            n++;
    if (d)
        closedir(d);
    return n - 1; /* the directory stream's own descriptor */
}

typedef struct {
    long rss;
    int fds;
} usage_t;

static usage_t usage_now(void)
{
    return (usage_t){rss_kib(), fd_count()};
}

/* Prints rank 0's figures and the range over ranks. */
static void usage_print(const char *when, usage_t u, int64_t done, double secs)
{
    long v[2] = {u.rss, u.fds}, mn[2], mx[2];
    MPI_Reduce(v, mn, 2, MPI_LONG, MPI_MIN, 0, MPI_COMM_WORLD);
    MPI_Reduce(v, mx, 2, MPI_LONG, MPI_MAX, 0, MPI_COMM_WORLD);
    if (g_rank == 0) {
        printf("soak: %-6s after %6lld reshards (%7.1f s): rank 0 VmRSS %6ld KiB, %3ld fds; "
               "over ranks VmRSS %ld..%ld KiB, fds %ld..%ld\n",
               when, (long long)done, secs, u.rss, (long)u.fds, mn[0], mx[0], mn[1], mx[1]);
        fflush(stdout);
    }
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    int64_t iters = 10000;
    int per_host = 2, recreate = 250;
    long rss_bound = 1024;
    g_seed = (uint64_t)time(NULL);
    const char *env = getenv("XMESH_TEST_SEED");
    if (env && *env)
        g_seed = strtoull(env, NULL, 0);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--iterations") && i + 1 < argc)
            iters = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--per-host") && i + 1 < argc)
            per_host = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--recreate") && i + 1 < argc)
            recreate = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rss-bound-kib") && i + 1 < argc)
            rss_bound = atol(argv[++i]);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
            g_seed = strtoull(argv[++i], NULL, 0);
        else {
            if (g_rank == 0)
                fprintf(stderr, "soak: unknown argument '%s'\n", argv[i]);
            MPI_Finalize();
            return 2;
        }
    }
    if (g_size < 4 || g_size > 64 || iters < 10 || per_host < 1 || recreate < 1) {
        if (g_rank == 0)
            fprintf(stderr, "soak: needs 4..64 ranks, --iterations >= 10\n");
        MPI_Finalize();
        return 2;
    }
    MPI_Bcast(&g_seed, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    xmesh_ctx_params_t cp = XMESH_CTX_PARAMS_INITIALIZER;
    cp.host_id = g_rank / per_host;
    if (xmesh_ctx_create_mpi(MPI_COMM_WORLD, &cp, &g_ctx)) {
        fprintf(stderr, "rank %d: soak: ctx: %s\n", g_rank, xmesh_last_error());
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    if (g_rank == 0) {
        printf("soak: %d ranks, %d per fake host, %lld reshards over %d plans, one plan "
               "re-created every %d, seed %llu (XMESH_TEST_SEED replays)\n",
               g_size, per_host, (long long)iters, NPLANS, recreate, (unsigned long long)g_seed);
        for (int i = 0; i < NPLANS; i++)
            printf("soak:   plan %d: %s, %s/%s, chunk %lld B\n", i, g_specs[i].name,
                   xmesh_strategy_name(g_specs[i].strategy),
                   xmesh_scheduler_name(g_specs[i].scheduler), (long long)g_specs[i].chunk);
        fflush(stdout);
    }
    plan_t plans[NPLANS];
    for (int i = 0; i < NPLANS; i++)
        if (plan_open(&plans[i], &g_specs[i])) {
            fprintf(stderr, "rank %d: soak: plan %d (%s): %s\n", g_rank, i, g_specs[i].name,
                    xmesh_last_error());
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    int64_t bad = 0, failed = 0, it = 0;
    double t0 = now();
    /* One round first, so "start" is measured with every plan used once. */
    for (; it < NPLANS; it++) {
        int64_t b = plan_run(&plans[it % NPLANS], it);
        failed += b < 0;
        bad += b > 0 ? b : 0;
    }
    usage_t u0 = usage_now(), u10 = u0, u1;
    usage_print("start", u0, it, now() - t0);
    int64_t warm = iters / 10 > NPLANS ? iters / 10 : NPLANS;
    for (; it < iters && !failed; it++) {
        if (it % recreate == 0) {
            int k = (int)((it / recreate) % NPLANS);
            plan_close(&plans[k]);
            if (plan_open(&plans[k], &g_specs[k])) {
                fprintf(stderr, "rank %d: soak: re-creating plan %d: %s\n", g_rank, k,
                        xmesh_last_error());
                MPI_Abort(MPI_COMM_WORLD, 2);
            }
        }
        int64_t b = plan_run(&plans[it % NPLANS], it);
        failed += b < 0;
        bad += b > 0 ? b : 0;
        if (it + 1 == warm) {
            u10 = usage_now();
            usage_print("10%", u10, it + 1, now() - t0);
        }
        if (failed) /* every rank must stop together: the others wait on us */
            break;
    }
    double secs = now() - t0;
    u1 = usage_now();
    usage_print("end", u1, it, secs);
    long grow[2] = {u1.rss - u10.rss, u1.fds - u10.fds}, gmax[2];
    MPI_Allreduce(grow, gmax, 2, MPI_LONG, MPI_MAX, MPI_COMM_WORLD);
    int64_t tot[2] = {bad, failed}, all[2];
    MPI_Allreduce(tot, all, 2, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    for (int i = 0; i < NPLANS; i++)
        plan_close(&plans[i]);
    xmesh_result_t dr = xmesh_ctx_destroy(g_ctx);
    int ok = all[0] == 0 && all[1] == 0 && (gmax[0] <= rss_bound || UNDER_ASAN) && gmax[1] <= 0 &&
             it == iters && dr == XMESH_SUCCESS;
    if (g_rank == 0) {
        printf("soak: %lld reshards in %.1f s (%.0f per s), %lld wrong elements, %lld failed "
               "reshards; growth after warm-up (max over ranks): VmRSS %+ld KiB (bound %ld), fds "
               "%+ld (bound 0)\n",
               (long long)it, secs, it / secs, (long long)all[0], (long long)all[1], gmax[0],
               rss_bound, gmax[1]);
        if (UNDER_ASAN)
            printf("soak: built with AddressSanitizer: the VmRSS bound is not enforced (its "
                   "quarantine keeps freed memory)\n");
        printf("soak: %s\n", ok ? "PASS" : "FAIL");
        fflush(stdout);
    }
    MPI_Finalize();
    return ok ? 0 : 1;
}
