/*
 * U-Transformer compute kernels (AlpaComm paper, section 5: the U-Net with attention
 * layers after its convolutions, Petit et al. 2021). f32 on the CPU through OpenBLAS, one
 * process, no MPI.
 *
 * Conventions, for every function below unless it says otherwise:
 *   - Layout is row-major. Feature maps are NCHW: x[((n*C + c)*H + y)*W + x]. Token sequences
 *     are (N, T, C): t[(n*T + p)*C + c]. Linear weights are (OC, IC); conv weights are
 *     (OC, IC, KH, KW); biases, gammas and betas are per output channel.
 *   - Every size is the LOCAL block a rank holds. Under a channel split a rank passes its own
 *     channel counts (and its own heads / groups), its own contiguous weight block, and NULL for
 *     a bias it must not add (the bias of a partial-sum output is added on one rank only).
 *   - Forward functions OVERWRITE their outputs. Backward functions ACCUMULATE (+=) into every
 *     gradient they write, so the caller zeroes gradients once per step; a NULL gradient pointer
 *     skips that gradient where the contract says "may be NULL".
 *   - Backward is split into an input-gradient part and a weight-gradient part wherever a
 *     layer has weights, so a pipeline schedule can run them at different times.
 *   - Scratch memory is supplied by the caller (sizes given by *_floats() queries); the kernels
 *     hold no global state besides the thread-local error message, allocate nothing, and are
 *     reentrant. Outputs must not alias inputs unless the contract says so.
 *   - Each function returns 0, or -1 (the value of XMESH_ERR_INVALID_ARGUMENT) on a bad
 *     argument, in which case nothing was written and xmp_last_error() names the value.
 */
#ifndef XMP_NN_UNET_KERNELS_H
#define XMP_NN_UNET_KERNELS_H

#include <stddef.h>

#include "nn/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Errors: xmp_last_error() (nn/error.h) names the bad value. */

/* ---------------------------------------------------------------------------------------- */
/* 2-D convolution (im2col + sgemm)                                                          */
/* ---------------------------------------------------------------------------------------- */

/* Geometry of one convolution on a local block. Fill it with xmp_unet_conv2d_init(). */
typedef struct xmp_unet_conv2d {
    int n;        /* batch (local) */
    int ic, h, w; /* input channels (local), input height, width */
    int oc;       /* output channels (local) */
    int kh, kw;   /* kernel height, width */
    int stride;   /* same stride in both dimensions, >= 1 */
    int pad;      /* zero padding on every side, >= 0 */
    int oh, ow;   /* output height, width: (h + 2*pad - kh) / stride + 1, filled by init */
} xmp_unet_conv2d_t;

/* Validates the geometry and fills *c (oh, ow included). On error *c is unchanged. */
int xmp_unet_conv2d_init(xmp_unet_conv2d_t *c, int n, int ic, int h, int w, int oc, int kh, int kw,
                         int stride, int pad);

/* Floats of the caller's im2col scratch for one sample: ic*kh*kw*oh*ow (0 for a 1x1, stride 1,
 * pad 0 conv, which multiplies the input directly and accepts col == NULL). */
size_t xmp_unet_conv2d_col_floats(const xmp_unet_conv2d_t *c);

/* im2col of ONE image x (c, h, w) into col (c*kh*kw, oh*ow): row (ci*kh + i)*kw + j, column
 * oy*ow + ox holds x[ci][oy*stride - pad + i][ox*stride - pad + j], or 0 outside the image.
 * Overwrites col. */
int xmp_unet_im2col(const float *x, int c, int h, int w, int kh, int kw, int stride, int pad,
                    float *col);

/* Adjoint of xmp_unet_im2col: x (c, h, w) += the entries of col (c*kh*kw, oh*ow) scattered back
 * to the pixels they were gathered from (padding entries are dropped). Accumulates. */
int xmp_unet_col2im(const float *col, int c, int h, int w, int kh, int kw, int stride, int pad,
                    float *x);

/* y (n, oc, oh, ow) = conv(x (n, ic, h, w), wt (oc, ic, kh, kw)) + bias (oc) (bias may be NULL:
 * no bias, e.g. on all but one rank of an input-channel split, whose outputs are partial sums).
 * col: scratch of xmp_unet_conv2d_col_floats(c) floats. Overwrites y. */
int xmp_unet_conv2d_forward(const xmp_unet_conv2d_t *c, const float *x, const float *wt,
                            const float *bias, float *y, float *col);

