/*
 * NCCL backend: executes a plan's schedule with NCCL point-to-point calls on
 * CUDA streams, packing, unpacking and reducing on the device.
 *
 * What it runs: the per-rank program of the core (lib/plan/xm_program.h),
 * the very program the MPI executor runs: chains of devices (the schedule's
 * routes, or the all-gather chains), each rank's segments of them with
 * their ops (pack, send, receive, reduce, unpack, copy). NCCL wants every
 * rank to post matching groups, so the program is cut into global lockstep
 * rounds (xm_rounds_next): in round t each active step receives one chunk
 * and forwards the previous one, and all chains active in the round (every
 * task the round schedule runs concurrently) go into one
 * ncclGroupStart/ncclGroupEnd; kernels that prepare a round's sends run
 * before the group, kernels that consume its receives after it
 * (lib/cuda/devplan.c lowers a round; the CPU tests run the lowered rounds
 * through an emulator).
 *
 * Why grouped send/recv on one communicator per mesh pair, and not
 * ncclBroadcast on split communicators:
 *   - ncclBroadcast needs a communicator per distinct (sender, receiver
 *     set), which is what the reference implementation creates, one after
 *     another; a resharding has up to one such set per unit task (64 in
 *     paper case 4), and every communicator costs start-up time (a
 *     collective bootstrap) and device memory for its channels (NCCL issues
 *     #534, #986, #2294). Send/recv needs only that sender and receiver share
 *     a communicator, so one communicator over the union of the two meshes
 *     serves every task of every plan between those meshes (cached and
 *     shared, bounded by XMESH_NCCL_MAX_COMMS per context; a mesh pair that
 *     spans all ranks reuses the context's communicator).
 *   - the chain order is the scheduler's (host-aware, sender chosen for
 *     load balance, NIC order); ncclBroadcast picks its own ring/tree order
 *     inside the communicator, which the scheduler and the simulator could
 *     not model;
 *   - partial sums (SBP "P") need a reduction along the source part of the
 *     chain with an f32 accumulator for f16/bf16; send/recv plus our own
 *     kernel does this, ncclBroadcast cannot.
 * The cost is one group launch per round (not per chain and chunk) instead
 * of NCCL's internal pipelining; with 1 MiB chunks that is a few
 * microseconds per round against tens of microseconds of transfer at NIC
 * speed.
 *
 * Streams: every transfer is enqueued on one stream (the caller's for
 * xmesh_reshard_start_on_stream, the plan's own otherwise) and waits for
 * the previous transfer enqueued on the same communicator (an event per
 * communicator), so transfers of plans sharing a communicator run one
 * after another and NCCL never sees two of them interleaved.
 */
#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "xm_api.h"
#include "xm_boot.h"
#include "xm_cuda_kernels.h"
#include "xm_envboot.h"
#include "xm_oob.h"
#include "xm_devplan.h"
#include "xm_topo.h"
#include "xmesh/cuda.h"

#define XM_NCCL_REQ_MAGIC 0x6e63636cu /* "nccl" */

typedef struct xm_nccl_ctx {
    /* Control traffic (agreement, schedules, the NCCL id): the caller's
     * all-gather, the environment bootstrap's, or MPI_Allgather over a
     * duplicate of the caller's communicator (xmesh_ctx_create_nccl). */
    xmesh_oob_t oob;
    xm_envboot_t *boot; /* the environment bootstrap, or NULL */
    MPI_Comm comm;      /* the duplicate, or MPI_COMM_NULL */
    int device;
    ncclComm_t world;
    xm_commcache_t cache; /* entry 0: all ranks -> world, pinned */
    xm_topo_t *topo;      /* this host, NULL if hwloc failed */
    int topo_gpu;         /* index of our device in topo, -1 unknown */
    int nic;              /* NIC closest to our device, -1 unknown */
    int nics_per_host;    /* min over hosts of the NICs hwloc found (>= 1) */
} xm_nccl_ctx_t;

typedef struct xm_nccl_req {
    xmesh_plan_t plan; /* first: api.c dispatches on it */
    unsigned magic;
    int live;
    cudaEvent_t done;
    struct timespec t0;
    struct xm_nccl_req *next; /* pool of the plan */
} xm_nccl_req_t;

typedef struct xm_nccl_exec {
    xm_devplan_t dp;  /* the rank's program, staging pool, peers */
    xm_commkey_t key; /* the plan's communicator ranks */
    ncclComm_t comm;  /* NULL when this rank is outside both meshes */
    int *comm_rank;   /* ctx rank -> rank in comm */
    void *pool;       /* device staging, dp.pool_bytes */
    cudaStream_t stream;
    cudaEvent_t last;       /* end of the last transfer enqueued for this plan */
    cudaEvent_t comm_event; /* end of the last transfer on comm (any plan) */
    int attached;           /* holds a reference on its cache entry */
    int enqueued;           /* last was recorded at least once */
    xm_op_t *ops;           /* one round, lowered */
    int cap_ops;
    xm_nccl_req_t *reqs;
} xm_nccl_exec_t;

/* ---------------------------------------------------- error conversion */

