/* The graph executor: see graph_exec.h. */
#include "nn/graph_exec.h"

#include <stdlib.h>
#include <string.h>

#include "nn/error.h"
#include "nn/sbp_ops.h"

#define NAX XMP_MAX_MESH_DIMS

int xmp_gexec_init(xmp_gexec_t *ex)
{
    const xmp_graph_t *g = ex->g;
    size_t n = (size_t)g->nval + 1;
    ex->nuse = calloc(n, sizeof(int));
    ex->first = malloc(n * sizeof(int));
    ex->last = malloc(n * sizeof(int));
    ex->keep = calloc(n, 1);
    if (!ex->nuse || !ex->first || !ex->last || !ex->keep) {
        xmp_gexec_free(ex);
        return xmp_err(XMESH_ERR_NO_MEMORY, "graph exec: out of memory for %d values", g->nval), -1;
    }
    for (int v = 0; v < g->nval; v++)
        ex->first[v] = ex->last[v] = -1;
    for (int i = 0; i < g->nnode; i++) {
        const xmp_gnode_t *nd = &g->node[i];
        for (int k = 0; k < nd->nin; k++) {
            int v = nd->in[k].id;
            if (nd->in[k].is_param)
                continue;
            ex->nuse[v]++;
            if (ex->first[v] < 0)
                ex->first[v] = i;
            ex->last[v] = i;
            ex->keep[v] |= (nd->saves >> k) & 1;
        }
        ex->keep[nd->out] |= !!(nd->saves & XMP_G_SAVE_OUT);
    }
    return 0;
}

void xmp_gexec_free(xmp_gexec_t *ex)
{
    free(ex->nuse);
    free(ex->first);
    free(ex->last);
    free(ex->keep);
    ex->nuse = ex->first = ex->last = NULL;
    ex->keep = NULL;
}

int xmp_gexec_mb_init(const xmp_gexec_t *ex, xmp_gexec_mb_t *m)
{
    size_t nv = (size_t)ex->g->nval + 1, nn = (size_t)ex->g->nnode + 1;
    memset(m, 0, sizeof *m);
    m->val = calloc(nv, sizeof *m->val);
    m->grad = calloc(nv, sizeof *m->grad);
    m->was = calloc(nv, sizeof *m->was);
    m->sbp = calloc(nv, sizeof *m->sbp);
    m->nc = calloc(nn, sizeof *m->nc);
    m->ac = calloc(nn, sizeof *m->ac);
    if (m->val && m->grad && m->was && m->sbp && m->nc && m->ac)
        return 0;
    xmp_gexec_mb_free(ex, m);
    return xmp_err(XMESH_ERR_NO_MEMORY, "graph exec: out of memory for a microbatch"), -1;
}

void xmp_gexec_mb_clear(const xmp_gexec_t *ex, xmp_gexec_mb_t *m)
{
    for (int v = 0; m->val && v < ex->g->nval; v++) {
        xmp_tensor_free(&m->val[v]);
        xmp_tensor_free(&m->grad[v]);
    }
    for (int i = 0; m->nc && i < ex->g->nnode; i++) {
        xmp_norm_cache_free(&m->nc[i]);
        xmp_attn_cache_free(&m->ac[i]);
    }
    for (int i = 0; i < m->nwq; i++)
        xmp_tensor_free(&m->wq[i].dy);
    m->nwq = 0;
}

void xmp_gexec_mb_free(const xmp_gexec_t *ex, xmp_gexec_mb_t *m)
{
    xmp_gexec_mb_clear(ex, m);
    free(m->val);
    free(m->grad);
    free(m->was);
    free(m->sbp);
    free(m->nc);
    free(m->ac);
    free(m->wq);
    memset(m, 0, sizeof *m);
}

static const xmp_tensor_t *opnd(const xmp_gexec_t *ex, const xmp_gexec_mb_t *m, xmp_gref_t r)
{
    return r.is_param ? ex->param(ex->user, r.id) : &m->val[r.id];
}

