/* GPT-2 pipeline stages: a step's work on one stage. The blocks and the head's layer norm and
 * tied linear run through the graph executor over the model graph (nn/graph_exec.h, its hooks
 * here: parameters, gradients, progress); written out here: the embedding with the positions,
 * the cross entropy and sampling, recomputation's choice, and the driver's callbacks (forward,
 * backward, reduction with the tied wte exchange, optimizer) with the stage's memory
 * accounting (gpt2_par.h). */
#include "models/gpt2_par.h"
#include "models/gpt2_par_priv.h"

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

/* ------------------------------------------------------------ activations */

void xmp_gpt2__mb_free(xmp_gpt2_stage_t *st, mb_t *m)
{
    xmp_gexec_mb_clear(&st->ex, &m->x);
    xmp_tensor_free(&m->tok);
    m->live = 0;
    m->bytes = 0;
}

int64_t xmp_gpt2__tbytes(const xmp_tensor_t *t)
{
    return t->lcount * 4;
}

/* Boxes t in place to its class SBP want, remembering the SBP it had. */
static int to_class(xmp_tensor_t *t, const xmp_sbp_t *want, xmp_sbp_t *was)
{
    if (was)
        memcpy(was, t->sbp, sizeof t->sbp);
    return xmp_box_inplace(t, want) ? -1 : 0;
}

/* Parameter gradient accumulation: d boxed to the accumulator's SBP (no
 * collective for P or S contributions), added (d consumed). */
static int accumulate(par_t *q, xmp_tensor_t *d)
{
    return xmp_gexec_add(&q->P.g, d);
}

#define CHK(x)                                                                                     \
    do {                                                                                           \
        if (x)                                                                                     \
            goto fail;                                                                             \
    } while (0)

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

/* ---------------------------------------------------------- the executor */

/* The graph executor's hooks (nn/graph_exec.h): parameters by graph id. */
static const xmp_tensor_t *ex_param(void *user, int pid)
{
    xmp_gpt2_stage_t *st = user;
    return &st->p[st->gpmap[pid]].P.w;
}

static int ex_grad(void *user, int pid, xmp_tensor_t *d)
{
    xmp_gpt2_stage_t *st = user;
    return accumulate(&st->p[st->gpmap[pid]], d);
}

static void ex_progress(void *user)
{
    xmp_gpt2__progress(user);
}

