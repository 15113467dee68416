/* Plan setup of the MPI executor: make the schedule identical on every rank,
 * have the core compile this rank's program (lib/plan/xm_program.h), then
 * fix what MPI adds to it once: tags, staging and request slots. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xm_mpi.h"

static int tag_of(int tag_ub, int hop)
{
    return XM_TAG_BASE + hop % (tag_ub - XM_TAG_BASE);
}

static int geom_contiguous(const xm_geom_t *g)
{
    return g->n == 1 && g->stride[0] == 1;
}

/* Staging bytes a step needs (XMESH_ZERO_COPY sends whole contiguous boxes
 * straight from the caller's blocks, and receives into them, when the wire
 * carries the block's own dtype). */
static int64_t stage_need(const xm_exec_t *x, const xm_pstep_t *s)
{
    int64_t need = (int64_t)s->stage_es;
    int zc = x->zero_copy && !s->npieces; /* a packed step always stages */
    switch (s->mode) {
    case XM_MODE_SRC:
        if (zc && geom_contiguous(&s->sg) && s->out_dt == s->sdt)
            need = 0;
        break;
    case XM_MODE_RECV:
        if (zc && geom_contiguous(&s->dg) && s->in_dt == s->ddt)
            need = 0;
        break;
    case XM_MODE_FROM_DST:
        if (zc && geom_contiguous(&s->dg) && s->out_dt == s->ddt)
            need = 0;
        break;
    default:
        break;
    }
    return need * s->ce * x->window;
}

/* Staging and request slots, pooled by the core (xm_program_pool). */
static xmesh_result_t pools(xm_exec_t *x)
{
    int n = x->prog.nsteps;
    int64_t *need = malloc(sizeof(int64_t) * (n + 1)), *off = malloc(sizeof(int64_t) * (n + 1));
    int64_t nreqs = 0;
    xmesh_result_t r = XMESH_SUCCESS;
    if (!need || !off) {
        r = XM_ERR(XMESH_ERR_NO_MEMORY, "plan setup: out of memory for %d steps", n);
        goto out_free;
    }
    for (int i = 0; i < n; i++)
        need[i] = stage_need(x, &x->prog.steps[i]);
    if ((r = xm_program_pool(&x->prog, need, 64, off, &x->stage_bytes)))
        goto out_free;
    for (int i = 0; i < n; i++) {
        x->sx[i].stage_off = off[i];
        const xm_pstep_t *s = &x->prog.steps[i];
        need[i] = s->prev >= 0 || s->next >= 0 ? XM_STEP_REQS(x->window) : 0;
    }
    if ((r = xm_program_pool(&x->prog, need, 1, off, &nreqs)))
        goto out_free;
    for (int i = 0; i < n; i++)
        x->sx[i].req_off = (int)off[i];
    x->nreqs = (int)nreqs;
out_free:
    free(need);
    free(off);
    return r;
}

/* Local part of plan setup: the rank's program (compiled by the core from
 * the plan's chains), then what MPI adds: tags, staging, request slots,
 * checksum pools. On error x is left for exec_free (whatever was allocated
 * is recorded in x). */
