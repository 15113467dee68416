/*
 * The per-rank program: a plan compiled once, in the pure core, into what
 * one rank does, for every transport (docs/EXECUTOR.md, "The program").
 * No MPI or CUDA types; the MPI executor (lib/mpi) and the NCCL backend
 * (lib/cuda) run it, and tests/unit/test_program.c runs it for all ranks
 * of a plan on in-memory buffers.
 *
 * Layers:
 *   - chains (xm_chains_build): the plan's pipelined chains, identical on
 *     every rank. broadcast / sendrecv: the schedule's routes (scheduler/,
 *     a len-1 route becomes the self chain [d, d]); the all-gather
 *     baselines (paper 002 section 3.1): per group of k receivers (one
 *     host, or all), part j of the box's row-major elements reaches its
 *     receiver over a stage-0 chain, then travels the ring of the group
 *     (stage 1), which starts on its head once stage 0 delivered the part.
 *     Sources come first in a chain; values partial over P are summed
 *     along them (position i < nsrc adds its block).
 *   - steps (xm_program_build): the rank's segment of each chain it is on
 *     (a run of consecutive positions), in global task order, with its
 *     peers, hop ids (a hop is one link of a chain, numbered globally),
 *     box geometry in the rank's blocks, chunking and the ops every chunk
 *     goes through (xm_pop_t), plus the dependencies: a step may wait for
 *     another step of the rank (`after`), and a task waits for every
 *     earlier task of the rank that uses one of its link classes (slots).
 *   - geometry (geom.c): a box inside a dense row-major block, pack,
 *     unpack, accumulate, checksums.
 * A chunk of a step moves through its ops in order; chunk c of a hop is
 * the c-th message on that hop. Nothing here allocates staging or posts
 * anything: that is the backend's table of operations.
 */
#ifndef XM_PROGRAM_H
#define XM_PROGRAM_H

#include "xm_core.h"
#include "xm_sched.h"

/* ------------------------------------------------------------ geometry */

/* A box inside a dense row-major local block, with dims of extent 1 dropped
 * and dims that are contiguous in memory merged. Dims are inner first;
 * strides and base are in elements. */
typedef struct xm_geom {
    int n;
    int64_t ext[XM_MAX_DIMS];
    int64_t stride[XM_MAX_DIMS];
    int64_t base;
} xm_geom_t;

/* Geometry of box (global coordinates) inside the block [blo, bhi). */
void xm_geom_init(xm_geom_t *g, int ndim, const int64_t *blo, const int64_t *bhi,
                  const xm_box_t *box);
/* 1 if box-linear elements [a, a + c) are one contiguous run in memory;
 * then *off is the element offset of element a. */
int xm_geom_contig(const xm_geom_t *g, int64_t a, int64_t c, int64_t *off);

enum { XM_COPY_PACK, XM_COPY_UNPACK, XM_COPY_TO_ACC, XM_COPY_ADD_ACC };
/* Moves box-linear elements [a, a + c) between the block at `block` and the
 * contiguous buffer `buf`: PACK block -> buf, UNPACK buf -> block, TO_ACC
 * block -> buf converted to the accumulation type, ADD_ACC buf += block. */
void xm_geom_copy(int op, const xm_geom_t *g, xmesh_dtype_t dt, void *block, void *buf, int64_t a,
                  int64_t c);
/* Checksum of box-linear elements [a, a + c) in the block (c bytes of a
 * contiguous buffer when g is NULL), independent of how runs split. */
uint64_t xm_geom_hash(const xm_geom_t *g, const void *block, size_t es, int64_t a, int64_t c);
/* Copies box-linear elements [a, a + c) from one block to another. */
void xm_geom_copy2(const xm_geom_t *gs, const void *src, const xm_geom_t *gd, void *dst, size_t es,
                   int64_t a, int64_t c);
/* xm_geom_copy's PACK / UNPACK with a conversion (xm_convert): the block
 * holds bdt elements, buf fdt ones. Equal dtypes: xm_geom_copy. */
void xm_geom_copy_cv(int op, const xm_geom_t *g, xmesh_dtype_t bdt, xmesh_dtype_t fdt, void *block,
                     void *buf, int64_t a, int64_t c);
/* xm_geom_copy2 from an sdt block to a ddt block, converting. */
void xm_geom_copy2_cv(const xm_geom_t *gs, xmesh_dtype_t sdt, const void *src, const xm_geom_t *gd,
                      xmesh_dtype_t ddt, void *dst, int64_t a, int64_t c);
/* Converts n accumulated elements to the native type in place. */
void xm_acc_to_native(xmesh_dtype_t dt, void *buf, int64_t n);

/* -------------------------------------------------------------- chains */

