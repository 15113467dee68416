/* The one training loop of xmesh-train: see trainer.h. */
#include "trainer.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/sbp.h"
#include "pipe/replan.h"

/* Steps compared by --check-serial and their tolerances (relative). */
#define XMP_CHECK_STEPS 20
#define XMP_CHECK_TIGHT_STEPS 5

int xmp_train_fail(const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s", msg);
    return -1;
}

void xmp_train_defaults(xmp_train_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->steps = 40;
    o->microbatches = 1;
    o->schedule = XMP_SCHED_1F1B;
    o->comm = XMP_COMM_BROADCAST;
    o->bench_warmup = 1;
    o->blas_threads = 1;
    o->grad_accum = 1;
}

float xmp_train_lr(const xmp_train_opts_t *o, int step)
{
    double lr = o->lr;
    if (step < o->warmup)
        return (float)(lr * (step + 1) / o->warmup);
    if (o->lr_decay == XMP_LR_NONE || o->steps - o->warmup <= 1)
        return (float)lr;
    /* 0 at the first step after the warm-up, 1 at the last step */
    double ratio = (double)(step - o->warmup) / (double)(o->steps - o->warmup - 1);
    double lo = lr * o->lr_min_frac;
    if (o->lr_decay == XMP_LR_COSINE)
        return (float)(lo + 0.5 * (1.0 + cos(3.14159265358979323846 * ratio)) * (lr - lo));
    return (float)(lr - (lr - lo) * ratio);
}

void xmp_train_usage(void)
{
    printf("common to every model:\n"
           "  --serial            one process, the reference (no mesh, stage or strategy flags)\n"
           "  --steps N  --seed N  --lr X  --weight-decay X\n"
           "  --grad-accum N (1)  batches per optimizer step (N x --microbatches per step)\n"
           "  --grad-clip X (0: off)  clip the global gradient norm (every stage and rank) to X\n"
           "  --warmup N (0)      linear learning-rate warm-up over N steps\n"
           "  --lr-decay none|cosine|linear (none)  decay after the warm-up to the last step\n"
           "  --lr-min-frac F (0) the decay ends at lr x F\n"
           "  --json FILE         configuration + one record per step\n"
           "  --log-steps         print 'step N: train loss L (took X ms)' lines\n"
           "  --no-progress       no progress bar (it is only drawn on a terminal anyway)\n"
           "  --bench             print the rate median/min/max over steps after --bench-warmup\n"
           "  --bench-warmup N (1) steps left out of the --bench statistics\n"
           "  --blas-threads N    OpenBLAS threads (1)\n"
           "parallel (under mpirun):\n"
           "  --mesh RxC --dp N --tp N   one stage on all ranks (R = dp, C = tp)\n"
           "  --stages N          pipeline stages; layers split evenly\n"
           "  --layout STR        explicit layers per stage (Megatron style, e.g. 'E,t*3|t*3,L')\n"
           "  --stage-mesh 2x2x2,1x4    per-stage meshes of 1 to 4 axes each (2x1,1x2: dp x tp)\n"
           "  --stage-dp 2,1  --stage-tp 1,2   per-stage 2-axis dp x tp meshes (shorthands)\n"
           "  --strategy NAME|FILE       SBP of every parameter and activation class, all stages\n"
           "                      (the model's built-ins or a strategy file, docs/STRATEGY.md)\n"
           "  --stage-strategy A,B       one strategy (name or file) per stage\n"
           "  --print-strategy    print the resolved strategy of each stage and exit\n"
           "  --microbatches M (1) --schedule gpipe|1f1b|eager-1f1b (1f1b) --delay-wgrad\n"
           "  --comm broadcast|sendrecv|sendrecv-allgather|blocking|signal (broadcast)\n"
           "checkpoints (parallel runs; docs/CHECKPOINT.md):\n"
           "  --save-dir DIR      distributed checkpoint DIR/step-N after every --save-every N\n"
           "                      steps (0: only after the last step) --keep K newest (0: all)\n"
           "  --resume DIR        start from DIR's latest step in any layout; the model and\n"
           "                      optimizer settings come from it; --steps is the total\n"
           "  --trace FILE        Chrome trace of compute, transfers and waits per rank\n"
           "  --cluster FILE      cost model of the transfers (xmesh-calibrate -o FILE; sets\n"
           "                      XMESH_CLUSTER_FILE): plans, predictions, the simulator\n"
           "  --print-schedule    print the schedule and its simulated timeline\n"
           "  --check-serial      rank 0 also trains the serial reference and fails unless the\n"
           "                      losses agree (1e-5 relative for steps 0-4, 1e-4 to step 19)\n");
}

