/* Execution of a compiled plan: requests, the per-context progress thread,
 * task ordering, chunked pipelined chains, partial sums, timeouts. */
#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef __linux__
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "xm_mpi.h"

#define BACKOFF_MIN_NS 1000l
#define BACKOFF_MAX_NS 1000000l
/* Idle polls answered with sched_yield() before sleeping: a chunk handshake
 * needs a few progress rounds on both sides, and even a 1 us sleep costs a
 * timer round trip. Measured on the 2-core dev box: 16 polls lift a 256 MiB
 * broadcast from about 1.3 to about 2.3 GB/s (load-sensitive). */
#define YIELD_POLLS 16

/* ----------------------------------------------------------- requests */

/* A released request points at this plan, whose backend rejects it: a
 * handle passed again after completion gets INVALID_USAGE, never a crash. */
static xmesh_result_t dead_call(xmesh_request_t req)
{
    (void)req;
    return XM_ERR(XMESH_ERR_INVALID_USAGE,
                  "request was already completed and released (each request is finished by "
                  "exactly one successful xmesh_test or xmesh_wait)");
}
static const xm_backend_ops_t dead_ops = {.name = "released", .test = dead_call, .wait = dead_call};
static struct xmesh_ctx dead_ctx = {.ops = &dead_ops};
static struct xmesh_plan dead_plan = {.ctx = &dead_ctx};

/* Called with be->mu held. */
static xm_request_t *req_alloc(xm_mpi_ctx_t *be)
{
    if (!be->free_list) {
        enum { N = 16 };
        xm_request_t *blk = calloc(N, sizeof *blk);
        xm_request_t **nb = realloc(be->blocks, sizeof *nb * (be->nblocks + 1));
        if (!blk || !nb) {
            free(blk);
            if (nb)
                be->blocks = nb;
            return NULL;
        }
        be->blocks = nb;
        be->blocks[be->nblocks++] = blk;
        for (int i = 0; i < N; i++) {
            blk[i].plan = &dead_plan;
            blk[i].be = be; /* never changes: test/wait lock through it */
            blk[i].magic = XM_REQ_FREE;
            blk[i].next_free = be->free_list;
            be->free_list = &blk[i];
        }
    }
    xm_request_t *r = be->free_list;
    be->free_list = r->next_free;
    return r;
}

/* Starts the progress thread once; called with be->mu held. Only under
 * MPI_THREAD_MULTIPLE: at lower levels progress happens in the caller's
 * xmesh_reshard_start / xmesh_test / xmesh_wait. */
static xmesh_result_t ensure_thread(xm_mpi_ctx_t *be)
{
    if (be->thread_started || !be->threaded)
        return XMESH_SUCCESS;
    int e = pthread_create(&be->thread, NULL, xm_mpi_progress_main, be);
    if (e)
        return XM_ERR(XMESH_ERR_SYSTEM, "cannot start the progress thread: %s", strerror(e));
    be->thread_started = 1;
    return XMESH_SUCCESS;
}

/* One progress round over every active request. Called with be->mu held and
 * the token free (!be->busy); takes the token, advances without the lock,
 * retires finished requests, returns the token and wakes every waiter.
 * Returns 1 if anything moved or finished. `from_thread`: called by the
 * progress thread (else the progress thread is poked, as it may be sleeping
 * because the token was taken). */
static int progress_round(xm_mpi_ctx_t *be, int from_thread)
{
    int n = 0;
    for (xm_request_t *r = be->active; r; r = r->next_active) {
        if (n == be->snap_cap) {
            int ncap = be->snap_cap ? 2 * be->snap_cap : 8;
            xm_request_t **ns = realloc(be->snap, sizeof *ns * ncap);
            if (!ns)
                break; /* advance what fits; the rest next round */
            be->snap = ns;
            be->snap_cap = ncap;
        }
        be->snap[n++] = r;
    }
    be->busy = 1;
    /* Requests in the snapshot cannot be released: only the token holder
     * marks them done. */
    pthread_mutex_unlock(&be->mu);
    int moved = 0;
    for (int i = 0; i < n; i++)
        moved |= xm_mpi_exec_advance(be->snap[i]);
    pthread_mutex_lock(&be->mu);
    be->busy = 0;
    be->rounds++;
    for (xm_request_t **pp = &be->active; *pp;) {
        if ((*pp)->phase == 2) {
            xm_request_t *r = *pp;
            *pp = r->next_active;
            r->done = 1;
            moved = 1;
        } else {
            pp = &(*pp)->next_active;
        }
    }
    be->idle_rounds += !moved;
    pthread_cond_broadcast(&be->done_cv);
    if (!from_thread && be->active && be->thread_started)
        pthread_cond_signal(&be->work_cv);
    return moved;
}

