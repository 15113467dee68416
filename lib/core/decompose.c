/* Spec decomposer (paper 002, Appendix B.2): cut every tensor dim at the
 * shard boundaries of both layouts; every non-empty box of the resulting grid
 * has one set of holders and one set of receivers and becomes a unit task. */
#include <stdlib.h>
#include <string.h>

#include "xm_core.h"

#define XM_MAX_TASKS (1 << 22)

/* Per dim: the intervals of the cut grid and the shard each side has there. */
typedef struct {
    int n;
    int64_t *cut;  /* n + 1 cut points */
    int64_t *sidx; /* n: source shard index of interval i */
    int64_t *didx; /* n: destination shard index of interval i */
} dim_cuts_t;

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static xmesh_result_t make_cuts(const xm_layout_t *s, const xm_layout_t *t, int d, dim_cuts_t *c)
{
    int64_t ks = xm_layout_nshards(s, d), kt = xm_layout_nshards(t, d), n = s->shape[d];
    int64_t cap = ks + kt + 2;
    int64_t *pts = malloc(sizeof *pts * cap);
    int64_t m = 0;
    if (!pts)
        return XM_ERR(XMESH_ERR_NO_MEMORY, "decompose: out of memory for cut points");
    /* Shard starts by each side's split rule, then the end. */
    int64_t end;
    for (int64_t i = 0; i < ks; i++)
        xm_layout_dim_block(s, d, i, &pts[m++], &end);
    for (int64_t i = 0; i < kt; i++)
        xm_layout_dim_block(t, d, i, &pts[m++], &end);
    pts[m++] = n;
    qsort(pts, m, sizeof *pts, cmp_i64);
    int64_t u = 0;
    for (int64_t i = 0; i < m; i++)
        if (u == 0 || pts[i] != pts[u - 1])
            pts[u++] = pts[i];
    c->n = (int)(u - 1);
    c->cut = pts;
    c->sidx = malloc(sizeof(int64_t) * (c->n + 1));
    c->didx = malloc(sizeof(int64_t) * (c->n + 1));
    if (!c->sidx || !c->didx)
        return XM_ERR(XMESH_ERR_NO_MEMORY, "decompose: out of memory for cut points");
    for (int i = 0; i < c->n; i++) {
        c->sidx[i] = xm_layout_shard_at(s, d, pts[i]);
        c->didx[i] = xm_layout_shard_at(t, d, pts[i]);
    }
    return XMESH_SUCCESS;
}

/* Formats "[a, b, c]" into buf. */
static void format_shape(int ndim, const int64_t *shape, char *buf, size_t len)
{
    size_t n = (size_t)snprintf(buf, len, "[");
    for (int d = 0; d < ndim && n < len; d++)
        n += (size_t)snprintf(buf + n, len - n, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (n < len)
        snprintf(buf + n, len - n, "]");
}

xmesh_result_t xm_shape_bytes(int ndim, const int64_t *shape, size_t elem_size, int64_t *bytes)
{
    int64_t v = (int64_t)elem_size, zero = 0;
    int over = elem_size > (size_t)INT64_MAX;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0) {
            char buf[256];
            format_shape(ndim, shape, buf, sizeof buf);
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "shape %s: dim %d = %lld is negative", buf, d,
                          (long long)shape[d]);
        }
        zero |= shape[d] == 0;
        /* A zero dim does not excuse the others: every partial product of
         * extents (blocks, boxes, strides) must fit too. */
        if (!over && __builtin_mul_overflow(v, shape[d] ? shape[d] : 1, &v))
            over = 1;
    }
    if (over) {
        char buf[256];
        format_shape(ndim, shape, buf, sizeof buf);
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                      "shape %s of %zu-byte elements: the tensor's byte size exceeds 64 bits", buf,
                      elem_size);
    }
    if (bytes)
        *bytes = zero ? 0 : v;
    return XMESH_SUCCESS;
}

