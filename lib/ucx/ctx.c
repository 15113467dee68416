/* UCX context: bootstrap (the caller's all-gather or the environment),
 * hosts, one UCX worker bound to the rank's NIC, endpoints to every other
 * rank, the agree() collective over the bootstrap, the backend table. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "xm_ucx.h"

static xmesh_result_t ucx_agree(xmesh_ctx_t ctx, xmesh_result_t local, uint64_t hash);
static void ucx_ctx_free(xmesh_ctx_t ctx);

static const xm_backend_ops_t ucx_ops = {
    .name = "ucx",
    .many_tensors = 1,
    .agree = ucx_agree,
    .plan_setup = xu_plan_setup,
    .plan_teardown = xu_plan_teardown,
    .start = xu_start,
    .test = xu_test,
    .wait = xu_wait,
    .ctx_free = ucx_ctx_free,
    .stats = xu_stats,
};

xmesh_result_t xu_status_err(xmesh_result_t code, ucs_status_t st, const char *what)
{
    return XM_ERR(code, "%s failed: UCX status %d (%s)", what, (int)st, ucs_status_string(st));
}

/* The plan agreement over the bootstrap's all-gather. */
static xmesh_result_t ucx_agree(xmesh_ctx_t ctx, xmesh_result_t local, uint64_t hash)
{
    xu_ctx_t *be = ctx->be;
    return xm_oob_agree(&be->oob, local, hash, NULL, NULL, 0, "plan agreement");
}

/* Endpoint error handler (UCP_ERR_HANDLING_MODE_PEER): the peer died or
 * its connection broke. Runs inside ucp_worker_progress (token holder). */
static void peer_failed(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)ep;
    xu_peer_t *p = arg;
    p->fail_status = status;
    __atomic_store_n(&p->failed, 1, __ATOMIC_RELEASE);
}

/* The n-th device of XMESH_UCX_NICS ("eth0,eth1" or "mlx5_0:1,mlx5_1:1"),
 * counted modulo the list; "" when the list is empty. Returns the count. */
static int nic_pick(int n, char *out, size_t len)
{
    const char *list = xm_param_str("XMESH_UCX_NICS");
    out[0] = '\0';
    if (!list || !*list)
        return 0;
    int count = 1;
    for (const char *p = list; *p; p++)
        count += *p == ',';
    int want = n % count, i = 0;
    const char *s = list;
    while (i < want) {
        s = strchr(s, ',') + 1;
        i++;
    }
    const char *e = strchr(s, ',');
    size_t l = e ? (size_t)(e - s) : strlen(s);
    if (l >= len)
        l = len - 1;
    memcpy(out, s, l);
    out[l] = '\0';
    return count;
}

/* This rank's index among the ranks of its (context) host: the model's
 * device index that picks a NIC (xm_cluster_nic_of). */
static int host_index(const xm_hostmap_t *h, int rank)
{
    int k = 0;
    for (int q = 0; q < rank; q++)
        k += h->host_of[q] == h->host_of[rank];
    return k;
}

/* UCX context and worker of this rank. */
static xmesh_result_t ucx_open(xu_ctx_t *be, int nic_index)
{
    ucp_config_t *cfg = NULL;
    ucs_status_t st = ucp_config_read(NULL, NULL, &cfg);
    if (st != UCS_OK)
        return xu_status_err(XMESH_ERR_BACKEND, st, "ucp_config_read");
    be->nic = -1;
    if (nic_pick(nic_index, be->nic_name, sizeof be->nic_name) > 0) {
        /* Network devices only: shared memory inside the host stays. */
        st = ucp_config_modify(cfg, "NET_DEVICES", be->nic_name);
        if (st != UCS_OK) {
            ucp_config_release(cfg);
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "XMESH_UCX_NICS: UCX refused device '%s': %s",
                          be->nic_name, ucs_status_string(st));
        }
        be->nic = nic_index;
    }
    ucp_params_t pp;
    memset(&pp, 0, sizeof pp);
    pp.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    pp.features = UCP_FEATURE_TAG;
    pp.mt_workers_shared = 0;
    st = ucp_init(&pp, cfg, &be->ucp);
    ucp_config_release(cfg);
    if (st != UCS_OK) {
        be->ucp = NULL;
        return xu_status_err(XMESH_ERR_BACKEND, st, "ucp_init");
    }
    ucp_worker_params_t wp;
    memset(&wp, 0, sizeof wp);
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    /* One thread at a time calls UCX: the progress token (exec.c). */
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
    st = ucp_worker_create(be->ucp, &wp, &be->worker);
    if (st != UCS_OK) {
        be->worker = NULL;
        return xu_status_err(XMESH_ERR_BACKEND, st, "ucp_worker_create");
    }
    return XMESH_SUCCESS;
}

#define XU_HOSTLEN 64

