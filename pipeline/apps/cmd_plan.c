/*
 * `xmesh-train gpt plan`: the automatic layout search for GPT-2 (issue 21;
 * pipeline/search/search.h, docs/SEARCH.md). Pure: no MPI is started; the rank
 * count comes from --ranks or from the launcher's environment
 * (OMPI_COMM_WORLD_SIZE, PMI_SIZE) when run under mpirun.
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"
#include "commands.h"
#include "models/gpt2.h"
#include "models/stage_layout.h"
#include "sched/schedule.h"
#include "search/estimate.h"
#include "nn/overlap.h"
#include "search/search.h"
#include "search/search_ut.h"
#include "models/utransformer.h"
#include "xm_cluster_file.h"
#include "xm_costmodel.h"

#define PLAN_MAX_TOP 64

typedef struct {
    int layers, heads, channels, max_seq, vocab, batch, seq;
    int ranks, hosts, top, json, microbatches, max_stages, nominal, max_evals, eval;
    /* --eval: one configuration, as xmesh-train gpt takes it */
    const char *layout, *stage_mesh, *strategy, *stage_strategy, *schedule;
    double memory_limit, flops;
    const char *cluster, *strategies, *schedules, *ablate, *overlap;
} plan_opts_t;

static void plan_usage(void)
{
    printf("usage: xmesh-train gpt plan [model flags] [--ranks N --hosts H] [flags]\n"
           "Searches stage count and split, stage meshes (1-4 axes), per-stage built-in strategy,\n"
           "schedule and microbatch count for GPT-2 and prints the best configurations with the\n"
           "command line that runs each (docs/SEARCH.md). No MPI is started.\n"
           "model (as xmesh-train gpt): --layers N (4) --heads N (4) --channels N (128)\n"
           "  --max-seq N (1024) --vocab N (256) --batch B (4) --seq T (64)\n"
           "ranks:\n"
           "  --ranks N           ranks of the run (default: the launcher's, else 1)\n"
           "  --hosts H           hosts; ranks are placed in order, N/H per host (default: the\n"
           "                      launcher's N / local size, else 1)\n"
           "cost model:\n"
           "  --cluster FILE      cluster file: [collectives] and [compute] from xmesh-calibrate,\n"
           "                      base keys (NIC rate, latency, ...) for the boundary plans\n"
           "  --nominal           use the nominal (uncalibrated) model even with --cluster\n"
           "  --flops R           sgemm rate of the nominal model, flop/s (5e10)\n"
           "search:\n"
           "  --memory-limit B    bytes per rank (suffixes K M G = 2^10, 2^20, 2^30); 0: none\n"
           "  --strategies LIST   built-ins to consider (dp,megatron,3d,axonn)\n"
           "  --schedules LIST    gpipe,1f1b,eager-1f1b (all)\n"
           "  --microbatches M    only this microbatch count (default: every divisor of B)\n"
           "  --max-stages S      at most S stages\n"
           "  --max-evals N       scheduler budget of each boundary plan (2000)\n"
           "  --ablate LIST       model ablations: boundary (transfers between stages free),\n"
           "                      share (no NIC sharing between a mesh axis' groups),\n"
           "                      overlap (--overlap ignored), cpu (no CPU sharing between\n"
           "                      stages: the cluster file's cpuset records ignored),\n"
           "                      step (compute from the kernel records alone: the\n"
           "                      cluster file's gptstep record ignored), burst (the\n"
           "                      cluster file's nic_burst_bytes ignored)\n"
           "  --overlap LIST      the run's overlap switches (as xmesh-train gpt --overlap);\n"
           "                      modelled: defer-grad (gradient reductions overlap their\n"
           "                      latencies); the others are accepted, not modelled\n"
           "output:\n"
           "  --top K (5)         configurations printed\n"
           "  --json              one JSON object on stdout instead of the table\n");
}

static int parse_bytes(const char *flag, const char *s, double *out)
{
    char *end;
    double v = strtod(s, &end);
    double mul = 1;
    if (end != s && *end) {
        if (!strcmp(end, "K") || !strcmp(end, "KiB"))
            mul = 1024.0;
        else if (!strcmp(end, "M") || !strcmp(end, "MiB"))
            mul = 1048576.0;
        else if (!strcmp(end, "G") || !strcmp(end, "GiB"))
            mul = 1073741824.0;
        else
            end = (char *)s;
    }
    if (end == s || !isfinite(v) || v < 0)
        return xmp_cli_error("%s '%s': not a byte count (a number >= 0, suffix K, M or G)", flag,
                             s);
    *out = v * mul;
    return 0;
}

/* "a,b,c" of names from table into a bit mask. */
static int parse_list(const char *flag, const char *s, const char *const *names, int n,
                      unsigned *mask)
{
    unsigned m = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *t = strtok(buf, ","); t; t = strtok(NULL, ",")) {
        int k = -1;
        for (int i = 0; i < n; i++)
            if (!strcmp(t, names[i]))
                k = i;
        if (k < 0)
            return xmp_cli_error("%s '%s': unknown name '%s'", flag, s, t);
        m |= 1u << k;
    }
    if (!m)
        return xmp_cli_error("%s '%s': empty list", flag, s);
    *mask = m;
    return 0;
}

static int env_int(const char *a, const char *b)
{
    const char *v = getenv(a);
    if (!v && b)
        v = getenv(b);
    return v ? atoi(v) : 0;
}

/* argv[*i] against the flags a plan command takes: its table (xmp_cli_table), --memory-limit
 * and --flops (into o). 1: taken (*i past its value), 0: none of them, -1: a missing or bad value
 * (printed). */
static int common_flag(int argc, char **argv, int *i, const xmp_cli_flag_t *tab, size_t n,
                       plan_opts_t *o)
{
    const char *a = argv[*i], *v;
    int took = xmp_cli_table(argc, argv, i, tab, n);
    if (took)
        return took;
    if (!strcmp(a, "--memory-limit"))
        return (v = xmp_cli_value(argc, argv, i)) && !parse_bytes(a, v, &o->memory_limit) ? 1 : -1;
    if (strcmp(a, "--flops"))
        return 0;
    char *end;
    if (!(v = xmp_cli_value(argc, argv, i)))
        return -1;
    o->flops = strtod(v, &end);
    if (end == v || *end || !(o->flops > 0) || !isfinite(o->flops))
        return xmp_cli_error("--flops '%s': not a rate > 0 (flop/s)", v);
    return 1;
}

