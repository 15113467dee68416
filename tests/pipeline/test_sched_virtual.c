/*
 * Virtual-stage schedules (one process): interleaved 1F1B (Megatron-LM's order), its eager
 * variant, ZB-V and V-shaped 1F1B, with and without the weight-gradient delay, over a grid of
 * R (1-4 groups), V (1-3 stages per group) and M. Every generated schedule must validate, run
 * every F / B (or I and W) exactly once per chunk and microbatch (counted here, not by the
 * validator), dry-run without deadlock, match the order re-derived here from Megatron's and
 * PyTorch's formulas, round-trip through the text form, and simulate to the analytic bubble.
 * Also: refusals and their messages, explicit stage -> group maps (same-group edges),
 * recomputation (cost and memory model, exact values) and the memory cap.
 */
#include "sched/schedule.h"
#include "sched_check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Every F and (B xor I+W) exactly once per (stage, microbatch), W after I, counted here. */
static void check_once(const xmp_schedule_t *s)
{
    int S = s->nstages, M = s->nmb;
    int *cnt = calloc((size_t)S * M * 4, sizeof(int));
    for (int g = 0; g < s->ngroups; g++)
        for (int j = 0; j < s->len[g]; j++) {
            xmp_action_t a = s->acts[g][j];
            if (a.kind > XMP_ACT_W)
                continue;
            int st = s->group_stage[g][a.chunk];
            CHECK(s->stage_group[st] == g, "%s: stage %d on group %d", s->name, st, g);
            if (a.kind == XMP_ACT_W)
                CHECK(cnt[(st * M + a.mb) * 4 + XMP_ACT_I] == 1, "%s: W%d of stage %d before I",
                      s->name, a.mb, st);
            cnt[(st * M + a.mb) * 4 + a.kind]++;
        }
    for (int st = 0; st < S; st++)
        for (int m = 0; m < M; m++) {
            int *c = cnt + (st * M + m) * 4;
            CHECK(c[XMP_ACT_F] == 1 && ((c[XMP_ACT_B] == 1 && !c[XMP_ACT_I] && !c[XMP_ACT_W]) ||
                                        (!c[XMP_ACT_B] && c[XMP_ACT_I] == 1 && c[XMP_ACT_W] == 1)),
                  "%s stage %d mb %d: F%d B%d I%d W%d", s->name, st, m, c[0], c[1], c[2], c[3]);
        }
    free(cnt);
}

/* Compute actions of group g in order (kind, stage, mb), W dropped when skipw. */
static int compute_seq(const xmp_schedule_t *s, int g, int skipw, int *k, int *st, int *mb)
{
    int n = 0;
    for (int j = 0; j < s->len[g]; j++) {
        xmp_action_t a = s->acts[g][j];
        if (a.kind > XMP_ACT_W || (skipw && a.kind == XMP_ACT_W))
            continue;
        k[n] = a.kind == XMP_ACT_I ? XMP_ACT_B : a.kind;
        st[n] = s->group_stage[g][a.chunk];
        mb[n] = a.mb;
        n++;
    }
    return n;
}

/* Megatron-LM's interleaved order, re-derived: forward k of group r runs model stage
 * ((k mod RV) div R) * R + r on microbatch (k div RV) * R + k mod R; backwards mirror the
 * chunk; warm-up (its num_warmup_microbatches) 2(R-r-1) + (V-1)R, all when M == R; then
 * F/B alternately (forward first), then the remaining backwards. */
static void check_megatron(const xmp_schedule_t *s, int R, int V, int M, int eager)
{
    int n = 2 * M * V;
    int *k = malloc(sizeof(int) * 3 * (size_t)n * 2), *st = k + 2 * n, *mb = st + 2 * n;
    for (int r = 0; r < R; r++) {
        int got = compute_seq(s, r, 1, k, st, mb);
        CHECK(got == n, "%s group %d: %d compute actions, expected %d", s->name, r, got, n);
        if (got != n)
            continue;
        int total = M * V;
        int warm = M == R ? total : 2 * (R - r - 1) + (V - 1) * R + eager;
        if (warm > total)
            warm = total;
        int pos = 0, nf = 0, nb = 0, bad = -1;
        for (int i = 0; i < warm; i++, pos++)
            if (k[pos] != XMP_ACT_F || st[pos] != ((nf % (R * V)) / R) * R + r ||
                mb[pos] != (nf / (R * V)) * R + nf % R || (nf++, 0))
                bad = bad < 0 ? pos : bad;
        while (nf < total || nb < total) {
            if (nf < total) {
                if (k[pos] != XMP_ACT_F || st[pos] != ((nf % (R * V)) / R) * R + r ||
                    mb[pos] != (nf / (R * V)) * R + nf % R)
                    bad = bad < 0 ? pos : bad;
                nf++;
                pos++;
            }
            int c = V - 1 - (nb % (R * V)) / R;
            if (k[pos] != XMP_ACT_B || st[pos] != c * R + r ||
                mb[pos] != (nb / (R * V)) * R + nb % R)
                bad = bad < 0 ? pos : bad;
            nb++;
            pos++;
        }
        CHECK(bad < 0, "%s R=%d V=%d M=%d group %d: order differs from Megatron's at entry %d",
              s->name, R, V, M, r, bad);
    }
    free(k);
}

