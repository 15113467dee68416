/*
 * Overlap inside a stage (issue 20 item 4; AxoNN, paper 001 section IV): nonblocking boxing and
 * communication/computation overlap building blocks, each behind a switch so that an ablation
 * can turn it off. None of them changes the arithmetic: every switch on gives the same bits as
 * every switch off (the same MPI collective on the same data, only posted earlier or waited
 * later), which tests/pipeline/test_overlap.c checks element by element.
 *
 * Nonblocking boxing. xmp_box_start copies x (x may be freed or changed afterwards), runs the
 * local steps of the box (slices, B -> P) and posts the first collective step that is a single
 * nonblocking MPI call on one axis communicator: P -> B (MPI_Iallreduce), P -> S(d)
 * (MPI_Ireduce_scatter), S(d) -> B (MPI_Iallgatherv), when no other axis splits the same dim.
 * xmp_box_test progresses it (MPI_Test) and reports *done = 1 once every step is complete;
 * xmp_box_wait completes it (deadline XMESH_TIMEOUT_S and failure notices as xmp_wait), runs the
 * remaining steps (all-to-all steps and steps after the first collective run blocking here) and
 * hands over y (allocated, owned by the caller) and frees the request. Every element of y
 * equals xmp_box(x, dst) (same steps, same order, same MPI calls).
 * Ordering: later steps are posted only inside xmp_box_wait, never by xmp_box_test, so the order
 * in which a rank posts collectives on a communicator does not depend on timing (MPI requires
 * the same order on every rank). Callers start and wait requests in the same order on every
 * member, like any collective. A request must be waited exactly once (also after a test said
 * done). On a timeout or a remote failure in xmp_box_wait the request is abandoned (its buffers
 * stay allocated, MPI may still write them) and the process should end.
 * Collective over the mesh; non-members get an empty y.
 */
#ifndef XMP_NN_OVERLAP_H
#define XMP_NN_OVERLAP_H

#include "nn/sbp.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct xmp_box_req xmp_box_req_t;

xmesh_result_t xmp_box_start(const xmp_tensor_t *x, const xmp_sbp_t *dst, xmp_box_req_t **req);
xmesh_result_t xmp_box_test(xmp_box_req_t *req, int *done);
xmesh_result_t xmp_box_wait(xmp_box_req_t *req, xmp_tensor_t *y);

/* The switches (all 0 = no overlap, the reference). */
typedef struct {
    int bwd_input;   /* linear backward: dX boxing posted before, waited after the dW GEMM */
    int defer_grad;  /* weight-gradient reductions queued, completed at xmp_gradq_finish */
    int prefetch;    /* the next layer's weight gather started one layer ahead */
    int coll_matmul; /* forward weight gather overlapped by splitting the GEMM into pieces */
} xmp_overlap_t;

/* Parses "none", "all" or a comma list of bwd-input, defer-grad, prefetch, coll-matmul into
 * *ov. Unknown names are an error naming the token (*ov untouched). */
xmesh_result_t xmp_overlap_parse(const char *s, xmp_overlap_t *ov);
/* Reads XMP_OVERLAP (unset = none) through xmp_overlap_parse. */
xmesh_result_t xmp_overlap_from_env(xmp_overlap_t *ov);
/* "bwd-input,defer-grad" etc. or "none". */
void xmp_overlap_string(const xmp_overlap_t *ov, char *buf, size_t n);

/* (a) Linear backward, both parts: dx = dy w boxed to dx_sbp (NULL: left as produced, then no
 * communication to overlap), dw, db (NULL: none) as xmp_linear_backward_weight. With
 * ov->bwd_input the boxing of dx is started before the weight-gradient GEMM and waited after
 * it; without, it is boxed first. Same values either way (bitwise). Collective over the mesh. */
xmesh_result_t xmp_linear_backward_ov(const xmp_overlap_t *ov, const xmp_tensor_t *dy,
                                      const xmp_tensor_t *x, const xmp_tensor_t *w,
                                      const xmp_sbp_t *dx_sbp, xmp_tensor_t *dx, xmp_tensor_t *dw,
                                      xmp_tensor_t *db);

/* (a') The same for a convolution (nn/sbp_conv.h): dx = xmp_conv2d_backward_input boxed to
 * dx_sbp (NULL: left as produced), dw, db (NULL: none) as xmp_conv2d_backward_weight; with
 * ov->bwd_input the box of dx is in flight during the weight-gradient GEMM (the im2col
 * product). Same values either way (bitwise). Collective over the mesh. */
xmesh_result_t xmp_conv2d_backward_ov(const xmp_overlap_t *ov, const xmp_tensor_t *dy,
                                      const xmp_tensor_t *x, const xmp_tensor_t *w, int stride,
                                      int pad, const xmp_sbp_t *dx_sbp, xmp_tensor_t *dx,
                                      xmp_tensor_t *dw, xmp_tensor_t *db);

/* (b) Deferred gradient reductions. xmp_gradq_add(q, g, dst): the tensor *g (owned by the
 * caller, must stay alive) is to be boxed to dst in place (e.g. dW P -> B or P -> S(0) for
 * sharded optimizer state). Without defer_grad it is boxed at once; with it the box is started
 * nonblocking and completed by xmp_gradq_finish (end of the backward, or the pipeline's W/R
 * slot), which replaces g's data. xmp_gradq_progress tests the queued boxes (call it between
 * pieces of compute). Collective: every member adds the same tensors in the same order. */
