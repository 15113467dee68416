/*
 * `xmesh-train utransformer`: the U-Transformer (models/utransformer.h) on the synthetic shapes
 * denoising task (models/shapes_data.h), L2 loss, SGD with Nesterov momentum.
 *
 * This file is the U-Transformer side of the one trainer (apps/trainer.h): the model's own
 * flags, the serial model (the reference, xmp_ut_model_*) and the pipeline stages (ut_stage.c)
 * behind the trainer's model interface; the loop, the common flags, statistics, JSON,
 * --check-serial and re-planning are the trainer's.
 *
 * Stage graph: every tensor crossing a stage boundary is one edge with its own xmesh plans: the
 * main activation between consecutive layers on different stages, and each long skip
 * (down_i -> up_(5-i)) whose producer and consumer sit on different stages. Edge tensors are
 * (micro-batch, c, h, w) f32 in layout "S(0),B,..." on the producer's and the consumer's stage
 * mesh of 1 to 4 axes (split over axis 0, B on the others), so a skip can go from a 2x1 mesh to
 * a 1x2x2 mesh. The
 * conditioning sequence is NOT an edge: every rank generates the images, targets and
 * conditioning of its own slice from (seed, step, global image index).
 *
 * Data parallel inside a stage: rank d of the stage's dp axis runs images
 * [d * mb/dp, (d+1) * mb/dp) of each micro-batch; the loss and its gradient use the global
 * element count, so parameter gradients summed over the dp axis (SBP boxing P -> B over the dp
 * axis in R) and over micro-batches equal the serial gradient.
 *
 * Layers of a stage run on SBP tensors of its stage mesh (--stage-mesh, 1 to 4 axes) through nn/
 * only (models/utransformer_sbp.h), with the per-class SBPs of --strategy / --stage-strategy,
 * loaded through nn/strategy.h (built-ins dp, megatron, 3d and axonn from the model, generated
 * for the stage mesh's shape, or a file; a layer-qualified line "down1.attn.q.w" overrides the
 * class; a 'store' SBP keeps a parameter sharded between steps, nn/param.h); edge tensors are
 * boxed from and to each layer's act.x. A
 * micro-batch's activations (its tapes) are allocated when its forward runs and freed after
 * its weight gradients; the reported peak is measured.
 */
#include <cblas.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"
#include "commands.h"
#include "models/shapes_data.h"
#include "models/stage_layout.h"
#include "models/utrans_ckpt.h"
#include "models/utransformer.h"
#include "models/utransformer_sbp.h"
#include "nn/overlap.h"
#include "nn/sbp.h"
#include "nn/unet_kernels.h"
#include "pipe/driver.h"
#include "trainer.h"
#include "ut_stage.h"

static void ut_defaults(xmp_train_opts_t *t, ut_opts_t *o)
{
    xmp_train_defaults(t);
    t->steps = 200;
    t->lr = 0.05f;
    t->seed = 1234;
    memset(o, 0, sizeof *o);
    o->base = 8;
    o->batch = 8;
    o->momentum = 0.9f;
    o->sigma = 0.3f;
}

static void ut_usage(void)
{
    printf("usage: xmesh-train utransformer [--serial] [flags]   (MPI pipeline without --serial)\n"
           "model:\n"
           "  --base-channels C (8)  levels C,2C,4C,4C; conditioning 16 tokens x 4C\n"
           "  --groups G (4 if it divides C, else 1)  --head-dim D (C)  --seed N (1234)\n"
           "data / training:\n"
           "  --batch B (8) --steps N (200) --lr (0.05) --momentum (0.9) --weight-decay (0)\n"
           "  --noise SIGMA (0.3)\n"
           "strategies: built-in dp, megatron (default: conv pairs channel-split, attention\n"
           "  heads split where tp divides them), 3d (AutoDDL's (R, A, K) on the last three\n"
           "  axes), axonn (3d + weights stored split over R) on stage meshes of 1-4 axes,\n"
           "  or a file (docs/UTRANSFORMER.md)\n");
    xmp_train_usage();
}

