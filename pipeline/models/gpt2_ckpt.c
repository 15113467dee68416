/* GPT-2 stages in distributed checkpoints: see gpt2_ckpt.h. */
#include "models/gpt2_ckpt.h"

#include "models/llmc_io.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The model configuration as metadata (also the load's expectations). */
static xmesh_result_t cfg_meta(const xmp_gpt2_config_t *c, xmp_ckpt_metalist_t *m)
{
    xmesh_result_t r = xmp_ckpt_metalist_setf(m, "model", "%s", XMP_GPT2_CKPT_MODEL);
    if (!r)
        r = xmp_ckpt_metalist_setf(m, "config.max_seq_len", "%d", c->max_seq_len);
    if (!r)
        r = xmp_ckpt_metalist_setf(m, "config.vocab_size", "%d", c->vocab_size);
    if (!r)
        r = xmp_ckpt_metalist_setf(m, "config.padded_vocab_size", "%d", c->padded_vocab_size);
    if (!r)
        r = xmp_ckpt_metalist_setf(m, "config.num_layers", "%d", c->num_layers);
    if (!r)
        r = xmp_ckpt_metalist_setf(m, "config.num_heads", "%d", c->num_heads);
    if (!r)
        r = xmp_ckpt_metalist_setf(m, "config.channels", "%d", c->channels);
    return r;
}

xmesh_result_t xmp_gpt2_ckpt_meta(const xmp_gpt2_stage_t *st, int64_t step, xmp_ckpt_metalist_t *m)
{
    const xmp_gpt2_train_cfg_t *tc = xmp_gpt2_stage_train_cfg(st);
    char lay[256] = "", meshes[256] = "";
    xmp_stage_layout_format(xmp_gpt2_stage_layout(st), lay, sizeof lay);
    xmp_stage_layout_format_meshes(xmp_gpt2_stage_layout(st), meshes, sizeof meshes);
    xmesh_result_t r = cfg_meta(xmp_gpt2_stage_config(st), m);
    if (!r)
        r = xmp_ckpt_metalist_setf(m, "adamw.lr", "%.17g", (double)tc->lr);
    if (!r)
        r = xmp_ckpt_metalist_setf(m, "adamw.beta1", "%.17g", (double)tc->beta1);
    if (!r)
        r = xmp_ckpt_metalist_setf(m, "adamw.beta2", "%.17g", (double)tc->beta2);
    if (!r)
        r = xmp_ckpt_metalist_setf(m, "adamw.eps", "%.17g", (double)tc->eps);
    if (!r)
        r = xmp_ckpt_metalist_setf(m, "adamw.weight_decay", "%.17g", (double)tc->wd);
    if (!r)
        r = xmp_ckpt_metalist_setf(m, "adamw.t", "%lld", (long long)step);
    if (!r)
        r = xmp_ckpt_metalist_setf(m, "train.batch", "%d", tc->B);
    if (!r)
        r = xmp_ckpt_metalist_setf(m, "train.seq", "%d", tc->T);
    if (!r)
        r = xmp_ckpt_metalist_setf(m, "layout", "%s", lay);
    if (!r)
        r = xmp_ckpt_metalist_setf(m, "layout.meshes", "%s", meshes);
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

/* The checkpoint entries of this rank: param, .adam_m, .adam_v of every named tensor
 * (tied: 0 the primary copies, 1 only the tied wte copy). Names are stored in *names. */
static int entries(xmp_gpt2_named_t *nt, int n, int tied, xmp_ckpt_tensor_t **out,
                   char (**names)[XMP_CKPT_NAME_MAX], xmp_sbp_t (**store)[XMP_MAX_MESH_DIMS])
{
    *out = calloc((size_t)(3 * n + 1), sizeof **out);
    *names = calloc((size_t)(3 * n + 1), sizeof **names);
    *store = calloc((size_t)(3 * n + 1), sizeof **store);
    if (!*out || !*names || !*store)
        return -1;
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (nt[i].tied_copy != tied)
            continue;
        xmp_tensor_t *t[3] = {nt[i].param, &nt[i].m, &nt[i].v};
        const char *suf[3] = {"", ".adam_m", ".adam_v"};
        for (int j = 0; j < 3; j++, k++) {
            snprintf((*names)[k], XMP_CKPT_NAME_MAX, "%s%s", nt[i].name, suf[j]);
            (*out)[k].name = (*names)[k];
            (*out)[k].t = t[j];
            (*out)[k].store = store_sbp(t[j], (*store)[k]);
        }
    }
    return k;
}

