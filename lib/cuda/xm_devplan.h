/*
 * Device-independent half of the NCCL backend: how the per-rank program of
 * the core (lib/plan/xm_program.h, the same program the MPI executor runs)
 * becomes device work, touching no device. Plain C; the CPU unit tests
 * (tests/gpu/test_devplan.c) compile lib/cuda/devplan.c directly and run
 * whole reshardings through a CPU emulation of NCCL's grouped send/recv, so
 * what the GPU executes is checked here even without a GPU.
 *
 * Pieces:
 *   - the device plan: the rank's program, its staging pool (two slots per
 *     step, pooled per link class by xm_program_pool; partial-sum steps of
 *     f16/bf16 add two dtype slots for the converted sums) and peers;
 *   - lowering: the ops of one lockstep round (xm_rounds_next) become
 *     kernel launches and ncclSend/ncclRecv on pool offsets, with pack
 *     descriptors (xm_packdesc.h) of each chunk;
 *   - communicator-cache keys: one NCCL communicator per set of ranks (the
 *     union of a plan's two meshes), shared by all plans over that pair;
 *   - CPU reference pack/unpack/reduce of the kernels.
 */
#ifndef XM_DEVPLAN_H
#define XM_DEVPLAN_H

#include "xm_core.h"
#include "xm_packdesc.h"
#include "xm_program.h"
#include "xm_sched.h"

/* ----------------------------------------------------- pack descriptors */

/* Descriptor of `box` inside the dense row-major block [blk_lo, blk_hi).
 * The box must lie inside the block. Dims of extent 1 are dropped and
 * adjacent dims that are contiguous in the block are merged, so a slab of
 * whole rows becomes one contiguous run. */
void xm_packdesc_make(int ndim, const int64_t *blk_lo, const int64_t *blk_hi, const xm_box_t *box,
                      xm_packdesc_t *out);
/* Descriptor of the box-linear elements [a, a + cnt) of a program step's
 * geometry (a chunk). */
void xm_packdesc_from_geom(const xm_geom_t *g, int64_t a, int64_t cnt, xm_packdesc_t *out);

/* ---------------------------------------------------------- device ops */

typedef enum {
    XM_OP_COPY = 0,   /* src block chunk -> dst block chunk */
    XM_OP_PACK = 1,   /* src (or dst) block chunk -> buf (converted to f32 when acc) */
    XM_OP_SEND = 2,   /* buf -> peer */
    XM_OP_RECV = 3,   /* peer -> buf */
    XM_OP_REDUCE = 4, /* buf (+)= src block chunk; converted to out when convert_out */
    XM_OP_UNPACK = 5  /* buf -> dst block chunk */
} xm_opkind_t;

/* Phases of a round: 0 before the NCCL group, 1 inside
 * ncclGroupStart/End (sends and receives), 2 after it. */
typedef struct xm_op {
    int kind;
    int phase;
    int peer;            /* SEND/RECV: context rank */
    int64_t buf;         /* byte offset of the staging buffer in the pool */
    int64_t out;         /* REDUCE with convert_out: byte offset of the dtype copy */
    int acc;             /* buf holds accumulator elements (f32 for f16/bf16) */
    int convert_out;     /* REDUCE: out[k] = dtype(buf[k] + src) */
    int from_dst;        /* PACK: read the destination block (all-gather ring head) */
    int64_t count;       /* elements */
    xm_packdesc_t desc;  /* PACK/REDUCE/UNPACK: the chunk in its block; COPY: source side */
    xm_packdesc_t desc2; /* COPY: destination side */
} xm_op_t;

typedef struct xm_devplan {
    xm_program_t prog;
    int64_t nrounds;     /* rounds of the plan (every rank) */
    int64_t *off;        /* per step: pool offset of its staging, -1 none */
    unsigned char *conv; /* per step: has dtype slots for converted partial sums */
    int64_t pool_bytes;
    int *peers; /* distinct peers, sorted */
    int npeers;
} xm_devplan_t;

/* Builds rank's device plan. On error *out is untouched. */
xmesh_result_t xm_devplan_build(const xm_prog_in_t *in, int rank, xm_devplan_t *out);
void xm_devplan_free(xm_devplan_t *d);
/* Lowers the ops of one round (xm_rounds_next) into out[0 .. return) (at
 * most n ops), phase order kept; -1 on an op the device cannot run (a
 * broken program). */
