/*
 * pipeline.search.estimate (unit): the public offline estimate (pipeline/search/estimate.h).
 *  - GPT-2 and U-Transformer estimates equal the search's own model of the same configuration
 *    (xmp_search_gpt_eval, xmp_uts_eval): step time, memory, boxing and boundary bytes;
 *  - per-rank memory: every rank of a stage holds the stage's figure, the largest is mem_bytes;
 *  - the rank order is a permutation of the ranks, in order exactly when there is no gain;
 *  - errors name the bad value and leave the output untouched (malformed cluster file with its
 *    line, unknown strategy, wrong rank count, bad schedule).
 * argv[1]: a calibrated cluster file (its figures must differ from the nominal model's).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched/schedule.h"
#include "search/estimate.h"
#include "search/search.h"
#include "search/search_ut.h"
#include "xm_cluster_file.h"
#include "xm_costmodel.h"

static int g_fail;
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                        \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            g_fail++;                                                                              \
        }                                                                                          \
    } while (0)

static int is_perm(const int *a, int n)
{
    char seen[4096] = {0};
    for (int i = 0; i < n; i++) {
        if (a[i] < 0 || a[i] >= n || seen[a[i]])
            return 0;
        seen[a[i]] = 1;
    }
    return 1;
}

static void check_ranks(const xmp_estimate_t *e, int N)
{
    double mx = 0;
    for (int r = 0; r < N; r++)
        mx = fmax(mx, xmp_estimate_rank_memory(e, r));
    CHECK(mx == e->mem_bytes, "largest rank memory %.0f vs %.0f", mx, e->mem_bytes);
    CHECK(is_perm(e->rank_order, N), "rank order is not a permutation of %d ranks", N);
    int inorder = 1;
    for (int r = 0; r < N; r++)
        inorder &= e->rank_order[r] == r;
    CHECK(inorder == (e->order_gain_s == 0), "in order %d, gain %g", inorder, e->order_gain_s);
}

static void test_gpt(const xmp_estimator_t *e, const xm_costmodel_t *cm, const xm_cluster_t *cl)
{
    xmp_gpt_desc_t m = {4, 4, 128, 256, 64, 8, 1024};
    xmp_layout_desc_t l = {8, 4, "E,t|t*3,L", "2x2,2x2", "megatron,dp", "1f1b", 2};
    xmp_estimate_t est;
    char err[1024];
    CHECK(xmp_estimate_gpt(e, &m, &l, &est, err, sizeof err) == 0, "%s", err);
    /* the search's model of the same configuration */
    xmp_search_opts_t so;
    memset(&so, 0, sizeof so);
    so.model.num_layers = 4;
    so.model.num_heads = 4;
    so.model.channels = 128;
    so.model.max_seq_len = 1024;
    so.model.vocab_size = 256;
    so.model.padded_vocab_size = 256;
    so.vocab = 256;
    so.B = 8;
    so.T = 64;
    so.nranks = 8;
    so.hosts = 4;
    so.cost = cm;
    so.cluster = cl;
    xmp_search_cand_t c;
    memset(&c, 0, sizeof c);
    c.nstages = 2;
    c.M = 2;
    c.sched = XMP_SCHED_1F1B;
    c.nblocks[0] = 1;
    c.nblocks[1] = 3;
    for (int s = 0; s < 2; s++) {
        c.ndim[s] = 2;
        c.shape[s][0] = c.shape[s][1] = 2;
    }
    c.strategy[0] = 1;
    c.strategy[1] = 0;
    CHECK(xmp_search_gpt_eval(&so, &c, err, sizeof err) == 0, "%s", err);
    CHECK(est.step_s == c.step_s && est.mem_bytes == c.mem_bytes &&
              est.boxing_bytes == c.boxing_bytes && est.boundary_bytes == c.boundary_bytes,
          "estimate %.9g s %.0f B vs search %.9g s %.0f B", est.step_s, est.mem_bytes, c.step_s,
          c.mem_bytes);
    CHECK(est.nstages == 2 && est.stage_rank0[1] == 4 && est.stage_ranks[1] == 4, "stages");
    CHECK(xmp_estimate_rank_memory(&est, 5) == c.stage_param_bytes[1] + c.stage_act_bytes[1],
          "rank 5 memory");
    check_ranks(&est, 8);
    printf("  gpt: step %.6g s, memory %.0f bytes, boundary %.0f bytes per rank\n", est.step_s,
           est.mem_bytes, est.boundary_bytes);
    /* placement: a 1-axis stage to a 2-axis stage that splits another dim, across hosts */
    double best_gain = 0;
    int nok = 0;
    const char *meshes[] = {"4,2x2", "2x2,4", "4x2,8", "8,2x4", "2x4,4x2"};
    const char *strats[] = {"dp,megatron", "megatron,3d", "3d,axonn", "dp,3d", "megatron,dp"};
    for (int i = 0; i < 5; i++)
        for (int k = 0; k < 5; k++) {
            xmp_layout_desc_t q = {8, 4, "E,t*2|t*2,L", meshes[i], strats[k], "gpipe", 2};
            if (i >= 2)
                q.ranks = 16, q.hosts = 4;
            xmp_estimate_t x;
            if (xmp_estimate_gpt(e, &m, &q, &x, err, sizeof err) == 0) {
                check_ranks(&x, q.ranks);
                best_gain = fmax(best_gain, x.order_gain_s);
                nok++;
            } else if (getenv("VERBOSE"))
                printf("    %s %s: %s\n", meshes[i], strats[k], err);
        }
    CHECK(nok >= 5, "only %d placement layouts evaluated", nok);
    /* 3 stages of 4 ranks on 4 hosts of 3 (stages straddle hosts); the NIC bound is host 0's
     * three blocks either way, so the advice may keep the order (gain 0 is printed) */
    xmp_layout_desc_t q = {12, 4, "E,t|t*2|t,L", "4,4,4", "dp", "gpipe", 2};
    xmp_estimate_t x;
    CHECK(xmp_estimate_gpt(e, &m, &q, &x, err, sizeof err) == 0, "%s", err);
    check_ranks(&x, 12);
    CHECK(x.order_gain_s >= 0, "negative placement gain %g", x.order_gain_s);
    printf("  placement 4,4,4 on 4 hosts x 3: gain %.3g s, order", x.order_gain_s);
    for (int r = 0; r < 12; r++)
        printf(" %d", x.rank_order[r]);
    printf("\n");
    printf("  placement: %d layouts, largest lower-bound gain %.3g s\n", nok, best_gain);
}

