/*
 * Pipeline schedules as data: creation, text form, generators, validator,
 * deadlock dry run, timed simulator and timeline renderer. Pure C.
 * Schedules: GPipe (Huang et al. 2019), 1F1B (Narayanan et al. 2021),
 * eager-1F1B and weight-gradient delay (AlpaComm, MLSys 2023, section 4),
 * split backward I/W as in zero-bubble pipelining (Qi et al. 2024, ZB-H1).
 */
#include "sched/schedule.h"
#include "util/xmp_err.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static int *parse_int_list(const char *q, int *n);

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
    int n = 0, *v = parse_int_list(text, &n);
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

/* --------------------------------------------------------------- text form */

int xmp_action_format(xmp_action_t a, char *buf, size_t n)
{
    static const char comp[] = "FBIW";
    int r;
    switch (a.kind) {
    case XMP_ACT_F:
    case XMP_ACT_B:
    case XMP_ACT_I:
    case XMP_ACT_W:
        r = snprintf(buf, n, "%c%d", comp[a.kind], a.mb);
        if (a.chunk != 0 && r >= 0 && (size_t)r < n)
            r += snprintf(buf + r, n - (size_t)r, ".c%d", a.chunk);
        break;
    case XMP_ACT_START:
    case XMP_ACT_WAIT:
        r = snprintf(buf, n, "%c%c%d.e%d", a.kind == XMP_ACT_START ? 'S' : 'W',
                     a.dir == XMP_DIR_ACT ? 'A' : 'G', a.mb, a.edge);
        if (a.chunk != 0 && r >= 0 && (size_t)r < n)
            r += snprintf(buf + r, n - (size_t)r, ".c%d", a.chunk);
        break;
    case XMP_ACT_R:
        r = snprintf(buf, n, "R");
        break;
    case XMP_ACT_O:
        r = snprintf(buf, n, "O");
        break;
    default:
        r = snprintf(buf, n, "?");
        break;
    }
    return r;
}

/* Non-negative decimal at *p; advances *p. -1 if none or overflow. */
static int parse_uint(const char **p)
{
    const char *q = *p;
    if (!isdigit((unsigned char)*q))
        return -1;
    long v = 0;
    while (isdigit((unsigned char)*q)) {
        v = v * 10 + (*q - '0');
        if (v > 100000000)
            return -1;
        q++;
    }
    *p = q;
    return (int)v;
}

/* Optional ".c<k>" suffix at *p (must end the token). -1 if malformed. */
static int parse_chunk(const char *p, int *chunk)
{
    *chunk = 0;
    if (*p == '\0')
        return 0;
    if (p[0] != '.' || p[1] != 'c')
        return -1;
    p += 2;
    if ((*chunk = parse_uint(&p)) < 0 || *p != '\0')
        return -1;
    return 0;
}

int xmp_action_parse(const char *tok, xmp_action_t *a)
{
    xmp_action_t r = {0, -1, -1, 0, 0};
    const char *p = tok;
    if (strcmp(tok, "R") == 0 || strcmp(tok, "O") == 0) {
        r.kind = tok[0] == 'R' ? XMP_ACT_R : XMP_ACT_O;
        *a = r;
        return 0;
    }
    if ((p[0] == 'S' || p[0] == 'W') && (p[1] == 'A' || p[1] == 'G')) {
        r.kind = p[0] == 'S' ? XMP_ACT_START : XMP_ACT_WAIT;
        r.dir = p[1] == 'A' ? XMP_DIR_ACT : XMP_DIR_GRAD;
        p += 2;
        if ((r.mb = parse_uint(&p)) < 0 || p[0] != '.' || p[1] != 'e')
            return -1;
        p += 2;
        if ((r.edge = parse_uint(&p)) < 0 || parse_chunk(p, &r.chunk) != 0)
            return -1;
        *a = r;
        return 0;
    }
    const char *k = strchr("FBIW", p[0]);
    if (p[0] == '\0' || k == NULL)
        return -1;
    r.kind = (int)(k - "FBIW");
    p++;
    if ((r.mb = parse_uint(&p)) < 0 || parse_chunk(p, &r.chunk) != 0)
        return -1;
    *a = r;
    return 0;
}