/* Ranks and hosts not given: from the MPI launcher's environment (else 1 and 1). */
static int ranks_hosts(plan_opts_t *o)
{
    if (!o->ranks)
        o->ranks = env_int("OMPI_COMM_WORLD_SIZE", "PMI_SIZE");
    if (!o->ranks)
        o->ranks = 1;
    if (!o->hosts) {
        int local = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS");
        o->hosts = local > 0 && o->ranks % local == 0 ? o->ranks / local : 1;
    }
    if (o->ranks % o->hosts)
        return xmp_cli_error("--hosts %d does not divide --ranks %d (ranks per host = N/H)",
                             o->hosts, o->ranks);
    return 0;
}

static int parse_plan(int argc, char **argv, plan_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->layers = 4;
    o->heads = 4;
    o->channels = 128;
    o->max_seq = 1024;
    o->vocab = 256;
    o->batch = 4;
    o->seq = 64;
    o->top = 5;
    o->flops = 5e10;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            plan_usage();
            return 1;
        }
        if (!strcmp(a, "--json")) {
            o->json = 1;
            continue;
        }
        if (!strcmp(a, "--nominal")) {
            o->nominal = 1;
            continue;
        }
        if (!strcmp(a, "--eval")) {
            o->eval = 1;
            continue;
        }
        const xmp_cli_flag_t f[] = {{"--layout", .sp = &o->layout},
                                    {"--stage-mesh", .sp = &o->stage_mesh},
                                    {"--strategy", .sp = &o->strategy},
                                    {"--stage-strategy", .sp = &o->stage_strategy},
                                    {"--schedule", .sp = &o->schedule},
                                    {"--cluster", .sp = &o->cluster},
                                    {"--strategies", .sp = &o->strategies},
                                    {"--schedules", .sp = &o->schedules},
                                    {"--ablate", .sp = &o->ablate},
                                    {"--overlap", .sp = &o->overlap},
                                    {"--layers", &o->layers, 1, 512},
                                    {"--heads", &o->heads, 1, 1024},
                                    {"--channels", &o->channels, 1, 1 << 16},
                                    {"--max-seq", &o->max_seq, 1, 1 << 20},
                                    {"--vocab", &o->vocab, 1, 1 << 20},
                                    {"--batch", &o->batch, 1, 1 << 20},
                                    {"--seq", &o->seq, 1, 1 << 20},
                                    {"--ranks", &o->ranks, 1, 4096},
                                    {"--hosts", &o->hosts, 1, 4096},
                                    {"--top", &o->top, 1, PLAN_MAX_TOP},
                                    {"--microbatches", &o->microbatches, 1, 1 << 20},
                                    {"--max-stages", &o->max_stages, 1, XMP_SEARCH_MAX_STAGES},
                                    {"--max-evals", &o->max_evals, 1, 1 << 30}};
        int took = common_flag(argc, argv, &i, f, sizeof f / sizeof f[0], o);
        if (took < 0)
            return -1;
        if (took)
            continue;
        return xmp_cli_error("unknown flag '%s' (xmesh-train gpt plan --help)", a);
    }
    return ranks_hosts(o);
}

/* The cost model and boundary cluster of the flags (printed errors). */
static int load_models(const plan_opts_t *o, xm_costmodel_t **cm, xm_cluster_t *cl, char *label,
                       size_t n)
{
    int one = 0;
    xm_hostmap_t hm = {1, 1, &one};
    if (xm_cluster_init(cl, &hm))
        return xmp_cli_error("cluster: %s", xmesh_last_error());
    xm_costmodel_t *m = NULL;
    if (o->cluster) {
        if (xm_cluster_load(o->cluster, cl))
            return xmp_cli_error("--cluster '%s': %s", o->cluster, xmesh_last_error());
        if (xmp_costmodel_load(o->cluster, &m))
            return xmp_cli_error("--cluster '%s': %s", o->cluster, xmesh_last_error());
    }
    if (o->nominal || !m || (m->ncoll == 0 && m->ngemm == 0)) {
        xm_costmodel_destroy(m);
        m = NULL;
        if (xm_costmodel_nominal(cl, o->flops, &m))
            return xmp_cli_error("nominal cost model: %s", xmesh_last_error());
        snprintf(label, n,
                 "nominal (uncalibrated): NIC %.3g Gbit/s, intra-host %.3g Gbit/s, latency %.3g "
                 "us, sgemm %.3g flop/s%s",
                 cl->nic_send_Bps * 8 / 1e9, cl->intra_Bps * 8 / 1e9, cl->latency_s * 1e6, o->flops,
                 o->cluster ? "" : " (no --cluster)");
    } else {
        snprintf(label, n, "calibrated: %s (%d collective fits, %d sgemm shapes)", o->cluster,
                 m->ncoll, m->ngemm);
    }
    *cm = m;
    return 0;
}

static void fmt_bytes(double b, char *buf, size_t n)
{
    if (b >= 1073741824.0)
        snprintf(buf, n, "%.2fG", b / 1073741824.0);
    else if (b >= 1048576.0)
        snprintf(buf, n, "%.1fM", b / 1048576.0);
    else if (b >= 1024.0)
        snprintf(buf, n, "%.1fK", b / 1024.0);
    else
        snprintf(buf, n, "%.0f", b);
}