static int parse_ut_flags(int argc, char **argv, xmp_train_opts_t *t, ut_opts_t *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            ut_usage();
            return 1;
        }
        int c = xmp_train_parse_flag(argc, argv, &i, t);
        if (c < 0)
            return -1;
        if (c > 0)
            continue;
        const xmp_cli_flag_t f[] = {
            {"--base-channels", &o->base, 1, 1024, NULL, 0, 0},
            {"--groups", &o->groups, 1, 1024, NULL, 0, 0},
            {"--head-dim", &o->head_dim, 1, 1024, NULL, 0, 0},
            {"--batch", &o->batch, 1, 1 << 16, NULL, 0, 0},
            {"--momentum", NULL, 0, 0, &o->momentum, 0.0, 0.999999},
            {"--noise", NULL, 0, 0, &o->sigma, 0.0, 100.0},
        };
        if ((c = xmp_cli_table(argc, argv, &i, f, sizeof f / sizeof f[0])) <= 0)
            return c < 0 ? -1 : xmp_cli_error("unknown flag '%s' (see --help)", a);
    }
    if (xmp_train_check_flags(t) != 0)
        return -1;
    if (t->stages > XMP_UT_LAYERS)
        return xmp_cli_error("--stages %d: the model has %d layers", t->stages, XMP_UT_LAYERS);
    if (o->batch % t->microbatches != 0)
        return xmp_cli_error("--batch %d is not a multiple of --microbatches %d", o->batch,
                             t->microbatches);
    o->lr = t->lr;
    o->wd = t->wd;
    o->seed = t->seed;
    o->batch_arg = o->batch;
    o->batch *= t->grad_accum;
    o->microbatches = t->microbatches * t->grad_accum;
    return 0;
}

/* ---- the adapter: serial model and stages behind the trainer's model interface ---- */

typedef struct {
    const xmp_train_opts_t *t;
    ut_opts_t o;
    xmp_ut_config_t cfg;
    /* serial */
    xmp_ut_model_t sm;
    xmp_shapes_t ssh;
    float *sbuf;
    /* parallel */
    ut_stage_t st;
    ut_stage_t *xs; /* virtual stages: the rank's further stages (nxs) */
    int nxs;
    xmp_stage_ops_t sops[XMP_MAX_STAGES];
    const xmp_stage_layout_t *sl;
    xmp_ut_strategy_t ustrat[XMP_MAX_STAGES]; /* each stage's table, from nn/strategy.h */
    xmp_mesh_t *smesh[XMP_MAX_STAGES];
    int *mranks;
    xmp_edge_cfg_t ec[2 * XMP_UT_LAYERS];
    xmp_sedge_t se[2 * XMP_UT_LAYERS];
    xmp_stage_mesh_t meshes[XMP_MAX_STAGES];
    char names[2 * XMP_UT_LAYERS][48];
    const char *name_ptr[2 * XMP_UT_LAYERS];
    char kinds[XMP_UT_LAYERS + 1];
    xmp_ckpt_t *ck; /* --resume: opened by ut_ckpt_open, loaded and closed by ut_ckpt_load */
} ut_run_t;

static int ut_serial_open(void *u, int64_t *nparams)
{
    ut_run_t *g = u;
    const ut_opts_t *o = &g->o;
    const xmp_ut_config_t *c = &g->cfg;
    if (xmp_ut_model_init(&g->sm, c, o->batch, o->seed) != 0)
        return xmp_train_fail("model: %s", xmp_last_error());
    if (xmp_shapes_init(&g->ssh, o->seed, c->cond_dim, o->sigma) != 0) {
        xmp_ut_model_free(&g->sm);
        return xmp_train_fail("data: %s", xmp_last_error());
    }
    size_t HW = XMP_UT_IMG * XMP_UT_IMG, B = (size_t)o->batch;
    g->sbuf = malloc((B * 7 * HW + B * XMP_UT_TOKENS * (size_t)c->cond_dim) * sizeof(float));
    if (!g->sbuf) {
        xmp_shapes_free(&g->ssh);
        xmp_ut_model_free(&g->sm);
        return xmp_train_fail("out of memory for a batch of %d", o->batch);
    }
    *nparams = (int64_t)g->sm.layout.total;
    return 0;
}

