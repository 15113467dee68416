/* GPT-2 pipeline stages: a step's work on one stage. Activations kept per microbatch,
 * the transformer block's forward and backward (input and queued weight gradients),
 * recomputation, and the driver's callbacks (forward, backward, reduction with the tied
 * wte exchange, optimizer) with the stage's memory accounting (gpt2_par.h). */
#include "models/gpt2_par.h"
#include "models/gpt2_par_priv.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/gpt2_graph.h"
#include "nn/kernels.h"
#include "nn/overlap.h"
#include "nn/param.h"
#include "nn/sbp_layers.h"
#include "nn/sbp_ops.h"
#include "util/xmp_err.h"

/* ------------------------------------------------------------ activations */

static void blk_free(blk_t *b)
{
    xmp_tensor_t *t[] = {&b->ln1, &b->qkv, &b->att, &b->res1, &b->ln2, &b->fch, &b->fcg, &b->res2};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        xmp_tensor_free(t[i]);
    xmp_norm_cache_free(&b->c1);
    xmp_norm_cache_free(&b->c2);
    xmp_attn_cache_free(&b->ac);
    memset(b, 0, sizeof *b);
}

void xmp_gpt2__mb_free(xmp_gpt2_stage_t *st, mb_t *m)
{
    for (int k = 0; k < st->nl; k++)
        blk_free(&m->b[k]);
    for (int i = 0; i < m->nwq; i++)
        xmp_tensor_free(&m->wq[i].dy);
    m->nwq = 0;
    xmp_tensor_free(&m->tok);
    xmp_tensor_free(&m->x0);
    xmp_tensor_free(&m->lnf);
    xmp_tensor_free(&m->dlogits);
    xmp_norm_cache_free(&m->cf);
    m->live = 0;
    m->bytes = 0;
}

int64_t xmp_gpt2__tbytes(const xmp_tensor_t *t)
{
    return t->lcount * 4;
}

static int queue_w(mb_t *m, xmp_tensor_t *dy, const xmp_tensor_t *x, int pw, int pb)
{
    if (m->nwq == m->capwq) {
        int nc = m->capwq ? 2 * m->capwq : 16;
        wq_t *n = realloc(m->wq, sizeof *n * (size_t)nc);
        if (!n)
            return -1;
        m->wq = n;
        m->capwq = nc;
    }
    wq_t *q = &m->wq[m->nwq++];
    q->dy = *dy; /* takes ownership */
    memset(dy, 0, sizeof *dy);
    q->x = x;
    q->pw = pw;
    q->pb = pb;
    return 0;
}

/* Boxes t in place to its class SBP want, remembering the SBP it had. */
static int to_class(xmp_tensor_t *t, const xmp_sbp_t *want, xmp_sbp_t *was)
{
    if (was)
        memcpy(was, t->sbp, sizeof t->sbp);
    return xmp_box_inplace(t, want) ? -1 : 0;
}

/* Backward of to_class: the gradient d (any SBP) boxed in place to the
 * gradient SBP of the pre-boxing SBP was. */
static int from_class(const xmp_gpt2_stage_t *st, xmp_tensor_t *d, const xmp_sbp_t *was)
{
    xmp_sbp_t g[NAX];
    for (int a = 0; a < NAX; a++)
        g[a] = a < st->nax ? xmp_sbp_grad(was[a]) : xmp_sbp_b();
    return xmp_box_inplace(d, g) ? -1 : 0;
}

/* d += s elementwise; s is boxed to d's SBP first (consumed). */
static int add_into(xmp_tensor_t *d, xmp_tensor_t *s)
{
    int rc = xmp_box_inplace(s, d->sbp) || s->lcount != d->lcount;
    if (!rc) {
        float *a = xmp_f32(d), *b = xmp_f32(s);
        for (int64_t i = 0; i < d->lcount; i++)
            a[i] += b[i];
    }
    xmp_tensor_free(s);
    return rc ? -1 : 0;
}

/* Parameter gradient accumulation: d boxed to the accumulator's SBP (no
 * collective for P or S contributions), added (d consumed). */
static int accumulate(par_t *q, xmp_tensor_t *d)
{
    return add_into(&q->P.g, d);
}

/* One linear of the block, backward: dx = dy w, boxed to `to` (NULL: left as produced), and
 * the weight part dW += dy^T x (db += sum dy): queued for the W slot, or with the bwd-input
 * overlap switch computed here while the boxing of dx (the input-gradient reduction) is in
 * flight (AxoNN, paper 001 IV). dy is consumed. Same collectives and sums either way. */
