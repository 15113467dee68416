/*
 * `xmesh-train utransformer`: the U-Transformer (models/utransformer.h) on the synthetic shapes
 * denoising task (models/shapes_data.h), L2 loss, SGD with Nesterov momentum.
 *
 *   --serial      one process, the reference (xmp_ut_model_*)
 *   otherwise     MPI pipeline: the 13 layers split into stages (models/stage_layout.h), each
 *                 stage on its own dp x tp mesh, run by the pipeline driver (pipe/driver.h).
 *
 * Stage graph: every tensor crossing a stage boundary is one edge with its own xmesh plans: the
 * main activation between consecutive layers on different stages, and each long skip
 * (down_i -> up_(5-i)) whose producer and consumer sit on different stages. Edge tensors are
 * (micro-batch, c, h, w) f32 in layout "S(0),B" on the producer's and the consumer's dp x tp mesh
 * (split over the data-parallel axis), so a skip can go from a dp=2 mesh to a dp=1 mesh. The
 * conditioning sequence is NOT an edge: every rank generates the images, targets and
 * conditioning of its own slice from (seed, step, global image index).
 *
 * Data parallel inside a stage: rank d of the stage's dp axis runs images
 * [d * mb/dp, (d+1) * mb/dp) of each micro-batch; the loss and its gradient use the global
 * element count, so parameter gradients summed over the dp axis (SBP boxing P -> B over the dp
 * axis in R) and over micro-batches equal the serial gradient.
 *
 * Layers of a stage run on SBP tensors of its dp x tp mesh through nn/ only
 * (models/utransformer_sbp.h), with the per-class SBPs of --strategy (dp, megatron: channel
 * split on the tp axis, or a file); every layer input and output stays "S(0),B" (class act.x),
 * so the edges do not change. A micro-batch's activations (its tapes) are allocated when its
 * forward runs and freed after its weight gradients; the reported peak is measured.
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
#include "models/utransformer.h"
#include "models/utransformer_sbp.h"
#include "nn/unet_kernels.h"
#include "nn/sbp.h"
#include "pipe/driver.h"
#include "pipe/replan.h"

typedef struct {
    int serial, base, groups, head_dim, batch, steps, blas_threads, no_progress;
    float lr, momentum, wd, sigma;
    uint64_t seed;
    const char *json, *trace, *layout, *stage_mesh, *stage_dp, *stage_tp, *cluster, *strategy;
    int stages, microbatches, schedule, delay_wgrad, comm, print_schedule, check_serial;
    int virtual_stages; /* issue 23: model stages per rank group */
    int recompute;      /* xmp_recompute_t */
    const char *stage_groups;
} ut_opts_t;

static void ut_defaults(ut_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->base = 8;
    o->batch = 8;
    o->steps = 200;
    o->blas_threads = 1;
    o->lr = 0.05f;
    o->momentum = 0.9f;
    o->sigma = 0.3f;
    o->seed = 1234;
    o->stages = 0; /* unset: the layout's count, else 1 */
    o->microbatches = 1;
    o->schedule = XMP_SCHED_1F1B;
    o->comm = XMP_COMM_BROADCAST;
    o->strategy = "megatron";
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
           "pipeline (same as xmesh-train gpt):\n"
           "  --stages N (1)  --layout STR  --stage-mesh RxC,..  --stage-dp N,..  --stage-tp N,..\n"
           "  --strategy dp|megatron|FILE (megatron)  per-class SBPs on every stage's dp x tp\n"
           "                   mesh (docs/UTRANSFORMER.md); megatron: conv pairs channel-split,\n"
           "                   attention heads split where tp divides them\n"
           "  --microbatches M (1)  --schedule gpipe|1f1b|eager-1f1b|interleaved-1f1b|\n"
           "                   eager-interleaved-1f1b|zb-v|v-1f1b|dualpipe-v (1f1b) --delay-wgrad\n"
           "  --virtual-stages V  model stages per rank group (--stages R groups)\n"
           "  --stage-groups interleaved|v|LIST  stage -> group map (--stage-mesh: one per group\n"
           "                   or one per stage)\n"
           "  --recompute none|block|selective  drop a layer's tape after its forward (block: all\n"
           "                   but its inputs and outputs; selective: attention probabilities)\n"
           "                   and recompute it before its backward\n"
           "  --comm broadcast|sendrecv|sendrecv-allgather|blocking|signal (broadcast)\n"
           "  --trace FILE  --print-schedule\n"
           "  --cluster FILE     cost model (xmesh-calibrate -o FILE; sets XMESH_CLUSTER_FILE)\n"
           "  --check-serial     rank 0 also runs the serial reference and fails unless every\n"
           "                     step's loss matches (1e-5 relative to step 5, 1e-4 to step 10)\n"
           "output:\n"
           "  --json FILE  --no-progress  --blas-threads N (1)\n");
}

static int parse_ut_flags(int argc, char **argv, ut_opts_t *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            ut_usage();
            return 1;
        }
        const struct {
            const char *flag;
            int *flagp;
        } sw[] = {{"--serial", &o->serial},
                  {"--no-progress", &o->no_progress},
                  {"--delay-wgrad", &o->delay_wgrad},
                  {"--print-schedule", &o->print_schedule},
                  {"--check-serial", &o->check_serial}};
        size_t k;
        for (k = 0; k < sizeof sw / sizeof sw[0]; k++)
            if (!strcmp(a, sw[k].flag))
                break;
        if (k < sizeof sw / sizeof sw[0]) {
            *sw[k].flagp = 1;
            continue;
        }
        const struct {
            const char *flag;
            int *ip;
            long lo, hi;
            float *fp;
            double flo, fhi;
            const char **sp;
        } t[] = {
            {"--base-channels", &o->base, 1, 1024, NULL, 0, 0, NULL},
            {"--groups", &o->groups, 1, 1024, NULL, 0, 0, NULL},
            {"--head-dim", &o->head_dim, 1, 1024, NULL, 0, 0, NULL},
            {"--batch", &o->batch, 1, 1 << 16, NULL, 0, 0, NULL},
            {"--steps", &o->steps, 1, 1 << 30, NULL, 0, 0, NULL},
            {"--blas-threads", &o->blas_threads, 1, 1024, NULL, 0, 0, NULL},
            {"--stages", &o->stages, 1, XMP_UT_LAYERS, NULL, 0, 0, NULL},
            {"--virtual-stages", &o->virtual_stages, 1, XMP_UT_LAYERS, NULL, 0, 0, NULL},
            {"--stage-groups", NULL, 0, 0, NULL, 0, 0, &o->stage_groups},
            {"--microbatches", &o->microbatches, 1, 1 << 16, NULL, 0, 0, NULL},
            {"--lr", NULL, 0, 0, &o->lr, 0.0, 10.0, NULL},
            {"--momentum", NULL, 0, 0, &o->momentum, 0.0, 0.999999, NULL},
            {"--weight-decay", NULL, 0, 0, &o->wd, 0.0, 10.0, NULL},
            {"--noise", NULL, 0, 0, &o->sigma, 0.0, 100.0, NULL},
            {"--json", NULL, 0, 0, NULL, 0, 0, &o->json},
            {"--trace", NULL, 0, 0, NULL, 0, 0, &o->trace},
            {"--cluster", NULL, 0, 0, NULL, 0, 0, &o->cluster},
            {"--layout", NULL, 0, 0, NULL, 0, 0, &o->layout},
            {"--stage-mesh", NULL, 0, 0, NULL, 0, 0, &o->stage_mesh},
            {"--stage-dp", NULL, 0, 0, NULL, 0, 0, &o->stage_dp},
            {"--stage-tp", NULL, 0, 0, NULL, 0, 0, &o->stage_tp},
            {"--strategy", NULL, 0, 0, NULL, 0, 0, &o->strategy},
        };
        size_t nt = sizeof t / sizeof t[0];
        for (k = 0; k < nt; k++)
            if (!strcmp(a, t[k].flag))
                break;
        if (k == nt) {
            if (!strcmp(a, "--seed")) {
                if (!(v = xmp_cli_value(argc, argv, &i)) || xmp_cli_u64(a, v, &o->seed) != 0)
                    return -1;
                continue;
            }
            if (!strcmp(a, "--schedule")) {
                if (!(v = xmp_cli_value(argc, argv, &i)))
                    return -1;
                if ((o->schedule = xmp_sched_kind_parse(v)) < 0)
                    return xmp_cli_error("--schedule '%s': expected gpipe, 1f1b, eager-1f1b, "
                                         "interleaved-1f1b, eager-interleaved-1f1b, zb-v, "
                                         "v-1f1b or dualpipe-v",
                                         v);
                continue;
            }
            if (!strcmp(a, "--recompute")) {
                if (!(v = xmp_cli_value(argc, argv, &i)))
                    return -1;
                if ((o->recompute = xmp_recompute_parse(v)) < 0)
                    return xmp_cli_error("--recompute '%s': expected none, block or selective", v);
                continue;
            }
            if (!strcmp(a, "--comm")) {
                if (!(v = xmp_cli_value(argc, argv, &i)))
                    return -1;
                if ((o->comm = xmp_comm_mode_parse(v)) < 0)
                    return xmp_cli_error("--comm '%s': expected broadcast, sendrecv, "
                                         "sendrecv-allgather, blocking or signal",
                                         v);
                continue;
            }
            return xmp_cli_error("unknown flag '%s' (see --help)", a);
        }
        if (!(v = xmp_cli_value(argc, argv, &i)))
            return -1;
        if (t[k].ip && xmp_cli_int(a, v, t[k].lo, t[k].hi, t[k].ip) != 0)
            return -1;
        if (t[k].fp && xmp_cli_float(a, v, t[k].flo, t[k].fhi, t[k].fp) != 0)
            return -1;
        if (t[k].sp)
            *t[k].sp = v;
    }
    if (o->cluster) /* every plan's cluster model reads it */
        setenv("XMESH_CLUSTER_FILE", o->cluster, 1);
    if (o->check_serial && o->comm == XMP_COMM_SIGNAL)
        return xmp_cli_error("--check-serial with --comm signal: signal mode moves no data, so "
                             "its losses cannot match the serial reference");
    if (o->stages == 0 && !o->layout)
        o->stages = 1;
    if (o->batch % o->microbatches != 0)
        return xmp_cli_error("--batch %d is not a multiple of --microbatches %d", o->batch,
                             o->microbatches);
    return 0;
}

