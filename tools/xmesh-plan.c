/*
 * xmesh-plan: plan a cross-mesh resharding without MPI (issue 2 item 7,
 * issue 3 item 5). Decomposes into unit tasks (paper 002 Appendix B.2),
 * schedules them (section 3.2), simulates the plan on a modelled cluster and
 * prints tasks, totals, lower bound and makespan, as text or JSON.
 *
 * Exit status: 0 success, 1 planning error, 2 bad command line.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "xm_api.h"
#include "xm_cases.h"
#include "xm_cluster_file.h"
#include "xm_cost.h"
#include "xm_sched.h"

#define ALL_SCHEDULERS (-2)

typedef struct {
    int ndim;
    int64_t shape[XM_MAX_DIMS];
    const char *dtype;
    int src_ndim, src_shape[XM_MAX_MESH_DIMS];
    int dst_ndim, dst_shape[XM_MAX_MESH_DIMS];
    const char *src_spec, *dst_spec;
} problem_t;

typedef struct {
    problem_t pb;
    int have_shape, have_src_mesh, have_dst_mesh, have_src_spec, have_dst_spec, have_dtype;
    int overlap, json, all_cases, case_no, split, suggest;
    int scheduler; /* xmesh_scheduler_t or ALL_SCHEDULERS */
    xmesh_strategy_t strategy;
    double nic_gbps, nic_recv_gbps, intra_gbps, latency_us;
    int nics_per_host;
    const char *cluster_file; /* --cluster or XMESH_CLUSTER_FILE, "" if none */
    int64_t chunk_bytes, max_evals, max_tasks;
    double budget_ms;
    uint64_t seed;
    const char *trace;
    const char *many; /* --many FILE */
} opts_t;

#define NCASES XM_TABLE2_NCASES

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: xmesh-plan --shape N,N,... --src-mesh AxB --src-spec SPEC --dst-mesh AxB\n"
        "                  --dst-spec SPEC [options]\n"
        "       xmesh-plan --case N [options]     (paper Table 2 case N, 1..%d)\n"
        "       xmesh-plan --all-cases [options]  (one summary line per Table 2 case)\n"
        "       xmesh-plan --many FILE [options]  (one plan of many tensors)\n"
        "\n"
        "Plans a cross-mesh resharding without MPI: unit tasks, sender choice, order,\n"
        "routes, a lower bound and the simulated completion time on a modelled cluster.\n"
        "Mesh axis 0 enumerates hosts (2x4 = 2 hosts of 4 devices); source and\n"
        "destination meshes sit on different hosts unless --overlap.\n"
        "\n"
        "problem:\n"
        "  --shape N,N,...        global tensor shape (up to %d dims)\n"
        "  --dtype T              u8 i8 i32 i64 f16 bf16 f32 f64 (default i32)\n"
        "  --src-mesh AxBx..      source mesh shape (up to %d dims)\n"
        "  --src-spec SPEC        GSPMD (S0RR, RS01R, S1,R,R) or SBP (S(0),B,P)\n"
        "  --dst-mesh, --dst-spec destination mesh and sharding\n"
        "  --overlap              both meshes on the same devices (ids 0..)\n"
        "  --suggest-order        also propose the destination device order that\n"
        "                         minimises the lower bound (placement advice)\n"
        "  --many FILE            a plan of many tensors, one layout pair per line:\n"
        "                           SHAPE DTYPE SRC-MESH SRC-SPEC DST-MESH DST-SPEC [DST-DTYPE]\n"
        "                         e.g. '768,2304 bf16 2x4 S(0),B 2x4 B,S(1)'; SHAPE '-' is a\n"
        "                         scalar; '#' starts a comment. Every mesh lies on the\n"
        "                         devices of the first line's meshes in row-major order\n"
        "                         (a 4x2 mesh after a 2x4 one: the same 8 devices), so\n"
        "                         later meshes have at most as many devices. Prints the\n"
        "                         plan of the whole (unit and packed tasks, bytes, lower\n"
        "                         bound, prediction; --json) and, for comparison, the\n"
        "                         model time of one plan per tensor one after another\n"
        "                         (docs/MANY.md)\n"
        "  --split                cut the unit tasks of small instances into pieces so\n"
        "                         several sender hosts / NICs share a task\n"
        "scheduling:\n"
        "  --scheduler NAME       naive | lb | dfs | greedy | ensemble | all (default\n"
        "                         $XMESH_SCHEDULER or ensemble)\n"
        "  --strategy NAME        broadcast | sendrecv | sendrecv-allgather |\n"
        "                         global-allgather (default broadcast); the all-gather\n"
        "                         strategies take their senders and order from the\n"
        "                         send/receive plan and are priced by their own model\n"
        "                         (lower bound: the broadcast model's, that of any plan)\n"
        "  --budget-ms MS         search time budget (default $XMESH_BUDGET_US/1000 = 20)\n"
        "  --max-evals N          deterministic budget in evaluation steps instead of time\n"
        "  --seed N               random seed (default $XMESH_SEED or 1)\n"
        "cluster model (flags override a cluster file, which overrides XMESH_*):\n"
        "  --cluster FILE         cluster file, e.g. from xmesh-calibrate -o FILE\n"
        "                         (default $XMESH_CLUSTER_FILE)\n"
        "  --nic-gbps G           NIC bandwidth per direction, Gbit/s (default 10)\n"
        "  --nics-per-host N      NICs per host (default 1)\n"
        "  --intra-gbps G         intra-host device bandwidth, Gbit/s (default 800)\n"
        "  --latency-us US        per-message latency (default 5)\n"
        "  --chunk-bytes B        pipelining chunk (default XMESH_CHUNK_BYTES; auto: 65408)\n"
        "output:\n"
        "  --json                 one JSON object (tasks, totals, per-scheduler results)\n"
        "  --max-tasks N          list at most N tasks (default 16 as text, all in JSON)\n"
        "  --trace FILE           Chrome trace-event JSON of the simulated plan (Perfetto)\n"
        "  --help\n",
        NCASES, XM_MAX_DIMS, XM_MAX_MESH_DIMS);
}

static int bad(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int bad(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "xmesh-plan: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (see --help)\n");
    va_end(ap);
    return 2;
}

static int parse_i64(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 0);
    if (!*s || *end || errno || v < lo || v > hi)
        return bad("bad value '%s' for %s: expected an integer in [%lld, %lld]", s, flag,
                   (long long)lo, (long long)hi);
    *out = v;
    return 0;
}

static int parse_pos_double(const char *flag, const char *s, int allow_zero, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno || !isfinite(v) || v < 0 || (!allow_zero && v == 0))
        return bad("bad value '%s' for %s: expected a number %s 0", s, flag,
                   allow_zero ? ">=" : ">");
    *out = v;
    return 0;
}

/* "2x4" (or "2,4") -> dims. */
static int parse_mesh(const char *flag, const char *s, int *ndim, int *shape)
{
    int n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 1 || v > 65536 || n == XM_MAX_MESH_DIMS)
            return bad("bad value '%s' for %s: expected up to %d positive sizes like 2x4", s, flag,
                       XM_MAX_MESH_DIMS);
        shape[n++] = (int)v;
        p = end;
        if (*p == 'x' || *p == 'X' || *p == ',') {
            p++;
            if (!*p)
                return bad("bad value '%s' for %s: trailing separator", s, flag);
        } else if (*p) {
            return bad("bad value '%s' for %s: unexpected '%c'", s, flag, *p);
        }
    }
    if (n == 0)
        return bad("bad value '%s' for %s: empty mesh", s, flag);
    *ndim = n;
    return 0;
}

