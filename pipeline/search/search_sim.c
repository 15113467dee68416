/*
 * GPT-2 layout search: the pipeline simulator with CPU sharing (xmp_search__sim_shared,
 * search_priv.h) and its helpers: overlaps of compute on the simulated timeline and the
 * per-action CPU factors found by a damped fixed-point iteration (issue 40).
 */
#include "search/search.h"
#include "search/search_gpt_priv.h"
#include "search/search_priv.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "models/gpt2_graph.h"
#include "models/gpt2_par.h"
#include "nn/strategy.h"
#include "sched/schedule.h"
#include "xm_core.h"
#include "util/xmp_err.h"

/* ---------------------------------------------------- evaluation */

static int is_compute(const xmp_action_t *a)
{
    return a->kind == XMP_ACT_F || a->kind == XMP_ACT_B || a->kind == XMP_ACT_I ||
           a->kind == XMP_ACT_W;
}

/* Seconds during which group g's and group h's compute actions (F, B, I, W) overlap in res. */
static double overlap_s(const xmp_sim_result_t *res, int g, int h)
{
    double o = 0;
    int i = 0, j = 0;
    while (i < res->len[g] && j < res->len[h]) {
        if (!is_compute(&res->acts[g][i])) {
            i++;
            continue;
        }
        if (!is_compute(&res->acts[h][j])) {
            j++;
            continue;
        }
        double lo = fmax(res->t0[g][i], res->t0[h][j]), hi = fmin(res->t1[g][i], res->t1[h][j]);
        if (hi > lo)
            o += hi - lo;
        if (res->t1[g][i] < res->t1[h][j])
            i++;
        else
            j++;
    }
    return o;
}

/* Each stage's F and B seconds with its compute scaled by factor[s] and its collectives
 * charged pen[s] each (ncf, ncb: NULL for none). */
