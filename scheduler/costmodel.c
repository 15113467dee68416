/* Calibrated collective and compute costs: fits, the [collectives] and
 * [compute] sections of the cluster file, predictions (xm_costmodel.h,
 * docs/COSTMODEL.md). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "xm_costmodel.h"
#include "xm_sched_impl.h"

static const char *const coll_names[XM_COLL_NKINDS] = {"allreduce", "allgather", "reduce_scatter",
                                                       "alltoall"};

const char *xm_coll_name(xm_coll_t kind)
{
    return (int)kind >= 0 && kind < XM_COLL_NKINDS ? coll_names[kind] : NULL;
}

int xm_coll_from_name(const char *s)
{
    for (int k = 0; s && k < XM_COLL_NKINDS; k++)
        if (!strcmp(s, coll_names[k]))
            return k;
    return -1;
}

double xm_coll_volume(xm_coll_t kind, double bytes, int p)
{
    if ((int)kind < 0 || kind >= XM_COLL_NKINDS || p < 1 || !(bytes >= 0))
        return NAN;
    double f = (double)(p - 1) / p * bytes;
    return kind == XM_COLL_ALLREDUCE ? 2 * f : f;
}

int xm_coll_steps(xm_coll_t kind, int p)
{
    return p < 1 ? 0 : kind == XM_COLL_ALLREDUCE ? 2 * (p - 1) : p - 1;
}

xmesh_result_t xm_coll_fit(xm_coll_t kind, int p, const double *bytes, const double *seconds,
                           int npts, xm_fit_t *out)
{
    if (!xm_coll_name(kind))
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xm_coll_fit: collective kind %d out of range",
                      (int)kind);
    if (p < 2)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xm_coll_fit: group size %d, need at least 2", p);
    if (!bytes || !seconds || !out)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xm_coll_fit: %s is NULL",
                      !bytes     ? "bytes"
                      : !seconds ? "seconds"
                                 : "out");
    if (npts < 2 || npts > 1 << 20)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xm_coll_fit: %d point(s), need 2 .. 2^20", npts);
    double *x = malloc(sizeof(double) * 2 * (size_t)npts), *w = x + npts;
    if (!x)
        return XM_ERR(XMESH_ERR_NO_MEMORY, "xm_coll_fit: out of memory");
    xmesh_result_t r = XMESH_SUCCESS;
    for (int i = 0; i < npts && !r; i++) {
        if (!(bytes[i] > 0) || !isfinite(bytes[i]))
            r = XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                       "xm_coll_fit: %s point %d: %g bytes, need a finite count > 0",
                       coll_names[kind], i, bytes[i]);
        else if (!(seconds[i] > 0) || !isfinite(seconds[i]))
            r = XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                       "xm_coll_fit: %s point %d: %g seconds, need a finite time > 0",
                       coll_names[kind], i, seconds[i]);
        else {
            x[i] = xm_coll_volume(kind, bytes[i], p);
            w[i] = 1 / (seconds[i] * seconds[i]); /* relative residuals (xm_cost.h) */
        }
    }
    xm_fit_t f;
    if (!r)
        r = xm_fit_weighted(x, seconds, w, npts, &f);
    if (!r)
        *out = f;
    free(x);
    return r;
}

xm_costmodel_t *xm_costmodel_create(void)
{
    return calloc(1, sizeof(xm_costmodel_t));
}

void xm_costmodel_destroy(xm_costmodel_t *m)
{
    if (!m)
        return;
    free(m->coll);
    free(m->gemm);
    free(m->cpusets);
    free(m->cpu_set_of);
    free(m);
}

/* ------------------------------------------------------------ records */

xmesh_result_t xm_costmodel_add_cpuset(xm_costmodel_t *m, int cpus, const int *ranks, int nranks,
                                       double wait)
{
    if (!m || !ranks)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xm_costmodel_add_cpuset: %s is NULL",
                      !m ? "model" : "ranks");
    if (cpus < 1)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "cpuset record: cpus %d (expected >= 1)", cpus);
    if (nranks < 1)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "cpuset record: no ranks");
    if (!(wait >= 0 && wait <= 1))
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "cpuset record: wait %g (expected 0 .. 1)", wait);
    int top = m->cpu_nranks;
    for (int i = 0; i < nranks; i++) {
        if (ranks[i] < 0 || ranks[i] >= (1 << 24))
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "cpuset record: rank %d out of range [0, %d)",
                          ranks[i], 1 << 24);
        if (ranks[i] + 1 > top)
            top = ranks[i] + 1;
    }
    /* repeats through a bitmap: a record may list up to 2^20 ranks */
    unsigned char *seen = calloc((size_t)top / 8 + 1, 1);
    if (!seen)
        return XM_ERR(XMESH_ERR_NO_MEMORY, "xm_costmodel_add_cpuset: out of memory");
    for (int i = 0; i < nranks; i++) {
        int k = ranks[i];
        if (k < m->cpu_nranks && m->cpu_set_of[k] >= 0) {
            free(seen);
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                          "cpuset record: rank %d is already in the cpuset of line %d", k,
                          m->cpusets[m->cpu_set_of[k]].line);
        }
        if (seen[k / 8] & (1u << (k % 8))) {
            free(seen);
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "cpuset record: rank %d repeats", k);
        }
        seen[k / 8] |= (unsigned char)(1u << (k % 8));
    }
    free(seen);
    xm_cpuset_t *cs = realloc(m->cpusets, (size_t)(m->ncpusets + 1) * sizeof *cs);
    if (!cs)
        return XM_ERR(XMESH_ERR_NO_MEMORY, "xm_costmodel_add_cpuset: out of memory");
    m->cpusets = cs;
    int *of = realloc(m->cpu_set_of, (size_t)top * sizeof *of);
    if (!of)
        return XM_ERR(XMESH_ERR_NO_MEMORY, "xm_costmodel_add_cpuset: out of memory");
    m->cpu_set_of = of;
    for (int r = m->cpu_nranks; r < top; r++)
        of[r] = -1;
    m->cpu_nranks = top;
    for (int i = 0; i < nranks; i++)
        of[ranks[i]] = m->ncpusets;
    cs[m->ncpusets].cpus = cpus;
    cs[m->ncpusets].nranks = nranks;
    cs[m->ncpusets].line = 0;
    cs[m->ncpusets].wait = wait;
    cs[m->ncpusets].sync = 0;
    m->ncpusets++;
    return XMESH_SUCCESS;
}

/* The common checks of xm_cost_cpu_share and xm_cost_cpu_sync: -1 for bad arguments (busy
 * outside 0..1; the rank's own entry is not read when skip_own), 0 when the cpuset records do
 * not cover exactly the ranks 0 .. nranks-1, 1 when they do. */
