/*
 * `xmesh-train gpt`: GPT-2 training with llm.c's CPU trainer semantics (train_gpt2.c):
 * B=4, T=64, AdamW lr 1e-4, betas (0.9, 0.999), eps 1e-8, weight decay 0, t = step+1,
 * shuffled training loader (MT19937 seeded 42+rank). Only --serial exists today.
 *
 * Structure for later work: gpt_opts_t holds every flag; parse_gpt_flags() fills it (add
 * --mesh RxC / --dp / --tp / pipeline flags there), setup_model() and setup_data() build the
 * pieces, and run_serial() is the serial loop. A parallel mode adds its own run_*() next to
 * run_serial() and reuses the step recorder (step_log_*) for JSON, progress and summary.
 */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"
#include "commands.h"
#include "models/gpt2.h"
#include "models/llmc_io.h"

#ifndef XMP_DATA_DIR
#define XMP_DATA_DIR "pipeline/data"
#endif
#define XMP_DEFAULT_TEXT XMP_DATA_DIR "/kjv_genesis.txt"

typedef struct {
    int serial;
    /* model */
    const char *init_from;
    int layers, heads, channels, max_seq, vocab;
    uint64_t seed;
    /* data */
    const char *data, *text;
    int shuffle;
    /* training (llm.c CPU trainer defaults) */
    int batch, seq, steps;
    float lr, beta1, beta2, eps, wd;
    /* output */
    const char *save, *json;
    int bench, warmup, blas_threads, log_steps, no_progress;
} gpt_opts_t;

static void gpt_defaults(gpt_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->layers = 4;
    o->heads = 4;
    o->channels = 128;
    o->max_seq = 1024;
    o->vocab = 256;
    o->seed = 1337;
    o->shuffle = 1;
    o->batch = 4;
    o->seq = 64;
    o->steps = 40;
    o->lr = 1e-4f;
    o->beta1 = 0.9f;
    o->beta2 = 0.999f;
    o->eps = 1e-8f;
    o->wd = 0.0f;
    o->warmup = 1;
    o->blas_threads = 1;
}

static void gpt_usage(void)
{
    printf("usage: xmesh-train gpt --serial [flags]\n"
           "model (fresh GPT-2 init unless --init-from):\n"
           "  --init-from FILE    llm.c checkpoint (v3 f32; v1 read too)\n"
           "  --layers N (4) --heads N (4) --channels N (128) --max-seq N (1024)\n"
           "  --vocab N (256, byte level; padded to a multiple of 128) --seed N (1337)\n"
           "data:\n"
           "  --data FILE|GLOB    llm.c token file(s); default: the shipped text\n"
           "                      (" XMP_DEFAULT_TEXT "), byte-tokenized in memory\n"
           "  --text FILE         byte-tokenize this text in memory instead\n"
           "  --no-shuffle        visit samples in file order (llm.c's training loader shuffles)\n"
           "training (defaults = llm.c train_gpt2.c):\n"
           "  --batch B (4) --seq T (64) --steps N (40) --lr (1e-4) --beta1 (0.9)\n"
           "  --beta2 (0.999) --eps (1e-8) --weight-decay (0)\n"
           "output:\n"
           "  --save FILE         write an llm.c v3 checkpoint at the end\n"
           "  --json FILE         configuration + one record per step\n"
           "  --log-steps         print llm.c-style 'step N: train loss L (took X ms)' lines\n"
           "  --no-progress       no progress bar (it is only drawn on a terminal anyway)\n"
           "  --bench             print tokens/s median/min/max over steps after --warmup (1)\n"
           "  --blas-threads N    OpenBLAS threads (1)\n");
}

