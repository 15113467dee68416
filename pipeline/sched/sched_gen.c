/*
 * Schedule generators: each family's per-group order (GPipe, 1F1B, eager, interleaved,
 * V-shape, zero-bubble, DualPipeV), the fit checks, the weight-gradient fill and the
 * memory-capped choice (xmp_sched_generate*). Pure C.
 * Schedules: GPipe (Huang et al. 2019), 1F1B (Narayanan et al. 2021),
 * eager-1F1B and weight-gradient delay (AlpaComm, MLSys 2023, section 4),
 * split backward I/W as in zero-bubble pipelining (Qi et al. 2024, ZB-H1).
 */
#include "sched/schedule.h"
#include "sched/sched_priv.h"
#include "util/xmp_err.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* -------------------------------------------------------------- generators */

static int push(xmp_schedule_t *s, int g, int kind, int mb, int edge, int dir, int chunk)
{
    xmp_action_t a = {kind, mb, edge, dir, chunk};
    return xmp_sched_append(s, g, a);
}

/* One compute entry of a group's order. */
typedef struct {
    int kind, chunk, mb;
} ord_t;

/* Default warm-up (forwards before the first backward) of the 1F1B-family kinds. */
static int warm_of(int kind, int S, int M, int R, int V, int r)
{
    int w;
    switch (kind) {
    case XMP_SCHED_GPIPE:
        return M;
    case XMP_SCHED_1F1B:
        w = S - r;
        return w < M ? w : M;
    case XMP_SCHED_EAGER_1F1B:
        w = 2 * (S - r) - 1;
        return w < M ? w : M;
    case XMP_SCHED_INTERLEAVED_1F1B:
    case XMP_SCHED_EAGER_INTERLEAVED_1F1B:
        if (M == R)
            return M * V; /* Megatron: all forwards first when M == R */
        /* Megatron's warm-up, plus the forward that opens its steady phase (here the
         * steady phase starts with a backward) */
        w = 2 * (R - r - 1) + (V - 1) * R + 1 + (kind == XMP_SCHED_EAGER_INTERLEAVED_1F1B);
        return w < M * V ? w : M * V;
    default:
        return 0;
    }
}

/* DualPipeV on group r (chunk 0 = stage r, chunk 1 = stage 2R-1-r); returns the length. */
static int dualpipe_order(const xmp_schedule_t *s, int r, ord_t *o)
{
    const int M = s->nmb, R = s->ngroups;
    int n = 0, nf[2] = {0, 0}, nb[2] = {0, 0}, zb = 0;
    int *wq = malloc((size_t)(2 * M + 1) * sizeof(int)), wh = 0, wt = 0; /* chunk*M + mb */
    if (wq == NULL)
        return -1;
#define EMIT(k, c, m)                                                                              \
    do {                                                                                           \
        o[n].kind = (k);                                                                           \
        o[n].chunk = (c);                                                                          \
        o[n].mb = (m);                                                                             \
        n++;                                                                                       \
    } while (0)
#define FWD(c) EMIT(XMP_ACT_F, c, nf[c]++)
#define BWD(c, split)                                                                              \
    do {                                                                                           \
        if (split) {                                                                               \
            wq[wt++] = (c)*M + nb[c];                                                              \
            EMIT(XMP_ACT_I, c, nb[c]++);                                                           \
        } else {                                                                                   \
            EMIT(XMP_ACT_B, c, nb[c]++);                                                           \
        }                                                                                          \
    } while (0)
#define WPOP()                                                                                     \
    do {                                                                                           \
        if (wh < wt) {                                                                             \
            EMIT(XMP_ACT_W, wq[wh] / M, wq[wh] % M);                                               \
            wh++;                                                                                  \
        }                                                                                          \
    } while (0)
    for (int k = 0; k < 2 * (R - r - 1); k++)
        FWD(0);
    for (int k = 0; k < r + 1; k++) {
        FWD(0);
        FWD(1);
    }
    for (int k = 0; k < R - r - 1; k++) {
        BWD(1, 1);
        WPOP();
        FWD(1);
    }
    for (int k = 0; k < M - 2 * R + r + 1; k++) {
        FWD(0); /* (F0 B1) (F1 B0): DualPipe overlaps each pair; here they run in turn */
        BWD(1, 0);
        FWD(1);
        BWD(0, 0);
    }
    for (int k = 0; k < R - r - 1; k++) {
        BWD(1, 0);
        FWD(1);
        BWD(0, 0);
    }
    for (int k = 0; k < r + 1; k++) { /* the second half of these uses the split backward */
        if (k == (r + 1) / 2 && r % 2 == 1)
            zb = 1;
        BWD(1, zb);
        if (k == (r + 1) / 2 && r % 2 == 0)
            zb = 1;
        BWD(0, zb);
    }
    for (int k = 0; k < R - r - 1; k++) {
        WPOP();
        BWD(0, zb);
    }
    while (wh < wt)
        WPOP();
#undef WPOP
#undef BWD
#undef FWD
#undef EMIT
    free(wq);
    return n;
}

