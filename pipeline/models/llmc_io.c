/* llm.c file formats and data loader; contracts in models/llmc_io.h.
 * Files are little-endian; this code assumes a little-endian host (x86-64, aarch64). */
#include "models/llmc_io.h"
#include "nn/error.h"

#include <errno.h>
#include <glob.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int xmp_llmc_fail(const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s", msg);
    return -1;
}

/* Opens path and reads the 256-int header; reports the file size. */
static int read_header(const char *what, const char *path, FILE **out, int32_t hdr[256],
                       long long *fsize)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return xmp_llmc_fail("%s '%s': cannot open: %s", what, path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        fclose(f);
        return xmp_llmc_fail("%s '%s': cannot stat: %s", what, path, strerror(errno));
    }
    size_t got = fread(hdr, 1, 1024, f);
    if (got != 1024) {
        fclose(f);
        return xmp_llmc_fail("%s '%s': truncated header: %zu of 1024 bytes", what, path, got);
    }
    *out = f;
    *fsize = (long long)st.st_size;
    return 0;
}

/* Writes header + payload chunks to path via path.tmp + rename. */
static int write_file(const char *what, const char *path, const int32_t hdr[256],
                      const void *const *chunks, const size_t *sizes, int nchunks)
{
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 5);
    if (!tmp)
        return xmp_llmc_fail("%s '%s': out of memory", what, path);
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        xmp_llmc_fail("%s '%s': cannot create: %s", what, tmp, strerror(errno));
        goto out_free;
    }
    int ok = fwrite(hdr, 1, 1024, f) == 1024;
    for (int i = 0; ok && i < nchunks; i++)
        ok = sizes[i] == 0 || fwrite(chunks[i], 1, sizes[i], f) == sizes[i];
    if (fclose(f) != 0)
        ok = 0;
    if (!ok) {
        xmp_llmc_fail("%s '%s': write failed: %s", what, tmp, strerror(errno));
        goto out_remove;
    }
    if (rename(tmp, path) != 0) {
        xmp_llmc_fail("%s '%s': cannot rename from '%s': %s", what, path, tmp, strerror(errno));
        goto out_remove;
    }
    free(tmp);
    return 0;
out_remove:
    remove(tmp);
out_free:
    free(tmp);
    return -1;
}

/* ---- checkpoints ---- */

int xmp_llmc_checkpoint_read(const char *path, xmp_gpt2_config_t *cfg, float **params,
                             size_t *nparams)
{
    int32_t h[256];
    FILE *f;
    long long fsize;
    if (read_header("checkpoint", path, &f, h, &fsize) != 0)
        return -1;
    int rc = -1;
    float *buf = NULL;
    if (h[0] != XMP_LLMC_MODEL_MAGIC) {
        xmp_llmc_fail("checkpoint '%s': bad magic %d (expected %d)", path, h[0],
                      XMP_LLMC_MODEL_MAGIC);
        goto out;
    }
    if (h[1] != 3 && h[1] != 1) {
        xmp_llmc_fail("checkpoint '%s': unsupported version %d (supported: 3 = f32 padded "
                      "vocab, 1 = f32%s)",
                      path, h[1], h[1] == 5 ? "; 5 is bf16" : "");
        goto out;
    }
    xmp_gpt2_config_t c = {.max_seq_len = h[2],
                           .vocab_size = h[3],
                           .num_layers = h[4],
                           .num_heads = h[5],
                           .channels = h[6],
                           .padded_vocab_size = h[1] == 1 ? h[3] : h[7]};
    if (xmp_gpt2_config_check(&c) != 0) {
        char inner[400];
        snprintf(inner, sizeof inner, "%s", xmp_last_error());
        xmp_llmc_fail("checkpoint '%s': bad header: %s", path, inner);
        goto out;
    }
    xmp_gpt2_param_info_t tab[XMP_GPT2_NUM_PARAM_TENSORS];
    size_t total;
    xmp_gpt2_param_table(&c, tab, &total);
    long long expect = 1024 + (long long)total * 4;
    if (fsize < expect) {
        xmp_llmc_fail("checkpoint '%s': truncated: %lld bytes, header (maxT=%d V=%d Vp=%d L=%d "
                      "NH=%d C=%d) needs %lld",
                      path, fsize, c.max_seq_len, c.vocab_size, c.padded_vocab_size, c.num_layers,
                      c.num_heads, c.channels, expect);
        goto out;
    }
    if (fsize > expect) {
        xmp_llmc_fail("checkpoint '%s': %lld trailing bytes after the %zu parameters", path,
                      fsize - expect, total);
        goto out;
    }
    buf = malloc(total * sizeof(float));
    if (!buf) {
        xmp_llmc_fail("checkpoint '%s': out of memory for %zu parameters", path, total);
        goto out;
    }
    if (fread(buf, sizeof(float), total, f) != total) {
        xmp_llmc_fail("checkpoint '%s': read error in the parameters", path);
        goto out;
    }
    *cfg = c;
    *params = buf;
    *nparams = total;
    buf = NULL;
    rc = 0;
out:
    free(buf);
    fclose(f);
    return rc;
}

