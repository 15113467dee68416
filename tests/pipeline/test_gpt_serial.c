/*
 * Unit tests of the serial GPT-2 (pipeline/models/gpt2_serial.c) and the llm.c file formats
 * and data loader (pipeline/models/llmc_io.c).
 *
 * Usage: test_gpt_serial --tmp DIR [--seed N]   (DIR is created; the seed is printed)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "models/gpt2.h"
#include "models/llmc_io.h"
#include "nn/kernels.h"

#ifndef XMP_DATA_DIR
#error "XMP_DATA_DIR is defined by the xmesh_pipeline target"
#endif

static int g_fail = 0;
static uint64_t g_seed = 1;
static char g_tmp[512];

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                            \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
            g_fail++;                                                                              \
        }                                                                                          \
    } while (0)

static const char *tmp_path(const char *name)
{
    static char buf[4][640];
    static int k = 0;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_tmp, name);
    return buf[k];
}

static long long file_size(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 ? (long long)st.st_size : -1;
}

/* (tmp_path returns one of 4 rotating buffers: copy a path that must live longer) */

/* rewrites int32 header field `idx` of a file */
static void poke_header(const char *path, int idx, int32_t value)
{
    FILE *f = fopen(path, "r+b");
    if (!f) {
        CHECK(0, "cannot open %s", path);
        return;
    }
    fseek(f, 4L * idx, SEEK_SET);
    fwrite(&value, 4, 1, f);
    fclose(f);
}

static void copy_file(const char *from, const char *to)
{
    char *d;
    size_t n;
    if (xmp_llmc_read_file(from, &d, &n) != 0) {
        CHECK(0, "%s", xmp_last_error());
        return;
    }
    FILE *f = fopen(to, "wb");
    fwrite(d, 1, n, f);
    fclose(f);
    free(d);
}

static xmp_gpt2_config_t tiny_config(int V)
{
    xmp_gpt2_config_t c = {.max_seq_len = 16,
                           .vocab_size = V,
                           .padded_vocab_size = xmp_gpt2_pad_vocab(V, 128),
                           .num_layers = 2,
                           .num_heads = 2,
                           .channels = 32};
    return c;
}

/* ---- parameter table and init ---- */

static void test_table_and_init(void)
{
    printf("parameter table, init\n");
    xmp_gpt2_config_t c = tiny_config(200);
    xmp_gpt2_param_info_t t[XMP_GPT2_NUM_PARAM_TENSORS];
    size_t total;
    CHECK(xmp_gpt2_param_table(&c, t, &total) == 0, "table: %s", xmp_last_error());
    size_t L = 2, C = 32, Vp = 256, maxT = 16;
    size_t expect =
        Vp * C + maxT * C +
        L * (C + C + 3 * C * C + 3 * C + C * C + C + C + C + 4 * C * C + 4 * C + 4 * C * C + C) +
        2 * C;
    CHECK(total == expect, "total %zu expected %zu", total, expect);
    CHECK(!strcmp(t[XMP_GPT2_QKVW].name, "qkvw") && t[XMP_GPT2_QKVW].shape[1] == 3 * C &&
              t[XMP_GPT2_QKVW].shape[2] == C && t[XMP_GPT2_FCPROJW].shape[1] == C &&
              t[XMP_GPT2_FCPROJW].shape[2] == 4 * C,
          "qkvw/fcprojw shapes");
    CHECK(t[XMP_GPT2_LNFB].offset + t[XMP_GPT2_LNFB].numel == total, "offsets do not tile");
    for (int i = 1; i < XMP_GPT2_NUM_PARAM_TENSORS; i++)
        CHECK(t[i].offset == t[i - 1].offset + t[i - 1].numel, "offset of %s", t[i].name);
    xmp_gpt2_config_t bad = c;
    bad.num_heads = 3;
    CHECK(xmp_gpt2_config_check(&bad) != 0 && strstr(xmp_last_error(), "num_heads 3"),
          "NH=3 C=32 accepted or unclear: %s", xmp_last_error());
    bad = c;
    bad.padded_vocab_size = 100;
    CHECK(xmp_gpt2_config_check(&bad) != 0 && strstr(xmp_last_error(), "100"), "Vp < V accepted");

    xmp_gpt2_t m;
    CHECK(xmp_gpt2_init_random(&m, &c, 42) == 0, "init: %s", xmp_last_error());
    const float *wte = m.params + m.ptab[XMP_GPT2_WTE].offset;
    int padded_zero = 1;
    for (size_t i = (size_t)c.vocab_size * C; i < Vp * C; i++)
        padded_zero &= wte[i] == 0.0f;
    CHECK(padded_zero, "padded wte rows not zero");
    const float *lnw = m.params + m.ptab[XMP_GPT2_LN2W].offset;
    const float *qb = m.params + m.ptab[XMP_GPT2_QKVB].offset;
    CHECK(lnw[5] == 1.0f && qb[7] == 0.0f, "ln weight / bias init");
    /* std of fcprojw is 0.02/sqrt(2L) = 0.01, of fcw 0.02 */
    double s = 0;
    size_t n = m.ptab[XMP_GPT2_FCPROJW].numel;
    const float *w = m.params + m.ptab[XMP_GPT2_FCPROJW].offset;
    for (size_t i = 0; i < n; i++)
        s += (double)w[i] * w[i];
    CHECK(fabs(sqrt(s / n) - 0.01) < 0.0005, "fcprojw std %g, expected 0.01", sqrt(s / n));
    /* a slice generated alone equals the full tensor's slice */
    float one = 0.02f * xmp_normal_at(42, XMP_GPT2_QKVW, 1000);
    CHECK(one == m.params[m.ptab[XMP_GPT2_QKVW].offset + 1000], "qkvw[1000] not reproducible");
    xmp_gpt2_free(&m);
}

