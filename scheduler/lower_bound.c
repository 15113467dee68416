/*
 * Lower bound of the completion time of a resharding (issue 3 item 2); the
 * proof is in docs/LOWER_BOUND.md. Three families of terms, maximum taken:
 *   (T) every task: its own shortest possible duration;
 *   (R) every receiver host h: each task that h needs and that h does not
 *       hold in full must come in through one of h's NICs (receive side);
 *   (S) every set S of holder hosts: each task whose holders all sit in S
 *       and that some host outside S needs must leave S through a send NIC
 *       of S (a Hall-type bound on the sender choice, paper eq. 4 relaxed).
 * (R) and (S) sum each task's occupancy of one NIC direction, nic_cost =
 * bytes / hop_bw + latency, not its duration: a direction is exclusive to one
 * task's bytes at a time, but consecutive chains overlap their fills.
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

/* A task has to leave host set S (bit mask over the holder-host universe)
 * if some partial group (the only group without P) has all its holders in S
 * and some receiver is outside S: that group's data enters the chain inside
 * S and must reach the receiver. send_bound() tests this on task classes
 * (agg_t below). */

/* (S) for tasks without P over all subsets of the universe (u <= 16 bits):
 * w(S) = sum of costs of tasks with holders in S minus those whose holders
 * and receivers are all in S, by two subset-sum (zeta) transforms.
 * Returns the array w (caller frees) or NULL without memory. */
static double *subset_weights(const xm_prep_t *p, const int *bit_of, int u)
{
    const xm_taskset_t *ts = p->ts;
    size_t n = (size_t)1 << u;
    double *f = calloc(n, sizeof *f), *g = calloc(n, sizeof *g);
    if (!f || !g) {
        free(f);
        free(g);
        return NULL;
    }
    /* masks per class (its tasks have the same holder and receiver hosts),
     * sums per task in task order */
    unsigned *cm = malloc(sizeof *cm * 2 * ((size_t)p->nklass + 1));
    if (!cm) {
        free(f);
        free(g);
        return NULL;
    }
    for (int c = 0; c < p->nklass; c++) {
        const xm_task_t *k = &ts->tasks[p->pc[c].rep];
        if (!p->pc[c].needs_nic || k->ngroups > 1)
            continue;
        unsigned hm = 0, rm = 0;
        int routside = 0;
        for (int i = 0; i < k->group_size; i++)
            hm |= 1u << bit_of[p->dev_host[ts->holders[k->holder_off + i]]];
        for (int i = 0; i < k->nrecv; i++) {
            int b = bit_of[p->dev_host[ts->recvs[k->recv_off + i]]];
            if (b < 0)
                routside = 1;
            else
                rm |= 1u << b;
        }
        cm[2 * c] = hm;
        cm[2 * c + 1] = routside ? ~0u : hm | rm;
    }
    for (int t = 0; t < ts->ntasks; t++) {
        int c = p->pt[t].klass;
        const xm_prep_class_t *pc = &p->pc[c];
        if (!pc->needs_nic || pc->ngroups > 1)
            continue;
        f[cm[2 * c]] += pc->nic_cost;
        if (cm[2 * c + 1] != ~0u)
            g[cm[2 * c + 1]] += pc->nic_cost;
    }
    free(cm);
    for (int b = 0; b < u; b++)
        for (size_t m = 0; m < n; m++)
            if (m & ((size_t)1 << b)) {
                f[m] += f[m ^ ((size_t)1 << b)];
                g[m] += g[m ^ ((size_t)1 << b)];
            }
    for (size_t m = 0; m < n; m++)
        f[m] -= g[m];
    free(g);
    return f;
}

/* (S): every subset when the universe is small (P tasks only at the
 * candidate sets below), otherwise the candidate sets only: every single
 * host, every group's holder-host set, and the whole universe. */
/* Usable NICs of the hosts in mask m. */
static double nics_of(const xm_prep_t *p, const int *bit_host, uint64_t m)
{
    int c = 0;
    for (; m; m &= m - 1)
        c += p->host_nics[bit_host[__builtin_ctzll(m)]];
    return c > 0 ? c : 1;
}

