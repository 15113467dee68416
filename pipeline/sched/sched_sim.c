/*
 * The timed simulator of a schedule (xmp_sim_run), the deadlock dry run on the same
 * engine (xmp_sched_dryrun) and the ASCII timeline renderer (xmp_sim_render). Pure C.
 */
#include "sched/schedule.h"
#include "sched/sched_priv.h"
#include "util/xmp_err.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------- simulation engine */

typedef struct {
    const xmp_schedule_t *s;
    const xmp_sim_costs_t *c;
    int fill, max_pw;
    int P, M, G, CM; /* CM: max chunks * M */
    int *cnt;        /* [P][2] starts so far per side */
    int *kofmb;      /* [P][2][M] */
    double *enq;     /* [P][2][M] */
    int *nend;       /* [P] ends known */
    double *end;     /* [P][M] */
    int *pc;         /* per group */
    double *t;
    int *held;
    double *heldb;              /* per group: bytes held */
    double *hb;                 /* per stage and mb: bytes that microbatch holds */
    int *pend, *phead, *ptail;  /* pending W FIFO per group [G][CM]: chunk*M + mb */
    double *nic_out, *nic_in;   /* share_nic: per group, when its NICs are free again */
    double *cred_out, *cred_in; /* nic_burst_s: each NIC's credit (seconds) when it frees */
} engine_t;

static double cost_of(const engine_t *E, int g, xmp_action_t a)
{
    const xmp_sim_costs_t *c = E->c;
    int st = a.kind <= XMP_ACT_W ? xmp_action_stage(E->s, g, a) : 0;
    double rf = E->s->recompute != XMP_RECOMPUTE_NONE && c->f ? E->s->recompute_frac * c->f[st] : 0;
    switch (a.kind) {
    case XMP_ACT_F:
        return c->f ? c->f[st] : 0;
    case XMP_ACT_I:
        return (c->i ? c->i[st] : 0) + rf;
    case XMP_ACT_W:
        return c->w ? c->w[st] : 0;
    case XMP_ACT_B:
        return (c->b ? c->b[st] : (c->i ? c->i[st] : 0) + (c->w ? c->w[st] : 0)) + rf;
    case XMP_ACT_R:
        return c->r;
    case XMP_ACT_O:
        return c->o;
    default:
        return 0;
    }
}

/* Memory model: bytes a microbatch keeps on stage st between F and B/W. */
static double kept_bytes(const engine_t *E, int st)
{
    const xmp_sim_costs_t *c = E->c;
    if (c->act_bytes == NULL)
        return 0;
    switch (E->s->recompute) {
    case XMP_RECOMPUTE_BLOCK:
        return c->ckpt_bytes ? c->ckpt_bytes[st] : 0;
    case XMP_RECOMPUTE_SELECTIVE:
        return c->act_bytes[st] * (c->selective_keep > 0 ? c->selective_keep : 0.5);
    default:
        return c->act_bytes[st];
    }
}

static void mem_peak(engine_t *E, xmp_sim_result_t *res, int g, double extra)
{
    double base = E->c->base_bytes ? E->c->base_bytes[g] : 0;
    if (E->heldb[g] + extra + base > res->peak_bytes[g])
        res->peak_bytes[g] = E->heldb[g] + extra + base;
}

/* Memory and in-flight bookkeeping of compute action a on group g (after it ran). */
static void mem_account(engine_t *E, xmp_sim_result_t *res, int g, xmp_action_t a)
{
    int st = xmp_action_stage(E->s, g, a);
    double *h = &E->hb[(size_t)st * E->M + a.mb];
    double full = E->c->act_bytes ? E->c->act_bytes[st] : 0;
    int rec = E->s->recompute != XMP_RECOMPUTE_NONE;
    switch (a.kind) {
    case XMP_ACT_F:
        if (++E->held[g] > res->peak_act[g])
            res->peak_act[g] = E->held[g];
        *h = kept_bytes(E, st);
        E->heldb[g] += *h;
        mem_peak(E, res, g, 0);
        break;
    case XMP_ACT_B:
        E->held[g]--;
        if (rec)
            mem_peak(E, res, g, full - *h); /* rebuilt for the backward */
        E->heldb[g] -= *h;
        *h = 0;
        break;
    case XMP_ACT_I:
        if (rec) { /* rebuilt; the weight gradient reads them at W */
            E->heldb[g] += full - *h;
            *h = full;
            mem_peak(E, res, g, 0);
        }
        break;
    case XMP_ACT_W:
        E->held[g]--;
        E->heldb[g] -= *h;
        *h = 0;
        break;
    default:
        break;
    }
}