/* ---- checkpoints ---- */

static void test_checkpoint(void)
{
    printf("checkpoint roundtrip and bad input\n");
    xmp_gpt2_config_t c = tiny_config(200);
    xmp_gpt2_t m, r;
    xmp_gpt2_init_random(&m, &c, 7);
    char p[640];
    snprintf(p, sizeof p, "%s", tmp_path("ckpt.bin"));
    CHECK(xmp_gpt2_save(&m, p) == 0, "save: %s", xmp_last_error());
    CHECK(file_size(p) == 1024 + (long long)m.num_params * 4, "checkpoint size %lld", file_size(p));
    CHECK(access(tmp_path("ckpt.bin.tmp"), F_OK) != 0, "temp file left behind");
    CHECK(xmp_gpt2_load(&r, p) == 0, "load: %s", xmp_last_error());
    CHECK(!memcmp(&r.cfg, &m.cfg, sizeof c), "config differs after roundtrip");
    CHECK(r.num_params == m.num_params && !memcmp(r.params, m.params, m.num_params * sizeof(float)),
          "parameters differ after roundtrip");
    xmp_gpt2_free(&r);
    FILE *f = fopen(p, "rb");
    int32_t h[8];
    CHECK(fread(h, 4, 8, f) == 8, "short read");
    fclose(f);
    CHECK(h[0] == 20240326 && h[1] == 3 && h[2] == 16 && h[3] == 200 && h[4] == 2 && h[5] == 2 &&
              h[6] == 32 && h[7] == 256,
          "header fields %d %d %d %d %d %d %d %d", h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]);

    /* bad inputs: error names file and field, output untouched */
    struct {
        const char *name;
        int field;
        int32_t value;
        const char *expect;
    } cases[] = {{"bad magic", 0, 12345, "bad magic 12345"},
                 {"bf16 version", 1, 5, "version 5"},
                 {"bad heads", 5, 3, "num_heads 3"},
                 {"vocab bigger than padded", 3, 300, "vocab_size 300"}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const char *q = tmp_path("bad.bin");
        copy_file(p, q);
        poke_header(q, cases[k].field, cases[k].value);
        memset(&r, 0x5a, sizeof r);
        xmp_gpt2_t before = r;
        int rc = xmp_gpt2_load(&r, q);
        CHECK(rc != 0 && strstr(xmp_last_error(), cases[k].expect) &&
                  strstr(xmp_last_error(), "bad.bin"),
              "%s: rc %d message '%s'", cases[k].name, rc, xmp_last_error());
        CHECK(!memcmp(&r, &before, sizeof r), "%s: output modified", cases[k].name);
    }
    /* truncated: one float short; and trailing bytes */
    const char *q = tmp_path("trunc.bin");
    copy_file(p, q);
    CHECK(truncate(q, file_size(p) - 4) == 0, "truncate");
    CHECK(xmp_gpt2_load(&r, q) != 0 && strstr(xmp_last_error(), "truncated"), "truncated: '%s'",
          xmp_last_error());
    CHECK(truncate(q, 100) == 0, "truncate");
    CHECK(xmp_gpt2_load(&r, q) != 0 && strstr(xmp_last_error(), "truncated header"),
          "truncated header: '%s'", xmp_last_error());
    CHECK(xmp_gpt2_load(&r, tmp_path("missing.bin")) != 0 &&
              strstr(xmp_last_error(), "missing.bin"),
          "missing file: '%s'", xmp_last_error());

    /* version 1: no padded vocab (Vp = V), header[7] ignored */
    xmp_gpt2_config_t c1 = c;
    c1.padded_vocab_size = c1.vocab_size;
    xmp_gpt2_t m1;
    xmp_gpt2_init_random(&m1, &c1, 9);
    const char *p1 = tmp_path("v1.bin");
    xmp_gpt2_save(&m1, p1);
    poke_header(p1, 1, 1);
    poke_header(p1, 7, 0);
    CHECK(xmp_gpt2_load(&r, p1) == 0, "v1 load: %s", xmp_last_error());
    CHECK(r.cfg.padded_vocab_size == 200 &&
              !memcmp(r.params, m1.params, m1.num_params * sizeof(float)),
          "v1 content");
    xmp_gpt2_free(&r);
    xmp_gpt2_free(&m1);
    xmp_gpt2_free(&m);
}