#define CUDA_TRY(call)                                                                             \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            return XM_ERR(XMESH_ERR_BACKEND, "%s: CUDA error %d (%s)", #call, (int)e_,             \
                          cudaGetErrorString(e_));                                                 \
    } while (0)

static xmesh_result_t nccl_err(ncclResult_t r, ncclComm_t comm, const char *what)
{
    const char *last = comm ? ncclGetLastError(comm) : ncclGetLastError(NULL);
    return XM_ERR(XMESH_ERR_BACKEND, "%s: NCCL error %d (%s)%s%s", what, (int)r,
                  ncclGetErrorString(r), last && *last ? ": " : "", last ? last : "");
}

static xmesh_result_t mpi_err(int e, const char *what)
{
    return xm_boot_mpi_err(e, what);
}

static xm_nccl_ctx_t *be_of(xmesh_ctx_t ctx)
{
    return (xm_nccl_ctx_t *)ctx->be;
}

/* ----------------------------------------------------------- agreement */

/* The agreement collective over the context's out-of-band all-gather
 * (lib/plan/xm_oob.h). */
static xmesh_result_t agree_on(xm_nccl_ctx_t *be, xmesh_result_t local, uint64_t hash)
{
    return xm_oob_agree(&be->oob, local, hash, NULL, NULL, 0, "agree");
}

static xmesh_result_t nccl_agree(xmesh_ctx_t ctx, xmesh_result_t local, uint64_t hash)
{
    return agree_on(be_of(ctx), local, hash);
}

/* Element-wise minimum of v[0 .. n) over the ranks, in place. */
static xmesh_result_t min_ints(xm_nccl_ctx_t *be, int *v, int n, const char *what)
{
    int *all = malloc(sizeof(int) * (size_t)n * (size_t)be->oob.size);
    if (!all)
        return XM_ERR(XMESH_ERR_NO_MEMORY, "%s: out of memory", what);
    xmesh_result_t r = xm_oob_allgather(&be->oob, v, all, sizeof(int) * (size_t)n, what);
    for (int q = 0; !r && q < be->oob.size; q++)
        for (int i = 0; i < n; i++)
            v[i] = all[(size_t)q * n + i] < v[i] ? all[(size_t)q * n + i] : v[i];
    free(all);
    return r;
}

/* xmesh_oob_t.allgather over an MPI communicator (user). */
static int mpi_allgather(void *user, const void *send, void *recv, size_t bytes)
{
    int e =
        MPI_Allgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, *(MPI_Comm *)user);
    if (e != MPI_SUCCESS)
        mpi_err(e, "MPI_Allgather");
    return e != MPI_SUCCESS;
}

/* ------------------------------------------------------------ plan setup */

/* Rank 0's schedule becomes everyone's (schedulers with a time budget are
 * not deterministic across ranks). With XMESH_NICS_PER_HOST unset, the
 * model first takes the NIC count hwloc found (min over hosts). */
static xmesh_result_t share_schedule(xmesh_plan_t plan)
{
    xm_nccl_ctx_t *be = be_of(plan->ctx);
    xmesh_result_t r = XMESH_SUCCESS;
    /* The all-gather strategies take senders and order from the send/recv
     * model; their chains are built by xm_chains_build. */
    xm_sched_opts_t so = {.kind = plan->scheduler,
                          .budget_us = plan->budget_us,
                          .seed = plan->seed,
                          .strategy = plan->strategy == XMESH_STRATEGY_BROADCAST
                                          ? XMESH_STRATEGY_BROADCAST
                                          : XMESH_STRATEGY_SENDRECV};
    if (!xm_param_is_set("XMESH_NICS_PER_HOST") && be->nics_per_host > 1 &&
        plan->cluster.nics_per_host != be->nics_per_host) {
        plan->cluster.nics_per_host = be->nics_per_host;
        if (plan->ctx->rank == 0) {
            xm_schedule_t s;
            if ((r = xm_schedule(&plan->ts, &plan->cluster, &so, &s)) == XMESH_SUCCESS) {
                xm_schedule_free(&plan->sched);
                plan->sched = s;
            }
        }
    }
    if ((r = agree_on(be, r, 0)))
        return r;
    return agree_on(be, xm_oob_share_schedule(&be->oob, plan, NULL, 0), 0);
}

/* Finds or creates the communicator of the plan's ranks. Collective: the
 * cache keys, their order and LRU times are identical on every rank (they
 * change only here), so every rank takes the same branch and ncclCommSplit
 * is called by all ranks or none. Reference counts can differ (plan
 * destruction is local), hence the agreement on what may be evicted. */
