/*
 * `xmesh-train gpt`: GPT-2 training with llm.c's CPU trainer semantics (train_gpt2.c):
 * B=4, T=64, AdamW lr 1e-4, betas (0.9, 0.999), eps 1e-8, weight decay 0, t = step+1,
 * shuffled training loader (MT19937 seeded 42+rank).
 *
 * This file is the GPT-2 side of the one trainer (apps/trainer.h): the model's own flags,
 * the serial model (models/gpt2.h) and the stages (models/gpt2_par.h) behind the trainer's
 * model interface. The loop, the common flags, statistics, JSON, --check-serial and the
 * re-planning are the trainer's. Every rank reads the same batches.
 */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"
#include "commands.h"
#include "models/gpt2.h"
#include "models/gpt2_ckpt.h"
#include "models/gpt2_par.h"
#include "models/llmc_io.h"
#include "models/stage_layout.h"
#include "trainer.h"

#ifndef XMP_DATA_DIR
#define XMP_DATA_DIR "pipeline/data"
#endif
#define XMP_DEFAULT_TEXT XMP_DATA_DIR "/kjv_genesis.txt"

/* The model's own flags (the common ones are in xmp_train_opts_t). */
typedef struct {
    const char *init_from;
    int layers, heads, channels, max_seq, vocab;
    const char *data, *text, *save, *val_data;
    int shuffle, batch, seq;
    float beta1, beta2, eps;
} gpt_opts_t;

/* The adapter's state: options, the serial model (serial runs and the --check-serial
 * reference), and the parallel run's full model, loader and stages. */
typedef struct {
    const xmp_train_opts_t *t;
    gpt_opts_t o;
    const char *desc; /* data description */
    xmp_gpt2_t sm;    /* serial */
    xmp_llmc_loader_t sld, svld;
    xmp_gpt2_t m; /* parallel: the full model every rank slices from */
    xmp_llmc_loader_t ld, vld;
    int step;
    uint64_t rng;         /* sampling (llm.c: xorshift64*, state 1337) */
    xmp_gpt2_stage_t *st; /* this rank's first stage (sts[0]) */
    /* virtual stages: one object per model stage of the rank's group (nst of them) */
    xmp_gpt2_stage_t *sts[XMP_MAX_STAGES];
    int nst;
    xmp_stage_ops_t sops[XMP_MAX_STAGES];
    double act_b[XMP_MAX_STAGES], ckpt_b[XMP_MAX_STAGES];
    int nstages, rank, size;
    int B;    /* rows per optimizer step: --batch x --grad-accum */
    float lr; /* the scheduled learning rate of the step */
    xmp_edge_cfg_t edges[XMP_MAX_STAGES];
    xmp_sedge_t sedges[XMP_MAX_STAGES];
    xmp_stage_mesh_t meshes[XMP_MAX_STAGES];
    char kinds[XMP_MAX_LAYERS + 1];
    xmp_ckpt_t *ck; /* --resume: opened by gpt_ckpt_open, loaded and closed by gpt_ckpt_load */
} gpt_run_t;

static void gpt_defaults(xmp_train_opts_t *t, gpt_opts_t *o)
{
    xmp_train_defaults(t);
    t->steps = 40;
    t->seed = 1337;
    t->lr = 1e-4f;
    t->wd = 0.0f;
    memset(o, 0, sizeof *o);
    o->layers = 4;
    o->heads = 4;
    o->channels = 128;
    o->max_seq = 1024;
    o->vocab = 256;
    o->shuffle = 1;
    o->batch = 4;
    o->seq = 64;
    o->beta1 = 0.9f;
    o->beta2 = 0.999f;
    o->eps = 1e-8f;
}

static void gpt_usage(void)
{
    printf("usage: xmesh-train gpt --serial [flags]\n"
           "       mpirun -np N xmesh-train gpt [--mesh RxC --dp N --tp N | pipeline flags] "
           "[flags]\n"
           "model (fresh GPT-2 init unless --init-from):\n"
           "  --init-from FILE    llm.c checkpoint (v3 f32; v1 read too)\n"
           "  --layers N (4) --heads N (4) --channels N (128) --max-seq N (1024)\n"
           "  --vocab N (256, byte level; padded to a multiple of 128) --seed N (1337)\n"
           "data:\n"
           "  --data FILE|GLOB    llm.c token file(s); default: the shipped text\n"
           "                      (" XMP_DEFAULT_TEXT "), byte-tokenized in memory\n"
           "  --text FILE         byte-tokenize this text in memory instead\n"
           "  --no-shuffle        visit samples in file order (llm.c's training loader shuffles)\n"
           "  --val-data FILE|GLOB  held-out token file(s) for --val-every; without it the\n"
           "                      last 10%% of the in-memory text is held out (--val-every)\n"
           "training (defaults = llm.c train_gpt2.c):\n"
           "  --batch B (4) --seq T (64) --steps N (40) --lr (1e-4) --beta1 (0.9)\n"
           "  --beta2 (0.999) --eps (1e-8) --weight-decay (0)\n"
           "  --save FILE         write an llm.c v3 checkpoint at the end\n"
           "strategies: built-in dp, megatron (default), 3d, axonn (docs/STRATEGY.md); auto:\n"
           "  the layout search picks stages, meshes, strategies, schedule, microbatches\n"
           "  (xmesh-train gpt plan --help)\n");
    xmp_train_usage();
}

