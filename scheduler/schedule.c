/*
 * Scheduler front end (paper 002, section 3.2): validates, dispatches to
 * naive / lb / dfs / greedy / ensemble and materialises the xm_schedule_t
 * (order, senders, routes, bound, makespan). xm_schedule_from() rebuilds the
 * same schedule from (order, senders) alone, so ranks can agree on rank 0's
 * plan by broadcasting two int arrays.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "xm_flows.h"
#include "xm_sched_impl.h"

#define XM_DEFAULT_BUDGET_US 20000
/* Above this many unit tasks the searches plan flows (flows.c). */
#define XM_FLOW_MIN_TASKS 2048
/* Above this many (flow or unit) tasks the ensemble colours before the DFS:
 * the DFS's first dive costs tasks x classes and may not fit the budget. */
#define XM_COLOR_FIRST_TASKS 512
/* Tasks ahead of the current step whose data materialise() prefetches. */
#define XM_PREFETCH_AHEAD 4

double xm_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int xm_ctl_expired(xm_search_ctl_t *ctl)
{
    if (ctl->max_evals > 0)
        return ctl->evals >= ctl->max_evals;
    /* reading the clock costs ~20 ns; callers check every few steps anyway */
    return ctl->deadline_s > 0 && xm_now_s() >= ctl->deadline_s;
}

/* Grows *buf (elements of size sz, capacity *cap) to hold need elements. */
static int grow(void **buf, int64_t *cap, int64_t need, size_t sz)
{
    if (need <= *cap)
        return 0;
    int64_t nc = *cap > 0 ? *cap : 1024;
    while (nc < need)
        nc *= 2;
    void *nb = realloc(*buf, sz * (size_t)nc);
    if (!nb)
        return -1;
    *buf = nb;
    *cap = nc;
    xm_hint_huge(nb, sz * (size_t)nc);
    return 0;
}

/* Fills out from a plan given as option hosts or fixed senders in one pass
 * of the list-scheduling step: routes are collected in issue order, then
 * copied into task-id order. (The general path; materialise() below
 * places every route where it belongs directly when it can.) */
