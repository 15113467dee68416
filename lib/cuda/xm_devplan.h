/*
 * Device-independent half of the NCCL backend: everything that decides what
 * moves where, in which step, through which staging slot, but touches no
 * device. Plain C; the CPU unit tests (tests/gpu/test_devplan.c) compile
 * lib/cuda/devplan.c directly and run whole reshardings through a CPU
 * emulation of NCCL's grouped send/recv, so the program the GPU executes is
 * checked here even without a GPU.
 *
 * Pieces:
 *   - chunk plans: which sub-box of a unit task each pipeline chunk moves;
 *   - pack descriptors (xm_packdesc.h) built for a sub-box inside a block;
 *   - the per-rank step program of pipelined chains (paper 002 section 3.1:
 *     a unit task is broadcast along a chain, chunk c leaving position i at
 *     step c + i), with partial sums reduced along the source part of the
 *     chain (the schedule's routes, scheduler/xm_sched.h);
 *   - communicator-cache keys: one NCCL communicator per set of ranks (the
 *     union of a plan's two meshes), shared by all plans over that pair;
 *   - f16/bf16 <-> f32 conversions and CPU reference pack/unpack/reduce.
 */
#ifndef XM_DEVPLAN_H
#define XM_DEVPLAN_H

#include "xm_core.h"
#include "xm_packdesc.h"
#include "xm_sched.h"

/* ----------------------------------------------------------- chunk plans */

/* A box cut into chunks of at most chunk_bytes (at least one element):
 * dims before split_dim are walked one index at a time, split_dim in runs
 * of `step` indices, later dims whole. Chunks are disjoint, cover the box,
 * and are numbered in row-major order of their origins. */
typedef struct xm_chunkplan {
    int ndim;
    xm_box_t box;
    int split_dim;   /* -1 for a 0-d box */
    int64_t step;    /* indices of split_dim per chunk */
    int64_t nsplit;  /* ceil(extent[split_dim] / step) */
    int64_t nchunks; /* 0 for an empty box */
} xm_chunkplan_t;

void xm_chunkplan_make(const xm_box_t *box, int ndim, size_t elem_size, int64_t chunk_bytes,
                       xm_chunkplan_t *out);
/* Sub-box of chunk c (0 <= c < nchunks). */
void xm_chunkplan_chunk(const xm_chunkplan_t *p, int64_t c, xm_box_t *out);

/* ----------------------------------------------------- pack descriptors */

/* Descriptor of `box` inside the dense row-major block [blk_lo, blk_hi).
 * The box must lie inside the block. Dims of extent 1 are dropped and
 * adjacent dims that are contiguous in the block are merged, so a slab of
 * whole rows becomes one contiguous run. */
void xm_packdesc_make(int ndim, const int64_t *blk_lo, const int64_t *blk_hi, const xm_box_t *box,
                      xm_packdesc_t *out);

/* ------------------------------------------------------- step programs */

/* Chains: position i >= 1 receives chunk s - i + 1 at step s, position
 * i < len - 1 sends chunk s - i. Returns -1 when there is none. */
static inline int64_t xm_chain_recv_chunk(int i, int64_t s, int64_t nchunks)
{
    int64_t c = s - i + 1;
    return i >= 1 && c >= 0 && c < nchunks ? c : -1;
}
static inline int64_t xm_chain_send_chunk(int i, int len, int64_t s, int64_t nchunks)
{
    int64_t c = s - i;
    return i < len - 1 && c >= 0 && c < nchunks ? c : -1;
}
/* Steps a chain of len positions needs for nchunks chunks. */
static inline int64_t xm_chain_nsteps(int len, int64_t nchunks)
{
    if (nchunks <= 0)
        return 0;
    return len <= 1 ? 1 : nchunks + len - 2;
}

typedef enum {
    XM_OP_COPY = 0,   /* src block box -> dst block box (self copy, len-1 route) */
    XM_OP_PACK = 1,   /* src block chunk -> slot (converted to f32 when acc) */
    XM_OP_SEND = 2,   /* slot -> peer */
    XM_OP_RECV = 3,   /* peer -> slot */
    XM_OP_REDUCE = 4, /* slot (+)= src block chunk; converts to out_slot when convert_out */
    XM_OP_UNPACK = 5  /* slot -> dst block chunk */
} xm_opkind_t;

/* Phases of one step: 0 before the NCCL group (packing), 1 inside
 * ncclGroupStart/End (sends and receives), 2 after it (reduce, unpack). */
typedef struct xm_op {
    int kind;
    int phase;
    int peer;            /* SEND/RECV: context rank */
    int slot;            /* staging slot */
    int out_slot;        /* REDUCE with convert_out */
    int acc;             /* slot holds accumulator elements (f32 for f16/bf16) */
    int convert_out;     /* REDUCE: out_slot[k] = dtype(slot[k] + src) */
    int from_dst;        /* PACK: read the destination block (all-gather ring head) */
    int64_t count;       /* elements */
    xm_packdesc_t desc;  /* PACK/REDUCE: chunk in src block (dst block for a ring head);
                            UNPACK: chunk in dst block; COPY: source side */
    xm_packdesc_t desc2; /* COPY: destination side */
} xm_op_t;

