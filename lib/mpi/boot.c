/* Bootstrap shared by the MPI and NCCL backends (xm_boot.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xm_boot.h"

xmesh_result_t xm_boot_mpi_err(int mpirc, const char *what)
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

xmesh_result_t xm_boot_hosts(MPI_Comm comm, int host_id, int *local_rank, xm_hostmap_t *out)
{
    int rank, size, rc;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    /* Every rank must reach the collectives below, so a bad local value is
     * only reported after them. */
    int id = host_id != XMESH_UNSET_INT && host_id >= 0 ? host_id : -1;
    xmesh_result_t local = XMESH_SUCCESS;
    char saved[512] = "";
    const char *env = xm_param_str("XMESH_HOST_ID"); /* "" when unset */
    if (host_id == XMESH_UNSET_INT && env && *env &&
        (local = parse_host_env(env, rank, &id)) != XMESH_SUCCESS)
        snprintf(saved, sizeof saved, "%s", xmesh_last_error());
    int have = id >= 0, all_have = 0;
    if ((rc = MPI_Allreduce(&have, &all_have, 1, MPI_INT, MPI_MIN, comm)))
        return xm_boot_mpi_err(rc, "MPI_Allreduce(host ids)");
    int key = id; /* mixing explicit ids and the split would be meaningless */
    if (!all_have || local_rank) {
        MPI_Comm shm;
        if ((rc = MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &shm)))
            return xm_boot_mpi_err(rc, "MPI_Comm_split_type(SHARED)");
        int lowest = rank; /* the host's lowest rank names it */
        if (local_rank)
            MPI_Comm_rank(shm, local_rank);
        rc = MPI_Allreduce(&rank, &lowest, 1, MPI_INT, MPI_MIN, shm);
        MPI_Comm_free(&shm);
        if (rc)
            return xm_boot_mpi_err(rc, "MPI_Allreduce(host leader)");
        if (!all_have)
            key = lowest;
    }
    int *keys = malloc(sizeof(int) * size), *host = malloc(sizeof(int) * size);
    if (!keys || !host) {
        free(keys);
        free(host);
        return XM_ERR(XMESH_ERR_NO_MEMORY, "context: out of memory for %d ranks", size);
    }
    if ((rc = MPI_Allgather(&key, 1, MPI_INT, keys, 1, MPI_INT, comm))) {
        free(keys);
        free(host);
        return xm_boot_mpi_err(rc, "MPI_Allgather(host ids)");
    }
    int nhosts = 0;
    for (int r = 0; r < size; r++) {
        host[r] = -1;
        for (int q = 0; q < r && host[r] < 0; q++)
            if (keys[q] == keys[r])
                host[r] = host[q];
        if (host[r] < 0)
            host[r] = nhosts++;
    }
    free(keys);
    int bad = local != XMESH_SUCCESS, anybad = 0;
    if ((rc = MPI_Allreduce(&bad, &anybad, 1, MPI_INT, MPI_MAX, comm)) || anybad) {
        free(host);
        if (rc)
            return xm_boot_mpi_err(rc, "MPI_Allreduce(host ids)");
        return local ? XM_ERR(local, "%s", saved)
                     : XM_ERR(XMESH_ERR_REMOTE, "another rank rejected its XMESH_HOST_ID");
    }
    out->ndev = size;
    out->nhosts = nhosts;
    out->host_of = host;
    return XMESH_SUCCESS;
}

xmesh_result_t xm_boot_agree(MPI_Comm comm, xmesh_result_t local, uint64_t hash,
                             const uint64_t *extra_in, uint64_t *extra_out, int nextra,
                             const char *what)
{
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    uint64_t stack_in[8], stack_out[8];
    uint64_t *in = nextra + 3 <= 8 ? stack_in : malloc(sizeof(uint64_t) * (nextra + 3));
    uint64_t *outv = nextra + 3 <= 8 ? stack_out : malloc(sizeof(uint64_t) * (nextra + 3));
    if (!in || !outv) {
        if (in != stack_in)
            free(in);
        if (outv != stack_out)
            free(outv);
        return XM_ERR(XMESH_ERR_NO_MEMORY, "%s: out of memory", what);
    }
    /* A failing rank's hash is meaningless: send the neutral element. */
    in[0] = local ? 0 : hash;
    in[1] = local ? 0 : ~hash;
    in[2] = local ? (uint64_t)(size - rank) : 0; /* max picks the lowest failing rank */
    for (int i = 0; i < nextra; i++)
        in[3 + i] = extra_in[i];
    int rc = MPI_Allreduce(in, outv, 3 + nextra, MPI_UINT64_T, MPI_MAX, comm);
    for (int i = 0; !rc && i < nextra; i++)
        extra_out[i] = outv[3 + i];
    uint64_t failed = outv[2], hmax = outv[0], hmin = ~outv[1];
    if (in != stack_in)
        free(in);
    if (outv != stack_out)
        free(outv);
    if (rc) {
        char w[160];
        snprintf(w, sizeof w, "MPI_Allreduce(%s)", what);
        return xm_boot_mpi_err(rc, w);
    }
    if (local)
        return local;
    if (failed)
        return XM_ERR(XMESH_ERR_REMOTE, "%s: rank %d failed (see its error); no data moved", what,
                      size - (int)failed);
    if (hmax != hmin)
        return XM_ERR(XMESH_ERR_MISMATCH,
                      "ranks passed different plan inputs (shape, dtype, meshes, shardings, params "
                      "or cluster model): this rank's hash %016llx, range over ranks [%016llx, "
                      "%016llx]",
                      (unsigned long long)hash, (unsigned long long)hmin, (unsigned long long)hmax);
    return XMESH_SUCCESS;
}

xmesh_result_t xm_boot_share_schedule(MPI_Comm comm, xmesh_plan_t p, int *flags, int nflags)
{
    int rank, rc;
    MPI_Comm_rank(comm, &rank);
    int nt = p->ts.ntasks, mg = p->sched.max_groups;
    int64_t hdr = 2 + nflags, nbuf = hdr + (int64_t)nt * (1 + mg);
    int *buf = malloc(sizeof(int) * nbuf);
    if (!buf)
        return XM_ERR(XMESH_ERR_NO_MEMORY, "plan setup: out of memory for %d tasks", nt);
    if (rank == 0) {
        buf[0] = nt;
        buf[1] = mg;
        if (nflags > 0)
            memcpy(buf + 2, flags, sizeof(int) * nflags);
        memcpy(buf + hdr, p->sched.order, sizeof(int) * nt);
        memcpy(buf + hdr + nt, p->sched.sender, sizeof(int) * (int64_t)nt * mg);
    }
    if ((rc = MPI_Bcast(buf, (int)nbuf, MPI_INT, 0, comm))) {
        free(buf);
        return xm_boot_mpi_err(rc, "MPI_Bcast(schedule)");
    }
    xmesh_result_t local = XMESH_SUCCESS;
    if (buf[0] != nt || buf[1] != mg)
        local = XM_ERR(XMESH_ERR_INTERNAL,
                       "plan setup: rank 0 has %d tasks x %d groups, this rank %d x %d", buf[0],
                       buf[1], nt, mg);
    if (!local && rank != 0) {
        xm_schedule_t ns;
        /* The scheduler has route models for broadcast and sendrecv only; the
         * all-gather baselines take senders and order from the sendrecv model
         * (their chains are built by xm_chains_build). api.c maps them the
         * same way. */
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