static int parse_shape(const char *s, int *ndim, int64_t *shape)
{
    int n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || errno || v < 0 || n == XM_MAX_DIMS)
            return bad("bad value '%s' for --shape: expected up to %d sizes >= 0 like 1024,512", s,
                       XM_MAX_DIMS);
        shape[n++] = v;
        p = end;
        if (*p == ',' || *p == 'x') {
            p++;
            if (!*p)
                return bad("bad value '%s' for --shape: trailing separator", s);
        } else if (*p) {
            return bad("bad value '%s' for --shape: unexpected '%c'", s, *p);
        }
    }
    *ndim = n;
    return 0;
}

static void set_case(problem_t *pb, int c)
{
    pb->ndim = 3;
    for (int d = 0; d < 3; d++)
        pb->shape[d] = xm_table2[c].shape[d];
    pb->dtype = "i32";
    pb->src_ndim = pb->dst_ndim = 2;
    for (int a = 0; a < 2; a++) {
        pb->src_shape[a] = xm_table2[c].src[a];
        pb->dst_shape[a] = xm_table2[c].dst[a];
    }
    pb->src_spec = xm_table2[c].ss;
    pb->dst_spec = xm_table2[c].ds;
}

static int parse_args(int argc, char **argv, opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->pb.dtype = "i32";
    const char *sch = xm_param_str("XMESH_SCHEDULER");
    xmesh_scheduler_t k;
    o->scheduler = xmesh_scheduler_parse(sch, &k) ? XMESH_SCHEDULER_ENSEMBLE : (int)k;
    xmesh_strategy_t st;
    o->strategy =
        xmesh_strategy_parse(xm_param_str("XMESH_STRATEGY"), &st) ? XMESH_STRATEGY_BROADCAST : st;
    o->nic_gbps = xm_param_double("XMESH_NIC_GBPS");
    o->intra_gbps = xm_param_double("XMESH_INTRA_GBPS");
    o->latency_us = xm_param_double("XMESH_LATENCY_US");
    o->nics_per_host = (int)xm_param_i64("XMESH_NICS_PER_HOST");
    o->chunk_bytes = xm_param_chunk_bytes(); /* 0 = auto resolved */
    o->budget_ms = (double)xm_param_i64("XMESH_BUDGET_US") / 1000.0;
    o->seed = (uint64_t)xm_param_i64("XMESH_SEED");
    o->max_tasks = -1;
    /* A cluster file (--cluster, else XMESH_CLUSTER_FILE) overrides the
     * XMESH_* values above; explicit flags below override both. */
    o->cluster_file = xm_param_str("XMESH_CLUSTER_FILE");
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--cluster"))
            o->cluster_file = argv[i + 1];
    o->nic_recv_gbps = o->nic_gbps;
    if (o->cluster_file && *o->cluster_file) {
        xm_cluster_t x;
        memset(&x, 0, sizeof x);
        x.nic_send_Bps = x.nic_recv_Bps = o->nic_gbps * 1e9 / 8;
        x.intra_Bps = o->intra_gbps * 1e9 / 8;
        x.latency_s = o->latency_us * 1e-6;
        x.nics_per_host = o->nics_per_host;
        x.chunk_bytes = o->chunk_bytes;
        if (xm_cluster_load(o->cluster_file, &x))
            return bad("--cluster: %s", xmesh_last_error());
        o->nic_gbps = x.nic_send_Bps * 8 / 1e9;
        o->nic_recv_gbps = x.nic_recv_Bps * 8 / 1e9;
        o->intra_gbps = x.intra_Bps * 8 / 1e9;
        o->latency_us = x.latency_s * 1e6;
        o->nics_per_host = x.nics_per_host;
        o->chunk_bytes = x.chunk_bytes;
    } else {
        o->cluster_file = "";
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int64_t v;
        int rc;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        }
        if (!strcmp(a, "--json")) {
            o->json = 1;
            continue;
        }
        if (!strcmp(a, "--suggest-order")) {
            o->suggest = 1;
            continue;
        }
        if (!strcmp(a, "--overlap")) {
            o->overlap = 1;
            continue;
        }
        if (!strcmp(a, "--split")) {
            o->split = 1;
            continue;
        }
        if (!strcmp(a, "--all-cases")) {
            o->all_cases = 1;
            continue;
        }
        if (strncmp(a, "--", 2) != 0)
            return bad("unexpected argument '%s'", a);
        if (i + 1 >= argc)
            return bad("option %s needs a value", a);
        const char *val = argv[++i];
        if (!strcmp(a, "--many")) {
            o->many = val;
        } else if (!strcmp(a, "--shape")) {
            if ((rc = parse_shape(val, &o->pb.ndim, o->pb.shape)))
                return rc;
            o->have_shape = 1;
        } else if (!strcmp(a, "--dtype")) {
            xmesh_dtype_t dt;
            if (xmesh_dtype_parse(val, &dt))
                return bad("bad value '%s' for --dtype: %s", val, xmesh_last_error());
            o->pb.dtype = val;
            o->have_dtype = 1;
        } else if (!strcmp(a, "--src-mesh")) {
            if ((rc = parse_mesh(a, val, &o->pb.src_ndim, o->pb.src_shape)))
                return rc;
            o->have_src_mesh = 1;
        } else if (!strcmp(a, "--dst-mesh")) {
            if ((rc = parse_mesh(a, val, &o->pb.dst_ndim, o->pb.dst_shape)))
                return rc;
            o->have_dst_mesh = 1;
        } else if (!strcmp(a, "--src-spec")) {
            o->pb.src_spec = val;
            o->have_src_spec = 1;
        } else if (!strcmp(a, "--dst-spec")) {
            o->pb.dst_spec = val;
            o->have_dst_spec = 1;
        } else if (!strcmp(a, "--scheduler")) {
            if (!strcmp(val, "all"))
                o->scheduler = ALL_SCHEDULERS;
            else if (xmesh_scheduler_parse(val, &k))
                return bad("bad value '%s' for --scheduler: expected naive, lb, dfs, greedy, "
                           "ensemble or all",
                           val);
            else
                o->scheduler = k;
        } else if (!strcmp(a, "--strategy")) {
            if (xmesh_strategy_parse(val, &st))
                return bad("bad value '%s' for --strategy: %s", val, xmesh_last_error());
            o->strategy = st;
        } else if (!strcmp(a, "--nic-gbps")) {
            if ((rc = parse_pos_double(a, val, 0, &o->nic_gbps)))
                return rc;
            o->nic_recv_gbps = o->nic_gbps;
        } else if (!strcmp(a, "--intra-gbps")) {
            if ((rc = parse_pos_double(a, val, 0, &o->intra_gbps)))
                return rc;
        } else if (!strcmp(a, "--latency-us")) {
            if ((rc = parse_pos_double(a, val, 1, &o->latency_us)))
                return rc;
        } else if (!strcmp(a, "--budget-ms")) {
            if ((rc = parse_pos_double(a, val, 0, &o->budget_ms)))
                return rc;
        } else if (!strcmp(a, "--nics-per-host")) {
            if ((rc = parse_i64(a, val, 1, 64, &v)))
                return rc;
            o->nics_per_host = (int)v;
        } else if (!strcmp(a, "--chunk-bytes")) {
            if ((rc = parse_i64(a, val, 1, INT64_MAX, &o->chunk_bytes)))
                return rc;
        } else if (!strcmp(a, "--max-evals")) {
            if ((rc = parse_i64(a, val, 1, INT64_MAX, &o->max_evals)))
                return rc;
        } else if (!strcmp(a, "--max-tasks")) {
            if ((rc = parse_i64(a, val, 0, INT_MAX, &o->max_tasks)))
                return rc;
        } else if (!strcmp(a, "--seed")) {
            if ((rc = parse_i64(a, val, 0, INT64_MAX, &v)))
                return rc;
            o->seed = (uint64_t)v;
        } else if (!strcmp(a, "--case")) {
            if ((rc = parse_i64(a, val, 1, NCASES, &v)))
                return rc;
            o->case_no = (int)v;
        } else if (!strcmp(a, "--trace")) {
            o->trace = val;
        } else if (!strcmp(a, "--cluster")) {
            /* read above, before the flags that refine it */
        } else {
            return bad("unknown option '%s'", a);
        }
    }
    if (!(o->nic_gbps > 0) || !(o->intra_gbps > 0) || o->nics_per_host < 1 || o->chunk_bytes < 1 ||
        !(o->latency_us >= 0))
        return bad("bad cluster parameter from the environment (XMESH_NIC_GBPS=%g, "
                   "XMESH_INTRA_GBPS=%g, XMESH_NICS_PER_HOST=%d, XMESH_CHUNK_BYTES=%lld, "
                   "XMESH_LATENCY_US=%g)",
                   o->nic_gbps, o->intra_gbps, o->nics_per_host, (long long)o->chunk_bytes,
                   o->latency_us);
    if (o->case_no) {
        problem_t pb = o->pb;
        set_case(&o->pb, o->case_no - 1);
        /* explicit flags refine the preset */
        if (o->have_shape) {
            o->pb.ndim = pb.ndim;
            memcpy(o->pb.shape, pb.shape, sizeof pb.shape);
        }
        if (o->have_dtype)
            o->pb.dtype = pb.dtype;
        if (o->have_src_mesh) {
            o->pb.src_ndim = pb.src_ndim;
            memcpy(o->pb.src_shape, pb.src_shape, sizeof pb.src_shape);
        }
        if (o->have_dst_mesh) {
            o->pb.dst_ndim = pb.dst_ndim;
            memcpy(o->pb.dst_shape, pb.dst_shape, sizeof pb.dst_shape);
        }
        if (o->have_src_spec)
            o->pb.src_spec = pb.src_spec;
        if (o->have_dst_spec)
            o->pb.dst_spec = pb.dst_spec;
    } else if (!o->all_cases && !o->many) {
        if (!o->have_shape)
            return bad("missing --shape (or --case N / --all-cases)");
        if (!o->have_src_mesh || !o->have_dst_mesh)
            return bad("missing --%s-mesh", o->have_src_mesh ? "dst" : "src");
        if (!o->have_src_spec || !o->have_dst_spec)
            return bad("missing --%s-spec", o->have_src_spec ? "dst" : "src");
    }
    return 0;
}

