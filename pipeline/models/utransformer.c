/*
 * U-Transformer layers as small op tapes over unet_kernels (see utransformer.h for the model).
 *
 * Each layer is described once by a builder (xmp_ut__build, models/utransformer_plan.h) that
 * both registers the layer's parameter tensors (names, shapes, offsets) and emits its ops over
 * numbered buffers. The parameter layout is the builders' registrations for all layers; a layer
 * object here (the single-process reference) is one builder run plus an arena holding every
 * buffer's value and gradient for its micro-batch. The same tapes run on SBP tensors in
 * utransformer_sbp.c.
 */
#include "models/utransformer.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/utransformer_plan.h"
#include "nn/error.h"
#include "nn/unet_kernels.h"

/* Records the message (nn/error.h) and returns -1. */
int xmp_ut__fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int xmp_ut__fail(const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s", msg);
    return -1;
}

/* Counter-based random stream: splitmix64 over (key, counter). */
static uint64_t mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

int xmp_ut_config_init(xmp_ut_config_t *c, int base, int groups, int head_dim)
{
    if (base < 1 || base > 4096)
        return xmp_ut__fail("base channels %d: must be in [1, 4096]", base);
    if (groups == 0)
        groups = base % 4 == 0 ? 4 : 1;
    if (head_dim == 0)
        head_dim = base;
    if (groups < 1 || base % groups != 0)
        return xmp_ut__fail("groups %d: must divide the base channels %d", groups, base);
    if (head_dim < 1 || base % head_dim != 0)
        return xmp_ut__fail("head_dim %d: must divide the base channels %d", head_dim, base);
    c->base = base;
    c->groups = groups;
    c->head_dim = head_dim;
    c->cond_dim = 4 * base;
    return 0;
}

static const char *const g_names[XMP_UT_LAYERS] = {"conv_in", "down1", "down2",   "down3", "down4",
                                                   "midA",    "midB",  "up1",     "up2",   "up3",
                                                   "up4",     "out",   "conv_out"};

const char *xmp_ut_layer_name(int layer)
{
    return layer >= 0 && layer < XMP_UT_LAYERS ? g_names[layer] : "?";
}

int xmp_ut_skip_source(int layer)
{
    return layer >= XMP_UT_UP1 && layer <= XMP_UT_UP4 ? XMP_UT_DOWN4 - (layer - XMP_UT_UP1) : -1;
}

int xmp_ut_skip_dest(int layer)
{
    return layer >= XMP_UT_DOWN1 && layer <= XMP_UT_DOWN4 ? XMP_UT_UP1 + (XMP_UT_DOWN4 - layer)
                                                          : -1;
}

int xmp_ut_layer_uses_cond(const xmp_ut_config_t *c, int layer)
{
    (void)c;
    switch (layer) {
    case XMP_UT_DOWN1:
    case XMP_UT_DOWN2:
    case XMP_UT_DOWN3:
    case XMP_UT_MID_B:
    case XMP_UT_UP2:
    case XMP_UT_UP3:
    case XMP_UT_UP4:
        return 1;
    default:
        return 0;
    }
}

/* (channels multiple of C or absolute, size) of each layer's main input and output. */
static void shape_of(const xmp_ut_config_t *cf, int layer, int out, int chw[3])
{
    const int C = cf->base;
    static const int in_c[XMP_UT_LAYERS] = {0, 1, 1, 2, 4, 4, 4, 4, 4, 2, 1, 1, 1};
    static const int in_s[XMP_UT_LAYERS] = {32, 32, 16, 8, 4, 4, 4, 4, 8, 16, 32, 32, 32};
    static const int out_c[XMP_UT_LAYERS] = {1, 1, 2, 4, 4, 4, 4, 4, 2, 1, 1, 1, 0};
    static const int out_s[XMP_UT_LAYERS] = {32, 16, 8, 4, 4, 4, 4, 8, 16, 32, 32, 32, 32};
    if (layer < 0 || layer >= XMP_UT_LAYERS) {
        chw[0] = chw[1] = chw[2] = 0;
        return;
    }
    int c = out ? out_c[layer] * C : in_c[layer] * C;
    if (!out && layer == 0)
        c = XMP_UT_IN_CH;
    if (out && layer == XMP_UT_CONV_OUT)
        c = XMP_UT_OUT_CH;
    chw[0] = c;
    chw[1] = chw[2] = out ? out_s[layer] : in_s[layer];
}

void xmp_ut_layer_in_shape(const xmp_ut_config_t *c, int layer, int chw[3])
{
    shape_of(c, layer, 0, chw);
}

void xmp_ut_layer_out_shape(const xmp_ut_config_t *c, int layer, int chw[3])
{
    shape_of(c, layer, 1, chw);
}

