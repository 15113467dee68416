/*
 * The U-Transformer's pipeline stage behind the trainer's stage callbacks (apps/ut_stage.c),
 * private to `xmesh-train utransformer` (apps/train_utransformer.c: flags, serial model and the
 * adapter). The stage graph and the layout of its tensors: train_utransformer.c's head comment.
 */
#ifndef XMP_APPS_UT_STAGE_H
#define XMP_APPS_UT_STAGE_H

#include <stddef.h>
#include <stdint.h>

#include "models/shapes_data.h"
#include "models/stage_layout.h"
#include "models/utransformer.h"
#include "models/utransformer_sbp.h"
#include "nn/overlap.h"
#include "nn/sbp.h"
#include "pipe/driver.h"

/* The model's own flags, and the common ones its stages read (copied from the trainer's). */
typedef struct {
    int base, groups, head_dim, batch, microbatches;
    int batch_arg; /* --batch; batch and microbatches are per optimizer step (x --grad-accum) */
    float lr, momentum, wd, sigma;
    uint64_t seed;
} ut_opts_t;

enum { T_MAIN = 0, T_SKIP = 1 };

typedef struct {
    int layer, what;               /* tensor: main output or skip output of layer */
    int pos_src, pos_dst;          /* index among the producer's out-edges / consumer's in-edges */
    size_t floats_src, floats_dst; /* local floats on the producer / consumer rank */
} ut_edge_t;

typedef struct {
    /* the driver's progress while it runs a step (set_progress), NULL otherwise */
    void (*progress)(void *arg);
    void *progress_arg;
    const ut_opts_t *o;
    xmp_ut_config_t cfg;
    xmp_ut_params_t lay;
    const xmp_stage_layout_t *sl;
    int stage, first, last, dpi, dp, tp, tpi, nloc, mbs, M;
    long step;
    xmp_mesh_t *mesh;                  /* this stage's mesh (NULL: no stage) */
    xmp_ut_strategy_t strat;           /* per-class SBPs of this stage's mesh */
    xmp_sbp_t edge[XMP_MAX_MESH_DIMS]; /* "S(0),B": the SBP of every stage-graph edge */
    xmp_ut_slayer_t *SL[XMP_UT_LAYERS];
    xmp_shapes_t sh;
    int nedges;
    ut_edge_t e[2 * XMP_UT_LAYERS];
    /* per layer l and micro-batch m (index l*M + m): the tape of its forward (allocated when
     * the micro-batch's forward runs, freed after its weight gradients), the outputs inside it,
     * and the gradients passed between layers of the stage */
    xmp_ut_tape_t **tape;
    const xmp_tensor_t **y, **so;
    xmp_tensor_t *dact, *dskip;
    float **input, **cond, **target; /* per micro-batch, allocated with its forward */
    int *live;                       /* per micro-batch: forward done, weight part not yet */
    int64_t base_bytes;              /* allocations held after set-up (the parameters) */
    int recompute;                   /* xmp_recompute_t (models/utransformer_sbp.h tape drop) */
    int mem_quiet;    /* virtual stages: chunks > 0 report 0 (chunk 0 reports the rank's peak) */
    xmp_overlap_t ov; /* overlap switches (--overlap / XMP_OVERLAP, nn/overlap.h) */
} ut_stage_t;

#define IX(st, l, m) ((size_t)(l) * (size_t)(st)->M + (size_t)(m))

int xmp_uts_build_edges(const xmp_ut_config_t *c, const xmp_stage_layout_t *sl, int mbs,
                        ut_edge_t *e, xmp_edge_cfg_t *ec, xmp_sedge_t *se);
int xmp_uts_data_degree(const xmp_stage_layout_t *sl, int s);
void xmp_uts_mb_free_data(ut_stage_t *st, int mb);
void xmp_uts_free(ut_stage_t *st);
int xmp_uts_init(ut_stage_t *st);
int64_t xmp_uts_act_bytes(void *u);
int xmp_uts_bwd_input(void *u, int mb, const void *const *gout, void *const *gin);
int xmp_uts_bwd_weight(void *u, int mb);
int xmp_uts_fwd(void *u, int mb, const void *const *in, void *const *out, double *loss);
int xmp_uts_opt(void *u);
int xmp_uts_reduce(void *u);
void xmp_uts_set_progress(void *user, void (*fn)(void *arg), void *arg);

#endif /* XMP_APPS_UT_STAGE_H */
