/*
 * llm.c file formats and data loader (karpathy/llm.c), written from their descriptions.
 *
 * All headers are 256 little-endian int32 (1024 bytes):
 *   checkpoint  [0]=20240326 [1]=version (3: f32, padded vocab; 1: f32, no padding)
 *               [2]=maxT [3]=V [4]=L [5]=NH [6]=C [7]=Vp (v3 only); then the 16 parameter
 *               tensors in llm.c order (models/gpt2.h), f32, wte with Vp rows.
 *   tokens      [0]=20240520 [1]=1 [2]=number of tokens; then uint16 tokens.
 *   tokenizer   [0]=20240328 [1]=2 [2]=vocab size n [3]=EOT id; then per token a uint8
 *               length (>= 1) and that many bytes.
 *
 * Errors: 0 on success, -1 on error with a message in xmp_last_error() naming the file
 * and the bad field or value (bad magic, bad version, truncated, size mismatch, ...). On
 * error no output argument is modified and no partial output file is left behind (writers
 * write "<path>.tmp" then rename).
 */
#ifndef XMP_MODELS_LLMC_IO_H
#define XMP_MODELS_LLMC_IO_H

#include <stddef.h>
#include <stdint.h>

#include "models/gpt2.h"
#include "nn/error.h"
#include "nn/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

#define XMP_LLMC_MODEL_MAGIC 20240326
#define XMP_LLMC_TOKENS_MAGIC 20240520
#define XMP_LLMC_TOKENIZER_MAGIC 20240328
#define XMP_LLMC_HEADER_INTS 256

/* Errors of this module and of models/gpt2.h: xmp_last_error() (nn/error.h). */
/* Sets the message (printf format); returns -1 for `return xmp_llmc_fail(...)`. */
int xmp_llmc_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Reads a checkpoint. On success *params is malloc'ed (caller frees) with *nparams floats. */
int xmp_llmc_checkpoint_read(const char *path, xmp_gpt2_config_t *cfg, float **params,
                             size_t *nparams);
/* Writes a v3 checkpoint; nparams must match the config's parameter count. */
int xmp_llmc_checkpoint_write(const char *path, const xmp_gpt2_config_t *cfg, const float *params,
                              size_t nparams);

/* Reads a token file; *tokens is malloc'ed (caller frees). */
int xmp_llmc_tokens_read(const char *path, uint16_t **tokens, size_t *ntokens);
int xmp_llmc_tokens_write(const char *path, const uint16_t *tokens, size_t ntokens);

/* Writes the byte-level tokenizer: 256 tokens, token i is the single byte i. The byte-level
 * vocabulary has no dedicated end-of-text token; `eot` (0..255) is recorded as such
 * (xmesh-train uses 0, the NUL byte, which plain text never contains). */
int xmp_llmc_tokenizer_write_bytes(const char *path, int eot);
/* Reads a tokenizer file (v1 or v2) and returns its vocabulary size and EOT id (v1: 50256);
 * if table is non-NULL, *table gets n malloc'ed NUL-terminated strings (free with
 * xmp_llmc_tokenizer_free). */
int xmp_llmc_tokenizer_read(const char *path, int *vocab_size, int *eot, char ***table);
void xmp_llmc_tokenizer_free(char **table, int vocab_size);

/* Byte-level tokenization: tokens[i] = (unsigned char)text[i]. */
void xmp_llmc_tokenize_bytes(uint16_t *tokens, const char *text, size_t n);
/* Reads a whole file into a malloc'ed buffer (NUL added, not counted in *len). */
int xmp_llmc_read_file(const char *path, char **data, size_t *len);

/*
 * Training data loader with llm.c's DataLoader semantics (llmc/dataloader.h):
 *  - shards = the files matching a glob pattern, sorted (glob(3)); or one in-memory array;
 *  - a shard of n tokens holds S = (n-1) / (nproc*B*T) samples; sample s of process `rank`
 *    is the B*T+1 tokens starting at s*nproc*B*T + rank*B*T; inputs = first B*T,
 *    targets = the same shifted by one;
 *  - without shuffling, samples are visited 0,1,...,S-1, then the next shard, and after
 *    the last shard the loader wraps around to shard 0 (a new epoch);
 *  - with shuffling: one MT19937 seeded with 42+rank; shard_order starts as the identity;
 *    every reset (init and each new epoch) first permutes shard_order in place (Fisher-
 *    Yates from the end, NOT reset to the identity), then each shard load sets
 *    sample_order = identity and permutes it, and sample s is read from sample_order[s].
 *    llm.c's CPU trainer (train_gpt2.c) shuffles its training loader (should_shuffle=1)
 *    and not its validation loader.
 * Every shard is validated at init (magic, version, exact file size, at least
 * nproc*B*T+1 tokens). The current shard is held in memory.
 */
typedef struct {
    int B, T, rank, nproc, shuffle;
    char **paths; /* NULL for the in-memory variant */
    int nshards;
    uint16_t *tokens; /* current shard */
    size_t ntokens;
    size_t num_samples; /* of the current shard */
    size_t total_tokens;
    int shard;  /* position in the shard order */
    size_t cur; /* next position in the sample order */
    xmp_mt19937_t rng;
    int *shard_order;  /* nshards */
    int *sample_order; /* num_samples, when shuffling */
    int *inputs;       /* B*T */
    int *targets;      /* B*T */
} xmp_llmc_loader_t;

int xmp_llmc_loader_init(xmp_llmc_loader_t *ld, const char *pattern, int B, int T, int rank,
                         int nproc, int shuffle);
/* One in-memory shard (tokens are copied). */
int xmp_llmc_loader_init_tokens(xmp_llmc_loader_t *ld, const uint16_t *tokens, size_t n, int B,
                                int T, int rank, int nproc, int shuffle);
/* Back to the start of an epoch (reshuffles when shuffling, like llm.c's dataloader_reset). */
int xmp_llmc_loader_reset(xmp_llmc_loader_t *ld);
/* Advances to the next sample and fills ld->inputs / ld->targets. */
int xmp_llmc_loader_next(xmp_llmc_loader_t *ld);
void xmp_llmc_loader_free(xmp_llmc_loader_t *ld);

#ifdef __cplusplus
}
#endif
#endif /* XMP_MODELS_LLMC_IO_H */
