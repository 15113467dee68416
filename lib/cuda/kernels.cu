/* Pack/unpack/copy/reduce kernels of the NCCL backend (xm_cuda_kernels.h).
 * Grid-stride loops over packed elements; the index math is the shared
 * xm_pack_index() so the CPU tests check the mapping these kernels use. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "xm_cuda_kernels.h"
#include "xmesh.h"

namespace
{

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;

inline unsigned blocks_for(int64_t n)
{
    int64_t b = (n + kThreads - 1) / kThreads;
    return (unsigned)(b < 1 ? 1 : (b > kMaxBlocks ? kMaxBlocks : b));
}

/* Elements are moved as opaque words of their size: pack/unpack never look
 * at values, so one instantiation per size covers every dtype. */
template <typename W> __global__ void pack_k(xm_packdesc_t d, const W *block, W *packed)
{
    for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < d.count;
         k += (int64_t)gridDim.x * blockDim.x)
        packed[k] = block[xm_pack_index(&d, k)];
}

template <typename W> __global__ void unpack_k(xm_packdesc_t d, const W *packed, W *block)
{
    for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < d.count;
         k += (int64_t)gridDim.x * blockDim.x)
        block[xm_pack_index(&d, k)] = packed[k];
}

template <typename W>
__global__ void copy_k(xm_packdesc_t sd, const W *sblock, xm_packdesc_t dd, W *dblock)
{
    for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < sd.count;
         k += (int64_t)gridDim.x * blockDim.x)
        dblock[xm_pack_index(&dd, k)] = sblock[xm_pack_index(&sd, k)];
}

__device__ inline float ld16(unsigned short h, bool bf)
{
    return bf ? __bfloat162float(__ushort_as_bfloat16(h)) : __half2float(__ushort_as_half(h));
}

__device__ inline unsigned short st16(float v, bool bf)
{
    return bf ? __bfloat16_as_ushort(__float2bfloat16_rn(v)) : __half_as_ushort(__float2half_rn(v));
}

__global__ void pack_acc16_k(xm_packdesc_t d, const unsigned short *block, float *packed, bool bf)
{
    for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < d.count;
         k += (int64_t)gridDim.x * blockDim.x)
        packed[k] = ld16(block[xm_pack_index(&d, k)], bf);
}

/* f16/bf16 partial sums: always added in f32. acc is f32 (is_acc) or the
 * 16-bit dtype; out (16-bit) receives the rounded sum when non-null. */
__global__ void reduce16_k(xm_packdesc_t d, const unsigned short *block, void *acc, bool is_acc,
                           unsigned short *out, bool bf)
{
    for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < d.count;
         k += (int64_t)gridDim.x * blockDim.x) {
        float a = is_acc ? ((float *)acc)[k] : ld16(((unsigned short *)acc)[k], bf);
        float v = a + ld16(block[xm_pack_index(&d, k)], bf);
        if (out)
            out[k] = st16(v, bf);
        else if (is_acc)
            ((float *)acc)[k] = v;
        else
            ((unsigned short *)acc)[k] = st16(v, bf);
    }
}

/* Other dtypes add in their own type (unsigned for integers: wrap-around,
 * as the CPU reference). */
template <typename T> __global__ void reduce_k(xm_packdesc_t d, const T *block, T *acc, T *out)
{
    for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < d.count;
         k += (int64_t)gridDim.x * blockDim.x) {
        T v = acc[k] + block[xm_pack_index(&d, k)];
        acc[k] = v;
        if (out)
            out[k] = v;
    }
}

template <typename W>
cudaError_t launch_pack(const xm_packdesc_t *d, const void *block, void *packed, cudaStream_t s)
{
    pack_k<W><<<blocks_for(d->count), kThreads, 0, s>>>(*d, (const W *)block, (W *)packed);
    return cudaGetLastError();
}

template <typename W>
cudaError_t launch_unpack(const xm_packdesc_t *d, const void *packed, void *block, cudaStream_t s)
{
    unpack_k<W><<<blocks_for(d->count), kThreads, 0, s>>>(*d, (const W *)packed, (W *)block);
    return cudaGetLastError();
}

template <typename W>
cudaError_t launch_copy(const xm_packdesc_t *sd, const void *sb, const xm_packdesc_t *dd, void *db,
                        cudaStream_t s)
{
    copy_k<W><<<blocks_for(sd->count), kThreads, 0, s>>>(*sd, (const W *)sb, *dd, (W *)db);
    return cudaGetLastError();
}

