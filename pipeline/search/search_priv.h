/* Private to pipeline/search: helpers shared by search.c and search_ut.c. */
#ifndef XMP_SEARCH_SEARCH_PRIV_H
#define XMP_SEARCH_SEARCH_PRIV_H

#include <stddef.h>
#include <stdint.h>

#include "sched/schedule.h"
#include "xm_costmodel.h"
#include "xm_sched.h"

/* Predicted seconds of moving a tensor (nd, dims; f32) from a mesh (nda, sha) on ranks ra..
 * with spec sa to a mesh (ndb, shb) on ranks rb.. with spec sb, on nranks ranks placed in order
 * on `hosts` hosts: xmesh's decomposer, the greedy scheduler (max_evals, 0: 2000) and its
 * simulated makespan with the rates of cluster (NULL: defaults). 0, or -1 with err. */
int xmp_search__plan_seconds(int nranks, int hosts, const xm_cluster_t *cluster, int max_evals,
                             int nd, const int64_t *dims, int nda, const int *sha, int ra,
                             const char *sa, int ndb, const int *shb, int rb, const char *sb,
                             double *out, char *err, size_t errlen);

/* The pipeline simulator with CPU sharing (xm_cost_cpu_share). c's f[s] and b[s] hold
 * compf[s] and compb[s] seconds of compute at the calibrated every-rank-busy rate; stage s runs
 * on ranks rank0[s] .. rank0[s] + nr[s] - 1 of nranks. When cost has cpuset records for these
 * ranks (and !off), each F and B action's compute is scaled by its own CPU factor (more than
 * one stage): its span of the timeline is cut where any stage's compute starts or ends, each
 * piece priced by xm_cost_cpu_share (the largest over the stage's ranks) with the ranks of the
 * other stages computing there busy (at their compute fraction), those in their optimizer step
 * (O, element-wise compute) busy and the others waiting, and
 * the action's factor is its span / the work it does (the rate averaged over time, not the
 * ranks competing: processor sharing at the fixed point; issue 40), passed to the simulator
 * as xmp_sim_costs_t.act_add. Found by a damped fixed-point iteration (a stage that idles in
 * the bubble lends its cpus to the stages that share them). factor[s] receives each stage's
 * compute time / its work (1 without sharing); a schedule whose simulation inserts W takes
 * that per-stage factor instead. With ncf and ncb (the stage's collectives per microbatch in
 * F and in B; NULL: none), each of them also costs the cpuset's sync seconds (xm_cost_cpu_sync)
 * times the probability that another rank of the set computes meanwhile (the stage's own other
 * ranks: its compute fraction; other stages' ranks: as for the factor), in the same fixed point;
 * sync_s[s] (NULL: not wanted) receives those seconds per microbatch. This applies to one stage
 * too. Returns xmp_sim_run's value on the last run; res as there (the caller frees it). */
int xmp_search__sim_shared(const xmp_schedule_t *sch, const xmp_sim_costs_t *c, int S,
                           const double *compf, const double *compb, const double *ncf,
                           const double *ncb, const int *rank0, const int *nr, int nranks,
                           const xm_costmodel_t *cost, int off, double *factor, double *sync_s,
                           xmp_sim_result_t *res, char *err, size_t errlen);

#endif
