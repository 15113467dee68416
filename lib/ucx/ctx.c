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

/* The devices of XMESH_UCX_NICS ("eth0,eth1" or "mlx5_0:1,mlx5_1:1") into
 * names[], in order; returns their count (0 when the list is empty), or -1
 * after XM_ERR for a list that is too long or has an empty or too long name. */
static int nic_list(char names[XU_RAILS_MAX][128])
{
    const char *list = xm_param_str("XMESH_UCX_NICS");
    if (!list || !*list)
        return 0;
    int count = 0;
    for (const char *s = list;; count++) {
        const char *e = strchr(s, ',');
        size_t l = e ? (size_t)(e - s) : strlen(s);
        if (count == XU_RAILS_MAX) {
            XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "XMESH_UCX_NICS '%s': more than %d devices", list,
                   XU_RAILS_MAX);
            return -1;
        }
        if (l == 0 || l >= 128) {
            XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                   "XMESH_UCX_NICS '%s': device %d is %s (names are 1 to 127 characters, "
                   "separated by commas)",
                   list, count, l ? "too long" : "empty");
            return -1;
        }
        memcpy(names[count], s, l);
        names[count][l] = '\0';
        if (!e)
            return count + 1;
        s = e + 1;
    }
}

/* One UCX context and worker per device of XMESH_UCX_NICS (one without a
 * list, on UCX's choice of devices), worker k bound to device k. */
static xmesh_result_t ucx_open(xu_ctx_t *be)
{
    char names[XU_RAILS_MAX][128];
    int n = nic_list(names);
    if (n < 0)
        return XMESH_ERR_INVALID_ARGUMENT;
    be->nw = n > 0 ? n : 1;
    be->nic_names[0] = '\0';
    for (int k = 0; k < n; k++) {
        size_t l = strlen(be->nic_names);
        snprintf(be->nic_names + l, sizeof be->nic_names - l, "%s%s", k ? "," : "", names[k]);
    }
    for (int k = 0; k < be->nw; k++) {
        ucp_config_t *cfg = NULL;
        ucs_status_t st = ucp_config_read(NULL, NULL, &cfg);
        if (st != UCS_OK)
            return xu_status_err(XMESH_ERR_BACKEND, st, "ucp_config_read");
        /* Network devices only: shared memory inside the host stays. */
        if (n > 0 && (st = ucp_config_modify(cfg, "NET_DEVICES", names[k])) != UCS_OK) {
            ucp_config_release(cfg);
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "XMESH_UCX_NICS: UCX refused device '%s': %s",
                          names[k], ucs_status_string(st));
        }
        ucp_params_t pp;
        memset(&pp, 0, sizeof pp);
        pp.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
        pp.features = UCP_FEATURE_TAG;
        pp.mt_workers_shared = 0;
        st = ucp_init(&pp, cfg, &be->ucp[k]);
        ucp_config_release(cfg);
        if (st != UCS_OK) {
            be->ucp[k] = NULL;
            return xu_status_err(XMESH_ERR_BACKEND, st, "ucp_init");
        }
        ucp_worker_params_t wp;
        memset(&wp, 0, sizeof wp);
        wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
        /* One thread at a time calls UCX: the progress token (exec.c). */
        wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
        st = ucp_worker_create(be->ucp[k], &wp, &be->worker[k]);
        if (st != UCS_OK) {
            be->worker[k] = NULL;
            return xu_status_err(XMESH_ERR_BACKEND, st, "ucp_worker_create");
        }
    }
    return XMESH_SUCCESS;
}

#define XU_HOSTLEN 64

/* Worker addresses of every rank through the bootstrap (a record per rank:
 * the host name, the worker count, then each worker's address), then
 * endpoint k of every peer from worker k to its worker k. Every rank must
 * have as many workers (XMESH_UCX_NICS naming as many devices everywhere). */
