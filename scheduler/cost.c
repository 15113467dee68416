/* Cost models of the all-gather strategies and the MPI baselines, and the
 * alpha-beta least-squares fit (xm_cost.h, docs/COSTMODEL.md). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "xm_cost.h"
#include "xm_sched_impl.h"

/* Fills r2 and worst_rel of f (alpha, beta set) over the points; returns the
 * weighted sum of squared residuals. my: the weighted mean of y. */
static double fit_quality(const double *x, const double *y, const double *w, int n, double my,
                          xm_fit_t *f)
{
    double sse = 0, syy = 0;
    f->worst_rel = 0;
    for (int i = 0; i < n; i++) {
        double wi = w ? w[i] : 1, e = f->alpha + f->beta * x[i] - y[i];
        sse += wi * e * e;
        syy += wi * (y[i] - my) * (y[i] - my);
        if (y[i] != 0 && fabs(e / y[i]) > f->worst_rel)
            f->worst_rel = fabs(e / y[i]);
    }
    f->r2 = syy > 0 ? 1 - sse / syy : (sse == 0 ? 1 : 0);
    return sse;
}

xmesh_result_t xm_fit_weighted(const double *x, const double *y, const double *w, int n,
                               xm_fit_t *out)
{
    if (!x || !y || !out)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xm_fit_linear: %s is NULL",
                      !x   ? "x"
                      : !y ? "y"
                           : "out");
    if (n < 2)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xm_fit_linear: %d point(s), need at least 2", n);
    double sw = 0, sx = 0, sy = 0;
    for (int i = 0; i < n; i++) {
        if (!isfinite(x[i]) || !isfinite(y[i]))
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                          "xm_fit_linear: point %d (%g, %g) is not finite", i, x[i], y[i]);
        double wi = w ? w[i] : 1;
        if (!(wi > 0) || !isfinite(wi))
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                          "xm_fit_linear: weight %d is %g, need a finite value > 0", i, wi);
        sw += wi;
        sx += wi * x[i];
        sy += wi * y[i];
    }
    double mx = sx / sw, my = sy / sw, sxx = 0, sxy = 0, sx2 = 0, sxy0 = 0;
    for (int i = 0; i < n; i++) {
        double wi = w ? w[i] : 1;
        sxx += wi * (x[i] - mx) * (x[i] - mx);
        sxy += wi * (x[i] - mx) * (y[i] - my);
        sx2 += wi * x[i] * x[i];
        sxy0 += wi * x[i] * y[i];
    }
    if (!(sxx > 0))
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                      "xm_fit_linear: all %d x values equal %g: the slope is undefined", n, x[0]);
    xm_fit_t f;
    f.n = n;
    f.beta = sxy / sxx;
    f.alpha = my - f.beta * mx;
    if (f.alpha >= 0 && f.beta >= 0) {
        fit_quality(x, y, w, n, my, &f);
        *out = f;
        return XMESH_SUCCESS;
    }
    /* A negative latency or inverse bandwidth means nothing physical (noise, or a sweep whose
     * small sizes ride a burst allowance). The sum of squares is convex, so with its free
     * minimum outside alpha, beta >= 0 the constrained minimum lies on an edge: alpha = 0
     * (beta = sum w x y / sum w x^2, at least 0) or beta = 0 (alpha = the weighted mean of y,
     * at least 0). The edge with the smaller sum of squares wins; ties keep the slope. */
    xm_fit_t a0 = f, b0 = f;
    a0.alpha = 0;
    a0.beta = sx2 > 0 && sxy0 > 0 ? sxy0 / sx2 : 0;
    b0.beta = 0;
    b0.alpha = my > 0 ? my : 0;
    double sa = fit_quality(x, y, w, n, my, &a0), sb = fit_quality(x, y, w, n, my, &b0);
    *out = sb < sa ? b0 : a0;
    return XMESH_SUCCESS;
}

