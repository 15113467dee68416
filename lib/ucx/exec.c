/* The UCX runner of the per-rank program: plan setup over the bootstrap,
 * requests, the progress token and thread, chunked pipelined chains with
 * the MPI runner's windows, partial sums, timeouts, the abort check, trace.
 * The structure follows lib/mpi/exec.c step for step (the same contract);
 * only the messages differ: UCX tag sends and receives with completion
 * callbacks instead of MPI requests. */
#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdarg.h>
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

#include "xm_ucx.h"

#define BACKOFF_MIN_NS 1000l
#define BACKOFF_MAX_NS 1000000l
#define YIELD_POLLS 16

/* ------------------------------------------------------------ slots */

static void send_done(void *req, ucs_status_t st, void *user)
{
    (void)req;
    xu_slot_t *s = user;
    s->status = st;
    __atomic_store_n(&s->busy, 0, __ATOMIC_RELEASE);
}

static void recv_done(void *req, ucs_status_t st, const ucp_tag_recv_info_t *info, void *user)
{
    (void)req;
    xu_slot_t *s = user;
    s->status = st;
    s->len = info ? info->length : 0;
    __atomic_store_n(&s->busy, 0, __ATOMIC_RELEASE);
}

ucs_status_t xu_send(xu_ctx_t *be, int peer, int rail, const void *buf, size_t n, uint64_t tag,
                     int sync, xu_slot_t *s)
{
    int k = xu_rail_worker(be, rail);
    ucp_ep_h ep = be->peers[peer].ep[k];
    ucp_request_param_t prm;
    memset(&prm, 0, sizeof prm);
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    prm.cb.send = send_done;
    prm.user_data = s;
    s->busy = 1;
    s->status = UCS_OK;
    s->req = NULL;
    s->w = be->worker[k];
    ucs_status_ptr_t p = sync ? ucp_tag_send_sync_nbx(ep, buf, n, tag, &prm)
                              : ucp_tag_send_nbx(ep, buf, n, tag, &prm);
    if (p == NULL) { /* completed in place: no callback */
        s->busy = 0;
        return UCS_OK;
    }
    if (UCS_PTR_IS_ERR(p)) {
        s->busy = 0;
        return UCS_PTR_STATUS(p);
    }
    s->req = p;
    return UCS_OK;
}

ucs_status_t xu_recv(xu_ctx_t *be, int rail, void *buf, size_t n, uint64_t tag, xu_slot_t *s)
{
    ucp_worker_h w = be->worker[xu_rail_worker(be, rail)];
    ucp_request_param_t prm;
    memset(&prm, 0, sizeof prm);
    prm.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    prm.cb.recv = recv_done;
    prm.user_data = s;
    s->busy = 1;
    s->status = UCS_OK;
    s->len = 0;
    s->w = w;
    ucs_status_ptr_t p = ucp_tag_recv_nbx(w, buf, n, tag, UINT64_MAX, &prm);
    if (UCS_PTR_IS_ERR(p)) {
        s->busy = 0;
        s->req = NULL;
        return UCS_PTR_STATUS(p);
    }
    s->req = p;
    return UCS_OK;
}

int xu_progress(xu_ctx_t *be)
{
    int moved = 0;
    for (int k = 0; k < be->nw; k++)
        moved |= ucp_worker_progress(be->worker[k]) != 0;
    return moved;
}

/* 1 when the slot holds nothing in flight (its UCX request released); *err
 * gets a failed operation's status (UCS_OK otherwise), *len a receive's. */
int xu_slot_idle(xu_ctx_t *be, xu_slot_t *s, ucs_status_t *err, size_t *len)
{
    (void)be;
    if (__atomic_load_n(&s->busy, __ATOMIC_ACQUIRE))
        return 0;
    if (s->req) {
        ucp_request_free(s->req);
        s->req = NULL;
    }
    if (err)
        *err = s->status;
    if (len)
        *len = s->len;
    s->status = UCS_OK;
    return 1;
}

/* ----------------------------------------------------------- requests */

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

static xu_request_t *req_alloc(xu_ctx_t *be)
{
    if (!be->free_list) {
        enum { N = 16 };
        xu_request_t *blk = calloc(N, sizeof *blk);
        xu_request_t **nb = realloc(be->blocks, sizeof *nb * (be->nblocks + 1));
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
            blk[i].be = be;
            blk[i].magic = XU_REQ_FREE;
            blk[i].next_free = be->free_list;
            be->free_list = &blk[i];
        }
    }
    xu_request_t *r = be->free_list;
    be->free_list = r->next_free;
    return r;
}

void xu_ctx_free_requests(xu_ctx_t *be)
{
    for (int i = 0; i < be->nblocks; i++)
        free(be->blocks[i]);
    free(be->blocks);
    free(be->snap);
    be->blocks = NULL;
    be->snap = NULL;
}

static void *progress_main(void *arg);