/* Fills the search options from plan flags (cm and cl borrowed). */
static int fill_search_opts(const plan_opts_t *p, const xm_costmodel_t *cm, const xm_cluster_t *cl,
                            xmp_search_opts_t *so)
{
    static const char *const sn[] = {"dp", "megatron", "3d", "axonn"};
    static const char *const kn[] = {"gpipe", "1f1b", "eager-1f1b"};
    memset(so, 0, sizeof *so);
    so->model.num_layers = p->layers;
    so->model.num_heads = p->heads;
    so->model.channels = p->channels;
    so->model.max_seq_len = p->max_seq;
    so->model.vocab_size = p->vocab;
    so->model.padded_vocab_size = xmp_gpt2_pad_vocab(p->vocab, 128);
    so->vocab = p->vocab;
    so->B = p->batch;
    so->T = p->seq;
    so->nranks = p->ranks;
    so->hosts = p->hosts;
    so->memory_limit = p->memory_limit;
    so->cost = cm;
    so->cluster = cl;
    so->max_stages = p->max_stages;
    so->fixed_M = p->microbatches;
    so->max_evals = p->max_evals;
    if (p->strategies && parse_list("--strategies", p->strategies, sn, 4, &so->strategies))
        return -1;
    if (p->schedules && parse_list("--schedules", p->schedules, kn, 3, &so->schedules))
        return -1;
    static const char *const an[] = {"boundary", "share", "overlap", "cpu", "step", "burst"};
    unsigned ab = 0;
    if (p->ablate && parse_list("--ablate", p->ablate, an, 6, &ab))
        return -1;
    so->no_boundary = !!(ab & 1u);
    so->no_share = !!(ab & 2u);
    so->no_overlap = !!(ab & 4u);
    so->no_cpu_share = !!(ab & 8u);
    so->no_step = !!(ab & 16u);
    so->no_burst = !!(ab & 32u);
    if (p->overlap) {
        xmp_overlap_t ov;
        if (xmp_overlap_parse(p->overlap, &ov))
            return xmp_cli_error("--overlap '%s': %s", p->overlap, xmp_last_error());
        so->defer_grad = ov.defer_grad;
    }
    return 0;
}

/* Rank placement advice of one configuration (search/estimate.h, xmesh_suggest_order): the
 * order into buf ("" when in-order is already best); returns the bound gain in seconds. */
static double placement_of(const plan_opts_t *p, const xmp_utrans_desc_t *ut, const char *lay,
                           const char *mesh, const char *strat, int sched, int M, char *buf,
                           size_t n)
{
    buf[0] = 0;
    xmp_estimator_opts_t eo;
    memset(&eo, 0, sizeof eo);
    eo.cluster_file = p->cluster;
    eo.nominal = p->nominal;
    eo.flops = p->flops;
    eo.max_evals = p->max_evals;
    xmp_estimator_t *e = NULL;
    char err[512];
    if (xmp_estimator_create(&eo, &e, err, sizeof err))
        return 0;
    xmp_layout_desc_t l = {p->ranks, p->hosts, lay, mesh, strat, xmp_sched_kind_name(sched), M};
    xmp_estimate_t *est = calloc(1, sizeof *est);
    int r = -1;
    if (est && ut) {
        r = xmp_estimate_utransformer(e, ut, &l, est, err, sizeof err);
    } else if (est) {
        xmp_gpt_desc_t m = {p->layers, p->heads, p->channels, p->vocab,
                            p->seq,    p->batch, p->max_seq};
        r = xmp_estimate_gpt(e, &m, &l, est, err, sizeof err);
    }
    double gain = 0;
    if (r == 0 && est->order_gain_s > 0) {
        gain = est->order_gain_s;
        size_t k = 0;
        for (int i = 0; i < p->ranks && k < n; i++)
            k += (size_t)snprintf(buf + k, n - k, "%s%d", i ? "," : "", est->rank_order[i]);
    }
    free(est);
    xmp_estimator_destroy(e);
    return gain;
}

static void print_json(const plan_opts_t *p, const xmp_search_opts_t *so, const char *label,
                       const xmp_search_cand_t *c, int n, const xmp_search_stats_t *st)
{
    xmp_json_t j;
    fflush(stdout);
    if (xmp_json_open(&j, "/dev/stdout"))
        return;
    xmp_json_obj_begin(&j, NULL);
    xmp_json_str(&j, "cost_model", label);
    xmp_json_str(&j, "ablate", p->ablate ? p->ablate : "");
    xmp_json_str(&j, "overlap", p->overlap ? p->overlap : "none");
    xmp_json_int(&j, "ranks", p->ranks);
    xmp_json_int(&j, "hosts", p->hosts);
    xmp_json_num(&j, "memory_limit", p->memory_limit);
    xmp_json_num(&j, "search_s", st->seconds);
    xmp_json_num(&j, "search_cpu_s", st->cpu_seconds);
    xmp_json_int(&j, "dp_runs", st->dp_runs);
    xmp_json_int(&j, "dp_transitions", st->transitions);
    xmp_json_int(&j, "options", st->options);
    xmp_json_int(&j, "boundary_plans", st->boundary_plans);
    xmp_json_int(&j, "simulated", st->candidates);
    xmp_json_num(&j, "min_memory_bytes", st->min_mem_bytes);
    xmp_json_arr_begin(&j, "configurations");
    for (int i = 0; i < n; i++) {
        char lay[512], mesh[512], strat[512], cmd[2048];
        xmp_search_gpt_flags(&c[i], lay, mesh, strat, sizeof lay);
        xmp_search_gpt_command(so, &c[i], cmd, sizeof cmd);
        xmp_json_obj_begin(&j, NULL);
        xmp_json_int(&j, "rank", i + 1);
        xmp_json_num(&j, "step_s", c[i].step_s);
        xmp_json_num(&j, "chain_s", c[i].chain_s);
        xmp_json_num(&j, "bubble", c[i].bubble);
        xmp_json_num(&j, "compute_s", c[i].compute_s);
        xmp_json_num(&j, "boxing_s", c[i].boxing_s);
        xmp_json_num(&j, "boundary_s", c[i].boundary_s);
        xmp_json_num(&j, "boxing_bytes_per_rank", c[i].boxing_bytes);
        xmp_json_num(&j, "boundary_bytes_per_rank", c[i].boundary_bytes);
        xmp_json_num(&j, "memory_bytes_per_rank", c[i].mem_bytes);
        xmp_json_num(&j, "memory_param_bytes", c[i].mem_param_bytes);
        xmp_json_num(&j, "memory_activation_bytes", c[i].mem_act_bytes);
        xmp_json_int(&j, "nstages", c[i].nstages);
        xmp_json_int(&j, "microbatches", c[i].M);
        xmp_json_str(&j, "schedule", xmp_sched_kind_name(c[i].sched));
        xmp_json_str(&j, "layout", lay);
        xmp_json_str(&j, "stage_mesh", mesh);
        xmp_json_str(&j, "stage_strategy", strat);
        xmp_json_str(&j, "command", cmd);
        {
            char ord[8192];
            double g = placement_of(p, NULL, lay, mesh, strat, c[i].sched, c[i].M, ord, sizeof ord);
            xmp_json_str(&j, "rank_order", ord);
            xmp_json_num(&j, "rank_order_gain_s", g);
        }
        xmp_json_arr_begin(&j, "stages");
        for (int k = 0; k < c[i].nstages; k++) {
            xmp_json_obj_begin(&j, NULL);
            xmp_json_num(&j, "forward_s", c[i].stage_f_s[k]);
            xmp_json_num(&j, "backward_s", c[i].stage_b_s[k]);
            xmp_json_num(&j, "compute_s", c[i].stage_compute_s[k]);
            xmp_json_num(&j, "cpu_factor", c[i].stage_cpu_factor[k]);
            xmp_json_num(&j, "sync_s", c[i].stage_sync_s[k]);
            xmp_json_num(&j, "reduce_s", c[i].stage_r_s[k]);
            xmp_json_num(&j, "optimizer_s", c[i].stage_o_s[k]);
            xmp_json_num(&j, "param_bytes", c[i].stage_param_bytes[k]);
            xmp_json_num(&j, "activation_bytes", c[i].stage_act_bytes[k]);
            xmp_json_obj_end(&j);
        }
        xmp_json_arr_end(&j);
        xmp_json_obj_end(&j);
    }
    xmp_json_arr_end(&j);
    xmp_json_obj_end(&j);
    xmp_json_close(&j);
}