int xmp_llmc_checkpoint_write(const char *path, const xmp_gpt2_config_t *cfg, const float *params,
                              size_t nparams)
{
    if (xmp_gpt2_config_check(cfg) != 0)
        return -1;
    xmp_gpt2_param_info_t tab[XMP_GPT2_NUM_PARAM_TENSORS];
    size_t total;
    xmp_gpt2_param_table(cfg, tab, &total);
    if (total != nparams)
        return xmp_llmc_fail("checkpoint '%s': %zu parameters given, config needs %zu", path,
                             nparams, total);
    int32_t h[256] = {0};
    h[0] = XMP_LLMC_MODEL_MAGIC;
    h[1] = 3;
    h[2] = cfg->max_seq_len;
    h[3] = cfg->vocab_size;
    h[4] = cfg->num_layers;
    h[5] = cfg->num_heads;
    h[6] = cfg->channels;
    h[7] = cfg->padded_vocab_size;
    const void *chunks[1] = {params};
    size_t sizes[1] = {nparams * sizeof(float)};
    return write_file("checkpoint", path, h, chunks, sizes, 1);
}

/* ---- token files ---- */

int xmp_llmc_tokens_read(const char *path, uint16_t **tokens, size_t *ntokens)
{
    int32_t h[256];
    FILE *f;
    long long fsize;
    if (read_header("token file", path, &f, h, &fsize) != 0)
        return -1;
    int rc = -1;
    uint16_t *buf = NULL;
    if (h[0] != XMP_LLMC_TOKENS_MAGIC) {
        xmp_llmc_fail("token file '%s': bad magic %d (expected %d)", path, h[0],
                      XMP_LLMC_TOKENS_MAGIC);
        goto out;
    }
    if (h[1] != 1) {
        xmp_llmc_fail("token file '%s': unsupported version %d (expected 1)", path, h[1]);
        goto out;
    }
    if (h[2] <= 0) {
        xmp_llmc_fail("token file '%s': bad token count %d", path, h[2]);
        goto out;
    }
    size_t n = (size_t)h[2];
    long long expect = 1024 + (long long)n * 2;
    if (fsize != expect) {
        xmp_llmc_fail("token file '%s': %s: %lld bytes, header says %zu tokens (%lld bytes)", path,
                      fsize < expect ? "truncated" : "size mismatch", fsize, n, expect);
        goto out;
    }
    buf = malloc(n * sizeof(uint16_t));
    if (!buf) {
        xmp_llmc_fail("token file '%s': out of memory for %zu tokens", path, n);
        goto out;
    }
    if (fread(buf, sizeof(uint16_t), n, f) != n) {
        xmp_llmc_fail("token file '%s': read error", path);
        goto out;
    }
    *tokens = buf;
    *ntokens = n;
    buf = NULL;
    rc = 0;
out:
    free(buf);
    fclose(f);
    return rc;
}

