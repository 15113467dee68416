/*
 * Private state of the UCX runner (host memory over UCX tag messages). It
 * runs the per-rank program of the core (lib/plan/xm_program.h), the one
 * the MPI runner runs, under the MPI runner's contract (docs/EXECUTOR.md,
 * docs/RELIABILITY.md, docs/UCX.md): nonblocking start/test/wait, a
 * progress thread or progress inside the caller's calls, chunk windows,
 * staging owned by the plan after a failure, timeouts, the abort check,
 * trace and statistics. What ranks agree on goes through the context's
 * out-of-band all-gather (lib/plan/xm_oob.h), never MPI.
 *
 * NICs (rails): a rank opens one UCX context and worker per device of
 * XMESH_UCX_NICS, worker k bound to device k (UCX_NET_DEVICES for it
 * only), and exchanges every worker's address; endpoint k of a peer joins
 * worker k to the peer's worker k. A hop between hosts leaves and arrives on
 * the worker of the rail the plan gave it (xm_pstep_t.rail_out / rail_in,
 * from the schedule's route_rails, modulo the workers), so it uses the NIC
 * the model charges at both ends; hops inside a host, the trace gather and
 * everything without a rail use worker 0, where UCX picks shared memory.
 * Without XMESH_UCX_NICS: one worker, UCX's choice of devices.
 */
#ifndef XM_UCX_H
#define XM_UCX_H

#include <pthread.h>
#include <time.h>
#include <ucp/api/ucp.h>

#include "xm_api.h"
#include "xm_envboot.h"
#include "xm_oob.h"
#include "xm_program.h"
#include "xmesh/ucx.h"

/* The MPI runner's windows (lib/mpi/xm_mpi.h), the ones the cost model
 * charges. */
#define XU_WINDOW_MIN 4
#define XU_WINDOW_MAX 16
#define XU_WINDOW_BYTES (4ll << 20)
#define XU_SYNC_MIN_BYTES (16 << 10)
/* Slots of a step: w receives, w sends, then XMESH_CHECK's sums (receive, send). */
#define XU_STEP_SLOTS(w) (2 * (w) + 2)
/* Most UCX workers (rails) of a rank: the devices of XMESH_UCX_NICS. */
#define XU_RAILS_MAX 16

/* 64-bit tags: plan (16 bits) | hop (28) | chunk (20: chunk mod 2^19, bit
 * 19 marks the trace gather). Chunk numbers in the tag make matching exact
 * whatever the transport's ordering. */
#define XU_TAG(plan, hop, sub)                                                                     \
    (((uint64_t)(plan) << 48) | ((uint64_t)((hop)&0xfffffff) << 20) | ((uint64_t)(sub)&0xfffff))
#define XU_TAG_TRACE_HOP 0xfffffff
#define XU_CHUNK_MOD (1 << 19)

/* One UCX operation in flight: req is UCX's request (NULL: none), busy
 * until the completion callback has run. */
typedef struct xu_slot {
    void *req;
    ucp_worker_h w; /* the worker it was posted on (cancelling needs it) */
    int busy;
    ucs_status_t status;
    size_t len;
} xu_slot_t;

typedef struct xu_stepx {
    int64_t stage_off; /* into the staging pool, -1 none */
    int slot_off;      /* into the slot pool (XU_STEP_SLOTS), -1 none */
    int64_t ck_off;    /* XMESH_CHECK: per-chunk sums in the check pool, -1 none */
    int ahead;         /* sends in flight to next (see compile in exec.c) */
    int sync;          /* synchronous sends (XMESH_SYNC_SEND, hops between hosts) */
    int hold;          /* XMESH_HOLD_LATE */
} xu_stepx_t;

typedef struct xu_step_rt {
    int64_t posted, computed, completed;
    int started, done;
    int ck_state; /* XMESH_CHECK: 0 idle, 1 receiving sums, 2 sending sums, 3 done */
    double t_start;
    double t_recv[XU_WINDOW_MAX], t_send[XU_WINDOW_MAX];
} xu_step_rt_t;

typedef struct xu_trace_ev {
    double t0, t1;
    int kind; /* 0 task, 1 send, 2 recv, 3 copy */
    int task, peer;
    int64_t chunk, bytes;
} xu_trace_ev_t;

struct xu_request;

