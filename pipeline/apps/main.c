/* xmesh-train: subcommand dispatch. Subcommands live in apps/cmd_*.c (see commands.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "commands.h"

/* `xmesh-train utransformer plan` is the layout search (apps/cmd_plan.c); the rest trains. */
static int utransformer(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "plan"))
        return xmp_cmd_ut_plan(argc - 1, argv + 1);
    return xmp_train_utransformer_main(argc, argv);
}

static const struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} g_commands[] = {
    {"gpt", xmp_cmd_gpt, "train GPT-2 (llm.c semantics); --serial for one process"},
    {"utransformer", utransformer,
     "train the U-Transformer on synthetic shapes; --serial or MPI pipeline"},
    {"tokenize", xmp_cmd_tokenize, "byte-level tokenizer writing llm.c token files"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: xmesh-train <command> [flags]   (xmesh-train <command> --help)\n"
               "commands:\n");
    for (size_t i = 0; i < sizeof g_commands / sizeof g_commands[0]; i++)
        fprintf(f, "  %-14s %s\n", g_commands[i].name, g_commands[i].help);
}

/* Keeps freed memory in the process. A training step allocates and frees the same activation,
 * gradient and staging buffers every microbatch; with glibc's defaults the larger ones are
 * mmap'ed and unmapped each time (or trimmed from the heap top), so every step faults in and
 * zeroes its pages again: on GPT-2 (L 4, C 128) over 8 ranks about 3000 page faults per rank per
 * step and 10-15% of the step (docs/PIPELINE.md, "Freed memory"). As PyTorch's caching
 * allocator and llm.c's one-time allocations do, the trainer keeps it: blocks up to glibc's
 * largest mmap threshold (32 MiB on 64-bit) come from the heap and the heap is never trimmed,
 * so the resident size stays at the step's peak. XMESH_KEEP_FREED=0 keeps glibc's defaults; a
 * GLIBC_TUNABLES naming glibc.malloc is the user's own choice and wins. */
static void keep_freed_memory(void)
{
#if defined(__GLIBC__) && defined(M_MMAP_THRESHOLD) && defined(M_TRIM_THRESHOLD)
    const char *e = getenv("XMESH_KEEP_FREED"), *t = getenv("GLIBC_TUNABLES");
    if (e != NULL && strcmp(e, "1") != 0) {
        if (strcmp(e, "0") != 0)
            fprintf(stderr, "xmesh-train: warning: XMESH_KEEP_FREED='%s' is not 0 or 1; using 1\n",
                    e);
        else
            return;
    }
    if (t != NULL && strstr(t, "glibc.malloc.") != NULL)
        return;
    /* the largest threshold glibc accepts (HEAP_MAX_SIZE / 2 = 4 MiB * sizeof(long)) */
    mallopt(M_MMAP_THRESHOLD, (int)(4 * 1024 * 1024 * sizeof(long)));
    mallopt(M_TRIM_THRESHOLD, -1); /* mallopt(3): -1 never trims */
#endif
}

int main(int argc, char **argv)
{
    keep_freed_memory();
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof g_commands / sizeof g_commands[0]; i++)
        if (!strcmp(argv[1], g_commands[i].name))
            return g_commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "xmesh-train: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
