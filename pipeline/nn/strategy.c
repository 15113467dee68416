/* Strategies as data: parse, format, look up, load (see strategy.h). */
#include "nn/strategy.h"
#include "nn/sbp_layers.h"
#include "util/xmp_err.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *skip_ws(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\r'))
        p++;
    return p;
}

static int is_name_char(char c)
{
    return isalnum((unsigned char)c) || c == '_' || c == '.';
}

/* Parses one SBP token at *p (no leading blanks); advances *p. */
static int parse_token(const char **p, const char *end, xmp_sbp_t *out)
{
    const char *q = *p;
    if (q < end && *q == 'B') {
        *out = xmp_sbp_b();
        *p = q + 1;
        return 0;
    }
    if (q < end && *q == 'P') {
        *out = xmp_sbp_p();
        *p = q + 1;
        return 0;
    }
    if (end - q >= 4 && q[0] == 'S' && q[1] == '(' && isdigit((unsigned char)q[2])) {
        int d = q[2] - '0';
        if (q[3] != ')' || d >= XMP_MAX_DIMS)
            return -1;
        *out = xmp_sbp_s(d);
        *p = q + 4;
        return 0;
    }
    return -1;
}

/* Parses "X,Y,..." of exactly naxes tokens at *p. what: "SBP" or "storage
 * SBP" for messages. */
static int parse_list(const char **p, const char *end, int naxes, xmp_sbp_t *sbp,
                      const char *source, int line, const char *cls, const char *what, char *err,
                      size_t errlen)
{
    const char *q = skip_ws(*p, end);
    int k = 0;
    for (;;) {
        const char *t0 = q;
        xmp_sbp_t s;
        if (parse_token(&q, end, &s) || (q < end && is_name_char(*q))) {
            const char *t1 = t0;
            while (t1 < end && *t1 != ',' && *t1 != ' ' && *t1 != '\t' && *t1 != '#')
                t1++;
            return xmp_err_buf(
                err, errlen,
                "%s:%d: class '%s': %s axis %d: bad SBP '%.*s' (expected S(d) with d "
                "0..%d, B or P)",
                source, line, cls, what, k, (int)(t1 - t0), t0, XMP_MAX_DIMS - 1);
        }
        if (k < XMP_MAX_MESH_DIMS)
            sbp[k] = s;
        k++;
        q = skip_ws(q, end);
        if (q < end && *q == ',') {
            q = skip_ws(q + 1, end);
            continue;
        }
        break;
    }
    if (k != naxes)
        return xmp_err_buf(err, errlen,
                           "%s:%d: class '%s': %s has %d axes, the strategy has axes=%d", source,
                           line, cls, what, k, naxes);
    *p = q;
    return 0;
}

static int parse_header(const char *p, const char *end, const char *source, int line,
                        xmp_strategy_t *s, char *err, size_t errlen)
{
    static const char kw[] = "strategy";
    size_t nk = sizeof kw - 1;
    if ((size_t)(end - p) < nk || strncmp(p, kw, nk) ||
        (p + nk < end && !isspace((unsigned char)p[nk])))
        return xmp_err_buf(
            err, errlen,
            "%s:%d: expected the header 'strategy NAME axes=N' before any class, got '%.*s'",
            source, line, (int)(end - p), p);
    const char *q = skip_ws(p + nk, end), *n0 = q;
    while (q < end && (is_name_char(*q) || *q == '-'))
        q++;
    if (q == n0 || q - n0 >= XMP_STRATEGY_MAX_NAME)
        return xmp_err_buf(err, errlen, "%s:%d: header: bad or missing strategy name", source,
                           line);
    memcpy(s->name, n0, (size_t)(q - n0));
    s->name[q - n0] = '\0';
    q = skip_ws(q, end);
    if (end - q < 6 || strncmp(q, "axes=", 5) || !isdigit((unsigned char)q[5]))
        return xmp_err_buf(err, errlen, "%s:%d: header: expected 'axes=N' after the name '%s'",
                           source, line, s->name);
    int a = q[5] - '0';
    q = skip_ws(q + 6, end);
    if (q < end)
        return xmp_err_buf(err, errlen, "%s:%d: header: unexpected '%.*s' after axes=%d", source,
                           line, (int)(end - q), q, a);
    if (a < 1 || a > XMP_MAX_MESH_DIMS)
        return xmp_err_buf(err, errlen, "%s:%d: header: axes=%d out of range [1, %d]", source, line,
                           a, XMP_MAX_MESH_DIMS);
    s->naxes = a;
    return 0;
}