typedef struct {
    char *buf;
    size_t len, cap;
    int oom;
} sbuf_t;

static void sb_puts(sbuf_t *b, const char *s)
{
    size_t n = strlen(s);
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->len + n + 1)
            nc *= 2;
        char *x = realloc(b->buf, nc);
        if (x == NULL) {
            b->oom = 1;
            return;
        }
        b->buf = x;
        b->cap = nc;
    }
    memcpy(b->buf + b->len, s, n + 1);
    b->len += n;
}

char *xmp_sched_format(const xmp_schedule_t *s)
{
    sbuf_t b = {0};
    char tmp[64];
    snprintf(tmp, sizeof(tmp), "schedule %s S=%d M=%d edges=", s->name, s->nstages, s->nmb);
    sb_puts(&b, tmp);
    if (s->nedges == 0)
        sb_puts(&b, "-");
    for (int e = 0; e < s->nedges; e++) {
        snprintf(tmp, sizeof(tmp), "%s%d>%d", e ? "," : "", s->edges[e].src, s->edges[e].dst);
        sb_puts(&b, tmp);
    }
    int virt = xmp_sched_is_virtual(s);
    if (virt) {
        snprintf(tmp, sizeof(tmp), " groups=%d map=", s->ngroups);
        sb_puts(&b, tmp);
        for (int st = 0; st < s->nstages; st++) {
            snprintf(tmp, sizeof(tmp), "%s%d", st ? "," : "", s->stage_group[st]);
            sb_puts(&b, tmp);
        }
    }
    if (s->recompute == XMP_RECOMPUTE_BLOCK) {
        sb_puts(&b, " recompute=block");
    } else if (s->recompute == XMP_RECOMPUTE_SELECTIVE) {
        snprintf(tmp, sizeof(tmp), " recompute=selective:%.17g", s->recompute_frac);
        sb_puts(&b, tmp);
    }
    sb_puts(&b, "\n");
    for (int i = 0; i < s->ngroups; i++) {
        snprintf(tmp, sizeof(tmp), "%c%d inflight<=%d:", virt ? 'g' : 's', i, s->max_inflight[i]);
        sb_puts(&b, tmp);
        for (int j = 0; j < s->len[i]; j++) {
            tmp[0] = ' ';
            xmp_action_format(s->acts[i][j], tmp + 1, sizeof(tmp) - 1);
            sb_puts(&b, tmp);
        }
        sb_puts(&b, "\n");
    }
    if (b.oom) {
        free(b.buf);
        return NULL;
    }
    return b.buf;
}

int xmp_sched_fprint(const xmp_schedule_t *s, FILE *f)
{
    char *t = xmp_sched_format(s);
    if (t == NULL)
        return -1;
    int r = fputs(t, f) < 0 ? -1 : 0;
    free(t);
    return r;
}

/* Next whitespace-delimited token of the line [*p, end) into tok. */
static int next_tok(const char **p, const char *end, char *tok, size_t n)
{
    const char *q = *p;
    while (q < end && isspace((unsigned char)*q))
        q++;
    if (q == end)
        return 0;
    size_t k = 0;
    while (q < end && !isspace((unsigned char)*q)) {
        if (k + 1 < n)
            tok[k++] = *q;
        q++;
    }
    tok[k] = '\0';
    *p = q;
    return 1;
}

/* Comma-separated list of non-negative ints at q into a new array; count in *n. */
static int *parse_int_list(const char *q, int *n)
{
    int cnt = 1;
    for (const char *c = q; *c; c++)
        cnt += *c == ',';
    int *v = calloc((size_t)cnt, sizeof(int));
    if (v == NULL)
        return NULL;
    for (int k = 0; k < cnt; k++) {
        if ((v[k] = parse_uint(&q)) < 0 || (*q != ',' && *q != '\0')) {
            free(v);
            return NULL;
        }
        if (*q == ',')
            q++;
    }
    *n = cnt;
    return v;
}