static xmesh_result_t compile(xmesh_plan_t p, xm_exec_t *x)
{
    int flag = 0, *ub = NULL;
    MPI_Comm_get_attr(x->comm, MPI_TAG_UB, &ub, &flag);
    int tag_ub = flag && ub ? *ub : 32767;
    xm_prog_in_t in = {.ts = &p->ts,
                       .sched = &p->sched,
                       .hosts = &p->ctx->hosts,
                       .src = &p->src,
                       .dst = &p->dst,
                       .strategy = p->strategy,
                       .dtype = p->dtype,
                       .dst_dtype = p->dst_dtype,
                       .chunk_bytes = p->chunk_bytes,
                       .ntensors = p->ntensors,
                       .srcs = p->srcs,
                       .dsts = p->dsts,
                       .dtypes = p->dtypes,
                       .dst_dtypes = p->dst_dtypes};
    xm_chains_t ch;
    xmesh_result_t r = xm_chains_build(&in, &ch);
    if (r)
        return r;
    r = xm_program_build(&in, &ch, x->rank, &x->prog);
    xm_chains_free(&ch);
    if (r)
        return r;
    int64_t ce = x->prog.chunk_elems;
    /* the window counts bytes on the wire (the task set's element size) */
    int64_t wes = p->ts.elem_size ? (int64_t)p->ts.elem_size : (int64_t)x->es;
    int64_t w = XM_WINDOW_BYTES / (ce * wes);
    x->window = (int)(w < XM_WINDOW_MIN ? XM_WINDOW_MIN : w > XM_WINDOW_MAX ? XM_WINDOW_MAX : w);
    /* Sends in flight per chain link (default 2): the wire never waits for
     * a progress round between two chunks (the progress thread may be
     * starved by the caller's compute), while the next hop is delayed by
     * only send_ahead chunks, not a whole window (several sends to one peer
     * share the wire and finish together). The model charges the same fill
     * per hop (xm_task_timing). Receives still run a window ahead. */
    int64_t ahead = p->cluster.send_ahead; /* XMESH_SEND_AHEAD, agreed and modelled */
    x->zero_copy = xm_param_i64("XMESH_ZERO_COPY") != 0;
    int hold_late = xm_param_i64("XMESH_HOLD_LATE") != 0;
    x->sync_send = p->cluster.sync_send; /* XMESH_SYNC_SEND, agreed and modelled */
    x->send_ahead = (int)(ahead < 1 ? 1 : ahead > x->window ? x->window : ahead);
    int64_t fwd = p->cluster.forward_ahead; /* XMESH_FORWARD_AHEAD, agreed and modelled */
    x->forward_ahead = (int)(fwd < 1 ? 1 : fwd > x->window ? x->window : fwd);
    x->srcs = calloc((size_t)p->ntensors, sizeof *x->srcs);
    x->dsts = calloc((size_t)p->ntensors, sizeof *x->dsts);
    if (!x->srcs || !x->dsts)
        return XM_ERR(XMESH_ERR_NO_MEMORY, "plan setup: out of memory for %d tensors", p->ntensors);
    if (!(x->sx = calloc(x->prog.nsteps + 1, sizeof *x->sx)))
        return XM_ERR(XMESH_ERR_NO_MEMORY, "plan setup: out of memory for %d steps",
                      x->prog.nsteps);
    for (int i = 0; i < x->prog.nsteps; i++) {
        const xm_pstep_t *s = &x->prog.steps[i];
        x->sx[i].tag_in = s->hop_in >= 0 ? tag_of(tag_ub, s->hop_in) : -1;
        x->sx[i].tag_out = s->hop_out >= 0 ? tag_of(tag_ub, s->hop_out) : -1;
        /* The send-ahead limit paces a NIC that several flows share; a hop
         * inside the host (shared memory, tens of times a NIC) completes its
         * sends in order, so it keeps the whole window in flight rather
         * than waiting for a progress round every send_ahead chunks (8
         * ranks on one host: 4x1 -> 1x4 of 128 MiB 0.042 s -> 0.031 s). The
         * model needs no change: in-order completion means no shared-wire
         * fill on such a hop. */
        const xm_hostmap_t *hm = &p->ctx->hosts;
        int me = hm->host_of[x->rank];
        int local = s->next >= 0 && hm->host_of[s->next] == me;
        /* A NIC hop with a NIC hop upstream in its chain (a forwarder in
         * the middle of a chain across hosts) gets its chunks one wire time
         * apart, paced by that NIC: XMESH_FORWARD_AHEAD (default 1) sends in
         * flight keep its wire as busy as its input allows, and the next
         * host gets each chunk one wire time after it arrived here instead
         * of send_ahead (two chunks sharing the wire). The chain's head keeps
         * XMESH_SEND_AHEAD. Measured (docs/EXECUTOR.md): 1-to-m 4x2 0.521 ->
         * 0.491 s, nothing slower. The model charges the same (xm_hop_fill). */
        x->sx[i].ahead = local ? x->window : s->nic_paced ? x->forward_ahead : x->send_ahead;
        /* Synchronous sends (XMESH_SYNC_SEND) where a chunk is big enough to
         * matter: below XM_SYNC_MIN_BYTES a whole receive window of chunks is
         * less than one rendezvous chunk, and a plain send of it completes
         * on its own (a receiver that failed does not hold its sender). */
        x->sx[i].sync = !local && s->next >= 0 && x->sync_send &&
                        s->ce * (int64_t)xmesh_dtype_size(s->out_dt) >= XM_SYNC_MIN_BYTES;
        /* A peer that admits this task only after an earlier one (late_next)
         * gets one synchronous chunk, and the rest once it has matched that
         * chunk: sent ahead, they would leave at once (below the eager
         * limit) and share a NIC the schedule gave to the earlier task. */
        x->sx[i].hold = x->sx[i].sync && s->late_next && hold_late;
    }
    for (int i = 0; i < x->prog.nsteps; i++)
        x->sx[i].ck_off = -1;
    if ((r = pools(x)))
        return r;
    if (x->stage_bytes && !(x->stage = aligned_alloc(64, (size_t)x->stage_bytes)))
        return XM_ERR(XMESH_ERR_NO_MEMORY, "plan setup: out of memory for %lld staging bytes",
                      (long long)x->stage_bytes);
    if (x->check) {
        int64_t nck = 0;
        for (int i = 0; i < x->prog.nsteps; i++) {
            const xm_pstep_t *s = &x->prog.steps[i];
            if (s->ck_origin || s->ck_verify) {
                if (s->nchunks > (1 << 26))
                    return XM_ERR(XMESH_ERR_UNSUPPORTED,
                                  "XMESH_CHECK: task %d has %lld chunks (more than 2^26): raise "
                                  "chunk_bytes (now %lld)",
                                  s->task, (long long)s->nchunks, (long long)p->chunk_bytes);
                x->sx[i].ck_off = nck;
                nck += 2 * s->nchunks;
            }
        }
        if (!(x->ck = calloc(nck + 1, sizeof(uint64_t))))
            return XM_ERR(XMESH_ERR_NO_MEMORY, "plan setup: out of memory for %lld checksums",
                          (long long)nck);
    }
    x->reqs = malloc(sizeof(MPI_Request) * (x->nreqs + 1));
    x->req_idx = malloc(sizeof(int) * (x->nreqs + 1));
    x->srt = calloc(x->prog.nsteps + 1, sizeof *x->srt);
    x->tstate = calloc(x->prog.ntasks + 1, 1);
    if (!x->reqs || !x->req_idx || !x->srt || !x->tstate)
        return XM_ERR(XMESH_ERR_NO_MEMORY, "plan setup: out of memory");
    for (int i = 0; i < x->nreqs; i++)
        x->reqs[i] = MPI_REQUEST_NULL;
    XM_INFO("plan setup: rank %d: %d tasks, %d steps, %lld staging bytes, %d request slots",
            x->rank, x->prog.ntasks, x->prog.nsteps, (long long)x->stage_bytes, x->nreqs);
    return XMESH_SUCCESS;
}

