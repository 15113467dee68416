/*
 * Schedulers of paper 002 section 3.2: load balance only (eq. 4), depth-first
 * search with an admissible bound, randomized greedy rounds, and the local
 * improvement the ensemble runs on its best plan. All of them produce
 * (order, option host per task) and score it with xm_step(), the same
 * function that later materialises and simulates the plan.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "xm_sched_impl.h"

typedef struct {
    double key;
    int t;
} keyed_t;

static int cmp_keyed_desc(const void *a, const void *b)
{
    const keyed_t *x = a, *y = b;
    if (x->key != y->key)
        return x->key > y->key ? -1 : 1;
    return x->t < y->t ? -1 : x->t > y->t;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        abort(); /* searches have no error path; sizes are O(tasks) */
    return p;
}

static void *xcalloc(size_t n, size_t m)
{
    void *p = calloc(n ? n : 1, m ? m : 1);
    if (!p)
        abort();
    return p;
}

/* Load balance only (paper eq. 4): longest task first onto the candidate
 * sender host with the least work so far (LPT rule); tasks issued in the
 * decomposer's order, as the paper's "Load Balance Only" baseline. */
double xm_sched_lb(const xm_prep_t *p, xm_state_t *s, xm_troutes_t *r, int *order, int *hosts)
{
    int n = p->ts->ntasks;
    keyed_t *v = xmalloc(sizeof *v * n);
    double *load = xcalloc(p->nhosts, sizeof *load);
    for (int t = 0; t < n; t++)
        v[t] = (keyed_t){xm_pc(p, t)->min_dur, t};
    qsort(v, n, sizeof *v, cmp_keyed_desc);
    for (int i = 0; i < n; i++) {
        int t = v[i].t, bo = 0;
        const xm_prep_task_t *pt = &p->pt[t];
        for (int o = 1; o < pt->nopt; o++)
            if (load[p->opt_hosts[pt->opt_off + o]] < load[p->opt_hosts[pt->opt_off + bo]])
                bo = o;
        hosts[t] = p->opt_hosts[pt->opt_off + bo];
        if (xm_pc(p, t)->needs_nic)
            load[hosts[t]] += p->opt_dur[pt->opt_off + bo];
    }
    for (int t = 0; t < n; t++)
        order[t] = t;
    free(v);
    free(load);
    return xm_eval_plan(p, s, r, order, hosts, NULL);
}

/* Host-level free time of resource res (host * 2 + dir): the earliest of
 * the host's NICs in that direction. */
static inline double res_free(const xm_prep_t *p, const xm_state_t *s, int res)
{
    if (p->nics == 1)
        return s->dir_free[res];
    int h = res / 2, d = res & 1;
    double f = INFINITY;
    for (int k = 0; k < p->nics; k++) {
        double v = s->dir_free[(h * p->nics + k) * 2 + d];
        if (v < f)
            f = v;
    }
    return f;
}

/* Start of option o (global index) for ordering children: exact with one
 * NIC per host; with several, the NIC directions of its idle routing. */
static inline double opt_key(const xm_prep_t *p, const xm_state_t *s, int o)
{
    double st = 0;
    if (p->nics > 1) {
        for (int i = p->opt_nres_off[o]; i < p->opt_nres_off[o + 1]; i++)
            if (s->dir_free[p->opt_nres[i]] > st)
                st = s->dir_free[p->opt_nres[i]];
        return st;
    }
    for (int i = p->opt_res_off[o]; i < p->opt_res_off[o + 1]; i++)
        if (s->dir_free[p->opt_res[i]] - p->opt_res_t0[i] > st)
            st = s->dir_free[p->opt_res[i]] - p->opt_res_t0[i];
    return st;
}

/* Earliest possible end of option o (global index) of a task of class k:
 * exact with one NIC per host (the task starts when each direction is free
 * as its bytes reach it); a lower bound with several: each host direction
 * at its earliest-free NIC is then held at least nic_cost, within the task,
 * and the task takes at least min_dur. */
