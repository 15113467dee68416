/* Overlap building blocks (contracts in nn/overlap.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/overlap.h"
#include "nn/sbp_conv.h"
#include "nn/sbp_ops.h"

xmesh_result_t xmp_overlap_parse(const char *s, xmp_overlap_t *ov)
{
    if (!s || !ov)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "xmp_overlap_parse: NULL argument");
    xmp_overlap_t o = {0, 0, 0, 0};
    if (!strcmp(s, "none") || !*s) {
        *ov = o;
        return XMESH_SUCCESS;
    }
    if (!strcmp(s, "all")) {
        o.bwd_input = o.defer_grad = o.prefetch = o.coll_matmul = 1;
        *ov = o;
        return XMESH_SUCCESS;
    }
    const char *p = s;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n == 9 && !strncmp(p, "bwd-input", n))
            o.bwd_input = 1;
        else if (n == 10 && !strncmp(p, "defer-grad", n))
            o.defer_grad = 1;
        else if (n == 8 && !strncmp(p, "prefetch", n))
            o.prefetch = 1;
        else if (n == 11 && !strncmp(p, "coll-matmul", n))
            o.coll_matmul = 1;
        else
            return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                           "overlap '%s': unknown switch '%.*s' (none, all, or a comma list of "
                           "bwd-input, defer-grad, prefetch, coll-matmul)",
                           s, (int)n, p);
        p += n;
        if (*p == ',')
            p++;
    }
    *ov = o;
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_overlap_from_env(xmp_overlap_t *ov)
{
    char s[256];
    xmesh_result_t r = xmesh_param_get("XMP_OVERLAP", s, sizeof s, NULL);
    if (r)
        return xmp_err(r, "XMP_OVERLAP: %s", xmesh_last_error());
    return xmp_overlap_parse(s, ov);
}

void xmp_overlap_string(const xmp_overlap_t *ov, char *buf, size_t n)
{
    if (!n)
        return;
    buf[0] = 0;
    const char *names[4] = {"bwd-input", "defer-grad", "prefetch", "coll-matmul"};
    int on[4] = {ov->bwd_input, ov->defer_grad, ov->prefetch, ov->coll_matmul};
    for (int i = 0; i < 4; i++)
        if (on[i]) {
            size_t l = strlen(buf);
            snprintf(buf + l, n - l, "%s%s", l ? "," : "", names[i]);
        }
    if (!buf[0])
        snprintf(buf, n, "none");
}

/* ------------------------------------------------------ (a) linear backward */

/* The backward a bwd-input overlap runs: a linear's or a convolution's two parts. */
typedef struct {
    int conv, stride, pad;
} bk_op_t;

static xmesh_result_t bwd_ov(const bk_op_t *o, const xmp_overlap_t *ov, const xmp_tensor_t *dy,
                             const xmp_tensor_t *x, const xmp_tensor_t *w, const xmp_sbp_t *dx_sbp,
                             xmp_tensor_t *dx, xmp_tensor_t *dw, xmp_tensor_t *db)
{
    xmp_tensor_t raw, bx, gw, gb;
    xmp_box_req_t *req = NULL;
    memset(&bx, 0, sizeof bx);
    memset(&gb, 0, sizeof gb);
    xmesh_result_t r = o->conv ? xmp_conv2d_backward_input(dy, x, w, o->stride, o->pad, &raw)
                               : xmp_linear_backward_input(dy, w, &raw);
    if (r)
        return r;
    if (dx_sbp && ov->bwd_input) {
        r = xmp_box_start(&raw, dx_sbp, &req);
        xmp_tensor_free(&raw);
        if (r)
            return r;
    } else if (dx_sbp) {
        r = xmp_box(&raw, dx_sbp, &bx);
        xmp_tensor_free(&raw);
        if (r)
            return r;
    } else {
        bx = raw;
    }
    int done = 0;
    if (req && (r = xmp_box_test(req, &done))) /* one progress call before the GEMM */
        goto fail;
    r = o->conv ? xmp_conv2d_backward_weight(dy, x, w, o->stride, o->pad, &gw, db ? &gb : NULL)
                : xmp_linear_backward_weight(dy, x, &gw, db ? &gb : NULL);
    if (r)
        goto fail;
    if (req) {
        r = xmp_box_wait(req, &bx);
        req = NULL;
        if (r) {
            xmp_tensor_free(&gw);
            if (db)
                xmp_tensor_free(&gb);
            return r;
        }
    }
    *dx = bx;
    *dw = gw;
    if (db)
        *db = gb;
    return XMESH_SUCCESS;
fail:
    if (req) {
        xmp_tensor_t tmp;
        if (!xmp_box_wait(req, &tmp)) /* keep the collective order; drop the value */
            xmp_tensor_free(&tmp);
    }
    xmp_tensor_free(&bx);
    return r;
}