/* Frees the executor state (x may be partial or NULL). Not collective in
 * practice: Open MPI frees a communicator locally. A pooled communicator
 * goes back to the pool, unless the plan failed (its slot is retired). */
static void exec_free(xm_mpi_ctx_t *be, xm_exec_t *x)
{
    if (!x)
        return;
    int fin = 0;
    MPI_Finalized(&fin);
    /* Requests kept after a failure: the finished ones are done with; the
     * rest are handed to MPI and the memory they reference (staging pool,
     * checksums: never the caller's blocks unless XMESH_ZERO_COPY=1) is
     * leaked on purpose, as MPI may still complete them. */
    for (int i = 0; x->kept && !fin && i < x->nreqs; i++)
        if (x->reqs[i] != MPI_REQUEST_NULL) {
            int done = 0;
            MPI_Test(&x->reqs[i], &done, MPI_STATUS_IGNORE);
            if (!done) {
                MPI_Request_free(&x->reqs[i]);
                x->leak_stage = 1;
            }
        }
    if (x->kept && fin)
        x->leak_stage = 1;
    if (x->pool_slot >= 0) {
        pthread_mutex_lock(&be->mu);
        if (x->broken) {
            if (!fin)
                MPI_Comm_free(&be->pool[x->pool_slot]);
            be->pool[x->pool_slot] = MPI_COMM_NULL;
            be->pool_state[x->pool_slot] = XM_POOL_DEAD;
        } else {
            be->pool_state[x->pool_slot] = XM_POOL_FREE;
        }
        pthread_mutex_unlock(&be->mu);
    } else if (x->comm != MPI_COMM_NULL && !fin) {
        MPI_Comm_free(&x->comm);
    }
    if (!x->leak_stage)
        free(x->stage);
    xm_program_free(&x->prog);
    free(x->srcs);
    free(x->dsts);
    free(x->sx);
    free(x->reqs);
    free(x->req_idx);
    free(x->srt);
    free(x->tstate);
    free(x->parts);
    free(x->ev);
    if (!x->leak_stage)
        free(x->ck);
    free(x->tr_reqs);
    free(x->tr_counts);
    free(x->tr_bufs);
    free(x);
}