static inline double opt_end(const xm_prep_t *p, const xm_state_t *s, int o, int k)
{
    double st = 0;
    if (p->nics == 1) {
        for (int i = p->opt_res_off[o]; i < p->opt_res_off[o + 1]; i++) {
            double v = s->dir_free[p->opt_res[i]] - p->opt_res_t0[i];
            if (v > st)
                st = v;
        }
        return st + p->opt_dur[o];
    }
    double e = p->pc[k].min_dur;
    for (int i = p->opt_res_off[o]; i < p->opt_res_off[o + 1]; i++) {
        double v = res_free(p, s, p->opt_res[i]) + p->pc[k].nic_cost;
        if (v > e)
            e = v;
    }
    return e;
}

/* ------------------------------------------------------------------ DFS */

/* Depth-first branch and bound over (next task, sender host), the search of
 * paper 3.2 with three changes: (1) the bound is admissible (below), so
 * pruning never loses the optimum; (2) interchangeable tasks (same klass)
 * are only scheduled in index order, which removes k! equivalent orders per
 * class of k; (3) children are visited by earliest estimated start, so the
 * first leaf is a good list schedule and the budget refines it.
 *
 * Bound at a node (every term is a lower bound of any completion below it):
 *   - the current makespan;
 *   - per host h, receive side: (sum of h's receive-NIC free times + min
 *     durations of the remaining tasks h must take in by NIC) / nics;
 *   - send side: over S = hosts that can still send some remaining task,
 *     (sum of their send-NIC free times + remaining min durations) /
 *     (|S| * nics), since each remaining inter-host task leaves from S;
 *   - per class (few classes only): its next task's earliest end. */
typedef struct {
    int o; /* global option index */
    int t;
    double key, key2;
} child_t;

static int cmp_child(const void *a, const void *b)
{
    const child_t *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    if (x->key2 != y->key2)
        return x->key2 > y->key2 ? -1 : 1;
    if (x->t != y->t)
        return x->t < y->t ? -1 : 1;
    return x->o < y->o ? -1 : x->o > y->o;
}

static int worst_of(const child_t *kids, int nk)
{
    int w = 0;
    for (int i = 1; i < nk; i++)
        if (cmp_child(&kids[i], &kids[w]) > 0)
            w = i;
    return w;
}

typedef struct {
    const xm_prep_t *p;
    xm_state_t *s;
    xm_troutes_t *r;
    xm_search_ctl_t *ctl;
    xm_undo_t undo;
    int n, width, stop, truncated, expired;
    int exact_keys; /* several NICs: order children by a real step (host level is vague) */
    int *cls_off, *cls_list, *cls_pos; /* members of each class in index order */
    double *rem_recv;                  /* per host */
    double *rem_sendf;                 /* per host: remaining work only it can send */
    int *send_cnt;                     /* per host: remaining tasks it may send */
    double rem_send;
    int *cur_order, *cur_hosts, *best_order, *best_hosts;
    double best;
    double global_lb;
    child_t *kids; /* width per depth */
    int64_t nodes;
} dfs_t;

static void dfs_account(dfs_t *d, int t, int sign)
{
    const xm_prep_t *p = d->p;
    const xm_prep_task_t *pt = &p->pt[t];
    const xm_prep_class_t *pc = &p->pc[pt->klass];
    if (!pc->needs_nic)
        return;
    /* each remaining task holds a NIC direction at least nic_cost (it may
     * overlap its neighbours' fills: the directions, not the tasks, are
     * exclusive) */
    double m = pc->nic_cost * sign;
    for (int i = p->need_off[pt->klass]; i < p->need_off[pt->klass + 1]; i++)
        d->rem_recv[p->need_hosts[i]] -= m;
    for (int o = 0; o < pt->nopt; o++)
        d->send_cnt[p->opt_hosts[pt->opt_off + o]] -= sign;
    if (pt->nopt == 1)
        d->rem_sendf[p->opt_hosts[pt->opt_off]] -= m;
    d->rem_send -= m;
}

