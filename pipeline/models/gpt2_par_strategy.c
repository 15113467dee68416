/* GPT-2 pipeline stages: the built-in strategies (dp, megatron, 3d, axonn, ...) as SBP
 * text, and the check of a strategy against a configuration and stage (gpt2_par.h). */
#include "models/gpt2_par.h"
#include "models/gpt2_par_priv.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/gpt2_graph.h"
#include "nn/kernels.h"
#include "nn/overlap.h"
#include "nn/param.h"
#include "nn/sbp_layers.h"
#include "nn/sbp_ops.h"
#include "util/xmp_err.h"

/* ------------------------------------------------------------ built-ins */

/* Per-axis role in a built-in: data (batch split, parameters B), tensor
 * (Megatron's tensor-parallel axis), and the three roles of AutoDDL's 3-D
 * matmul (paper 000, section 4.3): rows R, output columns A, contracted K. */
enum { R_DATA, R_TP, R_3R, R_3A, R_3K };

/* SBP text of class name on an axis of role r. */
static const char *role_sbp(int r, const char *cls)
{
    static const struct {
        const char *cls, *tp, *a, *k;
    } t[] = {
        /*  class        megatron tp  3d A     3d K */
        {"wte", "S(0)", "S(0)", "S(1)"},
        {"wpe", "B", "B", "B"},
        {"ln1.w", "B", "B", "B"},
        {"ln1.b", "B", "B", "B"},
        {"qkv.w", "S(1)", "S(1)", "S(3)"},
        {"qkv.b", "S(1)", "S(1)", "B"},
        {"attproj.w", "S(1)", "S(0)", "S(1)"},
        {"attproj.b", "B", "S(0)", "B"},
        {"ln2.w", "B", "B", "B"},
        {"ln2.b", "B", "B", "B"},
        {"fc.w", "S(0)", "S(0)", "S(1)"},
        {"fc.b", "S(0)", "S(0)", "B"},
        {"fcproj.w", "S(1)", "S(0)", "S(1)"},
        {"fcproj.b", "B", "S(0)", "B"},
        {"lnf.w", "B", "B", "B"},
        {"lnf.b", "B", "B", "B"},
        {"act.x", "B", "S(1)", "S(1)"},
        {"act.ln1", "B", "B", "S(2)"},
        {"act.qkv", "S(3)", "S(3)", "S(3)"},
        {"act.att", "S(2)", "B", "S(2)"},
        {"act.ln2", "B", "B", "S(2)"},
        {"act.fch", "S(2)", "S(2)", "S(2)"},
        {"act.gelu", "S(2)", "B", "S(2)"},
        {"act.lnf", "B", "B", "S(2)"},
        {"act.logits", "S(2)", "S(2)", "S(2)"},
    };
    int is_act = !strncmp(cls, "act.", 4);
    if (r == R_DATA || r == R_3R)
        return is_act ? "S(0)" : "B";
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(t[i].cls, cls))
            return r == R_TP ? t[i].tp : r == R_3A ? t[i].a : t[i].k;
    return "B";
}