/* One optimizer step over the step's batch (--batch x --grad-accum images): the mean loss over
 * all of them, as accumulation over grad_accum batches gives it. */
static int ut_serial_step(void *u, int step, double *loss, double *grad_norm)
{
    ut_run_t *g = u;
    const ut_opts_t *o = &g->o;
    size_t HW = XMP_UT_IMG * XMP_UT_IMG, B = (size_t)o->batch;
    float *in = g->sbuf, *tg = in + B * 3 * HW, *cond = tg + B * 4 * HW;
    xmp_shapes_batch(&g->ssh, step, o->batch, 0, o->batch, in, tg, cond);
    if (xmp_ut_model_forward(&g->sm, in, cond, tg) != 0 || xmp_ut_model_backward(&g->sm, tg) != 0)
        return xmp_train_fail("%s", xmp_last_error());
    if (g->t->grad_clip > 0) {
        double s = 0;
        const size_t n = g->sm.layout.total;
        for (size_t k = 0; k < n; k++)
            s += (double)g->sm.grads[k] * g->sm.grads[k];
        *grad_norm = sqrt(s);
        if (*grad_norm > g->t->grad_clip) {
            float sc = (float)(g->t->grad_clip / *grad_norm);
            for (size_t k = 0; k < n; k++)
                g->sm.grads[k] *= sc;
        }
    }
    if (xmp_ut_model_update(&g->sm, o->lr, o->momentum, o->wd) != 0)
        return xmp_train_fail("%s", xmp_last_error());
    *loss = g->sm.loss;
    return 0;
}

/* Validation batch k: held-out images (negative steps: global image indexes training never
 * reaches), the same at every validation. */
static long val_step(int k)
{
    return -1L - k;
}

static int ut_serial_val(void *u, int k, double *loss)
{
    ut_run_t *g = u;
    const ut_opts_t *o = &g->o;
    size_t HW = XMP_UT_IMG * XMP_UT_IMG, B = (size_t)o->batch;
    float *in = g->sbuf, *tg = in + B * 3 * HW, *cond = tg + B * 4 * HW;
    xmp_shapes_batch(&g->ssh, val_step(k), o->batch, 0, o->batch, in, tg, cond);
    if (xmp_ut_model_forward(&g->sm, in, cond, tg) != 0)
        return xmp_train_fail("%s", xmp_last_error());
    *loss = g->sm.loss;
    return 0;
}

static void ut_serial_close(void *u)
{
    ut_run_t *g = u;
    free(g->sbuf);
    g->sbuf = NULL;
    xmp_shapes_free(&g->ssh);
    xmp_ut_model_free(&g->sm);
}

/* Built-in strategies (nn/strategy.h callback): dp, megatron, 3d and axonn
 * (models/utransformer_sbp.h), generated for the config and the stage mesh's shape. */
static int ut_builtins(void *u, const char *name, int naxes, const int *shape, char *text, size_t n,
                       char *err, size_t errlen)
{
    ut_run_t *g = u;
    return xmp_ut_strategy_builtin(&g->cfg, name, naxes, shape, text, n, err, errlen);
}

/* The stage's nn/strategy.h table as the layers' per-class table, checked against the layers
 * of the stage (classes, groups and heads divisible by the channel pieces). */
static int ut_strategy_check(void *u, const xmp_strategy_t *s, const xmp_stage_layout_t *sl,
                             int stage, char *err, size_t errlen)
{
    ut_run_t *g = u;
    xmp_ut_strategy_t *t = &g->ustrat[stage];
    *t = *s;
    const int *shape = sl->shape[stage];
    if (xmp_ut_strategy_check(t, &g->cfg, sl->first[stage], sl->first[stage] + sl->count[stage] - 1,
                              shape) != 0)
        return snprintf(err, errlen, "stage %d: %s", stage, xmp_last_error()), -1;
    return 0;
}

