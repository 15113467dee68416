/*
 * Unit tests of the per-rank program compiler (lib/plan/program.c): for
 * fixed and random reshardings (every strategy, partial sums, all dtypes
 * with a partial-sum path), the programs of all ranks are run on in-memory
 * blocks by a one-process simulator: hops are message queues keyed by hop
 * id, each step's chunks go through exactly the ops the program lists, a
 * step waits for its `after` step and a task for every earlier task of its
 * rank that shares a link class (the MPI executor's admission rule), so a
 * program that would deadlock is reported. Every destination element is
 * compared with its value computed from its global index. Random cases
 * print their seed; XMESH_TEST_SEED replays.
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

#include "test_util.h"
#include "program_oracle.h"
#include "xm_program.h"

typedef po_case_t pcase_t;

/* The value element g must have at the destination, and group p's part of
 * it (parts of the G groups sum to it; small integers, exact in every
 * dtype, unsigned wrap for the integer types). */
static int64_t want(int64_t g)
{
    return g % 97 + 1;
}
static int64_t part(int64_t g, int p, int G)
{
    if (G == 1)
        return want(g);
    int64_t v = (g * 7 + p * 13) % 5;
    if (p < G - 1)
        return v;
    int64_t s = 0;
    for (int q = 0; q < G - 1; q++)
        s += (g * 7 + q * 13) % 5;
    return want(g) - s;
}

static int64_t load(xmesh_dtype_t dt, const void *b, int64_t i)
{
    switch (dt) {
    case XMESH_U8:
    case XMESH_I8:
        return ((const uint8_t *)b)[i];
    case XMESH_I32:
        return (int32_t)((const uint32_t *)b)[i];
    case XMESH_I64:
        return ((const int64_t *)b)[i];
    case XMESH_F32:
        return (int64_t)((const float *)b)[i];
    case XMESH_F64:
        return (int64_t)((const double *)b)[i];
    case XMESH_F16:
        return (int64_t)xm_f16_to_f32(((const uint16_t *)b)[i]);
    default:
        return (int64_t)xm_bf16_to_f32(((const uint16_t *)b)[i]);
    }
}

/* Converting cases (source dtype != destination dtype). The values are
 * f32 numbers put into the source dtype with xm_convert (checked bit for
 * bit against an independent formula by tests/unit/test_convert.c); the
 * destination must hold exactly the source value converted once to its
 * dtype. Without partial sums: f32 bit patterns with every class (NaN,
 * infinities, signed zeros, subnormals of f32 and f16, values that
 * overflow f16, ties). With partial sums: parts exact in every source
 * dtype (8 significant bits, multiples of 2^-4, below 2^8), so their sum
 * is exact in f32 whatever the order, and it is the sum that is rounded. */