/* ZB-V's order on group r (PyTorch's ScheduleZBVZeroBubble, re-derived): see schedule.h. */
static void check_zbv(const xmp_schedule_t *s, int R, int M, int whole)
{
    int cap = 8 * (M + 2 * R) + 16;
    int *ek = malloc(sizeof(int) * 3 * (size_t)cap), *es = ek + cap, *em = es + cap;
    int *k = malloc(sizeof(int) * 3 * (size_t)cap), *st = k + cap, *mb = st + cap;
    for (int r = 0; r < R; r++) {
        int n = 0, nm = M > 2 * R - 1 ? M : 2 * R - 1;
        int s0 = r, s1 = 2 * R - 1 - r, f0 = 0, f1 = 0, b0 = 0, b1 = 0;
#define E(kk, ss, mm)                                                                              \
    do {                                                                                           \
        int m_ = (mm);                                                                             \
        if (m_ < M && !(whole && (kk) == XMP_ACT_W)) {                                             \
            ek[n] = (kk) == XMP_ACT_I ? XMP_ACT_B : (kk);                                          \
            es[n] = (ss);                                                                          \
            em[n++] = m_;                                                                          \
        }                                                                                          \
    } while (0)
        for (int i = 0; i < 2 * (R - r) - 1; i++)
            E(XMP_ACT_F, s0, f0++);
        for (int i = 0; i < r; i++) {
            E(XMP_ACT_F, s1, f1++);
            E(XMP_ACT_F, s0, f0++);
        }
        for (int i = 0; i < R - r; i++) {
            E(XMP_ACT_F, s1, f1++);
            E(XMP_ACT_I, s1, b1);
            E(XMP_ACT_W, s1, b1++);
        }
        while (f1 < f0 || f0 < nm) {
            if (f0 < nm)
                E(XMP_ACT_F, s0, f0++);
            E(XMP_ACT_I, s0, b0);
            E(XMP_ACT_W, s0, b0++);
            E(XMP_ACT_F, s1, f1++);
            E(XMP_ACT_I, s1, b1);
            E(XMP_ACT_W, s1, b1++);
        }
        int w0 = b0, w1 = b1;
        for (int i = 0; i < r; i++) {
            E(XMP_ACT_I, s0, b0++);
            E(XMP_ACT_I, s1, b1++);
        }
        for (int i = 0; i < R - r; i++) {
            E(XMP_ACT_I, s0, b0++);
            E(XMP_ACT_W, s0, w0++);
        }
        while (w1 < b1)
            E(XMP_ACT_W, s1, w1++);
        while (w0 < b0)
            E(XMP_ACT_W, s0, w0++);
#undef E
        int got = compute_seq(s, r, 0, k, st, mb);
        int same = got == n;
        for (int i = 0; same && i < n; i++)
            same = k[i] == ek[i] && st[i] == es[i] && mb[i] == em[i];
        CHECK(same, "%s R=%d M=%d group %d: order differs from ZB-V's (%d vs %d entries)", s->name,
              R, M, r, got, n);
    }
    free(ek);
    free(k);
}

/* Simulates with the same costs on every stage; fills res. */
static double sim(const xmp_schedule_t *s, double f, double i, double w, double x,
                  xmp_sim_result_t *res)
{
    int S = s->nstages, P = 2 * s->nedges;
    double *c = malloc(sizeof(double) * (size_t)(3 * S + P + 1));
    for (int k = 0; k < S; k++) {
        c[k] = f;
        c[S + k] = i;
        c[2 * S + k] = w;
    }
    for (int p = 0; p < P; p++)
        c[3 * S + p] = x;
    xmp_sim_costs_t co;
    memset(&co, 0, sizeof(co));
    co.f = c;
    co.i = c + S;
    co.w = c + 2 * S;
    co.xfer = c + 3 * S;
    int r = xmp_sim_run(s, &co, res, err, sizeof(err));
    CHECK(r == 0, "sim %s: %s %s", s->name, err, r == 1 ? res->msg : "");
    free(c);
    return res->step_s;
}

static double max_bubble(const xmp_sim_result_t *res)
{
    double b = 0;
    for (int g = 0; g < res->nstages; g++)
        if (res->bubble[g] > b)
            b = res->bubble[g];
    return b;
}

static const char *kinds[] = {"interleaved-1f1b", "eager-interleaved-1f1b", "zb-v", "v-1f1b",
                              "dualpipe-v"};

/* DualPipeV's order on group r (PyTorch's ScheduleDualPipeV, re-derived; its overlapped
 * (F, B) pairs as F then B), compared entry by entry; W compared unless +dw. */