static int cpu_records(const xm_costmodel_t *m, int nranks, const double *busy, int rank,
                       int skip_own)
{
    if (!m || !busy || nranks < 1 || rank < 0 || rank >= nranks)
        return -1;
    for (int r = 0; r < nranks; r++)
        if ((r != rank || !skip_own) && (!(busy[r] >= 0) || busy[r] > 1))
            return -1;
    if (m->ncpusets == 0 || m->cpu_nranks != nranks)
        return 0;
    for (int r = 0; r < nranks; r++)
        if (m->cpu_set_of[r] < 0)
            return 0;
    return 1;
}

int xm_cost_cpu_share(const xm_costmodel_t *m, int nranks, const double *busy, int rank,
                      double *factor)
{
    int c = factor ? cpu_records(m, nranks, busy, rank, 0) : -1;
    if (c <= 0) {
        if (c == 0)
            *factor = 1;
        return c;
    }
    int set = m->cpu_set_of[rank];
    double k = m->cpusets[set].cpus, n = m->cpusets[set].nranks, w = m->cpusets[set].wait, b = 0;
    for (int r = 0; r < nranks; r++)
        if (m->cpu_set_of[r] == set)
            b += r == rank ? 1.0 : busy[r] + w * (1 - busy[r]);
    double all = fmin(1.0, k / n), now = fmin(1.0, k / b);
    *factor = all / now;
    return 1;
}

xmesh_result_t xm_costmodel_set_cpuset_sync(xm_costmodel_t *m, int set, double sync)
{
    if (!m)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xm_costmodel_set_cpuset_sync: model is NULL");
    if (set < 0 || set >= m->ncpusets)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "cpuset sync: set %d out of range [0, %d)", set,
                      m->ncpusets);
    if (!(sync >= 0) || !isfinite(sync))
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "cpuset record: sync %g (expected >= 0 s)", sync);
    m->cpusets[set].sync = sync;
    return XMESH_SUCCESS;
}

int xm_cost_cpu_sync(const xm_costmodel_t *m, int nranks, const double *busy, int rank,
                     double *seconds)
{
    int c = seconds ? cpu_records(m, nranks, busy, rank, 1) : -1;
    if (c <= 0) {
        if (c == 0)
            *seconds = 0;
        return c;
    }
    int set = m->cpu_set_of[rank];
    double idle = 1;
    for (int r = 0; r < nranks; r++)
        if (r != rank && m->cpu_set_of[r] == set)
            idle *= 1 - busy[r];
    *seconds = m->cpusets[set].sync * (1 - idle);
    return 1;
}

static const char *const elt_names[XM_ELT_NKINDS] = {"gelu", "layernorm", "attention",
                                                     "xent", "residual",  "adamw"};

const char *xm_elt_name(xm_elt_t kind)
{
    return (int)kind >= 0 && kind < XM_ELT_NKINDS ? elt_names[kind] : NULL;
}

/* Where a record came from, for messages: its cluster file line, else what it is. */
static void record_where(char *buf, size_t n, int line, const char *what)
{
    if (line > 0)
        snprintf(buf, n, "cluster file line %d", line);
    else
        snprintf(buf, n, "%s", what);
}

xmesh_result_t xm_costmodel_set_elt(xm_costmodel_t *m, xm_elt_t kind, const xm_elt_rec_t *r)
{
    if (!m || !r)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xm_costmodel_set_elt: %s is NULL",
                      !m ? "model" : "record");
    char where[64];
    record_where(where, sizeof where, r->line, "eltwise record");
    if (!xm_elt_name(kind))
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s: eltwise kind %d out of range", where,
                      (int)kind);
    if (r->busy < 1)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s: eltwise %s field busy: %d (expected >= 1)",
                      where, elt_names[kind], r->busy);
    if (!(r->fwd >= 0) || !isfinite(r->fwd) || !(r->bwd >= 0) || !isfinite(r->bwd))
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                      "%s: eltwise %s field %s: %g (expected a finite time >= 0)", where,
                      elt_names[kind], !(r->fwd >= 0) || !isfinite(r->fwd) ? "fwd" : "bwd",
                      !(r->fwd >= 0) || !isfinite(r->fwd) ? r->fwd : r->bwd);
    if (m->elt[kind].busy > 0)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s: eltwise %s repeats line %d", where,
                      elt_names[kind], m->elt[kind].line);
    m->elt[kind] = *r;
    return XMESH_SUCCESS;
}

static int is_step_name(const char *s)
{
    size_t n = strlen(s);
    return n > 4 && n < XM_STEP_NAME && !strcmp(s + n - 4, "step");
}

xmesh_result_t xm_costmodel_set_step(xm_costmodel_t *m, const xm_steprec_t *r)
{
    if (!m || !r)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xm_costmodel_set_step: %s is NULL",
                      !m ? "model" : "record");
    char where[64];
    record_where(where, sizeof where, r->line, "step record");
    if (!memchr(r->name, '\0', sizeof r->name) || !is_step_name(r->name))
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                      "%s: step record name '%.*s' (expected NAMEstep, at most %d characters)",
                      where, (int)sizeof r->name, r->name, XM_STEP_NAME - 1);
    if (r->nvalues < 1 || r->nvalues > XM_STEP_MAX_VALUES)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s: %s record has %d values (expected 1 to %d)",
                      where, r->name, r->nvalues, XM_STEP_MAX_VALUES);
    for (int i = 0; i < r->nvalues; i++)
        if (!isfinite(r->values[i]))
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s: %s value %d: %g (expected finite)",
                          where, r->name, i + 1, r->values[i]);
    if (!memchr(r->comment, '\0', sizeof r->comment) || strchr(r->comment, '\n'))
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s: %s comment is not one line", where, r->name);
    const xm_steprec_t *old = xm_costmodel_step(m, r->name);
    if (old)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s: %s repeats line %d", where, r->name,
                      old->line);
    if (m->nsteps >= XM_STEP_MAX_RECORDS)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s: more than %d step records", where,
                      XM_STEP_MAX_RECORDS);
    m->steps[m->nsteps++] = *r;
    return XMESH_SUCCESS;
}

const xm_steprec_t *xm_costmodel_step(const xm_costmodel_t *m, const char *name)
{
    for (int i = 0; m && name && i < m->nsteps; i++)
        if (!strcmp(m->steps[i].name, name))
            return &m->steps[i];
    return NULL;
}

