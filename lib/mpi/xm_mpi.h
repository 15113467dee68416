/*
 * Private state of the MPI executor (host memory over Open MPI). See
 * docs/EXECUTOR.md for the design: per-rank steps compiled once per plan,
 * chunked pipelined chains, a per-context progress thread.
 */
#ifndef XM_MPI_H
#define XM_MPI_H

#include <mpi.h>
#include <pthread.h>

#include "xm_api.h"
#include "xm_boot.h"
#include "xm_program.h"
#include "xmesh/mpi.h"

/* Chunks in flight per step (receive-ahead window and staging slots): enough
 * chunks to keep XM_WINDOW_BYTES in flight, between XM_WINDOW_MIN and
 * XM_WINDOW_MAX. Over TCP a 1 MiB window of small chunks starves the link. */
#define XM_WINDOW_MIN 4
#define XM_WINDOW_MAX 16
#define XM_WINDOW_BYTES (4ll << 20)
/* Smallest chunk sent synchronously with XMESH_SYNC_SEND (see compile.c). */
#define XM_SYNC_MIN_BYTES (16 << 10)
/* Tags below XM_TAG_BASE are reserved (trace gather, future checksums). */
#define XM_TAG_TRACE 1
/* Request slots per step: w receives, w sends, then the
 * checksum receive and send of XMESH_CHECK. */
#define XM_STEP_REQS(w) (2 * (w) + 2)
#define XM_TAG_BASE 16
/* Pooled plan communicators per context, and their states. */
#define XM_COMM_POOL 32
enum { XM_POOL_FREE = 0, XM_POOL_BUSY = 1, XM_POOL_DEAD = 2 };

/* The per-rank program (lib/plan/xm_program.h) is what this executor runs:
 * its steps, ops, dependencies and chunking. Below is only what the MPI
 * transport adds to a step. */
typedef struct xm_stepx {
    int tag_in, tag_out; /* MPI tags of hop_in / hop_out */
    int64_t stage_off;   /* into the plan's staging pool, -1 none */
    int req_off;         /* into the plan's request pool (XM_STEP_REQS), -1 none */
    int64_t ck_off;      /* XMESH_CHECK: per-chunk sums in the plan's ck pool, -1 none */
    int ahead;           /* chunk sends in flight to next: send_ahead, or the window
                          * when next is on this rank's host (shared memory) */
    int sync;            /* sends are MPI_Issend (XMESH_SYNC_SEND, hops between hosts) */
    int hold;            /* one send until the first is matched (XMESH_HOLD_LATE: a synchronous
                          * link to a late_next peer) */
} xm_stepx_t;

/* Runtime state of a step during one reshard. */
typedef struct xm_step_rt {
    int64_t posted, computed, completed; /* chunk counters */
    int started, done;
    int ck_state; /* XMESH_CHECK: 0 idle, 1 receiving sums, 2 sending sums, 3 done */
    double t_start;
    double t_recv[XM_WINDOW_MAX], t_send[XM_WINDOW_MAX];
} xm_step_rt_t;

typedef struct xm_trace_ev {
    double t0, t1;
    int kind; /* 0 task, 1 send, 2 recv, 3 copy */
    int task;
    int peer;
    int64_t chunk;
    int64_t bytes;
} xm_trace_ev_t;

struct xm_request;

typedef struct xm_exec {
    MPI_Comm comm; /* private duplicate: tags never collide across plans */
    int rank;
    size_t es, acc_es; /* source dtype and its accumulator */
    size_t dst_es;     /* destination dtype (differs in converting plans) */
    int window;        /* chunks in flight per step */
    int send_ahead;    /* sends in flight per step (XMESH_SEND_AHEAD, <= window) */
    int forward_ahead; /* the same on a NIC hop fed by a NIC hop (XMESH_FORWARD_AHEAD) */
    xmesh_dtype_t dtype, dst_dtype;
    xm_program_t prog; /* this rank's program */
    xm_stepx_t *sx;    /* per program step */
    char *stage;       /* staging pool */
    int64_t stage_bytes;
    int nreqs; /* request pool size */
    MPI_Request *reqs;
    int *req_idx; /* Testsome scratch */
    /* Runtime, valid while a request is in flight. */
    xm_step_rt_t *srt;
    unsigned char *tstate; /* per rtask: 0 pending, 1 active, 2 done */
    int tfirst;            /* lowest rtask not done */
    const void **srcs;     /* the plan's ntensors blocks of the reshard in flight */
    void **dsts;
    struct xm_request *active;
    int broken;     /* a reshard failed or timed out: the plan cannot run again */
    int leak_stage; /* requests still in flight at destroy: stage and ck are leaked */
    int sync_send;  /* XMESH_SYNC_SEND */
    int zero_copy;  /* XMESH_ZERO_COPY: MPI reads/writes the caller's blocks directly */
    int kept;       /* after a failure: uncancellable requests the plan still owns */
    /* Trace. */
    int trace; /* XMESH_TRACE set (rank 0's choice) */
    char trace_path[512];
    int leader;      /* lowest rank of both meshes */
    int participant; /* in either mesh */
    int *parts;      /* participants (leader: all of them) */
    int nparts;
    double t0; /* MPI_Wtime at plan setup after a barrier */
    xm_trace_ev_t *ev;
    int nev, cap_ev;
    int64_t dropped_ev;
    int check;            /* XMESH_CHECK (rank 0's choice) */
    int corrupt;          /* XMESH_TEST_CORRUPT: this rank flips a received byte (tests) */
    int corrupted;        /* done for this reshard */
    uint64_t *ck;         /* 2 * nchunks per checking step: own sums, then received */
    MPI_Request *tr_reqs; /* 2 per participant */
    int64_t *tr_counts;   /* leader: events per participant; others: [0] own count */
    xm_trace_ev_t **tr_bufs;
    int plan_id;
    int64_t nreshards;
    int64_t *staged; /* the context's staged-bytes counter (atomic adds) */
    int pool_slot;   /* index of x->comm in the context's pool, -1: own duplicate */
} xm_exec_t;

