/* The U-Transformer's tape as a graph: see utransformer_graph.h. */
#include "models/utransformer_graph.h"

#include <stdlib.h>
#include <string.h>

#include "models/utransformer_plan.h"
#include "nn/error.h"

int64_t xmp_ut_graph_positions(const xmp_gvalue_t *v)
{
    return v->nd == 4 ? v->dim[2] * v->dim[3] : v->nd == 3 ? v->dim[1] : 1;
}

/* The graph's state while converting: value of each tape buffer, parameter of each tensor. */
typedef struct {
    xmp_graph_t *g;
    const xmp_ut_plan_t *pl;
    int vid[XMP_UT_MAX_BUF], pid[XMP_UT_MAX_PT];
    int layer, failed;
} cv_t;

static int value(cv_t *c, int buf, const char *cls, int nd, int64_t d0, int64_t d1, int64_t d2,
                 int64_t d3)
{
    const int64_t dim[4] = {d0, d1, d2, d3};
    int id = c->failed ? -1 : xmp_graph_value(c->g, cls, nd, dim);
    c->failed |= id < 0;
    if (id >= 0 && buf >= 0)
        c->vid[buf] = id;
    return id;
}

static xmp_gref_t pref(cv_t *c, int ti)
{
    if (c->pid[ti] < 0 && !c->failed) {
        const xmp_ut_ptens_t *t = &c->pl->pt[ti];
        c->pid[ti] = xmp_graph_param(c->g, t->name, t->ndim, t->shape, c->layer, c->layer);
        c->failed |= c->pid[ti] < 0;
    }
    return (xmp_gref_t){1, c->pid[ti] < 0 ? 0 : c->pid[ti]};
}

/* The value of tape buffer b (an operand); fails on a buffer nothing wrote. */
static xmp_gref_t vref(cv_t *c, int b)
{
    if (b < 0 || c->vid[b] < 0) {
        if (!c->failed)
            xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                    "U-Transformer graph: layer %d reads buffer %d "
                    "before any op writes it",
                    c->layer, b);
        c->failed = 1;
        return (xmp_gref_t){0, 0};
    }
    return (xmp_gref_t){0, c->vid[b]};
}

static void node(cv_t *c, xmp_gop_t kind, int nin, const xmp_gref_t *in, int out)
{
    if (!c->failed)
        c->failed = xmp_graph_node(c->g, kind, NULL, NULL, c->layer, c->layer, nin, in, out, 0) < 0;
}

/* One tape op as one node. */
static void convert(cv_t *c, const xmp_ut_op_t *o)
{
    xmp_gref_t in[3] = {vref(c, o->in0), {0, 0}, {0, 0}};
    if (c->failed)
        return;
    const xmp_gvalue_t *x = &c->g->val[in[0].id];
    const int64_t n = x->dim[0];
    int y = -1, nin = 1;
    xmp_gop_t kind;
    switch (o->kind) {
    case XMP_UT_OP_CONV:
        kind = XMP_GOP_CONV;
        y = value(c, o->out, "", 4, n, o->conv.oc, o->conv.oh, o->conv.ow);
        break;
    case XMP_UT_OP_GN:
        kind = XMP_GOP_GROUPNORM;
        y = value(c, o->out, "", x->nd, n, x->dim[1], x->dim[2], x->dim[3]);
        break;
    case XMP_UT_OP_SILU:
        kind = XMP_GOP_SILU;
        y = value(c, o->out, "", x->nd, n, x->dim[1], x->dim[2], x->dim[3]);
        break;
    case XMP_UT_OP_UP:
        kind = XMP_GOP_UPSAMPLE;
        y = value(c, o->out, "", 4, n, x->dim[1], 2 * x->dim[2], 2 * x->dim[3]);
        break;
    case XMP_UT_OP_CONCAT:
        kind = XMP_GOP_CONCAT;
        in[nin++] = vref(c, o->in1);
        y = value(c, o->out, "", 4, n, o->c + o->c2, x->dim[2], x->dim[3]);
        break;
    case XMP_UT_OP_TOK:
        kind = XMP_GOP_TOKENS;
        y = value(c, o->out, "", 3, n, o->hw, o->c, 0);
        break;
    case XMP_UT_OP_UNTOK:
        kind = XMP_GOP_UNTOKENS;
        y = value(c, o->out, "", 4, n, o->c, o->h, o->wd);
        break;
    case XMP_UT_OP_LIN:
        kind = XMP_GOP_LINEAR;
        y = value(c, o->out, "", 3, n, o->hw, o->c2, 0);
        break;
    case XMP_UT_OP_ATTN:
        kind = XMP_GOP_ATTENTION;
        in[nin++] = vref(c, o->in1);
        in[nin++] = vref(c, o->in2);
        y = value(c, o->out, "", 3, n, o->attn.tq, (int64_t)o->attn.heads * o->attn.head_dim, 0);
        break;
    case XMP_UT_OP_ADD:
        kind = XMP_GOP_ADD;
        in[nin++] = vref(c, o->in1);
        y = value(c, o->out, "", x->nd, n, x->dim[1], x->dim[2], x->dim[3]);
        break;
    case XMP_UT_OP_BOX:
        kind = XMP_GOP_BOX;
        y = value(c, o->out, o->cls, x->nd, n, x->dim[1], x->dim[2], x->dim[3]);
        break;
    default:
        xmp_err(XMESH_ERR_INVALID_ARGUMENT, "U-Transformer graph: layer %d: op kind %d", c->layer,
                o->kind);
        c->failed = 1;
        return;
    }
    if (o->wi >= 0) { /* weight (and bias) after the value operands */
        in[nin++] = pref(c, o->wi);
        if (o->bi >= 0 && nin < 3)
            in[nin++] = pref(c, o->bi);
    }
    node(c, kind, nin, in, y);
}