xmesh_result_t xmp_gpt2_ckpt_save(xmp_gpt2_stage_t *st, MPI_Comm comm, const char *root,
                                  int64_t step, int keep, const xmp_ckpt_kv_t *extra, int nextra)
{
    xmp_ckpt_metalist_t m = {0};
    xmp_gpt2_named_t *nt = NULL;
    xmp_ckpt_tensor_t *ts = NULL;
    char(*names)[XMP_CKPT_NAME_MAX] = NULL;
    xmp_sbp_t(*store)[XMP_MAX_MESH_DIMS] = NULL;
    xmesh_result_t r = xmp_gpt2_ckpt_meta(st, step, &m);
    for (int i = 0; !r && i < nextra; i++)
        r = xmp_ckpt_metalist_setf(&m, extra[i].key, "%s", extra[i].value);
    int n = xmp_gpt2_stage_named(st, &nt), k = 0;
    int bad = r || n < 0 || (k = entries(nt, n < 0 ? 0 : n, 0, &ts, &names, &store)) < 0, any = 0;
    any = bad;
    xmesh_result_t ar = xmp_agree(&any, 1, MPI_INT, MPI_MAX, comm, "gpt2 save");
    if (ar)
        r = ar;
    else if (any)
        r = xmp_err(XMESH_ERR_NO_MEMORY, "gpt2 checkpoint save: out of memory");
    else
        r = xmp_ckpt_save(comm, root, step, ts, k, m.kv, m.n, keep);
    free(ts);
    free(names);
    free(store);
    free(nt);
    xmp_ckpt_metalist_free(&m);
    return r;
}

