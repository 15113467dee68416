/* The sharded-parameter engine (see param.h). */
#include "nn/param.h"

#include <stdlib.h>
#include <string.h>

static void zero(xmp_tensor_t *t)
{
    xmp_tensor_free(t);
    memset(t, 0, sizeof *t);
}

void xmp_param_acc_sbp(const xmp_sbp_t *s, xmp_sbp_t *g)
{
    for (int a = 0; a < XMP_MAX_MESH_DIMS; a++)
        g[a] = s[a].kind == XMP_B ? xmp_sbp_p() : s[a];
}

void xmp_param_free(xmp_param_t *p)
{
    if (!p)
        return;
    xmp_tensor_t t;
    if (p->red && xmp_box_wait(p->red, &t) == XMESH_SUCCESS)
        xmp_tensor_free(&t);
    if (p->pre && xmp_box_wait(p->pre, &t) == XMESH_SUCCESS)
        xmp_tensor_free(&t);
    xmp_tensor_free(&p->w);
    xmp_tensor_free(&p->g);
    xmp_tensor_free(&p->r);
    xmp_tensor_free(&p->s);
    for (int k = 0; k < XMP_PARAM_MAX_STATE; k++)
        free(p->state[k]);
    memset(p, 0, sizeof *p);
}

xmesh_result_t xmp_param_init(xmp_param_t *p, xmp_mesh_t *mesh, int ndim, const int64_t *shape,
                              const xmp_sbp_t *compute, const xmp_sbp_t *store, const float *full,
                              int nstate, const xmp_sbp_t *acc_sbp)
{
    xmesh_result_t r;
    if (!p || !mesh || !shape || !compute || !full || nstate < 0 || nstate > XMP_PARAM_MAX_STATE)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "param init: bad argument (nstate %d)", nstate);
    memset(p, 0, sizeof *p);
    p->nstate = nstate;
    for (int a = 0; store && a < mesh->ndim; a++)
        p->sharded |= !xmp_sbp_eq(store[a], compute[a]);
    if ((r = xmp_tensor_alloc(&p->w, mesh, ndim, shape, XMESH_F32, compute)) ||
        (r = xmp_tensor_fill_from_full(&p->w, full)))
        goto out_free;
    if (p->sharded && ((r = xmp_tensor_alloc(&p->s, mesh, ndim, shape, XMESH_F32, store)) ||
                       (r = xmp_tensor_fill_from_full(&p->s, full))))
        goto out_free;
    if (acc_sbp && (r = xmp_tensor_alloc(&p->g, mesh, ndim, shape, XMESH_F32, acc_sbp)))
        goto out_free;
    for (int k = 0; k < nstate; k++)
        if (!(p->state[k] = calloc((size_t)xmp_param_stored(p)->lcount + 1, sizeof(float)))) {
            r = xmp_err(XMESH_ERR_NO_MEMORY, "param init: optimizer state of %lld floats",
                        (long long)xmp_param_stored(p)->lcount);
            goto out_free;
        }
    return XMESH_SUCCESS;
out_free:
    xmp_param_free(p);
    return r;
}

xmp_tensor_t *xmp_param_stored(xmp_param_t *p)
{
    return p->sharded ? &p->s : &p->w;
}

const xmp_tensor_t *xmp_param_stored_c(const xmp_param_t *p)
{
    return p->sharded ? &p->s : &p->w;
}

static int same_layout(const xmp_tensor_t *a, const xmp_tensor_t *b)
{
    for (int k = 0; k < a->mesh->ndim; k++)
        if (!xmp_sbp_eq(a->sbp[k], b->sbp[k]))
            return 0;
    return a->lcount == b->lcount;
}