static void test_ut(const xmp_estimator_t *e, const xm_costmodel_t *cm, const xm_cluster_t *cl)
{
    xmp_utrans_desc_t m = {8, 0, 0, 8};
    xmp_layout_desc_t l = {8, 4, "u*5|u*8", "2x2,4x1", "megatron,dp", "eager-1f1b", 2};
    xmp_estimate_t est;
    char err[1024];
    CHECK(xmp_estimate_utransformer(e, &m, &l, &est, err, sizeof err) == 0, "%s", err);
    xmp_uts_opts_t so;
    memset(&so, 0, sizeof so);
    xmp_ut_config_init(&so.model, 8, 0, 0);
    so.B = 8;
    so.nranks = 8;
    so.hosts = 4;
    so.cost = cm;
    so.cluster = cl;
    so.nstrat = 2;
    so.strategies[0] = "dp";
    so.strategies[1] = "megatron";
    xmp_uts_cand_t c;
    memset(&c, 0, sizeof c);
    c.nstages = 2;
    c.M = 2;
    c.sched = XMP_SCHED_EAGER_1F1B;
    c.count[0] = 5;
    c.count[1] = 8;
    c.dp[0] = 2, c.tp[0] = 2, c.strategy[0] = 1;
    c.dp[1] = 4, c.tp[1] = 1, c.strategy[1] = 0;
    CHECK(xmp_uts_eval(&so, &c, err, sizeof err) == 0, "%s", err);
    CHECK(est.step_s == c.step_s && est.mem_bytes == c.mem_bytes &&
              est.boundary_bytes == c.boundary_bytes && est.boxing_bytes == c.boxing_bytes,
          "estimate %.9g s %.0f B vs search %.9g s %.0f B", est.step_s, est.mem_bytes, c.step_s,
          c.mem_bytes);
    CHECK(xmp_estimate_rank_memory(&est, 1) == c.stage_mem[0] &&
              xmp_estimate_rank_memory(&est, 6) == c.stage_mem[1],
          "per-rank memory");
    check_ranks(&est, 8);
    printf("  utransformer: step %.6g s, memory %.0f bytes per rank\n", est.step_s, est.mem_bytes);
}

