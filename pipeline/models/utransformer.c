/*
 * U-Transformer layers as small op tapes over unet_kernels (see utransformer.h for the model).
 *
 * Each layer is described once by a builder (build_layer) that both registers the layer's
 * parameter tensors (names, shapes, offsets) and emits its ops over numbered buffers. The
 * parameter layout is the builders' registrations for all layers; a layer object is one
 * builder run plus an arena holding every buffer's value and gradient for its micro-batch.
 */
#include "models/utransformer.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/unet_kernels.h"

static _Thread_local char g_err[256];

const char *xmp_ut_last_error(void)
{
    return g_err;
}

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_err, sizeof g_err, fmt, ap);
    va_end(ap);
    return -1;
}

/* Shared with shapes_data.c (same thread-local message). */
int xmp_ut__fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int xmp_ut__fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_err, sizeof g_err, fmt, ap);
    va_end(ap);
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
        return fail("base channels %d: must be in [1, 4096]", base);
    if (groups == 0)
        groups = base % 4 == 0 ? 4 : 1;
    if (head_dim == 0)
        head_dim = base;
    if (groups < 1 || base % groups != 0)
        return fail("groups %d: must divide the base channels %d", groups, base);
    if (head_dim < 1 || base % head_dim != 0)
        return fail("head_dim %d: must divide the base channels %d", head_dim, base);
    c->base = base;
    c->groups = groups;
    c->head_dim = head_dim;
    c->cond_dim = 4 * base;
    g_err[0] = '\0';
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
/* Layer builder: parameter registration + op tape                                          */
/* ---------------------------------------------------------------------------------------- */

/* OP_BOXF: P -> B boxing over the tp axis in forward (sum over the tp ranks), gradient passed
 * through (the gradient of a P tensor is B). OP_BOXB: identity in forward for a B tensor that
 * channel-split ops consume; its gradient arrives P (each rank's partial) and is boxed P -> B.
 * OP_GATHER: S(1) -> B over the tp axis (all-gather of the channel blocks, n x c x hw with c the
 * full count); its backward keeps this rank's channel block of the B gradient (B -> S(1)). */
enum {
    OP_CONV,
    OP_GN,
    OP_SILU,
    OP_UP,
    OP_CONCAT,
    OP_TOK,
    OP_UNTOK,
    OP_LIN,
    OP_ATTN,
    OP_ADD,
    OP_BOXF,
    OP_BOXB,
    OP_GATHER
};

#define MAX_BUF 64
#define MAX_OPS 64
#define MAX_PT 32

/* Split modes of a weight op over the tp axis. */
enum { SPLIT_NONE = 0, SPLIT_OUT, SPLIT_IN };

/* One of the layer's parameter tensors: where its full tensor sits in the layer's full
 * (global-layout) parameters and where this rank's block sits in its local parameters. */
typedef struct {
    size_t goff, loff, lcount;
    int split; /* tensor dim split over tp, -1: replicated (B) */
    int ndim, shape[4];
} ptens_t;

typedef struct {
    int kind;
    int in0, in1, in2, out;
    int aux0, aux1;  /* saved non-gradient buffers (GN mean/rstd, attention probs) */
    size_t w, b;     /* layer-relative local parameter offsets (SIZE_MAX: none) */
    int bias_holder; /* bias of a P output: added on tp rank 0 only */
    xmp_unet_conv2d_t conv;
    xmp_unet_attn_t attn;
    int n, c, c2, hw, g, h, wd; /* sizes for the simple ops */
} op_t;

typedef struct {
    int nbuf, nops;
    size_t bufsz[MAX_BUF];
    unsigned char nograd[MAX_BUF];
    op_t ops[MAX_OPS];
    int in, skip_in, cond, out, skip_out; /* buffer indices, -1 if absent */
    size_t col_floats, attn_scratch;
    int npt;
    ptens_t pt[MAX_PT];
    size_t lfloats; /* local parameter floats */
    int attn_split; /* 1 if the layer's attention is head-split over tp */
} plan_t;

typedef struct {
    const xmp_ut_config_t *cf;
    int layer, n;
    plan_t *pl;
    xmp_ut_params_t *pp; /* NULL: do not register */
    size_t loff;         /* local floats of the layer registered so far */
    size_t goff;         /* full floats of the layer registered so far */
    int tp, tpr;         /* tensor-parallel degree and this rank's index */
    const char *prefix;
    int overflow;
} bld_t;

