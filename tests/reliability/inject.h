/*
 * Fault injection through the MPI profiling interface (PMPI): a test binary
 * that links inject.c replaces MPI_Isend / MPI_Irecv for every caller in the
 * process, xmesh's progress thread included (the test links libxmesh
 * statically, so the library's calls bind to these wrappers). Each wrapper
 * counts the calls that move at least `min_bytes` to or from `peer` (-1: any
 * peer) and acts on the `at_call`-th one:
 *   INJ_SIGNAL   raise(sig) in the calling thread before passing the call on
 *                (SIGSTOP stops, SIGKILL kills the whole process mid-transfer);
 *   INJ_CORRUPT  (sends only) send a copy of the buffer with byte
 *                `byte_in_elem` of element `elem` XORed with `xor_mask`; the
 *                caller's buffer is untouched, so only the bytes in transit
 *                are damaged;
 *   INJ_MARK     create the file `mark_path` (holding the time) and carry on:
 *                a script outside the job acts on it (cuts a link).
 * The configuration is written by the test before the transfer starts and
 * read by the progress thread afterwards (MPI calls in between order it).
 */
#ifndef XMESH_TEST_INJECT_H
#define XMESH_TEST_INJECT_H

#include <stddef.h>
#include <stdint.h>

enum { INJ_OFF = 0, INJ_SIGNAL = 1, INJ_CORRUPT = 2, INJ_MARK = 3 };

typedef struct {
    int action;        /* INJ_OFF, INJ_SIGNAL, INJ_CORRUPT */
    int count_sends;   /* count MPI_Isend calls */
    int count_recvs;   /* count MPI_Irecv calls */
    int peer;          /* only calls with this peer, -1 any */
    int64_t min_bytes; /* only calls moving at least this many bytes */
    int at_call;       /* 1-based index of the counted call that acts */
    int sig;           /* INJ_SIGNAL */
    size_t elem_size;  /* INJ_CORRUPT: element size of the message */
    int64_t elem;      /* element of the message to damage */
    int byte_in_elem;  /* which byte of it */
    unsigned char xor_mask;
    int log_fd; /* INJ_SIGNAL, INJ_MARK: the announcement also goes here (0: none) */
    char mark_path[256];
} inj_cfg_t;

/* What happened (read after the transfer). */
typedef struct {
    int fired;      /* the action was taken */
    int calls;      /* counted calls so far */
    int peer, tag;  /* of the damaged message */
    int64_t bytes;  /* its size */
    double t_fired; /* CLOCK_REALTIME seconds when the action was taken */
} inj_state_t;

/* Arms the injector (resets the counters). */
void inj_arm(const inj_cfg_t *cfg);
/* Disarms it and returns what happened. Frees the damaged copies, so call
 * it only after the transfers that used them completed. */
inj_state_t inj_disarm(void);

#endif
