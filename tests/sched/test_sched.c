/*
 * Scheduler, routes, lower bound and simulator (issue 3 item 7).
 *
 * Random instances are synthetic task sets (random hosts, holders, partial
 * groups, receivers, sizes; sometimes overlapping holders and receivers)
 * plus the paper's Table 2 cases through the real decomposer. Seeded from
 * XMESH_TEST_SEED (printed) so a failure can be replayed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <string.h>

#include <cmocka.h>

#include "test_util.h"
#include "xm_cases.h"
#include "xm_flows.h"
#include "xm_sched_impl.h"

static uint64_t g_seed;

/* ------------------------------------------------------------ instances */

typedef struct {
    xm_hostmap_t hm;
    xm_taskset_t ts;
    xm_cluster_t c;
} inst_t;

static void inst_free(inst_t *in)
{
    xm_cluster_free(&in->c);
    xm_taskset_free(&in->ts);
    xm_hostmap_free(&in->hm);
}

static int has(const int *v, int n, int x)
{
    for (int i = 0; i < n; i++)
        if (v[i] == x)
            return 1;
    return 0;
}

/* Synthetic task set: ntasks tasks on nhosts hosts of dph devices. */
static void make_random(uint64_t *rng, inst_t *in, int ntasks, int max_groups, int nics)
{
    memset(in, 0, sizeof *in);
    int nhosts = xt_range(rng, 2, 6), dph = xt_range(rng, 1, 4), ndev = nhosts * dph;
    in->hm.ndev = ndev;
    in->hm.nhosts = nhosts;
    in->hm.host_of = malloc(sizeof(int) * ndev);
    for (int d = 0; d < ndev; d++)
        in->hm.host_of[d] = d / dph;
    xm_taskset_t *ts = &in->ts;
    ts->ndim = 1;
    ts->elem_size = 1;
    ts->ntasks = ntasks;
    ts->tasks = calloc(ntasks, sizeof *ts->tasks);
    ts->holders = malloc(sizeof(int) * ntasks * ndev);
    ts->recvs = malloc(sizeof(int) * ntasks * ndev);
    int hoff = 0, roff = 0;
    int64_t lo = 0;
    for (int t = 0; t < ntasks; t++) {
        xm_task_t *k = &ts->tasks[t];
        int tiny = xt_range(rng, 0, 4) == 0;
        k->bytes = tiny ? xt_range(rng, 1, 5000) : (int64_t)xt_range(rng, 1, 64) << 20;
        k->box.lo[0] = lo;
        k->box.hi[0] = lo + k->bytes;
        lo += k->bytes;
        k->ngroups = max_groups > 1 && xt_range(rng, 0, 2) == 0 ? xt_range(rng, 2, max_groups) : 1;
        if (k->ngroups > ndev)
            k->ngroups = ndev;
        int maxgs = ndev / k->ngroups;
        if (maxgs > 3)
            maxgs = 3;
        k->group_size = xt_range(rng, 1, maxgs);
        k->holder_off = hoff;
        int nh = k->ngroups * k->group_size;
        for (int i = 0; i < nh; i++) {
            int d;
            do
                d = xt_range(rng, 0, ndev - 1);
            while (has(ts->holders + hoff, i, d));
            ts->holders[hoff + i] = d;
        }
        /* holders of each group ascending, as the decomposer gives them */
        for (int g = 0; g < k->ngroups; g++)
            for (int i = 1; i < k->group_size; i++)
                for (int j = i; j > 0; j--) {
                    int *a = ts->holders + hoff + g * k->group_size;
                    if (a[j - 1] > a[j]) {
                        int x = a[j];
                        a[j] = a[j - 1];
                        a[j - 1] = x;
                    }
                }
        hoff += nh;
        int overlap = xt_range(rng, 0, 3) == 0;
        int nr = xt_range(rng, 1, ndev < 6 ? ndev : 6), m = 0;
        for (int tries = 0; m < nr && tries < 100; tries++) {
            int d = xt_range(rng, 0, ndev - 1);
            if (has(ts->recvs + roff, m, d))
                continue;
            if (!overlap && has(ts->holders + k->holder_off, nh, d))
                continue;
            ts->recvs[roff + m++] = d;
        }
        if (m == 0) { /* every device holds: receive on a holder (a self copy) */
            ts->recvs[roff + m++] = ts->holders[k->holder_off];
        }
        /* device ids are host-major, so ascending ids are sorted by (host, dev) */
        for (int i = 1; i < m; i++)
            for (int j = i; j > 0 && ts->recvs[roff + j - 1] > ts->recvs[roff + j]; j--) {
                int x = ts->recvs[roff + j];
                ts->recvs[roff + j] = ts->recvs[roff + j - 1];
                ts->recvs[roff + j - 1] = x;
            }
        k->nrecv = m;
        k->recv_off = roff;
        roff += m;
    }
    ts->shape[0] = lo;
    ts->bytes_total = lo;
    assert_int_equal(xm_cluster_init(&in->c, &in->hm), XMESH_SUCCESS);
    in->c.nics_per_host = nics;
    in->c.nic_send_Bps = 1.25e9 * (xt_range(rng, 0, 1) ? 1.0 : 0.5);
    in->c.nic_recv_Bps = 1.25e9;
    in->c.intra_Bps = xt_range(rng, 0, 1) ? 100e9 : 5e9;
    in->c.latency_s = xt_range(rng, 0, 3) * 5e-6;
    in->c.chunk_bytes = (int64_t)1 << xt_range(rng, 12, 22);
}

/* Table 2 case through the decomposer (see tools/xmesh-plan.c). */
static void make_case(inst_t *in, const int64_t *shape, const int *sm, const int *dm,
                      const char *ss, const char *ds)
{
    memset(in, 0, sizeof *in);
    int *sd, *dd;
    assert_int_equal(xm_hostmap_default(sm, 2, dm, 2, 0, &in->hm, &sd, &dd), XMESH_SUCCESS);
    xm_layout_t L[2];
    memset(L, 0, sizeof L);
    for (int s = 0; s < 2; s++) {
        L[s].ndim = 3;
        for (int d = 0; d < 3; d++)
            L[s].shape[d] = shape[d];
        L[s].elem_size = 4;
        const int *m = s ? dm : sm;
        L[s].mesh.ndim = 2;
        L[s].mesh.shape[0] = m[0];
        L[s].mesh.shape[1] = m[1];
        L[s].mesh.ndev = m[0] * m[1];
        L[s].mesh.devs = s ? dd : sd;
        assert_int_equal(xm_spec_parse(s ? ds : ss, 3, 2, &L[s].spec), XMESH_SUCCESS);
    }
    assert_int_equal(xm_decompose(&L[0], &L[1], &in->hm, &in->ts), XMESH_SUCCESS);
    assert_int_equal(xm_cluster_init(&in->c, &in->hm), XMESH_SUCCESS);
    free(sd);
    free(dd);
}

static xm_sched_opts_t opts(xmesh_scheduler_t k, xmesh_strategy_t st, uint64_t seed, int64_t evals)
{
    xm_sched_opts_t o;
    memset(&o, 0, sizeof o);
    o.kind = k;
    o.strategy = st;
    o.seed = seed;
    o.max_evals = evals;
    o.budget_us = 1000000;
    return o;
}

/* --------------------------------------------------------------- checks */

static int holder_group(const xm_taskset_t *ts, const xm_task_t *k, int dev)
{
    for (int i = 0; i < k->ngroups * k->group_size; i++)
        if (ts->holders[k->holder_off + i] == dev)
            return i / k->group_size;
    return -1;
}

