/* xmesh-boxing-bytes: one GPT-2 training step over one stage with a built-in strategy, counting
 * the bytes every rank sends in nn/ collectives (xmp_comm_counts, ring-equivalent convention of
 * nn/sbp.h) per phase of the step: the driver's callbacks are wrapped and the counter is read
 * before and after each (forward; backward = backward_input + backward_weight + backward;
 * reduce_grads = gradient reductions; optimizer_step = storage gathers after the update; other =
 * anything between callbacks). Rank 0 writes one JSON object to stdout with each rank's counts.
 * Bytes are deterministic: they depend on shapes and SBPs only, not on timing.
 *   mpirun -n N xmesh-boxing-bytes --layers L --heads NH --channels C --vocab V --batch B
 *     --seq T --strategy dp|megatron|3d|axonn --mesh AxBxC [--microbatches M] */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/gpt2.h"
#include "models/gpt2_par.h"
#include "models/stage_layout.h"
#include "nn/sbp.h"
#include "nn/strategy.h"
#include "pipe/driver.h"
#include "sched/schedule.h"

enum { PH_F, PH_B, PH_R, PH_O, PH_OTHER, NPH };
static const char *const ph_name[NPH] = {"forward", "backward", "grad_reduce", "storage_gather",
                                         "other"};

typedef struct {
    xmp_stage_ops_t in;
    xmp_comm_counts_t acc[NPH];
} wrap_t;

static void add_diff(xmp_comm_counts_t *acc, const xmp_comm_counts_t *a, const xmp_comm_counts_t *b)
{
    for (int k = 0; k < XMP_COLL_NKINDS; k++) {
        acc->bytes[k] += b->bytes[k] - a->bytes[k];
        acc->payload[k] += b->payload[k] - a->payload[k];
        acc->calls[k] += b->calls[k] - a->calls[k];
    }
}

#define WRAP(ph, call)                                                                             \
    do {                                                                                           \
        xmp_comm_counts_t a_, b_;                                                                  \
        xmp_comm_counts(&a_);                                                                      \
        int rc_ = (call);                                                                          \
        xmp_comm_counts(&b_);                                                                      \
        add_diff(&w->acc[ph], &a_, &b_);                                                           \
        return rc_;                                                                                \
    } while (0)

static int w_f(void *u, int mb, const void *const *in, void *const *out, double *loss)
{
    wrap_t *w = u;
    WRAP(PH_F, w->in.forward(w->in.user, mb, in, out, loss));
}
static int w_bi(void *u, int mb, const void *const *go, void *const *gi)
{
    wrap_t *w = u;
    WRAP(PH_B, w->in.backward_input(w->in.user, mb, go, gi));
}
static int w_bw(void *u, int mb)
{
    wrap_t *w = u;
    WRAP(PH_B, w->in.backward_weight(w->in.user, mb));
}
static int w_b(void *u, int mb, const void *const *go, void *const *gi)
{
    wrap_t *w = u;
    WRAP(PH_B, w->in.backward(w->in.user, mb, go, gi));
}
static int w_r(void *u)
{
    wrap_t *w = u;
    WRAP(PH_R, w->in.reduce_grads(w->in.user));
}
static int w_o(void *u)
{
    wrap_t *w = u;
    WRAP(PH_O, w->in.optimizer_step(w->in.user));
}
static int64_t w_act(void *u)
{
    wrap_t *w = u;
    return w->in.activation_bytes ? w->in.activation_bytes(w->in.user) : 0;
}
static void w_sp(void *u, void (*fn)(void *arg), void *arg)
{
    wrap_t *w = u;
    if (w->in.set_progress)
        w->in.set_progress(w->in.user, fn, arg);
}

static int usage(int rank, const char *msg, const char *val)
{
    if (rank == 0)
        fprintf(stderr, "xmesh-boxing-bytes: %s '%s'\n", msg, val ? val : "");
    return 2;
}