/* (B, T, NH, hs) <-> (B, T, NH*hs) views of an attention output: the same local data when
 * the heads are split evenly (the strategy check's rule). */
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

/* The SBP the producer of value v takes its output gradient in (graph_exec.h), in buf; NULL:
 * as it comes (a layer norm without the bwd-input overlap, a value of no node). */
static const xmp_sbp_t *want(const xmp_gexec_t *ex, const xmp_gexec_mb_t *m, int v, xmp_sbp_t *buf)
{
    int p = ex->g->val[v].producer;
    if (p < 0)
        return NULL;
    const xmp_gnode_t *n = &ex->g->node[p];
    if (n->kind == XMP_GOP_LAYERNORM) {
        xmp_sbp_t tx[NAX], tw[NAX], ts[NAX];
        char msg[400];
        int x = n->in[0].id;
        if (!ex->ov->bwd_input || xmp_rule_layernorm(ex->nax, ex->g->val[x].nd, m->sbp[x], tx, tw,
                                                     buf, ts, msg, sizeof msg))
            return NULL; /* off, or refused (layernorm_backward will say why) */
        return buf;
    }
    for (int a = 0; a < NAX; a++)
        buf[a] = a < ex->nax ? xmp_sbp_grad(m->was[v][a]) : xmp_sbp_b();
    return buf;
}

/* 1 when parameter pid is an operand of more than one node (a tied table: its linear runs
 * unfused and its weight gradient is always queued, so the sums of both uses keep one order). */
static int tied(const xmp_graph_t *g, int pid)
{
    int n = 0;
    for (int i = 0; i < g->nnode; i++)
        for (int k = 0; k < g->node[i].nin; k++)
            n += g->node[i].in[k].is_param && g->node[i].in[k].id == pid;
    return n > 1;
}

/* Output v of a node: its produced SBP remembered, boxed to its class. */
static int box_out(const xmp_gexec_t *ex, xmp_gexec_mb_t *m, int v)
{
    xmp_tensor_t *t = &m->val[v];
    memcpy(m->was[v], t->sbp, sizeof m->was[v]);
    if (ex->cls[v] && xmp_box_inplace(t, ex->cls[v]))
        return -1;
    memcpy(m->sbp[v], t->sbp, sizeof m->sbp[v]);
    return 0;
}

static int node_forward(const xmp_gexec_t *ex, xmp_gexec_mb_t *m, int i)
{
    const xmp_graph_t *g = ex->g;
    const xmp_gnode_t *n = &g->node[i];
    int o = n->out;
    xmp_tensor_t *y = &m->val[o];
    const xmp_tensor_t *x = opnd(ex, m, n->in[0]);
    const xmp_tensor_t *w = n->nin > 1 ? opnd(ex, m, n->in[1]) : NULL;
    const xmp_tensor_t *b = n->nin > 2 ? opnd(ex, m, n->in[2]) : NULL;
    int rc = 0, boxed = 0;
    switch (n->kind) {
    case XMP_GOP_LAYERNORM:
        rc = xmp_layernorm_forward(x, w, b, y, &m->nc[i]) != XMESH_SUCCESS;
        break;
    case XMP_GOP_LINEAR: {
        /* a linear whose sum follows: boxed to the sum's SBP (the add then needs none) */
        const xmp_tensor_t *like = NULL;
        const xmp_gnode_t *u = ex->nuse[o] == 1 ? &g->node[ex->first[o]] : NULL;
        if (u && u->kind == XMP_GOP_ADD)
            like = &m->val[u->in[u->in[0].id == o ? 1 : 0].id];
        if ((like || ex->cls[o]) && !tied(g, n->in[1].id)) {
            rc = xmp_linear_forward_box(ex->ov, x, w, b, like ? NULL : ex->cls[o], like, m->was[o],
                                        y) != XMESH_SUCCESS;
            memcpy(m->sbp[o], y->sbp, sizeof m->sbp[o]);
            boxed = 1;
        } else {
            rc = xmp_linear_forward(x, w, b, y) != XMESH_SUCCESS;
        }
        break;
    }
    case XMP_GOP_ATTENTION:
        rc = xmp_attention_forward(x, y, &m->ac[i]) != XMESH_SUCCESS;
        if (!rc && g->val[o].nd == 3 && y->ndim == 4)
            view_heads(y, 0, y->shape[2], y->shape[3]);
        break;
    case XMP_GOP_GELU:
        rc = xmp_gelu_forward(x, y) != XMESH_SUCCESS;
        break;
    case XMP_GOP_ADD:
        rc = xmp_add_forward(x, &m->val[n->in[1].id], y) != XMESH_SUCCESS;
        break;
    case XMP_GOP_BOX:
        rc = xmp_box(x, x->sbp, y) != XMESH_SUCCESS;
        break;
    default:
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "graph exec: node %d (%s): no executor for %s",
                       i, n->what, xmp_gop_name(n->kind)),
               -1;
    }
    /* operands no node keeps: freed after their last consumer */
    for (int k = 0; k < n->nin; k++)
        if (!n->in[k].is_param && ex->last[n->in[k].id] == i && !ex->keep[n->in[k].id])
            xmp_tensor_free(&m->val[n->in[k].id]);
    if (!rc && !boxed)
        rc = box_out(ex, m, o);
    if (rc)
        return xmp_err(XMESH_ERR_INVALID_USAGE, "node %d (%s): %s", i, n->what, xmp_last_error()),
               -1;
    if (ex->progress && (n->kind == XMP_GOP_ATTENTION || n->kind == XMP_GOP_GELU))
        ex->progress(ex->user);
    return 0;
}