static float cv_value(int64_t g)
{
    uint64_t h = (uint64_t)g * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
    uint32_t u = (uint32_t)(h >> 32);
    switch (g % 11) {
    case 0:
        u = (u & 0x80000000u) | 0x7f800000u | (u & 0x7fffffu) | 1u; /* NaN */
        break;
    case 1:
        u = (u & 0x80000000u) | 0x7f800000u; /* +-inf */
        break;
    case 2:
        u &= 0x807fffffu; /* f32 subnormal or zero */
        break;
    case 3:
        u = (u & 0x80ffffffu) | (0x67u << 23); /* f16 subnormal range */
        break;
    case 4:
        u = (u & 0x807fffffu) | (0x8eu << 23); /* [2^15, 2^16): f16 max and overflow */
        break;
    case 5:
        u = (u & 0xffff0000u) | 0x8000u; /* a bf16 tie */
        break;
    case 6:
        u = g % 2 ? 0x80000000u : 0u; /* signed zeros */
        break;
    default:
        u = (u & 0x81ffffffu) | (0x7cu << 23); /* around 1 */
        break;
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static float cv_part(int64_t g, int p)
{
    int k = (int)((g * 37 + p * 11) % 255) - 127;
    return ldexpf((float)k, (int)((g + p) % 5) - 4);
}

/* Element g, group p of G, as the source dtype holds it. */
static void cv_store_src(xmesh_dtype_t sdt, void *b, int64_t i, int64_t g, int p, int G)
{
    float f = G == 1 ? cv_value(g) : cv_part(g, p);
    xm_convert(sdt, (char *)b + i * (int64_t)xmesh_dtype_size(sdt), XMESH_F32, &f, 1);
}

/* The destination value of element g: the source value (or the exact sum
 * of the parts) converted once. Written as ddt into out. */
static void cv_want(xmesh_dtype_t sdt, xmesh_dtype_t ddt, int64_t g, int G, void *out)
{
    if (G == 1) {
        char sv[4];
        float f = cv_value(g);
        xm_convert(sdt, sv, XMESH_F32, &f, 1);
        xm_convert(ddt, out, sdt, sv, 1);
        return;
    }
    double sum = 0;
    for (int p = 0; p < G; p++) {
        float f = cv_part(g, p);
        char sv[4];
        xm_convert(sdt, sv, XMESH_F32, &f, 1); /* exact */
        xm_convert(XMESH_F32, &f, sdt, sv, 1);
        sum += f;
    }
    float fs = (float)sum; /* exact: at most 20 significant bits */
    assert_true((double)fs == sum);
    xm_convert(ddt, out, XMESH_F32, &fs, 1);
}

/* Bit-for-bit equality of two ddt values, any NaN equal to a NaN of the
 * same sign. */
static int cv_same(xmesh_dtype_t dt, const void *a, const void *b)
{
    float fa, fb;
    xm_convert(XMESH_F32, &fa, dt, a, 1);
    xm_convert(XMESH_F32, &fb, dt, b, 1);
    if (fa != fa || fb != fb)
        return fa != fa && fb != fb && signbit(fa) == signbit(fb);
    return memcmp(a, b, xmesh_dtype_size(dt)) == 0;
}

/* Message element size every non-accumulator message of the running case
 * must have (0: not checked). */
static size_t g_wire_es;
static long g_late_next; /* steps marked late_next so far (the check must see some) */

/* A message on a hop: chunk payload plus what the sender thinks it is. */
typedef struct {
    char *data;
    int64_t bytes, a, cnt;
    int from;
} msg_t;

typedef struct {
    msg_t *m; /* per chunk */
    int64_t n;
} hop_t;

typedef struct {
    xm_program_t prog;
    char *src, *dst, *buf;
    int64_t *next_chunk;
    unsigned char *done, *tstate;
} rank_t;

/* Runs one op that moves no message on chunk [a, a + cnt) of step s. The
 * op's dt is the dtype of the buffer it reads or writes; the src block holds
 * the program's dtype, the dst block its dst_dtype. */
static void local_op(rank_t *k, const xm_pstep_t *s, const xm_pop_t *o, char *buf, int64_t a,
                     int64_t cnt)
{
    const xm_program_t *p = &k->prog;
    xmesh_dtype_t dt = (xmesh_dtype_t)o->dt;
    switch (o->kind) {
    case XM_POP_PACK:
        xm_geom_copy_cv(XM_COPY_PACK, o->blk ? &s->dg : &s->sg, o->blk ? p->dst_dtype : p->dtype,
                        dt, o->blk ? k->dst : k->src, buf, a, cnt);
        break;
    case XM_POP_TO_ACC:
    case XM_POP_ADD_ACC:
        assert_int_equal(dt, xm_dtype_acc(p->dtype));
        xm_geom_copy(o->kind == XM_POP_TO_ACC ? XM_COPY_TO_ACC : XM_COPY_ADD_ACC, &s->sg, p->dtype,
                     k->src, buf, a, cnt);
        break;
    case XM_POP_TO_NATIVE:
        xm_convert(dt, buf, xm_dtype_acc(p->dtype), buf, cnt);
        break;
    case XM_POP_UNPACK:
        xm_geom_copy_cv(XM_COPY_UNPACK, &s->dg, p->dst_dtype, dt, k->dst, buf, a, cnt);
        break;
    case XM_POP_COPY:
        xm_geom_copy2_cv(&s->sg, p->dtype, k->src, &s->dg, p->dst_dtype, k->dst, a, cnt);
        break;
    default:
        fail_msg("op %s moves a message", xm_pop_name(o->kind));
    }
}

/* Wire element size every non-accumulator message of a case must have,
 * from the rule in docs/DTYPES.md (not from the library): the narrower of
 * the two dtypes, the destination's for partial sums. */
static size_t want_wire_es(xmesh_dtype_t sdt, xmesh_dtype_t ddt, int G)
{
    size_t a = xmesh_dtype_size(sdt), b = xmesh_dtype_size(ddt);
    return G > 1 ? b : a < b ? a : b;
}

/* Runs chunk c of step s of rank r through its ops. 0 on success, 1 when a
 * message it needs has not arrived yet, -1 on a mismatch (err filled). */
static int run_chunk(rank_t *R, int r, hop_t *hops, const xm_pstep_t *s, int64_t c, char *err,
                     size_t errlen)
{
    rank_t *k = &R[r];
    int64_t a, cnt;
    xm_pstep_chunk(s, c, &a, &cnt);
    if (s->prev >= 0) {
        hop_t *h = &hops[s->hop_in];
        if (c >= h->n || !h->m[c].data)
            return 1;
    }
    for (int i = 0; i < s->nops; i++) {
        const xm_pop_t *o = &s->ops[i];
        switch (o->kind) {
        case XM_POP_RECV: {
            msg_t *m = &hops[s->hop_in].m[c];
            int64_t want_bytes = cnt * (int64_t)xmesh_dtype_size(s->in_dt);
            assert_int_equal(o->dt, s->in_dt);
            if (m->from != s->prev || m->a != a || m->cnt != cnt || m->bytes != want_bytes) {
                snprintf(err, errlen,
                         "rank %d task %d hop %d chunk %lld: got [%lld, +%lld) %lld bytes from "
                         "rank %d, expects [%lld, +%lld) %lld bytes from rank %d",
                         r, s->task, s->hop_in, (long long)c, (long long)m->a, (long long)m->cnt,
                         (long long)m->bytes, m->from, (long long)a, (long long)cnt,
                         (long long)want_bytes, s->prev);
                return -1;
            }
            memcpy(k->buf, m->data, (size_t)m->bytes);
            free(m->data);
            m->data = NULL;
            break;
        }
        case XM_POP_SEND: {
            hop_t *h = &hops[s->hop_out];
            if (!h->m) {
                h->m = calloc((size_t)s->nchunks, sizeof *h->m);
                h->n = s->nchunks;
            }
            assert_non_null(h->m);
            assert_true(c < h->n && !h->m[c].data);
            int64_t bytes = cnt * (int64_t)xmesh_dtype_size(s->out_dt);
            assert_int_equal(o->dt, s->out_dt);
            if (g_wire_es && !s->out_acc)
                assert_int_equal(xmesh_dtype_size(s->out_dt), g_wire_es);
            msg_t *m = &h->m[c];
            m->data = malloc((size_t)bytes + 1);
            memcpy(m->data, k->buf, (size_t)bytes);
            *m = (msg_t){m->data, bytes, a, cnt, r};
            break;
        }
        default:
            local_op(k, s, o, k->buf, a, cnt);
            break;
        }
    }
    return 0;
}

/* Advances every rank as far as it can; returns 1 if anything moved. */
static int sim_round(rank_t *R, int n, hop_t *hops, char *err, size_t errlen, int *bad)
{
    int moved = 0;
    for (int r = 0; r < n && !*bad; r++) {
        rank_t *k = &R[r];
        unsigned blocked = 0;
        for (int i = 0; i < k->prog.ntasks && !*bad; i++) {
            const xm_ptask_t *t = &k->prog.tasks[i];
            if (k->tstate[i] == 2)
                continue;
            if (k->tstate[i] == 0) {
                if (t->slots & blocked) {
                    blocked |= t->slots;
                    continue;
                }
                k->tstate[i] = 1;
                moved = 1;
            }
            int all = 1;
            for (int q = t->first_step; q < t->first_step + t->nsteps; q++) {
                const xm_pstep_t *s = &k->prog.steps[q];
                if (s->after >= 0 && !k->done[s->after]) {
                    all = 0;
                    continue;
                }
                while (k->next_chunk[q] < s->nchunks) {
                    int e = run_chunk(R, r, hops, s, k->next_chunk[q], err, errlen);
                    if (e < 0)
                        *bad = 1;
                    if (e)
                        break;
                    k->next_chunk[q]++;
                    moved = 1;
                }
                k->done[q] = k->next_chunk[q] == s->nchunks;
                all &= k->done[q];
            }
            if (all) {
                k->tstate[i] = 2;
                moved = 1;
            } else {
                blocked |= t->slots;
            }
        }
    }
    return moved;
}

/* Per (sender, receiver) pair: messages in send order (NCCL matches the
 * n-th send a -> b with the n-th receive of b from a). */
typedef struct {
    msg_t *m;
    int head, n, cap;
} fifo_t;

/* Staging element size of a step: accumulator elements in partial sums,
 * else the wire's. */
static size_t stage_es(const xm_program_t *p, const xm_pstep_t *s)
{
    (void)p;
    return s->stage_es;
}

/* Inside a group, receives and sends run concurrently: a receive never
 * targets the slot a send of the same round reads; and steps active in
 * the same round never share staging memory. */
static void check_round_buffers(const xm_program_t *p, const xm_rop_t *ops, int n,
                                const int64_t *off)
{
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            const xm_rop_t *x = &ops[i], *y = &ops[j];
            if (x->kind == XM_POP_RECV && y->kind == XM_POP_SEND && x->step == y->step)
                assert_int_not_equal(x->slot, y->slot);
            if (x->step == y->step || off[x->step] < 0 || off[y->step] < 0)
                continue;
            const xm_pstep_t *a = &p->steps[x->step], *b = &p->steps[y->step];
            int64_t ea = off[x->step] + 2 * a->ce * (int64_t)stage_es(p, a);
            int64_t eb = off[y->step] + 2 * b->ce * (int64_t)stage_es(p, b);
            assert_true(ea <= off[y->step] || eb <= off[x->step]);
        }
}

/* Runs the programs in lockstep rounds (xm_rounds_next), as the NCCL
 * backend posts them: per round, phase 0 on every rank, then the group
 * (every send of the round, then every receive), then phase 2. Staging is
 * the backend's pool (two slots per step, xm_program_pool). */
static int run_rounds(rank_t *R, int n, const xm_chains_t *ch, char *err, size_t errlen)
{
    xm_rounds_it_t *it = calloc(n, sizeof *it);
    int64_t *cur = calloc(n, sizeof(int64_t)), **off = calloc(n, sizeof(int64_t *));
    int *nops = calloc(n, sizeof(int));
    const xm_rop_t **ops = calloc(n, sizeof *ops);
    char **pool = calloc(n, sizeof(char *));
    fifo_t *q = calloc((size_t)n * n, sizeof *q);
    assert_true(it && cur && off && nops && ops && pool && q);
    int bad = 0;
    for (int r = 0; r < n; r++) {
        const xm_program_t *p = &R[r].prog;
        int64_t *need = calloc(p->nsteps + 1, sizeof(int64_t)), total = 0;
        off[r] = calloc(p->nsteps + 1, sizeof(int64_t));
        assert_true(need && off[r]);
        for (int i = 0; i < p->nsteps; i++)
            need[i] = p->steps[i].mode == XM_MODE_SELF
                          ? 0
                          : 2 * p->steps[i].ce * (int64_t)stage_es(p, &p->steps[i]);
        assert_int_equal(xm_program_pool(p, need, 64, off[r], &total), XMESH_SUCCESS);
        free(need);
        pool[r] = malloc((size_t)total + 1);
        assert_int_equal(xm_rounds_init(p, &it[r]), XMESH_SUCCESS);
        nops[r] = xm_rounds_next(p, &it[r], &cur[r], &ops[r]);
        assert_true(nops[r] >= 0);
    }
    for (int64_t t = 0; t < ch->nrounds && !bad; t++) {
        for (int phase = 0; phase < 3 && !bad; phase++)
            for (int pass = 0; pass < (phase == 1 ? 2 : 1); pass++) /* sends, then receives */
                for (int r = 0; r < n && !bad; r++) {
                    if (!nops[r])
                        continue;
                    assert_true(cur[r] >= t); /* rounds never go back */
                    if (cur[r] != t)
                        continue;
                    const xm_program_t *p = &R[r].prog;
                    if (phase == 0 && pass == 0)
                        check_round_buffers(p, ops[r], nops[r], off[r]);
                    for (int i = 0; i < nops[r] && !bad; i++) {
                        const xm_rop_t *o = &ops[r][i];
                        if (i > 0)
                            assert_true(ops[r][i - 1].phase <= o->phase);
                        if (o->phase != phase)
                            continue;
                        const xm_pstep_t *s = &p->steps[o->step];
                        int64_t a, cnt;
                        xm_pstep_chunk(s, o->chunk, &a, &cnt);
                        assert_true(off[r][o->step] >= 0 || o->kind == XM_POP_COPY);
                        char *buf = off[r][o->step] < 0
                                        ? NULL
                                        : pool[r] + off[r][o->step] +
                                              (int64_t)o->slot * s->ce * (int64_t)stage_es(p, s);
                        if (o->kind == XM_POP_SEND && pass == 0) {
                            fifo_t *f = &q[(int64_t)r * n + s->next];
                            int64_t bytes = cnt * (int64_t)xmesh_dtype_size(s->out_dt);
                            if (g_wire_es && !s->out_acc)
                                assert_int_equal(xmesh_dtype_size(s->out_dt), g_wire_es);
                            if (f->n == f->cap) {
                                f->cap = 2 * f->cap + 8;
                                f->m = realloc(f->m, sizeof *f->m * f->cap);
                                assert_non_null(f->m);
                            }
                            f->m[f->n].data = malloc((size_t)bytes + 1);
                            memcpy(f->m[f->n].data, buf, (size_t)bytes);
                            f->m[f->n] = (msg_t){f->m[f->n].data, bytes, a, cnt, r};
                            f->n++;
                        } else if (o->kind == XM_POP_RECV && pass == 1) {
                            fifo_t *f = &q[(int64_t)s->prev * n + r];
                            int64_t bytes = cnt * (int64_t)xmesh_dtype_size(s->in_dt);
                            if (f->head == f->n) {
                                snprintf(err, errlen,
                                         "round %lld: rank %d waits for rank %d (task %d chunk "
                                         "%lld): NCCL would hang",
                                         (long long)t, r, s->prev, s->task, (long long)o->chunk);
                                bad = 1;
                                break;
                            }
                            msg_t *m = &f->m[f->head++];
                            if (m->bytes != bytes || m->a != a || m->cnt != cnt) {
                                snprintf(err, errlen,
                                         "round %lld: rank %d receives [%lld, +%lld) %lld bytes "
                                         "from rank %d, which sent [%lld, +%lld) %lld bytes",
                                         (long long)t, r, (long long)a, (long long)cnt,
                                         (long long)bytes, s->prev, (long long)m->a,
                                         (long long)m->cnt, (long long)m->bytes);
                                bad = 1;
                            }
                            memcpy(buf, m->data, (size_t)m->bytes);
                            free(m->data);
                            m->data = NULL;
                        } else if (o->kind != XM_POP_SEND && o->kind != XM_POP_RECV) {
                            local_op(&R[r], s, &(xm_pop_t){o->kind, o->blk, o->dt}, buf, a, cnt);
                        }
                    }
                }
        /* NCCL groups block until matched: a round's sends are received
         * in the same round */
        for (int64_t i = 0; i < (int64_t)n * n && !bad; i++)
            if (q[i].head != q[i].n) {
                snprintf(err, errlen, "round %lld: send %d->%d not received in its group",
                         (long long)t, (int)(i / n), (int)(i % n));
                bad = 1;
            }
        for (int r = 0; r < n && !bad; r++)
            if (nops[r] && cur[r] == t) {
                nops[r] = xm_rounds_next(&R[r].prog, &it[r], &cur[r], &ops[r]);
                assert_true(nops[r] >= 0);
            }
    }
    for (int r = 0; r < n && !bad; r++)
        if (nops[r]) {
            snprintf(err, errlen, "rank %d has work in round %lld of %lld", r, (long long)cur[r],
                     (long long)ch->nrounds);
            bad = 1;
        }
    for (int64_t i = 0; i < (int64_t)n * n; i++) {
        if (!bad && q[i].head != q[i].n) {
            snprintf(err, errlen, "%d message(s) from rank %d to rank %d never received",
                     q[i].n - q[i].head, (int)(i / n), (int)(i % n));
            bad = 1;
        }
        for (int k = q[i].head; k < q[i].n; k++)
            free(q[i].m[k].data);
        free(q[i].m);
    }
    for (int r = 0; r < n; r++) {
        xm_rounds_free(&it[r]);
        free(off[r]);
        free(pool[r]);
    }
    free(it);
    free(cur);
    free(off);
    free(nops);
    free(ops);
    free(pool);
    free(q);
    return bad;
}

/* Compares every destination element with its value. */
static int check_dst(const pcase_t *c, const po_world_t *w, rank_t *R, const po_blk_t *db, int n,
                     const char *how, char *err, size_t errlen)
{
    const xm_layout_t *dst = &w->dst;
    if (w->ddt != c->dt) {
        int G = 1;
        if (w->src.mesh.ndev > 0)
            (void)po_partial_coord(&w->src, 0, &G);
        size_t des = xmesh_dtype_size(w->ddt);
        for (int r = 0; r < n; r++)
            for (int64_t e = 0; e < db[r].n; e++) {
                int64_t g = po_global_index(dst, &db[r], e);
                char exp[4], *got = R[r].dst + e * (int64_t)des;
                cv_want(c->dt, w->ddt, g, G, exp);
                if (!cv_same(w->ddt, got, exp)) {
                    uint32_t gb = 0, eb = 0;
                    memcpy(&gb, got, des);
                    memcpy(&eb, exp, des);
                    snprintf(err, errlen,
                             "%s: %s -> %s: rank %d dst element %lld (global %lld): got bits "
                             "0x%x, want 0x%x",
                             how, xmesh_dtype_name(c->dt), xmesh_dtype_name(w->ddt), r,
                             (long long)e, (long long)g, gb, eb);
                    return 1;
                }
            }
        return 0;
    }
    for (int r = 0; r < n; r++)
        for (int64_t e = 0; e < db[r].n; e++) {
            int64_t g = po_global_index(dst, &db[r], e);
            int64_t tmp[1];
            po_store(c->dt, tmp, 0, want(g)); /* the value as the dtype holds it */
            int64_t got = load(c->dt, R[r].dst, e), exp = load(c->dt, tmp, 0);
            if (got != exp) {
                snprintf(err, errlen,
                         "%s: rank %d dst element %lld (global %lld): got %lld, want %lld", how, r,
                         (long long)e, (long long)g, (long long)got, (long long)exp);
                return 1;
            }
        }
    return 0;
}

/* Runs case c into a destination of dtype ddt (c->dt: no conversion). */
static int run_case_to(const pcase_t *c, xmesh_dtype_t ddt, uint64_t seed, char *err, size_t errlen)
{
    po_world_t w;
    po_world_init_to(c, ddt, &w);
    int ngroups = 1;
    if (w.src.mesh.ndev > 0)
        (void)po_partial_coord(&w.src, 0, &ngroups);
    const int conv = ddt != c->dt;
    g_wire_es = conv ? want_wire_es(c->dt, ddt, ngroups) : 0;
    xm_cluster_t cl;
    assert_int_equal(xm_cluster_init(&cl, &w.hosts), XMESH_SUCCESS);
    cl.nics_per_host = 1 + (int)(seed % 2);
    cl.chunk_bytes = c->chunk;
    /* all-gather: senders and order from the send/recv model (api.c) */
    xm_sched_opts_t so = {.kind = (xmesh_scheduler_t)(seed % XMESH_SCHEDULER_COUNT_),
                          .max_evals = 2000,
                          .seed = seed,
                          .strategy = c->strategy == XMESH_STRATEGY_BROADCAST
                                          ? XMESH_STRATEGY_BROADCAST
                                          : XMESH_STRATEGY_SENDRECV};
    xm_schedule_t s;
    if (xm_schedule(&w.ts, &cl, &so, &s))
        fail_msg("xm_schedule: %s", xmesh_last_error());
    xm_prog_in_t in = po_prog_in(c, &w, &s);
    xm_chains_t ch;
    if (xm_chains_build(&in, &ch))
        fail_msg("chains: %s", xmesh_last_error());
    const int n = w.hosts.ndev;
    const size_t es = w.src.elem_size, des = w.dst.elem_size;
    const size_t wes = conv ? g_wire_es : es;
    rank_t *R = calloc(n, sizeof *R);
    hop_t *hops = calloc(ch.nhops + 1, sizeof *hops);
    po_blk_t *sb = calloc(n, sizeof *sb), *db = calloc(n, sizeof *db);
    assert_non_null(R);
    assert_non_null(hops);
    int bad = 0;
    for (int r = 0; r < n; r++) {
        rank_t *k = &R[r];
        if (xm_program_build(&in, &ch, r, &k->prog))
            fail_msg("program of rank %d: %s", r, xmesh_last_error());
        assert_int_equal(k->prog.nhops, ch.nhops);
        po_block_of(&w.src, r, &sb[r]);
        po_block_of(&w.dst, r, &db[r]);
        k->src = malloc(sb[r].n * es + 1);
        k->dst = malloc(db[r].n * des + 1);
        memset(k->dst, 0xA5, db[r].n * des); /* poison: every element must be written */
        int G = 1, pc = sb[r].idx >= 0 ? po_partial_coord(&w.src, sb[r].idx, &G) : 0;
        for (int64_t e = 0; e < sb[r].n; e++) {
            int64_t g = po_global_index(&w.src, &sb[r], e);
            if (conv)
                cv_store_src(c->dt, k->src, e, g, pc, G);
            else
                po_store(c->dt, k->src, e, part(g, pc, G));
        }
        k->buf = malloc((size_t)(k->prog.chunk_elems * (int64_t)(k->prog.acc_es + es)));
        k->next_chunk = calloc(k->prog.nsteps + 1, sizeof(int64_t));
        k->done = calloc(k->prog.nsteps + 1, 1);
        k->tstate = calloc(k->prog.ntasks + 1, 1);
        /* The program's own invariants. */
        for (int q = 0; q < k->prog.nsteps; q++) {
            const xm_pstep_t *st = &k->prog.steps[q];
            assert_true(st->nops >= 1 && st->nops <= XM_POPS_MAX);
            assert_int_equal(st->ops[0].kind == XM_POP_RECV, st->prev >= 0);
            assert_int_equal(st->ops[st->nops - 1].kind == XM_POP_SEND, st->next >= 0);
            assert_true(st->after < q);
            { /* nic_paced: a hop between hosts before the step's first position */
                const xm_chain_t *cc = &ch.c[st->chain];
                const int *cd = ch.devs + cc->off;
                int paced = 0;
                for (int p = 0; p < st->pos_first; p++)
                    paced |= w.hosts.host_of[cd[p]] != w.hosts.host_of[cd[p + 1]];
                assert_int_equal(st->nic_paced, paced);
            }
            assert_true(st->ce >= 1 && st->ce <= k->prog.chunk_elems);
            int64_t sum = 0, a, cnt, prev_end = st->r0;
            for (int64_t cc = 0; cc < st->nchunks; cc++) {
                xm_pstep_chunk(st, cc, &a, &cnt);
                assert_int_equal(a, prev_end); /* chunks tile the range in order */
                assert_true(cnt >= 1 && cnt <= st->ce);
                prev_end = a + cnt;
                sum += cnt;
            }
            assert_int_equal(sum * (int64_t)wes, st->bytes);
        }
    }
    /* late_next against the receiving rank's own program: its task comes
     * after one of its earlier tasks on a shared link class. */
    for (int r = 0; r < n; r++)
        for (int q = 0; q < R[r].prog.nsteps; q++) {
            const xm_pstep_t *st = &R[r].prog.steps[q];
            int nx = st->next, want = 0;
            if (nx >= 0 && w.hosts.host_of[nx] != w.hosts.host_of[r]) {
                const xm_program_t *pn = &R[nx].prog;
                int kt = 0;
                while (kt < pn->ntasks && pn->tasks[kt].task != st->task)
                    kt++;
                assert_true(kt < pn->ntasks);
                for (int j = 0; j < kt; j++)
                    want |= (pn->tasks[j].slots & pn->tasks[kt].slots) != 0;
            }
            assert_int_equal(st->late_next, want);
            g_late_next += want;
        }
    while (!bad && sim_round(R, n, hops, err, errlen, &bad))
        ;
    for (int r = 0; r < n && !bad; r++)
        for (int q = 0; q < R[r].prog.nsteps && !bad; q++)
            if (!R[r].done[q]) {
                const xm_pstep_t *st = &R[r].prog.steps[q];
                snprintf(err, errlen,
                         "deadlock: rank %d step %d (task %d, chunk %lld of %lld, prev %d, "
                         "next %d) never finished",
                         r, q, st->task, (long long)R[r].next_chunk[q], (long long)st->nchunks,
                         st->prev, st->next);
                bad = 1;
            }
    for (int h = 0; h < ch.nhops && !bad; h++)
        for (int64_t cc = 0; cc < hops[h].n && !bad; cc++)
            if (hops[h].m[cc].data) {
                snprintf(err, errlen, "hop %d chunk %lld was sent but never received", h,
                         (long long)cc);
                bad = 1;
            }
    if (!bad)
        bad = check_dst(c, &w, R, db, n, "asynchronous", err, errlen);
    if (!bad) { /* the same programs in lockstep rounds (NCCL) */
        for (int r = 0; r < n; r++)
            memset(R[r].dst, 0xA5, db[r].n * des);
        bad = run_rounds(R, n, &ch, err, errlen);
        if (!bad)
            bad = check_dst(c, &w, R, db, n, "rounds", err, errlen);
    }
    for (int h = 0; h < ch.nhops; h++) {
        for (int64_t cc = 0; cc < hops[h].n; cc++)
            free(hops[h].m[cc].data);
        free(hops[h].m);
    }
    for (int r = 0; r < n; r++) {
        xm_program_free(&R[r].prog);
        free(R[r].src);
        free(R[r].dst);
        free(R[r].buf);
        free(R[r].next_chunk);
        free(R[r].done);
        free(R[r].tstate);
    }
    free(R);
    free(hops);
    free(sb);
    free(db);
    xm_chains_free(&ch);
    xm_schedule_free(&s);
    xm_cluster_free(&cl);
    po_world_free(&w);
    g_wire_es = 0;
    return bad;
}

static int run_case(const pcase_t *c, uint64_t seed, char *err, size_t errlen)
{
    return run_case_to(c, c->dt, seed, err, errlen);
}

static const xmesh_strategy_t strategies[] = {XMESH_STRATEGY_BROADCAST, XMESH_STRATEGY_SENDRECV,
                                              XMESH_STRATEGY_SENDRECV_ALLGATHER,
                                              XMESH_STRATEGY_GLOBAL_ALLGATHER};

static void test_fixed(void **state)
{
    (void)state;
    static const pcase_t cases[] = {
        {2, {8, 6}, XMESH_F32, 1, {2}, "S0R", 1, {3}, "RS0", 0, 16, 0},
        {3, {4, 6, 5}, XMESH_F64, 2, {2, 2}, "S0S1R", 2, {2, 3}, "RS0S1", 0, 40, 0},
        {1, {17}, XMESH_U8, 1, {1}, "R", 1, {4}, "R", 0, 3, 0},
        {2, {6, 4}, XMESH_I32, 2, {2, 2}, "S(0),P", 1, {2}, "S(1)", 0, 8, 0},
        {2, {6, 4}, XMESH_F16, 2, {2, 2}, "P,S(1)", 2, {2, 2}, "B,S(0)", 0, 4, 0},
        {2, {5, 3}, XMESH_BF16, 2, {2, 2}, "P,P", 1, {3}, "S(0)", 0, 6, 1},
        {1, {9}, XMESH_F32, 1, {3}, "P", 1, {2}, "B", 0, 8, 0},
        {2, {6, 4}, XMESH_I64, 2, {2, 2}, "S0S1", 2, {2, 2}, "S1S0", 1, 24, 0},
        {0, {0}, XMESH_F32, 1, {2}, "", 1, {3}, "", 0, 4, 0},
        {2, {0, 5}, XMESH_F32, 1, {2}, "S0R", 1, {2}, "RS0", 0, 4, 0},
    };
    char err[512];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int k = 0; k < 4; k++) {
            pcase_t c = cases[i];
            c.strategy = strategies[k];
            if (run_case(&c, 7 + i, err, sizeof err))
                fail_msg("case %zu (%s -> %s, strategy %d): %s", i, c.src_spec, c.dst_spec, k, err);
        }
}

