/* The trainer's parallel run: the stages under the pipeline driver, in phases (set-up, the
 * activation probe, the steps, validation and sampling, saving, the outcome) over one run
 * state. The pieces the phases call (timed callbacks, failures, probes) are in
 * trainer_stage.c. */
#include "trainer_priv.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/overlap.h"
#include "nn/sbp.h"

/* Everything one parallel run holds. Owned by xmp_tr_run_parallel; par_close frees it. The
 * driver configuration points into it (dc.ops.user = &tops, vops[s].user = &vt[k]), so it never
 * moves. */
typedef struct {
    const xmp_train_model_t *m;
    xmp_train_opts_t opts, *o; /* o = &opts: the caller's, quiet on rank != 0 */
    int rank, size;
    char err[1024];
    xmp_stage_layout_t sl;
    xmp_strategy_t *strat; /* one per stage */
    /* --check-serial (rank 0): the serial reference's losses, validation losses, gradient
     * norms and samples per step */
    double *ref, *vref, *gref;
    char *sref;
    char *text; /* the last sample */
    xmesh_ctx_t ctx;
    xmp_train_stages_t ts;
    int opened; /* m->par_open was called */
    int S, me, virt, probe;
    xmp_gen_opts_t go;
    xmp_schedule_t *sched;
    timed_ops_t tops;
    xmp_driver_cfg_t dc;
    /* virtual stages: one timed wrapper per model stage of this rank */
    timed_ops_t vt[XMP_MAX_STAGES];
    xmp_stage_ops_t vops[XMP_MAX_STAGES];
    int vstage[XMP_MAX_STAGES], nv;
    xmp_driver_t *drv;
    /* the activation probe's figures (have_base: measured) */
    double pact[XMP_MAX_STAGES], pckpt[XMP_MAX_STAGES], pkeep, pbase[XMP_MAX_STAGES];
    int have_base;
    train_log_t log;
    int have_log;
    /* the previous step's measured stage costs (have_costs: one step ran) */
    double cf[XMP_MAX_STAGES], ci[XMP_MAX_STAGES], cw[XMP_MAX_STAGES];
    int have_costs;
    int ok, mismatch, compared, step_failed;
} par_run_t;

/* One step's figures, from the driver step to its record. sp points into the arrays. */
typedef struct {
    float lr;
    double loss, gnorm, val;
    int sampled;
    xmp_step_stats_t ss;
    xmp_step_pipe_t sp;
    xmp_host_cpu_t hcd;
    double bubble[XMP_MAX_STAGES];
    int peak_mb[XMP_MAX_STAGES];
    int64_t peak_bytes[XMP_MAX_STAGES];
    double pf[XMP_MAX_STAGES], pi[XMP_MAX_STAGES], pw[XMP_MAX_STAGES];
    double xcpu[XMP_MAX_STAGES], xfaults[XMP_MAX_STAGES], xcpu_all[XMP_MAX_STAGES];
} par_step_t;

/* ---- set-up ---- */

/* The strategy search (--strategy auto), the checkpoint to resume (its configuration comes
 * before the layout: the layer kinds depend on it), the stage layout and the strategies, agreed
 * on by every rank. 0: go on; 1: done (--print-strategy); -1: failed (printed). */
