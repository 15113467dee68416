/* The public API's generic half: argument checks, layouts, plan creation
 * (decompose + schedule + agree across ranks) and dispatch to the backend.
 * Everything here runs before a byte moves, so every check leaves the
 * caller's handles and buffers as they were. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "xm_api.h"
#include "xm_cluster_file.h"
#include "xm_cost.h"

#define CHECK_NULL(p, name)                                                                        \
    do {                                                                                           \
        if (!(p))                                                                                  \
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s: %s is NULL", __func__, name);           \
    } while (0)

/* ------------------------------------------------------------------ meshes */

xmesh_result_t xmesh_mesh_create(xmesh_ctx_t ctx, int ndim, const int *shape, const int *ranks,
                                 xmesh_mesh_t *out)
{
    CHECK_NULL(ctx, "ctx");
    CHECK_NULL(shape, "shape");
    CHECK_NULL(ranks, "ranks");
    CHECK_NULL(out, "out");
    if (ndim < 1 || ndim > XM_MAX_MESH_DIMS)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "mesh ndim %d out of range [1, %d]", ndim,
                      XM_MAX_MESH_DIMS);
    xm_meshdesc_t d = {.ndim = ndim, .devs = ranks};
    int64_t n = 1;
    for (int a = 0; a < ndim; a++) {
        d.shape[a] = shape[a];
        if (shape[a] < 1)
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "mesh shape[%d] = %d, must be >= 1", a,
                          shape[a]);
        n *= shape[a];
        if (n > ctx->size)
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                          "mesh shape needs more devices than the %d ranks of the context",
                          ctx->size);
    }
    d.ndev = (int)n;
    xmesh_result_t r = xm_meshdesc_check(&d, ctx->size);
    if (r)
        return r;
    struct xmesh_mesh *m = malloc(sizeof *m + sizeof(int) * n);
    if (!m)
        return XM_ERR(XMESH_ERR_NO_MEMORY, "mesh: out of memory");
    m->ctx = ctx;
    m->nplans = 0;
    memcpy(m->devs, ranks, sizeof(int) * n);
    m->desc = d;
    m->desc.devs = m->devs;
    ctx->nmeshes++;
    *out = m;
    return XMESH_SUCCESS;
}

xmesh_result_t xmesh_mesh_destroy(xmesh_mesh_t m)
{
    if (!m)
        return XMESH_SUCCESS;
    if (m->nplans)
        return XM_ERR(XMESH_ERR_INVALID_USAGE, "mesh is used by %d plan(s): destroy them first",
                      m->nplans);
    m->ctx->nmeshes--;
    free(m);
    return XMESH_SUCCESS;
}

/* ----------------------------------------------------------------- layouts */

static xmesh_result_t layout_import(const xmesh_layout_t *l, const char *which, xm_layout_t *out)
{
    if (!l)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s layout is NULL", which);
    if (l->ndim < 0 || l->ndim > XM_MAX_DIMS)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s layout: ndim %d out of range [0, %d]", which,
                      l->ndim, XM_MAX_DIMS);
    if (l->ndim > 0 && !l->shape)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s layout: shape is NULL", which);
    if (!xmesh_dtype_size(l->dtype))
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s layout: unknown dtype %d", which,
                      (int)l->dtype);
    if (!l->mesh)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s layout: mesh is NULL", which);
    if (!l->sharding)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s layout: sharding is NULL", which);
    if (l->split != XMESH_SPLIT_NUMPY && l->split != XMESH_SPLIT_TORCH)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                      "%s layout: split %d is neither XMESH_SPLIT_NUMPY (%d) nor "
                      "XMESH_SPLIT_TORCH (%d)",
                      which, l->split, XMESH_SPLIT_NUMPY, XMESH_SPLIT_TORCH);
    xm_layout_t x;
    memset(&x, 0, sizeof x);
    x.ndim = l->ndim;
    x.elem_size = xmesh_dtype_size(l->dtype);
    x.mesh = l->mesh->desc;
    x.split = l->split;
    for (int d = 0; d < l->ndim; d++) {
        if (l->shape[d] < 0)
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s layout: shape[%d] = %lld is negative",
                          which, d, (long long)l->shape[d]);
        x.shape[d] = l->shape[d];
    }
    xmesh_result_t r = xm_shape_bytes(x.ndim, x.shape, x.elem_size, NULL);
    if (r) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", xmesh_last_error());
        return XM_ERR(r, "%s layout: %s", which, msg);
    }
    if ((r = xm_spec_parse(l->sharding, l->ndim, x.mesh.ndim, &x.spec)))
        return r;
    *out = x;
    return XMESH_SUCCESS;
}

static xmesh_result_t local_block(const xmesh_layout_t *l, int rank, int64_t *lo, int64_t *hi,
                                  int *holds)
{
    xm_layout_t x;
    xmesh_result_t r = layout_import(l, "", &x);
    if (r)
        return r;
    CHECK_NULL(holds, "holds");
    int i = xm_mesh_find(&x.mesh, rank);
    if (i < 0) {
        for (int d = 0; d < x.ndim; d++)
            lo[d] = hi[d] = 0;
        *holds = 0;
        return XMESH_SUCCESS;
    }
    xm_layout_block(&x, i, lo, hi);
    *holds = 1;
    return XMESH_SUCCESS;
}

/* Writes the extent (want_offset = 0) or the global offset (1) of the
 * local block of rank; out untouched on error. */
static xmesh_result_t local_query(const xmesh_layout_t *l, int rank, int64_t *out, int *holds,
                                  int want_offset, const char *func)
{
    int64_t lo[XM_MAX_DIMS], hi[XM_MAX_DIMS];
    if (!l)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s: layout is NULL", func);
    if (l->ndim > 0 && !out)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s: %s is NULL", func,
                      want_offset ? "offset" : "shape");
    int h = 0;
    xmesh_result_t r = local_block(l, rank, lo, hi, holds ? &h : NULL);
    if (r)
        return r;
    for (int d = 0; d < l->ndim; d++)
        out[d] = want_offset ? lo[d] : hi[d] - lo[d];
    *holds = h;
    return XMESH_SUCCESS;
}

xmesh_result_t xmesh_layout_local_shape(const xmesh_layout_t *l, int rank, int64_t *shape,
                                        int *holds)
{
    return local_query(l, rank, shape, holds, 0, __func__);
}

xmesh_result_t xmesh_layout_local_offset(const xmesh_layout_t *l, int rank, int64_t *offset,
                                         int *holds)
{
    return local_query(l, rank, offset, holds, 1, __func__);
}