int xmp_train_parse_flag(int argc, char **argv, int *i, xmp_train_opts_t *o)
{
    const char *a = argv[*i], *v;
    const struct {
        const char *flag;
        int *p;
    } sw[] = {{"--serial", &o->serial},
              {"--bench", &o->bench},
              {"--log-steps", &o->log_steps},
              {"--no-progress", &o->no_progress},
              {"--delay-wgrad", &o->delay_wgrad},
              {"--print-schedule", &o->print_schedule},
              {"--print-strategy", &o->print_strategy},
              {"--check-serial", &o->check_serial}};
    for (size_t k = 0; k < sizeof sw / sizeof sw[0]; k++)
        if (!strcmp(a, sw[k].flag)) {
            *sw[k].p = 1;
            return 1;
        }
    const struct {
        const char *flag;
        int *ip;
        long lo, hi;
        float *fp;
        double flo, fhi;
        const char **sp;
    } t[] = {
        {"--steps", &o->steps, 1, 1 << 30, NULL, 0, 0, NULL},
        {"--warmup", &o->warmup, 0, 1 << 30, NULL, 0, 0, NULL},
        {"--bench-warmup", &o->bench_warmup, 0, 1 << 30, NULL, 0, 0, NULL},
        {"--grad-accum", &o->grad_accum, 1, 1 << 16, NULL, 0, 0, NULL},
        {"--grad-clip", NULL, 0, 0, &o->grad_clip, 0.0, 1e30, NULL},
        {"--lr-min-frac", NULL, 0, 0, &o->lr_min_frac, 0.0, 1.0, NULL},
        {"--blas-threads", &o->blas_threads, 1, 1024, NULL, 0, 0, NULL},
        {"--dp", &o->dp, 1, 1 << 20, NULL, 0, 0, NULL},
        {"--tp", &o->tp, 1, 1 << 20, NULL, 0, 0, NULL},
        {"--stages", &o->stages, 1, XMP_MAX_STAGES, NULL, 0, 0, NULL},
        {"--microbatches", &o->microbatches, 1, 1 << 20, NULL, 0, 0, NULL},
        {"--lr", NULL, 0, 0, &o->lr, 0.0, 10.0, NULL},
        {"--weight-decay", NULL, 0, 0, &o->wd, 0.0, 10.0, NULL},
        {"--json", NULL, 0, 0, NULL, 0, 0, &o->json},
        {"--mesh", NULL, 0, 0, NULL, 0, 0, &o->mesh},
        {"--layout", NULL, 0, 0, NULL, 0, 0, &o->layout},
        {"--stage-mesh", NULL, 0, 0, NULL, 0, 0, &o->stage_mesh},
        {"--stage-dp", NULL, 0, 0, NULL, 0, 0, &o->stage_dp},
        {"--stage-tp", NULL, 0, 0, NULL, 0, 0, &o->stage_tp},
        {"--trace", NULL, 0, 0, NULL, 0, 0, &o->trace},
        {"--cluster", NULL, 0, 0, NULL, 0, 0, &o->cluster},
        {"--strategy", NULL, 0, 0, NULL, 0, 0, &o->strategy},
        {"--stage-strategy", NULL, 0, 0, NULL, 0, 0, &o->stage_strategy},
        {"--save-dir", NULL, 0, 0, NULL, 0, 0, &o->save_dir},
        {"--save-every", &o->save_every, 0, 1 << 30, NULL, 0, 0, NULL},
        {"--keep", &o->keep, 0, 1 << 20, NULL, 0, 0, NULL},
        {"--resume", NULL, 0, 0, NULL, 0, 0, &o->resume},
    };
    size_t k, nt = sizeof t / sizeof t[0];
    for (k = 0; k < nt; k++)
        if (!strcmp(a, t[k].flag))
            break;
    if (k == nt) {
        if (!strcmp(a, "--seed")) {
            if (!(v = xmp_cli_value(argc, argv, i)) || xmp_cli_u64(a, v, &o->seed) != 0)
                return -1;
            return 1;
        }
        if (!strcmp(a, "--lr-decay")) {
            if (!(v = xmp_cli_value(argc, argv, i)))
                return -1;
            if (!strcmp(v, "none"))
                o->lr_decay = XMP_LR_NONE;
            else if (!strcmp(v, "cosine"))
                o->lr_decay = XMP_LR_COSINE;
            else if (!strcmp(v, "linear"))
                o->lr_decay = XMP_LR_LINEAR;
            else
                return xmp_cli_error("--lr-decay '%s': expected none, cosine or linear", v);
            return 1;
        }
        if (!strcmp(a, "--schedule")) {
            if (!(v = xmp_cli_value(argc, argv, i)))
                return -1;
            if ((o->schedule = xmp_sched_kind_parse(v)) < 0)
                return xmp_cli_error("--schedule '%s': expected gpipe, 1f1b or eager-1f1b", v);
            return 1;
        }
        if (!strcmp(a, "--comm")) {
            if (!(v = xmp_cli_value(argc, argv, i)))
                return -1;
            if ((o->comm = xmp_comm_mode_parse(v)) < 0)
                return xmp_cli_error("--comm '%s': expected broadcast, sendrecv, "
                                     "sendrecv-allgather, blocking or signal",
                                     v);
            return 1;
        }
        return 0;
    }
    if (!(v = xmp_cli_value(argc, argv, i)))
        return -1;
    if (t[k].ip && xmp_cli_int(a, v, t[k].lo, t[k].hi, t[k].ip) != 0)
        return -1;
    if (t[k].fp && xmp_cli_float(a, v, t[k].flo, t[k].fhi, t[k].fp) != 0)
        return -1;
    if (t[k].sp)
        *t[k].sp = v;
    return 1;
}

int xmp_train_check_flags(xmp_train_opts_t *o)
{
    /* Every plan's cluster model reads it (the library applies the file on top of XMESH_*),
     * so the schedule's predicted transfers use it too. */
    if (o->cluster)
        setenv("XMESH_CLUSTER_FILE", o->cluster, 1);
    if (o->serial &&
        (o->mesh || o->dp || o->tp || o->stages || o->layout || o->stage_mesh || o->stage_dp ||
         o->stage_tp || o->strategy || o->stage_strategy || o->print_strategy))
        return xmp_cli_error("--serial runs one process: drop the mesh, stage and strategy flags");
    if (o->serial && (o->save_dir || o->resume))
        return xmp_cli_error("--save-dir / --resume are distributed checkpoints: run under "
                             "mpirun (-np 1 for one process) without --serial");
    if (o->save_every && !o->save_dir)
        return xmp_cli_error("--save-every %d needs --save-dir", o->save_every);
    if (o->resume && o->check_serial)
        return xmp_cli_error("--check-serial trains the serial model from its initialisation: "
                             "not with --resume");
    if (o->strategy && o->stage_strategy)
        return xmp_cli_error("--strategy '%s' and --stage-strategy '%s' are exclusive", o->strategy,
                             o->stage_strategy);
    if (o->mesh && (o->stages > 1 || o->layout || o->stage_mesh))
        return xmp_cli_error("--mesh '%s' is one stage; use --stage-mesh for several", o->mesh);
    if (o->check_serial && o->comm == XMP_COMM_SIGNAL)
        return xmp_cli_error("--check-serial with --comm signal: signal moves no data, so its "
                             "losses cannot match the serial reference");
    if (o->bench && o->bench_warmup >= o->steps)
        return xmp_cli_error("--bench-warmup %d leaves no measured step of --steps %d",
                             o->bench_warmup, o->steps);
    if (o->warmup > o->steps)
        return xmp_cli_error("--warmup %d is longer than --steps %d", o->warmup, o->steps);
    return 0;
}