static void check_dualpipe(const xmp_schedule_t *s, int R, int M, int dw)
{
    int cap = 8 * M + 16;
    int *ek = malloc(sizeof(int) * 6 * (size_t)cap), *es = ek + cap, *em = es + cap;
    int *k = em + cap, *st = k + cap, *mb = st + cap;
    for (int r = 0; r < R; r++) {
        int n = 0, f[2] = {0, 0}, b[2] = {0, 0}, q[64], qh = 0, qt = 0, zb = 0;
        int stg[2] = {r, 2 * R - 1 - r};
#define PUT(kk, c, m)                                                                              \
    do {                                                                                           \
        ek[n] = (kk);                                                                              \
        es[n] = stg[c];                                                                            \
        em[n++] = (m);                                                                             \
    } while (0)
#define F_(c) PUT(XMP_ACT_F, c, f[c]++)
#define B_(c, z)                                                                                   \
    do {                                                                                           \
        if (z)                                                                                     \
            q[qt++] = (c)*100 + b[c];                                                              \
        PUT(XMP_ACT_B, c, b[c]++); /* compute_seq reports I as B */                                \
    } while (0)
#define W_()                                                                                       \
    do {                                                                                           \
        if (qh < qt) {                                                                             \
            if (!dw)                                                                               \
                PUT(XMP_ACT_W, q[qh] / 100, q[qh] % 100);                                          \
            qh++;                                                                                  \
        }                                                                                          \
    } while (0)
        for (int i = 0; i < 2 * (R - r - 1); i++)
            F_(0);
        for (int i = 0; i <= r; i++) {
            F_(0);
            F_(1);
        }
        for (int i = 0; i < R - r - 1; i++) {
            B_(1, 1);
            W_();
            F_(1);
        }
        for (int i = 0; i < M - 2 * R + r + 1; i++) {
            F_(0);
            B_(1, 0);
            F_(1);
            B_(0, 0);
        }
        for (int i = 0; i < R - r - 1; i++) {
            B_(1, 0);
            F_(1);
            B_(0, 0);
        }
        for (int i = 0; i <= r; i++) {
            if (i == (r + 1) / 2 && r % 2 == 1)
                zb = 1;
            B_(1, zb);
            if (i == (r + 1) / 2 && r % 2 == 0)
                zb = 1;
            B_(0, zb);
        }
        for (int i = 0; i < R - r - 1; i++) {
            W_();
            B_(0, zb);
        }
        while (qh < qt)
            W_();
#undef W_
#undef B_
#undef F_
#undef PUT
        int got = compute_seq(s, r, dw, k, st, mb);
        int same = got == n;
        for (int i = 0; same && i < n; i++)
            same = k[i] == ek[i] && st[i] == es[i] && mb[i] == em[i];
        CHECK(same, "%s R=%d M=%d group %d: order differs from DualPipeV's (%d vs %d entries)",
              s->name, R, M, r, got, n);
    }
    free(ek);
}

static void test_grid(void)
{
    const int Ms[] = {1, 2, 3, 4, 5, 6, 8, 9, 12};
    int made = 0, refused = 0;
    for (int ki = 0; ki < 5; ki++)
        for (int dw = 0; dw < 2; dw++)
            for (int R = 1; R <= 4; R++)
                for (int V = 1; V <= 3; V++)
                    for (size_t mi = 0; mi < sizeof(Ms) / sizeof(Ms[0]); mi++) {
                        int M = Ms[mi];
                        char name[64];
                        snprintf(name, sizeof(name), "%s%s", kinds[ki], dw ? "+dw" : "");
                        xmp_schedule_t *s = NULL;
                        err[0] = '\0';
                        int r = xmp_sched_generate_named(name, R, V, M, NULL, &s, err, sizeof(err));
                        int inter = ki < 2;
                        char want[64];
                        if (inter && M % R != 0) {
                            snprintf(want, sizeof(want), "M=%d, R=%d, V=%d", M, R, V);
                            CHECK(r != 0 && strstr(err, want), "%s R=%d V=%d M=%d: want '%s': %s",
                                  name, R, V, M, want, err);
                            refused++;
                            continue;
                        }
                        if (ki == 4 && V == 2 && M < 2 * R) {
                            snprintf(want, sizeof(want), "M=%d < 2R=%d", M, 2 * R);
                            CHECK(r != 0 && strstr(err, want), "%s R=%d V=%d M=%d: want '%s': %s",
                                  name, R, V, M, want, err);
                            refused++;
                            continue;
                        }
                        if (!inter && V != 2) {
                            snprintf(want, sizeof(want), "R=%d V=%d", R, V);
                            CHECK(r != 0 && strstr(err, want), "%s R=%d V=%d M=%d: want '%s': %s",
                                  name, R, V, M, want, err);
                            refused++;
                            continue;
                        }
                        CHECK(r == 0, "%s R=%d V=%d M=%d: %s", name, R, V, M, err);
                        if (r != 0)
                            continue;
                        made++;
                        CHECK(s->nstages == R * V && s->ngroups == R, "%s dims", name);
                        for (int st = 0; st < R * V; st++)
                            CHECK(s->stage_group[st] == (inter    ? st % R
                                                         : st < R ? st
                                                                  : 2 * R - 1 - st),
                                  "%s stage %d on group %d", name, st, s->stage_group[st]);
                        CHECK(xmp_sched_validate(s, NULL, 0, err, sizeof(err)) == 0,
                              "validate %s: %s", name, err);
                        CHECK(xmp_sched_dryrun(s, 0, err, sizeof(err)) == 0, "dryrun %s: %s", name,
                              err);
                        CHECK(xmp_sched_dryrun(s, 1, err, sizeof(err)) == 0,
                              "blocking dryrun %s R=%d V=%d M=%d: %s", name, R, V, M, err);
                        check_once(s);
                        if (inter)
                            check_megatron(s, R, V, M, ki == 1);
                        else if (ki == 4)
                            check_dualpipe(s, R, M, dw);
                        else if (!dw)
                            check_zbv(s, R, M, ki == 3);
                        if (dw)
                            for (int g = 0; g < R; g++)
                                for (int j = 0; j < s->len[g]; j++)
                                    CHECK(s->acts[g][j].kind != XMP_ACT_B, "%s has B with +dw",
                                          name);
                        roundtrip(s);
                        xmp_sched_destroy(s);
                    }
    printf("grid: %d schedules generated and checked, %d refused as expected\n", made, refused);
}

