/* Stage layouts: parsing "E,t*3|t*3,L", even splits and per-stage meshes. */
#include "models/stage_layout.h"
#include "sched/schedule.h"
#include "util/xmp_err.h"

#include <ctype.h>
#include <stdint.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Parses a positive int at *p, advancing it; -1 if none or out of range. */
static int parse_pos(const char **p, int max)
{
    if (!isdigit((unsigned char)**p))
        return -1;
    errno = 0;
    char *end;
    long v = strtol(*p, &end, 10);
    if (errno || v < 1 || v > max)
        return -1;
    *p = end;
    return (int)v;
}

/* Fills first/count/stage_of from an explicit layout string. */
static int parse_layout(const char *kinds, const char *layout, xmp_stage_layout_t *l, char *err,
                        size_t errlen)
{
    int n = (int)strlen(kinds), at = 0, s = 0;
    const char *p = layout;
    l->first[0] = 0;
    l->count[0] = 0;
    for (;;) {
        while (*p == ' ')
            p++;
        if ((*p == '|' || *p == '\0') && l->count[s] == 0)
            return xmp_err_buf(err, errlen, "layout '%s': stage %d is empty", layout, s);
        if (!isalpha((unsigned char)*p))
            return xmp_err_buf(err, errlen, "layout '%s': expected a layer kind at '%s'", layout,
                               p);
        char k = *p++;
        int rep = 1;
        if (*p == '*') {
            p++;
            rep = parse_pos(&p, XMP_MAX_LAYERS);
            if (rep < 0)
                return xmp_err_buf(err, errlen, "layout '%s': bad repeat count after '%c*'", layout,
                                   k);
        }
        for (int i = 0; i < rep; i++, at++) {
            if (at >= n)
                return xmp_err_buf(err, errlen, "layout '%s' has more layers than the model's %d",
                                   layout, n);
            if (kinds[at] != k)
                return xmp_err_buf(err, errlen,
                                   "layout '%s': layer %d is '%c' in the model, '%c' in the layout",
                                   layout, at, kinds[at], k);
            l->stage_of[at] = s;
            l->count[s]++;
        }
        while (*p == ' ')
            p++;
        if (*p == ',') {
            p++;
        } else if (*p == '|') {
            p++;
            if (l->count[s] == 0)
                return xmp_err_buf(err, errlen, "layout '%s': stage %d is empty", layout, s);
            if (++s >= XMP_MAX_STAGES)
                return xmp_err_buf(err, errlen, "layout '%s': more than %d stages", layout,
                                   XMP_MAX_STAGES);
            l->first[s] = at;
            l->count[s] = 0;
        } else if (*p == '\0') {
            break;
        } else {
            return xmp_err_buf(err, errlen, "layout '%s': unexpected '%c'", layout, *p);
        }
    }
    if (at != n)
        return xmp_err_buf(err, errlen, "layout '%s' names %d layers, the model has %d", layout, at,
                           n);
    l->nstages = s + 1;
    return 0;
}

static int split_even(int n, int fixed_head, int fixed_tail, int stages, xmp_stage_layout_t *l,
                      char *err, size_t errlen)
{
    int mid = n - fixed_head - fixed_tail;
    if (stages < 1 || stages > XMP_MAX_STAGES)
        return xmp_err_buf(err, errlen, "--stages %d out of range [1, %d]", stages, XMP_MAX_STAGES);
    if (mid < stages)
        return xmp_err_buf(err, errlen, "--stages %d: the model has only %d layers to split",
                           stages, mid);
    int at = 0;
    for (int s = 0; s < stages; s++) {
        int c = mid / stages + (s < mid % stages);
        if (s == 0)
            c += fixed_head;
        if (s == stages - 1)
            c += fixed_tail;
        l->first[s] = at;
        l->count[s] = c;
        for (int i = 0; i < c; i++)
            l->stage_of[at++] = s;
    }
    l->nstages = stages;
    return 0;
}