/* ------------------------------------------------------------ planning */

typedef struct {
    xm_hostmap_t hm;
    int *sdevs, *ddevs;
    xm_taskset_t ts;
    xm_cluster_t cl;
    int nres;
    xm_schedule_t sched[XMESH_SCHEDULER_COUNT_];
    xmesh_scheduler_t kinds[XMESH_SCHEDULER_COUNT_];
    int main_res; /* index of the result whose tasks are listed */
    xm_sim_result_t sim;
    int split_from, split_to, split_used; /* --split: task counts, whether kept */
    double decompose_ms;                  /* wall time of xm_decompose */
    double decompose_cpu_ms, plan_cpu_ms; /* thread CPU time: decompose, main schedule */
    int *suggested;                       /* --suggest-order: destination order */
    xmesh_placement_info_t place;
} plan_t;

static void plan_free(plan_t *p)
{
    for (int i = 0; i < p->nres; i++)
        xm_schedule_free(&p->sched[i]);
    xm_sim_result_free(&p->sim);
    xm_cluster_free(&p->cl);
    xm_taskset_free(&p->ts);
    xm_hostmap_free(&p->hm);
    free(p->sdevs);
    free(p->ddevs);
    free(p->suggested);
    memset(p, 0, sizeof *p);
}

static xm_sched_opts_t sched_opts(const opts_t *o, xmesh_scheduler_t kind)
{
    xm_sched_opts_t so;
    memset(&so, 0, sizeof so);
    so.kind = kind;
    so.budget_us = (int64_t)(o->budget_ms * 1000.0);
    if (so.budget_us < 1)
        so.budget_us = 1;
    so.seed = o->seed;
    /* The all-gather strategies take senders and order from the send/receive
     * model, as plan creation does (lib/plan/api.c). */
    so.strategy = o->strategy == XMESH_STRATEGY_SENDRECV_ALLGATHER ||
                          o->strategy == XMESH_STRATEGY_GLOBAL_ALLGATHER
                      ? XMESH_STRATEGY_SENDRECV
                      : o->strategy;
    so.max_evals = o->max_evals;
    return so;
}

/* --split: schedule the unsplit and the split task sets with the main
 * scheduler and keep the split one only if its plan is faster. */
static xmesh_result_t try_split(const opts_t *o, plan_t *p)
{
    xm_taskset_t sp;
    xmesh_result_t r = xm_taskset_split(&p->ts, &p->cl, 4096, &sp, NULL);
    if (r) {
        fprintf(stderr, "xmesh-plan: splitting failed: %s\n", xmesh_last_error());
        return r;
    }
    p->split_from = p->ts.ntasks;
    p->split_to = sp.ntasks;
    if (sp.ntasks == p->ts.ntasks) {
        xm_taskset_free(&sp);
        return XMESH_SUCCESS;
    }
    xm_sched_opts_t so =
        sched_opts(o, o->scheduler == ALL_SCHEDULERS ? XMESH_SCHEDULER_ENSEMBLE
                                                     : (xmesh_scheduler_t)o->scheduler);
    xm_schedule_t a, b;
    if ((r = xm_schedule(&p->ts, &p->cl, &so, &a))) {
        xm_taskset_free(&sp);
        fprintf(stderr, "xmesh-plan: scheduling failed: %s\n", xmesh_last_error());
        return r;
    }
    if ((r = xm_schedule(&sp, &p->cl, &so, &b))) {
        xm_schedule_free(&a);
        xm_taskset_free(&sp);
        fprintf(stderr, "xmesh-plan: scheduling failed: %s\n", xmesh_last_error());
        return r;
    }
    p->split_used = b.makespan_s < a.makespan_s * (1 - 1e-9);
    if (p->split_used) {
        xm_taskset_free(&p->ts);
        p->ts = sp;
    } else {
        xm_taskset_free(&sp);
    }
    xm_schedule_free(&a);
    xm_schedule_free(&b);
    return XMESH_SUCCESS;
}

