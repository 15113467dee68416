/*
 * SBP layers: forward and backward over one mesh (OneFlow paper 004,
 * Table 1). Every op deduces its output SBP per mesh axis from the input
 * SBPs and boxes an input first when it does not fit a valid signature
 * (rules below). Inputs are never modified: boxing works on copies.
 * Every function is collective over the mesh (non-members return at once
 * with empty outputs); outputs are allocated here and owned by the caller.
 *
 * Linear Y = X * W^T + b: X (batch..., K), W (out..., K) as llm.c stores it,
 * b (out...), Y (batch..., out...). Per mesh axis (nb = batch dims of X):
 *   X S(d<nb) x W B      -> Y S(d)          data parallel
 *   X B      x W S(j<K)  -> Y S(nb + j)     column split (several out dims:
 *                                           e.g. QKV (3, NH, hs, C) split on NH)
 *   X S(K)   x W S(K)    -> Y P             row split (contracted dim)
 *   X P x W B, X B x W P -> Y P
 *   X B      x W B       -> Y B
 * Boxing when no row fits: X S(d<nb): W -> B; X S(K): W -> S(K); X B with
 * W S(K): X -> S(K); X P: W B or S(K) keep X (X P -> S(K) for the latter),
 * W S(j) or P: X -> B. Bias: boxed to S(j) when Y is S(nb+j), to P (holder
 * only, B -> P) when Y is P, to B otherwise.
 * Backward runs the same engine on dX = dY * W and dW = dY^T * X (dual
 * signatures: e.g. DP gives dW P over the data axis, column split gives
 * dX P); P gradients are left P for the caller (optimizer: box P -> B).
 */
#ifndef XMP_NN_SBP_OPS_H
#define XMP_NN_SBP_OPS_H

#include "nn/sbp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y = x w^T (+ b if b != NULL). */
xmesh_result_t xmp_linear_forward(const xmp_tensor_t *x, const xmp_tensor_t *w,
                                  const xmp_tensor_t *b, xmp_tensor_t *y);
/* dx = dy w (input part; dy (batch..., out...)). */
xmesh_result_t xmp_linear_backward_input(const xmp_tensor_t *dy, const xmp_tensor_t *w,
                                         xmp_tensor_t *dx);
/* dw = dy^T x over all batch dims; db = sum of dy over batch dims if db !=
 * NULL (weight part, may run later than the input part). */
xmesh_result_t xmp_linear_backward_weight(const xmp_tensor_t *dy, const xmp_tensor_t *x,
                                          xmp_tensor_t *dw, xmp_tensor_t *db);

/* z = x + y (same global shape). Per axis: equal SBPs stay (P + P = P);
 * B with S(d) -> S(d) (slice); P with B -> B (all-reduce); P with S(d) ->
 * S(d) (reduce-scatter); S(i) with S(j) -> S(i). */
xmesh_result_t xmp_add_forward(const xmp_tensor_t *x, const xmp_tensor_t *y, xmp_tensor_t *z);
/* dx, dy: dz boxed to the gradient SBPs of x and y (either may be NULL). */
xmesh_result_t xmp_add_backward(const xmp_tensor_t *dz, const xmp_tensor_t *x,
                                const xmp_tensor_t *y, xmp_tensor_t *dx, xmp_tensor_t *dy);

/* GELU (tanh form), elementwise; P input is boxed to B first. */
xmesh_result_t xmp_gelu_forward(const xmp_tensor_t *x, xmp_tensor_t *y);
/* dx = dy * gelu'(x), dx with the SBP of x (B where x is P). */
xmesh_result_t xmp_gelu_backward(const xmp_tensor_t *dy, const xmp_tensor_t *x, xmp_tensor_t *dx);

/* Embedding: out[..., :] = table[tok[...], :]. tok i32 (any dims), table
 * (Vp, C) f32, out (tok dims..., C). Per axis: table S(0) (vocabulary split)
 * x tok B -> out P (rows of other ranks' vocabulary are zero; a consumer
 * boxes P -> B by its own deduction); table S(1) x tok B -> out S(last);
 * table B x tok S(d) -> S(d); B x B -> B; table P x tok B -> P. Token ids
 * outside [0, Vp) are an error. */
