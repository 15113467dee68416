/* Pipeline schedules: generators, text form, validator, dry run, simulator. */
#include "sched/schedule.h"
#include "sched_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Index of the first action of `kind` (and mb if >= 0) on stage st, -1 if none. */
static int find(const xmp_schedule_t *s, int st, int kind, int mb)
{
    for (int j = 0; j < s->len[st]; j++)
        if (s->acts[st][j].kind == kind && (mb < 0 || s->acts[st][j].mb == mb))
            return j;
    return -1;
}

static int warmup(const xmp_schedule_t *s, int st)
{
    int n = 0;
    for (int j = 0; j < s->len[st]; j++) {
        int k = s->acts[st][j].kind;
        if (k == XMP_ACT_B || k == XMP_ACT_I)
            break;
        n += k == XMP_ACT_F;
    }
    return n;
}

static int expected_warmup(int kind, int S, int M, int st)
{
    int w = kind == XMP_SCHED_GPIPE ? M : kind == XMP_SCHED_1F1B ? S - st : 2 * (S - st) - 1;
    return w < M ? w : M;
}

static void check_delay(const xmp_schedule_t *s)
{
    for (int st = 0; st < s->nstages; st++) {
        int R = find(s, st, XMP_ACT_R, -1);
        CHECK(find(s, st, XMP_ACT_B, -1) < 0, "%s stage %d has B with delay_wgrad", s->name, st);
        for (int m = 0; m < s->nmb; m++) {
            int i = find(s, st, XMP_ACT_I, m), w = find(s, st, XMP_ACT_W, m);
            CHECK(i >= 0 && w > i && w < R, "%s stage %d mb %d: I at %d W at %d R at %d", s->name,
                  st, m, i, w, R);
        }
    }
}

static void test_generators(void)
{
    const int Ms[] = {1, 2, 3, 4, 5, 8, 13};
    for (int S = 2; S <= 4; S++)
        for (int mi = 0; mi < 7; mi++)
            for (int kind = 0; kind < 3; kind++)
                for (int dw = 0; dw < 2; dw++) {
                    int M = Ms[mi];
                    xmp_sedge_t edges[8];
                    int ne = xmp_sched_chain_edges(S, edges);
                    xmp_gen_opts_t o = {0};
                    o.delay_wgrad = dw;
                    xmp_schedule_t *s = NULL;
                    int r = xmp_sched_generate(kind, S, M, ne, edges, &o, &s, err, sizeof(err));
                    if (kind != XMP_SCHED_GPIPE && M < S) {
                        CHECK(r != 0 && strstr(err, "M=") != NULL,
                              "%s S=%d M=%d must be refused with a message (got '%s')",
                              xmp_sched_kind_name(kind), S, M, err);
                        continue;
                    }
                    CHECK(r == 0, "%s S=%d M=%d dw=%d: %s", xmp_sched_kind_name(kind), S, M, dw,
                          err);
                    if (r != 0)
                        continue;
                    CHECK(xmp_sched_validate(s, NULL, 0, err, sizeof(err)) == 0, "validate %s",
                          err);
                    CHECK(xmp_sched_dryrun(s, 0, err, sizeof(err)) == 0, "dryrun %s S=%d M=%d: %s",
                          s->name, S, M, err);
                    CHECK(xmp_sched_dryrun(s, 1, err, sizeof(err)) == 0,
                          "blocking dryrun %s S=%d M=%d: %s", s->name, S, M, err);
                    for (int st = 0; st < S; st++)
                        CHECK(warmup(s, st) == expected_warmup(kind, S, M, st),
                              "%s S=%d M=%d stage %d warm-up %d, expected %d", s->name, S, M, st,
                              warmup(s, st), expected_warmup(kind, S, M, st));
                    if (dw)
                        check_delay(s);
                    roundtrip(s);
                    xmp_sched_destroy(s);
                }
}