static xmesh_result_t check_pair(const xm_layout_t *src, const xm_layout_t *dst)
{
    if (src->ndim != dst->ndim)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "source ndim %d != destination ndim %d",
                      src->ndim, dst->ndim);
    for (int d = 0; d < src->ndim; d++) {
        if (src->shape[d] != dst->shape[d])
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                          "source shape[%d] = %lld != destination shape[%d] = %lld", d,
                          (long long)src->shape[d], d, (long long)dst->shape[d]);
        if (src->shape[d] < 0)
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "shape[%d] = %lld is negative", d,
                          (long long)src->shape[d]);
    }
    xmesh_result_t r = xm_shape_bytes(src->ndim, src->shape, src->elem_size, NULL);
    if (r)
        return r;
    if (dst->spec.partial_mask)
        return XM_ERR(XMESH_ERR_UNSUPPORTED,
                      "destination sharding has a partial (P) mesh axis; only sources may be "
                      "partial");
    return XMESH_SUCCESS;
}

/* Partial-group id of a source device: mixed radix over its P axes. */
static int partial_group(const xm_layout_t *l, const int coord[XM_MAX_MESH_DIMS])
{
    int g = 0;
    for (int a = 0; a < l->mesh.ndim; a++)
        if (l->spec.partial_mask & (1u << a))
            g = g * l->mesh.shape[a] + coord[a];
    return g;
}

typedef struct {
    int key; /* host or group */
    int dev;
} keyed_t;

static int cmp_keyed(const void *a, const void *b)
{
    const keyed_t *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return x->dev < y->dev ? -1 : x->dev > y->dev;
}

static int host_of(const xm_hostmap_t *h, int dev)
{
    if (!h)
        return dev; /* no map: every device its own host */
    return dev < h->ndev ? h->host_of[dev] : h->nhosts + dev;
}

/* Devices of one side grouped by their shard tuple (mixed radix over the
 * per-dim shard counts, at most ndev distinct values since mesh axes split
 * at most one dim each): the devices of tuple q are dev[off[q] .. off[q+1]),
 * sorted by (key, device). */
typedef struct {
    int64_t ntuples;
    int *off;
    keyed_t *dev;
} tuple_index_t;

static void tuple_index_free(tuple_index_t *x)
{
    free(x->off);
    free(x->dev);
    memset(x, 0, sizeof *x);
}

/* keys[i]: sort key of mesh device i (partial group or host); tuple[i]: its
 * shard tuple. Counting sort by tuple, then each bucket by (key, dev). */
static xmesh_result_t tuple_index_build(const xm_layout_t *l, const int64_t *tuple, const int *keys,
                                        int64_t ntuples, tuple_index_t *x)
{
    int n = l->mesh.ndev;
    x->ntuples = ntuples;
    x->off = calloc((size_t)ntuples + 2, sizeof *x->off);
    x->dev = malloc(sizeof *x->dev * (n ? n : 1));
    if (!x->off || !x->dev)
        return XM_ERR(XMESH_ERR_NO_MEMORY, "decompose: out of memory for %d devices", n);
    for (int i = 0; i < n; i++)
        x->off[tuple[i] + 2]++;
    for (int64_t q = 0; q < ntuples; q++)
        x->off[q + 2] += x->off[q + 1];
    for (int i = 0; i < n; i++)
        x->dev[x->off[tuple[i] + 1]++] = (keyed_t){keys[i], l->mesh.devs[i]};
    for (int64_t q = 0; q < ntuples; q++)
        qsort(x->dev + x->off[q], (size_t)(x->off[q + 1] - x->off[q]), sizeof *x->dev, cmp_keyed);
    return XMESH_SUCCESS;
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return x < y ? -1 : x > y;
}

/* Complexity: O(devices log devices + boxes * (holders + receivers)), i.e.
 * linear in the size of the output (each box copies its holder and receiver
 * lists once; the old per-box scan of every device was quadratic). */
