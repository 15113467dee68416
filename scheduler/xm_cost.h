/*
 * Cost models of the strategies the scheduler does not route itself
 * (issue 13 item 2) and the least-squares fit of the calibration (item 1).
 *
 * The broadcast and sendrecv strategies are timed by xm_simulate() from the
 * scheduler's routes. The others get their own terms here, each following
 * what its executor does (docs/COSTMODEL.md):
 *
 *  - xmesh all-gather strategies (lib/mpi/compile.c compile_allgather):
 *    per task, every receiver of a group (one host's receivers, or all of
 *    them for the global variant) gets 1/k of the box from the sender, then
 *    k chunk-pipelined chains of length k (a ring) spread the pieces. A
 *    task's time is max(stage 1 + stage 2 chain times, the bytes it puts on
 *    any NIC direction / bandwidth); tasks run FIFO per NIC direction in
 *    the schedule's order, as in xm_simulate().
 *  - MPI baselines of xmesh-bench (microbench/bench/baselines.c), all with
 *    one sender per task:
 *    alltoallv / ibcast: every flow in flight at once, sharing NICs fairly:
 *      the busiest NIC direction (or device memory link) decides;
 *    sendrecv-allgather (Alpa with MPI): the same for the 1/k slices, then
 *      the per-host all-gathers (each member sends its slice to the k - 1
 *      others over the intra-host link);
 *    bcast (blocking MPI_Bcast per task over an intercommunicator, Open
 *      MPI coll/inter): the root sends the whole box to the receivers'
 *      leader, then a pipelined binary tree over the receivers in rank
 *      order; a task starts when its NIC directions and all its member
 *      ranks are free (each rank walks its tasks in order).
 */
#ifndef XM_COST_H
#define XM_COST_H

#include "xm_sched.h"

/* Least-squares line y = alpha + beta * x over n >= 2 points with at least
 * two distinct x (AutoDDL, paper 000 section 3.2: alpha latency, beta
 * inverse bandwidth), constrained to alpha >= 0 and beta >= 0 (non-negative
 * least squares: when the free optimum has a negative coefficient, the best
 * line with alpha = 0 or with beta = 0, whichever leaves the smaller sum of
 * squares; a timing sweep on a busy machine gave beta = -1.9e-9 s/byte
 * unconstrained). r2: coefficient of determination (1 when every y is equal
 * and fitted exactly; can be < 0 for a constrained line); worst_rel: max
 * |fit - y| / |y| over points with y != 0. INVALID_ARGUMENT (and *out
 * untouched) on NULL, n < 2, non-finite values or all x equal. */
typedef struct xm_fit {
    double alpha, beta, r2, worst_rel;
    int n;
} xm_fit_t;
xmesh_result_t xm_fit_linear(const double *x, const double *y, int n, xm_fit_t *out);
/* Weighted least squares: minimizes sum w[i] (alpha + beta x[i] - y[i])^2
 * (w == NULL: every weight 1, which is xm_fit_linear). r2 is the weighted
 * coefficient of determination 1 - sum w e^2 / sum w (y - ybar_w)^2,
 * worst_rel as above. With w[i] = 1 / y[i]^2 the relative residuals are
 * minimized: what the collective fits use, because a geometric size sweep
 * spans decades of time and plain least squares fits the largest sizes
 * only, leaving the smallest off by up to their whole latency. Errors as
 * xm_fit_linear, and for a weight that is not finite and > 0. */
xmesh_result_t xm_fit_weighted(const double *x, const double *y, const double *w, int n,
                               xm_fit_t *out);

/* Time of one chunk-pipelined chain devs[0..len-1] carrying `bytes` (the
 * formula of xm_task_timing: sum over hops of latency + fill * chunk / bw,
 * then the remaining chunks at the slowest hop; len 1 is a local copy). */
double xm_cost_chain(const xm_cluster_t *c, const int *devs, int len, int64_t bytes);

/* Predicted completion time of the xmesh all-gather strategies for the
 * schedule's senders and order: per_host != 0 is sendrecv-allgather, 0 is
 * global-allgather. NAN on bad input or no memory. */
double xm_cost_allgather(const xm_taskset_t *ts, const xm_cluster_t *c, const xm_schedule_t *s,
                         int per_host);

typedef enum {
    XM_COST_MPI_BCAST,
    XM_COST_MPI_IBCAST,
    XM_COST_MPI_SENDRECV_ALLGATHER,
    XM_COST_MPI_ALLTOALLV,
} xm_cost_mpi_t;

/* Predicted time of an xmesh-bench MPI baseline; sender[t] is the device
 * that sends task t (one partial group per task). NAN on bad input, P
 * tasks or no memory. */
double xm_cost_mpi(const xm_taskset_t *ts, const xm_cluster_t *c, const int *sender,
                   xm_cost_mpi_t method);

#endif /* XM_COST_H */