int xmp_llmc_tokens_write(const char *path, const uint16_t *tokens, size_t ntokens)
{
    if (ntokens == 0 || ntokens >= (1ull << 31))
        return xmp_llmc_fail("token file '%s': token count %zu out of range [1, 2^31)", path,
                             ntokens);
    int32_t h[256] = {0};
    h[0] = XMP_LLMC_TOKENS_MAGIC;
    h[1] = 1;
    h[2] = (int32_t)ntokens;
    const void *chunks[1] = {tokens};
    size_t sizes[1] = {ntokens * sizeof(uint16_t)};
    return write_file("token file", path, h, chunks, sizes, 1);
}

/* ---- tokenizer ---- */

int xmp_llmc_tokenizer_write_bytes(const char *path, int eot)
{
    if (eot < 0 || eot > 255)
        return xmp_llmc_fail("tokenizer '%s': eot %d out of range [0, 255]", path, eot);
    int32_t h[256] = {0};
    h[0] = XMP_LLMC_TOKENIZER_MAGIC;
    h[1] = 2;
    h[2] = 256;
    h[3] = eot;
    unsigned char body[512];
    for (int i = 0; i < 256; i++) {
        body[2 * i] = 1;
        body[2 * i + 1] = (unsigned char)i;
    }
    const void *chunks[1] = {body};
    size_t sizes[1] = {sizeof body};
    return write_file("tokenizer", path, h, chunks, sizes, 1);
}

void xmp_llmc_tokenizer_free(char **table, int vocab_size)
{
    if (!table)
        return;
    for (int i = 0; i < vocab_size; i++)
        free(table[i]);
    free(table);
}

int xmp_llmc_tokenizer_read(const char *path, int *vocab_size, int *eot, char ***table)
{
    int32_t h[256];
    FILE *f;
    long long fsize;
    if (read_header("tokenizer", path, &f, h, &fsize) != 0)
        return -1;
    (void)fsize;
    int rc = -1, n = h[2], e = 0;
    char **tab = NULL;
    if (h[0] != XMP_LLMC_TOKENIZER_MAGIC) {
        xmp_llmc_fail("tokenizer '%s': bad magic %d (expected %d)", path, h[0],
                      XMP_LLMC_TOKENIZER_MAGIC);
        goto out;
    }
    if (h[1] != 1 && h[1] != 2) {
        xmp_llmc_fail("tokenizer '%s': unsupported version %d (expected 1 or 2)", path, h[1]);
        goto out;
    }
    if (n <= 0) {
        xmp_llmc_fail("tokenizer '%s': bad vocabulary size %d", path, n);
        goto out;
    }
    e = h[1] == 1 ? 50256 : h[3];
    tab = calloc((size_t)n, sizeof(char *));
    if (!tab) {
        xmp_llmc_fail("tokenizer '%s': out of memory", path);
        goto out;
    }
    for (int i = 0; i < n; i++) {
        unsigned char len;
        if (fread(&len, 1, 1, f) != 1 || len == 0) {
            xmp_llmc_fail("tokenizer '%s': token %d: %s", path, i,
                          feof(f) ? "truncated file" : "zero length");
            goto out;
        }
        tab[i] = malloc((size_t)len + 1);
        if (!tab[i] || fread(tab[i], 1, len, f) != len) {
            xmp_llmc_fail("tokenizer '%s': token %d: truncated file", path, i);
            goto out;
        }
        tab[i][len] = '\0';
    }
    *vocab_size = n;
    *eot = e;
    if (table) {
        *table = tab;
        tab = NULL;
    }
    rc = 0;
out:
    xmp_llmc_tokenizer_free(tab, n);
    fclose(f);
    return rc;
}