static int lin_bwd(xmp_gpt2_stage_t *st, mb_t *m, xmp_tensor_t *dy, int id, int bid, int layer,
                   const xmp_tensor_t *x, const xmp_sbp_t *to, xmp_tensor_t *dx)
{
    int pw = xmp_gpt2__pindex(st, id, layer), pb = xmp_gpt2__pindex(st, bid, layer);
    if (xmp_linear_backward_input(dy, xmp_gpt2__PT(st, id, layer), dx))
        return -1;
    if (!st->ov.bwd_input || !to) {
        if (queue_w(m, dy, x, pw, pb))
            return -1;
        return to && xmp_box_inplace(dx, to) ? -1 : 0;
    }
    xmp_box_req_t *req;
    xmp_tensor_t dw = {0}, db = {0};
    if (xmp_box_start(dx, to, &req))
        return -1;
    xmp_tensor_free(dx);
    int rc = xmp_linear_backward_weight(dy, x, &dw, pb >= 0 ? &db : NULL) ? -1 : 0;
    if (!rc)
        rc = accumulate(&st->p[pw], &dw);
    if (!rc && pb >= 0)
        rc = accumulate(&st->p[pb], &db);
    xmp_tensor_free(&dw);
    xmp_tensor_free(&db);
    xmp_tensor_free(dy);
    if (xmp_box_wait(req, dx)) /* waited even after an error: the collective order holds */
        return -1;
    return rc;
}

/* The SBP layer norm boxes its dy to (so dx of the linear before it can be boxed there early). */
static const xmp_sbp_t *ln_dy_sbp(const xmp_gpt2_stage_t *st, const xmp_tensor_t *x, xmp_sbp_t *ty)
{
    xmp_sbp_t tx[NAX], tw[NAX], ts[NAX];
    char msg[400];
    if (!st->ov.bwd_input ||
        xmp_rule_layernorm(x->mesh->ndim, x->ndim, x->sbp, tx, tw, ty, ts, msg, sizeof msg))
        return NULL; /* off, or refused (layernorm_backward will say why) */
    return ty;
}

/* (Bm, T, NH, hs) <-> (Bm, T, C) views of the attention output: the same
 * local data when the heads are split evenly (checked by the strategy check). */
static void view_heads(xmp_tensor_t *t, int to4, int64_t NH, int64_t hs)
{
    if (to4) {
        t->ndim = 4;
        t->shape[2] = NH, t->shape[3] = hs;
        t->lshape[2] = t->lshape[2] / hs, t->lshape[3] = hs;
        t->loff[2] = t->loff[2] / hs, t->loff[3] = 0;
    } else {
        t->ndim = 3;
        t->shape[2] = NH * hs;
        t->lshape[2] *= hs;
        t->loff[2] *= hs;
    }
    xmp_sbp_string(t->sbp, t->mesh->ndim, t->spec, sizeof t->spec);
}

#define CHK(x)                                                                                     \
    do {                                                                                           \
        if (x)                                                                                     \
            goto fail;                                                                             \
    } while (0)

/* ------------------------------------------------------------- the block */

static int block_forward(xmp_gpt2_stage_t *st, int layer, const xmp_tensor_t *x, blk_t *b)
{
    const xmp_gpt2_config_t *c = &st->cfg;
    int64_t NH = c->num_heads, hs = c->channels / c->num_heads;
    xmp_tensor_t y = {0}, y4 = {0};
    /* attention: res1 = x + attproj(attn(qkv(ln1(x)))) */
    CHK(xmp_layernorm_forward(x, xmp_gpt2__PT(st, XMP_GPT2_LN1W, layer),
                              xmp_gpt2__PT(st, XMP_GPT2_LN1B, layer), &b->ln1, &b->c1));
    CHK(to_class(&b->ln1, st->act[A_LN1], NULL)); /* its backward: boxed to x's SBP */
    /* GEMM + its collective (--overlap coll-matmul: piecewise, nn/overlap.h (e)) */
    CHK(xmp_linear_forward_box(&st->ov, &b->ln1, xmp_gpt2__PT(st, XMP_GPT2_QKVW, layer),
                               xmp_gpt2__PT(st, XMP_GPT2_QKVB, layer), st->act[A_QKV], NULL,
                               b->s_qkv, &b->qkv));
    CHK(xmp_attention_forward(&b->qkv, &y4, &b->ac));
    view_heads(&y4, 0, NH, hs);
    b->att = y4;
    memset(&y4, 0, sizeof y4);
    CHK(to_class(&b->att, st->act[A_ATT], b->s_att));
    xmp_gpt2__progress(st);
    /* y boxed to the SBP of the sum, so the add needs no collective */
    CHK(xmp_linear_forward_box(&st->ov, &b->att, xmp_gpt2__PT(st, XMP_GPT2_ATTPROJW, layer),
                               xmp_gpt2__PT(st, XMP_GPT2_ATTPROJB, layer), NULL, x, b->s_y1, &y));
    CHK(xmp_add_forward(x, &y, &b->res1));
    xmp_tensor_free(&y);
    CHK(to_class(&b->res1, st->act[A_X], b->s_res1));
    /* MLP: res2 = res1 + fcproj(gelu(fc(ln2(res1)))) */
    CHK(xmp_layernorm_forward(&b->res1, xmp_gpt2__PT(st, XMP_GPT2_LN2W, layer),
                              xmp_gpt2__PT(st, XMP_GPT2_LN2B, layer), &b->ln2, &b->c2));
    CHK(to_class(&b->ln2, st->act[A_LN2], NULL));
    CHK(xmp_linear_forward_box(&st->ov, &b->ln2, xmp_gpt2__PT(st, XMP_GPT2_FCW, layer),
                               xmp_gpt2__PT(st, XMP_GPT2_FCB, layer), st->act[A_FCH], NULL,
                               b->s_fch, &b->fch));
    CHK(xmp_gelu_forward(&b->fch, &b->fcg));
    CHK(to_class(&b->fcg, st->act[A_GELU], b->s_fcg));
    xmp_gpt2__progress(st);
    CHK(xmp_linear_forward_box(&st->ov, &b->fcg, xmp_gpt2__PT(st, XMP_GPT2_FCPROJW, layer),
                               xmp_gpt2__PT(st, XMP_GPT2_FCPROJB, layer), NULL, &b->res1, b->s_y2,
                               &y));
    CHK(xmp_add_forward(&b->res1, &y, &b->res2));
    xmp_tensor_free(&y);
    CHK(to_class(&b->res2, st->act[A_X], b->s_res2));
    return 0;
fail:
    xmp_tensor_free(&y);
    xmp_tensor_free(&y4);
    return -1;
}

