/*
 * Device kernels of the NCCL backend (lib/cuda/kernels.cu): pack a box of a
 * local block into a contiguous staging slot, unpack it, copy a box between
 * two blocks, and add a partial sum. Every launch is asynchronous on the
 * given stream and returns the launch status (cudaSuccess or the error of
 * the launch itself; execution errors surface at the next synchronisation).
 * The index mapping is xm_pack_index() of xm_packdesc.h, the same code the
 * CPU reference in devplan.c runs; conversions round to nearest even like
 * xm_f32_to_f16()/xm_f32_to_bf16().
 */
#ifndef XM_CUDA_KERNELS_H
#define XM_CUDA_KERNELS_H

#include <cuda_runtime_api.h>
#include <stddef.h>

#include "xm_packdesc.h"

#ifdef __cplusplus
extern "C" {
#endif

/* packed[k] = block[d(k)]; with to_acc and an f16/bf16 dtype the slot gets
 * f32 values (accumulator of a partial-sum chain). dtype is xmesh_dtype_t. */
cudaError_t xm_cuda_pack(const xm_packdesc_t *d, const void *block, void *packed, int dtype,
                         int to_acc, cudaStream_t s);
/* block[d(k)] = packed[k]. */
cudaError_t xm_cuda_unpack(const xm_packdesc_t *d, const void *packed, void *block,
                           size_t elem_size, cudaStream_t s);
/* dblock[dd(k)] = sblock[sd(k)] (a local copy: both blocks on this device). */
cudaError_t xm_cuda_copy(const xm_packdesc_t *sd, const void *sblock, const xm_packdesc_t *dd,
                         void *dblock, size_t elem_size, cudaStream_t s);
/* acc[k] += block[d(k)], in f32 for f16/bf16 (acc holds f32 when is_acc);
 * the result goes to out (dtype) when out != NULL, else back to acc.
 * Integers wrap. */
cudaError_t xm_cuda_reduce(const xm_packdesc_t *d, const void *block, void *acc, int is_acc,
                           void *out, int dtype, cudaStream_t s);

#ifdef __cplusplus
}
#endif
#endif /* XM_CUDA_KERNELS_H */