/* Bubbles against the analytic formulas; per-chunk costs f = 1, b = i + w = 2, no
 * transfer time unless said. */
static void test_bubbles(void)
{
    printf("R V  M  kind                     step    analytic  bubble\n");
    for (int R = 1; R <= 4; R++)
        for (int V = 1; V <= 3; V++)
            for (int M = R; M <= 12; M += R) {
                xmp_schedule_t *s = NULL;
                xmp_sim_result_t res;
                /* 1F1B over R*V stages, one per group (the reference) */
                if (V == 1) {
                    CHECK(xmp_sched_generate_named("1f1b", R, 1, M, NULL, &s, err, sizeof(err)) ==
                              (M >= R ? 0 : -1),
                          "1f1b: %s", err);
                    if (s) {
                        double st = sim(s, 1, 1.5, 0.5, 0, &res);
                        CHECK(st == (M + R - 1) * 3.0, "1f1b R=%d M=%d step %g", R, M, st);
                        xmp_sim_result_free(&res);
                        xmp_sched_destroy(s);
                        s = NULL;
                    }
                }
                /* interleaved: step = (MV + R - 1)(f + b), bubble
                 * (R-1)/(MV + R - 1): 1F1B's (R-1)/(M + R - 1) with the bubble divided by V */
                if (xmp_sched_generate_named("interleaved-1f1b", R, V, M, NULL, &s, err,
                                             sizeof(err)) != 0) {
                    CHECK(0, "interleaved R=%d V=%d M=%d: %s", R, V, M, err);
                    continue;
                }
                double st = sim(s, 1, 1.5, 0.5, 0, &res);
                double an = (M * V + R - 1) * 3.0;
                double bub = max_bubble(&res), abub = (R - 1.0) / (M * V + R - 1.0);
                /* exact, also for M == R where Megatron runs all forwards first */
                CHECK(fabs(st - an) < 1e-9 && fabs(bub - abub) < 1e-9,
                      "interleaved R=%d V=%d M=%d: step %g bubble %g, analytic %g %g", R, V, M, st,
                      bub, an, abub);
                if (M == 2 * R || (R == 1 && M == 4))
                    printf("%d %d %2d  %-22s %7.2f %9.2f  %.4f (analytic %.4f)\n", R, V, M, s->name,
                           st, an, bub, abub);
                xmp_sim_result_free(&res);
                xmp_sched_destroy(s);
                s = NULL;
                /* with the weight-gradient delay W fills the drain: no worse */
                if (xmp_sched_generate_named("interleaved-1f1b+dw", R, V, M, NULL, &s, err,
                                             sizeof(err)) == 0) {
                    double sd = sim(s, 1, 1.5, 0.5, 0, &res);
                    CHECK(sd <= st + 1e-9, "interleaved+dw R=%d V=%d M=%d: %g > %g", R, V, M, sd,
                          st);
                    xmp_sim_result_free(&res);
                    xmp_sched_destroy(s);
                    s = NULL;
                }
            }
    /* ZB-V: f = i = w = 1 per chunk. Against the ideal 2M(f+i+w) per group its only idle
     * time is the start-up of R-1 chunk forwards: step <= 2M*3 + (R-1) f, bubble <=
     * (R-1)/step (the ZB paper's "zero bubble" up to the first forward's ramp);
     * V-1F1B (whole backwards, no delay) carries 1F1B's drain and must be slower for R > 1. */
    for (int R = 1; R <= 4; R++)
        for (int M = 2 * R; M <= 16; M += R) {
            xmp_schedule_t *z = NULL, *v = NULL, *o = NULL;
            xmp_sim_result_t rz, rv, ro;
            CHECK(xmp_sched_generate_named("zb-v", R, 2, M, NULL, &z, err, sizeof(err)) == 0,
                  "zb-v: %s", err);
            CHECK(xmp_sched_generate_named("v-1f1b", R, 2, M, NULL, &v, err, sizeof(err)) == 0,
                  "v-1f1b: %s", err);
            CHECK(xmp_sched_generate_named("1f1b", 2 * R, 1, M, NULL, &o, err, sizeof(err)) == 0,
                  "1f1b: %s", err);
            if (!z || !v || !o) {
                xmp_sched_destroy(z);
                xmp_sched_destroy(v);
                xmp_sched_destroy(o);
                continue;
            }
            double sz = sim(z, 1, 1, 1, 0, &rz);
            double sv = sim(v, 1, 1, 1, 0, &rv);
            sim(o, 0.5, 0.5, 0.5, 0, &ro); /* 2R stages of half the work */
            double ideal = 2.0 * M * 3;
            double bz = max_bubble(&rz), bo = max_bubble(&ro);
            CHECK(sz <= ideal + (R - 1) + 1e-9, "zb-v R=%d M=%d step %g > ideal %g + (R-1)", R, M,
                  sz, ideal);
            CHECK(bz <= (R - 1.0) / sz + 1e-9, "zb-v R=%d M=%d bubble %g", R, M, bz);
            CHECK(R == 1 || sv > sz, "v-1f1b R=%d M=%d step %g not slower than zb-v %g", R, M, sv,
                  sz);
            /* DualPipeV (its F/B pairs in turn, no overlap modelled): ZB-V's bound too */
            xmp_schedule_t *dp = NULL;
            CHECK(xmp_sched_generate_named("dualpipe-v", R, 2, M, NULL, &dp, err, sizeof(err)) == 0,
                  "dualpipe-v: %s", err);
            if (dp) {
                xmp_sim_result_t rd;
                double sd = sim(dp, 1, 1, 1, 0, &rd);
                CHECK(sd <= ideal + (R - 1) + 1e-9 && (R == 1 || sd < sv),
                      "dualpipe-v R=%d M=%d step %g (ideal %g, v-1f1b %g)", R, M, sd, ideal, sv);
                if (M == 4 * R)
                    printf("%d 2 %2d  dualpipe-v %7.2f\n", R, M, sd);
                xmp_sim_result_free(&rd);
                xmp_sched_destroy(dp);
            }
            CHECK(R == 1 || bz < bo, "zb-v R=%d M=%d bubble %g not below 1f1b's %g", R, M, bz, bo);
            if (M == 4 * R)
                printf("%d 2 %2d  zb-v %7.2f (ideal %.0f) bubble %.4f; v-1f1b %7.2f; 1f1b over "
                       "%d stages bubble %.4f\n",
                       R, M, sz, ideal, bz, sv, 2 * R, bo);
            xmp_sim_result_free(&rz);
            xmp_sim_result_free(&rv);
            xmp_sim_result_free(&ro);
            xmp_sched_destroy(z);
            xmp_sched_destroy(v);
            xmp_sched_destroy(o);
        }
}

