/*
 * xmesh without MPI: host memory over UCX, bootstrapped from the environment
 * (torchrun, Slurm, XMESH_*) or from the caller's own all-gather.
 *
 * Plain C: this header carries no UCX or MPI types, so a program that never
 * calls MPI_Init (a torchrun worker, a Ray actor) can use it. Plans, meshes,
 * reshards, requests, statistics and the abort check are the ones of
 * <xmesh.h>; only the context differs (docs/UCX.md).
 */
#ifndef XMESH_UCX_H
#define XMESH_UCX_H

#include "../xmesh.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifndef XMESH_OOB_T_DEFINED
#define XMESH_OOB_T_DEFINED
/* An out-of-band all-gather of the caller's (torch.distributed's, mpi4py's,
 * a key-value store's): rank in [0, size). allgather(user, send, recv, bytes)
 * is collective over the size ranks; it reads `bytes` bytes at send and
 * writes size * bytes at recv, rank r's contribution at recv + r * bytes, and
 * returns 0 on success (anything else is a failure: xmesh then fails the
 * call with XMESH_ERR_BACKEND on this rank). It is called from the thread
 * that called the xmesh function that needs it (context and plan creation,
 * xmesh_ctx_destroy of an NCCL context: never from a progress thread) and
 * must stay valid until xmesh_ctx_destroy. Every rank passes the same size
 * and a distinct rank. */
typedef struct {
    int rank, size;
    int (*allgather)(void *user, const void *send, void *recv, size_t bytes); /* 0 = ok */
    void *user;
} xmesh_oob_t;
#endif

/* Collective over the oob's ranks (oob != NULL), or over the processes the
 * environment describes (oob == NULL):
 *   - rank and size: XMESH_RANK / XMESH_SIZE, else torchrun's RANK /
 *     WORLD_SIZE, else Slurm's SLURM_PROCID / SLURM_NTASKS;
 *   - rendezvous: rank 0 listens on XMESH_BOOTSTRAP=host:port (default:
 *     MASTER_ADDR and MASTER_PORT + 1), every other rank connects to it,
 *     retrying until XMESH_TIMEOUT_S; the listener is closed once every rank
 *     has checked in (or on error). The connections stay open as the
 *     context's out-of-band channel (plan agreement).
 * Hosts: ranks whose host names agree (gethostname, or XMESH_HOST) share a
 * host, unless params->host_id / XMESH_HOST_ID say otherwise (tests). Then
 * every rank opens a UCX worker per NIC (XMESH_UCX_NICS, else one on UCX's
 * own choice of devices), exchanges worker addresses through the bootstrap
 * and connects worker k to worker k of every other rank; every rank must
 * name as many devices (else INVALID_ARGUMENT naming both counts). Progress: a progress thread
 * (XMESH_PROGRESS_THREAD=1, the default) overlaps transfers with the
 * caller's compute; with 0, transfers move only inside xmesh_reshard_start /
 * xmesh_test / xmesh_wait, as with MPI below MPI_THREAD_MULTIPLE.
 * Errors (on every rank that got that far, within XMESH_TIMEOUT_S; nothing
 * is left allocated or listening, *out untouched):
 *   INVALID_ARGUMENT  no rank/size in the environment, a bad XMESH_BOOTSTRAP,
 *                     a bad oob (size < 1, rank outside [0, size), no
 *                     allgather), bad params;
 *   MISMATCH          ranks disagree on the world size, or two processes
 *                     claim one rank (named in the message);
 *   TIMEOUT           rank 0 unreachable, or ranks that never checked in
 *                     (rank 0 names them; the others learn it from rank 0);
 *   REMOTE            another rank failed (its error is named);
 *   BACKEND           a UCX error (UCX's status text in the message), or the
 *                     oob's allgather returned non-zero;
 *   UNSUPPORTED       libxmesh was built without UCX. */
xmesh_result_t xmesh_ctx_create_ucx(const xmesh_oob_t *oob, const xmesh_ctx_params_t *params,
                                    xmesh_ctx_t *out);

/* Name of a context's transport: "mpi", "ucx" or "nccl" (static string). */
const char *xmesh_ctx_transport(xmesh_ctx_t ctx);

#ifdef __cplusplus
}
#endif
#endif /* XMESH_UCX_H */
