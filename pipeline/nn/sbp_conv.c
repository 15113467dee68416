/* SBP forms of the U-Transformer layers (contracts and signature tables in sbp_conv.h). */
#include "nn/sbp_conv.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/unet_kernels.h"

#define NAX XMP_MAX_MESH_DIMS

static xmesh_result_t check_t(const xmp_tensor_t *t, int ndim, const char *op, const char *name)
{
    if (!t)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: %s is NULL", op, name);
    if (t->dtype != XMESH_F32)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: %s '%s' has dtype %s, expected f32", op,
                       name, t->spec, xmesh_dtype_name(t->dtype));
    if (ndim > 0 && t->ndim != ndim)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: %s has %d dims, expected %d", op, name,
                       t->ndim, ndim);
    return XMESH_SUCCESS;
}

/* Refuses S(d) with d >= first on a feature map (spatial split: halos needed). */
static xmesh_result_t no_spatial(const xmp_tensor_t *t, int first, const char *op, const char *name)
{
    for (int a = 0; a < t->mesh->ndim; a++)
        if (t->sbp[a].kind == XMP_S && t->sbp[a].dim >= first)
            return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                           "%s: %s '%s' is S(%d) on mesh axis %d: a spatial split needs halo "
                           "exchanges (or statistics across ranks), which are not implemented; "
                           "split the batch (S(0)) or the channels instead",
                           op, name, t->spec, t->sbp[a].dim, a);
    return XMESH_SUCCESS;
}

static xmp_sbp_t grad_of(xmp_sbp_t s)
{
    return xmp_sbp_grad(s);
}

/* Number of pieces tensor dim d is cut into by the SBP s (product of the axes splitting it). */
static int pieces(const xmp_mesh_t *m, const xmp_sbp_t *s, int d)
{
    int k = 1;
    for (int a = 0; a < m->ndim; a++)
        if (s[a].kind == XMP_S && s[a].dim == d)
            k *= m->shape[a];
    return k;
}

/* 1 if every P axis of s has this rank at coordinate 0 (the holder of a bias added once). */
static int holder(const xmp_mesh_t *m, const xmp_sbp_t *s)
{
    for (int a = 0; a < m->ndim; a++)
        if (s[a].kind == XMP_P && m->coord[a] != 0)
            return 0;
    return 1;
}

static int is_ch(xmp_sbp_t s)
{
    return s.kind == XMP_S && s.dim == 1;
}

static int computes(const xmp_tensor_t *t)
{
    return t->mesh->member && t->lcount > 0;
}

/* ------------------------------------------------------------ convolution */

static xmesh_result_t conv_deduce(const xmp_tensor_t *x, const xmp_tensor_t *w, xmp_sbp_t *tx,
                                  xmp_sbp_t *tw, xmp_sbp_t *ty, const char *op)
{
    xmesh_result_t r;
    if ((r = no_spatial(x, 2, op, "input x")))
        return r;
    xmp_sbp_all_b(tx);
    xmp_sbp_all_b(tw);
    xmp_sbp_all_b(ty);
    for (int a = 0; a < x->mesh->ndim; a++) {
        xmp_sbp_t sx = x->sbp[a], sw = w->sbp[a];
        if (sw.kind == XMP_S && sw.dim >= 2)
            return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                           "%s: weight '%s' is S(%d) on mesh axis %d: the kernel dims cannot be "
                           "split (rule: w S(0) output channels or S(1) input channels)",
                           op, w->spec, sw.dim, a);
        if (sx.kind == XMP_S && sx.dim == 0) {
            tx[a] = sx, tw[a] = xmp_sbp_b(), ty[a] = xmp_sbp_s(0);
        } else if ((sx.kind == XMP_S && sx.dim == 1) || (sw.kind == XMP_S && sw.dim == 1)) {
            tx[a] = xmp_sbp_s(1), tw[a] = xmp_sbp_s(1), ty[a] = xmp_sbp_p();
        } else if (sw.kind == XMP_S) { /* S(0): output channels */
            tx[a] = xmp_sbp_b(), tw[a] = sw, ty[a] = xmp_sbp_s(1);
        } else if (sx.kind == XMP_B) {
            tx[a] = sx, tw[a] = sw, ty[a] = sw.kind == XMP_P ? xmp_sbp_p() : xmp_sbp_b();
        } else { /* x P */
            tx[a] = sw.kind == XMP_B ? sx : xmp_sbp_b();
            tw[a] = sw;
            ty[a] = xmp_sbp_p();
        }
    }
    return XMESH_SUCCESS;
}

static xmesh_result_t conv_check(const xmp_tensor_t *x, const xmp_tensor_t *w,
                                 const xmp_tensor_t *b, int stride, int pad, const char *op,
                                 xmp_unet_conv2d_t *g)
{
    xmesh_result_t r;
    if ((r = check_t(x, 4, op, "x")) || (r = check_t(w, 4, op, "w")) ||
        (r = xmp_same_mesh(x, w, op)))
        return r;
    if (b && ((r = check_t(b, 1, op, "b")) || (r = xmp_same_mesh(x, b, op))))
        return r;
    if (w->shape[1] != x->shape[1])
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: weight has %lld input channels, x has %lld",
                       op, (long long)w->shape[1], (long long)x->shape[1]);
    if (b && b->shape[0] != w->shape[0])
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: bias has %lld entries, %lld outputs", op,
                       (long long)b->shape[0], (long long)w->shape[0]);
    if (xmp_unet_conv2d_init(g, 1, (int)x->shape[1], (int)x->shape[2], (int)x->shape[3],
                             (int)w->shape[0], (int)w->shape[2], (int)w->shape[3], stride,
                             pad) != 0)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: %s", op, xmp_last_error());
    return XMESH_SUCCESS;
}

/* Local geometry of one rank's blocks; -1 if a block is empty (nothing to compute). */
static int conv_local(xmp_unet_conv2d_t *c, const xmp_unet_conv2d_t *g, int64_t n, int64_t ic,
                      int64_t oc)
{
    if (n <= 0 || ic <= 0 || oc <= 0)
        return -1;
    return xmp_unet_conv2d_init(c, (int)n, (int)ic, g->h, g->w, (int)oc, g->kh, g->kw, g->stride,
                                g->pad);
}

static float *col_alloc(const xmp_unet_conv2d_t *c)
{
    size_t n = xmp_unet_conv2d_col_floats(c);
    return malloc((n ? n : 1) * sizeof(float));
}

