/* nn/graph.h and models/gpt2_graph.h: a tiny GPT (C 8, NH 2, L 2, Vp 16, Bm 2, T 4) as one
 * graph: node count and kinds, every value's class and shape, the parameter count against the
 * model's own table, FLOPs against a hand count, the classes in the strategies' order, and the
 * refusals (bad config, bad operands) with their messages; the U-Transformer's layer tapes as
 * graphs (parameters against the model's layout, every weight feeding a conv or a linear, the
 * boxing points as classes, positions of the down and up convolutions); the graph executor's
 * consumer tables and its refusal of a kind it cannot run. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "models/gpt2.h"
#include "models/gpt2_graph.h"
#include "models/utransformer.h"
#include "models/utransformer_graph.h"
#include "nn/error.h"
#include "nn/graph.h"
#include "nn/graph_exec.h"

static const xmp_gpt2_config_t tiny = {8, 10, 16, 2, 2, 8}; /* maxT V Vp L NH C */
enum { BM = 2, T = 4 };

static void test_nodes(void **state)
{
    (void)state;
    xmp_graph_t g;
    assert_int_equal(xmp_gpt2_graph(&tiny, BM, T, tiny.num_layers, &g), 0);
    /* embedding, 10 per block, head (layernorm, tied linear, cross entropy) */
    assert_int_equal(g.nnode, 1 + 10 * tiny.num_layers + 3);
    static const xmp_gop_t blk[10] = {
        XMP_GOP_LAYERNORM, XMP_GOP_LINEAR, XMP_GOP_ATTENTION, XMP_GOP_LINEAR, XMP_GOP_ADD,
        XMP_GOP_LAYERNORM, XMP_GOP_LINEAR, XMP_GOP_GELU,      XMP_GOP_LINEAR, XMP_GOP_ADD};
    assert_int_equal(g.node[0].kind, XMP_GOP_EMBEDDING);
    for (int l = 0; l < tiny.num_layers; l++)
        for (int k = 0; k < 10; k++) {
            const xmp_gnode_t *n = &g.node[1 + 10 * l + k];
            assert_int_equal(n->kind, blk[k]);
            assert_int_equal(n->layer, l);
            assert_int_equal(n->group, XMP_GPT2_G_BLOCK);
        }
    assert_int_equal(g.node[g.nnode - 3].kind, XMP_GOP_LAYERNORM);
    assert_int_equal(g.node[g.nnode - 2].kind, XMP_GOP_LINEAR);
    assert_int_equal(g.node[g.nnode - 1].kind, XMP_GOP_XENT);
    /* the tied head reads the embedding's table */
    assert_true(g.node[g.nnode - 2].in[1].is_param);
    assert_int_equal(g.node[g.nnode - 2].in[1].id, g.node[0].in[1].id);
    /* every value is produced once, except the inputs (tokens, targets) */
    int inputs = 0;
    for (int v = 0; v < g.nval; v++)
        inputs += g.val[v].producer < 0;
    assert_int_equal(inputs, 2);
    xmp_graph_free(&g);
    xmp_graph_free(&g); /* twice is fine */
}