/* Worker addresses of every rank through the bootstrap, then endpoints. */
static xmesh_result_t connect_all(xmesh_ctx_t ctx, xu_ctx_t *be)
{
    ucp_address_t *addr = NULL;
    size_t alen = 0;
    ucs_status_t st = ucp_worker_get_address(be->worker, &addr, &alen);
    if (st != UCS_OK)
        return xu_status_err(XMESH_ERR_BACKEND, st, "ucp_worker_get_address");
    int n = ctx->size;
    uint64_t mylen = alen, *lens = malloc(sizeof(uint64_t) * n);
    char *all = NULL, *mine = NULL;
    xmesh_result_t r;
    if (!lens) {
        r = XM_ERR(XMESH_ERR_NO_MEMORY, "context: out of memory");
        goto out;
    }
    if ((r = xm_oob_allgather(&be->oob, &mylen, lens, sizeof mylen, "address lengths")))
        goto out;
    uint64_t mx = 0;
    for (int q = 0; q < n; q++)
        mx = lens[q] > mx ? lens[q] : mx;
    /* A record: the host name (XM_UCX_HOSTLEN bytes), then the address. */
    size_t rec = XU_HOSTLEN + mx;
    all = malloc(rec * n);
    mine = calloc(1, rec);
    if (!all || !mine) {
        r = XM_ERR(XMESH_ERR_NO_MEMORY, "context: out of memory for %d addresses", n);
        goto out;
    }
    xm_oob_hostname(mine, XU_HOSTLEN);
    memcpy(mine + XU_HOSTLEN, addr, alen);
    if ((r = xm_oob_allgather(&be->oob, mine, all, rec, "worker addresses")))
        goto out;
    for (int q = 0; q < n; q++) {
        be->peers[q].be = be;
        be->peers[q].rank = q;
        if (q == ctx->rank)
            continue;
        ucp_ep_params_t ep;
        memset(&ep, 0, sizeof ep);
        ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                        UCP_EP_PARAM_FIELD_ERR_HANDLER;
        ep.address = (const ucp_address_t *)(all + (size_t)q * rec + XU_HOSTLEN);
        /* Peer failure handling where UCX has it (TCP, RDMA): a dead peer
         * fails the operations with it at once. UCX 1.13's shared-memory
         * transports have none and are excluded by it, so ranks of one
         * machine (equal host names) keep shared memory and rely on the
         * timeout and the abort check. */
        int same = !strcmp(all + (size_t)q * rec, all + (size_t)ctx->rank * rec);
        ep.err_mode = same ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER;
        ep.err_handler.cb = peer_failed;
        ep.err_handler.arg = &be->peers[q];
        st = ucp_ep_create(be->worker, &ep, &be->peers[q].ep);
        if (st != UCS_OK) {
            be->peers[q].ep = NULL;
            char w[64];
            snprintf(w, sizeof w, "ucp_ep_create(rank %d)", q);
            r = xu_status_err(XMESH_ERR_BACKEND, st, w);
            goto out;
        }
    }
    r = XMESH_SUCCESS;
out:
    ucp_worker_release_address(be->worker, addr);
    free(lens);
    free(all);
    free(mine);
    return r;
}

/* Closes every endpoint, flushing what was sent (a peer still receiving
 * gets it), at most `limit` seconds; then the worker and the context. */
static void ucx_close(xmesh_ctx_t ctx, xu_ctx_t *be, double limit)
{
    if (be->peers && be->worker) {
        int n = ctx->size;
        void **reqs = calloc((size_t)n, sizeof *reqs);
        for (int q = 0; q < n; q++) {
            if (!be->peers[q].ep)
                continue;
            ucp_request_param_t prm;
            memset(&prm, 0, sizeof prm);
            prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
            prm.flags = __atomic_load_n(&be->peers[q].failed, __ATOMIC_ACQUIRE) ||
                                __atomic_load_n(&be->peers[q].suspect, __ATOMIC_RELAXED)
                            ? UCP_EP_CLOSE_FLAG_FORCE
                            : 0;
            void *rq = ucp_ep_close_nbx(be->peers[q].ep, &prm);
            if (UCS_PTR_IS_PTR(rq) && reqs)
                reqs[q] = rq;
            be->peers[q].ep = NULL;
        }
        double end = xu_now() + limit;
        for (int pending = 1; pending && reqs;) {
            ucp_worker_progress(be->worker);
            pending = 0;
            for (int q = 0; q < n; q++)
                if (reqs[q]) {
                    if (ucp_request_check_status(reqs[q]) != UCS_INPROGRESS) {
                        ucp_request_free(reqs[q]);
                        reqs[q] = NULL;
                    } else {
                        pending = 1;
                    }
                }
            if (pending && xu_now() > end) {
                /* A peer that neither takes nor refuses what was sent to
                 * it (stopped, not dead): UCX cannot destroy an endpoint
                 * with requests queued, so the worker and the UCX context
                 * are left to the process's end. */
                XM_WARN("rank %d: UCX endpoints did not close within %.3g s; the UCX worker is "
                        "left open",
                        ctx->rank, limit);
                free(reqs);
                be->worker = NULL;
                be->ucp = NULL;
                return;
            }
        }
        free(reqs);
    }
    if (be->worker)
        ucp_worker_destroy(be->worker);
    if (be->ucp)
        ucp_cleanup(be->ucp);
    be->worker = NULL;
    be->ucp = NULL;
}

