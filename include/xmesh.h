/*
 * xmesh: cross-mesh resharding of sharded tensors between device meshes.
 *
 * Plain C11. This header carries no MPI or CUDA types: contexts are created
 * through <xmesh/mpi.h> (host memory over Open MPI) or <xmesh/cuda.h>
 * (device memory over NCCL).
 *
 * Ownership and error contract, for every function below unless it says
 * otherwise:
 *   - a function returning an error leaves every handle and buffer passed to
 *     it exactly as it was and allocates nothing that outlives the call;
 *   - xmesh_last_error() then returns a thread-local message naming the bad
 *     value ("sharding 'S0S0R': mesh axis 0 used twice");
 *   - *_destroy(NULL) is a no-op returning XMESH_SUCCESS.
 */
#ifndef XMESH_H
#define XMESH_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* XMESH_VERSION_MAJOR/MINOR/PATCH/STRING and XMESH_HAVE_CUDA, generated. */
#include "xmesh/config.h"

#define XMESH_VERSION_CODE                                                                         \
    (XMESH_VERSION_MAJOR * 10000 + XMESH_VERSION_MINOR * 100 + XMESH_VERSION_PATCH)

/* Result codes. The numeric values are fixed forever. */
#define XMESH_RESULT_LIST(X)                                                                       \
    X(XMESH_SUCCESS, 0, "success")                                                                 \
    X(XMESH_IN_PROGRESS, 1, "operation in progress")                                               \
    X(XMESH_ERR_INVALID_ARGUMENT, -1, "invalid argument")                                          \
    X(XMESH_ERR_INVALID_USAGE, -2, "invalid usage")                                                \
    X(XMESH_ERR_UNSUPPORTED, -3, "unsupported")                                                    \
    X(XMESH_ERR_NO_MEMORY, -4, "out of memory")                                                    \
    X(XMESH_ERR_SYSTEM, -5, "system error")                                                        \
    X(XMESH_ERR_BACKEND, -6, "backend (MPI/NCCL/CUDA) error")                                      \
    X(XMESH_ERR_MISMATCH, -7, "ranks passed different arguments")                                  \
    X(XMESH_ERR_REMOTE, -8, "remote peer failed")                                                  \
    X(XMESH_ERR_TIMEOUT, -9, "timed out")                                                          \
    X(XMESH_ERR_INTERNAL, -10, "internal error")

typedef enum {
#define XMESH_RESULT_ENUM_(name, value, text) name = value,
    XMESH_RESULT_LIST(XMESH_RESULT_ENUM_)
#undef XMESH_RESULT_ENUM_
} xmesh_result_t;

/* Static string for a result code ("unknown result" for other values). */
const char *xmesh_result_string(xmesh_result_t r);
/* Detailed message of the last error raised on this thread ("" if none). */
const char *xmesh_last_error(void);
/* Library version as "MAJOR.MINOR.PATCH". */
const char *xmesh_version_string(void);

typedef enum {
    XMESH_U8 = 0,
    XMESH_I8 = 1,
    XMESH_I32 = 2,
    XMESH_I64 = 3,
    XMESH_F16 = 4,
    XMESH_BF16 = 5,
    XMESH_F32 = 6,
    XMESH_F64 = 7,
    XMESH_DTYPE_COUNT_ = 8
} xmesh_dtype_t;

/* Size in bytes of one element, 0 for an unknown dtype. */
size_t xmesh_dtype_size(xmesh_dtype_t dtype);
/* "u8", "i8", "i32", "i64", "f16", "bf16", "f32", "f64"; NULL for unknown. */
const char *xmesh_dtype_name(xmesh_dtype_t dtype);
/* Parses a dtype name (as above; also "int32", "float32", ...). */
xmesh_result_t xmesh_dtype_parse(const char *name, xmesh_dtype_t *out);

