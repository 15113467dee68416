/* Boxing: SBP changes on one mesh, axis by axis (design note in sbp.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/sbp.h"

static MPI_Datatype mpi_type(xmesh_dtype_t dt)
{
    return dt == XMESH_I32 ? MPI_INT : MPI_FLOAT;
}

/* "boxing 'S(0),B' -> 'B,B' axis 0" for the messages of the collectives. */
static void box_what(char *w, size_t n, const xmp_tensor_t *x, const xmp_tensor_t *y, int a)
{
    snprintf(w, n, "boxing '%s' -> '%s' axis %d", x->spec, y->spec, a);
}

static void split_range(int64_t n, int64_t k, int64_t i, int64_t *lo, int64_t *hi)
{
    int64_t q = n / k, r = n % k;
    *lo = i * q + (i < r ? i : r);
    *hi = *lo + q + (i < r ? 1 : 0);
}

static int64_t volume(int ndim, const int64_t *e)
{
    int64_t v = 1;
    for (int d = 0; d < ndim; d++)
        v *= e[d];
    return v;
}

/* Does another axis than a split dim d in sbp? */
static int shared_split(const xmp_mesh_t *m, const xmp_sbp_t *sbp, int a, int d)
{
    for (int b = 0; b < m->ndim; b++)
        if (b != a && sbp[b].kind == XMP_S && sbp[b].dim == d)
            return 1;
    return 0;
}

/* A block layout on the mesh for redistribute(): an SBP, optionally with the "natural" cut of
 * axis nat: the block the rank would hold with axis nat unsplit (B), cut along dim nat_dim into
 * shape[nat] consecutive pieces by array_split, piece coord[nat]. This is the layout a
 * per-axis collective over the axis-nat sub-communicator produces (or consumes), whatever
 * other axes split nat_dim. */
typedef struct {
    const xmp_sbp_t *sbp;
    int nat, nat_dim; /* nat = -1: plain SBP blocks */
} lay_t;

static void lay_block(const xmp_mesh_t *m, int nd, const int64_t *shape, lay_t l, const int *c,
                      int64_t *lo, int64_t *hi)
{
    if (l.nat < 0) {
        xmp_block(m, nd, shape, l.sbp, c, lo, hi);
        return;
    }
    xmp_sbp_t s[XMP_MAX_MESH_DIMS];
    memcpy(s, l.sbp, sizeof(xmp_sbp_t) * (size_t)m->ndim);
    s[l.nat] = xmp_sbp_b();
    xmp_block(m, nd, shape, s, c, lo, hi);
    int64_t a, b, base = lo[l.nat_dim];
    split_range(hi[l.nat_dim] - base, m->shape[l.nat], c[l.nat], &a, &b);
    lo[l.nat_dim] = base + a;
    hi[l.nat_dim] = base + b;
}

/* Does the layout cut the tensor over axis b (ranks differing on b hold different data)? */
static int lay_cuts(lay_t l, int b)
{
    return l.sbp[b].kind == XMP_S || b == l.nat;
}

static void coords(const xmp_mesh_t *m, int p, int *c)
{
    for (int b = m->ndim - 1; b >= 0; b--) {
        c[b] = p % m->shape[b];
        p /= m->shape[b];
    }
}

/* Is S(d) on axis a (in sbp) the natural cut of axis a on every rank of the mesh, i.e. does the
 * per-axis collective over axis a produce exactly these blocks? Pure function of the geometry:
 * every rank gets the same answer. */
static int natural(const xmp_mesh_t *m, int nd, const int64_t *shape, const xmp_sbp_t *sbp, int a)
{
    lay_t pl = {sbp, -1, 0}, nl = {sbp, a, sbp[a].dim};
    for (int p = 0; p < m->size; p++) {
        int c[XMP_MAX_MESH_DIMS];
        int64_t lo0[XMP_MAX_DIMS], hi0[XMP_MAX_DIMS], lo1[XMP_MAX_DIMS], hi1[XMP_MAX_DIMS];
        coords(m, p, c);
        lay_block(m, nd, shape, pl, c, lo0, hi0);
        lay_block(m, nd, shape, nl, c, lo1, hi1);
        for (int d = 0; d < nd; d++)
            if (lo0[d] != lo1[d] || hi0[d] != hi1[d])
                return 0;
    }
    return 1;
}

/* dst box += src box (the same geometry as xmp_copy_box), f32 or i32 elements. */
static void add_box(int nd, const int64_t *ext, const float *src, xmesh_dtype_t dt, float *dst,
                    const int64_t *ds, const int64_t *lo_d)
{
    int64_t n = volume(nd, ext);
    if (!n)
        return;
    int64_t idx[XMP_MAX_DIMS] = {0}, row = ext[nd - 1], rows = n / row;
    for (int64_t r = 0; r < rows; r++) {
        int64_t o = 0;
        for (int d = 0; d < nd; d++)
            o = o * ds[d] + lo_d[d] + idx[d];
        const float *s = src + r * row;
        if (dt == XMESH_I32)
            for (int64_t i = 0; i < row; i++)
                ((int32_t *)dst)[o + i] += ((const int32_t *)s)[i];
        else
            for (int64_t i = 0; i < row; i++)
                dst[o + i] += s[i];
        for (int d = nd - 2; d >= 0; d--) {
            if (++idx[d] < ext[d])
                break;
            idx[d] = 0;
        }
    }
}

