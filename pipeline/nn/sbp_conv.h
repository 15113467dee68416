/*
 * SBP forms of the U-Transformer's layers (convolution, group norm, SiLU, nearest up-sampling,
 * channel concat, NCHW <-> token layout, multi-head attention split by heads), on top of the
 * single-process kernels of nn/unet_kernels.h. Same conventions as nn/sbp_ops.h: every function
 * is collective over the tensors' mesh (non-members return at once with empty outputs), deduces
 * the output SBP per mesh axis from the input SBPs (boxing an input first where the table says
 * so), allocates its outputs (owned by the caller), never modifies its inputs, and on error
 * returns a code with xmp_last_error() naming the op, the operand, the mesh axis and the rule
 * that is missing; outputs are untouched then. Residual adds are nn/sbp_ops.h xmp_add_forward,
 * projections xmp_linear_*.
 *
 * Feature maps are (N, C, H, W) f32 tensors. Nothing is ever split over H or W: a spatial split
 * would need halo exchanges (a 3x3 convolution reads its neighbours' rows) or statistics across
 * ranks, which these forms do not implement, so S(2) / S(3) on a feature map is refused with a
 * message saying so. Nothing is silently replicated either: where a split does not fit (heads
 * or groups not divisible by the ranks splitting them), the op refuses.
 *
 * Backward functions take the forward's inputs again and redo the (pure) deduction, so the
 * forward keeps no hidden state besides the explicit caches. Gradients follow the design note
 * of nn/sbp.h: the gradient of an input used as S(d) is S(d); of an input used as B by split
 * ops it may be P (left P for the caller); of a P input it is B.
 */
#ifndef XMP_NN_SBP_CONV_H
#define XMP_NN_SBP_CONV_H

#include "nn/sbp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 2-D convolution y = conv(x, w) + b, stride `stride`, zero padding `pad` (down-sampling is a
 * stride-2 convolution). x (N, Cin, H, W), w (Cout, Cin, kh, kw), b (Cout) or NULL,
 * y (N, Cout, oh, ow). Per mesh axis, like the linear layer:
 *   x S(0)            x w B    -> y S(0)     data parallel
 *   x B               x w S(0) -> y S(1)     output-channel split (bias used as S(0))
 *   x S(1)            x w S(1) -> y P        input-channel split (bias added on coordinate 0)
 *   x B x w B -> B;   x P x w B -> P;   x B x w P -> P
 * Boxing when no row fits: x S(0): w -> B; x S(1): w -> S(1); x B or P with w S(1): x -> S(1);
 * x P with w S(0) or P: x -> B. Refused: x S(2|3) (spatial split, needs halos), w S(2|3). */
xmesh_result_t xmp_conv2d_forward(const xmp_tensor_t *x, const xmp_tensor_t *w,
                                  const xmp_tensor_t *b, int stride, int pad, xmp_tensor_t *y);
/* dx = conv-transpose(dy, w) with x's used SBP (S(0) -> S(0), S(1) -> S(1), B with w S(0) or P
 * -> P, B with w B -> B, P -> B). dy (any SBP) is boxed to the forward's output SBP first (P
 * there -> B). */
xmesh_result_t xmp_conv2d_backward_input(const xmp_tensor_t *dy, const xmp_tensor_t *x,
                                         const xmp_tensor_t *w, int stride, int pad,
                                         xmp_tensor_t *dx);
/* dw (SBP: x S(0) -> P, w S(j) -> S(j), B -> B, x P -> P, w P -> B) and db (may be NULL; y S(0)
 * -> P, y S(1) -> S(0), else B). */
xmesh_result_t xmp_conv2d_backward_weight(const xmp_tensor_t *dy, const xmp_tensor_t *x,
                                          const xmp_tensor_t *w, int stride, int pad,
                                          xmp_tensor_t *dw, xmp_tensor_t *db);

/* Group norm (nn/unet_kernels.h semantics, eps 1e-5) over x (N, C, H, W), `groups` groups of
 * C/groups consecutive channels, gamma and beta (C). Per axis: x S(0) or B: local statistics,
 * gamma/beta B; x S(1) (channel split): gamma/beta used as S(0); when every rank holds whole
 * groups (groups a multiple of the number of channel pieces, the product of the sizes of the
 * axes splitting dim 1) the statistics are local, otherwise a group spans ranks and its sum and
 * centred sum of squares (backward: the group sums of dy*gamma and dy*gamma*xhat) are
 * all-reduced over the channel-splitting axes; x P: boxed to B; x S(2|3): refused (spatial).
 * y has x's used SBP. cache: mean and rstd (N, groups), kept for the backward (B over the
 * channel axes when groups span ranks). */
typedef struct {
    xmp_tensor_t mean, rstd;
} xmp_gn_cache_t;
void xmp_gn_cache_free(xmp_gn_cache_t *c); /* NULL-safe, zeroes */
xmesh_result_t xmp_groupnorm_forward(const xmp_tensor_t *x, const xmp_tensor_t *gamma,
                                     const xmp_tensor_t *beta, int groups, xmp_tensor_t *y,
                                     xmp_gn_cache_t *cache);
