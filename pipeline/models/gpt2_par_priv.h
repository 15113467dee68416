/* Private to pipeline/models: the GPT-2 pipeline stage's state, shared between gpt2_par.c
 * (state, lifecycle, checkpoints), gpt2_par_strategy.c (built-in strategies, check) and
 * gpt2_par_step.c (forward, backward, reduction, optimizer). Never installed. */
#ifndef XMP_MODELS_GPT2_PAR_PRIV_H
#define XMP_MODELS_GPT2_PAR_PRIV_H

#include <stdint.h>

#include "models/gpt2_graph.h"
#include "models/gpt2_par.h"
#include "nn/graph_exec.h"
#include "nn/kernels.h"
#include "nn/overlap.h"
#include "nn/param.h"
#include "nn/sbp_layers.h"

#define NPT XMP_GPT2_NUM_PARAM_TENSORS
#define NAX XMP_MAX_MESH_DIMS

/* Parameter classes in llm.c order (index = XMP_GPT2_*). (gpt2_par.c) */
extern const char *const xmp_gpt2__pclass[NPT];

enum { A_X, A_LN1, A_QKV, A_ATT, A_LN2, A_FCH, A_GELU, A_LNF, A_LOGITS, NACT };
/* Activation classes (index = A_*). (gpt2_par.c) */
extern const char *const xmp_gpt2__aclass[NACT];

/* One parameter tensor of this stage (one layer's slice of a stacked tensor), kept by the
 * shared engine (nn/param.h): P.w the compute copy (the strategy's compute SBP), P.g the
 * gradient accumulator (w's SBP where S, P where B), P.r the step's reduced gradient (storage
 * SBP, made in R), P.s the stored shard when the storage SBP differs (P.sharded), P.state[0..1]
 * the AdamW moments of the stored copy, P.pre the prefetched gather (xmp_gpt2__cb_optimizer only).
 */
typedef struct {
    int id, layer; /* XMP_GPT2_*, layer (-1: not per layer) */
    xmp_param_t P;
} par_t;

/* One microbatch: the graph executor's values (the stage's input, the blocks' and the head's
 * activations, the logits' gradient; nn/graph_exec.h) and queued weight GEMMs, the tokens. */
typedef struct {
    int live;
    xmp_gexec_mb_t x;
    xmp_tensor_t tok;
    int64_t bytes;
} mb_t;

struct xmp_gpt2_stage {
    MPI_Comm comm;
    /* the model (gpt2_graph.h; every block, microbatches of Bm x T): the parameters' shapes,
     * run by the executor ex with its class SBPs vcls (per value) and parameter indexes gpmap
     * (per graph parameter: index in p, -1 when not on this stage); blo: first node of
     * block k (nl + 1 entries); hlo: the head's first node (layernorm, tied linear, cross
     * entropy); v_in, v_out: the stage's input and output values; g_wte. */
    xmp_graph_t graph;
    xmp_gexec_t ex;
    const xmp_sbp_t **vcls;
    int *gpmap, *blo;
    int hlo, v_in, v_out, g_wte;
    /* the driver's progress while it runs a step (set_progress), NULL otherwise */
    void (*progress)(void *arg);
    void *progress_arg;
    int rank, size;
    xmesh_ctx_t ctx;
    xmp_gpt2_config_t cfg;
    xmp_gpt2_train_cfg_t tc;
    xmp_stage_layout_t lay;
    xmp_mesh_t *meshes[XMP_MAX_STAGES];
    char xspec[XMP_MAX_STAGES][64]; /* act.x of each stage: the boundary tensor */
    char wspec[XMP_MAX_STAGES][64]; /* wte's storage SBP of each stage (tied copies) */
    int *ranks;                     /* all stage ranks, stage after stage */
    int stage, Bm, nax, msize;
    xmp_mesh_t *mesh;
    xmp_sbp_t psbp[NPT][NAX];   /* this stage's compute SBP per parameter class */
    xmp_sbp_t pstore[NPT][NAX]; /* storage SBP (== psbp unless the strategy says 'store') */
    xmp_sbp_t act[NACT][NAX];   /* this stage's SBP per activation class */
    int has_e, has_l, l0, nl;   /* blocks l0 .. l0+nl-1 */
    par_t *p;
    int np;
    int *pidx; /* (id, layer+1) -> index in p, or -1 */
    mb_t *mb;
    const int *inputs, *targets;
    int step;
    xmp_gpt2_stage_times_t times;
    double comm0;
    /* tied wte across the first and last stage */
    int tie_first, tie_last;
    xmesh_plan_t tie_fl, tie_lf;
    int64_t edge_shape[3];
    /* Virtual stages: the other tied stage when this rank also holds it (V shape), and
     * whether this stage's gradients of the step are reduced (the exchange runs after both). */
    xmp_gpt2_stage_t *tie_peer;
    int reduced;
    xmp_overlap_t ov; /* overlap switches (XMP_OVERLAP, nn/overlap.h) */
    /* The object whose tied-wte plans this one uses: itself, or with several objects per rank
     * the first (every rank's first create made the same plans, matching across groups). */
    xmp_gpt2_stage_t *tie_plans;
    /* sampling: logits of row 0 at position cap_pos of microbatch 0 (-1: off) */
    int cap_pos, cap_ok;
    float *cap;
};

/* The tensor AdamW updates: the stored shard, or the compute copy. (gpt2_par.c) */
xmp_tensor_t *xmp_gpt2__stored(par_t *q);

/* Lets queued boundary transfers move between layers (the driver's progress, when given).
 * (gpt2_par.c) */
void xmp_gpt2__progress(const xmp_gpt2_stage_t *st);

/* Index in st->p of parameter id (XMP_GPT2_*) of layer (-1: not per layer), or -1 when
 * this stage does not hold it. (gpt2_par.c) */
int xmp_gpt2__pindex(const xmp_gpt2_stage_t *st, int id, int layer);

/* The compute copy of parameter id of layer on this stage (pindex must find it).
 * (gpt2_par.c) */
const xmp_tensor_t *xmp_gpt2__PT(const xmp_gpt2_stage_t *st, int id, int layer);

/* Sets up the graph executor of the stage (st->ex, its tables, every microbatch's arrays);
 * 0 or -1 with the error set. (gpt2_par_step.c) */
int xmp_gpt2__exec_init(xmp_gpt2_stage_t *st);

/* Frees microbatch m's saved activations and queued weight-gradient tensors; m is left
 * not live, its arrays kept. (gpt2_par_step.c) */
void xmp_gpt2__mb_free(xmp_gpt2_stage_t *st, mb_t *m);

/* Bytes of t's local elements (f32). (gpt2_par_step.c) */
int64_t xmp_gpt2__tbytes(const xmp_tensor_t *t);

/* The driver's callbacks (xmp_stage_ops_t, user: the stage): forward, backward of the
 * input, queued weight gradients, gradient reduction, optimizer step, progress hook and
 * activation bytes held. 0 or -1 with the error set. (gpt2_par_step.c) */
int xmp_gpt2__cb_forward(void *user, int mbi, const void *const *in, void *const *out,
                         double *loss);

int xmp_gpt2__cb_backward_input(void *user, int mbi, const void *const *gout, void *const *gin);

int xmp_gpt2__cb_backward_weight(void *user, int mbi);

int xmp_gpt2__cb_reduce(void *user);

int xmp_gpt2__cb_optimizer(void *user);

void xmp_gpt2__cb_set_progress(void *user, void (*fn)(void *arg), void *arg);

int64_t xmp_gpt2__cb_act_bytes(void *user);

#endif