static xmesh_result_t materialise_collect(const xm_prep_t *p, xmesh_scheduler_t kind,
                                          const int *order, const int *hosts, const int *fixed,
                                          double lb, xm_schedule_t *out)
{
    int n = p->ts->ntasks, G = p->max_groups;
    xm_schedule_t s;
    memset(&s, 0, sizeof s);
    xm_state_t st;
    xm_troutes_t tr;
    memset(&st, 0, sizeof st);
    memset(&tr, 0, sizeof tr);
    /* per task: where its routes and devices start in the issue-order buffers */
    int64_t *at = malloc(sizeof(int64_t) * 3 * ((size_t)n + 1));
    xm_route_t *rbuf = NULL;
    int *dbuf = NULL, *lbuf = NULL;
    int64_t rcap = 0, dcap = 0, lcap = 0, nr = 0, nd = 0;
    xmesh_result_t r = XMESH_SUCCESS;
    s.scheduler = kind;
    s.ntasks = n;
    s.max_groups = G;
    s.order = malloc(sizeof(int) * (n + 1));
    s.sender = malloc(sizeof(int) * ((size_t)n * G + 1));
    s.task_route_off = calloc(n + 1, sizeof(int));
    xm_hint_huge(at, sizeof(int64_t) * 3 * (size_t)n);
    xm_hint_huge(s.order, sizeof(int) * (size_t)n);
    xm_hint_huge(s.sender, sizeof(int) * (size_t)n * G);
    xm_hint_huge(s.task_route_off, sizeof(int) * (size_t)n);
    if (!at || !s.order || !s.sender || !s.task_route_off) {
        r = XM_ERR(XMESH_ERR_NO_MEMORY, "scheduler: out of memory for %d tasks", n);
        goto out_free;
    }
    if ((r = xm_state_init(&st, p)) || (r = xm_troutes_init(&tr, p)))
        goto out_free;
    for (int i = 0; i < n * G; i++)
        s.sender[i] = -1;
    memcpy(s.order, order, sizeof(int) * n);
    xm_state_reset(&st, p);
    for (int i = 0; i < n; i++) {
        int t = order[i];
        xm_step(p, &st, t, hosts ? hosts[t] : -1, fixed ? fixed + (size_t)t * G : NULL, &tr, NULL);
        if (grow((void **)&rbuf, &rcap, nr + tr.nroutes, sizeof *rbuf) ||
            grow((void **)&dbuf, &dcap, nd + tr.ndevs, sizeof *dbuf) ||
            grow((void **)&lbuf, &lcap, nd + tr.ndevs, sizeof *lbuf)) {
            r = XM_ERR(XMESH_ERR_NO_MEMORY, "scheduler: out of memory for routes");
            goto out_free;
        }
        at[3 * (size_t)t] = nr;
        at[3 * (size_t)t + 1] = nd;
        at[3 * (size_t)t + 2] = tr.ndevs;
        /* a few entries per task: plain loops beat memcpy calls */
        for (int q = 0; q < tr.nroutes; q++)
            rbuf[nr + q] = tr.routes[q];
        for (int q = 0; q < tr.ndevs; q++) {
            dbuf[nd + q] = tr.devs[q];
            lbuf[nd + q] = tr.rails[q];
        }
        nr += tr.nroutes;
        nd += tr.ndevs;
        s.task_route_off[t + 1] = tr.nroutes;
        int *snd = s.sender + (size_t)t * G;
        for (int g = 0, ng = p->ts->tasks[t].ngroups; g < ng; g++)
            snd[g] = tr.senders[g];
    }
    s.makespan_s = st.makespan;
    if (nr > INT32_MAX || nd > INT32_MAX) {
        r = XM_ERR(XMESH_ERR_NO_MEMORY, "scheduler: %lld routes, %lld route devices: too many",
                   (long long)nr, (long long)nd);
        goto out_free;
    }
    for (int t = 0; t < n; t++)
        s.task_route_off[t + 1] += s.task_route_off[t];
    s.nroutes = s.task_route_off[n];
    s.routes = malloc(sizeof *s.routes * (s.nroutes + 1));
    s.route_devs = malloc(sizeof(int) * (nd + 1));
    s.route_rails = malloc(sizeof(int) * (nd + 1));
    xm_hint_huge(s.routes, sizeof *s.routes * (size_t)s.nroutes);
    xm_hint_huge(s.route_devs, sizeof(int) * (size_t)nd);
    xm_hint_huge(s.route_rails, sizeof(int) * (size_t)nd);
    if (!s.routes || !s.route_devs || !s.route_rails) {
        r = XM_ERR(XMESH_ERR_NO_MEMORY, "scheduler: out of memory for %d routes", s.nroutes);
        goto out_free;
    }
    /* task-id order: routes of task t at task_route_off[t], its devices
     * after those of task t - 1 */
    int64_t doff = 0;
    for (int t = 0; t < n; t++) {
        int q0 = s.task_route_off[t], nq = s.task_route_off[t + 1] - q0;
        int64_t r0 = at[3 * (size_t)t], d0 = at[3 * (size_t)t + 1], tdevs = at[3 * (size_t)t + 2];
        for (int64_t q = 0; q < tdevs; q++) {
            s.route_devs[doff + q] = dbuf[d0 + q];
            s.route_rails[doff + q] = lbuf[d0 + q];
        }
        for (int q = 0; q < nq; q++) {
            xm_route_t rt = rbuf[r0 + q];
            rt.off += (int)doff;
            s.routes[q0 + q] = rt;
        }
        doff += tdevs;
    }
    s.lower_bound_s = lb >= 0 ? lb : xm_lower_bound_prep(p);
    *out = s;
    memset(&s, 0, sizeof s);
out_free:
    xm_schedule_free(&s);
    xm_state_free(&st);
    xm_troutes_free(&tr);
    free(at);
    free(rbuf);
    free(dbuf);
    free(lbuf);
    return r;
}

/* Routes and route devices task t gets from its decision (option host, or
 * fixed senders): without P they follow from the sender's host alone, with
 * P they are the same for any senders (xm_prep_t.opt_nroutes). Returns
 * nonzero when the host is not one of t's options. */
static inline int route_counts(const xm_prep_t *p, int t, int host, const int *fixed, int *nr,
                               int *nd)
{
    const xm_prep_task_t *pt = &p->pt[t];
    int o = 0;
    if (p->pc[pt->klass].ngroups == 1) {
        int h = fixed ? p->dev_host[fixed[0]] : host;
        const int *oh = p->opt_hosts + pt->opt_off;
        while (o < pt->nopt && oh[o] != h)
            o++;
        if (o == pt->nopt)
            return -1;
    }
    *nr = p->opt_nroutes[pt->opt_off + o];
    *nd = p->opt_ndevs[pt->opt_off + o];
    return 0;
}

/* materialise_collect() without the collection: the routes and devices of
 * every task are counted first (from the prepared per-option counts), so
 * the list-scheduling pass writes each task's routes straight into their
 * task-id-ordered place. Falls back to materialise_collect() when a count
 * is not known in advance or does not match what the step built. */
