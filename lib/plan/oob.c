/* Out-of-band collectives derived from one all-gather (xm_oob.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "xm_oob.h"

xmesh_result_t xm_oob_check(const xmesh_oob_t *oob)
{
    if (!oob)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "oob is NULL");
    if (oob->size < 1)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "oob: size %d must be >= 1", oob->size);
    if (oob->rank < 0 || oob->rank >= oob->size)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "oob: rank %d outside [0, %d)", oob->rank,
                      oob->size);
    if (!oob->allgather)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "oob: allgather is NULL");
    return XMESH_SUCCESS;
}

xmesh_result_t xm_oob_allgather(const xmesh_oob_t *oob, const void *send, void *recv, size_t bytes,
                                const char *what)
{
    int rc = oob->allgather(oob->user, send, recv, bytes);
    if (rc) {
        /* The environment bootstrap leaves its own message; keep it. */
        char why[700];
        snprintf(why, sizeof why, "%s", xmesh_last_error());
        return XM_ERR(XMESH_ERR_BACKEND, "rank %d: out-of-band all-gather (%s) failed (%d)%s%s",
                      oob->rank, what, rc, *why ? ": " : "", why);
    }
    return XMESH_SUCCESS;
}

xmesh_result_t xm_oob_bcast(const xmesh_oob_t *oob, void *buf, size_t bytes, int root,
                            const char *what)
{
    if (oob->size == 1 || bytes == 0)
        return XMESH_SUCCESS;
    char *all = malloc(bytes * (size_t)oob->size);
    if (!all)
        return XM_ERR(XMESH_ERR_NO_MEMORY, "%s: out of memory for %zu x %d bytes", what, bytes,
                      oob->size);
    xmesh_result_t r = xm_oob_allgather(oob, buf, all, bytes, what);
    if (!r)
        memcpy(buf, all + (size_t)root * bytes, bytes);
    free(all);
    return r;
}

xmesh_result_t xm_oob_agree(const xmesh_oob_t *oob, xmesh_result_t local, uint64_t hash,
                            const uint64_t *extra_in, uint64_t *extra_out, int nextra,
                            const char *what)
{
    size_t n = 2 + (size_t)nextra;
    uint64_t *in = malloc(sizeof(uint64_t) * n), *all = malloc(sizeof(uint64_t) * n * oob->size);
    if (!in || !all) {
        free(in);
        free(all);
        return XM_ERR(XMESH_ERR_NO_MEMORY, "%s: out of memory", what);
    }
    in[0] = local ? 1 : 0;
    in[1] = local ? 0 : hash;
    for (int i = 0; i < nextra; i++)
        in[2 + i] = extra_in[i];
    xmesh_result_t r = xm_oob_allgather(oob, in, all, sizeof(uint64_t) * n, what);
    free(in);
    if (r) {
        free(all);
        return local ? local : r;
    }
    int failed = -1;
    uint64_t hmin = UINT64_MAX, hmax = 0;
    for (int q = 0; q < oob->size; q++) {
        const uint64_t *v = all + (size_t)q * n;
        if (v[0]) {
            if (failed < 0)
                failed = q;
            continue;
        }
        hmin = v[1] < hmin ? v[1] : hmin;
        hmax = v[1] > hmax ? v[1] : hmax;
    }
    for (int i = 0; i < nextra; i++) {
        uint64_t m = 0;
        for (int q = 0; q < oob->size; q++)
            m = all[(size_t)q * n + 2 + i] > m ? all[(size_t)q * n + 2 + i] : m;
        extra_out[i] = m;
    }
    free(all);
    if (local)
        return local;
    if (failed >= 0)
        return XM_ERR(XMESH_ERR_REMOTE, "%s: rank %d failed (see its error); no data moved", what,
                      failed);
    if (hmax != hmin)
        return XM_ERR(XMESH_ERR_MISMATCH,
                      "ranks passed different plan inputs (shape, dtype, meshes, shardings, params "
                      "or cluster model): this rank's hash %016llx, range over ranks [%016llx, "
                      "%016llx]",
                      (unsigned long long)hash, (unsigned long long)hmin, (unsigned long long)hmax);
    return XMESH_SUCCESS;
}

void xm_oob_hostname(char *buf, size_t len)
{
    const char *h = xm_param_str("XMESH_HOST");
    if (h && *h) {
        snprintf(buf, len, "%s", h);
        return;
    }
    if (gethostname(buf, len) != 0)
        snprintf(buf, len, "localhost");
    buf[len - 1] = '\0';
}

/* XMESH_HOST_ID: an integer, or "rank/N" (N consecutive ranks per host). */
static xmesh_result_t parse_host_id(const char *s, int rank, int *out)
{
    char *end;
    long v;
    if (!strncmp(s, "rank/", 5)) {
        v = strtol(s + 5, &end, 10);
        if (*end == 0 && v >= 1) {
            *out = (int)(rank / v);
            return XMESH_SUCCESS;
        }
    } else {
        v = strtol(s, &end, 10);
        if (*end == 0 && v >= 0 && v <= 1 << 30) {
            *out = (int)v;
            return XMESH_SUCCESS;
        }
    }
    return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                  "XMESH_HOST_ID '%s': expected an integer >= 0 or rank/N with N >= 1", s);
}

