/* The U-Transformer on SBP tensors: strategy table and tape executor (see utransformer_sbp.h). */
#include "models/utransformer_sbp.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/utransformer_plan.h"
#include "nn/sbp_conv.h"
#include "nn/sbp_ops.h"

#define NAX XMP_MAX_MESH_DIMS
#define fail xmp_ut__fail

/* ------------------------------------------------------------------ memory */

/* Activation memory is measured by nn/sbp.h's allocation accounting (contract D): every tensor
 * of a tape is an xmp_tensor_alloc, counted there; xmp_ut_mem_track adds model buffers that are
 * not tensors. The xmp_ut_mem_* names are kept for the model's callers. */
void xmp_ut_mem_track(int64_t delta)
{
    xmp_mem_track(delta);
}
int64_t xmp_ut_mem_live_bytes(void)
{
    return xmp_mem_live_bytes();
}
int64_t xmp_ut_mem_peak_bytes(void)
{
    return xmp_mem_peak_bytes();
}
void xmp_ut_mem_peak_reset(void)
{
    xmp_mem_peak_reset();
}

/* Takes ownership of *src into *dst. */
static void own(xmp_tensor_t *dst, xmp_tensor_t *src)
{
    *dst = *src;
    memset(src, 0, sizeof *src);
}
static void drop(xmp_tensor_t *t)
{
    xmp_tensor_free(t);
    memset(t, 0, sizeof *t);
}

/* ---------------------------------------------------------------- strategy */

static const char *const k_params[] = {"conv.w",   "conv.b",   "down.w",   "down.b",   "conv1.w",
                                       "conv1.b",  "gn.gamma", "gn.beta",  "conv2.w",  "conv2.b",
                                       "attn.q.w", "attn.q.b", "attn.k.w", "attn.k.b", "attn.v.w",
                                       "attn.v.b", "attn.o.w", "attn.o.b", "up.w",     "up.b"};
static const char *const k_acts[] = {"act.x", "act.block", "act.up", "act.cond"};
#define NPARAMS ((int)(sizeof k_params / sizeof k_params[0]))

/* megatron's SBP on the tp axis per parameter class (the dp axis is always B). */
static const char *megatron_tp(const char *cls)
{
    static const struct {
        const char *cls, *tp;
    } t[] = {{"conv1.w", "S(0)"},  {"conv1.b", "S(0)"},  {"gn.gamma", "S(0)"}, {"gn.beta", "S(0)"},
             {"conv2.w", "S(1)"},  {"attn.q.w", "S(0)"}, {"attn.q.b", "S(0)"}, {"attn.k.w", "S(0)"},
             {"attn.k.b", "S(0)"}, {"attn.v.w", "S(0)"}, {"attn.v.b", "S(0)"}, {"attn.o.w", "S(1)"},
             {"up.w", "S(0)"},     {"up.b", "S(0)"}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(t[i].cls, cls))
            return t[i].tp;
    return "B";
}