/* Converts n elements of dtype `from` at in to dtype `to` at out with the
 * rounding converting plans use (round to nearest even; NaN stays a NaN of
 * its sign; overflow to infinity; subnormals kept; widening exact;
 * docs/DTYPES.md). Pairs: equal dtypes (a copy), or two of f32, f16 and
 * bf16. out may equal in (in place); other overlaps are refused. Pure: no
 * context needed. E.g. a pipeline stage that receives bf16 boundary
 * activations through an f32 -> bf16 plan widens them for f32 compute.
 * Errors (nothing written): INVALID_ARGUMENT for another pair (naming both
 * dtypes), an unknown dtype, n < 0, a NULL buffer with n > 0, overlap. */
xmesh_result_t xmesh_convert(xmesh_dtype_t to, void *out, xmesh_dtype_t from, const void *in,
                             int64_t n);

typedef struct xmesh_ctx *xmesh_ctx_t;
typedef struct xmesh_mesh *xmesh_mesh_t;
typedef struct xmesh_plan *xmesh_plan_t;
typedef struct xmesh_request *xmesh_request_t;

#define XMESH_MAX_TENSOR_DIMS 8
#define XMESH_MAX_MESH_DIMS 4

/* Parameter structs carry size/magic/version so fields can be added later
 * without breaking callers. Initialise with the *_INITIALIZER macro: every
 * field starts "unset" and then takes the environment override (XMESH_*) or
 * the built-in default. */
#define XMESH_PARAMS_MAGIC 0x786d7368u /* "xmsh" */
#define XMESH_UNSET_INT (-2147483647 - 1)
#define XMESH_UNSET_I64 INT64_MIN
#define XMESH_UNSET_DOUBLE (-1.0)

struct xmesh_ctx_params {
    size_t size;
    unsigned magic;
    unsigned version;
    /* Host id of this rank; XMESH_UNSET_INT: from XMESH_HOST_ID or the
     * MPI shared-memory split. Lets tests pretend ranks sit on other hosts. */
    int host_id;
    /* Default timeout of blocking operations, seconds (XMESH_TIMEOUT_S). */
    double timeout_s;
};
typedef struct xmesh_ctx_params xmesh_ctx_params_t;
#define XMESH_CTX_PARAMS_INITIALIZER                                                               \
    {                                                                                              \
        sizeof(xmesh_ctx_params_t), XMESH_PARAMS_MAGIC, XMESH_VERSION_CODE, XMESH_UNSET_INT,       \
            XMESH_UNSET_DOUBLE                                                                     \
    }

/* How a plan moves data (paper section 3.1). */
typedef enum {
    XMESH_STRATEGY_UNSET = -1,
    XMESH_STRATEGY_BROADCAST = 0,          /* chunked pipelined chain per unit task */
    XMESH_STRATEGY_SENDRECV = 1,           /* one point-to-point per receiver device */
    XMESH_STRATEGY_SENDRECV_ALLGATHER = 2, /* 1/k per device, then intra-host all-gather (Alpa) */
    XMESH_STRATEGY_GLOBAL_ALLGATHER = 3,   /* 1/k per device, then all-gather over all receivers */
    XMESH_STRATEGY_COUNT_ = 4
} xmesh_strategy_t;

/* Which scheduler orders the unit tasks (paper section 3.2). */
typedef enum {
    XMESH_SCHEDULER_UNSET = -1,
    XMESH_SCHEDULER_NAIVE = 0,
    XMESH_SCHEDULER_LB = 1,
    XMESH_SCHEDULER_DFS = 2,
    XMESH_SCHEDULER_GREEDY = 3,
    XMESH_SCHEDULER_ENSEMBLE = 4,
    XMESH_SCHEDULER_COUNT_ = 5
} xmesh_scheduler_t;

const char *xmesh_strategy_name(xmesh_strategy_t s);
xmesh_result_t xmesh_strategy_parse(const char *name, xmesh_strategy_t *out);
const char *xmesh_scheduler_name(xmesh_scheduler_t s);
xmesh_result_t xmesh_scheduler_parse(const char *name, xmesh_scheduler_t *out);

