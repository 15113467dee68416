/* The U-Transformer on SBP tensors: strategy table and tape executor (see utransformer_sbp.h). */
#include "models/utransformer_sbp.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/utransformer_graph.h"
#include "models/utransformer_plan.h"
#include "nn/param.h"
#include "nn/sbp_conv.h"
#include "nn/sbp_ops.h"

#define NAX XMP_MAX_MESH_DIMS

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

/* Roles of a mesh axis in the built-ins: data (and 3d's R), tensor (megatron), 3d's A, 3d's K. */
enum { R_DATA, R_TP, R_A, R_K };

/* SBP of class cls (no layer prefix) on an axis of role r: megatron's tensor axis and 3d's A
 * split the same way (output channels of conv1, group norm, q/k/v heads, up conv; input
 * channels of conv2 and the attention output); K is the transposed split (AutoDDL's third axis:
 * input channels of conv1, q/k/v and the down / up / in / out convs; output channels of conv2
 * and the attention output), so the layers alternate and no boxing sits inside a pair. */
static const char *role_sbp(int r, const char *cls)
{
    static const struct {
        const char *cls, *tp, *k;
    } t[] = {
        {"conv.w", "B", "S(1)"},      {"down.w", "B", "S(1)"},      {"conv1.w", "S(0)", "S(1)"},
        {"conv1.b", "S(0)", "B"},     {"gn.gamma", "S(0)", "B"},    {"gn.beta", "S(0)", "B"},
        {"conv2.w", "S(1)", "S(0)"},  {"conv2.b", "B", "S(0)"},     {"attn.q.w", "S(0)", "S(1)"},
        {"attn.q.b", "S(0)", "B"},    {"attn.k.w", "S(0)", "S(1)"}, {"attn.k.b", "S(0)", "B"},
        {"attn.v.w", "S(0)", "S(1)"}, {"attn.v.b", "S(0)", "B"},    {"attn.o.w", "S(1)", "S(0)"},
        {"attn.o.b", "B", "S(0)"},    {"up.w", "S(0)", "S(1)"},     {"up.b", "S(0)", "B"},
        {"act.x", "B", "S(1)"},       {"act.block", "B", "S(1)"},   {"act.up", "B", "B"},
        {"act.cond", "B", "S(2)"}};
    int act = !strncmp(cls, "act.", 4);
    if (r == R_DATA)
        return act ? "S(0)" : "B";
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(t[i].cls, cls))
            return r == R_K ? t[i].k : t[i].tp;
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

static int is_up_layer(int l)
{
    return l == XMP_UT_UP1 || l == XMP_UT_UP2 || l == XMP_UT_UP3 || l == XMP_UT_UP4;
}

/* SBP of class cls in layer l (-1: the class line) on an axis of role r; *why explains a layer
 * line that differs from the class line. heads_ok: the layer's heads divide the channel pieces. */
static const char *layer_sbp(int r, int l, const char *cls, int heads_ok, const char **why)
{
    const char *v = role_sbp(r, cls);
    if (l < 0)
        return v;
    if ((r == R_TP || r == R_A) && !heads_ok && !strncmp(cls, "attn.", 5)) {
        *why = "heads not divisible by the channel pieces: attention replicated on that axis";
        return "B";
    }
    if (l == XMP_UT_OUT && !strncmp(cls, "gn.", 3)) {
        *why = "the output norm's gamma and beta follow its input act.x (channel split on K)";
        return r == R_K ? "S(0)" : "B";
    }
    if (r == R_K && is_up_layer(l) && !strcmp(cls, "act.x")) {
        *why = "the channel concat takes no channel split: act.x boxed to B on K";
        return "B";
    }
    return v;
}

static const char *const k_layer_classes[] = {"act.x",    "gn.gamma", "gn.beta",  "attn.q.w",
                                              "attn.q.b", "attn.k.w", "attn.k.b", "attn.v.w",
                                              "attn.v.b", "attn.o.w", "attn.o.b"};
#define NLAYERCLS ((int)(sizeof k_layer_classes / sizeof k_layer_classes[0]))

static int is_weight(const char *cls)
{
    size_t n = strlen(cls);
    return n > 2 && !strcmp(cls + n - 2, ".w");
}

/* Writes one line: cls = SBP per axis [store ...] (depth >= 0: weights stored S(0) there). */
static int class_line(char *buf, size_t n, size_t *pos, const char *name, const char *cls,
                      const int *role, int naxes, int l, int heads_ok, int depth)
{
    const char *why = NULL;
    int rc = appendf(buf, n, pos, "%-22s =", name);
    for (int a = 0; a < naxes; a++)
        rc |=
            appendf(buf, n, pos, "%s%s", a ? "," : " ", layer_sbp(role[a], l, cls, heads_ok, &why));
    if (depth >= 0 && is_weight(cls))
        for (int a = 0; a < naxes; a++) {
            const char *v = layer_sbp(role[a], l, cls, heads_ok, &why);
            rc |= appendf(buf, n, pos, "%s%s", a ? "," : " store ", a == depth ? "S(0)" : v);
        }
    if (why)
        rc |= appendf(buf, n, pos, "   # %s", why);
    return rc | appendf(buf, n, pos, "\n");
}