static xmesh_result_t connect_all(xmesh_ctx_t ctx, xu_ctx_t *be)
{
    int n = ctx->size, nw = be->nw;
    ucp_address_t *addr[XU_RAILS_MAX] = {NULL};
    uint64_t mylen[XU_RAILS_MAX + 1] = {0}, *lens = malloc(sizeof mylen * n);
    char *all = NULL, *mine = NULL;
    xmesh_result_t r;
    if (!lens) {
        r = XM_ERR(XMESH_ERR_NO_MEMORY, "context: out of memory");
        goto out;
    }
    mylen[XU_RAILS_MAX] = (uint64_t)nw;
    for (int k = 0; k < nw; k++) {
        size_t alen = 0;
        ucs_status_t st = ucp_worker_get_address(be->worker[k], &addr[k], &alen);
        if (st != UCS_OK) {
            addr[k] = NULL;
            r = xu_status_err(XMESH_ERR_BACKEND, st, "ucp_worker_get_address");
            goto out;
        }
        mylen[k] = alen;
    }
    if ((r = xm_oob_allgather(&be->oob, mylen, lens, sizeof mylen, "address lengths")))
        goto out;
    uint64_t mx = 0;
    for (int q = 0; q < n; q++) {
        const uint64_t *l = lens + (size_t)q * (XU_RAILS_MAX + 1);
        if (l[XU_RAILS_MAX] != (uint64_t)nw) {
            r = XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                       "XMESH_UCX_NICS: rank %d opened %llu UCX worker(s) (one per device), rank "
                       "%d %d: every rank must name as many devices",
                       q, (unsigned long long)l[XU_RAILS_MAX], ctx->rank, nw);
            goto out;
        }
        for (int k = 0; k < nw; k++)
            mx = l[k] > mx ? l[k] : mx;
    }
    /* A record: the host name (XU_HOSTLEN bytes), then nw addresses of mx bytes. */
    size_t rec = XU_HOSTLEN + (size_t)nw * mx;
    all = malloc(rec * n);
    mine = calloc(1, rec);
    if (!all || !mine) {
        r = XM_ERR(XMESH_ERR_NO_MEMORY, "context: out of memory for %d addresses", n);
        goto out;
    }
    xm_oob_hostname(mine, XU_HOSTLEN);
    for (int k = 0; k < nw; k++)
        memcpy(mine + XU_HOSTLEN + (size_t)k * mx, addr[k], mylen[k]);
    if ((r = xm_oob_allgather(&be->oob, mine, all, rec, "worker addresses")))
        goto out;
    for (int q = 0; q < n; q++) {
        be->peers[q].be = be;
        be->peers[q].rank = q;
        if (q == ctx->rank)
            continue;
        /* Peer failure handling where UCX has it (TCP, RDMA): a dead peer
         * fails the operations with it at once. UCX 1.13's shared-memory
         * transports have none and are excluded by it, so ranks of one
         * machine (equal host names) keep shared memory and rely on the
         * timeout and the abort check. */
        int same = !strcmp(all + (size_t)q * rec, all + (size_t)ctx->rank * rec);
        for (int k = 0; k < nw; k++) {
            ucp_ep_params_t ep;
            memset(&ep, 0, sizeof ep);
            ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                            UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
            ep.address =
                (const ucp_address_t *)(all + (size_t)q * rec + XU_HOSTLEN + (size_t)k * mx);
            ep.err_mode = same ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER;
            ep.err_handler.cb = peer_failed;
            ep.err_handler.arg = &be->peers[q];
            ucs_status_t st = ucp_ep_create(be->worker[k], &ep, &be->peers[q].ep[k]);
            if (st != UCS_OK) {
                be->peers[q].ep[k] = NULL;
                char w[64];
                snprintf(w, sizeof w, "ucp_ep_create(rank %d, worker %d)", q, k);
                r = xu_status_err(XMESH_ERR_BACKEND, st, w);
                goto out;
            }
        }
    }
    r = XMESH_SUCCESS;
out:
    for (int k = 0; k < nw; k++)
        if (addr[k])
            ucp_worker_release_address(be->worker[k], addr[k]);
    free(lens);
    free(all);
    free(mine);
    return r;
}

/* Closes every endpoint, flushing what was sent (a peer still receiving
 * gets it), at most `limit` seconds; then the workers and the contexts. */
static void ucx_close(xmesh_ctx_t ctx, xu_ctx_t *be, double limit)
{
    int nw = be->nw;
    if (be->peers && nw > 0 && be->worker[0]) {
        int n = ctx->size;
        void **reqs = calloc((size_t)n * nw, sizeof *reqs);
        for (int q = 0; q < n; q++)
            for (int k = 0; k < nw; k++) {
                if (!be->peers[q].ep[k])
                    continue;
                ucp_request_param_t prm;
                memset(&prm, 0, sizeof prm);
                prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
                prm.flags = __atomic_load_n(&be->peers[q].failed, __ATOMIC_ACQUIRE) ||
                                    __atomic_load_n(&be->peers[q].suspect, __ATOMIC_RELAXED)
                                ? UCP_EP_CLOSE_FLAG_FORCE
                                : 0;
                void *rq = ucp_ep_close_nbx(be->peers[q].ep[k], &prm);
                if (UCS_PTR_IS_PTR(rq) && reqs)
                    reqs[(size_t)q * nw + k] = rq;
                be->peers[q].ep[k] = NULL;
            }
        double end = xu_now() + limit;
        for (int pending = 1; pending && reqs;) {
            xu_progress(be);
            pending = 0;
            for (size_t i = 0; i < (size_t)n * nw; i++)
                if (reqs[i]) {
                    if (ucp_request_check_status(reqs[i]) != UCS_INPROGRESS) {
                        ucp_request_free(reqs[i]);
                        reqs[i] = NULL;
                    } else {
                        pending = 1;
                    }
                }
            if (pending && xu_now() > end) {
                /* A peer that neither takes nor refuses what was sent to
                 * it (stopped, not dead): UCX cannot destroy an endpoint
                 * with requests queued, so the workers and the UCX contexts
                 * are left to the process's end. */
                XM_WARN("rank %d: UCX endpoints did not close within %.3g s; the UCX workers are "
                        "left open",
                        ctx->rank, limit);
                free(reqs);
                memset(be->worker, 0, sizeof be->worker);
                memset(be->ucp, 0, sizeof be->ucp);
                return;
            }
        }
        free(reqs);
    }
    for (int k = 0; k < XU_RAILS_MAX; k++) {
        if (be->worker[k])
            ucp_worker_destroy(be->worker[k]);
        if (be->ucp[k])
            ucp_cleanup(be->ucp[k]);
        be->worker[k] = NULL;
        be->ucp[k] = NULL;
    }
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
        local = ucx_open(be);
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
    XM_INFO("ctx: rank %d of %d on host %d of %d, UCX %s, %d worker(s) on NICs '%s', %s", ctx->rank,
            ctx->size, ctx->hosts.host_of[ctx->rank], ctx->hosts.nhosts, ucp_get_version_string(),
            be->nw, be->nic_names, be->threaded ? "progress thread" : "progress in test/wait only");
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
