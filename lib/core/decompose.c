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

/* Index of the shard of an array_split(n, k) that contains position pos. */
static int64_t shard_of(int64_t n, int64_t k, int64_t pos)
{
    int64_t base = n / k, rem = n % k;
    if (rem == 0)
        return base ? pos / base : 0;
    int64_t big = rem * (base + 1); /* rem > 0: k >= 2, so base + 1 <= n, big <= n */
    if (pos < big)
        return pos / (base + 1);
    return rem + (pos - big) / base;
}

static xmesh_result_t make_cuts(const xm_layout_t *s, const xm_layout_t *t, int d, dim_cuts_t *c)
{
    int64_t ks = xm_layout_nshards(s, d), kt = xm_layout_nshards(t, d), n = s->shape[d];
    int64_t cap = ks + kt + 2;
    int64_t *pts = malloc(sizeof *pts * cap);
    int64_t m = 0;
    if (!pts)
        return XM_ERR(XMESH_ERR_NO_MEMORY, "decompose: out of memory for cut points");
    for (int64_t i = 0; i <= ks; i++)
        pts[m++] = i == ks ? n : (int64_t)(i * (n / ks) + (i < n % ks ? i : n % ks));
    for (int64_t i = 0; i <= kt; i++)
        pts[m++] = i == kt ? n : (int64_t)(i * (n / kt) + (i < n % kt ? i : n % kt));
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
        c->sidx[i] = shard_of(n, ks, pts[i]);
        c->didx[i] = shard_of(n, kt, pts[i]);
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
    if (src->elem_size != dst->elem_size)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "source element size %zu != destination %zu",
                      src->elem_size, dst->elem_size);
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
    keyed_t *scratch = NULL;
    int64_t(*sshard)[XM_MAX_DIMS] = NULL, (*dshard)[XM_MAX_DIMS] = NULL;
    int *sgroup = NULL;

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
    /* Shard tuple of every device on each side. */
    int na = src->mesh.ndev, nb = dst->mesh.ndev;
    sshard = malloc(sizeof *sshard * na);
    dshard = malloc(sizeof *dshard * nb);
    sgroup = malloc(sizeof *sgroup * na);
    scratch = malloc(sizeof *scratch * (na > nb ? na : nb));
    int64_t holders_cap = nboxes * na, recv_cap = nboxes * nb;
    ts.tasks = malloc(sizeof *ts.tasks * (nboxes ? nboxes : 1));
    if (!sshard || !dshard || !sgroup || !scratch || !ts.tasks) {
        r = XM_ERR(XMESH_ERR_NO_MEMORY, "decompose: out of memory for %lld boxes",
                   (long long)nboxes);
        goto out_free_all;
    }
    int ngroups = 1;
    for (int a = 0; a < src->mesh.ndim; a++)
        if (src->spec.partial_mask & (1u << a))
            ngroups *= src->mesh.shape[a];
    for (int i = 0; i < na; i++) {
        int c[XM_MAX_MESH_DIMS];
        xm_mesh_coord(&src->mesh, i, c);
        for (int d = 0; d < nd; d++)
            sshard[i][d] = xm_layout_shard_index(src, d, c);
        sgroup[i] = partial_group(src, c);
    }
    for (int i = 0; i < nb; i++) {
        int c[XM_MAX_MESH_DIMS];
        xm_mesh_coord(&dst->mesh, i, c);
        for (int d = 0; d < nd; d++)
            dshard[i][d] = xm_layout_shard_index(dst, d, c);
    }
    /* Holder and receiver counts per box are constant over the grid:
     * holders = na / prod(src shards), receivers = nb / prod(dst shards). */
    (void)holders_cap;
    (void)recv_cap;
    int64_t sprod = 1, dprod = 1;
    for (int d = 0; d < nd; d++) {
        sprod *= xm_layout_nshards(src, d);
        dprod *= xm_layout_nshards(dst, d);
    }
    int nhold = (int)(na / sprod / 1), nrecv = (int)(nb / dprod);
    ts.holders = malloc(sizeof(int) * (nboxes * nhold + 1));
    ts.recvs = malloc(sizeof(int) * (nboxes * nrecv + 1));
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
        for (int d = 0; d < nd; d++) {
            t->box.lo[d] = cuts[d].cut[iv[d]];
            t->box.hi[d] = cuts[d].cut[iv[d] + 1];
        }
        int k = 0;
        for (int i = 0; i < na; i++) {
            int ok = 1;
            for (int d = 0; d < nd && ok; d++)
                ok = sshard[i][d] == cuts[d].sidx[iv[d]];
            if (ok)
                scratch[k++] = (keyed_t){sgroup[i], src->mesh.devs[i]};
        }
        qsort(scratch, k, sizeof *scratch, cmp_keyed);
        t->ngroups = ngroups;
        t->group_size = k / ngroups;
        t->holder_off = hoff;
        for (int i = 0; i < k; i++)
            ts.holders[hoff++] = scratch[i].dev;
        k = 0;
        for (int i = 0; i < nb; i++) {
            int ok = 1;
            for (int d = 0; d < nd && ok; d++)
                ok = dshard[i][d] == cuts[d].didx[iv[d]];
            if (ok)
                scratch[k++] = (keyed_t){host_of(hosts, dst->mesh.devs[i]), dst->mesh.devs[i]};
        }
        qsort(scratch, k, sizeof *scratch, cmp_keyed);
        t->nrecv = k;
        t->recv_off = roff;
        for (int i = 0; i < k; i++)
            ts.recvs[roff++] = scratch[i].dev;
        t->bytes = xm_box_volume(&t->box, nd) * (int64_t)src->elem_size;
        /* Receiver hosts that hold the whole value locally need no NIC. */
        int nhosts_remote = 0;
        for (int i = 0; i < k; i++) {
            int h = scratch[i].key;
            if (i > 0 && scratch[i - 1].key == h)
                continue;
            int covered = 1;
            for (int g = 0; g < ngroups && covered; g++) {
                int found = 0;
                for (int j = 0; j < t->group_size && !found; j++)
                    found = host_of(hosts, ts.holders[t->holder_off + g * t->group_size + j]) == h;
                covered = found;
            }
            nhosts_remote += !covered;
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
                       buf, src->elem_size);
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
    ts.elem_size = src->elem_size;
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
    free(scratch);
    free(sgroup);
    free(sshard);
    free(dshard);
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
    memset(ts, 0, sizeof *ts);
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
