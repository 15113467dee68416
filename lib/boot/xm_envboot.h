/*
 * Bootstrap from the environment, without MPI: rank and size from
 * XMESH_RANK / XMESH_SIZE, torchrun (RANK / WORLD_SIZE) or Slurm
 * (SLURM_PROCID / SLURM_NTASKS); rank 0 listens at XMESH_BOOTSTRAP=host:port
 * (default MASTER_ADDR and MASTER_PORT + 1), the others connect to it, as
 * NCCL's root bootstrap does. The connections (a star around rank 0) then
 * carry an all-gather: the xmesh_oob_t a context uses for everything ranks
 * agree on (lib/plan/xm_oob.h).
 */
#ifndef XM_ENVBOOT_H
#define XM_ENVBOOT_H

#include "xm_api.h"
#include "xmesh/ucx.h"

typedef struct xm_envboot xm_envboot_t;

/* Collective over the processes the environment describes. Waits at most
 * timeout_s (0: XMESH_TIMEOUT_S's default of 300 s) for the rendezvous.
 * On success *out is the bootstrap and *oob its all-gather (user = *out),
 * valid until xm_envboot_destroy. Errors, with a message naming what is
 * wrong or missing, on every rank that reached rank 0 (the listener is
 * closed and nothing is left open): INVALID_ARGUMENT (no or bad rank, size
 * or rendezvous address), MISMATCH (sizes differ, a rank claimed twice),
 * TIMEOUT (rank 0 unreachable; ranks that never connected, named by rank 0),
 * SYSTEM (socket errors, with errno's text). */
xmesh_result_t xm_envboot_create(double timeout_s, xm_envboot_t **out, xmesh_oob_t *oob);
/* Closes every connection (NULL: no-op). Not collective. */
void xm_envboot_destroy(xm_envboot_t *b);

/* Where the environment says rank and size come from, for messages
 * ("XMESH_RANK/XMESH_SIZE", "RANK/WORLD_SIZE (torchrun)", ...). */
const char *xm_envboot_source(const xm_envboot_t *b);

#endif /* XM_ENVBOOT_H */
