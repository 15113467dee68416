/* One graph per model: see graph.h. */
#include "nn/graph.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/error.h"

#define FAIL(...) ((void)xmp_err(XMESH_ERR_INVALID_ARGUMENT, __VA_ARGS__), -1)

void xmp_graph_init(xmp_graph_t *g)
{
    memset(g, 0, sizeof *g);
}

void xmp_graph_free(xmp_graph_t *g)
{
    if (!g)
        return;
    free(g->node);
    free(g->val);
    free(g->param);
    memset(g, 0, sizeof *g);
}

/* Room for one more element of size sz in *arr (count n, capacity *cap); 0 or -1. */
static int grow(void **arr, int n, int *cap, size_t sz)
{
    if (n < *cap)
        return 0;
    int nc = *cap ? 2 * *cap : 16;
    void *p = realloc(*arr, (size_t)nc * sz);
    if (!p)
        return FAIL("graph: out of memory growing to %d entries", nc);
    *arr = p;
    *cap = nc;
    return 0;
}

static int check_shape(const char *what, const char *cls, int nd, const int64_t *dim)
{
    if (!cls || strlen(cls) >= XMP_G_CLS)
        return FAIL("graph: %s class '%s': NULL or longer than %d", what, cls ? cls : "(null)",
                    XMP_G_CLS - 1);
    if (nd < 1 || nd > XMP_G_MAXDIM)
        return FAIL("graph: %s '%s': %d dims (must be 1..%d)", what, cls, nd, XMP_G_MAXDIM);
    for (int d = 0; d < nd; d++)
        if (dim[d] < 1)
            return FAIL("graph: %s '%s': dim %d is %lld", what, cls, d, (long long)dim[d]);
    return 0;
}

int xmp_graph_value(xmp_graph_t *g, const char *cls, int nd, const int64_t *dim)
{
    if (check_shape("value", cls, nd, dim) ||
        grow((void **)&g->val, g->nval, &g->capval, sizeof *g->val))
        return -1;
    xmp_gvalue_t *v = &g->val[g->nval];
    memset(v, 0, sizeof *v);
    snprintf(v->cls, sizeof v->cls, "%s", cls);
    v->nd = nd;
    memcpy(v->dim, dim, (size_t)nd * sizeof *dim);
    v->producer = -1;
    return g->nval++;
}

int xmp_graph_param(xmp_graph_t *g, const char *cls, int nd, const int64_t *dim, int layer,
                    int group)
{
    if (check_shape("parameter", cls, nd, dim) ||
        grow((void **)&g->param, g->nparam, &g->capparam, sizeof *g->param))
        return -1;
    xmp_gparam_t *p = &g->param[g->nparam];
    memset(p, 0, sizeof *p);
    snprintf(p->cls, sizeof p->cls, "%s", cls);
    p->nd = nd;
    memcpy(p->dim, dim, (size_t)nd * sizeof *dim);
    p->layer = layer;
    p->group = group;
    return g->nparam++;
}

int xmp_graph_ref_nd(const xmp_graph_t *g, xmp_gref_t r, const int64_t **dim)
{
    if (r.is_param) {
        *dim = g->param[r.id].dim;
        return g->param[r.id].nd;
    }
    *dim = g->val[r.id].dim;
    return g->val[r.id].nd;
}

const char *xmp_graph_ref_cls(const xmp_graph_t *g, xmp_gref_t r)
{
    return r.is_param ? g->param[r.id].cls : g->val[r.id].cls;
}

int64_t xmp_graph_numel(int nd, const int64_t *dim)
{
    int64_t n = 1;
    for (int d = 0; d < nd; d++)
        n *= dim[d];
    return n;
}

static double ref_numel(const xmp_graph_t *g, xmp_gref_t r)
{
    const int64_t *dim;
    int nd = xmp_graph_ref_nd(g, r, &dim);
    return (double)xmp_graph_numel(nd, dim);
}