static int appendf(char *buf, size_t n, size_t *pos, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int appendf(char *buf, size_t n, size_t *pos, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(buf + *pos, *pos < n ? n - *pos : 0, fmt, ap);
    va_end(ap);
    if (k < 0 || *pos + (size_t)k >= n)
        return -1;
    *pos += (size_t)k;
    return 0;
}

/* Heads of layer l's attention (0: none). */
static int layer_heads(const xmp_ut_config_t *c, int l)
{
    static _Thread_local xmp_ut_plan_t pl;
    if (xmp_ut__build(c, l, 1, 1, &pl, NULL) != 0)
        return 0;
    for (int i = 0; i < pl.nops; i++)
        if (pl.ops[i].kind == XMP_UT_OP_ATTN)
            return pl.ops[i].attn.heads;
    return 0;
}

int xmp_ut_strategy_builtin(const char *name, const xmp_ut_config_t *c, int naxes, const int *shape,
                            char *buf, size_t n)
{
    int mega = name && !strcmp(name, "megatron");
    if (!name || (!mega && strcmp(name, "dp")))
        return fail("strategy '%s': built-ins are dp and megatron", name ? name : "(null)");
    if (naxes != 2)
        return fail("strategy %s: defined for 2-axis (dp x tp) stage meshes, not %d axes", name,
                    naxes);
    size_t pos = 0;
    int rc = appendf(buf, n, &pos, "# U-Transformer strategy %s on a %dx%d (dp x tp) mesh\n", name,
                     shape[0], shape[1]);
    rc |= appendf(buf, n, &pos, "strategy %s axes=2\n", name);
    for (size_t i = 0; i < sizeof k_acts / sizeof k_acts[0]; i++)
        rc |= appendf(buf, n, &pos, "%-22s = S(0),B\n", k_acts[i]);
    for (int i = 0; i < NPARAMS; i++)
        rc |= appendf(buf, n, &pos, "%-22s = B,%s\n", k_params[i],
                      mega ? megatron_tp(k_params[i]) : "B");
    if (mega) {
        rc |= appendf(buf, n, &pos, "# the output norm sees replicated activations\n");
        rc |= appendf(buf, n, &pos, "%-22s = B,B\n%-22s = B,B\n", "out.gn.gamma", "out.gn.beta");
        for (int l = 0; l < XMP_UT_LAYERS; l++) {
            int h = layer_heads(c, l);
            if (!h || h % shape[1] == 0)
                continue;
            rc |= appendf(buf, n, &pos, "# %s: %d heads, not divisible by tp %d: replicated\n",
                          xmp_ut_layer_name(l), h, shape[1]);
            for (int k = 10; k < 18; k++) {
                char nm[48];
                snprintf(nm, sizeof nm, "%s.%s", xmp_ut_layer_name(l), k_params[k]);
                rc |= appendf(buf, n, &pos, "%-22s = B,B\n", nm);
            }
        }
    }
    return rc ? fail("strategy %s: text buffer of %zu bytes too small", name, n) : 0;
}

int xmp_ut_strategy_parse(const char *text, int naxes, xmp_ut_strategy_t *s)
{
    xmp_ut_strategy_t t;
    memset(&t, 0, sizeof t);
    t.naxes = naxes;
    if (!text || naxes < 1 || naxes > NAX)
        return fail("strategy: no text or %d axes", naxes);
    int lineno = 0, have_head = 0;
    for (const char *p = text; *p;) {
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        char line[256];
        lineno++;
        if (len >= sizeof line)
            return fail("strategy line %d: longer than %zu characters", lineno, sizeof line - 1);
        memcpy(line, p, len);
        line[len] = '\0';
        p += len + (e ? 1 : 0);
        char *h = strchr(line, '#');
        if (h)
            *h = '\0';
        char *a = line;
        while (*a == ' ' || *a == '\t')
            a++;
        size_t l = strlen(a);
        while (l && (a[l - 1] == ' ' || a[l - 1] == '\t' || a[l - 1] == '\r'))
            a[--l] = '\0';
        if (!*a)
            continue;
        if (!strncmp(a, "strategy ", 9)) {
            int ax = 0;
            char nm[32];
            if (sscanf(a + 9, "%31s axes=%d", nm, &ax) != 2)
                return fail("strategy line %d '%s': expected 'strategy NAME axes=N'", lineno, a);
            if (ax != naxes)
                return fail("strategy line %d: strategy %s is for %d axes, the mesh has %d", lineno,
                            nm, ax, naxes);
            snprintf(t.name, sizeof t.name, "%s", nm);
            have_head = 1;
            continue;
        }
        char *eq = strchr(a, '=');
        if (!eq)
            return fail("strategy line %d '%s': expected 'class = SBP,...'", lineno, a);
        *eq = '\0';
        char *nm = a, *sb = eq + 1;
        size_t nl = strlen(nm);
        while (nl && (nm[nl - 1] == ' ' || nm[nl - 1] == '\t'))
            nm[--nl] = '\0';
        while (*sb == ' ' || *sb == '\t')
            sb++;
        if (strstr(sb, "store"))
            return fail("strategy line %d, class %s: a storage SBP is not supported by the "
                        "U-Transformer yet (parameters are stored as computed)",
                        lineno, nm);
        if (!nl || nl >= sizeof t.c[0].name)
            return fail("strategy line %d: class name '%s' empty or too long", lineno, nm);
        if (t.n >= XMP_UT_MAX_CLASSES)
            return fail("strategy line %d: more than %d classes", lineno, XMP_UT_MAX_CLASSES);
        xmp_ut_class_sbp_t *c = &t.c[t.n];
        if (xmp_sbp_parse(sb, naxes, XMP_MAX_DIMS, c->sbp) != XMESH_SUCCESS)
            return fail("strategy line %d, class %s: %s", lineno, nm, xmp_last_error());
        for (int k = 0; k < t.n; k++)
            if (!strcmp(t.c[k].name, nm))
                return fail("strategy line %d: class %s given twice", lineno, nm);
        snprintf(c->name, sizeof c->name, "%s", nm);
        for (int ax = naxes; ax < NAX; ax++)
            c->sbp[ax] = xmp_sbp_b();
        t.n++;
    }
    if (!have_head)
        return fail("strategy: missing the 'strategy NAME axes=%d' line", naxes);
    *s = t;
    return 0;
}

int xmp_ut_strategy_load(const char *name, const xmp_ut_config_t *c, int naxes, const int *shape,
                         xmp_ut_strategy_t *s)
{
    static _Thread_local char text[16384];
    if (!name)
        return fail("strategy: no name");
    if (!strcmp(name, "dp") || !strcmp(name, "megatron")) {
        if (xmp_ut_strategy_builtin(name, c, naxes, shape, text, sizeof text) != 0)
            return -1;
    } else {
        FILE *f = fopen(name, "r");
        if (!f)
            return fail("strategy '%s': not dp, megatron or a readable file", name);
        size_t n = fread(text, 1, sizeof text - 1, f);
        int big = !feof(f);
        fclose(f);
        if (big)
            return fail("strategy file '%s': longer than %zu bytes", name, sizeof text - 1);
        text[n] = '\0';
    }
    if (xmp_ut_strategy_parse(text, naxes, s) != 0) {
        char msg[320];
        snprintf(msg, sizeof msg, "%s", xmp_ut_last_error());
        return fail("strategy '%s': %s", name, msg);
    }
    return 0;
}

int xmp_ut_strategy_format(const xmp_ut_strategy_t *s, char *buf, size_t n)
{
    size_t pos = 0;
    int rc = appendf(buf, n, &pos, "strategy %s axes=%d\n", s->name, s->naxes);
    for (int i = 0; i < s->n; i++) {
        char sb[64];
        xmp_sbp_string(s->c[i].sbp, s->naxes, sb, sizeof sb);
        rc |= appendf(buf, n, &pos, "%-22s = %s\n", s->c[i].name, sb);
    }
    return rc ? fail("strategy %s: text buffer of %zu bytes too small", s->name, n) : 0;
}

const xmp_sbp_t *xmp_ut_strategy_get(const xmp_ut_strategy_t *s, const char *layer, const char *cls)
{
    char q[96];
    if (layer) {
        snprintf(q, sizeof q, "%s.%s", layer, cls);
        for (int i = 0; i < s->n; i++)
            if (!strcmp(s->c[i].name, q))
                return s->c[i].sbp;
    }
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->c[i].name, cls))
            return s->c[i].sbp;
    return NULL;
}

