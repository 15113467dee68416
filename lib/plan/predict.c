/* xmesh_plan_predict (include/xmesh.h): one boundary priced offline, by the decomposer, a
 * scheduler and the simulator plan creation uses; no context, no MPI. */
#include <stdlib.h>
#include <string.h>

#include "xm_api.h"

/* Checks pb and fills the two layouts (meshes point into pb) and the host map (host_of points
 * into pb). INVALID_ARGUMENT naming the bad field; nothing allocated. */
static xmesh_result_t problem_layouts(const xmesh_placement_problem_t *pb, xm_layout_t L[2],
                                      xm_hostmap_t *hm)
{
    const char *fn = "xmesh_plan_predict";
    if (pb->ndim < 1 || pb->ndim > XM_MAX_DIMS || !pb->shape)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s: ndim %d out of range [1, %d] or no shape",
                      fn, pb->ndim, XM_MAX_DIMS);
    if (!xmesh_dtype_size(pb->dtype))
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s: unknown dtype %d", fn, (int)pb->dtype);
    if (pb->nranks < 1 || !pb->host_of_rank)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s: nranks = %d (must be >= 1 with hosts)", fn,
                      pb->nranks);
    int nhosts = 0;
    for (int i = 0; i < pb->nranks; i++) {
        if (pb->host_of_rank[i] < 0)
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s: host_of_rank[%d] = %d is negative", fn,
                          i, pb->host_of_rank[i]);
        if (pb->host_of_rank[i] >= nhosts)
            nhosts = pb->host_of_rank[i] + 1;
    }
    memset(L, 0, 2 * sizeof *L);
    for (int s = 0; s < 2; s++) {
        int nd = s ? pb->dst_mesh_ndim : pb->src_mesh_ndim;
        const int *shp = s ? pb->dst_mesh_shape : pb->src_mesh_shape;
        const int *rk = s ? pb->dst_ranks : pb->src_ranks;
        const char *spec = s ? pb->dst_sharding : pb->src_sharding;
        const char *which = s ? "destination" : "source";
        if (nd < 1 || nd > XM_MAX_MESH_DIMS || !shp || !rk || !spec)
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                          "%s: %s mesh ndim %d out of range [1, %d] or shape/ranks/sharding NULL",
                          fn, which, nd, XM_MAX_MESH_DIMS);
        xm_layout_t *l = &L[s];
        l->ndim = pb->ndim;
        l->elem_size = xmesh_dtype_size(pb->dtype);
        for (int d = 0; d < pb->ndim; d++) {
            if (pb->shape[d] < 0)
                return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s: shape[%d] = %lld is negative", fn, d,
                              (long long)pb->shape[d]);
            l->shape[d] = pb->shape[d];
        }
        l->mesh.ndim = nd;
        l->mesh.ndev = 1;
        for (int a = 0; a < nd; a++) {
            if (shp[a] < 1 || shp[a] > pb->nranks)
                return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                              "%s: %s mesh shape[%d] = %d must be in [1, nranks %d]", fn, which, a,
                              shp[a], pb->nranks);
            l->mesh.shape[a] = shp[a];
            l->mesh.ndev *= shp[a];
            if (l->mesh.ndev > pb->nranks)
                return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                              "%s: %s mesh has more devices than the %d ranks", fn, which,
                              pb->nranks);
        }
        for (int i = 0; i < l->mesh.ndev; i++) {
            if (rk[i] < 0 || rk[i] >= pb->nranks)
                return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s: %s rank %d outside [0, %d)", fn,
                              which, rk[i], pb->nranks);
            for (int j = 0; j < i; j++)
                if (rk[j] == rk[i])
                    return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                                  "%s: %s rank %d appears twice in the mesh", fn, which, rk[i]);
        }
        l->mesh.devs = rk;
        xmesh_result_t r = xm_spec_parse(spec, pb->ndim, nd, &l->spec);
        if (r)
            return r;
    }
    hm->ndev = pb->nranks;
    hm->nhosts = nhosts;
    hm->host_of = (int *)pb->host_of_rank; /* read only: xm_hostmap_t is plain data */
    return XMESH_SUCCESS;
}