xmesh_result_t xmp_linear_backward_ov(const xmp_overlap_t *ov, const xmp_tensor_t *dy,
                                      const xmp_tensor_t *x, const xmp_tensor_t *w,
                                      const xmp_sbp_t *dx_sbp, xmp_tensor_t *dx, xmp_tensor_t *dw,
                                      xmp_tensor_t *db)
{
    if (!ov || !dy || !x || !w || !dx || !dw)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "xmp_linear_backward_ov: NULL argument");
    bk_op_t o = {0, 1, 0};
    return bwd_ov(&o, ov, dy, x, w, dx_sbp, dx, dw, db);
}

xmesh_result_t xmp_conv2d_backward_ov(const xmp_overlap_t *ov, const xmp_tensor_t *dy,
                                      const xmp_tensor_t *x, const xmp_tensor_t *w, int stride,
                                      int pad, const xmp_sbp_t *dx_sbp, xmp_tensor_t *dx,
                                      xmp_tensor_t *dw, xmp_tensor_t *db)
{
    if (!ov || !dy || !x || !w || !dx || !dw)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "xmp_conv2d_backward_ov: NULL argument");
    bk_op_t o = {1, stride, pad};
    return bwd_ov(&o, ov, dy, x, w, dx_sbp, dx, dw, db);
}

/* ------------------------------------------------------ (b) gradient queue */

typedef struct {
    xmp_tensor_t *g;
    xmp_box_req_t *req;
} gq_entry_t;

struct xmp_gradq {
    xmp_overlap_t ov;
    gq_entry_t *e;
    int n, cap;
};

xmesh_result_t xmp_gradq_create(const xmp_overlap_t *ov, xmp_gradq_t **q)
{
    if (!ov || !q)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "xmp_gradq_create: NULL argument");
    xmp_gradq_t *h = calloc(1, sizeof *h);
    if (!h)
        return xmp_err(XMESH_ERR_NO_MEMORY, "xmp_gradq_create: out of memory");
    h->ov = *ov;
    *q = h;
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_gradq_add(xmp_gradq_t *q, xmp_tensor_t *g, const xmp_sbp_t *dst)
{
    if (!q || !g || !dst)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "xmp_gradq_add: NULL argument");
    if (!q->ov.defer_grad)
        return xmp_box_inplace(g, dst);
    if (q->n == q->cap) {
        int nc = q->cap ? 2 * q->cap : 16;
        gq_entry_t *e = realloc(q->e, sizeof *e * (size_t)nc);
        if (!e)
            return xmp_err(XMESH_ERR_NO_MEMORY, "xmp_gradq_add: out of memory");
        q->e = e;
        q->cap = nc;
    }
    xmp_box_req_t *req;
    xmesh_result_t r = xmp_box_start(g, dst, &req);
    if (r)
        return r;
    q->e[q->n].g = g;
    q->e[q->n].req = req;
    q->n++;
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_gradq_progress(xmp_gradq_t *q)
{
    if (!q)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "xmp_gradq_progress: NULL argument");
    for (int i = 0; i < q->n; i++) {
        int done;
        xmesh_result_t r = xmp_box_test(q->e[i].req, &done);
        if (r)
            return r;
    }
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_gradq_finish(xmp_gradq_t *q)
{
    if (!q)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "xmp_gradq_finish: NULL argument");
    xmesh_result_t first = XMESH_SUCCESS;
    int i;
    for (i = 0; i < q->n; i++) { /* the order of adding: same on every member */
        xmp_tensor_t y;
        xmesh_result_t r = xmp_box_wait(q->e[i].req, &y);
        if (r) {
            first = r;
            i++;
            break; /* a timeout abandons: the later requests are abandoned too */
        }
        xmp_tensor_free(q->e[i].g);
        *q->e[i].g = y;
    }
    q->n = 0;
    return first;
}