int xm_cost_elt(const xm_costmodel_t *m, xm_elt_t kind, double units, double *fwd, double *bwd)
{
    if (!m || !xm_elt_name(kind) || !(units >= 0) || !isfinite(units))
        return -1;
    const xm_elt_rec_t *r = &m->elt[kind];
    int have = r->busy > 0;
    if (fwd)
        *fwd = have ? units * r->fwd : 0;
    if (bwd)
        *bwd = have ? units * r->bwd : 0;
    return have;
}

static int geom_eq(const xm_coll_geom_t *a, const xm_coll_geom_t *b)
{
    return a->group_size == b->group_size && a->ranks_per_host == b->ranks_per_host &&
           a->hosts == b->hosts && a->share == b->share;
}

/* Checks a geometry; where names the context for the message. uneven: a
 * query may have ranks_per_host as the most ranks on one host (every other
 * host at least one: rph + hosts - 1 <= p <= rph * hosts); records are
 * even (p = rph * hosts). */
static xmesh_result_t check_geom(const xm_coll_geom_t *g, const char *where, int uneven)
{
    const char *bad = g->group_size < 1       ? "p"
                      : g->ranks_per_host < 1 ? "ranks_per_host"
                      : g->hosts < 1          ? "hosts"
                      : g->share < 1          ? "share"
                                              : NULL;
    if (bad)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                      "%s: field %s must be >= 1 (p %d, ranks_per_host "
                      "%d, hosts %d, share %d)",
                      where, bad, g->group_size, g->ranks_per_host, g->hosts, g->share);
    int64_t most = (int64_t)g->ranks_per_host * g->hosts,
            least = (int64_t)g->ranks_per_host + g->hosts - 1;
    if (!uneven && most != g->group_size)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s: p %d != ranks_per_host %d * hosts %d", where,
                      g->group_size, g->ranks_per_host, g->hosts);
    if (uneven && (g->group_size > most || g->group_size < least))
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                      "%s: p %d ranks cannot span %d hosts with at most %d on one (need "
                      "ranks_per_host + hosts - 1 <= p <= ranks_per_host * hosts)",
                      where, g->group_size, g->hosts, g->ranks_per_host);
    return XMESH_SUCCESS;
}

static xmesh_result_t check_coll(const xm_coll_rec_t *r, const char *where)
{
    if (!xm_coll_name(r->kind))
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s: field kind: %d is not a collective", where,
                      (int)r->kind);
    xmesh_result_t e = check_geom(&r->g, where, 0);
    if (e)
        return e;
    if (r->g.group_size < 2)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s: field p: %d, a fit needs p >= 2", where,
                      r->g.group_size);
    const xm_fit_t *f = &r->fit;
    if (!isfinite(f->alpha) || !isfinite(f->beta))
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s: field %s: %g is not finite", where,
                      !isfinite(f->alpha) ? "alpha_us" : "beta_ns_per_byte",
                      !isfinite(f->alpha) ? f->alpha : f->beta);
    if (!isfinite(f->r2) || f->r2 > 1 + 1e-9)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s: field r2: %g, need a finite value <= 1",
                      where, f->r2);
    if (!isfinite(f->worst_rel) || f->worst_rel < 0)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s: field worst_rel: %g, need finite >= 0",
                      where, f->worst_rel);
    if (f->n < 2)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s: field points: %d, a fit needs >= 2", where,
                      f->n);
    if (!(r->min_bytes > 0) || !isfinite(r->max_bytes) || !(r->max_bytes >= r->min_bytes))
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                      "%s: fields min_bytes %g, max_bytes %g: need 0 < min_bytes <= max_bytes",
                      where, r->min_bytes, r->max_bytes);
    return XMESH_SUCCESS;
}

static xmesh_result_t check_gemm(const xm_gemm_rec_t *r, const char *where)
{
    const char *bad = r->m < 1 ? "m" : r->n < 1 ? "n" : r->k < 1 ? "k" : NULL;
    if (bad)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                      "%s: field %s must be >= 1 (m %lld n %lld k %lld)", where, bad,
                      (long long)r->m, (long long)r->n, (long long)r->k);
    if (r->busy < 1)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s: field busy: %d, need >= 1", where, r->busy);
    if (!(r->seconds > 0) || !isfinite(r->seconds))
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s: field seconds: %g, need finite > 0", where,
                      r->seconds);
    size_t n = strnlen(r->label, XM_GEMM_LABEL);
    if (n == 0 || n >= XM_GEMM_LABEL)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s: field label: need 1 .. %d characters", where,
                      XM_GEMM_LABEL - 1);
    for (size_t i = 0; i < n; i++)
        if (r->label[i] <= ' ' || r->label[i] == '#' || r->label[i] > '~')
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                          "%s: field label '%s': no spaces, '#' or control characters", where,
                          r->label);
    return XMESH_SUCCESS;
}

xmesh_result_t xm_costmodel_add_coll(xm_costmodel_t *m, const xm_coll_rec_t *r)
{
    if (!m || !r)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xm_costmodel_add_coll: %s is NULL",
                      !m ? "model" : "record");
    char where[64];
    record_where(where, sizeof where, r->line, "collective record");
    xmesh_result_t e = check_coll(r, where);
    if (e)
        return e;
    for (int i = 0; i < m->ncoll; i++)
        if (m->coll[i].kind == r->kind && geom_eq(&m->coll[i].g, &r->g))
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                          "%s: %s p %d ranks_per_host %d hosts %d share %d repeats line %d", where,
                          coll_names[r->kind], r->g.group_size, r->g.ranks_per_host, r->g.hosts,
                          r->g.share, m->coll[i].line);
    xm_coll_rec_t *c = realloc(m->coll, sizeof *c * (size_t)(m->ncoll + 1));
    if (!c)
        return XM_ERR(XMESH_ERR_NO_MEMORY, "xm_costmodel_add_coll: out of memory");
    m->coll = c;
    m->coll[m->ncoll++] = *r;
    return XMESH_SUCCESS;
}

