/*
 * CPU unit tests of the device-independent half of the NCCL backend
 * (lib/cuda/devplan.c, compiled straight into this test): pack index math,
 * f16/bf16 conversions, communicator-cache keys, and whole reshardings run
 * through a CPU emulation of NCCL grouped send/recv that executes exactly
 * what the GPU executor issues: the core's per-rank program (the one the
 * MPI executor runs), cut into lockstep rounds and lowered to device ops by
 * xm_devplan_lower, one NCCL group per round, with the CPU reference of
 * every kernel. No GPU is involved: this is what can be
 * checked here. Random cases print their seed; XMESH_TEST_SEED replays.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "program_oracle.h"
#include "xm_devplan.h"

typedef po_case_t rcase_t;

static uint64_t g_seed;

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static int64_t rnd_in(uint64_t *s, int64_t lo, int64_t hi) /* [lo, hi] */
{
    return lo + (int64_t)(rnd(s) % (uint64_t)(hi - lo + 1));
}

/* ------------------------------------------------------ pack descriptors */

static void test_packdesc(void **state)
{
    (void)state;
    uint64_t s = g_seed ^ 0x9876;
    for (int it = 0; it < 500; it++) {
        int ndim = (int)rnd_in(&s, 0, 5);
        int64_t lo[XM_MAX_DIMS], hi[XM_MAX_DIMS];
        xm_box_t b;
        memset(&b, 0, sizeof b);
        for (int d = 0; d < ndim; d++) {
            lo[d] = rnd_in(&s, 0, 20);
            hi[d] = lo[d] + rnd_in(&s, 1, 6);
            b.lo[d] = rnd_in(&s, lo[d], hi[d] - 1);
            b.hi[d] = rnd_in(&s, b.lo[d] + (it % 23 == 0 ? 0 : 1), hi[d]);
        }
        xm_packdesc_t p;
        xm_packdesc_make(ndim, lo, hi, &b, &p);
        int64_t vol = xm_box_volume(&b, ndim), want0 = -1, naive[6 * 6 * 6 * 6 * 6];
        assert_int_equal(p.count, vol);
        assert_int_equal(p.first, 0);
        assert_true(p.ndim >= 1 && p.ndim <= (ndim > 0 ? ndim : 1));
        for (int64_t k = 0; k < vol; k++) {
            /* naive: box multi-index -> block row-major index */
            int64_t rem = k, idx = 0, m[XM_MAX_DIMS];
            for (int d = ndim - 1; d >= 0; d--) {
                int64_t e = b.hi[d] - b.lo[d];
                m[d] = b.lo[d] + rem % e;
                rem /= e;
            }
            for (int d = 0; d < ndim; d++)
                idx = idx * (hi[d] - lo[d]) + (m[d] - lo[d]);
            assert_int_equal(xm_pack_index(&p, k), idx);
            if (k == 0)
                want0 = idx;
            naive[k] = idx;
        }
        /* a linear range [first, first + count) of the same box */
        if (vol > 0) {
            xm_packdesc_t q = p;
            q.first = rnd_in(&s, 0, vol - 1);
            q.count = rnd_in(&s, 0, vol - q.first);
            for (int64_t k = 0; k < q.count; k++)
                assert_int_equal(xm_pack_index(&q, k), naive[q.first + k]);
        }
        (void)want0;
    }
    /* Coalescing: a slab of whole rows is one contiguous run. */
    int64_t lo[3] = {0, 0, 0}, hi[3] = {4, 5, 6};
    xm_box_t slab = {{1, 0, 0}, {3, 5, 6}};
    xm_packdesc_t p;
    xm_packdesc_make(3, lo, hi, &slab, &p);
    assert_int_equal(p.ndim, 1);
    assert_true(xm_pack_contiguous(&p));
    assert_int_equal(p.base, 30);
    assert_int_equal(p.count, 60);
    /* A column is strided: one dim of stride 6*5... */
    xm_box_t col = {{0, 2, 3}, {4, 3, 4}};
    xm_packdesc_make(3, lo, hi, &col, &p);
    assert_int_equal(p.ndim, 1);
    assert_int_equal(p.stride[0], 30);
    assert_false(xm_pack_contiguous(&p));
    /* Inner box: rows of 4 of a 6-wide block stay 2 dims after merging 0,1? no:
     * dims 0 and 1 merge only if the box spans dim 1 fully. */
    xm_box_t inner = {{0, 0, 1}, {2, 5, 5}};
    xm_packdesc_make(3, lo, hi, &inner, &p);
    assert_int_equal(p.ndim, 2);
    assert_int_equal(p.ext[0], 10);
    assert_int_equal(p.stride[0], 6);
    assert_int_equal(p.ext[1], 4);
}

