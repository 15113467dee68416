/* The U-Transformer's pipeline stage (ut_stage.h): edges, the stage callbacks, set-up and
 * teardown. */
#include "ut_stage.h"

#include <cblas.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/unet_kernels.h"
#include "pipe/driver.h"
#include "trainer.h"

static size_t chw_floats(const int chw[3])
{
    return (size_t)chw[0] * chw[1] * chw[2];
}

/* Stage graph edges in producer-layer order: main before skip for the same layer. */
/* Images of a micro-batch split over stage s's mesh axis 0 (every built-in's data axis; the edge
 * SBP is S(0) there and B on the other axes). */
int xmp_uts_data_degree(const xmp_stage_layout_t *sl, int s)
{
    return sl->shape[s][0];
}

/* The edge SBP of each stage, "S(0),B,..." with one entry per mesh axis. */
static char g_espec[XMP_MAX_STAGES][48];

int xmp_uts_build_edges(const xmp_ut_config_t *c, const xmp_stage_layout_t *sl, int mbs,
                        ut_edge_t *e, xmp_edge_cfg_t *ec, xmp_sedge_t *se)
{
    for (int s = 0; s < sl->nstages; s++) {
        snprintf(g_espec[s], sizeof g_espec[s], "S(0)");
        for (int a = 1; a < sl->ndim[s]; a++)
            strncat(g_espec[s], ",B", sizeof g_espec[s] - strlen(g_espec[s]) - 1);
    }
    int n = 0, nout[XMP_MAX_STAGES] = {0}, nin[XMP_MAX_STAGES] = {0};
    for (int l = 0; l < XMP_UT_LAYERS; l++)
        for (int what = T_MAIN; what <= T_SKIP; what++) {
            int dst = what == T_MAIN ? (l + 1 < XMP_UT_LAYERS ? l + 1 : -1) : xmp_ut_skip_dest(l);
            if (dst < 0 || sl->stage_of[dst] == sl->stage_of[l])
                continue;
            int s = sl->stage_of[l], d = sl->stage_of[dst], chw[3];
            if (what == T_MAIN)
                xmp_ut_layer_out_shape(c, l, chw);
            else
                xmp_ut_layer_skip_shape(c, l, chw);
            e[n].layer = l;
            e[n].what = what;
            e[n].floats_src = chw_floats(chw) * (size_t)(mbs / xmp_uts_data_degree(sl, s));
            e[n].floats_dst = chw_floats(chw) * (size_t)(mbs / xmp_uts_data_degree(sl, d));
            memset(&ec[n], 0, sizeof ec[n]);
            ec[n].src = s;
            ec[n].dst = d;
            ec[n].ndim = 4;
            ec[n].shape[0] = mbs;
            for (int k = 0; k < 3; k++)
                ec[n].shape[k + 1] = chw[k];
            ec[n].dtype = XMESH_F32;
            ec[n].src_spec = g_espec[s];
            ec[n].dst_spec = g_espec[d];
            se[n].src = s;
            se[n].dst = d;
            n++;
        }
    /* positions: edges are numbered in increasing id per stage */
    for (int k = 0; k < n; k++) {
        e[k].pos_src = nout[se[k].src]++;
        e[k].pos_dst = nin[se[k].dst]++;
    }
    return n;
}

