/*
 * U-Transformer (AlpaComm paper, section 5 / artifact: a U-Net whose blocks carry attention
 * layers, with long skip connections from each down level to the matching up level), scaled
 * down to 32x32 images. f32 on the CPU, built from pipeline/nn/unet_kernels.h.
 *
 * The 13 pipeline-splittable layers (index: name; C = base channels, D = 4C conditioning width;
 * "block(a->b)" = conv3x3(a->b) + GN + SiLU + conv3x3(b->b); "xattn" = residual cross-attention
 * to the conditioning x + Wo attn(Wq x, Wk cond, Wv cond); "sattn" = residual self-attention):
 *
 *    0 conv_in   conv3x3 3->C at 32x32
 *    1 down1     block(C->C) + xattn at 32x32; skip s1 (C,32,32); conv3x3 stride 2 -> 16x16
 *    2 down2     block(C->2C) + xattn at 16x16; skip s2 (2C,16,16); stride-2 conv -> 8x8
 *    3 down3     block(2C->4C) + xattn at 8x8; skip s3 (4C,8,8); stride-2 conv -> 4x4
 *    4 down4     block(4C->4C) at 4x4 (plain: no attention, no downsample); skip s4 = output
 *    5 midA      block(4C->4C) + sattn at 4x4
 *    6 midB      block(4C->4C) + xattn at 4x4
 *    7 up1       concat(x, s4) -> block(8C->4C) at 4x4; upsample2x + conv3x3 4C->4C -> 8x8
 *    8 up2       concat(x, s3) -> block(8C->4C) + xattn at 8x8; upsample + conv 4C->2C -> 16x16
 *    9 up3       concat(x, s2) -> block(4C->2C) + xattn at 16x16; upsample + conv 2C->C -> 32x32
 *   10 up4       concat(x, s1) -> block(2C->C) + xattn at 32x32 (no upsample)
 *   11 out       GN + SiLU on C channels
 *   12 conv_out  conv3x3 C->4 (3 clean-image channels + 1 shape-mask channel)
 *
 * Loss: MSE of conv_out against the target over all elements of the (global) batch. Optimizer:
 * SGD with Nesterov momentum (xmp_unet_sgd_nesterov). Attention width at a level with c channels
 * is c, with c / head_dim heads (head_dim defaults to C). GN uses `groups` groups everywhere.
 *
 * Parameters: one flat f32 array, tensors in layer order (so each layer's parameters are one
 * contiguous range), every tensor initialised from its own random stream keyed by (seed, tensor
 * index): a rank can generate any full tensor and slice it. Conv and linear weights are uniform
 * in +-1/sqrt(fan_in), biases 0, GN gamma 1 and beta 0.
 *
 * A layer object (xmp_ut_layer_t) runs one layer on one micro-batch of n images: forward saves
 * what backward needs; backward_input propagates gradients to the layer's inputs and keeps the
 * gradients of its internal outputs; backward_weight (any time after backward_input, before the
 * next forward) accumulates the parameter gradients. Edges: every layer has a main input (except
 * nothing: layer 0's main input is the noisy image) and a main output; down1..down4 also output a
 * skip and up1..up4 take one (xmp_ut_skip_source()); layers with cross-attention read the
 * conditioning sequence (n, 16, D), which is data (no gradient).
 */
#ifndef XMP_MODELS_UTRANSFORMER_H
#define XMP_MODELS_UTRANSFORMER_H

#include <stddef.h>
#include <stdint.h>

#include "nn/error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define XMP_UT_LAYERS 13
#define XMP_UT_IMG 32
#define XMP_UT_IN_CH 3
#define XMP_UT_OUT_CH 4
#define XMP_UT_TOKENS 16
#define XMP_UT_MAX_TENSORS 192

enum {
    XMP_UT_CONV_IN = 0,
    XMP_UT_DOWN1,
    XMP_UT_DOWN2,
    XMP_UT_DOWN3,
    XMP_UT_DOWN4,
    XMP_UT_MID_A,
    XMP_UT_MID_B,
    XMP_UT_UP1,
    XMP_UT_UP2,
    XMP_UT_UP3,
    XMP_UT_UP4,
    XMP_UT_OUT,
    XMP_UT_CONV_OUT
};

/* Errors of xmp_ut_* and xmp_shapes_* functions: xmp_last_error() (nn/error.h). */

typedef struct {
    int base;     /* C: channels of level 1; levels have C, 2C, 4C, 4C */
    int groups;   /* group-norm groups (divides C) */
    int head_dim; /* channels per attention head (divides C) */
    int cond_dim; /* D = 4C, width of the conditioning tokens */
} xmp_ut_config_t;

/* Fills *c for base channels C (>= 1), groups (0: 4 if it divides C, else 1) and head_dim (0: C).
 * Returns 0, or -1 (nothing written) naming the bad value when groups or head_dim does not
 * divide C. */
int xmp_ut_config_init(xmp_ut_config_t *c, int base, int groups, int head_dim);

/* Name of layer i ("conv_in", "down1", ...), or "?" outside [0, 13). */
const char *xmp_ut_layer_name(int layer);
/* The down layer whose skip layer `layer` consumes (up1 <- down4, ..., up4 <- down1), or -1. */
int xmp_ut_skip_source(int layer);
/* The up layer consuming the skip produced by `layer`, or -1. */
int xmp_ut_skip_dest(int layer);
/* 1 if layer reads the conditioning sequence. */
int xmp_ut_layer_uses_cond(const xmp_ut_config_t *c, int layer);

