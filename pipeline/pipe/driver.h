/*
 * Pipeline driver: runs this rank's action list of a schedule
 * (sched/schedule.h) with one xmesh plan per stage-graph edge and direction.
 *
 * Uses libxmesh only through <xmesh.h> and <xmesh/mpi.h>.
 *
 * ----------------------------------------------------------------------------
 * Stage interface contract (what a model stage implements)
 * ----------------------------------------------------------------------------
 * A stage is a set of layers placed on one mesh (a group of ranks). Every rank
 * of the stage runs the same actions; each rank sees only ITS local blocks of
 * the boundary tensors, in the layouts given per edge (below). Callbacks return
 * 0 on success and nonzero on failure (the driver stops the step and reports
 * "stage callback <name> failed with <code>"). They are called on the thread
 * that called xmp_driver_step().
 *
 * Edges are numbered 0..nedges-1 in the order of xmp_driver_cfg_t.edges. For a
 * stage, its in-edges are the edges with dst == stage, in increasing edge id,
 * and its out-edges those with src == stage, in increasing edge id: in[k],
 * out[k], grad_out[k], grad_in[k] below follow that order. A tensor consumed
 * by two stages is two edges (two out-edges of the producer); the producer
 * adds up both gradients in its backward.
 *
 *   forward(user, mb, in, out, &loss)
 *       in[k]:  this rank's block of in-edge k's activation for microbatch mb,
 *               dense row-major in the edge's CONSUMER layout (dst_spec on the
 *               consumer mesh). Read-only. The driver keeps it unchanged until
 *               this step's O action, so the stage may keep the pointer for its
 *               backward instead of copying.
 *       out[k]: this rank's block of out-edge k's activation (PRODUCER layout,
 *               src_spec on this stage's mesh), to be fully written. The
 *               driver sends it after forward returns and keeps it until the
 *               end of the step (the stage may also keep the pointer).
 *       loss:   a stage that computes a loss adds this microbatch's loss
 *               (this rank's share) to *loss; others leave it alone.
 *       Microbatch inputs that do not come from edges (tokens, targets) are
 *       the stage's own business: it knows mb.
 *   backward_input(user, mb, grad_out, grad_in)
 *       grad_out[k]: gradient of out-edge k's activation, this rank's block in
 *               the gradient layout on this stage's mesh (grad_dst_spec,
 *               default src_spec). Read-only, valid until the end of the step.
 *       grad_in[k]: gradient w.r.t. in-edge k's activation, this rank's block
 *               in grad_src_spec (default dst_spec) on this stage's mesh, to
 *               be fully written; the driver sends it to the producer.
 *       Computes input gradients only; keeps what backward_weight(mb) needs.
 *   backward_weight(user, mb)
 *       Accumulates the weight gradients of mb (called after
 *       backward_input(mb), possibly after other microbatches' actions).
 *   backward(user, mb, grad_out, grad_in)
 *       Full backward (B = I + W). May be NULL: the driver then calls
 *       backward_input then backward_weight.
 *   reduce_grads(user)       R: reduce weight gradients over the stage's
 *                            data-parallel ranks (may be NULL: nothing).
 *   optimizer_step(user)     O: apply the update and zero the gradients for the
 *                            next step (may be NULL).
 *   activation_bytes(user)   optional (NULL): bytes of activations the stage
 *                            currently holds; queried after every compute
 *                            action to report the peak.
 *   set_progress(user, progress, arg)   optional (NULL): for the duration of
 *                            each xmp_driver_step the driver hands the stage
 *                            its progress function (progress(arg) issues
 *                            queued transfers and retires finished ones;
 *                            never blocks); after the step it calls
 *                            set_progress(user, NULL, NULL). A stage calls
 *                            progress(arg) between layers, so transfers move
 *                            while it computes. Passed explicitly: no
 *                            driver is reachable through hidden state.
 *
 * Virtual stages: when the schedule puts several model stages on one rank group
 * (sched->stage_group), the meshes of those stages list the same ranks (order and shape may
 * differ), cfg.stage_ops gives each model stage its own callbacks and user pointer, and a rank
 * runs all of its group's stages from one action list: each compute action calls the
 * callbacks of its chunk's stage with that stage's in/out edges; R and O call reduce_grads and
 * optimizer_step of every stage of the group in stage order. An edge between two stages of the
 * same group is an xmesh plan like any other (this rank sends and receives; one request per
 * microbatch, issued at the send). activation_bytes is summed over the group's stages.
 *
 * Every rank of the job (also ranks in no stage) calls xmp_driver_create,
 * xmp_driver_step, xmp_driver_write_trace and xmp_driver_destroy together
 * (collective over cfg.comm).
 *
 * ----------------------------------------------------------------------------
 * Transfers
 * ----------------------------------------------------------------------------
 * For each edge e, in edge order, every rank creates two plans (collective):
 * the activation plan (src layout on the producer mesh -> dst layout on the
 * consumer mesh) and the gradient plan (grad_src layout on the consumer mesh
 * -> grad_dst layout on the producer mesh). Edges between the same two stages
 * whose starts and waits sit in the same slots of the schedule for every
 * microbatch (the U-Transformer's skips) share ONE plan of many tensors per
 * direction, issued at the first start of the slot (XMESH_PIPE_BUNDLE=0: one
 * plan per edge and direction; xmp_driver_plans() counts them). A schedule's start action
 * enqueues the microbatch on the plan's FIFO; the driver issues it
 * (xmesh_reshard_start) as soon as the plan has no request in flight on this
 * rank, and retires requests with xmesh_test between actions and in
 * xmp_driver_progress. A wait action blocks until that microbatch's transfer
 * completed (xmesh_wait when no other plan has queued starts, else polling so
 * that queued starts keep being issued).
 *
 * Communication modes:
 *   XMP_COMM_BROADCAST            xmesh's broadcast strategy (default)
 *   XMP_COMM_SENDRECV             strategy sendrecv
 *   XMP_COMM_SENDRECV_ALLGATHER   strategy sendrecv-allgather
 *   XMP_COMM_BLOCKING             default strategy, no overlap on the
 *                                 receiving side: a receive is started at its
 *                                 wait action and waited at once (no posting
 *                                 ahead), so no incoming transfer overlaps the
 *                                 consumer's compute. Sends still start after
 *                                 their producer without waiting: a sender
 *                                 that also waited at once would deadlock
 *                                 1F1B (both neighbours sending, neither
 *                                 receiving), which the dry run reports.
 *   XMP_COMM_SIGNAL               timing only: every boundary transfer is an
 *                                 xmesh plan of a 1-element u8 tensor ("R" on
 *                                 both meshes) with the same dependencies; the
 *                                 consumers' in/grad_out buffers hold zeros.
 *
 * Boundary dtype (mixed precision at the boundaries): an edge whose wire dtype W
 * (edge.wire_dtype, else cfg.boundary_dtype) is set and differs from its dtype D moves
 * in W: both plans of the edge are D -> W plans (xmesh converts once, on the sender
 * when W is narrower, so W's bytes cross the wire; docs/DTYPES.md), the receiver gets
 * W blocks into driver buffers and the driver widens them with xmesh_convert into the
 * D buffers the callbacks read, at the wait action. Callbacks see D on both sides, as
 * without the option. D and W must be two of f32, f16 and bf16 (else xmp_driver_create
 * refuses, naming both). Unset (XMESH_U8 / W == D): the path is the one without the
 * option. Signal mode ignores it.
 *
 * Chrome trace (xmp_driver_write_trace): one JSON array, written by rank 0
 * with every rank's events (gathered over cfg.comm): pid = rank, tid 0
 * "compute" (F/B/I/W/R/O), tid 1 "transfers" (issue -> completion seen), tid 2
 * "waits" (time blocked in wait actions); flow arrows ('s' on the sender
 * stage's first rank at the issue of a transfer, 'f' on the receiver stage's
 * first rank at the end of the wait for it). Timestamps: microseconds since
 * the barrier in xmp_driver_create, per rank (MPI_Wtime).
 */
