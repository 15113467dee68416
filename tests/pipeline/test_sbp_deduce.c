/* xmp_sbp_deduce (nn/sbp_layers.h), one process, no MPI: accepted signatures give the output
 * SBP the ops produce (AutoDDL's 3-D matmul among them), refused ones give a message naming
 * op, operand, mesh axis and the missing rule, and leave the output untouched. */
#include <stdio.h>
#include <string.h>

#include "nn/sbp_layers.h"

static int g_fail, g_cases;

typedef struct {
    const char *op;
    int naxes, nin;
    int nd[3];
    const char *sbp[3];
    const char *want;    /* output SBP, or NULL when refused */
    const char *must[5]; /* substrings of the refusal */
} case_t;

static const case_t cases[] = {
    /* linear: data parallel, column split (QKV out dims), row split, AutoDDL's 3-D matmul */
    {"linear", 2, 2, {3, 2}, {"S(0),B", "B,S(0)"}, "S(0),S(2)", {0}},
    {"linear", 1, 2, {2, 2}, {"S(1)", "S(1)"}, "P", {0}},
    {"linear", 1, 3, {2, 2, 1}, {"P", "B", "S(0)"}, "P", {0}},
    {"linear", 1, 2, {2, 3}, {"B", "S(1)"}, "S(2)", {0}},
    {"linear", 3, 2, {2, 2}, {"S(0),B,S(1)", "B,S(0),S(1)"}, "S(0),S(1),P", {0}},
    {"linear", 4, 2, {3, 2}, {"S(0),S(1),B,P", "B,B,S(0),B"}, "S(0),S(1),S(2),P", {0}},
    {"linear",
     1,
     2,
     {3, 2},
     {"S(3)", "B"},
     NULL,
     {"linear", "operand x", "mesh axis 0", "S(3)", "no rule"}},
    {"linear", 2, 3, {2, 2, 2}, {"B,B", "B,B", "B,B"}, NULL, {"linear", "operand b", "no rule"}},
    {"linear", 1, 2, {2, 1}, {"B", "B"}, NULL, {"linear", "w", "no rule"}},
    /* add */
    {"add", 2, 2, {3, 3}, {"S(0),P", "B,B"}, "S(0),B", {0}},
    {"add", 2, 2, {2, 2}, {"P,P", "P,S(1)"}, "P,S(1)", {0}},
    {"add", 1, 2, {2, 3}, {"B", "B"}, NULL, {"add", "no rule"}},
    {"add",
     2,
     2,
     {2, 2},
     {"B,B", "B,S(2)"},
     NULL,
     {"add", "operand y", "mesh axis 1", "S(2)", "no rule"}},
    /* gelu */
    {"gelu", 2, 1, {3}, {"P,S(1)"}, "B,S(1)", {0}},
    /* layer norm: channel split, row splits, P boxed to B; w and b any SBP */
    {"layernorm", 3, 3, {3, 1, 1}, {"S(2),S(0),P", "B,S(0),P", "P,B,B"}, "S(2),S(0),B", {0}},
    {"layernorm", 1, 1, {2}, {"S(1)"}, "S(1)", {0}},
    {"layernorm", 1, 3, {2, 2, 1}, {"B", "B", "B"}, NULL, {"layernorm", "operand w", "no rule"}},
    {"layernorm",
     2,
     1,
     {2},
     {"B,S(2)"},
     NULL,
     {"layernorm", "operand x", "mesh axis 1", "S(2)", "no rule"}},
    /* attention: batch, sequence, heads; P -> B; S(2) and S(4) refused */
    {"attention", 4, 1, {5}, {"S(0),S(1),S(3),P"}, "S(0),S(1),S(2),B", {0}},
    {"attention", 2, 1, {5}, {"S(3),S(3)"}, "S(2),S(2)", {0}},
    {"attention",
     2,
     1,
     {5},
     {"B,S(2)"},
     NULL,
     {"attention", "operand qkv", "mesh axis 1", "q/k/v index", "no rule"}},
    {"attention",
     3,
     1,
     {5},
     {"S(0),B,S(4)"},
     NULL,
     {"attention", "operand qkv", "mesh axis 2", "head dim", "no rule"}},
    {"attention", 1, 1, {4}, {"B"}, NULL, {"attention", "qkv", "no rule"}},
    /* embedding: vocabulary split gives P, channel split S(last), token split S(d) */
    {"embedding", 2, 2, {2, 2}, {"S(0),B", "B,S(0)"}, "S(0),P", {0}},
    {"embedding", 2, 2, {2, 2}, {"S(1),B", "B,S(1)"}, "S(1),S(2)", {0}},
    {"embedding",
     2,
     2,
     {2, 2},
     {"B,P", "B,B"},
     NULL,
     {"embedding", "operand tok", "mesh axis 1", "P", "no rule"}},
    {"embedding", 1, 2, {2, 3}, {"B", "B"}, NULL, {"embedding", "table", "no rule"}},
    /* cross-entropy: vocabulary split, row split, P -> S(last) */
    {"cross_entropy", 2, 2, {3, 2}, {"S(2),P", "B,B"}, "S(2),S(2)", {0}},
    {"cross_entropy", 2, 1, {3}, {"S(0),B"}, "S(0),B", {0}},
    {"cross_entropy",
     2,
     2,
     {3, 2},
     {"B,B", "B,P"},
     NULL,
     {"cross_entropy", "operand targets", "mesh axis 1", "no rule"}},
    {"cross_entropy", 1, 2, {3, 3}, {"B", "B"}, NULL, {"cross_entropy", "targets", "no rule"}},
    /* bad calls */
    {"conv", 1, 1, {2}, {"B"}, NULL, {"conv", "no rules"}},
    {"gelu", 1, 2, {2, 2}, {"B", "B"}, NULL, {"gelu", "2 operands", "no rule"}},
};

