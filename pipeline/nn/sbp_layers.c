/* SBP layer norm, causal attention and the pure SBP deduction (contracts in
 * sbp_layers.h). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/kernels.h"
#include "nn/sbp_layers.h"
#include "nn/sbp_ops.h"
#include "util/xmp_err.h"

#define NAX XMP_MAX_MESH_DIMS
#define LN_EPS 1e-5f

static xmesh_result_t same_mesh(const xmp_tensor_t *a, const xmp_tensor_t *b, const char *op,
                                const char *na, const char *nb)
{
    if (a->mesh != b->mesh)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                       "%s: %s '%s' and %s '%s' are on different meshes", op, na, a->spec, nb,
                       b->spec);
    return XMESH_SUCCESS;
}

/* -------------------------------------------------------------- rules */

int xmp_rule_layernorm(int naxes, int nd, const xmp_sbp_t *sx, xmp_sbp_t *tx, xmp_sbp_t *tw,
                       xmp_sbp_t *ty, xmp_sbp_t *tstat, char *err, size_t n)
{
    if (nd < 1) {
        if (err && n)
            snprintf(err, n, "layernorm: operand x has %d dims, needs >= 1 (rows..., C)", nd);
        return -1;
    }
    if (xmp_rule_operand("layernorm", "x", naxes, nd, sx, err, n))
        return -1;
    for (int a = 0; a < NAX; a++) {
        xmp_sbp_t b = xmp_sbp_b();
        if (a >= naxes) {
            tx[a] = tw[a] = ty[a] = tstat[a] = b;
            continue;
        }
        xmp_sbp_t s = sx[a];
        tx[a] = s.kind == XMP_P ? b : s;
        ty[a] = tx[a];
        int chan = tx[a].kind == XMP_S && tx[a].dim == nd - 1;
        tw[a] = chan ? xmp_sbp_s(0) : b;
        tstat[a] = tx[a].kind == XMP_S && !chan ? tx[a] : b;
    }
    return 0;
}

int xmp_rule_attention(int naxes, int nd, const xmp_sbp_t *sq, xmp_sbp_t *tq, xmp_sbp_t *ty,
                       xmp_sbp_t *tatt, char *err, size_t n)
{
    if (nd != 5) {
        if (err && n)
            snprintf(err, n,
                     "attention: operand qkv has %d dims, needs 5 (B, T, 3, NH, hs); no rule for "
                     "other layouts",
                     nd);
        return -1;
    }
    if (xmp_rule_operand("attention", "qkv", naxes, nd, sq, err, n))
        return -1;
    for (int a = 0; a < NAX; a++) {
        xmp_sbp_t b = xmp_sbp_b();
        if (a >= naxes) {
            tq[a] = ty[a] = tatt[a] = b;
            continue;
        }
        xmp_sbp_t s = sq[a];
        if (s.kind == XMP_S && (s.dim == 2 || s.dim == 4)) {
            xmp_rule_msg(err, n, "attention", "qkv", sq, naxes, a, "%s",
                         s.dim == 2
                             ? "S(2) splits the q/k/v index dim: no rule (a rank needs q, k "
                               "and v of its heads; split batch S(0), sequence S(1) or heads "
                               "S(3))"
                             : "S(4) splits the head dim hs: no rule (a score needs the whole "
                               "head; split batch S(0), sequence S(1) or heads S(3))");
            return -1;
        }
        tq[a] = s.kind == XMP_P ? b : s;
        if (tq[a].kind != XMP_S) {
            ty[a] = tatt[a] = b;
        } else {
            static const int ydim[5] = {0, 1, -1, 2, -1}, adim[5] = {0, 2, -1, 1, -1};
            ty[a] = xmp_sbp_s(ydim[s.dim]);
            tatt[a] = xmp_sbp_s(adim[s.dim]);
        }
    }
    return 0;
}

/* ------------------------------------------------------------ caches */

void xmp_norm_cache_free(xmp_norm_cache_t *c)
{
    if (!c)
        return;
    xmp_tensor_free(&c->mean);
    xmp_tensor_free(&c->rstd);
    memset(c, 0, sizeof *c);
}

void xmp_attn_cache_free(xmp_attn_cache_t *c)
{
    if (!c)
        return;
    xmp_tensor_free(&c->att);
    memset(c, 0, sizeof *c);
}

/* --------------------------------------------------------- layer norm */

