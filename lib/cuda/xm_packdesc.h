/*
 * Pack/unpack index mapping shared by the CUDA kernels (lib/cuda/kernels.cu)
 * and the CPU reference (lib/cuda/devplan.c): one definition, compiled by
 * both nvcc and the C compiler, so the CPU unit tests exercise the very
 * arithmetic the kernels run.
 *
 * A descriptor maps packed element k of a box (row-major over the box's
 * extents) to the element index inside a dense row-major local block. With
 * first > 0 it describes the linear range [first, first + count) of the
 * box's row-major order instead (the all-gather strategies move 1/k of a
 * box, which is not a box).
 * Plain C, no dependencies beyond <stdint.h>.
 */
#ifndef XM_PACKDESC_H
#define XM_PACKDESC_H

#include <stdint.h>

#ifdef __CUDACC__
#define XM_HD __host__ __device__
#else
#define XM_HD
#endif

#define XM_PACK_MAX_DIMS 8

typedef struct xm_packdesc {
    int ndim;                         /* >= 1 after coalescing */
    int64_t ext[XM_PACK_MAX_DIMS];    /* box extents, coalesced */
    int64_t stride[XM_PACK_MAX_DIMS]; /* block element stride of each dim */
    int64_t base;                     /* block element index of the box origin */
    int64_t first;                    /* first box element described (row-major) */
    int64_t count;                    /* elements described */
} xm_packdesc_t;

/* Block element index of packed element k (0 <= k < d->count). */
static inline XM_HD int64_t xm_pack_index(const xm_packdesc_t *d, int64_t k)
{
    int64_t idx = d->base;
    k += d->first;
    for (int i = d->ndim - 1; i > 0; i--) {
        int64_t q = k / d->ext[i];
        idx += (k - q * d->ext[i]) * d->stride[i];
        k = q;
    }
    return idx + k * d->stride[0];
}

/* 1 when the described elements are one contiguous run of the block
 * (then a memcpy of count elements from xm_pack_index(d, 0) does it). */
static inline XM_HD int xm_pack_contiguous(const xm_packdesc_t *d)
{
    return d->ndim == 1 && d->stride[0] == 1;
}

#endif /* XM_PACKDESC_H */