/* Route invariants of xm_sched.h. */
static void check_routes(const inst_t *in, const xm_schedule_t *s, xmesh_strategy_t st)
{
    const xm_taskset_t *ts = &in->ts;
    const int *host = in->hm.host_of;
    for (int t = 0; t < ts->ntasks; t++) {
        const xm_task_t *k = &ts->tasks[t];
        int r0 = s->task_route_off[t], r1 = s->task_route_off[t + 1];
        if (k->nrecv > 0 && r1 <= r0)
            fail_msg("seed %llu: task %d has no route", (unsigned long long)g_seed, t);
        int *seen = calloc(in->hm.ndev, sizeof(int));
        int *hostin = calloc(in->hm.nhosts, sizeof(int));
        for (int q = r0; q < r1; q++) {
            const xm_route_t *rt = &s->routes[q];
            const int *d = s->route_devs + rt->off;
            assert_int_equal(rt->task, t);
            assert_true(rt->len >= 1);
            if (rt->len == 1) {
                /* self copy: the device holds (every group of) the box */
                assert_int_equal(k->ngroups, 1);
                assert_true(holder_group(ts, k, d[0]) == 0);
                assert_true(has(ts->recvs + k->recv_off, k->nrecv, d[0]));
                seen[d[0]]++;
                continue;
            }
            assert_int_equal(rt->nsrc, k->ngroups);
            /* sources: one holder of every group */
            unsigned groups = 0;
            for (int i = 0; i < rt->nsrc; i++) {
                int g = holder_group(ts, k, d[i]);
                if (g < 0)
                    fail_msg("seed %llu: task %d route source %d holds nothing",
                             (unsigned long long)g_seed, t, d[i]);
                groups |= 1u << g;
                if (k->ngroups > 1) /* P routes start from the chosen senders */
                    assert_int_equal(s->sender[(size_t)t * s->max_groups + g], d[i]);
            }
            assert_int_equal(groups, (1u << k->ngroups) - 1);
            for (int i = rt->nsrc; i < rt->len; i++) {
                if (!has(ts->recvs + k->recv_off, k->nrecv, d[i]))
                    fail_msg("seed %llu: task %d route visits non-receiver %d",
                             (unsigned long long)g_seed, t, d[i]);
                seen[d[i]]++;
                if (host[d[i]] != host[d[i - 1]])
                    hostin[host[d[i]]]++;
            }
            if (st == XMESH_STRATEGY_SENDRECV)
                assert_int_equal(rt->len, rt->nsrc + 1);
        }
        for (int i = 0; i < k->nrecv; i++) {
            int r = ts->recvs[k->recv_off + i];
            if (seen[r] != 1)
                fail_msg("seed %llu: task %d receiver %d received %d times",
                         (unsigned long long)g_seed, t, r, seen[r]);
        }
        /* broadcast: a host's NICs take in each task at most once */
        if (st == XMESH_STRATEGY_BROADCAST && k->ngroups == 1)
            for (int h = 0; h < in->hm.nhosts; h++)
                if (hostin[h] > 1)
                    fail_msg("seed %llu: task %d enters host %d %d times",
                             (unsigned long long)g_seed, t, h, hostin[h]);
        free(seen);
        free(hostin);
    }
}

/* No two tasks overlap on a NIC direction; each direction serves its tasks in
 * the global order; the schedule's makespan is the simulator's. */
/* The simulated schedule keeps every NIC direction exclusive: in the
 * schedule's order, each task's bytes occupy each direction its routes cross
 * over [start + use_off, start + use_end] (xm_task_timing), inside the task,
 * and these intervals never overlap on a direction; the NICs' busy sums are
 * these intervals' lengths. */
static void check_sim(const inst_t *in, const xm_schedule_t *s)
{
    xm_sim_result_t res;
    assert_int_equal(xm_simulate(&in->ts, &in->c, s, &res, NULL), XMESH_SUCCESS);
    assert_true(fabs(res.makespan_s - s->makespan_s) <= 1e-12 * (1 + s->makespan_s));
    int n = in->ts.ntasks, nics = in->c.nics_per_host, ndir = 2 * in->hm.nhosts * nics;
    xm_prep_t p;
    assert_int_equal(xm_prep_init(&p, &in->ts, &in->c, XMESH_STRATEGY_BROADCAST), XMESH_SUCCESS);
    int maxdevs = 1;
    for (int t = 0; t < n; t++) {
        int nd = 0;
        for (int q = s->task_route_off[t]; q < s->task_route_off[t + 1]; q++)
            nd += s->routes[q].len;
        if (nd > maxdevs)
            maxdevs = nd;
    }
    xm_troutes_t tr;
    memset(&tr, 0, sizeof tr);
    tr.use_dir = malloc(sizeof(int) * 2 * maxdevs);
    tr.use_count = malloc(sizeof(int) * 2 * maxdevs);
    tr.use_off = malloc(sizeof(double) * 2 * maxdevs);
    tr.use_end = malloc(sizeof(double) * 2 * maxdevs);
    double *last_end = calloc(ndir, sizeof(double));
    int *pos = malloc(sizeof(int) * n);
    for (int i = 0; i < n; i++)
        pos[s->order[i]] = i;
    int *last_task = malloc(sizeof(int) * ndir);
    for (int d = 0; d < ndir; d++)
        last_task[d] = -1;
    char *used = malloc(ndir);
    double busy_recv = 0, busy_sum = 0;
    for (int i = 0; i < n; i++) {
        int t = s->order[i];
        double st = res.task_start_s[t], en = res.task_end_s[t];
        assert_true(en >= st);
        memset(used, 0, ndir);
        for (int q = s->task_route_off[t]; q < s->task_route_off[t + 1]; q++) {
            const xm_route_t *rt = &s->routes[q];
            const int *d = s->route_devs + rt->off;
            for (int j = 0; j + 1 < rt->len; j++) {
                if (in->hm.host_of[d[j]] == in->hm.host_of[d[j + 1]])
                    continue;
                /* the hop's rail at both ends (route_rails), as charged */
                int rl = s->route_rails ? s->route_rails[rt->off + j] : -1;
                assert_true(rl < nics);
                used[2 * (rl >= 0 ? in->hm.host_of[d[j]] * nics + rl
                                  : xm_cluster_nic_of(&in->c, d[j]))] = 1;
                used[2 * (rl >= 0 ? in->hm.host_of[d[j + 1]] * nics + rl
                                  : xm_cluster_nic_of(&in->c, d[j + 1])) +
                     1] = 1;
            }
        }
        tr.routes = s->routes + s->task_route_off[t];
        tr.nroutes = s->task_route_off[t + 1] - s->task_route_off[t];
        tr.devs = s->route_devs;
        tr.rails = s->route_rails;
        xm_task_timing(&p, t, &tr);
        assert_true(fabs(en - st - tr.dur) <= 1e-12 * (1 + en));
        int nused = 0;
        for (int d = 0; d < ndir; d++)
            nused += used[d];
        assert_int_equal(nused, tr.nuse);
        for (int u = 0; u < tr.nuse; u++) {
            int d = tr.use_dir[u];
            assert_true(used[d]);
            double b0 = st + tr.use_off[u], b1 = st + tr.use_end[u];
            assert_true(tr.use_off[u] >= 0 && b1 >= b0 && b1 <= en * (1 + 1e-12));
            if (b0 < last_end[d] - 1e-12 * (1 + b0))
                fail_msg("seed %llu: task %d takes NIC dir %d at %.9g, busy until %.9g (task %d)",
                         (unsigned long long)g_seed, t, d, b0, last_end[d], last_task[d]);
            if (last_task[d] >= 0)
                assert_true(pos[last_task[d]] < pos[t]);
            last_end[d] = b1;
            last_task[d] = t;
            if (d & 1)
                busy_recv += b1 - b0;
            busy_sum += b1 - b0;
        }
    }
    double rs = 0, ss = 0;
    for (int k = 0; k < res.nnics; k++) {
        rs += res.nic_recv_busy_s[k];
        ss += res.nic_send_busy_s[k];
    }
    assert_true(fabs(rs - busy_recv) <= 1e-9 * (1 + rs));
    assert_true(fabs(rs + ss - busy_sum) <= 1e-9 * (1 + busy_sum));
    free(last_end);
    free(pos);
    free(last_task);
    free(used);
    free(tr.use_dir);
    free(tr.use_count);
    free(tr.use_off);
    free(tr.use_end);
    xm_prep_free(&p);
    xm_sim_result_free(&res);
}

/* ---------------------------------------------------------------- tests */