/* ---- step records: JSON, progress bar, summary (rank 0 only in the pipeline) ---- */

typedef struct {
    const ut_opts_t *o;
    xmp_json_t json;
    xmp_progress_t bar;
    double first, last, t0, *ips;
    int n;
} ut_log_t;

static int ut_log_open(ut_log_t *s, const ut_opts_t *o, const xmp_ut_config_t *c, size_t nparams,
                       const char *mode, const xmp_stage_layout_t *lay)
{
    memset(s, 0, sizeof *s);
    s->o = o;
    if (!(s->ips = calloc((size_t)o->steps, sizeof(double))))
        return xmp_cli_error("out of memory");
    if (o->json) {
        if (xmp_json_open(&s->json, o->json) != 0)
            return -1;
        xmp_json_t *j = &s->json;
        xmp_json_obj_begin(j, NULL);
        xmp_json_str(j, "command", "utransformer");
        xmp_json_str(j, "mode", mode);
        xmp_json_obj_begin(j, "model");
        xmp_json_int(j, "base_channels", c->base);
        xmp_json_int(j, "groups", c->groups);
        xmp_json_int(j, "head_dim", c->head_dim);
        xmp_json_int(j, "cond_tokens", XMP_UT_TOKENS);
        xmp_json_int(j, "cond_dim", c->cond_dim);
        xmp_json_int(j, "layers", XMP_UT_LAYERS);
        xmp_json_int(j, "num_parameters", (long long)nparams);
        xmp_json_int(j, "seed", (long long)o->seed);
        xmp_json_obj_end(j);
        xmp_json_obj_begin(j, "train");
        xmp_json_str(j, "data", "synthetic shapes 32x32, denoise + mask");
        xmp_json_f32(j, "noise", o->sigma);
        xmp_json_int(j, "batch", o->batch);
        xmp_json_int(j, "steps", o->steps);
        xmp_json_f32(j, "lr", o->lr);
        xmp_json_f32(j, "momentum", o->momentum);
        xmp_json_f32(j, "weight_decay", o->wd);
        xmp_json_obj_end(j);
        if (lay) {
            char buf[512];
            xmp_stage_layout_format(lay, buf, sizeof buf);
            xmp_json_obj_begin(j, "pipeline");
            xmp_json_int(j, "stages", lay->nstages);
            xmp_json_str(j, "layout", buf);
            xmp_json_int(j, "microbatches", o->microbatches);
            xmp_json_str(j, "schedule", xmp_sched_kind_name(o->schedule));
            xmp_json_bool(j, "delay_wgrad", o->delay_wgrad);
            xmp_json_str(j, "comm", xmp_comm_mode_name(o->comm));
            xmp_json_arr_begin(j, "stage_meshes");
            for (int si = 0; si < lay->nstages; si++) {
                snprintf(buf, sizeof buf, "%dx%d@%d", lay->dp[si], lay->tp[si], lay->rank0[si]);
                xmp_json_str(j, NULL, buf);
            }
            xmp_json_arr_end(j);
            xmp_json_obj_end(j);
        }
        xmp_json_arr_begin(j, "steps");
    }
    xmp_progress_init(&s->bar, o->steps, o->no_progress);
    s->t0 = xmp_now();
    return 0;
}

/* Pipeline figures of a step (NULL for serial runs); the same JSON fields as gpt's. */
typedef struct {
    double compute_s, boxing_s; /* rank 0: in stage callbacks (minus boxing); in boxing */
    double predicted_s;         /* simulator from the previous step's stage costs (0: none) */
    int nstages;
    double bubble[XMP_MAX_STAGES]; /* per stage: max over its ranks of the idle fraction */
    int peak_mb[XMP_MAX_STAGES];
    int64_t peak_bytes[XMP_MAX_STAGES];
} ut_extra_t;

static void ut_log_record_ex(ut_log_t *s, int step, double loss, double seconds,
                             const ut_extra_t *ex);
static void ut_log_record(ut_log_t *s, int step, double loss, double seconds)
{
    ut_log_record_ex(s, step, loss, seconds, NULL);
}

static void ut_log_record_ex(ut_log_t *s, int step, double loss, double seconds,
                             const ut_extra_t *ex)
{
    double ips = seconds > 0 ? s->o->batch / seconds : 0.0;
    if (s->n == 0)
        s->first = loss;
    s->last = loss;
    s->ips[s->n++] = ips;
    if (s->o->json) {
        xmp_json_obj_begin(&s->json, NULL);
        xmp_json_int(&s->json, "step", step);
        xmp_json_num(&s->json, "loss", loss);
        xmp_json_num(&s->json, "step_seconds", seconds);
        xmp_json_num(&s->json, "images_per_s", ips);
        if (ex) {
            xmp_step_pipe_t sp = {ex->compute_s, ex->boxing_s, ex->predicted_s, ex->nstages,
                                  ex->bubble,    ex->peak_mb,  ex->peak_bytes};
            xmp_json_step_pipeline(&s->json, &sp);
        }
        xmp_json_obj_end(&s->json);
    }
    xmp_progress_update(&s->bar, step + 1, loss, ips);
}