/* Returns 0 ok, 1 help printed, -1 error (message printed). */
static int parse_gpt_flags(int argc, char **argv, xmp_train_opts_t *t, gpt_opts_t *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            gpt_usage();
            return 1;
        }
        int c = xmp_train_parse_flag(argc, argv, &i, t);
        if (c < 0)
            return -1;
        if (c > 0)
            continue;
        if (!strcmp(a, "--no-shuffle")) {
            o->shuffle = 0;
            continue;
        }
        const xmp_cli_flag_t f[] = {
            {"--layers", &o->layers, 1, 1024, NULL, 0, 0, NULL},
            {"--heads", &o->heads, 1, 1024, NULL, 0, 0, NULL},
            {"--channels", &o->channels, 1, 1 << 16, NULL, 0, 0, NULL},
            {"--max-seq", &o->max_seq, 1, 1 << 20, NULL, 0, 0, NULL},
            {"--vocab", &o->vocab, 1, 65536, NULL, 0, 0, NULL},
            {"--batch", &o->batch, 1, 1 << 20, NULL, 0, 0, NULL},
            {"--seq", &o->seq, 1, 1 << 20, NULL, 0, 0, NULL},
            {"--beta1", NULL, 0, 0, &o->beta1, 0.0, 0.999999, NULL},
            {"--beta2", NULL, 0, 0, &o->beta2, 0.0, 0.999999999, NULL},
            {"--eps", NULL, 0, 0, &o->eps, 0.0, 1.0, NULL},
            {"--init-from", NULL, 0, 0, NULL, 0, 0, &o->init_from},
            {"--data", NULL, 0, 0, NULL, 0, 0, &o->data},
            {"--text", NULL, 0, 0, NULL, 0, 0, &o->text},
            {"--save", NULL, 0, 0, NULL, 0, 0, &o->save},
            {"--val-data", NULL, 0, 0, NULL, 0, 0, &o->val_data},
        };
        if ((c = xmp_cli_table(argc, argv, &i, f, sizeof f / sizeof f[0])) <= 0)
            return c < 0 ? -1 : xmp_cli_error("unknown flag '%s' (see --help)", a);
    }
    if (xmp_train_check_flags(t) != 0)
        return -1;
    if (o->data && o->text)
        return xmp_cli_error("--data '%s' and --text '%s' are exclusive", o->data, o->text);
    if (t->resume && o->init_from)
        return xmp_cli_error("--resume '%s' and --init-from '%s' are exclusive (the model comes "
                             "from the checkpoint)",
                             t->resume, o->init_from);
    if (t->val_every && o->data && !o->val_data)
        return xmp_cli_error("--val-every %d with --data '%s': give the held-out split with "
                             "--val-data",
                             t->val_every, o->data);
    return 0;
}

static int setup_model(const xmp_train_opts_t *t, const gpt_opts_t *o, xmp_gpt2_t *m)
{
    if (o->init_from) {
        if (xmp_gpt2_load(m, o->init_from) != 0)
            return xmp_train_fail("--init-from: %s", xmp_last_error());
    } else {
        xmp_gpt2_config_t c = {.max_seq_len = o->max_seq,
                               .vocab_size = o->vocab,
                               .padded_vocab_size = xmp_gpt2_pad_vocab(o->vocab, 128),
                               .num_layers = o->layers,
                               .num_heads = o->heads,
                               .channels = o->channels};
        if (xmp_gpt2_init_random(m, &c, t->seed) != 0)
            return xmp_train_fail("model flags: %s", xmp_last_error());
    }
    if (o->seq > m->cfg.max_seq_len) {
        int ms = m->cfg.max_seq_len;
        xmp_gpt2_free(m);
        return xmp_train_fail("--seq %d exceeds the model's max_seq_len %d", o->seq, ms);
    }
    return 0;
}

/* The loaders give the B rows of one optimizer step (--batch x --grad-accum): training, and
 * with --val-every the held-out split (val: NULL without it): --val-data, or the last 10% of
 * the in-memory text (then not trained on). */
static int setup_data(const xmp_train_opts_t *t, const gpt_opts_t *o, int B, xmp_llmc_loader_t *ld,
                      xmp_llmc_loader_t *val, const char **desc)
{
    if (o->data) {
        *desc = o->data;
        if (xmp_llmc_loader_init(ld, o->data, B, o->seq, 0, 1, o->shuffle) != 0)
            return xmp_train_fail("--data: %s", xmp_last_error());
        if (t->val_every && xmp_llmc_loader_init(val, o->val_data, B, o->seq, 0, 1, 0) != 0) {
            xmp_llmc_loader_free(ld);
            return xmp_train_fail("--val-data: %s", xmp_last_error());
        }
        return 0;
    }
    const char *path = o->text ? o->text : XMP_DEFAULT_TEXT;
    *desc = path;
    char *text;
    size_t n;
    if (xmp_llmc_read_file(path, &text, &n) != 0)
        return xmp_train_fail("%s: %s", o->text ? "--text" : "default data", xmp_last_error());
    uint16_t *toks = malloc((n ? n : 1) * sizeof(uint16_t));
    if (!toks) {
        free(text);
        return xmp_train_fail("out of memory for %zu tokens", n);
    }
    xmp_llmc_tokenize_bytes(toks, text, n);
    free(text);
    size_t ntrain = t->val_every ? n - n / 10 : n;
    int rc = xmp_llmc_loader_init_tokens(ld, toks, ntrain, B, o->seq, 0, 1, o->shuffle);
    if (rc == 0 && t->val_every &&
        xmp_llmc_loader_init_tokens(val, toks + ntrain, n - ntrain, B, o->seq, 0, 1, 0) != 0) {
        xmp_llmc_loader_free(ld);
        rc = -1;
    }
    free(toks);
    if (rc != 0)
        return xmp_train_fail("data '%s'%s: %s", path, t->val_every ? " (held-out last 10%)" : "",
                              xmp_last_error());
    return 0;
}