/* Compute order of group r; returns its length (-1: out of memory). */
static int group_order(int kind, const xmp_schedule_t *s, int r, int max_warmup, ord_t *o)
{
    const int M = s->nmb, R = s->ngroups, V = s->nchunks[r];
    int n = 0;
    if (kind <= XMP_SCHED_EAGER_INTERLEAVED_1F1B) {
        int total = M * V, w = warm_of(kind, s->nstages, M, R, V, r);
        int inter = kind >= XMP_SCHED_INTERLEAVED_1F1B;
        if (max_warmup > 0 && w > max_warmup)
            w = max_warmup;
        for (int k = 0; k < total + total; k++) {
            /* forward index kf and backward index kb of entry k */
            int isF, idx;
            if (kind == XMP_SCHED_GPIPE) {
                isF = k < total;
                idx = isF ? k : k - total;
            } else if (k < w) {
                isF = 1;
                idx = k;
            } else if (k < w + 2 * (total - w)) {
                int q = k - w; /* steady: one backward, then one forward */
                isF = q % 2 == 1;
                idx = isF ? w + q / 2 : q / 2;
            } else {
                isF = 0;
                idx = k - w - (total - w);
            }
            ord_t e;
            e.kind = isF ? XMP_ACT_F : XMP_ACT_B;
            if (inter) {
                int cg = (idx % (R * V)) / R;
                e.chunk = isF ? cg : V - 1 - cg;
                e.mb = (idx / (R * V)) * R + idx % R;
            } else {
                e.chunk = 0;
                e.mb = idx;
            }
            o[n++] = e;
        }
        return n;
    }
    if (kind == XMP_SCHED_DUALPIPE_V)
        return dualpipe_order(s, r, o);
    /* V shape (zb-v, v-1f1b): chunk 0 = stage r, chunk 1 = stage 2R-1-r. */
    int nm = M > 2 * R - 1 ? M : 2 * R - 1;
    int f0 = 0, f1 = 0, b0 = 0, b1 = 0, w0, w1;
#define ADD(k, c, m)                                                                               \
    do {                                                                                           \
        int mb_ = (m);                                                                             \
        if (mb_ < M) {                                                                             \
            o[n].kind = (k);                                                                       \
            o[n].chunk = (c);                                                                      \
            o[n].mb = mb_;                                                                         \
            n++;                                                                                   \
        }                                                                                          \
    } while (0)
    for (int k = 0; k < 2 * (R - r) - 1; k++)
        ADD(XMP_ACT_F, 0, f0++);
    for (int k = 0; k < r; k++) {
        ADD(XMP_ACT_F, 1, f1++);
        ADD(XMP_ACT_F, 0, f0++);
    }
    for (int k = 0; k < R - r; k++) {
        ADD(XMP_ACT_F, 1, f1++);
        ADD(XMP_ACT_I, 1, b1);
        ADD(XMP_ACT_W, 1, b1++);
    }
    while (f1 < f0 || f0 < nm) {
        if (f0 < nm)
            ADD(XMP_ACT_F, 0, f0++);
        ADD(XMP_ACT_I, 0, b0);
        ADD(XMP_ACT_W, 0, b0++);
        ADD(XMP_ACT_F, 1, f1++);
        ADD(XMP_ACT_I, 1, b1);
        ADD(XMP_ACT_W, 1, b1++);
    }
    w0 = b0;
    w1 = b1;
    for (int k = 0; k < r; k++) {
        ADD(XMP_ACT_I, 0, b0++);
        ADD(XMP_ACT_I, 1, b1++);
    }
    for (int k = 0; k < R - r; k++) {
        ADD(XMP_ACT_I, 0, b0++);
        ADD(XMP_ACT_W, 0, w0++);
    }
    while (w1 < b1)
        ADD(XMP_ACT_W, 1, w1++);
    while (w0 < b0)
        ADD(XMP_ACT_W, 0, w0++);
#undef ADD
    if (kind == XMP_SCHED_V_1F1B) { /* whole backwards: I becomes B, W goes */
        int m = 0;
        for (int k = 0; k < n; k++) {
            if (o[k].kind == XMP_ACT_W)
                continue;
            if (o[k].kind == XMP_ACT_I)
                o[k].kind = XMP_ACT_B;
            o[m++] = o[k];
        }
        n = m;
    }
    return n;
}