/* A tensor of global shape (mbs, chw...) with SBP "S(0),B" holding n local floats of src. */
static int wrap(ut_stage_t *st, int ndim, const int64_t *shape, const float *src, size_t n,
                xmp_tensor_t *t)
{
    if (xmp_tensor_alloc(t, st->mesh, ndim, shape, XMESH_F32, st->edge) != XMESH_SUCCESS)
        return -1;
    if ((size_t)t->lcount != n) {
        xmp_err(XMESH_ERR_INTERNAL, "edge block of %lld floats, buffer %zu", (long long)t->lcount,
                n);
        xmp_tensor_free(t);
        return -1;
    }
    memcpy(t->data, src, n * sizeof(float));
    return 0;
}
static int wrap_chw(ut_stage_t *st, const int chw[3], const float *src, xmp_tensor_t *t)
{
    int64_t s[4] = {st->mbs, chw[0], chw[1], chw[2]};
    return wrap(st, 4, s, src, (size_t)st->nloc * chw_floats(chw), t);
}
/* Copies t, boxed to the edge SBP, into dst (n floats). */
static int copy_out(ut_stage_t *st, const xmp_tensor_t *t, float *dst, size_t n)
{
    xmp_tensor_t b;
    if (xmp_box(t, st->edge, &b) != XMESH_SUCCESS)
        return -1;
    int rc = (size_t)b.lcount == n ? 0 : -1;
    if (rc)
        xmp_err(XMESH_ERR_INTERNAL, "edge block of %lld floats, buffer %zu", (long long)b.lcount,
                n);
    else
        memcpy(dst, b.data, n * sizeof(float));
    xmp_tensor_free(&b);
    return rc;
}

/* Floats of a micro-batch's input, target and conditioning data on this rank. */
static void mb_floats(const ut_stage_t *st, size_t f[3])
{
    const size_t HW = XMP_UT_IMG * XMP_UT_IMG, nl = (size_t)st->nloc;
    f[0] = nl * 3 * HW;
    f[1] = nl * 4 * HW;
    f[2] = nl * XMP_UT_TOKENS * (size_t)st->cfg.cond_dim;
}

void xmp_uts_mb_free_data(ut_stage_t *st, int mb)
{
    size_t f[3];
    mb_floats(st, f);
    xmp_ut_mem_track(-(int64_t)sizeof(float) *
                     (int64_t)((st->input[mb] ? f[0] : 0) + (st->target[mb] ? f[1] : 0) +
                               (st->cond[mb] ? f[2] : 0)));
    free(st->input[mb]);
    free(st->cond[mb]);
    free(st->target[mb]);
    st->input[mb] = st->cond[mb] = st->target[mb] = NULL;
}