static void test_routes_and_sim_random(void **state)
{
    (void)state;
    uint64_t rng = g_seed ^ 0x1111;
    for (int it = 0; it < 150; it++) {
        inst_t in;
        make_random(&rng, &in, xt_range(&rng, 1, 40), 3, xt_range(&rng, 1, 3));
        xmesh_strategy_t st =
            xt_range(&rng, 0, 2) ? XMESH_STRATEGY_BROADCAST : XMESH_STRATEGY_SENDRECV;
        for (int k = 0; k < XMESH_SCHEDULER_COUNT_; k++) {
            xm_sched_opts_t o = opts(k, st, it, 3000);
            xm_schedule_t s;
            if (xm_schedule(&in.ts, &in.c, &o, &s))
                fail_msg("seed %llu it %d: %s", (unsigned long long)g_seed, it, xmesh_last_error());
            check_routes(&in, &s, st);
            check_sim(&in, &s);
            xm_schedule_free(&s);
        }
        inst_free(&in);
    }
}

static void test_lower_bound_random(void **state)
{
    (void)state;
    uint64_t rng = g_seed ^ 0x2222;
    for (int it = 0; it < 200; it++) {
        inst_t in;
        make_random(&rng, &in, xt_range(&rng, 1, 30), 3, xt_range(&rng, 1, 2));
        xmesh_strategy_t st =
            xt_range(&rng, 0, 3) ? XMESH_STRATEGY_BROADCAST : XMESH_STRATEGY_SENDRECV;
        double lb_any = xm_lower_bound(&in.ts, &in.c);
        for (int k = 0; k < XMESH_SCHEDULER_COUNT_; k++) {
            xm_sched_opts_t o = opts(k, st, it, 2000);
            xm_schedule_t s;
            assert_int_equal(xm_schedule(&in.ts, &in.c, &o, &s), XMESH_SUCCESS);
            if (s.lower_bound_s > s.makespan_s * (1 + 1e-12))
                fail_msg("seed %llu it %d %s: lower bound %.12g > makespan %.12g",
                         (unsigned long long)g_seed, it, xmesh_scheduler_name(k), s.lower_bound_s,
                         s.makespan_s);
            if (st == XMESH_STRATEGY_BROADCAST)
                assert_true(lb_any <= s.makespan_s * (1 + 1e-12));
            assert_true(s.lower_bound_s > 0);
            xm_schedule_free(&s);
        }
        /* random plans, random fixed senders: still above the bound */
        int n = in.ts.ntasks, G = 3;
        int *order = malloc(sizeof(int) * n), *snd = malloc(sizeof(int) * n * G);
        for (int i = 0; i < n; i++)
            order[i] = i;
        for (int i = n - 1; i > 0; i--) {
            int j = xt_range(&rng, 0, i), x = order[i];
            order[i] = order[j];
            order[j] = x;
        }
        int maxg = 1;
        for (int t = 0; t < n; t++)
            if (in.ts.tasks[t].ngroups > maxg)
                maxg = in.ts.tasks[t].ngroups;
        for (int t = 0; t < n; t++) {
            const xm_task_t *k = &in.ts.tasks[t];
            for (int g = 0; g < k->ngroups; g++)
                snd[t * maxg + g] = in.ts.holders[k->holder_off + g * k->group_size +
                                                  xt_range(&rng, 0, k->group_size - 1)];
        }
        xm_sched_opts_t o = opts(XMESH_SCHEDULER_UNSET, st, 0, 0);
        xm_schedule_t s;
        assert_int_equal(xm_schedule_from(&in.ts, &in.c, &o, order, snd, &s), XMESH_SUCCESS);
        if (s.lower_bound_s > s.makespan_s * (1 + 1e-12))
            fail_msg("seed %llu it %d random plan: bound %.12g > makespan %.12g",
                     (unsigned long long)g_seed, it, s.lower_bound_s, s.makespan_s);
        check_routes(&in, &s, st);
        check_sim(&in, &s);
        xm_schedule_free(&s);
        free(order);
        free(snd);
        inst_free(&in);
    }
}

/* Exhaustive search with the same evaluator: every order x every sender host. */
static double brute_force(const xm_prep_t *p, int *order, int *hosts, int depth, int *used,
                          xm_state_t *s, xm_troutes_t *r, int64_t *evals)
{
    int n = p->ts->ntasks;
    if (depth == n) {
        (*evals)++;
        return xm_eval_plan(p, s, r, order, hosts, NULL);
    }
    double best = INFINITY;
    for (int t = 0; t < n; t++) {
        if (used[t])
            continue;
        used[t] = 1;
        order[depth] = t;
        for (int o = 0; o < p->pt[t].nopt; o++) {
            hosts[t] = p->opt_hosts[p->pt[t].opt_off + o];
            double v = brute_force(p, order, hosts, depth + 1, used, s, r, evals);
            if (v < best)
                best = v;
        }
        used[t] = 0;
    }
    return best;
}

static void test_dfs_matches_brute_force(void **state)
{
    (void)state;
    uint64_t rng = g_seed ^ 0x3333;
    int done = 0;
    for (int it = 0; done < 40 && it < 400; it++) {
        inst_t in;
        int n = xt_range(&rng, 1, 8);
        make_random(&rng, &in, n, 2, xt_range(&rng, 0, 3) ? 1 : 2);
        xmesh_strategy_t st =
            xt_range(&rng, 0, 3) ? XMESH_STRATEGY_BROADCAST : XMESH_STRATEGY_SENDRECV;
        xm_prep_t p;
        assert_int_equal(xm_prep_init(&p, &in.ts, &in.c, st), XMESH_SUCCESS);
        /* size of the space: n! * prod(options) */
        double space = 1;
        for (int t = 0; t < n; t++)
            space *= (t + 1) * p.pt[t].nopt;
        if (space > 3e5) {
            xm_prep_free(&p);
            inst_free(&in);
            continue;
        }
        xm_state_t s;
        xm_troutes_t r;
        assert_int_equal(xm_state_init(&s, &p), XMESH_SUCCESS);
        assert_int_equal(xm_troutes_init(&r, &p), XMESH_SUCCESS);
        int order[8], hosts[8], used[8] = {0};
        int64_t evals = 0;
        double opt = brute_force(&p, order, hosts, 0, used, &s, &r, &evals);
        xm_sched_opts_t o = opts(XMESH_SCHEDULER_DFS, st, it, INT64_MAX / 4);
        xm_schedule_t sc;
        assert_int_equal(xm_schedule(&in.ts, &in.c, &o, &sc), XMESH_SUCCESS);
        if (fabs(sc.makespan_s - opt) > 1e-12 * opt)
            fail_msg("seed %llu it %d (%d tasks, %.0f plans): dfs %.12g != optimum %.12g",
                     (unsigned long long)g_seed, it, n, space, sc.makespan_s, opt);
        /* the ensemble never does worse than the optimum's bound allows */
        assert_true(sc.lower_bound_s <= opt * (1 + 1e-12));
        xm_schedule_free(&sc);
        xm_state_free(&s);
        xm_troutes_free(&r);
        xm_prep_free(&p);
        inst_free(&in);
        done++;
    }
    assert_true(done >= 20);
}

static void test_same_seed_same_plan(void **state)
{
    (void)state;
    uint64_t rng = g_seed ^ 0x4444;
    for (int it = 0; it < 20; it++) {
        inst_t in;
        make_random(&rng, &in, xt_range(&rng, 5, 60), 3, xt_range(&rng, 1, 2));
        for (int k = 0; k < XMESH_SCHEDULER_COUNT_; k++) {
            xm_sched_opts_t o = opts(k, XMESH_STRATEGY_BROADCAST, 42 + it, 5000);
            xm_schedule_t a, b;
            assert_int_equal(xm_schedule(&in.ts, &in.c, &o, &a), XMESH_SUCCESS);
            assert_int_equal(xm_schedule(&in.ts, &in.c, &o, &b), XMESH_SUCCESS);
            assert_memory_equal(a.order, b.order, sizeof(int) * a.ntasks);
            assert_memory_equal(a.sender, b.sender, sizeof(int) * a.ntasks * a.max_groups);
            assert_int_equal(a.nroutes, b.nroutes);
            assert_true(a.makespan_s == b.makespan_s);
            /* every rank rebuilds rank 0's plan from order + senders */
            xm_schedule_t c;
            assert_int_equal(xm_schedule_from(&in.ts, &in.c, &o, a.order, a.sender, &c),
                             XMESH_SUCCESS);
            assert_true(c.makespan_s == a.makespan_s);
            assert_int_equal(c.nroutes, a.nroutes);
            assert_memory_equal(c.routes, a.routes, sizeof(xm_route_t) * a.nroutes);
            int nd = 0;
            for (int q = 0; q < a.nroutes; q++)
                nd += a.routes[q].len;
            assert_memory_equal(c.route_devs, a.route_devs, sizeof(int) * nd);
            xm_schedule_free(&a);
            xm_schedule_free(&b);
            xm_schedule_free(&c);
        }
        inst_free(&in);
    }
}

