/*
 * The one training loop of xmesh-train (issue 20 item 5, issue 22 item 4): every model
 * (`gpt`, `utransformer`) is run by the same code through a model interface
 * (xmp_train_model_t); the model files and the model adapters (apps/cmd_gpt.c,
 * apps/train_utransformer.c) hold only the model.
 *
 * What the trainer owns, the same for every model:
 *   - the flags common to every model (xmp_train_opts_t, one table: xmp_train_parse_flag):
 *     --serial --steps --seed --schedule --comm --microbatches --delay-wgrad --print-schedule
 *     --check-serial --json --no-progress --log-steps --trace --cluster --blas-threads
 *     --mesh --dp --tp --stages --layout --stage-mesh --stage-dp --stage-tp
 *     --strategy --stage-strategy --print-strategy --lr --weight-decay --bench --warmup;
 *   - the stage layout built from those flags (xmp_train_layout) with the model's layer kinds;
 *   - the serial loop (also the --check-serial reference on rank 0), the parallel loop over the
 *     pipeline driver (pipe/driver.h): schedule generation, per-step statistics (loss summed
 *     over ranks, per-stage F/I/W seconds timed around the stage callbacks, boxing seconds,
 *     bubble, peak activations, the simulator's prediction), --delay-wgrad re-planning after
 *     step 0 (pipe/replan.h), --check-serial (1e-5 relative over steps 0-4, 1e-4 to step 19),
 *     the JSON step records, the progress bar, the Chrome trace;
 *   - one outcome rule: exit 0 only after every step ran on every rank and (with
 *     --check-serial) every compared step matched.
 *
 * Error convention: the model callbacks return 0 on success and -1 (or another nonzero value)
 * on failure after setting the detailed message with xmp_err() (nn/sbp.h; read back with
 * xmp_last_error()), as nn/ does; the trainer prints "xmesh-train <cmd>: <context>: <message>".
 * Collective callbacks must fail on every rank alike or leave the decision to the trainer,
 * which agrees over the world (MPI_Allreduce) before going on.
 */
#ifndef XMP_APPS_TRAINER_H
#define XMP_APPS_TRAINER_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "cli_util.h"
#include "models/stage_layout.h"
#include "nn/strategy.h"
#include "pipe/driver.h"
#include "sched/schedule.h"

/* Flags common to every model. */
typedef struct {
    int serial, steps, microbatches, schedule, comm, delay_wgrad, print_schedule, check_serial;
    int no_progress, log_steps, bench, bench_warmup, blas_threads;
    uint64_t seed;
    float lr, wd;
    /* the loop (issue 22 item 4) */
    int grad_accum;    /* batches per optimizer step (microbatches x grad_accum per step) */
    float grad_clip;   /* global gradient-norm clip (0: none) */
    int warmup;        /* linear learning-rate warm-up steps */
    int lr_decay;      /* XMP_LR_NONE, XMP_LR_COSINE, XMP_LR_LINEAR after the warm-up */
    float lr_min_frac; /* decay to lr * lr_min_frac at the last step */
    int val_every;     /* validation loss after every N-th step and the last (0: never) */
    int val_steps;     /* batches of the held-out split per validation */
    int sample_every;  /* text sampled after every N-th step and the last (0: never; GPT) */
    int sample_len;    /* tokens generated per sample */
    int sample_greedy; /* argmax instead of llm.c's seeded multinomial sampling */
    const char *json, *trace, *cluster;
    /* stage layout and meshes */
    const char *mesh, *layout, *stage_mesh, *stage_dp, *stage_tp;
    int dp, tp, stages;
    /* strategies (nn/strategy.h): one for every stage, or one per stage */
    const char *strategy, *stage_strategy;
    int print_strategy;
    /* virtual stages and memory (issue 23) */
    int virtual_stages;       /* model stages per rank group (0/1: none) */
    const char *stage_groups; /* stage -> group map text (sched/schedule.h parse_map) */
    int recompute;            /* xmp_recompute_t */
    const char *max_act;      /* --max-activation-bytes text */
    double max_act_bytes;     /* > 0: memory cap per rank group */
    int predict_memory;       /* --predict-memory: the model measures its per-microbatch
                               * activation bytes (as for a cap) so the simulator's per-step
                               * prediction includes the modelled peak per rank group */
    /* distributed checkpoints (docs/CHECKPOINT.md): --save-dir --save-every --keep --resume;
     * start_step is set by the trainer from the resumed checkpoint */
    const char *save_dir, *resume;
    int save_every, keep, start_step;
    /* --boundary-dtype f32|bf16|f16: the dtype stage-boundary activations and gradients travel
     * in (xmesh_dtype_t; XMESH_F32, the default, leaves the driver's default path) */
    int boundary_dtype;
    /* --inject-fail STEP:RANK (a test hook): rank RANK's first forward of 0-based step STEP
     * fails, as a model error would; -1: never */
    int inject_step, inject_rank;
} xmp_train_opts_t;