/* ------------------------------------------------------------ conversions */

static void test_f16(void **state)
{
    (void)state;
    assert_int_equal(xm_f32_to_f16(1.0f), 0x3c00);
    assert_int_equal(xm_f32_to_f16(-2.0f), 0xc000);
    assert_int_equal(xm_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(xm_f32_to_f16(65519.0f), 0x7bff);
    assert_int_equal(xm_f32_to_f16(65520.0f), 0x7c00);
    assert_int_equal(xm_f32_to_f16(INFINITY), 0x7c00);
    assert_int_equal(xm_f32_to_f16(ldexpf(1, -24)), 0x0001);
    assert_int_equal(xm_f32_to_f16(ldexpf(1, -25)), 0x0000); /* tie to even */
    assert_int_equal(xm_f32_to_f16(ldexpf(3, -26)), 0x0001); /* 0.75 ulp up */
    assert_int_equal(xm_f32_to_f16(ldexpf(3, -25)), 0x0002); /* 1.5 ulp: tie to even */
    assert_int_equal(xm_f32_to_f16(ldexpf(1, -14)), 0x0400); /* smallest normal */
    assert_int_equal(xm_f32_to_f16(1.0f / 3.0f), 0x3555);
    assert_int_equal(xm_f32_to_f16(1.0f + ldexpf(1, -11)), 0x3c00); /* tie to even */
    assert_int_equal(xm_f32_to_f16(1.0f + ldexpf(3, -11)), 0x3c02); /* tie to even up */
    assert_true(isnan(xm_f16_to_f32(xm_f32_to_f16(NAN))));
    assert_true(xm_f16_to_f32(0x0001) == ldexpf(1, -24));
    assert_true(xm_f16_to_f32(0x7bff) == 65504.0f);
    assert_true(xm_f16_to_f32(0xfc00) == -INFINITY);
    /* Every non-NaN half survives a trip through f32. */
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff))
            continue;
        assert_int_equal(xm_f32_to_f16(xm_f16_to_f32((uint16_t)h)), h);
    }
    /* Rounding agrees with the exact nearest half for random floats. */
    uint64_t s = g_seed ^ 0x4242;
    for (int i = 0; i < 20000; i++) {
        float f = ldexpf((float)rnd_in(&s, -(1 << 23), 1 << 23),
                         (int)rnd_in(&s, -50, -8)); /* |f| < 2^15: finite */
        uint16_t h = xm_f32_to_f16(f);
        double err = fabs((double)xm_f16_to_f32(h) - f);
        /* neighbours one ulp away are not closer */
        uint16_t up = (uint16_t)(h + 1), dn = (uint16_t)(h - 1);
        if ((up & 0x7fff) < 0x7c00)
            assert_true(err <= fabs((double)xm_f16_to_f32(up) - f));
        if ((h & 0x7fff) != 0)
            assert_true(err <= fabs((double)xm_f16_to_f32(dn) - f));
    }
}

static void test_bf16(void **state)
{
    (void)state;
    assert_int_equal(xm_f32_to_bf16(1.0f), 0x3f80);
    float tie, up;
    uint32_t t = 0x3f808000u, u = 0x3f818000u;
    memcpy(&tie, &t, 4);
    memcpy(&up, &u, 4);
    assert_int_equal(xm_f32_to_bf16(tie), 0x3f80);
    assert_int_equal(xm_f32_to_bf16(up), 0x3f82);
    assert_true(isnan(xm_bf16_to_f32(xm_f32_to_bf16(NAN))));
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7f80) == 0x7f80 && (h & 0x7f))
            continue;
        assert_int_equal(xm_f32_to_bf16(xm_bf16_to_f32((uint16_t)h)), h);
    }
}

/* ---------------------------------------------------- communicator cache */