static void print_table(const plan_opts_t *p, const xmp_search_opts_t *so, const char *label,
                        const xmp_search_cand_t *c, int n, const xmp_search_stats_t *st)
{
    char mm[32];
    fmt_bytes(st->min_mem_bytes, mm, sizeof mm);
    printf("# GPT-2 L=%d NH=%d C=%d V=%d B=%d T=%d on %d ranks (%d hosts x %d)\n", p->layers,
           p->heads, p->channels, p->vocab, p->batch, p->seq, p->ranks, p->hosts,
           p->ranks / p->hosts);
    printf("# cost model: %s\n", label);
    printf("# search: %.3f s (%.3f s CPU), %ld DP runs, %ld transitions, %ld options, %ld boundary "
           "plans, "
           "%ld simulated; smallest memory of any configuration %s per rank\n",
           st->seconds, st->cpu_seconds, st->dp_runs, st->transitions, st->options,
           st->boundary_plans, st->candidates, mm);
    printf("%-3s %10s %10s %6s %10s %10s %9s %9s %9s %-10s %3s  %s\n", "#", "step_s", "chain_s",
           "bubble", "compute_s", "boxing_s", "box_B/rk", "bnd_B/rk", "mem/rk", "schedule", "M",
           "layout | stage-mesh | strategies");
    for (int i = 0; i < n; i++) {
        char lay[512], mesh[512], strat[512], a[32], b[32], m[32];
        xmp_search_gpt_flags(&c[i], lay, mesh, strat, sizeof lay);
        fmt_bytes(c[i].boxing_bytes, a, sizeof a);
        fmt_bytes(c[i].boundary_bytes, b, sizeof b);
        fmt_bytes(c[i].mem_bytes, m, sizeof m);
        printf("%-3d %10.4g %10.4g %6.3f %10.4g %10.4g %9s %9s %9s %-10s %3d  %s | %s | %s\n",
               i + 1, c[i].step_s, c[i].chain_s, c[i].bubble, c[i].compute_s, c[i].boxing_s, a, b,
               m, xmp_sched_kind_name(c[i].sched), c[i].M, lay, mesh, strat);
    }
    printf("# command lines:\n");
    for (int i = 0; i < n; i++) {
        char cmd[2048];
        xmp_search_gpt_command(so, &c[i], cmd, sizeof cmd);
        printf("%-3d %s\n", i + 1, cmd);
        char lay[512], mesh[512], strat[512], ord[8192];
        xmp_search_gpt_flags(&c[i], lay, mesh, strat, sizeof lay);
        double g = placement_of(p, NULL, lay, mesh, strat, c[i].sched, c[i].M, ord, sizeof ord);
        if (g > 0)
            printf("    # rank order (xmesh_suggest_order: boundary bounds %.3g s lower): %s "
                   "(launch rank order[i] on slot i, e.g. with a rankfile)\n",
                   g, ord);
    }
}

/* --eval: the configuration of the flags into c (printed errors). */
static int eval_config(const plan_opts_t *p, const xmp_search_opts_t *so, xmp_search_cand_t *c)
{
    memset(c, 0, sizeof *c);
    int L = p->layers;
    char kinds[XMP_MAX_LAYERS + 3], err[512];
    if (L + 2 > XMP_MAX_LAYERS)
        return xmp_cli_error("--layers %d: too many for a layout", L);
    kinds[0] = 'E';
    memset(kinds + 1, 't', (size_t)L);
    kinds[L + 1] = 'L';
    kinds[L + 2] = 0;
    xmp_stage_layout_t sl;
    if (!p->stage_mesh)
        return xmp_cli_error("--eval needs --stage-mesh (one mesh per stage)");
    int nmesh = 1;
    for (const char *q = p->stage_mesh; *q; q++)
        nmesh += *q == ',';
    if (xmp_stage_layout_build(kinds, 1, 1, p->layout, nmesh, p->stage_mesh, NULL, NULL, &sl, err,
                               sizeof err))
        return xmp_cli_error("--eval: %s", err);
    if (sl.nstages > XMP_SEARCH_MAX_STAGES)
        return xmp_cli_error("--eval: %d stages (at most %d)", sl.nstages, XMP_SEARCH_MAX_STAGES);
    if (sl.nranks != p->ranks)
        return xmp_cli_error("--eval: the stage meshes use %d ranks, --ranks is %d", sl.nranks,
                             p->ranks);
    c->nstages = sl.nstages;
    c->M = p->microbatches ? p->microbatches : 1;
    c->sched = XMP_SCHED_1F1B;
    if (p->schedule && (c->sched = xmp_sched_kind_parse(p->schedule)) < 0)
        return xmp_cli_error("--schedule '%s': gpipe, 1f1b or eager-1f1b", p->schedule);
    char names[512];
    snprintf(names, sizeof names, "%s", p->stage_strategy ? p->stage_strategy : "");
    char *save = NULL, *tok = p->stage_strategy ? strtok_r(names, ",", &save) : NULL;
    for (int s = 0; s < sl.nstages; s++) {
        int blocks = 0;
        for (int k = sl.first[s]; k < sl.first[s] + sl.count[s]; k++)
            blocks += sl.kind[k] == 't';
        c->nblocks[s] = blocks;
        c->ndim[s] = sl.ndim[s];
        memcpy(c->shape[s], sl.shape[s], sizeof(int) * (size_t)sl.ndim[s]);
        const char *nm = p->stage_strategy ? tok : p->strategy ? p->strategy : "megatron";
        if (!nm)
            return xmp_cli_error("--stage-strategy '%s': fewer names than the %d stages",
                                 p->stage_strategy, sl.nstages);
        c->strategy[s] = -1;
        for (int k = 0; k < XMP_SEARCH_NSTRAT; k++)
            if (!strcmp(nm, xmp_search_strategy_name(k)))
                c->strategy[s] = k;
        if (c->strategy[s] < 0)
            return xmp_cli_error("--eval: strategy '%s': the model knows the built-ins dp, "
                                 "megatron, 3d, axonn only",
                                 nm);
        if (p->stage_strategy)
            tok = strtok_r(NULL, ",", &save);
    }
    if (xmp_search_gpt_eval(so, c, err, sizeof err))
        return xmp_cli_error("--eval: %s", err);
    return 0;
}

