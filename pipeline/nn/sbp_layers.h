/*
 * SBP layers beyond the contraction engine of sbp_ops.h: layer norm, causal
 * self-attention, and the pure per-axis SBP deduction of every op (OneFlow,
 * paper 004, section 3.2 and Table 1; the channel-split layer norm and the
 * sequence-split attention follow the 3-D tensor-parallel layouts of AxoNN,
 * paper 001, section III).
 *
 * Conventions (every function here):
 *   - collective over the tensor's mesh (non-members return at once with
 *     empty outputs); outputs are allocated by the callee and owned by the
 *     caller (xmp_tensor_free / the cache free functions); inputs are never
 *     modified (boxing works on copies);
 *   - the SBP of every output is deduced per mesh axis from the input SBPs,
 *     by the same rules xmp_sbp_deduce() applies without data;
 *   - on error the result names the op, the tensor, the mesh axis and the
 *     rule that is missing (xmp_last_error()); outputs are untouched.
 */
#ifndef XMP_NN_SBP_LAYERS_H
#define XMP_NN_SBP_LAYERS_H

#include "nn/sbp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Per-row statistics kept for the backward (rows = all dims of x but the last). */
typedef struct {
    xmp_tensor_t mean, rstd;
} xmp_norm_cache_t;
void xmp_norm_cache_free(xmp_norm_cache_t *c); /* NULL-safe, zeroes */

/* LayerNorm over the last dim C (eps 1e-5, llm.c semantics). x (rows..., C), w and b (C).
 * Per axis: x S(d < last) or B: local statistics; x S(last) (channel split): sum and sum of
 * squares (or mean then variance) all-reduced over that axis, w/b used as S(0) there;
 * x P: boxed to B first. y has x's SBP (P -> B). */
xmesh_result_t xmp_layernorm_forward(const xmp_tensor_t *x, const xmp_tensor_t *w,
                                     const xmp_tensor_t *b, xmp_tensor_t *y,
                                     xmp_norm_cache_t *cache);
/* dx (SBP of y), dw and db (allocated: SBP of w as used, P over axes where the rows were split
 * (batch/sequence S or ... ), B where x was B). */
xmesh_result_t xmp_layernorm_backward(const xmp_tensor_t *dy, const xmp_tensor_t *x,
                                      const xmp_tensor_t *w, const xmp_norm_cache_t *cache,
                                      xmp_tensor_t *dx, xmp_tensor_t *dw, xmp_tensor_t *db);

/* Causal self-attention, llm.c semantics. qkv (B, T, 3, NH, hs) (llm.c's (B, T, 3C) viewed),
 * y (B, T, NH, hs). Per axis: qkv S(0) -> y S(0); S(3) heads -> y S(2); S(1) sequence -> y S(1)
 * (K and V all-gathered over that axis, causal mask on global positions; backward
 * reduce-scatters dK, dV); B -> B; P -> boxed to B. S(2) or S(4) are refused naming the axis. */
typedef struct {
    xmp_tensor_t att;
    void *priv;
} xmp_attn_cache_t;
void xmp_attn_cache_free(xmp_attn_cache_t *c);
xmesh_result_t xmp_attention_forward(const xmp_tensor_t *qkv, xmp_tensor_t *y,
                                     xmp_attn_cache_t *cache);
xmesh_result_t xmp_attention_backward(const xmp_tensor_t *dy, const xmp_tensor_t *qkv,
                                      const xmp_attn_cache_t *cache, xmp_tensor_t *dqkv);

/* Pure deduction (no MPI, no data): the output SBP per axis of an op for given input SBPs and
 * shapes, or -1 with a message naming op, operand, axis and the rule that is missing. Used to
 * refuse a strategy before anything runs. op: "linear", "add", "gelu", "layernorm",
 * "attention", "embedding", "cross_entropy". in_sbp[i] points at in_ndim[i] dims x naxes SBPs. */
int xmp_sbp_deduce(const char *op, int naxes, int nin, const int *in_ndim,
                   const xmp_sbp_t *const *in_sbp, xmp_sbp_t *out_sbp, char *err, size_t errlen);

/* ---- additions to contract A ------------------------------------------------------------ */

/* Per-axis rules of the two layers above (pure; shared by the ops and xmp_sbp_deduce).
 * naxes axes of sbp in, NAX (4) written per output array (B beyond naxes). Return 0, or -1
 * with a message naming op, operand, axis and the missing rule in err. */
int xmp_rule_layernorm(int naxes, int nd, const xmp_sbp_t *sx, xmp_sbp_t *tx, xmp_sbp_t *tw,
                       xmp_sbp_t *ty, xmp_sbp_t *tstat, char *err, size_t n);
int xmp_rule_attention(int naxes, int nd, const xmp_sbp_t *sq, xmp_sbp_t *tq, xmp_sbp_t *ty,
                       xmp_sbp_t *tatt, char *err, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* XMP_NN_SBP_LAYERS_H */