static void test_commkey(void **state)
{
    (void)state;
    int a[4] = {7, 3, 5, 3}, b[3] = {1, 5, 9};
    xm_commkey_t k, k2, k3;
    assert_int_equal(xm_commkey_make(a, 4, b, 3, &k), XMESH_SUCCESS);
    int want[6] = {1, 3, 5, 7, 9};
    assert_int_equal(k.n, 5);
    assert_memory_equal(k.ranks, want, sizeof(int) * 5);
    assert_int_equal(xm_commkey_index(&k, 7), 3);
    assert_int_equal(xm_commkey_index(&k, 1), 0);
    assert_int_equal(xm_commkey_index(&k, 4), -1);
    /* Same set in another order and split: the same communicator. */
    int c[5] = {9, 7, 5, 3, 1};
    assert_int_equal(xm_commkey_make(c, 5, NULL, 0, &k2), XMESH_SUCCESS);
    assert_true(xm_commkey_equal(&k, &k2));
    int d[4] = {1, 3, 5, 7};
    assert_int_equal(xm_commkey_make(d, 4, NULL, 0, &k3), XMESH_SUCCESS);
    assert_false(xm_commkey_equal(&k, &k3));

    /* Cache: hit on an equal key, LRU eviction among unreferenced entries,
     * no eviction when all are referenced. */
    xm_commcache_t cc;
    int dummy[3], i0, i1;
    assert_int_equal(xm_commcache_init(&cc, 2), XMESH_SUCCESS);
    assert_int_equal(xm_commcache_find(&cc, &k), -1);
    assert_int_equal(xm_commcache_victim(&cc), 0);
    assert_int_equal(xm_commcache_insert(&cc, &k, &dummy[0], &i0), XMESH_SUCCESS);
    assert_null(k.ranks); /* moved */
    assert_int_equal(xm_commcache_find(&cc, &k2), i0);
    assert_ptr_equal(cc.e[i0].comm, &dummy[0]);
    assert_int_equal(xm_commcache_insert(&cc, &k3, &dummy[1], &i1), XMESH_SUCCESS);
    cc.e[i0].refs = 1;
    cc.e[i1].refs = 1;
    assert_int_equal(xm_commcache_victim(&cc), -1); /* full, all in use */
    cc.e[i0].refs = 0;
    cc.e[i1].refs = 0;
    assert_int_equal(xm_commcache_find(&cc, &k2), i0); /* i0 now most recent */
    assert_int_equal(xm_commcache_victim(&cc), i1);
    /* ranks disagree on refs: only entries free everywhere may go */
    int ok_none[2] = {0, 0}, ok_i0[2] = {1, 0};
    assert_int_equal(xm_commcache_victim_masked(&cc, ok_none), -1);
    assert_int_equal(xm_commcache_victim_masked(&cc, ok_i0), i0);
    int before = (int)cc.clock;
    assert_int_equal(xm_commcache_peek(&cc, &k2), i0);
    assert_int_equal((int)cc.clock, before); /* peek leaves the LRU order alone */
    xm_commcache_remove(&cc, i1);
    assert_int_equal(cc.n, 1);
    assert_int_equal(xm_commcache_find(&cc, &k2), 0);
    xm_commcache_free(&cc);
    xm_commkey_free(&k2);
    assert_int_equal(xm_commcache_init(&cc, 0), XMESH_ERR_INVALID_ARGUMENT);
}

/* ------------------------------------------ CPU emulation of the executor */

/* Stand-in schedule (the real scheduler lives in scheduler/; this one only
 * needs to produce valid routes of every shape the executor must handle):
 * random order and senders; receivers that hold the box copy it locally
 * (len-1 routes); the others form one chain (broadcast) or one route each
 * (sendrecv), after the chosen sender of every partial group. */
static void fake_schedule(const xm_taskset_t *ts, int sendrecv, uint64_t *rs, xm_schedule_t *out)
{
    xm_schedule_t s;
    memset(&s, 0, sizeof s);
    s.ntasks = ts->ntasks;
    s.order = malloc(sizeof(int) * (ts->ntasks + 1));
    s.max_groups = 1;
    for (int t = 0; t < ts->ntasks; t++)
        if (ts->tasks[t].ngroups > s.max_groups)
            s.max_groups = ts->tasks[t].ngroups;
    s.sender = malloc(sizeof(int) * (ts->ntasks * s.max_groups + 1));
    int cap_r = 1, cap_d = 1;
    for (int t = 0; t < ts->ntasks; t++) {
        cap_r += ts->tasks[t].nrecv;
        cap_d += ts->tasks[t].nrecv * (ts->tasks[t].ngroups + 1);
    }
    s.routes = malloc(sizeof *s.routes * cap_r);
    s.route_devs = malloc(sizeof(int) * cap_d);
    s.task_route_off = malloc(sizeof(int) * (ts->ntasks + 1));
    for (int t = 0; t < ts->ntasks; t++)
        s.order[t] = t;
    for (int t = ts->ntasks - 1; t > 0; t--) {
        int j = (int)(rnd(rs) % (uint64_t)(t + 1)), x = s.order[t];
        s.order[t] = s.order[j];
        s.order[j] = x;
    }
    int nd = 0;
    for (int t = 0; t < ts->ntasks; t++) {
        const xm_task_t *k = &ts->tasks[t];
        const int *h = ts->holders + k->holder_off, *rv = ts->recvs + k->recv_off;
        s.task_route_off[t] = s.nroutes;
        for (int g = 0; g < k->ngroups; g++)
            s.sender[t * s.max_groups + g] = h[g * k->group_size + rnd(rs) % k->group_size];
        /* pass 0: local copies; pass 1: the chain / the send-recv routes
         * (a chain's devices must be consecutive in route_devs) */
        int chain_start = -1;
        for (int pass = 0; pass < 2; pass++)
            for (int i = 0; i < k->nrecv; i++) {
                int holds = 0;
                for (int j = 0; k->ngroups == 1 && j < k->group_size; j++)
                    holds |= h[j] == rv[i];
                if (holds != (pass == 0))
                    continue;
                if (holds) {
                    s.routes[s.nroutes++] = (xm_route_t){t, 1, 1, nd};
                    s.route_devs[nd++] = rv[i];
                    continue;
                }
                if (sendrecv || chain_start < 0) {
                    chain_start = s.nroutes;
                    s.routes[s.nroutes++] = (xm_route_t){t, k->ngroups, k->ngroups, nd};
                    for (int g = 0; g < k->ngroups; g++)
                        s.route_devs[nd++] = s.sender[t * s.max_groups + g];
                }
                xm_route_t *r = &s.routes[chain_start];
                assert_int_equal(r->off + r->len, nd);
                s.route_devs[nd++] = rv[i];
                r->len++;
            }
    }
    s.task_route_off[ts->ntasks] = s.nroutes;
    *out = s;
}

