/*
 * The U-Transformer as graphs (nn/graph.h; issue 38 item 1): one layer's op tape
 * (utransformer_plan.h, the tape both executors run) converted to a graph of one image, whose
 * nodes carry their kinds, value shapes and activation classes (the tape's boxing points become
 * XMP_GOP_BOX nodes into "act.x", "act.block", "act.up"; the conditioning tokens are "act.cond";
 * other values have no class) and whose
 * parameters are the layer's tensors under their classes ("conv1.w", "attn.q.w"). The search
 * (search/search_ut.c) prices a layer by the kinds of the nodes its weights feed.
 */
#ifndef XMP_MODELS_UTRANSFORMER_GRAPH_H
#define XMP_MODELS_UTRANSFORMER_GRAPH_H

#include "models/utransformer.h"
#include "nn/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Builds into g (initialized here) layer `layer`'s graph for one image: the layer's input
 * (class act.x), the skip it takes (up layers; act.x) and the conditioning tokens (cross
 * attention; act.cond) are the graph's inputs, in that order. Parameters have layer and group
 * `layer`. Returns 0, or -1 with the message in xmp_last_error() and g freed. */
int xmp_ut_graph(const xmp_ut_config_t *cf, int layer, xmp_graph_t *g);

/* Spatial positions per image of a value: H*W of an image (N, C, H, W), T of tokens (N, T, C). */
int64_t xmp_ut_graph_positions(const xmp_gvalue_t *v);

/* What a layer's graph says about one weight (the search prices it by this): the node it
 * feeds and that node's neighbours. */
typedef struct {
    double pos;     /* output positions per image of the node (its GEMM rows per image) */
    double in_pos;  /* positions of the input whose gradient boxes: an upsampled input's
                     * before the upsampling, else pos */
    int kv;         /* the node makes the keys or values of an attention */
    int query;      /* the node makes the queries (the attention is priced with it) */
    double kv_pos;  /* query: the key/value positions of that attention */
    int paired_out; /* the first of a pair: output into a group norm or an attention */
    int paired_in;  /* the second: input from a SiLU or an attention */
} xmp_ut_wuse_t;

/* Fills *w for the weight of class cls (the node it feeds as operand 1, a conv or a linear);
 * 0, or -1 when no such node is in g. */
int xmp_ut_graph_weight_use(const xmp_graph_t *g, const char *cls, xmp_ut_wuse_t *w);

#ifdef __cplusplus
}
#endif
#endif /* XMP_MODELS_UTRANSFORMER_GRAPH_H */
