/*
 * Out-of-band collectives over one all-gather (the xmesh_oob_t of
 * <xmesh/ucx.h>): what a context needs to agree across ranks without MPI
 * (host discovery, plan agreement, rank 0's schedule for everyone). Pure C:
 * the all-gather is the caller's (torch.distributed, a key-value store, the
 * environment bootstrap of lib/boot, or MPI_Allgather). UCC's out-of-band
 * collectives work the same way: everything is derived from one all-gather,
 * so a framework has one function to hand over.
 *
 * Every function is collective over the oob's ranks; every rank returns the
 * same verdict unless the all-gather itself fails (then BACKEND on the ranks
 * where it failed).
 */
#ifndef XM_OOB_H
#define XM_OOB_H

#include "xm_api.h"
#include "xmesh/ucx.h"

/* INVALID_ARGUMENT naming the field when oob is unusable. */
xmesh_result_t xm_oob_check(const xmesh_oob_t *oob);

/* recv gets size * bytes (rank r's at r * bytes). `what` names the call. */
xmesh_result_t xm_oob_allgather(const xmesh_oob_t *oob, const void *send, void *recv, size_t bytes,
                                const char *what);

/* root's `bytes` bytes at buf become everyone's (an all-gather: size * bytes
 * of scratch; plans are broadcast once at creation). */
xmesh_result_t xm_oob_bcast(const xmesh_oob_t *oob, void *buf, size_t bytes, int root,
                            const char *what);

/* The agreement of xm_backend_ops_t.agree, plus an element-wise maximum of
 * extra_in[0 .. nextra) into extra_out: returns `local` on a failing rank,
 * REMOTE naming the lowest failing rank elsewhere, MISMATCH when hashes
 * differ. */
xmesh_result_t xm_oob_agree(const xmesh_oob_t *oob, xmesh_result_t local, uint64_t hash,
                            const uint64_t *extra_in, uint64_t *extra_out, int nextra,
                            const char *what);

/* Host of every rank: explicit ids (host_id unless XMESH_UNSET_INT, else
 * XMESH_HOST_ID: an integer or "rank/N") when every rank has one, else
 * ranks with equal host names (XMESH_HOST, else gethostname) share a host;
 * ids renumbered 0..H-1 by first appearance. *local_rank (may be NULL): the
 * rank's index among the ranks with its host name (device and NIC
 * selection), whatever the ids say. On error *out is untouched. */
xmesh_result_t xm_oob_hosts(const xmesh_oob_t *oob, int host_id, int *local_rank,
                            xm_hostmap_t *out);

/* This process's host name: XMESH_HOST, else gethostname (64 bytes). */
void xm_oob_hostname(char *buf, size_t len);

/* xm_boot_share_schedule (lib/mpi/xm_boot.h) over the oob: rank 0's flags,
 * task order and senders for everyone, routes rebuilt on the others. */
xmesh_result_t xm_oob_share_schedule(const xmesh_oob_t *oob, xmesh_plan_t plan, int *flags,
                                     int nflags);

#endif /* XM_OOB_H */
