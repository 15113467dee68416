/*
 * Parallelization strategies as data (issue 20 item 1; docs/STRATEGY.md).
 *
 * A strategy maps the tensor classes of a model (parameter classes such as
 * "fc.w", activation classes such as "act.x") to an SBP per axis of a stage
 * mesh of 1 to 4 axes (the compute SBP: the form a layer uses), and
 * optionally to a storage SBP (the form a parameter and its optimizer state
 * are kept in between steps: ZeRO over a data axis, AxoNN's depth shard).
 *
 * Text form, one class per line; '#' starts a comment, blank lines are
 * ignored, the first other line is the header:
 *
 *   strategy megatron axes=2
 *   wte      = B,S(0)
 *   fc.w     = B,S(0)   store S(0),S(0)
 *   act.x    = S(0),B
 *
 * An SBP list has exactly `axes` entries, each "S(d)" (d in 0..7), "B" or
 * "P". Class names are letters, digits, '_' and '.'; each appears once.
 * xmp_strategy_format writes a text that xmp_strategy_parse reads back to an
 * equal strategy (xmp_strategy_equal).
 *
 * The module knows nothing of any model: which classes exist, which are
 * required and which SBP rules cover them is the model's business
 * (xmp_strategy_check_classes for the names; the model checks the rules).
 * Built-in strategies are supplied by the model as text generated for the
 * mesh's axis count, through a callback given to xmp_strategy_load.
 *
 * Errors: functions return 0 or -1 with a message in err (errlen bytes, may
 * be NULL) that names the source (file path or "built-in NAME"), the line,
 * the class and the axis where they apply; *out is untouched on error.
 * Pure code: no MPI, no allocation that survives a call.
 */
#ifndef XMP_NN_STRATEGY_H
#define XMP_NN_STRATEGY_H

#include <stddef.h>

#include "nn/graph.h"
#include "nn/sbp.h"

#ifdef __cplusplus
extern "C" {
#endif

#define XMP_STRATEGY_MAX_CLASSES 128
#define XMP_STRATEGY_MAX_NAME 48

typedef struct {
    char cls[XMP_STRATEGY_MAX_NAME];    /* class name, e.g. "fc.w" */
    xmp_sbp_t sbp[XMP_MAX_MESH_DIMS];   /* compute SBP per mesh axis (naxes used) */
    xmp_sbp_t store[XMP_MAX_MESH_DIMS]; /* storage SBP (valid when has_store) */
    int has_store;
    int line; /* line of the source text (1-based) */
} xmp_strategy_entry_t;

typedef struct {
    char name[XMP_STRATEGY_MAX_NAME]; /* from the header */
    char source[256];                 /* file path, or "built-in NAME" */
    int naxes;                        /* 1..4 */
    int n;                            /* entries used */
    xmp_strategy_entry_t e[XMP_STRATEGY_MAX_CLASSES];
} xmp_strategy_t;

/* Parses text (NUL-terminated). source names it in messages (NULL: "<text>").
 * Errors: missing or bad header, bad class name, duplicate class, wrong SBP
 * count, bad SBP token, bad 'store' clause, too many classes. */
int xmp_strategy_parse(const char *text, const char *source, xmp_strategy_t *out, char *err,
                       size_t errlen);

/* Writes the text form into buf (always NUL-terminated when n > 0). Returns
 * the length the full text needs (excluding the NUL), like snprintf. */
int xmp_strategy_format(const xmp_strategy_t *s, char *buf, size_t n);

/* The entry of class cls, or NULL when the strategy does not name it. */
const xmp_strategy_entry_t *xmp_strategy_get(const xmp_strategy_t *s, const char *cls);

/* 1 when a and b have the same name, axes and entries (same order not
 * required; lines and source ignored). */
int xmp_strategy_equal(const xmp_strategy_t *a, const xmp_strategy_t *b);

/* Model built-ins: writes the text of built-in `name` for a mesh of naxes
 * axes into text (n bytes). Returns 0, 1 when no built-in has that name, -1
 * with a message in err when the built-in exists but cannot be generated
 * for naxes axes (or is refused). */
typedef int (*xmp_strategy_builtin_fn)(const char *name, int naxes, char *text, size_t n, char *err,
                                       size_t errlen);

/* Loads a strategy for a mesh of naxes axes: when name_or_path is an
 * existing file it is read and parsed; otherwise builtins(name) gives its
 * text (builtin_names, e.g. "dp, megatron, 3d, axonn", is listed in the
 * message when neither exists). The strategy's axes must equal naxes. */
int xmp_strategy_load(const char *name_or_path, xmp_strategy_builtin_fn builtins,
                      const char *builtin_names, int naxes, xmp_strategy_t *out, char *err,
                      size_t errlen);

/* Built-ins that depend on the model's configuration and the mesh's shape (an addition to
 * xmp_strategy_builtin_fn): user is the model's pointer, shape the naxes axis sizes of the stage
 * mesh (NULL when unknown). Same returns as xmp_strategy_builtin_fn. */
typedef int (*xmp_strategy_mesh_builtin_fn)(void *user, const char *name, int naxes,
                                            const int *shape, char *text, size_t n, char *err,
                                            size_t errlen);

/* xmp_strategy_load for a mesh of the given shape (naxes sizes, may be NULL) with built-ins
 * that may use it and the model's user pointer. */
int xmp_strategy_load_mesh(const char *name_or_path, xmp_strategy_mesh_builtin_fn builtins,
                           void *user, const char *builtin_names, int naxes, const int *shape,
                           xmp_strategy_t *out, char *err, size_t errlen);

/* Checks class names: every entry must be one of known[0..nknown) (else
 * "SOURCE:LINE: unknown class 'x'"), every required[0..nreq) must be
 * present (else "SOURCE: class 'x' missing"). */
int xmp_strategy_check_classes(const xmp_strategy_t *s, const char *const *known, int nknown,
                               const char *const *required, int nreq, char *err, size_t errlen);

/* "S(0),B,P" for naxes SBPs (the strategy's spelling). */
void xmp_strategy_sbp_string(const xmp_sbp_t *sbp, int naxes, char *buf, size_t n);

/* A strategy against a model's graph (nn/graph.h), in two parts a model calls around its own
 * checks; messages start with `where` ("stage 1"). Classes: the strategy names exactly the
 * graph's classes (xmp_strategy_check_classes: parameters first, then values); every compute
 * S(d) lies within its class' dims; a parameter is computed S or B (its gradient is the P); a
 * storage SBP is for parameters only, S or B, within the dims. Rules: every node with a
 * deduction rule, in graph order, through xmp_sbp_deduce (nn/sbp_layers.h) with the SBPs of
 * its operands' classes (noclass[0..naxes) for values of no class, such as token ids): the
 * first node no rule covers is named by its `what`. Each returns 0, or -1 with err. */
int xmp_strategy_check_graph_classes(const xmp_strategy_t *s, const xmp_graph_t *g,
                                     const char *where, char *err, size_t errlen);
int xmp_strategy_check_graph_rules(const xmp_strategy_t *s, const xmp_graph_t *g,
                                   const xmp_sbp_t *noclass, const char *where, char *err,
                                   size_t errlen);

#ifdef __cplusplus
}
#endif
#endif /* XMP_NN_STRATEGY_H */