static void print_eval(const plan_opts_t *p, const xmp_search_opts_t *so, const char *label,
                       const xmp_search_cand_t *c)
{
    xmp_json_t j;
    fflush(stdout);
    if (p->json) {
        if (xmp_json_open(&j, "/dev/stdout"))
            return;
        xmp_json_obj_begin(&j, NULL);
        xmp_json_str(&j, "cost_model", label);
        xmp_json_num(&j, "step_s", c->step_s);
        xmp_json_num(&j, "chain_s", c->chain_s);
        xmp_json_num(&j, "bubble", c->bubble);
        xmp_json_num(&j, "memory_bytes_per_rank", c->mem_bytes);
        xmp_json_num(&j, "boxing_bytes_per_rank", c->boxing_bytes);
        xmp_json_num(&j, "boundary_bytes_per_rank", c->boundary_bytes);
        xmp_json_num(&j, "step_factor", c->step_factor);
        xmp_json_arr_begin(&j, "stages");
        for (int s = 0; s < c->nstages; s++) {
            xmp_json_obj_begin(&j, NULL);
            xmp_json_num(&j, "param_bytes", c->stage_param_bytes[s]);
            xmp_json_num(&j, "activation_bytes", c->stage_act_bytes[s]);
            xmp_json_num(&j, "stored_param_bytes", c->stage_stored_bytes[s]);
            xmp_json_num(&j, "grad_bytes", c->stage_grad_bytes[s]);
            xmp_json_num(&j, "compute_param_bytes", c->stage_compute_bytes[s]);
            xmp_json_num(&j, "forward_s", c->stage_f_s[s]);
            xmp_json_num(&j, "backward_s", c->stage_b_s[s]);
            xmp_json_num(&j, "compute_s", c->stage_compute_s[s]);
            xmp_json_num(&j, "cpu_factor", c->stage_cpu_factor[s]);
            xmp_json_num(&j, "sync_s", c->stage_sync_s[s]);
            xmp_json_num(&j, "reduce_s", c->stage_r_s[s]);
            xmp_json_num(&j, "optimizer_s", c->stage_o_s[s]);
            xmp_json_obj_end(&j);
        }
        xmp_json_arr_end(&j);
        xmp_json_obj_end(&j);
        xmp_json_close(&j);
        return;
    }
    char cmd[2048];
    xmp_search_gpt_command(so, c, cmd, sizeof cmd);
    printf("# cost model: %s\n%s\n", label, cmd);
    printf("step %.6g s (chain %.6g s), bubble %.3f, compute %.6g s, boxing %.6g s, boundary "
           "%.6g s per microbatch\n",
           c->step_s, c->chain_s, c->bubble, c->compute_s, c->boxing_s, c->boundary_s);
    for (int s = 0; s < c->nstages; s++)
        printf("stage %d: parameters+optimizer+gradients %.0f bytes, activations %.0f bytes per "
               "rank\n",
               s, c->stage_param_bytes[s], c->stage_act_bytes[s]);
}

int xmp_cmd_gpt_plan(int argc, char **argv)
{
    xmp_cli_set_command("gpt plan");
    plan_opts_t p;
    int r = parse_plan(argc, argv, &p);
    if (r)
        return r > 0 ? 0 : 2;
    xm_costmodel_t *cm = NULL;
    xm_cluster_t cl;
    memset(&cl, 0, sizeof cl);
    char label[512];
    if (load_models(&p, &cm, &cl, label, sizeof label)) {
        xm_cluster_free(&cl);
        return 2;
    }
    int rc = 2;
    xmp_search_opts_t so;
    xmp_search_cand_t *c = calloc(PLAN_MAX_TOP, sizeof *c);
    xmp_search_stats_t st;
    int n = 0;
    char err[1024];
    if (!c || fill_search_opts(&p, cm, &cl, &so))
        goto out;
    if (p.eval) {
        if (eval_config(&p, &so, &c[0]))
            goto out;
        print_eval(&p, &so, label, &c[0]);
        rc = 0;
        goto out;
    }
    if (xmp_search_gpt(&so, p.top, c, &n, &st, err, sizeof err)) {
        xmp_cli_error("%s", err);
        rc = 1;
        goto out;
    }
    if (p.json)
        print_json(&p, &so, label, c, n, &st);
    else
        print_table(&p, &so, label, c, n, &st);
    rc = 0;
out:
    free(c);
    xm_costmodel_destroy(cm);
    xm_cluster_free(&cl);
    return rc;
}

/* --strategy auto of `xmesh-train gpt` (apps/cmd_gpt.c): the best configuration for the
 * ranks of comm. Hosts are counted with MPI_Comm_split_type (shared memory); the search is
 * pure and deterministic, so every rank picks the same. Rank 0 prints the choice. */
