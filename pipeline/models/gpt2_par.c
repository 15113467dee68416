/* GPT-2 pipeline stages of SBP-parallel layers driven by a strategy: see gpt2_par.h.
 * This file: the parameter and activation classes, the stage's parameters, create and
 * destroy, the driver's ops, gathers and checkpoints. Built-in strategies and their check
 * are in gpt2_par_strategy.c; the forward, backward, reduction and optimizer in
 * gpt2_par_step.c. */
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

/* ------------------------------------------------------------- classes */

/* Parameter classes in llm.c order (index = XMP_GPT2_*). */
const char *const xmp_gpt2__pclass[NPT] = {
    "wte",   "wpe",   "ln1.w", "ln1.b", "qkv.w",    "qkv.b",    "attproj.w", "attproj.b",
    "ln2.w", "ln2.b", "fc.w",  "fc.b",  "fcproj.w", "fcproj.b", "lnf.w",     "lnf.b"};

const char *const xmp_gpt2__aclass[NACT] = {"act.x",    "act.ln1", "act.qkv",
                                            "act.att",  "act.ln2", "act.fch",
                                            "act.gelu", "act.lnf", "act.logits"};

/* ---------------------------------------------------------------- state */

/* The tensor AdamW updates: the stored shard, or the compute copy. */
xmp_tensor_t *xmp_gpt2__stored(par_t *q)
{
    return xmp_param_stored(&q->P);
}

/* Lets queued boundary transfers move between layers (the driver's progress, when given). */
void xmp_gpt2__progress(const xmp_gpt2_stage_t *st)
{
    if (st->progress)
        st->progress(st->progress_arg);
}

int xmp_gpt2__pindex(const xmp_gpt2_stage_t *st, int id, int layer)
{
    return st->pidx[id * (st->cfg.num_layers + 1) + layer + 1];
}
const xmp_tensor_t *xmp_gpt2__PT(const xmp_gpt2_stage_t *st, int id, int layer)
{
    return &st->p[xmp_gpt2__pindex(st, id, layer)].P.w;
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
    if (xmp_gpt2__pindex(st, id, layer) >= 0)
        return 0; /* wte of a stage with both E and L */
    par_t *q = &st->p[st->np];
    memset(q, 0, sizeof *q);
    q->id = id;
    q->layer = layer;
    /* one layer's slice, as the model graph has it (qkv as (3, NH, hs, C) views) */
    const xmp_gparam_t *gp = NULL;
    for (int i = 0; i < st->graph.nparam && !gp; i++)
        if (!strcmp(st->graph.param[i].cls, xmp_gpt2__pclass[id]))
            gp = &st->graph.param[i];
    if (!gp) {
        xmp_err(XMESH_ERR_INVALID_ARGUMENT, "no parameter of class %s in the graph",
                xmp_gpt2__pclass[id]);
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
            class_sbp(ss, xmp_gpt2__pclass[id], st->psbp[id]);
            class_store(ss, xmp_gpt2__pclass[id], st->pstore[id]);
        }
        for (int a = 0; a < NACT; a++)
            class_sbp(ss, xmp_gpt2__aclass[a], st->act[a]);
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
        if (!lfail && xmp_gpt2_graph(c, st->Bm, tc->T, c->num_layers, &st->graph))
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
        if (!lfail)
            lfail = xmp_gpt2__exec_init(st);
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
    for (int k = 0; st->mb && k < st->tc.M; k++)
        xmp_gpt2__mb_free(st, &st->mb[k]), xmp_gexec_mb_free(&st->ex, &st->mb[k].x);
    free(st->mb);
    xmp_gexec_free(&st->ex);
    free(st->vcls);
    free(st->gpmap);
    free(st->blo);
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
    o.forward = xmp_gpt2__cb_forward;
    o.backward_input = xmp_gpt2__cb_backward_input;
    o.backward_weight = xmp_gpt2__cb_backward_weight;
    o.reduce_grads = xmp_gpt2__cb_reduce;
    o.optimizer_step = xmp_gpt2__cb_optimizer;
    o.activation_bytes = xmp_gpt2__cb_act_bytes;
    o.set_progress = xmp_gpt2__cb_set_progress;
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
        rc = xmp_gpt2__cb_forward(st, 0, in, out, &loss) ? -1 : 0;
        mb_t *m = &st->mb[0];
        if (!rc) {
            double a = (double)m->bytes,
                   c = (double)(xmp_gpt2__tbytes(&m->x.val[st->v_in]) +
                                (st->has_l ? xmp_gexec_bytes(&st->ex, &m->x, st->hlo, st->hlo + 2) +
                                                 xmp_gpt2__tbytes(
                                                     &m->x.grad[st->graph.node[st->hlo + 1].out])
                                           : 0)),
                   p = 0;
            for (int k = 0; k < st->nl; k++) {
                c += (double)xmp_gpt2__tbytes(&m->x.val[st->graph.node[st->blo[k + 1] - 1].out]);
                for (int i = st->blo[k]; i < st->blo[k + 1]; i++)
                    p += (double)xmp_gpt2__tbytes(&m->x.ac[i].att);
            }
            *act = a;
            *ckpt = c;
            *keep = a > 0 ? (a - p) / a : 1;
        }
        xmp_gpt2__mb_free(st, m);
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
            if (h && buf &&
                (cr = xmp_tensor_gather_full(&h->p[xmp_gpt2__pindex(h, id, layer)].P.w, buf)))
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
        e->param = xmp_gpt2__stored(q);
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
            fprintf(stderr, "gpt2 stage %d: gathering %s: %s\n", st->stage, xmp_gpt2__pclass[q->id],
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
            xmp_gpt2__mb_free(st, &st->mb[k]);
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
