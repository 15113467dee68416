/*
 * `xmesh-train gpt`: GPT-2 training with llm.c's CPU trainer semantics (train_gpt2.c):
 * B=4, T=64, AdamW lr 1e-4, betas (0.9, 0.999), eps 1e-8, weight decay 0, t = step+1,
 * shuffled training loader (MT19937 seeded 42+rank).
 *
 * Modes: --serial (one process, the reference), or under mpirun one or more pipeline stages,
 * each a mesh of 1 to 4 axes of SBP-parallel layers (models/gpt2_par.h) run by the pipeline
 * driver (pipe/driver.h): --mesh RxC --dp N --tp N for one 2-axis stage, --stages / --layout /
 * --stage-mesh (2x2x2,1x4) / --stage-dp / --stage-tp for several; --strategy or
 * --stage-strategy give the SBP of every parameter and activation class (nn/strategy.h,
 * docs/STRATEGY.md). Every rank reads the same batches.
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
#include "models/gpt2_par.h"
#include "models/llmc_io.h"
#include "models/stage_layout.h"
#include "nn/overlap.h"
#include "pipe/driver.h"
#include "pipe/replan.h"
#include "sched/schedule.h"

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
    /* parallel: one stage (--mesh/--dp/--tp) or a pipeline */
    const char *mesh, *layout, *stage_mesh, *stage_dp, *stage_tp, *trace, *cluster;
    int dp, tp, stages, microbatches, schedule, delay_wgrad, comm, print_schedule;
    int check_serial;
    /* virtual stages and memory (issue 23) */
    int virtual_stages, recompute;
    const char *stage_groups, *max_act;
    double max_act_bytes;
    /* strategies (nn/strategy.h): one for all stages, or one per stage */
    const char *strategy, *stage_strategy;
    int print_strategy;
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
    o->microbatches = 1;
    o->schedule = XMP_SCHED_1F1B;
    o->comm = XMP_COMM_BROADCAST;
}