static void advance_plan(engine_t *E, int p)
{
    const int M = E->M;
    double x = E->c->xfer ? E->c->xfer[p] : 0;
    int sg = -1, rg = -1; /* share_nic: the groups whose NICs the transfer takes */
    if (E->nic_out) {
        sg = E->s->stage_group[xmp_xfer_sender(E->s, p / 2, p % 2)];
        rg = E->s->stage_group[xmp_xfer_receiver(E->s, p / 2, p % 2)];
        if (sg == rg)
            sg = rg = -1;
    }
    while (E->nend[p] < M && E->nend[p] < E->cnt[2 * p] && E->nend[p] < E->cnt[2 * p + 1]) {
        int k = E->nend[p];
        double b = E->enq[(2 * p) * M + k];
        if (E->enq[(2 * p + 1) * M + k] > b)
            b = E->enq[(2 * p + 1) * M + k];
        if (k > 0 && E->end[p * M + k - 1] > b)
            b = E->end[p * M + k - 1];
        double d = x;
        if (sg >= 0) {
            if (E->nic_out[sg] > b)
                b = E->nic_out[sg];
            if (E->nic_in[rg] > b)
                b = E->nic_in[rg];
            double beta = E->c->nic_burst_s;
            if (beta > 0) {
                /* token buckets: each NIC gains one second of credit per idle second, up to
                 * beta; the transfer goes at once for the smaller credit, at the rate after */
                double ko = fmin(beta, E->cred_out[sg] + (b - E->nic_out[sg]));
                double ki = fmin(beta, E->cred_in[rg] + (b - E->nic_in[rg]));
                double k0 = fmin(ko, ki);
                d = x > k0 ? x - k0 : 0;
                /* a bucket pays x and refills for d */
                E->cred_out[sg] = ko - x + d;
                E->cred_in[rg] = ki - x + d;
            }
            E->nic_out[sg] = E->nic_in[rg] = b + d;
        }
        E->end[p * M + k] = b + d;
        E->nend[p]++;
    }
}

/* End time of the transfer a (START/WAIT) refers to on group g, or -1 if
 * not known yet. */
static double xfer_end(const engine_t *E, int g, xmp_action_t a)
{
    int p = xmp_plan_index(a.edge, a.dir);
    int side = xmp_sched__act_side(E->s, g, a);
    int k = E->kofmb[(2 * p + side) * E->M + a.mb];
    if (k < 0 || k >= E->nend[p])
        return -1;
    return E->end[p * E->M + k];
}

static int rec_push(xmp_sim_result_t *r, int st, xmp_action_t a, double t0, double t1)
{
    int n = r->len[st];
    r->acts[st][n] = a;
    r->t0[st][n] = t0;
    r->t1[st][n] = t1;
    r->len[st] = n + 1;
    return n;
}

void xmp_sim_result_free(xmp_sim_result_t *res)
{
    if (res == NULL)
        return;
    for (int i = 0; i < res->nstages; i++) {
        if (res->acts)
            free(res->acts[i]);
        if (res->t0)
            free(res->t0[i]);
        if (res->t1)
            free(res->t1[i]);
    }
    free(res->acts);
    free(res->t0);
    free(res->t1);
    free(res->busy_s);
    free(res->bubble);
    free(res->recompute_s);
    free(res->peak_bytes);
    free(res->peak_act);
    free(res->len);
    memset(res, 0, sizeof(*res));
}

static int result_alloc(const xmp_schedule_t *s, xmp_sim_result_t *r)
{
    int G = s->ngroups;
    memset(r, 0, sizeof(*r));
    r->nstages = G;
    r->busy_s = calloc((size_t)G, sizeof(double));
    r->bubble = calloc((size_t)G, sizeof(double));
    r->recompute_s = calloc((size_t)G, sizeof(double));
    r->peak_bytes = calloc((size_t)G, sizeof(double));
    r->peak_act = calloc((size_t)G, sizeof(int));
    r->len = calloc((size_t)G, sizeof(int));
    r->acts = calloc((size_t)G, sizeof(*r->acts));
    r->t0 = calloc((size_t)G, sizeof(*r->t0));
    r->t1 = calloc((size_t)G, sizeof(*r->t1));
    if (!r->busy_s || !r->bubble || !r->recompute_s || !r->peak_bytes || !r->peak_act || !r->len ||
        !r->acts || !r->t0 || !r->t1)
        return -1;
    for (int i = 0; i < G; i++) {
        size_t cap = (size_t)s->len[i] + (size_t)s->nmb * (size_t)s->nchunks[i] + 1;
        r->acts[i] = malloc(cap * sizeof(xmp_action_t));
        r->t0[i] = malloc(cap * sizeof(double));
        r->t1[i] = malloc(cap * sizeof(double));
        if (!r->acts[i] || !r->t0[i] || !r->t1[i])
            return -1;
    }
    return 0;
}

