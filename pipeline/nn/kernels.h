/*
 * f32 compute kernels of the training stack (GPT-2 family), row-major, no MPI.
 *
 * The math follows llm.c's CPU trainer (karpathy/llm.c, train_gpt2.c); comments name
 * every place where these kernels are shaped for sharded use:
 *   - the embedding lookup works on a vocabulary RANGE, so vocab-split tables give
 *     partial sums that add up to the full lookup;
 *   - matmul backward is split in an input part and a weight part, so pipeline schedules
 *     can run them at different times;
 *   - attention takes (NH, hs) explicitly, so a tensor-parallel rank calls it with its
 *     local heads only;
 *   - the softmax cross-entropy comes both serial and as vocab-split pieces (local max,
 *     local sum of exp, owned target logit, local backward) to be combined by all-reduces.
 *
 * Conventions (all functions):
 *   - N is a number of rows (usually B*T); C, OC are feature sizes; tensors are dense,
 *     row-major, with the last dimension contiguous.
 *   - forward functions OVERWRITE their outputs;
 *   - backward functions ACCUMULATE (+=) into every gradient buffer they are given, so
 *     the caller zeroes gradients once per step (as llm.c's gpt2_zero_grad does).
 *   - no function allocates memory or fails; the caller validates sizes and indices.
 *   - pointers: inputs are const; outputs must not alias inputs unless stated.
 */
#ifndef XMP_NN_KERNELS_H
#define XMP_NN_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- embeddings ------------------------------------------------------------------- */

/* Token embedding over the vocabulary range [v0, v0+vlocal):
 *   out[n,:] = table[tok[n]-v0, :]  if v0 <= tok[n] < v0+vlocal,  else 0.
 * table is (vlocal, C). With v0=0, vlocal=Vp this is the full lookup; a vocab-split table
 * gives a partial result, and the sum over ranks of the partials is the full lookup. */
void xmp_embed_range_fwd(float *out, const int *tok, size_t N, const float *table, int v0,
                         int vlocal, int C);
/* dtable[tok[n]-v0, :] += dout[n, :] for owned tokens only (others are skipped). */
void xmp_embed_range_bwd(float *dtable, const float *dout, const int *tok, size_t N, int v0,
                         int vlocal, int C);
/* Position embedding add for (B,T,C) activations: out[b,t,:] += wpe[t,:] (wpe is (>=T, C)). */
void xmp_pos_add_fwd(float *out, const float *wpe, int B, int T, int C);
/* dwpe[t,:] += sum_b dout[b,t,:]. */
void xmp_pos_add_bwd(float *dwpe, const float *dout, int B, int T, int C);

/* ---- layernorm (eps = 1e-5, biased variance, as llm.c) ----------------------------- */

/* out[n,:] = (inp[n,:]-mean)*rstd*weight + bias; saves mean[n], rstd[n] for backward. */
void xmp_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                       const float *bias, size_t N, int C);
/* Accumulates dinp, dweight, dbias. Any of the three may be NULL to skip it (so a schedule
 * can run the input part and the weight part of the backward separately). */
void xmp_layernorm_bwd(float *dinp, float *dweight, float *dbias, const float *dout,
                       const float *inp, const float *weight, const float *mean, const float *rstd,
                       size_t N, int C);

/* ---- matmul: weights stored (OC, C), out = inp . W^T + bias ------------------------- */

/* out(N,OC) = inp(N,C) . W(OC,C)^T + bias(OC); bias may be NULL. cblas_sgemm. */
void xmp_matmul_fwd(float *out, const float *inp, const float *weight, const float *bias, size_t N,
                    int C, int OC);
/* Input part of the backward: dinp(N,C) += dout(N,OC) . W(OC,C). */
void xmp_matmul_bwd_input(float *dinp, const float *dout, const float *weight, size_t N, int C,
                          int OC);
/* Weight part of the backward: dW(OC,C) += dout^T . inp; dbias(OC) += column sums of dout.
 * dbias may be NULL (layer without bias). */
void xmp_matmul_bwd_weight(float *dweight, float *dbias, const float *dout, const float *inp,
                           size_t N, int C, int OC);

/* ---- causal multi-head self-attention ---------------------------------------------- */

/* qkv is (B,T,3,NH,hs) == (B,T,3C) with C = NH*hs: q at [.., 0, h, :], k at [.., 1, h, :],
 * v at [.., 2, h, :]. out is (B,T,C) laid out (B,T,NH,hs). Scores are q.k / sqrt(hs) over
 * t2 <= t (causal), softmax per row, out = att . v.
 * Saved for backward: att (B,NH,T,T), the post-softmax probabilities (entries t2 > t are 0).
 * preatt (B,NH,T,T) receives the scaled scores if non-NULL (llm.c keeps it; the backward
 * does not need it, so pass NULL to save B*NH*T*T floats per layer).
 * Memory per call: att B*NH*T*T floats (+ the same for preatt if requested). */
void xmp_attention_fwd(float *out, float *preatt, float *att, const float *qkv, int B, int T,
                       int NH, int hs);
/* Accumulates dqkv (B,T,3C) from dout (B,T,C), using qkv and the saved att.
 * work is scratch of at least T floats (no state is kept in it between calls).
 * The softmax backward uses the O(T) form dpre[j] = att[j]*(datt[j] - sum_k att[k]datt[k]),
 * which is mathematically llm.c's double loop, so no (B,NH,T,T) gradient buffers are needed. */
void xmp_attention_bwd(float *dqkv, const float *dout, const float *qkv, const float *att, int B,
                       int T, int NH, int hs, float *work);