/* ------------------------------------------------------------------ params */

typedef struct {
    xmesh_strategy_t strategy;
    xmesh_scheduler_t scheduler;
    int64_t chunk_bytes, budget_us, seed;
    double timeout_s;
} resolved_params_t;

/* Unset fields take the XMESH_* environment value or the default. */
static xmesh_result_t resolve_params(const xmesh_plan_params_t *p, double ctx_timeout, int mpi,
                                     resolved_params_t *out)
{
    xmesh_plan_params_t def = XMESH_PLAN_PARAMS_INITIALIZER;
    if (!p)
        p = &def;
    if (p->magic != XMESH_PARAMS_MAGIC)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                      "plan params: magic 0x%x is wrong (initialise with "
                      "XMESH_PLAN_PARAMS_INITIALIZER)",
                      p->magic);
    if (p->size < sizeof(xmesh_plan_params_t))
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "plan params: size %zu smaller than %zu", p->size,
                      sizeof(xmesh_plan_params_t));
    resolved_params_t r;
    xmesh_result_t rc;
    if (p->strategy == XMESH_STRATEGY_UNSET) {
        if ((rc = xmesh_strategy_parse(xm_param_strategy(), &r.strategy)))
            return XM_ERR(rc, "XMESH_STRATEGY: %s", xmesh_last_error());
    } else if ((unsigned)p->strategy >= XMESH_STRATEGY_COUNT_) {
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "plan params: strategy %d unknown",
                      (int)p->strategy);
    } else {
        r.strategy = p->strategy;
    }
    if (p->scheduler == XMESH_SCHEDULER_UNSET) {
        if ((rc = xmesh_scheduler_parse(xm_param_scheduler(), &r.scheduler)))
            return XM_ERR(rc, "XMESH_SCHEDULER: %s", xmesh_last_error());
    } else if ((unsigned)p->scheduler >= XMESH_SCHEDULER_COUNT_) {
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "plan params: scheduler %d unknown",
                      (int)p->scheduler);
    } else {
        r.scheduler = p->scheduler;
    }
    r.chunk_bytes =
        p->chunk_bytes != XMESH_UNSET_I64 ? p->chunk_bytes : xm_param_chunk_bytes_for(mpi);
    if (r.chunk_bytes < 1)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "chunk_bytes %lld must be >= 1",
                      (long long)r.chunk_bytes);
    r.budget_us = p->budget_us != XMESH_UNSET_I64 ? p->budget_us : xm_param_budget_us();
    if (r.budget_us < 0)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "budget_us %lld must be >= 0",
                      (long long)r.budget_us);
    r.seed = p->seed != XMESH_UNSET_I64 ? p->seed : xm_param_seed();
    r.timeout_s = p->timeout_s >= 0 ? p->timeout_s : ctx_timeout;
    *out = r;
    return XMESH_SUCCESS;
}

/* ------------------------------------------------------------------- plans */

static uint64_t hash_layout(uint64_t h, const xm_layout_t *l)
{
    h = xm_hash64(h, &l->ndim, sizeof l->ndim);
    h = xm_hash64(h, l->shape, sizeof l->shape[0] * l->ndim);
    h = xm_hash64(h, &l->elem_size, sizeof l->elem_size);
    h = xm_hash64(h, &l->spec, sizeof l->spec);
    h = xm_hash64(h, &l->split, sizeof l->split);
    h = xm_hash64(h, &l->mesh.ndim, sizeof l->mesh.ndim);
    h = xm_hash64(h, l->mesh.shape, sizeof l->mesh.shape);
    h = xm_hash64(h, l->mesh.devs, sizeof(int) * l->mesh.ndev);
    return h;
}

/* Monotonic seconds, for the XMESH_DEBUG=INFO plan-creation timings. */
static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Per-tensor arrays of a plan of n tensors (zeroed). */
static xmesh_result_t plan_alloc_tensors(struct xmesh_plan *p, int n)
{
    p->ntensors = n;
    p->srcs = calloc((size_t)n, sizeof *p->srcs);
    p->dsts = calloc((size_t)n, sizeof *p->dsts);
    p->dtypes = calloc((size_t)n, sizeof *p->dtypes);
    p->dst_dtypes = calloc((size_t)n, sizeof *p->dst_dtypes);
    p->src_meshes = calloc((size_t)n, sizeof *p->src_meshes);
    p->dst_meshes = calloc((size_t)n, sizeof *p->dst_meshes);
    p->src_indices = calloc((size_t)n, sizeof *p->src_indices);
    p->dst_indices = calloc((size_t)n, sizeof *p->dst_indices);
    if (!p->srcs || !p->dsts || !p->dtypes || !p->dst_dtypes || !p->src_meshes || !p->dst_meshes ||
        !p->src_indices || !p->dst_indices)
        return XM_ERR(XMESH_ERR_NO_MEMORY, "plan of %d tensors: out of memory", n);
    return XMESH_SUCCESS;
}

/* Checks tensor i's pair of layouts and records it in the plan. */
static xmesh_result_t plan_import_tensor(xmesh_ctx_t ctx, struct xmesh_plan *p, int i,
                                         const xmesh_layout_t *src, const xmesh_layout_t *dst)
{
    xmesh_result_t r;
    char msg[800];
    if ((r = layout_import(src, "source", &p->srcs[i])) ||
        (r = layout_import(dst, "destination", &p->dsts[i])))
        goto out_named;
    if (src->mesh->ctx != ctx || dst->mesh->ctx != ctx) {
        r = XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s mesh belongs to another context",
                   src->mesh->ctx != ctx ? "source" : "destination");
        goto out_named;
    }
    if (!xm_dtype_pair_ok(src->dtype, dst->dtype)) {
        r = XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                   "source dtype %s != destination dtype %s: plans convert only between f16, "
                   "bf16 and f32 (docs/DTYPES.md)",
                   xmesh_dtype_name(src->dtype), xmesh_dtype_name(dst->dtype));
        goto out_named;
    }
    p->dtypes[i] = src->dtype;
    p->dst_dtypes[i] = dst->dtype;
    p->src_meshes[i] = src->mesh;
    p->dst_meshes[i] = dst->mesh;
    p->src_indices[i] = xm_mesh_find(&p->srcs[i].mesh, ctx->rank);
    p->dst_indices[i] = xm_mesh_find(&p->dsts[i].mesh, ctx->rank);
    return XMESH_SUCCESS;
