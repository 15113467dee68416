/* The trainer's stages under the pipeline driver: the timed stage callbacks, failures and the
 * world's agreement on them, re-planning, gradient clipping, validation and sampling through
 * the stages, the activation probes, the per-step figures. */
#include "trainer_priv.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "nn/overlap.h"
#include "nn/sbp.h"
#include "pipe/replan.h"

/* xmesh's abort check (xmesh_ctx_set_abort_check): a failure notice of any rank (xmp_fail),
 * this one's included, ends the transfers this rank waits on, which that rank will never
 * complete, at once instead of at XMESH_TIMEOUT_S. Polling for notices also answers the
 * liveness pings of ranks that diagnose a timeout (nn/coll.h). */
int xmp_tr_abort_on_notice(void *user, char *msg, size_t len)
{
    (void)user;
    char notice[XMP_NOTICE_BYTES];
    int fr = xmp_failed_rank(notice, sizeof notice), c = xmp_failure_culprit();
    if (fr < 0)
        return 0;
    if (c >= 0 && c != fr)
        snprintf(msg, len, "rank %d does not answer (found by rank %d: %s)", c, fr, notice);
    else
        snprintf(msg, len, "rank %d failed (%s)", fr, notice);
    return 1;
}

/* A stage callback failed here. Unless it failed because another rank did (a failure notice
 * arrived first), tell every rank now, blaming the rank that does not answer if one does not
 * (xmp_fail_here): the driver ends its step with collectives over every rank, so the ranks
 * waiting for this one must learn it from the notice, not at XMESH_TIMEOUT_S. Returns rc. */
static int cb_done(int rc)
{
    if (rc != 0)
        (void)xmp_fail_here(MPI_COMM_WORLD, xmp_last_error());
    return rc;
}

/* One line on stderr saying why this rank stops, from the failure now known (nn/coll.h): its
 * own error (why), or the rank that does not answer, or the rank that failed. */
static void report_stop(int rank, const char *why)
{
    char notice[XMP_NOTICE_BYTES];
    int fr = xmp_failed_rank(notice, sizeof notice), c = xmp_failure_culprit();
    if (fr < 0 || (fr == rank && c == rank))
        xmp_cli_error("rank %d: %s", rank, why);
    else if (fr == rank)
        xmp_cli_error("rank %d: stopped: rank %d does not answer (%s)", rank, c, why);
    else if (c >= 0 && c != fr)
        xmp_cli_error("rank %d: stopped: rank %d does not answer (found by rank %d: %s)", rank, c,
                      fr, notice);
    else
        xmp_cli_error("rank %d: stopped: rank %d failed (%s)", rank, fr, notice);
}

/* A collective of the trainer's own control flow failed (a rank does not answer, or failed):
 * say why and end the job (never returns). */
static void stop_job(const char *why)
{
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    char w[768];
    snprintf(w, sizeof w, "%s", why);
    (void)xmp_fail_here(MPI_COMM_WORLD, w);
    report_stop(rank, w);
    xmp_end_job(1);
}

/* MPI_Allreduce over the world with the engine's deadline (sbuf may be MPI_IN_PLACE); on
 * failure the job ends here (stop_job). Collective. */
void xmp_tr_world_allreduce(const void *sbuf, void *rbuf, int count, MPI_Datatype ty, MPI_Op op,
                            const char *what)
{
    int es = 0;
    MPI_Type_size(ty, &es);
    if (sbuf != MPI_IN_PLACE)
        memmove(rbuf, sbuf, (size_t)count * (size_t)es);
    if (xmp_agree(rbuf, count, ty, op, MPI_COMM_WORLD, what) != XMESH_SUCCESS)
        stop_job(xmp_last_error());
}