void xmp_ut_layer_skip_shape(const xmp_ut_config_t *c, int layer, int chw[3])
{
    static const int sc[4] = {1, 2, 4, 4}, ss[4] = {32, 16, 8, 4};
    if (layer < XMP_UT_DOWN1 || layer > XMP_UT_DOWN4) {
        chw[0] = chw[1] = chw[2] = 0;
        return;
    }
    chw[0] = sc[layer - XMP_UT_DOWN1] * c->base;
    chw[1] = chw[2] = ss[layer - XMP_UT_DOWN1];
}

/* ---------------------------------------------------------------------------------------- */
/* Layer builder: parameter registration + op tape (models/utransformer_plan.h)              */
/* ---------------------------------------------------------------------------------------- */

typedef xmp_ut_op_t op_t;
typedef xmp_ut_plan_t plan_t;
enum {
    OP_CONV = XMP_UT_OP_CONV,
    OP_GN = XMP_UT_OP_GN,
    OP_SILU = XMP_UT_OP_SILU,
    OP_UP = XMP_UT_OP_UP,
    OP_CONCAT = XMP_UT_OP_CONCAT,
    OP_TOK = XMP_UT_OP_TOK,
    OP_UNTOK = XMP_UT_OP_UNTOK,
    OP_LIN = XMP_UT_OP_LIN,
    OP_ATTN = XMP_UT_OP_ATTN,
    OP_ADD = XMP_UT_OP_ADD,
    OP_BOX = XMP_UT_OP_BOX
};
#define MAX_BUF XMP_UT_MAX_BUF
#define MAX_OPS XMP_UT_MAX_OPS
#define MAX_PT XMP_UT_MAX_PT

typedef struct {
    const xmp_ut_config_t *cf;
    int layer, n, sbp;
    plan_t *pl;
    xmp_ut_params_t *pp; /* NULL: do not register */
    const char *prefix;
    int overflow;
} bld_t;

#define NONE ((size_t)-1)

/* Registers a parameter tensor of shape s; returns its layer-relative offset and sets *idx. */
static size_t add_tensor(bld_t *b, const char *name, int *idx, int ndim, int s0, int s1, int s2,
                         int s3)
{
    int s[4] = {s0, s1, s2, s3};
    size_t count = 1;
    for (int i = 0; i < ndim; i++)
        count *= (size_t)s[i];
    plan_t *pl = b->pl;
    size_t off = pl->pfloats;
    *idx = -1;
    if (pl->npt >= MAX_PT) {
        b->overflow = 1;
    } else {
        xmp_ut_ptens_t *q = &pl->pt[pl->npt];
        *idx = pl->npt++;
        q->off = off;
        q->count = count;
        q->ndim = ndim;
        for (int i = 0; i < 4; i++)
            q->shape[i] = i < ndim ? s[i] : 1;
        snprintf(q->name, sizeof q->name, "%s", name);
    }
    pl->pfloats += count;
    if (b->pp) {
        xmp_ut_params_t *p = b->pp;
        if (p->ntensors >= XMP_UT_MAX_TENSORS) {
            b->overflow = 1;
            return off;
        }
        xmp_ut_tensor_t *t = &p->t[p->ntensors++];
        snprintf(t->name, sizeof t->name, "%s.%s", b->prefix, name);
        t->layer = b->layer;
        t->offset = p->total;
        t->count = count;
        t->ndim = ndim;
        for (int i = 0; i < 4; i++)
            t->shape[i] = i < ndim ? s[i] : 1;
        p->total += count;
    }
    return off;
}

static int new_buf(bld_t *b, size_t floats)
{
    plan_t *pl = b->pl;
    if (pl->nbuf >= MAX_BUF) {
        b->overflow = 1;
        return 0;
    }
    pl->bufsz[pl->nbuf] = floats;
    pl->nograd[pl->nbuf] = 0;
    return pl->nbuf++;
}

static op_t *new_op(bld_t *b, int kind)
{
    plan_t *pl = b->pl;
    static _Thread_local op_t dummy;
    if (pl->nops >= MAX_OPS) {
        b->overflow = 1;
        return &dummy;
    }
    op_t *o = &pl->ops[pl->nops++];
    memset(o, 0, sizeof *o);
    o->kind = kind;
    o->in0 = o->in1 = o->in2 = o->aux0 = o->aux1 = -1;
    o->w = o->b = NONE;
    o->wi = o->bi = -1;
    return o;
}