static double dfs_bound(dfs_t *d)
{
    const xm_prep_t *p = d->p;
    const xm_state_t *s = d->s;
    double b = s->makespan, ssum = 0;
    int ns = 0;
    /* only NICs that some task can use (xm_prep_t.nic_ok) count */
    for (int h = 0; h < p->nhosts; h++) {
        if (p->host_nics[h] == 0)
            continue;
        double rsum = 0, hs = 0;
        for (int k = 0; k < p->nics; k++)
            if (p->nic_ok[h * p->nics + k]) {
                rsum += s->dir_free[XM_DIR_RECV(h * p->nics + k)];
                hs += s->dir_free[XM_DIR_SEND(h * p->nics + k)];
            }
        double v = (rsum + d->rem_recv[h]) / p->host_nics[h];
        if (v > b)
            b = v;
        if (d->send_cnt[h] > 0) {
            ns += p->host_nics[h];
            ssum += hs;
        }
    }
    if (ns > 0 && (ssum + d->rem_send) / ns > b)
        b = (ssum + d->rem_send) / ns;
    if (p->nklass <= 64) {
        for (int k = 0; k < p->nklass; k++) {
            if (d->cls_pos[k] >= d->cls_off[k + 1])
                continue;
            int t = d->cls_list[d->cls_pos[k]];
            const xm_prep_task_t *pt = &p->pt[t];
            double e = INFINITY;
            for (int o = 0; o < pt->nopt; o++) {
                int go = pt->opt_off + o;
                double v = opt_end(p, s, go, k);
                if (v < e)
                    e = v;
            }
            if (e > b)
                b = e;
        }
    }
    return b;
}

/* Children of the current node: the next member of every class x its
 * options, the best `width` of them (unordered) in kids. Returns how many. */
static int gen_kids(dfs_t *d, child_t *kids)
{
    const xm_prep_t *p = d->p;
    int nk = 0, worst = 0;
    for (int k = 0; k < p->nklass; k++) {
        if (d->cls_pos[k] >= d->cls_off[k + 1])
            continue;
        int t = d->cls_list[d->cls_pos[k]];
        const xm_prep_task_t *pt = &p->pt[t];
        double crit = 0;
        for (int i = p->need_off[k]; i < p->need_off[k + 1]; i++)
            if (d->rem_recv[p->need_hosts[i]] > crit)
                crit = d->rem_recv[p->need_hosts[i]];
        if (pt->nopt == 1 && d->rem_sendf[p->opt_hosts[pt->opt_off]] > crit)
            crit = d->rem_sendf[p->opt_hosts[pt->opt_off]];
        for (int o = 0; o < pt->nopt; o++) {
            int go = pt->opt_off + o;
            double key;
            if (d->exact_keys) {
                int mark = d->undo.n;
                xm_step(p, d->s, t, p->opt_hosts[go], NULL, d->r, &d->undo);
                key = d->r->start;
                xm_undo_to(&d->undo, mark);
            } else {
                key = opt_key(p, d->s, go);
            }
            child_t c = {go, t, key, crit + p->opt_dur[go] * 1e-3};
            if (nk < d->width) {
                kids[nk++] = c;
                if (nk == d->width)
                    worst = worst_of(kids, nk);
            } else {
                /* keep the best `width`: replace the worst if c is better */
                d->truncated = 1;
                if (c.key <= kids[worst].key && cmp_child(&c, &kids[worst]) < 0) {
                    kids[worst] = c;
                    worst = worst_of(kids, nk);
                }
            }
        }
    }
    return nk;
}

/* The first dive alone, iteratively (no recursion, no backtracking): a list
 * schedule by earliest start, for instances too deep to recurse. */
static void dfs_dive(dfs_t *d)
{
    const xm_prep_t *p = d->p;
    for (int depth = 0; depth < d->n; depth++) {
        /* a wall-clock budget is strict here: give up, the caller falls
         * back to load balancing (a count budget keeps the dive whole) */
        if ((depth & 15) == 15 && d->ctl->max_evals <= 0 && xm_ctl_expired(d->ctl)) {
            d->expired = 1;
            return; /* d->best stays infinite */
        }
        int nk = gen_kids(d, d->kids), m = 0;
        for (int j = 1; j < nk; j++)
            if (cmp_child(&d->kids[j], &d->kids[m]) < 0)
                m = j;
        int t = d->kids[m].t, h = p->opt_hosts[d->kids[m].o];
        xm_step(p, d->s, t, h, NULL, d->r, NULL);
        d->ctl->evals++;
        d->cls_pos[p->pt[t].klass]++;
        dfs_account(d, t, 1);
        d->cur_order[depth] = t;
        d->cur_hosts[t] = h;
    }
    d->best = d->s->makespan;
    memcpy(d->best_order, d->cur_order, sizeof(int) * d->n);
    memcpy(d->best_hosts, d->cur_hosts, sizeof(int) * d->n);
    d->truncated = 1; /* not a proof of anything */
}