enum { XMP_LR_NONE = 0, XMP_LR_COSINE = 1, XMP_LR_LINEAR = 2 };

/* The learning rate of 0-based step (llm.c's schedule): (step+1)/warmup of lr during the
 * warm-up, then constant (none) or decayed to lr*lr_min_frac at the last step by a half cosine
 * or linearly. */
float xmp_train_lr(const xmp_train_opts_t *o, int step);

/* Defaults: 1 microbatch, 1f1b, broadcast, warmup 1, 1 BLAS thread; steps, seed and lr are the
 * model's (set them after this). */
void xmp_train_defaults(xmp_train_opts_t *o);
/* Keeps freed memory in this process from here on (glibc's mmap threshold up, trimming off;
 * XMESH_KEEP_FREED=0 or a GLIBC_TUNABLES naming glibc.malloc: not), called first by main;
 * xmp_train_keep_freed_active() says whether it took. */
void xmp_train_keep_freed(void);
int xmp_train_keep_freed_active(void);

/* Parses the common flag at argv[*i] (advancing *i past its value). Returns 1 when the flag is
 * a common one and was parsed, 0 when it is not a common flag (the model parses it), -1 on a bad
 * value (message printed). */
int xmp_train_parse_flag(int argc, char **argv, int *i, xmp_train_opts_t *o);
/* Checks the combination of the common flags after parsing (and sets XMESH_CLUSTER_FILE for
 * --cluster). -1 with a message printed. */
int xmp_train_check_flags(xmp_train_opts_t *o);
/* The usage lines of the common flags. */
void xmp_train_usage(void);

typedef struct xmp_train_model xmp_train_model_t;

/* What a model's parallel set-up hands to the trainer (all of it borrowed from the model's
 * state until par_close). */
typedef struct {
    int stage;                      /* this rank's stage, -1: none */
    xmp_stage_ops_t ops;            /* this rank's stage callbacks */
    int nedges;                     /* stage-graph edges */
    const xmp_edge_cfg_t *edges;    /* nedges */
    const xmp_sedge_t *sedges;      /* nedges */
    const xmp_stage_mesh_t *meshes; /* layout->nstages */
    const char *const *edge_names;  /* nedges or NULL: names for --print-schedule */
    int64_t nparams;                /* parameters of the whole model (JSON) */
    /* Virtual stages (layout->ngroups < nstages): per MODEL stage the callbacks of this rank's
     * stages (others zero), NULL otherwise; `stage` is then the group's lowest, `ops` its. */
    const xmp_stage_ops_t *stage_ops;
    /* Memory cap (--max-activation-bytes, --predict-memory): per model stage the bytes one
     * microbatch's activations hold (act), under block recomputation (ckpt), the fraction
     * selective keeps; NULL: the trainer measures them itself (probe steps before the first
     * step: needs par_set_recompute, par_set_val, par_release and the stages'
     * activation_bytes; docs/SCHEDULES.md "Memory cap in the trainer"), else the cap is
     * refused. */
    const double *act_bytes, *ckpt_bytes;
    double selective_keep;
} xmp_train_stages_t;

struct xmp_train_model {
    const char *name;     /* subcommand: "gpt", "utransformer" */
    const char *rate_key; /* JSON key of the throughput: "tokens_per_s", "images_per_s" */
    double per_step;      /* samples (tokens, images) per step, for the rate */
    void *user;

    /* Stage layout: the model's layer kinds (stage_layout.h) and fixed head/tail items. */
    const char *kinds;
    int fixed_head, fixed_tail;
    /* Built-in strategies (nn/strategy.h; user is passed, with the stage mesh's shape) and
     * their names for messages, and the check of a resolved strategy against the layers of
     * stage s (0, or -1 with err). */
    xmp_strategy_mesh_builtin_fn builtins;
    const char *builtin_names;
    int (*strategy_check)(void *user, const xmp_strategy_t *s, const xmp_stage_layout_t *sl,
                          int stage, char *err, size_t errlen);
    /* Model-specific checks of the layout (e.g. microbatch rows divisible by dp); 0 or -1
     * with err. Pure, the same on every rank. May be NULL. */
    int (*layout_check)(void *user, const xmp_stage_layout_t *sl, char *err, size_t errlen);

    /* The learning rate of the coming step (serial and parallel), before each step. */
    void (*set_lr)(void *user, float lr);

    /* Serial model: open (once per run; nparams for the JSON), one training step, close. Used
     * by --serial and by --check-serial on rank 0. One step: the step's batches (grad_accum of
     * them), forward, backward, with --grad-clip X the global gradient norm (written to
     * *grad_norm) and the gradients scaled by X/norm when norm > X, the update at the lr of
     * set_lr; *loss the mean loss. */
    int (*serial_open)(void *user, int64_t *nparams);
    int (*serial_step)(void *user, int step, double *loss, double *grad_norm);
    /* Validation: the mean loss of batch k of the held-out split, forward only. */
    int (*serial_val)(void *user, int k, double *loss);
    /* After a complete serial run: --save and the like (may be NULL). */
    int (*serial_finish)(void *user);
    void (*serial_close)(void *user);