static xmesh_result_t check_model(const xmesh_cluster_model_t *m)
{
    const char *bad = m->nics_per_host < 1     ? "nics_per_host (>= 1)"
                      : !(m->nic_send_Bps > 0) ? "nic_send_Bps (> 0)"
                      : !(m->nic_recv_Bps > 0) ? "nic_recv_Bps (> 0)"
                      : !(m->intra_Bps > 0)    ? "intra_Bps (> 0)"
                      : !(m->latency_s >= 0)   ? "latency_s (>= 0)"
                      : m->chunk_bytes < 1     ? "chunk_bytes (>= 1)"
                      : m->send_ahead < 1      ? "send_ahead (>= 1)"
                                               : NULL;
    if (bad)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xmesh_plan_predict: cluster model field %s",
                      bad);
    return XMESH_SUCCESS;
}

xmesh_result_t xmesh_plan_predict(const xmesh_placement_problem_t *pb,
                                  const xmesh_cluster_model_t *model,
                                  const xmesh_predict_opts_t *opts, xmesh_prediction_t *out)
{
    if (!pb || !opts || !out)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xmesh_plan_predict: %s is NULL",
                      !pb     ? "problem"
                      : !opts ? "opts"
                              : "out");
    if (model && check_model(model))
        return XMESH_ERR_INVALID_ARGUMENT;
    xm_sched_opts_t so;
    memset(&so, 0, sizeof so);
    xmesh_result_t r;
    if (opts->scheduler == XMESH_SCHEDULER_UNSET) {
        if ((r = xmesh_scheduler_parse(xm_param_scheduler(), &so.kind)))
            return XM_ERR(r, "XMESH_SCHEDULER: %s", xmesh_last_error());
    } else if ((unsigned)opts->scheduler >= XMESH_SCHEDULER_COUNT_) {
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xmesh_plan_predict: scheduler %d unknown",
                      (int)opts->scheduler);
    } else {
        so.kind = opts->scheduler;
    }
    if (opts->strategy != XMESH_STRATEGY_BROADCAST && opts->strategy != XMESH_STRATEGY_SENDRECV)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                      "xmesh_plan_predict: strategy %d: broadcast or sendrecv (the all-gather "
                      "strategies are priced by their own model, not a schedule)",
                      (int)opts->strategy);
    if (opts->max_evals < 0)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xmesh_plan_predict: max_evals %lld < 0",
                      (long long)opts->max_evals);
    so.strategy = opts->strategy;
    so.seed = opts->seed;
    so.max_evals = opts->max_evals;
    so.budget_us = xm_param_budget_us();
    xm_layout_t L[2];
    xm_hostmap_t hm;
    if ((r = problem_layouts(pb, L, &hm)))
        return r;
    xm_taskset_t ts;
    if ((r = xm_decompose(&L[0], &L[1], &hm, &ts)))
        return r;
    xm_cluster_t cl;
    if (model) {
        if ((r = xm_cluster_init(&cl, &hm)))
            goto out_ts;
        cl.nics_per_host = model->nics_per_host;
        cl.nic_send_Bps = model->nic_send_Bps;
        cl.nic_recv_Bps = model->nic_recv_Bps;
        cl.intra_Bps = model->intra_Bps;
        cl.latency_s = model->latency_s;
        cl.chunk_bytes = model->chunk_bytes;
        cl.send_ahead = model->send_ahead;
    } else if ((r = xm_cluster_from_env(&cl, &hm, xm_param_chunk_bytes()))) {
        goto out_ts;
    }
    xm_schedule_t sch;
    if ((r = xm_schedule(&ts, &cl, &so, &sch)))
        goto out_cl;
    memset(out, 0, sizeof *out);
    out->predicted_s = sch.makespan_s;
    out->lower_bound_s = sch.lower_bound_s;
    out->bytes_total = ts.bytes_total;
    out->bytes_cross_host = ts.bytes_cross_host;
    xm_schedule_free(&sch);
out_cl:
    xm_cluster_free(&cl);
out_ts:
    xm_taskset_free(&ts);
    return r;
}