static void test_maps(void)
{
    /* explicit maps equal the default ones */
    int im[12], vm[8];
    xmp_sedge_t e[12];
    xmp_sched_interleaved_map(3, 2, im);
    int ne = xmp_sched_chain_edges(6, e);
    xmp_schedule_t *a = NULL, *b = NULL;
    CHECK(xmp_sched_generate_map(XMP_SCHED_INTERLEAVED_1F1B, 6, 3, im, 6, ne, e, NULL, &a, err,
                                 sizeof(err)) == 0,
          "%s", err);
    CHECK(xmp_sched_generate_named("interleaved-1f1b", 3, 2, 6, NULL, &b, err, sizeof(err)) == 0,
          "%s", err);
    if (a && b) {
        char *ta = xmp_sched_format(a), *tb = xmp_sched_format(b);
        CHECK(strcmp(ta, tb) == 0, "explicit interleaved map differs");
        free(ta);
        free(tb);
    }
    xmp_sched_destroy(a);
    xmp_sched_destroy(b);
    a = b = NULL;
    xmp_sched_vshape_map(2, vm);
    CHECK(vm[0] == 0 && vm[1] == 1 && vm[2] == 1 && vm[3] == 0, "vshape map");
    /* same-group edges: R=1 holds every stage; R=2 zb-v has edge 1>2 on group 1 */
    for (int V = 2; V <= 3; V++) {
        CHECK(xmp_sched_generate_named("interleaved-1f1b", 1, V, 3, NULL, &a, err, sizeof(err)) ==
                  0,
              "R=1: %s", err);
        if (a) {
            xmp_sim_result_t res;
            double st = sim(a, 1, 1, 1, 0.5, &res);
            /* one group does everything: no idle time except same-group transfers */
            CHECK(st >= 3.0 * 3 * V, "R=1 V=%d step %g", V, st);
            xmp_sim_result_free(&res);
            xmp_sched_destroy(a);
            a = NULL;
        }
    }
    /* a map with non-increasing chunks on a group and a skip edge (U shape over 2 groups):
     * stages 0,3 on group 0, 1,2 on group 1; edges 0>1 1>2 2>3 0>3 */
    xmp_sedge_t u[4] = {{0, 1}, {1, 2}, {2, 3}, {0, 3}};
    int um[4] = {0, 1, 1, 0};
    CHECK(xmp_sched_generate_map(XMP_SCHED_ZB_V, 4, 2, um, 4, 4, u, NULL, &a, err, sizeof(err)) ==
              0,
          "U on zb-v: %s", err);
    if (a) {
        check_once(a);
        roundtrip(a);
        xmp_sched_destroy(a);
        a = NULL;
    }
    /* Megatron's order assumes chunk c of group r is stage cR + r: on the U map it
     * deadlocks, which the dry run catches and the generator reports */
    CHECK(xmp_sched_generate_map(XMP_SCHED_INTERLEAVED_1F1B, 4, 2, um, 4, 4, u, NULL, &a, err,
                                 sizeof(err)) != 0 &&
              strstr(err, "does not run: deadlock: group") && a == NULL,
          "U on interleaved: %s", err);
    /* the map parser */
    int pm[6];
    CHECK(xmp_sched_parse_map("interleaved", 6, 3, pm, err, sizeof(err)) == 0 && pm[4] == 1 &&
              pm[5] == 2,
          "%s", err);
    CHECK(xmp_sched_parse_map("v", 6, 3, pm, err, sizeof(err)) == 0 && pm[3] == 2 && pm[5] == 0,
          "%s", err);
    CHECK(xmp_sched_parse_map("0,1,1,0,2,2", 6, 3, pm, err, sizeof(err)) == 0 && pm[2] == 1 &&
              pm[3] == 0,
          "%s", err);
    CHECK(xmp_sched_parse_map("0,1,1,0,1,1", 6, 3, pm, err, sizeof(err)) != 0 &&
              strstr(err, "group 2 holds no stage") && pm[3] == 0,
          "%s", err);
    CHECK(xmp_sched_parse_map("0,1,3,0,1,2", 6, 3, pm, err, sizeof(err)) != 0 &&
              strstr(err, "stage 2 on group 3"),
          "%s", err);
    CHECK(xmp_sched_parse_map("0,1", 6, 3, pm, err, sizeof(err)) != 0 && strstr(err, "got 2"), "%s",
          err);
    CHECK(xmp_sched_parse_map("v", 5, 3, pm, err, sizeof(err)) != 0 && strstr(err, "needs 6"), "%s",
          err);
    /* bad maps */
    xmp_sched_interleaved_map(2, 2, im);
    int bad1[4] = {0, 0, 0, 0}, bad2[4] = {0, 1, 2, 1};
    CHECK(xmp_sched_generate_map(XMP_SCHED_INTERLEAVED_1F1B, 4, 2, bad1, 4, 3, e, NULL, &a, err,
                                 sizeof(err)) != 0 &&
              strstr(err, "group 1 holds no stage"),
          "empty group: %s", err);
    CHECK(xmp_sched_generate_map(XMP_SCHED_INTERLEAVED_1F1B, 4, 2, bad2, 4, 3, e, NULL, &a, err,
                                 sizeof(err)) != 0 &&
              strstr(err, "stage 2 is on group 2"),
          "group out of range: %s", err);
    int uneven[3] = {0, 0, 1};
    CHECK(xmp_sched_generate_map(XMP_SCHED_INTERLEAVED_1F1B, 3, 2, uneven, 4, 2, e, NULL, &a, err,
                                 sizeof(err)) != 0 &&
              strstr(err, "group 0 holds 2, group 1 holds 1"),
          "uneven: %s", err);
    CHECK(xmp_sched_generate_map(XMP_SCHED_ZB_V, 4, 2, im, 4, 3, e, NULL, &a, err, sizeof(err)) !=
                  0 &&
              strstr(err, "V map"),
          "zb-v on interleaved map: %s", err);
    CHECK(xmp_sched_generate_map(XMP_SCHED_1F1B, 4, 2, im, 4, 3, e, NULL, &a, err, sizeof(err)) !=
                  0 &&
              strstr(err, "one stage per group"),
          "1f1b on a virtual map: %s", err);
}