int xmp_tr_t_fwd(void *u, int mb, const void *const *in, void *const *out, double *loss)
{
    timed_ops_t *t = u;
    /* virtual stages: a model whose allocation counter is per rank answers on one chunk */
    const xmp_stage_ops_t *src = t->probe_src ? t->probe_src : &t->in;
    int64_t a0 = t->probe && src->activation_bytes ? src->activation_bytes(src->user) : 0;
    if (t->fail_now) {
        t->fail_now = 0;
        xmp_err(XMESH_ERR_INVALID_USAGE,
                "forward of microbatch %d: failure injected by "
                "--inject-fail",
                mb);
        return cb_done(-1);
    }
    double t0 = MPI_Wtime();
    double c0 = xmp_comm_seconds();
    int rc = t->in.forward(t->in.user, mb, in, out, loss);
    t->f += MPI_Wtime() - t0;
    t->comm += xmp_comm_seconds() - c0;
    t->nf++;
    if (t->probe && src->activation_bytes) {
        int64_t held = src->activation_bytes(src->user) - a0;
        if (held > t->probe_max)
            t->probe_max = held;
    }
    return cb_done(rc);
}
int xmp_tr_t_bin(void *u, int mb, const void *const *go, void *const *gi)
{
    timed_ops_t *t = u;
    if (t->eval)
        return 0;
    double t0 = MPI_Wtime();
    double c0 = xmp_comm_seconds();
    int rc = t->in.backward_input(t->in.user, mb, go, gi);
    t->i += MPI_Wtime() - t0;
    t->comm += xmp_comm_seconds() - c0;
    t->ni++;
    return cb_done(rc);
}
int xmp_tr_t_bw(void *u, int mb)
{
    timed_ops_t *t = u;
    if (t->eval)
        return 0;
    double t0 = MPI_Wtime();
    double c0 = xmp_comm_seconds();
    int rc = t->in.backward_weight(t->in.user, mb);
    t->w += MPI_Wtime() - t0;
    t->comm += xmp_comm_seconds() - c0;
    t->nw++;
    return cb_done(rc);
}
int xmp_tr_t_red(void *u)
{
    timed_ops_t *t = u;
    if (t->eval || t->no_update)
        return 0;
    double t0 = MPI_Wtime();
    double c0 = xmp_comm_seconds();
    int rc = t->in.reduce_grads ? t->in.reduce_grads(t->in.user) : 0;
    t->r += MPI_Wtime() - t0;
    t->comm += xmp_comm_seconds() - c0;
    return cb_done(rc);
}
int xmp_tr_t_opt(void *u)
{
    timed_ops_t *t = u;
    if (t->defer_o || t->eval || t->no_update)
        return 0;
    double t0 = MPI_Wtime();
    double c0 = xmp_comm_seconds();
    int rc = t->in.optimizer_step ? t->in.optimizer_step(t->in.user) : 0;
    t->o += MPI_Wtime() - t0;
    t->comm += xmp_comm_seconds() - c0;
    return cb_done(rc);
}
void xmp_tr_t_setp(void *u, void (*fn)(void *arg), void *arg)
{
    timed_ops_t *t = u;
    if (t->in.set_progress)
        t->in.set_progress(t->in.user, fn, arg);
}
int64_t xmp_tr_t_act(void *u)
{
    timed_ops_t *t = u;
    return t->in.activation_bytes ? t->in.activation_bytes(t->in.user) : 0;
}

/* The lowest rank of the world that failed, size when none (collective). */
int xmp_tr_lowest_failing(int fail, int rank, int size)
{
    int r = fail ? rank : size;
    xmp_tr_world_allreduce(MPI_IN_PLACE, &r, 1, MPI_INT, MPI_MIN, "lowest failing rank");
    return r;
}

/* 1 when any rank of the world says bad (collective). */
int xmp_tr_any_rank(int bad)
{
    int any = 0;
    xmp_tr_world_allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, "any rank failed");
    return any;
}

/* After a step that may have failed here (bad, why) while the other ranks still wait in its
 * collectives and transfers, or failed elsewhere. A rank whose step failed has posted a notice
 * to every rank (the driver and cb_done: xmp_fail_here, which names a rank that does not
 * answer), so the others' waits end at once naming it. Every rank then agrees on the outcome
 * with the deadline and, on a failure anywhere, prints one line naming the rank at its root
 * (report_stop). Returns 1: stop. Collective. */