int xmp_ut_strategy_builtin(void *user, const char *name, int naxes, const int *shape, char *buf,
                            size_t n, char *err, size_t errlen)
{
    const xmp_ut_config_t *c = user;
    int role[NAX], depth = -1, ones[NAX] = {1, 1, 1, 1};
    if (!name || !c)
        return 1;
    if (!shape)
        shape = ones;
    int dp = !strcmp(name, "dp"), mega = !strcmp(name, "megatron"), d3 = !strcmp(name, "3d"),
        ax = !strcmp(name, "axonn");
    if (!dp && !mega && !d3 && !ax)
        return 1;
    if (naxes < 1 || naxes > NAX) {
        snprintf(err, errlen, "built-in strategy '%s': mesh of %d axes (must be 1..%d)", name,
                 naxes, NAX);
        return -1;
    }
    if (ax && naxes < 3) {
        snprintf(err, errlen,
                 "built-in strategy 'axonn' needs a mesh of 3 or 4 axes (3d's R axis is the depth "
                 "axis its weights are stored split over); this mesh has %d",
                 naxes);
        return -1;
    }
    for (int a = 0; a < naxes; a++) {
        int k = 3 - (naxes - a); /* 3d / axonn: the last three axes R, A, K */
        static const int r3[3] = {R_DATA, R_A, R_K};
        role[a] = dp ? R_DATA : mega ? (a == naxes - 1 ? R_TP : R_DATA) : k < 0 ? R_DATA : r3[k];
    }
    if (ax)
        depth = naxes - 3;
    static const char *const rn[] = {"data", "tensor", "3d-A", "3d-K"};
    size_t pos = 0;
    int rc =
        appendf(buf, n, &pos, "# U-Transformer built-in '%s' on a mesh of %d axes (", name, naxes);
    for (int a = 0; a < naxes; a++)
        rc |= appendf(buf, n, &pos, "%s%d:%s", a ? " x " : "", shape[a],
                      a == depth ? "3d-R/depth" : rn[role[a]]);
    rc |= appendf(buf, n, &pos, ")\nstrategy %s axes=%d\n", name, naxes);
    for (size_t i = 0; i < sizeof k_acts / sizeof k_acts[0]; i++)
        rc |= class_line(buf, n, &pos, k_acts[i], k_acts[i], role, naxes, -1, 1, depth);
    for (int i = 0; i < NPARAMS; i++)
        rc |= class_line(buf, n, &pos, k_params[i], k_params[i], role, naxes, -1, 1, depth);
    /* layer lines where a layer's ops cannot take the class's split */
    for (int l = 0; l < XMP_UT_LAYERS; l++) {
        int h = layer_heads(c, l), pieces = 1, differs = 0;
        for (int a = 0; a < naxes; a++)
            if (role[a] == R_TP || role[a] == R_A)
                pieces *= shape[a];
        int heads_ok = !h || h % pieces == 0;
        for (int k = 0; k < NLAYERCLS; k++) {
            const char *why = NULL;
            int any = 0;
            for (int a = 0; a < naxes; a++)
                any |= strcmp(layer_sbp(role[a], l, k_layer_classes[k], heads_ok, &why),
                              role_sbp(role[a], k_layer_classes[k])) != 0;
            if (!any)
                continue;
            if (!differs++ && !heads_ok)
                rc |= appendf(buf, n, &pos, "# %s: %d heads, not divisible by %d channel pieces\n",
                              xmp_ut_layer_name(l), h, pieces);
            char nm[64];
            snprintf(nm, sizeof nm, "%s.%s", xmp_ut_layer_name(l), k_layer_classes[k]);
            rc |= class_line(buf, n, &pos, nm, k_layer_classes[k], role, naxes, l, heads_ok, depth);
        }
    }
    if (rc) {
        snprintf(err, errlen, "built-in strategy '%s': text longer than %zu bytes", name, n);
        return -1;
    }
    return 0;
}

int xmp_ut_strategy_load(const char *name, const xmp_ut_config_t *c, int naxes, const int *shape,
                         xmp_ut_strategy_t *s)
{
    char err[512];
    if (xmp_strategy_load_mesh(name, xmp_ut_strategy_builtin, (void *)c, XMP_UT_STRATEGY_BUILTINS,
                               naxes, shape, s, err, sizeof err) != 0)
        return xmp_ut__fail("%s", err);
    return 0;
}

static const xmp_strategy_entry_t *entry(const xmp_ut_strategy_t *s, const char *layer,
                                         const char *cls)
{
    char q[96];
    const xmp_strategy_entry_t *e = NULL;
    if (layer) {
        snprintf(q, sizeof q, "%s.%s", layer, cls);
        e = xmp_strategy_get(s, q);
    }
    return e ? e : xmp_strategy_get(s, cls);
}

const xmp_sbp_t *xmp_ut_strategy_get(const xmp_ut_strategy_t *s, const char *layer, const char *cls)
{
    const xmp_strategy_entry_t *e = entry(s, layer, cls);
    return e ? e->sbp : NULL;
}

const xmp_sbp_t *xmp_ut_strategy_store(const xmp_ut_strategy_t *s, const char *layer,
                                       const char *cls)
{
    const xmp_strategy_entry_t *e = entry(s, layer, cls);
    return e ? (e->has_store ? e->store : e->sbp) : NULL;
}

