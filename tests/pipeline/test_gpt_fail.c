/* Failure and timeout of GPT-2's own control messages (models/gpt2_par.c: the parameter gather,
 * the parameters-changed status; issue 20 item 6), 4 ranks, XMESH_TIMEOUT_S = T set by the
 * caller (3). Two stages of 2 ranks (megatron 1x2 each), so stage 1's parameters travel from
 * world rank 2 to rank 0 by xmp_send / xmp_recv:
 *  1. rank 2 fails (xmp_fail) and never joins xmp_gpt2_stages_gather: ranks 0, 1, 3 return -1
 *     well within the timeout (< T / 2) and the error (xmp_last_error) names rank 2;
 *  2. after xmp_fail_clear, on a second pair of stages over a fresh communicator, rank 3 never
 *     arrives at xmp_gpt2_stage_params_changed (no notice): ranks 0, 1, 2 return -1 within
 *     [T, T + 2.5 s] with a timeout message.
 * Nobody calls MPI_Abort: every rank reaches MPI_Finalize and the exit code says it all. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fail_test.h"
#include "models/gpt2_par.h"
#include "models/stage_layout.h"
#include "nn/sbp.h"

static xmp_gpt2_stage_t *make_stage(MPI_Comm comm, xmesh_ctx_t ctx, xmp_gpt2_t *m,
                                    xmp_stage_layout_t *sl)
{
    char err[512] = "";
    xmp_gpt2_train_cfg_t tc = {.B = 2,
                               .T = 8,
                               .M = 1,
                               .lr = 1e-3f,
                               .beta1 = 0.9f,
                               .beta2 = 0.95f,
                               .eps = 1e-8f,
                               .wd = 0.0f,
                               .strategy = NULL}; /* megatron on every stage */
    xmp_gpt2_stage_t *st = NULL;
    if (xmp_gpt2_stage_create(comm, ctx, m, sl, &tc, &st, err, sizeof err)) {
        fprintf(stderr, "[rank %d] stage create: %s\n", g_rank, err);
        MPI_Abort(MPI_COMM_WORLD, 2); /* the test harness itself */
    }
    return st;
}

int main(int argc, char **argv)
{
    double T = fail_test_init(&argc, &argv, "test_gpt_fail", 30);
    char err[512] = "";
    xmp_stage_layout_t sl;
    xmp_gpt2_t m, out;
    xmesh_ctx_t ctx = NULL;
    memset(&m, 0, sizeof m);
    memset(&out, 0, sizeof out);
    xmp_gpt2_config_t cfg = {.max_seq_len = 8,
                             .vocab_size = 32,
                             .padded_vocab_size = 32,
                             .num_layers = 2,
                             .num_heads = 2,
                             .channels = 16};
    if (xmp_stage_layout_build("EttL", 1, 1, NULL, 2, "1x2,1x2", NULL, NULL, &sl, err,
                               sizeof err) ||
        xmp_gpt2_init_random(&m, &cfg, 7) || xmp_gpt2_init_random(&out, &cfg, 8) ||
        xmesh_ctx_create_mpi(MPI_COMM_WORLD, NULL, &ctx) != XMESH_SUCCESS) {
        fprintf(stderr, "[rank %d] setup: %s\n", g_rank, err);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }

    /* 1. a failed rank is named */
    xmp_gpt2_stage_t *st = make_stage(MPI_COMM_WORLD, ctx, &m, &sl);
    if (g_rank == 2) {
        xmp_fail(MPI_COMM_WORLD, "injected failure before the gather");
    } else {
        double t0 = MPI_Wtime();
        int rc = xmp_gpt2_stages_gather(&st, 1, &out);
        double el = MPI_Wtime() - t0;
        const char *e = xmp_last_error();
        EXPECT(rc != 0, "gather returned %d with rank 2 failed", rc);
        EXPECT(strstr(e, "rank 2 failed") != NULL, "message does not name rank 2: '%s'", e);
        EXPECT(el < T / 2, "gather took %.2f s (timeout %g): the notice was not used", el, T);
    }
    /* every rank knows of the failure now: the old communicator is not used again */
    MPI_Barrier(MPI_COMM_WORLD);
    xmp_fail_clear();

    /* 2. a rank that never arrives: timeout */
    MPI_Comm c2;
    MPI_Comm_dup(MPI_COMM_WORLD, &c2);
    xmesh_ctx_t ctx2 = NULL;
    if (xmesh_ctx_create_mpi(c2, NULL, &ctx2) != XMESH_SUCCESS)
        MPI_Abort(MPI_COMM_WORLD, 2);
    xmp_gpt2_stage_t *st2 = make_stage(c2, ctx2, &m, &sl);
    if (g_rank != 3) {
        double t0 = MPI_Wtime();
        int rc = xmp_gpt2_stage_params_changed(st2);
        double el = MPI_Wtime() - t0;
        const char *e = xmp_last_error();
        EXPECT(rc != 0, "params_changed returned %d with rank 3 absent", rc);
        EXPECT(strstr(e, "timed out") != NULL && strstr(e, "parameters-changed") != NULL,
               "message: '%s'", e);
        EXPECT_TIMEOUT_WINDOW(el, T);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    /* the stages' communicators hold abandoned requests: not destroyed (collective frees would
     * wait on them); the process ends */
    (void)st;
    (void)st2;
    return fail_test_finish("test_gpt_fail");
}