static int ut_log_close(ut_log_t *s, int ok, const char *mode)
{
    double total = xmp_now() - s->t0, med = 0, mn = 0, mx = 0;
    int rc = 0;
    xmp_progress_finish(&s->bar);
    if (s->n)
        xmp_stats(s->ips, (size_t)s->n, &med, &mn, &mx);
    if (s->o->json) {
        xmp_json_arr_end(&s->json);
        xmp_json_obj_begin(&s->json, "summary");
        xmp_json_bool(&s->json, "completed", ok);
        xmp_json_int(&s->json, "steps_done", s->n);
        xmp_json_num(&s->json, "first_loss", s->n ? s->first : NAN);
        xmp_json_num(&s->json, "final_loss", s->n ? s->last : NAN);
        xmp_json_num(&s->json, "total_seconds", total);
        xmp_json_num(&s->json, "images_per_s_median", med);
        xmp_json_obj_end(&s->json);
        xmp_json_obj_end(&s->json);
        rc = xmp_json_close(&s->json);
    }
    if (s->n)
        printf("utransformer %s: %d steps B=%d C=%d, loss %.5f -> %.5f, %.1f images/s median, "
               "%.2f s\n",
               mode, s->n, s->o->batch, s->o->base, s->first, s->last, med, total);
    free(s->ips);
    return rc;
}

/* ---- serial reference ---- */

/* Runs `steps` serial steps; losses[] (may be NULL) receives each loss; log may be NULL. */
static int serial_losses(const ut_opts_t *o, const xmp_ut_config_t *c, double *losses,
                         ut_log_t *log, int open_log)
{
    xmp_ut_model_t m;
    xmp_shapes_t sh;
    int ok = 0;
    if (xmp_ut_model_init(&m, c, o->batch, o->seed) != 0)
        return xmp_cli_error("model: %s", xmp_ut_last_error());
    if (xmp_shapes_init(&sh, o->seed, c->cond_dim, o->sigma) != 0) {
        xmp_ut_model_free(&m);
        return xmp_cli_error("data: %s", xmp_ut_last_error());
    }
    size_t HW = XMP_UT_IMG * XMP_UT_IMG, B = (size_t)o->batch;
    float *in = malloc((B * 7 * HW + B * XMP_UT_TOKENS * (size_t)c->cond_dim) * sizeof(float));
    if (!in)
        goto out;
    float *tg = in + B * 3 * HW, *cond = tg + B * 4 * HW;
    if (open_log && ut_log_open(log, o, c, m.layout.total, "serial", NULL) != 0)
        goto out_in;
    for (int step = 0; step < o->steps; step++) {
        double t0 = xmp_now();
        xmp_shapes_batch(&sh, step, o->batch, 0, o->batch, in, tg, cond);
        if (xmp_ut_model_forward(&m, in, cond, tg) != 0 || xmp_ut_model_backward(&m, tg) != 0 ||
            xmp_ut_model_update(&m, o->lr, o->momentum, o->wd) != 0) {
            xmp_cli_error("step %d: %s", step, xmp_ut_last_error());
            break;
        }
        if (losses)
            losses[step] = m.loss;
        if (log)
            ut_log_record(log, step, m.loss, xmp_now() - t0);
        if (!isfinite(m.loss)) {
            xmp_cli_error("loss is %g at step %d", m.loss, step);
            break;
        }
        ok = step == o->steps - 1;
    }
    if (open_log && ut_log_close(log, ok, "serial") != 0)
        ok = 0;
out_in:
    free(in);
out:
    xmp_shapes_free(&sh);
    xmp_ut_model_free(&m);
    return ok ? 0 : -1;
}

/* ---- pipeline stage ---- */

enum { T_MAIN = 0, T_SKIP = 1 };

typedef struct {
    int layer, what;               /* tensor: main output or skip output of layer */
    int pos_src, pos_dst;          /* index among the producer's out-edges / consumer's in-edges */
    size_t floats_src, floats_dst; /* local floats on the producer / consumer rank */
} ut_edge_t;

typedef struct {
    const ut_opts_t *o;
    xmp_ut_config_t cfg;
    xmp_ut_params_t lay;
    const xmp_stage_layout_t *sl;
    int stage, first, last, dpi, dp, tp, tpi, nloc, mbs, M;
    long step;
    xmp_mesh_t *mesh;                  /* this stage's dp x tp mesh (NULL: no stage) */
    xmp_ut_strategy_t strat;           /* per-class SBPs of this stage's mesh */
    xmp_sbp_t edge[XMP_MAX_MESH_DIMS]; /* "S(0),B": the SBP of every stage-graph edge */
    xmp_ut_slayer_t *SL[XMP_UT_LAYERS];
    xmp_shapes_t sh;
    int nedges;
    ut_edge_t e[2 * XMP_UT_LAYERS];
    /* per layer l and micro-batch m (index l*M + m): the tape of its forward (allocated when
     * the micro-batch's forward runs, freed after its weight gradients), the outputs inside it,
     * and the gradients passed between layers of the stage */
    xmp_ut_tape_t **tape;
    const xmp_tensor_t **y, **so;
    xmp_tensor_t *dact, *dskip;
    float **input, **cond, **target; /* per micro-batch, allocated with its forward */
    int *live;                       /* per micro-batch: forward done, weight part not yet */
    int64_t base_bytes;              /* allocations held after set-up (the parameters) */
    int mem_quiet; /* virtual stages: chunk > 0 reports 0 (chunk 0 reports the rank's peak) */
} ut_stage_t;

static size_t chw_floats(const int chw[3])
{
    return (size_t)chw[0] * chw[1] * chw[2];
}

/* Stage graph edges in producer-layer order: main before skip for the same layer. */
static int build_edges(const xmp_ut_config_t *c, const xmp_stage_layout_t *sl, int mbs,
                       ut_edge_t *e, xmp_edge_cfg_t *ec, xmp_sedge_t *se)
{
    int n = 0, nout[XMP_MAX_STAGES] = {0}, nin[XMP_MAX_STAGES] = {0};
    for (int l = 0; l < XMP_UT_LAYERS; l++)
        for (int what = T_MAIN; what <= T_SKIP; what++) {
            int dst = what == T_MAIN ? (l + 1 < XMP_UT_LAYERS ? l + 1 : -1) : xmp_ut_skip_dest(l);
            if (dst < 0 || sl->stage_of[dst] == sl->stage_of[l])
                continue;
            int s = sl->stage_of[l], d = sl->stage_of[dst], chw[3];
            if (what == T_MAIN)
                xmp_ut_layer_out_shape(c, l, chw);
            else
                xmp_ut_layer_skip_shape(c, l, chw);
            e[n].layer = l;
            e[n].what = what;
            e[n].floats_src = chw_floats(chw) * (size_t)(mbs / sl->dp[s]);
            e[n].floats_dst = chw_floats(chw) * (size_t)(mbs / sl->dp[d]);
            memset(&ec[n], 0, sizeof ec[n]);
            ec[n].src = s;
            ec[n].dst = d;
            ec[n].ndim = 4;
            ec[n].shape[0] = mbs;
            for (int k = 0; k < 3; k++)
                ec[n].shape[k + 1] = chw[k];
            ec[n].dtype = XMESH_F32;
            ec[n].src_spec = ec[n].dst_spec = "S(0),B";
            se[n].src = s;
            se[n].dst = d;
            n++;
        }
    /* positions: edges are numbered in increasing id per stage */
    for (int k = 0; k < n; k++) {
        e[k].pos_src = nout[se[k].src]++;
        e[k].pos_dst = nin[se[k].dst]++;
    }
    return n;
}

#define IX(st, l, m) ((size_t)(l) * (size_t)(st)->M + (size_t)(m))

