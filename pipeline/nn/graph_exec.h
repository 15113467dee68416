/*
 * The graph executor (issue 38 item 1): runs a model graph's nodes (nn/graph.h) over SBP
 * tensors, forward in node order and backward in reverse, the third user of the one
 * description after the strategy checker and the search's cost model.
 *
 * Values are held by id (xmp_gexec_mb_t.val, one array per microbatch). Forward, per kind:
 * layernorm, linear (xmp_linear_forward_box: the GEMM and its collective, piecewise with
 * --overlap coll-matmul), attention (the (B, T, NH, hs) result viewed as the output value's
 * (B, T, C) when it has 3 dims), gelu, add, box. Every output is boxed to its class SBP
 * (xmp_gexec_t.cls; NULL: left as produced), remembering the SBP it had (was); a linear
 * whose only consumer is an add is boxed instead to the SBP of the sum (so the add needs no
 * collective); a linear over a tied parameter (an operand of several nodes) runs unfused
 * (xmp_linear_forward, then the class box). A value no consumer saves (xmp_gnode_t.saves) is freed
 * after its last consumer.
 *
 * Backward, in reverse node order: gradients by value id (xmp_gexec_mb_t.grad), a second
 * contribution added into the first (boxed to its SBP). A node's output gradient is boxed
 * first to the gradient SBP of the SBP the node produced (was) — the backward of its class
 * box — unless the node is a layer norm (it boxes its dy itself). A consumer with the value
 * as its only use boxes the input gradient there directly: an add for a linear's output; a
 * linear its dx (with --overlap bwd-input started nonblocking while its weight gradients are
 * computed, AxoNN paper 001 IV; for a layer norm's output to the SBP the layer norm takes its
 * dy in). The weight gradients of a linear are queued (xmp_gexec_weights runs them: the W of
 * zero-bubble schedules; always for a tied parameter, so that the sums of its uses keep one
 * order) unless the overlap computes them in the box's shadow. Parameter
 * gradients go to the model's grad hook.
 *
 * Collective over the tensors' mesh like the ops it calls. Errors: -1 with the message in
 * xmp_last_error() naming the node.
 */
#ifndef XMP_NN_GRAPH_EXEC_H
#define XMP_NN_GRAPH_EXEC_H

#include "nn/graph.h"
#include "nn/overlap.h"
#include "nn/sbp_layers.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const xmp_graph_t *g;
    const xmp_overlap_t *ov;
    int nax; /* mesh axes of the stage */
    /* class SBP per value id (NULL: the output is not boxed); set by the model, nval long */
    const xmp_sbp_t **cls;
    /* the model's hooks: the compute copy of parameter pid (graph id); a parameter gradient
     * (consumed: added into the accumulator); progress of transfers between layers (NULL:
     * none). */
    void *user;
    const xmp_tensor_t *(*param)(void *user, int pid);
    int (*grad)(void *user, int pid, xmp_tensor_t *d);
    void (*progress)(void *user);
    /* derived by xmp_gexec_init: per value its consumers, its first and last, whether one
     * of them saves it */
    int *nuse, *first, *last;
    unsigned char *keep;
} xmp_gexec_t;

/* A queued weight-gradient GEMM: dW += dy^T x (and db += sum dy); parameters by graph id. */
typedef struct {
    xmp_tensor_t dy;       /* owned */
    const xmp_tensor_t *x; /* the saved input of the same microbatch */
    int pw, pb;            /* pb -1: no bias */
} xmp_gexec_wq_t;

/* One microbatch's state: values, the SBPs before (was) and after their class box, gradients,
 * the layer norms' and attentions' caches by node, the queued weight GEMMs. */
typedef struct {
    xmp_tensor_t *val, *grad;
    xmp_sbp_t (*was)[XMP_MAX_MESH_DIMS], (*sbp)[XMP_MAX_MESH_DIMS];
    xmp_norm_cache_t *nc;
    xmp_attn_cache_t *ac;
    xmp_gexec_wq_t *wq;
    int nwq, capwq;
} xmp_gexec_mb_t;

/* Derives the consumer tables of ex->g (set g first); 0 or -1. xmp_gexec_free releases them. */
int xmp_gexec_init(xmp_gexec_t *ex);
void xmp_gexec_free(xmp_gexec_t *ex);
/* Allocates / releases a microbatch's arrays (zeroed); clear frees its tensors and queue. */
int xmp_gexec_mb_init(const xmp_gexec_t *ex, xmp_gexec_mb_t *m);
void xmp_gexec_mb_clear(const xmp_gexec_t *ex, xmp_gexec_mb_t *m);
void xmp_gexec_mb_free(const xmp_gexec_t *ex, xmp_gexec_mb_t *m);

/* Forward of nodes lo..hi-1 (their value operands in m->val). */
int xmp_gexec_forward(const xmp_gexec_t *ex, xmp_gexec_mb_t *m, int lo, int hi);
/* Backward of nodes hi-1..lo: the gradients of what they output are in m->grad (owned); leaves
 * the gradients of their inputs from outside the range there. */
int xmp_gexec_backward(const xmp_gexec_t *ex, xmp_gexec_mb_t *m, int lo, int hi);
/* A gradient contribution t (consumed) to d: moved there when d holds none, else boxed to d's
 * SBP and added (d += t). 0 or -1. */
int xmp_gexec_add(xmp_tensor_t *d, xmp_tensor_t *t);
/* Queues dW += dy^T x (dy consumed); runs the queue in order (progress every 4). */
int xmp_gexec_queue_w(xmp_gexec_mb_t *m, xmp_tensor_t *dy, const xmp_tensor_t *x, int pw, int pb);
int xmp_gexec_weights(const xmp_gexec_t *ex, xmp_gexec_mb_t *m);

/* Recomputation of nodes lo..hi-1: drop frees what they output but the last node's output
 * (all) or the attention caches (!all); recompute rebuilds it bitwise (the forward is
 * deterministic). */
void xmp_gexec_drop(const xmp_gexec_t *ex, xmp_gexec_mb_t *m, int lo, int hi, int all);
int xmp_gexec_recompute(const xmp_gexec_t *ex, xmp_gexec_mb_t *m, int lo, int hi, int all);
/* Bytes held for nodes lo..hi-1: their outputs and attention probabilities. */
int64_t xmp_gexec_bytes(const xmp_gexec_t *ex, const xmp_gexec_mb_t *m, int lo, int hi);

#ifdef __cplusplus
}
#endif
#endif /* XMP_NN_GRAPH_EXEC_H */