static int is_s(xmp_sbp_t s, int d)
{
    return s.kind == XMP_S && s.dim == d;
}

int xmp_ut_strategy_check(const xmp_ut_strategy_t *s, const xmp_ut_config_t *c, int first, int last,
                          const int *shape)
{
    static _Thread_local xmp_ut_plan_t pl;
    /* every line names a known class, optionally qualified by a layer name */
    for (int i = 0; i < s->n; i++) {
        const char *nm = s->c[i].name, *dot = strchr(nm, '.');
        for (int l = 0; dot && l < XMP_UT_LAYERS; l++) { /* strip a layer qualifier */
            size_t k = strlen(xmp_ut_layer_name(l));
            if ((size_t)(dot - nm) == k && !strncmp(nm, xmp_ut_layer_name(l), k)) {
                nm = dot + 1;
                break;
            }
        }
        int known = 0;
        for (int k = 0; k < NPARAMS && !known; k++)
            known = !strcmp(nm, k_params[k]);
        for (size_t k = 0; k < sizeof k_acts / sizeof k_acts[0] && !known; k++)
            known = !strcmp(nm, k_acts[k]);
        if (!known)
            return fail("strategy %s: unknown class '%s' (classes: act.x, act.block, act.up, "
                        "act.cond, conv.w, conv1.w, gn.gamma, attn.q.w, ... each optionally "
                        "prefixed by a layer name)",
                        s->name, s->c[i].name);
    }
    for (int l = first; l <= last; l++) {
        const char *ln = xmp_ut_layer_name(l);
        if (xmp_ut__build(c, l, 1, 1, &pl, NULL) != 0)
            return -1;
        const xmp_sbp_t *ax = xmp_ut_strategy_get(s, ln, "act.x");
        if (!ax || (xmp_ut_layer_uses_cond(c, l) && !xmp_ut_strategy_get(s, ln, "act.cond")))
            return fail("strategy %s: no SBP for class %s of layer %s", s->name,
                        ax ? "act.cond" : "act.x", ln);
        for (int k = 0; k < pl.npt; k++)
            if (!xmp_ut_strategy_get(s, ln, pl.pt[k].name))
                return fail("strategy %s: no SBP for parameter class %s (layer %s)", s->name,
                            pl.pt[k].name, ln);
        for (int i = 0; i < pl.nops; i++) {
            const xmp_ut_op_t *o = &pl.ops[i];
            if (o->kind == XMP_UT_OP_BOX && !xmp_ut_strategy_get(s, ln, o->cls))
                return fail("strategy %s: no SBP for activation class %s (layer %s)", s->name,
                            o->cls, ln);
            if (o->kind == XMP_UT_OP_ATTN) {
                const xmp_sbp_t *q = xmp_ut_strategy_get(s, ln, "attn.q.w");
                const xmp_sbp_t *in = xmp_ut_strategy_get(s, ln, "act.block");
                int pieces = 1, a0 = -1;
                for (int a = 0; q && in && a < s->naxes; a++)
                    if (is_s(q[a], 0) && in[a].kind != XMP_S)
                        pieces *= shape[a], a0 = a;
                if (o->attn.heads % pieces != 0)
                    return fail("strategy %s, layer %s: attention heads %d not divisible by the "
                                "%d channel pieces (mesh axis %d of size %d; class attn.q.w): "
                                "give %s.attn.* B on that axis",
                                s->name, ln, o->attn.heads, pieces, a0, shape[a0], ln);
            }
        }
    }
    return 0;
}