int xmp_gpt2__exec_init(xmp_gpt2_stage_t *st)
{
    const xmp_graph_t *g = &st->graph;
    st->vcls = calloc((size_t)g->nval + 1, sizeof *st->vcls);
    st->gpmap = malloc(sizeof(int) * ((size_t)g->nparam + 1));
    st->blo = malloc(sizeof(int) * ((size_t)st->nl + 1));
    if (!st->vcls || !st->gpmap || !st->blo)
        return xmp_err(XMESH_ERR_NO_MEMORY, "gpt2 stage: out of memory"), -1;
    for (int v = 0; v < g->nval; v++) /* activation classes: act[A_*] */
        for (int a = 0; a < NACT; a++)
            if (!strcmp(g->val[v].cls, xmp_gpt2__aclass[a]))
                st->vcls[v] = st->act[a];
    for (int i = 0; i < g->nparam; i++) {
        st->gpmap[i] = -1;
        for (int id = 0; id < NPT; id++)
            if (!strcmp(g->param[i].cls, xmp_gpt2__pclass[id]))
                st->gpmap[i] = xmp_gpt2__pindex(st, id, g->param[i].layer);
        if (!strcmp(g->param[i].cls, "wte"))
            st->g_wte = i;
    }
    /* block k: the nodes of layer l0 + k (contiguous in the graph) */
    for (int k = 0, i = 0; k < st->nl; k++) {
        while (i < g->nnode && g->node[i].layer != st->l0 + k)
            i++;
        st->blo[k] = i;
        while (i < g->nnode && g->node[i].layer == st->l0 + k)
            i++;
        st->blo[k + 1] = i;
    }
    st->hlo = g->nnode - 3;
    /* a stage without blocks: the embedding's output or the head's input */
    st->v_in = st->v_out = st->has_l ? g->node[st->hlo].in[0].id : g->node[0].out;
    if (st->nl) {
        st->v_in = g->node[st->blo[0]].in[0].id;
        st->v_out = g->node[st->blo[st->nl] - 1].out;
    }
    st->ex = (xmp_gexec_t){.g = g,
                           .ov = &st->ov,
                           .nax = st->nax,
                           .cls = st->vcls,
                           .user = st,
                           .param = ex_param,
                           .grad = ex_grad,
                           .progress = ex_progress};
    if (xmp_gexec_init(&st->ex))
        return -1;
    for (int k = 0; k < st->tc.M; k++)
        if (xmp_gexec_mb_init(&st->ex, &st->mb[k].x))
            return -1;
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

int xmp_gpt2__cb_forward(void *user, int mbi, const void *const *in, void *const *out, double *loss)
{
    xmp_gpt2_stage_t *st = user;
    double t0 = MPI_Wtime();
    mb_t *m = &st->mb[mbi];
    const xmp_gpt2_config_t *c = &st->cfg;
    xmp_tensor_t *logits = NULL, tgt = {0};
    if (m->live)
        xmp_gpt2__mb_free(st, m);
    m->live = 1;
    xmp_tensor_t *x = &m->x.val[st->v_in];
    if (st->has_e) {
        CHK(token_tensor(st, mbi, st->inputs, &m->tok));
        CHK(xmp_embedding_forward(&m->tok, xmp_gpt2__PT(st, XMP_GPT2_WTE, -1), x));
        CHK(to_class(x, st->act[A_X], NULL));
        CHK(pos_add(x, xmp_gpt2__PT(st, XMP_GPT2_WPE, -1)));
    } else {
        CHK(resid_tensor(st, x));
        if (x->lcount)
            memcpy(x->data, in[0], (size_t)x->lcount * 4);
    }
    m->bytes = xmp_gpt2__tbytes(x);
    /* the blocks: the graph's nodes (nn/graph_exec.h); recomputation (tc.recompute) drops
     * after each block all but its output (block) or the attention probabilities
     * (selective) */
    for (int k = 0; k < st->nl; k++) {
        CHK(xmp_gexec_forward(&st->ex, &m->x, st->blo[k], st->blo[k + 1]));
        if (st->tc.recompute != XMP_RECOMPUTE_NONE)
            xmp_gexec_drop(&st->ex, &m->x, st->blo[k], st->blo[k + 1],
                           st->tc.recompute == XMP_RECOMPUTE_BLOCK);
        m->bytes += xmp_gexec_bytes(&st->ex, &m->x, st->blo[k], st->blo[k + 1]);
    }
    x = &m->x.val[st->v_out];
    if (st->has_l) {
        CHK(xmp_gexec_forward(&st->ex, &m->x, st->hlo, st->hlo + 2)); /* layernorm, linear */
        logits = &m->x.val[st->graph.node[st->hlo + 1].out];
        xmp_tensor_t *dlogits = &m->x.grad[st->graph.node[st->hlo + 1].out];
        if (st->cap_pos >= 0 && mbi == 0)
            CHK(capture_logits(st, logits));
        CHK(token_tensor(st, mbi, st->targets, &tgt));
        float lv = 0;
        CHK(xmp_cross_entropy(logits, &tgt, c->vocab_size, &lv, dlogits));
        xmp_tensor_free(logits);
        xmp_tensor_free(&tgt);
        /* The microbatch mean weighs Bm/B of the batch mean (serial: mean over B*T). */
        float scale = (float)st->Bm / (float)st->tc.B;
        float *d = xmp_f32(dlogits);
        for (int64_t i = 0; i < dlogits->lcount; i++)
            d[i] *= scale;
        /* Every rank of the stage holds the same loss: each adds its share. */
        *loss += (double)lv * st->Bm / st->tc.B / st->msize;
        m->bytes += xmp_gexec_bytes(&st->ex, &m->x, st->hlo, st->hlo + 2) +
                    xmp_gpt2__tbytes(dlogits); /* lnf and the logits' gradient */
    } else if (x->lcount) {
        memcpy(out[0], x->data, (size_t)x->lcount * 4);
    }
    st->times.f_s += MPI_Wtime() - t0;
    st->times.nf++;
    return 0;
fail:
    (void)xmp_err(XMESH_ERR_INVALID_USAGE, "gpt2 stage %d forward mb %d: %s", st->stage, mbi,
                  xmp_last_error());
    xmp_tensor_free(&tgt);
    return 1;
}

int xmp_gpt2__cb_backward_input(void *user, int mbi, const void *const *gout, void *const *gin)
{
    xmp_gpt2_stage_t *st = user;
    double t0 = MPI_Wtime();
    mb_t *m = &st->mb[mbi];
    xmp_tensor_t *dp = &m->x.grad[st->v_out], d = {0}, dtab = {0}, dw = {0};
    if (st->has_l) {
        CHK(xmp_gexec_backward(&st->ex, &m->x, st->hlo, st->hlo + 2));
    } else {
        CHK(resid_tensor(st, dp));
        if (dp->lcount)
            memcpy(dp->data, gout[0], (size_t)dp->lcount * 4);
    }
    /* the blocks in reverse, each recomputed first (its bytes held from here to W) */
    for (int k = st->nl - 1; k >= 0; k--) {
        int lo = st->blo[k], hi = st->blo[k + 1];
        int64_t b0 = xmp_gexec_bytes(&st->ex, &m->x, lo, hi);
        if (st->tc.recompute != XMP_RECOMPUTE_NONE)
            CHK(xmp_gexec_recompute(&st->ex, &m->x, lo, hi,
                                    st->tc.recompute == XMP_RECOMPUTE_BLOCK));
        m->bytes += xmp_gexec_bytes(&st->ex, &m->x, lo, hi) - b0;
        CHK(xmp_gexec_backward(&st->ex, &m->x, lo, hi));
    }
    d = m->x.grad[st->v_in];
    memset(&m->x.grad[st->v_in], 0, sizeof d);
    if (st->has_e) {
        CHK(pos_grad(&d, xmp_gpt2__PT(st, XMP_GPT2_WPE, -1), &dw));
        CHK(accumulate(&st->p[xmp_gpt2__pindex(st, XMP_GPT2_WPE, -1)], &dw));
        /* The table gradient comes P over the axes that split the tokens: it
         * is summed locally here and reduced once per step in R. */
        CHK(xmp_embedding_backward(&d, &m->tok, xmp_gpt2__PT(st, XMP_GPT2_WTE, -1), &dtab));
        CHK(accumulate(&st->p[xmp_gpt2__pindex(st, XMP_GPT2_WTE, -1)], &dtab));
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
    xmp_tensor_free(&dtab);
    xmp_tensor_free(&dw);
    return 1;
}

int xmp_gpt2__cb_backward_weight(void *user, int mbi)
{
    xmp_gpt2_stage_t *st = user;
    double t0 = MPI_Wtime();
    mb_t *m = &st->mb[mbi];
    CHK(xmp_gexec_weights(&st->ex, &m->x));
    xmp_gpt2__mb_free(st, m); /* nothing of this microbatch is needed any more */
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
    par_t *qf = &f->p[xmp_gpt2__pindex(f, XMP_GPT2_WTE, -1)],
          *ql = &l->p[xmp_gpt2__pindex(l, XMP_GPT2_WTE, -1)];
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

int xmp_gpt2__cb_reduce(void *user)
{
    xmp_gpt2_stage_t *st = user;
    double t0 = MPI_Wtime();
    /* defer-grad: every reduction posted first (nonblocking), then waited in the same order;
     * the same collectives on the same data as the blocking loop. */
    for (int i = 0; st->ov.defer_grad && i < st->np; i++)
        if (xmp_param_reduce_start(&st->p[i].P)) {
            (void)xmp_err(XMESH_ERR_INVALID_USAGE, "gpt2 stage %d: gradient reduction of %s: %s",
                          st->stage, xmp_gpt2__pclass[st->p[i].id], xmp_last_error());
            return 1;
        }
    for (int i = 0; i < st->np; i++) {
        par_t *q = &st->p[i];
        /* Once per step: P -> B over the axes where the parameter is
         * replicated (the data-parallel all-reduce), or P -> S where its
         * storage is sharded (reduce-scatter). */
        if (st->ov.defer_grad ? xmp_param_reduce_wait(&q->P) : xmp_param_reduce(&q->P)) {
            (void)xmp_err(XMESH_ERR_INVALID_USAGE, "gpt2 stage %d: gradient reduction of %s: %s",
                          st->stage, xmp_gpt2__pclass[q->id], xmp_last_error());
            return 1;
        }
    }
    st->reduced = 1;
    if (st->tie_peer) {
        if (st->tie_peer->reduced && tie_exchange_local(st))
            return 1;
    } else if (st->tie_fl && (st->stage == st->tie_first || st->stage == st->tie_last) &&
               tie_exchange(st, &st->p[xmp_gpt2__pindex(st, XMP_GPT2_WTE, -1)])) {
        return 1;
    }
    st->times.r_s += MPI_Wtime() - t0;
    return 0;
}

int xmp_gpt2__cb_optimizer(void *user)
{
    xmp_gpt2_stage_t *st = user;
    double t0 = MPI_Wtime();
    const xmp_gpt2_train_cfg_t *t = &st->tc;
    st->reduced = 0;
    for (int i = 0; i < st->np; i++) {
        par_t *q = &st->p[i];
        xmp_tensor_t *w = xmp_gpt2__stored(q);
        if (w->lcount && q->P.r.data)
            xmp_adamw(xmp_f32(w), xmp_f32(&q->P.r), q->P.state[0], q->P.state[1], (size_t)w->lcount,
                      t->lr, t->beta1, t->beta2, t->eps, t->wd, st->step + 1);
        /* Sharded: the updated shards are all-gathered into the compute copy
         * the next step uses (prefetch: started here, waited after the updates of the
         * parameters that follow, in the same order). */
        if (st->ov.prefetch ? xmp_param_gather_start(&q->P) : xmp_param_gather(&q->P)) {
            (void)xmp_err(XMESH_ERR_INVALID_USAGE, "gpt2 stage %d: gathering %s: %s", st->stage,
                          xmp_gpt2__pclass[q->id], xmp_last_error());
            return 1;
        }
        xmp_param_zero_grad(&q->P, 0);
    }
    for (int i = 0; st->ov.prefetch && i < st->np; i++) {
        par_t *q = &st->p[i];
        if (xmp_param_gather_wait(&q->P)) {
            (void)xmp_err(XMESH_ERR_INVALID_USAGE, "gpt2 stage %d: gathering %s: %s", st->stage,
                          xmp_gpt2__pclass[q->id], xmp_last_error());
            return 1;
        }
    }
    for (int k = 0; k < st->tc.M; k++)
        if (st->mb[k].live)
            xmp_gpt2__mb_free(st, &st->mb[k]);
    st->times.o_s += MPI_Wtime() - t0;
    return 0;
}

void xmp_gpt2__cb_set_progress(void *user, void (*fn)(void *arg), void *arg)
{
    xmp_gpt2_stage_t *st = user;
    st->progress = fn;
    st->progress_arg = arg;
}

int64_t xmp_gpt2__cb_act_bytes(void *user)
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
