/* Serial GPT-2 (llm.c semantics); contracts in models/gpt2.h. */
#include "models/gpt2.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "models/llmc_io.h"
#include "nn/kernels.h"

/* ---- activations ---- */

typedef struct {
    float *encoded;                                /* (BT, C) */
    float *ln1, *ln1_mean, *ln1_rstd;              /* (L, BT, C), (L, BT) x2 */
    float *qkv, *atty, *att, *attproj, *residual2; /* (L,BT,3C) (L,BT,C) (L,B,NH,T,T) .. */
    float *ln2, *ln2_mean, *ln2_rstd;              /* (L, BT, C), (L, BT) x2 */
    float *fch, *fch_gelu, *fcproj, *residual3;    /* (L,BT,4C) x2, (L,BT,C) x2 */
    float *lnf, *lnf_mean, *lnf_rstd;              /* (BT, C), (BT) x2 */
    float *logits, *probs, *losses;                /* (BT, Vp) x2, (BT) */
} acts_t;

/* llm.c's 23 activation tensors minus preatt, which the backward does not need */
#define NUM_ACTS 22

static void act_sizes(const xmp_gpt2_config_t *c, int B, int T, size_t s[NUM_ACTS])
{
    size_t L = (size_t)c->num_layers, C = (size_t)c->channels, BT = (size_t)B * (size_t)T;
    size_t NH = (size_t)c->num_heads, Vp = (size_t)c->padded_vocab_size;
    size_t i = 0;
    s[i++] = BT * C;                             /* encoded */
    s[i++] = L * BT * C;                         /* ln1 */
    s[i++] = L * BT;                             /* ln1_mean */
    s[i++] = L * BT;                             /* ln1_rstd */
    s[i++] = L * BT * 3 * C;                     /* qkv */
    s[i++] = L * BT * C;                         /* atty */
    s[i++] = L * (size_t)B * NH * T * (size_t)T; /* att */
    s[i++] = L * BT * C;                         /* attproj */
    s[i++] = L * BT * C;                         /* residual2 */
    s[i++] = L * BT * C;                         /* ln2 */
    s[i++] = L * BT;                             /* ln2_mean */
    s[i++] = L * BT;                             /* ln2_rstd */
    s[i++] = L * BT * 4 * C;                     /* fch */
    s[i++] = L * BT * 4 * C;                     /* fch_gelu */
    s[i++] = L * BT * C;                         /* fcproj */
    s[i++] = L * BT * C;                         /* residual3 */
    s[i++] = BT * C;                             /* lnf */
    s[i++] = BT;                                 /* lnf_mean */
    s[i++] = BT;                                 /* lnf_rstd */
    s[i++] = BT * Vp;                            /* logits */
    s[i++] = BT * Vp;                            /* probs */
    s[i++] = BT;                                 /* losses */
}

size_t xmp_gpt2_activation_floats(const xmp_gpt2_config_t *cfg, int B, int T)
{
    size_t s[NUM_ACTS], n = 0;
    act_sizes(cfg, B, T, s);
    for (int i = 0; i < NUM_ACTS; i++)
        n += s[i];
    return n;
}

static void point_acts(const xmp_gpt2_t *m, float *base, acts_t *a)
{
    size_t s[NUM_ACTS];
    act_sizes(&m->cfg, m->B, m->T, s);
    float **p[NUM_ACTS] = {&a->encoded,   &a->ln1,      &a->ln1_mean, &a->ln1_rstd,  &a->qkv,
                           &a->atty,      &a->att,      &a->attproj,  &a->residual2, &a->ln2,
                           &a->ln2_mean,  &a->ln2_rstd, &a->fch,      &a->fch_gelu,  &a->fcproj,
                           &a->residual3, &a->lnf,      &a->lnf_mean, &a->lnf_rstd,  &a->logits,
                           &a->probs,     &a->losses};
    for (int i = 0; i < NUM_ACTS; i++) {
        *p[i] = base;
        base += s[i];
    }
}

/* ---- lifecycle ---- */