int xmp_uts_fwd(void *u, int mb, const void *const *in, void *const *out, double *loss)
{
    ut_stage_t *st = u;
    const int first_img = mb * st->mbs + st->dpi * st->nloc;
    const size_t HW = XMP_UT_IMG * XMP_UT_IMG, nl = (size_t)st->nloc;
    const size_t ncond = nl * XMP_UT_TOKENS * (size_t)st->cfg.cond_dim;
    int need_cond = 0, rc = -1;
    for (int l = st->first; l <= st->last; l++)
        need_cond |= xmp_ut_layer_uses_cond(&st->cfg, l);
    /* this micro-batch's data, allocated now and freed after its weight gradients */
    xmp_uts_mb_free_data(st, mb);
    size_t fl[3];
    mb_floats(st, fl);
    if (st->first == 0)
        st->input[mb] = malloc(fl[0] * sizeof(float));
    if (st->last == XMP_UT_CONV_OUT)
        st->target[mb] = malloc(fl[1] * sizeof(float));
    if (need_cond)
        st->cond[mb] = malloc(fl[2] * sizeof(float));
    /* counted like the tapes (freed, and uncounted, by xmp_uts_mb_free_data) */
    xmp_ut_mem_track((int64_t)sizeof(float) *
                     (int64_t)((st->input[mb] ? fl[0] : 0) + (st->target[mb] ? fl[1] : 0) +
                               (st->cond[mb] ? fl[2] : 0)));
    if ((st->first == 0 && !st->input[mb]) || (st->last == XMP_UT_CONV_OUT && !st->target[mb]) ||
        (need_cond && !st->cond[mb])) {
        (void)xmp_err(XMESH_ERR_INVALID_USAGE, "stage %d forward mb %d: out of memory", st->stage,
                      mb);
        return -1;
    }
    xmp_shapes_batch(&st->sh, st->step, st->o->batch, first_img, st->nloc, st->input[mb],
                     st->target[mb], st->cond[mb]);
    xmp_tensor_t x, cond, skin;
    memset(&x, 0, sizeof x);
    memset(&cond, 0, sizeof cond);
    int64_t cs[3] = {st->mbs, XMP_UT_TOKENS, st->cfg.cond_dim};
    int chw[3];
    xmp_ut_layer_in_shape(&st->cfg, st->first, chw);
    const float *src = st->input[mb];
    for (int k = 0; k < st->nedges; k++)
        if (st->sl->stage_of[st->e[k].layer] != st->stage && st->e[k].what == T_MAIN &&
            st->e[k].layer == st->first - 1)
            src = in[st->e[k].pos_dst];
    if (wrap_chw(st, chw, src, &x) != 0 ||
        (need_cond && wrap(st, 3, cs, st->cond[mb], ncond, &cond) != 0)) {
        (void)xmp_err(XMESH_ERR_INVALID_USAGE, "stage %d forward mb %d: %s", st->stage, mb,
                      xmp_last_error());
        goto out;
    }
    const xmp_tensor_t *cur = &x;
    for (int l = st->first; l <= st->last; l++) {
        const xmp_tensor_t *sk = NULL;
        int srcl = xmp_ut_skip_source(l);
        memset(&skin, 0, sizeof skin);
        if (srcl >= 0 && st->sl->stage_of[srcl] == st->stage)
            sk = st->so[IX(st, srcl, mb)];
        else if (srcl >= 0)
            for (int k = 0; k < st->nedges; k++)
                if (st->e[k].what == T_SKIP && st->e[k].layer == srcl) {
                    int sc[3];
                    xmp_ut_layer_skip_shape(&st->cfg, srcl, sc);
                    if (wrap_chw(st, sc, in[st->e[k].pos_dst], &skin) != 0) {
                        (void)xmp_err(XMESH_ERR_INVALID_USAGE, "stage %d skip mb %d: %s", st->stage,
                                      mb, xmp_last_error());
                        goto out;
                    }
                    sk = &skin;
                }
        int r = xmp_ut_slayer_forward(st->SL[l], cur, sk, need_cond ? &cond : NULL,
                                      &st->tape[IX(st, l, mb)], &st->y[IX(st, l, mb)],
                                      &st->so[IX(st, l, mb)]);
        xmp_tensor_free(&skin);
        if (r == 0) /* recomputation: keep the layer's inputs and outputs only */
            r = xmp_ut_tape_drop(st->tape[IX(st, l, mb)], st->recompute);
        if (r != 0) {
            (void)xmp_err(XMESH_ERR_INVALID_USAGE, "stage %d forward mb %d: %s", st->stage, mb,
                          xmp_last_error());
            goto out;
        }
        cur = st->y[IX(st, l, mb)];
        if (st->progress)
            st->progress(st->progress_arg);
    }
    st->live[mb] = 1;
    for (int k = 0; k < st->nedges; k++) {
        const ut_edge_t *e = &st->e[k];
        if (st->sl->stage_of[e->layer] != st->stage)
            continue;
        const xmp_tensor_t *v =
            e->what == T_MAIN ? st->y[IX(st, e->layer, mb)] : st->so[IX(st, e->layer, mb)];
        if (copy_out(st, v, out[e->pos_src], e->floats_src) != 0) {
            (void)xmp_err(XMESH_ERR_INVALID_USAGE, "stage %d edge %d mb %d: %s", st->stage, k, mb,
                          xmp_last_error());
            goto out;
        }
    }
    /* every rank boxes the output (a collective when act.x is split beyond axis 0); the ranks
     * of one axis-0 slice hold the same images: one of them (tpi 0) adds the loss */
    if (st->last == XMP_UT_CONV_OUT) {
        double l = 0;
        size_t cnt = nl * XMP_UT_OUT_CH * HW;
        float *yb = malloc(cnt * sizeof(float));
        if (!yb || copy_out(st, st->y[IX(st, st->last, mb)], yb, cnt) != 0) {
            free(yb);
            (void)xmp_err(XMESH_ERR_INVALID_USAGE, "stage %d loss mb %d: output block", st->stage,
                          mb);
            goto out;
        }
        xmp_unet_mse_forward(cnt, (double)st->o->batch * XMP_UT_OUT_CH * HW, yb, st->target[mb],
                             &l);
        free(yb);
        if (st->tpi == 0)
            *loss += l;
    }
    rc = 0;
out:
    xmp_tensor_free(&x);
    xmp_tensor_free(&cond);
    return rc;
}