static xmesh_result_t ln_check(const char *op, const xmp_tensor_t *x, const xmp_tensor_t *w,
                               const xmp_tensor_t *b)
{
    xmesh_result_t r;
    if ((r = xmp_check_f32(x, op, "x")) || (r = xmp_check_f32(w, op, "w")) ||
        (b && (r = xmp_check_f32(b, op, "b"))))
        return r;
    if ((r = same_mesh(x, w, op, "x", "w")) || (b && (r = same_mesh(x, b, op, "x", "b"))))
        return r;
    if (x->ndim < 1)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: x '%s' has 0 dims (needs rows..., C)", op,
                       x->spec);
    int64_t C = x->shape[x->ndim - 1];
    if (w->ndim != 1 || w->shape[0] != C)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                       "%s: w has %d dims (size %lld), expected 1 dim of size C = %lld", op,
                       w->ndim, (long long)(w->ndim ? w->shape[0] : 0), (long long)C);
    if (b && (b->ndim != 1 || b->shape[0] != C))
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                       "%s: b has %d dims (size %lld), expected 1 dim of size C = %lld", op,
                       b->ndim, (long long)(b->ndim ? b->shape[0] : 0), (long long)C);
    return XMESH_SUCCESS;
}

static xmesh_result_t ln_rules(const char *op, const xmp_tensor_t *x, xmp_sbp_t *tx, xmp_sbp_t *tw,
                               xmp_sbp_t *ty, xmp_sbp_t *ts)
{
    char msg[400];
    if (xmp_rule_layernorm(x->mesh->ndim, x->ndim, x->sbp, tx, tw, ty, ts, msg, sizeof msg))
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: %s", op, msg);
    return XMESH_SUCCESS;
}

/* Sums buf over every mesh axis that splits the channel dim (members only). */
static xmesh_result_t sum_channel_axes(const xmp_mesh_t *m, const xmp_sbp_t *tx, int nd, float *buf,
                                       int64_t n, const char *op)
{
    for (int a = 0; a < m->ndim && m->member; a++)
        if (tx[a].kind == XMP_S && tx[a].dim == nd - 1) {
            xmesh_result_t r = xmp_allreduce(buf, (int)n, MPI_FLOAT, MPI_SUM, m->axis[a], op);
            if (r)
                return r;
        }
    return XMESH_SUCCESS;
}

static int has_channel_split(const xmp_mesh_t *m, const xmp_sbp_t *tx, int nd)
{
    for (int a = 0; a < m->ndim; a++)
        if (tx[a].kind == XMP_S && tx[a].dim == nd - 1)
            return 1;
    return 0;
}

xmesh_result_t xmp_layernorm_forward(const xmp_tensor_t *x, const xmp_tensor_t *w,
                                     const xmp_tensor_t *b, xmp_tensor_t *y,
                                     xmp_norm_cache_t *cache)
{
    const char *op = "xmp_layernorm_forward";
    xmp_sbp_t tx[NAX], tw[NAX], ty[NAX], ts[NAX];
    xmp_tensor_t xb, wb, bb, yo, mean, rstd;
    float *sums = NULL;
    xmesh_result_t r;
    if ((r = ln_check(op, x, w, b)))
        return r;
    if (!b || !y || !cache)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: %s is NULL", op,
                       !b   ? "b"
                       : !y ? "y"
                            : "cache");
    if ((r = ln_rules(op, x, tx, tw, ty, ts)))
        return r;
    const xmp_mesh_t *m = x->mesh;
    int nd = x->ndim;
    int64_t C = x->shape[nd - 1];
    if ((r = xmp_box(x, tx, &xb)))
        return r;
    if ((r = xmp_box(w, tw, &wb)))
        goto out_free_x;
    if ((r = xmp_box(b, tw, &bb)))
        goto out_free_w;
    if ((r = xmp_tensor_alloc(&yo, x->mesh, nd, x->shape, XMESH_F32, ty)))
        goto out_free_b;
    if ((r = xmp_tensor_alloc(&mean, x->mesh, nd - 1, x->shape, XMESH_F32, ts)))
        goto out_free_y;
    if ((r = xmp_tensor_alloc(&rstd, x->mesh, nd - 1, x->shape, XMESH_F32, ts)))
        goto out_free_mean;
    int64_t N = xmp_prod(xb.lshape, 0, nd - 1), Cl = xb.lshape[nd - 1];
    const float *X = xmp_f32(&xb), *W = xmp_f32(&wb), *Bi = xmp_f32(&bb);
    float *Y = xmp_f32(&yo), *M = xmp_f32(&mean), *S = xmp_f32(&rstd);
    if (!has_channel_split(m, tx, nd)) {
        if (m->member)
            xmp_layernorm_fwd(Y, M, S, X, W, Bi, (size_t)N, (int)Cl);
    } else {
        /* channel split: two all-reduced passes (mean, then the biased variance) as the
         * serial kernel computes them, so the result does not lose digits to
         * E[x^2] - E[x]^2 */
        sums = calloc((size_t)(N ? N : 1), sizeof(float));
        if (!sums) {
            r = xmp_err(XMESH_ERR_NO_MEMORY, "%s: out of memory", op);
            goto out_free_rstd;
        }
        for (int64_t i = 0; i < N; i++) {
            float s = 0.0f;
            for (int64_t c = 0; c < Cl; c++)
                s += X[i * Cl + c];
            sums[i] = s;
        }
        if ((r = sum_channel_axes(m, tx, nd, sums, N, op)))
            goto out_free_rstd;
        for (int64_t i = 0; i < N; i++) {
            M[i] = sums[i] / (float)C;
            float s = 0.0f;
            for (int64_t c = 0; c < Cl; c++) {
                float d = X[i * Cl + c] - M[i];
                s += d * d;
            }
            sums[i] = s;
        }
        if ((r = sum_channel_axes(m, tx, nd, sums, N, op)))
            goto out_free_rstd;
        for (int64_t i = 0; i < N; i++) {
            S[i] = 1.0f / sqrtf(sums[i] / (float)C + LN_EPS);
            for (int64_t c = 0; c < Cl; c++)
                Y[i * Cl + c] = (X[i * Cl + c] - M[i]) * S[i] * W[c] + Bi[c];
        }
    }
    *y = yo;
    cache->mean = mean;
    cache->rstd = rstd;
    goto out_free_b;
