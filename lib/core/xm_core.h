/*
 * Private core types of xmesh: sharding specs, block math, unit tasks.
 * Pure C over plain data: no MPI, no CUDA. Never installed.
 *
 * Terms (paper 002, section 2.2 and Appendix B):
 *   device  = a rank of the context (an integer id); meshes list devices.
 *   host    = the machine a device sits on (one NIC or a few).
 *   spec    = per tensor dim, the mesh axes that split it (major first), plus
 *             the mesh axes over which values are partial sums (SBP "P").
 *   unit task = one box of the global tensor whose holders (source devices,
 *             grouped into partial groups) and receivers (destination
 *             devices) are each constant over the box.
 */
#ifndef XM_CORE_H
#define XM_CORE_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "xmesh.h"

#if defined(__linux__)
#include <sys/mman.h>
#endif

#define XM_MAX_DIMS XMESH_MAX_TENSOR_DIMS
#define XM_MAX_MESH_DIMS XMESH_MAX_MESH_DIMS

/* ---------------------------------------------------------------- memory */

/* Hint for a big array (n bytes at p) about to be written: asks Linux for
 * transparent huge pages on its 2 MiB-aligned interior, so that the first
 * touches fault 2 MiB at a time instead of 4 KiB. Planning at 1,024
 * devices writes ~100 MB of fresh per-task arrays, and before this hint
 * spent ~29,000 page faults on them (issue 13 item 4). Only a hint: the
 * contents are unchanged, and it does nothing below 4 MiB, off Linux, or
 * where THP is disabled. */