xmesh_result_t xmp_gpt2_ckpt_open(MPI_Comm comm, const char *path, xmp_ckpt_t **out,
                                  xmp_gpt2_ckpt_settings_t *s)
{
    *out = NULL;
    xmp_ckpt_t *c = NULL;
    xmesh_result_t r = xmp_ckpt_open(comm, path, &c);
    if (r)
        return r;
    /* Everything below is local and reads the same manifest on every rank. */
    const char *model = xmp_ckpt_meta(c, "model");
    xmp_gpt2_ckpt_settings_t t;
    memset(&t, 0, sizeof t);
    if (!model || strcmp(model, XMP_GPT2_CKPT_MODEL) != 0)
        r = xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                    "%s/MANIFEST: metadata 'model' is '%s', expected '%s' (a checkpoint of "
                    "another model?)",
                    xmp_ckpt_dir(c), model ? model : "(missing)", XMP_GPT2_CKPT_MODEL);
    if (!r)
        r = xmp_ckpt_meta_int(c, "config.max_seq_len", 1, 1 << 24, &t.cfg.max_seq_len);
    if (!r)
        r = xmp_ckpt_meta_int(c, "config.vocab_size", 1, 1 << 24, &t.cfg.vocab_size);
    if (!r)
        r = xmp_ckpt_meta_int(c, "config.padded_vocab_size", 1, 1 << 24, &t.cfg.padded_vocab_size);
    if (!r)
        r = xmp_ckpt_meta_int(c, "config.num_layers", 1, 1 << 16, &t.cfg.num_layers);
    if (!r)
        r = xmp_ckpt_meta_int(c, "config.num_heads", 1, 1 << 16, &t.cfg.num_heads);
    if (!r)
        r = xmp_ckpt_meta_int(c, "config.channels", 1, 1 << 20, &t.cfg.channels);
    if (!r)
        r = xmp_ckpt_meta_f32(c, "adamw.lr", &t.lr);
    if (!r)
        r = xmp_ckpt_meta_f32(c, "adamw.beta1", &t.beta1);
    if (!r)
        r = xmp_ckpt_meta_f32(c, "adamw.beta2", &t.beta2);
    if (!r)
        r = xmp_ckpt_meta_f32(c, "adamw.eps", &t.eps);
    if (!r)
        r = xmp_ckpt_meta_f32(c, "adamw.weight_decay", &t.wd);
    if (!r)
        r = xmp_ckpt_meta_int(c, "train.batch", 1, 1 << 30, &t.batch);
    if (!r)
        r = xmp_ckpt_meta_int(c, "train.seq", 1, 1 << 30, &t.seq);
    if (!r && xmp_gpt2_config_check(&t.cfg) != 0)
        r = xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s/MANIFEST: invalid model configuration: %s",
                    xmp_ckpt_dir(c), xmp_last_error());
    t.step = xmp_ckpt_step(c);
    if (r) {
        xmp_ckpt_close(c);
        return r;
    }
    *s = t;
    *out = c;
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_gpt2_ckpt_load(xmp_gpt2_stage_t *st, MPI_Comm comm, xmesh_ctx_t ctx,
                                  const xmp_ckpt_t *ck)
{
    xmp_ckpt_metalist_t m = {0};
    xmp_gpt2_named_t *nt = NULL;
    xmp_ckpt_tensor_t *ts = NULL, *tt = NULL;
    char(*names)[XMP_CKPT_NAME_MAX] = NULL, (*tnames)[XMP_CKPT_NAME_MAX] = NULL;
    xmp_sbp_t(*store)[XMP_MAX_MESH_DIMS] = NULL, (*tstore)[XMP_MAX_MESH_DIMS] = NULL;
    xmesh_result_t r = cfg_meta(xmp_gpt2_stage_config(st), &m);
    int n = xmp_gpt2_stage_named(st, &nt), k = 0, kt = 0;
    int bad = r || n < 0 || (k = entries(nt, n < 0 ? 0 : n, 0, &ts, &names, &store)) < 0 ||
              (kt = entries(nt, n < 0 ? 0 : n, 1, &tt, &tnames, &tstore)) < 0,
        any = 0;
    any = bad;
    xmesh_result_t ar = xmp_agree(&any, 1, MPI_INT, MPI_MAX, comm, "gpt2 load");
    if (ar || any) {
        r = ar ? ar : xmp_err(XMESH_ERR_NO_MEMORY, "gpt2 checkpoint load: out of memory");
        goto out;
    }
    r = xmp_ckpt_load(comm, ctx, ck, ts, k, m.kv, m.n, XMP_CKPT_STRICT);
    /* The tied wte of a last stage other than the first: the same saved tensors loaded
     * again into that copy's layout (the shards were verified by the first load). */
    const xmp_stage_layout_t *sl = xmp_gpt2_stage_layout(st);
    if (!r && sl->stage_of[0] != sl->stage_of[sl->nitems - 1])
        r = xmp_ckpt_load(comm, ctx, ck, tt, kt, m.kv, m.n, XMP_CKPT_LOAD_NO_VERIFY);
    if (!r && xmp_gpt2_stage_params_changed(st) != 0)
        r = xmp_err(XMESH_ERR_INTERNAL, "gpt2 checkpoint load: gathering sharded parameters");
out:
    free(ts);
    free(tt);
    free(names);
    free(tnames);
    free(store);
    free(tstore);
    free(nt);
    xmp_ckpt_metalist_free(&m);
    return r;
}