/* Parses a comma list of per-stage ints ("2,1" or one value for all). */
static int parse_list(const char *what, const char *s, int nstages, int *out, char *err,
                      size_t errlen)
{
    if (!s) {
        for (int i = 0; i < nstages; i++)
            out[i] = 1;
        return 0;
    }
    const char *p = s;
    int k = 0;
    for (;;) {
        int v = parse_pos(&p, 1 << 20);
        if (v < 0)
            return xmp_err_buf(err, errlen, "%s '%s': expected positive integers separated by ','",
                               what, s);
        if (k >= nstages)
            return xmp_err_buf(err, errlen, "%s '%s' has more entries than the %d stages", what, s,
                               nstages);
        out[k++] = v;
        if (*p == '\0')
            break;
        if (*p++ != ',')
            return xmp_err_buf(err, errlen, "%s '%s': expected ',' at '%s'", what, s, p - 1);
    }
    if (k == 1)
        for (int i = 1; i < nstages; i++)
            out[i] = out[0];
    else if (k != nstages)
        return xmp_err_buf(err, errlen, "%s '%s' has %d entries for %d stages", what, s, k,
                           nstages);
    return 0;
}

static int parse_meshes(const char *s, xmp_stage_layout_t *l, char *err, size_t errlen)
{
    const char *p = s;
    for (int k = 0; k < l->nstages; k++) {
        int r = parse_pos(&p, 1 << 20), c = 1;
        if (r >= 0 && *p == 'x') {
            p++;
            c = parse_pos(&p, 1 << 20);
        }
        if (r < 0 || c < 0 || *p == 'x')
            return xmp_err_buf(
                err, errlen,
                "--stage-mesh '%s': stage %d: expected RxC (with --stage-dp/--stage-tp a "
                "mesh has the 2 axes dp x tp)",
                s, k);
        if (r != l->dp[k] || c != l->tp[k])
            return xmp_err_buf(
                err, errlen,
                "--stage-mesh '%s': stage %d mesh %dx%d does not match dp %d x tp %d "
                "(axis 0 is data parallel, axis 1 tensor parallel)",
                s, k, r, c, l->dp[k], l->tp[k]);
        if (k + 1 < l->nstages && *p++ != ',')
            return xmp_err_buf(err, errlen, "--stage-mesh '%s': expected %d meshes", s, l->nstages);
    }
    if (*p)
        return xmp_err_buf(err, errlen, "--stage-mesh '%s': more meshes than the %d stages", s,
                           l->nstages);
    return 0;
}

/* Parses one mesh "AxBx.." (1..4 axes) at *p, advancing it; -1 if bad. */
static int parse_shape(const char **p, int *shape)
{
    int n = 0;
    for (;;) {
        int v = parse_pos(p, 1 << 20);
        if (v < 0 || n >= XMP_STAGE_MAX_AXES)
            return -1;
        shape[n++] = v;
        if (**p != 'x')
            return n;
        (*p)++;
    }
}

/* With meshes but no dp/tp, the mesh shapes are taken as given. */
static int meshes_to_shapes(const char *s, xmp_stage_layout_t *l, char *err, size_t errlen)
{
    const char *p = s;
    for (int k = 0; k < l->nstages; k++) {
        int n = parse_shape(&p, l->shape[k]);
        if (n < 0)
            return xmp_err_buf(
                err, errlen,
                "--stage-mesh '%s': stage %d: expected a mesh AxB.. of 1 to %d positive "
                "axis sizes",
                s, k, XMP_STAGE_MAX_AXES);
        l->ndim[k] = n;
        if (*p == ',')
            p++;
        else if (k + 1 < l->nstages)
            return xmp_err_buf(err, errlen, "--stage-mesh '%s' has fewer meshes than the %d stages",
                               s, l->nstages);
    }
    if (*p)
        return xmp_err_buf(err, errlen, "--stage-mesh '%s': more meshes than the %d stages", s,
                           l->nstages);
    return 0;
}

