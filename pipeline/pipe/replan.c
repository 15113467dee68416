/* Re-planning with measured costs: see replan.h. */
#include "pipe/replan.h"

#include <stdio.h>

#include "nn/sbp.h"
#include <string.h>

void xmp_pipe_replan_opts(const xmp_replan_t *rp, int nstages, xmp_gen_opts_t *go)
{
    const int S = nstages;
    memset(go, 0, sizeof *go);
    go->delay_wgrad = 1;
    go->max_pending_w = S;
    for (int k = 0; k < S; k++) {
        go->f += rp->f[k] / S;
        go->i += rp->i[k] / S;
        go->w += rp->w[k] / S;
    }
    go->xfer = rp->xfer;
    go->max_act_bytes = rp->max_act_bytes;
    go->act_bytes = rp->act_bytes;
    go->ckpt_bytes = rp->ckpt_bytes;
    go->base_bytes = rp->base_bytes;
    go->selective_keep = rp->selective_keep;
}

xmesh_result_t xmp_pipe_replan(const xmp_replan_t *rp, xmp_driver_cfg_t *dc, xmp_schedule_t **sched,
                               xmp_driver_t **drv)
{
    const int S = dc->nstages;
    int rank = 0;
    MPI_Comm_rank(dc->comm, &rank);
    xmp_gen_opts_t go;
    xmp_pipe_replan_opts(rp, S, &go);
    char msg[512];
    xmp_schedule_t *ns = NULL;
    xmp_driver_t *nd = NULL;
    go.recompute = (*sched)->recompute; /* keep the stage -> group map and recomputation */
    go.recompute_frac = (*sched)->recompute_frac;
    if (xmp_sched_generate_map(rp->kind, S, (*sched)->ngroups, (*sched)->stage_group, rp->nmb,
                               rp->nedges, rp->sedges, &go, &ns, msg, sizeof msg) != 0) {
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "re-planning the schedule: %s", msg);
    }
    xmp_driver_destroy(*drv);
    *drv = NULL;
    dc->sched = ns;
    xmesh_result_t r = xmp_driver_create(dc, &nd, msg, sizeof msg);
    if (r != XMESH_SUCCESS) {
        dc->sched = *sched;
        xmp_sched_destroy(ns);
        return xmp_err(r, "pipeline driver (re-planned): %s", msg);
    }
    xmp_sched_destroy(*sched);
    *sched = ns;
    *drv = nd;
    if (rp->print && rank == 0) {
        printf("# re-planned with measured costs f %.4f i %.4f w %.4f s, transfer %.4f s:\n", go.f,
               go.i, go.w, go.xfer);
        xmp_sched_fprint(ns, stdout);
    }
    return XMESH_SUCCESS;
}
