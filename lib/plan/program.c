/* The per-rank program (xm_program.h): chains of a plan, and one rank's
 * steps of them with chunking, geometry, ops and dependencies. */
#include <stdlib.h>
#include <string.h>

#include "xm_program.h"

/* -------------------------------------------------------------- chains */

/* Most elements of one chunk of task t (t < 0: of any task; a union's
 * smallest wire element size). */
static int64_t chunk_elems_of(const xm_prog_in_t *in, int t)
{
    int64_t cb = in->chunk_bytes < XM_MAX_CHUNK_BYTES ? in->chunk_bytes : XM_MAX_CHUNK_BYTES;
    /* Chunks of chunk_bytes on the wire: the task set's element size is
     * the wire's (xm_decompose), the dtype's unless the plan converts. */
    int64_t es = t >= 0 && in->ts->tmeta ? (int64_t)xm_task_es(in->ts, &in->ts->tasks[t])
                 : in->ts->elem_size     ? (int64_t)in->ts->elem_size
                                         : (int64_t)xmesh_dtype_size(in->dtype);
    return cb / es > 0 ? cb / es : 1;
}

/* Dtypes of tensor k (the one-tensor fields when the input has no arrays). */
static xmesh_dtype_t in_sdt(const xm_prog_in_t *in, int k)
{
    return in->ntensors ? in->dtypes[k] : in->dtype;
}

static xmesh_dtype_t in_ddt(const xm_prog_in_t *in, int k)
{
    return in->ntensors ? in->dst_dtypes[k] : in->dst_dtype;
}

/* Tensor whose dtypes a task uses (a packed task: its pieces'). */
static int task_tensor(const xm_taskset_t *ts, const xm_task_t *t)
{
    int k = t->npack ? ts->pieces[t->pack_off].tensor : t->tensor;
    return k > 0 ? k : 0;
}

/* Chunking of the box-linear range [r0, r1): for a whole box, pieces of
 * dim k (the outermost dim whose inner dims fit a chunk) so that every chunk
 * is a sub-box, chunks in row-major order of their origins; for a part of a
 * box (all-gather strategies), fixed pieces. */