static inline void xm_hint_huge(void *p, size_t n)
{
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    const uintptr_t huge = (uintptr_t)1 << 21;
    if (!p || n < 2 * huge)
        return;
    uintptr_t lo = ((uintptr_t)p + huge - 1) & ~(huge - 1);
    uintptr_t hi = ((uintptr_t)p + n) & ~(huge - 1);
    if (hi > lo)
        (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
#else
    (void)p;
    (void)n;
#endif
}

/* ---------------------------------------------------------------- errors */

/* Records a formatted message as this thread's last error (prefixed with
 * nothing; file:line goes to the XMESH_DEBUG=INFO log) and returns r. An
 * argument may be the last error itself (XM_ERR(r, "ctx: %s",
 * xmesh_last_error()) is safe): the message is formatted before it replaces
 * the old one. */
xmesh_result_t xm_error_at(const char *file, int line, xmesh_result_t r, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define XM_ERR(r, ...) xm_error_at(__FILE__, __LINE__, (r), __VA_ARGS__)
void xm_error_clear(void);
/* This thread's last-error buffer (1024 bytes), to save and restore it. */
char *xm_error_buffer(void);

/* Logging: XMESH_DEBUG=WARN|INFO|TRACE (default: errors are only recorded). */
enum { XM_LOG_NONE = 0, XM_LOG_WARN = 1, XM_LOG_INFO = 2, XM_LOG_TRACE = 3 };
int xm_log_level(void);
void xm_log_at(int level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define XM_LOG(level, ...)                                                                         \
    do {                                                                                           \
        if (xm_log_level() >= (level))                                                             \
            xm_log_at((level), __FILE__, __LINE__, __VA_ARGS__);                                   \
    } while (0)
#define XM_WARN(...) XM_LOG(XM_LOG_WARN, __VA_ARGS__)
#define XM_INFO(...) XM_LOG(XM_LOG_INFO, __VA_ARGS__)
#define XM_TRACE(...) XM_LOG(XM_LOG_TRACE, __VA_ARGS__)

/* ------------------------------------------------------------ parameters */

/* Every XMESH_* environment parameter is declared once in lib/core/param.c
 * with its default and help line; xmesh-info prints the table. Typed ones
 * (integers, byte sizes with K/M/G binary suffixes, reals) are validated: a
 * value that does not parse or is out of range is refused with one warning
 * on stderr naming the variable, the value and the default used instead
 * (the value never is an error and never silently truncated: "256K" is
 * 262144, "256X" is refused). The first lookup also warns once about every
 * XMESH_* variable of the environment that is not a parameter (misspelt),
 * except names that belong to scripts and tests (XMESH_TEST_*, XMESH_BENCH*,
 * ...). */
typedef struct {
    const char *name;  /* "XMESH_CHUNK_BYTES" */
    const char *deflt; /* default as text */
    const char *help;  /* one line */
} xm_param_desc_t;
int xm_param_count(void);
const xm_param_desc_t *xm_param_get(int i);
/* Row index of a declared parameter, -1 if name is not one. */
int xm_param_find(const char *name);
/* "string", "integer", "bytes" or "real". */
const char *xm_param_kind_name(const char *name);

/* Typed, cached accessors (in the manner of NCCL_PARAM): the environment is
 * read and validated at the first call, then the value is fixed for the
 * life of the process (xm_param_reset forgets it, for tests); a value taken
 * from the environment is logged at XMESH_DEBUG=INFO. Strings return the
 * default when unset or empty. */
const char *xm_param_strategy(void);  /* XMESH_STRATEGY */
const char *xm_param_scheduler(void); /* XMESH_SCHEDULER */
/* XMESH_CHUNK_BYTES, SEND_AHEAD, FORWARD_AHEAD: >= 1, 0 (auto) resolved by
 * XMESH_SYNC_SEND (param.c); chunk_bytes_for(0) is a backend other than the
 * MPI executor's (256 KiB auto), chunk_bytes() = chunk_bytes_for(1). */
int64_t xm_param_chunk_bytes(void);
int64_t xm_param_chunk_bytes_for(int mpi);
int64_t xm_param_send_ahead(void);
int64_t xm_param_forward_ahead(void);
int64_t xm_param_sync_send(void); /* XMESH_SYNC_SEND, 0 or 1 */
/* A synchronous chunk just below Open MPI's TCP eager limit (64 KiB with
 * the match header): it leaves whole, in one fragment. */
#define XM_SYNC_CHUNK_BYTES 65408
int64_t xm_param_budget_us(void);        /* XMESH_BUDGET_US, >= 0 */
int64_t xm_param_seed(void);             /* XMESH_SEED */
double xm_param_timeout_s(void);         /* XMESH_TIMEOUT_S, >= 0 */
double xm_param_nic_gbps(void);          /* XMESH_NIC_GBPS, > 0 */
int64_t xm_param_nics_per_host(void);    /* XMESH_NICS_PER_HOST, >= 1 */
double xm_param_intra_gbps(void);        /* XMESH_INTRA_GBPS, > 0 */
double xm_param_latency_us(void);        /* XMESH_LATENCY_US, >= 0 */
const char *xm_param_cluster_file(void); /* XMESH_CLUSTER_FILE */
const char *xm_param_topo_xml(void);     /* XMESH_TOPO_XML */
int64_t xm_param_nccl_max_comms(void);   /* XMESH_NCCL_MAX_COMMS, >= 1 */
/* The named parameter has a valid value from the environment. */
int xm_param_is_set(const char *name);
void xm_param_reset(void);

/* Lookups by name (older call sites; lib/mpi, lib/cuda, tools): the value
 * of the environment or the default, re-read at each call (so tests may
 * change XMESH_CHECK between plans), validated like the typed accessors
 * when the name is declared. */
const char *xm_param_str(const char *name);
int64_t xm_param_i64(const char *name);
double xm_param_double(const char *name);

/* Parses a decimal integer (bytes = 1: with an optional binary suffix K, M,
 * G, or KiB, MiB, GiB) into *out; INVALID_ARGUMENT naming s if it does not
 * parse or overflows 64 bits, *out untouched. */
xmesh_result_t xm_param_parse_int(const char *s, int bytes, int64_t *out);
/* Warns on f (if not NULL) about every XMESH_* environment variable that is
 * neither a parameter nor a script/test variable; returns how many. */
int xm_param_check_env(FILE *f);
/* The name belongs to scripts/tests (XMESH_TEST_*, XMESH_BENCH*, ...). */
int xm_param_is_foreign(const char *name);

/* ----------------------------------------------------------------- specs */

typedef struct xm_spec {
    int ndim;                                /* tensor dims */
    int mesh_ndim;                           /* mesh dims */
    int naxes[XM_MAX_DIMS];                  /* number of mesh axes splitting dim d */
    int axes[XM_MAX_DIMS][XM_MAX_MESH_DIMS]; /* those axes, major first */
    unsigned partial_mask;                   /* bit a set: values partial over mesh axis a */
} xm_spec_t;

/* Parses a sharding string for a tensor of `ndim` dims on a mesh of
 * `mesh_ndim` dims. Notation is detected: SBP if the string contains '(',
 * 'B' or 'P'; GSPMD otherwise ("R", "S0RR", "S01,R,R", "RS1R"). An empty
 * string is the 0-d GSPMD spec. On error: INVALID_ARGUMENT with a message
 * naming the token and value, *out untouched. */
xmesh_result_t xm_spec_parse(const char *s, int ndim, int mesh_ndim, xm_spec_t *out);
/* Prints in GSPMD notation ("S01RR"; P axes as a suffix "+P1": not GSPMD
 * proper) or SBP notation ("S(0),S(0),B"). Returns the length that the full
 * string needs (like snprintf). SBP cannot express a dim split by axes in
 * non-ascending order: then it returns -1. */
int xm_spec_format_gspmd(const xm_spec_t *spec, char *buf, size_t len);
int xm_spec_format_sbp(const xm_spec_t *spec, char *buf, size_t len);
/* Same meaning (both parsed into canonical form). */
int xm_spec_equal(const xm_spec_t *a, const xm_spec_t *b);

/* numpy.array_split rule: the first n % k parts get one extra element. */
static inline void xm_split(int64_t n, int64_t k, int64_t idx, int64_t *lo, int64_t *hi)
{
    int64_t base = n / k, rem = n % k;
    *lo = idx * base + (idx < rem ? idx : rem);
    *hi = *lo + base + (idx < rem ? 1 : 0);
}

/* torch.chunk rule (XMESH_SPLIT_TORCH): parts of c = ceil(n / k) elements,
 * part idx is [min(idx c, n), min((idx + 1) c, n)): trailing parts may be
 * short or empty. */
static inline void xm_split_torch(int64_t n, int64_t k, int64_t idx, int64_t *lo, int64_t *hi)
{
    int64_t c = n / k + (n % k != 0);
    *lo = idx * c < n ? idx * c : n;
    *hi = *lo + c < n ? *lo + c : n;
}

/* Accumulator element size of partial sums: f32 for f16/bf16, else the
 * element size (0 for an unknown dtype). */
size_t xm_dtype_acc_size(xmesh_dtype_t dtype);
/* IEEE 754 binary16 and bfloat16 <-> binary32, round to nearest even; NaN
 * stays NaN, overflow goes to infinity. */
float xm_f16_to_f32(uint16_t h);
uint16_t xm_f32_to_f16(float f);
float xm_bf16_to_f32(uint16_t h);
uint16_t xm_f32_to_bf16(float f);

/* Dtype of the running sum of partial values: f32 for f16/bf16/f32, f64 for
 * f64, the dtype itself for the integers. */
xmesh_dtype_t xm_dtype_acc(xmesh_dtype_t dtype);
/* 1 if a plan may move `src`-typed values into a `dst`-typed layout: equal
 * dtypes, or two different ones among f16, bf16 and f32 (docs/DTYPES.md). */
int xm_dtype_pair_ok(xmesh_dtype_t src, xmesh_dtype_t dst);
/* Converts n elements of dtype `from` at in to dtype `to` at out (equal
 * dtypes: a copy). Widening (f16/bf16 -> f32) is exact; narrowing rounds to
 * nearest even, keeps NaN a NaN of the same sign and signed zeros and
 * infinities, sends what overflows to infinity and produces subnormals
 * where the target has them; f16 <-> bf16 goes through f32 (exact), so it
 * rounds once. Only the pairs xm_dtype_pair_ok accepts (and acc <-> native
 * of xm_dtype_acc) are defined. out may equal in (in place, either
 * direction); other overlaps are not allowed. The one converter of the
 * library: accumulation, pack/unpack conversion and the tests use it. */
void xm_convert(xmesh_dtype_t to, void *out, xmesh_dtype_t from, const void *in, int64_t n);
/* Dtype of a chain's messages outside the partial-sum hops (which carry
 * xm_dtype_acc(src)): every unit task converts once, on the sender when
 * the destination dtype is narrower (fewer bytes on the wire), else on the
 * receiver. Partial sums travel in the destination dtype (summed in the
 * accumulator, converted once). `from_dst`: an all-gather ring, whose head
 * reads its destination block, so equal widths travel as dst. */
xmesh_dtype_t xm_wire_dtype(xmesh_dtype_t src, xmesh_dtype_t dst, int partial, int from_dst);

/* ---------------------------------------------------------------- layout */

/* A mesh as plain data: devices row-major, `devs` points to ndev ids. */
typedef struct xm_meshdesc {
    int ndim;
    int shape[XM_MAX_MESH_DIMS];
    int ndev;
    const int *devs;
} xm_meshdesc_t;

typedef struct xm_layout {
    int ndim;
    int64_t shape[XM_MAX_DIMS];
    size_t elem_size;
    xm_meshdesc_t mesh;
    xm_spec_t spec;
    int split; /* xmesh_split_t: how a dim is cut into shards (0: numpy) */
} xm_layout_t;

/* Checks a mesh (ndim range, shape > 0, ids >= 0 and < ndev_limit when
 * ndev_limit > 0, ids distinct). */
xmesh_result_t xm_meshdesc_check(const xm_meshdesc_t *m, int ndev_limit);
/* Mesh coordinate of the device at row-major index i. */
void xm_mesh_coord(const xm_meshdesc_t *m, int i, int coord[XM_MAX_MESH_DIMS]);
/* Index of device id `dev` in the mesh, -1 if absent. */
int xm_mesh_find(const xm_meshdesc_t *m, int dev);
/* Number of shards of tensor dim d under the spec. */
int64_t xm_layout_nshards(const xm_layout_t *l, int d);
/* Shard index of tensor dim d for a device at mesh coordinate coord. */
int64_t xm_layout_shard_index(const xm_layout_t *l, int d, const int coord[XM_MAX_MESH_DIMS]);
/* Extent [lo, hi) of shard idx (0 <= idx < xm_layout_nshards) of tensor
 * dim d, by the layout's split rule. Shards lie in index order along the
 * dim under both rules. */
void xm_layout_dim_block(const xm_layout_t *l, int d, int64_t idx, int64_t *lo, int64_t *hi);
/* Index of the (non-empty) shard of tensor dim d that holds position pos,
 * 0 <= pos < shape[d]. */
int64_t xm_layout_shard_at(const xm_layout_t *l, int d, int64_t pos);
/* Block [lo, hi) of the device at mesh index i. */
void xm_layout_block(const xm_layout_t *l, int i, int64_t *lo, int64_t *hi);
/* Number of elements of that block. */
int64_t xm_layout_block_volume(const xm_layout_t *l, int i);

/* ----------------------------------------------------------- unit tasks */

typedef struct xm_box {
    int64_t lo[XM_MAX_DIMS];
    int64_t hi[XM_MAX_DIMS];
} xm_box_t;

static inline int64_t xm_box_volume(const xm_box_t *b, int ndim)
{
    int64_t v = 1;
    for (int d = 0; d < ndim; d++)
        v *= b->hi[d] - b->lo[d];
    return v;
}

typedef struct xm_task {
    xm_box_t box;
    int64_t bytes; /* volume * the taskset's (wire) elem_size */
    /* Holders: ngroups partial groups of group_size replica devices each,
     * stored consecutively at ts->holders[holder_off ...]. Without P,
     * ngroups == 1. The destination needs the sum over groups. */
    int ngroups;
    int group_size;
    int holder_off;
    /* Receivers: nrecv destination devices at ts->recvs[recv_off ...],
     * sorted by (host, device). */
    int nrecv;
    int recv_off;
    /* Plans of many tensors (xm_decompose_many): the tensor whose box this
     * is (0 in a one-tensor set). A packed task (npack > 0) carries the
     * boxes ts->pieces[pack_off .. pack_off + npack) of several small unit
     * tasks with the same holders and receivers, laid end to end: its box is
     * then the 1-D range [0, elements of all pieces), and tensor is -1. */
    int tensor;
    int npack;
    int pack_off;
} xm_task_t;

/* Device -> host map, the only thing the decomposer knows of the cluster. */
typedef struct xm_hostmap {
    int ndev;
    int nhosts;
    int *host_of; /* ndev entries in [0, nhosts) */
} xm_hostmap_t;

/* One box of a packed task: box of tensor `tensor`, whose box-linear
 * elements are elements [off, off + n) of the packed task's range. */
typedef struct xm_piece {
    int tensor;
    xm_box_t box;
    int64_t off, n;
} xm_piece_t;

/* What the task set knows of each tensor of a union. */
typedef struct xm_tmeta {
    int ndim;
    size_t elem_size; /* wire element size (xm_wire_dtype) */
} xm_tmeta_t;

typedef struct xm_taskset {
    int ndim;
    int64_t shape[XM_MAX_DIMS];
    size_t elem_size; /* bytes of one element on the wire (xm_wire_dtype) */
    int ntasks;
    xm_task_t *tasks;
    int *holders;
    int *recvs;
    int64_t bytes_total;      /* bytes of the whole tensor (source element size) */
    int64_t bytes_cross_host; /* sum over tasks of bytes x receiver hosts holding no replica */
    /* A union of tensors (xm_decompose_many): ntensors > 0 entries in
     * tmeta; ndim/shape above are tensor 0's and elem_size the smallest
     * wire element size. ntensors == 0: one tensor, described above. */
    int ntensors;
    xm_tmeta_t *tmeta;
    int npieces; /* pieces of the packed tasks */
    xm_piece_t *pieces;
} xm_taskset_t;

/* Dims of task t's box: 1 for a packed task, else its tensor's. */
static inline int xm_task_ndim(const xm_taskset_t *ts, const xm_task_t *t)
{
    if (t->npack)
        return 1;
    return ts->tmeta ? ts->tmeta[t->tensor].ndim : ts->ndim;
}

/* Wire element size of task t (a packed task's pieces share one). */
static inline size_t xm_task_es(const xm_taskset_t *ts, const xm_task_t *t)
{
    if (!ts->tmeta)
        return ts->elem_size;
    int k = t->npack ? ts->pieces[t->pack_off].tensor : t->tensor;
    return ts->tmeta[k].elem_size;
}

/* Decomposes a resharding (paper Appendix B.2): the cut points of both
 * specs split every dim; each non-empty box becomes one task. Boxes whose
 * receiver set is empty are dropped. Tasks are ordered row-major over the
 * box grid. src and dst must have the same ndim and shape; their
 * elem_size may differ (a converting plan: tasks count the bytes on the
 * wire, ts->elem_size, see xm_wire_dtype; the caller checks the dtypes).
 * hosts may be NULL (then bytes_cross_host counts every receiver device
 * that holds no replica as its own host). On error *out is untouched. */
xmesh_result_t xm_decompose(const xm_layout_t *src, const xm_layout_t *dst,
                            const xm_hostmap_t *hosts, xm_taskset_t *out);
void xm_taskset_free(xm_taskset_t *ts);

/* Plans of many tensors: one task set for n reshardings (paper 002
 * Appendix B.2 applied to each pair), every task tagged with its tensor,
 * holders and receivers in one device space (hosts). src[i]/dst[i] as for
 * xm_decompose (tensor i's wire element size follows from their element
 * sizes, tmeta[i].elem_size); pack_key[i] (may be NULL: all equal) a value that must be equal for
 * two tensors' tasks to share a packed task (the plan uses the dtype pair: every piece then takes
 * the same ops). Unit tasks of at most pack_max bytes, without partial sums, with the same holder
 * set and the same receivers are packed, in tensor then task order, into packed tasks of at most
 * pack_limit bytes (pack_max <= 0: no packing). Tasks are ordered tensor by tensor, each tensor's
 * unpacked tasks as xm_decompose orders them, then the packed tasks. An error names the tensor
 * index; *out is untouched then. */
xmesh_result_t xm_decompose_many(int n, const xm_layout_t *src, const xm_layout_t *dst,
                                 const int *pack_key, const xm_hostmap_t *hosts, int64_t pack_max,
                                 int64_t pack_limit, xm_taskset_t *out);
/* Byte size of a dense tensor (0 if a dim is 0) into *bytes (may be NULL).
 * INVALID_ARGUMENT naming the shape if a dim is negative or elem_size times
 * the product of the dims (zero dims counted as 1, so that no partial
 * product of extents can overflow either) does not fit in int64_t; *bytes
 * untouched then. */
xmesh_result_t xm_shape_bytes(int ndim, const int64_t *shape, size_t elem_size, int64_t *bytes);

/* Default host map for planning without MPI: devices 0..|A|-1 are the source
 * mesh, |A|..|A|+|B|-1 the destination mesh (or the same ids when
 * `overlap`); mesh axis 0 enumerates hosts, source hosts first. */
xmesh_result_t xm_hostmap_default(const int *src_shape, int src_ndim, const int *dst_shape,
                                  int dst_ndim, int overlap, xm_hostmap_t *out, int **src_devs,
                                  int **dst_devs);
void xm_hostmap_free(xm_hostmap_t *h);

/* 64-bit FNV-1a, used to compare plan inputs across ranks. */
uint64_t xm_hash64(uint64_t h, const void *data, size_t len);
#define XM_HASH_INIT 1469598103934665603ull

#endif /* XM_CORE_H */
