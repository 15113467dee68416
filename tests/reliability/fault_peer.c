/*
 * Peer failure during a reshard: one rank (the victim) is stopped (SIGSTOP),
 * killed (SIGKILL) or cut off (linkcut: a script outside the job takes its
 * host's link down) in the middle of a transfer; the other ranks must come
 * back with XMESH_ERR_TIMEOUT / XMESH_ERR_REMOTE naming the rank they were
 * waiting for, within the timeout plus a margin, and then shut down cleanly.
 *
 *   mpiexec -n N fault_peer --mode stop|kill|linkcut --role src|dst
 *           [--after K] [--resume] [--margin S] [--per-host H] [--elems E]
 *           [--out DIR] [--mark FILE] [--finalize-anyway] [--many K]
 *
 * Needs XMESH_TIMEOUT_S in the environment (the timeout under test). The
 * plan: rank 0 holds an i32 vector of E elements, ranks 1..N-1 each need all
 * of it (sendrecv strategy: one point-to-point route per receiver, 256 KiB
 * chunks, so each receiver waits on rank 0 directly). Ranks pretend to sit on
 * hosts of H ranks (H = 0: real hosts, e.g. the emulated cluster). With
 * --many K (2..64) the vector is a plan of K tensors (K - 1 of 4 KiB,
 * packed into shared chunks, then the rest), moved by xmesh_reshard_many:
 * the same contracts hold for a plan of many. One
 * warm-up reshard is checked first, then the victim arms the PMPI injector
 * (inject.c) and the second reshard runs:
 *   --role src  victim = rank 0; it acts in its K-th MPI_Isend of >= 64 KiB:
 *               every receiver must time out naming rank 0;
 *   --role dst  victim = rank N-1; it acts when it posts its K-th receive:
 *               rank 0 must time out naming rank N-1, the other receivers
 *               must finish with correct data.
 * "Acts": raises the signal, or for linkcut creates FILE (--mark) for the
 * script to cut the link; the cut-off victim must then time out as well.
 * Every failing rank also checks its destination: each element holds either
 * the value from before the call or the correct new value (linkcut: one
 * torn element allowed, TCP delivers a chunk in pieces). Then every checked
 * rank destroys plan, meshes and context (each must succeed within 1 s) and:
 *   --resume    survivor 0 sends SIGCONT to the stopped victim, which returns
 *               from its reshard (no hang) and cleans up; all ranks call
 *               MPI_Finalize (exit 0) and report what landed in their
 *               destination after the error had been returned;
 *   otherwise   they call MPI_Abort(MPI_COMM_WORLD, 42): the documented way
 *               out when a peer is gone for good (MPI_Finalize waits for it:
 *               --finalize-anyway shows that, an experiment, not a test).
 * Result lines go to stdout and to DIR/rank.R (--out; mpiexec may drop
 * forwarded output when the job is aborted): "fault: rank R: PASS" or
 * "fault: rank R: FAIL ...". fault.sh (one machine) and linkcut.sh (the
 * emulated cluster) run this under mpiexec and judge the lines, the exit
 * status and the wall time (SIGKILL: Open MPI's launcher usually ends the
 * job itself).
 */
#include <errno.h>
#include <mpi.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "inject.h"
#include "xmesh.h"
#include "xmesh/mpi.h"

static int g_rank, g_size;
/* Result lines go to stdout and, with --out DIR, to DIR/rank.R: output
 * forwarded by mpiexec can be lost when MPI_Abort ends the job. */
static FILE *g_out;

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
    if (g_out) {
        va_start(ap, fmt);
        vfprintf(g_out, fmt, ap);
        va_end(ap);
        fflush(g_out);
    }
}
static char g_why[1024];
static int g_ok = 1;

static void failf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void failf(const char *fmt, ...)
{
    if (!g_ok)
        return; /* keep the first reason */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_why, sizeof g_why, fmt, ap);
    va_end(ap);
    g_ok = 0;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int32_t value(int64_t i, int iter)
{
    return (int32_t)(i * 3 + 1 + iter * 1000003);
}