out_free_rstd:
    xmp_tensor_free(&rstd);
out_free_mean:
    xmp_tensor_free(&mean);
out_free_y:
    xmp_tensor_free(&yo);
out_free_b:
    free(sums);
    xmp_tensor_free(&bb);
out_free_w:
    xmp_tensor_free(&wb);
out_free_x:
    xmp_tensor_free(&xb);
    return r;
}

static int same_geometry(const xmp_tensor_t *t, const xmp_mesh_t *m, int nd, const int64_t *shape,
                         const xmp_sbp_t *sbp)
{
    if (t->mesh != m || t->ndim != nd || t->dtype != XMESH_F32)
        return 0;
    for (int d = 0; d < nd; d++)
        if (t->shape[d] != shape[d])
            return 0;
    if (!xmp_tensor_sbp_is(t, sbp))
        return 0;
    return !m->member || t->data;
}

xmesh_result_t xmp_layernorm_backward(const xmp_tensor_t *dy, const xmp_tensor_t *x,
                                      const xmp_tensor_t *w, const xmp_norm_cache_t *cache,
                                      xmp_tensor_t *dx, xmp_tensor_t *dw, xmp_tensor_t *db)
{
    const char *op = "xmp_layernorm_backward";
    xmp_sbp_t tx[NAX], tw[NAX], ty[NAX], ts[NAX], tg[NAX];
    xmp_tensor_t xb, wb, gb, dxo, dwo, dbo;
    float *sums = NULL;
    xmesh_result_t r;
    if ((r = ln_check(op, x, w, NULL)) || (r = xmp_check_f32(dy, op, "dy")) ||
        (r = same_mesh(x, dy, op, "x", "dy")))
        return r;
    if (!cache || !dx || !dw || !db)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: %s is NULL", op,
                       !cache ? "cache"
                       : !dx  ? "dx"
                       : !dw  ? "dw"
                              : "db");
    if (dy->ndim != x->ndim || memcmp(dy->shape, x->shape, sizeof(int64_t) * (size_t)x->ndim))
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: dy '%s' and x '%s' differ in shape", op,
                       dy->spec, x->spec);
    if ((r = ln_rules(op, x, tx, tw, ty, ts)))
        return r;
    const xmp_mesh_t *m = x->mesh;
    int nd = x->ndim;
    int64_t C = x->shape[nd - 1];
    if (!same_geometry(&cache->mean, m, nd - 1, x->shape, ts) ||
        !same_geometry(&cache->rstd, m, nd - 1, x->shape, ts))
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                       "%s: cache (mean '%s') is not the forward cache of x '%s'", op,
                       cache->mean.spec, x->spec);
    /* dw, db: SBP of w as used, P over axes that split the rows */
    for (int a = 0; a < NAX; a++)
        tg[a] = a < m->ndim && tx[a].kind == XMP_S && tx[a].dim < nd - 1 ? xmp_sbp_p() : tw[a];
    if ((r = xmp_box(x, tx, &xb)))
        return r;
    if ((r = xmp_box(w, tw, &wb)))
        goto out_free_x;
    if ((r = xmp_box(dy, ty, &gb)))
        goto out_free_w;
    if ((r = xmp_tensor_alloc(&dxo, x->mesh, nd, x->shape, XMESH_F32, ty)))
        goto out_free_g;
    if ((r = xmp_tensor_alloc(&dwo, x->mesh, 1, w->shape, XMESH_F32, tg)))
        goto out_free_dx;
    if ((r = xmp_tensor_alloc(&dbo, x->mesh, 1, w->shape, XMESH_F32, tg)))
        goto out_free_dw;
    int64_t N = xmp_prod(xb.lshape, 0, nd - 1), Cl = xb.lshape[nd - 1];
    const float *X = xmp_f32(&xb), *W = xmp_f32(&wb), *G = xmp_f32(&gb);
    const float *M = xmp_f32(&cache->mean), *S = xmp_f32(&cache->rstd);
    float *DX = xmp_f32(&dxo), *DW = xmp_f32(&dwo), *DB = xmp_f32(&dbo);
    if (!has_channel_split(m, tx, nd)) {
        if (m->member)
            xmp_layernorm_bwd(DX, DW, DB, G, X, W, M, S, (size_t)N, (int)Cl);
    } else {
        sums = calloc((size_t)(2 * N + 1), sizeof(float));
        if (!sums) {
            r = xmp_err(XMESH_ERR_NO_MEMORY, "%s: out of memory", op);
            goto out_free_db;
        }
        for (int64_t i = 0; i < N; i++) {
            float sd = 0.0f, sdx = 0.0f;
            for (int64_t c = 0; c < Cl; c++) {
                float xhat = (X[i * Cl + c] - M[i]) * S[i], g = G[i * Cl + c];
                float dxhat = W[c] * g;
                DB[c] += g;
                DW[c] += xhat * g;
                sd += dxhat;
                sdx += dxhat * xhat;
            }
            sums[2 * i] = sd;
            sums[2 * i + 1] = sdx;
        }
        if ((r = sum_channel_axes(m, tx, nd, sums, 2 * N, op)))
            goto out_free_db;
        for (int64_t i = 0; i < N; i++) {
            float md = sums[2 * i] / (float)C, mdx = sums[2 * i + 1] / (float)C;
            for (int64_t c = 0; c < Cl; c++) {
                float xhat = (X[i * Cl + c] - M[i]) * S[i];
                float dxhat = W[c] * G[i * Cl + c];
                DX[i * Cl + c] = (dxhat - md - xhat * mdx) * S[i];
            }
        }
    }
    *dx = dxo;
    *dw = dwo;
    *db = dbo;
    goto out_free_g;