int xmp_gpt2_strategy_builtin(const char *name, int naxes, char *text, size_t n, char *err,
                              size_t errlen)
{
    int role[NAX], depth = -1; /* axonn: the axis the weights are stored split over */
    if (naxes < 1 || naxes > NAX) {
        snprintf(err, errlen, "built-in strategy '%s': mesh of %d axes (must be 1..%d)", name,
                 naxes, NAX);
        return -1;
    }
    if (!strcmp(name, "dp")) {
        for (int a = 0; a < naxes; a++)
            role[a] = R_DATA;
    } else if (!strcmp(name, "megatron")) {
        for (int a = 0; a < naxes; a++)
            role[a] = a == naxes - 1 ? R_TP : R_DATA;
    } else if (!strcmp(name, "3d")) {
        /* The last three axes are AutoDDL's (R, A, K); a 4th (leading) axis is
         * data parallel; on fewer axes the last roles are kept (A, K / K). */
        static const int r3[3] = {R_3R, R_3A, R_3K};
        for (int a = 0; a < naxes; a++) {
            int k = 3 - (naxes - a);
            role[a] = k < 0 ? R_DATA : r3[k];
        }
    } else if (!strcmp(name, "axonn")) {
        if (naxes < 3) {
            snprintf(err, errlen,
                     "built-in strategy 'axonn' needs a mesh of 3 or 4 axes (3d's rows axis is "
                     "the depth axis its weights are stored split over); this mesh has %d",
                     naxes);
            return -1;
        }
        static const int r3[3] = {R_3R, R_3A, R_3K};
        for (int a = 0; a < naxes; a++) {
            int k = 3 - (naxes - a);
            role[a] = k < 0 ? R_DATA : r3[k];
        }
        depth = naxes - 3;
    } else {
        return 1;
    }
    size_t at = 0;
    int w = snprintf(text, n, "# GPT-2 built-in '%s' for %d mesh axes (roles:", name, naxes);
    at += w > 0 ? (size_t)w : 0;
    static const char *rn[] = {"data", "tensor", "3d-rows/depth", "3d-cols", "3d-contracted"};
    for (int a = 0; a < naxes && at < n; a++) {
        w = snprintf(text + at, n - at, " %s", rn[role[a]]);
        at += w > 0 ? (size_t)w : 0;
    }
    if (at < n) {
        w = snprintf(text + at, n - at, ")\nstrategy %s axes=%d\n", name, naxes);
        at += w > 0 ? (size_t)w : 0;
    }
    for (int i = 0; i < NPT + NACT && at < n; i++) {
        const char *cls = i < NPT ? xmp_gpt2__pclass[i] : xmp_gpt2__aclass[i - NPT];
        w = snprintf(text + at, n - at, "%s =", cls);
        at += w > 0 ? (size_t)w : 0;
        for (int a = 0; a < naxes && at < n; a++) {
            w = snprintf(text + at, n - at, "%s%s", a ? "," : " ", role_sbp(role[a], cls));
            at += w > 0 ? (size_t)w : 0;
        }
        /* AxoNN (paper 001, section III-B): the weight matrices, replicated
         * over the depth axis by 3d, are stored split over it once more
         * (dim 0); gathered before use, gradients reduce-scattered. */
        int weight = i == XMP_GPT2_WTE || i == XMP_GPT2_QKVW || i == XMP_GPT2_ATTPROJW ||
                     i == XMP_GPT2_FCW || i == XMP_GPT2_FCPROJW;
        for (int a = 0; depth >= 0 && weight && a < naxes && at < n; a++) {
            const char *v = a == depth ? "S(0)" : role_sbp(role[a], cls);
            w = snprintf(text + at, n - at, "%s%s", a ? "," : " store ", v);
            at += w > 0 ? (size_t)w : 0;
        }
        if (at < n) {
            w = snprintf(text + at, n - at, "\n");
            at += w > 0 ? (size_t)w : 0;
        }
    }
    if (at >= n) {
        snprintf(err, errlen, "built-in strategy '%s': text longer than %zu bytes", name, n);
        return -1;
    }
    return 0;
}

/* ----------------------------------------------------------- validation */

int xmp_gpt2_strategy_check(const xmp_strategy_t *s, const xmp_gpt2_config_t *c, int stage,
                            int ndim, const int *shape, char *err, size_t errlen)
{
    if (s->naxes != ndim)
        return xmp_err_buf(err, errlen,
                           "stage %d: strategy '%s' (%s) has axes=%d, the stage mesh has %d axes",
                           stage, s->name, s->source, s->naxes, ndim);
    /* A stage holding every layer kind: the embedding, one block and the head (gpt2_graph.h);
     * its classes and, after the model's own rule on act.x, every op through the deduction. */
    xmp_graph_t g;
    char where[32];
    snprintf(where, sizeof where, "stage %d", stage);
    if (xmp_gpt2_graph(c, 1, 1, 1, &g))
        return xmp_err_buf(err, errlen, "%s: %s", where, xmp_last_error());
    int rc = xmp_strategy_check_graph_classes(s, &g, where, err, errlen);
    /* The tensor between stages: S or B (a partial sum would cross as P). */
    const xmp_strategy_entry_t *x = xmp_strategy_get(s, "act.x");
    for (int a = 0; !rc && a < ndim; a++)
        if (x->sbp[a].kind == XMP_P)
            rc = xmp_err_buf(err, errlen,
                             "stage %d: class act.x: mesh axis %d: P: missing SBP rule 'partial "
                             "residual stream' (the tensor between stages must be S or B)",
                             stage, a);
    /* The token ids (and targets) follow act.x's batch/sequence split. */
    xmp_sbp_t tok[NAX];
    for (int a = 0; !rc && a < NAX; a++) {
        xmp_sbp_t v = a < ndim ? x->sbp[a] : xmp_sbp_b();
        tok[a] = v.kind == XMP_S && v.dim < 2 ? v : xmp_sbp_b();
    }
    if (!rc)
        rc = xmp_strategy_check_graph_rules(s, &g, tok, where, err, errlen);
    xmp_graph_free(&g);
    if (rc)
        return -1;
    /* The attention output (Bm, T, NH, hs) is used as (Bm, T, C): the heads
     * must split evenly over the axes that split them. */
    const xmp_strategy_entry_t *q = xmp_strategy_get(s, "act.qkv");
    int hsplit = 1;
    char axes[64] = "";
    for (int a = 0; a < ndim; a++)
        if (q->sbp[a].kind == XMP_S && q->sbp[a].dim == 3) {
            hsplit *= shape[a];
            size_t l = strlen(axes);
            snprintf(axes + l, sizeof axes - l, "%s%d", l ? "," : "", a);
        }
    if (c->num_heads % hsplit)
        return xmp_err_buf(
            err, errlen,
            "stage %d: %d heads cannot be split over tensor-parallel degree %d (heads "
            "%% tp must be 0): class act.qkv splits the heads over mesh axes %s",
            stage, c->num_heads, hsplit, axes);
    return 0;
}