static void test_refusals(void)
{
    xmp_schedule_t *s = NULL;
    struct {
        const char *name;
        int R, V, M;
        const char *want;
    } cases[] = {
        {"interleaved-1f1b", 4, 2, 6, "M=6, R=4, V=2"},
        {"interleaved-1f1b", 3, 3, 4, "M a multiple of R"},
        {"eager-interleaved-1f1b+dw", 2, 2, 3, "M=3, R=2, V=2"},
        {"zb-v", 2, 3, 4, "V=2 stages per group"},
        {"v-1f1b", 3, 1, 4, "R=3 V=1"},
        {"1f1b", 2, 2, 4, "V=2 (use interleaved-1f1b"},
        {"1f1b", 4, 1, 2, "M=2 < S=4"},
        {"zigzag", 2, 2, 4, "'zigzag' unknown"},
        {"interleaved-1f1b", 0, 2, 4, "R=0"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        err[0] = '\0';
        int r = xmp_sched_generate_named(cases[i].name, cases[i].R, cases[i].V, cases[i].M, NULL,
                                         &s, err, sizeof(err));
        CHECK(r != 0 && strstr(err, cases[i].want), "%s R=%d V=%d M=%d: want '%s', got '%s'",
              cases[i].name, cases[i].R, cases[i].V, cases[i].M, cases[i].want, err);
        CHECK(s == NULL, "output untouched on refusal");
    }
    printf("refusal, e.g.: %s\n", err);
    xmp_sched_generate_named("interleaved-1f1b", 4, 2, 6, NULL, &s, err, sizeof(err));
    printf("refusal, e.g.: %s\n", err);
    /* the validator: chunk out of range, a transfer on a chunk that is not its endpoint */
    const char *bad[] = {
        "schedule x S=2 M=1 edges=0>1 groups=1 map=0,0\n"
        "g0 inflight<=2: F0 F0.c2 B0.c1 B0 R O\n",
        "schedule x S=2 M=1 edges=0>1 groups=1 map=0,0\n"
        "g0 inflight<=2: SA0.e0.c1 F0 SA0.e0 F0.c1 WA0.e0.c1 SG0.e0 B0.c1 SG0.e0.c1 WG0.e0 B0 "
        "WG0.e0.c1 WA0.e0 R O\n",
        "schedule x S=3 M=1 edges=0>1,1>2 groups=1 map=0,0,0\n"
        "g0 inflight<=3: SA0.e1 F0 R O\n",
    };
    const char *want[] = {"chunk 2 out of 0..1", "'F0.c1': no WA0.e0 before",
                          "edge 1 connects stages 1>2, not stage 0 (chunk 0)"};
    for (int i = 0; i < 3; i++) {
        s = NULL;
        int r = xmp_sched_parse(bad[i], &s, err, sizeof(err));
        CHECK(r == 0, "parse %d: %s", i, err);
        if (s) {
            CHECK(xmp_sched_validate(s, NULL, 0, err, sizeof(err)) != 0 && strstr(err, want[i]),
                  "case %d: want '%s' got '%s'", i, want[i], err);
            xmp_sched_destroy(s);
        }
    }
    /* a hand-written same-group schedule that is correct: both sides of e0 on group 0 */
    const char *good = "schedule x S=2 M=1 edges=0>1 groups=1 map=0,0 recompute=selective:0.3\n"
                       "g0 inflight<=2: SA0.e0.c1 SG0.e0 F0 SA0.e0 WA0.e0.c1 F0.c1 B0.c1 "
                       "SG0.e0.c1 WA0.e0 WG0.e0 B0 WG0.e0.c1 R O\n";
    s = NULL;
    CHECK(xmp_sched_parse(good, &s, err, sizeof(err)) == 0, "%s", err);
    if (s) {
        CHECK(xmp_sched_validate(s, NULL, 0, err, sizeof(err)) == 0, "same-group: %s", err);
        CHECK(xmp_sched_dryrun(s, 0, err, sizeof(err)) == 0, "same-group dry run: %s", err);
        CHECK(s->recompute == XMP_RECOMPUTE_SELECTIVE && s->recompute_frac == 0.3, "recompute");
        roundtrip(s);
        xmp_sched_destroy(s);
    }
    CHECK(xmp_sched_parse("schedule x S=2 M=1 edges=0>1 groups=1\n", &s, err, sizeof(err)) != 0 &&
              strstr(err, "go together"),
          "%s", err);
    CHECK(xmp_sched_parse("schedule x S=2 M=1 edges=0>1 recompute=some\n", &s, err, sizeof(err)) !=
                  0 &&
              strstr(err, "'recompute=some'"),
          "%s", err);
    CHECK(xmp_recompute_parse("selective") == XMP_RECOMPUTE_SELECTIVE &&
              xmp_recompute_parse("all") == -1,
          "recompute names");
}

/* Recomputation: exact step and memory on 1F1B and interleaved. */
static void test_recompute(void)
{
    const int S = 4, M = 8;
    double act[8], ck[8];
    for (int i = 0; i < 8; i++) {
        act[i] = 100;
        ck[i] = 10;
    }
    for (int mode = 0; mode < 3; mode++) {
        xmp_gen_opts_t o;
        memset(&o, 0, sizeof(o));
        o.recompute = mode;
        o.recompute_frac = 0.25;
        xmp_schedule_t *s = NULL;
        CHECK(xmp_sched_generate_named("1f1b", S, 1, M, &o, &s, err, sizeof(err)) == 0, "%s", err);
        if (!s)
            continue;
        double rf = mode == XMP_RECOMPUTE_BLOCK ? 1.0 : mode == XMP_RECOMPUTE_SELECTIVE ? 0.25 : 0;
        double c[4 * 8];
        for (int i = 0; i < S; i++) {
            c[i] = 1;
            c[8 + i] = 1.5;
            c[16 + i] = 0.5;
        }
        xmp_sim_costs_t co;
        memset(&co, 0, sizeof(co));
        co.f = c;
        co.i = c + 8;
        co.w = c + 16;
        co.act_bytes = act;
        co.ckpt_bytes = ck;
        co.selective_keep = 0.4;
        xmp_sim_result_t res;
        CHECK(xmp_sim_run(s, &co, &res, err, sizeof(err)) == 0, "%s", err);
        double want = (M + S - 1) * (3.0 + rf);
        CHECK(fabs(res.step_s - want) < 1e-9, "recompute %s: step %g, expected %g",
              xmp_recompute_name(mode), res.step_s, want);
        for (int g = 0; g < S; g++) {
            int w = S - g; /* 1F1B warm-up: peak microbatches in flight */
            double kept = mode == 0 ? 100 : mode == XMP_RECOMPUTE_BLOCK ? 10 : 40;
            double pb = w * kept + (mode ? 100 - kept : 0);
            CHECK(fabs(res.peak_bytes[g] - pb) < 1e-9, "recompute %s group %d: peak %g expected %g",
                  xmp_recompute_name(mode), g, res.peak_bytes[g], pb);
            CHECK(fabs(res.recompute_s[g] - M * rf) < 1e-9, "recompute_s %g", res.recompute_s[g]);
        }
        xmp_sim_result_free(&res);
        roundtrip(s); /* recompute=... in the header */
        xmp_sched_destroy(s);
    }
}

static double sim_peak(const xmp_schedule_t *s, const xmp_gen_opts_t *o, double *step)
{
    int S = s->nstages;
    double c[3 * 16];
    for (int i = 0; i < S; i++) {
        c[i] = 1;
        c[16 + i] = 1;
        c[32 + i] = 1;
    }
    xmp_sim_costs_t co;
    memset(&co, 0, sizeof(co));
    co.f = c;
    co.i = c + 16;
    co.w = c + 32;
    co.act_bytes = o->act_bytes;
    co.ckpt_bytes = o->ckpt_bytes;
    co.selective_keep = o->selective_keep;
    xmp_sim_result_t res;
    double peak = -1;
    if (xmp_sim_run(s, &co, &res, err, sizeof(err)) == 0) {
        peak = 0;
        for (int g = 0; g < res.nstages; g++)
            if (res.peak_bytes[g] > peak)
                peak = res.peak_bytes[g];
        *step = res.step_s;
    }
    xmp_sim_result_free(&res);
    return peak;
}

static void test_memory_cap(void)
{
    double act[16], ck[16];
    for (int i = 0; i < 16; i++) {
        act[i] = 100;
        ck[i] = 10;
    }
    const char *names[] = {"1f1b",    "eager-1f1b", "interleaved-1f1b", "eager-interleaved-1f1b",
                           "zb-v",    "v-1f1b",     "1f1b+dw",          "interleaved-1f1b+dw",
                           "zb-v+dw", "dualpipe-v"};
    const int Vs[] = {1, 1, 2, 2, 2, 2, 1, 2, 2, 2};
    for (int n = 0; n < 10; n++) {
        int R = 4, V = Vs[n], M = 8;
        xmp_gen_opts_t o;
        memset(&o, 0, sizeof(o));
        o.act_bytes = act;
        o.ckpt_bytes = ck;
        o.selective_keep = 0.5;
        xmp_schedule_t *free_s = NULL, *s = NULL;
        CHECK(xmp_sched_generate_named(names[n], R, V, M, NULL, &free_s, err, sizeof(err)) == 0,
              "%s", err);
        double step0 = 0, step = 0, p0 = sim_peak(free_s, &o, &step0);
        /* caps from generous down to impossible: every accepted schedule's modelled peak is
         * under its cap and no faster than the uncapped one; the refusal names a peak that a
         * cap of exactly that value then meets */
        double caps[] = {p0, p0 * 0.75, p0 * 0.5, p0 * 0.3, p0 * 0.15, 30, 1};
        for (int c = 0; c < 7; c++) {
            o.max_act_bytes = caps[c];
            s = NULL;
            err[0] = '\0';
            int r = xmp_sched_generate_named(names[n], R, V, M, &o, &s, err, sizeof(err));
            if (r == 0) {
                double pk = sim_peak(s, &o, &step);
                CHECK(pk >= 0 && pk <= caps[c] + 1e-9, "%s cap %g: peak %g", names[n], caps[c], pk);
                CHECK(step >= step0 - 1e-9, "%s cap %g faster than uncapped", names[n], caps[c]);
                CHECK(c > 0 || (step == step0 && s->recompute == XMP_RECOMPUTE_NONE),
                      "%s: the generous cap changes the schedule", names[n]);
                printf("%-24s cap %6.0f B: %-26s recompute=%-9s peak %6.0f B step %5.1f "
                       "(uncapped %5.1f, %5.0f B)\n",
                       names[n], caps[c], s->name, xmp_recompute_name(s->recompute), pk, step,
                       step0, p0);
                xmp_sched_destroy(s);
            } else {
                const char *k = strstr(err, "smallest modelled peak is ");
                CHECK(k != NULL && s == NULL, "%s cap %g refused without the smallest peak: %s",
                      names[n], caps[c], err);
                if (k) {
                    double least = atof(k + strlen("smallest modelled peak is "));
                    CHECK(least > caps[c], "%s: least %g <= cap %g", names[n], least, caps[c]);
                    o.max_act_bytes = least;
                    CHECK(xmp_sched_generate_named(names[n], R, V, M, &o, &s, err, sizeof(err)) ==
                              0,
                          "%s: cap at the named minimum %g refused: %s", names[n], least, err);
                    xmp_sched_destroy(s);
                    s = NULL;
                    if (c == 6)
                        printf("%-24s cap %6.0f B refused: %s\n", names[n], caps[c], err);
                }
            }
        }
        xmp_sched_destroy(free_s);
    }
    xmp_gen_opts_t o;
    memset(&o, 0, sizeof(o));
    o.max_act_bytes = 100;
    xmp_schedule_t *s = NULL;
    CHECK(xmp_sched_generate_named("1f1b", 2, 1, 4, &o, &s, err, sizeof(err)) != 0 &&
              strstr(err, "needs act_bytes"),
          "%s", err);
}

int main(int argc, char **argv)
{
    const char *only = argc > 1 ? argv[1] : "";
    if (!*only || strstr(only, "grid"))
        test_grid();
    if (!*only || strstr(only, "bubble"))
        test_bubbles();
    if (!*only || strstr(only, "map"))
        test_maps();
    if (!*only || strstr(only, "refus"))
        test_refusals();
    if (!*only || strstr(only, "recomp"))
        test_recompute();
    if (!*only || strstr(only, "cap"))
        test_memory_cap();
    xmp_schedule_t *s = NULL;
    if (xmp_sched_generate_named("zb-v", 2, 2, 4, NULL, &s, err, sizeof(err)) == 0) {
        xmp_sim_result_t res;
        xmp_sched_fprint(s, stdout);
        sim(s, 1, 1, 1, 0, &res);
        xmp_sim_render(s, &res, 72, stdout);
        xmp_sim_result_free(&res);
        xmp_sched_destroy(s);
    }
    if (xmp_sched_generate_named("interleaved-1f1b", 4, 2, 8, NULL, &s, err, sizeof(err)) == 0) {
        xmp_sim_result_t res;
        sim(s, 1, 1.5, 0.5, 0, &res);
        xmp_sim_render(s, &res, 96, stdout);
        xmp_sim_result_free(&res);
        xmp_sched_destroy(s);
    }
    printf("%d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