static void test_schedule_from_rejects(void **state)
{
    (void)state;
    uint64_t rng = g_seed ^ 0x5555;
    inst_t in;
    make_random(&rng, &in, 6, 1, 1);
    xm_sched_opts_t o = opts(XMESH_SCHEDULER_NAIVE, XMESH_STRATEGY_BROADCAST, 1, 100);
    xm_schedule_t a;
    assert_int_equal(xm_schedule(&in.ts, &in.c, &o, &a), XMESH_SUCCESS);
    xm_schedule_t out;
    memset(&out, 0x5a, sizeof out);
    xm_schedule_t copy = out;
    int order[6] = {0, 1, 2, 3, 4, 4};
    assert_int_equal(xm_schedule_from(&in.ts, &in.c, &o, order, a.sender, &out),
                     XMESH_ERR_INVALID_ARGUMENT);
    assert_memory_equal(&out, &copy, sizeof out);
    assert_non_null(strstr(xmesh_last_error(), "order[5] = 4"));
    /* a sender that does not hold the box */
    int *snd = malloc(sizeof(int) * 6 * a.max_groups);
    memcpy(snd, a.sender, sizeof(int) * 6 * a.max_groups);
    int bad = -1;
    for (int d = 0; d < in.hm.ndev && bad < 0; d++)
        if (!has(in.ts.holders + in.ts.tasks[2].holder_off, in.ts.tasks[2].group_size, d))
            bad = d;
    if (bad >= 0) {
        snd[2 * a.max_groups] = bad;
        assert_int_equal(xm_schedule_from(&in.ts, &in.c, &o, a.order, snd, &out),
                         XMESH_ERR_INVALID_ARGUMENT);
        assert_memory_equal(&out, &copy, sizeof out);
    }
    /* bad cluster */
    in.c.nics_per_host = 0;
    assert_int_equal(xm_schedule(&in.ts, &in.c, &o, &out), XMESH_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(xmesh_last_error(), "nics_per_host = 0"));
    assert_memory_equal(&out, &copy, sizeof out);
    in.c.nics_per_host = 1;
    o.strategy = XMESH_STRATEGY_GLOBAL_ALLGATHER;
    assert_int_equal(xm_schedule(&in.ts, &in.c, &o, &out), XMESH_ERR_UNSUPPORTED);
    free(snd);
    xm_schedule_free(&a);
    inst_free(&in);
}

/* Table 2: ensemble within 5 % of the bound, naive never better than it. */
static void test_table2_targets(void **state)
{
    (void)state;
    for (size_t c = 0; c < XM_TABLE2_NCASES; c++) {
        inst_t in;
        make_case(&in, xm_table2[c].shape, xm_table2[c].src, xm_table2[c].dst, xm_table2[c].ss,
                  xm_table2[c].ds);
        if (c == 3)
            assert_int_equal(in.ts.ntasks, 64);
        xm_sched_opts_t o = opts(XMESH_SCHEDULER_ENSEMBLE, XMESH_STRATEGY_BROADCAST, 1, 200000);
        xm_schedule_t e, nv;
        assert_int_equal(xm_schedule(&in.ts, &in.c, &o, &e), XMESH_SUCCESS);
        o.kind = XMESH_SCHEDULER_NAIVE;
        assert_int_equal(xm_schedule(&in.ts, &in.c, &o, &nv), XMESH_SUCCESS);
        printf("case %zu: %d tasks, bound %.6f s, ensemble %.6f s (%.4fx), naive %.6f s\n", c + 1,
               in.ts.ntasks, e.lower_bound_s, e.makespan_s, e.makespan_s / e.lower_bound_s,
               nv.makespan_s);
        assert_true(e.makespan_s <= 1.05 * e.lower_bound_s);
        assert_true(e.makespan_s <= nv.makespan_s * (1 + 1e-12));
        check_routes(&in, &e, XMESH_STRATEGY_BROADCAST);
        check_sim(&in, &e);
        xm_schedule_free(&e);
        xm_schedule_free(&nv);
        inst_free(&in);
    }
}

/* Flows: RS01R -> S01RR between two 4 x 8 meshes has 32 x 32 unit tasks and
 * 4 x 4 host pairs. Every unit task lands in exactly one flow, a flow's
 * members share holder and receiver hosts, and its bytes are their sum. */
static void test_flows_group_host_pairs(void **state)
{
    (void)state;
    int64_t shape[3] = {256, 256, 4};
    int m[2] = {4, 8};
    inst_t in;
    make_case(&in, shape, m, m, "RS01R", "S01RR");
    assert_int_equal(in.ts.ntasks, 1024);
    xm_prep_t p;
    assert_int_equal(xm_prep_init(&p, &in.ts, &in.c, XMESH_STRATEGY_BROADCAST), XMESH_SUCCESS);
    xm_flows_t f;
    assert_int_equal(xm_flows_build(&p, &f), XMESH_SUCCESS);
    assert_int_equal(f.nflows, 16);
    int *seen = calloc(in.ts.ntasks, sizeof *seen);
    for (int i = 0; i < f.nflows; i++) {
        int first = f.members[f.member_off[i]];
        int hh = in.hm.host_of[in.ts.holders[in.ts.tasks[first].holder_off]];
        int rh = in.hm.host_of[in.ts.recvs[in.ts.tasks[first].recv_off]];
        int64_t bytes = 0;
        assert_int_equal(f.member_off[i + 1] - f.member_off[i], 64);
        for (int j = f.member_off[i]; j < f.member_off[i + 1]; j++) {
            const xm_task_t *k = &in.ts.tasks[f.members[j]];
            seen[f.members[j]]++;
            bytes += k->bytes;
            assert_int_equal(in.hm.host_of[in.ts.holders[k->holder_off]], hh);
            assert_int_equal(in.hm.host_of[in.ts.recvs[k->recv_off]], rh);
            if (j > f.member_off[i])
                assert_true(f.members[j] > f.members[j - 1]);
        }
        assert_int_equal(f.ts.tasks[i].bytes, bytes);
    }
    for (int t = 0; t < in.ts.ntasks; t++)
        assert_int_equal(seen[t], 1);
    /* expanding a flow plan lists every task once, on its flow's host */
    int forder[16], fhosts[16], order[1024], hosts[1024];
    for (int i = 0; i < 16; i++) {
        forder[i] = 15 - i;
        fhosts[i] = in.hm.host_of[in.ts.holders[f.ts.tasks[i].holder_off]];
    }
    xm_flows_expand(&f, forder, fhosts, order, hosts);
    memset(seen, 0, sizeof(int) * in.ts.ntasks);
    for (int i = 0; i < in.ts.ntasks; i++)
        seen[order[i]]++;
    for (int t = 0; t < in.ts.ntasks; t++) {
        assert_int_equal(seen[t], 1);
        assert_int_equal(hosts[t], in.hm.host_of[in.ts.holders[in.ts.tasks[t].holder_off]]);
    }
    assert_int_equal(order[0], f.members[f.member_off[15]]);
    free(seen);
    xm_flows_free(&f);
    xm_prep_free(&p);
    inst_free(&in);
}

/* Big instances are searched on flows: RS01R -> S01RR between 8 x 8 meshes
 * (4096 unit tasks, 64 host pairs) meets the lower bound with a
 * deterministic budget, and every scheduler returns a valid plan; with a
 * 1 ms wall-clock budget the ensemble still returns a valid plan. */