enum { CAND_NONE = 0, CAND_EXEC = 1, CAND_FILLW = 2 };

/* What group g can do next: CAND_EXEC / CAND_FILLW, *blocked_fill = 1 when
 * the group is blocked on an unknown transfer and only runs a W to fill. */
static int classify(engine_t *E, int g, int *blocked_fill)
{
    const xmp_schedule_t *s = E->s;
    int haspend = E->fill && E->ptail[g] > E->phead[g];
    *blocked_fill = 0;
    if (E->fill && E->max_pw > 0 && E->ptail[g] - E->phead[g] > E->max_pw)
        return CAND_FILLW;
    if (E->pc[g] == s->len[g])
        return haspend ? CAND_FILLW : CAND_NONE;
    xmp_action_t a = s->acts[g][E->pc[g]];
    if (haspend && (a.kind == XMP_ACT_R || a.kind == XMP_ACT_O))
        return CAND_FILLW;
    if (a.kind == XMP_ACT_WAIT && E->c->late_recv && xmp_sched__act_side(s, g, a) == 1 &&
        E->kofmb[(2 * xmp_plan_index(a.edge, a.dir) + 1) * E->M + a.mb] < 0)
        return CAND_EXEC; /* late receive: start it first */
    if (a.kind == XMP_ACT_WAIT) {
        double e = xfer_end(E, g, a);
        if (e >= 0)
            return haspend && e > E->t[g] ? CAND_FILLW : CAND_EXEC;
        if (haspend) {
            *blocked_fill = 1;
            return CAND_FILLW;
        }
        return CAND_NONE;
    }
    return CAND_EXEC;
}