#define NONE ((size_t)-1)

/* Registers a parameter tensor of full shape s; split: the dim cut into tp equal blocks (-1:
 * replicated). Returns its local offset. */
static size_t add_tensor(bld_t *b, const char *name, int split, int ndim, int s0, int s1, int s2,
                         int s3)
{
    int s[4] = {s0, s1, s2, s3};
    size_t count = 1;
    for (int i = 0; i < ndim; i++)
        count *= (size_t)s[i];
    if (b->tp <= 1)
        split = -1;
    size_t lcount = split >= 0 ? count / (size_t)b->tp : count;
    size_t off = b->loff;
    plan_t *pl = b->pl;
    if (pl->npt >= MAX_PT) {
        b->overflow = 1;
    } else {
        ptens_t *q = &pl->pt[pl->npt++];
        q->goff = b->goff;
        q->loff = off;
        q->lcount = lcount;
        q->split = split;
        q->ndim = ndim;
        for (int i = 0; i < 4; i++)
            q->shape[i] = i < ndim ? s[i] : 1;
    }
    b->loff += lcount;
    b->goff += count;
    pl->lfloats = b->loff;
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
    static op_t dummy;
    if (pl->nops >= MAX_OPS) {
        b->overflow = 1;
        return &dummy;
    }
    op_t *o = &pl->ops[pl->nops++];
    memset(o, 0, sizeof *o);
    o->kind = kind;
    o->in0 = o->in1 = o->in2 = o->aux0 = o->aux1 = -1;
    o->w = o->b = NONE;
    return o;
}

/* conv kxk (stride, pad k/2) cin->cout at h x w; returns the output buffer. mode SPLIT_OUT:
 * this rank computes output channels [r*cout/tp, (r+1)*cout/tp) (weight and bias S(0));
 * SPLIT_IN: input channels [r*cin/tp, ...) (weight S(1)), the output is a partial sum (P) and
 * the bias (B) is added on tp rank 0 only. */
static int emit_conv(bld_t *b, const char *name, int in, int cin, int cout, int h, int w, int k,
                     int stride, int mode)
{
    char nm[32];
    if (b->tp <= 1)
        mode = SPLIT_NONE;
    int lin = mode == SPLIT_IN ? cin / b->tp : cin, lout = mode == SPLIT_OUT ? cout / b->tp : cout;
    op_t *o = new_op(b, OP_CONV);
    xmp_unet_conv2d_init(&o->conv, b->n, lin, h, w, lout, k, k, stride, k / 2);
    snprintf(nm, sizeof nm, "%s.w", name);
    o->w = add_tensor(b, nm, mode == SPLIT_OUT ? 0 : mode == SPLIT_IN ? 1 : -1, 4, cout, cin, k, k);
    snprintf(nm, sizeof nm, "%s.b", name);
    o->b = add_tensor(b, nm, mode == SPLIT_OUT ? 0 : -1, 1, cout, 0, 0, 0);
    o->bias_holder = mode == SPLIT_IN;
    o->in0 = in;
    o->out = new_buf(b, (size_t)b->n * lout * o->conv.oh * o->conv.ow);
    size_t col = xmp_unet_conv2d_col_floats(&o->conv);
    if (col > b->pl->col_floats)
        b->pl->col_floats = col;
    return o->out;
}