xmesh_result_t xmp_gpt2_ckpt_to_llmc(MPI_Comm comm, const xmp_ckpt_t *ck, const char *file)
{
    xmp_gpt2_ckpt_settings_t s;
    memset(&s, 0, sizeof s);
    int rank;
    MPI_Comm_rank(comm, &rank);
    /* The configuration again from the opened manifest (local, the same on every rank). */
    const char *model = xmp_ckpt_meta(ck, "model");
    if (!model || strcmp(model, XMP_GPT2_CKPT_MODEL) != 0)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                       "%s/MANIFEST: metadata 'model' is '%s', expected '%s'", xmp_ckpt_dir(ck),
                       model ? model : "(missing)", XMP_GPT2_CKPT_MODEL);
    xmesh_result_t r = xmp_ckpt_meta_int(ck, "config.max_seq_len", 1, 1 << 24, &s.cfg.max_seq_len);
    if (!r)
        r = xmp_ckpt_meta_int(ck, "config.vocab_size", 1, 1 << 24, &s.cfg.vocab_size);
    if (!r)
        r = xmp_ckpt_meta_int(ck, "config.padded_vocab_size", 1, 1 << 24, &s.cfg.padded_vocab_size);
    if (!r)
        r = xmp_ckpt_meta_int(ck, "config.num_layers", 1, 1 << 16, &s.cfg.num_layers);
    if (!r)
        r = xmp_ckpt_meta_int(ck, "config.num_heads", 1, 1 << 16, &s.cfg.num_heads);
    if (!r)
        r = xmp_ckpt_meta_int(ck, "config.channels", 1, 1 << 20, &s.cfg.channels);
    if (r)
        return r;
    xmp_gpt2_t m;
    memset(&m, 0, sizeof m);
    int lbad = 0;
    if (rank == 0 && xmp_gpt2_init_random(&m, &s.cfg, 0) != 0)
        lbad = 1;
    int any = lbad;
    if ((r = xmp_agree(&any, 1, MPI_INT, MPI_MAX, comm, "gpt2 export configuration")))
        return r;
    if (any)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: model configuration: %s", xmp_ckpt_dir(ck),
                       xmp_last_error());
    int one = 1, r0 = 0;
    xmp_mesh_t *mesh = NULL;
    r = xmp_mesh_create(comm, NULL, 1, &one, &r0, &mesh);
    const int L = s.cfg.num_layers;
    static const char *const cls[XMP_GPT2_NUM_PARAM_TENSORS] = {
        "wte",   "wpe",   "ln1.w", "ln1.b", "qkv.w",    "qkv.b",    "attproj.w", "attproj.b",
        "ln2.w", "ln2.b", "fc.w",  "fc.b",  "fcproj.w", "fcproj.b", "lnf.w",     "lnf.b"};
    xmp_gpt2_param_info_t tab[XMP_GPT2_NUM_PARAM_TENSORS];
    size_t total = 0;
    xmp_gpt2_param_table(&s.cfg, tab, &total);
    /* One tensor at a time: a 1-device tensor on rank 0, loaded then copied into place. */
    for (int id = 0; !r && id < XMP_GPT2_NUM_PARAM_TENSORS; id++) {
        int nl = tab[id].per_layer ? L : 1;
        size_t per = tab[id].numel / (size_t)nl;
        for (int l = 0; !r && l < nl; l++) {
            char name[XMP_CKPT_NAME_MAX];
            if (tab[id].per_layer)
                snprintf(name, sizeof name, "h.%d.%s", l, cls[id]);
            else
                snprintf(name, sizeof name, "%s", cls[id]);
            int i = xmp_ckpt_find(ck, name);
            if (i < 0) {
                r = xmp_err(XMESH_ERR_INVALID_ARGUMENT, "tensor '%s' is not in checkpoint %s", name,
                            xmp_ckpt_dir(ck));
                break;
            }
            xmp_ckpt_tensor_info_t info;
            xmp_ckpt_tensor_info(ck, i, &info);
            xmp_tensor_t t;
            memset(&t, 0, sizeof t);
            xmp_sbp_t sb[1] = {xmp_sbp_b()};
            int ab = xmp_tensor_alloc(&t, mesh, info.ndim, info.shape, XMESH_F32, sb) != 0;
            int anyab = ab;
            xmesh_result_t ar = xmp_agree(&anyab, 1, MPI_INT, MPI_MAX, comm, "gpt2 export tensor");
            if (ar || anyab) {
                xmp_tensor_free(&t);
                r = ar ? ar : xmp_err(XMESH_ERR_NO_MEMORY, "tensor '%s': allocation failed", name);
                break;
            }
            xmp_ckpt_tensor_t e = {name, &t, NULL};
            r = xmp_ckpt_load(comm, NULL, ck, &e, rank == 0, NULL, 0,
                              id == 0 ? 0u : XMP_CKPT_LOAD_NO_VERIFY);
            if (!r && rank == 0) {
                if ((size_t)t.lcount != per)
                    r = xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                                "tensor '%s' has %lld elements, the model needs %zu", name,
                                (long long)t.lcount, per);
                else
                    memcpy(m.params + tab[id].offset + (size_t)l * per, t.data,
                           per * sizeof(float));
            }
            xmp_tensor_free(&t);
        }
    }
    int wbad = 0;
    if (!r && rank == 0 && xmp_gpt2_save(&m, file) != 0)
        wbad = 1;
    xmesh_result_t ar = xmp_agree(&wbad, 1, MPI_INT, MPI_MAX, comm, "gpt2 export write");
    if (!r && ar)
        r = ar;
    else if (!r && wbad)
        r = xmp_err(XMESH_ERR_SYSTEM, "%s: %s", file,
                    rank == 0 ? xmp_last_error() : "write failed");
    xmp_mesh_destroy(mesh);
    xmp_gpt2_free(&m);
    return r;
}