static xmesh_result_t attach_comm(xmesh_plan_t plan, xm_nccl_exec_t *ex)
{
    xm_nccl_ctx_t *be = be_of(plan->ctx);
    xmesh_result_t r = xm_commkey_make(plan->src.mesh.devs, plan->src.mesh.ndev,
                                       plan->dst.mesh.devs, plan->dst.mesh.ndev, &ex->key);
    r = agree_on(be, r, 0);
    if (r)
        return r;
    int i = xm_commcache_find(&be->cache, &ex->key);
    if (i < 0) {
        int n = be->cache.n, v = xm_commcache_victim(&be->cache);
        if (v >= 0 && v < n) {
            /* full: evict only what no rank still uses */
            int *ok = malloc(sizeof(int) * n);
            xmesh_result_t e =
                ok ? XMESH_SUCCESS
                   : XM_ERR(XMESH_ERR_NO_MEMORY, "communicator cache: out of memory");
            for (int k = 0; ok && k < n; k++)
                ok[k] = be->cache.e[k].refs == 0;
            if (!e)
                e = min_ints(be, ok, n, "communicator cache");
            v = !e ? xm_commcache_victim_masked(&be->cache, ok) : -2;
            free(ok);
            if (v == -2)
                return agree_on(be, e, 0);
        }
        if (v < 0)
            return XM_ERR(XMESH_ERR_UNSUPPORTED,
                          "%d NCCL communicators in use by live plans (XMESH_NCCL_MAX_COMMS): "
                          "destroy plans of other mesh pairs or raise the limit",
                          be->cache.cap - 1);
        if (v < be->cache.n) {
            xm_commentry_t *old = &be->cache.e[v];
            XM_INFO("nccl: evicting the communicator of %d ranks", old->key.n);
            if (old->event)
                cudaEventDestroy((cudaEvent_t)old->event);
            if (old->comm)
                ncclCommDestroy((ncclComm_t)old->comm);
            xm_commcache_remove(&be->cache, v);
        }
        int member = xm_commkey_index(&ex->key, plan->ctx->rank) >= 0;
        ncclComm_t nc = NULL;
        /* key = context rank: split ranks follow the key's sorted order */
        ncclResult_t nr =
            ncclCommSplit(be->world, member ? 0 : NCCL_SPLIT_NOCOLOR, plan->ctx->rank, &nc, NULL);
        r = nr == ncclSuccess ? XMESH_SUCCESS : nccl_err(nr, be->world, "ncclCommSplit");
        xm_commkey_t copy = {0};
        if (!r)
            r = xm_commkey_make(ex->key.ranks, ex->key.n, NULL, 0, &copy);
        if (!r)
            r = xm_commcache_insert(&be->cache, &copy, nc, &i);
        if (r && nc)
            ncclCommDestroy(nc);
        xm_commkey_free(&copy);
        if ((r = agree_on(be, r, 0)))
            return r;
        XM_INFO("nccl: new communicator of %d ranks (%d cached)", ex->key.n, be->cache.n);
    }
    be->cache.e[i].refs++;
    ex->attached = 1;
    ex->comm = (ncclComm_t)be->cache.e[i].comm;
    return XMESH_SUCCESS;
}

