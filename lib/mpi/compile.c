/* Plan setup of the MPI executor: make the schedule identical on every rank,
 * then compile this rank's share of it into steps (one per chain segment it
 * occupies), with chunking, staging and request slots fixed once. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xm_mpi.h"

#define XM_MAX_CHUNK_ELEMS_BYTES (1ll << 28) /* keeps every message count < 2^31 */

typedef struct {
    xmesh_plan_t p;
    xm_exec_t *x;
    int hop;    /* global hop counter: identical on every rank */
    int tag_ub; /* MPI_TAG_UB of the plan communicator */
    int cap;
    int64_t chunk_elems;
    int64_t src_lo[XM_MAX_DIMS], src_hi[XM_MAX_DIMS];
    int64_t dst_lo[XM_MAX_DIMS], dst_hi[XM_MAX_DIMS];
} cstate_t;

static int tag_of(const cstate_t *cs, int hop)
{
    return XM_TAG_BASE + hop % (cs->tag_ub - XM_TAG_BASE);
}

static int box_inside(int nd, const xm_box_t *b, const int64_t *lo, const int64_t *hi)
{
    for (int d = 0; d < nd; d++)
        if (b->lo[d] < lo[d] || b->hi[d] > hi[d])
            return 0;
    return 1;
}

static int geom_contiguous(const xm_geom_t *g)
{
    return g->n == 1 && g->stride[0] == 1;
}

/* Chunking of the box-linear range [r0, r1): for a whole box, pieces of
 * dim k (the outermost dim whose inner dims fit a chunk) so that every chunk
 * is a sub-box; for a part of a box (all-gather strategies), fixed pieces. */
static void set_chunks(const cstate_t *cs, xm_step_t *s, const xm_box_t *box, int64_t r0,
                       int64_t r1, int whole)
{
    int nd = cs->p->ts.ndim;
    int64_t ce = cs->chunk_elems;
    s->r0 = r0;
    if (whole && nd > 0) {
        int64_t e[XM_MAX_DIMS], inner = 1;
        int k = nd - 1;
        for (int d = 0; d < nd; d++)
            e[d] = box->hi[d] - box->lo[d];
        for (; k > 0; k--) { /* inner = prod of e[d] for d > k */
            if (inner * e[k] > ce)
                break;
            inner *= e[k];
        }
        int64_t m = ce / inner;
        if (m > e[k])
            m = e[k];
        if (m < 1)
            m = 1;
        s->ce = m * inner;
        s->row_elems = e[k] * inner;
        s->per_row = (e[k] + m - 1) / m;
        s->nchunks = (r1 - r0) / s->row_elems * s->per_row;
    } else {
        s->row_elems = r1 - r0;
        s->ce = ce < s->row_elems ? ce : s->row_elems;
        s->per_row = (s->row_elems + s->ce - 1) / s->ce;
        s->nchunks = s->per_row;
    }
}

/* Appends a zeroed step; *out is valid until the next push. */
static xmesh_result_t push_step(cstate_t *cs, xm_step_t **out)
{
    xm_exec_t *x = cs->x;
    if (x->nsteps == cs->cap) {
        int ncap = cs->cap ? 2 * cs->cap : 64;
        xm_step_t *n = realloc(x->steps, sizeof *n * ncap);
        if (!n)
            return XM_ERR(XMESH_ERR_NO_MEMORY, "plan setup: out of memory for %d steps", ncap);
        x->steps = n;
        cs->cap = ncap;
    }
    *out = &x->steps[x->nsteps++];
    memset(*out, 0, sizeof **out);
    return XMESH_SUCCESS;
}

/* Adds this rank's steps of one chain: devs[0..nsrc-1] are sources (each
 * adds its partial value), the rest receivers; `from_dst`: devs[0] is a
 * receiver that already holds the range (all-gather). *last gets the local
 * step of the chain's last segment when this rank owns it, else -1. */