/* Appends group g's actions for compute order o[0..n): transfers around each compute
 * action (see xmp_sched_generate), then R and O. */
static int gen_group(xmp_schedule_t *s, int g, const ord_t *o, int n)
{
    const int M = s->nmb, E = s->nedges, C = s->nchunks[g];
    int r = 0, inflight = 0, peak = 0;
    for (int c = 0; c < C; c++) {
        int st = s->group_stage[g][c];
        for (int e = 0; e < E; e++)
            if (s->edges[e].dst == st)
                r |= push(s, g, XMP_ACT_START, 0, e, XMP_DIR_ACT, c);
        for (int e = 0; e < E; e++)
            if (s->edges[e].src == st)
                r |= push(s, g, XMP_ACT_START, 0, e, XMP_DIR_GRAD, c);
    }
    for (int k = 0; k < n; k++) {
        int m = o[k].mb, c = o[k].chunk, st = s->group_stage[g][c];
        if (o[k].kind == XMP_ACT_F) {
            for (int e = 0; e < E; e++)
                if (s->edges[e].dst == st) {
                    r |= push(s, g, XMP_ACT_WAIT, m, e, XMP_DIR_ACT, c);
                    if (m + 1 < M)
                        r |= push(s, g, XMP_ACT_START, m + 1, e, XMP_DIR_ACT, c);
                }
            r |= push(s, g, XMP_ACT_F, m, -1, 0, c);
            for (int e = 0; e < E; e++)
                if (s->edges[e].src == st)
                    r |= push(s, g, XMP_ACT_START, m, e, XMP_DIR_ACT, c);
            if (++inflight > peak)
                peak = inflight;
        } else if (o[k].kind == XMP_ACT_W) {
            r |= push(s, g, XMP_ACT_W, m, -1, 0, c);
        } else {
            for (int e = 0; e < E; e++)
                if (s->edges[e].src == st) {
                    r |= push(s, g, XMP_ACT_WAIT, m, e, XMP_DIR_ACT, c);
                    r |= push(s, g, XMP_ACT_WAIT, m, e, XMP_DIR_GRAD, c);
                    if (m + 1 < M)
                        r |= push(s, g, XMP_ACT_START, m + 1, e, XMP_DIR_GRAD, c);
                }
            r |= push(s, g, o[k].kind, m, -1, 0, c);
            for (int e = 0; e < E; e++)
                if (s->edges[e].dst == st)
                    r |= push(s, g, XMP_ACT_START, m, e, XMP_DIR_GRAD, c);
            inflight--;
        }
    }
    for (int c = 0; c < C; c++) {
        int st = s->group_stage[g][c];
        for (int e = 0; e < E; e++)
            if (s->edges[e].dst == st)
                for (int m = 0; m < M; m++)
                    r |= push(s, g, XMP_ACT_WAIT, m, e, XMP_DIR_GRAD, c);
    }
    r |= push(s, g, XMP_ACT_R, -1, -1, 0, 0);
    r |= push(s, g, XMP_ACT_O, -1, -1, 0, 0);
    s->max_inflight[g] = peak > 0 ? peak : 1;
    return r;
}