/* ---- stage layout and strategies ---- */

/* The layout from the flags (the same on every rank): --mesh/--dp/--tp one stage, --stages /
 * --layout / --stage-mesh / --stage-dp / --stage-tp several; without any mesh flag one stage
 * data parallel over every rank. */
static int train_layout(const xmp_train_opts_t *o, const xmp_train_model_t *m, int size,
                        xmp_stage_layout_t *sl, char *err, size_t errlen)
{
    char dps[32], tps[32], alldp[32];
    const char *meshes = o->mesh ? o->mesh : o->stage_mesh, *dp = o->stage_dp, *tp = o->stage_tp;
    if (o->dp) {
        snprintf(dps, sizeof dps, "%d", o->dp);
        dp = dps;
    }
    if (o->tp) {
        snprintf(tps, sizeof tps, "%d", o->tp);
        tp = tps;
    }
    if (o->mesh && (dp || tp)) {
        if (!dp)
            dp = "1";
        if (!tp)
            tp = "1";
    }
    int stages = o->stages ? o->stages : (o->layout ? 0 : 1);
    if (!o->stages && !o->layout && o->stage_mesh) { /* one stage per mesh */
        stages = 1;
        for (const char *p = o->stage_mesh; *p; p++)
            stages += *p == ',';
    }
    if (!meshes && !dp && !tp && stages == 1 && !o->layout) {
        snprintf(alldp, sizeof alldp, "%d", size);
        dp = alldp;
    }
    if (xmp_stage_layout_build(m->kinds, m->fixed_head, m->fixed_tail, o->layout, stages, meshes,
                               dp, tp, sl, err, errlen) != 0)
        return -1;
    if (sl->nranks > size)
        return snprintf(err, errlen, "the stage meshes need %d ranks, the job has %d", sl->nranks,
                        size),
               -1;
    return 0;
}

/* Resolves the strategy of every stage (the same on every rank): --strategy for all,
 * --stage-strategy per stage (one entry: all), else megatron; each loaded for its stage's axis
 * count through the model's built-ins and checked by the model. */
static int train_strategies(const xmp_train_opts_t *o, const xmp_train_model_t *m,
                            const xmp_stage_layout_t *sl, xmp_strategy_t *out, char *err,
                            size_t errlen)
{
    char names[XMP_MAX_STAGES][256];
    int n = 0;
    const char *flag = o->stage_strategy ? "--stage-strategy" : "--strategy";
    const char *list = o->stage_strategy ? o->stage_strategy : o->strategy;
    if (!list)
        list = "megatron";
    for (const char *p = list;; n++) {
        const char *q = strchr(p, ',');
        size_t len = q ? (size_t)(q - p) : strlen(p);
        if (n >= XMP_MAX_STAGES || len == 0 || len >= sizeof names[0] || (!o->stage_strategy && q))
            return snprintf(err, errlen, "%s '%s': expected %s", flag, list,
                            o->stage_strategy ? "one name or file per stage, separated by ','"
                                              : "one name or file (per stage: --stage-strategy)"),
                   -1;
        memcpy(names[n], p, len);
        names[n][len] = '\0';
        if (!q) {
            n++;
            break;
        }
        p = q + 1;
    }
    if (n != 1 && n != sl->nstages)
        return snprintf(err, errlen, "%s '%s' has %d entries for %d stages", flag, list, n,
                        sl->nstages),
               -1;
    for (int s = 0; s < sl->nstages; s++) {
        char sub[640];
        if (xmp_strategy_load_mesh(names[n == 1 ? 0 : s], m->builtins, m->user, m->builtin_names,
                                   sl->ndim[s], sl->shape[s], &out[s], sub, sizeof sub))
            return snprintf(err, errlen, "stage %d: %.400s", s, sub), -1;
        if (m->strategy_check && m->strategy_check(m->user, &out[s], sl, s, err, errlen))
            return -1;
    }
    return 0;
}

/* ---- step records: JSON, progress bar, per-step log, summary (rank 0) ---- */

typedef struct {
    const xmp_train_opts_t *o;
    const xmp_train_model_t *m;
    const char *mode;
    xmp_json_t json;
    int have_json;
    xmp_progress_t bar;
    double *rate;
    double first_loss, last_loss, t_start;
    int n;
} train_log_t;