static void dfs_rec(dfs_t *d, int depth)
{
    const xm_prep_t *p = d->p;
    if (depth == d->n) {
        if (d->s->makespan < d->best) {
            d->best = d->s->makespan;
            memcpy(d->best_order, d->cur_order, sizeof(int) * d->n);
            memcpy(d->best_hosts, d->cur_hosts, sizeof(int) * d->n);
            if (d->best <= d->global_lb * (1 + 1e-12))
                d->stop = 1; /* provably optimal */
        }
        return;
    }
    /* The first dive (until a first leaf exists) ignores a count budget (it
     * is polynomial, and deterministic runs need a plan); a wall-clock
     * budget stops it too and the caller falls back to load balancing. */
    if ((++d->nodes & 15) == 0 && (isfinite(d->best) || d->ctl->max_evals <= 0) &&
        xm_ctl_expired(d->ctl)) {
        d->stop = d->expired = 1;
        return;
    }
    /* children: next member of every class x its options, best `width` */
    child_t *kids = d->kids + (size_t)depth * d->width;
    int nk = gen_kids(d, kids);
    /* Best-first without sorting: most nodes of a big instance only ever
     * visit their first child, so select lazily. */
    for (int i = 0; i < nk && !d->stop; i++) {
        int m = i;
        for (int j = i + 1; j < nk; j++)
            if (cmp_child(&kids[j], &kids[m]) < 0)
                m = j;
        child_t tmp = kids[i];
        kids[i] = kids[m];
        kids[m] = tmp;
        int t = kids[i].t, k = p->pt[t].klass, h = p->opt_hosts[kids[i].o];
        int mark = d->undo.n;
        xm_step(p, d->s, t, h, NULL, d->r, &d->undo);
        d->ctl->evals++;
        d->cls_pos[k]++;
        dfs_account(d, t, 1);
        if (dfs_bound(d) < d->best * (1 - 1e-12)) {
            d->cur_order[depth] = t;
            d->cur_hosts[t] = h;
            dfs_rec(d, depth + 1);
        }
        dfs_account(d, t, -1);
        d->cls_pos[k]--;
        xm_undo_to(&d->undo, mark);
    }
}

/* Deeper than this the DFS only makes its first dive, iteratively (the
 * recursion would need a frame per task on the stack). */
#define XM_DFS_MAX_DEPTH 8192
/* Above this many tasks greedy falls back to load balancing: its rounds are
 * O(tasks^2 / hosts) and a run cannot stop half way. */
#define XM_GREEDY_MAX_TASKS 16384

double xm_sched_dfs(const xm_prep_t *p, xm_state_t *s, xm_troutes_t *r, xm_search_ctl_t *ctl,
                    int *order, int *hosts)
{
    int n = p->ts->ntasks;
    dfs_t d;
    memset(&d, 0, sizeof d);
    d.p = p;
    d.s = s;
    d.r = r;
    d.ctl = ctl;
    d.n = n;
    int maxopt = 1;
    for (int t = 0; t < n; t++)
        if (p->pt[t].nopt > maxopt)
            maxopt = p->pt[t].nopt;
    /* Exact (full branching) when a node has few children; otherwise a
     * beam of the 8 most promising, which keeps big instances tractable. */
    d.width = p->nklass * maxopt <= 64 ? p->nklass * maxopt : 8;
    d.exact_keys = p->nics > 1 && p->nklass * maxopt <= 64;
    d.cls_off = xcalloc(p->nklass + 1, sizeof(int));
    d.cls_list = xmalloc(sizeof(int) * n);
    d.cls_pos = xmalloc(sizeof(int) * (p->nklass + 1));
    for (int t = 0; t < n; t++)
        d.cls_off[p->pt[t].klass + 1]++;
    for (int k = 0; k < p->nklass; k++)
        d.cls_off[k + 1] += d.cls_off[k];
    for (int k = 0; k < p->nklass; k++)
        d.cls_pos[k] = d.cls_off[k];
    for (int t = 0; t < n; t++)
        d.cls_list[d.cls_pos[p->pt[t].klass]++] = t;
    for (int k = 0; k < p->nklass; k++)
        d.cls_pos[k] = d.cls_off[k];
    d.rem_recv = xcalloc(p->nhosts, sizeof(double));
    d.rem_sendf = xcalloc(p->nhosts, sizeof(double));
    d.send_cnt = xcalloc(p->nhosts, sizeof(int));
    for (int t = 0; t < n; t++)
        dfs_account(&d, t, -1);
    d.cur_order = xmalloc(sizeof(int) * n);
    d.cur_hosts = xmalloc(sizeof(int) * n);
    d.best_order = xmalloc(sizeof(int) * n);
    d.best_hosts = xmalloc(sizeof(int) * n);
    int deep = n > XM_DFS_MAX_DEPTH;
    d.kids = xmalloc(sizeof(child_t) * ((size_t)(deep ? 1 : n) * d.width + 1));
    d.best = INFINITY;
    d.global_lb = ctl->lower_bound;
    xm_state_reset(s, p);
    if (deep)
        dfs_dive(&d);
    else
        dfs_rec(&d, 0);
    double ms = d.best;
    /* Whole tree searched (or the bound met): nothing better exists. */
    if (isfinite(ms) && !d.expired && !d.truncated)
        ctl->optimal = 1;
    if (isfinite(ms)) {
        memcpy(order, d.best_order, sizeof(int) * n);
        memcpy(hosts, d.best_hosts, sizeof(int) * n);
    } else {
        /* budget ran out before the first leaf: fall back to load balance */
        ms = xm_sched_lb(p, s, r, order, hosts);
    }
    xm_undo_free(&d.undo);
    free(d.cls_off);
    free(d.cls_list);
    free(d.cls_pos);
    free(d.rem_recv);
    free(d.rem_sendf);
    free(d.send_cnt);
    free(d.cur_order);
    free(d.cur_hosts);
    free(d.best_order);
    free(d.best_hosts);
    free(d.kids);
    return ms;
}