struct xmesh_plan_params {
    size_t size;
    unsigned magic;
    unsigned version;
    xmesh_strategy_t strategy;   /* XMESH_STRATEGY */
    xmesh_scheduler_t scheduler; /* XMESH_SCHEDULER */
    int64_t chunk_bytes;         /* XMESH_CHUNK_BYTES */
    int64_t budget_us;           /* XMESH_BUDGET_US: scheduler time budget */
    int64_t seed;                /* XMESH_SEED */
    double timeout_s;            /* XMESH_TIMEOUT_S */
};
typedef struct xmesh_plan_params xmesh_plan_params_t;
#define XMESH_PLAN_PARAMS_INITIALIZER                                                              \
    {                                                                                              \
        sizeof(xmesh_plan_params_t), XMESH_PARAMS_MAGIC, XMESH_VERSION_CODE, XMESH_STRATEGY_UNSET, \
            XMESH_SCHEDULER_UNSET, XMESH_UNSET_I64, XMESH_UNSET_I64, XMESH_UNSET_I64,              \
            XMESH_UNSET_DOUBLE                                                                     \
    }

/* A mesh: ndim axes (1..XMESH_MAX_MESH_DIMS) of the given shape; ranks lists
 * prod(shape) distinct ranks of ctx, row-major. The mesh copies ranks. */
xmesh_result_t xmesh_mesh_create(xmesh_ctx_t ctx, int ndim, const int *shape, const int *ranks,
                                 xmesh_mesh_t *out);
/* Fails with INVALID_USAGE while a plan uses the mesh. */
xmesh_result_t xmesh_mesh_destroy(xmesh_mesh_t mesh);

/* How a dim of n elements is cut into k shards (the layout's `split`):
 *   XMESH_SPLIT_NUMPY  numpy.array_split: the first n % k shards get
 *                      n / k + 1 elements, the others n / k. Several mesh
 *                      axes splitting one dim cut it once into the product
 *                      of their sizes.
 *   XMESH_SPLIT_TORCH  torch.chunk as PyTorch's DTensor Shard(d) uses it:
 *                      shard i is [min(i c, n), min((i + 1) c, n)) with
 *                      c = ceil(n / k), so leading shards are full and
 *                      trailing ones may be short or empty. Several mesh
 *                      axes splitting one dim cut it one axis after the
 *                      other, major axis first (each axis chunks the piece
 *                      the previous one left), as DTensor's placements
 *                      [Shard(d), Shard(d)] do.
 * Both rules agree whenever every split dim divides evenly. */
typedef enum { XMESH_SPLIT_NUMPY = 0, XMESH_SPLIT_TORCH = 1 } xmesh_split_t;

typedef struct {
    int ndim;             /* tensor dims, 0..XMESH_MAX_TENSOR_DIMS */
    const int64_t *shape; /* ndim entries >= 0 (may be NULL when ndim == 0) */
    xmesh_dtype_t dtype;
    xmesh_mesh_t mesh;
    const char *sharding; /* GSPMD "S0RR", "S01,R,R" or SBP "S(0),B,P" */
    /* xmesh_split_t (an int, so that initializers of the five fields above
     * stay valid and mean XMESH_SPLIT_NUMPY). Another value:
     * INVALID_ARGUMENT naming it. Part of the layout ranks agree on. */
    int split;
} xmesh_layout_t;

/* Local block shape of `rank` (a ctx rank): shape[0..ndim-1] is written.
 * *holds = 0 (and shape zeroed) if rank is not in the layout's mesh. */
xmesh_result_t xmesh_layout_local_shape(const xmesh_layout_t *l, int rank, int64_t *shape,
                                        int *holds);
/* Global offset of the local block of `rank` (same contract as above). */
xmesh_result_t xmesh_layout_local_offset(const xmesh_layout_t *l, int rank, int64_t *offset,
                                         int *holds);