typedef struct xm_chain {
    int task;
    int route;          /* schedule route index, -1 for all-gather chains */
    int nsrc, len, off; /* devices at devs[off ..], sources first */
    int from_dst;       /* the head is a receiver that reads its dst block (ring) */
    int whole;          /* the whole box (chunked in sub-boxes); else a linear range */
    int64_t r0, r1;     /* box-linear element range */
    int dep;            /* chain whose last position (this chain's head) must finish first, -1 */
    int hop0;           /* id of the chain's first hop; hops of one chain are consecutive */
    int nseg;           /* segments: runs of equal consecutive devices (nseg - 1 hops) */
    int64_t nchunks;
    int64_t round0; /* lockstep rounds (xm_rounds_next): the chain's first round */
} xm_chain_t;

typedef struct xm_chains {
    int n;
    xm_chain_t *c; /* grouped by task in schedule order */
    int *devs;
    int nhops;       /* hops of all chains */
    int64_t nrounds; /* lockstep rounds of the whole plan */
} xm_chains_t;

typedef struct xm_prog_in {
    const xm_taskset_t *ts;
    const xm_schedule_t *sched;
    const xm_hostmap_t *hosts;
    const xm_layout_t *src, *dst;
    xmesh_strategy_t strategy;
    xmesh_dtype_t dtype;     /* the source's */
    xmesh_dtype_t dst_dtype; /* the destination's: equal, or a pair xm_dtype_pair_ok accepts */
    int64_t chunk_bytes;
    /* NICs per host of the plan's cluster model (<= 0: 1): the range of the
     * steps' rails (xm_pstep_t.rail_in / rail_out). */
    int nics;
    /* Plans of many tensors: ntensors > 0 layouts and dtypes per tensor
     * (ts->ntensors of them; tasks name their tensor); src/dst/dtype/
     * dst_dtype above are then ignored. ntensors == 0: one tensor, above. */
    int ntensors;
    const xm_layout_t *srcs, *dsts;
    const xmesh_dtype_t *dtypes, *dst_dtypes;
} xm_prog_in_t;

/* Every chain of the plan, in global order (tasks in schedule order; empty
 * ranges dropped). Identical on every rank. On error *out is untouched. */
xmesh_result_t xm_chains_build(const xm_prog_in_t *in, xm_chains_t *out);
void xm_chains_free(xm_chains_t *c);

/* ----------------------------------------------------------------- ops */

/* What a chunk goes through on one step, in order. `buf` is the chunk's
 * staging buffer; it holds accumulator elements (xm_dtype_acc_size) when
 * the step is a partial-sum step (XM_MODE_GENERAL), else native ones.
 * Each op's `dt` names the dtype of the buffer elements it reads or
 * writes; the src block holds the program's dtype, the dst block its
 * dst_dtype, and an op whose dt differs from its block's converts
 * (xm_convert). With equal dtypes every dt is the dtype (or the
 * accumulator's), so a backend that moves one dtype may ignore dt. */
typedef enum {
    XM_POP_RECV,      /* buf <- message from prev (dt == in_dt: acc elements when in_acc) */
    XM_POP_PACK,      /* buf (dt) <- chunk of the src block (blk 0) or dst block (blk 1) */
    XM_POP_TO_ACC,    /* buf <- src chunk, converted to the accumulator type (dt) */
    XM_POP_ADD_ACC,   /* buf += src chunk */
    XM_POP_TO_NATIVE, /* buf: accumulator -> dt, in place */
    XM_POP_UNPACK,    /* dst chunk <- buf (dt) */
    XM_POP_COPY,      /* dst chunk <- src chunk (no buffer), converting src -> dst dtype */
    XM_POP_SEND       /* message to next <- buf (dt == out_dt: acc elements when out_acc) */
} xm_popkind_t;
#define XM_POPS_MAX 8

typedef struct xm_pop {
    unsigned char kind, blk, dt; /* dt: an xmesh_dtype_t */
} xm_pop_t;

/* How a step moves each chunk (what the backend may shortcut). */
enum {
    XM_MODE_SRC,      /* sole source: PACK src, SEND */
    XM_MODE_RECV,     /* receiver: RECV, UNPACK, SEND to forward */
    XM_MODE_FROM_DST, /* head of an all-gather ring: PACK dst, SEND */
    XM_MODE_SELF,     /* local copy src -> dst, no messages */
    XM_MODE_GENERAL   /* partial sums: accumulate, convert, unpack, send */
};

/* One box of a packed step (a packed task's piece, xm_piece_t): the
 * step's box-linear elements [off, off + n) are this box of tensor
 * `tensor`, at sg in its source block / dg in its destination block. */
typedef struct xm_ppiece {
    int tensor;
    int has_sg, has_dg;
    xm_geom_t sg, dg;
    int64_t off, n;
} xm_ppiece_t;