/* Local part of plan setup; its result is agreed on by the caller. */
static xmesh_result_t setup_local(xmesh_plan_t plan, xm_nccl_exec_t *ex)
{
    xm_nccl_ctx_t *be = be_of(plan->ctx);
    ex->comm_rank = malloc(sizeof(int) * plan->ctx->size);
    if (!ex->comm_rank)
        return XM_ERR(XMESH_ERR_NO_MEMORY, "plan: out of memory");
    for (int k = 0; k < plan->ctx->size; k++)
        ex->comm_rank[k] = xm_commkey_index(&ex->key, k);
    xm_prog_in_t in = {.ts = &plan->ts,
                       .sched = &plan->sched,
                       .hosts = &plan->ctx->hosts,
                       .src = &plan->src,
                       .dst = &plan->dst,
                       .strategy = plan->strategy,
                       .dtype = plan->dtype,
                       .dst_dtype = plan->dst_dtype,
                       .chunk_bytes = plan->chunk_bytes};
    xmesh_result_t r = xm_devplan_build(&in, plan->ctx->rank, &ex->dp);
    if (r)
        return r;
    CUDA_TRY(cudaSetDevice(be->device));
    if (ex->comm) {
        /* the communicator's ordering event, shared by its plans */
        xm_commentry_t *e = &be->cache.e[xm_commcache_peek(&be->cache, &ex->key)];
        if (!e->event) {
            cudaEvent_t ev;
            CUDA_TRY(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
            e->event = ev;
        }
        ex->comm_event = (cudaEvent_t)e->event;
    }
    if (ex->dp.pool_bytes > 0)
        CUDA_TRY(cudaMalloc(&ex->pool, (size_t)ex->dp.pool_bytes));
    /* A blocking stream: ordered after work on the legacy default stream. */
    CUDA_TRY(cudaStreamCreate(&ex->stream));
    CUDA_TRY(cudaEventCreateWithFlags(&ex->last, cudaEventDisableTiming));
    XM_INFO("nccl: rank %d takes part in %d task(s) (%d steps, %lld rounds), %lld staging bytes",
            plan->ctx->rank, ex->dp.prog.ntasks, ex->dp.prog.nsteps, (long long)ex->dp.nrounds,
            (long long)ex->dp.pool_bytes);
    return XMESH_SUCCESS;
}

static xmesh_result_t nccl_plan_setup(xmesh_plan_t plan)
{
    xm_nccl_ctx_t *be = be_of(plan->ctx);
    xm_nccl_exec_t *ex = calloc(1, sizeof *ex);
    if (!ex)
        return agree_on(be, XM_ERR(XMESH_ERR_NO_MEMORY, "plan: out of memory"), 0);
    plan->exec = ex;
    xmesh_result_t r = share_schedule(plan);
    if (r)
        return r;
    if ((r = attach_comm(plan, ex)))
        return r;
    r = setup_local(plan, ex);
    return agree_on(be, r, 0);
}

static void nccl_plan_teardown(xmesh_plan_t plan)
{
    xm_nccl_exec_t *ex = plan->exec;
    if (!ex)
        return;
    xm_nccl_ctx_t *be = be_of(plan->ctx);
    cudaSetDevice(be->device);
    /* Transfers enqueued on user streams have no request: wait for them
     * before their staging memory goes away. */
    if (ex->enqueued)
        cudaEventSynchronize(ex->last);
    if (ex->attached) {
        int i = xm_commcache_peek(&be->cache, &ex->key);
        if (i >= 0)
            be->cache.e[i].refs--;
    }
    for (xm_nccl_req_t *q = ex->reqs, *nx; q; q = nx) {
        nx = q->next;
        q->magic = 0;
        cudaEventDestroy(q->done);
        free(q);
    }
    if (ex->last)
        cudaEventDestroy(ex->last);
    if (ex->stream)
        cudaStreamDestroy(ex->stream);
    cudaFree(ex->pool);
    free(ex->ops);
    free(ex->comm_rank);
    xm_commkey_free(&ex->key);
    xm_devplan_free(&ex->dp);
    free(ex);
    plan->exec = NULL;
}

/* ------------------------------------------------------------ execution */

static char *at(xm_nccl_exec_t *ex, int64_t off)
{
    return (char *)ex->pool + off;
}

/* Runs one lowered op (xm_devplan_lower) on stream st. */
static xmesh_result_t run_op(xmesh_plan_t plan, xm_nccl_exec_t *ex, const xm_op_t *o,
                             const void *src, void *dst, cudaStream_t st)
{
    const xm_program_t *p = &ex->dp.prog;
    size_t ws = o->acc ? p->acc_es : p->es;
    cudaError_t ce = cudaSuccess;
    ncclResult_t nr = ncclSuccess;
    switch (o->kind) {
    case XM_OP_COPY:
        ce = xm_cuda_copy(&o->desc, src, &o->desc2, dst, p->es, st);
        break;
    case XM_OP_PACK:
        /* an all-gather ring head forwards the part it received earlier */
        ce = xm_cuda_pack(&o->desc, o->from_dst ? dst : src, at(ex, o->buf), (int)plan->dtype,
                          o->acc, st);
        break;
    case XM_OP_REDUCE:
        ce = xm_cuda_reduce(&o->desc, src, at(ex, o->buf), o->acc,
                            o->convert_out ? at(ex, o->out) : NULL, (int)plan->dtype, st);
        break;
    case XM_OP_UNPACK:
        ce = xm_cuda_unpack(&o->desc, at(ex, o->buf), dst, p->es, st);
        break;
    case XM_OP_SEND:
        nr = ncclSend(at(ex, o->buf), (size_t)o->count * ws, ncclUint8, ex->comm_rank[o->peer],
                      ex->comm, st);
        break;
    case XM_OP_RECV:
        nr = ncclRecv(at(ex, o->buf), (size_t)o->count * ws, ncclUint8, ex->comm_rank[o->peer],
                      ex->comm, st);
        break;
    default:
        return XM_ERR(XMESH_ERR_INTERNAL, "nccl: unknown op kind %d", o->kind);
    }
    if (ce != cudaSuccess)
        return XM_ERR(XMESH_ERR_BACKEND, "nccl: kernel launch (op %d): CUDA error %d (%s)", o->kind,
                      (int)ce, cudaGetErrorString(ce));
    if (nr != ncclSuccess)
        return nccl_err(nr, ex->comm, o->kind == XM_OP_SEND ? "ncclSend" : "ncclRecv");
    return XMESH_SUCCESS;
}

/* One round: its kernels, then one group of every send and receive of the
 * round (all chains active in the round, concurrently), then the kernels
 * that consume what arrived. */
static xmesh_result_t run_round(xmesh_plan_t plan, xm_nccl_exec_t *ex, const xm_op_t *ops, int n,
                                const void *src, void *dst, cudaStream_t st)
{
    xmesh_result_t r;
    int k = 0;
    for (; k < n && ops[k].phase == 0; k++)
        if ((r = run_op(plan, ex, &ops[k], src, dst, st)))
            return r;
    if (k < n && ops[k].phase == 1) {
        ncclResult_t nr = ncclGroupStart();
        if (nr != ncclSuccess)
            return nccl_err(nr, ex->comm, "ncclGroupStart");
        for (; k < n && ops[k].phase == 1; k++)
            if ((r = run_op(plan, ex, &ops[k], src, dst, st))) {
                ncclGroupEnd();
                return r;
            }
        if ((nr = ncclGroupEnd()) != ncclSuccess)
            return nccl_err(nr, ex->comm, "ncclGroupEnd");
    }
    for (; k < n; k++)
        if ((r = run_op(plan, ex, &ops[k], src, dst, st)))
            return r;
    return XMESH_SUCCESS;
}

/* Enqueues the whole plan for this rank on stream st: the program's
 * lockstep rounds (xm_rounds_next), one NCCL group per round. */
static xmesh_result_t enqueue(xmesh_plan_t plan, const void *src, void *dst, cudaStream_t st)
{
    xm_nccl_ctx_t *be = be_of(plan->ctx);
    xm_nccl_exec_t *ex = plan->exec;
    xmesh_result_t r = XMESH_SUCCESS;
    CUDA_TRY(cudaSetDevice(be->device));
    cudaEvent_t comm_ev = ex->comm_event;
    /* Order after the previous transfer on this communicator (any plan, any
     * stream) and after this plan's previous transfer (its staging). */
    if (comm_ev)
        CUDA_TRY(cudaStreamWaitEvent(st, comm_ev, 0));
    if (ex->enqueued)
        CUDA_TRY(cudaStreamWaitEvent(st, ex->last, 0));
    xm_rounds_it_t it;
    if ((r = xm_rounds_init(&ex->dp.prog, &it)))
        return r;
    for (;;) {
        int64_t round;
        const xm_rop_t *rops;
        int n = xm_rounds_next(&ex->dp.prog, &it, &round, &rops);
        if (n == 0)
            break;
        if (n > 0 && n > ex->cap_ops) {
            xm_op_t *o = realloc(ex->ops, sizeof *o * n);
            if (o) {
                ex->ops = o;
                ex->cap_ops = n;
            }
        }
        if (n < 0 || n > ex->cap_ops) {
            r = XM_ERR(XMESH_ERR_NO_MEMORY, "nccl: out of memory for round %lld", (long long)round);
            break;
        }
        int m = xm_devplan_lower(&ex->dp, rops, n, ex->ops);
        if (m < 0) {
            r = XM_ERR(XMESH_ERR_INTERNAL, "nccl: round %lld has an op the device cannot run",
                       (long long)round);
            break;
        }
        if ((r = run_round(plan, ex, ex->ops, m, src, dst, st)))
            break;
    }
    xm_rounds_free(&it);
    if (r)
        return r;
    CUDA_TRY(cudaEventRecord(ex->last, st));
    ex->enqueued = 1;
    if (comm_ev)
        CUDA_TRY(cudaEventRecord(comm_ev, st));
    return XMESH_SUCCESS;
}

/* Device buffers only: a host pointer would make NCCL fault on the device,
 * long after the call returned. */
static xmesh_result_t check_buffer(xmesh_plan_t plan, const void *p, const char *name, int needed)
{
    if (!needed)
        return XMESH_SUCCESS;
    struct cudaPointerAttributes a;
    cudaError_t e = cudaPointerGetAttributes(&a, p);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky-free error state */
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s %p: not a CUDA pointer (%s)", name, p,
                      cudaGetErrorString(e));
    }
    if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                      "%s %p is host memory: an NCCL context needs device buffers", name, p);
    if (a.type == cudaMemoryTypeDevice && a.device != be_of(plan->ctx)->device)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                      "%s %p is on CUDA device %d, the context uses device %d", name, p, a.device,
                      be_of(plan->ctx)->device);
    return XMESH_SUCCESS;
}

