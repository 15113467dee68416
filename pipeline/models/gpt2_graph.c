/* GPT-2 as one graph: see gpt2_graph.h. */
#include "models/gpt2_graph.h"

#include <stdio.h>

#include "nn/error.h"

#define V(id) ((xmp_gref_t){0, (id)})
#define P(id) ((xmp_gref_t){1, (id)})

/* The builder's state: the graph and the first error (every call after it does nothing). */
typedef struct {
    xmp_graph_t *g;
    int failed;
} gb_t;

static int val(gb_t *b, const char *cls, int nd, int64_t d0, int64_t d1, int64_t d2, int64_t d3,
               int64_t d4)
{
    const int64_t dim[5] = {d0, d1, d2, d3, d4};
    int id = b->failed ? -1 : xmp_graph_value(b->g, cls, nd, dim);
    b->failed |= id < 0;
    return id;
}

static int par(gb_t *b, const char *cls, int layer, int group, int nd, int64_t d0, int64_t d1,
               int64_t d2, int64_t d3)
{
    const int64_t dim[4] = {d0, d1, d2, d3};
    int id = b->failed ? -1 : xmp_graph_param(b->g, cls, nd, dim, layer, group);
    b->failed |= id < 0;
    return id;
}

static void node(gb_t *b, xmp_gop_t kind, const char *rule, const char *what, int group, int layer,
                 int nin, xmp_gref_t i0, xmp_gref_t i1, xmp_gref_t i2, int out, unsigned saves)
{
    const xmp_gref_t in[3] = {i0, i1, i2};
    if (!b->failed)
        b->failed = xmp_graph_node(b->g, kind, rule, what, group, layer, nin, in, out, saves) < 0;
}

/* One transformer block of layer l on x; returns the block's output value. */
static int block(gb_t *b, const xmp_gpt2_config_t *c, int64_t Bm, int64_t T, int l, int x)
{
    const int64_t C = c->channels, NH = c->num_heads, hs = C / NH;
    const int G = XMP_GPT2_G_BLOCK;
    int ln1w = par(b, "ln1.w", l, G, 1, C, 0, 0, 0), ln1b = par(b, "ln1.b", l, G, 1, C, 0, 0, 0);
    int qkvw = par(b, "qkv.w", l, G, 4, 3, NH, hs, C),
        qkvb = par(b, "qkv.b", l, G, 3, 3, NH, hs, 0);
    int apw = par(b, "attproj.w", l, G, 2, C, C, 0, 0),
        apb = par(b, "attproj.b", l, G, 1, C, 0, 0, 0);
    int ln2w = par(b, "ln2.w", l, G, 1, C, 0, 0, 0), ln2b = par(b, "ln2.b", l, G, 1, C, 0, 0, 0);
    int fcw = par(b, "fc.w", l, G, 2, 4 * C, C, 0, 0),
        fcb = par(b, "fc.b", l, G, 1, 4 * C, 0, 0, 0);
    int fpw = par(b, "fcproj.w", l, G, 2, C, 4 * C, 0, 0);
    int fpb = par(b, "fcproj.b", l, G, 1, C, 0, 0, 0);

    int ln1 = val(b, "act.ln1", 3, Bm, T, C, 0, 0);
    node(b, XMP_GOP_LAYERNORM, "layernorm", "layernorm of act.x (ln1.w, ln1.b)", G, l, 3, V(x),
         P(ln1w), P(ln1b), ln1, 1);
    int qkv = val(b, "act.qkv", 5, Bm, T, 3, NH, hs);
    node(b, XMP_GOP_LINEAR, "linear", "linear act.ln1 x qkv.w (+ qkv.b)", G, l, 3, V(ln1), P(qkvw),
         P(qkvb), qkv, 1);
    int att = val(b, "act.att", 3, Bm, T, C, 0, 0);
    node(b, XMP_GOP_ATTENTION, "attention", "class act.qkv", G, l, 1, V(qkv), V(0), V(0), att, 1);
    int pr = val(b, "act.x", 3, Bm, T, C, 0, 0);
    node(b, XMP_GOP_LINEAR, "linear", "linear act.att x attproj.w (+ attproj.b)", G, l, 3, V(att),
         P(apw), P(apb), pr, 1);
    int x2 = val(b, "act.x", 3, Bm, T, C, 0, 0);
    node(b, XMP_GOP_ADD, NULL, "residual act.x + attention", G, l, 2, V(x), V(pr), V(0), x2, 0);
    int ln2 = val(b, "act.ln2", 3, Bm, T, C, 0, 0);
    node(b, XMP_GOP_LAYERNORM, "layernorm", "layernorm of act.x (ln2.w, ln2.b)", G, l, 3, V(x2),
         P(ln2w), P(ln2b), ln2, 1);
    int fch = val(b, "act.fch", 3, Bm, T, 4 * C, 0, 0);
    node(b, XMP_GOP_LINEAR, "linear", "linear act.ln2 x fc.w (+ fc.b)", G, l, 3, V(ln2), P(fcw),
         P(fcb), fch, 1);
    int gl = val(b, "act.gelu", 3, Bm, T, 4 * C, 0, 0);
    node(b, XMP_GOP_GELU, "gelu", "gelu of act.fch", G, l, 1, V(fch), V(0), V(0), gl, 1);
    int fp = val(b, "act.x", 3, Bm, T, C, 0, 0);
    node(b, XMP_GOP_LINEAR, "linear", "linear act.gelu x fcproj.w (+ fcproj.b)", G, l, 3, V(gl),
         P(fpw), P(fpb), fp, 1);
    int x3 = val(b, "act.x", 3, Bm, T, C, 0, 0);
    node(b, XMP_GOP_ADD, NULL, "residual act.x + mlp", G, l, 2, V(x2), V(fp), V(0), x3, 0);
    return x3;
}

