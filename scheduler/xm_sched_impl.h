/*
 * Private scheduler internals shared by the scheduler sources: per-task precomputed
 * facts (xm_prep_t), the incremental evaluator state (xm_state_t) and the
 * one function that turns a decision (task, sender host or fixed senders)
 * into routes and timing (xm_step). Every scheduler, xm_schedule_from() and
 * the brute-force test score plans with this same step function, and the
 * simulator times routes with the same xm_task_timing(), so a schedule's
 * makespan_s always equals what xm_simulate() reports.
 */
#ifndef XM_SCHED_IMPL_H
#define XM_SCHED_IMPL_H

#include "xm_sched.h"

/* NIC direction index: nic * 2 + 0 (send) or + 1 (recv). */
#define XM_DIR_SEND(nic) ((nic)*2)
#define XM_DIR_RECV(nic) ((nic)*2 + 1)

/* Per task: its class and the options of that class. Interchangeable
 * tasks (same class) share one copy of every per-class fact below, so the
 * per-task part stays small (it is written and read once per task). */
typedef struct xm_prep_task {
    int nopt;    /* candidate sender hosts (options) */
    int opt_off; /* into xm_prep_t.opt_hosts: the options of its class */
    int klass;   /* symmetry class: tasks with equal klass are interchangeable */
} xm_prep_task_t;

/* Per class: facts every member task shares. */
typedef struct xm_prep_class {
    int rep;         /* first task of the class (numbered by first appearance) */
    int ngroups;     /* partial groups of its tasks */
    int ntasks;      /* its tasks */
    int naive_host;  /* host of the lowest holder of group 0 */
    int needs_nic;   /* some receiver host lacks a full value: an inter-host hop is unavoidable */
    int recv_off;    /* its receivers' flags at recv_is_holder / recv_covered[recv_off ..] */
    double min_dur;  /* lower bound of its duration over its options (the search space) */
    double lb_dur;   /* lower bound of its duration with any holders as senders */
    double nic_cost; /* bytes / min(send, recv) + latency: NIC time of one inter-host hop */
} xm_prep_class_t;

typedef struct xm_prep {
    const xm_taskset_t *ts;
    const xm_cluster_t *c;
    xmesh_strategy_t strategy;
    int nhosts, nics, nnics, ndev;
    int max_groups;
    int max_route_devs; /* upper bound of route_devs entries of one task */
    int max_routes;     /* upper bound of routes of one task */
    /* Options (candidate sender hosts) of every class, at opt_hosts[opt_off
     * .. opt_off + nopt) of any of its tasks; per option arrays below are
     * indexed the same way. */
    int *opt_hosts;
    const int *dev_host; /* = c->hosts.host_of */
    int *dev_nic;        /* global NIC of each device */
    /* NICs some task can use (a device on them holds or receives something)
     * and their number per host: a host's other NICs never carry data. */
    unsigned char *nic_ok;
    int *host_nics;
    double *opt_dur;  /* per option: duration on an idle cluster */
    double *opt_rdur; /* per option: the same without NIC sharing (xm_troutes_t.route_dur) */
    /* One NIC per host and every option timed: a task's timing (duration,
     * NIC directions) depends on its sender host alone, so xm_step() takes
     * it from the option instead of timing the routes again. */
    int opt_timed;
    /* Per option: routes and route devices of a task of the class sent from
     * that host (they depend on the sender hosts only, not on the state;
     * with P not even on those). */
    int *opt_nroutes, *opt_ndevs;
    /* Per option: host-level NIC directions its routes cross (host * 2 +
     * 0 send / 1 recv), at opt_res[opt_res_off[o] .. opt_res_off[o + 1]).
     * With one NIC per host these are exactly the NIC directions. */
    int *opt_res_off;
    int *opt_res;
    int opt_res_cap;
    /* Per entry of opt_res: its xm_troutes_t.use_off / use_end (merged over
     * a host's NICs: earliest offset, latest end). */
    double *opt_res_t0, *opt_res_t1;
    int opt_rest_cap;
    /* Per option, several NICs per host only: the NIC directions the task
     * crosses when routed on an idle cluster (the DFS orders children by
     * them; exact when the devices are forced, an estimate otherwise). */
    int *opt_nres_off;
    int *opt_nres;
    int opt_nres_cap;
    /* Per class: receiver hosts that lack a full value (must be fed by NIC),
     * at need_hosts[need_off[c] .. need_off[c + 1]). */
    int *need_off;
    int *need_hosts;
    xm_prep_task_t *pt;  /* per task */
    xm_prep_class_t *pc; /* per class */
    /* Per class, per receiver (in the task's receiver order), at
     * pc[c].recv_off + i: the receiver holds the box / its host holds a
     * full value. */
    unsigned char *recv_is_holder;
    unsigned char *recv_covered;
    int nklass;
} xm_prep_t;