#ifndef XMP_DRIVER_H
#define XMP_DRIVER_H

#include <stddef.h>
#include <stdint.h>

#include <xmesh.h>
#include <xmesh/mpi.h>

#include "sched/schedule.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    void *user;
    int (*forward)(void *user, int mb, const void *const *in, void *const *out, double *loss);
    int (*backward_input)(void *user, int mb, const void *const *grad_out, void *const *grad_in);
    int (*backward_weight)(void *user, int mb);
    int (*backward)(void *user, int mb, const void *const *grad_out, void *const *grad_in);
    int (*reduce_grads)(void *user);
    int (*optimizer_step)(void *user);
    int64_t (*activation_bytes)(void *user);
    void (*set_progress)(void *user, void (*progress)(void *arg), void *arg);
} xmp_stage_ops_t;

/* One stage's mesh: prod(shape) distinct ctx ranks, row-major. Stages use
 * disjoint rank sets. */
typedef struct {
    int ndim;
    int shape[XMESH_MAX_MESH_DIMS];
    const int *ranks;
} xmp_stage_mesh_t;

/* One stage-graph edge: a tensor of `shape` per microbatch. */
typedef struct {
    int src, dst; /* producer and consumer stage */
    int ndim;
    int64_t shape[XMESH_MAX_TENSOR_DIMS];
    xmesh_dtype_t dtype;
    const char *src_spec;      /* activation on the producer mesh */
    const char *dst_spec;      /* activation on the consumer mesh */
    const char *grad_src_spec; /* gradient on the consumer mesh (NULL: dst_spec) */
    const char *grad_dst_spec; /* gradient on the producer mesh (NULL: src_spec) */
    /* Dtype on the wire (both directions), or XMESH_U8 (0, the memset default) / dtype: none
     * (then cfg.boundary_dtype applies). See "Boundary dtype" above. */
    xmesh_dtype_t wire_dtype;
} xmp_edge_cfg_t;

