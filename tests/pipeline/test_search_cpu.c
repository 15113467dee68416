/*
 * pipeline.search.cpu (unit, one process): CPU sharing in the layout search's model (issue 21;
 * docs/SEARCH.md "CPU sharing").
 *  - the cluster file's [compute] cpuset records: parsed (ranges, lists), written and parsed
 *    back to the same sets, malformed ones refused naming the line and the field (a rank in two
 *    sets, wait outside 0..1, 0 cpus, a reversed range, a missing field), *out untouched;
 *  - xm_cost_cpu_share by hand: 4 ranks on 1 cpu, w 0.5, one other rank busy: 0.75; a set with
 *    a cpu per rank: 1; records for another rank count: not applied (0, factor 1); bad input;
 *  - xmp_search__sim_shared by hand: two one-rank stages on one cpu, GPipe M=1, compute only:
 *    the stages take turns (F0 F1 B1 B0: never both computing), so each runs on the whole cpu
 *    against 1/2 calibrated: factor 0.5, step 1.0 (2 without sharing); the waiting stage taking
 *    half a computing rank's share (wait 0.5): 1/1.5 of a cpu, factor 0.75, step 1.5; wait 1:
 *    factor 1; no records, off, a cpu per stage: the plain simulation;
 *  - each F and B action gets the factor of the contention over its own span (issue 40): two
 *    one-rank stages on one cpu, GPipe M=2 (f 0.3, b 0.7), played as processor sharing by
 *    hand: step 2.0, factor 0.75 per stage (1.5 s computing for 2.0 s of calibrated work);
 *    wait 0.5: 2.5, 0.875. One factor per stage gave 2.25 and 2.625; the simulator's
 *    per-action seconds (act_add) by hand: F -0.1, B +0.2 on f 0.3, b 0.7: step 1.1;
 *  - a stage in its optimizer step (O, element-wise compute) counts busy for the stages sharing
 *    its cpu, not waiting: GPipe M=1 with o 0.4 by hand, step 1.6 (1.4 when O was a wait);
 *  - the sync term (cpuset's fifth field): parsed, written, refused when negative; by hand,
 *    xm_cost_cpu_sync (sync x the probability another rank of the set computes) and one stage
 *    of two ranks on one cpu with 2 + 3 collectives per microbatch and sync 10 ms: the partner
 *    computes at the stage's compute fraction 1 / (1 + 5 p), so the penalty p per collective
 *    solves p = 0.01 / (1 + 5 p): p = (sqrt(1.2) - 1) / 10, step 1 + 5 p; without sync or
 *    with the records off, the plain step 1.0.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched/schedule.h"
#include "search/search_priv.h"
#include "test_report.h"
#include "xm_costmodel.h"

static int near(double a, double b, double tol)
{
    return fabs(a - b) <= tol * fmax(fabs(a), fabs(b)) + 1e-15;
}

static void test_parse(void)
{
    const char *ok = "[compute]\n"
                     "sgemm 4 4 4 2 0.001 x\n"
                     "cpuset 1 0-1,4-5 0.5\n"
                     "cpuset 2 2,3,6-7 0 0.00025\n";
    xm_costmodel_t *m = NULL;
    EXPECT(xm_costmodel_parse(ok, &m) == XMESH_SUCCESS && m, "%s", xmesh_last_error());
    if (!m)
        return;
    EXPECT(m->ncpusets == 2 && m->cpu_nranks == 8, "%d sets over %d ranks", m->ncpusets,
           m->cpu_nranks);
    static const int want_set[8] = {0, 0, 1, 1, 0, 0, 1, 1};
    for (int r = 0; r < 8 && m->cpu_nranks == 8; r++)
        EXPECT(m->cpu_set_of[r] == want_set[r], "rank %d in set %d", r, m->cpu_set_of[r]);
    EXPECT(m->cpusets[0].cpus == 1 && m->cpusets[0].nranks == 4 && m->cpusets[0].wait == 0.5 &&
               m->cpusets[0].line == 3,
           "set 0: %d cpus %d ranks wait %g line %d", m->cpusets[0].cpus, m->cpusets[0].nranks,
           m->cpusets[0].wait, m->cpusets[0].line);
    EXPECT(m->cpusets[1].cpus == 2 && m->cpusets[1].nranks == 4 && m->cpusets[1].wait == 0 &&
               m->cpusets[1].sync == 0.00025 && m->cpusets[0].sync == 0,
           "set 1: %d cpus %d ranks wait %g sync %g (set 0 sync %g)", m->cpusets[1].cpus,
           m->cpusets[1].nranks, m->cpusets[1].wait, m->cpusets[1].sync, m->cpusets[0].sync);
    /* round trip */
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    EXPECT(f && xm_costmodel_write(m, f) == XMESH_SUCCESS, "write: %s", xmesh_last_error());
    if (f)
        fclose(f);
    EXPECT(buf && strstr(buf, "cpuset 1 0-1,4-5 0.5 0\n") &&
               strstr(buf, "cpuset 2 2-3,6-7 0 0.00025\n"),
           "written:\n%s", buf ? buf : "(null)");
    xm_costmodel_t *m2 = NULL;
    EXPECT(buf && xm_costmodel_parse(buf, &m2) == XMESH_SUCCESS && m2, "%s", xmesh_last_error());
    if (m2) {
        EXPECT(m2->ncpusets == 2 && m2->cpu_nranks == 8, "%d %d", m2->ncpusets, m2->cpu_nranks);
        for (int r = 0; r < 8 && m2->cpu_nranks == 8; r++)
            EXPECT(m2->cpu_set_of[r] == want_set[r], "round trip: rank %d in set %d", r,
                   m2->cpu_set_of[r]);
        EXPECT(m2->ncpusets == 2 && m2->cpusets[1].sync == 0.00025, "round trip: sync %g",
               m2->ncpusets == 2 ? m2->cpusets[1].sync : -1);
        xm_costmodel_destroy(m2);
    }
    free(buf);
    xm_costmodel_destroy(m);

    static const struct {
        const char *text, *want;
    } bad[] = {
        {"[compute]\ncpuset 1 0-3 0\ncpuset 1 3-4 0\n",
         "rank 3 is already in the cpuset of line 2"},
        {"[compute]\ncpuset 1 0-3 1.5\n", "field wait"},
        {"[compute]\ncpuset 0 0-3 0\n", "field cpus"},
        {"[compute]\ncpuset 1 3-1 0\n", "range 3-1"},
        {"[compute]\ncpuset 1 0-3\n", "line 2"},
        {"[compute]\ncpuset 1 0,x 0\n", "field ranks"},
        {"[compute]\ncpuset 1 0,0 0\n", "rank 0 repeats"},
        {"[compute]\ncpuset 1 0-3 0 -0.001\n", "field sync: -0.001"},
        {"[compute]\ncpuset 1 0-3 0 x\n", "field sync: 'x'"},
        {"[compute]\ncpuset 1 0-3 0 0.1 7\n", "6 fields, expected 5"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        xm_costmodel_t *sentinel = (xm_costmodel_t *)&g_fail, *out = sentinel;
        xmesh_result_t r = xm_costmodel_parse(bad[i].text, &out);
        EXPECT(r == XMESH_ERR_INVALID_ARGUMENT && out == sentinel &&
                   strstr(xmesh_last_error(), bad[i].want),
               "case %zu: result %d, message '%s' (want '%s')", i, (int)r, xmesh_last_error(),
               bad[i].want);
    }
}