void xmp_gradq_destroy(xmp_gradq_t *q)
{
    if (!q)
        return;
    for (int i = 0; i < q->n; i++) {
        xmp_tensor_t y;
        if (!xmp_box_wait(q->e[i].req, &y))
            xmp_tensor_free(&y);
    }
    free(q->e);
    free(q);
}

/* ------------------------------------------------------------ (c) prefetch */

struct xmp_prefetch {
    const xmp_tensor_t *w;
    xmp_sbp_t use[XMP_MAX_MESH_DIMS];
    xmp_box_req_t *req;
};

xmesh_result_t xmp_prefetch_start(const xmp_overlap_t *ov, const xmp_tensor_t *w,
                                  const xmp_sbp_t *use_sbp, xmp_prefetch_t **p)
{
    if (!ov || !w || !use_sbp || !p)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "xmp_prefetch_start: NULL argument");
    xmesh_result_t r = xmp_sbp_check(w->mesh, w->ndim, use_sbp, "xmp_prefetch_start use SBP");
    if (r)
        return r;
    xmp_prefetch_t *h = calloc(1, sizeof *h);
    if (!h)
        return xmp_err(XMESH_ERR_NO_MEMORY, "xmp_prefetch_start: out of memory");
    h->w = w;
    memcpy(h->use, use_sbp, sizeof(xmp_sbp_t) * (size_t)w->mesh->ndim);
    if (ov->prefetch && (r = xmp_box_start(w, use_sbp, &h->req))) {
        free(h);
        return r;
    }
    *p = h;
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_prefetch_get(xmp_prefetch_t *p, xmp_tensor_t *w_used)
{
    if (!p || !w_used)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "xmp_prefetch_get: NULL argument");
    xmesh_result_t r = p->req ? xmp_box_wait(p->req, w_used) : xmp_box(p->w, p->use, w_used);
    free(p);
    return r;
}

/* ---------------------------------------------------- (d) collective matmul */

/* Plain path: gather w to its used SBP, then one GEMM. */
static xmesh_result_t cm_plain(const xmp_tensor_t *x, const xmp_tensor_t *ws, const xmp_sbp_t *use,
                               const xmp_tensor_t *b, xmp_tensor_t *y)
{
    xmp_tensor_t wu;
    xmesh_result_t r = xmp_box(ws, use, &wu);
    if (r)
        return r;
    r = xmp_linear_forward(x, &wu, b, y);
    xmp_tensor_free(&wu);
    return r;
}