/* The S(di) -> S(dj) all-to-all over an axis of na ranks: packs x's sub-boxes, one per
 * destination (my dim-di chunk, its dim-dj chunk), into sb with counts c0 and displacements d0,
 * and sets the counts c1 and displacements d1 of the sub-boxes y receives. */
static void a2a_pack(const xmp_tensor_t *x, const xmp_tensor_t *y, int di, int dj, int na, void *sb,
                     int *c0, int *d0, int *c1, int *d1, size_t esz)
{
    int nd = x->ndim;
    int64_t zero[XMP_MAX_DIMS] = {0}, ext[XMP_MAX_DIMS], off[XMP_MAX_DIMS] = {0}, lo, hi, o = 0;
    memcpy(ext, x->lshape, sizeof(int64_t) * (size_t)nd);
    for (int c = 0; c < na; c++) {
        split_range(x->lshape[dj], na, c, &lo, &hi);
        ext[dj] = hi - lo;
        off[dj] = lo;
        xmp_copy_box(nd, ext, x->data, x->lshape, off, (char *)sb + (size_t)o * esz, ext, zero,
                     esz);
        c0[c] = (int)volume(nd, ext);
        d0[c] = (int)o;
        o += c0[c];
    }
    o = 0;
    memcpy(ext, y->lshape, sizeof(int64_t) * (size_t)nd);
    for (int c = 0; c < na; c++) {
        split_range(y->lshape[di], na, c, &lo, &hi);
        ext[di] = hi - lo;
        c1[c] = (int)volume(nd, ext);
        d1[c] = (int)o;
        o += c1[c];
    }
}

/* Places the received sub-boxes (rb, displacements d1) into y's dim-di chunks. */
static void a2a_unpack(const void *rb, const int *d1, int di, int na, xmp_tensor_t *y, size_t esz)
{
    int nd = y->ndim;
    int64_t zero[XMP_MAX_DIMS] = {0}, ext[XMP_MAX_DIMS], off[XMP_MAX_DIMS] = {0}, lo, hi;
    memcpy(ext, y->lshape, sizeof(int64_t) * (size_t)nd);
    for (int c = 0; c < na; c++) {
        split_range(y->lshape[di], na, c, &lo, &hi);
        ext[di] = hi - lo;
        off[di] = lo;
        xmp_copy_box(nd, ext, (const char *)rb + (size_t)d1[c] * esz, ext, zero, y->data, y->lshape,
                     off, esz);
    }
}

/* General redistribution of one global tensor from layout xl (my block xd, shape xs at xo) to
 * layout yl (yd, ys, yo): one all-to-all over the mesh communicator (point-to-point pairs only
 * between ranks that exchange data). Receiver r takes from each sender s that matches r's
 * coordinates on every axis that xl does not cut (B or P there, so the senders' blocks tile the
 * global tensor once and a P value keeps its P coordinate) the intersection of s's x block and
 * r's y block. Every element a rank lacks is received once and nothing else: the fewest bytes
 * any exchange between these two layouts can send.
 * sum_a >= 0: x is P on axis sum_a and y is not: senders also range over axis sum_a and the
 * receiver sums what it receives into yd (zeroed by the caller) in rank order — a reduce-scatter
 * sent straight to the final blocks, each partial crossing the network once.
 * match_a >= 0: senders and receivers also match on axis match_a (S -> P: y's blocks on an
 * axis-match_a group are the same block G and the sender with my coordinate there fills it). */
