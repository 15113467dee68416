/*
 * Routes of a unit task and the list-scheduling step (paper 002, sections
 * 3.1 "broadcast based resharding" and 3.2 eq. 1-3).
 *
 * One function, xm_step(), turns a decision for one task into routes and a
 * time slot; schedulers, xm_schedule_from() and tests all go through it, so
 * a plan scored during search is exactly the plan executed and simulated.
 * Route shapes are documented in xm_sched.h.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "xm_sched_impl.h"

/* ------------------------------------------------------------ prep */

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return x < y ? -1 : x > y;
}

static int group_has_host(const xm_prep_t *p, const xm_task_t *t, int g, int h)
{
    const int *hd = p->ts->holders + t->holder_off + g * t->group_size;
    for (int j = 0; j < t->group_size; j++)
        if (p->dev_host[hd[j]] == h)
            return 1;
    return 0;
}

static double hop_bw(const xm_cluster_t *c)
{
    return c->nic_send_Bps < c->nic_recv_Bps ? c->nic_send_Bps : c->nic_recv_Bps;
}

/* Interchangeable tasks: equal bytes, group shape and NIC of every holder
 * and receiver (in order) give equal timings under any state, because the
 * device choices below break ties by NIC before device identity. With one
 * NIC per host the NIC is the host. */
/* One word into a signature (multiply-xorshift; class_same() confirms
 * every hash match, so this only needs to spread). */
static inline uint64_t sig_mix(uint64_t h, uint64_t v)
{
    h = (h ^ v) * 0x9e3779b97f4a7c15ull;
    return h ^ (h >> 29);
}

/* What the class of one task is made of: the NIC of every holder and
 * receiver and whether each receiver holds the box (scratch of the
 * per-task pass, sized for the largest task). */
typedef struct {
    int *hnic, *rnic;
    unsigned char *rhold;
} facts_t;

static void task_facts(const xm_prep_t *p, int t, facts_t *f)
{
    const xm_task_t *k = &p->ts->tasks[t];
    const int *hd = p->ts->holders + k->holder_off, *rv = p->ts->recvs + k->recv_off;
    int nh = k->ngroups * k->group_size;
    for (int i = 0; i < nh; i++)
        f->hnic[i] = p->dev_nic[hd[i]];
    for (int i = 0; i < k->nrecv; i++) {
        int d = rv[i], is_h = 0;
        f->rnic[i] = p->dev_nic[d];
        for (int j = 0; j < nh && !is_h; j++)
            is_h = hd[j] == d;
        f->rhold[i] = (unsigned char)is_h;
    }
}

static uint64_t task_sig(const xm_task_t *k, const facts_t *f)
{
    uint64_t h = XM_HASH_INIT;
    h = sig_mix(h, (uint64_t)k->bytes);
    h = sig_mix(h, (uint64_t)(uint32_t)k->ngroups << 32 | (uint32_t)k->group_size);
    h = sig_mix(h, (uint64_t)(uint32_t)k->nrecv);
    for (int i = 0; i < k->ngroups * k->group_size; i++)
        h = sig_mix(h, (uint64_t)(uint32_t)f->hnic[i]);
    for (int i = 0; i < k->nrecv; i++)
        h = sig_mix(h, (uint64_t)(uint32_t)f->rnic[i] << 1 | f->rhold[i]);
    return h;
}

/* Whether task t (facts f) belongs to class c. */
static int class_same(const xm_prep_t *p, int c, int t, const facts_t *f)
{
    const xm_prep_class_t *pc = &p->pc[c];
    const xm_task_t *x = &p->ts->tasks[pc->rep], *y = &p->ts->tasks[t];
    if (x->bytes != y->bytes || x->ngroups != y->ngroups || x->group_size != y->group_size ||
        x->nrecv != y->nrecv)
        return 0;
    for (int i = 0; i < x->ngroups * x->group_size; i++)
        if (p->dev_nic[p->ts->holders[x->holder_off + i]] != f->hnic[i])
            return 0;
    for (int i = 0; i < x->nrecv; i++) {
        if (p->dev_nic[p->ts->recvs[x->recv_off + i]] != f->rnic[i])
            return 0;
        if (p->recv_is_holder[pc->recv_off + i] != f->rhold[i])
            return 0;
    }
    return 1;
}

/* A hop between rails takes the rail of one of its ends that is usable
 * (nic_ok) on both hosts (xm_route_rails). Where neither is, for two
 * devices of one task on different hosts and rails, the first device's rail
 * becomes usable on the second's host, so that every hop stays on usable
 * NICs (the lower bound counts only those, docs/LOWER_BOUND.md). */
static int rails_usable(xm_prep_t *p)
{
    const xm_taskset_t *ts = p->ts;
    int K = p->nics;
    /* per task: its hosts and, per host, the rails of its devices there */
    int *hs = malloc(sizeof(int) * (p->nhosts + 1));
    uint64_t *rm = calloc(p->nhosts + 1, sizeof *rm);
    if (!hs || !rm) {
        free(hs);
        free(rm);
        return -1;
    }
    for (int c = 0; c < p->nklass; c++) {
        const xm_task_t *k = &ts->tasks[p->pc[c].rep];
        int nh = k->ngroups * k->group_size, n = nh + k->nrecv, nhs = 0;
        for (int i = 0; i < n; i++) {
            int a = i < nh ? ts->holders[k->holder_off + i] : ts->recvs[k->recv_off + i - nh];
            int h = p->dev_host[a];
            if (!rm[h])
                hs[nhs++] = h;
            rm[h] |= 1ull << (p->dev_nic[a] % K % 64);
        }
        for (int i = 0; i < nhs; i++)
            for (int j = 0; j < nhs; j++)
                for (int ra = 0; i != j && ra < K && ra < 64; ra++)
                    for (int rb = 0; (rm[hs[i]] >> ra & 1) && rb < K && rb < 64; rb++) {
                        int ha = hs[i], hb = hs[j];
                        if (rb != ra && (rm[hb] >> rb & 1) && !p->nic_ok[hb * K + ra] &&
                            !p->nic_ok[ha * K + rb])
                            p->nic_ok[hb * K + ra] = 1;
                    }
        for (int i = 0; i < nhs; i++)
            rm[hs[i]] = 0;
    }
    free(hs);
    free(rm);
    return 0;
}