out_named:
    if (p->ntensors == 1)
        return r; /* a one-tensor plan keeps its messages as they were */
    snprintf(msg, sizeof msg, "%s", xmesh_last_error());
    return XM_ERR(r, "tensor %d: %s", i, msg);
}

/* Hash of tensor i's inputs (what agreement compares). */
static uint64_t hash_tensor(const struct xmesh_plan *p, int i)
{
    uint64_t h = XM_HASH_INIT;
    h = hash_layout(h, &p->srcs[i]);
    h = hash_layout(h, &p->dsts[i]);
    h = xm_hash64(h, &p->dtypes[i], sizeof p->dtypes[i]);
    h = xm_hash64(h, &p->dst_dtypes[i], sizeof p->dst_dtypes[i]);
    return h;
}

/* Local half of plan creation: everything a rank can check and compute on
 * its own. On error p is left for plan_free_local. *hash covers n, every
 * tensor, the parameters and the cluster model (so agreement compares all
 * of it); on a local error it is 0. */
static xmesh_result_t plan_build_local(xmesh_ctx_t ctx, int n, const xmesh_layout_t *src,
                                       const xmesh_layout_t *dst, const xmesh_plan_params_t *params,
                                       struct xmesh_plan *p, uint64_t *hash)
{
    xmesh_result_t r;
    resolved_params_t rp;
    if (n <= 0)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s: n = %d tensors, must be >= 1",
                      "xmesh_plan_create_many", n);
    if (!src || !dst)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s layout%s is NULL",
                      !src ? "source" : "destination", n > 1 ? " array" : "");
    if ((r = plan_alloc_tensors(p, n)))
        return r;
    for (int i = 0; i < n; i++)
        if ((r = plan_import_tensor(ctx, p, i, &src[i], &dst[i])))
            return r;
    if ((r = resolve_params(params, ctx->timeout_s, !strcmp(ctx->ops->name, "mpi"), &rp)))
        return r;
    p->src = p->srcs[0];
    p->dst = p->dsts[0];
    p->dtype = p->dtypes[0];
    p->dst_dtype = p->dst_dtypes[0];
    p->src_index = p->src_indices[0];
    p->dst_index = p->dst_indices[0];
    p->strategy = rp.strategy;
    p->scheduler = rp.scheduler;
    p->chunk_bytes = rp.chunk_bytes;
    p->budget_us = rp.budget_us;
    p->seed = (uint64_t)rp.seed;
    p->timeout_s = rp.timeout_s;

    uint64_t h = XM_HASH_INIT;
    if (n > 1) /* a one-tensor plan hashes as it always did */
        h = xm_hash64(h, &n, sizeof n);
    for (int i = 0; i < n; i++) {
        h = hash_layout(h, &p->srcs[i]);
        h = hash_layout(h, &p->dsts[i]);
        if (n > 1) {
            h = xm_hash64(h, &p->dtypes[i], sizeof p->dtypes[i]);
            h = xm_hash64(h, &p->dst_dtypes[i], sizeof p->dst_dtypes[i]);
        }
    }
    if (n == 1) {
        h = xm_hash64(h, &p->dtype, sizeof p->dtype);
        h = xm_hash64(h, &p->dst_dtype, sizeof p->dst_dtype);
    }
    h = xm_hash64(h, &rp.strategy, sizeof rp.strategy);
    h = xm_hash64(h, &rp.scheduler, sizeof rp.scheduler);
    h = xm_hash64(h, &rp.chunk_bytes, sizeof rp.chunk_bytes);
    h = xm_hash64(h, &rp.seed, sizeof rp.seed);

    double t0 = now_s();
    /* Packing (small unit tasks with the same holders and receivers share
     * chunks) needs an executor that runs packed steps: the MPI one. The
     * all-gather baselines keep one task per box. Tensors pack with tensors
     * of the same dtype pair, so a packed step has one set of ops. */
    int64_t pack_max = ctx->ops->many_tensors && p->strategy != XMESH_STRATEGY_SENDRECV_ALLGATHER &&
                               p->strategy != XMESH_STRATEGY_GLOBAL_ALLGATHER
                           ? p->chunk_bytes
                           : 0;
    int64_t pack_limit = xm_param_i64("XMESH_PACK_BYTES");
    if (pack_limit <= 0)
        pack_max = 0; /* XMESH_PACK_BYTES=0: no packing */
    int *key = malloc(sizeof(int) * n);
    if (!key)
        return XM_ERR(XMESH_ERR_NO_MEMORY, "plan of %d tensors: out of memory", n);
    for (int i = 0; i < n; i++)
        key[i] = (int)p->dtypes[i] * XMESH_DTYPE_COUNT_ + (int)p->dst_dtypes[i];
    r = xm_decompose_many(n, p->srcs, p->dsts, key, &ctx->hosts, pack_max, pack_limit, &p->ts);
    free(key);
    if (r)
        return r;
    h = xm_hash64(h, &pack_max, sizeof pack_max);
    h = xm_hash64(h, &pack_limit, sizeof pack_limit);
    double t1 = now_s();
    if ((r = xm_cluster_from_env(&p->cluster, &ctx->hosts, p->chunk_bytes)))
        return r;
    /* Every rank rebuilds the routes from its own cluster model (rank 0
     * only broadcasts order and senders), so everything that shapes the
     * model is agreed: the values after XMESH_NIC_GBPS, XMESH_INTRA_GBPS,
     * XMESH_NICS_PER_HOST, XMESH_LATENCY_US and the cluster file's contents
     * were applied. A mismatch then gives XMESH_ERR_MISMATCH, not a hang. */
    const xm_cluster_t *cm = &p->cluster;
    h = xm_hash64(h, &cm->nics_per_host, sizeof cm->nics_per_host);
    h = xm_hash64(h, &cm->nic_send_Bps, sizeof cm->nic_send_Bps);
    h = xm_hash64(h, &cm->nic_recv_Bps, sizeof cm->nic_recv_Bps);
    h = xm_hash64(h, &cm->intra_Bps, sizeof cm->intra_Bps);
    h = xm_hash64(h, &cm->latency_s, sizeof cm->latency_s);
    h = xm_hash64(h, &cm->chunk_bytes, sizeof cm->chunk_bytes);
    h = xm_hash64(h, &cm->send_ahead, sizeof cm->send_ahead);
    h = xm_hash64(h, &cm->forward_ahead, sizeof cm->forward_ahead);
    h = xm_hash64(h, &cm->sync_send, sizeof cm->sync_send);
    h = xm_hash64(h, &cm->hosts.nhosts, sizeof cm->hosts.nhosts);
    h = xm_hash64(h, cm->hosts.host_of, sizeof(int) * cm->hosts.ndev);
    int64_t split = xm_param_i64("XMESH_SPLIT") != 0;
    h = xm_hash64(h, &split, sizeof split);
    *hash = h;
    /* The all-gather baselines choose senders and order with the sendrecv
     * model; their executors build the all-gather routes themselves. */
    xmesh_strategy_t model = p->strategy == XMESH_STRATEGY_SENDRECV_ALLGATHER ||
                                     p->strategy == XMESH_STRATEGY_GLOBAL_ALLGATHER
                                 ? XMESH_STRATEGY_SENDRECV
                                 : p->strategy;
    xm_sched_opts_t so = {
        .kind = p->scheduler, .budget_us = p->budget_us, .seed = p->seed, .strategy = model};
    double t2 = now_s();
    /* Task splitting on small instances whose whole-task plans leave an
     * integrality gap; the choice is deterministic (scheduler/schedule.c),
     * so every rank ends with the same task set. */
    int ntasks = p->ts.ntasks, split_used = 0;
    r = xm_schedule_plan(&p->ts, &p->cluster, &so, (int)split, &p->sched, &split_used);
    XM_INFO("plan create: rank %d: %d tensor(s), decompose %.2f ms (%d tasks), cluster model "
            "%.2f ms, schedule %.2f ms%s (%d tasks)",
            ctx->rank, n, (t1 - t0) * 1e3, ntasks, (t2 - t1) * 1e3, (now_s() - t2) * 1e3,
            split_used ? ", split" : "", p->ts.ntasks);
    return r;
}