int xmp_tr_step_stopped(int bad, const char *why, int rank)
{
    if (bad)
        (void)xmp_fail_here(MPI_COMM_WORLD, why);
    int flag = bad;
    if (!bad &&
        xmp_agree(&flag, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD, "step outcome") == XMESH_SUCCESS &&
        !flag)
        return 0;
    if (!bad) { /* the agreement itself failed: its message says why */
        char w[768];
        snprintf(w, sizeof w, "%s", xmp_last_error());
        (void)xmp_fail_here(MPI_COMM_WORLD, w);
        report_stop(rank, w);
        return 1;
    }
    report_stop(rank, why);
    return 1;
}

/* Re-plans (pipe/replan.h) with the measured per-microbatch costs and xmesh's predicted boundary
 * transfer time, so that the W actions fill the waits the transfers cause. Collective. */
int xmp_tr_replan(const xmp_train_opts_t *o, const xmp_train_model_t *m, int rank, int S,
                  const xmp_train_stages_t *ts, const double *base, const double *f,
                  const double *fi, const double *fw, xmp_driver_cfg_t *dc, xmp_schedule_t **sched,
                  xmp_driver_t **drv)
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
    xmp_replan_t rp;
    memset(&rp, 0, sizeof rp);
    rp.kind = o->schedule;
    rp.nmb = o->microbatches * o->grad_accum;
    rp.nedges = ts->nedges;
    rp.sedges = ts->sedges;
    rp.f = f;
    rp.i = fi;
    rp.w = fw;
    rp.xfer = o->comm == XMP_COMM_SIGNAL ? 0 : x;
    rp.print = o->print_schedule;
    /* the memory cap holds for the re-planned schedule too */
    if (o->max_act_bytes > 0) {
        rp.max_act_bytes = o->max_act_bytes;
        rp.act_bytes = ts->act_bytes;
        rp.ckpt_bytes = ts->ckpt_bytes;
        rp.base_bytes = base;
        rp.selective_keep = ts->selective_keep;
    }
    if (xmp_pipe_replan(&rp, dc, sched, drv) != XMESH_SUCCESS) {
        if (rank == 0)
            xmp_cli_error("%s", xmp_last_error());
        return -1;
    }
    /* a cap may have moved the recomputation mode */
    if (m->par_set_recompute)
        m->par_set_recompute(m->user, (*sched)->recompute);
    return 0;
}

/* --grad-clip, after the driver step (R done, O deferred): the global gradient norm over every
 * stage and rank (each distinct element once: one all-reduce over the world), the reduced
 * gradients scaled by clip/norm when the norm exceeds clip, then the stage's O. Collective. */
int xmp_tr_clip_and_update(const xmp_train_opts_t *o, const xmp_train_model_t *m, int me,
                           timed_ops_t *t, timed_ops_t *vt, int nv, double *norm)
{
    double ss = me >= 0 && m->grad_sumsq ? m->grad_sumsq(m->user) : 0, all = 0;
    xmp_tr_world_allreduce(&ss, &all, 1, MPI_DOUBLE, MPI_SUM, "gradient norm");
    *norm = sqrt(all);
    int bad = 0;
    if (me >= 0) {
        if (*norm > o->grad_clip && m->grad_scale)
            m->grad_scale(m->user, (float)(o->grad_clip / *norm));
        /* virtual stages: every chunk of the rank its own update (each chunk's O) */
        for (int k = nv ? 0 : -1; k < nv; k++) {
            timed_ops_t *q = k < 0 ? t : &vt[k];
            double t0 = MPI_Wtime(), c0 = xmp_comm_seconds();
            bad |= q->in.optimizer_step ? q->in.optimizer_step(q->in.user) != 0 : 0;
            q->o += MPI_Wtime() - t0;
            q->comm += xmp_comm_seconds() - c0;
        }
    }
    return xmp_tr_any_rank(bad) ? -1 : 0;
}

/* Forwards only (validation, sampling) on the rank's stage wrapper and, with virtual stages,
 * on each chunk's. */
static void set_eval(timed_ops_t *t, timed_ops_t *vt, int nv, int on)
{
    t->eval = on;
    for (int k = 0; k < nv; k++)
        vt[k].eval = on;
}