#define SENTINEL ((int32_t)0x7e7e7e7e)

/* --many K: the vector as K tensors (blocks are slices of one buffer). */
static int g_many = 1;
static int64_t *g_shapes;

static xmesh_result_t reshard_start(xmesh_plan_t plan, int32_t *src, int32_t *dst,
                                    xmesh_request_t *rq)
{
    if (g_many <= 1)
        return xmesh_reshard_start(plan, src, dst, rq);
    const void *sp[64];
    void *dp[64];
    int64_t off = 0;
    for (int k = 0; k < g_many; k++) {
        sp[k] = src ? src + off : NULL;
        dp[k] = dst ? dst + off : NULL;
        off += g_shapes[k];
    }
    return xmesh_reshard_many_start(plan, sp, dp, rq);
}

static xmesh_result_t reshard(xmesh_plan_t plan, int32_t *src, int32_t *dst)
{
    xmesh_request_t rq;
    xmesh_result_t r = reshard_start(plan, src, dst, &rq);
    return r ? r : xmesh_wait(rq);
}

int main(int argc, char **argv)
{
    const char *mode = "stop", *role = "src", *outdir = NULL, *markp = NULL;
    int after = 3, resume = 0, per_host = 1, finalize_anyway = 0;
    double margin = 2.0;
    int64_t elems = 1 << 20; /* 4 MiB: 16 chunks per receiver */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--mode") && i + 1 < argc)
            mode = argv[++i];
        else if (!strcmp(argv[i], "--role") && i + 1 < argc)
            role = argv[++i];
        else if (!strcmp(argv[i], "--after") && i + 1 < argc)
            after = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--resume"))
            resume = 1;
        else if (!strcmp(argv[i], "--finalize-anyway"))
            finalize_anyway = 1;
        else if (!strcmp(argv[i], "--margin") && i + 1 < argc)
            margin = atof(argv[++i]);
        else if (!strcmp(argv[i], "--per-host") && i + 1 < argc)
            per_host = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--mark") && i + 1 < argc)
            markp = argv[++i];
        else if (!strcmp(argv[i], "--out") && i + 1 < argc)
            outdir = argv[++i];
        else if (!strcmp(argv[i], "--elems") && i + 1 < argc)
            elems = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--many") && i + 1 < argc)
            g_many = atoi(argv[++i]);
        else {
            fprintf(stderr, "fault_peer: unknown argument '%s'\n", argv[i]);
            return 2;
        }
    }
    int sig = !strcmp(mode, "kill") ? SIGKILL : SIGSTOP;
    int linkcut = !strcmp(mode, "linkcut");
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    const char *tenv = getenv("XMESH_TIMEOUT_S");
    double timeout = tenv ? atof(tenv) : 0;
    if (g_size < 3 || timeout <= 0 || per_host < 0 || (linkcut && !markp) ||
        (strcmp(role, "src") && strcmp(role, "dst"))) {
        if (g_rank == 0)
            fprintf(stderr, "fault_peer: needs >= 3 ranks, XMESH_TIMEOUT_S > 0, --role src|dst\n");
        MPI_Finalize();
        return 2;
    }
    if (outdir) {
        char path[512];
        snprintf(path, sizeof path, "%s/rank.%d", outdir, g_rank);
        g_out = fopen(path, "w");
    }
    int victim = !strcmp(role, "src") ? 0 : g_size - 1;
    /* A victim whose link was cut is alive: it must fail cleanly as well. */
    int survivor = g_rank != victim || linkcut;
    int first_survivor = victim == 0 ? 1 : 0;

    /* Before the fault: pids (to resume the victim) and a communicator of
     * the survivors (they coordinate without it afterwards). */
    int *pids = malloc(sizeof(int) * g_size);
    int mypid = (int)getpid();
    MPI_Allgather(&mypid, 1, MPI_INT, pids, 1, MPI_INT, MPI_COMM_WORLD);
    MPI_Comm surv;
    MPI_Comm_split(MPI_COMM_WORLD, g_rank != victim, g_rank, &surv);

    xmesh_ctx_t ctx = NULL;
    xmesh_ctx_params_t cp = XMESH_CTX_PARAMS_INITIALIZER;
    if (per_host > 0) /* else real hosts (the emulated cluster) */
        cp.host_id = g_rank / per_host;
    if (xmesh_ctx_create_mpi(MPI_COMM_WORLD, &cp, &ctx)) {
        fprintf(stderr, "fault: rank %d: ctx_create: %s\n", g_rank, xmesh_last_error());
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int src_ranks[1] = {0}, *dst_ranks = malloc(sizeof(int) * (g_size - 1));
    for (int i = 0; i < g_size - 1; i++)
        dst_ranks[i] = i + 1;
    int sshape[1] = {1}, dshape[1] = {g_size - 1};
    xmesh_mesh_t sm = NULL, dm = NULL;
    xmesh_plan_t plan = NULL;
    if (xmesh_mesh_create(ctx, 1, sshape, src_ranks, &sm) ||
        xmesh_mesh_create(ctx, 1, dshape, dst_ranks, &dm)) {
        fprintf(stderr, "fault: rank %d: mesh_create: %s\n", g_rank, xmesh_last_error());
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int64_t shape[1] = {elems};
    xmesh_layout_t sl = {1, shape, XMESH_I32, sm, "B"}, dl = {1, shape, XMESH_I32, dm, "B"};
    xmesh_plan_params_t pp = XMESH_PLAN_PARAMS_INITIALIZER;
    pp.strategy = XMESH_STRATEGY_SENDRECV;
    pp.chunk_bytes = 256 << 10;
    xmesh_result_t cr;
    if (g_many > 1) { /* the vector as g_many tensors: small ones (packed), then the rest */
        if (g_many > 64 || elems < 1024ll * g_many) {
            fprintf(stderr, "fault: --many %d: at most 64, and --elems >= %d\n", g_many,
                    1024 * g_many);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
        g_shapes = malloc(sizeof(int64_t) * g_many);
        xmesh_layout_t *ms = malloc(sizeof *ms * g_many), *md = malloc(sizeof *md * g_many);
        for (int k = 0; k < g_many; k++) {
            g_shapes[k] = k < g_many - 1 ? 1024 : elems - 1024ll * (g_many - 1);
            ms[k] = (xmesh_layout_t){1, &g_shapes[k], XMESH_I32, sm, "B"};
            md[k] = (xmesh_layout_t){1, &g_shapes[k], XMESH_I32, dm, "B"};
        }
        cr = xmesh_plan_create_many(ctx, g_many, ms, md, &pp, &plan);
        free(ms);
        free(md);
    } else {
        cr = xmesh_plan_create(ctx, &sl, &dl, &pp, &plan);
    }
    if (cr) {
        fprintf(stderr, "fault: rank %d: plan_create: %s\n", g_rank, xmesh_last_error());
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int32_t *src = g_rank == 0 ? malloc(sizeof(int32_t) * elems) : NULL;
    int32_t *dst = g_rank != 0 ? malloc(sizeof(int32_t) * elems) : NULL;

    /* Warm-up: the plan works before the fault. */
    for (int64_t i = 0; src && i < elems; i++)
        src[i] = value(i, 0);
    for (int64_t i = 0; dst && i < elems; i++)
        dst[i] = SENTINEL;
    xmesh_result_t r = reshard(plan, src, dst);
    int64_t bad = 0;
    for (int64_t i = 0; dst && i < elems; i++)
        bad += dst[i] != value(i, 0);
    int ok = r == XMESH_SUCCESS && bad == 0, all = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all) {
        fprintf(stderr, "fault: rank %d: warm-up reshard: %s (%s), %lld bad elements\n", g_rank,
                xmesh_result_string(r), xmesh_last_error(), (long long)bad);
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
    if (g_rank == 0)
        say("fault: %d ranks, %d per fake host (0: real hosts), mode %s, victim rank %d (%s), "
            "signal at its "
            "%s #%d of >= 64 KiB, XMESH_TIMEOUT_S=%g, margin %g s\n",
            g_size, per_host, mode, victim, role, victim == 0 ? "MPI_Isend" : "MPI_Irecv", after,
            timeout, margin);
    fflush(stdout);

    /* The fault. */
    for (int64_t i = 0; src && i < elems; i++)
        src[i] = value(i, 1);
    for (int64_t i = 0; dst && i < elems; i++)
        dst[i] = SENTINEL;
    if (g_rank == victim) {
        inj_cfg_t c = {.action = linkcut ? INJ_MARK : INJ_SIGNAL,
                       .count_sends = victim == 0,
                       .count_recvs = victim != 0,
                       .peer = -1,
                       .min_bytes = 64 << 10,
                       .at_call = after,
                       .sig = sig,
                       .log_fd = g_out ? fileno(g_out) : 0};
        if (linkcut)
            snprintf(c.mark_path, sizeof c.mark_path, "%s", markp);
        inj_arm(&c);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now();
    r = reshard(plan, src, dst);
    double dt = now() - t0;
    char msg[600];
    snprintf(msg, sizeof msg, "%s", r ? xmesh_last_error() : "");
    if (g_rank == victim)
        inj_disarm();

    /* What the rank got, and the state of its destination. */
    int64_t written = 0, garbage = 0;
    for (int64_t i = 0; dst && i < elems; i++) {
        if (dst[i] == value(i, 1))
            written++;
        else if (dst[i] != SENTINEL)
            garbage++;
    }
    char dstate[160] = "";
    if (dst)
        snprintf(dstate, sizeof dstate,
                 "; dst: %lld of %lld elements new, %lld neither old nor new", (long long)written,
                 (long long)elems, (long long)garbage);
    say("fault: rank %d: reshard -> %s after %.3f s%s%s%s\n", g_rank, xmesh_result_string(r), dt,
        r ? ": " : "", msg, dstate);
    if (survivor) {
        char peer[32];
        /* The cut-off victim names whichever peer it waited for. */
        snprintf(peer, sizeof peer, g_rank == victim ? "waiting" : "rank %d", victim);
        int must_fail = victim == 0 || g_rank == 0 || g_rank == victim;
        if (must_fail) {
            if (r != XMESH_ERR_TIMEOUT && r != XMESH_ERR_REMOTE)
                failf("reshard returned %s, want TIMEOUT or REMOTE", xmesh_result_string(r));
            else if (!strstr(msg, peer))
                failf("error message does not name the peer (%s): %s", peer, msg);
            else if (r == XMESH_ERR_TIMEOUT && (dt < timeout - 0.01 || dt > timeout + margin))
                failf("TIMEOUT after %.3f s, want within [%g, %g] s", dt, timeout,
                      timeout + margin);
            else if (dt > timeout + margin)
                failf("REMOTE after %.3f s, want within %g s", dt, timeout + margin);
            /* Over TCP a receive cut in the middle may leave one torn element
             * per peer (the bytes of a chunk arrive in arbitrary pieces). */
            if (garbage > (linkcut ? 1 : 0))
                failf("%lld destination elements hold neither the old nor the new value",
                      (long long)garbage);
        } else if (g_many > 1 && (r == XMESH_ERR_TIMEOUT || r == XMESH_ERR_REMOTE)) {
            /* One plan of many is one ordered task list: rank 0 serves the
             * later (packed) task only after the one the victim stalls, so
             * the other receivers may time out too, never with garbage. */
            if (garbage)
                failf("%lld destination elements hold neither the old nor the new value",
                      (long long)garbage);
            else if (dt > timeout + margin)
                failf("%s after %.3f s, want within %g s", xmesh_result_string(r), dt,
                      timeout + margin);
        } else if (r != XMESH_SUCCESS || written != elems) {
            failf("receiver not served by the victim: %s, %lld of %lld elements correct",
                  xmesh_result_string(r), (long long)written, (long long)elems);
        }
        /* After the error the plan must refuse to run again, and every
         * handle must go away. */
        xmesh_request_t rq;
        if (r && reshard_start(plan, src, dst, &rq) != XMESH_ERR_INVALID_USAGE)
            failf("a failed plan accepted another reshard");
        double c0 = now();
        xmesh_result_t d1 = xmesh_plan_destroy(plan), d2 = xmesh_mesh_destroy(sm),
                       d3 = xmesh_mesh_destroy(dm), d4 = xmesh_ctx_destroy(ctx);
        double cdt = now() - c0;
        if (d1 || d2 || d3 || d4)
            failf("cleanup: plan_destroy %s, mesh_destroy %s/%s, ctx_destroy %s (%s)",
                  xmesh_result_string(d1), xmesh_result_string(d2), xmesh_result_string(d3),
                  xmesh_result_string(d4), xmesh_last_error());
        else if (cdt > 1.0)
            failf("cleanup took %.3f s", cdt);
        if (g_ok)
            say("fault: rank %d: PASS (cleanup %.3f s)\n", g_rank, cdt);
        else
            say("fault: rank %d: FAIL %s\n", g_rank, g_why);
        fflush(stdout);
        MPI_Barrier(surv);
        if (!resume && finalize_anyway) {
            /* Experiment (not a test): MPI_Finalize with the peer gone. */
            say("fault: rank %d calls MPI_Finalize with rank %d stopped\n", g_rank, victim);
        } else if (!resume) {
            if (g_rank == first_survivor) {
                say("fault: survivors call MPI_Abort(MPI_COMM_WORLD, 42)\n");
                fflush(stdout);
            }
            MPI_Abort(MPI_COMM_WORLD, 42);
        }
        if (resume && g_rank == first_survivor) {
            say("fault: rank %d sends SIGCONT to rank %d (pid %d)\n", g_rank, victim, pids[victim]);
            fflush(stdout);
            if (kill(pids[victim], SIGCONT))
                fprintf(stderr, "fault: kill(SIGCONT): %s\n", strerror(errno));
        }
    } else {
        /* The resumed victim: it came back (no hang); its plan is retired if
         * it failed, and everything must be destroyable. */
        if (r &&
            xmesh_reshard_start(plan, src, dst, (xmesh_request_t[1]){0}) != XMESH_ERR_INVALID_USAGE)
            failf("a failed plan accepted another reshard");
        xmesh_result_t d1 = xmesh_plan_destroy(plan), d2 = xmesh_mesh_destroy(sm),
                       d3 = xmesh_mesh_destroy(dm), d4 = xmesh_ctx_destroy(ctx);
        if (d1 || d2 || d3 || d4)
            failf("cleanup after resume failed: %s", xmesh_last_error());
        say("fault: rank %d (victim, %s): %s\n", g_rank, resume ? "resumed" : "not stopped",
            g_ok ? "PASS" : g_why);
        fflush(stdout);
    }
    double f0 = now();
    MPI_Finalize();
    /* Did anything land in the destination after the error was returned
     * (receives that could not be cancelled keep writing)? */
    int64_t late = 0, written2 = 0;
    for (int64_t i = 0; dst && r && i < elems; i++)
        written2 += dst[i] == value(i, 1);
    late = written2 - written;
    say("fault: rank %d: MPI_Finalize returned after %.3f s%s", g_rank, now() - f0,
        dst && r ? "" : "\n");
    if (dst && r)
        say("; %lld destination elements written after the error was returned\n", (long long)late);
    fflush(stdout);
    free(pids);
    free(dst_ranks);
    free(src);
    free(dst);
    return g_ok ? 0 : 1;
}