static int log_open(train_log_t *s, const xmp_train_opts_t *o, const xmp_train_model_t *m,
                    const char *mode, int64_t nparams, const xmp_stage_layout_t *sl,
                    const xmp_strategy_t *strat)
{
    memset(s, 0, sizeof *s);
    s->o = o;
    s->m = m;
    s->mode = mode;
    if (!(s->rate = calloc((size_t)o->steps, sizeof(double))))
        return xmp_cli_error("out of memory");
    if (o->json) {
        if (xmp_json_open(&s->json, o->json) != 0) {
            free(s->rate);
            return -1;
        }
        s->have_json = 1;
        xmp_json_t *j = &s->json;
        xmp_json_obj_begin(j, NULL);
        xmp_json_str(j, "command", m->name);
        xmp_json_str(j, "mode", mode);
        xmp_json_obj_begin(j, "model");
        if (m->json_model)
            m->json_model(m->user, j);
        xmp_json_int(j, "num_parameters", (long long)nparams);
        xmp_json_obj_end(j);
        xmp_json_obj_begin(j, "train");
        if (m->json_train)
            m->json_train(m->user, j);
        xmp_json_int(j, "steps", o->steps);
        if (o->resume) {
            xmp_json_str(j, "resumed_from", o->resume);
            xmp_json_int(j, "start_step", o->start_step);
        }
        xmp_json_f32(j, "lr", o->lr);
        xmp_json_f32(j, "weight_decay", o->wd);
        xmp_json_int(j, "blas_threads", o->blas_threads);
        xmp_json_int(j, "grad_accum", o->grad_accum);
        xmp_json_f32(j, "grad_clip", o->grad_clip);
        xmp_json_int(j, "warmup", o->warmup);
        xmp_json_str(j, "lr_decay",
                     o->lr_decay == XMP_LR_COSINE   ? "cosine"
                     : o->lr_decay == XMP_LR_LINEAR ? "linear"
                                                    : "none");
        xmp_json_f32(j, "lr_min_frac", o->lr_min_frac);
        xmp_json_obj_end(j);
        if (sl) {
            char buf[512];
            xmp_stage_layout_format(sl, buf, sizeof buf);
            xmp_json_obj_begin(j, "pipeline");
            xmp_json_int(j, "stages", sl->nstages);
            xmp_json_str(j, "layout", buf);
            xmp_json_int(j, "microbatches", o->microbatches * o->grad_accum);
            xmp_json_str(j, "schedule", xmp_sched_kind_name(o->schedule));
            xmp_json_bool(j, "delay_wgrad", o->delay_wgrad);
            xmp_json_str(j, "comm", xmp_comm_mode_name(o->comm));
            xmp_json_arr_begin(j, "stage_meshes");
            for (int k = 0; k < sl->nstages; k++) {
                char mesh[64] = "";
                for (int a = 0, at = 0; a < sl->ndim[k] && at < (int)sizeof mesh; a++)
                    at += snprintf(mesh + at, sizeof mesh - (size_t)at, "%s%d", a ? "x" : "",
                                   sl->shape[k][a]);
                xmp_json_obj_begin(j, NULL);
                xmp_json_str(j, "mesh", mesh);
                xmp_json_int(j, "rank0", sl->rank0[k]);
                xmp_json_str(j, "strategy", strat ? strat[k].name : "");
                xmp_json_str(j, "strategy_source", strat ? strat[k].source : "");
                xmp_json_obj_end(j);
            }
            xmp_json_arr_end(j);
            xmp_json_obj_end(j);
        }
        xmp_json_arr_begin(j, "steps");
    }
    xmp_progress_init(&s->bar, o->steps, o->no_progress);
    s->t_start = xmp_now();
    return 0;
}

static void log_record(train_log_t *s, int step, double loss, double seconds,
                       const xmp_step_pipe_t *pipe, float lr, double grad_norm)
{
    double rate = seconds > 0 ? s->m->per_step / seconds : 0.0;
    if (s->n == 0)
        s->first_loss = loss;
    s->last_loss = loss;
    s->rate[s->n++] = rate;
    if (s->have_json) {
        xmp_json_obj_begin(&s->json, NULL);
        xmp_json_int(&s->json, "step", step);
        if (pipe)
            xmp_json_num(&s->json, "loss", loss);
        else
            xmp_json_f32(&s->json, "loss", (float)loss);
        xmp_json_num(&s->json, "step_seconds", seconds);
        xmp_json_num(&s->json, s->m->rate_key, rate);
        xmp_json_f32(&s->json, "lr", lr);
        if (s->o->grad_clip > 0)
            xmp_json_num(&s->json, "grad_norm", grad_norm);
        if (pipe)
            xmp_json_step_pipeline(&s->json, pipe);
        xmp_json_obj_end(&s->json);
    }
    if (s->o->log_steps) {
        xmp_progress_finish(&s->bar);
        printf("step %d: train loss %f (took %f ms)\n", step, loss, seconds * 1000.0);
    }
    xmp_progress_update(&s->bar, step + 1, loss, rate);
}

/* Writes the summary's common keys (the JSON summary object stays open for the model). */
static void log_summary(train_log_t *s, int ok, double *med, double *mn, double *mx, int *skip)
{
    const xmp_train_opts_t *o = s->o;
    xmp_progress_finish(&s->bar);
    *skip = o->bench ? o->bench_warmup : 0;
    if (*skip >= s->n)
        *skip = 0;
    *med = *mn = *mx = 0;
    if (s->n > 0)
        xmp_stats(s->rate + *skip, (size_t)(s->n - *skip), med, mn, mx);
    if (!s->have_json)
        return;
    char key[64];
    xmp_json_arr_end(&s->json);
    xmp_json_obj_begin(&s->json, "summary");
    xmp_json_bool(&s->json, "completed", ok);
    xmp_json_int(&s->json, "steps_done", s->n);
    xmp_json_num(&s->json, "first_loss", s->n ? s->first_loss : NAN);
    xmp_json_num(&s->json, "final_loss", s->n ? s->last_loss : NAN);
    xmp_json_num(&s->json, "total_seconds", xmp_now() - s->t_start);
    xmp_json_int(&s->json, "stats_skipped_steps", *skip);
    snprintf(key, sizeof key, "%s_median", s->m->rate_key);
    xmp_json_num(&s->json, key, *med);
    snprintf(key, sizeof key, "%s_min", s->m->rate_key);
    xmp_json_num(&s->json, key, *mn);
    snprintf(key, sizeof key, "%s_max", s->m->rate_key);
    xmp_json_num(&s->json, key, *mx);
}

