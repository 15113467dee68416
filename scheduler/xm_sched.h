/*
 * Scheduler side of xmesh (paper 002, section 3.2): cluster model, lower
 * bound, schedulers, routes and the network simulator. Pure computation over
 * an xm_taskset_t: no MPI, no CUDA, deterministic for a given seed.
 *
 * A schedule answers, for every unit task, (1) which device of each partial
 * group sends it, (2) the order in which tasks are issued (each host NIC runs
 * its tasks in this global order), and (3) the routes: chains of devices the
 * data flows through. Executors, the simulator and `xmesh-plan --json` all
 * read the same xm_schedule_t.
 */
#ifndef XM_SCHED_H
#define XM_SCHED_H

#include <stdio.h>

#include "xm_core.h"

/* ------------------------------------------------------------ cluster */

typedef struct xm_cluster {
    xm_hostmap_t hosts;  /* device -> host (owned) */
    int nics_per_host;   /* >= 1; device i of a host uses NIC (i % nics_per_host) */
    double nic_send_Bps; /* per NIC, bytes/s */
    double nic_recv_Bps; /* per NIC, bytes/s */
    double intra_Bps;    /* device-to-device inside a host, bytes/s */
    double latency_s;    /* per message (alpha) */
    int64_t chunk_bytes; /* pipelining chunk of the broadcast chains */
} xm_cluster_t;

/* Paper cluster defaults: 10 Gb/s, 1 NIC/host, 100 GB/s intra, 5 us, 1 MiB
 * chunks. Takes ownership of nothing: copies the host map. */
xmesh_result_t xm_cluster_init(xm_cluster_t *c, const xm_hostmap_t *hosts);
void xm_cluster_free(xm_cluster_t *c);
/* NIC index (global: host * nics_per_host + k) used by a device. */
int xm_cluster_nic_of(const xm_cluster_t *c, int dev);

/* -------------------------------------------------------------- routes */

/* One chain of one task. devs[0 .. nsrc-1] are sources: data starts at
 * devs[0] and each further source adds its partial value in turn (nsrc > 1
 * only with P). devs[nsrc .. len-1] are receivers, each forwarding to the
 * next. len == 1 is a self copy: devs[0] holds the box and also receives it.
 * A chain that stays inside one host uses only the intra-host link. */
typedef struct xm_route {
    int task;
    int nsrc;
    int len;
    int off; /* into xm_schedule_t.route_devs */
} xm_route_t;

typedef struct xm_schedule {
    xmesh_scheduler_t scheduler;
    int ntasks;
    int *order;  /* ntasks: global issue order (a permutation) */
    int *sender; /* ntasks * max_groups: chosen device per task per partial group,
                    task t group g at sender[t * max_groups + g] */
    int max_groups;
    int nroutes;
    xm_route_t *routes;  /* sorted by task id */
    int *task_route_off; /* ntasks + 1: routes of task t are routes[off[t] .. off[t+1]) */
    int *route_devs;
    double lower_bound_s; /* xm_lower_bound() of the instance */
    double makespan_s;    /* simulated makespan of this schedule */
    double plan_s;        /* wall time spent scheduling */
} xm_schedule_t;

typedef struct xm_sched_opts {
    xmesh_scheduler_t kind; /* UNSET = ensemble */
    int64_t budget_us;      /* time budget of dfs/greedy/ensemble; <= 0: default 20 ms */
    uint64_t seed;
    xmesh_strategy_t strategy; /* BROADCAST routes chains; SENDRECV one route per receiver */
    /* > 0: deterministic budget instead of budget_us: the searches stop after
     * this many task-step evaluations, so results do not depend on machine
     * speed (tests, cross-machine reproducibility). */
    int64_t max_evals;
} xm_sched_opts_t;

/* Schedules ts on cluster c. On error *out is untouched. */
xmesh_result_t xm_schedule(const xm_taskset_t *ts, const xm_cluster_t *c, const xm_sched_opts_t *o,
                           xm_schedule_t *out);
void xm_schedule_free(xm_schedule_t *s);

/* Builds a schedule from given decisions (order: ntasks permutation; sender:
 * ntasks * max_groups devices, each a holder of its group), computing routes,
 * lower bound and makespan as xm_schedule() would. Lets every rank rebuild
 * the schedule rank 0 chose. On error *out is untouched. */
xmesh_result_t xm_schedule_from(const xm_taskset_t *ts, const xm_cluster_t *c,
                                const xm_sched_opts_t *o, const int *order, const int *sender,
                                xm_schedule_t *out);

/* Lower bound (seconds) of any schedule's completion time; see
 * docs/LOWER_BOUND.md for the argument. */
double xm_lower_bound(const xm_taskset_t *ts, const xm_cluster_t *c);

/* ----------------------------------------------------------- simulator */

typedef struct xm_sim_result {
    double makespan_s;
    int nnics; /* nhosts * nics_per_host */
    double *nic_send_busy_s;
    double *nic_recv_busy_s;
    double *task_start_s; /* ntasks */
    double *task_end_s;   /* ntasks */
} xm_sim_result_t;

/* Discrete-event simulation of a schedule: chunked pipelined chains,
 * alpha-beta costs, each NIC direction running its tasks in order. If trace
 * is non-NULL, writes Chrome trace-event JSON to it. */
xmesh_result_t xm_simulate(const xm_taskset_t *ts, const xm_cluster_t *c, const xm_schedule_t *s,
                           xm_sim_result_t *out, FILE *trace);
void xm_sim_result_free(xm_sim_result_t *r);

#endif /* XM_SCHED_H */