static void scaled_costs(const xmp_sim_costs_t *c, int S, const double *compf, const double *compb,
                         const double *ncf, const double *ncb, const double *factor,
                         const double *pen, double *f, double *b)
{
    for (int s = 0; s < S; s++) {
        f[s] = c->f[s] - compf[s] * (1 - factor[s]) + (ncf ? ncf[s] * pen[s] : 0);
        b[s] = (c->b ? c->b[s] : 0) - compb[s] * (1 - factor[s]) + (ncb ? ncb[s] * pen[s] : 0);
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* CPU factors from res's timeline, time-resolved: the compute time is cut at every start and
 * end of any stage's compute action; in each piece, a stage s computing there gets the largest
 * over its ranks of xm_cost_cpu_share with s's ranks busy and every other stage's ranks busy
 * at that stage's compute fraction cf[h] when it is in a compute action there, busy (1) in its
 * optimizer step (O: AdamW, element-wise compute, not a wait), else waiting;
 * the work s does in the piece is its length / that factor (its rate against the calibrated
 * one). factor[s]: s's compute time / its work; afac (NULL: not wanted; else a row per stage,
 * indexed as res->acts[s]): the same per compute action (1 for the others). So a stage that
 * computes half its time alone (factor 0.5) and half together with a stage on the same cpu
 * (1) gets 1 / (0.5 / 0.5 + 0.5 / 1) = 2/3, not the 0.75 of the mean number of busy ranks
 * (the rate averages over time, not the ranks competing; docs/SEARCH.md "CPU sharing"), and
 * per action, its lone actions 0.5 and its shared ones 1. busy: nranks scratch. 1 where s has
 * no compute or on failure (out of memory). */
static void share_factors(const xmp_sim_result_t *res, int S, const double *cf, const int *rank0,
                          const int *nr, int nranks, const xm_costmodel_t *cost, double *busy,
                          double *factor, double *const *afac)
{
    int np = 0;
    for (int s = 0; s < S; s++) {
        factor[s] = 1;
        np += 2 * res->len[s];
        for (int i = 0; afac && i < res->len[s]; i++)
            afac[s][i] = 0; /* work so far */
    }
    double *pt = malloc(((size_t)np + 1) * sizeof *pt);
    if (!pt) {
        for (int s = 0; afac && s < S; s++)
            for (int i = 0; i < res->len[s]; i++)
                afac[s][i] = 1;
        return;
    }
    int n = 0, at[XMP_SEARCH_MAX_STAGES], on[XMP_SEARCH_MAX_STAGES];
    int ot[XMP_SEARCH_MAX_STAGES], opt[XMP_SEARCH_MAX_STAGES];
    double work[XMP_SEARCH_MAX_STAGES], tot[XMP_SEARCH_MAX_STAGES];
    for (int s = 0; s < S; s++) {
        at[s] = ot[s] = 0;
        work[s] = tot[s] = 0;
        for (int i = 0; i < res->len[s]; i++)
            if ((is_compute(&res->acts[s][i]) || res->acts[s][i].kind == XMP_ACT_O) &&
                res->t1[s][i] > res->t0[s][i]) {
                pt[n++] = res->t0[s][i];
                pt[n++] = res->t1[s][i];
            }
    }
    qsort(pt, (size_t)n, sizeof *pt, cmp_double);
    for (int p = 0; p + 1 < n; p++) {
        double len = pt[p + 1] - pt[p], mid = 0.5 * (pt[p] + pt[p + 1]);
        if (!(len > 0))
            continue;
        /* which stages compute over the piece (a stage's compute actions are in time order) */
        for (int s = 0; s < S; s++) {
            while (at[s] < res->len[s] &&
                   (!is_compute(&res->acts[s][at[s]]) || res->t1[s][at[s]] <= mid))
                at[s]++;
            on[s] = at[s] < res->len[s] && res->t0[s][at[s]] <= mid;
            /* in its optimizer step (element-wise compute: busy, not waiting) */
            while (ot[s] < res->len[s] &&
                   (res->acts[s][ot[s]].kind != XMP_ACT_O || res->t1[s][ot[s]] <= mid))
                ot[s]++;
            opt[s] = ot[s] < res->len[s] && res->t0[s][ot[s]] <= mid;
        }
        for (int s = 0; s < S; s++) {
            if (!on[s])
                continue;
            for (int h = 0; h < S; h++)
                for (int q = rank0[h]; q < rank0[h] + nr[h] && q < nranks; q++)
                    busy[q] = h == s   ? 1.0
                              : on[h]  ? fmin(1.0, fmax(0.0, cf[h]))
                              : opt[h] ? 1.0
                                       : 0.0;
            double worst = 0;
            for (int q = rank0[s]; q < rank0[s] + nr[s] && q < nranks; q++) {
                double g = 1;
                if (xm_cost_cpu_share(cost, nranks, busy, q, &g) == 1 && g > worst)
                    worst = g;
            }
            if (!(worst > 0))
                worst = 1;
            work[s] += len / worst;
            tot[s] += len;
            if (afac)
                afac[s][at[s]] += len / worst;
        }
    }
    for (int s = 0; s < S; s++) {
        factor[s] = work[s] > 0 ? tot[s] / work[s] : 1;
        for (int i = 0; afac && i < res->len[s]; i++)
            afac[s][i] = afac[s][i] > 0 ? (res->t1[s][i] - res->t0[s][i]) / afac[s][i] : 1;
    }
    free(pt);
}

int xmp_search__sim_shared(const xmp_schedule_t *sch, const xmp_sim_costs_t *c, int S,
                           const double *compf, const double *compb, const double *ncf,
                           const double *ncb, const int *rank0, const int *nr, int nranks,
                           const xm_costmodel_t *cost, int off, double *factor, double *sync_s,
                           xmp_sim_result_t *res, char *err, size_t errlen)
{
    double pen[XMP_SEARCH_MAX_STAGES]; /* extra seconds per collective of stage s */
    double one[XMP_SEARCH_MAX_STAGES];
    for (int s = 0; s < S; s++) {
        factor[s] = 1;
        one[s] = 1;
        pen[s] = 0;
        if (sync_s)
            sync_s[s] = 0;
    }
    double *busy = NULL, *af = NULL;
    int shared = !off && S >= 1 && cost && cost->ncpusets > 0 && cost->cpu_nranks == nranks &&
                 !xmp_sched_is_virtual(sch) && sch->ngroups == S;
    /* one stage: nothing to lend, only the collectives' sync can apply */
    int any_sync = 0;
    for (int k = 0; shared && ncf && ncb && k < cost->ncpusets; k++)
        any_sync |= cost->cpusets[k].sync > 0;
    if (S == 1 && !any_sync)
        shared = 0;
    /* per action (S > 1): each F and B its own factor, from the contention over its own span
     * (a stage's lone actions in the fill and drain run faster than its shared ones in the
     * steady phase, and they are the ones on the critical path); af: the factors, then the
     * seconds added (xmp_sim_costs_t.act_add), a row per stage as sch->acts[s] */
    size_t na = 0;
    for (int s = 0; shared && s < S; s++)
        na += (size_t)sch->len[s];
    if (shared && ((busy = malloc((size_t)nranks * sizeof *busy)) == NULL ||
                   (S > 1 && (af = malloc(3 * (na + 1) * sizeof *af)) == NULL)))
        shared = 0; /* out of memory: the plain simulation */
    double *arow[XMP_SEARCH_MAX_STAGES], *anew[XMP_SEARCH_MAX_STAGES], *aadd[XMP_SEARCH_MAX_STAGES];
    const double *crow[XMP_SEARCH_MAX_STAGES];
    for (int s = 0, o = 0; af && s < S; o += sch->len[s], s++) {
        arow[s] = af + o;
        anew[s] = af + (na + 1) + o;
        aadd[s] = af + 2 * (na + 1) + o;
        crow[s] = aadd[s];
        for (int i = 0; i < sch->len[s]; i++)
            arow[s][i] = 1;
    }
    xmp_sim_costs_t k = *c;
    double f[XMP_SEARCH_MAX_STAGES], b[XMP_SEARCH_MAX_STAGES];
    int r = 0, per_action = af != NULL && !c->act_add;
    /* damped fixed point: at most 40 runs, stop when no factor or penalty moves by 1e-6 */
    for (int it = 0; it <= (shared ? 40 : 0); it++) {
        /* per action: the stages' compute at the calibrated rate, each action's own factor
         * added as seconds; else each stage's compute scaled by its factor */
        scaled_costs(c, S, compf, compb, ncf, ncb, per_action ? one : factor, pen, f, b);
        for (int s = 0; per_action && s < S; s++)
            for (int i = 0; i < sch->len[s]; i++) {
                int kd = sch->acts[s][i].kind;
                double comp = kd == XMP_ACT_F ? compf[s] : kd == XMP_ACT_B ? compb[s] : 0;
                aadd[s][i] = -comp * (1 - arow[s][i]);
            }
        k.f = f;
        k.b = c->b ? b : NULL;
        k.act_add = per_action ? crow : c->act_add;
        if (it > 0)
            xmp_sim_result_free(res);
        memset(res, 0, sizeof *res);
        r = xmp_sim_run(sch, &k, res, err, errlen);
        if (r != 0 || !shared || !(res->step_s > 0) || it == 40)
            break;
        for (int s = 0; per_action && s < S; s++)
            if (res->len[s] != sch->len[s])
                per_action = 0; /* W inserted: the stage factors (the next run's costs) */
        /* the compute fraction of a stage's F/B actions (they also hold its boxing) */
        double cf[XMP_SEARCH_MAX_STAGES], busy_s[XMP_SEARCH_MAX_STAGES];
        double wf[XMP_SEARCH_MAX_STAGES];
        scaled_costs(c, S, compf, compb, ncf, ncb, factor, pen, f, b);
        for (int s = 0; s < S; s++) {
            double tot = f[s] + (c->b ? b[s] : 0);
            cf[s] = tot > 0 ? fmin(1.0, (compf[s] + compb[s]) * factor[s] / tot) : 0;
            busy_s[s] = overlap_s(res, s, s);
        }
        /* the factors, time-resolved over each stage's compute and each action's */
        share_factors(res, S, cf, rank0, nr, nranks, cost, busy, wf, per_action ? anew : NULL);
        double moved = 0;
        for (int s = 0; s < S; s++) {
            double worst = 1, sync = 0;
            if (busy_s[s] > 0) {
                /* conditional on s computing: each other stage computes for the part of s's
                 * compute time their actions overlap, at its compute fraction (stages of a
                 * pipeline compute together in the steady phase and reduce together at the
                 * end: their busy times are correlated, not independent); the collectives'
                 * sync below takes these probabilities */
                for (int h = 0; h < S; h++) {
                    double u = h == s ? 1.0 : cf[h] * overlap_s(res, s, h) / busy_s[s];
                    u = u < 0 ? 0 : u > 1 ? 1 : u;
                    for (int q = rank0[h]; q < rank0[h] + nr[h] && q < nranks; q++)
                        busy[q] = u;
                }
                worst = wf[s];
                /* in a collective of s, s's other ranks compute at its compute fraction */
                for (int q = rank0[s]; ncf && ncb && q < rank0[s] + nr[s] && q < nranks; q++)
                    busy[q] = cf[s];
                for (int q = rank0[s]; ncf && ncb && q < rank0[s] + nr[s] && q < nranks; q++) {
                    double x = 0;
                    if (xm_cost_cpu_sync(cost, nranks, busy, q, &x) == 1 && x > sync)
                        sync = x;
                }
            }
            double nf = S > 1 ? 0.5 * (factor[s] + worst) : 1, np = 0.5 * (pen[s] + sync);
            moved = fmax(moved, fmax(fabs(nf - factor[s]), fabs(np - pen[s])));
            factor[s] = nf;
            pen[s] = np;
            for (int i = 0; per_action && i < sch->len[s]; i++) {
                double na_ = 0.5 * (arow[s][i] + anew[s][i]);
                moved = fmax(moved, fabs(na_ - arow[s][i]));
                arow[s][i] = na_;
            }
        }
        /* converged: run once more with these (the last run used the previous values) */
        if (moved < 1e-6)
            it = 39;
    }
    for (int s = 0; sync_s && ncf && ncb && s < S; s++)
        sync_s[s] = (ncf[s] + ncb[s]) * pen[s];
    free(busy);
    free(af);
    return r;
}