out_free_db:
    xmp_tensor_free(&dbo);
out_free_dw:
    xmp_tensor_free(&dwo);
out_free_dx:
    xmp_tensor_free(&dxo);
out_free_g:
    free(sums);
    xmp_tensor_free(&gb);
out_free_w:
    xmp_tensor_free(&wb);
out_free_x:
    xmp_tensor_free(&xb);
    return r;
}

/* ---------------------------------------------------------- attention */

/* Geometry of one local attention call: Bl batches, Tl query positions starting at global
 * position t0, NH local heads of hs; keys and values at global positions [0, T) (after the
 * sequence all-gather) in kv rows of kstride floats, k at koff and v at voff. */
typedef struct {
    int Bl, Tl, NH, hs, T, t0;
    size_t qstride, kstride, koff, voff;
} attn_geo_t;

/* The serial kernel's loops (nn/kernels.c, xmp_attention_fwd) over global query positions. */
static void attn_fwd_local(const attn_geo_t *g, float *out, float *att, const float *q,
                           const float *kv)
{
    const size_t C = (size_t)g->NH * g->hs;
    const int hs = g->hs, T = g->T;
    const float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < g->Bl; b++)
        for (int t = 0; t < g->Tl; t++)
            for (int h = 0; h < g->NH; h++) {
                int tg = g->t0 + t;
                const float *qp = q + ((size_t)b * g->Tl + t) * g->qstride + (size_t)h * hs;
                float *a = att + (((size_t)b * g->NH + h) * g->Tl + t) * T;
                float maxv = -INFINITY;
                for (int t2 = 0; t2 <= tg; t2++) {
                    const float *k =
                        kv + ((size_t)b * T + t2) * g->kstride + g->koff + (size_t)h * hs;
                    float dot = 0.0f;
                    for (int i = 0; i < hs; i++)
                        dot += qp[i] * k[i];
                    dot *= scale;
                    a[t2] = dot;
                    if (dot > maxv)
                        maxv = dot;
                }
                float sum = 0.0f;
                for (int t2 = 0; t2 <= tg; t2++) {
                    a[t2] = expf(a[t2] - maxv);
                    sum += a[t2];
                }
                float inv = 1.0f / sum;
                for (int t2 = 0; t2 <= tg; t2++)
                    a[t2] *= inv;
                for (int t2 = tg + 1; t2 < T; t2++)
                    a[t2] = 0.0f;
                float *o = out + ((size_t)b * g->Tl + t) * C + (size_t)h * hs;
                memset(o, 0, (size_t)hs * sizeof(float));
                for (int t2 = 0; t2 <= tg; t2++) {
                    const float *v =
                        kv + ((size_t)b * T + t2) * g->kstride + g->voff + (size_t)h * hs;
                    float wgt = a[t2];
                    for (int i = 0; i < hs; i++)
                        o[i] += wgt * v[i];
                }
            }
}