static int ut_layout_check(void *u, const xmp_stage_layout_t *sl, char *err, size_t errlen)
{
    ut_run_t *g = u;
    const int mbs = g->o.batch / g->o.microbatches;
    for (int s = 0; s < sl->nstages; s++) {
        if (sl->ndim[s] < 1 || sl->ndim[s] > XMP_MAX_MESH_DIMS)
            return snprintf(err, errlen, "stage %d: a mesh of %d axes (1..%d)", s, sl->ndim[s],
                            XMP_MAX_MESH_DIMS),
                   -1;
        if (mbs % xmp_uts_data_degree(sl, s) != 0)
            return snprintf(err, errlen,
                            "stage %d: micro-batch %d (--batch %d / --microbatches %d) is not a "
                            "multiple of its data-parallel degree %d (the size of mesh axis 0: "
                            "the images of a micro-batch are split over it at the stage "
                            "boundary)",
                            s, mbs, g->o.batch, g->o.microbatches, xmp_uts_data_degree(sl, s)),
                   -1;
    }
    return 0;
}

static int ut_par_open(void *u, MPI_Comm comm, xmesh_ctx_t ctx, const xmp_stage_layout_t *sl,
                       const xmp_strategy_t *strat, xmp_train_stages_t *out)
{
    ut_run_t *g = u;
    ut_stage_t *st = &g->st;
    int rank, size, local_fail = 0;
    (void)strat; /* converted by ut_strategy_check into g->ustrat */
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    g->sl = sl;
    st->o = &g->o;
    st->cfg = g->cfg;
    st->sl = sl;
    st->M = g->o.microbatches;
    st->mbs = g->o.batch / st->M;
    xmp_ut_params_layout(&g->cfg, &st->lay);
    st->nedges = xmp_uts_build_edges(&g->cfg, sl, st->mbs, st->e, g->ec, g->se);
    for (int k = 0; k < st->nedges; k++) {
        snprintf(g->names[k], sizeof g->names[k], "%s %s", xmp_ut_layer_name(st->e[k].layer),
                 st->e[k].what == T_MAIN ? "main" : "skip");
        g->name_ptr[k] = g->names[k];
    }
    st->stage = xmp_stage_layout_stage_of_rank(sl, rank);
    /* every stage's SBP mesh (1 to 4 axes) (collective over the job); a stage's ranks are
     * rank0[s] .. rank0[s] + dp*tp - 1 */
    if (!(g->mranks = malloc((size_t)size * sizeof *g->mranks))) {
        xmp_train_fail("out of memory for %d ranks", size);
        local_fail = 1;
    }
    for (int k = 0; !local_fail && k < size; k++)
        g->mranks[k] = k;
    for (int s = 0; s < sl->nstages && !local_fail; s++) {
        /* with the run's xmesh context: checkpoint loads stream blocks through xmesh plans
         * from the saved layout to these meshes (ckpt/ckpt.h) */
        if (xmp_mesh_create(comm, ctx, sl->ndim[s], sl->shape[s], g->mranks + sl->rank0[s],
                            &g->smesh[s]) != XMESH_SUCCESS) {
            xmp_train_fail("stage %d mesh: %s", s, xmp_last_error());
            local_fail = 1;
        }
        g->meshes[s].ndim = sl->ndim[s];
        for (int a = 0; a < sl->ndim[s]; a++)
            g->meshes[s].shape[a] = sl->shape[s][a];
        g->meshes[s].ranks = g->mranks + sl->rank0[s];
    }
    /* Virtual stages: one stage state per model stage of this rank's group (chunk 0 in st,
     * the others in xs). */
    int mystages[XMP_MAX_STAGES];
    int nmine = xmp_stage_layout_stages_of_rank(sl, rank, mystages, XMP_MAX_STAGES);
    g->nxs = 0;
    if (nmine > 1 && !local_fail) {
        if (!(g->xs = calloc((size_t)(nmine - 1), sizeof *g->xs)))
            local_fail = xmp_train_fail("out of memory") != 0;
        else
            g->nxs = nmine - 1;
    }
    ut_stage_t tmpl = *st;
    for (int k = 0; k < nmine && !local_fail; k++) {
        ut_stage_t *p = k ? &g->xs[k - 1] : st;
        *p = tmpl;
        p->stage = mystages[k];
        p->mem_quiet = k > 0;
        p->strat = g->ustrat[p->stage];
        p->first = sl->first[p->stage];
        p->last = p->first + sl->count[p->stage] - 1;
        int msize = 1;
        for (int a = 0; a < sl->ndim[p->stage]; a++)
            msize *= sl->shape[p->stage][a];
        /* images split over axis 0; the other axes (tp: their rank count) hold the same images */
        p->dp = xmp_uts_data_degree(sl, p->stage);
        p->tp = msize / p->dp;
        p->dpi = (rank - sl->rank0[p->stage]) / p->tp;
        p->tpi = (rank - sl->rank0[p->stage]) % p->tp;
        p->mesh = g->smesh[p->stage];
        p->nloc = p->mbs / p->dp;
        if (xmp_shapes_init(&p->sh, g->o.seed, g->cfg.cond_dim, g->o.sigma) != 0)
            local_fail = xmp_train_fail("data: %s", xmp_last_error()) != 0;
        else if (xmp_uts_init(p) != 0)
            local_fail = 1;
    }
    /* every chunk measures above the parameters of all of them */
    for (int k = 0; k < g->nxs; k++)
        g->xs[k].base_bytes = xmp_ut_mem_live_bytes();
    if (nmine > 1)
        st->base_bytes = xmp_ut_mem_live_bytes();
    memset(g->sops, 0, sizeof g->sops);
    for (int k = 0; k < nmine && !local_fail; k++) {
        ut_stage_t *p = k ? &g->xs[k - 1] : st;
        xmp_stage_ops_t *q = &g->sops[p->stage];
        q->user = p;
        q->forward = xmp_uts_fwd;
        q->backward_input = xmp_uts_bwd_input;
        q->backward_weight = xmp_uts_bwd_weight;
        q->reduce_grads = xmp_uts_reduce;
        q->optimizer_step = xmp_uts_opt;
        q->activation_bytes = xmp_uts_act_bytes;
        q->set_progress = xmp_uts_set_progress;
    }
    out->stage_ops = sl->ngroups != sl->nstages ? g->sops : NULL;
    out->stage = st->stage;
    out->ops.user = st;
    out->ops.forward = xmp_uts_fwd;
    out->ops.backward_input = xmp_uts_bwd_input;
    out->ops.backward_weight = xmp_uts_bwd_weight;
    out->ops.reduce_grads = xmp_uts_reduce;
    out->ops.optimizer_step = xmp_uts_opt;
    out->ops.activation_bytes = xmp_uts_act_bytes;
    out->ops.set_progress = xmp_uts_set_progress;
    out->nedges = st->nedges;
    out->edges = g->ec;
    out->sedges = g->se;
    out->meshes = g->meshes;
    out->edge_names = g->name_ptr;
    out->nparams = (int64_t)st->lay.total;
    return local_fail ? -1 : 0;
}