/* Collective over all ranks of ctx. params may be NULL (defaults, env
 * overrides). Ranks that pass different layouts get XMESH_ERR_MISMATCH.
 * Dtypes: src and dst have the same dtype, or two of f32, f16 and bf16 (a
 * converting plan: the source blocks hold src->dtype, the destination blocks
 * get dst->dtype, every value converted once, round to nearest even, NaN and
 * infinities kept, on the sender when dst is narrower, else on the
 * receiver; docs/DTYPES.md). Other pairs: INVALID_ARGUMENT naming both. The
 * NCCL backend refuses converting plans (UNSUPPORTED). */
xmesh_result_t xmesh_plan_create(xmesh_ctx_t ctx, const xmesh_layout_t *src,
                                 const xmesh_layout_t *dst, const xmesh_plan_params_t *params,
                                 xmesh_plan_t *out);
/* A plan of n tensors (n >= 1): tensor i goes from layout src[i] to dst[i]
 * with everything xmesh_plan_create allows for one (its own shape, dtype
 * pair, shardings and meshes: any meshes of ctx, different pairs per
 * tensor, overlapping or not). Collective over all ranks of ctx, like
 * xmesh_plan_create, which is this function with n = 1. The unit tasks of
 * all tensors are bounded and scheduled together as one task list; small
 * ones (at most one chunk) with the same holders and receivers travel
 * packed into shared chunks (up to XMESH_PACK_BYTES per packed task), so
 * a thousand small tensors cost about one tensor of their total size
 * (docs/MANY.md). Errors name the tensor index: INVALID_ARGUMENT for n <= 0,
 * a NULL array or a bad layout ("tensor 3: source layout: ..."); ranks that
 * pass a different n or a different layout get XMESH_ERR_MISMATCH ("tensor
 * 3: ..."; nothing is created on any rank). The MPI backend runs any such
 * plan; the NCCL backend refuses n > 1 (UNSUPPORTED). */
xmesh_result_t xmesh_plan_create_many(xmesh_ctx_t ctx, int n, const xmesh_layout_t *src,
                                      const xmesh_layout_t *dst, const xmesh_plan_params_t *params,
                                      xmesh_plan_t *out);
/* Collective over the ranks of both meshes; others may call and return at
 * once. src_local / dst_local: this rank's local block, dense row-major (NULL
 * where it holds none). dst_local must not alias src_local.
 *
 * Buffers, exactly:
 *   - invalid arguments (INVALID_ARGUMENT / INVALID_USAGE): nothing was
 *     queued or sent; both blocks are untouched;
 *   - success: dst_local holds the result; src_local was only read;
 *   - a transfer failure (TIMEOUT, REMOTE, BACKEND): the boxes of dst_local
 *     this rank receives hold undefined values (elements outside them are
 *     never written). Once the call returns, xmesh never reads src_local nor
 *     writes dst_local again: MPI only ever works on the plan's own staging
 *     memory; receives are cancelled, and MPI requests that cannot be
 *     cancelled (sends, matched receives) stay owned by the plan, which is
 *     retired (later starts: INVALID_USAGE). xmesh_plan_destroy releases them
 *     to MPI and deliberately leaks the staging/checksum memory they still
 *     reference. (Exception: XMESH_ZERO_COPY=1 lets MPI use the blocks
 *     directly; then a failed reshard's blocks must stay allocated until the
 *     process ends.) */
xmesh_result_t xmesh_reshard(xmesh_plan_t plan, const void *src_local, void *dst_local);
/* Starts the transfer and returns at once. The buffers belong to xmesh until
 * the request completes (same buffer contract as xmesh_reshard).
 * Progress: with MPI_THREAD_MULTIPLE a progress thread moves the data while
 * the caller computes; at lower thread levels (SINGLE, FUNNELED, SERIALIZED)
 * there is no thread and the data moves only inside xmesh_reshard_start,
 * xmesh_test and xmesh_wait, so a caller that wants overlap calls
 * xmesh_test now and then while it computes (with FUNNELED from the main
 * thread, with SERIALIZED never concurrently with another MPI call). */