xmesh_result_t xm_decompose(const xm_layout_t *src, const xm_layout_t *dst,
                            const xm_hostmap_t *hosts, xm_taskset_t *out)
{
    xmesh_result_t r = check_pair(src, dst);
    if (r)
        return r;
    int nd = src->ndim;
    dim_cuts_t cuts[XM_MAX_DIMS];
    memset(cuts, 0, sizeof cuts);
    xm_taskset_t ts;
    memset(&ts, 0, sizeof ts);
    tuple_index_t sx, dx;
    memset(&sx, 0, sizeof sx);
    memset(&dx, 0, sizeof dx);
    int64_t *stuple = NULL, *dtuple = NULL;
    int *skey = NULL, *dkey = NULL, *cover_off = NULL, *cover = NULL;

    int64_t nboxes = 1;
    for (int d = 0; d < nd; d++) {
        if ((r = make_cuts(src, dst, d, &cuts[d])))
            goto out_free_cuts;
        nboxes *= cuts[d].n;
        if (nboxes > XM_MAX_TASKS) {
            r = XM_ERR(XMESH_ERR_UNSUPPORTED, "resharding decomposes into more than %d boxes",
                       XM_MAX_TASKS);
            goto out_free_cuts;
        }
    }
    int na = src->mesh.ndev, nb = dst->mesh.ndev;
    stuple = malloc(sizeof *stuple * (na + 1));
    dtuple = malloc(sizeof *dtuple * (nb + 1));
    skey = malloc(sizeof *skey * (na + 1));
    dkey = malloc(sizeof *dkey * (nb + 1));
    ts.tasks = malloc(sizeof *ts.tasks * (nboxes ? nboxes : 1));
    xm_hint_huge(ts.tasks, sizeof *ts.tasks * (size_t)nboxes);
    if (!stuple || !dtuple || !skey || !dkey || !ts.tasks) {
        r = XM_ERR(XMESH_ERR_NO_MEMORY, "decompose: out of memory for %lld boxes",
                   (long long)nboxes);
        goto out_free_all;
    }
    int ngroups = 1;
    for (int a = 0; a < src->mesh.ndim; a++)
        if (src->spec.partial_mask & (1u << a))
            ngroups *= src->mesh.shape[a];
    /* Bytes a task puts on the wire (xm_wire_dtype): the element size the
     * sender converts to when the destination's is smaller, partial sums in
     * the destination's, else the source's. */
    size_t wes = ngroups > 1 || dst->elem_size < src->elem_size ? dst->elem_size : src->elem_size;
    int64_t sprod = 1, dprod = 1, sstride[XM_MAX_DIMS], dstride[XM_MAX_DIMS];
    for (int d = nd - 1; d >= 0; d--) {
        sstride[d] = sprod;
        dstride[d] = dprod;
        sprod *= xm_layout_nshards(src, d);
        dprod *= xm_layout_nshards(dst, d);
    }
    for (int i = 0; i < na; i++) {
        int c[XM_MAX_MESH_DIMS];
        xm_mesh_coord(&src->mesh, i, c);
        stuple[i] = 0;
        for (int d = 0; d < nd; d++)
            stuple[i] += xm_layout_shard_index(src, d, c) * sstride[d];
        skey[i] = partial_group(src, c);
    }
    for (int i = 0; i < nb; i++) {
        int c[XM_MAX_MESH_DIMS];
        xm_mesh_coord(&dst->mesh, i, c);
        dtuple[i] = 0;
        for (int d = 0; d < nd; d++)
            dtuple[i] += xm_layout_shard_index(dst, d, c) * dstride[d];
        dkey[i] = host_of(hosts, dst->mesh.devs[i]);
    }
    if ((r = tuple_index_build(src, stuple, skey, sprod, &sx)) ||
        (r = tuple_index_build(dst, dtuple, dkey, dprod, &dx)))
        goto out_free_all;
    /* Per source tuple: the hosts holding a replica of every partial group
     * (sorted), so a receiver host there needs no NIC. */
    cover_off = calloc((size_t)sprod + 1, sizeof *cover_off);
    cover = malloc(sizeof *cover * (na + 1));
    if (!cover_off || !cover) {
        r = XM_ERR(XMESH_ERR_NO_MEMORY, "decompose: out of memory for %d devices", na);
        goto out_free_all;
    }
    for (int64_t q = 0, nc = 0; q < sprod; q++) {
        int lo = sx.off[q], hi = sx.off[q + 1], k = hi - lo, gs = k / ngroups;
        int *hs = cover + nc; /* candidate hosts: those of group 0, unique */
        int nh = 0;
        for (int j = 0; j < gs; j++)
            hs[nh++] = host_of(hosts, sx.dev[lo + j].dev);
        qsort(hs, (size_t)nh, sizeof *hs, cmp_int);
        int u = 0;
        for (int j = 0; j < nh; j++) {
            if (u && hs[u - 1] == hs[j])
                continue;
            int ok = 1;
            for (int g = 1; g < ngroups && ok; g++) {
                int found = 0;
                for (int i = 0; i < gs && !found; i++)
                    found = host_of(hosts, sx.dev[lo + g * gs + i].dev) == hs[j];
                ok = found;
            }
            if (ok)
                hs[u++] = hs[j];
        }
        nc += u;
        cover_off[q + 1] = (int)nc;
    }
    /* Holder and receiver counts per box are constant over the grid. */
    int nhold = (int)(na / sprod), nrecv = (int)(nb / dprod);
    ts.holders = malloc(sizeof(int) * (nboxes * nhold + 1));
    ts.recvs = malloc(sizeof(int) * (nboxes * nrecv + 1));
    xm_hint_huge(ts.holders, sizeof(int) * (size_t)(nboxes * nhold));
    xm_hint_huge(ts.recvs, sizeof(int) * (size_t)(nboxes * nrecv));
    if (!ts.holders || !ts.recvs) {
        r = XM_ERR(XMESH_ERR_NO_MEMORY, "decompose: out of memory for %lld boxes",
                   (long long)nboxes);
        goto out_free_all;
    }

    int64_t iv[XM_MAX_DIMS] = {0};
    int nt = 0, hoff = 0, roff = 0;
    for (int64_t b = 0; b < nboxes; b++) {
        xm_task_t *t = &ts.tasks[nt];
        memset(t, 0, sizeof *t);
        int64_t sq = 0, dq = 0;
        for (int d = 0; d < nd; d++) {
            t->box.lo[d] = cuts[d].cut[iv[d]];
            t->box.hi[d] = cuts[d].cut[iv[d] + 1];
            sq += cuts[d].sidx[iv[d]] * sstride[d];
            dq += cuts[d].didx[iv[d]] * dstride[d];
        }
        int k = sx.off[sq + 1] - sx.off[sq];
        t->ngroups = ngroups;
        t->group_size = k / ngroups;
        t->holder_off = hoff;
        for (int i = sx.off[sq]; i < sx.off[sq + 1]; i++)
            ts.holders[hoff++] = sx.dev[i].dev;
        k = dx.off[dq + 1] - dx.off[dq];
        const keyed_t *rv = dx.dev + dx.off[dq];
        t->nrecv = k;
        t->recv_off = roff;
        for (int i = 0; i < k; i++)
            ts.recvs[roff++] = rv[i].dev;
        t->bytes = xm_box_volume(&t->box, nd) * (int64_t)wes;
        /* Receiver hosts that hold the whole value locally need no NIC. */
        int nhosts_remote = 0;
        const int *cv = cover + cover_off[sq];
        int ncv = cover_off[sq + 1] - cover_off[sq];
        for (int i = 0; i < k; i++) {
            int h = rv[i].key;
            if (i > 0 && rv[i - 1].key == h)
                continue;
            nhosts_remote += !bsearch(&h, cv, (size_t)ncv, sizeof *cv, cmp_int);
        }
        /* The tensor fits in 64 bits (check_pair), its copies to every host
         * may not: refuse rather than wrap. */
        int64_t cross;
        if (__builtin_mul_overflow(t->bytes, (int64_t)nhosts_remote, &cross) ||
            __builtin_add_overflow(ts.bytes_cross_host, cross, &ts.bytes_cross_host)) {
            char buf[256];
            format_shape(nd, src->shape, buf, sizeof buf);
            r = XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                       "shape %s of %zu-byte elements: the bytes sent to all receiver hosts "
                       "exceed 64 bits",
                       buf, wes);
            goto out_free_all;
        }
        nt++;
        for (int d = nd - 1; d >= 0; d--) {
            if (++iv[d] < cuts[d].n)
                break;
            iv[d] = 0;
        }
    }
    ts.ntasks = nt;
    ts.ndim = nd;
    ts.elem_size = wes;
    (void)xm_shape_bytes(nd, src->shape, src->elem_size, &ts.bytes_total); /* checked */
    for (int d = 0; d < nd; d++)
        ts.shape[d] = src->shape[d];
    *out = ts;
    memset(&ts, 0, sizeof ts);
    r = XMESH_SUCCESS;