/* Sleeps on `cv` for `ns` nanoseconds (or until signalled); be->mu held. */
static void timed_sleep(xm_mpi_ctx_t *be, pthread_cond_t *cv, long ns)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += ns;
    if (ts.tv_nsec >= 1000000000l) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000l;
    }
    pthread_cond_timedwait(cv, &be->mu, &ts);
}

/* ops->start: queues the reshard. With a progress thread (MULTIPLE) it
 * makes no MPI call; without one it runs one progress round, so receives
 * are posted and the first chunks leave before the caller computes. On
 * error nothing is queued and *out is untouched. */
xmesh_result_t xm_mpi_start(xmesh_plan_t p, const void *const *srcs, void *const *dsts,
                            xmesh_request_t *out)
{
    xm_exec_t *x = p->exec;
    xm_mpi_ctx_t *be = p->ctx->be;
    if (!x)
        return XM_ERR(XMESH_ERR_INVALID_USAGE, "plan has no executor state");
    /* Under the mutex, `active` first: while a request is in flight the
     * token holder may set `broken` (fail()) without the mutex; once none is,
     * no progress round touches x. */
    pthread_mutex_lock(&be->mu);
    if (x->active) {
        pthread_mutex_unlock(&be->mu);
        return XM_ERR(XMESH_ERR_INVALID_USAGE,
                      "plan already has a reshard in flight: wait for it before starting another "
                      "(use a second plan for concurrent transfers)");
    }
    if (x->broken) {
        pthread_mutex_unlock(&be->mu);
        return XM_ERR(XMESH_ERR_INVALID_USAGE,
                      "plan is unusable: an earlier reshard failed or timed out and MPI may still "
                      "deliver its messages; destroy it and create a new one");
    }
    xm_request_t *r = req_alloc(be);
    xmesh_result_t rc = r ? XMESH_SUCCESS : XM_ERR(XMESH_ERR_NO_MEMORY, "request: out of memory");
    int has_work = x->prog.ntasks > 0 || x->trace;
    if (!rc && has_work)
        rc = ensure_thread(be);
    if (rc) {
        if (r) {
            r->next_free = be->free_list;
            be->free_list = r;
        }
        pthread_mutex_unlock(&be->mu);
        return rc;
    }
    __atomic_store_n(&r->plan, p, __ATOMIC_RELEASE);
    r->magic = XM_REQ_LIVE;
    r->done = 0;
    r->result = XMESH_SUCCESS;
    r->msg[0] = '\0';
    r->phase = 0;
    r->trace_stage = 0;
    r->t_start = xm_mpi_now();
    r->deadline = p->timeout_s > 0 ? r->t_start + p->timeout_s : 0;
    r->next_abort_check = r->t_start;
    for (int i = 0; i < p->ntensors; i++) { /* the caller's arrays may go once we return */
        x->srcs[i] = srcs[i];
        x->dsts[i] = dsts[i];
    }
    memset(x->srt, 0, sizeof *x->srt * x->prog.nsteps);
    memset(x->tstate, 0, x->prog.ntasks);
    x->tfirst = 0;
    x->corrupted = 0;
    x->nev = 0;
    x->dropped_ev = 0;
    x->active = r;
    p->inflight++;
    if (!has_work) {
        r->phase = 2;
        r->done = 1;
    } else {
        r->next_active = be->active;
        be->active = r;
        if (be->thread_started)
            pthread_cond_signal(&be->work_cv);
        else if (!be->busy)
            progress_round(be, 0);
    }
    pthread_mutex_unlock(&be->mu);
    *out = (xmesh_request_t)r;
    return XMESH_SUCCESS;
}

/* Called with be->mu held on a finished request; unlocks. */
static xmesh_result_t release(xm_mpi_ctx_t *be, xm_request_t *r)
{
    xmesh_plan_t p = r->plan;
    xm_exec_t *x = p->exec;
    xmesh_result_t res = r->result;
    char msg[sizeof r->msg];
    memcpy(msg, r->msg, sizeof msg);
    p->inflight--;
    x->active = NULL;
    r->magic = XM_REQ_FREE;
    __atomic_store_n(&r->plan, &dead_plan, __ATOMIC_RELEASE);
    r->next_free = be->free_list;
    be->free_list = r;
    pthread_mutex_unlock(&be->mu);
    if (res)
        return XM_ERR(res, "%s", msg);
    return XMESH_SUCCESS;
}

/* ops->test: runs one progress round if nobody else holds the token (the
 * only progress below MPI_THREAD_MULTIPLE), then IN_PROGRESS or the result
 * (request released). */
xmesh_result_t xm_mpi_test(xmesh_request_t req)
{
    xm_request_t *r = (xm_request_t *)req;
    xm_mpi_ctx_t *be = r->be; /* fixed at allocation; r->plan may change */
    pthread_mutex_lock(&be->mu);
    if (r->magic != XM_REQ_LIVE) {
        pthread_mutex_unlock(&be->mu);
        return dead_call(req);
    }
    if (!r->done && !be->busy)
        progress_round(be, 0);
    if (r->magic != XM_REQ_LIVE) { /* another thread finished it meanwhile */
        pthread_mutex_unlock(&be->mu);
        return dead_call(req);
    }
    if (!r->done) {
        pthread_mutex_unlock(&be->mu);
        return XMESH_IN_PROGRESS;
    }
    return release(be, r);
}

