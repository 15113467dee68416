/*
 * The U-Transformer's layers on SBP tensors (nn/sbp.h) over a stage mesh: the layer tapes of
 * models/utransformer.c run op by op through nn/sbp_conv.h and nn/sbp_ops.h (convolution, group
 * norm, SiLU, up-sampling, concat, token layout, linear, head-split attention, residual add,
 * boxing); no private parallel code. Every parameter and every boxed activation has a class
 * name, and its SBP on each mesh axis comes from a strategy table (per class, per axis).
 *
 * Strategy text (one line per class, `#` comments, blank lines ignored; the same form as
 * nn/strategy.h, contract B, so that module can supply the table later):
 *     strategy megatron axes=2
 *     conv1.w = B,S(0)
 *     down1.attn.q.w = B,B        # a layer-qualified line overrides the class for that layer
 * Classes: parameters by their name without the layer prefix (conv.w, conv.b (conv_in,
 * conv_out), conv1.{w,b}, gn.{gamma,beta}, conv2.{w,b}, attn.{q,k,v,o}.{w,b}, down.{w,b},
 * up.{w,b}); activations act.x (every layer input and output, skips), act.block (a conv block's
 * output), act.up (the up-sampling conv's output), act.cond (the conditioning tokens). A lookup
 * tries "<layer>.<class>" then "<class>".
 *
 * Built-ins (2-axis mesh dp x tp; xmp_ut_strategy_builtin):
 *   dp        every parameter B,B; every activation S(0),B
 *   megatron  today's channel split on the tp axis: conv1 output channels (S(0)), group norm on
 *             the local channels, conv2 input channels (S(1), output P boxed to act.block =
 *             S(0),B), attention q/k/v column split (heads), output projection row split, the
 *             up-sampling conv by output channel (output S(1), boxed to act.up = S(0),B); the
 *             rest replicated; attention whose heads the tp size does not divide is replicated by
 *             explicit per-layer lines (written into the text, never silently).
 *
 * Errors: functions return 0 or -1 with xmp_ut_last_error() naming the class, layer, axis and
 * rule (nn/ messages are passed on with the op that raised them).
 */
#ifndef XMP_MODELS_UTRANSFORMER_SBP_H
#define XMP_MODELS_UTRANSFORMER_SBP_H

#include <stddef.h>
#include <stdint.h>

#include "models/utransformer.h"
#include "nn/sbp.h"

#ifdef __cplusplus
extern "C" {
#endif

#define XMP_UT_MAX_CLASSES 128

typedef struct {
    char name[48];
    xmp_sbp_t sbp[XMP_MAX_MESH_DIMS];
} xmp_ut_class_sbp_t;

typedef struct {
    char name[32];
    int naxes;
    int n;
    xmp_ut_class_sbp_t c[XMP_UT_MAX_CLASSES];
} xmp_ut_strategy_t;

/* Writes the text of built-in strategy `name` ("dp" or "megatron") for config c on a mesh of
 * naxes axes with sizes shape (today naxes must be 2: dp x tp). 0 or -1. */
int xmp_ut_strategy_builtin(const char *name, const xmp_ut_config_t *c, int naxes, const int *shape,
                            char *buf, size_t n);
/* Parses strategy text for a naxes-axis mesh into *s. 0 or -1 (names the line). */
int xmp_ut_strategy_parse(const char *text, int naxes, xmp_ut_strategy_t *s);
/* Prints *s in the text form (parses back to the same table). 0 or -1 if buf is too small. */
int xmp_ut_strategy_format(const xmp_ut_strategy_t *s, char *buf, size_t n);
/* A built-in name (xmp_ut_strategy_builtin) or the path of a strategy text file, parsed for a
 * naxes-axis mesh of sizes shape. 0 or -1 (names the file or the line). */
int xmp_ut_strategy_load(const char *name_or_file, const xmp_ut_config_t *c, int naxes,
                         const int *shape, xmp_ut_strategy_t *s);
/* The SBP of class cls in layer `layer` ("down1"; NULL: class only), or NULL if absent. */
const xmp_sbp_t *xmp_ut_strategy_get(const xmp_ut_strategy_t *s, const char *layer,
                                     const char *cls);
/* Checks before anything runs that every class the layers [first, last] need is in *s and that
 * the splits fit on a mesh of that shape: group-norm groups and attention heads divisible by the
 * channel pieces. -1 names the class, layer, axis and the rule. */
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
/* Bytes of this rank's parameter blocks (and as many for gradients, velocity). */
int64_t xmp_ut_slayer_param_bytes(const xmp_ut_slayer_t *l);
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
/* Collective: boxes the accumulated gradients to the parameters' SBP (P -> B: the data-parallel
 * sum). */
int xmp_ut_slayer_reduce(xmp_ut_slayer_t *l);
/* SGD-Nesterov on this rank's blocks (xmp_unet_sgd_nesterov), then zeroes the gradients. */
int xmp_ut_slayer_update(xmp_ut_slayer_t *l, float lr, float momentum, float wd);

#ifdef __cplusplus
}
#endif
#endif /* XMP_MODELS_UTRANSFORMER_SBP_H */
