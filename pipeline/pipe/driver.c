/*
 * Pipeline driver: this rank's action list, with one xmesh plan per edge and
 * direction (edges that share a boundary and a slot: one plan of many), FIFO-serialised starts,
 * overlap through xmesh_reshard_start / xmesh_test, timing and a Chrome trace. Contract in
 * driver.h. This file: transfers, the step, predictions and the trace; creation and destruction are
 * in driver_create.c.
 */
#define _POSIX_C_SOURCE 200809L
#include "pipe/driver.h"
#include "pipe/driver_priv.h"
#include "util/xmp_err.h"
#include "nn/coll.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void derr(xmp_driver_t *d, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    xmp_verr_buf(d->err, sizeof(d->err), fmt, ap);
    va_end(ap);
}

static const char *mode_names[] = {"broadcast", "sendrecv", "sendrecv-allgather", "blocking",
                                   "signal"};

int xmp_comm_mode_parse(const char *name)
{
    for (int i = 0; name && i < XMP_COMM_COUNT_; i++)
        if (strcmp(name, mode_names[i]) == 0)
            return i;
    return -1;
}

const char *xmp_comm_mode_name(int mode)
{
    return mode >= 0 && mode < XMP_COMM_COUNT_ ? mode_names[mode] : "unknown";
}

int xmp_driver_stage(const xmp_driver_t *d)
{
    return d->stage;
}

int xmp_driver_group(const xmp_driver_t *d)
{
    return d->group;
}

int xmp_driver_stages(const xmp_driver_t *d, int *stages, int max)
{
    for (int c = 0; c < d->nch && c < max; c++)
        stages[c] = d->ch_stage[c];
    return d->nch;
}

const char *xmp_driver_error(const xmp_driver_t *d)
{
    return d ? d->err : "";
}

static void record(xmp_driver_t *d, int track, xmp_action_t a, double t0, double t1, int64_t flow)
{
    if (!d->cfg.trace)
        return;
    if (d->nev == d->capev) {
        size_t nc = d->capev ? 2 * d->capev : 1024;
        ev_t *n = realloc(d->ev, nc * sizeof(*n));
        if (n == NULL)
            return; /* trace is best effort: drop events on OOM */
        d->ev = n;
        d->capev = nc;
    }
    ev_t e = {track, a.kind, a.mb, a.edge, a.dir, a.chunk, t0 - d->t_origin, t1 - d->t_origin,
              flow};
    d->ev[d->nev++] = e;
}

static int64_t flow_id(const xmp_driver_t *d, int p, int mb)
{
    return ((d->step_no * d->P + p) * (int64_t)d->M + mb) + 1;
}

static int lead_rank(const xmp_driver_t *d, int stage)
{
    return d->meshes[stage].ranks[0];
}

/* ------------------------------------------------------------ transfers */

static xmesh_result_t issue(xmp_driver_t *d, int p)
{
    plan_t *pl = &d->plans[p];
    if (pl->req != NULL || pl->qhead == pl->qtail)
        return XMESH_SUCCESS;
    int mb = pl->queue[pl->qhead++];
    const void *src = NULL;
    void *dst = NULL;
    int snd = pl->role == 0 || pl->role == 2, rcv = pl->role == 1 || pl->role == 2;
    if (d->cfg.mode == XMP_COMM_SIGNAL) {
        src = snd ? &pl->sig[0] : NULL;
        dst = rcv ? &pl->sig[1] : NULL;
    } else {
        src = snd ? pl->sbuf[mb] : NULL;
        dst = rcv ? (pl->wbuf ? pl->wbuf[mb] : pl->rbuf[mb]) : NULL;
    }
    xmesh_result_t r;
    if (pl->nmem > 1 && d->cfg.mode != XMP_COMM_SIGNAL) {
        const void **srcs = (const void **)d->bsrc;
        void **dsts = d->bdst;
        for (int k = 0; k < pl->nmem; k++) {
            const plan_t *m = &d->plans[pl->mem[k]];
            srcs[k] = snd ? m->sbuf[mb] : NULL;
            dsts[k] = rcv ? (m->wbuf ? m->wbuf[mb] : m->rbuf[mb]) : NULL;
        }
        r = xmesh_reshard_many_start(pl->plan, srcs, dsts, &pl->req);
    } else {
        r = xmesh_reshard_start(pl->plan, src, dst, &pl->req);
    }
    if (r != XMESH_SUCCESS) {
        derr(d, "xmesh_reshard_start of %c%d.e%d on rank %d: %s (%s)", p % 2 ? 'G' : 'A', mb, p / 2,
             d->rank, xmesh_result_string(r), xmesh_last_error());
        pl->req = NULL;
        return r;
    }
    pl->req_mb = mb;
    pl->req_t0 = MPI_Wtime();
    return XMESH_SUCCESS;
}