static void free_schedule(xm_schedule_t *s)
{
    free(s->order);
    free(s->sender);
    free(s->routes);
    free(s->route_devs);
    free(s->task_route_off);
}

static int64_t elem_value(int64_t gidx, int p, int G)
{
    int64_t T = (gidx * 37 + 11) % 201 - 100;
    int64_t D = (gidx * 13 + p) % 7 - 3;
    return p == 0 ? T - (G - 1) * D : D;
}

static int64_t load(xmesh_dtype_t dt, const void *base, int64_t i)
{
    switch (dt) {
    case XMESH_U8:
    case XMESH_I8:
        return ((const uint8_t *)base)[i];
    case XMESH_I32:
        return ((const int32_t *)base)[i];
    case XMESH_I64:
        return ((const int64_t *)base)[i];
    case XMESH_F16:
        return llroundf(xm_f16_to_f32(((const uint16_t *)base)[i]));
    case XMESH_BF16:
        return llroundf(xm_bf16_to_f32(((const uint16_t *)base)[i]));
    case XMESH_F32:
        return llroundf(((const float *)base)[i]);
    case XMESH_F64:
        return llround(((const double *)base)[i]);
    default:
        fail();
    }
    return 0;
}

/* A send of the current round, waiting for its receive. */
typedef struct {
    int from, to, acc, matched;
    int64_t count, bytes;
    const char *data;
} sent_t;

/* sched: 0 = the stand-in above; k > 0 = the real scheduler (ensemble,
 * default budget) on a cluster model with k NICs per host. */