typedef struct {
    uint64_t sig;
    int c;
} sig_t;

/* Classes numbered by first appearance, found through a hash table of
 * classes: tasks are read in index order and each is compared with one
 * class representative, so this is linear and cache friendly (sorting
 * the signatures and comparing neighbours was not). Class numbers do not
 * change any plan: the DFS orders children by a total order over tasks. */
/* Open-addressing table of classes. It grows with the number of classes,
 * not of tasks, so that it stays in cache when many tasks share few
 * classes (262,144 tasks in 4,096 classes at 1,024 devices). */
typedef struct {
    sig_t *slot;
    size_t cap, used;
} classes_t;

static void classes_put(classes_t *c, uint64_t h, int k)
{
    size_t s = (size_t)h & (c->cap - 1);
    while (c->slot[s].c >= 0)
        s = (s + 1) & (c->cap - 1);
    c->slot[s] = (sig_t){h, k};
    c->used++;
}

static int classes_grow(classes_t *c, size_t cap)
{
    sig_t *old = c->slot;
    size_t ocap = c->cap;
    c->slot = malloc(sizeof *c->slot * cap);
    if (!c->slot) {
        c->slot = old;
        return -1;
    }
    c->cap = cap;
    c->used = 0;
    for (size_t i = 0; i < cap; i++)
        c->slot[i].c = -1;
    for (size_t i = 0; old && i < ocap; i++)
        if (old[i].c >= 0)
            classes_put(c, old[i].sig, old[i].c);
    free(old);
    return 0;
}

/* Class of task t (facts f), or -1 when it starts a new one; *h gets its
 * signature and *slot where a new class goes. */
static int class_find(const xm_prep_t *p, const classes_t *c, int t, const facts_t *f, uint64_t *h,
                      size_t *slot)
{
    *h = task_sig(&p->ts->tasks[t], f);
    size_t s = (size_t)*h & (c->cap - 1);
    while (c->slot[s].c >= 0) {
        if (c->slot[s].sig == *h && class_same(p, c->slot[s].c, t, f))
            return c->slot[s].c;
        s = (s + 1) & (c->cap - 1);
    }
    *slot = s;
    return -1;
}
/* Fewest distinct hosts a P chain must visit: the receiver hosts in
 * rh[0..nrh) plus, for the groups with no holder there, at least one more
 * host; when all those groups sit on single hosts, each such host. */
static int p_min_hosts(const xm_prep_t *q, const xm_task_t *k, const int *rh, int nrh)
{
    const int *hd = q->ts->holders + k->holder_off;
    int extra_hosts[64], nextra = 0, multi = 0;
    for (int g = 0; g < k->ngroups; g++) {
        int inside = 0, h0 = q->dev_host[hd[g * k->group_size]], single = 1;
        for (int j = 0; j < k->group_size; j++) {
            int h = q->dev_host[hd[g * k->group_size + j]];
            single &= h == h0;
            for (int i = 0; i < nrh && !inside; i++)
                inside = rh[i] == h;
        }
        if (inside)
            continue;
        if (!single || nextra == 64) {
            multi = 1;
            continue;
        }
        int seen = 0;
        for (int i = 0; i < nextra && !seen; i++)
            seen = extra_hosts[i] == h0;
        if (!seen)
            extra_hosts[nextra++] = h0;
    }
    return nrh + (nextra > 0 ? nextra : multi);
}

/* Shortest possible duration of a P task with any holders as senders. Its
 * chain has at least G - 1 hops between the sources plus one per receiver
 * (broadcast) or G hops per route (sendrecv), and visits at least
 * p_min_hosts() hosts, so it has that many minus one inter-host hops. Every
 * hop pays the latency and one chunk (c / NIC bw when inter-host), and an
 * inter-host hop paces the remaining K - 1 chunks. */
static double p_chain_bound(const xm_prep_t *q, int t)
{
    const xm_task_t *k = &q->ts->tasks[t];
    const xm_cluster_t *c = q->c;
    int64_t C = c->chunk_bytes > 0 ? c->chunk_bytes : (int64_t)1 << 20;
    int64_t K = (k->bytes + C - 1) / C;
    if (K < 1)
        K = 1;
    double B = (double)k->bytes, ch = B / (double)K, inter = hop_bw(c);
    double maxbw = c->intra_Bps > inter ? c->intra_Bps : inter;
    int rh_buf[64], nrh = 0;
    int *rh = k->nrecv <= 64 ? rh_buf : malloc(sizeof(int) * k->nrecv);
    if (!rh)
        return xm_pc(q, t)->needs_nic ? xm_pc(q, t)->nic_cost : 0;
    for (int i = 0; i < k->nrecv; i++) {
        int h = q->dev_host[q->ts->recvs[k->recv_off + i]];
        if (nrh == 0 || rh[nrh - 1] != h)
            rh[nrh++] = h;
    }
    double best = 0;
    int sendrecv = q->strategy == XMESH_STRATEGY_SENDRECV;
    /* broadcast: one chain over all receiver hosts; sendrecv: the slowest of
     * the per-receiver routes, each over one receiver host */
    for (int i = 0; i < (sendrecv ? nrh : 1); i++) {
        int hops = sendrecv ? k->ngroups : k->ngroups - 1 + k->nrecv;
        int inter_min = (sendrecv ? p_min_hosts(q, k, rh + i, 1) : p_min_hosts(q, k, rh, nrh)) - 1;
        if (hops < 1)
            hops = 1;
        if (inter_min > hops)
            inter_min = hops;
        double v = hops * c->latency_s + (hops - inter_min) * ch / maxbw;
        if (inter_min > 0) {
            v += (inter_min + K - 1) * ch / inter;
            /* The first hop may be inside a host: its window of a0 chunks
             * (send_ahead) goes at intra speed and only K - a0 chunks are
             * paced by the slowest hop, so the chain can be up to
             * (a0 - 1) (c / inter - c / intra) shorter than above. */
            if (hops > inter_min) {
                int64_t a0 = xm_hop_fill_inline(c, K, 0, 0);
                double w = hops * c->latency_s + (hops - inter_min - 1 + a0) * ch / maxbw +
                           (inter_min + K - a0) * ch / inter;
                if (w < v)
                    v = w;
            }
        } else {
            v += (K - 1) * ch / maxbw;
        }
        if (v > best)
            best = v;
    }
    if (rh != rh_buf)
        free(rh);
    const xm_prep_class_t *pc = xm_pc(q, t);
    return pc->needs_nic && best < pc->nic_cost ? pc->nic_cost : best;
}