static xmesh_result_t materialise(const xm_prep_t *p, xmesh_scheduler_t kind, const int *order,
                                  const int *hosts, const int *fixed, double lb, xm_schedule_t *out)
{
    int n = p->ts->ntasks, G = p->max_groups;
    xm_schedule_t s;
    memset(&s, 0, sizeof s);
    xm_state_t st;
    xm_troutes_t tr;
    memset(&st, 0, sizeof st);
    memset(&tr, 0, sizeof tr);
    xmesh_result_t r = XMESH_SUCCESS;
    int fallback = 0;
    s.scheduler = kind;
    s.ntasks = n;
    s.max_groups = G;
    s.order = malloc(sizeof(int) * (n + 1));
    s.sender = malloc(sizeof(int) * ((size_t)n * G + 1));
    s.task_route_off = malloc(sizeof(int) * ((size_t)n + 1));
    xm_hint_huge(s.order, sizeof(int) * (size_t)n);
    xm_hint_huge(s.sender, sizeof(int) * (size_t)n * G);
    xm_hint_huge(s.task_route_off, sizeof(int) * (size_t)n);
    if (!s.order || !s.sender || !s.task_route_off) {
        r = XM_ERR(XMESH_ERR_NO_MEMORY, "scheduler: out of memory for %d tasks", n);
        goto out_free;
    }
    /* Route offsets in task-id order, then device offsets: until its
     * step, the first route of a task (a task without routes has no
     * devices) holds where its devices start, which is also the offset that
     * route gets from the step (a task's first route starts at its first
     * device). */
    int64_t nr = 0, nd = 0;
    for (int t = 0; t < n; t++) {
        int tnr, tnd;
        if (route_counts(p, t, hosts ? hosts[t] : -1, fixed ? fixed + (size_t)t * G : NULL, &tnr,
                         &tnd)) {
            fallback = 1;
            goto out_free;
        }
        s.task_route_off[t] = (int)nr;
        s.order[t] = tnd; /* for now */
        nr += tnr;
        nd += tnd;
    }
    if (nr > INT32_MAX || nd > INT32_MAX) {
        fallback = 1;
        goto out_free;
    }
    s.task_route_off[n] = (int)nr;
    s.nroutes = (int)nr;
    s.routes = malloc(sizeof *s.routes * (s.nroutes + 1));
    s.route_devs = malloc(sizeof(int) * (nd + 1));
    s.route_rails = malloc(sizeof(int) * (nd + 1));
    xm_hint_huge(s.routes, sizeof *s.routes * (size_t)s.nroutes);
    xm_hint_huge(s.route_devs, sizeof(int) * (size_t)nd);
    xm_hint_huge(s.route_rails, sizeof(int) * (size_t)nd);
    if (!s.routes || !s.route_devs || !s.route_rails) {
        r = XM_ERR(XMESH_ERR_NO_MEMORY, "scheduler: out of memory for %d routes", s.nroutes);
        goto out_free;
    }
    for (int t = 0, d = 0; t < n; t++) {
        if (s.task_route_off[t + 1] > s.task_route_off[t])
            s.routes[s.task_route_off[t]].off = d;
        d += s.order[t];
    }
    if ((r = xm_state_init(&st, p)) || (r = xm_troutes_init(&tr, p)))
        goto out_free;
    memcpy(s.order, order, sizeof(int) * n);
    xm_state_reset(&st, p);
    const xm_task_t *tasks = p->ts->tasks;
    for (int i = 0; i < n; i++) {
        /* The issue order jumps around the task-id-ordered arrays, and a
         * step does little arithmetic: fetch what the steps a few tasks
         * ahead read and write while this one runs (the task record first,
         * then what its offsets point to). */
        if (i + 2 * XM_PREFETCH_AHEAD < n) {
            int tf = order[i + 2 * XM_PREFETCH_AHEAD];
            __builtin_prefetch(&tasks[tf].bytes);
            __builtin_prefetch(&tasks[tf].recv_off);
            __builtin_prefetch(&p->pt[tf]);
            __builtin_prefetch(&s.task_route_off[tf]);
            if (hosts)
                __builtin_prefetch(&hosts[tf]);
        }
        if (i + XM_PREFETCH_AHEAD < n) {
            int tf = order[i + XM_PREFETCH_AHEAD];
            const xm_task_t *kf = &tasks[tf];
            __builtin_prefetch(p->ts->holders + kf->holder_off);
            __builtin_prefetch(p->ts->recvs + kf->recv_off);
            __builtin_prefetch(&s.routes[s.task_route_off[tf]], 1);
            __builtin_prefetch(&s.sender[(size_t)tf * G], 1);
        }
        if (i + 1 < n) {
            int tf = order[i + 1], r0 = s.task_route_off[tf];
            if (s.task_route_off[tf + 1] > r0)
                __builtin_prefetch(&s.route_devs[s.routes[r0].off], 1);
        }
        int t = order[i];
        xm_step(p, &st, t, hosts ? hosts[t] : -1, fixed ? fixed + (size_t)t * G : NULL, &tr, NULL);
        int *snd = s.sender + (size_t)t * G;
        int r0 = s.task_route_off[t], r1 = s.task_route_off[t + 1];
        int d0 = r1 > r0 ? s.routes[r0].off : 0;
        int d1 = r1 > r0 ? (r1 < s.nroutes ? s.routes[r1].off : (int)nd) : 0;
        if (tr.nroutes != r1 - r0 || tr.ndevs != d1 - d0) {
            fallback = 1; /* not what the counts said: cannot happen */
            goto out_free;
        }
        /* a few entries per task: plain loops beat memcpy calls */
        for (int q = 0; q < tr.nroutes; q++) {
            xm_route_t rt = tr.routes[q];
            rt.off += d0;
            s.routes[r0 + q] = rt;
        }
        for (int q = 0; q < tr.ndevs; q++) {
            s.route_devs[d0 + q] = tr.devs[q];
            s.route_rails[d0 + q] = tr.rails[q];
        }
        int g = 0;
        for (int ng = p->ts->tasks[t].ngroups; g < ng; g++)
            snd[g] = tr.senders[g];
        for (; g < G; g++)
            snd[g] = -1;
    }
    s.makespan_s = st.makespan;
    s.lower_bound_s = lb >= 0 ? lb : xm_lower_bound_prep(p);
    *out = s;
    memset(&s, 0, sizeof s);
out_free:
    xm_schedule_free(&s);
    xm_state_free(&st);
    xm_troutes_free(&tr);
    if (fallback)
        return materialise_collect(p, kind, order, hosts, fixed, lb, out);
    return r;
}

