/*
 * The one engine for every collective and wait of pipeline/ (issue 38 item 4): nothing in the
 * training stack blocks in MPI without a deadline.
 *
 * Every collective is posted nonblocking on a staging copy and driven by MPI_Test in one wait
 * loop (xmp_waitall) that ends
 *   - with XMESH_SUCCESS when the requests complete;
 *   - with XMESH_ERR_REMOTE as soon as a failure notice of another rank arrives (xmp_fail),
 *     naming that rank (and, when it found one, the rank that does not answer);
 *   - with XMESH_ERR_TIMEOUT after the deadline (xmp_timeout_s(): XMESH_TIMEOUT_S as the
 *     library resolves it, default 300 s, 0 = no bound). Before it returns, the wait asks every
 *     other rank of the communicator whether it is alive (a ping on MPI_COMM_WORLD that every
 *     rank inside any wait of this engine answers; xmp_diagnose) and names the ranks that do not
 *     answer within the grace xmp_grace_s():
 *       "rank 1: MPI_Iallreduce (driver step outcome) over world ranks 0,1,2,3 timed out after
 *        5 s (XMESH_TIMEOUT_S = 5): rank 3 does not answer"
 *     so the rank it waited for is named even though MPI says nothing about who arrived.
 * Once a failure is known to this process every later collective fails at once without being
 * posted. A collective MPI cannot cancel is abandoned on error: its staging block stays
 * allocated forever, so the caller's buffers are never written after the call returns, and its
 * communicator must not be used again: the process should report and end (xmp_end_job).
 *
 * Waiting never spins for long: the loop yields the core for the first second, then sleeps
 * with back-off up to 1 ms, and answers pings and reads notices every 10 ms.
 *
 * Reserved tags on MPI_COMM_WORLD: XMP_FAIL_TAG (notices), XMP_PING_TAG, XMP_PONG_TAG.
 * Applications must not use them there. Thread safe (matched probes) under
 * MPI_THREAD_MULTIPLE; the failure record is process-wide (one job per process).
 */
#ifndef XMP_NN_COLL_H
#define XMP_NN_COLL_H

#include <mpi.h>
#include <stddef.h>

#include <xmesh.h>

#include "nn/error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define XMP_FAIL_TAG 32760
#define XMP_PING_TAG 32761
#define XMP_PONG_TAG 32762
/* The tag of nn/'s all-to-alls (point-to-point pairs on the axis communicator; blocking
 * xmp_alltoallv and the nonblocking boxing step use it alike, posted in program order). */
#define XMP_A2A_TAG 7411
/* Bytes of a notice's text buffer (callers size their msg buffers with it). */
#define XMP_NOTICE_BYTES 256

/* The deadline of one wait: the library's resolved default timeout (xmesh_ctx_get_timeout with
 * no context: XMESH_TIMEOUT_S, default 300 s; 0 = no bound). */
double xmp_timeout_s(void);
/* How long a diagnosis waits for answers: a quarter of the timeout, within [0.5 s, 2 s]
 * (2 s with no timeout). */
double xmp_grace_s(void);

/* Waits for one (all nreq) requests posted on comm, with the deadline and the notices above;
 * what names the operation for messages. The time spent is added to xmp_comm_seconds(). On an
 * error the requests are left as they are (abandoned). */
xmesh_result_t xmp_wait(MPI_Request *req, MPI_Comm comm, const char *what);
xmesh_result_t xmp_waitall(int nreq, MPI_Request *req, MPI_Comm comm, const char *what);

/* Boxing collectives of nn/ (counted in xmp_comm_counts, nn/sbp.h). Collective over comm;
 * buffers as the MPI calls (receive buffers written on success only). */
xmesh_result_t xmp_allreduce(void *buf, int count, MPI_Datatype ty, MPI_Op op, MPI_Comm comm,
                             const char *what);
xmesh_result_t xmp_allgatherv(const void *sbuf, int scount, void *rbuf, const int *rcounts,
                              const int *rdispls, MPI_Datatype ty, MPI_Comm comm, const char *what);
xmesh_result_t xmp_reduce_scatter(const void *sbuf, void *rbuf, const int *rcounts, MPI_Datatype ty,
                                  MPI_Op op, MPI_Comm comm, const char *what);
xmesh_result_t xmp_alltoallv(const void *sbuf, const int *scounts, const int *sdispls, void *rbuf,
                             const int *rcounts, const int *rdispls, MPI_Datatype ty, MPI_Comm comm,
                             const char *what);