int xmp_gpt2_graph(const xmp_gpt2_config_t *c, int64_t Bm, int64_t T, int nblock, xmp_graph_t *g)
{
    xmp_graph_init(g);
    if (!c || c->channels < 1 || c->num_heads < 1 || c->channels % c->num_heads || Bm < 1 ||
        T < 1 || nblock < 0) {
        xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                "gpt2 graph: config (C %d, NH %d), Bm %lld, T %lld, %d blocks: need C %% NH == 0 "
                "and positive sizes",
                c ? c->channels : 0, c ? c->num_heads : 0, (long long)Bm, (long long)T, nblock);
        return -1;
    }
    gb_t b = {g, 0};
    const int64_t C = c->channels, Vp = c->padded_vocab_size;
    const int E = XMP_GPT2_G_EMBED, H = XMP_GPT2_G_HEAD;
    int tok = val(&b, "", 2, Bm, T, 0, 0, 0);
    int wte = par(&b, "wte", -1, E, 2, Vp, C, 0, 0);
    (void)par(&b, "wpe", -1, E, 2, c->max_seq_len, C, 0, 0);
    int x = val(&b, "act.x", 3, Bm, T, C, 0, 0);
    node(&b, XMP_GOP_EMBEDDING, "embedding",
         "embedding of the tokens (act.x's batch/sequence split) x wte", E, -1, 2, V(tok), P(wte),
         V(0), x, XMP_G_SAVE_OUT);
    for (int l = 0; l < nblock; l++)
        x = block(&b, c, Bm, T, l, x);
    int lnfw = par(&b, "lnf.w", -1, H, 1, C, 0, 0, 0),
        lnfb = par(&b, "lnf.b", -1, H, 1, C, 0, 0, 0);
    int lnf = val(&b, "act.lnf", 3, Bm, T, C, 0, 0);
    node(&b, XMP_GOP_LAYERNORM, "layernorm", "layernorm of act.x (lnf.w, lnf.b)", H, -1, 3, V(x),
         P(lnfw), P(lnfb), lnf, 1);
    int logits = val(&b, "act.logits", 3, Bm, T, Vp, 0, 0);
    node(&b, XMP_GOP_LINEAR, "linear", "linear act.lnf x wte (tied head)", H, -1, 2, V(lnf), P(wte),
         V(0), logits, 1);
    int tgt = val(&b, "", 2, Bm, T, 0, 0, 0), loss = val(&b, "", 2, Bm, T, 0, 0, 0);
    node(&b, XMP_GOP_XENT, "cross_entropy", "cross_entropy of act.logits", H, -1, 2, V(logits),
         V(tgt), V(0), loss, 1);
    if (b.failed) {
        xmp_graph_free(g);
        return -1;
    }
    return 0;
}