/* dx (n, ic, h, w) += conv-transpose of dy (n, oc, oh, ow) with wt (oc, ic, kh, kw) (col2im).
 * col: scratch as for forward. */
int xmp_unet_conv2d_backward_input(const xmp_unet_conv2d_t *c, const float *dy, const float *wt,
                                   float *dx, float *col);

/* dwt (oc, ic, kh, kw) += sum_n dy_n * im2col(x_n)^T and dbias (oc) += sum of dy over n, oh, ow
 * (dbias may be NULL). x is the forward input (n, ic, h, w). col: scratch as for forward. */
int xmp_unet_conv2d_backward_weight(const xmp_unet_conv2d_t *c, const float *x, const float *dy,
                                    float *dwt, float *dbias, float *col);

/* ---------------------------------------------------------------------------------------- */
/* Normalization, activation, resampling, skip connections                                   */
/* ---------------------------------------------------------------------------------------- */

/* Group norm over x (n, c, hw): channels split into g groups of c/g consecutive channels (g must
 * divide c); per (sample, group) y = (x - mean) * rstd * gamma[ch] + beta[ch] with
 * rstd = 1/sqrt(var + 1e-5), var the biased variance. Writes y (n, c, hw), mean and rstd (n, g).
 * A channel-split rank passes its local c and local g (groups must not straddle ranks). */
int xmp_unet_groupnorm_forward(int n, int c, int hw, int g, const float *x, const float *gamma,
                               const float *beta, float *y, float *mean, float *rstd);

/* Group norm backward from the saved mean/rstd: dx (n, c, hw) += d/dx, dgamma (c) += sum dy*xhat,
 * dbeta (c) += sum dy. Any of dx, dgamma, dbeta may be NULL (dx alone = input part, dgamma and
 * dbeta alone = weight part); gamma may be NULL when dx is. */
int xmp_unet_groupnorm_backward(int n, int c, int hw, int g, const float *x, const float *dy,
                                const float *gamma, const float *mean, const float *rstd, float *dx,
                                float *dgamma, float *dbeta);

/* SiLU over count floats: y = x * sigmoid(x). y may alias x. */
int xmp_unet_silu_forward(size_t count, const float *x, float *y);

/* SiLU backward from the forward input x: dx += dy * s * (1 + x * (1 - s)), s = sigmoid(x). */
int xmp_unet_silu_backward(size_t count, const float *x, const float *dy, float *dx);

/* Nearest up-sampling by 2: y (n, c, 2h, 2w)[yy][xx] = x (n, c, h, w)[yy/2][xx/2]. Overwrites y.
 * (Down-sampling is the 3x3 stride 2 pad 1 convolution.) */
int xmp_unet_upsample2x_forward(int n, int c, int h, int w, const float *x, float *y);

/* dx (n, c, h, w) += the sum of the 4 entries of dy (n, c, 2h, 2w) each pixel was copied to. */
int xmp_unet_upsample2x_backward(int n, int c, int h, int w, const float *dy, float *dx);

/* Channel concat for skip connections: y (n, ca + cb, hw) = [a (n, ca, hw); b (n, cb, hw)] along
 * the channel axis. Overwrites y. */
int xmp_unet_concat_forward(int n, int ca, int cb, int hw, const float *a, const float *b,
                            float *y);

/* da (n, ca, hw) += dy[:, :ca], db (n, cb, hw) += dy[:, ca:]. da or db may be NULL. */
int xmp_unet_concat_backward(int n, int ca, int cb, int hw, const float *dy, float *da, float *db);

/* y = a + b over count floats (residual add). y may alias a or b. */
int xmp_unet_add_forward(size_t count, const float *a, const float *b, float *y);

/* da += dy, db += dy over count floats. da or db may be NULL. */
int xmp_unet_add_backward(size_t count, const float *dy, float *da, float *db);

/* ---------------------------------------------------------------------------------------- */
/* Attention over spatial positions                                                          */
/* ---------------------------------------------------------------------------------------- */

/* Layout change x (n, c, hw) -> t (n, hw, c): t[n][p][ch] = x[n][ch][p]. Overwrites t. */
int xmp_unet_nchw_to_tokens(int n, int c, int hw, const float *x, float *t);

/* Layout change t (n, hw, c) -> x (n, c, hw). Overwrites x. */
int xmp_unet_tokens_to_nchw(int n, int c, int hw, const float *t, float *x);

/* Backward of xmp_unet_nchw_to_tokens: dx (n, c, hw) += transpose of dt (n, hw, c). */
int xmp_unet_nchw_to_tokens_backward(int n, int c, int hw, const float *dt, float *dx);