int xmp_uts_bwd_input(void *u, int mb, const void *const *gout, void *const *gin)
{
    ut_stage_t *st = u;
    const size_t HW = XMP_UT_IMG * XMP_UT_IMG;
    for (int k = 0; k < st->nedges; k++) { /* my in-edges' gradients, written below */
        const ut_edge_t *e = &st->e[k];
        int dst = e->what == T_MAIN ? e->layer + 1 : xmp_ut_skip_dest(e->layer);
        if (st->sl->stage_of[e->layer] != st->stage && st->sl->stage_of[dst] == st->stage)
            memset(gin[e->pos_dst], 0, e->floats_dst * sizeof(float));
    }
    for (int l = st->last; l >= st->first; l--) {
        xmp_tensor_t dy, dso, dx, dsi;
        memset(&dy, 0, sizeof dy);
        memset(&dso, 0, sizeof dso);
        memset(&dx, 0, sizeof dx);
        memset(&dsi, 0, sizeof dsi);
        int chw[3], rc = -1;
        xmp_ut_layer_out_shape(&st->cfg, l, chw);
        const xmp_tensor_t *pdy = &st->dact[IX(st, l, mb)], *pdso = NULL;
        if (l == st->last && l == XMP_UT_CONV_OUT) {
            size_t cnt = (size_t)st->nloc * XMP_UT_OUT_CH * HW;
            float *yb = malloc(cnt * sizeof(float)), *g = calloc(cnt, sizeof(float));
            if (yb && g && copy_out(st, st->y[IX(st, l, mb)], yb, cnt) == 0) {
                xmp_unet_mse_backward(cnt, (double)st->o->batch * XMP_UT_OUT_CH * HW, yb,
                                      st->target[mb], g);
                rc = wrap_chw(st, chw, g, &dy);
            }
            free(yb);
            free(g);
            if (rc)
                goto fail;
            pdy = &dy;
        }
        int src = xmp_ut_skip_source(l), dst = xmp_ut_skip_dest(l);
        if (dst >= 0 && st->sl->stage_of[dst] == st->stage && st->dskip[IX(st, l, mb)].mesh)
            pdso = &st->dskip[IX(st, l, mb)];
        for (int k = 0; k < st->nedges; k++) {
            const ut_edge_t *e = &st->e[k];
            if (e->layer != l || st->sl->stage_of[l] != st->stage)
                continue;
            int sc[3];
            if (e->what == T_MAIN) {
                if (wrap_chw(st, chw, gout[e->pos_src], &dy) != 0)
                    goto fail;
                pdy = &dy;
            } else {
                xmp_ut_layer_skip_shape(&st->cfg, l, sc);
                if (wrap_chw(st, sc, gout[e->pos_src], &dso) != 0)
                    goto fail;
                pdso = &dso;
            }
        }
        if (!pdy->mesh) {
            xmp_err(XMESH_ERR_INTERNAL, "layer %d: no output gradient", l);
            goto fail;
        }
        int same_src = src >= 0 && st->sl->stage_of[src] == st->stage;
        xmp_tensor_t *pdx = l > 0 ? (l > st->first ? &st->dact[IX(st, l - 1, mb)] : &dx) : NULL;
        xmp_tensor_t *pdsi = src >= 0 ? (same_src ? &st->dskip[IX(st, src, mb)] : &dsi) : NULL;
        if (xmp_ut_tape_recompute(st->tape[IX(st, l, mb)], st->recompute) != 0 ||
            xmp_ut_slayer_backward_input(st->SL[l], st->tape[IX(st, l, mb)], pdy, pdso, pdx,
                                         pdsi) != 0) {
            (void)xmp_err(XMESH_ERR_INVALID_USAGE, "stage %d backward mb %d: %s", st->stage, mb,
                          xmp_last_error());
            goto fail_quiet;
        }
        for (int k = 0; k < st->nedges; k++) { /* gradients leaving the stage */
            const ut_edge_t *e = &st->e[k];
            if (st->sl->stage_of[e->layer] == st->stage)
                continue;
            if (l == st->first && e->what == T_MAIN && e->layer == l - 1 &&
                copy_out(st, &dx, gin[e->pos_dst], e->floats_dst) != 0)
                goto fail;
            if (src >= 0 && !same_src && e->what == T_SKIP && e->layer == src &&
                copy_out(st, &dsi, gin[e->pos_dst], e->floats_dst) != 0)
                goto fail;
        }
        xmp_tensor_free(&dy);
        xmp_tensor_free(&dso);
        xmp_tensor_free(&dx);
        xmp_tensor_free(&dsi);
        xmp_tensor_free(&st->dact[IX(st, l, mb)]);
        xmp_tensor_free(&st->dskip[IX(st, l, mb)]);
        memset(&st->dact[IX(st, l, mb)], 0, sizeof(xmp_tensor_t));
        memset(&st->dskip[IX(st, l, mb)], 0, sizeof(xmp_tensor_t));
        if (st->progress)
            st->progress(st->progress_arg);
        continue;
    fail:
        (void)xmp_err(XMESH_ERR_INVALID_USAGE, "stage %d backward mb %d layer %d: %s", st->stage,
                      mb, l, xmp_last_error());
    fail_quiet:
        xmp_tensor_free(&dy);
        xmp_tensor_free(&dso);
        xmp_tensor_free(&dx);
        xmp_tensor_free(&dsi);
        return -1;
    }
    return 0;
}