/* Makes int array *a (capacity *cap, doubling from 1024) hold need. */
static int grow_ints(int **a, int *cap, int need)
{
    if (*a && need <= *cap)
        return 0;
    int nc = *cap ? *cap : 1024;
    while (nc < need)
        nc *= 2;
    int *nr = realloc(*a, sizeof(int) * nc);
    if (!nr)
        return -1;
    *a = nr;
    *cap = nc;
    return 0;
}

/* Appends the host-level directions of the routes in tr as option o's
 * resources (options are visited in order, so offsets grow). */
static int add_res(xm_prep_t *q, const xm_troutes_t *tr, int o)
{
    int base = q->opt_res_off[o], m = base;
    if (grow_ints(&q->opt_res, &q->opt_res_cap, base + tr->nuse + 1))
        return -1;
    if (!q->opt_res_t0 || q->opt_rest_cap < q->opt_res_cap) {
        double *a = realloc(q->opt_res_t0, sizeof(double) * q->opt_res_cap);
        if (!a)
            return -1;
        q->opt_res_t0 = a;
        a = realloc(q->opt_res_t1, sizeof(double) * q->opt_res_cap);
        if (!a)
            return -1;
        q->opt_res_t1 = a;
        q->opt_rest_cap = q->opt_res_cap;
    }
    for (int i = 0; i < tr->nuse; i++) {
        int d = (tr->use_dir[i] / 2 / q->nics) * 2 + (tr->use_dir[i] & 1), dup = -1;
        for (int j = base; j < m && dup < 0; j++)
            if (q->opt_res[j] == d)
                dup = j;
        if (dup < 0) {
            q->opt_res_t0[m] = tr->use_off[i];
            q->opt_res_t1[m] = tr->use_end[i];
            q->opt_res[m++] = d;
        } else {
            if (tr->use_off[i] < q->opt_res_t0[dup])
                q->opt_res_t0[dup] = tr->use_off[i];
            if (tr->use_end[i] > q->opt_res_t1[dup])
                q->opt_res_t1[dup] = tr->use_end[i];
        }
    }
    q->opt_res_off[o + 1] = m;
    if (q->nics > 1) {
        base = q->opt_nres_off[o];
        if (grow_ints(&q->opt_nres, &q->opt_nres_cap, base + tr->nuse + 1))
            return -1;
        memcpy(q->opt_nres + base, tr->use_dir, sizeof(int) * tr->nuse);
        q->opt_nres_off[o + 1] = base + tr->nuse;
    }
    return 0;
}

