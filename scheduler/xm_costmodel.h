/*
 * Calibrated collective and compute costs (issue 21 items 1 and 2): what
 * the layout search prices a configuration with. Pure C, no MPI: the
 * records come from the cluster file that xmesh-calibrate writes
 * (docs/COSTMODEL.md, "Collectives and compute").
 *
 * Collectives. For a group of p ranks and a message of n bytes, each kind
 * is timed as
 *
 *     time = alpha + beta * f(kind, n, p)
 *
 * with the per-rank volume of the bandwidth-optimal algorithm (ring or
 * pairwise exchange) as f, so beta is seconds per byte on the busiest link
 * and comparable across group sizes. n is, per kind:
 *
 *     kind            n is                                   f(n, p)
 *     allreduce       the vector each rank holds and gets    2 (p - 1) / p * n
 *     allgather       the gathered result each rank gets     (p - 1) / p * n
 *     reduce_scatter  the vector each rank holds (ends n/p)  (p - 1) / p * n
 *     alltoall        what each rank sends in all (n/p each) (p - 1) / p * n
 *
 * One fit per kind and group geometry: p ranks, ranks_per_host of them on
 * each of `hosts` hosts (p = ranks_per_host * hosts), while `share` groups
 * of that geometry run at once through the same hosts (share 1: alone;
 * share R with R ranks per host: every rank of a host in a different
 * cross-host group, all sharing the host's NIC).
 *
 * Compute. sgemm times of the layer shapes (C = A . B with A M x K, B K x N),
 * measured with `busy` ranks of each host running at once.
 *
 * Ownership: xm_costmodel_parse/load allocate a model the caller frees with
 * xm_costmodel_destroy(); on error *out is left untouched and nothing leaks.
 */
#ifndef XM_COSTMODEL_H
#define XM_COSTMODEL_H

#include <stdint.h>
#include <stdio.h>

#include "xm_cost.h"

typedef enum xm_coll {
    XM_COLL_ALLREDUCE,
    XM_COLL_ALLGATHER,
    XM_COLL_REDUCE_SCATTER,
    XM_COLL_ALLTOALL,
    XM_COLL_NKINDS
} xm_coll_t;

/* "allreduce", "allgather", "reduce_scatter", "alltoall"; NULL if out of range. */
const char *xm_coll_name(xm_coll_t kind);
/* The kind named s (the names above); -1 if none. */
int xm_coll_from_name(const char *s);
/* f(kind, n, p) of the table above; NAN for a bad kind, p < 1 or n < 0. */
double xm_coll_volume(xm_coll_t kind, double bytes, int p);
/* Latency steps of the ring / pairwise algorithm: 2 (p - 1) for allreduce,
 * p - 1 otherwise (what alpha is scaled by between group sizes). */
int xm_coll_steps(xm_coll_t kind, int p);

typedef struct xm_coll_geom {
    int group_size;     /* p */
    int ranks_per_host; /* ranks of the group on each host it spans (a query's: the most on one) */
    int hosts;          /* hosts the group spans; p = ranks_per_host * hosts in a record */
    int share;          /* groups of this geometry running at once on the same hosts, >= 1 */
} xm_coll_geom_t;

#define XM_COLL_MAX_POINTS 10
typedef struct xm_coll_rec {
    xm_coll_t kind;
    xm_coll_geom_t g;
    xm_fit_t fit;                /* x = f(kind, n, p) bytes, y = seconds */
    double min_bytes, max_bytes; /* n measured */
    int line;                    /* line in the file it came from (0: not from a file) */
    /* The measured points (n bytes, seconds), increasing n; 0: only the fit (files before the
     * `points` records). With points, a query of this very geometry interpolates them
     * (xm_cost_collective). */
    int npts;
    double px[XM_COLL_MAX_POINTS], py[XM_COLL_MAX_POINTS];
} xm_coll_rec_t;

#define XM_GEMM_LABEL 48
typedef struct xm_gemm_rec {
    int64_t m, n, k;
    int busy;                  /* ranks per host running sgemm at once */
    double seconds;            /* one sgemm, the slowest rank's median */
    char label[XM_GEMM_LABEL]; /* no spaces, a shape name of the calibrator's */
    int line;
} xm_gemm_rec_t;

/* Element-wise compute of the training stack (nn/kernels.c), timed by xmesh-calibrate with
 * the trainer's own kernels, every rank busy at once. Units (what the seconds are per):
 *   gelu       one element (tanh GELU)
 *   layernorm  one element of the normalised tensor (rows x channels)
 *   attention  one (query, key, head-channel) triple of a full T x T square: B NH T T hs per
 *              batch of heads (the causal kernel does about half; the rate absorbs it)
 *   xent       one logit (softmax + cross-entropy)
 *   residual   one element of the sum
 *   adamw      one parameter element (backward 0: the update runs once per step) */