/* conv kxk (stride, pad k/2) cin->cout at h x w; returns the output buffer. */
static int emit_conv(bld_t *b, const char *name, int in, int cin, int cout, int h, int w, int k,
                     int stride)
{
    char nm[32];
    op_t *o = new_op(b, OP_CONV);
    xmp_unet_conv2d_init(&o->conv, b->n, cin, h, w, cout, k, k, stride, k / 2);
    snprintf(nm, sizeof nm, "%s.w", name);
    o->w = add_tensor(b, nm, &o->wi, 4, cout, cin, k, k);
    snprintf(nm, sizeof nm, "%s.b", name);
    o->b = add_tensor(b, nm, &o->bi, 1, cout, 0, 0, 0);
    o->in0 = in;
    o->out = new_buf(b, (size_t)b->n * cout * o->conv.oh * o->conv.ow);
    size_t col = xmp_unet_conv2d_col_floats(&o->conv);
    if (col > b->pl->col_floats)
        b->pl->col_floats = col;
    return o->out;
}

/* Group norm over c channels at hw pixels. */
static int emit_gn(bld_t *b, const char *name, int in, int c, int hw)
{
    char nm[32];
    op_t *o = new_op(b, OP_GN);
    o->n = b->n;
    o->c = c;
    o->hw = hw;
    o->g = b->cf->groups;
    snprintf(nm, sizeof nm, "%s.gamma", name);
    o->w = add_tensor(b, nm, &o->wi, 1, c, 0, 0, 0);
    snprintf(nm, sizeof nm, "%s.beta", name);
    o->b = add_tensor(b, nm, &o->bi, 1, c, 0, 0, 0);
    o->in0 = in;
    o->aux0 = new_buf(b, (size_t)b->n * o->g);
    o->aux1 = new_buf(b, (size_t)b->n * o->g);
    b->pl->nograd[o->aux0] = b->pl->nograd[o->aux1] = 1;
    o->out = new_buf(b, (size_t)b->n * c * hw);
    return o->out;
}

static int emit_simple(bld_t *b, int kind, int in0, int in1, size_t out_floats)
{
    op_t *o = new_op(b, kind);
    o->in0 = in0;
    o->in1 = in1;
    o->out = new_buf(b, out_floats);
    return b->pl->nops - 1;
}

/* SBP executor only: box buffer `in` to activation class cls (returns the boxed buffer). */
static int emit_box(bld_t *b, int in, const char *cls)
{
    if (!b->sbp)
        return in;
    int k = emit_simple(b, OP_BOX, in, -1, b->pl->bufsz[in]);
    b->pl->ops[k].cls = cls;
    return b->pl->ops[k].out;
}

/* Linear on m rows ic->oc (rows = n images x t tokens; t kept for the SBP executor). */
static int emit_lin(bld_t *b, const char *name, int in, int m, int t, int ic, int oc)
{
    char nm[32];
    op_t *o = new_op(b, OP_LIN);
    o->n = m;
    o->hw = t;
    o->c = ic;
    o->c2 = oc;
    snprintf(nm, sizeof nm, "%s.w", name);
    o->w = add_tensor(b, nm, &o->wi, 2, oc, ic, 0, 0);
    snprintf(nm, sizeof nm, "%s.b", name);
    o->b = add_tensor(b, nm, &o->bi, 1, oc, 0, 0, 0);
    o->in0 = in;
    o->out = new_buf(b, (size_t)m * oc);
    return o->out;
}

/* block(cin->cout) at s x s: conv3x3, GN, SiLU, conv3x3; output boxed to class act.block. */
static int emit_block(bld_t *b, int in, int cin, int cout, int s)
{
    const int n = b->n, hw = s * s;
    int t = emit_conv(b, "conv1", in, cin, cout, s, s, 3, 1);
    t = emit_gn(b, "gn", t, cout, hw);
    int k = emit_simple(b, OP_SILU, t, -1, (size_t)n * cout * hw);
    b->pl->ops[k].c = cout;
    b->pl->ops[k].hw = hw;
    b->pl->ops[k].n = n;
    t = emit_conv(b, "conv2", b->pl->ops[k].out, cout, cout, s, s, 3, 1);
    return emit_box(b, t, "act.block");
}

/* Residual attention at s x s over c channels: cross (to the cond buffer) or self. */
static int emit_attn(bld_t *b, int x, int c, int s, int cross)
{
    const int n = b->n, hw = s * s, D = b->cf->cond_dim, heads = c / b->cf->head_dim;
    int k = emit_simple(b, OP_TOK, x, -1, (size_t)n * c * hw);
    op_t *o = &b->pl->ops[k];
    o->n = n;
    o->c = c;
    o->hw = hw;
    o->h = o->wd = s;
    int tok = o->out;
    int q = emit_lin(b, "attn.q", tok, n * hw, hw, c, c);
    int src = cross ? b->pl->cond : tok;
    int tk = cross ? XMP_UT_TOKENS : hw, sd = cross ? D : c;
    int kk = emit_lin(b, "attn.k", src, n * tk, tk, sd, c);
    int vv = emit_lin(b, "attn.v", src, n * tk, tk, sd, c);
    op_t *a = new_op(b, OP_ATTN);
    xmp_unet_attn_init(&a->attn, n, hw, tk, heads, b->cf->head_dim);
    a->in0 = q;
    a->in1 = kk;
    a->in2 = vv;
    a->aux0 = new_buf(b, xmp_unet_attn_probs_floats(&a->attn));
    b->pl->nograd[a->aux0] = 1;
    a->out = new_buf(b, (size_t)n * hw * c);
    if (xmp_unet_attn_scratch_floats(&a->attn) > b->pl->attn_scratch)
        b->pl->attn_scratch = xmp_unet_attn_scratch_floats(&a->attn);
    int ao = emit_lin(b, "attn.o", a->out, n * hw, hw, c, c);
    k = emit_simple(b, OP_UNTOK, ao, -1, (size_t)n * c * hw);
    o = &b->pl->ops[k];
    o->n = n;
    o->c = c;
    o->hw = hw;
    o->h = o->wd = s;
    int at = o->out;
    k = emit_simple(b, OP_ADD, x, at, (size_t)n * c * hw);
    b->pl->ops[k].hw = c * hw;
    b->pl->ops[k].n = n;
    return b->pl->ops[k].out;
}