xmesh_result_t xm_costmodel_set_points(xm_costmodel_t *m, xm_coll_t kind, const xm_coll_geom_t *g,
                                       int n, const double *bytes, const double *seconds)
{
    if (!m || !g || !bytes || !seconds)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xm_costmodel_set_points: an argument is NULL");
    if (!xm_coll_name(kind))
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "points: kind %d out of range", (int)kind);
    if (n < 2 || n > XM_COLL_MAX_POINTS)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "points: %d pairs, expected 2 .. %d", n,
                      XM_COLL_MAX_POINTS);
    for (int i = 0; i < n; i++) {
        if (!(bytes[i] > 0) || !isfinite(bytes[i]) || (i > 0 && !(bytes[i] > bytes[i - 1])))
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                          "points: pair %d: %g bytes (need > 0 and increasing)", i + 1, bytes[i]);
        if (!(seconds[i] > 0) || !isfinite(seconds[i]))
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                          "points: pair %d: %g seconds (need a finite time > 0)", i + 1,
                          seconds[i]);
    }
    for (int i = 0; i < m->ncoll; i++) {
        xm_coll_rec_t *c = &m->coll[i];
        if (c->kind == kind && geom_eq(&c->g, g)) {
            if (c->npts)
                return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                              "points: %s p %d ranks_per_host %d "
                              "hosts %d share %d has points already",
                              coll_names[kind], g->group_size, g->ranks_per_host, g->hosts,
                              g->share);
            c->npts = n;
            memcpy(c->px, bytes, sizeof(double) * (size_t)n);
            memcpy(c->py, seconds, sizeof(double) * (size_t)n);
            return XMESH_SUCCESS;
        }
    }
    return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                  "points: no %s fit for p %d ranks_per_host %d hosts %d share %d before it",
                  coll_names[kind], g->group_size, g->ranks_per_host, g->hosts, g->share);
}

/* The measured points of c at n bytes (c->npts >= 2). */
static double interp_points(const xm_coll_rec_t *c, double n)
{
    int k = c->npts;
    if (n <= c->px[0])
        return c->py[0];
    for (int i = 1; i < k; i++)
        if (n <= c->px[i])
            return c->py[i - 1] +
                   (c->py[i] - c->py[i - 1]) * (n - c->px[i - 1]) / (c->px[i] - c->px[i - 1]);
    double slope = (c->py[k - 1] - c->py[k - 2]) / (c->px[k - 1] - c->px[k - 2]);
    return c->py[k - 1] + (slope > 0 ? slope : 0) * (n - c->px[k - 1]);
}

xmesh_result_t xm_costmodel_add_gemm(xm_costmodel_t *m, const xm_gemm_rec_t *r)
{
    if (!m || !r)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xm_costmodel_add_gemm: %s is NULL",
                      !m ? "model" : "record");
    char where[64];
    record_where(where, sizeof where, r->line, "sgemm record");
    xmesh_result_t e = check_gemm(r, where);
    if (e)
        return e;
    for (int i = 0; i < m->ngemm; i++)
        if (m->gemm[i].m == r->m && m->gemm[i].n == r->n && m->gemm[i].k == r->k &&
            m->gemm[i].busy == r->busy)
            return XM_ERR(
                XMESH_ERR_INVALID_ARGUMENT, "%s: sgemm %lld %lld %lld busy %d repeats line %d",
                where, (long long)r->m, (long long)r->n, (long long)r->k, r->busy, m->gemm[i].line);
    xm_gemm_rec_t *g = realloc(m->gemm, sizeof *g * (size_t)(m->ngemm + 1));
    if (!g)
        return XM_ERR(XMESH_ERR_NO_MEMORY, "xm_costmodel_add_gemm: out of memory");
    m->gemm = g;
    m->gemm[m->ngemm++] = *r;
    return XMESH_SUCCESS;
}

/* ------------------------------------------------------------ file */

int xm_costmodel_section_known(const char *section)
{
    return section && (!strcmp(section, "collectives") || !strcmp(section, "compute"));
}

#define MAX_FIELDS 16

/* Splits s at blanks into at most MAX_FIELDS fields; returns the count or
 * MAX_FIELDS + 1 when there are more. */
static int split(char *s, char **f)
{
    int n = 0;
    for (char *save = NULL, *t = strtok_r(s, " \t", &save); t; t = strtok_r(NULL, " \t", &save)) {
        if (n == MAX_FIELDS)
            return MAX_FIELDS + 1;
        f[n++] = t;
    }
    return n;
}

static xmesh_result_t num(int line, const char *rec, const char *field, const char *s, double *v)
{
    char *end;
    errno = 0;
    double d = strtod(s, &end);
    if (end == s || *end || errno || !isfinite(d))
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                      "cluster file line %d: %s field %s: '%s' is not a finite number", line, rec,
                      field, s);
    *v = d;
    return XMESH_SUCCESS;
}

static xmesh_result_t whole(int line, const char *rec, const char *field, const char *s,
                            int64_t max, int64_t *v)
{
    double d;
    xmesh_result_t r = num(line, rec, field, s, &d);
    if (r)
        return r;
    if (d != floor(d) || d < 0 || d > (double)max)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                      "cluster file line %d: %s field %s: '%s' is not a whole number in [0, %lld]",
                      line, rec, field, s, (long long)max);
    *v = (int64_t)d;
    return XMESH_SUCCESS;
}

static const char *const coll_fields[] = {"kind",      "p",        "ranks_per_host",   "hosts",
                                          "share",     "alpha_us", "beta_ns_per_byte", "r2",
                                          "worst_rel", "points",   "min_bytes",        "max_bytes"};
#define COLL_NF 12
static const char *const gemm_fields[] = {"sgemm", "m", "n", "k", "busy", "seconds", "label"};
#define GEMM_NF 7
static const char *const gfit_fields[] = {"sgemm_fit", "alpha_us",  "beta_ps_per_flop",
                                          "r2",        "worst_rel", "points"};
#define GFIT_NF 6

static xmesh_result_t want(int line, const char *rec, int got, int n, const char *const *names)
{
    if (got == n)
        return XMESH_SUCCESS;
    char list[256] = "";
    for (int i = 0; i < n; i++) {
        strncat(list, names[i], sizeof list - strlen(list) - 2);
        if (i + 1 < n)
            strncat(list, " ", sizeof list - strlen(list) - 1);
    }
    return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                  "cluster file line %d: %s record has %s%d fields, expected %d: %s", line, rec,
                  got > MAX_FIELDS ? "more than " : "", got > MAX_FIELDS ? MAX_FIELDS : got, n,
                  list);
}