int main(int argc, char **argv)
{
    int prov, rank, size, ret = 1;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &prov);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int L = 1, NH = 12, C = 768, V = 50257, B = 16, T = 64, M = 1;
    const char *strategy = "megatron", *mesh = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int *ip = !strcmp(a, "--layers")         ? &L
                  : !strcmp(a, "--heads")        ? &NH
                  : !strcmp(a, "--channels")     ? &C
                  : !strcmp(a, "--vocab")        ? &V
                  : !strcmp(a, "--batch")        ? &B
                  : !strcmp(a, "--seq")          ? &T
                  : !strcmp(a, "--microbatches") ? &M
                                                 : NULL;
        if (!v)
            return MPI_Finalize(), usage(rank, "missing value of", a);
        if (ip) {
            char *end;
            long x = strtol(v, &end, 10);
            if (*end || x < 1 || x > 1 << 24)
                return MPI_Finalize(), usage(rank, "bad value", v);
            *ip = (int)x;
        } else if (!strcmp(a, "--strategy")) {
            strategy = v;
        } else if (!strcmp(a, "--mesh")) {
            mesh = v;
        } else {
            return MPI_Finalize(), usage(rank, "unknown flag", a);
        }
        i++;
    }
    char err[1024] = "", kinds[260], sizes[32];
    if (L > 250)
        return MPI_Finalize(), usage(rank, "--layers at most 250, not", "");
    kinds[0] = 'E';
    memset(kinds + 1, 't', (size_t)L);
    kinds[L + 1] = 'L';
    kinds[L + 2] = '\0';
    snprintf(sizes, sizeof sizes, "%d", size);
    xmp_stage_layout_t sl;
    xmp_gpt2_t m;
    xmp_strategy_t strat;
    int have_m = 0;
    xmp_gpt2_stage_t *st = NULL;
    xmp_schedule_t *sched = NULL;
    xmp_driver_t *drv = NULL;
    xmesh_ctx_t ctx = NULL;
    int *tok = NULL;
    double *all = NULL;
    memset(&m, 0, sizeof m);
    if (xmp_stage_layout_build(kinds, 1, 1, NULL, 1, mesh ? mesh : sizes, NULL, NULL, &sl, err,
                               sizeof err)) {
        usage(rank, err, mesh);
        goto out;
    }
    if (sl.nranks != size) {
        usage(rank, "the mesh does not use every rank of the run:", mesh);
        goto out;
    }
    xmp_gpt2_config_t cfg = {.max_seq_len = T,
                             .vocab_size = V,
                             .padded_vocab_size = xmp_gpt2_pad_vocab(V, 128),
                             .num_layers = L,
                             .num_heads = NH,
                             .channels = C};
    if (xmp_gpt2_init_random(&m, &cfg, 1234)) {
        usage(rank, "model init failed", "");
        goto out;
    }
    have_m = 1;
    if (xmp_strategy_load(strategy, xmp_gpt2_strategy_builtin, XMP_GPT2_BUILTIN_STRATEGIES,
                          sl.ndim[0], &strat, err, sizeof err)) {
        usage(rank, err, strategy);
        goto out;
    }
    if (xmp_gpt2_strategy_check(&strat, &cfg, 0, sl.ndim[0], sl.shape[0], err, sizeof err)) {
        usage(rank, err, strategy);
        goto out;
    }
    if (xmesh_ctx_create_mpi(MPI_COMM_WORLD, NULL, &ctx) != XMESH_SUCCESS)
        goto out;
    xmp_gpt2_train_cfg_t tc = {.B = B,
                               .T = T,
                               .M = M,
                               .lr = 1e-4f,
                               .beta1 = 0.9f,
                               .beta2 = 0.95f,
                               .eps = 1e-8f,
                               .wd = 0.0f,
                               .strategy = &strat};
    if (xmp_gpt2_stage_create(MPI_COMM_WORLD, ctx, &m, &sl, &tc, &st, err, sizeof err)) {
        usage(rank, err, "");
        goto out;
    }
    xmp_edge_cfg_t edges[XMP_MAX_STAGES];
    xmp_sedge_t sedges[XMP_MAX_STAGES];
    xmp_stage_mesh_t meshes[XMP_MAX_STAGES];
    int ne = xmp_gpt2_stage_edges(st, edges, sedges);
    xmp_gpt2_stage_meshes(st, meshes);
    xmp_gen_opts_t go;
    memset(&go, 0, sizeof go);
    go.max_pending_w = 1;
    if (xmp_sched_generate(XMP_SCHED_1F1B, 1, M, ne, sedges, &go, &sched, err, sizeof err)) {
        usage(rank, err, "schedule");
        goto out;
    }
    static wrap_t w;
    memset(&w, 0, sizeof w);
    w.in = xmp_gpt2_stage_ops(st);
    xmp_stage_ops_t ops = {&w,
                           w.in.forward ? w_f : NULL,
                           w.in.backward_input ? w_bi : NULL,
                           w.in.backward_weight ? w_bw : NULL,
                           w.in.backward ? w_b : NULL,
                           w.in.reduce_grads ? w_r : NULL,
                           w.in.optimizer_step ? w_o : NULL,
                           w_act,
                           w_sp};
    xmp_driver_cfg_t dc;
    memset(&dc, 0, sizeof dc);
    dc.comm = MPI_COMM_WORLD;
    dc.ctx = ctx;
    dc.nstages = 1;
    dc.meshes = meshes;
    dc.nedges = ne;
    dc.edges = edges;
    dc.sched = sched;
    dc.ops = ops;
    dc.mode = XMP_COMM_SENDRECV;
    if (xmp_driver_create(&dc, &drv, err, sizeof err) != XMESH_SUCCESS) {
        usage(rank, err, "driver");
        goto out;
    }
    tok = malloc(sizeof(int) * 2 * (size_t)B * T);
    if (!tok)
        goto out;
    unsigned s = 99;
    for (int i = 0; i < 2 * B * T; i++)
        tok[i] = (int)((s = s * 1103515245u + 12345u) >> 8) % V;
    xmp_gpt2_stage_set_batch(st, tok, tok + B * T, 0);
    xmp_comm_counts_t a, b, tot;
    memset(&tot, 0, sizeof tot);
    xmp_comm_counts(&a);
    xmp_step_stats_t ss;
    int bad = xmp_driver_step(drv, &ss) != XMESH_SUCCESS, anybad = 0;
    xmp_comm_counts(&b);
    add_diff(&tot, &a, &b);
    MPI_Allreduce(&bad, &anybad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (anybad) {
        usage(rank, "the training step failed:", xmp_last_error());
        goto out;
    }
    /* other = total - sum of phases */
    w.acc[PH_OTHER] = tot;
    for (int p = 0; p < PH_OTHER; p++)
        for (int k = 0; k < XMP_COLL_NKINDS; k++) {
            w.acc[PH_OTHER].bytes[k] -= w.acc[p].bytes[k];
            w.acc[PH_OTHER].payload[k] -= w.acc[p].payload[k];
            w.acc[PH_OTHER].calls[k] -= w.acc[p].calls[k];
        }
    enum { PER = NPH * XMP_COLL_NKINDS * 3 };
    double mine[PER];
    for (int p = 0; p < NPH; p++)
        for (int k = 0; k < XMP_COLL_NKINDS; k++) {
            double *x = mine + (p * XMP_COLL_NKINDS + k) * 3;
            x[0] = w.acc[p].bytes[k];
            x[1] = (double)w.acc[p].payload[k];
            x[2] = (double)w.acc[p].calls[k];
        }
    if (rank == 0 && !(all = malloc(sizeof(double) * PER * (size_t)size)))
        MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Gather(mine, PER, MPI_DOUBLE, all, PER, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        printf("{\"strategy\": \"%s\", \"mesh\": \"%s\", \"ranks\": %d, \"layers\": %d, "
               "\"heads\": %d, \"channels\": %d, \"vocab\": %d, \"padded_vocab\": %d, "
               "\"batch\": %d, \"seq\": %d, \"microbatches\": %d,\n \"kinds\": [",
               strategy, mesh ? mesh : sizes, size, L, NH, C, V, cfg.padded_vocab_size, B, T, M);
        for (int k = 0; k < XMP_COLL_NKINDS; k++)
            printf("%s\"%s\"", k ? ", " : "", xmp_coll_kind_name(k));
        printf("],\n \"per_rank\": [");
        for (int r = 0; r < size; r++) {
            printf("%s\n  {", r ? "," : "");
            for (int p = 0; p < NPH; p++) {
                printf("%s\"%s\": {", p ? ", " : "", ph_name[p]);
                const char *f[3] = {"bytes", "payload", "calls"};
                for (int q = 0; q < 3; q++) {
                    printf("%s\"%s\": [", q ? ", " : "", f[q]);
                    for (int k = 0; k < XMP_COLL_NKINDS; k++)
                        printf("%s%.17g", k ? ", " : "",
                               all[(size_t)r * PER + (size_t)(p * XMP_COLL_NKINDS + k) * 3 + q]);
                    printf("]");
                }
                printf("}");
            }
            printf("}");
        }
        printf("\n ]}\n");
    }
    ret = 0;
out:
    free(all);
    free(tok);
    xmp_driver_destroy(drv);
    xmp_sched_destroy(sched);
    xmp_gpt2_stage_destroy(st);
    if (have_m)
        xmp_gpt2_free(&m);
    if (ctx)
        xmesh_ctx_destroy(ctx);
    MPI_Finalize();
    return ret;
}