out_free_all:
    free(ts.tasks);
    free(ts.holders);
    free(ts.recvs);
    free(stuple);
    free(dtuple);
    free(skey);
    free(dkey);
    free(cover_off);
    free(cover);
    tuple_index_free(&sx);
    tuple_index_free(&dx);
out_free_cuts:
    for (int d = 0; d < nd; d++) {
        free(cuts[d].cut);
        free(cuts[d].sidx);
        free(cuts[d].didx);
    }
    return r;
}

void xm_taskset_free(xm_taskset_t *ts)
{
    if (!ts)
        return;
    free(ts->tasks);
    free(ts->holders);
    free(ts->recvs);
    free(ts->tmeta);
    free(ts->pieces);
    memset(ts, 0, sizeof *ts);
}

/* ------------------------------------------------------- many tensors */

/* Concatenation of the tensors' task sets (tags, offsets), no packing. */
static xmesh_result_t union_concat(int n, xm_taskset_t *sub, const xm_layout_t *src,
                                   xm_taskset_t *u)
{
    int64_t nt = 0, nh = 0, nr = 0;
    for (int i = 0; i < n; i++) {
        nt += sub[i].ntasks;
        for (int t = 0; t < sub[i].ntasks; t++) {
            const xm_task_t *k = &sub[i].tasks[t];
            nh += (int64_t)k->ngroups * k->group_size;
            nr += k->nrecv;
        }
    }
    if (nt > XM_MAX_TASKS)
        return XM_ERR(XMESH_ERR_UNSUPPORTED,
                      "plan of %d tensors decomposes into %lld unit tasks, more than %d", n,
                      (long long)nt, XM_MAX_TASKS);
    u->tasks = malloc(sizeof *u->tasks * (nt + 1));
    u->holders = malloc(sizeof(int) * (nh + 1));
    u->recvs = malloc(sizeof(int) * (nr + 1));
    u->tmeta = calloc((size_t)n, sizeof *u->tmeta);
    if (!u->tasks || !u->holders || !u->recvs || !u->tmeta)
        return XM_ERR(XMESH_ERR_NO_MEMORY, "plan of %d tensors: out of memory for %lld tasks", n,
                      (long long)nt);
    int m = 0, hoff = 0, roff = 0;
    u->elem_size = 0;
    for (int i = 0; i < n; i++) {
        u->tmeta[i].ndim = src[i].ndim;
        u->tmeta[i].elem_size = sub[i].elem_size;
        if (!u->elem_size || sub[i].elem_size < u->elem_size)
            u->elem_size = sub[i].elem_size;
        if (__builtin_add_overflow(u->bytes_total, sub[i].bytes_total, &u->bytes_total) ||
            __builtin_add_overflow(u->bytes_cross_host, sub[i].bytes_cross_host,
                                   &u->bytes_cross_host))
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                          "plan of %d tensors: bytes exceed 64 bits at tensor %d", n, i);
        for (int t = 0; t < sub[i].ntasks; t++) {
            xm_task_t k = sub[i].tasks[t];
            int nhold = k.ngroups * k.group_size;
            memcpy(u->holders + hoff, sub[i].holders + k.holder_off, sizeof(int) * nhold);
            memcpy(u->recvs + roff, sub[i].recvs + k.recv_off, sizeof(int) * k.nrecv);
            k.holder_off = hoff;
            k.recv_off = roff;
            k.tensor = i;
            k.npack = k.pack_off = 0;
            hoff += nhold;
            roff += k.nrecv;
            u->tasks[m++] = k;
        }
    }
    u->ntasks = m;
    u->ntensors = n;
    u->ndim = src[0].ndim;
    for (int d = 0; d < src[0].ndim; d++)
        u->shape[d] = src[0].shape[d];
    return XMESH_SUCCESS;
}

