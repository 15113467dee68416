/*
 * GPT-2 as pipeline stages of SBP-parallel layers (issues 10 and 11).
 *
 * A stage holds a contiguous range of the model's layers ('E' embedding,
 * 't' transformer blocks, 'L' final norm + tied head + loss; see
 * models/stage_layout.h) on a dp x tp mesh (axis 0 data parallel, axis 1
 * tensor parallel). One stage on one mesh is plain DP / TP / DP x TP
 * training; several stages are a pipeline run by pipe/driver.h.
 *
 * SBP per tensor, on (dp axis, tp axis) (OneFlow notation, nn/sbp.h):
 *   activations (Bm, T, C) residual stream        S(0), B
 *   qkvw viewed (3, C, C), qkvb (3, C)            B, S(1)   column split by heads
 *   attention output (Bm, T, C)                   S(0), S(2) local heads only
 *   attprojw (C, C)                               B, S(1)   row split -> output P,
 *                                                           residual add boxes P -> B
 *   fcw (4C, C), fcb (4C)                         B, S(0)   column split
 *   fcprojw (C, 4C)                               B, S(1)   row split -> P -> B
 *   wte (Vp, C)                                   B, S(0)   vocabulary split: the
 *        embedding gives P (boxed to B), the head gives logits S(2) for the
 *        vocabulary-parallel cross-entropy
 *   wpe, layernorm weights, attprojb, fcprojb     B, B
 *   parameter gradients                           P over dp (boxed P -> B in R)
 * Tensor parallelism needs heads % tp == 0 (refused otherwise, naming both).
 * The boundary tensor between stages is the residual stream, "S(0),B" on
 * both meshes: meshes of different shapes make it a real resharding.
 *
 * Every rank of a stage reads the same batches (same loader, same seed);
 * microbatch m is rows [m*Bm, (m+1)*Bm) of the batch. Loss and gradients are
 * scaled by Bm/B so the step computes the serial model's mean loss over B*T.
 * Tied wte on different first and last stages: both keep a copy; in R the
 * two copies' gradients are exchanged with two xmesh plans and each side
 * adds the other's, so both apply the same AdamW update (IEEE addition is
 * commutative, the copies stay bitwise equal).
 */
#ifndef XMP_MODELS_GPT2_PAR_H
#define XMP_MODELS_GPT2_PAR_H

#include <mpi.h>

#include "models/gpt2.h"
#include "models/stage_layout.h"
#include "nn/sbp.h"
#include "pipe/driver.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct xmp_gpt2_stage xmp_gpt2_stage_t;

typedef struct {
    int B, T, M;                     /* batch, sequence, microbatches */
    float lr, beta1, beta2, eps, wd; /* AdamW (llm.c semantics) */
} xmp_gpt2_train_cfg_t;

/* Collective over comm (every rank, also ranks in no stage). full: the full
 * model (serial struct, params filled) every rank holds the same of; each
 * stage slices its parameters from it. Creates the stage meshes (all of
 * them, with xmesh meshes over ctx) and, when the first and last stages
 * differ, the two plans of the tied wte. On error returns -1 with a message
 * in err (the same on every rank for argument errors). */
int xmp_gpt2_stage_create(MPI_Comm comm, xmesh_ctx_t ctx, const xmp_gpt2_t *full,
                          const xmp_stage_layout_t *layout, const xmp_gpt2_train_cfg_t *tc,
                          xmp_gpt2_stage_t **out, char *err, size_t errlen);
/* Collective; NULL is a no-op. */
void xmp_gpt2_stage_destroy(xmp_gpt2_stage_t *st);

/* Stage of this rank (-1: none), and the driver callbacks of this stage. */
int xmp_gpt2_stage_index(const xmp_gpt2_stage_t *st);
xmp_stage_ops_t xmp_gpt2_stage_ops(xmp_gpt2_stage_t *st);
/* The edges of the stage graph (chain s -> s+1): n edges written to edges,
 * returned; shapes/specs point into st. */
int xmp_gpt2_stage_edges(const xmp_gpt2_stage_t *st, xmp_edge_cfg_t *edges, xmp_sedge_t *sedges);
/* The stage meshes for the driver (nstages entries). */
void xmp_gpt2_stage_meshes(const xmp_gpt2_stage_t *st, xmp_stage_mesh_t *meshes);

/* Before each step: the batch (B*T inputs and targets, the same on every
 * rank) and the 0-based step (AdamW uses t = step + 1). The pointers must
 * stay valid during the step. */
void xmp_gpt2_stage_set_batch(xmp_gpt2_stage_t *st, const int *inputs, const int *targets,
                              int step);

/* Per-step timing of this rank: seconds in F, I and W callbacks (and per
 * microbatch means), and in boxing collectives; reset by set_batch. */
typedef struct {
    double f_s, i_s, w_s, r_s, o_s; /* totals over the step */
    int nf, ni, nw;                 /* callback counts */
    double comm_s;                  /* inside boxing / SBP collectives (all callbacks) */
} xmp_gpt2_stage_times_t;
void xmp_gpt2_stage_times(const xmp_gpt2_stage_t *st, xmp_gpt2_stage_times_t *t);

/* Collective: gathers every parameter to global rank 0 of comm, which
 * writes the parameters into full->params (others: full untouched). */
int xmp_gpt2_stage_gather(xmp_gpt2_stage_t *st, xmp_gpt2_t *full);

/* Collective over comm: xmesh's predicted time (xmesh_plan_get_info's
 * predicted_s) of one boundary activation transfer stage s -> s+1, from a
 * plan created and destroyed here; 0 when there is one stage. */
double xmp_gpt2_stage_edge_seconds(xmp_gpt2_stage_t *st, int s, int mode_strategy);

/* Bytes of activations this rank holds now. */
int64_t xmp_gpt2_stage_activation_bytes(const xmp_gpt2_stage_t *st);

#ifdef __cplusplus
}
#endif
#endif /* XMP_MODELS_GPT2_PAR_H */