/* ------------------------------------------------------------- the layer */

struct xmp_ut_slayer {
    xmp_ut_config_t cf;
    int layer, nb;
    xmp_mesh_t *mesh;
    xmp_ut_plan_t pl;
    xmp_sbp_t actx[NAX], cond[NAX];
    xmp_sbp_t box[XMP_UT_MAX_OPS][NAX];
    xmp_tensor_t p[XMP_UT_MAX_PT], g[XMP_UT_MAX_PT];
    int gset[XMP_UT_MAX_PT];
    float *vel[XMP_UT_MAX_PT];
};

struct xmp_ut_tape {
    xmp_ut_slayer_t *l;
    xmp_tensor_t v[XMP_UT_MAX_BUF], g[XMP_UT_MAX_BUF];
    xmp_gn_cache_t gn[XMP_UT_MAX_OPS];
    xmp_mha_cache_t mha[XMP_UT_MAX_OPS];
};

static void set_sbp(xmp_sbp_t *dst, const xmp_sbp_t *src)
{
    for (int a = 0; a < NAX; a++)
        dst[a] = src ? src[a] : xmp_sbp_b();
}

void xmp_ut_slayer_destroy(xmp_ut_slayer_t *l)
{
    if (!l)
        return;
    for (int k = 0; k < XMP_UT_MAX_PT; k++) {
        xmp_tensor_free(&l->p[k]);
        xmp_tensor_free(&l->g[k]);
        free(l->vel[k]);
    }
    free(l);
}

xmp_ut_slayer_t *xmp_ut_slayer_create(const xmp_ut_config_t *c, int layer, int nb, xmp_mesh_t *mesh,
                                      const xmp_ut_strategy_t *s, const float *full)
{
    if (layer < 0 || layer >= XMP_UT_LAYERS || nb < 1 || !mesh || !s || !full ||
        s->naxes != mesh->ndim) {
        fail("SBP layer %d: bad arguments (nb %d, mesh %d axes, strategy %d axes)", layer, nb,
             mesh ? mesh->ndim : 0, s ? s->naxes : 0);
        return NULL;
    }
    xmp_ut_slayer_t *l = calloc(1, sizeof *l);
    if (!l) {
        fail("out of memory");
        return NULL;
    }
    const char *ln = xmp_ut_layer_name(layer);
    l->cf = *c;
    l->layer = layer;
    l->nb = nb;
    l->mesh = mesh;
    if (xmp_ut__build(c, layer, nb, 1, &l->pl, NULL) != 0)
        goto out_free;
    set_sbp(l->actx, xmp_ut_strategy_get(s, ln, "act.x"));
    set_sbp(l->cond, xmp_ut_strategy_get(s, ln, "act.cond"));
    for (int i = 0; i < l->pl.nops; i++)
        if (l->pl.ops[i].kind == XMP_UT_OP_BOX) {
            const xmp_sbp_t *b = xmp_ut_strategy_get(s, ln, l->pl.ops[i].cls);
            if (!b) {
                fail("layer %s: no SBP for activation class %s", ln, l->pl.ops[i].cls);
                goto out_free;
            }
            set_sbp(l->box[i], b);
        }
    for (int k = 0; k < l->pl.npt; k++) {
        const xmp_ut_ptens_t *q = &l->pl.pt[k];
        const xmp_sbp_t *b = xmp_ut_strategy_get(s, ln, q->name);
        if (!b) {
            fail("layer %s: no SBP for parameter class %s", ln, q->name);
            goto out_free;
        }
        if (xmp_tensor_alloc(&l->p[k], mesh, q->ndim, q->shape, XMESH_F32, b) != XMESH_SUCCESS ||
            xmp_tensor_fill_from_full(&l->p[k], full + q->off) != XMESH_SUCCESS) {
            fail("layer %s parameter %s: %s", ln, q->name, xmp_last_error());
            goto out_free;
        }
        if (!(l->vel[k] = calloc((size_t)l->p[k].lcount + 1, sizeof(float)))) {
            fail("out of memory");
            goto out_free;
        }
    }
    return l;
out_free:
    xmp_ut_slayer_destroy(l);
    return NULL;
}