/* CPU seconds of the calling thread. */
static double thread_cpu_s(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0)
        return 0;
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ops->stats (xmesh_ctx_get_stats). */
void xm_mpi_stats(xmesh_ctx_t ctx, xmesh_ctx_stats_t *st)
{
    xm_mpi_ctx_t *be = ctx->be;
    pthread_mutex_lock(&be->mu);
    st->rounds = be->rounds;
    st->idle_rounds = be->idle_rounds;
    st->wait_cpu_s = be->wait_cpu_s;
    st->staged_bytes = __atomic_load_n(&be->staged_bytes, __ATOMIC_RELAXED);
    st->progress_cpu_s = 0;
    clockid_t cid;
    struct timespec ts;
    if (be->thread_started && pthread_getcpuclockid(be->thread, &cid) == 0 &&
        clock_gettime(cid, &ts) == 0)
        st->progress_cpu_s = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
    pthread_mutex_unlock(&be->mu);
}

/* XMESH_WAIT_NICE: a thread that drives a blocking wait asks for that nice
 * value (only ever a higher priority than its own), so that a forwarding
 * rank is not starved by neighbours that spin or compute on its core (2d
 * suite with a spinning closing barrier, docs/EXECUTOR.md). It sleeps with
 * back-off when nothing moves, so the priority costs others only the
 * progress work itself. Returns the value to restore, or INT_MIN when
 * nothing was changed. */
static int wait_priority_raise(void)
{
#ifdef __linux__
    int want = (int)xm_param_i64("XMESH_WAIT_NICE");
    id_t tid = (id_t)syscall(SYS_gettid);
    errno = 0;
    int cur = getpriority(PRIO_PROCESS, tid);
    if (errno == 0 && want < cur && setpriority(PRIO_PROCESS, tid, want) == 0)
        return cur;
#endif
    return INT_MIN;
}

static void wait_priority_restore(int old)
{
#ifdef __linux__
    if (old != INT_MIN)
        setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), old);
#else
    (void)old;
#endif
}

/* ops->wait: the calling thread drives progress itself (token rounds) until
 * the request is done, so a blocking call never depends on the progress
 * thread getting a core; the progress thread stays away meanwhile. When
 * nothing moves it yields, then sleeps with back-off (never spins). */
xmesh_result_t xm_mpi_wait(xmesh_request_t req)
{
    xm_request_t *r = (xm_request_t *)req;
    xm_mpi_ctx_t *be = r->be;
    pthread_mutex_lock(&be->mu);
    if (r->magic != XM_REQ_LIVE) {
        pthread_mutex_unlock(&be->mu);
        return dead_call(req);
    }
    xmesh_plan_t plan = r->plan;
    long backoff = BACKOFF_MIN_NS;
    /* The longest sleep of a blocking wait (XMESH_WAIT_BACKOFF_US): a chain's forwarder notices
     * an arrived chunk at most this late, and every hop of the chain's fill pays it once (1-to-m
     * 4x2 at 300 Mbit/s, 5 hosts x 4 ranks: 0.474-0.476 s with 1 ms, 0.467-0.469 s with 200 us,
     * 1x1 0.462 s in both; docs/EXECUTOR.md "Waking up sooner"). The progress thread keeps
     * BACKOFF_MAX_NS: it runs beside compute. */
    const long wait_max_ns = (long)xm_param_i64("XMESH_WAIT_BACKOFF_US") * 1000l;
    int idle = 0;
    be->callers++;
    int old_nice = wait_priority_raise();
    double cpu0 = thread_cpu_s();
    while (r->magic == XM_REQ_LIVE && r->plan == plan && !r->done) {
        if (be->busy) { /* another holder's round ends with a broadcast */
            pthread_cond_wait(&be->done_cv, &be->mu);
            continue;
        }
        if (progress_round(be, 1)) {
            backoff = BACKOFF_MIN_NS;
            idle = 0;
        } else if (r->done || r->magic != XM_REQ_LIVE) {
            break;
        } else if (idle++ < YIELD_POLLS) {
            pthread_mutex_unlock(&be->mu);
            sched_yield();
            pthread_mutex_lock(&be->mu);
        } else {
            timed_sleep(be, &be->done_cv, backoff);
            backoff = backoff * 2 > wait_max_ns ? wait_max_ns : backoff * 2;
        }
    }
    wait_priority_restore(old_nice);
    be->wait_cpu_s += thread_cpu_s() - cpu0;
    if (--be->callers == 0 && be->active && be->thread_started)
        pthread_cond_signal(&be->work_cv);
    if (r->magic != XM_REQ_LIVE || r->plan != plan) { /* another thread finished it */
        pthread_mutex_unlock(&be->mu);
        return dead_call(req);
    }
    return release(be, r);
}