/* ---- serial model ---- */

static int gpt_serial_open(void *u, int64_t *nparams)
{
    gpt_run_t *g = u;
    memset(&g->sm, 0, sizeof g->sm);
    g->rng = 1337; /* each run samples from the same state (the reference too) */
    memset(&g->sld, 0, sizeof g->sld);
    if (setup_model(g->t, &g->o, &g->sm) != 0)
        return -1;
    if (setup_data(g->t, &g->o, g->B, &g->sld, &g->svld, &g->desc) != 0) {
        xmp_gpt2_free(&g->sm);
        return -1;
    }
    *nparams = (int64_t)g->sm.num_params;
    return 0;
}

/* Sum of squares of n floats (double accumulation). */
static double sumsq(const float *g, size_t n)
{
    double s = 0;
    for (size_t k = 0; k < n; k++)
        s += (double)g[k] * g[k];
    return s;
}

/* One optimizer step over the step's B = --batch x --grad-accum rows: the mean loss over all
 * B*T tokens, as llm.c's accumulation over grad_accum batches gives it. */
static int gpt_serial_step(void *u, int step, double *loss, double *grad_norm)
{
    gpt_run_t *g = u;
    const gpt_opts_t *o = &g->o;
    if (xmp_llmc_loader_next(&g->sld) != 0 ||
        xmp_gpt2_forward(&g->sm, g->sld.inputs, g->sld.targets, g->B, o->seq) != 0)
        return xmp_train_fail("%s", xmp_last_error());
    xmp_gpt2_zero_grad(&g->sm);
    if (xmp_gpt2_backward(&g->sm) != 0)
        return xmp_train_fail("%s", xmp_last_error());
    if (g->t->grad_clip > 0) {
        *grad_norm = sqrt(sumsq(g->sm.grads, g->sm.num_params));
        if (*grad_norm > g->t->grad_clip) {
            float sc = (float)(g->t->grad_clip / *grad_norm);
            for (size_t k = 0; k < g->sm.num_params; k++)
                g->sm.grads[k] *= sc;
        }
    }
    if (xmp_gpt2_update(&g->sm, g->lr, o->beta1, o->beta2, o->eps, g->t->wd, step + 1) != 0)
        return xmp_train_fail("%s", xmp_last_error());
    *loss = g->sm.mean_loss;
    return 0;
}

static int gpt_serial_finish(void *u)
{
    gpt_run_t *g = u;
    if (!g->o.save)
        return 0;
    if (xmp_gpt2_save(&g->sm, g->o.save) != 0)
        return xmp_cli_error("--save: %s", xmp_last_error());
    printf("saved checkpoint '%s'\n", g->o.save);
    return 0;
}

/* Validation batch k: the held-out loader from its start at k = 0 (each validation sees the
 * same batches, like llm.c's val loader reset). */
static int next_val(const xmp_train_opts_t *t, xmp_llmc_loader_t *v, int k)
{
    if (!t->val_every)
        return xmp_train_fail("no held-out split (--val-every 0)");
    if ((k == 0 && xmp_llmc_loader_reset(v) != 0) || xmp_llmc_loader_next(v) != 0)
        return xmp_train_fail("validation data: %s", xmp_last_error());
    return 0;
}

static int gpt_serial_val(void *u, int k, double *loss)
{
    gpt_run_t *g = u;
    if (next_val(g->t, &g->svld, k) != 0)
        return -1;
    if (xmp_gpt2_forward(&g->sm, g->svld.inputs, g->svld.targets, g->B, g->o.seq) != 0)
        return xmp_train_fail("%s", xmp_last_error());
    *loss = g->sm.mean_loss;
    return 0;
}

static void gpt_serial_close(void *u)
{
    gpt_run_t *g = u;
    xmp_llmc_loader_free(&g->svld);
    xmp_llmc_loader_free(&g->sld);
    xmp_gpt2_free(&g->sm);
}

/* ---- stages ---- */

static int gpt_builtins(void *u, const char *name, int naxes, const int *shape, char *text,
                        size_t n, char *err, size_t errlen)
{
    (void)u;
    (void)shape;
    return xmp_gpt2_strategy_builtin(name, naxes, text, n, err, errlen);
}

static int gpt_strategy_check(void *u, const xmp_strategy_t *s, const xmp_stage_layout_t *sl,
                              int stage, char *err, size_t errlen)
{
    gpt_run_t *g = u;
    return xmp_gpt2_strategy_check(s, &g->m.cfg, stage, sl->ndim[stage], sl->shape[stage], err,
                                   errlen);
}