static void test_nonadjacent(void)
{
    /* 0>1, 1>2, 0>2 (skip), and a 4-stage U shape 0>1,1>2,2>3,0>3,1>2 twice. */
    xmp_sedge_t g3[3] = {{0, 1}, {1, 2}, {0, 2}};
    xmp_sedge_t g4[5] = {{0, 1}, {1, 2}, {2, 3}, {1, 2}, {0, 3}};
    for (int kind = 0; kind < 3; kind++)
        for (int dw = 0; dw < 2; dw++) {
            xmp_gen_opts_t o = {0};
            o.delay_wgrad = dw;
            xmp_schedule_t *s = NULL;
            int r = xmp_sched_generate(kind, 3, 4, 3, g3, &o, &s, err, sizeof(err));
            CHECK(r == 0, "skip graph %d: %s", kind, err);
            if (r != 0)
                continue;
            for (int m = 0; m < 4; m++) {
                int f0 = find(s, 0, XMP_ACT_F, m);
                int sa = -1, wa = -1, f2 = find(s, 2, XMP_ACT_F, m);
                for (int j = 0; j < s->len[0]; j++)
                    if (s->acts[0][j].kind == XMP_ACT_START && s->acts[0][j].edge == 2 &&
                        s->acts[0][j].dir == XMP_DIR_ACT && s->acts[0][j].mb == m)
                        sa = j;
                for (int j = 0; j < s->len[2]; j++)
                    if (s->acts[2][j].kind == XMP_ACT_WAIT && s->acts[2][j].edge == 2 &&
                        s->acts[2][j].dir == XMP_DIR_ACT && s->acts[2][j].mb == m)
                        wa = j;
                CHECK(sa > f0 && wa >= 0 && wa < f2, "skip edge mb %d: F0@%d SA@%d WA@%d F2@%d", m,
                      f0, sa, wa, f2);
            }
            roundtrip(s);
            xmp_sched_destroy(s);
            r = xmp_sched_generate(kind, 4, 6, 5, g4, &o, &s, err, sizeof(err));
            CHECK(r == 0, "U graph %d: %s", kind, err);
            xmp_sched_destroy(s);
        }
    /* bad edges are refused */
    xmp_sedge_t bad[1] = {{1, 1}};
    xmp_schedule_t *s = NULL;
    CHECK(xmp_sched_generate(0, 2, 2, 1, bad, NULL, &s, err, sizeof(err)) != 0 &&
              strstr(err, "1>1") != NULL,
          "self edge: %s", err);
}

/* Every stage f, b_i, w; cx[plan] seconds per transfer (16 plans); share: share_nic. */
static double run_sim_x(xmp_schedule_t *s, double f, double b_i, double w, const double *cx,
                        int share, xmp_sim_result_t *res)
{
    double cf[8], ci[8], cw[8];
    for (int i = 0; i < 8; i++) {
        cf[i] = f;
        ci[i] = b_i;
        cw[i] = w;
    }
    xmp_sim_costs_t c;
    memset(&c, 0, sizeof(c));
    c.f = cf;
    c.i = ci;
    c.w = cw;
    c.xfer = cx;
    c.share_nic = share;
    int r = xmp_sim_run(s, &c, res, err, sizeof(err));
    CHECK(r == 0, "sim: %s %s", err, r == 1 ? res->msg : "");
    return res->step_s;
}

static double run_sim(xmp_schedule_t *s, double f, double b_i, double w, double x,
                      xmp_sim_result_t *res)
{
    double cx[16];
    for (int i = 0; i < 16; i++)
        cx[i] = x;
    return run_sim_x(s, f, b_i, w, cx, 0, res);
}

