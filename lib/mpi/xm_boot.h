/*
 * Bootstrap shared by both backends (they both bootstrap over MPI): host
 * discovery, the agreement collective and schedule sharing. One
 * implementation; lib/mpi/ctx.c and lib/cuda/nccl.c call it.
 */
#ifndef XM_BOOT_H
#define XM_BOOT_H

#include <mpi.h>

#include "xm_api.h"

/* Converts an MPI error code into XMESH_ERR_BACKEND with MPI's own text. */
xmesh_result_t xm_boot_mpi_err(int mpirc, const char *what);

/* Host of every rank of comm (collective): explicit ids (host_id unless
 * XMESH_UNSET_INT, else XMESH_HOST_ID: an integer or "rank/N") when every
 * rank has one, else the lowest rank of each shared-memory split; ids
 * renumbered 0..H-1 by first appearance. *local_rank (when not NULL) gets
 * the rank within the real shared-memory split (device selection), whatever
 * the ids say. A bad XMESH_HOST_ID anywhere fails every rank (after the
 * collectives); on error *out is untouched. */
xmesh_result_t xm_boot_hosts(MPI_Comm comm, int host_id, int *local_rank, xm_hostmap_t *out);

/* The agreement collective: one MPI_Allreduce(MAX) of {hash, ~hash, lowest
 * failing rank, extra[0 .. nextra)}. Returns `local` on a failing rank,
 * XMESH_ERR_REMOTE naming the lowest failing rank elsewhere, MISMATCH when
 * the hashes differ (max(hash) != min(hash)); extra_out (may alias nothing
 * of extra_in) gets the maxima. `what` names the call in messages. */
xmesh_result_t xm_boot_agree(MPI_Comm comm, xmesh_result_t local, uint64_t hash,
                             const uint64_t *extra_in, uint64_t *extra_out, int nextra,
                             const char *what);

/* Rank 0's schedule becomes everyone's (time-budgeted schedulers may pick
 * differently on each rank): one broadcast of rank 0's flags[0 .. nflags),
 * task order and senders; the other ranks rebuild the routes from them
 * (xm_schedule_from, all-gather strategies from the send/recv model) and
 * get rank 0's flags. Collective; returns this rank's result (not agreed). */
xmesh_result_t xm_boot_share_schedule(MPI_Comm comm, xmesh_plan_t plan, int *flags, int nflags);

#endif /* XM_BOOT_H */