xmesh_result_t xmp_param_acc(xmp_param_t *p, xmp_tensor_t *d)
{
    if (!d->mesh)
        return XMESH_SUCCESS;
    if (!p->g.mesh) {
        p->g = *d;
        memset(d, 0, sizeof *d);
        return XMESH_SUCCESS;
    }
    xmesh_result_t r = same_layout(&p->g, d) ? XMESH_SUCCESS : xmp_box_inplace(d, p->g.sbp);
    if (!r && d->lcount != p->g.lcount)
        r = xmp_err(XMESH_ERR_INTERNAL, "param: gradient block of %lld floats, accumulator %lld",
                    (long long)d->lcount, (long long)p->g.lcount);
    if (!r) {
        float *a = xmp_f32(&p->g);
        const float *b = xmp_f32(d);
        for (int64_t i = 0; i < p->g.lcount; i++)
            a[i] += b[i];
    }
    zero(d);
    return r;
}

static xmesh_result_t check_r(xmp_param_t *p)
{
    if (p->r.lcount != xmp_param_stored(p)->lcount) {
        zero(&p->r);
        return xmp_err(XMESH_ERR_INTERNAL, "param: reduced gradient has %lld floats, storage %lld",
                       (long long)p->r.lcount, (long long)xmp_param_stored(p)->lcount);
    }
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_param_reduce(xmp_param_t *p)
{
    zero(&p->r);
    if (!p->g.mesh)
        return XMESH_SUCCESS;
    xmesh_result_t r = xmp_box(&p->g, xmp_param_stored(p)->sbp, &p->r);
    return r ? r : check_r(p);
}

xmesh_result_t xmp_param_reduce_start(xmp_param_t *p)
{
    zero(&p->r);
    if (!p->g.mesh || p->red)
        return p->red ? xmp_err(XMESH_ERR_INVALID_ARGUMENT, "param: a reduction is in flight")
                      : XMESH_SUCCESS;
    return xmp_box_start(&p->g, xmp_param_stored(p)->sbp, &p->red);
}

xmesh_result_t xmp_param_reduce_wait(xmp_param_t *p)
{
    if (!p->red)
        return XMESH_SUCCESS;
    xmesh_result_t r = xmp_box_wait(p->red, &p->r);
    p->red = NULL;
    return r ? r : check_r(p);
}

static xmesh_result_t take_w(xmp_param_t *p, xmp_tensor_t *c)
{
    if (c->lcount != p->w.lcount) {
        xmp_tensor_free(c);
        return xmp_err(XMESH_ERR_INTERNAL, "param: gathered copy has %lld floats, compute %lld",
                       (long long)c->lcount, (long long)p->w.lcount);
    }
    xmp_tensor_free(&p->w);
    p->w = *c;
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_param_gather(xmp_param_t *p)
{
    xmp_tensor_t c;
    memset(&c, 0, sizeof c);
    if (!p->sharded)
        return XMESH_SUCCESS;
    xmesh_result_t r = xmp_box(&p->s, p->w.sbp, &c);
    return r ? r : take_w(p, &c);
}

xmesh_result_t xmp_param_gather_start(xmp_param_t *p)
{
    if (!p->sharded)
        return XMESH_SUCCESS;
    if (p->pre)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "param: a gather is in flight");
    return xmp_box_start(&p->s, p->w.sbp, &p->pre);
}

xmesh_result_t xmp_param_gather_wait(xmp_param_t *p)
{
    xmp_tensor_t c;
    memset(&c, 0, sizeof c);
    if (!p->pre)
        return XMESH_SUCCESS;
    xmesh_result_t r = xmp_box_wait(p->pre, &c);
    p->pre = NULL;
    return r ? r : take_w(p, &c);
}

void xmp_param_zero_grad(xmp_param_t *p, int free_g)
{
    zero(&p->r);
    if (free_g)
        zero(&p->g);
    else if (p->g.lcount)
        memset(p->g.data, 0, (size_t)p->g.lcount * sizeof(float));
}

void xmp_param_bytes(const xmp_param_t *p, xmp_param_bytes_t *b)
{
    int64_t n = xmp_param_stored_c(p)->lcount * (int64_t)sizeof(float);
    b->param += n;
    b->optimizer += n * p->nstate;
    b->compute += p->w.lcount * (int64_t)sizeof(float);
    b->grad += p->g.lcount * (int64_t)sizeof(float);
}
