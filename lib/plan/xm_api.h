/*
 * Private definitions behind the public handles, and the backend table.
 * The generic code (lib/plan/api.c) validates arguments, decomposes and
 * schedules; a backend (lib/mpi, lib/ucx, lib/cuda) moves the bytes.
 * lib/plan sits on top of lib/core and scheduler/: neither includes a
 * header of this folder.
 */
#ifndef XM_API_H
#define XM_API_H

#include "xm_core.h"
#include "xm_sched.h"

typedef struct xm_backend_ops {
    const char *name;
    /* Collective over all ranks of ctx. Every rank passes its local result
     * and a hash of its inputs; returns SUCCESS on every rank only if all
     * results are SUCCESS and all hashes agree; else MISMATCH (hashes differ)
     * or REMOTE (another rank failed), on every rank, with a message. */
    xmesh_result_t (*agree)(xmesh_ctx_t ctx, xmesh_result_t local, uint64_t hash);
    /* Collective: makes the schedule identical on every rank (e.g. rank 0's
     * order and senders broadcast, routes rebuilt), then builds the executor
     * state in plan->exec. On error the plan is left for plan_teardown. */
    xmesh_result_t (*plan_setup)(xmesh_plan_t plan);
    void (*plan_teardown)(xmesh_plan_t plan);
    /* srcs/dsts: plan->ntensors blocks each (NULL where the rank holds
     * none), checked by api.c; the arrays themselves belong to the caller
     * and may be gone once start returns (copy them). */
    xmesh_result_t (*start)(xmesh_plan_t plan, const void *const *srcs, void *const *dsts,
                            xmesh_request_t *req);
    xmesh_result_t (*test)(xmesh_request_t req);
    xmesh_result_t (*wait)(xmesh_request_t req);
    /* Frees the backend state ctx->be (not ctx itself, nor ctx->hosts). */
    void (*ctx_free)(xmesh_ctx_t ctx);
    /* Optional: the CPU counters of xmesh_ctx_get_stats (NULL: zeros). */
    void (*stats)(xmesh_ctx_t ctx, xmesh_ctx_stats_t *st);
    /* Runs plans of many tensors: steps of any tensor and packed steps
     * (xm_pstep_t.tensor / npieces, docs/MANY.md). 0: api.c refuses plans of
     * more than one tensor (UNSUPPORTED) and never packs. */
    int many_tensors;
} xm_backend_ops_t;

/* Ownership rules between api.c and a backend:
 *  - the backend allocates the ctx with calloc, fills ops/be/rank/size/hosts/
 *    timeout_s; xmesh_ctx_destroy (api.c) calls ops->ctx_free, then frees
 *    ctx->hosts and ctx;
 *  - ops->start increments plan->inflight on success; the test/wait call that
 *    completes a request (returns anything but IN_PROGRESS) decrements it and
 *    releases the request; a released or foreign request is detected and
 *    rejected with INVALID_USAGE;
 *  - every backend request struct starts with its xmesh_plan_t (api.c reads
 *    it to dispatch xmesh_test/xmesh_wait) (requests are never freed under the user's
 *    feet: keep them in a per-plan pool with a generation/magic field). */

struct xmesh_ctx {
    const xm_backend_ops_t *ops;
    void *be; /* backend state */
    int rank, size;
    xm_hostmap_t hosts; /* rank -> host, identical on every rank */
    int nmeshes;        /* live meshes of this ctx */
    int nplans;         /* live plans of this ctx */
    double timeout_s;
    xmesh_abort_check_t abort_check; /* xmesh_ctx_set_abort_check; NULL: none */
    void *abort_user;
};

struct xmesh_mesh {
    xmesh_ctx_t ctx;
    xm_meshdesc_t desc; /* desc.devs points to devs below */
    int nplans;         /* plans using this mesh */
    int devs[];
};

/* A plan moves ntensors tensors (xmesh_plan_create_many); a one-tensor plan
 * is a plan of one. The per-tensor arrays below have ntensors entries; the
 * single fields (src_mesh, dtype, src, src_index, ...) are tensor 0's, for
 * backends that move one tensor (lib/cuda refuses more). */
struct xmesh_plan {
    xmesh_ctx_t ctx;
    int ntensors;
    xm_layout_t *srcs, *dsts;
    xmesh_dtype_t *dtypes, *dst_dtypes;
    xmesh_mesh_t *src_meshes, *dst_meshes;
    int *src_indices, *dst_indices; /* this rank's index in each mesh, -1 if absent */
    xmesh_mesh_t src_mesh, dst_mesh;
    xmesh_dtype_t dtype;     /* the source's */
    xmesh_dtype_t dst_dtype; /* the destination's (may differ: xm_dtype_pair_ok) */
    xm_layout_t src, dst;
    int src_index, dst_index; /* this rank's index in each mesh, -1 if absent */
    xm_taskset_t ts;
    xm_cluster_t cluster;
    xm_schedule_t sched;
    xmesh_strategy_t strategy;
    xmesh_scheduler_t scheduler;
    int64_t chunk_bytes;
    int64_t budget_us;
    uint64_t seed;
    double timeout_s;
    int inflight; /* requests in flight */
    void *exec;   /* backend executor state */
};

/* Fills a cluster model for ctx's host map from XMESH_NIC_GBPS & co. */
xmesh_result_t xm_cluster_from_env(xm_cluster_t *c, const xm_hostmap_t *hosts, int64_t chunk_bytes);

/* xmesh_suggest_order() with the cluster parameters of model (bandwidths,
 * NICs, latency, chunk; its host map is ignored) instead of the XMESH_*
 * environment; model == NULL is the public call (api.c). */
xmesh_result_t xm_suggest_order(const xmesh_placement_problem_t *pb, const xm_cluster_t *model,
                                int *suggested_ranks, xmesh_placement_info_t *info);

#endif /* XM_API_H */