/* ---- token and tokenizer files ---- */

static void test_token_files(void)
{
    printf("token files, tokenizer\n");
    uint16_t toks[1000];
    for (int i = 0; i < 1000; i++)
        toks[i] = (uint16_t)(i * 977u);
    char p[640];
    snprintf(p, sizeof p, "%s", tmp_path("toks.bin"));
    CHECK(xmp_llmc_tokens_write(p, toks, 1000) == 0, "write: %s", xmp_last_error());
    CHECK(file_size(p) == 1024 + 2000, "token file size %lld", file_size(p));
    uint16_t *r = NULL;
    size_t n = 0;
    CHECK(xmp_llmc_tokens_read(p, &r, &n) == 0 && n == 1000 && !memcmp(r, toks, sizeof toks),
          "token roundtrip");
    free(r);
    const char *q = tmp_path("toks_bad.bin");
    copy_file(p, q);
    poke_header(q, 0, 20240326);
    r = (uint16_t *)0x1;
    n = 77;
    CHECK(xmp_llmc_tokens_read(q, &r, &n) != 0 && strstr(xmp_last_error(), "bad magic 20240326") &&
              r == (uint16_t *)0x1 && n == 77,
          "token bad magic: '%s'", xmp_last_error());
    copy_file(p, q);
    CHECK(truncate(q, 1024 + 1998) == 0, "truncate");
    CHECK(xmp_llmc_tokens_read(q, &r, &n) != 0 && strstr(xmp_last_error(), "truncated") &&
              strstr(xmp_last_error(), "1000 tokens"),
          "token truncated: '%s'", xmp_last_error());
    CHECK(xmp_llmc_tokens_write(tmp_path("empty.bin"), toks, 0) != 0, "empty token file written");

    const char *tp = tmp_path("tok.bin");
    CHECK(xmp_llmc_tokenizer_write_bytes(tp, 0) == 0, "tokenizer write: %s", xmp_last_error());
    CHECK(file_size(tp) == 1024 + 512, "tokenizer size %lld", file_size(tp));
    int vs = 0, eot = -1;
    char **tab = NULL;
    CHECK(xmp_llmc_tokenizer_read(tp, &vs, &eot, &tab) == 0 && vs == 256 && eot == 0,
          "tokenizer read: %s", xmp_last_error());
    int ok = tab != NULL;
    for (int i = 1; ok && i < 256; i++)
        ok = (unsigned char)tab[i][0] == i && tab[i][1] == '\0';
    CHECK(ok, "tokenizer entries are not the single bytes");
    xmp_llmc_tokenizer_free(tab, vs);
}

