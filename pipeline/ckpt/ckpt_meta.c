/* Metadata helpers: typed getters and a list builder for xmp_ckpt_save. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_internal.h"

static xmesh_result_t meta_get(const xmp_ckpt_t *c, const char *key, const char **v)
{
    if (!c || !key)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "xmp_ckpt_meta: NULL argument");
    *v = xmp_ckpt_meta(c, key);
    if (!*v)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s/" CK_MANIFEST ": no metadata '%s'", c->dir,
                       key);
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_ckpt_meta_i64(const xmp_ckpt_t *c, const char *key, int64_t *out)
{
    const char *v;
    xmesh_result_t r = meta_get(c, key, &v);
    if (r)
        return r;
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                       "%s/" CK_MANIFEST ": metadata '%s' = '%s' is not an integer", c->dir, key,
                       v);
    *out = x;
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_ckpt_meta_f64(const xmp_ckpt_t *c, const char *key, double *out)
{
    const char *v;
    xmesh_result_t r = meta_get(c, key, &v);
    if (r)
        return r;
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                       "%s/" CK_MANIFEST ": metadata '%s' = '%s' is not a number", c->dir, key, v);
    *out = x;
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_ckpt_meta_int(const xmp_ckpt_t *c, const char *key, int lo, int hi, int *out)
{
    int64_t v;
    xmesh_result_t r = xmp_ckpt_meta_i64(c, key, &v);
    if (r)
        return r;
    if (v < lo || v > hi)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                       "%s/" CK_MANIFEST ": metadata '%s' = %lld is outside [%d, %d]", c->dir, key,
                       (long long)v, lo, hi);
    *out = (int)v;
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_ckpt_meta_f32(const xmp_ckpt_t *c, const char *key, float *out)
{
    double v;
    xmesh_result_t r = xmp_ckpt_meta_f64(c, key, &v);
    if (!r)
        *out = (float)v;
    return r;
}

xmesh_result_t xmp_ckpt_metalist_setf(xmp_ckpt_metalist_t *m, const char *key, const char *fmt, ...)
{
    if (!m || !fmt || !ck_name_ok(key))
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                       "metadata key '%s': 1..%d printable characters without blanks",
                       key ? key : "(null)", XMP_CKPT_NAME_MAX - 1);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *v = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (!v)
        return xmp_err(XMESH_ERR_NO_MEMORY, "metadata '%s'", key);
    va_start(ap, fmt);
    vsnprintf(v, (size_t)n + 1, fmt, ap);
    va_end(ap);
    for (int i = 0; i < m->n; i++)
        if (strcmp(m->kv[i].key, key) == 0) {
            free((char *)m->kv[i].value);
            m->kv[i].value = v;
            return XMESH_SUCCESS;
        }
    char *k = strdup(key);
    if (k && m->n == m->cap) {
        int cap = m->cap ? m->cap * 2 : 16;
        xmp_ckpt_kv_t *nk = realloc(m->kv, sizeof *nk * (size_t)cap);
        if (nk) {
            m->kv = nk;
            m->cap = cap;
        } else {
            free(k);
            k = NULL;
        }
    }
    if (!k) {
        free(v);
        return xmp_err(XMESH_ERR_NO_MEMORY, "metadata '%s'", key);
    }
    m->kv[m->n].key = k;
    m->kv[m->n].value = v;
    m->n++;
    return XMESH_SUCCESS;
}

void xmp_ckpt_metalist_free(xmp_ckpt_metalist_t *m)
{
    if (!m)
        return;
    for (int i = 0; i < m->n; i++) {
        free((char *)m->kv[i].key);
        free((char *)m->kv[i].value);
    }
    free(m->kv);
    memset(m, 0, sizeof *m);
}