xmesh_result_t xmp_embedding_forward(const xmp_tensor_t *tok, const xmp_tensor_t *table,
                                     xmp_tensor_t *out);
/* dtable (SBP of table, B where table is P; P where tok was split over an
 * axis that did not split the table). Never reduces: no collective on the
 * table gradient happens here (the optimizer boxes P -> B once per step). */
xmesh_result_t xmp_embedding_backward(const xmp_tensor_t *dout, const xmp_tensor_t *tok,
                                      const xmp_tensor_t *table, xmp_tensor_t *dtable);

/* Softmax cross-entropy, mean over all rows of the global batch. logits
 * (rows..., Vp) f32, targets (rows...) i32 in [0, V), V <= Vp (columns >= V
 * are padding: excluded, gradient 0). Per axis: logits S(last) is the
 * vocabulary-parallel form (MPI_Allreduce of the row max, then of sum-exp
 * and of the target logit, which only its owner contributes); S(row dim)
 * splits rows (loss summed over that axis); B is redundant; P is boxed to
 * S(last). *loss is the same on every member. dlogits (may be NULL) gets
 * the gradient with the SBP the logits were used in. */
xmesh_result_t xmp_cross_entropy(const xmp_tensor_t *logits, const xmp_tensor_t *targets, int64_t V,
                                 float *loss, xmp_tensor_t *dlogits);

/* ---- pure per-axis SBP rules (no MPI, no data) --------------------------------------------
 * The deduction the ops above apply, also used by xmp_sbp_deduce (nn/sbp_layers.h) to refuse
 * a strategy before anything runs. naxes axes of each input SBP are read; NAX (4) entries of
 * every output array are written (B beyond naxes). t* are the SBPs the inputs are boxed to
 * (as used), the last array is the output SBP. Return 0, or -1 with a message in err
 * ("op: operand NAME 'SBP': mesh axis A: ... no rule ...").
 * linear: tb (may be NULL) is the SBP the bias is boxed to. cross_entropy: st (may be NULL)
 * the targets' SBP; tl is the SBP of the logits as used (= that of dlogits). */
int xmp_rule_linear(int naxes, int nx, const xmp_sbp_t *sx, int nw, const xmp_sbp_t *sw,
                    xmp_sbp_t *tx, xmp_sbp_t *tw, xmp_sbp_t *ty, xmp_sbp_t *tb, char *err,
                    size_t n);
int xmp_rule_add(int naxes, int nd, const xmp_sbp_t *sx, const xmp_sbp_t *sy, xmp_sbp_t *tz,
                 char *err, size_t n);
int xmp_rule_gelu(int naxes, int nd, const xmp_sbp_t *sx, xmp_sbp_t *ty, char *err, size_t n);
int xmp_rule_embedding(int naxes, int nt, const xmp_sbp_t *stok, int ntab, const xmp_sbp_t *stab,
                       xmp_sbp_t *tt, xmp_sbp_t *tw, xmp_sbp_t *to, char *err, size_t n);
int xmp_rule_cross_entropy(int naxes, int nl, const xmp_sbp_t *sl, const xmp_sbp_t *st,
                           xmp_sbp_t *tl, xmp_sbp_t *tt, char *err, size_t n);
/* Checks that every S(d) of an operand of nd dims names one of its dims. */
int xmp_rule_operand(const char *op, const char *operand, int naxes, int nd, const xmp_sbp_t *sbp,
                     char *err, size_t n);
/* "op: operand NAME 'SBP': mesh axis A: " + the formatted rest. */
void xmp_rule_msg(char *err, size_t n, const char *op, const char *operand, const xmp_sbp_t *sbp,
                  int naxes, int axis, const char *fmt, ...) __attribute__((format(printf, 8, 9)));

#ifdef __cplusplus
}
#endif
#endif /* XMP_NN_SBP_OPS_H */