/* --------------------------------------------------------------- greedy */

/* Randomized greedy of paper 3.2: repeatedly build a round, a set of tasks
 * whose NIC directions do not collide (each host direction has nics slots),
 * by scanning the remaining tasks in random order and taking every task that
 * fits (on its least-loaded fitting sender host); of a few random scans keep
 * the round touching the most devices. The concatenated rounds form the
 * order. Seeded; the best of as many runs as the budget allows is kept. */
static double greedy_run(const xm_prep_t *p, xm_state_t *s, xm_troutes_t *r, uint64_t *rng,
                         int *order, int *hosts, int *rem, int *used, int *pick, int *pick_h,
                         int *best_pick, int *best_h, double *load)
{
    int n = p->ts->ntasks, nrem = n, pos = 0;
    const int trials = 3, max_reject = 64;
    for (int t = 0; t < n; t++)
        rem[t] = t;
    memset(load, 0, sizeof(double) * p->nhosts);
    while (nrem > 0) {
        int best_n = 0, best_score = -1;
        for (int tr = 0; tr < trials; tr++) {
            memset(used, 0, sizeof(int) * 2 * p->nhosts);
            int np = 0, score = 0, reject = 0;
            /* partial Fisher-Yates over rem[0 .. nrem): position i gets a random one */
            for (int i = 0; i < nrem && reject < max_reject; i++) {
                int j = i + (int)(xm_rng_next(rng) % (uint64_t)(nrem - i));
                int tmp = rem[i];
                rem[i] = rem[j];
                rem[j] = tmp;
                int t = rem[i];
                const xm_prep_task_t *pt = &p->pt[t];
                int bo = -1;
                for (int o = 0; o < pt->nopt; o++) {
                    int go = pt->opt_off + o, fits = 1;
                    for (int q = p->opt_res_off[go]; q < p->opt_res_off[go + 1] && fits; q++)
                        fits = used[p->opt_res[q]] < p->nics;
                    if (fits &&
                        (bo < 0 || load[p->opt_hosts[go]] < load[p->opt_hosts[pt->opt_off + bo]]))
                        bo = o;
                }
                if (bo < 0) {
                    reject++;
                    continue;
                }
                int go = pt->opt_off + bo;
                for (int q = p->opt_res_off[go]; q < p->opt_res_off[go + 1]; q++)
                    used[p->opt_res[q]]++;
                pick[np] = i; /* index into rem */
                pick_h[np++] = go;
                score += p->ts->tasks[t].nrecv + p->ts->tasks[t].ngroups;
            }
            if (score > best_score) {
                best_score = score;
                best_n = np;
                for (int q = 0; q < np; q++) {
                    best_pick[q] = rem[pick[q]];
                    best_h[q] = pick_h[q];
                }
            }
        }
        /* append the round, drop its tasks from rem */
        for (int q = 0; q < best_n; q++) {
            int t = best_pick[q], go = best_h[q];
            order[pos++] = t;
            hosts[t] = p->opt_hosts[go];
            if (xm_pc(p, t)->needs_nic)
                load[hosts[t]] += p->opt_dur[go];
            for (int i = 0; i < nrem; i++)
                if (rem[i] == t) {
                    rem[i] = rem[--nrem];
                    break;
                }
        }
    }
    return xm_eval_plan(p, s, r, order, hosts, NULL);
}