static int alloc_model(xmp_gpt2_t *m, const xmp_gpt2_config_t *cfg)
{
    memset(m, 0, sizeof *m);
    if (xmp_gpt2_param_table(cfg, m->ptab, &m->num_params) != 0)
        return -1;
    m->cfg = *cfg;
    m->params = malloc(m->num_params * sizeof(float));
    if (!m->params)
        return xmp_llmc_fail("gpt2: out of memory for %zu parameters", m->num_params);
    m->mean_loss = -1.0f;
    return 0;
}

int xmp_gpt2_init_random(xmp_gpt2_t *m, const xmp_gpt2_config_t *cfg, uint64_t seed)
{
    xmp_gpt2_t t;
    if (alloc_model(&t, cfg) != 0)
        return -1;
    for (int i = 0; i < XMP_GPT2_NUM_PARAM_TENSORS; i++)
        xmp_gpt2_init_tensor(cfg, i, seed, t.params + t.ptab[i].offset);
    *m = t;
    return 0;
}

int xmp_gpt2_load(xmp_gpt2_t *m, const char *path)
{
    xmp_gpt2_config_t cfg;
    float *p;
    size_t n;
    if (xmp_llmc_checkpoint_read(path, &cfg, &p, &n) != 0)
        return -1;
    xmp_gpt2_t t;
    memset(&t, 0, sizeof t);
    xmp_gpt2_param_table(&cfg, t.ptab, &t.num_params);
    t.cfg = cfg;
    t.params = p;
    t.mean_loss = -1.0f;
    *m = t;
    return 0;
}

int xmp_gpt2_save(const xmp_gpt2_t *m, const char *path)
{
    return xmp_llmc_checkpoint_write(path, &m->cfg, m->params, m->num_params);
}

void xmp_gpt2_free(xmp_gpt2_t *m)
{
    if (!m)
        return;
    free(m->params);
    free(m->grads);
    free(m->m);
    free(m->v);
    free(m->acts);
    free(m->dacts);
    free(m->inputs);
    free(m->targets);
    free(m->work);
    memset(m, 0, sizeof *m);
}

static int alloc_acts(xmp_gpt2_t *m, int B, int T)
{
    size_t na = xmp_gpt2_activation_floats(&m->cfg, B, T);
    size_t bt = (size_t)B * T;
    float *acts = malloc(na * sizeof(float));
    float *dacts = calloc(na, sizeof(float));
    float *grads = calloc(m->num_params, sizeof(float));
    int *in = malloc(bt * sizeof(int)), *tg = malloc(bt * sizeof(int));
    float *work = malloc((size_t)T * sizeof(float));
    if (!acts || !dacts || !grads || !in || !tg || !work) {
        free(acts);
        free(dacts);
        free(grads);
        free(in);
        free(tg);
        free(work);
        return xmp_llmc_fail("gpt2: out of memory for %zu activation floats (B=%d T=%d)", na, B, T);
    }
    m->acts = acts;
    m->dacts = dacts;
    m->grads = grads;
    m->inputs = in;
    m->targets = tg;
    m->work = work;
    m->num_acts = na;
    m->B = B;
    m->T = T;
    return 0;
}

/* ---- forward / backward / update ---- */

#define PARAM(m, idx) ((m)->params + (m)->ptab[idx].offset)
#define GRAD(m, idx) ((m)->grads + (m)->ptab[idx].offset)

