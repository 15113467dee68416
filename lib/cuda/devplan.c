/* Device-independent half of the NCCL backend (see xm_devplan.h). */
#include <stdlib.h>
#include <string.h>

#include "xm_devplan.h"

/* ----------------------------------------------------------- chunk plans */

void xm_chunkplan_make(const xm_box_t *box, int ndim, size_t elem_size, int64_t chunk_bytes,
                       xm_chunkplan_t *out)
{
    xm_chunkplan_t p;
    memset(&p, 0, sizeof p);
    p.ndim = ndim;
    p.box = *box;
    p.split_dim = -1;
    int64_t vol = xm_box_volume(box, ndim);
    if (vol <= 0) {
        *out = p;
        return;
    }
    if (ndim == 0) {
        p.nchunks = 1;
        *out = p;
        return;
    }
    if (chunk_bytes < (int64_t)elem_size)
        chunk_bytes = (int64_t)elem_size;
    /* The outermost dim whose single index fits a chunk is split in runs;
     * all dims before it advance one index per chunk. This keeps chunks as
     * large as allowed and every chunk a box, so each is packed on its own
     * and the receiver can unpack chunk c while chunk c + 1 is in flight. */
    int64_t inner = (int64_t)elem_size;
    int k = ndim - 1;
    for (int d = ndim - 1; d >= 0; d--) {
        if (inner > chunk_bytes)
            break;
        k = d;
        inner *= box->hi[d] - box->lo[d];
    }
    /* inner now overshoots; recompute the bytes of one index of dim k. */
    int64_t row = (int64_t)elem_size;
    for (int d = k + 1; d < ndim; d++)
        row *= box->hi[d] - box->lo[d];
    int64_t ext = box->hi[k] - box->lo[k];
    int64_t step = chunk_bytes / row;
    if (step < 1)
        step = 1;
    if (step > ext)
        step = ext;
    int64_t nouter = 1;
    for (int d = 0; d < k; d++)
        nouter *= box->hi[d] - box->lo[d];
    p.split_dim = k;
    p.step = step;
    p.nsplit = (ext + step - 1) / step;
    p.nchunks = nouter * p.nsplit;
    *out = p;
}

void xm_chunkplan_chunk(const xm_chunkplan_t *p, int64_t c, xm_box_t *out)
{
    xm_box_t b = p->box;
    if (p->split_dim < 0) {
        *out = b;
        return;
    }
    int k = p->split_dim;
    int64_t outer = c / p->nsplit, j = c % p->nsplit;
    for (int d = k - 1; d >= 0; d--) {
        int64_t e = p->box.hi[d] - p->box.lo[d];
        b.lo[d] = p->box.lo[d] + outer % e;
        b.hi[d] = b.lo[d] + 1;
        outer /= e;
    }
    b.lo[k] = p->box.lo[k] + j * p->step;
    b.hi[k] = b.lo[k] + p->step < p->box.hi[k] ? b.lo[k] + p->step : p->box.hi[k];
    *out = b;
}

/* ----------------------------------------------------- pack descriptors */

void xm_packdesc_make(int ndim, const int64_t *blk_lo, const int64_t *blk_hi, const xm_box_t *box,
                      xm_packdesc_t *out)
{
    xm_packdesc_t d;
    memset(&d, 0, sizeof d);
    int64_t stride[XM_MAX_DIMS], s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        stride[i] = s;
        s *= blk_hi[i] - blk_lo[i];
    }
    d.count = 1;
    for (int i = 0; i < ndim; i++) {
        int64_t e = box->hi[i] - box->lo[i];
        d.base += (box->lo[i] - blk_lo[i]) * stride[i];
        d.count *= e;
        if (e == 1)
            continue; /* contributes only to base */
        if (d.ndim > 0 && d.stride[d.ndim - 1] == e * stride[i]) {
            /* contiguous with the previous kept dim: merge */
            d.ext[d.ndim - 1] *= e;
            d.stride[d.ndim - 1] = stride[i];
            continue;
        }
        d.ext[d.ndim] = e;
        d.stride[d.ndim] = stride[i];
        d.ndim++;
    }
    if (d.count == 0)
        d.base = 0;
    if (d.ndim == 0 || d.count == 0) {
        d.ndim = 1;
        d.ext[0] = d.count;
        d.stride[0] = 1;
    }
    *out = d;
}