/* Trace participants: every rank of either mesh; the lowest one writes. */
static xmesh_result_t setup_trace(xmesh_plan_t p, xm_exec_t *x, int trace_flag, const char *path)
{
    int n = p->ctx->size;
    char *in = calloc(n, 1);
    if (!in)
        return XM_ERR(XMESH_ERR_NO_MEMORY, "plan setup: out of memory");
    for (int k = 0; k < p->ntensors; k++) {
        for (int i = 0; i < p->srcs[k].mesh.ndev; i++)
            in[p->srcs[k].mesh.devs[i]] = 1;
        for (int i = 0; i < p->dsts[k].mesh.ndev; i++)
            in[p->dsts[k].mesh.devs[i]] = 1;
    }
    x->leader = -1;
    for (int i = 0; i < n; i++)
        if (in[i]) {
            if (x->leader < 0)
                x->leader = i;
            x->nparts++;
        }
    x->participant = in[x->rank];
    x->trace = trace_flag && x->participant;
    if (x->trace) {
        snprintf(x->trace_path, sizeof x->trace_path, "%s", path);
        x->parts = malloc(sizeof(int) * x->nparts);
        x->cap_ev = 1 << 16;
        x->ev = malloc(sizeof *x->ev * x->cap_ev);
        x->tr_reqs = malloc(sizeof(MPI_Request) * 2 * x->nparts);
        x->tr_counts = calloc(x->nparts, sizeof(int64_t));
        x->tr_bufs = calloc(x->nparts, sizeof(xm_trace_ev_t *));
        if (!x->parts || !x->ev || !x->tr_reqs || !x->tr_counts || !x->tr_bufs) {
            free(in);
            return XM_ERR(XMESH_ERR_NO_MEMORY, "plan setup: out of memory for the trace");
        }
        int k = 0;
        for (int i = 0; i < n; i++)
            if (in[i])
                x->parts[k++] = i;
    }
    free(in);
    return XMESH_SUCCESS;
}

/* ops->plan_setup: collective over the context. On error p->exec holds what
 * was built and api.c calls plan_teardown. */