static xmesh_result_t check_inputs(const xm_taskset_t *ts, const xm_cluster_t *c,
                                   const xm_sched_opts_t *o, xm_schedule_t *out)
{
    if (!ts || !c || !out)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "scheduler: %s is NULL",
                      !ts  ? "task set"
                      : !c ? "cluster"
                           : "out");
    if (c->nics_per_host < 1)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "cluster: nics_per_host = %d (must be >= 1)",
                      c->nics_per_host);
    if (!(c->nic_send_Bps > 0) || !(c->nic_recv_Bps > 0) || !(c->intra_Bps > 0))
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                      "cluster: bandwidths must be > 0 (send %g, recv %g, intra %g B/s)",
                      c->nic_send_Bps, c->nic_recv_Bps, c->intra_Bps);
    if (!(c->latency_s >= 0))
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "cluster: latency %g s is negative",
                      c->latency_s);
    if (c->chunk_bytes < 1)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "cluster: chunk_bytes = %lld (must be >= 1)",
                      (long long)c->chunk_bytes);
    if (o && o->kind != XMESH_SCHEDULER_UNSET && (unsigned)o->kind >= XMESH_SCHEDULER_COUNT_)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "scheduler: unknown kind %d", (int)o->kind);
    if (o && o->strategy != XMESH_STRATEGY_UNSET && o->strategy != XMESH_STRATEGY_BROADCAST &&
        o->strategy != XMESH_STRATEGY_SENDRECV)
        return XM_ERR(XMESH_ERR_UNSUPPORTED,
                      "scheduler: strategy '%s' has no route model (use broadcast or sendrecv)",
                      xmesh_strategy_name(o->strategy));
    return XMESH_SUCCESS;
}

static xmesh_strategy_t opts_strategy(const xm_sched_opts_t *o)
{
    return o && o->strategy == XMESH_STRATEGY_SENDRECV ? XMESH_STRATEGY_SENDRECV
                                                       : XMESH_STRATEGY_BROADCAST;
}

/* Naive (paper 3.2): lowest holder of every group, decomposer order. */
static void naive_plan(const xm_prep_t *p, int *order, int *fixed)
{
    const xm_taskset_t *ts = p->ts;
    for (int t = 0; t < ts->ntasks; t++) {
        order[t] = t;
        const xm_task_t *k = &ts->tasks[t];
        for (int g = 0; g < k->ngroups; g++)
            fixed[(size_t)t * p->max_groups + g] = ts->holders[k->holder_off + g * k->group_size];
    }
}

typedef struct {
    int *order, *hosts;
    double ms;
} cand_t;

static void keep_best(const xm_prep_t *p, cand_t *best, const int *order, const int *hosts,
                      double ms)
{
    if (ms < best->ms) {
        memcpy(best->order, order, sizeof(int) * p->ts->ntasks);
        memcpy(best->hosts, hosts, sizeof(int) * p->ts->ntasks);
        best->ms = ms;
    }
}

static int done(const cand_t *best, const xm_search_ctl_t *ctl)
{
    return ctl->optimal || best->ms <= ctl->lower_bound * (1 + 1e-9);
}

