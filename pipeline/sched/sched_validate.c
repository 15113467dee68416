/*
 * The schedule validator (xmp_sched_validate): every group's actions checked for
 * dependencies, transfer pairing and layer placement before anything runs. Pure C.
 */
#include "sched/schedule.h"
#include "sched/sched_priv.h"
#include "util/xmp_err.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* --------------------------------------------------------------- validator */

void xmp_sched__fmt_act(xmp_action_t a, char *buf)
{
    xmp_action_format(a, buf, 32);
}

/* Side of transfer action a on group g: 0 the sender, 1 the receiver. */
int xmp_sched__act_side(const xmp_schedule_t *s, int g, xmp_action_t a)
{
    return xmp_xfer_sender(s, a.edge, a.dir) == xmp_action_stage(s, g, a) ? 0 : 1;
}

/* pos layout: F,B,I,W [4*C*M] (index (kind*C + chunk)*M + mb), then starts and waits
 * [2P*M] each (index (2*plan + side)*M + mb), then started counts [2P]. */
static int validate_group(const xmp_schedule_t *s, int g, int *pos, char *err, size_t errlen)
{
    const int M = s->nmb, P = 2 * s->nedges, C = s->nchunks[g];
    int *pS = pos + 4 * C * M, *pT = pS + 2 * P * M;
    int *nstarted = pT + 2 * P * M;
    int nR = 0, nO = 0, posR = -1, posO = -1, inflight = 0;
    char ab[32];
    const char *gl = xmp_sched_is_virtual(s) ? "group" : "stage";
#define POSK(kind, c, m) pos[((kind)*C + (c)) * M + (m)]
    for (int i = 0; i < 4 * C * M + 4 * P * M; i++)
        pos[i] = -1;
    for (int p = 0; p < 2 * P; p++)
        nstarted[p] = 0;
    for (int j = 0; j < s->len[g]; j++) {
        xmp_action_t a = s->acts[g][j];
        xmp_sched__fmt_act(a, ab);
        if (a.kind <= XMP_ACT_WAIT && (a.mb < 0 || a.mb >= M)) {
            xmp_err_buf(err, errlen, "%s %d action %d '%s': microbatch %d out of 0..%d", gl, g, j,
                        ab, a.mb, M - 1);
            return -1;
        }
        if (a.chunk < 0 || a.chunk >= C || (a.kind > XMP_ACT_WAIT && a.chunk != 0)) {
            xmp_err_buf(err, errlen, "%s %d action %d '%s': chunk %d out of 0..%d", gl, g, j, ab,
                        a.chunk, a.kind > XMP_ACT_WAIT ? 0 : C - 1);
            return -1;
        }
        int st = a.kind <= XMP_ACT_WAIT ? xmp_action_stage(s, g, a) : -1;
        switch (a.kind) {
        case XMP_ACT_F:
        case XMP_ACT_B:
        case XMP_ACT_I:
        case XMP_ACT_W: {
            int *slot = &POSK(a.kind, a.chunk, a.mb);
            if (*slot >= 0) {
                xmp_err_buf(err, errlen, "%s %d action %d '%s': microbatch %d appears twice", gl, g,
                            j, ab, a.mb);
                return -1;
            }
            if (posR >= 0 || posO >= 0) {
                xmp_err_buf(err, errlen, "%s %d action %d '%s': compute after R/O", gl, g, j, ab);
                return -1;
            }
            *slot = j;
            if (a.kind == XMP_ACT_F) {
                if (++inflight > s->max_inflight[g]) {
                    xmp_err_buf(err, errlen,
                                "%s %d action %d '%s': %d microbatches in flight, bound is %d", gl,
                                g, j, ab, inflight, s->max_inflight[g]);
                    return -1;
                }
                for (int e = 0; e < s->nedges; e++)
                    if (s->edges[e].dst == st &&
                        pT[(2 * xmp_plan_index(e, XMP_DIR_ACT) + 1) * M + a.mb] < 0) {
                        xmp_err_buf(err, errlen, "%s %d action %d '%s': no WA%d.e%d before it", gl,
                                    g, j, ab, a.mb, e);
                        return -1;
                    }
            } else if (a.kind == XMP_ACT_B || a.kind == XMP_ACT_I) {
                if (POSK(XMP_ACT_F, a.chunk, a.mb) < 0) {
                    xmp_err_buf(err, errlen, "%s %d action %d '%s': before F%d", gl, g, j, ab,
                                a.mb);
                    return -1;
                }
                inflight--;
                for (int e = 0; e < s->nedges; e++)
                    if (s->edges[e].src == st &&
                        pT[(2 * xmp_plan_index(e, XMP_DIR_GRAD) + 1) * M + a.mb] < 0) {
                        xmp_err_buf(err, errlen, "%s %d action %d '%s': no WG%d.e%d before it", gl,
                                    g, j, ab, a.mb, e);
                        return -1;
                    }
            } else if (POSK(XMP_ACT_I, a.chunk, a.mb) < 0) {
                xmp_err_buf(err, errlen, "%s %d action %d '%s': W before I%d", gl, g, j, ab, a.mb);
                return -1;
            }
            break;
        }
        case XMP_ACT_START:
        case XMP_ACT_WAIT: {
            if (a.edge < 0 || a.edge >= s->nedges || (a.dir != 0 && a.dir != 1)) {
                xmp_err_buf(err, errlen, "%s %d action %d '%s': edge %d out of 0..%d", gl, g, j, ab,
                            a.edge, s->nedges - 1);
                return -1;
            }
            if (s->edges[a.edge].src != st && s->edges[a.edge].dst != st) {
                xmp_err_buf(err, errlen,
                            "%s %d action %d '%s': edge %d connects stages %d>%d, not stage %d "
                            "(chunk %d)",
                            gl, g, j, ab, a.edge, s->edges[a.edge].src, s->edges[a.edge].dst, st,
                            a.chunk);
                return -1;
            }
            int side = xmp_sched__act_side(s, g, a);
            int q = 2 * xmp_plan_index(a.edge, a.dir) + side;
            if (a.kind == XMP_ACT_START) {
                if (a.mb != nstarted[q]) {
                    xmp_err_buf(err, errlen,
                                "%s %d action %d '%s': transfers of plan %c.e%d must start in "
                                "microbatch order, expected microbatch %d",
                                gl, g, j, ab, a.dir ? 'G' : 'A', a.edge, nstarted[q]);
                    return -1;
                }
                nstarted[q]++;
                pS[q * M + a.mb] = j;
                if (side == 0) {
                    int prod = a.dir == XMP_DIR_ACT ? POSK(XMP_ACT_F, a.chunk, a.mb)
                               : POSK(XMP_ACT_I, a.chunk, a.mb) >= 0
                                   ? POSK(XMP_ACT_I, a.chunk, a.mb)
                                   : POSK(XMP_ACT_B, a.chunk, a.mb);
                    if (prod < 0) {
                        xmp_err_buf(err, errlen,
                                    "%s %d action %d '%s': send before its producer %c%d", gl, g, j,
                                    ab, a.dir == XMP_DIR_ACT ? 'F' : 'I', a.mb);
                        return -1;
                    }
                }
            } else {
                if (pS[q * M + a.mb] < 0) {
                    xmp_err_buf(err, errlen, "%s %d action %d '%s': wait before start", gl, g, j,
                                ab);
                    return -1;
                }
                if (pT[q * M + a.mb] >= 0) {
                    xmp_err_buf(err, errlen, "%s %d action %d '%s': waited twice", gl, g, j, ab);
                    return -1;
                }
                pT[q * M + a.mb] = j;
            }
            break;
        }
        case XMP_ACT_R:
            nR++;
            posR = j;
            break;
        case XMP_ACT_O:
            nO++;
            posO = j;
            break;
        default:
            xmp_err_buf(err, errlen, "%s %d action %d: unknown kind %d", gl, g, j, a.kind);
            return -1;
        }
    }
    if (nR > 1 || nO > 1 || (posO >= 0 && posR > posO)) {
        xmp_err_buf(err, errlen, "%s %d: R and O must appear at most once, R before O", gl, g);
        return -1;
    }
    for (int c = 0; c < C; c++) {
        int st = s->group_stage[g][c];
        char cs[48] = "";
        if (C > 1)
            snprintf(cs, sizeof(cs), " (chunk %d, stage %d)", c, st);
        for (int m = 0; m < M; m++) {
            if (POSK(XMP_ACT_F, c, m) < 0) {
                xmp_err_buf(err, errlen, "%s %d%s: no F%d", gl, g, cs, m);
                return -1;
            }
            int hasB = POSK(XMP_ACT_B, c, m) >= 0, hasI = POSK(XMP_ACT_I, c, m) >= 0,
                hasW = POSK(XMP_ACT_W, c, m) >= 0;
            if (!(hasB && !hasI && !hasW) && !(!hasB && hasI && hasW)) {
                xmp_err_buf(err, errlen,
                            "%s %d%s: microbatch %d needs one B%d or one I%d and one W%d", gl, g,
                            cs, m, m, m, m);
                return -1;
            }
        }
        for (int e = 0; e < s->nedges; e++) {
            if (s->edges[e].src != st && s->edges[e].dst != st)
                continue;
            for (int d = 0; d < 2; d++) {
                int side = (d == XMP_DIR_ACT) == (s->edges[e].src == st) ? 0 : 1;
                int q = 2 * xmp_plan_index(e, d) + side;
                for (int m = 0; m < M; m++)
                    if (pS[q * M + m] < 0 || pT[q * M + m] < 0) {
                        xmp_err_buf(err, errlen, "%s %d%s: transfer %c%d.e%d not %s", gl, g, cs,
                                    d ? 'G' : 'A', m, e, pS[q * M + m] < 0 ? "started" : "waited");
                        return -1;
                    }
            }
        }
    }
#undef POSK
    return 0;
}

