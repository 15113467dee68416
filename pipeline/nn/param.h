/*
 * The sharded-parameter engine shared by the models (issue 20 item 3): one parameter tensor with
 * a compute SBP (the form the layers use) and a storage SBP (the form it and its optimizer state
 * are kept in between steps: ZeRO over a data axis, AxoNN's depth shard, paper 001 III-B). When
 * they differ the parameter is "sharded": once per step its gradient is reduced straight into the
 * storage SBP (P -> S: a reduce-scatter where the compute form is replicated), the optimizer
 * updates the local shard only, and the shard is all-gathered back into the compute copy.
 *
 *   xmp_param_init     compute copy (and stored shard) from the full tensor, zeroed optimizer
 *                      state of `nstate` floats per stored element (AdamW 2, SGD momentum 1)
 *   ... the model accumulates gradient contributions into p->g (any SBP; see xmp_param_acc) ...
 *   xmp_param_reduce   p->g boxed into p->r with the storage SBP (start/wait: nonblocking)
 *   the model's optimizer updates xmp_param_stored(p) with p->r and p->state[0..nstate)
 *   xmp_param_gather   sharded: the stored shard boxed into the compute copy (start/wait)
 *
 * Ownership: every tensor and state array belongs to the xmp_param_t (xmp_param_free). Errors:
 * xmesh result codes with xmp_last_error() naming the operation; the parameter is left as it was
 * (a failed gather keeps the previous compute copy). Collective over the parameter's mesh where
 * boxing is.
 */
#ifndef XMP_NN_PARAM_H
#define XMP_NN_PARAM_H

#include <stdint.h>

#include "nn/overlap.h"
#include "nn/sbp.h"

#ifdef __cplusplus
extern "C" {
#endif

#define XMP_PARAM_MAX_STATE 2

typedef struct {
    xmp_tensor_t w; /* compute copy, compute SBP */
    xmp_tensor_t g; /* gradient accumulator (any SBP; mesh NULL: nothing accumulated) */
    xmp_tensor_t r; /* the step's reduced gradient, storage SBP (mesh NULL: none) */
    xmp_tensor_t s; /* sharded: the stored copy (storage SBP) */
    int sharded;    /* storage SBP != compute SBP */
    int nstate;     /* optimizer state arrays */
    float *state[XMP_PARAM_MAX_STATE]; /* per stored local element, zeroed at init */
    xmp_box_req_t *red, *pre;          /* in flight: reduction, gather */
} xmp_param_t;

/* Sets *p up on mesh for a tensor of ndim dims and global shape, compute SBP `compute`, storage
 * SBP `store` (NULL: the compute SBP), values this rank's blocks of full (the global tensor, row
 * major), nstate (0..2) optimizer state arrays. With acc_sbp set the gradient accumulator is
 * allocated (zero) with that SBP; NULL: left empty for xmp_param_acc. *p is zeroed first; on
 * error it holds nothing. */
xmesh_result_t xmp_param_init(xmp_param_t *p, xmp_mesh_t *mesh, int ndim, const int64_t *shape,
                              const xmp_sbp_t *compute, const xmp_sbp_t *store, const float *full,
                              int nstate, const xmp_sbp_t *acc_sbp);
void xmp_param_free(xmp_param_t *p); /* NULL-safe; zeroes */

/* The tensor the optimizer updates: the stored shard, or the compute copy. */
xmp_tensor_t *xmp_param_stored(xmp_param_t *p);
const xmp_tensor_t *xmp_param_stored_c(const xmp_param_t *p);

/* Accumulator SBP for compute SBP s: S stays, B becomes P (per-microbatch contributions of a
 * replicated parameter are partial sums until the reduction). */
void xmp_param_acc_sbp(const xmp_sbp_t *s, xmp_sbp_t *g);

/* p->g += *d (d consumed): the first contribution is taken as it is; a later one of the same
 * SBP is added locally, another SBP is boxed to g's first. */
xmesh_result_t xmp_param_acc(xmp_param_t *p, xmp_tensor_t *d);

/* The step's reduction: p->r = p->g boxed to the storage SBP (P -> B all-reduce, P -> S
 * reduce-scatter). p->g is kept (zero it with xmp_param_zero_grad). No accumulated gradient:
 * p->r stays empty (a zero gradient). start/wait: the same, nonblocking. */
xmesh_result_t xmp_param_reduce(xmp_param_t *p);
xmesh_result_t xmp_param_reduce_start(xmp_param_t *p);
xmesh_result_t xmp_param_reduce_wait(xmp_param_t *p);

/* Sharded: the stored shard all-gathered into the compute copy (nothing to do otherwise).
 * start/wait: the same, nonblocking (prefetch). */
xmesh_result_t xmp_param_gather(xmp_param_t *p);
xmesh_result_t xmp_param_gather_start(xmp_param_t *p);
xmesh_result_t xmp_param_gather_wait(xmp_param_t *p);

/* After the update: frees p->r; zeroes p->g in place (free_g: frees it instead). */
void xmp_param_zero_grad(xmp_param_t *p, int free_g);

/* Bytes on this rank: stored parameter, optimizer state (nstate arrays of the stored size),
 * compute copy, gradient accumulator. */
typedef struct {
    int64_t param, optimizer, compute, grad;
} xmp_param_bytes_t;
void xmp_param_bytes(const xmp_param_t *p, xmp_param_bytes_t *b); /* adds into *b */

#ifdef __cplusplus
}
#endif
#endif /* XMP_NN_PARAM_H */
