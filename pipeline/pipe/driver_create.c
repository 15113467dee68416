/*
 * Pipeline driver: the configuration's check, the transfer plans (bundles of edges that
 * share a boundary and a slot), xmp_driver_create and xmp_driver_destroy. Contract in
 * driver.h.
 */
#define _POSIX_C_SOURCE 200809L
#include "pipe/driver.h"
#include "pipe/driver_priv.h"
#include "util/xmp_err.h"
#include "nn/coll.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------- creation */

static xmesh_result_t fail(char *err, size_t errlen, xmesh_result_t r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    xmp_verr_buf(err, errlen, fmt, ap);
    va_end(ap);
    return r;
}

static char *dupstr(const char *s)
{
    if (s == NULL)
        return NULL;
    size_t n = strlen(s) + 1;
    char *r = malloc(n);
    if (r)
        memcpy(r, s, n);
    return r;
}

static int is_float_conv(xmesh_dtype_t t)
{
    return t == XMESH_F32 || t == XMESH_F16 || t == XMESH_BF16;
}

/* The edge's dtype on the wire: its wire_dtype, else the driver's boundary_dtype, else its
 * dtype (XMESH_U8, the zero default, means unset). */
static xmesh_dtype_t edge_wire(const xmp_driver_cfg_t *c, const xmp_edge_cfg_t *ec)
{
    if (ec->wire_dtype != XMESH_U8)
        return ec->wire_dtype;
    if (c->boundary_dtype != XMESH_U8)
        return c->boundary_dtype;
    return ec->dtype;
}

static xmesh_result_t check_cfg(const xmp_driver_cfg_t *c, char *err, size_t errlen)
{
    const xmp_schedule_t *s = c->sched;
    if (s == NULL || c->meshes == NULL || (c->nedges > 0 && c->edges == NULL))
        return fail(err, errlen, XMESH_ERR_INVALID_ARGUMENT, "driver: NULL sched/meshes/edges");
    if (c->mode < 0 || c->mode >= XMP_COMM_COUNT_)
        return fail(err, errlen, XMESH_ERR_INVALID_ARGUMENT, "driver: comm mode %d unknown",
                    c->mode);
    if (c->nstages != s->nstages || c->nedges != s->nedges)
        return fail(err, errlen, XMESH_ERR_INVALID_ARGUMENT,
                    "driver: config has %d stages and %d edges, schedule '%s' %d and %d",
                    c->nstages, c->nedges, s->name, s->nstages, s->nedges);
    for (int e = 0; e < c->nedges; e++) {
        const xmp_edge_cfg_t *ec = &c->edges[e];
        if (ec->src != s->edges[e].src || ec->dst != s->edges[e].dst)
            return fail(err, errlen, XMESH_ERR_INVALID_ARGUMENT,
                        "driver: edge %d is %d>%d in the config but %d>%d in the schedule", e,
                        ec->src, ec->dst, s->edges[e].src, s->edges[e].dst);
        if (ec->src_spec == NULL || ec->dst_spec == NULL)
            return fail(err, errlen, XMESH_ERR_INVALID_ARGUMENT, "driver: edge %d has no spec", e);
        xmesh_dtype_t w = edge_wire(c, ec);
        if (w != ec->dtype && !(is_float_conv(w) && is_float_conv(ec->dtype)))
            return fail(err, errlen, XMESH_ERR_INVALID_ARGUMENT,
                        "driver: edge %d: wire dtype %s (%d) for dtype %s: the boundary dtype "
                        "must be f32, f16 or bf16 and the edge's dtype one of them too",
                        e, xmesh_dtype_name(w) ? xmesh_dtype_name(w) : "unknown", (int)w,
                        xmesh_dtype_name(ec->dtype) ? xmesh_dtype_name(ec->dtype) : "unknown");
    }
    /* stages of one group run on the same ranks (in any order and mesh shape) */
    for (int st = 0; st < c->nstages; st++) {
        const xmp_stage_mesh_t *m = &c->meshes[st];
        if (m->ndim < 1 || m->ndim > XMESH_MAX_MESH_DIMS || m->ranks == NULL)
            return fail(err, errlen, XMESH_ERR_INVALID_ARGUMENT, "driver: stage %d mesh ndim %d",
                        st, m->ndim);
    }
    for (int st = 0; st < c->nstages; st++) {
        int g = s->stage_group[st], first = s->group_stage[g][0];
        if (first == st)
            continue;
        const xmp_stage_mesh_t *a = &c->meshes[first], *b = &c->meshes[st];
        int na = 1, nb = 1;
        for (int k = 0; k < a->ndim; k++)
            na *= a->shape[k];
        for (int k = 0; k < b->ndim; k++)
            nb *= b->shape[k];
        int same = na == nb;
        for (int i = 0; same && i < nb; i++) {
            int found = 0;
            for (int j = 0; j < na && !found; j++)
                found = a->ranks[j] == b->ranks[i];
            same = found;
        }
        if (!same)
            return fail(err, errlen, XMESH_ERR_INVALID_ARGUMENT,
                        "driver: stages %d and %d share group %d but not their ranks (%d and %d "
                        "ranks, or different ones)",
                        first, st, g, na, nb);
    }
    if (c->stage_ops == NULL)
        for (int g = 0; g < s->ngroups; g++)
            if (s->nchunks[g] > 1)
                return fail(err, errlen, XMESH_ERR_INVALID_ARGUMENT,
                            "driver: schedule '%s' puts %d stages on group %d: set "
                            "cfg.stage_ops (one entry per model stage)",
                            s->name, s->nchunks[g], g);
    char m[1024];
    if (xmp_sched_validate(s, NULL, 0, m, sizeof(m)) != 0)
        return fail(err, errlen, XMESH_ERR_INVALID_ARGUMENT, "driver: schedule '%s': %s", s->name,
                    m);
    if (xmp_sched_dryrun(s, c->mode == XMP_COMM_BLOCKING, m, sizeof(m)) != 0)
        return fail(err, errlen, XMESH_ERR_INVALID_ARGUMENT, "driver: schedule '%s' (%s): %s",
                    s->name, xmp_comm_mode_name(c->mode), m);
    return XMESH_SUCCESS;
}

