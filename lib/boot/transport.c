/* Transport names, and the UCX entry point of a build without UCX. */
#include "xm_api.h"
#include "xmesh/ucx.h"

const char *xmesh_ctx_transport(xmesh_ctx_t ctx)
{
    return ctx && ctx->ops ? ctx->ops->name : "";
}

#ifndef XMESH_HAVE_UCX
xmesh_result_t xmesh_ctx_create_ucx(const xmesh_oob_t *oob, const xmesh_ctx_params_t *params,
                                    xmesh_ctx_t *out)
{
    (void)oob;
    (void)params;
    (void)out;
    return XM_ERR(XMESH_ERR_UNSUPPORTED,
                  "xmesh_ctx_create_ucx: libxmesh was built without UCX (install libucx-dev and "
                  "reconfigure)");
}
#endif
