/* xmesh-plan: what its parts share (plan.h). */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "xm_api.h"
#include "xm_cases.h"
#include "xm_cluster_file.h"
#include "xm_cost.h"
#include "xm_sched.h"

#include "plan.h"

int xpl_bad(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "xmesh-plan: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (see --help)\n");
    va_end(ap);
    return 2;
}

/* "2x4" (or "2,4") -> dims. */
int xpl_parse_mesh(const char *flag, const char *s, int *ndim, int *shape)
{
    int n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 1 || v > 65536 || n == XM_MAX_MESH_DIMS)
            return xpl_bad("bad value '%s' for %s: expected up to %d positive sizes like 2x4", s,
                           flag, XM_MAX_MESH_DIMS);
        shape[n++] = (int)v;
        p = end;
        if (*p == 'x' || *p == 'X' || *p == ',') {
            p++;
            if (!*p)
                return xpl_bad("bad value '%s' for %s: trailing separator", s, flag);
        } else if (*p) {
            return xpl_bad("bad value '%s' for %s: unexpected '%c'", s, flag, *p);
        }
    }
    if (n == 0)
        return xpl_bad("bad value '%s' for %s: empty mesh", s, flag);
    *ndim = n;
    return 0;
}

int xpl_parse_shape(const char *s, int *ndim, int64_t *shape)
{
    int n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || errno || v < 0 || n == XM_MAX_DIMS)
            return xpl_bad("bad value '%s' for --shape: expected up to %d sizes >= 0 like 1024,512",
                           s, XM_MAX_DIMS);
        shape[n++] = v;
        p = end;
        if (*p == ',' || *p == 'x') {
            p++;
            if (!*p)
                return xpl_bad("bad value '%s' for --shape: trailing separator", s);
        } else if (*p) {
            return xpl_bad("bad value '%s' for --shape: unexpected '%c'", s, *p);
        }
    }
    *ndim = n;
    return 0;
}

xm_sched_opts_t xpl_sched_opts(const opts_t *o, xmesh_scheduler_t kind)
{
    xm_sched_opts_t so;
    memset(&so, 0, sizeof so);
    so.kind = kind;
    so.budget_us = (int64_t)(o->budget_ms * 1000.0);
    if (so.budget_us < 1)
        so.budget_us = 1;
    so.seed = o->seed;
    /* The all-gather strategies take senders and order from the send/receive
     * model, as plan creation does (lib/plan/api.c). */
    so.strategy = o->strategy == XMESH_STRATEGY_SENDRECV_ALLGATHER ||
                          o->strategy == XMESH_STRATEGY_GLOBAL_ALLGATHER
                      ? XMESH_STRATEGY_SENDRECV
                      : o->strategy;
    so.max_evals = o->max_evals;
    return so;
}

double xpl_now_ms(clockid_t clk)
{
    struct timespec t;
    clock_gettime(clk, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

const char *xpl_human_bytes(double b, char *buf, size_t n)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024 && i < 4) {
        b /= 1024;
        i++;
    }
    snprintf(buf, n, i ? "%.2f %s" : "%.0f %s", b, u[i]);
    return buf;
}