static xmesh_result_t redistribute(const xmp_mesh_t *m, int nd, const int64_t *shape,
                                   xmesh_dtype_t dt, lay_t xl, const float *xd, const int64_t *xs,
                                   const int64_t *xo, lay_t yl, float *yd, const int64_t *ys,
                                   const int64_t *yo, int sum_a, int match_a, const char *w)
{
    int n = m->size;
    int *sc = calloc((size_t)n * 4, sizeof(int));
    float *sbuf = NULL, *rbuf = NULL; /* sized exactly after the counts */
    xmesh_result_t r = XMESH_SUCCESS;
    if (!sc) {
        r = xmp_err(XMESH_ERR_NO_MEMORY, "%s: out of memory", w);
        goto out_free;
    }
    int *scnt = sc, *sdis = sc + n, *rcnt = sc + 2 * n, *rdis = sc + 3 * n;
    int64_t so = 0, ro = 0;
    /* pass 1: counts; pass 2: pack (my x block ∩ p's y block) */
    for (int pass = 0; pass < 2; pass++) {
        for (int p = 0; p < n; p++) {
            if (pass == 1 && !scnt[p])
                continue;
            int cp[XMP_MAX_MESH_DIMS];
            coords(m, p, cp);
            int ok = 1; /* me -> p and p -> me */
            for (int b = 0; b < m->ndim; b++)
                if (((!lay_cuts(xl, b) && b != sum_a) || b == match_a) && cp[b] != m->coord[b])
                    ok = 0;
            int64_t lo[XMP_MAX_DIMS], hi[XMP_MAX_DIMS], ilo[XMP_MAX_DIMS], ext[XMP_MAX_DIMS];
            int64_t zero[XMP_MAX_DIMS] = {0}, srel[XMP_MAX_DIMS];
            if (pass == 0) {
                sdis[p] = (int)so;
                scnt[p] = 0;
                rdis[p] = (int)ro;
                rcnt[p] = 0;
            }
            if (!ok)
                continue;
            lay_block(m, nd, shape, yl, cp, lo, hi);
            for (int d = 0; d < nd; d++) {
                ilo[d] = lo[d] > xo[d] ? lo[d] : xo[d];
                int64_t ih = hi[d] < xo[d] + xs[d] ? hi[d] : xo[d] + xs[d];
                ext[d] = ih > ilo[d] ? ih - ilo[d] : 0;
                srel[d] = ilo[d] - xo[d];
            }
            if (pass == 1) {
                xmp_copy_box(nd, ext, xd, xs, srel, sbuf + sdis[p], ext, zero, 4);
                continue;
            }
            scnt[p] = (int)volume(nd, ext);
            so += scnt[p];
            lay_block(m, nd, shape, xl, cp, lo, hi); /* p's x block ∩ my y block */
            for (int d = 0; d < nd; d++) {
                ilo[d] = lo[d] > yo[d] ? lo[d] : yo[d];
                int64_t ih = hi[d] < yo[d] + ys[d] ? hi[d] : yo[d] + ys[d];
                ext[d] = ih > ilo[d] ? ih - ilo[d] : 0;
            }
            rcnt[p] = (int)volume(nd, ext);
            ro += rcnt[p];
        }
        if (pass == 0) { /* my block once per receiver; rbuf: once (sum_a: once per partial) */
            sbuf = malloc((size_t)(so ? so : 1) * 4);
            rbuf = malloc((size_t)(ro ? ro : 1) * 4);
            if (!sbuf || !rbuf) {
                r = xmp_err(XMESH_ERR_NO_MEMORY, "%s: out of memory", w);
                goto out_free;
            }
        }
    }
    r = xmp_alltoallv(sbuf, scnt, sdis, rbuf, rcnt, rdis, mpi_type(dt), m->comm, w);
    if (r)
        goto out_free;
    for (int p = 0; p < n; p++) {
        if (!rcnt[p])
            continue;
        int cp[XMP_MAX_MESH_DIMS];
        coords(m, p, cp);
        int64_t lo[XMP_MAX_DIMS], hi[XMP_MAX_DIMS], ext[XMP_MAX_DIMS], drel[XMP_MAX_DIMS];
        int64_t zero[XMP_MAX_DIMS] = {0};
        lay_block(m, nd, shape, xl, cp, lo, hi);
        for (int d = 0; d < nd; d++) {
            int64_t il = lo[d] > yo[d] ? lo[d] : yo[d];
            int64_t ih = hi[d] < yo[d] + ys[d] ? hi[d] : yo[d] + ys[d];
            ext[d] = ih - il;
            drel[d] = il - yo[d];
        }
        if (sum_a >= 0)
            add_box(nd, ext, rbuf + rdis[p], dt, yd, ys, drel);
        else
            xmp_copy_box(nd, ext, rbuf + rdis[p], ext, zero, yd, ys, drel, 4);
    }
out_free:
    free(rbuf);
    free(sbuf);
    free(sc);
    return r;
}

static xmesh_result_t step_axis(const xmp_tensor_t *x, int a, xmp_tensor_t *y, int shared);

/* A step on axis a where another axis splits the dim that axis a splits before or after
 * (design note in sbp.h, "shared split"). The per-axis collective of step() produces and
 * consumes the natural cut of axis a (lay_t); when the flat array_split blocks are that cut on
 * every rank, the step is that one collective over the axis-a sub-communicator. Otherwise:
 *   P -> S(d): one redistribute() that sends every partial straight to the rank whose flat
 *              block holds it and sums there (a direct reduce-scatter: each element needs the
 *              p_a - 1 partials it lacks, one more when its holder's x block lacks it);
 *   S(d) -> P: one redistribute() that keeps what lies in the rank's destination block and
 *              sends only the rest (to the rank with the same coordinate on axis a);
 *   otherwise: one redistribute() (it sends exactly the elements each rank lacks).
 * The caller has checked that from != to. */
static xmesh_result_t shared_step(const xmp_tensor_t *x, int a, xmp_tensor_t *y, const char *w)
{
    const xmp_mesh_t *m = x->mesh;
    xmp_sbp_t from = x->sbp[a], to = y->sbp[a];
    int nd = x->ndim;
    int xnat = from.kind != XMP_S || natural(m, nd, x->shape, x->sbp, a);
    int ynat = to.kind != XMP_S || natural(m, nd, y->shape, y->sbp, a);
    lay_t xl = {x->sbp, -1, 0}, yl = {y->sbp, -1, 0};
    if (xnat && ynat)
        return step_axis(x, a, y, 0); /* one collective over axis a */
    if (from.kind != XMP_P && to.kind != XMP_P)
        return redistribute(m, nd, x->shape, x->dtype, xl, x->data, x->lshape, x->loff, yl, y->data,
                            y->lshape, y->loff, -1, -1, w);
    if (from.kind == XMP_P) /* P -> S(d), y not the natural cut: reduce straight to the blocks */
        return redistribute(m, nd, x->shape, x->dtype, xl, x->data, x->lshape, x->loff, yl, y->data,
                            y->lshape, y->loff, a, -1, w);
    /* S(d) -> P, x not the natural cut: each rank places the part of its block that lies in
     * its destination block G (the block with axis a unsplit) and sends the rest to the rank of
     * the group that holds it in y with the same coordinate on axis a: every element is placed
     * once per axis-a group, and only the elements a rank cannot place itself move. */
    return redistribute(m, nd, x->shape, x->dtype, xl, x->data, x->lshape, x->loff, yl, y->data,
                        y->lshape, y->loff, -1, a, w);
}

