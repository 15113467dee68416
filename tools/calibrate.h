/*
 * xmesh-calibrate's own parts (private to tools/xmesh-calibrate*.c): the options, what is
 * measured, and the functions the files share. xmesh-calibrate.c: options, point-to-point,
 * collectives, CPU sets and main; calibrate_common.c: what the others share; calibrate_compute.c:
 * sgemm, the training stack's element-wise kernels and GPT-2 step (pipeline/calib);
 * calibrate_report.c: the table, the JSON and the cluster file.
 */
#ifndef XMESH_TOOLS_CALIBRATE_H
#define XMESH_TOOLS_CALIBRATE_H

#include <stdint.h>
#include <stdio.h>

#include "calib/gptstep.h" /* the training stack's GPT-2 step record and probe */
#include "xm_api.h"
#include "xm_cost.h"
#include "xm_costmodel.h"
#include "xmesh/mpi.h"

#define MAX_SIZES 32
#define MAX_REPS 64

enum { C_P2P_INTRA, C_P2P_INTER, C_CHAIN, C_AG_INTER, C_AG_INTRA, NCLASS };
/* names and one-line descriptions of the point-to-point classes (calibrate_common.c) */
extern const char *const xmc_cname[NCLASS];
extern const char *const xmc_chelp[NCLASS];

#define MAX_SHAPES 32

typedef struct {
    int64_t m, n, k;
    char label[XM_GEMM_LABEL];
} shape_t;

typedef struct {
    int64_t minb, maxb;
    int steps, reps, vhosts, json;
    int skip_p2p, skip_coll, skip_compute;
    int blocking; /* --blocking-collectives: MPI_Allreduce etc. instead of the trainer's calls */
    int tokens, hidden, vocab, conv_base;
    int nextra;
    shape_t extra[MAX_SHAPES];
    const char *out;
} opts_t;

typedef struct {
    int ok; /* measured */
    char why[128];
    int n;
    double x[MAX_SIZES], y[MAX_SIZES];
    xm_fit_t fit;
    int fit_ok;
} klass_t;

#define MAX_GEOMS 64

typedef struct {
    xm_coll_geom_t g;
    int ngroups;
    int color; /* this rank's group, MPI_UNDEFINED if none */
    char what[96];
} geom_t;

typedef struct {
    xm_coll_t kind;
    int geom;
    int n;
    double x[MAX_SIZES], y[MAX_SIZES];
    int fit_ok;
    xm_fit_t fit;
    char why[160];
} coll_res_t;

typedef struct {
    shape_t s;
    double seconds; /* slowest rank's median */
} gemm_res_t;

/* Everything measured, on rank 0 for the outputs. */
typedef struct {
    klass_t K[NCLASS];
    geom_t G[MAX_GEOMS];
    int ng;
    coll_res_t *C;
    int nc;
    char coll_why[96];
    gemm_res_t S[MAX_SHAPES + 16];
    int ns, busy;
    /* CPU sharing (rank 0): set_of[r] for r < size, cpus and wait weight per set */
    int nsets, *set_of, *set_cpus, *set_n;
    double *set_wait, *set_sync;
    xm_elt_rec_t E[XM_ELT_NKINDS]; /* busy 0: not measured */
    xmp_gptstep_t step;            /* gptstep; busy 0: not measured */
    char gemm_why[128];
    int gemm_fit_ok;
    xm_fit_t gemm_fit;
    int size, nhosts; /* ranks and hosts of the run (the report's header) */
} results_t;

/* Every timed repetition of a compute kernel runs calls back to back until SUSTAIN_S has
 * passed and divides by the calls it made: on a core shared by several ranks a repetition
 * shorter than the scheduler's slice times whether the rank happened to run alone (a count of
 * calls fixed beforehand from a warm-up call was such a case whenever the warm-up itself was
 * slow: the first shape of a calibration, gpt-qkv, read 0.19, 0.66 and 0.80 ms in three
 * calibrations, 0.18 ms being one rank alone on the core), while the trainer's forward and
 * backward keep every rank busy for tens of ms at the sustained, shared rate. */
#define SUSTAIN_S 0.05
/* Compute is timed sustained (~50 ms a repetition); at least 5 repetitions: with 2, the GELU
 * backward of two calibrations minutes apart read 74 and 97 ns per element. */
#define COMPUTE_REPS(o) ((o)->reps < 5 ? 5 : (o)->reps)

/* calibrate_common.c */
double xmc_median(double *v, int n); /* sorts v */
double xmc_gbps(const klass_t *k);
double xmc_flops(const shape_t *s);

/* calibrate_compute.c (collective: every rank calls them) */
int xmc_build_shapes(const opts_t *o, shape_t *S);
int xmc_measure_gemm(const opts_t *o, gemm_res_t *res, char *why, size_t whylen);
void xmc_measure_elt(const opts_t *o, int busy, xm_elt_rec_t *E);
void xmc_measure_gptstep(const opts_t *o, int busy, xmp_gptstep_t *G);

/* calibrate_report.c (rank 0) */
void xmc_print_table(const opts_t *o, const results_t *R);
void xmc_print_json(const opts_t *o, const results_t *R, const xm_cluster_t *cl);
int xmc_write_file(const opts_t *o, const results_t *R, xm_cluster_t *cl, FILE *f);

#endif /* XMESH_TOOLS_CALIBRATE_H */