/* One class of tasks for the candidate-set loop: equal group holder-host
 * masks and receiver-host masks; w = sum of their nic_cost. */
typedef struct {
    uint64_t rmask, hash;
    int rout, ngroups, goff;
    double w;
} agg_ent_t;

typedef struct {
    int n, cap;
    agg_ent_t *ent;
    uint64_t *gmask; /* ngroups masks per entry at goff */
    int ng, gcap;
    int *slot; /* open addressing, 2 * cap entries */
} agg_t;

static void agg_free(agg_t *a)
{
    free(a->ent);
    free(a->gmask);
    free(a->slot);
    memset(a, 0, sizeof *a);
}

static uint64_t mix64(uint64_t h, uint64_t v)
{
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xbf58476d1ce4e5b9ull;
    return h ^ (h >> 29);
}

/* Classes of the NIC-needing tasks that send_bound's candidate loop must
 * look at; tasks without P weigh 0 when the subset weights already count
 * them (skip_np). Masks need u <= 64. Returns nonzero
 * without memory. */
static int agg_build(const xm_prep_t *p, const int *bit_of, int skip_np, agg_t *a)
{
    const xm_taskset_t *ts = p->ts;
    memset(a, 0, sizeof *a);
    int n = ts->ntasks;
    /* at most one entry per prep class (lookups are per class) */
    a->cap = 64;
    while (a->cap < p->nklass && a->cap < (1 << 24))
        a->cap *= 2;
    a->ent = malloc(sizeof *a->ent * a->cap);
    a->slot = malloc(sizeof *a->slot * 2 * (size_t)a->cap);
    a->gcap = 256;
    a->gmask = malloc(sizeof *a->gmask * a->gcap);
    if (!a->ent || !a->slot || !a->gmask)
        goto fail;
    for (int i = 0; i < 2 * a->cap; i++)
        a->slot[i] = -1;
    /* interchangeable tasks (one prep class: same holder and receiver
     * NICs, so same hosts) land in the same entry: looked up once */
    int *ent_of = malloc(sizeof(int) * ((size_t)p->nklass + 1));
    if (!ent_of)
        goto fail;
    for (int c = 0; c < p->nklass; c++)
        ent_of[c] = -1;
    uint64_t gm_buf[64];
    for (int t = 0; t < n; t++) {
        const xm_prep_class_t *pc = xm_pc(p, t);
        if (!pc->needs_nic)
            continue;
        /* tasks already in the subset weights still propose candidate sets */
        agg_ent_t e = {0, 0, 0, pc->ngroups, 0, skip_np && pc->ngroups == 1 ? 0.0 : pc->nic_cost};
        if (ent_of[p->pt[t].klass] >= 0) {
            a->ent[ent_of[p->pt[t].klass]].w += e.w;
            continue;
        }
        const xm_task_t *k = &ts->tasks[t];
        uint64_t *gm = k->ngroups <= 64 ? gm_buf : malloc(sizeof *gm * k->ngroups);
        if (!gm) {
            free(ent_of);
            goto fail;
        }
        for (int i = 0; i < k->nrecv; i++) {
            int b = bit_of[p->dev_host[ts->recvs[k->recv_off + i]]];
            if (b < 0)
                e.rout = 1;
            else
                e.rmask |= 1ull << b;
        }
        uint64_t h = mix64(mix64(e.rmask, (uint64_t)e.rout), (uint64_t)k->ngroups);
        for (int g = 0; g < k->ngroups; g++) {
            uint64_t m = 0;
            for (int j = 0; j < k->group_size; j++)
                m |=
                    1ull << bit_of[p->dev_host[ts->holders[k->holder_off + g * k->group_size + j]]];
            gm[g] = m;
            h = mix64(h, m);
        }
        e.hash = h;
        size_t mask = 2 * (size_t)a->cap - 1, s = (size_t)h & mask;
        int found = -1;
        while (a->slot[s] >= 0) {
            const agg_ent_t *x = &a->ent[a->slot[s]];
            if (x->hash == h && x->rmask == e.rmask && x->rout == e.rout &&
                x->ngroups == e.ngroups &&
                !memcmp(a->gmask + x->goff, gm, sizeof *gm * (size_t)e.ngroups)) {
                found = a->slot[s];
                break;
            }
            s = (s + 1) & mask;
        }
        if (found >= 0) {
            a->ent[found].w += e.w;
            ent_of[p->pt[t].klass] = found;
        } else if (a->n < a->cap) {
            if (a->ng + e.ngroups > a->gcap) {
                int nc = a->gcap;
                while (a->ng + e.ngroups > nc)
                    nc *= 2;
                uint64_t *ng = realloc(a->gmask, sizeof *ng * nc);
                if (!ng) {
                    if (gm != gm_buf)
                        free(gm);
                    free(ent_of);
                    goto fail;
                }
                a->gmask = ng;
                a->gcap = nc;
            }
            e.goff = a->ng;
            memcpy(a->gmask + a->ng, gm, sizeof *gm * (size_t)e.ngroups);
            a->ng += e.ngroups;
            ent_of[p->pt[t].klass] = a->n;
            a->slot[s] = a->n;
            a->ent[a->n++] = e;
        } else {
            if (gm != gm_buf)
                free(gm);
            free(ent_of);
            goto fail; /* more classes than the table holds: cannot happen below 2^24 tasks */
        }
        if (gm != gm_buf)
            free(gm);
    }
    free(ent_of);
    return 0;
fail:
    agg_free(a);
    return 1;
}