/* Input part of a block's backward: consumes dres2 (owned, act.x's SBP),
 * leaves the block input's gradient in *dx (owned, act.x's SBP), queues the
 * weight GEMMs and accumulates the layer-norm parameter gradients. */
static int block_backward(xmp_gpt2_stage_t *st, mb_t *m, int k, const xmp_tensor_t *x,
                          xmp_tensor_t *dres2, xmp_tensor_t *dx)
{
    blk_t *b = &m->b[k];
    int layer = st->l0 + k;
    const xmp_gpt2_config_t *c = &st->cfg;
    int64_t NH = c->num_heads, hs = c->channels / c->num_heads;
    xmp_tensor_t dy = {0}, dfcg = {0}, dfch = {0}, dln = {0}, datt = {0}, dqkv = {0};
    xmp_tensor_t dres1 = {0}, dxa = {0}, lx = {0}, lw = {0}, lb = {0};
    xmp_sbp_t g[NAX];
    /* res2 = box(res1 + y2) */
    CHK(from_class(st, dres2, b->s_res2));
    for (int a = 0; a < NAX; a++)
        g[a] = xmp_sbp_grad(b->s_y2[a]);
    CHK(xmp_box(dres2, g, &dy));
    for (int a = 0; a < NAX; a++)
        g[a] = xmp_sbp_grad(b->res1.sbp[a]);
    CHK(xmp_box(dres2, g, &dres1));
    xmp_tensor_free(dres2);
    for (int a = 0; a < NAX; a++)
        g[a] = a < st->nax ? xmp_sbp_grad(b->s_fcg[a]) : xmp_sbp_b();
    CHK(lin_bwd(st, m, &dy, XMP_GPT2_FCPROJW, XMP_GPT2_FCPROJB, layer, &b->fcg, g, &dfcg));
    CHK(xmp_gelu_backward(&dfcg, &b->fch, &dfch));
    xmp_tensor_free(&dfcg);
    CHK(from_class(st, &dfch, b->s_fch));
    CHK(lin_bwd(st, m, &dfch, XMP_GPT2_FCW, XMP_GPT2_FCB, layer, &b->ln2,
                ln_dy_sbp(st, &b->res1, g), &dln));
    CHK(xmp_layernorm_backward(&dln, &b->res1, xmp_gpt2__PT(st, XMP_GPT2_LN2W, layer), &b->c2, &lx,
                               &lw, &lb));
    xmp_tensor_free(&dln);
    CHK(add_into(&dres1, &lx));
    CHK(accumulate(&st->p[xmp_gpt2__pindex(st, XMP_GPT2_LN2W, layer)], &lw));
    CHK(accumulate(&st->p[xmp_gpt2__pindex(st, XMP_GPT2_LN2B, layer)], &lb));
    xmp_gpt2__progress(st);
    /* res1 = box(x + y1) */
    CHK(from_class(st, &dres1, b->s_res1));
    for (int a = 0; a < NAX; a++)
        g[a] = xmp_sbp_grad(b->s_y1[a]);
    CHK(xmp_box(&dres1, g, &dy));
    for (int a = 0; a < NAX; a++)
        g[a] = xmp_sbp_grad(x->sbp[a]);
    CHK(xmp_box(&dres1, g, &dxa));
    xmp_tensor_free(&dres1);
    for (int a = 0; a < NAX; a++)
        g[a] = a < st->nax ? xmp_sbp_grad(b->s_att[a]) : xmp_sbp_b();
    CHK(lin_bwd(st, m, &dy, XMP_GPT2_ATTPROJW, XMP_GPT2_ATTPROJB, layer, &b->att, g, &datt));
    view_heads(&datt, 1, NH, hs);
    CHK(xmp_attention_backward(&datt, &b->qkv, &b->ac, &dqkv));
    xmp_tensor_free(&datt);
    CHK(from_class(st, &dqkv, b->s_qkv));
    CHK(lin_bwd(st, m, &dqkv, XMP_GPT2_QKVW, XMP_GPT2_QKVB, layer, &b->ln1, ln_dy_sbp(st, x, g),
                &dln));
    CHK(xmp_layernorm_backward(&dln, x, xmp_gpt2__PT(st, XMP_GPT2_LN1W, layer), &b->c1, &lx, &lw,
                               &lb));
    xmp_tensor_free(&dln);
    CHK(add_into(&dxa, &lx));
    CHK(accumulate(&st->p[xmp_gpt2__pindex(st, XMP_GPT2_LN1W, layer)], &lw));
    CHK(accumulate(&st->p[xmp_gpt2__pindex(st, XMP_GPT2_LN1B, layer)], &lb));
    *dx = dxa;
    return 0;
fail:
    xmp_tensor_free(dres2);
    xmp_tensor_free(&dy);
    xmp_tensor_free(&dfcg);
    xmp_tensor_free(&dfch);
    xmp_tensor_free(&dln);
    xmp_tensor_free(&datt);
    xmp_tensor_free(&dqkv);
    xmp_tensor_free(&dres1);
    xmp_tensor_free(&dxa);
    xmp_tensor_free(&lx);
    xmp_tensor_free(&lw);
    xmp_tensor_free(&lb);
    return -1;
}

