/* XMESH_TRACE: Chrome trace-event JSON of real reshards. Every participant
 * records its events in a bounded buffer; after each reshard they are sent
 * to the plan's leader (lowest rank of either mesh), which writes one file
 * (pid = host, tid = rank, times in microseconds since plan setup). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xm_mpi.h"

void xm_mpi_trace_add(xm_exec_t *x, int kind, int task, int peer, int64_t chunk, int64_t bytes,
                      double t0, double t1)
{
    if (x->nev >= x->cap_ev) {
        x->dropped_ev++;
        return;
    }
    x->ev[x->nev++] = (xm_trace_ev_t){t0, t1, kind, task, peer, chunk, bytes};
}

/* "%p" -> plan id, "%n" -> reshard index of the plan, "%%" -> "%". */
static void expand_path(const xm_exec_t *x, char *out, size_t len)
{
    size_t o = 0;
    for (const char *s = x->trace_path; *s && o + 24 < len; s++) {
        if (s[0] == '%' && s[1] == 'p') {
            o += snprintf(out + o, len - o, "%d", x->plan_id);
            s++;
        } else if (s[0] == '%' && s[1] == 'n') {
            o += snprintf(out + o, len - o, "%lld", (long long)x->nreshards);
            s++;
        } else if (s[0] == '%' && s[1] == '%') {
            out[o++] = '%';
            s++;
        } else {
            out[o++] = *s;
        }
    }
    out[o] = '\0';
}

static const char *kind_name[] = {"task", "send", "recv", "copy"};

static void write_events(FILE *f, const xm_trace_ev_t *ev, int64_t n, int rank, int host,
                         int *first)
{
    for (int64_t i = 0; i < n; i++) {
        const xm_trace_ev_t *e = &ev[i];
        int k = e->kind >= 0 && e->kind < 4 ? e->kind : 0;
        char name[64];
        if (k == 0)
            snprintf(name, sizeof name, "task %d", e->task);
        else
            snprintf(name, sizeof name, "%s t%d c%lld", kind_name[k], e->task, (long long)e->chunk);
        fprintf(f,
                "%s\n{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,"
                "\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"task\":%d,\"chunk\":%lld,\"peer\":%d,"
                "\"bytes\":%lld}}",
                *first ? "" : ",", name, kind_name[k], host, rank, e->t0 * 1e6,
                (e->t1 - e->t0) * 1e6, e->task, (long long)e->chunk, e->peer, (long long)e->bytes);
        *first = 0;
    }
}

/* Leader: writes the merged events. 0 on success, -1 with r->msg set. */
static int write_file(xm_request_t *r)
{
    xmesh_plan_t p = r->plan;
    xm_exec_t *x = p->exec;
    char path[600];
    expand_path(x, path, sizeof path);
    FILE *f = fopen(path, "w");
    if (!f) {
        snprintf(r->msg, sizeof r->msg, "XMESH_TRACE: cannot open '%.400s' for writing", path);
        return -1;
    }
    int first = 1;
    fprintf(f, "{\"traceEvents\":[");
    for (int i = 0; i < x->nparts; i++) {
        int q = x->parts[i], h = p->ctx->hosts.host_of[q];
        fprintf(f,
                "%s\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":"
                "\"host %d\"}},\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
                "\"args\":{\"name\":\"rank %d\"}}",
                first ? "" : ",", h, h, h, q, q);
        first = 0;
    }
    for (int i = 0; i < x->nparts; i++) {
        int q = x->parts[i], h = p->ctx->hosts.host_of[q];
        if (q == x->rank)
            write_events(f, x->ev, x->nev, q, h, &first);
        else
            write_events(f, x->tr_bufs[i], x->tr_counts[i], q, h, &first);
    }
    fprintf(f,
            "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"source\":\"xmesh MPI executor\","
            "\"plan\":%d,\"reshard\":%lld,\"strategy\":\"%s\",\"scheduler\":\"%s\","
            "\"chunk_bytes\":%lld,\"leader_dropped_events\":%lld}}\n",
            x->plan_id, (long long)x->nreshards, xmesh_strategy_name(p->strategy),
            xmesh_scheduler_name(p->scheduler), (long long)p->chunk_bytes,
            (long long)x->dropped_ev);
    int bad = ferror(f);
    if (fclose(f) || bad) {
        snprintf(r->msg, sizeof r->msg, "XMESH_TRACE: error writing '%.400s'", path);
        return -1;
    }
    return 0;
}