static void test_share(void)
{
    xm_costmodel_t *m = xm_costmodel_create();
    int a[4] = {0, 1, 2, 3}, b[2] = {4, 5};
    EXPECT(xm_costmodel_add_cpuset(m, 1, a, 4, 0.5) == XMESH_SUCCESS, "%s", xmesh_last_error());
    EXPECT(xm_costmodel_add_cpuset(m, 2, b, 2, 0) == XMESH_SUCCESS, "%s", xmesh_last_error());
    double busy[6] = {0, 1, 0, 0, 1, 0}, g = -1;
    /* rank 0: itself 1 + rank 1 busy 1 + ranks 2, 3 polling 0.5 each = 3 of 1 cpu:
     * 1/3 of a cpu against 1/4 calibrated */
    EXPECT(xm_cost_cpu_share(m, 6, busy, 0, &g) == 1 && near(g, 0.75, 1e-12), "rank 0: %g", g);
    busy[1] = 1, busy[2] = 1, busy[3] = 1;
    EXPECT(xm_cost_cpu_share(m, 6, busy, 0, &g) == 1 && near(g, 1, 1e-12), "all busy: %g", g);
    /* 2 ranks on 2 cpus: a cpu each, whatever the others do */
    EXPECT(xm_cost_cpu_share(m, 6, busy, 5, &g) == 1 && near(g, 1, 1e-12), "rank 5: %g", g);
    /* other rank counts: not applied */
    g = -1;
    EXPECT(xm_cost_cpu_share(m, 8, (double[8]){0}, 0, &g) == 0 && g == 1, "8 ranks: %g", g);
    g = -1;
    EXPECT(xm_cost_cpu_share(m, 6, (double[6]){0, 0, 0, 0, 0, 2}, 0, &g) == -1 && g == -1,
           "busy 2 accepted");
    EXPECT(xm_cost_cpu_share(m, 6, busy, 6, &g) == -1, "rank 6 of 6 accepted");
    /* a rank already in a set, wait out of range: refused, model unchanged */
    int c[1] = {5};
    EXPECT(xm_costmodel_add_cpuset(m, 1, c, 1, 0) == XMESH_ERR_INVALID_ARGUMENT && m->ncpusets == 2,
           "rank 5 twice");
    int d[1] = {6};
    EXPECT(xm_costmodel_add_cpuset(m, 1, d, 1, -0.1) == XMESH_ERR_INVALID_ARGUMENT &&
               m->ncpusets == 2 && m->cpu_nranks == 6,
           "wait -0.1");
    /* sync: rank 0's set {0..3} with 2 ms, ranks 1 and 2 computing half the time, rank 3 never:
     * 2 ms x (1 - 0.5 x 0.5) = 1.5 ms; its own entry is not read */
    EXPECT(xm_costmodel_set_cpuset_sync(m, 0, 0.002) == XMESH_SUCCESS, "%s", xmesh_last_error());
    double s = -1, bz[6] = {7, 0.5, 0.5, 0, 1, 1};
    EXPECT(xm_cost_cpu_sync(m, 6, bz, 0, &s) == 1 && near(s, 0.0015, 1e-12), "sync: %g", s);
    /* set 1 has none measured: 0 */
    bz[0] = 1;
    EXPECT(xm_cost_cpu_sync(m, 6, bz, 4, &s) == 1 && s == 0, "sync of set 1: %g", s);
    s = -1;
    EXPECT(xm_cost_cpu_sync(m, 8, (double[8]){0}, 0, &s) == 0 && s == 0, "8 ranks: %g", s);
    s = -1;
    EXPECT(xm_cost_cpu_sync(m, 6, (double[6]){0, 2, 0, 0, 0, 0}, 0, &s) == -1 && s == -1,
           "busy 2 accepted");
    EXPECT(xm_costmodel_set_cpuset_sync(m, 2, 0.1) == XMESH_ERR_INVALID_ARGUMENT &&
               xm_costmodel_set_cpuset_sync(m, 0, -1) == XMESH_ERR_INVALID_ARGUMENT &&
               m->cpusets[0].sync == 0.002,
           "bad sync accepted");
    xm_costmodel_destroy(m);
}