static void plan_free_local(struct xmesh_plan *p)
{
    xm_schedule_free(&p->sched);
    xm_cluster_free(&p->cluster);
    xm_taskset_free(&p->ts);
    free(p->srcs);
    free(p->dsts);
    free(p->dtypes);
    free(p->dst_dtypes);
    free(p->src_meshes);
    free(p->dst_meshes);
    free(p->src_indices);
    free(p->dst_indices);
    free(p);
}

/* After agreement found different inputs: which ones, through the same
 * agreement collective (every rank gets MISMATCH from it together, so all
 * take these steps). First n, then a binary search for the first tensor
 * whose inputs differ (prefix hashes): O(log n) rounds, only on this error
 * path. Returns the MISMATCH to report. */
static xmesh_result_t mismatch_explain(xmesh_ctx_t ctx, const struct xmesh_plan *p, int n)
{
    char saved[512];
    snprintf(saved, sizeof saved, "%s", xmesh_last_error());
    uint64_t hn = xm_hash64(XM_HASH_INIT, &n, sizeof n);
    if (ctx->ops->agree(ctx, XMESH_SUCCESS, hn))
        return XM_ERR(XMESH_ERR_MISMATCH,
                      "ranks passed different numbers of tensors (this rank: n = %d); nothing "
                      "was created",
                      n);
    if (n == 1 || !p->srcs)
        return XM_ERR(XMESH_ERR_MISMATCH, "%s", saved);
    int lo = 0, hi = n; /* the first differing tensor is in [lo, hi); hi == n: none found */
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        uint64_t h = XM_HASH_INIT;
        for (int i = 0; i <= mid; i++) {
            uint64_t ti = hash_tensor(p, i);
            h = xm_hash64(h, &ti, sizeof ti);
        }
        if (ctx->ops->agree(ctx, XMESH_SUCCESS, h))
            hi = mid;
        else
            lo = mid + 1;
    }
    if (lo < n)
        return XM_ERR(XMESH_ERR_MISMATCH,
                      "tensor %d: ranks passed different layouts (shape, dtype, meshes or "
                      "sharding); nothing was created",
                      lo);
    return XM_ERR(XMESH_ERR_MISMATCH, "%s", saved);
}

xmesh_result_t xmesh_plan_create_many(xmesh_ctx_t ctx, int n, const xmesh_layout_t *src,
                                      const xmesh_layout_t *dst, const xmesh_plan_params_t *params,
                                      xmesh_plan_t *out)
{
    CHECK_NULL(ctx, "ctx");
    CHECK_NULL(out, "out");
    struct xmesh_plan *p = calloc(1, sizeof *p);
    if (!p)
        return XM_ERR(XMESH_ERR_NO_MEMORY, "plan: out of memory");
    p->ctx = ctx;
    uint64_t hash = 0;
    double t0 = now_s();
    xmesh_result_t local = plan_build_local(ctx, n, src, dst, params, p, &hash);
    double t1 = now_s();
    char saved[512] = "";
    if (local)
        snprintf(saved, sizeof saved, "%s", xmesh_last_error());
    /* Every rank takes part in agree(), even after a local error, so that no
     * rank is left waiting in a collective. */
    xmesh_result_t r = ctx->ops->agree(ctx, local, hash);
    double t2 = now_s();
    if (local) {
        plan_free_local(p);
        return XM_ERR(local, "%s", saved);
    }
    if (r == XMESH_ERR_MISMATCH)
        r = mismatch_explain(ctx, p, n);
    if (r)
        goto out_free_plan;
    if (n > 1 && !ctx->ops->many_tensors) {
        r = XM_ERR(XMESH_ERR_UNSUPPORTED,
                   "the %s backend moves one tensor per plan; a plan of %d tensors needs the MPI "
                   "backend (or one plan per tensor)",
                   ctx->ops->name, n);
        goto out_free_plan;
    }
    if ((r = ctx->ops->plan_setup(p))) {
        ctx->ops->plan_teardown(p);
        goto out_free_plan;
    }
    XM_INFO("plan create: rank %d: local %.2f ms, agree %.2f ms, backend setup %.2f ms, "
            "total %.2f ms",
            ctx->rank, (t1 - t0) * 1e3, (t2 - t1) * 1e3, (now_s() - t2) * 1e3,
            (now_s() - t0) * 1e3);
    p->src_mesh = p->src_meshes[0];
    p->dst_mesh = p->dst_meshes[0];
    for (int i = 0; i < n; i++) {
        p->src_meshes[i]->nplans++;
        p->dst_meshes[i]->nplans++;
    }
    ctx->nplans++;
    *out = p;
    return XMESH_SUCCESS;
out_free_plan:
    plan_free_local(p);
    return r;
}