/* Frees the leader's receive buffers of the last gather. */
static void free_bufs(xm_exec_t *x)
{
    for (int i = 0; x->tr_bufs && i < x->nparts; i++) {
        free(x->tr_bufs[i]);
        x->tr_bufs[i] = NULL;
    }
}

int xm_mpi_trace_progress(xm_request_t *r)
{
    xm_exec_t *x = r->plan->exec;
    int n = x->nparts, flag = 0, rc;
    const int evsz = (int)sizeof(xm_trace_ev_t);
    if (r->trace_stage == 0) {
        for (int i = 0; i < 2 * n; i++)
            x->tr_reqs[i] = MPI_REQUEST_NULL;
        if (x->rank == x->leader) {
            for (int i = 0; i < n; i++)
                if (x->parts[i] != x->rank &&
                    (rc = MPI_Irecv(&x->tr_counts[i], 1, MPI_INT64_T, x->parts[i], XM_TAG_TRACE,
                                    x->comm, &x->tr_reqs[i])))
                    goto out_mpi;
        } else {
            x->tr_counts[0] = x->nev;
            if ((rc = MPI_Isend(&x->tr_counts[0], 1, MPI_INT64_T, x->leader, XM_TAG_TRACE, x->comm,
                                &x->tr_reqs[0])) ||
                (rc = MPI_Isend(x->ev, x->nev * evsz, MPI_BYTE, x->leader, XM_TAG_TRACE, x->comm,
                                &x->tr_reqs[1])))
                goto out_mpi;
        }
        r->trace_stage = 1;
    }
    if (r->trace_stage == 1) {
        if ((rc = MPI_Testall(2 * n, x->tr_reqs, &flag, MPI_STATUSES_IGNORE)))
            goto out_mpi;
        if (!flag)
            return 0;
        if (x->rank != x->leader)
            return 1;
        for (int i = 0; i < n; i++) {
            if (x->parts[i] == x->rank)
                continue;
            int64_t c = x->tr_counts[i];
            x->tr_bufs[i] = malloc(sizeof(xm_trace_ev_t) * (c ? c : 1));
            if (!x->tr_bufs[i]) {
                snprintf(r->msg, sizeof r->msg, "XMESH_TRACE: out of memory");
                return -1;
            }
            if ((rc = MPI_Irecv(x->tr_bufs[i], (int)(c * evsz), MPI_BYTE, x->parts[i], XM_TAG_TRACE,
                                x->comm, &x->tr_reqs[i])))
                goto out_mpi;
        }
        r->trace_stage = 2;
    }
    if ((rc = MPI_Testall(2 * n, x->tr_reqs, &flag, MPI_STATUSES_IGNORE)))
        goto out_mpi;
    if (!flag)
        return 0;
    int w = write_file(r);
    free_bufs(x);
    return w < 0 ? -1 : 1;
out_mpi:
    snprintf(r->msg, sizeof r->msg, "XMESH_TRACE: gathering events failed (MPI error %d)", rc);
    return -1;
}

void xm_mpi_trace_cancel(xm_request_t *r)
{
    xm_exec_t *x = r->plan->exec;
    if (!x->trace || !x->tr_reqs || r->trace_stage == 0)
        return;
    int abandoned = 0;
    for (int i = 0; i < 2 * x->nparts; i++)
        if (x->tr_reqs[i] != MPI_REQUEST_NULL) {
            MPI_Cancel(&x->tr_reqs[i]);
            MPI_Request_free(&x->tr_reqs[i]);
            abandoned = 1;
        }
    if (abandoned)
        x->leak_stage = 1; /* the buffers may still be written: leak them */
    else
        free_bufs(x);
}