xmesh_result_t xm_prep_init(xm_prep_t *p, const xm_taskset_t *ts, const xm_cluster_t *c,
                            xmesh_strategy_t strategy)
{
    xm_prep_t q;
    memset(&q, 0, sizeof q);
    q.ts = ts;
    q.c = c;
    q.strategy =
        strategy == XMESH_STRATEGY_SENDRECV ? XMESH_STRATEGY_SENDRECV : XMESH_STRATEGY_BROADCAST;
    q.nhosts = c->hosts.nhosts;
    q.nics = c->nics_per_host > 0 ? c->nics_per_host : 1;
    q.nnics = q.nhosts * q.nics;
    q.ndev = c->hosts.ndev;
    q.dev_host = c->hosts.host_of;
    int n = ts->ntasks, max_nh = 1, max_nrecv = 1;
    int64_t nopt_total = 0, nrecv_sum = 0;
    for (int t = 0; t < n; t++) {
        const xm_task_t *k = &ts->tasks[t];
        int nh = k->ngroups * k->group_size;
        nopt_total += nh;
        nrecv_sum += k->nrecv;
        if (nh > max_nh)
            max_nh = nh;
        if (k->nrecv > max_nrecv)
            max_nrecv = k->nrecv;
        if (k->ngroups > q.max_groups)
            q.max_groups = k->ngroups;
        for (int i = 0; i < nh; i++)
            if (ts->holders[k->holder_off + i] < 0 || ts->holders[k->holder_off + i] >= q.ndev)
                return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                              "scheduler: task %d holder device %d outside the cluster's %d "
                              "devices",
                              t, ts->holders[k->holder_off + i], q.ndev);
        for (int i = 0; i < k->nrecv; i++)
            if (ts->recvs[k->recv_off + i] < 0 || ts->recvs[k->recv_off + i] >= q.ndev)
                return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                              "scheduler: task %d receiver device %d outside the cluster's %d "
                              "devices",
                              t, ts->recvs[k->recv_off + i], q.ndev);
        if (nh < 1)
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "scheduler: task %d has no holder", t);
        int rd = 2 * k->nrecv + 1;
        if (k->nrecv * (k->ngroups + 1) > rd)
            rd = k->nrecv * (k->ngroups + 1);
        if (k->ngroups + k->nrecv > rd)
            rd = k->ngroups + k->nrecv;
        if (rd > q.max_route_devs)
            q.max_route_devs = rd;
        if (k->nrecv + 1 > q.max_routes)
            q.max_routes = k->nrecv + 1;
    }
    if (q.max_groups < 1)
        q.max_groups = 1;
    /* Per-class arrays are sized for the worst case (every task its own
     * class) but only the classes' part is ever written: untouched pages
     * cost nothing. Only the per-task record is written for every task. */
    q.opt_hosts = malloc(sizeof(int) * (nopt_total + 1));
    q.need_off = malloc(sizeof(int) * ((size_t)n + 2));
    q.need_hosts = malloc(sizeof(int) * (nrecv_sum + 1));
    q.pt = malloc(sizeof *q.pt * (n > 0 ? n : 1));
    q.pc = malloc(sizeof *q.pc * (n > 0 ? n : 1));
    q.dev_nic = malloc(sizeof(int) * (q.ndev + 1));
    q.nic_ok = calloc(q.nnics + 1, 1);
    q.host_nics = calloc(q.nhosts + 1, sizeof(int));
    q.recv_is_holder = malloc(nrecv_sum + 1);
    q.recv_covered = malloc(nrecv_sum + 1);
    xm_hint_huge(q.pt, sizeof *q.pt * (size_t)n);
    facts_t fx = {malloc(sizeof(int) * max_nh), malloc(sizeof(int) * max_nrecv), malloc(max_nrecv)};
    xm_state_t st;
    xm_troutes_t tr;
    xm_undo_t undo;
    memset(&st, 0, sizeof st);
    memset(&tr, 0, sizeof tr);
    memset(&undo, 0, sizeof undo);
    xmesh_result_t r = XMESH_SUCCESS;
    classes_t cls = {NULL, 0, 0};
    if (!q.nic_ok || !q.host_nics || !q.opt_hosts || !q.need_off || !q.need_hosts || !q.pt ||
        !q.pc || !q.dev_nic || !q.recv_is_holder || !q.recv_covered || !fx.hnic || !fx.rnic ||
        !fx.rhold || classes_grow(&cls, 1024)) {
        r = XM_ERR(XMESH_ERR_NO_MEMORY, "scheduler: out of memory for %d tasks", n);
        goto out_free_prep;
    }
    {
        int *cnt = calloc(q.nhosts + 1, sizeof *cnt);
        if (!cnt) {
            r = XM_ERR(XMESH_ERR_NO_MEMORY, "scheduler: out of memory");
            goto out_free_prep;
        }
        for (int d = 0; d < q.ndev; d++)
            q.dev_nic[d] = q.dev_host[d] * q.nics + (cnt[q.dev_host[d]]++) % q.nics;
        free(cnt);
    }
    /* One pass over the tasks (each touches a new cache line of the task
     * array, so passes cost more than their arithmetic): the class of each
     * task; the first task of a class also gives the class's options,
     * receiver facts, usable NICs and receiver hosts lacking a full value. */
    int off = 0, m = 0, nflags = 0;
    q.need_off[0] = 0;
    for (int t = 0; t < n; t++) {
        const xm_task_t *k = &ts->tasks[t];
        xm_prep_task_t *pt = &q.pt[t];
        task_facts(&q, t, &fx);
        uint64_t sig = 0;
        size_t slot = 0;
        /* neighbours often share a class (receivers on one host): try the
         * previous task's first, before hashing */
        int kc = t > 0 && class_same(&q, q.pt[t - 1].klass, t, &fx)
                     ? q.pt[t - 1].klass
                     : class_find(&q, &cls, t, &fx, &sig, &slot);
        if (kc >= 0) {
            *pt = q.pt[q.pc[kc].rep];
            q.pc[kc].ntasks++;
            continue;
        }
        /* a new class */
        kc = q.nklass++;
        if (2 * (cls.used + 1) > cls.cap) {
            if (classes_grow(&cls, 2 * cls.cap)) {
                r = XM_ERR(XMESH_ERR_NO_MEMORY, "scheduler: out of memory for task classes");
                goto out_free_prep;
            }
            classes_put(&cls, sig, kc);
        } else {
            cls.slot[slot] = (sig_t){sig, kc};
            cls.used++;
        }
        const int *hd = ts->holders + k->holder_off;
        int nh = k->ngroups * k->group_size;
        xm_prep_class_t *pc = &q.pc[kc];
        pc->rep = t;
        pc->ngroups = k->ngroups;
        pc->ntasks = 1;
        pc->recv_off = nflags;
        pc->needs_nic = 0;
        pt->klass = kc;
        pt->opt_off = off;
        for (int i = 0; i < nh; i++) {
            q.opt_hosts[off + i] = q.dev_host[hd[i]];
            q.nic_ok[fx.hnic[i]] = 1;
        }
        if (nh > 16) {
            qsort(q.opt_hosts + off, nh, sizeof(int), cmp_int);
        } else { /* few holders (the usual case): insertion sort, no calls */
            int *a = q.opt_hosts + off;
            for (int i = 1; i < nh; i++) {
                int v = a[i], j = i;
                for (; j > 0 && a[j - 1] > v; j--)
                    a[j] = a[j - 1];
                a[j] = v;
            }
        }
        int u = 0;
        for (int i = 0; i < nh; i++)
            if (u == 0 || q.opt_hosts[off + i] != q.opt_hosts[off + u - 1])
                q.opt_hosts[off + u++] = q.opt_hosts[off + i];
        pt->nopt = u;
        off += u;
        pc->naive_host = q.dev_host[hd[0]];
        for (int i = 0; i < k->nrecv; i++) {
            int h = q.dev_host[ts->recvs[k->recv_off + i]];
            q.nic_ok[fx.rnic[i]] = 1;
            q.recv_is_holder[nflags + i] = fx.rhold[i];
            int cov = 1;
            for (int g = 0; g < k->ngroups && cov; g++)
                cov = group_has_host(&q, k, g, h);
            q.recv_covered[nflags + i] = (unsigned char)cov;
            if (!cov) {
                pc->needs_nic = 1;
                if (m == q.need_off[kc] || q.need_hosts[m - 1] != h)
                    q.need_hosts[m++] = h;
            }
        }
        nflags += k->nrecv;
        q.need_off[kc + 1] = m;
        pc->nic_cost = (double)k->bytes / hop_bw(c) + c->latency_s;
    }
    free(cls.slot);
    cls.slot = NULL;
    if (q.nics > 1 && rails_usable(&q)) {
        r = XM_ERR(XMESH_ERR_NO_MEMORY, "scheduler: out of memory");
        goto out_free_prep;
    }
    for (int i = 0; i < q.nnics; i++)
        q.host_nics[i / q.nics] += q.nic_ok[i];
    q.opt_dur = malloc(sizeof(double) * ((size_t)off + 1));
    q.opt_rdur = malloc(sizeof(double) * ((size_t)off + 1));
    q.opt_nroutes = malloc(sizeof(int) * ((size_t)off + 1));
    q.opt_ndevs = malloc(sizeof(int) * ((size_t)off + 1));
    q.opt_res_off = calloc((size_t)off + 2, sizeof(int));
    /* per-NIC directions only matter with several NICs per host */
    q.opt_nres_off = calloc(q.nics > 1 ? (size_t)off + 2 : 2, sizeof(int));
    if (!q.opt_dur || !q.opt_rdur || !q.opt_nroutes || !q.opt_ndevs || !q.opt_res_off ||
        !q.opt_nres_off) {
        r = XM_ERR(XMESH_ERR_NO_MEMORY, "scheduler: out of memory for %d tasks", n);
        goto out_free_prep;
    }
    if ((r = xm_state_init(&st, &q)) || (r = xm_troutes_init(&tr, &q)))
        goto out_free_prep;
    xm_state_reset(&st, &q);
    /* Duration of every option of every class on an idle cluster, routed
     * with the class's first task; the DFS bound uses the
     * device-independent part (route times) via min_dur. */
    for (int kc = 0; kc < q.nklass; kc++) {
        xm_prep_class_t *pc = &q.pc[kc];
        int t = pc->rep;
        const xm_prep_task_t *pt = &q.pt[t];
        double best = INFINITY;
        for (int o = 0; o < pt->nopt; o++) {
            /* idle cluster: step, then take the step back (a full reset per
             * option would cost O(devices) and make this quadratic) */
            xm_step(&q, &st, t, q.opt_hosts[pt->opt_off + o], NULL, &tr, &undo);
            xm_undo_to(&undo, 0);
            q.opt_dur[pt->opt_off + o] = tr.dur;
            q.opt_rdur[pt->opt_off + o] = tr.route_dur;
            q.opt_nroutes[pt->opt_off + o] = tr.nroutes;
            q.opt_ndevs[pt->opt_off + o] = tr.ndevs;
            if (add_res(&q, &tr, pt->opt_off + o)) {
                r = XM_ERR(XMESH_ERR_NO_MEMORY, "scheduler: out of memory");
                goto out_free_prep;
            }
            /* With one NIC per host the whole duration is fixed by the host
             * choice; with several, NIC sharing inside the task depends on
             * the devices, but the route times do not. */
            double d = q.nics == 1 ? tr.dur : tr.route_dur;
            if (pc->needs_nic && d < pc->nic_cost)
                d = pc->nic_cost;
            if (d < best)
                best = d;
        }
        pc->min_dur = isfinite(best) ? best : 0;
        /* Any holder as sender: without P its host is an option, so min_dur
         * holds; a P chain of arbitrary holders is only bounded by one hop. */
        pc->lb_dur = ts->tasks[t].ngroups == 1 ? pc->min_dur : p_chain_bound(&q, t);
    }
    q.opt_timed = q.nics == 1;
    xm_state_free(&st);
    xm_troutes_free(&tr);
    xm_undo_free(&undo);
    free(fx.hnic);
    free(fx.rnic);
    free(fx.rhold);
    *p = q;
    return XMESH_SUCCESS;