/* Returns 0 ok, 1 help printed, -1 error (message printed). */
static int parse_gpt_flags(int argc, char **argv, gpt_opts_t *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            gpt_usage();
            return 1;
        }
        /* flags without a value */
        if (!strcmp(a, "--serial")) {
            o->serial = 1;
            continue;
        }
        if (!strcmp(a, "--no-shuffle")) {
            o->shuffle = 0;
            continue;
        }
        if (!strcmp(a, "--bench")) {
            o->bench = 1;
            continue;
        }
        if (!strcmp(a, "--log-steps")) {
            o->log_steps = 1;
            continue;
        }
        if (!strcmp(a, "--no-progress")) {
            o->no_progress = 1;
            continue;
        }
        /* flags with a value */
        const struct {
            const char *flag;
            int *ip;
            long lo, hi;
            float *fp;
            double flo, fhi;
            const char **sp;
        } t[] = {
            {"--layers", &o->layers, 1, 1024, NULL, 0, 0, NULL},
            {"--heads", &o->heads, 1, 1024, NULL, 0, 0, NULL},
            {"--channels", &o->channels, 1, 1 << 16, NULL, 0, 0, NULL},
            {"--max-seq", &o->max_seq, 1, 1 << 20, NULL, 0, 0, NULL},
            {"--vocab", &o->vocab, 1, 65536, NULL, 0, 0, NULL},
            {"--batch", &o->batch, 1, 1 << 20, NULL, 0, 0, NULL},
            {"--seq", &o->seq, 1, 1 << 20, NULL, 0, 0, NULL},
            {"--steps", &o->steps, 1, 1 << 30, NULL, 0, 0, NULL},
            {"--warmup", &o->warmup, 0, 1 << 30, NULL, 0, 0, NULL},
            {"--blas-threads", &o->blas_threads, 1, 1024, NULL, 0, 0, NULL},
            {"--lr", NULL, 0, 0, &o->lr, 0.0, 10.0, NULL},
            {"--beta1", NULL, 0, 0, &o->beta1, 0.0, 0.999999, NULL},
            {"--beta2", NULL, 0, 0, &o->beta2, 0.0, 0.999999999, NULL},
            {"--eps", NULL, 0, 0, &o->eps, 0.0, 1.0, NULL},
            {"--weight-decay", NULL, 0, 0, &o->wd, 0.0, 10.0, NULL},
            {"--init-from", NULL, 0, 0, NULL, 0, 0, &o->init_from},
            {"--data", NULL, 0, 0, NULL, 0, 0, &o->data},
            {"--text", NULL, 0, 0, NULL, 0, 0, &o->text},
            {"--save", NULL, 0, 0, NULL, 0, 0, &o->save},
            {"--json", NULL, 0, 0, NULL, 0, 0, &o->json},
        };
        size_t k, nt = sizeof t / sizeof t[0];
        for (k = 0; k < nt; k++)
            if (!strcmp(a, t[k].flag))
                break;
        if (k == nt) {
            if (!strcmp(a, "--seed")) {
                if (!(v = xmp_cli_value(argc, argv, &i)) || xmp_cli_u64(a, v, &o->seed) != 0)
                    return -1;
                continue;
            }
            if (!strcmp(a, "--mesh") || !strcmp(a, "--dp") || !strcmp(a, "--tp"))
                return xmp_cli_error("%s: parallel modes are not implemented yet; use --serial", a);
            return xmp_cli_error("unknown flag '%s' (see --help)", a);
        }
        if (!(v = xmp_cli_value(argc, argv, &i)))
            return -1;
        if (t[k].ip && xmp_cli_int(a, v, t[k].lo, t[k].hi, t[k].ip) != 0)
            return -1;
        if (t[k].fp && xmp_cli_float(a, v, t[k].flo, t[k].fhi, t[k].fp) != 0)
            return -1;
        if (t[k].sp)
            *t[k].sp = v;
    }
    if (!o->serial)
        return xmp_cli_error("only --serial is implemented (MPI parallel modes come later)");
    if (o->data && o->text)
        return xmp_cli_error("--data '%s' and --text '%s' are exclusive", o->data, o->text);
    if (o->bench && o->warmup >= o->steps)
        return xmp_cli_error("--warmup %d leaves no measured step of --steps %d", o->warmup,
                             o->steps);
    return 0;
}

static int setup_model(const gpt_opts_t *o, xmp_gpt2_t *m)
{
    if (o->init_from) {
        if (xmp_gpt2_load(m, o->init_from) != 0)
            return xmp_cli_error("--init-from: %s", xmp_llmc_last_error());
    } else {
        xmp_gpt2_config_t c = {.max_seq_len = o->max_seq,
                               .vocab_size = o->vocab,
                               .padded_vocab_size = xmp_gpt2_pad_vocab(o->vocab, 128),
                               .num_layers = o->layers,
                               .num_heads = o->heads,
                               .channels = o->channels};
        if (xmp_gpt2_init_random(m, &c, o->seed) != 0)
            return xmp_cli_error("model flags: %s", xmp_llmc_last_error());
    }
    if (o->seq > m->cfg.max_seq_len) {
        xmp_cli_error("--seq %d exceeds the model's max_seq_len %d", o->seq, m->cfg.max_seq_len);
        xmp_gpt2_free(m);
        return -1;
    }
    return 0;
}