/* Two one-rank stages, GPipe, M = 1, compute only (f 0.3, b 0.7 per stage). */
static void sim_case(const xm_costmodel_t *cost, int off, double *factor, double *step)
{
    xmp_sedge_t edges[1];
    int ne = xmp_sched_chain_edges(2, edges);
    xmp_schedule_t *sch = NULL;
    char err[256];
    EXPECT(xmp_sched_generate(XMP_SCHED_GPIPE, 2, 1, ne, edges, NULL, &sch, err, sizeof err) == 0,
           "%s", err);
    if (!sch)
        return;
    double f[2] = {0.3, 0.3}, b[2] = {0.7, 0.7}, xfer[2] = {0, 0};
    xmp_sim_costs_t c = {.f = f, .b = b, .xfer = xfer};
    int rank0[2] = {0, 1}, nr[2] = {1, 1};
    xmp_sim_result_t res;
    memset(&res, 0, sizeof res);
    int r = xmp_search__sim_shared(sch, &c, 2, f, b, NULL, NULL, rank0, nr, 2, cost, off, factor,
                                   NULL, &res, err, sizeof err);
    EXPECT(r == 0, "simulation: %d %s", r, err);
    *step = res.step_s;
    xmp_sim_result_free(&res);
    xmp_sched_destroy(sch);
}