xmesh_result_t xmp_conv2d_forward(const xmp_tensor_t *x, const xmp_tensor_t *w,
                                  const xmp_tensor_t *b, int stride, int pad, xmp_tensor_t *y)
{
    const char *op = "xmp_conv2d_forward";
    xmp_unet_conv2d_t g, c;
    xmp_sbp_t tx[NAX], tw[NAX], ty[NAX], tb[NAX];
    xmesh_result_t r;
    if (!y)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: y is NULL", op);
    if ((r = conv_check(x, w, b, stride, pad, op, &g)) || (r = conv_deduce(x, w, tx, tw, ty, op)))
        return r;
    xmp_sbp_all_b(tb);
    for (int a = 0; a < x->mesh->ndim; a++)
        if (ty[a].kind == XMP_S && ty[a].dim == 1)
            tb[a] = xmp_sbp_s(0);
    int64_t ys[4] = {x->shape[0], w->shape[0], g.oh, g.ow};
    xmp_tensor_t bx, bw, bb, o;
    memset(&bb, 0, sizeof bb);
    if ((r = xmp_box(x, tx, &bx)))
        return r;
    if ((r = xmp_box(w, tw, &bw)))
        goto out_x;
    if (b && (r = xmp_box(b, tb, &bb)))
        goto out_w;
    if ((r = xmp_tensor_alloc(&o, x->mesh, 4, ys, XMESH_F32, ty)))
        goto out_b;
    if (computes(&o)) {
        const float *bias = b && holder(x->mesh, ty) ? xmp_f32(&bb) : NULL;
        if (o.lshape[0] != bx.lshape[0] || o.lshape[1] != bw.lshape[0] ||
            bx.lshape[1] != bw.lshape[1]) {
            r = xmp_err(XMESH_ERR_INTERNAL, "%s: local blocks x %s w %s y %s do not match", op,
                        bx.spec, bw.spec, o.spec);
        } else if (conv_local(&c, &g, o.lshape[0], bx.lshape[1], o.lshape[1]) != 0) {
            /* no input channels here: the partial sum is zero (plus the bias on the holder) */
            int64_t hw = o.lshape[2] * o.lshape[3];
            for (int64_t i = 0; bias && i < o.lcount; i++)
                xmp_f32(&o)[i] = bias[(i / hw) % o.lshape[1]];
        } else {
            float *col = col_alloc(&c);
            if (!col)
                r = xmp_err(XMESH_ERR_NO_MEMORY, "%s: out of memory for im2col", op);
            else if (xmp_unet_conv2d_forward(&c, xmp_f32(&bx), xmp_f32(&bw), bias, xmp_f32(&o),
                                             col) != 0)
                r = xmp_err(XMESH_ERR_INTERNAL, "%s: %s", op, xmp_last_error());
            free(col);
        }
    }
    if (r)
        xmp_tensor_free(&o);
    else
        *y = o;
out_b:
    xmp_tensor_free(&bb);
out_w:
    xmp_tensor_free(&bw);
out_x:
    xmp_tensor_free(&bx);
    return r;
}

xmesh_result_t xmp_conv2d_backward_input(const xmp_tensor_t *dy, const xmp_tensor_t *x,
                                         const xmp_tensor_t *w, int stride, int pad,
                                         xmp_tensor_t *dx)
{
    const char *op = "xmp_conv2d_backward_input";
    xmp_unet_conv2d_t g, c;
    xmp_sbp_t tx[NAX], tw[NAX], ty[NAX], tdy[NAX], tdx[NAX];
    xmesh_result_t r;
    if (!dx)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: dx is NULL", op);
    if ((r = conv_check(x, w, NULL, stride, pad, op, &g)) || (r = check_t(dy, 4, op, "dy")) ||
        (r = xmp_same_mesh(x, dy, op)) || (r = conv_deduce(x, w, tx, tw, ty, op)))
        return r;
    xmp_sbp_all_b(tdx);
    for (int a = 0; a < NAX; a++) {
        tdy[a] = grad_of(ty[a]);
        if (a >= x->mesh->ndim)
            continue;
        if (tx[a].kind == XMP_S)
            tdx[a] = tx[a];
        else if (tx[a].kind == XMP_B && (tw[a].kind == XMP_S || tw[a].kind == XMP_P))
            tdx[a] = xmp_sbp_p();
    }
    xmp_tensor_t bdy, bw, o;
    if ((r = xmp_box(dy, tdy, &bdy)))
        return r;
    if ((r = xmp_box(w, tw, &bw)))
        goto out_dy;
    if ((r = xmp_tensor_alloc(&o, x->mesh, 4, x->shape, XMESH_F32, tdx)))
        goto out_w;
    if (computes(&o) && conv_local(&c, &g, o.lshape[0], o.lshape[1], bw.lshape[0]) == 0) {
        float *col = col_alloc(&c);
        if (bdy.lshape[1] != bw.lshape[0] || bw.lshape[1] != o.lshape[1])
            r = xmp_err(XMESH_ERR_INTERNAL, "%s: local blocks do not match", op);
        else if (!col)
            r = xmp_err(XMESH_ERR_NO_MEMORY, "%s: out of memory for im2col", op);
        else if (xmp_unet_conv2d_backward_input(&c, xmp_f32(&bdy), xmp_f32(&bw), xmp_f32(&o),
                                                col) != 0)
            r = xmp_err(XMESH_ERR_INTERNAL, "%s: %s", op, xmp_last_error());
        free(col);
    }
    if (r)
        xmp_tensor_free(&o);
    else
        *dx = o;
out_w:
    xmp_tensor_free(&bw);
out_dy:
    xmp_tensor_free(&bdy);
    return r;
}

