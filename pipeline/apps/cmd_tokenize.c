/* `xmesh-train tokenize`: byte-level tokenization (vocabulary 256, token = byte value) to
 * llm.c token files, plus the matching llm.c tokenizer file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"
#include "commands.h"
#include "models/llmc_io.h"

static void tokenize_usage(void)
{
    printf("usage: xmesh-train tokenize --text FILE --out TRAIN.bin [--val-out VAL.bin]\n"
           "         [--val-fraction F] [--tokenizer-out TOK.bin]\n"
           "  Byte-level: token i is byte i (vocabulary 256). With --val-out, the FIRST\n"
           "  round(F * n) tokens go to the validation file (llm.c's tinyshakespeare split puts\n"
           "  validation first too) and the rest to --out; F defaults to 0.1.\n"
           "  --tokenizer-out defaults to <out without .bin>_tokenizer.bin; its EOT id is 0.\n");
}

int xmp_cmd_tokenize(int argc, char **argv)
{
    xmp_cli_set_command("tokenize");
    const char *text = NULL, *out = NULL, *val_out = NULL, *tok_out = NULL;
    float frac = 0.1f;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            tokenize_usage();
            return 0;
        } else if (!strcmp(a, "--text") || !strcmp(a, "--out") || !strcmp(a, "--val-out") ||
                   !strcmp(a, "--tokenizer-out") || !strcmp(a, "--val-fraction")) {
            if (!(v = xmp_cli_value(argc, argv, &i)))
                return 2;
            if (!strcmp(a, "--text"))
                text = v;
            else if (!strcmp(a, "--out"))
                out = v;
            else if (!strcmp(a, "--val-out"))
                val_out = v;
            else if (!strcmp(a, "--tokenizer-out"))
                tok_out = v;
            else if (xmp_cli_float(a, v, 0.0, 0.9, &frac) != 0)
                return 2;
        } else {
            xmp_cli_error("unknown flag '%s' (see --help)", a);
            return 2;
        }
    }
    if (!text || !out) {
        xmp_cli_error("--text and --out are required (see --help)");
        return 2;
    }
    char *data = NULL, *tokpath = NULL;
    uint16_t *toks = NULL;
    size_t n;
    int rc = 1;
    if (xmp_llmc_read_file(text, &data, &n) != 0) {
        xmp_cli_error("%s", xmp_last_error());
        goto out;
    }
    if (n < 2) {
        xmp_cli_error("--text '%s': %zu bytes, need at least 2", text, n);
        goto out;
    }
    toks = malloc(n * sizeof(uint16_t));
    if (!toks) {
        xmp_cli_error("out of memory for %zu tokens", n);
        goto out;
    }
    xmp_llmc_tokenize_bytes(toks, data, n);
    size_t nval = val_out ? (size_t)((double)frac * (double)n + 0.5) : 0;
    if (val_out && (nval == 0 || nval >= n)) {
        xmp_cli_error("--val-fraction %g gives %zu of %zu tokens; need a non-empty split",
                      (double)frac, nval, n);
        goto out;
    }
    if (val_out && xmp_llmc_tokens_write(val_out, toks, nval) != 0) {
        xmp_cli_error("%s", xmp_last_error());
        goto out;
    }
    if (xmp_llmc_tokens_write(out, toks + nval, n - nval) != 0) {
        xmp_cli_error("%s", xmp_last_error());
        goto out;
    }
    if (!tok_out) {
        size_t len = strlen(out);
        if (len > 4 && !strcmp(out + len - 4, ".bin"))
            len -= 4;
        tokpath = malloc(len + sizeof "_tokenizer.bin");
        if (!tokpath)
            goto out;
        memcpy(tokpath, out, len);
        strcpy(tokpath + len, "_tokenizer.bin");
        tok_out = tokpath;
    }
    if (xmp_llmc_tokenizer_write_bytes(tok_out, 0) != 0) {
        xmp_cli_error("%s", xmp_last_error());
        goto out;
    }
    printf("tokenize: %zu bytes of '%s' -> %zu train tokens '%s'", n, text, n - nval, out);
    if (val_out)
        printf(", %zu val tokens '%s'", nval, val_out);
    printf(", tokenizer '%s'\n", tok_out);
    rc = 0;
out:
    free(tokpath);
    free(toks);
    free(data);
    return rc;
}