/* A tensor of global shape (mbs, chw...) with SBP "S(0),B" holding n local floats of src. */
static int wrap(ut_stage_t *st, int ndim, const int64_t *shape, const float *src, size_t n,
                xmp_tensor_t *t)
{
    if (xmp_tensor_alloc(t, st->mesh, ndim, shape, XMESH_F32, st->edge) != XMESH_SUCCESS)
        return -1;
    if ((size_t)t->lcount != n) {
        xmp_err(XMESH_ERR_INTERNAL, "edge block of %lld floats, buffer %zu", (long long)t->lcount,
                n);
        xmp_tensor_free(t);
        return -1;
    }
    memcpy(t->data, src, n * sizeof(float));
    return 0;
}
static int wrap_chw(ut_stage_t *st, const int chw[3], const float *src, xmp_tensor_t *t)
{
    int64_t s[4] = {st->mbs, chw[0], chw[1], chw[2]};
    return wrap(st, 4, s, src, (size_t)st->nloc * chw_floats(chw), t);
}
/* Copies t, boxed to the edge SBP, into dst (n floats). */
static int copy_out(ut_stage_t *st, const xmp_tensor_t *t, float *dst, size_t n)
{
    xmp_tensor_t b;
    if (xmp_box(t, st->edge, &b) != XMESH_SUCCESS)
        return -1;
    int rc = (size_t)b.lcount == n ? 0 : -1;
    if (rc)
        xmp_err(XMESH_ERR_INTERNAL, "edge block of %lld floats, buffer %zu", (long long)b.lcount,
                n);
    else
        memcpy(dst, b.data, n * sizeof(float));
    xmp_tensor_free(&b);
    return rc;
}

/* Floats of a micro-batch's input, target and conditioning data on this rank. */
static void mb_floats(const ut_stage_t *st, size_t f[3])
{
    const size_t HW = XMP_UT_IMG * XMP_UT_IMG, nl = (size_t)st->nloc;
    f[0] = nl * 3 * HW;
    f[1] = nl * 4 * HW;
    f[2] = nl * XMP_UT_TOKENS * (size_t)st->cfg.cond_dim;
}

static void mb_free_data(ut_stage_t *st, int mb)
{
    size_t f[3];
    mb_floats(st, f);
    xmp_ut_mem_track(-(int64_t)sizeof(float) *
                     (int64_t)((st->input[mb] ? f[0] : 0) + (st->target[mb] ? f[1] : 0) +
                               (st->cond[mb] ? f[2] : 0)));
    free(st->input[mb]);
    free(st->cond[mb]);
    free(st->target[mb]);
    st->input[mb] = st->cond[mb] = st->target[mb] = NULL;
}

static int ut_fwd(void *u, int mb, const void *const *in, void *const *out, double *loss)
{
    ut_stage_t *st = u;
    const int first_img = mb * st->mbs + st->dpi * st->nloc;
    const size_t HW = XMP_UT_IMG * XMP_UT_IMG, nl = (size_t)st->nloc;
    const size_t ncond = nl * XMP_UT_TOKENS * (size_t)st->cfg.cond_dim;
    int need_cond = 0, rc = 1;
    for (int l = st->first; l <= st->last; l++)
        need_cond |= xmp_ut_layer_uses_cond(&st->cfg, l);
    /* this micro-batch's data, allocated now and freed after its weight gradients */
    mb_free_data(st, mb);
    size_t fl[3];
    mb_floats(st, fl);
    if (st->first == 0)
        st->input[mb] = malloc(fl[0] * sizeof(float));
    if (st->last == XMP_UT_CONV_OUT)
        st->target[mb] = malloc(fl[1] * sizeof(float));
    if (need_cond)
        st->cond[mb] = malloc(fl[2] * sizeof(float));
    /* counted like the tapes (freed, and uncounted, by mb_free_data) */
    xmp_ut_mem_track((int64_t)sizeof(float) *
                     (int64_t)((st->input[mb] ? fl[0] : 0) + (st->target[mb] ? fl[1] : 0) +
                               (st->cond[mb] ? fl[2] : 0)));
    if ((st->first == 0 && !st->input[mb]) || (st->last == XMP_UT_CONV_OUT && !st->target[mb]) ||
        (need_cond && !st->cond[mb])) {
        fprintf(stderr, "stage %d forward mb %d: out of memory\n", st->stage, mb);
        return 1;
    }
    xmp_shapes_batch(&st->sh, st->step, st->o->batch, first_img, st->nloc, st->input[mb],
                     st->target[mb], st->cond[mb]);
    xmp_tensor_t x, cond, skin;
    memset(&x, 0, sizeof x);
    memset(&cond, 0, sizeof cond);
    int64_t cs[3] = {st->mbs, XMP_UT_TOKENS, st->cfg.cond_dim};
    int chw[3];
    xmp_ut_layer_in_shape(&st->cfg, st->first, chw);
    const float *src = st->input[mb];
    for (int k = 0; k < st->nedges; k++)
        if (st->sl->stage_of[st->e[k].layer] != st->stage && st->e[k].what == T_MAIN &&
            st->e[k].layer == st->first - 1)
            src = in[st->e[k].pos_dst];
    if (wrap_chw(st, chw, src, &x) != 0 ||
        (need_cond && wrap(st, 3, cs, st->cond[mb], ncond, &cond) != 0)) {
        fprintf(stderr, "stage %d forward mb %d: %s\n", st->stage, mb, xmp_last_error());
        goto out;
    }
    const xmp_tensor_t *cur = &x;
    for (int l = st->first; l <= st->last; l++) {
        const xmp_tensor_t *sk = NULL;
        int srcl = xmp_ut_skip_source(l);
        memset(&skin, 0, sizeof skin);
        if (srcl >= 0 && st->sl->stage_of[srcl] == st->stage)
            sk = st->so[IX(st, srcl, mb)];
        else if (srcl >= 0)
            for (int k = 0; k < st->nedges; k++)
                if (st->e[k].what == T_SKIP && st->e[k].layer == srcl) {
                    int sc[3];
                    xmp_ut_layer_skip_shape(&st->cfg, srcl, sc);
                    if (wrap_chw(st, sc, in[st->e[k].pos_dst], &skin) != 0) {
                        fprintf(stderr, "stage %d skip mb %d: %s\n", st->stage, mb,
                                xmp_last_error());
                        goto out;
                    }
                    sk = &skin;
                }
        int r = xmp_ut_slayer_forward(st->SL[l], cur, sk, need_cond ? &cond : NULL,
                                      &st->tape[IX(st, l, mb)], &st->y[IX(st, l, mb)],
                                      &st->so[IX(st, l, mb)]);
        xmp_tensor_free(&skin);
        if (r == 0) /* recomputation: keep the layer's inputs and outputs only */
            r = xmp_ut_tape_drop(st->tape[IX(st, l, mb)], st->o->recompute);
        if (r != 0) {
            fprintf(stderr, "stage %d forward mb %d: %s\n", st->stage, mb, xmp_ut_last_error());
            goto out;
        }
        cur = st->y[IX(st, l, mb)];
        xmp_driver_progress(NULL);
    }
    st->live[mb] = 1;
    for (int k = 0; k < st->nedges; k++) {
        const ut_edge_t *e = &st->e[k];
        if (st->sl->stage_of[e->layer] != st->stage)
            continue;
        const xmp_tensor_t *v =
            e->what == T_MAIN ? st->y[IX(st, e->layer, mb)] : st->so[IX(st, e->layer, mb)];
        if (copy_out(st, v, out[e->pos_src], e->floats_src) != 0) {
            fprintf(stderr, "stage %d edge %d mb %d: %s\n", st->stage, k, mb, xmp_last_error());
            goto out;
        }
    }
    if (st->last == XMP_UT_CONV_OUT && st->tpi == 0) { /* tp ranks hold the same loss */
        double l = 0;
        size_t cnt = nl * XMP_UT_OUT_CH * HW;
        float *yb = malloc(cnt * sizeof(float));
        if (!yb || copy_out(st, st->y[IX(st, st->last, mb)], yb, cnt) != 0) {
            free(yb);
            fprintf(stderr, "stage %d loss mb %d: output block\n", st->stage, mb);
            goto out;
        }
        xmp_unet_mse_forward(cnt, (double)st->o->batch * XMP_UT_OUT_CH * HW, yb, st->target[mb],
                             &l);
        free(yb);
        *loss += l;
    }
    rc = 0;
out:
    xmp_tensor_free(&x);
    xmp_tensor_free(&cond);
    return rc;
}