int xmp_sched__engine_run(const xmp_schedule_t *s, const xmp_sim_costs_t *c, int fill, int max_pw,
                          xmp_sim_result_t *res, char *err, size_t errlen)
{
    const int G = s->ngroups, M = s->nmb, P = 2 * s->nedges;
    engine_t E;
    memset(&E, 0, sizeof(E));
    memset(res, 0, sizeof(*res));
    E.s = s;
    E.c = c;
    E.fill = fill;
    E.max_pw = max_pw;
    E.P = P;
    E.M = M;
    E.G = G;
    int C = 1;
    for (int g = 0; g < G; g++)
        if (s->nchunks[g] > C)
            C = s->nchunks[g];
    E.CM = C * M;
    int rc = -1;
    size_t PM = (size_t)(P > 0 ? P : 1) * (size_t)M;
    E.cnt = calloc((size_t)2 * (P > 0 ? P : 1), sizeof(int));
    E.kofmb = malloc(2 * PM * sizeof(int));
    E.enq = calloc(2 * PM, sizeof(double));
    E.nend = calloc((size_t)(P > 0 ? P : 1), sizeof(int));
    E.end = calloc(PM, sizeof(double));
    E.pc = calloc((size_t)G, sizeof(int));
    E.t = calloc((size_t)G, sizeof(double));
    E.held = calloc((size_t)G, sizeof(int));
    E.heldb = calloc((size_t)G, sizeof(double));
    E.hb = calloc((size_t)s->nstages * (size_t)M, sizeof(double));
    E.pend = calloc((size_t)G * (size_t)E.CM, sizeof(int));
    E.phead = calloc((size_t)G, sizeof(int));
    E.ptail = calloc((size_t)G, sizeof(int));
    if (c->share_nic) {
        E.nic_out = calloc((size_t)G, sizeof(double));
        E.nic_in = calloc((size_t)G, sizeof(double));
        E.cred_out = calloc((size_t)G, sizeof(double));
        E.cred_in = calloc((size_t)G, sizeof(double));
        for (int g = 0; E.cred_out && E.cred_in && g < G; g++)
            E.cred_out[g] = E.cred_in[g] = c->nic_burst_s > 0 ? c->nic_burst_s : 0;
    }
    if (!E.cnt || !E.kofmb || !E.enq || !E.nend || !E.end || !E.pc || !E.t || !E.held || !E.heldb ||
        !E.hb || !E.pend || !E.phead || !E.ptail ||
        (c->share_nic && (!E.nic_out || !E.nic_in || !E.cred_out || !E.cred_in)) ||
        result_alloc(s, res) != 0) {
        xmp_err_buf(err, errlen, "simulator: out of memory");
        goto out_free;
    }
    for (size_t i = 0; i < 2 * PM; i++)
        E.kofmb[i] = -1;
    res->ok = 1;
    for (;;) {
        int best = -1, bestbf = 0, kind = CAND_NONE;
        for (int g = 0; g < G; g++) {
            int bf;
            int k = classify(&E, g, &bf);
            if (k == CAND_NONE)
                continue;
            if (best < 0 || E.t[g] < E.t[best] || (E.t[g] == E.t[best] && bestbf && !bf)) {
                best = g;
                bestbf = bf;
                kind = k;
            }
        }
        if (best < 0)
            break;
        int g = best;
        if (kind == CAND_FILLW) {
            int code = E.pend[g * E.CM + E.phead[g]++];
            xmp_action_t w = {XMP_ACT_W, code % M, -1, 0, code / M};
            double d = cost_of(&E, g, w);
            rec_push(res, g, w, E.t[g], E.t[g] + d);
            E.t[g] += d;
            res->busy_s[g] += d;
            mem_account(&E, res, g, w);
            continue;
        }
        xmp_action_t a = s->acts[g][E.pc[g]];
        if (a.kind == XMP_ACT_WAIT && xfer_end(&E, g, a) >= 0) {
            double e = xfer_end(&E, g, a);
            double t0 = E.t[g];
            if (e > E.t[g])
                E.t[g] = e;
            rec_push(res, g, a, t0, E.t[g]);
            E.pc[g]++;
            continue;
        }
        if (a.kind == XMP_ACT_START || (a.kind == XMP_ACT_WAIT && c->late_recv)) {
            int p = xmp_plan_index(a.edge, a.dir);
            int side = xmp_sched__act_side(s, g, a);
            if (c->late_recv && side == 1 && a.kind == XMP_ACT_START) {
                rec_push(res, g, a, E.t[g], E.t[g]); /* posted at the wait instead */
                E.pc[g]++;
                continue;
            }
            if (a.kind == XMP_ACT_WAIT) { /* late receive: start it now, then wait */
                if (a.mb != E.cnt[2 * p + 1]) {
                    xmp_err_buf(err, errlen,
                                "simulator: group %d waits for %c%d.e%d out of microbatch order "
                                "(late receives need waits in start order)",
                                g, a.dir ? 'G' : 'A', a.mb, a.edge);
                    goto out_free;
                }
            }
            int k = E.cnt[2 * p + side]++;
            if (k >= M) {
                xmp_err_buf(err, errlen, "simulator: group %d starts more than %d transfers on e%d",
                            g, M, a.edge);
                goto out_free;
            }
            E.kofmb[(2 * p + side) * M + a.mb] = k;
            E.enq[(2 * p + side) * M + k] = E.t[g];
            advance_plan(&E, p);
            if (a.kind == XMP_ACT_WAIT)
                continue; /* now enqueued: the same action waits next round */
            rec_push(res, g, a, E.t[g], E.t[g]);
            E.pc[g]++;
            continue;
        }
        double d = cost_of(&E, g, a);
        if (c->act_add && c->act_add[g] && a.kind <= XMP_ACT_W)
            d = fmax(0.0, d + c->act_add[g][E.pc[g]]);
        if (fill && a.kind == XMP_ACT_W) {
            E.pc[g]++; /* explicit W in a filled schedule: not expected; skip */
            continue;
        }
        rec_push(res, g, a, E.t[g], E.t[g] + d);
        E.t[g] += d;
        res->busy_s[g] += d;
        if ((a.kind == XMP_ACT_B || a.kind == XMP_ACT_I) && s->recompute != XMP_RECOMPUTE_NONE &&
            c->f)
            res->recompute_s[g] += s->recompute_frac * c->f[xmp_action_stage(s, g, a)];
        if (a.kind <= XMP_ACT_W)
            mem_account(&E, res, g, a);
        if (a.kind == XMP_ACT_I && fill)
            E.pend[g * E.CM + E.ptail[g]++] = a.chunk * M + a.mb;
        E.pc[g]++;
    }
    /* finished or deadlocked */
    {
        size_t off = 0;
        res->msg[0] = '\0';
        for (int g = 0; g < G; g++) {
            if (E.t[g] > res->step_s)
                res->step_s = E.t[g];
            if (E.pc[g] < s->len[g]) {
                char ab[32];
                xmp_action_t a = s->acts[g][E.pc[g]];
                xmp_sched__fmt_act(a, ab);
                int other =
                    a.kind >= XMP_ACT_START && a.kind <= XMP_ACT_WAIT
                        ? (xmp_sched__act_side(s, g, a) == 0 ? xmp_xfer_receiver(s, a.edge, a.dir)
                                                             : xmp_xfer_sender(s, a.edge, a.dir))
                        : -1;
                res->ok = 0;
                if (off < sizeof(res->msg)) {
                    if (xmp_sched_is_virtual(s))
                        off += (size_t)snprintf(res->msg + off, sizeof(res->msg) - off,
                                                "%sgroup %d stuck at action %d '%s' (peer stage "
                                                "%d on group %d)",
                                                off ? "; " : "deadlock: ", g, E.pc[g], ab, other,
                                                other >= 0 ? s->stage_group[other] : -1);
                    else
                        off +=
                            (size_t)snprintf(res->msg + off, sizeof(res->msg) - off,
                                             "%sstage %d stuck at action %d '%s' (peer stage %d)",
                                             off ? "; " : "deadlock: ", g, E.pc[g], ab, other);
                }
            }
        }
        if (off >= sizeof(res->msg))
            off = sizeof(res->msg) - 1;
        for (int g = 0; g < G; g++)
            res->bubble[g] = res->step_s > 0 ? (res->step_s - res->busy_s[g]) / res->step_s : 0.0;
    }
    rc = res->ok ? 0 : 1;
out_free:
    free(E.cnt);
    free(E.kofmb);
    free(E.enq);
    free(E.nend);
    free(E.end);
    free(E.pc);
    free(E.t);
    free(E.held);
    free(E.heldb);
    free(E.hb);
    free(E.pend);
    free(E.phead);
    free(E.ptail);
    free(E.nic_out);
    free(E.nic_in);
    free(E.cred_out);
    free(E.cred_in);
    return rc;
}

