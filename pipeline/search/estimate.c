/*
 * The offline estimate (estimate.h): the cluster file into the cost model, the `xmesh-train`
 * layout flags into a configuration of the search's model (search.h, search_ut.h), and rank
 * placement advice from xmesh_suggest_order (include/xmesh.h).
 */
#include "search/estimate.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/gpt2_par.h"
#include "models/stage_layout.h"
#include "models/utransformer_sbp.h"
#include "nn/strategy.h"
#include "sched/schedule.h"
#include "search/search.h"
#include "search/search_ut.h"
#include "xm_cluster_file.h"
#include "xm_costmodel.h"
#include "xmesh.h"
#include "util/xmp_err.h"

struct xmp_estimator {
    xmp_estimator_opts_t o;
    xm_costmodel_t *cm;
    xm_cluster_t cl;
    char label[512];
};

int xmp_estimator_create(const xmp_estimator_opts_t *o, xmp_estimator_t **out, char *err,
                         size_t errlen)
{
    if (!o || !out)
        return xmp_err_buf(err, errlen, "xmp_estimator_create: NULL argument");
    double flops = o->flops > 0 ? o->flops : 5e10;
    if (!isfinite(flops))
        return xmp_err_buf(err, errlen, "flops %g: not a rate > 0", o->flops);
    xmp_estimator_t *e = calloc(1, sizeof *e);
    if (!e)
        return xmp_err_buf(err, errlen, "out of memory");
    e->o = *o;
    e->o.cluster_file = NULL; /* not kept: the caller's string */
    int one = 0;
    xm_hostmap_t hm = {1, 1, &one};
    if (xm_cluster_init(&e->cl, &hm)) {
        xmp_err_buf(err, errlen, "cluster: %s", xmesh_last_error());
        goto out_free;
    }
    if (o->cluster_file) {
        if (xm_cluster_load(o->cluster_file, &e->cl) ||
            xm_costmodel_load(o->cluster_file, &e->cm)) {
            xmp_err_buf(err, errlen, "cluster file '%s': %s", o->cluster_file, xmesh_last_error());
            goto out_cl;
        }
    }
    if (o->nominal || !e->cm || (e->cm->ncoll == 0 && e->cm->ngemm == 0)) {
        xm_costmodel_destroy(e->cm);
        e->cm = NULL;
        if (xm_costmodel_nominal(&e->cl, flops, &e->cm)) {
            xmp_err_buf(err, errlen, "nominal cost model: %s", xmesh_last_error());
            goto out_cl;
        }
        snprintf(e->label, sizeof e->label,
                 "nominal (uncalibrated): NIC %.3g Gbit/s, intra-host %.3g Gbit/s, latency %.3g "
                 "us, sgemm %.3g flop/s%s",
                 e->cl.nic_send_Bps * 8 / 1e9, e->cl.intra_Bps * 8 / 1e9, e->cl.latency_s * 1e6,
                 flops, o->cluster_file ? "" : " (no cluster file)");
    } else {
        snprintf(e->label, sizeof e->label, "calibrated: %s (%d collective fits, %d sgemm shapes)",
                 o->cluster_file, e->cm->ncoll, e->cm->ngemm);
    }
    *out = e;
    return 0;
out_cl:
    xm_costmodel_destroy(e->cm);
    xm_cluster_free(&e->cl);
out_free:
    free(e);
    return -1;
}

void xmp_estimator_destroy(xmp_estimator_t *e)
{
    if (!e)
        return;
    xm_costmodel_destroy(e->cm);
    xm_cluster_free(&e->cl);
    free(e);
}

const char *xmp_estimator_label(const xmp_estimator_t *e)
{
    return e ? e->label : "";
}

double xmp_estimate_rank_memory(const xmp_estimate_t *est, int r)
{
    for (int s = 0; s < est->nstages; s++)
        if (r >= est->stage_rank0[s] && r < est->stage_rank0[s] + est->stage_ranks[s])
            return est->stage_mem_bytes[s];
    return 0;
}

/* The per-stage strategy names of l (one name for all, or one per stage) into names[]. */
static int stage_names(const xmp_layout_desc_t *l, int S, char *buf, size_t n, const char **names,
                       char *err, size_t errlen)
{
    snprintf(buf, n, "%s", l->strategy ? l->strategy : "megatron");
    int k = 0;
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (k == S)
            return xmp_err_buf(err, errlen, "strategy '%s': more names than the %d stages",
                               l->strategy, S);
        names[k++] = t;
    }
    if (k == 1)
        for (; k < S; k++)
            names[k] = names[0];
    if (k != S)
        return xmp_err_buf(err, errlen,
                           "strategy '%s': %d names for %d stages (one, or one per stage)",
                           l->strategy, k, S);
    return 0;
}