xmesh_result_t xmp_conv2d_backward_weight(const xmp_tensor_t *dy, const xmp_tensor_t *x,
                                          const xmp_tensor_t *w, int stride, int pad,
                                          xmp_tensor_t *dw, xmp_tensor_t *db)
{
    const char *op = "xmp_conv2d_backward_weight";
    xmp_unet_conv2d_t g, c;
    xmp_sbp_t tx[NAX], tw[NAX], ty[NAX], tdy[NAX], tdw[NAX], tdb[NAX];
    xmesh_result_t r;
    if (!dw)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: dw is NULL", op);
    if ((r = conv_check(x, w, NULL, stride, pad, op, &g)) || (r = check_t(dy, 4, op, "dy")) ||
        (r = xmp_same_mesh(x, dy, op)) || (r = conv_deduce(x, w, tx, tw, ty, op)))
        return r;
    xmp_sbp_all_b(tdw);
    xmp_sbp_all_b(tdb);
    for (int a = 0; a < NAX; a++) {
        tdy[a] = grad_of(ty[a]);
        if (a >= x->mesh->ndim)
            continue;
        if (tw[a].kind == XMP_S)
            tdw[a] = tw[a];
        else if ((tx[a].kind == XMP_S && tx[a].dim == 0) || tx[a].kind == XMP_P)
            tdw[a] = xmp_sbp_p();
        if (ty[a].kind == XMP_S)
            tdb[a] = ty[a].dim == 0 ? xmp_sbp_p() : xmp_sbp_s(0);
    }
    int64_t bs = w->shape[0];
    xmp_tensor_t bdy, bx, o, ob;
    memset(&ob, 0, sizeof ob);
    if ((r = xmp_box(dy, tdy, &bdy)))
        return r;
    if ((r = xmp_box(x, tx, &bx)))
        goto out_dy;
    if ((r = xmp_tensor_alloc(&o, x->mesh, 4, w->shape, XMESH_F32, tdw)))
        goto out_x;
    if (db && (r = xmp_tensor_alloc(&ob, x->mesh, 1, &bs, XMESH_F32, tdb)))
        goto out_o;
    if (computes(&o) && conv_local(&c, &g, bx.lshape[0], o.lshape[1], o.lshape[0]) == 0) {
        float *col = col_alloc(&c);
        if (bdy.lshape[1] != o.lshape[0] || bx.lshape[1] != o.lshape[1] ||
            (db && ob.lcount != o.lshape[0]))
            r = xmp_err(XMESH_ERR_INTERNAL, "%s: local blocks do not match", op);
        else if (!col)
            r = xmp_err(XMESH_ERR_NO_MEMORY, "%s: out of memory for im2col", op);
        else if (xmp_unet_conv2d_backward_weight(&c, xmp_f32(&bx), xmp_f32(&bdy), xmp_f32(&o),
                                                 db ? xmp_f32(&ob) : NULL, col) != 0)
            r = xmp_err(XMESH_ERR_INTERNAL, "%s: %s", op, xmp_last_error());
        free(col);
    }
    if (r) {
        xmp_tensor_free(&ob);
        goto out_o;
    }
    *dw = o;
    if (db)
        *db = ob;
    goto out_x;
out_o:
    xmp_tensor_free(&o);
out_x:
    xmp_tensor_free(&bx);
out_dy:
    xmp_tensor_free(&bdy);
    return r;
}

/* -------------------------------------------------------------- group norm */

void xmp_gn_cache_free(xmp_gn_cache_t *c)
{
    if (!c)
        return;
    xmp_tensor_free(&c->mean);
    xmp_tensor_free(&c->rstd);
    memset(c, 0, sizeof *c);
}

/* tx: x's used SBP, tg: gamma/beta's, ts: the statistics' (N, groups). *span: 1 when a group
 * spans ranks (groups not a multiple of the channel pieces): statistics all-reduced over the
 * channel-splitting axes, every rank holding all groups' statistics of its samples. */
static xmesh_result_t gn_deduce(const xmp_tensor_t *x, const xmp_tensor_t *gamma, int groups,
                                xmp_sbp_t *tx, xmp_sbp_t *tg, xmp_sbp_t *ts, int *span,
                                const char *op)
{
    xmesh_result_t r;
    if ((r = check_t(x, 4, op, "x")) || (r = check_t(gamma, 1, op, "gamma")) ||
        (r = xmp_same_mesh(x, gamma, op)) || (r = no_spatial(x, 2, op, "input x")))
        return r;
    if (groups < 1 || x->shape[1] % groups != 0 || gamma->shape[0] != x->shape[1])
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                       "%s: groups %d must divide the %lld channels (gamma has %lld)", op, groups,
                       (long long)x->shape[1], (long long)gamma->shape[0]);
    xmp_sbp_all_b(tx);
    xmp_sbp_all_b(tg);
    xmp_sbp_all_b(ts);
    for (int a = 0; a < x->mesh->ndim; a++) {
        xmp_sbp_t s = x->sbp[a];
        if (s.kind == XMP_S) {
            tx[a] = ts[a] = s;
            tg[a] = s.dim == 1 ? xmp_sbp_s(0) : xmp_sbp_b();
        }
    }
    *span = groups % pieces(x->mesh, tx, 1) != 0;
    for (int a = 0; *span && a < x->mesh->ndim; a++)
        if (is_ch(tx[a]))
            ts[a] = xmp_sbp_b();
    return XMESH_SUCCESS;
}

/* Sums n doubles over every mesh axis that splits the channels (collective over those axes). */
static xmesh_result_t ch_allreduce(const xmp_mesh_t *m, const xmp_sbp_t *tx, double *buf, int n)
{
    xmesh_result_t r = XMESH_SUCCESS;
    for (int a = 0; a < m->ndim && m->member && !r; a++)
        if (is_ch(tx[a]))
            r = xmp_agree(buf, n, MPI_DOUBLE, MPI_SUM, m->axis[a], "group norm statistics");
    return r;
}

/* Group norm of my block bx when groups span ranks (two-pass statistics, all-reduced). */
static xmesh_result_t gn_span_forward(const xmp_tensor_t *bx, const xmp_sbp_t *tx, int groups,
                                      const float *gamma, const float *beta, float *y, float *mean,
                                      float *rstd)
{
    const int64_t nl = bx->lshape[0], cl = bx->lshape[1], c0 = bx->loff[1];
    const int64_t hw = bx->lshape[2] * bx->lshape[3], cpg = bx->shape[1] / groups;
    const double M = (double)cpg * (double)(bx->shape[2] * bx->shape[3]);
    double *s = calloc((size_t)(nl * groups) + 1, sizeof(double));
    if (!s)
        return xmp_err(XMESH_ERR_NO_MEMORY, "xmp_groupnorm_forward: out of memory");
    const float *x = xmp_f32(bx);
    for (int pass = 0; pass < 2; pass++) {
        for (int64_t n = 0; n < nl; n++)
            for (int64_t c = 0; c < cl; c++) {
                int64_t g = n * groups + (c0 + c) / cpg;
                const float *p = x + (n * cl + c) * hw;
                double acc = 0, mu = pass ? mean[g] : 0;
                for (int64_t i = 0; i < hw; i++)
                    acc += pass ? ((double)p[i] - mu) * ((double)p[i] - mu) : (double)p[i];
                s[g] += acc;
            }
        xmesh_result_t r = ch_allreduce(bx->mesh, tx, s, (int)(nl * groups));
        if (r) {
            free(s);
            return r;
        }
        for (int64_t g = 0; g < nl * groups; g++) {
            if (pass)
                rstd[g] = (float)(1.0 / sqrt(s[g] / M + 1e-5));
            else
                mean[g] = (float)(s[g] / M);
            s[g] = 0;
        }
    }
    for (int64_t n = 0; n < nl; n++)
        for (int64_t c = 0; c < cl; c++) {
            int64_t g = n * groups + (c0 + c) / cpg;
            const float *p = x + (n * cl + c) * hw;
            float *q = y + (n * cl + c) * hw;
            for (int64_t i = 0; i < hw; i++)
                q[i] = (p[i] - mean[g]) * rstd[g] * gamma[c] + beta[c];
        }
    free(s);
    return XMESH_SUCCESS;
}