static xmesh_result_t check_buffers(xmesh_plan_t p, const void *src, void *dst)
{
    xmesh_result_t r;
    int need_src = p->src_index >= 0 && xm_layout_block_volume(&p->src, p->src_index) > 0;
    int need_dst = p->dst_index >= 0 && xm_layout_block_volume(&p->dst, p->dst_index) > 0;
    if (need_src && !src)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                      "src_local is NULL but rank %d holds a source block", p->ctx->rank);
    if (need_dst && !dst)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                      "dst_local is NULL but rank %d holds a destination block", p->ctx->rank);
    if (src && src == dst)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "src_local and dst_local are the same buffer %p",
                      (void *)dst);
    CUDA_TRY(cudaSetDevice(be_of(p->ctx)->device));
    if ((r = check_buffer(p, src, "src_local", need_src)) ||
        (r = check_buffer(p, dst, "dst_local", need_dst)))
        return r;
    return XMESH_SUCCESS;
}

static xmesh_result_t nccl_start(xmesh_plan_t plan, const void *const *srcs, void *const *dsts,
                                 xmesh_request_t *out)
{
    xm_nccl_exec_t *ex = plan->exec;
    if (plan->ntensors != 1) /* api.c refuses such plans at creation */
        return XM_ERR(XMESH_ERR_UNSUPPORTED, "the NCCL backend moves one tensor per plan");
    const void *src = srcs[0];
    void *dst = dsts[0];
    xmesh_result_t r = check_buffers(plan, src, dst);
    if (r)
        return r;
    xm_nccl_req_t *q = ex->reqs;
    while (q && q->live)
        q = q->next;
    if (!q) {
        q = calloc(1, sizeof *q);
        if (!q)
            return XM_ERR(XMESH_ERR_NO_MEMORY, "request: out of memory");
        cudaError_t e = cudaEventCreateWithFlags(&q->done, cudaEventDisableTiming);
        if (e != cudaSuccess) {
            free(q);
            return XM_ERR(XMESH_ERR_BACKEND, "cudaEventCreate: CUDA error %d (%s)", (int)e,
                          cudaGetErrorString(e));
        }
        q->plan = plan;
        q->next = ex->reqs;
        ex->reqs = q;
    }
    if ((r = enqueue(plan, src, dst, ex->stream)))
        return r;
    cudaError_t e = cudaEventRecord(q->done, ex->stream);
    if (e != cudaSuccess)
        return XM_ERR(XMESH_ERR_BACKEND, "cudaEventRecord: CUDA error %d (%s)", (int)e,
                      cudaGetErrorString(e));
    q->magic = XM_NCCL_REQ_MAGIC;
    q->live = 1;
    clock_gettime(CLOCK_MONOTONIC, &q->t0);
    plan->inflight++;
    *out = (xmesh_request_t)q;
    return XMESH_SUCCESS;
}