static int par_configure(par_run_t *p)
{
    xmp_train_opts_t *o = p->o;
    const xmp_train_model_t *m = p->m;
    const int rank = p->rank, size = p->size;
    if (o->strategy && !strcmp(o->strategy, "auto")) {
        if (!m->auto_layout) {
            if (rank == 0)
                xmp_cli_error("--strategy auto: %s has no layout search", m->name);
            return -1;
        }
        if (m->auto_layout(m->user, MPI_COMM_WORLD, o) != 0)
            return -1;
    }
    if ((o->resume || o->save_dir) && !(m->ckpt_open && m->ckpt_load && m->ckpt_save)) {
        if (rank == 0)
            xmp_cli_error("--save-dir / --resume: the %s model has no checkpoints", m->name);
        return -1;
    }
    if (o->resume) {
        int64_t start = 0;
        int cbad = xmp_tr_lowest_failing(
            m->ckpt_open(m->user, MPI_COMM_WORLD, o->resume, o, &start) != 0, rank, size);
        if (cbad < size) {
            if (rank == cbad)
                xmp_cli_error("--resume: %s", xmp_last_error());
            return -1;
        }
        if (start >= o->steps) {
            if (rank == 0)
                xmp_cli_error("--resume '%s' is at step %lld: --steps %d (the total) leaves "
                              "nothing to train",
                              o->resume, (long long)start, o->steps);
            return -1;
        }
        o->start_step = (int)start;
    }
    if (xmp_tr_layout(o, m, size, &p->sl, p->err, sizeof p->err) != 0 ||
        (m->layout_check && m->layout_check(m->user, &p->sl, p->err, sizeof p->err) != 0)) {
        if (rank == 0)
            xmp_cli_error("stage layout: %s", p->err);
        return -1;
    }
    /* Every rank resolves and checks the same strategies (pure, but files are read on every
     * rank): the ranks agree on the outcome before any other collective, and the lowest failing
     * rank prints its message, so no rank goes on alone. */
    p->strat = calloc((size_t)p->sl.nstages, sizeof *p->strat);
    int sfail = !p->strat || xmp_tr_strategies(o, m, &p->sl, p->strat, p->err, sizeof p->err) != 0;
    int first_bad = sfail ? rank : size;
    xmp_tr_world_allreduce(MPI_IN_PLACE, &first_bad, 1, MPI_INT, MPI_MIN, "strategy check");
    if (first_bad < size) {
        if (rank == first_bad && rank == 0)
            xmp_cli_error("strategy: %s", p->strat ? p->err : "out of memory");
        else if (rank == first_bad)
            xmp_cli_error("strategy (rank %d): %s", rank, p->strat ? p->err : "out of memory");
        return -1;
    }
    if (o->print_strategy) {
        if (rank == 0) {
            char *buf = malloc(1 << 16), meshes[256];
            xmp_stage_layout_format_meshes(&p->sl, meshes, sizeof meshes);
            printf("# %d stage(s), meshes %s\n", p->sl.nstages, meshes);
            for (int s = 0; buf && s < p->sl.nstages; s++) {
                xmp_strategy_format(&p->strat[s], buf, 1 << 16);
                printf("# stage %d: %s (%s)\n%s", s, p->strat[s].name, p->strat[s].source, buf);
            }
            free(buf);
        }
        return 1;
    }
    return 0;
}

/* The serial reference first (rank 0), before the stages allocate anything, so the stages'
 * measured allocation peaks do not include it; every rank learns the outcome. 0 or -1. */
static int par_reference(par_run_t *p)
{
    const xmp_train_opts_t *o = p->o;
    if (o->check_serial && p->rank == 0) {
        p->ref = calloc((size_t)o->steps, sizeof(double));
        p->vref = calloc((size_t)o->steps, sizeof(double));
        p->gref = calloc((size_t)o->steps, sizeof(double));
        p->sref = calloc((size_t)o->steps, (size_t)o->sample_len + 1);
        if (!p->ref || !p->vref || !p->gref || !p->sref ||
            xmp_tr_serial_losses(o, p->m, o->steps, p->ref, p->vref, p->gref, p->sref) != 0) {
            xmp_cli_error("serial reference failed: %s", p->ref && p->vref && p->gref && p->sref
                                                             ? xmp_last_error()
                                                             : "out of memory");
            free(p->ref);
            p->ref = NULL;
        }
    }
    return xmp_tr_any_rank(o->check_serial && p->rank == 0 && !p->ref) ? -1 : 0;
}

/* Generates the schedule of the run's options (p->go) into *out (printed on rank 0 when it
 * fails). */
static int par_generate(par_run_t *p, xmp_schedule_t **out)
{
    const xmp_train_opts_t *o = p->o;
    const xmp_train_stages_t *ts = &p->ts;
    const int nmb = o->microbatches * o->grad_accum;
    if ((p->virt
             ? xmp_sched_generate_map(o->schedule, p->S, p->sl.ngroups, p->sl.group, nmb,
                                      ts->nedges, ts->sedges, &p->go, out, p->err, sizeof p->err)
             : xmp_sched_generate(o->schedule, p->S, nmb, ts->nedges, ts->sedges, &p->go, out,
                                  p->err, sizeof p->err)) != 0) {
        if (p->rank == 0)
            xmp_cli_error("--schedule %s: %s", xmp_sched_kind_name(o->schedule), p->err);
        return -1;
    }
    return 0;
}

/* The driver configuration: the timed wrappers around the stage callbacks (one per model stage
 * of this rank with virtual stages). */