static int parse_header(const char *p, const char *end, xmp_schedule_t **out, char *err,
                        size_t errlen)
{
    char tok[4096], name[XMP_SCHED_NAME_MAX];
    int S = -1, M = -1, ne = 0, G = -1, nmap = 0, rec = XMP_RECOMPUTE_NONE;
    double frac = 0;
    xmp_sedge_t *edges = NULL;
    int *map = NULL;
    if (!next_tok(&p, end, tok, sizeof(tok)) || strcmp(tok, "schedule") != 0) {
        xmp_err_buf(err, errlen, "schedule text: first line must start with 'schedule', got '%s'",
                    tok);
        return -1;
    }
    if (!next_tok(&p, end, tok, sizeof(tok)) || strlen(tok) >= sizeof(name)) {
        xmp_err_buf(err, errlen, "schedule text: missing or too long name");
        return -1;
    }
    snprintf(name, sizeof(name), "%s", tok);
    while (next_tok(&p, end, tok, sizeof(tok))) {
        const char *q = tok + 2;
        if (strncmp(tok, "S=", 2) == 0) {
            S = parse_uint(&q);
        } else if (strncmp(tok, "M=", 2) == 0) {
            M = parse_uint(&q);
        } else if (strncmp(tok, "groups=", 7) == 0) {
            q = tok + 7;
            G = parse_uint(&q);
        } else if (strncmp(tok, "map=", 4) == 0) {
            free(map);
            if ((map = parse_int_list(tok + 4, &nmap)) == NULL) {
                xmp_err_buf(err, errlen, "schedule text: bad stage -> group map '%s'", tok + 4);
                goto out_free;
            }
            continue;
        } else if (strncmp(tok, "recompute=", 10) == 0) {
            q = tok + 10;
            if (strcmp(q, "none") == 0) {
                rec = XMP_RECOMPUTE_NONE;
            } else if (strcmp(q, "block") == 0) {
                rec = XMP_RECOMPUTE_BLOCK;
                frac = 1.0;
            } else if (strncmp(q, "selective:", 10) == 0) {
                char *e2 = NULL;
                rec = XMP_RECOMPUTE_SELECTIVE;
                frac = strtod(q + 10, &e2);
                if (e2 == q + 10 || *e2 != '\0' || !(frac >= 0 && frac <= 1)) {
                    xmp_err_buf(err, errlen, "schedule text: bad selective fraction in '%s'", tok);
                    goto out_free;
                }
            } else {
                xmp_err_buf(err, errlen,
                            "schedule text: '%s': recompute must be none, block or selective:<f>",
                            tok);
                goto out_free;
            }
            continue;
        } else if (strncmp(tok, "edges=", 6) == 0) {
            q = tok + 6;
            if (strcmp(q, "-") == 0)
                continue;
            int cnt = 1;
            for (const char *c = q; *c; c++)
                cnt += *c == ',';
            free(edges);
            edges = calloc((size_t)cnt, sizeof(*edges));
            if (edges == NULL) {
                xmp_err_buf(err, errlen, "schedule text: out of memory");
                goto out_free;
            }
            for (ne = 0; ne < cnt; ne++) {
                int a = parse_uint(&q);
                if (a < 0 || *q != '>') {
                    xmp_err_buf(err, errlen, "schedule text: bad edge list '%s'", tok + 6);
                    goto out_free;
                }
                q++;
                int b = parse_uint(&q);
                if (b < 0 || (*q != ',' && *q != '\0')) {
                    xmp_err_buf(err, errlen, "schedule text: bad edge list '%s'", tok + 6);
                    goto out_free;
                }
                if (*q == ',')
                    q++;
                edges[ne].src = a;
                edges[ne].dst = b;
            }
            continue;
        } else {
            xmp_err_buf(err, errlen, "schedule text: unknown header field '%s'", tok);
            goto out_free;
        }
        if (*q != '\0') {
            xmp_err_buf(err, errlen, "schedule text: bad number in '%s'", tok);
            goto out_free;
        }
    }
    if (S < 0 || M < 0) {
        xmp_err_buf(err, errlen, "schedule text: header needs S= and M=");
        goto out_free;
    }
    if ((map != NULL) != (G >= 0) || (map != NULL && nmap != S)) {
        xmp_err_buf(
            err, errlen,
            "schedule text: groups= and map= go together, the map with S=%d entries (got %d)", S,
            nmap);
        goto out_free;
    }
    if (xmp_sched_create_virtual(S, G >= 0 ? G : S, map, M, ne, edges, out, err, errlen) != 0)
        goto out_free;
    snprintf((*out)->name, sizeof((*out)->name), "%s", name);
    (*out)->recompute = rec;
    (*out)->recompute_frac = frac;
    free(edges);
    free(map);
    return 0;
out_free:
    free(edges);
    free(map);
    return -1;
}

