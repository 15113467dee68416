/* U-Transformer stages in distributed checkpoints: see utrans_ckpt.h. */
#include "models/utrans_ckpt.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/utransformer_plan.h"

static xmesh_result_t cfg_meta(const xmp_ut_config_t *c, xmp_ckpt_metalist_t *m)
{
    xmesh_result_t r = xmp_ckpt_metalist_setf(m, "model", "%s", XMP_UT_CKPT_MODEL);
    if (!r)
        r = xmp_ckpt_metalist_setf(m, "config.base", "%d", c->base);
    if (!r)
        r = xmp_ckpt_metalist_setf(m, "config.groups", "%d", c->groups);
    if (!r)
        r = xmp_ckpt_metalist_setf(m, "config.head_dim", "%d", c->head_dim);
    if (!r)
        r = xmp_ckpt_metalist_setf(m, "config.cond_dim", "%d", c->cond_dim);
    return r;
}

/* Storage SBP of a checkpoint entry: every B axis of t becomes S(d) on its largest
 * dim, so the replicas each write a slice of a replicated tensor (a local slice, no
 * communication) instead of the first replica writing all of it. NULL: t has no B axis (or
 * this rank holds no block of it). */
static const xmp_sbp_t *store_sbp(const xmp_tensor_t *t, xmp_sbp_t *store)
{
    if (!t->mesh || t->ndim < 1)
        return NULL;
    int d = 0, any = 0;
    for (int i = 1; i < t->ndim; i++)
        if (t->shape[i] > t->shape[d])
            d = i;
    for (int a = 0; a < t->mesh->ndim; a++) {
        store[a] = t->sbp[a];
        if (t->sbp[a].kind == XMP_B && t->mesh->shape[a] > 1) {
            store[a] = xmp_sbp_s(d);
            any = 1;
        }
    }
    return any ? store : NULL;
}

/* param and .momentum entries of this rank's layers; names kept in *nt. */
static int entries(xmp_ut_slayer_t *const *layers, xmp_ut_named_t **nt, xmp_ckpt_tensor_t **ts,
                   char (**names)[XMP_CKPT_NAME_MAX], xmp_sbp_t (**store)[XMP_MAX_MESH_DIMS])
{
    int cap = XMP_UT_LAYERS * XMP_UT_MAX_PT;
    *nt = calloc((size_t)cap, sizeof **nt);
    *ts = calloc((size_t)(2 * cap), sizeof **ts);
    *names = calloc((size_t)(2 * cap), sizeof **names);
    *store = calloc((size_t)(2 * cap), sizeof **store);
    if (!*nt || !*ts || !*names || !*store)
        return -1;
    int n = 0, k = 0;
    for (int l = 0; l < XMP_UT_LAYERS; l++)
        if (layers[l])
            n += xmp_ut_slayer_named(layers[l], *nt + n, cap - n);
    for (int i = 0; i < n; i++) {
        snprintf((*names)[k], XMP_CKPT_NAME_MAX, "%s", (*nt)[i].name);
        (*ts)[k].name = (*names)[k];
        (*ts)[k].t = (*nt)[i].param;
        (*ts)[k].store = store_sbp((*nt)[i].param, (*store)[k]);
        k++;
        snprintf((*names)[k], XMP_CKPT_NAME_MAX, "%s.momentum", (*nt)[i].name);
        (*ts)[k].name = (*names)[k];
        (*ts)[k++].t = &(*nt)[i].vel;
    }
    return k;
}

xmesh_result_t xmp_ut_ckpt_save(xmp_ut_slayer_t *const *layers, MPI_Comm comm, const char *root,
                                int64_t step, int keep, const xmp_ut_ckpt_settings_t *s,
                                const xmp_ckpt_kv_t *extra, int nextra)
{
    xmp_ckpt_metalist_t m = {0};
    xmp_ut_named_t *nt = NULL;
    xmp_ckpt_tensor_t *ts = NULL;
    char(*names)[XMP_CKPT_NAME_MAX] = NULL;
    xmp_sbp_t(*store)[XMP_MAX_MESH_DIMS] = NULL;
    xmesh_result_t r = cfg_meta(&s->cfg, &m);
    if (!r)
        r = xmp_ckpt_metalist_setf(&m, "sgd.lr", "%.17g", (double)s->lr);
    if (!r)
        r = xmp_ckpt_metalist_setf(&m, "sgd.momentum", "%.17g", (double)s->momentum);
    if (!r)
        r = xmp_ckpt_metalist_setf(&m, "sgd.weight_decay", "%.17g", (double)s->wd);
    if (!r)
        r = xmp_ckpt_metalist_setf(&m, "train.batch", "%d", s->batch);
    if (!r)
        r = xmp_ckpt_metalist_setf(&m, "data.noise", "%.17g", (double)s->sigma);
    if (!r)
        r = xmp_ckpt_metalist_setf(&m, "seed", "%llu", (unsigned long long)s->seed);
    for (int i = 0; !r && i < nextra; i++)
        r = xmp_ckpt_metalist_setf(&m, extra[i].key, "%s", extra[i].value);
    int k = 0;
    int bad = r || (k = entries(layers, &nt, &ts, &names, &store)) < 0, any = 0;
    any = bad;
    xmesh_result_t ar = xmp_agree(&any, 1, MPI_INT, MPI_MAX, comm, "ut save");
    if (ar)
        r = ar;
    else if (any)
        r = xmp_err(XMESH_ERR_NO_MEMORY, "utransformer checkpoint save: out of memory");
    else
        r = xmp_ckpt_save(comm, root, step, ts, k, m.kv, m.n, keep);
    free(ts);
    free(names);
    free(store);
    free(nt);
    xmp_ckpt_metalist_free(&m);
    return r;
}

