/*
 * U-Transformer stages (models/utransformer_sbp.h) in distributed checkpoints (ckpt/ckpt.h).
 *
 * Tensors, named independently of the layout: "<layer>.<param>" ("conv_in.conv.w",
 * "down1.attn.q.w") in the strategy's SBP of the stage that holds the layer, and its
 * SGD-Nesterov velocity "<layer>.<param>.momentum" in the same layout. A checkpoint of one stage
 * split, mesh, strategy or rank count loads into any other.
 *
 * Metadata: model = utransformer; config.base, config.groups, config.head_dim,
 * config.cond_dim; sgd.lr, sgd.momentum, sgd.weight_decay (%.17g); train.batch; data.noise;
 * seed (the parameter initialisation and the synthetic data, which is generated from (seed,
 * step, image index): the step is the data position); layout (informational); plus the caller's
 * entries.
 */
#ifndef XMP_MODELS_UTRANS_CKPT_H
#define XMP_MODELS_UTRANS_CKPT_H

#include <mpi.h>
#include <stdint.h>

#include "ckpt/ckpt.h"
#include "models/utransformer_sbp.h"

#ifdef __cplusplus
extern "C" {
#endif

#define XMP_UT_CKPT_MODEL "utransformer"

typedef struct {
    xmp_ut_config_t cfg;
    float lr, momentum, wd, sigma;
    int batch;
    uint64_t seed;
    int64_t step; /* completed steps: the resumed run starts at this step */
} xmp_ut_ckpt_settings_t;

/* Collective over comm (the comm of every stage mesh): saves the layers this rank holds
 * (layers[l] for l in [0, XMP_UT_LAYERS), NULL where this rank has none of layer l) with
 * their velocities as ROOT/step-<step>, metadata from *s (its step is ignored: `step` is
 * saved) followed by extra; keeps the `keep` newest steps. */
xmesh_result_t xmp_ut_ckpt_save(xmp_ut_slayer_t *const *layers, MPI_Comm comm, const char *root,
                                int64_t step, int keep, const xmp_ut_ckpt_settings_t *s,
                                const xmp_ckpt_kv_t *extra, int nextra);

/* Collective over comm: opens path (a step directory or a ROOT) and reads its settings;
 * refuses another model or a missing / malformed field (naming the manifest and the key).
 * *out is owned by the caller (xmp_ckpt_close); NULL on error. */
xmesh_result_t xmp_ut_ckpt_open(MPI_Comm comm, const char *path, xmp_ckpt_t **out,
                                xmp_ut_ckpt_settings_t *s);

/* Collective over comm: loads every tensor of ck (strict) into the layers of this rank
 * (built in any layout from the checkpoint's configuration cfg, which is checked against the
 * manifest). ctx: a context over comm whose meshes the layers use, or NULL (direct reads).
 * Nothing is changed on error. */
xmesh_result_t xmp_ut_ckpt_load(xmp_ut_slayer_t *const *layers, MPI_Comm comm, xmesh_ctx_t ctx,
                                const xmp_ckpt_t *ck, const xmp_ut_config_t *cfg);

#ifdef __cplusplus
}
#endif
#endif /* XMP_MODELS_UTRANS_CKPT_H */