/* Checks that kind fits the map, M and the groups; message names the bad values. */
static int check_fit(int kind, const xmp_schedule_t *s, char *err, size_t errlen)
{
    const int R = s->ngroups, M = s->nmb, S = s->nstages;
    const char *kn = xmp_sched_kind_name(kind);
    int V = s->nchunks[0];
    for (int g = 1; g < R; g++)
        if (s->nchunks[g] != V && kind >= XMP_SCHED_INTERLEAVED_1F1B) {
            xmp_err_buf(err, errlen,
                        "%s needs the same number of stages on every group: group 0 holds "
                        "%d, group %d holds %d",
                        kn, V, g, s->nchunks[g]);
            return -1;
        }
    if (kind <= XMP_SCHED_EAGER_1F1B) {
        if (xmp_sched_is_virtual(s)) {
            xmp_err_buf(err, errlen,
                        "%s runs one stage per group, but %d stages sit on %d groups (V=%d; use "
                        "interleaved-1f1b or zb-v)",
                        kn, S, R, S / R);
            return -1;
        }
        if (kind != XMP_SCHED_GPIPE && M < S) {
            xmp_err_buf(
                err, errlen,
                "%s needs at least as many microbatches as stages: M=%d < S=%d (use M >= %d or "
                "gpipe)",
                kn, M, S, S);
            return -1;
        }
        return 0;
    }
    if (kind <= XMP_SCHED_EAGER_INTERLEAVED_1F1B) {
        if (M % R != 0) {
            xmp_err_buf(
                err, errlen,
                "%s needs M a multiple of R (Megatron-LM runs microbatches in rounds of R): "
                "M=%d, R=%d, V=%d (use M=%d or M=%d)",
                kn, M, R, V, M / R * R > 0 ? M / R * R : R, (M / R + 1) * R);
            return -1;
        }
        return 0;
    }
    if (V != 2) {
        xmp_err_buf(err, errlen,
                    "%s needs exactly V=2 stages per group (stages r and 2R-1-r): R=%d V=%d", kn, R,
                    V);
        return -1;
    }
    if (kind == XMP_SCHED_DUALPIPE_V && M < 2 * R) {
        xmp_err_buf(err, errlen,
                    "%s needs at least as many microbatches as stages: M=%d < 2R=%d (R=%d, V=2)",
                    kn, M, 2 * R, R);
        return -1;
    }
    for (int g = 0; g < R; g++)
        if (s->group_stage[g][0] != g || s->group_stage[g][1] != 2 * R - 1 - g) {
            xmp_err_buf(
                err, errlen,
                "%s needs the V map (group r holds stages r and 2R-1-r): group %d holds stages "
                "%d and %d, R=%d",
                kn, g, s->group_stage[g][0], s->group_stage[g][1], R);
            return -1;
        }
    return 0;
}