static void run(const case_t *c)
{
    xmp_sbp_t in[3][XMP_MAX_MESH_DIMS], out[XMP_MAX_MESH_DIMS];
    const xmp_sbp_t *ptr[3];
    char err[512] = "", got[64] = "";
    g_cases++;
    for (int i = 0; i < c->nin; i++) {
        /* parse with a generous dim count: the deduction, not the parser, is under test */
        if (xmp_sbp_parse(c->sbp[i], c->naxes > 4 ? 4 : c->naxes, 8, in[i])) {
            printf("FAIL %s: cannot parse '%s': %s\n", c->op, c->sbp[i], xmp_last_error());
            g_fail++;
            return;
        }
        ptr[i] = in[i];
    }
    memset(out, 0x5a, sizeof out);
    xmp_sbp_t keep[XMP_MAX_MESH_DIMS];
    memcpy(keep, out, sizeof out);
    int rc = xmp_sbp_deduce(c->op, c->naxes, c->nin, c->nd, ptr, out, err, sizeof err);
    if (c->want) {
        xmp_sbp_string(out, c->naxes, got, sizeof got);
        if (rc != 0 || strcmp(got, c->want)) {
            printf("FAIL %s %s|%s: rc %d, got '%s', want '%s' (%s)\n", c->op, c->sbp[0],
                   c->nin > 1 ? c->sbp[1] : "", rc, rc ? "" : got, c->want, err);
            g_fail++;
        }
        return;
    }
    if (rc != -1) {
        printf("FAIL %s %s: accepted, expected a refusal\n", c->op, c->sbp[0]);
        g_fail++;
        return;
    }
    if (memcmp(out, keep, sizeof out)) {
        printf("FAIL %s %s: output written on refusal\n", c->op, c->sbp[0]);
        g_fail++;
    }
    if (strcmp(err, xmp_last_error())) {
        printf("FAIL %s: err '%s' differs from xmp_last_error '%s'\n", c->op, err,
               xmp_last_error());
        g_fail++;
    }
    for (int k = 0; k < 5 && c->must[k]; k++)
        if (!strstr(err, c->must[k])) {
            printf("FAIL %s %s: refusal lacks '%s': %s\n", c->op, c->sbp[0], c->must[k], err);
            g_fail++;
        }
}

int main(void)
{
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run(&cases[i]);
    /* a mesh of 5 axes and NULL arrays are refused too */
    xmp_sbp_t s[4], out[4];
    const xmp_sbp_t *p[1] = {s};
    int nd[1] = {2};
    char err[256];
    xmp_sbp_parse("B", 1, 2, s);
    if (xmp_sbp_deduce("gelu", 5, 1, nd, p, out, err, sizeof err) != -1 || !strstr(err, "5 axes"))
        printf("FAIL gelu on 5 axes: %s\n", err), g_fail++;
    if (xmp_sbp_deduce("gelu", 1, 1, NULL, p, out, err, sizeof err) != -1)
        printf("FAIL gelu with NULL in_ndim accepted\n"), g_fail++;
    printf("test_sbp_deduce: %d cases, %s (%d failures)\n", g_cases + 2, g_fail ? "FAILED" : "ok",
           g_fail);
    return g_fail ? 1 : 0;
}
