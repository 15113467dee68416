/*
 * pipeline.search.eltwise (unit, one process): the layout search's element-wise compute term
 * (issue 21; docs/SEARCH.md "Compute").
 *  - the cluster file's [compute] eltwise records: parsed (ns -> s), written and parsed back
 *    to the same values, malformed ones refused naming the line and the field (unknown kind,
 *    wrong field count, negative time, busy 0, a repeated kind), the model untouched;
 *  - the search's figures by hand on one rank (no collectives): with every eltwise rate set,
 *    forward, backward and optimizer time grow by exactly the units of each kernel x its rate
 *    (GELU, layer norms, residual sums, embedding sum, cross-entropy, AdamW), and the
 *    attention products priced as sgemm without the record are priced by the attention
 *    record instead;
 *  - the chain DP still equals exhaustive enumeration with the records set (small problem);
 *  - collective fits keep alpha >= 0: points on a line with a negative intercept give alpha 0
 *    and the weighted slope through the origin (by hand); a positive intercept is kept;
 *  - measured collective points (`points` records): interpolated for their own geometry
 *    (below, between, above the measured sizes, by hand), the fit for another geometry, round
 *    trip, errors (before the fit, sizes not increasing, a malformed pair);
 *  - --overlap defer-grad: dp on 2 ranks, R shrinks by (parameter tensors - 1) x alpha (the
 *    reductions' latencies overlap), --ablate overlap undoes it, the command line says it;
 *  - the gptstep record (a measured serial GPT-2 step): parsed, written and parsed back,
 *    malformed ones refused naming the field; the search prices the probe model itself at
 *    exactly the measured seconds (its compute + optimizer scaled by measured / composed), every
 *    compute time of another configuration scales by the same factor while its collectives do
 *    not, and no_step (--ablate step) gives factor 1 and the kernel records' figures.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/gpt2_par.h"
#include "sched/schedule.h"
#include "search/search.h"
#include "xm_cluster_file.h"
#include "xm_costmodel.h"

static int g_fail;
#define CHECK(c, ...)                                                                              \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #c);                           \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            g_fail++;                                                                              \
        }                                                                                          \
    } while (0)

static int near(double a, double b)
{
    return fabs(a - b) <= 1e-9 * fmax(fabs(a), fabs(b)) + 1e-15;
}

/* A cluster text refused with INVALID_ARGUMENT, the output untouched, the message naming want. */
typedef struct {
    const char *text, *want;
} bad_t;

static void check_bad(const bad_t *bad, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        xm_costmodel_t *sentinel = (xm_costmodel_t *)&g_fail, *out = sentinel;
        xmesh_result_t r = xmp_costmodel_parse(bad[i].text, &out);
        CHECK(r == XMESH_ERR_INVALID_ARGUMENT && out == sentinel, "bad %zu: result %d", i, (int)r);
        CHECK(strstr(xmesh_last_error(), bad[i].want), "bad %zu: message '%s', expected '%s'", i,
              xmesh_last_error(), bad[i].want);
    }
}

/* m written and parsed back (NULL when either fails: a failure is recorded). */
static xm_costmodel_t *round_trip(const xm_costmodel_t *m)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *mf = open_memstream(&buf, &len);
    CHECK(mf && xm_costmodel_write(m, mf) == XMESH_SUCCESS, "write: %s", xmesh_last_error());
    if (mf)
        fclose(mf);
    xm_costmodel_t *m2 = NULL;
    CHECK(buf && xmp_costmodel_parse(buf, &m2) == XMESH_SUCCESS, "re-parse: %s\n%s",
          xmesh_last_error(), buf ? buf : "");
    free(buf);
    return m2;
}