/* Places W by simulation (delay_wgrad): s has I and no W; returns the filled schedule. */
static int fill_wgrad(xmp_schedule_t **ps, const xmp_gen_opts_t *o, char *err, size_t errlen)
{
    xmp_schedule_t *s = *ps, *g = NULL;
    int S = s->nstages, P = 2 * s->nedges, rc = -1;
    double *cf = malloc((size_t)S * 3 * sizeof(double));
    double *cx = malloc((size_t)(P > 0 ? P : 1) * sizeof(double));
    xmp_sim_result_t res;
    memset(&res, 0, sizeof(res));
    if (cf == NULL || cx == NULL) {
        xmp_err_buf(err, errlen, "schedule: out of memory");
        goto out;
    }
    for (int i = 0; i < S; i++) {
        cf[i] = o->f > 0 ? o->f : 1.0;
        cf[S + i] = o->i > 0 ? o->i : 1.0;
        cf[2 * S + i] = o->w > 0 ? o->w : 1.0;
    }
    for (int p = 0; p < P; p++)
        cx[p] = o->xfer;
    xmp_sim_costs_t c;
    memset(&c, 0, sizeof(c));
    c.f = cf;
    c.i = cf + S;
    c.w = cf + 2 * S;
    c.xfer = cx;
    int r = xmp_sched__engine_run(s, &c, 1, o->max_pending_w, &res, err, errlen);
    if (r != 0) {
        if (r == 1)
            xmp_err_buf(err, errlen, "schedule: generated %s deadlocks: %s", s->name, res.msg);
        goto out;
    }
    if (xmp_sched_create_virtual(S, s->ngroups, s->stage_group, s->nmb, s->nedges, s->edges, &g,
                                 err, errlen) != 0)
        goto out;
    memcpy(g->name, s->name, sizeof(g->name));
    g->recompute = s->recompute;
    g->recompute_frac = s->recompute_frac;
    for (int k = 0; k < s->ngroups; k++) {
        g->max_inflight[k] = s->max_inflight[k];
        for (int j = 0; j < res.len[k]; j++)
            if (xmp_sched_append(g, k, res.acts[k][j]) != 0) {
                xmp_err_buf(err, errlen, "schedule: out of memory");
                goto out;
            }
    }
    xmp_sched_destroy(s);
    *ps = g;
    g = NULL;
    rc = 0;
out:
    xmp_sim_result_free(&res);
    xmp_sched_destroy(g);
    free(cf);
    free(cx);
    return rc;
}

static int fit_memory(int kind, int nstages, int ngroups, const int *stage_group, int nmb,
                      int nedges, const xmp_sedge_t *edges, const xmp_gen_opts_t *opts,
                      xmp_schedule_t **out, char *err, size_t errlen);

