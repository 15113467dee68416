/* The UCX runner's plan setup and teardown (xm_ucx.h): the per-rank program compiled over the
 * bootstrap, staging pools per lane, the trace; exec.c runs what it builds. Apart from exec.c
 * (which needs nothing of it) to keep both files small. */
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

/* xm_program_pool with rails and lanes: a task with a NIC hop is given the
 * region of its lowest NIC direction and rail (x->nicm: sends before
 * receives, as there), a task without one the region of its lowest local
 * link in its lane (x->lane), so that tasks that may run together (other
 * rails, other lanes) never share staging or slots. With one NIC and one
 * lane this is xm_program_pool. */
static xmesh_result_t lane_pool(const xu_exec_t *x, const int64_t *need, int64_t align,
                                int64_t *off, int64_t *total)
{
    const xm_program_t *p = &x->prog;
    int nreg = 32 + 2 * x->nlanes;
    int64_t *size = calloc((size_t)nreg, sizeof(int64_t)), *base = calloc((size_t)nreg, 8);
    int *region = malloc(sizeof(int) * (p->nsteps + 1));
    if (!size || !base || !region) {
        free(size);
        free(base);
        free(region);
        return XM_ERR(XMESH_ERR_NO_MEMORY, "plan setup: out of memory for %d steps", p->nsteps);
    }
    for (int k = 0; k < p->ntasks; k++) {
        const xm_ptask_t *t = &p->tasks[k];
        int reg = x->nicm[k] ? __builtin_ctz(x->nicm[k]) : -1;
        for (int b = 2; b < XM_NSLOTS && reg < 0; b++)
            if (t->slots & (1u << b))
                reg = 32 + (b - 2) * x->nlanes + x->lane[k];
        int64_t o = 0;
        for (int i = t->first_step; i < t->first_step + t->nsteps; i++) {
            region[i] = reg;
            off[i] = -1;
            if (!need[i])
                continue;
            if (reg < 0) {
                free(size);
                free(base);
                free(region);
                return XM_ERR(XMESH_ERR_INTERNAL, "plan setup: task %d needs staging without a hop",
                              t->task);
            }
            off[i] = o;
            o += (need[i] + align - 1) / align * align;
        }
        if (reg >= 0 && o > size[reg])
            size[reg] = o;
    }
    *total = 0;
    for (int b = 0; b < nreg; b++) {
        base[b] = *total;
        *total += size[b];
    }
    for (int i = 0; i < p->nsteps; i++)
        if (off[i] >= 0)
            off[i] += base[region[i]];
    free(size);
    free(base);
    free(region);
    return XMESH_SUCCESS;
}

static xmesh_result_t pools(xu_exec_t *x)
{
    int n = x->prog.nsteps;
    int64_t *need = calloc((size_t)n + 1, sizeof(int64_t)),
            *off = calloc((size_t)n + 1, sizeof(int64_t));
    int64_t nslots = 0;
    xmesh_result_t r = XMESH_SUCCESS;
    if (!need || !off) {
        r = XM_ERR(XMESH_ERR_NO_MEMORY, "plan setup: out of memory for %d steps", n);
        goto out_free;
    }
    for (int i = 0; i < n; i++)
        need[i] = (int64_t)x->prog.steps[i].stage_es * x->prog.steps[i].ce * x->window;
    if ((r = lane_pool(x, need, 64, off, &x->stage_bytes)))
        goto out_free;
    for (int i = 0; i < n; i++) {
        x->sx[i].stage_off = off[i];
        const xm_pstep_t *s = &x->prog.steps[i];
        need[i] = s->prev >= 0 || s->next >= 0 ? XU_STEP_SLOTS(x->window) : 0;
    }
    if ((r = lane_pool(x, need, 1, off, &nslots)))
        goto out_free;
    for (int i = 0; i < n; i++)
        x->sx[i].slot_off = (int)off[i];
    x->nslots = (int)nslots;
out_free:
    free(need);
    free(off);
    return r;
}