static void ut_set_lr(void *u, float lr)
{
    ((ut_run_t *)u)->o.lr = lr; /* the serial model and the stages read it */
}

/* over every chunk of the rank (virtual stages: st and xs) */
static double ut_grad_sumsq(void *u)
{
    ut_run_t *g = u;
    double s = 0;
    for (int k = -1; k < g->nxs; k++) {
        ut_stage_t *st = k < 0 ? &g->st : &g->xs[k];
        for (int l = st->first; st->stage >= 0 && l <= st->last; l++)
            s += xmp_ut_slayer_grad_sumsq(st->SL[l]);
    }
    return s;
}

static void ut_grad_scale(void *u, float scale)
{
    ut_run_t *g = u;
    for (int k = -1; k < g->nxs; k++) {
        ut_stage_t *st = k < 0 ? &g->st : &g->xs[k];
        for (int l = st->first; st->stage >= 0 && l <= st->last; l++)
            xmp_ut_slayer_scale_grads(st->SL[l], scale);
    }
}

static int ut_par_set_step(void *u, int step)
{
    ut_run_t *g = u;
    g->st.step = step;
    for (int k = 0; k < g->nxs; k++)
        g->xs[k].step = step;
    return 0;
}

static int ut_par_set_val(void *u, int k)
{
    ut_run_t *g = u;
    g->st.step = val_step(k);
    for (int c = 0; c < g->nxs; c++)
        g->xs[c].step = val_step(k);
    return 0;
}

