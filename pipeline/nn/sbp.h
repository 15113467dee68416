/*
 * SBP tensors on one device mesh, and boxing between SBP signatures
 * (OneFlow, paper 004 sections 3.1-3.2).
 *
 * Design note
 * -----------
 * SBP model. A global tensor lives on a mesh of ndim (1..4) axes. For every
 * mesh axis it carries one SBP: S(d) (tensor dim d is split over the ranks of
 * that axis), B (every rank of the axis holds the same data) or P (every rank
 * holds a partial value; the global tensor is the elementwise SUM over the
 * axis). Axes are independent: the global value is obtained by undoing the
 * axes one at a time, in any order.
 *
 * Local-block rule (identical to libxmesh, README "Sharding specs"): for a
 * tensor dim d split by mesh axes a1 < a2 < ... (lower axis major), the dim is
 * cut by numpy.array_split into prod(shape[ai]) pieces (the first n mod k get
 * one more element; empty pieces are legal) and the rank takes piece number
 * (((c[a1]) * shape[a2] + c[a2]) * ...). B and P axes do not cut. Local data
 * is dense row-major in the local block shape. test_boxing checks this rule
 * against xmesh_layout_local_shape/offset.
 *
 * P on fill: xmp_tensor_fill_from_full puts the full value on the holder,
 * coordinate 0 of each P axis, and zeros on the other ranks of that axis.
 *
 * Gradient SBP rule. Boxing never changes the global value, so its backward
 * is again a boxing of the gradient. The gradient of a tensor has the same
 * SBP as the tensor, except: the gradient of a P tensor is B (every partial
 * receives the full upstream gradient, since d(sum)/d(part) = 1), and the
 * gradient of a B tensor that every rank consumed redundantly is B. (A layer
 * may produce a P gradient for a B input when each rank used only part of it,
 * e.g. the column-split linear: dX = dY_local * W_local is P; data-parallel
 * weights get P gradients over the data axis. Callers box those P -> B when
 * they need the value, e.g. the optimizer step.)
 *
 * Boxing per mesh axis, on that axis' sub-communicator (Open MPI nonblocking
 * collectives waited with a deadline, see xmp_allreduce below; the all-to-all
 * is MPI_Isend/MPI_Irecv pairs: Open MPI 4.1's MPI_Ialltoallv hung here, see
 * sbp.c):
 *   P -> B      MPI_Allreduce (sum)
 *   P -> S(d)   MPI_Reduce_scatter, uneven counts (pack by destination first)
 *   S(d) -> B   MPI_Allgatherv (unpack when d is not the block's leading dim)
 *   S(i)->S(j)  MPI_Alltoallv (pack / unpack sub-boxes)
 *   B -> S(d)   local slice, no communication
 *   B -> P      the holder (coordinate 0 on the axis) keeps, others zero
 *   S(d) -> P   local place: each rank writes its block at its offset into a
 *               zero tensor of the unsplit shape (sum over the axis = value)
 *   X -> X      copy
 * Multi-axis changes go axis by axis in four passes, ascending axis within a
 * pass: (1) axes leaving P (reduce first, data shrinks or stays), (2) axes
 * going to S from B or another S (shrink before gathering), (3) axes going
 * S -> B, (4) axes going to P.
 * Shared split: when the axis a being changed splits a tensor dim that another axis also
 * splits (the 3d / axonn layouts), the blocks follow the flat "lower axis is major"
 * array_split rule, which is not always the nesting ("natural cut") that the per-axis
 * collective produces: axis a's pieces are the array_split of the block with axis a unsplit.
 * Where the flat blocks are that natural cut on every rank (a is the innermost axis of the dim
 * and the sizes divide), the step is the one collective above over axis a's sub-communicator.
 * Otherwise it is one all-to-all over the mesh communicator (point-to-point pairs only between
 * ranks that exchange data) that sends the fewest bytes: S/B -> S/B every element a rank lacks,
 * once; P -> S(d) every partial straight to the rank whose block holds it, summed there in rank
 * order (a direct reduce-scatter: p-1 partials per element, one more where the holder's source
 * block lacks it); S(d) -> P only the elements a rank cannot place in its own destination
 * block. test_box_shared checks these byte counts against the analytic minimum.
 *
 * Errors: functions return xmesh_result_t; on error xmp_last_error() names
 * the bad value and outputs are untouched (no allocation survives).
 * Collectives: functions marked "collective over the mesh" must be called by
 * every member of the mesh with the same arguments (non-members may call;
 * they return at once with empty tensors).
 */