/* Control messages of the driver, trainers, checkpoints and tools (never counted as boxing).
 * xmp_agree: all-reduce in place. xmp_barrier. xmp_bcast: in place from root. xmp_gather /
 * xmp_gatherv: to root (rbuf, rcounts, rdispls read on root only). xmp_allgather(v). xmp_send /
 * xmp_recv: one point-to-point message (comm ranks; the message names the peer). */
xmesh_result_t xmp_agree(void *buf, int count, MPI_Datatype ty, MPI_Op op, MPI_Comm comm,
                         const char *what);
xmesh_result_t xmp_barrier(MPI_Comm comm, const char *what);
xmesh_result_t xmp_bcast(void *buf, int count, MPI_Datatype ty, int root, MPI_Comm comm,
                         const char *what);
xmesh_result_t xmp_gather(const void *sbuf, int count, void *rbuf, MPI_Datatype ty, int root,
                          MPI_Comm comm, const char *what);
xmesh_result_t xmp_gatherv(const void *sbuf, int scount, void *rbuf, const int *rcounts,
                           const int *rdispls, MPI_Datatype ty, int root, MPI_Comm comm,
                           const char *what);
xmesh_result_t xmp_allgather(const void *sbuf, int count, void *rbuf, MPI_Datatype ty,
                             MPI_Comm comm, const char *what);
xmesh_result_t xmp_allgatherv_ctl(const void *sbuf, int scount, void *rbuf, const int *rcounts,
                                  const int *rdispls, MPI_Datatype ty, MPI_Comm comm,
                                  const char *what);
xmesh_result_t xmp_send(const void *buf, int count, MPI_Datatype ty, int dest, int tag,
                        MPI_Comm comm, const char *what);
xmesh_result_t xmp_recv(void *buf, int count, MPI_Datatype ty, int src, int tag, MPI_Comm comm,
                        const char *what);

/* Asks every other rank of comm whether it is alive (pings on MPI_COMM_WORLD) and waits up to
 * grace seconds for the answers, answering pings and reading notices meanwhile. An answer
 * lists the ranks its sender waits for in an engine wait of its own; those are asked too, so a
 * chain of waits (this rank waits for rank 1, which waits for rank 3) leads to the rank that
 * does not answer. Writes the world ranks that did not answer to silent[0 .. max) in increasing
 * order and, when via is not NULL, to via[i] the rank whose wait led to silent[i] (-1: a rank
 * of comm itself); returns how many did not answer (also beyond max). Not collective: ranks
 * answer from any wait of this engine, from xmp_failed_rank and from xmp_end_job. */
int xmp_diagnose(MPI_Comm comm, double grace, int *silent, int *via, int max);

/* Failure notices. xmp_fail(comm, msg): this rank failed on its own and will not join the
 * collectives the others are in: records it and posts a notice of msg to every other rank of
 * comm (pass MPI_COMM_WORLD to reach every stage). xmp_fail_blame(comm, culprit, msg): the same
 * for a failure whose root is world rank culprit (a rank that does not answer). Ranks waiting
 * in (or later starting) a collective end with XMESH_ERR_REMOTE naming the sender and the
 * culprit. Not collective; returns NO_MEMORY only. */
xmesh_result_t xmp_fail(MPI_Comm comm, const char *msg);
xmesh_result_t xmp_fail_blame(MPI_Comm comm, int culprit, const char *msg);
/* This rank failed with msg and will stop: unless a failure is already known, it asks every
 * other rank of comm whether it answers (xmp_diagnose, xmp_grace_s()) and posts a notice
 * blaming the first rank that does not (itself when all answer). Returns the culprit (world
 * rank) of the failure now known. */
int xmp_fail_here(MPI_Comm comm, const char *msg);
/* World rank of the first failure this process knows of (its own included), -1 if none; msg
 * (may be NULL) receives its notice. Polls for notices and answers pings. */
int xmp_failed_rank(char *msg, size_t n);
/* The root of the first failure known: the rank that does not answer, or the failed rank
 * itself; -1 if none. */
int xmp_failure_culprit(void);
/* Forgets a known failure (tests, or a job that rebuilt its communicators). */
void xmp_fail_clear(void);
/* Ends the job after a failure (never returns): waits until every other world rank except the
 * culprit has posted its notice (so each has said why it stops) or xmp_timeout_s() (within
 * [1 s, 30 s]) passed, answering pings meanwhile, then MPI_Abort(MPI_COMM_WORLD, code). Never
 * MPI_Finalize: that waits for the rank that does not answer. */
void xmp_end_job(int code) __attribute__((noreturn));

#ifdef __cplusplus
}
#endif
#endif /* XMP_NN_COLL_H */
