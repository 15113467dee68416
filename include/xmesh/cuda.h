/*
 * xmesh over NCCL: local blocks in CUDA device memory.
 *
 * Available when libxmesh was built with the CUDA toolkit and NCCL found
 * (xmesh-info prints "NCCL backend: yes"); include <mpi.h>, the CUDA runtime
 * and NCCL headers must be on the include path.
 *
 * Plans, meshes, strategies and schedulers are the ones of <xmesh.h>; only
 * the context differs. Everything below follows NCCL's conventions:
 *   - one context per rank and per device; the calling thread's current
 *     device is switched to the context's device by every xmesh call that
 *     touches it;
 *   - xmesh_reshard_start_on_stream() enqueues the transfer on the caller's
 *     stream and returns: the transfer starts after the work already on the
 *     stream and completes in stream order (like ncclSend/ncclRecv);
 *   - transfers of plans whose meshes cover the same set of ranks share one
 *     NCCL communicator and must be issued in the same order on every rank
 *     of that set (NCCL's rule for operations of one communicator); xmesh
 *     additionally orders them one after another on the device, so
 *     concurrently issued transfers of such plans cannot deadlock.
 *
 * NOTE: this path has been compiled and its device-independent half tested
 * on CPUs; see docs/NCCL.md for what has and has not run on a GPU.
 */
#ifndef XMESH_CUDA_H
#define XMESH_CUDA_H

#include <cuda_runtime_api.h>
#include <mpi.h>

#include "../xmesh.h"
#include "ucx.h" /* xmesh_oob_t */

#ifdef __cplusplus
extern "C" {
#endif

/* Collective over comm. Duplicates comm (for control traffic: plan
 * agreement, schedule broadcast), selects cuda_device (-1: the rank's index
 * among the ranks of its host, modulo the visible devices), creates the
 * NCCL communicator of all ranks (rank 0 calls ncclGetUniqueId and hands
 * the id to every rank through MPI_Allgather on the duplicate), reads the host topology with hwloc
 * and finds hosts like xmesh_ctx_create_mpi (params->host_id / XMESH_HOST_ID or the MPI
 * shared-memory split). params may be NULL. Errors: UNSUPPORTED when a rank sees no CUDA device
 * (every rank returns an error: REMOTE on the others), INVALID_ARGUMENT for a bad device or params,
 * BACKEND for an MPI/CUDA/NCCL failure (the original code is in the
 * message). On error *out is untouched and nothing is left allocated. */
xmesh_result_t xmesh_ctx_create_nccl(MPI_Comm comm, int cuda_device,
                                     const xmesh_ctx_params_t *params, xmesh_ctx_t *out);

/* The same without MPI: control traffic (host discovery, agreement, the
 * ncclUniqueId of rank 0) goes through the caller's all-gather (oob), or
 * with oob == NULL through the environment bootstrap of
 * xmesh_ctx_create_ucx (torchrun, Slurm, XMESH_RANK/XMESH_SIZE; rendezvous
 * at XMESH_BOOTSTRAP, see <xmesh/ucx.h>), as NCCL's own root bootstrap
 * hands its unique id around. Hosts: as xmesh_ctx_create_ucx (host names,
 * or params->host_id / XMESH_HOST_ID). Errors as xmesh_ctx_create_nccl,
 * plus the bootstrap's (<xmesh/ucx.h>). */
xmesh_result_t xmesh_ctx_create_nccl_oob(const xmesh_oob_t *oob, int cuda_device,
                                         const xmesh_ctx_params_t *params, xmesh_ctx_t *out);

/* CUDA device of an NCCL context (INVALID_USAGE for another backend). */
xmesh_result_t xmesh_ctx_cuda_device(xmesh_ctx_t ctx, int *device);

/* Enqueues the reshard of plan on `stream` (src_local/dst_local: device
 * buffers on the context's device, dense row-major, as xmesh_reshard_start)
 * and returns once it is enqueued. Completion is in stream order: work
 * enqueued on the stream afterwards sees dst_local complete, and src_local
 * may be overwritten by such work. There is no request: synchronise the
 * stream (or record an event) to wait. Every rank of both meshes must
 * enqueue it (ranks outside them may skip it, as for xmesh_reshard).
 * Errors before anything is enqueued (bad arguments, host pointers) leave
 * stream and buffers untouched; a BACKEND error while enqueueing leaves the
 * plan's communicator unusable, as NCCL does. */
xmesh_result_t xmesh_reshard_start_on_stream(xmesh_plan_t plan, const void *src_local,
                                             void *dst_local, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* XMESH_CUDA_H */