/* ------------------------------------------------------------- callbacks */

/* (Bm, T) i32 tensor of microbatch rows of src (B*T ints), split like act.x
 * over the batch and sequence dims. */
static int token_tensor(xmp_gpt2_stage_t *st, int mb, const int *src, xmp_tensor_t *t)
{
    int64_t s[2] = {st->Bm, st->tc.T};
    xmp_sbp_t sb[NAX];
    for (int a = 0; a < NAX; a++) {
        xmp_sbp_t v = st->act[A_X][a];
        sb[a] = v.kind == XMP_S && v.dim < 2 ? v : xmp_sbp_b();
    }
    if (xmp_tensor_alloc(t, st->mesh, 2, s, XMESH_I32, sb))
        return -1;
    return xmp_tensor_fill_from_full(t, src + (size_t)mb * st->Bm * st->tc.T) ? -1 : 0;
}

static int resid_tensor(xmp_gpt2_stage_t *st, xmp_tensor_t *t)
{
    return xmp_tensor_alloc(t, st->mesh, 3, st->edge_shape, XMESH_F32, st->act[A_X]) ? -1 : 0;
}

static const xmp_tensor_t *stage_out(const xmp_gpt2_stage_t *st, const mb_t *m)
{
    return st->nl ? &m->b[st->nl - 1].res2 : &m->x0;
}

/* x[b, t, c] += wpe[t, c] over x's local block (wpe boxed to B first when
 * the strategy splits it). */
static int pos_add(xmp_tensor_t *x, const xmp_tensor_t *wpe_in)
{
    xmp_sbp_t allb[NAX];
    xmp_tensor_t tmp = {0};
    const xmp_tensor_t *wpe = wpe_in;
    int need = 0;
    for (int a = 0; a < NAX; a++) {
        allb[a] = xmp_sbp_b();
        need |= !xmp_sbp_eq(wpe_in->sbp[a], allb[a]);
    }
    if (need) {
        if (xmp_box(wpe_in, allb, &tmp))
            return -1;
        wpe = &tmp;
    }
    const float *w = xmp_f32(wpe);
    float *d = xmp_f32(x);
    int64_t C = wpe->shape[1];
    for (int64_t b = 0; b < x->lshape[0]; b++)
        for (int64_t t = 0; t < x->lshape[1]; t++)
            for (int64_t c = 0; c < x->lshape[2]; c++)
                d[(b * x->lshape[1] + t) * x->lshape[2] + c] +=
                    w[(x->loff[1] + t) * C + x->loff[2] + c];
    xmp_tensor_free(&tmp);
    return 0;
}

/* dwpe (P where the local block is a part, B where it is all) from dx. */
static int pos_grad(const xmp_tensor_t *dx, const xmp_tensor_t *wpe, xmp_tensor_t *dw)
{
    xmp_sbp_t s[NAX];
    for (int a = 0; a < NAX; a++)
        s[a] = a < dx->mesh->ndim && dx->sbp[a].kind == XMP_S ? xmp_sbp_p() : xmp_sbp_b();
    if (xmp_tensor_alloc(dw, dx->mesh, 2, wpe->shape, XMESH_F32, s))
        return -1;
    float *g = xmp_f32(dw);
    const float *d = xmp_f32(dx);
    int64_t C = wpe->shape[1];
    for (int64_t b = 0; b < dx->lshape[0]; b++)
        for (int64_t t = 0; t < dx->lshape[1]; t++)
            for (int64_t c = 0; c < dx->lshape[2]; c++)
                g[(dx->loff[1] + t) * C + dx->loff[2] + c] +=
                    d[(b * dx->lshape[1] + t) * dx->lshape[2] + c];
    return 0;
}

/* Recomputation (tc.recompute): after a block's forward, block drops everything but its
 * output (the next block's input, kept), selective the attention probabilities. */