static void test_sim(void)
{
    double fac[2], step;
    int both[2] = {0, 1};
    /* no records: the plain simulation */
    xm_costmodel_t *none = xm_costmodel_create();
    sim_case(none, 0, fac, &step);
    EXPECT(fac[0] == 1 && fac[1] == 1 && near(step, 2.0, 1e-12), "no records: %g %g step %g",
           fac[0], fac[1], step);
    xm_costmodel_destroy(none);
    /* one cpu for both, waiting takes nothing: the stages take turns, each alone: 0.5 */
    xm_costmodel_t *m = xm_costmodel_create();
    EXPECT(xm_costmodel_add_cpuset(m, 1, both, 2, 0) == XMESH_SUCCESS, "%s", xmesh_last_error());
    sim_case(m, 0, fac, &step);
    EXPECT(near(fac[0], 0.5, 1e-4) && near(fac[1], 0.5, 1e-4) && near(step, 1.0, 1e-4),
           "shared: %g %g step %g (want 0.5 0.5 1.0)", fac[0], fac[1], step);
    /* the ablation: off */
    sim_case(m, 1, fac, &step);
    EXPECT(fac[0] == 1 && fac[1] == 1 && near(step, 2.0, 1e-12), "off: %g %g step %g", fac[0],
           fac[1], step);
    xm_costmodel_destroy(m);
    /* the waiting stage takes half a share: 1 / 1.5 of the cpu, 0.75 */
    m = xm_costmodel_create();
    EXPECT(xm_costmodel_add_cpuset(m, 1, both, 2, 0.5) == XMESH_SUCCESS, "%s", xmesh_last_error());
    sim_case(m, 0, fac, &step);
    EXPECT(near(fac[0], 0.75, 1e-4) && near(fac[1], 0.75, 1e-4) && near(step, 1.5, 1e-4),
           "wait 0.5: %g %g step %g (want 0.75 0.75 1.5)", fac[0], fac[1], step);
    xm_costmodel_destroy(m);
    /* pollers take a whole share: no gain */
    m = xm_costmodel_create();
    EXPECT(xm_costmodel_add_cpuset(m, 1, both, 2, 1) == XMESH_SUCCESS, "%s", xmesh_last_error());
    sim_case(m, 0, fac, &step);
    EXPECT(near(fac[0], 1, 1e-9) && near(step, 2.0, 1e-9), "wait 1: %g step %g", fac[0], step);
    xm_costmodel_destroy(m);
    /* a cpu per stage: no gain */
    m = xm_costmodel_create();
    EXPECT(xm_costmodel_add_cpuset(m, 1, &both[0], 1, 0) == XMESH_SUCCESS &&
               xm_costmodel_add_cpuset(m, 1, &both[1], 1, 0) == XMESH_SUCCESS,
           "%s", xmesh_last_error());
    sim_case(m, 0, fac, &step);
    EXPECT(near(fac[0], 1, 1e-9) && near(fac[1], 1, 1e-9) && near(step, 2.0, 1e-9),
           "own cpus: %g %g step %g", fac[0], fac[1], step);
    xm_costmodel_destroy(m);
}