xmesh_result_t xmesh_plan_create(xmesh_ctx_t ctx, const xmesh_layout_t *src,
                                 const xmesh_layout_t *dst, const xmesh_plan_params_t *params,
                                 xmesh_plan_t *out)
{
    /* A plan of one: the same path, the same checks and messages. */
    return xmesh_plan_create_many(ctx, 1, src, dst, params, out);
}

xmesh_result_t xmesh_plan_destroy(xmesh_plan_t p)
{
    if (!p)
        return XMESH_SUCCESS;
    if (p->inflight)
        return XM_ERR(XMESH_ERR_INVALID_USAGE,
                      "plan has %d reshard(s) in flight: wait for them before destroying it",
                      p->inflight);
    p->ctx->ops->plan_teardown(p);
    for (int i = 0; i < p->ntensors; i++) {
        p->src_meshes[i]->nplans--;
        p->dst_meshes[i]->nplans--;
    }
    p->ctx->nplans--;
    plan_free_local(p);
    return XMESH_SUCCESS;
}

xmesh_result_t xmesh_plan_get_info(xmesh_plan_t p, xmesh_plan_info_t *info)
{
    CHECK_NULL(p, "plan");
    CHECK_NULL(info, "info");
    int64_t units = 0;
    for (int t = 0; t < p->ts.ntasks; t++)
        units += p->ts.tasks[t].npack ? p->ts.tasks[t].npack : 1;
    info->unit_tasks = units > INT32_MAX ? INT32_MAX : (int)units;
    info->bytes_total = p->ts.bytes_total;
    info->bytes_cross_host = p->ts.bytes_cross_host;
    info->lower_bound_s = p->sched.lower_bound_s;
    /* The all-gather strategies move other bytes than the sendrecv routes
     * their senders and order come from: their own model (xm_cost.h). */
    if (p->strategy == XMESH_STRATEGY_SENDRECV_ALLGATHER ||
        p->strategy == XMESH_STRATEGY_GLOBAL_ALLGATHER)
        info->predicted_s = xm_cost_allgather(&p->ts, &p->cluster, &p->sched,
                                              p->strategy == XMESH_STRATEGY_SENDRECV_ALLGATHER);
    else
        info->predicted_s = p->sched.makespan_s;
    info->strategy = p->strategy;
    info->scheduler = p->scheduler;
    info->chunk_bytes = p->chunk_bytes;
    info->tensors = p->ntensors;
    info->scheduled_tasks = p->ts.ntasks;
    return XMESH_SUCCESS;
}

/* --------------------------------------------------------------- reshards */

typedef struct {
    uintptr_t ptr;
    int idx, dst;
} blk_ref_t;

static int cmp_blk_ref(const void *a, const void *b)
{
    const blk_ref_t *x = a, *y = b;
    if (x->ptr != y->ptr)
        return x->ptr < y->ptr ? -1 : 1;
    if (x->dst != y->dst)
        return x->dst < y->dst ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* A destination block that is also a source block (of any tensor) or
 * another tensor's destination block: the blocks of this rank that hold
 * elements, sorted by address. */
static xmesh_result_t check_aliasing(xmesh_plan_t p, const void *const *srcs, void *const *dsts)
{
    int n = p->ntensors, m = 0;
    blk_ref_t stack[16], *v = 2 * n <= 16 ? stack : malloc(sizeof *v * 2 * (size_t)n);
    if (!v)
        return XM_ERR(XMESH_ERR_NO_MEMORY, "reshard: out of memory for %d tensors", n);
    for (int i = 0; i < n; i++) {
        if (srcs[i] && p->src_indices[i] >= 0 &&
            xm_layout_block_volume(&p->srcs[i], p->src_indices[i]) > 0)
            v[m++] = (blk_ref_t){(uintptr_t)srcs[i], i, 0};
        if (dsts[i] && p->dst_indices[i] >= 0 &&
            xm_layout_block_volume(&p->dsts[i], p->dst_indices[i]) > 0)
            v[m++] = (blk_ref_t){(uintptr_t)dsts[i], i, 1};
    }
    qsort(v, m, sizeof *v, cmp_blk_ref);
    xmesh_result_t r = XMESH_SUCCESS;
    for (int k = 0; k + 1 < m && !r; k++) {
        const blk_ref_t *x = &v[k], *y = &v[k + 1];
        if (x->ptr != y->ptr || (!x->dst && !y->dst))
            continue;
        if (n == 1)
            r = XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "src_local and dst_local are the same buffer %p",
                       (void *)x->ptr);
        else
            r = XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                       "tensor %d: dst_locals[%d] = %p is also %s_locals[%d]: destination "
                       "blocks must not alias other blocks",
                       y->idx, y->idx, (void *)y->ptr, x->dst ? "dst" : "src", x->idx);
    }
    if (v != stack)
        free(v);
    return r;
}

xmesh_result_t xmesh_reshard_many_start(xmesh_plan_t p, const void *const *srcs, void *const *dsts,
                                        xmesh_request_t *req)
{
    CHECK_NULL(p, "plan");
    CHECK_NULL(req, "req");
    CHECK_NULL(srcs, "src_locals");
    CHECK_NULL(dsts, "dst_locals");
    int one = p->ntensors == 1;
    for (int i = 0; i < p->ntensors; i++) {
        if (p->src_indices[i] >= 0 && !srcs[i] &&
            xm_layout_block_volume(&p->srcs[i], p->src_indices[i]) > 0)
            return one ? XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                                "src_local is NULL but rank %d holds a source block", p->ctx->rank)
                       : XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                                "tensor %d: src_locals[%d] is NULL but rank %d holds a source "
                                "block of it",
                                i, i, p->ctx->rank);
        if (p->dst_indices[i] >= 0 && !dsts[i] &&
            xm_layout_block_volume(&p->dsts[i], p->dst_indices[i]) > 0)
            return one ? XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                                "dst_local is NULL but rank %d holds a destination block",
                                p->ctx->rank)
                       : XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                                "tensor %d: dst_locals[%d] is NULL but rank %d holds a "
                                "destination block of it",
                                i, i, p->ctx->rank);
    }
    if (one && srcs[0] && srcs[0] == dsts[0])
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "src_local and dst_local are the same buffer %p",
                      (void *)dsts[0]);
    xmesh_result_t r = check_aliasing(p, srcs, dsts);
    if (r)
        return r;
    return p->ctx->ops->start(p, srcs, dsts, req);
}

