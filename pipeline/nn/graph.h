/*
 * One graph per model (issue 38 item 1): a model's forward as a list of nodes, each an nn/ op
 * over values (activations) and parameter tensors, with the classes a strategy names
 * (nn/strategy.h). One description, walked by every user: the strategy checker (the SBP
 * deduction of each node), the search's cost model (each node priced by its kind), and the
 * stage executor (nn/graph_exec.h; GPT-2's blocks).
 *
 * Pure C, no MPI: a graph is plain data built by a model's builder (models/gpt2_graph.c).
 *
 * Ownership: xmp_graph_init() gives an empty graph; the add functions grow its arrays;
 * xmp_graph_free() releases them (a zeroed or freed graph may be freed again). On error an add
 * function returns -1 with the message in xmp_last_error() (nn/error.h) and the graph is as it
 * was.
 */
#ifndef XMP_NN_GRAPH_H
#define XMP_NN_GRAPH_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Node kinds: the nn/ ops the models are made of (fixed values). */
typedef enum {
    XMP_GOP_EMBEDDING = 0, /* tokens x table (+ positions): the encoder of a language model */
    XMP_GOP_LAYERNORM,     /* over the last dim, with weight and bias */
    XMP_GOP_LINEAR,        /* y = x w^T (+ b): x (rows..., K), w (N..., K), y (rows..., N...) */
    XMP_GOP_ATTENTION,     /* causal self-attention: qkv (B, T, 3, NH, hs) -> (B, T, NH*hs) */
    XMP_GOP_GELU,          /* tanh GELU */
    XMP_GOP_ADD,           /* residual sum of two values of one class */
    XMP_GOP_XENT,          /* softmax + cross entropy over the last dim, against targets */
    XMP_GOP_CONV,          /* 2-D convolution (U-Transformer) */
    XMP_GOP_GROUPNORM,     /* group norm (U-Transformer) */
    XMP_GOP_SILU,          /* SiLU (U-Transformer) */
    XMP_GOP_UPSAMPLE,      /* nearest 2x upsampling (U-Transformer) */
    XMP_GOP_CONCAT,        /* channel concatenation of a skip (U-Transformer) */
    XMP_GOP_TOKENS,        /* image (N, C, H, W) -> tokens (N, H*W, C) (U-Transformer) */
    XMP_GOP_UNTOKENS,      /* tokens (N, H*W, C) -> image (N, C, H, W) (U-Transformer) */
    XMP_GOP_BOX,           /* the same tensor under another activation class: a boxing point */
    XMP_GOP_COUNT
} xmp_gop_t;

#define XMP_G_MAXDIM 6
#define XMP_G_MAXIN 4
#define XMP_G_CLS 32
#define XMP_G_SAVE_OUT 0x80 /* xmp_gnode_t.saves: the output is kept for the backward */

/* A value: one activation tensor (global shape, f32). cls is the activation class of the
 * strategies ("act.x"); "" for a value that no strategy names (token ids, a U-Transformer
 * intermediate between two boxing points). */
typedef struct {
    char cls[XMP_G_CLS];
    int nd;
    int64_t dim[XMP_G_MAXDIM];
    int producer; /* node index; -1 for an input of the graph */
} xmp_gvalue_t;

/* A parameter tensor: one layer's slice (global shape), with its class ("qkv.w"). */
typedef struct {
    char cls[XMP_G_CLS];
    int nd;
    int64_t dim[XMP_G_MAXDIM];
    int layer; /* the block it belongs to; -1 for a tensor of the whole model */
    int group; /* the model's item (GPT: embedding, block, head) */
} xmp_gparam_t;

/* An operand: a value (is_param 0) or a parameter (1), by id. */
typedef struct {
    int is_param;
    int id;
} xmp_gref_t;

/* A node: an op with its operands in the order of its SBP deduction rule (nn/sbp_layers.h's
 * xmp_sbp_deduce) and its output value. Parameters that are no operand of the deduction (GPT's
 * positions) belong to the node's group. flops: forward floating-point operations (2 per
 * multiply-add: linear, attention's two products, conv; one per output element for the
 * elementwise ops and normalizations; cross entropy one per logit); bytes: f32 bytes the
 * forward reads (operands; an embedding only the table rows it outputs) and writes. */
typedef struct {
    xmp_gop_t kind;
    const char *rule; /* xmp_sbp_deduce's op name; NULL: not checked */
    char what[96];    /* the node in words, for messages */
    int group, layer;
    int nin;
    xmp_gref_t in[XMP_G_MAXIN];
    int out;
    unsigned saves; /* bit k: operand k kept for the backward; XMP_G_SAVE_OUT: the output */
    double flops, bytes;
} xmp_gnode_t;

typedef struct {
    int nnode, nval, nparam;
    int capnode, capval, capparam;
    xmp_gnode_t *node;
    xmp_gvalue_t *val;
    xmp_gparam_t *param;
} xmp_graph_t;

void xmp_graph_init(xmp_graph_t *g);
void xmp_graph_free(xmp_graph_t *g);

/* Adds a value (producer -1) / a parameter; returns its id or -1. */
int xmp_graph_value(xmp_graph_t *g, const char *cls, int nd, const int64_t *dim);
int xmp_graph_param(xmp_graph_t *g, const char *cls, int nd, const int64_t *dim, int layer,
                    int group);
/* Adds a node of kind over operands in[0..nin-1] producing value out (which gets it as
 * producer), with flops and bytes computed from the shapes (xmp_graph_node_flops). Returns the
 * node id or -1 (an operand or out that does not exist, out already produced, nin > 4). */
int xmp_graph_node(xmp_graph_t *g, xmp_gop_t kind, const char *rule, const char *what, int group,
                   int layer, int nin, const xmp_gref_t *in, int out, unsigned saves);

/* Shape of an operand. */
int xmp_graph_ref_nd(const xmp_graph_t *g, xmp_gref_t r, const int64_t **dim);
const char *xmp_graph_ref_cls(const xmp_graph_t *g, xmp_gref_t r);
/* Name of a kind ("linear"), NULL out of range. */
const char *xmp_gop_name(xmp_gop_t k);

/* Elements of a value / parameter; sums over the graph. */
int64_t xmp_graph_numel(int nd, const int64_t *dim);
int64_t xmp_graph_param_count(const xmp_graph_t *g);
double xmp_graph_flops(const xmp_graph_t *g);

/* The distinct classes in order of first appearance: parameters (params != 0) or values with
 * a class. Writes at most cap pointers (into g) and their dims count in nd (NULL: not
 * wanted); returns how many there are. */
int xmp_graph_classes(const xmp_graph_t *g, int params, const char **cls, int *nd, int cap);

#ifdef __cplusplus
}
#endif
#endif /* XMP_NN_GRAPH_H */