static xmesh_result_t ensure_thread(xu_ctx_t *be)
{
    if (be->thread_started || !be->threaded)
        return XMESH_SUCCESS;
    int e = pthread_create(&be->thread, NULL, progress_main, be);
    if (e)
        return XM_ERR(XMESH_ERR_SYSTEM, "cannot start the progress thread: %s", strerror(e));
    be->thread_started = 1;
    return XMESH_SUCCESS;
}

void xu_ctx_stop_thread(xu_ctx_t *be)
{
    pthread_mutex_lock(&be->mu);
    be->stop = 1;
    pthread_cond_broadcast(&be->work_cv);
    pthread_mutex_unlock(&be->mu);
    if (be->thread_started)
        pthread_join(be->thread, NULL);
    be->thread_started = 0;
}

static int exec_advance(xu_request_t *r);

/* One progress round (be->mu held, token free): UCX progress, then every
 * active request advanced without the lock. As lib/mpi/exec.c. */
static int progress_round(xu_ctx_t *be, int from_thread)
{
    int n = 0;
    for (xu_request_t *r = be->active; r; r = r->next_active) {
        if (n == be->snap_cap) {
            int ncap = be->snap_cap ? 2 * be->snap_cap : 8;
            xu_request_t **ns = realloc(be->snap, sizeof *ns * ncap);
            if (!ns)
                break;
            be->snap = ns;
            be->snap_cap = ncap;
        }
        be->snap[n++] = r;
    }
    be->busy = 1;
    pthread_mutex_unlock(&be->mu);
    int moved = 0;
    for (int k = 0; k < 64 && xu_progress(be); k++)
        moved = 1;
    for (int i = 0; i < n; i++)
        moved |= exec_advance(be->snap[i]);
    pthread_mutex_lock(&be->mu);
    be->busy = 0;
    be->rounds++;
    for (xu_request_t **pp = &be->active; *pp;) {
        if ((*pp)->phase == 2) {
            xu_request_t *r = *pp;
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

static void timed_sleep(xu_ctx_t *be, pthread_cond_t *cv, long ns)
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

xmesh_result_t xu_start(xmesh_plan_t p, const void *const *srcs, void *const *dsts,
                        xmesh_request_t *out)
{
    xu_exec_t *x = p->exec;
    xu_ctx_t *be = p->ctx->be;
    if (!x)
        return XM_ERR(XMESH_ERR_INVALID_USAGE, "plan has no executor state");
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
                      "plan is unusable: an earlier reshard failed or timed out and UCX may still "
                      "deliver its messages; destroy it and create a new one");
    }
    xu_request_t *r = req_alloc(be);
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
    r->magic = XU_REQ_LIVE;
    r->done = 0;
    r->result = XMESH_SUCCESS;
    r->msg[0] = '\0';
    r->phase = 0;
    r->trace_stage = 0;
    r->t_start = xu_now();
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

static xmesh_result_t release(xu_ctx_t *be, xu_request_t *r)
{
    xmesh_plan_t p = r->plan;
    xu_exec_t *x = p->exec;
    xmesh_result_t res = r->result;
    char msg[sizeof r->msg];
    memcpy(msg, r->msg, sizeof msg);
    p->inflight--;
    x->active = NULL;
    r->magic = XU_REQ_FREE;
    __atomic_store_n(&r->plan, &dead_plan, __ATOMIC_RELEASE);
    r->next_free = be->free_list;
    be->free_list = r;
    pthread_mutex_unlock(&be->mu);
    if (res)
        return XM_ERR(res, "%s", msg);
    return XMESH_SUCCESS;
}

xmesh_result_t xu_test(xmesh_request_t req)
{
    xu_request_t *r = (xu_request_t *)req;
    xu_ctx_t *be = r->be;
    pthread_mutex_lock(&be->mu);
    if (r->magic != XU_REQ_LIVE) {
        pthread_mutex_unlock(&be->mu);
        return dead_call(req);
    }
    if (!r->done && !be->busy)
        progress_round(be, 0);
    if (r->magic != XU_REQ_LIVE) {
        pthread_mutex_unlock(&be->mu);
        return dead_call(req);
    }
    if (!r->done) {
        pthread_mutex_unlock(&be->mu);
        return XMESH_IN_PROGRESS;
    }
    return release(be, r);
}

static double thread_cpu_s(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0)
        return 0;
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void xu_stats(xmesh_ctx_t ctx, xmesh_ctx_stats_t *st)
{
    xu_ctx_t *be = ctx->be;
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

/* XMESH_WAIT_NICE, as the MPI runner. */
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

xmesh_result_t xu_wait(xmesh_request_t req)
{
    xu_request_t *r = (xu_request_t *)req;
    xu_ctx_t *be = r->be;
    pthread_mutex_lock(&be->mu);
    if (r->magic != XU_REQ_LIVE) {
        pthread_mutex_unlock(&be->mu);
        return dead_call(req);
    }
    xmesh_plan_t plan = r->plan;
    long backoff = BACKOFF_MIN_NS;
    const long wait_max_ns = (long)xm_param_i64("XMESH_WAIT_BACKOFF_US") * 1000l;
    int idle = 0;
    be->callers++;
    int old_nice = wait_priority_raise();
    double cpu0 = thread_cpu_s();
    while (r->magic == XU_REQ_LIVE && r->plan == plan && !r->done) {
        if (be->busy) {
            pthread_cond_wait(&be->done_cv, &be->mu);
            continue;
        }
        if (progress_round(be, 1)) {
            backoff = BACKOFF_MIN_NS;
            idle = 0;
        } else if (r->done || r->magic != XU_REQ_LIVE) {
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
    if (r->magic != XU_REQ_LIVE || r->plan != plan) {
        pthread_mutex_unlock(&be->mu);
        return dead_call(req);
    }
    return release(be, r);
}

static void *progress_main(void *arg)
{
    xu_ctx_t *be = arg;
    long backoff = BACKOFF_MIN_NS;
    int idle = 0;
#ifdef __linux__
    prctl(PR_SET_TIMERSLACK, 1000ul, 0, 0, 0);
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
            pthread_mutex_unlock(&be->mu);
            sched_yield();
            pthread_mutex_lock(&be->mu);
        } else if (be->active && !be->stop) {
            timed_sleep(be, &be->work_cv, backoff);
            backoff = backoff * 2 > BACKOFF_MAX_NS ? BACKOFF_MAX_NS : backoff * 2;
        }
    }
    pthread_mutex_unlock(&be->mu);
    return NULL;
}

/* --------------------------------------------------------------- trace */

static void trace_add(xu_exec_t *x, int kind, int task, int peer, int64_t chunk, int64_t bytes,
                      double t0, double t1)
{
    if (x->nev >= x->cap_ev) {
        x->dropped_ev++;
        return;
    }
    x->ev[x->nev++] = (xu_trace_ev_t){t0, t1, kind, task, peer, chunk, bytes};
}

static const char *kind_name[] = {"task", "send", "recv", "copy"};

static void write_events(FILE *f, const xu_trace_ev_t *ev, int64_t n, int rank, int host,
                         int *first)
{
    for (int64_t i = 0; i < n; i++) {
        const xu_trace_ev_t *e = &ev[i];
        int k = e->kind >= 0 && e->kind < 4 ? e->kind : 0;
        char name[64];
        if (k == 0)
            snprintf(name, sizeof name, "task %d", e->task);
        else
            snprintf(name, sizeof name, "%s t%d c%lld", kind_name[k], e->task, (long long)e->chunk);
        fprintf(f,
                "%s\n{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,"
                "\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"task\":%d,\"chunk\":%lld,"
                "\"peer\":%d,\"bytes\":%lld}}",
                *first ? "" : ",", name, kind_name[k], host, rank, e->t0 * 1e6,
                (e->t1 - e->t0) * 1e6, e->task, (long long)e->chunk, e->peer, (long long)e->bytes);
        *first = 0;
    }
}

/* "%p" plan id, "%n" reshard index, "%%" a percent sign. */
static void expand_path(const xu_exec_t *x, char *out, size_t len)
{
    size_t o = 0;
    for (const char *s = x->trace_path; *s && o + 24 < len; s++) {
        if (s[0] == '%' && s[1] == 'p') {
            o += (size_t)snprintf(out + o, len - o, "%d", x->plan_id);
            s++;
        } else if (s[0] == '%' && s[1] == 'n') {
            o += (size_t)snprintf(out + o, len - o, "%lld", (long long)x->nreshards);
            s++;
        } else if (s[0] == '%' && s[1] == '%') {
            out[o++] = '%';
            s++;
        } else {
            out[o++] = *s;
        }
    }
    out[o] = '\0';
}

static int trace_write(xu_request_t *r)
{
    xmesh_plan_t p = r->plan;
    xu_exec_t *x = p->exec;
    char path[600];
    expand_path(x, path, sizeof path);
    FILE *f = fopen(path, "w");
    if (!f) {
        snprintf(r->msg, sizeof r->msg, "XMESH_TRACE: cannot open '%.400s' for writing", path);
        return -1;
    }
    int first = 1;
    fprintf(f, "{\"traceEvents\":[");
    for (int i = 0; i < x->nparts; i++) {
        int q = x->parts[i], h = p->ctx->hosts.host_of[q];
        const xu_trace_ev_t *ev = q == x->rank ? x->ev : x->tr_bufs[i];
        int64_t n = q == x->rank ? x->nev : x->tr_counts[i];
        write_events(f, ev, n, q, h, &first);
    }
    fprintf(f,
            "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"source\":\"xmesh UCX runner\","
            "\"plan\":%d,\"reshard\":%lld,\"strategy\":\"%s\",\"scheduler\":\"%s\","
            "\"chunk_bytes\":%lld,\"leader_dropped_events\":%lld}}\n",
            x->plan_id, (long long)x->nreshards, xmesh_strategy_name(p->strategy),
            xmesh_scheduler_name(p->scheduler), (long long)p->chunk_bytes,
            (long long)x->dropped_ev);
    int bad = ferror(f);
    if (fclose(f) || bad) {
        snprintf(r->msg, sizeof r->msg, "XMESH_TRACE: error writing '%.400s'", path);
        return -1;
    }
    return 0;
}

/* Gathers every participant's events at the leader: counts, then events.
 * 1 done, 0 again later, -1 error (r->msg). */
static int trace_progress(xu_request_t *r)
{
    xu_exec_t *x = r->plan->exec;
    xu_ctx_t *be = r->plan->ctx->be;
    int n = x->nparts;
    ucs_status_t st = UCS_OK;
    if (r->trace_stage == 0) {
        if (x->rank == x->leader) {
            for (int i = 0; i < n && st == UCS_OK; i++)
                if (x->parts[i] != x->rank)
                    st = xu_recv(be, -1, &x->tr_counts[i], sizeof(int64_t),
                                 XU_TAG(x->tag, XU_TAG_TRACE_HOP, 2 * x->parts[i]),
                                 &x->tr_slots[2 * i]);
        } else {
            x->tr_counts[0] = x->nev;
            st = xu_send(be, x->leader, -1, &x->tr_counts[0], sizeof(int64_t),
                         XU_TAG(x->tag, XU_TAG_TRACE_HOP, 2 * x->rank), 0, &x->tr_slots[0]);
            if (st == UCS_OK)
                st = xu_send(be, x->leader, -1, x->ev, sizeof(xu_trace_ev_t) * (size_t)x->nev,
                             XU_TAG(x->tag, XU_TAG_TRACE_HOP, 2 * x->rank + 1), 0, &x->tr_slots[1]);
        }
        if (st != UCS_OK)
            goto out_ucx;
        r->trace_stage = 1;
    }
    for (int i = 0; i < 2 * n; i++) {
        ucs_status_t e = UCS_OK;
        if (!xu_slot_idle(be, &x->tr_slots[i], &e, NULL))
            return 0;
        if (e != UCS_OK) {
            st = e;
            goto out_ucx;
        }
    }
    if (x->rank != x->leader)
        return 1;
    if (r->trace_stage == 1) {
        for (int i = 0; i < n; i++) {
            if (x->parts[i] == x->rank)
                continue;
            int64_t c = x->tr_counts[i];
            free(x->tr_bufs[i]);
            x->tr_bufs[i] = malloc(sizeof(xu_trace_ev_t) * (size_t)(c ? c : 1));
            if (!x->tr_bufs[i]) {
                snprintf(r->msg, sizeof r->msg, "XMESH_TRACE: out of memory");
                return -1;
            }
            if ((st = xu_recv(be, -1, x->tr_bufs[i], sizeof(xu_trace_ev_t) * (size_t)c,
                              XU_TAG(x->tag, XU_TAG_TRACE_HOP, 2 * x->parts[i] + 1),
                              &x->tr_slots[2 * i])) != UCS_OK)
                goto out_ucx;
        }
        r->trace_stage = 2;
        return 0;
    }
    return trace_write(r) < 0 ? -1 : 1;
out_ucx:
    snprintf(r->msg, sizeof r->msg, "XMESH_TRACE: gathering events failed (UCX: %s)",
             ucs_status_string(st));
    return -1;
}

/* ------------------------------------------------------------ execution */

/* Cancels every operation in flight and gives UCX 50 ms to settle them;
 * what is left stays with the plan (its staging and slots), which is
 * retired. Only the plan's own memory is ever referenced. */
static void cancel_all(xu_ctx_t *be, xu_exec_t *x)
{
    int total = x->nslots + (x->tr_slots ? 2 * x->nparts : 0);
    for (int i = 0; i < total; i++) {
        xu_slot_t *s = i < x->nslots ? &x->slots[i] : &x->tr_slots[i - x->nslots];
        if (s->busy && s->req)
            ucp_request_cancel(s->w, s->req);
    }
    double until = xu_now() + 0.05;
    int pending = 1;
    while (pending && xu_now() < until) {
        xu_progress(be);
        pending = 0;
        for (int i = 0; i < total; i++) {
            xu_slot_t *s = i < x->nslots ? &x->slots[i] : &x->tr_slots[i - x->nslots];
            if (!xu_slot_idle(be, s, NULL, NULL))
                pending = 1;
        }
    }
    x->kept = 0;
    for (int i = 0; i < total; i++) {
        xu_slot_t *s = i < x->nslots ? &x->slots[i] : &x->tr_slots[i - x->nslots];
        x->kept += s->busy;
    }
    if (x->kept)
        XM_INFO("rank %d: plan %d keeps %d UCX operation(s) after the failure (plan memory only)",
                x->rank, x->plan_id, x->kept);
}

static void fail(xu_request_t *r, xmesh_result_t code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void fail(xu_request_t *r, xmesh_result_t code, const char *fmt, ...)
{
    xu_exec_t *x = r->plan->exec;
    if (r->result == XMESH_SUCCESS) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->msg, sizeof r->msg, fmt, ap);
        va_end(ap);
        r->result = code;
    }
    xu_ctx_t *be = r->plan->ctx->be;
    /* Peers of unfinished steps may never take what is queued for them:
     * their endpoints are closed without a flush (ctx.c). */
    for (int i = 0; i < x->prog.nsteps; i++) {
        const xm_pstep_t *s = &x->prog.steps[i];
        if (x->srt[i].done)
            continue;
        if (s->prev >= 0)
            __atomic_store_n(&be->peers[s->prev].suspect, 1, __ATOMIC_RELAXED);
        if (s->next >= 0)
            __atomic_store_n(&be->peers[s->next].suspect, 1, __ATOMIC_RELAXED);
    }
    cancel_all(be, x);
    x->broken = 1;
    r->phase = 2;
}

static void staged(xu_exec_t *x, int64_t bytes)
{
    __atomic_fetch_add(x->staged, bytes, __ATOMIC_RELAXED);
}

/* Chunk c of step s through its ops; the receive (if any) has completed.
 * The blocks are the step's tensor's, or (a packed step of a plan of many)
 * the pieces' tensors': the per-op work over them is the core's
 * (xm_step_block_op, as the MPI runner); block dtypes are the step's.
 * Every chunk goes through staging (no zero copy over UCX). Returns a UCX
 * status (UCS_OK). */
static ucs_status_t compute_chunk(xu_ctx_t *be, xu_exec_t *x, const xm_pstep_t *s,
                                  const xu_stepx_t *sx, xu_step_rt_t *rt, int64_t c,
                                  xu_slot_t *sendslot)
{
    int64_t a, cnt;
    xm_pstep_chunk(s, c, &a, &cnt);
    int slot = (int)(c % x->window);
    size_t des = xmesh_dtype_size(s->ddt), bs = s->stage_es;
    int packed = s->npieces > 0;
    char *dst = packed ? NULL : x->dsts[s->tensor];
    char *buf = sx->stage_off >= 0 ? x->stage + sx->stage_off + (int64_t)slot * s->ce * bs : NULL;
    for (int i = 0; i < s->nops; i++) {
        const xm_pop_t *o = &s->ops[i];
        switch (o->kind) {
        case XM_POP_RECV:
            break;
        case XM_POP_PACK:
            xm_step_block_op(&x->prog, x->srcs, x->dsts, s, o, buf, a, cnt);
            staged(x, cnt * (int64_t)xmesh_dtype_size(o->dt));
            break;
        case XM_POP_TO_ACC:
        case XM_POP_ADD_ACC:
            xm_step_block_op(&x->prog, x->srcs, x->dsts, s, o, buf, a, cnt);
            staged(x, cnt * (int64_t)xmesh_dtype_size(xm_dtype_acc(s->sdt)));
            break;
        case XM_POP_TO_NATIVE:
            xm_convert((xmesh_dtype_t)o->dt, buf, xm_dtype_acc(s->sdt), buf, cnt);
            break;
        case XM_POP_UNPACK: {
            /* XMESH_CHECK sums the values as they came off the wire (as the
             * MPI runner): the received buffer when the unpack converts or
             * the step is packed (its chunk spans several blocks), else the
             * written block. */
            int conv = o->dt != s->ddt || packed, ck = x->check && s->ck_verify;
            if (ck && x->corrupt && !x->corrupted) { /* test hook: damage the received bytes */
                buf[0] ^= 0x40;
                x->corrupted = 1;
            }
            if (ck && conv)
                x->ck[sx->ck_off + c] =
                    xm_geom_hash(NULL, buf, 1, 0, cnt * (int64_t)xmesh_dtype_size(o->dt));
            xm_step_block_op(&x->prog, x->srcs, x->dsts, s, o, buf, a, cnt);
            staged(x, cnt * (int64_t)xmesh_dtype_size(o->dt));
            if (ck && !conv)
                x->ck[sx->ck_off + c] = xm_geom_hash(&s->dg, dst, des, a, cnt);
            break;
        }
        case XM_POP_COPY: {
            double t0 = x->trace ? xu_now() - x->t0 : 0;
            xm_step_block_op(&x->prog, x->srcs, x->dsts, s, o, NULL, a, cnt);
            staged(x, cnt * (int64_t)des);
            if (x->trace)
                trace_add(x, 3, s->task, x->rank, c, cnt * (int64_t)des, t0, xu_now() - x->t0);
            break;
        }
        case XM_POP_SEND: {
            size_t sbytes = (size_t)cnt * xmesh_dtype_size(s->out_dt);
            if (x->check && s->ck_origin)
                x->ck[sx->ck_off + c] = xm_geom_hash(NULL, buf, 1, 0, (int64_t)sbytes);
            rt->t_send[slot] = x->trace ? xu_now() - x->t0 : 0;
            return xu_send(be, s->next, s->rail_out, buf, sbytes,
                           XU_TAG(x->tag, s->hop_out, c % XU_CHUNK_MOD), sx->sync, sendslot);
        }
        default:
            break;
        }
    }
    return UCS_OK;
}

static ucs_status_t post_recv(xu_ctx_t *be, xu_exec_t *x, const xm_pstep_t *s, xu_step_rt_t *rt,
                              int64_t c, xu_slot_t *slot_p)
{
    const xu_stepx_t *sx = &x->sx[s - x->prog.steps];
    int64_t a, cnt;
    xm_pstep_chunk(s, c, &a, &cnt);
    int slot = (int)(c % x->window);
    void *buf = x->stage + sx->stage_off + (int64_t)slot * s->ce * (int64_t)s->stage_es;
    rt->t_recv[slot] = x->trace ? xu_now() - x->t0 : 0;
    return xu_recv(be, s->rail_in, buf, (size_t)cnt * xmesh_dtype_size(s->in_dt),
                   XU_TAG(x->tag, s->hop_in, c % XU_CHUNK_MOD), slot_p);
}

/* The peer's endpoint broke (error handler) or an operation with it failed. */
static int peer_dead(xu_ctx_t *be, int q)
{
    return q >= 0 && __atomic_load_n(&be->peers[q].failed, __ATOMIC_ACQUIRE);
}

/* XMESH_CHECK (as lib/mpi/exec.c): after its last chunk the origin of a
 * chain sends the per-chunk sums of the final values; every receiver
 * compares them with the sums of what it wrote and passes the origin's on.
 * Returns 1 if it moved, 0 if not, -1 after failing r. */
static int check_advance(xu_request_t *r, xu_ctx_t *be, xu_exec_t *x, const xm_pstep_t *s,
                         const xu_stepx_t *sx, xu_step_rt_t *rt, xu_slot_t *sl)
{
    size_t bytes = (size_t)s->nchunks * 8;
    uint64_t *own = sx->ck_off >= 0 ? x->ck + sx->ck_off : NULL,
             *in = own ? own + s->nchunks : NULL;
    int verify = s->ck_verify, origin = s->ck_origin && s->next >= 0;
    uint64_t tin = XU_TAG(x->tag, s->hop_in, XU_CHUNK_MOD),
             tout = XU_TAG(x->tag, s->hop_out, XU_CHUNK_MOD);
    ucs_status_t st = UCS_OK, e = UCS_OK;
    if (!verify && !origin) {
        rt->ck_state = 3;
        return 0;
    }
    xu_slot_t *rs = &sl[2 * x->window], *ss = &sl[2 * x->window + 1];
    if (rt->ck_state == 0) {
        if (verify) {
            if ((st = xu_recv(be, s->rail_in, in, bytes, tin, rs)) != UCS_OK)
                goto out_ucx;
            rt->ck_state = 1;
            return 1;
        }
        if (rt->computed < s->nchunks) /* after the last chunk's send */
            return 0;
        if ((st = xu_send(be, s->next, s->rail_out, own, bytes, tout, 0, ss)) != UCS_OK)
            goto out_ucx;
        rt->ck_state = 2;
        return 1;
    }
    if (rt->ck_state == 1) {
        if (rt->computed < s->nchunks || !xu_slot_idle(be, rs, &e, NULL))
            return 0;
        if ((st = e) != UCS_OK)
            goto out_ucx;
        for (int64_t c = 0; c < s->nchunks; c++)
            if (in[c] != own[c]) {
                int64_t a, cnt;
                xm_pstep_chunk(s, c, &a, &cnt);
                /* Global coordinates of the chunk's first element (the
                 * tensor's, for plans of many). */
                char at[160];
                xm_step_where(&x->prog, &r->plan->ts, r->plan->ntensors, s, a, at, sizeof at);
                /* The ranks downstream got the same bytes: pass the sums on
                 * so that they report it too. */
                if (s->next >= 0)
                    xu_send(be, s->next, s->rail_out, in, bytes, tout, 0, ss);
                fail(r, XMESH_ERR_BACKEND,
                     "rank %d: XMESH_CHECK: data of task %d received from rank %d is corrupt in "
                     "chunk %lld of %lld: %lld elements starting at global index (%s) differ "
                     "from what the sending chain produced",
                     x->rank, s->task, s->prev, (long long)c, (long long)s->nchunks, (long long)cnt,
                     at);
                return -1;
            }
        if (s->next >= 0) {
            if ((st = xu_send(be, s->next, s->rail_out, in, bytes, tout, 0, ss)) != UCS_OK)
                goto out_ucx;
            rt->ck_state = 2;
        } else {
            rt->ck_state = 3;
        }
        return 1;
    }
    if (!xu_slot_idle(be, ss, &e, NULL))
        return 0;
    if ((st = e) != UCS_OK)
        goto out_ucx;
    rt->ck_state = 3;
    return 1;
out_ucx:
    fail(r, XMESH_ERR_REMOTE, "rank %d: XMESH_CHECK: checksum message of task %d failed (UCX: %s)",
         x->rank, s->task, ucs_status_string(st));
    return -1;
}

static int step_advance(xu_request_t *r, xu_ctx_t *be, xu_exec_t *x, int si)
{
    const xm_pstep_t *s = &x->prog.steps[si];
    const xu_stepx_t *sx = &x->sx[si];
    xu_step_rt_t *rt = &x->srt[si];
    if (rt->done)
        return 0;
    int moved = 0;
    ucs_status_t st;
    if (!rt->started) {
        if (s->after >= 0 && !x->srt[s->after].done)
            return 0;
        rt->started = 1;
        rt->t_start = xu_now();
        moved = 1;
    }
    xu_slot_t *sl = sx->slot_off >= 0 ? x->slots + sx->slot_off : NULL;
    if (s->prev >= 0)
        while (rt->posted < s->nchunks && rt->posted - rt->completed < x->window) {
            int64_t c = rt->posted;
            if ((st = post_recv(be, x, s, rt, c, &sl[c % x->window])) != UCS_OK) {
                fail(r, XMESH_ERR_BACKEND,
                     "rank %d: receive of chunk %lld of task %d from rank %d failed (UCX: %s)",
                     x->rank, (long long)c, s->task, s->prev, ucs_status_string(st));
                return -1;
            }
            rt->posted++;
            moved = 1;
        }
    while (rt->computed < s->nchunks) {
        int64_t c = rt->computed;
        int slot = (int)(c % x->window);
        if (s->prev >= 0) {
            ucs_status_t e = UCS_OK;
            size_t len = 0;
            if (c >= rt->posted || !xu_slot_idle(be, &sl[slot], &e, &len))
                break;
            int64_t a, cnt;
            xm_pstep_chunk(s, c, &a, &cnt);
            size_t want = (size_t)cnt * xmesh_dtype_size(s->in_dt);
            if (e != UCS_OK || len != want) {
                fail(r, e != UCS_OK ? XMESH_ERR_REMOTE : XMESH_ERR_INTERNAL,
                     "rank %d: chunk %lld of task %d from rank %d: %s%s (%zu of %zu bytes)",
                     x->rank, (long long)c, s->task, s->prev,
                     e != UCS_OK ? "receive failed: " : "wrong size",
                     e != UCS_OK ? ucs_status_string(e) : "", len, want);
                return -1;
            }
            if (x->trace)
                trace_add(x, 2, s->task, s->prev, c, (int64_t)want, rt->t_recv[slot],
                          xu_now() - x->t0);
        }
        int ahead = sx->hold && rt->completed == 0 ? 1 : sx->ahead;
        if (s->next >= 0 && c - rt->completed >= ahead)
            break;
        if ((st = compute_chunk(be, x, s, sx, rt, c, sl ? &sl[x->window + slot] : NULL)) !=
            UCS_OK) {
            fail(r, XMESH_ERR_REMOTE,
                 "rank %d: send of chunk %lld of task %d to rank %d failed (UCX: %s)", x->rank,
                 (long long)c, s->task, s->next, ucs_status_string(st));
            return -1;
        }
        rt->computed++;
        moved = 1;
    }
    while (rt->completed < rt->computed) {
        int64_t c = rt->completed;
        int slot = (int)(c % x->window);
        if (s->next >= 0) {
            ucs_status_t e = UCS_OK;
            if (!xu_slot_idle(be, &sl[x->window + slot], &e, NULL))
                break;
            if (e != UCS_OK) {
                fail(r, XMESH_ERR_REMOTE,
                     "rank %d: send of chunk %lld of task %d to rank %d failed (UCX: %s): the "
                     "peer failed or the network broke",
                     x->rank, (long long)c, s->task, s->next, ucs_status_string(e));
                return -1;
            }
            if (x->trace) {
                int64_t a, cnt;
                xm_pstep_chunk(s, c, &a, &cnt);
                trace_add(x, 1, s->task, s->next, c, cnt * (int64_t)xmesh_dtype_size(s->out_dt),
                          rt->t_send[slot], xu_now() - x->t0);
            }
        }
        rt->completed++;
        moved = 1;
    }
    if (x->check && rt->ck_state < 3) {
        int m = check_advance(r, be, x, s, sx, rt, sl);
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

static void describe_wait(xu_exec_t *x, char *buf, size_t len)
{
    for (int i = x->tfirst; i < x->prog.ntasks; i++) {
        if (x->tstate[i] != 1)
            continue;
        const xm_ptask_t *t = &x->prog.tasks[i];
        for (int k = 0; k < t->nsteps; k++) {
            const xm_pstep_t *s = &x->prog.steps[t->first_step + k];
            const xu_step_rt_t *rt = &x->srt[t->first_step + k];
            if (rt->done || !rt->started)
                continue;
            if (rt->completed == s->nchunks && x->check && rt->ck_state != 3) {
                if (rt->ck_state == 2)
                    snprintf(buf, len,
                             "waiting for rank %d to receive the XMESH_CHECK sums of task %d",
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

/* A peer this rank waits on whose endpoint UCX declared failed: -1 none. */
static int dead_peer_of_active(xu_ctx_t *be, xu_exec_t *x)
{
    for (int i = x->tfirst; i < x->prog.ntasks; i++) {
        if (x->tstate[i] != 1)
            continue;
        const xm_ptask_t *t = &x->prog.tasks[i];
        for (int k = 0; k < t->nsteps; k++) {
            const xm_pstep_t *s = &x->prog.steps[t->first_step + k];
            if (x->srt[t->first_step + k].done)
                continue;
            if (peer_dead(be, s->prev))
                return s->prev;
            if (peer_dead(be, s->next))
                return s->next;
        }
    }
    return -1;
}

static int exec_advance(xu_request_t *r)
{
    xu_exec_t *x = r->plan->exec;
    xu_ctx_t *be = r->plan->ctx->be;
    int moved = 0;
    if (r->phase == 0) {
        /* Tasks start in global order. A task that crosses a NIC waits for
         * every earlier unfinished task holding one of its NIC directions on
         * this rank on the same rail (x->nicm: a rank sends and receives on
         * every rail's worker, so tasks on different rails run together, as
         * the model runs different NICs); a task inside the host (no NIC) waits for every earlier
         * unfinished task inside the host holding one of its local links.
         * Unlike the MPI runner, a NIC task does not wait for an earlier
         * task that merely shares a local link with it: with several NICs
         * per host the chains of different NICs meet on the receiving
         * host's local links, and waiting there ran the NICs one after the
         * other (5 hosts x 4 ranks, 2 NICs at 100 Mbit/s, case 1: 2.0x the
         * two-NIC bound, 1.05x without the wait). Staging and slots stay
         * safe: lane_pool (setup.c) gives a task the region of its lowest
         * class, a NIC direction and rail for NIC tasks and a local link of
         * its lane only for tasks without one, and tasks sharing a region
         * still never overlap. */
        const unsigned nic = XM_SLOT_SEND | XM_SLOT_RECV, loc = XM_SLOT_LSEND | XM_SLOT_LRECV;
        unsigned loc_blocked[16] = {0};
        uint32_t nic_blocked = 0; /* (direction, rail) pairs, as x->nicm */
        int lanes_full = 0;
        for (int i = x->tfirst; i < x->prog.ntasks; i++) {
            const xm_ptask_t *t = &x->prog.tasks[i];
            int has_nic = (t->slots & nic) != 0;
            if (x->tstate[i] == 2) {
                if (i == x->tfirst)
                    x->tfirst++;
                continue;
            }
            if (x->tstate[i] == 0) {
                unsigned *lb = &loc_blocked[x->lane[i]];
                if (has_nic ? x->nicm[i] & nic_blocked : t->slots & loc & *lb) {
                    nic_blocked |= x->nicm[i];
                    if (!has_nic && (*lb |= t->slots & loc) == loc)
                        lanes_full |= 1 << x->lane[i];
                    if ((nic_blocked & x->nicm_all) == x->nicm_all &&
                        lanes_full == (1 << x->nlanes) - 1)
                        break;
                    continue;
                }
                x->tstate[i] = 1;
                x->srt[t->first_step].t_start = xu_now();
                moved = 1;
            }
            int all = 1;
            for (int k = 0; k < t->nsteps; k++) {
                int m = step_advance(r, be, x, t->first_step + k);
                if (m < 0)
                    return 1;
                moved |= m;
                all &= x->srt[t->first_step + k].done;
            }
            if (all) {
                x->tstate[i] = 2;
                if (x->trace)
                    trace_add(x, 0, t->task, -1, -1, 0, x->srt[t->first_step].t_start - x->t0,
                              xu_now() - x->t0);
                if (i == x->tfirst)
                    x->tfirst++;
                moved = 1;
            } else {
                nic_blocked |= x->nicm[i];
                if (!has_nic && (loc_blocked[x->lane[i]] |= t->slots & loc) == loc)
                    lanes_full |= 1 << x->lane[i];
            }
        }
        if (x->tfirst == x->prog.ntasks) {
            r->phase = 1;
            moved = 1;
        } else {
            int q = dead_peer_of_active(be, x);
            if (q >= 0) {
                char what[256];
                describe_wait(x, what, sizeof what);
                fail(r, XMESH_ERR_REMOTE, "rank %d: peer rank %d failed (UCX: %s), %s", x->rank, q,
                     ucs_status_string(be->peers[q].fail_status), what);
                return 1;
            }
        }
    }
    if (r->phase == 1) {
        int t = x->trace ? trace_progress(r) : 1;
        if (t < 0) {
            XM_WARN("rank %d: %s; tracing disabled for plan %d", x->rank, r->msg, x->plan_id);
            r->msg[0] = '\0';
            cancel_all(be, x);
            if (x->kept)
                x->broken = 1;
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
        double now = xu_now();
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
    if (r->phase < 2 && r->deadline > 0 && xu_now() > r->deadline) {
        char what[256];
        describe_wait(x, what, sizeof what);
        fail(r, XMESH_ERR_TIMEOUT, "rank %d: reshard timed out after %.3g s, %s", x->rank,
             r->plan->timeout_s, what);
        return 1;
    }
    return moved;
}