/* A request: starts with its plan (api.c reads it to dispatch). Requests
 * live in a per-context pool and are never freed before the context, so a
 * released handle passed again is detected, not a use after free. */
typedef struct xm_request {
    xmesh_plan_t plan;     /* first: api.c dispatches on it (atomic load) */
    struct xm_mpi_ctx *be; /* owning context, fixed for the request's life */
    unsigned magic;
    int done;
    xmesh_result_t result;
    char msg[512];
    double t_start, deadline;
    double next_abort_check; /* when the context's abort check is next asked */
    int phase;               /* 0 tasks, 1 trace gather, 2 finished */
    int trace_stage;
    struct xm_request *next_free;
    struct xm_request *next_active;
} xm_request_t;
#define XM_REQ_LIVE 0x72657131u
#define XM_REQ_FREE 0x66726565u

typedef struct xm_mpi_ctx {
    MPI_Comm comm;
    pthread_mutex_t mu;
    pthread_cond_t work_cv; /* progress thread: new work, stop, or callers left */
    pthread_cond_t done_cv; /* waiters: a progress round ended */
    pthread_t thread;
    int threaded; /* MPI_THREAD_MULTIPLE: a progress thread may run */
    int thread_started;
    int stop;
    /* Progress token: at most one thread advances requests (and calls MPI
     * for them) at a time. `busy` is set by the holder; `callers` counts
     * threads blocked in xmesh_wait, which drive progress themselves while
     * the progress thread stays away. */
    int busy;
    int callers;
    xm_request_t **snap; /* token holder's snapshot of `active` */
    int snap_cap;
    xm_request_t *active; /* list of requests in flight */
    xm_request_t *free_list;
    xm_request_t **blocks; /* allocation blocks of the request pool */
    int nblocks;
    int nplans_created; /* plan ids for trace file names */
    /* Plan communicators, reused: MPI_Comm_dup costs several collectives
     * (hundreds of ms across hosts under load), so a plan takes a pooled
     * communicator that is free on every rank (agreed in mpi_agree). A slot
     * of a failed plan is retired: its late messages could match. */
    MPI_Comm pool[XM_COMM_POOL];
    unsigned char pool_state[XM_COMM_POOL]; /* XM_POOL_FREE / _BUSY / _DEAD */
    int npool;
    int agreed_slot; /* set by mpi_agree for the next plan_setup: free everywhere, -1 none */
    /* xmesh_ctx_get_stats: rounds under mu; staged by atomic adds (token holder). */
    int64_t rounds, idle_rounds, staged_bytes;
    double wait_cpu_s;
} xm_mpi_ctx_t;

/* ctx.c */
xmesh_result_t xm_mpi_err(int mpirc, const char *what);
void xm_mpi_stats(xmesh_ctx_t ctx, xmesh_ctx_stats_t *st);
double xm_mpi_now(void);
/* compile.c */
xmesh_result_t xm_mpi_plan_setup(xmesh_plan_t plan);
void xm_mpi_plan_teardown(xmesh_plan_t plan);
/* exec.c */
xmesh_result_t xm_mpi_start(xmesh_plan_t plan, const void *const *srcs, void *const *dsts,
                            xmesh_request_t *req);
xmesh_result_t xm_mpi_test(xmesh_request_t req);
xmesh_result_t xm_mpi_wait(xmesh_request_t req);
void *xm_mpi_progress_main(void *arg);
/* Advances one request; returns 1 if anything moved. Sets req->done. */
int xm_mpi_exec_advance(xm_request_t *r);
/* trace.c */
void xm_mpi_trace_add(xm_exec_t *x, int kind, int task, int peer, int64_t chunk, int64_t bytes,
                      double t0, double t1);
/* Gathers the events to the leader and writes the file; returns 1 when done,
 * 0 to be called again, <0 on error (message in r->msg). */
int xm_mpi_trace_progress(xm_request_t *r);
void xm_mpi_trace_cancel(xm_request_t *r);

#endif /* XM_MPI_H */