/* Backward of gn_span_forward: dx (may be NULL) with the group sums of dy*gamma and
 * dy*gamma*xhat all-reduced; dgamma, dbeta (may be NULL) over my channels. Accumulates. */
static xmesh_result_t gn_span_backward(const xmp_tensor_t *bx, const xmp_sbp_t *tx, int groups,
                                       const float *dy, const float *gamma, const float *mean,
                                       const float *rstd, float *dx, float *dgamma, float *dbeta)
{
    const int64_t nl = bx->lshape[0], cl = bx->lshape[1], c0 = bx->loff[1];
    const int64_t hw = bx->lshape[2] * bx->lshape[3], cpg = bx->shape[1] / groups;
    const double M = (double)cpg * (double)(bx->shape[2] * bx->shape[3]);
    const float *x = xmp_f32(bx);
    for (int64_t n = 0; n < nl && dgamma; n++)
        for (int64_t c = 0; c < cl; c++) {
            int64_t g = n * groups + (c0 + c) / cpg, o = (n * cl + c) * hw;
            for (int64_t i = 0; i < hw; i++) {
                dgamma[c] += dy[o + i] * (x[o + i] - mean[g]) * rstd[g];
                dbeta[c] += dy[o + i];
            }
        }
    if (!dx)
        return XMESH_SUCCESS;
    double *s = calloc((size_t)(2 * nl * groups) + 1, sizeof(double));
    if (!s)
        return xmp_err(XMESH_ERR_NO_MEMORY, "xmp_groupnorm_backward: out of memory");
    for (int64_t n = 0; n < nl; n++)
        for (int64_t c = 0; c < cl; c++) {
            int64_t g = n * groups + (c0 + c) / cpg, o = (n * cl + c) * hw;
            for (int64_t i = 0; i < hw; i++) {
                double d = (double)dy[o + i] * gamma[c];
                s[2 * g] += d;
                s[2 * g + 1] += d * ((double)x[o + i] - mean[g]) * rstd[g];
            }
        }
    xmesh_result_t r = ch_allreduce(bx->mesh, tx, s, (int)(2 * nl * groups));
    if (r) {
        free(s);
        return r;
    }
    for (int64_t n = 0; n < nl; n++)
        for (int64_t c = 0; c < cl; c++) {
            int64_t g = n * groups + (c0 + c) / cpg, o = (n * cl + c) * hw;
            double a = s[2 * g] / M, b = s[2 * g + 1] / M;
            for (int64_t i = 0; i < hw; i++) {
                double xh = ((double)x[o + i] - mean[g]) * rstd[g];
                dx[o + i] += (float)(rstd[g] * ((double)dy[o + i] * gamma[c] - a - xh * b));
            }
        }
    free(s);
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_groupnorm_forward(const xmp_tensor_t *x, const xmp_tensor_t *gamma,
                                     const xmp_tensor_t *beta, int groups, xmp_tensor_t *y,
                                     xmp_gn_cache_t *cache)
{
    const char *op = "xmp_groupnorm_forward";
    xmp_sbp_t tx[NAX], tg[NAX], ts[NAX];
    xmesh_result_t r;
    int span;
    if (!y || !cache)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: y or cache is NULL", op);
    if ((r = gn_deduce(x, gamma, groups, tx, tg, ts, &span, op)) ||
        (r = check_t(beta, 1, op, "beta")) || (r = xmp_same_mesh(x, beta, op)))
        return r;
    if (beta->shape[0] != x->shape[1])
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: beta has %lld entries, x %lld channels", op,
                       (long long)beta->shape[0], (long long)x->shape[1]);
    int64_t ss[2] = {x->shape[0], groups};
    xmp_tensor_t bx, bg, bb, o, mu, rs;
    memset(&mu, 0, sizeof mu);
    memset(&rs, 0, sizeof rs);
    if ((r = xmp_box(x, tx, &bx)))
        return r;
    if ((r = xmp_box(gamma, tg, &bg)))
        goto out_x;
    if ((r = xmp_box(beta, tg, &bb)))
        goto out_g;
    if ((r = xmp_tensor_alloc(&o, x->mesh, 4, x->shape, XMESH_F32, tx)) ||
        (r = xmp_tensor_alloc(&mu, x->mesh, 2, ss, XMESH_F32, ts)) ||
        (r = xmp_tensor_alloc(&rs, x->mesh, 2, ss, XMESH_F32, ts)))
        goto out_o;
    if (span && x->mesh->member)
        r = gn_span_forward(&bx, tx, groups, xmp_f32(&bg), xmp_f32(&bb), xmp_f32(&o), xmp_f32(&mu),
                            xmp_f32(&rs));
    else if (computes(&o) &&
             xmp_unet_groupnorm_forward((int)o.lshape[0], (int)o.lshape[1],
                                        (int)(o.lshape[2] * o.lshape[3]), (int)mu.lshape[1],
                                        xmp_f32(&bx), xmp_f32(&bg), xmp_f32(&bb), xmp_f32(&o),
                                        xmp_f32(&mu), xmp_f32(&rs)) != 0)
        r = xmp_err(XMESH_ERR_INTERNAL, "%s: %s", op, xmp_last_error());
    if (!r) {
        *y = o;
        cache->mean = mu;
        cache->rstd = rs;
        goto out_b;
    }
out_o:
    xmp_tensor_free(&o);
    xmp_tensor_free(&mu);
    xmp_tensor_free(&rs);
out_b:
    xmp_tensor_free(&bb);
out_g:
    xmp_tensor_free(&bg);
out_x:
    xmp_tensor_free(&bx);
    return r;
}