/* A share of what is left of the budget for one search of the ensemble. */
static xm_search_ctl_t sub_ctl(const xm_search_ctl_t *ctl, double frac)
{
    xm_search_ctl_t sub = *ctl;
    sub.evals = 0;
    sub.optimal = 0;
    if (ctl->max_evals > 0) {
        sub.max_evals = (int64_t)((double)(ctl->max_evals - ctl->evals) * frac);
        if (sub.max_evals < 1)
            sub.max_evals = 1;
    } else {
        double now = xm_now_s();
        sub.deadline_s = now + (ctl->deadline_s - now) * frac;
    }
    return sub;
}

/* The ensemble on prepared data: cheap constructive plans first, then the
 * searches share what is left of ctl's budget, then local improvement of
 * the best. Leaves the best plan in order/hosts and returns its makespan. */
static double ensemble(const xm_prep_t *p, xm_state_t *st, xm_troutes_t *tr, xm_search_ctl_t *ctl,
                       int *order, int *hosts, int *fixed, cand_t *best, int color_first)
{
    int n = p->ts->ntasks;
    double ms = xm_sched_lb(p, st, tr, order, hosts);
    keep_best(p, best, order, hosts, ms);
    naive_plan(p, order, fixed);
    for (int t = 0; t < n; t++)
        hosts[t] = p->dev_host[fixed[(size_t)t * p->max_groups]];
    ms = xm_eval_plan(p, st, tr, order, hosts, NULL);
    keep_best(p, best, order, hosts, ms);
    /* Flow problems (color_first) and many tasks: the colouring first, it
     * is near linear and optimal for equal durations, where the DFS's first
     * dive costs tasks x classes; done before any budget check, so a
     * deadline that passes early (a loaded machine) still leaves a good
     * plan (the DFS's cut-off dive falls back to load balancing). */
    if ((color_first || n > XM_COLOR_FIRST_TASKS) && !done(best, ctl)) {
        ms = xm_sched_color(p, st, tr, order, hosts);
        keep_best(p, best, order, hosts, ms);
    }
    /* DFS first: its first leaf is an earliest-start list schedule and
     * on small instances it proves optimality outright. */
    if (!done(best, ctl)) {
        xm_search_ctl_t sub = sub_ctl(ctl, 1.0 / 3);
        ms = xm_sched_dfs(p, st, tr, &sub, order, hosts);
        keep_best(p, best, order, hosts, ms);
        ctl->evals += sub.evals;
        ctl->optimal = sub.optimal && ms <= best->ms;
    }
    /* Colouring rounds after DFS: on ties the DFS order wins, which the
     * MPI executor runs closer to the model (Table 2 case 4 measured
     * 1.10 x bound with the DFS order, 1.40 x with the colouring order).
     * Its alternating-path flips are not budgeted: only on moderate sizes. */
    if (!done(best, ctl) && !color_first && n <= XM_COLOR_FIRST_TASKS && !xm_ctl_expired(ctl)) {
        ms = xm_sched_color(p, st, tr, order, hosts);
        keep_best(p, best, order, hosts, ms);
    }
    if (!done(best, ctl) && !xm_ctl_expired(ctl)) {
        xm_search_ctl_t sub = sub_ctl(ctl, 1.0 / 2);
        ms = xm_sched_greedy(p, st, tr, &sub, order, hosts);
        keep_best(p, best, order, hosts, ms);
        ctl->evals += sub.evals;
    }
    if (!done(best, ctl) && !xm_ctl_expired(ctl)) {
        memcpy(order, best->order, sizeof(int) * n);
        memcpy(hosts, best->hosts, sizeof(int) * n);
        ms = xm_sched_improve(p, st, tr, ctl, order, hosts, best->ms);
        keep_best(p, best, order, hosts, ms);
    }
    memcpy(order, best->order, sizeof(int) * n);
    memcpy(hosts, best->hosts, sizeof(int) * n);
    return best->ms;
}

/* Runs search `kind` (dfs, greedy or ensemble) on the flows of p (see
 * flows.c) within ctl and expands the flow plan into order/hosts of the
 * unit tasks. Returns 0 and leaves order/hosts alone when flows do not
 * shrink the problem at least twofold (or memory runs out). */