static xmesh_result_t parse_points(xm_costmodel_t *m, int line, char **f, int nf)
{
    if (nf < 8 || nf > 6 + XM_COLL_MAX_POINTS)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                      "cluster file line %d: points record has %s%d fields, expected 8 .. %d: "
                      "points kind p ranks_per_host hosts share n:seconds ...",
                      line, nf > MAX_FIELDS ? "more than " : "", nf > MAX_FIELDS ? MAX_FIELDS : nf,
                      6 + XM_COLL_MAX_POINTS);
    int kind = xm_coll_from_name(f[1]);
    if (kind < 0)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                      "cluster file line %d: points field kind: unknown collective '%s'", line,
                      f[1]);
    int64_t iv[4];
    xmesh_result_t r;
    for (int i = 0; i < 4; i++)
        if ((r = whole(line, "points", coll_fields[1 + i], f[2 + i], 1 << 30, &iv[i])))
            return r;
    xm_coll_geom_t g = {(int)iv[0], (int)iv[1], (int)iv[2], (int)iv[3]};
    double x[XM_COLL_MAX_POINTS], y[XM_COLL_MAX_POINTS];
    int n = nf - 6;
    for (int i = 0; i < n; i++) {
        char *colon = strchr(f[6 + i], ':'), *e1, *e2;
        if (colon) {
            x[i] = strtod(f[6 + i], &e1);
            y[i] = strtod(colon + 1, &e2);
        }
        if (!colon || e1 != colon || *e2 || colon == f[6 + i] || !colon[1])
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                          "cluster file line %d: points pair %d: '%s' is not bytes:seconds", line,
                          i + 1, f[6 + i]);
    }
    xm_costmodel_t tmp;
    memset(&tmp, 0, sizeof tmp);
    xm_coll_rec_t one;
    memset(&one, 0, sizeof one);
    one.kind = (xm_coll_t)kind;
    one.g = g;
    if (!m) { /* checked alone: against a stand-in fit of that geometry */
        tmp.coll = &one;
        tmp.ncoll = 1;
    }
    r = xm_costmodel_set_points(m ? m : &tmp, (xm_coll_t)kind, &g, n, x, y);
    if (r) {
        char why[256];
        snprintf(why, sizeof why, "%s", xmesh_last_error());
        return XM_ERR(r, "cluster file line %d: %s", line, why);
    }
    return XMESH_SUCCESS;
}

static xmesh_result_t parse_coll(xm_costmodel_t *m, int line, char **f, int nf)
{
    if (!strcmp(f[0], "points"))
        return parse_points(m, line, f, nf);
    int kind = xm_coll_from_name(f[0]);
    if (kind < 0)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                      "cluster file line %d: [collectives] field kind: unknown collective '%s' "
                      "(expected allreduce, allgather, reduce_scatter or alltoall)",
                      line, f[0]);
    xmesh_result_t r = want(line, f[0], nf, COLL_NF, coll_fields);
    if (r)
        return r;
    xm_coll_rec_t c;
    memset(&c, 0, sizeof c);
    c.kind = (xm_coll_t)kind;
    c.line = line;
    int64_t iv[4], pts;
    for (int i = 0; i < 4; i++)
        if ((r = whole(line, f[0], coll_fields[1 + i], f[1 + i], 1 << 30, &iv[i])))
            return r;
    c.g.group_size = (int)iv[0];
    c.g.ranks_per_host = (int)iv[1];
    c.g.hosts = (int)iv[2];
    c.g.share = (int)iv[3];
    double a, b;
    if ((r = num(line, f[0], coll_fields[5], f[5], &a)) ||
        (r = num(line, f[0], coll_fields[6], f[6], &b)) ||
        (r = num(line, f[0], coll_fields[7], f[7], &c.fit.r2)) ||
        (r = num(line, f[0], coll_fields[8], f[8], &c.fit.worst_rel)) ||
        (r = whole(line, f[0], coll_fields[9], f[9], 1 << 30, &pts)) ||
        (r = num(line, f[0], coll_fields[10], f[10], &c.min_bytes)) ||
        (r = num(line, f[0], coll_fields[11], f[11], &c.max_bytes)))
        return r;
    c.fit.alpha = a * 1e-6;
    c.fit.beta = b * 1e-9;
    c.fit.n = (int)pts;
    if (!m) {
        char where[64];
        snprintf(where, sizeof where, "cluster file line %d", line);
        return check_coll(&c, where);
    }
    return xm_costmodel_add_coll(m, &c);
}