static void drop_for_recompute(const xmp_gpt2_stage_t *st, blk_t *b)
{
    if (st->tc.recompute == XMP_RECOMPUTE_BLOCK) {
        xmp_tensor_t keep = b->res2;
        xmp_sbp_t s2[NAX];
        memcpy(s2, b->s_res2, sizeof s2);
        memset(&b->res2, 0, sizeof b->res2);
        blk_free(b);
        b->res2 = keep;
        memcpy(b->s_res2, s2, sizeof s2);
    } else if (st->tc.recompute == XMP_RECOMPUTE_SELECTIVE) {
        xmp_attn_cache_free(&b->ac);
    }
}

/* Rebuilds what drop_for_recompute dropped of block k (input x) before its backward; the
 * forward is deterministic, so the rebuilt tensors equal the dropped ones bitwise. */
static int recompute_block(xmp_gpt2_stage_t *st, mb_t *m, int k, const xmp_tensor_t *x)
{
    blk_t *b = &m->b[k];
    if (st->tc.recompute == XMP_RECOMPUTE_BLOCK) {
        xmp_tensor_t keep = b->res2;
        memset(&b->res2, 0, sizeof b->res2);
        int rc = block_forward(st, st->l0 + k, x, b);
        xmp_tensor_free(&b->res2);
        b->res2 = keep;
        /* Held from here to W (the weight GEMMs read them). */
        m->bytes += xmp_gpt2__tbytes(&b->ln1) + xmp_gpt2__tbytes(&b->qkv) +
                    xmp_gpt2__tbytes(&b->att) + xmp_gpt2__tbytes(&b->res1) +
                    xmp_gpt2__tbytes(&b->ln2) + xmp_gpt2__tbytes(&b->fch) +
                    xmp_gpt2__tbytes(&b->fcg) + xmp_gpt2__tbytes(&b->ac.att);
        return rc;
    }
    if (st->tc.recompute == XMP_RECOMPUTE_SELECTIVE) {
        xmp_tensor_t y = {0};
        xmp_attn_cache_free(&b->ac);
        int rc = xmp_attention_forward(&b->qkv, &y, &b->ac) != XMESH_SUCCESS;
        xmp_tensor_free(&y);
        m->bytes += xmp_gpt2__tbytes(&b->ac.att);
        return rc ? -1 : 0;
    }
    return 0;
}

/* Sampling: every rank of the last stage gathers the logits (collective over its mesh); the
 * rank with mesh index 0 keeps row 0 at position cap_pos. */
static int capture_logits(xmp_gpt2_stage_t *st, const xmp_tensor_t *logits)
{
    xmp_sbp_t allb[XMP_MAX_MESH_DIMS];
    xmp_tensor_t full = {0};
    for (int a = 0; a < XMP_MAX_MESH_DIMS; a++)
        allb[a] = xmp_sbp_b();
    if (xmp_box(logits, allb, &full) != XMESH_SUCCESS)
        return -1;
    const int Vp = st->cfg.padded_vocab_size;
    if (st->mesh->index == 0) {
        if (!st->cap && !(st->cap = malloc(sizeof(float) * (size_t)Vp))) {
            xmp_tensor_free(&full);
            return xmp_err(XMESH_ERR_NO_MEMORY, "sampling: out of memory"), -1;
        }
        memcpy(st->cap, xmp_f32(&full) + (size_t)st->cap_pos * (size_t)Vp,
               sizeof(float) * (size_t)Vp);
        st->cap_ok = 1;
    }
    xmp_tensor_free(&full);
    return 0;
}

