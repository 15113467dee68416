/*
 * Peer faults over UCX (started by xmesh-launch.py with --victim 1): rank 1
 * stops (SIGSTOP) or dies (SIGKILL) in the middle of a transfer; every other
 * rank must return TIMEOUT or REMOTE naming rank 1, within --timeout + 1 s
 * (x XMESH_TEST_TIME_SCALE) of starting the reshard, and clean up.
 *
 *   --role src   rank 1 is the sole source; ranks 0, 2, 3 each receive the
 *                whole tensor from it (sendrecv: every survivor waits on it)
 *   --role dst   ranks 0, 2, 3 each send a third straight to rank 1
 *   --mode stop|kill, --timeout S (XMESH_TIMEOUT_S of the plan)
 *   --many K     (2..64) a plan of K tensors with the same layouts: K - 1
 *                of 4 KiB (packed into shared chunks) and the rest of the
 *                24 MiB in the last
 * Every rank prints PASS or FAIL with its result and message; exit 0 on
 * PASS. The victim never returns (the launcher kills it).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "xmesh.h"
#include "xmesh/ucx.h"

#define VICTIM 1

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    const char *mode = "stop", *role = "src";
    double tmo = 2;
    int many = 1;
    for (int i = 1; i + 1 < argc; i++) {
        if (!strcmp(argv[i], "--mode"))
            mode = argv[++i];
        else if (!strcmp(argv[i], "--role"))
            role = argv[++i];
        else if (!strcmp(argv[i], "--timeout"))
            tmo = atof(argv[++i]);
        else if (!strcmp(argv[i], "--many"))
            many = atoi(argv[++i]);
    }
    const char *sc = getenv("XMESH_TEST_TIME_SCALE");
    double scale = sc && atof(sc) > 0 ? atof(sc) : 1;
    tmo *= scale;
    /* Nothing moves unless a rank drives it: the victim's fault lands after
     * its first chunks, mid-transfer. */
    setenv("XMESH_PROGRESS_THREAD", "0", 1);
    xmesh_ctx_t ctx;
    if (xmesh_ctx_create_ucx(NULL, NULL, &ctx)) {
        printf("FAIL: context: %s\n", xmesh_last_error());
        return 2;
    }
    int rank, size;
    xmesh_ctx_rank(ctx, &rank);
    xmesh_ctx_size(ctx, &size);
    if (size != 4) {
        printf("FAIL: needs 4 ranks\n");
        return 2;
    }
    int one[1] = {VICTIM}, others[3] = {0, 2, 3}, s1[1] = {1}, s3[1] = {3};
    xmesh_mesh_t mv, mo;
    xmesh_mesh_create(ctx, 1, s1, one, &mv);
    xmesh_mesh_create(ctx, 1, s3, others, &mo);
    if (many < 1 || many > 64) {
        printf("FAIL: --many %d: 1..64\n", many);
        return 2;
    }
    int64_t total = 24 << 20 >> 2; /* 24 MiB of f32 */
    int64_t shape[64];
    for (int k = 0; k < many - 1; k++)
        shape[k] = 1024;
    shape[many - 1] = total - (int64_t)(many - 1) * 1024;
    int src_role = !strcmp(role, "src");
    xmesh_layout_t sls[64], dls[64];
    for (int k = 0; k < many; k++) {
        sls[k] = (xmesh_layout_t){1, &shape[k], XMESH_F32, src_role ? mv : mo, "S(0)"};
        dls[k] = (xmesh_layout_t){1, &shape[k], XMESH_F32, src_role ? mo : mv, "B"};
    }
    xmesh_plan_params_t pp = XMESH_PLAN_PARAMS_INITIALIZER;
    pp.strategy = XMESH_STRATEGY_SENDRECV;
    pp.timeout_s = tmo;
    xmesh_plan_t plan;
    if (many > 1 ? xmesh_plan_create_many(ctx, many, sls, dls, &pp, &plan)
                 : xmesh_plan_create(ctx, &sls[0], &dls[0], &pp, &plan)) {
        printf("FAIL rank %d: plan: %s\n", rank, xmesh_last_error());
        return 2;
    }
    /* Blocks: tensor k's where the rank holds one, else NULL. */
    const void *src[64];
    void *dst[64];
    for (int k = 0; k < many; k++) {
        int64_t ls[1], ld[1];
        int hs = 0, hd = 0;
        xmesh_layout_local_shape(&sls[k], rank, ls, &hs);
        xmesh_layout_local_shape(&dls[k], rank, ld, &hd);
        src[k] = hs ? calloc((size_t)ls[0] + 1, 4) : NULL;
        dst[k] = hd ? calloc((size_t)ld[0] + 1, 4) : NULL;
    }
    fflush(stdout);
    double t0 = now_s();
    if (rank == VICTIM) {
        xmesh_request_t rq;
        if (many > 1)
            xmesh_reshard_many_start(plan, src, dst, &rq);
        else
            xmesh_reshard_start(plan, src[0], dst[0], &rq);
        /* As the sole source (--role src) it moves a few chunks first, so
         * the fault lands mid-transfer. As the receiver of every sender
         * (--role dst) it dies without driving its receives: with a few
         * progress rounds a slow run (TSan) could take one sender's whole
         * third, and that sender would then rightly succeed. */
        for (int i = 0; i < (src_role ? 3 : 0); i++)
            xmesh_test(rq);
        printf("victim rank %d (pid %d): raising SIG%s\n", rank, (int)getpid(),
               !strcmp(mode, "kill") ? "KILL" : "STOP");
        fflush(stdout);
        raise(!strcmp(mode, "kill") ? SIGKILL : SIGSTOP);
        for (;;)
            pause();
    }
    xmesh_result_t r =
        many > 1 ? xmesh_reshard_many(plan, src, dst) : xmesh_reshard(plan, src[0], dst[0]);
    double dt = now_s() - t0;
    const char *msg = xmesh_last_error();
    int ok = (r == XMESH_ERR_TIMEOUT || r == XMESH_ERR_REMOTE) && strstr(msg, "rank 1") &&
             dt <= tmo + 1.0 * scale;
    printf("%s rank %d: %s after %.2f s (timeout %.3g s): %s\n", ok ? "PASS" : "FAIL", rank,
           xmesh_result_string(r), dt, tmo, msg);
    /* Clean-up after a failure: the plan refuses reuse, everything destroys. */
    xmesh_request_t rq;
    if ((many > 1 ? xmesh_reshard_many_start(plan, src, dst, &rq)
                  : xmesh_reshard_start(plan, src[0], dst[0], &rq)) != XMESH_ERR_INVALID_USAGE) {
        printf("FAIL rank %d: a failed plan accepted another reshard\n", rank);
        ok = 0;
    }
    if (xmesh_plan_destroy(plan) || xmesh_mesh_destroy(mv) || xmesh_mesh_destroy(mo) ||
        xmesh_ctx_destroy(ctx)) {
        printf("FAIL rank %d: clean-up: %s\n", rank, xmesh_last_error());
        ok = 0;
    }
    fflush(stdout);
    for (int k = 0; k < many; k++) {
        free((void *)src[k]);
        free(dst[k]);
    }
    return ok ? 0 : 1;
}