xmesh_result_t xmesh_ctx_create_ucx(const xmesh_oob_t *oob, const xmesh_ctx_params_t *params,
                                    xmesh_ctx_t *out)
{
    xmesh_result_t r;
    if (!out)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xmesh_ctx_create_ucx: out is NULL");
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
    if (oob && (r = xm_oob_check(oob)))
        return r;
    double timeout =
        params->timeout_s >= 0 ? params->timeout_s : xm_param_double("XMESH_TIMEOUT_S");
    struct xmesh_ctx *ctx = calloc(1, sizeof *ctx);
    xu_ctx_t *be = calloc(1, sizeof *be);
    if (!ctx || !be) {
        free(ctx);
        free(be);
        return XM_ERR(XMESH_ERR_NO_MEMORY, "context: out of memory");
    }
    if (oob) {
        be->oob = *oob;
    } else if ((r = xm_envboot_create(timeout, &be->boot, &be->oob))) {
        free(ctx);
        free(be);
        return r;
    }
    ctx->rank = be->oob.rank;
    ctx->size = be->oob.size;
    ctx->timeout_s = timeout;
    int local_rank = 0;
    if ((r = xm_oob_hosts(&be->oob, params->host_id, &local_rank, &ctx->hosts)))
        goto out_boot;
    /* UCX up on every rank, or an error on every rank. */
    xmesh_result_t local = XMESH_SUCCESS;
    char saved[1024] = "";
    be->peers = calloc((size_t)ctx->size, sizeof *be->peers);
    if (!be->peers)
        local = XM_ERR(XMESH_ERR_NO_MEMORY, "context: out of memory for %d peers", ctx->size);
    if (!local)
        local = ucx_open(be, host_index(&ctx->hosts, ctx->rank));
    if (local)
        snprintf(saved, sizeof saved, "%s", xmesh_last_error());
    if ((r = xm_oob_agree(&be->oob, local, 0, NULL, NULL, 0, "UCX start-up"))) {
        if (local)
            r = XM_ERR(local, "%s", saved);
        goto out_ucx;
    }
    /* Connecting is collective (addresses); a failure is agreed after it. */
    local = connect_all(ctx, be);
    if (local)
        snprintf(saved, sizeof saved, "%s", xmesh_last_error());
    if ((r = xm_oob_agree(&be->oob, local, 0, NULL, NULL, 0, "UCX endpoints"))) {
        if (local)
            r = XM_ERR(local, "%s", saved);
        goto out_ucx;
    }
    pthread_mutex_init(&be->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&be->work_cv, &ca);
    pthread_cond_init(&be->done_cv, &ca);
    pthread_condattr_destroy(&ca);
    be->threaded = xm_param_i64("XMESH_PROGRESS_THREAD") != 0;
    ctx->ops = &ucx_ops;
    ctx->be = be;
    XM_INFO("ctx: rank %d of %d on host %d of %d, UCX %s, NIC '%s', %s", ctx->rank, ctx->size,
            ctx->hosts.host_of[ctx->rank], ctx->hosts.nhosts, ucp_get_version_string(),
            be->nic_name, be->threaded ? "progress thread" : "progress in test/wait only");
    *out = ctx;
    return XMESH_SUCCESS;
out_ucx:
    ucx_close(ctx, be, 1.0);
    free(be->peers);
    xm_hostmap_free(&ctx->hosts);
out_boot:
    xm_envboot_destroy(be->boot);
    free(be);
    free(ctx);
    return r;
}

/* ops->ctx_free: progress thread, requests, endpoints, worker, bootstrap
 * (api.c has checked that no plan or mesh is left). */
static void ucx_ctx_free(xmesh_ctx_t ctx)
{
    xu_ctx_t *be = ctx->be;
    if (!be)
        return;
    xu_ctx_stop_thread(be);
    double limit = ctx->timeout_s > 0 && ctx->timeout_s < 2 ? ctx->timeout_s : 2;
    ucx_close(ctx, be, limit);
    xu_ctx_free_requests(be);
    free(be->peers);
    pthread_cond_destroy(&be->work_cv);
    pthread_cond_destroy(&be->done_cv);
    pthread_mutex_destroy(&be->mu);
    xm_envboot_destroy(be->boot);
    free(be);
    ctx->be = NULL;
}