static int is_float_family(xmesh_dtype_t dt)
{
    return dt == XMESH_F32 || dt == XMESH_F16 || dt == XMESH_BF16;
}

/* Every converting pair (f32, f16, bf16 both ways) on fixed cases with and
 * without partial sums, every strategy. */
static void test_fixed_convert(void **state)
{
    (void)state;
    static const pcase_t cases[] = {
        {2, {8, 6}, XMESH_F32, 1, {2}, "S0R", 1, {3}, "RS0", 0, 16, 0},
        {2, {6, 4}, XMESH_F32, 2, {2, 2}, "P,S(1)", 2, {2, 2}, "B,S(0)", 0, 8, 0},
        {2, {5, 3}, XMESH_F32, 2, {2, 2}, "P,P", 1, {3}, "S(0)", 0, 12, 1},
        {1, {9}, XMESH_F32, 1, {3}, "P", 1, {2}, "B", 0, 8, 0},
        {3, {4, 6, 5}, XMESH_F32, 2, {2, 2}, "S0S1R", 2, {2, 3}, "RS0S1", 0, 40, 0},
        {2, {6, 4}, XMESH_F32, 2, {2, 2}, "S0S1", 2, {2, 2}, "S1S0", 1, 24, 0},
        {1, {17}, XMESH_F32, 1, {1}, "R", 1, {4}, "R", 0, 12, 0},
        {2, {7, 5}, XMESH_F32, 1, {2}, "B", 1, {2}, "B", 1, 8, 0},
    };
    static const xmesh_dtype_t fam[] = {XMESH_F32, XMESH_F16, XMESH_BF16};
    char err[512];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int sd = 0; sd < 3; sd++)
            for (int dd = 0; dd < 3; dd++)
                for (int k = 0; k < 4; k++) {
                    if (sd == dd)
                        continue;
                    pcase_t c = cases[i];
                    c.dt = fam[sd];
                    c.strategy = strategies[k];
                    if (run_case_to(&c, fam[dd], 11 + i + (uint64_t)k, err, sizeof err))
                        fail_msg("case %zu (%s -> %s, %s -> %s, strategy %d): %s", i, c.src_spec,
                                 c.dst_spec, xmesh_dtype_name(c.dt), xmesh_dtype_name(fam[dd]), k,
                                 err);
                }
}