static void test_flows_big_instance(void **state)
{
    (void)state;
    int64_t shape[3] = {512, 512, 4};
    int m[2] = {8, 8};
    inst_t in;
    make_case(&in, shape, m, m, "RS01R", "S01RR");
    assert_int_equal(in.ts.ntasks, 4096);
    for (int k = 0; k < XMESH_SCHEDULER_COUNT_; k++) {
        xm_sched_opts_t o = opts((xmesh_scheduler_t)k, XMESH_STRATEGY_BROADCAST, 1, 200000);
        xm_schedule_t s;
        assert_int_equal(xm_schedule(&in.ts, &in.c, &o, &s), XMESH_SUCCESS);
        printf("%s: %.6f s, bound %.6f s\n", xmesh_scheduler_name((xmesh_scheduler_t)k),
               s.makespan_s, s.lower_bound_s);
        if (k == XMESH_SCHEDULER_ENSEMBLE || k == XMESH_SCHEDULER_DFS)
            assert_true(s.makespan_s <= s.lower_bound_s * (1 + 1e-9));
        check_routes(&in, &s, XMESH_STRATEGY_BROADCAST);
        check_sim(&in, &s);
        xm_schedule_free(&s);
    }
    xm_sched_opts_t o = opts(XMESH_SCHEDULER_ENSEMBLE, XMESH_STRATEGY_BROADCAST, 1, 0);
    o.budget_us = 1000;
    xm_schedule_t s;
    assert_int_equal(xm_schedule(&in.ts, &in.c, &o, &s), XMESH_SUCCESS);
    check_routes(&in, &s, XMESH_STRATEGY_BROADCAST);
    check_sim(&in, &s);
    xm_schedule_free(&s);
    inst_free(&in);
}

/* Placement advice: S01RR -> S10RR on the same 2 x 4 devices. Every
 * destination block is one source block, held by some device, so the best
 * order keeps every block in place (the whole tensor local, the bound drops
 * to a self copy) and is a permutation of the ranks.
 * A duplicate rank is refused, naming it, and writes nothing. */
static void test_suggest_order(void **state)
{
    (void)state;
    int64_t shape[3] = {64, 64, 8};
    int mshape[2] = {2, 4}, ranks[8] = {0, 1, 2, 3, 4, 5, 6, 7}, host[8] = {0, 0, 0, 0, 1, 1, 1, 1};
    xmesh_placement_problem_t pb = {3, shape,  XMESH_I32, 2,       mshape, ranks, "S01RR",
                                    2, mshape, ranks,     "S10RR", 8,      host};
    int out[8];
    xmesh_placement_info_t info;
    assert_int_equal(xmesh_suggest_order(&pb, out, &info), XMESH_SUCCESS);
    printf("suggested:");
    for (int i = 0; i < 8; i++)
        printf(" %d", out[i]);
    printf("  bound %.3g -> %.3g s, local %lld -> %lld bytes\n", info.lower_bound_s,
           info.suggested_lower_bound_s, (long long)info.bytes_local,
           (long long)info.bytes_local_suggested);
    int seen[8] = {0};
    for (int i = 0; i < 8; i++)
        seen[out[i]]++;
    for (int i = 0; i < 8; i++)
        assert_int_equal(seen[i], 1);
    /* S10: position (i, j) takes dim-0 shard j * 2 + i, held by rank j * 2 + i under S01 */
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++)
            assert_int_equal(out[i * 4 + j], j * 2 + i);
    assert_int_equal(info.bytes_local_suggested, 64 * 64 * 8 * 4);
    assert_true(info.bytes_local < info.bytes_local_suggested);
    assert_true(info.suggested_lower_bound_s < info.lower_bound_s);
    /* non-overlapping meshes: never worse than the given order */
    int dranks[8] = {8, 9, 10, 11, 12, 13, 14, 15}, host2[16];
    for (int i = 0; i < 16; i++)
        host2[i] = i / 4;
    pb.dst_ranks = dranks;
    pb.dst_sharding = "RS01R";
    pb.src_sharding = "S0RR";
    pb.nranks = 16;
    pb.host_of_rank = host2;
    assert_int_equal(xmesh_suggest_order(&pb, out, &info), XMESH_SUCCESS);
    assert_true(info.suggested_lower_bound_s <= info.lower_bound_s * (1 + 1e-9));
    /* bad input */
    int dup[8] = {8, 9, 10, 11, 12, 13, 14, 8}, keep[8];
    for (int i = 0; i < 8; i++)
        keep[i] = out[i] = -7;
    pb.dst_ranks = dup;
    assert_int_equal(xmesh_suggest_order(&pb, out, &info), XMESH_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(xmesh_last_error(), "rank 8 appears twice"));
    assert_memory_equal(out, keep, sizeof out);
}

/* The pipelined chain time: one task, one chain over A hosts, K chunks:
 * T = t + A t / K style (paper 3.1): K*c/bw + (hops - 1) * c / bw + hops * alpha. */
static void test_chain_timing(void **state)
{
    (void)state;
    inst_t in;
    memset(&in, 0, sizeof in);
    int nh = 4;
    in.hm.ndev = nh;
    in.hm.nhosts = nh;
    in.hm.host_of = malloc(sizeof(int) * nh);
    for (int d = 0; d < nh; d++)
        in.hm.host_of[d] = d;
    in.ts.ntasks = 1;
    in.ts.ndim = 1;
    in.ts.elem_size = 1;
    in.ts.tasks = calloc(1, sizeof(xm_task_t));
    in.ts.holders = malloc(sizeof(int));
    in.ts.recvs = malloc(sizeof(int) * 3);
    in.ts.holders[0] = 0;
    for (int i = 0; i < 3; i++)
        in.ts.recvs[i] = i + 1;
    xm_task_t *k = &in.ts.tasks[0];
    k->bytes = 100 << 20;
    k->box.hi[0] = k->bytes;
    k->ngroups = k->group_size = 1;
    k->nrecv = 3;
    assert_int_equal(xm_cluster_init(&in.c, &in.hm), XMESH_SUCCESS);
    xm_sched_opts_t o = opts(XMESH_SCHEDULER_NAIVE, XMESH_STRATEGY_BROADCAST, 1, 10);
    xm_schedule_t s;
    assert_int_equal(xm_schedule(&in.ts, &in.c, &o, &s), XMESH_SUCCESS);
    assert_int_equal(s.nroutes, 1);
    assert_int_equal(s.routes[0].len, 4);
    double bw = in.c.nic_send_Bps, C = (double)in.c.chunk_bytes, B = (double)k->bytes;
    double want = B / bw + 2 * C / bw + 3 * in.c.latency_s;
    assert_true(fabs(s.makespan_s - want) < 1e-12 * want);
    assert_true(fabs(s.lower_bound_s - want) < 1e-12 * want);
    xm_schedule_free(&s);
    /* sendrecv: the sender NIC carries three copies */
    o.strategy = XMESH_STRATEGY_SENDRECV;
    assert_int_equal(xm_schedule(&in.ts, &in.c, &o, &s), XMESH_SUCCESS);
    assert_int_equal(s.nroutes, 3);
    want = 3 * B / bw + in.c.latency_s;
    assert_true(fabs(s.makespan_s - want) < 1e-12 * want);
    xm_schedule_free(&s);
    inst_free(&in);
}