static void test_parse(void)
{
    const char *ok = "[compute]\n"
                     "sgemm 4 4 4 2 0.001 x\n"
                     "eltwise gelu 2 10 20\n"
                     "eltwise adamw 2 3.5 0\n";
    xm_costmodel_t *m = NULL;
    CHECK(xm_costmodel_parse(ok, &m) == XMESH_SUCCESS && m, "%s", xmesh_last_error());
    if (m) {
        CHECK(m->elt[XM_ELT_GELU].busy == 2 && near(m->elt[XM_ELT_GELU].fwd, 10e-9) &&
                  near(m->elt[XM_ELT_GELU].bwd, 20e-9),
              "gelu %d %g %g", m->elt[XM_ELT_GELU].busy, m->elt[XM_ELT_GELU].fwd,
              m->elt[XM_ELT_GELU].bwd);
        CHECK(m->elt[XM_ELT_LAYERNORM].busy == 0, "layernorm not in the file");
        double f = -1, b = -1;
        CHECK(xm_cost_elt(m, XM_ELT_GELU, 1000, &f, &b) == 1 && near(f, 1e-5) && near(b, 2e-5),
              "gelu 1000 units: %g %g", f, b);
        CHECK(xm_cost_elt(m, XM_ELT_LAYERNORM, 1000, &f, &b) == 0 && f == 0 && b == 0,
              "absent record: %g %g", f, b);
        f = 7;
        CHECK(xm_cost_elt(m, XM_ELT_GELU, -1, &f, NULL) == -1 && f == 7, "negative units");
        xm_costmodel_t *m2 = round_trip(m);
        for (int k = 0; m2 && k < XM_ELT_NKINDS; k++)
            CHECK(m2->elt[k].busy == m->elt[k].busy && near(m2->elt[k].fwd, m->elt[k].fwd) &&
                      near(m2->elt[k].bwd, m->elt[k].bwd),
                  "kind %s differs after the round trip", xm_elt_name((xm_elt_t)k));
        xm_costmodel_destroy(m2);
        xm_costmodel_destroy(m);
    }
    const bad_t bad[] = {
        {"[compute]\neltwise tanh 2 1 1\n", "line 2: eltwise field kind: unknown kind 'tanh'"},
        {"[compute]\neltwise gelu 2 1\n", "line 2: eltwise record has 4 fields, expected 5"},
        {"[compute]\neltwise gelu 2 -1 1\n", "line 2: eltwise gelu field fwd"},
        {"[compute]\neltwise gelu 0 1 1\n", "line 2: eltwise gelu field busy: 0"},
        {"[compute]\neltwise gelu 2 1 1\neltwise gelu 2 1 1\n",
         "line 3: eltwise gelu repeats line 2"},
    };
    check_bad(bad, sizeof bad / sizeof *bad);
}

static xm_cluster_t g_cl;

static void opts(xmp_search_opts_t *o, xm_costmodel_t *cm, int L, int NH, int C, int V, int B,
                 int T, int N)
{
    memset(o, 0, sizeof *o);
    o->model.num_layers = L;
    o->model.num_heads = NH;
    o->model.channels = C;
    o->model.max_seq_len = 64;
    o->model.vocab_size = V;
    o->model.padded_vocab_size = xmp_gpt2_pad_vocab(V, 128);
    o->vocab = V;
    o->B = B;
    o->T = T;
    o->nranks = N;
    o->hosts = 1;
    o->cost = cm;
    o->cluster = &g_cl;
    o->max_evals = 300;
}

/* One stage of L blocks on a 1-axis mesh of n ranks, dp, 1F1B, M = 1. */
static xmp_search_cand_t one_stage(int L, int n)
{
    xmp_search_cand_t c;
    memset(&c, 0, sizeof c);
    c.nstages = 1;
    c.M = 1;
    c.sched = XMP_SCHED_1F1B;
    c.nblocks[0] = L;
    c.ndim[0] = 1;
    c.shape[0][0] = n;
    c.strategy[0] = 0; /* dp */
    return c;
}

/* Rates (ns per unit) distinct per kind so a misplaced count shows. */
static const double RF[XM_ELT_NKINDS] = {3, 5, 7, 11, 13, 17},
                    RB[XM_ELT_NKINDS] = {19, 23, 29, 31, 37, 0};