static void par_driver_cfg(par_run_t *p)
{
    const xmp_train_stages_t *ts = &p->ts;
    xmp_driver_cfg_t *dc = &p->dc;
    memset(&p->tops, 0, sizeof p->tops);
    p->tops.in = ts->ops;
    p->tops.defer_o = p->o->grad_clip > 0;
    memset(dc, 0, sizeof *dc);
    dc->comm = MPI_COMM_WORLD;
    dc->ctx = p->ctx;
    dc->nstages = p->S;
    dc->meshes = ts->meshes;
    dc->nedges = ts->nedges;
    dc->edges = ts->edges;
    dc->sched = p->sched;
    dc->ops.user = &p->tops;
    dc->ops.forward = xmp_tr_t_fwd;
    dc->ops.backward_input = xmp_tr_t_bin;
    dc->ops.backward_weight = xmp_tr_t_bw;
    dc->ops.reduce_grads = xmp_tr_t_red;
    dc->ops.optimizer_step = xmp_tr_t_opt;
    dc->ops.activation_bytes = ts->ops.activation_bytes ? xmp_tr_t_act : NULL;
    dc->ops.set_progress = xmp_tr_t_setp;
    p->nv = 0;
    memset(p->vops, 0, sizeof p->vops);
    for (int s = 0; p->virt && ts->stage_ops && p->me >= 0 && s < p->S; s++) {
        if (!ts->stage_ops[s].forward)
            continue;
        timed_ops_t *v = &p->vt[p->nv];
        memset(v, 0, sizeof *v);
        v->in = ts->stage_ops[s];
        v->defer_o = p->tops.defer_o;
        p->vops[s] = dc->ops;
        p->vops[s].user = v;
        p->vops[s].activation_bytes = ts->stage_ops[s].activation_bytes ? xmp_tr_t_act : NULL;
        p->vstage[p->nv++] = s;
    }
    dc->stage_ops = p->virt ? p->vops : NULL;
    dc->mode = p->o->comm;
    dc->trace = p->o->trace != NULL;
    if (p->o->boundary_dtype != XMESH_F32)
        dc->boundary_dtype = (xmesh_dtype_t)p->o->boundary_dtype;
}

/* The xmesh context, the model's stages, the schedule and the driver. 0 or -1 (printed). */
static int par_setup(par_run_t *p)
{
    const xmp_train_opts_t *o = p->o;
    const xmp_train_model_t *m = p->m;
    const int rank = p->rank;
    xmp_train_stages_t *ts = &p->ts;
    if (xmesh_ctx_create_mpi(MPI_COMM_WORLD, NULL, &p->ctx) != XMESH_SUCCESS) {
        xmp_cli_error("xmesh_ctx_create_mpi: %s", xmesh_last_error());
        return -1;
    }
    (void)xmesh_ctx_set_abort_check(p->ctx, xmp_tr_abort_on_notice, NULL);
    int pfail = m->par_open(m->user, MPI_COMM_WORLD, p->ctx, &p->sl, p->strat, ts) != 0;
    p->opened = 1;
    int pbad = xmp_tr_lowest_failing(pfail, rank, p->size);
    if (pbad < p->size) {
        if (rank == pbad)
            xmp_cli_error("%s", xmp_last_error());
        return -1;
    }
    p->S = p->sl.nstages;
    p->me = ts->stage;
    memset(&p->go, 0, sizeof p->go);
    p->go.delay_wgrad = o->delay_wgrad;
    /* ZB-H1's memory rule: deferred weight-gradient work of at most S microbatches. */
    p->go.max_pending_w = p->S;
    p->go.recompute = o->recompute;
    p->virt = p->sl.ngroups != p->sl.nstages;
    /* a model that does not measure its activations: the trainer probes them (par_probe) */
    p->probe = (o->max_act_bytes > 0 || o->predict_memory) && !ts->act_bytes &&
               m->par_set_recompute && m->par_set_val && m->par_release;
    if (o->max_act_bytes > 0 || o->recompute) {
        if ((o->max_act_bytes > 0 && !ts->act_bytes && !p->probe) || !m->par_set_recompute) {
            if (rank == 0)
                xmp_cli_error("--recompute/--max-activation-bytes: the %s model does not %s",
                              m->name,
                              m->par_set_recompute ? "measure its activations" : "recompute");
            return -1;
        }
        /* with the probe: a provisional schedule without the cap first */
        p->go.max_act_bytes = p->probe ? 0 : o->max_act_bytes;
        p->go.act_bytes = ts->act_bytes;
        p->go.ckpt_bytes = ts->ckpt_bytes;
        p->go.selective_keep = ts->selective_keep;
    }
    if (par_generate(p, &p->sched) != 0)
        return -1;
    /* a memory cap may have chosen recomputation */
    if (m->par_set_recompute)
        m->par_set_recompute(m->user, p->sched->recompute);
    if (rank == 0 && (o->max_act_bytes > 0 || o->recompute) && !(p->probe && o->max_act_bytes > 0))
        printf("schedule %s: recompute %s\n", p->sched->name,
               xmp_recompute_name(p->sched->recompute));
    par_driver_cfg(p);
    if (xmp_driver_create(&p->dc, &p->drv, p->err, sizeof p->err) != XMESH_SUCCESS) {
        if (rank == 0)
            xmp_cli_error("pipeline driver: %s", p->err);
        return -1;
    }
    return 0;
}