    /* Parallel (collective over comm, every rank, also ranks in no stage): creates the stages
     * of layout sl with strategies strat[nstages] over ctx and fills *out. 0, or -1 (every
     * rank; a rank that failed locally has set xmp_err; the trainer agrees over the world
     * first only when the callback returns the same everywhere, so callbacks agree themselves
     * where their failure may be local). */
    /* `--strategy auto` (may be NULL: refused): collective over comm, after MPI is up and
     * before the layout is built; rewrites the layout, mesh, strategy, schedule and
     * microbatch fields of *o with the searched configuration. 0, or -1 with the message
     * printed on rank 0 (the same outcome on every rank). */
    int (*auto_layout)(void *user, MPI_Comm comm, xmp_train_opts_t *o);
    int (*par_open)(void *user, MPI_Comm comm, xmesh_ctx_t ctx, const xmp_stage_layout_t *sl,
                    const xmp_strategy_t *strat, xmp_train_stages_t *out);
    /* The recomputation mode the schedule uses (xmp_recompute_t; a memory cap may have raised
     * --recompute), every rank after par_open. May be NULL (then --recompute must be none). */
    void (*par_set_recompute)(void *user, int mode);
    /* Before each step, every rank: the step's data (batch) for step. 0 or -1 (xmp_err). */
    int (*par_set_step)(void *user, int step);
    /* Validation (parallel): before an evaluation step, every rank: batch k of the held-out
     * split (0 or -1 with xmp_err). The trainer then runs the driver's schedule with the
     * forwards only (backward, R and O skipped: no gradient, no update) and afterwards calls
     * par_release (stage ranks) to free what the forwards kept for the backward. */
    int (*par_set_val)(void *user, int k);
    void (*par_release)(void *user);
    /* Sampling (models that generate text; NULL: refused): a NUL-terminated text of
     * o->sample_len generated tokens into out (n bytes) on every rank, forwards only. eval ==
     * NULL: with the serial model; else through the stages, where eval(ctx) runs one
     * forwards-only step of the driver (collective; 0 or -1) after the model has set the
     * batch. Collective in the parallel case; 0 or -1 (xmp_err). */
    int (*sample)(void *user, int (*eval)(void *ctx), void *ctx, char *out, size_t n);
    /* Gradient clipping (parallel, stage ranks only, after R and before O, outside the
     * driver step): this rank's sum of squares of the reduced gradients with every distinct
     * element of the model counted once over the world (replicated blocks on one replica,
     * sharded ones by shard), and the scaling of the reduced gradients. */
    double (*grad_sumsq)(void *user);
    void (*grad_scale)(void *user, float scale);
    /* xmesh's predicted seconds of a boundary activation transfer for re-planning with the
     * given xmesh strategy (collective); NULL: the driver's mean over its activation plans. */
    double (*par_edge_seconds)(void *user, int xmesh_strategy);
    /* After the loop, every rank (collective): ok says the run completed; --save, memory
     * report. Writes summary JSON into j on rank 0 (j NULL elsewhere or without --json).
     * Returns 0 or -1 (message printed). May be NULL. */
    int (*par_finish)(void *user, int ok, xmp_json_t *json);
    void (*par_close)(void *user); /* collective */

    /* Distributed checkpoints (parallel runs; NULL: --save-dir / --resume are refused).
     * ckpt_open (--resume), collective, first thing after MPI_Init: opens the checkpoint dir,
     * applies its model configuration and optimizer settings to the model (the layer kinds
     * included) and to *o (lr, weight decay), and returns its step (steps done) in *step. 0 or
     * -1 (xmp_err; the trainer agrees over the world). ckpt_load, collective, after par_open and
     * every other check: loads the opened checkpoint into the stages (any layout) and closes
     * it. ckpt_save, collective, after the optimizer update of step - 1: saves `step` steps
     * done into dir, keeping the keep newest (0: all). */
    int (*ckpt_open)(void *user, MPI_Comm comm, const char *dir, xmp_train_opts_t *o,
                     int64_t *step);
    int (*ckpt_load)(void *user, MPI_Comm comm, xmesh_ctx_t ctx);
    int (*ckpt_save)(void *user, MPI_Comm comm, const char *dir, int64_t step, int keep);

    /* JSON: the "model" and "train" objects of the header (keys inside the open object). */
    void (*json_model)(void *user, xmp_json_t *json);
    void (*json_train)(void *user, xmp_json_t *json);
    /* One line summary after the run, e.g. "B=4 T=64" (written into buf). */
    void (*describe)(void *user, char *buf, size_t n);
};

/* Sets the trainer's last error (xmp_err, nn/sbp.h) and returns -1: `return xmp_train_fail(..)`
 * in model callbacks. */
int xmp_train_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Runs the command: --serial (one process) or the MPI pipeline. Returns the exit code. */
int xmp_train_run(const xmp_train_opts_t *o, const xmp_train_model_t *m);

#endif /* XMP_APPS_TRAINER_H */