static size_t block_bytes(const xmesh_layout_t *l, int rank, int *holds, char *err, size_t errlen)
{
    int64_t shp[XMESH_MAX_TENSOR_DIMS];
    if (xmesh_layout_local_shape(l, rank, shp, holds) != XMESH_SUCCESS) {
        fail(err, errlen, XMESH_ERR_INVALID_ARGUMENT, "layout '%s': %s", l->sharding,
             xmesh_last_error());
        return (size_t)-1;
    }
    size_t n = xmesh_dtype_size(l->dtype);
    for (int i = 0; i < l->ndim; i++)
        n *= (size_t)shp[i];
    return n;
}

/* The slots of plan p's transfers in the schedule: for every microbatch, the number of compute
 * actions before its start on the sending stage's list (st) and before its wait on the
 * receiving stage's list (wt); -1 where the schedule has none. */
static void transfer_slots(const xmp_driver_t *d, int *st, int *wt)
{
    const xmp_schedule_t *s = d->cfg.sched;
    for (int i = 0; i < d->P * d->M; i++)
        st[i] = wt[i] = -1;
    for (int g = 0; g < s->ngroups; g++) {
        int slot = 0;
        for (int j = 0; j < s->len[g]; j++) {
            xmp_action_t a = s->acts[g][j];
            if (a.kind != XMP_ACT_START && a.kind != XMP_ACT_WAIT) {
                slot++;
                continue;
            }
            const xmp_edge_cfg_t *ec = &d->edges[a.edge];
            int from = a.dir == XMP_DIR_ACT ? ec->src : ec->dst;
            int to = a.dir == XMP_DIR_ACT ? ec->dst : ec->src;
            int here = s->group_stage[g][a.chunk];
            int *v = a.kind == XMP_ACT_START ? st : wt;
            int i = xmp_plan_index(a.edge, a.dir) * d->M + a.mb;
            if (here == (a.kind == XMP_ACT_START ? from : to) && v[i] < 0)
                v[i] = slot;
        }
    }
}

/* Groups the plans into bundles (plan_t.lead, nmem, mem): plan p joins the bundle of a lower
 * plan q when both move between the same two stages in the same direction and every
 * microbatch's start and wait sit in the same slots as q's, so one plan of many can carry
 * them all: their blocks are all written when the first start of the slot issues the bundle,
 * and none is read before the last wait of the slot. XMESH_PIPE_BUNDLE=0: every plan is its
 * own bundle. The grouping depends on the schedule and the edges only, so every rank makes
 * the same one. */