/* Two consecutive broadcast tasks from one sender along the same 2-hop chain
 * h0 -> h1 -> h2 (one device per host), each B = 110,592 bytes (96 x 576
 * bf16, a GPT-2 unit task) in K = 2 chunks of c = 55,296 B (chunk_bytes
 * 65,408), NICs at bw = 37.5e6 B/s (300 Mbit/s), latency a = 1e-5 s,
 * send_ahead = forward_ahead = 1 (window of one chunk per hop):
 * c / bw = 1.47456 ms.
 *   task 0 at 0: hop h0->h1 holds h0 send, h1 recv over [0, a + 2c/bw]
 *     = [0, 2.95912 ms]; hop h1->h2 starts after the first hop's fill,
 *     holds h1 send, h2 recv over [a + c/bw, 2a + 3c/bw] = [1.48456,
 *     4.44368 ms]; the task ends at 2a + 3c/bw = 4.44368 ms.
 *   task 1 starts when h0 send is free, 2.95912 ms: its second hop needs
 *     h1 send at 2.95912 + 1.48456 = 4.44368 ms, just free; it ends at
 *     2.95912 + 4.44368 = 3a + 5c/bw = 7.40280 ms.
 * Makespan 3a + 5c/bw = 7.40280 ms. The old model held every direction for
 * the whole chain: 2 (2a + 3c/bw) = 8.88736 ms, and its "lower bound" was
 * the same. Lower bound: h1 receives both tasks, nic_cost = a + B/bw each:
 * 2 (a + 2c/bw) = 5.91824 ms. */
static void test_chain_fill_overlap(void **state)
{
    (void)state;
    inst_t in;
    memset(&in, 0, sizeof in);
    int nh = 3;
    in.hm.ndev = nh;
    in.hm.nhosts = nh;
    in.hm.host_of = malloc(sizeof(int) * nh);
    for (int d = 0; d < nh; d++)
        in.hm.host_of[d] = d;
    in.ts.ntasks = 2;
    in.ts.ndim = 1;
    in.ts.elem_size = 1;
    in.ts.tasks = calloc(2, sizeof(xm_task_t));
    in.ts.holders = malloc(sizeof(int) * 2);
    in.ts.recvs = malloc(sizeof(int) * 4);
    for (int t = 0; t < 2; t++) {
        xm_task_t *k = &in.ts.tasks[t];
        in.ts.holders[t] = 0;
        in.ts.recvs[2 * t] = 1;
        in.ts.recvs[2 * t + 1] = 2;
        k->bytes = 110592;
        k->box.lo[0] = t * k->bytes;
        k->box.hi[0] = (t + 1) * k->bytes;
        k->ngroups = k->group_size = 1;
        k->holder_off = t;
        k->nrecv = 2;
        k->recv_off = 2 * t;
    }
    assert_int_equal(xm_cluster_init(&in.c, &in.hm), XMESH_SUCCESS);
    in.c.nic_send_Bps = in.c.nic_recv_Bps = 37.5e6;
    in.c.latency_s = 1e-5;
    in.c.chunk_bytes = 65408;
    in.c.send_ahead = in.c.forward_ahead = 1;
    in.c.sync_send = 0;
    double a = 1e-5, cb = 55296.0 / 37.5e6;
    double want = 3 * a + 5 * cb, want_lb = 2 * (a + 2 * cb);
    assert_true(fabs(want - 7.40280e-3) < 1e-12);
    assert_true(fabs(want_lb - 5.91824e-3) < 1e-12);
    xm_sched_opts_t o = opts(XMESH_SCHEDULER_NAIVE, XMESH_STRATEGY_BROADCAST, 1, 10);
    xm_schedule_t s;
    assert_int_equal(xm_schedule(&in.ts, &in.c, &o, &s), XMESH_SUCCESS);
    assert_int_equal(s.nroutes, 2);
    assert_int_equal(s.routes[0].len, 3);
    if (fabs(s.makespan_s - want) > 1e-12 * want)
        fail_msg("makespan %.9g s, want %.9g s", s.makespan_s, want);
    if (fabs(s.lower_bound_s - want_lb) > 1e-12 * want_lb)
        fail_msg("lower bound %.9g s, want %.9g s", s.lower_bound_s, want_lb);
    xm_sim_result_t res;
    assert_int_equal(xm_simulate(&in.ts, &in.c, &s, &res, NULL), XMESH_SUCCESS);
    assert_true(fabs(res.makespan_s - want) <= 1e-12 * want);
    int t0 = s.order[0], t1 = s.order[1];
    assert_true(fabs(res.task_start_s[t0]) <= 1e-15);
    assert_true(fabs(res.task_end_s[t0] - (2 * a + 3 * cb)) <= 1e-12 * want);
    assert_true(fabs(res.task_start_s[t1] - (a + 2 * cb)) <= 1e-12 * want);
    /* every NIC direction carries each task's bytes once: a + B/bw each */
    for (int k = 0; k < res.nnics; k++) {
        double ws = k < 2 ? 2 * (a + 2 * cb) : 0, wr = k > 0 ? 2 * (a + 2 * cb) : 0;
        assert_true(fabs(res.nic_send_busy_s[k] - ws) <= 1e-12);
        assert_true(fabs(res.nic_recv_busy_s[k] - wr) <= 1e-12);
    }
    xm_sim_result_free(&res);
    xm_schedule_free(&s);
    for (xmesh_scheduler_t kind = 0; kind < XMESH_SCHEDULER_COUNT_; kind++) {
        o = opts(kind, XMESH_STRATEGY_BROADCAST, 1, 1000);
        if (xm_schedule(&in.ts, &in.c, &o, &s) != XMESH_SUCCESS)
            continue;
        assert_true(s.makespan_s >= want_lb * (1 - 1e-12));
        xm_schedule_free(&s);
    }
    inst_free(&in);
}

/* The analytic chain time equals a chunk-by-chunk event simulation of the
 * same chain: chunk j leaves hop h's sender when it has arrived there and
 * the previous chunk has left, takes c / bw on the wire, then the latency. */
static void test_chain_vs_chunk_events(void **state)
{
    (void)state;
    uint64_t rng = g_seed ^ 0x7777;
    for (int it = 0; it < 40; it++) {
        int nh = xt_range(&rng, 2, 5), dph = xt_range(&rng, 1, 3);
        inst_t in;
        memset(&in, 0, sizeof in);
        in.hm.ndev = nh * dph;
        in.hm.nhosts = nh;
        in.hm.host_of = malloc(sizeof(int) * in.hm.ndev);
        for (int d = 0; d < in.hm.ndev; d++)
            in.hm.host_of[d] = d / dph;
        in.ts.ntasks = 1;
        in.ts.ndim = 1;
        in.ts.elem_size = 1;
        in.ts.tasks = calloc(1, sizeof(xm_task_t));
        in.ts.holders = malloc(sizeof(int));
        in.ts.recvs = malloc(sizeof(int) * in.hm.ndev);
        in.ts.holders[0] = 0;
        int m = 0;
        for (int d = 1; d < in.hm.ndev; d++)
            in.ts.recvs[m++] = d;
        xm_task_t *k = &in.ts.tasks[0];
        k->bytes = (int64_t)xt_range(&rng, 1, 40) << 20 | xt_range(&rng, 0, 4095);
        k->box.hi[0] = k->bytes;
        k->ngroups = k->group_size = 1;
        k->nrecv = m;
        assert_int_equal(xm_cluster_init(&in.c, &in.hm), XMESH_SUCCESS);
        in.c.intra_Bps = xt_range(&rng, 0, 1) ? 100e9 : 0.8e9; /* sometimes slower than NIC */
        in.c.latency_s = xt_range(&rng, 0, 20) * 1e-6;
        in.c.chunk_bytes = (int64_t)1 << xt_range(&rng, 16, 22);
        xm_sched_opts_t o = opts(XMESH_SCHEDULER_NAIVE, XMESH_STRATEGY_BROADCAST, 1, 10);
        xm_schedule_t s;
        assert_int_equal(xm_schedule(&in.ts, &in.c, &o, &s), XMESH_SUCCESS);
        /* self copies and intra chains aside, the main chain is the longest route */
        double want = 0;
        for (int q = 0; q < s.nroutes; q++) {
            const xm_route_t *rt = &s.routes[q];
            const int *d = s.route_devs + rt->off;
            int64_t K = (k->bytes + in.c.chunk_bytes - 1) / in.c.chunk_bytes;
            double c = (double)k->bytes / (double)K, T = 0;
            if (rt->len == 1) {
                T = in.c.latency_s + (double)k->bytes / in.c.intra_Bps;
            } else {
                int H = rt->len - 1;
                double *arr = calloc(H + 1, sizeof(double)), *left = calloc(H, sizeof(double));
                for (int64_t j = 0; j < K; j++) {
                    double a = 0; /* arrival of chunk j at the chain head */
                    for (int h = 0; h < H; h++) {
                        double bw = in.hm.host_of[d[h]] == in.hm.host_of[d[h + 1]]
                                        ? in.c.intra_Bps
                                        : in.c.nic_send_Bps;
                        double st = a > left[h] ? a : left[h];
                        left[h] = st + c / bw;
                        a = left[h] + in.c.latency_s;
                    }
                    arr[H] = a;
                }
                T = arr[H];
                free(arr);
                free(left);
            }
            if (T > want)
                want = T;
        }
        if (fabs(s.makespan_s - want) > 1e-9 * want)
            fail_msg("seed %llu it %d: analytic %.12g != chunk events %.12g",
                     (unsigned long long)g_seed, it, s.makespan_s, want);
        xm_schedule_free(&s);
        inst_free(&in);
    }
}

