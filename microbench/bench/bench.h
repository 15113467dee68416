/*
 * xmesh-bench internals: one resharding "case" as plain data, the MPI
 * baselines and the calibration. The harness (xmesh_bench.c) owns timing,
 * checking and output; baselines.c implements the two MPI-library methods
 * on the unit tasks; calib.c measures the raw network the run sits on.
 */
#ifndef XMESH_BENCH_H
#define XMESH_BENCH_H

#include <mpi.h>
#include <stdint.h>

#include "xm_core.h"
#include "xm_sched.h"

/* Where every rank sits: filled once at start-up. */
typedef struct bench_world {
    int rank, size;
    int nhosts;
    int *host_of;      /* size entries: host of each world rank */
    int *host_ranks;   /* ranks grouped by host, host-major, ascending */
    int *host_off;     /* nhosts + 1 offsets into host_ranks */
    int virtual_hosts; /* > 0: hosts are rank / virtual_hosts (single-host fallback) */
    int poll_us;       /* sleep between MPI_Test polls of the bench's own waits */
} bench_world_t;

/* One resharding to measure: meshes already mapped to world ranks. */
typedef struct bench_case {
    char name[32];
    int ndim;
    int64_t shape[XM_MAX_DIMS];
    int src_mesh[2], dst_mesh[2]; /* (hosts, devices per host) */
    const char *src_spec, *dst_spec;
    int *src_ranks, *dst_ranks; /* row-major over the mesh, world ranks */
    xm_layout_t src, dst;       /* plain-data layouts; elem_size 4 (int32) or 8 (f64) */
    xm_taskset_t ts;            /* unit tasks (box intersections) */
    int src_index, dst_index;   /* this rank's index in each mesh, -1 if absent */
    int64_t src_lo[XM_MAX_DIMS], src_hi[XM_MAX_DIMS];
    int64_t dst_lo[XM_MAX_DIMS], dst_hi[XM_MAX_DIMS];
    int64_t src_elems, dst_elems; /* of this rank's local blocks */
} bench_case_t;

/* Waits for n requests, sleeping poll_us between tests so idle or waiting
 * ranks leave the 2 cores to the ranks that move data. */
int bench_waitall(const bench_world_t *w, int n, MPI_Request *reqs);
/* Barrier over comm with the same sleepy wait. */
int bench_barrier(const bench_world_t *w, MPI_Comm comm);

/* Copies the box [lo, hi) out of (pack) or into (unpack) a dense row-major
 * block [blo, bhi) of c->src.elem_size-byte elements. buf is the dense box. */
void bench_pack(const bench_case_t *c, const void *block, const int64_t *blo, const int64_t *bhi,
                const xm_box_t *box, void *buf);
void bench_unpack(const bench_case_t *c, void *block, const int64_t *blo, const int64_t *bhi,
                  const xm_box_t *box, const void *buf);

/* ---- MPI-library baselines (baselines.c) ----------------------------- */

typedef struct bench_mpi_method bench_mpi_method_t;
/* Collective over the world. Builds the per-case state of a baseline
 * ("mpi-bcast" or "mpi-alltoallv"): the sender of each unit task (holder on
 * the least-loaded host, paper 002 section 5.1.2's greedy balance), the
 * communicators and the packing plan. Returns NULL (on every rank) on
 * failure with a message on rank 0's stderr. */
bench_mpi_method_t *bench_mpi_setup(const bench_world_t *w, const bench_case_t *c,
                                    const char *method);
/* Runs one resharding: src and dst are this rank's local blocks. 0 on
 * success. Not timed inside: the harness times around it. Buffers move as
 * 4-byte units (MPI_INT), so 8-byte elements travel unchanged. */
int bench_mpi_run(bench_mpi_method_t *m, const void *src, void *dst);
void bench_mpi_free(bench_mpi_method_t *m);
/* The method's modelled time on cluster c with the senders it chose
 * (xm_cost_mpi); NAN if the model does not apply. */
double bench_mpi_predict(const bench_mpi_method_t *m, const xm_cluster_t *c);

/* ---- ScaLAPACK baseline (scalapack.c) -------------------------------- */

/* 1 if xmesh-bench was built with ScaLAPACK (XMESH_BENCH_HAVE_SCALAPACK). */
int bench_scalapack_built(void);

typedef struct bench_scalapack bench_scalapack_t;
/* Collective over the world. Sets up "scalapack-pdgemr2d" for a 2-D f64
 * case: a BLACS grid per layout (block-cyclic with block = ceil(n/p) per
 * dim, which is the case's block layout when numpy-style splits agree)
 * and a 1 x n union grid over both meshes (pdgemr2d's last argument).
 * Returns NULL on every rank when the method cannot run, with `status`
 * set to "not-built" (no ScaLAPACK), "n/a" (the layouts are not
 * expressible: replication, several axes on one dim, non-ceil splits) or
 * "setup-failed", and a reason in `why`. The decision is the same on every
 * rank (a pure function of the case). */
bench_scalapack_t *bench_scalapack_setup(const bench_world_t *w, const bench_case_t *c,
                                         char *status, size_t status_len, char *why,
                                         size_t why_len);
/* Runs pdgemr2d: src and dst are this rank's row-major blocks (NULL when
 * not in that mesh). Ranks outside both meshes return at once. 0 on
 * success (pdgemr2d itself aborts on bad arguments). */
int bench_scalapack_run(bench_scalapack_t *s, const double *src, double *dst);
/* Frees the grids (collective for the members). NULL is a no-op. */
void bench_scalapack_free(bench_scalapack_t *s);
/* Releases BLACS's own buffers (not MPI) if BLACS was used. */
void bench_scalapack_finalize(void);

/* ---- whole models (weights.c): xmesh-bench -s weights ---------------- */

typedef struct bench_weights_opts {
    int iters, warmup, check;
    const char *json;    /* -J path or NULL */
    const char *cases;   /* -C comma list or NULL: all */
    const char *methods; /* -m comma list or NULL: all */
} bench_weights_opts_t;

/* Collective over the world: runs the weights suite (GPT-2's parameters
 * between training and inference layouts, 1,000 small tensors) with every
 * method, prints the table and the targets on rank 0, writes JSON. Returns
 * 0, 1 (wrong elements or a failed method) or 2 (too few ranks). */
int bench_weights(const bench_world_t *w, xmesh_ctx_t ctx, const bench_weights_opts_t *o);

/* ---- calibration (calib.c) ------------------------------------------- */

typedef struct bench_calib {
    double nominal_mbit; /* the shaper's rate (XMESH_NIC_GBPS), 0 if unknown */
    double one_mbit;     /* one transfer host 0 -> host 1 */
    double shared_mbit;  /* each of two transfers out of host 0's NIC (-1: < 3 hosts) */
    double ring_mbit;    /* each transfer of a ring over all hosts (full duplex) */
    double intra_mbit;   /* host 0 device 0 -> device 1 (-1: one device per host) */
} bench_calib_t;

/* Collective over the world. Measures with `bytes` per transfer; fills *out
 * on every rank. */
void bench_calibrate(const bench_world_t *w, int64_t bytes, bench_calib_t *out);

#endif /* XMESH_BENCH_H */