static xmesh_result_t parse_compute(xm_costmodel_t *m, int line, char **f, int nf)
{
    xmesh_result_t r;
    if (!strcmp(f[0], "sgemm")) {
        if ((r = want(line, f[0], nf, GEMM_NF, gemm_fields)))
            return r;
        xm_gemm_rec_t g;
        memset(&g, 0, sizeof g);
        g.line = line;
        int64_t busy;
        const int64_t big = (int64_t)1 << 40;
        if ((r = whole(line, f[0], "m", f[1], big, &g.m)) ||
            (r = whole(line, f[0], "n", f[2], big, &g.n)) ||
            (r = whole(line, f[0], "k", f[3], big, &g.k)) ||
            (r = whole(line, f[0], "busy", f[4], 1 << 20, &busy)) ||
            (r = num(line, f[0], "seconds", f[5], &g.seconds)))
            return r;
        g.busy = (int)busy;
        if (strlen(f[6]) >= XM_GEMM_LABEL)
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                          "cluster file line %d: sgemm field label: '%s' is longer than %d "
                          "characters",
                          line, f[6], XM_GEMM_LABEL - 1);
        strcpy(g.label, f[6]);
        if (!m) {
            char where[64];
            snprintf(where, sizeof where, "cluster file line %d", line);
            return check_gemm(&g, where);
        }
        return xm_costmodel_add_gemm(m, &g);
    }
    if (!strcmp(f[0], "sgemm_fit")) {
        if ((r = want(line, f[0], nf, GFIT_NF, gfit_fields)))
            return r;
        xm_fit_t fit;
        double a, b;
        int64_t pts;
        if ((r = num(line, f[0], gfit_fields[1], f[1], &a)) ||
            (r = num(line, f[0], gfit_fields[2], f[2], &b)) ||
            (r = num(line, f[0], gfit_fields[3], f[3], &fit.r2)) ||
            (r = num(line, f[0], gfit_fields[4], f[4], &fit.worst_rel)) ||
            (r = whole(line, f[0], gfit_fields[5], f[5], 1 << 30, &pts)))
            return r;
        if (fit.r2 > 1 + 1e-9 || fit.worst_rel < 0 || pts < 2)
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                          "cluster file line %d: sgemm_fit field %s out of range", line,
                          fit.r2 > 1 + 1e-9   ? "r2 (> 1)"
                          : fit.worst_rel < 0 ? "worst_rel (< 0)"
                                              : "points (< 2)");
        fit.alpha = a * 1e-6;
        fit.beta = b * 1e-12;
        fit.n = (int)pts;
        if (m && m->has_gemm_fit)
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                          "cluster file line %d: a second sgemm_fit record", line);
        if (m) {
            m->gemm_fit = fit;
            m->has_gemm_fit = 1;
        }
        return XMESH_SUCCESS;
    }
    if (!strcmp(f[0], "eltwise")) {
        static const char *const ef[] = {"eltwise", "kind", "busy", "fwd_ns_per_unit",
                                         "bwd_ns_per_unit"};
        if ((r = want(line, f[0], nf, 5, ef)))
            return r;
        int kind = -1;
        for (int k = 0; k < XM_ELT_NKINDS; k++)
            if (!strcmp(f[1], elt_names[k]))
                kind = k;
        if (kind < 0)
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                          "cluster file line %d: eltwise field kind: unknown kind '%s' (expected "
                          "gelu, layernorm, attention, xent, residual or adamw)",
                          line, f[1]);
        xm_elt_rec_t e;
        memset(&e, 0, sizeof e);
        e.line = line;
        int64_t busy;
        double a, b;
        if ((r = whole(line, f[0], "busy", f[2], 1 << 20, &busy)) ||
            (r = num(line, f[0], ef[3], f[3], &a)) || (r = num(line, f[0], ef[4], f[4], &b)))
            return r;
        e.busy = (int)busy;
        e.fwd = a * 1e-9;
        e.bwd = b * 1e-9;
        xm_costmodel_t tmp;
        memset(&tmp, 0, sizeof tmp);
        return xm_costmodel_set_elt(m ? m : &tmp, (xm_elt_t)kind, &e);
    }
    if (is_step_name(f[0])) {
        xm_steprec_t g;
        memset(&g, 0, sizeof g);
        snprintf(g.name, sizeof g.name, "%s", f[0]);
        g.line = line;
        g.nvalues = nf - 1;
        if (nf < 2 || nf - 1 > XM_STEP_MAX_VALUES)
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                          "cluster file line %d: %s record has %s%d fields, expected 2 to %d", line,
                          f[0], nf > MAX_FIELDS ? "more than " : "",
                          nf > MAX_FIELDS ? MAX_FIELDS : nf, XM_STEP_MAX_VALUES + 1);
        for (int i = 1; i < nf; i++) {
            char field[16];
            snprintf(field, sizeof field, "%d", i);
            if ((r = num(line, f[0], field, f[i], &g.values[i - 1])))
                return r;
        }
        xm_costmodel_t tmp;
        memset(&tmp, 0, sizeof tmp);
        return xm_costmodel_set_step(m ? m : &tmp, &g);
    }
    if (!strcmp(f[0], "cpuset")) {
        /* a fifth field, sync seconds, since 2026-11-28 (files before it have 4) */
        static const char *const cf[] = {"cpuset", "cpus", "ranks", "wait", "[sync]"};
        if (nf != 4 && nf != 5)
            return want(line, f[0], nf, 5, cf);
        double wait, sync = 0;
        if ((r = num(line, f[0], "wait", f[3], &wait)))
            return r;
        if (nf == 5 && (r = num(line, f[0], "sync", f[4], &sync)))
            return r;
        if (!(sync >= 0) || !isfinite(sync))
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                          "cluster file line %d: cpuset field sync: %g (expected >= 0 s)", line,
                          sync);
        if (!(wait >= 0 && wait <= 1))
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                          "cluster file line %d: cpuset field wait: %g (expected 0 .. 1)", line,
                          wait);
        int64_t cpus;
        if ((r = whole(line, f[0], "cpus", f[1], 1 << 20, &cpus)))
            return r;
        if (cpus < 1)
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                          "cluster file line %d: cpuset field cpus: 0 (expected >= 1)", line);
        int *rk = NULL, n = 0, cap = 0;
        for (char *save = NULL, *t = strtok_r(f[2], ",", &save); t;
             t = strtok_r(NULL, ",", &save)) {
            char *dash = strchr(t, '-');
            int64_t a = 0, b = 0;
            if (dash)
                *dash = '\0';
            if ((r = whole(line, f[0], "ranks", t, (1 << 24) - 1, &a)) ||
                (r = whole(line, f[0], "ranks", dash ? dash + 1 : t, (1 << 24) - 1, &b))) {
                free(rk);
                return r;
            }
            if (b < a || b - a > (1 << 20) - n) {
                free(rk);
                return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                              "cluster file line %d: cpuset field ranks: range %lld-%lld", line,
                              (long long)a, (long long)b);
            }
            for (int64_t v = a; v <= b; v++) {
                if (n == cap) {
                    cap = cap ? 2 * cap : 16;
                    int *t2 = realloc(rk, (size_t)cap * sizeof *rk);
                    if (!t2) {
                        free(rk);
                        return XM_ERR(XMESH_ERR_NO_MEMORY, "cluster file: out of memory");
                    }
                    rk = t2;
                }
                rk[n++] = (int)v;
            }
        }
        if (n == 0) {
            free(rk);
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                          "cluster file line %d: cpuset field ranks: empty", line);
        }
        xm_costmodel_t tmp;
        memset(&tmp, 0, sizeof tmp);
        xm_costmodel_t *into = m ? m : &tmp;
        r = xm_costmodel_add_cpuset(into, (int)cpus, rk, n, wait);
        free(rk);
        if (r) {
            char why[256];
            snprintf(why, sizeof why, "%s", xmesh_last_error());
            free(tmp.cpusets);
            free(tmp.cpu_set_of);
            return XM_ERR(r, "cluster file line %d: %s", line, why);
        }
        if (m) {
            m->cpusets[m->ncpusets - 1].line = line;
            m->cpusets[m->ncpusets - 1].sync = sync;
        }
        free(tmp.cpusets);
        free(tmp.cpu_set_of);
        return XMESH_SUCCESS;
    }
    return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                  "cluster file line %d: [compute] unknown record '%s' (expected sgemm, "
                  "sgemm_fit, eltwise, cpuset or a NAMEstep record)",
                  line, f[0]);
}

xmesh_result_t xm_costmodel_parse_line(xm_costmodel_t *m, const char *section, int line, char *text)
{
    char *f[MAX_FIELDS];
    int nf = split(text, f);
    if (nf == 0)
        return XMESH_SUCCESS;
    if (!strcmp(section, "collectives"))
        return parse_coll(m, line, f, nf);
    if (!strcmp(section, "compute"))
        return parse_compute(m, line, f, nf);
    return XM_ERR(XMESH_ERR_INTERNAL, "cluster file line %d: section [%s] is not a cost section",
                  line, section);
}

