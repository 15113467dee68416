/* xmesh-ckpt: offline checkpoint tool.
 *   xmesh-ckpt info DIR     manifest summary and shard verification
 *                           (DIR: a step directory or a root of steps)
 *   xmesh-ckpt convert DIR --to-llmc FILE
 *                           GPT-2 checkpoint -> llm.c v3 file (parameters)
 *   xmesh-ckpt convert --from-llmc FILE [layout flags] DIR
 *                           llm.c file -> GPT-2 checkpoint DIR/step-<N> in
 *                           the given layout (under mpirun when it needs
 *                           ranks), AdamW moments zero
 * Exit status: 0 when everything verified, 1 on a bad checkpoint, 2 on
 * usage errors. Runs as a single process (or under mpirun: rank 0 prints). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt.h"
#include "models/gpt2_ckpt.h"
#include "models/llmc_io.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: xmesh-ckpt info DIR\n"
               "       xmesh-ckpt convert DIR --to-llmc FILE\n"
               "       [mpirun -np N] xmesh-ckpt convert --from-llmc FILE [layout flags] DIR\n"
               "DIR: a step directory (holding MANIFEST) or a directory of step-N directories\n"
               "(the newest complete one is used); --from-llmc writes DIR/step-<--step>.\n"
               "layout flags (as xmesh-train gpt; the ranks must match): --layout 'E,t*2|t*2,L'\n"
               "  --stages N --stage-mesh 2x1,1x2 --strategy NAME|FILE (one for every stage)\n"
               "  --step N (0) --batch B (4) --seq T (64) --lr (1e-4) --beta1 (0.9)\n"
               "  --beta2 (0.999) --eps (1e-8) --weight-decay (0): recorded for --resume\n");
}

static void fmt_sbp(const xmp_sbp_t *s, int n, char *buf, size_t len)
{
    xmp_sbp_string(s, n, buf, len);
}

static int info(const char *path)
{
    xmp_ckpt_t *c = NULL;
    if (xmp_ckpt_open(MPI_COMM_SELF, path, &c) != XMESH_SUCCESS) {
        fprintf(stderr, "xmesh-ckpt: %s\n", xmp_last_error());
        return 1;
    }
    printf("checkpoint  %s\n", xmp_ckpt_dir(c));
    printf("format      %d\n", XMP_CKPT_FORMAT_VERSION);
    printf("step        %" PRId64 "\n", xmp_ckpt_step(c));
    printf("saved ranks %d\n", xmp_ckpt_saved_ranks(c));
    printf("metadata    %d entries\n", xmp_ckpt_meta_count(c));
    for (int i = 0; i < xmp_ckpt_meta_count(c); i++) {
        const char *k, *v;
        xmp_ckpt_meta_at(c, i, &k, &v);
        printf("  %-28s %s\n", k, v);
    }
    int64_t total = 0;
    printf("tensors     %d\n", xmp_ckpt_tensor_count(c));
    printf("  %-28s %-5s %-20s %-10s %-18s %-18s %7s %12s\n", "name", "dtype", "shape", "mesh",
           "sbp", "stored as", "blocks", "bytes");
    for (int i = 0; i < xmp_ckpt_tensor_count(c); i++) {
        xmp_ckpt_tensor_info_t t;
        char shape[96] = "", mesh[48] = "", sbp[64], st[64];
        size_t o = 0;
        xmp_ckpt_tensor_info(c, i, &t);
        for (int d = 0; d < t.ndim && o < sizeof shape; d++)
            o += (size_t)snprintf(shape + o, sizeof shape - o, "%s%" PRId64, d ? "x" : "",
                                  t.shape[d]);
        if (t.ndim == 0)
            snprintf(shape, sizeof shape, "scalar");
        o = 0;
        for (int a = 0; a < t.mesh_ndim && o < sizeof mesh; a++)
            o += (size_t)snprintf(mesh + o, sizeof mesh - o, "%s%d", a ? "x" : "", t.mesh_shape[a]);
        fmt_sbp(t.sbp, t.mesh_ndim, sbp, sizeof sbp);
        fmt_sbp(t.store, t.mesh_ndim, st, sizeof st);
        printf("  %-28s %-5s %-20s %-10s %-18s %-18s %7d %12" PRId64 "\n", t.name,
               xmesh_dtype_name(t.dtype), shape, mesh, sbp, st, t.nblocks, t.bytes);
        total += t.bytes;
    }
    printf("tensor bytes %" PRId64 "\n", total);
    int bad = 0;
    int64_t fbytes = 0;
    printf("files       %d\n", xmp_ckpt_file_count(c));
    for (int i = 0; i < xmp_ckpt_file_count(c); i++) {
        xmp_ckpt_file_info_t f;
        xmp_ckpt_file_info(c, i, &f);
        xmesh_result_t r = xmp_ckpt_verify_file(c, i);
        printf("  %-20s %12" PRId64 " bytes  crc32 0x%08" PRIx32 "  %s\n", f.name, f.size, f.crc32,
               r ? "BAD" : "ok");
        if (r) {
            printf("    %s\n", xmp_last_error());
            bad++;
        }
        fbytes += f.size;
    }
    printf("file bytes  %" PRId64 "\n", fbytes);
    printf("verify      %s\n", bad ? "FAILED" : "ok");
    xmp_ckpt_close(c);
    return bad ? 1 : 0;
}

/* convert DIR --to-llmc FILE: collective over MPI_COMM_WORLD (rank 0 writes). */
static int to_llmc(const char *dir, const char *file)
{
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    xmp_ckpt_t *c = NULL;
    xmesh_result_t r = xmp_ckpt_open(MPI_COMM_WORLD, dir, &c);
    if (!r)
        r = xmp_gpt2_ckpt_to_llmc(MPI_COMM_WORLD, c, file);
    if (rank == 0) {
        if (r)
            fprintf(stderr, "xmesh-ckpt: convert: %s\n", xmp_last_error());
        else
            printf("wrote %s from %s (step %" PRId64 ")\n", file, xmp_ckpt_dir(c),
                   xmp_ckpt_step(c));
    }
    xmp_ckpt_close(c);
    return r ? 1 : 0;
}