out_free_prep:
    free(fx.hnic);
    free(fx.rnic);
    free(fx.rhold);
    free(cls.slot);
    xm_undo_free(&undo);
    xm_state_free(&st);
    xm_troutes_free(&tr);
    xm_prep_free(&q);
    return r;
}

void xm_prep_free(xm_prep_t *p)
{
    if (!p)
        return;
    free(p->opt_hosts);
    free(p->opt_dur);
    free(p->opt_rdur);
    free(p->opt_nroutes);
    free(p->opt_ndevs);
    free(p->opt_res_off);
    free(p->opt_res);
    free(p->opt_res_t0);
    free(p->opt_res_t1);
    free(p->opt_nres_off);
    free(p->opt_nres);
    free(p->need_off);
    free(p->need_hosts);
    free(p->pt);
    free(p->pc);
    free(p->dev_nic);
    free(p->nic_ok);
    free(p->host_nics);
    free(p->recv_is_holder);
    free(p->recv_covered);
    memset(p, 0, sizeof *p);
}
/* ------------------------------------------------------------ state */

xmesh_result_t xm_state_init(xm_state_t *s, const xm_prep_t *p)
{
    memset(s, 0, sizeof *s);
    s->dir_free = calloc(2 * p->nnics + 1, sizeof(double));
    s->dev_load = calloc(p->ndev + 1, sizeof(double));
    if (!s->dir_free || !s->dev_load) {
        xm_state_free(s);
        return XM_ERR(XMESH_ERR_NO_MEMORY, "scheduler: out of memory for state");
    }
    return XMESH_SUCCESS;
}

void xm_state_reset(xm_state_t *s, const xm_prep_t *p)
{
    memset(s->dir_free, 0, sizeof(double) * 2 * p->nnics);
    memset(s->dev_load, 0, sizeof(double) * p->ndev);
    s->makespan = 0;
}

void xm_state_free(xm_state_t *s)
{
    if (!s)
        return;
    free(s->dir_free);
    free(s->dev_load);
    memset(s, 0, sizeof *s);
}

static void undo_record(xm_undo_t *u, double *ptr)
{
    if (u->n == u->cap) {
        int nc = u->cap ? 2 * u->cap : 256;
        double **np = realloc(u->ptr, sizeof *np * nc);
        if (np)
            u->ptr = np;
        double *no = realloc(u->old, sizeof *no * nc);
        if (no)
            u->old = no;
        if (!np || !no)
            abort(); /* out of memory in a search: nothing sensible to return */
        u->cap = nc;
    }
    u->ptr[u->n] = ptr;
    u->old[u->n++] = *ptr;
}

/* Sets *ptr = v, recording the old value when undo is on (the plan's final
 * pass runs without: keep that path a plain store). */