int64_t xmp_ut_slayer_param_bytes(const xmp_ut_slayer_t *l)
{
    int64_t n = 0;
    for (int k = 0; k < l->pl.npt; k++)
        n += l->p[k].lcount * (int64_t)sizeof(float);
    return n;
}

int xmp_ut_slayer_gather_params(const xmp_ut_slayer_t *l, float *full)
{
    for (int k = 0; k < l->pl.npt; k++)
        if (xmp_tensor_gather_full(&l->p[k], full + l->pl.pt[k].off) != XMESH_SUCCESS)
            return fail("layer %s: gather %s: %s", xmp_ut_layer_name(l->layer), l->pl.pt[k].name,
                        xmp_last_error());
    return 0;
}

int xmp_ut_slayer_gather_grads(const xmp_ut_slayer_t *l, float *full)
{
    for (int k = 0; k < l->pl.npt; k++) {
        float *dst = full + l->pl.pt[k].off;
        if (!l->g[k].mesh)
            memset(dst, 0, l->pl.pt[k].count * sizeof(float));
        else if (xmp_tensor_gather_full(&l->g[k], dst) != XMESH_SUCCESS)
            return fail("layer %s: gather gradient of %s: %s", xmp_ut_layer_name(l->layer),
                        l->pl.pt[k].name, xmp_last_error());
    }
    return 0;
}

void xmp_ut_tape_free(xmp_ut_tape_t *t)
{
    if (!t)
        return;
    for (int b = 0; b < XMP_UT_MAX_BUF; b++) {
        drop(&t->v[b]);
        drop(&t->g[b]);
    }
    for (int i = 0; i < XMP_UT_MAX_OPS; i++) {
        drop(&t->gn[i].mean);
        drop(&t->gn[i].rstd);
        drop(&t->mha[i].probs);
    }
    free(t);
}

static int op_fail(const xmp_ut_slayer_t *l, int i, const char *what)
{
    return fail("layer %s op %d (%s): %s", xmp_ut_layer_name(l->layer), i, what, xmp_last_error());
}

/* Forward of op i of layer l's plan on tape t into *o (caches into t). */
static xmesh_result_t run_op(xmp_ut_slayer_t *l, xmp_ut_tape_t *t, int i, xmp_tensor_t *o_)
{
    const xmp_ut_op_t *op = &l->pl.ops[i];
    xmp_tensor_t *v = t->v, o;
    memset(&o, 0, sizeof o);
    const xmp_tensor_t *w = op->wi >= 0 ? &l->p[op->wi] : NULL;
    const xmp_tensor_t *b = op->bi >= 0 ? &l->p[op->bi] : NULL;
    xmesh_result_t r = XMESH_SUCCESS;
    switch (op->kind) {
    case XMP_UT_OP_CONV:
        r = xmp_conv2d_forward(&v[op->in0], w, b, op->conv.stride, op->conv.pad, &o);
        break;
    case XMP_UT_OP_GN:
        r = xmp_groupnorm_forward(&v[op->in0], w, b, op->g, &o, &t->gn[i]);
        break;
    case XMP_UT_OP_SILU:
        r = xmp_silu_forward(&v[op->in0], &o);
        break;
    case XMP_UT_OP_UP:
        r = xmp_upsample2x_forward(&v[op->in0], &o);
        break;
    case XMP_UT_OP_CONCAT:
        r = xmp_concat_forward(&v[op->in0], &v[op->in1], &o);
        break;
    case XMP_UT_OP_TOK:
        r = xmp_to_tokens_forward(&v[op->in0], &o);
        break;
    case XMP_UT_OP_UNTOK:
        r = xmp_from_tokens_forward(&v[op->in0], op->h, op->wd, &o);
        break;
    case XMP_UT_OP_LIN:
        r = xmp_linear_forward(&v[op->in0], w, b, &o);
        break;
    case XMP_UT_OP_ATTN:
        r = xmp_mha_forward(&v[op->in0], &v[op->in1], &v[op->in2], op->attn.head_dim, &o,
                            &t->mha[i]);
        break;
    case XMP_UT_OP_ADD:
        r = xmp_add_forward(&v[op->in0], &v[op->in1], &o);
        break;
    case XMP_UT_OP_BOX:
        r = xmp_box(&v[op->in0], l->box[i], &o);
        break;
    }
    *o_ = o;
    return r;
}