static xmesh_result_t make_bundles(xmp_driver_t *d, char *err, size_t errlen)
{
    int64_t on = 1;
    if (xmesh_param_get_int("XMESH_PIPE_BUNDLE", &on) != XMESH_SUCCESS)
        on = 1;
    int P = d->P, M = d->M;
    int *st = malloc(sizeof(int) * (size_t)(P * M + 1));
    int *wt = malloc(sizeof(int) * (size_t)(P * M + 1));
    if (!st || !wt) {
        free(st);
        free(wt);
        return fail(err, errlen, XMESH_ERR_NO_MEMORY, "driver: out of memory");
    }
    transfer_slots(d, st, wt);
    for (int p = 0; p < P; p++)
        d->plans[p].lead = p;
    for (int p = 0; p < P && on; p++) {
        const xmp_edge_cfg_t *ep = &d->edges[p / 2];
        for (int q = 0; q < p && d->plans[p].lead == p; q++) {
            const xmp_edge_cfg_t *eq = &d->edges[q / 2];
            if (d->plans[q].lead != q || p % 2 != q % 2 || ep->src != eq->src || ep->dst != eq->dst)
                continue;
            int same = 1;
            for (int m = 0; m < M && same; m++)
                same = st[p * M + m] >= 0 && wt[p * M + m] >= 0 && st[p * M + m] == st[q * M + m] &&
                       wt[p * M + m] == wt[q * M + m];
            if (same)
                d->plans[p].lead = q;
        }
    }
    free(st);
    free(wt);
    for (int p = 0; p < P; p++) {
        plan_t *pl = &d->plans[p];
        if (pl->lead != p)
            continue;
        for (int q = p; q < P; q++)
            pl->nmem += d->plans[q].lead == p;
        if (!(pl->mem = malloc(sizeof(int) * (size_t)pl->nmem)))
            return fail(err, errlen, XMESH_ERR_NO_MEMORY, "driver: out of memory");
        pl->nmem = 0;
        for (int q = p; q < P; q++)
            if (d->plans[q].lead == p)
                pl->mem[pl->nmem++] = q;
    }
    return XMESH_SUCCESS;
}

int xmp_driver_plans(const xmp_driver_t *d)
{
    return d ? d->nplans : 0;
}