int xmp_gpt2__cb_forward(void *user, int mbi, const void *const *in, void *const *out, double *loss)
{
    xmp_gpt2_stage_t *st = user;
    double t0 = MPI_Wtime();
    mb_t *m = &st->mb[mbi];
    const xmp_gpt2_config_t *c = &st->cfg;
    xmp_tensor_t logits = {0}, tgt = {0};
    if (m->live)
        xmp_gpt2__mb_free(st, m);
    m->live = 1;
    if (st->has_e) {
        CHK(token_tensor(st, mbi, st->inputs, &m->tok));
        CHK(xmp_embedding_forward(&m->tok, xmp_gpt2__PT(st, XMP_GPT2_WTE, -1), &m->x0));
        CHK(to_class(&m->x0, st->act[A_X], NULL));
        CHK(pos_add(&m->x0, xmp_gpt2__PT(st, XMP_GPT2_WPE, -1)));
    } else {
        CHK(resid_tensor(st, &m->x0));
        if (m->x0.lcount)
            memcpy(m->x0.data, in[0], (size_t)m->x0.lcount * 4);
    }
    m->bytes = xmp_gpt2__tbytes(&m->x0);
    const xmp_tensor_t *x = &m->x0;
    for (int k = 0; k < st->nl; k++) {
        blk_t *b = &m->b[k];
        CHK(block_forward(st, st->l0 + k, x, b));
        drop_for_recompute(st, b);
        m->bytes +=
            xmp_gpt2__tbytes(&b->ln1) + xmp_gpt2__tbytes(&b->qkv) + xmp_gpt2__tbytes(&b->att) +
            xmp_gpt2__tbytes(&b->res1) + xmp_gpt2__tbytes(&b->ln2) + xmp_gpt2__tbytes(&b->fch) +
            xmp_gpt2__tbytes(&b->fcg) + xmp_gpt2__tbytes(&b->res2) + xmp_gpt2__tbytes(&b->ac.att);
        x = &b->res2;
    }
    if (st->has_l) {
        CHK(xmp_layernorm_forward(x, xmp_gpt2__PT(st, XMP_GPT2_LNFW, -1),
                                  xmp_gpt2__PT(st, XMP_GPT2_LNFB, -1), &m->lnf, &m->cf));
        CHK(to_class(&m->lnf, st->act[A_LNF], NULL));
        CHK(xmp_linear_forward(&m->lnf, xmp_gpt2__PT(st, XMP_GPT2_WTE, -1), NULL, &logits));
        CHK(to_class(&logits, st->act[A_LOGITS], m->s_logits));
        if (st->cap_pos >= 0 && mbi == 0)
            CHK(capture_logits(st, &logits));
        CHK(token_tensor(st, mbi, st->targets, &tgt));
        float lv = 0;
        CHK(xmp_cross_entropy(&logits, &tgt, c->vocab_size, &lv, &m->dlogits));
        xmp_tensor_free(&logits);
        xmp_tensor_free(&tgt);
        /* The microbatch mean weighs Bm/B of the batch mean (serial: mean over B*T). */
        float scale = (float)st->Bm / (float)st->tc.B;
        float *d = xmp_f32(&m->dlogits);
        for (int64_t i = 0; i < m->dlogits.lcount; i++)
            d[i] *= scale;
        /* Every rank of the stage holds the same loss: each adds its share. */
        *loss += (double)lv * st->Bm / st->tc.B / st->msize;
        m->bytes += xmp_gpt2__tbytes(&m->lnf) + xmp_gpt2__tbytes(&m->dlogits);
    } else if (x->lcount) {
        memcpy(out[0], x->data, (size_t)x->lcount * 4);
    }
    st->times.f_s += MPI_Wtime() - t0;
    st->times.nf++;
    return 0;
fail:
    (void)xmp_err(XMESH_ERR_INVALID_USAGE, "gpt2 stage %d forward mb %d: %s", st->stage, mbi,
                  xmp_last_error());
    xmp_tensor_free(&logits);
    xmp_tensor_free(&tgt);
    return 1;
}

int xmp_gpt2__cb_backward_input(void *user, int mbi, const void *const *gout, void *const *gin)
{
    xmp_gpt2_stage_t *st = user;
    double t0 = MPI_Wtime();
    mb_t *m = &st->mb[mbi];
    xmp_tensor_t d = {0}, dx = {0}, dl = {0}, dtab = {0}, lw = {0}, lb = {0}, dw = {0};
    const xmp_tensor_t *xl = stage_out(st, m);
    if (st->has_l) {
        CHK(from_class(st, &m->dlogits, m->s_logits));
        CHK(xmp_linear_backward_input(&m->dlogits, xmp_gpt2__PT(st, XMP_GPT2_WTE, -1), &dl));
        CHK(queue_w(m, &m->dlogits, &m->lnf, xmp_gpt2__pindex(st, XMP_GPT2_WTE, -1), -1));
        CHK(xmp_layernorm_backward(&dl, xl, xmp_gpt2__PT(st, XMP_GPT2_LNFW, -1), &m->cf, &d, &lw,
                                   &lb));
        xmp_tensor_free(&dl);
        CHK(accumulate(&st->p[xmp_gpt2__pindex(st, XMP_GPT2_LNFW, -1)], &lw));
        CHK(accumulate(&st->p[xmp_gpt2__pindex(st, XMP_GPT2_LNFB, -1)], &lb));
    } else {
        CHK(resid_tensor(st, &d));
        if (d.lcount)
            memcpy(d.data, gout[0], (size_t)d.lcount * 4);
    }
    for (int k = st->nl - 1; k >= 0; k--) {
        const xmp_tensor_t *x = k ? &m->b[k - 1].res2 : &m->x0;
        CHK(recompute_block(st, m, k, x));
        CHK(block_backward(st, m, k, x, &d, &dx));
        d = dx;
        memset(&dx, 0, sizeof dx);
    }
    if (st->has_e) {
        CHK(pos_grad(&d, xmp_gpt2__PT(st, XMP_GPT2_WPE, -1), &dw));
        CHK(accumulate(&st->p[xmp_gpt2__pindex(st, XMP_GPT2_WPE, -1)], &dw));
        /* The table gradient comes P over the axes that split the tokens: it
         * is summed locally here and reduced once per step in R. */
        CHK(xmp_embedding_backward(&d, &m->tok, xmp_gpt2__PT(st, XMP_GPT2_WTE, -1), &dtab));
        CHK(accumulate(&st->p[xmp_gpt2__pindex(st, XMP_GPT2_WTE, -1)], &dtab));
    } else if (d.lcount) {
        memcpy(gin[0], d.data, (size_t)d.lcount * 4);
    }
    xmp_tensor_free(&d);
    st->times.i_s += MPI_Wtime() - t0;
    st->times.ni++;
    return 0;
fail:
    (void)xmp_err(XMESH_ERR_INVALID_USAGE, "gpt2 stage %d backward (input) mb %d: %s", st->stage,
                  mbi, xmp_last_error());
    xmp_tensor_free(&d);
    xmp_tensor_free(&dl);
    xmp_tensor_free(&dtab);
    xmp_tensor_free(&lw);
    xmp_tensor_free(&lb);
    xmp_tensor_free(&dw);
    return 1;
}