/* The serial backward (xmp_attention_bwd) over global positions: dq rows like q, dk and dv
 * rows like k and v in dkv (accumulated; partial sums when the sequence is split). */
static void attn_bwd_local(const attn_geo_t *g, float *dq, float *dkv, const float *dout,
                           const float *q, const float *kv, const float *att, float *datt)
{
    const size_t C = (size_t)g->NH * g->hs;
    const int hs = g->hs, T = g->T;
    const float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < g->Bl; b++)
        for (int t = 0; t < g->Tl; t++)
            for (int h = 0; h < g->NH; h++) {
                int tg = g->t0 + t;
                const float *a = att + (((size_t)b * g->NH + h) * g->Tl + t) * T;
                const float *gr = dout + ((size_t)b * g->Tl + t) * C + (size_t)h * hs;
                size_t qo = ((size_t)b * g->Tl + t) * g->qstride + (size_t)h * hs;
                const float *qp = q + qo;
                float *dqp = dq + qo;
                float dot_ad = 0.0f;
                for (int t2 = 0; t2 <= tg; t2++) {
                    size_t off = ((size_t)b * T + t2) * g->kstride + g->voff + (size_t)h * hs;
                    const float *v = kv + off;
                    float *dv = dkv + off;
                    float d = 0.0f;
                    for (int i = 0; i < hs; i++) {
                        d += v[i] * gr[i];
                        dv[i] += a[t2] * gr[i];
                    }
                    datt[t2] = d;
                    dot_ad += a[t2] * d;
                }
                for (int t2 = 0; t2 <= tg; t2++) {
                    float dpre = a[t2] * (datt[t2] - dot_ad) * scale;
                    size_t off = ((size_t)b * T + t2) * g->kstride + g->koff + (size_t)h * hs;
                    const float *k = kv + off;
                    float *dk = dkv + off;
                    for (int i = 0; i < hs; i++) {
                        dqp[i] += k[i] * dpre;
                        dk[i] += qp[i] * dpre;
                    }
                }
            }
}

static xmesh_result_t attn_check(const char *op, const xmp_tensor_t *qkv, xmp_sbp_t *tq,
                                 xmp_sbp_t *ty, xmp_sbp_t *ta)
{
    xmesh_result_t r = xmp_check_f32(qkv, op, "qkv");
    char msg[400];
    if (r)
        return r;
    if (xmp_rule_attention(qkv->mesh->ndim, qkv->ndim, qkv->sbp, tq, ty, ta, msg, sizeof msg))
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: %s", op, msg);
    if (qkv->shape[2] != 3)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                       "%s: qkv '%s' dim 2 has size %lld, expected 3 (q, k, v)", op, qkv->spec,
                       (long long)qkv->shape[2]);
    if (qkv->shape[1] > (1 << 20) || qkv->shape[4] < 1)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: qkv '%s': T = %lld or hs = %lld", op,
                       qkv->spec, (long long)qkv->shape[1], (long long)qkv->shape[4]);
    return XMESH_SUCCESS;
}