xmesh_result_t xm_hostmap_default(const int *src_shape, int src_ndim, const int *dst_shape,
                                  int dst_ndim, int overlap, xm_hostmap_t *out, int **src_devs,
                                  int **dst_devs)
{
    int na = 1, nb = 1;
    for (int a = 0; a < src_ndim; a++)
        na *= src_shape[a];
    for (int a = 0; a < dst_ndim; a++)
        nb *= dst_shape[a];
    int ndev = overlap ? (na > nb ? na : nb) : na + nb;
    int *host = malloc(sizeof *host * ndev);
    int *sd = malloc(sizeof *sd * na), *dd = malloc(sizeof *dd * nb);
    if (!host || !sd || !dd) {
        free(host);
        free(sd);
        free(dd);
        return XM_ERR(XMESH_ERR_NO_MEMORY, "host map: out of memory");
    }
    int sper = na / src_shape[0], dper = nb / dst_shape[0];
    int nhosts_src = src_shape[0];
    for (int i = 0; i < na; i++) {
        sd[i] = i;
        host[i] = i / sper;
    }
    for (int i = 0; i < nb; i++) {
        dd[i] = overlap ? i : na + i;
        if (!overlap)
            host[na + i] = nhosts_src + i / dper;
        else if (i >= na)
            host[i] = i / dper; /* beyond the source mesh: destination's own hosts */
    }
    int nhosts = 0;
    for (int i = 0; i < ndev; i++)
        nhosts = host[i] + 1 > nhosts ? host[i] + 1 : nhosts;
    out->ndev = ndev;
    out->nhosts = nhosts;
    out->host_of = host;
    *src_devs = sd;
    *dst_devs = dd;
    return XMESH_SUCCESS;
}