xmesh_result_t xmp_driver_create(const xmp_driver_cfg_t *cfg, xmp_driver_t **out, char *err,
                                 size_t errlen)
{
    xmesh_result_t r = check_cfg(cfg, err, errlen);
    if (r != XMESH_SUCCESS)
        return r;
    xmp_driver_t *d = calloc(1, sizeof(*d));
    if (d == NULL)
        return fail(err, errlen, XMESH_ERR_NO_MEMORY, "driver: out of memory");
    xmesh_layout_t *lsrc = NULL, *ldst = NULL, *bls = NULL, *bld = NULL;
    const xmp_schedule_t *sc = cfg->sched;
    d->cfg = *cfg;
    d->cfg.stage_ops = NULL; /* copied into ch_ops below */
    d->M = sc->nmb;
    d->P = 2 * cfg->nedges;
    d->stage = -1;
    d->group = -1;
    MPI_Comm_rank(cfg->comm, &d->rank);
    MPI_Comm_size(cfg->comm, &d->size);
    int S = cfg->nstages, E = cfg->nedges, M = d->M;
    d->meshes = calloc((size_t)S, sizeof(*d->meshes));
    d->mesh_ranks = calloc((size_t)S, sizeof(int *));
    d->mesh = calloc((size_t)S, sizeof(xmesh_mesh_t));
    d->edges = calloc((size_t)(E ? E : 1), sizeof(*d->edges));
    d->specs = calloc((size_t)(4 * E + 1), sizeof(char *));
    d->plans = calloc((size_t)(d->P ? d->P : 1), sizeof(plan_t));
    d->argbuf = calloc((size_t)(2 * E + 2), sizeof(void *));
    d->bsrc = calloc((size_t)(d->P + 1), sizeof(void *));
    d->bdst = calloc((size_t)(d->P + 1), sizeof(void *));
    lsrc = calloc((size_t)(d->P + 1), sizeof *lsrc);
    ldst = calloc((size_t)(d->P + 1), sizeof *ldst);
    bls = calloc((size_t)(d->P + 1), sizeof *bls);
    bld = calloc((size_t)(d->P + 1), sizeof *bld);
    if (!d->meshes || !d->mesh_ranks || !d->mesh || !d->edges || !d->specs || !d->plans ||
        !d->argbuf || !d->bsrc || !d->bdst || !lsrc || !ldst || !bls || !bld) {
        r = fail(err, errlen, XMESH_ERR_NO_MEMORY, "driver: out of memory");
        goto out_destroy;
    }
    for (int st = 0; st < S; st++) {
        const xmp_stage_mesh_t *m = &cfg->meshes[st];
        int n = 1;
        for (int k = 0; k < m->ndim; k++)
            n *= m->shape[k];
        d->meshes[st] = *m;
        d->mesh_ranks[st] = malloc((size_t)(n > 0 ? n : 1) * sizeof(int));
        if (d->mesh_ranks[st] == NULL) {
            r = fail(err, errlen, XMESH_ERR_NO_MEMORY, "driver: out of memory");
            goto out_destroy;
        }
        memcpy(d->mesh_ranks[st], m->ranks, (size_t)n * sizeof(int));
        d->meshes[st].ranks = d->mesh_ranks[st];
        int g = sc->stage_group[st];
        for (int k = 0; k < n; k++)
            if (m->ranks[k] == d->rank) {
                if (d->group >= 0 && d->group != g) {
                    r = fail(err, errlen, XMESH_ERR_INVALID_ARGUMENT,
                             "driver: rank %d is in stage %d (group %d) and stage %d (group %d)",
                             d->rank, d->stage, d->group, st, g);
                    goto out_destroy;
                }
                if (d->group < 0)
                    d->stage = st;
                d->group = g;
            }
        r = xmesh_mesh_create(cfg->ctx, m->ndim, m->shape, m->ranks, &d->mesh[st]);
        if (r != XMESH_SUCCESS) {
            fail(err, errlen, r, "driver: stage %d mesh: %s", st, xmesh_last_error());
            goto out_destroy;
        }
    }
    d->nch = d->group >= 0 ? sc->nchunks[d->group] : 0;
    d->ch_stage = d->group >= 0 ? sc->group_stage[d->group] : NULL;
    d->ch_ops = calloc((size_t)(d->nch + 1), sizeof(*d->ch_ops));
    d->nin = calloc((size_t)(d->nch + 1), sizeof(int));
    d->nout = calloc((size_t)(d->nch + 1), sizeof(int));
    d->in_e = calloc((size_t)(d->nch + 1), sizeof(int *));
    d->out_e = calloc((size_t)(d->nch + 1), sizeof(int *));
    if (!d->ch_ops || !d->nin || !d->nout || !d->in_e || !d->out_e) {
        r = fail(err, errlen, XMESH_ERR_NO_MEMORY, "driver: out of memory");
        goto out_destroy;
    }
    for (int c = 0; c < d->nch; c++) {
        d->ch_ops[c] = cfg->stage_ops ? cfg->stage_ops[d->ch_stage[c]] : cfg->ops;
        d->in_e[c] = calloc((size_t)(E + 1), sizeof(int));
        d->out_e[c] = calloc((size_t)(E + 1), sizeof(int));
        if (!d->in_e[c] || !d->out_e[c]) {
            r = fail(err, errlen, XMESH_ERR_NO_MEMORY, "driver: out of memory");
            goto out_destroy;
        }
    }
    for (int e = 0; e < E; e++) {
        xmp_edge_cfg_t *ec = &d->edges[e];
        *ec = cfg->edges[e];
        const char *sp[4] = {ec->src_spec, ec->dst_spec,
                             ec->grad_src_spec ? ec->grad_src_spec : ec->dst_spec,
                             ec->grad_dst_spec ? ec->grad_dst_spec : ec->src_spec};
        for (int k = 0; k < 4; k++)
            if ((d->specs[4 * e + k] = dupstr(sp[k])) == NULL) {
                r = fail(err, errlen, XMESH_ERR_NO_MEMORY, "driver: out of memory");
                goto out_destroy;
            }
        ec->src_spec = d->specs[4 * e];
        ec->dst_spec = d->specs[4 * e + 1];
        ec->grad_src_spec = d->specs[4 * e + 2];
        ec->grad_dst_spec = d->specs[4 * e + 3];
        for (int c = 0; c < d->nch; c++) {
            if (ec->dst == d->ch_stage[c])
                d->in_e[c][d->nin[c]++] = e;
            if (ec->src == d->ch_stage[c])
                d->out_e[c][d->nout[c]++] = e;
        }
    }
    xmesh_plan_params_t pp = XMESH_PLAN_PARAMS_INITIALIZER;
    if (cfg->mode == XMP_COMM_BROADCAST)
        pp.strategy = XMESH_STRATEGY_BROADCAST;
    else if (cfg->mode == XMP_COMM_SENDRECV)
        pp.strategy = XMESH_STRATEGY_SENDRECV;
    else if (cfg->mode == XMP_COMM_SENDRECV_ALLGATHER)
        pp.strategy = XMESH_STRATEGY_SENDRECV_ALLGATHER;
    int64_t one = 1;
    for (int p = 0; p < d->P; p++) {
        plan_t *pl = &d->plans[p];
        int e = p / 2, dir = p % 2;
        const xmp_edge_cfg_t *ec = &d->edges[e];
        int sst = dir == XMP_DIR_ACT ? ec->src : ec->dst;
        int dst_st = dir == XMP_DIR_ACT ? ec->dst : ec->src;
        xmesh_layout_t ls = {ec->ndim, ec->shape, ec->dtype, d->mesh[sst],
                             dir == XMP_DIR_ACT ? ec->src_spec : ec->grad_src_spec};
        pl->dtype = ec->dtype;
        pl->wire = cfg->mode == XMP_COMM_SIGNAL ? ec->dtype : edge_wire(cfg, ec);
        xmesh_layout_t ld = {ec->ndim, ec->shape, ec->dtype, d->mesh[dst_st],
                             dir == XMP_DIR_ACT ? ec->dst_spec : ec->grad_dst_spec};
        int snd = d->group >= 0 && sc->stage_group[sst] == d->group;
        int rcv = d->group >= 0 && sc->stage_group[dst_st] == d->group;
        pl->role = snd && rcv ? 2 : snd ? 0 : rcv ? 1 : -1;
        int holds = 0;
        if (snd) {
            pl->sbytes = block_bytes(&ls, d->rank, &holds, err, errlen);
            if (pl->sbytes == (size_t)-1) {
                r = XMESH_ERR_INVALID_ARGUMENT;
                goto out_destroy;
            }
        }
        if (rcv) {
            pl->rbytes = block_bytes(&ld, d->rank, &holds, err, errlen);
            if (pl->rbytes == (size_t)-1) {
                r = XMESH_ERR_INVALID_ARGUMENT;
                goto out_destroy;
            }
            pl->relems = (int64_t)(pl->rbytes / xmesh_dtype_size(ec->dtype));
        }
        if (pl->wire != pl->dtype)
            ld.dtype = pl->wire; /* converting plan: the receiver gets wire blocks */
        if (cfg->mode == XMP_COMM_SIGNAL) {
            ls = (xmesh_layout_t){1, &one, XMESH_U8, d->mesh[sst], "R"};
            ld = (xmesh_layout_t){1, &one, XMESH_U8, d->mesh[dst_st], "R"};
        }
        lsrc[p] = ls;
        ldst[p] = ld;
        pl->sbuf = calloc((size_t)M, sizeof(void *));
        pl->rbuf = calloc((size_t)M, sizeof(void *));
        pl->queue = calloc((size_t)M, sizeof(int));
        pl->done = calloc((size_t)M, 1);
        pl->queued = calloc((size_t)M, 1);
        if (rcv && pl->wire != pl->dtype &&
            (pl->wbuf = calloc((size_t)M, sizeof(void *))) == NULL) {
            r = fail(err, errlen, XMESH_ERR_NO_MEMORY, "driver: out of memory");
            goto out_destroy;
        }
        if (!pl->sbuf || !pl->rbuf || !pl->queue || !pl->done || !pl->queued) {
            r = fail(err, errlen, XMESH_ERR_NO_MEMORY, "driver: out of memory");
            goto out_destroy;
        }
        for (int m = 0; m < M; m++) {
            if (snd && (pl->sbuf[m] = calloc(pl->sbytes ? pl->sbytes : 1, 1)) == NULL) {
                r = fail(err, errlen, XMESH_ERR_NO_MEMORY, "driver: out of memory (%zu B)",
                         pl->sbytes);
                goto out_destroy;
            }
            if (rcv && (pl->rbuf[m] = calloc(pl->rbytes ? pl->rbytes : 1, 1)) == NULL) {
                r = fail(err, errlen, XMESH_ERR_NO_MEMORY, "driver: out of memory (%zu B)",
                         pl->rbytes);
                goto out_destroy;
            }
            size_t wb = (size_t)pl->relems * xmesh_dtype_size(pl->wire);
            if (pl->wbuf && (pl->wbuf[m] = calloc(wb ? wb : 1, 1)) == NULL) {
                r = fail(err, errlen, XMESH_ERR_NO_MEMORY, "driver: out of memory (%zu B)", wb);
                goto out_destroy;
            }
        }
    }
    if ((r = make_bundles(d, err, errlen)) != XMESH_SUCCESS)
        goto out_destroy;
    for (int p = 0; p < d->P; p++) {
        plan_t *pl = &d->plans[p];
        if (pl->lead != p)
            continue;
        int k = cfg->mode == XMP_COMM_SIGNAL ? 1 : pl->nmem;
        for (int j = 0; j < k; j++) {
            bls[j] = lsrc[pl->mem[j]];
            bld[j] = ldst[pl->mem[j]];
        }
        r = xmesh_plan_create_many(cfg->ctx, k, bls, bld, &pp, &pl->plan);
        if (r != XMESH_SUCCESS) {
            const xmp_edge_cfg_t *ec = &d->edges[p / 2];
            int dir = p % 2;
            fail(err, errlen, r, "driver: plan %c.e%d%s ('%s' on stage %d -> '%s' on stage %d): %s",
                 dir ? 'G' : 'A', p / 2, k > 1 ? " (and the edges in its slot)" : "",
                 lsrc[p].sharding, dir == XMP_DIR_ACT ? ec->src : ec->dst, ldst[p].sharding,
                 dir == XMP_DIR_ACT ? ec->dst : ec->src, xmesh_last_error());
            goto out_destroy;
        }
        d->nplans++;
    }
    if ((r = xmp_barrier(cfg->comm, "driver create")) != XMESH_SUCCESS) {
        fail(err, errlen, r, "driver: %s", xmp_last_error());
        goto out_destroy;
    }
    d->t_origin = MPI_Wtime();
    *out = d;
    r = XMESH_SUCCESS;
    d = NULL;
out_destroy:
    xmp_driver_destroy(d);
    free(lsrc);
    free(ldst);
    free(bls);
    free(bld);
    return r;
}

