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
    xm_hostmap_t hosts;     /* device -> host (owned) */
    int nics_per_host;      /* >= 1; device i of a host uses NIC (i % nics_per_host) */
    double nic_send_Bps;    /* per NIC, bytes/s */
    double nic_recv_Bps;    /* per NIC, bytes/s */
    double intra_Bps;       /* device-to-device inside a host, bytes/s */
    double latency_s;       /* per message (alpha) */
    int64_t chunk_bytes;    /* pipelining chunk of the broadcast chains */
    int send_ahead;         /* chunk sends in flight per hop (>= 1): a hop's pipeline fill */
    int forward_ahead;      /* the same on a NIC hop whose input is a NIC hop (>= 1) */
    int sync_send;          /* chunks between hosts are synchronous sends (XMESH_SYNC_SEND) */
    double nic_burst_bytes; /* token-bucket burst of each NIC (bytes a NIC idle long enough
                             * sends at once, e.g. tc tbf `burst`); 0: none. Priced by the
                             * pipeline simulator's boundary transfers (nic_burst_s) only */
} xm_cluster_t;

/* Chunks a hop of a pipelined chain of K chunks puts on its wire before the
 * next hop gets its first one (the MPI executor's sends in flight on that
 * link, at most K): send_ahead, or forward_ahead on a hop between hosts with a
 * hop between hosts upstream in its chain (inter and prev_inter nonzero): its
 * chunks arrive paced by that NIC. With sync_send a hop between hosts
 * fills with 1: its chunks are single fragments that leave whole and in
 * order, so the first is not slowed by the ones behind it. */
int xm_hop_fill(const xm_cluster_t *c, int64_t K, int prev_inter, int inter);

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
/*
 * Route shapes (what executors must implement; built by scheduler/routes.c):
 *
 * BROADCAST, no P (ngroups == 1), chosen sender s (a holder):
 *   - every receiver that is itself a holder: a self copy [r] (len 1);
 *   - receivers on a host h != host(s) that has a holder: one intra-host
 *     chain [hd, receivers on h in device order], hd = a holder on h;
 *   - all other receivers: one main chain [s, receivers on host(s), then the
 *     receivers of every other host, host by host in ascending host order].
 *     With several NICs per host, inside a receiving host the chain enters
 *     through the receiver whose receive NIC frees first and, when three or
 *     more receivers are there, leaves from the one whose send NIC frees
 *     first (ties: the entry's NIC); the others follow by device id. With
 *     one NIC the receivers of a host simply follow by device id.
 *   Each receiver host's NIC therefore receives the bytes once.
 * BROADCAST, P (ngroups G > 1): one chain [s_0 .. s_{G-1}, receivers]. The
 *   sources are the chosen holders of the groups (sender[t * max_groups + g]
 *   says which device serves group g; the chain order need not be the group
 *   order): ordered by host so that each host's sources are adjacent, hosts
 *   ascending, except that the last source host is the lowest-numbered
 *   source host that also has receivers (if any), so the final sum is
 *   already on a receiver host. Receivers follow: those on that last source
 *   host first, then host by host ascending. No self copies: a device that
 *   is both a source and a receiver appears twice.
 * SENDRECV, no P: per receiver r a route [s, r] (len 2), or [r] if r holds
 *   the box. SENDRECV, P: per receiver [s_0 .. s_{G-1}, r] (sources ordered
 *   as above).
 * A task with nrecv > 0 always has at least one route.
 *
 * Sender choice: the schedulers decide a sender host per task; the device
 * inside it (per group) is the holder whose send NIC frees first, then the
 * one on the lowest NIC, then the one that sent the fewest bytes so far,
 * then the lowest id. Intra-host chains start at the holder of that host
 * that sent the fewest bytes (then lowest id). For a P group
 * without a holder on that host: a host an earlier group already uses, else
 * a receiver host, else its lowest holder's host.
 *
 * Timing (paper 002 eq. 1-3, implemented identically by the simulator): a
 * task occupies the send direction of every NIC that sends one of its
 * inter-host hops and the receive direction of every NIC that receives one;
 * each NIC direction runs its tasks one at a time in the global order; a
 * task starts when all its NIC directions are free. Intra-host hops use the
 * intra-host link and occupy no NIC (tasks with no inter-host hop start at
 * 0). Duration of a task = max over its routes of the pipelined chain time
 * sum_hops(latency + c / bw_hop) + (K - 1) * c / min_hop bw, with K =
 * ceil(bytes / chunk_bytes) chunks of c = bytes / K (inter-host hop bw =
 * min(nic_send, nic_recv), intra = intra_Bps; a self copy costs latency +
 * bytes / intra_Bps), and at least n * bytes / bw + latency for a NIC
 * direction crossed n times by the task's routes.
 */
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
    /* Parallel to route_devs: the rail (NIC index, the same on both hosts)
     * that the hop from route_devs[i] to the next device of its route takes
     * when it crosses hosts, -1 otherwise (the route's last device, a hop
     * inside a host). A hop whose two devices sit on one NIC index keeps it;
     * a hop between rails gets one of the two (scheduler/timing.c). NULL in
     * a schedule built by hand: every hop leaves by its sender's NIC and
     * arrives on its receiver's. */
    int *route_rails;
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

