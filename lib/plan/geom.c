/* Box geometry inside local blocks, pack/unpack, partial-sum accumulation
 * and checksums of the per-rank program (xm_program.h). Pure memory work. */
#include <math.h>
#include <string.h>

#include "xm_program.h"

void xm_geom_init(xm_geom_t *g, int ndim, const int64_t *blo, const int64_t *bhi,
                  const xm_box_t *box)
{
    int64_t bstride = 1;
    memset(g, 0, sizeof *g);
    /* Walk dims inner to outer: drop extent-1 dims, merge a dim into the
     * previous one when they are adjacent in memory. */
    for (int d = ndim - 1; d >= 0; d--) {
        int64_t ext = box->hi[d] - box->lo[d];
        g->base += (box->lo[d] - blo[d]) * bstride;
        if (ext != 1) {
            if (g->n > 0 && bstride == g->ext[g->n - 1] * g->stride[g->n - 1]) {
                g->ext[g->n - 1] *= ext;
            } else {
                g->ext[g->n] = ext;
                g->stride[g->n] = bstride;
                g->n++;
            }
        }
        bstride *= bhi[d] - blo[d];
    }
    if (g->n == 0) {
        g->n = 1;
        g->ext[0] = 1;
        g->stride[0] = 1;
    }
}

/* Iterator over box-linear elements: idx is the multi-index (inner first),
 * off the element offset in the block. */
typedef struct {
    const xm_geom_t *g;
    int64_t idx[XM_MAX_DIMS];
    int64_t off;
} geom_it_t;

static void it_init(geom_it_t *it, const xm_geom_t *g, int64_t a)
{
    it->g = g;
    it->off = g->base;
    for (int k = 0; k < g->n; k++) {
        it->idx[k] = a % g->ext[k];
        a /= g->ext[k];
        it->off += it->idx[k] * g->stride[k];
    }
}

/* Elements from the current one that are consecutive in memory. */
static inline int64_t it_run(const geom_it_t *it)
{
    return it->g->stride[0] == 1 ? it->g->ext[0] - it->idx[0] : 1;
}

static inline void it_adv(geom_it_t *it, int64_t n)
{
    const xm_geom_t *g = it->g;
    it->idx[0] += n;
    it->off += n * g->stride[0];
    if (it->idx[0] < g->ext[0])
        return;
    it->off -= g->ext[0] * g->stride[0];
    it->idx[0] = 0;
    for (int k = 1; k < g->n; k++) {
        it->idx[k]++;
        it->off += g->stride[k];
        if (it->idx[k] < g->ext[k])
            return;
        it->off -= g->ext[k] * g->stride[k];
        it->idx[k] = 0;
    }
}

int xm_geom_contig(const xm_geom_t *g, int64_t a, int64_t c, int64_t *off)
{
    geom_it_t it;
    it_init(&it, g, a);
    *off = it.off;
    return it_run(&it) >= c;
}

void xm_acc_to_native(xmesh_dtype_t dt, void *buf, int64_t n)
{
    xm_convert(dt, buf, xm_dtype_acc(dt), buf, n);
}

/* acc[i] (+)= native[i] for n elements. Integers wrap (unsigned math). */
static void acc_op(xmesh_dtype_t dt, int add, void *acc, const void *nat, int64_t n)
{
    if (!add && dt != XMESH_F16 && dt != XMESH_BF16) {
        memcpy(acc, nat, n * xmesh_dtype_size(dt));
        return;
    }
#define XM_ADD_LOOP(T)                                                                             \
    do {                                                                                           \
        T *a_ = acc;                                                                               \
        const T *b_ = nat;                                                                         \
        for (int64_t i = 0; i < n; i++)                                                            \
            a_[i] += b_[i];                                                                        \
    } while (0)
    switch (dt) {
    case XMESH_U8:
    case XMESH_I8:
        XM_ADD_LOOP(uint8_t);
        break;
    case XMESH_I32:
        XM_ADD_LOOP(uint32_t);
        break;
    case XMESH_I64:
        XM_ADD_LOOP(uint64_t);
        break;
    case XMESH_F32:
        XM_ADD_LOOP(float);
        break;
    case XMESH_F64:
        XM_ADD_LOOP(double);
        break;
#undef XM_ADD_LOOP
    case XMESH_F16:
    case XMESH_BF16: {
        float *a = acc;
        const uint16_t *b = nat;
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, b + i, 2);
            float v = dt == XMESH_F16 ? xm_f16_to_f32(h) : xm_bf16_to_f32(h);
            a[i] = add ? a[i] + v : v;
        }
        break;
    }
    default:
        break;
    }
}