static int ut_bwd_input(void *u, int mb, const void *const *gout, void *const *gin)
{
    ut_stage_t *st = u;
    const size_t HW = XMP_UT_IMG * XMP_UT_IMG;
    for (int k = 0; k < st->nedges; k++) { /* my in-edges' gradients, written below */
        const ut_edge_t *e = &st->e[k];
        int dst = e->what == T_MAIN ? e->layer + 1 : xmp_ut_skip_dest(e->layer);
        if (st->sl->stage_of[e->layer] != st->stage && st->sl->stage_of[dst] == st->stage)
            memset(gin[e->pos_dst], 0, e->floats_dst * sizeof(float));
    }
    for (int l = st->last; l >= st->first; l--) {
        xmp_tensor_t dy, dso, dx, dsi;
        memset(&dy, 0, sizeof dy);
        memset(&dso, 0, sizeof dso);
        memset(&dx, 0, sizeof dx);
        memset(&dsi, 0, sizeof dsi);
        int chw[3], rc = -1;
        xmp_ut_layer_out_shape(&st->cfg, l, chw);
        const xmp_tensor_t *pdy = &st->dact[IX(st, l, mb)], *pdso = NULL;
        if (l == st->last && l == XMP_UT_CONV_OUT) {
            size_t cnt = (size_t)st->nloc * XMP_UT_OUT_CH * HW;
            float *yb = malloc(cnt * sizeof(float)), *g = calloc(cnt, sizeof(float));
            if (yb && g && copy_out(st, st->y[IX(st, l, mb)], yb, cnt) == 0) {
                xmp_unet_mse_backward(cnt, (double)st->o->batch * XMP_UT_OUT_CH * HW, yb,
                                      st->target[mb], g);
                rc = wrap_chw(st, chw, g, &dy);
            }
            free(yb);
            free(g);
            if (rc)
                goto fail;
            pdy = &dy;
        }
        int src = xmp_ut_skip_source(l), dst = xmp_ut_skip_dest(l);
        if (dst >= 0 && st->sl->stage_of[dst] == st->stage && st->dskip[IX(st, l, mb)].mesh)
            pdso = &st->dskip[IX(st, l, mb)];
        for (int k = 0; k < st->nedges; k++) {
            const ut_edge_t *e = &st->e[k];
            if (e->layer != l || st->sl->stage_of[l] != st->stage)
                continue;
            int sc[3];
            if (e->what == T_MAIN) {
                if (wrap_chw(st, chw, gout[e->pos_src], &dy) != 0)
                    goto fail;
                pdy = &dy;
            } else {
                xmp_ut_layer_skip_shape(&st->cfg, l, sc);
                if (wrap_chw(st, sc, gout[e->pos_src], &dso) != 0)
                    goto fail;
                pdso = &dso;
            }
        }
        if (!pdy->mesh) {
            xmp_err(XMESH_ERR_INTERNAL, "layer %d: no output gradient", l);
            goto fail;
        }
        int same_src = src >= 0 && st->sl->stage_of[src] == st->stage;
        xmp_tensor_t *pdx = l > 0 ? (l > st->first ? &st->dact[IX(st, l - 1, mb)] : &dx) : NULL;
        xmp_tensor_t *pdsi = src >= 0 ? (same_src ? &st->dskip[IX(st, src, mb)] : &dsi) : NULL;
        if (xmp_ut_tape_recompute(st->tape[IX(st, l, mb)], st->o->recompute) != 0 ||
            xmp_ut_slayer_backward_input(st->SL[l], st->tape[IX(st, l, mb)], pdy, pdso, pdx,
                                         pdsi) != 0) {
            fprintf(stderr, "stage %d backward mb %d: %s\n", st->stage, mb, xmp_ut_last_error());
            goto fail_quiet;
        }
        for (int k = 0; k < st->nedges; k++) { /* gradients leaving the stage */
            const ut_edge_t *e = &st->e[k];
            if (st->sl->stage_of[e->layer] == st->stage)
                continue;
            if (l == st->first && e->what == T_MAIN && e->layer == l - 1 &&
                copy_out(st, &dx, gin[e->pos_dst], e->floats_dst) != 0)
                goto fail;
            if (src >= 0 && !same_src && e->what == T_SKIP && e->layer == src &&
                copy_out(st, &dsi, gin[e->pos_dst], e->floats_dst) != 0)
                goto fail;
        }
        xmp_tensor_free(&dy);
        xmp_tensor_free(&dso);
        xmp_tensor_free(&dx);
        xmp_tensor_free(&dsi);
        xmp_tensor_free(&st->dact[IX(st, l, mb)]);
        xmp_tensor_free(&st->dskip[IX(st, l, mb)]);
        memset(&st->dact[IX(st, l, mb)], 0, sizeof(xmp_tensor_t));
        memset(&st->dskip[IX(st, l, mb)], 0, sizeof(xmp_tensor_t));
        xmp_driver_progress(NULL);
        continue;
    fail:
        fprintf(stderr, "stage %d backward mb %d layer %d: %s\n", st->stage, mb, l,
                xmp_last_error());
    fail_quiet:
        xmp_tensor_free(&dy);
        xmp_tensor_free(&dso);
        xmp_tensor_free(&dx);
        xmp_tensor_free(&dsi);
        return 1;
    }
    return 0;
}

static int ut_bwd_weight(void *u, int mb)
{
    ut_stage_t *st = u;
    for (int l = st->last; l >= st->first; l--) {
        xmp_ut_tape_t *t = st->tape[IX(st, l, mb)];
        st->tape[IX(st, l, mb)] = NULL; /* freed by backward_weight */
        st->y[IX(st, l, mb)] = st->so[IX(st, l, mb)] = NULL;
        if (xmp_ut_slayer_backward_weight(st->SL[l], t) != 0) {
            fprintf(stderr, "stage %d weight mb %d: %s\n", st->stage, mb, xmp_ut_last_error());
            return 1;
        }
    }
    mb_free_data(st, mb);
    st->live[mb] = 0;
    return 0;
}

/* Measured (nn/sbp.h allocation accounting): the peak of this rank's allocations since the last
 * query above those held after set-up (the parameters): the micro-batches' tapes (values,
 * caches, gradients), their data, the op temporaries and the gradient accumulators. The driver
 * queries after every compute action, so its maximum is the step's measured peak. */
static int64_t ut_act_bytes(void *u)
{
    ut_stage_t *st = u;
    if (st->mem_quiet)
        return 0;
    int64_t p = xmp_ut_mem_peak_bytes() - st->base_bytes;
    xmp_ut_mem_peak_reset();
    return p > 0 ? p : 0;
}

/* R: the parameter gradients are boxed to their parameters' SBP (P over dp -> B). */
static int ut_reduce(void *u)
{
    ut_stage_t *st = u;
    for (int l = st->first; l <= st->last; l++)
        if (xmp_ut_slayer_reduce(st->SL[l]) != 0) {
            fprintf(stderr, "stage %d: gradient reduction: %s\n", st->stage, xmp_ut_last_error());
            return 1;
        }
    return 0;
}

static int ut_opt(void *u)
{
    ut_stage_t *st = u;
    for (int l = st->first; l <= st->last; l++)
        if (xmp_ut_slayer_update(st->SL[l], st->o->lr, st->o->momentum, st->o->wd) != 0) {
            fprintf(stderr, "stage %d: optimizer: %s\n", st->stage, xmp_ut_last_error());
            return 1;
        }
    return 0;
}