int xm_devplan_lower(const xm_devplan_t *dp, const xm_rop_t *r, int n, xm_op_t *out);

/* ----------------------------------------------- communicator cache */

/* Sorted distinct ranks of a communicator. Equal keys mean the same
 * communicator; the hash only speeds up comparison. A rank's index in
 * ranks[] is its rank in the split communicator (ncclCommSplit is called
 * with key = context rank, which orders split ranks the same way). */
typedef struct xm_commkey {
    uint64_t hash;
    int n;
    int *ranks;
} xm_commkey_t;

/* Union of two rank lists. On error *out is untouched. */
xmesh_result_t xm_commkey_make(const int *a, int na, const int *b, int nb, xm_commkey_t *out);
int xm_commkey_equal(const xm_commkey_t *a, const xm_commkey_t *b);
/* Index of rank in key (its split-communicator rank), -1 if absent. */
int xm_commkey_index(const xm_commkey_t *k, int rank);
void xm_commkey_free(xm_commkey_t *k);

/* Cache of communicators by key, identical on every rank (it is only
 * changed inside collective calls, in the same order everywhere), so hits
 * and misses agree and ncclCommSplit is called by all ranks or none. comm
 * is NULL on ranks outside the key. Bounded by `cap`: a miss on a full
 * cache evicts the least recently used entry without references. */
typedef struct xm_commentry {
    xm_commkey_t key;
    void *comm;  /* ncclComm_t or NULL */
    void *event; /* last work enqueued on comm (cudaEvent_t) or NULL */
    int refs;    /* plans using it */
    uint64_t last_use;
} xm_commentry_t;

typedef struct xm_commcache {
    int n, cap;
    uint64_t clock;
    xm_commentry_t *e;
} xm_commcache_t;

xmesh_result_t xm_commcache_init(xm_commcache_t *c, int cap);
/* Entry index of key (touching its LRU time), -1 on a miss. Call it only
 * from collective calls: the LRU order must stay the same on every rank. */
int xm_commcache_find(xm_commcache_t *c, const xm_commkey_t *key);
/* Same lookup without touching the LRU order (for local calls). */
int xm_commcache_peek(const xm_commcache_t *c, const xm_commkey_t *key);
/* Slot a new key may take: n < cap -> n (a fresh slot); else the LRU entry
 * with refs == 0 (the caller destroys its comm and calls _remove); -1 when
 * every entry is referenced (the caller must fail the plan). */
int xm_commcache_victim(const xm_commcache_t *c);
/* As xm_commcache_victim, but among entries with ok[i] != 0 only (ok has n
 * entries). References are dropped by plan destruction, which is not
 * collective, so ranks can disagree on refs: the backend passes the
 * entries unreferenced on every rank (an MPI_Allreduce of refs == 0). */
int xm_commcache_victim_masked(const xm_commcache_t *c, const int *ok);
/* Moves key into the cache (the caller's key is emptied). */
xmesh_result_t xm_commcache_insert(xm_commcache_t *c, xm_commkey_t *key, void *comm, int *index);
void xm_commcache_remove(xm_commcache_t *c, int i);
void xm_commcache_free(xm_commcache_t *c);

/* --------------------------------------------- element conversions */

/* f16/bf16 conversions: xm_f16_to_f32 & co. in lib/core/xm_core.h */

/* ------------------------------------------ CPU reference of the kernels */

/* These mirror lib/cuda/kernels.cu element by element (same index mapping,
 * same accumulator types); the CPU emulator in the tests uses them. */
void xm_ref_pack(const xm_packdesc_t *d, const void *block, void *packed, xmesh_dtype_t dtype,
                 int to_acc);
void xm_ref_unpack(const xm_packdesc_t *d, const void *packed, void *block, size_t elem_size);
void xm_ref_copy(const xm_packdesc_t *src, const void *sblock, const xm_packdesc_t *dst,
                 void *dblock, size_t elem_size);
/* acc[k] (acc type when is_acc, else dtype) += block[d(k)]; the result goes
 * to out (dtype) when out != NULL, else back into acc. */
void xm_ref_reduce(const xm_packdesc_t *d, const void *block, void *acc, int is_acc, void *out,
                   xmesh_dtype_t dtype);

#endif /* XM_DEVPLAN_H */