int xmp_cmd_gpt_plan_auto(MPI_Comm comm, const xmp_gpt2_config_t *cfg, int batch, int seq,
                          const char *cluster, xmp_plan_auto_t *out)
{
    int rank, size, lrank, nhosts = 0;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    MPI_Comm node;
    MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &lrank);
    MPI_Comm_free(&node);
    int leader = lrank == 0;
    nhosts = leader;
    if (xmp_agree(&nhosts, 1, MPI_INT, MPI_SUM, comm, "host count") != XMESH_SUCCESS) {
        xmp_cli_error("--strategy auto: %s", xmp_last_error());
        return -1;
    }
    plan_opts_t p;
    memset(&p, 0, sizeof p);
    p.layers = cfg->num_layers;
    p.heads = cfg->num_heads;
    p.channels = cfg->channels;
    p.max_seq = cfg->max_seq_len;
    p.vocab = cfg->vocab_size;
    p.batch = batch;
    p.seq = seq;
    p.ranks = size;
    p.hosts = nhosts > 0 && size % nhosts == 0 ? nhosts : 1;
    p.top = 1;
    p.flops = 5e10;
    p.cluster = cluster;
    xm_costmodel_t *cm = NULL;
    xm_cluster_t cl;
    memset(&cl, 0, sizeof cl);
    char label[512], err[1024];
    int rc = -1;
    xmp_search_opts_t so;
    xmp_search_cand_t c;
    xmp_search_stats_t st;
    int n = 0;
    if (load_models(&p, &cm, &cl, label, sizeof label))
        goto out;
    if (fill_search_opts(&p, cm, &cl, &so))
        goto out;
    if (xmp_search_gpt(&so, 1, &c, &n, &st, err, sizeof err) || n < 1) {
        if (rank == 0)
            xmp_cli_error("--strategy auto: %s", err);
        goto out;
    }
    memset(out, 0, sizeof *out);
    xmp_search_gpt_flags(&c, out->layout, out->stage_mesh, out->stage_strategy, sizeof out->layout);
    out->schedule = c.sched;
    out->microbatches = c.M;
    if (rank == 0) {
        printf("--strategy auto (%s, %d hosts, search %.3f s): --layout '%s' --stage-mesh %s "
               "--stage-strategy %s --schedule %s --microbatches %d (predicted step %.4g s, "
               "memory %.1f MiB per rank)\n",
               label, p.hosts, st.seconds, out->layout, out->stage_mesh, out->stage_strategy,
               xmp_sched_kind_name(c.sched), c.M, c.step_s, c.mem_bytes / 1048576.0);
        fflush(stdout);
    }
    rc = 0;
out:
    xm_costmodel_destroy(cm);
    xm_cluster_free(&cl);
    return rc;
}

/* ------------------------------------------------ `xmesh-train utransformer plan` */

typedef struct {
    int base, groups, head_dim, exhaustive, restarts, mh_steps;
    long long seed;
    plan_opts_t p; /* the common flags: ranks, hosts, batch, top, json, cluster, ... */
    char strat_buf[256];
} ut_plan_opts_t;

static void ut_plan_usage(void)
{
    printf("usage: xmesh-train utransformer plan [model flags] [--ranks N --hosts H] [flags]\n"
           "Searches stage count and split of the 13 layers, dp x tp stage meshes, per-stage\n"
           "strategy, schedule and microbatch count for the U-Transformer by coordinate descent\n"
           "and Metropolis-Hastings (seeded) and prints the best configurations with the command\n"
           "line that runs each (docs/SEARCH.md). No MPI is started.\n"
           "model (as xmesh-train utransformer): --base-channels C (8) --groups G --head-dim D\n"
           "  --batch B (8)\n"
           "ranks, cost model, output: as xmesh-train gpt plan (--ranks --hosts --cluster\n"
           "  --nominal --flops --memory-limit --top --json --schedules --microbatches\n"
           "  --max-stages --max-evals)\n"
           "search:\n"
           "  --strategies LIST   strategy names tried per stage (dp,megatron,3d,axonn; names the\n"
           "                      model does not build are skipped)\n"
           "  --seed N (1)        Metropolis-Hastings / restart seed (printed)\n"
           "  --restarts N (4)    coordinate-descent starts per stage count\n"
           "  --mh-steps N (4000) Metropolis-Hastings proposals per stage count\n"
           "  --exhaustive        enumerate every configuration (small spaces; the oracle)\n"
           "  --ablate boundary   edges between stages cost 0\n"
           "  --eval              model one configuration (--layout --stage-mesh --strategy or\n"
           "                      --stage-strategy --schedule --microbatches) through the\n"
           "                      offline estimate (search/estimate.h)\n");
}

static int parse_ut_plan(int argc, char **argv, ut_plan_opts_t *u)
{
    memset(u, 0, sizeof *u);
    plan_opts_t *o = &u->p;
    u->base = 8;
    u->seed = 1;
    o->batch = 8;
    o->top = 5;
    o->flops = 5e10;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            ut_plan_usage();
            return 1;
        }
        if (!strcmp(a, "--json") || !strcmp(a, "--nominal") || !strcmp(a, "--exhaustive") ||
            !strcmp(a, "--eval")) {
            *(a[2] == 'j'   ? &o->json
              : a[2] == 'n' ? &o->nominal
              : a[3] == 'x' ? &u->exhaustive
                            : &o->eval) = 1;
            continue;
        }
        const xmp_cli_flag_t f[] = {{"--cluster", .sp = &o->cluster},
                                    {"--layout", .sp = &o->layout},
                                    {"--stage-mesh", .sp = &o->stage_mesh},
                                    {"--strategy", .sp = &o->strategy},
                                    {"--stage-strategy", .sp = &o->stage_strategy},
                                    {"--schedule", .sp = &o->schedule},
                                    {"--strategies", .sp = &o->strategies},
                                    {"--schedules", .sp = &o->schedules},
                                    {"--ablate", .sp = &o->ablate},
                                    {"--base-channels", &u->base, 1, 1024},
                                    {"--groups", &u->groups, 1, 1024},
                                    {"--head-dim", &u->head_dim, 1, 1024},
                                    {"--batch", &o->batch, 1, 1 << 16},
                                    {"--ranks", &o->ranks, 1, 4096},
                                    {"--hosts", &o->hosts, 1, 4096},
                                    {"--top", &o->top, 1, PLAN_MAX_TOP},
                                    {"--microbatches", &o->microbatches, 1, 1 << 16},
                                    {"--max-stages", &o->max_stages, 1, XMP_UTS_MAX_STAGES},
                                    {"--max-evals", &o->max_evals, 1, 1 << 30},
                                    {"--restarts", &u->restarts, 1, 1000},
                                    {"--mh-steps", &u->mh_steps, 1, 10000000}};
        int took = common_flag(argc, argv, &i, f, sizeof f / sizeof f[0], o);
        if (took < 0)
            return -1;
        if (took)
            continue;
        if (strcmp(a, "--seed"))
            return xmp_cli_error("unknown flag '%s' (xmesh-train utransformer plan --help)", a);
        char *end;
        if (!(v = xmp_cli_value(argc, argv, &i)))
            return -1;
        u->seed = strtoll(v, &end, 10);
        if (end == v || *end || u->seed < 0)
            return xmp_cli_error("--seed '%s': not an integer >= 0", v);
    }
    return ranks_hosts(o);
}