/* Reads (and so restarts) the model's measured activation peak after forwards-only steps, so
 * what they held does not show in the next training step's peak. */
static void act_reset(timed_ops_t *t, timed_ops_t *vt, int nv)
{
    const xmp_stage_ops_t *q = nv ? &vt[0].in : &t->in;
    if (q->activation_bytes)
        (void)q->activation_bytes(q->user);
}

int xmp_tr_eval_step(void *u)
{
    eval_ctx_t *e = u;
    xmp_step_stats_t ss;
    set_eval(e->t, e->vt, e->nv, 1);
    int bad = xmp_driver_step(e->drv, &ss) != XMESH_SUCCESS;
    set_eval(e->t, e->vt, e->nv, 0);
    if (e->me >= 0) {
        e->m->par_release(e->m->user);
        act_reset(e->t, e->vt, e->nv);
    }
    if (bad)
        xmp_train_fail("forwards-only step: %s", xmp_driver_error(e->drv));
    return xmp_tr_any_rank(bad) ? -1 : 0;
}

/* Validation through the stages: --val-steps driver steps of forwards only on the held-out
 * split; the mean of their losses (summed over ranks). Collective; -1 on failure (printed). */
int xmp_tr_par_val(const xmp_train_opts_t *o, const xmp_train_model_t *m, int rank, int me,
                   xmp_driver_t *drv, timed_ops_t *t, timed_ops_t *vt, int nv, double *out)
{
    double sum = 0;
    int rc = 0;
    if (!m->par_set_val || !m->par_release) {
        if (rank == 0)
            xmp_cli_error("--val-every: the %s model has no validation split", m->name);
        return -1;
    }
    set_eval(t, vt, nv, 1);
    for (int k = 0; k < o->val_steps && rc == 0; k++) {
        int bad = m->par_set_val(m->user, k) != 0;
        if (xmp_tr_any_rank(bad)) {
            if (bad)
                xmp_cli_error("validation batch %d: %s", k, xmp_last_error());
            rc = -1;
            break;
        }
        xmp_step_stats_t ss;
        bad = xmp_driver_step(drv, &ss) != XMESH_SUCCESS;
        if (me >= 0) {
            m->par_release(m->user);
            act_reset(t, vt, nv);
        }
        if (xmp_tr_any_rank(bad)) {
            if (bad)
                xmp_cli_error("validation step %d: %s", k, xmp_driver_error(drv));
            rc = -1;
            break;
        }
        double l = 0;
        xmp_tr_world_allreduce(&ss.loss, &l, 1, MPI_DOUBLE, MPI_SUM, "validation loss");
        sum += l;
    }
    set_eval(t, vt, nv, 0);
    *out = sum / o->val_steps;
    return rc;
}

/* The rest of the measured peak: one training step of the provisional schedule on validation
 * batch 0 with backward but without R and O (the gradients it accumulated are scaled to zero
 * after it, so the next step's accumulation is bit for bit the same), its measured peak per
 * group against the memory model's (act, ckpt, keep) for that schedule; base[g] = the
 * difference (>= 0): gradient accumulators and backward temporaries the model does not count.
 * Collective; 0 or -1 (printed on rank 0). Models without grad_scale: base stays 0. */