int xmp_sched_generate_map(int kind, int nstages, int ngroups, const int *stage_group, int nmb,
                           int nedges, const xmp_sedge_t *edges, const xmp_gen_opts_t *opts,
                           xmp_schedule_t **out, char *err, size_t errlen)
{
    xmp_gen_opts_t o;
    memset(&o, 0, sizeof(o));
    if (opts)
        o = *opts;
    if (kind < 0 || kind >= XMP_SCHED_KIND_COUNT_) {
        xmp_err_buf(err, errlen,
                    "schedule kind %d unknown (gpipe, 1f1b, eager-1f1b, interleaved-1f1b, "
                    "eager-interleaved-1f1b, zb-v, v-1f1b, dualpipe-v)",
                    kind);
        return -1;
    }
    if (o.recompute < 0 || o.recompute > XMP_RECOMPUTE_SELECTIVE || o.recompute_frac < 0 ||
        o.recompute_frac > 1) {
        xmp_err_buf(err, errlen,
                    "schedule: recompute mode %d fraction %g (modes 0..2, fraction 0..1)",
                    o.recompute, o.recompute_frac);
        return -1;
    }
    if (o.max_act_bytes > 0)
        return fit_memory(kind, nstages, ngroups, stage_group, nmb, nedges, edges, &o, out, err,
                          errlen);
    int *map = NULL;
    if (stage_group == NULL && ngroups != nstages) {
        map = malloc((size_t)nstages * sizeof(int));
        if (map == NULL) {
            xmp_err_buf(err, errlen, "schedule: out of memory");
            return -1;
        }
        if (kind >= XMP_SCHED_ZB_V) {
            if (nstages != 2 * ngroups) {
                xmp_err_buf(err, errlen, "%s needs exactly V=2 stages per group: %d stages on R=%d",
                            xmp_sched_kind_name(kind), nstages, ngroups);
                free(map);
                return -1;
            }
            xmp_sched_vshape_map(ngroups, map);
        } else {
            if (nstages % ngroups != 0) {
                xmp_err_buf(err, errlen, "%s: %d stages do not split evenly over R=%d groups",
                            xmp_sched_kind_name(kind), nstages, ngroups);
                free(map);
                return -1;
            }
            xmp_sched_interleaved_map(ngroups, nstages / ngroups, map);
        }
        stage_group = map;
    }
    xmp_schedule_t *s = NULL;
    ord_t *ord = NULL;
    int rc = xmp_sched_create_virtual(nstages, ngroups, stage_group, nmb, nedges, edges, &s, err,
                                      errlen);
    free(map);
    if (rc != 0)
        return -1;
    if (check_fit(kind, s, err, errlen) != 0)
        goto out_free;
    int split = o.delay_wgrad || kind == XMP_SCHED_ZB_V;
    snprintf(s->name, sizeof(s->name), "%s%s", xmp_sched_kind_name(kind),
             o.delay_wgrad ? "+dw" : "");
    s->recompute = o.recompute;
    s->recompute_frac = o.recompute == XMP_RECOMPUTE_BLOCK ? 1.0
                        : o.recompute == XMP_RECOMPUTE_SELECTIVE
                            ? (o.recompute_frac > 0 ? o.recompute_frac : 0.25)
                            : 0.0;
    int C = 1;
    for (int g = 0; g < ngroups; g++)
        if (s->nchunks[g] > C)
            C = s->nchunks[g];
    ord = malloc((size_t)(3 * C * nmb + 8 * ngroups + 8) * sizeof(ord_t));
    if (ord == NULL) {
        xmp_err_buf(err, errlen, "schedule: out of memory");
        goto out_free;
    }
    for (int g = 0; g < ngroups; g++) {
        int n = group_order(kind, s, g, o.max_warmup, ord);
        if (n < 0) {
            xmp_err_buf(err, errlen, "schedule: out of memory");
            goto out_free;
        }
        if (o.delay_wgrad) { /* B (or ZB-V's I) becomes I, W placed by simulation */
            int m = 0;
            for (int k = 0; k < n; k++) {
                if (ord[k].kind == XMP_ACT_W)
                    continue;
                if (ord[k].kind == XMP_ACT_B)
                    ord[k].kind = XMP_ACT_I;
                ord[m++] = ord[k];
            }
            n = m;
        }
        if (gen_group(s, g, ord, n) != 0) {
            xmp_err_buf(err, errlen, "schedule: out of memory");
            goto out_free;
        }
    }
    (void)split;
    if (o.delay_wgrad && fill_wgrad(&s, &o, err, errlen) != 0)
        goto out_free;
    if (xmp_sched_validate(s, NULL, 0, err, errlen) != 0)
        goto out_free;
    {
        char m[1024];
        if (xmp_sched_dryrun(s, 0, m, sizeof(m)) != 0) {
            xmp_err_buf(err, errlen, "%s with R=%d groups, V=%d, M=%d does not run: %s", s->name,
                        ngroups, C, nmb, m);
            goto out_free;
        }
    }
    free(ord);
    *out = s;
    return 0;
out_free:
    free(ord);
    xmp_sched_destroy(s);
    return -1;
}

int xmp_sched_generate(int kind, int nstages, int nmb, int nedges, const xmp_sedge_t *edges,
                       const xmp_gen_opts_t *opts, xmp_schedule_t **out, char *err, size_t errlen)
{
    return xmp_sched_generate_map(kind, nstages, nstages, NULL, nmb, nedges, edges, opts, out, err,
                                  errlen);
}

