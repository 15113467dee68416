/*
 * The U-Transformer's layers on SBP tensors (nn/sbp.h) over a stage mesh: the layer tapes of
 * models/utransformer.c run op by op through nn/sbp_conv.h and nn/sbp_ops.h (convolution, group
 * norm, SiLU, up-sampling, concat, token layout, linear, head-split attention, residual add,
 * boxing); no private parallel code. Every parameter and every boxed activation has a class
 * name, and its SBP on each mesh axis comes from a strategy table (per class, per axis).
 *
 * Strategies are nn/strategy.h tables (one engine for both models: the text form, parse, format,
 * load from a file or a built-in): one line per class, `#` comments, an optional storage SBP:
 *     strategy megatron axes=2
 *     conv1.w = B,S(0)
 *     down1.attn.q.w = B,B        # a layer-qualified line overrides the class for that layer
 *     attn.q.w = B,S(0) store S(0),S(0)   # kept sharded over both axes between steps
 * Classes: parameters by their name without the layer prefix (conv.w, conv.b (conv_in,
 * conv_out), conv1.{w,b}, gn.{gamma,beta}, conv2.{w,b}, attn.{q,k,v,o}.{w,b}, down.{w,b},
 * up.{w,b}); activations act.x (every layer input and output, skips), act.block (a conv block's
 * output), act.up (the up-sampling conv's output), act.cond (the conditioning tokens). A lookup
 * tries "<layer>.<class>" then "<class>".
 *
 * Built-ins (xmp_ut_strategy_builtin, meshes of 1 to 4 axes), by the role each axis plays:
 *   dp        every axis data: parameters B, activations S(0)
 *   megatron  the last axis tensor-parallel (conv1 by output channel, group norm on the local
 *             channels, conv2 by input channel, attention heads, output projection by row, the
 *             up-sampling conv by output channel), the others data
 *   3d        the last three axes are AutoDDL's (R, A, K) (paper 000, 4.3): every convolution and
 *             linear takes input (S(0),B,S(1)) x weight (B,S(0)|S(1),S(1)|S(0)) -> (S(0),S(1),P)
 *             (out-channel split on A, in-channel split on K; conv2 and the attention output
 *             projection swap A and K so no boxing sits between a pair); a leading 4th axis is
 *             data parallel; on fewer axes the last roles are kept (A, K / K)
 *   axonn     3d with the weights (every .w) also stored split over the R axis (AxoNN's depth
 *             shard, paper 001 III-B): all-gathered before use, gradients reduce-scattered
 * Where an op cannot take a split the built-in writes an explicit layer-qualified line that
 * boxes to what it can (the up layers' channel concat takes no channel split: their act.x is
 * B on K; attention whose heads the splitting axes do not divide is B there; the output norm's
 * gamma follows its input), never a silent replication.
 *
 * Errors: functions return 0 or -1 with xmp_last_error() naming the class, layer, axis and
 * rule (nn/ messages are passed on with the op that raised them).
 */
#ifndef XMP_MODELS_UTRANSFORMER_SBP_H
#define XMP_MODELS_UTRANSFORMER_SBP_H

#include <stddef.h>
#include <stdint.h>

#include "models/utransformer.h"
#include "nn/overlap.h"
#include "nn/sbp.h"