/* ------------------------------------------------------- progress thread */

/* The progress thread (MPI_THREAD_MULTIPLE only): advances the queued
 * requests while no caller is blocked in xmesh_wait, i.e. it provides the
 * overlap of xmesh_reshard_start with the caller's compute. Sleeps
 * (condition variable) when idle or while a caller drives progress, backs
 * off when nothing moved. Exits on be->stop. */
void *xm_mpi_progress_main(void *arg)
{
    xm_mpi_ctx_t *be = arg;
    long backoff = BACKOFF_MIN_NS;
    int idle = 0;
#ifdef __linux__
    /* The default 50 us timer slack would turn every short backoff sleep
     * into 50 us and stall the chunk pipeline. */
    prctl(PR_SET_TIMERSLACK, 1000ul, 0, 0, 0);
    /* When every core computes (pipeline stages, several ranks per core),
     * a progress thread of the same priority waits a whole scheduler slice
     * between chunk handshakes and the NIC idles: measured on the emulated
     * cluster (4 hosts x 2 ranks, 2 cores, 16 MiB S0R -> RR at 200 Mbit/s,
     * tests/mpi/mpi_overlap), overlap efficiency 0.70 at the process's
     * priority, 0.98 at nice -10. The thread sleeps when idle, so the higher
     * priority costs the compute threads only the progress work itself. */
    int nice_v = (int)xm_param_i64("XMESH_PROGRESS_NICE");
    if (setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), nice_v) != 0)
        XM_LOG(XM_LOG_INFO, "progress thread keeps its priority (nice %d refused: %s)", nice_v,
               strerror(errno));
#endif
    pthread_mutex_lock(&be->mu);
    while (!be->stop) {
        if (!be->active || be->callers > 0 || be->busy) {
            pthread_cond_wait(&be->work_cv, &be->mu);
            backoff = BACKOFF_MIN_NS;
            continue;
        }
        if (progress_round(be, 1)) {
            backoff = BACKOFF_MIN_NS;
            idle = 0;
        } else if (be->active && !be->stop && idle++ < YIELD_POLLS) {
            /* Data was moving a moment ago: poll again soon, but give the
             * core away first (ranks share cores in tests). */
            pthread_mutex_unlock(&be->mu);
            sched_yield();
            pthread_mutex_lock(&be->mu);
        } else if (be->active && !be->stop) {
            /* Nothing moved: sleep (woken early by a new request) so that
             * waiting never burns a core. */
            timed_sleep(be, &be->work_cv, backoff);
            backoff = backoff * 2 > BACKOFF_MAX_NS ? BACKOFF_MAX_NS : backoff * 2;
        }
    }
    pthread_mutex_unlock(&be->mu);
    return NULL;
}

/* ------------------------------------------------------------ execution */

static void fail(xm_request_t *r, xmesh_result_t code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Records the first error, cancels the outstanding MPI requests and
 * finishes the request. Requests that cannot be cancelled within a grace
 * period (sends, receives MPI already matched) stay in x->reqs, owned by the
 * plan, which is retired; they only ever point into the plan's staging and
 * checksum memory (unless XMESH_ZERO_COPY=1), so the caller's blocks are
 * never touched after this reshard returns. exec_free settles them. */
static void fail(xm_request_t *r, xmesh_result_t code, const char *fmt, ...)
{
    xm_exec_t *x = r->plan->exec;
    if (r->result == XMESH_SUCCESS) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->msg, sizeof r->msg, fmt, ap);
        va_end(ap);
        r->result = code;
    }
    int pending = 0;
    for (int i = 0; i < x->nreqs; i++)
        if (x->reqs[i] != MPI_REQUEST_NULL) {
            MPI_Cancel(&x->reqs[i]);
            pending++;
        }
    /* Give cancellations 50 ms of wall time to complete (however loaded the
     * machine is); what is left stays with the plan. */
    double until = xm_mpi_now() + 0.05;
    while (pending && xm_mpi_now() < until) {
        int flag = 0;
        MPI_Testall(x->nreqs, x->reqs, &flag, MPI_STATUSES_IGNORE);
        if (flag)
            pending = 0;
        else {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
    }
    x->kept = 0;
    for (int i = 0; i < x->nreqs; i++)
        x->kept += x->reqs[i] != MPI_REQUEST_NULL;
    if (x->kept)
        XM_INFO("rank %d: plan %d keeps %d uncancellable MPI request(s) after the failure "
                "(they only reference %s)",
                x->rank, x->plan_id, x->kept,
                x->zero_copy ? "the caller's blocks (XMESH_ZERO_COPY=1)" : "plan memory");
    xm_mpi_trace_cancel(r);
    /* Peers may still send this reshard's messages: they would match the
     * next reshard's receives, so the plan is retired. */
    x->broken = 1;
    r->phase = 2;
}