double xm_sched_greedy(const xm_prep_t *p, xm_state_t *s, xm_troutes_t *r, xm_search_ctl_t *ctl,
                       int *order, int *hosts)
{
    int n = p->ts->ntasks;
    if (n > XM_GREEDY_MAX_TASKS)
        return xm_sched_lb(p, s, r, order, hosts);
    int *rem = xmalloc(sizeof(int) * n), *used = xmalloc(sizeof(int) * 2 * p->nhosts);
    int *pick = xmalloc(sizeof(int) * n), *pick_h = xmalloc(sizeof(int) * n);
    int *best_pick = xmalloc(sizeof(int) * n), *best_h = xmalloc(sizeof(int) * n);
    int *o2 = xmalloc(sizeof(int) * n), *h2 = xmalloc(sizeof(int) * n);
    double *load = xmalloc(sizeof(double) * p->nhosts);
    uint64_t rng = ctl->seed ^ 0x67726565647900ull;
    double best = INFINITY;
    const int max_runs = 64, patience = 16;
    for (int run = 0, stale = 0; run < max_runs && stale < patience; run++) {
        double ms =
            greedy_run(p, s, r, &rng, o2, h2, rem, used, pick, pick_h, best_pick, best_h, load);
        ctl->evals += n;
        stale++;
        if (ms < best) {
            best = ms;
            stale = 0;
            memcpy(order, o2, sizeof(int) * n);
            memcpy(hosts, h2, sizeof(int) * n);
        }
        if (best <= ctl->lower_bound * (1 + 1e-12) || xm_ctl_expired(ctl))
            break;
    }
    free(rem);
    free(used);
    free(pick);
    free(pick_h);
    free(best_pick);
    free(best_h);
    free(o2);
    free(h2);
    free(load);
    return best;
}

/* -------------------------------------------------------------- improve */

/* Evaluates (order, hosts) recording per position the end time and the
 * position of the task that blocked its start (-1: started when its NIC
 * directions were idle). Returns the makespan; *sum = sum of end times. */
static double eval_crit(const xm_prep_t *p, xm_state_t *s, xm_troutes_t *r, const int *order,
                        const int *hosts, double *end, int *pred, int *dir_last, double *dir_end,
                        double *sum)
{
    int n = p->ts->ntasks;
    xm_state_reset(s, p);
    for (int d = 0; d < 2 * p->nnics; d++)
        dir_last[d] = -1, dir_end[d] = 0;
    double tot = 0;
    for (int i = 0; i < n; i++) {
        end[i] = xm_step(p, s, order[i], hosts[order[i]], NULL, r, NULL);
        tot += end[i];
        pred[i] = -1;
        for (int u = 0; u < r->nuse; u++) {
            /* blocked: the direction was free just as this task's bytes reached it */
            int d = r->use_dir[u], q = dir_last[d];
            if (q >= 0 && dir_end[d] - r->use_off[u] == r->start)
                pred[i] = q;
            dir_last[d] = i;
            dir_end[d] = s->dir_free[d];
        }
    }
    *sum = tot;
    return s->makespan;
}

/* Local search on a plan (used by the ensemble after the constructive
 * schedulers). Moves, all re-scored exactly: along the critical chain (the
 * last task and the tasks that, one after another, delayed it) move a task
 * in front of its blocker or to a random earlier place, or give it another
 * sender host; sometimes a random move anywhere. A move is kept when
 * (makespan, sum of end times) does not grow, so the search can cross
 * plateaus of equal makespan while tails shrink. */
