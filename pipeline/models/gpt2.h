/*
 * GPT-2 in llm.c's layout and semantics (karpathy/llm.c, train_gpt2.c), serial version.
 *
 * Parameters live in ONE contiguous f32 buffer, 16 tensors in llm.c order (table below);
 * per-layer tensors are stacked over layers (leading dimension L). Linear weights are stored
 * (OC, C) and applied as out = in . W^T + b. The token embedding wte is (Vp, C) with the
 * padded vocabulary Vp >= V and is tied to the output projection (logits = lnf . wte^T).
 *
 * Errors: functions returning int give 0 on success and -1 on error; the message (naming the
 * file / field / value) is then in xmp_last_error() (models/llmc_io.h), and outputs are
 * left untouched.
 */
#ifndef XMP_MODELS_GPT2_H
#define XMP_MODELS_GPT2_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int max_seq_len;       /* maxT, rows of wpe */
    int vocab_size;        /* V, real vocabulary */
    int padded_vocab_size; /* Vp >= V, rows of wte (llm.c pads to a multiple of 128) */
    int num_layers;        /* L */
    int num_heads;         /* NH, must divide channels */
    int channels;          /* C */
} xmp_gpt2_config_t;

/* Parameter tensors, llm.c order. */
enum {
    XMP_GPT2_WTE = 0,  /* (Vp, C) */
    XMP_GPT2_WPE,      /* (maxT, C) */
    XMP_GPT2_LN1W,     /* (L, C) */
    XMP_GPT2_LN1B,     /* (L, C) */
    XMP_GPT2_QKVW,     /* (L, 3C, C) */
    XMP_GPT2_QKVB,     /* (L, 3C) */
    XMP_GPT2_ATTPROJW, /* (L, C, C) */
    XMP_GPT2_ATTPROJB, /* (L, C) */
    XMP_GPT2_LN2W,     /* (L, C) */
    XMP_GPT2_LN2B,     /* (L, C) */
    XMP_GPT2_FCW,      /* (L, 4C, C) */
    XMP_GPT2_FCB,      /* (L, 4C) */
    XMP_GPT2_FCPROJW,  /* (L, C, 4C) */
    XMP_GPT2_FCPROJB,  /* (L, C) */
    XMP_GPT2_LNFW,     /* (C) */
    XMP_GPT2_LNFB,     /* (C) */
    XMP_GPT2_NUM_PARAM_TENSORS
};

typedef struct {
    const char *name; /* llm.c field name: "wte", "wpe", "ln1w", ... */
    int ndim;         /* 1..3 */
    size_t shape[3];  /* unused trailing entries are 0 */
    size_t numel;
    size_t offset; /* in floats, into the contiguous parameter buffer */
    int per_layer; /* 1 if shape[0] == L (stacked per-layer tensor) */
} xmp_gpt2_param_info_t;

/* Smallest multiple of `multiple` >= V (llm.c uses 128). */
int xmp_gpt2_pad_vocab(int V, int multiple);
/* Validates a config (positive sizes, Vp >= V, NH divides C, sizes that fit). */
int xmp_gpt2_config_check(const xmp_gpt2_config_t *cfg);
/* Fills the 16-entry table (names, shapes, offsets) and *total (floats). Needs a valid cfg. */
int xmp_gpt2_param_table(const xmp_gpt2_config_t *cfg,
                         xmp_gpt2_param_info_t table[XMP_GPT2_NUM_PARAM_TENSORS], size_t *total);

/* Fresh GPT-2 init of the FULL tensor `idx` into dst (table[idx].numel floats):
 *   weights of wte (real rows < V), wpe, qkvw, fcw: normal(0, 0.02);
 *   attprojw, fcprojw: normal(0, 0.02/sqrt(2L));  padded wte rows [V, Vp): 0;
 *   all biases: 0;  layernorm weights: 1.
 * Element i of tensor idx is 0.02*scale*xmp_normal_at(seed, idx, i) (nn/kernels.h), so a
 * sharded model can produce any slice by itself (or generate the full tensor and slice it)
 * and gets the same values as the serial model. */
void xmp_gpt2_init_tensor(const xmp_gpt2_config_t *cfg, int idx, uint64_t seed, float *dst);

/* The serial model. Fields are public so tests and later parallel code can look inside;
 * treat them as read-only outside this module except params/grads contents. */
typedef struct {
    xmp_gpt2_config_t cfg;
    xmp_gpt2_param_info_t ptab[XMP_GPT2_NUM_PARAM_TENSORS];
    size_t num_params;
    float *params; /* num_params floats */
    float *grads;  /* num_params floats, allocated with the activations */
    float *m, *v;  /* AdamW moments, allocated on first update */
    /* activations for the (B, T) of the first forward */
    int B, T;
    float *acts, *dacts;
    size_t num_acts;
    int *inputs, *targets; /* copies of the last forward's tokens (B*T each) */
    float *work;           /* attention backward scratch, T floats */
    float mean_loss;       /* mean over B*T of the last forward with targets; -1 otherwise */
    int have_targets;
} xmp_gpt2_t;

/* Fresh model from cfg with GPT-2 init (see xmp_gpt2_init_tensor). On error *m untouched. */
int xmp_gpt2_init_random(xmp_gpt2_t *m, const xmp_gpt2_config_t *cfg, uint64_t seed);
/* Model from an llm.c checkpoint (v3 f32, or v1 f32 without padding: Vp = V). */
int xmp_gpt2_load(xmp_gpt2_t *m, const char *path);
/* Writes an llm.c v3 checkpoint (atomically: temp file then rename). */
int xmp_gpt2_save(const xmp_gpt2_t *m, const char *path);
/* Frees everything; accepts a zeroed or already freed model. */
void xmp_gpt2_free(xmp_gpt2_t *m);

/* Forward over inputs (B,T) and optional targets (B,T) (NULL: no loss). Activations are
 * allocated on the first call; later calls must use the same B and T. Tokens must be in
 * [0, V) and T <= maxT. Loss = mean over B*T of -log softmax(logits[:V])[target]. */
int xmp_gpt2_forward(xmp_gpt2_t *m, const int *inputs, const int *targets, int B, int T);
/* The logits (B*T rows of Vp) of the last forward, or NULL before any forward (sampling). */
const float *xmp_gpt2_logits(const xmp_gpt2_t *m);
/* grads = 0 and activation gradients = 0. */
void xmp_gpt2_zero_grad(xmp_gpt2_t *m);
/* Accumulates d(mean loss)/d(params) into grads; needs a forward with targets first. */
int xmp_gpt2_backward(xmp_gpt2_t *m);
/* AdamW over all parameters (llm.c: t = step+1). */
int xmp_gpt2_update(xmp_gpt2_t *m, float lr, float beta1, float beta2, float eps,
                    float weight_decay, int t);

/* Floats of activation memory for (B, T) (what the forward will allocate, x2 with grads). */
size_t xmp_gpt2_activation_floats(const xmp_gpt2_config_t *cfg, int B, int T);

#ifdef __cplusplus
}
#endif
#endif /* XMP_MODELS_GPT2_H */