static inline void undo_set(xm_undo_t *u, double *ptr, double v)
{
    if (u)
        undo_record(u, ptr);
    *ptr = v;
}

void xm_undo_to(xm_undo_t *u, int mark)
{
    while (u->n > mark) {
        u->n--;
        *u->ptr[u->n] = u->old[u->n];
    }
}

void xm_undo_free(xm_undo_t *u)
{
    if (!u)
        return;
    free(u->ptr);
    free(u->old);
    memset(u, 0, sizeof *u);
}

xmesh_result_t xm_troutes_init(xm_troutes_t *r, const xm_prep_t *p)
{
    memset(r, 0, sizeof *r);
    int nd = p->max_route_devs + 1, nr = p->max_routes + 1;
    r->routes = malloc(sizeof *r->routes * nr);
    r->devs = malloc(sizeof *r->devs * nd);
    r->rails = malloc(sizeof *r->rails * nd);
    r->senders = malloc(sizeof *r->senders * (p->max_groups + 1));
    r->use_dir = malloc(sizeof *r->use_dir * 2 * nd);
    r->use_count = malloc(sizeof *r->use_count * 2 * nd);
    r->use_off = malloc(sizeof *r->use_off * 2 * nd);
    r->use_end = malloc(sizeof *r->use_end * 2 * nd);
    if (!r->routes || !r->devs || !r->rails || !r->senders || !r->use_dir || !r->use_count ||
        !r->use_off || !r->use_end) {
        xm_troutes_free(r);
        return XM_ERR(XMESH_ERR_NO_MEMORY, "scheduler: out of memory for routes");
    }
    return XMESH_SUCCESS;
}

void xm_troutes_free(xm_troutes_t *r)
{
    if (!r)
        return;
    free(r->routes);
    free(r->devs);
    free(r->rails);
    free(r->senders);
    free(r->use_dir);
    free(r->use_count);
    free(r->use_off);
    free(r->use_end);
    memset(r, 0, sizeof *r);
}

/* ---------------------------------------------------------- routing */

/* Most NICs per host whose rails the sender choice follows (more: the
 * send NIC alone, as with one). */
#define XM_RAILS_MAX 64

/* Receiver of task k on host h whose NIC index (rail) is `rail`, -1 if
 * none (only receivers with want[i]). */
static int rail_recv(const xm_prep_t *p, const xm_task_t *k, int h, int rail,
                     const unsigned char *want)
{
    const int *rv = p->ts->recvs + k->recv_off;
    for (int i = 0; i < k->nrecv; i++)
        if (p->dev_host[rv[i]] == h && want[i] && p->dev_nic[rv[i]] % p->nics == rail)
            return i;
    return -1;
}

/* Device of `cand` on host h to use as a sender: earliest free send NIC,
 * then lowest NIC, then fewest bytes sent so far, then lowest id (the
 * least-loaded rule). With several NICs and rail_free given (per NIC
 * index: when the receive NIC of that rail on the chain's first receiving
 * host frees, < 0 where that host has no receiver on it), a NIC counts as
 * free once its rail's receive NIC there is free as well: the hop stays on
 * one rail (push_host_recvs), as the runner's NICs carry it (NIC k of a
 * host reaches NIC k of the others; cluster.sh's rails, rail-optimised
 * fabrics). */
static int pick_device(const xm_prep_t *p, const xm_state_t *s, const int *cand, int n, int h,
                       const double *rail_free)
{
    int best = -1;
    double fbest = 0;
    for (int j = 0; j < n; j++) {
        int d = cand[j];
        if (p->dev_host[d] != h)
            continue;
        double fa = s->dir_free[XM_DIR_SEND(p->dev_nic[d])];
        if (rail_free && rail_free[p->dev_nic[d] % p->nics] > fa)
            fa = rail_free[p->dev_nic[d] % p->nics];
        if (best < 0) {
            best = d;
            fbest = fa;
            continue;
        }
        double fb = fbest;
        int na = p->dev_nic[d], nb = p->dev_nic[best];
        if (fa < fb ||
            (fa == fb &&
             (na < nb || (na == nb && (s->dev_load[d] < s->dev_load[best] ||
                                       (s->dev_load[d] == s->dev_load[best] && d < best)))))) {
            best = d;
            fbest = fa;
        }
    }
    return best;
}

static int is_recv_host(const xm_prep_t *p, const xm_task_t *k, int h)
{
    const int *rv = p->ts->recvs + k->recv_off;
    for (int i = 0; i < k->nrecv; i++)
        if (p->dev_host[rv[i]] == h)
            return 1;
    return 0;
}

/* Sender of every group: on `host` when the group has a holder there; a
 * group without one uses a host an earlier group already uses, else a
 * receiver host, else its lowest holder's host (fewest host hops). */
static void choose_senders(const xm_prep_t *p, const xm_state_t *s, int t, int host, int *snd)
{
    const xm_task_t *k = &p->ts->tasks[t];
    for (int g = 0; g < k->ngroups; g++) {
        const int *hd = p->ts->holders + k->holder_off + g * k->group_size;
        int h = -1;
        if (host >= 0 && group_has_host(p, k, g, host))
            h = host;
        for (int e = 0; e < g && h < 0; e++)
            if (group_has_host(p, k, g, p->dev_host[snd[e]]))
                h = p->dev_host[snd[e]];
        for (int j = 0; j < k->group_size && h < 0; j++)
            if (is_recv_host(p, k, p->dev_host[hd[j]]))
                h = p->dev_host[hd[j]];
        if (h < 0)
            h = p->dev_host[hd[0]];
        /* one group, broadcast: the main chain's first host after the
         * sender's own (the first uncovered receiver elsewhere), unless the
         * sender's host has receivers (then one of them leaves the host) */
        double rail_free[XM_RAILS_MAX];
        int rh = -1;
        if (p->nics > 1 && p->nics <= XM_RAILS_MAX && k->ngroups == 1 &&
            p->strategy != XMESH_STRATEGY_SENDRECV && !is_recv_host(p, k, h)) {
            const unsigned char *cov = p->recv_covered + xm_pc(p, t)->recv_off;
            const int *rv = p->ts->recvs + k->recv_off;
            for (int i = 0; i < k->nrecv; i++) {
                int hr = p->dev_host[rv[i]];
                if (cov[i] || hr == h || (rh >= 0 && hr != rh))
                    continue;
                if (rh < 0) {
                    rh = hr;
                    for (int q = 0; q < p->nics; q++)
                        rail_free[q] = -1;
                }
                int n = p->dev_nic[rv[i]];
                rail_free[n % p->nics] = s->dir_free[XM_DIR_RECV(n)];
            }
        }
        snd[g] = pick_device(p, s, hd, k->group_size, h, rh >= 0 ? rail_free : NULL);
    }
}