double xm_sched_improve(const xm_prep_t *p, xm_state_t *s, xm_troutes_t *r, xm_search_ctl_t *ctl,
                        int *order, int *hosts, double cur)
{
    int n = p->ts->ntasks;
    if (n < 2)
        return cur;
    int *o2 = xmalloc(sizeof(int) * n), *chain = xmalloc(sizeof(int) * n);
    int *pred = xmalloc(sizeof(int) * n), *pred2 = xmalloc(sizeof(int) * n);
    int *dir_last = xmalloc(sizeof(int) * 2 * p->nnics);
    double *dir_end = xmalloc(sizeof(double) * 2 * p->nnics);
    double *end = xmalloc(sizeof(double) * n), *end2 = xmalloc(sizeof(double) * n);
    uint64_t rng = ctl->seed ^ 0x696d70726f7665ull;
    double sum, sum2;
    cur = eval_crit(p, s, r, order, hosts, end, pred, dir_last, dir_end, &sum);
    while (cur > ctl->lower_bound * (1 + 1e-12) && !xm_ctl_expired(ctl)) {
        uint64_t x = xm_rng_next(&rng);
        /* critical chain, last task first */
        int nc = 0, last = 0;
        for (int i = 0; i < n; i++)
            if (end[i] >= end[last])
                last = i;
        for (int i = last; i >= 0 && nc < n; i = pred[i])
            chain[nc++] = i;
        int move = (int)(x % 5), t = -1, oldh = -1, i, j;
        memcpy(o2, order, sizeof(int) * n);
        ctl->evals++;
        if (move == 0 && nc > 1) {
            /* a critical task jumps in front of the task that blocked it */
            int c = 1 + (int)((x >> 8) % (uint64_t)(nc - 1));
            i = chain[c - 1];
            j = chain[c];
            int v = o2[i];
            memmove(o2 + j + 1, o2 + j, sizeof(int) * (i - j));
            o2[j] = v;
        } else if (move <= 1) {
            /* the last task, or any task, moves to a random earlier place */
            i = move == 0 ? last : (int)((x >> 8) % (uint64_t)n);
            if (i == 0)
                continue;
            j = (int)((x >> 32) % (uint64_t)i);
            int v = o2[i];
            memmove(o2 + j + 1, o2 + j, sizeof(int) * (i - j));
            o2[j] = v;
        } else if (move == 2) {
            /* another sender host */
            t = order[(x >> 8) % (uint64_t)n];
            if (p->pt[t].nopt < 2) {
                t = -1;
                continue;
            }
            oldh = hosts[t];
            hosts[t] = p->opt_hosts[p->pt[t].opt_off + (int)((x >> 32) % (uint64_t)p->pt[t].nopt)];
            if (hosts[t] == oldh) {
                t = -1;
                continue;
            }
        } else if (move == 3) {
            /* the last task moves to a random earlier place */
            if (last == 0)
                continue;
            j = (int)((x >> 32) % (uint64_t)last);
            int v = o2[last];
            memmove(o2 + j + 1, o2 + j, sizeof(int) * (last - j));
            o2[j] = v;
        } else {
            i = (int)((x >> 8) % (uint64_t)n);
            j = (int)((x >> 32) % (uint64_t)n);
            int v = o2[i];
            o2[i] = o2[j];
            o2[j] = v;
        }
        double ms = eval_crit(p, s, r, o2, hosts, end2, pred2, dir_last, dir_end, &sum2);
        ctl->evals += n;
        if (ms <= cur) {
            cur = ms;
            sum = sum2;
            memcpy(order, o2, sizeof(int) * n);
            memcpy(end, end2, sizeof(double) * n);
            memcpy(pred, pred2, sizeof(int) * n);
        } else if (t >= 0) {
            hosts[t] = oldh;
        }
    }
    free(o2);
    free(chain);
    free(pred);
    free(pred2);
    free(dir_last);
    free(dir_end);
    free(end);
    free(end2);
    return cur;
}

/* ------------------------------------------------------------- coloring */

/* Rounds by bipartite edge coloring (Konig): a task that crosses exactly
 * one send direction and one receive direction (of a host with one NIC; of
 * NICs, as routed on an idle cluster, with several) is an edge between them; the edges of a
 * bipartite multigraph of maximum degree D split into D matchings, so with equal durations the
 * rounds finish at the busiest direction's load, i.e. the lower bound, where greedy rounds can
 * leave gaps. Sender hosts come from load balancing (eq. 4); tasks that are
 * not such edges go after the rounds, longest first. */