static void release(xm_nccl_req_t *q)
{
    q->live = 0;
    q->plan->inflight--;
}

/* IN_PROGRESS, SUCCESS, or an error (NCCL async error, timeout). A timeout
 * aborts the communicator: NCCL offers no other way to cancel. */
static xmesh_result_t poll(xm_nccl_req_t *q)
{
    xm_nccl_exec_t *ex = q->plan->exec;
    cudaError_t e = cudaEventQuery(q->done);
    if (e == cudaSuccess) {
        release(q);
        return XMESH_SUCCESS;
    }
    if (e != cudaErrorNotReady) {
        release(q);
        return XM_ERR(XMESH_ERR_BACKEND, "reshard: CUDA error %d (%s)", (int)e,
                      cudaGetErrorString(e));
    }
    if (ex->comm) {
        ncclResult_t ae = ncclSuccess;
        ncclCommGetAsyncError(ex->comm, &ae);
        if (ae != ncclSuccess && ae != ncclInProgress) {
            release(q);
            return nccl_err(ae, ex->comm, "reshard: NCCL asynchronous error");
        }
    }
    double to = q->plan->timeout_s;
    if (to > 0) {
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        double el = (double)(now.tv_sec - q->t0.tv_sec) + 1e-9 * (now.tv_nsec - q->t0.tv_nsec);
        if (el > to) {
            if (ex->comm)
                ncclCommAbort(ex->comm); /* the plan's communicator is unusable from now on */
            release(q);
            return XM_ERR(XMESH_ERR_TIMEOUT,
                          "reshard did not complete in %.1f s (XMESH_TIMEOUT_S); its NCCL "
                          "communicator was aborted",
                          to);
        }
    }
    return XMESH_IN_PROGRESS;
}

static xm_nccl_req_t *req_of(xmesh_request_t r)
{
    xm_nccl_req_t *q = (xm_nccl_req_t *)r;
    return q->magic == XM_NCCL_REQ_MAGIC && q->live ? q : NULL;
}

static xmesh_result_t nccl_test(xmesh_request_t r)
{
    xm_nccl_req_t *q = req_of(r);
    if (!q)
        return XM_ERR(XMESH_ERR_INVALID_USAGE, "request %p was already completed or released",
                      (void *)r);
    cudaSetDevice(be_of(q->plan->ctx)->device);
    return poll(q);
}

static xmesh_result_t nccl_wait(xmesh_request_t r)
{
    xm_nccl_req_t *q = req_of(r);
    if (!q)
        return XM_ERR(XMESH_ERR_INVALID_USAGE, "request %p was already completed or released",
                      (void *)r);
    cudaSetDevice(be_of(q->plan->ctx)->device);
    /* Sleeping poll (50 us growing to 1 ms): no spinning core, and NCCL
     * errors and the timeout are still noticed. */
    long ns = 50000;
    for (;;) {
        xmesh_result_t s = poll(q);
        if (s != XMESH_IN_PROGRESS)
            return s;
        struct timespec ts = {0, ns};
        nanosleep(&ts, NULL);
        if (ns < 1000000)
            ns *= 2;
    }
}

static void nccl_ctx_free(xmesh_ctx_t ctx)
{
    xm_nccl_ctx_t *be = be_of(ctx);
    if (!be)
        return;
    cudaSetDevice(be->device);
    for (int i = 0; i < be->cache.n; i++) {
        xm_commentry_t *e = &be->cache.e[i];
        if (e->event)
            cudaEventDestroy((cudaEvent_t)e->event);
        if (e->comm && e->comm != be->world)
            ncclCommDestroy((ncclComm_t)e->comm);
    }
    xm_commcache_free(&be->cache);
    if (be->world)
        ncclCommDestroy(be->world);
    xm_topo_free(be->topo);
    int fin = 0;
    MPI_Finalized(&fin);
    if (be->comm != MPI_COMM_NULL && !fin)
        MPI_Comm_free(&be->comm);
    xm_envboot_destroy(be->boot);
    free(be);
    ctx->be = NULL;
}

static const xm_backend_ops_t xm_nccl_ops = {
    .name = "nccl",
    .agree = nccl_agree,
    .plan_setup = nccl_plan_setup,
    .plan_teardown = nccl_plan_teardown,
    .start = nccl_start,
    .test = nccl_test,
    .wait = nccl_wait,
    .ctx_free = nccl_ctx_free,
};