static void route_begin(xm_troutes_t *r, int t, int nsrc)
{
    xm_route_t *q = &r->routes[r->nroutes++];
    q->task = t;
    q->nsrc = nsrc;
    q->len = 0;
    q->off = r->ndevs;
}

static void route_push(xm_troutes_t *r, int dev)
{
    r->devs[r->ndevs++] = dev;
    r->routes[r->nroutes - 1].len++;
}

/* Pushes the receivers of host h (those with flag want[i]). With several
 * NICs the chain enters the host through the receiver whose receive NIC
 * frees first and leaves it from the one whose send NIC frees first
 * (preferring the entry NIC, which keeps the host's other NICs free for
 * other tasks); the rest follow in device order. */
static void push_host_recvs(const xm_prep_t *p, const xm_state_t *s, xm_troutes_t *r,
                            const xm_task_t *k, int h, const unsigned char *want, int choose)
{
    const int *rv = p->ts->recvs + k->recv_off;
    int first = -1, last = -1, cnt = 0;
    for (int i = 0; i < k->nrecv; i++) {
        if (p->dev_host[rv[i]] != h || !want[i])
            continue;
        cnt++;
        if (first < 0 || (choose && s->dir_free[XM_DIR_RECV(p->dev_nic[rv[i]])] <
                                        s->dir_free[XM_DIR_RECV(p->dev_nic[rv[first]])]))
            first = i;
    }
    if (first < 0)
        return;
    /* A chain arriving from another host enters through a receiver on the
     * rail (NIC index) it left from, where the host has one: NIC k of a
     * host reaches NIC k of the others (cluster.sh's rails, where a socket
     * between rails leaves by the route of the peer's subnet, not by the
     * NIC charged here; rail-optimised fabrics alike). */
    const xm_route_t *cur = r->nroutes > 0 ? &r->routes[r->nroutes - 1] : NULL;
    if (choose && cur && cur->len > 0) {
        int up = r->devs[cur->off + cur->len - 1];
        if (p->dev_host[up] != h) {
            int i = rail_recv(p, k, h, p->dev_nic[up] % p->nics, want);
            if (i >= 0)
                first = i;
        }
    }
    if (choose && cnt > 2) {
        int fn = p->dev_nic[rv[first]];
        for (int i = 0; i < k->nrecv; i++) {
            if (p->dev_host[rv[i]] != h || !want[i] || i == first)
                continue;
            if (last < 0) {
                last = i;
                continue;
            }
            double fa = s->dir_free[XM_DIR_SEND(p->dev_nic[rv[i]])];
            double fb = s->dir_free[XM_DIR_SEND(p->dev_nic[rv[last]])];
            if (fa < fb || (fa == fb && p->dev_nic[rv[i]] == fn && p->dev_nic[rv[last]] != fn))
                last = i;
        }
    }
    route_push(r, rv[first]);
    for (int i = 0; i < k->nrecv; i++)
        if (i != first && i != last && p->dev_host[rv[i]] == h && want[i])
            route_push(r, rv[i]);
    if (last >= 0)
        route_push(r, rv[last]);
}

typedef struct {
    int host, dev;
} hd_t;

/* Orders the sources of a P chain: hosts kept contiguous, ascending, except
 * that the last host is one that also has receivers (the final sum then
 * leaves no host it does not have to). Returns that last host or -1. */
static int order_sources(const xm_prep_t *p, const xm_task_t *k, const int *snd, int *out)
{
    int G = k->ngroups, last = -1;
    for (int g = 0; g < G; g++) {
        int h = p->dev_host[snd[g]];
        if (is_recv_host(p, k, h) && (last < 0 || h < last))
            last = h;
    }
    hd_t v[64];
    hd_t *w = G <= 64 ? v : malloc(sizeof *w * G);
    if (!w)
        abort();
    for (int g = 0; g < G; g++) {
        int h = p->dev_host[snd[g]];
        w[g] = (hd_t){h == last ? p->nhosts : h, snd[g]};
    }
    /* insertion sort: G is small */
    for (int i = 1; i < G; i++) {
        hd_t x = w[i];
        int j = i - 1;
        while (j >= 0 && (w[j].host > x.host || (w[j].host == x.host && w[j].dev > x.dev))) {
            w[j + 1] = w[j];
            j--;
        }
        w[j + 1] = x;
    }
    for (int g = 0; g < G; g++)
        out[g] = w[g].dev;
    if (w != v)
        free(w);
    return last;
}