static void gpt_usage(void)
{
    printf(
        "usage: xmesh-train gpt --serial [flags]\n"
        "       mpirun -np N xmesh-train gpt [--mesh RxC --dp N --tp N | pipeline flags] [flags]\n"
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
        "  --blas-threads N    OpenBLAS threads (1)\n"
        "parallel (under mpirun; with --mesh/--dp/--tp a stage mesh is dp x tp):\n"
        "  --mesh RxC --dp N --tp N   one stage on all ranks (R = dp, C = tp)\n"
        "  --stages N          pipeline stages; blocks split evenly, E first, L last\n"
        "  --layout 'E,t*3|t*3,L'     explicit layers per stage (Megatron style)\n"
        "  --stage-mesh 2x2x2,1x4    per-stage meshes of 1 to 4 axes each (2x1,1x2: dp x tp)\n"
        "  --stage-dp 2,1  --stage-tp 1,2   per-stage 2-axis dp x tp meshes (shorthands)\n"
        "  --overlap none|all|bwd-input,defer-grad,prefetch,coll-matmul   communication overlap\n"
        "                      inside a stage (sets XMP_OVERLAP; numbers unchanged)\n"
        "  --strategy NAME|FILE       SBP of every parameter and activation class, all stages:\n"
        "                      built-in dp, megatron (default), 3d, axonn, or a strategy file\n"
        "                      (docs/STRATEGY.md); auto: the layout search picks stages,\n"
        "                      meshes, strategies, schedule, microbatches (gpt plan --help)\n"
        "  --stage-strategy A,B       one strategy (name or file) per stage\n"
        "  --print-strategy    print the resolved strategy of each stage and exit\n"
        "  --microbatches M (1) --schedule gpipe|1f1b|eager-1f1b|interleaved-1f1b|\n"
        "                      eager-interleaved-1f1b|zb-v|v-1f1b|dualpipe-v (1f1b) --delay-wgrad\n"
        "  --virtual-stages V  model stages per rank group (--stages R groups: R*V stages; the\n"
        "                      V shape kinds zb-v, v-1f1b, dualpipe-v need V = 2)\n"
        "  --stage-groups interleaved|v|LIST  stage -> rank group map when --layout has more\n"
        "                      stages than groups (default: the schedule's: v for the V kinds,\n"
        "                      else interleaved, stage c*R + r on group r); --stage-mesh gives\n"
        "                      one mesh per group or one per stage\n"
        "  --recompute none|block|selective   drop a block's activations after its forward and\n"
        "                      recompute them before its backward (selective: attention only)\n"
        "  --max-activation-bytes N   cap per rank group: the schedule's warm-up, eager sends and\n"
        "                      recomputation are chosen to stay under it, or refused naming\n"
        "                      the smallest cap it can meet\n"
        "  --comm broadcast|sendrecv|sendrecv-allgather|blocking|signal (broadcast)\n"
        "  --trace FILE        Chrome trace of compute, transfers and waits per rank\n"
        "  --cluster FILE      cost model of the transfers (xmesh-calibrate -o FILE; sets\n"
        "                      XMESH_CLUSTER_FILE): plans, predictions, the simulator\n"
        "  --print-schedule    print the schedule and its simulated timeline\n"
        "  --check-serial      rank 0 also trains the serial reference and fails unless the\n"
        "                      losses agree (1e-5 relative for steps 0-4, 1e-4 to step 19)\n");
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
        if (!strcmp(a, "--delay-wgrad")) {
            o->delay_wgrad = 1;
            continue;
        }
        if (!strcmp(a, "--print-schedule")) {
            o->print_schedule = 1;
            continue;
        }
        if (!strcmp(a, "--print-strategy")) {
            o->print_strategy = 1;
            continue;
        }
        if (!strcmp(a, "--check-serial")) {
            o->check_serial = 1;
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
            {"--dp", &o->dp, 1, 1 << 20, NULL, 0, 0, NULL},
            {"--tp", &o->tp, 1, 1 << 20, NULL, 0, 0, NULL},
            {"--stages", &o->stages, 1, XMP_MAX_STAGES, NULL, 0, 0, NULL},
            {"--virtual-stages", &o->virtual_stages, 1, XMP_MAX_STAGES, NULL, 0, 0, NULL},
            {"--stage-groups", NULL, 0, 0, NULL, 0, 0, &o->stage_groups},
            {"--max-activation-bytes", NULL, 0, 0, NULL, 0, 0, &o->max_act},
            {"--microbatches", &o->microbatches, 1, 1 << 20, NULL, 0, 0, NULL},
            {"--mesh", NULL, 0, 0, NULL, 0, 0, &o->mesh},
            {"--layout", NULL, 0, 0, NULL, 0, 0, &o->layout},
            {"--stage-mesh", NULL, 0, 0, NULL, 0, 0, &o->stage_mesh},
            {"--stage-dp", NULL, 0, 0, NULL, 0, 0, &o->stage_dp},
            {"--stage-tp", NULL, 0, 0, NULL, 0, 0, &o->stage_tp},
            {"--trace", NULL, 0, 0, NULL, 0, 0, &o->trace},
            {"--cluster", NULL, 0, 0, NULL, 0, 0, &o->cluster},
            {"--strategy", NULL, 0, 0, NULL, 0, 0, &o->strategy},
            {"--stage-strategy", NULL, 0, 0, NULL, 0, 0, &o->stage_strategy},
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
            if (!strcmp(a, "--schedule")) {
                if (!(v = xmp_cli_value(argc, argv, &i)))
                    return -1;
                if ((o->schedule = xmp_sched_kind_parse(v)) < 0)
                    return xmp_cli_error("--schedule '%s': expected gpipe, 1f1b, eager-1f1b, "
                                         "interleaved-1f1b, eager-interleaved-1f1b, zb-v, "
                                         "v-1f1b or dualpipe-v",
                                         v);
                continue;
            }
            if (!strcmp(a, "--overlap")) {
                xmp_overlap_t ov;
                if (!(v = xmp_cli_value(argc, argv, &i)))
                    return -1;
                if (xmp_overlap_parse(v, &ov))
                    return xmp_cli_error("--overlap: %s", xmp_last_error());
                setenv("XMP_OVERLAP", v, 1); /* read by every stage at creation */
                continue;
            }
            if (!strcmp(a, "--recompute")) {
                if (!(v = xmp_cli_value(argc, argv, &i)))
                    return -1;
                if ((o->recompute = xmp_recompute_parse(v)) < 0)
                    return xmp_cli_error("--recompute '%s': expected none, block or selective", v);
                continue;
            }
            if (!strcmp(a, "--comm")) {
                if (!(v = xmp_cli_value(argc, argv, &i)))
                    return -1;
                if ((o->comm = xmp_comm_mode_parse(v)) < 0)
                    return xmp_cli_error("--comm '%s': expected broadcast, sendrecv, "
                                         "sendrecv-allgather, blocking or signal",
                                         v);
                continue;
            }
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
    /* Every plan's cluster model reads it (the library applies the file on
     * top of XMESH_*), so the schedule's predicted transfers use it too. */
    if (o->cluster)
        setenv("XMESH_CLUSTER_FILE", o->cluster, 1);
    if (o->serial &&
        (o->mesh || o->dp || o->tp || o->stages || o->layout || o->stage_mesh || o->stage_dp ||
         o->stage_tp || o->strategy || o->stage_strategy || o->print_strategy))
        return xmp_cli_error("--serial runs one process: drop the mesh, stage and strategy flags");
    if (o->strategy && o->stage_strategy)
        return xmp_cli_error("--strategy '%s' and --stage-strategy '%s' are exclusive", o->strategy,
                             o->stage_strategy);
    if (o->mesh && (o->stages > 1 || o->layout || o->stage_mesh))
        return xmp_cli_error("--mesh '%s' is one stage; use --stage-mesh for several", o->mesh);
    if (o->max_act) {
        char *end = NULL;
        o->max_act_bytes = strtod(o->max_act, &end);
        if (!end || *end || !(o->max_act_bytes > 0))
            return xmp_cli_error("--max-activation-bytes '%s': expected a positive number",
                                 o->max_act);
    }
    if (o->serial && (o->virtual_stages > 1 || o->stage_groups))
        return xmp_cli_error("--serial runs one process: drop --virtual-stages/--stage-groups");
    if (o->mesh && (o->virtual_stages > 1 || o->stage_groups))
        return xmp_cli_error("--mesh '%s' is one stage; virtual stages need --stage-mesh", o->mesh);
    if (o->check_serial && o->comm == XMP_COMM_SIGNAL)
        return xmp_cli_error("--check-serial with --comm signal: signal moves no data");
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
    /* parallel runs, rank 0: per rank {stage, param, optimizer, compute param, grad bytes} */
    const int64_t *mem;
    int mem_ranks;
    const xmp_stage_layout_t *sl; /* parallel runs: stage meshes and strategies */
    const xmp_strategy_t *strat;
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
        if (xmp_json_open(&s->json, o->json) != 0) {
            free(s->tps);
            return -1;
        }
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

/* Extra per-step figures of the parallel modes (NULL for serial). */
typedef struct {
    double loss_exact;          /* loss as a double (the JSON "loss" of parallel runs) */
    double compute_s, boxing_s; /* rank 0: in stage callbacks; in boxing collectives */
    double predicted_s;         /* pipeline simulator (0: none) */
    int nstages;
    double bubble[XMP_MAX_STAGES]; /* per stage: max over its ranks of the idle fraction */
    int64_t peak_bytes[XMP_MAX_STAGES];
    int peak_mb[XMP_MAX_STAGES];
    /* per stage (its group's ranks, max): the step's peak of measured allocations (nn/sbp.h
     * xmp_mem_peak_bytes) above what was live before it: activations, op temporaries,
     * recomputed tensors; -1: not recorded */
    int64_t alloc_bytes[XMP_MAX_STAGES];
} step_extra_t;

static void step_log_record_ex(step_log_t *s, int step, float loss, double seconds,
                               const step_extra_t *ex);
static void step_log_record(step_log_t *s, int step, float loss, double seconds)
{
    step_log_record_ex(s, step, loss, seconds, NULL);
}

static void step_log_record_ex(step_log_t *s, int step, float loss, double seconds,
                               const step_extra_t *ex)
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
        if (ex)
            xmp_json_num(&s->json, "loss", ex->loss_exact);
        else
            xmp_json_f32(&s->json, "loss", loss);
        xmp_json_num(&s->json, "step_seconds", seconds);
        xmp_json_num(&s->json, "tokens_per_s", tps);
        if (ex) {
            xmp_step_pipe_t sp = {ex->compute_s, ex->boxing_s, ex->predicted_s, ex->nstages,
                                  ex->bubble,    ex->peak_mb,  ex->peak_bytes};
            xmp_json_step_pipeline(&s->json, &sp);
            if (ex->alloc_bytes[0] >= 0) {
                xmp_json_arr_begin(&s->json, "peak_alloc_bytes");
                for (int k = 0; k < ex->nstages; k++)
                    xmp_json_int(&s->json, NULL, (long long)ex->alloc_bytes[k]);
                xmp_json_arr_end(&s->json);
            }
        }
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
        if (s->sl && s->strat) {
            xmp_json_arr_begin(&s->json, "stages");
            for (int k = 0; k < s->sl->nstages; k++) {
                char mesh[64] = "";
                for (int a = 0, at = 0; a < s->sl->ndim[k] && at < (int)sizeof mesh; a++)
                    at += snprintf(mesh + at, sizeof mesh - (size_t)at, "%s%d", a ? "x" : "",
                                   s->sl->shape[k][a]);
                xmp_json_obj_begin(&s->json, NULL);
                xmp_json_str(&s->json, "mesh", mesh);
                xmp_json_str(&s->json, "strategy", s->strat[k].name);
                xmp_json_str(&s->json, "strategy_source", s->strat[k].source);
                xmp_json_obj_end(&s->json);
            }
            xmp_json_arr_end(&s->json);
        }
        if (s->mem) {
            xmp_json_arr_begin(&s->json, "memory_per_rank");
            for (int r = 0; r < s->mem_ranks; r++) {
                const int64_t *v = s->mem + 5 * r;
                xmp_json_obj_begin(&s->json, NULL);
                xmp_json_int(&s->json, "rank", r);
                xmp_json_int(&s->json, "stage", (long long)v[0]);
                xmp_json_int(&s->json, "param_bytes", (long long)v[1]);
                xmp_json_int(&s->json, "optimizer_bytes", (long long)v[2]);
                xmp_json_int(&s->json, "compute_param_bytes", (long long)v[3]);
                xmp_json_int(&s->json, "grad_bytes", (long long)v[4]);
                xmp_json_obj_end(&s->json);
            }
            xmp_json_arr_end(&s->json);
        }
        xmp_json_obj_end(&s->json);
        xmp_json_obj_end(&s->json);
        rc = xmp_json_close(&s->json);
    }
    if (s->n > 0) {
        printf("gpt %s: %d steps B=%d T=%d, loss %.4f -> %.4f, %.0f tokens/s median, %.2f s\n",
               o->serial ? "serial" : "parallel", s->n, o->batch, o->seq, s->first_loss,
               s->last_loss, med, total);
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

/* ---- parallel: stages of SBP layers under the pipeline driver ---- */

/* The serial reference's per-step losses (for --check-serial, on rank 0). */
static int serial_losses(const gpt_opts_t *o, double *out)
{
    xmp_gpt2_t m;
    xmp_llmc_loader_t ld;
    const char *desc;
    int rc = -1;
    if (setup_model(o, &m) != 0)
        return -1;
    if (setup_data(o, &ld, &desc) != 0)
        goto out_model;
    for (int step = 0; step < o->steps; step++) {
        if (xmp_llmc_loader_next(&ld) != 0 ||
            xmp_gpt2_forward(&m, ld.inputs, ld.targets, o->batch, o->seq) != 0)
            goto out_data;
        xmp_gpt2_zero_grad(&m);
        if (xmp_gpt2_backward(&m) != 0 ||
            xmp_gpt2_update(&m, o->lr, o->beta1, o->beta2, o->eps, o->wd, step + 1) != 0)
            goto out_data;
        out[step] = m.mean_loss;
    }
    rc = 0;
out_data:
    xmp_llmc_loader_free(&ld);
out_model:
    xmp_gpt2_free(&m);
    return rc;
}

/* Builds the stage layout from the flags (the same on every rank). */
/* 1 for the V-shape kinds (their default map puts stages r and 2R-1-r on group r). */
static int kind_vshape(int kind)
{
    return kind == XMP_SCHED_ZB_V || kind == XMP_SCHED_V_1F1B || kind == XMP_SCHED_DUALPIPE_V;
}

static int parallel_layout(const gpt_opts_t *o, int L, int size, xmp_stage_layout_t *sl, char *err,
                           size_t errlen)
{
    char *kinds = malloc((size_t)L + 3);
    if (!kinds)
        return snprintf(err, errlen, "out of memory"), -1;
    kinds[0] = 'E';
    memset(kinds + 1, 't', (size_t)L);
    kinds[L + 1] = 'L';
    kinds[L + 2] = '\0';
    char dps[32], tps[32];
    const char *meshes = o->mesh ? o->mesh : o->stage_mesh, *dp = o->stage_dp, *tp = o->stage_tp;
    if (o->dp) {
        snprintf(dps, sizeof dps, "%d", o->dp);
        dp = dps;
    }
    if (o->tp) {
        snprintf(tps, sizeof tps, "%d", o->tp);
        tp = tps;
    }
    if (o->mesh && !dp && !tp) {
        dp = NULL; /* the mesh gives both */
    } else if (o->mesh) {
        if (!dp)
            dp = "1";
        if (!tp)
            tp = "1";
    }
    int stages = o->stages ? o->stages : (o->layout ? 0 : 1);
    if (!o->stages && !o->layout && o->stage_mesh) { /* one stage per mesh */
        stages = 1;
        for (const char *p = o->stage_mesh; *p; p++)
            stages += *p == ',';
    }
    /* Without any mesh flag: one stage, dp = ranks (pure data parallel). */
    char alldp[32];
    if (!meshes && !dp && !tp && stages == 1 && !o->layout) {
        snprintf(alldp, sizeof alldp, "%d", size);
        dp = alldp;
    }
    /* Virtual stages: R rank groups (--stages, else one per --stage-mesh entry), S model
     * stages (--layout's, else R * V), placed by --stage-groups or the schedule's map. */
    int rc;
    if (o->virtual_stages > 1 || o->stage_groups) {
        int nmesh = 0;
        for (const char *p = o->stage_mesh; p && *p; p++)
            nmesh += *p == ',';
        int R = o->stages ? o->stages : o->stage_mesh ? nmesh + 1 : 1;
        const char *mt = o->stage_groups            ? o->stage_groups
                         : kind_vshape(o->schedule) ? "v"
                                                    : "interleaved";
        rc = xmp_stage_layout_build_groups(kinds, 1, 1, o->layout, R,
                                           o->virtual_stages ? o->virtual_stages : 1, mt, meshes,
                                           dp, tp, sl, err, errlen);
    } else {
        rc =
            xmp_stage_layout_build(kinds, 1, 1, o->layout, stages, meshes, dp, tp, sl, err, errlen);
    }
    free(kinds);
    return rc;
}

/* Re-plans (pipe/replan.h) with the measured per-microbatch costs and the mean of xmesh's
 * predicted boundary transfer times (plans with the comm mode's strategy), so that the W
 * actions fill the waits the transfers cause. Collective. -1 (message on rank 0) on failure. */
static int replan(const gpt_opts_t *o, xmp_gpt2_stage_t *st, const xmp_stage_layout_t *sl,
                  const xmp_sedge_t *sedges, int ne, const double *f, const double *fi,
                  const double *fw, xmp_driver_cfg_t *dc, xmp_schedule_t **sched,
                  xmp_driver_t **drv)
{
    int rank, S = sl->nstages;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int strategy = o->comm == XMP_COMM_SENDRECV             ? XMESH_STRATEGY_SENDRECV
                   : o->comm == XMP_COMM_SENDRECV_ALLGATHER ? XMESH_STRATEGY_SENDRECV_ALLGATHER
                                                            : XMESH_STRATEGY_BROADCAST;
    double x = 0;
    for (int k = 0; k + 1 < S; k++)
        x += xmp_gpt2_stage_edge_seconds(st, k, strategy) / (S - 1);
    xmp_replan_t rp = {o->schedule,
                       o->microbatches,
                       ne,
                       sedges,
                       f,
                       fi,
                       fw,
                       o->comm == XMP_COMM_SIGNAL ? 0 : x,
                       o->print_schedule};
    char err[640];
    if (xmp_pipe_replan(&rp, dc, sched, drv, err, sizeof err) != 0) {
        if (rank == 0)
            xmp_cli_error("%s", err);
        return -1;
    }
    return 0;
}

/* Resolves the strategy of every stage (the same on every rank): --strategy for
 * all, --stage-strategy per stage (one entry: all), else megatron; each loaded
 * for its stage's axis count and checked against the model. */
static int resolve_strategies(const gpt_opts_t *o, const xmp_gpt2_config_t *cfg,
                              const xmp_stage_layout_t *sl, xmp_strategy_t *out, char *err,
                              size_t errlen)
{
    char names[XMP_MAX_STAGES][256];
    int n = 0;
    const char *flag = o->stage_strategy ? "--stage-strategy" : "--strategy";
    const char *list = o->stage_strategy ? o->stage_strategy : o->strategy;
    if (!list)
        list = "megatron";
    for (const char *p = list;; n++) {
        const char *q = strchr(p, ',');
        size_t len = q ? (size_t)(q - p) : strlen(p);
        if (n >= XMP_MAX_STAGES || len == 0 || len >= sizeof names[0] || (!o->stage_strategy && q))
            return snprintf(err, errlen, "%s '%s': expected %s", flag, list,
                            o->stage_strategy ? "one name or file per stage, separated by ','"
                                              : "one name or file (per stage: --stage-strategy)"),
                   -1;
        memcpy(names[n], p, len);
        names[n][len] = '\0';
        if (!q) {
            n++;
            break;
        }
        p = q + 1;
    }
    if (n != 1 && n != sl->nstages)
        return snprintf(err, errlen, "%s '%s' has %d entries for %d stages", flag, list, n,
                        sl->nstages),
               -1;
    for (int s = 0; s < sl->nstages; s++) {
        char sub[640];
        if (xmp_strategy_load(names[n == 1 ? 0 : s], xmp_gpt2_strategy_builtin,
                              XMP_GPT2_BUILTIN_STRATEGIES, sl->ndim[s], &out[s], sub, sizeof sub))
            return snprintf(err, errlen, "stage %d: %.400s", s, sub), -1;
        if (xmp_gpt2_strategy_check(&out[s], cfg, s, sl->ndim[s], sl->shape[s], err, errlen))
            return -1;
    }
    return 0;
}

static int run_parallel(const gpt_opts_t *oin)
{
    int prov, rank, size, rc = 1;
    MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &prov);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    gpt_opts_t o1 = *oin, *o = &o1;
    if (rank != 0) {
        o->no_progress = 1;
        o->json = NULL;
        o->log_steps = 0;
    }
    char err[512] = "";
    xmp_stage_layout_t sl;
    xmp_gpt2_t m;
    memset(&m, 0, sizeof m);
    xmp_llmc_loader_t ld;
    memset(&ld, 0, sizeof ld);
    xmesh_ctx_t ctx = NULL;
    xmp_gpt2_stage_t *st = NULL, *sts[XMP_MAX_STAGES] = {NULL};
    int nst = 0, virt = 0;
    xmp_stage_ops_t sops[XMP_MAX_STAGES];
    xmp_schedule_t *sched = NULL;
    xmp_driver_t *drv = NULL;
    double *ref = NULL;
    int64_t *all_mem = NULL;
    xmp_strategy_t *strat = NULL;
    const char *desc = NULL;
    int have_log = 0, ok = 0, mismatch = 0;
    step_log_t log;
    if (setup_model(o, &m) != 0 || setup_data(o, &ld, &desc) != 0)
        goto out;
    static xmp_plan_auto_t autoplan; /* --strategy auto: the layout search (apps/cmd_plan.c) */
    if (o->strategy && !strcmp(o->strategy, "auto")) {
        if (xmp_cmd_gpt_plan_auto(MPI_COMM_WORLD, &m.cfg, o->batch, o->seq, o->cluster, &autoplan))
            goto out;
        o->layout = autoplan.layout, o->stage_mesh = autoplan.stage_mesh, o->strategy = NULL;
        o->stage_strategy = autoplan.stage_strategy, o->schedule = autoplan.schedule;
        o->microbatches = autoplan.microbatches, o->mesh = o->stage_dp = o->stage_tp = NULL;
        o->stages = o->dp = o->tp = 0;
    }
    if (parallel_layout(o, m.cfg.num_layers, size, &sl, err, sizeof err) != 0) {
        if (rank == 0)
            xmp_cli_error("stage layout: %s", err);
        goto out;
    }
    /* Every rank resolves and checks the same strategies (pure, but files are read on
     * every rank): the ranks agree on the outcome before any other collective, and the
     * lowest failing rank prints its message, so no rank goes on alone. */
    strat = calloc((size_t)sl.nstages, sizeof *strat);
    int sfail = !strat || resolve_strategies(o, &m.cfg, &sl, strat, err, sizeof err) != 0;
    int first_bad = sfail ? rank : size;
    MPI_Allreduce(MPI_IN_PLACE, &first_bad, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (first_bad < size) {
        if (rank == first_bad && rank == 0)
            xmp_cli_error("strategy: %s", strat ? err : "out of memory");
        else if (rank == first_bad)
            xmp_cli_error("strategy (rank %d): %s", rank, strat ? err : "out of memory");
        goto out;
    }
    if (o->print_strategy) {
        if (rank == 0) {
            char *buf = malloc(1 << 16), meshes[256];
            xmp_stage_layout_format_meshes(&sl, meshes, sizeof meshes);
            printf("# %d stage(s), meshes %s\n", sl.nstages, meshes);
            for (int s = 0; buf && s < sl.nstages; s++) {
                xmp_strategy_format(&strat[s], buf, 1 << 16);
                printf("# stage %d: %s (%s)\n%s", s, strat[s].name, strat[s].source, buf);
            }
            free(buf);
        }
        rc = 0;
        goto out;
    }
    if (xmesh_ctx_create_mpi(MPI_COMM_WORLD, NULL, &ctx) != XMESH_SUCCESS) {
        xmp_cli_error("xmesh_ctx_create_mpi: %s", xmesh_last_error());
        goto out;
    }
    xmp_gpt2_train_cfg_t tc = {o->batch, o->seq, o->microbatches, o->lr, o->beta1,
                               o->beta2, o->eps, o->wd,           strat, o->recompute};
    /* One stage object per model stage of this rank's group (one without virtual stages). */
    virt = sl.ngroups != sl.nstages;
    if (xmp_gpt2_stages_create(MPI_COMM_WORLD, ctx, &m, &sl, &tc, sts, err, sizeof err) != 0) {
        if (rank == 0)
            xmp_cli_error("%s", err);
        goto out;
    }
    nst = xmp_gpt2_stages_max(&sl);
    st = sts[0];
    xmp_edge_cfg_t edges[XMP_MAX_STAGES];
    xmp_sedge_t sedges[XMP_MAX_STAGES];
    xmp_stage_mesh_t meshes[XMP_MAX_STAGES];
    int ne = xmp_gpt2_stage_edges(st, edges, sedges);
    xmp_gpt2_stage_meshes(st, meshes);
    xmp_gen_opts_t go;
    memset(&go, 0, sizeof go);
    go.delay_wgrad = o->delay_wgrad;
    /* ZB-H1's memory rule: deferred weight-gradient work of at most S microbatches. */
    go.max_pending_w = sl.nstages;
    go.recompute = o->recompute;
    double act_b[XMP_MAX_STAGES] = {0}, ckpt_b[XMP_MAX_STAGES] = {0};
    if (o->max_act_bytes > 0) {
        /* Per-microbatch activation bytes of each stage, measured by one forward (max over
         * the stage's ranks): the schedule's memory model. */
        double keep = 0, lk[XMP_MAX_STAGES] = {0};
        int pfail = 0;
        xmp_gpt2_stage_set_batch(st, ld.inputs, ld.targets, 0);
        for (int c = 0; c < nst; c++) {
            int sidx = xmp_gpt2_stage_index(sts[c]);
            double a, k, p;
            if (sidx >= 0) {
                pfail |= xmp_gpt2_stage_probe_bytes(sts[c], &a, &k, &p) != 0;
                act_b[sidx] = a;
                ckpt_b[sidx] = k;
                lk[sidx] = p;
            }
        }
        MPI_Allreduce(MPI_IN_PLACE, &pfail, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, act_b, sl.nstages, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, ckpt_b, sl.nstages, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, lk, sl.nstages, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (pfail) {
            if (rank == 0)
                xmp_cli_error("--max-activation-bytes: measuring the activations failed");
            goto out;
        }
        for (int k = 0; k < sl.nstages; k++)
            keep = lk[k] > keep ? lk[k] : keep;
        go.max_act_bytes = o->max_act_bytes;
        go.act_bytes = act_b;
        go.ckpt_bytes = ckpt_b;
        go.selective_keep = keep;
    }
    int grc =
        virt ? xmp_sched_generate_map(o->schedule, sl.nstages, sl.ngroups, sl.group,
                                      o->microbatches, ne, sedges, &go, &sched, err, sizeof err)
             : xmp_sched_generate(o->schedule, sl.nstages, o->microbatches, ne, sedges, &go, &sched,
                                  err, sizeof err);
    if (grc != 0) {
        if (rank == 0)
            xmp_cli_error("--schedule %s: %s", xmp_sched_kind_name(o->schedule), err);
        goto out;
    }
    /* A memory cap may have chosen recomputation. */
    for (int c = 0; c < nst; c++)
        xmp_gpt2_stage_set_recompute(sts[c], sched->recompute);
    if (rank == 0 && (o->max_act_bytes > 0 || o->recompute))
        printf("schedule %s: recompute %s\n", sched->name, xmp_recompute_name(sched->recompute));
    memset(sops, 0, sizeof sops);
    for (int c = 0; c < nst; c++)
        if (xmp_gpt2_stage_index(sts[c]) >= 0)
            sops[xmp_gpt2_stage_index(sts[c])] = xmp_gpt2_stage_ops(sts[c]);
    xmp_driver_cfg_t dc;
    memset(&dc, 0, sizeof dc);
    dc.comm = MPI_COMM_WORLD;
    dc.ctx = ctx;
    dc.nstages = sl.nstages;
    dc.meshes = meshes;
    dc.nedges = ne;
    dc.edges = edges;
    dc.sched = sched;
    dc.ops = xmp_gpt2_stage_ops(st);
    dc.stage_ops = virt ? sops : NULL;
    dc.mode = o->comm;
    dc.trace = o->trace != NULL;
    if (xmp_driver_create(&dc, &drv, err, sizeof err) != XMESH_SUCCESS) {
        if (rank == 0)
            xmp_cli_error("pipeline driver: %s", err);
        goto out;
    }
    if (o->print_schedule && rank == 0) {
        char buf[256];
        xmp_stage_layout_format(&sl, buf, sizeof buf);
        printf("# layout %s, %d microbatches of %d\n", buf, o->microbatches,
               o->batch / o->microbatches);
        xmp_sched_fprint(sched, stdout);
    }
    if (o->check_serial && rank == 0) {
        ref = calloc((size_t)o->steps, sizeof(double));
        if (!ref || serial_losses(o, ref) != 0) {
            xmp_cli_error("serial reference failed: %s", xmp_llmc_last_error());
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    if (rank == 0) {
        if (step_log_open(&log, o, &m, desc, "parallel") != 0)
            goto out;
        have_log = 1;
    }
    const int S = sl.nstages, me = xmp_gpt2_stage_index(st);
    double f[XMP_MAX_STAGES], fi[XMP_MAX_STAGES], fw[XMP_MAX_STAGES];
    int have_costs = 0;
    for (int step = 0; step < o->steps; step++) {
        if (xmp_llmc_loader_next(&ld) != 0) {
            xmp_cli_error("data: %s", xmp_llmc_last_error());
            break;
        }
        for (int c = 0; c < nst; c++)
            xmp_gpt2_stage_set_batch(sts[c], ld.inputs, ld.targets, step);
        xmp_step_stats_t ss;
        int64_t live0 = xmp_mem_live_bytes();
        xmp_mem_peak_reset();
        xmesh_result_t r = xmp_driver_step(drv, &ss);
        int64_t alloc = xmp_mem_peak_bytes() - live0;
        int bad = r != XMESH_SUCCESS, anybad = 0;
        MPI_Allreduce(&bad, &anybad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        if (anybad) {
            if (bad)
                xmp_cli_error("step %d: %s", step, xmp_driver_error(drv));
            break;
        }
        double loss = 0;
        MPI_Allreduce(&ss.loss, &loss, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        /* Per stage (max over its ranks): costs per microbatch, bubble, peaks. */
        xmp_gpt2_stage_times_t t, tall;
        double loc[5 * XMP_MAX_STAGES], all[5 * XMP_MAX_STAGES];
        int64_t lp[2 * XMP_MAX_STAGES], ap[2 * XMP_MAX_STAGES];
        memset(loc, 0, sizeof loc);
        memset(lp, 0, sizeof lp);
        memset(&tall, 0, sizeof tall);
        /* Virtual stages: each stage its own costs; bubble and peaks are the group's. */
        for (int c = 0; c < nst && me >= 0; c++) {
            int sidx = xmp_gpt2_stage_index(sts[c]);
            if (sidx < 0)
                continue;
            xmp_gpt2_stage_times(sts[c], &t);
            loc[sidx] = t.nf ? t.f_s / t.nf : 0;
            loc[S + sidx] = t.ni ? t.i_s / t.ni : 0;
            loc[2 * S + sidx] = t.nw ? t.w_s / t.nw : 0;
            loc[3 * S + sidx] = ss.bubble;
            loc[4 * S + sidx] = ss.peak_act_mb;
            lp[sidx] = ss.peak_act_bytes;
            lp[S + sidx] = alloc;
            tall.f_s += t.f_s, tall.i_s += t.i_s, tall.w_s += t.w_s, tall.r_s += t.r_s;
            tall.o_s += t.o_s;
            tall.comm_s = t.comm_s; /* process-wide counter since set_batch */
        }
        t = tall;
        MPI_Allreduce(loc, all, 5 * S, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        MPI_Allreduce(lp, ap, 2 * S, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
        step_extra_t ex;
        memset(&ex, 0, sizeof ex);
        ex.loss_exact = loss;
        ex.compute_s = t.f_s + t.i_s + t.w_s + t.r_s + t.o_s - t.comm_s;
        ex.boxing_s = t.comm_s;
        ex.nstages = S;
        for (int k = 0; k < S; k++) {
            ex.bubble[k] = all[3 * S + k];
            ex.peak_mb[k] = (int)all[4 * S + k];
            ex.peak_bytes[k] = ap[k];
            ex.alloc_bytes[k] = ap[S + k];
        }
        /* The cap is on the measured peak (activation_bytes summed over a group's stages). */
        for (int k = 0; k < S && o->max_act_bytes > 0 && rank == 0; k++)
            if ((double)ap[k] > o->max_act_bytes) {
                fprintf(stderr,
                        "step %d: stage %d measured peak activations %lld bytes > "
                        "--max-activation-bytes %.0f\n",
                        step, k, (long long)ap[k], o->max_act_bytes);
                mismatch++;
                break;
            }
        /* Prediction of this step from the previous step's measured stage costs and
         * xmesh's predicted plan times (the first step has none). */
        if (have_costs) {
            xmp_sim_result_t res;
            memset(&res, 0, sizeof res);
            if (xmp_driver_predict(drv, f, fi, fw, &res) == XMESH_SUCCESS && res.ok)
                ex.predicted_s = res.step_s;
            if (o->print_schedule && rank == 0 && step == 1) {
                printf("# simulated timeline (stage costs of step 0, xmesh plan predictions):\n");
                xmp_sim_render(sched, &res, 100, stdout);
            }
            xmp_sim_result_free(&res);
        }
        for (int k = 0; k < S; k++) {
            f[k] = all[k];
            fi[k] = all[S + k];
            fw[k] = all[2 * S + k];
        }
        have_costs = 1;
        /* After the first step, place the deferred W work with the measured
         * costs instead of unit costs: regenerate the schedule and the driver. */
        if (step == 0 && o->delay_wgrad && o->steps > 1 && S > 1) {
            if (replan(o, st, &sl, sedges, ne, f, fi, fw, &dc, &sched, &drv) != 0)
                break;
        }
        if (rank == 0) {
            step_log_record_ex(&log, step, (float)loss, ss.step_s, &ex);
            if (ref && step < 20) {
                double rel = fabs(loss - ref[step]) / fmax(fabs(ref[step]), 1e-30);
                double tol = step < 5 ? 1e-5 : 1e-4;
                if (!(rel <= tol)) {
                    xmp_progress_finish(&log.bar);
                    fprintf(stderr,
                            "MISMATCH step %d: parallel loss %.9g serial %.9g (rel %.3g > %g)\n",
                            step, loss, ref[step], rel, tol);
                    mismatch++;
                } else if (o->no_progress) {
                    printf("step %d: parallel loss %.9g serial %.9g rel %.2e\n", step, loss,
                           ref[step], rel);
                }
            }
        }
        if (!isfinite(loss)) {
            if (rank == 0)
                xmp_cli_error("loss is %f at step %d", loss, step);
            break;
        }
        ok = step == o->steps - 1;
    }
    /* Parameter + optimizer bytes per rank (sharded storage shows here). */
    int64_t mine_mem[5] = {0};
    all_mem = rank == 0 ? calloc((size_t)size * 5, 8) : NULL;
    xmp_gpt2_stage_memory_t mem;
    mine_mem[0] = st ? xmp_gpt2_stage_index(st) : -1; /* virtual stages: the group's lowest */
    for (int c = 0; c < nst; c++) {                   /* summed over this rank's stages */
        xmp_gpt2_stage_memory(sts[c], &mem);
        mine_mem[1] += mem.param_bytes;
        mine_mem[2] += mem.optimizer_bytes;
        mine_mem[3] += mem.compute_param_bytes;
        mine_mem[4] += mem.grad_bytes;
    }
    int64_t dummy[5];
    MPI_Gather(mine_mem, 5, MPI_INT64_T, all_mem ? all_mem : dummy, 5, MPI_INT64_T, 0,
               MPI_COMM_WORLD);
    if (all_mem) {
        printf("memory per rank (bytes): stored parameters + AdamW moments (compute copies, "
               "gradient accumulators)\n");
        for (int r = 0; r < size; r++) {
            const int64_t *v = all_mem + 5 * r;
            printf("  rank %d stage %lld: %lld + %lld = %lld (%lld, %lld)\n", r, (long long)v[0],
                   (long long)v[1], (long long)v[2], (long long)(v[1] + v[2]), (long long)v[3],
                   (long long)v[4]);
        }
        if (have_log) {
            log.mem = all_mem;
            log.mem_ranks = size;
            log.sl = &sl;
            log.strat = strat;
        }
    }
    if (have_log && step_log_close(&log, ok) != 0)
        ok = 0;
    have_log = 0;
    if (rank == 0 && ref)
        printf("check-serial: %s (%d mismatching of %d steps compared)\n",
               mismatch ? "FAILED" : "OK", mismatch, o->steps < 20 ? o->steps : 20);
    if (ok && o->save) {
        if (xmp_gpt2_stages_gather(sts, nst, &m) != 0) {
            ok = 0;
            if (rank == 0)
                xmp_cli_error("--save: gathering the parameters failed");
        } else if (rank == 0) {
            if (xmp_gpt2_save(&m, o->save) != 0) {
                xmp_cli_error("--save: %s", xmp_llmc_last_error());
                ok = 0;
            } else {
                printf("saved checkpoint '%s'\n", o->save);
            }
        }
    }
    if (o->trace && drv && xmp_driver_write_trace(drv, o->trace) != XMESH_SUCCESS && rank == 0)
        xmp_cli_error("--trace '%s': %s", o->trace, xmp_driver_error(drv));
    int mine = ok && !mismatch, every = 0;
    MPI_Allreduce(&mine, &every, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    rc = every ? 0 : 1;
out:
    if (have_log)
        step_log_close(&log, 0);
    xmp_driver_destroy(drv);
    for (int c = 0; c < nst; c++)
        xmp_gpt2_stage_destroy(sts[c]);
    xmp_sched_destroy(sched);
    xmesh_ctx_destroy(ctx);
    xmp_llmc_loader_free(&ld);
    xmp_gpt2_free(&m);
    free(ref);
    free(strat);
    free(all_mem);
    MPI_Finalize();
    return rc;
}

int xmp_cmd_gpt(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "plan")) /* layout search (apps/cmd_plan.c) */
        return xmp_cmd_gpt_plan(argc - 1, argv + 1);
    xmp_cli_set_command("gpt");
    gpt_opts_t o;
    gpt_defaults(&o);
    int p = parse_gpt_flags(argc, argv, &o);
    if (p != 0)
        return p > 0 ? 0 : 2;
    openblas_set_num_threads(o.blas_threads);
    return o.serial ? run_serial(&o) : run_parallel(&o);
}
