/* The trainer's step records (rank 0): JSON, progress bar, per-step log, summary. */
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

int xmp_tr_log_open(train_log_t *s, const xmp_train_opts_t *o, const xmp_train_model_t *m,
                    const char *mode, int64_t nparams, const xmp_stage_layout_t *sl,
                    const xmp_strategy_t *strat, const log_graph_t *graph)
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
        xmp_json_bool(j, "keep_freed", xmp_train_keep_freed_active());
        xmp_json_int(j, "grad_accum", o->grad_accum);
        xmp_json_f32(j, "grad_clip", o->grad_clip);
        xmp_json_int(j, "warmup", o->warmup);
        xmp_json_str(j, "lr_decay",
                     o->lr_decay == XMP_LR_COSINE   ? "cosine"
                     : o->lr_decay == XMP_LR_LINEAR ? "linear"
                                                    : "none");
        xmp_json_f32(j, "lr_min_frac", o->lr_min_frac);
        xmp_json_int(j, "val_every", o->val_every);
        xmp_json_int(j, "val_steps", o->val_steps);
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
            xmp_json_str(j, "boundary_dtype", xmesh_dtype_name((xmesh_dtype_t)o->boundary_dtype));
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
            if (graph) {
                xmp_json_arr_begin(j, "edges");
                for (int k = 0; k < graph->nedges; k++) {
                    xmp_json_arr_begin(j, NULL);
                    xmp_json_int(j, NULL, graph->sedges[k].src);
                    xmp_json_int(j, NULL, graph->sedges[k].dst);
                    xmp_json_arr_end(j);
                }
                xmp_json_arr_end(j);
                if (graph->plan_s) {
                    xmp_json_arr_begin(j, "plan_predicted_s");
                    for (int p = 0; p < 2 * graph->nedges; p++)
                        xmp_json_num(j, NULL, graph->plan_s[p]);
                    xmp_json_arr_end(j);
                }
            }
            xmp_json_obj_end(j);
        }
        xmp_json_arr_begin(j, "steps");
    }
    xmp_progress_init(&s->bar, o->steps, o->no_progress);
    s->t_start = xmp_now();
    return 0;
}

void xmp_tr_log_record(train_log_t *s, int step, double loss, double seconds,
                       const xmp_step_pipe_t *pipe, float lr, double grad_norm, double val,
                       const char *sample)
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
        if (!isnan(val))
            xmp_json_num(&s->json, "val_loss", val);
        if (sample)
            xmp_json_str(&s->json, "sample", sample);
        if (pipe)
            xmp_json_step_pipeline(&s->json, pipe);
        if (pipe && s->npred > 0) {
            xmp_json_num(&s->json, "predicted_bubble", s->pred_bubble);
            if (s->pred_have_mem) {
                xmp_json_arr_begin(&s->json, "predicted_peak_activation_bytes_per_group");
                for (int g = 0; g < s->npred; g++)
                    xmp_json_num(&s->json, NULL, s->pred_peak[g]);
                xmp_json_arr_end(&s->json);
            }
        }
        xmp_json_obj_end(&s->json);
    }
    if (s->o->log_steps) {
        xmp_progress_finish(&s->bar);
        printf("step %d: train loss %f (took %f ms)\n", step, loss, seconds * 1000.0);
        if (!isnan(val))
            printf("val loss %f\n", val);
    }
    if (sample) {
        xmp_progress_finish(&s->bar);
        printf("step %d: generated:\n---\n%s\n---\n", step, sample);
    }
    xmp_progress_update(&s->bar, step + 1, loss, rate);
}

/* Writes the summary's common keys (the JSON summary object stays open for the model). */
void xmp_tr_log_summary(train_log_t *s, int ok, double *med, double *mn, double *mx, int *skip)
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
    if (s->have_bbytes) {
        xmp_json_int(&s->json, "boundary_bytes_per_step", (long long)s->bbytes_wire);
        xmp_json_int(&s->json, "boundary_cross_host_bytes_per_step", (long long)s->bbytes_xhost);
    }
}

/* Closes the JSON summary and the file, prints the summary line (and --bench statistics). */
int xmp_tr_log_close(train_log_t *s, double med, double mn, double mx, int skip)
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