static void stage_free(ut_stage_t *st)
{
    size_t NL = (size_t)XMP_UT_LAYERS * (size_t)st->M;
    for (size_t i = 0; st->tape && i < NL; i++) {
        xmp_ut_tape_free(st->tape[i]);
        xmp_tensor_free(&st->dact[i]);
        xmp_tensor_free(&st->dskip[i]);
    }
    for (int m = 0; st->input && m < st->M; m++)
        mb_free_data(st, m);
    for (int l = 0; l < XMP_UT_LAYERS; l++)
        xmp_ut_slayer_destroy(st->SL[l]);
    free(st->tape);
    free(st->y);
    free(st->so);
    free(st->dact);
    free(st->dskip);
    free(st->input);
    free(st->cond);
    free(st->target);
    free(st->live);
    xmp_shapes_free(&st->sh);
}

static int stage_init(ut_stage_t *st)
{
    const size_t NL = (size_t)XMP_UT_LAYERS * (size_t)st->M, M = (size_t)st->M;
    st->tape = calloc(NL, sizeof *st->tape);
    st->y = calloc(NL, sizeof *st->y);
    st->so = calloc(NL, sizeof *st->so);
    st->dact = calloc(NL, sizeof *st->dact);
    st->dskip = calloc(NL, sizeof *st->dskip);
    st->input = calloc(M, sizeof(float *));
    st->cond = calloc(M, sizeof(float *));
    st->target = calloc(M, sizeof(float *));
    st->live = calloc(M, sizeof(int));
    if (!st->tape || !st->y || !st->so || !st->dact || !st->dskip || !st->input || !st->cond ||
        !st->target || !st->live)
        return xmp_cli_error("out of memory");
    st->edge[0] = xmp_sbp_s(0);
    for (int a = 1; a < XMP_MAX_MESH_DIMS; a++)
        st->edge[a] = xmp_sbp_b();
    /* parameters: this rank's blocks (the strategy's SBPs) of the full tensors from the seed */
    float *full = malloc(st->lay.total * sizeof(float));
    if (!full)
        return xmp_cli_error("out of memory");
    xmp_ut_params_init(&st->lay, st->o->seed, full);
    int rc = 0;
    for (int l = st->first; l <= st->last && !rc; l++)
        if (!(st->SL[l] = xmp_ut_slayer_create(&st->cfg, l, st->mbs, st->mesh, &st->strat,
                                               full + st->lay.layer_offset[l])))
            rc = xmp_cli_error("stage %d layer %s: %s", st->stage, xmp_ut_layer_name(l),
                               xmp_ut_last_error());
    free(full);
    st->base_bytes = xmp_ut_mem_live_bytes();
    return rc;
}

/* Times the stage callbacks (per-microbatch F/I/W costs for the simulator). */
typedef struct {
    xmp_stage_ops_t in;
    double f, i, w, r, o;
    int nf, ni, nw;
} timed_ops_t;

static int t_fwd(void *u, int mb, const void *const *in, void *const *out, double *loss)
{
    timed_ops_t *t = u;
    double t0 = MPI_Wtime();
    int rc = t->in.forward(t->in.user, mb, in, out, loss);
    t->f += MPI_Wtime() - t0;
    t->nf++;
    return rc;
}
static int t_bin(void *u, int mb, const void *const *go, void *const *gi)
{
    timed_ops_t *t = u;
    double t0 = MPI_Wtime();
    int rc = t->in.backward_input(t->in.user, mb, go, gi);
    t->i += MPI_Wtime() - t0;
    t->ni++;
    return rc;
}
static int t_bw(void *u, int mb)
{
    timed_ops_t *t = u;
    double t0 = MPI_Wtime();
    int rc = t->in.backward_weight(t->in.user, mb);
    t->w += MPI_Wtime() - t0;
    t->nw++;
    return rc;
}
static int t_red(void *u)
{
    timed_ops_t *t = u;
    double t0 = MPI_Wtime();
    int rc = t->in.reduce_grads(t->in.user);
    t->r += MPI_Wtime() - t0;
    return rc;
}
static int t_opt(void *u)
{
    timed_ops_t *t = u;
    double t0 = MPI_Wtime();
    int rc = t->in.optimizer_step(t->in.user);
    t->o += MPI_Wtime() - t0;
    return rc;
}
static int64_t t_act(void *u)
{
    timed_ops_t *t = u;
    return t->in.activation_bytes(t->in.user);
}

/* The strategy of stage s (built-in name or file) for its dp x tp mesh, parsed and checked
 * against the stage's layers; stored in *out when out != NULL. 0 or -1 (xmp_ut_last_error). */
static int stage_strategy(const ut_opts_t *o, const xmp_ut_config_t *c,
                          const xmp_stage_layout_t *sl, int s, xmp_ut_strategy_t *out)
{
    int shape[2] = {sl->dp[s], sl->tp[s]};
    xmp_ut_strategy_t st;
    int rc = xmp_ut_strategy_load(o->strategy, c, 2, shape, &st);
    if (rc == 0)
        rc = xmp_ut_strategy_check(&st, c, sl->first[s], sl->first[s] + sl->count[s] - 1, shape);
    if (rc == 0 && out)
        *out = st;
    return rc;
}