xmesh_result_t xmp_groupnorm_backward(const xmp_tensor_t *dy, const xmp_tensor_t *x,
                                      const xmp_tensor_t *gamma, int groups,
                                      const xmp_gn_cache_t *cache, xmp_tensor_t *dx,
                                      xmp_tensor_t *dgamma, xmp_tensor_t *dbeta)
{
    const char *op = "xmp_groupnorm_backward";
    xmp_sbp_t tx[NAX], tg[NAX], ts[NAX], tdg[NAX];
    xmesh_result_t r;
    int span;
    if (!cache || (!dx && !dgamma && !dbeta) || (!dgamma != !dbeta))
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                       "%s: needs the cache and dx and/or both of dgamma, dbeta", op);
    if ((r = gn_deduce(x, gamma, groups, tx, tg, ts, &span, op)) ||
        (r = check_t(dy, 4, op, "dy")) || (r = xmp_same_mesh(x, dy, op)))
        return r;
    xmp_sbp_all_b(tdg);
    for (int a = 0; a < x->mesh->ndim; a++)
        if (tx[a].kind == XMP_S)
            tdg[a] = tx[a].dim == 0 ? xmp_sbp_p() : xmp_sbp_s(0);
    xmp_tensor_t bdy, bx, bg, o, og, ob;
    memset(&bg, 0, sizeof bg);
    memset(&o, 0, sizeof o);
    memset(&og, 0, sizeof og);
    memset(&ob, 0, sizeof ob);
    if ((r = xmp_box(dy, tx, &bdy)))
        return r;
    if ((r = xmp_box(x, tx, &bx)))
        goto out_dy;
    if ((dx && (r = xmp_box(gamma, tg, &bg))) ||
        (dx && (r = xmp_tensor_alloc(&o, x->mesh, 4, x->shape, XMESH_F32, tx))) ||
        (dgamma && (r = xmp_tensor_alloc(&og, x->mesh, 1, gamma->shape, XMESH_F32, tdg))) ||
        (dbeta && (r = xmp_tensor_alloc(&ob, x->mesh, 1, gamma->shape, XMESH_F32, tdg))))
        goto out_all;
    if (span && x->mesh->member)
        r = gn_span_backward(&bx, tx, groups, xmp_f32(&bdy), dx ? xmp_f32(&bg) : NULL,
                             xmp_f32(&cache->mean), xmp_f32(&cache->rstd), dx ? xmp_f32(&o) : NULL,
                             dgamma ? xmp_f32(&og) : NULL, dbeta ? xmp_f32(&ob) : NULL);
    else if (computes(&bx) &&
             xmp_unet_groupnorm_backward(
                 (int)bx.lshape[0], (int)bx.lshape[1], (int)(bx.lshape[2] * bx.lshape[3]),
                 (int)cache->mean.lshape[1], xmp_f32(&bx), xmp_f32(&bdy), dx ? xmp_f32(&bg) : NULL,
                 xmp_f32(&cache->mean), xmp_f32(&cache->rstd), dx ? xmp_f32(&o) : NULL,
                 dgamma ? xmp_f32(&og) : NULL, dbeta ? xmp_f32(&ob) : NULL) != 0)
        r = xmp_err(XMESH_ERR_INTERNAL, "%s: %s", op, xmp_last_error());
    if (!r) {
        if (dx)
            *dx = o;
        if (dgamma) {
            *dgamma = og;
            *dbeta = ob;
        }
        memset(&o, 0, sizeof o);
        memset(&og, 0, sizeof og);
        memset(&ob, 0, sizeof ob);
    }
out_all:
    xmp_tensor_free(&o);
    xmp_tensor_free(&og);
    xmp_tensor_free(&ob);
    xmp_tensor_free(&bg);
    xmp_tensor_free(&bx);
out_dy:
    xmp_tensor_free(&bdy);
    return r;
}

/* ------------------------------------------------------------------- SiLU */

static void used_no_p(const xmp_tensor_t *x, xmp_sbp_t *t)
{
    xmp_sbp_all_b(t);
    for (int a = 0; a < x->mesh->ndim; a++)
        t[a] = x->sbp[a].kind == XMP_P ? xmp_sbp_b() : x->sbp[a];
}