/* The simulator's per-action seconds (xmp_sim_costs_t.act_add): one stage, GPipe M=1, f 0.3,
 * b 0.7; F gets -0.1 and B +0.2: step 0.2 + 0.9 = 1.1; F -0.5: taken as 0, step 0.9. */
static void test_act_add(void)
{
    xmp_sedge_t edges[1];
    int ne = xmp_sched_chain_edges(1, edges);
    xmp_schedule_t *sch = NULL;
    char err[256];
    EXPECT(xmp_sched_generate(XMP_SCHED_GPIPE, 1, 1, ne, edges, NULL, &sch, err, sizeof err) == 0,
           "%s", err);
    if (!sch)
        return;
    static const double addf[2] = {-0.1, -0.5}, want[2] = {1.1, 0.9};
    for (int k = 0; k < 2; k++) {
        double f[1] = {0.3}, b[1] = {0.7}, add[64] = {0};
        for (int i = 0; i < sch->len[0] && i < 64; i++)
            add[i] = sch->acts[0][i].kind == XMP_ACT_F   ? addf[k]
                     : sch->acts[0][i].kind == XMP_ACT_B ? 0.2
                                                         : 0;
        const double *rows[1] = {add};
        xmp_sim_costs_t c = {.f = f, .b = b, .act_add = rows};
        xmp_sim_result_t res;
        memset(&res, 0, sizeof res);
        EXPECT(xmp_sim_run(sch, &c, &res, err, sizeof err) == 0 && near(res.step_s, want[k], 1e-12),
               "act_add F %g B 0.2: step %g (want %g) %s", addf[k], res.step_s, want[k], err);
        xmp_sim_result_free(&res);
    }
    xmp_sched_destroy(sch);
}

/* Two one-rank stages, GPipe, M = 2, compute only (f 0.3, b 0.7 per stage), one cpu for both,
 * waiting rank takes `wait` of a computing rank's cpu; calibrated rate (every rank busy): 1/2
 * cpu. Played as processor sharing by hand, wait 0 (alone a stage gets the whole cpu: factor
 * 0.5; together 1/2: factor 1): s0 F0 alone 0.15; s0 F1 and s1 F0 together 0.3 (to 0.45); s1
 * F1 alone 0.15 (0.6), B1 alone 0.35 (0.95); s1 B0 and s0 B1 together 0.7 (1.65); s0 B0 alone
 * 0.35: step 2.0; each stage computes 0.15 + 0.3 + 0.7 + 0.35 = 1.5 s for 2.0 s of calibrated
 * work: factor 0.75. Wait 0.5 (alone 1.5 ranks: factor 0.75; together 2: 1): 0.225, 0.3,
 * 0.225, 0.525, 0.7, 0.525: step 2.5, each stage 1.75 s: factor 0.875. One factor per stage
 * (the mean-field model before: the same 0.75 and 0.875) gives step 3 x 0.75 = 2.25 and
 * 3 x 0.875 = 2.625: it also slows the lone fill and drain actions, the critical path. */