xmesh_result_t xmesh_reshard_start_on_stream(xmesh_plan_t plan, const void *src, void *dst,
                                             cudaStream_t stream)
{
    if (!plan)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s: plan is NULL", __func__);
    if (plan->ctx->ops != &xm_nccl_ops)
        return XM_ERR(XMESH_ERR_INVALID_USAGE,
                      "%s: the plan belongs to a '%s' context, not an NCCL one", __func__,
                      plan->ctx->ops->name);
    xmesh_result_t r = check_buffers(plan, src, dst);
    if (r)
        return r;
    return enqueue(plan, src, dst, stream);
}

xmesh_result_t xmesh_ctx_cuda_device(xmesh_ctx_t ctx, int *device)
{
    if (!ctx || !device)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s: %s is NULL", __func__,
                      ctx ? "device" : "ctx");
    if (ctx->ops != &xm_nccl_ops)
        return XM_ERR(XMESH_ERR_INVALID_USAGE, "%s: '%s' context, not an NCCL one", __func__,
                      ctx->ops->name);
    *device = be_of(ctx)->device;
    return XMESH_SUCCESS;
}

/* ------------------------------------------------------------- context */

/* XMESH_HOST_ID: an integer, or "rank/N" (N consecutive ranks share a
 * host), as the MPI backend reads it. */
/* Local, non-collective part: device selection and topology. */
static xmesh_result_t open_device(xm_nccl_ctx_t *be, int cuda_device, int local_rank)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
        return XM_ERR(XMESH_ERR_UNSUPPORTED, "no CUDA device visible to this rank (%s)",
                      e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    int dev = cuda_device >= 0 ? cuda_device : local_rank % n;
    if (dev >= n)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "cuda_device %d: only %d device(s) visible",
                      cuda_device, n);
    CUDA_TRY(cudaSetDevice(dev));
    be->device = dev;
    be->topo_gpu = be->nic = -1;
    const char *xml = xm_param_str("XMESH_TOPO_XML");
    if (xm_topo_load(xml, &be->topo) != XMESH_SUCCESS) {
        XM_WARN("nccl: no hwloc topology (%s): NIC locality unknown", xmesh_last_error());
        be->topo = NULL;
        return XMESH_SUCCESS;
    }
    char bus[32];
    if (cudaDeviceGetPCIBusId(bus, sizeof bus, dev) == cudaSuccess) {
        be->topo_gpu = xm_topo_gpu_by_busid(be->topo, bus);
        be->nic = xm_topo_nic_for_gpu(be->topo, be->topo_gpu);
    }
    XM_INFO("nccl: device %d (%s) = topology gpu %d, closest NIC %d (%s)", dev, bus, be->topo_gpu,
            be->nic, be->nic >= 0 ? be->topo->nics[be->nic].name : "-");
    return XMESH_SUCCESS;
}

static xmesh_result_t check_params(const xmesh_ctx_params_t *p)
{
    if (!p)
        return XMESH_SUCCESS;
    if (p->magic != XMESH_PARAMS_MAGIC)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                      "ctx params: magic 0x%x is wrong (initialise with "
                      "XMESH_CTX_PARAMS_INITIALIZER)",
                      p->magic);
    if (p->size < sizeof(xmesh_ctx_params_t))
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "ctx params: size %zu smaller than %zu", p->size,
                      sizeof(xmesh_ctx_params_t));
    return XMESH_SUCCESS;
}

/* Context creation over be->oob (set by the entry points below); be is
 * ctx->be. On error the caller frees ctx (nccl_ctx_free). */
static xmesh_result_t nccl_create(struct xmesh_ctx *ctx, xm_nccl_ctx_t *be, int cuda_device,
                                  const xmesh_ctx_params_t *params)
{
    xmesh_result_t r;
    int local_rank = 0, rank = be->oob.rank, size = be->oob.size;
    ctx->rank = rank;
    ctx->size = size;
    if ((r = xm_oob_hosts(&be->oob, params ? params->host_id : XMESH_UNSET_INT, &local_rank,
                          &ctx->hosts)))
        return r;
    r = open_device(be, cuda_device, local_rank);
    if (cuda_device < -1)
        r = XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "cuda_device %d: must be >= 0 or -1", cuda_device);
    /* Nobody enters NCCL's collective init unless every rank has a device. */
    if ((r = agree_on(be, r, 0)))
        return r;
    int nics = be->topo ? xm_topo_nics_per_host(be->topo) : 1;
    if ((r = min_ints(be, &nics, 1, "NIC count")))
        return r;
    be->nics_per_host = nics;

    /* NCCL's root bootstrap: rank 0's unique id, handed to every rank
     * through the out-of-band all-gather. */
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    ncclResult_t nr = ncclSuccess;
    if (rank == 0)
        nr = ncclGetUniqueId(&id);
    r = nr == ncclSuccess ? XMESH_SUCCESS : nccl_err(nr, NULL, "ncclGetUniqueId");
    if ((r = agree_on(be, r, 0)))
        return r;
    if ((r = xm_oob_bcast(&be->oob, &id, sizeof id, 0, "ncclUniqueId")))
        return r;
    nr = ncclCommInitRank(&be->world, size, id, rank);
    r = nr == ncclSuccess ? XMESH_SUCCESS : nccl_err(nr, NULL, "ncclCommInitRank");
    if (r)
        be->world = NULL;
    if ((r = agree_on(be, r, 0)))
        return r;
    int cap = (int)xm_param_i64("XMESH_NCCL_MAX_COMMS");
    xm_commkey_t all = {0};
    int *ranks = malloc(sizeof(int) * size), idx;
    if (!ranks)
        return XM_ERR(XMESH_ERR_NO_MEMORY, "context: out of memory");
    for (int i = 0; i < size; i++)
        ranks[i] = i;
    r = xm_commcache_init(&be->cache, cap < 1 ? 1 : cap + 1);
    if (!r)
        r = xm_commkey_make(ranks, size, NULL, 0, &all);
    free(ranks);
    if (!r)
        r = xm_commcache_insert(&be->cache, &all, be->world, &idx);
    xm_commkey_free(&all);
    if (r)
        return r;
    be->cache.e[idx].refs = 1; /* pinned: the world communicator */
    ctx->timeout_s =
        params && params->timeout_s >= 0 ? params->timeout_s : xm_param_double("XMESH_TIMEOUT_S");
    XM_INFO("nccl: context of %d ranks on %d host(s), device %d, %d NIC(s) per host", size,
            ctx->hosts.nhosts, be->device, be->nics_per_host);
    return XMESH_SUCCESS;
}