xmesh_result_t xm_costmodel_nominal(const xm_cluster_t *c, double flops_per_s, xm_costmodel_t **out)
{
    if (!c || !out)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xm_costmodel_nominal: %s is NULL",
                      !c ? "cluster" : "out");
    double nic = c->nic_send_Bps < c->nic_recv_Bps ? c->nic_send_Bps : c->nic_recv_Bps;
    if (!(nic > 0) || !isfinite(nic) || !(c->intra_Bps > 0) || !isfinite(c->intra_Bps) ||
        !(c->latency_s >= 0) || !isfinite(c->latency_s))
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                      "xm_costmodel_nominal: cluster rates must be > 0 and latency >= 0 (NIC %g "
                      "B/s, intra %g B/s, latency %g s)",
                      nic, c->intra_Bps, c->latency_s);
    if (!(flops_per_s >= 0) || !isfinite(flops_per_s))
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                      "xm_costmodel_nominal: flops_per_s %g, need a finite value >= 0",
                      flops_per_s);
    xm_costmodel_t *m = xm_costmodel_create();
    if (!m)
        return XM_ERR(XMESH_ERR_NO_MEMORY, "xm_costmodel_nominal: out of memory");
    xmesh_result_t r = XMESH_SUCCESS;
    for (int k = 0; k < XM_COLL_NKINDS && !r; k++)
        for (int cross = 0; cross < 2 && !r; cross++) {
            xm_coll_rec_t rec;
            memset(&rec, 0, sizeof rec);
            rec.kind = (xm_coll_t)k;
            rec.g = cross ? (xm_coll_geom_t){2, 1, 2, 1} : (xm_coll_geom_t){2, 2, 1, 1};
            rec.fit.alpha = c->latency_s * xm_coll_steps(rec.kind, 2);
            rec.fit.beta = 1 / (cross ? nic : c->intra_Bps);
            rec.fit.r2 = 1;
            rec.fit.n = 2;
            rec.min_bytes = 1;
            rec.max_bytes = 1e18;
            r = xm_costmodel_add_coll(m, &rec);
        }
    if (!r && flops_per_s > 0) {
        xm_gemm_rec_t g;
        memset(&g, 0, sizeof g);
        g.m = g.n = g.k = 1;
        g.busy = 1;
        g.seconds = 2 / flops_per_s;
        snprintf(g.label, sizeof g.label, "nominal");
        r = xm_costmodel_add_gemm(m, &g);
    }
    if (r) {
        xm_costmodel_destroy(m);
        return r;
    }
    m->nominal = 1;
    *out = m;
    return XMESH_SUCCESS;
}

xmesh_result_t xm_costmodel_write(const xm_costmodel_t *m, FILE *f)
{
    if (!m || !f)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xm_costmodel_write: %s is NULL",
                      !m ? "model" : "file");
    if (m->nominal)
        return XM_ERR(XMESH_ERR_INVALID_USAGE,
                      "xm_costmodel_write: a nominal (uncalibrated) model is not written as a "
                      "calibration");
    if (m->ncoll) {
        fprintf(f, "\n[collectives]\n"
                   "# time = alpha + beta * f(n, p); f: allreduce 2(p-1)/p n, allgather, "
                   "reduce_scatter, alltoall (p-1)/p n\n"
                   "# n: allreduce/reduce_scatter the vector per rank, allgather the gathered "
                   "result, alltoall all a rank sends\n"
                   "# kind p ranks_per_host hosts share alpha_us beta_ns_per_byte r2 worst_rel "
                   "points min_bytes max_bytes\n");
        for (int i = 0; i < m->ncoll; i++) {
            const xm_coll_rec_t *c = &m->coll[i];
            fprintf(f, "%s %d %d %d %d %.10g %.10g %.10g %.10g %d %.17g %.17g\n",
                    coll_names[c->kind], c->g.group_size, c->g.ranks_per_host, c->g.hosts,
                    c->g.share, c->fit.alpha * 1e6, c->fit.beta * 1e9, c->fit.r2, c->fit.worst_rel,
                    c->fit.n, c->min_bytes, c->max_bytes);
            if (c->npts >= 2) {
                fprintf(f, "points %s %d %d %d %d", coll_names[c->kind], c->g.group_size,
                        c->g.ranks_per_host, c->g.hosts, c->g.share);
                for (int k = 0; k < c->npts; k++)
                    fprintf(f, " %.17g:%.10g", c->px[k], c->py[k]);
                fprintf(f, "\n");
            }
        }
    }
    int nelt = 0;
    for (int k = 0; k < XM_ELT_NKINDS; k++)
        nelt += m->elt[k].busy > 0;
    if (m->ngemm || m->has_gemm_fit || nelt || m->nsteps || m->ncpusets) {
        fprintf(f, "\n[compute]\n"
                   "# sgemm m n k busy seconds label: C(m x n) = A(m x k) . B(k x n), busy "
                   "ranks per host at once\n");
        for (int i = 0; i < m->ngemm; i++) {
            const xm_gemm_rec_t *g = &m->gemm[i];
            fprintf(f, "sgemm %lld %lld %lld %d %.10g %s\n", (long long)g->m, (long long)g->n,
                    (long long)g->k, g->busy, g->seconds, g->label);
        }
        if (m->has_gemm_fit) {
            const xm_fit_t *g = &m->gemm_fit;
            fprintf(f,
                    "# time = alpha + beta * 2mnk over every shape above\n"
                    "# sgemm_fit alpha_us beta_ps_per_flop r2 worst_rel points\n"
                    "sgemm_fit %.10g %.10g %.10g %.10g %d\n",
                    g->alpha * 1e6, g->beta * 1e12, g->r2, g->worst_rel, g->n);
        }
        if (nelt)
            fprintf(f, "# eltwise kind busy fwd_ns_per_unit bwd_ns_per_unit: the trainer's "
                       "element-wise kernels (xm_costmodel.h: units)\n");
        for (int k = 0; k < XM_ELT_NKINDS; k++)
            if (m->elt[k].busy > 0)
                fprintf(f, "eltwise %s %d %.10g %.10g\n", elt_names[k], m->elt[k].busy,
                        m->elt[k].fwd * 1e9, m->elt[k].bwd * 1e9);
        for (int k = 0; k < m->nsteps; k++) {
            const xm_steprec_t *g = &m->steps[k];
            if (g->comment[0])
                fprintf(f, "# %s\n", g->comment);
            fprintf(f, "%s", g->name);
            for (int i = 0; i < g->nvalues; i++)
                fprintf(f, " %.10g", g->values[i]);
            fprintf(f, "\n");
        }
        if (m->ncpusets)
            fprintf(f, "# cpuset cpus ranks wait sync: ranks whose affinity masks overlap share "
                       "that many cpus (compute above: every rank busy); a waiting rank takes "
                       "`wait` of a computing rank's cpu; a collective of two of them takes "
                       "`sync` s more while others compute\n");
        for (int c = 0; c < m->ncpusets; c++) {
            fprintf(f, "cpuset %d ", m->cpusets[c].cpus);
            int first = 1;
            for (int r = 0; r < m->cpu_nranks; r++) {
                if (m->cpu_set_of[r] != c)
                    continue;
                int e = r;
                while (e + 1 < m->cpu_nranks && m->cpu_set_of[e + 1] == c)
                    e++;
                if (e > r)
                    fprintf(f, "%s%d-%d", first ? "" : ",", r, e);
                else
                    fprintf(f, "%s%d", first ? "" : ",", r);
                first = 0;
                r = e;
            }
            fprintf(f, " %.4g %.4g\n", m->cpusets[c].wait, m->cpusets[c].sync);
        }
    }
    if (ferror(f))
        return XM_ERR(XMESH_ERR_SYSTEM, "xm_costmodel_write: write error");
    return XMESH_SUCCESS;
}