static xmesh_result_t add_chain(cstate_t *cs, int task, int route, int64_t r0, int64_t r1,
                                int whole, const int *devs, int len, int nsrc, int from_dst,
                                int after, int *last)
{
    xmesh_plan_t p = cs->p;
    xm_exec_t *x = cs->x;
    const xm_task_t *t = &p->ts.tasks[task];
    int me = x->rank, nseg = 0, hop0 = cs->hop;
    *last = -1;
    if (r1 <= r0)
        return XMESH_SUCCESS;
    for (int i = 0; i < len;) {
        int j = i + 1;
        while (j < len && devs[j] == devs[i])
            j++;
        if (devs[i] == me) {
            xm_step_t *s = NULL;
            xmesh_result_t r = push_step(cs, &s);
            if (r)
                return r;
            s->task = task;
            s->route = route;
            s->prev = i > 0 ? devs[i - 1] : -1;
            s->next = j < len ? devs[j] : -1;
            s->tag_in = i > 0 ? tag_of(cs, hop0 + nseg - 1) : -1;
            s->tag_out = j < len ? tag_of(cs, hop0 + nseg) : -1;
            s->pos_first = i;
            s->pos_last = j - 1;
            s->nsrc = nsrc;
            s->in_acc = i > 0 && i < nsrc;
            s->out_acc = j < len && j < nsrc;
            s->after = i == 0 ? after : -1;
            s->stage_off = -1;
            s->req_off = -1;
            s->region = -1;
            int has_src = i < nsrc, has_recv = j - 1 >= nsrc || from_dst;
            if (has_src) {
                if (p->src_index < 0 || !box_inside(p->ts.ndim, &t->box, cs->src_lo, cs->src_hi))
                    return XM_ERR(XMESH_ERR_INTERNAL,
                                  "plan setup: task %d lists rank %d as a source but its source "
                                  "block does not hold the box",
                                  task, me);
                xm_mpi_geom_init(&s->sg, p->ts.ndim, cs->src_lo, cs->src_hi, &t->box);
                s->has_sg = 1;
            }
            if (has_recv) {
                if (p->dst_index < 0 || !box_inside(p->ts.ndim, &t->box, cs->dst_lo, cs->dst_hi))
                    return XM_ERR(XMESH_ERR_INTERNAL,
                                  "plan setup: task %d lists rank %d as a receiver but its "
                                  "destination block does not hold the box",
                                  task, me);
                xm_mpi_geom_init(&s->dg, p->ts.ndim, cs->dst_lo, cs->dst_hi, &t->box);
                s->has_dg = 1;
            }
            if (from_dst && i == 0)
                s->mode = XM_MODE_FROM_DST;
            else if (!has_src)
                s->mode = XM_MODE_RECV;
            else if (nsrc == 1 && i == 0 && !has_recv && s->next >= 0)
                s->mode = XM_MODE_SRC;
            else if (nsrc == 1 && i == 0 && has_recv && s->next < 0)
                s->mode = XM_MODE_SELF;
            else
                s->mode = XM_MODE_GENERAL;
            if (s->mode == XM_MODE_RECV && s->prev < 0)
                return XM_ERR(XMESH_ERR_INTERNAL, "plan setup: task %d chain starts at a receiver",
                              task);
            set_chunks(cs, s, &t->box, r0, r1, whole);
            /* Checksums start where the final values first exist. */
            s->ck_origin =
                s->mode == XM_MODE_SRC || s->mode == XM_MODE_FROM_DST ||
                (s->mode == XM_MODE_GENERAL && nsrc > 0 && i <= nsrc - 1 && j - 1 >= nsrc - 1);
            s->ck_verify = s->mode == XM_MODE_RECV;
            s->ck_off = -1;
            s->bytes = (r1 - r0) * (int64_t)x->es;
            *last = j == len ? x->nsteps - 1 : -1;
        }
        nseg++;
        i = j;
    }
    cs->hop += nseg > 0 ? nseg - 1 : 0;
    return XMESH_SUCCESS;
}

/* Whether dev holds task t's box; *host_match gets the pick-th (mod count)
 * holder on `host`, -1 if none, so parts spread over local replicas. */
