/* GPT-2 pipeline stages of SBP-parallel layers driven by a strategy: see gpt2_par.h. */
#include "models/gpt2_par.h"

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

#define NPT XMP_GPT2_NUM_PARAM_TENSORS
#define NAX XMP_MAX_MESH_DIMS

/* ------------------------------------------------------------- classes */

/* Parameter classes in llm.c order (index = XMP_GPT2_*). */
static const char *const pclass[NPT] = {
    "wte",   "wpe",   "ln1.w", "ln1.b", "qkv.w",    "qkv.b",    "attproj.w", "attproj.b",
    "ln2.w", "ln2.b", "fc.w",  "fc.b",  "fcproj.w", "fcproj.b", "lnf.w",     "lnf.b"};

enum { A_X, A_LN1, A_QKV, A_ATT, A_LN2, A_FCH, A_GELU, A_LNF, A_LOGITS, NACT };
static const char *const aclass[NACT] = {"act.x",   "act.ln1",  "act.qkv", "act.att",   "act.ln2",
                                         "act.fch", "act.gelu", "act.lnf", "act.logits"};

/* ------------------------------------------------------------ built-ins */

/* Per-axis role in a built-in: data (batch split, parameters B), tensor
 * (Megatron's tensor-parallel axis), and the three roles of AutoDDL's 3-D
 * matmul (paper 000, section 4.3): rows R, output columns A, contracted K. */
enum { R_DATA, R_TP, R_3R, R_3A, R_3K };

/* SBP text of class name on an axis of role r. */
static const char *role_sbp(int r, const char *cls)
{
    static const struct {
        const char *cls, *tp, *a, *k;
    } t[] = {
        /*  class        megatron tp  3d A     3d K */
        {"wte", "S(0)", "S(0)", "S(1)"},
        {"wpe", "B", "B", "B"},
        {"ln1.w", "B", "B", "B"},
        {"ln1.b", "B", "B", "B"},
        {"qkv.w", "S(1)", "S(1)", "S(3)"},
        {"qkv.b", "S(1)", "S(1)", "B"},
        {"attproj.w", "S(1)", "S(0)", "S(1)"},
        {"attproj.b", "B", "S(0)", "B"},
        {"ln2.w", "B", "B", "B"},
        {"ln2.b", "B", "B", "B"},
        {"fc.w", "S(0)", "S(0)", "S(1)"},
        {"fc.b", "S(0)", "S(0)", "B"},
        {"fcproj.w", "S(1)", "S(0)", "S(1)"},
        {"fcproj.b", "B", "S(0)", "B"},
        {"lnf.w", "B", "B", "B"},
        {"lnf.b", "B", "B", "B"},
        {"act.x", "B", "S(1)", "S(1)"},
        {"act.ln1", "B", "B", "S(2)"},
        {"act.qkv", "S(3)", "S(3)", "S(3)"},
        {"act.att", "S(2)", "B", "S(2)"},
        {"act.ln2", "B", "B", "S(2)"},
        {"act.fch", "S(2)", "S(2)", "S(2)"},
        {"act.gelu", "S(2)", "B", "S(2)"},
        {"act.lnf", "B", "B", "S(2)"},
        {"act.logits", "S(2)", "S(2)", "S(2)"},
    };
    int is_act = !strncmp(cls, "act.", 4);
    if (r == R_DATA || r == R_3R)
        return is_act ? "S(0)" : "B";
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(t[i].cls, cls))
            return r == R_TP ? t[i].tp : r == R_3A ? t[i].a : t[i].k;
    return "B";
}

int xmp_gpt2_strategy_builtin(const char *name, int naxes, char *text, size_t n, char *err,
                              size_t errlen)
{
    int role[NAX], depth = -1; /* axonn: the axis the weights are stored split over */
    if (naxes < 1 || naxes > NAX) {
        snprintf(err, errlen, "built-in strategy '%s': mesh of %d axes (must be 1..%d)", name,
                 naxes, NAX);
        return -1;
    }
    if (!strcmp(name, "dp")) {
        for (int a = 0; a < naxes; a++)
            role[a] = R_DATA;
    } else if (!strcmp(name, "megatron")) {
        for (int a = 0; a < naxes; a++)
            role[a] = a == naxes - 1 ? R_TP : R_DATA;
    } else if (!strcmp(name, "3d")) {
        /* The last three axes are AutoDDL's (R, A, K); a 4th (leading) axis is
         * data parallel; on fewer axes the last roles are kept (A, K / K). */
        static const int r3[3] = {R_3R, R_3A, R_3K};
        for (int a = 0; a < naxes; a++) {
            int k = 3 - (naxes - a);
            role[a] = k < 0 ? R_DATA : r3[k];
        }
    } else if (!strcmp(name, "axonn")) {
        if (naxes < 3) {
            snprintf(err, errlen,
                     "built-in strategy 'axonn' needs a mesh of 3 or 4 axes (3d's rows axis is "
                     "the depth axis its weights are stored split over); this mesh has %d",
                     naxes);
            return -1;
        }
        static const int r3[3] = {R_3R, R_3A, R_3K};
        for (int a = 0; a < naxes; a++) {
            int k = 3 - (naxes - a);
            role[a] = k < 0 ? R_DATA : r3[k];
        }
        depth = naxes - 3;
    } else {
        return 1;
    }
    size_t at = 0;
    int w = snprintf(text, n, "# GPT-2 built-in '%s' for %d mesh axes (roles:", name, naxes);
    at += w > 0 ? (size_t)w : 0;
    static const char *rn[] = {"data", "tensor", "3d-rows/depth", "3d-cols", "3d-contracted"};
    for (int a = 0; a < naxes && at < n; a++) {
        w = snprintf(text + at, n - at, " %s", rn[role[a]]);
        at += w > 0 ? (size_t)w : 0;
    }
    if (at < n) {
        w = snprintf(text + at, n - at, ")\nstrategy %s axes=%d\n", name, naxes);
        at += w > 0 ? (size_t)w : 0;
    }
    for (int i = 0; i < NPT + NACT && at < n; i++) {
        const char *cls = i < NPT ? pclass[i] : aclass[i - NPT];
        w = snprintf(text + at, n - at, "%s =", cls);
        at += w > 0 ? (size_t)w : 0;
        for (int a = 0; a < naxes && at < n; a++) {
            w = snprintf(text + at, n - at, "%s%s", a ? "," : " ", role_sbp(role[a], cls));
            at += w > 0 ? (size_t)w : 0;
        }
        /* AxoNN (paper 001, section III-B): the weight matrices, replicated
         * over the depth axis by 3d, are stored split over it once more
         * (dim 0); gathered before use, gradients reduce-scattered. */
        int weight = i == XMP_GPT2_WTE || i == XMP_GPT2_QKVW || i == XMP_GPT2_ATTPROJW ||
                     i == XMP_GPT2_FCW || i == XMP_GPT2_FCPROJW;
        for (int a = 0; depth >= 0 && weight && a < naxes && at < n; a++) {
            const char *v = a == depth ? "S(0)" : role_sbp(role[a], cls);
            w = snprintf(text + at, n - at, "%s%s", a ? "," : " store ", v);
            at += w > 0 ? (size_t)w : 0;
        }
        if (at < n) {
            w = snprintf(text + at, n - at, "\n");
            at += w > 0 ? (size_t)w : 0;
        }
    }
    if (at >= n) {
        snprintf(err, errlen, "built-in strategy '%s': text longer than %zu bytes", name, n);
        return -1;
    }
    return 0;
}

