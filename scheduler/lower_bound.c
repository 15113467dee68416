/*
 * Lower bound of the completion time of a resharding (issue 3 item 2); the
 * proof is in docs/LOWER_BOUND.md. Three families of terms, maximum taken:
 *   (T) every task: its own shortest possible duration;
 *   (R) every receiver host h: each task that h needs and that h does not
 *       hold in full must come in through one of h's NICs (receive side);
 *   (S) every set S of holder hosts: each task whose holders all sit in S
 *       and that some host outside S needs must leave S through a send NIC
 *       of S (a Hall-type bound on the sender choice, paper eq. 4 relaxed).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "xm_sched_impl.h"

#define XM_LB_MAX_SUBSET_HOSTS 16

static double hop_bw(const xm_cluster_t *c)
{
    return c->nic_send_Bps < c->nic_recv_Bps ? c->nic_send_Bps : c->nic_recv_Bps;
}

/* (S) over all subsets of the universe of holder hosts (u <= 16 bits):
 * w(S) = sum of costs of tasks with holders in S minus those whose holders
 * and receivers are all in S, by two subset-sum (zeta) transforms. */
static double subset_bound(const xm_prep_t *p, const int *bit_of, int u)
{
    const xm_taskset_t *ts = p->ts;
    size_t n = (size_t)1 << u;
    double *f = calloc(n, sizeof *f), *g = calloc(n, sizeof *g);
    double best = 0;
    if (!f || !g)
        goto out_free; /* no memory: the bound stays valid, only weaker */
    for (int t = 0; t < ts->ntasks; t++) {
        const xm_task_t *k = &ts->tasks[t];
        if (!p->pt[t].needs_nic)
            continue;
        unsigned hm = 0, rm = 0;
        int routside = 0;
        for (int i = 0; i < k->ngroups * k->group_size; i++)
            hm |= 1u << bit_of[p->dev_host[ts->holders[k->holder_off + i]]];
        for (int i = 0; i < k->nrecv; i++) {
            int b = bit_of[p->dev_host[ts->recvs[k->recv_off + i]]];
            if (b < 0)
                routside = 1;
            else
                rm |= 1u << b;
        }
        f[hm] += p->pt[t].nic_cost;
        if (!routside)
            g[hm | rm] += p->pt[t].nic_cost;
    }
    for (int b = 0; b < u; b++)
        for (size_t m = 0; m < n; m++)
            if (m & ((size_t)1 << b)) {
                f[m] += f[m ^ ((size_t)1 << b)];
                g[m] += g[m ^ ((size_t)1 << b)];
            }
    for (size_t m = 1; m < n; m++) {
        double v = (f[m] - g[m]) / (__builtin_popcountll(m) * (double)p->nics);
        if (v > best)
            best = v;
    }
out_free:
    free(f);
    free(g);
    return best;
}

/* (S) restricted to singletons and the whole universe, for many hosts. */
static double singleton_bound(const xm_prep_t *p, const int *bit_of, int u)
{
    const xm_taskset_t *ts = p->ts;
    double *one = calloc(p->nhosts + 1, sizeof *one), all = 0, best = 0;
    if (!one)
        return 0;
    for (int t = 0; t < ts->ntasks; t++) {
        const xm_task_t *k = &ts->tasks[t];
        if (!p->pt[t].needs_nic)
            continue;
        int h0 = p->dev_host[ts->holders[k->holder_off]], single = 1, routside = 0;
        for (int i = 1; i < k->ngroups * k->group_size; i++)
            single &= p->dev_host[ts->holders[k->holder_off + i]] == h0;
        for (int i = 0; i < k->nrecv; i++)
            routside |= bit_of[p->dev_host[ts->recvs[k->recv_off + i]]] < 0;
        /* needs_nic with a single holder host means a receiver host is outside it */
        if (single)
            one[h0] += p->pt[t].nic_cost;
        if (routside)
            all += p->pt[t].nic_cost;
    }
    for (int h = 0; h < p->nhosts; h++)
        if (one[h] / p->nics > best)
            best = one[h] / p->nics;
    if (u > 0 && all / (u * (double)p->nics) > best)
        best = all / (u * (double)p->nics);
    free(one);
    return best;
}

double xm_lower_bound_prep(const xm_prep_t *p)
{
    const xm_taskset_t *ts = p->ts;
    const xm_cluster_t *c = p->c;
    double lb = 0, maxbw = c->intra_Bps > hop_bw(c) ? c->intra_Bps : hop_bw(c);
    /* (T) */
    for (int t = 0; t < ts->ntasks; t++) {
        if (ts->tasks[t].nrecv == 0)
            continue;
        double v = c->latency_s + (double)ts->tasks[t].bytes / maxbw;
        if (p->pt[t].needs_nic && p->pt[t].nic_cost > v)
            v = p->pt[t].nic_cost;
        if (v > lb)
            lb = v;
    }
    /* (R): a receiver host not holding the full value of a task takes it in
     * through one of its NICs; that NIC direction is busy for the task's
     * whole duration, at least nic_cost. */
    double *rin = calloc(p->nhosts + 1, sizeof *rin);
    int *bit_of = malloc(sizeof(int) * (p->nhosts + 1));
    if (!rin || !bit_of)
        goto out_free;
    for (int t = 0; t < ts->ntasks; t++) {
        const xm_task_t *k = &ts->tasks[t];
        for (int i = 0; i < k->nrecv; i++) {
            int h = p->dev_host[ts->recvs[k->recv_off + i]];
            if (i > 0 && p->dev_host[ts->recvs[k->recv_off + i - 1]] == h)
                continue;
            if (!p->recv_covered[k->recv_off + i])
                rin[h] += p->pt[t].nic_cost;
        }
    }
    for (int h = 0; h < p->nhosts; h++)
        if (rin[h] / p->nics > lb)
            lb = rin[h] / p->nics;
    /* (S) */
    int u = 0;
    for (int h = 0; h < p->nhosts; h++)
        bit_of[h] = -1;
    for (int t = 0; t < ts->ntasks; t++) {
        const xm_task_t *k = &ts->tasks[t];
        if (!p->pt[t].needs_nic)
            continue;
        for (int i = 0; i < k->ngroups * k->group_size; i++) {
            int h = p->dev_host[ts->holders[k->holder_off + i]];
            if (bit_of[h] < 0)
                bit_of[h] = u++;
        }
    }
    double sb =
        u <= XM_LB_MAX_SUBSET_HOSTS ? subset_bound(p, bit_of, u) : singleton_bound(p, bit_of, u);
    if (sb > lb)
        lb = sb;
out_free:
    free(rin);
    free(bit_of);
    return lb;
}

double xm_lower_bound(const xm_taskset_t *ts, const xm_cluster_t *c)
{
    xm_prep_t p;
    if (!ts || !c || xm_prep_init(&p, ts, c, XMESH_STRATEGY_BROADCAST))
        return 0;
    double lb = xm_lower_bound_prep(&p);
    xm_prep_free(&p);
    return lb;
}