/* Closes the JSON summary and the file, prints the summary line (and --bench statistics). */
static int log_close(train_log_t *s, double med, double mn, double mx, int skip)
{
    int rc = 0;
    if (s->have_json) {
        xmp_json_obj_end(&s->json);
        xmp_json_obj_end(&s->json);
        rc = xmp_json_close(&s->json);
        s->have_json = 0;
    }
    if (s->n > 0) {
        char desc[128] = "";
        const char *unit = !strncmp(s->m->rate_key, "tokens", 6) ? "tokens" : "images";
        if (s->m->describe)
            s->m->describe(s->m->user, desc, sizeof desc);
        printf("%s %s: %d steps %s, loss %.4f -> %.4f, %.1f %s/s median, %.2f s\n", s->m->name,
               s->mode, s->n, desc, s->first_loss, s->last_loss, med, unit, xmp_now() - s->t_start);
        if (s->o->bench)
            printf("bench: %s/s over steps %d..%d (%.0f per step):\n"
                   "  median %.1f  min %.1f  max %.1f   (median %.3f ms/step)\n",
                   unit, skip, s->n - 1, s->m->per_step, med, mn, mx,
                   med > 0 ? 1000.0 * s->m->per_step / med : 0.0);
    }
    free(s->rate);
    s->rate = NULL;
    return rc;
}

/* ---- serial ---- */

/* The serial reference's per-step losses (for --check-serial on rank 0). */
static int serial_losses(const xmp_train_opts_t *o, const xmp_train_model_t *m, int steps,
                         double *out)
{
    int64_t np = 0;
    if (m->serial_open(m->user, &np) != 0)
        return -1;
    int rc = 0;
    for (int step = 0; step < steps && rc == 0; step++) {
        double gn = 0;
        if (m->set_lr)
            m->set_lr(m->user, xmp_train_lr(o, step));
        rc = m->serial_step(m->user, step, &out[step], &gn);
    }
    m->serial_close(m->user);
    (void)o;
    return rc;
}

static int run_serial(const xmp_train_opts_t *o, const xmp_train_model_t *m)
{
    int64_t np = 0;
    int ok = 0;
    train_log_t log;
    if (m->serial_open(m->user, &np) != 0) {
        xmp_cli_error("%s", xmp_last_error());
        return 1;
    }
    if (log_open(&log, o, m, "serial", np, NULL, NULL) != 0) {
        m->serial_close(m->user);
        return 1;
    }
    for (int step = 0; step < o->steps; step++) {
        double t0 = xmp_now(), loss = 0, gn = 0;
        float lr = xmp_train_lr(o, step);
        if (m->set_lr)
            m->set_lr(m->user, lr);
        if (m->serial_step(m->user, step, &loss, &gn) != 0) {
            xmp_cli_error("training stopped at step %d: %s", step, xmp_last_error());
            break;
        }
        log_record(&log, step, loss, xmp_now() - t0, NULL, lr, gn);
        if (!isfinite(loss)) {
            xmp_cli_error("training stopped: loss is %f at step %d", loss, step);
            break;
        }
        ok = step == o->steps - 1;
    }
    double med, mn, mx;
    int skip;
    log_summary(&log, ok, &med, &mn, &mx, &skip);
    if (log_close(&log, med, mn, mx, skip) != 0)
        ok = 0;
    if (ok && m->serial_finish && m->serial_finish(m->user) != 0)
        ok = 0;
    m->serial_close(m->user);
    return ok ? 0 : 1;
}

/* ---- parallel: the stages under the pipeline driver ---- */

/* Times the stage callbacks: per-microbatch F, I, W seconds for the simulator and re-planning,
 * and the step's compute time. */
typedef struct {
    xmp_stage_ops_t in;
    double f, i, w, r, o;
    int nf, ni, nw;
    int defer_o; /* --grad-clip: O runs after the driver step, once the global norm is known */
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
    int rc = t->in.reduce_grads ? t->in.reduce_grads(t->in.user) : 0;
    t->r += MPI_Wtime() - t0;
    return rc;
}
static int t_opt(void *u)
{
    timed_ops_t *t = u;
    if (t->defer_o)
        return 0;
    double t0 = MPI_Wtime();
    int rc = t->in.optimizer_step ? t->in.optimizer_step(t->in.user) : 0;
    t->o += MPI_Wtime() - t0;
    return rc;
}
static int64_t t_act(void *u)
{
    timed_ops_t *t = u;
    return t->in.activation_bytes ? t->in.activation_bytes(t->in.user) : 0;
}