int xmp_gexec_forward(const xmp_gexec_t *ex, xmp_gexec_mb_t *m, int lo, int hi)
{
    for (int i = lo; i < hi; i++) {
        const xmp_gnode_t *n = &ex->g->node[i];
        for (int k = 0; k < n->nin; k++) { /* the range's inputs: their SBPs as they come */
            int v = n->in[k].id;
            if (!n->in[k].is_param && ex->g->val[v].producer < lo && m->val[v].data)
                memcpy(m->sbp[v], m->val[v].sbp, sizeof m->sbp[v]);
        }
        if (node_forward(ex, m, i))
            return -1;
    }
    return 0;
}

int xmp_gexec_add(xmp_tensor_t *d, xmp_tensor_t *t)
{
    if (!d->data) {
        *d = *t;
        memset(t, 0, sizeof *t);
        return 0;
    }
    int rc = xmp_box_inplace(t, d->sbp) || t->lcount != d->lcount;
    if (!rc) {
        float *a = xmp_f32(d), *s = xmp_f32(t);
        for (int64_t e = 0; e < d->lcount; e++)
            a[e] += s[e];
    }
    xmp_tensor_free(t);
    return rc ? -1 : 0;
}

int xmp_gexec_queue_w(xmp_gexec_mb_t *m, xmp_tensor_t *dy, const xmp_tensor_t *x, int pw, int pb)
{
    if (m->nwq == m->capwq) {
        int nc = m->capwq ? 2 * m->capwq : 16;
        xmp_gexec_wq_t *n = realloc(m->wq, sizeof *n * (size_t)nc);
        if (!n)
            return xmp_err(XMESH_ERR_NO_MEMORY, "graph exec: out of memory queueing %d GEMMs", nc),
                   -1;
        m->wq = n;
        m->capwq = nc;
    }
    xmp_gexec_wq_t *q = &m->wq[m->nwq++];
    q->dy = *dy; /* takes ownership */
    memset(dy, 0, sizeof *dy);
    q->x = x;
    q->pw = pw;
    q->pb = pb;
    return 0;
}

/* dW += dy^T x, db += sum dy into the accumulators (the grad hook). */
static int weight_grad(const xmp_gexec_t *ex, const xmp_tensor_t *dy, const xmp_tensor_t *x, int pw,
                       int pb)
{
    xmp_tensor_t dw = {0}, db = {0};
    int rc = xmp_linear_backward_weight(dy, x, &dw, pb >= 0 ? &db : NULL) ? -1 : 0;
    if (!rc)
        rc = ex->grad(ex->user, pw, &dw);
    if (!rc && pb >= 0)
        rc = ex->grad(ex->user, pb, &db);
    xmp_tensor_free(&dw);
    xmp_tensor_free(&db);
    return rc;
}