xmesh_result_t xmp_silu_forward(const xmp_tensor_t *x, xmp_tensor_t *y)
{
    const char *op = "xmp_silu_forward";
    xmp_sbp_t tx[NAX];
    xmesh_result_t r;
    if (!y)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: y is NULL", op);
    if ((r = check_t(x, 0, op, "x")))
        return r;
    used_no_p(x, tx);
    xmp_tensor_t o;
    if ((r = xmp_box(x, tx, &o)))
        return r;
    if (computes(&o))
        xmp_unet_silu_forward((size_t)o.lcount, xmp_f32(&o), xmp_f32(&o));
    *y = o;
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_silu_backward(const xmp_tensor_t *dy, const xmp_tensor_t *x, xmp_tensor_t *dx)
{
    const char *op = "xmp_silu_backward";
    xmp_sbp_t tx[NAX];
    xmesh_result_t r;
    if (!dx)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: dx is NULL", op);
    if ((r = check_t(x, 0, op, "x")) || (r = check_t(dy, x->ndim, op, "dy")) ||
        (r = xmp_same_mesh(x, dy, op)))
        return r;
    used_no_p(x, tx);
    xmp_tensor_t bx, bdy, o;
    if ((r = xmp_box(x, tx, &bx)))
        return r;
    if ((r = xmp_box(dy, tx, &bdy)))
        goto out_x;
    if ((r = xmp_tensor_alloc_like(&o, &bx)))
        goto out_dy;
    if (computes(&o))
        xmp_unet_silu_backward((size_t)o.lcount, xmp_f32(&bx), xmp_f32(&bdy), xmp_f32(&o));
    *dx = o;
out_dy:
    xmp_tensor_free(&bdy);
out_x:
    xmp_tensor_free(&bx);
    return r;
}

/* ------------------------------------------------------------- up-sampling */

xmesh_result_t xmp_upsample2x_forward(const xmp_tensor_t *x, xmp_tensor_t *y)
{
    const char *op = "xmp_upsample2x_forward";
    xmesh_result_t r;
    if (!y)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: y is NULL", op);
    if ((r = check_t(x, 4, op, "x")) || (r = no_spatial(x, 2, op, "input x")))
        return r;
    int64_t ys[4] = {x->shape[0], x->shape[1], 2 * x->shape[2], 2 * x->shape[3]};
    xmp_tensor_t o;
    if ((r = xmp_tensor_alloc(&o, x->mesh, 4, ys, XMESH_F32, x->sbp)))
        return r;
    if (computes(&o))
        xmp_unet_upsample2x_forward((int)x->lshape[0], (int)x->lshape[1], (int)x->shape[2],
                                    (int)x->shape[3], xmp_f32(x), xmp_f32(&o));
    *y = o;
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_upsample2x_backward(const xmp_tensor_t *dy, const xmp_tensor_t *x,
                                       xmp_tensor_t *dx)
{
    const char *op = "xmp_upsample2x_backward";
    xmp_sbp_t tg[NAX];
    xmesh_result_t r;
    if (!dx)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: dx is NULL", op);
    if ((r = check_t(x, 4, op, "x")) || (r = check_t(dy, 4, op, "dy")) ||
        (r = xmp_same_mesh(x, dy, op)) || (r = no_spatial(x, 2, op, "input x")))
        return r;
    xmp_sbp_all_b(tg);
    for (int a = 0; a < x->mesh->ndim; a++)
        tg[a] = grad_of(x->sbp[a]);
    xmp_tensor_t bdy, o;
    if ((r = xmp_box(dy, tg, &bdy)))
        return r;
    if ((r = xmp_tensor_alloc(&o, x->mesh, 4, x->shape, XMESH_F32, tg)) == XMESH_SUCCESS) {
        if (computes(&o))
            xmp_unet_upsample2x_backward((int)o.lshape[0], (int)o.lshape[1], (int)x->shape[2],
                                         (int)x->shape[3], xmp_f32(&bdy), xmp_f32(&o));
        *dx = o;
    }
    xmp_tensor_free(&bdy);
    return r;
}

/* ------------------------------------------------------------------ concat */

static xmesh_result_t cat_deduce(const xmp_tensor_t *a, const xmp_tensor_t *b, xmp_sbp_t *t,
                                 const char *op)
{
    xmesh_result_t r;
    if ((r = check_t(a, 4, op, "a")) || (r = check_t(b, 4, op, "b")) ||
        (r = xmp_same_mesh(a, b, op)))
        return r;
    if (a->shape[0] != b->shape[0] || a->shape[2] != b->shape[2] || a->shape[3] != b->shape[3])
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: a and b differ in batch or spatial size",
                       op);
    xmp_sbp_all_b(t);
    for (int ax = 0; ax < a->mesh->ndim; ax++) {
        xmp_sbp_t s[2] = {a->sbp[ax], b->sbp[ax]};
        int s0 = 0, bb = 0;
        for (int i = 0; i < 2; i++) {
            if (s[i].kind == XMP_S && s[i].dim >= 1)
                return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                               "%s: operand %s '%s' is S(%d) on mesh axis %d: %s (rule: "
                               "S(0), B or P per axis)",
                               op, i ? "b" : "a", i ? b->spec : a->spec, s[i].dim, ax,
                               s[i].dim == 1 ? "the channel pieces of the operands would not "
                                               "form the array_split pieces of the concat"
                                             : "a spatial split needs halo exchanges");
            s0 |= s[i].kind == XMP_S;
            bb |= s[i].kind == XMP_B;
        }
        t[ax] = s0 ? xmp_sbp_s(0) : bb ? xmp_sbp_b() : xmp_sbp_p();
    }
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_concat_forward(const xmp_tensor_t *a, const xmp_tensor_t *b, xmp_tensor_t *y)
{
    const char *op = "xmp_concat_forward";
    xmp_sbp_t t[NAX];
    xmesh_result_t r;
    if (!y)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: y is NULL", op);
    if ((r = cat_deduce(a, b, t, op)))
        return r;
    int64_t ys[4] = {a->shape[0], a->shape[1] + b->shape[1], a->shape[2], a->shape[3]};
    xmp_tensor_t ba, bb, o;
    if ((r = xmp_box(a, t, &ba)))
        return r;
    if ((r = xmp_box(b, t, &bb)))
        goto out_a;
    if ((r = xmp_tensor_alloc(&o, a->mesh, 4, ys, XMESH_F32, t)))
        goto out_b;
    if (computes(&o))
        xmp_unet_concat_forward((int)o.lshape[0], (int)a->shape[1], (int)b->shape[1],
                                (int)(a->shape[2] * a->shape[3]), xmp_f32(&ba), xmp_f32(&bb),
                                xmp_f32(&o));
    *y = o;
out_b:
    xmp_tensor_free(&bb);
out_a:
    xmp_tensor_free(&ba);
    return r;
}

xmesh_result_t xmp_concat_backward(const xmp_tensor_t *dy, const xmp_tensor_t *a,
                                   const xmp_tensor_t *b, xmp_tensor_t *da, xmp_tensor_t *db)
{
    const char *op = "xmp_concat_backward";
    xmp_sbp_t t[NAX];
    xmesh_result_t r;
    if ((r = cat_deduce(a, b, t, op)) || (r = check_t(dy, 4, op, "dy")) ||
        (r = xmp_same_mesh(a, dy, op)))
        return r;
    for (int ax = 0; ax < NAX; ax++)
        t[ax] = grad_of(t[ax]);
    xmp_tensor_t bdy, oa, ob;
    memset(&oa, 0, sizeof oa);
    memset(&ob, 0, sizeof ob);
    if ((r = xmp_box(dy, t, &bdy)))
        return r;
    if ((da && (r = xmp_tensor_alloc(&oa, a->mesh, 4, a->shape, XMESH_F32, t))) ||
        (db && (r = xmp_tensor_alloc(&ob, a->mesh, 4, b->shape, XMESH_F32, t)))) {
        xmp_tensor_free(&oa);
        goto out;
    }
    if (computes(&bdy))
        xmp_unet_concat_backward((int)bdy.lshape[0], (int)a->shape[1], (int)b->shape[1],
                                 (int)(a->shape[2] * a->shape[3]), xmp_f32(&bdy),
                                 da ? xmp_f32(&oa) : NULL, db ? xmp_f32(&ob) : NULL);
    if (da)
        *da = oa;
    if (db)
        *db = ob;
out:
    xmp_tensor_free(&bdy);
    return r;
}

/* ------------------------------------------------------------------ tokens */

/* Maps the SBP of an NCHW tensor to that of its (N, HW, C) tokens (to 1) or back (to 0). */
static xmesh_result_t tok_map(const xmp_tensor_t *src, int to, xmp_sbp_t *dst, const char *op)
{
    xmp_sbp_all_b(dst);
    for (int a = 0; a < src->mesh->ndim; a++) {
        xmp_sbp_t s = src->sbp[a];
        dst[a] = s;
        if (s.kind != XMP_S || s.dim == 0)
            continue;
        if (to && s.dim == 1)
            dst[a] = xmp_sbp_s(2);
        else if (!to && s.dim == 2)
            dst[a] = xmp_sbp_s(1);
        else
            return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                           "%s: '%s' is S(%d) on mesh axis %d: %s split of a feature map or "
                           "token sequence is not implemented (rule: S(0) batch or channels)",
                           op, src->spec, s.dim, a, to ? "a spatial" : "a token");
    }
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_to_tokens_forward(const xmp_tensor_t *x, xmp_tensor_t *t)
{
    const char *op = "xmp_to_tokens_forward";
    xmp_sbp_t ts[NAX];
    xmesh_result_t r;
    if (!t)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: t is NULL", op);
    if ((r = check_t(x, 4, op, "x")) || (r = tok_map(x, 1, ts, op)))
        return r;
    int64_t s[3] = {x->shape[0], x->shape[2] * x->shape[3], x->shape[1]};
    xmp_tensor_t o;
    if ((r = xmp_tensor_alloc(&o, x->mesh, 3, s, XMESH_F32, ts)))
        return r;
    if (computes(&o))
        xmp_unet_nchw_to_tokens((int)x->lshape[0], (int)x->lshape[1], (int)s[1], xmp_f32(x),
                                xmp_f32(&o));
    *t = o;
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_to_tokens_backward(const xmp_tensor_t *dt, const xmp_tensor_t *x,
                                      xmp_tensor_t *dx)
{
    const char *op = "xmp_to_tokens_backward";
    xmp_sbp_t ts[NAX], tg[NAX];
    xmesh_result_t r;
    if (!dx)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: dx is NULL", op);
    if ((r = check_t(x, 4, op, "x")) || (r = check_t(dt, 3, op, "dt")) ||
        (r = xmp_same_mesh(x, dt, op)) || (r = tok_map(x, 1, ts, op)))
        return r;
    for (int a = 0; a < NAX; a++) {
        ts[a] = grad_of(ts[a]);
        tg[a] = a < x->mesh->ndim ? grad_of(x->sbp[a]) : xmp_sbp_b();
    }
    xmp_tensor_t bdt, o;
    if ((r = xmp_box(dt, ts, &bdt)))
        return r;
    if ((r = xmp_tensor_alloc(&o, x->mesh, 4, x->shape, XMESH_F32, tg)) == XMESH_SUCCESS) {
        if (computes(&o))
            xmp_unet_nchw_to_tokens_backward((int)o.lshape[0], (int)o.lshape[1],
                                             (int)(x->shape[2] * x->shape[3]), xmp_f32(&bdt),
                                             xmp_f32(&o));
        *dx = o;
    }
    xmp_tensor_free(&bdt);
    return r;
}

xmesh_result_t xmp_from_tokens_forward(const xmp_tensor_t *t, int h, int w, xmp_tensor_t *x)
{
    const char *op = "xmp_from_tokens_forward";
    xmp_sbp_t xs[NAX];
    xmesh_result_t r;
    if (!x)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: x is NULL", op);
    if ((r = check_t(t, 3, op, "t")) || (r = tok_map(t, 0, xs, op)))
        return r;
    if (h < 1 || w < 1 || (int64_t)h * w != t->shape[1])
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: %d x %d pixels for %lld tokens", op, h, w,
                       (long long)t->shape[1]);
    int64_t s[4] = {t->shape[0], t->shape[2], h, w};
    xmp_tensor_t o;
    if ((r = xmp_tensor_alloc(&o, t->mesh, 4, s, XMESH_F32, xs)))
        return r;
    if (computes(&o))
        xmp_unet_tokens_to_nchw((int)o.lshape[0], (int)o.lshape[1], h * w, xmp_f32(t), xmp_f32(&o));
    *x = o;
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_from_tokens_backward(const xmp_tensor_t *dx, const xmp_tensor_t *t, int h, int w,
                                        xmp_tensor_t *dt)
{
    const char *op = "xmp_from_tokens_backward";
    xmp_sbp_t xs[NAX], tg[NAX];
    xmesh_result_t r;
    if (!dt)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: dt is NULL", op);
    if ((r = check_t(t, 3, op, "t")) || (r = check_t(dx, 4, op, "dx")) ||
        (r = xmp_same_mesh(t, dx, op)) || (r = tok_map(t, 0, xs, op)))
        return r;
    if ((int64_t)h * w != t->shape[1])
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: %d x %d pixels for %lld tokens", op, h, w,
                       (long long)t->shape[1]);
    for (int a = 0; a < NAX; a++) {
        xs[a] = grad_of(xs[a]);
        tg[a] = a < t->mesh->ndim ? grad_of(t->sbp[a]) : xmp_sbp_b();
    }
    xmp_tensor_t bdx, o;
    if ((r = xmp_box(dx, xs, &bdx)))
        return r;
    if ((r = xmp_tensor_alloc(&o, t->mesh, 3, t->shape, XMESH_F32, tg)) == XMESH_SUCCESS) {
        if (computes(&o))
            xmp_unet_tokens_to_nchw_backward((int)o.lshape[0], (int)o.lshape[2], h * w,
                                             xmp_f32(&bdx), xmp_f32(&o));
        *dt = o;
    }
    xmp_tensor_free(&bdx);
    return r;
}

/* --------------------------------------------------------------- attention */

void xmp_mha_cache_free(xmp_mha_cache_t *c)
{
    if (!c)
        return;
    xmp_tensor_free(&c->probs);
    memset(c, 0, sizeof *c);
}

/* tq: q's used SBP (= out's), tk: k's and v's, tp: the probabilities'. */
static xmesh_result_t mha_deduce(const xmp_tensor_t *q, const xmp_tensor_t *k,
                                 const xmp_tensor_t *v, int head_dim, xmp_sbp_t *tq, xmp_sbp_t *tk,
                                 xmp_sbp_t *tp, const char *op)
{
    xmesh_result_t r;
    if ((r = check_t(q, 3, op, "q")) || (r = check_t(k, 3, op, "k")) ||
        (r = check_t(v, 3, op, "v")) || (r = xmp_same_mesh(q, k, op)) ||
        (r = xmp_same_mesh(q, v, op)))
        return r;
    if (head_dim < 1 || q->shape[2] % head_dim != 0 || k->shape[2] != q->shape[2] ||
        v->shape[2] != q->shape[2] || k->shape[0] != q->shape[0] || v->shape[0] != q->shape[0] ||
        k->shape[1] != v->shape[1])
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                       "%s: shapes q (%lld, %lld, %lld), k/v (%lld, %lld, %lld) with head_dim "
                       "%d do not fit (N, T, heads*head_dim)",
                       op, (long long)q->shape[0], (long long)q->shape[1], (long long)q->shape[2],
                       (long long)k->shape[0], (long long)k->shape[1], (long long)k->shape[2],
                       head_dim);
    xmp_sbp_all_b(tq);
    xmp_sbp_all_b(tk);
    xmp_sbp_all_b(tp);
    for (int a = 0; a < q->mesh->ndim; a++) {
        xmp_sbp_t s = q->sbp[a];
        if (s.kind != XMP_S)
            continue;
        tq[a] = s;
        tk[a] = s.dim == 1 ? xmp_sbp_b() : s;
        tp[a] = xmp_sbp_s(s.dim == 0 ? 0 : s.dim == 1 ? 2 : 1);
    }
    int heads = (int)(q->shape[2] / head_dim), pc = pieces(q->mesh, tq, 2);
    if (heads % pc != 0) {
        int a0 = 0;
        for (int a = 0; a < q->mesh->ndim; a++)
            if (tq[a].kind == XMP_S && tq[a].dim == 2)
                a0 = a;
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                       "%s: q '%s' splits the channels into %d pieces (mesh axis %d, size %d), "
                       "but the %d heads are not divisible by %d: a head would be cut (rule: "
                       "heads split only when heads %% pieces == 0)",
                       op, q->spec, pc, a0, q->mesh->shape[a0], heads, pc);
    }
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_mha_forward(const xmp_tensor_t *q, const xmp_tensor_t *k, const xmp_tensor_t *v,
                               int head_dim, xmp_tensor_t *out, xmp_mha_cache_t *cache)
{
    const char *op = "xmp_mha_forward";
    xmp_sbp_t tq[NAX], tk[NAX], tp[NAX];
    xmesh_result_t r;
    if (!out || !cache)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: out or cache is NULL", op);
    if ((r = mha_deduce(q, k, v, head_dim, tq, tk, tp, op)))
        return r;
    int64_t ps[4] = {q->shape[0], q->shape[2] / head_dim, q->shape[1], k->shape[1]};
    xmp_tensor_t bq, bk, bv, o, pr;
    memset(&pr, 0, sizeof pr);
    if ((r = xmp_box(q, tq, &bq)))
        return r;
    if ((r = xmp_box(k, tk, &bk)))
        goto out_q;
    if ((r = xmp_box(v, tk, &bv)))
        goto out_k;
    if ((r = xmp_tensor_alloc(&o, q->mesh, 3, q->shape, XMESH_F32, tq)))
        goto out_v;
    if ((r = xmp_tensor_alloc(&pr, q->mesh, 4, ps, XMESH_F32, tp)))
        goto out_o;
    xmp_unet_attn_t at;
    if (computes(&o)) {
        if (xmp_unet_attn_init(&at, (int)bq.lshape[0], (int)bq.lshape[1], (int)bk.lshape[1],
                               (int)(bq.lshape[2] / head_dim), head_dim) != 0 ||
            xmp_unet_attn_forward(&at, xmp_f32(&bq), xmp_f32(&bk), xmp_f32(&bv), xmp_f32(&o),
                                  xmp_f32(&pr)) != 0)
            r = xmp_err(XMESH_ERR_INTERNAL, "%s: %s", op, xmp_last_error());
    }
    if (!r) {
        *out = o;
        cache->probs = pr;
        goto out_v;
    }
    xmp_tensor_free(&pr);
out_o:
    xmp_tensor_free(&o);
out_v:
    xmp_tensor_free(&bv);
out_k:
    xmp_tensor_free(&bk);
out_q:
    xmp_tensor_free(&bq);
    return r;
}