static void test_sim_per_action(void)
{
    static const double wait[2] = {0, 0.5}, want[2] = {0.75, 0.875}, step[2] = {2.0, 2.5};
    int both[2] = {0, 1};
    for (int w = 0; w < 2; w++) {
        xm_costmodel_t *m = xm_costmodel_create();
        EXPECT(xm_costmodel_add_cpuset(m, 1, both, 2, wait[w]) == XMESH_SUCCESS, "%s",
               xmesh_last_error());
        xmp_sedge_t edges[1];
        int ne = xmp_sched_chain_edges(2, edges);
        xmp_schedule_t *sch = NULL;
        char err[256];
        EXPECT(xmp_sched_generate(XMP_SCHED_GPIPE, 2, 2, ne, edges, NULL, &sch, err, sizeof err) ==
                   0,
               "%s", err);
        if (sch) {
            double f[2] = {0.3, 0.3}, b[2] = {0.7, 0.7}, xfer[2] = {0, 0}, fac[2];
            xmp_sim_costs_t c = {.f = f, .b = b, .xfer = xfer};
            int rank0[2] = {0, 1}, nr[2] = {1, 1};
            xmp_sim_result_t res;
            memset(&res, 0, sizeof res);
            int r = xmp_search__sim_shared(sch, &c, 2, f, b, NULL, NULL, rank0, nr, 2, m, 0, fac,
                                           NULL, &res, err, sizeof err);
            EXPECT(r == 0, "simulation: %d %s", r, err);
            EXPECT(near(fac[0], want[w], 1e-4) && near(fac[1], want[w], 1e-4) &&
                       near(res.step_s, step[w], 1e-4),
                   "GPipe M2 wait %g: factors %g %g step %g (want %g, step %g)", wait[w], fac[0],
                   fac[1], res.step_s, want[w], step[w]);
            xmp_sim_result_free(&res);
            xmp_sched_destroy(sch);
        }
        xm_costmodel_destroy(m);
    }
}

/* A stage in its optimizer step (O: AdamW, element-wise compute) is busy, not waiting: two
 * one-rank stages on one cpu, waiting rank takes nothing, GPipe M=1, f 0.3, b 0.7, o 0.4 per
 * stage, r 0; calibrated rate (every rank busy) 1/2 cpu, so a stage alone runs at twice it.
 * By hand: s0 F0 alone 0.15; s1 F0 alone 0.15 (0.3), B0 alone 0.35 (0.65), then s1's O 0.4
 * (to 1.05, not scaled); s0 B0 from 0.65 shares the cpu with that O for 0.4 s (0.4 of its 0.7
 * of calibrated work), the other 0.3 alone in 0.15 s: ends 1.2, its O to 1.6: step 1.6, B0's
 * span 0.55. Counting the O as a wait (before): B0 alone 0.35, step 0.65 + 0.35 + 0.4 = 1.4. */
static void test_sim_optimizer_busy(void)
{
    int both[2] = {0, 1};
    xm_costmodel_t *m = xm_costmodel_create();
    EXPECT(xm_costmodel_add_cpuset(m, 1, both, 2, 0) == XMESH_SUCCESS, "%s", xmesh_last_error());
    xmp_sedge_t edges[1];
    int ne = xmp_sched_chain_edges(2, edges);
    xmp_schedule_t *sch = NULL;
    char err[256];
    EXPECT(xmp_sched_generate(XMP_SCHED_GPIPE, 2, 1, ne, edges, NULL, &sch, err, sizeof err) == 0,
           "%s", err);
    if (sch) {
        double f[2] = {0.3, 0.3}, b[2] = {0.7, 0.7}, xfer[2] = {0, 0}, fac[2];
        xmp_sim_costs_t c = {.f = f, .b = b, .xfer = xfer, .o = 0.4};
        int rank0[2] = {0, 1}, nr[2] = {1, 1};
        xmp_sim_result_t res;
        memset(&res, 0, sizeof res);
        int r = xmp_search__sim_shared(sch, &c, 2, f, b, NULL, NULL, rank0, nr, 2, m, 0, fac, NULL,
                                       &res, err, sizeof err);
        EXPECT(r == 0, "simulation: %d %s", r, err);
        double b0 = -1, o1 = -1;
        for (int i = 0; r == 0 && i < res.len[0]; i++)
            if (res.acts[0][i].kind == XMP_ACT_B)
                b0 = res.t1[0][i] - res.t0[0][i];
        for (int i = 0; r == 0 && i < res.len[1]; i++)
            if (res.acts[1][i].kind == XMP_ACT_O)
                o1 = res.t0[1][i];
        EXPECT(r == 0 && near(res.step_s, 1.6, 1e-4) && near(b0, 0.55, 1e-4) &&
                   near(o1, 0.65, 1e-4),
               "optimizer busy: step %g (want 1.6), s0 B0 %g s (want 0.55), s1 O at %g (want 0.65)",
               res.step_s, b0, o1);
        xmp_sim_result_free(&res);
        xmp_sched_destroy(sch);
    }
    xm_costmodel_destroy(m);
}