/* The lowest rank of the world that failed, size when none (collective). */
static int lowest_failing(int fail, int rank, int size)
{
    int r = fail ? rank : size;
    MPI_Allreduce(MPI_IN_PLACE, &r, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return r;
}

/* 1 when any rank of the world says bad (collective). */
static int any_rank(int bad)
{
    int any = 0;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    return any;
}

/* Re-plans (pipe/replan.h) with the measured per-microbatch costs and xmesh's predicted boundary
 * transfer time, so that the W actions fill the waits the transfers cause. Collective. */
static int replan(const xmp_train_opts_t *o, const xmp_train_model_t *m, int rank, int S,
                  const xmp_train_stages_t *ts, const double *f, const double *fi, const double *fw,
                  xmp_driver_cfg_t *dc, xmp_schedule_t **sched, xmp_driver_t **drv)
{
    double x = 0;
    if (m->par_edge_seconds) {
        int strategy = o->comm == XMP_COMM_SENDRECV             ? XMESH_STRATEGY_SENDRECV
                       : o->comm == XMP_COMM_SENDRECV_ALLGATHER ? XMESH_STRATEGY_SENDRECV_ALLGATHER
                                                                : XMESH_STRATEGY_BROADCAST;
        x = m->par_edge_seconds(m->user, strategy);
    } else {
        x = xmp_driver_mean_act_seconds(*drv);
    }
    (void)S;
    xmp_replan_t rp = {
        o->schedule, o->microbatches * o->grad_accum,    ts->nedges,       ts->sedges, f, fi,
        fw,          o->comm == XMP_COMM_SIGNAL ? 0 : x, o->print_schedule};
    char err[640];
    if (xmp_pipe_replan(&rp, dc, sched, drv, err, sizeof err) != 0) {
        if (rank == 0)
            xmp_cli_error("%s", err);
        return -1;
    }
    return 0;
}

/* --grad-clip, after the driver step (R done, O deferred): the global gradient norm over every
 * stage and rank (each distinct element once: one all-reduce over the world), the reduced
 * gradients scaled by clip/norm when the norm exceeds clip, then the stage's O. Collective. */
static int clip_and_update(const xmp_train_opts_t *o, const xmp_train_model_t *m, int me,
                           timed_ops_t *t, double *norm)
{
    double ss = me >= 0 && m->grad_sumsq ? m->grad_sumsq(m->user) : 0, all = 0;
    MPI_Allreduce(&ss, &all, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    *norm = sqrt(all);
    int bad = 0;
    if (me >= 0) {
        if (*norm > o->grad_clip && m->grad_scale)
            m->grad_scale(m->user, (float)(o->grad_clip / *norm));
        double t0 = MPI_Wtime();
        bad = t->in.optimizer_step ? t->in.optimizer_step(t->in.user) != 0 : 0;
        t->o += MPI_Wtime() - t0;
    }
    return any_rank(bad) ? -1 : 0;
}

/* Per-step figures over the world: per stage the max over its ranks of the per-microbatch F, I
 * and W seconds, the idle fraction, the peak microbatches and bytes. Collective. */
static void step_figures(int S, int me, const timed_ops_t *t, const xmp_step_stats_t *ss,
                         double *cf, double *ci, double *cw, double *bubble, int *peak_mb,
                         int64_t *peak_bytes)
{
    double loc[5 * XMP_MAX_STAGES], all[5 * XMP_MAX_STAGES];
    int64_t lp[XMP_MAX_STAGES], ap[XMP_MAX_STAGES];
    memset(loc, 0, sizeof loc);
    memset(lp, 0, sizeof lp);
    if (me >= 0) {
        loc[me] = t->nf ? t->f / t->nf : 0;
        loc[S + me] = t->ni ? t->i / t->ni : 0;
        loc[2 * S + me] = t->nw ? t->w / t->nw : 0;
        loc[3 * S + me] = ss->bubble;
        loc[4 * S + me] = ss->peak_act_mb;
        lp[me] = ss->peak_act_bytes;
    }
    MPI_Allreduce(loc, all, 5 * S, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(lp, ap, S, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
    for (int k = 0; k < S; k++) {
        cf[k] = all[k];
        ci[k] = all[S + k];
        cw[k] = all[2 * S + k];
        bubble[k] = all[3 * S + k];
        peak_mb[k] = (int)all[4 * S + k];
        peak_bytes[k] = ap[k];
    }
}

static int run_parallel(const xmp_train_opts_t *oin, const xmp_train_model_t *m)
{
    int prov, rank, size, rc = 1;
    MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &prov);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    xmp_train_opts_t o1 = *oin, *o = &o1;
    if (rank != 0) {
        o->no_progress = 1;
        o->json = NULL;
        o->log_steps = 0;
    }
    char err[1024] = "";
    xmp_stage_layout_t sl;
    xmesh_ctx_t ctx = NULL;
    xmp_schedule_t *sched = NULL;
    xmp_driver_t *drv = NULL;
    xmp_strategy_t *strat = NULL;
    double *ref = NULL;
    int opened = 0, have_log = 0, ok = 0, mismatch = 0, compared = 0;
    train_log_t log;
    xmp_train_stages_t ts;
    memset(&ts, 0, sizeof ts);
    /* --resume: the model configuration and optimizer settings come from the checkpoint,
     * before the layout (the layer kinds depend on the configuration) */
    if ((o->resume || o->save_dir) && !(m->ckpt_open && m->ckpt_load && m->ckpt_save)) {
        if (rank == 0)
            xmp_cli_error("--save-dir / --resume: the %s model has no checkpoints", m->name);
        goto out;
    }
    if (o->resume) {
        int64_t start = 0;
        int cbad = lowest_failing(m->ckpt_open(m->user, MPI_COMM_WORLD, o->resume, o, &start) != 0,
                                  rank, size);
        if (cbad < size) {
            if (rank == cbad)
                xmp_cli_error("--resume: %s", xmp_last_error());
            goto out;
        }
        if (start >= o->steps) {
            if (rank == 0)
                xmp_cli_error("--resume '%s' is at step %lld: --steps %d (the total) leaves "
                              "nothing to train",
                              o->resume, (long long)start, o->steps);
            goto out;
        }
        o->start_step = (int)start;
    }
    if (train_layout(o, m, size, &sl, err, sizeof err) != 0 ||
        (m->layout_check && m->layout_check(m->user, &sl, err, sizeof err) != 0)) {
        if (rank == 0)
            xmp_cli_error("stage layout: %s", err);
        goto out;
    }
    /* Every rank resolves and checks the same strategies (pure, but files are read on every
     * rank): the ranks agree on the outcome before any other collective, and the lowest failing
     * rank prints its message, so no rank goes on alone. */
    strat = calloc((size_t)sl.nstages, sizeof *strat);
    int sfail = !strat || train_strategies(o, m, &sl, strat, err, sizeof err) != 0;
    int first_bad = sfail ? rank : size;
    MPI_Allreduce(MPI_IN_PLACE, &first_bad, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (first_bad < size) {
        if (rank == first_bad && rank == 0)
            xmp_cli_error("strategy: %s", strat ? err : "out of memory");
        else if (rank == first_bad)
            xmp_cli_error("strategy (rank %d): %s", rank, strat ? err : "out of memory");
        goto out;
    }
    if (o->print_strategy) {
        if (rank == 0) {
            char *buf = malloc(1 << 16), meshes[256];
            xmp_stage_layout_format_meshes(&sl, meshes, sizeof meshes);
            printf("# %d stage(s), meshes %s\n", sl.nstages, meshes);
            for (int s = 0; buf && s < sl.nstages; s++) {
                xmp_strategy_format(&strat[s], buf, 1 << 16);
                printf("# stage %d: %s (%s)\n%s", s, strat[s].name, strat[s].source, buf);
            }
            free(buf);
        }
        rc = 0;
        goto out;
    }
    /* The serial reference first (rank 0), before the stages allocate anything, so the
     * stages' measured allocation peaks do not include it; every rank learns the outcome. */
    if (o->check_serial && rank == 0) {
        ref = calloc((size_t)o->steps, sizeof(double));
        if (!ref || serial_losses(o, m, o->steps, ref) != 0) {
            xmp_cli_error("serial reference failed: %s", ref ? xmp_last_error() : "out of memory");
            free(ref);
            ref = NULL;
        }
    }
    if (any_rank(o->check_serial && rank == 0 && !ref))
        goto out;
    if (xmesh_ctx_create_mpi(MPI_COMM_WORLD, NULL, &ctx) != XMESH_SUCCESS) {
        xmp_cli_error("xmesh_ctx_create_mpi: %s", xmesh_last_error());
        goto out;
    }
    int pfail = m->par_open(m->user, MPI_COMM_WORLD, ctx, &sl, strat, &ts) != 0;
    opened = 1;
    int pbad = lowest_failing(pfail, rank, size);
    if (pbad < size) {
        if (rank == pbad)
            xmp_cli_error("%s", xmp_last_error());
        goto out;
    }
    const int S = sl.nstages, me = ts.stage;
    xmp_gen_opts_t go;
    memset(&go, 0, sizeof go);
    go.delay_wgrad = o->delay_wgrad;
    /* ZB-H1's memory rule: deferred weight-gradient work of at most S microbatches. */
    go.max_pending_w = S;
    if (xmp_sched_generate(o->schedule, S, o->microbatches * o->grad_accum, ts.nedges, ts.sedges,
                           &go, &sched, err, sizeof err) != 0) {
        if (rank == 0)
            xmp_cli_error("--schedule %s: %s", xmp_sched_kind_name(o->schedule), err);
        goto out;
    }
    timed_ops_t tops;
    memset(&tops, 0, sizeof tops);
    tops.in = ts.ops;
    tops.defer_o = o->grad_clip > 0;
    xmp_driver_cfg_t dc;
    memset(&dc, 0, sizeof dc);
    dc.comm = MPI_COMM_WORLD;
    dc.ctx = ctx;
    dc.nstages = S;
    dc.meshes = ts.meshes;
    dc.nedges = ts.nedges;
    dc.edges = ts.edges;
    dc.sched = sched;
    dc.ops.user = &tops;
    dc.ops.forward = t_fwd;
    dc.ops.backward_input = t_bin;
    dc.ops.backward_weight = t_bw;
    dc.ops.reduce_grads = t_red;
    dc.ops.optimizer_step = t_opt;
    dc.ops.activation_bytes = ts.ops.activation_bytes ? t_act : NULL;
    dc.mode = o->comm;
    dc.trace = o->trace != NULL;
    if (xmp_driver_create(&dc, &drv, err, sizeof err) != XMESH_SUCCESS) {
        if (rank == 0)
            xmp_cli_error("pipeline driver: %s", err);
        goto out;
    }
    if (o->print_schedule && rank == 0) {
        char buf[256];
        xmp_stage_layout_format(&sl, buf, sizeof buf);
        printf("# layout %s, %d microbatches\n", buf, o->microbatches * o->grad_accum);
        for (int k = 0; ts.edge_names && k < ts.nedges; k++)
            printf("# edge %d: %s (stage %d -> %d)\n", k, ts.edge_names[k], ts.sedges[k].src,
                   ts.sedges[k].dst);
        xmp_sched_fprint(sched, stdout);
    }
    /* --resume: every other setting was checked; the saved blocks move into this layout */
    if (o->resume) {
        int lbad = lowest_failing(m->ckpt_load(m->user, MPI_COMM_WORLD, ctx) != 0, rank, size);
        if (lbad < size) {
            if (rank == lbad)
                xmp_cli_error("--resume: %s", xmp_last_error());
            goto out;
        }
        if (rank == 0)
            printf("resumed from '%s' at step %d\n", o->resume, o->start_step);
    }
    if (rank == 0) {
        if (log_open(&log, o, m, "parallel", ts.nparams, &sl, strat) != 0)
            goto out;
        have_log = 1;
    }
    double cf[XMP_MAX_STAGES], ci[XMP_MAX_STAGES], cw[XMP_MAX_STAGES];
    int have_costs = 0;
    for (int step = o->start_step; step < o->steps; step++) {
        float lr = xmp_train_lr(o, step);
        if (m->set_lr)
            m->set_lr(m->user, lr);
        int sbad = m->par_set_step && m->par_set_step(m->user, step) != 0;
        if (any_rank(sbad)) {
            if (sbad)
                xmp_cli_error("step %d: data: %s", step, xmp_last_error());
            break;
        }
        tops.f = tops.i = tops.w = tops.r = tops.o = 0;
        tops.nf = tops.ni = tops.nw = 0;
        double comm0 = xmp_comm_seconds();
        xmp_step_stats_t ss;
        xmesh_result_t r = xmp_driver_step(drv, &ss);
        int bad = r != XMESH_SUCCESS;
        if (any_rank(bad)) {
            if (bad)
                xmp_cli_error("step %d: %s", step, xmp_driver_error(drv));
            break;
        }
        double loss = 0, gnorm = 0;
        MPI_Allreduce(&ss.loss, &loss, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        if (tops.defer_o && clip_and_update(o, m, me, &tops, &gnorm) != 0) {
            if (rank == 0)
                xmp_cli_error("step %d: gradient clipping / optimizer failed", step);
            break;
        }
        double bubble[XMP_MAX_STAGES];
        int peak_mb[XMP_MAX_STAGES];
        int64_t peak_bytes[XMP_MAX_STAGES];
        double pf[XMP_MAX_STAGES], pi[XMP_MAX_STAGES], pw[XMP_MAX_STAGES];
        step_figures(S, me, &tops, &ss, pf, pi, pw, bubble, peak_mb, peak_bytes);
        double boxing = xmp_comm_seconds() - comm0;
        xmp_step_pipe_t sp = {tops.f + tops.i + tops.w + tops.r + tops.o - boxing,
                              boxing,
                              0,
                              S,
                              bubble,
                              peak_mb,
                              peak_bytes};
        /* Prediction of this step from the previous step's measured stage costs and xmesh's
         * predicted plan times (the first step has none). */
        if (have_costs) {
            xmp_sim_result_t res;
            memset(&res, 0, sizeof res);
            if (xmp_driver_predict(drv, cf, ci, cw, &res) == XMESH_SUCCESS && res.ok)
                sp.predicted_s = res.step_s;
            if (o->print_schedule && rank == 0 && step == 1) {
                printf("# simulated timeline (stage costs of step 0, xmesh plan predictions):\n");
                xmp_sim_render(sched, &res, 100, stdout);
            }
            xmp_sim_result_free(&res);
        }
        memcpy(cf, pf, sizeof cf);
        memcpy(ci, pi, sizeof ci);
        memcpy(cw, pw, sizeof cw);
        have_costs = 1;
        /* After the first step, place the deferred W work with the measured costs instead of
         * unit costs: regenerate the schedule and the driver. */
        if (step == o->start_step && o->delay_wgrad && o->steps > step + 1 && S > 1 &&
            replan(o, m, rank, S, &ts, cf, ci, cw, &dc, &sched, &drv) != 0)
            break;
        if (rank == 0) {
            log_record(&log, step, loss, ss.step_s, &sp, lr, gnorm);
            if (ref && step < XMP_CHECK_STEPS) {
                double rel = fabs(loss - ref[step]) / fmax(fabs(ref[step]), 1e-30);
                double tol = step < XMP_CHECK_TIGHT_STEPS ? 1e-5 : 1e-4;
                compared++;
                if (!(rel <= tol)) {
                    xmp_progress_finish(&log.bar);
                    fprintf(stderr,
                            "MISMATCH step %d: parallel loss %.9g serial %.9g (rel %.3g > %g)\n",
                            step, loss, ref[step], rel, tol);
                    mismatch++;
                } else if (o->no_progress) {
                    printf("step %d: parallel loss %.9g serial %.9g rel %.2e\n", step, loss,
                           ref[step], rel);
                }
            }
        }
        if (!isfinite(loss)) {
            if (rank == 0)
                xmp_cli_error("loss is %f at step %d", loss, step);
            break;
        }
        /* --save-dir: after the optimizer update of this step (step + 1 done) */
        int done = step + 1;
        if (o->save_dir && (done == o->steps || (o->save_every > 0 && done % o->save_every == 0))) {
            int vbad = lowest_failing(
                m->ckpt_save(m->user, MPI_COMM_WORLD, o->save_dir, done, o->keep) != 0, rank, size);
            if (vbad < size) {
                if (rank == vbad)
                    xmp_cli_error("--save-dir: step %d: %s", done, xmp_last_error());
                break;
            }
        }
        ok = step == o->steps - 1;
    }
    {
        double med = 0, mn = 0, mx = 0;
        int skip = 0;
        if (have_log)
            log_summary(&log, ok, &med, &mn, &mx, &skip);
        if (m->par_finish &&
            m->par_finish(m->user, ok, have_log && log.have_json ? &log.json : NULL) != 0)
            ok = 0;
        if (have_log && log_close(&log, med, mn, mx, skip) != 0)
            ok = 0;
        have_log = 0;
    }
    /* OK only after a full comparison of a complete run: every step ran, every compared step
     * matched, and as many steps were compared as asked for. */
    const int want = o->steps < XMP_CHECK_STEPS ? o->steps : XMP_CHECK_STEPS;
    if (rank == 0 && ref) {
        if (ok && !mismatch && compared == want)
            printf("check-serial: OK (0 mismatching of %d steps compared)\n", compared);
        else
            printf("check-serial: FAILED (%d mismatching of %d steps compared, %d wanted, run "
                   "%s)\n",
                   mismatch, compared, want, ok ? "complete" : "incomplete");
        if (compared != want)
            mismatch++;
    }
    if (o->trace && drv && xmp_driver_write_trace(drv, o->trace) != XMESH_SUCCESS && rank == 0)
        xmp_cli_error("--trace '%s': %s", o->trace, xmp_driver_error(drv));
    rc = any_rank(!(ok && !mismatch)) ? 1 : 0;
out:
    if (have_log) {
        double med, mn, mx;
        int skip;
        log_summary(&log, 0, &med, &mn, &mx, &skip);
        log_close(&log, med, mn, mx, skip);
    }
    xmp_driver_destroy(drv);
    if (opened && m->par_close)
        m->par_close(m->user);
    xmp_sched_destroy(sched);
    xmesh_ctx_destroy(ctx);
    free(ref);
    free(strat);
    MPI_Finalize();
    return rc;
}

int xmp_train_run(const xmp_train_opts_t *o, const xmp_train_model_t *m)
{
    return o->serial ? run_serial(o, m) : run_parallel(o, m);
}