static int seq_split(const xmp_mesh_t *m, const xmp_sbp_t *tq)
{
    for (int a = 0; a < m->ndim; a++)
        if (tq[a].kind == XMP_S && tq[a].dim == 1)
            return 1;
    return 0;
}

/* kv: the k and v slots of the used qkv (SBP tq), all-gathered over the axes that split the
 * sequence: shape (B, T, 2, NH, hs), local (Bl, T, 2, NHl, hs). */
static xmesh_result_t gather_kv(const xmp_tensor_t *q, xmp_tensor_t *kv)
{
    int64_t s[5] = {q->shape[0], q->shape[1], 2, q->shape[3], q->shape[4]};
    xmp_sbp_t tk[NAX];
    xmp_tensor_t loc;
    xmesh_result_t r = xmp_tensor_alloc(&loc, q->mesh, 5, s, XMESH_F32, q->sbp);
    if (r)
        return r;
    int64_t rows = loc.lshape[0] * loc.lshape[1], C = loc.lshape[3] * loc.lshape[4];
    for (int64_t i = 0; i < rows && q->mesh->member; i++)
        memcpy(xmp_f32(&loc) + i * 2 * C, xmp_f32(q) + i * 3 * C + C, sizeof(float) * 2 * C);
    for (int a = 0; a < NAX; a++)
        tk[a] = q->sbp[a].kind == XMP_S && q->sbp[a].dim == 1 ? xmp_sbp_b() : q->sbp[a];
    r = xmp_box(&loc, tk, kv);
    xmp_tensor_free(&loc);
    return r;
}

static void attn_geo(const xmp_tensor_t *q, int seq, attn_geo_t *g)
{
    g->Bl = (int)q->lshape[0];
    g->Tl = (int)q->lshape[1];
    g->NH = (int)q->lshape[3];
    g->hs = (int)q->shape[4];
    g->T = (int)q->shape[1];
    g->t0 = (int)q->loff[1];
    size_t C = (size_t)g->NH * g->hs;
    g->qstride = 3 * C;
    g->kstride = seq ? 2 * C : 3 * C;
    g->koff = seq ? 0 : C;
    g->voff = seq ? C : 2 * C;
}

xmesh_result_t xmp_attention_forward(const xmp_tensor_t *qkv, xmp_tensor_t *y,
                                     xmp_attn_cache_t *cache)
{
    const char *op = "xmp_attention_forward";
    xmp_sbp_t tq[NAX], ty[NAX], ta[NAX];
    xmp_tensor_t q, kv, yo, att;
    xmesh_result_t r;
    if ((r = attn_check(op, qkv, tq, ty, ta)))
        return r;
    if (!y || !cache)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: %s is NULL", op, !y ? "y" : "cache");
    int seq = seq_split(qkv->mesh, tq);
    int64_t ys[4] = {qkv->shape[0], qkv->shape[1], qkv->shape[3], qkv->shape[4]};
    int64_t as[4] = {qkv->shape[0], qkv->shape[3], qkv->shape[1], qkv->shape[1]};
    memset(&kv, 0, sizeof kv);
    if ((r = xmp_box(qkv, tq, &q)))
        return r;
    if (seq && (r = gather_kv(&q, &kv)))
        goto out_free_q;
    if ((r = xmp_tensor_alloc(&yo, qkv->mesh, 4, ys, XMESH_F32, ty)))
        goto out_free_kv;
    if ((r = xmp_tensor_alloc(&att, qkv->mesh, 4, as, XMESH_F32, ta))) {
        xmp_tensor_free(&yo);
        goto out_free_kv;
    }
    attn_geo_t g;
    attn_geo(&q, seq, &g);
    if (qkv->mesh->member)
        attn_fwd_local(&g, xmp_f32(&yo), xmp_f32(&att), xmp_f32(&q),
                       seq ? xmp_f32(&kv) : xmp_f32(&q));
    *y = yo;
    cache->att = att;
    cache->priv = NULL;
out_free_kv:
    xmp_tensor_free(&kv);
out_free_q:
    xmp_tensor_free(&q);
    return r;
}