static int gpt_par_open(void *u, MPI_Comm comm, xmesh_ctx_t ctx, const xmp_stage_layout_t *sl,
                        const xmp_strategy_t *strat, xmp_train_stages_t *out)
{
    gpt_run_t *g = u;
    const xmp_train_opts_t *t = g->t;
    char err[1024];
    MPI_Comm_rank(comm, &g->rank);
    g->rng = 1337;
    MPI_Comm_size(comm, &g->size);
    xmp_gpt2_train_cfg_t tc = {.B = g->B,
                               .T = g->o.seq,
                               .M = t->microbatches * t->grad_accum,
                               .lr = g->lr,
                               .beta1 = g->o.beta1,
                               .beta2 = g->o.beta2,
                               .eps = g->o.eps,
                               .wd = t->wd,
                               .strategy = strat,
                               .recompute = t->recompute};
    if (xmp_gpt2_stages_create(comm, ctx, &g->m, sl, &tc, g->sts, err, sizeof err) != 0)
        return xmp_train_fail("%s", err);
    g->nst = xmp_gpt2_stages_max(sl);
    g->st = g->sts[0];
    g->nstages = sl->nstages;
    out->stage = xmp_gpt2_stage_index(g->st);
    out->ops = xmp_gpt2_stage_ops(g->st);
    memset(g->sops, 0, sizeof g->sops);
    for (int c = 0; c < g->nst; c++)
        if (xmp_gpt2_stage_index(g->sts[c]) >= 0)
            g->sops[xmp_gpt2_stage_index(g->sts[c])] = xmp_gpt2_stage_ops(g->sts[c]);
    out->stage_ops = sl->ngroups != sl->nstages ? g->sops : NULL;
    if (t->max_act_bytes > 0 || t->predict_memory) {
        /* per-microbatch activation bytes of each stage, measured by one forward (max over the
         * stage's ranks): the schedule's memory model */
        double keep[XMP_MAX_STAGES] = {0};
        int pfail = 0;
        memset(g->act_b, 0, sizeof g->act_b);
        memset(g->ckpt_b, 0, sizeof g->ckpt_b);
        for (int c = 0; c < g->nst; c++) {
            int s = xmp_gpt2_stage_index(g->sts[c]);
            if (s >= 0)
                pfail |= xmp_gpt2_stage_probe_bytes(g->sts[c], &g->act_b[s], &g->ckpt_b[s],
                                                    &keep[s]) != 0;
        }
        xmesh_result_t ar = xmp_agree(&pfail, 1, MPI_INT, MPI_MAX, comm, "activation probe");
        if (!ar)
            ar = xmp_agree(g->act_b, sl->nstages, MPI_DOUBLE, MPI_MAX, comm, "activation bytes");
        if (!ar)
            ar = xmp_agree(g->ckpt_b, sl->nstages, MPI_DOUBLE, MPI_MAX, comm, "checkpoint bytes");
        if (!ar)
            ar = xmp_agree(keep, sl->nstages, MPI_DOUBLE, MPI_MAX, comm, "selective keep");
        if (ar)
            return xmp_train_fail("--max-activation-bytes: %s", xmp_last_error());
        if (pfail)
            return xmp_train_fail("--max-activation-bytes: measuring the activations failed");
        out->act_bytes = g->act_b;
        out->ckpt_bytes = g->ckpt_b;
        for (int k = 0; k < sl->nstages; k++)
            out->selective_keep = keep[k] > out->selective_keep ? keep[k] : out->selective_keep;
    }
    out->nedges = xmp_gpt2_stage_edges(g->st, g->edges, g->sedges);
    xmp_gpt2_stage_meshes(g->st, g->meshes);
    out->edges = g->edges;
    out->sedges = g->sedges;
    out->meshes = g->meshes;
    out->edge_names = NULL;
    out->nparams = (int64_t)g->m.num_params;
    return 0;
}

static int gpt_par_set_step(void *u, int step)
{
    gpt_run_t *g = u;
    if (xmp_llmc_loader_next(&g->ld) != 0)
        return xmp_train_fail("%s", xmp_last_error());
    for (int c = 0; c < g->nst; c++)
        xmp_gpt2_stage_set_batch(g->sts[c], g->ld.inputs, g->ld.targets, step);
    g->step = step;
    return 0;
}

static int gpt_par_set_val(void *u, int k)
{
    gpt_run_t *g = u;
    if (next_val(g->t, &g->vld, k) != 0)
        return -1;
    for (int c = 0; c < g->nst; c++)
        xmp_gpt2_stage_set_batch(g->sts[c], g->vld.inputs, g->vld.targets, g->step);
    return 0;
}

static void gpt_par_release(void *u)
{
    gpt_run_t *g = u;
    for (int c = 0; c < g->nst; c++)
        xmp_gpt2_stage_release(g->sts[c]);
}

static void gpt_par_set_recompute(void *u, int mode)
{
    gpt_run_t *g = u;
    for (int c = 0; c < g->nst; c++)
        xmp_gpt2_stage_set_recompute(g->sts[c], mode);
}

/* ---- sampling (llm.c's generation: start token everywhere, position t from the logits at
 * t-1 of row 0, seeded multinomial over the real vocabulary or argmax) ---- */

