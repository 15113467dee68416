/*
 * Private to the trainer's files (apps/trainer*.c), never to a model adapter: the records, the
 * serial loop and the pieces of the parallel loop. trainer.h is the interface.
 */
#ifndef XMP_APPS_TRAINER_PRIV_H
#define XMP_APPS_TRAINER_PRIV_H

#include "trainer.h"

/* Steps compared by --check-serial and their tolerances (relative). */
#define XMP_CHECK_STEPS 20
#define XMP_CHECK_TIGHT_STEPS 5

/* trainer.c */
int xmp_tr_sample_due(const xmp_train_opts_t *o, int step);
int xmp_tr_val_due(const xmp_train_opts_t *o, int step);
int xmp_tr_layout(const xmp_train_opts_t *o, const xmp_train_model_t *m, int size,
                  xmp_stage_layout_t *sl, char *err, size_t errlen);
int xmp_tr_strategies(const xmp_train_opts_t *o, const xmp_train_model_t *m,
                      const xmp_stage_layout_t *sl, xmp_strategy_t *out, char *err, size_t errlen);

/* trainer_log.c */
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
    int have_bbytes; /* parallel: the driver's boundary bytes per step */
    int64_t bbytes_wire, bbytes_xhost;
    /* parallel: the simulator's prediction of the step being logged (npred == 0: none):
     * mean bubble over rank groups, modelled peak activation bytes per rank group */
    int npred, pred_have_mem;
    double pred_bubble, pred_peak[XMP_MAX_STAGES];
} train_log_t;

/* Pipeline section only (sl != NULL): the stage graph's nedges edges and, when plan_s is not
 * NULL, xmesh's predicted seconds of one transfer per plan (2*edge+dir). */
typedef struct {
    const xmp_sedge_t *sedges;
    int nedges;
    const double *plan_s;
} log_graph_t;

int xmp_tr_log_open(train_log_t *s, const xmp_train_opts_t *o, const xmp_train_model_t *m,
                    const char *mode, int64_t nparams, const xmp_stage_layout_t *sl,
                    const xmp_strategy_t *strat, const log_graph_t *graph);
void xmp_tr_log_record(train_log_t *s, int step, double loss, double seconds,
                       const xmp_step_pipe_t *pipe, float lr, double grad_norm, double val,
                       const char *sample);
void xmp_tr_log_summary(train_log_t *s, int ok, double *med, double *mn, double *mx, int *skip);
int xmp_tr_log_close(train_log_t *s, double med, double mn, double mx, int skip);

/* trainer_serial.c */
int xmp_tr_run_serial(const xmp_train_opts_t *o, const xmp_train_model_t *m);
int xmp_tr_serial_losses(const xmp_train_opts_t *o, const xmp_train_model_t *m, int steps,
                         double *out, double *vout, double *gout, char *sout);

/* trainer_stage.c */
/* Times the stage callbacks: per-microbatch F, I, W seconds for the simulator and re-planning,
 * and the step's compute time. */
typedef struct {
    xmp_stage_ops_t in;
    double f, i, w, r, o;
    double comm; /* of those seconds, the ones in nn/ collectives (xmp_comm_seconds) */
    int nf, ni, nw;
    int defer_o; /* --grad-clip: O runs after the driver step, once the global norm is known */
    int eval;    /* validation: forwards only (the gradients sent are not used) */
    int probe;   /* activation probe: record the bytes each forward leaves held */
    int64_t probe_max;
    const xmp_stage_ops_t *probe_src; /* whose activation_bytes to read (NULL: in) */
    int no_update;                    /* probe: backward without R and O */
    int fail_now;                     /* --inject-fail: the next forward fails */
} timed_ops_t;

/* xmp_tr_eval_step's argument: one forwards-only driver step (sampling); the batch is the
 * model's. */
typedef struct {
    const xmp_train_model_t *m;
    xmp_driver_t *drv;
    timed_ops_t *t, *vt;
    int me, nv;
} eval_ctx_t;

int xmp_tr_abort_on_notice(void *user, char *msg, size_t len);
int xmp_tr_any_rank(int bad);
int xmp_tr_clip_and_update(const xmp_train_opts_t *o, const xmp_train_model_t *m, int me,
                           timed_ops_t *t, timed_ops_t *vt, int nv, double *norm);
int xmp_tr_eval_step(void *u);
int xmp_tr_lowest_failing(int fail, int rank, int size);
int xmp_tr_par_val(const xmp_train_opts_t *o, const xmp_train_model_t *m, int rank, int me,
                   xmp_driver_t *drv, timed_ops_t *t, timed_ops_t *vt, int nv, double *out);
int xmp_tr_probe_act_bytes(const xmp_train_model_t *m, int rank, int me, int S, xmp_driver_t *drv,
                           timed_ops_t *t, timed_ops_t *vt, const int *vstage, int nv, double *act,
                           double *ckpt, double *keep);
int xmp_tr_probe_base_bytes(const xmp_train_model_t *m, int rank, int me, int S, int ngroups,
                            const int *group, xmp_driver_t *drv, const xmp_schedule_t *sched,
                            timed_ops_t *t, timed_ops_t *vt, int nv, const double *act,
                            const double *ckpt, double keep, double *base);
void xmp_tr_step_figures(int S, int me, const timed_ops_t *t, const xmp_step_stats_t *ss,
                         double *cf, double *ci, double *cw, double *bubble, int *peak_mb,
                         int64_t *peak_bytes, double *xcpu, double faults, double *xfaults,
                         double cpu, double *xcpu_all, const timed_ops_t *vt, const int *vstage,
                         int nv);
int xmp_tr_step_stopped(int bad, const char *why, int rank);
int64_t xmp_tr_t_act(void *u);
int xmp_tr_t_bin(void *u, int mb, const void *const *go, void *const *gi);
int xmp_tr_t_bw(void *u, int mb);
int xmp_tr_t_fwd(void *u, int mb, const void *const *in, void *const *out, double *loss);
int xmp_tr_t_opt(void *u);
int xmp_tr_t_red(void *u);
void xmp_tr_t_setp(void *u, void (*fn)(void *arg), void *arg);
void xmp_tr_usage_now(double *faults, double *cpu);
void xmp_tr_world_allreduce(const void *sbuf, void *rbuf, int count, MPI_Datatype ty, MPI_Op op,
                            const char *what);
int xmp_tr_replan(const xmp_train_opts_t *o, const xmp_train_model_t *m, int rank, int S,
                  const xmp_train_stages_t *ts, const double *base, const double *f,
                  const double *fi, const double *fw, xmp_driver_cfg_t *dc, xmp_schedule_t **sched,
                  xmp_driver_t **drv);

/* trainer_par.c */
int xmp_tr_run_parallel(const xmp_train_opts_t *oin, const xmp_train_model_t *m);

#endif /* XMP_APPS_TRAINER_PRIV_H */
