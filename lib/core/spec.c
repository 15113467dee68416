/* Sharding specs in GSPMD ("S01RR", paper 002 section 2.2) and OneFlow SBP
 * ("S(0),B,P", paper 004) notation, parsed into one canonical xm_spec_t. */
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "xm_core.h"

#define SPEC_ERR(s, fmt, ...)                                                                      \
    XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "sharding '%s': " fmt, (s), ##__VA_ARGS__)

static int is_sbp(const char *s)
{
    return strchr(s, '(') || strchr(s, 'B') || strchr(s, 'P');
}

static int is_sep(char c)
{
    return c == ',' || c == ' ';
}

static xmesh_result_t use_axis(const char *s, xm_spec_t *sp, unsigned *used, int axis, int d)
{
    if (axis < 0 || axis >= sp->mesh_ndim)
        return SPEC_ERR(s, "mesh axis %d out of range (mesh has %d dims)", axis, sp->mesh_ndim);
    if (*used & (1u << axis))
        return SPEC_ERR(s, "mesh axis %d used twice", axis);
    *used |= 1u << axis;
    if (d >= 0)
        sp->axes[d][sp->naxes[d]++] = axis;
    return XMESH_SUCCESS;
}

static xmesh_result_t parse_gspmd(const char *s, xm_spec_t *sp)
{
    unsigned used = 0;
    int d = 0;
    for (const char *p = s; *p;) {
        if (is_sep(*p)) {
            p++;
            continue;
        }
        if (*p != 'R' && *p != 'S')
            return SPEC_ERR(s, "unexpected character '%c' at offset %d (expected R or S<axes>)", *p,
                            (int)(p - s));
        if (d >= sp->ndim)
            return SPEC_ERR(s, "more than %d dim tokens for a %d-d tensor", sp->ndim, sp->ndim);
        if (*p++ == 'R') {
            d++;
            continue;
        }
        if (!isdigit((unsigned char)*p))
            return SPEC_ERR(s, "token 'S' at offset %d names no mesh axis", (int)(p - s - 1));
        while (isdigit((unsigned char)*p)) {
            xmesh_result_t r = use_axis(s, sp, &used, *p - '0', d);
            if (r)
                return r;
            p++;
        }
        d++;
    }
    if (d != sp->ndim)
        return SPEC_ERR(s, "%d dim tokens for a %d-d tensor", d, sp->ndim);
    return XMESH_SUCCESS;
}

static xmesh_result_t parse_sbp(const char *s, xm_spec_t *sp)
{
    unsigned used = 0;
    int a = 0;
    for (const char *p = s; *p;) {
        if (is_sep(*p)) {
            p++;
            continue;
        }
        if (a >= sp->mesh_ndim)
            return SPEC_ERR(s, "more than %d SBP tokens for a %d-d mesh", sp->mesh_ndim,
                            sp->mesh_ndim);
        if (*p == 'B') {
            p++;
        } else if (*p == 'P') {
            sp->partial_mask |= 1u << a;
            used |= 1u << a;
            p++;
        } else if (*p == 'S') {
            int dim = 0, n = 0;
            if (sscanf(p, "S(%d)%n", &dim, &n) != 1 || n == 0)
                return SPEC_ERR(s, "malformed token at offset %d (expected S(d))", (int)(p - s));
            if (dim < 0 || dim >= sp->ndim)
                return SPEC_ERR(s, "S(%d): tensor dim %d out of range (tensor has %d dims)", dim,
                                dim, sp->ndim);
            xmesh_result_t r = use_axis(s, sp, &used, a, dim);
            if (r)
                return r;
            p += n;
        } else {
            return SPEC_ERR(s, "unexpected character '%c' at offset %d (expected S(d), B or P)", *p,
                            (int)(p - s));
        }
        a++;
        while (*p == ' ')
            p++;
        if (*p && *p != ',')
            return SPEC_ERR(s, "expected ',' at offset %d, found '%c'", (int)(p - s), *p);
    }
    if (a != sp->mesh_ndim)
        return SPEC_ERR(s, "%d SBP tokens for a %d-d mesh", a, sp->mesh_ndim);
    return XMESH_SUCCESS;
}

xmesh_result_t xm_spec_parse(const char *s, int ndim, int mesh_ndim, xm_spec_t *out)
{
    if (!s || !out)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xm_spec_parse: %s is NULL",
                      !s ? "sharding" : "out");
    if (ndim < 0 || ndim > XM_MAX_DIMS)
        return SPEC_ERR(s, "tensor ndim %d out of range [0, %d]", ndim, XM_MAX_DIMS);
    if (mesh_ndim < 1 || mesh_ndim > XM_MAX_MESH_DIMS)
        return SPEC_ERR(s, "mesh ndim %d out of range [1, %d]", mesh_ndim, XM_MAX_MESH_DIMS);
    xm_spec_t sp;
    memset(&sp, 0, sizeof sp);
    sp.ndim = ndim;
    sp.mesh_ndim = mesh_ndim;
    xmesh_result_t r = is_sbp(s) ? parse_sbp(s, &sp) : parse_gspmd(s, &sp);
    if (r)
        return r;
    *out = sp;
    return XMESH_SUCCESS;
}

int xm_spec_format_gspmd(const xm_spec_t *sp, char *buf, size_t len)
{
    char tmp[128];
    int n = 0;
    for (int d = 0; d < sp->ndim; d++) {
        if (!sp->naxes[d]) {
            tmp[n++] = 'R';
            continue;
        }
        tmp[n++] = 'S';
        for (int j = 0; j < sp->naxes[d]; j++)
            tmp[n++] = (char)('0' + sp->axes[d][j]);
    }
    if (sp->partial_mask) {
        tmp[n++] = '+';
        tmp[n++] = 'P';
        for (int a = 0; a < sp->mesh_ndim; a++)
            if (sp->partial_mask & (1u << a))
                tmp[n++] = (char)('0' + a);
    }
    tmp[n] = '\0';
    return snprintf(buf, len, "%s", tmp);
}

int xm_spec_format_sbp(const xm_spec_t *sp, char *buf, size_t len)
{
    char tmp[128];
    int n = 0;
    for (int d = 0; d < sp->ndim; d++)
        for (int j = 1; j < sp->naxes[d]; j++)
            if (sp->axes[d][j] < sp->axes[d][j - 1])
                return -1; /* SBP orders axes lowest-major only */
    for (int a = 0; a < sp->mesh_ndim; a++) {
        const char *sep = a ? "," : "";
        int dim = -1;
        for (int d = 0; d < sp->ndim && dim < 0; d++)
            for (int j = 0; j < sp->naxes[d]; j++)
                if (sp->axes[d][j] == a)
                    dim = d;
        if (sp->partial_mask & (1u << a))
            n += snprintf(tmp + n, sizeof tmp - n, "%sP", sep);
        else if (dim >= 0)
            n += snprintf(tmp + n, sizeof tmp - n, "%sS(%d)", sep, dim);
        else
            n += snprintf(tmp + n, sizeof tmp - n, "%sB", sep);
    }
    tmp[n] = '\0';
    return snprintf(buf, len, "%s", tmp);
}

int xm_spec_equal(const xm_spec_t *a, const xm_spec_t *b)
{
    if (a->ndim != b->ndim || a->mesh_ndim != b->mesh_ndim || a->partial_mask != b->partial_mask)
        return 0;
    for (int d = 0; d < a->ndim; d++) {
        if (a->naxes[d] != b->naxes[d])
            return 0;
        for (int j = 0; j < a->naxes[d]; j++)
            if (a->axes[d][j] != b->axes[d][j])
                return 0;
    }
    return 1;
}