static int run_pipeline(const ut_opts_t *o, const xmp_ut_config_t *c)
{
    int rank, size, prov, ok = 0, rc = 1;
    char err[512];
    MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &prov);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (rank != 0)
        ((ut_opts_t *)o)->no_progress = 1;
    xmp_stage_layout_t sl;
    char kinds[XMP_UT_LAYERS + 1];
    memset(kinds, 'u', XMP_UT_LAYERS);
    kinds[XMP_UT_LAYERS] = '\0';
    ut_stage_t st, *xs = NULL;
    timed_ops_t *xt = NULL;
    int nxs = 0;
    memset(&st, 0, sizeof st);
    xmp_mesh_t *smesh[XMP_MAX_STAGES] = {NULL};
    int *allranks = NULL, *mranks = NULL; /* sized from the run: the job's ranks */
    xmp_schedule_t *sched = NULL;
    xmesh_ctx_t ctx = NULL;
    xmp_driver_t *drv = NULL;
    double *ref = NULL;
    const int M = o->microbatches, mbs = o->batch / M;
    const int virt = o->virtual_stages > 1 || o->stage_groups;
    int R = o->stages;
    if (virt && o->stage_mesh && !o->layout && R == 1) { /* one group per --stage-mesh entry */
        R = 1;
        for (const char *p = o->stage_mesh; *p; p++)
            R += *p == ',';
    }
    const char *mt = o->stage_groups ? o->stage_groups
                     : (o->schedule == XMP_SCHED_ZB_V || o->schedule == XMP_SCHED_V_1F1B ||
                        o->schedule == XMP_SCHED_DUALPIPE_V)
                         ? "v"
                         : "interleaved";
    if (virt ? xmp_stage_layout_build_groups(
                   kinds, 0, 0, o->layout, R, o->virtual_stages ? o->virtual_stages : 1, mt,
                   o->stage_mesh, o->stage_dp, o->stage_tp, &sl, err, sizeof err) != 0
             : xmp_stage_layout_build(kinds, 0, 0, o->layout, o->stages, o->stage_mesh, o->stage_dp,
                                      o->stage_tp, &sl, err, sizeof err) != 0) {
        if (rank == 0)
            xmp_cli_error("stage layout: %s", err);
        goto out_mpi;
    }
    if (sl.nranks > size) {
        if (rank == 0)
            xmp_cli_error("the stage meshes need %d ranks, the job has %d", sl.nranks, size);
        goto out_mpi;
    }
    for (int s = 0; s < sl.nstages; s++) {
        /* every stage's strategy, refused here (on every rank alike) before anything runs */
        if (stage_strategy(o, c, &sl, s,
                           s == xmp_stage_layout_stage_of_rank(&sl, rank) ? &st.strat : NULL) !=
            0) {
            if (rank == 0)
                xmp_cli_error("stage %d: %s", s, xmp_ut_last_error());
            goto out_mpi;
        }
        if (mbs % sl.dp[s] != 0) {
            if (rank == 0)
                xmp_cli_error("stage %d: micro-batch %d (--batch %d / --microbatches %d) is not a "
                              "multiple of its data-parallel degree %d",
                              s, mbs, o->batch, M, sl.dp[s]);
            goto out_mpi;
        }
    }
    st.o = o;
    st.cfg = *c;
    st.sl = &sl;
    st.M = M;
    st.mbs = mbs;
    xmp_ut_params_layout(c, &st.lay);
    xmp_edge_cfg_t ec[2 * XMP_UT_LAYERS];
    xmp_sedge_t se[2 * XMP_UT_LAYERS];
    st.nedges = build_edges(c, &sl, mbs, st.e, ec, se);
    xmp_gen_opts_t go;
    memset(&go, 0, sizeof go);
    go.delay_wgrad = o->delay_wgrad;
    go.recompute = o->recompute;
    /* ZB-H1's memory rule: deferred weight-gradient work of at most S microbatches. */
    go.max_pending_w = sl.nstages;
    if ((virt ? xmp_sched_generate_map(o->schedule, sl.nstages, sl.ngroups, sl.group, M, st.nedges,
                                       se, &go, &sched, err, sizeof err)
              : xmp_sched_generate(o->schedule, sl.nstages, M, st.nedges, se, &go, &sched, err,
                                   sizeof err)) != 0) {
        if (rank == 0)
            xmp_cli_error("--schedule %s: %s", xmp_sched_kind_name(o->schedule), err);
        goto out_mpi;
    }
    if (o->print_schedule && rank == 0) {
        for (int k = 0; k < st.nedges; k++)
            printf("# edge %d: %s %s (stage %d -> %d)\n", k, xmp_ut_layer_name(st.e[k].layer),
                   st.e[k].what == T_MAIN ? "main" : "skip", se[k].src, se[k].dst);
        xmp_sched_fprint(sched, stdout);
    }
    if (o->check_serial && rank == 0) {
        if (!(ref = calloc((size_t)o->steps, sizeof(double))) ||
            serial_losses(o, c, ref, NULL, 0) != 0) {
            xmp_cli_error("serial reference failed");
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    st.stage = xmp_stage_layout_stage_of_rank(&sl, rank);
    /* every stage's dp x tp SBP mesh (collective over the job) */
    int local_fail = 0;
    if (!(allranks = malloc((size_t)size * sizeof *allranks)) ||
        !(mranks = malloc((size_t)size * sizeof *mranks))) {
        xmp_cli_error("out of memory for %d ranks", size);
        local_fail = 1;
    }
    for (int k = 0; !local_fail && k < size; k++)
        allranks[k] = k;
    for (int s = 0; s < sl.nstages && !local_fail; s++) {
        int shape[2] = {sl.dp[s], sl.tp[s]};
        if (xmp_mesh_create(MPI_COMM_WORLD, NULL, 2, shape, allranks + sl.rank0[s], &smesh[s]) !=
            XMESH_SUCCESS) {
            xmp_cli_error("stage %d mesh: %s", s, xmp_last_error());
            local_fail = 1;
        }
    }
    /* Virtual stages: one stage state per model stage of this rank's group (chunk 0 in st,
     * the others in xs), each with its own timed callbacks. */
    int mystages[XMP_MAX_STAGES],
        nmine = xmp_stage_layout_stages_of_rank(&sl, rank, mystages, XMP_MAX_STAGES);
    nxs = nmine > 1 ? nmine - 1 : 0;
    if (nxs &&
        (!(xs = calloc((size_t)nxs, sizeof *xs)) || !(xt = calloc((size_t)nxs, sizeof *xt)))) {
        xmp_cli_error("out of memory");
        local_fail = 1;
        nxs = 0;
    }
    ut_stage_t tmpl = st;
    for (int k = 0; k < nmine && !local_fail; k++) {
        ut_stage_t *p = k ? &xs[k - 1] : &st;
        *p = tmpl;
        p->stage = mystages[k];
        p->mem_quiet = k > 0;
        if (stage_strategy(o, c, &sl, p->stage, &p->strat) != 0) {
            xmp_cli_error("stage %d: %s", p->stage, xmp_ut_last_error());
            local_fail = 1;
            break;
        }
        p->first = sl.first[p->stage];
        p->last = p->first + sl.count[p->stage] - 1;
        p->dp = sl.dp[p->stage];
        p->tp = sl.tp[p->stage];
        p->dpi = (rank - sl.rank0[p->stage]) / p->tp;
        p->tpi = (rank - sl.rank0[p->stage]) % p->tp;
        p->mesh = smesh[p->stage];
        p->nloc = mbs / p->dp;
        if (xmp_shapes_init(&p->sh, o->seed, c->cond_dim, o->sigma) != 0 || stage_init(p) != 0)
            local_fail = 1;
    }
    /* every chunk measures above the parameters of all of them */
    for (int k = 0; k < nxs; k++)
        xs[k].base_bytes = xmp_ut_mem_live_bytes();
    st.base_bytes = xmp_ut_mem_live_bytes();
    int any_fail = 0;
    MPI_Allreduce(&local_fail, &any_fail, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (any_fail)
        goto out_stage;
    if (xmesh_ctx_create_mpi(MPI_COMM_WORLD, NULL, &ctx) != XMESH_SUCCESS) {
        xmp_cli_error("xmesh_ctx_create_mpi failed: %s", xmesh_last_error());
        goto out_stage;
    }
    xmp_stage_mesh_t meshes[XMP_MAX_STAGES];
    for (int k = 0; k < size; k++) /* a stage's ranks are rank0[s] .. rank0[s] + dp*tp - 1 */
        mranks[k] = k;
    for (int s = 0; s < sl.nstages; s++) {
        meshes[s].ndim = 2;
        meshes[s].shape[0] = sl.dp[s];
        meshes[s].shape[1] = sl.tp[s];
        meshes[s].ranks = mranks + sl.rank0[s];
    }
    xmp_driver_cfg_t dc;
    memset(&dc, 0, sizeof dc);
    dc.comm = MPI_COMM_WORLD;
    dc.ctx = ctx;
    dc.nstages = sl.nstages;
    dc.meshes = meshes;
    dc.nedges = st.nedges;
    dc.edges = ec;
    dc.sched = sched;
    dc.mode = o->comm;
    dc.trace = o->trace != NULL;
    timed_ops_t tops;
    memset(&tops, 0, sizeof tops);
    tops.in.user = &st;
    tops.in.forward = ut_fwd;
    tops.in.backward_input = ut_bwd_input;
    tops.in.backward_weight = ut_bwd_weight;
    tops.in.reduce_grads = ut_reduce;
    tops.in.optimizer_step = ut_opt;
    tops.in.activation_bytes = ut_act_bytes;
    dc.ops.user = &tops;
    dc.ops.forward = t_fwd;
    dc.ops.backward_input = t_bin;
    dc.ops.backward_weight = t_bw;
    dc.ops.reduce_grads = t_red;
    dc.ops.optimizer_step = t_opt;
    dc.ops.activation_bytes = t_act;
    xmp_stage_ops_t sops[XMP_MAX_STAGES];
    memset(sops, 0, sizeof sops);
    if (virt && st.stage >= 0) {
        sops[st.stage] = dc.ops;
        for (int k = 0; k < nxs; k++) {
            xt[k] = tops;
            xt[k].in.user = &xs[k];
            sops[xs[k].stage] = dc.ops;
            sops[xs[k].stage].user = &xt[k];
        }
    }
    dc.stage_ops = virt ? sops : NULL;
    if (xmp_driver_create(&dc, &drv, err, sizeof err) != XMESH_SUCCESS) {
        if (rank == 0)
            xmp_cli_error("pipeline driver: %s", err);
        goto out_ctx;
    }
    ut_log_t log;
    int log_ok = rank != 0 || ut_log_open(&log, o, c, st.lay.total, "pipeline", &sl) == 0;
    int mismatch = 0, compared = 0, have_costs = 0;
    double cf[XMP_MAX_STAGES], ci[XMP_MAX_STAGES], cw[XMP_MAX_STAGES];
    for (int step = 0; step < o->steps && log_ok; step++) {
        xmp_step_stats_t ss;
        st.step = step;
        tops.f = tops.i = tops.w = tops.r = tops.o = 0;
        tops.nf = tops.ni = tops.nw = 0;
        for (int k = 0; k < nxs; k++) {
            xs[k].step = step;
            xt[k].f = xt[k].i = xt[k].w = xt[k].r = xt[k].o = 0;
            xt[k].nf = xt[k].ni = xt[k].nw = 0;
        }
        double comm0 = xmp_comm_seconds();
        xmesh_result_t r = xmp_driver_step(drv, &ss);
        int bad = r != XMESH_SUCCESS, anybad = 0;
        MPI_Allreduce(&bad, &anybad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        if (anybad) {
            if (bad)
                xmp_cli_error("step %d: %s", step, xmp_driver_error(drv));
            break;
        }
        double loss = 0;
        MPI_Allreduce(&ss.loss, &loss, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        /* Per stage, max over its ranks: costs per microbatch, bubble, peak. */
        const int S = sl.nstages;
        double loc[5 * XMP_MAX_STAGES], all[5 * XMP_MAX_STAGES];
        memset(loc, 0, sizeof loc);
        int64_t lp[XMP_MAX_STAGES], ap[XMP_MAX_STAGES];
        memset(lp, 0, sizeof lp);
        double cs = tops.f + tops.i + tops.w + tops.r + tops.o;
        for (int k = -1; k < nxs && st.stage >= 0; k++) {
            const ut_stage_t *p = k < 0 ? &st : &xs[k];
            const timed_ops_t *q = k < 0 ? &tops : &xt[k];
            loc[p->stage] = q->nf ? q->f / q->nf : 0;
            loc[S + p->stage] = q->ni ? q->i / q->ni : 0;
            loc[2 * S + p->stage] = q->nw ? q->w / q->nw : 0;
            loc[3 * S + p->stage] = ss.bubble; /* bubble and peaks: the group's */
            loc[4 * S + p->stage] = ss.peak_act_mb;
            lp[p->stage] = ss.peak_act_bytes;
            if (k >= 0)
                cs += q->f + q->i + q->w + q->r + q->o;
        }
        MPI_Allreduce(loc, all, 5 * S, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        MPI_Allreduce(lp, ap, S, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
        ut_extra_t ex;
        memset(&ex, 0, sizeof ex);
        ex.nstages = S;
        ex.boxing_s = xmp_comm_seconds() - comm0;
        ex.compute_s = cs - ex.boxing_s;
        for (int k = 0; k < S; k++) {
            ex.bubble[k] = all[3 * S + k];
            ex.peak_mb[k] = (int)all[4 * S + k];
            ex.peak_bytes[k] = ap[k];
        }
        if (have_costs) {
            xmp_sim_result_t res;
            memset(&res, 0, sizeof res);
            if (xmp_driver_predict(drv, cf, ci, cw, &res) == XMESH_SUCCESS && res.ok)
                ex.predicted_s = res.step_s;
            if (o->print_schedule && rank == 0 && step == 1) {
                printf("# simulated timeline (stage costs of step 0, xmesh plan predictions):\n");
                xmp_sim_render(sched, &res, 100, stdout);
            }
            xmp_sim_result_free(&res);
        }
        for (int k = 0; k < S; k++) {
            cf[k] = all[k];
            ci[k] = all[S + k];
            cw[k] = all[2 * S + k];
        }
        have_costs = 1;
        /* After the first step, place the deferred W work with the measured stage costs and
         * xmesh's predicted transfer times instead of unit costs (pipe/replan.h). */
        if (step == 0 && o->delay_wgrad && o->steps > 1 && S > 1) {
            xmp_replan_t rp = {
                o->schedule,      M, st.nedges, se, cf, ci, cw, xmp_driver_mean_act_seconds(drv),
                o->print_schedule};
            char rerr[640];
            if (xmp_pipe_replan(&rp, &dc, &sched, &drv, rerr, sizeof rerr) != 0) {
                if (rank == 0)
                    xmp_cli_error("%s", rerr);
                break;
            }
        }
        if (rank == 0) {
            ut_log_record_ex(&log, step, loss, ss.step_s, &ex);
            if (ref) {
                double rel = fabs(loss - ref[step]) / fmax(fabs(ref[step]), 1e-30);
                double tol = step < 5 ? 1e-5 : 1e-4;
                compared += step < 10;
                if (step < 10 && !(rel <= tol)) {
                    xmp_progress_finish(&log.bar);
                    fprintf(stderr,
                            "MISMATCH step %d: pipeline loss %.9g serial %.9g (rel %.3g > "
                            "%g)\n",
                            step, loss, ref[step], rel, tol);
                    mismatch++;
                } else if (step < 10 && !o->no_progress) {
                    /* nothing: the bar shows progress */
                } else if (step < 10) {
                    printf("step %d: pipeline loss %.9g serial %.9g rel %.2e\n", step, loss,
                           ref[step], rel);
                }
            }
        }
        ok = step == o->steps - 1;
    }
    if (rank == 0 && log_ok && ut_log_close(&log, ok, "pipeline") != 0)
        ok = 0;
    /* OK only after a full comparison of a complete run: every step ran, every compared step
     * matched, and as many steps were compared as asked for (a failed step, a failed re-plan or
     * a short run is FAILED, and the exit status is non-zero in every such case). */
    const int want = o->steps < 10 ? o->steps : 10;
    if (rank == 0 && ref) {
        if (ok && !mismatch && compared == want)
            printf("check-serial: OK (%d steps compared, all within tolerance)\n", compared);
        else
            printf("check-serial: FAILED (%d mismatching, %d of %d steps compared, run %s)\n",
                   mismatch, compared, want, ok ? "complete" : "incomplete");
    }
    if (ref && compared != want)
        mismatch++;
    if (o->trace && drv && xmp_driver_write_trace(drv, o->trace) != XMESH_SUCCESS && rank == 0)
        xmp_cli_error("--trace '%s': %s", o->trace, xmp_driver_error(drv));
    int mine = ok && !mismatch, all = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    rc = all ? 0 : 1;
    xmp_driver_destroy(drv);
out_ctx:
    xmesh_ctx_destroy(ctx);
out_stage:
    stage_free(&st);
    for (int k = 0; k < nxs; k++)
        stage_free(&xs[k]);
    free(xs);
    free(xt);
    for (int s = 0; s < XMP_MAX_STAGES; s++)
        xmp_mesh_destroy(smesh[s]);
out_mpi:
    free(allranks);
    free(mranks);
    free(ref);
    xmp_sched_destroy(sched);
    MPI_Finalize();
    return rc;
}

int xmp_train_utransformer_main(int argc, char **argv)
{
    xmp_cli_set_command("utransformer");
    ut_opts_t o;
    ut_defaults(&o);
    int p = parse_ut_flags(argc, argv, &o);
    if (p != 0)
        return p > 0 ? 0 : 2;
    xmp_ut_config_t c;
    if (xmp_ut_config_init(&c, o.base, o.groups, o.head_dim) != 0) {
        xmp_cli_error("model flags: %s", xmp_ut_last_error());
        return 2;
    }
    openblas_set_num_threads(o.blas_threads);
    if (o.serial) {
        ut_log_t log;
        return serial_losses(&o, &c, NULL, &log, 1) == 0 ? 0 : 1;
    }
    return run_pipeline(&o, &c);
}