int xmp_sched_parse(const char *text, xmp_schedule_t **out, char *err, size_t errlen)
{
    xmp_schedule_t *s = NULL;
    const char *p = text;
    int lineno = 0;
    char tok[64];
    while (*p) {
        const char *end = strchr(p, '\n');
        if (end == NULL)
            end = p + strlen(p);
        lineno++;
        const char *q = p;
        while (q < end && isspace((unsigned char)*q))
            q++;
        if (q == end || *q == '#')
            goto next_line;
        if (s == NULL) {
            if (parse_header(q, end, &s, err, errlen) != 0)
                return -1;
            goto next_line;
        }
        {
            int st = -1, inf = -1;
            if (*q != 's' && *q != 'g') {
                xmp_err_buf(err, errlen, "schedule text line %d: expected 's<stage>' or 'g<group>'",
                            lineno);
                goto out_free;
            }
            q++;
            st = parse_uint(&q);
            if (st < 0 || st >= s->ngroups || strncmp(q, " inflight<=", 11) != 0) {
                xmp_err_buf(err, errlen, "schedule text line %d: bad group header (group %d of %d)",
                            lineno, st, s->ngroups);
                goto out_free;
            }
            q += 11;
            inf = parse_uint(&q);
            if (inf < 0 || *q != ':') {
                xmp_err_buf(err, errlen, "schedule text line %d: bad inflight bound", lineno);
                goto out_free;
            }
            q++;
            s->max_inflight[st] = inf;
            while (next_tok(&q, end, tok, sizeof(tok))) {
                xmp_action_t a;
                if (xmp_action_parse(tok, &a) != 0) {
                    xmp_err_buf(err, errlen, "schedule text line %d: bad action '%s'", lineno, tok);
                    goto out_free;
                }
                if (xmp_sched_append(s, st, a) != 0) {
                    xmp_err_buf(err, errlen, "schedule text: out of memory");
                    goto out_free;
                }
            }
        }
    next_line:
        p = *end ? end + 1 : end;
    }
    if (s == NULL) {
        xmp_err_buf(err, errlen, "schedule text: no 'schedule' header");
        return -1;
    }
    *out = s;
    return 0;
out_free:
    xmp_sched_destroy(s);
    return -1;
}

/* --------------------------------------------------------------- validator */

static void fmt_act(xmp_action_t a, char *buf)
{
    xmp_action_format(a, buf, 32);
}

/* Side of transfer action a on group g: 0 the sender, 1 the receiver. */
static int act_side(const xmp_schedule_t *s, int g, xmp_action_t a)
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
        fmt_act(a, ab);
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
            int side = act_side(s, g, a);
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
    int side = act_side(E->s, g, a);
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
    if (a.kind == XMP_ACT_WAIT && E->c->late_recv && act_side(s, g, a) == 1 &&
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

static int engine_run(const xmp_schedule_t *s, const xmp_sim_costs_t *c, int fill, int max_pw,
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
            int side = act_side(s, g, a);
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
                fmt_act(a, ab);
                int other = a.kind >= XMP_ACT_START && a.kind <= XMP_ACT_WAIT
                                ? (act_side(s, g, a) == 0 ? xmp_xfer_receiver(s, a.edge, a.dir)
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
    int r = engine_run(s, c, 0, 0, res, err, errlen);
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
    int r = engine_run(s, &c, 0, 0, &res, err, errlen);
    if (r == 1)
        xmp_err_buf(err, errlen, "%s", res.msg);
    if (r >= 0)
        xmp_sim_result_free(&res);
    return r;
}

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
    int r = engine_run(s, &c, 1, o->max_pending_w, &res, err, errlen);
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
                    if (engine_run(s, &c, 0, 0, &res, m, sizeof(m)) != 0) {
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