/* One step: y (allocated by the caller with x's SBP except `to` on axis a)
 * receives x converted on axis a. shared = 0: the per-axis collective even where another axis
 * splits the same dim (x and y may then be natural-cut views, see shared_step). */
static xmesh_result_t step_axis(const xmp_tensor_t *x, int a, xmp_tensor_t *y, int shared)
{
    const xmp_mesh_t *m = x->mesh;
    xmp_sbp_t from = x->sbp[a], to = y->sbp[a];
    MPI_Comm comm = m->axis[a];
    MPI_Datatype ty = mpi_type(x->dtype);
    int na = m->shape[a], me = m->coord[a], nd = x->ndim;
    int64_t zero[XMP_MAX_DIMS] = {0};
    size_t esz = 4;

    if (xmp_sbp_eq(from, to)) {
        memcpy(y->data, x->data, (size_t)x->lcount * esz);
        return XMESH_SUCCESS;
    }
    char w[200];
    box_what(w, sizeof w, x, y, a);
    if (shared && ((from.kind == XMP_S && shared_split(m, x->sbp, a, from.dim)) ||
                   (to.kind == XMP_S && shared_split(m, x->sbp, a, to.dim))))
        return shared_step(x, a, y, w);
    /* G: my block with axis a unsplit (= the B local shape on axis a). */
    const int64_t *G = from.kind == XMP_S ? y->lshape : x->lshape;
    int64_t lo, hi;
    if (from.kind == XMP_P && to.kind == XMP_B) {
        memcpy(y->data, x->data, (size_t)x->lcount * esz);
        return xmp_allreduce(y->data, (int)y->lcount, ty, MPI_SUM, comm, w);
    }
    if (to.kind == XMP_P) { /* B -> P: holder keeps; S -> P: place into zeros */
        if (from.kind == XMP_B) {
            if (me == 0)
                memcpy(y->data, x->data, (size_t)x->lcount * esz);
            return XMESH_SUCCESS;
        }
        int64_t off[XMP_MAX_DIMS] = {0};
        split_range(y->lshape[from.dim], na, me, &lo, &hi);
        off[from.dim] = lo;
        xmp_copy_box(nd, x->lshape, x->data, x->lshape, zero, y->data, y->lshape, off, esz);
        return XMESH_SUCCESS;
    }
    if (from.kind == XMP_B) { /* B -> S(d): local slice */
        int64_t off[XMP_MAX_DIMS] = {0};
        split_range(x->lshape[to.dim], na, me, &lo, &hi);
        off[to.dim] = lo;
        xmp_copy_box(nd, y->lshape, x->data, x->lshape, off, y->data, y->lshape, zero, esz);
        return XMESH_SUCCESS;
    }
    /* collectives with per-rank counts */
    xmesh_result_t r = XMESH_SUCCESS;
    int *cnt = NULL;
    float *buf = NULL;
    cnt = calloc((size_t)na * 4, sizeof(int));
    int64_t buf_elems = (from.kind == XMP_S && to.kind == XMP_B) ? y->lcount
                        : (from.kind == XMP_P)                   ? x->lcount
                                                                 : x->lcount + y->lcount;
    buf = calloc((size_t)(buf_elems ? buf_elems : 1), esz);
    if (!cnt || !buf) {
        r = xmp_err(XMESH_ERR_NO_MEMORY, "boxing '%s': out of memory", x->spec);
        goto out_free;
    }
    int *c0 = cnt, *d0 = cnt + na, *c1 = cnt + 2 * na, *d1 = cnt + 3 * na;
    int64_t ext[XMP_MAX_DIMS], off[XMP_MAX_DIMS];
    if (from.kind == XMP_P) { /* P -> S(d): pack by destination, reduce-scatter */
        int d = to.dim;
        int64_t o = 0;
        memcpy(ext, G, sizeof(int64_t) * (size_t)nd);
        memset(off, 0, sizeof off);
        for (int c = 0; c < na; c++) {
            split_range(G[d], na, c, &lo, &hi);
            ext[d] = hi - lo;
            off[d] = lo;
            xmp_copy_box(nd, ext, x->data, G, off, buf + o, ext, zero, esz);
            c0[c] = (int)volume(nd, ext);
            o += c0[c];
        }
        r = xmp_reduce_scatter(buf, y->data, c0, ty, MPI_SUM, comm, w);
    } else if (to.kind == XMP_B) { /* S(d) -> B: all-gather, unpack */
        int d = from.dim;
        int64_t o = 0, outer = volume(d, G);
        memcpy(ext, G, sizeof(int64_t) * (size_t)nd);
        for (int c = 0; c < na; c++) {
            split_range(G[d], na, c, &lo, &hi);
            ext[d] = hi - lo;
            c0[c] = (int)volume(nd, ext);
            d0[c] = (int)o;
            o += c0[c];
        }
        float *dst = outer == 1 ? (float *)y->data : buf;
        r = xmp_allgatherv(x->data, (int)x->lcount, dst, c0, d0, ty, comm, w);
        if (!r && outer != 1) {
            memset(off, 0, sizeof off);
            for (int c = 0; c < na; c++) {
                split_range(G[d], na, c, &lo, &hi);
                ext[d] = hi - lo;
                off[d] = lo;
                xmp_copy_box(nd, ext, buf + d0[c], ext, zero, y->data, G, off, esz);
            }
        }
    } else { /* S(i) -> S(j): all-to-all of sub-boxes */
        float *sb = buf, *rb = buf + x->lcount;
        a2a_pack(x, y, from.dim, to.dim, na, sb, c0, d0, c1, d1, esz);
        r = xmp_alltoallv(sb, c0, d0, rb, c1, d1, ty, comm, w);
        if (!r)
            a2a_unpack(rb, d1, from.dim, na, y, esz);
    }
out_free:
    free(buf);
    free(cnt);
    return r;
}