/* Allocates the context shell; ctx->be is set. */
static xmesh_result_t nccl_alloc(const xmesh_ctx_params_t *params, xmesh_ctx_t *out,
                                 struct xmesh_ctx **ctxp, xm_nccl_ctx_t **bep)
{
    xmesh_result_t r;
    if (!out)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xmesh_ctx_create_nccl: out is NULL");
    if ((r = check_params(params)))
        return r;
    xm_nccl_ctx_t *be = calloc(1, sizeof *be);
    struct xmesh_ctx *ctx = calloc(1, sizeof *ctx);
    if (!be || !ctx) {
        free(be);
        free(ctx);
        return XM_ERR(XMESH_ERR_NO_MEMORY, "context: out of memory");
    }
    be->comm = MPI_COMM_NULL;
    ctx->be = be;
    ctx->ops = &xm_nccl_ops;
    *ctxp = ctx;
    *bep = be;
    return XMESH_SUCCESS;
}

static xmesh_result_t nccl_finish(struct xmesh_ctx *ctx, xm_nccl_ctx_t *be, int cuda_device,
                                  const xmesh_ctx_params_t *params, xmesh_ctx_t *out)
{
    xmesh_result_t r = nccl_create(ctx, be, cuda_device, params);
    if (r) {
        nccl_ctx_free(ctx);
        xm_hostmap_free(&ctx->hosts);
        free(ctx);
        return r;
    }
    *out = ctx;
    return XMESH_SUCCESS;
}

xmesh_result_t xmesh_ctx_create_nccl(MPI_Comm comm, int cuda_device,
                                     const xmesh_ctx_params_t *params, xmesh_ctx_t *out)
{
    int init = 0, e;
    struct xmesh_ctx *ctx;
    xm_nccl_ctx_t *be;
    xmesh_result_t r = nccl_alloc(params, out, &ctx, &be);
    if (r)
        return r;
    MPI_Initialized(&init);
    if (!init) {
        r = XM_ERR(XMESH_ERR_INVALID_USAGE, "%s: MPI is not initialised", __func__);
        goto out_free;
    }
    if ((e = MPI_Comm_dup(comm, &be->comm)) != MPI_SUCCESS) {
        r = mpi_err(e, "MPI_Comm_dup");
        be->comm = MPI_COMM_NULL;
        goto out_free;
    }
    MPI_Comm_set_errhandler(be->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(be->comm, &be->oob.rank);
    MPI_Comm_size(be->comm, &be->oob.size);
    be->oob.allgather = mpi_allgather; /* an MPI communicator is one all-gather */
    be->oob.user = &be->comm;
    return nccl_finish(ctx, be, cuda_device, params, out);
out_free:
    nccl_ctx_free(ctx);
    free(ctx);
    return r;
}

xmesh_result_t xmesh_ctx_create_nccl_oob(const xmesh_oob_t *oob, int cuda_device,
                                         const xmesh_ctx_params_t *params, xmesh_ctx_t *out)
{
    struct xmesh_ctx *ctx;
    xm_nccl_ctx_t *be;
    xmesh_result_t r;
    if (oob && (r = xm_oob_check(oob)))
        return r;
    if ((r = nccl_alloc(params, out, &ctx, &be)))
        return r;
    if (oob) {
        be->oob = *oob;
    } else {
        double t = params && params->timeout_s >= 0 ? params->timeout_s
                                                    : xm_param_double("XMESH_TIMEOUT_S");
        if ((r = xm_envboot_create(t, &be->boot, &be->oob))) {
            nccl_ctx_free(ctx);
            free(ctx);
            return r;
        }
    }
    return nccl_finish(ctx, be, cuda_device, params, out);
}
