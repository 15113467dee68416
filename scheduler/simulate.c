/*
 * Network simulator of a schedule (issue 3 item 4). Event model: every NIC
 * direction is a FIFO server running its tasks in the schedule's global
 * order (paper 002 eq. 1-3: tasks' bytes on a sender or receiver NIC never
 * overlap); a task starts as early as every NIC direction its routes cross is
 * free when its bytes reach it, and holds each from there to its hop's last
 * chunk (xm_task_timing: the fill of the hops before it, then its own bytes;
 * alpha-beta per hop, the slowest hop paces the chunks, a direction crossed n
 * times carries n copies); the task ends when its chains do. Processing
 * tasks in `order` is an exact event simulation here,
 * because a FIFO server in a fixed global order never lets a later task
 * overtake an earlier one on the same direction.
 *
 * Optionally writes a Chrome trace-event JSON (Perfetto, chrome://tracing):
 * one process per host, one track per NIC direction and one per device.
 */
#include <stdlib.h>
#include <string.h>

#include "xm_sched_impl.h"

static void trace_meta(FILE *f, int *first, int pid, int tid, const char *what, const char *name,
                       int sort)
{
    fprintf(f,
            "%s\n{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"%s\",\"args\":{\"name\":\"%s\"}}",
            *first ? "" : ",", pid, tid, what, name);
    *first = 0;
    if (sort >= 0)
        fprintf(f,
                ",\n{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"thread_sort_index\","
                "\"args\":{\"sort_index\":%d}}",
                pid, tid, sort);
}

static void trace_event(FILE *f, int *first, int pid, int tid, const char *name, double start_s,
                        double dur_s, int task, int64_t bytes, const char *role)
{
    fprintf(f,
            "%s\n{\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"name\":\"%s\",\"cat\":\"%s\","
            "\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"task\":%d,\"bytes\":%lld}}",
            *first ? "" : ",", pid, tid, name, role, start_s * 1e6, dur_s * 1e6, task,
            (long long)bytes);
    *first = 0;
}