static int is_holder(const xm_taskset_t *ts, const xm_task_t *t, int dev, int *host_match,
                     const xm_hostmap_t *h, int host, int pick)
{
    int n = t->ngroups * t->group_size, found = 0, nlocal = 0;
    *host_match = -1;
    for (int i = 0; i < n; i++) {
        int d = ts->holders[t->holder_off + i];
        found |= d == dev;
        nlocal += h->host_of[d] == host;
    }
    for (int i = 0, k = 0; i < n && nlocal; i++) {
        int d = ts->holders[t->holder_off + i];
        if (h->host_of[d] == host && k++ == pick % nlocal)
            *host_match = d;
    }
    return found;
}

/* Alpa-style baselines (paper 002 section 3.1): every receiver of a group
 * gets 1/k of the box from a sender, then a ring all-gather among the
 * group's k receivers, each part a chunk-pipelined chain that starts once
 * its first receiver holds the part. */
static xmesh_result_t compile_allgather(cstate_t *cs, int t, int per_host)
{
    xmesh_plan_t p = cs->p;
    const xm_taskset_t *ts = &p->ts;
    const xm_task_t *tk = &ts->tasks[t];
    const xm_hostmap_t *hm = &p->ctx->hosts;
    int G = tk->ngroups, mg = p->sched.max_groups;
    const int *R = ts->recvs + tk->recv_off;
    int64_t V = xm_box_volume(&tk->box, ts->ndim);
    int *chain = malloc(sizeof(int) * (G + tk->nrecv + 2));
    int *stage1 = malloc(sizeof(int) * (tk->nrecv + 1));
    xmesh_result_t r = XMESH_SUCCESS;
    if (!chain || !stage1) {
        r = XM_ERR(XMESH_ERR_NO_MEMORY, "plan setup: out of memory");
        goto out_free;
    }
    for (int g0 = 0; g0 < tk->nrecv;) {
        int g1 = g0 + 1;
        while (per_host && g1 < tk->nrecv && hm->host_of[R[g1]] == hm->host_of[R[g0]])
            g1++;
        if (!per_host)
            g1 = tk->nrecv;
        int k = g1 - g0;
        for (int j = 0; j < k; j++) {
            int rcv = R[g0 + j], len = 0, nsrc;
            int64_t a = V * j / k, b = V * (j + 1) / k;
            int near = -1;
            if (G == 1 && is_holder(ts, tk, rcv, &near, hm, hm->host_of[rcv], j)) {
                chain[len++] = rcv; /* self copy */
                nsrc = 1;
            } else if (G == 1 && near >= 0) {
                chain[len++] = near; /* a replica on the receiver's host: intra-host */
                nsrc = 1;
            } else {
                for (int g = 0; g < G; g++)
                    chain[len++] = p->sched.sender[t * mg + g];
                nsrc = G;
            }
            chain[len++] = rcv;
            if ((r = add_chain(cs, t, -1, a, b, 0, chain, len, nsrc, 0, -1, &stage1[j])))
                goto out_free;
        }
        for (int j = 0; k > 1 && j < k; j++) {
            int64_t a = V * j / k, b = V * (j + 1) / k;
            for (int q = 0; q < k; q++)
                chain[q] = R[g0 + (j + q) % k];
            int last;
            if ((r = add_chain(cs, t, -1, a, b, 0, chain, k, 0, 1, stage1[j], &last)))
                goto out_free;
        }
        g0 = g1;
    }
out_free:
    free(chain);
    free(stage1);
    return r;
}

/* broadcast / sendrecv: this rank's steps of the scheduler's routes of task t. */
static xmesh_result_t compile_routes(cstate_t *cs, int t)
{
    const xm_schedule_t *sc = &cs->p->sched;
    int64_t V = xm_box_volume(&cs->p->ts.tasks[t].box, cs->p->ts.ndim);
    for (int q = sc->task_route_off[t]; q < sc->task_route_off[t + 1]; q++) {
        const xm_route_t *rt = &sc->routes[q];
        const int *devs = sc->route_devs + rt->off;
        int self[2], last;
        int len = rt->len, nsrc = rt->nsrc;
        if (len == 1) { /* self copy: the holder is also the receiver */
            self[0] = self[1] = devs[0];
            devs = self;
            len = 2;
            nsrc = 1;
        }
        xmesh_result_t r = add_chain(cs, t, q, 0, V, 1, devs, len, nsrc, 0, -1, &last);
        if (r)
            return r;
    }
    return XMESH_SUCCESS;
}