/* Builds the routes of task t for senders snd[] (see xm_sched.h). */
static void build_routes(const xm_prep_t *p, const xm_state_t *s, int t, const int *snd,
                         xm_troutes_t *r)
{
    const xm_task_t *k = &p->ts->tasks[t];
    const int *rv = p->ts->recvs + k->recv_off;
    const unsigned char *isholder = p->recv_is_holder + xm_pc(p, t)->recv_off;
    const unsigned char *covered = p->recv_covered + xm_pc(p, t)->recv_off;
    int entry = p->nics > 1;
    r->nroutes = 0;
    r->ndevs = 0;
    if (k->nrecv == 0)
        return;
    if (k->ngroups > 1) {
        int srcs_buf[64];
        int *srcs = k->ngroups <= 64 ? srcs_buf : malloc(sizeof(int) * k->ngroups);
        if (!srcs)
            abort();
        int last = order_sources(p, k, snd, srcs);
        if (p->strategy == XMESH_STRATEGY_SENDRECV) {
            for (int i = 0; i < k->nrecv; i++) {
                route_begin(r, t, k->ngroups);
                for (int g = 0; g < k->ngroups; g++)
                    route_push(r, srcs[g]);
                route_push(r, rv[i]);
            }
        } else {
            unsigned char all_buf[256];
            unsigned char *all = k->nrecv <= 256 ? all_buf : malloc(k->nrecv);
            if (!all)
                abort();
            memset(all, 1, k->nrecv);
            route_begin(r, t, k->ngroups);
            for (int g = 0; g < k->ngroups; g++)
                route_push(r, srcs[g]);
            if (last >= 0)
                push_host_recvs(p, s, r, k, last, all, entry);
            for (int i = 0; i < k->nrecv; i++) {
                int h = p->dev_host[rv[i]];
                if (h != last && (i == 0 || p->dev_host[rv[i - 1]] != h))
                    push_host_recvs(p, s, r, k, h, all, entry);
            }
            if (all != all_buf)
                free(all);
        }
        if (srcs != srcs_buf)
            free(srcs);
        return;
    }
    int sdev = snd[0], hs = p->dev_host[sdev];
    if (p->strategy == XMESH_STRATEGY_SENDRECV) {
        for (int i = 0; i < k->nrecv; i++) {
            route_begin(r, t, 1);
            if (!isholder[i])
                route_push(r, sdev);
            route_push(r, rv[i]);
        }
        return;
    }
    /* Broadcast: self copies, intra-host chains on other holder hosts, one
     * main chain from the sender through everything else. */
    unsigned char main_buf[256];
    unsigned char *in_main = k->nrecv <= 256 ? main_buf : malloc(k->nrecv);
    if (!in_main)
        abort();
    int nmain = 0;
    for (int i = 0; i < k->nrecv; i++) {
        int h = p->dev_host[rv[i]];
        in_main[i] = 0;
        if (isholder[i]) {
            route_begin(r, t, 1);
            route_push(r, rv[i]);
        } else if (h == hs || !covered[i]) {
            in_main[i] = 1;
            nmain++;
        }
    }
    for (int i = 0, j; i < k->nrecv; i = j) {
        int h = p->dev_host[rv[i]], any = 0;
        for (j = i; j < k->nrecv && p->dev_host[rv[j]] == h; j++)
            any |= !isholder[j] && !in_main[j];
        if (!any)
            continue;
        /* a covered host other than the sender's: chain from a local holder */
        const int *hd = p->ts->holders + k->holder_off;
        int head = -1;
        for (int q = 0; q < k->group_size; q++) {
            int d = hd[q];
            if (p->dev_host[d] == h && (head < 0 || s->dev_load[d] < s->dev_load[head] ||
                                        (s->dev_load[d] == s->dev_load[head] && d < head)))
                head = d;
        }
        route_begin(r, t, 1);
        route_push(r, head);
        for (int q = i; q < j; q++)
            if (!isholder[q] && !in_main[q])
                route_push(r, rv[q]);
    }
    if (nmain > 0) {
        route_begin(r, t, 1);
        route_push(r, sdev);
        push_host_recvs(p, s, r, k, hs, in_main, entry);
        for (int i = 0; i < k->nrecv; i++) {
            int h = p->dev_host[rv[i]];
            if (h != hs && (i == 0 || p->dev_host[rv[i - 1]] != h))
                push_host_recvs(p, s, r, k, h, in_main, entry);
        }
    }
    if (in_main != main_buf)
        free(in_main);
}

double xm_step(const xm_prep_t *p, xm_state_t *s, int t, int host, const int *fixed,
               xm_troutes_t *r, xm_undo_t *undo)
{
    const xm_task_t *k = &p->ts->tasks[t];
    if (fixed)
        memcpy(r->senders, fixed, sizeof(int) * k->ngroups);
    else
        choose_senders(p, s, t, host, r->senders);
    build_routes(p, s, t, r->senders, r);
    xm_route_rails(p, s, r);
    int go = -1;
    if (p->opt_timed && !fixed) {
        /* With one NIC per host the routes' hosts, hence hops, NIC
         * directions and duration, follow from the sender host (the
         * devices inside the hosts do not matter): as timed in the prep. */
        const xm_prep_task_t *pt = &p->pt[t];
        for (int o = 0; o < pt->nopt && go < 0; o++)
            if (p->opt_hosts[pt->opt_off + o] == host)
                go = pt->opt_off + o;
    }
    if (go >= 0) {
        r->dur = p->opt_dur[go];
        r->route_dur = p->opt_rdur[go];
        r->nuse = 0;
        for (int i = p->opt_res_off[go]; i < p->opt_res_off[go + 1]; i++) {
            r->use_off[r->nuse] = p->opt_res_t0[i];
            r->use_end[r->nuse] = p->opt_res_t1[i];
            r->use_dir[r->nuse++] = p->opt_res[i];
        }
    } else {
        xm_task_timing(p, t, r);
    }
    double start = xm_task_start(s->dir_free, r);
    double end = start + r->dur;
    for (int i = 0; i < r->nuse; i++)
        undo_set(undo, &s->dir_free[r->use_dir[i]], start + r->use_end[i]);
    for (int g = 0; g < k->ngroups; g++)
        undo_set(undo, &s->dev_load[r->senders[g]], s->dev_load[r->senders[g]] + (double)k->bytes);
    if (end > s->makespan)
        undo_set(undo, &s->makespan, end);
    r->start = start;
    r->end = end;
    return end;
}

double xm_eval_plan(const xm_prep_t *p, xm_state_t *s, xm_troutes_t *r, const int *order,
                    const int *hosts, const int *fixed)
{
    xm_state_reset(s, p);
    for (int i = 0; i < p->ts->ntasks; i++) {
        int t = order[i];
        xm_step(p, s, t, hosts ? hosts[t] : -1, fixed ? fixed + (size_t)t * p->max_groups : NULL, r,
                NULL);
    }
    return s->makespan;
}