/* Plan creation's entry point: xm_schedule(), and when task splitting
 * (xm_taskset_split) lowers the model makespan, the schedule of the split
 * task set, which then replaces *ts (its pieces are sub-boxes of the
 * original tasks with the same holders and receivers). Splitting is only
 * tried when split != 0, the instance is small enough for
 * xm_taskset_split to cut it (< XM_SPLIT_MAX_TASKS tasks) and a plan of
 * the unsplit tasks stays above XM_SPLIT_TRY_RATIO x the lower bound of
 * the unsplit or (if lower) of the split task set; the split set is kept
 * when its plan is faster by more than XM_SPLIT_MARGIN.
 * The choice is made with a deterministic evaluation budget (o->max_evals,
 * else XM_SPLIT_EVALS), so every rank of a plan picks the same task set;
 * the final schedule of the chosen set is the better of that run and one
 * with o's own budget. *split_used (if not NULL) says which set was used.
 * On error *ts and *out are untouched. */
#define XM_SPLIT_MAX_TASKS 4096
#define XM_SPLIT_TRY_RATIO 1.02
#define XM_SPLIT_MARGIN 0.01
#define XM_SPLIT_EVALS 20000
xmesh_result_t xm_schedule_plan(xm_taskset_t *ts, const xm_cluster_t *c, const xm_sched_opts_t *o,
                                int split, xm_schedule_t *out, int *split_used);

/* Builds a schedule from given decisions (order: ntasks permutation; sender:
 * ntasks * max_groups devices, each a holder of its group), computing routes,
 * lower bound and makespan as xm_schedule() would. Lets every rank rebuild
 * the schedule rank 0 chose. On error *out is untouched. */
xmesh_result_t xm_schedule_from(const xm_taskset_t *ts, const xm_cluster_t *c,
                                const xm_sched_opts_t *o, const int *order, const int *sender,
                                xm_schedule_t *out);

/* Lower bound (seconds) of any schedule's completion time under the
 * broadcast route model (xm_schedule_t.lower_bound_s is the same bound for
 * the schedule's own strategy); see docs/LOWER_BOUND.md for the argument. */
double xm_lower_bound(const xm_taskset_t *ts, const xm_cluster_t *c);

/* Cuts the unit tasks of a small instance into pieces (boxes split along
 * their longest dim; same holders and receivers), one per sender-host option
 * and NIC, never below one chunk, so several hosts and NICs can share a task
 * (whole-task balancing leaves e.g. 8 tasks on 6 hosts at 2 rounds where 4/3
 * suffice). Instances with many tasks per sender NIC are copied unchanged, as
 * are all of them if the result would exceed max(max_tasks, in->ntasks)
 * tasks. The result is an ordinary task set for xm_schedule() and the
 * executors. *parent (when parent != NULL; caller frees) maps each new task
 * to its source task. On error *out and *parent are untouched. */
xmesh_result_t xm_taskset_split(const xm_taskset_t *in, const xm_cluster_t *c, int max_tasks,
                                xm_taskset_t *out, int **parent);

/* ----------------------------------------------------------- simulator */

typedef struct xm_sim_result {
    double makespan_s;
    int nnics; /* nhosts * nics_per_host */
    double *nic_send_busy_s;
    double *nic_recv_busy_s;
    /* Bytes through each NIC direction: a task's bytes once for every NIC
     * direction its routes use. */
    double *nic_send_bytes;
    double *nic_recv_bytes;
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