/* Runs chunk c of step s through the program's ops (xm_pop_t); the RECV op
 * was posted ahead by post_recv and has completed. Staging slots hold
 * accumulator elements in partial-sum steps. With XMESH_ZERO_COPY=1 a chunk
 * that is one run of a caller block is sent from (or was received into)
 * the block itself. Returns an MPI error code (0 on success). */
/* Counts bytes copied by the executor (xmesh_ctx_stats_t.staged_bytes). */
static void staged(xm_exec_t *x, int64_t bytes)
{
    if (x->staged)
        __atomic_fetch_add(x->staged, bytes, __ATOMIC_RELAXED);
}

/* Op o of step s over its elements [a, a + cnt) on the reshard's blocks
 * (lib/plan/blockops.c). */
static void block_op(xm_exec_t *x, const xm_pstep_t *s, const xm_pop_t *o, char *buf, int64_t a,
                     int64_t cnt)
{
    xm_step_block_op(&x->prog, x->srcs, x->dsts, s, o, buf, a, cnt);
}

static int compute_chunk(xm_exec_t *x, const xm_pstep_t *s, const xm_stepx_t *sx, xm_step_rt_t *rt,
                         int64_t c, MPI_Request *sendreq)
{
    int64_t a, cnt, off;
    xm_pstep_chunk(s, c, &a, &cnt);
    int slot = (int)(c % x->window);
    size_t des = xmesh_dtype_size(s->ddt), bs = s->stage_es;
    int packed = s->npieces > 0;
    /* zero copy works on one block: never for a packed step */
    char *dst = packed ? NULL : x->dsts[s->tensor];
    char *src = packed ? NULL : (char *)x->srcs[s->tensor];
    char *buf = sx->stage_off >= 0 ? x->stage + sx->stage_off + (int64_t)slot * s->ce * bs : NULL;
    const char *sbuf = buf;
    int in_place = 0;
    for (int i = 0; i < s->nops; i++) {
        const xm_pop_t *o = &s->ops[i];
        switch (o->kind) {
        case XM_POP_RECV:
            if (!packed && s->mode == XM_MODE_RECV && x->zero_copy && s->in_dt == s->ddt &&
                xm_geom_contig(&s->dg, a, cnt, &off)) {
                sbuf = dst + off * des; /* post_recv received into the block */
                in_place = 1;
            }
            break;
        case XM_POP_PACK: {
            const xm_geom_t *g = o->blk ? &s->dg : &s->sg;
            char *blk = o->blk ? dst : src;
            xmesh_dtype_t bdt = o->blk ? s->ddt : s->sdt;
            if (!packed && x->zero_copy && o->dt == bdt && xm_geom_contig(g, a, cnt, &off)) {
                sbuf = blk + off * xmesh_dtype_size(bdt);
            } else {
                block_op(x, s, o, buf, a, cnt);
                staged(x, cnt * (int64_t)xmesh_dtype_size(o->dt));
            }
            break;
        }
        case XM_POP_TO_ACC:
        case XM_POP_ADD_ACC:
            block_op(x, s, o, buf, a, cnt);
            staged(x, cnt * (int64_t)xmesh_dtype_size(xm_dtype_acc(s->sdt)));
            break;
        case XM_POP_TO_NATIVE:
            xm_convert((xmesh_dtype_t)o->dt, buf, xm_dtype_acc(s->sdt), buf, cnt);
            break;
        case XM_POP_UNPACK: {
            /* XMESH_CHECK sums the values as they came off the wire: the
             * written block when the wire carries its dtype, else (and for
             * a packed step, whose chunk spans several blocks) the
             * received buffer before it is unpacked. */
            int conv = o->dt != s->ddt || packed;
            if (x->check && s->ck_verify && conv) {
                if (x->corrupt && !x->corrupted) { /* test hook: damage the received bytes */
                    buf[0] ^= 0x40;
                    x->corrupted = 1;
                }
                x->ck[sx->ck_off + c] =
                    xm_geom_hash(NULL, buf, 1, 0, cnt * (int64_t)xmesh_dtype_size(o->dt));
            }
            if (!in_place) {
                block_op(x, s, o, buf, a, cnt);
                staged(x, cnt * (int64_t)xmesh_dtype_size(o->dt));
            }
            if (x->check && s->ck_verify && !conv) {
                if (x->corrupt && !x->corrupted) { /* test hook: damage the received bytes */
                    int64_t o1;
                    xm_geom_contig(&s->dg, a, 1, &o1);
                    dst[o1 * des] ^= 0x40;
                    x->corrupted = 1;
                }
                x->ck[sx->ck_off + c] = xm_geom_hash(&s->dg, dst, des, a, cnt);
            }
            break;
        }
        case XM_POP_COPY: {
            double t0 = x->trace ? xm_mpi_now() - x->t0 : 0;
            block_op(x, s, o, NULL, a, cnt);
            staged(x, cnt * (int64_t)des);
            if (x->trace)
                xm_mpi_trace_add(x, 3, s->task, x->rank, c, cnt * (int64_t)des, t0,
                                 xm_mpi_now() - x->t0);
            break;
        }
        case XM_POP_SEND: {
            int sbytes = (int)(cnt * (int64_t)xmesh_dtype_size(s->out_dt));
            if (x->check && s->ck_origin)
                x->ck[sx->ck_off + c] = xm_geom_hash(NULL, sbuf, 1, 0, sbytes);
            rt->t_send[slot] = x->trace ? xm_mpi_now() - x->t0 : 0;
            if (sx->sync)
                return MPI_Issend(sbuf, sbytes, MPI_BYTE, s->next, sx->tag_out, x->comm, sendreq);
            return MPI_Isend(sbuf, sbytes, MPI_BYTE, s->next, sx->tag_out, x->comm, sendreq);
        }
        default:
            break;
        }
    }
    return 0;
}