static int run_case_sched(const rcase_t *c, uint64_t seed, int sched, char *err, size_t errlen)
{
    po_world_t w;
    po_world_init(c, &w);
    uint64_t rs = seed | 1;
    xm_schedule_t s;
    xm_cluster_t cl;
    if (sched == 0) {
        fake_schedule(&w.ts, c->strategy == XMESH_STRATEGY_SENDRECV, &rs, &s);
    } else {
        assert_int_equal(xm_cluster_init(&cl, &w.hosts), XMESH_SUCCESS);
        cl.nics_per_host = sched;
        cl.chunk_bytes = c->chunk;
        xm_sched_opts_t so = {.kind = (xmesh_scheduler_t)(seed % XMESH_SCHEDULER_COUNT_),
                              .budget_us = 2000,
                              .seed = seed,
                              /* all-gather: senders and order from the
                                 send/recv model, chains built by devplan */
                              .strategy = c->strategy == XMESH_STRATEGY_BROADCAST
                                              ? XMESH_STRATEGY_BROADCAST
                                              : XMESH_STRATEGY_SENDRECV};
        if (xm_schedule(&w.ts, &cl, &so, &s))
            fail_msg("xm_schedule: %s", xmesh_last_error());
    }

    const int n = w.hosts.ndev;
    const size_t es = w.src.elem_size;
    xm_prog_in_t in = po_prog_in(c, &w, &s);
    xm_devplan_t *dp = calloc(n, sizeof *dp);
    xm_rounds_it_t *it = calloc(n, sizeof *it);
    char **sbuf = calloc(n, sizeof(char *)), **dbuf = calloc(n, sizeof(char *));
    char **pool = calloc(n, sizeof(char *));
    po_blk_t *sb = calloc(n, sizeof *sb), *db = calloc(n, sizeof *db);
    xm_op_t **ops = calloc(n, sizeof(xm_op_t *));
    int *nops = calloc(n, sizeof(int)), *done = calloc(n, sizeof(int));
    int64_t *cur = calloc(n, sizeof(int64_t)), nrounds = 0;
    sent_t *sent = NULL;
    int nsent = 0, cap_sent = 0, bad = 0;
    for (int r = 0; r < n; r++) {
        if (xm_devplan_build(&in, r, &dp[r]))
            fail_msg("device plan of rank %d: %s", r, xmesh_last_error());
        nrounds = dp[r].nrounds;
        po_block_of(&w.src, r, &sb[r]);
        po_block_of(&w.dst, r, &db[r]);
        sbuf[r] = malloc(sb[r].n * es + 1);
        dbuf[r] = malloc(db[r].n * es + 1);
        memset(dbuf[r], 0xA5, db[r].n * es); /* poison: every element must be written */
        int si = xm_mesh_find(&w.src.mesh, r), G = 1;
        int pc = si >= 0 ? po_partial_coord(&w.src, si, &G) : 0;
        for (int64_t k = 0; k < sb[r].n; k++)
            po_store(c->dt, sbuf[r], k, elem_value(po_global_index(&w.src, &sb[r], k), pc, G));
        pool[r] = calloc(1, (size_t)dp[r].pool_bytes + 1);
        assert_int_equal(xm_rounds_init(&dp[r].prog, &it[r]), XMESH_SUCCESS);
    }
    /* Fetches rank r's next round, lowered exactly as the NCCL backend
     * lowers it. */
#define FETCH(r)                                                                                   \
    do {                                                                                           \
        const xm_rop_t *ro_;                                                                       \
        int k_ = xm_rounds_next(&dp[r].prog, &it[r], &cur[r], &ro_);                               \
        assert_true(k_ >= 0);                                                                      \
        done[r] = k_ == 0;                                                                         \
        ops[r] = realloc(ops[r], sizeof(xm_op_t) * (k_ + 1));                                      \
        nops[r] = k_ ? xm_devplan_lower(&dp[r], ro_, k_, ops[r]) : 0;                              \
        assert_true(nops[r] >= 0);                                                                 \
    } while (0)
    for (int r = 0; r < n; r++)
        FETCH(r);
    for (int64_t t = 0; t < nrounds && !bad; t++) {
        for (int r = 0; r < n; r++) {
            if (done[r] || cur[r] != t)
                continue;
            assert_true(cur[r] >= t);
            const xm_program_t *p = &dp[r].prog;
            for (int i = 0; i < nops[r]; i++) {
                const xm_op_t *o = &ops[r][i];
                if (i > 0)
                    assert_true(ops[r][i - 1].phase <= o->phase);
                size_t ws = o->acc ? p->acc_es : es;
                if (o->kind != XM_OP_COPY)
                    assert_true(o->buf >= 0 && o->buf + o->count * (int64_t)ws <= dp[r].pool_bytes);
                /* inside a group, receives and sends run concurrently:
                 * a receive never overwrites what a send reads */
                for (int j = 0; o->kind == XM_OP_RECV && j < nops[r]; j++) {
                    const xm_op_t *x = &ops[r][j];
                    if (x->kind != XM_OP_SEND)
                        continue;
                    int64_t xe = x->buf + x->count * (int64_t)(x->acc ? p->acc_es : es);
                    assert_true(o->buf + o->count * (int64_t)ws <= x->buf || xe <= o->buf);
                }
            }
        }
        for (int phase = 0; phase < 3 && !bad; phase++)
            for (int pass = 0; pass < (phase == 1 ? 2 : 1) && !bad; pass++)
                for (int r = 0; r < n && !bad; r++) {
                    if (done[r] || cur[r] != t)
                        continue;
                    const xm_program_t *p = &dp[r].prog;
                    for (int i = 0; i < nops[r] && !bad; i++) {
                        xm_op_t *o = &ops[r][i];
                        if (o->phase != phase)
                            continue;
                        size_t ws = o->acc ? p->acc_es : es;
                        char *buf = pool[r] + o->buf;
                        switch (o->kind) {
                        case XM_OP_COPY:
                            if (pass == 0)
                                xm_ref_copy(&o->desc, sbuf[r], &o->desc2, dbuf[r], es);
                            break;
                        case XM_OP_PACK:
                            xm_ref_pack(&o->desc, o->from_dst ? dbuf[r] : sbuf[r], buf, c->dt,
                                        o->acc);
                            break;
                        case XM_OP_REDUCE:
                            xm_ref_reduce(&o->desc, sbuf[r], buf, o->acc,
                                          o->convert_out ? pool[r] + o->out : NULL, c->dt);
                            break;
                        case XM_OP_UNPACK:
                            xm_ref_unpack(&o->desc, buf, dbuf[r], es);
                            break;
                        case XM_OP_SEND:
                            if (pass != 0)
                                break;
                            if (nsent == cap_sent) {
                                cap_sent = 2 * cap_sent + 16;
                                sent = realloc(sent, sizeof *sent * cap_sent);
                                assert_non_null(sent);
                            }
                            sent[nsent++] = (sent_t){
                                r, o->peer, o->acc, 0, o->count, o->count * (int64_t)ws, buf};
                            break;
                        case XM_OP_RECV: {
                            if (pass != 1)
                                break;
                            /* NCCL matches the n-th send q->r with the n-th
                             * receive r<-q of the group */
                            int q = o->peer, j = 0;
                            assert_true(q >= 0 && q < n);
                            while (j < nsent &&
                                   (sent[j].matched || sent[j].from != q || sent[j].to != r))
                                j++;
                            if (j == nsent) {
                                snprintf(err, errlen,
                                         "round %lld: rank %d waits for rank %d: NCCL would hang",
                                         (long long)t, r, q);
                                bad = 1;
                                break;
                            }
                            if (sent[j].count != o->count || sent[j].acc != o->acc) {
                                snprintf(err, errlen,
                                         "round %lld: rank %d sends %lld%s to %d which expects "
                                         "%lld%s",
                                         (long long)t, q, (long long)sent[j].count,
                                         sent[j].acc ? " acc" : "", r, (long long)o->count,
                                         o->acc ? " acc" : "");
                                bad = 1;
                            }
                            memcpy(buf, sent[j].data, (size_t)sent[j].bytes);
                            sent[j].matched = 1;
                            break;
                        }
                        default:
                            fail_msg("unknown op kind %d", o->kind);
                        }
                    }
                }
        for (int j = 0; j < nsent && !bad; j++)
            if (!sent[j].matched) {
                snprintf(err, errlen, "round %lld: send %d->%d never received in its group",
                         (long long)t, sent[j].from, sent[j].to);
                bad = 1;
            }
        nsent = 0;
        for (int r = 0; r < n; r++)
            if (!done[r] && cur[r] == t)
                FETCH(r);
    }
#undef FETCH
    for (int r = 0; r < n && !bad; r++)
        if (!done[r]) {
            snprintf(err, errlen, "rank %d has work after the last round %lld", r,
                     (long long)nrounds);
            bad = 1;
        }
    /* Every element of every destination block. */
    for (int r = 0; r < n && !bad; r++) {
        int G = 1;
        if (db[r].n)
            po_partial_coord(&w.src, 0, &G);
        for (int64_t k = 0; k < db[r].n && !bad; k++) {
            int64_t g = po_global_index(&w.dst, &db[r], k), want = 0;
            for (int p = 0; p < G; p++)
                want += elem_value(g, p, G);
            int64_t got = load(c->dt, dbuf[r], k);
            if (c->dt == XMESH_U8 || c->dt == XMESH_I8)
                want &= 0xff;
            if (got != want) {
                snprintf(err, errlen, "rank %d dst element %lld (global %lld): got %lld want %lld",
                         r, (long long)k, (long long)g, (long long)got, (long long)want);
                bad = 1;
            }
        }
    }
    for (int r = 0; r < n; r++) {
        xm_devplan_free(&dp[r]);
        xm_rounds_free(&it[r]);
        free(sbuf[r]);
        free(dbuf[r]);
        free(pool[r]);
        free(ops[r]);
    }
    free(dp);
    free(it);
    free(sbuf);
    free(dbuf);
    free(pool);
    free(sb);
    free(db);
    free(ops);
    free(nops);
    free(done);
    free(cur);
    free(sent);
    if (sched == 0) {
        free_schedule(&s);
    } else {
        xm_schedule_free(&s);
        xm_cluster_free(&cl);
    }
    po_world_free(&w);
    return bad;
}