/* After forwards-only steps: frees every micro-batch's tapes and data of one stage. */
static void stage_release(ut_stage_t *st)
{
    for (int mb = 0; st->stage >= 0 && mb < st->M; mb++) {
        for (int l = st->first; l <= st->last; l++) {
            xmp_ut_tape_free(st->tape[IX(st, l, mb)]);
            st->tape[IX(st, l, mb)] = NULL;
            st->y[IX(st, l, mb)] = st->so[IX(st, l, mb)] = NULL;
            xmp_tensor_free(&st->dact[IX(st, l, mb)]);
            xmp_tensor_free(&st->dskip[IX(st, l, mb)]);
            memset(&st->dact[IX(st, l, mb)], 0, sizeof(xmp_tensor_t));
            memset(&st->dskip[IX(st, l, mb)], 0, sizeof(xmp_tensor_t));
        }
        xmp_uts_mb_free_data(st, mb);
        st->live[mb] = 0;
    }
}

static void ut_par_release(void *u)
{
    ut_run_t *g = u;
    stage_release(&g->st);
    for (int k = 0; k < g->nxs; k++)
        stage_release(&g->xs[k]);
}

static void ut_par_set_recompute(void *u, int mode)
{
    ut_run_t *g = u;
    g->st.recompute = mode;
    for (int k = 0; k < g->nxs; k++)
        g->xs[k].recompute = mode;
}

static void ut_par_close(void *u)
{
    ut_run_t *g = u;
    xmp_uts_free(&g->st);
    for (int k = 0; k < g->nxs; k++)
        xmp_uts_free(&g->xs[k]);
    free(g->xs);
    g->xs = NULL;
    g->nxs = 0;
    for (int s = 0; s < XMP_MAX_STAGES; s++) {
        xmp_mesh_destroy(g->smesh[s]);
        g->smesh[s] = NULL;
    }
    free(g->mranks);
    g->mranks = NULL;
}

/* ---- distributed checkpoints (models/utrans_ckpt.h) ---- */

/* --resume: configuration, SGD settings, batch, noise and seed from the manifest (the data is a
 * function of (seed, step, image): the step is its position). The same on every rank. */
static int ut_ckpt_open(void *u, MPI_Comm comm, const char *dir, xmp_train_opts_t *o, int64_t *step)
{
    ut_run_t *g = u;
    xmp_ut_ckpt_settings_t s;
    if (xmp_ut_ckpt_open(comm, dir, &g->ck, &s) != XMESH_SUCCESS)
        return -1;
    if (s.batch % g->o.microbatches)
        return xmp_train_fail("%s: the checkpoint's batch of %d images per step is not a multiple "
                              "of --microbatches x --grad-accum = %d",
                              xmp_ckpt_dir(g->ck), s.batch, g->o.microbatches);
    g->cfg = s.cfg;
    g->o.base = s.cfg.base;
    g->o.groups = s.cfg.groups;
    g->o.head_dim = s.cfg.head_dim;
    g->o.lr = o->lr = s.lr;
    g->o.wd = o->wd = s.wd;
    g->o.seed = o->seed = s.seed;
    g->o.momentum = s.momentum;
    g->o.sigma = s.sigma;
    g->o.batch = s.batch; /* images per optimizer step (x --grad-accum when saved) */
    g->o.batch_arg = s.batch / o->grad_accum;
    g->t = o;
    *step = s.step;
    return 0;
}