/* Strips a layer qualifier from a class name ("down1.attn.q.w" -> "attn.q.w"). */
static const char *base_class(const char *nm)
{
    const char *dot = strchr(nm, '.');
    for (int l = 0; dot && l < XMP_UT_LAYERS; l++) {
        size_t k = strlen(xmp_ut_layer_name(l));
        if ((size_t)(dot - nm) == k && !strncmp(nm, xmp_ut_layer_name(l), k))
            return dot + 1;
    }
    return nm;
}

/* The strategy as layer ln reads it, for nn/strategy's graph walk: for each class of the layer's
 * graph (activations, then parameters) the line "<ln>.<class>", else "<class>", under the class'
 * name (its line number kept for messages). */
static int layer_view(const xmp_ut_strategy_t *s, const xmp_graph_t *g, const char *ln,
                      xmp_strategy_t *v)
{
    memset(v, 0, sizeof *v);
    snprintf(v->name, sizeof v->name, "%s", s->name);
    snprintf(v->source, sizeof v->source, "%s", s->source);
    v->naxes = s->naxes;
    for (int par = 0; par <= 1; par++) {
        const char *cls[XMP_STRATEGY_MAX_CLASSES];
        int n = xmp_graph_classes(g, par, cls, NULL, XMP_STRATEGY_MAX_CLASSES);
        for (int i = 0; i < n && i < XMP_STRATEGY_MAX_CLASSES - v->n; i++) {
            const xmp_strategy_entry_t *e = entry(s, ln, cls[i]);
            if (!e)
                return xmp_ut__fail("strategy %s: no SBP for %s class %s (layer %s)", s->name,
                                    par ? "parameter" : "activation", cls[i], ln);
            v->e[v->n] = *e;
            snprintf(v->e[v->n].cls, sizeof v->e[v->n].cls, "%s", cls[i]);
            v->n++;
        }
    }
    return 0;
}

/* The U-Transformer's own rules on layer ln's graph, after nn/strategy's (every class, every
 * parameter rule): no activation is kept as a partial sum between ops, no feature map is split
 * spatially (a 3x3 convolution would need halos), no channel split feeds a concat, and the
 * attention heads divide the channel pieces of the mesh axes that split them. */
static int check_layer_rules(const xmp_ut_strategy_t *s, const xmp_ut_config_t *c,
                             const xmp_graph_t *g, const xmp_strategy_t *v, const char *ln,
                             const int *shape)
{
    const char *cls[XMP_STRATEGY_MAX_CLASSES];
    int nd[XMP_STRATEGY_MAX_CLASSES];
    int n = xmp_graph_classes(g, 0, cls, nd, XMP_STRATEGY_MAX_CLASSES);
    for (int i = 0; i < n && i < XMP_STRATEGY_MAX_CLASSES; i++) {
        const xmp_sbp_t *sbp = xmp_strategy_get(v, cls[i])->sbp;
        for (int a = 0; a < s->naxes; a++) {
            char sb[16];
            xmp_strategy_sbp_string(&sbp[a], 1, sb, sizeof sb);
            if (sbp[a].kind == XMP_P)
                return xmp_ut__fail(
                    "strategy %s: class %s (layer %s), mesh axis %d: SBP P: no rule keeps a boxed "
                    "activation as a partial sum between ops (give S or B)",
                    s->name, cls[i], ln, a);
            if (nd[i] == 4 && sbp[a].kind == XMP_S && sbp[a].dim >= 2)
                return xmp_ut__fail(
                    "strategy %s: class %s (layer %s), mesh axis %d: %s splits the image "
                    "(height or width): no rule (a 3x3 convolution would need halo "
                    "exchanges); split S(0) (batch) or S(1) (channels)",
                    s->name, cls[i], ln, a, sb);
        }
    }
    for (int i = 0; i < g->nnode; i++) {
        const xmp_gnode_t *o = &g->node[i];
        for (int k = 0; o->kind == XMP_GOP_CONCAT && k < o->nin; k++) {
            const char *vc = xmp_graph_ref_cls(g, o->in[k]);
            const xmp_strategy_entry_t *e = vc[0] ? xmp_strategy_get(v, vc) : NULL;
            for (int a = 0; e && a < s->naxes; a++)
                if (e->sbp[a].kind == XMP_S && e->sbp[a].dim == 1)
                    return xmp_ut__fail(
                        "strategy %s: class %s (layer %s), mesh axis %d: S(1) (channels) feeds "
                        "the skip concat, which has no channel-split rule; give %s.%s B or S(0) "
                        "there",
                        s->name, vc, ln, a, ln, vc);
        }
        if (o->kind != XMP_GOP_ATTENTION)
            continue;
        /* the output (N, T, heads * head_dim) */
        int heads = (int)(g->val[o->out].dim[2] / c->head_dim);
        const xmp_sbp_t *q = xmp_ut_strategy_get(s, ln, "attn.q.w");
        const xmp_sbp_t *in = xmp_ut_strategy_get(s, ln, "act.block");
        int pieces = 1, a0 = -1;
        for (int a = 0; q && in && a < s->naxes; a++)
            if (q[a].kind == XMP_S && q[a].dim == 0 && in[a].kind != XMP_S)
                pieces *= shape[a], a0 = a;
        if (heads % pieces != 0)
            return xmp_ut__fail("strategy %s, layer %s: attention heads %d not divisible by the "
                                "%d channel pieces (mesh axis %d of size %d; class attn.q.w): "
                                "give %s.attn.* B on that axis",
                                s->name, ln, heads, pieces, a0, shape[a0], ln);
    }
    return 0;
}