int xmp_sim_run(const xmp_schedule_t *s, const xmp_sim_costs_t *c, xmp_sim_result_t *res, char *err,
                size_t errlen)
{
    if (xmp_sched_validate(s, NULL, 0, err, errlen) != 0)
        return -1;
    int r = xmp_sched__engine_run(s, c, 0, 0, res, err, errlen);
    if (r < 0)
        xmp_sim_result_free(res);
    return r;
}

int xmp_sched_dryrun(const xmp_schedule_t *s, int late_recv, char *err, size_t errlen)
{
    if (xmp_sched_validate(s, NULL, 0, err, errlen) != 0)
        return -1;
    xmp_sim_costs_t c;
    memset(&c, 0, sizeof(c));
    c.late_recv = late_recv;
    xmp_sim_result_t res;
    int r = xmp_sched__engine_run(s, &c, 0, 0, &res, err, errlen);
    if (r == 1)
        xmp_err_buf(err, errlen, "%s", res.msg);
    if (r >= 0)
        xmp_sim_result_free(&res);
    return r;
}

/* ---------------------------------------------------------------- timeline */

int xmp_sim_render(const xmp_schedule_t *s, const xmp_sim_result_t *res, int width, FILE *f)
{
    if (width < 8)
        width = 8;
    char *row = malloc((size_t)width + 1);
    if (row == NULL)
        return -1;
    double T = res->step_s > 0 ? res->step_s : 1.0;
    fprintf(f, "%s: S=%d M=%d step %.6g s, %d columns (%.3g s each)\n", s->name, s->nstages, s->nmb,
            res->step_s, width, T / width);
    int virt = xmp_sched_is_virtual(s);
    for (int st = 0; st < res->nstages; st++) {
        memset(row, '.', (size_t)width);
        row[width] = '\0';
        for (int j = 0; j < res->len[st]; j++) {
            xmp_action_t a = res->acts[st][j];
            if (a.kind > XMP_ACT_W && a.kind != XMP_ACT_R && a.kind != XMP_ACT_O)
                continue;
            int c0 = (int)(res->t0[st][j] / T * width + 0.5);
            int c1 = (int)(res->t1[st][j] / T * width + 0.5);
            if (c1 <= c0)
                c1 = c0 + 1; /* every compute action shows at least one column */
            if (c0 >= width)
                c0 = width - 1;
            if (c1 > width)
                c1 = width;
            char lab[16];
            xmp_action_format(a, lab, sizeof(lab));
            for (int x = c0; x < c1; x++) {
                int k = x - c0;
                row[x] = k < (int)strlen(lab) ? lab[k] : '-';
            }
        }
        fprintf(f, "%c%-3d |%s| bubble %5.1f%% peak act %d", virt ? 'g' : 's', st, row,
                100.0 * res->bubble[st], res->peak_act[st]);
        if (res->peak_bytes[st] > 0)
            fprintf(f, " (%.4g B)", res->peak_bytes[st]);
        fprintf(f, "\n");
    }
    free(row);
    return 0;
}
