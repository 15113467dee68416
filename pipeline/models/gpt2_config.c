/* GPT-2's shape: the configuration check, the parameter table and the initial values (contracts
 * in models/gpt2.h). Apart from the serial model (gpt2_serial.c) so that the llm.c checkpoint
 * reader (llmc_io.c) and the model both build on it without depending on each other. */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "models/gpt2.h"
#include "nn/error.h"
#include "nn/kernels.h"

/* As xmp_llmc_fail (llmc_io.h): INVALID_ARGUMENT with the message, -1. */
static int config_fail(const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s", msg);
    return -1;
}

/* ---- config and parameter table ---- */

int xmp_gpt2_pad_vocab(int V, int multiple)
{
    if (multiple <= 0)
        return V;
    return (int)((((long long)V + multiple - 1) / multiple) * multiple);
}

int xmp_gpt2_config_check(const xmp_gpt2_config_t *c)
{
    const struct {
        const char *name;
        int v;
    } f[] = {{"max_seq_len", c->max_seq_len},
             {"vocab_size", c->vocab_size},
             {"padded_vocab_size", c->padded_vocab_size},
             {"num_layers", c->num_layers},
             {"num_heads", c->num_heads},
             {"channels", c->channels}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].v <= 0)
            return config_fail("config: %s %d must be positive", f[i].name, f[i].v);
    if (c->padded_vocab_size < c->vocab_size)
        return config_fail("config: padded_vocab_size %d is smaller than vocab_size %d",
                           c->padded_vocab_size, c->vocab_size);
    if (c->channels % c->num_heads != 0)
        return config_fail("config: num_heads %d does not divide channels %d", c->num_heads,
                           c->channels);
    if (c->vocab_size > 65536)
        return config_fail("config: vocab_size %d exceeds the uint16 token range 65536",
                           c->vocab_size);
    /* keep every tensor and the whole buffer well inside size_t/int ranges used by BLAS */
    if ((long long)c->num_layers * 4 * c->channels * c->channels > (1ll << 40) ||
        (long long)c->padded_vocab_size * c->channels > (1ll << 31) - 1 ||
        (long long)c->max_seq_len * c->channels > (1ll << 31) - 1 ||
        (long long)c->channels * 4 > (1ll << 30))
        return config_fail("config: sizes too large (L=%d C=%d Vp=%d maxT=%d)", c->num_layers,
                           c->channels, c->padded_vocab_size, c->max_seq_len);
    return 0;
}

int xmp_gpt2_param_table(const xmp_gpt2_config_t *cfg,
                         xmp_gpt2_param_info_t table[XMP_GPT2_NUM_PARAM_TENSORS], size_t *total)
{
    if (xmp_gpt2_config_check(cfg) != 0)
        return -1;
    size_t L = (size_t)cfg->num_layers, C = (size_t)cfg->channels;
    size_t Vp = (size_t)cfg->padded_vocab_size, maxT = (size_t)cfg->max_seq_len;
    static const char *names[XMP_GPT2_NUM_PARAM_TENSORS] = {
        "wte",  "wpe",  "ln1w", "ln1b", "qkvw",    "qkvb",    "attprojw", "attprojb",
        "ln2w", "ln2b", "fcw",  "fcb",  "fcprojw", "fcprojb", "lnfw",     "lnfb"};
    const size_t shapes[XMP_GPT2_NUM_PARAM_TENSORS][3] = {
        {Vp, C, 0},    {maxT, C, 0}, {L, C, 0}, {L, C, 0}, {L, 3 * C, C}, {L, 3 * C, 0},
        {L, C, C},     {L, C, 0},    {L, C, 0}, {L, C, 0}, {L, 4 * C, C}, {L, 4 * C, 0},
        {L, C, 4 * C}, {L, C, 0},    {C, 0, 0}, {C, 0, 0}};
    size_t off = 0;
    for (int i = 0; i < XMP_GPT2_NUM_PARAM_TENSORS; i++) {
        xmp_gpt2_param_info_t *t = &table[i];
        t->name = names[i];
        t->ndim = 0;
        t->numel = 1;
        for (int d = 0; d < 3; d++) {
            t->shape[d] = shapes[i][d];
            if (shapes[i][d]) {
                t->ndim++;
                t->numel *= shapes[i][d];
            }
        }
        t->offset = off;
        t->per_layer = i >= XMP_GPT2_LN1W && i <= XMP_GPT2_FCPROJB;
        off += t->numel;
    }
    *total = off;
    return 0;
}

void xmp_gpt2_init_tensor(const xmp_gpt2_config_t *cfg, int idx, uint64_t seed, float *dst)
{
    xmp_gpt2_param_info_t tab[XMP_GPT2_NUM_PARAM_TENSORS];
    size_t total;
    if (xmp_gpt2_param_table(cfg, tab, &total) != 0)
        return;
    size_t n = tab[idx].numel;
    const float std = 0.02f;
    const float resid = std / sqrtf(2.0f * (float)cfg->num_layers);
    switch (idx) {
    case XMP_GPT2_WTE: {
        size_t real = (size_t)cfg->vocab_size * (size_t)cfg->channels;
        xmp_normal_fill(dst, real, seed, (uint64_t)idx, 0, std);
        memset(dst + real, 0, (n - real) * sizeof(float));
        break;
    }
    case XMP_GPT2_WPE:
    case XMP_GPT2_QKVW:
    case XMP_GPT2_FCW:
        xmp_normal_fill(dst, n, seed, (uint64_t)idx, 0, std);
        break;
    case XMP_GPT2_ATTPROJW:
    case XMP_GPT2_FCPROJW:
        xmp_normal_fill(dst, n, seed, (uint64_t)idx, 0, resid);
        break;
    case XMP_GPT2_LN1W:
    case XMP_GPT2_LN2W:
    case XMP_GPT2_LNFW:
        for (size_t i = 0; i < n; i++)
            dst[i] = 1.0f;
        break;
    default: /* biases */
        memset(dst, 0, n * sizeof(float));
        break;
    }
}