int xmp_ut__build(const xmp_ut_config_t *cf, int layer, int n, int sbp, plan_t *pl,
                  xmp_ut_params_t *pp)
{
    bld_t b = {
        .cf = cf, .layer = layer, .n = n, .sbp = sbp, .pl = pl, .pp = pp, .prefix = g_names[layer]};
    const int C = cf->base, D = cf->cond_dim;
    int in[3], out[3];
    xmp_ut_layer_in_shape(cf, layer, in);
    xmp_ut_layer_out_shape(cf, layer, out);
    memset(pl, 0, sizeof *pl);
    pl->skip_in = pl->skip_out = pl->cond = -1;
    pl->in = new_buf(&b, (size_t)n * in[0] * in[1] * in[2]);
    if (layer == XMP_UT_CONV_IN)
        pl->nograd[pl->in] = 1;
    if (xmp_ut_layer_uses_cond(cf, layer)) {
        pl->cond = new_buf(&b, (size_t)n * XMP_UT_TOKENS * D);
        pl->nograd[pl->cond] = 1;
    }
    int x = pl->in, s = in[1];
    switch (layer) {
    case XMP_UT_CONV_IN:
        x = emit_conv(&b, "conv", x, XMP_UT_IN_CH, C, s, s, 3, 1);
        break;
    case XMP_UT_DOWN1:
    case XMP_UT_DOWN2:
    case XMP_UT_DOWN3:
    case XMP_UT_DOWN4: {
        int sk[3];
        xmp_ut_layer_skip_shape(cf, layer, sk);
        x = emit_block(&b, x, in[0], sk[0], s);
        if (layer != XMP_UT_DOWN4) {
            x = emit_attn(&b, x, sk[0], s, 1);
            x = emit_box(&b, x, "act.x");
            pl->skip_out = x;
            x = emit_conv(&b, "down", x, sk[0], sk[0], s, s, 3, 2);
        } else {
            x = emit_box(&b, x, "act.x");
            pl->skip_out = x;
        }
        break;
    }
    case XMP_UT_MID_A:
    case XMP_UT_MID_B:
        x = emit_block(&b, x, in[0], in[0], s);
        x = emit_attn(&b, x, in[0], s, layer == XMP_UT_MID_B);
        break;
    case XMP_UT_UP1:
    case XMP_UT_UP2:
    case XMP_UT_UP3:
    case XMP_UT_UP4: {
        int sk[3];
        xmp_ut_layer_skip_shape(cf, xmp_ut_skip_source(layer), sk);
        pl->skip_in = new_buf(&b, (size_t)n * sk[0] * s * s);
        int k = emit_simple(&b, OP_CONCAT, x, pl->skip_in, (size_t)n * (in[0] + sk[0]) * s * s);
        op_t *o = &pl->ops[k];
        o->n = n;
        o->c = in[0];
        o->c2 = sk[0];
        o->hw = s * s;
        /* the block maps to the level's channels (= the skip's) */
        x = emit_block(&b, o->out, in[0] + sk[0], sk[0], s);
        if (layer != XMP_UT_UP1)
            x = emit_attn(&b, x, sk[0], s, 1);
        if (layer != XMP_UT_UP4) {
            k = emit_simple(&b, OP_UP, x, -1, (size_t)n * sk[0] * 4 * s * s);
            o = &pl->ops[k];
            o->n = n;
            o->c = sk[0];
            o->h = o->wd = s;
            x = emit_conv(&b, "up", o->out, sk[0], out[0], 2 * s, 2 * s, 3, 1);
            x = emit_box(&b, x, "act.up");
        }
        break;
    }
    case XMP_UT_OUT: {
        x = emit_gn(&b, "gn", x, C, s * s);
        int k = emit_simple(&b, OP_SILU, x, -1, (size_t)n * C * s * s);
        x = pl->ops[k].out;
        break;
    }
    case XMP_UT_CONV_OUT:
        x = emit_conv(&b, "conv", x, C, XMP_UT_OUT_CH, s, s, 3, 1);
        break;
    }
    if (pl->skip_out != x)
        x = emit_box(&b, x, "act.x");
    pl->out = x;
    if (b.overflow)
        return xmp_ut__fail("layer %s: internal table overflow", g_names[layer]);
    if (pl->bufsz[pl->out] != (size_t)n * out[0] * out[1] * out[2])
        return xmp_ut__fail("layer %s: internal shape mismatch", g_names[layer]);
    return 0;
}