xmesh_result_t xm_fit_linear(const double *x, const double *y, int n, xm_fit_t *out)
{
    return xm_fit_weighted(x, y, NULL, n, out);
}

static double inter_bw(const xm_cluster_t *c)
{
    return c->nic_send_Bps < c->nic_recv_Bps ? c->nic_send_Bps : c->nic_recv_Bps;
}

int xm_hop_fill(const xm_cluster_t *c, int64_t K, int prev_inter, int inter)
{
    return xm_hop_fill_inline(c, K, prev_inter, inter);
}

double xm_cost_chain(const xm_cluster_t *c, const int *devs, int len, int64_t bytes)
{
    if (bytes <= 0)
        return len > 1 ? c->latency_s * (len - 1) : c->latency_s;
    if (len <= 1)
        return c->latency_s + (double)bytes / c->intra_Bps;
    int64_t C = c->chunk_bytes > 0 ? c->chunk_bytes : (int64_t)1 << 20;
    int64_t K = (bytes + C - 1) / C;
    double ch = (double)bytes / (double)K;
    double sum = 0, bmin = INFINITY, fill0 = 1;
    const int *host = c->hosts.host_of;
    int prev_inter = 0;
    for (int h = 0; h + 1 < len; h++) {
        int inter = host[devs[h]] != host[devs[h + 1]];
        double bw = inter ? inter_bw(c) : c->intra_Bps;
        double fill = xm_hop_fill(c, K, prev_inter, inter);
        if (h == 0)
            fill0 = fill;
        sum += c->latency_s + fill * ch / bw;
        if (bw < bmin)
            bmin = bw;
        prev_inter |= inter; /* a hop between hosts upstream paces the rest */
    }
    return sum + ((double)K - fill0) * ch / bmin;
}

/* ------------------------------------------------------------ resources */

/* Per-resource busy seconds: NIC directions 2 * nic + {0 send, 1 recv},
 * then each device's intra-host send and receive (2 * nnics + 2 * dev +
 * {0, 1}). */
typedef struct {
    const xm_cluster_t *c;
    int nnics, ndev, nres;
    int *dev_nic;
    double *load;
    int *touched; /* resources with a nonzero load, ntouched of them */
    int ntouched;
} res_t;

static int res_init(res_t *r, const xm_cluster_t *c)
{
    memset(r, 0, sizeof *r);
    r->c = c;
    r->ndev = c->hosts.ndev;
    int nics = c->nics_per_host > 0 ? c->nics_per_host : 1;
    r->nnics = c->hosts.nhosts * nics;
    r->nres = 2 * r->nnics + 2 * r->ndev;
    r->dev_nic = malloc(sizeof(int) * (size_t)(r->ndev + 1));
    r->load = calloc((size_t)r->nres + 1, sizeof(double));
    r->touched = malloc(sizeof(int) * ((size_t)r->nres + 1));
    int *cnt = calloc((size_t)c->hosts.nhosts + 1, sizeof(int));
    if (!r->dev_nic || !r->load || !r->touched || !cnt) {
        free(cnt);
        return -1;
    }
    for (int d = 0; d < r->ndev; d++) {
        int h = c->hosts.host_of[d];
        r->dev_nic[d] = h * nics + cnt[h]++ % nics;
    }
    free(cnt);
    return 0;
}

static void res_free(res_t *r)
{
    free(r->dev_nic);
    free(r->load);
    free(r->touched);
}

static void res_add(res_t *r, int i, double s)
{
    if (r->load[i] == 0 && s > 0)
        r->touched[r->ntouched++] = i;
    r->load[i] += s;
}

/* Clears the loads in O(touched). */
static void res_reset(res_t *r)
{
    for (int k = 0; k < r->ntouched; k++)
        r->load[r->touched[k]] = 0;
    r->ntouched = 0;
}

/* Adds a transfer of bytes from a to b to the loads (a == b: nothing, a
 * local copy the harness does outside the network). */