static double send_bound(const xm_prep_t *p, const int *bit_of, int u)
{
    int bit_host[64];
    for (int h = 0; h < p->nhosts; h++)
        if (bit_of[h] >= 0 && bit_of[h] < 64)
            bit_host[bit_of[h]] = h;
    int have_p = 0, have_np = 0;
    for (int c = 0; c < p->nklass; c++) {
        have_p |= p->pc[c].needs_nic && p->pc[c].ngroups > 1;
        have_np |= p->pc[c].needs_nic && p->pc[c].ngroups == 1;
    }
    double best = 0;
    double *w = u <= XM_LB_MAX_SUBSET_HOSTS && have_np ? subset_weights(p, bit_of, u) : NULL;
    if (!have_p && !have_np)
        return 0;
    if (w) {
        for (size_t m = 1; m < ((size_t)1 << u); m++) {
            double v = w[m] / nics_of(p, bit_host, m);
            if (v > best)
                best = v;
        }
    }
    if (u > 64 || (w && !have_p)) { /* all subsets done, or too many hosts for masks */
        free(w);
        return best;
    }
    /* Tasks aggregated by what must_leave() looks at (holder-host mask of
     * every group, receiver-host mask, a receiver outside the universe):
     * the candidate loop then costs O(candidates x distinct classes), not
     * O(candidates x tasks). */
    agg_t a;
    if (agg_build(p, bit_of, w != NULL, &a)) {
        free(w);
        return best;
    }
    int ncand = 0, cap = u + 66;
    uint64_t *cand = malloc(sizeof *cand * cap);
    if (!cand) {
        agg_free(&a);
        free(w);
        return best;
    }
    for (int b = 0; b < u; b++)
        cand[ncand++] = 1ull << b;
    cand[ncand++] = u == 64 ? ~0ull : (1ull << u) - 1;
    for (int e = 0; e < a.n && ncand < cap; e++) {
        for (int g = 0; g < a.ent[e].ngroups && ncand < cap; g++) {
            uint64_t m = a.gmask[a.ent[e].goff + g];
            int dup = 0;
            for (int i = 0; i < ncand && !dup; i++)
                dup = cand[i] == m;
            if (!dup)
                cand[ncand++] = m;
        }
    }
    for (int i = 0; i < ncand; i++) {
        double sum = w ? w[cand[i]] : 0;
        uint64_t S = cand[i];
        for (int e = 0; e < a.n; e++) {
            const agg_ent_t *x = &a.ent[e];
            if (!x->rout && !(x->rmask & ~S))
                continue;
            for (int g = 0; g < x->ngroups; g++)
                if (!(a.gmask[x->goff + g] & ~S)) {
                    sum += x->w;
                    break;
                }
        }
        double v = sum / nics_of(p, bit_host, cand[i]);
        if (v > best)
            best = v;
    }
    free(cand);
    agg_free(&a);
    free(w);
    return best;
}

