/* xmesh-train: subcommand dispatch. Subcommands live in apps/cmd_*.c (see commands.h). */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "trainer.h"

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
    {"schedule", xmp_cmd_schedule,
     "simulate a pipeline schedule with given stage and transfer costs"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: xmesh-train <command> [flags]   (xmesh-train <command> --help)\n"
               "commands:\n");
    for (size_t i = 0; i < sizeof g_commands / sizeof g_commands[0]; i++)
        fprintf(f, "  %-14s %s\n", g_commands[i].name, g_commands[i].help);
}

int main(int argc, char **argv)
{
    xmp_train_keep_freed();
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