int xmp_stage_layout_build(const char *kinds, int fixed_head, int fixed_tail, const char *layout,
                           int stages, const char *meshes, const char *dps, const char *tps,
                           xmp_stage_layout_t *out, char *err, size_t errlen)
{
    xmp_stage_layout_t l;
    memset(&l, 0, sizeof l);
    int n = kinds ? (int)strlen(kinds) : 0;
    if (n < 1 || n > XMP_MAX_LAYERS)
        return xmp_err_buf(err, errlen, "model with %d layers (must be 1..%d)", n, XMP_MAX_LAYERS);
    l.nitems = n;
    memcpy(l.kind, kinds, (size_t)n);
    int rc = (layout && *layout) ? parse_layout(kinds, layout, &l, err, errlen)
                                 : split_even(n, fixed_head, fixed_tail, stages, &l, err, errlen);
    if (rc)
        return rc;
    if (layout && *layout && stages > 0 && stages != l.nstages)
        return xmp_err_buf(err, errlen, "--stages %d but layout '%s' has %d stages", stages, layout,
                           l.nstages);
    if (meshes && !dps && !tps) {
        if (meshes_to_shapes(meshes, &l, err, errlen))
            return -1;
    } else {
        if (parse_list("--stage-dp", dps, l.nstages, l.dp, err, errlen) ||
            parse_list("--stage-tp", tps, l.nstages, l.tp, err, errlen))
            return -1;
        if (meshes && parse_meshes(meshes, &l, err, errlen))
            return -1;
        for (int s = 0; s < l.nstages; s++) {
            l.ndim[s] = 2;
            l.shape[s][0] = l.dp[s];
            l.shape[s][1] = l.tp[s];
        }
    }
    int r = 0;
    for (int s = 0; s < l.nstages; s++) {
        int64_t size = 1;
        for (int a = 0; a < l.ndim[s] && size <= (1 << 20); a++)
            size *= l.shape[s][a];
        if (size > (1 << 20))
            return xmp_err_buf(err, errlen, "stage %d: mesh of %lld ranks is too large", s,
                               (long long)size);
        int last = l.shape[s][l.ndim[s] - 1];
        l.tp[s] = l.ndim[s] == 1 ? 1 : last;
        l.dp[s] = (int)size / l.tp[s];
        l.rank0[s] = r;
        r += (int)size;
    }
    l.nranks = r;
    l.ngroups = l.nstages;
    for (int s = 0; s < l.nstages; s++)
        l.group[s] = s;
    *out = l;
    return 0;
}

int xmp_stage_layout_size(const xmp_stage_layout_t *l, int s)
{
    int n = 1;
    for (int a = 0; a < l->ndim[s]; a++)
        n *= l->shape[s][a];
    return n;
}

int xmp_stage_layout_stage_of_rank(const xmp_stage_layout_t *l, int rank)
{
    for (int s = 0; s < l->nstages; s++)
        if (rank >= l->rank0[s] && rank < l->rank0[s] + xmp_stage_layout_size(l, s))
            return s;
    return -1;
}

void xmp_stage_layout_format_meshes(const xmp_stage_layout_t *l, char *buf, size_t len)
{
    size_t at = 0;
    if (!len)
        return;
    buf[0] = '\0';
    for (int s = 0; s < l->nstages && at < len; s++)
        for (int a = 0; a < l->ndim[s] && at < len; a++) {
            int w = snprintf(buf + at, len - at, "%s%d", a ? "x" : (s ? "," : ""), l->shape[s][a]);
            at += (size_t)(w > 0 ? w : 0);
        }
}

void xmp_stage_layout_format(const xmp_stage_layout_t *l, char *buf, size_t len)
{
    size_t at = 0;
    buf[0] = '\0';
    for (int s = 0; s < l->nstages; s++) {
        int i = l->first[s], end = l->first[s] + l->count[s];
        while (i < end && at < len) {
            int j = i;
            while (j < end && l->kind[j] == l->kind[i])
                j++;
            int w = (j - i > 1) ? snprintf(buf + at, len - at, "%s%c*%d",
                                           i > l->first[s] ? "," : "", l->kind[i], j - i)
                                : snprintf(buf + at, len - at, "%s%c", i > l->first[s] ? "," : "",
                                           l->kind[i]);
            at += (size_t)(w > 0 ? w : 0);
            i = j;
        }
        if (s + 1 < l->nstages && at + 1 < len) {
            buf[at++] = '|';
            buf[at] = '\0';
        }
    }
}