static int post_recv(xm_exec_t *x, const xm_pstep_t *s, xm_step_rt_t *rt, int64_t c,
                     MPI_Request *req)
{
    const xm_stepx_t *sx = &x->sx[s - x->prog.steps];
    int64_t a, cnt, off;
    xm_pstep_chunk(s, c, &a, &cnt);
    int slot = (int)(c % x->window);
    void *buf;
    int bytes = (int)(cnt * (int64_t)xmesh_dtype_size(s->in_dt));
    if (!s->npieces && s->mode == XM_MODE_RECV && x->zero_copy && s->in_dt == s->ddt &&
        xm_geom_contig(&s->dg, a, cnt, &off))
        buf = (char *)x->dsts[s->tensor] + off * (int64_t)xmesh_dtype_size(s->ddt);
    else
        buf = x->stage + sx->stage_off + (int64_t)slot * s->ce * (int64_t)s->stage_es;
    rt->t_recv[slot] = x->trace ? xm_mpi_now() - x->t0 : 0;
    return MPI_Irecv(buf, bytes, MPI_BYTE, s->prev, sx->tag_in, x->comm, req);
}

/* XMESH_CHECK: after its last chunk, the origin of a chain sends the
 * per-chunk checksums of the final values; every receiver compares them
 * with the sums of what it wrote and forwards the origin's sums. State:
 * 0 nothing posted, 1 sums being received, 2 sums being sent, 3 done.
 * Returns 1 if it moved, 0 if not, -1 after failing r. */
static int check_advance(xm_request_t *r, xm_exec_t *x, const xm_pstep_t *s, xm_step_rt_t *rt,
                         MPI_Request *rq)
{
    const xm_stepx_t *sx = &x->sx[s - x->prog.steps];
    int bytes = (int)(s->nchunks * 8), rc;
    uint64_t *own = sx->ck_off >= 0 ? x->ck + sx->ck_off : NULL,
             *in = own ? own + s->nchunks : NULL;
    int verify = s->ck_verify, origin = s->ck_origin && s->next >= 0;
    if (!verify && !origin) {
        rt->ck_state = 3;
        return 0;
    }
    if (rt->ck_state == 0) {
        if (verify) {
            if (rt->posted < s->nchunks) /* after the last chunk's receive: same tag, in order */
                return 0;
            if ((rc = MPI_Irecv(in, bytes, MPI_BYTE, s->prev, sx->tag_in, x->comm,
                                &rq[2 * x->window])))
                goto out_mpi;
            rt->ck_state = 1;
            return 1;
        }
        if (rt->computed < s->nchunks) /* after the last chunk's send */
            return 0;
        if ((rc = MPI_Isend(own, bytes, MPI_BYTE, s->next, sx->tag_out, x->comm,
                            &rq[2 * x->window + 1])))
            goto out_mpi;
        rt->ck_state = 2;
        return 1;
    }
    if (rt->ck_state == 1) {
        if (rq[2 * x->window] != MPI_REQUEST_NULL || rt->computed < s->nchunks)
            return 0;
        for (int64_t c = 0; c < s->nchunks; c++)
            if (in[c] != own[c]) {
                int64_t a, cnt;
                xm_pstep_chunk(s, c, &a, &cnt);
                /* Global coordinates of the chunk's first element. */
                char at[160];
                xm_step_where(&x->prog, &r->plan->ts, r->plan->ntensors, s, a, at, sizeof at);
                /* Pass the origin's sums on, so the ranks downstream (which
                 * got the same damaged bytes) report it too instead of
                 * timing out. */
                /* The sums' send slot is free (state 1): fail() then owns
                 * the send like any other, so x->ck outlives it. */
                if (s->next >= 0)
                    MPI_Isend(in, bytes, MPI_BYTE, s->next, sx->tag_out, x->comm,
                              &rq[2 * x->window + 1]);
                fail(r, XMESH_ERR_BACKEND,
                     "rank %d: XMESH_CHECK: data of task %d received from rank %d is corrupt in "
                     "chunk %lld of %lld: %lld elements starting at global index (%s) differ "
                     "from what the sending chain produced",
                     x->rank, s->task, s->prev, (long long)c, (long long)s->nchunks, (long long)cnt,
                     at);
                return -1;
            }
        if (s->next >= 0) {
            if ((rc = MPI_Isend(in, bytes, MPI_BYTE, s->next, sx->tag_out, x->comm,
                                &rq[2 * x->window + 1])))
                goto out_mpi;
            rt->ck_state = 2;
        } else {
            rt->ck_state = 3;
        }
        return 1;
    }
    if (rq[2 * x->window + 1] != MPI_REQUEST_NULL)
        return 0;
    rt->ck_state = 3;
    return 1;
out_mpi:
    fail(r, XMESH_ERR_BACKEND, "XMESH_CHECK: checksum message of task %d failed (MPI error %d)",
         s->task, rc);
    return -1;
}