/* ----------------------------------------------------------- validation */

int xmp_gpt2_strategy_check(const xmp_strategy_t *s, const xmp_gpt2_config_t *c, int stage,
                            int ndim, const int *shape, char *err, size_t errlen)
{
    if (s->naxes != ndim)
        return xmp_err_buf(err, errlen,
                           "stage %d: strategy '%s' (%s) has axes=%d, the stage mesh has %d axes",
                           stage, s->name, s->source, s->naxes, ndim);
    /* A stage holding every layer kind: the embedding, one block and the head (gpt2_graph.h);
     * its classes and, after the model's own rule on act.x, every op through the deduction. */
    xmp_graph_t g;
    char where[32];
    snprintf(where, sizeof where, "stage %d", stage);
    if (xmp_gpt2_graph(c, 1, 1, 1, &g))
        return xmp_err_buf(err, errlen, "%s: %s", where, xmp_last_error());
    int rc = xmp_strategy_check_graph_classes(s, &g, where, err, errlen);
    /* The tensor between stages: S or B (a partial sum would cross as P). */
    const xmp_strategy_entry_t *x = xmp_strategy_get(s, "act.x");
    for (int a = 0; !rc && a < ndim; a++)
        if (x->sbp[a].kind == XMP_P)
            rc = xmp_err_buf(err, errlen,
                             "stage %d: class act.x: mesh axis %d: P: missing SBP rule 'partial "
                             "residual stream' (the tensor between stages must be S or B)",
                             stage, a);
    /* The token ids (and targets) follow act.x's batch/sequence split. */
    xmp_sbp_t tok[NAX];
    for (int a = 0; !rc && a < NAX; a++) {
        xmp_sbp_t v = a < ndim ? x->sbp[a] : xmp_sbp_b();
        tok[a] = v.kind == XMP_S && v.dim < 2 ? v : xmp_sbp_b();
    }
    if (!rc)
        rc = xmp_strategy_check_graph_rules(s, &g, tok, where, err, errlen);
    xmp_graph_free(&g);
    if (rc)
        return -1;
    /* The attention output (Bm, T, NH, hs) is used as (Bm, T, C): the heads
     * must split evenly over the axes that split them. */
    const xmp_strategy_entry_t *q = xmp_strategy_get(s, "act.qkv");
    int hsplit = 1;
    char axes[64] = "";
    for (int a = 0; a < ndim; a++)
        if (q->sbp[a].kind == XMP_S && q->sbp[a].dim == 3) {
            hsplit *= shape[a];
            size_t l = strlen(axes);
            snprintf(axes + l, sizeof axes - l, "%s%d", l ? "," : "", a);
        }
    if (c->num_heads % hsplit)
        return xmp_err_buf(
            err, errlen,
            "stage %d: %d heads cannot be split over tensor-parallel degree %d (heads "
            "%% tp must be 0): class act.qkv splits the heads over mesh axes %s",
            stage, c->num_heads, hsplit, axes);
    return 0;
}

/* ---------------------------------------------------------------- state */

/* One parameter tensor of this stage (one layer's slice of a stacked tensor), kept by the
 * shared engine (nn/param.h): P.w the compute copy (the strategy's compute SBP), P.g the
 * gradient accumulator (w's SBP where S, P where B), P.r the step's reduced gradient (storage
 * SBP, made in R), P.s the stored shard when the storage SBP differs (P.sharded), P.state[0..1]
 * the AdamW moments of the stored copy, P.pre the prefetched gather (cb_optimizer only). */
typedef struct {
    int id, layer; /* XMP_GPT2_*, layer (-1: not per layer) */
    xmp_param_t P;
} par_t;

/* The tensor AdamW updates: the stored shard, or the compute copy. */
static xmp_tensor_t *stored(par_t *q)
{
    return xmp_param_stored(&q->P);
}

/* Saved activations of one transformer block for one microbatch, and the
 * SBPs each had before it was boxed to its class (for the backward). */
typedef struct {
    xmp_norm_cache_t c1, c2;
    xmp_tensor_t ln1, qkv, att, res1, ln2, fch, fcg, res2;
    xmp_attn_cache_t ac; /* attention probabilities and what its backward needs */
    xmp_sbp_t s_qkv[NAX], s_att[NAX], s_res1[NAX], s_fch[NAX], s_fcg[NAX], s_res2[NAX];
    xmp_sbp_t s_y1[NAX], s_y2[NAX]; /* projections' outputs (before the residual add) */
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
    xmp_norm_cache_t cf;
    xmp_sbp_t s_logits[NAX]; /* logits before boxing to act.logits */
    blk_t *b;
    wq_t *wq;
    int nwq, capwq;
    int64_t bytes;
} mb_t;