/* xm_hop_fill(), inline for the step's timing. */
static inline int xm_hop_fill_inline(const xm_cluster_t *c, int64_t K, int prev_inter, int inter)
{
    if (inter && c->sync_send)
        return 1;
    int a = inter && prev_inter ? c->forward_ahead : c->send_ahead;
    if (a < 1)
        a = 1;
    return K < a ? (int)(K < 1 ? 1 : K) : a;
}

/* Class facts of task t. */
static inline const xm_prep_class_t *xm_pc(const xm_prep_t *p, int t)
{
    return &p->pc[p->pt[t].klass];
}

xmesh_result_t xm_prep_init(xm_prep_t *p, const xm_taskset_t *ts, const xm_cluster_t *c,
                            xmesh_strategy_t strategy);
void xm_prep_free(xm_prep_t *p);

/* Mutable list-scheduling state: when each NIC direction is free, bytes sent
 * per device (tie-break of the device choice), current makespan. */
typedef struct xm_state {
    double *dir_free; /* 2 * nnics */
    double *dev_load; /* ndev */
    double makespan;
} xm_state_t;

xmesh_result_t xm_state_init(xm_state_t *s, const xm_prep_t *p);
void xm_state_reset(xm_state_t *s, const xm_prep_t *p);
void xm_state_free(xm_state_t *s);

/* Undo log so searches can step and take the step back. */
typedef struct xm_undo {
    int n, cap;
    double **ptr;
    double *old;
} xm_undo_t;
void xm_undo_free(xm_undo_t *u);
/* Reverts entries back to mark (a value of u->n taken earlier). */
void xm_undo_to(xm_undo_t *u, int mark);

/* Routes and timing of one task (scratch reused across steps). */
typedef struct xm_troutes {
    int nroutes;
    xm_route_t *routes;
    int ndevs;
    int *devs;
    /* Parallel to devs: the rail (NIC index on both hosts) of the hop from
     * devs[i] to the next device of its route when it crosses hosts, else
     * -1 (xm_route_rails). NULL (a schedule without rails): a hop leaves by
     * its sender's NIC and arrives on its receiver's. */
    int *rails;
    int *senders; /* max_groups */
    int nuse;
    int *use_dir;   /* NIC directions used (distinct) */
    int *use_count; /* inter-host hops through that direction (xm_task_timing() only) */
    /* Per used direction, relative to the task's start: when the task's bytes
     * begin to occupy it (the pipeline fill of the hops before it) and when
     * they leave it; the direction is free for other tasks outside that
     * interval (docs/LOWER_BOUND.md, model fact 1). use_end <= dur. */
    double *use_off, *use_end;
    double dur;
    double route_dur; /* max over routes alone, without NIC sharing */
    double start, end;
} xm_troutes_t;

xmesh_result_t xm_troutes_init(xm_troutes_t *r, const xm_prep_t *p);
void xm_troutes_free(xm_troutes_t *r);