xmesh_result_t xmesh_reshard_many(xmesh_plan_t p, const void *const *srcs, void *const *dsts)
{
    xmesh_request_t req;
    xmesh_result_t r = xmesh_reshard_many_start(p, srcs, dsts, &req);
    if (r)
        return r;
    return xmesh_wait(req);
}

xmesh_result_t xmesh_reshard_start(xmesh_plan_t p, const void *src, void *dst, xmesh_request_t *req)
{
    CHECK_NULL(p, "plan");
    if (p->ntensors != 1)
        return XM_ERR(XMESH_ERR_INVALID_USAGE,
                      "xmesh_reshard_start: the plan moves %d tensors: use "
                      "xmesh_reshard_many_start with arrays of blocks",
                      p->ntensors);
    const void *s[1] = {src};
    void *d[1] = {dst};
    return xmesh_reshard_many_start(p, s, d, req);
}

xmesh_result_t xmesh_reshard(xmesh_plan_t p, const void *src, void *dst)
{
    xmesh_request_t req;
    xmesh_result_t r = xmesh_reshard_start(p, src, dst, &req);
    if (r)
        return r;
    return xmesh_wait(req);
}

xmesh_result_t xmesh_test(xmesh_request_t req)
{
    CHECK_NULL(req, "request");
    /* Every backend request starts with its plan; a backend may switch it
     * (to a "released" plan) from another thread, hence the atomic load. */
    xmesh_plan_t p = __atomic_load_n((xmesh_plan_t *)req, __ATOMIC_ACQUIRE);
    return p->ctx->ops->test(req);
}

xmesh_result_t xmesh_wait(xmesh_request_t req)
{
    CHECK_NULL(req, "request");
    xmesh_plan_t p = __atomic_load_n((xmesh_plan_t *)req, __ATOMIC_ACQUIRE);
    return p->ctx->ops->wait(req);
}

/* ---------------------------------------------------------------- context */

xmesh_result_t xmesh_ctx_rank(xmesh_ctx_t ctx, int *rank)
{
    CHECK_NULL(ctx, "ctx");
    CHECK_NULL(rank, "rank");
    *rank = ctx->rank;
    return XMESH_SUCCESS;
}

xmesh_result_t xmesh_ctx_get_timeout(xmesh_ctx_t ctx, double *seconds)
{
    CHECK_NULL(seconds, "seconds");
    *seconds = ctx ? ctx->timeout_s : xm_param_timeout_s();
    return XMESH_SUCCESS;
}

xmesh_result_t xmesh_ctx_size(xmesh_ctx_t ctx, int *size)
{
    CHECK_NULL(ctx, "ctx");
    CHECK_NULL(size, "size");
    *size = ctx->size;
    return XMESH_SUCCESS;
}

xmesh_result_t xmesh_ctx_host(xmesh_ctx_t ctx, int rank, int *host)
{
    CHECK_NULL(ctx, "ctx");
    CHECK_NULL(host, "host");
    if (rank < 0 || rank >= ctx->size)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "rank %d out of range [0, %d)", rank, ctx->size);
    *host = ctx->hosts.host_of[rank];
    return XMESH_SUCCESS;
}

xmesh_result_t xmesh_ctx_get_stats(xmesh_ctx_t ctx, xmesh_ctx_stats_t *stats)
{
    CHECK_NULL(ctx, "ctx");
    CHECK_NULL(stats, "stats");
    xmesh_ctx_stats_t st;
    memset(&st, 0, sizeof st);
    if (ctx->ops && ctx->ops->stats)
        ctx->ops->stats(ctx, &st);
    *stats = st;
    return XMESH_SUCCESS;
}

xmesh_result_t xmesh_ctx_set_abort_check(xmesh_ctx_t ctx, xmesh_abort_check_t check, void *user)
{
    CHECK_NULL(ctx, "ctx");
    ctx->abort_user = user;
    __atomic_store_n(&ctx->abort_check, check, __ATOMIC_RELEASE);
    return XMESH_SUCCESS;
}

xmesh_result_t xmesh_ctx_destroy(xmesh_ctx_t ctx)
{
    if (!ctx)
        return XMESH_SUCCESS;
    if (ctx->nplans || ctx->nmeshes)
        return XM_ERR(XMESH_ERR_INVALID_USAGE,
                      "context still has %d plan(s) and %d mesh(es): destroy them first",
                      ctx->nplans, ctx->nmeshes);
    if (ctx->ops && ctx->ops->ctx_free)
        ctx->ops->ctx_free(ctx);
    xm_hostmap_free(&ctx->hosts);
    free(ctx);
    return XMESH_SUCCESS;
}

/* -------------------------------------------------------------- cluster */

xmesh_result_t xm_cluster_from_env(xm_cluster_t *c, const xm_hostmap_t *hosts, int64_t chunk_bytes)
{
    xm_cluster_t x;
    xmesh_result_t r = xm_cluster_init(&x, hosts);
    if (r)
        return r;
    double nic = xm_param_nic_gbps(), intra = xm_param_intra_gbps();
    int64_t nics = xm_param_nics_per_host();
    double lat = xm_param_latency_us();
    if (nic <= 0 || intra <= 0 || nics < 1 || lat < 0) {
        xm_cluster_free(&x);
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                      "cluster model: XMESH_NIC_GBPS=%g XMESH_INTRA_GBPS=%g "
                      "XMESH_NICS_PER_HOST=%lld XMESH_LATENCY_US=%g: all must be positive",
                      nic, intra, (long long)nics, lat);
    }
    x.nic_send_Bps = x.nic_recv_Bps = nic * 1e9 / 8;
    x.intra_Bps = intra * 1e9 / 8;
    x.nics_per_host = (int)nics;
    x.latency_s = lat * 1e-6;
    x.chunk_bytes = chunk_bytes;
    int64_t ahead = xm_param_send_ahead(); /* the MPI executor's pipeline fill */
    x.send_ahead = ahead < 1 ? 1 : ahead > 16 ? 16 : (int)ahead;
    int64_t fwd = xm_param_forward_ahead(); /* the same on a chain's forwarders */
    x.forward_ahead = fwd < 1 ? 1 : fwd > 16 ? 16 : (int)fwd;
    x.sync_send = xm_param_sync_send() != 0; /* synchronous chunks: no shared-wire fill */
    const char *file = xm_param_cluster_file();
    if (*file && (r = xm_cluster_load(file, &x))) {
        xm_cluster_free(&x);
        return r;
    }
    *c = x;
    return XMESH_SUCCESS;
}