/* Track ids inside host pid: NIC k send = k, recv = nics + k, devices after. */
static void write_trace(FILE *f, const xm_prep_t *p, const xm_schedule_t *s,
                        const xm_sim_result_t *res, const int *dev_local, xm_troutes_t *tr)
{
    int first = 1;
    fprintf(f, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[");
    char name[64];
    for (int h = 0; h < p->nhosts; h++) {
        snprintf(name, sizeof name, "host %d", h);
        trace_meta(f, &first, h, 0, "process_name", name, -1);
        for (int k = 0; k < p->nics; k++) {
            snprintf(name, sizeof name, "nic %d send", k);
            trace_meta(f, &first, h, k, "thread_name", name, k);
            snprintf(name, sizeof name, "nic %d recv", k);
            trace_meta(f, &first, h, p->nics + k, "thread_name", name, p->nics + k);
        }
    }
    for (int d = 0; d < p->ndev; d++) {
        snprintf(name, sizeof name, "device %d", d);
        int tid = 2 * p->nics + dev_local[d];
        trace_meta(f, &first, p->dev_host[d], tid, "thread_name", name, tid);
    }
    for (int t = 0; t < s->ntasks; t++) {
        double st = res->task_start_s[t], du = res->task_end_s[t] - st;
        int64_t bytes = p->ts->tasks[t].bytes;
        snprintf(name, sizeof name, "task %d", t);
        /* NIC directions: retimed from the routes, each over its own interval */
        tr->routes = s->routes + s->task_route_off[t];
        tr->nroutes = s->task_route_off[t + 1] - s->task_route_off[t];
        tr->devs = s->route_devs;
        tr->rails = s->route_rails;
        xm_task_timing(p, t, tr);
        for (int u = 0; u < tr->nuse; u++) {
            int nic = tr->use_dir[u] / 2, rcv = tr->use_dir[u] & 1;
            trace_event(f, &first, nic / p->nics, (rcv ? p->nics : 0) + nic % p->nics, name,
                        st + tr->use_off[u], tr->use_end[u] - tr->use_off[u], t, bytes,
                        rcv ? "recv" : "send");
        }
        for (int q = s->task_route_off[t]; q < s->task_route_off[t + 1]; q++) {
            const xm_route_t *rt = &s->routes[q];
            const int *d = s->route_devs + rt->off;
            for (int i = 0; i < rt->len; i++) {
                const char *role = rt->len == 1 ? "copy" : i < rt->nsrc ? "source" : "receiver";
                trace_event(f, &first, p->dev_host[d[i]], 2 * p->nics + dev_local[d[i]], name, st,
                            du, t, bytes, role);
            }
        }
    }
    fprintf(f, "\n]}\n");
}

xmesh_result_t xm_simulate(const xm_taskset_t *ts, const xm_cluster_t *c, const xm_schedule_t *s,
                           xm_sim_result_t *out, FILE *trace)
{
    if (!ts || !c || !s || !out)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xm_simulate: NULL argument");
    if (s->ntasks != ts->ntasks)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xm_simulate: schedule has %d tasks, task set %d",
                      s->ntasks, ts->ntasks);
    xm_prep_t p;
    xmesh_result_t r = xm_prep_init(&p, ts, c, XMESH_STRATEGY_BROADCAST);
    if (r)
        return r;
    xm_sim_result_t res;
    memset(&res, 0, sizeof res);
    int n = ts->ntasks, maxdevs = 1;
    for (int t = 0; t < n; t++) {
        int nd = 0;
        for (int q = s->task_route_off[t]; q < s->task_route_off[t + 1]; q++)
            nd += s->routes[q].len;
        if (nd > maxdevs)
            maxdevs = nd;
    }
    double *dir_free = calloc(2 * p.nnics + 1, sizeof *dir_free);
    int *dev_local = calloc(p.ndev + 1, sizeof *dev_local);
    int *cnt = calloc(p.nhosts + 1, sizeof *cnt);
    xm_troutes_t tr;
    memset(&tr, 0, sizeof tr);
    tr.use_dir = malloc(sizeof(int) * 2 * maxdevs);
    tr.use_count = malloc(sizeof(int) * 2 * maxdevs);
    tr.use_off = malloc(sizeof(double) * 2 * maxdevs);
    tr.use_end = malloc(sizeof(double) * 2 * maxdevs);
    res.nnics = p.nnics;
    res.nic_send_busy_s = calloc(p.nnics + 1, sizeof(double));
    res.nic_recv_busy_s = calloc(p.nnics + 1, sizeof(double));
    res.nic_send_bytes = calloc(p.nnics + 1, sizeof(double));
    res.nic_recv_bytes = calloc(p.nnics + 1, sizeof(double));
    res.task_start_s = calloc(n + 1, sizeof(double));
    res.task_end_s = calloc(n + 1, sizeof(double));
    if (!dir_free || !dev_local || !cnt || !tr.use_dir || !tr.use_count || !tr.use_off ||
        !tr.use_end || !res.nic_send_busy_s || !res.nic_recv_busy_s || !res.nic_send_bytes ||
        !res.nic_recv_bytes || !res.task_start_s || !res.task_end_s) {
        r = XM_ERR(XMESH_ERR_NO_MEMORY, "xm_simulate: out of memory for %d tasks", n);
        goto out_free;
    }
    for (int d = 0; d < p.ndev; d++)
        dev_local[d] = cnt[p.dev_host[d]]++;
    for (int i = 0; i < n; i++) {
        int t = s->order[i];
        if (t < 0 || t >= n) {
            r = XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xm_simulate: order[%d] = %d out of range", i,
                       t);
            goto out_free;
        }
        tr.routes = s->routes + s->task_route_off[t];
        tr.nroutes = s->task_route_off[t + 1] - s->task_route_off[t];
        tr.devs = s->route_devs;
        tr.rails = s->route_rails;
        xm_task_timing(&p, t, &tr);
        double start = xm_task_start(dir_free, &tr);
        double end = start + tr.dur;
        for (int u = 0; u < tr.nuse; u++) {
            double held = tr.use_end[u] - tr.use_off[u];
            dir_free[tr.use_dir[u]] = start + tr.use_end[u];
            int nic = tr.use_dir[u] / 2;
            if (tr.use_dir[u] & 1) {
                res.nic_recv_busy_s[nic] += held;
                res.nic_recv_bytes[nic] += (double)ts->tasks[t].bytes;
            } else {
                res.nic_send_busy_s[nic] += held;
                res.nic_send_bytes[nic] += (double)ts->tasks[t].bytes;
            }
        }
        res.task_start_s[t] = start;
        res.task_end_s[t] = end;
        if (end > res.makespan_s)
            res.makespan_s = end;
    }
    if (trace)
        write_trace(trace, &p, s, &res, dev_local, &tr);
    *out = res;
    memset(&res, 0, sizeof res);
    r = XMESH_SUCCESS;
out_free:
    xm_sim_result_free(&res);
    free(dir_free);
    free(dev_local);
    free(cnt);
    free(tr.use_dir);
    free(tr.use_count);
    free(tr.use_off);
    free(tr.use_end);
    xm_prep_free(&p);
    return r;
}

void xm_sim_result_free(xm_sim_result_t *r)
{
    if (!r)
        return;
    free(r->nic_send_busy_s);
    free(r->nic_recv_busy_s);
    free(r->nic_send_bytes);
    free(r->nic_recv_bytes);
    free(r->task_start_s);
    free(r->task_end_s);
    memset(r, 0, sizeof *r);
}