static uint32_t rng_u32(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return (uint32_t)((*s * 0x2545F4914F6CDD1DULL) >> 32);
}

static int pick_token(const float *logits, int V, int greedy, uint64_t *rng)
{
    int best = 0;
    double mx = logits[0];
    for (int i = 1; i < V; i++)
        if (logits[i] > mx) {
            mx = logits[i];
            best = i;
        }
    if (greedy)
        return best;
    double sum = 0, cdf = 0;
    for (int i = 0; i < V; i++)
        sum += exp((double)logits[i] - mx);
    float coin = (float)(rng_u32(rng) >> 8) / 16777216.0f;
    for (int i = 0; i < V; i++) {
        cdf += exp((double)logits[i] - mx) / sum;
        if (coin < cdf)
            return i;
    }
    return V - 1;
}

static int gpt_sample(void *u, int (*eval)(void *ctx), void *ctx, char *out, size_t n)
{
    gpt_run_t *g = u;
    const int B = g->B, T = g->o.seq, L = g->t->sample_len;
    const xmp_gpt2_config_t *c = eval ? &g->m.cfg : &g->sm.cfg;
    const int V = c->vocab_size, Vp = c->padded_vocab_size, start = V > 10 ? 10 : 0;
    if (L >= T)
        return xmp_train_fail("--sample-len %d: at most --seq - 1 = %d tokens", L, T - 1);
    int *tok = malloc(sizeof(int) * (size_t)B * T), *tgt = calloc((size_t)B * T, sizeof(int));
    float *lg = malloc(sizeof(float) * (size_t)Vp);
    int rc = 0;
    if (!tok || !tgt || !lg)
        rc = xmp_train_fail("sampling: out of memory");
    for (int i = 0; !rc && i < B * T; i++)
        tok[i] = start;
    for (int t = 1; !rc && t <= L; t++) {
        const float *row = NULL;
        if (!eval) {
            if (xmp_gpt2_forward(&g->sm, tok, NULL, B, T) != 0) {
                rc = xmp_train_fail("sampling: %s", xmp_last_error());
                break;
            }
            row = xmp_gpt2_logits(&g->sm) + (size_t)(t - 1) * Vp;
        } else {
            /* virtual stages: every stage of the rank (the head may be any of them) */
            int have = 0;
            for (int k = 0; k < g->nst; k++) {
                xmp_gpt2_stage_set_batch(g->sts[k], tok, tgt, g->step);
                xmp_gpt2_stage_capture_logits(g->sts[k], t - 1);
            }
            rc = eval(ctx);
            for (int k = 0; k < g->nst; k++) {
                have |= rc == 0 && xmp_gpt2_stage_captured_logits(g->sts[k], lg);
                xmp_gpt2_stage_capture_logits(g->sts[k], -1);
            }
            if (rc)
                break;
            if (!have)
                memset(lg, 0, sizeof(float) * (size_t)Vp);
            /* exactly one rank holds them: the sum is that rank's logits, bit for bit */
            if (xmp_agree(lg, Vp, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, "sampled logits")) {
                rc = xmp_train_fail("sampling: %s", xmp_last_error());
                break;
            }
            row = lg;
        }
        tok[t] = pick_token(row, V, g->t->sample_greedy, &g->rng);
    }
    if (!rc) {
        size_t k = 0;
        for (int t = 1; t <= L && k + 1 < n; t++) {
            int b = tok[t];
            out[k++] = (char)((b >= 32 && b < 127) || b == '\n' ? b : '?');
        }
        out[k] = '\0';
    }
    free(tok);
    free(tgt);
    free(lg);
    return rc;
}

static void gpt_set_lr(void *u, float lr)
{
    gpt_run_t *g = u;
    g->lr = lr;
    for (int c = 0; c < g->nst; c++)
        xmp_gpt2_stage_set_lr(g->sts[c], lr);
}

/* virtual stages: over every stage of the rank (the tied wte counted on the first only) */
static double gpt_grad_sumsq(void *u)
{
    gpt_run_t *g = u;
    double s = 0;
    for (int c = 0; c < g->nst; c++)
        s += xmp_gpt2_stage_grad_sumsq(g->sts[c]);
    return s;
}

static void gpt_grad_scale(void *u, float scale)
{
    gpt_run_t *g = u;
    for (int c = 0; c < g->nst; c++)
        xmp_gpt2_stage_scale_grads(g->sts[c], scale);
}

static double gpt_par_edge_seconds(void *u, int xmesh_strategy)
{
    gpt_run_t *g = u;
    double x = 0;
    for (int k = 0; k + 1 < g->nstages; k++)
        x += xmp_gpt2_stage_edge_seconds(g->st, k, xmesh_strategy) / (g->nstages - 1);
    return x;
}

