/* Meshes as plain data and the block math of a layout (numpy.array_split or
 * torch.chunk rule, xmesh_split_t). */
#include <stdlib.h>
#include <string.h>

#include "xm_core.h"

xmesh_result_t xm_meshdesc_check(const xm_meshdesc_t *m, int ndev_limit)
{
    if (!m)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "mesh is NULL");
    if (m->ndim < 1 || m->ndim > XM_MAX_MESH_DIMS)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "mesh ndim %d out of range [1, %d]", m->ndim,
                      XM_MAX_MESH_DIMS);
    int64_t n = 1;
    for (int a = 0; a < m->ndim; a++) {
        if (m->shape[a] < 1)
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "mesh shape[%d] = %d, must be >= 1", a,
                          m->shape[a]);
        n *= m->shape[a];
        if (n > (1 << 20))
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "mesh has more than 2^20 devices");
    }
    if (n != m->ndev)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "mesh lists %d devices but its shape holds %lld",
                      m->ndev, (long long)n);
    if (!m->devs)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "mesh device list is NULL");
    for (int i = 0; i < m->ndev; i++) {
        if (m->devs[i] < 0 || (ndev_limit > 0 && m->devs[i] >= ndev_limit))
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                          "mesh rank %d (entry %d) out of range [0, %d)", m->devs[i], i,
                          ndev_limit);
        for (int j = 0; j < i; j++)
            if (m->devs[j] == m->devs[i])
                return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                              "mesh rank %d listed twice (entries %d and %d)", m->devs[i], j, i);
    }
    return XMESH_SUCCESS;
}

void xm_mesh_coord(const xm_meshdesc_t *m, int i, int coord[XM_MAX_MESH_DIMS])
{
    for (int a = m->ndim - 1; a >= 0; a--) {
        coord[a] = i % m->shape[a];
        i /= m->shape[a];
    }
}

int xm_mesh_find(const xm_meshdesc_t *m, int dev)
{
    for (int i = 0; i < m->ndev; i++)
        if (m->devs[i] == dev)
            return i;
    return -1;
}

int64_t xm_layout_nshards(const xm_layout_t *l, int d)
{
    int64_t k = 1;
    for (int j = 0; j < l->spec.naxes[d]; j++)
        k *= l->mesh.shape[l->spec.axes[d][j]];
    return k;
}

int64_t xm_layout_shard_index(const xm_layout_t *l, int d, const int coord[XM_MAX_MESH_DIMS])
{
    int64_t idx = 0;
    for (int j = 0; j < l->spec.naxes[d]; j++) {
        int a = l->spec.axes[d][j];
        idx = idx * l->mesh.shape[a] + coord[a];
    }
    return idx;
}

void xm_layout_dim_block(const xm_layout_t *l, int d, int64_t idx, int64_t *lo, int64_t *hi)
{
    int64_t n = l->shape[d];
    if (l->split != XMESH_SPLIT_TORCH) {
        xm_split(n, xm_layout_nshards(l, d), idx, lo, hi);
        return;
    }
    /* torch: chunk the dim by the major axis, that piece by the next, ...
     * idx is mixed radix over the axes, major first (xm_layout_shard_index). */
    int64_t digit[XM_MAX_MESH_DIMS];
    for (int j = l->spec.naxes[d] - 1; j >= 0; j--) {
        int64_t k = l->mesh.shape[l->spec.axes[d][j]];
        digit[j] = idx % k;
        idx /= k;
    }
    int64_t a = 0, b = n;
    for (int j = 0; j < l->spec.naxes[d]; j++) {
        int64_t plo, phi;
        xm_split_torch(b - a, l->mesh.shape[l->spec.axes[d][j]], digit[j], &plo, &phi);
        b = a + phi;
        a += plo;
    }
    *lo = a;
    *hi = b;
}

int64_t xm_layout_shard_at(const xm_layout_t *l, int d, int64_t pos)
{
    int64_t n = l->shape[d];
    if (l->split != XMESH_SPLIT_TORCH) {
        int64_t k = xm_layout_nshards(l, d), base = n / k, rem = n % k;
        if (rem == 0)
            return base ? pos / base : 0;
        int64_t big = rem * (base + 1); /* rem > 0: k >= 2, so base + 1 <= n, big <= n */
        if (pos < big)
            return pos / (base + 1);
        return rem + (pos - big) / base;
    }
    /* torch: the digit of each axis, major first, inside the piece left. */
    int64_t idx = 0, a = 0, len = n;
    for (int j = 0; j < l->spec.naxes[d]; j++) {
        int64_t k = l->mesh.shape[l->spec.axes[d][j]];
        int64_t c = len / k + (len % k != 0); /* pos in [a, a + len): len >= 1 */
        int64_t q = (pos - a) / c;
        idx = idx * k + q;
        a += q * c;
        len = len - q * c < c ? len - q * c : c;
    }
    return idx;
}

void xm_layout_block(const xm_layout_t *l, int i, int64_t *lo, int64_t *hi)
{
    int coord[XM_MAX_MESH_DIMS];
    xm_mesh_coord(&l->mesh, i, coord);
    for (int d = 0; d < l->ndim; d++)
        xm_layout_dim_block(l, d, xm_layout_shard_index(l, d, coord), &lo[d], &hi[d]);
}

int64_t xm_layout_block_volume(const xm_layout_t *l, int i)
{
    int64_t lo[XM_MAX_DIMS], hi[XM_MAX_DIMS], v = 1;
    xm_layout_block(l, i, lo, hi);
    for (int d = 0; d < l->ndim; d++)
        v *= hi[d] - lo[d];
    return v;
}