struct xmp_gpt2_stage {
    MPI_Comm comm;
    xmp_graph_t graph; /* the model with one block (gpt2_graph.h): the parameters' shapes */
    /* the driver's progress while it runs a step (set_progress), NULL otherwise */
    void (*progress)(void *arg);
    void *progress_arg;
    int rank, size;
    xmesh_ctx_t ctx;
    xmp_gpt2_config_t cfg;
    xmp_gpt2_train_cfg_t tc;
    xmp_stage_layout_t lay;
    xmp_mesh_t *meshes[XMP_MAX_STAGES];
    char xspec[XMP_MAX_STAGES][64]; /* act.x of each stage: the boundary tensor */
    char wspec[XMP_MAX_STAGES][64]; /* wte's storage SBP of each stage (tied copies) */
    int *ranks;                     /* all stage ranks, stage after stage */
    int stage, Bm, nax, msize;
    xmp_mesh_t *mesh;
    xmp_sbp_t psbp[NPT][NAX];   /* this stage's compute SBP per parameter class */
    xmp_sbp_t pstore[NPT][NAX]; /* storage SBP (== psbp unless the strategy says 'store') */
    xmp_sbp_t act[NACT][NAX];   /* this stage's SBP per activation class */
    int has_e, has_l, l0, nl;   /* blocks l0 .. l0+nl-1 */
    par_t *p;
    int np;
    int *pidx; /* (id, layer+1) -> index in p, or -1 */
    mb_t *mb;
    const int *inputs, *targets;
    int step;
    xmp_gpt2_stage_times_t times;
    double comm0;
    /* tied wte across the first and last stage */
    int tie_first, tie_last;
    xmesh_plan_t tie_fl, tie_lf;
    int64_t edge_shape[3];
    /* Virtual stages: the other tied stage when this rank also holds it (V shape), and
     * whether this stage's gradients of the step are reduced (the exchange runs after both). */
    xmp_gpt2_stage_t *tie_peer;
    int reduced;
    xmp_overlap_t ov; /* overlap switches (XMP_OVERLAP, nn/overlap.h) */
    /* The object whose tied-wte plans this one uses: itself, or with several objects per rank
     * the first (every rank's first create made the same plans, matching across groups). */
    xmp_gpt2_stage_t *tie_plans;
    /* sampling: logits of row 0 at position cap_pos of microbatch 0 (-1: off) */
    int cap_pos, cap_ok;
    float *cap;
};

/* Lets queued boundary transfers move between layers (the driver's progress, when given). */
static void progress(const xmp_gpt2_stage_t *st)
{
    if (st->progress)
        st->progress(st->progress_arg);
}

static int pindex(const xmp_gpt2_stage_t *st, int id, int layer)
{
    return st->pidx[id * (st->cfg.num_layers + 1) + layer + 1];
}
static const xmp_tensor_t *PT(const xmp_gpt2_stage_t *st, int id, int layer)
{
    return &st->p[pindex(st, id, layer)].P.w;
}

static int is_per_layer(int id)
{
    return id != XMP_GPT2_WTE && id != XMP_GPT2_WPE && id != XMP_GPT2_LNFW && id != XMP_GPT2_LNFB;
}

/* Gradient accumulator SBP of a parameter with compute SBP s. */
static void acc_sbp(const xmp_sbp_t *s, xmp_sbp_t *g)
{
    xmp_param_acc_sbp(s, g);
}

static int add_param(xmp_gpt2_stage_t *st, const xmp_gpt2_t *full, int id, int layer)
{
    if (pindex(st, id, layer) >= 0)
        return 0; /* wte of a stage with both E and L */
    par_t *q = &st->p[st->np];
    memset(q, 0, sizeof *q);
    q->id = id;
    q->layer = layer;
    /* one layer's slice, as the model graph has it (qkv as (3, NH, hs, C) views) */
    const xmp_gparam_t *gp = NULL;
    for (int i = 0; i < st->graph.nparam && !gp; i++)
        if (!strcmp(st->graph.param[i].cls, pclass[id]))
            gp = &st->graph.param[i];
    if (!gp) {
        xmp_err(XMESH_ERR_INVALID_ARGUMENT, "no parameter of class %s in the graph", pclass[id]);
        return -1;
    }
    int nd = gp->nd;
    const int64_t *shape = gp->dim;
    xmp_sbp_t sg[NAX];
    acc_sbp(st->psbp[id], sg);
    const xmp_gpt2_param_info_t *pi = &full->ptab[id];
    size_t per = pi->numel / (is_per_layer(id) ? (size_t)st->cfg.num_layers : 1);
    const float *src = full->params + pi->offset + (layer >= 0 ? (size_t)layer * per : 0);
    /* compute copy, stored shard where the storage SBP differs, AdamW's two moments */
    if (xmp_param_init(&q->P, st->mesh, nd, shape, st->psbp[id], st->pstore[id], src, 2, sg))
        return -1;
    st->pidx[id * (st->cfg.num_layers + 1) + layer + 1] = st->np++;
    return 0;
}

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
    xmp_norm_cache_free(&m->cf);
    m->live = 0;
    m->bytes = 0;
}