/* ------------------------------------------------------------ placement */

/* Evaluation of one destination order: lower bound and bytes the receivers
 * already hold. The task set (when keep != NULL) is handed back. */
typedef struct {
    xm_layout_t src, dst;
    xm_hostmap_t hm;
    xm_cluster_t cl;
    int ndst;
} place_t;

static xmesh_result_t place_eval(place_t *pl, const int *order, double *lb, int64_t *local,
                                 xm_taskset_t *keep)
{
    pl->dst.mesh.devs = (int *)order;
    xm_taskset_t ts;
    xmesh_result_t r = xm_decompose(&pl->src, &pl->dst, &pl->hm, &ts);
    if (r)
        return r;
    *lb = xm_lower_bound(&ts, &pl->cl);
    int64_t loc = 0;
    for (int t = 0; t < ts.ntasks; t++) {
        const xm_task_t *k = &ts.tasks[t];
        if (k->ngroups != 1)
            continue; /* partial sums always need a reduction */
        for (int i = 0; i < k->nrecv; i++)
            for (int j = 0; j < k->group_size; j++)
                if (ts.holders[k->holder_off + j] == ts.recvs[k->recv_off + i])
                    loc += k->bytes;
    }
    *local = loc;
    if (keep)
        *keep = ts;
    else
        xm_taskset_free(&ts);
    return XMESH_SUCCESS;
}

/* Better: lower bound smaller by more than rounding, or equal and more
 * bytes kept in place. */
static int place_better(double lb, int64_t loc, double blb, int64_t bloc)
{
    if (lb < blb * (1 - 1e-9))
        return 1;
    return lb <= blb * (1 + 1e-9) && loc > bloc;
}

typedef struct {
    int64_t gain;
    int pos, rank;
} place_gain_t;

static int cmp_gain(const void *a, const void *b)
{
    const place_gain_t *x = a, *y = b;
    if (x->gain != y->gain)
        return x->gain > y->gain ? -1 : 1;
    if (x->pos != y->pos)
        return x->pos < y->pos ? -1 : 1;
    return x->rank < y->rank ? -1 : x->rank > y->rank;
}

static int cmp_posrank(const void *a, const void *b)
{
    const place_gain_t *x = a, *y = b;
    if (x->pos != y->pos)
        return x->pos < y->pos ? -1 : 1;
    return x->rank < y->rank ? -1 : x->rank > y->rank;
}

/* Search: (1) when the meshes share ranks, the order that gives every
 * destination position the rank already holding most of its block (greedy
 * assignment on held bytes, from the given order's decomposition, whose
 * box bytes per position do not depend on the order); (2) first-improvement
 * swaps of two positions on different hosts, until no swap helps or the
 * evaluation cap is reached. Each evaluation decomposes and bounds, linear
 * in unit tasks. */
#define XM_PLACE_MAX_EVALS 400

xmesh_result_t xmesh_suggest_order(const xmesh_placement_problem_t *pb, int *suggested_ranks,
                                   xmesh_placement_info_t *info)
{
    return xm_suggest_order(pb, NULL, suggested_ranks, info);
}