/* ---- data loader ---- */

static void test_loader(void)
{
    printf("data loader\n");
    enum { N = 1000, B = 2, T = 8 };
    uint16_t toks[N];
    for (int i = 0; i < N; i++)
        toks[i] = (uint16_t)i;
    const size_t S = (N - 1) / (B * T); /* 62 samples */
    xmp_llmc_loader_t ld;
    /* sequential: sample s starts at s*B*T; wraps after S samples */
    CHECK(xmp_llmc_loader_init_tokens(&ld, toks, N, B, T, 0, 1, 0) == 0, "init: %s",
          xmp_last_error());
    for (size_t s = 0; s < S + 2; s++) {
        xmp_llmc_loader_next(&ld);
        int start = (int)((s % S) * B * T);
        CHECK(ld.inputs[0] == start && ld.targets[0] == start + 1 &&
                  ld.inputs[B * T - 1] == start + B * T - 1 &&
                  ld.targets[B * T - 1] == start + B * T,
              "sequential sample %zu starts at %d", s, ld.inputs[0]);
    }
    xmp_llmc_loader_free(&ld);
    /* two processes: rank 1 reads the second B*T block of each 2*B*T stride */
    CHECK(xmp_llmc_loader_init_tokens(&ld, toks, N, B, T, 1, 2, 0) == 0, "init rank 1");
    xmp_llmc_loader_next(&ld);
    xmp_llmc_loader_next(&ld);
    CHECK(ld.inputs[0] == 2 * B * T + B * T, "rank 1 sample 1 starts at %d", ld.inputs[0]);
    xmp_llmc_loader_free(&ld);

    /* shuffled: each epoch is a permutation of the samples, epochs differ, and the order is
     * the one llm.c gets: mt19937(42), identity permuted per epoch */
    CHECK(xmp_llmc_loader_init_tokens(&ld, toks, N, B, T, 0, 1, 1) == 0, "init shuffled");
    xmp_mt19937_t ref;
    xmp_mt19937_seed(&ref, 42);
    int order[62], seen[62];
    int differs = 0;
    for (int epoch = 0; epoch < 2; epoch++) {
        for (size_t i = 0; i < S; i++)
            order[i] = (int)i;
        xmp_mt19937_permute(order, (int)S, &ref);
        memset(seen, 0, sizeof seen);
        for (size_t s = 0; s < S; s++) {
            xmp_llmc_loader_next(&ld);
            int idx = ld.inputs[0] / (B * T);
            CHECK(idx == order[s], "epoch %d sample %zu is %d, expected %d", epoch, s, idx,
                  order[s]);
            if (idx >= 0 && idx < (int)S)
                seen[idx]++;
            differs += idx != (int)s;
        }
        for (size_t i = 0; i < S; i++)
            CHECK(seen[i] == 1, "epoch %d saw sample %zu %d times", epoch, i, seen[i]);
    }
    CHECK(differs > (int)S, "shuffle left the order mostly sequential");
    xmp_llmc_loader_free(&ld);

    /* files: two shards by glob, sequential visits shard 0 then 1; bad shard is reported */
    xmp_llmc_tokens_write(tmp_path("shard_000.bin"), toks, 100);
    xmp_llmc_tokens_write(tmp_path("shard_001.bin"), toks + 500, 100);
    CHECK(xmp_llmc_loader_init(&ld, tmp_path("shard_*.bin"), 2, 8, 0, 1, 0) == 0, "glob init: %s",
          xmp_last_error());
    int firsts[14];
    for (int s = 0; s < 14; s++) { /* 6 samples per shard */
        xmp_llmc_loader_next(&ld);
        firsts[s] = ld.inputs[0];
    }
    CHECK(firsts[0] == 0 && firsts[5] == 80 && firsts[6] == 500 && firsts[11] == 580 &&
              firsts[12] == 0,
          "shard order: %d %d %d %d %d", firsts[0], firsts[5], firsts[6], firsts[11], firsts[12]);
    CHECK(ld.total_tokens == 200, "total tokens %zu", ld.total_tokens);
    xmp_llmc_loader_free(&ld);
    CHECK(xmp_llmc_loader_init(&ld, tmp_path("shard_*.bin"), 4, 32, 0, 1, 0) != 0 &&
              strstr(xmp_last_error(), "need at least 129"),
          "small shard: '%s'", xmp_last_error());
    CHECK(xmp_llmc_loader_init(&ld, tmp_path("nothing_*.bin"), 2, 8, 0, 1, 0) != 0 &&
              strstr(xmp_last_error(), "no token file matches"),
          "no match: '%s'", xmp_last_error());
}