void xmp_ut_params_layout(const xmp_ut_config_t *c, xmp_ut_params_t *p)
{
    static _Thread_local plan_t pl;
    memset(p, 0, sizeof *p);
    for (int l = 0; l < XMP_UT_LAYERS; l++) {
        p->layer_offset[l] = p->total;
        xmp_ut__build(c, l, 1, 0, &pl, p);
        p->layer_count[l] = p->total - p->layer_offset[l];
    }
}

/* ---- deterministic init ---- */

void xmp_ut_tensor_init(const xmp_ut_params_t *p, int k, uint64_t seed, float *out)
{
    const xmp_ut_tensor_t *t = &p->t[k];
    const char *suffix = strrchr(t->name, '.');
    size_t n = t->count;
    if (suffix && !strcmp(suffix, ".gamma")) {
        for (size_t i = 0; i < n; i++)
            out[i] = 1.0f;
        return;
    }
    if (t->ndim == 1) { /* biases and GN betas */
        memset(out, 0, n * sizeof *out);
        return;
    }
    size_t fan_in = n / (size_t)t->shape[0];
    double bound = 1.0 / sqrt((double)fan_in);
    uint64_t key = mix64(seed ^ mix64(0x5554ull + (uint64_t)k));
    for (size_t i = 0; i < n; i++) {
        double u = (double)(mix64(key + i) >> 11) * (1.0 / 9007199254740992.0);
        out[i] = (float)((2.0 * u - 1.0) * bound);
    }
}

void xmp_ut_params_init(const xmp_ut_params_t *p, uint64_t seed, float *params)
{
    for (int k = 0; k < p->ntensors; k++)
        xmp_ut_tensor_init(p, k, seed, params + p->t[k].offset);
}

/* ---------------------------------------------------------------------------------------- */
/* Layer objects                                                                             */
/* ---------------------------------------------------------------------------------------- */

struct xmp_ut_layer {
    xmp_ut_config_t cf;
    int layer, n;
    plan_t pl;
    float *val[MAX_BUF], *grad[MAX_BUF];
    float *arena, *col, *scratch;
    size_t grad_floats; /* grads are one contiguous range starting at grad[0] */
};

xmp_ut_layer_t *xmp_ut_layer_create(const xmp_ut_config_t *c, int layer, int n)
{
    if (layer < 0 || layer >= XMP_UT_LAYERS) {
        xmp_ut__fail("layer %d: must be in [0, %d)", layer, XMP_UT_LAYERS);
        return NULL;
    }
    if (n < 1) {
        xmp_ut__fail("micro-batch %d: must be >= 1", n);
        return NULL;
    }
    xmp_ut_layer_t *l = calloc(1, sizeof *l);
    if (!l) {
        xmp_ut__fail("out of memory");
        return NULL;
    }
    l->cf = *c;
    l->layer = layer;
    l->n = n;
    if (xmp_ut__build(c, layer, n, 0, &l->pl, NULL) != 0) {
        free(l);
        return NULL;
    }
    size_t tot = 0;
    for (int i = 0; i < l->pl.nbuf; i++)
        tot += l->pl.bufsz[i];
    size_t col = l->pl.col_floats ? l->pl.col_floats : 1;
    size_t scr = l->pl.attn_scratch ? l->pl.attn_scratch : 1;
    l->arena = malloc((2 * tot + col + scr) * sizeof(float));
    if (!l->arena) {
        free(l);
        xmp_ut__fail("layer %s: out of memory for %zu floats", g_names[layer], 2 * tot + col + scr);
        return NULL;
    }
    float *p = l->arena;
    for (int i = 0; i < l->pl.nbuf; i++) {
        l->val[i] = p;
        p += l->pl.bufsz[i];
    }
    for (int i = 0; i < l->pl.nbuf; i++) {
        l->grad[i] = p;
        p += l->pl.bufsz[i];
    }
    l->grad_floats = tot;
    l->col = p;
    l->scratch = p + col;
    memset(l->arena, 0, 2 * tot * sizeof(float));
    return l;
}

size_t xmp_ut_layer_activation_floats(const xmp_ut_layer_t *l)
{
    return l->grad_floats; /* value buffers: as many floats as the gradient buffers */
}