/* One rank's segment of one chain. */
typedef struct xm_pstep {
    int task, chain, route;
    /* Plans of many tensors: the tensor whose blocks the step reads and
     * writes (its geometry sg/dg), or -1 for a packed step, whose npieces
     * pieces are p->pieces[piece_off ..] (sg/dg unused). sdt/ddt: the
     * dtypes of its source and destination blocks (every piece's). */
    int tensor;
    int npieces, piece_off;
    xmesh_dtype_t sdt, ddt;
    int prev, next;      /* peer ranks, -1 for none */
    int hop_in, hop_out; /* hop ids from prev / to next, -1 for none */
    /* Rail (NIC index, the same on both hosts) of the hop from prev / to
     * next when it crosses hosts, else -1: the schedule's route_rails, or
     * without them (hand-built schedules, all-gather chains) the sender's
     * index on its host modulo the NICs. Equal at both ends of a hop; the
     * UCX runner sends and receives it on that rail's worker. */
    int rail_in, rail_out;
    int mode;
    int pos_first, pos_last, nsrc; /* chain positions covered; sources are < nsrc */
    int nic_paced;       /* a hop between hosts comes before pos_first in the chain: the step's
                            chunks arrive paced by a NIC (the MPI executor's forward window) */
    int late_next;       /* next is on another host and takes part in an earlier task on a link
                            class this one uses there: it admits this task only after that one,
                            so its receive may be posted late (the MPI executor sends one chunk
                            and waits for it to be matched before sending ahead) */
    int in_acc, out_acc; /* the hop carries accumulator elements */
    xmesh_dtype_t in_dt, out_dt; /* element dtype of the messages from prev / to next */
    size_t stage_es;             /* bytes of one staging element (0: no staging) */
    int after;                   /* step of this rank that must finish first, -1 */
    xm_geom_t sg, dg;            /* box in the src block / dst block */
    int has_sg, has_dg;
    /* Chunks: c -> row c / per_row, piece c % per_row of ce elements. */
    int64_t r0, row_elems, ce, per_row, nchunks;
    int64_t bytes; /* payload bytes of the chain's range in its wire dtype (xm_wire_dtype) */
    /* Lockstep rounds: chunk c is received in round rin + c and sent (or,
     * without messages, copied) in round rout + c (rout = rin + 1). */
    int seg;
    int64_t rin, rout;
    /* XMESH_CHECK roles: origin produces the final values (sole or last
     * source, ring head); verify receives them (receivers). */
    int ck_origin, ck_verify;
    int nops;
    xm_pop_t ops[XM_POPS_MAX];
} xm_pstep_t;

/* Link classes a task occupies on a rank: NIC send/receive (hops to other
 * hosts), local-link send/receive (hops inside the host), as the simulator
 * books them. */
#define XM_SLOT_SEND 1u
#define XM_SLOT_RECV 2u
#define XM_SLOT_LSEND 4u
#define XM_SLOT_LRECV 8u
#define XM_NSLOTS 4
#define XM_SLOT_ALL 15u

/* One task this rank takes part in, in global issue order. */
typedef struct xm_ptask {
    int task;
    int first_step, nsteps;
    unsigned slots; /* XM_SLOT_* */
} xm_ptask_t;

typedef struct xm_program {
    int rank;
    xmesh_dtype_t dtype;     /* the source block's (same as dst_dtype unless converting) */
    xmesh_dtype_t dst_dtype; /* the destination block's */
    size_t es, acc_es;       /* sizes of dtype and of its accumulator */
    size_t dst_es;           /* size of dst_dtype */
    int64_t chunk_elems;     /* most elements of one chunk */
    int nhops;               /* hop ids are < nhops */
    int nsteps;
    xm_pstep_t *steps;
    int ntasks;
    xm_ptask_t *tasks;
    int ntensors; /* tensors of the plan (>= 1) */
    int npieces;  /* pieces of the packed steps */
    xm_ppiece_t *pieces;
} xm_program_t;

/* The piece of packed step s that holds the step's box-linear element a
 * (0 <= a < the step's range end). A chunk [a, a + c) covers it and the
 * following pieces while their off < a + c; piece q's elements
 * [max(a, q->off), min(a + c, q->off + q->n)) are its own box-linear
 * elements minus q->off, and chunk elements minus a. */
static inline const xm_ppiece_t *xm_pstep_piece_first(const xm_program_t *p, const xm_pstep_t *s,
                                                      int64_t a)
{
    const xm_ppiece_t *pc = p->pieces + s->piece_off;
    int lo = 0, hi = s->npieces - 1; /* last piece with off <= a */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (pc[mid].off <= a)
            lo = mid;
        else
            hi = mid - 1;
    }
    return pc + lo;
}

/* Chunks of at most this many bytes keep every message count < 2^31. */
#define XM_MAX_CHUNK_BYTES (1ll << 28)

