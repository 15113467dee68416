/*
 * Pipeline schedules as data: creation, virtual-stage maps, the schedule kinds' and
 * recomputation modes' names. The rest of the schedule code lives next to it:
 * sched_text.c (text form), sched_validate.c (validator), sched_sim.c (deadlock dry run,
 * timed simulator, timeline renderer) and sched_gen.c (generators). Pure C.
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

/* ------------------------------------------------------------------ basics */

int xmp_sched_create(int nstages, int nmb, int nedges, const xmp_sedge_t *edges,
                     xmp_schedule_t **out, char *err, size_t errlen)
{
    return xmp_sched_create_virtual(nstages, nstages, NULL, nmb, nedges, edges, out, err, errlen);
}

void xmp_sched_interleaved_map(int R, int V, int *stage_group)
{
    for (int k = 0; k < R * V; k++)
        stage_group[k] = k % R;
}

void xmp_sched_vshape_map(int R, int *stage_group)
{
    for (int k = 0; k < 2 * R; k++)
        stage_group[k] = k < R ? k : 2 * R - 1 - k;
}

int xmp_sched_parse_map(const char *text, int nstages, int ngroups, int *stage_group, char *err,
                        size_t errlen)
{
    if (text == NULL || nstages < 1 || ngroups < 1 || ngroups > nstages) {
        xmp_err_buf(err, errlen, "stage map: %d stages on %d groups (need 1 <= groups <= stages)",
                    nstages, ngroups);
        return -1;
    }
    if (strcmp(text, "interleaved") == 0) {
        if (nstages % ngroups != 0) {
            xmp_err_buf(err, errlen,
                        "stage map 'interleaved': %d stages are not a multiple of %d groups",
                        nstages, ngroups);
            return -1;
        }
        xmp_sched_interleaved_map(ngroups, nstages / ngroups, stage_group);
        return 0;
    }
    if (strcmp(text, "v") == 0) {
        if (nstages != 2 * ngroups) {
            xmp_err_buf(err, errlen, "stage map 'v': needs %d stages for %d groups, have %d",
                        2 * ngroups, ngroups, nstages);
            return -1;
        }
        xmp_sched_vshape_map(ngroups, stage_group);
        return 0;
    }
    int n = 0, *v = xmp_sched__parse_int_list(text, &n);
    if (v == NULL || n != nstages) {
        xmp_err_buf(
            err, errlen,
            "stage map '%s': need 'interleaved', 'v' or %d comma-separated group ids (got %d)",
            text, nstages, v ? n : 0);
        free(v);
        return -1;
    }
    for (int g = 0; g < ngroups; g++) {
        int used = 0;
        for (int st = 0; st < nstages; st++) {
            if (v[st] >= ngroups) {
                xmp_err_buf(err, errlen, "stage map '%s': stage %d on group %d (groups 0..%d)",
                            text, st, v[st], ngroups - 1);
                free(v);
                return -1;
            }
            used |= v[st] == g;
        }
        if (!used) {
            xmp_err_buf(err, errlen, "stage map '%s': group %d holds no stage", text, g);
            free(v);
            return -1;
        }
    }
    memcpy(stage_group, v, (size_t)nstages * sizeof(int));
    free(v);
    return 0;
}

int xmp_sched_create_virtual(int nstages, int ngroups, const int *stage_group, int nmb, int nedges,
                             const xmp_sedge_t *edges, xmp_schedule_t **out, char *err,
                             size_t errlen)
{
    if (nstages < 1 || nstages > 4096) {
        xmp_err_buf(err, errlen, "schedule: %d stages (need 1..4096)", nstages);
        return -1;
    }
    if (ngroups < 1 || ngroups > nstages) {
        xmp_err_buf(err, errlen, "schedule: %d rank groups for %d stages (need 1..%d)", ngroups,
                    nstages, nstages);
        return -1;
    }
    if (stage_group == NULL && ngroups != nstages) {
        xmp_err_buf(err, errlen, "schedule: %d groups for %d stages need a stage -> group map",
                    ngroups, nstages);
        return -1;
    }
    if (nmb < 1 || nmb > 1000000) {
        xmp_err_buf(err, errlen, "schedule: %d microbatches (need >= 1)", nmb);
        return -1;
    }
    if (nedges < 0 || (nedges > 0 && edges == NULL)) {
        xmp_err_buf(err, errlen, "schedule: %d edges", nedges);
        return -1;
    }
    for (int e = 0; e < nedges; e++) {
        if (edges[e].src < 0 || edges[e].src >= nstages || edges[e].dst < 0 ||
            edges[e].dst >= nstages || edges[e].src == edges[e].dst) {
            xmp_err_buf(err, errlen, "schedule: edge %d is %d>%d (stages 0..%d, src != dst)", e,
                        edges[e].src, edges[e].dst, nstages - 1);
            return -1;
        }
    }
    if (stage_group != NULL) {
        for (int st = 0; st < nstages; st++)
            if (stage_group[st] < 0 || stage_group[st] >= ngroups) {
                xmp_err_buf(err, errlen, "schedule: stage %d is on group %d (groups 0..%d)", st,
                            stage_group[st], ngroups - 1);
                return -1;
            }
        for (int g = 0; g < ngroups; g++) {
            int n = 0;
            for (int st = 0; st < nstages; st++)
                n += stage_group[st] == g;
            if (n == 0) {
                xmp_err_buf(err, errlen, "schedule: group %d holds no stage", g);
                return -1;
            }
        }
    }
    xmp_schedule_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        goto out_nomem;
    s->nstages = nstages;
    s->ngroups = ngroups;
    s->nmb = nmb;
    s->nedges = nedges;
    s->edges = calloc((size_t)(nedges > 0 ? nedges : 1), sizeof(*s->edges));
    s->len = calloc((size_t)ngroups, sizeof(int));
    s->cap = calloc((size_t)ngroups, sizeof(int));
    s->acts = calloc((size_t)ngroups, sizeof(*s->acts));
    s->max_inflight = calloc((size_t)ngroups, sizeof(int));
    s->stage_group = calloc((size_t)nstages, sizeof(int));
    s->nchunks = calloc((size_t)ngroups, sizeof(int));
    s->group_stage = calloc((size_t)ngroups, sizeof(int *));
    if (!s->edges || !s->len || !s->cap || !s->acts || !s->max_inflight || !s->stage_group ||
        !s->nchunks || !s->group_stage)
        goto out_free;
    if (nedges > 0)
        memcpy(s->edges, edges, (size_t)nedges * sizeof(*edges));
    for (int st = 0; st < nstages; st++) {
        s->stage_group[st] = stage_group ? stage_group[st] : st;
        s->nchunks[s->stage_group[st]]++;
    }
    for (int g = 0; g < ngroups; g++) {
        s->group_stage[g] = calloc((size_t)s->nchunks[g], sizeof(int));
        if (s->group_stage[g] == NULL)
            goto out_free;
        s->nchunks[g] = 0;
    }
    for (int st = 0; st < nstages; st++) {
        int g = s->stage_group[st];
        s->group_stage[g][s->nchunks[g]++] = st;
    }
    for (int g = 0; g < ngroups; g++)
        s->max_inflight[g] = nmb * s->nchunks[g];
    s->recompute = XMP_RECOMPUTE_NONE;
    snprintf(s->name, sizeof(s->name), "custom");
    *out = s;
    return 0;
out_free:
    xmp_sched_destroy(s);
out_nomem:
    xmp_err_buf(err, errlen, "schedule: out of memory");
    return -1;
}