static int64_t tbytes(const xmp_tensor_t *t)
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
    int pw = pindex(st, id, layer), pb = pindex(st, bid, layer);
    if (xmp_linear_backward_input(dy, PT(st, id, layer), dx))
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
    CHK(xmp_layernorm_forward(x, PT(st, XMP_GPT2_LN1W, layer), PT(st, XMP_GPT2_LN1B, layer),
                              &b->ln1, &b->c1));
    CHK(to_class(&b->ln1, st->act[A_LN1], NULL)); /* its backward: boxed to x's SBP */
    /* GEMM + its collective (--overlap coll-matmul: piecewise, nn/overlap.h (e)) */
    CHK(xmp_linear_forward_box(&st->ov, &b->ln1, PT(st, XMP_GPT2_QKVW, layer),
                               PT(st, XMP_GPT2_QKVB, layer), st->act[A_QKV], NULL, b->s_qkv,
                               &b->qkv));
    CHK(xmp_attention_forward(&b->qkv, &y4, &b->ac));
    view_heads(&y4, 0, NH, hs);
    b->att = y4;
    memset(&y4, 0, sizeof y4);
    CHK(to_class(&b->att, st->act[A_ATT], b->s_att));
    progress(st);
    /* y boxed to the SBP of the sum, so the add needs no collective */
    CHK(xmp_linear_forward_box(&st->ov, &b->att, PT(st, XMP_GPT2_ATTPROJW, layer),
                               PT(st, XMP_GPT2_ATTPROJB, layer), NULL, x, b->s_y1, &y));
    CHK(xmp_add_forward(x, &y, &b->res1));
    xmp_tensor_free(&y);
    CHK(to_class(&b->res1, st->act[A_X], b->s_res1));
    /* MLP: res2 = res1 + fcproj(gelu(fc(ln2(res1)))) */
    CHK(xmp_layernorm_forward(&b->res1, PT(st, XMP_GPT2_LN2W, layer), PT(st, XMP_GPT2_LN2B, layer),
                              &b->ln2, &b->c2));
    CHK(to_class(&b->ln2, st->act[A_LN2], NULL));
    CHK(xmp_linear_forward_box(&st->ov, &b->ln2, PT(st, XMP_GPT2_FCW, layer),
                               PT(st, XMP_GPT2_FCB, layer), st->act[A_FCH], NULL, b->s_fch,
                               &b->fch));
    CHK(xmp_gelu_forward(&b->fch, &b->fcg));
    CHK(to_class(&b->fcg, st->act[A_GELU], b->s_fcg));
    progress(st);
    CHK(xmp_linear_forward_box(&st->ov, &b->fcg, PT(st, XMP_GPT2_FCPROJW, layer),
                               PT(st, XMP_GPT2_FCPROJB, layer), NULL, &b->res1, b->s_y2, &y));
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
    CHK(xmp_layernorm_backward(&dln, &b->res1, PT(st, XMP_GPT2_LN2W, layer), &b->c2, &lx, &lw,
                               &lb));
    xmp_tensor_free(&dln);
    CHK(add_into(&dres1, &lx));
    CHK(accumulate(&st->p[pindex(st, XMP_GPT2_LN2W, layer)], &lw));
    CHK(accumulate(&st->p[pindex(st, XMP_GPT2_LN2B, layer)], &lb));
    progress(st);
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
    CHK(xmp_layernorm_backward(&dln, x, PT(st, XMP_GPT2_LN1W, layer), &b->c1, &lx, &lw, &lb));
    xmp_tensor_free(&dln);
    CHK(add_into(&dxa, &lx));
    CHK(accumulate(&st->p[pindex(st, XMP_GPT2_LN1W, layer)], &lw));
    CHK(accumulate(&st->p[pindex(st, XMP_GPT2_LN1B, layer)], &lb));
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
        m->bytes += tbytes(&b->ln1) + tbytes(&b->qkv) + tbytes(&b->att) + tbytes(&b->res1) +
                    tbytes(&b->ln2) + tbytes(&b->fch) + tbytes(&b->fcg) + tbytes(&b->ac.att);
        return rc;
    }
    if (st->tc.recompute == XMP_RECOMPUTE_SELECTIVE) {
        xmp_tensor_t y = {0};
        xmp_attn_cache_free(&b->ac);
        int rc = xmp_attention_forward(&b->qkv, &y, &b->ac) != XMESH_SUCCESS;
        xmp_tensor_free(&y);
        m->bytes += tbytes(&b->ac.att);
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

static int cb_forward(void *user, int mbi, const void *const *in, void *const *out, double *loss)
{
    xmp_gpt2_stage_t *st = user;
    double t0 = MPI_Wtime();
    mb_t *m = &st->mb[mbi];
    const xmp_gpt2_config_t *c = &st->cfg;
    xmp_tensor_t logits = {0}, tgt = {0};
    if (m->live)
        mb_free(st, m);
    m->live = 1;
    if (st->has_e) {
        CHK(token_tensor(st, mbi, st->inputs, &m->tok));
        CHK(xmp_embedding_forward(&m->tok, PT(st, XMP_GPT2_WTE, -1), &m->x0));
        CHK(to_class(&m->x0, st->act[A_X], NULL));
        CHK(pos_add(&m->x0, PT(st, XMP_GPT2_WPE, -1)));
    } else {
        CHK(resid_tensor(st, &m->x0));
        if (m->x0.lcount)
            memcpy(m->x0.data, in[0], (size_t)m->x0.lcount * 4);
    }
    m->bytes = tbytes(&m->x0);
    const xmp_tensor_t *x = &m->x0;
    for (int k = 0; k < st->nl; k++) {
        blk_t *b = &m->b[k];
        CHK(block_forward(st, st->l0 + k, x, b));
        drop_for_recompute(st, b);
        m->bytes += tbytes(&b->ln1) + tbytes(&b->qkv) + tbytes(&b->att) + tbytes(&b->res1) +
                    tbytes(&b->ln2) + tbytes(&b->fch) + tbytes(&b->fcg) + tbytes(&b->res2) +
                    tbytes(&b->ac.att);
        x = &b->res2;
    }
    if (st->has_l) {
        CHK(xmp_layernorm_forward(x, PT(st, XMP_GPT2_LNFW, -1), PT(st, XMP_GPT2_LNFB, -1), &m->lnf,
                                  &m->cf));
        CHK(to_class(&m->lnf, st->act[A_LNF], NULL));
        CHK(xmp_linear_forward(&m->lnf, PT(st, XMP_GPT2_WTE, -1), NULL, &logits));
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
        m->bytes += tbytes(&m->lnf) + tbytes(&m->dlogits);
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

static int cb_backward_input(void *user, int mbi, const void *const *gout, void *const *gin)
{
    xmp_gpt2_stage_t *st = user;
    double t0 = MPI_Wtime();
    mb_t *m = &st->mb[mbi];
    xmp_tensor_t d = {0}, dx = {0}, dl = {0}, dtab = {0}, lw = {0}, lb = {0}, dw = {0};
    const xmp_tensor_t *xl = stage_out(st, m);
    if (st->has_l) {
        CHK(from_class(st, &m->dlogits, m->s_logits));
        CHK(xmp_linear_backward_input(&m->dlogits, PT(st, XMP_GPT2_WTE, -1), &dl));
        CHK(queue_w(m, &m->dlogits, &m->lnf, pindex(st, XMP_GPT2_WTE, -1), -1));
        CHK(xmp_layernorm_backward(&dl, xl, PT(st, XMP_GPT2_LNFW, -1), &m->cf, &d, &lw, &lb));
        xmp_tensor_free(&dl);
        CHK(accumulate(&st->p[pindex(st, XMP_GPT2_LNFW, -1)], &lw));
        CHK(accumulate(&st->p[pindex(st, XMP_GPT2_LNFB, -1)], &lb));
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
        CHK(pos_grad(&d, PT(st, XMP_GPT2_WPE, -1), &dw));
        CHK(accumulate(&st->p[pindex(st, XMP_GPT2_WPE, -1)], &dw));
        /* The table gradient comes P over the axes that split the tokens: it
         * is summed locally here and reduced once per step in R. */
        CHK(xmp_embedding_backward(&d, &m->tok, PT(st, XMP_GPT2_WTE, -1), &dtab));
        CHK(accumulate(&st->p[pindex(st, XMP_GPT2_WTE, -1)], &dtab));
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

static int cb_backward_weight(void *user, int mbi)
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
            progress(st);
    }
    m->nwq = 0;
    mb_free(st, m); /* nothing of this microbatch is needed any more */
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
    par_t *qf = &f->p[pindex(f, XMP_GPT2_WTE, -1)], *ql = &l->p[pindex(l, XMP_GPT2_WTE, -1)];
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

static int cb_reduce(void *user)
{
    xmp_gpt2_stage_t *st = user;
    double t0 = MPI_Wtime();
    /* defer-grad: every reduction posted first (nonblocking), then waited in the same order;
     * the same collectives on the same data as the blocking loop. */
    for (int i = 0; st->ov.defer_grad && i < st->np; i++)
        if (xmp_param_reduce_start(&st->p[i].P)) {
            (void)xmp_err(XMESH_ERR_INVALID_USAGE, "gpt2 stage %d: gradient reduction of %s: %s",
                          st->stage, pclass[st->p[i].id], xmp_last_error());
            return 1;
        }
    for (int i = 0; i < st->np; i++) {
        par_t *q = &st->p[i];
        /* Once per step: P -> B over the axes where the parameter is
         * replicated (the data-parallel all-reduce), or P -> S where its
         * storage is sharded (reduce-scatter). */
        if (st->ov.defer_grad ? xmp_param_reduce_wait(&q->P) : xmp_param_reduce(&q->P)) {
            (void)xmp_err(XMESH_ERR_INVALID_USAGE, "gpt2 stage %d: gradient reduction of %s: %s",
                          st->stage, pclass[q->id], xmp_last_error());
            return 1;
        }
    }
    st->reduced = 1;
    if (st->tie_peer) {
        if (st->tie_peer->reduced && tie_exchange_local(st))
            return 1;
    } else if (st->tie_fl && (st->stage == st->tie_first || st->stage == st->tie_last) &&
               tie_exchange(st, &st->p[pindex(st, XMP_GPT2_WTE, -1)])) {
        return 1;
    }
    st->times.r_s += MPI_Wtime() - t0;
    return 0;
}

static int cb_optimizer(void *user)
{
    xmp_gpt2_stage_t *st = user;
    double t0 = MPI_Wtime();
    const xmp_gpt2_train_cfg_t *t = &st->tc;
    st->reduced = 0;
    for (int i = 0; i < st->np; i++) {
        par_t *q = &st->p[i];
        xmp_tensor_t *w = stored(q);
        if (w->lcount && q->P.r.data)
            xmp_adamw(xmp_f32(w), xmp_f32(&q->P.r), q->P.state[0], q->P.state[1], (size_t)w->lcount,
                      t->lr, t->beta1, t->beta2, t->eps, t->wd, st->step + 1);
        /* Sharded: the updated shards are all-gathered into the compute copy
         * the next step uses (prefetch: started here, waited after the updates of the
         * parameters that follow, in the same order). */
        if (st->ov.prefetch ? xmp_param_gather_start(&q->P) : xmp_param_gather(&q->P)) {
            (void)xmp_err(XMESH_ERR_INVALID_USAGE, "gpt2 stage %d: gathering %s: %s", st->stage,
                          pclass[q->id], xmp_last_error());
            return 1;
        }
        xmp_param_zero_grad(&q->P, 0);
    }
    for (int i = 0; st->ov.prefetch && i < st->np; i++) {
        par_t *q = &st->p[i];
        if (xmp_param_gather_wait(&q->P)) {
            (void)xmp_err(XMESH_ERR_INVALID_USAGE, "gpt2 stage %d: gathering %s: %s", st->stage,
                          pclass[q->id], xmp_last_error());
            return 1;
        }
    }
    for (int k = 0; k < st->tc.M; k++)
        if (st->mb[k].live)
            mb_free(st, &st->mb[k]);
    st->times.o_s += MPI_Wtime() - t0;
    return 0;
}

static void cb_set_progress(void *user, void (*fn)(void *arg), void *arg)
{
    xmp_gpt2_stage_t *st = user;
    st->progress = fn;
    st->progress_arg = arg;
}

static int64_t cb_act_bytes(void *user)
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

/* ------------------------------------------------------------- lifecycle */

/* SBPs of class cls from strategy s (axes beyond naxes: B). */
static void class_sbp(const xmp_strategy_t *s, const char *cls, xmp_sbp_t *out)
{
    const xmp_strategy_entry_t *e = xmp_strategy_get(s, cls);
    for (int a = 0; a < NAX; a++)
        out[a] = e && a < s->naxes ? e->sbp[a] : xmp_sbp_b();
}

/* Storage SBPs of class cls (its compute SBP when the strategy gives none). */
static void class_store(const xmp_strategy_t *s, const char *cls, xmp_sbp_t *out)
{
    const xmp_strategy_entry_t *e = xmp_strategy_get(s, cls);
    class_sbp(s, cls, out);
    for (int a = 0; e && e->has_store && a < s->naxes; a++)
        out[a] = e->store[a];
}

/* force: -2: the stage of this rank; else this rank's stage (-1: none). */
static int stage_create(MPI_Comm comm, xmesh_ctx_t ctx, const xmp_gpt2_t *full,
                        const xmp_stage_layout_t *layout, const xmp_gpt2_train_cfg_t *tc, int force,
                        xmp_gpt2_stage_t **out, char *err, size_t errlen)
{
    const xmp_gpt2_config_t *c = &full->cfg;
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    /* Argument checks: pure, the same on every rank, before any collective. */
    if (layout->nranks != size)
        return xmp_err_buf(err, errlen, "the stage meshes use %d ranks, the job has %d",
                           layout->nranks, size);
    if (tc->recompute < XMP_RECOMPUTE_NONE || tc->recompute > XMP_RECOMPUTE_SELECTIVE)
        return xmp_err_buf(err, errlen, "recompute mode %d: expected none, block or selective",
                           tc->recompute);
    if (tc->M < 1 || tc->B % tc->M)
        return xmp_err_buf(err, errlen, "--batch %d is not a multiple of --microbatches %d", tc->B,
                           tc->M);
    /* The layout's items must be the model's: E, one t per block, L (no item may name a block
     * the parameters do not have). */
    int nblk = 0;
    for (int i = 0; i < layout->nitems; i++) {
        char k = layout->kind[i];
        if (k != 'E' && k != 't' && k != 'L')
            return xmp_err_buf(err, errlen, "layout item %d is '%c': GPT-2's items are E, t and L",
                               i, k);
        nblk += k == 't';
    }
    if (nblk != c->num_layers)
        return xmp_err_buf(err, errlen, "the layout has %d transformer blocks, the model %d", nblk,
                           c->num_layers);
    xmp_overlap_t ov;
    if (xmp_overlap_from_env(&ov))
        return xmp_err_buf(err, errlen, "XMP_OVERLAP: %s", xmp_last_error());
    xmp_strategy_t *strat = calloc((size_t)layout->nstages, sizeof *strat);
    if (!strat)
        return xmp_err_buf(err, errlen, "out of memory");
    for (int s = 0; s < layout->nstages; s++) {
        char sub[512];
        if (tc->strategy) {
            strat[s] = tc->strategy[s];
        } else if (xmp_strategy_load("megatron", xmp_gpt2_strategy_builtin,
                                     XMP_GPT2_BUILTIN_STRATEGIES, layout->ndim[s], &strat[s], sub,
                                     sizeof sub)) {
            free(strat);
            return xmp_err_buf(err, errlen, "stage %d: %s", s, sub);
        }
        if (xmp_gpt2_strategy_check(&strat[s], c, s, layout->ndim[s], layout->shape[s], err,
                                    errlen)) {
            free(strat);
            return -1;
        }
    }
    xmp_gpt2_stage_t *st = calloc(1, sizeof *st);
    if (st)
        st->cap_pos = -1;
    if (!st) {
        free(strat);
        return xmp_err_buf(err, errlen, "out of memory");
    }
    st->comm = comm;
    st->rank = rank;
    st->size = size;
    st->ctx = ctx;
    st->cfg = *c;
    st->tc = *tc;
    st->tc.strategy = NULL; /* borrowed during create only */
    st->ov = ov;
    st->tie_plans = st;
    st->lay = *layout;
    st->Bm = tc->B / tc->M;
    st->stage = force == -2 ? xmp_stage_layout_stage_of_rank(layout, rank) : force;
    st->edge_shape[0] = st->Bm;
    st->edge_shape[1] = tc->T;
    st->edge_shape[2] = c->channels;
    for (int s = 0; s < layout->nstages; s++) {
        xmp_sbp_t v[NAX];
        class_sbp(&strat[s], "act.x", v);
        xmp_strategy_sbp_string(v, layout->ndim[s], st->xspec[s], sizeof st->xspec[s]);
        class_store(&strat[s], "wte", v);
        xmp_strategy_sbp_string(v, layout->ndim[s], st->wspec[s], sizeof st->wspec[s]);
    }
    if (st->stage >= 0) {
        const xmp_strategy_t *ss = &strat[st->stage];
        st->nax = layout->ndim[st->stage];
        st->msize = xmp_stage_layout_size(layout, st->stage);
        for (int id = 0; id < NPT; id++) {
            class_sbp(ss, pclass[id], st->psbp[id]);
            class_store(ss, pclass[id], st->pstore[id]);
        }
        for (int a = 0; a < NACT; a++)
            class_sbp(ss, aclass[a], st->act[a]);
    }
    free(strat);
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
        if (xmp_mesh_create(comm, ctx, layout->ndim[s], layout->shape[s],
                            st->ranks + layout->rank0[s], &st->meshes[s])) {
            xmp_err_buf(err, errlen, "stage %d mesh: %s", s, xmp_last_error());
            lfail = 1;
            break;
        }
    }
    /* Layers of this rank's stage. */
    if (!lfail && st->stage >= 0) {
        int s = st->stage;
        st->mesh = st->meshes[s];
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
        if (!st->p || !st->mb)
            lfail = 1;
        /* the parameters' classes and shapes: the model graph (gpt2_graph.h) */
        if (!lfail && xmp_gpt2_graph(c, 1, 1, 1, &st->graph))
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
            xmp_err_buf(err, errlen, "stage %d parameters: %s", s,
                        *xmp_last_error() ? xmp_last_error() : "out of memory");
    }
    int anyfail = lfail;
    if (xmp_agree(&anyfail, 1, MPI_INT, MPI_MAX, comm, "gpt2 stage setup status")) {
        if (!*err)
            xmp_err_buf(err, errlen, "stage setup: %s", xmp_last_error());
        xmp_gpt2_stage_destroy(st);
        return -1;
    }
    if (anyfail) {
        if (!lfail)
            xmp_err_buf(err, errlen, "another rank failed to set up its stage");
        xmp_gpt2_stage_destroy(st);
        return -1;
    }
    /* Tied wte: first stage holds E, last holds L; the reduced gradients
     * (compute SBP of each stage's strategy) are exchanged. */
    int first = layout->stage_of[0], last = layout->stage_of[layout->nitems - 1];
    st->tie_first = first;
    st->tie_last = last;
    if (first != last) {
        int64_t ws[2] = {c->padded_vocab_size, c->channels};
        xmesh_layout_t lf = {2, ws, XMESH_F32, st->meshes[first]->xmesh, st->wspec[first]};
        xmesh_layout_t ll = {2, ws, XMESH_F32, st->meshes[last]->xmesh, st->wspec[last]};
        int pf = xmesh_plan_create(ctx, &lf, &ll, NULL, &st->tie_fl) != XMESH_SUCCESS;
        if (!pf)
            pf = xmesh_plan_create(ctx, &ll, &lf, NULL, &st->tie_lf) != XMESH_SUCCESS;
        if (pf) {
            xmp_err_buf(err, errlen, "tied wte plans: %s", xmesh_last_error());
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
    return xmp_err_buf(err, errlen, "out of memory");
}

int xmp_gpt2_stage_create(MPI_Comm comm, xmesh_ctx_t ctx, const xmp_gpt2_t *full,
                          const xmp_stage_layout_t *layout, const xmp_gpt2_train_cfg_t *tc,
                          xmp_gpt2_stage_t **out, char *err, size_t errlen)
{
    return stage_create(comm, ctx, full, layout, tc, -2, out, err, errlen);
}

int xmp_gpt2_stages_max(const xmp_stage_layout_t *layout)
{
    int n[XMP_MAX_STAGES] = {0}, mx = 0;
    for (int s = 0; s < layout->nstages; s++)
        if (++n[layout->group[s]] > mx)
            mx = n[layout->group[s]];
    return mx;
}

int xmp_gpt2_stages_create(MPI_Comm comm, xmesh_ctx_t ctx, const xmp_gpt2_t *full,
                           const xmp_stage_layout_t *layout, const xmp_gpt2_train_cfg_t *tc,
                           xmp_gpt2_stage_t **out, char *err, size_t errlen)
{
    int rank, mine[XMP_MAX_STAGES];
    MPI_Comm_rank(comm, &rank);
    int nmax = xmp_gpt2_stages_max(layout);
    int n = xmp_stage_layout_stages_of_rank(layout, rank, mine, XMP_MAX_STAGES);
    for (int c = 0; c < nmax; c++)
        out[c] = NULL;
    for (int c = 0; c < nmax; c++) {
        if (stage_create(comm, ctx, full, layout, tc, c < n ? mine[c] : -1, &out[c], err, errlen) !=
            0) {
            for (int k = 0; k < c; k++) {
                xmp_gpt2_stage_destroy(out[k]);
                out[k] = NULL;
            }
            return -1;
        }
    }
    for (int c = 1; c < nmax; c++)
        out[c]->tie_plans = out[0];
    /* Both tied stages here: they exchange their wte gradients locally in R. */
    xmp_gpt2_stage_t *f = NULL, *l = NULL;
    for (int c = 0; c < n; c++) {
        if (out[c]->stage == out[c]->tie_first)
            f = out[c];
        if (out[c]->stage == out[c]->tie_last)
            l = out[c];
    }
    if (f && l && f != l) {
        f->tie_peer = l;
        l->tie_peer = f;
    }
    return 0;
}

void xmp_gpt2_stage_destroy(xmp_gpt2_stage_t *st)
{
    if (!st)
        return;
    xmesh_plan_destroy(st->tie_fl);
    xmesh_plan_destroy(st->tie_lf);
    free(st->cap);
    if (st->mb) {
        for (int k = 0; k < st->tc.M; k++) {
            if (st->mb[k].b)
                mb_free(st, &st->mb[k]);
            free(st->mb[k].b);
            free(st->mb[k].wq);
        }
        free(st->mb);
    }
    for (int i = 0; st->p && i < st->np; i++)
        xmp_param_free(&st->p[i].P);
    free(st->p);
    for (int s = 0; s < st->lay.nstages; s++)
        xmp_mesh_destroy(st->meshes[s]);
    free(st->ranks);
    free(st->pidx);
    xmp_graph_free(&st->graph);
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
    o.set_progress = cb_set_progress;
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
        edges[e].src_spec = st->xspec[e];
        edges[e].dst_spec = st->xspec[e + 1];
        sedges[e].src = e;
        sedges[e].dst = e + 1;
    }
    return n;
}

void xmp_gpt2_stage_meshes(const xmp_gpt2_stage_t *st, xmp_stage_mesh_t *meshes)
{
    for (int s = 0; s < st->lay.nstages; s++) {
        meshes[s].ndim = st->lay.ndim[s];
        for (int a = 0; a < st->lay.ndim[s]; a++)
            meshes[s].shape[a] = st->lay.shape[s][a];
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
    xmesh_layout_t a = {3, st->edge_shape, XMESH_F32, st->meshes[s]->xmesh, st->xspec[s]};
    xmesh_layout_t b = {3, st->edge_shape, XMESH_F32, st->meshes[s + 1]->xmesh, st->xspec[s + 1]};
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

void xmp_gpt2_stage_set_recompute(xmp_gpt2_stage_t *st, int mode)
{
    st->tc.recompute = mode;
}

int xmp_gpt2_stage_probe_bytes(xmp_gpt2_stage_t *st, double *act, double *ckpt, double *keep)
{
    *act = *ckpt = *keep = 0;
    if (st->stage < 0)
        return 0;
    size_t ntok = (size_t)st->tc.B * (size_t)st->tc.T;
    int *tok = calloc(ntok, sizeof(int));
    float *buf =
        calloc((size_t)(st->edge_shape[0] * st->edge_shape[1] * st->edge_shape[2]), sizeof(float));
    const int *in0 = st->inputs, *tg0 = st->targets;
    int rc = -1, rec = st->tc.recompute;
    if (tok && buf) {
        const void *in[1] = {buf};
        void *out[1] = {buf};
        double loss = 0;
        st->inputs = st->targets = tok;
        st->tc.recompute = XMP_RECOMPUTE_NONE;
        rc = cb_forward(st, 0, in, out, &loss) ? -1 : 0;
        mb_t *m = &st->mb[0];
        if (!rc) {
            double a = (double)m->bytes,
                   c = (double)(tbytes(&m->x0) + tbytes(&m->lnf) + tbytes(&m->dlogits)), p = 0;
            for (int k = 0; k < st->nl; k++) {
                c += (double)tbytes(&m->b[k].res2);
                p += (double)tbytes(&m->b[k].ac.att);
            }
            *act = a;
            *ckpt = c;
            *keep = a > 0 ? (a - p) / a : 1;
        }
        mb_free(st, m);
        st->tc.recompute = rec;
        st->inputs = in0;
        st->targets = tg0;
        memset(&st->times, 0, sizeof st->times);
    }
    free(tok);
    free(buf);
    return rc;
}

int xmp_gpt2_stage_gather(xmp_gpt2_stage_t *st, xmp_gpt2_t *full)
{
    return xmp_gpt2_stages_gather(&st, 1, full);
}

int xmp_gpt2_stages_gather(xmp_gpt2_stage_t *const *sts, int n, xmp_gpt2_t *full)
{
    xmp_gpt2_stage_t *st = sts[0];
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
            xmp_gpt2_stage_t *h = NULL; /* this rank's object of stage s */
            for (int k = 0; k < n; k++)
                if (sts[k]->stage == s)
                    h = sts[k];
            float *buf = NULL;
            if (h || st->rank == 0)
                buf = malloc(sizeof(float) * per);
            if ((h || st->rank == 0) && !buf)
                rc = -1;
            xmesh_result_t cr = XMESH_SUCCESS; /* communication: a peer failed or timed out */
            if (h && buf && (cr = xmp_tensor_gather_full(&h->p[pindex(h, id, layer)].P.w, buf)))
                rc = -1;
            if (src != 0 && buf && !cr) {
                if (st->rank == src)
                    cr = xmp_send(buf, (int)per, MPI_FLOAT, 0, 77, st->comm, "gpt2 gather");
                else if (st->rank == 0)
                    cr = xmp_recv(buf, (int)per, MPI_FLOAT, src, 77, st->comm, "gpt2 gather");
                if (cr)
                    rc = -1;
            }
            if (st->rank == 0 && buf)
                memcpy(full->params + pi->offset + (size_t)(layer >= 0 ? layer : 0) * per, buf,
                       per * sizeof(float));
            free(buf);
            if (cr == XMESH_ERR_TIMEOUT || cr == XMESH_ERR_REMOTE) { /* no later message */
                fprintf(stderr, "gpt2 gather: %s\n", xmp_last_error());
                goto agree;
            }
        }
    }
agree:;
    int all = rc;
    if (xmp_agree(&all, 1, MPI_INT, MPI_MIN, st->comm, "gpt2 gather status")) {
        fprintf(stderr, "gpt2 gather: %s\n", xmp_last_error());
        return -1;
    }
    return all;
}

/* ------------------------------------------------------------ checkpoints */

static const char *const ckname[NPT] = {
    "wte",   "wpe",   "ln1.w", "ln1.b", "qkv.w",    "qkv.b",    "attproj.w", "attproj.b",
    "ln2.w", "ln2.b", "fc.w",  "fc.b",  "fcproj.w", "fcproj.b", "lnf.w",     "lnf.b"};

int xmp_gpt2_stage_named(xmp_gpt2_stage_t *st, xmp_gpt2_named_t **out)
{
    *out = NULL;
    if (st->stage < 0 || st->np == 0)
        return 0;
    xmp_gpt2_named_t *a = calloc((size_t)st->np, sizeof *a);
    if (!a)
        return -1;
    for (int i = 0; i < st->np; i++) {
        par_t *q = &st->p[i];
        xmp_gpt2_named_t *e = &a[i];
        if (q->layer >= 0)
            snprintf(e->name, sizeof e->name, "h.%d.%s", q->layer, ckname[q->id]);
        else
            snprintf(e->name, sizeof e->name, "%s", ckname[q->id]);
        e->param = stored(q);
        e->m = *e->param;
        e->m.data = q->P.state[0];
        e->v = *e->param;
        e->v.data = q->P.state[1];
        e->tied_copy =
            q->id == XMP_GPT2_WTE && st->tie_first != st->tie_last && st->stage == st->tie_last;
    }
    *out = a;
    return st->np;
}

int xmp_gpt2_stage_params_changed(xmp_gpt2_stage_t *st)
{
    int rc = 0;
    for (int i = 0; st->stage >= 0 && i < st->np; i++) {
        par_t *q = &st->p[i];
        if (xmp_param_gather(&q->P)) {
            fprintf(stderr, "gpt2 stage %d: gathering %s: %s\n", st->stage, pclass[q->id],
                    xmp_last_error());
            rc = -1;
            continue;
        }
        xmp_param_zero_grad(&q->P, 0);
    }
    int all = rc;
    if (xmp_agree(&all, 1, MPI_INT, MPI_MIN, st->comm, "gpt2 parameters-changed status")) {
        fprintf(stderr, "gpt2 stage %d: %s\n", st->stage, xmp_last_error());
        return -1;
    }
    return all;
}

const xmp_gpt2_config_t *xmp_gpt2_stage_config(const xmp_gpt2_stage_t *st)
{
    return &st->cfg;
}
const xmp_gpt2_train_cfg_t *xmp_gpt2_stage_train_cfg(const xmp_gpt2_stage_t *st)
{
    return &st->tc;
}
const xmp_stage_layout_t *xmp_gpt2_stage_layout(const xmp_gpt2_stage_t *st)
{
    return &st->lay;
}

void xmp_gpt2_stage_set_lr(xmp_gpt2_stage_t *st, float lr)
{
    if (st)
        st->tc.lr = lr;
}

/* 1 when this rank holds the representative copy of a block in SBP sbp: coordinate 0 on
 * every mesh axis where the tensor is replicated. */
static int representative(const xmp_gpt2_stage_t *st, const xmp_sbp_t *sbp)
{
    for (int a = 0; a < st->nax; a++)
        if (sbp[a].kind != XMP_S && st->mesh->coord[a] != 0)
            return 0;
    return 1;
}

double xmp_gpt2_stage_grad_sumsq(const xmp_gpt2_stage_t *st)
{
    double s = 0;
    if (!st || st->stage < 0)
        return 0;
    for (int i = 0; i < st->np; i++) {
        const par_t *q = &st->p[i];
        /* the tied wte's summed gradient is held by the first and the last stage alike */
        if (q->id == XMP_GPT2_WTE && st->tie_fl && st->stage != st->tie_first)
            continue;
        if (!q->P.r.data || !representative(st, q->P.r.sbp))
            continue;
        const float *g = xmp_f32(&q->P.r);
        for (int64_t k = 0; k < q->P.r.lcount; k++)
            s += (double)g[k] * g[k];
    }
    return s;
}

void xmp_gpt2_stage_scale_grads(xmp_gpt2_stage_t *st, float scale)
{
    if (!st || st->stage < 0)
        return;
    for (int i = 0; i < st->np; i++) {
        par_t *q = &st->p[i];
        float *g = q->P.r.data ? xmp_f32(&q->P.r) : NULL;
        for (int64_t k = 0; g && k < q->P.r.lcount; k++)
            g[k] *= scale;
    }
}

void xmp_gpt2_stage_release(xmp_gpt2_stage_t *st)
{
    for (int k = 0; st && st->stage >= 0 && k < st->tc.M; k++)
        if (st->mb[k].live)
            mb_free(st, &st->mb[k]);
}

void xmp_gpt2_stage_capture_logits(xmp_gpt2_stage_t *st, int pos)
{
    if (st) {
        st->cap_pos = pos;
        st->cap_ok = 0;
    }
}

int xmp_gpt2_stage_captured_logits(const xmp_gpt2_stage_t *st, float *out)
{
    if (!st || !st->cap_ok)
        return 0;
    memcpy(out, st->cap, sizeof(float) * (size_t)st->cfg.padded_vocab_size);
    return 1;
}