/* Shape (c, h, w) of one image of layer i's main output, and of its skip output (0s if none). */
void xmp_ut_layer_out_shape(const xmp_ut_config_t *c, int layer, int chw[3]);
void xmp_ut_layer_skip_shape(const xmp_ut_config_t *c, int layer, int chw[3]);
/* Shape (c, h, w) of one image of layer i's main input. */
void xmp_ut_layer_in_shape(const xmp_ut_config_t *c, int layer, int chw[3]);

/* One parameter tensor of the flat parameter array. */
typedef struct {
    char name[40]; /* "down2.attn.q.w" */
    int layer;
    size_t offset, count; /* in floats, into the flat array */
    int ndim, shape[4];
} xmp_ut_tensor_t;

typedef struct {
    int ntensors;
    xmp_ut_tensor_t t[XMP_UT_MAX_TENSORS];
    size_t total;                       /* floats of all parameters */
    size_t layer_offset[XMP_UT_LAYERS]; /* first float of each layer's parameters */
    size_t layer_count[XMP_UT_LAYERS];  /* floats of each layer's parameters */
} xmp_ut_params_t;

/* Lists the parameter tensors of the model in their fixed order. */
void xmp_ut_params_layout(const xmp_ut_config_t *c, xmp_ut_params_t *p);

/* Generates the full tensor k of the layout into out (p->t[k].count floats) from seed. */
void xmp_ut_tensor_init(const xmp_ut_params_t *p, int k, uint64_t seed, float *out);
/* Generates all parameters into params (p->total floats): xmp_ut_tensor_init for every k. */
void xmp_ut_params_init(const xmp_ut_params_t *p, uint64_t seed, float *params);

/* ---- one layer on one micro-batch ---- */

typedef struct xmp_ut_layer xmp_ut_layer_t;

/* Creates layer `layer` for micro-batches of n images. Returns NULL (message set) on bad input or
 * out of memory. */
xmp_ut_layer_t *xmp_ut_layer_create(const xmp_ut_config_t *c, int layer, int n);
void xmp_ut_layer_destroy(xmp_ut_layer_t *l);

/* Floats of the layer's main input, main output, skip input, skip output for its n images (0 if
 * the layer has no such edge). */
size_t xmp_ut_layer_in_floats(const xmp_ut_layer_t *l);
size_t xmp_ut_layer_out_floats(const xmp_ut_layer_t *l);
size_t xmp_ut_layer_skip_in_floats(const xmp_ut_layer_t *l);
size_t xmp_ut_layer_skip_out_floats(const xmp_ut_layer_t *l);

/* Floats of the layer's saved forward values for one micro-batch (its activation memory). */
size_t xmp_ut_layer_activation_floats(const xmp_ut_layer_t *l);

/* Parallel runs (data, tensor parallel) do not use these layer objects: they run the same layer
 * tapes on SBP tensors through nn/ (models/utransformer_sbp.h). */

/* Forward. w: the layer's parameters (layer_count floats, starting at layer_offset). x: main
 * input; skip_in: the skip for up layers (else NULL); cond (n, 16, D) for layers that use it
 * (else ignored). Writes y and, for down layers, skip_out. The inputs are copied: the caller may
 * reuse them after the call. */
int xmp_ut_layer_forward(xmp_ut_layer_t *l, const float *w, const float *x, const float *skip_in,
                         const float *cond, float *y, float *skip_out);

/* Input part of backward, after forward. dy: gradient of the main output; dskip_out: gradient
 * of the skip output (down layers; NULL means zero). Accumulates into dx (may be NULL: layer 0
 * needs none) and dskip_in (up layers). */
int xmp_ut_layer_backward_input(xmp_ut_layer_t *l, const float *w, const float *dy,
                                const float *dskip_out, float *dx, float *dskip_in);

/* Weight part of backward, after backward_input: accumulates the layer's parameter gradients
 * into dw (layer_count floats). */
int xmp_ut_layer_backward_weight(xmp_ut_layer_t *l, float *dw);

/* ---- the serial reference: all 13 layers in one process ---- */

typedef struct {
    xmp_ut_config_t cfg;
    xmp_ut_params_t layout;
    float *params, *grads, *velocity; /* layout.total floats each */
    int n;                            /* images per step */
    xmp_ut_layer_t *layers[XMP_UT_LAYERS];
    float *act[XMP_UT_LAYERS];  /* main output of each layer */
    float *skip[XMP_UT_LAYERS]; /* skip output of each down layer */
    float *dact[XMP_UT_LAYERS], *dskip[XMP_UT_LAYERS];
    double loss;
} xmp_ut_model_t;

/* Builds the model for batches of n images with parameters from seed. Returns 0 or -1. */
int xmp_ut_model_init(xmp_ut_model_t *m, const xmp_ut_config_t *c, int n, uint64_t seed);
void xmp_ut_model_free(xmp_ut_model_t *m);

/* Forward + loss: input (n, 3, 32, 32), cond (n, 16, D), target (n, 4, 32, 32). Sets m->loss
 * (mean over all n*4*32*32 elements). */
int xmp_ut_model_forward(xmp_ut_model_t *m, const float *input, const float *cond,
                         const float *target);
/* Zeroes grads, then backward (input then weight parts per layer) from the loss of the last
 * forward. */
int xmp_ut_model_backward(xmp_ut_model_t *m, const float *target);
/* SGD-Nesterov over all parameters. */
int xmp_ut_model_update(xmp_ut_model_t *m, float lr, float momentum, float wd);

#ifdef __cplusplus
}
#endif

#endif /* XMP_MODELS_UTRANSFORMER_H */