/* ---- the activation probe ---- */

/* For a model that does not measure its activations: probes the bytes per microbatch and the
 * rest each rank group holds, and with a memory cap regenerates the schedule and the driver
 * under it. 0 or -1 (printed). */
static int par_probe(par_run_t *p)
{
    const xmp_train_opts_t *o = p->o;
    const xmp_train_model_t *m = p->m;
    const int rank = p->rank, me = p->me, S = p->S;
    xmp_train_stages_t *ts = &p->ts;
    if (xmp_tr_probe_act_bytes(m, rank, me, S, p->drv, &p->tops, p->vt, p->vstage, p->nv, p->pact,
                               p->pckpt, &p->pkeep) != 0)
        return -1;
    if (xmp_tr_probe_base_bytes(m, rank, me, S, p->sl.ngroups, p->sl.group, p->drv, p->sched,
                                &p->tops, p->vt, p->nv, p->pact, p->pckpt, p->pkeep, p->pbase) != 0)
        return -1;
    ts->act_bytes = p->pact;
    ts->ckpt_bytes = p->pckpt;
    ts->selective_keep = p->pkeep;
    p->have_base = 1;
    if (rank == 0 && o->no_progress)
        printf("activation bytes per microbatch (probe): stage 0 %.0f (block recompute "
               "%.0f), selective keeps %.2f; group 0 holds %.0f besides them\n",
               p->pact[0], p->pckpt[0], p->pkeep, p->pbase[0]);
    if (o->max_act_bytes > 0) {
        xmp_schedule_t *capped = NULL;
        p->go.max_act_bytes = o->max_act_bytes;
        p->go.act_bytes = ts->act_bytes;
        p->go.ckpt_bytes = ts->ckpt_bytes;
        p->go.selective_keep = ts->selective_keep;
        p->go.base_bytes = p->pbase;
        if (par_generate(p, &capped) != 0)
            return -1;
        xmp_driver_destroy(p->drv);
        p->drv = NULL;
        xmp_sched_destroy(p->sched);
        p->sched = capped;
        p->dc.sched = p->sched;
        if (xmp_driver_create(&p->dc, &p->drv, p->err, sizeof p->err) != XMESH_SUCCESS) {
            if (rank == 0)
                xmp_cli_error("pipeline driver: %s", p->err);
            return -1;
        }
        if (rank == 0)
            printf("schedule %s: recompute %s\n", p->sched->name,
                   xmp_recompute_name(p->sched->recompute));
    }
    m->par_set_recompute(m->user, p->sched->recompute);
    return 0;
}

/* --print-schedule, --resume (every other setting was checked: the saved blocks move into this
 * layout), the step records (rank 0). 0 or -1 (printed). */
static int par_begin(par_run_t *p)
{
    const xmp_train_opts_t *o = p->o;
    const xmp_train_model_t *m = p->m;
    const xmp_train_stages_t *ts = &p->ts;
    const int rank = p->rank;
    if (o->print_schedule && rank == 0) {
        char buf[256];
        xmp_stage_layout_format(&p->sl, buf, sizeof buf);
        printf("# layout %s, %d microbatches\n", buf, o->microbatches * o->grad_accum);
        for (int k = 0; ts->edge_names && k < ts->nedges; k++)
            printf("# edge %d: %s (stage %d -> %d)\n", k, ts->edge_names[k], ts->sedges[k].src,
                   ts->sedges[k].dst);
        xmp_sched_fprint(p->sched, stdout);
    }
    if (o->resume) {
        int lbad = xmp_tr_lowest_failing(m->ckpt_load(m->user, MPI_COMM_WORLD, p->ctx) != 0, rank,
                                         p->size);
        if (lbad < p->size) {
            if (rank == lbad)
                xmp_cli_error("--resume: %s", xmp_last_error());
            return -1;
        }
        if (rank == 0)
            printf("resumed from '%s' at step %d\n", o->resume, o->start_step);
    }
    if (rank == 0) {
        double plan_s[2 * XMP_MAX_STAGES * XMP_MAX_STAGES];
        log_graph_t lg = {ts->sedges, ts->nedges, NULL};
        if (2 * ts->nedges <= (int)(sizeof plan_s / sizeof plan_s[0]) &&
            xmp_driver_plan_seconds(p->drv, plan_s) == XMESH_SUCCESS)
            lg.plan_s = plan_s;
        if (xmp_tr_log_open(&p->log, o, m, "parallel", ts->nparams, &p->sl, p->strat, &lg) != 0)
            return -1;
        p->have_log = 1;
        p->log.have_bbytes = xmp_driver_boundary_bytes(p->drv, &p->log.bbytes_wire,
                                                       &p->log.bbytes_xhost) == XMESH_SUCCESS;
    }
    return 0;
}

