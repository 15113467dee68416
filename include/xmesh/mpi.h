/* xmesh over Open MPI: local blocks in host memory. */
#ifndef XMESH_MPI_H
#define XMESH_MPI_H

#include <mpi.h>

#include "../xmesh.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Collective over comm. Duplicates comm (the caller keeps its own), sets its
 * error handler to return, finds hosts with MPI_Comm_split_type(SHARED) or
 * params->host_id / XMESH_HOST_ID. params may be NULL. Works at any MPI
 * thread level: with MPI_THREAD_MULTIPLE a progress thread overlaps
 * transfers with the caller's compute; below it transfers progress only
 * inside xmesh_reshard_start / xmesh_test / xmesh_wait (see xmesh.h). */
xmesh_result_t xmesh_ctx_create_mpi(MPI_Comm comm, const xmesh_ctx_params_t *params,
                                    xmesh_ctx_t *out);
/* xmesh_ctx_destroy() is declared in xmesh.h: it refuses (INVALID_USAGE)
 * while meshes or plans of the context exist. */

#ifdef __cplusplus
}
#endif
#endif /* XMESH_MPI_H */