xmesh_result_t xmesh_reshard_start(xmesh_plan_t plan, const void *src_local, void *dst_local,
                                   xmesh_request_t *req);
/* xmesh_reshard / xmesh_reshard_start for a plan of many tensors (any plan:
 * one of one takes arrays of one). src_locals[i] / dst_locals[i]: this
 * rank's block of tensor i, dense row-major, NULL where it holds none; the
 * arrays themselves are non-NULL (n entries) and are only read during the
 * call. Same buffer contract as xmesh_reshard, for every block: on an
 * invalid argument (a NULL array; a NULL block where the rank holds one;
 * a destination block that is also a source block or another tensor's
 * destination) nothing moved and the message names the tensor index; after
 * a transfer failure every destination block's received boxes are
 * undefined. xmesh_test / xmesh_wait complete the request. xmesh_reshard and
 * xmesh_reshard_start refuse a plan of more than one tensor (INVALID_USAGE). */
xmesh_result_t xmesh_reshard_many(xmesh_plan_t plan, const void *const *src_locals,
                                  void *const *dst_locals);
xmesh_result_t xmesh_reshard_many_start(xmesh_plan_t plan, const void *const *src_locals,
                                        void *const *dst_locals, xmesh_request_t *req);
/* Advances the transfer once without blocking (unless another thread is
 * doing so), then: SUCCESS (request released), IN_PROGRESS, or an error
 * (request released). */
xmesh_result_t xmesh_test(xmesh_request_t req);
/* Drives the transfer in the calling thread until the request completes
 * (the progress thread stands back meanwhile, so a blocking wait does not
 * depend on it getting a core); sleeps with back-off when nothing moves
 * instead of spinning. Releases the request. */
xmesh_result_t xmesh_wait(xmesh_request_t req);
/* Fails with INVALID_USAGE while a request of the plan is in flight. */
xmesh_result_t xmesh_plan_destroy(xmesh_plan_t plan);

/* Summary of a plan, the same on every rank. Plans of many tensors: sums
 * over the tensors, and the bound and prediction of the whole plan. */
typedef struct {
    int unit_tasks;      /* tasks of the plan: pieces when plan creation split them (XMESH_SPLIT);
                            a packed task counts as the unit tasks it carries */
    int64_t bytes_total; /* bytes of the tensors (in the source dtypes) */
    int64_t bytes_cross_host; /* bytes that must cross host NICs, summed over receiver hosts,
                                 in the dtype on the wire (converting plans: the narrower one;
                                 the destination's for partial sums) */
    double lower_bound_s;     /* model lower bound of the completion time */
    double predicted_s;       /* modelled completion time (the simulated makespan;
                                 the all-gather strategies: their own model) */
    xmesh_strategy_t strategy;
    xmesh_scheduler_t scheduler;
    int64_t chunk_bytes;
    int tensors;         /* tensors of the plan (1 for xmesh_plan_create) */
    int scheduled_tasks; /* tasks the scheduler ordered: a packed task counts once */
} xmesh_plan_info_t;
xmesh_result_t xmesh_plan_get_info(xmesh_plan_t plan, xmesh_plan_info_t *info);

/* Placement advice (pure: no ctx, no MPI). Given a source layout and a
 * destination mesh, proposes the destination device order (which rank
 * holds which mesh position, row-major like xmesh_mesh_create's ranks) that
 * minimises the model lower bound of the resharding. Ranks are plain ids
 * 0..nranks-1 and host_of_rank[r] is rank r's host; meshes may overlap
 * (then ranks that keep a block they already hold move nothing). The
 * cluster model is the one plans use (XMESH_* parameters, XMESH_CLUSTER_FILE). */
