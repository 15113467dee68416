/*
 * xmesh-sched-bench: quality and speed of the schedulers (issue 3 item 6).
 *
 * For the paper's Table 2 cases and a seeded generated family of
 * reshardings (meshes up to 16 hosts x 8 devices, 3-D tensors, mixed GSPMD /
 * SBP specs including partial sums, up to 4096 unit tasks) it reports, per
 * scheduler:
 *   ratio   = simulated makespan / lower bound (1.000 = provably optimal);
 *   plan_ms = wall time of xm_schedule() (decision + routes + bound +
 *             makespan), median / min / max over --reps repetitions; the
 *             summaries add the planning thread's CPU time, which a loaded
 *             machine does not inflate (the budget is wall time, though);
 *   +split  = the faster of the ensemble on the unit tasks and on the pieces
 *             of xm_taskset_split(), divided by the bound of the unsplit
 *             instance (can be < 1: pieces beat the whole-task bound);
 *   plan    = xm_schedule_plan(), what plan creation runs: the ensemble,
 *             and the split task set when its plan is > 1 % faster (tried
 *             only above 1.02 x the bound), over the unsplit bound; its
 *             median plan time is in the JSON (plan_ms_median).
 * Targets (issue 3): ensemble ratio <= 1.05 on every Table 2 case and
 * median <= 1.10 over the family; plan <= 5 ms per Table 2 case and
 * <= 100 ms at 4096 unit tasks, at the default budget.
 *
 * It is a program, not a test: numbers depend on the machine (planning
 * time) and nothing here asserts them. Prints a table; --json FILE writes
 * every figure.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "xm_cases.h"
#include "xm_sched.h"

#define NK XMESH_SCHEDULER_COUNT_

static int g_nics = 1; /* --nics: NICs per host of the modelled cluster */

typedef struct {
    char name[160];
    int64_t shape[3];
    size_t elem;
    int sm[2], dm[2];
    char ss[48], ds[48];
} problem_t;

typedef struct {
    problem_t pb;
    int ntasks;
    int64_t cross;
    double lb;
    double ms[NK];
    int split_tasks;
    double ms_split, plan_split_med; /* ensemble on xm_taskset_split() pieces */
    int plan_tasks;
    double ms_plan, plan_plan_med; /* xm_schedule_plan (plan creation) */
    double plan_med[NK], plan_min[NK], plan_max[NK];
    double cpu_med[NK]; /* CPU time of the planning thread: robust to machine load */
} row_t;

/* Deep copy of a task set (xm_schedule_plan may replace its argument). */
static int taskset_copy(const xm_taskset_t *in, xm_taskset_t *out)
{
    int64_t nh = 0, nr = 0;
    for (int t = 0; t < in->ntasks; t++) {
        const xm_task_t *k = &in->tasks[t];
        int64_t h = k->holder_off + (int64_t)k->ngroups * k->group_size, r = k->recv_off + k->nrecv;
        nh = h > nh ? h : nh;
        nr = r > nr ? r : nr;
    }
    *out = *in;
    out->tasks = malloc(sizeof *in->tasks * (in->ntasks + 1));
    out->holders = malloc(sizeof(int) * (nh + 1));
    out->recvs = malloc(sizeof(int) * (nr + 1));
    if (!out->tasks || !out->holders || !out->recvs) {
        xm_taskset_free(out);
        return -1;
    }
    memcpy(out->tasks, in->tasks, sizeof *in->tasks * in->ntasks);
    memcpy(out->holders, in->holders, sizeof(int) * nh);
    memcpy(out->recvs, in->recvs, sizeof(int) * nr);
    return 0;
}

static int cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, n, sizeof *v, cmp_dbl);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

typedef struct {
    xm_hostmap_t hm;
    int *sd, *dd;
    xm_taskset_t ts;
    xm_cluster_t c;
} inst_t;

static void inst_free(inst_t *in)
{
    xm_cluster_free(&in->c);
    xm_taskset_free(&in->ts);
    xm_hostmap_free(&in->hm);
    free(in->sd);
    free(in->dd);
    memset(in, 0, sizeof *in);
}

