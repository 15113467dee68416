/* GPT-2 pipeline stages of SBP-parallel layers: see gpt2_par.h. */
#include "models/gpt2_par.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/kernels.h"
#include "nn/sbp_ops.h"

#define NPT XMP_GPT2_NUM_PARAM_TENSORS

/* One parameter tensor of this stage (one layer's slice of a stacked tensor). */
typedef struct {
    int id, layer;  /* XMP_GPT2_*, layer (-1: not per layer) */
    xmp_tensor_t w; /* SBP B over dp, tp_sbp() over tp */
    xmp_tensor_t g; /* gradient, P over dp (boxed to B in R) */
    float *m, *v;   /* AdamW moments (local) */
} par_t;

/* Saved activations of one transformer block for one microbatch. */
typedef struct {
    xmp_tensor_t ln1, qkv, atty, res1, ln2, fch, fcg, res2;
    float *m1, *r1, *m2, *r2, *att;
} blk_t;

/* A queued weight-gradient GEMM: dW += dy^T x (and db += sum dy). */
typedef struct {
    xmp_tensor_t dy;       /* owned */
    const xmp_tensor_t *x; /* saved activation of the same microbatch */
    int pw, pb;            /* parameter indexes (pb -1: no bias) */
} wq_t;

typedef struct {
    int live;
    xmp_tensor_t tok, x0, lnf, dlogits;
    float *mf, *rf;
    blk_t *b;
    wq_t *wq;
    int nwq, capwq;
    int64_t bytes;
} mb_t;

struct xmp_gpt2_stage {
    MPI_Comm comm;
    int rank, size;
    xmesh_ctx_t ctx;
    xmp_gpt2_config_t cfg;
    xmp_gpt2_train_cfg_t tc;
    xmp_stage_layout_t lay;
    xmp_mesh_t *meshes[XMP_MAX_STAGES];
    int *ranks; /* all stage ranks, stage after stage */
    int stage, dp, tp, Bm;
    xmp_mesh_t *mesh;
    int has_e, has_l, l0, nl; /* blocks l0 .. l0+nl-1 */
    par_t *p;
    int np;
    int *pidx; /* (id, layer+1) -> index in p, or -1 */
    mb_t *mb;
    const int *inputs, *targets;
    int step;
    float *work; /* attention backward scratch, T floats */
    xmp_gpt2_stage_times_t times;
    double comm0;
    /* tied wte across the first and last stage */
    int tie_first, tie_last;
    xmesh_plan_t tie_fl, tie_lf;
    int64_t edge_shape[3];
};

static int set_err(char *err, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int set_err(char *err, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (err && n)
        vsnprintf(err, n, fmt, ap);
    va_end(ap);
    return -1;
}

/* Split of each parameter tensor over the tensor-parallel axis. */
static xmp_sbp_t tp_sbp(int id)
{
    switch (id) {
    case XMP_GPT2_WTE:
    case XMP_GPT2_FCW:
    case XMP_GPT2_FCB:
        return xmp_sbp_s(0);
    case XMP_GPT2_QKVW: /* viewed (3, C, C) */
    case XMP_GPT2_QKVB: /* viewed (3, C) */
    case XMP_GPT2_ATTPROJW:
    case XMP_GPT2_FCPROJW:
        return xmp_sbp_s(1);
    default:
        return xmp_sbp_b();
    }
}

/* Global shape of one layer's slice of tensor id (views for QKV). */
static int param_shape(const xmp_gpt2_config_t *c, int id, int64_t *s)
{
    int64_t C = c->channels;
    switch (id) {
    case XMP_GPT2_WTE:
        s[0] = c->padded_vocab_size, s[1] = C;
        return 2;
    case XMP_GPT2_WPE:
        s[0] = c->max_seq_len, s[1] = C;
        return 2;
    case XMP_GPT2_QKVW:
        s[0] = 3, s[1] = C, s[2] = C;
        return 3;
    case XMP_GPT2_QKVB:
        s[0] = 3, s[1] = C;
        return 2;
    case XMP_GPT2_ATTPROJW:
        s[0] = C, s[1] = C;
        return 2;
    case XMP_GPT2_FCW:
        s[0] = 4 * C, s[1] = C;
        return 2;
    case XMP_GPT2_FCB:
        s[0] = 4 * C;
        return 1;
    case XMP_GPT2_FCPROJW:
        s[0] = C, s[1] = 4 * C;
        return 2;
    default: /* layernorms, attprojb, fcprojb, lnf */
        s[0] = C;
        return 1;
    }
}

static int is_per_layer(int id)
{
    return id != XMP_GPT2_WTE && id != XMP_GPT2_WPE && id != XMP_GPT2_LNFW && id != XMP_GPT2_LNFB;
}

static int pindex(const xmp_gpt2_stage_t *st, int id, int layer)
{
    return st->pidx[id * (st->cfg.num_layers + 1) + layer + 1];
}
static float *PW(const xmp_gpt2_stage_t *st, int id, int layer)
{
    return xmp_f32(&st->p[pindex(st, id, layer)].w);
}
static float *PG(const xmp_gpt2_stage_t *st, int id, int layer)
{
    return xmp_f32(&st->p[pindex(st, id, layer)].g);
}
static const xmp_tensor_t *PT(const xmp_gpt2_stage_t *st, int id, int layer)
{
    return &st->p[pindex(st, id, layer)].w;
}

static int add_param(xmp_gpt2_stage_t *st, const xmp_gpt2_t *full, int id, int layer)
{
    if (pindex(st, id, layer) >= 0)
        return 0; /* wte of a stage with both E and L */
    par_t *q = &st->p[st->np];
    memset(q, 0, sizeof *q);
    q->id = id;
    q->layer = layer;
    int64_t shape[3];
    int nd = param_shape(&st->cfg, id, shape);
    xmp_sbp_t sw[2] = {xmp_sbp_b(), tp_sbp(id)}, sg[2] = {xmp_sbp_p(), tp_sbp(id)};
    if (xmp_tensor_alloc(&q->w, st->mesh, nd, shape, XMESH_F32, sw) ||
        xmp_tensor_alloc(&q->g, st->mesh, nd, shape, XMESH_F32, sg))
        return -1;
    const xmp_gpt2_param_info_t *pi = &full->ptab[id];
    size_t per = pi->numel / (is_per_layer(id) ? (size_t)st->cfg.num_layers : 1);
    const float *src = full->params + pi->offset + (layer >= 0 ? (size_t)layer * per : 0);
    if (xmp_tensor_fill_from_full(&q->w, src))
        return -1;
    q->m = calloc((size_t)q->w.lcount + 1, sizeof(float));
    q->v = calloc((size_t)q->w.lcount + 1, sizeof(float));
    if (!q->m || !q->v)
        return -1;
    st->pidx[id * (st->cfg.num_layers + 1) + layer + 1] = st->np++;
    return 0;
}

/* ------------------------------------------------------------ activations */

static void blk_free(blk_t *b)
{
    xmp_tensor_t *t[] = {&b->ln1, &b->qkv, &b->atty, &b->res1, &b->ln2, &b->fch, &b->fcg, &b->res2};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        xmp_tensor_free(t[i]);
    free(b->m1);
    free(b->r1);
    free(b->m2);
    free(b->r2);
    free(b->att);
    memset(b, 0, sizeof *b);
}

static void mb_free(xmp_gpt2_stage_t *st, mb_t *m)
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
    free(m->mf);
    free(m->rf);
    m->mf = m->rf = NULL;
    m->live = 0;
    m->bytes = 0;
}

