/*
 * Offline estimate of a parallel layout (issue 21 items 2 and 3): the pipeline's public entry
 * to the layout model the search uses. Plain C11, no MPI, no xmesh-private type: a caller
 * (a tool, a script through the CLI `xmesh-train gpt plan --eval`, a notebook binding) gives
 * the model, the layout as the `xmesh-train` flags spell it and a cluster file, and gets the
 * predicted step time, boxing bytes, boundary bytes and peak memory per rank.
 *
 * Why here and not include/xmesh/: the estimate needs the models (GPT-2, U-Transformer) and the
 * pipeline schedules, which live above libxmesh; libxmesh must not depend on its consumers.
 * The header is the pipeline's public surface (installed with it when the pipeline is); the
 * search (search.h, search_ut.h) stays internal.
 *
 * Lifecycle: xmp_estimator_create -> any number of xmp_estimate_* -> xmp_estimator_destroy.
 * An estimator is read-only after creation (several threads may share it).
 *
 * Errors: every function returns 0, or -1 with a message in err naming the bad value (the
 * flag's name and value, or the cluster file's line); outputs untouched on error.
 */
#ifndef XMP_SEARCH_ESTIMATE_H
#define XMP_SEARCH_ESTIMATE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define XMP_ESTIMATE_MAX_STAGES 16
#define XMP_ESTIMATE_MAX_RANKS 4096

typedef struct xmp_estimator xmp_estimator_t;

/* Options of an estimator. Zero-initialise, then set what you need. */
typedef struct {
    const char *cluster_file; /* xmesh cluster file (base keys + optional [collectives] and
                                 [compute] from xmesh-calibrate); NULL: nominal defaults */
    int nominal;              /* 1: the nominal model even when the file is calibrated */
    double flops;             /* sgemm rate of the nominal model (0: 5e10 flop/s) */
    /* ablations (validation): boundary transfers cost 0; collectives priced as if no other
     * group shared the NIC (GPT only) */
    int no_boundary, no_share;
    int max_evals; /* scheduler budget of each boundary plan (0: 2000) */
} xmp_estimator_opts_t;

/* Creates an estimator (*out; free with xmp_estimator_destroy). -1: the cluster file is
 * missing or malformed (message with its line and field). */
int xmp_estimator_create(const xmp_estimator_opts_t *o, xmp_estimator_t **out, char *err,
                         size_t errlen);
void xmp_estimator_destroy(xmp_estimator_t *e); /* NULL-safe */
/* "nominal (uncalibrated): ..." or "calibrated: FILE (...)"; owned by e. */
const char *xmp_estimator_label(const xmp_estimator_t *e);

/* The layout, as `xmesh-train` takes it. */
typedef struct {
    int ranks, hosts;       /* ranks placed in order, ranks/hosts per host */
    const char *layout;     /* --layout ("E,t*2|t*2,L", "u*5|u*8"); NULL: even split */
    const char *stage_mesh; /* --stage-mesh, one mesh per stage ("2x2,4"; U-Transformer: dp x tp) */
    const char *strategy;   /* one built-in for every stage, or one per stage "dp,megatron" */
    const char *schedule;   /* "gpipe", "1f1b" (NULL), "eager-1f1b" */
    int microbatches;       /* 0: 1 */
} xmp_layout_desc_t;

typedef struct {
    int layers, heads, channels, vocab, seq, batch, max_seq; /* max_seq 0: 1024 */
} xmp_gpt_desc_t;

typedef struct {
    int base, groups, head_dim, batch; /* groups, head_dim 0: the model's defaults */
} xmp_utrans_desc_t;

typedef struct {
    int nstages;
    double step_s;         /* predicted step time (pipeline simulator) */
    double bubble;         /* largest stage idle fraction */
    double compute_s;      /* largest stage compute per step */
    double boxing_s;       /* largest stage boxing (+ gradient reduction) per step, not hidden */
    double boundary_s;     /* largest boundary transfer per microbatch */
    double boxing_bytes;   /* largest per-rank boxing send volume per step */
    double boundary_bytes; /* largest per-rank boundary bytes per step (both directions) */
    double mem_bytes;      /* peak memory of the busiest rank */
    int stage_rank0[XMP_ESTIMATE_MAX_STAGES], stage_ranks[XMP_ESTIMATE_MAX_STAGES];
    double stage_mem_bytes[XMP_ESTIMATE_MAX_STAGES]; /* every rank of stage s holds this */
    /* rank placement (xmesh_suggest_order on each boundary's destination): a stage whose
     * suggested order lowers its incoming boundary's lower bound gets it here (else the
     * in-order ranks); order_gain_s: the summed lower-bound gain over boundaries (0: none) */
    int rank_order[XMP_ESTIMATE_MAX_RANKS];
    double order_gain_s;
} xmp_estimate_t;

/* Peak memory of global rank r in est (0 outside its stages). */
double xmp_estimate_rank_memory(const xmp_estimate_t *est, int r);

/* GPT-2 (models/gpt2.h) with layout l: fills *out. */
int xmp_estimate_gpt(const xmp_estimator_t *e, const xmp_gpt_desc_t *m, const xmp_layout_desc_t *l,
                     xmp_estimate_t *out, char *err, size_t errlen);
/* The U-Transformer (models/utransformer.h) with layout l: fills *out. */
int xmp_estimate_utransformer(const xmp_estimator_t *e, const xmp_utrans_desc_t *m,
                              const xmp_layout_desc_t *l, xmp_estimate_t *out, char *err,
                              size_t errlen);

#ifdef __cplusplus
}
#endif
#endif /* XMP_SEARCH_ESTIMATE_H */