/* Forward flops of a node (graph.h: 2 per multiply-add, elementwise one per output element). */
static double node_flops(const xmp_graph_t *g, const xmp_gnode_t *n)
{
    const xmp_gvalue_t *y = &g->val[n->out];
    double ny = (double)xmp_graph_numel(y->nd, y->dim);
    switch (n->kind) {
    case XMP_GOP_LINEAR: { /* rows x N outputs, K multiply-adds each */
        const int64_t *xd;
        int xnd = xmp_graph_ref_nd(g, n->in[0], &xd);
        return 2.0 * ny * (double)xd[xnd - 1];
    }
    case XMP_GOP_ATTENTION: { /* scores q k^T and values p v: 2 x (B NH T T hs) multiply-adds */
        const int64_t *qd;
        int qnd = xmp_graph_ref_nd(g, n->in[0], &qd);
        if (qnd != 5)
            return ny;
        return 4.0 * (double)qd[0] * (double)qd[3] * (double)qd[1] * (double)qd[1] * (double)qd[4];
    }
    case XMP_GOP_CONV: { /* every output: (input channels x kernel) multiply-adds */
        const int64_t *wd;
        if (n->nin < 2 || !n->in[1].is_param)
            return ny;
        int wnd = xmp_graph_ref_nd(g, n->in[1], &wd);
        return 2.0 * ny * (double)xmp_graph_numel(wnd - 1, wd + 1);
    }
    case XMP_GOP_XENT: { /* over the logits: one per element of operand 0 */
        return ref_numel(g, n->in[0]);
    }
    default:
        return ny;
    }
}

int xmp_graph_node(xmp_graph_t *g, xmp_gop_t kind, const char *rule, const char *what, int group,
                   int layer, int nin, const xmp_gref_t *in, int out, unsigned saves)
{
    if ((int)kind < 0 || kind >= XMP_GOP_COUNT)
        return FAIL("graph: node kind %d (must be 0..%d)", (int)kind, XMP_GOP_COUNT - 1);
    if (nin < 1 || nin > XMP_G_MAXIN)
        return FAIL("graph: node '%s': %d operands (must be 1..%d)", what, nin, XMP_G_MAXIN);
    for (int k = 0; k < nin; k++)
        if (in[k].id < 0 || in[k].id >= (in[k].is_param ? g->nparam : g->nval))
            return FAIL("graph: node '%s': operand %d is %s %d, which does not exist", what, k,
                        in[k].is_param ? "parameter" : "value", in[k].id);
    if (out < 0 || out >= g->nval)
        return FAIL("graph: node '%s': output value %d does not exist", what, out);
    if (g->val[out].producer >= 0)
        return FAIL("graph: node '%s': value %d (%s) is already the output of node %d", what, out,
                    g->val[out].cls, g->val[out].producer);
    if (grow((void **)&g->node, g->nnode, &g->capnode, sizeof *g->node))
        return -1;
    xmp_gnode_t *n = &g->node[g->nnode];
    memset(n, 0, sizeof *n);
    n->kind = kind;
    n->rule = rule;
    snprintf(n->what, sizeof n->what, "%s", what ? what : xmp_gop_name(kind));
    n->group = group;
    n->layer = layer;
    n->nin = nin;
    memcpy(n->in, in, (size_t)nin * sizeof *in);
    n->out = out;
    n->saves = saves;
    n->flops = node_flops(g, n);
    double b = (double)xmp_graph_numel(g->val[out].nd, g->val[out].dim);
    for (int k = 0; k < nin; k++) /* an embedding reads the table's rows it outputs */
        b += kind == XMP_GOP_EMBEDDING && in[k].is_param
                 ? (double)xmp_graph_numel(g->val[out].nd, g->val[out].dim)
                 : ref_numel(g, in[k]);
    n->bytes = 4.0 * b;
    g->val[out].producer = g->nnode;
    return g->nnode++;
}

const char *xmp_gop_name(xmp_gop_t k)
{
    static const char *const names[XMP_GOP_COUNT] = {
        "embedding", "layernorm", "linear",   "attention", "gelu",   "add",      "xent", "conv",
        "groupnorm", "silu",      "upsample", "concat",    "tokens", "untokens", "box"};
    return (int)k >= 0 && k < XMP_GOP_COUNT ? names[k] : NULL;
}

int64_t xmp_graph_param_count(const xmp_graph_t *g)
{
    int64_t n = 0;
    for (int i = 0; i < g->nparam; i++)
        n += xmp_graph_numel(g->param[i].nd, g->param[i].dim);
    return n;
}

double xmp_graph_flops(const xmp_graph_t *g)
{
    double f = 0;
    for (int i = 0; i < g->nnode; i++)
        f += g->node[i].flops;
    return f;
}

int xmp_graph_classes(const xmp_graph_t *g, int params, const char **cls, int *nd, int cap)
{
    int n = 0, total = params ? g->nparam : g->nval;
    for (int i = 0; i < total; i++) {
        const char *c = params ? g->param[i].cls : g->val[i].cls;
        int d = params ? g->param[i].nd : g->val[i].nd;
        if (!c[0])
            continue;
        int seen = 0;
        for (int j = 0; j < i && !seen; j++)
            seen = !strcmp(c, params ? g->param[j].cls : g->val[j].cls);
        if (seen)
            continue;
        if (n < cap) {
            cls[n] = c;
            if (nd)
                nd[n] = d;
        }
        n++;
    }
    return n;
}