/* Group norm over c channels (split: this rank's c/tp channels and groups/tp groups). */
static int emit_gn(bld_t *b, const char *name, int in, int c, int hw, int split)
{
    char nm[32];
    if (b->tp <= 1)
        split = 0;
    op_t *o = new_op(b, OP_GN);
    o->n = b->n;
    o->c = split ? c / b->tp : c;
    o->hw = hw;
    o->g = split ? b->cf->groups / b->tp : b->cf->groups;
    snprintf(nm, sizeof nm, "%s.gamma", name);
    o->w = add_tensor(b, nm, split ? 0 : -1, 1, c, 0, 0, 0);
    snprintf(nm, sizeof nm, "%s.beta", name);
    o->b = add_tensor(b, nm, split ? 0 : -1, 1, c, 0, 0, 0);
    o->in0 = in;
    o->aux0 = new_buf(b, (size_t)b->n * o->g);
    o->aux1 = new_buf(b, (size_t)b->n * o->g);
    b->pl->nograd[o->aux0] = b->pl->nograd[o->aux1] = 1;
    o->out = new_buf(b, (size_t)b->n * o->c * hw);
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

/* Boxing op (OP_BOXF or OP_BOXB) over `floats` floats; returns the output buffer. */
static int emit_box(bld_t *b, int kind, int in, size_t floats)
{
    int k = emit_simple(b, kind, in, -1, floats);
    return b->pl->ops[k].out;
}

/* Linear on m rows ic->oc; mode as for emit_conv (SPLIT_OUT: columns, SPLIT_IN: rows of the
 * contraction, output P). */
static int emit_lin(bld_t *b, const char *name, int in, int m, int ic, int oc, int mode)
{
    char nm[32];
    if (b->tp <= 1)
        mode = SPLIT_NONE;
    op_t *o = new_op(b, OP_LIN);
    o->n = m;
    o->c = mode == SPLIT_IN ? ic / b->tp : ic;
    o->c2 = mode == SPLIT_OUT ? oc / b->tp : oc;
    snprintf(nm, sizeof nm, "%s.w", name);
    o->w = add_tensor(b, nm, mode == SPLIT_OUT ? 0 : mode == SPLIT_IN ? 1 : -1, 2, oc, ic, 0, 0);
    snprintf(nm, sizeof nm, "%s.b", name);
    o->b = add_tensor(b, nm, mode == SPLIT_OUT ? 0 : -1, 1, oc, 0, 0, 0);
    o->bias_holder = mode == SPLIT_IN;
    o->in0 = in;
    o->out = new_buf(b, (size_t)m * o->c2);
    return o->out;
}

/* block(cin->cout) at s x s: conv3x3, GN, SiLU, conv3x3. Under tp > 1 (Megatron-style pair):
 * conv1 output-channel split, GN and SiLU on the local channels, conv2 input-channel split
 * giving P, boxed P -> B; the B input is consumed through OP_BOXB (its gradient is P). */
static int emit_block(bld_t *b, int in, int cin, int cout, int s)
{
    const int n = b->n, hw = s * s, tp = b->tp > 1, cl = tp ? cout / b->tp : cout;
    if (tp)
        in = emit_box(b, OP_BOXB, in, (size_t)n * cin * hw);
    int t = emit_conv(b, "conv1", in, cin, cout, s, s, 3, 1, SPLIT_OUT);
    t = emit_gn(b, "gn", t, cout, hw, 1);
    int k = emit_simple(b, OP_SILU, t, -1, (size_t)n * cl * hw);
    b->pl->ops[k].c = cl;
    b->pl->ops[k].hw = hw;
    b->pl->ops[k].n = n;
    t = emit_conv(b, "conv2", b->pl->ops[k].out, cout, cout, s, s, 3, 1, SPLIT_IN);
    if (tp)
        t = emit_box(b, OP_BOXF, t, (size_t)n * cout * hw);
    return t;
}

/* Residual attention at s x s over c channels: cross (to the cond buffer) or self. Under tp > 1
 * with heads % tp == 0 the heads are split: q/k/v column split (S(0) weights), the output
 * projection row split (S(1), output P boxed to B); otherwise the attention is replicated. */
static int emit_attn(bld_t *b, int x, int c, int s, int cross)
{
    const int n = b->n, hw = s * s, D = b->cf->cond_dim, heads = c / b->cf->head_dim;
    const int split = b->tp > 1 && heads % b->tp == 0, cl = split ? c / b->tp : c;
    const int mo = split ? SPLIT_OUT : SPLIT_NONE, mi = split ? SPLIT_IN : SPLIT_NONE;
    if (split)
        b->pl->attn_split = 1;
    int k = emit_simple(b, OP_TOK, x, -1, (size_t)n * c * hw);
    op_t *o = &b->pl->ops[k];
    o->n = n;
    o->c = c;
    o->hw = hw;
    int tok = o->out;
    if (split)
        tok = emit_box(b, OP_BOXB, tok, (size_t)n * c * hw);
    int q = emit_lin(b, "attn.q", tok, n * hw, c, c, mo);
    int src = cross ? b->pl->cond : tok;
    int tk = cross ? XMP_UT_TOKENS : hw, sd = cross ? D : c;
    int kk = emit_lin(b, "attn.k", src, n * tk, sd, c, mo);
    int vv = emit_lin(b, "attn.v", src, n * tk, sd, c, mo);
    op_t *a = new_op(b, OP_ATTN);
    xmp_unet_attn_init(&a->attn, n, hw, tk, split ? heads / b->tp : heads, b->cf->head_dim);
    a->in0 = q;
    a->in1 = kk;
    a->in2 = vv;
    a->aux0 = new_buf(b, xmp_unet_attn_probs_floats(&a->attn));
    b->pl->nograd[a->aux0] = 1;
    a->out = new_buf(b, (size_t)n * hw * cl);
    if (xmp_unet_attn_scratch_floats(&a->attn) > b->pl->attn_scratch)
        b->pl->attn_scratch = xmp_unet_attn_scratch_floats(&a->attn);
    int ao = emit_lin(b, "attn.o", a->out, n * hw, c, c, mi);
    k = emit_simple(b, OP_UNTOK, ao, -1, (size_t)n * c * hw);
    o = &b->pl->ops[k];
    o->n = n;
    o->c = c;
    o->hw = hw;
    int at = o->out;
    if (split)
        at = emit_box(b, OP_BOXF, at, (size_t)n * c * hw);
    k = emit_simple(b, OP_ADD, x, at, (size_t)n * c * hw);
    b->pl->ops[k].hw = c * hw;
    b->pl->ops[k].n = n;
    return b->pl->ops[k].out;
}

static int build_layer(const xmp_ut_config_t *cf, int layer, int n, int tp, int tpr, plan_t *pl,
                       xmp_ut_params_t *pp)
{
    bld_t b = {.cf = cf,
               .layer = layer,
               .n = n,
               .pl = pl,
               .pp = pp,
               .prefix = g_names[layer],
               .tp = tp,
               .tpr = tpr};
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
        x = emit_conv(&b, "conv", x, XMP_UT_IN_CH, C, s, s, 3, 1, SPLIT_NONE);
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
            pl->skip_out = x;
            x = emit_conv(&b, "down", x, sk[0], sk[0], s, s, 3, 2, SPLIT_NONE);
        } else {
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
            if (tp > 1) /* the split conv's input gradient is P: box it at the lower resolution */
                x = emit_box(&b, OP_BOXB, x, (size_t)n * sk[0] * s * s);
            k = emit_simple(&b, OP_UP, x, -1, (size_t)n * sk[0] * 4 * s * s);
            o = &pl->ops[k];
            o->n = n;
            o->c = sk[0];
            o->h = o->wd = s;
            x = emit_conv(&b, "up", o->out, sk[0], out[0], 2 * s, 2 * s, 3, 1, SPLIT_OUT);
            if (tp > 1) {
                k = emit_simple(&b, OP_GATHER, x, -1, (size_t)n * out[0] * 4 * s * s);
                o = &pl->ops[k];
                o->n = n;
                o->c = out[0];
                o->hw = 4 * s * s;
                x = o->out;
            }
        }
        break;
    }
    case XMP_UT_OUT: {
        x = emit_gn(&b, "gn", x, C, s * s, 0);
        int k = emit_simple(&b, OP_SILU, x, -1, (size_t)n * C * s * s);
        x = pl->ops[k].out;
        break;
    }
    case XMP_UT_CONV_OUT:
        x = emit_conv(&b, "conv", x, C, XMP_UT_OUT_CH, s, s, 3, 1, SPLIT_NONE);
        break;
    }
    pl->out = x;
    if (b.overflow)
        return fail("layer %s: internal table overflow", g_names[layer]);
    if (pl->bufsz[pl->out] != (size_t)n * out[0] * out[1] * out[2])
        return fail("layer %s: internal shape mismatch", g_names[layer]);
    return 0;
}