static double now_ms(clockid_t clk)
{
    struct timespec t;
    clock_gettime(clk, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

/* Returns 0, 1 (planning error, message printed) or 2 (bad problem). */
static int plan_run(const opts_t *o, const problem_t *pb, plan_t *p)
{
    memset(p, 0, sizeof *p);
    xmesh_dtype_t dt;
    if (xmesh_dtype_parse(pb->dtype, &dt))
        return bad("bad value '%s' for --dtype", pb->dtype);
    if (xm_hostmap_default(pb->src_shape, pb->src_ndim, pb->dst_shape, pb->dst_ndim, o->overlap,
                           &p->hm, &p->sdevs, &p->ddevs)) {
        fprintf(stderr, "xmesh-plan: %s\n", xmesh_last_error());
        return 1;
    }
    xm_layout_t L[2];
    memset(L, 0, sizeof L);
    for (int s = 0; s < 2; s++) {
        xm_layout_t *l = &L[s];
        l->ndim = pb->ndim;
        memcpy(l->shape, pb->shape, sizeof(int64_t) * pb->ndim);
        l->elem_size = xmesh_dtype_size(dt);
        int nd = s ? pb->dst_ndim : pb->src_ndim;
        const int *shp = s ? pb->dst_shape : pb->src_shape;
        l->mesh.ndim = nd;
        l->mesh.ndev = 1;
        for (int a = 0; a < nd; a++) {
            l->mesh.shape[a] = shp[a];
            l->mesh.ndev *= shp[a];
        }
        l->mesh.devs = s ? p->ddevs : p->sdevs;
        const char *spec = s ? pb->dst_spec : pb->src_spec;
        if (xm_spec_parse(spec, pb->ndim, nd, &l->spec))
            return bad("bad value '%s' for --%s-spec: %s", spec, s ? "dst" : "src",
                       xmesh_last_error());
    }
    double t0 = now_ms(CLOCK_MONOTONIC), c0 = now_ms(CLOCK_THREAD_CPUTIME_ID);
    xmesh_result_t r = xm_decompose(&L[0], &L[1], &p->hm, &p->ts);
    p->decompose_ms = now_ms(CLOCK_MONOTONIC) - t0;
    p->decompose_cpu_ms = now_ms(CLOCK_THREAD_CPUTIME_ID) - c0;
    if (r == XMESH_ERR_INVALID_ARGUMENT)
        return bad("%s", xmesh_last_error());
    if (r) {
        fprintf(stderr, "xmesh-plan: decomposition failed: %s\n", xmesh_last_error());
        return 1;
    }
    if (xm_cluster_init(&p->cl, &p->hm)) {
        fprintf(stderr, "xmesh-plan: %s\n", xmesh_last_error());
        return 1;
    }
    p->cl.nics_per_host = o->nics_per_host;
    p->cl.nic_send_Bps = o->nic_gbps * 1e9 / 8;
    p->cl.nic_recv_Bps = o->nic_recv_gbps * 1e9 / 8;
    p->cl.intra_Bps = o->intra_gbps * 1e9 / 8;
    p->cl.latency_s = o->latency_us * 1e-6;
    p->cl.chunk_bytes = o->chunk_bytes;
    if (o->suggest) {
        xmesh_placement_problem_t pp = {pb->ndim,      pb->shape, dt,           pb->src_ndim,
                                        pb->src_shape, p->sdevs,  pb->src_spec, pb->dst_ndim,
                                        pb->dst_shape, p->ddevs,  pb->dst_spec, p->hm.ndev,
                                        p->hm.host_of};
        p->suggested = malloc(sizeof(int) * L[1].mesh.ndev);
        if (!p->suggested || xm_suggest_order(&pp, &p->cl, p->suggested, &p->place)) {
            fprintf(stderr, "xmesh-plan: --suggest-order failed: %s\n", xmesh_last_error());
            return 1;
        }
    }
    if (o->split && (r = try_split(o, p)))
        return 1;
    if (o->scheduler == ALL_SCHEDULERS) {
        p->nres = XMESH_SCHEDULER_COUNT_;
        for (int k = 0; k < p->nres; k++)
            p->kinds[k] = (xmesh_scheduler_t)k;
        p->main_res = XMESH_SCHEDULER_ENSEMBLE;
    } else {
        p->nres = 1;
        p->kinds[0] = (xmesh_scheduler_t)o->scheduler;
        p->main_res = 0;
    }
    for (int k = 0; k < p->nres; k++) {
        xm_sched_opts_t so = sched_opts(o, p->kinds[k]);
        double c1 = now_ms(CLOCK_THREAD_CPUTIME_ID);
        r = xm_schedule(&p->ts, &p->cl, &so, &p->sched[k]);
        if (k == p->main_res)
            p->plan_cpu_ms = now_ms(CLOCK_THREAD_CPUTIME_ID) - c1;
        if (r) {
            fprintf(stderr, "xmesh-plan: scheduling (%s) failed: %s\n",
                    xmesh_scheduler_name(p->kinds[k]), xmesh_last_error());
            p->nres = k;
            return 1;
        }
    }
    /* The all-gather strategies move other bytes than the routes their
     * senders and order come from: price them with their own model, as
     * xmesh_plan_get_info() does (per-task times stay the routes'). */
    if (o->strategy == XMESH_STRATEGY_SENDRECV_ALLGATHER ||
        o->strategy == XMESH_STRATEGY_GLOBAL_ALLGATHER) {
        for (int k = 0; k < p->nres; k++) {
            double t = xm_cost_allgather(&p->ts, &p->cl, &p->sched[k],
                                         o->strategy == XMESH_STRATEGY_SENDRECV_ALLGATHER);
            if (!(t >= 0)) {
                fprintf(stderr, "xmesh-plan: the %s model failed: %s\n",
                        xmesh_strategy_name(o->strategy), xmesh_last_error());
                return 1;
            }
            p->sched[k].makespan_s = t;
            /* Their bound is that of any schedule: the broadcast model's. */
            p->sched[k].lower_bound_s = xm_lower_bound(&p->ts, &p->cl);
        }
    }
    FILE *tf = NULL;
    if (o->trace && !(tf = fopen(o->trace, "w"))) {
        fprintf(stderr, "xmesh-plan: cannot write --trace '%s': %s\n", o->trace, strerror(errno));
        return 1;
    }
    r = xm_simulate(&p->ts, &p->cl, &p->sched[p->main_res], &p->sim, tf);
    if (tf && fclose(tf) && !r) {
        fprintf(stderr, "xmesh-plan: writing --trace '%s' failed\n", o->trace);
        return 1;
    }
    if (r) {
        fprintf(stderr, "xmesh-plan: simulation failed: %s\n", xmesh_last_error());
        return 1;
    }
    return 0;
}

/* -------------------------------------------------------------- output */

static void fmt_mesh(char *buf, size_t n, int nd, const int *s)
{
    size_t k = 0;
    buf[0] = 0;
    for (int a = 0; a < nd && k < n; a++)
        k += (size_t)snprintf(buf + k, n - k, "%s%d", a ? "x" : "", s[a]);
}

static void fmt_shape(char *buf, size_t n, int nd, const int64_t *s)
{
    size_t k = 0;
    buf[0] = 0;
    for (int a = 0; a < nd && k < n; a++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", a ? "," : "", (long long)s[a]);
}

static const char *human_bytes(double b, char *buf, size_t n)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024 && i < 4) {
        b /= 1024;
        i++;
    }
    snprintf(buf, n, i ? "%.2f %s" : "%.0f %s", b, u[i]);
    return buf;
}

/* Devices grouped by host: "h0[0,1] h1[4]". */
static void print_devs(FILE *f, const xm_hostmap_t *hm, const int *d, int n)
{
    for (int i = 0; i < n; i++) {
        int h = hm->host_of[d[i]];
        int newh = i == 0 || hm->host_of[d[i - 1]] != h;
        if (newh)
            fprintf(f, "%sh%d[", i ? "] " : "", h);
        else
            fprintf(f, ",");
        fprintf(f, "%d", d[i]);
    }
    if (n)
        fprintf(f, "]");
}

static int list_limit(const opts_t *o, int n, int json)
{
    int64_t m = o->max_tasks >= 0 ? o->max_tasks : json ? n : 16;
    return m < n ? (int)m : n;
}

static void print_text(const opts_t *o, const problem_t *pb, const plan_t *p)
{
    const xm_taskset_t *ts = &p->ts;
    const xm_schedule_t *s = &p->sched[p->main_res];
    char a[64], b[64], c[64], hb[32];
    fmt_shape(a, sizeof a, pb->ndim, pb->shape);
    fmt_mesh(b, sizeof b, pb->src_ndim, pb->src_shape);
    fmt_mesh(c, sizeof c, pb->dst_ndim, pb->dst_shape);
    printf("resharding: shape (%s) %s, src mesh %s spec %s -> dst mesh %s spec %s%s\n", a,
           pb->dtype, b, pb->src_spec, c, pb->dst_spec, o->overlap ? " (overlapping)" : "");
    printf("cluster: %d hosts, %d devices, %d NIC(s)/host at %g Gb/s, intra %g Gb/s, latency %g "
           "us, chunk %lld B%s%s\n",
           p->hm.nhosts, p->hm.ndev, o->nics_per_host, o->nic_gbps, o->intra_gbps, o->latency_us,
           (long long)o->chunk_bytes, *o->cluster_file ? ", from " : "", o->cluster_file);
    printf("scheduler: %s, strategy %s\n", xmesh_scheduler_name(s->scheduler),
           xmesh_strategy_name(o->strategy));
    if (o->split)
        printf("split: %d unit tasks -> %d pieces, %s\n", p->split_from, p->split_to,
               p->split_used ? "used (faster plan)" : "not used (no faster plan)");
    printf("\n");
    int lim = list_limit(o, ts->ntasks, 0);
    if (lim > 0)
        printf("%5s  %-28s %10s  %-12s %-12s  %s\n", "task", "box [lo,hi)", "bytes", "start_ms",
               "end_ms", "holders -> sender => receivers");
    for (int t = 0; t < lim; t++) {
        const xm_task_t *k = &ts->tasks[t];
        char box[256];
        size_t m = 0;
        box[0] = 0;
        for (int d = 0; d < ts->ndim && m < sizeof box; d++)
            m += (size_t)snprintf(box + m, sizeof box - m, "%s%lld:%lld", d ? "," : "",
                                  (long long)k->box.lo[d], (long long)k->box.hi[d]);
        printf("%5d  %-28s %10lld  %-12.3f %-12.3f  ", t, box, (long long)k->bytes,
               p->sim.task_start_s[t] * 1e3, p->sim.task_end_s[t] * 1e3);
        for (int g = 0; g < k->ngroups; g++) {
            if (k->ngroups > 1)
                printf("%sP%d:", g ? " " : "", g);
            print_devs(stdout, &p->hm, ts->holders + k->holder_off + g * k->group_size,
                       k->group_size);
        }
        printf(" -> ");
        for (int g = 0; g < k->ngroups; g++) {
            int d = s->sender[(size_t)t * s->max_groups + g];
            printf("%sd%d(h%d)", g ? "+" : "", d, p->hm.host_of[d]);
        }
        printf(" => ");
        print_devs(stdout, &p->hm, ts->recvs + k->recv_off, k->nrecv);
        printf("\n");
    }
    if (lim < ts->ntasks)
        printf("  ... %d more tasks (--max-tasks N to list more)\n", ts->ntasks - lim);
    printf("\nunit tasks:        %d\n", ts->ntasks);
    printf("bytes_total:       %lld (%s)\n", (long long)ts->bytes_total,
           human_bytes((double)ts->bytes_total, hb, sizeof hb));
    printf("bytes_cross_host:  %lld (%s)\n", (long long)ts->bytes_cross_host,
           human_bytes((double)ts->bytes_cross_host, hb, sizeof hb));
    printf("lower bound:       %.6f s\n", s->lower_bound_s);
    for (int i = 0; i < p->nres; i++) {
        const xm_schedule_t *q = &p->sched[i];
        printf("%-18s %.6f s  (%.3f x lower bound)  plan %.3f ms\n",
               p->nres > 1 ? xmesh_scheduler_name(q->scheduler) : "makespan:", q->makespan_s,
               q->lower_bound_s > 0 ? q->makespan_s / q->lower_bound_s : 1.0, q->plan_s * 1e3);
    }
    if (p->nres > 1)
        printf("(tasks listed with the %s plan)\n", xmesh_scheduler_name(s->scheduler));
    if (p->suggested) {
        int nd = 1;
        for (int ax = 0; ax < pb->dst_ndim; ax++)
            nd *= pb->dst_shape[ax];
        printf("suggested order:   ");
        for (int i = 0; i < nd; i++)
            printf("%s%d", i ? "," : "", p->suggested[i]);
        printf("\n  lower bound %.6f s -> %.6f s (%.3fx), bytes kept in place %lld -> %lld, "
               "%d orders evaluated\n",
               p->place.lower_bound_s, p->place.suggested_lower_bound_s,
               p->place.suggested_lower_bound_s > 0
                   ? p->place.lower_bound_s / p->place.suggested_lower_bound_s
                   : 1.0,
               (long long)p->place.bytes_local, (long long)p->place.bytes_local_suggested,
               p->place.evaluations);
        if (p->place.bytes_local_suggested > p->place.bytes_local)
            printf("  (the suggested relabeling lets devices keep blocks they already hold)\n");
    }
    double busy = 0;
    for (int n = 0; n < p->sim.nnics; n++)
        if (p->sim.nic_recv_busy_s[n] > busy)
            busy = p->sim.nic_recv_busy_s[n];
    printf("busiest NIC recv:  %.6f s\n", busy);
    if (o->trace)
        printf("trace:             %s\n", o->trace);
}

static void json_devs(FILE *f, const int *d, int n)
{
    fprintf(f, "[");
    for (int i = 0; i < n; i++)
        fprintf(f, "%s%d", i ? "," : "", d[i]);
    fprintf(f, "]");
}

static void json_result(FILE *f, const xm_schedule_t *s)
{
    fprintf(f,
            "\"scheduler\":\"%s\",\"lower_bound_s\":%.9g,\"makespan_s\":%.9g,\"plan_ms\":%.6g,"
            "\"ratio\":%.6g",
            xmesh_scheduler_name(s->scheduler), s->lower_bound_s, s->makespan_s, s->plan_s * 1e3,
            s->lower_bound_s > 0 ? s->makespan_s / s->lower_bound_s : 1.0);
}

static void print_json(const opts_t *o, const problem_t *pb, const plan_t *p)
{
    const xm_taskset_t *ts = &p->ts;
    const xm_schedule_t *s = &p->sched[p->main_res];
    char a[64];
    printf("{\"shape\":[");
    for (int d = 0; d < pb->ndim; d++)
        printf("%s%lld", d ? "," : "", (long long)pb->shape[d]);
    printf("],\"dtype\":\"%s\",", pb->dtype);
    fmt_mesh(a, sizeof a, pb->src_ndim, pb->src_shape);
    printf("\"src_mesh\":\"%s\",\"src_spec\":\"%s\",", a, pb->src_spec);
    fmt_mesh(a, sizeof a, pb->dst_ndim, pb->dst_shape);
    printf("\"dst_mesh\":\"%s\",\"dst_spec\":\"%s\",\"overlap\":%s,", a, pb->dst_spec,
           o->overlap ? "true" : "false");
    printf("\"cluster\":{\"hosts\":%d,\"devices\":%d,\"nics_per_host\":%d,\"nic_gbps\":%g,"
           "\"intra_gbps\":%g,\"latency_us\":%g,\"chunk_bytes\":%lld,\"cluster_file\":\"%s\"},",
           p->hm.nhosts, p->hm.ndev, o->nics_per_host, o->nic_gbps, o->intra_gbps, o->latency_us,
           (long long)o->chunk_bytes, o->cluster_file);
    printf("\"strategy\":\"%s\",\"seed\":%llu,\"split\":%s,\"split_used\":%s,",
           xmesh_strategy_name(o->strategy), (unsigned long long)o->seed,
           o->split ? "true" : "false", p->split_used ? "true" : "false");
    printf("\"decompose_ms\":%.6g,\"decompose_cpu_ms\":%.6g,\"plan_cpu_ms\":%.6g,", p->decompose_ms,
           p->decompose_cpu_ms, p->plan_cpu_ms);
    printf("\"unit_tasks\":%d,\"bytes_total\":%lld,\"bytes_cross_host\":%lld,", ts->ntasks,
           (long long)ts->bytes_total, (long long)ts->bytes_cross_host);
    json_result(stdout, s);
    if (p->suggested) {
        int nd = 1;
        for (int ax = 0; ax < pb->dst_ndim; ax++)
            nd *= pb->dst_shape[ax];
        printf(",\"suggested_order\":[");
        for (int i = 0; i < nd; i++)
            printf("%s%d", i ? "," : "", p->suggested[i]);
        printf("],\"suggested_lower_bound_s\":%.9g,\"given_order_lower_bound_s\":%.9g,"
               "\"bytes_local\":%lld,\"bytes_local_suggested\":%lld",
               p->place.suggested_lower_bound_s, p->place.lower_bound_s,
               (long long)p->place.bytes_local, (long long)p->place.bytes_local_suggested);
    }
    printf(",\"results\":[");
    for (int i = 0; i < p->nres; i++) {
        printf("%s{", i ? "," : "");
        json_result(stdout, &p->sched[i]);
        printf("}");
    }
    printf("],\"nic_busy\":[");
    for (int n = 0; n < p->sim.nnics; n++)
        printf("%s{\"host\":%d,\"nic\":%d,\"send_s\":%.9g,\"recv_s\":%.9g}", n ? "," : "",
               n / o->nics_per_host, n % o->nics_per_host, p->sim.nic_send_busy_s[n],
               p->sim.nic_recv_busy_s[n]);
    int lim = list_limit(o, ts->ntasks, 1);
    printf("],\"tasks_listed\":%d,\"tasks\":[", lim);
    for (int t = 0; t < lim; t++) {
        const xm_task_t *k = &ts->tasks[t];
        printf("%s\n{\"id\":%d,\"lo\":[", t ? "," : "", t);
        for (int d = 0; d < ts->ndim; d++)
            printf("%s%lld", d ? "," : "", (long long)k->box.lo[d]);
        printf("],\"hi\":[");
        for (int d = 0; d < ts->ndim; d++)
            printf("%s%lld", d ? "," : "", (long long)k->box.hi[d]);
        printf("],\"bytes\":%lld,\"holders\":[", (long long)k->bytes);
        for (int g = 0; g < k->ngroups; g++) {
            printf("%s", g ? "," : "");
            json_devs(stdout, ts->holders + k->holder_off + g * k->group_size, k->group_size);
        }
        printf("],\"holder_hosts\":[");
        for (int g = 0; g < k->ngroups; g++) {
            printf("%s[", g ? "," : "");
            for (int j = 0; j < k->group_size; j++)
                printf("%s%d", j ? "," : "",
                       p->hm.host_of[ts->holders[k->holder_off + g * k->group_size + j]]);
            printf("]");
        }
        printf("],\"receivers\":");
        json_devs(stdout, ts->recvs + k->recv_off, k->nrecv);
        printf(",\"receiver_hosts\":[");
        for (int j = 0; j < k->nrecv; j++)
            printf("%s%d", j ? "," : "", p->hm.host_of[ts->recvs[k->recv_off + j]]);
        printf("],\"sender\":");
        json_devs(stdout, s->sender + (size_t)t * s->max_groups, k->ngroups);
        printf(",\"routes\":[");
        for (int q = s->task_route_off[t]; q < s->task_route_off[t + 1]; q++) {
            printf("%s{\"nsrc\":%d,\"devs\":", q > s->task_route_off[t] ? "," : "",
                   s->routes[q].nsrc);
            json_devs(stdout, s->route_devs + s->routes[q].off, s->routes[q].len);
            printf("}");
        }
        printf("],\"start_s\":%.9g,\"end_s\":%.9g}", p->sim.task_start_s[t], p->sim.task_end_s[t]);
    }
    printf("],\"order\":");
    json_devs(stdout, s->order, s->ntasks);
    printf("}\n");
}

/* One line (or JSON object) per Table 2 case. */
static int all_cases(const opts_t *o)
{
    if (o->json)
        printf("{\"cases\":[");
    else
        printf("%4s  %-17s %-5s %-5s %-6s %-6s %6s %10s %10s  %-9s %10s %7s %9s\n", "case", "shape",
               "src", "dst", "sspec", "dspec", "tasks", "cross_MiB", "bound_s", "scheduler",
               "makespan_s", "ratio", "plan_ms");
    for (int c = 0; c < NCASES; c++) {
        problem_t pb;
        memset(&pb, 0, sizeof pb);
        set_case(&pb, c);
        plan_t p;
        int rc = plan_run(o, &pb, &p);
        if (rc) {
            plan_free(&p);
            return rc;
        }
        char a[64], b[16], d[16];
        fmt_shape(a, sizeof a, pb.ndim, pb.shape);
        fmt_mesh(b, sizeof b, pb.src_ndim, pb.src_shape);
        fmt_mesh(d, sizeof d, pb.dst_ndim, pb.dst_shape);
        if (o->json) {
            printf("%s\n{\"case\":%d,\"shape\":\"%s\",\"src_mesh\":\"%s\",\"dst_mesh\":\"%s\","
                   "\"src_spec\":\"%s\",\"dst_spec\":\"%s\",\"unit_tasks\":%d,\"bytes_total\":"
                   "%lld,\"bytes_cross_host\":%lld,",
                   c ? "," : "", c + 1, a, b, d, pb.src_spec, pb.dst_spec, p.ts.ntasks,
                   (long long)p.ts.bytes_total, (long long)p.ts.bytes_cross_host);
            json_result(stdout, &p.sched[p.main_res]);
            printf(",\"results\":[");
            for (int i = 0; i < p.nres; i++) {
                printf("%s{", i ? "," : "");
                json_result(stdout, &p.sched[i]);
                printf("}");
            }
            printf("]}");
        } else {
            for (int i = 0; i < p.nres; i++) {
                const xm_schedule_t *s = &p.sched[i];
                if (i == 0)
                    printf("%4d  %-17s %-5s %-5s %-6s %-6s %6d %10.1f %10.6f  ", c + 1, a, b, d,
                           pb.src_spec, pb.dst_spec, p.ts.ntasks,
                           (double)p.ts.bytes_cross_host / 1048576.0, s->lower_bound_s);
                else
                    printf("%*s", 83, "");
                printf("%-9s %10.6f %7.3f %9.3f\n", xmesh_scheduler_name(s->scheduler),
                       s->makespan_s, s->lower_bound_s > 0 ? s->makespan_s / s->lower_bound_s : 1,
                       s->plan_s * 1e3);
            }
        }
        plan_free(&p);
    }
    if (o->json)
        printf("\n]}\n");
    return 0;
}

/* ------------------------------------------------------------ --many */

typedef struct {
    int n, cap;
    xm_layout_t *src, *dst;
    xmesh_dtype_t *sdt, *ddt;
    int *line; /* line number in the file */
} many_t;

static void many_free(many_t *m)
{
    free(m->src);
    free(m->dst);
    free(m->sdt);
    free(m->ddt);
    free(m->line);
    memset(m, 0, sizeof *m);
}

/* One line "SHAPE DTYPE SRC-MESH SRC-SPEC DST-MESH DST-SPEC [DST-DTYPE]"
 * into tensor m->n (meshes' devices set later). 0 or 2 (message printed). */
static int many_line(const char *file, int ln, char *text, many_t *m)
{
    char *tok[8], *save = NULL;
    int nt = 0;
    for (char *t = strtok_r(text, " \t\r\n", &save); t && nt < 8;
         t = strtok_r(NULL, " \t\r\n", &save))
        tok[nt++] = t;
    if (nt != 6 && nt != 7)
        return bad("--many %s line %d: %d fields, expected SHAPE DTYPE SRC-MESH SRC-SPEC DST-MESH "
                   "DST-SPEC [DST-DTYPE]",
                   file, ln, nt);
    if (m->n == m->cap) {
        int c = m->cap ? 2 * m->cap : 64;
        xm_layout_t *s = realloc(m->src, sizeof *s * c),
                    *d = s ? realloc(m->dst, sizeof *d * c) : 0;
        if (s)
            m->src = s;
        if (d)
            m->dst = d;
        xmesh_dtype_t *a = realloc(m->sdt, sizeof *a * c);
        if (a)
            m->sdt = a;
        xmesh_dtype_t *b = realloc(m->ddt, sizeof *b * c);
        if (b)
            m->ddt = b;
        int *l = realloc(m->line, sizeof *l * c);
        if (l)
            m->line = l;
        if (!s || !d || !a || !b || !l) {
            fprintf(stderr, "xmesh-plan: out of memory\n");
            return 1;
        }
        m->cap = c;
    }
    int k = m->n, rc, nd = 0;
    int64_t shape[XM_MAX_DIMS];
    if (strcmp(tok[0], "-") && (rc = parse_shape(tok[0], &nd, shape)))
        return bad("--many %s line %d: shape '%s'", file, ln, tok[0]);
    if (xmesh_dtype_parse(tok[1], &m->sdt[k]))
        return bad("--many %s line %d: dtype '%s': %s", file, ln, tok[1], xmesh_last_error());
    m->ddt[k] = m->sdt[k];
    if (nt == 7 && xmesh_dtype_parse(tok[6], &m->ddt[k]))
        return bad("--many %s line %d: dtype '%s': %s", file, ln, tok[6], xmesh_last_error());
    if (!xm_dtype_pair_ok(m->sdt[k], m->ddt[k]))
        return bad("--many %s line %d: no conversion from %s to %s (f16, bf16, f32 only)", file, ln,
                   tok[1], tok[6]);
    for (int s = 0; s < 2; s++) {
        xm_layout_t *l = s ? &m->dst[k] : &m->src[k];
        memset(l, 0, sizeof *l);
        l->ndim = nd;
        memcpy(l->shape, shape, sizeof(int64_t) * nd);
        l->elem_size = xmesh_dtype_size(s ? m->ddt[k] : m->sdt[k]);
        const char *mesh = tok[s ? 4 : 2], *spec = tok[s ? 5 : 3];
        if ((rc = parse_mesh(s ? "--many dst mesh" : "--many src mesh", mesh, &l->mesh.ndim,
                             l->mesh.shape)))
            return bad("--many %s line %d: mesh '%s'", file, ln, mesh);
        l->mesh.ndev = 1;
        for (int a = 0; a < l->mesh.ndim; a++)
            l->mesh.ndev *= l->mesh.shape[a];
        if (xm_spec_parse(spec, nd, l->mesh.ndim, &l->spec))
            return bad("--many %s line %d: spec '%s': %s", file, ln, spec, xmesh_last_error());
    }
    m->line[k] = ln;
    m->n++;
    return 0;
}

static int many_read(const char *file, many_t *m)
{
    memset(m, 0, sizeof *m);
    FILE *f = strcmp(file, "-") ? fopen(file, "r") : stdin;
    if (!f)
        return bad("--many: cannot open '%s': %s", file, strerror(errno));
    char buf[1024];
    int ln = 0, rc = 0;
    while (!rc && fgets(buf, sizeof buf, f)) {
        ln++;
        char *h = strchr(buf, '#');
        if (h)
            *h = 0;
        char *p = buf;
        while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')
            p++;
        if (*p)
            rc = many_line(file, ln, p, m);
    }
    if (f != stdin)
        fclose(f);
    if (!rc && m->n == 0)
        rc = bad("--many %s: no layout pairs", file);
    return rc;
}

static void many_json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++)
        fprintf(f, *s == '"' || *s == '\\' ? "\\%c" : "%c", *s);
    fputc('"', f);
}