void xmp_ut_layer_destroy(xmp_ut_layer_t *l)
{
    if (!l)
        return;
    free(l->arena);
    free(l);
}

static size_t bsz(const xmp_ut_layer_t *l, int b)
{
    return b < 0 ? 0 : l->pl.bufsz[b];
}
size_t xmp_ut_layer_in_floats(const xmp_ut_layer_t *l)
{
    return bsz(l, l->pl.in);
}
size_t xmp_ut_layer_out_floats(const xmp_ut_layer_t *l)
{
    return bsz(l, l->pl.out);
}
size_t xmp_ut_layer_skip_in_floats(const xmp_ut_layer_t *l)
{
    return bsz(l, l->pl.skip_in);
}
size_t xmp_ut_layer_skip_out_floats(const xmp_ut_layer_t *l)
{
    return bsz(l, l->pl.skip_out);
}

static const float *pw(const float *w, size_t off)
{
    return off == NONE ? NULL : w + off;
}
static float *pg(float *w, size_t off)
{
    return off == NONE ? NULL : w + off;
}

int xmp_ut_layer_forward(xmp_ut_layer_t *l, const float *w, const float *x, const float *skip_in,
                         const float *cond, float *y, float *skip_out)
{
    const plan_t *pl = &l->pl;
    if (!w || !x || !y || (pl->skip_in >= 0 && !skip_in) || (pl->cond >= 0 && !cond) ||
        (pl->skip_out >= 0 && !skip_out))
        return xmp_ut__fail(
            "layer %s forward: missing input or output (w %p x %p skip_in %p cond %p y "
            "%p skip_out %p)",
            g_names[l->layer], (const void *)w, (const void *)x, (const void *)skip_in,
            (const void *)cond, (void *)y, (void *)skip_out);
    memcpy(l->val[pl->in], x, pl->bufsz[pl->in] * sizeof(float));
    if (pl->skip_in >= 0)
        memcpy(l->val[pl->skip_in], skip_in, pl->bufsz[pl->skip_in] * sizeof(float));
    if (pl->cond >= 0)
        memcpy(l->val[pl->cond], cond, pl->bufsz[pl->cond] * sizeof(float));
    for (int i = 0; i < pl->nops; i++) {
        const op_t *o = &pl->ops[i];
        float *const *v = l->val;
        int rc = 0;
        switch (o->kind) {
        case OP_CONV:
            rc = xmp_unet_conv2d_forward(&o->conv, v[o->in0], w + o->w, pw(w, o->b), v[o->out],
                                         l->col);
            break;
        case OP_GN:
            rc = xmp_unet_groupnorm_forward(o->n, o->c, o->hw, o->g, v[o->in0], w + o->w, w + o->b,
                                            v[o->out], v[o->aux0], v[o->aux1]);
            break;
        case OP_SILU:
            rc = xmp_unet_silu_forward(pl->bufsz[o->out], v[o->in0], v[o->out]);
            break;
        case OP_UP:
            rc = xmp_unet_upsample2x_forward(o->n, o->c, o->h, o->wd, v[o->in0], v[o->out]);
            break;
        case OP_CONCAT:
            rc = xmp_unet_concat_forward(o->n, o->c, o->c2, o->hw, v[o->in0], v[o->in1], v[o->out]);
            break;
        case OP_TOK:
            rc = xmp_unet_nchw_to_tokens(o->n, o->c, o->hw, v[o->in0], v[o->out]);
            break;
        case OP_UNTOK:
            rc = xmp_unet_tokens_to_nchw(o->n, o->c, o->hw, v[o->in0], v[o->out]);
            break;
        case OP_LIN:
            rc = xmp_unet_linear_forward(o->n, o->c, o->c2, v[o->in0], w + o->w, pw(w, o->b),
                                         v[o->out]);
            break;
        case OP_ATTN:
            rc = xmp_unet_attn_forward(&o->attn, v[o->in0], v[o->in1], v[o->in2], v[o->out],
                                       v[o->aux0]);
            break;
        case OP_ADD:
            rc = xmp_unet_add_forward(pl->bufsz[o->out], v[o->in0], v[o->in1], v[o->out]);
            break;
        case OP_BOX: /* the identity here */
            memcpy(v[o->out], v[o->in0], pl->bufsz[o->out] * sizeof(float));
            break;
        }
        if (rc != 0)
            return xmp_ut__fail("layer %s op %d: %s", g_names[l->layer], i, xmp_last_error());
    }
    memcpy(y, l->val[pl->out], pl->bufsz[pl->out] * sizeof(float));
    if (pl->skip_out >= 0)
        memcpy(skip_out, l->val[pl->skip_out], pl->bufsz[pl->skip_out] * sizeof(float));
    return 0;
}