typedef struct xu_exec {
    int rank;
    unsigned tag; /* plan tag, equal on every rank */
    size_t es;    /* the plan's first source dtype (the window's unit without a task set size) */
    int window, send_ahead, forward_ahead;
    xm_program_t prog;
    xu_stepx_t *sx;
    /* Staging and slots live in one block: after a failure UCX may still
     * write both, so they are freed together or leaked together. */
    void *mem;
    char *stage;
    int64_t stage_bytes;
    xu_slot_t *slots;
    int nslots;
    uint64_t *ck;  /* XMESH_CHECK: 2 * nchunks per checking step (own sums, received), in mem */
    int check;     /* XMESH_CHECK (rank 0's choice) */
    int corrupt;   /* XMESH_TEST_CORRUPT: this rank damages a received chunk (tests) */
    int corrupted; /* done in this reshard */
    xu_step_rt_t *srt;
    unsigned char *tstate;
    unsigned char *lane; /* per task without a NIC hop: its lane (exec.c, admission) */
    /* Per task: the NIC directions it holds on this rank, by rail (bit r:
     * sends on rail r mod 16, bit 16 + r: receives); the union over tasks.
     * Admission (exec.c) and staging regions (setup.c) go by these. */
    uint32_t *nicm;
    uint32_t nicm_all;
    int nlanes; /* lanes of such tasks: the plan's NICs per host (1..16) */
    int tfirst;
    const void **srcs; /* the plan's ntensors blocks of the reshard in flight */
    void **dsts;
    struct xu_request *active;
    int broken;
    int kept; /* operations UCX still owns after a failure */
    int64_t *staged;
    /* Trace (XMESH_TRACE, rank 0's choice). */
    int trace;
    char trace_path[512];
    int leader, participant, nparts;
    int *parts;
    double t0;
    xu_trace_ev_t *ev;
    int nev, cap_ev;
    int64_t dropped_ev;
    xu_slot_t *tr_slots; /* 2 per participant */
    int64_t *tr_counts;
    xu_trace_ev_t **tr_bufs;
    int plan_id;
    int64_t nreshards;
} xu_exec_t;

typedef struct xu_request {
    xmesh_plan_t plan; /* first: api.c dispatches on it */
    struct xu_ctx *be;
    unsigned magic;
    int done;
    xmesh_result_t result;
    char msg[512];
    double t_start, deadline, next_abort_check;
    int phase; /* 0 tasks, 1 trace gather, 2 finished */
    int trace_stage;
    struct xu_request *next_free, *next_active;
} xu_request_t;
#define XU_REQ_LIVE 0x75637131u
#define XU_REQ_FREE 0x66726565u

typedef struct xu_peer {
    ucp_ep_h ep[XU_RAILS_MAX]; /* ep[k]: from worker k to the peer's worker k */
    int failed;                /* set by the endpoint's error handler */
    int suspect; /* a reshard failed with operations to or from it unfinished: closed unflushed */
    ucs_status_t fail_status; /* UCX's reason */
    struct xu_ctx *be;
    int rank;
} xu_peer_t;

typedef struct xu_ctx {
    xmesh_oob_t oob;
    xm_envboot_t *boot; /* the environment bootstrap, NULL with a caller's oob */
    int nw;             /* workers (rails): the devices of XMESH_UCX_NICS, 1 without */
    ucp_context_h ucp[XU_RAILS_MAX];
    ucp_worker_h worker[XU_RAILS_MAX];
    xu_peer_t *peers;
    char nic_names[512]; /* XMESH_UCX_NICS as used, "" for UCX's choice */
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    pthread_t thread;
    int threaded, thread_started, stop, busy, callers;
    xu_request_t **snap;
    int snap_cap;
    xu_request_t *active, *free_list;
    xu_request_t **blocks;
    int nblocks;
    unsigned next_tag;
    int nplans_created;
    int64_t rounds, idle_rounds, staged_bytes;
    double wait_cpu_s;
} xu_ctx_t;

/* Monotonic seconds (inline: both ctx.c and exec.c time with it, and exec.c needs nothing
 * else of ctx.c). */
static inline double xu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}
/* ctx.c */
xmesh_result_t xu_status_err(xmesh_result_t code, ucs_status_t st, const char *what);
/* setup.c */
xmesh_result_t xu_plan_setup(xmesh_plan_t plan);
void xu_plan_teardown(xmesh_plan_t plan);
/* exec.c */
/* srcs/dsts: the plan's ntensors blocks (plans of many: many_tensors set). */
xmesh_result_t xu_start(xmesh_plan_t plan, const void *const *srcs, void *const *dsts,
                        xmesh_request_t *req);
xmesh_result_t xu_test(xmesh_request_t req);
xmesh_result_t xu_wait(xmesh_request_t req);
void xu_stats(xmesh_ctx_t ctx, xmesh_ctx_stats_t *st);
void xu_ctx_stop_thread(xu_ctx_t *be);
void xu_ctx_free_requests(xu_ctx_t *be);
/* Posts / polls one slot (exec.c). */
int xu_slot_idle(xu_ctx_t *be, xu_slot_t *s, ucs_status_t *err, size_t *len);
/* rail: the hop's (xm_pstep_t.rail_out / rail_in), -1 for worker 0. */
ucs_status_t xu_send(xu_ctx_t *be, int peer, int rail, const void *buf, size_t n, uint64_t tag,
                     int sync, xu_slot_t *s);
ucs_status_t xu_recv(xu_ctx_t *be, int rail, void *buf, size_t n, uint64_t tag, xu_slot_t *s);
/* Progress on every worker; nonzero if any moved. */
int xu_progress(xu_ctx_t *be);
/* The worker of a rail (-1: worker 0). */
static inline int xu_rail_worker(const xu_ctx_t *be, int rail)
{
    return rail < 0 ? 0 : rail % be->nw;
}

#endif /* XM_UCX_H */