static int layout_of(const char *kinds, int head, int tail, const xmp_layout_desc_t *l,
                     xmp_stage_layout_t *sl, char *err, size_t errlen)
{
    if (!l->stage_mesh)
        return xmp_err_buf(err, errlen, "no stage meshes (stage_mesh, e.g. \"2x2,4\")");
    int nmesh = 1;
    for (const char *q = l->stage_mesh; *q; q++)
        nmesh += *q == ',';
    char msg[512];
    if (xmp_stage_layout_build(kinds, head, tail, l->layout, nmesh, l->stage_mesh, NULL, NULL, sl,
                               msg, sizeof msg))
        return xmp_err_buf(err, errlen, "layout: %s", msg);
    if (sl->nstages > XMP_ESTIMATE_MAX_STAGES)
        return xmp_err_buf(err, errlen, "%d stages: at most %d", sl->nstages,
                           XMP_ESTIMATE_MAX_STAGES);
    if (sl->nranks != l->ranks)
        return xmp_err_buf(err, errlen, "the stage meshes use %d ranks, ranks is %d", sl->nranks,
                           l->ranks);
    if (l->hosts < 1 || l->ranks % l->hosts)
        return xmp_err_buf(err, errlen, "hosts %d does not divide ranks %d", l->hosts, l->ranks);
    if (l->ranks > XMP_ESTIMATE_MAX_RANKS)
        return xmp_err_buf(err, errlen, "ranks %d: at most %d", l->ranks, XMP_ESTIMATE_MAX_RANKS);
    return 0;
}

static int stage_size(const xmp_stage_layout_t *sl, int s)
{
    int n = 1;
    for (int a = 0; a < sl->ndim[s]; a++)
        n *= sl->shape[s][a];
    return n;
}

static int sched_of(const xmp_layout_desc_t *l, int *kind, char *err, size_t errlen)
{
    *kind = XMP_SCHED_1F1B;
    if (l->schedule && (*kind = xmp_sched_kind_parse(l->schedule)) < 0)
        return xmp_err_buf(err, errlen, "schedule '%s': gpipe, 1f1b or eager-1f1b", l->schedule);
    return 0;
}

/* Rank placement: for each boundary s -> s+1 (tensor dims, act.x specs), the destination order
 * xmesh_suggest_order proposes; kept when it lowers the boundary's lower bound. */
static void placement(const xmp_stage_layout_t *sl, int hosts, int nd, const int64_t (*bdims)[4],
                      char (*spec)[64], xmp_estimate_t *out)
{
    int N = sl->nranks, rph = N / hosts;
    int *host = malloc(sizeof(int) * (size_t)N);
    for (int r = 0; r < N; r++)
        out->rank_order[r] = r;
    out->order_gain_s = 0;
    if (!host)
        return;
    for (int r = 0; r < N; r++)
        host[r] = r / rph;
    for (int s = 0; s + 1 < sl->nstages; s++) {
        int na = 1, nb = 1;
        for (int a = 0; a < sl->ndim[s]; a++)
            na *= sl->shape[s][a];
        for (int a = 0; a < sl->ndim[s + 1]; a++)
            nb *= sl->shape[s + 1][a];
        int *src = malloc(sizeof(int) * (size_t)na), *dst = malloc(sizeof(int) * (size_t)nb);
        int *sug = malloc(sizeof(int) * (size_t)nb);
        if (src && dst && sug) {
            for (int i = 0; i < na; i++)
                src[i] = out->rank_order[sl->rank0[s] + i];
            for (int i = 0; i < nb; i++)
                dst[i] = sl->rank0[s + 1] + i;
            xmesh_placement_problem_t pb = {
                nd,      bdims[s],        XMESH_F32,        sl->ndim[s], sl->shape[s], src,
                spec[s], sl->ndim[s + 1], sl->shape[s + 1], dst,         spec[s + 1],  N,
                host};
            xmesh_placement_info_t info;
            if (xmesh_suggest_order(&pb, sug, &info) == XMESH_SUCCESS &&
                info.suggested_lower_bound_s < info.lower_bound_s * (1 - 1e-9)) {
                for (int i = 0; i < nb; i++)
                    out->rank_order[sl->rank0[s + 1] + i] = sug[i];
                out->order_gain_s += info.lower_bound_s - info.suggested_lower_bound_s;
            }
        }
        free(src);
        free(dst);
        free(sug);
    }
    free(host);
}