int xmp_uts_bwd_weight(void *u, int mb)
{
    ut_stage_t *st = u;
    for (int l = st->last; l >= st->first; l--) {
        xmp_ut_tape_t *t = st->tape[IX(st, l, mb)];
        st->tape[IX(st, l, mb)] = NULL; /* freed by backward_weight */
        st->y[IX(st, l, mb)] = st->so[IX(st, l, mb)] = NULL;
        if (xmp_ut_slayer_backward_weight(st->SL[l], t) != 0) {
            (void)xmp_err(XMESH_ERR_INVALID_USAGE, "stage %d weight mb %d: %s", st->stage, mb,
                          xmp_last_error());
            return -1;
        }
    }
    xmp_uts_mb_free_data(st, mb);
    st->live[mb] = 0;
    return 0;
}

/* Measured (nn/sbp.h allocation accounting): the peak of this rank's allocations since the last
 * query above those held after set-up (the parameters): the micro-batches' tapes (values,
 * caches, gradients), their data, the op temporaries and the gradient accumulators. The driver
 * queries after every compute action, so its maximum is the step's measured peak. */
void xmp_uts_set_progress(void *user, void (*fn)(void *arg), void *arg)
{
    ut_stage_t *st = user;
    st->progress = fn;
    st->progress_arg = arg;
}

int64_t xmp_uts_act_bytes(void *u)
{
    ut_stage_t *st = u;
    if (st->mem_quiet)
        return 0;
    int64_t p = xmp_ut_mem_peak_bytes() - st->base_bytes;
    xmp_ut_mem_peak_reset();
    return p > 0 ? p : 0;
}

/* R: the parameter gradients are boxed to their parameters' storage SBP (P over dp -> B,
 * P -> S where sharded). defer-grad: every layer's reductions posted first (nonblocking), then
 * waited in the same order: the same collectives on the same data. */
