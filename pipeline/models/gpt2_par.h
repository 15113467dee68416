/*
 * GPT-2 as pipeline stages of SBP-parallel layers (issues 10, 11 and 20).
 *
 * A stage holds a contiguous range of the model's layers ('E' embedding,
 * 't' transformer blocks, 'L' final norm + tied head + loss; see
 * models/stage_layout.h) on a mesh of 1 to 4 axes. One stage on one mesh is
 * plain DP / TP / 3-D training; several stages are a pipeline run by
 * pipe/driver.h.
 *
 * Strategy (nn/strategy.h, docs/STRATEGY.md). Every parameter class and
 * every activation class takes its SBP on each mesh axis from the stage's
 * strategy; the layers (nn/sbp_ops.h linear, add, GELU, embedding,
 * cross-entropy; nn/sbp_layers.h layer norm, with the channel split, and
 * attention, with heads or sequence split) deduce their outputs per axis and
 * box inputs as needed, and the model boxes each activation to its class SBP
 * after the op that makes it:
 *   parameter classes  wte (Vp, C), wpe (maxT, C), ln1.w ln1.b ln2.w ln2.b
 *                      lnf.w lnf.b attproj.b fcproj.b (C), qkv.w viewed
 *                      (3, NH, hs, C), qkv.b (3, NH, hs), attproj.w (C, C),
 *                      fc.w (4C, C), fc.b (4C), fcproj.w (C, 4C)
 *   activation classes act.x (Bm, T, C) the residual stream and the tensor
 *                      between stages; act.ln1 act.ln2 act.lnf (Bm, T, C)
 *                      layer-norm outputs; act.qkv (Bm, T, 3, NH, hs);
 *                      act.att (Bm, T, C) attention output (heads merged);
 *                      act.fch act.gelu (Bm, T, 4C); act.logits (Bm, T, Vp)
 * Every class is required. Built-ins (xmp_gpt2_strategy_builtin, generated
 * for the mesh's axis count): dp, megatron (the issue-10 table: axis 0 data,
 * axis 1 tensor parallel; more axes: leading axes data), 3d (AutoDDL's 3-D
 * matmul signature for every linear), axonn (3d with the weight matrices
 * stored split over the depth axis, 3 or 4 axes). Sharded storage: a
 * parameter whose storage SBP ("store") differs from its compute SBP keeps
 * its master copy and AdamW moments for the local shard only; its gradient is
 * boxed once per step to the storage SBP (P -> S: reduce-scatter) and, after
 * the update, the shards are gathered into the compute copy the next step
 * uses (S -> B: all-gather). xmp_gpt2_strategy_check refuses, before anything runs, a
 * strategy that no rule covers, naming the class, the mesh axis and the rule.
 *
 * Gradients: each parameter's gradient accumulates over the microbatches
 * with its compute SBP where that is S, P where it is B (so data-parallel
 * and embedding gradients are summed locally, no collective per
 * microbatch); R boxes it once per step to the compute SBP (P -> B:
 * the data-parallel all-reduce).
 *
 * Every rank of a stage reads the same batches (same loader, same seed);
 * microbatch m is rows [m*Bm, (m+1)*Bm) of the batch. Loss and gradients are
 * scaled by Bm/B so the step computes the serial model's mean loss over B*T.
 * Tied wte on different first and last stages: both keep a copy; in R the
 * two copies' gradients are exchanged with two xmesh plans and each side
 * adds the other's, so both apply the same AdamW update (IEEE addition is
 * commutative, the copies stay bitwise equal).
 */
#ifndef XMP_MODELS_GPT2_PAR_H
#define XMP_MODELS_GPT2_PAR_H

#include <mpi.h>

#include "models/gpt2.h"
#include "models/stage_layout.h"
#include "nn/sbp.h"
#include "nn/strategy.h"
#include "pipe/driver.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct xmp_gpt2_stage xmp_gpt2_stage_t;

typedef struct {
    int B, T, M;                     /* batch, sequence, microbatches */
    float lr, beta1, beta2, eps, wd; /* AdamW (llm.c semantics) */
    /* Strategy of each stage (layout->nstages entries, borrowed during create),
     * or NULL: the built-in megatron for each stage's axis count. */
    const xmp_strategy_t *strategy;
    /* xmp_recompute_t (sched/schedule.h): none; block: a transformer block keeps only its
     * output (the next block's input) after the forward and recomputes the rest before its
     * backward; selective: the attention probabilities are dropped and recomputed. Exact:
     * the numbers do not change. */
    int recompute;
} xmp_gpt2_train_cfg_t;

/* Names of the built-in strategies, for messages. */
#define XMP_GPT2_BUILTIN_STRATEGIES "dp, megatron, 3d, axonn"
/* Built-in strategy text for a mesh of naxes axes (xmp_strategy_builtin_fn). */
int xmp_gpt2_strategy_builtin(const char *name, int naxes, char *text, size_t n, char *err,
                              size_t errlen);
/* Checks strategy s for a stage mesh of ndim axes and the given shape, with
 * microbatches of Bm rows: known and required classes, SBPs within each
 * class' dims, and that an SBP rule covers every op the stage runs. Pure;
 * the same result on every rank. Returns 0 or -1 with a message naming the
 * stage, the class, the mesh axis and the missing rule. */
int xmp_gpt2_strategy_check(const xmp_strategy_t *s, const xmp_gpt2_config_t *c, int stage,
                            int ndim, const int *shape, char *err, size_t errlen);