/* Parameter + optimizer bytes per rank (sharded storage shows here), and --save. */
static int gpt_par_finish(void *u, int ok, xmp_json_t *j)
{
    gpt_run_t *g = u;
    int64_t mine[5] = {0}, dummy[5];
    int64_t *all = g->rank == 0 ? calloc((size_t)g->size * 5, sizeof(int64_t)) : NULL;
    xmp_gpt2_stage_memory_t mem;
    mine[0] = xmp_gpt2_stage_index(g->st); /* virtual stages: the group's lowest */
    for (int c = 0; c < g->nst; c++) {     /* summed over the rank's stages */
        xmp_gpt2_stage_memory(g->sts[c], &mem);
        mine[1] += mem.param_bytes;
        mine[2] += mem.optimizer_bytes;
        mine[3] += mem.compute_param_bytes;
        mine[4] += mem.grad_bytes;
    }
    if (xmp_gather(mine, 5, all ? all : dummy, MPI_INT64_T, 0, MPI_COMM_WORLD, "memory per rank") !=
        XMESH_SUCCESS) {
        free(all);
        return -1;
    }
    if (all) {
        printf("memory per rank (bytes): stored parameters + AdamW moments (compute copies, "
               "gradient accumulators)\n");
        for (int r = 0; r < g->size; r++) {
            const int64_t *v = all + 5 * r;
            printf("  rank %d stage %lld: %lld + %lld = %lld (%lld, %lld)\n", r, (long long)v[0],
                   (long long)v[1], (long long)v[2], (long long)(v[1] + v[2]), (long long)v[3],
                   (long long)v[4]);
        }
        if (j) {
            xmp_json_arr_begin(j, "memory_per_rank");
            for (int r = 0; r < g->size; r++) {
                const int64_t *v = all + 5 * r;
                xmp_json_obj_begin(j, NULL);
                xmp_json_int(j, "rank", r);
                xmp_json_int(j, "stage", (long long)v[0]);
                xmp_json_int(j, "param_bytes", (long long)v[1]);
                xmp_json_int(j, "optimizer_bytes", (long long)v[2]);
                xmp_json_int(j, "compute_param_bytes", (long long)v[3]);
                xmp_json_int(j, "grad_bytes", (long long)v[4]);
                xmp_json_obj_end(j);
            }
            xmp_json_arr_end(j);
        }
        free(all);
    }
    int rc = 0;
    if (ok && g->o.save) {
        if (xmp_gpt2_stages_gather(g->sts, g->nst, &g->m) != 0) {
            rc = -1;
            if (g->rank == 0)
                xmp_cli_error("--save: gathering the parameters failed");
        } else if (g->rank == 0) {
            if (xmp_gpt2_save(&g->m, g->o.save) != 0) {
                xmp_cli_error("--save: %s", xmp_last_error());
                rc = -1;
            } else {
                printf("saved checkpoint '%s'\n", g->o.save);
            }
        }
    }
    return rc;
}

static void gpt_par_close(void *u)
{
    gpt_run_t *g = u;
    for (int c = 0; c < g->nst; c++) {
        xmp_gpt2_stage_destroy(g->sts[c]);
        g->sts[c] = NULL;
    }
    g->nst = 0;
    g->st = NULL;
}

/* ---- JSON and summary ---- */

/* ---- distributed checkpoints (models/gpt2_ckpt.h) ---- */

/* --resume: the model configuration, AdamW settings, batch and sequence length come from the
 * manifest; the full model is rebuilt from that configuration (its values are replaced by the
 * load), the layer kinds rewritten, and the loader re-made and moved to the saved position by
 * replaying data.batches batches (its shuffle RNG included). The same on every rank. */