int xmp_gpt2_forward(xmp_gpt2_t *m, const int *inputs, const int *targets, int B, int T)
{
    const xmp_gpt2_config_t *c = &m->cfg;
    if (!m->params)
        return xmp_llmc_fail("gpt2: forward on an uninitialized model");
    if (B <= 0 || T <= 0 || T > c->max_seq_len)
        return xmp_llmc_fail("gpt2: bad batch shape B=%d T=%d (max_seq_len %d)", B, T,
                             c->max_seq_len);
    if (m->acts && (B != m->B || T != m->T))
        return xmp_llmc_fail("gpt2: batch shape B=%d T=%d differs from the allocated B=%d T=%d", B,
                             T, m->B, m->T);
    size_t BT = (size_t)B * T;
    for (size_t i = 0; i < BT; i++) {
        if (inputs[i] < 0 || inputs[i] >= c->vocab_size)
            return xmp_llmc_fail("gpt2: input token %d at position %zu outside [0, %d)", inputs[i],
                                 i, c->vocab_size);
        if (targets && (targets[i] < 0 || targets[i] >= c->vocab_size))
            return xmp_llmc_fail("gpt2: target token %d at position %zu outside [0, %d)",
                                 targets[i], i, c->vocab_size);
    }
    if (!m->acts && alloc_acts(m, B, T) != 0)
        return -1;
    memcpy(m->inputs, inputs, BT * sizeof(int));
    if (targets)
        memcpy(m->targets, targets, BT * sizeof(int));

    const int L = c->num_layers, NH = c->num_heads, C = c->channels;
    const int V = c->vocab_size, Vp = c->padded_vocab_size, hs = C / NH;
    const size_t btc = BT * (size_t)C, att_sz = (size_t)B * NH * T * T;
    acts_t a;
    point_acts(m, m->acts, &a);

    xmp_embed_range_fwd(a.encoded, inputs, BT, PARAM(m, XMP_GPT2_WTE), 0, Vp, C);
    xmp_pos_add_fwd(a.encoded, PARAM(m, XMP_GPT2_WPE), B, T, C);
    for (int l = 0; l < L; l++) {
        const float *res = l == 0 ? a.encoded : a.residual3 + (size_t)(l - 1) * btc;
        float *ln1 = a.ln1 + l * btc, *ln1m = a.ln1_mean + l * BT, *ln1r = a.ln1_rstd + l * BT;
        float *qkv = a.qkv + l * btc * 3, *atty = a.atty + l * btc, *att = a.att + l * att_sz;
        float *attproj = a.attproj + l * btc, *res2 = a.residual2 + l * btc;
        float *ln2 = a.ln2 + l * btc, *ln2m = a.ln2_mean + l * BT, *ln2r = a.ln2_rstd + l * BT;
        float *fch = a.fch + l * btc * 4, *fchg = a.fch_gelu + l * btc * 4;
        float *fcproj = a.fcproj + l * btc, *res3 = a.residual3 + l * btc;
        size_t lc = (size_t)l * C, lcc = (size_t)l * C * C;
        xmp_layernorm_fwd(ln1, ln1m, ln1r, res, PARAM(m, XMP_GPT2_LN1W) + lc,
                          PARAM(m, XMP_GPT2_LN1B) + lc, BT, C);
        xmp_matmul_fwd(qkv, ln1, PARAM(m, XMP_GPT2_QKVW) + 3 * lcc,
                       PARAM(m, XMP_GPT2_QKVB) + 3 * lc, BT, C, 3 * C);
        xmp_attention_fwd(atty, NULL, att, qkv, B, T, NH, hs);
        xmp_matmul_fwd(attproj, atty, PARAM(m, XMP_GPT2_ATTPROJW) + lcc,
                       PARAM(m, XMP_GPT2_ATTPROJB) + lc, BT, C, C);
        xmp_residual_fwd(res2, res, attproj, btc);
        xmp_layernorm_fwd(ln2, ln2m, ln2r, res2, PARAM(m, XMP_GPT2_LN2W) + lc,
                          PARAM(m, XMP_GPT2_LN2B) + lc, BT, C);
        xmp_matmul_fwd(fch, ln2, PARAM(m, XMP_GPT2_FCW) + 4 * lcc, PARAM(m, XMP_GPT2_FCB) + 4 * lc,
                       BT, C, 4 * C);
        xmp_gelu_fwd(fchg, fch, btc * 4);
        xmp_matmul_fwd(fcproj, fchg, PARAM(m, XMP_GPT2_FCPROJW) + 4 * lcc,
                       PARAM(m, XMP_GPT2_FCPROJB) + lc, BT, 4 * C, C);
        xmp_residual_fwd(res3, res2, fcproj, btc);
    }
    const float *last = a.residual3 + (size_t)(L - 1) * btc;
    xmp_layernorm_fwd(a.lnf, a.lnf_mean, a.lnf_rstd, last, PARAM(m, XMP_GPT2_LNFW),
                      PARAM(m, XMP_GPT2_LNFB), BT, C);
    xmp_matmul_fwd(a.logits, a.lnf, PARAM(m, XMP_GPT2_WTE), NULL, BT, C, Vp);
    xmp_softmax_fwd(a.probs, a.logits, BT, V, Vp);
    if (targets) {
        xmp_crossentropy_fwd(a.losses, a.probs, targets, BT, Vp);
        float sum = 0.0f;
        for (size_t i = 0; i < BT; i++)
            sum += a.losses[i];
        m->mean_loss = sum / (float)BT;
        m->have_targets = 1;
    } else {
        m->mean_loss = -1.0f;
        m->have_targets = 0;
    }
    return 0;
}