/* Collective over comm (every rank, also ranks in no stage). tc->strategy
 * (or megatron) is checked for every stage first (xmp_gpt2_strategy_check).
 * full: the full
 * model (serial struct, params filled) every rank holds the same of; each
 * stage slices its parameters from it. Creates the stage meshes (all of
 * them, with xmesh meshes over ctx) and, when the first and last stages
 * differ, the two plans of the tied wte. On error returns -1 with a message
 * in err (the same on every rank for argument errors). */
int xmp_gpt2_stage_create(MPI_Comm comm, xmesh_ctx_t ctx, const xmp_gpt2_t *full,
                          const xmp_stage_layout_t *layout, const xmp_gpt2_train_cfg_t *tc,
                          xmp_gpt2_stage_t **out, char *err, size_t errlen);
/* Virtual stages (layout->group, xmp_stage_layout_set_groups): one stage object per model
 * stage of this rank's group, out[c] for chunk c (stages in increasing order), each with its
 * own callbacks (xmp_gpt2_stage_ops) for the driver's stage_ops. Collective: every rank creates
 * xmp_gpt2_stages_max(layout) objects (ranks of groups with fewer stages get padding objects of
 * stage -1, which take no part in the driver but must be destroyed too). When the embedding
 * and the head stage are on the same group (V shape), the two wte copies exchange their
 * reduced gradients locally in R (both stages' R run before either's O), so they stay
 * bitwise equal. */
int xmp_gpt2_stages_max(const xmp_stage_layout_t *layout);
int xmp_gpt2_stages_create(MPI_Comm comm, xmesh_ctx_t ctx, const xmp_gpt2_t *full,
                           const xmp_stage_layout_t *layout, const xmp_gpt2_train_cfg_t *tc,
                           xmp_gpt2_stage_t **out, char *err, size_t errlen);
/* Collective; NULL is a no-op. */
void xmp_gpt2_stage_destroy(xmp_gpt2_stage_t *st);

/* Stage of this rank (-1: none), and the driver callbacks of this stage. */
int xmp_gpt2_stage_index(const xmp_gpt2_stage_t *st);
xmp_stage_ops_t xmp_gpt2_stage_ops(xmp_gpt2_stage_t *st);
/* The edges of the stage graph (chain s -> s+1): n edges written to edges,
 * returned; shapes/specs point into st. */
int xmp_gpt2_stage_edges(const xmp_gpt2_stage_t *st, xmp_edge_cfg_t *edges, xmp_sedge_t *sedges);
/* The stage meshes for the driver (nstages entries). */
void xmp_gpt2_stage_meshes(const xmp_gpt2_stage_t *st, xmp_stage_mesh_t *meshes);

/* Before each step: the batch (B*T inputs and targets, the same on every
 * rank) and the 0-based step (AdamW uses t = step + 1). The pointers must
 * stay valid during the step. */
void xmp_gpt2_stage_set_batch(xmp_gpt2_stage_t *st, const int *inputs, const int *targets,
                              int step);

/* Per-step timing of this rank: seconds in F, I and W callbacks (and per
 * microbatch means), and in boxing collectives; reset by set_batch. */
typedef struct {
    double f_s, i_s, w_s, r_s, o_s; /* totals over the step */
    int nf, ni, nw;                 /* callback counts */
    double comm_s;                  /* inside boxing / SBP collectives (all callbacks) */
} xmp_gpt2_stage_times_t;
void xmp_gpt2_stage_times(const xmp_gpt2_stage_t *st, xmp_gpt2_stage_times_t *t);

/* Collective: gathers every parameter to global rank 0 of comm, which
 * writes the parameters into full->params (others: full untouched). */
int xmp_gpt2_stage_gather(xmp_gpt2_stage_t *st, xmp_gpt2_t *full);
/* The same over this rank's n stage objects (xmp_gpt2_stages_create). */
int xmp_gpt2_stages_gather(xmp_gpt2_stage_t *const *sts, int n, xmp_gpt2_t *full);

/* Collective over comm: xmesh's predicted time (xmesh_plan_get_info's
 * predicted_s) of one boundary activation transfer stage s -> s+1, from a
 * plan created and destroyed here; 0 when there is one stage. */
double xmp_gpt2_stage_edge_seconds(xmp_gpt2_stage_t *st, int s, int mode_strategy);

/* Parameter memory of this rank: stored parameters (shards where sharded),
 * AdamW moments (m and v of the stored part), the compute copies the layers
 * use (gathered where sharded), gradient accumulators; zeros off-stage. */
typedef struct {
    int64_t param_bytes, optimizer_bytes, compute_param_bytes, grad_bytes;
    int sharded; /* parameter tensors with sharded storage */
} xmp_gpt2_stage_memory_t;
void xmp_gpt2_stage_memory(const xmp_gpt2_stage_t *st, xmp_gpt2_stage_memory_t *mem);

/* Sets the recomputation mode (xmp_recompute_t; the schedule's, when a memory cap chose it).
 * Between steps only. */
void xmp_gpt2_stage_set_recompute(xmp_gpt2_stage_t *st, int mode);
/* Measures, by running one forward of microbatch 0 (zero tokens and input; collective over the
 * stage's mesh, before the driver runs), the bytes one microbatch's activations hold on this
 * rank (what activation_bytes reports): act without recomputation, ckpt what block
 * recomputation keeps (the blocks' outputs, the embedding output, the head's tensors), keep
 * the fraction of act that selective recomputation keeps. Zeros on stage -1. 0 or -1. */
int xmp_gpt2_stage_probe_bytes(xmp_gpt2_stage_t *st, double *act, double *ckpt, double *keep);

/* Bytes of activations this rank holds now. */
int64_t xmp_gpt2_stage_activation_bytes(const xmp_gpt2_stage_t *st);

#ifdef __cplusplus
}
#endif
#endif /* XMP_MODELS_GPT2_PAR_H */
