/* Cluster-file parser (format in xm_cluster_file.h). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xm_cluster_file.h"

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
    if (v <= 0 && strcmp(key, "latency_us"))
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
                      "nic_recv_gbps, nics_per_host, intra_gbps, latency_us or chunk_bytes)",
                      line, key);
    }
    return XMESH_SUCCESS;
}

xmesh_result_t xm_cluster_parse(const char *text, xm_cluster_t *c)
{
    if (!text || !c)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xm_cluster_parse: %s is NULL",
                      !text ? "text" : "cluster");
    size_t n = strlen(text);
    if (n > MAX_FILE_BYTES)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "cluster file of %zu bytes is too large", n);
    char *buf = malloc(n + 1);
    if (!buf)
        return XM_ERR(XMESH_ERR_NO_MEMORY, "cluster file: out of memory");
    memcpy(buf, text, n + 1);
    xm_cluster_t x = *c; /* applied to a copy: *c changes only on success */
    xmesh_result_t r = XMESH_SUCCESS;
    int line = 0;
    for (char *save = NULL, *l = strtok_r(buf, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        line++;
        char *hash = strchr(l, '#');
        if (hash)
            *hash = '\0';
        l = trim(l);
        if (!*l)
            continue;
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
    if (r)
        return r;
    *c = x;
    return XMESH_SUCCESS;
}

xmesh_result_t xm_cluster_load(const char *path, xm_cluster_t *c)
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
    fclose(f);
    xmesh_result_t r;
    if (n > MAX_FILE_BYTES)
        r = XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "cluster file '%s' is larger than %d bytes", path,
                   MAX_FILE_BYTES);
    else if (memchr(buf, '\0', n))
        r = XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "cluster file '%s' contains a NUL byte", path);
    else {
        buf[n] = '\0';
        r = xm_cluster_parse(buf, c);
    }
    free(buf);
    return r;
}
