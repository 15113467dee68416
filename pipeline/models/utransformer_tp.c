/* SBP boxing for U-Transformer stages: see utransformer_tp.h. */
#include "models/utransformer_tp.h"

#include <string.h>

/* Boxes the local block buf (count floats) of a 1-D global tensor of `global` floats from SBP
 * src to dst on mesh, in place. */
static int box_flat(xmp_mesh_t *m, float *buf, size_t count, int64_t global, const xmp_sbp_t *src,
                    const xmp_sbp_t *dst)
{
    xmp_tensor_t t;
    if (xmp_tensor_alloc(&t, m, 1, &global, XMESH_F32, src) != XMESH_SUCCESS)
        return -1;
    if ((size_t)t.lcount != count) {
        xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                "boxing %s: local block of %lld floats, the buffer has %zu", t.spec,
                (long long)t.lcount, count);
        xmp_tensor_free(&t);
        return -1;
    }
    memcpy(t.data, buf, count * sizeof(float));
    if (xmp_box_inplace(&t, dst) != XMESH_SUCCESS || (size_t)t.lcount != count) {
        xmp_tensor_free(&t);
        return -1;
    }
    memcpy(buf, t.data, count * sizeof(float));
    xmp_tensor_free(&t);
    return 0;
}

int xmp_ut_tp_box_p_to_b(void *mesh, float *buf, size_t count)
{
    xmp_mesh_t *m = mesh;
    if (!m || m->ndim != 2)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "tp boxing: needs a 2-D dp x tp mesh"), -1;
    if (m->shape[1] == 1)
        return 0;
    xmp_sbp_t src[2] = {xmp_sbp_s(0), xmp_sbp_p()}, dst[2] = {xmp_sbp_s(0), xmp_sbp_b()};
    return box_flat(m, buf, count, (int64_t)count * m->shape[0], src, dst);
}

int xmp_ut_dp_reduce(xmp_mesh_t *m, float *grads, size_t count)
{
    if (!m || m->ndim != 2)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "dp reduce: needs a 2-D dp x tp mesh"), -1;
    if (m->shape[0] == 1)
        return 0;
    xmp_sbp_t src[2] = {xmp_sbp_p(), xmp_sbp_s(0)}, dst[2] = {xmp_sbp_b(), xmp_sbp_s(0)};
    return box_flat(m, grads, count, (int64_t)count * m->shape[1], src, dst);
}