int xmp_tr_probe_base_bytes(const xmp_train_model_t *m, int rank, int me, int S, int ngroups,
                            const int *group, xmp_driver_t *drv, const xmp_schedule_t *sched,
                            timed_ops_t *t, timed_ops_t *vt, int nv, const double *act,
                            const double *ckpt, double keep, double *base)
{
    memset(base, 0, sizeof(double) * (size_t)ngroups);
    if (!m->grad_scale)
        return 0;
    m->par_set_recompute(m->user, sched->recompute);
    int bad = m->par_set_val(m->user, 0) != 0;
    if (xmp_tr_any_rank(bad)) {
        if (rank == 0)
            xmp_cli_error("memory probe: batch: %s", xmp_last_error());
        return -1;
    }
    t->no_update = 1;
    for (int k = 0; k < nv; k++)
        vt[k].no_update = 1;
    act_reset(t, vt, nv);
    xmp_step_stats_t ss;
    memset(&ss, 0, sizeof ss);
    bad = xmp_driver_step(drv, &ss) != XMESH_SUCCESS;
    t->no_update = 0;
    for (int k = 0; k < nv; k++)
        vt[k].no_update = 0;
    if (me >= 0) {
        m->grad_scale(m->user, 0.0f);
        m->par_release(m->user);
        act_reset(t, vt, nv);
    }
    if (xmp_tr_any_rank(bad)) {
        if (bad)
            xmp_cli_error("memory probe: step: %s", xmp_driver_error(drv));
        return -1;
    }
    double meas[XMP_MAX_STAGES], all[XMP_MAX_STAGES];
    memset(meas, 0, sizeof meas);
    if (me >= 0)
        meas[group[me]] = (double)ss.peak_act_bytes;
    xmp_tr_world_allreduce(meas, all, ngroups, MPI_DOUBLE, MPI_MAX, "memory probe peaks");
    double one[3 * XMP_MAX_STAGES];
    for (int k = 0; k < 3 * S; k++)
        one[k] = 1.0;
    xmp_sim_costs_t sc;
    xmp_sim_result_t res;
    memset(&sc, 0, sizeof sc);
    memset(&res, 0, sizeof res);
    sc.f = one;
    sc.i = one + S;
    sc.w = one + 2 * S;
    sc.act_bytes = act;
    sc.ckpt_bytes = ckpt;
    sc.selective_keep = keep;
    int ok = xmp_driver_predict_costs(drv, &sc, &res) == XMESH_SUCCESS && res.ok &&
             res.nstages == ngroups;
    for (int g = 0; ok && g < ngroups; g++)
        base[g] = all[g] > res.peak_bytes[g] ? all[g] - res.peak_bytes[g] : 0;
    xmp_sim_result_free(&res);
    if (!ok && rank == 0)
        xmp_cli_error("memory probe: simulating the probe schedule failed");
    return ok ? 0 : -1;
}

/* The memory model of a model that does not measure itself (no act_bytes from par_open):
 * forwards-only driver steps on validation batch 0, one per recomputation mode (none, block,
 * selective), each recording per model stage the most bytes one microbatch's forward leaves
 * held (the stage's activation_bytes after minus before the forward; max over the stage's
 * ranks). act[s] = bytes without recomputation, ckpt[s] under block recomputation, *keep the
 * largest selective / none ratio. Collective; 0, or -1 (message printed on rank 0). */
int xmp_tr_probe_act_bytes(const xmp_train_model_t *m, int rank, int me, int S, xmp_driver_t *drv,
                           timed_ops_t *t, timed_ops_t *vt, const int *vstage, int nv, double *act,
                           double *ckpt, double *keep)
{
    static const int modes[3] = {XMP_RECOMPUTE_NONE, XMP_RECOMPUTE_BLOCK, XMP_RECOMPUTE_SELECTIVE};
    double got[3][XMP_MAX_STAGES];
    for (int p = 0; p < 3; p++) {
        double loc[XMP_MAX_STAGES];
        memset(loc, 0, sizeof loc);
        m->par_set_recompute(m->user, modes[p]);
        int bad = m->par_set_val(m->user, 0) != 0;
        if (xmp_tr_any_rank(bad)) {
            if (rank == 0)
                xmp_cli_error("memory probe: batch: %s", xmp_last_error());
            return -1;
        }
        t->probe = 1;
        t->probe_max = 0;
        for (int k = 0; k < nv; k++) {
            vt[k].probe = 1;
            vt[k].probe_max = 0;
            vt[k].probe_src = &vt[0].in; /* the rank's first chunk (see xmp_tr_t_fwd) */
        }
        set_eval(t, vt, nv, 1);
        xmp_step_stats_t ss;
        bad = xmp_driver_step(drv, &ss) != XMESH_SUCCESS;
        set_eval(t, vt, nv, 0);
        if (me >= 0) {
            m->par_release(m->user);
            act_reset(t, vt, nv);
        }
        t->probe = 0;
        for (int k = 0; k < nv; k++) {
            vt[k].probe = 0;
            vt[k].probe_src = NULL;
        }
        if (xmp_tr_any_rank(bad)) {
            if (bad)
                xmp_cli_error("memory probe: step: %s", xmp_driver_error(drv));
            return -1;
        }
        for (int k = nv ? 0 : -1; k < nv && me >= 0; k++)
            loc[k < 0 ? me : vstage[k]] = (double)(k < 0 ? t : &vt[k])->probe_max;
        xmp_tr_world_allreduce(loc, got[p], S, MPI_DOUBLE, MPI_MAX, "memory probe");
    }
    *keep = 0;
    for (int s = 0; s < S; s++) {
        act[s] = got[0][s];
        ckpt[s] = got[1][s] < got[0][s] ? got[1][s] : got[0][s];
        double f = got[0][s] > 0 ? got[2][s] / got[0][s] : 0;
        if (f > *keep)
            *keep = f < 1 ? f : 1;
    }
    for (int s = 0; s < S; s++)
        if (!(act[s] > 0)) {
            if (rank == 0)
                xmp_cli_error("memory probe: stage %d holds no measured activations "
                              "(the model does not report them)",
                              s);
            return -1;
        }
    return 0;
}