static xmesh_result_t step(const xmp_tensor_t *x, int a, xmp_tensor_t *y)
{
    return step_axis(x, a, y, 1);
}

static int in_pass(int pass, xmp_sbp_t from, xmp_sbp_t to)
{
    switch (pass) {
    case 0:
        return from.kind == XMP_P;
    case 1:
        return from.kind != XMP_P && to.kind == XMP_S;
    case 2:
        return from.kind == XMP_S && to.kind == XMP_B;
    default:
        return from.kind != XMP_P && to.kind == XMP_P;
    }
}

xmesh_result_t xmp_box(const xmp_tensor_t *x, const xmp_sbp_t *dst, xmp_tensor_t *y)
{
    if (!x || !dst || !y)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "xmp_box: NULL argument");
    xmesh_result_t r = xmp_sbp_check(x->mesh, x->ndim, dst, "xmp_box destination");
    if (r)
        return r;
    /* cur is x itself until the first step makes a new tensor (steps read their input and
     * write a fresh output), so x is copied only when no step runs */
    xmp_tensor_t cur = *x;
    int owned = 0;
    for (int pass = 0; pass < 4 && x->mesh->member; pass++) {
        for (int a = 0; a < x->mesh->ndim; a++) {
            if (xmp_sbp_eq(cur.sbp[a], dst[a]) || !in_pass(pass, cur.sbp[a], dst[a]))
                continue;
            xmp_sbp_t s[XMP_MAX_MESH_DIMS];
            xmp_tensor_t nxt;
            memcpy(s, cur.sbp, sizeof s);
            s[a] = dst[a];
            r = xmp_tensor_alloc(&nxt, x->mesh, x->ndim, x->shape, x->dtype, s);
            if (!r)
                r = step(&cur, a, &nxt);
            if (owned)
                xmp_tensor_free(&cur);
            if (r) {
                xmp_tensor_free(&nxt);
                return r;
            }
            cur = nxt;
            owned = 1;
        }
    }
    if (!x->mesh->member)
        return xmp_tensor_alloc(y, x->mesh, x->ndim, x->shape, x->dtype, dst);
    if (!owned) { /* nothing to move: a copy (every element written at once) */
        if ((r = xmp_tensor_alloc_uninit(&cur, x->mesh, x->ndim, x->shape, x->dtype, x->sbp)))
            return r;
        memcpy(cur.data, x->data, (size_t)x->lcount * 4);
    }
    *y = cur;
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_tensor_gather_full(const xmp_tensor_t *t, void *full)
{
    xmp_sbp_t allb[XMP_MAX_MESH_DIMS];
    xmp_tensor_t y;
    for (int a = 0; a < t->mesh->ndim; a++)
        allb[a] = xmp_sbp_b();
    xmesh_result_t r = xmp_box(t, allb, &y);
    if (r)
        return r;
    if (t->mesh->member)
        memcpy(full, y.data, (size_t)y.lcount * 4);
    xmp_tensor_free(&y);
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_box_backward(const xmp_tensor_t *dy, const xmp_sbp_t *src, xmp_tensor_t *dx)
{
    if (!dy || !src || !dx)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "xmp_box_backward: NULL argument");
    xmesh_result_t r = xmp_sbp_check(dy->mesh, dy->ndim, src, "xmp_box_backward source");
    if (r)
        return r;
    xmp_sbp_t g[XMP_MAX_MESH_DIMS];
    for (int a = 0; a < dy->mesh->ndim; a++)
        g[a] = xmp_sbp_grad(src[a]);
    return xmp_box(dy, g, dx);
}

xmesh_result_t xmp_box_inplace(xmp_tensor_t *t, const xmp_sbp_t *dst)
{
    if (xmp_tensor_sbp_is(t, dst))
        return XMESH_SUCCESS;
    xmp_tensor_t y;
    xmesh_result_t r = xmp_box(t, dst, &y);
    if (r)
        return r;
    xmp_tensor_free(t);
    *t = y;
    return XMESH_SUCCESS;
}

/* ------------------------------------------------------- nonblocking boxing */

#include "nn/overlap.h"