/* NIC direction (inter-host) or local link a hop of this rank uses. */
static unsigned hop_slot(const cstate_t *cs, int peer, int sending)
{
    const xm_hostmap_t *h = &cs->p->ctx->hosts;
    int remote = h->host_of[peer] != h->host_of[cs->x->rank];
    if (sending)
        return remote ? XM_SLOT_SEND : XM_SLOT_LSEND;
    return remote ? XM_SLOT_RECV : XM_SLOT_LRECV;
}

/* Staging and request slots. At most one task per slot class is active on
 * a rank at a time, so a task's pool region is the lowest class it holds:
 * two active tasks never share a region; each region is as large as its
 * largest task. */
static xmesh_result_t finish_task(cstate_t *cs, int t, int first, int64_t *region_stage,
                                  int *region_reqs, int *cap_rt)
{
    xm_exec_t *x = cs->x;
    if (x->nsteps == first)
        return XMESH_SUCCESS;
    unsigned slots = 0;
    for (int i = first; i < x->nsteps; i++) {
        if (x->steps[i].prev >= 0)
            slots |= hop_slot(cs, x->steps[i].prev, 0);
        if (x->steps[i].next >= 0)
            slots |= hop_slot(cs, x->steps[i].next, 1);
    }
    int region = -1;
    for (int b = 0; b < XM_NSLOTS && region < 0; b++)
        if (slots & (1u << b))
            region = b;
    int64_t soff = 0;
    int roff = 0;
    for (int i = first; i < x->nsteps; i++) {
        xm_step_t *s = &x->steps[i];
        int64_t need = 0;
        switch (s->mode) {
        case XM_MODE_SRC:
            need = x->zero_copy && geom_contiguous(&s->sg) ? 0 : (int64_t)x->es;
            break;
        case XM_MODE_RECV:
        case XM_MODE_FROM_DST:
            need = x->zero_copy && geom_contiguous(&s->dg) ? 0 : (int64_t)x->es;
            break;
        case XM_MODE_GENERAL:
            need = (int64_t)x->acc_es;
            break;
        default:
            break;
        }
        need *= s->ce * x->window;
        if (need && region < 0) /* a task without hops never needs staging */
            return XM_ERR(XMESH_ERR_INTERNAL, "plan setup: task %d needs staging without a hop", t);
        if (need) {
            s->stage_off = soff;
            soff += (need + 63) & ~63ll;
        }
        if (s->prev >= 0 || s->next >= 0) {
            s->req_off = roff;
            roff += XM_STEP_REQS(x->window);
        }
        s->region = region;
    }
    if (region >= 0) {
        if (soff > region_stage[region])
            region_stage[region] = soff;
        if (roff > region_reqs[region])
            region_reqs[region] = roff;
    }
    if (x->nrtasks == *cap_rt) {
        int ncap = *cap_rt ? 2 * *cap_rt : 64;
        xm_rtask_t *n = realloc(x->rtasks, sizeof *n * ncap);
        if (!n)
            return XM_ERR(XMESH_ERR_NO_MEMORY, "plan setup: out of memory for %d tasks", ncap);
        x->rtasks = n;
        *cap_rt = ncap;
    }
    x->rtasks[x->nrtasks++] = (xm_rtask_t){t, first, x->nsteps - first, slots};
    return XMESH_SUCCESS;
}

/* Local part of plan setup: steps, task list, pools. On error x is left for
 * exec_free (whatever was allocated is recorded in x). */