static int ut_ckpt_load(void *u, MPI_Comm comm, xmesh_ctx_t ctx)
{
    ut_run_t *g = u;
    /* ctx: the context the stage meshes were made with (plans from the saved layout) */
    xmesh_result_t r = xmp_ut_ckpt_load(g->st.SL, comm, ctx, g->ck, &g->cfg);
    xmp_ckpt_close(g->ck);
    g->ck = NULL;
    return r == XMESH_SUCCESS ? 0 : -1;
}

static int ut_ckpt_save(void *u, MPI_Comm comm, const char *dir, int64_t step, int keep)
{
    ut_run_t *g = u;
    /* the base learning rate (g->o.lr is this step's scheduled one) */
    xmp_ut_ckpt_settings_t s = {g->cfg,     g->t->lr,   g->o.momentum, g->o.wd,
                                g->o.sigma, g->o.batch, g->o.seed,     step};
    char lay[256] = "", meshes[256] = "", data[32];
    xmp_stage_layout_format(g->sl, lay, sizeof lay);
    xmp_stage_layout_format_meshes(g->sl, meshes, sizeof meshes);
    snprintf(data, sizeof data, "%lld", (long long)step);
    const char *strategy = g->t->stage_strategy ? g->t->stage_strategy
                           : g->t->strategy     ? g->t->strategy
                                                : "megatron";
    /* The synthetic data is a function of (seed, step, image): the step is its position. */
    xmp_ckpt_kv_t extra[] = {
        {"data.step", data}, {"layout", lay}, {"layout.meshes", meshes}, {"strategy", strategy}};
    return xmp_ut_ckpt_save(g->st.SL, comm, dir, step, keep, &s, extra, 4) == XMESH_SUCCESS ? 0
                                                                                            : -1;
}

/* Parameter + optimizer bytes per rank (sharded storage shows here), like xmesh-train gpt:
 * stored parameters + SGD velocity (compute copies). Collective over MPI_COMM_WORLD. */
static int ut_par_finish(void *u, int ok, xmp_json_t *j)
{
    ut_run_t *g = u;
    int rank, size;
    (void)ok;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int64_t mine[4] = {g->st.stage, 0, 0, 0}, dummy[4];
    for (int k = 0; k <= g->nxs; k++) { /* summed over the rank's stages */
        const ut_stage_t *p = k ? &g->xs[k - 1] : &g->st;
        for (int l = p->first; p->stage >= 0 && l <= p->last; l++) {
            mine[1] += xmp_ut_slayer_param_bytes(p->SL[l]);
            mine[2] += xmp_ut_slayer_optimizer_bytes(p->SL[l]);
            mine[3] += xmp_ut_slayer_compute_bytes(p->SL[l]);
        }
    }
    int64_t *all = rank == 0 ? calloc((size_t)size * 4, sizeof(int64_t)) : NULL;
    if (xmp_gather(mine, 4, all ? all : dummy, MPI_INT64_T, 0, MPI_COMM_WORLD, "memory per rank") !=
        XMESH_SUCCESS) {
        free(all);
        return -1;
    }
    if (!all)
        return 0;
    printf("memory per rank (bytes): stored parameters + SGD velocity (compute copies)\n");
    for (int r = 0; r < size; r++) {
        const int64_t *v = all + 4 * r;
        printf("  rank %d stage %lld: %lld + %lld = %lld (%lld)\n", r, (long long)v[0],
               (long long)v[1], (long long)v[2], (long long)(v[1] + v[2]), (long long)v[3]);
    }
    if (j) {
        xmp_json_arr_begin(j, "memory_per_rank");
        for (int r = 0; r < size; r++) {
            const int64_t *v = all + 4 * r;
            xmp_json_obj_begin(j, NULL);
            xmp_json_int(j, "rank", r);
            xmp_json_int(j, "stage", (long long)v[0]);
            xmp_json_int(j, "param_bytes", (long long)v[1]);
            xmp_json_int(j, "optimizer_bytes", (long long)v[2]);
            xmp_json_int(j, "compute_param_bytes", (long long)v[3]);
            xmp_json_obj_end(j);
        }
        xmp_json_arr_end(j);
    }
    free(all);
    return 0;
}