/* ---- pointwise ---------------------------------------------------------------------- */

/* GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
void xmp_gelu_fwd(float *out, const float *inp, size_t N);
/* dinp += gelu'(inp) * dout. */
void xmp_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t N);
/* out = a + b (out may alias a or b). */
void xmp_residual_fwd(float *out, const float *a, const float *b, size_t N);
/* da += dout; db += dout. */
void xmp_residual_bwd(float *da, float *db, const float *dout, size_t N);

/* ---- softmax cross-entropy, serial --------------------------------------------------- */

/* logits, probs are (N, Vp); only the first V (real vocabulary) columns take part; probs
 * of padded columns [V, Vp) are set to 0. */
void xmp_softmax_fwd(float *probs, const float *logits, size_t N, int V, int Vp);
/* losses[n] = -log(probs[n, targets[n]]). */
void xmp_crossentropy_fwd(float *losses, const float *probs, const int *targets, size_t N, int Vp);
/* dlogits[n,j] += (probs[n,j] - 1[j==targets[n]]) * dlosses[n] for j < V; padded columns
 * [V, Vp) get no contribution (their gradient stays what it was, normally 0). */
void xmp_crossentropy_softmax_bwd(float *dlogits, const float *dlosses, const float *probs,
                                  const int *targets, size_t N, int V, int Vp);

/* ---- softmax cross-entropy, vocab-split pieces ---------------------------------------
 * A rank holds logits columns [v0, v0+vlocal) of the (N, Vp) logits as a dense (N, vlocal)
 * array. Columns with global index >= V (padding) are ignored everywhere. Combination:
 *   gmax = allreduce_max(local_max); gsum = allreduce_sum(local_sumexp(gmax));
 *   tlogit = allreduce_sum(local_target); loss = log(gsum) + gmax - tlogit;
 *   dlogits via local_bwd(gmax, gsum) on every rank (no communication).            */

/* rowmax[n] = max over owned real columns; -INFINITY if the range holds no real column. */
void xmp_xent_local_max(float *rowmax, const float *logits, size_t N, int v0, int vlocal, int V);
/* rowsum[n] = sum over owned real columns of exp(logits - gmax[n]). */
void xmp_xent_local_sumexp(float *rowsum, const float *logits, const float *gmax, size_t N, int v0,
                           int vlocal, int V);
/* tlogit[n] = logits[n, targets[n]-v0] if the target is owned, else 0. */
void xmp_xent_local_target(float *tlogit, const float *logits, const int *targets, size_t N, int v0,
                           int vlocal);
/* losses[n] = log(gsum[n]) + gmax[n] - tlogit[n]. */
void xmp_xent_losses(float *losses, const float *gmax, const float *gsum, const float *tlogit,
                     size_t N);
/* dlogits[n,j] += (exp(x - gmax)/gsum - 1[v0+j == target]) * dlosses[n] for owned real
 * columns; padded columns get no contribution. */
void xmp_xent_local_bwd(float *dlogits, const float *logits, const float *gmax, const float *gsum,
                        const int *targets, const float *dlosses, size_t N, int v0, int vlocal,
                        int V);

/* ---- optimizer ----------------------------------------------------------------------- */

/* AdamW over a flat array, llm.c semantics (t is the 1-based step, i.e. step+1):
 *   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
 *   mhat = m/(1-b1^t);  vhat = v/(1-b2^t);
 *   p -= lr * (mhat/(sqrt(vhat)+eps) + wd*p)        (decay applies to every parameter). */
void xmp_adamw(float *params, const float *grads, float *m, float *v, size_t n, float lr,
               float beta1, float beta2, float eps, float weight_decay, int t);

/* ---- deterministic random numbers for fresh init --------------------------------------
 * Counter based, so values do not depend on how a tensor is sharded or in which order its
 * pieces are generated: element i of stream s under seed k is
 *   xmp_normal_at(k, s, i) = Box-Muller(u1, u2) with u1, u2 from splitmix64-style hashes of
 *   (k, s, 2i) and (k, s, 2i+1) (u1 in (0,1], u2 in [0,1)), cosine branch only.
 * A full tensor of n elements is xmp_normal_fill(dst, n, k, s, 0, std); a shard holding
 * the contiguous flat range [i0, i0+n) calls xmp_normal_fill(dst, n, k, s, i0, std). */
float xmp_normal_at(uint64_t seed, uint64_t stream, uint64_t index);
void xmp_normal_fill(float *dst, size_t n, uint64_t seed, uint64_t stream, uint64_t first_index,
                     float std);
/* splitmix64 step: returns the next value and advances *state. */
uint64_t xmp_splitmix64(uint64_t *state);

/* MT19937 (32-bit Mersenne Twister, Matsumoto-Nishimura), seeded like torch/llm.c
 * (state[0] = seed, state[j] = 1812433253*(s ^ s>>30) + j), used by the llm.c-compatible
 * data loader for shuffling. First output for seed 137 is 4053805790. */
typedef struct {
    uint32_t mt[624];
    int idx;
} xmp_mt19937_t;
void xmp_mt19937_seed(xmp_mt19937_t *r, uint32_t seed);
uint32_t xmp_mt19937_u32(xmp_mt19937_t *r);
/* Fisher-Yates from the end, as llm.c's random_permutation: for i = n-1 down to 1,
 * j = u32 % (i+1), swap a[i], a[j]. Does not reset a to the identity first. */
void xmp_mt19937_permute(int *a, int n, xmp_mt19937_t *r);

#ifdef __cplusplus
}
#endif
#endif /* XMP_NN_KERNELS_H */