/* A chain as the executor runs it ("virtual route"). For broadcast and
 * send/recv these are the schedule's routes, whole boxes chunked into
 * sub-boxes. For the all-gather strategies (paper 002 section 3.1, the Alpa
 * baseline and its global variant) they are derived from the schedule's
 * senders, the same way as the MPI executor does: the k receivers of a
 * group (one host, or all receivers) each get part j = [V j / k,
 * V (j + 1) / k) of the box's row-major elements (stage 0: from itself
 * when it holds the box, else from a holder on its host, else from the
 * scheduled sender(s), through the partial-sum chain with P), then every
 * part travels the ring R[j] -> R[j + 1] -> ... -> R[j - 1] (stage 1; its
 * head reads the part from its destination block). Stage-1 chains start
 * at step step0 = the most steps any stage-0 chain of the task needs, so
 * a part is complete on its ring head before the ring uses it. */
typedef struct xm_vroute {
    int task;
    int nsrc, len, off; /* devices at devs[off ..], sources first */
    int whole;          /* the whole box, chunked in sub-boxes; else a linear range */
    int from_dst;       /* the head reads its destination block */
    int64_t first, count;
    int64_t step0; /* first step of this chain within its task */
} xm_vroute_t;

typedef struct xm_vroutes {
    int n;
    xm_vroute_t *r; /* grouped by task, stage 0 before stage 1 */
    int *devs;
    int *task_off; /* ntasks + 1 */
} xm_vroutes_t;

/* Builds the chains of a schedule for a strategy; hosts: the plan's host
 * map (all-gather groups are per host). On error *out is untouched. */
xmesh_result_t xm_vroutes_build(const xm_taskset_t *ts, const xm_schedule_t *s,
                                const xm_hostmap_t *hosts, xmesh_strategy_t strategy,
                                int64_t chunk_bytes, xm_vroutes_t *out);
void xm_vroutes_free(xm_vroutes_t *v);
/* Chunks of a chain, and the region of chunk c: a box plus a linear range
 * [first, first + count) of its row-major elements. */
int64_t xm_vroute_nchunks(const xm_vroute_t *v, const xm_taskset_t *ts, int64_t chunk_bytes);
void xm_vroute_chunk(const xm_vroute_t *v, const xm_taskset_t *ts, int64_t chunk_bytes, int64_t c,
                     xm_box_t *box, int64_t *first, int64_t *count);

typedef struct xm_devpart {
    int route; /* index into the program's vroutes */
    int pos;   /* position of this rank in the chain */
} xm_devpart_t;

/* What one rank does in one plan. Built once per plan; steps are generated
 * on the fly (a plan may have millions of chunk steps). */
typedef struct xm_devprog {
    int rank;
    xmesh_dtype_t dtype;
    size_t elem_size;
    size_t acc_size; /* f32 for f16/bf16 partial sums, else elem_size */
    int64_t chunk_bytes;
    int ndim;
    int holds_src, holds_dst;
    int64_t src_lo[XM_MAX_DIMS], src_hi[XM_MAX_DIMS];
    int64_t dst_lo[XM_MAX_DIMS], dst_hi[XM_MAX_DIMS];
    xm_vroutes_t vr; /* every chain of the plan (same on every rank) */
    int ntasks;      /* tasks this rank takes part in, in schedule order */
    int *task;       /* ntasks task ids */
    int *part_off;   /* ntasks + 1 */
    xm_devpart_t *parts;
    int max_parts;      /* most parts of one task: 4 slots per part */
    int64_t slot_elems; /* largest chunk, elements */
    int64_t slot_bytes; /* slot_elems * max(elem_size, acc_size) */
    int nslots;         /* 4 * max_parts */
    int *peers;         /* distinct peers, sorted (npeers entries) */
    int npeers;
} xm_devprog_t;

/* Accumulator element size of a dtype for partial sums. */

/* Builds rank's program. src/dst are the plan's layouts, ts/s its tasks and
 * schedule, hosts its host map. On error *out is untouched. */
xmesh_result_t xm_devprog_build(const xm_layout_t *src, const xm_layout_t *dst,
                                const xm_taskset_t *ts, const xm_schedule_t *s,
                                const xm_hostmap_t *hosts, xmesh_strategy_t strategy,
                                xmesh_dtype_t dtype, int64_t chunk_bytes, int rank,
                                xm_devprog_t *out);
void xm_devprog_free(xm_devprog_t *p);
/* Steps of the rank's i-th task (max over its parts of step0 + chain steps). */
int64_t xm_devprog_nsteps(const xm_devprog_t *p, const xm_taskset_t *ts, int i);
/* Most ops one step can produce: ops arrays of this size never overflow. */
static inline int xm_devprog_max_ops(const xm_devprog_t *p)
{
    return 4 * (p->max_parts > 0 ? p->max_parts : 1);
}
/* Ops of step `step` of the rank's i-th task, phase order (0, 1, 2), into
 * ops[0 .. return). */
int xm_devprog_step(const xm_devprog_t *p, const xm_taskset_t *ts, int i, int64_t step,
                    xm_op_t *ops);

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