static float *gr(xmp_ut_layer_t *l, int b)
{
    return b < 0 || l->pl.nograd[b] ? NULL : l->grad[b];
}

static void acc(float *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] += src[i];
}

int xmp_ut_layer_backward_input(xmp_ut_layer_t *l, const float *w, const float *dy,
                                const float *dskip_out, float *dx, float *dskip_in)
{
    const plan_t *pl = &l->pl;
    if (!w || !dy || (pl->skip_in >= 0 && !dskip_in))
        return xmp_ut__fail("layer %s backward_input: missing w, dy or dskip_in",
                            g_names[l->layer]);
    memset(l->grad[0], 0, l->grad_floats * sizeof(float));
    acc(l->grad[pl->out], dy, pl->bufsz[pl->out]);
    if (pl->skip_out >= 0 && dskip_out)
        acc(l->grad[pl->skip_out], dskip_out, pl->bufsz[pl->skip_out]);
    for (int i = pl->nops - 1; i >= 0; i--) {
        const op_t *o = &pl->ops[i];
        float *const *v = l->val;
        float *g = l->grad[o->out];
        int rc = 0;
        switch (o->kind) {
        case OP_CONV:
            if (gr(l, o->in0))
                rc = xmp_unet_conv2d_backward_input(&o->conv, g, w + o->w, gr(l, o->in0), l->col);
            break;
        case OP_GN:
            rc = xmp_unet_groupnorm_backward(o->n, o->c, o->hw, o->g, v[o->in0], g, w + o->w,
                                             v[o->aux0], v[o->aux1], gr(l, o->in0), NULL, NULL);
            break;
        case OP_SILU:
            rc = xmp_unet_silu_backward(pl->bufsz[o->out], v[o->in0], g, gr(l, o->in0));
            break;
        case OP_UP:
            rc = xmp_unet_upsample2x_backward(o->n, o->c, o->h, o->wd, g, gr(l, o->in0));
            break;
        case OP_CONCAT:
            rc =
                xmp_unet_concat_backward(o->n, o->c, o->c2, o->hw, g, gr(l, o->in0), gr(l, o->in1));
            break;
        case OP_TOK:
            rc = xmp_unet_nchw_to_tokens_backward(o->n, o->c, o->hw, g, gr(l, o->in0));
            break;
        case OP_UNTOK:
            rc = xmp_unet_tokens_to_nchw_backward(o->n, o->c, o->hw, g, gr(l, o->in0));
            break;
        case OP_LIN:
            if (gr(l, o->in0))
                rc = xmp_unet_linear_backward_input(o->n, o->c, o->c2, g, w + o->w, gr(l, o->in0));
            break;
        case OP_ATTN:
            rc = xmp_unet_attn_backward(&o->attn, v[o->in0], v[o->in1], v[o->in2], v[o->aux0], g,
                                        gr(l, o->in0), gr(l, o->in1), gr(l, o->in2), l->scratch);
            break;
        case OP_ADD:
            rc = xmp_unet_add_backward(pl->bufsz[o->out], g, gr(l, o->in0), gr(l, o->in1));
            break;
        case OP_BOX:
            if (gr(l, o->in0))
                acc(gr(l, o->in0), g, pl->bufsz[o->out]);
            break;
        }
        if (rc != 0)
            return xmp_ut__fail("layer %s op %d backward: %s", g_names[l->layer], i,
                                xmp_last_error());
    }
    if (dx && !pl->nograd[pl->in])
        acc(dx, l->grad[pl->in], pl->bufsz[pl->in]);
    if (pl->skip_in >= 0)
        acc(dskip_in, l->grad[pl->skip_in], pl->bufsz[pl->skip_in]);
    return 0;
}

