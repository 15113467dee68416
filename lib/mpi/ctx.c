/* MPI context: communicator, host discovery, the agree() collective and the
 * backend table. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "xm_mpi.h"

static xmesh_result_t mpi_agree(xmesh_ctx_t ctx, xmesh_result_t local, uint64_t hash);
static void mpi_ctx_free(xmesh_ctx_t ctx);

static const xm_backend_ops_t mpi_ops = {
    .name = "mpi",
    .many_tensors = 1,
    .agree = mpi_agree,
    .plan_setup = xm_mpi_plan_setup,
    .plan_teardown = xm_mpi_plan_teardown,
    .start = xm_mpi_start,
    .test = xm_mpi_test,
    .wait = xm_mpi_wait,
    .ctx_free = mpi_ctx_free,
    .stats = xm_mpi_stats,
};

/* Monotonic seconds. */
double xm_mpi_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Converts an MPI error code into XMESH_ERR_BACKEND with MPI's own text. */
xmesh_result_t xm_mpi_err(int mpirc, const char *what)
{
    return xm_boot_mpi_err(mpirc, what);
}

xmesh_result_t xmesh_ctx_create_mpi(MPI_Comm comm, const xmesh_ctx_params_t *params,
                                    xmesh_ctx_t *out)
{
    int inited = 0, finalized = 0, provided = 0, rc;
    xmesh_result_t r;
    if (!out)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xmesh_ctx_create_mpi: out is NULL");
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (!inited || finalized)
        return XM_ERR(XMESH_ERR_INVALID_USAGE,
                      "xmesh_ctx_create_mpi: MPI is %s (call MPI_Init_thread first)",
                      finalized ? "finalized" : "not initialized");
    if (comm == MPI_COMM_NULL)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xmesh_ctx_create_mpi: comm is MPI_COMM_NULL");
    /* Any thread level works: below MPI_THREAD_MULTIPLE there is no progress
     * thread and transfers advance inside xmesh_reshard_start, xmesh_test
     * and xmesh_wait (the caller must then call xmesh_test to overlap). */
    MPI_Query_thread(&provided);
    xmesh_ctx_params_t def = XMESH_CTX_PARAMS_INITIALIZER;
    if (!params)
        params = &def;
    if (params->magic != XMESH_PARAMS_MAGIC || params->size < sizeof(xmesh_ctx_params_t))
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                      "ctx params: magic 0x%x / size %zu wrong (initialise with "
                      "XMESH_CTX_PARAMS_INITIALIZER)",
                      params->magic, params->size);
    if (params->host_id != XMESH_UNSET_INT && params->host_id < 0)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "ctx params: host_id %d is negative",
                      params->host_id);

    struct xmesh_ctx *ctx = calloc(1, sizeof *ctx);
    xm_mpi_ctx_t *be = calloc(1, sizeof *be);
    if (!ctx || !be) {
        r = XM_ERR(XMESH_ERR_NO_MEMORY, "context: out of memory");
        goto out_free;
    }
    if ((rc = MPI_Comm_dup(comm, &be->comm))) {
        r = xm_mpi_err(rc, "MPI_Comm_dup");
        goto out_free;
    }
    MPI_Comm_set_errhandler(be->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(be->comm, &ctx->rank);
    MPI_Comm_size(be->comm, &ctx->size);
    if ((r = xm_boot_hosts(be->comm, params->host_id, NULL, &ctx->hosts)))
        goto out_free_comm;
    ctx->timeout_s =
        params->timeout_s >= 0 ? params->timeout_s : xm_param_double("XMESH_TIMEOUT_S");
    pthread_mutex_init(&be->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&be->work_cv, &ca);
    pthread_cond_init(&be->done_cv, &ca);
    pthread_condattr_destroy(&ca);
    be->threaded = provided >= MPI_THREAD_MULTIPLE;
    be->agreed_slot = -1;
    ctx->ops = &mpi_ops;
    ctx->be = be;
    XM_INFO("ctx: rank %d of %d on host %d of %d, MPI thread level %d (%s)", ctx->rank, ctx->size,
            ctx->hosts.host_of[ctx->rank], ctx->hosts.nhosts, provided,
            be->threaded ? "progress thread" : "progress in test/wait only");
    *out = ctx;
    return XMESH_SUCCESS;
out_free_comm:
    MPI_Comm_free(&be->comm);
out_free:
    free(be);
    free(ctx);
    return r;
}

/* ops->ctx_free: stops the progress thread and frees the request pool and
 * the communicator (api.c has checked that no plan or mesh is left). */
static void mpi_ctx_free(xmesh_ctx_t ctx)
{
    xm_mpi_ctx_t *be = ctx->be;
    if (!be)
        return;
    pthread_mutex_lock(&be->mu);
    be->stop = 1;
    pthread_cond_broadcast(&be->work_cv);
    pthread_mutex_unlock(&be->mu);
    if (be->thread_started)
        pthread_join(be->thread, NULL);
    for (int i = 0; i < be->nblocks; i++)
        free(be->blocks[i]);
    int fin_pool = 0;
    MPI_Finalized(&fin_pool);
    for (int i = 0; i < be->npool && !fin_pool; i++)
        if (be->pool[i] != MPI_COMM_NULL)
            MPI_Comm_free(&be->pool[i]);
    free(be->blocks);
    free(be->snap);
    pthread_cond_destroy(&be->work_cv);
    pthread_cond_destroy(&be->done_cv);
    pthread_mutex_destroy(&be->mu);
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin)
        MPI_Comm_free(&be->comm);
    free(be);
    ctx->be = NULL;
}

/* One MPI_Allreduce(MAX) over {hash, ~hash, failing rank + 1, busy flag of
 * every pooled communicator}: max(hash) and ~max(~hash) = min(hash) differ
 * iff some rank hashed different inputs; a pool slot whose max flag is 0 is
 * free on every rank and becomes the next plan's communicator. */
static xmesh_result_t mpi_agree(xmesh_ctx_t ctx, xmesh_result_t local, uint64_t hash)
{
    xm_mpi_ctx_t *be = ctx->be;
    uint64_t in[XM_COMM_POOL], outv[XM_COMM_POOL];
    pthread_mutex_lock(&be->mu);
    for (int i = 0; i < XM_COMM_POOL; i++)
        in[i] = i >= be->npool || be->pool_state[i] != XM_POOL_FREE;
    be->agreed_slot = -1;
    pthread_mutex_unlock(&be->mu);
    xmesh_result_t r =
        xm_boot_agree(be->comm, local, hash, in, outv, XM_COMM_POOL, "plan agreement");
    if (r)
        return r;
    for (int i = 0; i < XM_COMM_POOL && be->agreed_slot < 0; i++)
        if (!outv[i])
            be->agreed_slot = i;
    return XMESH_SUCCESS;
}
