/*
 * Schedules' text form: actions and whole schedules formatted and parsed
 * (xmp_action_format/parse, xmp_sched_format/fprint/parse). Pure C.
 */
#include "sched/schedule.h"
#include "sched/sched_priv.h"
#include "util/xmp_err.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

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
int *xmp_sched__parse_int_list(const char *q, int *n)
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
            if ((map = xmp_sched__parse_int_list(tok + 4, &nmap)) == NULL) {
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