typedef struct {
    int ndim;             /* tensor dims, 1..XMESH_MAX_TENSOR_DIMS */
    const int64_t *shape; /* ndim entries >= 0 */
    xmesh_dtype_t dtype;
    int src_mesh_ndim;
    const int *src_mesh_shape;
    const int *src_ranks; /* prod(src_mesh_shape) distinct ranks, row-major */
    const char *src_sharding;
    int dst_mesh_ndim;
    const int *dst_mesh_shape;
    const int *dst_ranks; /* the current (or default) order of the destination mesh */
    const char *dst_sharding;
    int nranks;
    const int *host_of_rank; /* nranks host ids >= 0 */
} xmesh_placement_problem_t;

typedef struct {
    double lower_bound_s;           /* with dst_ranks as given */
    double suggested_lower_bound_s; /* with the suggested order (<= lower_bound_s) */
    int64_t bytes_local;            /* bytes receivers already hold (no transfer), given order */
    int64_t bytes_local_suggested;  /* same with the suggested order */
    int evaluations;                /* orders whose bound was computed */
} xmesh_placement_info_t;

/* Writes prod(dst_mesh_shape) ranks (a permutation of dst_ranks) to
 * suggested_ranks and, when info != NULL, the bounds. The given order is
 * returned when nothing beats it. On error nothing is written. */
xmesh_result_t xmesh_suggest_order(const xmesh_placement_problem_t *pb, int *suggested_ranks,
                                   xmesh_placement_info_t *info);

/* Offline price of one boundary (pure: no ctx, no MPI, deterministic with max_evals > 0): what a
 * plan resharding pb's tensor from src_ranks (src_sharding) to dst_ranks (dst_sharding, the
 * order as given) would take, by the decomposer, the scheduler and the simulator plan creation
 * uses, for a search that prices many placements without creating meshes or plans. Ranks are
 * plain ids 0..nranks-1 as in xmesh_suggest_order; the meshes may overlap.
 *
 * The cluster model: every field required (model NULL: the XMESH_* parameters and
 * XMESH_CLUSTER_FILE, as plans use). Rates in bytes per second per direction, times in
 * seconds. */
typedef struct {
    int nics_per_host;   /* >= 1; a host's device i sends through NIC i % nics_per_host */
    double nic_send_Bps; /* per NIC, > 0 */
    double nic_recv_Bps; /* per NIC, > 0 */
    double intra_Bps;    /* device to device inside a host, > 0 */
    double latency_s;    /* per message, >= 0 */
    int64_t chunk_bytes; /* pipelining chunk of the broadcast chains, >= 1 */
    int send_ahead;      /* chunk sends in flight per hop, >= 1 */
} xmesh_cluster_model_t;

typedef struct {
    xmesh_scheduler_t scheduler; /* XMESH_SCHEDULER_UNSET: the XMESH_SCHEDULER value */
    xmesh_strategy_t strategy;   /* BROADCAST (chains) or SENDRECV (one route per receiver) */
    uint64_t seed;               /* of the randomized schedulers */
    int64_t max_evals; /* > 0: the searches stop after this many evaluations (results independent
                          of machine speed); 0: the XMESH_BUDGET_US time budget */
} xmesh_predict_opts_t;

typedef struct {
    double predicted_s;       /* simulated makespan of the chosen schedule */
    double lower_bound_s;     /* the model's lower bound of any schedule */
    int64_t bytes_total;      /* bytes of the whole tensor */
    int64_t bytes_cross_host; /* bytes that cross between hosts */
} xmesh_prediction_t;

/* Writes the prediction to *out. INVALID_ARGUMENT (nothing written) for a NULL argument, a bad
 * problem (as xmesh_suggest_order), a model field out of its range or another strategy. */
xmesh_result_t xmesh_plan_predict(const xmesh_placement_problem_t *pb,
                                  const xmesh_cluster_model_t *model,
                                  const xmesh_predict_opts_t *opts, xmesh_prediction_t *out);