static void res_flow(res_t *r, int a, int b, double bytes)
{
    const xm_cluster_t *c = r->c;
    if (a == b)
        return;
    if (c->hosts.host_of[a] != c->hosts.host_of[b]) {
        /* one rail at both ends, the sender's: the UCX runner's rail of a
         * hop without a scheduled one (xm_pstep_t.rail_in) */
        int nics = r->nnics / c->hosts.nhosts;
        res_add(r, XM_DIR_SEND(r->dev_nic[a]), bytes / c->nic_send_Bps);
        res_add(r, XM_DIR_RECV(c->hosts.host_of[b] * nics + r->dev_nic[a] % nics),
                bytes / c->nic_recv_Bps);
    } else {
        res_add(r, 2 * r->nnics + 2 * a, bytes / c->intra_Bps);
        res_add(r, 2 * r->nnics + 2 * b + 1, bytes / c->intra_Bps);
    }
}

static double res_max(const res_t *r)
{
    double m = 0;
    for (int k = 0; k < r->ntouched; k++)
        if (r->load[r->touched[k]] > m)
            m = r->load[r->touched[k]];
    return m;
}

static int valid(const xm_taskset_t *ts, const xm_cluster_t *c)
{
    if (!ts || !c || !c->hosts.host_of || c->hosts.ndev <= 0)
        return 0;
    if (!(c->nic_send_Bps > 0) || !(c->nic_recv_Bps > 0) || !(c->intra_Bps > 0))
        return 0;
    for (int t = 0; t < ts->ntasks; t++) {
        const xm_task_t *k = &ts->tasks[t];
        for (int i = 0; i < k->ngroups * k->group_size; i++)
            if (ts->holders[k->holder_off + i] < 0 ||
                ts->holders[k->holder_off + i] >= c->hosts.ndev)
                return 0;
        for (int i = 0; i < k->nrecv; i++)
            if (ts->recvs[k->recv_off + i] < 0 || ts->recvs[k->recv_off + i] >= c->hosts.ndev)
                return 0;
    }
    return 1;
}

/* ----------------------------------------------------- xmesh all-gather */