static int64_t tbytes(const xmp_tensor_t *t)
{
    return t->lcount * 4;
}

/* x's local rows (all dims but the last). */
static int64_t rows_of(const xmp_tensor_t *x)
{
    return x->lcount / (x->lshape[x->ndim - 1] ? x->lshape[x->ndim - 1] : 1);
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

static int copy_tensor(xmp_tensor_t *out, const xmp_tensor_t *t)
{
    if (xmp_tensor_alloc_like(out, t))
        return -1;
    memcpy(out->data, t->data, (size_t)t->lcount * 4);
    return 0;
}

/* Boxes t to (S(0) or keep dp axis, tp SBP want) in place. */
static int box_tp(xmp_tensor_t *t, xmp_sbp_t dp, xmp_sbp_t want)
{
    xmp_sbp_t s[2] = {dp, want};
    return xmp_box_inplace(t, s) ? -1 : 0;
}

#define CHK(x)                                                                                     \
    do {                                                                                           \
        if (x)                                                                                     \
            goto fail;                                                                             \
    } while (0)

static int block_forward(xmp_gpt2_stage_t *st, int layer, const xmp_tensor_t *x, blk_t *b)
{
    const xmp_gpt2_config_t *c = &st->cfg;
    int C = c->channels, NH = c->num_heads, hs = C / NH, NHl = NH / st->tp, T = st->tc.T;
    int64_t R = rows_of(x), Bl = x->lshape[0];
    CHK(xmp_tensor_alloc_like(&b->ln1, x));
    b->m1 = malloc(sizeof(float) * (size_t)(R + 1));
    b->r1 = malloc(sizeof(float) * (size_t)(R + 1));
    CHK(!b->m1 || !b->r1);
    xmp_layernorm_fwd(xmp_f32(&b->ln1), b->m1, b->r1, xmp_f32(x), PW(st, XMP_GPT2_LN1W, layer),
                      PW(st, XMP_GPT2_LN1B, layer), (size_t)R, C);
    CHK(xmp_linear_forward(&b->ln1, PT(st, XMP_GPT2_QKVW, layer), PT(st, XMP_GPT2_QKVB, layer),
                           &b->qkv));
    int64_t as[3] = {x->shape[0], T, C};
    xmp_sbp_t asb[2] = {xmp_sbp_s(0), xmp_sbp_s(2)};
    CHK(xmp_tensor_alloc(&b->atty, st->mesh, 3, as, XMESH_F32, asb));
    CHK(b->qkv.lcount != 3 * b->atty.lcount); /* heads align with the channel split */
    b->att = malloc(sizeof(float) * (size_t)(Bl * NHl * T * T + 1));
    CHK(!b->att);
    xmp_attention_fwd(xmp_f32(&b->atty), NULL, b->att, xmp_f32(&b->qkv), (int)Bl, T, NHl, hs);
    xmp_driver_progress(NULL);
    xmp_tensor_t y;
    CHK(xmp_linear_forward(&b->atty, PT(st, XMP_GPT2_ATTPROJW, layer),
                           PT(st, XMP_GPT2_ATTPROJB, layer), &y));
    int rc = xmp_add_forward(x, &y, &b->res1) != XMESH_SUCCESS;
    xmp_tensor_free(&y);
    CHK(rc);
    CHK(box_tp(&b->res1, xmp_sbp_s(0), xmp_sbp_b()));
    CHK(xmp_tensor_alloc_like(&b->ln2, &b->res1));
    b->m2 = malloc(sizeof(float) * (size_t)(R + 1));
    b->r2 = malloc(sizeof(float) * (size_t)(R + 1));
    CHK(!b->m2 || !b->r2);
    xmp_layernorm_fwd(xmp_f32(&b->ln2), b->m2, b->r2, xmp_f32(&b->res1),
                      PW(st, XMP_GPT2_LN2W, layer), PW(st, XMP_GPT2_LN2B, layer), (size_t)R, C);
    CHK(xmp_linear_forward(&b->ln2, PT(st, XMP_GPT2_FCW, layer), PT(st, XMP_GPT2_FCB, layer),
                           &b->fch));
    CHK(xmp_tensor_alloc_like(&b->fcg, &b->fch));
    xmp_gelu_fwd(xmp_f32(&b->fcg), xmp_f32(&b->fch), (size_t)b->fch.lcount);
    xmp_driver_progress(NULL);
    CHK(xmp_linear_forward(&b->fcg, PT(st, XMP_GPT2_FCPROJW, layer),
                           PT(st, XMP_GPT2_FCPROJB, layer), &y));
    rc = xmp_add_forward(&b->res1, &y, &b->res2) != XMESH_SUCCESS;
    xmp_tensor_free(&y);
    CHK(rc);
    CHK(box_tp(&b->res2, xmp_sbp_s(0), xmp_sbp_b()));
    return 0;
fail:
    return -1;
}

/* Input part of a block's backward: consumes dres2 (owned, "S(0),B"), leaves
 * the block input's gradient in *dx (owned), queues the weight GEMMs. */
static int block_backward(xmp_gpt2_stage_t *st, mb_t *m, int k, const xmp_tensor_t *x,
                          xmp_tensor_t *dres2, xmp_tensor_t *dx)
{
    blk_t *b = &m->b[k];
    int layer = st->l0 + k;
    const xmp_gpt2_config_t *c = &st->cfg;
    int C = c->channels, NH = c->num_heads, hs = C / NH, NHl = NH / st->tp, T = st->tc.T;
    int64_t R = rows_of(x), Bl = x->lshape[0];
    xmp_tensor_t dfcg = {0}, dfch = {0}, dln2 = {0}, datty = {0}, dqkv = {0}, dln1 = {0}, cp = {0};
    /* MLP: res2 = res1 + fcproj(gelu(fc(ln2(res1)))) */
    CHK(xmp_linear_backward_input(dres2, PT(st, XMP_GPT2_FCPROJW, layer), &dfcg));
    CHK(box_tp(&dfcg, xmp_sbp_s(0), b->fcg.sbp[1]));
    CHK(copy_tensor(&cp, dres2));
    CHK(queue_w(m, &cp, &b->fcg, pindex(st, XMP_GPT2_FCPROJW, layer),
                pindex(st, XMP_GPT2_FCPROJB, layer)));
    CHK(xmp_tensor_alloc_like(&dfch, &b->fch));
    xmp_gelu_bwd(xmp_f32(&dfch), xmp_f32(&b->fch), xmp_f32(&dfcg), (size_t)dfch.lcount);
    CHK(xmp_linear_backward_input(&dfch, PT(st, XMP_GPT2_FCW, layer), &dln2));
    CHK(box_tp(&dln2, xmp_sbp_s(0), xmp_sbp_b()));
    CHK(queue_w(m, &dfch, &b->ln2, pindex(st, XMP_GPT2_FCW, layer),
                pindex(st, XMP_GPT2_FCB, layer)));
    xmp_tensor_t *dres1 = dres2; /* accumulate the ln2 path into it */
    xmp_layernorm_bwd(xmp_f32(dres1), PG(st, XMP_GPT2_LN2W, layer), PG(st, XMP_GPT2_LN2B, layer),
                      xmp_f32(&dln2), xmp_f32(&b->res1), PW(st, XMP_GPT2_LN2W, layer), b->m2, b->r2,
                      (size_t)R, C);
    xmp_driver_progress(NULL);
    /* attention: res1 = x + attproj(attn(qkv(ln1(x)))) */
    CHK(xmp_linear_backward_input(dres1, PT(st, XMP_GPT2_ATTPROJW, layer), &datty));
    CHK(box_tp(&datty, xmp_sbp_s(0), b->atty.sbp[1]));
    CHK(copy_tensor(&cp, dres1));
    CHK(queue_w(m, &cp, &b->atty, pindex(st, XMP_GPT2_ATTPROJW, layer),
                pindex(st, XMP_GPT2_ATTPROJB, layer)));
    CHK(xmp_tensor_alloc_like(&dqkv, &b->qkv));
    xmp_attention_bwd(xmp_f32(&dqkv), xmp_f32(&datty), xmp_f32(&b->qkv), b->att, (int)Bl, T, NHl,
                      hs, st->work);
    CHK(xmp_linear_backward_input(&dqkv, PT(st, XMP_GPT2_QKVW, layer), &dln1));
    CHK(box_tp(&dln1, xmp_sbp_s(0), xmp_sbp_b()));
    CHK(queue_w(m, &dqkv, &b->ln1, pindex(st, XMP_GPT2_QKVW, layer),
                pindex(st, XMP_GPT2_QKVB, layer)));
    xmp_layernorm_bwd(xmp_f32(dres1), PG(st, XMP_GPT2_LN1W, layer), PG(st, XMP_GPT2_LN1B, layer),
                      xmp_f32(&dln1), xmp_f32(x), PW(st, XMP_GPT2_LN1W, layer), b->m1, b->r1,
                      (size_t)R, C);
    *dx = *dres1;
    memset(dres2, 0, sizeof *dres2);
    xmp_tensor_free(&dfcg);
    xmp_tensor_free(&dln2);
    xmp_tensor_free(&datty);
    xmp_tensor_free(&dln1);
    return 0;
fail:
    xmp_tensor_free(&dfcg);
    xmp_tensor_free(&dfch);
    xmp_tensor_free(&dln2);
    xmp_tensor_free(&datty);
    xmp_tensor_free(&dqkv);
    xmp_tensor_free(&dln1);
    xmp_tensor_free(&cp);
    return -1;
}

/* ------------------------------------------------------------- callbacks */

/* (Bm, T) i32 tensor "S(0),B" of microbatch rows of src (B*T ints). */
static int token_tensor(xmp_gpt2_stage_t *st, int mb, const int *src, xmp_tensor_t *t)
{
    int64_t s[2] = {st->Bm, st->tc.T};
    xmp_sbp_t sb[2] = {xmp_sbp_s(0), xmp_sbp_b()};
    if (xmp_tensor_alloc(t, st->mesh, 2, s, XMESH_I32, sb))
        return -1;
    return xmp_tensor_fill_from_full(t, src + (size_t)mb * st->Bm * st->tc.T) ? -1 : 0;
}

static int resid_tensor(xmp_gpt2_stage_t *st, xmp_tensor_t *t)
{
    xmp_sbp_t sb[2] = {xmp_sbp_s(0), xmp_sbp_b()};
    return xmp_tensor_alloc(t, st->mesh, 3, st->edge_shape, XMESH_F32, sb) ? -1 : 0;
}

static const xmp_tensor_t *stage_out(const xmp_gpt2_stage_t *st, const mb_t *m)
{
    return st->nl ? &m->b[st->nl - 1].res2 : &m->x0;
}

static int cb_forward(void *user, int mbi, const void *const *in, void *const *out, double *loss)
{
    xmp_gpt2_stage_t *st = user;
    double t0 = MPI_Wtime();
    mb_t *m = &st->mb[mbi];
    const xmp_gpt2_config_t *c = &st->cfg;
    int C = c->channels, T = st->tc.T;
    if (m->live)
        mb_free(st, m);
    m->live = 1;
    if (st->has_e) {
        xmp_tensor_t e;
        CHK(token_tensor(st, mbi, st->inputs, &m->tok));
        CHK(xmp_embedding_forward(&m->tok, PT(st, XMP_GPT2_WTE, -1), &e));
        if (box_tp(&e, xmp_sbp_s(0), xmp_sbp_b())) {
            xmp_tensor_free(&e);
            goto fail;
        }
        m->x0 = e;
        xmp_pos_add_fwd(xmp_f32(&m->x0), PW(st, XMP_GPT2_WPE, -1), (int)m->x0.lshape[0], T, C);
    } else {
        CHK(resid_tensor(st, &m->x0));
        memcpy(m->x0.data, in[0], (size_t)m->x0.lcount * 4);
    }
    m->bytes = tbytes(&m->x0);
    const xmp_tensor_t *x = &m->x0;
    for (int k = 0; k < st->nl; k++) {
        blk_t *b = &m->b[k];
        CHK(block_forward(st, st->l0 + k, x, b));
        m->bytes += tbytes(&b->ln1) + tbytes(&b->qkv) + tbytes(&b->atty) + tbytes(&b->res1) +
                    tbytes(&b->ln2) + tbytes(&b->fch) + tbytes(&b->fcg) + tbytes(&b->res2) +
                    4 * (int64_t)b->atty.lshape[0] * (c->num_heads / st->tp) * T * T;
        x = &b->res2;
    }
    if (st->has_l) {
        int64_t R = rows_of(x);
        xmp_tensor_t logits, tgt;
        CHK(xmp_tensor_alloc_like(&m->lnf, x));
        m->mf = malloc(sizeof(float) * (size_t)(R + 1));
        m->rf = malloc(sizeof(float) * (size_t)(R + 1));
        CHK(!m->mf || !m->rf);
        xmp_layernorm_fwd(xmp_f32(&m->lnf), m->mf, m->rf, xmp_f32(x), PW(st, XMP_GPT2_LNFW, -1),
                          PW(st, XMP_GPT2_LNFB, -1), (size_t)R, C);
        CHK(xmp_linear_forward(&m->lnf, PT(st, XMP_GPT2_WTE, -1), NULL, &logits));
        if (token_tensor(st, mbi, st->targets, &tgt)) {
            xmp_tensor_free(&logits);
            goto fail;
        }
        float lv = 0;
        int rc = xmp_cross_entropy(&logits, &tgt, c->vocab_size, &lv, &m->dlogits) != 0;
        xmp_tensor_free(&logits);
        xmp_tensor_free(&tgt);
        CHK(rc);
        /* The microbatch mean weighs Bm/B of the batch mean (serial: mean over B*T). */
        float scale = (float)st->Bm / (float)st->tc.B;
        float *d = xmp_f32(&m->dlogits);
        for (int64_t i = 0; i < m->dlogits.lcount; i++)
            d[i] *= scale;
        /* Every rank of the stage holds the same loss: each adds its share. */
        *loss += (double)lv * st->Bm / st->tc.B / (st->dp * st->tp);
        m->bytes += tbytes(&m->lnf) + tbytes(&m->dlogits);
    } else {
        memcpy(out[0], x->data, (size_t)x->lcount * 4);
    }
    st->times.f_s += MPI_Wtime() - t0;
    st->times.nf++;
    return 0;
fail:
    fprintf(stderr, "gpt2 stage %d forward mb %d: %s\n", st->stage, mbi, xmp_last_error());
    return 1;
}

static int cb_backward_input(void *user, int mbi, const void *const *gout, void *const *gin)
{
    xmp_gpt2_stage_t *st = user;
    double t0 = MPI_Wtime();
    mb_t *m = &st->mb[mbi];
    const xmp_gpt2_config_t *c = &st->cfg;
    int C = c->channels, T = st->tc.T;
    xmp_tensor_t d = {0}, dx = {0}, dl = {0}, dtab = {0};
    const xmp_tensor_t *xl = stage_out(st, m);
    if (st->has_l) {
        CHK(xmp_linear_backward_input(&m->dlogits, PT(st, XMP_GPT2_WTE, -1), &dl));
        CHK(box_tp(&dl, xmp_sbp_s(0), xmp_sbp_b()));
        CHK(queue_w(m, &m->dlogits, &m->lnf, pindex(st, XMP_GPT2_WTE, -1), -1));
        CHK(xmp_tensor_alloc_like(&d, xl));
        xmp_layernorm_bwd(xmp_f32(&d), PG(st, XMP_GPT2_LNFW, -1), PG(st, XMP_GPT2_LNFB, -1),
                          xmp_f32(&dl), xmp_f32(xl), PW(st, XMP_GPT2_LNFW, -1), m->mf, m->rf,
                          (size_t)rows_of(xl), C);
        xmp_tensor_free(&dl);
    } else {
        CHK(resid_tensor(st, &d));
        memcpy(d.data, gout[0], (size_t)d.lcount * 4);
    }
    for (int k = st->nl - 1; k >= 0; k--) {
        const xmp_tensor_t *x = k ? &m->b[k - 1].res2 : &m->x0;
        CHK(block_backward(st, m, k, x, &d, &dx));
        d = dx;
        memset(&dx, 0, sizeof dx);
    }
    if (st->has_e) {
        xmp_pos_add_bwd(PG(st, XMP_GPT2_WPE, -1), xmp_f32(&d), (int)d.lshape[0], T, C);
        CHK(xmp_embedding_backward(&d, &m->tok, PT(st, XMP_GPT2_WTE, -1), &dtab));
        par_t *q = &st->p[pindex(st, XMP_GPT2_WTE, -1)];
        CHK(xmp_box_inplace(&dtab, q->g.sbp));
        CHK(dtab.lcount != q->g.lcount);
        float *g = xmp_f32(&q->g), *s = xmp_f32(&dtab);
        for (int64_t i = 0; i < dtab.lcount; i++)
            g[i] += s[i];
        xmp_tensor_free(&dtab);
    } else {
        memcpy(gin[0], d.data, (size_t)d.lcount * 4);
    }
    xmp_tensor_free(&d);
    st->times.i_s += MPI_Wtime() - t0;
    st->times.ni++;
    return 0;
fail:
    fprintf(stderr, "gpt2 stage %d backward (input) mb %d: %s\n", st->stage, mbi, xmp_last_error());
    xmp_tensor_free(&d);
    xmp_tensor_free(&dl);
    xmp_tensor_free(&dtab);
    return 1;
}

static int accumulate(par_t *q, xmp_tensor_t *d)
{
    if (xmp_box_inplace(d, q->g.sbp) || d->lcount != q->g.lcount)
        return -1;
    float *g = xmp_f32(&q->g), *s = xmp_f32(d);
    for (int64_t i = 0; i < d->lcount; i++)
        g[i] += s[i];
    return 0;
}

static int cb_backward_weight(void *user, int mbi)
{
    xmp_gpt2_stage_t *st = user;
    double t0 = MPI_Wtime();
    mb_t *m = &st->mb[mbi];
    for (int i = 0; i < m->nwq; i++) {
        wq_t *q = &m->wq[i];
        xmp_tensor_t dw = {0}, db = {0};
        CHK(xmp_linear_backward_weight(&q->dy, q->x, &dw, q->pb >= 0 ? &db : NULL));
        int rc = accumulate(&st->p[q->pw], &dw) || (q->pb >= 0 && accumulate(&st->p[q->pb], &db));
        xmp_tensor_free(&dw);
        xmp_tensor_free(&db);
        CHK(rc);
        xmp_tensor_free(&q->dy);
        if (i % 4 == 3)
            xmp_driver_progress(NULL);
    }
    m->nwq = 0;
    mb_free(st, m); /* nothing of this microbatch is needed any more */
    st->times.w_s += MPI_Wtime() - t0;
    st->times.nw++;
    return 0;
fail:
    fprintf(stderr, "gpt2 stage %d backward (weight) mb %d: %s\n", st->stage, mbi,
            xmp_last_error());
    return 1;
}

/* Exchanges the tied wte gradient between the first and last stage. */
static int tie_exchange(xmp_gpt2_stage_t *st, par_t *q)
{
    float *tmp = malloc(sizeof(float) * (size_t)(q->g.lcount + 1));
    if (!tmp)
        return -1;
    int first = st->stage == st->tie_first;
    xmesh_result_t r = xmesh_reshard(st->tie_fl, first ? q->g.data : NULL, first ? NULL : tmp);
    if (!r)
        r = xmesh_reshard(st->tie_lf, first ? NULL : q->g.data, first ? tmp : NULL);
    if (!r) {
        float *g = xmp_f32(&q->g);
        for (int64_t i = 0; i < q->g.lcount; i++)
            g[i] = g[i] + tmp[i];
    } else {
        fprintf(stderr, "gpt2 stage %d: tied wte exchange: %s\n", st->stage, xmesh_last_error());
    }
    free(tmp);
    return r ? -1 : 0;
}

static int cb_reduce(void *user)
{
    xmp_gpt2_stage_t *st = user;
    double t0 = MPI_Wtime();
    xmp_sbp_t s[2];
    for (int i = 0; i < st->np; i++) {
        par_t *q = &st->p[i];
        xmp_tensor_t y;
        s[0] = xmp_sbp_b(); /* P -> B over the data-parallel axis: the DP all-reduce */
        s[1] = q->g.sbp[1];
        if (xmp_box(&q->g, s, &y) || y.lcount != q->g.lcount) {
            fprintf(stderr, "gpt2 stage %d: gradient reduction: %s\n", st->stage, xmp_last_error());
            return 1;
        }
        memcpy(q->g.data, y.data, (size_t)y.lcount * 4);
        xmp_tensor_free(&y);
    }
    if (st->tie_fl && (st->stage == st->tie_first || st->stage == st->tie_last) &&
        tie_exchange(st, &st->p[pindex(st, XMP_GPT2_WTE, -1)]))
        return 1;
    st->times.r_s += MPI_Wtime() - t0;
    return 0;
}

static int cb_optimizer(void *user)
{
    xmp_gpt2_stage_t *st = user;
    double t0 = MPI_Wtime();
    const xmp_gpt2_train_cfg_t *t = &st->tc;
    for (int i = 0; i < st->np; i++) {
        par_t *q = &st->p[i];
        xmp_adamw(xmp_f32(&q->w), xmp_f32(&q->g), q->m, q->v, (size_t)q->w.lcount, t->lr, t->beta1,
                  t->beta2, t->eps, t->wd, st->step + 1);
        memset(q->g.data, 0, (size_t)q->g.lcount * 4);
    }
    for (int k = 0; k < st->tc.M; k++)
        if (st->mb[k].live)
            mb_free(st, &st->mb[k]);
    st->times.o_s += MPI_Wtime() - t0;
    return 0;
}

static int64_t cb_act_bytes(void *user)
{
    return xmp_gpt2_stage_activation_bytes(user);
}

int64_t xmp_gpt2_stage_activation_bytes(const xmp_gpt2_stage_t *st)
{
    int64_t b = 0;
    for (int k = 0; st->stage >= 0 && k < st->tc.M; k++)
        if (st->mb[k].live)
            b += st->mb[k].bytes;
    return b;
}

/* ------------------------------------------------------------- lifecycle */

int xmp_gpt2_stage_create(MPI_Comm comm, xmesh_ctx_t ctx, const xmp_gpt2_t *full,
                          const xmp_stage_layout_t *layout, const xmp_gpt2_train_cfg_t *tc,
                          xmp_gpt2_stage_t **out, char *err, size_t errlen)
{
    const xmp_gpt2_config_t *c = &full->cfg;
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    if (layout->nranks != size)
        return set_err(err, errlen, "the stage meshes use %d ranks, the job has %d", layout->nranks,
                       size);
    if (tc->M < 1 || tc->B % tc->M)
        return set_err(err, errlen, "--batch %d is not a multiple of --microbatches %d", tc->B,
                       tc->M);
    for (int s = 0; s < layout->nstages; s++)
        if (c->num_heads % layout->tp[s])
            return set_err(err, errlen,
                           "stage %d: %d heads cannot be split over tensor-parallel degree %d "
                           "(heads %% tp must be 0)",
                           s, c->num_heads, layout->tp[s]);
    xmp_gpt2_stage_t *st = calloc(1, sizeof *st);
    if (!st)
        return set_err(err, errlen, "out of memory");
    st->comm = comm;
    st->rank = rank;
    st->size = size;
    st->ctx = ctx;
    st->cfg = *c;
    st->tc = *tc;
    st->lay = *layout;
    st->Bm = tc->B / tc->M;
    st->stage = xmp_stage_layout_stage_of_rank(layout, rank);
    st->edge_shape[0] = st->Bm;
    st->edge_shape[1] = tc->T;
    st->edge_shape[2] = c->channels;
    st->ranks = malloc(sizeof(int) * (size_t)size);
    st->pidx = malloc(sizeof(int) * (size_t)NPT * (size_t)(c->num_layers + 1));
    if (!st->ranks || !st->pidx)
        goto fail_mem;
    for (int i = 0; i < NPT * (c->num_layers + 1); i++)
        st->pidx[i] = -1;
    for (int i = 0; i < size; i++)
        st->ranks[i] = i;
    int lfail = 0;
    for (int s = 0; s < layout->nstages; s++) {
        int shape[2] = {layout->dp[s], layout->tp[s]};
        if (xmp_mesh_create(comm, ctx, 2, shape, st->ranks + layout->rank0[s], &st->meshes[s])) {
            set_err(err, errlen, "stage %d mesh: %s", s, xmp_last_error());
            lfail = 1;
            break;
        }
    }
    /* Layers of this rank's stage. */
    if (!lfail && st->stage >= 0) {
        int s = st->stage;
        st->mesh = st->meshes[s];
        st->dp = layout->dp[s];
        st->tp = layout->tp[s];
        st->l0 = -1;
        for (int i = layout->first[s]; i < layout->first[s] + layout->count[s]; i++) {
            if (layout->kind[i] == 'E')
                st->has_e = 1;
            else if (layout->kind[i] == 'L')
                st->has_l = 1;
            else {
                if (st->l0 < 0)
                    st->l0 = i - 1; /* layer index: item i is block i-1 (item 0 is E) */
                st->nl++;
            }
        }
        if (st->l0 < 0)
            st->l0 = 0;
        st->p = calloc((size_t)(12 * st->nl + 4), sizeof(par_t));
        st->mb = calloc((size_t)tc->M, sizeof(mb_t));
        st->work = malloc(sizeof(float) * (size_t)(tc->T + 1));
        if (!st->p || !st->mb || !st->work)
            lfail = 1;
        for (int k = 0; !lfail && k < tc->M; k++)
            if (!(st->mb[k].b = calloc((size_t)st->nl + 1, sizeof(blk_t))))
                lfail = 1;
        if (!lfail && st->has_e)
            lfail = add_param(st, full, XMP_GPT2_WTE, -1) || add_param(st, full, XMP_GPT2_WPE, -1);
        for (int l = st->l0; !lfail && l < st->l0 + st->nl; l++)
            for (int id = XMP_GPT2_LN1W; !lfail && id <= XMP_GPT2_FCPROJB; id++)
                lfail = add_param(st, full, id, l);
        if (!lfail && st->has_l)
            lfail = add_param(st, full, XMP_GPT2_WTE, -1) ||
                    add_param(st, full, XMP_GPT2_LNFW, -1) ||
                    add_param(st, full, XMP_GPT2_LNFB, -1);
        if (lfail && !*err)
            set_err(err, errlen, "stage %d parameters: %s", s,
                    *xmp_last_error() ? xmp_last_error() : "out of memory");
    }
    int anyfail = 0;
    MPI_Allreduce(&lfail, &anyfail, 1, MPI_INT, MPI_MAX, comm);
    if (anyfail) {
        if (!lfail)
            set_err(err, errlen, "another rank failed to set up its stage");
        xmp_gpt2_stage_destroy(st);
        return -1;
    }
    /* Tied wte: first stage holds E, last holds L. */
    int first = layout->stage_of[0], last = layout->stage_of[layout->nitems - 1];
    st->tie_first = first;
    st->tie_last = last;
    if (first != last) {
        int64_t ws[2] = {c->padded_vocab_size, c->channels};
        xmesh_layout_t lf = {2, ws, XMESH_F32, st->meshes[first]->xmesh, "B,S(0)"};
        xmesh_layout_t ll = {2, ws, XMESH_F32, st->meshes[last]->xmesh, "B,S(0)"};
        if (xmesh_plan_create(ctx, &lf, &ll, NULL, &st->tie_fl) ||
            xmesh_plan_create(ctx, &ll, &lf, NULL, &st->tie_lf)) {
            set_err(err, errlen, "tied wte plans: %s", xmesh_last_error());
            xmp_gpt2_stage_destroy(st);
            return -1;
        }
    }
    *out = st;
    return 0;
fail_mem:
    free(st->ranks);
    free(st->pidx);
    free(st);
    return set_err(err, errlen, "out of memory");
}

void xmp_gpt2_stage_destroy(xmp_gpt2_stage_t *st)
{
    if (!st)
        return;
    xmesh_plan_destroy(st->tie_fl);
    xmesh_plan_destroy(st->tie_lf);
    if (st->mb) {
        for (int k = 0; k < st->tc.M; k++) {
            if (st->mb[k].b)
                mb_free(st, &st->mb[k]);
            free(st->mb[k].b);
            free(st->mb[k].wq);
        }
        free(st->mb);
    }
    for (int i = 0; st->p && i < st->np; i++) {
        xmp_tensor_free(&st->p[i].w);
        xmp_tensor_free(&st->p[i].g);
        free(st->p[i].m);
        free(st->p[i].v);
    }
    free(st->p);
    for (int s = 0; s < st->lay.nstages; s++)
        xmp_mesh_destroy(st->meshes[s]);
    free(st->work);
    free(st->ranks);
    free(st->pidx);
    free(st);
}

int xmp_gpt2_stage_index(const xmp_gpt2_stage_t *st)
{
    return st->stage;
}

xmp_stage_ops_t xmp_gpt2_stage_ops(xmp_gpt2_stage_t *st)
{
    xmp_stage_ops_t o;
    memset(&o, 0, sizeof o);
    o.user = st;
    o.forward = cb_forward;
    o.backward_input = cb_backward_input;
    o.backward_weight = cb_backward_weight;
    o.reduce_grads = cb_reduce;
    o.optimizer_step = cb_optimizer;
    o.activation_bytes = cb_act_bytes;
    return o;
}

int xmp_gpt2_stage_edges(const xmp_gpt2_stage_t *st, xmp_edge_cfg_t *edges, xmp_sedge_t *sedges)
{
    int n = st->lay.nstages - 1;
    for (int e = 0; e < n; e++) {
        memset(&edges[e], 0, sizeof edges[e]);
        edges[e].src = e;
        edges[e].dst = e + 1;
        edges[e].ndim = 3;
        memcpy(edges[e].shape, st->edge_shape, sizeof st->edge_shape);
        edges[e].dtype = XMESH_F32;
        edges[e].src_spec = "S(0),B";
        edges[e].dst_spec = "S(0),B";
        sedges[e].src = e;
        sedges[e].dst = e + 1;
    }
    return n;
}

void xmp_gpt2_stage_meshes(const xmp_gpt2_stage_t *st, xmp_stage_mesh_t *meshes)
{
    for (int s = 0; s < st->lay.nstages; s++) {
        meshes[s].ndim = 2;
        meshes[s].shape[0] = st->lay.dp[s];
        meshes[s].shape[1] = st->lay.tp[s];
        meshes[s].ranks = st->ranks + st->lay.rank0[s];
    }
}

void xmp_gpt2_stage_set_batch(xmp_gpt2_stage_t *st, const int *inputs, const int *targets, int step)
{
    st->inputs = inputs;
    st->targets = targets;
    st->step = step;
    memset(&st->times, 0, sizeof st->times);
    st->comm0 = xmp_comm_seconds();
}

void xmp_gpt2_stage_times(const xmp_gpt2_stage_t *st, xmp_gpt2_stage_times_t *t)
{
    *t = st->times;
    t->comm_s = xmp_comm_seconds() - st->comm0;
}

double xmp_gpt2_stage_edge_seconds(xmp_gpt2_stage_t *st, int s, int strategy)
{
    if (s < 0 || s + 1 >= st->lay.nstages)
        return 0;
    xmesh_layout_t a = {3, st->edge_shape, XMESH_F32, st->meshes[s]->xmesh, "S(0),B"};
    xmesh_layout_t b = {3, st->edge_shape, XMESH_F32, st->meshes[s + 1]->xmesh, "S(0),B"};
    xmesh_plan_params_t pp = XMESH_PLAN_PARAMS_INITIALIZER;
    if (strategy >= 0)
        pp.strategy = (xmesh_strategy_t)strategy;
    xmesh_plan_t plan = NULL;
    xmesh_plan_info_t info;
    double t = 0;
    if (xmesh_plan_create(st->ctx, &a, &b, &pp, &plan) == XMESH_SUCCESS &&
        xmesh_plan_get_info(plan, &info) == XMESH_SUCCESS)
        t = info.predicted_s;
    xmesh_plan_destroy(plan);
    return t;
}

int xmp_gpt2_stage_gather(xmp_gpt2_stage_t *st, xmp_gpt2_t *full)
{
    /* Every tensor (id, layer) once, in llm.c order: its stage's mesh
     * gathers it, the stage's first rank sends it to rank 0. wte comes from
     * the first stage. */
    int L = st->cfg.num_layers, rc = 0;
    for (int id = 0; id < NPT; id++) {
        const xmp_gpt2_param_info_t *pi = &full->ptab[id];
        int nl = is_per_layer(id) ? L : 1;
        size_t per = pi->numel / (size_t)nl;
        for (int l = 0; l < nl; l++) {
            int layer = is_per_layer(id) ? l : -1;
            int item = id == XMP_GPT2_WTE || id == XMP_GPT2_WPE ? 0
                       : is_per_layer(id)                       ? l + 1
                                                                : st->lay.nitems - 1;
            int s = st->lay.stage_of[item], src = st->lay.rank0[s];
            float *buf = NULL;
            if (st->stage == s || st->rank == 0)
                buf = malloc(sizeof(float) * per);
            if ((st->stage == s || st->rank == 0) && !buf)
                rc = -1;
            if (st->stage == s && buf &&
                xmp_tensor_gather_full(&st->p[pindex(st, id, layer)].w, buf))
                rc = -1;
            if (src != 0) {
                if (st->rank == src && buf)
                    MPI_Send(buf, (int)per, MPI_FLOAT, 0, 77, st->comm);
                else if (st->rank == 0 && buf)
                    MPI_Recv(buf, (int)per, MPI_FLOAT, src, 77, st->comm, MPI_STATUS_IGNORE);
            }
            if (st->rank == 0 && buf)
                memcpy(full->params + pi->offset + (size_t)(layer >= 0 ? layer : 0) * per, buf,
                       per * sizeof(float));
            free(buf);
        }
    }
    int all = 0;
    MPI_Allreduce(&rc, &all, 1, MPI_INT, MPI_MIN, st->comm);
    return all;
}