static int parse_entry(const char *p, const char *end, const char *source, int line,
                       xmp_strategy_t *s, char *err, size_t errlen)
{
    xmp_strategy_entry_t e;
    memset(&e, 0, sizeof e);
    e.line = line;
    const char *q = p;
    while (q < end && is_name_char(*q))
        q++;
    if (q == p || q - p >= XMP_STRATEGY_MAX_NAME)
        return xmp_err_buf(
            err, errlen,
            "%s:%d: expected 'CLASS = SBP,...' (class: letters, digits, '_', '.'), got "
            "'%.*s'",
            source, line, (int)(end - p), p);
    memcpy(e.cls, p, (size_t)(q - p));
    q = skip_ws(q, end);
    if (q >= end || *q != '=')
        return xmp_err_buf(err, errlen, "%s:%d: class '%s': expected '=' after the class name",
                           source, line, e.cls);
    q++;
    if (parse_list(&q, end, s->naxes, e.sbp, source, line, e.cls, "SBP", err, errlen))
        return -1;
    if (q < end) {
        if (end - q < 6 || strncmp(q, "store", 5) || !isspace((unsigned char)q[5]))
            return xmp_err_buf(err, errlen,
                               "%s:%d: class '%s': unexpected '%.*s' (only 'store SBP,...' "
                               "may follow the SBP)",
                               source, line, e.cls, (int)(end - q), q);
        q += 5;
        if (parse_list(&q, end, s->naxes, e.store, source, line, e.cls, "storage SBP", err, errlen))
            return -1;
        if (q < end)
            return xmp_err_buf(err, errlen,
                               "%s:%d: class '%s': unexpected '%.*s' after the storage SBP", source,
                               line, e.cls, (int)(end - q), q);
        e.has_store = 1;
    }
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->e[i].cls, e.cls))
            return xmp_err_buf(err, errlen, "%s:%d: class '%s' given twice (first on line %d)",
                               source, line, e.cls, s->e[i].line);
    if (s->n >= XMP_STRATEGY_MAX_CLASSES)
        return xmp_err_buf(err, errlen, "%s:%d: more than %d classes", source, line,
                           XMP_STRATEGY_MAX_CLASSES);
    s->e[s->n++] = e;
    return 0;
}