void xmp_gpt2_zero_grad(xmp_gpt2_t *m)
{
    if (m->grads)
        memset(m->grads, 0, m->num_params * sizeof(float));
    if (m->dacts)
        memset(m->dacts, 0, m->num_acts * sizeof(float));
}

int xmp_gpt2_backward(xmp_gpt2_t *m)
{
    if (!m->acts || !m->have_targets)
        return xmp_llmc_fail("gpt2: backward needs a forward with targets first");
    const xmp_gpt2_config_t *c = &m->cfg;
    const int B = m->B, T = m->T, L = c->num_layers, NH = c->num_heads, C = c->channels;
    const int V = c->vocab_size, Vp = c->padded_vocab_size, hs = C / NH;
    const size_t BT = (size_t)B * T, btc = BT * (size_t)C, att_sz = (size_t)B * NH * T * T;
    acts_t a, d;
    point_acts(m, m->acts, &a);
    point_acts(m, m->dacts, &d);

    const float dmean = 1.0f / (float)BT;
    for (size_t i = 0; i < BT; i++)
        d.losses[i] = dmean;
    xmp_crossentropy_softmax_bwd(d.logits, d.losses, a.probs, m->targets, BT, V, Vp);
    xmp_matmul_bwd_input(d.lnf, d.logits, PARAM(m, XMP_GPT2_WTE), BT, C, Vp);
    xmp_matmul_bwd_weight(GRAD(m, XMP_GPT2_WTE), NULL, d.logits, a.lnf, BT, C, Vp);
    const float *last = a.residual3 + (size_t)(L - 1) * btc;
    float *dlast = d.residual3 + (size_t)(L - 1) * btc;
    xmp_layernorm_bwd(dlast, GRAD(m, XMP_GPT2_LNFW), GRAD(m, XMP_GPT2_LNFB), d.lnf, last,
                      PARAM(m, XMP_GPT2_LNFW), a.lnf_mean, a.lnf_rstd, BT, C);
    for (int l = L - 1; l >= 0; l--) {
        const float *res = l == 0 ? a.encoded : a.residual3 + (size_t)(l - 1) * btc;
        float *dres = l == 0 ? d.encoded : d.residual3 + (size_t)(l - 1) * btc;
        size_t lc = (size_t)l * C, lcc = (size_t)l * C * C;
        size_t o1 = l * btc, o3 = l * btc * 3, o4 = l * btc * 4, ob = l * BT;
        /* MLP block */
        xmp_residual_bwd(d.residual2 + o1, d.fcproj + o1, d.residual3 + o1, btc);
        xmp_matmul_bwd_input(d.fch_gelu + o4, d.fcproj + o1, PARAM(m, XMP_GPT2_FCPROJW) + 4 * lcc,
                             BT, 4 * C, C);
        xmp_matmul_bwd_weight(GRAD(m, XMP_GPT2_FCPROJW) + 4 * lcc, GRAD(m, XMP_GPT2_FCPROJB) + lc,
                              d.fcproj + o1, a.fch_gelu + o4, BT, 4 * C, C);
        xmp_gelu_bwd(d.fch + o4, a.fch + o4, d.fch_gelu + o4, btc * 4);
        xmp_matmul_bwd_input(d.ln2 + o1, d.fch + o4, PARAM(m, XMP_GPT2_FCW) + 4 * lcc, BT, C,
                             4 * C);
        xmp_matmul_bwd_weight(GRAD(m, XMP_GPT2_FCW) + 4 * lcc, GRAD(m, XMP_GPT2_FCB) + 4 * lc,
                              d.fch + o4, a.ln2 + o1, BT, C, 4 * C);
        xmp_layernorm_bwd(d.residual2 + o1, GRAD(m, XMP_GPT2_LN2W) + lc,
                          GRAD(m, XMP_GPT2_LN2B) + lc, d.ln2 + o1, a.residual2 + o1,
                          PARAM(m, XMP_GPT2_LN2W) + lc, a.ln2_mean + ob, a.ln2_rstd + ob, BT, C);
        /* attention block */
        xmp_residual_bwd(dres, d.attproj + o1, d.residual2 + o1, btc);
        xmp_matmul_bwd_input(d.atty + o1, d.attproj + o1, PARAM(m, XMP_GPT2_ATTPROJW) + lcc, BT, C,
                             C);
        xmp_matmul_bwd_weight(GRAD(m, XMP_GPT2_ATTPROJW) + lcc, GRAD(m, XMP_GPT2_ATTPROJB) + lc,
                              d.attproj + o1, a.atty + o1, BT, C, C);
        xmp_attention_bwd(d.qkv + o3, d.atty + o1, a.qkv + o3, a.att + l * att_sz, B, T, NH, hs,
                          m->work);
        xmp_matmul_bwd_input(d.ln1 + o1, d.qkv + o3, PARAM(m, XMP_GPT2_QKVW) + 3 * lcc, BT, C,
                             3 * C);
        xmp_matmul_bwd_weight(GRAD(m, XMP_GPT2_QKVW) + 3 * lcc, GRAD(m, XMP_GPT2_QKVB) + 3 * lc,
                              d.qkv + o3, a.ln1 + o1, BT, C, 3 * C);
        xmp_layernorm_bwd(dres, GRAD(m, XMP_GPT2_LN1W) + lc, GRAD(m, XMP_GPT2_LN1B) + lc,
                          d.ln1 + o1, res, PARAM(m, XMP_GPT2_LN1W) + lc, a.ln1_mean + ob,
                          a.ln1_rstd + ob, BT, C);
    }
    xmp_embed_range_bwd(GRAD(m, XMP_GPT2_WTE), d.encoded, m->inputs, BT, 0, Vp, C);
    xmp_pos_add_bwd(GRAD(m, XMP_GPT2_WPE), d.encoded, B, T, C);
    return 0;
}

int xmp_gpt2_update(xmp_gpt2_t *m, float lr, float beta1, float beta2, float eps,
                    float weight_decay, int t)
{
    if (!m->grads)
        return xmp_llmc_fail("gpt2: update before any backward");
    if (t < 1)
        return xmp_llmc_fail("gpt2: AdamW step t=%d must be >= 1 (t = step+1)", t);
    if (!m->m) {
        float *mm = calloc(m->num_params, sizeof(float));
        float *vv = calloc(m->num_params, sizeof(float));
        if (!mm || !vv) {
            free(mm);
            free(vv);
            return xmp_llmc_fail("gpt2: out of memory for AdamW state");
        }
        m->m = mm;
        m->v = vv;
    }
    xmp_adamw(m->params, m->grads, m->m, m->v, m->num_params, lr, beta1, beta2, eps, weight_decay,
              t);
    return 0;
}

const float *xmp_gpt2_logits(const xmp_gpt2_t *m)
{
    if (!m->acts)
        return NULL;
    acts_t a;
    point_acts(m, m->acts, &a);
    return a.logits;
}