/* Advances one step as far as it can without blocking. Returns 1 if it
 * moved, 0 if not, -1 on an MPI error (r failed). */
static int step_advance(xm_request_t *r, xm_exec_t *x, int si)
{
    const xm_pstep_t *s = &x->prog.steps[si];
    const xm_stepx_t *sx = &x->sx[si];
    xm_step_rt_t *rt = &x->srt[si];
    if (rt->done)
        return 0;
    int moved = 0, rc;
    if (!rt->started) {
        if (s->after >= 0 && !x->srt[s->after].done)
            return 0;
        rt->started = 1;
        rt->t_start = xm_mpi_now();
        moved = 1;
    }
    MPI_Request *rq = sx->req_off >= 0 ? x->reqs + sx->req_off : NULL;
    if (s->prev >= 0)
        while (rt->posted < s->nchunks && rt->posted - rt->completed < x->window) {
            int64_t c = rt->posted;
            if ((rc = post_recv(x, s, rt, c, &rq[c % x->window]))) {
                fail(r, XMESH_ERR_BACKEND,
                     "MPI_Irecv of chunk %lld of task %d from rank %d failed (MPI error %d)",
                     (long long)c, s->task, s->prev, rc);
                return -1;
            }
            rt->posted++;
            moved = 1;
        }
    while (rt->computed < s->nchunks) {
        int64_t c = rt->computed;
        int slot = (int)(c % x->window);
        if (s->prev >= 0) {
            if (c >= rt->posted || rq[slot] != MPI_REQUEST_NULL)
                break;
            if (x->trace) {
                int64_t a, cnt;
                xm_pstep_chunk(s, c, &a, &cnt);
                xm_mpi_trace_add(x, 2, s->task, s->prev, c,
                                 cnt * (int64_t)xmesh_dtype_size(s->in_dt), rt->t_recv[slot],
                                 xm_mpi_now() - x->t0);
            }
        }
        int ahead = sx->hold && rt->completed == 0 ? 1 : sx->ahead; /* see compile.c */
        if (s->next >= 0 && c - rt->completed >= ahead)
            break;
        if ((rc = compute_chunk(x, s, sx, rt, c, rq ? &rq[x->window + slot] : NULL))) {
            fail(r, XMESH_ERR_BACKEND,
                 "MPI_Isend of chunk %lld of task %d to rank %d failed (MPI error %d)",
                 (long long)c, s->task, s->next, rc);
            return -1;
        }
        rt->computed++;
        moved = 1;
    }
    while (rt->completed < rt->computed) {
        int64_t c = rt->completed;
        int slot = (int)(c % x->window);
        if (s->next >= 0) {
            if (rq[x->window + slot] != MPI_REQUEST_NULL)
                break;
            if (x->trace) {
                int64_t a, cnt;
                xm_pstep_chunk(s, c, &a, &cnt);
                xm_mpi_trace_add(x, 1, s->task, s->next, c,
                                 cnt * (int64_t)xmesh_dtype_size(s->out_dt), rt->t_send[slot],
                                 xm_mpi_now() - x->t0);
            }
        }
        rt->completed++;
        moved = 1;
    }
    if (x->check && rt->ck_state < 3) {
        int m = check_advance(r, x, s, rt, rq);
        if (m < 0)
            return -1;
        moved |= m;
    }
    if (rt->completed == s->nchunks && (!x->check || rt->ck_state == 3)) {
        rt->done = 1;
        moved = 1;
    }
    return moved;
}