int xmp_gexec_weights(const xmp_gexec_t *ex, xmp_gexec_mb_t *m)
{
    for (int i = 0; i < m->nwq; i++) {
        xmp_gexec_wq_t *q = &m->wq[i];
        if (weight_grad(ex, &q->dy, q->x, q->pw, q->pb))
            return -1;
        xmp_tensor_free(&q->dy);
        if (i % 4 == 3 && ex->progress)
            ex->progress(ex->user);
    }
    m->nwq = 0;
    return 0;
}

/* A linear's backward: dx = dy w, boxed to what x's producer takes (the only use of x), and
 * dW += dy^T x (db): queued, or with the bwd-input overlap computed while dx's box is in
 * flight (xmp_linear_backward_ov). dy consumed. Same collectives and sums either way. */
static int linear_backward(const xmp_gexec_t *ex, xmp_gexec_mb_t *m, const xmp_gnode_t *n,
                           xmp_tensor_t *dy)
{
    int xv = n->in[0].id, pw = n->in[1].id, pb = n->nin > 2 ? n->in[2].id : -1, rc;
    const xmp_tensor_t *x = &m->val[xv], *w = ex->param(ex->user, pw);
    xmp_sbp_t buf[NAX];
    const xmp_sbp_t *to = ex->nuse[xv] == 1 && !tied(ex->g, pw) ? want(ex, m, xv, buf) : NULL;
    xmp_tensor_t dx = {0}, dw = {0}, db = {0};
    if (ex->ov->bwd_input && to) {
        rc = xmp_linear_backward_ov(ex->ov, dy, x, w, to, &dx, &dw, pb >= 0 ? &db : NULL) ||
             ex->grad(ex->user, pw, &dw) || (pb >= 0 && ex->grad(ex->user, pb, &db));
        xmp_tensor_free(dy);
    } else {
        rc = xmp_linear_backward_input(dy, w, &dx) || xmp_gexec_queue_w(m, dy, x, pw, pb) ||
             (to && xmp_box_inplace(&dx, to));
    }
    rc = rc || xmp_gexec_add(&m->grad[xv], &dx);
    xmp_tensor_free(&dx);
    xmp_tensor_free(&dw);
    xmp_tensor_free(&db);
    return rc ? -1 : 0;
}