static void test_sim(void)
{
    for (int S = 2; S <= 4; S++)
        for (int M = S; M <= 8; M += 3)
            for (int kind = 0; kind < 2; kind++) {
                xmp_sedge_t edges[8];
                int ne = xmp_sched_chain_edges(S, edges);
                xmp_schedule_t *s = NULL;
                if (xmp_sched_generate(kind, S, M, ne, edges, NULL, &s, err, sizeof(err)) != 0) {
                    CHECK(0, "%s", err);
                    continue;
                }
                xmp_sim_result_t res;
                /* f = 1, b = 2 (i = 1.5, w = 0.5), no transfer time */
                double step = run_sim(s, 1.0, 1.5, 0.5, 0.0, &res);
                CHECK(step == (M + S - 1) * 3.0, "%s S=%d M=%d: step %.17g expected %d", s->name, S,
                      M, step, (M + S - 1) * 3);
                double bub = 1.0 - M * 3.0 / step;
                CHECK(res.bubble[0] > bub - 1e-12 && res.bubble[0] < bub + 1e-12,
                      "bubble %.17g expected %.17g", res.bubble[0], bub);
                for (int st = 0; st < S; st++)
                    CHECK(res.peak_act[st] == expected_warmup(kind, S, M, st),
                          "%s stage %d peak %d", s->name, st, res.peak_act[st]);
                xmp_sim_result_free(&res);
                xmp_sched_destroy(s);
            }
    /* S=2 M=1 GPipe, f=1 b=2 x=0.5: F0 [0,1] A [1,1.5] F0 [1.5,2.5] B0 [2.5,4.5]
     * G [4.5,5] B0 [5,7]. */
    xmp_sedge_t e1[1] = {{0, 1}};
    xmp_schedule_t *s = NULL;
    CHECK(xmp_sched_generate(XMP_SCHED_GPIPE, 2, 1, 1, e1, NULL, &s, err, sizeof(err)) == 0, "%s",
          err);
    xmp_sim_result_t res;
    double step = run_sim(s, 1.0, 1.5, 0.5, 0.5, &res);
    CHECK(step == 7.0, "step %.17g expected 7", step);
    CHECK(res.busy_s[0] == 3.0 && res.busy_s[1] == 3.0, "busy %g %g", res.busy_s[0], res.busy_s[1]);
    xmp_sim_result_free(&res);
    xmp_sched_destroy(s);
    /* Two microbatches serialize on one plan: S=2 M=2 GPipe, f=1, b=2, x=3:
     * stage 0 F0 [0,1] F1 [1,2]; A0 [1,4]; A1 [4,7] (FIFO, not [2,5]);
     * stage 1 F0 [4,5] F1 [7,8] B0 [8,10] B1 [10,12]; G0 [10,13] G1 [13,16];
     * stage 0 B0 [13,15] B1 [16,18]. */
    CHECK(xmp_sched_generate(XMP_SCHED_GPIPE, 2, 2, 1, e1, NULL, &s, err, sizeof(err)) == 0, "%s",
          err);
    step = run_sim(s, 1.0, 1.5, 0.5, 3.0, &res);
    CHECK(step == 18.0, "FIFO step %.17g expected 18", step);
    xmp_sim_result_free(&res);
    xmp_sched_destroy(s);

    /* eager-1F1B holds at least as many activations as 1F1B, and hides transfers */
    for (int S = 2; S <= 4; S++) {
        xmp_sedge_t edges[8];
        int ne = xmp_sched_chain_edges(S, edges);
        xmp_schedule_t *a = NULL, *b = NULL;
        xmp_sched_generate(XMP_SCHED_1F1B, S, 8, ne, edges, NULL, &a, err, sizeof(err));
        xmp_sched_generate(XMP_SCHED_EAGER_1F1B, S, 8, ne, edges, NULL, &b, err, sizeof(err));
        xmp_sim_result_t ra, rb;
        double sa = run_sim(a, 1.0, 1.0, 1.0, 0.5, &ra);
        double sb = run_sim(b, 1.0, 1.0, 1.0, 0.5, &rb);
        for (int st = 0; st < S; st++)
            CHECK(rb.peak_act[st] >= ra.peak_act[st], "S=%d stage %d eager peak %d < 1f1b %d", S,
                  st, rb.peak_act[st], ra.peak_act[st]);
        CHECK(sb <= sa, "S=%d eager step %g > 1f1b %g with transfers", S, sb, sa);
        if (S == 4) {
            printf("1F1B vs eager-1F1B, S=4 M=8 f=i=w=1 x=0.5:\n");
            xmp_sim_render(a, &ra, 72, stdout);
            xmp_sim_render(b, &rb, 72, stdout);
        }
        xmp_sim_result_free(&ra);
        xmp_sim_result_free(&rb);
        xmp_sched_destroy(a);
        xmp_sched_destroy(b);
    }
}