int xmp_ut_layer_backward_weight(xmp_ut_layer_t *l, float *dw)
{
    const plan_t *pl = &l->pl;
    if (!dw)
        return xmp_ut__fail("layer %s backward_weight: dw is NULL", g_names[l->layer]);
    for (int i = pl->nops - 1; i >= 0; i--) {
        const op_t *o = &pl->ops[i];
        float *const *v = l->val;
        float *g = l->grad[o->out];
        int rc = 0;
        switch (o->kind) {
        case OP_CONV:
            rc = xmp_unet_conv2d_backward_weight(&o->conv, v[o->in0], g, dw + o->w, pg(dw, o->b),
                                                 l->col);
            break;
        case OP_GN:
            rc = xmp_unet_groupnorm_backward(o->n, o->c, o->hw, o->g, v[o->in0], g, NULL,
                                             v[o->aux0], v[o->aux1], NULL, dw + o->w, dw + o->b);
            break;
        case OP_LIN:
            rc = xmp_unet_linear_backward_weight(o->n, o->c, o->c2, v[o->in0], g, dw + o->w,
                                                 pg(dw, o->b));
            break;
        default:
            break;
        }
        if (rc != 0)
            return xmp_ut__fail("layer %s op %d weight backward: %s", g_names[l->layer], i,
                                xmp_last_error());
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Serial reference                                                                          */
/* ---------------------------------------------------------------------------------------- */

void xmp_ut_model_free(xmp_ut_model_t *m)
{
    if (!m)
        return;
    for (int l = 0; l < XMP_UT_LAYERS; l++) {
        xmp_ut_layer_destroy(m->layers[l]);
        free(m->act[l]);
        free(m->skip[l]);
        free(m->dact[l]);
        free(m->dskip[l]);
    }
    free(m->params);
    free(m->grads);
    free(m->velocity);
    memset(m, 0, sizeof *m);
}

int xmp_ut_model_init(xmp_ut_model_t *m, const xmp_ut_config_t *c, int n, uint64_t seed)
{
    memset(m, 0, sizeof *m);
    m->cfg = *c;
    m->n = n;
    xmp_ut_params_layout(c, &m->layout);
    size_t P = m->layout.total;
    m->params = malloc(P * sizeof(float));
    m->grads = calloc(P, sizeof(float));
    m->velocity = calloc(P, sizeof(float));
    if (!m->params || !m->grads || !m->velocity)
        goto fail_free;
    xmp_ut_params_init(&m->layout, seed, m->params);
    for (int l = 0; l < XMP_UT_LAYERS; l++) {
        if (!(m->layers[l] = xmp_ut_layer_create(c, l, n))) {
            xmp_ut_model_free(m); /* the layer's own message stays */
            return -1;
        }
        size_t o = xmp_ut_layer_out_floats(m->layers[l]);
        size_t s = xmp_ut_layer_skip_out_floats(m->layers[l]);
        m->act[l] = malloc(o * sizeof(float));
        m->dact[l] = malloc(o * sizeof(float));
        if (!m->act[l] || !m->dact[l])
            goto fail_free;
        if (s) {
            m->skip[l] = malloc(s * sizeof(float));
            m->dskip[l] = malloc(s * sizeof(float));
            if (!m->skip[l] || !m->dskip[l])
                goto fail_free;
        }
    }
    return 0;
fail_free:
    xmp_ut__fail("model: out of memory");
    xmp_ut_model_free(m);
    return -1;
}

int xmp_ut_model_forward(xmp_ut_model_t *m, const float *input, const float *cond,
                         const float *target)
{
    const float *x = input;
    for (int l = 0; l < XMP_UT_LAYERS; l++) {
        int src = xmp_ut_skip_source(l);
        if (xmp_ut_layer_forward(m->layers[l], m->params + m->layout.layer_offset[l], x,
                                 src >= 0 ? m->skip[src] : NULL, cond, m->act[l], m->skip[l]) != 0)
            return -1;
        x = m->act[l];
    }
    size_t cnt = xmp_ut_layer_out_floats(m->layers[XMP_UT_CONV_OUT]);
    return xmp_unet_mse_forward(cnt, (double)cnt, x, target, &m->loss) == 0
               ? 0
               : xmp_ut__fail("loss: %s", xmp_last_error());
}

int xmp_ut_model_backward(xmp_ut_model_t *m, const float *target)
{
    memset(m->grads, 0, m->layout.total * sizeof(float));
    for (int l = 0; l < XMP_UT_LAYERS; l++) {
        memset(m->dact[l], 0, xmp_ut_layer_out_floats(m->layers[l]) * sizeof(float));
        if (m->dskip[l])
            memset(m->dskip[l], 0, xmp_ut_layer_skip_out_floats(m->layers[l]) * sizeof(float));
    }
    const int L = XMP_UT_CONV_OUT;
    size_t cnt = xmp_ut_layer_out_floats(m->layers[L]);
    if (xmp_unet_mse_backward(cnt, (double)cnt, m->act[L], target, m->dact[L]) != 0)
        return xmp_ut__fail("loss backward: %s", xmp_last_error());
    for (int l = L; l >= 0; l--) {
        int src = xmp_ut_skip_source(l);
        if (xmp_ut_layer_backward_input(m->layers[l], m->params + m->layout.layer_offset[l],
                                        m->dact[l], m->dskip[l], l > 0 ? m->dact[l - 1] : NULL,
                                        src >= 0 ? m->dskip[src] : NULL) != 0 ||
            xmp_ut_layer_backward_weight(m->layers[l], m->grads + m->layout.layer_offset[l]) != 0)
            return -1;
    }
    return 0;
}

int xmp_ut_model_update(xmp_ut_model_t *m, float lr, float momentum, float wd)
{
    if (xmp_unet_sgd_nesterov(m->layout.total, lr, momentum, wd, m->params, m->velocity,
                              m->grads) != 0)
        return xmp_ut__fail("optimizer: %s", xmp_last_error());
    return 0;
}
