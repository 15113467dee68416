/* Device-independent half of the NCCL backend (see xm_devplan.h). */
#include <stdlib.h>
#include <string.h>

#include "xm_devplan.h"

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

void xm_packdesc_from_geom(const xm_geom_t *g, int64_t a, int64_t cnt, xm_packdesc_t *out)
{
    xm_packdesc_t d;
    memset(&d, 0, sizeof d);
    d.ndim = g->n; /* geometry dims are inner first, descriptor dims outer first */
    for (int i = 0; i < g->n; i++) {
        d.ext[i] = g->ext[g->n - 1 - i];
        d.stride[i] = g->stride[g->n - 1 - i];
    }
    d.base = g->base;
    d.first = a;
    d.count = cnt;
    *out = d;
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* ------------------------------------------------------- device plans */

static int has_to_native(const xm_pstep_t *s)
{
    for (int i = 0; i < s->nops; i++)
        if (s->ops[i].kind == XM_POP_TO_NATIVE)
            return 1;
    return 0;
}

xmesh_result_t xm_devplan_build(const xm_prog_in_t *in, int rank, xm_devplan_t *out)
{
    xm_devplan_t d;
    memset(&d, 0, sizeof d);
    /* The device kernels move one dtype; converting plans run on the MPI
     * executor only (docs/DTYPES.md). */
    if (in->dtype != in->dst_dtype)
        return XM_ERR(XMESH_ERR_UNSUPPORTED,
                      "source dtype %s != destination dtype %s: the NCCL backend does not convert "
                      "yet (use the MPI backend for converting plans)",
                      xmesh_dtype_name(in->dtype), xmesh_dtype_name(in->dst_dtype));
    xm_chains_t ch;
    xmesh_result_t r = xm_chains_build(in, &ch);
    if (r)
        return r;
    r = xm_program_build(in, &ch, rank, &d.prog);
    d.nrounds = ch.nrounds;
    xm_chains_free(&ch);
    if (r)
        return r;
    const xm_program_t *p = &d.prog;
    int n = p->nsteps;
    int64_t *need = malloc(sizeof(int64_t) * (n + 1));
    d.off = malloc(sizeof(int64_t) * (n + 1));
    d.conv = calloc(n + 1, 1);
    d.peers = malloc(sizeof(int) * (2 * n + 1));
    if (!need || !d.off || !d.conv || !d.peers) {
        r = XM_ERR(XMESH_ERR_NO_MEMORY, "device plan: out of memory for %d steps", n);
        goto out_free;
    }
    for (int i = 0; i < n; i++) {
        const xm_pstep_t *s = &p->steps[i];
        int64_t bs = (int64_t)(s->mode == XM_MODE_GENERAL ? p->acc_es : p->es);
        d.conv[i] = p->acc_es != p->es && has_to_native(s);
        need[i] = s->mode == XM_MODE_SELF ? 0 : 2 * s->ce * bs;
        if (d.conv[i])
            need[i] += 2 * s->ce * (int64_t)p->es;
        if (s->prev >= 0)
            d.peers[d.npeers++] = s->prev;
        if (s->next >= 0)
            d.peers[d.npeers++] = s->next;
    }
    if ((r = xm_program_pool(p, need, 256, d.off, &d.pool_bytes)))
        goto out_free;
    qsort(d.peers, d.npeers, sizeof(int), cmp_int);
    int k = 0;
    for (int i = 0; i < d.npeers; i++)
        if (k == 0 || d.peers[i] != d.peers[k - 1])
            d.peers[k++] = d.peers[i];
    d.npeers = k;
    free(need);
    *out = d;
    return XMESH_SUCCESS;
out_free:
    free(need);
    xm_devplan_free(&d);
    return r;
}

void xm_devplan_free(xm_devplan_t *d)
{
    xm_program_free(&d->prog);
    free(d->off);
    free(d->conv);
    free(d->peers);
    memset(d, 0, sizeof *d);
}

int xm_devplan_lower(const xm_devplan_t *dp, const xm_rop_t *r, int n, xm_op_t *out)
{
    const xm_program_t *p = &dp->prog;
    int k = 0;
    for (int j = 0; j < n; j++) {
        const xm_rop_t *o = &r[j];
        const xm_pstep_t *s = &p->steps[o->step];
        int64_t a, cnt;
        xm_pstep_chunk(s, o->chunk, &a, &cnt);
        int64_t bs = (int64_t)(s->mode == XM_MODE_GENERAL ? p->acc_es : p->es);
        int64_t slot = dp->off[o->step] + (int64_t)o->slot * s->ce * bs;
        int64_t cbuf =
            dp->off[o->step] + 2 * s->ce * bs + (int64_t)o->slot * s->ce * (int64_t)p->es;
        int cv = dp->conv[o->step];
        /* the accumulator -> dtype conversion is done by the op before it */
        int fuse = cv && j + 1 < n && r[j + 1].kind == XM_POP_TO_NATIVE &&
                   r[j + 1].step == o->step && r[j + 1].chunk == o->chunk &&
                   r[j + 1].phase == o->phase;
        xm_op_t op;
        memset(&op, 0, sizeof op);
        op.phase = o->phase;
        op.count = cnt;
        op.buf = slot;
        switch (o->kind) {
        case XM_POP_RECV:
            op.kind = XM_OP_RECV;
            op.peer = s->prev;
            op.acc = s->in_acc;
            break;
        case XM_POP_SEND:
            op.kind = XM_OP_SEND;
            op.peer = s->next;
            op.acc = s->out_acc;
            op.buf = cv ? cbuf : slot;
            break;
        case XM_POP_PACK:
            op.kind = XM_OP_PACK;
            op.from_dst = o->blk;
            xm_packdesc_from_geom(o->blk ? &s->dg : &s->sg, a, cnt, &op.desc);
            break;
        case XM_POP_TO_ACC: /* to the accumulator, or straight to the dtype copy */
            op.kind = XM_OP_PACK;
            xm_packdesc_from_geom(&s->sg, a, cnt, &op.desc);
            op.acc = !fuse;
            op.buf = fuse ? cbuf : slot;
            j += fuse;
            break;
        case XM_POP_ADD_ACC:
            op.kind = XM_OP_REDUCE;
            xm_packdesc_from_geom(&s->sg, a, cnt, &op.desc);
            op.acc = 1;
            op.convert_out = fuse;
            op.out = cbuf;
            j += fuse;
            break;
        case XM_POP_TO_NATIVE:
            if (cv)
                return -1; /* never: it follows an accumulate of the same chunk */
            continue;      /* the accumulator is the dtype */
        case XM_POP_UNPACK:
            op.kind = XM_OP_UNPACK;
            xm_packdesc_from_geom(&s->dg, a, cnt, &op.desc);
            op.buf = cv ? cbuf : slot;
            break;
        case XM_POP_COPY:
            op.kind = XM_OP_COPY;
            xm_packdesc_from_geom(&s->sg, a, cnt, &op.desc);
            xm_packdesc_from_geom(&s->dg, a, cnt, &op.desc2);
            break;
        default:
            return -1;
        }
        out[k++] = op;
    }
    return k;
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