#ifdef __cplusplus
extern "C" {
#endif

#include "nn/strategy.h"

/* The U-Transformer's strategy: an nn/strategy.h table. */
typedef xmp_strategy_t xmp_ut_strategy_t;

/* Built-in names, for messages. */
#define XMP_UT_STRATEGY_BUILTINS "dp, megatron, 3d, axonn"

/* nn/strategy.h xmp_strategy_mesh_builtin_fn: user is the model's const xmp_ut_config_t *;
 * writes built-in `name` (dp, megatron, 3d, axonn) for a mesh of naxes axes with sizes shape
 * (NULL: all 1). 0, 1 (no such built-in) or -1 with err. */
int xmp_ut_strategy_builtin(void *user, const char *name, int naxes, const int *shape, char *text,
                            size_t n, char *err, size_t errlen);
/* A built-in name or the path of a strategy file (nn/strategy.h xmp_strategy_load_mesh with the
 * built-ins above), for a naxes-axis mesh of sizes shape. 0 or -1 (xmp_last_error names the
 * file or built-in, the line and the class). */
int xmp_ut_strategy_load(const char *name_or_file, const xmp_ut_config_t *c, int naxes,
                         const int *shape, xmp_ut_strategy_t *s);
/* The compute SBP of class cls in layer `layer` ("down1"; NULL: class only), or NULL if absent;
 * xmp_ut_strategy_store its storage SBP (the compute SBP when the line has no 'store'). */
const xmp_sbp_t *xmp_ut_strategy_get(const xmp_ut_strategy_t *s, const char *layer,
                                     const char *cls);
const xmp_sbp_t *xmp_ut_strategy_store(const xmp_ut_strategy_t *s, const char *layer,
                                       const char *cls);
/* Checks before anything runs that every class the layers [first, last] need is in *s and that
 * an SBP rule of the layers' ops covers each one on each axis of a mesh of that shape (s->naxes
 * sizes), walking each layer's graph (models/utransformer_graph.h) through nn/strategy.h's
 * xmp_strategy_check_graph_classes, then the model's own rules: no spatial split or partial sum of
 * a feature map, no channel split into the up layers' concat, parameter splits within the tensor's
 * dims, storage SBPs that are S or B, attention heads divisible by the channel pieces. -1 names the
 * class, layer, axis and rule. */
int xmp_ut_strategy_check(const xmp_ut_strategy_t *s, const xmp_ut_config_t *c, int first, int last,
                          const int *shape);

/* Measured allocations (nn/sbp.h xmp_mem_*, contract D: every tensor of a tape, every
 * temporary of the nn/ ops) of this thread: live now, and the peak since the last reset;
 * xmp_ut_mem_track counts a model buffer that is not a tensor (e.g. a micro-batch's input,
 * target and conditioning data): + when allocated, - when freed. */
int64_t xmp_ut_mem_live_bytes(void);
int64_t xmp_ut_mem_peak_bytes(void);
void xmp_ut_mem_peak_reset(void);
void xmp_ut_mem_track(int64_t delta);

/* One layer's parameters on a mesh (shared by its micro-batches) and its tape. */
typedef struct xmp_ut_slayer xmp_ut_slayer_t;
/* Per micro-batch state of one layer: the forward values, caches and gradients. */
typedef struct xmp_ut_tape xmp_ut_tape_t;

/* Collective over mesh. Layer `layer` for micro-batches of nb images (global), parameters with
 * the SBPs of *s, initialised as this rank's blocks of full (the layer's layer_count floats in
 * the global layout). NULL on error (message set). */
xmp_ut_slayer_t *xmp_ut_slayer_create(const xmp_ut_config_t *c, int layer, int nb, xmp_mesh_t *mesh,
                                      const xmp_ut_strategy_t *s, const float *full);
void xmp_ut_slayer_destroy(xmp_ut_slayer_t *l);
/* Bytes of this rank's parameter blocks: the stored form (sharded or compute) and its optimizer
 * state (SGD-Nesterov velocity), and the compute copies (== stored when nothing is sharded). */
int64_t xmp_ut_slayer_param_bytes(const xmp_ut_slayer_t *l);
int64_t xmp_ut_slayer_optimizer_bytes(const xmp_ut_slayer_t *l);
int64_t xmp_ut_slayer_compute_bytes(const xmp_ut_slayer_t *l);
/* Collective: writes this layer's full parameters (layer_count floats) into full. */
int xmp_ut_slayer_gather_params(const xmp_ut_slayer_t *l, float *full);

/* Collective: writes the accumulated parameter gradients (after xmp_ut_slayer_reduce: the
 * global gradient; zeros where none) into full (layer_count floats). */
int xmp_ut_slayer_gather_grads(const xmp_ut_slayer_t *l, float *full);

/* Forward of one micro-batch. Inputs (any SBP; boxed to act.x / act.cond copies): x (nb, c, h,
 * w), skip_in for up layers, cond (nb, 16, D) for layers that use it. Creates *tape; *y and
 * *skip_out (down layers) point into it (SBP act.x), valid until the tape is freed. */
int xmp_ut_slayer_forward(xmp_ut_slayer_t *l, const xmp_tensor_t *x, const xmp_tensor_t *skip_in,
                          const xmp_tensor_t *cond, xmp_ut_tape_t **tape, const xmp_tensor_t **y,
                          const xmp_tensor_t **skip_out);
/* Input part of backward: dy (gradient of y, any SBP), dskip_out (NULL: zero). Allocates dx
 * (when dx != NULL and the layer has a differentiable input) and dskip_in (up layers), both
 * boxed to act.x's gradient SBP. */
int xmp_ut_slayer_backward_input(xmp_ut_slayer_t *l, xmp_ut_tape_t *tape, const xmp_tensor_t *dy,
                                 const xmp_tensor_t *dskip_out, xmp_tensor_t *dx,
                                 xmp_tensor_t *dskip_in);
/* Weight part: accumulates the parameter gradients of this micro-batch, then frees the tape. */
int xmp_ut_slayer_backward_weight(xmp_ut_slayer_t *l, xmp_ut_tape_t *tape);
/* Frees a tape (NULL-safe), e.g. after an error. */
void xmp_ut_tape_free(xmp_ut_tape_t *tape);

/* Recomputation (issue 23; the values match sched/schedule.h xmp_recompute_t). After a
 * forward, xmp_ut_tape_drop frees what the mode recomputes: BLOCK every value and cache of the
 * tape but the layer's inputs and outputs; SELECTIVE the attention probabilities only.
 * xmp_ut_tape_recompute, before the backward, runs the dropped ops again from the kept
 * inputs (collective over the layer's mesh, like the forward); the forward is deterministic,
 * so the backward sees the same numbers. NONE: both do nothing. 0 or -1 (message set). */
enum { XMP_UT_RECOMPUTE_NONE = 0, XMP_UT_RECOMPUTE_BLOCK = 1, XMP_UT_RECOMPUTE_SELECTIVE = 2 };
int xmp_ut_tape_drop(xmp_ut_tape_t *tape, int mode);
int xmp_ut_tape_recompute(xmp_ut_tape_t *tape, int mode);
/* Collective: boxes the accumulated gradients to the parameters' storage SBP (P -> B: the
 * data-parallel sum; P -> S: a reduce-scatter where the storage is sharded). start/wait: the
 * same reductions nonblocking (defer-grad: every layer of a stage started, then waited in the
 * same order); xmp_ut_slayer_reduce is start then wait. */
int xmp_ut_slayer_reduce(xmp_ut_slayer_t *l);
int xmp_ut_slayer_reduce_start(xmp_ut_slayer_t *l);
int xmp_ut_slayer_reduce_wait(xmp_ut_slayer_t *l);

/* Overlap switches of the layer (nn/overlap.h; default: none; numbers unchanged either way):
 *   bwd-input    conv and linear backward: the input gradient's box (the one the op that made
 *                the input would do: the act.* box's backward, or the edge box to act.x) is
 *                started before and waited after the weight-gradient GEMM, which then runs in
 *                backward_input (backward_weight skips it); only where the input has one
 *                reader, so the gradient sum is the same
 *   prefetch     xmp_ut_slayer_update only starts the gather of a sharded parameter's compute
 *                copy; the layer's next forward (or sync, or destroy) waits it, so a stage's
 *                later layers' gathers are in flight during its earlier layers' forwards
 *   coll-matmul  a conv or linear whose output only feeds an act.* box runs with the box in
 *                pieces along the images (xmp_conv2d_forward_box / xmp_linear_forward_box)
 *   defer-grad   acts in the trainer's R slot (reduce_start for every layer, then the waits) */
void xmp_ut_slayer_set_overlap(xmp_ut_slayer_t *l, const xmp_overlap_t *ov);
/* After xmp_ut_slayer_reduce: the sum of squares of this rank's gradient elements, each
 * distinct element counted once over the mesh (a block replicated over an axis counts on the
 * rank with coordinate 0 there), for the global gradient norm. */
double xmp_ut_slayer_grad_sumsq(const xmp_ut_slayer_t *l);
/* After xmp_ut_slayer_reduce: multiplies the gradients by scale (gradient clipping). */
void xmp_ut_slayer_scale_grads(xmp_ut_slayer_t *l, float scale);
/* SGD-Nesterov on this rank's stored blocks (xmp_unet_sgd_nesterov), then zeroes the gradients;
 * a parameter with a storage SBP is all-gathered back into its compute copy (nn/param.h). */
int xmp_ut_slayer_update(xmp_ut_slayer_t *l, float lr, float momentum, float wd);
/* Collective: the compute copies refreshed from the stored shards (after a checkpoint load into
 * xmp_ut_slayer_named's tensors). 0 or -1. */
int xmp_ut_slayer_sync(xmp_ut_slayer_t *l);

/* Named state of a layer for checkpoints (models/utrans_ckpt.h): name "<layer>.<param>"
 * ("down1.conv1.w", layout-independent), the stored parameter tensor (the strategy's storage SBP,
 * the compute SBP when it gives none; after loading into it call xmp_ut_slayer_sync) and a view
 * of its SGD-Nesterov velocity in the parameter's layout (data borrowed: never free it). Fills
 * at most max entries of out; returns the layer's parameter count. */
typedef struct {
    char name[96];
    xmp_tensor_t *param;
    xmp_tensor_t vel;
} xmp_ut_named_t;
int xmp_ut_slayer_named(xmp_ut_slayer_t *l, xmp_ut_named_t *out, int max);

#ifdef __cplusplus
}
#endif
#endif /* XMP_MODELS_UTRANSFORMER_SBP_H */