static void ut_json_model(void *u, xmp_json_t *j)
{
    ut_run_t *g = u;
    xmp_json_int(j, "base_channels", g->cfg.base);
    xmp_json_int(j, "groups", g->cfg.groups);
    xmp_json_int(j, "head_dim", g->cfg.head_dim);
    xmp_json_int(j, "cond_tokens", XMP_UT_TOKENS);
    xmp_json_int(j, "cond_dim", g->cfg.cond_dim);
    xmp_json_int(j, "layers", XMP_UT_LAYERS);
    xmp_json_int(j, "seed", (long long)g->o.seed);
}

static void ut_json_train(void *u, xmp_json_t *j)
{
    ut_run_t *g = u;
    xmp_json_str(j, "data", "synthetic shapes 32x32, denoise + mask");
    xmp_json_f32(j, "noise", g->o.sigma);
    xmp_json_int(j, "batch", g->o.batch_arg);
    xmp_json_f32(j, "momentum", g->o.momentum);
}

static void ut_describe(void *u, char *buf, size_t n)
{
    ut_run_t *g = u;
    if (g->t->grad_accum > 1)
        snprintf(buf, n, "B=%dx%d C=%d", g->o.batch_arg, g->t->grad_accum, g->o.base);
    else
        snprintf(buf, n, "B=%d C=%d", g->o.batch, g->o.base);
}

int xmp_train_utransformer_main(int argc, char **argv)
{
    xmp_cli_set_command("utransformer");
    static ut_run_t g; /* large (tables per layer and stage); one per process */
    xmp_train_opts_t t;
    memset(&g, 0, sizeof g);
    ut_defaults(&t, &g.o);
    int p = parse_ut_flags(argc, argv, &t, &g.o);
    if (p != 0)
        return p > 0 ? 0 : 2;
    if (xmp_ut_config_init(&g.cfg, g.o.base, g.o.groups, g.o.head_dim) != 0) {
        xmp_cli_error("model flags: %s", xmp_last_error());
        return 2;
    }
    g.t = &t;
    openblas_set_num_threads(t.blas_threads);
    memset(g.kinds, 'u', XMP_UT_LAYERS);
    g.kinds[XMP_UT_LAYERS] = '\0';
    xmp_train_model_t m;
    memset(&m, 0, sizeof m);
    m.name = "utransformer";
    m.rate_key = "images_per_s";
    m.per_step = g.o.batch;
    m.user = &g;
    m.kinds = g.kinds;
    m.builtins = ut_builtins;
    m.builtin_names = XMP_UT_STRATEGY_BUILTINS;
    m.strategy_check = ut_strategy_check;
    m.layout_check = ut_layout_check;
    m.serial_open = ut_serial_open;
    m.serial_step = ut_serial_step;
    m.serial_close = ut_serial_close;
    m.set_lr = ut_set_lr;
    m.serial_val = ut_serial_val;
    m.par_set_val = ut_par_set_val;
    m.par_release = ut_par_release;
    m.grad_sumsq = ut_grad_sumsq;
    m.grad_scale = ut_grad_scale;
    m.par_open = ut_par_open;
    m.par_set_recompute = ut_par_set_recompute;
    m.par_set_step = ut_par_set_step;
    m.par_close = ut_par_close;
    m.par_finish = ut_par_finish;
    m.json_model = ut_json_model;
    m.json_train = ut_json_train;
    m.describe = ut_describe;
    m.ckpt_open = ut_ckpt_open;
    m.ckpt_load = ut_ckpt_load;
    m.ckpt_save = ut_ckpt_save;
    int rc = xmp_train_run(&t, &m);
    xmp_ckpt_close(g.ck);
    return rc;
}