static void test_errors(const xmp_estimator_t *e)
{
    char err[1024];
    xmp_estimate_t est, before;
    memset(&est, 0x5a, sizeof est);
    before = est;
    xmp_gpt_desc_t m = {4, 4, 128, 256, 64, 8, 1024};
    struct {
        xmp_layout_desc_t l;
        const char *want;
    } bad[] = {
        {{8, 4, NULL, "2x2,2x2", "megatron,zero9", "1f1b", 2}, "'zero9'"},
        {{8, 4, NULL, "2x2,2x2", "dp", "zigzag", 2}, "schedule 'zigzag'"},
        {{6, 3, NULL, "2x2,2x2", "dp", "1f1b", 2}, "ranks is 6"},
        {{8, 3, NULL, "2x2,2x2", "dp", "1f1b", 2}, "hosts 3"},
        {{8, 4, NULL, "2x2,2x2", "dp,dp,dp", "1f1b", 2}, "more names"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        int r = xmp_estimate_gpt(e, &m, &bad[i].l, &est, err, sizeof err);
        CHECK(r == -1 && strstr(err, bad[i].want) && !memcmp(&est, &before, sizeof est),
              "case %zu: r %d message '%s' (want '%s')", i, r, err, bad[i].want);
    }
    xmp_utrans_desc_t um = {8, 0, 0, 8};
    xmp_layout_desc_t ul = {8, 4, "u*5|u*8", "2x1x2,4", "dp", "1f1b", 2};
    CHECK(xmp_estimate_utransformer(e, &um, &ul, &est, err, sizeof err) == -1 &&
              strstr(err, "2-axis") && !memcmp(&est, &before, sizeof est),
          "message: %s", err);
    /* a malformed cluster file: the line is named, nothing is created */
    const char *path = "test_estimate_bad_cluster.txt";
    FILE *f = fopen(path, "w");
    if (f) {
        fprintf(f, "nic_gbps = 10\nlatency_us = fast\n");
        fclose(f);
        xmp_estimator_opts_t eo;
        memset(&eo, 0, sizeof eo);
        eo.cluster_file = path;
        xmp_estimator_t *x = (xmp_estimator_t *)&before;
        CHECK(xmp_estimator_create(&eo, &x, err, sizeof err) == -1 && strstr(err, path) &&
                  strstr(err, "line 2") && x == (xmp_estimator_t *)&before,
              "message: %s", err);
        remove(path);
    }
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    printf("pipeline.search.estimate\n");
    for (int pass = 0; pass < (argc > 1 ? 2 : 1); pass++) {
        xmp_estimator_opts_t eo;
        memset(&eo, 0, sizeof eo);
        eo.cluster_file = pass ? argv[1] : NULL;
        xmp_estimator_t *e = NULL;
        char err[1024];
        if (xmp_estimator_create(&eo, &e, err, sizeof err)) {
            fprintf(stderr, "estimator: %s\n", err);
            return 1;
        }
        printf(" %s\n", xmp_estimator_label(e));
        /* the same cost model for the search's side */
        xm_costmodel_t *cm = NULL;
        xm_cluster_t cl;
        int one = 0;
        xm_hostmap_t hm = {1, 1, &one};
        if (xm_cluster_init(&cl, &hm) || (pass && xm_cluster_load(argv[1], &cl)) ||
            (pass ? xm_costmodel_load(argv[1], &cm) : xm_costmodel_nominal(&cl, 5e10, &cm))) {
            fprintf(stderr, "setup: %s\n", xmesh_last_error());
            return 1;
        }
        CHECK(!pass || strstr(xmp_estimator_label(e), "calibrated: "), "label %s",
              xmp_estimator_label(e));
        test_gpt(e, cm, &cl);
        test_ut(e, cm, &cl);
        if (!pass)
            test_errors(e);
        xm_costmodel_destroy(cm);
        xm_cluster_free(&cl);
        xmp_estimator_destroy(e);
    }
    xmp_estimator_destroy(NULL);
    if (g_fail) {
        fprintf(stderr, "pipeline.search.estimate: %d failures\n", g_fail);
        return 1;
    }
    printf("pipeline.search.estimate: all checks passed\n");
    return 0;
}