double xm_cost_allgather(const xm_taskset_t *ts, const xm_cluster_t *c, const xm_schedule_t *s,
                         int per_host)
{
    if (!valid(ts, c) || !s || s->ntasks != ts->ntasks)
        return NAN;
    res_t r;
    double *dir_free = NULL, makespan = 0;
    int *chain = NULL, maxlen = 2;
    for (int t = 0; t < ts->ntasks; t++) {
        int need = ts->tasks[t].ngroups + ts->tasks[t].nrecv + 2;
        if (need > maxlen)
            maxlen = need;
    }
    if (res_init(&r, c) || !(dir_free = calloc((size_t)r.nres + 1, sizeof(double))) ||
        !(chain = malloc(sizeof(int) * (size_t)maxlen))) {
        makespan = NAN;
        goto out;
    }
    const int *host = c->hosts.host_of;
    for (int i = 0; i < ts->ntasks; i++) {
        int t = s->order[i];
        if (t < 0 || t >= ts->ntasks) {
            makespan = NAN;
            goto out;
        }
        const xm_task_t *k = &ts->tasks[t];
        const int *R = ts->recvs + k->recv_off;
        const int *H = ts->holders + k->holder_off;
        int G = k->ngroups, nh = G * k->group_size;
        res_reset(&r);
        double t1 = 0, t2 = 0;
        for (int g0 = 0; g0 < k->nrecv;) {
            int g1 = g0 + 1;
            while (per_host && g1 < k->nrecv && host[R[g1]] == host[R[g0]])
                g1++;
            if (!per_host)
                g1 = k->nrecv;
            int n = g1 - g0;
            for (int j = 0; j < n; j++) {
                int rcv = R[g0 + j], len = 0, self = 0, near = -1, nlocal = 0;
                int64_t b = k->bytes * (j + 1) / n - k->bytes * j / n;
                for (int q = 0; q < nh; q++) {
                    self |= H[q] == rcv;
                    nlocal += host[H[q]] == host[rcv];
                }
                for (int q = 0, m = 0; q < nh && nlocal; q++)
                    if (host[H[q]] == host[rcv] && m++ == j % nlocal)
                        near = H[q];
                if (G == 1 && self) {
                    chain[len++] = rcv;
                } else {
                    if (G == 1 && near >= 0)
                        chain[len++] = near;
                    else
                        for (int g = 0; g < G; g++)
                            chain[len++] = s->sender[(size_t)t * s->max_groups + g];
                    chain[len++] = rcv;
                }
                double T = xm_cost_chain(c, chain, len, b);
                if (T > t1)
                    t1 = T;
                for (int h = 0; h + 1 < len; h++)
                    if (host[chain[h]] != host[chain[h + 1]])
                        res_flow(&r, chain[h], chain[h + 1], (double)b);
            }
            for (int j = 0; n > 1 && j < n; j++) {
                int64_t b = k->bytes * (j + 1) / n - k->bytes * j / n;
                for (int q = 0; q < n; q++)
                    chain[q] = R[g0 + (j + q) % n];
                double T = xm_cost_chain(c, chain, n, b);
                if (T > t2)
                    t2 = T;
                for (int h = 0; h + 1 < n; h++)
                    if (host[chain[h]] != host[chain[h + 1]])
                        res_flow(&r, chain[h], chain[h + 1], (double)b);
            }
            g0 = g1;
        }
        /* only NIC directions are loaded here (intra hops are not added) */
        double dur = t1 + t2, start = 0;
        for (int q = 0; q < r.ntouched; q++) {
            int d = r.touched[q];
            if (r.load[d] + c->latency_s > dur)
                dur = r.load[d] + c->latency_s;
            if (dir_free[d] > start)
                start = dir_free[d];
        }
        double end = start + dur;
        for (int q = 0; q < r.ntouched; q++)
            dir_free[r.touched[q]] = end;
        if (end > makespan)
            makespan = end;
    }
out:
    free(chain);
    free(dir_free);
    res_free(&r);
    return makespan;
}

/* ---------------------------------------------------------- MPI methods */

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return x < y ? -1 : x > y;
}

/* Blocking MPI_Bcast per task in task order (see xm_cost.h). */
static double cost_bcast(const xm_taskset_t *ts, const xm_cluster_t *c, const int *sender, res_t *r)
{
    double *dir_free = calloc((size_t)r->nres + 1, sizeof(double));
    double *dev_free = calloc((size_t)r->ndev + 1, sizeof(double));
    int maxr = 1;
    for (int t = 0; t < ts->ntasks; t++)
        if (ts->tasks[t].nrecv > maxr)
            maxr = ts->tasks[t].nrecv;
    int *rv = malloc(sizeof(int) * (size_t)maxr);
    double makespan = 0;
    if (!dir_free || !dev_free || !rv) {
        makespan = NAN;
        goto out;
    }
    const int *host = c->hosts.host_of;
    for (int t = 0; t < ts->ntasks; t++) {
        const xm_task_t *k = &ts->tasks[t];
        if (!k->nrecv)
            continue;
        int s = sender[t], n = k->nrecv;
        memcpy(rv, ts->recvs + k->recv_off, sizeof(int) * (size_t)n);
        qsort(rv, (size_t)n, sizeof(int), cmp_int);
        double B = (double)k->bytes;
        res_reset(r);
        /* root -> leader: one whole message */
        double bw = host[s] != host[rv[0]] ? inter_bw(c) : c->intra_Bps;
        double dur = s == rv[0] ? 0 : c->latency_s + B / bw;
        /* pipelined binary tree over the receivers: the busiest link plus
         * one latency per level */
        int depth = 0;
        for (int m = 1; m < n; m = 2 * m + 1)
            depth++;
        for (int i = 1; i < n; i++)
            res_flow(r, rv[(i - 1) / 2], rv[i], B);
        double tree = n > 1 ? res_max(r) + depth * c->latency_s : 0;
        dur += tree;
        res_flow(r, s, rv[0], B); /* the directions the task holds */
        double start = dev_free[s];
        for (int i = 0; i < n; i++)
            if (dev_free[rv[i]] > start)
                start = dev_free[rv[i]];
        for (int q = 0; q < r->ntouched; q++)
            if (r->touched[q] < 2 * r->nnics && dir_free[r->touched[q]] > start)
                start = dir_free[r->touched[q]];
        double end = start + dur;
        for (int q = 0; q < r->ntouched; q++)
            if (r->touched[q] < 2 * r->nnics)
                dir_free[r->touched[q]] = end;
        dev_free[s] = end;
        for (int i = 0; i < n; i++)
            dev_free[rv[i]] = end;
        if (end > makespan)
            makespan = end;
    }
out:
    free(dir_free);
    free(dev_free);
    free(rv);
    return makespan;
}