int xmp_sched_is_virtual(const xmp_schedule_t *s)
{
    if (s->ngroups != s->nstages)
        return 1;
    for (int st = 0; st < s->nstages; st++)
        if (s->stage_group[st] != st)
            return 1;
    return 0;
}

void xmp_sched_destroy(xmp_schedule_t *s)
{
    if (s == NULL)
        return;
    if (s->acts)
        for (int i = 0; i < s->ngroups; i++)
            free(s->acts[i]);
    if (s->group_stage)
        for (int i = 0; i < s->ngroups; i++)
            free(s->group_stage[i]);
    free(s->acts);
    free(s->edges);
    free(s->len);
    free(s->cap);
    free(s->max_inflight);
    free(s->stage_group);
    free(s->nchunks);
    free(s->group_stage);
    free(s);
}

int xmp_sched_append(xmp_schedule_t *s, int group, xmp_action_t a)
{
    if (group < 0 || group >= s->ngroups)
        return -1;
    if (s->len[group] == s->cap[group]) {
        int nc = s->cap[group] ? 2 * s->cap[group] : 32;
        xmp_action_t *n = realloc(s->acts[group], (size_t)nc * sizeof(*n));
        if (n == NULL)
            return -1;
        s->acts[group] = n;
        s->cap[group] = nc;
    }
    s->acts[group][s->len[group]++] = a;
    return 0;
}

static const char *recompute_names[] = {"none", "block", "selective"};

int xmp_recompute_parse(const char *name)
{
    for (int k = 0; name && k < 3; k++)
        if (strcmp(name, recompute_names[k]) == 0)
            return k;
    return -1;
}

const char *xmp_recompute_name(int mode)
{
    return mode >= 0 && mode < 3 ? recompute_names[mode] : "unknown";
}

static const char *kind_names[] = {
    "gpipe", "1f1b",   "eager-1f1b", "interleaved-1f1b", "eager-interleaved-1f1b",
    "zb-v",  "v-1f1b", "dualpipe-v"};

int xmp_sched_kind_parse(const char *name)
{
    if (name == NULL)
        return -1;
    for (int k = 0; k < XMP_SCHED_KIND_COUNT_; k++)
        if (strcmp(name, kind_names[k]) == 0)
            return k;
    if (strcmp(name, "eager") == 0)
        return XMP_SCHED_EAGER_1F1B;
    if (strcmp(name, "interleaved") == 0)
        return XMP_SCHED_INTERLEAVED_1F1B;
    if (strcmp(name, "zbv") == 0)
        return XMP_SCHED_ZB_V;
    return -1;
}

const char *xmp_sched_kind_name(int kind)
{
    return kind >= 0 && kind < XMP_SCHED_KIND_COUNT_ ? kind_names[kind] : "unknown";
}

int xmp_sched_kind_virtual(int kind)
{
    return kind >= XMP_SCHED_INTERLEAVED_1F1B && kind < XMP_SCHED_KIND_COUNT_;
}

int xmp_sched_chain_edges(int nstages, xmp_sedge_t *edges)
{
    for (int i = 0; i + 1 < nstages; i++) {
        edges[i].src = i;
        edges[i].dst = i + 1;
    }
    return nstages > 1 ? nstages - 1 : 0;
}