void xm_geom_copy(int op, const xm_geom_t *g, xmesh_dtype_t dt, void *block, void *buf, int64_t a,
                  int64_t c)
{
    size_t es = xmesh_dtype_size(dt), as = xm_dtype_acc_size(dt);
    geom_it_t it;
    it_init(&it, g, a);
    int64_t done = 0;
    while (done < c) {
        int64_t run = it_run(&it);
        if (run > c - done)
            run = c - done;
        char *mem = (char *)block + it.off * es;
        switch (op) {
        case XM_COPY_PACK:
            memcpy((char *)buf + done * es, mem, run * es);
            break;
        case XM_COPY_UNPACK:
            memcpy(mem, (char *)buf + done * es, run * es);
            break;
        case XM_COPY_TO_ACC:
            acc_op(dt, 0, (char *)buf + done * as, mem, run);
            break;
        default:
            acc_op(dt, 1, (char *)buf + done * as, mem, run);
            break;
        }
        done += run;
        it_adv(&it, run);
    }
}

void xm_geom_copy_cv(int op, const xm_geom_t *g, xmesh_dtype_t bdt, xmesh_dtype_t fdt, void *block,
                     void *buf, int64_t a, int64_t c)
{
    if (bdt == fdt) {
        xm_geom_copy(op, g, bdt, block, buf, a, c);
        return;
    }
    size_t bs = xmesh_dtype_size(bdt), fs = xmesh_dtype_size(fdt);
    geom_it_t it;
    it_init(&it, g, a);
    int64_t done = 0;
    while (done < c) {
        int64_t run = it_run(&it);
        if (run > c - done)
            run = c - done;
        char *mem = (char *)block + it.off * bs, *b = (char *)buf + done * fs;
        if (op == XM_COPY_PACK)
            xm_convert(fdt, b, bdt, mem, run);
        else
            xm_convert(bdt, mem, fdt, b, run);
        done += run;
        it_adv(&it, run);
    }
}

void xm_geom_copy2_cv(const xm_geom_t *gs, xmesh_dtype_t sdt, const void *src, const xm_geom_t *gd,
                      xmesh_dtype_t ddt, void *dst, int64_t a, int64_t c)
{
    if (sdt == ddt) {
        xm_geom_copy2(gs, src, gd, dst, xmesh_dtype_size(sdt), a, c);
        return;
    }
    size_t ss = xmesh_dtype_size(sdt), ds = xmesh_dtype_size(ddt);
    geom_it_t is, id;
    it_init(&is, gs, a);
    it_init(&id, gd, a);
    int64_t done = 0;
    while (done < c) {
        int64_t run = it_run(&is), rd = it_run(&id);
        if (rd < run)
            run = rd;
        if (run > c - done)
            run = c - done;
        xm_convert(ddt, (char *)dst + id.off * ds, sdt, (const char *)src + is.off * ss, run);
        done += run;
        it_adv(&is, run);
        it_adv(&id, run);
    }
}

void xm_geom_copy2(const xm_geom_t *gs, const void *src, const xm_geom_t *gd, void *dst, size_t es,
                   int64_t a, int64_t c)
{
    geom_it_t is, id;
    it_init(&is, gs, a);
    it_init(&id, gd, a);
    int64_t done = 0;
    while (done < c) {
        int64_t run = it_run(&is), rd = it_run(&id);
        if (rd < run)
            run = rd;
        if (run > c - done)
            run = c - done;
        memcpy((char *)dst + id.off * es, (const char *)src + is.off * es, run * es);
        done += run;
        it_adv(&is, run);
        it_adv(&id, run);
    }
}

/* FNV-1a over the bytes, in order: the same value whether the elements come
 * as one run or many. A debugging aid (XMESH_CHECK), not a fast path. */
static uint64_t fnv(uint64_t h, const unsigned char *p, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

uint64_t xm_geom_hash(const xm_geom_t *g, const void *block, size_t es, int64_t a, int64_t c)
{
    uint64_t h = 1469598103934665603ull;
    if (!g)
        return fnv(h, block, c);
    geom_it_t it;
    it_init(&it, g, a);
    int64_t done = 0;
    while (done < c) {
        int64_t run = it_run(&it);
        if (run > c - done)
            run = c - done;
        h = fnv(h, (const unsigned char *)block + it.off * es, run * (int64_t)es);
        done += run;
        it_adv(&it, run);
    }
    return h;
}