typedef enum xm_elt {
    XM_ELT_GELU,
    XM_ELT_LAYERNORM,
    XM_ELT_ATTENTION,
    XM_ELT_XENT,
    XM_ELT_RESIDUAL,
    XM_ELT_ADAMW,
    XM_ELT_NKINDS
} xm_elt_t;

/* "gelu", "layernorm", "attention", "xent", "residual", "adamw"; NULL if out of range. */
const char *xm_elt_name(xm_elt_t kind);

typedef struct xm_elt_rec {
    int busy;        /* ranks per host running it at once; 0: not calibrated */
    double fwd, bwd; /* seconds per unit, forward and backward (>= 0, finite) */
    int line;
} xm_elt_rec_t;

/* Records of the training stack's own probes ([compute] `NAMEstep V1 V2 ...`, a keyword ending
 * in "step", up to XM_STEP_MAX_VALUES numbers: e.g. a whole training step of one of its models,
 * timed by xmesh-calibrate). The cost model knows no model: it checks that the values are
 * finite numbers, keeps one record per name (a name repeated is an error), writes each back
 * (with its comment) and prices nothing with them. The training stack reads and checks its own
 * (pipeline/calib/). */
#define XM_STEP_NAME 24
#define XM_STEP_MAX_VALUES 14
#define XM_STEP_MAX_RECORDS 4
typedef struct xm_steprec {
    char name[XM_STEP_NAME];           /* the keyword, ending in "step" */
    int nvalues;                       /* 1 .. XM_STEP_MAX_VALUES */
    double values[XM_STEP_MAX_VALUES]; /* as the record lists them (finite) */
    char comment[200]; /* written on the line above the record ("": none; one line, no '#') */
    int line;          /* line in the file it came from (0: not from a file) */
} xm_steprec_t;

/* CPU sharing ([compute] `cpuset CPUS RANKS` records, written by xmesh-calibrate from each rank's
 * affinity mask): ranks whose masks overlap form one set that shares CPUS cpus. The compute
 * records are measured with every rank busy, so a rank of a set of n ranks on k < n cpus
 * computed at k/n of a cpu; when fewer of its set compute at once (a pipeline stage idles in
 * its bubble), it gets more (xm_cost_cpu_share). */
typedef struct xm_cpuset {
    int cpus;    /* cpus the set's ranks may run on (>= 1) */
    int nranks;  /* ranks in the set */
    double wait; /* CPU a rank waiting in the trainer's polling wait (MPI_Testall +
                  * sched_yield) takes, as a fraction of a computing rank's; 0..1 */
    double sync; /* seconds one small collective of two ranks of the set takes beyond its
                  * calibrated (every rank in collectives) time while other ranks of the set
                  * compute: the partner runs only when the scheduler gives it the cpu back
                  * (xm_cost_cpu_sync); 0: not measured */
    int line;
} xm_cpuset_t;

typedef struct xm_costmodel {
    int ncoll, ngemm;
    /* cpuset records: cpu_set_of[r] = index into cpusets of rank r (-1: none), for ranks
     * 0 .. cpu_nranks - 1 */
    int ncpusets, cpu_nranks;
    xm_cpuset_t *cpusets;
    int *cpu_set_of;
    xm_elt_rec_t elt[XM_ELT_NKINDS]; /* [compute] eltwise records (busy 0: absent) */
    int nsteps;                      /* [compute] NAMEstep records */
    xm_steprec_t steps[XM_STEP_MAX_RECORDS];
    xm_coll_rec_t *coll;
    xm_gemm_rec_t *gemm;
    int has_gemm_fit;
    /* time = alpha + beta * 2mnk over every shape (reported, not predicted with) */
    xm_fit_t gemm_fit;
    int nominal; /* 1: made by xm_costmodel_nominal, not measured */
} xm_costmodel_t;

/* Adds a copy of the NAMEstep record r: INVALID_ARGUMENT (m unchanged) for a name that does not
 * end in "step" or is too long, a value count out of 1 .. XM_STEP_MAX_VALUES, a value that is
 * not finite, a name already present ("... repeats line N") or more than XM_STEP_MAX_RECORDS
 * records. */
xmesh_result_t xm_costmodel_set_step(xm_costmodel_t *m, const xm_steprec_t *r);
/* The record named name, NULL if the model has none. */
const xm_steprec_t *xm_costmodel_step(const xm_costmodel_t *m, const char *name);