typedef enum {
    XMP_COMM_BROADCAST = 0,
    XMP_COMM_SENDRECV = 1,
    XMP_COMM_SENDRECV_ALLGATHER = 2,
    XMP_COMM_BLOCKING = 3,
    XMP_COMM_SIGNAL = 4,
    XMP_COMM_COUNT_ = 5
} xmp_comm_mode_t;
/* "broadcast", "sendrecv", "sendrecv-allgather", "blocking", "signal"; -1 if unknown. */
int xmp_comm_mode_parse(const char *name);
const char *xmp_comm_mode_name(int mode);

typedef struct {
    MPI_Comm comm;   /* the communicator ctx was created over (barrier, trace gather) */
    xmesh_ctx_t ctx; /* borrowed; outlives the driver */
    int nstages;     /* == sched->nstages */
    const xmp_stage_mesh_t *meshes; /* nstages; copied */
    int nedges;                     /* == sched->nedges, same src/dst per edge */
    const xmp_edge_cfg_t *edges;    /* nedges; copied (spec strings too) */
    const xmp_schedule_t *sched;    /* borrowed; outlives the driver; must validate */
    xmp_stage_ops_t ops;            /* this rank's stage (ignored on ranks in no stage) */
    int mode;                       /* xmp_comm_mode_t */
    int trace;                      /* 1: record events for xmp_driver_write_trace */
    /* Virtual stages: NULL, or nstages entries indexed by MODEL stage, each the callbacks and
     * user pointer of that stage; a rank reads only the entries of its group's stages (others
     * may be zero). Required when the schedule puts several stages on a group; when set,
     * `ops` is ignored. */
    const xmp_stage_ops_t *stage_ops;
    /* Wire dtype of every edge whose own wire_dtype is unset; XMESH_U8 (0, the default) or
     * the edge's dtype: none (the edge moves in its dtype, as without the option). */
    xmesh_dtype_t boundary_dtype;
} xmp_driver_cfg_t;

typedef struct xmp_driver xmp_driver_t;

/* Per-step measurements (this rank unless said otherwise). */
typedef struct {
    double loss;            /* sum of this rank's forward losses */
    double step_s;          /* max over all ranks of the step's wall time (after a barrier) */
    double local_s;         /* this rank's wall time of the step */
    double compute_s;       /* time inside stage callbacks */
    double bubble;          /* (local_s - compute_s) / local_s: compute idle fraction */
    double wait_s;          /* time blocked in transfer waits */
    int peak_act_mb;        /* max microbatches with F done and B/W not done */
    int64_t peak_act_bytes; /* max of ops.activation_bytes (0 without the callback) */
    double xmesh_cpu_s;     /* CPU xmesh's progress thread and waits took (xmesh_ctx_get_stats) */
    int64_t xmesh_staged_bytes; /* bytes xmesh copied through staging during the step */
} xmp_step_stats_t;