int xmp_ut_strategy_check(const xmp_ut_strategy_t *s, const xmp_ut_config_t *c, int first, int last,
                          const int *shape)
{
    /* every line names a known class, optionally qualified by a layer name */
    for (int i = 0; i < s->n; i++) {
        const char *nm = base_class(s->e[i].cls);
        int known = 0, act = 0;
        for (int k = 0; k < NPARAMS && !known; k++)
            known = !strcmp(nm, k_params[k]);
        for (size_t k = 0; k < sizeof k_acts / sizeof k_acts[0] && !known; k++)
            known = act = !strcmp(nm, k_acts[k]);
        if (!known)
            return xmp_ut__fail(
                "%s:%d: strategy %s: unknown class '%s' (classes: act.x, act.block, "
                "act.up, act.cond, conv.w, conv1.w, gn.gamma, attn.q.w, ... each "
                "optionally prefixed by a layer name)",
                s->source, s->e[i].line, s->name, s->e[i].cls);
        if (act && s->e[i].has_store)
            return xmp_ut__fail(
                "%s:%d: strategy %s: class %s is an activation; only parameters have a "
                "storage SBP",
                s->source, s->e[i].line, s->name, s->e[i].cls);
    }
    /* each layer's graph (models/utransformer_graph.h) through nn/strategy's walk, as GPT-2's
     * stages are (its classes, their dims, the parameter rules), then the model's own rules (the
     * U-Transformer's nodes carry no xmp_sbp_deduce rule, so nn/strategy's rule walk has none to
     * check) */
    static _Thread_local xmp_strategy_t v;
    for (int l = first; l <= last; l++) {
        const char *ln = xmp_ut_layer_name(l);
        char where[96], err[512];
        snprintf(where, sizeof where, "strategy %s, layer %s", s->name, ln);
        xmp_graph_t g;
        if (xmp_ut_graph(c, l, &g))
            return -1;
        int rc = layer_view(s, &g, ln, &v);
        if (!rc && xmp_strategy_check_graph_classes(&v, &g, where, err, sizeof err))
            rc = xmp_ut__fail("%s", err);
        if (!rc)
            rc = check_layer_rules(s, c, &g, &v, ln, shape);
        xmp_graph_free(&g);
        if (rc)
            return -1;
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
    /* parameters through the shared engine (nn/param.h): compute copy, stored shard, gradient
     * accumulator (P[k].g, empty until a contribution), reduced gradient (P[k].r), velocity */
    xmp_param_t P[XMP_UT_MAX_PT];
    xmp_overlap_t ov; /* overlap switches (xmp_ut_slayer_set_overlap) */
};

struct xmp_ut_tape {
    xmp_ut_slayer_t *l;
    xmp_tensor_t v[XMP_UT_MAX_BUF], g[XMP_UT_MAX_BUF];
    xmp_gn_cache_t gn[XMP_UT_MAX_OPS];
    xmp_mha_cache_t mha[XMP_UT_MAX_OPS];
    /* coll-matmul: box op i ran fused with the op before it (its input never stored; fsrc[i] is
     * the SBP that op produced); bwd-input: op i's weight gradient already accumulated */
    unsigned char fused[XMP_UT_MAX_OPS], wdone[XMP_UT_MAX_OPS];
    xmp_sbp_t fsrc[XMP_UT_MAX_OPS][NAX];
};

void xmp_ut_slayer_set_overlap(xmp_ut_slayer_t *l, const xmp_overlap_t *ov)
{
    if (l && ov)
        l->ov = *ov;
}

/* Waits for the prefetched gathers of the compute copies (prefetch; nothing in flight: no-op). */
static int wait_params(xmp_ut_slayer_t *l)
{
    int rc = 0;
    for (int k = 0; k < l->pl.npt; k++)
        if (xmp_param_gather_wait(&l->P[k]) != XMESH_SUCCESS && !rc)
            rc = xmp_ut__fail("layer %s: gathering %s: %s", xmp_ut_layer_name(l->layer),
                              l->pl.pt[k].name, xmp_last_error());
    return rc;
}

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
        xmp_param_free(&l->P[k]);
    }
    free(l);
}