static int run_case(const rcase_t *c, uint64_t seed, char *err, size_t errlen)
{
    /* the stand-in schedule, then the real scheduler with 1 and 2 NICs */
    for (int sched = 0; sched <= 2; sched++)
        if (run_case_sched(c, seed, sched, err, errlen)) {
            size_t n = strlen(err);
            snprintf(err + n, errlen - n, " [%s schedule]",
                     sched == 0   ? "stand-in"
                     : sched == 1 ? "real, 1 NIC"
                                  : "real, 2 NICs");
            return 1;
        }
    return 0;
}

static void test_emulated_matrix(void **state)
{
    (void)state;
    /* Same kinds of cases as the MPI matrix: the paper's shapes (scaled
     * down), uneven splits, partial sums, overlapping meshes, every dtype,
     * broadcast chains and send/recv, chunks small enough to pipeline. */
    const rcase_t cases[] = {
        {3, {8, 6, 4}, XMESH_I32, 2, {2, 4}, "S0RR", 2, {2, 4}, "S0RR", 0, 64, 0},
        {3, {8, 6, 4}, XMESH_I32, 2, {2, 4}, "RRR", 2, {2, 4}, "S0RR", 0, 64, 0},
        {3, {8, 6, 4}, XMESH_F32, 2, {2, 4}, "RS0R", 2, {2, 4}, "S0RR", 0, 48, 0},
        {3, {8, 8, 4}, XMESH_I64, 2, {2, 4}, "RS01R", 2, {2, 4}, "S01RR", 0, 40, 0},
        {3, {8, 6, 4}, XMESH_F64, 2, {2, 4}, "S1RR", 2, {2, 4}, "S0RR", 0, 64, 1},
        {3, {12, 4, 3}, XMESH_I32, 2, {2, 4}, "S0RR", 2, {3, 4}, "S0RR", 0, 32, 0},
        {3, {8, 6, 4}, XMESH_U8, 2, {1, 4}, "S1RR", 2, {2, 4}, "RRR", 0, 16, 0},
        {3, {6, 5, 4}, XMESH_I32, 2, {2, 3}, "RRR", 2, {3, 2}, "RRR", 0, 24, 0},
        {3, {8, 6, 4}, XMESH_F16, 2, {2, 4}, "RS0R", 2, {2, 4}, "RRS0", 0, 16, 0},
        /* uneven: 7 and 5 over 3 and 2 */
        {2, {7, 5}, XMESH_I32, 1, {3}, "S0R", 1, {2}, "RS0", 0, 8, 0},
        {2, {7, 5}, XMESH_BF16, 2, {1, 3}, "RS1", 1, {4}, "S0R", 0, 6, 1},
        /* partial sums: SBP "P" on a source mesh axis */
        {2, {6, 4}, XMESH_I32, 2, {2, 2}, "S(0),P", 1, {2}, "S(1)", 0, 8, 0},
        {2, {6, 4}, XMESH_F16, 2, {2, 2}, "P,S(1)", 2, {2, 2}, "B,S(0)", 0, 4, 0},
        {2, {5, 3}, XMESH_BF16, 2, {2, 2}, "P,P", 1, {3}, "S(0)", 0, 6, 1},
        {1, {9}, XMESH_F32, 1, {3}, "P", 1, {2}, "B", 0, 8, 0},
        /* overlapping meshes: receivers that hold the box copy locally */
        {2, {8, 6}, XMESH_I32, 1, {4}, "S0R", 1, {4}, "RS0", 1, 16, 0},
        {2, {8, 6}, XMESH_F64, 1, {4}, "RR", 1, {4}, "S0R", 1, 16, 0},
        {2, {6, 4}, XMESH_F16, 1, {2}, "P", 1, {4}, "S(0)", 1, 8, 0},
        /* 0-d and a single huge chunk */
        {0, {0}, XMESH_I64, 1, {2}, "", 1, {3}, "", 0, 8, 0},
        {2, {16, 16}, XMESH_I8, 1, {2}, "S0R", 1, {2}, "RS0", 0, 1 << 20, 0},
    };
    char err[512];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        for (int k = 0; k < XMESH_STRATEGY_COUNT_; k++) {
            rcase_t c = cases[i];
            c.strategy = (xmesh_strategy_t)((c.strategy + k) % XMESH_STRATEGY_COUNT_);
            if (run_case(&c, g_seed + i, err, sizeof err))
                fail_msg("case %zu (%s -> %s, %s, %s): %s", i, c.src_spec, c.dst_spec,
                         xmesh_dtype_name(c.dt), xmesh_strategy_name(c.strategy), err);
        }
    }
}

