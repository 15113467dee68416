/*
 * Re-planning a pipeline schedule with measured costs, shared by xmesh-train gpt and
 * xmesh-train utransformer (--delay-wgrad).
 *
 * A schedule generated before the first step places deferred weight-gradient (W) work with
 * unit costs and no transfer time. After the first step the commands know each stage's measured
 * per-microbatch F, I and W seconds and xmesh's predicted transfer seconds; xmp_pipe_replan()
 * regenerates the schedule with them (the means over stages of F, I, W, the given transfer
 * time, at most nstages microbatches of pending W: ZB-H1's memory rule), so that W actions fill
 * the waits the transfers cause, and recreates the driver with the new schedule.
 */
#ifndef XMP_PIPE_REPLAN_H
#define XMP_PIPE_REPLAN_H

#include <stddef.h>

#include "pipe/driver.h"
#include "sched/schedule.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int kind;                  /* xmp_sched_kind_t of the current schedule */
    int nmb;                   /* microbatches */
    int nedges;                /* stage-graph edges (== dc->nedges) */
    const xmp_sedge_t *sedges; /* nedges */
    const double *f, *i, *w;   /* per stage (dc->nstages): measured seconds per microbatch */
    double xfer;               /* transfer seconds used to place W */
    int print;                 /* rank 0 of dc->comm prints the costs and the new schedule */
    /* Memory cap (xmp_gen_opts_t's fields; max_act_bytes 0: none): > 0 re-plans under the same
     * cap with the same memory model, so the re-planned schedule keeps the modelled peak under
     * it (recomputation from the current schedule's mode upwards). */
    double max_act_bytes;
    const double *act_bytes, *ckpt_bytes, *base_bytes;
    double selective_keep;
} xmp_replan_t;

/* The generator options a re-plan uses (pure): weight-gradient delay, the means over the
 * nstages stages of rp's F, I and W, rp's transfer time, at most nstages pending W, and rp's
 * memory cap. Recomputation is left off (xmp_pipe_replan keeps the current schedule's). */
void xmp_pipe_replan_opts(const xmp_replan_t *rp, int nstages, xmp_gen_opts_t *go);

/* Collective over dc->comm. Generates the new schedule; on success destroys *drv and *sched,
 * creates the driver from dc with the new schedule (dc->sched is set to it) and returns
 * XMESH_SUCCESS with *sched and *drv replaced. Errors (nn/'s convention: xmp_err, message in
 * xmp_last_error(), "re-planning the schedule: ..." or "pipeline driver (re-planned): ..."):
 * generation fails (nothing changed), or the new driver cannot be created (then *drv is NULL,
 * the old schedule is kept in *sched). */
xmesh_result_t xmp_pipe_replan(const xmp_replan_t *rp, xmp_driver_cfg_t *dc, xmp_schedule_t **sched,
                               xmp_driver_t **drv);

#ifdef __cplusplus
}
#endif
#endif /* XMP_PIPE_REPLAN_H */