/* Fits time = alpha + beta * f(kind, n, p) to npts points (bytes[i],
 * seconds[i]) by least squares of the relative residuals (weights
 * 1 / seconds^2, xm_fit_weighted); r2 is the weighted R^2. alpha >= 0 and beta >= 0
 * (xm_fit_weighted's non-negative least squares: the 16 KiB .. 1 MiB sweeps of 2026-11-25
 * gave alphas down to -0.9 ms free, a busy machine an all-to-all beta of -1.9e-9 s/byte).
 * INVALID_ARGUMENT (and *out untouched) on a bad kind, p < 2, a byte count
 * <= 0, a time that is not finite and > 0, or what xm_fit_linear refuses
 * (fewer than 2 points, all sizes equal). */
xmesh_result_t xm_coll_fit(xm_coll_t kind, int p, const double *bytes, const double *seconds,
                           int npts, xm_fit_t *out);

/* An empty model (no records); NULL when out of memory. */
xm_costmodel_t *xm_costmodel_create(void);
/* Frees m; NULL is a no-op. */
void xm_costmodel_destroy(xm_costmodel_t *m);
/* Appends a copy of r (validated as a file line would be: INVALID_ARGUMENT
 * naming the field, or for a duplicate kind + geometry). m unchanged on error. */
xmesh_result_t xm_costmodel_add_coll(xm_costmodel_t *m, const xm_coll_rec_t *r);
xmesh_result_t xm_costmodel_add_gemm(xm_costmodel_t *m, const xm_gemm_rec_t *r);
/* Sets the element-wise record of kind (INVALID_ARGUMENT for a bad kind, busy < 1, a time
 * < 0 or not finite, or a kind already set; m unchanged on error). */
xmesh_result_t xm_costmodel_set_elt(xm_costmodel_t *m, xm_elt_t kind, const xm_elt_rec_t *r);

/* Reads the [collectives] and [compute] sections of a cluster file (the
 * base keys are checked as xm_cluster_parse does, then ignored; other
 * sections are skipped). A file without those sections gives an empty
 * model (predictions then say "not calibrated"). INVALID_ARGUMENT naming
 * the line and field on malformed text. */
/* (Defined in cluster_file.c, beside the parser they call.) */
xmesh_result_t xm_costmodel_parse(const char *text, xm_costmodel_t **out);
xmesh_result_t xm_costmodel_load(const char *path, xm_costmodel_t **out);
/* An UNCALIBRATED model from the cluster's nominal figures, for the
 * "uncalibrated" ablation of the search and for runs that say they have no
 * calibration: for every kind one record inside a host (p 2, beta =
 * 1 / intra rate) and one across hosts (p 2, one rank per host, share 1,
 * beta = 1 / the slower NIC direction), alpha = latency * steps; with
 * flops_per_s > 0 one sgemm shape 1 x 1 x 1 at that rate (label
 * "nominal"), else none (sgemm predictions then say "not calibrated").
 * m->nominal is 1, every prediction's basis starts with "nominal
 * (uncalibrated)" and none is exact; xm_costmodel_write refuses it.
 * INVALID_ARGUMENT for rates <= 0, a negative latency or flops_per_s < 0
 * (not finite); *out untouched on error. */
xmesh_result_t xm_costmodel_nominal(const xm_cluster_t *c, double flops_per_s,
                                    xm_costmodel_t **out);
/* Writes the [collectives] and [compute] sections (with their header
 * comments) to f; nothing for an empty part. SYSTEM on a write error,
 * INVALID_USAGE for a nominal model (it is no calibration result). */
xmesh_result_t xm_costmodel_write(const xm_costmodel_t *m, FILE *f);

typedef struct xm_cost_pred {
    double seconds;
    int exact;       /* 1: a record of this very geometry / shape, n inside its measured range */
    char basis[200]; /* which record the figure comes from and what was scaled */
} xm_cost_pred_t;

/* [collectives] `points kind p ranks_per_host hosts share n:seconds ...` (2 to
 * XM_COLL_MAX_POINTS pairs, n increasing, seconds > 0) after the fit line of that kind and
 * geometry: sets its measured points. INVALID_ARGUMENT naming the field; m unchanged on
 * error. */
xmesh_result_t xm_costmodel_set_points(xm_costmodel_t *m, xm_coll_t kind, const xm_coll_geom_t *g,
                                       int n, const double *bytes, const double *seconds);

/* Predicted time of one collective of `bytes` (n above) over geometry g.
 * A record of this very geometry with measured points (`points` records): piecewise-linear
 * interpolation between them; below the smallest n its time; above the largest the last
 * segment's slope (>= 0). Why: on the emulated cluster a size sweep is flat up to the NIC's
 * burst (64 KiB) and linear after, which no single alpha + beta fits (2026-11-25: the relative
 * fit's beta was 4x below the slope of the large sizes for a 2-host all-reduce).
 * p = 1 is 0 s (exact). Otherwise the record of the same kind and geometry
 * is used when there is one; else, among the records of the same kind and
 * the same side (one host, or several hosts), the one nearest in
 * |log2 ranks_per_host|, ties broken by |log2 p| + |log2 share| (then file
 * order), with alpha scaled by the step ratio xm_coll_steps and, across
 * hosts, beta by share / share(record) (the shared NIC is the bottleneck).
 * A negative fitted alpha counts as 0; records with beta <= 0 are not used.
 * An uneven group gives ranks_per_host as the most ranks on one host
 * (ranks_per_host + hosts - 1 <= p <= ranks_per_host * hosts).
 * INVALID_ARGUMENT for a bad kind, geometry (outside those bounds, values
 * < 1) or bytes (< 0, not finite); UNSUPPORTED "not calibrated: ..."
 * when no usable record of that kind and side exists. *out untouched on error. */