int xmp_ut_graph(const xmp_ut_config_t *cf, int layer, xmp_graph_t *g)
{
    xmp_graph_init(g);
    xmp_ut_plan_t *pl = malloc(sizeof *pl);
    if (!pl) {
        xmp_err(XMESH_ERR_INVALID_ARGUMENT, "U-Transformer graph: out of memory");
        return -1;
    }
    cv_t c = {.g = g, .pl = pl, .layer = layer};
    memset(c.vid, -1, sizeof c.vid);
    memset(c.pid, -1, sizeof c.pid);
    if (xmp_ut__build(cf, layer, 1, 1, pl, NULL)) {
        xmp_err(XMESH_ERR_INVALID_ARGUMENT, "U-Transformer graph: %s", xmp_last_error());
        c.failed = 1;
    }
    int in[3], sk[3];
    xmp_ut_layer_in_shape(cf, layer, in);
    if (!c.failed)
        value(&c, pl->in, "act.x", 4, 1, in[0], in[1], in[2]);
    if (!c.failed && pl->skip_in >= 0) {
        xmp_ut_layer_skip_shape(cf, xmp_ut_skip_source(layer), sk);
        value(&c, pl->skip_in, "act.x", 4, 1, sk[0], sk[1], sk[2]);
    }
    if (!c.failed && pl->cond >= 0)
        value(&c, pl->cond, "act.cond", 3, 1, XMP_UT_TOKENS, cf->cond_dim, 0);
    for (int i = 0; !c.failed && i < pl->nops; i++)
        convert(&c, &pl->ops[i]);
    free(pl);
    if (c.failed) {
        xmp_graph_free(g);
        return -1;
    }
    return 0;
}

/* The node consuming value v with kind k (operand index into *arg); NULL when none. */
static const xmp_gnode_t *consumer(const xmp_graph_t *g, int v, xmp_gop_t k, int *arg)
{
    for (int i = 0; i < g->nnode; i++)
        for (int j = 0; g->node[i].kind == k && j < g->node[i].nin; j++)
            if (!g->node[i].in[j].is_param && g->node[i].in[j].id == v) {
                *arg = j;
                return &g->node[i];
            }
    return NULL;
}

/* The kind of the node producing value v (XMP_GOP_COUNT for an input of the graph). */
static xmp_gop_t producer_kind(const xmp_graph_t *g, int v)
{
    int p = g->val[v].producer;
    return p < 0 ? XMP_GOP_COUNT : g->node[p].kind;
}

int xmp_ut_graph_weight_use(const xmp_graph_t *g, const char *cls, xmp_ut_wuse_t *w)
{
    memset(w, 0, sizeof *w);
    for (int i = 0; i < g->nnode; i++) {
        const xmp_gnode_t *n = &g->node[i];
        if ((n->kind != XMP_GOP_CONV && n->kind != XMP_GOP_LINEAR) || n->nin < 2 ||
            !n->in[1].is_param || strcmp(g->param[n->in[1].id].cls, cls))
            continue;
        int x = n->in[0].id, arg = -1;
        w->pos = w->in_pos = (double)xmp_ut_graph_positions(&g->val[n->out]);
        if (producer_kind(g, x) == XMP_GOP_UPSAMPLE) {
            const xmp_gnode_t *up = &g->node[g->val[x].producer];
            w->in_pos = (double)xmp_ut_graph_positions(&g->val[up->in[0].id]);
        }
        const xmp_gnode_t *att = consumer(g, n->out, XMP_GOP_ATTENTION, &arg);
        w->kv = att && arg > 0;
        w->query = att && arg == 0;
        if (w->query)
            w->kv_pos = (double)xmp_ut_graph_positions(&g->val[att->in[1].id]);
        w->paired_out = att || consumer(g, n->out, XMP_GOP_GROUPNORM, &arg);
        w->paired_in =
            producer_kind(g, x) == XMP_GOP_SILU || producer_kind(g, x) == XMP_GOP_ATTENTION;
        return 0;
    }
    return -1;
}