xmesh_result_t xmp_linear_forward_cm(const xmp_overlap_t *ov, const xmp_tensor_t *x,
                                     const xmp_tensor_t *ws, int axis, const xmp_tensor_t *b,
                                     xmp_tensor_t *y)
{
    if (!ov || !x || !ws || !y)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "xmp_linear_forward_cm: NULL argument");
    const xmp_mesh_t *m = ws->mesh;
    if (axis < 0 || axis >= m->ndim || ws->ndim != 2 || ws->sbp[axis].kind != XMP_S ||
        ws->sbp[axis].dim != 0)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                       "xmp_linear_forward_cm: w '%s' (%d dims) is not S(0) on mesh axis %d",
                       ws->spec, ws->ndim, axis);
    xmp_sbp_t use[XMP_MAX_MESH_DIMS];
    memcpy(use, ws->sbp, sizeof use);
    use[axis] = xmp_sbp_b();
    int fits = ov->coll_matmul && m->member;
    for (int a = 0; a < m->ndim; a++)
        if (a != axis && ((ws->sbp[a].kind == XMP_S && ws->sbp[a].dim == 0) ||
                          ws->sbp[a].kind == XMP_P || (b && b->sbp[a].kind != XMP_B)))
            fits = 0;
    if (b && b->sbp[axis].kind != XMP_B)
        fits = 0;
    if (!fits) /* same on every member: depends on SBPs and the switch only */
        return cm_plain(x, ws, use, b, y);
    int na = m->shape[axis], me = m->coord[axis];
    int64_t O = ws->shape[0], K = ws->lshape[1];
    float *wfull = malloc(sizeof(float) * (size_t)(O * K > 0 ? O * K : 1));
    MPI_Request *q = malloc(sizeof(MPI_Request) * (size_t)na);
    xmesh_result_t r = XMESH_SUCCESS;
    if (!wfull || !q) {
        free(wfull);
        free(q);
        return xmp_err(XMESH_ERR_NO_MEMORY, "xmp_linear_forward_cm: out of memory");
    }
    int64_t lo[64] = {0}, hi[64] = {0};
    if (na > 64) {
        free(wfull);
        free(q);
        return cm_plain(x, ws, use, b, y);
    }
    for (int c = 0; c < na; c++) {
        int64_t qn = O / na, rm = O % na;
        lo[c] = c * qn + (c < rm ? c : rm);
        hi[c] = lo[c] + qn + (c < rm ? 1 : 0);
    }
    memcpy(wfull + lo[me] * K, ws->data, sizeof(float) * (size_t)ws->lcount);
    char what[200];
    snprintf(what, sizeof what, "collective matmul '%s' axis %d", ws->spec, axis);
    int fr = xmp_failed_rank(NULL, 0);
    if (fr >= 0) {
        free(wfull);
        free(q);
        return xmp_err(XMESH_ERR_REMOTE, "%s not started: rank %d failed", what, fr);
    }
    for (int c = 0; c < na; c++) { /* every piece broadcast by its owner, posted at once */
        int rc = MPI_Ibcast(wfull + lo[c] * K, (int)((hi[c] - lo[c]) * K), MPI_FLOAT, c,
                            m->axis[axis], &q[c]);
        if (rc != MPI_SUCCESS) {
            /* earlier pieces stay posted: keep their buffer (abandoned) */
            free(q);
            return xmp_err(XMESH_ERR_BACKEND, "%s: MPI_Ibcast failed (%d)", what, rc);
        }
    }
    int have_y = 0;
    for (int c = 0; c < na && !r; c++) { /* pieces in index order on every rank */
        if ((r = xmp_wait(&q[c], m->axis[axis], what))) {
            if (have_y)
                xmp_tensor_free(y);
            return r; /* abandoned: wfull and q stay allocated */
        }
        if (hi[c] == lo[c])
            continue;
        int64_t ps[2] = {hi[c] - lo[c], ws->shape[1]}, bs[1] = {hi[c] - lo[c]};
        xmp_tensor_t wc, bc, yc;
        memset(&bc, 0, sizeof bc);
        r = xmp_tensor_alloc(&wc, (xmp_mesh_t *)m, 2, ps, XMESH_F32, use);
        if (r)
            break;
        memcpy(wc.data, wfull + lo[c] * K, sizeof(float) * (size_t)wc.lcount);
        if (b && !(r = xmp_tensor_alloc(&bc, (xmp_mesh_t *)m, 1, bs, XMESH_F32, b->sbp)))
            memcpy(bc.data, xmp_f32(b) + lo[c], sizeof(float) * (size_t)bs[0]);
        if (!r)
            r = xmp_linear_forward(x, &wc, b ? &bc : NULL, &yc);
        xmp_tensor_free(&wc);
        xmp_tensor_free(&bc);
        if (r)
            break;
        if (!have_y) {
            int64_t s[XMP_MAX_DIMS];
            memcpy(s, yc.shape, sizeof s);
            s[yc.ndim - 1] = O;
            r = xmp_tensor_alloc(y, (xmp_mesh_t *)m, yc.ndim, s, XMESH_F32, yc.sbp);
            have_y = !r;
        }
        if (!r) { /* columns [lo, hi) of every row */
            int64_t oc = hi[c] - lo[c], M = yc.lcount / oc;
            for (int64_t i = 0; i < M; i++)
                memcpy(xmp_f32(y) + i * O + lo[c], xmp_f32(&yc) + i * oc,
                       sizeof(float) * (size_t)oc);
        }
        xmp_tensor_free(&yc);
    }
    if (r) {
        /* broadcasts still posted: finish them with the deadline; when that fails too, abandon
         * wfull and q (MPI may still write them) */
        char keep[512];
        snprintf(keep, sizeof keep, "%s", xmp_last_error());
        xmesh_result_t wr = xmp_waitall(na, q, m->axis[axis], what);
        xmp_err(r, "%s", keep);
        if (have_y)
            xmp_tensor_free(y);
        if (wr)
            return r;
    } else if (!have_y) { /* O == 0 */
        r = cm_plain(x, ws, use, b, y);
    }
    free(wfull);
    free(q);
    return r;
}

/* ------------------------------------------- collective matmul: GEMM, then its collective */

/* Number of pieces along batch dim pd of x that keep every rank's block an exact slice
 * (global extent divisible by (ranks splitting pd) x k), largest k <= 4; 1 if none. Pure
 * function of shapes and SBPs (the same on every member). */