int xmp_ut_slayer_forward(xmp_ut_slayer_t *l, const xmp_tensor_t *x, const xmp_tensor_t *skip_in,
                          const xmp_tensor_t *cond, xmp_ut_tape_t **tape, const xmp_tensor_t **y,
                          const xmp_tensor_t **skip_out)
{
    const xmp_ut_plan_t *pl = &l->pl;
    const char *ln = xmp_ut_layer_name(l->layer);
    if (!x || !tape || !y || (pl->skip_in >= 0 && !skip_in) || (pl->cond >= 0 && !cond) ||
        (pl->skip_out >= 0 && !skip_out))
        return fail("layer %s forward: missing input or output", ln);
    xmp_ut_tape_t *t = calloc(1, sizeof *t);
    if (!t)
        return fail("out of memory");
    t->l = l;
    xmp_tensor_t o;
    memset(&o, 0, sizeof o);
    if (xmp_box(x, l->actx, &o) != XMESH_SUCCESS)
        goto fail_box;
    own(&t->v[pl->in], &o);
    if (pl->skip_in >= 0) {
        if (xmp_box(skip_in, l->actx, &o) != XMESH_SUCCESS)
            goto fail_box;
        own(&t->v[pl->skip_in], &o);
    }
    if (pl->cond >= 0) {
        if (xmp_box(cond, l->cond, &o) != XMESH_SUCCESS)
            goto fail_box;
        own(&t->v[pl->cond], &o);
    }
    for (int i = 0; i < pl->nops; i++) {
        const xmp_ut_op_t *op = &pl->ops[i];
        xmp_tensor_t *v = t->v;
        xmesh_result_t r = run_op(l, t, i, &o);
        if (r != XMESH_SUCCESS) {
            op_fail(l, i, "forward");
            xmp_ut_tape_free(t);
            return -1;
        }
        own(&v[op->out], &o);
    }
    *tape = t;
    *y = &t->v[pl->out];
    if (skip_out)
        *skip_out = pl->skip_out >= 0 ? &t->v[pl->skip_out] : NULL;
    return 0;
fail_box:
    fail("layer %s forward: boxing an input: %s", ln, xmp_last_error());
    xmp_ut_tape_free(t);
    return -1;
}

static int same_sbp(const xmp_tensor_t *a, const xmp_tensor_t *b)
{
    for (int k = 0; k < a->mesh->ndim; k++)
        if (!xmp_sbp_eq(a->sbp[k], b->sbp[k]))
            return 0;
    return a->lcount == b->lcount;
}

/* *acc += *g (either SBP; takes ownership of *g). */
static xmesh_result_t accumulate(xmp_tensor_t *acc, xmp_tensor_t *g)
{
    if (!acc->mesh) {
        *acc = *g;
        memset(g, 0, sizeof *g);
        return XMESH_SUCCESS;
    }
    if (same_sbp(acc, g)) {
        for (int64_t i = 0; i < acc->lcount; i++)
            xmp_f32(acc)[i] += xmp_f32(g)[i];
        xmp_tensor_free(g);
        return XMESH_SUCCESS;
    }
    xmp_tensor_t s;
    xmesh_result_t r = xmp_add_forward(acc, g, &s);
    xmp_tensor_free(g);
    if (r)
        return r;
    xmp_tensor_free(acc);
    *acc = s;
    return XMESH_SUCCESS;
}

static int need(const xmp_ut_plan_t *pl, int b)
{
    return b >= 0 && !pl->nograd[b];
}