/* One phase of the send/recv + all-gather method, over the groups of a
 * task's receivers on one host (n of them): phase 1, the sender sends each
 * receiver 1/n of the box; phase 2, a group with n > 1 all-gathers (every
 * receiver sends its 1/n to each other one). Returns 1 if a flow was added. */
static int allgather_phase(res_t *r, const xm_taskset_t *ts, const int *sender, const int *host,
                           int phase)
{
    int any = 0;
    for (int t = 0; t < ts->ntasks; t++) {
        const xm_task_t *k = &ts->tasks[t];
        const int *R = ts->recvs + k->recv_off;
        for (int g0 = 0; g0 < k->nrecv;) {
            int g1 = g0 + 1;
            while (g1 < k->nrecv && host[R[g1]] == host[R[g0]])
                g1++;
            int n = g1 - g0;
            for (int a = 0; a < n; a++) {
                if (phase == 1) {
                    res_flow(r, sender[t], R[g0 + a], (double)k->bytes / n);
                    any = 1;
                    continue;
                }
                for (int b = 0; b < n && n > 1; b++)
                    if (a != b) {
                        res_flow(r, R[g0 + a], R[g0 + b], (double)k->bytes / n);
                        any = 1;
                    }
            }
            g0 = g1;
        }
    }
    return any;
}

double xm_cost_mpi(const xm_taskset_t *ts, const xm_cluster_t *c, const int *sender,
                   xm_cost_mpi_t method)
{
    if (!valid(ts, c) || !sender)
        return NAN;
    for (int t = 0; t < ts->ntasks; t++)
        if (ts->tasks[t].ngroups != 1 || sender[t] < 0 || sender[t] >= c->hosts.ndev)
            return NAN;
    res_t r;
    if (res_init(&r, c)) {
        res_free(&r);
        return NAN;
    }
    const int *host = c->hosts.host_of;
    double T = NAN;
    switch (method) {
    case XM_COST_MPI_BCAST:
        T = cost_bcast(ts, c, sender, &r);
        break;
    case XM_COST_MPI_IBCAST:
    case XM_COST_MPI_ALLTOALLV:
        for (int t = 0; t < ts->ntasks; t++) {
            const xm_task_t *k = &ts->tasks[t];
            for (int j = 0; j < k->nrecv; j++)
                res_flow(&r, sender[t], ts->recvs[k->recv_off + j], (double)k->bytes);
        }
        T = res_max(&r) + c->latency_s;
        break;
    case XM_COST_MPI_SENDRECV_ALLGATHER: {
        /* phase 1: the slices, all at once */
        allgather_phase(&r, ts, sender, host, 1);
        double t1 = res_max(&r) + c->latency_s;
        /* phase 2: per host and task an all-gather, all at once */
        res_reset(&r);
        int any = allgather_phase(&r, ts, sender, host, 2);
        T = t1 + (any ? res_max(&r) + c->latency_s : 0);
        break;
    }
    }
    res_free(&r);
    return T;
}
