/*
 * Pipeline schedules as data: creation, text form, generators, validator,
 * deadlock dry run, timed simulator and timeline renderer. Pure C.
 * Schedules: GPipe (Huang et al. 2019), 1F1B (Narayanan et al. 2021),
 * eager-1F1B and weight-gradient delay (AlpaComm, MLSys 2023, section 4),
 * split backward I/W as in zero-bubble pipelining (Qi et al. 2024, ZB-H1).
 */
#include "sched/schedule.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static void seterr(char *err, size_t n, const char *fmt, ...)
{
    if (err == NULL || n == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
}

/* ------------------------------------------------------------------ basics */

int xmp_sched_create(int nstages, int nmb, int nedges, const xmp_sedge_t *edges,
                     xmp_schedule_t **out, char *err, size_t errlen)
{
    if (nstages < 1 || nstages > 4096) {
        seterr(err, errlen, "schedule: %d stages (need 1..4096)", nstages);
        return -1;
    }
    if (nmb < 1 || nmb > 1000000) {
        seterr(err, errlen, "schedule: %d microbatches (need >= 1)", nmb);
        return -1;
    }
    if (nedges < 0 || (nedges > 0 && edges == NULL)) {
        seterr(err, errlen, "schedule: %d edges", nedges);
        return -1;
    }
    for (int e = 0; e < nedges; e++) {
        if (edges[e].src < 0 || edges[e].src >= nstages || edges[e].dst < 0 ||
            edges[e].dst >= nstages || edges[e].src == edges[e].dst) {
            seterr(err, errlen, "schedule: edge %d is %d>%d (stages 0..%d, src != dst)", e,
                   edges[e].src, edges[e].dst, nstages - 1);
            return -1;
        }
    }
    xmp_schedule_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        goto out_nomem;
    s->nstages = nstages;
    s->nmb = nmb;
    s->nedges = nedges;
    s->edges = calloc((size_t)(nedges > 0 ? nedges : 1), sizeof(*s->edges));
    s->len = calloc((size_t)nstages, sizeof(int));
    s->cap = calloc((size_t)nstages, sizeof(int));
    s->acts = calloc((size_t)nstages, sizeof(*s->acts));
    s->max_inflight = calloc((size_t)nstages, sizeof(int));
    if (!s->edges || !s->len || !s->cap || !s->acts || !s->max_inflight)
        goto out_free;
    if (nedges > 0)
        memcpy(s->edges, edges, (size_t)nedges * sizeof(*edges));
    for (int i = 0; i < nstages; i++)
        s->max_inflight[i] = nmb;
    snprintf(s->name, sizeof(s->name), "custom");
    *out = s;
    return 0;
out_free:
    xmp_sched_destroy(s);
out_nomem:
    seterr(err, errlen, "schedule: out of memory");
    return -1;
}

void xmp_sched_destroy(xmp_schedule_t *s)
{
    if (s == NULL)
        return;
    if (s->acts)
        for (int i = 0; i < s->nstages; i++)
            free(s->acts[i]);
    free(s->acts);
    free(s->edges);
    free(s->len);
    free(s->cap);
    free(s->max_inflight);
    free(s);
}

int xmp_sched_append(xmp_schedule_t *s, int stage, xmp_action_t a)
{
    if (stage < 0 || stage >= s->nstages)
        return -1;
    if (s->len[stage] == s->cap[stage]) {
        int nc = s->cap[stage] ? 2 * s->cap[stage] : 32;
        xmp_action_t *n = realloc(s->acts[stage], (size_t)nc * sizeof(*n));
        if (n == NULL)
            return -1;
        s->acts[stage] = n;
        s->cap[stage] = nc;
    }
    s->acts[stage][s->len[stage]++] = a;
    return 0;
}

static const char *kind_names[] = {"gpipe", "1f1b", "eager-1f1b"};

int xmp_sched_kind_parse(const char *name)
{
    if (name == NULL)
        return -1;
    for (int k = 0; k < 3; k++)
        if (strcmp(name, kind_names[k]) == 0)
            return k;
    if (strcmp(name, "eager") == 0)
        return XMP_SCHED_EAGER_1F1B;
    return -1;
}

const char *xmp_sched_kind_name(int kind)
{
    return kind >= 0 && kind < 3 ? kind_names[kind] : "unknown";
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
        break;
    case XMP_ACT_START:
    case XMP_ACT_WAIT:
        r = snprintf(buf, n, "%c%c%d.e%d", a.kind == XMP_ACT_START ? 'S' : 'W',
                     a.dir == XMP_DIR_ACT ? 'A' : 'G', a.mb, a.edge);
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

int xmp_action_parse(const char *tok, xmp_action_t *a)
{
    xmp_action_t r = {0, -1, -1, 0};
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
        if ((r.edge = parse_uint(&p)) < 0 || *p != '\0')
            return -1;
        *a = r;
        return 0;
    }
    const char *k = strchr("FBIW", p[0]);
    if (p[0] == '\0' || k == NULL)
        return -1;
    r.kind = (int)(k - "FBIW");
    p++;
    if ((r.mb = parse_uint(&p)) < 0 || *p != '\0')
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
    sb_puts(&b, "\n");
    for (int i = 0; i < s->nstages; i++) {
        snprintf(tmp, sizeof(tmp), "s%d inflight<=%d:", i, s->max_inflight[i]);
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

static int parse_header(const char *p, const char *end, xmp_schedule_t **out, char *err,
                        size_t errlen)
{
    char tok[4096], name[XMP_SCHED_NAME_MAX];
    int S = -1, M = -1, ne = 0;
    xmp_sedge_t *edges = NULL;
    if (!next_tok(&p, end, tok, sizeof(tok)) || strcmp(tok, "schedule") != 0) {
        seterr(err, errlen, "schedule text: first line must start with 'schedule', got '%s'", tok);
        return -1;
    }
    if (!next_tok(&p, end, tok, sizeof(tok)) || strlen(tok) >= sizeof(name)) {
        seterr(err, errlen, "schedule text: missing or too long name");
        return -1;
    }
    snprintf(name, sizeof(name), "%s", tok);
    while (next_tok(&p, end, tok, sizeof(tok))) {
        const char *q = tok + 2;
        if (strncmp(tok, "S=", 2) == 0) {
            S = parse_uint(&q);
        } else if (strncmp(tok, "M=", 2) == 0) {
            M = parse_uint(&q);
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
                seterr(err, errlen, "schedule text: out of memory");
                return -1;
            }
            for (ne = 0; ne < cnt; ne++) {
                int a = parse_uint(&q);
                if (a < 0 || *q != '>') {
                    seterr(err, errlen, "schedule text: bad edge list '%s'", tok + 6);
                    goto out_free;
                }
                q++;
                int b = parse_uint(&q);
                if (b < 0 || (*q != ',' && *q != '\0')) {
                    seterr(err, errlen, "schedule text: bad edge list '%s'", tok + 6);
                    goto out_free;
                }
                if (*q == ',')
                    q++;
                edges[ne].src = a;
                edges[ne].dst = b;
            }
            continue;
        } else {
            seterr(err, errlen, "schedule text: unknown header field '%s'", tok);
            goto out_free;
        }
        if (*q != '\0') {
            seterr(err, errlen, "schedule text: bad number in '%s'", tok);
            goto out_free;
        }
    }
    if (S < 0 || M < 0) {
        seterr(err, errlen, "schedule text: header needs S= and M=");
        goto out_free;
    }
    if (xmp_sched_create(S, M, ne, edges, out, err, errlen) != 0)
        goto out_free;
    snprintf((*out)->name, sizeof((*out)->name), "%s", name);
    free(edges);
    return 0;
out_free:
    free(edges);
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
            if (*q != 's') {
                seterr(err, errlen, "schedule text line %d: expected 's<stage>'", lineno);
                goto out_free;
            }
            q++;
            st = parse_uint(&q);
            if (st < 0 || st >= s->nstages || strncmp(q, " inflight<=", 11) != 0) {
                seterr(err, errlen, "schedule text line %d: bad stage header (stage %d of %d)",
                       lineno, st, s->nstages);
                goto out_free;
            }
            q += 11;
            inf = parse_uint(&q);
            if (inf < 0 || *q != ':') {
                seterr(err, errlen, "schedule text line %d: bad inflight bound", lineno);
                goto out_free;
            }
            q++;
            s->max_inflight[st] = inf;
            while (next_tok(&q, end, tok, sizeof(tok))) {
                xmp_action_t a;
                if (xmp_action_parse(tok, &a) != 0) {
                    seterr(err, errlen, "schedule text line %d: bad action '%s'", lineno, tok);
                    goto out_free;
                }
                if (xmp_sched_append(s, st, a) != 0) {
                    seterr(err, errlen, "schedule text: out of memory");
                    goto out_free;
                }
            }
        }
    next_line:
        p = *end ? end + 1 : end;
    }
    if (s == NULL) {
        seterr(err, errlen, "schedule text: no 'schedule' header");
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

static int validate_stage(const xmp_schedule_t *s, int st, int *pos, char *err, size_t errlen)
{
    const int M = s->nmb, P = 2 * s->nedges;
    /* pos layout: F,B,I,W [4*M], then start [P*M], wait [P*M] */
    int *pF = pos, *pB = pos + M, *pI = pos + 2 * M, *pW = pos + 3 * M;
    int *pS = pos + 4 * M, *pT = pS + P * M;
    int *nstarted = pT + P * M;
    int nR = 0, nO = 0, posR = -1, posO = -1, lastc = -1, inflight = 0;
    char ab[32];
    for (int i = 0; i < 4 * M + 2 * P * M; i++)
        pos[i] = -1;
    for (int p = 0; p < P; p++)
        nstarted[p] = 0;
    for (int j = 0; j < s->len[st]; j++) {
        xmp_action_t a = s->acts[st][j];
        fmt_act(a, ab);
        if (a.kind <= XMP_ACT_WAIT && (a.mb < 0 || a.mb >= M)) {
            seterr(err, errlen, "stage %d action %d '%s': microbatch %d out of 0..%d", st, j, ab,
                   a.mb, M - 1);
            return -1;
        }
        switch (a.kind) {
        case XMP_ACT_F:
        case XMP_ACT_B:
        case XMP_ACT_I:
        case XMP_ACT_W: {
            int *slot = pos + a.kind * M + a.mb;
            if (*slot >= 0) {
                seterr(err, errlen, "stage %d action %d '%s': microbatch %d appears twice", st, j,
                       ab, a.mb);
                return -1;
            }
            if (posR >= 0 || posO >= 0) {
                seterr(err, errlen, "stage %d action %d '%s': compute after R/O", st, j, ab);
                return -1;
            }
            *slot = j;
            lastc = j;
            if (a.kind == XMP_ACT_F) {
                if (++inflight > s->max_inflight[st]) {
                    seterr(err, errlen,
                           "stage %d action %d '%s': %d microbatches in flight, bound is %d", st, j,
                           ab, inflight, s->max_inflight[st]);
                    return -1;
                }
                for (int e = 0; e < s->nedges; e++)
                    if (s->edges[e].dst == st &&
                        pT[xmp_plan_index(e, XMP_DIR_ACT) * M + a.mb] < 0) {
                        seterr(err, errlen, "stage %d action %d '%s': no WA%d.e%d before it", st, j,
                               ab, a.mb, e);
                        return -1;
                    }
            } else if (a.kind == XMP_ACT_B || a.kind == XMP_ACT_I) {
                if (pF[a.mb] < 0) {
                    seterr(err, errlen, "stage %d action %d '%s': before F%d", st, j, ab, a.mb);
                    return -1;
                }
                inflight--;
                for (int e = 0; e < s->nedges; e++)
                    if (s->edges[e].src == st &&
                        pT[xmp_plan_index(e, XMP_DIR_GRAD) * M + a.mb] < 0) {
                        seterr(err, errlen, "stage %d action %d '%s': no WG%d.e%d before it", st, j,
                               ab, a.mb, e);
                        return -1;
                    }
            } else if (pI[a.mb] < 0) {
                seterr(err, errlen, "stage %d action %d '%s': W before I%d", st, j, ab, a.mb);
                return -1;
            }
            break;
        }
        case XMP_ACT_START:
        case XMP_ACT_WAIT: {
            if (a.edge < 0 || a.edge >= s->nedges || (a.dir != 0 && a.dir != 1)) {
                seterr(err, errlen, "stage %d action %d '%s': edge %d out of 0..%d", st, j, ab,
                       a.edge, s->nedges - 1);
                return -1;
            }
            int p = xmp_plan_index(a.edge, a.dir);
            if (s->edges[a.edge].src != st && s->edges[a.edge].dst != st) {
                seterr(err, errlen, "stage %d action %d '%s': edge %d connects stages %d>%d", st, j,
                       ab, a.edge, s->edges[a.edge].src, s->edges[a.edge].dst);
                return -1;
            }
            int sender = xmp_xfer_sender(s, a.edge, a.dir) == st;
            if (a.kind == XMP_ACT_START) {
                if (a.mb != nstarted[p]) {
                    seterr(err, errlen,
                           "stage %d action %d '%s': transfers of plan %c.e%d must start in "
                           "microbatch order, expected microbatch %d",
                           st, j, ab, a.dir ? 'G' : 'A', a.edge, nstarted[p]);
                    return -1;
                }
                nstarted[p]++;
                pS[p * M + a.mb] = j;
                if (sender) {
                    int prod =
                        a.dir == XMP_DIR_ACT ? pF[a.mb] : (pI[a.mb] >= 0 ? pI[a.mb] : pB[a.mb]);
                    if (prod < 0) {
                        seterr(err, errlen,
                               "stage %d action %d '%s': send before its producer %c%d", st, j, ab,
                               a.dir == XMP_DIR_ACT ? 'F' : 'I', a.mb);
                        return -1;
                    }
                }
            } else {
                if (pS[p * M + a.mb] < 0) {
                    seterr(err, errlen, "stage %d action %d '%s': wait before start", st, j, ab);
                    return -1;
                }
                if (pT[p * M + a.mb] >= 0) {
                    seterr(err, errlen, "stage %d action %d '%s': waited twice", st, j, ab);
                    return -1;
                }
                pT[p * M + a.mb] = j;
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
            seterr(err, errlen, "stage %d action %d: unknown kind %d", st, j, a.kind);
            return -1;
        }
    }
    if (nR > 1 || nO > 1 || (posO >= 0 && posR > posO)) {
        seterr(err, errlen, "stage %d: R and O must appear at most once, R before O", st);
        return -1;
    }
    (void)lastc;
    for (int m = 0; m < M; m++) {
        if (pF[m] < 0) {
            seterr(err, errlen, "stage %d: no F%d", st, m);
            return -1;
        }
        int hasB = pB[m] >= 0, hasI = pI[m] >= 0, hasW = pW[m] >= 0;
        if (!(hasB && !hasI && !hasW) && !(!hasB && hasI && hasW)) {
            seterr(err, errlen, "stage %d: microbatch %d needs one B%d or one I%d and one W%d", st,
                   m, m, m, m);
            return -1;
        }
    }
    for (int e = 0; e < s->nedges; e++) {
        if (s->edges[e].src != st && s->edges[e].dst != st)
            continue;
        for (int d = 0; d < 2; d++) {
            int p = xmp_plan_index(e, d);
            for (int m = 0; m < M; m++)
                if (pS[p * M + m] < 0 || pT[p * M + m] < 0) {
                    seterr(err, errlen, "stage %d: transfer %c%d.e%d not %s", st, d ? 'G' : 'A', m,
                           e, pS[p * M + m] < 0 ? "started" : "waited");
                    return -1;
                }
        }
    }
    return 0;
}

int xmp_sched_validate(const xmp_schedule_t *s, const int *layer_stage, int nlayers, char *err,
                       size_t errlen)
{
    const int M = s->nmb, P = 2 * s->nedges;
    for (int e = 0; e < s->nedges; e++)
        if (s->edges[e].src < 0 || s->edges[e].src >= s->nstages || s->edges[e].dst < 0 ||
            s->edges[e].dst >= s->nstages || s->edges[e].src == s->edges[e].dst) {
            seterr(err, errlen, "edge %d is %d>%d (stages 0..%d)", e, s->edges[e].src,
                   s->edges[e].dst, s->nstages - 1);
            return -1;
        }
    if (layer_stage != NULL) {
        if (nlayers < s->nstages) {
            seterr(err, errlen, "%d layers for %d stages", nlayers, s->nstages);
            return -1;
        }
        int *cnt = calloc((size_t)s->nstages, sizeof(int));
        if (cnt == NULL) {
            seterr(err, errlen, "out of memory");
            return -1;
        }
        for (int l = 0; l < nlayers; l++) {
            if (layer_stage[l] < 0 || layer_stage[l] >= s->nstages) {
                seterr(err, errlen, "layer %d is on stage %d (stages 0..%d)", l, layer_stage[l],
                       s->nstages - 1);
                free(cnt);
                return -1;
            }
            cnt[layer_stage[l]]++;
        }
        for (int i = 0; i < s->nstages; i++)
            if (cnt[i] == 0) {
                seterr(err, errlen, "stage %d owns no layer", i);
                free(cnt);
                return -1;
            }
        free(cnt);
    }
    int *pos = malloc(((size_t)4 * M + 2 * (size_t)P * M + (size_t)P + 1) * sizeof(int));
    if (pos == NULL) {
        seterr(err, errlen, "out of memory");
        return -1;
    }
    int r = 0;
    for (int st = 0; st < s->nstages && r == 0; st++)
        r = validate_stage(s, st, pos, err, errlen);
    free(pos);
    return r;
}

/* ------------------------------------------------------- simulation engine */

typedef struct {
    const xmp_schedule_t *s;
    const xmp_sim_costs_t *c;
    int fill, max_pw;
    int P, M;
    int *cnt;    /* [P][2] starts so far per side */
    int *kofmb;  /* [P][2][M] */
    double *enq; /* [P][2][M] */
    int *nend;   /* [P] ends known */
    double *end; /* [P][M] */
    int *pc;     /* per stage */
    double *t;
    int *held;
    int *pend, *phead, *ptail; /* pending W FIFO per stage [S][M] */
} engine_t;

static double cost_of(const engine_t *E, int st, int kind)
{
    const xmp_sim_costs_t *c = E->c;
    switch (kind) {
    case XMP_ACT_F:
        return c->f ? c->f[st] : 0;
    case XMP_ACT_I:
        return c->i ? c->i[st] : 0;
    case XMP_ACT_W:
        return c->w ? c->w[st] : 0;
    case XMP_ACT_B:
        return c->b ? c->b[st] : (c->i ? c->i[st] : 0) + (c->w ? c->w[st] : 0);
    case XMP_ACT_R:
        return c->r;
    case XMP_ACT_O:
        return c->o;
    default:
        return 0;
    }
}

static void advance_plan(engine_t *E, int p)
{
    const int M = E->M;
    double x = E->c->xfer ? E->c->xfer[p] : 0;
    while (E->nend[p] < M && E->nend[p] < E->cnt[2 * p] && E->nend[p] < E->cnt[2 * p + 1]) {
        int k = E->nend[p];
        double b = E->enq[(2 * p) * M + k];
        if (E->enq[(2 * p + 1) * M + k] > b)
            b = E->enq[(2 * p + 1) * M + k];
        if (k > 0 && E->end[p * M + k - 1] > b)
            b = E->end[p * M + k - 1];
        E->end[p * M + k] = b + x;
        E->nend[p]++;
    }
}

/* End time of the transfer a (START/WAIT) refers to on stage st, or -1 if
 * not known yet. */
static double xfer_end(const engine_t *E, int st, xmp_action_t a)
{
    int p = xmp_plan_index(a.edge, a.dir);
    int side = xmp_xfer_sender(E->s, a.edge, a.dir) == st ? 0 : 1;
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
    free(res->peak_act);
    free(res->len);
    memset(res, 0, sizeof(*res));
}

static int result_alloc(const xmp_schedule_t *s, xmp_sim_result_t *r)
{
    int S = s->nstages;
    memset(r, 0, sizeof(*r));
    r->nstages = S;
    r->busy_s = calloc((size_t)S, sizeof(double));
    r->bubble = calloc((size_t)S, sizeof(double));
    r->peak_act = calloc((size_t)S, sizeof(int));
    r->len = calloc((size_t)S, sizeof(int));
    r->acts = calloc((size_t)S, sizeof(*r->acts));
    r->t0 = calloc((size_t)S, sizeof(*r->t0));
    r->t1 = calloc((size_t)S, sizeof(*r->t1));
    if (!r->busy_s || !r->bubble || !r->peak_act || !r->len || !r->acts || !r->t0 || !r->t1)
        return -1;
    for (int i = 0; i < S; i++) {
        size_t cap = (size_t)s->len[i] + (size_t)s->nmb + 1;
        r->acts[i] = malloc(cap * sizeof(xmp_action_t));
        r->t0[i] = malloc(cap * sizeof(double));
        r->t1[i] = malloc(cap * sizeof(double));
        if (!r->acts[i] || !r->t0[i] || !r->t1[i])
            return -1;
    }
    return 0;
}

enum { CAND_NONE = 0, CAND_EXEC = 1, CAND_FILLW = 2 };

/* What stage st can do next: CAND_EXEC / CAND_FILLW, *blocked_fill = 1 when
 * the stage is blocked on an unknown transfer and only runs a W to fill. */
static int classify(engine_t *E, int st, int *blocked_fill)
{
    const xmp_schedule_t *s = E->s;
    int haspend = E->fill && E->ptail[st] > E->phead[st];
    *blocked_fill = 0;
    if (E->fill && E->max_pw > 0 && E->ptail[st] - E->phead[st] > E->max_pw)
        return CAND_FILLW;
    if (E->pc[st] == s->len[st])
        return haspend ? CAND_FILLW : CAND_NONE;
    xmp_action_t a = s->acts[st][E->pc[st]];
    if (haspend && (a.kind == XMP_ACT_R || a.kind == XMP_ACT_O))
        return CAND_FILLW;
    if (a.kind == XMP_ACT_WAIT && E->c->late_recv && xmp_xfer_receiver(s, a.edge, a.dir) == st &&
        E->kofmb[(2 * xmp_plan_index(a.edge, a.dir) + 1) * E->M + a.mb] < 0)
        return CAND_EXEC; /* late receive: start it first */
    if (a.kind == XMP_ACT_WAIT) {
        double e = xfer_end(E, st, a);
        if (e >= 0)
            return haspend && e > E->t[st] ? CAND_FILLW : CAND_EXEC;
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
    const int S = s->nstages, M = s->nmb, P = 2 * s->nedges;
    engine_t E;
    memset(&E, 0, sizeof(E));
    E.s = s;
    E.c = c;
    E.fill = fill;
    E.max_pw = max_pw;
    E.P = P;
    E.M = M;
    int rc = -1;
    size_t PM = (size_t)(P > 0 ? P : 1) * (size_t)M;
    E.cnt = calloc((size_t)2 * (P > 0 ? P : 1), sizeof(int));
    E.kofmb = malloc(2 * PM * sizeof(int));
    E.enq = calloc(2 * PM, sizeof(double));
    E.nend = calloc((size_t)(P > 0 ? P : 1), sizeof(int));
    E.end = calloc(PM, sizeof(double));
    E.pc = calloc((size_t)S, sizeof(int));
    E.t = calloc((size_t)S, sizeof(double));
    E.held = calloc((size_t)S, sizeof(int));
    E.pend = calloc((size_t)S * (size_t)M, sizeof(int));
    E.phead = calloc((size_t)S, sizeof(int));
    E.ptail = calloc((size_t)S, sizeof(int));
    if (!E.cnt || !E.kofmb || !E.enq || !E.nend || !E.end || !E.pc || !E.t || !E.held || !E.pend ||
        !E.phead || !E.ptail || result_alloc(s, res) != 0) {
        seterr(err, errlen, "simulator: out of memory");
        goto out_free;
    }
    for (size_t i = 0; i < 2 * PM; i++)
        E.kofmb[i] = -1;
    res->ok = 1;
    for (;;) {
        int best = -1, bestbf = 0, kind = CAND_NONE;
        for (int st = 0; st < S; st++) {
            int bf;
            int k = classify(&E, st, &bf);
            if (k == CAND_NONE)
                continue;
            if (best < 0 || E.t[st] < E.t[best] || (E.t[st] == E.t[best] && bestbf && !bf)) {
                best = st;
                bestbf = bf;
                kind = k;
            }
        }
        if (best < 0)
            break;
        int st = best;
        if (kind == CAND_FILLW) {
            int mb = E.pend[st * M + E.phead[st]++];
            xmp_action_t w = {XMP_ACT_W, mb, -1, 0};
            double d = cost_of(&E, st, XMP_ACT_W);
            rec_push(res, st, w, E.t[st], E.t[st] + d);
            E.t[st] += d;
            res->busy_s[st] += d;
            E.held[st]--;
            continue;
        }
        xmp_action_t a = s->acts[st][E.pc[st]];
        if (a.kind == XMP_ACT_WAIT && xfer_end(&E, st, a) >= 0) {
            double e = xfer_end(&E, st, a);
            double t0 = E.t[st];
            if (e > E.t[st])
                E.t[st] = e;
            rec_push(res, st, a, t0, E.t[st]);
            E.pc[st]++;
            continue;
        }
        if (a.kind == XMP_ACT_START || (a.kind == XMP_ACT_WAIT && c->late_recv)) {
            int p = xmp_plan_index(a.edge, a.dir);
            int side = xmp_xfer_sender(s, a.edge, a.dir) == st ? 0 : 1;
            if (c->late_recv && side == 1 && a.kind == XMP_ACT_START) {
                rec_push(res, st, a, E.t[st], E.t[st]); /* posted at the wait instead */
                E.pc[st]++;
                continue;
            }
            if (a.kind == XMP_ACT_WAIT) { /* late receive: start it now, then wait */
                if (a.mb != E.cnt[2 * p + 1]) {
                    seterr(err, errlen,
                           "simulator: stage %d waits for %c%d.e%d out of microbatch order "
                           "(late receives need waits in start order)",
                           st, a.dir ? 'G' : 'A', a.mb, a.edge);
                    goto out_free;
                }
            }
            int k = E.cnt[2 * p + side]++;
            if (k >= M) {
                seterr(err, errlen, "simulator: stage %d starts more than %d transfers on e%d", st,
                       M, a.edge);
                goto out_free;
            }
            E.kofmb[(2 * p + side) * M + a.mb] = k;
            E.enq[(2 * p + side) * M + k] = E.t[st];
            advance_plan(&E, p);
            if (a.kind == XMP_ACT_WAIT)
                continue; /* now enqueued: the same action waits next round */
            rec_push(res, st, a, E.t[st], E.t[st]);
            E.pc[st]++;
            continue;
        }
        double d = cost_of(&E, st, a.kind);
        if (fill && a.kind == XMP_ACT_W) {
            E.pc[st]++; /* explicit W in a filled schedule: not expected; skip */
            continue;
        }
        rec_push(res, st, a, E.t[st], E.t[st] + d);
        E.t[st] += d;
        res->busy_s[st] += d;
        if (a.kind == XMP_ACT_F) {
            if (++E.held[st] > res->peak_act[st])
                res->peak_act[st] = E.held[st];
        } else if (a.kind == XMP_ACT_B || a.kind == XMP_ACT_W) {
            E.held[st]--;
        } else if (a.kind == XMP_ACT_I && fill) {
            E.pend[st * M + E.ptail[st]++] = a.mb;
        }
        E.pc[st]++;
    }
    /* finished or deadlocked */
    {
        size_t off = 0;
        res->msg[0] = '\0';
        for (int st = 0; st < S; st++) {
            if (E.t[st] > res->step_s)
                res->step_s = E.t[st];
            if (E.pc[st] < s->len[st]) {
                char ab[32];
                xmp_action_t a = s->acts[st][E.pc[st]];
                fmt_act(a, ab);
                int other = a.kind >= XMP_ACT_START && a.kind <= XMP_ACT_WAIT
                                ? (xmp_xfer_sender(s, a.edge, a.dir) == st
                                       ? xmp_xfer_receiver(s, a.edge, a.dir)
                                       : xmp_xfer_sender(s, a.edge, a.dir))
                                : -1;
                res->ok = 0;
                if (off < sizeof(res->msg))
                    off += (size_t)snprintf(res->msg + off, sizeof(res->msg) - off,
                                            "%sstage %d stuck at action %d '%s' (peer stage %d)",
                                            off ? "; " : "deadlock: ", st, E.pc[st], ab, other);
            }
        }
        for (int st = 0; st < S; st++)
            res->bubble[st] = res->step_s > 0 ? (res->step_s - res->busy_s[st]) / res->step_s : 0.0;
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
    free(E.pend);
    free(E.phead);
    free(E.ptail);
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
        seterr(err, errlen, "%s", res.msg);
    if (r >= 0)
        xmp_sim_result_free(&res);
    return r;
}

/* -------------------------------------------------------------- generators */

static int push(xmp_schedule_t *s, int st, int kind, int mb, int edge, int dir)
{
    xmp_action_t a = {kind, mb, edge, dir};
    return xmp_sched_append(s, st, a);
}

/* Compute order of stage st: kinds/mbs of 2*M entries (F or backward). */
static void compute_order(int kind, int S, int M, int st, int *ck, int *cm, int *warm)
{
    int n = 0, w;
    if (kind == XMP_SCHED_GPIPE)
        w = M;
    else if (kind == XMP_SCHED_1F1B)
        w = S - st < M ? S - st : M;
    else
        w = 2 * (S - st) - 1 < M ? 2 * (S - st) - 1 : M;
    *warm = w;
    int nf = 0;
    for (; nf < w; nf++, n++) {
        ck[n] = XMP_ACT_F;
        cm[n] = nf;
    }
    for (int b = 0; b < M; b++) {
        ck[n] = XMP_ACT_B;
        cm[n++] = b;
        if (nf < M && kind != XMP_SCHED_GPIPE) {
            ck[n] = XMP_ACT_F;
            cm[n++] = nf++;
        }
    }
}

static int gen_stage(xmp_schedule_t *s, int kind, int st, int split, int *ck, int *cm)
{
    const int M = s->nmb, E = s->nedges;
    int warm, r = 0;
    compute_order(kind, s->nstages, M, st, ck, cm, &warm);
    s->max_inflight[st] = warm;
    for (int e = 0; e < E; e++)
        if (s->edges[e].dst == st)
            r |= push(s, st, XMP_ACT_START, 0, e, XMP_DIR_ACT);
    for (int e = 0; e < E; e++)
        if (s->edges[e].src == st)
            r |= push(s, st, XMP_ACT_START, 0, e, XMP_DIR_GRAD);
    for (int n = 0; n < 2 * M; n++) {
        int m = cm[n];
        if (ck[n] == XMP_ACT_F) {
            for (int e = 0; e < E; e++)
                if (s->edges[e].dst == st) {
                    r |= push(s, st, XMP_ACT_WAIT, m, e, XMP_DIR_ACT);
                    if (m + 1 < M)
                        r |= push(s, st, XMP_ACT_START, m + 1, e, XMP_DIR_ACT);
                }
            r |= push(s, st, XMP_ACT_F, m, -1, 0);
            for (int e = 0; e < E; e++)
                if (s->edges[e].src == st)
                    r |= push(s, st, XMP_ACT_START, m, e, XMP_DIR_ACT);
        } else {
            for (int e = 0; e < E; e++)
                if (s->edges[e].src == st) {
                    r |= push(s, st, XMP_ACT_WAIT, m, e, XMP_DIR_ACT);
                    r |= push(s, st, XMP_ACT_WAIT, m, e, XMP_DIR_GRAD);
                    if (m + 1 < M)
                        r |= push(s, st, XMP_ACT_START, m + 1, e, XMP_DIR_GRAD);
                }
            r |= push(s, st, split ? XMP_ACT_I : XMP_ACT_B, m, -1, 0);
            for (int e = 0; e < E; e++)
                if (s->edges[e].dst == st)
                    r |= push(s, st, XMP_ACT_START, m, e, XMP_DIR_GRAD);
        }
    }
    for (int e = 0; e < E; e++)
        if (s->edges[e].dst == st)
            for (int m = 0; m < M; m++)
                r |= push(s, st, XMP_ACT_WAIT, m, e, XMP_DIR_GRAD);
    r |= push(s, st, XMP_ACT_R, -1, -1, 0);
    r |= push(s, st, XMP_ACT_O, -1, -1, 0);
    return r;
}

int xmp_sched_generate(int kind, int nstages, int nmb, int nedges, const xmp_sedge_t *edges,
                       const xmp_gen_opts_t *opts, xmp_schedule_t **out, char *err, size_t errlen)
{
    xmp_gen_opts_t o;
    memset(&o, 0, sizeof(o));
    if (opts)
        o = *opts;
    if (kind < 0 || kind > XMP_SCHED_EAGER_1F1B) {
        seterr(err, errlen, "schedule kind %d unknown (gpipe, 1f1b, eager-1f1b)", kind);
        return -1;
    }
    if (kind != XMP_SCHED_GPIPE && nmb < nstages) {
        seterr(err, errlen,
               "%s needs at least as many microbatches as stages: M=%d < S=%d (use M >= %d or "
               "gpipe)",
               xmp_sched_kind_name(kind), nmb, nstages, nstages);
        return -1;
    }
    xmp_schedule_t *s = NULL, *g = NULL;
    int *ck = NULL, *cm = NULL;
    if (xmp_sched_create(nstages, nmb, nedges, edges, &s, err, errlen) != 0)
        return -1;
    snprintf(s->name, sizeof(s->name), "%s%s", xmp_sched_kind_name(kind),
             o.delay_wgrad ? "+dw" : "");
    ck = malloc((size_t)2 * nmb * sizeof(int));
    cm = malloc((size_t)2 * nmb * sizeof(int));
    if (ck == NULL || cm == NULL) {
        seterr(err, errlen, "schedule: out of memory");
        goto out_free;
    }
    for (int st = 0; st < nstages; st++)
        if (gen_stage(s, kind, st, o.delay_wgrad, ck, cm) != 0) {
            seterr(err, errlen, "schedule: out of memory");
            goto out_free;
        }
    if (o.delay_wgrad) {
        /* Place W by simulation: the stage runs a queued W when it would
         * otherwise wait; the rest drain before R. */
        int S = nstages, P = 2 * nedges;
        double *cf = malloc((size_t)S * 3 * sizeof(double));
        double *cx = malloc((size_t)(P > 0 ? P : 1) * sizeof(double));
        if (cf == NULL || cx == NULL) {
            free(cf);
            free(cx);
            seterr(err, errlen, "schedule: out of memory");
            goto out_free;
        }
        for (int i = 0; i < S; i++) {
            cf[i] = o.f > 0 ? o.f : 1.0;
            cf[S + i] = o.i > 0 ? o.i : 1.0;
            cf[2 * S + i] = o.w > 0 ? o.w : 1.0;
        }
        for (int p = 0; p < P; p++)
            cx[p] = o.xfer;
        xmp_sim_costs_t c;
        memset(&c, 0, sizeof(c));
        c.f = cf;
        c.i = cf + S;
        c.w = cf + 2 * S;
        c.xfer = cx;
        xmp_sim_result_t res;
        int r = engine_run(s, &c, 1, o.max_pending_w, &res, err, errlen);
        free(cf);
        free(cx);
        if (r != 0) {
            if (r == 1) {
                seterr(err, errlen, "schedule: generated %s deadlocks: %s", s->name, res.msg);
                xmp_sim_result_free(&res);
            }
            goto out_free;
        }
        if (xmp_sched_create(nstages, nmb, nedges, edges, &g, err, errlen) != 0) {
            xmp_sim_result_free(&res);
            goto out_free;
        }
        memcpy(g->name, s->name, sizeof(g->name));
        for (int st = 0; st < nstages; st++) {
            g->max_inflight[st] = s->max_inflight[st];
            for (int j = 0; j < res.len[st]; j++)
                if (xmp_sched_append(g, st, res.acts[st][j]) != 0) {
                    xmp_sim_result_free(&res);
                    seterr(err, errlen, "schedule: out of memory");
                    goto out_free;
                }
        }
        xmp_sim_result_free(&res);
        xmp_sched_destroy(s);
        s = g;
        g = NULL;
    }
    if (xmp_sched_validate(s, NULL, 0, err, errlen) != 0 ||
        xmp_sched_dryrun(s, 0, err, errlen) != 0)
        goto out_free;
    free(ck);
    free(cm);
    *out = s;
    return 0;
out_free:
    free(ck);
    free(cm);
    xmp_sched_destroy(s);
    xmp_sched_destroy(g);
    return -1;
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
        fprintf(f, "s%-3d |%s| bubble %5.1f%% peak act %d\n", st, row, 100.0 * res->bubble[st],
                res->peak_act[st]);
    }
    free(row);
    return 0;
}