int xmp_stage_layout_set_groups(xmp_stage_layout_t *l, int ngroups, const int *stage_group,
                                char *err, size_t errlen)
{
    int gsize[XMP_MAX_STAGES], gfirst[XMP_MAX_STAGES];
    if (ngroups < 1 || ngroups > l->nstages) {
        snprintf(err, errlen, "%d rank groups for %d stages: expected 1..%d", ngroups, l->nstages,
                 l->nstages);
        return -1;
    }
    for (int g = 0; g < ngroups; g++)
        gsize[g] = 0, gfirst[g] = -1;
    for (int s = 0; s < l->nstages; s++) {
        int g = stage_group[s], n = xmp_stage_layout_size(l, s);
        if (g < 0 || g >= ngroups) {
            snprintf(err, errlen, "stage %d: group %d out of range 0..%d", s, g, ngroups - 1);
            return -1;
        }
        if (gfirst[g] < 0) {
            gfirst[g] = s;
            gsize[g] = n;
        } else if (gsize[g] != n) {
            snprintf(err, errlen,
                     "stage %d has %d ranks but stage %d on the same group %d has %d: stages of "
                     "one group need meshes of the same size",
                     s, n, gfirst[g], g, gsize[g]);
            return -1;
        }
    }
    for (int g = 0; g < ngroups; g++)
        if (gfirst[g] < 0) {
            snprintf(err, errlen, "group %d holds no stage", g);
            return -1;
        }
    int r = 0, r0[XMP_MAX_STAGES];
    for (int g = 0; g < ngroups; g++) {
        r0[g] = r;
        r += gsize[g];
    }
    for (int s = 0; s < l->nstages; s++) {
        l->group[s] = stage_group[s];
        l->rank0[s] = r0[stage_group[s]];
    }
    l->ngroups = ngroups;
    l->nranks = r;
    return 0;
}

int xmp_stage_layout_stages_of_rank(const xmp_stage_layout_t *l, int rank, int *out, int max)
{
    int n = 0;
    for (int s = 0; s < l->nstages; s++)
        if (rank >= l->rank0[s] && rank < l->rank0[s] + xmp_stage_layout_size(l, s)) {
            if (n < max)
                out[n] = s;
            n++;
        }
    return n < max ? n : max;
}

int xmp_stage_layout_build_groups(const char *kinds, int fixed_head, int fixed_tail,
                                  const char *layout, int R, int V, const char *map_text,
                                  const char *meshes, const char *dps, const char *tps,
                                  xmp_stage_layout_t *out, char *err, size_t errlen)
{
    int S = R * V, map[XMP_MAX_STAGES];
    if (R < 1 || V < 1 || R > XMP_MAX_STAGES || V > XMP_MAX_STAGES) {
        snprintf(err, errlen, "%d rank groups x %d virtual stages: expected at least 1 each", R, V);
        return -1;
    }
    if (layout) {
        int n = 1;
        for (const char *p = layout; *p; p++)
            n += *p == '|';
        if (V > 1 && n != S) {
            snprintf(err, errlen, "--layout has %d stages, %d virtual stages on %d groups need %d",
                     n, V, R, S);
            return -1;
        }
        S = n;
    }
    if (S > XMP_MAX_STAGES || R > S) {
        snprintf(err, errlen,
                 "%d model stages on %d rank groups: expected 1..%d stages, at least one per "
                 "group",
                 S, R, XMP_MAX_STAGES);
        return -1;
    }
    char sub[256];
    if (xmp_sched_parse_map(map_text, S, R, map, sub, sizeof sub) != 0) {
        snprintf(err, errlen, "--stage-groups: %s", sub);
        return -1;
    }
    int nmesh = 0;
    if (meshes) {
        nmesh = 1;
        for (const char *p = meshes; *p; p++)
            nmesh += *p == ',';
    }
    char *xm = NULL;
    if (meshes && nmesh == R && S != R) { /* one mesh per group: each stage gets its group's */
        const char *ent[XMP_MAX_STAGES];
        int len[XMP_MAX_STAGES], k = 0;
        for (const char *p = meshes;; k++) {
            const char *q = strchr(p, ',');
            ent[k] = p;
            len[k] = q ? (int)(q - p) : (int)strlen(p);
            if (!q)
                break;
            p = q + 1;
        }
        size_t cap = strlen(meshes) * (size_t)S + 1, at = 0;
        if (!(xm = malloc(cap))) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        xm[0] = '\0';
        for (int s = 0; s < S; s++)
            at += (size_t)snprintf(xm + at, cap - at, "%s%.*s", s ? "," : "", len[map[s]],
                                   ent[map[s]]);
        meshes = xm;
    }
    xmp_stage_layout_t l;
    int rc = xmp_stage_layout_build(kinds, fixed_head, fixed_tail, layout, S, meshes, dps, tps, &l,
                                    err, errlen);
    free(xm);
    if (rc == 0 && xmp_stage_layout_set_groups(&l, R, map, sub, sizeof sub) != 0) {
        snprintf(err, errlen, "--stage-groups: %s", sub);
        rc = -1;
    }
    if (rc == 0)
        *out = l;
    return rc;
}
