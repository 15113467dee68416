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

int xmp_ut_tp_gather_channels(void *mesh, const float *local, float *full, int n, int c, int hw)
{
    xmp_mesh_t *m = mesh;
    if (!m || m->ndim != 2)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "tp gather: needs a 2-D dp x tp mesh"), -1;
    size_t all = (size_t)n * (size_t)c * (size_t)hw;
    if (m->shape[1] == 1) {
        memcpy(full, local, all * sizeof(float));
        return 0;
    }
    int64_t shape[3] = {(int64_t)n * m->shape[0], c, hw};
    xmp_sbp_t src[2] = {xmp_sbp_s(0), xmp_sbp_s(1)}, dst[2] = {xmp_sbp_s(0), xmp_sbp_b()};
    xmp_tensor_t t, y;
    memset(&y, 0, sizeof y);
    if (xmp_tensor_alloc(&t, m, 3, shape, XMESH_F32, src) != XMESH_SUCCESS)
        return -1;
    if (t.lshape[0] != n || t.lshape[1] * m->shape[1] != c) {
        xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                "tp gather: %d channels do not split evenly over tp %d (local block %lld x %lld)",
                c, m->shape[1], (long long)t.lshape[0], (long long)t.lshape[1]);
        xmp_tensor_free(&t);
        return -1;
    }
    memcpy(t.data, local, (size_t)t.lcount * sizeof(float));
    int rc = xmp_box(&t, dst, &y) != XMESH_SUCCESS || (size_t)y.lcount != all;
    if (!rc)
        memcpy(full, y.data, all * sizeof(float));
    xmp_tensor_free(&t);
    xmp_tensor_free(&y);
    return rc ? -1 : 0;
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