int xmp_estimate_gpt(const xmp_estimator_t *e, const xmp_gpt_desc_t *m, const xmp_layout_desc_t *l,
                     xmp_estimate_t *out, char *err, size_t errlen)
{
    if (!e || !m || !l || !out)
        return xmp_err_buf(err, errlen, "xmp_estimate_gpt: NULL argument");
    if (m->layers < 1 || m->layers + 2 > XMP_MAX_LAYERS)
        return xmp_err_buf(err, errlen, "layers %d: between 1 and %d", m->layers,
                           XMP_MAX_LAYERS - 2);
    char kinds[XMP_MAX_LAYERS + 3];
    kinds[0] = 'E';
    memset(kinds + 1, 't', (size_t)m->layers);
    kinds[m->layers + 1] = 'L';
    kinds[m->layers + 2] = 0;
    xmp_stage_layout_t sl;
    if (layout_of(kinds, 1, 1, l, &sl, err, errlen))
        return -1;
    xmp_search_opts_t so;
    memset(&so, 0, sizeof so);
    so.model.num_layers = m->layers;
    so.model.num_heads = m->heads;
    so.model.channels = m->channels;
    so.model.max_seq_len = m->max_seq > 0 ? m->max_seq : 1024;
    so.model.vocab_size = m->vocab;
    so.model.padded_vocab_size = xmp_gpt2_pad_vocab(m->vocab, 128);
    so.vocab = m->vocab;
    so.B = m->batch;
    so.T = m->seq;
    so.nranks = l->ranks;
    so.hosts = l->hosts;
    so.cost = e->cm;
    so.cluster = &e->cl;
    so.max_evals = e->o.max_evals;
    so.no_boundary = e->o.no_boundary;
    so.no_share = e->o.no_share;
    xmp_search_cand_t c;
    memset(&c, 0, sizeof c);
    c.nstages = sl.nstages;
    c.M = l->microbatches > 0 ? l->microbatches : 1;
    if (sched_of(l, &c.sched, err, errlen))
        return -1;
    char nbuf[512];
    const char *names[XMP_ESTIMATE_MAX_STAGES];
    if (stage_names(l, sl.nstages, nbuf, sizeof nbuf, names, err, errlen))
        return -1;
    char spec[XMP_ESTIMATE_MAX_STAGES][64];
    for (int s = 0; s < sl.nstages; s++) {
        int blocks = 0;
        for (int k = sl.first[s]; k < sl.first[s] + sl.count[s]; k++)
            blocks += sl.kind[k] == 't';
        c.nblocks[s] = blocks;
        c.ndim[s] = sl.ndim[s];
        memcpy(c.shape[s], sl.shape[s], sizeof(int) * (size_t)sl.ndim[s]);
        c.strategy[s] = -1;
        for (int k = 0; k < XMP_SEARCH_NSTRAT; k++)
            if (!strcmp(names[s], xmp_search_strategy_name(k)))
                c.strategy[s] = k;
        if (c.strategy[s] < 0)
            return xmp_err_buf(
                err, errlen,
                "strategy '%s' (stage %d): the model knows the built-ins dp, megatron, "
                "3d, axonn only",
                names[s], s);
        /* act.x's spec for the placement advice */
        char text[8192], msg[256];
        xmp_strategy_t st;
        snprintf(spec[s], sizeof spec[s], "%s", "");
        if (xmp_gpt2_strategy_builtin(names[s], sl.ndim[s], text, sizeof text, msg, sizeof msg) ==
                0 &&
            xmp_strategy_parse(text, names[s], &st, msg, sizeof msg) == 0) {
            const xmp_strategy_entry_t *x = xmp_strategy_get(&st, "act.x");
            if (x)
                xmp_strategy_sbp_string(x->sbp, sl.ndim[s], spec[s], sizeof spec[s]);
        }
    }
    if (xmp_search_gpt_eval(&so, &c, err, errlen))
        return -1;
    xmp_estimate_t r;
    memset(&r, 0, sizeof r);
    r.nstages = c.nstages;
    r.step_s = c.step_s;
    r.bubble = c.bubble;
    r.compute_s = c.compute_s;
    r.boxing_s = c.boxing_s;
    r.boundary_s = c.boundary_s;
    r.boxing_bytes = c.boxing_bytes;
    r.boundary_bytes = c.boundary_bytes;
    r.mem_bytes = c.mem_bytes;
    for (int s = 0; s < sl.nstages; s++) {
        r.stage_rank0[s] = sl.rank0[s];
        r.stage_ranks[s] = stage_size(&sl, s);
        r.stage_mem_bytes[s] = c.stage_param_bytes[s] + c.stage_act_bytes[s];
    }
    int64_t dims[XMP_ESTIMATE_MAX_STAGES][4];
    for (int s = 0; s < sl.nstages; s++) {
        dims[s][0] = m->batch / c.M;
        dims[s][1] = m->seq;
        dims[s][2] = m->channels;
        dims[s][3] = 1;
    }
    placement(&sl, l->hosts, 3, dims, spec, &r);
    memcpy(out, &r, sizeof r);
    return 0;
}