/* ------------------------------------------------------------ predictions */

static double l2(double a, double b)
{
    return fabs(log2(a) - log2(b));
}

xmesh_result_t xm_cost_collective(const xm_costmodel_t *m, xm_coll_t kind, const xm_coll_geom_t *g,
                                  double bytes, xm_cost_pred_t *out)
{
    if (!m || !g || !out)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xm_cost_collective: %s is NULL",
                      !m   ? "model"
                      : !g ? "geometry"
                           : "out");
    if (!xm_coll_name(kind))
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xm_cost_collective: kind %d out of range",
                      (int)kind);
    xmesh_result_t e = check_geom(g, "xm_cost_collective", 1);
    if (e)
        return e;
    if (!(bytes >= 0) || !isfinite(bytes))
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xm_cost_collective: %g bytes", bytes);
    xm_cost_pred_t p;
    memset(&p, 0, sizeof p);
    if (g->group_size == 1) {
        p.exact = 1;
        snprintf(p.basis, sizeof p.basis, "group of one rank: no communication");
        *out = p;
        return XMESH_SUCCESS;
    }
    int cross = g->hosts > 1, best = -1, seen = 0;
    double bestr = INFINITY, bestd = INFINITY;
    for (int i = 0; i < m->ncoll; i++) {
        const xm_coll_rec_t *c = &m->coll[i];
        if (c->kind != kind || (c->g.hosts > 1) != cross)
            continue;
        seen++;
        if (!(c->fit.beta > 0))
            continue;
        /* ranks_per_host first (nothing scales it), then p and share (the
         * steps and the NIC sharing scale those) */
        double dr = l2(c->g.ranks_per_host, g->ranks_per_host),
               d = l2(c->g.group_size, g->group_size) + l2(c->g.share, g->share);
        if (dr < bestr || (dr == bestr && d < bestd))
            bestr = dr, bestd = d, best = i;
    }
    if (best < 0)
        return XM_ERR(XMESH_ERR_UNSUPPORTED,
                      "not calibrated: the cluster file has %s %s fit for groups %s (run "
                      "xmesh-calibrate on this cluster and pass its file)",
                      seen ? "no usable (beta > 0)" : "no", coll_names[kind],
                      cross ? "spanning several hosts" : "inside one host");
    const xm_coll_rec_t *c = &m->coll[best];
    double alpha = c->fit.alpha > 0 ? c->fit.alpha : 0, beta = c->fit.beta;
    int same = geom_eq(&c->g, g);
    if (!same) {
        alpha *= (double)xm_coll_steps(kind, g->group_size) / xm_coll_steps(kind, c->g.group_size);
        if (cross)
            beta *= (double)g->share / c->g.share;
    }
    if (same && c->npts >= 2)
        p.seconds = interp_points(c, bytes);
    else
        p.seconds = alpha + beta * xm_coll_volume(kind, bytes, g->group_size);
    p.exact = same && bytes >= c->min_bytes && bytes <= c->max_bytes;
    if (m->nominal)
        p.exact = 0;
    snprintf(p.basis, sizeof p.basis, "%s%s %s p %d ranks_per_host %d hosts %d share %d%s%s%s",
             m->nominal ? "nominal (uncalibrated) " : "", coll_names[kind],
             same && c->npts >= 2 ? "measured points" : "fit", c->g.group_size, c->g.ranks_per_host,
             c->g.hosts, c->g.share,
             same    ? ""
             : cross ? " (nearest; alpha scaled by steps, beta by share)"
                     : " (nearest; alpha scaled by steps)",
             bytes < c->min_bytes || bytes > c->max_bytes ? ", bytes outside the measured range"
                                                          : "",
             c->fit.alpha < 0 ? ", negative alpha taken as 0" : "");
    *out = p;
    return XMESH_SUCCESS;
}

xmesh_result_t xm_cost_gemm(const xm_costmodel_t *m, int64_t M, int64_t N, int64_t K,
                            xm_cost_pred_t *out)
{
    if (!m || !out)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xm_cost_gemm: %s is NULL", !m ? "model" : "out");
    if (M < 0 || N < 0 || K < 0)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                      "xm_cost_gemm: negative dimension (m %lld n %lld "
                      "k %lld)",
                      (long long)M, (long long)N, (long long)K);
    xm_cost_pred_t p;
    memset(&p, 0, sizeof p);
    if (M == 0 || N == 0 || K == 0) {
        p.exact = 1;
        snprintf(p.basis, sizeof p.basis, "empty product");
        *out = p;
        return XMESH_SUCCESS;
    }
    if (m->ngemm == 0)
        return XM_ERR(XMESH_ERR_UNSUPPORTED,
                      "not calibrated: the cluster file has no [compute] sgemm shape (run "
                      "xmesh-calibrate on this cluster and pass its file)");
    int best = -1;
    double bestd = INFINITY;
    for (int i = 0; i < m->ngemm; i++) {
        const xm_gemm_rec_t *g = &m->gemm[i];
        double d =
            l2((double)g->m, (double)M) + l2((double)g->n, (double)N) + l2((double)g->k, (double)K);
        /* ties (the same shape at several busy counts): the busiest */
        if (d < bestd || (d == bestd && g->busy > m->gemm[best].busy))
            bestd = d, best = i;
    }
    const xm_gemm_rec_t *g = &m->gemm[best];
    double flops = 2.0 * (double)M * (double)N * (double)K;
    if (bestd == 0) {
        p.seconds = g->seconds;
        p.exact = !m->nominal;
    } else {
        double rate = 2.0 * (double)g->m * (double)g->n * (double)g->k / g->seconds;
        p.seconds = flops / rate;
    }
    snprintf(p.basis, sizeof p.basis, "%ssgemm %lld x %lld x %lld (%s, %d busy)%s",
             m->nominal ? "nominal (uncalibrated) " : "", (long long)g->m, (long long)g->n,
             (long long)g->k, g->label, g->busy,
             bestd == 0 ? "" : " at its flop rate (nearest shape)");
    *out = p;
    return XMESH_SUCCESS;
}