typedef struct xmp_gradq xmp_gradq_t;
xmesh_result_t xmp_gradq_create(const xmp_overlap_t *ov, xmp_gradq_t **q);
xmesh_result_t xmp_gradq_add(xmp_gradq_t *q, xmp_tensor_t *g, const xmp_sbp_t *dst);
xmesh_result_t xmp_gradq_progress(xmp_gradq_t *q);
xmesh_result_t xmp_gradq_finish(xmp_gradq_t *q);
/* Frees the queue (entries not finished are waited and dropped first). NULL is a no-op. */
void xmp_gradq_destroy(xmp_gradq_t *q);

/* (c) Prefetch of a weight kept sharded (e.g. S over the data axis, AxoNN's depth sharding)
 * and gathered to the SBP it is used in. xmp_prefetch_start(ov, w, use_sbp, &p): with
 * ov->prefetch the gather is started now (call it one layer ahead); without, nothing happens
 * until xmp_prefetch_get, which then boxes blocking. xmp_prefetch_get gives the gathered
 * weight (owned by the caller). Same values either way. */
typedef struct xmp_prefetch xmp_prefetch_t;
xmesh_result_t xmp_prefetch_start(const xmp_overlap_t *ov, const xmp_tensor_t *w,
                                  const xmp_sbp_t *use_sbp, xmp_prefetch_t **p);
xmesh_result_t xmp_prefetch_get(xmp_prefetch_t *p, xmp_tensor_t *w_used);

/* (d) Collective matmul. y = x ws_used^T (+ b) where the weight ws (out, K) is stored S(0) on
 * mesh axis `axis` (sharded rows, e.g. AxoNN's depth sharding) and used B there (other axes
 * as stored). Without ov->coll_matmul: ws is gathered (xmp_box) and one xmp_linear_forward
 * runs. With it: every owner's row piece is posted at once (one MPI_Ibcast per piece on the
 * axis communicator) and the GEMM runs piece by piece in piece order, each piece as soon as
 * it has arrived, writing columns [lo, hi) of y; so the gather of later pieces overlaps the
 * GEMM of earlier ones. Each output element is the same K-long dot product either way; the
 * BLAS may block a narrower GEMM differently, so bitwise equality is not promised (the test
 * checks it and, with OpenBLAS on one thread, sees it). Falls back to the plain path (same on
 * every member, decided by SBPs only) when another axis splits or sums the rows (S(0)/P), or
 * b is not B on every axis. Errors: ws not 2-D or not S(0) on axis. Collective over the mesh. */
xmesh_result_t xmp_linear_forward_cm(const xmp_overlap_t *ov, const xmp_tensor_t *x,
                                     const xmp_tensor_t *ws, int axis, const xmp_tensor_t *b,
                                     xmp_tensor_t *y);

/* (e) Collective matmul, the other direction: a GEMM followed by its forward collective
 * (Megatron's row-parallel output P -> B, the 3-D signature's P -> S over K). y = (x w^T + b)
 * boxed to dst, or, with like != NULL (dst NULL), to the SBP xmp_add_forward(like, .) gives
 * the sum (xmp_rule_add), so that the add that follows needs no collective. was (may be NULL)
 * receives the SBP the GEMM produced (for the backward). Without ov->coll_matmul: one
 * xmp_linear_forward and one xmp_box. With it: x is cut along the batch dim that admits the
 * most pieces (k <= 4, every rank's block an exact slice: the global extent divisible by k x
 * the ranks splitting it), and piece i's GEMM runs, then its box is started nonblocking
 * (xmp_box_start) while piece i+1's GEMM runs; the boxes are waited in start order and the
 * pieces put back in place. Rows are independent, so every element has the same GEMM dot
 * product and the same collective over the same ranks: the same values (bitwise where the
 * all-reduce order does not depend on the message size, e.g. two ranks; OpenBLAS on one
 * thread). Falls back to the plain path (decided from SBPs and shapes only: the same on every
 * member) when no batch dim admits 2 pieces or the box would change the piece dim's split.
 * Collective over the mesh. */
xmesh_result_t xmp_linear_forward_box(const xmp_overlap_t *ov, const xmp_tensor_t *x,
                                      const xmp_tensor_t *w, const xmp_tensor_t *b,
                                      const xmp_sbp_t *dst, const xmp_tensor_t *like,
                                      xmp_sbp_t *was, xmp_tensor_t *y);

/* (e') The same for a convolution (nn/sbp_conv.h): y = conv2d(x, w, b, stride, pad) boxed to
 * dst (the U-Transformer's conv followed by its act.* box: the row-parallel P -> B or P -> S of
 * a conv whose input channels are split). With ov->coll_matmul the images (dim 0) are cut into
 * k <= 4 pieces (every rank's block an exact slice), piece i's convolution runs while the box
 * of piece i-1 is in flight, the pieces are put back in place. Every output element is the
 * same convolution sum and the same collective: the same values. Falls back to one convolution
 * and one box (decided from SBPs and shapes only) when dim 0 admits no 2 pieces or the box
 * would change dim 0's split. Errors: x not 4-D, as xmp_conv2d_forward. Collective. */
xmesh_result_t xmp_conv2d_forward_box(const xmp_overlap_t *ov, const xmp_tensor_t *x,
                                      const xmp_tensor_t *w, const xmp_tensor_t *b, int stride,
                                      int pad, const xmp_sbp_t *dst, xmp_sbp_t *was,
                                      xmp_tensor_t *y);

#ifdef __cplusplus
}
#endif
#endif /* XMP_NN_OVERLAP_H */