/* What an in-flight step still has to do when its request completes. */
enum { FIN_NONE = 0, FIN_UNPACK = 1, FIN_A2A = 2 };

struct xmp_box_req {
    xmp_tensor_t cur; /* value after the steps done so far (owned) */
    xmp_tensor_t nxt; /* target of the step in flight (owned) */
    xmp_sbp_t dst[XMP_MAX_MESH_DIMS];
    int inflight, fin, a; /* step in flight, its finishing work, its axis */
    int ckind, cp;        /* its xmp_comm_counts kind and communicator size */
    int64_t cpay;         /* its payload bytes; ring-equivalent bytes follow from ckind */
    double cbytes;
    MPI_Request q;
    MPI_Request *qs; /* an all-to-all's point-to-point requests (nq of them), else NULL */
    int nq;
    MPI_Comm comm;
    float *buf; /* staging of the step in flight */
    int *cnt;
    int member;
    char what[200];
};

/* Next (pass, axis) that still differs from dst, or -1. */
static int next_axis(const xmp_box_req_t *h)
{
    for (int pass = 0; pass < 4; pass++)
        for (int a = 0; a < h->cur.mesh->ndim; a++)
            if (!xmp_sbp_eq(h->cur.sbp[a], h->dst[a]) && in_pass(pass, h->cur.sbp[a], h->dst[a]))
                return a;
    return -1;
}

/* Can the step on axis a be posted as one nonblocking collective (same MPI call as step())? */
static int async_kind(const xmp_tensor_t *x, int a, xmp_sbp_t to)
{
    xmp_sbp_t from = x->sbp[a];
    if ((from.kind == XMP_S && shared_split(x->mesh, x->sbp, a, from.dim)) ||
        (to.kind == XMP_S && shared_split(x->mesh, x->sbp, a, to.dim)))
        return 0;
    return (from.kind == XMP_P && to.kind != XMP_P) || (from.kind == XMP_S && to.kind == XMP_B) ||
           (from.kind == XMP_S && to.kind == XMP_S && from.dim != to.dim);
}

/* Posts the step of axis a (async_kind) from h->cur into h->nxt (allocated). Packs exactly as
 * step() does, so the data and the MPI call are the same as the blocking path's. */
