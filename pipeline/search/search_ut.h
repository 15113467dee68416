/*
 * Automatic parallel layout for the U-Transformer (issue 21 item 3; docs/SEARCH.md,
 * "U-Transformer").
 *
 * A configuration: S pipeline stages of N/S ranks each (placed in order), the contiguous
 * layers of each stage (13 layers, models/utransformer.h), each stage's dp x tp mesh and
 * strategy (a name from the strategy list, loaded through xmp_ut_strategy_load: a name the
 * model does not know is simply never valid, so new built-ins plug in by name), the schedule
 * kind and the microbatch count M (M divides the batch).
 *
 * The long skips (down_i -> up_(5-i)) make the stage graph a DAG, not a chain: the GPT chain DP
 * does not apply. The search is coordinate descent from several starts followed by
 * Metropolis-Hastings (seeded: the seed is in the options and the stats); xmp_uts_exhaustive
 * enumerates every configuration (the test oracle on small spaces).
 *
 * The model of a configuration (pure, no MPI), per layer from the strategy's class SBPs:
 *   - compute: every convolution and linear as a GEMM (forward once, backward twice) and the
 *     attention products, after the splits of the parameters' SBPs, priced by xm_cost_gemm;
 *   - boxing: a weight split by output channels whose input is replicated: all-reduce of the
 *     input gradient (backward); split by input channels: all-reduce of the partial output
 *     (forward); an output-split weight not followed by its input-split partner (up.w, down.w):
 *     all-gather of its output (forward); priced by xm_cost_collective with the axis geometry;
 *   - gradient reduction: every parameter all-reduced over the axes that split act.x's batch dim
 *     where the parameter is replicated; SGD-Nesterov update at 4 flop per element;
 *   - edges: every tensor crossing stages (main activation, skips) planned by xmesh's decomposer
 *     and scheduler and timed by its simulator (like the GPT boundaries); per (stage, stage)
 *     pair the sum of its tensors, per microbatch each direction;
 *   - step time: the pipeline simulator (sched/schedule.h) on the real stage graph;
 *   - memory per rank: parameters, gradients and momentum (3x the local parameters) plus the
 *     saved activations per image (xmp_ut_layer_activation_floats) x local images x microbatches
 *     in flight (not divided by tensor-parallel axes: an upper bound for megatron).
 *
 * Errors: 0 or -1 with a message in err naming the bad value; outputs untouched on error.
 */
#ifndef XMP_SEARCH_SEARCH_UT_H
#define XMP_SEARCH_SEARCH_UT_H

#include <stddef.h>
#include <stdint.h>

#include "models/utransformer.h"
#include "xm_costmodel.h"
#include "xm_sched.h"

#ifdef __cplusplus
extern "C" {
#endif

#define XMP_UTS_MAX_STAGES XMP_UT_LAYERS
#define XMP_UTS_MAX_STRAT 8

typedef struct {
    xmp_ut_config_t model;
    int B;               /* images per step */
    int nranks, hosts;   /* hosts divides nranks */
    double memory_limit; /* bytes per rank; 0: none */
    const xm_costmodel_t *cost;
    const xm_cluster_t *cluster; /* rates of the edge plans (borrowed) */
    /* strategy names tried on every stage (0: "dp", "megatron", "3d", "axonn"; names the model
     * does not build are never valid) */
    int nstrat;
    const char *strategies[XMP_UTS_MAX_STRAT];
    unsigned schedules; /* bit k: xmp_sched_kind_t k; 0: all */
    int max_stages;     /* 0: 13 */
    int fixed_M;        /* > 0: only this microbatch count */
    int max_evals;      /* edge plans: scheduler evaluation budget (0: 2000) */
    uint64_t seed;      /* Metropolis-Hastings and restarts */
    int restarts;       /* coordinate-descent starts per stage count (0: 4) */
    int mh_steps;       /* Metropolis-Hastings proposals per stage count (0: 4000) */
    int no_boundary;    /* ablation: edges cost 0 */
} xmp_uts_opts_t;

typedef struct {
    int nstages, M, sched;
    int count[XMP_UTS_MAX_STAGES]; /* layers per stage (contiguous, in order) */
    int dp[XMP_UTS_MAX_STAGES], tp[XMP_UTS_MAX_STAGES];
    int strategy[XMP_UTS_MAX_STAGES]; /* index into the options' strategy list */
    /* predictions */
    double step_s, bubble;
    double compute_s;      /* largest stage compute per step */
    double boxing_s;       /* largest stage boxing + reduction per step */
    double boundary_s;     /* largest stage-pair transfer per microbatch (one direction) */
    double boxing_bytes;   /* largest per-rank boxing volume per step */
    double boundary_bytes; /* largest per-rank bytes crossing stages per step (both directions) */
    double mem_bytes;      /* peak memory per rank (largest stage) */
    double stage_mem[XMP_UTS_MAX_STAGES];
} xmp_uts_cand_t;

typedef struct {
    double seconds;
    long evals;           /* configurations evaluated (simulated) */
    long edge_plans;      /* edge tensors planned */
    double space;         /* configurations in the space (valid or not) */
    double min_mem_bytes; /* smallest peak memory per rank of any configuration */
    uint64_t seed;
} xmp_uts_stats_t;

/* The strategy name of index i of o's list (the defaults when o->nstrat is 0). */
const char *xmp_uts_strategy_name(const xmp_uts_opts_t *o, int i);
int xmp_uts_nstrat(const xmp_uts_opts_t *o);

/* Coordinate descent + Metropolis-Hastings; the best min(topk, found) configurations by step
 * time into out[]. Errors: bad options, nothing valid ("cannot be factorized"), nothing within
 * the memory limit (the message gives the smallest memory any configuration needs). */
int xmp_uts_search(const xmp_uts_opts_t *o, int topk, xmp_uts_cand_t *out, int *nout,
                   xmp_uts_stats_t *stats, char *err, size_t errlen);
/* Every configuration (refused with -1 when the space has more than max_space). */
int xmp_uts_exhaustive(const xmp_uts_opts_t *o, double max_space, int topk, xmp_uts_cand_t *out,
                       int *nout, xmp_uts_stats_t *stats, char *err, size_t errlen);
/* Evaluates c (nstages, M, sched, count, dp, tp, strategy): fills the predictions. -1 for an
 * invalid configuration; an over-limit one is evaluated (mem_bytes tells). */
int xmp_uts_eval(const xmp_uts_opts_t *o, xmp_uts_cand_t *c, char *err, size_t errlen);
/* --layout, --stage-mesh, --stage-strategy strings of c. */
void xmp_uts_flags(const xmp_uts_opts_t *o, const xmp_uts_cand_t *c, char *layout, char *meshes,
                   char *strats, size_t n);
/* The xmesh-train utransformer command line that runs c. */
void xmp_uts_command(const xmp_uts_opts_t *o, const xmp_uts_cand_t *c, char *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* XMP_SEARCH_SEARCH_UT_H */
