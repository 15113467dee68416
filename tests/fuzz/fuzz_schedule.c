/* Fuzzes the schedulers on random task sets: the input picks hosts, meshes,
 * specs, cluster model and scheduler. Either a clear error comes back or:
 * order is a permutation, every sender holds its group's box, every receiver
 * of a task appears in exactly one of its routes, and the lower bound does
 * not exceed the simulated makespan. Huge shapes (byte size near or past
 * 2^63) are in reach too. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xm_sched.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int take(const uint8_t **p, const uint8_t *end, int mod)
{
    if (*p >= end)
        return 0;
    return *(*p)++ % mod;
}

static void check(const xm_taskset_t *ts, const xm_schedule_t *s)
{
    char *seen = calloc(ts->ntasks + 1, 1);
    for (int i = 0; i < ts->ntasks; i++) {
        int t = s->order[i];
        if (t < 0 || t >= ts->ntasks || seen[t]++)
            abort(); /* not a permutation */
    }
    for (int t = 0; t < ts->ntasks; t++) {
        const xm_task_t *k = &ts->tasks[t];
        for (int g = 0; g < k->ngroups; g++) {
            int dev = s->sender[t * s->max_groups + g], ok = 0;
            for (int j = 0; j < k->group_size; j++)
                ok |= ts->holders[k->holder_off + g * k->group_size + j] == dev;
            if (!ok)
                abort(); /* sender does not hold its group's box */
        }
        for (int i = 0; i < k->nrecv; i++) {
            int r = ts->recvs[k->recv_off + i], count = 0;
            for (int q = s->task_route_off[t]; q < s->task_route_off[t + 1]; q++) {
                const xm_route_t *rt = &s->routes[q];
                if (rt->task != t)
                    abort();
                if (rt->len == 1)
                    count += s->route_devs[rt->off] == r;
                for (int j = rt->nsrc; j < rt->len; j++)
                    count += s->route_devs[rt->off + j] == r;
            }
            if (count != 1)
                abort(); /* receiver served zero or several times */
        }
    }
    if (s->lower_bound_s > s->makespan_s * (1 + 1e-9) + 1e-12)
        abort();
    free(seen);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *p = data, *end = data + size;
    int nd = 1 + take(&p, end, 3);
    int64_t shape[XM_MAX_DIMS];
    for (int d = 0; d < nd; d++) {
        /* bytes >= 240 pick huge dims (up to 2^62): the decomposer must
         * refuse what overflows, the schedulers must cope with the rest */
        int v = take(&p, end, 256);
        shape[d] = v < 240 ? 1 + v % 16 : (int64_t)1 << (47 + (v - 240));
    }
    int ms[2][2], devs[2][16];
    xm_layout_t l[2];
    memset(l, 0, sizeof l);
    int per_host = 1 + take(&p, end, 4), overlap = take(&p, end, 4) == 0;
    for (int side = 0; side < 2; side++) {
        xm_layout_t *x = &l[side];
        x->ndim = nd;
        x->elem_size = 4;
        for (int d = 0; d < nd; d++)
            x->shape[d] = shape[d];
        x->mesh.ndim = 2;
        ms[side][0] = 1 + take(&p, end, 4);
        ms[side][1] = 1 + take(&p, end, 4);
        x->mesh.shape[0] = ms[side][0];
        x->mesh.shape[1] = ms[side][1];
        x->mesh.ndev = ms[side][0] * ms[side][1];
        for (int i = 0; i < x->mesh.ndev; i++)
            devs[side][i] = side && !overlap ? 16 + i : i;
        x->mesh.devs = devs[side];
        char spec[32];
        int n = 0;
        for (int a = 0; a < 2; a++) {
            int what = take(&p, end, side ? 3 : 4);
            if (a)
                spec[n++] = ',';
            if (what == 1)
                n += snprintf(spec + n, sizeof spec - n, "S(%d)", take(&p, end, nd));
            else if (what == 3)
                spec[n++] = 'P';
            else
                spec[n++] = 'B';
        }
        spec[n] = '\0';
        if (xm_spec_parse(spec, nd, 2, &x->spec))
            return 0;
    }
    int host_of[32];
    for (int i = 0; i < 32; i++)
        host_of[i] = i < 16 ? i / per_host : 16 + (i - 16) / per_host;
    xm_hostmap_t hm = {.ndev = 32, .nhosts = 32, .host_of = host_of};
    xm_taskset_t ts;
    if (xm_decompose(&l[0], &l[1], &hm, &ts))
        return 0;
    xm_cluster_t c;
    if (xm_cluster_init(&c, &hm))
        abort();
    c.nics_per_host = 1 + take(&p, end, 2);
    c.nic_recv_Bps = c.nic_send_Bps * (1 + take(&p, end, 3));
    c.chunk_bytes = 64 << take(&p, end, 10);
    xm_sched_opts_t o = {.kind = (xmesh_scheduler_t)take(&p, end, XMESH_SCHEDULER_COUNT_),
                         .seed = take(&p, end, 256),
                         .strategy =
                             take(&p, end, 2) ? XMESH_STRATEGY_SENDRECV : XMESH_STRATEGY_BROADCAST,
                         .max_evals = 2000};
    xm_schedule_t s;
    if (!xm_schedule(&ts, &c, &o, &s)) {
        check(&ts, &s);
        xm_schedule_free(&s);
    }
    xm_cluster_free(&c);
    xm_taskset_free(&ts);
    return 0;
}
