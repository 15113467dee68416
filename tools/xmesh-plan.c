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

#include "plan.h"

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

static int parse_i64(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 0);
    if (!*s || *end || errno || v < lo || v > hi)
        return xpl_bad("bad value '%s' for %s: expected an integer in [%lld, %lld]", s, flag,
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
        return xpl_bad("bad value '%s' for %s: expected a number %s 0", s, flag,
                       allow_zero ? ">=" : ">");
    *out = v;
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
            return xpl_bad("--cluster: %s", xmesh_last_error());
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
            return xpl_bad("unexpected argument '%s'", a);
        if (i + 1 >= argc)
            return xpl_bad("option %s needs a value", a);
        const char *val = argv[++i];
        if (!strcmp(a, "--many")) {
            o->many = val;
        } else if (!strcmp(a, "--shape")) {
            if ((rc = xpl_parse_shape(val, &o->pb.ndim, o->pb.shape)))
                return rc;
            o->have_shape = 1;
        } else if (!strcmp(a, "--dtype")) {
            xmesh_dtype_t dt;
            if (xmesh_dtype_parse(val, &dt))
                return xpl_bad("bad value '%s' for --dtype: %s", val, xmesh_last_error());
            o->pb.dtype = val;
            o->have_dtype = 1;
        } else if (!strcmp(a, "--src-mesh")) {
            if ((rc = xpl_parse_mesh(a, val, &o->pb.src_ndim, o->pb.src_shape)))
                return rc;
            o->have_src_mesh = 1;
        } else if (!strcmp(a, "--dst-mesh")) {
            if ((rc = xpl_parse_mesh(a, val, &o->pb.dst_ndim, o->pb.dst_shape)))
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
                return xpl_bad("bad value '%s' for --scheduler: expected naive, lb, dfs, greedy, "
                               "ensemble or all",
                               val);
            else
                o->scheduler = k;
        } else if (!strcmp(a, "--strategy")) {
            if (xmesh_strategy_parse(val, &st))
                return xpl_bad("bad value '%s' for --strategy: %s", val, xmesh_last_error());
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
            return xpl_bad("unknown option '%s'", a);
        }
    }
    if (!(o->nic_gbps > 0) || !(o->intra_gbps > 0) || o->nics_per_host < 1 || o->chunk_bytes < 1 ||
        !(o->latency_us >= 0))
        return xpl_bad("bad cluster parameter from the environment (XMESH_NIC_GBPS=%g, "
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
            return xpl_bad("missing --shape (or --case N / --all-cases)");
        if (!o->have_src_mesh || !o->have_dst_mesh)
            return xpl_bad("missing --%s-mesh", o->have_src_mesh ? "dst" : "src");
        if (!o->have_src_spec || !o->have_dst_spec)
            return xpl_bad("missing --%s-spec", o->have_src_spec ? "dst" : "src");
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
        xpl_sched_opts(o, o->scheduler == ALL_SCHEDULERS ? XMESH_SCHEDULER_ENSEMBLE
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

/* Returns 0, 1 (planning error, message printed) or 2 (bad problem). */
static int plan_run(const opts_t *o, const problem_t *pb, plan_t *p)
{
    memset(p, 0, sizeof *p);
    xmesh_dtype_t dt;
    if (xmesh_dtype_parse(pb->dtype, &dt))
        return xpl_bad("bad value '%s' for --dtype", pb->dtype);
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
            return xpl_bad("bad value '%s' for --%s-spec: %s", spec, s ? "dst" : "src",
                           xmesh_last_error());
    }
    double t0 = xpl_now_ms(CLOCK_MONOTONIC), c0 = xpl_now_ms(CLOCK_THREAD_CPUTIME_ID);
    xmesh_result_t r = xm_decompose(&L[0], &L[1], &p->hm, &p->ts);
    p->decompose_ms = xpl_now_ms(CLOCK_MONOTONIC) - t0;
    p->decompose_cpu_ms = xpl_now_ms(CLOCK_THREAD_CPUTIME_ID) - c0;
    if (r == XMESH_ERR_INVALID_ARGUMENT)
        return xpl_bad("%s", xmesh_last_error());
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
        xm_sched_opts_t so = xpl_sched_opts(o, p->kinds[k]);
        double c1 = xpl_now_ms(CLOCK_THREAD_CPUTIME_ID);
        r = xm_schedule(&p->ts, &p->cl, &so, &p->sched[k]);
        if (k == p->main_res)
            p->plan_cpu_ms = xpl_now_ms(CLOCK_THREAD_CPUTIME_ID) - c1;
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
           xpl_human_bytes((double)ts->bytes_total, hb, sizeof hb));
    printf("bytes_cross_host:  %lld (%s)\n", (long long)ts->bytes_cross_host,
           xpl_human_bytes((double)ts->bytes_cross_host, hb, sizeof hb));
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
            if (s->route_rails) { /* rail of the hop after each device, -1: none */
                printf(",\"rails\":");
                json_devs(stdout, s->route_rails + s->routes[q].off, s->routes[q].len);
            }
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

int main(int argc, char **argv)
{
    opts_t o;
    int rc = parse_args(argc, argv, &o);
    if (rc)
        return rc;
    if (o.many)
        return xpl_many_run(&o);
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