static void test_terms(void)
{
    const double flops = 5e10;
    xm_costmodel_t *base = NULL, *el = NULL;
    CHECK(xm_costmodel_nominal(&g_cl, flops, &base) == XMESH_SUCCESS, "%s", xmesh_last_error());
    CHECK(xm_costmodel_nominal(&g_cl, flops, &el) == XMESH_SUCCESS, "%s", xmesh_last_error());
    if (!base || !el)
        goto out;
    for (int k = 0; k < XM_ELT_NKINDS; k++) {
        xm_elt_rec_t r = {1, RF[k] * 1e-9, RB[k] * 1e-9, 0};
        CHECK(xm_costmodel_set_elt(el, (xm_elt_t)k, &r) == XMESH_SUCCESS, "%s", xmesh_last_error());
    }
    const int L = 2, NH = 2, C = 32, V = 64, B = 2, T = 16;
    xmp_search_opts_t o0, o1;
    opts(&o0, base, L, NH, C, V, B, T, 1);
    opts(&o1, el, L, NH, C, V, B, T, 1);
    xmp_search_cand_t c0 = one_stage(L, 1), c1 = c0;
    char err[512];
    CHECK(xmp_search_gpt_eval(&o0, &c0, err, sizeof err) == 0, "%s", err);
    CHECK(xmp_search_gpt_eval(&o1, &c1, err, sizeof err) == 0, "%s", err);
    /* units per microbatch (M 1: the whole batch) on one rank */
    const double Vp = o0.model.padded_vocab_size, hs = C / NH, rows = (double)B * T;
    const double u[XM_ELT_NKINDS] = {
        [XM_ELT_GELU] = L * rows * 4 * C,
        [XM_ELT_LAYERNORM] = (2.0 * L + 1) * rows * C,        /* ln1, ln2 per block, lnf */
        [XM_ELT_ATTENTION] = (double)L * B * NH * T * T * hs, /* full square */
        [XM_ELT_XENT] = rows * Vp,                            /* the logits */
        [XM_ELT_RESIDUAL] = (2.0 * L + 1) * rows * C,         /* 2 per block + embedding */
        [XM_ELT_ADAMW] = 0,
    };
    double df = 0, db = 0;
    for (int k = 0; k < XM_ELT_NKINDS; k++) {
        df += u[k] * RF[k] * 1e-9;
        db += u[k] * RB[k] * 1e-9;
    }
    /* what the attention record replaces: scores and values as sgemm at the nominal rate,
     * forward 2 products of 2 T T hs flops per (batch, head), backward twice that */
    double att_gemm_f = (double)L * B * NH * 2 * (2.0 * T * T * hs) / flops;
    df -= att_gemm_f;
    db -= 2 * att_gemm_f;
    CHECK(near(c1.stage_f_s[0] - c0.stage_f_s[0], df), "forward grows by %.9g s, by hand %.9g s",
          c1.stage_f_s[0] - c0.stage_f_s[0], df);
    CHECK(near(c1.stage_b_s[0] - c0.stage_b_s[0], db), "backward grows by %.9g s, by hand %.9g s",
          c1.stage_b_s[0] - c0.stage_b_s[0], db);
    CHECK(near(c1.stage_compute_s[0] - c0.stage_compute_s[0], df + db),
          "compute grows by %.9g s, by hand %.9g s", c1.stage_compute_s[0] - c0.stage_compute_s[0],
          df + db);
    /* AdamW: every stored parameter element at the adamw rate (replacing 12 flop at the rate
     * of a 256^3 sgemm) */
    xmp_gpt2_param_info_t tab[XMP_GPT2_NUM_PARAM_TENSORS];
    size_t total = 0;
    xmp_gpt2_param_table(&o0.model, tab, &total);
    CHECK(near(c1.stage_o_s[0], (double)total * RF[XM_ELT_ADAMW] * 1e-9),
          "optimizer %.9g s, by hand %zu x %g ns = %.9g s", c1.stage_o_s[0], total,
          RF[XM_ELT_ADAMW], (double)total * RF[XM_ELT_ADAMW] * 1e-9);
    CHECK(near(c0.stage_o_s[0], 12.0 * (double)total / flops), "optimizer without the record %g",
          c0.stage_o_s[0]);
    CHECK(c1.step_s > c0.step_s, "step %g with the element-wise term, %g without", c1.step_s,
          c0.step_s);
    /* the DP still equals exhaustive enumeration with the records */
    opts(&o1, el, 3, 2, 32, 64, 4, 8, 4);
    for (int S = 1; S <= 2; S++)
        for (int M = 1; M <= 2; M++) {
            double dp = 0, ex = 0;
            long n = 0;
            int r = xmp_search_gpt_check(&o1, S, M, XMP_SCHED_1F1B, &dp, &ex, &n, err, sizeof err);
            CHECK(r == 0 && ((isinf(dp) && isinf(ex)) || near(dp, ex)),
                  "S %d M %d: dp %.12g exhaustive %.12g (%s)", S, M, dp, ex, r ? err : "");
        }
out:
    xm_costmodel_destroy(base);
    xm_costmodel_destroy(el);
}