int xmp_sched_generate_named(const char *name, int R, int V, int M, const xmp_gen_opts_t *opts,
                             xmp_schedule_t **out, char *err, size_t errlen)
{
    char base[64];
    xmp_gen_opts_t o;
    memset(&o, 0, sizeof(o));
    if (opts)
        o = *opts;
    if (name == NULL || strlen(name) >= sizeof(base)) {
        xmp_err_buf(err, errlen, "schedule: no or too long name");
        return -1;
    }
    snprintf(base, sizeof(base), "%s", name);
    size_t n = strlen(base);
    if (n > 3 && strcmp(base + n - 3, "+dw") == 0) {
        base[n - 3] = '\0';
        o.delay_wgrad = 1;
    }
    int kind = xmp_sched_kind_parse(base);
    if (kind < 0) {
        xmp_err_buf(err, errlen,
                    "schedule '%s' unknown (gpipe, 1f1b, eager-1f1b, interleaved-1f1b, "
                    "eager-interleaved-1f1b, zb-v, v-1f1b, dualpipe-v; '+dw' delays weight "
                    "gradients)",
                    name);
        return -1;
    }
    if (R < 1 || V < 1 || M < 1 || (long)R * V > 4096) {
        xmp_err_buf(err, errlen,
                    "%s: R=%d groups, V=%d stages per group, M=%d microbatches (need >= 1)", base,
                    R, V, M);
        return -1;
    }
    if (!xmp_sched_kind_virtual(kind) && V != 1) {
        xmp_err_buf(err, errlen,
                    "%s runs one stage per group: V=%d (use interleaved-1f1b or zb-v for V > 1)",
                    base, V);
        return -1;
    }
    if (kind >= XMP_SCHED_ZB_V && V != 2) {
        xmp_err_buf(err, errlen,
                    "%s needs exactly V=2 stages per group (stages r and 2R-1-r): R=%d V=%d", base,
                    R, V);
        return -1;
    }
    int S = R * V;
    xmp_sedge_t *edges = calloc((size_t)S, sizeof(*edges));
    if (edges == NULL) {
        xmp_err_buf(err, errlen, "schedule: out of memory");
        return -1;
    }
    int ne = xmp_sched_chain_edges(S, edges);
    int r = xmp_sched_generate_map(kind, S, R, NULL, M, ne, edges, &o, out, err, errlen);
    free(edges);
    return r;
}

/* Memory cap: candidates (kind, then its non-eager twin) x recomputation (from the
 * requested mode upwards: none, selective, block) x warm-up cap (the kind's own, then
 * shallower), each simulated with the option costs; the fastest whose modelled peak fits
 * wins (ties: the earlier candidate). */