/* ---- one step ---- */

/* Prediction of this step from the previous step's measured stage costs and xmesh's predicted
 * plan times (the first step has none); then this step's costs become the previous ones. */
static void par_predict(par_run_t *p, int step, par_step_t *st)
{
    const xmp_train_stages_t *ts = &p->ts;
    if (p->have_log)
        p->log.npred = 0;
    if (p->have_costs) {
        xmp_sim_result_t res;
        xmp_sim_costs_t sc;
        memset(&res, 0, sizeof res);
        memset(&sc, 0, sizeof sc);
        sc.f = p->cf;
        sc.i = p->ci;
        sc.w = p->cw;
        /* the memory model when the model measured its activations (cap, --predict-memory) */
        sc.act_bytes = ts->act_bytes;
        sc.ckpt_bytes = ts->ckpt_bytes;
        sc.selective_keep = ts->selective_keep;
        sc.base_bytes = p->have_base ? p->pbase : NULL;
        if (xmp_driver_predict_costs(p->drv, &sc, &res) == XMESH_SUCCESS && res.ok) {
            st->sp.predicted_s = res.step_s;
            if (p->have_log && res.nstages > 0 && res.nstages <= XMP_MAX_STAGES) {
                double b = 0;
                for (int g = 0; g < res.nstages; g++) {
                    b += res.bubble[g];
                    p->log.pred_peak[g] = res.peak_bytes ? res.peak_bytes[g] : 0;
                }
                p->log.pred_bubble = b / res.nstages;
                p->log.pred_have_mem = ts->act_bytes != NULL;
                p->log.npred = res.nstages;
            }
        }
        if (p->o->print_schedule && p->rank == 0 && step == 1) {
            printf("# simulated timeline (stage costs of step 0, xmesh plan predictions):\n");
            xmp_sim_render(p->sched, &res, 100, stdout);
        }
        xmp_sim_result_free(&res);
    }
    memcpy(p->cf, st->pf, sizeof p->cf);
    memcpy(p->ci, st->pi, sizeof p->ci);
    memcpy(p->cw, st->pw, sizeof p->cw);
    p->have_costs = 1;
}

/* One training step: the driver step, the loss over the world, clipping and the update, the
 * per-step figures, the memory cap, the prediction and (after the first) re-planning. 0, or -1:
 * the run stops (printed). */