void xmp_llmc_tokenize_bytes(uint16_t *tokens, const char *text, size_t n)
{
    for (size_t i = 0; i < n; i++)
        tokens[i] = (unsigned char)text[i];
}

int xmp_llmc_read_file(const char *path, char **data, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return xmp_llmc_fail("file '%s': cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        fclose(f);
        return xmp_llmc_fail("file '%s': cannot stat: %s", path, strerror(errno));
    }
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        fclose(f);
        return xmp_llmc_fail("file '%s': out of memory for %zu bytes", path, n);
    }
    if (fread(buf, 1, n, f) != n) {
        free(buf);
        fclose(f);
        return xmp_llmc_fail("file '%s': read error", path);
    }
    fclose(f);
    buf[n] = '\0';
    *data = buf;
    *len = n;
    return 0;
}

/* ---- data loader ---- */

static size_t stride(const xmp_llmc_loader_t *ld)
{
    return (size_t)ld->nproc * (size_t)ld->B * (size_t)ld->T;
}

/* Makes shard number `pos` of the shard order current and prepares its sample order. */
static int load_shard(xmp_llmc_loader_t *ld, int pos)
{
    int file = ld->shuffle ? ld->shard_order[pos] : pos;
    if (ld->paths) {
        uint16_t *toks;
        size_t n;
        if (xmp_llmc_tokens_read(ld->paths[file], &toks, &n) != 0)
            return -1;
        if (n < stride(ld) + 1) {
            free(toks);
            return xmp_llmc_fail("token file '%s': %zu tokens, need at least %zu for B=%d T=%d "
                                 "and %d processes",
                                 ld->paths[file], n, stride(ld) + 1, ld->B, ld->T, ld->nproc);
        }
        free(ld->tokens);
        ld->tokens = toks;
        ld->ntokens = n;
    }
    size_t S = (ld->ntokens - 1) / stride(ld);
    if (ld->shuffle) {
        int *ord = malloc(S * sizeof(int));
        if (!ord)
            return xmp_llmc_fail("data loader: out of memory for %zu samples", S);
        for (size_t i = 0; i < S; i++)
            ord[i] = (int)i;
        xmp_mt19937_permute(ord, (int)S, &ld->rng);
        free(ld->sample_order);
        ld->sample_order = ord;
    }
    ld->num_samples = S;
    ld->shard = pos;
    ld->cur = 0;
    return 0;
}

int xmp_llmc_loader_reset(xmp_llmc_loader_t *ld)
{
    if (ld->shuffle)
        xmp_mt19937_permute(ld->shard_order, ld->nshards, &ld->rng);
    return load_shard(ld, 0);
}

static int loader_common_init(xmp_llmc_loader_t *ld, int B, int T, int rank, int nproc, int shuffle)
{
    if (B <= 0 || T <= 0)
        return xmp_llmc_fail("data loader: bad batch shape B=%d T=%d", B, T);
    if (nproc <= 0 || rank < 0 || rank >= nproc)
        return xmp_llmc_fail("data loader: bad rank %d of %d processes", rank, nproc);
    ld->B = B;
    ld->T = T;
    ld->rank = rank;
    ld->nproc = nproc;
    ld->shuffle = shuffle ? 1 : 0;
    ld->inputs = malloc((size_t)B * T * sizeof(int));
    ld->targets = malloc((size_t)B * T * sizeof(int));
    ld->shard_order = malloc((size_t)(ld->nshards > 0 ? ld->nshards : 1) * sizeof(int));
    if (!ld->inputs || !ld->targets || !ld->shard_order)
        return xmp_llmc_fail("data loader: out of memory");
    for (int i = 0; i < ld->nshards; i++)
        ld->shard_order[i] = i;
    xmp_mt19937_seed(&ld->rng, (uint32_t)(42 + rank));
    return 0;
}