static void test_fit_nonneg(void)
{
    /* all-reduce over 2 ranks: f(n) = 2 (p-1)/p n = n */
    const double n[3] = {1000, 2000, 4000},
                 y[3] = {1e-6 * 1000 - 5e-4, 1e-6 * 2000 - 5e-4, 1e-6 * 4000 - 5e-4};
    xm_fit_t f;
    CHECK(xm_coll_fit(XM_COLL_ALLREDUCE, 2, n, y, 3, &f) == XMESH_SUCCESS, "%s",
          xmesh_last_error());
    /* weights 1/y^2: beta = sum (x/y) / sum (x/y)^2 */
    double a = 0, b = 0;
    for (int i = 0; i < 3; i++) {
        a += n[i] / y[i];
        b += (n[i] / y[i]) * (n[i] / y[i]);
    }
    CHECK(f.alpha == 0 && near(f.beta, a / b),
          "negative intercept: alpha %g beta %.12g, by hand "
          "0 and %.12g",
          f.alpha, f.beta, a / b);
    double worst = 0;
    for (int i = 0; i < 3; i++)
        worst = fmax(worst, fabs((a / b) * n[i] - y[i]) / y[i]);
    CHECK(near(f.worst_rel, worst), "worst_rel %g, by hand %g", f.worst_rel, worst);
    const double y2[3] = {1e-6 * 1000 + 5e-4, 1e-6 * 2000 + 5e-4, 1e-6 * 4000 + 5e-4};
    CHECK(xm_coll_fit(XM_COLL_ALLREDUCE, 2, n, y2, 3, &f) == XMESH_SUCCESS && near(f.alpha, 5e-4) &&
              near(f.beta, 1e-6),
          "positive intercept: alpha %g beta %g", f.alpha, f.beta);
}