static int par_step(par_run_t *p, int step, par_step_t *st)
{
    const xmp_train_opts_t *o = p->o;
    const xmp_train_model_t *m = p->m;
    const int rank = p->rank, S = p->S, nv = p->nv;
    timed_ops_t *tops = &p->tops, *vt = p->vt;
    st->lr = xmp_train_lr(o, step);
    if (m->set_lr)
        m->set_lr(m->user, st->lr);
    int sbad = m->par_set_step && m->par_set_step(m->user, step) != 0;
    if (xmp_tr_any_rank(sbad)) {
        if (sbad)
            xmp_cli_error("step %d: data: %s", step, xmp_last_error());
        return -1;
    }
    tops->f = tops->i = tops->w = tops->r = tops->o = tops->comm = 0;
    tops->nf = tops->ni = tops->nw = 0;
    for (int k = 0; k < nv; k++) {
        vt[k].f = vt[k].i = vt[k].w = vt[k].r = vt[k].o = vt[k].comm = 0;
        vt[k].nf = vt[k].ni = vt[k].nw = 0;
    }
    xmp_comm_counts_t calls0, calls1;
    xmp_comm_counts(&calls0);
    tops->fail_now = step == o->inject_step && rank == o->inject_rank;
    for (int k = 0; k < nv; k++)
        vt[k].fail_now = tops->fail_now;
    double faults0, cpu0, faults, cpu;
    xmp_host_cpu_t hc0, hc1;
    int have_hc = rank == 0 && xmp_host_cpu_now(&hc0) == 0;
    xmp_tr_usage_now(&faults0, &cpu0);
    xmesh_result_t r = xmp_driver_step(p->drv, &st->ss);
    xmp_tr_usage_now(&faults, &cpu);
    if (have_hc && xmp_host_cpu_now(&hc1) == 0)
        xmp_host_cpu_delta(&hc0, &hc1, &st->hcd);
    else
        have_hc = 0;
    faults -= faults0;
    cpu -= cpu0;
    int bad = r != XMESH_SUCCESS;
    char why[512];
    /* a callback's own message (the model's xmp_err) follows the driver's */
    const char *cbm = bad && strstr(xmp_driver_error(p->drv), "callback") ? xmp_last_error() : "";
    snprintf(why, sizeof why, "step %d: %s%s%s%s", step, bad ? xmp_driver_error(p->drv) : "",
             *cbm ? " (" : "", cbm, *cbm ? ")" : "");
    if (xmp_tr_step_stopped(bad, why, rank)) {
        p->step_failed = 1;
        return -1;
    }
    st->loss = 0;
    st->gnorm = 0;
    xmp_tr_world_allreduce(&st->ss.loss, &st->loss, 1, MPI_DOUBLE, MPI_SUM, "step loss");
    if (tops->defer_o && xmp_tr_clip_and_update(o, m, p->me, tops, vt, nv, &st->gnorm) != 0) {
        if (rank == 0)
            xmp_cli_error("step %d: gradient clipping / optimizer failed", step);
        return -1;
    }
    xmp_tr_step_figures(S, p->me, tops, &st->ss, st->pf, st->pi, st->pw, st->bubble, st->peak_mb,
                        st->peak_bytes, st->xcpu, faults, st->xfaults, cpu, st->xcpu_all, vt,
                        p->vstage, nv);
    /* the cap is a promise about measured allocations: a step over it ends the run (every rank
     * sees the same reduced peaks) rather than going on over the cap */
    int over = -1;
    for (int k = 0; o->max_act_bytes > 0 && k < S; k++)
        if ((double)st->peak_bytes[k] > o->max_act_bytes &&
            (over < 0 || st->peak_bytes[k] > st->peak_bytes[over]))
            over = k;
    if (over >= 0) {
        if (rank == 0)
            xmp_cli_error("--max-activation-bytes %.0f: step %d measured a peak of %lld B on "
                          "stage %d, over the cap (the memory model underestimates this "
                          "model; use a cap of at least %lld)",
                          o->max_act_bytes, step, (long long)st->peak_bytes[over], over,
                          (long long)st->peak_bytes[over]);
        return -1;
    }
    xmp_comm_counts(&calls1);
    int64_t box_calls = 0;
    for (int k = 0; k < XMP_COLL_NKINDS; k++)
        box_calls += calls1.calls[k] - calls0.calls[k];
    /* boxing: the collectives' seconds inside the timed callbacks only (not the step's closing
     * loss and gradient-norm reductions, whose waits for the slowest stage are no compute) */
    double boxing = tops->comm, busy = tops->f + tops->i + tops->w + tops->r + tops->o;
    for (int k = 0; k < nv; k++) {
        busy += vt[k].f + vt[k].i + vt[k].w + vt[k].r + vt[k].o;
        boxing += vt[k].comm;
    }
    st->sp = (xmp_step_pipe_t){
        busy - boxing, boxing,         0,        S,           st->bubble,
        st->peak_mb,   st->peak_bytes, st->xcpu, st->xfaults, box_calls,
        st->xcpu_all,  st->pf,         st->pi,   st->pw,      have_hc ? &st->hcd : NULL};
    par_predict(p, step, st);
    /* After the first step, place the deferred W work with the measured costs instead of unit
     * costs: regenerate the schedule and the driver. */
    if (step == o->start_step && o->delay_wgrad && o->steps > step + 1 && S > 1 &&
        xmp_tr_replan(o, m, rank, S, &p->ts, p->have_base ? p->pbase : NULL, p->cf, p->ci, p->cw,
                      &p->dc, &p->sched, &p->drv) != 0)
        return -1;
    return 0;
}

/* ---- validation, sampling and the serial comparison ---- */

/* rel = |got - want| / |want| within --check-serial's tolerance for step (NAN fails). */
static int within(int step, double got, double want, double *rel)
{
    *rel = fabs(got - want) / fmax(fabs(want), 1e-30);
    return *rel <= (step < XMP_CHECK_TIGHT_STEPS ? 1e-5 : 1e-4);
}