static int flow_search(const xm_prep_t *p, xmesh_scheduler_t kind, xm_search_ctl_t *ctl, int *order,
                       int *hosts)
{
    xm_flows_t f;
    if (xm_flows_build(p, &f))
        return 0;
    int ok = 0, nf = f.nflows;
    xm_prep_t fp;
    xm_state_t st;
    xm_troutes_t tr;
    memset(&st, 0, sizeof st);
    memset(&tr, 0, sizeof tr);
    int *fo = malloc(sizeof(int) * (nf + 1)), *fh = malloc(sizeof(int) * (nf + 1));
    int *fx = malloc(sizeof(int) * ((size_t)nf * p->max_groups + 1));
    cand_t best = {malloc(sizeof(int) * (nf + 1)), malloc(sizeof(int) * (nf + 1)), INFINITY};
    if (2 * (int64_t)nf > p->ts->ntasks || !fo || !fh || !fx || !best.order || !best.hosts) {
        xm_flows_free(&f);
        goto out_free;
    }
    if (xm_prep_init(&fp, &f.ts, p->c, p->strategy)) {
        xm_flows_free(&f);
        goto out_free;
    }
    if (!xm_state_init(&st, &fp) && !xm_troutes_init(&tr, &fp)) {
        xm_search_ctl_t sub = *ctl;
        sub.evals = 0;
        sub.optimal = 0;
        /* the flow problem's own bound: meeting it is as good as it gets there */
        sub.lower_bound = xm_lower_bound_prep(&fp);
        if (kind == XMESH_SCHEDULER_DFS)
            xm_sched_dfs(&fp, &st, &tr, &sub, fo, fh);
        else if (kind == XMESH_SCHEDULER_GREEDY)
            xm_sched_greedy(&fp, &st, &tr, &sub, fo, fh);
        else
            ensemble(&fp, &st, &tr, &sub, fo, fh, fx, &best, 1);
        ctl->evals += sub.evals;
        xm_flows_expand(&f, fo, fh, order, hosts);
        ok = 1;
    }
    xm_state_free(&st);
    xm_troutes_free(&tr);
    xm_prep_free(&fp);
    xm_flows_free(&f);
out_free:
    free(fo);
    free(fh);
    free(fx);
    free(best.order);
    free(best.hosts);
    return ok;
}