static xmesh_result_t compile(xmesh_plan_t p, xm_exec_t *x)
{
    cstate_t cs;
    memset(&cs, 0, sizeof cs);
    cs.p = p;
    cs.x = x;
    int flag = 0, *ub = NULL;
    MPI_Comm_get_attr(x->comm, MPI_TAG_UB, &ub, &flag);
    cs.tag_ub = flag && ub ? *ub : 32767;
    int64_t cb =
        p->chunk_bytes < XM_MAX_CHUNK_ELEMS_BYTES ? p->chunk_bytes : XM_MAX_CHUNK_ELEMS_BYTES;
    cs.chunk_elems = cb / (int64_t)x->es > 0 ? cb / (int64_t)x->es : 1;
    int64_t w = XM_WINDOW_BYTES / (cs.chunk_elems * (int64_t)x->es);
    x->window = (int)(w < XM_WINDOW_MIN ? XM_WINDOW_MIN : w > XM_WINDOW_MAX ? XM_WINDOW_MAX : w);
    /* Sends in flight per chain link (default 2): the wire never waits for
     * a progress round between two chunks (the progress thread may be
     * starved by the caller's compute), while the next hop is delayed by
     * only send_ahead chunks, not a whole window (several sends to one peer
     * share the wire and finish together). The model charges the same fill
     * per hop (xm_task_timing). Receives still run a window ahead. */
    int64_t ahead = p->cluster.send_ahead; /* XMESH_SEND_AHEAD, agreed and modelled */
    x->zero_copy = xm_param_i64("XMESH_ZERO_COPY") != 0;
    x->send_ahead = (int)(ahead < 1 ? 1 : ahead > x->window ? x->window : ahead);
    if (p->src_index >= 0)
        xm_layout_block(&p->src, p->src_index, cs.src_lo, cs.src_hi);
    if (p->dst_index >= 0)
        xm_layout_block(&p->dst, p->dst_index, cs.dst_lo, cs.dst_hi);
    int64_t region_stage[XM_NSLOTS] = {0};
    int region_reqs[XM_NSLOTS] = {0}, cap_rt = 0;
    xmesh_result_t r = XMESH_SUCCESS;
    for (int i = 0; i < p->ts.ntasks && !r; i++) {
        int t = p->sched.order[i], first = x->nsteps;
        if (p->strategy == XMESH_STRATEGY_SENDRECV_ALLGATHER)
            r = compile_allgather(&cs, t, 1);
        else if (p->strategy == XMESH_STRATEGY_GLOBAL_ALLGATHER)
            r = compile_allgather(&cs, t, 0);
        else
            r = compile_routes(&cs, t);
        if (!r)
            r = finish_task(&cs, t, first, region_stage, region_reqs, &cap_rt);
    }
    if (r)
        return r;
    int64_t stage_base[XM_NSLOTS];
    int req_base[XM_NSLOTS];
    for (int b = 0; b < XM_NSLOTS; b++) {
        stage_base[b] = x->stage_bytes;
        req_base[b] = x->nreqs;
        x->stage_bytes += region_stage[b];
        x->nreqs += region_reqs[b];
    }
    for (int i = 0; i < x->nsteps; i++) {
        xm_step_t *s = &x->steps[i];
        if (s->stage_off >= 0)
            s->stage_off += stage_base[s->region];
        if (s->req_off >= 0)
            s->req_off += req_base[s->region];
    }
    if (x->stage_bytes && !(x->stage = aligned_alloc(64, (size_t)x->stage_bytes)))
        return XM_ERR(XMESH_ERR_NO_MEMORY, "plan setup: out of memory for %lld staging bytes",
                      (long long)x->stage_bytes);
    if (x->check) {
        int64_t nck = 0;
        for (int i = 0; i < x->nsteps; i++)
            if (x->steps[i].ck_origin || x->steps[i].ck_verify) {
                if (x->steps[i].nchunks > (1 << 26))
                    return XM_ERR(XMESH_ERR_UNSUPPORTED,
                                  "XMESH_CHECK: task %d has %lld chunks (more than 2^26): raise "
                                  "chunk_bytes (now %lld)",
                                  x->steps[i].task, (long long)x->steps[i].nchunks,
                                  (long long)p->chunk_bytes);
                x->steps[i].ck_off = nck;
                nck += 2 * x->steps[i].nchunks;
            }
        if (!(x->ck = calloc(nck + 1, sizeof(uint64_t))))
            return XM_ERR(XMESH_ERR_NO_MEMORY, "plan setup: out of memory for %lld checksums",
                          (long long)nck);
    }
    x->reqs = malloc(sizeof(MPI_Request) * (x->nreqs + 1));
    x->req_idx = malloc(sizeof(int) * (x->nreqs + 1));
    x->srt = calloc(x->nsteps + 1, sizeof *x->srt);
    x->tstate = calloc(x->nrtasks + 1, 1);
    if (!x->reqs || !x->req_idx || !x->srt || !x->tstate)
        return XM_ERR(XMESH_ERR_NO_MEMORY, "plan setup: out of memory");
    for (int i = 0; i < x->nreqs; i++)
        x->reqs[i] = MPI_REQUEST_NULL;
    XM_INFO("plan setup: rank %d: %d tasks, %d steps, %lld staging bytes, %d request slots",
            x->rank, x->nrtasks, x->nsteps, (long long)x->stage_bytes, x->nreqs);
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
    free(x->steps);
    free(x->rtasks);
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
    for (int i = 0; i < p->src.mesh.ndev; i++)
        in[p->src.mesh.devs[i]] = 1;
    for (int i = 0; i < p->dst.mesh.ndev; i++)
        in[p->dst.mesh.devs[i]] = 1;
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
    int nt = p->ts.ntasks, mg = p->sched.max_groups, rc;
    xm_exec_t *x = calloc(1, sizeof *x);
    int64_t nbuf = 4 + (int64_t)nt * (1 + mg);
    int *buf = malloc(sizeof(int) * nbuf);
    if (!x || !buf) {
        free(x);
        free(buf);
        return XM_ERR(XMESH_ERR_NO_MEMORY, "plan setup: out of memory for %d tasks", nt);
    }
    x->comm = MPI_COMM_NULL;
    x->pool_slot = -1;
    p->exec = x;
    double tm[6];
    tm[0] = xm_mpi_now();
    /* 1. Rank 0's decisions for everyone: time-budgeted schedulers may pick
     *    differently on each rank. */
    if (ctx->rank == 0) {
        const char *tp = xm_param_str("XMESH_TRACE");
        buf[0] = nt;
        buf[1] = mg;
        buf[2] = tp && *tp;
        buf[3] = xm_param_i64("XMESH_CHECK") != 0;
        memcpy(buf + 4, p->sched.order, sizeof(int) * nt);
        memcpy(buf + 4 + nt, p->sched.sender, sizeof(int) * (int64_t)nt * mg);
    }
    if ((rc = MPI_Bcast(buf, (int)nbuf, MPI_INT, 0, be->comm))) {
        free(buf);
        return xm_mpi_err(rc, "MPI_Bcast(schedule)");
    }
    xmesh_result_t local = XMESH_SUCCESS;
    if (buf[0] != nt || buf[1] != mg)
        local = XM_ERR(XMESH_ERR_INTERNAL,
                       "plan setup: rank 0 has %d tasks x %d groups, this "
                       "rank %d x %d",
                       buf[0], buf[1], nt, mg);
    if (!local && ctx->rank != 0) {
        xm_schedule_t ns;
        /* The scheduler has route models for broadcast and sendrecv only; the
         * all-gather baselines take senders and order from the sendrecv model
         * (their routes are built here). api.c must map them the same way. */
        xmesh_strategy_t sst = p->strategy == XMESH_STRATEGY_SENDRECV_ALLGATHER ||
                                       p->strategy == XMESH_STRATEGY_GLOBAL_ALLGATHER
                                   ? XMESH_STRATEGY_SENDRECV
                                   : p->strategy;
        xm_sched_opts_t so = {
            .kind = p->scheduler, .budget_us = p->budget_us, .seed = p->seed, .strategy = sst};
        local = xm_schedule_from(&p->ts, &p->cluster, &so, buf + 4, buf + 4 + nt, &ns);
        if (!local) {
            xm_schedule_free(&p->sched);
            p->sched = ns;
        }
    }
    tm[1] = xm_mpi_now();
    int trace_flag = buf[2];
    x->check = buf[3];
    {
#ifdef XMESH_TEST_HOOKS /* test builds only (lib/CMakeLists.txt) */
        const char *cr = getenv("XMESH_TEST_CORRUPT");
        x->corrupt = x->check && cr && *cr && atoi(cr) == ctx->rank;
#else
        x->corrupt = 0;
#endif
    }
    free(buf);
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
