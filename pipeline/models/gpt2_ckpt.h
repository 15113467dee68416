/*
 * GPT-2 stages (models/gpt2_par.h) in distributed checkpoints (ckpt/ckpt.h).
 *
 * Tensors, named independently of the layout (so a checkpoint of 2 stages
 * loads into 3, of 4 ranks into 2 or 8, of one strategy into another): per
 * parameter "wte", "wpe", "lnf.w", "lnf.b", "h.<global layer>.<class>"
 * ("h.3.qkv.w"; classes ln1.w ln1.b qkv.w qkv.b attproj.w attproj.b ln2.w
 * ln2.b fc.w fc.b fcproj.w fcproj.b) in its stored layout (storage SBP where
 * the strategy shards it), and its AdamW moments "<name>.adam_m",
 * "<name>.adam_v" in the same layout. Shapes: qkv.w (3, NH, hs, C), qkv.b
 * (3, NH, hs) (llm.c's (3C, C) and (3C) in the same byte order), the others
 * as llm.c's per-layer slices. A tied wte held by different first and last
 * stages is saved once (the first stage's copy; both are bitwise equal) and
 * loaded into both.
 *
 * Metadata: model = gpt2; config.max_seq_len, config.vocab_size,
 * config.padded_vocab_size, config.num_layers, config.num_heads,
 * config.channels; adamw.lr, adamw.beta1, adamw.beta2, adamw.eps,
 * adamw.weight_decay (%.17g), adamw.t (AdamW updates done = the step);
 * train.batch, train.seq; layout (informational); plus the caller's entries
 * (the trainer adds data.*, rng.*, seed).
 *
 * Resume: xmp_gpt2_ckpt_open reads the settings (the caller builds the
 * stages in the NEW layout from them), xmp_gpt2_ckpt_load loads into them
 * with XMP_CKPT_STRICT and the model configuration as expected metadata.
 */
#ifndef XMP_MODELS_GPT2_CKPT_H
#define XMP_MODELS_GPT2_CKPT_H

#include <mpi.h>
#include <stdint.h>

#include "ckpt/ckpt.h"
#include "models/gpt2_par.h"

#ifdef __cplusplus
extern "C" {
#endif

#define XMP_GPT2_CKPT_MODEL "gpt2"

/* What a GPT-2 checkpoint says about the run that wrote it. */
typedef struct {
    xmp_gpt2_config_t cfg;
    float lr, beta1, beta2, eps, wd;
    int batch, seq;
    int64_t step; /* completed steps: the resumed run starts at this step */
} xmp_gpt2_ckpt_settings_t;

/* The metadata entries of stage st at step (model, config.*, adamw.*, train.*, layout)
 * appended to *m (xmp_ckpt_metalist_setf). */
xmesh_result_t xmp_gpt2_ckpt_meta(const xmp_gpt2_stage_t *st, int64_t step, xmp_ckpt_metalist_t *m);

/* Collective over comm (the comm the stages were created over): saves every rank's
 * parameters and AdamW moments as ROOT/step-<step> (xmp_ckpt_save), with the metadata
 * above followed by extra (nextra entries, e.g. data position and RNG states), keeping the
 * `keep` newest steps. Errors: xmesh_result_t, xmp_last_error() naming tensor / file. */
xmesh_result_t xmp_gpt2_ckpt_save(xmp_gpt2_stage_t *st, MPI_Comm comm, const char *root,
                                  int64_t step, int keep, const xmp_ckpt_kv_t *extra, int nextra);

/* Collective over comm: opens the checkpoint at path (a step directory, or a ROOT: its
 * latest step) and reads its settings. Refuses a checkpoint of another model ("metadata
 * 'model' is 'X', expected 'gpt2'") or with missing / malformed / invalid configuration
 * fields (naming the manifest and the key). On success *out is owned by the caller
 * (xmp_ckpt_close); on error *out is NULL. */
xmesh_result_t xmp_gpt2_ckpt_open(MPI_Comm comm, const char *path, xmp_ckpt_t **out,
                                  xmp_gpt2_ckpt_settings_t *s);

/* Collective over comm: loads ck into the stages st (built in any layout from the
 * checkpoint's configuration): every tensor of the checkpoint (strict), the model
 * configuration checked against the manifest, both copies of a tied wte; then the compute
 * copies of sharded parameters are gathered again. ctx: the context over comm (xmesh plans
 * move the saved blocks) or NULL (direct reads). Nothing is changed on error. */
xmesh_result_t xmp_gpt2_ckpt_load(xmp_gpt2_stage_t *st, MPI_Comm comm, xmesh_ctx_t ctx,
                                  const xmp_ckpt_t *ck);

/* Offline conversion to / from llm.c files. Collective over comm. to_llmc: every rank
 * opens ck; rank 0 loads each tensor into a one-device layout and writes the llm.c v3 file
 * (xmp_gpt2_save) of the parameters; the AdamW moments are not written (llm.c files hold
 * parameters only). */
xmesh_result_t xmp_gpt2_ckpt_to_llmc(MPI_Comm comm, const xmp_ckpt_t *ck, const char *file);

#ifdef __cplusplus
}
#endif
#endif /* XMP_MODELS_GPT2_CKPT_H */