xmesh_result_t xm_schedule(const xm_taskset_t *ts, const xm_cluster_t *c, const xm_sched_opts_t *o,
                           xm_schedule_t *out)
{
    xmesh_result_t r = check_inputs(ts, c, o, out);
    if (r)
        return r;
    double t0 = xm_now_s();
    xmesh_scheduler_t kind =
        o && o->kind != XMESH_SCHEDULER_UNSET ? o->kind : XMESH_SCHEDULER_ENSEMBLE;
    xm_prep_t p;
    if ((r = xm_prep_init(&p, ts, c, opts_strategy(o))))
        return r;
    int n = ts->ntasks;
    xm_state_t st;
    xm_troutes_t tr;
    xm_schedule_t flow_plan; /* the expanded flow plan, built while scoring it */
    int have_flow_plan = 0;
    memset(&st, 0, sizeof st);
    memset(&tr, 0, sizeof tr);
    memset(&flow_plan, 0, sizeof flow_plan);
    int *order = malloc(sizeof(int) * (n + 1)), *hosts = malloc(sizeof(int) * (n + 1));
    int *fixed = malloc(sizeof(int) * ((size_t)n * p.max_groups + 1));
    cand_t best = {malloc(sizeof(int) * (n + 1)), malloc(sizeof(int) * (n + 1)), INFINITY};
    if (!order || !hosts || !fixed || !best.order || !best.hosts) {
        r = XM_ERR(XMESH_ERR_NO_MEMORY, "scheduler: out of memory for %d tasks", n);
        goto out_free;
    }
    if ((r = xm_state_init(&st, &p)) || (r = xm_troutes_init(&tr, &p)))
        goto out_free;
    xm_search_ctl_t ctl;
    memset(&ctl, 0, sizeof ctl);
    int64_t budget = o && o->budget_us > 0 ? o->budget_us : XM_DEFAULT_BUDGET_US;
    ctl.max_evals = o ? o->max_evals : 0;
    ctl.seed = o ? o->seed : 0;
    ctl.lower_bound = xm_lower_bound_prep(&p);
    /* The budget bounds the searches; the linear preparation before them
     * (routing every option, the bound) is not part of it. */
    ctl.deadline_s = xm_now_s() + budget * 1e-6;

    if (kind == XMESH_SCHEDULER_NAIVE) {
        naive_plan(&p, order, fixed);
        r = materialise(&p, kind, order, NULL, fixed, ctl.lower_bound, out);
        goto out_done;
    }
    if (kind == XMESH_SCHEDULER_LB) {
        xm_sched_lb(&p, &st, &tr, order, hosts);
    } else if (n > XM_FLOW_MIN_TASKS && kind != XMESH_SCHEDULER_ENSEMBLE &&
               flow_search(&p, kind, &ctl, order, hosts)) {
        /* dfs / greedy on many tasks: searched on flows, expanded */
    } else if (kind == XMESH_SCHEDULER_DFS) {
        xm_sched_dfs(&p, &st, &tr, &ctl, order, hosts);
    } else if (kind == XMESH_SCHEDULER_GREEDY) {
        xm_sched_greedy(&p, &st, &tr, &ctl, order, hosts);
    } else if (n > XM_FLOW_MIN_TASKS) {
        /* Many tasks: the constructive plans on unit tasks (linear), the
         * searches on flows, then local moves on the unit plan while the
         * budget lasts and one evaluation fits in what is left. */
        double ms, te = xm_now_s();
        xm_search_ctl_t sub = sub_ctl(&ctl, 0.8);
        int flowed = flow_search(&p, kind, &sub, order, hosts);
        ctl.evals += sub.evals;
        if (flowed) {
            /* scored by building it: when it stays the best (it meets the
             * bound, typically), it is the result without another pass */
            te = xm_now_s();
            if ((r = materialise(&p, kind, order, hosts, NULL, ctl.lower_bound, &flow_plan)))
                goto out_free;
            have_flow_plan = 1;
            ms = flow_plan.makespan_s;
            best.ms = ms;
            if (!done(&best, &ctl)) {
                best.ms = INFINITY;
                keep_best(&p, &best, order, hosts, ms);
            }
            /* else nothing below runs and the flow plan is the result: no
             * copy of its order and hosts is needed */
        }
        /* the constructive plans on unit tasks, unless flows met the bound */
        if (!done(&best, &ctl)) {
            ms = xm_sched_lb(&p, &st, &tr, order, hosts);
            keep_best(&p, &best, order, hosts, ms);
            naive_plan(&p, order, fixed);
            for (int t = 0; t < n; t++)
                hosts[t] = p.dev_host[fixed[(size_t)t * p.max_groups]];
            ms = xm_eval_plan(&p, &st, &tr, order, hosts, NULL);
            keep_best(&p, &best, order, hosts, ms);
        }
        if (!flowed && !done(&best, &ctl) && !xm_ctl_expired(&ctl)) {
            /* flows do not shrink the problem: the plain ensemble */
            sub = sub_ctl(&ctl, 0.8);
            ensemble(&p, &st, &tr, &sub, order, hosts, fixed, &best, 0);
            ctl.evals += sub.evals;
        }
        double eval_s = xm_now_s() - te;
        if (!done(&best, &ctl) && (ctl.max_evals > 0 || xm_now_s() + 3 * eval_s < ctl.deadline_s)) {
            memcpy(order, best.order, sizeof(int) * n);
            memcpy(hosts, best.hosts, sizeof(int) * n);
            if (ctl.max_evals <= 0)
                ctl.deadline_s -= eval_s; /* the last evaluation must end in time */
            ms = xm_sched_improve(&p, &st, &tr, &ctl, order, hosts, best.ms);
            keep_best(&p, &best, order, hosts, ms);
        }
        if (!(have_flow_plan && best.ms == flow_plan.makespan_s)) {
            memcpy(order, best.order, sizeof(int) * n);
            memcpy(hosts, best.hosts, sizeof(int) * n);
        }
    } else {
        ensemble(&p, &st, &tr, &ctl, order, hosts, fixed, &best, 0);
    }
    if (have_flow_plan && best.ms == flow_plan.makespan_s) {
        /* the flow plan stayed the best (later plans replace it only when
         * strictly faster): already built */
        *out = flow_plan;
        have_flow_plan = 0;
    } else {
        r = materialise(&p, kind, order, hosts, NULL, ctl.lower_bound, out);
    }
out_done:
    if (!r)
        out->plan_s = xm_now_s() - t0;
out_free:
    if (have_flow_plan)
        xm_schedule_free(&flow_plan);
    free(order);
    free(hosts);
    free(fixed);
    free(best.order);
    free(best.hosts);
    xm_state_free(&st);
    xm_troutes_free(&tr);
    xm_prep_free(&p);
    return r;
}

xmesh_result_t xm_schedule_from(const xm_taskset_t *ts, const xm_cluster_t *c,
                                const xm_sched_opts_t *o, const int *order, const int *sender,
                                xm_schedule_t *out)
{
    xmesh_result_t r = check_inputs(ts, c, o, out);
    if (r)
        return r;
    if (!order || !sender)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xm_schedule_from: %s is NULL",
                      !order ? "order" : "sender");
    double t0 = xm_now_s();
    int n = ts->ntasks;
    xm_prep_t p;
    if ((r = xm_prep_init(&p, ts, c, opts_strategy(o))))
        return r;
    unsigned char *seen = calloc(n + 1, 1);
    if (!seen) {
        r = XM_ERR(XMESH_ERR_NO_MEMORY, "xm_schedule_from: out of memory");
        goto out_free;
    }
    for (int i = 0; i < n; i++) {
        if (order[i] < 0 || order[i] >= n || seen[order[i]]) {
            r = XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                       "xm_schedule_from: order[%d] = %d is not part of a permutation of %d "
                       "tasks",
                       i, order[i], n);
            goto out_free;
        }
        seen[order[i]] = 1;
    }
    for (int t = 0; t < n; t++) {
        const xm_task_t *k = &ts->tasks[t];
        for (int g = 0; g < k->ngroups; g++) {
            int d = sender[(size_t)t * p.max_groups + g], ok = 0;
            for (int j = 0; j < k->group_size && !ok; j++)
                ok = ts->holders[k->holder_off + g * k->group_size + j] == d;
            if (!ok) {
                r = XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                           "xm_schedule_from: sender %d of task %d group %d does not hold the "
                           "box",
                           d, t, g);
                goto out_free;
            }
        }
    }
    r = materialise(&p, o && o->kind != XMESH_SCHEDULER_UNSET ? o->kind : XMESH_SCHEDULER_ENSEMBLE,
                    order, NULL, sender, -1, out);
    if (!r)
        out->plan_s = xm_now_s() - t0;
