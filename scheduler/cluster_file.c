/* Cluster-file parser (format in xm_cluster_file.h): the base key = value
 * lines here, the [collectives] and [compute] records in costmodel.c. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xm_cluster_file.h"
#include "xm_costmodel.h"

#define MAX_FILE_BYTES (1 << 20)

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    char *e = s + strlen(s);
    while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r'))
        *--e = '\0';
    return s;
}

/* Applies one `key = value` to x; line is for messages. */
static xmesh_result_t apply(xm_cluster_t *x, int line, const char *key, const char *val)
{
    char *end;
    errno = 0;
    double v = strtod(val, &end);
    if (end == val || *end || errno || !isfinite(v))
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "cluster file line %d: %s = '%s' is not a number",
                      line, key, val);
    if (v <= 0 && strcmp(key, "latency_us") && strcmp(key, "nic_burst_bytes"))
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "cluster file line %d: %s = %s must be > 0", line,
                      key, val);
    if (v < 0)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "cluster file line %d: %s = %s must be >= 0",
                      line, key, val);
    if (!strcmp(key, "nic_gbps")) {
        x->nic_send_Bps = x->nic_recv_Bps = v * 1e9 / 8;
    } else if (!strcmp(key, "nic_send_gbps")) {
        x->nic_send_Bps = v * 1e9 / 8;
    } else if (!strcmp(key, "nic_recv_gbps")) {
        x->nic_recv_Bps = v * 1e9 / 8;
    } else if (!strcmp(key, "intra_gbps")) {
        x->intra_Bps = v * 1e9 / 8;
    } else if (!strcmp(key, "latency_us")) {
        x->latency_s = v * 1e-6;
    } else if (!strcmp(key, "nic_burst_bytes")) {
        x->nic_burst_bytes = v;
    } else if (!strcmp(key, "nics_per_host") || !strcmp(key, "chunk_bytes")) {
        if (v != floor(v) || v > (strcmp(key, "nics_per_host") ? 1e15 : 64))
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                          "cluster file line %d: %s = %s must be a whole number in range", line,
                          key, val);
        if (!strcmp(key, "nics_per_host"))
            x->nics_per_host = (int)v;
        else
            x->chunk_bytes = (int64_t)v;
    } else {
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                      "cluster file line %d: unknown key '%s' (expected nic_gbps, nic_send_gbps, "
                      "nic_recv_gbps, nics_per_host, intra_gbps, latency_us, chunk_bytes or "
                      "nic_burst_bytes)",
                      line, key);
    }
    return XMESH_SUCCESS;
}

/* A section header "[name]": name of [a-z0-9_-], 1..31 characters, copied
 * to out. INVALID_ARGUMENT naming the line otherwise. */
static xmesh_result_t section_name(const char *l, int line, char *out, size_t outlen)
{
    size_t n = strlen(l);
    if (n < 3 || l[n - 1] != ']' || n - 2 >= outlen)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                      "cluster file line %d: '%s' is not a section header [name] (name of "
                      "1..%zu characters a-z, 0-9, '_', '-')",
                      line, l, outlen - 1);
    for (size_t i = 1; i + 1 < n; i++) {
        char ch = l[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_' || ch == '-'))
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                          "cluster file line %d: section name in '%s' has the character '%c' "
                          "(allowed: a-z, 0-9, '_', '-')",
                          line, l, ch);
    }
    memcpy(out, l + 1, n - 2);
    out[n - 2] = '\0';
    return XMESH_SUCCESS;
}