xmesh_result_t xm_mpi_plan_setup(xmesh_plan_t p)
{
    xmesh_ctx_t ctx = p->ctx;
    xm_mpi_ctx_t *be = ctx->be;
    xmesh_result_t r = XMESH_SUCCESS;
    int rc;
    xm_exec_t *x = calloc(1, sizeof *x);
    if (!x)
        return XM_ERR(XMESH_ERR_NO_MEMORY, "plan setup: out of memory");
    x->comm = MPI_COMM_NULL;
    x->pool_slot = -1;
    x->staged = &be->staged_bytes;
    p->exec = x;
    double tm[6];
    tm[0] = xm_mpi_now();
    /* 1. Rank 0's decisions for everyone: time-budgeted schedulers may pick
     *    differently on each rank (xm_boot_share_schedule). */
    int flags[2] = {0, 0}; /* XMESH_TRACE set, XMESH_CHECK */
    if (ctx->rank == 0) {
        const char *tp = xm_param_str("XMESH_TRACE");
        flags[0] = tp && *tp;
        flags[1] = xm_param_i64("XMESH_CHECK") != 0;
    }
    xmesh_result_t local = xm_boot_share_schedule(be->comm, p, flags, 2);
    tm[1] = xm_mpi_now();
    int trace_flag = flags[0];
    x->check = flags[1];
    {
#ifdef XMESH_TEST_HOOKS /* test builds only (lib/CMakeLists.txt) */
        const char *cr = xm_param_str("XMESH_TEST_CORRUPT");
        x->corrupt = x->check && cr && *cr && atoi(cr) == ctx->rank;
#else
        x->corrupt = 0;
#endif
    }
    /* Rank 0's trace path too: the leader writes, whatever its environment. */
    char tpath[512] = "";
    if (ctx->rank == 0)
        snprintf(tpath, sizeof tpath, "%s", xm_param_str("XMESH_TRACE"));
    if (trace_flag && (rc = MPI_Bcast(tpath, sizeof tpath, MPI_CHAR, 0, be->comm)))
        return xm_mpi_err(rc, "MPI_Bcast(trace path)");
    tm[2] = xm_mpi_now();
    /* 2. Private communicator: a pooled one that mpi_agree found free on
     *    every rank, else a new duplicate (collective) that joins the pool
     *    at the same index everywhere (pools grow in plan-creation order). */
    pthread_mutex_lock(&be->mu);
    int slot = be->agreed_slot, grow = slot < 0 && be->npool < XM_COMM_POOL;
    be->agreed_slot = -1;
    if (slot >= 0) {
        x->comm = be->pool[slot];
        be->pool_state[slot] = XM_POOL_BUSY;
        x->pool_slot = slot;
    }
    pthread_mutex_unlock(&be->mu);
    if (slot < 0) {
        if ((rc = MPI_Comm_dup(be->comm, &x->comm))) {
            x->comm = MPI_COMM_NULL;
            return xm_mpi_err(rc, "MPI_Comm_dup(plan)");
        }
        if (grow) {
            pthread_mutex_lock(&be->mu);
            x->pool_slot = be->npool++;
            be->pool[x->pool_slot] = x->comm;
            be->pool_state[x->pool_slot] = XM_POOL_BUSY;
            pthread_mutex_unlock(&be->mu);
        }
    }
    MPI_Comm_set_errhandler(x->comm, MPI_ERRORS_RETURN);
    x->rank = ctx->rank;
    x->dtype = p->dtype;
    x->es = xmesh_dtype_size(p->dtype);
    x->acc_es = xm_dtype_acc_size(p->dtype);
    x->dst_dtype = p->dst_dtype;
    x->dst_es = xmesh_dtype_size(p->dst_dtype);
    tm[3] = xm_mpi_now();
    /* 3. This rank's steps. */
    if (!local)
        local = compile(p, x);
    if (!local)
        local = setup_trace(p, x, trace_flag, tpath);
    char saved[512] = "";
    if (local)
        snprintf(saved, sizeof saved, "%s", xmesh_last_error());
    tm[4] = xm_mpi_now();
    /* 4. Everyone learns whether anyone failed. */
    int bad = local ? ctx->size - ctx->rank : 0, worst = 0;
    if ((rc = MPI_Allreduce(&bad, &worst, 1, MPI_INT, MPI_MAX, x->comm)))
        return xm_mpi_err(rc, "MPI_Allreduce(plan setup)");
    if (local)
        return XM_ERR(local, "%s", saved);
    if (worst)
        return XM_ERR(XMESH_ERR_REMOTE, "rank %d failed to set up the plan (see its error)",
                      ctx->size - worst);
    /* 5. Common time origin for traces (only then: a barrier costs a round
     *    trip across hosts). */
    if (trace_flag)
        MPI_Barrier(x->comm);
    x->t0 = tm[5] = xm_mpi_now();
    XM_INFO("plan setup: rank %d: schedule bcast + rebuild %.2f ms, trace bcast %.2f ms, "
            "comm %s %.2f ms, compile %.2f ms, allreduce + barrier %.2f ms",
            ctx->rank, (tm[1] - tm[0]) * 1e3, (tm[2] - tm[1]) * 1e3,
            x->pool_slot >= 0 && slot >= 0 ? "reused" : "dup", (tm[3] - tm[2]) * 1e3,
            (tm[4] - tm[3]) * 1e3, (tm[5] - tm[4]) * 1e3);
    pthread_mutex_lock(&be->mu);
    x->plan_id = be->nplans_created++;
    pthread_mutex_unlock(&be->mu);
    return r;
}

/* ops->plan_teardown: no request of the plan may be in flight (api.c). */
void xm_mpi_plan_teardown(xmesh_plan_t p)
{
    exec_free(p->ctx->be, p->exec);
    p->exec = NULL;
}