static void test_value_classes(void **state)
{
    (void)state;
    xmp_graph_t g;
    assert_int_equal(xmp_gpt2_graph(&tiny, BM, T, tiny.num_layers, &g), 0);
    static const char *const blk[10] = {"act.ln1", "act.qkv", "act.att",  "act.x", "act.x",
                                        "act.ln2", "act.fch", "act.gelu", "act.x", "act.x"};
    const char *want[64];
    int n = 0;
    want[n++] = ""; /* tokens */
    want[n++] = "act.x";
    for (int l = 0; l < tiny.num_layers; l++)
        for (int k = 0; k < 10; k++)
            want[n++] = blk[k];
    want[n++] = "act.lnf";
    want[n++] = "act.logits";
    want[n++] = ""; /* targets */
    want[n++] = ""; /* losses */
    assert_int_equal(g.nval, n);
    for (int v = 0; v < n; v++)
        assert_string_equal(g.val[v].cls, want[v]);
    /* shapes: qkv (Bm, T, 3, NH, hs), the MLP 4C, the logits Vp */
    for (int v = 0; v < g.nval; v++) {
        const xmp_gvalue_t *x = &g.val[v];
        if (!strcmp(x->cls, "act.qkv")) {
            assert_int_equal(x->nd, 5);
            assert_int_equal(x->dim[2], 3);
            assert_int_equal(x->dim[3], tiny.num_heads);
            assert_int_equal(x->dim[4], tiny.channels / tiny.num_heads);
        } else if (!strcmp(x->cls, "act.fch") || !strcmp(x->cls, "act.gelu")) {
            assert_int_equal(x->dim[2], 4 * tiny.channels);
        } else if (!strcmp(x->cls, "act.logits")) {
            assert_int_equal(x->dim[2], tiny.padded_vocab_size);
        } else if (x->cls[0]) {
            assert_int_equal(x->nd, 3);
            assert_int_equal(x->dim[2], tiny.channels);
        }
        if (x->cls[0]) {
            assert_int_equal(x->dim[0], BM);
            assert_int_equal(x->dim[1], T);
        }
    }
    /* the distinct classes in the order the strategies list them */
    static const char *const pcls[16] = {
        "wte",   "wpe",   "ln1.w", "ln1.b", "qkv.w",    "qkv.b",    "attproj.w", "attproj.b",
        "ln2.w", "ln2.b", "fc.w",  "fc.b",  "fcproj.w", "fcproj.b", "lnf.w",     "lnf.b"};
    static const char *const acls[9] = {"act.x",   "act.ln1",  "act.qkv", "act.att",   "act.ln2",
                                        "act.fch", "act.gelu", "act.lnf", "act.logits"};
    const char *got[32];
    int nd[32];
    assert_int_equal(xmp_graph_classes(&g, 1, got, nd, 32), 16);
    for (int i = 0; i < 16; i++)
        assert_string_equal(got[i], pcls[i]);
    assert_int_equal(nd[4], 4); /* qkv.w (3, NH, hs, C) */
    assert_int_equal(nd[5], 3); /* qkv.b (3, NH, hs) */
    assert_int_equal(xmp_graph_classes(&g, 0, got, nd, 32), 9);
    for (int i = 0; i < 9; i++)
        assert_string_equal(got[i], acls[i]);
    assert_int_equal(nd[2], 5);
    xmp_graph_free(&g);
}

static void test_param_count(void **state)
{
    (void)state;
    xmp_gpt2_param_info_t tab[XMP_GPT2_NUM_PARAM_TENSORS];
    size_t total = 0;
    assert_int_equal(xmp_gpt2_param_table(&tiny, tab, &total), 0);
    xmp_graph_t g;
    assert_int_equal(xmp_gpt2_graph(&tiny, BM, T, tiny.num_layers, &g), 0);
    assert_int_equal(xmp_graph_param_count(&g), (int64_t)total);
    assert_int_equal(g.nparam, 2 + 12 * tiny.num_layers + 2);
    xmp_graph_free(&g);
    /* one block: the stage the checker and the search look at */
    assert_int_equal(xmp_gpt2_graph(&tiny, 1, 1, 1, &g), 0);
    int64_t C = tiny.channels,
            blk = 4 * C + 3 * C * C + 3 * C + C * C + C + 4 * C * C + 4 * C + 4 * C * C + C;
    assert_int_equal(xmp_graph_param_count(&g), (int64_t)tiny.padded_vocab_size * C +
                                                    (int64_t)tiny.max_seq_len * C + blk + 2 * C);
    xmp_graph_free(&g);
}

static void test_flops(void **state)
{
    (void)state;
    xmp_graph_t g;
    assert_int_equal(xmp_gpt2_graph(&tiny, BM, T, tiny.num_layers, &g), 0);
    const double R = BM * T, C = tiny.channels, NH = tiny.num_heads, hs = C / NH,
                 Vp = tiny.padded_vocab_size;
    /* per block: 4 linears (2 flops per multiply-add), attention's two products, and one per
     * output element of the two layernorms, the gelu and the two sums */
    double blk = 2 * R * 3 * C * C + 2 * R * C * C + 2 * R * 4 * C * C + 2 * R * C * 4 * C +
                 4 * BM * NH * T * T * hs + 2 * R * C + R * 4 * C + 2 * R * C;
    /* embedding (one per element), final layernorm, tied head, cross entropy over the logits */
    double want = R * C + tiny.num_layers * blk + R * C + 2 * R * Vp * C + R * Vp;
    assert_true(xmp_graph_flops(&g) == want);
    /* a node's bytes: f32 operands and output (the qkv linear of block 0) */
    const xmp_gnode_t *q = &g.node[2];
    assert_int_equal(q->kind, XMP_GOP_LINEAR);
    assert_true(q->bytes == 4 * (R * C + 3 * C * C + 3 * C + R * 3 * C));
    xmp_graph_free(&g);
}