/* --check-serial on rank 0: this step's gradient norm, validation loss and loss against the
 * serial reference's (Adam hardly reacts to a wrongly scaled gradient, so a wrong norm would
 * hide behind matching losses). */
static void par_compare(par_run_t *p, int step, const par_step_t *st)
{
    const xmp_train_opts_t *o = p->o;
    double rel;
    if (!p->ref || step >= XMP_CHECK_STEPS)
        return;
    if (o->grad_clip > 0 && !within(step, st->gnorm, p->gref[step], &rel)) {
        xmp_progress_finish(&p->log.bar);
        fprintf(stderr, "MISMATCH step %d: parallel gradient norm %.9g serial %.9g (rel %.3g)\n",
                step, st->gnorm, p->gref[step], rel);
        p->mismatch++;
    }
    if (!isnan(st->val) && !within(step, st->val, p->vref[step], &rel)) {
        xmp_progress_finish(&p->log.bar);
        fprintf(stderr, "MISMATCH step %d: parallel val loss %.9g serial %.9g (rel %.3g)\n", step,
                st->val, p->vref[step], rel);
        p->mismatch++;
    }
    double tol = step < XMP_CHECK_TIGHT_STEPS ? 1e-5 : 1e-4;
    p->compared++;
    if (!within(step, st->loss, p->ref[step], &rel)) {
        xmp_progress_finish(&p->log.bar);
        fprintf(stderr, "MISMATCH step %d: parallel loss %.9g serial %.9g (rel %.3g > %g)\n", step,
                st->loss, p->ref[step], rel, tol);
        p->mismatch++;
    } else if (o->no_progress) {
        printf("step %d: parallel loss %.9g serial %.9g rel %.2e\n", step, st->loss, p->ref[step],
               rel);
    }
}

/* After a step: the validation loss and the sample when due, the step's record and the serial
 * comparison (rank 0), the loss's check. 0, or -1: the run stops (printed). */
static int par_validate(par_run_t *p, int step, par_step_t *st)
{
    const xmp_train_opts_t *o = p->o;
    const xmp_train_model_t *m = p->m;
    const int rank = p->rank;
    st->val = NAN;
    if (xmp_tr_val_due(o, step) &&
        xmp_tr_par_val(o, m, rank, p->me, p->drv, &p->tops, p->vt, p->nv, &st->val) != 0)
        return -1;
    st->sampled = 0;
    if (xmp_tr_sample_due(o, step)) {
        eval_ctx_t ec = {m, p->drv, &p->tops, p->vt, p->me, p->nv};
        free(p->text);
        p->text = malloc((size_t)o->sample_len + 1);
        int sbad2 =
            !p->text || !m->par_release ||
            m->sample(m->user, xmp_tr_eval_step, &ec, p->text, (size_t)o->sample_len + 1) != 0;
        if (xmp_tr_any_rank(sbad2)) {
            if (rank == 0)
                xmp_cli_error("sampling after step %d: %s", step, xmp_last_error());
            return -1;
        }
        st->sampled = 1;
        const char *want = p->sref ? p->sref + (size_t)step * (o->sample_len + 1) : NULL;
        if (rank == 0 && p->ref && strcmp(p->text, want)) {
            fprintf(stderr, "MISMATCH step %d: parallel sample '%s' serial '%s'\n", step, p->text,
                    want);
            p->mismatch++;
        }
    }
    if (rank == 0) {
        xmp_tr_log_record(&p->log, step, st->loss, st->ss.step_s, &st->sp, st->lr, st->gnorm,
                          st->val, st->sampled ? p->text : NULL);
        par_compare(p, step, st);
    }
    if (!isfinite(st->loss)) {
        if (rank == 0)
            xmp_cli_error("loss is %f at step %d", st->loss, step);
        return -1;
    }
    return 0;
}

/* ---- saving ---- */

/* --save-dir: after the optimizer update of step (step + 1 done). 0, or -1 (printed). */
static int par_save(par_run_t *p, int step)
{
    const xmp_train_opts_t *o = p->o;
    const xmp_train_model_t *m = p->m;
    int done = step + 1;
    if (!o->save_dir || !(done == o->steps || (o->save_every > 0 && done % o->save_every == 0)))
        return 0;
    int vbad = xmp_tr_lowest_failing(
        m->ckpt_save(m->user, MPI_COMM_WORLD, o->save_dir, done, o->keep) != 0, p->rank, p->size);
    if (vbad < p->size) {
        if (p->rank == vbad)
            xmp_cli_error("--save-dir: step %d: %s", done, xmp_last_error());
        return -1;
    }
    return 0;
}