int xmp_ut_slayer_backward_input(xmp_ut_slayer_t *l, xmp_ut_tape_t *t, const xmp_tensor_t *dy,
                                 const xmp_tensor_t *dskip_out, xmp_tensor_t *dx,
                                 xmp_tensor_t *dskip_in)
{
    const xmp_ut_plan_t *pl = &l->pl;
    const char *ln = xmp_ut_layer_name(l->layer);
    if (!t || !dy || (pl->skip_in >= 0 && !dskip_in))
        return fail("layer %s backward_input: missing tape, dy or dskip_in", ln);
    xmp_tensor_t o, o2, o3;
    memset(&o, 0, sizeof o);
    if (xmp_box(dy, dy->sbp, &o) != XMESH_SUCCESS || accumulate(&t->g[pl->out], &o))
        return fail("layer %s backward: dy: %s", ln, xmp_last_error());
    if (pl->skip_out >= 0 && dskip_out &&
        (xmp_box(dskip_out, dskip_out->sbp, &o) != XMESH_SUCCESS ||
         accumulate(&t->g[pl->skip_out], &o)))
        return fail("layer %s backward: dskip: %s", ln, xmp_last_error());
    for (int i = pl->nops - 1; i >= 0; i--) {
        const xmp_ut_op_t *op = &pl->ops[i];
        const xmp_tensor_t *G = &t->g[op->out], *v = t->v;
        const xmp_tensor_t *w = op->wi >= 0 ? &l->p[op->wi] : NULL;
        xmesh_result_t r = XMESH_SUCCESS;
        int n0 = need(pl, op->in0), n1 = need(pl, op->in1), n2 = need(pl, op->in2);
        int got0 = 0, got1 = 0, got2 = 0;
        if (!G->mesh)
            continue; /* no gradient reached this op's output */
        memset(&o, 0, sizeof o);
        memset(&o2, 0, sizeof o2);
        memset(&o3, 0, sizeof o3);
        switch (op->kind) {
        case XMP_UT_OP_CONV:
            if (n0)
                r = xmp_conv2d_backward_input(G, &v[op->in0], w, op->conv.stride, op->conv.pad, &o),
                got0 = 1;
            break;
        case XMP_UT_OP_GN:
            if (n0)
                r = xmp_groupnorm_backward(G, &v[op->in0], w, op->g, &t->gn[i], &o, NULL, NULL),
                got0 = 1;
            break;
        case XMP_UT_OP_SILU:
            r = xmp_silu_backward(G, &v[op->in0], &o), got0 = n0;
            break;
        case XMP_UT_OP_UP:
            r = xmp_upsample2x_backward(G, &v[op->in0], &o), got0 = n0;
            break;
        case XMP_UT_OP_CONCAT:
            r = xmp_concat_backward(G, &v[op->in0], &v[op->in1], n0 ? &o : NULL, n1 ? &o2 : NULL);
            got0 = n0, got1 = n1;
            break;
        case XMP_UT_OP_TOK:
            r = xmp_to_tokens_backward(G, &v[op->in0], &o), got0 = n0;
            break;
        case XMP_UT_OP_UNTOK:
            r = xmp_from_tokens_backward(G, &v[op->in0], op->h, op->wd, &o), got0 = n0;
            break;
        case XMP_UT_OP_LIN:
            if (n0)
                r = xmp_linear_backward_input(G, w, &o), got0 = 1;
            break;
        case XMP_UT_OP_ATTN:
            r = xmp_mha_backward(G, &v[op->in0], &v[op->in1], &v[op->in2], op->attn.head_dim,
                                 &t->mha[i], &o, &o2, &o3);
            got0 = 1, got1 = 1, got2 = 1;
            break;
        case XMP_UT_OP_ADD:
            r = xmp_add_backward(G, &v[op->in0], &v[op->in1], n0 ? &o : NULL, n1 ? &o2 : NULL);
            got0 = n0, got1 = n1;
            break;
        case XMP_UT_OP_BOX:
            r = xmp_box_backward(G, v[op->in0].sbp, &o), got0 = n0;
            break;
        }
        if (r != XMESH_SUCCESS)
            return op_fail(l, i, "backward");
        if ((got0 && n0 && accumulate(&t->g[op->in0], &o)) ||
            (got1 && n1 && accumulate(&t->g[op->in1], &o2)) ||
            (got2 && n2 && accumulate(&t->g[op->in2], &o3))) {
            xmp_tensor_free(&o), xmp_tensor_free(&o2), xmp_tensor_free(&o3);
            return op_fail(l, i, "gradient accumulation");
        }
        xmp_tensor_free(&o), xmp_tensor_free(&o2), xmp_tensor_free(&o3);
    }
    /* edge gradients: act.x's gradient SBP (zero if nothing reached the input) */
    struct {
        int b;
        xmp_tensor_t *out;
    } e[2] = {{pl->in, dx}, {pl->skip_in, dskip_in}};
    for (int k = 0; k < 2; k++) {
        if (!e[k].out || e[k].b < 0 || !need(pl, e[k].b))
            continue;
        xmesh_result_t r;
        if (t->g[e[k].b].mesh)
            r = xmp_box(&t->g[e[k].b], l->actx, e[k].out);
        else
            r = xmp_tensor_alloc_like(e[k].out, &t->v[e[k].b]);
        if (r != XMESH_SUCCESS)
            return fail("layer %s backward: input gradient: %s", ln, xmp_last_error());
    }
    return 0;
}