static void test_points(void)
{
    const char *text = "[collectives]\n"
                       "allreduce 2 1 2 1 100 10 0.9 0.1 3 1000 100000\n"
                       "points allreduce 2 1 2 1 1000:0.001 10000:0.002 100000:0.02\n"
                       "allreduce 4 1 4 1 100 10 0.9 0.1 3 1000 100000\n";
    xm_costmodel_t *m = NULL;
    CHECK(xm_costmodel_parse(text, &m) == XMESH_SUCCESS && m, "%s", xmesh_last_error());
    if (!m)
        return;
    xm_coll_geom_t g2 = {2, 1, 2, 1}, g4 = {4, 1, 4, 1};
    const struct {
        const xm_coll_geom_t *g;
        double n, want;
    } q[] = {
        {&g2, 500, 0.001},                                        /* below: the smallest's time */
        {&g2, 5500, 0.001 + 0.001 * 4500.0 / 9000.0},             /* between 1e3 and 1e4 */
        {&g2, 55000, 0.002 + 0.018 * 45000.0 / 90000.0},          /* between 1e4 and 1e5 */
        {&g2, 200000, 0.02 + 0.018 / 90000.0 * 100000.0},         /* above: last slope */
        {&g4, 200000, 100e-6 + 10e-9 * (2.0 * 3 / 4 * 200000.0)}, /* other geometry: the fit */
    };
    for (size_t i = 0; i < sizeof q / sizeof *q; i++) {
        xm_cost_pred_t p;
        CHECK(xm_cost_collective(m, XM_COLL_ALLREDUCE, q[i].g, q[i].n, &p) == XMESH_SUCCESS &&
                  near(p.seconds, q[i].want),
              "query %zu (p %d, %g bytes): %.12g s, by hand %.12g s (%s)", i, q[i].g->group_size,
              q[i].n, p.seconds, q[i].want, p.basis);
    }
    xm_costmodel_t *m2 = round_trip(m);
    if (m2) {
        CHECK(m2->coll[0].npts == 3 && m2->coll[1].npts == 0, "points after the round trip: %d %d",
              m2->coll[0].npts, m2->coll[1].npts);
        for (int k = 0; k < 3 && m2->coll[0].npts == 3; k++)
            CHECK(m2->coll[0].px[k] == m->coll[0].px[k] &&
                      near(m2->coll[0].py[k], m->coll[0].py[k]),
                  "point %d differs", k);
    }
    xm_costmodel_destroy(m2);
    xm_costmodel_destroy(m);
    const bad_t bad[] = {
        {"[collectives]\npoints allreduce 2 1 2 1 1000:0.001 10000:0.002\n",
         "line 2: points: no allreduce fit for p 2"},
        {"[collectives]\nallreduce 2 1 2 1 100 10 0.9 0.1 3 1000 100000\n"
         "points allreduce 2 1 2 1 1000:0.001 1000:0.002\n",
         "line 3: points: pair 2: 1000 bytes"},
        {"[collectives]\nallreduce 2 1 2 1 100 10 0.9 0.1 3 1000 100000\n"
         "points allreduce 2 1 2 1 1000:0.001 10000-0.002\n",
         "line 3: points pair 2: '10000-0.002' is not bytes:seconds"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        xm_costmodel_t *sentinel = (xm_costmodel_t *)&g_fail, *out = sentinel;
        xmesh_result_t r = xmp_costmodel_parse(bad[i].text, &out);
        CHECK(r == XMESH_ERR_INVALID_ARGUMENT && out == sentinel, "bad points %zu: result %d", i,
              (int)r);
        CHECK(strstr(xmesh_last_error(), bad[i].want), "bad points %zu: '%s', expected '%s'", i,
              xmesh_last_error(), bad[i].want);
    }
}

static void test_defer_grad(void)
{
    const char *text = "[collectives]\n"
                       "allreduce 2 2 1 1 100 1 0.9 0.1 3 1000 100000\n"
                       "[compute]\n"
                       "sgemm 1 1 1 1 4e-11 unit\n";
    xm_costmodel_t *m = NULL;
    CHECK(xm_costmodel_parse(text, &m) == XMESH_SUCCESS && m, "%s", xmesh_last_error());
    if (!m)
        return;
    const int L = 2;
    xmp_search_opts_t o;
    opts(&o, m, L, 2, 32, 64, 2, 16, 2);
    xmp_search_cand_t c0, c1, c2;
    memset(&c0, 0, sizeof c0);
    c0.nstages = 1;
    c0.M = 1;
    c0.sched = XMP_SCHED_1F1B;
    c0.nblocks[0] = L;
    c0.ndim[0] = 1;
    c0.shape[0][0] = 2;
    c0.strategy[0] = 0; /* dp */
    c1 = c2 = c0;
    char err[512], cmd[2048];
    CHECK(xmp_search_gpt_eval(&o, &c0, err, sizeof err) == 0, "%s", err);
    xmp_search_gpt_command(&o, &c0, cmd, sizeof cmd);
    CHECK(!strstr(cmd, "--overlap"), "no overlap requested: %s", cmd);
    o.defer_grad = 1;
    CHECK(xmp_search_gpt_eval(&o, &c1, err, sizeof err) == 0, "%s", err);
    xmp_search_gpt_command(&o, &c1, cmd, sizeof cmd);
    CHECK(strstr(cmd, " --overlap defer-grad"), "command without the switch: %s", cmd);
    /* parameter tensors of one stage holding E and L: wte, wpe, 12 per block, lnf w and b */
    const int ntensors = 2 + 12 * L + 2;
    CHECK(near(c0.stage_r_s[0] - c1.stage_r_s[0], (ntensors - 1) * 100e-6),
          "defer-grad saves %.9g s of R, by hand (%d - 1) x 100 us = %.9g s",
          c0.stage_r_s[0] - c1.stage_r_s[0], ntensors, (ntensors - 1) * 100e-6);
    o.no_overlap = 1;
    CHECK(xmp_search_gpt_eval(&o, &c2, err, sizeof err) == 0, "%s", err);
    CHECK(c2.stage_r_s[0] == c0.stage_r_s[0] && c2.step_s == c0.step_s,
          "--ablate overlap: R %g step %g, without the switch R %g step %g", c2.stage_r_s[0],
          c2.step_s, c0.stage_r_s[0], c0.step_s);
    xm_costmodel_destroy(m);
}

static void test_gptstep(void)
{
    const char *ok = "[compute]\n"
                     "gptstep 2 32 2 16 2 64 1 0.0125\n";
    xm_costmodel_t *m = NULL;
    CHECK(xmp_costmodel_parse(ok, &m) == XMESH_SUCCESS && m, "%s", xmesh_last_error());
    if (m) {
        xmp_gptstep_t gv, g2;
        const xmp_gptstep_t *g = &gv;
        (void)xmp_gptstep_get(m, &gv);
        CHECK(g->layers == 2 && g->channels == 32 && g->heads == 2 && g->seq == 16 &&
                  g->rows == 2 && g->vocab == 64 && g->busy == 1 && near(g->seconds, 0.0125),
              "parsed %d %d %d %d %d %d %d %g", g->layers, g->channels, g->heads, g->seq, g->rows,
              g->vocab, g->busy, g->seconds);
        xm_costmodel_t *m2 = round_trip(m);
        (void)xmp_gptstep_get(m2, &g2);
        CHECK(m2 && !memcmp(&g2.layers, &g->layers, 7 * sizeof(int)) &&
                  near(g2.seconds, g->seconds),
              "gptstep differs after the round trip");
        xm_costmodel_destroy(m2);
        xm_costmodel_destroy(m);
    }
    const bad_t bad[] = {
        {"[compute]\ngptstep 2 32 2 16 2 64 1\n", "line 2: gptstep record has 8 fields"},
        {"[compute]\ngptstep 2 32 3 16 2 64 1 0.01\n",
         "line 2: gptstep field heads: 3 does not divide channels 32"},
        {"[compute]\ngptstep 0 32 2 16 2 64 1 0.01\n", "line 2: gptstep field layers: 0"},
        {"[compute]\ngptstep 2 32 2 16 2 64 1 0\n", "line 2: gptstep field seconds: 0"},
        {"[compute]\ngptstep 2 32 2 16 2 64 1 0.01\ngptstep 2 32 2 16 2 64 1 0.01\n",
         "line 3: gptstep repeats line 2"},
    };
    check_bad(bad, sizeof bad / sizeof *bad);

    /* the search: kernel records (nominal sgemm rate + eltwise rates) and a gptstep record */
    xm_costmodel_t *cm = NULL;
    CHECK(xm_costmodel_nominal(&g_cl, 5e10, &cm) == XMESH_SUCCESS, "%s", xmesh_last_error());
    if (!cm)
        return;
    for (int k = 0; k < XM_ELT_NKINDS; k++) {
        xm_elt_rec_t r = {1, RF[k] * 1e-9, RB[k] * 1e-9, 0};
        CHECK(xm_costmodel_set_elt(cm, (xm_elt_t)k, &r) == XMESH_SUCCESS, "%s", xmesh_last_error());
    }
    const double measured = 0.0125;
    xmp_gptstep_t rec = {2, 32, 2, 16, 2, 64, 1, measured, 0}, now;
    CHECK(xmp_gptstep_set(cm, &rec) == XMESH_SUCCESS, "%s", xmesh_last_error());
    xmp_gptstep_t worse = rec;
    worse.seconds = -1;
    CHECK(xmp_gptstep_set(cm, &worse) == XMESH_ERR_INVALID_ARGUMENT &&
              xmp_gptstep_get(cm, &now) == XMESH_SUCCESS && now.seconds == measured,
          "a bad record must leave the model as it was");
    char err[512];
    /* the probe model itself, one rank: compute + optimizer == the measured step */
    xmp_search_opts_t op, op0;
    opts(&op, cm, 2, 2, 32, 64, 2, 16, 1);
    op.model.max_seq_len = 16; /* the probe's wpe has T rows (xmesh-calibrate's probe too) */
    op0 = op;
    op0.no_step = 1;
    xmp_search_cand_t c = one_stage(2, 1), c0 = c;
    CHECK(xmp_search_gpt_eval(&op, &c, err, sizeof err) == 0, "%s", err);
    CHECK(xmp_search_gpt_eval(&op0, &c0, err, sizeof err) == 0, "%s", err);
    double comp = c.stage_compute_s[0] + c.stage_o_s[0];
    double comp0 = c0.stage_compute_s[0] + c0.stage_o_s[0];
    CHECK(near(comp, measured), "the probe model priced at %.12g s, measured %.12g s", comp,
          measured);
    CHECK(c0.step_factor == 1 && near(c.step_factor, measured / comp0),
          "factor %.12g (no_step %.12g), expected measured / composed = %.12g", c.step_factor,
          c0.step_factor, measured / comp0);
    CHECK(fabs(c.step_factor - 1) > 0.01, "the test needs a factor away from 1: %g", c.step_factor);
    /* another configuration, 2 ranks dp: compute and optimizer scale, the reduction does not */
    xmp_search_opts_t o2, o20;
    opts(&o2, cm, 3, 2, 32, 64, 4, 16, 2);
    o20 = o2;
    o20.no_step = 1;
    xmp_search_cand_t d = one_stage(3, 2), d0 = d;
    CHECK(xmp_search_gpt_eval(&o2, &d, err, sizeof err) == 0, "%s", err);
    CHECK(xmp_search_gpt_eval(&o20, &d0, err, sizeof err) == 0, "%s", err);
    CHECK(near(d.stage_compute_s[0], d0.stage_compute_s[0] * c.step_factor) &&
              near(d.stage_o_s[0], d0.stage_o_s[0] * c.step_factor),
          "2 ranks: compute %.12g / %.12g, optimizer %.12g / %.12g, factor %.12g",
          d.stage_compute_s[0], d0.stage_compute_s[0], d.stage_o_s[0], d0.stage_o_s[0],
          c.step_factor);
    CHECK(d0.stage_r_s[0] > 0 && near(d.stage_r_s[0], d0.stage_r_s[0]),
          "2 ranks: the reduction %.12g must not scale (%.12g without)", d.stage_r_s[0],
          d0.stage_r_s[0]);
    xm_costmodel_destroy(cm);
}

int main(void)
{
    int one = 0;
    xm_hostmap_t hm = {1, 1, &one};
    if (xm_cluster_init(&g_cl, &hm)) {
        fprintf(stderr, "setup: %s\n", xmesh_last_error());
        return 1;
    }
    test_parse();
    test_terms();
    test_fit_nonneg();
    test_points();
    test_defer_grad();
    test_gptstep();
    xm_cluster_free(&g_cl);
    if (g_fail) {
        fprintf(stderr, "pipeline.search.eltwise: %d failures\n", g_fail);
        return 1;
    }
    printf("pipeline.search.eltwise: OK\n");
    return 0;
}