static void test_refusals(void **state)
{
    (void)state;
    xmp_graph_t g;
    xmp_gpt2_config_t bad = tiny;
    bad.num_heads = 3;
    assert_int_equal(xmp_gpt2_graph(&bad, BM, T, 1, &g), -1);
    assert_non_null(strstr(xmp_last_error(), "C % NH == 0"));
    assert_int_equal(g.nnode, 0);
    assert_int_equal(xmp_gpt2_graph(&tiny, 0, T, 1, &g), -1);
    assert_non_null(strstr(xmp_last_error(), "Bm 0"));

    xmp_graph_init(&g);
    const int64_t d[2] = {2, 3}, z[1] = {0};
    int x = xmp_graph_value(&g, "act.x", 2, d);
    assert_int_equal(x, 0);
    assert_int_equal(xmp_graph_value(&g, "act.y", 1, z), -1);
    assert_non_null(strstr(xmp_last_error(), "value 'act.y': dim 0 is 0"));
    xmp_gref_t in[1] = {{1, 0}};
    assert_int_equal(xmp_graph_node(&g, XMP_GOP_GELU, "gelu", "gelu", 0, 0, 1, in, x, 0), -1);
    assert_non_null(strstr(xmp_last_error(), "operand 0 is parameter 0, which does not exist"));
    in[0].is_param = 0;
    int y = xmp_graph_value(&g, "act.y", 2, d);
    assert_int_equal(xmp_graph_node(&g, XMP_GOP_GELU, "gelu", "gelu", 0, 0, 1, in, y, 0), 0);
    assert_int_equal(xmp_graph_node(&g, XMP_GOP_GELU, "gelu", "gelu again", 0, 0, 1, in, y, 0), -1);
    assert_non_null(strstr(xmp_last_error(), "value 1 (act.y) is already the output of node 0"));
    assert_int_equal(g.nnode, 1);
    assert_string_equal(xmp_gop_name(XMP_GOP_XENT), "xent");
    assert_null(xmp_gop_name(XMP_GOP_COUNT));
    xmp_graph_free(&g);
}

/* The executor's tables (nn/graph_exec.h) on the tiny GPT: what each value feeds and keeps,
 * and a kind it has no executor for refused naming the node. */
static void test_exec_tables(void **state)
{
    (void)state;
    xmp_graph_t g;
    assert_int_equal(xmp_gpt2_graph(&tiny, BM, T, tiny.num_layers, &g), 0);
    xmp_gexec_t ex = {.g = &g};
    assert_int_equal(xmp_gexec_init(&ex), 0);
    for (int l = 0; l < tiny.num_layers; l++) {
        const xmp_gnode_t *b = &g.node[1 + 10 * l];
        int x = b[0].in[0].id, att = b[3].in[0].id, pr = b[3].out, x2 = b[4].out,
            gl = b[8].in[0].id;
        assert_int_equal(ex.nuse[x], 2); /* layer norm and residual add */
        assert_int_equal(ex.first[x], 1 + 10 * l);
        assert_int_equal(ex.last[x], 1 + 10 * l + 4);
        assert_true(ex.keep[x] && ex.keep[att] && ex.keep[x2] && ex.keep[gl]);
        assert_int_equal(ex.nuse[pr], 1); /* the projection: only its add, not kept */
        assert_false(ex.keep[pr]);
        assert_false(ex.keep[b[8].out]);
    }
    assert_int_equal(ex.nuse[g.node[0].in[0].id], 1); /* tokens: the embedding */
    xmp_gexec_free(&ex);
    xmp_gexec_free(&ex); /* twice is fine */
    xmp_graph_free(&g);

    xmp_graph_init(&g);
    const int64_t d[4] = {1, 2, 4, 4};
    int x = xmp_graph_value(&g, "act.x", 4, d), y = xmp_graph_value(&g, "act.y", 4, d);
    xmp_gref_t in[1] = {{0, x}};
    assert_int_equal(xmp_graph_node(&g, XMP_GOP_SILU, "silu", "silu of act.x", 0, 0, 1, in, y, 0),
                     0);
    ex = (xmp_gexec_t){.g = &g};
    xmp_gexec_mb_t m;
    assert_int_equal(xmp_gexec_init(&ex), 0);
    assert_int_equal(xmp_gexec_mb_init(&ex, &m), 0);
    assert_int_equal(xmp_gexec_forward(&ex, &m, 0, 1), -1);
    assert_non_null(strstr(xmp_last_error(), "node 0 (silu of act.x): no executor for silu"));
    assert_int_equal(xmp_gexec_backward(&ex, &m, 0, 1), -1);
    assert_non_null(strstr(xmp_last_error(), "node 0 (silu of act.x): no gradient of its output"));
    xmp_gexec_mb_free(&ex, &m);
    xmp_gexec_free(&ex);
    xmp_graph_free(&g);
}