/* 0 ok, -1 rejected (message in xmesh_last_error). */
static int inst_make(const problem_t *pb, inst_t *in)
{
    memset(in, 0, sizeof *in);
    if (xm_hostmap_default(pb->sm, 2, pb->dm, 2, 0, &in->hm, &in->sd, &in->dd))
        return -1;
    xm_layout_t L[2];
    memset(L, 0, sizeof L);
    for (int s = 0; s < 2; s++) {
        L[s].ndim = 3;
        memcpy(L[s].shape, pb->shape, sizeof pb->shape);
        L[s].elem_size = pb->elem;
        const int *m = s ? pb->dm : pb->sm;
        L[s].mesh.ndim = 2;
        L[s].mesh.shape[0] = m[0];
        L[s].mesh.shape[1] = m[1];
        L[s].mesh.ndev = m[0] * m[1];
        L[s].mesh.devs = s ? in->dd : in->sd;
        if (xm_spec_parse(s ? pb->ds : pb->ss, 3, 2, &L[s].spec))
            goto out_fail;
    }
    if (xm_decompose(&L[0], &L[1], &in->hm, &in->ts))
        goto out_fail;
    if (xm_cluster_init(&in->c, &in->hm))
        goto out_fail;
    in->c.nics_per_host = g_nics;
    return 0;
out_fail:
    inst_free(in);
    return -1;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double cpu_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int run_row(const problem_t *pb, int reps, int64_t budget_us, uint64_t seed, row_t *row)
{
    inst_t in;
    if (inst_make(pb, &in))
        return -1;
    memset(row, 0, sizeof *row);
    row->pb = *pb;
    row->ntasks = in.ts.ntasks;
    row->cross = in.ts.bytes_cross_host;
    double *t = malloc(sizeof(double) * reps), *cpu = malloc(sizeof(double) * reps);
    for (int k = 0; k < NK; k++) {
        for (int r = 0; r < reps; r++) {
            xm_sched_opts_t o;
            memset(&o, 0, sizeof o);
            o.kind = (xmesh_scheduler_t)k;
            o.budget_us = budget_us;
            o.seed = seed;
            o.strategy = XMESH_STRATEGY_BROADCAST;
            xm_schedule_t s;
            double t0 = now_s(), c0 = cpu_s();
            if (xm_schedule(&in.ts, &in.c, &o, &s)) {
                fprintf(stderr, "xmesh-sched-bench: %s: %s\n", pb->name, xmesh_last_error());
                free(t);
                free(cpu);
                inst_free(&in);
                return -1;
            }
            t[r] = (now_s() - t0) * 1e3;
            cpu[r] = (cpu_s() - c0) * 1e3;
            row->ms[k] = s.makespan_s;
            row->lb = s.lower_bound_s;
            xm_schedule_free(&s);
        }
        row->plan_min[k] = row->plan_max[k] = t[0];
        for (int r = 1; r < reps; r++) {
            if (t[r] < row->plan_min[k])
                row->plan_min[k] = t[r];
            if (t[r] > row->plan_max[k])
                row->plan_max[k] = t[r];
        }
        row->plan_med[k] = median(t, reps);
        row->cpu_med[k] = median(cpu, reps);
    }
    /* ensemble after task splitting; plan time includes the split */
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        xm_taskset_t sp;
        xm_schedule_t s;
        xm_sched_opts_t o;
        memset(&o, 0, sizeof o);
        o.kind = XMESH_SCHEDULER_ENSEMBLE;
        o.budget_us = budget_us;
        o.seed = seed;
        xm_schedule_t u;
        if (xm_taskset_split(&in.ts, &in.c, 4096, &sp, NULL) || xm_schedule(&sp, &in.c, &o, &s) ||
            xm_schedule(&in.ts, &in.c, &o, &u)) {
            fprintf(stderr, "xmesh-sched-bench: %s (split): %s\n", pb->name, xmesh_last_error());
            free(t);
            free(cpu);
            inst_free(&in);
            return -1;
        }
        t[r] = (now_s() - t0) * 1e3;
        /* keep the faster of the split and unsplit plans (xmesh-plan --split) */
        row->ms_split = s.makespan_s < u.makespan_s ? s.makespan_s : u.makespan_s;
        row->split_tasks = s.makespan_s < u.makespan_s ? sp.ntasks : in.ts.ntasks;
        xm_schedule_free(&s);
        xm_schedule_free(&u);
        xm_taskset_free(&sp);
    }
    row->plan_split_med = median(t, reps);
    /* plan creation's entry point (may split) */
    for (int r = 0; r < reps; r++) {
        xm_taskset_t cp;
        xm_schedule_t s;
        xm_sched_opts_t o;
        memset(&o, 0, sizeof o);
        o.kind = XMESH_SCHEDULER_ENSEMBLE;
        o.budget_us = budget_us;
        o.seed = seed;
        double t0 = now_s();
        if (taskset_copy(&in.ts, &cp)) {
            fprintf(stderr, "xmesh-sched-bench: %s (plan): %s\n", pb->name, xmesh_last_error());
            free(t);
            free(cpu);
            inst_free(&in);
            return -1;
        }
        if (xm_schedule_plan(&cp, &in.c, &o, 1, &s, NULL)) {
            fprintf(stderr, "xmesh-sched-bench: %s (plan): %s\n", pb->name, xmesh_last_error());
            xm_taskset_free(&cp);
            free(t);
            free(cpu);
            inst_free(&in);
            return -1;
        }
        t[r] = (now_s() - t0) * 1e3;
        row->ms_plan = s.makespan_s;
        row->plan_tasks = cp.ntasks;
        xm_schedule_free(&s);
        xm_taskset_free(&cp);
    }
    row->plan_plan_med = median(t, reps);
    free(t);
    free(cpu);
    inst_free(&in);
    return 0;
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int rnd(uint64_t *s, int lo, int hi)
{
    return lo + (int)(rng_next(s) % (uint64_t)(hi - lo + 1));
}

/* A random spec over a 2-D mesh for a 3-D tensor: each mesh axis splits a
 * random tensor dim, replicates, or (source only, sometimes) is partial. */
static void random_spec(uint64_t *s, int allow_p, char *buf, size_t n)
{
    int tgt[2]; /* -1 R, -2 P, else tensor dim */
    for (int a = 0; a < 2; a++) {
        int x = rnd(s, 0, 9);
        tgt[a] = x < 3 ? -1 : x < 9 || !allow_p ? rnd(s, 0, 2) : -2;
    }
    if (tgt[0] == -2 || tgt[1] == -2 || (tgt[0] == tgt[1] && tgt[0] >= 0 && rnd(s, 0, 1))) {
        /* SBP: one token per mesh axis (same dim twice = axis 0 major) */
        size_t k = 0;
        for (int a = 0; a < 2; a++) {
            if (tgt[a] >= 0)
                k += (size_t)snprintf(buf + k, n - k, "%sS(%d)", a ? "," : "", tgt[a]);
            else
                k += (size_t)snprintf(buf + k, n - k, "%s%s", a ? "," : "",
                                      tgt[a] == -1 ? "B" : "P");
        }
        return;
    }
    /* GSPMD: per tensor dim, R or S + axes (random major order) */
    size_t k = 0;
    int swap = rnd(s, 0, 1);
    for (int d = 0; d < 3; d++) {
        int ax[2], na = 0;
        for (int q = 0; q < 2; q++) {
            int a = swap ? 1 - q : q;
            if (tgt[a] == d)
                ax[na++] = a;
        }
        if (!na)
            k += (size_t)snprintf(buf + k, n - k, "R");
        else if (na == 1)
            k += (size_t)snprintf(buf + k, n - k, "S%d", ax[0]);
        else
            k += (size_t)snprintf(buf + k, n - k, "S%d%d", ax[0], ax[1]);
    }
}

static void random_problem(uint64_t *s, int i, problem_t *pb)
{
    static const int devs[] = {1, 2, 4, 8};
    static const int64_t sizes[] = {256, 384, 512, 768, 1024, 1536, 2048};
    memset(pb, 0, sizeof *pb);
    pb->sm[0] = rnd(s, 1, 16);
    pb->dm[0] = rnd(s, 1, 16);
    pb->sm[1] = devs[rnd(s, 0, 3)];
    pb->dm[1] = devs[rnd(s, 0, 3)];
    int64_t el;
    do {
        el = 1;
        for (int d = 0; d < 3; d++)
            el *= pb->shape[d] = sizes[rnd(s, 0, 6)];
    } while (el > ((int64_t)1 << 28));
    pb->elem = rnd(s, 0, 1) ? 2 : 4;
    random_spec(s, 1, pb->ss, sizeof pb->ss);
    random_spec(s, 0, pb->ds, sizeof pb->ds);
    snprintf(pb->name, sizeof pb->name, "gen%03d %dx%d %s -> %dx%d %s", i, pb->sm[0], pb->sm[1],
             pb->ss, pb->dm[0], pb->dm[1], pb->ds);
}

static void print_header(void)
{
    printf("%-44s %6s %10s", "instance", "tasks", "bound_s");
    for (int k = 0; k < NK; k++)
        printf(" %8s", xmesh_scheduler_name(k));
    printf(" %8s %8s", "+split", "plan");
    printf("  %s\n", "ensemble plan_ms med [min, max]");
}

static void print_row(const row_t *r)
{
    printf("%-44.44s %6d %10.6f", r->pb.name, r->ntasks, r->lb);
    for (int k = 0; k < NK; k++)
        printf(" %8.3f", r->lb > 0 ? r->ms[k] / r->lb : 1.0);
    printf(" %8.3f", r->lb > 0 ? r->ms_split / r->lb : 1.0);
    printf(" %8.3f", r->lb > 0 ? r->ms_plan / r->lb : 1.0);
    int e = XMESH_SCHEDULER_ENSEMBLE;
    printf("  %7.3f [%.3f, %.3f]\n", r->plan_med[e], r->plan_min[e], r->plan_max[e]);
}

static void json_row(FILE *f, const row_t *r, int first)
{
    fprintf(f,
            "%s\n    {\"name\":\"%s\",\"shape\":[%lld,%lld,%lld],\"elem_size\":%zu,"
            "\"src_mesh\":[%d,%d],\"dst_mesh\":[%d,%d],\"src_spec\":\"%s\",\"dst_spec\":\"%s\","
            "\"unit_tasks\":%d,\"bytes_cross_host\":%lld,\"lower_bound_s\":%.9g,\"schedulers\":{",
            first ? "" : ",", r->pb.name, (long long)r->pb.shape[0], (long long)r->pb.shape[1],
            (long long)r->pb.shape[2], r->pb.elem, r->pb.sm[0], r->pb.sm[1], r->pb.dm[0],
            r->pb.dm[1], r->pb.ss, r->pb.ds, r->ntasks, (long long)r->cross, r->lb);
    for (int k = 0; k < NK; k++)
        fprintf(f,
                "%s\"%s\":{\"makespan_s\":%.9g,\"ratio\":%.6f,\"plan_ms_median\":%.4f,"
                "\"plan_ms_min\":%.4f,\"plan_ms_max\":%.4f}",
                k ? "," : "", xmesh_scheduler_name(k), r->ms[k], r->lb > 0 ? r->ms[k] / r->lb : 1.0,
                r->plan_med[k], r->plan_min[k], r->plan_max[k]);
    fprintf(f,
            ",\"ensemble_split\":{\"unit_tasks\":%d,\"makespan_s\":%.9g,\"ratio\":%.6f,"
            "\"plan_ms_median\":%.4f}",
            r->split_tasks, r->ms_split, r->lb > 0 ? r->ms_split / r->lb : 1.0, r->plan_split_med);
    fprintf(f,
            ",\"plan\":{\"unit_tasks\":%d,\"makespan_s\":%.9g,\"ratio\":%.6f,"
            "\"plan_ms_median\":%.4f}}}",
            r->plan_tasks, r->ms_plan, r->lb > 0 ? r->ms_plan / r->lb : 1.0, r->plan_plan_med);
}

static void summary(const char *title, row_t *rows, int n, FILE *jf, const char *key)
{
    double *v = malloc(sizeof(double) * (n ? n : 1));
    printf("\n%s (%d instances): ratio makespan / lower bound, and ensemble plan time\n", title, n);
    printf("  %-10s %8s %8s %8s %8s\n", "scheduler", "median", "min", "max", "<=1.05");
    if (jf)
        fprintf(jf, ",\n  \"%s\":{", key);
    for (int k = 0; k < NK; k++) {
        int within = 0;
        for (int i = 0; i < n; i++) {
            v[i] = rows[i].lb > 0 ? rows[i].ms[k] / rows[i].lb : 1.0;
            within += v[i] <= 1.05;
        }
        double med = median(v, n);
        printf("  %-10s %8.4f %8.4f %8.4f %5d/%d\n", xmesh_scheduler_name(k), med, v[0], v[n - 1],
               within, n);
        if (jf)
            fprintf(jf, "%s\"%s\":{\"ratio_median\":%.6f,\"ratio_min\":%.6f,\"ratio_max\":%.6f}",
                    k ? "," : "", xmesh_scheduler_name(k), med, v[0], v[n - 1]);
    }
    {
        int within = 0;
        for (int i = 0; i < n; i++) {
            v[i] = rows[i].lb > 0 ? rows[i].ms_split / rows[i].lb : 1.0;
            within += v[i] <= 1.05;
        }
        double med = median(v, n);
        printf("  %-10s %8.4f %8.4f %8.4f %5d/%d   (faster of ensemble with / without "
               "xm_taskset_split)\n",
               "+split", med, v[0], v[n - 1], within, n);
        if (jf)
            fprintf(jf,
                    ",\"ensemble_split\":{\"ratio_median\":%.6f,\"ratio_min\":%.6f,"
                    "\"ratio_max\":%.6f}",
                    med, v[0], v[n - 1]);
    }
    {
        int within = 0;
        for (int i = 0; i < n; i++) {
            v[i] = rows[i].lb > 0 ? rows[i].ms_plan / rows[i].lb : 1.0;
            within += v[i] <= 1.05;
        }
        double med = median(v, n);
        printf("  %-10s %8.4f %8.4f %8.4f %5d/%d   (xm_schedule_plan: what plan creation "
               "runs)\n",
               "plan", med, v[0], v[n - 1], within, n);
        if (jf)
            fprintf(jf, ",\"plan\":{\"ratio_median\":%.6f,\"ratio_min\":%.6f,\"ratio_max\":%.6f}",
                    med, v[0], v[n - 1]);
    }
    int e = XMESH_SCHEDULER_ENSEMBLE;
    for (int i = 0; i < n; i++)
        v[i] = rows[i].plan_med[e];
    double med = median(v, n);
    printf("  ensemble plan_ms (wall): median %.3f, min %.3f, max %.3f\n", med, v[0], v[n - 1]);
    if (jf)
        fprintf(jf, ",\"ensemble_plan_ms\":{\"median\":%.4f,\"min\":%.4f,\"max\":%.4f}", med, v[0],
                v[n - 1]);
    for (int i = 0; i < n; i++)
        v[i] = rows[i].cpu_med[e];
    med = median(v, n);
    printf("  ensemble plan_ms (cpu):  median %.3f, min %.3f, max %.3f\n", med, v[0], v[n - 1]);
    if (jf)
        fprintf(jf, ",\"ensemble_plan_cpu_ms\":{\"median\":%.4f,\"min\":%.4f,\"max\":%.4f}}", med,
                v[0], v[n - 1]);
    free(v);
}

static void usage(void)
{
    printf("usage: xmesh-sched-bench [--reps N] [--family N] [--seed S] [--budget-ms MS]\n"
           "                         [--json FILE] [--quiet]\n"
           "  --reps N       planning repetitions per Table 2 case and scheduler (default 11;\n"
           "                 the family and the 4096-task case use max(N / 4, min(N, 3)))\n"
           "  --family N     generated instances (default 60)\n"
           "  --seed S       seed of the family and of the schedulers (default 1)\n"
           "  --budget-ms MS scheduler budget (default: the library default, 20 ms)\n"
           "  --nics N       NICs per host of the modelled cluster (default 1)\n"
           "  --json FILE    write all figures as JSON\n"
           "  --quiet        no per-instance lines for the family\n");
}

int main(int argc, char **argv)
{
    int reps = 11, nfam = 60, quiet = 0;
    uint64_t seed = 1;
    int64_t budget_us = 0;
    const char *json = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (!strcmp(a, "--help")) {
            usage();
            return 0;
        } else if (!strcmp(a, "--quiet")) {
            quiet = 1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "xmesh-sched-bench: %s needs a value\n", a);
            return 2;
        }
        i++;
        errno = 0;
        if (!strcmp(a, "--reps"))
            reps = (int)strtol(v, &end, 10);
        else if (!strcmp(a, "--family"))
            nfam = (int)strtol(v, &end, 10);
        else if (!strcmp(a, "--seed"))
            seed = strtoull(v, &end, 10);
        else if (!strcmp(a, "--nics"))
            g_nics = (int)strtol(v, &end, 10);
        else if (!strcmp(a, "--budget-ms"))
            budget_us = (int64_t)(strtod(v, &end) * 1000);
        else if (!strcmp(a, "--json"))
            json = v, end = (char *)v + strlen(v);
        else {
            fprintf(stderr, "xmesh-sched-bench: unknown option '%s'\n", a);
            return 2;
        }
        if (!end || *end || errno || reps < 1 || nfam < 0 || budget_us < 0 || g_nics < 1) {
            fprintf(stderr, "xmesh-sched-bench: bad value '%s' for %s\n", v, a);
            return 2;
        }
    }
    FILE *jf = NULL;
    if (json && !(jf = fopen(json, "w"))) {
        fprintf(stderr, "xmesh-sched-bench: cannot write '%s': %s\n", json, strerror(errno));
        return 1;
    }
    printf("xmesh-sched-bench: cluster model = paper defaults (10 Gb/s NIC, %d NIC(s)/host, "
           "100 GB/s intra, 5 us, 1 MiB chunks)\n",
           g_nics);
    printf("budget %s, seed %llu, reps %d; columns per scheduler = simulated makespan / lower "
           "bound\n\n",
           budget_us ? "set" : "default (20 ms)", (unsigned long long)seed, reps);
    if (jf)
        fprintf(
            jf,
            "{\"seed\":%llu,\"reps\":%d,\"budget_us\":%lld,\"nics_per_host\":%d,\n  \"table2\":[",
            (unsigned long long)seed, reps, (long long)budget_us, g_nics);

    int nt2 = XM_TABLE2_NCASES;
    row_t *t2 = calloc(nt2, sizeof *t2);
    printf("Paper Table 2 (tensor (1024,1024,512) int32 unless noted)\n");
    print_header();
    for (int c = 0; c < nt2; c++) {
        problem_t pb;
        memset(&pb, 0, sizeof pb);
        memcpy(pb.shape, xm_table2[c].shape, sizeof pb.shape);
        pb.elem = 4;
        memcpy(pb.sm, xm_table2[c].src, sizeof pb.sm);
        memcpy(pb.dm, xm_table2[c].dst, sizeof pb.dm);
        snprintf(pb.ss, sizeof pb.ss, "%s", xm_table2[c].ss);
        snprintf(pb.ds, sizeof pb.ds, "%s", xm_table2[c].ds);
        snprintf(pb.name, sizeof pb.name, "case %d %dx%d %s -> %dx%d %s", c + 1, pb.sm[0], pb.sm[1],
                 pb.ss, pb.dm[0], pb.dm[1], pb.ds);
        if (run_row(&pb, reps, budget_us, seed, &t2[c]))
            return 1;
        print_row(&t2[c]);
        if (jf)
            json_row(jf, &t2[c], c == 0);
    }
    if (jf)
        fprintf(jf, "]");
    summary("Table 2", t2, nt2, jf, "table2_summary");

    /* The largest case of the issue: 4096 unit tasks. */
    int freps = reps / 4 > 3 ? reps / 4 : reps < 3 ? reps : 3;
    problem_t big;
    memset(&big, 0, sizeof big);
    int64_t bshape[3] = {1024, 1024, 512};
    memcpy(big.shape, bshape, sizeof bshape);
    big.elem = 4;
    big.sm[0] = big.sm[1] = big.dm[0] = big.dm[1] = 8;
    snprintf(big.ss, sizeof big.ss, "RS01R");
    snprintf(big.ds, sizeof big.ds, "S01RR");
    snprintf(big.name, sizeof big.name, "big 8x8 RS01R -> 8x8 S01RR");
    row_t brow;
    if (run_row(&big, freps, budget_us, seed, &brow))
        return 1;
    printf("\nLargest case\n");
    print_header();
    print_row(&brow);
    if (jf) {
        fprintf(jf, ",\n  \"big\":[");
        json_row(jf, &brow, 1);
        fprintf(jf, "]");
    }

    /* Generated family. */
    row_t *fam = calloc(nfam ? nfam : 1, sizeof *fam);
    uint64_t rs = seed * 0x9e3779b97f4a7c15ull + 7;
    int nf = 0;
    if (!quiet) {
        printf("\nGenerated family (seed %llu)\n", (unsigned long long)seed);
        print_header();
    }
    for (int i = 0, tries = 0; nf < nfam && tries < 100 * (nfam + 1); tries++) {
        problem_t pb;
        random_problem(&rs, i, &pb);
        inst_t in;
        if (inst_make(&pb, &in))
            continue;
        int nt = in.ts.ntasks;
        int64_t cross = in.ts.bytes_cross_host;
        inst_free(&in);
        if (nt < 1 || nt > 4096 || cross == 0)
            continue;
        if (run_row(&pb, freps, budget_us, seed, &fam[nf]))
            continue;
        if (!quiet)
            print_row(&fam[nf]);
        nf++;
        i++;
    }
    if (jf) {
        fprintf(jf, ",\n  \"family\":[");
        for (int i = 0; i < nf; i++)
            json_row(jf, &fam[i], i == 0);
        fprintf(jf, "]");
    }
    if (nf > 0)
        summary("Generated family", fam, nf, jf, "family_summary");
    if (jf) {
        fprintf(jf, "\n}\n");
        fclose(jf);
        printf("\nJSON: %s\n", json);
    }
    free(t2);
    free(fam);
    return 0;
}