static int piece_count(const xmp_tensor_t *x, int pd)
{
    int64_t sp = 1;
    for (int a = 0; a < x->mesh->ndim; a++)
        if (x->sbp[a].kind == XMP_S && x->sbp[a].dim == pd)
            sp *= x->mesh->shape[a];
    for (int k = 4; k >= 2; k--)
        if (x->shape[pd] % (sp * k) == 0)
            return k;
    return 1;
}

/* Do s and t split dim pd over the same axes? */
static int same_split(int nax, const xmp_sbp_t *s, const xmp_sbp_t *t, int pd)
{
    for (int a = 0; a < nax; a++) {
        int is = s[a].kind == XMP_S && s[a].dim == pd, it = t[a].kind == XMP_S && t[a].dim == pd;
        if (is != it)
            return 0;
    }
    return 1;
}

/* Piece i of k of t along dim pd: global extent shape[pd] / k, my block the i-th slice of my
 * block (an SBP tensor of its own: xmp_block gives exactly that slice, see piece_count). */
static xmesh_result_t piece_of(const xmp_tensor_t *t, int pd, int k, int i, xmp_tensor_t *p)
{
    int64_t sh[XMP_MAX_DIMS];
    memcpy(sh, t->shape, sizeof sh);
    sh[pd] /= k;
    xmesh_result_t r = xmp_tensor_alloc(p, t->mesh, t->ndim, sh, t->dtype, t->sbp);
    if (r || !t->mesh->member)
        return r;
    int64_t off[XMP_MAX_DIMS] = {0}, zero[XMP_MAX_DIMS] = {0};
    off[pd] = p->lshape[pd] * i;
    xmp_copy_box(t->ndim, p->lshape, t->data, t->lshape, off, p->data, p->lshape, zero, 4);
    return XMESH_SUCCESS;
}

/* The op a forward-box runs on x (or on a piece of x): a linear or a convolution. */
typedef struct {
    const char *name;
    const xmp_tensor_t *w, *b;
    int conv, stride, pad;
} fb_op_t;

static xmesh_result_t fb_run(const fb_op_t *o, const xmp_tensor_t *x, xmp_tensor_t *y)
{
    return o->conv ? xmp_conv2d_forward(x, o->w, o->b, o->stride, o->pad, y)
                   : xmp_linear_forward(x, o->w, o->b, y);
}

/* A GEMM-like op followed by its forward collective, in pieces along a batch dim (the linear:
 * any dim but the contracted last; the convolution: the image dim 0 only). */