/* Collective over cfg->comm: checks the config and schedule (validator and
 * deadlock dry run with the mode's semantics), creates the stage meshes and
 * the 2*nedges plans in edge order, allocates per-microbatch buffers. On
 * error returns non-SUCCESS with a message naming the bad value in err and
 * creates nothing. */
xmesh_result_t xmp_driver_create(const xmp_driver_cfg_t *cfg, xmp_driver_t **out, char *err,
                                 size_t errlen);
/* Collective: runs this rank's action list once (one training step). */
xmesh_result_t xmp_driver_step(xmp_driver_t *d, xmp_step_stats_t *stats);
/* Issues queued starts and retires finished requests; never blocks. NULL: no-op. */
void xmp_driver_progress(xmp_driver_t *d);
/* This rank's stage (-1: none); with virtual stages its group's lowest stage. */
int xmp_driver_stage(const xmp_driver_t *d);
/* This rank's group (-1: none): the index of its action list in the schedule. */
int xmp_driver_group(const xmp_driver_t *d);
/* This rank's model stages in chunk order into stages[0..max); returns how many it has. */
int xmp_driver_stages(const xmp_driver_t *d, int *stages, int max);
/* xmesh plans the driver created: one per bundle (the edges that cross the same stage
 * boundary in the same direction and the same slots of the schedule share one plan of many;
 * XMESH_PIPE_BUNDLE=0: one per edge and direction, 2 * nedges). */
int xmp_driver_plans(const xmp_driver_t *d);
/* Detailed message of the driver's last error. */
const char *xmp_driver_error(const xmp_driver_t *d);
/* Predicted step by the timed simulator: per-stage costs (seconds) f, i, w
 * (b = i + w), transfer times from each plan's xmesh_plan_get_info
 * predicted_s. res as in xmp_sim_run (free with xmp_sim_result_free). */
xmesh_result_t xmp_driver_predict(xmp_driver_t *d, const double *f, const double *i,
                                  const double *w, xmp_sim_result_t *res);
/* The same with every simulator input of costs (compute costs per model stage, b, r, o and the
 * memory model: act_bytes, ckpt_bytes, selective_keep, whose peak_bytes per group the caller
 * can set against the measured peak_act_bytes); xfer and late_recv come from the driver. */
xmesh_result_t xmp_driver_predict_costs(xmp_driver_t *d, const xmp_sim_costs_t *costs,
                                        xmp_sim_result_t *res);
/* xmesh's predicted seconds of one transfer of each plan (xmesh_plan_get_info), at plan index
 * 2*edge+dir, into x[0 .. 2*nedges-1] (in signal mode: the signals' own plans). Local. */
xmesh_result_t xmp_driver_plan_seconds(xmp_driver_t *d, double *x);
/* Mean over the activation plans (every edge, producer -> consumer) of xmesh's predicted
 * seconds (xmesh_plan_get_info); 0 without edges and in signal mode (no data moves). Local. */
double xmp_driver_mean_act_seconds(xmp_driver_t *d);
/* Boundary bytes of one step (the same on every rank), summed over the 2*nedges plans, each
 * counted once per microbatch: *wire the tensors' bytes in their wire dtype (elements x size;
 * replication not counted), *cross_host xmesh_plan_get_info's bytes_cross_host (0 when every
 * rank is on one host). Either may be NULL. Signal mode: the 1-byte signals. */
xmesh_result_t xmp_driver_boundary_bytes(xmp_driver_t *d, int64_t *wire, int64_t *cross_host);
/* Collective: gathers every rank's recorded events to rank 0 of cfg.comm,
 * which writes the Chrome trace JSON to path (see above). */
xmesh_result_t xmp_driver_write_trace(xmp_driver_t *d, const char *path);
/* Collective; NULL is a no-op. Destroys plans and meshes. */
xmesh_result_t xmp_driver_destroy(xmp_driver_t *d);

#ifdef __cplusplus
}
#endif
#endif /* XMP_DRIVER_H */