xmesh_result_t xm_suggest_order(const xmesh_placement_problem_t *pb, const xm_cluster_t *model,
                                int *suggested_ranks, xmesh_placement_info_t *info)
{
    if (!pb || !suggested_ranks)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s: %s is NULL", __func__,
                      !pb ? "problem" : "suggested_ranks");
    if (pb->ndim < 1 || pb->ndim > XM_MAX_DIMS || !pb->shape)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s: ndim %d out of range [1, %d] or no shape",
                      __func__, pb->ndim, XM_MAX_DIMS);
    if (!xmesh_dtype_size(pb->dtype))
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s: unknown dtype %d", __func__, (int)pb->dtype);
    if (pb->nranks < 1 || !pb->host_of_rank)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s: nranks = %d (must be >= 1 with hosts)",
                      __func__, pb->nranks);
    int nhosts = 0;
    for (int i = 0; i < pb->nranks; i++) {
        if (pb->host_of_rank[i] < 0)
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s: host_of_rank[%d] = %d is negative",
                          __func__, i, pb->host_of_rank[i]);
        if (pb->host_of_rank[i] >= nhosts)
            nhosts = pb->host_of_rank[i] + 1;
    }
    place_t pl;
    memset(&pl, 0, sizeof pl);
    xm_layout_t *L[2] = {&pl.src, &pl.dst};
    for (int s = 0; s < 2; s++) {
        int nd = s ? pb->dst_mesh_ndim : pb->src_mesh_ndim;
        const int *shp = s ? pb->dst_mesh_shape : pb->src_mesh_shape;
        const int *rk = s ? pb->dst_ranks : pb->src_ranks;
        const char *spec = s ? pb->dst_sharding : pb->src_sharding;
        const char *which = s ? "destination" : "source";
        if (nd < 1 || nd > XM_MAX_MESH_DIMS || !shp || !rk || !spec)
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                          "%s: %s mesh ndim %d out of range [1, %d] or shape/ranks/sharding NULL",
                          __func__, which, nd, XM_MAX_MESH_DIMS);
        xm_layout_t *l = L[s];
        l->ndim = pb->ndim;
        l->elem_size = xmesh_dtype_size(pb->dtype);
        for (int d = 0; d < pb->ndim; d++) {
            if (pb->shape[d] < 0)
                return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s: shape[%d] = %lld is negative",
                              __func__, d, (long long)pb->shape[d]);
            l->shape[d] = pb->shape[d];
        }
        l->mesh.ndim = nd;
        l->mesh.ndev = 1;
        for (int a = 0; a < nd; a++) {
            if (shp[a] < 1)
                return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s: %s mesh shape[%d] = %d must be >= 1",
                              __func__, which, a, shp[a]);
            l->mesh.shape[a] = shp[a];
            l->mesh.ndev *= shp[a];
        }
        for (int i = 0; i < l->mesh.ndev; i++) {
            if (rk[i] < 0 || rk[i] >= pb->nranks)
                return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s: %s rank %d outside [0, %d)",
                              __func__, which, rk[i], pb->nranks);
            for (int j = 0; j < i; j++)
                if (rk[j] == rk[i])
                    return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                                  "%s: %s rank %d appears twice in the mesh", __func__, which,
                                  rk[i]);
        }
        l->mesh.devs = (int *)rk;
        xmesh_result_t r = xm_spec_parse(spec, pb->ndim, nd, &l->spec);
        if (r)
            return r;
    }
    int n = pl.dst.mesh.ndev;
    pl.ndst = n;
    pl.hm.ndev = pb->nranks;
    pl.hm.nhosts = nhosts;
    pl.hm.host_of = (int *)pb->host_of_rank;
    xmesh_result_t r = xm_cluster_from_env(&pl.cl, &pl.hm, xm_param_chunk_bytes());
    if (r)
        return r;
    if (model) {
        pl.cl.nics_per_host = model->nics_per_host;
        pl.cl.nic_send_Bps = model->nic_send_Bps;
        pl.cl.nic_recv_Bps = model->nic_recv_Bps;
        pl.cl.intra_Bps = model->intra_Bps;
        pl.cl.latency_s = model->latency_s;
        pl.cl.chunk_bytes = model->chunk_bytes;
    }
    int *cur = malloc(sizeof(int) * n), *best = malloc(sizeof(int) * n);
    int *pos_of = malloc(sizeof(int) * pb->nranks);
    xm_taskset_t ts;
    memset(&ts, 0, sizeof ts);
    place_gain_t *g = NULL;
    if (!cur || !best || !pos_of) {
        r = XM_ERR(XMESH_ERR_NO_MEMORY, "%s: out of memory", __func__);
        goto out_free;
    }
    memcpy(cur, pb->dst_ranks, sizeof(int) * n);
    double lb0, blb, lb;
    int64_t loc0, bloc, loc;
    int evals = 1;
    if ((r = place_eval(&pl, cur, &lb0, &loc0, &ts)))
        goto out_free;
    blb = lb0;
    bloc = loc0;
    memcpy(best, cur, sizeof(int) * n);
    /* (1) keep what ranks hold: gains (position, rank) from the given order */
    for (int i = 0; i < pb->nranks; i++)
        pos_of[i] = -1;
    for (int i = 0; i < n; i++)
        pos_of[cur[i]] = i;
    int ng = 0, capg = 0;
    for (int t = 0; t < ts.ntasks; t++) {
        const xm_task_t *k = &ts.tasks[t];
        if (k->ngroups == 1)
            capg += k->nrecv * k->group_size;
    }
    g = malloc(sizeof *g * (capg + 1));
    if (!g) {
        r = XM_ERR(XMESH_ERR_NO_MEMORY, "%s: out of memory", __func__);
        goto out_free;
    }
    for (int t = 0; t < ts.ntasks; t++) {
        const xm_task_t *k = &ts.tasks[t];
        if (k->ngroups != 1)
            continue;
        for (int i = 0; i < k->nrecv; i++)
            for (int j = 0; j < k->group_size; j++) {
                int hr = ts.holders[k->holder_off + j];
                /* only ranks of the destination mesh can take a position */
                if (pos_of[hr] >= 0)
                    g[ng++] = (place_gain_t){k->bytes, pos_of[ts.recvs[k->recv_off + i]], hr};
            }
    }
    if (ng > 0) {
        /* merge equal (position, rank) pairs, then largest gain first */
        qsort(g, ng, sizeof *g, cmp_posrank);
        int m = 0;
        for (int i = 0; i < ng; i++) {
            if (m && g[m - 1].pos == g[i].pos && g[m - 1].rank == g[i].rank)
                g[m - 1].gain += g[i].gain;
            else
                g[m++] = g[i];
        }
        qsort(g, m, sizeof *g, cmp_gain);
        int *taken = calloc((size_t)pb->nranks + (size_t)n, sizeof *taken);
        if (!taken) {
            r = XM_ERR(XMESH_ERR_NO_MEMORY, "%s: out of memory", __func__);
            goto out_free;
        }
        int *filled = taken + pb->nranks;
        int *cand = malloc(sizeof(int) * n);
        if (!cand) {
            free(taken);
            r = XM_ERR(XMESH_ERR_NO_MEMORY, "%s: out of memory", __func__);
            goto out_free;
        }
        for (int i = 0; i < n; i++)
            cand[i] = -1;
        for (int i = 0; i < m; i++)
            if (!taken[g[i].rank] && !filled[g[i].pos]) {
                taken[g[i].rank] = filled[g[i].pos] = 1;
                cand[g[i].pos] = g[i].rank;
            }
        /* the rest keep the given order's leftover ranks, in order */
        int q = 0;
        for (int i = 0; i < n; i++) {
            if (cand[i] >= 0)
                continue;
            while (taken[cur[q]])
                q++;
            cand[i] = cur[q];
            taken[cur[q]] = 1;
        }
        free(taken);
        evals++;
        if ((r = place_eval(&pl, cand, &lb, &loc, NULL))) {
            free(cand);
            goto out_free;
        }
        if (place_better(lb, loc, blb, bloc)) {
            blb = lb;
            bloc = loc;
            memcpy(best, cand, sizeof(int) * n);
        }
        free(cand);
    }
    /* (2) swaps of positions on different hosts, first improvement */
    memcpy(cur, best, sizeof(int) * n);
    for (int improved = 1; improved && evals < XM_PLACE_MAX_EVALS;) {
        improved = 0;
        for (int i = 0; i < n && evals < XM_PLACE_MAX_EVALS; i++)
            for (int j = i + 1; j < n && evals < XM_PLACE_MAX_EVALS; j++) {
                if (pb->host_of_rank[cur[i]] == pb->host_of_rank[cur[j]])
                    continue;
                int v = cur[i];
                cur[i] = cur[j];
                cur[j] = v;
                evals++;
                if ((r = place_eval(&pl, cur, &lb, &loc, NULL)))
                    goto out_free;
                if (place_better(lb, loc, blb, bloc)) {
                    blb = lb;
                    bloc = loc;
                    memcpy(best, cur, sizeof(int) * n);
                    improved = 1;
                } else {
                    cur[j] = cur[i];
                    cur[i] = v;
                }
            }
    }
    memcpy(suggested_ranks, best, sizeof(int) * n);
    if (info) {
        info->lower_bound_s = lb0;
        info->suggested_lower_bound_s = blb;
        info->bytes_local = loc0;
        info->bytes_local_suggested = bloc;
        info->evaluations = evals;
    }
    r = XMESH_SUCCESS;
out_free:
    free(g);
    free(cur);
    free(best);
    free(pos_of);
    xm_taskset_free(&ts);
    xm_cluster_free(&pl.cl);
    return r;
}