/* Configuration parameters (pure: no ctx; thread safe). Every environment variable xmesh and
 * its training stack read (XMESH_*, XMP_*) is declared once in the library's table with a kind
 * (string, integer, bytes, real), a default and a help line; `xmesh-info` prints the table.
 * These read one parameter by name: the environment's value when it is set and valid for the
 * kind, else the default (a refused value is warned about on stderr, naming it and the
 * default). The environment is read again at each call. INVALID_ARGUMENT, every output
 * untouched, for a NULL argument or a name the table does not declare.
 *
 * xmesh_param_get: any kind, as text (the environment's string, or the default's), written
 * NUL-terminated to value[0..len-1]; INVALID_ARGUMENT when it needs more than len bytes.
 * from_env may be NULL, else *from_env = 1 when the value came from the environment, 0 for
 * the default. xmesh_param_get_int: integer and bytes kinds (a byte size with its suffix
 * applied); xmesh_param_get_real: those and the real kind; INVALID_ARGUMENT for another kind,
 * naming it. */
xmesh_result_t xmesh_param_get(const char *name, char *value, size_t len, int *from_env);
xmesh_result_t xmesh_param_get_int(const char *name, int64_t *value);
xmesh_result_t xmesh_param_get_real(const char *name, double *value);

/* Context queries. */
xmesh_result_t xmesh_ctx_rank(xmesh_ctx_t ctx, int *rank);
xmesh_result_t xmesh_ctx_size(xmesh_ctx_t ctx, int *size);
/* The default timeout of ctx's blocking operations in seconds (0: no bound): its params'
 * timeout_s, else XMESH_TIMEOUT_S, else 300. ctx NULL: the value a context created now with
 * default params would have, so code without a context (an application's own collectives)
 * bounds its waits like xmesh does. */
xmesh_result_t xmesh_ctx_get_timeout(xmesh_ctx_t ctx, double *seconds);
xmesh_result_t xmesh_ctx_host(xmesh_ctx_t ctx, int rank, int *host);
xmesh_result_t xmesh_ctx_destroy(xmesh_ctx_t ctx);

/* What moving data has cost this rank's CPU since the context was created
 * (counters only grow; take differences around a region). MPI backend; the
 * NCCL backend reports zeros. The kernel's network work is not in these:
 * CPU a transfer takes beyond them is the transport's (TCP, a NIC driver). */
typedef struct {
    double progress_cpu_s; /* CPU time of the progress thread (MPI_THREAD_MULTIPLE) */
    double wait_cpu_s;     /* CPU time of threads while they drive xmesh_wait / xmesh_reshard */
    int64_t staged_bytes;  /* bytes copied through staging buffers (pack, unpack, sums, copies) */
    int64_t rounds;        /* progress rounds run (progress thread, waits, tests) */
    int64_t idle_rounds;   /* of them, rounds in which nothing moved */
} xmesh_ctx_stats_t;
xmesh_result_t xmesh_ctx_get_stats(xmesh_ctx_t ctx, xmesh_ctx_stats_t *stats);

/* An application's failure signal for transfers in flight (the way ncclCommAbort ends NCCL
 * operations): while a reshard of ctx has not finished, xmesh calls check(user, msg, len) every
 * 2 ms or so from whichever thread drives it (xmesh_wait, xmesh_test, xmesh_reshard, the
 * progress thread at MPI_THREAD_MULTIPLE: check must be thread safe then). When check returns
 * non-zero the reshard ends with XMESH_ERR_REMOTE, its message "rank R: reshard abandoned: "
 * followed by what check wrote to msg (NUL-terminated, len bytes at most), exactly as after a
 * timeout: the destination block is undefined, the plan retired, what MPI cannot cancel kept by
 * the plan until xmesh_plan_destroy. Use it when a peer is known to have failed and will never
 * send (an application's own failure notices), so that a rank blocked on it does not wait until
 * XMESH_TIMEOUT_S. NULL check removes it. Not collective; set it before starting transfers.
 * MPI backend (the NCCL backend does not call it yet). */
typedef int (*xmesh_abort_check_t)(void *user, char *msg, size_t len);
xmesh_result_t xmesh_ctx_set_abort_check(xmesh_ctx_t ctx, xmesh_abort_check_t check, void *user);

#ifdef __cplusplus
}
#endif
#endif /* XMESH_H */