int xmp_sched_validate(const xmp_schedule_t *s, const int *layer_stage, int nlayers, char *err,
                       size_t errlen)
{
    const int M = s->nmb, P = 2 * s->nedges;
    for (int e = 0; e < s->nedges; e++)
        if (s->edges[e].src < 0 || s->edges[e].src >= s->nstages || s->edges[e].dst < 0 ||
            s->edges[e].dst >= s->nstages || s->edges[e].src == s->edges[e].dst) {
            xmp_err_buf(err, errlen, "edge %d is %d>%d (stages 0..%d)", e, s->edges[e].src,
                        s->edges[e].dst, s->nstages - 1);
            return -1;
        }
    if (layer_stage != NULL) {
        if (nlayers < s->nstages) {
            xmp_err_buf(err, errlen, "%d layers for %d stages", nlayers, s->nstages);
            return -1;
        }
        int *cnt = calloc((size_t)s->nstages, sizeof(int));
        if (cnt == NULL) {
            xmp_err_buf(err, errlen, "out of memory");
            return -1;
        }
        for (int l = 0; l < nlayers; l++) {
            if (layer_stage[l] < 0 || layer_stage[l] >= s->nstages) {
                xmp_err_buf(err, errlen, "layer %d is on stage %d (stages 0..%d)", l,
                            layer_stage[l], s->nstages - 1);
                free(cnt);
                return -1;
            }
            cnt[layer_stage[l]]++;
        }
        for (int i = 0; i < s->nstages; i++)
            if (cnt[i] == 0) {
                xmp_err_buf(err, errlen, "stage %d owns no layer", i);
                free(cnt);
                return -1;
            }
        free(cnt);
    }
    int C = 1;
    for (int g = 0; g < s->ngroups; g++) {
        if (s->nchunks[g] > C)
            C = s->nchunks[g];
        for (int c = 1; c < s->nchunks[g]; c++)
            if (s->group_stage[g][c] <= s->group_stage[g][c - 1] ||
                s->stage_group[s->group_stage[g][c]] != g) {
                xmp_err_buf(err, errlen,
                            "group %d: chunk map is not increasing stages of the group", g);
                return -1;
            }
    }
    int *pos = malloc(((size_t)4 * C * M + 4 * (size_t)P * M + 2 * (size_t)P + 1) * sizeof(int));
    if (pos == NULL) {
        xmp_err_buf(err, errlen, "out of memory");
        return -1;
    }
    int r = 0;
    for (int g = 0; g < s->ngroups && r == 0; g++)
        r = validate_group(s, g, pos, err, errlen);
    free(pos);
    return r;
}