/* ------------------------------------------------------- step programs */

static int box_inside(int ndim, const xm_box_t *b, const int64_t *lo, const int64_t *hi)
{
    for (int d = 0; d < ndim; d++)
        if (b->lo[d] < lo[d] || b->hi[d] > hi[d])
            return 0;
    return 1;
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* ------------------------------------------------------------ vroutes */

typedef struct {
    xm_vroutes_t v;
    int cap_r, cap_d;
} vbuild_t;

static int vb_reserve(vbuild_t *b, int nr, int nd)
{
    if (b->v.n + nr > b->cap_r) {
        int c = 2 * b->cap_r + nr + 16;
        xm_vroute_t *r = realloc(b->v.r, sizeof *r * c);
        if (!r)
            return -1;
        b->v.r = r;
        b->cap_r = c;
    }
    int used = b->v.n ? b->v.r[b->v.n - 1].off + b->v.r[b->v.n - 1].len : 0;
    if (used + nd > b->cap_d) {
        int c = 2 * b->cap_d + nd + 64;
        int *d = realloc(b->v.devs, sizeof(int) * c);
        if (!d)
            return -1;
        b->v.devs = d;
        b->cap_d = c;
    }
    return 0;
}

static int vb_add(vbuild_t *b, int task, const int *devs, int len, int nsrc, int whole,
                  int from_dst, int64_t first, int64_t count)
{
    if (vb_reserve(b, 1, len))
        return -1;
    int off = b->v.n ? b->v.r[b->v.n - 1].off + b->v.r[b->v.n - 1].len : 0;
    memcpy(b->v.devs + off, devs, sizeof(int) * len);
    b->v.r[b->v.n++] = (xm_vroute_t){.task = task,
                                     .nsrc = nsrc,
                                     .len = len,
                                     .off = off,
                                     .whole = whole,
                                     .from_dst = from_dst,
                                     .first = first,
                                     .count = count};
    return 0;
}

int64_t xm_vroute_nchunks(const xm_vroute_t *v, const xm_taskset_t *ts, int64_t chunk_bytes)
{
    if (v->whole) {
        xm_chunkplan_t cp;
        xm_chunkplan_make(&ts->tasks[v->task].box, ts->ndim, ts->elem_size, chunk_bytes, &cp);
        return cp.nchunks;
    }
    int64_t ce = chunk_bytes / (int64_t)ts->elem_size;
    if (ce < 1)
        ce = 1;
    return (v->count + ce - 1) / ce;
}

void xm_vroute_chunk(const xm_vroute_t *v, const xm_taskset_t *ts, int64_t chunk_bytes, int64_t c,
                     xm_box_t *box, int64_t *first, int64_t *count)
{
    if (v->whole) {
        xm_chunkplan_t cp;
        xm_chunkplan_make(&ts->tasks[v->task].box, ts->ndim, ts->elem_size, chunk_bytes, &cp);
        xm_chunkplan_chunk(&cp, c, box);
        *first = 0;
        *count = xm_box_volume(box, ts->ndim);
        return;
    }
    int64_t ce = chunk_bytes / (int64_t)ts->elem_size;
    if (ce < 1)
        ce = 1;
    *box = ts->tasks[v->task].box;
    *first = v->first + c * ce;
    *count = v->first + v->count - *first < ce ? v->first + v->count - *first : ce;
}

/* Stage 0 and 1 chains of the all-gather strategies for task t (see
 * xm_devplan.h; the part bounds and sender rules are the MPI executor's). */
static int vb_allgather(vbuild_t *b, const xm_taskset_t *ts, const xm_schedule_t *s,
                        const xm_hostmap_t *hm, int t, int per_host, int *chain)
{
    const xm_task_t *tk = &ts->tasks[t];
    const int *R = ts->recvs + tk->recv_off, *H = ts->holders + tk->holder_off;
    const int G = tk->ngroups, mg = s->max_groups;
    const int64_t V = xm_box_volume(&tk->box, ts->ndim);
    int first_ring = -1;
    for (int pass = 0; pass < 2; pass++) {
        for (int g0 = 0; g0 < tk->nrecv;) {
            int g1 = g0 + 1;
            while (per_host && g1 < tk->nrecv && hm->host_of[R[g1]] == hm->host_of[R[g0]])
                g1++;
            if (!per_host)
                g1 = tk->nrecv;
            int k = g1 - g0;
            for (int j = 0; j < k; j++) {
                int64_t a = V * j / k, e = V * (j + 1) / k;
                if (e == a)
                    continue; /* an empty part moves nothing */
                int len = 0, nsrc = 1, rcv = R[g0 + j];
                if (pass == 1) {
                    if (k < 2)
                        continue;
                    for (int q = 0; q < k; q++)
                        chain[len++] = R[g0 + (j + q) % k];
                    if (first_ring < 0)
                        first_ring = b->v.n;
                    if (vb_add(b, t, chain, len, 1, 0, 1, a, e - a))
                        return -1;
                    continue;
                }
                int self = 0, near = -1;
                for (int i = 0; G == 1 && i < tk->group_size; i++) {
                    self |= H[i] == rcv;
                    if (near < 0 && hm->host_of[H[i]] == hm->host_of[rcv])
                        near = H[i];
                }
                if (G == 1 && self) {
                    chain[len++] = rcv; /* a self copy: len 1 */
                } else {
                    if (G == 1 && near >= 0) {
                        chain[len++] = near; /* a replica on the receiver's host */
                    } else {
                        for (int g = 0; g < G; g++)
                            chain[len++] = s->sender[t * mg + g];
                        nsrc = G;
                    }
                    chain[len++] = rcv;
                }
                if (vb_add(b, t, chain, len, nsrc, 0, 0, a, e - a))
                    return -1;
            }
            g0 = g1;
        }
    }
    return first_ring;
}

xmesh_result_t xm_vroutes_build(const xm_taskset_t *ts, const xm_schedule_t *s,
                                const xm_hostmap_t *hosts, xmesh_strategy_t strategy,
                                int64_t chunk_bytes, xm_vroutes_t *out)
{
    vbuild_t b;
    memset(&b, 0, sizeof b);
    int allgather = strategy == XMESH_STRATEGY_SENDRECV_ALLGATHER ||
                    strategy == XMESH_STRATEGY_GLOBAL_ALLGATHER;
    int maxchain = 1;
    for (int t = 0; t < ts->ntasks; t++)
        if (ts->tasks[t].ngroups + ts->tasks[t].nrecv + 1 > maxchain)
            maxchain = ts->tasks[t].ngroups + ts->tasks[t].nrecv + 1;
    int *chain = malloc(sizeof(int) * maxchain);
    b.v.task_off = malloc(sizeof(int) * (ts->ntasks + 1));
    if (!chain || !b.v.task_off)
        goto out_nomem;
    if (allgather && !hosts)
        goto out_nomem; /* cannot happen: callers pass the plan's map */
    for (int t = 0; t < ts->ntasks; t++) {
        b.v.task_off[t] = b.v.n;
        int ring = -1;
        if (allgather) {
            ring = vb_allgather(&b, ts, s, hosts, t, strategy == XMESH_STRATEGY_SENDRECV_ALLGATHER,
                                chain);
            if (ring == -1 && b.v.n == b.v.task_off[t] && ts->tasks[t].nrecv > 0 &&
                xm_box_volume(&ts->tasks[t].box, ts->ndim) > 0)
                goto out_nomem;
        } else {
            for (int q = s->task_route_off[t]; q < s->task_route_off[t + 1]; q++) {
                const xm_route_t *rt = &s->routes[q];
                if (vb_add(&b, t, s->route_devs + rt->off, rt->len, rt->nsrc, 1, 0, 0,
                           xm_box_volume(&ts->tasks[t].box, ts->ndim)))
                    goto out_nomem;
            }
        }
        /* stage 1 starts when the slowest stage-0 chain of the task is done */
        int64_t s1 = 0;
        int end = ring >= 0 ? ring : b.v.n;
        for (int q = b.v.task_off[t]; q < end; q++) {
            int64_t k =
                xm_chain_nsteps(b.v.r[q].len, xm_vroute_nchunks(&b.v.r[q], ts, chunk_bytes));
            if (k > s1)
                s1 = k;
        }
        for (int q = b.v.task_off[t]; q < b.v.n; q++)
            b.v.r[q].step0 = ring >= 0 && q >= ring ? s1 : 0;
    }
    b.v.task_off[ts->ntasks] = b.v.n;
    free(chain);
    *out = b.v;
    return XMESH_SUCCESS;
out_nomem:
    free(chain);
    xm_vroutes_free(&b.v);
    return XM_ERR(XMESH_ERR_NO_MEMORY, "device program: out of memory for %d chains", b.v.n);
}

void xm_vroutes_free(xm_vroutes_t *v)
{
    free(v->r);
    free(v->devs);
    free(v->task_off);
    memset(v, 0, sizeof *v);
}

/* ------------------------------------------------------- step programs */

xmesh_result_t xm_devprog_build(const xm_layout_t *src, const xm_layout_t *dst,
                                const xm_taskset_t *ts, const xm_schedule_t *s,
                                const xm_hostmap_t *hosts, xmesh_strategy_t strategy,
                                xmesh_dtype_t dtype, int64_t chunk_bytes, int rank,
                                xm_devprog_t *out)
{
    xmesh_result_t r = XMESH_SUCCESS;
    xm_devprog_t p;
    memset(&p, 0, sizeof p);
    p.rank = rank;
    p.dtype = dtype;
    p.elem_size = xmesh_dtype_size(dtype);
    p.acc_size = xm_dtype_acc_size(dtype);
    p.chunk_bytes = chunk_bytes;
    p.ndim = ts->ndim;
    if (!p.elem_size || p.elem_size != ts->elem_size)
        return XM_ERR(XMESH_ERR_INTERNAL, "device program: dtype %d does not match elem size %zu",
                      (int)dtype, ts->elem_size);
    int si = xm_mesh_find(&src->mesh, rank), di = xm_mesh_find(&dst->mesh, rank);
    if ((p.holds_src = si >= 0))
        xm_layout_block(src, si, p.src_lo, p.src_hi);
    if ((p.holds_dst = di >= 0))
        xm_layout_block(dst, di, p.dst_lo, p.dst_hi);
    if ((r = xm_vroutes_build(ts, s, hosts, strategy, chunk_bytes, &p.vr)))
        return r;
    const xm_vroutes_t *vr = &p.vr;

    p.task = malloc(sizeof(int) * (ts->ntasks + 1));
    p.part_off = malloc(sizeof(int) * (ts->ntasks + 1));
    int nparts = 0, npeers = 0;
    for (int i = 0; i < vr->n; i++)
        for (int k = 0; k < vr->r[i].len; k++)
            nparts += vr->devs[vr->r[i].off + k] == rank;
    p.parts = malloc(sizeof *p.parts * (nparts + 1));
    p.peers = malloc(sizeof(int) * (2 * nparts + 1));
    if (!p.task || !p.part_off || !p.parts || !p.peers) {
        r = XM_ERR(XMESH_ERR_NO_MEMORY, "device program: out of memory (%d parts)", nparts);
        goto out_free;
    }
    p.part_off[0] = 0;
    int np = 0;
    for (int k = 0; k < s->ntasks; k++) {
        int t = s->order[k];
        const xm_task_t *task = &ts->tasks[t];
        int first = np;
        for (int ri = vr->task_off[t]; ri < vr->task_off[t + 1]; ri++) {
            const xm_vroute_t *rt = &vr->r[ri];
            const int *devs = vr->devs + rt->off;
            if (rt->task != t || rt->len < 1 || rt->nsrc < 1 || rt->nsrc > rt->len ||
                (rt->len > 1 && rt->nsrc == rt->len)) {
                r = XM_ERR(XMESH_ERR_INTERNAL, "route %d of task %d: len %d nsrc %d invalid", ri, t,
                           rt->len, rt->nsrc);
                goto out_free;
            }
            for (int pos = 0; pos < rt->len; pos++) {
                if (devs[pos] != rank)
                    continue;
                /* Sources read the box from the source block (a ring head
                 * from its destination block), receivers write it to the
                 * destination block (a len-1 route does both). */
                int is_src = pos < rt->nsrc, is_dst = pos >= rt->nsrc || rt->len == 1;
                int reads_dst = is_src && rt->from_dst;
                if ((is_src && !reads_dst &&
                     (!p.holds_src || !box_inside(p.ndim, &task->box, p.src_lo, p.src_hi))) ||
                    ((is_dst || reads_dst) &&
                     (!p.holds_dst || !box_inside(p.ndim, &task->box, p.dst_lo, p.dst_hi)))) {
                    r = XM_ERR(XMESH_ERR_INTERNAL,
                               "route %d of task %d: rank %d at position %d does not %s the box",
                               ri, t, rank, pos, is_src ? "hold" : "need");
                    goto out_free;
                }
                p.parts[np].route = ri;
                p.parts[np].pos = pos;
                np++;
                if (pos > 0)
                    p.peers[npeers++] = devs[pos - 1];
                if (pos < rt->len - 1)
                    p.peers[npeers++] = devs[pos + 1];
                int64_t nch = xm_vroute_nchunks(rt, ts, chunk_bytes);
                for (int64_t c = 0; c < nch && c < 2; c++) { /* chunk 0 is the largest */
                    xm_box_t bx;
                    int64_t f, n;
                    xm_vroute_chunk(rt, ts, chunk_bytes, c, &bx, &f, &n);
                    if (n > p.slot_elems)
                        p.slot_elems = n;
                }
            }
        }
        if (np == first)
            continue;
        if (np - first > p.max_parts)
            p.max_parts = np - first;
        p.task[p.ntasks++] = t;
        p.part_off[p.ntasks] = np;
    }
    qsort(p.peers, npeers, sizeof(int), cmp_int);
    for (int i = 0; i < npeers; i++)
        if (i == 0 || p.peers[i] != p.peers[p.npeers - 1])
            p.peers[p.npeers++] = p.peers[i];
    p.nslots = 4 * p.max_parts;
    p.slot_bytes = p.slot_elems * (int64_t)(p.acc_size > p.elem_size ? p.acc_size : p.elem_size);
    *out = p;
    return XMESH_SUCCESS;
out_free:
    xm_devprog_free(&p);
    return r;
}

void xm_devprog_free(xm_devprog_t *p)
{
    xm_vroutes_free(&p->vr);
    free(p->task);
    free(p->part_off);
    free(p->parts);
    free(p->peers);
    memset(p, 0, sizeof *p);
}

int64_t xm_devprog_nsteps(const xm_devprog_t *p, const xm_taskset_t *ts, int i)
{
    int64_t n = 0;
    for (int j = p->part_off[i]; j < p->part_off[i + 1]; j++) {
        const xm_vroute_t *v = &p->vr.r[p->parts[j].route];
        int64_t k = xm_chain_nsteps(v->len, xm_vroute_nchunks(v, ts, p->chunk_bytes));
        if (k > 0 && v->step0 + k > n)
            n = v->step0 + k;
    }
    return n;
}

static void chunk_desc(const xm_devprog_t *p, const xm_taskset_t *ts, const xm_vroute_t *v,
                       int64_t c, int in_dst, xm_packdesc_t *d)
{
    xm_box_t b;
    int64_t first, count;
    xm_vroute_chunk(v, ts, p->chunk_bytes, c, &b, &first, &count);
    xm_packdesc_make(p->ndim, in_dst ? p->dst_lo : p->src_lo, in_dst ? p->dst_hi : p->src_hi, &b,
                     d);
    d->first = first;
    d->count = count;
}

int xm_devprog_step(const xm_devprog_t *p, const xm_taskset_t *ts, int i, int64_t gstep,
                    xm_op_t *ops)
{
    const int conv = p->acc_size != p->elem_size;
    int n = 0;
    for (int phase = 0; phase < 3; phase++) {
        for (int j = p->part_off[i], jl = 0; j < p->part_off[i + 1]; j++, jl++) {
            const xm_vroute_t *rt = &p->vr.r[p->parts[j].route];
            const int *devs = p->vr.devs + rt->off;
            const int pos = p->parts[j].pos, len = rt->len, nsrc = rt->nsrc;
            const int64_t step = gstep - rt->step0;
            const int64_t nch = xm_vroute_nchunks(rt, ts, p->chunk_bytes);
            xm_op_t op;
            memset(&op, 0, sizeof op);
            op.phase = phase;
            if (step < 0 || nch == 0)
                continue;
            if (len == 1) {
                if (phase == 0 && step == 0) {
                    op.kind = XM_OP_COPY;
                    const xm_box_t *b = &ts->tasks[rt->task].box;
                    xm_packdesc_make(p->ndim, p->src_lo, p->src_hi, b, &op.desc);
                    xm_packdesc_make(p->ndim, p->dst_lo, p->dst_hi, b, &op.desc2);
                    op.desc.first = op.desc2.first = rt->first;
                    op.desc.count = op.desc2.count = rt->count;
                    op.count = rt->count;
                    ops[n++] = op;
                }
                continue;
            }
            int64_t rc = xm_chain_recv_chunk(pos, step, nch);
            int64_t sc = xm_chain_send_chunk(pos, len, step, nch);
            if (phase == 0 && pos == 0 && sc >= 0) {
                op.kind = XM_OP_PACK;
                op.slot = 4 * jl + (int)(sc % 2);
                op.acc = conv && nsrc > 1;
                op.from_dst = rt->from_dst;
                chunk_desc(p, ts, rt, sc, rt->from_dst, &op.desc);
                op.count = op.desc.count;
                ops[n++] = op;
            }
            if (phase == 1 && rc >= 0) {
                xm_box_t b;
                int64_t f;
                xm_vroute_chunk(rt, ts, p->chunk_bytes, rc, &b, &f, &op.count);
                op.kind = XM_OP_RECV;
                op.peer = devs[pos - 1];
                op.slot = 4 * jl + (int)(rc % 2);
                op.acc = conv && pos <= nsrc - 1;
                ops[n++] = op;
            }
            if (phase == 1 && sc >= 0) {
                xm_box_t b;
                int64_t f;
                xm_vroute_chunk(rt, ts, p->chunk_bytes, sc, &b, &f, &op.count);
                op.kind = XM_OP_SEND;
                op.peer = devs[pos + 1];
                /* the last source of a converting chain sends the dtype copy */
                int from_out = conv && pos == nsrc - 1 && pos > 0;
                op.slot = 4 * jl + (from_out ? 2 : 0) + (int)(sc % 2);
                op.acc = conv && pos < nsrc - 1;
                ops[n++] = op;
            }
            if (phase == 2 && rc >= 0) {
                op.slot = 4 * jl + (int)(rc % 2);
                if (pos < nsrc) {
                    op.kind = XM_OP_REDUCE;
                    op.acc = conv;
                    op.convert_out = conv && pos == nsrc - 1;
                    op.out_slot = 4 * jl + 2 + (int)(rc % 2);
                    chunk_desc(p, ts, rt, rc, 0, &op.desc);
                } else {
                    op.kind = XM_OP_UNPACK;
                    chunk_desc(p, ts, rt, rc, 1, &op.desc);
                }
                op.count = op.desc.count;
                ops[n++] = op;
            }
        }
    }
    return n;
}

/* ----------------------------------------------- communicator cache */

xmesh_result_t xm_commkey_make(const int *a, int na, const int *b, int nb, xm_commkey_t *out)
{
    int *v = malloc(sizeof(int) * (na + nb + 1));
    if (!v)
        return XM_ERR(XMESH_ERR_NO_MEMORY, "communicator key: out of memory");
    if (na > 0)
        memcpy(v, a, sizeof(int) * na);
    if (nb > 0)
        memcpy(v + na, b, sizeof(int) * nb);
    qsort(v, na + nb, sizeof(int), cmp_int);
    int n = 0;
    for (int i = 0; i < na + nb; i++)
        if (n == 0 || v[i] != v[n - 1])
            v[n++] = v[i];
    out->n = n;
    out->ranks = v;
    out->hash = xm_hash64(XM_HASH_INIT, v, sizeof(int) * n);
    return XMESH_SUCCESS;
}

int xm_commkey_equal(const xm_commkey_t *a, const xm_commkey_t *b)
{
    return a->hash == b->hash && a->n == b->n && !memcmp(a->ranks, b->ranks, sizeof(int) * a->n);
}

int xm_commkey_index(const xm_commkey_t *k, int rank)
{
    int lo = 0, hi = k->n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (k->ranks[mid] == rank)
            return mid;
        if (k->ranks[mid] < rank)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

void xm_commkey_free(xm_commkey_t *k)
{
    free(k->ranks);
    k->ranks = NULL;
    k->n = 0;
}

xmesh_result_t xm_commcache_init(xm_commcache_t *c, int cap)
{
    if (cap < 1)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "communicator cache capacity %d must be >= 1",
                      cap);
    xm_commentry_t *e = calloc(cap, sizeof *e);
    if (!e)
        return XM_ERR(XMESH_ERR_NO_MEMORY, "communicator cache: out of memory");
    c->n = 0;
    c->cap = cap;
    c->clock = 0;
    c->e = e;
    return XMESH_SUCCESS;
}

int xm_commcache_find(xm_commcache_t *c, const xm_commkey_t *key)
{
    for (int i = 0; i < c->n; i++)
        if (xm_commkey_equal(&c->e[i].key, key)) {
            c->e[i].last_use = ++c->clock;
            return i;
        }
    return -1;
}

int xm_commcache_peek(const xm_commcache_t *c, const xm_commkey_t *key)
{
    for (int i = 0; i < c->n; i++)
        if (xm_commkey_equal(&c->e[i].key, key))
            return i;
    return -1;
}

int xm_commcache_victim_masked(const xm_commcache_t *c, const int *ok)
{
    if (c->n < c->cap)
        return c->n;
    int v = -1;
    for (int i = 0; i < c->n; i++)
        if (ok[i] && (v < 0 || c->e[i].last_use < c->e[v].last_use))
            v = i;
    return v;
}

int xm_commcache_victim(const xm_commcache_t *c)
{
    if (c->n < c->cap)
        return c->n;
    int v = -1;
    for (int i = 0; i < c->n; i++)
        if (c->e[i].refs == 0 && (v < 0 || c->e[i].last_use < c->e[v].last_use))
            v = i;
    return v;
}

xmesh_result_t xm_commcache_insert(xm_commcache_t *c, xm_commkey_t *key, void *comm, int *index)
{
    if (c->n >= c->cap)
        return XM_ERR(XMESH_ERR_INTERNAL, "communicator cache full (%d): evict first", c->cap);
    xm_commentry_t *e = &c->e[c->n];
    memset(e, 0, sizeof *e);
    e->key = *key;
    key->ranks = NULL;
    key->n = 0;
    e->comm = comm;
    e->last_use = ++c->clock;
    *index = c->n++;
    return XMESH_SUCCESS;
}

void xm_commcache_remove(xm_commcache_t *c, int i)
{
    xm_commkey_free(&c->e[i].key);
    /* Keep entry order stable for the survivors' relative LRU order; the
     * indices after i shift, so callers must not hold entry indices across
     * a removal (plans hold keys' entries only through find()). */
    memmove(&c->e[i], &c->e[i + 1], sizeof *c->e * (c->n - i - 1));
    c->n--;
}

void xm_commcache_free(xm_commcache_t *c)
{
    for (int i = 0; i < c->n; i++)
        xm_commkey_free(&c->e[i].key);
    free(c->e);
    memset(c, 0, sizeof *c);
}

/* --------------------------------------------- element conversions */

/* ------------------------------------------ CPU reference of the kernels */

static float load_f(const void *p, int64_t i, xmesh_dtype_t dt)
{
    uint16_t h = ((const uint16_t *)p)[i];
    return dt == XMESH_F16 ? xm_f16_to_f32(h) : xm_bf16_to_f32(h);
}

static uint16_t store_f(float v, xmesh_dtype_t dt)
{
    return dt == XMESH_F16 ? xm_f32_to_f16(v) : xm_f32_to_bf16(v);
}

void xm_ref_pack(const xm_packdesc_t *d, const void *block, void *packed, xmesh_dtype_t dtype,
                 int to_acc)
{
    size_t es = xmesh_dtype_size(dtype);
    int conv = to_acc && (dtype == XMESH_F16 || dtype == XMESH_BF16);
    for (int64_t k = 0; k < d->count; k++) {
        int64_t idx = xm_pack_index(d, k);
        if (conv)
            ((float *)packed)[k] = load_f(block, idx, dtype);
        else
            memcpy((char *)packed + k * es, (const char *)block + idx * es, es);
    }
}

void xm_ref_unpack(const xm_packdesc_t *d, const void *packed, void *block, size_t elem_size)
{
    for (int64_t k = 0; k < d->count; k++)
        memcpy((char *)block + xm_pack_index(d, k) * elem_size,
               (const char *)packed + k * elem_size, elem_size);
}

void xm_ref_copy(const xm_packdesc_t *src, const void *sblock, const xm_packdesc_t *dst,
                 void *dblock, size_t elem_size)
{
    for (int64_t k = 0; k < src->count; k++)
        memcpy((char *)dblock + xm_pack_index(dst, k) * elem_size,
               (const char *)sblock + xm_pack_index(src, k) * elem_size, elem_size);
}

void xm_ref_reduce(const xm_packdesc_t *d, const void *block, void *acc, int is_acc, void *out,
                   xmesh_dtype_t dtype)
{
    for (int64_t k = 0; k < d->count; k++) {
        int64_t i = xm_pack_index(d, k);
        switch (dtype) {
        case XMESH_F16:
        case XMESH_BF16: {
            float a = is_acc ? ((float *)acc)[k] : load_f(acc, k, dtype);
            float v = a + load_f(block, i, dtype);
            if (out)
                ((uint16_t *)out)[k] = store_f(v, dtype);
            else if (is_acc)
                ((float *)acc)[k] = v;
            else
                ((uint16_t *)acc)[k] = store_f(v, dtype);
            break;
        }
        /* Integers wrap (unsigned arithmetic: no undefined overflow). */
        case XMESH_U8:
        case XMESH_I8:
            ((uint8_t *)acc)[k] += ((const uint8_t *)block)[i];
            break;
        case XMESH_I32:
            ((uint32_t *)acc)[k] += ((const uint32_t *)block)[i];
            break;
        case XMESH_I64:
            ((uint64_t *)acc)[k] += ((const uint64_t *)block)[i];
            break;
        case XMESH_F32:
            ((float *)acc)[k] += ((const float *)block)[i];
            break;
        case XMESH_F64:
            ((double *)acc)[k] += ((const double *)block)[i];
            break;
        default:
            break;
        }
        if (out && dtype != XMESH_F16 && dtype != XMESH_BF16)
            memcpy((char *)out + k * xmesh_dtype_size(dtype),
                   (char *)acc + k * xmesh_dtype_size(dtype), xmesh_dtype_size(dtype));
    }
}