template <typename T>
cudaError_t launch_reduce(const xm_packdesc_t *d, const void *block, void *acc, void *out,
                          cudaStream_t s)
{
    reduce_k<T><<<blocks_for(d->count), kThreads, 0, s>>>(*d, (const T *)block, (T *)acc, (T *)out);
    return cudaGetLastError();
}

} // namespace

extern "C" cudaError_t xm_cuda_pack(const xm_packdesc_t *d, const void *block, void *packed,
                                    int dtype, int to_acc, cudaStream_t s)
{
    if (d->count == 0)
        return cudaSuccess;
    bool f16ish = dtype == XMESH_F16 || dtype == XMESH_BF16;
    size_t es = xmesh_dtype_size((xmesh_dtype_t)dtype);
    if (to_acc && f16ish) {
        pack_acc16_k<<<blocks_for(d->count), kThreads, 0, s>>>(
            *d, (const unsigned short *)block, (float *)packed, dtype == XMESH_BF16);
        return cudaGetLastError();
    }
    if (xm_pack_contiguous(d)) /* one run: a plain device-to-device copy */
        return cudaMemcpyAsync(packed, (const char *)block + xm_pack_index(d, 0) * es,
                               d->count * es, cudaMemcpyDeviceToDevice, s);
    switch (es) {
    case 1:
        return launch_pack<uint8_t>(d, block, packed, s);
    case 2:
        return launch_pack<uint16_t>(d, block, packed, s);
    case 4:
        return launch_pack<uint32_t>(d, block, packed, s);
    case 8:
        return launch_pack<uint64_t>(d, block, packed, s);
    default:
        return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t xm_cuda_unpack(const xm_packdesc_t *d, const void *packed, void *block,
                                      size_t es, cudaStream_t s)
{
    if (d->count == 0)
        return cudaSuccess;
    if (xm_pack_contiguous(d))
        return cudaMemcpyAsync((char *)block + xm_pack_index(d, 0) * es, packed, d->count * es,
                               cudaMemcpyDeviceToDevice, s);
    switch (es) {
    case 1:
        return launch_unpack<uint8_t>(d, packed, block, s);
    case 2:
        return launch_unpack<uint16_t>(d, packed, block, s);
    case 4:
        return launch_unpack<uint32_t>(d, packed, block, s);
    case 8:
        return launch_unpack<uint64_t>(d, packed, block, s);
    default:
        return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t xm_cuda_copy(const xm_packdesc_t *sd, const void *sblock,
                                    const xm_packdesc_t *dd, void *dblock, size_t es,
                                    cudaStream_t s)
{
    if (sd->count == 0)
        return cudaSuccess;
    if (xm_pack_contiguous(sd) && xm_pack_contiguous(dd))
        return cudaMemcpyAsync((char *)dblock + xm_pack_index(dd, 0) * es,
                               (const char *)sblock + xm_pack_index(sd, 0) * es, sd->count * es,
                               cudaMemcpyDeviceToDevice, s);
    switch (es) {
    case 1:
        return launch_copy<uint8_t>(sd, sblock, dd, dblock, s);
    case 2:
        return launch_copy<uint16_t>(sd, sblock, dd, dblock, s);
    case 4:
        return launch_copy<uint32_t>(sd, sblock, dd, dblock, s);
    case 8:
        return launch_copy<uint64_t>(sd, sblock, dd, dblock, s);
    default:
        return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t xm_cuda_reduce(const xm_packdesc_t *d, const void *block, void *acc,
                                      int is_acc, void *out, int dtype, cudaStream_t s)
{
    if (d->count == 0)
        return cudaSuccess;
    switch (dtype) {
    case XMESH_F16:
    case XMESH_BF16:
        reduce16_k<<<blocks_for(d->count), kThreads, 0, s>>>(*d, (const unsigned short *)block, acc,
                                                             is_acc != 0, (unsigned short *)out,
                                                             dtype == XMESH_BF16);
        return cudaGetLastError();
    case XMESH_U8:
    case XMESH_I8:
        return launch_reduce<uint8_t>(d, block, acc, out, s);
    case XMESH_I32:
        return launch_reduce<uint32_t>(d, block, acc, out, s);
    case XMESH_I64:
        return launch_reduce<unsigned long long>(d, block, acc, out, s);
    case XMESH_F32:
        return launch_reduce<float>(d, block, acc, out, s);
    case XMESH_F64:
        return launch_reduce<double>(d, block, acc, out, s);
    default:
        return cudaErrorInvalidValue;
    }
}