static void set_chunks(int nd, int64_t ce, xm_pstep_t *s, const xm_box_t *box, int64_t r0,
                       int64_t r1, int whole)
{
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

typedef struct {
    xm_chains_t v;
    int cap_c, cap_d, ndevs;
} cbuild_t;

/* Appends a chain (devs copied); returns its index, -1 when out of memory.
 * Empty ranges are dropped (returns -2): they move nothing and use no hop. */
static int cb_add(cbuild_t *b, int task, int route, const int *devs, int len, int nsrc,
                  int from_dst, int whole, int64_t r0, int64_t r1, int dep)
{
    if (r1 <= r0)
        return -2;
    if (b->v.n == b->cap_c) {
        int c = b->cap_c ? 2 * b->cap_c : 64;
        xm_chain_t *n = realloc(b->v.c, sizeof *n * c);
        if (!n)
            return -1;
        b->v.c = n;
        b->cap_c = c;
    }
    if (b->ndevs + len > b->cap_d) {
        int c = 2 * b->cap_d + len + 64;
        int *d = realloc(b->v.devs, sizeof(int) * c);
        if (!d)
            return -1;
        b->v.devs = d;
        b->cap_d = c;
    }
    memcpy(b->v.devs + b->ndevs, devs, sizeof(int) * len);
    int nseg = 1;
    for (int i = 1; i < len; i++)
        nseg += devs[i] != devs[i - 1];
    b->v.c[b->v.n] = (xm_chain_t){.task = task,
                                  .route = route,
                                  .nsrc = nsrc,
                                  .len = len,
                                  .off = b->ndevs,
                                  .from_dst = from_dst,
                                  .whole = whole,
                                  .r0 = r0,
                                  .r1 = r1,
                                  .dep = dep,
                                  .hop0 = b->v.nhops,
                                  .nseg = nseg};
    b->ndevs += len;
    b->v.nhops += nseg - 1;
    return b->v.n++;
}

/* The pick-th (mod count) holder of task t on `host`, -1 if none, so parts
 * spread over local replicas; *is gets whether dev holds the box. */
static int near_holder(const xm_taskset_t *ts, const xm_task_t *t, int dev, int *is,
                       const xm_hostmap_t *h, int host, int pick)
{
    int n = t->ngroups * t->group_size, nlocal = 0, match = -1;
    *is = 0;
    for (int i = 0; i < n; i++) {
        int d = ts->holders[t->holder_off + i];
        *is |= d == dev;
        nlocal += h->host_of[d] == host;
    }
    for (int i = 0, k = 0; i < n && nlocal; i++) {
        int d = ts->holders[t->holder_off + i];
        if (h->host_of[d] == host && k++ == pick % nlocal)
            match = d;
    }
    return match;
}

/* All-gather baselines (paper 002 section 3.1): every receiver of a group
 * gets 1/k of the box from a sender (itself when it holds the box, else a
 * replica on its host, else the scheduled senders with partial sums), then
 * each part travels the ring of the group's k receivers, a chunk-pipelined
 * chain that starts once its head holds the part. */
static xmesh_result_t chains_allgather(cbuild_t *b, const xm_prog_in_t *in, int t, int per_host,
                                       int *chain, int *stage0)
{
    const xm_taskset_t *ts = in->ts;
    const xm_task_t *tk = &ts->tasks[t];
    const xm_hostmap_t *hm = in->hosts;
    int G = tk->ngroups, mg = in->sched->max_groups;
    const int *R = ts->recvs + tk->recv_off;
    int64_t V = xm_box_volume(&tk->box, xm_task_ndim(ts, tk));
    for (int g0 = 0; g0 < tk->nrecv;) {
        int g1 = g0 + 1;
        while (per_host && g1 < tk->nrecv && hm->host_of[R[g1]] == hm->host_of[R[g0]])
            g1++;
        if (!per_host)
            g1 = tk->nrecv;
        int k = g1 - g0;
        for (int j = 0; j < k; j++) {
            int rcv = R[g0 + j], len = 0, nsrc, is;
            int near = G == 1 ? near_holder(ts, tk, rcv, &is, hm, hm->host_of[rcv], j) : -1;
            if (G == 1 && is) {
                chain[len++] = rcv; /* self copy */
                nsrc = 1;
            } else if (G == 1 && near >= 0) {
                chain[len++] = near; /* a replica on the receiver's host: intra-host */
                nsrc = 1;
            } else {
                for (int g = 0; g < G; g++)
                    chain[len++] = in->sched->sender[t * mg + g];
                nsrc = G;
            }
            chain[len++] = rcv;
            stage0[j] = cb_add(b, t, -1, chain, len, nsrc, 0, 0, V * j / k, V * (j + 1) / k, -1);
            if (stage0[j] == -1)
                return XM_ERR(XMESH_ERR_NO_MEMORY, "program: out of memory for chains");
        }
        for (int j = 0; k > 1 && j < k; j++) {
            for (int q = 0; q < k; q++)
                chain[q] = R[g0 + (j + q) % k];
            if (cb_add(b, t, -1, chain, k, 0, 1, 0, V * j / k, V * (j + 1) / k,
                       stage0[j] >= 0 ? stage0[j] : -1) == -1)
                return XM_ERR(XMESH_ERR_NO_MEMORY, "program: out of memory for chains");
        }
        g0 = g1;
    }
    return XMESH_SUCCESS;
}

/* Last round of chain c (inclusive): its last chunk reaches the last
 * segment nseg - 2 rounds after leaving the first. */
static int64_t chain_end(const xm_chain_t *c)
{
    return c->round0 + (c->nseg > 2 ? c->nseg - 2 : 0) + c->nchunks - 1;
}

/* Chunk counts and the lockstep round schedule (xm_rounds_next): tasks in
 * schedule order, each as soon as every (rank, link class) its hops use is
 * free; rings the round after their stage-0 chain. */
static xmesh_result_t chains_rounds(const xm_prog_in_t *in, xm_chains_t *v)
{
    const xm_taskset_t *ts = in->ts;
    const xm_hostmap_t *h = in->hosts;
    int64_t *freer = calloc((size_t)h->ndev * XM_NSLOTS + 1, sizeof(int64_t));
    if (!freer)
        return XM_ERR(XMESH_ERR_NO_MEMORY, "program: out of memory for %d devices", h->ndev);
    for (int i = 0; i < v->n; i++) {
        xm_pstep_t tmp;
        xm_chain_t *c = &v->c[i];
        const xm_task_t *tk = &ts->tasks[c->task];
        set_chunks(xm_task_ndim(ts, tk), chunk_elems_of(in, c->task), &tmp, &tk->box, c->r0, c->r1,
                   c->whole);
        c->nchunks = tmp.nchunks;
    }
    v->nrounds = 0;
    for (int i0 = 0; i0 < v->n;) {
        int i1 = i0 + 1;
        while (i1 < v->n && v->c[i1].task == v->c[i0].task)
            i1++;
        int64_t start = 0, end = 0;
        for (int pass = 0; pass < 2; pass++) {
            for (int i = i0; i < i1; i++) {
                const int *d = v->devs + v->c[i].off;
                for (int k = 0; k + 1 < v->c[i].len; k++) {
                    if (d[k] == d[k + 1])
                        continue;
                    int remote = h->host_of[d[k]] != h->host_of[d[k + 1]];
                    int64_t *fs = &freer[(int64_t)d[k] * XM_NSLOTS + (remote ? 0 : 2)];
                    int64_t *fr = &freer[(int64_t)d[k + 1] * XM_NSLOTS + (remote ? 1 : 3)];
                    if (pass == 0) {
                        start = *fs > start ? *fs : start;
                        start = *fr > start ? *fr : start;
                    } else {
                        *fs = *fr = end;
                    }
                }
            }
            if (pass == 0) { /* chains ordered: a ring's stage-0 chain comes first */
                end = start;
                for (int i = i0; i < i1; i++) {
                    xm_chain_t *c = &v->c[i];
                    c->round0 = c->dep >= 0 ? chain_end(&v->c[c->dep]) + 1 : start;
                    if (chain_end(c) + 1 > end)
                        end = chain_end(c) + 1;
                }
            }
        }
        if (end > v->nrounds)
            v->nrounds = end;
        i0 = i1;
    }
    free(freer);
    return XMESH_SUCCESS;
}

xmesh_result_t xm_chains_build(const xm_prog_in_t *in, xm_chains_t *out)
{
    const xm_taskset_t *ts = in->ts;
    const xm_schedule_t *sc = in->sched;
    cbuild_t b;
    memset(&b, 0, sizeof b);
    int maxchain = 2;
    for (int t = 0; t < ts->ntasks; t++)
        if (ts->tasks[t].ngroups + ts->tasks[t].nrecv + 2 > maxchain)
            maxchain = ts->tasks[t].ngroups + ts->tasks[t].nrecv + 2;
    int *chain = malloc(sizeof(int) * maxchain), *stage0 = malloc(sizeof(int) * maxchain);
    xmesh_result_t r = XMESH_SUCCESS;
    if (!chain || !stage0) {
        r = XM_ERR(XMESH_ERR_NO_MEMORY, "program: out of memory for chains");
        goto out_free;
    }
    for (int i = 0; i < ts->ntasks && !r; i++) {
        int t = sc->order[i];
        if (in->strategy == XMESH_STRATEGY_SENDRECV_ALLGATHER ||
            in->strategy == XMESH_STRATEGY_GLOBAL_ALLGATHER) {
            r = chains_allgather(&b, in, t, in->strategy == XMESH_STRATEGY_SENDRECV_ALLGATHER,
                                 chain, stage0);
            continue;
        }
        int64_t V = xm_box_volume(&ts->tasks[t].box, xm_task_ndim(ts, &ts->tasks[t]));
        for (int q = sc->task_route_off[t]; q < sc->task_route_off[t + 1] && !r; q++) {
            const xm_route_t *rt = &sc->routes[q];
            const int *devs = sc->route_devs + rt->off;
            int self[2], len = rt->len, nsrc = rt->nsrc;
            if (len == 1) { /* self copy: the holder is also the receiver */
                self[0] = self[1] = devs[0];
                devs = self;
                len = 2;
                nsrc = 1;
            }
            if (cb_add(&b, t, q, devs, len, nsrc, 0, 1, 0, V, -1) == -1)
                r = XM_ERR(XMESH_ERR_NO_MEMORY, "program: out of memory for chains");
        }
    }
    if (!r)
        r = chains_rounds(in, &b.v);
out_free:
    free(chain);
    free(stage0);
    if (r) {
        xm_chains_free(&b.v);
        return r;
    }
    *out = b.v;
    return XMESH_SUCCESS;
}

void xm_chains_free(xm_chains_t *c)
{
    if (!c)
        return;
    free(c->c);
    free(c->devs);
    memset(c, 0, sizeof *c);
}

/* --------------------------------------------------------------- steps */

typedef struct {
    const xm_prog_in_t *in;
    xm_program_t p;
    int cap_s, cap_t, cap_p;
    /* this rank's blocks, per tensor */
    int64_t (*src_lo)[XM_MAX_DIMS], (*src_hi)[XM_MAX_DIMS];
    int64_t (*dst_lo)[XM_MAX_DIMS], (*dst_hi)[XM_MAX_DIMS];
    unsigned char *has_src, *has_dst;
    int *last_step; /* per chain: this rank's step at the chain's last position, -1 */
} pbuild_t;

static int box_inside(int nd, const xm_box_t *b, const int64_t *lo, const int64_t *hi)
{
    for (int d = 0; d < nd; d++)
        if (b->lo[d] < lo[d] || b->hi[d] > hi[d])
            return 0;
    return 1;
}

static void push_op(xm_pstep_t *s, int kind, int blk, xmesh_dtype_t dt)
{
    s->ops[s->nops++] = (xm_pop_t){(unsigned char)kind, (unsigned char)blk, (unsigned char)dt};
}

/* The ops every chunk of s goes through (see xm_popkind_t); w is the
 * chain's wire dtype (xm_wire_dtype), acc the accumulator's, ddt the
 * destination block's. A value is converted once on its way: by PACK on
 * the sender when the wire is narrower than the source, by UNPACK on each
 * receiver when the wire differs from the destination, by COPY on a rank
 * that holds both, by TO_NATIVE once a partial sum is complete. */
static void set_ops(xm_pstep_t *s, xmesh_dtype_t w, xmesh_dtype_t acc, xmesh_dtype_t ddt)
{
    s->nops = 0;
    s->in_dt = s->in_acc ? acc : w;
    s->out_dt = s->out_acc ? acc : w;
    switch (s->mode) {
    case XM_MODE_SRC:
        push_op(s, XM_POP_PACK, 0, w);
        push_op(s, XM_POP_SEND, 0, w);
        break;
    case XM_MODE_RECV:
        push_op(s, XM_POP_RECV, 0, w);
        push_op(s, XM_POP_UNPACK, 1, w);
        if (s->next >= 0)
            push_op(s, XM_POP_SEND, 0, w);
        break;
    case XM_MODE_FROM_DST:
        push_op(s, XM_POP_PACK, 1, w);
        push_op(s, XM_POP_SEND, 0, w);
        break;
    case XM_MODE_SELF:
        push_op(s, XM_POP_COPY, 0, ddt);
        break;
    default: { /* partial sums: the running sum in the accumulator type */
        int converted = 0;
        if (s->prev >= 0)
            push_op(s, XM_POP_RECV, 0, s->in_dt);
        for (int q = s->pos_first; q <= s->pos_last; q++) {
            if (q < s->nsrc) {
                push_op(s, q == 0 ? XM_POP_TO_ACC : XM_POP_ADD_ACC, 0, acc);
            } else if (!converted) { /* the first receiver gets the final values */
                push_op(s, XM_POP_TO_NATIVE, 0, w);
                push_op(s, XM_POP_UNPACK, 1, w);
                converted = 1;
            }
        }
        if (s->next >= 0) {
            if (!s->out_acc && !converted)
                push_op(s, XM_POP_TO_NATIVE, 0, w);
            push_op(s, XM_POP_SEND, 0, s->out_dt);
        }
        break;
    }
    }
    size_t ws = xmesh_dtype_size(w);
    s->stage_es = s->mode == XM_MODE_SELF      ? 0
                  : s->mode == XM_MODE_GENERAL ? xmesh_dtype_size(acc)
                                               : ws;
}

static xmesh_result_t push_step(pbuild_t *b, xm_pstep_t **out)
{
    xm_program_t *p = &b->p;
    if (p->nsteps == b->cap_s) {
        int ncap = b->cap_s ? 2 * b->cap_s : 64;
        xm_pstep_t *n = realloc(p->steps, sizeof *n * ncap);
        if (!n)
            return XM_ERR(XMESH_ERR_NO_MEMORY, "program: out of memory for %d steps", ncap);
        p->steps = n;
        b->cap_s = ncap;
    }
    *out = &p->steps[p->nsteps++];
    memset(*out, 0, sizeof **out);
    return XMESH_SUCCESS;
}

/* Geometry of box (of tensor k, nd dims) in this rank's source block
 * (has_src) and destination block (has_recv); INTERNAL when the schedule
 * names this rank where its blocks do not hold the box. */
static xmesh_result_t step_geom(const pbuild_t *b, int k, int nd, const xm_box_t *box, int has_src,
                                int has_recv, xm_geom_t *sg, xm_geom_t *dg)
{
    if (has_src) {
        if (!b->has_src[k] || !box_inside(nd, box, b->src_lo[k], b->src_hi[k]))
            return XM_ERR(XMESH_ERR_INTERNAL,
                          "tensor %d lists rank %d as a source but its source block does not "
                          "hold the box",
                          k, b->p.rank);
        xm_geom_init(sg, nd, b->src_lo[k], b->src_hi[k], box);
    }
    if (has_recv) {
        if (!b->has_dst[k] || !box_inside(nd, box, b->dst_lo[k], b->dst_hi[k]))
            return XM_ERR(XMESH_ERR_INTERNAL,
                          "tensor %d lists rank %d as a receiver but its destination block "
                          "does not hold the box",
                          k, b->p.rank);
        xm_geom_init(dg, nd, b->dst_lo[k], b->dst_hi[k], box);
    }
    return XMESH_SUCCESS;
}

/* The pieces of packed task t for step s (appended to the program's). */
static xmesh_result_t add_pieces(pbuild_t *b, const xm_task_t *t, int has_src, int has_recv,
                                 xm_pstep_t *s)
{
    const xm_taskset_t *ts = b->in->ts;
    xm_program_t *p = &b->p;
    if (p->npieces + t->npack > b->cap_p) {
        int ncap = 2 * b->cap_p + t->npack + 64;
        xm_ppiece_t *n = realloc(p->pieces, sizeof *n * ncap);
        if (!n)
            return XM_ERR(XMESH_ERR_NO_MEMORY, "program: out of memory for %d pieces", ncap);
        p->pieces = n;
        b->cap_p = ncap;
    }
    s->piece_off = p->npieces;
    s->npieces = t->npack;
    for (int q = 0; q < t->npack; q++) {
        const xm_piece_t *pc = &ts->pieces[t->pack_off + q];
        xm_ppiece_t *o = &p->pieces[p->npieces++];
        memset(o, 0, sizeof *o);
        o->tensor = pc->tensor;
        o->off = pc->off;
        o->n = pc->n;
        o->has_sg = has_src;
        o->has_dg = has_recv;
        xmesh_result_t r = step_geom(b, pc->tensor, ts->tmeta[pc->tensor].ndim, &pc->box, has_src,
                                     has_recv, &o->sg, &o->dg);
        if (r)
            return r;
    }
    return XMESH_SUCCESS;
}

/* Rail of the hop of chain cn from position i to position j (> i, devices
 * devs[i] != devs[j]), see xm_pstep_t.rail_in. */
static int hop_rail(const xm_prog_in_t *in, const xm_chain_t *cn, const int *devs, int i, int j)
{
    const int *host = in->hosts->host_of;
    if (host[devs[i]] == host[devs[j]])
        return -1;
    int K = in->nics > 0 ? in->nics : 1;
    const xm_schedule_t *sc = in->sched;
    if (cn->route >= 0 && sc && sc->route_rails && j == i + 1)
        return sc->route_rails[sc->routes[cn->route].off + i];
    int k = 0;
    for (int q = 0; q < devs[i]; q++)
        k += host[q] == host[devs[i]];
    return k % K;
}

/* Adds this rank's steps of chain ci. */
static xmesh_result_t add_chain(pbuild_t *b, const xm_chains_t *ch, int ci)
{
    const xm_chain_t *cn = &ch->c[ci];
    const xm_taskset_t *ts = b->in->ts;
    const xm_task_t *t = &ts->tasks[cn->task];
    const int *devs = ch->devs + cn->off;
    int me = b->p.rank, nseg = 0, len = cn->len, nsrc = cn->nsrc;
    int tk = task_tensor(ts, t), nd = xm_task_ndim(ts, t);
    xmesh_dtype_t sdt = in_sdt(b->in, tk), ddt = in_ddt(b->in, tk);
    xmesh_dtype_t w = xm_wire_dtype(sdt, ddt, t->ngroups > 1, cn->from_dst);
    size_t es = xmesh_dtype_size(w);
    for (int i = 0; i < len;) {
        int j = i + 1;
        while (j < len && devs[j] == devs[i])
            j++;
        if (devs[i] == me) {
            xm_pstep_t *s = NULL;
            xmesh_result_t r = push_step(b, &s);
            if (r)
                return r;
            int si = b->p.nsteps - 1;
            s->task = cn->task;
            s->chain = ci;
            s->route = cn->route;
            s->prev = i > 0 ? devs[i - 1] : -1;
            s->next = j < len ? devs[j] : -1;
            s->hop_in = i > 0 ? cn->hop0 + nseg - 1 : -1;
            s->hop_out = j < len ? cn->hop0 + nseg : -1;
            s->rail_in = i > 0 ? hop_rail(b->in, cn, devs, i - 1, i) : -1;
            s->rail_out = j < len ? hop_rail(b->in, cn, devs, j - 1, j) : -1;
            s->pos_first = i;
            s->pos_last = j - 1;
            s->nic_paced = 0;
            for (int k = 0; k < i && !s->nic_paced; k++)
                s->nic_paced = b->in->hosts->host_of[devs[k]] != b->in->hosts->host_of[devs[k + 1]];
            s->nsrc = nsrc;
            s->in_acc = i > 0 && i < nsrc;
            s->out_acc = j < len && j < nsrc;
            s->after = i == 0 && cn->dep >= 0 ? b->last_step[cn->dep] : -1;
            int has_src = i < nsrc, has_recv = j - 1 >= nsrc || cn->from_dst;
            s->tensor = t->npack ? -1 : tk;
            s->sdt = sdt;
            s->ddt = ddt;
            if (t->npack) {
                r = add_pieces(b, t, has_src, has_recv, s);
                if (r)
                    return r;
            } else {
                if ((r = step_geom(b, tk, nd, &t->box, has_src, has_recv, &s->sg, &s->dg)))
                    return XM_ERR(r, "program: task %d: %s", cn->task, xmesh_last_error());
                s->has_sg = has_src;
                s->has_dg = has_recv;
            }
            if (cn->from_dst && i == 0)
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
                return XM_ERR(XMESH_ERR_INTERNAL, "program: task %d chain starts at a receiver",
                              cn->task);
            s = &b->p.steps[si]; /* add_pieces may not move steps, but stay safe */
            set_chunks(nd, chunk_elems_of(b->in, cn->task), s, &t->box, cn->r0, cn->r1, cn->whole);
            s->seg = nseg;
            s->rin = cn->round0 + nseg - 1;
            s->rout = cn->round0 + nseg;
            /* Checksums start where the final values first exist. */
            s->ck_origin =
                s->mode == XM_MODE_SRC || s->mode == XM_MODE_FROM_DST ||
                (s->mode == XM_MODE_GENERAL && nsrc > 0 && i <= nsrc - 1 && j - 1 >= nsrc - 1);
            s->ck_verify = s->mode == XM_MODE_RECV;
            s->bytes = (cn->r1 - cn->r0) * (int64_t)es;
            set_ops(s, w, xm_dtype_acc(sdt), ddt);
            if (j == len)
                b->last_step[ci] = b->p.nsteps - 1;
        }
        nseg++;
        i = j;
    }
    return XMESH_SUCCESS;
}

/* Link class of a hop of rank self to or from peer. */
static unsigned hop_slot(const pbuild_t *b, int self, int peer, int sending)
{
    const xm_hostmap_t *h = b->in->hosts;
    int remote = h->host_of[peer] != h->host_of[self];
    if (sending)
        return remote ? XM_SLOT_SEND : XM_SLOT_LSEND;
    return remote ? XM_SLOT_RECV : XM_SLOT_LRECV;
}

static xmesh_result_t finish_task(pbuild_t *b, int t, int first)
{
    xm_program_t *p = &b->p;
    if (p->nsteps == first)
        return XMESH_SUCCESS;
    unsigned slots = 0;
    for (int i = first; i < p->nsteps; i++) {
        if (p->steps[i].prev >= 0)
            slots |= hop_slot(b, p->rank, p->steps[i].prev, 0);
        if (p->steps[i].next >= 0)
            slots |= hop_slot(b, p->rank, p->steps[i].next, 1);
    }
    if (p->ntasks == b->cap_t) {
        int ncap = b->cap_t ? 2 * b->cap_t : 64;
        xm_ptask_t *n = realloc(p->tasks, sizeof *n * ncap);
        if (!n)
            return XM_ERR(XMESH_ERR_NO_MEMORY, "program: out of memory for %d tasks", ncap);
        p->tasks = n;
        b->cap_t = ncap;
    }
    p->tasks[p->ntasks++] = (xm_ptask_t){t, first, p->nsteps - first, slots};
    return XMESH_SUCCESS;
}

/* Link classes rank n occupies in chain c (as hop_slot books them). */
static unsigned chain_slots_of(const pbuild_t *b, const xm_chains_t *ch, const xm_chain_t *c, int n)
{
    const int *devs = ch->devs + c->off;
    unsigned slots = 0;
    for (int k = 0; k < c->len; k++) {
        if (devs[k] != n)
            continue;
        if (k > 0 && devs[k - 1] != n)
            slots |= hop_slot(b, n, devs[k - 1], 0);
        if (k + 1 < c->len && devs[k + 1] != n)
            slots |= hop_slot(b, n, devs[k + 1], 1);
    }
    return slots;
}

/* Sets late_next on this rank's steps whose next hop crosses hosts to a
 * rank that takes part in an earlier task (issue order) on a link class
 * this task uses there: that rank admits this task only after the earlier
 * one, so its receive may be posted long after this rank could send. One
 * pass over the chains per distinct such peer. */
static xmesh_result_t mark_late_next(pbuild_t *b, const xm_chains_t *ch)
{
    xm_program_t *p = &b->p;
    const xm_hostmap_t *hm = b->in->hosts;
    int me = p->rank;
    unsigned char *done = calloc((size_t)hm->ndev + 1, 1);
    if (!done)
        return XM_ERR(XMESH_ERR_NO_MEMORY, "program: out of memory for %d devices", hm->ndev);
    for (int i = 0; i < p->nsteps; i++) {
        int n = p->steps[i].next;
        if (n < 0 || hm->host_of[n] == hm->host_of[me] || done[n])
            continue;
        done[n] = 1;
        unsigned before = 0;
        int pt = 0; /* this rank's tasks come in the chains' issue order */
        for (int c = 0; c < ch->n;) {
            int t = ch->c[c].task;
            unsigned now = 0;
            for (; c < ch->n && ch->c[c].task == t; c++)
                now |= chain_slots_of(b, ch, &ch->c[c], n);
            if (pt < p->ntasks && p->tasks[pt].task == t) {
                const xm_ptask_t *pk = &p->tasks[pt++];
                for (int q = pk->first_step; q < pk->first_step + pk->nsteps; q++)
                    if (p->steps[q].next == n)
                        p->steps[q].late_next = (before & now) != 0;
            }
            before |= now;
        }
    }
    free(done);
    return XMESH_SUCCESS;
}

xmesh_result_t xm_program_build(const xm_prog_in_t *in, const xm_chains_t *ch, int rank,
                                xm_program_t *out)
{
    pbuild_t b;
    memset(&b, 0, sizeof b);
    b.in = in;
    b.p.rank = rank;
    b.p.dtype = in->dtype;
    b.p.dst_dtype = in->dst_dtype;
    b.p.es = xmesh_dtype_size(in->dtype);
    b.p.dst_es = xmesh_dtype_size(in->dst_dtype);
    b.p.acc_es = xm_dtype_acc_size(in->dtype);
    if (!xm_dtype_pair_ok(in->dtype, in->dst_dtype))
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                      "program: source dtype %s != destination dtype %s: no conversion",
                      xmesh_dtype_name(in->dtype), xmesh_dtype_name(in->dst_dtype));
    b.p.nhops = ch->nhops;
    b.p.chunk_elems = chunk_elems_of(in, -1);
    int nt = in->ntensors > 0 ? in->ntensors : 1;
    b.p.ntensors = nt;
    xmesh_result_t r = XMESH_SUCCESS;
    b.src_lo = malloc(sizeof *b.src_lo * nt);
    b.src_hi = malloc(sizeof *b.src_hi * nt);
    b.dst_lo = malloc(sizeof *b.dst_lo * nt);
    b.dst_hi = malloc(sizeof *b.dst_hi * nt);
    b.has_src = calloc(nt, 1);
    b.has_dst = calloc(nt, 1);
    if (!(b.last_step = malloc(sizeof(int) * (ch->n + 1))) || !b.src_lo || !b.src_hi || !b.dst_lo ||
        !b.dst_hi || !b.has_src || !b.has_dst) {
        r = XM_ERR(XMESH_ERR_NO_MEMORY, "program: out of memory for %d chains", ch->n);
        goto out_free;
    }
    for (int k = 0; k < nt; k++) {
        const xm_layout_t *sl = in->ntensors ? &in->srcs[k] : in->src;
        const xm_layout_t *dl = in->ntensors ? &in->dsts[k] : in->dst;
        if (!xm_dtype_pair_ok(in_sdt(in, k), in_ddt(in, k))) {
            r = XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                       "program: tensor %d: source dtype %s != destination dtype %s: no "
                       "conversion",
                       k, xmesh_dtype_name(in_sdt(in, k)), xmesh_dtype_name(in_ddt(in, k)));
            goto out_free;
        }
        int si = xm_mesh_find(&sl->mesh, rank), di = xm_mesh_find(&dl->mesh, rank);
        if ((b.has_src[k] = si >= 0))
            xm_layout_block(sl, si, b.src_lo[k], b.src_hi[k]);
        if ((b.has_dst[k] = di >= 0))
            xm_layout_block(dl, di, b.dst_lo[k], b.dst_hi[k]);
    }
    for (int i = 0; i < ch->n; i++)
        b.last_step[i] = -1;
    for (int i = 0; i < ch->n && !r;) {
        int t = ch->c[i].task, first = b.p.nsteps;
        for (; i < ch->n && ch->c[i].task == t && !r; i++) {
            const xm_chain_t *c = &ch->c[i];
            int on = 0;
            for (int k = 0; k < c->len && !on; k++)
                on = ch->devs[c->off + k] == rank;
            if (on)
                r = add_chain(&b, ch, i);
        }
        if (!r)
            r = finish_task(&b, t, first);
    }
    if (!r)
        r = mark_late_next(&b, ch);