double xm_sched_color(const xm_prep_t *p, xm_state_t *s, xm_troutes_t *r, int *order, int *hosts)
{
    /* vertices: send and receive side of every NIC (host with one NIC) */
    int n = p->ts->ntasks, V = 2 * p->nnics;
    const int *roff = p->nics == 1 ? p->opt_res_off : p->opt_nres_off;
    const int *res = p->nics == 1 ? p->opt_res : p->opt_nres;
    if (n == 0)
        return INFINITY;
    xm_sched_lb(p, s, r, order, hosts); /* sender hosts */
    int *eu = xmalloc(sizeof(int) * n), *ev = xmalloc(sizeof(int) * n);
    int *deg = xcalloc(V, sizeof(int)), *col = xmalloc(sizeof(int) * n);
    int D = 0;
    for (int t = 0; t < n; t++) {
        const xm_prep_task_t *pt = &p->pt[t];
        int go = -1;
        for (int o = 0; o < pt->nopt; o++)
            if (p->opt_hosts[pt->opt_off + o] == hosts[t])
                go = pt->opt_off + o;
        eu[t] = ev[t] = -1;
        col[t] = -1;
        if (go < 0 || roff[go + 1] - roff[go] != 2)
            continue;
        int a = res[roff[go]], b = res[roff[go] + 1];
        if ((a & 1) == (b & 1))
            continue;
        eu[t] = (a & 1) ? b / 2 : a / 2;              /* sending NIC (host) */
        ev[t] = p->nnics + ((a & 1) ? a / 2 : b / 2); /* receiving NIC (host) */
        if (++deg[eu[t]] > D)
            D = deg[eu[t]];
        if (++deg[ev[t]] > D)
            D = deg[ev[t]];
    }
    int *at = xmalloc(sizeof(int) * ((size_t)V * (D + 1)));
    int *path = xmalloc(sizeof(int) * (n + 1));
    for (size_t i = 0; i < (size_t)V * (D + 1); i++)
        at[i] = -1;
#define AT(x, c) at[(size_t)(x) * (D + 1) + (c)]
    for (int t = 0; t < n; t++) {
        if (eu[t] < 0)
            continue;
        int u = eu[t], v = ev[t], a = 0, b = 0;
        while (AT(u, a) >= 0)
            a++;
        while (AT(v, b) >= 0)
            b++;
        if (AT(v, a) >= 0) {
            /* flip the a/b alternating path from v; it cannot reach u */
            int np = 0, x = v, c = a;
            while (AT(x, c) >= 0) {
                int f = AT(x, c);
                path[np++] = f;
                x = eu[f] == x ? ev[f] : eu[f];
                c = c == a ? b : a;
            }
            for (int i = 0; i < np; i++) {
                int f = path[i];
                AT(eu[f], col[f]) = -1;
                AT(ev[f], col[f]) = -1;
            }
            for (int i = 0; i < np; i++) {
                int f = path[i];
                col[f] = col[f] == a ? b : a;
                AT(eu[f], col[f]) = f;
                AT(ev[f], col[f]) = f;
            }
        }
        col[t] = a;
        AT(u, a) = t;
        AT(v, a) = t;
    }
#undef AT
    /* order: tasks without NIC, the rounds, then the rest (longest first) */
    keyed_t *v = xmalloc(sizeof *v * n);
    for (int t = 0; t < n; t++) {
        int nres = 0;
        for (int o = 0; o < p->pt[t].nopt; o++)
            if (p->opt_hosts[p->pt[t].opt_off + o] == hosts[t])
                nres = roff[p->pt[t].opt_off + o + 1] - roff[p->pt[t].opt_off + o];
        /* descending key: no-NIC first, then color 0, 1, ..., then others */
        double rank = nres == 0 ? 0 : col[t] >= 0 ? 1 + col[t] : 2.0 + D;
        double md = xm_pc(p, t)->min_dur;
        v[t] = (keyed_t){-(rank * 1e6) + md / (md + 1.0), t};
    }
    qsort(v, n, sizeof *v, cmp_keyed_desc);
    for (int i = 0; i < n; i++)
        order[i] = v[i].t;
    free(v);
    free(eu);
    free(ev);
    free(deg);
    free(col);
    free(at);
    free(path);
    return xm_eval_plan(p, s, r, order, hosts, NULL);
}
