/* The gptstep record of a cost model (gptstep.h). */
#include "calib/gptstep.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "xm_core.h"

static const char *const g_fields[] = {"gptstep", "layers", "channels", "heads",  "seq",
                                       "rows",    "vocab",  "busy",     "seconds"};
#define NFIELDS 9

static void where_of(char *buf, size_t n, int line)
{
    if (line > 0)
        snprintf(buf, n, "cluster file line %d", line);
    else
        snprintf(buf, n, "gptstep record");
}

/* The checks of a record's values (not of its presence). */
static xmesh_result_t check(const xmp_gptstep_t *r)
{
    char where[64];
    where_of(where, sizeof where, r->line);
    const struct {
        const char *name;
        int v;
    } f[] = {{"layers", r->layers}, {"channels", r->channels}, {"heads", r->heads}, {"seq", r->seq},
             {"rows", r->rows},     {"vocab", r->vocab},       {"busy", r->busy}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].v < 1)
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s: gptstep field %s: %d (expected >= 1)",
                          where, f[i].name, f[i].v);
    if (r->channels % r->heads)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                      "%s: gptstep field heads: %d does not divide channels %d", where, r->heads,
                      r->channels);
    if (!(r->seconds > 0) || !isfinite(r->seconds))
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                      "%s: gptstep field seconds: %g (expected a finite time > 0)", where,
                      r->seconds);
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_gptstep_get(const xm_costmodel_t *m, xmp_gptstep_t *out)
{
    if (!out)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xmp_gptstep_get: out is NULL");
    memset(out, 0, sizeof *out);
    const xm_steprec_t *s = xm_costmodel_step(m, "gptstep");
    if (!s)
        return XMESH_SUCCESS;
    if (s->nvalues != NFIELDS - 1) {
        char list[128] = "";
        for (int i = 0; i < NFIELDS; i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? " " : "",
                     g_fields[i]);
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                      "cluster file line %d: gptstep record has %d fields, expected %d: %s",
                      s->line, s->nvalues + 1, NFIELDS, list);
    }
    int v[7];
    for (int i = 0; i < 7; i++) {
        double d = s->values[i];
        if (d != floor(d) || d < 0 || d > (double)(1 << 24))
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                          "cluster file line %d: gptstep field %s: '%.10g' is not a whole number "
                          "in [0, %d]",
                          s->line, g_fields[i + 1], d, 1 << 24);
        v[i] = (int)d;
    }
    xmp_gptstep_t g = {v[0], v[1], v[2], v[3], v[4], v[5], v[6], s->values[7], s->line};
    xmesh_result_t r = check(&g);
    if (r)
        return r;
    *out = g;
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_gptstep_set(xm_costmodel_t *m, const xmp_gptstep_t *r)
{
    if (!m || !r)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xmp_gptstep_set: %s is NULL",
                      !m ? "model" : "record");
    xmesh_result_t e = check(r);
    if (e)
        return e;
    xm_steprec_t s;
    memset(&s, 0, sizeof s);
    snprintf(s.name, sizeof s.name, "gptstep");
    snprintf(s.comment, sizeof s.comment,
             "gptstep layers channels heads seq rows vocab busy seconds: one training step of the "
             "serial GPT-2 (forward, backward, AdamW)");
    const double v[NFIELDS - 1] = {r->layers, r->channels, r->heads, r->seq,
                                   r->rows,   r->vocab,    r->busy,  r->seconds};
    memcpy(s.values, v, sizeof v);
    s.nvalues = NFIELDS - 1;
    s.line = r->line;
    return xm_costmodel_set_step(m, &s);
}

xmesh_result_t xmp_costmodel_parse(const char *text, xm_costmodel_t **out)
{
    xm_costmodel_t *m = NULL;
    xmp_gptstep_t g;
    xmesh_result_t r = xm_costmodel_parse(text, out ? &m : NULL);
    if (r)
        return r;
    if ((r = xmp_gptstep_get(m, &g))) {
        xm_costmodel_destroy(m);
        return r;
    }
    *out = m;
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_costmodel_load(const char *path, xm_costmodel_t **out)
{
    xm_costmodel_t *m = NULL;
    xmp_gptstep_t g;
    xmesh_result_t r = xm_costmodel_load(path, out ? &m : NULL);
    if (r)
        return r;
    if ((r = xmp_gptstep_get(m, &g))) {
        xm_costmodel_destroy(m);
        return r;
    }
    *out = m;
    return XMESH_SUCCESS;
}