void xmp_ut_params_layout(const xmp_ut_config_t *c, xmp_ut_params_t *p)
{
    static _Thread_local plan_t pl;
    memset(p, 0, sizeof *p);
    for (int l = 0; l < XMP_UT_LAYERS; l++) {
        p->layer_offset[l] = p->total;
        build_layer(c, l, 1, 1, 0, &pl, p);
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
    xmp_ut_tp_t tp;
    plan_t pl;
    float *val[MAX_BUF], *grad[MAX_BUF];
    float *arena, *col, *scratch;
    size_t grad_floats; /* grads are one contiguous range starting at grad[0] */
};

int xmp_ut_tp_check(const xmp_ut_config_t *c, int tp)
{
    if (tp < 1)
        return fail("tensor-parallel degree %d: must be >= 1", tp);
    if (tp > 1 && c->groups % tp != 0)
        return fail(
            "group norm groups %d cannot be split over tensor-parallel degree %d (groups %% "
            "tp must be 0; choose --groups as a multiple of %d that divides the base "
            "channels %d)",
            c->groups, tp, tp, c->base);
    return 0;
}

xmp_ut_layer_t *xmp_ut_layer_create_tp(const xmp_ut_config_t *c, int layer, int n,
                                       const xmp_ut_tp_t *tp)
{
    if (layer < 0 || layer >= XMP_UT_LAYERS) {
        fail("layer %d: must be in [0, %d)", layer, XMP_UT_LAYERS);
        return NULL;
    }
    if (n < 1) {
        fail("micro-batch %d: must be >= 1", n);
        return NULL;
    }
    xmp_ut_tp_t one = {1, 0, NULL, NULL, NULL};
    if (!tp)
        tp = &one;
    if (xmp_ut_tp_check(c, tp->size) != 0)
        return NULL;
    if (tp->rank < 0 || tp->rank >= tp->size) {
        fail("tensor-parallel rank %d: must be in [0, %d)", tp->rank, tp->size);
        return NULL;
    }
    if (tp->size > 1 && (!tp->box_p_to_b || !tp->gather_channels)) {
        fail("tensor-parallel degree %d: no boxing functions given", tp->size);
        return NULL;
    }
    xmp_ut_layer_t *l = calloc(1, sizeof *l);
    if (!l) {
        fail("out of memory");
        return NULL;
    }
    l->cf = *c;
    l->layer = layer;
    l->n = n;
    l->tp = *tp;
    if (build_layer(c, layer, n, tp->size, tp->rank, &l->pl, NULL) != 0) {
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
        fail("layer %s: out of memory for %zu floats", g_names[layer], 2 * tot + col + scr);
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

xmp_ut_layer_t *xmp_ut_layer_create(const xmp_ut_config_t *c, int layer, int n)
{
    return xmp_ut_layer_create_tp(c, layer, n, NULL);
}

size_t xmp_ut_layer_param_floats(const xmp_ut_layer_t *l)
{
    return l->pl.lfloats;
}

size_t xmp_ut_layer_activation_floats(const xmp_ut_layer_t *l)
{
    return l->grad_floats; /* value buffers: as many floats as the gradient buffers */
}

int xmp_ut_layer_attn_split(const xmp_ut_layer_t *l)
{
    return l->pl.attn_split;
}

/* Copies this rank's block of every parameter tensor between the full layer layout (full) and
 * the local one (local); to_local selects the direction. */
static void slice_params(const xmp_ut_layer_t *l, float *full, float *local, int to_local)
{
    const int tp = l->tp.size, r = l->tp.rank;
    for (int k = 0; k < l->pl.npt; k++) {
        const ptens_t *q = &l->pl.pt[k];
        if (q->split < 0) {
            if (to_local)
                memcpy(local + q->loff, full + q->goff, q->lcount * sizeof(float));
            else
                memcpy(full + q->goff, local + q->loff, q->lcount * sizeof(float));
            continue;
        }
        size_t outer = 1, inner = 1;
        for (int d = 0; d < q->split; d++)
            outer *= (size_t)q->shape[d];
        for (int d = q->split + 1; d < q->ndim; d++)
            inner *= (size_t)q->shape[d];
        size_t part = (size_t)(q->shape[q->split] / tp) * inner;
        for (size_t o = 0; o < outer; o++) {
            float *f = full + q->goff + o * (size_t)q->shape[q->split] * inner + (size_t)r * part;
            float *lp = local + q->loff + o * part;
            if (to_local)
                memcpy(lp, f, part * sizeof(float));
            else
                memcpy(f, lp, part * sizeof(float));
        }
    }
}

void xmp_ut_layer_param_slice(const xmp_ut_layer_t *l, const float *full, float *local)
{
    slice_params(l, (float *)full, local, 1);
}

void xmp_ut_layer_param_unslice(const xmp_ut_layer_t *l, const float *local, float *full)
{
    slice_params(l, full, (float *)local, 0);
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
/* The bias of op o, or NULL when it has none or this rank is not its holder (P output). */
static const float *bias_of(const xmp_ut_layer_t *l, const op_t *o, const float *w)
{
    return o->bias_holder && l->tp.rank != 0 ? NULL : pw(w, o->b);
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
        return fail("layer %s forward: missing input or output (w %p x %p skip_in %p cond %p y "
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
            rc = xmp_unet_conv2d_forward(&o->conv, v[o->in0], w + o->w, bias_of(l, o, w), v[o->out],
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
            rc = xmp_unet_linear_forward(o->n, o->c, o->c2, v[o->in0], w + o->w, bias_of(l, o, w),
                                         v[o->out]);
            break;
        case OP_ATTN:
            rc = xmp_unet_attn_forward(&o->attn, v[o->in0], v[o->in1], v[o->in2], v[o->out],
                                       v[o->aux0]);
            break;
        case OP_ADD:
            rc = xmp_unet_add_forward(pl->bufsz[o->out], v[o->in0], v[o->in1], v[o->out]);
            break;
        case OP_BOXF:
        case OP_BOXB:
            memcpy(v[o->out], v[o->in0], pl->bufsz[o->out] * sizeof(float));
            if (o->kind == OP_BOXF &&
                l->tp.box_p_to_b(l->tp.user, v[o->out], pl->bufsz[o->out]) != 0)
                return fail("layer %s op %d: tensor-parallel boxing P -> B failed",
                            g_names[l->layer], i);
            break;
        case OP_GATHER:
            if (l->tp.gather_channels(l->tp.user, v[o->in0], v[o->out], o->n, o->c, o->hw) != 0)
                return fail("layer %s op %d: tensor-parallel boxing S(1) -> B failed",
                            g_names[l->layer], i);
            break;
        }
        if (rc != 0)
            return fail("layer %s op %d: %s", g_names[l->layer], i, xmp_unet_last_error());
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
        return fail("layer %s backward_input: missing w, dy or dskip_in", g_names[l->layer]);
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
        case OP_BOXF: /* the gradient of the P input is the B gradient */
            if (gr(l, o->in0))
                acc(gr(l, o->in0), g, pl->bufsz[o->out]);
            break;
        case OP_BOXB: /* every rank's partial gradient, summed: P -> B */
            if (l->tp.box_p_to_b(l->tp.user, g, pl->bufsz[o->out]) != 0)
                return fail("layer %s op %d backward: tensor-parallel boxing P -> B failed",
                            g_names[l->layer], i);
            if (gr(l, o->in0))
                acc(gr(l, o->in0), g, pl->bufsz[o->out]);
            break;
        case OP_GATHER: { /* B -> S(1): this rank's channel block */
            size_t blk = (size_t)(o->c / l->tp.size) * (size_t)o->hw;
            for (int im = 0; im < o->n; im++)
                acc(gr(l, o->in0) + (size_t)im * blk,
                    g + ((size_t)im * (size_t)l->tp.size + (size_t)l->tp.rank) * blk, blk);
            break;
        }
        }
        if (rc != 0)
            return fail("layer %s op %d backward: %s", g_names[l->layer], i, xmp_unet_last_error());
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
        return fail("layer %s backward_weight: dw is NULL", g_names[l->layer]);
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
            return fail("layer %s op %d weight backward: %s", g_names[l->layer], i,
                        xmp_unet_last_error());
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
        if (!(m->layers[l] = xmp_ut_layer_create(c, l, n)))
            goto fail_free;
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
    if (!g_err[0])
        fail("model: out of memory");
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
               : fail("loss: %s", xmp_unet_last_error());
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
        return fail("loss backward: %s", xmp_unet_last_error());
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
        return fail("optimizer: %s", xmp_unet_last_error());
    return 0;
}
