/*
 * GPT-2 as one graph (nn/graph.h; issue 38 item 1): the model the stage executor runs
 * (gpt2_par.c), the strategy checker validates (xmp_gpt2_strategy_check) and the search prices
 * (search/search.c), described once. The serial reference (gpt2_serial.c) stays independent.
 */
#ifndef XMP_MODELS_GPT2_GRAPH_H
#define XMP_MODELS_GPT2_GRAPH_H

#include <stdint.h>

#include "models/gpt2.h"
#include "nn/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The groups (items) of the graph: the search prices each on its own (its IT_E, IT_T, IT_L). */
enum { XMP_GPT2_G_EMBED = 0, XMP_GPT2_G_BLOCK = 1, XMP_GPT2_G_HEAD = 2 };

/* Builds into g (initialized here) GPT-2's forward for microbatches of Bm rows of T tokens:
 * the embedding (tokens x wte + wpe), nblock transformer blocks (layers 0..nblock-1, each
 * layernorm, qkv linear, attention, projection, residual add, layernorm, fc linear, gelu, fc
 * projection, residual add) and the head (layernorm, the linear tied to wte, cross entropy).
 * Parameter shapes are one layer's slices (qkv.w as (3, NH, hs, C), qkv.b as (3, NH, hs));
 * values and parameters carry the strategy classes ("act.x", "qkv.w"); token ids, targets and
 * per-token losses are values of no class. Every node saves what the trainer keeps for the
 * backward: its value operands (the embedding: its output). Returns 0, or -1 with the message
 * in xmp_last_error() and g freed. The caller frees g with xmp_graph_free. */
int xmp_gpt2_graph(const xmp_gpt2_config_t *c, int64_t Bm, int64_t T, int nblock, xmp_graph_t *g);

#ifdef __cplusplus
}
#endif
#endif /* XMP_MODELS_GPT2_GRAPH_H */