static void retire(xmp_driver_t *d, int p)
{
    plan_t *pl = &d->plans[p];
    int e = p / 2, dir = p % 2;
    int sender_stage = dir == XMP_DIR_ACT ? d->edges[e].src : d->edges[e].dst;
    int chunk = 0;
    for (int c = 0; c < d->nch; c++)
        if (d->ch_stage[c] == sender_stage)
            chunk = c;
    xmp_action_t a = {XMP_ACT_START, pl->req_mb, e, dir, chunk};
    int64_t flow = (pl->role == 0 || pl->role == 2) && d->rank == lead_rank(d, sender_stage)
                       ? flow_id(d, p, pl->req_mb)
                       : 0;
    record(d, TR_XFER, a, pl->req_t0, MPI_Wtime(), flow);
    pl->done[pl->req_mb] = 1;
    pl->req = NULL;
}

static xmesh_result_t progress_plan(xmp_driver_t *d, int p)
{
    plan_t *pl = &d->plans[p];
    if (pl->req != NULL) {
        xmesh_result_t r = xmesh_test(pl->req);
        if (r == XMESH_SUCCESS) {
            retire(d, p);
        } else if (r != XMESH_IN_PROGRESS) {
            derr(d, "transfer %c%d.e%d on rank %d failed: %s (%s)", p % 2 ? 'G' : 'A', pl->req_mb,
                 p / 2, d->rank, xmesh_result_string(r), xmesh_last_error());
            pl->req = NULL;
            return r;
        }
    }
    return issue(d, p);
}

static xmesh_result_t progress_all(xmp_driver_t *d)
{
    for (int p = 0; p < d->P; p++) {
        if (d->plans[p].role < 0 || d->plans[p].lead != p)
            continue;
        xmesh_result_t r = progress_plan(d, p);
        if (r != XMESH_SUCCESS)
            return r;
    }
    return XMESH_SUCCESS;
}

void xmp_driver_progress(xmp_driver_t *d)
{
    if (d != NULL)
        (void)progress_all(d); /* errors resurface at the next wait */
}

/* The progress function the stages get for a step (set_progress). */
static void stage_progress(void *arg)
{
    xmp_driver_progress(arg);
}

/* Hands every stage of this rank its progress function (on), or takes it back. */
static void bind_progress(xmp_driver_t *d, int on)
{
    for (int c = 0; c < d->nch; c++)
        if (d->ch_ops[c].set_progress)
            d->ch_ops[c].set_progress(d->ch_ops[c].user, on ? stage_progress : NULL, on ? d : NULL);
}