int xmp_estimate_utransformer(const xmp_estimator_t *e, const xmp_utrans_desc_t *m,
                              const xmp_layout_desc_t *l, xmp_estimate_t *out, char *err,
                              size_t errlen)
{
    if (!e || !m || !l || !out)
        return xmp_err_buf(err, errlen, "xmp_estimate_utransformer: NULL argument");
    xmp_uts_opts_t so;
    memset(&so, 0, sizeof so);
    if (xmp_ut_config_init(&so.model, m->base, m->groups, m->head_dim))
        return xmp_err_buf(err, errlen, "model: %s", xmp_last_error());
    char kinds[XMP_UT_LAYERS + 1];
    memset(kinds, 'u', XMP_UT_LAYERS);
    kinds[XMP_UT_LAYERS] = 0;
    xmp_stage_layout_t sl;
    if (layout_of(kinds, 0, 0, l, &sl, err, errlen))
        return -1;
    so.B = m->batch;
    so.nranks = l->ranks;
    so.hosts = l->hosts;
    so.cost = e->cm;
    so.cluster = &e->cl;
    so.max_evals = e->o.max_evals;
    so.no_boundary = e->o.no_boundary;
    xmp_uts_cand_t c;
    memset(&c, 0, sizeof c);
    c.nstages = sl.nstages;
    c.M = l->microbatches > 0 ? l->microbatches : 1;
    if (sched_of(l, &c.sched, err, errlen))
        return -1;
    char nbuf[512];
    const char *names[XMP_ESTIMATE_MAX_STAGES];
    if (stage_names(l, sl.nstages, nbuf, sizeof nbuf, names, err, errlen))
        return -1;
    if (so.B % c.M)
        return xmp_err_buf(err, errlen, "microbatches %d does not divide the batch %d", c.M, so.B);
    so.fixed_M = c.M;
    char spec[XMP_ESTIMATE_MAX_STAGES][64];
    for (int s = 0; s < sl.nstages; s++) {
        if (sl.ndim[s] != 2)
            return xmp_err_buf(err, errlen,
                               "stage %d: a mesh of %d axes; the U-Transformer's stages run "
                               "on 2-axis dp x tp meshes",
                               s, sl.ndim[s]);
        c.count[s] = sl.count[s];
        c.dp[s] = sl.shape[s][0];
        c.tp[s] = sl.shape[s][1];
        int k = 0;
        while (k < so.nstrat && strcmp(so.strategies[k], names[s]))
            k++;
        if (k == so.nstrat) {
            if (so.nstrat == XMP_UTS_MAX_STRAT)
                return xmp_err_buf(err, errlen, "more than %d strategy names", XMP_UTS_MAX_STRAT);
            so.strategies[so.nstrat++] = names[s];
        }
        c.strategy[s] = k;
        xmp_ut_strategy_t st;
        snprintf(spec[s], sizeof spec[s], "%s", "");
        if (xmp_ut_strategy_load(names[s], &so.model, 2, sl.shape[s], &st) == 0) {
            const xmp_sbp_t *x = xmp_ut_strategy_get(&st, NULL, "act.x");
            if (x)
                xmp_strategy_sbp_string(x, 2, spec[s], sizeof spec[s]);
        }
    }
    if (xmp_uts_eval(&so, &c, err, errlen))
        return -1;
    xmp_estimate_t r;
    memset(&r, 0, sizeof r);
    r.nstages = c.nstages;
    r.step_s = c.step_s;
    r.bubble = c.bubble;
    r.compute_s = c.compute_s;
    r.boxing_s = c.boxing_s;
    r.boundary_s = c.boundary_s;
    r.boxing_bytes = c.boxing_bytes;
    r.boundary_bytes = c.boundary_bytes;
    r.mem_bytes = c.mem_bytes;
    for (int s = 0; s < sl.nstages; s++) {
        r.stage_rank0[s] = sl.rank0[s];
        r.stage_ranks[s] = stage_size(&sl, s);
        r.stage_mem_bytes[s] = c.stage_mem[s];
    }
    /* each boundary's main activation (the last layer's output of stage s; the skips that
     * cross have other shapes and are not placed) */
    int64_t dims[XMP_ESTIMATE_MAX_STAGES][4];
    for (int s = 0; s < sl.nstages; s++) {
        int chw[3];
        xmp_ut_layer_out_shape(&so.model, sl.first[s] + sl.count[s] - 1, chw);
        dims[s][0] = so.B / c.M;
        dims[s][1] = chw[0];
        dims[s][2] = chw[1];
        dims[s][3] = chw[2];
    }
    placement(&sl, l->hosts, 4, dims, spec, &r);
    memcpy(out, &r, sizeof r);
    return 0;
}
