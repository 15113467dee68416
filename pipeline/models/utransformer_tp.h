/*
 * SBP boxing for the U-Transformer's tensor-parallel stages (models/utransformer.h,
 * xmp_ut_tp_t): a stage runs on a dp x tp mesh (nn/sbp.h, axis 0 data parallel, axis 1 tensor
 * parallel). Both functions describe a rank's local buffer as its block of a global SBP tensor
 * and box it with xmp_box (nn/boxing.c), so the collectives are the SBP layer's, timed in
 * xmp_comm_seconds().
 */
#ifndef XMP_MODELS_UTRANSFORMER_TP_H
#define XMP_MODELS_UTRANSFORMER_TP_H

#include <stddef.h>

#include "nn/sbp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* xmp_ut_tp_t.box_p_to_b for a stage mesh (user: the xmp_mesh_t *, 2-D dp x tp): buf is this
 * rank's block of a global tensor (dp * count floats) with SBP "S(0),P" (activations split
 * over dp, partial over tp); boxed to "S(0),B" in place. Collective over the mesh's tp axis.
 * Returns 0, or -1 (xmp_last_error() says why; buf unchanged). */
int xmp_ut_tp_box_p_to_b(void *mesh, float *buf, size_t count);

/* xmp_ut_tp_t.gather_channels for a stage mesh (user: the xmp_mesh_t *): local (n, c/tp, hw) is
 * this rank's block of a global (dp * n, c, hw) tensor "S(0),S(1)", boxed to "S(0),B" into full
 * (n, c, hw). Collective over the tp axis. 0 or -1 (full unchanged). */
int xmp_ut_tp_gather_channels(void *mesh, const float *local, float *full, int n, int c, int hw);

/* Data-parallel gradient reduction of a stage: grads (count floats: this rank's local
 * parameter gradients, the same count on every rank of the mesh) is its block of a global
 * tensor of tp * count floats with SBP "P,S(0)" (partial over dp, each tp rank its own blocks),
 * boxed to "B,S(0)" in place. Collective over the mesh's dp axis. 0 or -1. */
int xmp_ut_dp_reduce(xmp_mesh_t *mesh, float *grads, size_t count);

#ifdef __cplusplus
}
#endif
#endif /* XMP_MODELS_UTRANSFORMER_TP_H */