/* The plan of the whole, as plan creation makes it (lib/plan/api.c): the
 * union decomposition with packing, one schedule (task splitting as
 * XMESH_SPLIT), its lower bound and simulated makespan; and the model time
 * of one plan per tensor, one after another. */
static int many_run(const opts_t *o)
{
    many_t m;
    int rc = many_read(o->many, &m);
    if (rc) {
        many_free(&m);
        return rc;
    }
    xm_hostmap_t hm;
    int *sdevs = NULL, *ddevs = NULL, *key = NULL;
    xm_taskset_t ts;
    xm_cluster_t cl;
    xm_schedule_t sc;
    memset(&ts, 0, sizeof ts);
    memset(&cl, 0, sizeof cl);
    memset(&sc, 0, sizeof sc);
    if (xm_hostmap_default(m.src[0].mesh.shape, m.src[0].mesh.ndim, m.dst[0].mesh.shape,
                           m.dst[0].mesh.ndim, o->overlap, &hm, &sdevs, &ddevs)) {
        fprintf(stderr, "xmesh-plan: %s\n", xmesh_last_error());
        many_free(&m);
        return 1;
    }
    for (int k = 0; k < m.n && !rc; k++) {
        if (m.src[k].mesh.ndev > m.src[0].mesh.ndev || m.dst[k].mesh.ndev > m.dst[0].mesh.ndev)
            rc = bad("--many %s line %d: a mesh has more devices than the first line's", o->many,
                     m.line[k]);
        m.src[k].mesh.devs = sdevs;
        m.dst[k].mesh.devs = ddevs;
    }
    key = malloc(sizeof(int) * m.n);
    if (!rc && !key) {
        fprintf(stderr, "xmesh-plan: out of memory\n");
        rc = 1;
    }
    for (int k = 0; !rc && k < m.n; k++)
        key[k] = (int)m.sdt[k] * XMESH_DTYPE_COUNT_ + (int)m.ddt[k];
    if (!rc && xm_cluster_init(&cl, &hm)) {
        fprintf(stderr, "xmesh-plan: %s\n", xmesh_last_error());
        rc = 1;
    }
    cl.nics_per_host = o->nics_per_host;
    cl.nic_send_Bps = o->nic_gbps * 1e9 / 8;
    cl.nic_recv_Bps = o->nic_recv_gbps * 1e9 / 8;
    cl.intra_Bps = o->intra_gbps * 1e9 / 8;
    cl.latency_s = o->latency_us * 1e-6;
    cl.chunk_bytes = o->chunk_bytes;
    int64_t pack_limit = xm_param_i64("XMESH_PACK_BYTES");
    int64_t pack_max = pack_limit > 0 && o->strategy != XMESH_STRATEGY_SENDRECV_ALLGATHER &&
                               o->strategy != XMESH_STRATEGY_GLOBAL_ALLGATHER
                           ? o->chunk_bytes
                           : 0;
    xm_sched_opts_t so =
        sched_opts(o, o->scheduler == ALL_SCHEDULERS ? XMESH_SCHEDULER_ENSEMBLE
                                                     : (xmesh_scheduler_t)o->scheduler);
    int split = o->split || xm_param_i64("XMESH_SPLIT") != 0, used = 0, units = 0, packed = 0;
    double t0 = now_ms(CLOCK_MONOTONIC), t1 = t0, t2 = t0;
    if (!rc) {
        xmesh_result_t r =
            xm_decompose_many(m.n, m.src, m.dst, key, &hm, pack_max, pack_limit, &ts);
        t1 = now_ms(CLOCK_MONOTONIC);
        if (r)
            rc = r == XMESH_ERR_INVALID_ARGUMENT ? bad("%s", xmesh_last_error()) : 1;
        else if ((r = xm_schedule_plan(&ts, &cl, &so, split, &sc, &used)))
            rc = 1;
        t2 = now_ms(CLOCK_MONOTONIC);
        if (r && rc == 1)
            fprintf(stderr, "xmesh-plan: planning failed: %s\n", xmesh_last_error());
    }
    /* one plan per tensor, one after another (the same model) */
    double serial = 0;
    int serial_ok = 1;
    for (int k = 0; !rc && k < m.n; k++) {
        xm_taskset_t one;
        xm_schedule_t s1;
        if (xm_decompose_many(1, &m.src[k], &m.dst[k], NULL, &hm, 0, 0, &one)) {
            serial_ok = 0;
            break;
        }
        if (one.ntasks == 0) {
            xm_taskset_free(&one);
            continue;
        }
        if (xm_schedule_plan(&one, &cl, &so, split, &s1, NULL)) {
            xm_taskset_free(&one);
            serial_ok = 0;
            break;
        }
        serial += s1.makespan_s;
        xm_schedule_free(&s1);
        xm_taskset_free(&one);
    }
    /* The busiest NIC of the plan of many (simulated busy seconds per
     * direction) and the most bytes any NIC sends or receives. */
    xm_sim_result_t sim = {0};
    double send_busy = 0, recv_busy = 0, send_bytes = 0, recv_bytes = 0;
    int send_nic = -1, recv_nic = -1;
    if (!rc && ts.ntasks > 0) {
        if (xm_simulate(&ts, &cl, &sc, &sim, NULL)) {
            fprintf(stderr, "xmesh-plan: simulation failed: %s\n", xmesh_last_error());
            rc = 1;
        }
        for (int n = 0; !rc && n < sim.nnics; n++) {
            if (sim.nic_send_busy_s[n] > send_busy)
                send_busy = sim.nic_send_busy_s[n], send_nic = n;
            if (sim.nic_recv_busy_s[n] > recv_busy)
                recv_busy = sim.nic_recv_busy_s[n], recv_nic = n;
            if (sim.nic_send_bytes[n] > send_bytes)
                send_bytes = sim.nic_send_bytes[n];
            if (sim.nic_recv_bytes[n] > recv_bytes)
                recv_bytes = sim.nic_recv_bytes[n];
        }
    }
    if (!rc) {
        for (int t = 0; t < ts.ntasks; t++) {
            units += ts.tasks[t].npack ? ts.tasks[t].npack : 1;
            packed += ts.tasks[t].npack > 0;
        }
        double lb = sc.lower_bound_s, pr = sc.makespan_s;
        if (o->json) {
            printf("{\"many\": ");
            many_json_str(stdout, o->many);
            printf(", \"tensors\": %d, \"unit_tasks\": %d, \"scheduled_tasks\": %d, "
                   "\"packed_tasks\": %d, \"pieces\": %d, \"bytes_total\": %lld, "
                   "\"bytes_cross_host\": %lld, \"lower_bound_s\": %.9g, \"predicted_s\": "
                   "%.9g, \"ratio\": %.6g, \"per_tensor_serial_s\": %.9g, \"split\": %d, "
                   "\"scheduler\": \"%s\", \"strategy\": \"%s\", \"chunk_bytes\": %lld, "
                   "\"pack_bytes\": %lld, \"decompose_ms\": %.3f, \"plan_ms\": %.3f, "
                   "\"nics\": %d, \"busiest_send_nic\": %d, \"busiest_send_s\": %.9g, "
                   "\"most_send_bytes\": %.6g, \"busiest_recv_nic\": %d, "
                   "\"busiest_recv_s\": %.9g, \"most_recv_bytes\": %.6g}\n",
                   m.n, units, ts.ntasks, packed, ts.npieces, (long long)ts.bytes_total,
                   (long long)ts.bytes_cross_host, lb, pr, lb > 0 ? pr / lb : 1.0,
                   serial_ok ? serial : -1.0, used, xmesh_scheduler_name(so.kind),
                   xmesh_strategy_name(o->strategy), (long long)o->chunk_bytes,
                   (long long)pack_limit, t1 - t0, t2 - t0, sim.nnics, send_nic, send_busy,
                   send_bytes, recv_nic, recv_busy, recv_bytes);
        } else {
            char b1[32], b2[32];
            printf("plan of %d tensors from %s (%s, %s)\n", m.n, o->many,
                   xmesh_scheduler_name(so.kind), xmesh_strategy_name(o->strategy));
            printf("  unit tasks          %d (%d scheduled: %d packed tasks carry %d pieces)%s\n",
                   units, ts.ntasks, packed, ts.npieces, used ? ", split" : "");
            printf("  bytes               %s total, %s across host NICs\n",
                   human_bytes((double)ts.bytes_total, b1, sizeof b1),
                   human_bytes((double)ts.bytes_cross_host, b2, sizeof b2));
            printf("  lower bound         %.6g s\n", lb);
            printf("  predicted           %.6g s (%.3fx the bound)\n", pr, lb > 0 ? pr / lb : 1.0);
            if (serial_ok)
                printf("  per-tensor plans    %.6g s one after another (%.2fx the plan of many)\n",
                       serial, pr > 0 ? serial / pr : 1.0);
            printf("  planning            %.2f ms (decompose %.2f ms)\n", t2 - t0, t1 - t0);
            if (sim.nnics > 0)
                printf("  busiest NIC         send %.6g s (NIC %d; most bytes sent by a NIC %s), "
                       "receive %.6g s (NIC %d; most received %s)\n",
                       send_busy, send_nic, human_bytes(send_bytes, b1, sizeof b1), recv_busy,
                       recv_nic, human_bytes(recv_bytes, b2, sizeof b2));
        }
    }
    xm_sim_result_free(&sim);
    xm_schedule_free(&sc);
    xm_taskset_free(&ts);
    xm_cluster_free(&cl);
    xm_hostmap_free(&hm);
    free(sdevs);
    free(ddevs);
    free(key);
    many_free(&m);
    return rc;
}

int main(int argc, char **argv)
{
    opts_t o;
    int rc = parse_args(argc, argv, &o);
    if (rc)
        return rc;
    if (o.many)
        return many_run(&o);
    if (o.all_cases)
        return all_cases(&o);
    plan_t p;
    rc = plan_run(&o, &o.pb, &p);
    if (!rc) {
        if (o.json)
            print_json(&o, &o.pb, &p);
        else
            print_text(&o, &o.pb, &p);
    }
    plan_free(&p);
    return rc;
}