static int node_backward(const xmp_gexec_t *ex, xmp_gexec_mb_t *m, int i)
{
    const xmp_graph_t *g = ex->g;
    const xmp_gnode_t *n = &g->node[i];
    int o = n->out, x = n->in[0].id, rc = 0;
    xmp_tensor_t *d = &m->grad[o], dx = {0}, dw = {0}, db = {0};
    xmp_sbp_t buf[NAX];
    const xmp_sbp_t *to;
    if (!d->data)
        return xmp_err(XMESH_ERR_INVALID_USAGE, "node %d (%s): no gradient of its output", i,
                       n->what),
               -1;
    /* the backward of the output's class box (a layer norm boxes its dy itself) */
    if (n->kind != XMP_GOP_LAYERNORM && (to = want(ex, m, o, buf)) && xmp_box_inplace(d, to))
        goto fail;
    switch (n->kind) {
    case XMP_GOP_LAYERNORM:
        rc = xmp_layernorm_backward(d, &m->val[x], opnd(ex, m, n->in[1]), &m->nc[i], &dx, &dw,
                                    &db) != XMESH_SUCCESS;
        xmp_tensor_free(d);
        rc = rc || xmp_gexec_add(&m->grad[x], &dx) || ex->grad(ex->user, n->in[1].id, &dw) ||
             ex->grad(ex->user, n->in[2].id, &db);
        break;
    case XMP_GOP_LINEAR:
        rc = linear_backward(ex, m, n, d);
        break;
    case XMP_GOP_ATTENTION:
        if (d->ndim == 3 && m->val[x].ndim == 5)
            view_heads(d, 1, m->val[x].shape[3], m->val[x].shape[4]);
        rc = xmp_attention_backward(d, &m->val[x], &m->ac[i], &dx) != XMESH_SUCCESS;
        xmp_tensor_free(d);
        rc = rc || xmp_gexec_add(&m->grad[x], &dx);
        break;
    case XMP_GOP_GELU:
        rc = xmp_gelu_backward(d, &m->val[x], &dx) != XMESH_SUCCESS;
        xmp_tensor_free(d);
        rc = rc || xmp_gexec_add(&m->grad[x], &dx);
        break;
    case XMP_GOP_ADD:
    case XMP_GOP_BOX:
        /* each operand's gradient boxed once: to what its producer takes when the value has
         * no other use, else to the gradient SBP of the value as held */
        for (int k = n->nin - 1; k >= 0 && !rc; k--) {
            int v = n->in[k].id;
            if (ex->nuse[v] != 1 || !(to = want(ex, m, v, buf))) {
                for (int a = 0; a < NAX; a++)
                    buf[a] = xmp_sbp_grad(m->sbp[v][a]);
                to = buf;
            }
            rc = xmp_box(d, to, &dx) != XMESH_SUCCESS || xmp_gexec_add(&m->grad[v], &dx);
        }
        xmp_tensor_free(d);
        break;
    default:
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "graph exec: node %d (%s): no executor for %s",
                       i, n->what, xmp_gop_name(n->kind)),
               -1;
    }
    if (rc)
        goto fail;
    if (ex->progress && n->kind == XMP_GOP_LAYERNORM)
        ex->progress(ex->user);
    return 0;
fail:
    xmp_tensor_free(&dx);
    xmp_tensor_free(&dw);
    xmp_tensor_free(&db);
    return xmp_err(XMESH_ERR_INVALID_USAGE, "node %d (%s) backward: %s", i, n->what,
                   xmp_last_error()),
           -1;
}

int xmp_gexec_backward(const xmp_gexec_t *ex, xmp_gexec_mb_t *m, int lo, int hi)
{
    for (int i = hi - 1; i >= lo; i--)
        if (node_backward(ex, m, i))
            return -1;
    return 0;
}

void xmp_gexec_drop(const xmp_gexec_t *ex, xmp_gexec_mb_t *m, int lo, int hi, int all)
{
    for (int i = lo; i < hi; i++) {
        xmp_attn_cache_free(&m->ac[i]);
        if (!all)
            continue;
        xmp_norm_cache_free(&m->nc[i]);
        if (i < hi - 1)
            xmp_tensor_free(&m->val[ex->g->node[i].out]);
    }
}

int xmp_gexec_recompute(const xmp_gexec_t *ex, xmp_gexec_mb_t *m, int lo, int hi, int all)
{
    if (all) {
        int o = ex->g->node[hi - 1].out;
        xmp_tensor_t keep = m->val[o];
        memset(&m->val[o], 0, sizeof m->val[o]);
        int rc = xmp_gexec_forward(ex, m, lo, hi);
        xmp_tensor_free(&m->val[o]);
        m->val[o] = keep;
        return rc;
    }
    for (int i = lo; i < hi; i++) {
        if (ex->g->node[i].kind != XMP_GOP_ATTENTION)
            continue;
        xmp_tensor_t y = {0};
        xmp_attn_cache_free(&m->ac[i]);
        int rc = xmp_attention_forward(&m->val[ex->g->node[i].in[0].id], &y, &m->ac[i]);
        xmp_tensor_free(&y);
        if (rc)
            return -1;
    }
    return 0;
}

int64_t xmp_gexec_bytes(const xmp_gexec_t *ex, const xmp_gexec_mb_t *m, int lo, int hi)
{
    int64_t b = 0;
    for (int i = lo; i < hi; i++)
        b += 4 * (m->val[ex->g->node[i].out].lcount + m->ac[i].att.lcount);
    return b;
}