static int fit_memory(int kind, int nstages, int ngroups, const int *stage_group, int nmb,
                      int nedges, const xmp_sedge_t *edges, const xmp_gen_opts_t *opts,
                      xmp_schedule_t **out, char *err, size_t errlen)
{
    const double cap = opts->max_act_bytes;
    if (opts->act_bytes == NULL) {
        xmp_err_buf(err, errlen, "memory cap %.0f B needs act_bytes per stage", cap);
        return -1;
    }
    int kinds[2] = {kind, -1};
    if (kind == XMP_SCHED_EAGER_1F1B)
        kinds[1] = XMP_SCHED_1F1B;
    if (kind == XMP_SCHED_EAGER_INTERLEAVED_1F1B)
        kinds[1] = XMP_SCHED_INTERLEAVED_1F1B;
    static const int rec_order[3] = {XMP_RECOMPUTE_NONE, XMP_RECOMPUTE_SELECTIVE,
                                     XMP_RECOMPUTE_BLOCK};
    int r0 = 0;
    while (rec_order[r0] != opts->recompute)
        r0++;
    int S = nstages, P = 2 * nedges;
    double *cf = malloc((size_t)S * 3 * sizeof(double));
    double *cx = calloc((size_t)(P > 0 ? P : 1), sizeof(double));
    if (cf == NULL || cx == NULL) {
        free(cf);
        free(cx);
        xmp_err_buf(err, errlen, "schedule: out of memory");
        return -1;
    }
    for (int i = 0; i < S; i++) {
        cf[i] = opts->f > 0 ? opts->f : 1.0;
        cf[S + i] = opts->i > 0 ? opts->i : 1.0;
        cf[2 * S + i] = opts->w > 0 ? opts->w : 1.0;
    }
    for (int p = 0; p < P; p++)
        cx[p] = opts->xfer;
    xmp_sim_costs_t c;
    memset(&c, 0, sizeof(c));
    c.f = cf;
    c.i = cf + S;
    c.w = cf + 2 * S;
    c.xfer = cx;
    c.act_bytes = opts->act_bytes;
    c.ckpt_bytes = opts->ckpt_bytes;
    c.selective_keep = opts->selective_keep;
    c.base_bytes = opts->base_bytes;
    /* with the weight-gradient delay, also bound the queued W (each holds activations) */
    int pws[5] = {opts->max_pending_w, 0, 0, 0, 0}, npw = 1;
    if (opts->delay_wgrad) {
        int cand[4] = {4 * ngroups, 2 * ngroups, ngroups, 1};
        for (int k = 0; k < 4; k++)
            if (opts->max_pending_w == 0 || cand[k] < opts->max_pending_w) {
                int dup = 0;
                for (int j = 0; j < npw; j++)
                    dup |= pws[j] == cand[k];
                if (!dup)
                    pws[npw++] = cand[k];
            }
    }
    xmp_schedule_t *best = NULL;
    double best_step = 0, min_peak = -1;
    char min_desc[160] = "", first_err[512] = "";
    int tried = 0;
    for (int ki = 0; ki < 2 && kinds[ki] >= 0; ki++) {
        int kd = kinds[ki];
        int has_warm = kd != XMP_SCHED_GPIPE && kd < XMP_SCHED_ZB_V;
        for (int ri = r0; ri < 3; ri++)
            for (int pi = 0; pi < npw; pi++) {
                int D = 1; /* the kind's own deepest warm-up, known after w = 0 */
                for (int w = 0; w >= 0; w = w == 0  ? (has_warm && D > 1 ? D - 1 : -1)
                                            : w > 1 ? w - 1
                                                    : -1) {
                    if (w == 0 && ri > r0 && first_err[0] != '\0' && tried == 0)
                        break;
                    xmp_gen_opts_t o = *opts;
                    o.max_act_bytes = 0;
                    o.recompute = rec_order[ri];
                    o.max_warmup = w;
                    o.max_pending_w = pws[pi];
                    xmp_schedule_t *s = NULL;
                    char m[512];
                    if (xmp_sched_generate_map(kd, nstages, ngroups, stage_group, nmb, nedges,
                                               edges, &o, &s, m, sizeof(m)) != 0) {
                        if (w == 0) {
                            if (first_err[0] == '\0')
                                snprintf(first_err, sizeof(first_err), "%s", m);
                            break;
                        }
                        continue; /* too shallow for this order: deadlocks */
                    }
                    if (w == 0)
                        for (int g = 0; g < ngroups; g++)
                            if (s->max_inflight[g] > D)
                                D = s->max_inflight[g];
                    tried++;
                    xmp_sim_result_t res;
                    if (xmp_sched__engine_run(s, &c, 0, 0, &res, m, sizeof(m)) != 0) {
                        xmp_sim_result_free(&res);
                        xmp_sched_destroy(s);
                        continue;
                    }
                    double peak = 0;
                    for (int g = 0; g < res.nstages; g++)
                        if (res.peak_bytes[g] > peak)
                            peak = res.peak_bytes[g];
                    if (min_peak < 0 || peak < min_peak) {
                        min_peak = peak;
                        snprintf(min_desc, sizeof(min_desc),
                                 "%s, recompute=%s, warm-up cap %d, pending W cap %d", s->name,
                                 xmp_recompute_name(rec_order[ri]), w, pws[pi]);
                    }
                    if (peak <= cap && (best == NULL || res.step_s < best_step)) {
                        xmp_sched_destroy(best);
                        best = s;
                        best_step = res.step_s;
                        s = NULL;
                    }
                    xmp_sim_result_free(&res);
                    xmp_sched_destroy(s);
                }
            }
    }
    free(cf);
    free(cx);
    if (best == NULL) {
        if (tried == 0)
            xmp_err_buf(err, errlen, "%s", first_err);
        else
            xmp_err_buf(err, errlen,
                        "memory cap %.0f B per group not reachable with %s (R=%d, V=%d, M=%d): the "
                        "smallest modelled peak is %.0f B (%s)",
                        cap, xmp_sched_kind_name(kind), ngroups, nstages / ngroups, nmb, min_peak,
                        min_desc);
        return -1;
    }
    *out = best;
    return 0;
}