out_free:
    free(seen);
    xm_prep_free(&p);
    return r;
}

void xm_schedule_free(xm_schedule_t *s)
{
    if (!s)
        return;
    free(s->order);
    free(s->sender);
    free(s->routes);
    free(s->task_route_off);
    free(s->route_devs);
    free(s->route_rails);
    memset(s, 0, sizeof *s);
}

xmesh_result_t xm_schedule_plan(xm_taskset_t *ts, const xm_cluster_t *c, const xm_sched_opts_t *o,
                                int split, xm_schedule_t *out, int *split_used)
{
    xmesh_result_t r = check_inputs(ts, c, o, out);
    if (r)
        return r;
    xmesh_scheduler_t kind =
        o && o->kind != XMESH_SCHEDULER_UNSET ? o->kind : XMESH_SCHEDULER_ENSEMBLE;
    /* naive is the paper's baseline: lowest holders, no balancing to gain */
    if (!split || kind == XMESH_SCHEDULER_NAIVE || ts->ntasks >= XM_SPLIT_MAX_TASKS) {
        if (!(r = xm_schedule(ts, c, o, out)) && split_used)
            *split_used = 0;
        return r;
    }
    double t0 = xm_now_s();
    xm_taskset_t sp;
    xm_schedule_t du, ds, w;
    memset(&sp, 0, sizeof sp);
    memset(&du, 0, sizeof du);
    memset(&ds, 0, sizeof ds);
    memset(&w, 0, sizeof w);
    if ((r = xm_taskset_split(ts, c, XM_SPLIT_MAX_TASKS, &sp, NULL)))
        return r;
    int use = 0;
    xm_schedule_t *best = &du;
    xm_taskset_t *set = ts;
    if (sp.ntasks == ts->ntasks) {
        /* nothing to cut: the plain schedule */
        if ((r = xm_schedule(ts, c, o, &w)))
            goto out_free;
        best = &w;
    } else {
        /* The choice of task set must be the same on every rank: decide
         * with a count budget, never with wall time. */
        xm_sched_opts_t det;
        memset(&det, 0, sizeof det);
        if (o)
            det = *o;
        if (det.max_evals <= 0)
            det.max_evals = XM_SPLIT_EVALS;
        if ((r = xm_schedule(ts, c, &det, &du)))
            goto out_free;
        /* Worth trying when the whole-task plan stays above its bound (an
         * integrality gap) or above the pieces' bound (pieces can use
         * NICs and hosts a whole task cannot: one task per host pair with
         * several NICs per host meets its own bound on one NIC). */
        double ref = du.lower_bound_s, lb_split = xm_lower_bound(&sp, c);
        if (lb_split < ref)
            ref = lb_split;
        if (du.makespan_s > ref * XM_SPLIT_TRY_RATIO) {
            if ((r = xm_schedule(&sp, c, &det, &ds)))
                goto out_free;
            use = ds.makespan_s < du.makespan_s * (1 - XM_SPLIT_MARGIN);
        }
        set = use ? &sp : ts;
        best = use ? &ds : &du;
        /* the caller's own (time) budget may still find a better plan of
         * the chosen set; rank 0's plan is the one every rank uses */
        if ((!o || o->max_evals <= 0) && best->makespan_s > best->lower_bound_s * (1 + 1e-9)) {
            if ((r = xm_schedule(set, c, o, &w)))
                goto out_free;
            if (w.makespan_s < best->makespan_s)
                best = &w;
        }
    }
    *out = *best;
    memset(best, 0, sizeof *best);
    out->plan_s = xm_now_s() - t0;
    if (use) {
        xm_taskset_free(ts);
        *ts = sp;
        memset(&sp, 0, sizeof sp);
    }
    if (split_used)
        *split_used = use;
out_free:
    xm_schedule_free(&du);
    xm_schedule_free(&ds);
    xm_schedule_free(&w);
    xm_taskset_free(&sp);
    return r;
}