xmesh_result_t xmp_driver_destroy(xmp_driver_t *d)
{
    if (d == NULL)
        return XMESH_SUCCESS;
    xmesh_result_t first = XMESH_SUCCESS;
    for (int p = 0; d->plans && p < d->P; p++) {
        plan_t *pl = &d->plans[p];
        if (pl->req != NULL)
            (void)xmesh_wait(pl->req);
        if (pl->plan != NULL) {
            xmesh_result_t r = xmesh_plan_destroy(pl->plan);
            if (first == XMESH_SUCCESS)
                first = r;
        }
        for (int m = 0; m < d->M; m++) {
            if (pl->sbuf)
                free(pl->sbuf[m]);
            if (pl->rbuf)
                free(pl->rbuf[m]);
            if (pl->wbuf)
                free(pl->wbuf[m]);
        }
        free(pl->wbuf);
        free(pl->sbuf);
        free(pl->rbuf);
        free(pl->queue);
        free(pl->done);
        free(pl->queued);
        free(pl->mem);
    }
    for (int st = 0; d->mesh && st < d->cfg.nstages; st++)
        if (d->mesh[st] != NULL)
            (void)xmesh_mesh_destroy(d->mesh[st]);
    for (int st = 0; d->mesh_ranks && st < d->cfg.nstages; st++)
        free(d->mesh_ranks[st]);
    for (int k = 0; d->specs && k < 4 * d->cfg.nedges; k++)
        free(d->specs[k]);
    for (int c = 0; c < d->nch; c++) {
        if (d->in_e)
            free(d->in_e[c]);
        if (d->out_e)
            free(d->out_e[c]);
    }
    free(d->specs);
    free(d->mesh_ranks);
    free(d->mesh);
    free(d->meshes);
    free(d->edges);
    free(d->plans);
    free(d->ch_ops);
    free(d->nin);
    free(d->nout);
    free(d->in_e);
    free(d->out_e);
    free(d->argbuf);
    free(d->bsrc);
    free(d->bdst);
    free(d->ev);
    free(d);
    return first;
}