static xmesh_result_t compile(xmesh_plan_t p, xu_exec_t *x)
{
    xm_prog_in_t in = {.ts = &p->ts,
                       .sched = &p->sched,
                       .hosts = &p->ctx->hosts,
                       .src = &p->src,
                       .dst = &p->dst,
                       .strategy = p->strategy,
                       .dtype = p->dtype,
                       .dst_dtype = p->dst_dtype,
                       .chunk_bytes = p->chunk_bytes,
                       .nics = p->cluster.nics_per_host,
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
    int nhops = ch.nhops;
    xm_chains_free(&ch);
    if (r)
        return r;
    if (nhops >= XU_TAG_TRACE_HOP)
        return XM_ERR(XMESH_ERR_UNSUPPORTED, "plan setup: %d chain links exceed the UCX tag space",
                      nhops);
    int64_t ce = x->prog.chunk_elems;
    int64_t wes = p->ts.elem_size ? (int64_t)p->ts.elem_size : (int64_t)x->es;
    int64_t w = XU_WINDOW_BYTES / (ce * wes);
    x->window = (int)(w < XU_WINDOW_MIN ? XU_WINDOW_MIN : w > XU_WINDOW_MAX ? XU_WINDOW_MAX : w);
    /* The MPI runner's sends in flight per link (XMESH_SEND_AHEAD /
     * XMESH_FORWARD_AHEAD, agreed and modelled; a link inside the host keeps
     * the whole window) and its synchronous chunks between hosts
     * (XMESH_SYNC_SEND; XMESH_HOLD_LATE). */
    int64_t ahead = p->cluster.send_ahead, fwd = p->cluster.forward_ahead;
    x->send_ahead = (int)(ahead < 1 ? 1 : ahead > x->window ? x->window : ahead);
    x->forward_ahead = (int)(fwd < 1 ? 1 : fwd > x->window ? x->window : fwd);
    int hold_late = xm_param_i64("XMESH_HOLD_LATE") != 0;
    x->srcs = calloc((size_t)p->ntensors, sizeof *x->srcs);
    x->dsts = calloc((size_t)p->ntensors, sizeof *x->dsts);
    if (!x->srcs || !x->dsts)
        return XM_ERR(XMESH_ERR_NO_MEMORY, "plan setup: out of memory for %d tensors", p->ntensors);
    if (!(x->sx = calloc(x->prog.nsteps + 1, sizeof *x->sx)))
        return XM_ERR(XMESH_ERR_NO_MEMORY, "plan setup: out of memory for %d steps",
                      x->prog.nsteps);
    const xm_hostmap_t *hm = &p->ctx->hosts;
    int me = hm->host_of[x->rank];
    for (int i = 0; i < x->prog.nsteps; i++) {
        const xm_pstep_t *s = &x->prog.steps[i];
        int local = s->next >= 0 && hm->host_of[s->next] == me;
        x->sx[i].ahead = local ? x->window : s->nic_paced ? x->forward_ahead : x->send_ahead;
        x->sx[i].sync = !local && s->next >= 0 && p->cluster.sync_send &&
                        s->ce * (int64_t)xmesh_dtype_size(s->out_dt) >= XU_SYNC_MIN_BYTES;
        x->sx[i].hold = x->sx[i].sync && s->late_next && hold_late;
    }
    /* Lanes of the tasks without a NIC hop on this rank (admission in
     * exec_advance): one per NIC of the plan's model, round robin by their
     * lowest local link, so that as many chains as there are NICs can pass
     * through a rank's local links at once. One NIC: one lane, the MPI
     * runner's rule. */
    x->nlanes = p->cluster.nics_per_host < 1    ? 1
                : p->cluster.nics_per_host > 16 ? 16
                                                : p->cluster.nics_per_host;
    x->lane = calloc((size_t)x->prog.ntasks + 1, 1);
    x->nicm = calloc((size_t)x->prog.ntasks + 1, sizeof *x->nicm);
    if (!x->lane || !x->nicm)
        return XM_ERR(XMESH_ERR_NO_MEMORY, "plan setup: out of memory");
    /* The NIC directions of each task on this rank by rail (admission and
     * staging regions): its hops between hosts, on their rails. */
    x->nicm_all = 0;
    for (int k = 0; k < x->prog.ntasks; k++) {
        const xm_ptask_t *t = &x->prog.tasks[k];
        for (int i = t->first_step; i < t->first_step + t->nsteps; i++) {
            const xm_pstep_t *s = &x->prog.steps[i];
            if (s->next >= 0 && hm->host_of[s->next] != me)
                x->nicm[k] |= 1u << (s->rail_out > 0 ? s->rail_out % 16 : 0);
            if (s->prev >= 0 && hm->host_of[s->prev] != me)
                x->nicm[k] |= 1u << (16 + (s->rail_in > 0 ? s->rail_in % 16 : 0));
        }
        x->nicm_all |= x->nicm[k];
    }
    int next_lane[XM_NSLOTS] = {0};
    for (int k = 0; k < x->prog.ntasks; k++) {
        unsigned sl = x->prog.tasks[k].slots;
        if (sl & (XM_SLOT_SEND | XM_SLOT_RECV))
            continue;
        int b = sl & XM_SLOT_LSEND ? 2 : 3;
        x->lane[k] = (unsigned char)(next_lane[b]++ % x->nlanes);
    }
    if ((r = pools(x)))
        return r;
    int64_t nck = 0;
    for (int i = 0; i < x->prog.nsteps; i++) {
        const xm_pstep_t *s = &x->prog.steps[i];
        x->sx[i].ck_off = -1;
        if (x->check && (s->ck_origin || s->ck_verify)) {
            if (s->nchunks > (1 << 26))
                return XM_ERR(XMESH_ERR_UNSUPPORTED,
                              "XMESH_CHECK: task %d has %lld chunks (more than 2^26): raise "
                              "chunk_bytes (now %lld)",
                              s->task, (long long)s->nchunks, (long long)p->chunk_bytes);
            x->sx[i].ck_off = nck;
            nck += 2 * s->nchunks;
        }
    }
    /* One block: staging, slots, sums (UCX may write all three after a failure). */
    size_t stage_sz = ((size_t)x->stage_bytes + 63) & ~(size_t)63;
    size_t slots_sz = (sizeof(xu_slot_t) * ((size_t)x->nslots + 1) + 63) & ~(size_t)63;
    size_t total = stage_sz + slots_sz + (((size_t)nck + 1) * 8 + 63) / 64 * 64;
    x->mem = aligned_alloc(64, total); /* a multiple of the alignment, as C11 wants */
    if (!x->mem)
        return XM_ERR(XMESH_ERR_NO_MEMORY, "plan setup: out of memory for %lld staging bytes",
                      (long long)x->stage_bytes);
    x->stage = x->mem;
    x->slots = (xu_slot_t *)((char *)x->mem + stage_sz);
    memset(x->slots, 0, sizeof(xu_slot_t) * ((size_t)x->nslots + 1));
    x->ck = (uint64_t *)((char *)x->mem + stage_sz + slots_sz);
    memset(x->ck, 0, ((size_t)nck + 1) * 8);
    x->srt = calloc(x->prog.nsteps + 1, sizeof *x->srt);
    x->tstate = calloc(x->prog.ntasks + 1, 1);
    if (!x->srt || !x->tstate)
        return XM_ERR(XMESH_ERR_NO_MEMORY, "plan setup: out of memory");
    XM_INFO("plan setup (ucx): rank %d: %d tasks, %d steps, %lld staging bytes, window %d", x->rank,
            x->prog.ntasks, x->prog.nsteps, (long long)x->stage_bytes, x->window);
    if (xm_log_level() >= XM_LOG_INFO) { /* bytes this rank sends to other hosts, per rail */
        char line[256] = "";
        int64_t by[4] = {0};
        for (int i = 0; i < x->prog.nsteps; i++) {
            const xm_pstep_t *s = &x->prog.steps[i];
            if (s->next >= 0 && hm->host_of[s->next] != me && s->rail_out >= 0)
                by[s->rail_out % 4] += s->bytes;
        }
        for (int k = 0; k < x->nlanes && k < 4; k++) {
            size_t l = strlen(line);
            snprintf(line + l, sizeof line - l, "%s%lld", k ? ", " : "", (long long)by[k]);
        }
        XM_INFO("plan setup (ucx): rank %d sends to other hosts, bytes per rail (mod 4): %s",
                x->rank, line);
    }
    return XMESH_SUCCESS;
}

static xmesh_result_t setup_trace(xmesh_plan_t p, xu_exec_t *x, int trace_flag, const char *path)
{
    int n = p->ctx->size;
    char *in = calloc((size_t)n, 1);
    if (!in)
        return XM_ERR(XMESH_ERR_NO_MEMORY, "plan setup: out of memory");
    for (int k = 0; k < p->ntensors; k++) { /* every tensor's meshes */
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
        x->tr_slots = calloc(2 * (size_t)x->nparts, sizeof *x->tr_slots);
        x->tr_counts = calloc((size_t)x->nparts, sizeof(int64_t));
        x->tr_bufs = calloc((size_t)x->nparts, sizeof(xu_trace_ev_t *));
        if (!x->parts || !x->ev || !x->tr_slots || !x->tr_counts || !x->tr_bufs) {
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

static void exec_free(xu_ctx_t *be, xu_exec_t *x)
{
    if (!x)
        return;
    /* Operations still owned after a failure: UCX may complete them later
     * (their callbacks write the slots, receives the staging), so that
     * memory is leaked on purpose; the requests are released to UCX. */
    int leak = 0;
    for (int i = 0; x->slots && i < x->nslots; i++)
        if (!xu_slot_idle(be, &x->slots[i], NULL, NULL)) {
            ucp_request_free(x->slots[i].req);
            leak = 1;
        }
    int tleak = 0;
    for (int i = 0; x->tr_slots && i < 2 * x->nparts; i++)
        if (!xu_slot_idle(be, &x->tr_slots[i], NULL, NULL)) {
            ucp_request_free(x->tr_slots[i].req);
            tleak = 1;
        }
    if (!leak)
        free(x->mem);
    xm_program_free(&x->prog);
    free(x->srcs);
    free(x->dsts);
    free(x->sx);
    free(x->srt);
    free(x->tstate);
    free(x->lane);
    free(x->nicm);
    free(x->parts);
    if (!tleak) {
        free(x->ev);
        free(x->tr_slots);
        free(x->tr_counts);
        for (int i = 0; x->tr_bufs && i < x->nparts; i++)
            free(x->tr_bufs[i]);
    }
    free(x->tr_bufs);
    free(x);
}

xmesh_result_t xu_plan_setup(xmesh_plan_t p)
{
    xmesh_ctx_t ctx = p->ctx;
    xu_ctx_t *be = ctx->be;
    xu_exec_t *x = calloc(1, sizeof *x);
    if (!x)
        return XM_ERR(XMESH_ERR_NO_MEMORY, "plan setup: out of memory");
    x->staged = &be->staged_bytes;
    p->exec = x;
    /* Every rank runs plan setups in the same order: equal tags. */
    x->tag = be->next_tag++ & 0xffff;
    x->rank = ctx->rank;
    x->es = xmesh_dtype_size(p->dtype);
    /* Rank 0's schedule, trace choice and trace path for everyone. */
    int flags[2] = {0, 0}; /* XMESH_TRACE set, XMESH_CHECK */
    char tpath[512] = "";
    if (ctx->rank == 0) {
        const char *tp = xm_param_str("XMESH_TRACE");
        flags[0] = tp && *tp;
        snprintf(tpath, sizeof tpath, "%s", tp ? tp : "");
        flags[1] = xm_param_i64("XMESH_CHECK") != 0;
    }
    xmesh_result_t local = xm_oob_share_schedule(&be->oob, p, flags, 2);
    x->check = flags[1];
#ifdef XMESH_TEST_HOOKS /* test builds only (lib/CMakeLists.txt) */
    const char *cr = getenv("XMESH_TEST_CORRUPT");
    x->corrupt = x->check && cr && *cr && atoi(cr) == ctx->rank;
#endif
    if (local == XMESH_ERR_BACKEND)
        return local; /* the all-gather itself failed: nothing more is collective */
    if (flags[0]) {
        xmesh_result_t r = xm_oob_bcast(&be->oob, tpath, sizeof tpath, 0, "trace path");
        if (r)
            return r;
    }
    if (!local)
        local = compile(p, x);
    if (!local)
        local = setup_trace(p, x, flags[0], tpath);
    char saved[512] = "";
    if (local)
        snprintf(saved, sizeof saved, "%s", xmesh_last_error());
    xmesh_result_t r = xm_oob_agree(&be->oob, local, 0, NULL, NULL, 0, "plan setup");
    if (local)
        return XM_ERR(local, "%s", saved);
    if (r)
        return r;
    /* A common time origin only for traces (one more all-gather). */
    if (flags[0]) {
        char b = 0, *all = malloc((size_t)ctx->size);
        if (all)
            xm_oob_allgather(&be->oob, &b, all, 1, "trace barrier");
        free(all);
    }
    x->t0 = xu_now();
    pthread_mutex_lock(&be->mu);
    x->plan_id = be->nplans_created++;
    pthread_mutex_unlock(&be->mu);
    return XMESH_SUCCESS;
}

/* Releasing UCX requests is a UCX call: it takes the progress token, since
 * another plan's reshard may be progressing meanwhile. */
void xu_plan_teardown(xmesh_plan_t p)
{
    xu_ctx_t *be = p->ctx->be;
    pthread_mutex_lock(&be->mu);
    while (be->busy)
        pthread_cond_wait(&be->done_cv, &be->mu);
    be->busy = 1;
    pthread_mutex_unlock(&be->mu);
    exec_free(be, p->exec);
    p->exec = NULL;
    pthread_mutex_lock(&be->mu);
    be->busy = 0;
    pthread_cond_broadcast(&be->done_cv);
    if (be->active && be->thread_started)
        pthread_cond_signal(&be->work_cv);
    pthread_mutex_unlock(&be->mu);
}