static xmesh_result_t fwd_box(const fb_op_t *o, const xmp_overlap_t *ov, const xmp_tensor_t *x,
                              const xmp_sbp_t *dst, const xmp_tensor_t *like, xmp_sbp_t *was,
                              xmp_tensor_t *y)
{
    const xmp_mesh_t *m = x->mesh;
    int nax = m->ndim, pd = -1, k = 1;
    xmp_sbp_t tgt[XMP_MAX_MESH_DIMS];
    char msg[256];
    int last_pd = o->conv ? 1 : x->ndim - 1;
    /* the piece dim: the batch dim (not the contracted last dim) with the most pieces */
    for (int d = 0; ov->coll_matmul && d < last_pd; d++) {
        int kd = piece_count(x, d);
        if (kd > k) {
            k = kd;
            pd = d;
        }
    }
    xmp_tensor_t t = {0};
    xmesh_result_t r;
    if (k < 2) { /* the plain path: one GEMM, one box */
        if ((r = fb_run(o, x, &t)))
            return r;
        if (was)
            memcpy(was, t.sbp, sizeof t.sbp);
        if (like && xmp_rule_add(nax, t.ndim, like->sbp, t.sbp, tgt, msg, sizeof msg)) {
            xmp_tensor_free(&t);
            return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: %s", o->name, msg);
        }
        /* t is ours: boxed in place (no copy when it is already there) */
        if ((r = xmp_box_inplace(&t, dst ? dst : tgt))) {
            xmp_tensor_free(&t);
            return r;
        }
        *y = t;
        return XMESH_SUCCESS;
    }
    /* pieces: GEMM of piece i, then its box started; the GEMMs of later pieces overlap it */
    xmp_box_req_t *q[4] = {NULL};
    xmp_tensor_t z[4];
    memset(z, 0, sizeof z);
    xmp_sbp_t ysbp[XMP_MAX_MESH_DIMS];
    int started = 0, plain = 0;
    r = XMESH_SUCCESS;
    for (int i = 0; i < k && !r; i++) {
        xmp_tensor_t xp = {0}, yp = {0};
        r = piece_of(x, pd, k, i, &xp);
        if (!r)
            r = fb_run(o, &xp, &yp);
        xmp_tensor_free(&xp);
        if (r)
            break;
        if (i == 0) {
            memcpy(ysbp, yp.sbp, sizeof ysbp);
            if (like && xmp_rule_add(nax, yp.ndim, like->sbp, yp.sbp, tgt, msg, sizeof msg))
                r = xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: %s", o->name, msg);
            else if (!same_split(nax, x->sbp, yp.sbp, pd) ||
                     !same_split(nax, yp.sbp, dst ? dst : tgt, pd))
                plain = 1; /* the box would move the piece dim: pieces do not commute */
        }
        if (!r && plain) {
            xmp_tensor_free(&yp);
            break;
        }
        if (!r)
            r = xmp_box_start(&yp, dst ? dst : tgt, &q[i]);
        xmp_tensor_free(&yp);
        if (!r)
            started = i + 1;
        for (int j = 0; j < started && !r; j++) { /* progress the boxes in flight */
            int done;
            r = xmp_box_test(q[j], &done);
        }
    }
    /* wait in start order (every started request exactly once, also after an error) */
    for (int i = 0; i < started; i++) {
        xmesh_result_t ri = xmp_box_wait(q[i], &z[i]);
        if (!r)
            r = ri;
    }
    if (!r && plain) {
        xmp_overlap_t off = *ov;
        off.coll_matmul = 0;
        return fwd_box(o, &off, x, dst, like, was, y);
    }
    if (!r) {
        int64_t sh[XMP_MAX_DIMS];
        memcpy(sh, z[0].shape, sizeof sh);
        sh[pd] *= k;
        r = xmp_tensor_alloc(&t, z[0].mesh, z[0].ndim, sh, z[0].dtype, z[0].sbp);
    }
    if (!r && m->member) {
        int64_t zero[XMP_MAX_DIMS] = {0}, off[XMP_MAX_DIMS] = {0};
        for (int i = 0; i < k && !r; i++) {
            if (z[i].lshape[pd] * k != t.lshape[pd]) {
                r = xmp_err(XMESH_ERR_INTERNAL, "%s: piece %d holds %lld of %lld rows", o->name, i,
                            (long long)z[i].lshape[pd], (long long)t.lshape[pd]);
                break;
            }
            off[pd] = z[i].lshape[pd] * i;
            xmp_copy_box(t.ndim, z[i].lshape, z[i].data, z[i].lshape, zero, t.data, t.lshape, off,
                         4);
        }
    }
    for (int i = 0; i < k; i++)
        xmp_tensor_free(&z[i]);
    if (r) {
        xmp_tensor_free(&t);
        return r;
    }
    if (was)
        memcpy(was, ysbp, sizeof ysbp);
    *y = t;
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_linear_forward_box(const xmp_overlap_t *ov, const xmp_tensor_t *x,
                                      const xmp_tensor_t *w, const xmp_tensor_t *b,
                                      const xmp_sbp_t *dst, const xmp_tensor_t *like,
                                      xmp_sbp_t *was, xmp_tensor_t *y)
{
    if (!ov || !x || !w || !y || (!dst == !like))
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                       "xmp_linear_forward_box: NULL argument or not exactly one of dst, like");
    fb_op_t o = {"xmp_linear_forward_box", w, b, 0, 1, 0};
    return fwd_box(&o, ov, x, dst, like, was, y);
}

xmesh_result_t xmp_conv2d_forward_box(const xmp_overlap_t *ov, const xmp_tensor_t *x,
                                      const xmp_tensor_t *w, const xmp_tensor_t *b, int stride,
                                      int pad, const xmp_sbp_t *dst, xmp_sbp_t *was,
                                      xmp_tensor_t *y)
{
    if (!ov || !x || !w || !y || !dst)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "xmp_conv2d_forward_box: NULL argument");
    if (x->ndim != 4)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                       "xmp_conv2d_forward_box: x has %d dims (must be 4: N, C, H, W)", x->ndim);
    fb_op_t o = {"xmp_conv2d_forward_box", w, b, 1, stride, pad};
    return fwd_box(&o, ov, x, dst, NULL, was, y);
}