static int setup_data(const gpt_opts_t *o, xmp_llmc_loader_t *ld, const char **desc)
{
    if (o->data) {
        *desc = o->data;
        if (xmp_llmc_loader_init(ld, o->data, o->batch, o->seq, 0, 1, o->shuffle) != 0)
            return xmp_cli_error("--data: %s", xmp_llmc_last_error());
        return 0;
    }
    const char *path = o->text ? o->text : XMP_DEFAULT_TEXT;
    *desc = path;
    char *text;
    size_t n;
    if (xmp_llmc_read_file(path, &text, &n) != 0)
        return xmp_cli_error("%s: %s", o->text ? "--text" : "default data", xmp_llmc_last_error());
    uint16_t *toks = malloc((n ? n : 1) * sizeof(uint16_t));
    if (!toks) {
        free(text);
        return xmp_cli_error("out of memory for %zu tokens", n);
    }
    xmp_llmc_tokenize_bytes(toks, text, n);
    free(text);
    int rc = xmp_llmc_loader_init_tokens(ld, toks, n, o->batch, o->seq, 0, 1, o->shuffle);
    free(toks);
    if (rc != 0)
        return xmp_cli_error("data '%s': %s", path, xmp_llmc_last_error());
    return 0;
}

/* ---- step recording: JSON records, progress bar, per-step log, timing stats ---- */

typedef struct {
    const gpt_opts_t *o;
    xmp_json_t json;
    xmp_progress_t bar;
    double *tps; /* tokens/s per step */
    float first_loss, last_loss;
    double t_start;
    int n;
} step_log_t;

static int step_log_open(step_log_t *s, const gpt_opts_t *o, const xmp_gpt2_t *m,
                         const char *data_desc, const char *mode)
{
    memset(s, 0, sizeof *s);
    s->o = o;
    s->tps = calloc((size_t)o->steps, sizeof(double));
    if (!s->tps)
        return xmp_cli_error("out of memory");
    if (o->json) {
        if (xmp_json_open(&s->json, o->json) != 0)
            return -1;
        xmp_json_t *j = &s->json;
        xmp_json_obj_begin(j, NULL);
        xmp_json_str(j, "command", "gpt");
        xmp_json_str(j, "mode", mode);
        xmp_json_obj_begin(j, "model");
        xmp_json_str(j, "init", o->init_from ? o->init_from : "random");
        if (!o->init_from)
            xmp_json_int(j, "seed", (long long)o->seed);
        xmp_json_int(j, "max_seq_len", m->cfg.max_seq_len);
        xmp_json_int(j, "vocab_size", m->cfg.vocab_size);
        xmp_json_int(j, "padded_vocab_size", m->cfg.padded_vocab_size);
        xmp_json_int(j, "num_layers", m->cfg.num_layers);
        xmp_json_int(j, "num_heads", m->cfg.num_heads);
        xmp_json_int(j, "channels", m->cfg.channels);
        xmp_json_int(j, "num_parameters", (long long)m->num_params);
        xmp_json_obj_end(j);
        xmp_json_obj_begin(j, "train");
        xmp_json_str(j, "data", data_desc);
        xmp_json_bool(j, "shuffle", o->shuffle);
        xmp_json_int(j, "batch", o->batch);
        xmp_json_int(j, "seq", o->seq);
        xmp_json_int(j, "steps", o->steps);
        xmp_json_f32(j, "lr", o->lr);
        xmp_json_f32(j, "beta1", o->beta1);
        xmp_json_f32(j, "beta2", o->beta2);
        xmp_json_f32(j, "eps", o->eps);
        xmp_json_f32(j, "weight_decay", o->wd);
        xmp_json_int(j, "blas_threads", o->blas_threads);
        xmp_json_obj_end(j);
        xmp_json_arr_begin(j, "steps");
    }
    xmp_progress_init(&s->bar, o->steps, o->no_progress);
    s->t_start = xmp_now();
    return 0;
}

static void step_log_record(step_log_t *s, int step, float loss, double seconds)
{
    size_t tokens = (size_t)s->o->batch * (size_t)s->o->seq;
    double tps = seconds > 0 ? (double)tokens / seconds : 0.0;
    if (s->n == 0)
        s->first_loss = loss;
    s->last_loss = loss;
    s->tps[s->n++] = tps;
    if (s->o->json) {
        xmp_json_obj_begin(&s->json, NULL);
        xmp_json_int(&s->json, "step", step);
        xmp_json_f32(&s->json, "loss", loss);
        xmp_json_num(&s->json, "step_seconds", seconds);
        xmp_json_num(&s->json, "tokens_per_s", tps);
        xmp_json_obj_end(&s->json);
    }
    if (s->o->log_steps) {
        xmp_progress_finish(&s->bar);
        printf("step %d: train loss %f (took %f ms)\n", step, loss, seconds * 1000.0);
    }
    xmp_progress_update(&s->bar, step + 1, loss, tps);
}

