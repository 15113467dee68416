/*
 * Task splitting: cut unit tasks into smaller boxes with the same holders
 * and receivers, so several sender hosts (paper 002 eq. 4 balances whole
 * tasks only) and several NICs per host (left to future work in paper
 * section 3.1) can share one task. Each piece is an ordinary unit task, so
 * executors need nothing new. Pieces cost latency and pipeline fill each, so
 * splitting is a candidate, not always a gain: callers schedule both task
 * sets and keep the faster plan (xmesh-plan --split does).
 */
#include <stdlib.h>
#include <string.h>

#include "xm_sched_impl.h"

/* Pieces for task t: its sender-host options times NICs per host, fewer if
 * pieces would drop below one chunk or the dim cannot be cut that finely. */
static int pieces_of(const xm_prep_t *p, int t, int *dim)
{
    const xm_task_t *k = &p->ts->tasks[t];
    int want = p->pt[t].nopt * p->nics;
    /* P pieces would each still chain through every partial group's host */
    if (!xm_pc(p, t)->needs_nic || want < 2 || k->ngroups > 1)
        return 1;
    int64_t chunk = p->c->chunk_bytes > 0 ? p->c->chunk_bytes : 1;
    if (k->bytes / chunk < want)
        want = (int)(k->bytes / chunk);
    int d = -1;
    for (int i = 0; i < xm_task_ndim(p->ts, k); i++)
        if (d < 0 || k->box.hi[i] - k->box.lo[i] > k->box.hi[d] - k->box.lo[d])
            d = i;
    if (d < 0)
        return 1;
    if (k->box.hi[d] - k->box.lo[d] < want)
        want = (int)(k->box.hi[d] - k->box.lo[d]);
    *dim = d;
    return want > 1 ? want : 1;
}

xmesh_result_t xm_taskset_split(const xm_taskset_t *in, const xm_cluster_t *c, int max_tasks,
                                xm_taskset_t *out, int **parent)
{
    if (!in || !c || !out)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xm_taskset_split: %s is NULL",
                      !in  ? "task set"
                      : !c ? "cluster"
                           : "out");
    xm_prep_t p;
    xmesh_result_t r = xm_prep_init(&p, in, c, XMESH_STRATEGY_BROADCAST);
    if (r)
        return r;
    int n = in->ntasks, *k = malloc(sizeof(int) * (n + 1)), *dim = calloc(n + 1, sizeof(int));
    int *par = NULL;
    xm_taskset_t o;
    memset(&o, 0, sizeof o);
    if (!k || !dim) {
        r = XM_ERR(XMESH_ERR_NO_MEMORY, "xm_taskset_split: out of memory");
        goto out_free;
    }
    /* Split only small instances: with many tasks per sender NIC the
     * balance is already fine-grained and more tasks only cost latency. */
    int64_t total = 0, busy = 0;
    unsigned char *holder_host = calloc(p.nhosts + 1, 1);
    if (!holder_host) {
        r = XM_ERR(XMESH_ERR_NO_MEMORY, "xm_taskset_split: out of memory");
        goto out_free;
    }
    int nholder_hosts = 0;
    for (int t = 0; t < n; t++) {
        const xm_task_t *tk = &in->tasks[t];
        busy += xm_pc(&p, t)->needs_nic;
        for (int i = 0; i < tk->ngroups * tk->group_size; i++) {
            int h = p.dev_host[in->holders[tk->holder_off + i]];
            nholder_hosts += !holder_host[h];
            holder_host[h] = 1;
        }
    }
    free(holder_host);
    int small = busy < 4 * (int64_t)nholder_hosts * p.nics;
    for (int t = 0; t < n; t++) {
        k[t] = small ? pieces_of(&p, t, &dim[t]) : 1;
        total += k[t];
    }
    if (total > (max_tasks > n ? max_tasks : n)) {
        for (int t = 0; t < n; t++)
            k[t] = 1;
        total = n;
    }
    int64_t nh = 0, nr = 0;
    for (int t = 0; t < n; t++) {
        nh += (int64_t)k[t] * in->tasks[t].ngroups * in->tasks[t].group_size;
        nr += (int64_t)k[t] * in->tasks[t].nrecv;
    }
    par = parent ? malloc(sizeof(int) * (total + 1)) : NULL;
    o.tasks = malloc(sizeof *o.tasks * (total + 1));
    o.holders = malloc(sizeof(int) * (nh + 1));
    o.recvs = malloc(sizeof(int) * (nr + 1));
    if (!o.tasks || !o.holders || !o.recvs || (parent && !par)) {
        r = XM_ERR(XMESH_ERR_NO_MEMORY, "xm_taskset_split: out of memory for %lld tasks",
                   (long long)total);
        goto out_free;
    }
    o.ndim = in->ndim;
    memcpy(o.shape, in->shape, sizeof o.shape);
    o.elem_size = in->elem_size;
    /* a union's tensors and packed pieces travel along (pieces of a packed
     * task are cut by their 1-D range, so they stay valid) */
    if (in->ntensors) {
        o.tmeta = malloc(sizeof *o.tmeta * in->ntensors);
        o.pieces = malloc(sizeof *o.pieces * (in->npieces + 1));
        if (!o.tmeta || !o.pieces) {
            r = XM_ERR(XMESH_ERR_NO_MEMORY, "xm_taskset_split: out of memory");
            goto out_free;
        }
        memcpy(o.tmeta, in->tmeta, sizeof *o.tmeta * in->ntensors);
        if (in->npieces)
            memcpy(o.pieces, in->pieces, sizeof *o.pieces * in->npieces);
        o.ntensors = in->ntensors;
        o.npieces = in->npieces;
    }
    o.bytes_total = in->bytes_total;
    o.bytes_cross_host = in->bytes_cross_host;
    int m = 0, hoff = 0, roff = 0;
    for (int t = 0; t < n; t++) {
        const xm_task_t *tk = &in->tasks[t];
        int d = dim[t], nhold = tk->ngroups * tk->group_size;
        for (int i = 0; i < k[t]; i++) {
            xm_task_t *q = &o.tasks[m];
            *q = *tk;
            if (k[t] > 1) {
                int64_t lo, hi;
                xm_split(tk->box.hi[d] - tk->box.lo[d], k[t], i, &lo, &hi);
                q->box.lo[d] = tk->box.lo[d] + lo;
                q->box.hi[d] = tk->box.lo[d] + hi;
                q->bytes =
                    xm_box_volume(&q->box, xm_task_ndim(in, tk)) * (int64_t)xm_task_es(in, tk);
            }
            q->holder_off = hoff;
            memcpy(o.holders + hoff, in->holders + tk->holder_off, sizeof(int) * nhold);
            hoff += nhold;
            q->recv_off = roff;
            memcpy(o.recvs + roff, in->recvs + tk->recv_off, sizeof(int) * tk->nrecv);
            roff += tk->nrecv;
            if (par)
                par[m] = t;
            m++;
        }
    }
    o.ntasks = m;
    *out = o;
    memset(&o, 0, sizeof o);
    if (parent)
        *parent = par;
    par = NULL;
out_free:
    free(par);
    xm_taskset_free(&o);
    free(k);
    free(dim);
    xm_prep_free(&p);
    return r;
}