int xmp_llmc_loader_init(xmp_llmc_loader_t *ld, const char *pattern, int B, int T, int rank,
                         int nproc, int shuffle)
{
    xmp_llmc_loader_t l;
    memset(&l, 0, sizeof l);
    glob_t g;
    int gs = glob(pattern, 0, NULL, &g);
    if (gs != 0 || g.gl_pathc == 0) {
        if (gs == 0 || gs == GLOB_NOMATCH)
            globfree(&g);
        return xmp_llmc_fail("data loader: no token file matches '%s'", pattern);
    }
    l.nshards = (int)g.gl_pathc;
    l.paths = calloc(g.gl_pathc, sizeof(char *));
    int ok = l.paths != NULL;
    for (size_t i = 0; ok && i < g.gl_pathc; i++)
        ok = (l.paths[i] = strdup(g.gl_pathv[i])) != NULL;
    globfree(&g);
    if (!ok) {
        xmp_llmc_fail("data loader: out of memory");
        goto fail;
    }
    if (loader_common_init(&l, B, T, rank, nproc, shuffle) != 0)
        goto fail;
    /* validate every shard up front, as llm.c does */
    for (int i = 0; i < l.nshards; i++) {
        int saved = l.shuffle;
        l.shuffle = 0; /* no RNG use while validating */
        int rc = load_shard(&l, i);
        l.shuffle = saved;
        if (rc != 0)
            goto fail;
        l.total_tokens += l.ntokens;
    }
    if (xmp_llmc_loader_reset(&l) != 0)
        goto fail;
    *ld = l;
    return 0;
fail:
    xmp_llmc_loader_free(&l);
    return -1;
}

int xmp_llmc_loader_init_tokens(xmp_llmc_loader_t *ld, const uint16_t *tokens, size_t n, int B,
                                int T, int rank, int nproc, int shuffle)
{
    xmp_llmc_loader_t l;
    memset(&l, 0, sizeof l);
    l.nshards = 1;
    if (loader_common_init(&l, B, T, rank, nproc, shuffle) != 0)
        goto fail;
    if (n < stride(&l) + 1) {
        xmp_llmc_fail("data loader: %zu tokens, need at least %zu for B=%d T=%d and %d "
                      "processes",
                      n, stride(&l) + 1, B, T, nproc);
        goto fail;
    }
    l.tokens = malloc(n * sizeof(uint16_t));
    if (!l.tokens) {
        xmp_llmc_fail("data loader: out of memory for %zu tokens", n);
        goto fail;
    }
    memcpy(l.tokens, tokens, n * sizeof(uint16_t));
    l.ntokens = l.total_tokens = n;
    if (xmp_llmc_loader_reset(&l) != 0)
        goto fail;
    *ld = l;
    return 0;
fail:
    xmp_llmc_loader_free(&l);
    return -1;
}

int xmp_llmc_loader_next(xmp_llmc_loader_t *ld)
{
    if (ld->cur >= ld->num_samples) {
        int rc = ld->shard == ld->nshards - 1 ? xmp_llmc_loader_reset(ld)
                                              : load_shard(ld, ld->shard + 1);
        if (rc != 0)
            return -1;
    }
    size_t s = ld->shuffle ? (size_t)ld->sample_order[ld->cur] : ld->cur;
    const uint16_t *p = ld->tokens + s * stride(ld) + (size_t)ld->rank * ld->B * ld->T;
    size_t bt = (size_t)ld->B * ld->T;
    for (size_t i = 0; i < bt; i++) {
        ld->inputs[i] = p[i];
        ld->targets[i] = p[i + 1];
    }
    ld->cur++;
    return 0;
}

void xmp_llmc_loader_free(xmp_llmc_loader_t *ld)
{
    if (!ld)
        return;
    if (ld->paths)
        for (int i = 0; i < ld->nshards; i++)
            free(ld->paths[i]);
    free(ld->paths);
    free(ld->tokens);
    free(ld->shard_order);
    free(ld->sample_order);
    free(ld->inputs);
    free(ld->targets);
    memset(ld, 0, sizeof *ld);
}