/* Input part (dx != NULL: SBP of x as used) and/or weight part (dgamma, dbeta != NULL: x S(0)
 * -> P, S(1) -> S(0), B -> B). */
xmesh_result_t xmp_groupnorm_backward(const xmp_tensor_t *dy, const xmp_tensor_t *x,
                                      const xmp_tensor_t *gamma, int groups,
                                      const xmp_gn_cache_t *cache, xmp_tensor_t *dx,
                                      xmp_tensor_t *dgamma, xmp_tensor_t *dbeta);

/* SiLU, elementwise, any shape; x P is boxed to B first. dx has the SBP x was used with. */
xmesh_result_t xmp_silu_forward(const xmp_tensor_t *x, xmp_tensor_t *y);
xmesh_result_t xmp_silu_backward(const xmp_tensor_t *dy, const xmp_tensor_t *x, xmp_tensor_t *dx);

/* Nearest up-sampling by 2: x (N, C, H, W) -> y (N, C, 2H, 2W). Linear, so S(0), S(1), B and P
 * all stay; S(2|3) refused. Backward: dx with x's SBP (dy boxed to y's SBP first). */
xmesh_result_t xmp_upsample2x_forward(const xmp_tensor_t *x, xmp_tensor_t *y);
xmesh_result_t xmp_upsample2x_backward(const xmp_tensor_t *dy, const xmp_tensor_t *x,
                                       xmp_tensor_t *dx);

/* Channel concat y = [a; b] (N, Ca + Cb, H, W) of a (N, Ca, H, W) and b (N, Cb, H, W) (the
 * U-Net's skip connections). Per axis: both S(0) -> S(0), both B -> B, both P -> P; mixed: S(0)
 * wins (the other is sliced, or reduce-scattered from P), then B (P all-reduced). A channel
 * split (S(1)) of an operand is refused (the pieces of a and b would not form the array_split
 * pieces of y), as is S(2|3). Backward: da, db (either may be NULL) with the used SBP, P -> B. */
xmesh_result_t xmp_concat_forward(const xmp_tensor_t *a, const xmp_tensor_t *b, xmp_tensor_t *y);
xmesh_result_t xmp_concat_backward(const xmp_tensor_t *dy, const xmp_tensor_t *a,
                                   const xmp_tensor_t *b, xmp_tensor_t *da, xmp_tensor_t *db);

/* Layout changes x (N, C, H, W) -> t (N, H*W, C) and back (H, W given for the way back). SBP
 * follows the dims: S(0) -> S(0), channel S(1) <-> S(2), B, P stay; a split of H, W or of the
 * token dim is refused. Backward: the inverse map of dy boxed to the output's SBP. */
xmesh_result_t xmp_to_tokens_forward(const xmp_tensor_t *x, xmp_tensor_t *t);
xmesh_result_t xmp_to_tokens_backward(const xmp_tensor_t *dt, const xmp_tensor_t *x,
                                      xmp_tensor_t *dx);
xmesh_result_t xmp_from_tokens_forward(const xmp_tensor_t *t, int h, int w, xmp_tensor_t *x);
xmesh_result_t xmp_from_tokens_backward(const xmp_tensor_t *dx, const xmp_tensor_t *t, int h, int w,
                                        xmp_tensor_t *dt);

/* Non-causal multi-head attention core (nn/unet_kernels.h xmp_unet_attn_*): q (N, Tq, C),
 * k and v (N, Tk, C), C = heads * head_dim, head h on channels [h*head_dim, (h+1)*head_dim).
 * Per axis, decided by q (P boxed to B first):
 *   q S(0) -> k, v S(0), out S(0)              batch split
 *   q S(2) -> k, v S(2), out S(2)              heads split: refused unless heads is a multiple
 *                                              of the number of channel pieces (names heads and
 *                                              the axis sizes)
 *   q S(1) -> k, v B,    out S(1)              query split (keys and values whole)
 *   q B    -> k, v B,    out B
 * k, v are boxed to those SBPs; a split of head_dim inside a head is impossible by the rule
 * above. cache: the softmax probabilities (N, heads, Tq, Tk) of the used split. */
typedef struct {
    xmp_tensor_t probs;
} xmp_mha_cache_t;
void xmp_mha_cache_free(xmp_mha_cache_t *c); /* NULL-safe, zeroes */
xmesh_result_t xmp_mha_forward(const xmp_tensor_t *q, const xmp_tensor_t *k, const xmp_tensor_t *v,
                               int head_dim, xmp_tensor_t *out, xmp_mha_cache_t *cache);
/* dq, dk, dv with the used SBPs (query split: dk, dv P over that axis). dout boxed to out's. */
xmesh_result_t xmp_mha_backward(const xmp_tensor_t *dout, const xmp_tensor_t *q,
                                const xmp_tensor_t *k, const xmp_tensor_t *v, int head_dim,
                                const xmp_mha_cache_t *cache, xmp_tensor_t *dq, xmp_tensor_t *dk,
                                xmp_tensor_t *dv);

#ifdef __cplusplus
}
#endif
#endif /* XMP_NN_SBP_CONV_H */