/* Blocks until transfer mb of plan p completed on this rank. */
static xmesh_result_t wait_for(xmp_driver_t *d, int p, int mb)
{
    plan_t *pl = &d->plans[p];
    while (!pl->done[mb]) {
        xmesh_result_t r = progress_all(d);
        if (r != XMESH_SUCCESS)
            return r;
        if (pl->done[mb])
            break;
        if (pl->req == NULL) {
            derr(d, "wait for %c%d.e%d on rank %d: transfer was never started", p % 2 ? 'G' : 'A',
                 mb, p / 2, d->rank);
            return XMESH_ERR_INVALID_USAGE;
        }
        int others_queued = 0;
        for (int q = 0; q < d->P; q++)
            if (q != p && d->plans[q].qhead != d->plans[q].qtail)
                others_queued = 1;
        if (!others_queued) {
            /* nothing of ours waits to be issued: block without spinning */
            r = xmesh_wait(pl->req);
            if (r != XMESH_SUCCESS) {
                derr(d, "transfer %c%d.e%d on rank %d failed: %s (%s)", p % 2 ? 'G' : 'A',
                     pl->req_mb, p / 2, d->rank, xmesh_result_string(r), xmesh_last_error());
                pl->req = NULL;
                return r;
            }
            retire(d, p);
            continue;
        }
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
    return XMESH_SUCCESS;
}

/* ----------------------------------------------------------------- step */

static xmesh_result_t cb_fail(xmp_driver_t *d, int chunk, const char *name, int mb, int rc)
{
    derr(d, "stage %d rank %d: callback %s(mb %d) failed with %d",
         d->nch > 0 ? d->ch_stage[chunk] : -1, d->rank, name, mb, rc);
    return XMESH_ERR_INVALID_USAGE;
}

/* Activation bytes held by this rank: the sum over its stages. */
static void act_bytes(xmp_driver_t *d)
{
    int64_t b = 0;
    int any = 0;
    for (int c = 0; c < d->nch; c++)
        if (d->ch_ops[c].activation_bytes) {
            b += d->ch_ops[c].activation_bytes(d->ch_ops[c].user);
            any = 1;
        }
    if (any && b > d->peak_bytes)
        d->peak_bytes = b;
}

static xmesh_result_t run_compute(xmp_driver_t *d, xmp_action_t a)
{
    const int c = a.chunk;
    const xmp_stage_ops_t *o = &d->ch_ops[c];
    const int nin = d->nin[c], nout = d->nout[c], *in_e = d->in_e[c], *out_e = d->out_e[c];
    void **A = d->argbuf, **B = d->argbuf + nin + nout + 1;
    int rc = 0;
    double loss = 0;
    switch (a.kind) {
    case XMP_ACT_F:
        for (int k = 0; k < nin; k++)
            A[k] = d->plans[xmp_plan_index(in_e[k], XMP_DIR_ACT)].rbuf[a.mb];
        for (int k = 0; k < nout; k++)
            B[k] = d->plans[xmp_plan_index(out_e[k], XMP_DIR_ACT)].sbuf[a.mb];
        if (o->forward == NULL)
            return cb_fail(d, c, "forward (NULL)", a.mb, -1);
        rc = o->forward(o->user, a.mb, (const void *const *)A, B, &loss);
        d->loss_acc += loss;
        if (rc)
            return cb_fail(d, c, "forward", a.mb, rc);
        if (++d->held > d->peak_held)
            d->peak_held = d->held;
        break;
    case XMP_ACT_B:
    case XMP_ACT_I:
        for (int k = 0; k < nout; k++)
            A[k] = d->plans[xmp_plan_index(out_e[k], XMP_DIR_GRAD)].rbuf[a.mb];
        for (int k = 0; k < nin; k++)
            B[k] = d->plans[xmp_plan_index(in_e[k], XMP_DIR_GRAD)].sbuf[a.mb];
        if (a.kind == XMP_ACT_B && o->backward) {
            rc = o->backward(o->user, a.mb, (const void *const *)A, B);
            if (rc)
                return cb_fail(d, c, "backward", a.mb, rc);
        } else {
            if (o->backward_input == NULL)
                return cb_fail(d, c, "backward_input (NULL)", a.mb, -1);
            rc = o->backward_input(o->user, a.mb, (const void *const *)A, B);
            if (rc)
                return cb_fail(d, c, "backward_input", a.mb, rc);
            if (a.kind == XMP_ACT_B) {
                act_bytes(d);
                if (o->backward_weight && (rc = o->backward_weight(o->user, a.mb)) != 0)
                    return cb_fail(d, c, "backward_weight", a.mb, rc);
            }
        }
        if (a.kind == XMP_ACT_B)
            d->held--;
        break;
    case XMP_ACT_W:
        if (o->backward_weight && (rc = o->backward_weight(o->user, a.mb)) != 0)
            return cb_fail(d, c, "backward_weight", a.mb, rc);
        d->held--;
        break;
    case XMP_ACT_R: /* every stage of the group */
        for (int k = 0; k < d->nch; k++) {
            o = &d->ch_ops[k];
            if (o->reduce_grads && (rc = o->reduce_grads(o->user)) != 0)
                return cb_fail(d, k, "reduce_grads", -1, rc);
        }
        break;
    case XMP_ACT_O:
        for (int k = 0; k < d->nch; k++) {
            o = &d->ch_ops[k];
            if (o->optimizer_step && (rc = o->optimizer_step(o->user)) != 0)
                return cb_fail(d, k, "optimizer_step", -1, rc);
        }
        break;
    }
    act_bytes(d);
    return XMESH_SUCCESS;
}

static xmesh_result_t run_action(xmp_driver_t *d, xmp_action_t a)
{
    if (a.kind == XMP_ACT_START || a.kind == XMP_ACT_WAIT) {
        int p = xmp_plan_index(a.edge, a.dir);
        plan_t *pl = &d->plans[p]; /* the edge's own blocks */
        int q = pl->lead;          /* the bundle that moves them */
        plan_t *bl = &d->plans[q];
        xmesh_result_t r;
        int late = d->cfg.mode == XMP_COMM_BLOCKING && pl->role == 1;
        if (a.kind == XMP_ACT_START) {
            if (late)
                return XMESH_SUCCESS; /* blocking mode: the receive starts at its wait */
            /* both stages on this group: one request per microbatch, issued at the send
             * (the receive buffer is always there) */
            if (pl->role == 2 &&
                d->ch_stage[a.chunk] !=
                    (a.dir == XMP_DIR_ACT ? d->edges[a.edge].src : d->edges[a.edge].dst))
                return XMESH_SUCCESS;
            if (bl->queued[a.mb])
                return XMESH_SUCCESS; /* the first start of its slot issued the bundle */
            bl->queued[a.mb] = 1;
            bl->queue[bl->qtail++] = a.mb;
            return issue(d, q);
        }
        if (late && !bl->queued[a.mb]) {
            bl->queued[a.mb] = 1;
            bl->queue[bl->qtail++] = a.mb;
            if ((r = issue(d, q)) != XMESH_SUCCESS)
                return r;
        }
        double t0 = MPI_Wtime();
        r = wait_for(d, q, a.mb);
        double t1 = MPI_Wtime();
        d->wait_s += t1 - t0;
        int e = a.edge;
        int recv_stage = a.dir == XMP_DIR_ACT ? d->edges[e].dst : d->edges[e].src;
        int64_t flow =
            p == q && (pl->role == 1 || (pl->role == 2 && d->ch_stage[a.chunk] == recv_stage)) &&
                    d->rank == lead_rank(d, recv_stage)
                ? flow_id(d, p, a.mb)
                : 0;
        record(d, TR_WAIT, a, t0, t1, flow);
        if (r == XMESH_SUCCESS && pl->wbuf != NULL && pl->rbuf[a.mb] != NULL) {
            /* boundary dtype: widen the received wire block for the callbacks */
            r = xmesh_convert(pl->dtype, pl->rbuf[a.mb], pl->wire, pl->wbuf[a.mb], pl->relems);
            if (r != XMESH_SUCCESS)
                derr(d, "converting %c%d.e%d from %s on rank %d: %s", a.dir ? 'G' : 'A', a.mb,
                     a.edge, xmesh_dtype_name(pl->wire), d->rank, xmesh_last_error());
        }
        return r;
    }
    double t0 = MPI_Wtime();
    xmesh_result_t r = run_compute(d, a);
    double t1 = MPI_Wtime();
    d->compute_s += t1 - t0;
    record(d, TR_COMPUTE, a, t0, t1, 0);
    return r;
}

xmesh_result_t xmp_driver_step(xmp_driver_t *d, xmp_step_stats_t *stats)
{
    xmesh_result_t r = XMESH_SUCCESS;
    const xmp_schedule_t *s = d->cfg.sched;
    for (int p = 0; p < d->P; p++) {
        plan_t *pl = &d->plans[p];
        pl->qhead = pl->qtail = 0;
        memset(pl->done, 0, (size_t)d->M);
        memset(pl->queued, 0, (size_t)d->M);
        if (d->cfg.mode == XMP_COMM_SIGNAL && (pl->role == 1 || pl->role == 2))
            for (int m = 0; m < d->M; m++)
                memset(pl->rbuf[m], 0, pl->rbytes ? pl->rbytes : 1);
    }
    d->compute_s = d->wait_s = d->loss_acc = 0;
    d->held = d->peak_held = 0;
    d->peak_bytes = 0;
    if ((r = xmp_barrier(d->cfg.comm, "driver step start")) != XMESH_SUCCESS) {
        derr(d, "%s", xmp_last_error());
        (void)xmp_fail_here(d->cfg.comm, d->err);
        return r;
    }
    xmesh_ctx_stats_t x0, x1;
    memset(&x0, 0, sizeof x0);
    memset(&x1, 0, sizeof x1);
    if (d->cfg.ctx)
        xmesh_ctx_get_stats(d->cfg.ctx, &x0);
    double t_start = MPI_Wtime();
    bind_progress(d, 1);
    if (d->group >= 0) {
        for (int j = 0; j < s->len[d->group] && r == XMESH_SUCCESS; j++) {
            r = progress_all(d);
            if (r == XMESH_SUCCESS)
                r = run_action(d, s->acts[d->group][j]);
        }
    }
    bind_progress(d, 0);
    double local = MPI_Wtime() - t_start;
    if (d->cfg.ctx)
        xmesh_ctx_get_stats(d->cfg.ctx, &x1);
    /* One closing all-reduce (step time) with the engine's deadline. A rank whose step failed
     * here does not join it: it tells the others (a notice naming the rank that does not answer,
     * if one does not, else itself), so their all-reduce ends at once instead of at the
     * timeout. On success every request of the step has been waited for. */
    double step = local;
    if (r != XMESH_SUCCESS) {
        (void)xmp_fail_here(d->cfg.comm, d->err);
    } else if ((r = xmp_agree(&step, 1, MPI_DOUBLE, MPI_MAX, d->cfg.comm, "driver step outcome")) !=
               XMESH_SUCCESS) {
        derr(d, "%s", xmp_last_error());
        (void)xmp_fail_here(d->cfg.comm, d->err);
        step = local;
    }
    d->step_no++;
    if (stats) {
        memset(stats, 0, sizeof(*stats));
        stats->loss = d->loss_acc;
        stats->step_s = step;
        stats->local_s = local;
        stats->compute_s = d->compute_s;
        stats->bubble = local > 0 ? (local - d->compute_s) / local : 0;
        stats->wait_s = d->wait_s;
        stats->peak_act_mb = d->peak_held;
        stats->peak_act_bytes = d->peak_bytes;
        stats->xmesh_cpu_s =
            (x1.progress_cpu_s - x0.progress_cpu_s) + (x1.wait_cpu_s - x0.wait_cpu_s);
        stats->xmesh_staged_bytes = x1.staged_bytes - x0.staged_bytes;
    }
    return r;
}

xmesh_result_t xmp_driver_predict(xmp_driver_t *d, const double *f, const double *i,
                                  const double *w, xmp_sim_result_t *res)
{
    xmp_sim_costs_t c;
    memset(&c, 0, sizeof(c));
    c.f = f;
    c.i = i;
    c.w = w;
    return xmp_driver_predict_costs(d, &c, res);
}

xmesh_result_t xmp_driver_plan_seconds(xmp_driver_t *d, double *x)
{
    for (int p = 0; p < d->P; p++) {
        xmesh_plan_info_t info;
        x[p] = 0; /* a bundle's transfer time is its lead's */
        if (d->plans[p].lead != p)
            continue;
        if (xmesh_plan_get_info(d->plans[p].plan, &info) != XMESH_SUCCESS) {
            derr(d, "xmesh_plan_get_info: %s", xmesh_last_error());
            return XMESH_ERR_INTERNAL;
        }
        x[p] = info.predicted_s;
    }
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_driver_predict_costs(xmp_driver_t *d, const xmp_sim_costs_t *costs,
                                        xmp_sim_result_t *res)
{
    double *x = calloc((size_t)(d->P ? d->P : 1), sizeof(double));
    if (x == NULL)
        return XMESH_ERR_NO_MEMORY;
    if (xmp_driver_plan_seconds(d, x) != XMESH_SUCCESS) {
        free(x);
        return XMESH_ERR_INTERNAL;
    }
    xmp_sim_costs_t c = *costs;
    c.xfer = x;
    c.late_recv = d->cfg.mode == XMP_COMM_BLOCKING;
    c.share_nic = 1; /* the plans of a stage's edges leave through the same NICs */
    int r = xmp_sim_run(d->cfg.sched, &c, res, d->err, sizeof(d->err));
    free(x);
    return r == 0 ? XMESH_SUCCESS : XMESH_ERR_INVALID_USAGE;
}

double xmp_driver_mean_act_seconds(xmp_driver_t *d)
{
    if (!d || d->cfg.mode == XMP_COMM_SIGNAL || d->cfg.nedges == 0)
        return 0;
    double sum = 0;
    for (int e = 0; e < d->cfg.nedges; e++) {
        xmesh_plan_info_t info;
        const plan_t *pl = &d->plans[xmp_plan_index(e, XMP_DIR_ACT)];
        if (pl->lead == xmp_plan_index(e, XMP_DIR_ACT) &&
            xmesh_plan_get_info(pl->plan, &info) == XMESH_SUCCESS)
            sum += info.predicted_s; /* a bundle counted once, on its lead */
    }
    return sum / d->cfg.nedges;
}

xmesh_result_t xmp_driver_boundary_bytes(xmp_driver_t *d, int64_t *wire, int64_t *cross_host)
{
    int64_t w = 0, x = 0;
    for (int p = 0; p < d->P; p++) {
        xmesh_plan_info_t info;
        memset(&info, 0, sizeof info); /* a bundle's bytes are counted on its lead */
        if (d->plans[p].lead == p &&
            xmesh_plan_get_info(d->plans[p].plan, &info) != XMESH_SUCCESS) {
            derr(d, "xmesh_plan_get_info: %s", xmesh_last_error());
            return XMESH_ERR_INTERNAL;
        }
        const xmp_edge_cfg_t *ec = &d->edges[p / 2];
        int64_t n = 1;
        if (d->cfg.mode != XMP_COMM_SIGNAL)
            for (int k = 0; k < ec->ndim; k++)
                n *= ec->shape[k];
        w += n * (int64_t)xmesh_dtype_size(d->cfg.mode == XMP_COMM_SIGNAL ? XMESH_U8
                                                                          : d->plans[p].wire);
        x += info.bytes_cross_host;
    }
    if (wire)
        *wire = w * d->M;
    if (cross_host)
        *cross_host = x * d->M;
    return XMESH_SUCCESS;
}

/* ---------------------------------------------------------------- trace */

static int ev_json(const xmp_driver_t *d, const ev_t *e, char *buf, size_t n)
{
    static const char *tname[] = {"compute", "transfers", "waits"};
    char lab[32];
    xmp_action_t a = {e->kind, e->mb, e->edge, e->dir, e->chunk};
    int stage = d->nch > 0 && e->chunk < d->nch ? d->ch_stage[e->chunk] : d->stage;
    if (e->track == TR_XFER)
        snprintf(lab, sizeof(lab), "%c%d.e%d", e->dir ? 'G' : 'A', e->mb, e->edge);
    else
        xmp_action_format(a, lab, sizeof(lab));
    double ts = e->t0 * 1e6, dur = (e->t1 - e->t0) * 1e6;
    int k = snprintf(buf, n,
                     "{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,"
                     "\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"stage\":%d,\"mb\":%d}}",
                     lab, tname[e->track], d->rank, e->track, ts, dur, stage, e->mb);
    if (e->flow > 0 && k > 0 && (size_t)k < n) {
        if (e->track == TR_XFER)
            k += snprintf(buf + k, n - (size_t)k,
                          ",\n{\"name\":\"xfer\",\"cat\":\"flow\",\"ph\":\"s\",\"id\":%lld,"
                          "\"pid\":%d,\"tid\":%d,\"ts\":%.3f}",
                          (long long)e->flow, d->rank, e->track, ts);
        else
            k += snprintf(buf + k, n - (size_t)k,
                          ",\n{\"name\":\"xfer\",\"cat\":\"flow\",\"ph\":\"f\",\"bp\":\"e\","
                          "\"id\":%lld,\"pid\":%d,\"tid\":%d,\"ts\":%.3f}",
                          (long long)e->flow, d->rank, e->track, ts + dur);
    }
    return k;
}

xmesh_result_t xmp_driver_write_trace(xmp_driver_t *d, const char *path)
{
    size_t cap = 512 + d->nev * 640, len = 0;
    char *mine = malloc(cap);
    int ok = mine != NULL;
    if (ok) {
        static const char *tname[] = {"compute", "transfers", "waits"};
        len += (size_t)snprintf(mine + len, cap - len,
                                "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{"
                                "\"name\":\"rank %d stage %d\"}}",
                                d->rank, d->rank, d->stage);
        for (int t = 0; t < 3; t++)
            len += (size_t)snprintf(mine + len, cap - len,
                                    ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%"
                                    "d,\"args\":{\"name\":\"%s\"}}",
                                    d->rank, t, tname[t]);
        for (size_t i = 0; i < d->nev; i++) {
            mine[len++] = ',';
            mine[len++] = '\n';
            len += (size_t)ev_json(d, &d->ev[i], mine + len, cap - len);
        }
    }
    int n = ok ? (int)len : 0;
    int *lens = NULL, *displs = NULL;
    char *all = NULL;
    if (d->rank == 0) {
        lens = calloc((size_t)d->size, sizeof(int));
        displs = calloc((size_t)d->size, sizeof(int));
    }
    xmesh_result_t r = xmp_gather(&n, 1, lens, MPI_INT, 0, d->cfg.comm, "trace lengths");
    if (r != XMESH_SUCCESS) {
        derr(d, "trace: %s", xmp_last_error());
        free(lens);
        free(displs);
        free(mine);
        return r;
    }
    long total = 0;
    if (d->rank == 0) {
        for (int i = 0; i < d->size; i++) {
            displs[i] = (int)total;
            total += lens[i];
        }
        all = malloc((size_t)total + 1);
    }
    r = xmp_gatherv(mine, n, all, lens, displs, MPI_CHAR, 0, d->cfg.comm, "trace events");
    if (r != XMESH_SUCCESS) {
        derr(d, "trace: %s", xmp_last_error());
        free(lens);
        free(displs);
        free(all);
        free(mine);
        return r;
    }
    r = ok ? XMESH_SUCCESS : XMESH_ERR_NO_MEMORY;
    if (d->rank == 0) {
        FILE *f = all ? fopen(path, "w") : NULL;
        if (f == NULL) {
            derr(d, "trace: cannot write '%s'", path);
            r = XMESH_ERR_SYSTEM;
        } else {
            fputs("[\n", f);
            for (int i = 0; i < d->size; i++) {
                if (lens[i] == 0)
                    continue;
                if (i > 0)
                    fputs(",\n", f);
                fwrite(all + displs[i], 1, (size_t)lens[i], f);
            }
            fputs("\n]\n", f);
            if (fclose(f) != 0)
                r = XMESH_ERR_SYSTEM;
        }
    }
    free(lens);
    free(displs);
    free(all);
    free(mine);
    return r;
}