xmesh_result_t xmp_mha_backward(const xmp_tensor_t *dout, const xmp_tensor_t *q,
                                const xmp_tensor_t *k, const xmp_tensor_t *v, int head_dim,
                                const xmp_mha_cache_t *cache, xmp_tensor_t *dq, xmp_tensor_t *dk,
                                xmp_tensor_t *dv)
{
    const char *op = "xmp_mha_backward";
    xmp_sbp_t tq[NAX], tk[NAX], tp[NAX], tdk[NAX];
    xmesh_result_t r;
    if (!cache || !dq || !dk || !dv)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: cache, dq, dk and dv are required", op);
    if ((r = mha_deduce(q, k, v, head_dim, tq, tk, tp, op)) || (r = check_t(dout, 3, op, "dout")) ||
        (r = xmp_same_mesh(q, dout, op)))
        return r;
    for (int a = 0; a < NAX; a++)
        tdk[a] = tq[a].kind == XMP_S && tq[a].dim == 1 ? xmp_sbp_p() : tk[a];
    xmp_tensor_t bq, bk, bv, bd, oq, ok, ov;
    memset(&ok, 0, sizeof ok);
    memset(&ov, 0, sizeof ov);
    float *scr = NULL;
    if ((r = xmp_box(q, tq, &bq)))
        return r;
    if ((r = xmp_box(k, tk, &bk)))
        goto out_q;
    if ((r = xmp_box(v, tk, &bv)))
        goto out_k;
    if ((r = xmp_box(dout, tq, &bd)))
        goto out_v;
    if ((r = xmp_tensor_alloc(&oq, q->mesh, 3, q->shape, XMESH_F32, tq)))
        goto out_d;
    if ((r = xmp_tensor_alloc(&ok, q->mesh, 3, k->shape, XMESH_F32, tdk)) ||
        (r = xmp_tensor_alloc(&ov, q->mesh, 3, v->shape, XMESH_F32, tdk)))
        goto out_o;
    xmp_unet_attn_t at;
    if (computes(&oq)) {
        if (xmp_unet_attn_init(&at, (int)bq.lshape[0], (int)bq.lshape[1], (int)bk.lshape[1],
                               (int)(bq.lshape[2] / head_dim), head_dim) != 0)
            r = xmp_err(XMESH_ERR_INTERNAL, "%s: %s", op, xmp_last_error());
        else if (!(scr = malloc((xmp_unet_attn_scratch_floats(&at) + 1) * sizeof(float))))
            r = xmp_err(XMESH_ERR_NO_MEMORY, "%s: out of memory", op);
        else if (xmp_unet_attn_backward(&at, xmp_f32(&bq), xmp_f32(&bk), xmp_f32(&bv),
                                        xmp_f32(&cache->probs), xmp_f32(&bd), xmp_f32(&oq),
                                        xmp_f32(&ok), xmp_f32(&ov), scr) != 0)
            r = xmp_err(XMESH_ERR_INTERNAL, "%s: %s", op, xmp_last_error());
        free(scr);
    }
    if (!r) {
        *dq = oq;
        *dk = ok;
        *dv = ov;
        goto out_d;
    }
out_o:
    xmp_tensor_free(&oq);
    xmp_tensor_free(&ok);
    xmp_tensor_free(&ov);
out_d:
    xmp_tensor_free(&bd);
out_v:
    xmp_tensor_free(&bv);
out_k:
    xmp_tensor_free(&bk);
out_q:
    xmp_tensor_free(&bq);
    return r;
}