/* Page faults (minor and major) and CPU seconds (user + system) of this process so far, every
 * thread. */
void xmp_tr_usage_now(double *faults, double *cpu)
{
    struct rusage u;
    *faults = *cpu = 0;
    if (getrusage(RUSAGE_SELF, &u) != 0)
        return;
    *faults = (double)u.ru_minflt + (double)u.ru_majflt;
    *cpu = (double)u.ru_utime.tv_sec + 1e-6 * (double)u.ru_utime.tv_usec +
           (double)u.ru_stime.tv_sec + 1e-6 * (double)u.ru_stime.tv_usec;
}

/* Per-step figures over the world: per stage the max over its ranks of the per-microbatch F, I
 * and W seconds, the idle fraction, the peak microbatches and bytes. Collective. */
void xmp_tr_step_figures(int S, int me, const timed_ops_t *t, const xmp_step_stats_t *ss,
                         double *cf, double *ci, double *cw, double *bubble, int *peak_mb,
                         int64_t *peak_bytes, double *xcpu, double faults, double *xfaults,
                         double cpu, double *xcpu_all, const timed_ops_t *vt, const int *vstage,
                         int nv)
{
    double loc[8 * XMP_MAX_STAGES], all[8 * XMP_MAX_STAGES];
    int64_t lp[XMP_MAX_STAGES], ap[XMP_MAX_STAGES];
    memset(loc, 0, sizeof loc);
    memset(lp, 0, sizeof lp);
    /* virtual stages: each of this rank's stages its own costs; bubble and peaks the group's */
    for (int k = nv ? 0 : -1; k < nv && me >= 0; k++) {
        int s = k < 0 ? me : vstage[k];
        const timed_ops_t *q = k < 0 ? t : &vt[k];
        loc[s] = q->nf ? q->f / q->nf : 0;
        loc[S + s] = q->ni ? q->i / q->ni : 0;
        loc[2 * S + s] = q->nw ? q->w / q->nw : 0;
        loc[3 * S + s] = ss->bubble;
        loc[4 * S + s] = ss->peak_act_mb;
        loc[5 * S + s] = ss->xmesh_cpu_s;
        loc[6 * S + s] = faults;
        loc[7 * S + s] = cpu;
        lp[s] = ss->peak_act_bytes;
    }
    xmp_tr_world_allreduce(loc, all, 8 * S, MPI_DOUBLE, MPI_MAX, "step statistics");
    xmp_tr_world_allreduce(lp, ap, S, MPI_INT64_T, MPI_MAX, "step statistics");
    for (int k = 0; k < S; k++) {
        cf[k] = all[k];
        ci[k] = all[S + k];
        cw[k] = all[2 * S + k];
        bubble[k] = all[3 * S + k];
        peak_mb[k] = (int)all[4 * S + k];
        xcpu[k] = all[5 * S + k];
        xfaults[k] = all[6 * S + k];
        xcpu_all[k] = all[7 * S + k];
        peak_bytes[k] = ap[k];
    }
}