/* ---- the outcome ---- */

/* The summary, the model's finish, the --check-serial verdict, the end of a job whose step
 * failed, the trace; the exit code agreed by every rank. */
static int par_outcome(par_run_t *p)
{
    const xmp_train_opts_t *o = p->o;
    const xmp_train_model_t *m = p->m;
    const int rank = p->rank;
    {
        double med = 0, mn = 0, mx = 0;
        int skip = 0;
        if (p->have_log)
            xmp_tr_log_summary(&p->log, p->ok, &med, &mn, &mx, &skip);
        if (m->par_finish &&
            m->par_finish(m->user, p->ok, p->have_log && p->log.have_json ? &p->log.json : NULL) !=
                0)
            p->ok = 0;
        if (p->have_log && xmp_tr_log_close(&p->log, med, mn, mx, skip) != 0)
            p->ok = 0;
        p->have_log = 0;
    }
    /* OK only after a full comparison of a complete run: every step ran, every compared step
     * matched, and as many steps were compared as asked for. */
    const int want = o->steps < XMP_CHECK_STEPS ? o->steps : XMP_CHECK_STEPS;
    if (rank == 0 && p->ref) {
        if (p->ok && !p->mismatch && p->compared == want)
            printf("check-serial: OK (0 mismatching of %d steps compared)\n", p->compared);
        else
            printf("check-serial: FAILED (%d mismatching of %d steps compared, %d wanted, run "
                   "%s)\n",
                   p->mismatch, p->compared, want, p->ok ? "complete" : "incomplete");
        if (p->compared != want)
            p->mismatch++;
    }
    if (p->step_failed) {
        /* The failed step left transfers and collectives in flight that MPI cannot cancel (and
         * maybe a rank that does not answer): the teardown would wait for them. Every rank has
         * said why: once each of the others has too (their notices), end the job. */
        if (rank == 0)
            fprintf(stderr, "xmesh-train: step failed: ending the job (MPI_Abort, exit 1)\n");
        xmp_end_job(1);
    }
    if (o->trace && p->drv && xmp_driver_write_trace(p->drv, o->trace) != XMESH_SUCCESS &&
        rank == 0)
        xmp_cli_error("--trace '%s': %s", o->trace, xmp_driver_error(p->drv));
    return xmp_tr_any_rank(!(p->ok && !p->mismatch)) ? 1 : 0;
}

/* Frees what the run holds (after a failure too). */
static void par_close(par_run_t *p)
{
    if (p->have_log) {
        double med, mn, mx;
        int skip;
        xmp_tr_log_summary(&p->log, 0, &med, &mn, &mx, &skip);
        xmp_tr_log_close(&p->log, med, mn, mx, skip);
    }
    xmp_driver_destroy(p->drv);
    if (p->opened && p->m->par_close)
        p->m->par_close(p->m->user);
    xmp_sched_destroy(p->sched);
    xmesh_ctx_destroy(p->ctx);
    free(p->ref);
    free(p->vref);
    free(p->gref);
    free(p->sref);
    free(p->text);
    free(p->strat);
}

int xmp_tr_run_parallel(const xmp_train_opts_t *oin, const xmp_train_model_t *m)
{
    int prov, rc = 1;
    par_run_t *p = calloc(1, sizeof *p);
    MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &prov);
    if (!p) {
        xmp_cli_error("out of memory");
        MPI_Finalize();
        return 1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &p->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &p->size);
    p->m = m;
    p->opts = *oin;
    p->o = &p->opts;
    if (p->rank != 0) {
        p->o->no_progress = 1;
        p->o->json = NULL;
        p->o->log_steps = 0;
    }
    int c = par_configure(p);
    if (c != 0) {
        rc = c > 0 ? 0 : 1;
        goto out;
    }
    if (par_reference(p) != 0 || par_setup(p) != 0 || (p->probe && par_probe(p) != 0) ||
        par_begin(p) != 0)
        goto out;
    for (int step = p->o->start_step; step < p->o->steps; step++) {
        par_step_t st;
        memset(&st, 0, sizeof st);
        if (par_step(p, step, &st) != 0 || par_validate(p, step, &st) != 0 ||
            par_save(p, step) != 0)
            break;
        p->ok = step == p->o->steps - 1;
    }
    rc = par_outcome(p);
out:
    par_close(p);
    free(p);
    MPI_Finalize();
    return rc;
}