#ifndef XMP_NN_SBP_H
#define XMP_NN_SBP_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include <xmesh.h>
#include <xmesh/mpi.h>

#include "nn/coll.h"
#include "nn/error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define XMP_MAX_MESH_DIMS 4
#define XMP_MAX_DIMS 8

/* Errors: nn/error.h (xmp_err, xmp_last_error), the one convention of pipeline/. */

/* Seconds this thread spent inside the MPI collectives of boxing and of the
 * SBP layers (all-reduce, reduce-scatter, all-gather, all-to-all), summed
 * since the thread started: callers difference it to split a step into
 * compute and boxing time. */
double xmp_comm_seconds(void);
void xmp_comm_seconds_add(double s);
/* Evaluates an MPI call and adds its wall time to xmp_comm_seconds(). */
#define XMP_TIMED_MPI(call)                                                                        \
    __extension__({                                                                                \
        double xmp_t0_ = MPI_Wtime();                                                              \
        int xmp_rc_ = (call);                                                                      \
        xmp_comm_seconds_add(MPI_Wtime() - xmp_t0_);                                               \
        xmp_rc_;                                                                                   \
    })

/* Boxing byte counter, per thread (docs/BOXING_BYTES.md). Every call of xmp_allreduce,
 * xmp_allgatherv, xmp_reduce_scatter and xmp_alltoallv that completes adds, for its kind:
 *   calls    1;
 *   payload  the raw bytes this rank hands to the collective: all-reduce its buffer (count),
 *            all-gather its own block (scount), reduce-scatter its whole input (sum rcounts),
 *            all-to-all the blocks it sends to OTHER ranks (sum of scounts[p], p != me);
 *   bytes    the bytes this rank sends under the ring-equivalent convention, independent of
 *            the algorithm MPI picks, with n the full buffer and p the communicator size:
 *            all-reduce 2 (p-1)/p n (n = count), all-gather (p-1)/p n (n = sum rcounts),
 *            reduce-scatter (p-1)/p n (n = sum rcounts), all-to-all exactly the off-rank
 *            payload (= (p-1)/p n for an even split of an n-byte local buffer); 0 when p = 1.
 *            This is xm_coll_volume of scheduler/xm_costmodel.h, the layout search's volume.
 * Counts start at 0 when the thread starts; callers difference two snapshots (or reset). */
typedef enum {
    XMP_COLL_ALLREDUCE = 0,
    XMP_COLL_ALLGATHER = 1,
    XMP_COLL_REDUCE_SCATTER = 2,
    XMP_COLL_ALLTOALL = 3,
    XMP_COLL_NKINDS = 4
} xmp_coll_kind_t;
typedef struct {
    double bytes[XMP_COLL_NKINDS]; /* ring-equivalent bytes sent, per kind */
    int64_t payload[XMP_COLL_NKINDS];
    int64_t calls[XMP_COLL_NKINDS];
} xmp_comm_counts_t;
/* Total ring-equivalent bytes this thread sent in nn/ collectives (sum over kinds). */
double xmp_comm_bytes(void);
/* Snapshot of every count (out not NULL). */
void xmp_comm_counts(xmp_comm_counts_t *out);
/* Adds one completed collective of kind (conventions above; p the communicator size) that
 * did not go through the functions above (the nonblocking boxing of nn/overlap.h). */
void xmp_comm_count_add(int kind, int p, int64_t payload, double bytes);
/* Zeroes the counts of this thread. */
void xmp_comm_counts_reset(void);
/* "allreduce", "allgather", "reduce_scatter", "alltoall"; NULL out of range. */
const char *xmp_coll_kind_name(int kind);

/* Collectives of nn/ (boxing and the SBP layers: every collective goes through them), the
 * deadline, failure notices and xmp_timeout_s: nn/coll.h, the one engine of pipeline/. */