static void random_spec(uint64_t *s, int ndim, int mesh_nd, int allow_p, char *buf, size_t len)
{
    buf[0] = 0;
    for (int a = 0; a < mesh_nd; a++) {
        int64_t k = rnd_in(s, 0, ndim + (allow_p ? 1 : 0));
        char tok[8];
        if (k < ndim)
            snprintf(tok, sizeof tok, "S(%d)", (int)k);
        else if (k == ndim)
            snprintf(tok, sizeof tok, "B");
        else
            snprintf(tok, sizeof tok, "P");
        strncat(buf, a ? "," : "", len - strlen(buf) - 1);
        strncat(buf, tok, len - strlen(buf) - 1);
    }
}

static void test_emulated_random(void **state)
{
    (void)state;
    uint64_t s = g_seed ^ 0xabcdef;
    const xmesh_dtype_t dts[] = {XMESH_U8,   XMESH_I32, XMESH_I64, XMESH_F16,
                                 XMESH_BF16, XMESH_F32, XMESH_F64};
    char err[512], ss[64], ds[64];
    for (int it = 0; it < 150; it++) {
        rcase_t c;
        memset(&c, 0, sizeof c);
        c.ndim = (int)rnd_in(&s, 1, 3);
        for (int d = 0; d < c.ndim; d++)
            c.shape[d] = rnd_in(&s, 1, 9);
        c.dt = dts[rnd(&s) % 7];
        c.src_nd = (int)rnd_in(&s, 1, 2);
        c.dst_nd = (int)rnd_in(&s, 1, 2);
        for (int a = 0; a < c.src_nd; a++)
            c.src_shape[a] = (int)rnd_in(&s, 1, 3);
        for (int a = 0; a < c.dst_nd; a++)
            c.dst_shape[a] = (int)rnd_in(&s, 1, 3);
        random_spec(&s, c.ndim, c.src_nd, 1, ss, sizeof ss);
        random_spec(&s, c.ndim, c.dst_nd, 0, ds, sizeof ds);
        c.src_spec = ss;
        c.dst_spec = ds;
        c.overlap = (int)rnd_in(&s, 0, 1);
        c.chunk = rnd_in(&s, 1, 64);
        c.strategy = (xmesh_strategy_t)rnd_in(&s, 0, XMESH_STRATEGY_COUNT_ - 1);
        xm_spec_t tmp;
        if (xm_spec_parse(ss, c.ndim, c.src_nd, &tmp) || xm_spec_parse(ds, c.ndim, c.dst_nd, &tmp))
            continue; /* e.g. a dim split more ways than it has elements is fine; others skip */
        if (run_case(&c, rnd(&s), err, sizeof err))
            fail_msg("random case %d (seed %llu): shape ndim %d %s on %d-d mesh -> %s, %s, chunk "
                     "%lld, %s: %s",
                     it, (unsigned long long)g_seed, c.ndim, ss, c.src_nd, ds,
                     xmesh_dtype_name(c.dt), (long long)c.chunk, xmesh_strategy_name(c.strategy),
                     err);
    }
}

