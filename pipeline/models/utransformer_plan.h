/*
 * Private to models/utransformer*.c: the op tape of one U-Transformer layer, built once by
 * xmp_ut__build and run by two executors: the single-process reference on unet_kernels
 * (utransformer.c, local buffers of n images) and the SBP executor on nn/ tensors
 * (utransformer_sbp.c, global shapes, every op an nn/sbp_conv.h or nn/sbp_ops.h call).
 */
#ifndef XMP_MODELS_UTRANSFORMER_PLAN_H
#define XMP_MODELS_UTRANSFORMER_PLAN_H

#include <stddef.h>

#include "models/utransformer.h"
#include "nn/unet_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* OP_BOX (SBP executor only): boxes in0 to the SBP of activation class cls (the identity in
 * the reference executor). */
enum {
    XMP_UT_OP_CONV,
    XMP_UT_OP_GN,
    XMP_UT_OP_SILU,
    XMP_UT_OP_UP,
    XMP_UT_OP_CONCAT,
    XMP_UT_OP_TOK,
    XMP_UT_OP_UNTOK,
    XMP_UT_OP_LIN,
    XMP_UT_OP_ATTN,
    XMP_UT_OP_ADD,
    XMP_UT_OP_BOX
};

#define XMP_UT_MAX_BUF 64
#define XMP_UT_MAX_OPS 64
#define XMP_UT_MAX_PT 32

/* One parameter tensor of a layer: offset of its full tensor in the layer's parameters. */
typedef struct {
    size_t off, count;
    int ndim;
    int64_t shape[4];
    char name[40]; /* without the layer prefix: "conv1.w", "attn.q.b" (its class) */
} xmp_ut_ptens_t;

typedef struct {
    int kind;
    int in0, in1, in2, out;
    int aux0, aux1;  /* saved non-gradient buffers (GN mean/rstd, attention probs) */
    size_t w, b;     /* layer-relative parameter offsets ((size_t)-1: none) */
    int wi, bi;      /* the same as parameter tensor indices (-1: none) */
    const char *cls; /* OP_BOX: the activation class */
    xmp_unet_conv2d_t conv;
    xmp_unet_attn_t attn;
    int n, c, c2, hw, g, h, wd; /* sizes for the simple ops */
} xmp_ut_op_t;

typedef struct {
    int nbuf, nops;
    size_t bufsz[XMP_UT_MAX_BUF];
    unsigned char nograd[XMP_UT_MAX_BUF];
    xmp_ut_op_t ops[XMP_UT_MAX_OPS];
    int in, skip_in, cond, out, skip_out; /* buffer indices, -1 if absent */
    size_t col_floats, attn_scratch;
    int npt;
    xmp_ut_ptens_t pt[XMP_UT_MAX_PT];
    size_t pfloats; /* parameter floats of the layer */
} xmp_ut_plan_t;

/* Builds layer `layer`'s tape for n images (sbp: also emit the OP_BOX ops at the activation
 * class points); registers its parameters in pp when pp != NULL. 0 or -1 (message set). */
int xmp_ut__build(const xmp_ut_config_t *cf, int layer, int n, int sbp, xmp_ut_plan_t *pl,
                  xmp_ut_params_t *pp);
int xmp_ut__fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#ifdef __cplusplus
}
#endif
#endif /* XMP_MODELS_UTRANSFORMER_PLAN_H */