xmesh_result_t xmp_attention_backward(const xmp_tensor_t *dy, const xmp_tensor_t *qkv,
                                      const xmp_attn_cache_t *cache, xmp_tensor_t *dqkv)
{
    const char *op = "xmp_attention_backward";
    xmp_sbp_t tq[NAX], ty[NAX], ta[NAX], tp[NAX];
    xmp_tensor_t q, kv, gy, dq, dkv, dkvs;
    float *work = NULL;
    xmesh_result_t r;
    if ((r = attn_check(op, qkv, tq, ty, ta)) || (r = xmp_check_f32(dy, op, "dy")) ||
        (r = same_mesh(qkv, dy, op, "qkv", "dy")))
        return r;
    if (!cache || !dqkv)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: %s is NULL", op, !cache ? "cache" : "dqkv");
    int64_t ys[4] = {qkv->shape[0], qkv->shape[1], qkv->shape[3], qkv->shape[4]};
    int64_t as[4] = {qkv->shape[0], qkv->shape[3], qkv->shape[1], qkv->shape[1]};
    if (dy->ndim != 4 || memcmp(dy->shape, ys, sizeof ys))
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                       "%s: dy '%s' has %d dims, expected (B, T, NH, hs) of qkv '%s'", op, dy->spec,
                       dy->ndim, qkv->spec);
    if (!same_geometry(&cache->att, qkv->mesh, 4, as, ta))
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                       "%s: cache (att '%s') is not the forward cache of qkv '%s'", op,
                       cache->att.spec, qkv->spec);
    int seq = seq_split(qkv->mesh, tq);
    int64_t ks[5] = {qkv->shape[0], qkv->shape[1], 2, qkv->shape[3], qkv->shape[4]};
    memset(&kv, 0, sizeof kv);
    memset(&dkv, 0, sizeof dkv);
    memset(&dkvs, 0, sizeof dkvs);
    if ((r = xmp_box(qkv, tq, &q)))
        return r;
    if ((r = xmp_box(dy, ty, &gy)))
        goto out_free_q;
    if (seq) {
        for (int a = 0; a < NAX; a++)
            tp[a] = tq[a].kind == XMP_S && tq[a].dim == 1 ? xmp_sbp_p() : tq[a];
        if ((r = gather_kv(&q, &kv)) ||
            (r = xmp_tensor_alloc(&dkv, qkv->mesh, 5, ks, XMESH_F32, tp)))
            goto out_free_kv;
    }
    if ((r = xmp_tensor_alloc(&dq, qkv->mesh, 5, qkv->shape, XMESH_F32, tq)))
        goto out_free_kv;
    attn_geo_t g;
    attn_geo(&q, seq, &g);
    work = calloc((size_t)g.T + 1, sizeof(float));
    if (!work) {
        r = xmp_err(XMESH_ERR_NO_MEMORY, "%s: out of memory", op);
        goto out_free_dq;
    }
    if (qkv->mesh->member)
        attn_bwd_local(&g, xmp_f32(&dq), seq ? xmp_f32(&dkv) : xmp_f32(&dq), xmp_f32(&gy),
                       xmp_f32(&q), seq ? xmp_f32(&kv) : xmp_f32(&q), xmp_f32(&cache->att), work);
    if (seq) {
        /* partial dK, dV of every key position: reduce-scatter back to the query split */
        if ((r = xmp_box(&dkv, tq, &dkvs)))
            goto out_free_dq;
        int64_t rows = dkvs.lshape[0] * dkvs.lshape[1], C = dkvs.lshape[3] * dkvs.lshape[4];
        for (int64_t i = 0; i < rows && qkv->mesh->member; i++)
            memcpy(xmp_f32(&dq) + i * 3 * C + C, xmp_f32(&dkvs) + i * 2 * C, sizeof(float) * 2 * C);
    }
    *dqkv = dq;
    goto out_free_kv;
out_free_dq:
    xmp_tensor_free(&dq);
out_free_kv:
    free(work);
    xmp_tensor_free(&dkvs);
    xmp_tensor_free(&dkv);
    xmp_tensor_free(&kv);
    xmp_tensor_free(&gy);
out_free_q:
    xmp_tensor_free(&q);
    return r;
}

/* ---------------------------------------------------- pure deduction */