static void test_checks(void)
{
    /* deadlock: stage 0 waits for the gradient before its first forward */
    const char *dl = "schedule dead S=2 M=1 edges=0>1\n"
                     "s0 inflight<=1: SG0.e0 WG0.e0 F0 SA0.e0 WA0.e0 B0 R O\n"
                     "s1 inflight<=1: SA0.e0 WA0.e0 F0 B0 SG0.e0 WG0.e0 R O\n";
    xmp_schedule_t *s = NULL;
    CHECK(xmp_sched_parse(dl, &s, err, sizeof(err)) == 0, "%s", err);
    if (s) {
        CHECK(xmp_sched_validate(s, NULL, 0, err, sizeof(err)) == 0, "%s", err);
        int r = xmp_sched_dryrun(s, 0, err, sizeof(err));
        CHECK(r == 1 && strstr(err, "stage 0 stuck at action 1 'WG0.e0'") &&
                  strstr(err, "stage 1 stuck at action 1 'WA0.e0'"),
              "deadlock report: %d %s", r, err);
        xmp_sched_destroy(s);
    }
    struct {
        const char *text, *want;
    } bad[] = {
        {"schedule x S=1 M=2 edges=-\ns0 inflight<=2: F0 F1 B0 R O\n", "B1"},
        {"schedule x S=1 M=1 edges=-\ns0 inflight<=1: F0 W0 I0 R O\n", "W before I0"},
        {"schedule x S=1 M=1 edges=-\ns0 inflight<=1: B0 F0 R O\n", "before F0"},
        {"schedule x S=1 M=2 edges=-\ns0 inflight<=1: F0 F1 B0 B1 R O\n", "bound is 1"},
        {"schedule x S=1 M=1 edges=-\ns0 inflight<=1: F0 R B0 O\n", "after R"},
        {"schedule x S=2 M=1 edges=0>1\ns0 inflight<=1: F0 SA0.e0 WA0.e0 SG0.e0 WG0.e0 B0 R O\n"
         "s1 inflight<=1: SA0.e0 F0 WA0.e0 B0 SG0.e0 WG0.e0 R O\n",
         "no WA0.e0 before"},
        {"schedule x S=2 M=1 edges=0>1\ns0 inflight<=1: WA0.e0 F0 SA0.e0 SG0.e0 WG0.e0 B0 R O\n"
         "s1 inflight<=1: SA0.e0 WA0.e0 F0 B0 SG0.e0 WG0.e0 R O\n",
         "wait before start"},
        {"schedule x S=2 M=2 edges=0>1\ns0 inflight<=2: F0 F1 SA1.e0 SA0.e0 R O\n"
         "s1 inflight<=2: R O\n",
         "microbatch order"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        s = NULL;
        int r = xmp_sched_parse(bad[i].text, &s, err, sizeof(err));
        CHECK(r == 0, "case %zu parse: %s", i, err);
        if (r != 0)
            continue;
        err[0] = '\0';
        CHECK(xmp_sched_validate(s, NULL, 0, err, sizeof(err)) != 0 && strstr(err, bad[i].want),
              "case %zu: want '%s', got '%s'", i, bad[i].want, err);
        xmp_sched_destroy(s);
    }
    /* parse errors name the bad token */
    CHECK(xmp_sched_parse("schedule x S=1 M=1 edges=-\ns0 inflight<=1: F0 Q7\n", &s, err,
                          sizeof(err)) != 0 &&
              strstr(err, "'Q7'"),
          "bad token: %s", err);
    /* layer map */
    xmp_sedge_t e1[1] = {{0, 1}};
    CHECK(xmp_sched_generate(XMP_SCHED_1F1B, 2, 2, 1, e1, NULL, &s, err, sizeof(err)) == 0, "%s",
          err);
    int good[4] = {0, 0, 1, 1}, out[4] = {0, 0, 2, 1}, empty[4] = {0, 0, 0, 0};
    CHECK(xmp_sched_validate(s, good, 4, err, sizeof(err)) == 0, "%s", err);
    CHECK(xmp_sched_validate(s, out, 4, err, sizeof(err)) != 0 && strstr(err, "layer 2"), "%s",
          err);
    CHECK(xmp_sched_validate(s, empty, 4, err, sizeof(err)) != 0 && strstr(err, "stage 1"), "%s",
          err);
    xmp_sched_destroy(s);
    /* kinds */
    CHECK(xmp_sched_kind_parse("eager-1f1b") == XMP_SCHED_EAGER_1F1B, "kind");
    CHECK(xmp_sched_kind_parse("nope") == -1, "kind");
}

/* share_nic: the transfers out of a group take its NICs one at a time, and so do those into
 * a group; transfers between chunks of one group take none. */
static double sim_nic(xmp_schedule_t *s, double x, int share)
{
    double cx[16];
    for (int i = 0; i < 16; i++)
        cx[i] = x;
    xmp_sim_result_t res;
    double step = run_sim_x(s, 1, 1.5, 0.5, cx, share, &res);
    xmp_sim_result_free(&res);
    return step;
}

static void test_share_nic(void)
{
    /* two edges 0>1 (a skip beside the main path), GPipe M=1, f 1, b 2, x 1: own links: F
     * [0,1], both A [1,2], F [2,3] B [3,5], both G [5,6], B [6,8]; shared: A [1,2] [2,3], F
     * [3,4] B [4,6], G [6,7] [7,8], B [8,10] */
    xmp_sedge_t two[2] = {{0, 1}, {0, 1}};
    xmp_schedule_t *s = NULL;
    CHECK(xmp_sched_generate(XMP_SCHED_GPIPE, 2, 1, 2, two, NULL, &s, err, sizeof(err)) == 0, "%s",
          err);
    double own = sim_nic(s, 1.0, 0), shared = sim_nic(s, 1.0, 1);
    CHECK(own == 8.0 && shared == 10.0, "two edges: own links %.17g (want 8), shared %.17g (10)",
          own, shared);
    xmp_sched_destroy(s);
    /* a chain: activations and gradients of one link go opposite ways (full duplex): GPipe S=2
     * is the same either way */
    xmp_sedge_t e1[1] = {{0, 1}};
    CHECK(xmp_sched_generate(XMP_SCHED_GPIPE, 2, 2, 1, e1, NULL, &s, err, sizeof(err)) == 0, "%s",
          err);
    own = sim_nic(s, 3.0, 0);
    shared = sim_nic(s, 3.0, 1);
    CHECK(own == 18.0 && shared == 18.0, "S=2 chain: %.17g %.17g (want 18)", own, shared);
    xmp_sched_destroy(s);
    /* eager-1F1B S=3 M=4, x = 2.5: the middle stage sends activations forward and gradients
     * back through one NIC, so sharing costs time (32.5 against 30), and never saves any */
    xmp_sedge_t e3[2];
    xmp_sched_chain_edges(3, e3);
    CHECK(xmp_sched_generate(XMP_SCHED_EAGER_1F1B, 3, 4, 2, e3, NULL, &s, err, sizeof(err)) == 0,
          "%s", err);
    own = sim_nic(s, 2.5, 0);
    shared = sim_nic(s, 2.5, 1);
    CHECK(own == 30.0 && shared == 32.5,
          "S=3 eager-1F1B: shared %.17g (want 32.5), own links "
          "%.17g (30)",
          shared, own);
    for (double x = 0.5; x <= 4; x += 0.5)
        CHECK(sim_nic(s, x, 1) >= sim_nic(s, x, 0), "x %g: sharing saved time", x);
    CHECK(sim_nic(s, 0.0, 1) == sim_nic(s, 0.0, 0), "no transfer time: sharing changes the step");
    xmp_sched_destroy(s);
    /* virtual stages: the V shape's turn (stage 1 > 2 on group 1) uses no NIC: with transfers
     * only on that edge, sharing changes nothing */
    int map[4];
    xmp_sched_vshape_map(2, map);
    xmp_sedge_t e4[3];
    xmp_sched_chain_edges(4, e4);
    s = NULL;
    CHECK(xmp_sched_generate_map(XMP_SCHED_V_1F1B, 4, 2, map, 4, 3, e4, NULL, &s, err,
                                 sizeof(err)) == 0,
          "%s", err);
    if (s) {
        double cx[16] = {0};
        cx[xmp_plan_index(1, XMP_DIR_ACT)] = cx[xmp_plan_index(1, XMP_DIR_GRAD)] = 2;
        xmp_sim_result_t r0, r1;
        double a = run_sim_x(s, 1, 1.5, 0.5, cx, 0, &r0), b = run_sim_x(s, 1, 1.5, 0.5, cx, 1, &r1);
        CHECK(a == b, "V turn: %.17g vs %.17g", a, b);
        xmp_sim_result_free(&r0);
        xmp_sim_result_free(&r1);
        xmp_sched_destroy(s);
    }
}

/* The start times of stage st's compute actions of `kind` (F or B) for mb 0..M-1 in res. */
static void starts_of(const xmp_sim_result_t *res, int st, int kind, int M, double *t)
{
    for (int m = 0; m < M; m++)
        t[m] = -1;
    for (int j = 0; j < res->len[st]; j++)
        if (res->acts[st][j].kind == kind && res->acts[st][j].mb >= 0 && res->acts[st][j].mb < M)
            t[res->acts[st][j].mb] = res->t0[st][j];
}

/* Simulates kind on the chain of S stages, M microbatches, f 1 and b 2 on every stage, every
 * transfer x seconds, NICs shared, burst (nic_burst_s) beta; checks the step and, when given,
 * each stage's F and B start times (want_f / want_b: [S][M], row-major). */
static void check_timeline(const char *what, int kind, int S, int M, double x, double beta,
                           double want_step, const double *want_f, const double *want_b)
{
    xmp_sedge_t e[8];
    int ne = xmp_sched_chain_edges(S, e);
    xmp_schedule_t *s = NULL;
    CHECK(xmp_sched_generate(kind, S, M, ne, e, NULL, &s, err, sizeof(err)) == 0, "%s: %s", what,
          err);
    if (s == NULL)
        return;
    double cf[8], cb[8], cx[16];
    for (int i = 0; i < 8; i++) {
        cf[i] = 1;
        cb[i] = 2;
    }
    for (int i = 0; i < 16; i++)
        cx[i] = x;
    xmp_sim_costs_t c;
    memset(&c, 0, sizeof(c));
    c.f = cf;
    c.b = cb;
    c.xfer = cx;
    c.share_nic = 1;
    c.nic_burst_s = beta;
    xmp_sim_result_t res;
    int r = xmp_sim_run(s, &c, &res, err, sizeof(err));
    CHECK(r == 0, "%s: sim %s", what, err);
    if (r == 0) {
        CHECK(res.step_s == want_step, "%s: step %.17g, want %g", what, res.step_s, want_step);
        for (int st = 0; st < S; st++) {
            double tf[16], tb[16];
            starts_of(&res, st, XMP_ACT_F, M, tf);
            starts_of(&res, st, XMP_ACT_B, M, tb);
            for (int m = 0; m < M; m++) {
                if (want_f)
                    CHECK(tf[m] == want_f[st * M + m], "%s: stage %d F%d starts at %g, want %g",
                          what, st, m, tf[m], want_f[st * M + m]);
                if (want_b)
                    CHECK(tb[m] == want_b[st * M + m], "%s: stage %d B%d starts at %g, want %g",
                          what, st, m, tb[m], want_b[st * M + m]);
            }
        }
        xmp_sim_result_free(&res);
    }
    xmp_sched_destroy(s);
}

/* Hand-computed timelines (issue 40): f 1, b 2 on every stage, transfers of x each way, the
 * receive of microbatch m+1 posted after the wait of m (as the driver runs the lists), one
 * transfer per plan at a time (FIFO), the NICs shared. */
static void test_timelines(void)
{
    /* GPipe S=4 M=4, x 1, no burst. Forwards: stage s runs F m at 2s + m (each boundary adds
     * one transfer, the sends of one stage go back to back: A m on e_s is [2s+m+1, 2s+m+2]).
     * Stage 3: F [6,7] [7,8] [8,9] [9,10], B [10,12] [12,14] [14,16] [16,18]; each G takes 1,
     * so stage s's B m starts at 10 + 3(3-s) + 2m: 19 21 23 25 on stage 0, step 27
     * = (M + S - 1)(f + b) + 2(S - 1)x = 21 + 6. */
    const double g_f[16] = {0, 1, 2, 3, 2, 3, 4, 5, 4, 5, 6, 7, 6, 7, 8, 9};
    const double g_b[16] = {19, 21, 23, 25, 16, 18, 20, 22, 13, 15, 17, 19, 10, 12, 14, 16};
    check_timeline("gpipe S=4 M=4 x=1", XMP_SCHED_GPIPE, 4, 4, 1, 0, 27, g_f, g_b);
    /* 1F1B S=4 M=4, x 1, no burst: warm-ups 4, 3, 2, 1. Stage 2 runs F0 [4,5] F1 [5,6], then
     * waits for G0 (stage 3: F0 [6,7] B0 [7,9], G0 [9,10]): B0 [10,12], F2 [12,13], A2 [13,14];
     * stage 3 ran F1 [9,10] B1 [10,12] and idles 2x for A2 (the boundary round trip): F2
     * [14,15] B2 [15,17], G2 [17,18]; stage 2: B1 [13,15] F3 [17,18] (A3 from stage 1: F3
     * [15,16], A3 [16,17]), A3 [18,19]; stage 3 idles again: F3 [19,20] B3 [20,22]. Stage 2:
     * B2 [18,20] B3 [23,25]; stage 1: B0 [13,15] B1 [16,18] B2 [21,23] B3 [26,28]; stage 0:
     * B0 [16,18] B1 [19,21] B2 [24,26] B3 [29,31]: step 31 against GPipe's 27, the two round
     * trips of 2x on stage 3 (and their echo upstream). */
    const double o_f[16] = {0, 1, 2, 3, 2, 3, 4, 15, 4, 5, 12, 17, 6, 9, 14, 19};
    const double o_b[16] = {16, 19, 24, 29, 13, 16, 21, 26, 10, 13, 18, 23, 7, 10, 15, 20};
    check_timeline("1f1b S=4 M=4 x=1", XMP_SCHED_1F1B, 4, 4, 1, 0, 31, o_f, o_b);
    /* NIC burst (token buckets of beta 1 s, full at the start), S=2, x 2.
     * GPipe M=2: A0 [1,2] (credit 1: takes 2 - 1), buckets empty; A1 ready at 2, no credit:
     * [2,4]. Stage 1: F0 [2,3] F1 [4,5] B0 [5,7] B1 [7,9]; G0 at 7 on stage 1's idle outgoing
     * and stage 0's idle incoming NIC (full): [7,8]; G1 at 9, one second of credit regained on
     * both: [9,10]. Stage 0: B0 [8,10] B1 [10,12]: step 12 (14 without the burst). */
    const double b2_f[4] = {0, 1, 2, 4}, b2_b[4] = {8, 10, 5, 7};
    check_timeline("gpipe S=2 M=2 x=2 burst 1", XMP_SCHED_GPIPE, 2, 2, 2, 1, 12, b2_f, b2_b);
    /* without the burst: A0 [1,3] A1 [3,5]; stage 1 F0 [3,4] F1 [5,6] B0 [6,8] B1 [8,10]; G0
     * [8,10] G1 [10,12]; stage 0 B0 [10,12] B1 [12,14] */
    const double n2_f[4] = {0, 1, 3, 5}, n2_b[4] = {10, 12, 6, 8};
    check_timeline("gpipe S=2 M=2 x=2", XMP_SCHED_GPIPE, 2, 2, 2, 0, 14, n2_f, n2_b);
    /* 1F1B S=2 M=2 (stage 1: F0 B0 F1 B1), burst 1: A0 [1,2], A1 [2,4]; stage 1 F0 [2,3] B0
     * [3,5]; G0 (idle NICs, full) [5,6]; F1 [5,6] B1 [6,8]; G1 at 8, both buckets regained
     * min(1, 8 - 6) = 1: [8,9]; stage 0 B0 [6,8] B1 [9,11]: step 11. Without: A0 [1,3] A1
     * [3,5]; F0 [3,4] B0 [4,6]; G0 [6,8]; F1 [6,7] B1 [7,9]; G1 [9,11]; B0 [8,10] B1 [11,13]:
     * step 13. */
    const double o2_f[4] = {0, 1, 2, 5}, o2_b[4] = {6, 9, 3, 6};
    check_timeline("1f1b S=2 M=2 x=2 burst 1", XMP_SCHED_1F1B, 2, 2, 2, 1, 11, o2_f, o2_b);
    const double p2_f[4] = {0, 1, 3, 6}, p2_b[4] = {8, 11, 4, 7};
    check_timeline("1f1b S=2 M=2 x=2", XMP_SCHED_1F1B, 2, 2, 2, 0, 13, p2_f, p2_b);
    /* a burst never makes a step longer, and one of 0 changes nothing */
    for (int kind = 0; kind < 3; kind++)
        for (int S = 2; S <= 4; S++)
            for (int M = S; M <= 8; M += 2) {
                xmp_sedge_t e[8];
                int ne = xmp_sched_chain_edges(S, e);
                xmp_schedule_t *s = NULL;
                if (xmp_sched_generate(kind, S, M, ne, e, NULL, &s, err, sizeof(err)) != 0)
                    continue;
                double cx[16];
                for (int i = 0; i < 16; i++)
                    cx[i] = 1.5;
                xmp_sim_result_t r0, r1;
                double a = run_sim_x(s, 1, 1.5, 0.5, cx, 1, &r0);
                xmp_sim_costs_t c;
                double cf[8], ci[8], cw[8];
                for (int i = 0; i < 8; i++) {
                    cf[i] = 1;
                    ci[i] = 1.5;
                    cw[i] = 0.5;
                }
                memset(&c, 0, sizeof(c));
                c.f = cf;
                c.i = ci;
                c.w = cw;
                c.xfer = cx;
                c.share_nic = 1;
                c.nic_burst_s = 0.75;
                int rr = xmp_sim_run(s, &c, &r1, err, sizeof(err));
                double b = rr == 0 ? r1.step_s : -1;
                CHECK(b > 0 && b <= a, "%s S=%d M=%d: burst step %g, without %g",
                      xmp_sched_kind_name(kind), S, M, b, a);
                xmp_sim_result_free(&r0);
                if (rr >= 0) /* -1: freed by xmp_sim_run */
                    xmp_sim_result_free(&r1);
                xmp_sched_destroy(s);
            }
}

int main(void)
{
    test_generators();
    test_nonadjacent();
    test_sim();
    test_share_nic();
    test_timelines();
    test_checks();
    xmp_sedge_t e[1] = {{0, 1}};
    xmp_schedule_t *s = NULL;
    xmp_gen_opts_t o = {0};
    o.delay_wgrad = 1;
    if (xmp_sched_generate(XMP_SCHED_EAGER_1F1B, 2, 4, 1, e, &o, &s, err, sizeof(err)) == 0) {
        xmp_sched_fprint(s, stdout);
        xmp_sched_destroy(s);
    }
    if (failures) {
        fprintf(stderr, "%d failures in %d checks\n", failures, checks);
        return 1;
    }
    printf("all schedule tests passed (%d checks)\n", checks);
    return 0;
}