void xm_hostmap_free(xm_hostmap_t *h)
{
    if (!h)
        return;
    free(h->host_of);
    memset(h, 0, sizeof *h);
}

typedef struct {
    uint64_t h;
    int idx;
} pack_ent_t;

static int cmp_pack_ent(const void *a, const void *b)
{
    const pack_ent_t *x = a, *y = b;
    if (x->h != y->h)
        return x->h < y->h ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* Sorted copy of task t's holders (ngroups == 1) into buf. */
static void sorted_holders(const xm_taskset_t *u, const xm_task_t *k, int *buf)
{
    memcpy(buf, u->holders + k->holder_off, sizeof(int) * k->group_size);
    qsort(buf, k->group_size, sizeof(int), cmp_int);
}

/* Same packing class: key, wire size, holder set and receivers equal. */
static int pack_equal(const xm_taskset_t *u, const int *key, int i, int j, int *bi, int *bj)
{
    const xm_task_t *x = &u->tasks[i], *y = &u->tasks[j];
    if ((key ? key[x->tensor] : 0) != (key ? key[y->tensor] : 0) ||
        u->tmeta[x->tensor].elem_size != u->tmeta[y->tensor].elem_size ||
        x->group_size != y->group_size || x->nrecv != y->nrecv)
        return 0;
    if (memcmp(u->recvs + x->recv_off, u->recvs + y->recv_off, sizeof(int) * x->nrecv))
        return 0;
    sorted_holders(u, x, bi);
    sorted_holders(u, y, bj);
    return !memcmp(bi, bj, sizeof(int) * x->group_size);
}

static int packable(const xm_task_t *k, int64_t pack_max)
{
    return k->ngroups == 1 && k->nrecv > 0 && k->bytes <= pack_max;
}

/* Packs the candidates of u (see xm_decompose_many) into a new task set. */
static xmesh_result_t union_pack(xm_taskset_t *u, const int *key, int64_t pack_max,
                                 int64_t pack_limit, xm_taskset_t *out)
{
    int n = u->ntasks, nc = 0, maxg = 1;
    pack_ent_t *e = malloc(sizeof *e * (n + 1));
    int *group = malloc(sizeof(int) * (n + 1)); /* packed task of each task, -1 none */
    int *bi = NULL, *bj = NULL;
    xm_taskset_t o;
    memset(&o, 0, sizeof o);
    xmesh_result_t r = XMESH_SUCCESS;
    if (!e || !group) {
        r = XM_ERR(XMESH_ERR_NO_MEMORY, "packing: out of memory for %d tasks", n);
        goto out_free;
    }
    for (int t = 0; t < n; t++)
        if (u->tasks[t].group_size > maxg)
            maxg = u->tasks[t].group_size;
    bi = malloc(sizeof(int) * maxg);
    bj = malloc(sizeof(int) * maxg);
    if (!bi || !bj) {
        r = XM_ERR(XMESH_ERR_NO_MEMORY, "packing: out of memory");
        goto out_free;
    }
    for (int t = 0; t < n; t++) {
        const xm_task_t *k = &u->tasks[t];
        group[t] = -1;
        if (!packable(k, pack_max))
            continue;
        sorted_holders(u, k, bi);
        uint64_t h = XM_HASH_INIT;
        int kv = key ? key[k->tensor] : 0;
        size_t es = u->tmeta[k->tensor].elem_size;
        h = xm_hash64(h, &kv, sizeof kv);
        h = xm_hash64(h, &es, sizeof es);
        h = xm_hash64(h, bi, sizeof(int) * k->group_size);
        h = xm_hash64(h, u->recvs + k->recv_off, sizeof(int) * k->nrecv);
        e[nc++] = (pack_ent_t){h, t};
    }
    qsort(e, nc, sizeof *e, cmp_pack_ent);
    /* Runs of equal class (hash, then checked against the run's first:
     * a collision only starts a new run), cut at pack_limit bytes. */
    int npacked = 0, npieces = 0;
    int64_t *pbytes = malloc(sizeof(int64_t) * (nc + 1));
    int *pfirst = malloc(sizeof(int) * (nc + 1)), *pcount = calloc(nc + 1, sizeof(int));
    if (!pbytes || !pfirst || !pcount) {
        free(pbytes);
        free(pfirst);
        free(pcount);
        r = XM_ERR(XMESH_ERR_NO_MEMORY, "packing: out of memory");
        goto out_free;
    }
    for (int i = 0; i < nc;) {
        int j = i + 1;
        while (j < nc && e[j].h == e[i].h && pack_equal(u, key, e[i].idx, e[j].idx, bi, bj))
            j++;
        /* e[i .. j) in task order: fill packed tasks up to pack_limit */
        int cur = -1;
        for (int q = i; q < j; q++) {
            const xm_task_t *k = &u->tasks[e[q].idx];
            if (cur < 0 || pbytes[cur] + k->bytes > pack_limit) {
                cur = npacked++;
                pbytes[cur] = 0;
                pfirst[cur] = e[q].idx;
            }
            pbytes[cur] += k->bytes;
            pcount[cur]++;
            group[e[q].idx] = cur;
        }
        i = j;
    }
    /* packs of one task stay ordinary tasks */
    int *pid = malloc(sizeof(int) * (npacked + 1));
    if (!pid) {
        free(pbytes);
        free(pfirst);
        free(pcount);
        r = XM_ERR(XMESH_ERR_NO_MEMORY, "packing: out of memory");
        goto out_free;
    }
    int nout = 0, kept = 0;
    for (int g = 0; g < npacked; g++)
        pid[g] = pcount[g] > 1 ? kept++ : -1;
    for (int t = 0; t < n; t++) {
        if (group[t] >= 0 && pid[group[t]] < 0)
            group[t] = -1;
        if (group[t] < 0)
            nout++;
        else
            npieces++;
    }
    nout += kept;
    int64_t nh = 0, nr = 0;
    for (int t = 0; t < n; t++)
        if (group[t] < 0 || pfirst[group[t]] == t) {
            nh += (int64_t)u->tasks[t].ngroups * u->tasks[t].group_size;
            nr += u->tasks[t].nrecv;
        }
    o = *u;
    o.tasks = malloc(sizeof *o.tasks * (nout + 1));
    o.holders = malloc(sizeof(int) * (nh + 1));
    o.recvs = malloc(sizeof(int) * (nr + 1));
    o.pieces = malloc(sizeof *o.pieces * (npieces + 1));
    o.tmeta = malloc(sizeof *o.tmeta * (u->ntensors + 1));
    int *slot = malloc(sizeof(int) * (kept + 1)); /* output index of each packed task */
    if (!o.tasks || !o.holders || !o.recvs || !o.pieces || !o.tmeta || !slot) {
        free(slot);
        free(pid);
        free(pbytes);
        free(pfirst);
        free(pcount);
        xm_taskset_free(&o);
        r = XM_ERR(XMESH_ERR_NO_MEMORY, "packing: out of memory for %d tasks", nout);
        goto out_free;
    }
    memcpy(o.tmeta, u->tmeta, sizeof *o.tmeta * u->ntensors);
    int m = 0, hoff = 0, roff = 0, poff = 0;
    /* ordinary tasks first, in order; then one packed task per kept pack */
    for (int pass = 0; pass < 2; pass++)
        for (int t = 0; t < n; t++) {
            const xm_task_t *k = &u->tasks[t];
            int g = group[t];
            if ((pass == 0) != (g < 0))
                continue;
            if (g < 0 || pfirst[g] == t) {
                xm_task_t q = *k;
                int nhold = k->ngroups * k->group_size;
                memcpy(o.holders + hoff, u->holders + k->holder_off, sizeof(int) * nhold);
                memcpy(o.recvs + roff, u->recvs + k->recv_off, sizeof(int) * k->nrecv);
                q.holder_off = hoff;
                q.recv_off = roff;
                hoff += nhold;
                roff += k->nrecv;
                if (g >= 0) {
                    memset(&q.box, 0, sizeof q.box);
                    q.tensor = -1;
                    q.npack = 0;
                    q.pack_off = poff + 0;
                    q.bytes = 0;
                    slot[pid[g]] = m;
                    /* pieces of this pack are contiguous: reserve them */
                    poff += pcount[g];
                }
                o.tasks[m++] = q;
            }
            if (g >= 0) {
                xm_task_t *q = &o.tasks[slot[pid[g]]];
                xm_piece_t *pc = &o.pieces[q->pack_off + q->npack++];
                int64_t v = xm_box_volume(&k->box, u->tmeta[k->tensor].ndim);
                pc->tensor = k->tensor;
                pc->box = k->box;
                pc->off = q->box.hi[0];
                pc->n = v;
                q->box.hi[0] += v;
                q->bytes += k->bytes;
            }
        }
    o.ntasks = m;
    o.npieces = poff;
    free(slot);
    free(pid);
    free(pbytes);
    free(pfirst);
    free(pcount);
    *out = o;
out_free:
    free(e);
    free(group);
    free(bi);
    free(bj);
    return r;
}

xmesh_result_t xm_decompose_many(int n, const xm_layout_t *src, const xm_layout_t *dst,
                                 const int *pack_key, const xm_hostmap_t *hosts, int64_t pack_max,
                                 int64_t pack_limit, xm_taskset_t *out)
{
    if (n < 1 || !src || !dst || !out)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xm_decompose_many: n = %d or a NULL array", n);
    xm_taskset_t *sub = calloc((size_t)n, sizeof *sub), u;
    memset(&u, 0, sizeof u);
    xmesh_result_t r = XMESH_SUCCESS;
    if (!sub)
        return XM_ERR(XMESH_ERR_NO_MEMORY, "plan of %d tensors: out of memory", n);
    for (int i = 0; i < n; i++) {
        if ((r = xm_decompose(&src[i], &dst[i], hosts, &sub[i]))) {
            char msg[800];
            snprintf(msg, sizeof msg, "%s", xmesh_last_error());
            r = XM_ERR(r, "tensor %d: %s", i, msg);
            goto out_free;
        }
    }
    if (n == 1) {
        /* One tensor: its own task set, tagged (tasks are zeroed, so tensor
         * 0), without copying ~170 bytes per task (262,144 tasks at scale).
         * Nothing to pack: two boxes of one tensor never share both holders
         * and receivers (each box is the intersection of one source shard,
         * held by its own devices, and one destination shard). */
        u = sub[0];
        memset(&sub[0], 0, sizeof sub[0]);
        if (!(u.tmeta = malloc(sizeof *u.tmeta))) {
            r = XM_ERR(XMESH_ERR_NO_MEMORY, "plan: out of memory");
            goto out_free;
        }
        u.tmeta[0].ndim = src[0].ndim;
        u.tmeta[0].elem_size = u.elem_size;
        u.ntensors = 1;
        *out = u;
        memset(&u, 0, sizeof u);
        goto out_free;
    }
    if ((r = union_concat(n, sub, src, &u)))
        goto out_free;
    if (pack_max > 0) {
        xm_taskset_t p;
        if ((r = union_pack(&u, pack_key, pack_max, pack_limit > 0 ? pack_limit : INT64_MAX, &p)))
            goto out_free;
        xm_taskset_free(&u);
        u = p;
    }
    *out = u;
    memset(&u, 0, sizeof u);
out_free:
    xm_taskset_free(&u);
    for (int i = 0; i < n; i++)
        xm_taskset_free(&sub[i]);
    free(sub);
    return r;
}