static int ded_fail(char *err, size_t n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int ded_fail(char *err, size_t n, const char *fmt, ...)
{
    char buf[400];
    va_list ap;
    va_start(ap, fmt);
    xmp_verr_buf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s", buf); /* both forms of the convention */
    return xmp_err_buf(err, n, "%s", buf);
}

int xmp_sbp_deduce(const char *op, int naxes, int nin, const int *in_ndim,
                   const xmp_sbp_t *const *in_sbp, xmp_sbp_t *out_sbp, char *err, size_t errlen)
{
    static const struct {
        const char *name;
        int min_in, max_in;
    } ops[] = {{"linear", 2, 3},       {"add", 2, 2},       {"gelu", 1, 1},
               {"layernorm", 1, 3},    {"attention", 1, 1}, {"embedding", 2, 2},
               {"cross_entropy", 1, 2}};
    char msg[400] = "";
    xmp_sbp_t t0[NAX], t1[NAX], t2[NAX], out[NAX];
    int k = -1, rc = -1;
    for (size_t i = 0; op && i < sizeof ops / sizeof ops[0]; i++)
        if (!strcmp(op, ops[i].name))
            k = (int)i;
    if (k < 0)
        return ded_fail(err, errlen,
                        "xmp_sbp_deduce: op '%s' has no rules (known: linear, add, gelu, "
                        "layernorm, attention, embedding, cross_entropy)",
                        op ? op : "(null)");
    if (naxes < 1 || naxes > NAX)
        return ded_fail(err, errlen, "%s: mesh of %d axes: no rule (1 to 4 axes)", op, naxes);
    if (nin < ops[k].min_in || nin > ops[k].max_in || !in_ndim || !in_sbp || !out_sbp)
        return ded_fail(err, errlen, "%s: %d operands given (or a NULL array): no rule", op, nin);
    for (int i = 0; i < nin; i++)
        if (!in_sbp[i] || in_ndim[i] < 0 || in_ndim[i] > XMP_MAX_DIMS)
            return ded_fail(err, errlen, "%s: operand %d has no SBP or a bad dim count", op, i);
    const int *nd = in_ndim;
    const xmp_sbp_t *const *s = in_sbp;
    switch (k) {
    case 0: /* linear: x, w[, b] */
        rc = xmp_rule_linear(naxes, nd[0], s[0], nd[1], s[1], t0, t1, out, t2, msg, sizeof msg);
        if (!rc && nin == 3) {
            if (nd[2] != nd[1] - 1) {
                snprintf(msg, sizeof msg,
                         "linear: operand b has %d dims, w %d: no rule (b has w's out dims)", nd[2],
                         nd[1]);
                rc = -1;
            } else {
                rc = xmp_rule_operand("linear", "b", naxes, nd[2], s[2], msg, sizeof msg);
            }
        }
        break;
    case 1:
        if (nd[0] != nd[1]) {
            snprintf(msg, sizeof msg, "add: operands x (%d dims) and y (%d dims): no rule", nd[0],
                     nd[1]);
            break;
        }
        rc = xmp_rule_add(naxes, nd[0], s[0], s[1], out, msg, sizeof msg);
        break;
    case 2:
        rc = xmp_rule_gelu(naxes, nd[0], s[0], out, msg, sizeof msg);
        break;
    case 3: /* layernorm: x[, w, b]: w and b are boxed to what x needs, any SBP */
        rc = xmp_rule_layernorm(naxes, nd[0], s[0], t0, t1, out, t2, msg, sizeof msg);
        for (int i = 1; !rc && i < nin; i++) {
            const char *nm = i == 1 ? "w" : "b";
            if (nd[i] != 1) {
                snprintf(msg, sizeof msg, "layernorm: operand %s has %d dims: no rule (1 dim, C)",
                         nm, nd[i]);
                rc = -1;
            } else {
                rc = xmp_rule_operand("layernorm", nm, naxes, 1, s[i], msg, sizeof msg);
            }
        }
        break;
    case 4:
        rc = xmp_rule_attention(naxes, nd[0], s[0], t0, out, t1, msg, sizeof msg);
        break;
    case 5:
        rc = xmp_rule_embedding(naxes, nd[0], s[0], nd[1], s[1], t0, t1, out, msg, sizeof msg);
        break;
    default:
        if (nin == 2 && nd[1] != nd[0] - 1) {
            snprintf(msg, sizeof msg,
                     "cross_entropy: operand targets has %d dims, logits %d: no rule (targets "
                     "are the rows of logits)",
                     nd[1], nd[0]);
            break;
        }
        rc = xmp_rule_cross_entropy(naxes, nd[0], s[0], nin == 2 ? s[1] : NULL, out, t0, msg,
                                    sizeof msg);
        break;
    }
    if (rc) {
        if (err && errlen)
            snprintf(err, errlen, "%s", msg);
        xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s", msg);
        return -1;
    }
    memcpy(out_sbp, out, sizeof(xmp_sbp_t) * (size_t)naxes);
    return 0;
}