static int gpt_ckpt_open(void *u, MPI_Comm comm, const char *dir, xmp_train_opts_t *o,
                         int64_t *step)
{
    gpt_run_t *g = u;
    xmp_gpt2_ckpt_settings_t s;
    if (xmp_gpt2_ckpt_open(comm, dir, &g->ck, &s) != XMESH_SUCCESS)
        return -1;
    const xmp_ckpt_t *ck = g->ck;
    const char *d = xmp_ckpt_meta(ck, "data"), *sh = xmp_ckpt_meta(ck, "data.shuffle");
    int64_t nb = 0;
    int L = s.cfg.num_layers;
    if (L + 2 > XMP_MAX_LAYERS)
        return xmp_train_fail("%s: %d layers: more than the %d a stage layout holds",
                              xmp_ckpt_dir(ck), L, XMP_MAX_LAYERS - 2);
    if (s.batch % o->grad_accum)
        return xmp_train_fail("%s: the checkpoint's batch of %d rows per step is not a multiple "
                              "of --grad-accum %d",
                              xmp_ckpt_dir(ck), s.batch, o->grad_accum);
    if (s.seq > s.cfg.max_seq_len)
        return xmp_train_fail("%s: train.seq %d exceeds config.max_seq_len %d", xmp_ckpt_dir(ck),
                              s.seq, s.cfg.max_seq_len);
    /* A checkpoint without a data position (xmesh-ckpt convert --from-llmc) starts the data
     * from the beginning, like --init-from. */
    if (xmp_ckpt_meta(ck, "data.batches")) {
        if (!d || strcmp(d, g->desc) != 0)
            return xmp_train_fail("%s/MANIFEST: metadata 'data' is '%s', this run reads '%s'",
                                  xmp_ckpt_dir(ck), d ? d : "(missing)", g->desc);
        if (!sh || atoi(sh) != g->o.shuffle)
            return xmp_train_fail("%s/MANIFEST: metadata 'data.shuffle' is '%s', this run has %d",
                                  xmp_ckpt_dir(ck), sh ? sh : "(missing)", g->o.shuffle);
        /* the in-memory text without its held-out last 10% (--val-every) is other data */
        const char *ho = xmp_ckpt_meta(ck, "data.heldout");
        int heldout = o->val_every && !g->o.data;
        if (ho && atoi(ho) != heldout)
            return xmp_train_fail("%s/MANIFEST: metadata 'data.heldout' is '%s' (the text's last "
                                  "10%% %s held out for validation), this run has %d (--val-every "
                                  "%d)",
                                  xmp_ckpt_dir(ck), ho, atoi(ho) ? "was" : "was not", heldout,
                                  o->val_every);
        if (xmp_ckpt_meta_i64(ck, "data.batches", &nb) != XMESH_SUCCESS)
            return -1;
    }
    xmp_gpt2_free(&g->m);
    memset(&g->m, 0, sizeof g->m);
    if (xmp_gpt2_init_random(&g->m, &s.cfg, o->seed) != 0)
        return xmp_train_fail("%s: %s", xmp_ckpt_dir(ck), xmp_last_error());
    g->B = s.batch; /* rows per optimizer step (--batch x --grad-accum when saved) */
    g->o.batch = s.batch / o->grad_accum;
    g->o.seq = s.seq;
    g->o.beta1 = s.beta1;
    g->o.beta2 = s.beta2;
    g->o.eps = s.eps;
    o->lr = s.lr; /* the base learning rate (the trainer's schedule starts from it) */
    o->wd = s.wd;
    g->lr = s.lr;
    g->t = o; /* the trainer's options, with the checkpoint's lr and weight decay */
    xmp_llmc_loader_free(&g->ld);
    xmp_llmc_loader_free(&g->vld);
    memset(&g->ld, 0, sizeof g->ld);
    memset(&g->vld, 0, sizeof g->vld);
    if (setup_data(o, &g->o, g->B, &g->ld, &g->vld, &g->desc) != 0)
        return -1;
    for (int64_t i = 0; i < nb; i++)
        if (xmp_llmc_loader_next(&g->ld) != 0)
            return xmp_train_fail("data position %lld: %s", (long long)nb, xmp_last_error());
    g->kinds[0] = 'E';
    memset(g->kinds + 1, 't', (size_t)L);
    g->kinds[L + 1] = 'L';
    g->kinds[L + 2] = '\0';
    *step = s.step;
    return 0;
}

static int gpt_ckpt_load(void *u, MPI_Comm comm, xmesh_ctx_t ctx)
{
    gpt_run_t *g = u;
    xmesh_result_t r = xmp_gpt2_ckpt_load(g->st, comm, ctx, g->ck);
    xmp_ckpt_close(g->ck);
    g->ck = NULL;
    return r == XMESH_SUCCESS ? 0 : -1;
}

/* Saves `step` steps done: one batch per step, so data.batches = step. */
static int gpt_ckpt_save(void *u, MPI_Comm comm, const char *dir, int64_t step, int keep)
{
    gpt_run_t *g = u;
    char nb[32], sh[8], seed[32], lr[40], ho[8];
    snprintf(ho, sizeof ho, "%d", g->t->val_every && !g->o.data);
    snprintf(nb, sizeof nb, "%lld", (long long)step);
    /* the base learning rate, not this step's scheduled one */
    snprintf(lr, sizeof lr, "%.17g", (double)g->t->lr);
    snprintf(sh, sizeof sh, "%d", g->o.shuffle);
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)g->t->seed);
    /* data.batches batches consumed; the loader's RNG (MT19937, the same on every rank) is
     * restored by replaying them. */
    xmp_ckpt_kv_t extra[] = {{"data", g->desc ? g->desc : ""},
                             {"data.shuffle", sh},
                             {"data.batches", nb},
                             {"data.heldout", ho},
                             {"rng.loader", "mt19937 seed 42, replayed over data.batches"},
                             {"seed", seed},
                             {"adamw.lr", lr}};
    return xmp_gpt2_ckpt_save(g->st, comm, dir, step, keep, extra,
                              (int)(sizeof extra / sizeof extra[0])) == XMESH_SUCCESS
               ? 0
               : -1;
}

static void gpt_json_model(void *u, xmp_json_t *j)
{
    gpt_run_t *g = u;
    const xmp_gpt2_config_t *c = g->t->serial ? &g->sm.cfg : &g->m.cfg;
    xmp_json_str(j, "init", g->o.init_from ? g->o.init_from : "random");
    if (!g->o.init_from)
        xmp_json_int(j, "seed", (long long)g->t->seed);
    xmp_json_int(j, "max_seq_len", c->max_seq_len);
    xmp_json_int(j, "vocab_size", c->vocab_size);
    xmp_json_int(j, "padded_vocab_size", c->padded_vocab_size);
    xmp_json_int(j, "num_layers", c->num_layers);
    xmp_json_int(j, "num_heads", c->num_heads);
    xmp_json_int(j, "channels", c->channels);
}

static void gpt_json_train(void *u, xmp_json_t *j)
{
    gpt_run_t *g = u;
    xmp_json_str(j, "data", g->desc ? g->desc : "");
    xmp_json_bool(j, "shuffle", g->o.shuffle);
    xmp_json_int(j, "batch", g->o.batch);
    xmp_json_int(j, "seq", g->o.seq);
    xmp_json_f32(j, "beta1", g->o.beta1);
    xmp_json_f32(j, "beta2", g->o.beta2);
    xmp_json_f32(j, "eps", g->o.eps);
}