/* Random SBP spec of an nd-dim mesh for a tensor of ndim dims. */
static void rand_spec(uint64_t *rs, int ndim, int nd, int allow_p, char *buf, size_t len)
{
    size_t o = 0;
    for (int a = 0; a < nd; a++) {
        int k = (int)(xt_next(rs) % (uint64_t)(ndim + 1 + (allow_p ? 1 : 0)));
        if (k < ndim)
            o += snprintf(buf + o, len - o, "%sS(%d)", a ? "," : "", k);
        else if (k == ndim)
            o += snprintf(buf + o, len - o, "%sB", a ? "," : "");
        else
            o += snprintf(buf + o, len - o, "%sP", a ? "," : "");
    }
}

static void test_random(void **state)
{
    (void)state;
    uint64_t seed = xt_seed("program.random"), rs = seed;
    static const xmesh_dtype_t dts[] = {XMESH_F32, XMESH_F64,  XMESH_I32, XMESH_I64,
                                        XMESH_F16, XMESH_BF16, XMESH_U8};
    char err[512];
    for (int it = 0; it < 1500; it++) {
        pcase_t c;
        memset(&c, 0, sizeof c);
        char ss[64], ds[64];
        c.ndim = 1 + (int)(xt_next(&rs) % 3);
        for (int d = 0; d < c.ndim; d++)
            c.shape[d] = 1 + (int64_t)(xt_next(&rs) % 12);
        c.dt = dts[xt_next(&rs) % (sizeof dts / sizeof dts[0])];
        c.src_nd = 1 + (int)(xt_next(&rs) % 2);
        c.dst_nd = 1 + (int)(xt_next(&rs) % 2);
        for (int a = 0; a < c.src_nd; a++)
            c.src_shape[a] = 1 + (int)(xt_next(&rs) % 3);
        for (int a = 0; a < c.dst_nd; a++)
            c.dst_shape[a] = 1 + (int)(xt_next(&rs) % 3);
        rand_spec(&rs, c.ndim, c.src_nd, 1, ss, sizeof ss);
        rand_spec(&rs, c.ndim, c.dst_nd, 0, ds, sizeof ds);
        c.src_spec = ss;
        c.dst_spec = ds;
        int nsrc = 1, ndst = 1;
        for (int a = 0; a < c.src_nd; a++)
            nsrc *= c.src_shape[a];
        for (int a = 0; a < c.dst_nd; a++)
            ndst *= c.dst_shape[a];
        c.overlap = nsrc == ndst && (xt_next(&rs) % 2);
        c.chunk = (int64_t)xmesh_dtype_size(c.dt) * (1 + (int64_t)(xt_next(&rs) % 12));
        c.strategy = strategies[xt_next(&rs) % 4];
        /* Converting plans: a float-family source goes to another float
         * dtype half the time. */
        xmesh_dtype_t ddt = c.dt;
        if (is_float_family(c.dt) && xt_next(&rs) % 2) {
            static const xmesh_dtype_t fam[] = {XMESH_F32, XMESH_F16, XMESH_BF16};
            ddt = fam[xt_next(&rs) % 3];
        }
        if (run_case_to(&c, ddt, seed + (uint64_t)it, err, sizeof err))
            fail_msg("seed %llu iteration %d (%s -> %s, strategy %d, dtype %s -> %s, chunk %lld): "
                     "%s",
                     (unsigned long long)seed, it, ss, ds, (int)c.strategy, xmesh_dtype_name(c.dt),
                     xmesh_dtype_name(ddt), (long long)c.chunk, err);
    }
    assert_true(g_late_next > 0);
}

