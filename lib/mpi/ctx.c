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
    .agree = mpi_agree,
    .plan_setup = xm_mpi_plan_setup,
    .plan_teardown = xm_mpi_plan_teardown,
    .start = xm_mpi_start,
    .test = xm_mpi_test,
    .wait = xm_mpi_wait,
    .ctx_free = mpi_ctx_free,
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
    char s[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(mpirc, s, &len);
    return XM_ERR(XMESH_ERR_BACKEND, "%s failed: MPI error %d (%s)", what, mpirc, s);
}

/* Parses XMESH_HOST_ID: an integer, or "rank/N" (rank of comm divided by N,
 * so that N consecutive ranks pretend to share a host). */
static xmesh_result_t parse_host_env(const char *s, int rank, int *out)
{
    char *end;
    if (!strncmp(s, "rank/", 5)) {
        long n = strtol(s + 5, &end, 10);
        if (*end || n < 1)
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                          "XMESH_HOST_ID '%s': expected an integer >= 0 or rank/N with N >= 1", s);
        *out = (int)(rank / n);
        return XMESH_SUCCESS;
    }
    long v = strtol(s, &end, 10);
    if (*end || v < 0 || v > 1 << 30)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                      "XMESH_HOST_ID '%s': expected an integer >= 0 or rank/N with N >= 1", s);
    *out = (int)v;
    return XMESH_SUCCESS;
}

/* Host of every rank: an explicit id (params or environment) or the
 * shared-memory split; ids renumbered 0..H-1 by first appearance. */
static xmesh_result_t find_hosts(MPI_Comm comm, int rank, int size, int override_id,
                                 xm_hostmap_t *out)
{
    int key[2] = {1, override_id}, rc;
    if (override_id < 0) {
        MPI_Comm shm;
        if ((rc = MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &shm)))
            return xm_mpi_err(rc, "MPI_Comm_split_type(SHARED)");
        /* The host's lowest rank names it. */
        int lowest = rank;
        rc = MPI_Allreduce(&rank, &lowest, 1, MPI_INT, MPI_MIN, shm);
        MPI_Comm_free(&shm);
        if (rc)
            return xm_mpi_err(rc, "MPI_Allreduce(host leader)");
        key[0] = 0;
        key[1] = lowest;
    }
    int *all = malloc(sizeof(int) * 2 * size);
    int *host = malloc(sizeof(int) * size);
    if (!all || !host) {
        free(all);
        free(host);
        return XM_ERR(XMESH_ERR_NO_MEMORY, "context: out of memory for %d ranks", size);
    }
    if ((rc = MPI_Allgather(key, 2, MPI_INT, all, 2, MPI_INT, comm))) {
        free(all);
        free(host);
        return xm_mpi_err(rc, "MPI_Allgather(host ids)");
    }
    int nhosts = 0;
    for (int r = 0; r < size; r++) {
        host[r] = -1;
        for (int q = 0; q < r && host[r] < 0; q++)
            if (all[2 * q] == all[2 * r] && all[2 * q + 1] == all[2 * r + 1])
                host[r] = host[q];
        if (host[r] < 0)
            host[r] = nhosts++;
    }
    free(all);
    out->ndev = size;
    out->nhosts = nhosts;
    out->host_of = host;
    return XMESH_SUCCESS;
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
    /* Every rank must reach the collectives below, so a bad local value is
     * only reported after them (the agree-style pattern). */
    int override_id = -1;
    xmesh_result_t local = XMESH_SUCCESS;
    char saved[512] = "";
    if (params->host_id != XMESH_UNSET_INT) {
        override_id = params->host_id;
    } else {
        const char *env = getenv("XMESH_HOST_ID");
        if (env && *env && (local = parse_host_env(env, ctx->rank, &override_id)))
            snprintf(saved, sizeof saved, "%s", xmesh_last_error());
    }
    int any_override = override_id >= 0, all_override = 0;
    MPI_Allreduce(&any_override, &all_override, 1, MPI_INT, MPI_MIN, be->comm);
    if (!all_override)
        override_id = -1; /* mixing explicit ids and the split would be meaningless */
    if ((r = find_hosts(be->comm, ctx->rank, ctx->size, override_id, &ctx->hosts)))
        goto out_free_comm;
    int bad = local != XMESH_SUCCESS, anybad = 0;
    MPI_Allreduce(&bad, &anybad, 1, MPI_INT, MPI_MAX, be->comm);
    if (anybad) {
        r = local ? XM_ERR(local, "%s", saved)
                  : XM_ERR(XMESH_ERR_REMOTE, "another rank rejected its XMESH_HOST_ID");
        goto out_free_hosts;
    }
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
out_free_hosts:
    xm_hostmap_free(&ctx->hosts);
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
    uint64_t in[3 + XM_COMM_POOL], outv[3 + XM_COMM_POOL];
    /* A failing rank's hash is meaningless: send the neutral element. */
    in[0] = local ? 0 : hash;
    in[1] = local ? 0 : ~hash;
    in[2] = local ? (uint64_t)(ctx->size - ctx->rank) : 0; /* max picks the lowest failing rank */
    pthread_mutex_lock(&be->mu);
    for (int i = 0; i < XM_COMM_POOL; i++)
        in[3 + i] = i >= be->npool || be->pool_state[i] != XM_POOL_FREE;
    be->agreed_slot = -1;
    pthread_mutex_unlock(&be->mu);
    int rc = MPI_Allreduce(in, outv, 3 + XM_COMM_POOL, MPI_UINT64_T, MPI_MAX, be->comm);
    if (rc)
        return xm_mpi_err(rc, "MPI_Allreduce(plan agreement)");
    if (local)
        return local;
    if (outv[2])
        return XM_ERR(XMESH_ERR_REMOTE,
                      "rank %d failed to create the plan locally (see its error); no data moved",
                      ctx->size - (int)outv[2]);
    uint64_t hmax = outv[0], hmin = ~outv[1];
    if (hmax != hmin)
        return XM_ERR(XMESH_ERR_MISMATCH,
                      "ranks passed different plan inputs (shape, dtype, meshes, shardings, params "
                      "or cluster model): this rank's hash %016llx, range over ranks [%016llx, "
                      "%016llx]",
                      (unsigned long long)hash, (unsigned long long)hmin, (unsigned long long)hmax);
    for (int i = 0; i < XM_COMM_POOL && be->agreed_slot < 0; i++)
        if (!outv[3 + i])
            be->agreed_slot = i;
    return XMESH_SUCCESS;
}