static void gpt_describe(void *u, char *buf, size_t n)
{
    gpt_run_t *g = u;
    if (g->t->grad_accum > 1)
        snprintf(buf, n, "B=%dx%d T=%d", g->o.batch, g->t->grad_accum, g->o.seq);
    else
        snprintf(buf, n, "B=%d T=%d", g->o.batch, g->o.seq);
}

/* --strategy auto: the layout search (apps/cmd_plan.c) picks stages, meshes, strategies,
 * schedule and microbatch count for the ranks of comm. */
static int gpt_auto_layout(void *u, MPI_Comm comm, xmp_train_opts_t *o)
{
    gpt_run_t *g = u;
    static xmp_plan_auto_t best; /* the strings stay valid for the run */
    if (xmp_cmd_gpt_plan_auto(comm, &g->m.cfg, g->o.batch, g->o.seq, o->cluster, &best) != 0)
        return -1;
    o->layout = best.layout, o->stage_mesh = best.stage_mesh, o->strategy = NULL;
    o->stage_strategy = best.stage_strategy, o->schedule = best.schedule;
    o->microbatches = best.microbatches, o->mesh = o->stage_dp = o->stage_tp = NULL;
    o->stages = o->dp = o->tp = 0;
    g->t = o; /* the model reads the options the trainer runs with (microbatches, ...) */
    return 0;
}

int xmp_cmd_gpt(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "plan")) /* layout search (apps/cmd_plan.c) */
        return xmp_cmd_gpt_plan(argc - 1, argv + 1);
    xmp_cli_set_command("gpt");
    static gpt_run_t g; /* large (stage tables); one per process */
    xmp_train_opts_t t;
    memset(&g, 0, sizeof g);
    gpt_defaults(&t, &g.o);
    int p = parse_gpt_flags(argc, argv, &t, &g.o);
    if (p != 0)
        return p > 0 ? 0 : 2;
    g.t = &t;
    g.B = g.o.batch * t.grad_accum;
    g.lr = t.lr;
    g.rng = 1337;
    openblas_set_num_threads(t.blas_threads);
    xmp_train_model_t m;
    memset(&m, 0, sizeof m);
    m.name = "gpt";
    m.rate_key = "tokens_per_s";
    m.per_step = (double)g.B * g.o.seq;
    m.user = &g;
    m.builtins = gpt_builtins;
    m.builtin_names = XMP_GPT2_BUILTIN_STRATEGIES;
    m.strategy_check = gpt_strategy_check;
    m.serial_open = gpt_serial_open;
    m.serial_step = gpt_serial_step;
    m.serial_finish = gpt_serial_finish;
    m.serial_close = gpt_serial_close;
    m.set_lr = gpt_set_lr;
    m.sample = gpt_sample;
    m.serial_val = gpt_serial_val;
    m.par_set_val = gpt_par_set_val;
    m.par_release = gpt_par_release;
    m.grad_sumsq = gpt_grad_sumsq;
    m.grad_scale = gpt_grad_scale;
    m.par_open = gpt_par_open;
    m.auto_layout = gpt_auto_layout;
    m.par_set_recompute = gpt_par_set_recompute;
    m.par_set_step = gpt_par_set_step;
    m.par_edge_seconds = gpt_par_edge_seconds;
    m.par_finish = gpt_par_finish;
    m.par_close = gpt_par_close;
    m.json_model = gpt_json_model;
    m.json_train = gpt_json_train;
    m.describe = gpt_describe;
    m.ckpt_open = gpt_ckpt_open;
    m.ckpt_load = gpt_ckpt_load;
    m.ckpt_save = gpt_ckpt_save;
    m.fixed_head = 1;
    m.fixed_tail = 1;
    int rc;
    if (t.serial)
        return xmp_train_run(&t, &m);
    /* Parallel: every rank holds the full model (the stages slice it) and the same loader;
     * the layer kinds need the model's layer count (--init-from gives it). */
    if (setup_model(&t, &g.o, &g.m) != 0) {
        xmp_cli_error("%s", xmp_last_error());
        return 1;
    }
    if (setup_data(&t, &g.o, g.B, &g.ld, &g.vld, &g.desc) != 0) {
        xmp_cli_error("%s", xmp_last_error());
        xmp_gpt2_free(&g.m);
        return 1;
    }
    int L = g.m.cfg.num_layers;
    if (L + 2 > XMP_MAX_LAYERS) {
        xmp_cli_error("%d layers: more than the %d a stage layout holds", L, XMP_MAX_LAYERS - 2);
        rc = 1;
    } else {
        g.kinds[0] = 'E';
        memset(g.kinds + 1, 't', (size_t)L);
        g.kinds[L + 1] = 'L';
        g.kinds[L + 2] = '\0';
        m.kinds = g.kinds;
        rc = xmp_train_run(&t, &m);
    }
    xmp_ckpt_close(g.ck);
    xmp_llmc_loader_free(&g.vld);
    xmp_llmc_loader_free(&g.ld);
    xmp_gpt2_free(&g.m);
    return rc;
}