/* ---- model gradient check ---- */

static double model_loss(xmp_gpt2_t *m, const int *in, const int *tg, int B, int T)
{
    if (xmp_gpt2_forward(m, in, tg, B, T) != 0)
        return NAN;
    double s = 0; /* mean of the f32 per-position losses, summed in double */
    size_t BT = (size_t)B * T;
    const float *losses = m->acts + m->num_acts - BT; /* losses is the last activation */
    for (size_t i = 0; i < BT; i++)
        s += losses[i];
    return s / (double)BT;
}

static void test_model_gradients(void)
{
    printf("whole-model gradient check\n");
    xmp_gpt2_config_t c = tiny_config(200); /* V=200 < Vp=256 exercises the padding */
    c.channels = 16;
    xmp_gpt2_t m;
    xmp_gpt2_init_random(&m, &c, g_seed);
    /* larger weights than GPT-2 init so every gradient is well above f32 noise */
    for (size_t i = 0; i < m.num_params; i++)
        m.params[i] *= 5.0f;
    for (int k = 0; k < XMP_GPT2_NUM_PARAM_TENSORS; k++) /* nonzero biases and LN params */
        if (k != XMP_GPT2_WTE && k != XMP_GPT2_WPE && m.ptab[k].shape[2] == 0) {
            float *p = m.params + m.ptab[k].offset;
            for (size_t i = 0; i < m.ptab[k].numel; i++)
                p[i] += 0.1f * xmp_normal_at(g_seed, 100 + k, i);
        }
    enum { B = 2, T = 6 };
    int in[B * T], tg[B * T];
    uint64_t s = g_seed;
    for (int i = 0; i < B * T; i++) {
        in[i] = (int)(xmp_splitmix64(&s) % 200);
        tg[i] = (int)(xmp_splitmix64(&s) % 200);
    }
    CHECK(xmp_gpt2_forward(&m, in, tg, B, T) == 0, "forward: %s", xmp_last_error());
    xmp_gpt2_zero_grad(&m);
    CHECK(xmp_gpt2_backward(&m) == 0, "backward: %s", xmp_last_error());
    float *g = malloc(m.num_params * sizeof(float));
    memcpy(g, m.grads, m.num_params * sizeof(float));
    /* padded wte rows get no gradient */
    int padded_zero = 1;
    for (size_t i = 200 * (size_t)c.channels; i < 256 * (size_t)c.channels; i++)
        padded_zero &= g[m.ptab[XMP_GPT2_WTE].offset + i] == 0.0f;
    CHECK(padded_zero, "padded wte rows have a gradient");
    /* FD on the 3 largest-gradient entries of every tensor, h = 1e-2 (see test_kernels.c);
     * loss noise is ~1e-6 (f32 over 12 positions), /2h ~ 1e-4 */
    int bad = 0;
    double worst = 0;
    for (int k = 0; k < XMP_GPT2_NUM_PARAM_TENSORS; k++) {
        size_t off = m.ptab[k].offset, n = m.ptab[k].numel, pick[3] = {0, 0, 0};
        for (int r = 0; r < 3; r++) {
            float best = -1;
            for (size_t i = 0; i < n; i++) {
                if ((r > 0 && i == pick[0]) || (r > 1 && i == pick[1]))
                    continue;
                if (fabsf(g[off + i]) > best)
                    best = fabsf(g[off + i]), pick[r] = i;
            }
        }
        for (int r = 0; r < 3; r++) {
            float *p = &m.params[off + pick[r]], p0 = *p;
            const float h = 1e-2f;
            *p = p0 + h;
            double lp = model_loss(&m, in, tg, B, T);
            *p = p0 - h;
            double lm = model_loss(&m, in, tg, B, T);
            *p = p0;
            double fd = (lp - lm) / (2.0 * h), an = g[off + pick[r]];
            double err = fabs(fd - an), tol = 3e-4 + 3e-2 * fabs(an);
            worst = fmax(worst, err / tol);
            if (err > tol) {
                bad++;
                printf("FAIL grad %s[%zu]: analytic %.6g finite-difference %.6g\n", m.ptab[k].name,
                       pick[r], an, fd);
            }
        }
    }
    if (bad)
        g_fail++;
    printf("  48 entries, worst err/tol %.3f\n", worst);
    free(g);
    xmp_gpt2_free(&m);
}