#define XM_OOB_HOSTLEN 64

typedef struct {
    int32_t id;  /* explicit host id, -1 none */
    int32_t bad; /* this rank's XMESH_HOST_ID was refused */
    char name[XM_OOB_HOSTLEN];
} host_rec_t;

xmesh_result_t xm_oob_hosts(const xmesh_oob_t *oob, int host_id, int *local_rank, xm_hostmap_t *out)
{
    int rank = oob->rank, size = oob->size;
    host_rec_t me;
    memset(&me, 0, sizeof me);
    me.id = host_id != XMESH_UNSET_INT && host_id >= 0 ? host_id : -1;
    char saved[512] = "";
    const char *env = getenv("XMESH_HOST_ID");
    int id = me.id;
    if (host_id == XMESH_UNSET_INT && env && *env && parse_host_id(env, rank, &id)) {
        snprintf(saved, sizeof saved, "%s", xmesh_last_error());
        me.bad = 1;
    }
    me.id = id;
    xm_oob_hostname(me.name, sizeof me.name);
    host_rec_t *all = malloc(sizeof *all * size);
    int *host = malloc(sizeof(int) * size);
    if (!all || !host) {
        free(all);
        free(host);
        return XM_ERR(XMESH_ERR_NO_MEMORY, "context: out of memory for %d ranks", size);
    }
    xmesh_result_t r = xm_oob_allgather(oob, &me, all, sizeof me, "host names");
    if (r) {
        free(all);
        free(host);
        return r;
    }
    int all_have = 1, anybad = -1;
    for (int q = 0; q < size; q++) {
        all[q].name[XM_OOB_HOSTLEN - 1] = '\0';
        all_have &= all[q].id >= 0;
        if (all[q].bad && anybad < 0)
            anybad = q;
    }
    if (anybad >= 0) {
        free(all);
        free(host);
        return me.bad ? XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s", saved)
                      : XM_ERR(XMESH_ERR_REMOTE, "rank %d rejected its XMESH_HOST_ID", anybad);
    }
    int nhosts = 0, lr = 0;
    for (int q = 0; q < size; q++) {
        host[q] = -1;
        for (int p = 0; p < q && host[q] < 0; p++)
            if (all_have ? all[p].id == all[q].id : !strcmp(all[p].name, all[q].name))
                host[q] = host[p];
        if (host[q] < 0)
            host[q] = nhosts++;
        if (q < rank && !strcmp(all[q].name, me.name))
            lr++;
    }
    free(all);
    if (local_rank)
        *local_rank = lr;
    out->ndev = size;
    out->nhosts = nhosts;
    out->host_of = host;
    return XMESH_SUCCESS;
}

xmesh_result_t xm_oob_share_schedule(const xmesh_oob_t *oob, xmesh_plan_t p, int *flags, int nflags)
{
    int rank = oob->rank;
    int nt = p->ts.ntasks, mg = p->sched.max_groups;
    /* Every rank sends as many ints as rank 0 (the plan was agreed, so the
     * task counts are equal; a disagreement is reported below). */
    int64_t hdr = 2 + nflags, nbuf = hdr + (int64_t)nt * (1 + mg);
    int *buf = calloc((size_t)nbuf, sizeof(int));
    if (!buf)
        return XM_ERR(XMESH_ERR_NO_MEMORY, "plan setup: out of memory for %d tasks", nt);
    buf[0] = nt;
    buf[1] = mg;
    if (rank == 0) {
        if (nflags > 0)
            memcpy(buf + 2, flags, sizeof(int) * nflags);
        memcpy(buf + hdr, p->sched.order, sizeof(int) * nt);
        memcpy(buf + hdr + nt, p->sched.sender, sizeof(int) * (int64_t)nt * mg);
    }
    xmesh_result_t r = xm_oob_bcast(oob, buf, sizeof(int) * (size_t)nbuf, 0, "schedule");
    if (r) {
        free(buf);
        return r;
    }
    xmesh_result_t local = XMESH_SUCCESS;
    if (buf[0] != nt || buf[1] != mg)
        local = XM_ERR(XMESH_ERR_INTERNAL,
                       "plan setup: rank 0 has %d tasks x %d groups, this rank %d x %d", buf[0],
                       buf[1], nt, mg);
    if (!local && rank != 0) {
        xm_schedule_t ns;
        /* As lib/mpi/boot.c: the all-gather strategies take senders and
         * order from the sendrecv route model. */
        xmesh_strategy_t sst = p->strategy == XMESH_STRATEGY_SENDRECV_ALLGATHER ||
                                       p->strategy == XMESH_STRATEGY_GLOBAL_ALLGATHER
                                   ? XMESH_STRATEGY_SENDRECV
                                   : p->strategy;
        xm_sched_opts_t so = {
            .kind = p->scheduler, .budget_us = p->budget_us, .seed = p->seed, .strategy = sst};
        local = xm_schedule_from(&p->ts, &p->cluster, &so, buf + hdr, buf + hdr + nt, &ns);
        if (!local) {
            xm_schedule_free(&p->sched);
            p->sched = ns;
        }
    }
    if (rank != 0 && nflags > 0)
        memcpy(flags, buf + 2, sizeof(int) * nflags);
    free(buf);
    return local;
}