/* Schedules task t next: chooses sender devices (host `host` per the option,
 * or the devices in fixed[0..ngroups-1] when fixed != NULL), builds the
 * routes, times them, starts the task when all its NIC directions are free
 * and advances the state. Records every change in undo when non-NULL.
 * Returns the task's end time; details in *r. */
double xm_step(const xm_prep_t *p, xm_state_t *s, int t, int host, const int *fixed,
               xm_troutes_t *r, xm_undo_t *undo);

/* Rails of the routes in r (r->rails, timing.c): a hop between hosts whose
 * devices sit on one NIC index keeps it; a hop between rails (its sender on
 * NIC index a, its receiver on b != a) takes whichever of a and b is usable
 * on both hosts (xm_prep_t.nic_ok) and frees first there (the later of the
 * sender host's send direction and the receiver host's receive direction;
 * ties: a), so the runner sends and receives it on that rail's NIC at both
 * ends (one UCX worker per NIC, docs/UCX.md) and the hops between rails of
 * a plan spread over the rails. (xm_prep_init makes one of them usable on
 * both where neither was.) */
void xm_route_rails(const xm_prep_t *p, const xm_state_t *s, xm_troutes_t *r);

/* Timing of given routes of one task (shared with the simulator): fills
 * r->dur, r->nuse, r->use_dir, r->use_count, r->use_off, r->use_end from
 * r->routes / r->devs. */
void xm_task_timing(const xm_prep_t *p, int t, xm_troutes_t *r);

/* Earliest start of a task timed in r given the directions' free times: each
 * direction it uses must be free when the task's bytes reach it (use_off). */
static inline double xm_task_start(const double *dir_free, const xm_troutes_t *r)
{
    double start = 0;
    for (int i = 0; i < r->nuse; i++) {
        double v = dir_free[r->use_dir[i]] - r->use_off[i];
        if (v > start)
            start = v;
    }
    return start;
}

/* Evaluates a whole plan (order + per-task option host or fixed senders)
 * from an idle cluster; returns the makespan. hosts or fixed may be NULL. */
double xm_eval_plan(const xm_prep_t *p, xm_state_t *s, xm_troutes_t *r, const int *order,
                    const int *hosts, const int *fixed);

/* Lower bound using prepared data. */
double xm_lower_bound_prep(const xm_prep_t *p);

/* Scheduler entry points: fill order[ntasks] and hosts[ntasks] (option
 * host per task), or fixed senders (naive). Return makespan of the plan. */
typedef struct xm_search_ctl {
    double deadline_s; /* monotonic time; <= 0: none */
    int64_t max_evals; /* > 0: deterministic budget in step evaluations */
    int64_t evals;     /* counter */
    uint64_t seed;
    double lower_bound; /* stop early when reached */
    int optimal;        /* set by a search that proved its plan optimal */
} xm_search_ctl_t;

double xm_now_s(void);
int xm_ctl_expired(xm_search_ctl_t *ctl);

double xm_sched_lb(const xm_prep_t *p, xm_state_t *s, xm_troutes_t *r, int *order, int *hosts);
double xm_sched_dfs(const xm_prep_t *p, xm_state_t *s, xm_troutes_t *r, xm_search_ctl_t *ctl,
                    int *order, int *hosts);
double xm_sched_greedy(const xm_prep_t *p, xm_state_t *s, xm_troutes_t *r, xm_search_ctl_t *ctl,
                       int *order, int *hosts);
/* Rounds from a bipartite edge coloring of send/receive NIC directions. */
double xm_sched_color(const xm_prep_t *p, xm_state_t *s, xm_troutes_t *r, int *order, int *hosts);
/* Improves (order, hosts) in place by local moves within ctl; returns makespan. */
double xm_sched_improve(const xm_prep_t *p, xm_state_t *s, xm_troutes_t *r, xm_search_ctl_t *ctl,
                        int *order, int *hosts, double cur);

static inline uint64_t xm_rng_next(uint64_t *st)
{
    uint64_t z = (*st += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

#endif /* XM_SCHED_IMPL_H */
