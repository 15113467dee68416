/*
 * Automatic parallel layout for GPT-2 (issue 21 items 2 and 3; docs/SEARCH.md).
 *
 * A *configuration* is: S pipeline stages of N/S ranks each (ranks placed in
 * order, stage s on ranks s*N/S ..), the contiguous transformer blocks of each
 * stage (E on the first stage, L on the last), each stage's mesh (1 to 4
 * axes, every axis >= 2, or the 1-rank mesh "1") and built-in strategy (dp,
 * megatron, 3d, axonn; all blocks of a stage share it), the schedule (gpipe,
 * 1f1b, eager-1f1b) and the microbatch count M (M divides the batch B).
 *
 * The model of a configuration (pure C, no MPI):
 *   - compute: the local GEMMs of every linear layer (forward, input and weight
 *     gradient) and of attention after the strategy's splits, priced by
 *     xm_cost_gemm (calibrated [compute] records, or the nominal model);
 *   - boxing: every collective the strategy's SBPs imply, found by walking the
 *     stage's ops with the class SBPs of the strategy text (the op's deduced
 *     output boxed to its class SBP; P->B all-reduce, P->S reduce-scatter,
 *     S->B all-gather, S(i)->S(j) all-to-all; backward: the same volumes with
 *     all-gather and reduce-scatter swapped), the per-step gradient reduction
 *     (all-reduce over axes where a parameter is B; reduce-scatter + all-gather
 *     where its storage is sharded), each priced by xm_cost_collective with the
 *     geometry of the axis' groups (ranks per host, hosts, groups sharing a
 *     host); nothing is assumed hidden (no overlap switch is modelled);
 *   - boundaries: the activation (Bm, T, C) between stages planned with
 *     xmesh's decomposer and scheduler and timed by its simulator (the
 *     predicted_s of a plan), once per direction per microbatch;
 *   - step time: the chain model Σ_s (f_s + b_s) + 2 Σ_e x_e + (M - 1) ·
 *     max(f_s + b_s, x_e) + max_s (r_s + o_s), which the dynamic programme
 *     minimises exactly; the reported step time of each candidate is then the
 *     pipeline simulator's (sched/schedule.h) for its schedule kind;
 *   - memory per rank: stored parameters + AdamW m, v (by storage SBP) +
 *     compute copies of sharded parameters + gradients + activations of the
 *     microbatches in flight for the schedule (gpipe M, 1f1b min(M, S - s),
 *     eager-1f1b min(M, 2 (S - s) - 1)).
 *
 * Errors: functions return 0 or -1 with a message in err naming the bad value;
 * outputs are untouched on error.
 */
#ifndef XMP_SEARCH_SEARCH_H
#define XMP_SEARCH_SEARCH_H

#include <stddef.h>
#include <stdint.h>

#include "calib/gptstep.h"
#include "models/gpt2.h"
#include "models/stage_layout.h"
#include "xm_costmodel.h"
#include "xm_sched.h"