/* A mesh group. Public fields are read-only for callers. */
typedef struct xmp_mesh {
    int ndim;                         /* 1..4 */
    int shape[XMP_MAX_MESH_DIMS];     /* axis sizes */
    int size;                         /* prod(shape) */
    int *ranks;                       /* size ranks of the parent comm, row-major devices */
    int member;                       /* 1 if this rank is in the mesh */
    int index;                        /* row-major device index (-1 if not member) */
    int coord[XMP_MAX_MESH_DIMS];     /* this rank's coordinates (0 if not member) */
    MPI_Comm comm;                    /* ranks of the mesh ordered by index (NULL if not member) */
    MPI_Comm axis[XMP_MAX_MESH_DIMS]; /* ranks differing only on axis a, ordered by coord[a] */
    xmesh_mesh_t xmesh;               /* the same mesh for xmesh layouts (NULL if no ctx) */
} xmp_mesh_t;

/* Collective over parent. ranks: size distinct ranks of parent, row-major
 * (as xmesh_mesh_create). ctx may be NULL; otherwise it must be created over
 * parent (same rank numbering) and the matching xmesh mesh is created too.
 * All communicators are created here, once. *out is owned by the caller. */
xmesh_result_t xmp_mesh_create(MPI_Comm parent, xmesh_ctx_t ctx, int ndim, const int *shape,
                               const int *ranks, xmp_mesh_t **out);
/* Local: frees communicators and the xmesh mesh. NULL is a no-op. */
xmesh_result_t xmp_mesh_destroy(xmp_mesh_t *mesh);

typedef enum { XMP_S = 0, XMP_B = 1, XMP_P = 2 } xmp_sbp_kind_t;
typedef struct {
    xmp_sbp_kind_t kind;
    int dim; /* split dim for XMP_S, ignored otherwise */
} xmp_sbp_t;

static inline xmp_sbp_t xmp_sbp_s(int d)
{
    xmp_sbp_t s = {XMP_S, d};
    return s;
}
static inline xmp_sbp_t xmp_sbp_b(void)
{
    xmp_sbp_t s = {XMP_B, 0};
    return s;
}
static inline xmp_sbp_t xmp_sbp_p(void)
{
    xmp_sbp_t s = {XMP_P, 0};
    return s;
}
static inline int xmp_sbp_eq(xmp_sbp_t a, xmp_sbp_t b)
{
    return a.kind == b.kind && (a.kind != XMP_S || a.dim == b.dim);
}
/* Gradient SBP of a tensor with SBP s: P -> B, else s (see design note). */
static inline xmp_sbp_t xmp_sbp_grad(xmp_sbp_t s)
{
    return s.kind == XMP_P ? xmp_sbp_b() : s;
}
/* Parses "S(0),B,P" (mesh_ndim tokens) into sbp[]. */
xmesh_result_t xmp_sbp_parse(const char *s, int mesh_ndim, int tensor_ndim, xmp_sbp_t *sbp);

/* An SBP tensor. data is owned (xmp_tensor_free). Non-members hold nothing
 * (lcount 0, data NULL). */
typedef struct {
    int ndim;
    int64_t shape[XMP_MAX_DIMS];
    xmesh_dtype_t dtype; /* XMESH_F32 for compute; XMESH_I32 for token ids */
    xmp_mesh_t *mesh;
    xmp_sbp_t sbp[XMP_MAX_MESH_DIMS];
    int64_t lshape[XMP_MAX_DIMS]; /* local block shape */
    int64_t loff[XMP_MAX_DIMS];   /* local block offset in the global tensor */
    int64_t lcount;               /* prod(lshape), 0 for non-members */
    void *data;                   /* lcount elements, zero-initialised */
    char spec[64];                /* "S(0),B" */
} xmp_tensor_t;

/* Allocation accounting (contract D), per thread: every xmp_tensor_alloc adds the bytes of
 * its local block (at least 4: an empty block still allocates one element), every
 * xmp_tensor_free of a tensor that holds data subtracts them; model buffers that are not
 * tensors are added with xmp_mem_track(+bytes) and removed with xmp_mem_track(-bytes).
 * live: bytes held now; peak: the largest live value since the thread started or since the
 * last xmp_mem_peak_reset() (which sets peak = live). Thread-local, so a pipeline with one
 * thread per stage reads each stage's own figures; a tensor freed by another thread than the
 * one that allocated it moves bytes between the two counters. */
int64_t xmp_mem_live_bytes(void);
int64_t xmp_mem_peak_bytes(void);
void xmp_mem_peak_reset(void);
void xmp_mem_track(int64_t delta);

/* Block [lo, hi) of the device at mesh coordinates coord (own index math). */
void xmp_block(const xmp_mesh_t *m, int ndim, const int64_t *shape, const xmp_sbp_t *sbp,
               const int *coord, int64_t *lo, int64_t *hi);