/* ---- training on the shipped text ---- */

static void test_training(void)
{
    printf("tiny GPT-2 training on the shipped text\n");
    char *text;
    size_t n;
    const char *path = XMP_DATA_DIR "/kjv_genesis.txt";
    if (xmp_llmc_read_file(path, &text, &n) != 0) {
        CHECK(0, "%s", xmp_last_error());
        return;
    }
    uint16_t *toks = malloc(n * sizeof(uint16_t));
    xmp_llmc_tokenize_bytes(toks, text, n);
    free(text);
    xmp_gpt2_config_t c = tiny_config(256);
    xmp_gpt2_t m;
    xmp_llmc_loader_t ld;
    xmp_gpt2_init_random(&m, &c, g_seed);
    CHECK(xmp_llmc_loader_init_tokens(&ld, toks, n, 4, 16, 0, 1, 1) == 0, "loader: %s",
          xmp_last_error());
    free(toks);
    float loss[20];
    for (int step = 0; step < 20; step++) {
        xmp_llmc_loader_next(&ld);
        CHECK(xmp_gpt2_forward(&m, ld.inputs, ld.targets, 4, 16) == 0, "forward");
        xmp_gpt2_zero_grad(&m);
        xmp_gpt2_backward(&m);
        xmp_gpt2_update(&m, 3e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, step + 1);
        loss[step] = m.mean_loss;
    }
    double first = 0, last = 0;
    for (int i = 0; i < 5; i++)
        first += loss[i] / 5, last += loss[15 + i] / 5;
    printf("  loss: first 5 steps %.4f, last 5 steps %.4f (ln 256 = %.4f)\n", first, last,
           log(256.0));
    CHECK(fabs(loss[0] - log(256.0)) < 0.1, "initial loss %g is not near ln(256)", loss[0]);
    CHECK(last < first - 0.5, "loss did not fall: %.4f -> %.4f", first, last);
    /* the model refuses a different batch shape and out-of-vocabulary tokens */
    CHECK(xmp_gpt2_forward(&m, ld.inputs, ld.targets, 2, 16) != 0 &&
              strstr(xmp_last_error(), "B=2"),
          "shape change: '%s'", xmp_last_error());
    ld.inputs[5] = 300;
    CHECK(xmp_gpt2_forward(&m, ld.inputs, ld.targets, 4, 16) != 0 &&
              strstr(xmp_last_error(), "token 300 at position 5"),
          "bad token: '%s'", xmp_last_error());
    xmp_llmc_loader_free(&ld);
    xmp_gpt2_free(&m);
}

int main(int argc, char **argv)
{
    const char *tmp = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--tmp"))
            tmp = argv[i + 1];
        else if (!strcmp(argv[i], "--seed"))
            g_seed = strtoull(argv[i + 1], NULL, 0);
    }
    if (!tmp) {
        fprintf(stderr, "usage: test_gpt_serial --tmp DIR [--seed N]\n");
        return 2;
    }
    snprintf(g_tmp, sizeof g_tmp, "%s", tmp);
    mkdir(g_tmp, 0755);
    printf("test_gpt_serial: seed %llu (replay with --seed %llu)\n", (unsigned long long)g_seed,
           (unsigned long long)g_seed);
    test_table_and_init();
    test_checkpoint();
    test_token_files();
    test_loader();
    test_model_gradients();
    test_training();
    printf("%s: %d failure(s)\n", g_fail ? "FAILED" : "OK", g_fail);
    return g_fail ? 1 : 0;
}
