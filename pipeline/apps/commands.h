/*
 * xmesh-train subcommands. Each takes the arguments AFTER the subcommand name (argv[0] is the
 * subcommand name itself) and returns the process exit code. To add a subcommand (e.g.
 * `utransformer`), declare it here and add one row to the table in apps/main.c.
 */
#ifndef XMP_APPS_COMMANDS_H
#define XMP_APPS_COMMANDS_H

#include <mpi.h>

#include "models/gpt2.h"

/* GPT-2 training: `xmesh-train gpt --serial ...` (apps/cmd_gpt.c). */
int xmp_cmd_gpt(int argc, char **argv);
/* Layout search: `xmesh-train gpt plan ...` (apps/cmd_plan.c; argv[0] is "plan"). */
int xmp_cmd_gpt_plan(int argc, char **argv);
/* Layout search: `xmesh-train utransformer plan ...` (apps/cmd_plan.c; argv[0] is "plan"). */
int xmp_cmd_ut_plan(int argc, char **argv);
/* `xmesh-train gpt --strategy auto` (apps/cmd_plan.c): the searched best configuration for
 * the ranks of comm, as flags (0, or -1 with the message printed on rank 0). */
typedef struct {
    char layout[512], stage_mesh[512], stage_strategy[512];
    int schedule, microbatches;
} xmp_plan_auto_t;
int xmp_cmd_gpt_plan_auto(MPI_Comm comm, const xmp_gpt2_config_t *cfg, int batch, int seq,
                          const char *cluster, xmp_plan_auto_t *out);
/* Byte-level tokenizer to llm.c token files (apps/cmd_tokenize.c). */
int xmp_cmd_tokenize(int argc, char **argv);

/* One schedule simulated with given costs: `xmesh-train schedule` (apps/cmd_schedule.c). */
int xmp_cmd_schedule(int argc, char **argv);

/* U-Transformer training: `xmesh-train utransformer` (apps/train_utransformer.c). */
int xmp_train_utransformer_main(int argc, char **argv);

#endif /* XMP_APPS_COMMANDS_H */