/* Closes the JSON (with a summary), prints the summary and, with --bench, the statistics. */
static int step_log_close(step_log_t *s, int ok)
{
    const gpt_opts_t *o = s->o;
    double total = xmp_now() - s->t_start;
    xmp_progress_finish(&s->bar);
    int skip = o->bench ? o->warmup : 0;
    if (skip >= s->n)
        skip = 0;
    double med = 0, mn = 0, mx = 0;
    if (s->n > 0)
        xmp_stats(s->tps + skip, (size_t)(s->n - skip), &med, &mn, &mx);
    int rc = 0;
    if (o->json) {
        xmp_json_arr_end(&s->json);
        xmp_json_obj_begin(&s->json, "summary");
        xmp_json_bool(&s->json, "completed", ok);
        xmp_json_int(&s->json, "steps_done", s->n);
        xmp_json_num(&s->json, "first_loss", s->n ? s->first_loss : NAN);
        xmp_json_num(&s->json, "final_loss", s->n ? s->last_loss : NAN);
        xmp_json_num(&s->json, "total_seconds", total);
        xmp_json_int(&s->json, "stats_skipped_steps", skip);
        xmp_json_num(&s->json, "tokens_per_s_median", med);
        xmp_json_num(&s->json, "tokens_per_s_min", mn);
        xmp_json_num(&s->json, "tokens_per_s_max", mx);
        xmp_json_obj_end(&s->json);
        xmp_json_obj_end(&s->json);
        rc = xmp_json_close(&s->json);
    }
    if (s->n > 0) {
        printf("gpt %s: %d steps B=%d T=%d, loss %.4f -> %.4f, %.0f tokens/s median, %.2f s\n",
               o->serial ? "serial" : "", s->n, o->batch, o->seq, s->first_loss, s->last_loss, med,
               total);
        if (o->bench)
            printf("bench: tokens/s over steps %d..%d (B*T=%d per step; step = next_batch + "
                   "forward + zero_grad + backward + update):\n"
                   "  median %.1f  min %.1f  max %.1f   (median %.3f ms/step)\n",
                   skip, s->n - 1, o->batch * o->seq, med, mn, mx,
                   med > 0 ? 1000.0 * o->batch * o->seq / med : 0.0);
    }
    free(s->tps);
    return rc;
}

/* ---- the serial training loop (llm.c train_gpt2.c main loop, minus eval/sampling) ---- */

static int run_serial(const gpt_opts_t *o)
{
    xmp_gpt2_t m;
    xmp_llmc_loader_t ld;
    step_log_t log;
    const char *desc = NULL;
    int rc = 1, ok = 0;
    if (setup_model(o, &m) != 0)
        return 1;
    if (setup_data(o, &ld, &desc) != 0)
        goto out_model;
    if (step_log_open(&log, o, &m, desc, "serial") != 0)
        goto out_data;
    const int B = o->batch, T = o->seq;
    for (int step = 0; step < o->steps; step++) {
        double t0 = xmp_now();
        if (xmp_llmc_loader_next(&ld) != 0 ||
            xmp_gpt2_forward(&m, ld.inputs, ld.targets, B, T) != 0)
            break;
        xmp_gpt2_zero_grad(&m);
        if (xmp_gpt2_backward(&m) != 0 ||
            xmp_gpt2_update(&m, o->lr, o->beta1, o->beta2, o->eps, o->wd, step + 1) != 0)
            break;
        double dt = xmp_now() - t0;
        step_log_record(&log, step, m.mean_loss, dt);
        if (!isfinite(m.mean_loss)) {
            xmp_llmc_fail("loss is %f at step %d", (double)m.mean_loss, step);
            break;
        }
        ok = step == o->steps - 1;
    }
    if (!ok)
        xmp_cli_error("training stopped: %s", xmp_llmc_last_error());
    if (step_log_close(&log, ok) != 0)
        ok = 0;
    if (ok && o->save) {
        if (xmp_gpt2_save(&m, o->save) != 0) {
            xmp_cli_error("--save: %s", xmp_llmc_last_error());
            ok = 0;
        } else {
            printf("saved checkpoint '%s'\n", o->save);
        }
    }
    rc = ok ? 0 : 1;
out_data:
    xmp_llmc_loader_free(&ld);
out_model:
    xmp_gpt2_free(&m);
    return rc;
}

int xmp_cmd_gpt(int argc, char **argv)
{
    xmp_cli_set_command("gpt");
    gpt_opts_t o;
    gpt_defaults(&o);
    int p = parse_gpt_flags(argc, argv, &o);
    if (p != 0)
        return p > 0 ? 0 : 2;
    openblas_set_num_threads(o.blas_threads);
    return run_serial(&o);
}