int xmp_gpt2__cb_backward_weight(void *user, int mbi)
{
    xmp_gpt2_stage_t *st = user;
    double t0 = MPI_Wtime();
    mb_t *m = &st->mb[mbi];
    for (int i = 0; i < m->nwq; i++) {
        wq_t *q = &m->wq[i];
        xmp_tensor_t dw = {0}, db = {0};
        CHK(xmp_linear_backward_weight(&q->dy, q->x, &dw, q->pb >= 0 ? &db : NULL));
        int rc = accumulate(&st->p[q->pw], &dw);
        if (q->pb >= 0)
            rc |= accumulate(&st->p[q->pb], &db);
        xmp_tensor_free(&dw);
        xmp_tensor_free(&db);
        CHK(rc);
        xmp_tensor_free(&q->dy);
        if (i % 4 == 3)
            xmp_gpt2__progress(st);
    }
    m->nwq = 0;
    xmp_gpt2__mb_free(st, m); /* nothing of this microbatch is needed any more */
    st->times.w_s += MPI_Wtime() - t0;
    st->times.nw++;
    return 0;
fail:
    (void)xmp_err(XMESH_ERR_INVALID_USAGE, "gpt2 stage %d backward (weight) mb %d: %s", st->stage,
                  mbi, xmp_last_error());
    return 1;
}

/* Exchanges the tied wte gradient (reduced, compute SBP) between the first
 * and last stage. */
static int tie_exchange(xmp_gpt2_stage_t *st, par_t *q)
{
    float *tmp = malloc(sizeof(float) * (size_t)(q->P.r.lcount + 1));
    if (!tmp)
        return -1;
    int first = st->stage == st->tie_first;
    xmesh_plan_t fl = st->tie_plans->tie_fl, lf = st->tie_plans->tie_lf;
    xmesh_result_t r = xmesh_reshard(fl, first ? q->P.r.data : NULL, first ? NULL : tmp);
    if (!r)
        r = xmesh_reshard(lf, first ? NULL : q->P.r.data, first ? tmp : NULL);
    if (!r) {
        float *g = xmp_f32(&q->P.r);
        for (int64_t i = 0; i < q->P.r.lcount; i++)
            g[i] = g[i] + tmp[i];
    } else {
        (void)xmp_err(XMESH_ERR_INVALID_USAGE, "gpt2 stage %d: tied wte exchange: %s", st->stage,
                      xmesh_last_error());
    }
    free(tmp);
    return r ? -1 : 0;
}

/* Both tied stages on this rank (V shape: stage 0 and the last on one group): each copy's
 * reduced gradient is resharded into the other's layout (local plans of overlapping meshes)
 * and both add the other's, a + b == b + a bitwise, so the copies stay equal. */
static int tie_exchange_local(xmp_gpt2_stage_t *st)
{
    xmp_gpt2_stage_t *f = st->stage == st->tie_first ? st : st->tie_peer;
    xmp_gpt2_stage_t *l = f == st ? st->tie_peer : st;
    par_t *qf = &f->p[xmp_gpt2__pindex(f, XMP_GPT2_WTE, -1)],
          *ql = &l->p[xmp_gpt2__pindex(l, XMP_GPT2_WTE, -1)];
    float *tf = malloc(sizeof(float) * (size_t)(qf->P.r.lcount + 1));
    float *tl = malloc(sizeof(float) * (size_t)(ql->P.r.lcount + 1));
    xmesh_result_t r = tf && tl ? XMESH_SUCCESS : XMESH_ERR_NO_MEMORY;
    if (!r)
        r = xmesh_reshard(f->tie_plans->tie_fl, qf->P.r.data, tl);
    if (!r)
        r = xmesh_reshard(f->tie_plans->tie_lf, ql->P.r.data, tf);
    if (!r) {
        float *g = xmp_f32(&qf->P.r);
        for (int64_t i = 0; i < qf->P.r.lcount; i++)
            g[i] = g[i] + tf[i];
        g = xmp_f32(&ql->P.r);
        for (int64_t i = 0; i < ql->P.r.lcount; i++)
            g[i] = g[i] + tl[i];
    } else {
        (void)xmp_err(XMESH_ERR_INVALID_USAGE, "gpt2 stages %d and %d: tied wte exchange: %s",
                      f->stage, l->stage, xmesh_last_error());
    }
    free(tf);
    free(tl);
    return r ? -1 : 0;
}