xmesh_result_t xm_cost_collective(const xm_costmodel_t *m, xm_coll_t kind, const xm_coll_geom_t *g,
                                  double bytes, xm_cost_pred_t *out);

/* Adds a cpuset record: `nranks` distinct ranks (each >= 0) sharing `cpus` cpus, a waiting
 * rank taking `wait` (0..1) of a computing rank's CPU. INVALID_ARGUMENT (m unchanged) for
 * cpus < 1, no ranks, a negative rank, a rank already in a set (naming it), wait outside
 * [0, 1]. */
xmesh_result_t xm_costmodel_add_cpuset(xm_costmodel_t *m, int cpus, const int *ranks, int nranks,
                                       double wait);

/* Sets the sync seconds (xm_cpuset_t) of cpuset record `set` (0 .. ncpusets-1). INVALID_ARGUMENT
 * (m unchanged) for a set out of range or sync < 0 or not finite. */
xmesh_result_t xm_costmodel_set_cpuset_sync(xm_costmodel_t *m, int set, double sync);

/* Extra seconds of one collective of rank `rank` while rank r' of 0 .. nranks-1 computes with
 * probability busy[r'] (the rank itself is in the collective: its own entry is not read): the
 * set's sync seconds times the probability that another rank of its set computes,
 * 1 - prod (1 - busy[r']). Returns 1 with *seconds set when the cpuset records cover exactly
 * the ranks 0 .. nranks-1 (0 s where the set has no sync figure); 0 (*seconds = 0) when the
 * model has no such records; -1 for bad arguments (*seconds untouched). */
int xm_cost_cpu_sync(const xm_costmodel_t *m, int nranks, const double *busy, int rank,
                     double *seconds);

/* CPU-sharing time factor of rank `rank`'s compute, relative to the calibrated (every rank
 * busy) rate, when rank r' of 0 .. nranks-1 computes with probability busy[r'] (the rank
 * itself counts as 1). With k cpus and n ranks in its set, w the set's wait weight and
 * b = sum over the set of busy + w (1 - busy): min(1, k/n) / min(1, k/b) (<= 1: fewer busy
 * ranks, faster). Returns 1 with *factor set when
 * the cpuset records cover exactly the ranks 0 .. nranks-1; 0 (*factor = 1) when the model has
 * no such records (another rank count, or none: compute is not shared, or not known to be);
 * -1 for bad arguments (*factor untouched). */
int xm_cost_cpu_share(const xm_costmodel_t *m, int nranks, const double *busy, int rank,
                      double *factor);

/* Predicted time of one sgemm (m x k) . (k x n): the measured time of that
 * shape (the record with the most busy ranks if several), else 2mnk at the
 * flop rate of the nearest measured shape in log2 of (m, n, k). 0 s when a
 * dimension is 0. INVALID_ARGUMENT for negative dimensions; UNSUPPORTED
 * "not calibrated: ..." when the model has no sgemm shape. */
xmesh_result_t xm_cost_gemm(const xm_costmodel_t *m, int64_t M, int64_t N, int64_t K,
                            xm_cost_pred_t *out);

/* Seconds of `units` of element-wise kind (forward into *fwd, backward into *bwd, either may
 * be NULL): units x the calibrated rate. Returns 1 when the model has that record, 0 when not
 * (both 0 s: the work is not priced, as files from before these records); -1 for a bad kind or
 * units (< 0, not finite), outputs untouched. */
int xm_cost_elt(const xm_costmodel_t *m, xm_elt_t kind, double units, double *fwd, double *bwd);

/* For the cluster-file parser (cluster_file.c). section_known: 1 for the
 * sections this model reads ("collectives", "compute"), 0 otherwise (the
 * parser skips those). parse_line: one line of a known section, comment
 * removed and trimmed, not empty; line is for messages; m may be NULL
 * (the line is checked, not kept). INVALID_ARGUMENT naming the line and
 * field; m unchanged on error. */
int xm_costmodel_section_known(const char *section);
xmesh_result_t xm_costmodel_parse_line(xm_costmodel_t *m, const char *section, int line,
                                       char *text);

#endif /* XM_COSTMODEL_H */