static xmesh_result_t post_step(xmp_box_req_t *h, int a)
{
    xmp_tensor_t *x = &h->cur, *y = &h->nxt;
    const xmp_mesh_t *m = x->mesh;
    xmp_sbp_t from = x->sbp[a], to = y->sbp[a];
    int na = m->shape[a], nd = x->ndim, rc;
    MPI_Datatype ty = mpi_type(x->dtype);
    int64_t zero[XMP_MAX_DIMS] = {0}, ext[XMP_MAX_DIMS], off[XMP_MAX_DIMS], lo, hi;
    const int64_t *G = from.kind == XMP_S ? y->lshape : x->lshape;
    char bw[160];
    box_what(bw, sizeof bw, x, y, a);
    snprintf(h->what, sizeof h->what, "%s (%s)",
             from.kind == XMP_P ? (to.kind == XMP_B ? "MPI_Iallreduce" : "MPI_Ireduce_scatter")
             : to.kind == XMP_B ? "MPI_Iallgatherv"
                                : "all-to-all by MPI_Isend/MPI_Irecv",
             bw);
    int fr = xmp_failed_rank(NULL, 0);
    if (fr >= 0)
        return xmp_err(XMESH_ERR_REMOTE, "%s not started: rank %d failed", h->what, fr);
    h->comm = m->axis[a];
    h->a = a;
    h->fin = FIN_NONE;
    h->cp = na;
    if (from.kind == XMP_P && to.kind == XMP_B) {
        h->ckind = XMP_COLL_ALLREDUCE;
        h->cpay = y->lcount * 4;
        h->cbytes = 2.0 * (na - 1) / na * (double)h->cpay;
        /* Out of place from a staged copy: with MPI_IN_PLACE Open MPI's libnbc takes its
         * binomial reduce + broadcast instead of the ring (the GPT-2 L4 C128 gradients one
         * tensor at a time on 4 emulated hosts x 2 ranks, 200 Mbit/s: 0.95 s against 0.27 s;
         * docs/SEARCH.md). */
        h->buf = malloc((size_t)(x->lcount ? x->lcount : 1) * 4);
        if (!h->buf)
            return xmp_err(XMESH_ERR_NO_MEMORY, "%s: out of memory", h->what);
        memcpy(h->buf, x->data, (size_t)x->lcount * 4);
        rc = MPI_Iallreduce(h->buf, y->data, (int)y->lcount, ty, MPI_SUM, h->comm, &h->q);
    } else if (from.kind == XMP_S && to.kind == XMP_S) {
        /* S(i) -> S(j): the all-to-all of sub-boxes step_axis runs, posted as point-to-point
         * pairs (sbp.c: Open MPI 4.1's MPI_Ialltoallv mishandled zero counts); packed and
         * unpacked exactly as there */
        int di = from.dim, dj = to.dim, me = 0;
        MPI_Comm_rank(h->comm, &me);
        h->cnt = calloc((size_t)na * 4, sizeof(int));
        h->buf = calloc((size_t)(x->lcount + y->lcount ? x->lcount + y->lcount : 1), 4);
        h->qs = malloc(sizeof(MPI_Request) * (size_t)(2 * na));
        if (!h->cnt || !h->buf || !h->qs) {
            free(h->qs);
            h->qs = NULL;
            return xmp_err(XMESH_ERR_NO_MEMORY, "%s: out of memory", h->what);
        }
        int *c0 = h->cnt, *d0 = h->cnt + na, *c1 = h->cnt + 2 * na, *d1 = h->cnt + 3 * na;
        float *sb = h->buf, *rb = h->buf + x->lcount;
        int64_t sent = 0;
        a2a_pack(x, y, di, dj, na, sb, c0, d0, c1, d1, 4);
        if (c1[me])
            memcpy(rb + d1[me], sb + d0[me], (size_t)c1[me] * 4);
        rc = MPI_SUCCESS;
        for (int p = 0; p < na && rc == MPI_SUCCESS; p++)
            if (p != me && c1[p])
                rc = MPI_Irecv(rb + d1[p], c1[p], ty, p, XMP_A2A_TAG, h->comm, &h->qs[h->nq++]);
        for (int i = 1; i < na && rc == MPI_SUCCESS; i++) { /* from the next rank: no hot spot */
            int p = (me + i) % na;
            if (c0[p]) {
                rc = MPI_Isend(sb + d0[p], c0[p], ty, p, XMP_A2A_TAG, h->comm, &h->qs[h->nq++]);
                sent += c0[p];
            }
        }
        if (rc != MPI_SUCCESS && h->nq > 0) {
            /* posted requests may still complete into the staging: abandon it (never freed) */
            h->buf = NULL;
            h->qs = NULL;
            h->nq = 0;
        }
        h->ckind = XMP_COLL_ALLTOALL;
        h->cpay = sent * 4;
        h->cbytes = (double)h->cpay;
        h->fin = FIN_A2A;
    } else {
        h->cnt = calloc((size_t)na * 2, sizeof(int));
        int64_t be = from.kind == XMP_P ? x->lcount : y->lcount;
        h->buf = calloc((size_t)(be ? be : 1), 4);
        if (!h->cnt || !h->buf)
            return xmp_err(XMESH_ERR_NO_MEMORY, "%s: out of memory", h->what);
        int *c0 = h->cnt, *d0 = h->cnt + na;
        if (from.kind == XMP_P) { /* P -> S(d) */
            int d = to.dim;
            int64_t o = 0;
            memcpy(ext, G, sizeof(int64_t) * (size_t)nd);
            memset(off, 0, sizeof off);
            for (int c = 0; c < na; c++) {
                split_range(G[d], na, c, &lo, &hi);
                ext[d] = hi - lo;
                off[d] = lo;
                xmp_copy_box(nd, ext, x->data, G, off, h->buf + o, ext, zero, 4);
                c0[c] = (int)volume(nd, ext);
                o += c0[c];
            }
            h->ckind = XMP_COLL_REDUCE_SCATTER;
            h->cpay = o * 4;
            h->cbytes = (double)(na - 1) / na * (double)h->cpay;
            rc = MPI_Ireduce_scatter(h->buf, y->data, c0, ty, MPI_SUM, h->comm, &h->q);
        } else { /* S(d) -> B */
            int d = from.dim;
            int64_t o = 0, outer = volume(d, G);
            memcpy(ext, G, sizeof(int64_t) * (size_t)nd);
            for (int c = 0; c < na; c++) {
                split_range(G[d], na, c, &lo, &hi);
                ext[d] = hi - lo;
                c0[c] = (int)volume(nd, ext);
                d0[c] = (int)o;
                o += c0[c];
            }
            h->ckind = XMP_COLL_ALLGATHER;
            h->cpay = x->lcount * 4;
            h->cbytes = (double)(na - 1) / na * (double)(o * 4);
            h->fin = outer == 1 ? FIN_NONE : FIN_UNPACK;
            void *dst = outer == 1 ? y->data : (void *)h->buf;
            rc = MPI_Iallgatherv(x->data, (int)x->lcount, ty, dst, c0, d0, ty, h->comm, &h->q);
        }
    }
    if (rc != MPI_SUCCESS)
        return xmp_err(XMESH_ERR_BACKEND, "%s: MPI error %d when posting", h->what, rc);
    h->inflight = 1;
    return XMESH_SUCCESS;
}

/* The step in flight has completed: unpack, advance cur. */
static void finish_step(xmp_box_req_t *h)
{
    xmp_tensor_t *y = &h->nxt;
    xmp_comm_count_add(h->ckind, h->cp, h->cpay, h->cbytes);
    if (h->fin == FIN_A2A) /* received sub-boxes into my dim-j chunk */
        a2a_unpack(h->buf + h->cur.lcount, h->cnt + 3 * y->mesh->shape[h->a], h->cur.sbp[h->a].dim,
                   y->mesh->shape[h->a], y, 4);
    if (h->fin == FIN_UNPACK) {
        int a = h->a, na = y->mesh->shape[a], nd = y->ndim, d = h->cur.sbp[a].dim;
        int64_t zero[XMP_MAX_DIMS] = {0}, ext[XMP_MAX_DIMS], off[XMP_MAX_DIMS] = {0}, lo, hi;
        const int64_t *G = y->lshape;
        memcpy(ext, G, sizeof(int64_t) * (size_t)nd);
        for (int c = 0; c < na; c++) {
            split_range(G[d], na, c, &lo, &hi);
            ext[d] = hi - lo;
            off[d] = lo;
            xmp_copy_box(nd, ext, h->buf + h->cnt[na + c], ext, zero, y->data, G, off, 4);
        }
    }
    free(h->buf);
    free(h->cnt);
    free(h->qs);
    h->buf = NULL;
    h->cnt = NULL;
    h->qs = NULL;
    h->nq = 0;
    h->inflight = 0;
    xmp_tensor_free(&h->cur);
    h->cur = h->nxt;
    memset(&h->nxt, 0, sizeof h->nxt);
}