static void test_trace_json(void **state)
{
    (void)state;
    inst_t in;
    make_case(&in, xm_table2[3].shape, xm_table2[3].src, xm_table2[3].dst, xm_table2[3].ss,
              xm_table2[3].ds);
    xm_sched_opts_t o = opts(XMESH_SCHEDULER_ENSEMBLE, XMESH_STRATEGY_BROADCAST, 1, 10000);
    xm_schedule_t s;
    assert_int_equal(xm_schedule(&in.ts, &in.c, &o, &s), XMESH_SUCCESS);
    FILE *f = tmpfile();
    assert_non_null(f);
    xm_sim_result_t res;
    assert_int_equal(xm_simulate(&in.ts, &in.c, &s, &res, f), XMESH_SUCCESS);
    long len = ftell(f);
    rewind(f);
    char *buf = malloc(len + 1);
    assert_int_equal(fread(buf, 1, len, f), (size_t)len);
    buf[len] = 0;
    fclose(f);
    assert_non_null(strstr(buf, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":["));
    assert_non_null(strstr(buf, "\"name\":\"nic 0 recv\""));
    assert_non_null(strstr(buf, "\"name\":\"device 8\""));
    /* 64 tasks x (send + recv NIC event + 2 device events) + metadata */
    int nx = 0;
    for (char *p = buf; (p = strstr(p, "\"ph\":\"X\"")); p++)
        nx++;
    assert_int_equal(nx, 64 * 4);
    assert_true(len > 2 && buf[len - 2] == '}');
    free(buf);
    xm_sim_result_free(&res);
    xm_schedule_free(&s);
    inst_free(&in);
}

/* Splitting: pieces tile each task's box exactly once, keep its holders and
 * receivers, P tasks stay whole; schedules of the pieces are valid. */
static void test_split(void **state)
{
    (void)state;
    uint64_t rng = g_seed ^ 0x6666;
    for (int it = 0; it < 60; it++) {
        inst_t in;
        make_random(&rng, &in, xt_range(&rng, 1, 10), 2, xt_range(&rng, 1, 2));
        xm_taskset_t sp;
        int *parent = NULL;
        assert_int_equal(xm_taskset_split(&in.ts, &in.c, 4096, &sp, &parent), XMESH_SUCCESS);
        assert_true(sp.ntasks >= in.ts.ntasks);
        int64_t *vol = calloc(in.ts.ntasks, sizeof(int64_t));
        for (int q = 0; q < sp.ntasks; q++) {
            int t = parent[q];
            const xm_task_t *a = &in.ts.tasks[t], *b = &sp.tasks[q];
            assert_true(q == 0 || parent[q - 1] <= t);
            for (int d = 0; d < in.ts.ndim; d++) {
                assert_true(b->box.lo[d] >= a->box.lo[d] && b->box.hi[d] <= a->box.hi[d]);
                assert_true(b->box.lo[d] < b->box.hi[d]);
            }
            /* pieces of one task are consecutive and adjacent */
            if (q > 0 && parent[q - 1] == t)
                assert_true(sp.tasks[q - 1].box.hi[0] == b->box.lo[0]);
            if (b->ngroups > 1)
                assert_memory_equal(&a->box, &b->box, sizeof a->box);
            assert_int_equal(b->bytes, xm_box_volume(&b->box, sp.ndim) * (int64_t)sp.elem_size);
            vol[t] += b->bytes;
            assert_int_equal(a->ngroups, b->ngroups);
            assert_int_equal(a->nrecv, b->nrecv);
            assert_memory_equal(in.ts.holders + a->holder_off, sp.holders + b->holder_off,
                                sizeof(int) * a->ngroups * a->group_size);
            assert_memory_equal(in.ts.recvs + a->recv_off, sp.recvs + b->recv_off,
                                sizeof(int) * a->nrecv);
        }
        for (int t = 0; t < in.ts.ntasks; t++)
            assert_int_equal(vol[t], in.ts.tasks[t].bytes);
        inst_t sin = in;
        sin.ts = sp;
        xm_sched_opts_t o = opts(XMESH_SCHEDULER_ENSEMBLE, XMESH_STRATEGY_BROADCAST, it, 3000);
        xm_schedule_t s;
        assert_int_equal(xm_schedule(&sp, &in.c, &o, &s), XMESH_SUCCESS);
        check_routes(&sin, &s, XMESH_STRATEGY_BROADCAST);
        check_sim(&sin, &s);
        xm_schedule_free(&s);
        free(vol);
        free(parent);
        xm_taskset_free(&sp);
        inst_free(&in);
    }
}

/* Plan creation's splitting (xm_schedule_plan): an integrality gap (4
 * equal tasks from 3 replica hosts: 1.5 x the bound whole, ~1 x in pieces)
 * and several NICs (one task per host pair uses one of 8 NICs whole) are
 * closed by pieces; without splitting, or with nothing to gain, the task
 * set is left alone. Deterministic budgets: the choice must not depend on
 * the clock. */
static void test_schedule_plan_split(void **state)
{
    (void)state;
    static const struct {
        int sm[2], dm[2];
        const char *ss, *ds;
        int nics, split, want_split;
        double max_gain; /* split makespan <= max_gain x unsplit */
    } cs[] = {
        {{3, 1}, {4, 1}, "RRR", "S0RR", 1, 1, 1, 0.75},
        {{2, 8}, {2, 8}, "S0RR", "S0RR", 8, 1, 1, 0.30},
        {{3, 1}, {4, 1}, "RRR", "S0RR", 1, 0, 0, 1.0},
        {{2, 4}, {2, 4}, "S0RR", "S0RR", 1, 1, 0, 1.0}, /* meets the bound whole */
    };
    const int64_t shape[3] = {256, 256, 4};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        inst_t in;
        make_case(&in, shape, cs[i].sm, cs[i].dm, cs[i].ss, cs[i].ds);
        in.c.chunk_bytes = 16384;
        in.c.nics_per_host = cs[i].nics;
        xm_sched_opts_t o = opts(XMESH_SCHEDULER_ENSEMBLE, XMESH_STRATEGY_BROADCAST, 1, 20000);
        xm_schedule_t u, s, s2;
        assert_int_equal(xm_schedule(&in.ts, &in.c, &o, &u), XMESH_SUCCESS);
        int n0 = in.ts.ntasks, used = -1;
        assert_int_equal(xm_schedule_plan(&in.ts, &in.c, &o, cs[i].split, &s, &used),
                         XMESH_SUCCESS);
        assert_int_equal(used, cs[i].want_split);
        assert_int_equal(s.ntasks, in.ts.ntasks);
        if (used) {
            assert_true(in.ts.ntasks > n0);
            assert_true(s.makespan_s <= cs[i].max_gain * u.makespan_s);
        } else {
            assert_int_equal(in.ts.ntasks, n0);
            assert_true(s.makespan_s <= u.makespan_s * (1 + 1e-12));
        }
        check_routes(&in, &s, XMESH_STRATEGY_BROADCAST);
        check_sim(&in, &s);
        /* the same inputs choose the same task set and plan (every rank) */
        inst_t again;
        make_case(&again, shape, cs[i].sm, cs[i].dm, cs[i].ss, cs[i].ds);
        again.c.chunk_bytes = 16384;
        again.c.nics_per_host = cs[i].nics;
        assert_int_equal(xm_schedule_plan(&again.ts, &again.c, &o, cs[i].split, &s2, NULL),
                         XMESH_SUCCESS);
        assert_int_equal(again.ts.ntasks, in.ts.ntasks);
        assert_memory_equal(s2.order, s.order, sizeof(int) * s.ntasks);
        assert_true(s2.makespan_s == s.makespan_s);
        xm_schedule_free(&s2);
        inst_free(&again);
        xm_schedule_free(&s);
        xm_schedule_free(&u);
        inst_free(&in);
    }
}