#ifdef __cplusplus
extern "C" {
#endif

#define XMP_SEARCH_MAX_STAGES 16
#define XMP_SEARCH_NSTRAT 4 /* dp, megatron, 3d, axonn */

typedef struct {
    xmp_gpt2_config_t model;     /* layers, heads, channels, max_seq, vocab (padded) */
    int vocab;                   /* the real vocabulary (for the command line) */
    int B, T;                    /* batch rows and sequence length of a step */
    int nranks, hosts;           /* hosts must divide nranks; ranks placed in order */
    double memory_limit;         /* bytes per rank; 0: none */
    const xm_costmodel_t *cost;  /* collectives and sgemm (borrowed) */
    const xm_cluster_t *cluster; /* rates of the boundary plans (borrowed; host map unused) */
    unsigned strategies;         /* bit i: built-in i of xmp_search_strategy_name; 0: all */
    unsigned schedules;          /* bit k: xmp_sched_kind_t k; 0: all */
    int max_stages;              /* 0: no bound beyond the block count */
    int fixed_M;                 /* > 0: only this microbatch count */
    int max_evals;               /* boundary plans: scheduler evaluation budget (0: 2000) */
    /* ablations (issue 21 item 4): no_boundary prices every boundary transfer and the tied-wte
     * exchange at 0; no_share prices every collective as if its group had the hosts' NICs to
     * itself (share 1: the bandwidth model ignores groups sharing a NIC) */
    int no_boundary, no_share;
    /* the trainer's --overlap defer-grad (docs/STRATEGY.md): a stage's gradient reductions are
     * posted at once and waited in order, so their latencies overlap: R = sum of the
     * collectives' bandwidth terms + the largest alpha (instead of every alpha). The other
     * switches are not modelled. no_overlap: the ablation that ignores defer_grad. */
    int defer_grad, no_overlap;
    /* the ablation that ignores the cost model's cpuset records (CPU sharing between ranks:
     * xm_cost_cpu_share; a stage idling in the bubble lends its cpus to the stages on them) */
    int no_cpu_share;
    /* the ablation that ignores the cost model's gptstep record: compute priced from the
     * kernel records alone (otherwise scaled by the record's measured step over the same
     * model priced from the kernels; calib/gptstep.h, xmp_gptstep_t) */
    int no_step;
    /* the ablation that ignores the cluster's nic_burst_bytes (the NICs' token buckets: a
     * boundary transfer leaving an idle NIC sends up to the burst at once; xmp_sim_costs_t
     * nic_burst_s) */
    int no_burst;
} xmp_search_opts_t;

typedef struct {
    int nstages, M, sched; /* sched: xmp_sched_kind_t */
    int nblocks[XMP_SEARCH_MAX_STAGES];
    int ndim[XMP_SEARCH_MAX_STAGES];
    int shape[XMP_SEARCH_MAX_STAGES][4];
    int strategy[XMP_SEARCH_MAX_STAGES]; /* index into the built-ins */
    /* predictions */
    double chain_s;         /* the DP's objective */
    double step_s;          /* pipeline simulator's step time (NAN: not simulated) */
    double bubble;          /* the simulator's largest stage bubble fraction */
    double compute_s;       /* largest stage compute per step */
    double boxing_s;        /* largest stage boxing time per step (not hidden) */
    double boundary_s;      /* largest boundary transfer per microbatch */
    double boxing_bytes;    /* largest per-rank boxing send volume per step */
    double boundary_bytes;  /* largest per-rank boundary bytes per step (both directions) */
    double mem_bytes;       /* peak memory per rank (largest stage) */
    double mem_param_bytes; /* of which parameters + optimizer + gradients */
    double mem_act_bytes;   /* of which activations in flight */
    double stage_param_bytes[XMP_SEARCH_MAX_STAGES]; /* per stage: parameters, optimizer, grads */
    double stage_act_bytes[XMP_SEARCH_MAX_STAGES];   /* per stage: activations in flight */
    /* per stage, bytes per rank: stored parameters (AdamW keeps 2x this), gradient
     * accumulators, compute copies (the gathered form of sharded parameters) */
    double stage_stored_bytes[XMP_SEARCH_MAX_STAGES];
    double stage_grad_bytes[XMP_SEARCH_MAX_STAGES];
    double stage_compute_bytes[XMP_SEARCH_MAX_STAGES];
    /* per stage, seconds: forward and backward per microbatch (compute + boxing), compute
     * alone per microbatch (f + b), gradient reduction and optimizer per step */
    double stage_f_s[XMP_SEARCH_MAX_STAGES], stage_b_s[XMP_SEARCH_MAX_STAGES];
    double stage_compute_s[XMP_SEARCH_MAX_STAGES];
    double stage_compf_s[XMP_SEARCH_MAX_STAGES]; /* of compute, the forward's */
    /* compute time factor of CPU sharing (xmp_search__sim_shared; 1: none) */
    double stage_cpu_factor[XMP_SEARCH_MAX_STAGES];
    /* seconds per microbatch the stage's collectives wait for ranks that share its cpus
     * (xmp_search__sim_shared's sync term; 0: none) */
    double stage_sync_s[XMP_SEARCH_MAX_STAGES];
    double stage_r_s[XMP_SEARCH_MAX_STAGES], stage_o_s[XMP_SEARCH_MAX_STAGES];
    /* the factor every compute time above carries: the gptstep record's measured step over
     * the kernel records' price of it (1: no record, or no_step) */
    double step_factor;
} xmp_search_cand_t;

typedef struct {
    double seconds;       /* wall time of the search */
    double cpu_seconds;   /* CPU time of the search (this process) */
    long dp_runs;         /* DP runs (stage count x M x schedule x strategy family) */
    long transitions;     /* DP transitions evaluated */
    long options;         /* valid (mesh, strategy) options over all stage sizes */
    long boundary_plans;  /* boundary transfers planned and simulated */
    long candidates;      /* distinct configurations simulated */
    double min_mem_bytes; /* smallest peak memory per rank of any configuration */
    int nominal;          /* the cost model is the nominal (uncalibrated) one */
} xmp_search_stats_t;

/* "dp", "megatron", "3d", "axonn"; NULL out of range. */
const char *xmp_search_strategy_name(int i);

/* Searches and writes the best min(topk, found) configurations, best first by
 * simulated step time, to out[]; *nout their count. Errors: bad options (ranks,
 * hosts, model), no configuration of the ranks ("cannot be factorized ..."),
 * none within the memory limit (the message gives the smallest memory any
 * configuration needs), a cost model without the records needed. */
int xmp_search_gpt(const xmp_search_opts_t *o, int topk, xmp_search_cand_t *out, int *nout,
                   xmp_search_stats_t *stats, char *err, size_t errlen);

/* The test oracle: for one stage count S, microbatch count M and schedule
 * kind, the least chain objective over ALL configurations by exhaustive
 * enumeration (splits x options per stage), and the DP's least for the same
 * (S, M, kind). Either is INFINITY when nothing is feasible. Returns 0 or -1. */
int xmp_search_gpt_check(const xmp_search_opts_t *o, int S, int M, int kind, double *dp_best,
                         double *exhaustive_best, long *enumerated, char *err, size_t errlen);

/* Evaluates one configuration c (nstages, M, sched, nblocks, meshes,
 * strategies) with the model: fills c's predictions. -1 with a message for an
 * invalid configuration. */
int xmp_search_gpt_eval(const xmp_search_opts_t *o, xmp_search_cand_t *c, char *err, size_t errlen);

/* The xmesh-train command line that runs c (NUL-terminated into buf). */
void xmp_search_gpt_command(const xmp_search_opts_t *o, const xmp_search_cand_t *c, char *buf,
                            size_t n);
/* --layout, --stage-mesh and --stage-strategy strings of c. */
void xmp_search_gpt_flags(const xmp_search_cand_t *c, char *layout, char *meshes, char *strats,
                          size_t n);

/* The collective geometry the model uses for mesh axis `axis` of a stage mesh
 * (ndim, shape) on ranks rank0.. of nranks placed in order on `hosts` hosts:
 * the group of the stage's first rank (its ranks per host, hosts) and how many
 * groups of that axis share its first host (share). For tests and tools. */
void xmp_search_axis_geom(int nranks, int hosts, int rank0, int ndim, const int *shape, int axis,
                          xm_coll_geom_t *g);

#ifdef __cplusplus
}
#endif
#endif /* XMP_SEARCH_SEARCH_H */
