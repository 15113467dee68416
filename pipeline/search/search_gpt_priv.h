/* Private to pipeline/search: the GPT-2 layout search's context, per-item and per-stage
 * costs, shared between search_walk.c (cost walk, boundary plans), search_dp.c (options,
 * context, stage costs, chain DP) and search.c (evaluation, the search, command lines).
 * Never installed. */
#ifndef XMP_SEARCH_SEARCH_GPT_PRIV_H
#define XMP_SEARCH_SEARCH_GPT_PRIV_H

#include <stddef.h>
#include <stdint.h>

#include "models/gpt2_graph.h"
#include "nn/strategy.h"
#include "search/search.h"

#define NAX 4
#define XMP_SEARCH_MAX_SIG 4096 /* act.x placements per stage size (<= options) */
#define F32 4.0
/* AdamW: flops per stored element priced at the sgemm rate (a rough term). */
#define ADAMW_FLOPS 12.0

/* The items priced apart: the model graph's groups (gpt2_graph.h), and IT_W: the tied wte alone
 * (the L stage's copy). */
enum { IT_E = XMP_GPT2_G_EMBED, IT_T = XMP_GPT2_G_BLOCK, IT_L = XMP_GPT2_G_HEAD, IT_W, NIT };

typedef struct {
    double f, b;      /* seconds per microbatch: forward, backward (compute + boxing) */
    double comp;      /* of which compute (f + b) */
    double compf;     /* of comp, the forward's */
    double box_bytes; /* per-rank boxing volume per microbatch (f + b) */
    double ncf, ncb;  /* collectives per microbatch in f, in b */
    double r, o;      /* per step: gradient reduction (+ gathers), optimizer */
    double r_bytes;   /* per-rank volume of r */
    double r_alpha_sum, r_alpha_max; /* the latencies (alpha) of r's collectives: sum, largest */
    double mem_static;               /* parameters, optimizer, gradients (bytes) */
    double stored, grad, compute;    /* bytes: stored parameters, gradients, compute copies */
    double act;                      /* activation bytes per microbatch in flight */
} icost_t;

typedef struct {
    int ndim, shape[NAX], strat, sig;
    xmp_strategy_t s;
} opt_t;

typedef struct {
    const xmp_search_opts_t *o;
    int S, n, M, Bm, rph;
    int nopt;
    opt_t *opt;
    icost_t *ic;  /* [S][nopt][NIT] */
    char *icdone; /* [S][nopt] */
    int nsig;
    uint64_t *sighash;
    double *edge;      /* [S][nsig][nsig], NAN: not computed (edge s -> s+1) */
    double *tied;      /* [nopt]: tied wte exchange of the last stage, NAN: not computed */
    double gemm_rate;  /* flop/s of a 256^3 sgemm (optimizer term) */
    double cf;         /* compute factor of the gptstep record (step_factor; 1: none) */
    xmp_graph_t graph; /* the model of one microbatch with one block (gpt2_graph.h) */
    char *err;
    size_t errlen;
    int failed;
    xmp_search_stats_t *st;
} ctx_t;

/* Stage costs (search_dp.c's stage_cost). */
typedef struct {
    double f, b, comp, compf, box, r, o, ro, mem, memp, mema, box_bytes, r_bytes, ncf, ncb;
    double stored, grad, compute;
    double r_alpha_sum, r_alpha_max;
} scost_t;

/* (search_walk.c) */
int xmp_search__ctx_fail(ctx_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Local elements of a tensor (dims, nd) with per-axis SBPs on a mesh (ceil per split).
 * (search_walk.c) */
double xmp_search__local_elems(const int64_t *dim, int nd, const xmp_sbp_t *sbp, const int *shape,
                               int nax);

/* 1 when every split of every dim is even. (search_walk.c) */
int xmp_search__even_splits(const int64_t *dim, int nd, const xmp_sbp_t *sbp, const int *shape,
                            int nax);

/* (search_walk.c) */
const xmp_sbp_t *xmp_search__cls(const opt_t *o, const char *name);

/* (search_walk.c) */
const icost_t *xmp_search__icost(ctx_t *c, int s, int oi);

/* (search_walk.c) */
void xmp_search__spec_of(const opt_t *o, const char *cl, int store, char *buf, size_t n);

/* Boundary s -> s+1 between signatures ga and gb (options ia, ib carry them). (search_walk.c) */
double xmp_search__edge_time(ctx_t *c, int s, int ia, int ib);

/* The last stage's tied-wte exchange with the first, priced as a plan between
 * the last stage's wte storage and the same layout on stage 0's ranks. (search_walk.c) */
double xmp_search__tied_time(ctx_t *c, int oi);

/* (search_dp.c) */
void xmp_search__ctx_free(ctx_t *c);

/* The compute factor of the cost model's gptstep record: its measured step (the serial GPT-2,
 * every rank busy) over the same model priced here from the kernel records (one rank, one
 * stage, one microbatch: compute + optimizer). 1 without a record, under no_step (which the
 * probe itself runs with), or when the probe cannot be priced. (search_dp.c) */
double xmp_search__step_factor(const xmp_search_opts_t *o);

/* cf: step_factor(o), computed once by the caller (a search inits a context per S and M).
 * (search_dp.c) */
int xmp_search__ctx_init(ctx_t *c, const xmp_search_opts_t *o, int S, int M, double cf,
                         xmp_search_stats_t *st, char *err, size_t errlen);

/* Stage s with nb blocks on option oi (E on stage 0, L on the last). (search_dp.c) */
void xmp_search__stage_cost(ctx_t *c, int s, int oi, int nb, int kind, scost_t *sc);

/* (search_dp.c) */
int xmp_search__mem_ok(const ctx_t *c, double mem);

/* (search_dp.c) */
double xmp_search__objective(const ctx_t *c, double sum, double mb, double mr);

/* The exact chain DP for (S, M, kind) over options whose strategy is in mask.
 * Fills best (nstages, nblocks, opts) and returns its objective (INFINITY if
 * none is feasible). State (k stages placed from the right, blocks [i, L)
 * covered, signature of the leftmost placed stage). (search_dp.c) */
double xmp_search__dp_run(ctx_t *c, int kind, unsigned mask, int *best_nb, int *best_opt);

/* Smallest peak memory per rank of any configuration of (S, M, kind). (search_dp.c) */
double xmp_search__min_memory(ctx_t *c, int kind);

#endif