int xmp_ut_slayer_backward_weight(xmp_ut_slayer_t *l, xmp_ut_tape_t *t)
{
    const xmp_ut_plan_t *pl = &l->pl;
    if (!t)
        return fail("layer %s backward_weight: no tape", xmp_ut_layer_name(l->layer));
    int rc = 0;
    for (int i = pl->nops - 1; i >= 0 && !rc; i--) {
        const xmp_ut_op_t *op = &pl->ops[i];
        const xmp_tensor_t *G = &t->g[op->out], *x = &t->v[op->in0 >= 0 ? op->in0 : 0];
        if (op->wi < 0 || !G->mesh)
            continue;
        xmp_tensor_t dw, db;
        memset(&dw, 0, sizeof dw);
        memset(&db, 0, sizeof db);
        xmesh_result_t r = XMESH_SUCCESS;
        if (op->kind == XMP_UT_OP_CONV)
            r = xmp_conv2d_backward_weight(G, x, &l->p[op->wi], op->conv.stride, op->conv.pad, &dw,
                                           &db);
        else if (op->kind == XMP_UT_OP_GN)
            r = xmp_groupnorm_backward(G, x, &l->p[op->wi], op->g, &t->gn[i], NULL, &dw, &db);
        else if (op->kind == XMP_UT_OP_LIN)
            r = xmp_linear_backward_weight(G, x, &dw, &db);
        if (r != XMESH_SUCCESS) {
            rc = op_fail(l, i, "weight gradient");
            break;
        }
        if (accumulate(&l->g[op->wi], &dw) || accumulate(&l->g[op->bi], &db)) {
            xmp_tensor_free(&dw), xmp_tensor_free(&db);
            rc = op_fail(l, i, "weight gradient accumulation");
        }
    }
    xmp_ut_tape_free(t);
    return rc;
}

int xmp_ut_slayer_reduce(xmp_ut_slayer_t *l)
{
    for (int k = 0; k < l->pl.npt; k++) {
        if (!l->g[k].mesh)
            continue;
        if (xmp_box_inplace(&l->g[k], l->p[k].sbp) != XMESH_SUCCESS ||
            l->g[k].lcount != l->p[k].lcount)
            return fail("layer %s: gradient of %s to %s: %s", xmp_ut_layer_name(l->layer),
                        l->pl.pt[k].name, l->p[k].spec, xmp_last_error());
    }
    return 0;
}

int xmp_ut_slayer_update(xmp_ut_slayer_t *l, float lr, float momentum, float wd)
{
    for (int k = 0; k < l->pl.npt; k++) {
        xmp_tensor_t *p = &l->p[k], *g = &l->g[k];
        if (!p->lcount)
            continue;
        float *gz = NULL;
        if (!g->mesh && !(gz = calloc((size_t)p->lcount, sizeof(float))))
            return fail("out of memory");
        if (g->mesh && !same_sbp(g, p))
            return fail("layer %s: gradient of %s is %s, not reduced to %s",
                        xmp_ut_layer_name(l->layer), l->pl.pt[k].name, g->spec, p->spec);
        int rc = xmp_unet_sgd_nesterov((size_t)p->lcount, lr, momentum, wd, xmp_f32(p), l->vel[k],
                                       gz ? gz : xmp_f32(g));
        free(gz);
        xmp_tensor_free(g);
        memset(g, 0, sizeof *g);
        if (rc != 0)
            return fail("optimizer: %s", xmp_unet_last_error());
    }
    return 0;
}

/* Whether buffer b is one the tape must keep under block recomputation: the layer's inputs
 * (the recomputation starts from them) and outputs (the next layer's inputs). */
static int kept_buf(const xmp_ut_plan_t *pl, int b)
{
    return b == pl->in || b == pl->skip_in || b == pl->cond || b == pl->out || b == pl->skip_out;
}

int xmp_ut_tape_drop(xmp_ut_tape_t *t, int mode)
{
    const xmp_ut_plan_t *pl = &t->l->pl;
    for (int i = 0; i < pl->nops; i++) {
        const xmp_ut_op_t *op = &pl->ops[i];
        if (mode == XMP_UT_RECOMPUTE_BLOCK) {
            if (!kept_buf(pl, op->out))
                drop(&t->v[op->out]);
            drop(&t->gn[i].mean);
            drop(&t->gn[i].rstd);
            drop(&t->mha[i].probs);
        } else if (mode == XMP_UT_RECOMPUTE_SELECTIVE && op->kind == XMP_UT_OP_ATTN) {
            drop(&t->mha[i].probs);
        }
    }
    return 0;
}

int xmp_ut_tape_recompute(xmp_ut_tape_t *t, int mode)
{
    xmp_ut_slayer_t *l = t->l;
    const xmp_ut_plan_t *pl = &l->pl;
    if (mode != XMP_UT_RECOMPUTE_BLOCK && mode != XMP_UT_RECOMPUTE_SELECTIVE)
        return 0;
    for (int i = 0; i < pl->nops; i++) {
        const xmp_ut_op_t *op = &pl->ops[i];
        if (mode == XMP_UT_RECOMPUTE_SELECTIVE && op->kind != XMP_UT_OP_ATTN)
            continue;
        xmp_tensor_t o;
        if (run_op(l, t, i, &o) != XMESH_SUCCESS)
            return op_fail(l, i, "recomputation");
        if (t->v[op->out].data) /* kept: the same values (the forward is deterministic) */
            drop(&o);
        else
            own(&t->v[op->out], &o);
    }
    return 0;
}