/* Validates (dims, split dims, dtype) and allocates a zeroed local block.
 * Local. On error *t is untouched. */
xmesh_result_t xmp_tensor_alloc(xmp_tensor_t *t, xmp_mesh_t *mesh, int ndim, const int64_t *shape,
                                xmesh_dtype_t dtype, const xmp_sbp_t *sbp);
/* As xmp_tensor_alloc, the block left uninitialised: only for a caller that writes every
 * element before anything reads it (a copy, a product with beta 0). */
xmesh_result_t xmp_tensor_alloc_uninit(xmp_tensor_t *t, xmp_mesh_t *mesh, int ndim,
                                       const int64_t *shape, xmesh_dtype_t dtype,
                                       const xmp_sbp_t *sbp);
/* Same geometry and SBP as t, zeroed. */
xmesh_result_t xmp_tensor_alloc_like(xmp_tensor_t *out, const xmp_tensor_t *t);
void xmp_tensor_free(xmp_tensor_t *t);
/* 1 when t has SBP sbp[a] on every axis of its mesh. */
static inline int xmp_tensor_sbp_is(const xmp_tensor_t *t, const xmp_sbp_t *sbp)
{
    for (int a = 0; a < t->mesh->ndim; a++)
        if (!xmp_sbp_eq(t->sbp[a], sbp[a]))
            return 0;
    return 1;
}
static inline float *xmp_f32(const xmp_tensor_t *t)
{
    return (float *)t->data;
}
/* Fills the xmesh layout; l->shape and l->sharding point into t. */
xmesh_result_t xmp_tensor_layout(const xmp_tensor_t *t, xmesh_layout_t *l);
/* Local: copies my block of the full row-major global array (P: holder
 * keeps the value, other ranks of a P axis get zeros). */
xmesh_result_t xmp_tensor_fill_from_full(xmp_tensor_t *t, const void *full);
/* Collective over the mesh: every member gets the full global value in full
 * (prod(shape) elements; P axes summed). For tests. */
xmesh_result_t xmp_tensor_gather_full(const xmp_tensor_t *t, void *full);

/* Collective over the mesh. y = x with SBP dst (y allocated here; x kept). */
xmesh_result_t xmp_box(const xmp_tensor_t *x, const xmp_sbp_t *dst, xmp_tensor_t *y);
/* Collective over the mesh. Backward of a boxing whose source SBP was
 * src: dx = dy boxed to xmp_sbp_grad(src) per axis (dy may carry any SBP,
 * e.g. B for the gradient of a P->B output, or P). */
xmesh_result_t xmp_box_backward(const xmp_tensor_t *dy, const xmp_sbp_t *src, xmp_tensor_t *dx);
/* Boxes t in place (replaces its data) when its SBP differs from dst. */
xmesh_result_t xmp_box_inplace(xmp_tensor_t *t, const xmp_sbp_t *dst);

/* Helpers shared by the nn/ sources (not for model code). */
xmesh_result_t xmp_sbp_check(const xmp_mesh_t *m, int ndim, const xmp_sbp_t *sbp, const char *what);
/* op's operand `name`: refused when NULL or not f32 (the message names op, operand, dtype). */
xmesh_result_t xmp_check_f32(const xmp_tensor_t *t, const char *op, const char *name);
/* op's operands a and b: refused when on different meshes. */
xmesh_result_t xmp_same_mesh(const xmp_tensor_t *a, const xmp_tensor_t *b, const char *op);
/* Every axis (XMP_MAX_MESH_DIMS) of s B. */
void xmp_sbp_all_b(xmp_sbp_t *s);
/* Product of s[lo..hi). */
int64_t xmp_prod(const int64_t *s, int lo, int hi);
void xmp_sbp_string(const xmp_sbp_t *sbp, int mesh_ndim, char *buf, size_t n);
/* Copies a box of extent ext from src (shape ss) at lo_s to dst (shape ds)
 * at lo_d, row-major, esz-byte elements. */
void xmp_copy_box(int ndim, const int64_t *ext, const void *src, const int64_t *ss,
                  const int64_t *lo_s, void *dst, const int64_t *ds, const int64_t *lo_d,
                  size_t esz);

#ifdef __cplusplus
}
#endif
#endif /* XMP_NN_SBP_H */