int xmp_gpt2__cb_reduce(void *user)
{
    xmp_gpt2_stage_t *st = user;
    double t0 = MPI_Wtime();
    /* defer-grad: every reduction posted first (nonblocking), then waited in the same order;
     * the same collectives on the same data as the blocking loop. */
    for (int i = 0; st->ov.defer_grad && i < st->np; i++)
        if (xmp_param_reduce_start(&st->p[i].P)) {
            (void)xmp_err(XMESH_ERR_INVALID_USAGE, "gpt2 stage %d: gradient reduction of %s: %s",
                          st->stage, xmp_gpt2__pclass[st->p[i].id], xmp_last_error());
            return 1;
        }
    for (int i = 0; i < st->np; i++) {
        par_t *q = &st->p[i];
        /* Once per step: P -> B over the axes where the parameter is
         * replicated (the data-parallel all-reduce), or P -> S where its
         * storage is sharded (reduce-scatter). */
        if (st->ov.defer_grad ? xmp_param_reduce_wait(&q->P) : xmp_param_reduce(&q->P)) {
            (void)xmp_err(XMESH_ERR_INVALID_USAGE, "gpt2 stage %d: gradient reduction of %s: %s",
                          st->stage, xmp_gpt2__pclass[q->id], xmp_last_error());
            return 1;
        }
    }
    st->reduced = 1;
    if (st->tie_peer) {
        if (st->tie_peer->reduced && tie_exchange_local(st))
            return 1;
    } else if (st->tie_fl && (st->stage == st->tie_first || st->stage == st->tie_last) &&
               tie_exchange(st, &st->p[xmp_gpt2__pindex(st, XMP_GPT2_WTE, -1)])) {
        return 1;
    }
    st->times.r_s += MPI_Wtime() - t0;
    return 0;
}

int xmp_gpt2__cb_optimizer(void *user)
{
    xmp_gpt2_stage_t *st = user;
    double t0 = MPI_Wtime();
    const xmp_gpt2_train_cfg_t *t = &st->tc;
    st->reduced = 0;
    for (int i = 0; i < st->np; i++) {
        par_t *q = &st->p[i];
        xmp_tensor_t *w = xmp_gpt2__stored(q);
        if (w->lcount && q->P.r.data)
            xmp_adamw(xmp_f32(w), xmp_f32(&q->P.r), q->P.state[0], q->P.state[1], (size_t)w->lcount,
                      t->lr, t->beta1, t->beta2, t->eps, t->wd, st->step + 1);
        /* Sharded: the updated shards are all-gathered into the compute copy
         * the next step uses (prefetch: started here, waited after the updates of the
         * parameters that follow, in the same order). */
        if (st->ov.prefetch ? xmp_param_gather_start(&q->P) : xmp_param_gather(&q->P)) {
            (void)xmp_err(XMESH_ERR_INVALID_USAGE, "gpt2 stage %d: gathering %s: %s", st->stage,
                          xmp_gpt2__pclass[q->id], xmp_last_error());
            return 1;
        }
        xmp_param_zero_grad(&q->P, 0);
    }
    for (int i = 0; st->ov.prefetch && i < st->np; i++) {
        par_t *q = &st->p[i];
        if (xmp_param_gather_wait(&q->P)) {
            (void)xmp_err(XMESH_ERR_INVALID_USAGE, "gpt2 stage %d: gathering %s: %s", st->stage,
                          xmp_gpt2__pclass[q->id], xmp_last_error());
            return 1;
        }
    }
    for (int k = 0; k < st->tc.M; k++)
        if (st->mb[k].live)
            xmp_gpt2__mb_free(st, &st->mb[k]);
    st->times.o_s += MPI_Wtime() - t0;
    return 0;
}

void xmp_gpt2__cb_set_progress(void *user, void (*fn)(void *arg), void *arg)
{
    xmp_gpt2_stage_t *st = user;
    st->progress = fn;
    st->progress_arg = arg;
}

int64_t xmp_gpt2__cb_act_bytes(void *user)
{
    return xmp_gpt2_stage_activation_bytes(user);
}

void xmp_gpt2_stage_memory(const xmp_gpt2_stage_t *st, xmp_gpt2_stage_memory_t *mem)
{
    memset(mem, 0, sizeof *mem);
    for (int i = 0; st->stage >= 0 && i < st->np; i++) {
        xmp_param_bytes_t b = {0, 0, 0, 0};
        xmp_param_bytes(&st->p[i].P, &b);
        mem->param_bytes += b.param;
        mem->optimizer_bytes += b.optimizer;
        mem->compute_param_bytes += b.compute;
        mem->grad_bytes += b.grad;
        mem->sharded += st->p[i].P.sharded;
    }
}

int64_t xmp_gpt2_stage_activation_bytes(const xmp_gpt2_stage_t *st)
{
    int64_t b = 0;
    for (int k = 0; st->stage >= 0 && k < st->tc.M; k++)
        if (st->mb[k].live)
            b += st->mb[k].bytes;
    return b;
}