/* One stage of two ranks on one cpu, GPipe M=1, compute only (f 0.3, b 0.7), 2 collectives in
 * the forward and 3 in the backward. */
static void sync_case(const xm_costmodel_t *cost, int off, double *step, double *sync_s)
{
    xmp_sedge_t edges[1];
    int ne = xmp_sched_chain_edges(1, edges);
    xmp_schedule_t *sch = NULL;
    char err[256];
    EXPECT(xmp_sched_generate(XMP_SCHED_GPIPE, 1, 1, ne, edges, NULL, &sch, err, sizeof err) == 0,
           "%s", err);
    if (!sch)
        return;
    double f[1] = {0.3}, b[1] = {0.7}, ncf[1] = {2}, ncb[1] = {3}, fac[1];
    xmp_sim_costs_t c = {.f = f, .b = b};
    int rank0[1] = {0}, nr[1] = {2};
    xmp_sim_result_t res;
    memset(&res, 0, sizeof res);
    int r = xmp_search__sim_shared(sch, &c, 1, f, b, ncf, ncb, rank0, nr, 2, cost, off, fac, sync_s,
                                   &res, err, sizeof err);
    EXPECT(r == 0 && fac[0] == 1, "simulation: %d %s factor %g", r, err, fac[0]);
    *step = res.step_s;
    xmp_sim_result_free(&res);
    xmp_sched_destroy(sch);
}

static void test_sync(void)
{
    int both[2] = {0, 1};
    double step = 0, sy = -1;
    xm_costmodel_t *m = xm_costmodel_create();
    EXPECT(xm_costmodel_add_cpuset(m, 1, both, 2, 0) == XMESH_SUCCESS, "%s", xmesh_last_error());
    sync_case(m, 0, &step, &sy);
    EXPECT(near(step, 1.0, 1e-12) && sy == 0, "no sync: step %g sync %g", step, sy);
    EXPECT(xm_costmodel_set_cpuset_sync(m, 0, 0.01) == XMESH_SUCCESS, "%s", xmesh_last_error());
    sync_case(m, 0, &step, &sy);
    double p = (sqrt(1.2) - 1) / 10;
    EXPECT(near(step, 1 + 5 * p, 1e-5) && near(sy, 5 * p, 1e-4),
           "sync 10 ms: step %.7g sync %.7g (want %.7g, %.7g)", step, sy, 1 + 5 * p, 5 * p);
    sync_case(m, 1, &step, &sy);
    EXPECT(near(step, 1.0, 1e-12) && sy == 0, "off: step %g sync %g", step, sy);
    xm_costmodel_destroy(m);
}

int main(void)
{
    test_parse();
    test_share();
    test_sim();
    test_sim_per_action();
    test_sim_optimizer_busy();
    test_act_add();
    test_sync();
    if (g_fail) {
        fprintf(stderr, "pipeline.search.cpu: %d checks failed\n", g_fail);
        return 1;
    }
    printf("pipeline.search.cpu: OK\n");
    return 0;
}