/* ------------------------------------------------- tiny pipelining chunks */

/* Random pipeline settings of the executors (send_ahead, forward_ahead,
 * sync_send) and chunks of a few bytes: many chunks per task, so that a
 * chain's first window counts. */
static void tiny_chunks(uint64_t *rng, xm_cluster_t *c)
{
    c->chunk_bytes = xt_range(rng, 1, 64);
    c->send_ahead = xt_range(rng, 1, 4);
    c->forward_ahead = xt_range(rng, 1, 4);
    c->sync_send = xt_range(rng, 0, 3) == 0;
}

/* Every scheduler (and xm_lower_bound for broadcast) against the makespan
 * and the simulated makespan of its schedule. */
static void check_bound(inst_t *in, uint64_t *rng, int it, const char *what)
{
    xmesh_strategy_t st = xt_range(rng, 0, 3) ? XMESH_STRATEGY_BROADCAST : XMESH_STRATEGY_SENDRECV;
    double lb_any = xm_lower_bound(&in->ts, &in->c);
    for (int k = 0; k < XMESH_SCHEDULER_COUNT_; k++) {
        xm_sched_opts_t o = opts(k, st, it, 200);
        xm_schedule_t s;
        assert_int_equal(xm_schedule(&in->ts, &in->c, &o, &s), XMESH_SUCCESS);
        xm_sim_result_t res;
        assert_int_equal(xm_simulate(&in->ts, &in->c, &s, &res, NULL), XMESH_SUCCESS);
        double ms = res.makespan_s < s.makespan_s ? res.makespan_s : s.makespan_s;
        if (s.lower_bound_s > ms * (1 + 1e-12) ||
            (st == XMESH_STRATEGY_BROADCAST && lb_any > ms * (1 + 1e-12)))
            fail_msg("seed %llu it %d %s %s %s: chunk %lld ahead %d/%d sync %d nics %d: bound "
                     "%.12g (any %.12g) > makespan %.12g (simulated %.12g)",
                     (unsigned long long)g_seed, it, what, xmesh_scheduler_name(k),
                     st == XMESH_STRATEGY_SENDRECV ? "sendrecv" : "broadcast",
                     (long long)in->c.chunk_bytes, in->c.send_ahead, in->c.forward_ahead,
                     in->c.sync_send, in->c.nics_per_host, s.lower_bound_s, lb_any, s.makespan_s,
                     res.makespan_s);
        xm_sim_result_free(&res);
        xm_schedule_free(&s);
    }
}

/* A few small tensors through xm_decompose_many (packed or not) on a pair
 * of 2-d meshes, partial sums among the source shardings. */
static void make_many(uint64_t *rng, inst_t *in)
{
    static const char *const ss[] = {"B,B", "S(0),B", "B,S(1)", "S(0),S(1)", "P,B",
                                     "B,P", "P,S(0)", "S(1),P", "P,P"};
    static const char *const ds[] = {"B,B", "S(0),B", "B,S(1)", "S(1),S(0)", "S(0),S(1)"};
    memset(in, 0, sizeof *in);
    int sm[2] = {xt_range(rng, 1, 3), xt_range(rng, 1, 2)};
    int dm[2] = {xt_range(rng, 1, 3), xt_range(rng, 1, 2)};
    int *sd, *dd;
    assert_int_equal(xm_hostmap_default(sm, 2, dm, 2, xt_range(rng, 0, 1), &in->hm, &sd, &dd),
                     XMESH_SUCCESS);
    enum { MAXN = 6 };
    int n = xt_range(rng, 1, MAXN);
    xm_layout_t L[2][MAXN];
    memset(L, 0, sizeof L);
    for (int i = 0; i < n; i++) {
        int64_t shape[2] = {xt_range(rng, 1, 12), xt_range(rng, 1, 12)};
        for (int s = 0; s < 2; s++) {
            xm_layout_t *l = &L[s][i];
            const int *m = s ? dm : sm;
            l->ndim = 2;
            l->shape[0] = shape[0];
            l->shape[1] = shape[1];
            l->elem_size = 4;
            l->mesh.ndim = 2;
            l->mesh.shape[0] = m[0];
            l->mesh.shape[1] = m[1];
            l->mesh.ndev = m[0] * m[1];
            l->mesh.devs = s ? dd : sd;
            const char *spec = s ? ds[xt_range(rng, 0, 4)] : ss[xt_range(rng, 0, 8)];
            assert_int_equal(xm_spec_parse(spec, 2, 2, &l->spec), XMESH_SUCCESS);
        }
    }
    int pack = xt_range(rng, 0, 1);
    assert_int_equal(xm_decompose_many(n, L[0], L[1], NULL, &in->hm, pack ? 1 << 20 : 0,
                                       xt_range(rng, 16, 2048), &in->ts),
                     XMESH_SUCCESS);
    assert_int_equal(xm_cluster_init(&in->c, &in->hm), XMESH_SUCCESS);
    free(sd);
    free(dd);
}

/* With chunks of a few bytes the lower bound still lies below the makespan
 * of every plan (a P chain whose first hop stays inside a host sends its
 * first send_ahead chunks at intra-host speed). */
static void test_lower_bound_tiny_chunks(void **state)
{
    (void)state;
    uint64_t rng = g_seed ^ 0x7171;
    printf("  test_lower_bound_tiny_chunks: seed %llu\n", (unsigned long long)g_seed);
    for (int it = 0; it < 300; it++) {
        inst_t in;
        if (it % 2) {
            make_random(&rng, &in, xt_range(&rng, 1, 12), 3, xt_range(&rng, 1, 2));
            int64_t lo = 0; /* small tasks: a few to a hundred chunks */
            for (int t = 0; t < in.ts.ntasks; t++) {
                xm_task_t *k = &in.ts.tasks[t];
                k->bytes = xt_range(&rng, 1, 4096);
                k->box.lo[0] = lo;
                k->box.hi[0] = lo += k->bytes;
            }
            in.ts.shape[0] = in.ts.bytes_total = lo;
        } else {
            make_many(&rng, &in);
            in.c.nics_per_host = xt_range(&rng, 1, 2);
            in.c.nic_send_Bps = 1.25e9 * (xt_range(&rng, 0, 1) ? 1.0 : 0.5);
            in.c.nic_recv_Bps = 1.25e9;
            in.c.intra_Bps = xt_range(&rng, 0, 1) ? 100e9 : 5e9;
            in.c.latency_s = xt_range(&rng, 0, 3) * 5e-6;
        }
        tiny_chunks(&rng, &in.c);
        check_bound(&in, &rng, it, it % 2 ? "synthetic" : "many tensors");
        inst_free(&in);
    }
}

int main(void)
{
    g_seed = xt_seed("test_sched");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chain_timing),
        cmocka_unit_test(test_chain_fill_overlap),
        cmocka_unit_test(test_chain_vs_chunk_events),
        cmocka_unit_test(test_routes_and_sim_random),
        cmocka_unit_test(test_lower_bound_random),
        cmocka_unit_test(test_lower_bound_tiny_chunks),
        cmocka_unit_test(test_dfs_matches_brute_force),
        cmocka_unit_test(test_same_seed_same_plan),
        cmocka_unit_test(test_schedule_from_rejects),
        cmocka_unit_test(test_table2_targets),
        cmocka_unit_test(test_trace_json),
        cmocka_unit_test(test_split),
        cmocka_unit_test(test_schedule_plan_split),
        cmocka_unit_test(test_flows_group_host_pairs),
        cmocka_unit_test(test_flows_big_instance),
        cmocka_unit_test(test_suggest_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