xmesh_result_t xm_clusterfile_parse(const char *text, xm_cluster_t *c, xm_costmodel_t *m)
{
    if (!text)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "cluster file parser: text is NULL");
    size_t n = strlen(text);
    if (n > MAX_FILE_BYTES)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "cluster file of %zu bytes is too large", n);
    char *buf = malloc(n + 1);
    if (!buf)
        return XM_ERR(XMESH_ERR_NO_MEMORY, "cluster file: out of memory");
    memcpy(buf, text, n + 1);
    /* records go to a scratch model when the caller wants none, so that
     * every reader refuses the same files (duplicates included) */
    xm_costmodel_t *scratch = m ? NULL : xm_costmodel_create();
    if (!m && !scratch) {
        free(buf);
        return XM_ERR(XMESH_ERR_NO_MEMORY, "cluster file: out of memory");
    }
    if (!m)
        m = scratch;
    xm_cluster_t x; /* applied to a copy: *c changes only on success */
    if (c)
        x = *c;
    else
        memset(&x, 0, sizeof x);
    xmesh_result_t r = XMESH_SUCCESS;
    char section[32] = ""; /* "" is the base section of key = value lines */
    int line = 0, skip = 0;
    for (char *l = buf, *next; l; l = next) {
        line++;
        next = strchr(l, '\n');
        if (next)
            *next++ = '\0';
        char *hash = strchr(l, '#');
        if (hash)
            *hash = '\0';
        l = trim(l);
        if (!*l)
            continue;
        if (*l == '[') {
            if ((r = section_name(l, line, section, sizeof section)))
                break;
            if (!strcmp(section, "cluster"))
                section[0] = '\0';
            /* sections of later versions are skipped, so newer files load */
            skip = section[0] && !xm_costmodel_section_known(section);
            continue;
        }
        if (skip)
            continue;
        if (section[0]) {
            if ((r = xm_costmodel_parse_line(m, section, line, l)))
                break;
            continue;
        }
        char *eq = strchr(l, '=');
        if (!eq) {
            r = XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                       "cluster file line %d: '%s' is not of the form key = value", line, l);
            break;
        }
        *eq = '\0';
        if ((r = apply(&x, line, trim(l), trim(eq + 1))))
            break;
    }
    free(buf);
    xm_costmodel_destroy(scratch);
    if (r)
        return r;
    if (c)
        *c = x;
    return XMESH_SUCCESS;
}

xmesh_result_t xm_cluster_parse(const char *text, xm_cluster_t *c)
{
    if (!text || !c)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xm_cluster_parse: %s is NULL",
                      !text ? "text" : "cluster");
    return xm_clusterfile_parse(text, c, NULL);
}

xmesh_result_t xm_clusterfile_read(const char *path, char **text)
{
    if (!path)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "cluster file path is NULL");
    FILE *f = fopen(path, "r");
    if (!f)
        return XM_ERR(XMESH_ERR_SYSTEM, "cluster file '%s': %s", path, strerror(errno));
    char *buf = malloc(MAX_FILE_BYTES + 1);
    if (!buf) {
        fclose(f);
        return XM_ERR(XMESH_ERR_NO_MEMORY, "cluster file: out of memory");
    }
    size_t n = fread(buf, 1, MAX_FILE_BYTES + 1, f);
    int rerr = ferror(f);
    fclose(f);
    xmesh_result_t r = XMESH_SUCCESS;
    if (rerr)
        r = XM_ERR(XMESH_ERR_SYSTEM, "cluster file '%s': read error", path);
    else if (n > MAX_FILE_BYTES)
        r = XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "cluster file '%s' is larger than %d bytes", path,
                   MAX_FILE_BYTES);
    else if (memchr(buf, '\0', n))
        r = XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "cluster file '%s' contains a NUL byte", path);
    if (r) {
        free(buf);
        return r;
    }
    buf[n] = '\0';
    *text = buf;
    return XMESH_SUCCESS;
}

xmesh_result_t xm_cluster_load(const char *path, xm_cluster_t *c)
{
    char *text = NULL;
    xmesh_result_t r = xm_clusterfile_read(path, &text);
    if (r)
        return r;
    r = xm_cluster_parse(text, c);
    free(text);
    return r;
}

/* The cost model of a cluster file (xm_costmodel.h): here rather than in costmodel.c, so the
 * parser depends on the cost model and not both ways. */
xmesh_result_t xm_costmodel_parse(const char *text, xm_costmodel_t **out)
{
    if (!text || !out)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xm_costmodel_parse: %s is NULL",
                      !text ? "text" : "out");
    xm_costmodel_t *m = xm_costmodel_create();
    if (!m)
        return XM_ERR(XMESH_ERR_NO_MEMORY, "xm_costmodel_parse: out of memory");
    xmesh_result_t r = xm_clusterfile_parse(text, NULL, m);
    if (r) {
        xm_costmodel_destroy(m);
        return r;
    }
    *out = m;
    return XMESH_SUCCESS;
}

xmesh_result_t xm_costmodel_load(const char *path, xm_costmodel_t **out)
{
    if (!out)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xm_costmodel_load: out is NULL");
    char *text = NULL;
    xmesh_result_t r = xm_clusterfile_read(path, &text);
    if (r)
        return r;
    r = xm_costmodel_parse(text, out);
    free(text);
    return r;
}