xmp_ut_slayer_t *xmp_ut_slayer_create(const xmp_ut_config_t *c, int layer, int nb, xmp_mesh_t *mesh,
                                      const xmp_ut_strategy_t *s, const float *full)
{
    if (layer < 0 || layer >= XMP_UT_LAYERS || nb < 1 || !mesh || !s || !full ||
        s->naxes != mesh->ndim) {
        xmp_ut__fail("SBP layer %d: bad arguments (nb %d, mesh %d axes, strategy %d axes)", layer,
                     nb, mesh ? mesh->ndim : 0, s ? s->naxes : 0);
        return NULL;
    }
    xmp_ut_slayer_t *l = calloc(1, sizeof *l);
    if (!l) {
        xmp_ut__fail("out of memory");
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
                xmp_ut__fail("layer %s: no SBP for activation class %s", ln, l->pl.ops[i].cls);
                goto out_free;
            }
            set_sbp(l->box[i], b);
        }
    for (int k = 0; k < l->pl.npt; k++) {
        const xmp_ut_ptens_t *q = &l->pl.pt[k];
        const xmp_sbp_t *b = xmp_ut_strategy_get(s, ln, q->name);
        if (!b) {
            xmp_ut__fail("layer %s: no SBP for parameter class %s", ln, q->name);
            goto out_free;
        }
        if (xmp_param_init(&l->P[k], mesh, q->ndim, q->shape, b,
                           xmp_ut_strategy_store(s, ln, q->name), full + q->off, 1,
                           NULL) != XMESH_SUCCESS) {
            xmp_ut__fail("layer %s parameter %s: %s", ln, q->name, xmp_last_error());
            goto out_free;
        }
    }
    return l;
out_free:
    xmp_ut_slayer_destroy(l);
    return NULL;
}

static xmp_param_bytes_t slayer_bytes(const xmp_ut_slayer_t *l)
{
    xmp_param_bytes_t b = {0, 0, 0, 0};
    for (int k = 0; l && k < l->pl.npt; k++)
        xmp_param_bytes(&l->P[k], &b);
    return b;
}

int64_t xmp_ut_slayer_param_bytes(const xmp_ut_slayer_t *l)
{
    return slayer_bytes(l).param;
}

int64_t xmp_ut_slayer_optimizer_bytes(const xmp_ut_slayer_t *l)
{
    return slayer_bytes(l).optimizer;
}

int64_t xmp_ut_slayer_compute_bytes(const xmp_ut_slayer_t *l)
{
    return slayer_bytes(l).compute;
}

int xmp_ut_slayer_gather_params(const xmp_ut_slayer_t *l, float *full)
{
    for (int k = 0; k < l->pl.npt; k++)
        if (xmp_tensor_gather_full(xmp_param_stored_c(&l->P[k]), full + l->pl.pt[k].off) !=
            XMESH_SUCCESS)
            return xmp_ut__fail("layer %s: gather %s: %s", xmp_ut_layer_name(l->layer),
                                l->pl.pt[k].name, xmp_last_error());
    return 0;
}