int xmp_strategy_parse(const char *text, const char *source, xmp_strategy_t *out, char *err,
                       size_t errlen)
{
    if (!source)
        source = "<text>";
    if (!text || !out)
        return xmp_err_buf(err, errlen, "%s: no text", source);
    xmp_strategy_t *s = calloc(1, sizeof *s);
    if (!s)
        return xmp_err_buf(err, errlen, "%s: out of memory", source);
    snprintf(s->source, sizeof s->source, "%s", source);
    int line = 0, have_header = 0, rc = 0;
    const char *p = text;
    while (*p && !rc) {
        line++;
        const char *nl = strchr(p, '\n'), *end = nl ? nl : p + strlen(p), *next = nl ? nl + 1 : end;
        const char *hash = memchr(p, '#', (size_t)(end - p));
        if (hash)
            end = hash;
        const char *b = skip_ws(p, end);
        while (end > b && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\r'))
            end--;
        if (b < end) {
            if (!have_header) {
                rc = parse_header(b, end, source, line, s, err, errlen);
                have_header = 1;
            } else {
                rc = parse_entry(b, end, source, line, s, err, errlen);
            }
        }
        p = next;
    }
    if (!rc && !have_header)
        rc = xmp_err_buf(err, errlen, "%s: empty strategy (no 'strategy NAME axes=N' header)",
                         source);
    if (!rc)
        *out = *s;
    free(s);
    return rc;
}

void xmp_strategy_sbp_string(const xmp_sbp_t *sbp, int naxes, char *buf, size_t n)
{
    size_t at = 0;
    if (!n)
        return;
    buf[0] = '\0';
    for (int a = 0; a < naxes && at < n; a++) {
        int w = sbp[a].kind == XMP_S
                    ? snprintf(buf + at, n - at, "%sS(%d)", a ? "," : "", sbp[a].dim)
                    : snprintf(buf + at, n - at, "%s%c", a ? "," : "",
                               sbp[a].kind == XMP_B ? 'B' : 'P');
        at += w > 0 ? (size_t)w : 0;
    }
}

int xmp_strategy_format(const xmp_strategy_t *s, char *buf, size_t n)
{
    size_t at = 0;
    char tmp[256], a[64], b[64];
#define EMIT(...)                                                                                  \
    do {                                                                                           \
        int w_ = snprintf(tmp, sizeof tmp, __VA_ARGS__);                                           \
        if (w_ > 0) {                                                                              \
            if (at < n)                                                                            \
                snprintf(buf + at, n - at, "%s", tmp);                                             \
            at += (size_t)w_;                                                                      \
        }                                                                                          \
    } while (0)
    if (n)
        buf[0] = '\0';
    EMIT("strategy %s axes=%d\n", s->name, s->naxes);
    for (int i = 0; i < s->n; i++) {
        const xmp_strategy_entry_t *e = &s->e[i];
        xmp_strategy_sbp_string(e->sbp, s->naxes, a, sizeof a);
        if (e->has_store) {
            xmp_strategy_sbp_string(e->store, s->naxes, b, sizeof b);
            EMIT("%-12s = %-24s store %s\n", e->cls, a, b);
        } else {
            EMIT("%-12s = %s\n", e->cls, a);
        }
    }
#undef EMIT
    return (int)at;
}

const xmp_strategy_entry_t *xmp_strategy_get(const xmp_strategy_t *s, const char *cls)
{
    for (int i = 0; s && cls && i < s->n; i++)
        if (!strcmp(s->e[i].cls, cls))
            return &s->e[i];
    return NULL;
}

static int sbps_equal(const xmp_sbp_t *a, const xmp_sbp_t *b, int n)
{
    for (int k = 0; k < n; k++)
        if (!xmp_sbp_eq(a[k], b[k]))
            return 0;
    return 1;
}

int xmp_strategy_equal(const xmp_strategy_t *a, const xmp_strategy_t *b)
{
    if (strcmp(a->name, b->name) || a->naxes != b->naxes || a->n != b->n)
        return 0;
    for (int i = 0; i < a->n; i++) {
        const xmp_strategy_entry_t *x = &a->e[i], *y = xmp_strategy_get(b, x->cls);
        if (!y || x->has_store != y->has_store || !sbps_equal(x->sbp, y->sbp, a->naxes) ||
            (x->has_store && !sbps_equal(x->store, y->store, a->naxes)))
            return 0;
    }
    return 1;
}

/* Reads a whole file; NULL when it cannot be opened (errno kept). */
static char *read_file(const char *path, char *err, size_t errlen, int *opened)
{
    *opened = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    *opened = 1;
    char *buf = NULL;
    long len = -1;
    if (fseek(f, 0, SEEK_END) == 0)
        len = ftell(f);
    if (len < 0 || len > (1 << 20) || fseek(f, 0, SEEK_SET)) {
        xmp_err_buf(err, errlen, "strategy file '%s': cannot read it (or larger than 1 MiB)", path);
        goto out;
    }
    buf = malloc((size_t)len + 1);
    if (!buf || fread(buf, 1, (size_t)len, f) != (size_t)len) {
        xmp_err_buf(err, errlen, "strategy file '%s': read failed", path);
        free(buf);
        buf = NULL;
        goto out;
    }
    buf[len] = '\0';
out:
    fclose(f);
    return buf;
}

/* Adapts a plain built-in callback to the mesh form (user is the plain callback). */
typedef struct {
    xmp_strategy_builtin_fn fn;
} plain_builtins_t;
static int plain_builtins(void *user, const char *name, int naxes, const int *shape, char *text,
                          size_t n, char *err, size_t errlen)
{
    (void)shape;
    return ((const plain_builtins_t *)user)->fn(name, naxes, text, n, err, errlen);
}

int xmp_strategy_load(const char *name_or_path, xmp_strategy_builtin_fn builtins,
                      const char *builtin_names, int naxes, xmp_strategy_t *out, char *err,
                      size_t errlen)
{
    plain_builtins_t pb = {builtins};
    return xmp_strategy_load_mesh(name_or_path, builtins ? plain_builtins : NULL, &pb,
                                  builtin_names, naxes, NULL, out, err, errlen);
}

int xmp_strategy_load_mesh(const char *name_or_path, xmp_strategy_mesh_builtin_fn builtins,
                           void *user, const char *builtin_names, int naxes, const int *shape,
                           xmp_strategy_t *out, char *err, size_t errlen)
{
    if (!name_or_path || !*name_or_path)
        return xmp_err_buf(err, errlen, "strategy: empty name");
    if (naxes < 1 || naxes > XMP_MAX_MESH_DIMS)
        return xmp_err_buf(err, errlen, "strategy '%s': mesh of %d axes (must be 1..%d)",
                           name_or_path, naxes, XMP_MAX_MESH_DIMS);
    int opened = 0, rc;
    char src[256];
    xmp_strategy_t *s = calloc(1, sizeof *s);
    char *text = read_file(name_or_path, err, errlen, &opened);
    if (!s) {
        free(text);
        return xmp_err_buf(err, errlen, "strategy '%s': out of memory", name_or_path);
    }
    if (opened) {
        if (!text) {
            free(s);
            return -1;
        }
        snprintf(src, sizeof src, "%s", name_or_path);
    } else {
        size_t cap = 1 << 16;
        text = malloc(cap);
        rc = !text      ? xmp_err_buf(err, errlen, "strategy '%s': out of memory", name_or_path)
             : builtins ? builtins(user, name_or_path, naxes, shape, text, cap, err, errlen)
                        : 1;
        if (rc == 1)
            xmp_err_buf(err, errlen,
                        "strategy '%s': no such file and no built-in of that name (built-ins: %s)",
                        name_or_path, builtin_names ? builtin_names : "none");
        if (rc) {
            free(text);
            free(s);
            return -1;
        }
        snprintf(src, sizeof src, "built-in %s", name_or_path);
    }
    rc = xmp_strategy_parse(text, src, s, err, errlen);
    free(text);
    if (!rc && s->naxes != naxes)
        rc = xmp_err_buf(err, errlen, "%s: strategy '%s' has axes=%d, the stage mesh has %d axes",
                         src, s->name, s->naxes, naxes);
    if (!rc)
        *out = *s;
    free(s);
    return rc;
}

int xmp_strategy_check_classes(const xmp_strategy_t *s, const char *const *known, int nknown,
                               const char *const *required, int nreq, char *err, size_t errlen)
{
    for (int i = 0; i < s->n; i++) {
        int ok = 0;
        for (int k = 0; k < nknown && !ok; k++)
            ok = !strcmp(s->e[i].cls, known[k]);
        if (!ok) {
            char list[1024];
            size_t at = 0;
            list[0] = '\0';
            for (int k = 0; k < nknown && at < sizeof list; k++) {
                int w = snprintf(list + at, sizeof list - at, "%s%s", k ? " " : "", known[k]);
                at += w > 0 ? (size_t)w : 0;
            }
            return xmp_err_buf(err, errlen, "%s:%d: unknown class '%s' (known: %s)", s->source,
                               s->e[i].line, s->e[i].cls, list);
        }
    }
    for (int k = 0; k < nreq; k++)
        if (!xmp_strategy_get(s, required[k]))
            return xmp_err_buf(err, errlen, "%s: class '%s' missing (strategy '%s' must give it)",
                               s->source, required[k], s->name);
    return 0;
}

/* ------------------------------------------------------- against a graph */

#define GMAXCLS 64

int xmp_strategy_check_graph_classes(const xmp_strategy_t *s, const xmp_graph_t *g,
                                     const char *where, char *err, size_t errlen)
{
    const char *known[GMAXCLS];
    int nd[GMAXCLS];
    int np = xmp_graph_classes(g, 1, known, nd, GMAXCLS);
    int n = np < GMAXCLS ? np + xmp_graph_classes(g, 0, known + np, nd + np, GMAXCLS - np) : np;
    if (n > GMAXCLS)
        return xmp_err_buf(err, errlen, "%s: the graph has %d classes (at most %d)", where, n,
                           GMAXCLS);
    char sub[512];
    if (xmp_strategy_check_classes(s, known, n, known, n, sub, sizeof sub))
        return xmp_err_buf(err, errlen, "%s: %s", where, sub);
    const int naxes = s->naxes;
    for (int i = 0; i < n; i++) {
        const xmp_strategy_entry_t *e = xmp_strategy_get(s, known[i]);
        for (int a = 0; a < naxes; a++) {
            xmp_sbp_t v = e->sbp[a];
            if (v.kind == XMP_S && v.dim >= nd[i])
                return xmp_err_buf(err, errlen,
                                   "%s: class %s (%s line %d): mesh axis %d: S(%d) but %s has "
                                   "%d dims (S(%d) splits dim %d of a %d-dim tensor: no rule)",
                                   where, e->cls, s->source, e->line, a, v.dim, e->cls, nd[i],
                                   v.dim, v.dim, nd[i]);
            if (i < np && v.kind == XMP_P)
                return xmp_err_buf(err, errlen,
                                   "%s: class %s: mesh axis %d: P: missing SBP rule 'partial "
                                   "parameter' (a parameter is computed with S or B; its gradient "
                                   "is the P)",
                                   where, e->cls, a);
        }
        for (int a = 0; e->has_store && a < naxes; a++) {
            xmp_sbp_t v = e->store[a];
            if (i >= np)
                return xmp_err_buf(err, errlen,
                                   "%s: class %s (%s line %d): a storage SBP is for parameters "
                                   "only",
                                   where, e->cls, s->source, e->line);
            if (v.kind == XMP_P)
                return xmp_err_buf(err, errlen,
                                   "%s: class %s: mesh axis %d: storage P: missing SBP rule "
                                   "'partial storage' (no storage SBP P: store S or B)",
                                   where, e->cls, a);
            if (v.kind == XMP_S && v.dim >= nd[i])
                return xmp_err_buf(err, errlen,
                                   "%s: class %s (%s line %d): mesh axis %d: storage S(%d) but "
                                   "%s has %d dims",
                                   where, e->cls, s->source, e->line, a, v.dim, e->cls, nd[i]);
        }
    }
    return 0;
}

int xmp_strategy_check_graph_rules(const xmp_strategy_t *s, const xmp_graph_t *g,
                                   const xmp_sbp_t *noclass, const char *where, char *err,
                                   size_t errlen)
{
    xmp_sbp_t out[XMP_MAX_MESH_DIMS];
    char msg[400];
    for (int i = 0; i < g->nnode; i++) {
        const xmp_gnode_t *n = &g->node[i];
        if (!n->rule)
            continue;
        int nd[XMP_G_MAXIN];
        const xmp_sbp_t *in[XMP_G_MAXIN];
        for (int k = 0; k < n->nin; k++) {
            const int64_t *dim;
            nd[k] = xmp_graph_ref_nd(g, n->in[k], &dim);
            const char *cls = xmp_graph_ref_cls(g, n->in[k]);
            const xmp_strategy_entry_t *e = cls[0] ? xmp_strategy_get(s, cls) : NULL;
            if (cls[0] && !e)
                return xmp_err_buf(err, errlen, "%s: %s: class %s missing", where, n->what, cls);
            in[k] = e ? e->sbp : noclass;
        }
        if (xmp_sbp_deduce(n->rule, s->naxes, n->nin, nd, in, out, msg, sizeof msg))
            return xmp_err_buf(err, errlen, "%s: %s: %s", where, n->what, msg);
    }
    return 0;
}