xmesh_result_t xmp_ut_ckpt_open(MPI_Comm comm, const char *path, xmp_ckpt_t **out,
                                xmp_ut_ckpt_settings_t *s)
{
    *out = NULL;
    xmp_ckpt_t *c = NULL;
    xmesh_result_t r = xmp_ckpt_open(comm, path, &c);
    if (r)
        return r;
    const char *model = xmp_ckpt_meta(c, "model"), *seed = xmp_ckpt_meta(c, "seed");
    xmp_ut_ckpt_settings_t t;
    memset(&t, 0, sizeof t);
    int base = 0, groups = 0, hd = 0, cond = 0;
    if (!model || strcmp(model, XMP_UT_CKPT_MODEL) != 0)
        r = xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                    "%s/MANIFEST: metadata 'model' is '%s', expected '%s' (a checkpoint of "
                    "another model?)",
                    xmp_ckpt_dir(c), model ? model : "(missing)", XMP_UT_CKPT_MODEL);
    if (!r)
        r = xmp_ckpt_meta_int(c, "config.base", 1, 1 << 16, &base);
    if (!r)
        r = xmp_ckpt_meta_int(c, "config.groups", 1, 1 << 16, &groups);
    if (!r)
        r = xmp_ckpt_meta_int(c, "config.head_dim", 1, 1 << 16, &hd);
    if (!r)
        r = xmp_ckpt_meta_int(c, "config.cond_dim", 1, 1 << 20, &cond);
    if (!r)
        r = xmp_ckpt_meta_f32(c, "sgd.lr", &t.lr);
    if (!r)
        r = xmp_ckpt_meta_f32(c, "sgd.momentum", &t.momentum);
    if (!r)
        r = xmp_ckpt_meta_f32(c, "sgd.weight_decay", &t.wd);
    if (!r)
        r = xmp_ckpt_meta_f32(c, "data.noise", &t.sigma);
    if (!r)
        r = xmp_ckpt_meta_int(c, "train.batch", 1, 1 << 30, &t.batch);
    if (!r) {
        char *end = NULL;
        errno = 0;
        t.seed = seed ? strtoull(seed, &end, 10) : 0;
        if (!seed || !*seed || *end || errno)
            r = xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                        "%s/MANIFEST: metadata 'seed' = '%s' is not an unsigned integer",
                        xmp_ckpt_dir(c), seed ? seed : "(missing)");
    }
    if (!r && (xmp_ut_config_init(&t.cfg, base, groups, hd) != 0 || t.cfg.cond_dim != cond))
        r = xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                    "%s/MANIFEST: invalid model configuration (base %d, groups %d, head_dim %d, "
                    "cond_dim %d)",
                    xmp_ckpt_dir(c), base, groups, hd, cond);
    t.step = xmp_ckpt_step(c);
    if (r) {
        xmp_ckpt_close(c);
        return r;
    }
    *s = t;
    *out = c;
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_ut_ckpt_load(xmp_ut_slayer_t *const *layers, MPI_Comm comm, xmesh_ctx_t ctx,
                                const xmp_ckpt_t *ck, const xmp_ut_config_t *cfg)
{
    xmp_ckpt_metalist_t m = {0};
    xmp_ut_named_t *nt = NULL;
    xmp_ckpt_tensor_t *ts = NULL;
    char(*names)[XMP_CKPT_NAME_MAX] = NULL;
    xmp_sbp_t(*store)[XMP_MAX_MESH_DIMS] = NULL;
    xmesh_result_t r = cfg_meta(cfg, &m);
    int k = 0;
    int bad = r || (k = entries(layers, &nt, &ts, &names, &store)) < 0, any = 0;
    any = bad;
    xmesh_result_t ar = xmp_agree(&any, 1, MPI_INT, MPI_MAX, comm, "ut load");
    if (ar)
        r = ar;
    else if (any)
        r = xmp_err(XMESH_ERR_NO_MEMORY, "utransformer checkpoint load: out of memory");
    else
        r = xmp_ckpt_load(comm, ctx, ck, ts, k, m.kv, m.n, XMP_CKPT_STRICT);
    /* sharded storage: the loaded shards into the compute copies (every rank: collective) */
    for (int l = 0; !any && l < XMP_UT_LAYERS; l++)
        if (layers[l] && xmp_ut_slayer_sync(layers[l]) != 0 && !r)
            r = xmp_err(XMESH_ERR_INTERNAL, "utransformer checkpoint load: %s", xmp_last_error());
    free(ts);
    free(names);
    free(store);
    free(nt);
    xmp_ckpt_metalist_free(&m);
    return r;
}