out_free:
    free(b.last_step);
    free(b.src_lo);
    free(b.src_hi);
    free(b.dst_lo);
    free(b.dst_hi);
    free(b.has_src);
    free(b.has_dst);
    if (r) {
        xm_program_free(&b.p);
        return r;
    }
    *out = b.p;
    return XMESH_SUCCESS;
}

void xm_program_free(xm_program_t *p)
{
    if (!p)
        return;
    free(p->steps);
    free(p->tasks);
    free(p->pieces);
    memset(p, 0, sizeof *p);
}

xmesh_result_t xm_program_pool(const xm_program_t *p, const int64_t *need, int64_t align,
                               int64_t *off, int64_t *total)
{
    int64_t region_size[XM_NSLOTS] = {0}, base[XM_NSLOTS];
    int *region = malloc(sizeof(int) * (p->nsteps + 1));
    if (!region)
        return XM_ERR(XMESH_ERR_NO_MEMORY, "program: out of memory for %d steps", p->nsteps);
    for (int k = 0; k < p->ntasks; k++) {
        const xm_ptask_t *t = &p->tasks[k];
        int reg = -1;
        for (int b = 0; b < XM_NSLOTS && reg < 0; b++)
            if (t->slots & (1u << b))
                reg = b;
        int64_t o = 0;
        for (int i = t->first_step; i < t->first_step + t->nsteps; i++) {
            region[i] = reg;
            off[i] = -1;
            if (!need[i])
                continue;
            if (reg < 0) { /* a task without hops never needs staging */
                free(region);
                return XM_ERR(XMESH_ERR_INTERNAL, "program: task %d needs staging without a hop",
                              t->task);
            }
            off[i] = o;
            o += (need[i] + align - 1) / align * align;
        }
        if (reg >= 0 && o > region_size[reg])
            region_size[reg] = o;
    }
    *total = 0;
    for (int b = 0; b < XM_NSLOTS; b++) {
        base[b] = *total;
        *total += region_size[b];
    }
    for (int i = 0; i < p->nsteps; i++)
        if (off[i] >= 0)
            off[i] += base[region[i]];
    free(region);
    return XMESH_SUCCESS;
}

const char *xm_pop_name(int kind)
{
    static const char *const names[] = {"recv",      "pack",   "to_acc", "add_acc",
                                        "to_native", "unpack", "copy",   "send"};
    return kind >= 0 && kind <= XM_POP_SEND ? names[kind] : "?";
}