/* Names what an unfinished request is waiting for (timeout messages). */
static void describe_wait(xm_exec_t *x, char *buf, size_t len)
{
    for (int i = x->tfirst; i < x->prog.ntasks; i++) {
        if (x->tstate[i] != 1)
            continue;
        const xm_ptask_t *t = &x->prog.tasks[i];
        for (int k = 0; k < t->nsteps; k++) {
            const xm_pstep_t *s = &x->prog.steps[t->first_step + k];
            const xm_step_rt_t *rt = &x->srt[t->first_step + k];
            if (rt->done || !rt->started)
                continue;
            if (rt->completed == s->nchunks && x->check && rt->ck_state != 3) {
                if (rt->ck_state == 2)
                    snprintf(buf, len,
                             "waiting for rank %d to receive the XMESH_CHECK sums of "
                             "task %d",
                             s->next, s->task);
                else
                    snprintf(buf, len, "waiting for the XMESH_CHECK sums of task %d from rank %d",
                             s->task, s->prev);
                return;
            }
            if (s->prev >= 0 && rt->computed < s->nchunks)
                snprintf(buf, len, "waiting to receive chunk %lld of %lld of task %d from rank %d",
                         (long long)rt->computed, (long long)s->nchunks, s->task, s->prev);
            else
                snprintf(buf, len, "waiting for rank %d to receive chunk %lld of %lld of task %d",
                         s->next, (long long)rt->completed, (long long)s->nchunks, s->task);
            return;
        }
    }
    snprintf(buf, len, "no transfer active (task %d of %d pending)", x->tfirst, x->prog.ntasks);
}

int xm_mpi_exec_advance(xm_request_t *r)
{
    xm_exec_t *x = r->plan->exec;
    int moved = 0;
    if (r->phase == 0) {
        if (x->nreqs) {
            int outcount = 0;
            int rc = MPI_Testsome(x->nreqs, x->reqs, &outcount, x->req_idx, MPI_STATUSES_IGNORE);
            if (rc) {
                fail(r, XMESH_ERR_REMOTE,
                     "MPI_Testsome failed (MPI error %d): a peer of this rank failed or the "
                     "network broke",
                     rc);
                return 1;
            }
            if (outcount > 0 && outcount != MPI_UNDEFINED)
                moved = 1;
        }
        /* Tasks start in global order: a task waits until every earlier
         * task that uses one of its NIC directions on this rank is done. */
        unsigned blocked = 0;
        for (int i = x->tfirst; i < x->prog.ntasks; i++) {
            const xm_ptask_t *t = &x->prog.tasks[i];
            if (x->tstate[i] == 2) {
                if (i == x->tfirst)
                    x->tfirst++;
                continue;
            }
            if (x->tstate[i] == 0) {
                if (t->slots & blocked) {
                    blocked |= t->slots;
                    if (blocked == XM_SLOT_ALL)
                        break;
                    continue;
                }
                x->tstate[i] = 1;
                x->srt[t->first_step].t_start = xm_mpi_now();
                moved = 1;
            }
            int all = 1;
            for (int k = 0; k < t->nsteps; k++) {
                int m = step_advance(r, x, t->first_step + k);
                if (m < 0)
                    return 1;
                moved |= m;
                all &= x->srt[t->first_step + k].done;
            }
            if (all) {
                x->tstate[i] = 2;
                if (x->trace)
                    xm_mpi_trace_add(x, 0, t->task, -1, -1, 0,
                                     x->srt[t->first_step].t_start - x->t0, xm_mpi_now() - x->t0);
                if (i == x->tfirst)
                    x->tfirst++;
                moved = 1;
            } else {
                blocked |= t->slots;
            }
        }
        if (x->tfirst == x->prog.ntasks) {
            r->phase = 1;
            moved = 1;
        }
    }
    if (r->phase == 1) {
        int t = x->trace ? xm_mpi_trace_progress(r) : 1;
        if (t < 0) {
            /* The data arrived; a lost trace is only worth a warning. The
             * gather may be half done, so tracing stops for this plan. */
            XM_WARN("rank %d: %s; tracing disabled for plan %d", x->rank, r->msg, x->plan_id);
            r->msg[0] = '\0';
            xm_mpi_trace_cancel(r);
            x->trace = 0;
            t = 1;
        }
        if (t > 0) {
            x->nreshards++;
            r->phase = 2;
            return 1;
        }
    }
    xmesh_abort_check_t check = __atomic_load_n(&r->plan->ctx->abort_check, __ATOMIC_ACQUIRE);
    if (r->phase < 2 && check) {
        double now = xm_mpi_now();
        if (now >= r->next_abort_check) {
            char why[256] = "";
            r->next_abort_check = now + 0.002;
            if (check(r->plan->ctx->abort_user, why, sizeof why)) {
                why[sizeof why - 1] = '\0';
                fail(r, XMESH_ERR_REMOTE, "rank %d: reshard abandoned: %s", x->rank,
                     why[0] ? why : "the application's abort check said so");
                return 1;
            }
        }
    }
    if (r->phase < 2 && r->deadline > 0 && xm_mpi_now() > r->deadline) {
        char what[256];
        describe_wait(x, what, sizeof what);
        fail(r, XMESH_ERR_TIMEOUT, "rank %d: reshard timed out after %.3g s, %s", x->rank,
             r->plan->timeout_s, what);
        return 1;
    }
    return moved;
}