static int fail(int rank, const char *fmt, const char *a, const char *b)
{
    if (rank == 0) {
        fprintf(stderr, "xmesh-ckpt: convert: ");
        fprintf(stderr, fmt, a, b);
        fprintf(stderr, "\n");
    }
    return 1;
}

/* convert --from-llmc FILE [flags] DIR: collective over MPI_COMM_WORLD. Every rank reads the
 * file, builds its stage of the layout (models/gpt2_par.h) and the stages save their blocks
 * (models/gpt2_ckpt.h) with zero AdamW moments. */
static int from_llmc(int argc, char **argv)
{
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const char *file = NULL, *dir = NULL, *layout = NULL, *meshes = NULL, *strategy = "megatron";
    int stages = 0, step = 0, B = 4, T = 64;
    float lr = 1e-4f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, wd = 0.0f;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-') {
            if (dir)
                return fail(rank, "unexpected argument '%s' (the directory is '%s')", a, dir), 2;
            dir = a;
            continue;
        }
        if (i + 1 >= argc)
            return fail(rank, "%s needs a value%s", a, ""), 2;
        const char *v = argv[++i];
        char *end = NULL;
        if (!strcmp(a, "--from-llmc"))
            file = v;
        else if (!strcmp(a, "--layout"))
            layout = v;
        else if (!strcmp(a, "--stage-mesh") || !strcmp(a, "--mesh"))
            meshes = v;
        else if (!strcmp(a, "--strategy"))
            strategy = v;
        else if (!strcmp(a, "--stages") || !strcmp(a, "--step") || !strcmp(a, "--batch") ||
                 !strcmp(a, "--seq")) {
            long x = strtol(v, &end, 10);
            if (!*v || *end || x < 0 || x > (1L << 30) || (x == 0 && strcmp(a, "--step")))
                return fail(rank, "%s '%s': expected a positive integer", a, v), 2;
            *(!strcmp(a, "--stages")  ? &stages
              : !strcmp(a, "--step")  ? &step
              : !strcmp(a, "--batch") ? &B
                                      : &T) = (int)x;
        } else if (!strcmp(a, "--lr") || !strcmp(a, "--beta1") || !strcmp(a, "--beta2") ||
                   !strcmp(a, "--eps") || !strcmp(a, "--weight-decay")) {
            float x = strtof(v, &end);
            if (!*v || *end || !(x >= 0))
                return fail(rank, "%s '%s': expected a non-negative number", a, v), 2;
            *(!strcmp(a, "--lr")      ? &lr
              : !strcmp(a, "--beta1") ? &beta1
              : !strcmp(a, "--beta2") ? &beta2
              : !strcmp(a, "--eps")   ? &eps
                                      : &wd) = x;
        } else {
            return fail(rank, "unknown flag '%s'%s", a, ""), 2;
        }
    }
    if (!file || !dir)
        return fail(rank, "--from-llmc FILE and a directory DIR are required%s%s", "", ""), 2;
    xmp_gpt2_t m;
    memset(&m, 0, sizeof m);
    char err[640] = "";
    int bad = xmp_gpt2_load(&m, file) != 0;
    if (bad)
        snprintf(err, sizeof err, "--from-llmc: %s", xmp_last_error());
    int any = bad;
    if (xmp_agree(&any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD, "--from-llmc read")) {
        xmp_gpt2_free(&m);
        return fail(rank, "%s%s", xmp_last_error(), "");
    }
    if (any) {
        xmp_gpt2_free(&m);
        return fail(rank, "%s%s", *err ? err : "another rank could not read the file", "");
    }
    int L = m.cfg.num_layers, rc = 1;
    char *kinds = malloc((size_t)L + 3), alldp[32];
    xmp_stage_layout_t sl;
    xmp_strategy_t *strat = NULL;
    xmesh_ctx_t ctx = NULL;
    xmp_gpt2_stage_t *st = NULL;
    if (!kinds)
        goto out;
    kinds[0] = 'E';
    memset(kinds + 1, 't', (size_t)L);
    kinds[L + 1] = 'L';
    kinds[L + 2] = '\0';
    int nst = stages ? stages : (layout ? 0 : 1);
    if (!stages && !layout && meshes) {
        nst = 1;
        for (const char *p = meshes; *p; p++)
            nst += *p == ',';
    }
    snprintf(alldp, sizeof alldp, "%d", size);
    if (xmp_stage_layout_build(kinds, 1, 1, layout, nst, meshes,
                               !meshes && nst == 1 && !layout ? alldp : NULL, NULL, &sl, err,
                               sizeof err) != 0) {
        fail(rank, "layout: %s%s", err, "");
        goto out;
    }
    strat = calloc((size_t)sl.nstages, sizeof *strat);
    for (int s = 0; strat && s < sl.nstages; s++) {
        if (xmp_strategy_load(strategy, xmp_gpt2_strategy_builtin, XMP_GPT2_BUILTIN_STRATEGIES,
                              sl.ndim[s], &strat[s], err, sizeof err) != 0) {
            fail(rank, "--strategy: %s%s", err, "");
            goto out;
        }
    }
    if (!strat)
        goto out;
    if (xmesh_ctx_create_mpi(MPI_COMM_WORLD, NULL, &ctx) != XMESH_SUCCESS) {
        fail(rank, "xmesh context: %s%s", xmesh_last_error(), "");
        goto out;
    }
    xmp_gpt2_train_cfg_t tc = {.B = B,
                               .T = T,
                               .M = 1,
                               .lr = lr,
                               .beta1 = beta1,
                               .beta2 = beta2,
                               .eps = eps,
                               .wd = wd,
                               .strategy = strat};
    if (xmp_gpt2_stage_create(MPI_COMM_WORLD, ctx, &m, &sl, &tc, &st, err, sizeof err) != 0) {
        fail(rank, "layout: %s%s", err, "");
        goto out;
    }
    char src[600];
    snprintf(src, sizeof src, "%s", file);
    xmp_ckpt_kv_t extra[] = {{"converted_from", src}};
    if (xmp_gpt2_ckpt_save(st, MPI_COMM_WORLD, dir, step, 0, extra, 1) != XMESH_SUCCESS) {
        fail(rank, "%s%s", xmp_last_error(), "");
        goto out;
    }
    if (rank == 0) {
        char lay[256], ms[256];
        xmp_stage_layout_format(&sl, lay, sizeof lay);
        xmp_stage_layout_format_meshes(&sl, ms, sizeof ms);
        printf("wrote %s/step-%08d from %s: layout %s, meshes %s, strategy %s\n", dir, step, file,
               lay, ms, strategy);
    }
    rc = 0;
out:
    xmp_gpt2_stage_destroy(st);
    xmesh_ctx_destroy(ctx);
    free(strat);
    free(kinds);
    xmp_gpt2_free(&m);
    return rc;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, rc = 2;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (argc >= 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
        if (rank == 0)
            usage(stdout);
        rc = 0;
    } else if (argc == 3 && strcmp(argv[1], "info") == 0) {
        rc = rank == 0 ? info(argv[2]) : 0;
    } else if (argc == 5 && strcmp(argv[1], "convert") == 0 && strcmp(argv[3], "--to-llmc") == 0) {
        rc = to_llmc(argv[2], argv[4]);
    } else if (argc >= 3 && strcmp(argv[1], "convert") == 0) {
        rc = from_llmc(argc, argv);
    } else {
        if (rank == 0)
            usage(stderr);
    }
    if (xmp_bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD, "exit status")) {
        fprintf(stderr, "xmesh-ckpt: %s\n", xmp_last_error());
        xmp_end_job(1); /* a rank does not answer: MPI_Finalize would wait for it */
    }
    MPI_Finalize();
    return rc;
}