static void test_utransformer(void **state)
{
    (void)state;
    xmp_ut_config_t cf;
    assert_int_equal(xmp_ut_config_init(&cf, 8, 0, 0), 0);
    xmp_ut_params_t *pp = calloc(1, sizeof *pp);
    assert_non_null(pp);
    xmp_ut_params_layout(&cf, pp);
    int64_t total = 0;
    int boxes[3] = {0, 0, 0}, attn = 0;
    for (int l = 0; l < XMP_UT_LAYERS; l++) {
        xmp_graph_t g;
        assert_int_equal(xmp_ut_graph(&cf, l, &g), 0);
        assert_int_equal((int64_t)pp->layer_count[l], xmp_graph_param_count(&g));
        total += xmp_graph_param_count(&g);
        for (int p = 0; p < g.nparam; p++) { /* every weight feeds one conv or linear */
            if (g.param[p].nd < 2)
                continue;
            int uses = 0;
            for (int i = 0; i < g.nnode; i++)
                uses += g.node[i].nin > 1 && g.node[i].in[1].is_param && g.node[i].in[1].id == p &&
                        (g.node[i].kind == XMP_GOP_CONV || g.node[i].kind == XMP_GOP_LINEAR);
            assert_int_equal(uses, 1);
        }
        for (int i = 0; i < g.nnode; i++) {
            const xmp_gnode_t *n = &g.node[i];
            const xmp_gvalue_t *x = &g.val[n->in[0].id], *y = &g.val[n->out];
            attn += n->kind == XMP_GOP_ATTENTION;
            if (n->kind == XMP_GOP_BOX) {
                boxes[0] += !strcmp(y->cls, "act.x");
                boxes[1] += !strcmp(y->cls, "act.block");
                boxes[2] += !strcmp(y->cls, "act.up");
            }
            if (n->kind == XMP_GOP_CONV && !strcmp(g.param[n->in[1].id].cls, "down.w"))
                assert_int_equal(4 * xmp_ut_graph_positions(y), xmp_ut_graph_positions(x));
            if (n->kind == XMP_GOP_CONV && !strcmp(g.param[n->in[1].id].cls, "up.w"))
                assert_int_equal(xmp_ut_graph_positions(y), xmp_ut_graph_positions(x));
            /* what the search reads off the graph: the pairs' neighbours, the attention's
             * operands (keys and values of the conditioning tokens in cross attention) */
            const char *w = n->nin > 1 && n->in[1].is_param ? g.param[n->in[1].id].cls : "";
            int xp = x->producer;
            if (!strcmp(w, "conv2.w"))
                assert_int_equal(g.node[xp].kind, XMP_GOP_SILU);
            if (!strcmp(w, "attn.o.w"))
                assert_int_equal(g.node[xp].kind, XMP_GOP_ATTENTION);
            if (n->kind == XMP_GOP_ATTENTION) {
                static const char *const qkv[3] = {"attn.q.w", "attn.k.w", "attn.v.w"};
                for (int k = 0; k < 3; k++) {
                    const xmp_gnode_t *p = &g.node[g.val[n->in[k].id].producer];
                    assert_int_equal(p->kind, XMP_GOP_LINEAR);
                    assert_string_equal(g.param[p->in[1].id].cls, qkv[k]);
                }
                int64_t tk = xmp_ut_graph_positions(&g.val[n->in[1].id]);
                int cross = xmp_ut_layer_uses_cond(&cf, l) && l != XMP_UT_MID_A;
                assert_int_equal(tk, cross ? XMP_UT_TOKENS : xmp_ut_graph_positions(x));
            }
            if (n->kind == XMP_GOP_GROUPNORM && l != XMP_UT_OUT) {
                const xmp_gnode_t *p = &g.node[xp];
                assert_int_equal(p->kind, XMP_GOP_CONV);
                assert_string_equal(g.param[p->in[1].id].cls, "conv1.w");
            }
        }
        xmp_graph_free(&g);
    }
    assert_int_equal(total, (int64_t)pp->total);
    assert_true(boxes[0] > 0 && boxes[1] > 0 && boxes[2] > 0);
    assert_int_equal(attn, 8); /* down1-3, mid a and b, up2-4 */
    free(pp);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nodes),       cmocka_unit_test(test_value_classes),
        cmocka_unit_test(test_param_count), cmocka_unit_test(test_flops),
        cmocka_unit_test(test_refusals),    cmocka_unit_test(test_utransformer),
        cmocka_unit_test(test_exec_tables),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