/* Runs steps until one is posted nonblocking (post_async) or none is left. Steps that are
 * local or not postable run blocking through step(). */
static xmesh_result_t run_steps(xmp_box_req_t *h, int post_async)
{
    int a;
    while (!h->inflight && (a = next_axis(h)) >= 0) {
        xmp_sbp_t s[XMP_MAX_MESH_DIMS];
        memcpy(s, h->cur.sbp, sizeof s);
        s[a] = h->dst[a];
        xmesh_result_t r =
            xmp_tensor_alloc(&h->nxt, h->cur.mesh, h->cur.ndim, h->cur.shape, h->cur.dtype, s);
        if (r)
            return r;
        if (post_async && async_kind(&h->cur, a, h->dst[a])) {
            r = post_step(h, a);
            if (r) {
                free(h->buf);
                free(h->cnt);
                free(h->qs);
                h->buf = NULL;
                h->cnt = NULL;
                h->qs = NULL;
                h->nq = 0;
                xmp_tensor_free(&h->nxt);
            }
            return r;
        }
        r = step(&h->cur, a, &h->nxt);
        if (r) {
            xmp_tensor_free(&h->nxt);
            return r;
        }
        xmp_tensor_free(&h->cur);
        h->cur = h->nxt;
        memset(&h->nxt, 0, sizeof h->nxt);
    }
    return XMESH_SUCCESS;
}

static void req_free(xmp_box_req_t *h)
{
    xmp_tensor_free(&h->cur);
    xmp_tensor_free(&h->nxt);
    free(h->buf);
    free(h->cnt);
    free(h->qs);
    free(h);
}

xmesh_result_t xmp_box_start(const xmp_tensor_t *x, const xmp_sbp_t *dst, xmp_box_req_t **req)
{
    if (!x || !dst || !req)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "xmp_box_start: NULL argument");
    xmesh_result_t r = xmp_sbp_check(x->mesh, x->ndim, dst, "xmp_box_start destination");
    if (r)
        return r;
    xmp_box_req_t *h = calloc(1, sizeof *h);
    if (!h)
        return xmp_err(XMESH_ERR_NO_MEMORY, "xmp_box_start: out of memory");
    memcpy(h->dst, dst, sizeof(xmp_sbp_t) * (size_t)x->mesh->ndim);
    for (int a = x->mesh->ndim; a < XMP_MAX_MESH_DIMS; a++)
        h->dst[a] = xmp_sbp_b();
    h->member = x->mesh->member;
    r = xmp_tensor_alloc_like(&h->cur, x);
    if (r) {
        free(h);
        return r;
    }
    if (h->member) {
        memcpy(h->cur.data, x->data, (size_t)x->lcount * 4);
        r = run_steps(h, 1);
    }
    if (r) {
        req_free(h);
        return r;
    }
    *req = h;
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_box_test(xmp_box_req_t *req, int *done)
{
    if (!req || !done)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "xmp_box_test: NULL argument");
    *done = 0;
    if (req->inflight) {
        int flag = 0;
        double t0 = MPI_Wtime();
        int rc = req->qs ? MPI_Testall(req->nq, req->qs, &flag, MPI_STATUSES_IGNORE)
                         : MPI_Test(&req->q, &flag, MPI_STATUS_IGNORE);
        xmp_comm_seconds_add(MPI_Wtime() - t0);
        if (rc != MPI_SUCCESS)
            return xmp_err(XMESH_ERR_BACKEND, "%s: MPI_Test failed (%d)", req->what, rc);
        if (!flag)
            return XMESH_SUCCESS;
        finish_step(req);
    }
    *done = !req->member || next_axis(req) < 0;
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_box_wait(xmp_box_req_t *req, xmp_tensor_t *y)
{
    if (!req || !y)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "xmp_box_wait: NULL argument");
    xmesh_result_t r = XMESH_SUCCESS;
    if (req->inflight) {
        r = req->qs ? xmp_waitall(req->nq, req->qs, req->comm, req->what)
                    : xmp_wait(&req->q, req->comm, req->what);
        if (r) { /* abandoned: MPI may still write the buffers, keep them allocated */
            return r;
        }
        finish_step(req);
    }
    if (req->member)
        r = run_steps(req, 0);
    if (r) {
        req_free(req);
        return r;
    }
    if (!req->member) {
        r = xmp_tensor_alloc(y, req->cur.mesh, req->cur.ndim, req->cur.shape, req->cur.dtype,
                             req->dst);
        req_free(req);
        return r;
    }
    *y = req->cur;
    memset(&req->cur, 0, sizeof req->cur);
    req_free(req);
    return XMESH_SUCCESS;
}