/* The rail of a device as the UCX runner opens it: its index among the
 * devices of its host, in device order, modulo the NICs per host
 * (lib/ucx/ctx.c host_index), computed here on its own. */
static int runner_rail(const xm_hostmap_t *h, int d, int nics)
{
    int k = 0;
    for (int q = 0; q < d; q++)
        k += h->host_of[q] == h->host_of[d];
    return k % nics;
}

/* Several NICs per host (issue 36 item 3): with 2 NICs per host, the
 * program's hops between hosts of the paper's cases (bench scale, 16 MiB,
 * the plan the library makes: split, deterministic budget) each take one
 * rail (NIC index) at both ends: the sender's step says the same rail as the
 * receiver's (rail_out, rail_in), the one the schedule charged
 * (route_rails), and a hop between two devices of one rail keeps it (the
 * emulated cluster's NIC k reaches NIC k by its route; the UCX runner sends
 * and receives each hop on its rail's worker). Cases 1-3, 5-9 have no hop
 * between rails at all; case 4 (one holder, one receiver per task, half the
 * pairs on different rails) has 32 of 64, and the schedule spreads them over
 * both rails. In cases 2, 3, 4 and 9 every sending host sends on both rails
 * and every receiving host receives on both, equally (bytes as elements). */
static void test_rails(void **state)
{
    (void)state;
    static const struct {
        int no, both, cross;
        pcase_t c;
    } cases[] = {
        {1,
         0,
         0,
         {3, {208, 208, 104}, XMESH_I32, 2, {2, 4}, "S0RR", 2, {2, 4}, "S0RR", 0, 65408, 0}},
        {2,
         1,
         0,
         {3, {208, 208, 104}, XMESH_I32, 2, {2, 4}, "RRR", 2, {2, 4}, "S0RR", 0, 65408, 0}},
        {3,
         1,
         0,
         {3, {208, 208, 104}, XMESH_I32, 2, {2, 4}, "RS0R", 2, {2, 4}, "S0RR", 0, 65408, 0}},
        {4,
         1,
         1,
         {3, {208, 208, 104}, XMESH_I32, 2, {2, 4}, "RS01R", 2, {2, 4}, "S01RR", 0, 65408, 0}},
        {5,
         0,
         0,
         {3, {208, 208, 104}, XMESH_I32, 2, {2, 4}, "S1RR", 2, {2, 4}, "S0RR", 0, 65408, 0}},
        {6,
         0,
         0,
         {3, {612, 204, 34}, XMESH_I32, 2, {2, 4}, "S0RR", 2, {3, 4}, "S0RR", 0, 65408, 0}},
        {7,
         0,
         0,
         {3, {208, 208, 104}, XMESH_I32, 2, {1, 4}, "S1RR", 2, {2, 4}, "RRR", 0, 65408, 0}},
        {8, 0, 0, {3, {208, 208, 104}, XMESH_I32, 2, {2, 3}, "RRR", 2, {3, 2}, "RRR", 0, 65408, 0}},
        {9,
         1,
         0,
         {3, {208, 208, 104}, XMESH_I32, 2, {2, 4}, "RS0R", 2, {2, 4}, "RRS0", 0, 65408, 0}},
    };
    const int K = 2;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const pcase_t *c = &cases[i].c;
        int no = cases[i].no;
        po_world_t w;
        po_world_init(c, &w);
        xm_cluster_t cl;
        assert_int_equal(xm_cluster_init(&cl, &w.hosts), XMESH_SUCCESS);
        cl.nics_per_host = K;
        cl.nic_send_Bps = cl.nic_recv_Bps = 0.1e9 / 8;
        cl.chunk_bytes = c->chunk;
        /* the library's defaults (XMESH_SYNC_SEND=1: 4 chunks ahead) */
        cl.sync_send = 1;
        cl.send_ahead = cl.forward_ahead = 4;
        xm_sched_opts_t so = {.kind = XMESH_SCHEDULER_ENSEMBLE,
                              .max_evals = 20000,
                              .seed = 1,
                              .strategy = XMESH_STRATEGY_BROADCAST};
        xm_schedule_t s;
        if (xm_schedule_plan(&w.ts, &cl, &so, 1, &s, NULL))
            fail_msg("case %d: xm_schedule_plan: %s", no, xmesh_last_error());
        assert_non_null(s.route_rails);
        for (int d = 0; d < w.hosts.ndev; d++)
            assert_int_equal(xm_cluster_nic_of(&cl, d) % K, runner_rail(&w.hosts, d, K));
        xm_prog_in_t in = po_prog_in(c, &w, &s);
        in.nics = K;
        xm_chains_t ch;
        if (xm_chains_build(&in, &ch))
            fail_msg("case %d: chains: %s", no, xmesh_last_error());
        /* Per hop id: the rail its sender's step says, its receiver's, the
         * chain's bytes (elements) on it. */
        int *rout = malloc(sizeof(int) * (ch.nhops + 1)),
            *rin = malloc(sizeof(int) * (ch.nhops + 1));
        assert_non_null(rout);
        assert_non_null(rin);
        for (int h = 0; h < ch.nhops; h++)
            rout[h] = rin[h] = -2;
        for (int r = 0; r < w.hosts.ndev; r++) {
            xm_program_t pg;
            if (xm_program_build(&in, &ch, r, &pg))
                fail_msg("case %d: program of rank %d: %s", no, r, xmesh_last_error());
            for (int k = 0; k < pg.nsteps; k++) {
                const xm_pstep_t *st = &pg.steps[k];
                if (st->hop_out >= 0)
                    rout[st->hop_out] = st->rail_out;
                if (st->hop_in >= 0)
                    rin[st->hop_in] = st->rail_in;
            }
            xm_program_free(&pg);
        }
        int nh = w.hosts.nhosts, ncross = 0;
        double *snd = calloc((size_t)nh * K, sizeof *snd),
               *rcv = calloc((size_t)nh * K, sizeof *rcv);
        assert_non_null(snd);
        assert_non_null(rcv);
        for (int q = 0; q < ch.n; q++) {
            const xm_chain_t *cn = &ch.c[q];
            const int *d = ch.devs + cn->off;
            double b = (double)(cn->r1 - cn->r0);
            for (int j = 0, hop = cn->hop0; j + 1 < cn->len; j++) {
                if (d[j] == d[j + 1])
                    continue;
                int ha = w.hosts.host_of[d[j]], hb = w.hosts.host_of[d[j + 1]], rl = rout[hop];
                if (rl != rin[hop])
                    fail_msg("case %d: chain %d (task %d) hop %d (%d -> %d): the sender says rail "
                             "%d, the receiver %d",
                             no, q, cn->task, hop, d[j], d[j + 1], rl, rin[hop]);
                hop++;
                if (ha == hb) {
                    if (rl != -1)
                        fail_msg("case %d: hop %d -> %d inside host %d has rail %d", no, d[j],
                                 d[j + 1], ha, rl);
                    continue;
                }
                int ra = runner_rail(&w.hosts, d[j], K), rb = runner_rail(&w.hosts, d[j + 1], K);
                if (rl < 0 || rl >= K || (ra == rb && rl != ra) ||
                    (ra != rb && rl != ra && rl != rb))
                    fail_msg("case %d: chain %d (task %d) hop %d (host %d, rail %d) -> %d (host "
                             "%d, rail %d) on rail %d",
                             no, q, cn->task, d[j], ha, ra, d[j + 1], hb, rb, rl);
                if (cn->route >= 0 && s.route_rails[s.routes[cn->route].off + j] != rl)
                    fail_msg("case %d: chain %d hop %d: rail %d, the schedule charged %d", no, q, j,
                             rl, s.route_rails[s.routes[cn->route].off + j]);
                ncross += ra != rb;
                snd[ha * K + rl] += b;
                rcv[hb * K + rl] += b;
            }
        }
        if (cases[i].cross ? ncross == 0 : ncross != 0)
            fail_msg("case %d: %d hops between rails", no, ncross);
        for (int h = 0; cases[i].both && h < nh; h++)
            for (int dir = 0; dir < 2; dir++) {
                const double *v = dir ? rcv : snd;
                if (v[h * K] + v[h * K + 1] == 0)
                    continue;
                if (v[h * K] != v[h * K + 1])
                    fail_msg("case %d: host %d %s %.0f elements on rail 0, %.0f on rail 1", no, h,
                             dir ? "receives" : "sends", v[h * K], v[h * K + 1]);
            }
        free(rout);
        free(rin);
        free(snd);
        free(rcv);
        xm_chains_free(&ch);
        xm_schedule_free(&s);
        xm_cluster_free(&cl);
        po_world_free(&w);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixed),
        cmocka_unit_test(test_fixed_convert),
        cmocka_unit_test(test_random),
        cmocka_unit_test(test_rails),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