/* Backward of xmp_unet_tokens_to_nchw: dt (n, hw, c) += transpose of dx (n, c, hw). */
int xmp_unet_tokens_to_nchw_backward(int n, int c, int hw, const float *dx, float *dt);

/* Linear layer on m rows (m = batch * tokens): y (m, oc) = x (m, ic) * wt^T + bias, with wt
 * (oc, ic) and bias (oc) or NULL. Overwrites y. */
int xmp_unet_linear_forward(int m, int ic, int oc, const float *x, const float *wt,
                            const float *bias, float *y);

/* dx (m, ic) += dy (m, oc) * wt (oc, ic). */
int xmp_unet_linear_backward_input(int m, int ic, int oc, const float *dy, const float *wt,
                                   float *dx);

/* dwt (oc, ic) += dy^T * x; dbias (oc) += column sums of dy (dbias may be NULL). x is the forward
 * input (m, ic). */
int xmp_unet_linear_backward_weight(int m, int ic, int oc, const float *x, const float *dy,
                                    float *dwt, float *dbias);

/* Geometry of the multi-head attention core. Self-attention over a feature map has
 * tq = tk = H*W; cross-attention has tq = H*W image tokens and tk = S conditioning tokens
 * (project the conditioning (n, S, Cc) to width heads*head_dim with xmp_unet_linear_* ic = Cc). */
typedef struct xmp_unet_attn {
    int n;        /* batch (local) */
    int tq, tk;   /* query tokens, key/value tokens */
    int heads;    /* heads this rank computes (local heads under a channel split) */
    int head_dim; /* channels per head; head h owns channels [h*head_dim, (h+1)*head_dim) */
} xmp_unet_attn_t;

/* Validates the geometry and fills *a. On error *a is unchanged. */
int xmp_unet_attn_init(xmp_unet_attn_t *a, int n, int tq, int tk, int heads, int head_dim);

/* Floats of the saved probabilities: n * heads * tq * tk. */
size_t xmp_unet_attn_probs_floats(const xmp_unet_attn_t *a);

/* Floats of the backward scratch: tq * tk. */
size_t xmp_unet_attn_scratch_floats(const xmp_unet_attn_t *a);

/* Non-causal softmax attention, per sample and head h (width C = heads*head_dim):
 * out[:, h] = softmax(q[:, h] k[:, h]^T / sqrt(head_dim)) v[:, h], with q, out (n, tq, C) and
 * k, v (n, tk, C). Writes out and probs (n, heads, tq, tk), the softmax saved for backward. */
int xmp_unet_attn_forward(const xmp_unet_attn_t *a, const float *q, const float *k, const float *v,
                          float *out, float *probs);

/* Attention core backward from the saved probs: dq (n, tq, C) += , dk (n, tk, C) += ,
 * dv (n, tk, C) += their gradients given dout (n, tq, C). scratch: tq*tk floats. */
int xmp_unet_attn_backward(const xmp_unet_attn_t *a, const float *q, const float *k, const float *v,
                           const float *probs, const float *dout, float *dq, float *dk, float *dv,
                           float *scratch);

/* ---------------------------------------------------------------------------------------- */
/* Loss and optimizer                                                                        */
/* ---------------------------------------------------------------------------------------- */

/* L2 loss over count floats: *loss = sum (y - target)^2 / denom. denom is count for a plain
 * mean; a data-parallel shard passes the GLOBAL element count so that the shards' losses (and
 * gradients) sum to the global mean's. */
int xmp_unet_mse_forward(size_t count, double denom, const float *y, const float *target,
                         double *loss);

/* dy += 2 * (y - target) / denom (gradient of the loss above with d loss = 1). */
int xmp_unet_mse_backward(size_t count, double denom, const float *y, const float *target,
                          float *dy);

/* One SGD step with Nesterov momentum over a flat array, PyTorch torch.optim.SGD semantics with
 * nesterov=True, dampening 0 and coupled (L2) weight decay: g = grad + wd*p; v = mu*v + g;
 * p -= lr * (g + mu*v). The velocity v starts at zero (same as PyTorch's first-step v = g).
 * Updates p and v in place; grad is not modified. */
int xmp_unet_sgd_nesterov(size_t count, float lr, float mu, float wd, float *p, float *v,
                          const float *grad);

#ifdef __cplusplus
}
#endif

#endif /* XMP_NN_UNET_KERNELS_H */