/* A converting plan (f32 -> bf16) is refused by the device plan, naming
 * both dtypes, with nothing built (docs/DTYPES.md: MPI backend only). */
static void test_refuses_conversion(void **state)
{
    (void)state;
    static const po_case_t c = {2, {8, 6}, XMESH_F32, 1, {2}, "S0R", 1, {3}, "RS0", 0, 16, 0};
    po_world_t w;
    po_world_init_to(&c, XMESH_BF16, &w);
    xm_cluster_t cl;
    assert_int_equal(xm_cluster_init(&cl, &w.hosts), XMESH_SUCCESS);
    xm_sched_opts_t so = {.kind = XMESH_SCHEDULER_NAIVE, .strategy = XMESH_STRATEGY_SENDRECV};
    xm_schedule_t s;
    assert_int_equal(xm_schedule(&w.ts, &cl, &so, &s), XMESH_SUCCESS);
    xm_prog_in_t in = po_prog_in(&c, &w, &s);
    xm_devplan_t dp;
    memset(&dp, 0x5A, sizeof dp);
    assert_int_equal(xm_devplan_build(&in, 0, &dp), XMESH_ERR_UNSUPPORTED);
    assert_non_null(strstr(xmesh_last_error(), "source dtype f32 != destination dtype bf16"));
    xm_schedule_free(&s);
    xm_cluster_free(&cl);
    po_world_free(&w);
}

int main(void)
{
    const char *e = getenv("XMESH_TEST_SEED");
    g_seed = e && *e ? strtoull(e, NULL, 0) : 20261122;
    printf("test_devplan: seed %llu (replay with XMESH_TEST_SEED=%llu)\n",
           (unsigned long long)g_seed, (unsigned long long)g_seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_packdesc),
        cmocka_unit_test(test_f16),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_commkey),
        cmocka_unit_test(test_emulated_matrix),
        cmocka_unit_test(test_emulated_random),
        cmocka_unit_test(test_refuses_conversion),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