double xm_lower_bound_prep(const xm_prep_t *p)
{
    const xm_taskset_t *ts = p->ts;
    const xm_cluster_t *c = p->c;
    double lb = 0, maxbw = c->intra_Bps > hop_bw(c) ? c->intra_Bps : hop_bw(c);
    double *rin = calloc(p->nhosts + 1, sizeof *rin);
    int *bit_of = malloc(sizeof(int) * (p->nhosts + 1)), *rh_off = NULL, *rh = NULL;
    if (!rin || !bit_of)
        goto out_free;
    int u = 0;
    for (int h = 0; h < p->nhosts; h++)
        bit_of[h] = -1;
    /* (T), the receive hosts of (R) and the holder hosts of (S) per class
     * (the tasks of a class have the same bytes, hosts and bounds; classes
     * are numbered by first appearance, so the bits of (S) come in the
     * order the tasks give them); the sums of (R) per task, in task order. */
    int nk = p->nklass;
    int64_t nrh = 0;
    for (int kc = 0; kc < nk; kc++)
        nrh += ts->tasks[p->pc[kc].rep].nrecv;
    rh_off = malloc(sizeof(int) * ((size_t)nk + 1));
    rh = malloc(sizeof(int) * (nrh + 1));
    if (!rh_off || !rh)
        goto out_free;
    int m = 0;
    for (int kc = 0; kc < nk; kc++) {
        const xm_prep_class_t *pc = &p->pc[kc];
        const xm_task_t *k = &ts->tasks[pc->rep];
        /* (T) */
        if (k->nrecv > 0) {
            double v = c->latency_s + (double)k->bytes / maxbw;
            if (pc->lb_dur > v)
                v = pc->lb_dur;
            if (v > lb)
                lb = v;
        }
        /* (R): a receiver host not holding the full value of a task takes
         * it in through one of its NICs; that NIC direction is busy for the
         * task's hop into it, at least nic_cost (not the task's duration:
         * consecutive chains overlap their fills on a NIC). */
        rh_off[kc] = m;
        for (int i = 0; i < k->nrecv; i++) {
            int h = p->dev_host[ts->recvs[k->recv_off + i]];
            if (i > 0 && p->dev_host[ts->recvs[k->recv_off + i - 1]] == h)
                continue;
            if (!p->recv_covered[pc->recv_off + i])
                rh[m++] = h;
        }
        /* (S): bit per holder host of a NIC-needing task */
        if (!pc->needs_nic)
            continue;
        for (int i = 0; i < k->ngroups * k->group_size; i++) {
            int h = p->dev_host[ts->holders[k->holder_off + i]];
            if (bit_of[h] < 0)
                bit_of[h] = u++;
        }
    }
    rh_off[nk] = m;
    for (int t = 0; t < ts->ntasks; t++) {
        int kc = p->pt[t].klass;
        double d = p->pc[kc].nic_cost;
        for (int i = rh_off[kc]; i < rh_off[kc + 1]; i++)
            rin[rh[i]] += d;
    }
    for (int h = 0; h < p->nhosts; h++)
        if (p->host_nics[h] > 0 && rin[h] / p->host_nics[h] > lb)
            lb = rin[h] / p->host_nics[h];
    double sb = send_bound(p, bit_of, u);
    if (sb > lb)
        lb = sb;
out_free:
    free(rin);
    free(bit_of);
    free(rh_off);
    free(rh);
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