int xmp_ut_slayer_gather_grads(const xmp_ut_slayer_t *l, float *full)
{
    for (int k = 0; k < l->pl.npt; k++) {
        float *dst = full + l->pl.pt[k].off;
        const xmp_tensor_t *g = l->P[k].r.mesh ? &l->P[k].r : &l->P[k].g;
        if (!g->mesh)
            memset(dst, 0, l->pl.pt[k].count * sizeof(float));
        else if (xmp_tensor_gather_full(g, dst) != XMESH_SUCCESS)
            return xmp_ut__fail("layer %s: gather gradient of %s: %s", xmp_ut_layer_name(l->layer),
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
    return xmp_ut__fail("layer %s op %d (%s): %s", xmp_ut_layer_name(l->layer), i, what,
                        xmp_last_error());
}

/* Forward of op i of layer l's plan on tape t into *o (caches into t). */
static xmesh_result_t run_op(xmp_ut_slayer_t *l, xmp_ut_tape_t *t, int i, xmp_tensor_t *o_)
{
    const xmp_ut_op_t *op = &l->pl.ops[i];
    xmp_tensor_t *v = t->v, o;
    memset(&o, 0, sizeof o);
    const xmp_tensor_t *w = op->wi >= 0 ? &l->P[op->wi].w : NULL;
    const xmp_tensor_t *b = op->bi >= 0 ? &l->P[op->bi].w : NULL;
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

/* Readers of buffer b among the plan's ops. */
static int readers(const xmp_ut_plan_t *pl, int b)
{
    int n = 0;
    for (int i = 0; i < pl->nops; i++)
        n += (pl->ops[i].in0 == b) + (pl->ops[i].in1 == b) + (pl->ops[i].in2 == b);
    return n;
}

/* coll-matmul: op i (a conv or linear with weights) whose output is read only by the act.* box
 * op i + 1 and is none of the layer's outputs runs fused with that box. */
static int fusable(const xmp_ut_slayer_t *l, int i)
{
    const xmp_ut_plan_t *pl = &l->pl;
    if (!l->ov.coll_matmul || i + 1 >= pl->nops)
        return 0;
    const xmp_ut_op_t *op = &pl->ops[i], *bx = &pl->ops[i + 1];
    return (op->kind == XMP_UT_OP_CONV || op->kind == XMP_UT_OP_LIN) && op->wi >= 0 &&
           bx->kind == XMP_UT_OP_BOX && bx->in0 == op->out && readers(pl, op->out) == 1 &&
           op->out != pl->out && op->out != pl->skip_out;
}

/* Runs op i (and, fused, the box op i + 1) on tape t; *n: ops consumed. Outputs already held
 * (kept under recomputation) are left as they are: the forward is deterministic. */
static xmesh_result_t exec_op(xmp_ut_slayer_t *l, xmp_ut_tape_t *t, int i, int *n)
{
    const xmp_ut_op_t *op = &l->pl.ops[i];
    xmp_tensor_t o;
    memset(&o, 0, sizeof o);
    *n = 1;
    if (fusable(l, i)) {
        const xmp_ut_op_t *bx = &l->pl.ops[i + 1];
        const xmp_tensor_t *w = &l->P[op->wi].w, *b = op->bi >= 0 ? &l->P[op->bi].w : NULL;
        xmesh_result_t r =
            op->kind == XMP_UT_OP_CONV
                ? xmp_conv2d_forward_box(&l->ov, &t->v[op->in0], w, b, op->conv.stride,
                                         op->conv.pad, l->box[i + 1], t->fsrc[i + 1], &o)
                : xmp_linear_forward_box(&l->ov, &t->v[op->in0], w, b, l->box[i + 1], NULL,
                                         t->fsrc[i + 1], &o);
        if (r != XMESH_SUCCESS)
            return r;
        *n = 2;
        t->fused[i + 1] = 1;
        if (t->v[bx->out].data)
            drop(&o);
        else
            own(&t->v[bx->out], &o);
        return XMESH_SUCCESS;
    }
    xmesh_result_t r = run_op(l, t, i, &o);
    if (r != XMESH_SUCCESS)
        return r;
    if (t->v[op->out].data)
        drop(&o);
    else
        own(&t->v[op->out], &o);
    return XMESH_SUCCESS;
}

int xmp_ut_slayer_forward(xmp_ut_slayer_t *l, const xmp_tensor_t *x, const xmp_tensor_t *skip_in,
                          const xmp_tensor_t *cond, xmp_ut_tape_t **tape, const xmp_tensor_t **y,
                          const xmp_tensor_t **skip_out)
{
    const xmp_ut_plan_t *pl = &l->pl;
    const char *ln = xmp_ut_layer_name(l->layer);
    if (!x || !tape || !y || (pl->skip_in >= 0 && !skip_in) || (pl->cond >= 0 && !cond) ||
        (pl->skip_out >= 0 && !skip_out))
        return xmp_ut__fail("layer %s forward: missing input or output", ln);
    if (wait_params(l)) /* prefetch: this layer's gathers, started by the last update */
        return -1;
    xmp_ut_tape_t *t = calloc(1, sizeof *t);
    if (!t)
        return xmp_ut__fail("out of memory");
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
    for (int i = 0, n = 1; i < pl->nops; i += n) {
        if (exec_op(l, t, i, &n) != XMESH_SUCCESS) {
            op_fail(l, i, "forward");
            xmp_ut_tape_free(t);
            return -1;
        }
    }
    *tape = t;
    *y = &t->v[pl->out];
    if (skip_out)
        *skip_out = pl->skip_out >= 0 ? &t->v[pl->skip_out] : NULL;
    return 0;
fail_box:
    xmp_ut__fail("layer %s forward: boxing an input: %s", ln, xmp_last_error());
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

/* bwd-input: the SBP the gradient of op i's input buffer b is boxed to anyway by the op that made
 * b (an act.* box: the gradient SBP of its source; the layer's input: act.x), NULL where b has
 * another reader (the gradients would be summed first) or another producer. */
static const xmp_sbp_t *dx_target(const xmp_ut_slayer_t *l, const xmp_ut_tape_t *t, int i,
                                  xmp_sbp_t *buf)
{
    const xmp_ut_plan_t *pl = &l->pl;
    int b = pl->ops[i].in0;
    if (readers(pl, b) != 1 || b == pl->out || b == pl->skip_out)
        return NULL;
    if (b == pl->in || b == pl->skip_in)
        return l->actx;
    for (int k = 0; k < i; k++) {
        const xmp_ut_op_t *p = &pl->ops[k];
        if (p->out != b)
            continue;
        if (p->kind != XMP_UT_OP_BOX)
            return NULL;
        const xmp_sbp_t *src = t->fused[k] ? t->fsrc[k] : t->v[p->in0].sbp;
        for (int a = 0; a < NAX; a++)
            buf[a] = a < l->mesh->ndim ? xmp_sbp_grad(src[a]) : xmp_sbp_b();
        return buf;
    }
    return NULL;
}

/* bwd-input: op i's (conv or linear) input gradient into *dx, its box to dx_target in flight
 * during the weight-gradient GEMM, whose dW and db are accumulated here (wdone). */
static xmesh_result_t bwd_ov(xmp_ut_slayer_t *l, xmp_ut_tape_t *t, int i, xmp_tensor_t *dx)
{
    const xmp_ut_op_t *op = &l->pl.ops[i];
    const xmp_tensor_t *G = &t->g[op->out], *x = &t->v[op->in0], *w = &l->P[op->wi].w;
    xmp_sbp_t buf[NAX];
    const xmp_sbp_t *to = dx_target(l, t, i, buf);
    xmp_tensor_t dw, db;
    memset(&dw, 0, sizeof dw);
    memset(&db, 0, sizeof db);
    xmesh_result_t r =
        op->kind == XMP_UT_OP_CONV
            ? xmp_conv2d_backward_ov(&l->ov, G, x, w, op->conv.stride, op->conv.pad, to, dx, &dw,
                                     op->bi >= 0 ? &db : NULL)
            : xmp_linear_backward_ov(&l->ov, G, x, w, to, dx, &dw, op->bi >= 0 ? &db : NULL);
    if (r != XMESH_SUCCESS)
        return r;
    if ((r = accumulate(&l->P[op->wi].g, &dw)) == XMESH_SUCCESS && op->bi >= 0)
        r = accumulate(&l->P[op->bi].g, &db);
    xmp_tensor_free(&dw);
    xmp_tensor_free(&db);
    if (r != XMESH_SUCCESS) {
        xmp_tensor_free(dx);
        return r;
    }
    t->wdone[i] = 1;
    return XMESH_SUCCESS;
}

int xmp_ut_slayer_backward_input(xmp_ut_slayer_t *l, xmp_ut_tape_t *t, const xmp_tensor_t *dy,
                                 const xmp_tensor_t *dskip_out, xmp_tensor_t *dx,
                                 xmp_tensor_t *dskip_in)
{
    const xmp_ut_plan_t *pl = &l->pl;
    const char *ln = xmp_ut_layer_name(l->layer);
    if (!t || !dy || (pl->skip_in >= 0 && !dskip_in))
        return xmp_ut__fail("layer %s backward_input: missing tape, dy or dskip_in", ln);
    xmp_tensor_t o, o2, o3;
    memset(&o, 0, sizeof o);
    if (xmp_box(dy, dy->sbp, &o) != XMESH_SUCCESS || accumulate(&t->g[pl->out], &o))
        return xmp_ut__fail("layer %s backward: dy: %s", ln, xmp_last_error());
    if (pl->skip_out >= 0 && dskip_out &&
        (xmp_box(dskip_out, dskip_out->sbp, &o) != XMESH_SUCCESS ||
         accumulate(&t->g[pl->skip_out], &o)))
        return xmp_ut__fail("layer %s backward: dskip: %s", ln, xmp_last_error());
    for (int i = pl->nops - 1; i >= 0; i--) {
        const xmp_ut_op_t *op = &pl->ops[i];
        const xmp_tensor_t *G = &t->g[op->out], *v = t->v;
        const xmp_tensor_t *w = op->wi >= 0 ? &l->P[op->wi].w : NULL;
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
            if (n0 && l->ov.bwd_input && op->wi >= 0)
                r = bwd_ov(l, t, i, &o), got0 = 1;
            else if (n0)
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
            if (n0 && l->ov.bwd_input && op->wi >= 0)
                r = bwd_ov(l, t, i, &o), got0 = 1;
            else if (n0)
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
            r = xmp_box_backward(G, t->fused[i] ? t->fsrc[i] : v[op->in0].sbp, &o), got0 = n0;
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
            return xmp_ut__fail("layer %s backward: input gradient: %s", ln, xmp_last_error());
    }
    return 0;
}

int xmp_ut_slayer_backward_weight(xmp_ut_slayer_t *l, xmp_ut_tape_t *t)
{
    const xmp_ut_plan_t *pl = &l->pl;
    if (!t)
        return xmp_ut__fail("layer %s backward_weight: no tape", xmp_ut_layer_name(l->layer));
    int rc = 0;
    for (int i = pl->nops - 1; i >= 0 && !rc; i--) {
        const xmp_ut_op_t *op = &pl->ops[i];
        const xmp_tensor_t *G = &t->g[op->out], *x = &t->v[op->in0 >= 0 ? op->in0 : 0];
        if (op->wi < 0 || !G->mesh || t->wdone[i])
            continue; /* no gradient, or accumulated by backward_input (bwd-input) */
        xmp_tensor_t dw, db;
        memset(&dw, 0, sizeof dw);
        memset(&db, 0, sizeof db);
        xmesh_result_t r = XMESH_SUCCESS;
        if (op->kind == XMP_UT_OP_CONV)
            r = xmp_conv2d_backward_weight(G, x, &l->P[op->wi].w, op->conv.stride, op->conv.pad,
                                           &dw, &db);
        else if (op->kind == XMP_UT_OP_GN)
            r = xmp_groupnorm_backward(G, x, &l->P[op->wi].w, op->g, &t->gn[i], NULL, &dw, &db);
        else if (op->kind == XMP_UT_OP_LIN)
            r = xmp_linear_backward_weight(G, x, &dw, &db);
        if (r != XMESH_SUCCESS) {
            rc = op_fail(l, i, "weight gradient");
            break;
        }
        if (accumulate(&l->P[op->wi].g, &dw) || accumulate(&l->P[op->bi].g, &db)) {
            xmp_tensor_free(&dw), xmp_tensor_free(&db);
            rc = op_fail(l, i, "weight gradient accumulation");
        }
    }
    xmp_ut_tape_free(t);
    return rc;
}

int xmp_ut_slayer_reduce(xmp_ut_slayer_t *l)
{
    for (int k = 0; k < l->pl.npt; k++)
        if (xmp_param_reduce(&l->P[k]) != XMESH_SUCCESS)
            return xmp_ut__fail("layer %s: gradient of %s to %s: %s", xmp_ut_layer_name(l->layer),
                                l->pl.pt[k].name, xmp_param_stored(&l->P[k])->spec,
                                xmp_last_error());
    return 0;
}

int xmp_ut_slayer_reduce_start(xmp_ut_slayer_t *l)
{
    for (int k = 0; k < l->pl.npt; k++)
        if (xmp_param_reduce_start(&l->P[k]) != XMESH_SUCCESS)
            return xmp_ut__fail("layer %s: gradient of %s to %s: %s", xmp_ut_layer_name(l->layer),
                                l->pl.pt[k].name, xmp_param_stored(&l->P[k])->spec,
                                xmp_last_error());
    return 0;
}

int xmp_ut_slayer_reduce_wait(xmp_ut_slayer_t *l)
{
    int rc = 0;
    for (int k = 0; k < l->pl.npt; k++) /* every request waited, also after an error */
        if (xmp_param_reduce_wait(&l->P[k]) != XMESH_SUCCESS && !rc)
            rc = xmp_ut__fail("layer %s: gradient of %s to %s: %s", xmp_ut_layer_name(l->layer),
                              l->pl.pt[k].name, xmp_param_stored(&l->P[k])->spec, xmp_last_error());
    return rc;
}

int xmp_ut_slayer_update(xmp_ut_slayer_t *l, float lr, float momentum, float wd)
{
    for (int k = 0; k < l->pl.npt; k++) {
        xmp_param_t *q = &l->P[k];
        xmp_tensor_t *p = xmp_param_stored(q);
        if (p->lcount) {
            float *gz = NULL;
            if (!q->r.mesh && !(gz = calloc((size_t)p->lcount, sizeof(float))))
                return xmp_ut__fail("out of memory");
            if (q->r.mesh && !same_sbp(&q->r, p))
                return xmp_ut__fail("layer %s: gradient of %s is %s, not reduced to %s",
                                    xmp_ut_layer_name(l->layer), l->pl.pt[k].name, q->r.spec,
                                    p->spec);
            int rc = xmp_unet_sgd_nesterov((size_t)p->lcount, lr, momentum, wd, xmp_f32(p),
                                           q->state[0], gz ? gz : xmp_f32(&q->r));
            free(gz);
            if (rc != 0)
                return xmp_ut__fail("optimizer: %s", xmp_last_error());
        }
        xmp_param_zero_grad(q, 1);
        /* sharded storage: the updated shards all-gathered into the compute copy (prefetch:
         * started here, waited by the layer's next forward) */
        if ((l->ov.prefetch ? xmp_param_gather_start(q) : xmp_param_gather(q)) != XMESH_SUCCESS)
            return xmp_ut__fail("layer %s: gathering %s: %s", xmp_ut_layer_name(l->layer),
                                l->pl.pt[k].name, xmp_last_error());
    }
    return 0;
}

int xmp_ut_slayer_sync(xmp_ut_slayer_t *l)
{
    if (l && wait_params(l))
        return -1;
    for (int k = 0; l && k < l->pl.npt; k++)
        if (xmp_param_gather(&l->P[k]) != XMESH_SUCCESS)
            return xmp_ut__fail("layer %s: gathering %s: %s", xmp_ut_layer_name(l->layer),
                                l->pl.pt[k].name, xmp_last_error());
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
    for (int i = 0, n = 1; i < pl->nops; i += n) {
        const xmp_ut_op_t *op = &pl->ops[i];
        n = 1;
        if (mode == XMP_UT_RECOMPUTE_SELECTIVE && op->kind != XMP_UT_OP_ATTN)
            continue;
        /* kept outputs are left (the same values: the forward is deterministic) */
        if (exec_op(l, t, i, &n) != XMESH_SUCCESS)
            return op_fail(l, i, "recomputation");
    }
    return 0;
}

int xmp_ut_slayer_named(xmp_ut_slayer_t *l, xmp_ut_named_t *out, int max)
{
    for (int k = 0; k < l->pl.npt && k < max; k++) {
        snprintf(out[k].name, sizeof out[k].name, "%s.%s", xmp_ut_layer_name(l->layer),
                 l->pl.pt[k].name);
        out[k].param = xmp_param_stored(&l->P[k]);
        out[k].vel = *out[k].param;
        out[k].vel.data = l->P[k].state[0];
    }
    return l->pl.npt;
}

double xmp_ut_slayer_grad_sumsq(const xmp_ut_slayer_t *l)
{
    double s = 0;
    if (!l)
        return 0;
    for (int k = 0; k < l->pl.npt; k++) {
        const xmp_tensor_t *g = &l->P[k].r;
        if (!g->mesh || !g->lcount)
            continue;
        int rep = 1;
        for (int a = 0; a < l->mesh->ndim; a++)
            if (g->sbp[a].kind != XMP_S && l->mesh->coord[a] != 0)
                rep = 0;
        if (!rep)
            continue;
        const float *v = xmp_f32(g);
        for (int64_t i = 0; i < g->lcount; i++)
            s += (double)v[i] * v[i];
    }
    return s;
}

void xmp_ut_slayer_scale_grads(xmp_ut_slayer_t *l, float scale)
{
    /* The reduced gradient, and the accumulator too: a step run without the reduction (the
     * trainer's memory probe scales by 0 to undo it) leaves its gradient there only. */
    for (int k = 0; l && k < l->pl.npt; k++) {
        xmp_tensor_t *t[2] = {&l->P[k].r, &l->P[k].g};
        for (int j = 0; j < 2; j++) {
            float *v = t[j]->mesh && t[j]->lcount ? xmp_f32(t[j]) : NULL;
            for (int64_t i = 0; v && i < t[j]->lcount; i++)
                v[i] *= scale;
        }
    }
}