int xmp_uts_reduce(void *u)
{
    ut_stage_t *st = u;
    int rc = 0, started = st->first;
    for (int l = st->first; st->ov.defer_grad && l <= st->last && !rc; l++, started = l)
        rc = xmp_ut_slayer_reduce_start(st->SL[l]);
    for (int l = st->first; st->ov.defer_grad && l < started; l++) /* every started one */
        if (xmp_ut_slayer_reduce_wait(st->SL[l]) != 0)
            rc = -1;
    for (int l = st->first; !st->ov.defer_grad && l <= st->last && !rc; l++)
        rc = xmp_ut_slayer_reduce(st->SL[l]);
    if (rc) {
        (void)xmp_err(XMESH_ERR_INVALID_USAGE, "stage %d: gradient reduction: %s", st->stage,
                      xmp_last_error());
        return -1;
    }
    return 0;
}

int xmp_uts_opt(void *u)
{
    ut_stage_t *st = u;
    for (int l = st->first; l <= st->last; l++)
        if (xmp_ut_slayer_update(st->SL[l], st->o->lr, st->o->momentum, st->o->wd) != 0) {
            (void)xmp_err(XMESH_ERR_INVALID_USAGE, "stage %d: optimizer: %s", st->stage,
                          xmp_last_error());
            return -1;
        }
    return 0;
}

void xmp_uts_free(ut_stage_t *st)
{
    size_t NL = (size_t)XMP_UT_LAYERS * (size_t)st->M;
    for (size_t i = 0; st->tape && i < NL; i++) {
        xmp_ut_tape_free(st->tape[i]);
        xmp_tensor_free(&st->dact[i]);
        xmp_tensor_free(&st->dskip[i]);
    }
    for (int m = 0; st->input && m < st->M; m++)
        xmp_uts_mb_free_data(st, m);
    for (int l = 0; l < XMP_UT_LAYERS; l++)
        xmp_ut_slayer_destroy(st->SL[l]);
    free(st->tape);
    free(st->y);
    free(st->so);
    free(st->dact);
    free(st->dskip);
    free(st->input);
    free(st->cond);
    free(st->target);
    free(st->live);
    xmp_shapes_free(&st->sh);
}

int xmp_uts_init(ut_stage_t *st)
{
    const size_t NL = (size_t)XMP_UT_LAYERS * (size_t)st->M, M = (size_t)st->M;
    st->tape = calloc(NL, sizeof *st->tape);
    st->y = calloc(NL, sizeof *st->y);
    st->so = calloc(NL, sizeof *st->so);
    st->dact = calloc(NL, sizeof *st->dact);
    st->dskip = calloc(NL, sizeof *st->dskip);
    st->input = calloc(M, sizeof(float *));
    st->cond = calloc(M, sizeof(float *));
    st->target = calloc(M, sizeof(float *));
    st->live = calloc(M, sizeof(int));
    if (!st->tape || !st->y || !st->so || !st->dact || !st->dskip || !st->input || !st->cond ||
        !st->target || !st->live)
        return xmp_train_fail("out of memory");
    st->edge[0] = xmp_sbp_s(0);
    for (int a = 1; a < XMP_MAX_MESH_DIMS; a++)
        st->edge[a] = xmp_sbp_b();
    /* parameters: this rank's blocks (the strategy's SBPs) of the full tensors from the seed */
    float *full = malloc(st->lay.total * sizeof(float));
    if (!full)
        return xmp_train_fail("out of memory");
    xmp_ut_params_init(&st->lay, st->o->seed, full);
    int rc = 0;
    if (xmp_overlap_from_env(&st->ov) != XMESH_SUCCESS)
        rc = xmp_train_fail("XMP_OVERLAP: %s", xmp_last_error());
    for (int l = st->first; l <= st->last && !rc; l++) {
        if (!(st->SL[l] = xmp_ut_slayer_create(&st->cfg, l, st->mbs, st->mesh, &st->strat,
                                               full + st->lay.layer_offset[l])))
            rc = xmp_train_fail("stage %d layer %s: %s", st->stage, xmp_ut_layer_name(l),
                                xmp_last_error());
        else
            xmp_ut_slayer_set_overlap(st->SL[l], &st->ov);
    }
    free(full);
    st->base_bytes = xmp_ut_mem_live_bytes();
    return rc;
}