/* Compiles rank's program from the plan's chains. On error (a chain that
 * names this rank where its blocks do not hold the box: a broken schedule)
 * *out is untouched. */
xmesh_result_t xm_program_build(const xm_prog_in_t *in, const xm_chains_t *ch, int rank,
                                xm_program_t *out);
void xm_program_free(xm_program_t *p);

/* Box-linear range [*a, *a + *cnt) of chunk c of step s. */
static inline void xm_pstep_chunk(const xm_pstep_t *s, int64_t c, int64_t *a, int64_t *cnt)
{
    int64_t row = c / s->per_row, i = c % s->per_row;
    *a = s->r0 + row * s->row_elems + i * s->ce;
    *cnt = s->row_elems - i * s->ce < s->ce ? s->row_elems - i * s->ce : s->ce;
}

/* Staging pools. need[i]: units step i needs while its task is active (0:
 * none). At most one task per link class is active on a rank at a time (the
 * MPI executor's admission rule, and the lockstep round schedule), so a
 * task's steps go in the region of the lowest class it holds and each
 * region is as large as its largest task: off[i] gets step i's offset (-1
 * when need[i] is 0), *total the pool size; offsets are multiples of align.
 * INTERNAL error if a task without hops needs staging. */
xmesh_result_t xm_program_pool(const xm_program_t *p, const int64_t *need, int64_t align,
                               int64_t *off, int64_t *total);

/* ------------------------------------------------------ lockstep rounds */

/* For transports that move every message of a round together (NCCL
 * grouped send/recv): the plan is cut into global rounds, identical on every
 * rank. A task starts when every (rank, link class) its hops use is free
 * again (tasks in schedule order); an all-gather ring starts the round after
 * its stage-0 chain ended. In round t a step receives chunk t - rin and
 * sends chunk t - rout, so a chunk moves one hop per round and the chains
 * of a round run concurrently. A round's ops come in three phases: 0 before
 * the group (pack, reduce, unpack of what is sent now), 1 the group (RECV
 * and SEND, in step order: the sends from rank a to rank b of a round are
 * in the order of b's receives from a), 2 after it (what follows the last
 * receive). A chunk's staging slot is chunk % 2 of its step. */
typedef struct xm_rop {
    int step;
    unsigned char kind, blk, phase, slot, dt; /* kind, blk, dt: the step's xm_pop_t */
    int64_t chunk;
} xm_rop_t;

typedef struct xm_rounds_it {
    int *order; /* steps with chunks, by first round, then step index */
    int norder;
    int next; /* first step of order not yet active */
    int *active;
    int nactive;
    int64_t t; /* next round to look at */
    xm_rop_t *ops;
    int cap;
} xm_rounds_it_t;

xmesh_result_t xm_rounds_init(const xm_program_t *p, xm_rounds_it_t *it);
/* The rank's next round with work: *round, its ops in *ops (valid until the
 * next call), returns their count; 0 when the program is done, < 0 when out
 * of memory. */
int xm_rounds_next(const xm_program_t *p, xm_rounds_it_t *it, int64_t *round, const xm_rop_t **ops);
void xm_rounds_free(xm_rounds_it_t *it);

/* ------------------------------------------------- block ops (blockops.c) */

/* Shared by the runners (lib/mpi/exec.c, lib/ucx/exec.c): the part of a
 * step's ops that touches the caller's blocks. srcs/dsts hold the plan's
 * ntensors blocks of the reshard in flight (NULL where the rank holds
 * none). */

/* Bytes of one staging-buffer element of op o (which touches blocks). */
size_t xm_pop_buf_es(const xm_pstep_t *s, const xm_pop_t *o);

/* Op o (PACK, TO_ACC, ADD_ACC, UNPACK or COPY; others do nothing) of step s
 * over the step's box-linear elements [a, a + cnt), buf holding them in
 * order (NULL for COPY): on the step's tensor s->tensor, or piece by piece
 * for a packed step (s->npieces > 0: each piece a box of its own tensor at
 * its place in the chunk). Block dtypes are the step's s->sdt / s->ddt. */
void xm_step_block_op(const xm_program_t *p, const void *const *srcs, void *const *dsts,
                      const xm_pstep_t *s, const xm_pop_t *o, char *buf, int64_t a, int64_t cnt);

/* XMESH_CHECK's report: the global coordinates of element a of step s
 * ("i,j,..."), prefixed "tensor k: " for a packed step or when the plan has
 * ntensors > 1; at most len bytes with the NUL. */
void xm_step_where(const xm_program_t *p, const xm_taskset_t *ts, int ntensors, const xm_pstep_t *s,
                   int64_t a, char *at, size_t len);

/* Printable name of an op kind. */
const char *xm_pop_name(int kind);

#endif /* XM_PROGRAM_H */
