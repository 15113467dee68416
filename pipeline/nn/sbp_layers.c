/* SBP layer norm, causal attention and the pure SBP deduction (contracts in
 * sbp_layers.h). */
#include <stdio.h>
#include <string.h>

#include "nn/sbp_layers.h"

void xmp_norm_cache_free(xmp_norm_cache_t *c)
{
    if (!c)
        return;
    xmp_tensor_free(&c->mean);
    xmp_tensor_free(&c->rstd);
    memset(c, 0, sizeof *c);
}

void xmp_attn_cache_free(xmp_attn_cache_t *c)
{
    if (!c)
        return;
    xmp_tensor_free(&c->att);
    memset(c, 0, sizeof *c);
}

xmesh_result_t xmp_layernorm_forward(const xmp_tensor_t *x, const xmp_tensor_t *w,
                                     const xmp_tensor_t *b, xmp_tensor_t *y,
                                     xmp_norm_cache_t *cache)
{
    (void)x, (void)w, (void)b, (void)y, (void)cache;
    return xmp_err(XMESH_ERR_UNSUPPORTED, "xmp_layernorm_forward: not implemented yet");
}

xmesh_result_t xmp_layernorm_backward(const xmp_tensor_t *dy, const xmp_tensor_t *x,
                                      const xmp_tensor_t *w, const xmp_norm_cache_t *cache,
                                      xmp_tensor_t *dx, xmp_tensor_t *dw, xmp_tensor_t *db)
{
    (void)dy, (void)x, (void)w, (void)cache, (void)dx, (void)dw, (void)db;
    return xmp_err(XMESH_ERR_UNSUPPORTED, "xmp_layernorm_backward: not implemented yet");
}

xmesh_result_t xmp_attention_forward(const xmp_tensor_t *qkv, xmp_tensor_t *y,
                                     xmp_attn_cache_t *cache)
{
    (void)qkv, (void)y, (void)cache;
    return xmp_err(XMESH_ERR_UNSUPPORTED, "xmp_attention_forward: not implemented yet");
}

xmesh_result_t xmp_attention_backward(const xmp_tensor_t *dy, const xmp_tensor_t *qkv,
                                      const xmp_attn_cache_t *cache, xmp_tensor_t *dqkv)
{
    (void)dy, (void)qkv, (void)cache, (void)dqkv;
    return xmp_err(XMESH_ERR_UNSUPPORTED, "xmp_attention_backward: not implemented yet");
}

int xmp_sbp_deduce(const char *op, int naxes, int nin, const int *in_ndim,
                   const xmp_sbp_t *const *in_sbp, xmp_sbp_t *out_sbp, char *err, size_t errlen)
{
    (void)naxes, (void)nin, (void)in_ndim, (void)in_sbp, (void)out_sbp;
    if (err && errlen)
        snprintf(err, errlen, "xmp_sbp_deduce: op '%s': not implemented yet", op ? op : "(null)");
    xmp_err(XMESH_ERR_UNSUPPORTED, "xmp_sbp_deduce: op '%s': not implemented yet",
            op ? op : "(null)");
    return -1;
}