static int fill_ut_opts(ut_plan_opts_t *u, const xm_costmodel_t *cm, const xm_cluster_t *cl,
                        xmp_uts_opts_t *so)
{
    const plan_opts_t *p = &u->p;
    memset(so, 0, sizeof *so);
    if (xmp_ut_config_init(&so->model, u->base, u->groups, u->head_dim))
        return xmp_cli_error("model: %s", xmp_last_error());
    so->B = p->batch;
    so->nranks = p->ranks;
    so->hosts = p->hosts;
    so->memory_limit = p->memory_limit;
    so->cost = cm;
    so->cluster = cl;
    so->fixed_M = p->microbatches;
    so->max_stages = p->max_stages;
    so->max_evals = p->max_evals;
    so->seed = (uint64_t)u->seed;
    so->restarts = u->restarts;
    so->mh_steps = u->mh_steps;
    if (p->microbatches && p->batch % p->microbatches)
        return xmp_cli_error("--microbatches %d does not divide --batch %d", p->microbatches,
                             p->batch);
    static const char *const kn[] = {"gpipe", "1f1b", "eager-1f1b"};
    if (p->schedules && parse_list("--schedules", p->schedules, kn, 3, &so->schedules))
        return -1;
    if (p->strategies) { /* names are data: any name, checked by the model per mesh */
        snprintf(u->strat_buf, sizeof u->strat_buf, "%s", p->strategies);
        char *save = NULL;
        for (char *t = strtok_r(u->strat_buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            if (so->nstrat == XMP_UTS_MAX_STRAT)
                return xmp_cli_error("--strategies '%s': at most %d names", p->strategies,
                                     XMP_UTS_MAX_STRAT);
            so->strategies[so->nstrat++] = t;
        }
        if (!so->nstrat)
            return xmp_cli_error("--strategies '%s': empty list", p->strategies);
    }
    if (p->ablate) {
        if (strcmp(p->ablate, "boundary") != 0)
            return xmp_cli_error("--ablate '%s': the U-Transformer model knows 'boundary' only",
                                 p->ablate);
        so->no_boundary = 1;
    }
    return 0;
}

/* --eval of utransformer plan: one configuration through the public estimate. */
static int ut_eval(const ut_plan_opts_t *u, const xmp_utrans_desc_t *md)
{
    const plan_opts_t *p = &u->p;
    xmp_estimator_opts_t eo;
    memset(&eo, 0, sizeof eo);
    eo.cluster_file = p->cluster;
    eo.nominal = p->nominal;
    eo.flops = p->flops;
    eo.max_evals = p->max_evals;
    eo.no_boundary = p->ablate && !strcmp(p->ablate, "boundary");
    xmp_estimator_t *e = NULL;
    char err[1024];
    if (xmp_estimator_create(&eo, &e, err, sizeof err))
        return xmp_cli_error("%s", err), 2;
    xmp_layout_desc_t l = {p->ranks,
                           p->hosts,
                           p->layout,
                           p->stage_mesh,
                           p->stage_strategy ? p->stage_strategy : p->strategy,
                           p->schedule,
                           p->microbatches};
    xmp_estimate_t *est = calloc(1, sizeof *est);
    int rc = 2;
    if (!est || xmp_estimate_utransformer(e, md, &l, est, err, sizeof err)) {
        xmp_cli_error("--eval: %s", est ? err : "out of memory");
        goto out;
    }
    if (p->json) {
        xmp_json_t j;
        fflush(stdout);
        if (xmp_json_open(&j, "/dev/stdout"))
            goto out;
        xmp_json_obj_begin(&j, NULL);
        xmp_json_str(&j, "cost_model", xmp_estimator_label(e));
        xmp_json_num(&j, "step_s", est->step_s);
        xmp_json_num(&j, "bubble", est->bubble);
        xmp_json_num(&j, "compute_s", est->compute_s);
        xmp_json_num(&j, "boxing_s", est->boxing_s);
        xmp_json_num(&j, "boundary_s", est->boundary_s);
        xmp_json_num(&j, "memory_bytes_per_rank", est->mem_bytes);
        xmp_json_num(&j, "boxing_bytes_per_rank", est->boxing_bytes);
        xmp_json_num(&j, "boundary_bytes_per_rank", est->boundary_bytes);
        xmp_json_arr_begin(&j, "rank_memory_bytes");
        for (int r = 0; r < p->ranks; r++)
            xmp_json_num(&j, NULL, xmp_estimate_rank_memory(est, r));
        xmp_json_arr_end(&j);
        xmp_json_obj_end(&j);
        xmp_json_close(&j);
    } else {
        printf("# cost model: %s\nstep %.6g s, bubble %.3f, compute %.6g s, boxing %.6g s, "
               "boundary %.6g s per microbatch, memory %.0f bytes per rank (largest)\n",
               xmp_estimator_label(e), est->step_s, est->bubble, est->compute_s, est->boxing_s,
               est->boundary_s, est->mem_bytes);
    }
    rc = 0;
out:
    free(est);
    xmp_estimator_destroy(e);
    return rc;
}

int xmp_cmd_ut_plan(int argc, char **argv)
{
    xmp_cli_set_command("utransformer plan");
    ut_plan_opts_t u;
    int r = parse_ut_plan(argc, argv, &u);
    if (r)
        return r > 0 ? 0 : 2;
    xm_costmodel_t *cm = NULL;
    xm_cluster_t cl;
    memset(&cl, 0, sizeof cl);
    char label[512], err[1024];
    if (load_models(&u.p, &cm, &cl, label, sizeof label)) {
        xm_cluster_free(&cl);
        return 2;
    }
    int rc = 2, n = 0;
    xmp_uts_opts_t so;
    xmp_uts_stats_t st;
    xmp_uts_cand_t *c = calloc(PLAN_MAX_TOP, sizeof *c);
    if (!c || fill_ut_opts(&u, cm, &cl, &so))
        goto out;
    xmp_utrans_desc_t md = {u.base, u.groups, u.head_dim, u.p.batch};
    if (u.p.eval) {
        rc = ut_eval(&u, &md);
        goto out;
    }
    if ((u.exhaustive ? xmp_uts_exhaustive(&so, 1e7, u.p.top, c, &n, &st, err, sizeof err)
                      : xmp_uts_search(&so, u.p.top, c, &n, &st, err, sizeof err))) {
        xmp_cli_error("%s", err);
        rc = 1;
        goto out;
    }
    if (u.p.json) {
        xmp_json_t j;
        fflush(stdout);
        if (xmp_json_open(&j, "/dev/stdout"))
            goto out;
        xmp_json_obj_begin(&j, NULL);
        xmp_json_str(&j, "model", "utransformer");
        xmp_json_str(&j, "cost_model", label);
        xmp_json_str(&j, "method", u.exhaustive ? "exhaustive" : "coordinate descent + MH");
        xmp_json_int(&j, "seed", (long long)u.seed);
        xmp_json_int(&j, "ranks", u.p.ranks);
        xmp_json_int(&j, "hosts", u.p.hosts);
        xmp_json_num(&j, "memory_limit", u.p.memory_limit);
        xmp_json_num(&j, "search_s", st.seconds);
        xmp_json_int(&j, "evaluated", st.evals);
        xmp_json_num(&j, "space", st.space);
        xmp_json_int(&j, "edge_plans", st.edge_plans);
        xmp_json_num(&j, "min_memory_bytes", st.min_mem_bytes);
        xmp_json_arr_begin(&j, "configurations");
        for (int i = 0; i < n; i++) {
            char lay[256], mesh[256], strat[256], cmd[2048];
            xmp_uts_flags(&so, &c[i], lay, mesh, strat, sizeof lay);
            xmp_uts_command(&so, &c[i], cmd, sizeof cmd);
            xmp_json_obj_begin(&j, NULL);
            xmp_json_int(&j, "rank", i + 1);
            xmp_json_num(&j, "step_s", c[i].step_s);
            xmp_json_num(&j, "bubble", c[i].bubble);
            xmp_json_num(&j, "compute_s", c[i].compute_s);
            xmp_json_num(&j, "boxing_s", c[i].boxing_s);
            xmp_json_num(&j, "boundary_s", c[i].boundary_s);
            xmp_json_num(&j, "boxing_bytes_per_rank", c[i].boxing_bytes);
            xmp_json_num(&j, "boundary_bytes_per_rank", c[i].boundary_bytes);
            xmp_json_num(&j, "memory_bytes_per_rank", c[i].mem_bytes);
            xmp_json_int(&j, "nstages", c[i].nstages);
            xmp_json_int(&j, "microbatches", c[i].M);
            xmp_json_str(&j, "schedule", xmp_sched_kind_name(c[i].sched));
            xmp_json_str(&j, "layout", lay);
            xmp_json_str(&j, "stage_mesh", mesh);
            xmp_json_str(&j, "stage_strategy", strat);
            xmp_json_str(&j, "command", cmd);
            char ord[8192];
            double g =
                placement_of(&u.p, &md, lay, mesh, strat, c[i].sched, c[i].M, ord, sizeof ord);
            xmp_json_str(&j, "rank_order", ord);
            xmp_json_num(&j, "rank_order_gain_s", g);
            xmp_json_obj_end(&j);
        }
        xmp_json_arr_end(&j);
        xmp_json_obj_end(&j);
        xmp_json_close(&j);
    } else {
        printf("# U-Transformer layout search: %d ranks on %d hosts, batch %d, base %d; cost "
               "model %s\n# %s, seed %lld: %ld configurations evaluated of %.0f, %ld edge plans, "
               "%.3f s; smallest memory any configuration needs: %.1f MiB per rank\n",
               u.p.ranks, u.p.hosts, u.p.batch, u.base, label,
               u.exhaustive ? "exhaustive" : "coordinate descent + Metropolis-Hastings", u.seed,
               st.evals, st.space, st.edge_plans, st.seconds, st.min_mem_bytes / 1048576.0);
        printf("%-3s %10s %6s %10s %10s %9s %9s %9s %-10s %3s  %s\n", "#", "step_s", "bubble",
               "compute_s", "boxing_s", "box_B/rk", "bnd_B/rk", "mem/rk", "schedule", "M",
               "layout | stage-mesh | strategies");
        for (int i = 0; i < n; i++) {
            char lay[256], mesh[256], strat[256], a[32], b[32], m[32];
            xmp_uts_flags(&so, &c[i], lay, mesh, strat, sizeof lay);
            fmt_bytes(c[i].boxing_bytes, a, sizeof a);
            fmt_bytes(c[i].boundary_bytes, b, sizeof b);
            fmt_bytes(c[i].mem_bytes, m, sizeof m);
            printf("%-3d %10.4g %6.3f %10.4g %10.4g %9s %9s %9s %-10s %3d  %s | %s | %s\n", i + 1,
                   c[i].step_s, c[i].bubble, c[i].compute_s, c[i].boxing_s, a, b, m,
                   xmp_sched_kind_name(c[i].sched), c[i].M, lay, mesh, strat);
        }
        printf("# command lines:\n");
        for (int i = 0; i < n; i++) {
            char cmd[2048];
            xmp_uts_command(&so, &c[i], cmd, sizeof cmd);
            printf("%-3d %s\n", i + 1, cmd);
            char lay[256], mesh[256], strat[256], ord[8192];
            xmp_uts_flags(&so, &c[i], lay, mesh, strat, sizeof lay);
            double g =
                placement_of(&u.p, &md, lay, mesh, strat, c[i].sched, c[i].M, ord, sizeof ord);
            if (g > 0)
                printf("    # rank order (xmesh_suggest_order: boundary bounds %.3g s lower): %s\n",
                       g, ord);
        }
    }
    rc = 0;
out:
    free(c);
    xm_costmodel_destroy(cm);
    xm_cluster_free(&cl);
    return rc;
}
