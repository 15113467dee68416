/* PMPI wrappers for fault injection (see inject.h). */
#include "inject.h"

#include <fcntl.h>
#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static inj_cfg_t g_cfg;
static inj_state_t g_st;
/* Damaged copies handed to MPI_Isend: they must outlive the request. */
static void *g_copies[16];
static int g_ncopies;

static double now_real(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

void inj_arm(const inj_cfg_t *cfg)
{
    pthread_mutex_lock(&g_mu);
    g_cfg = *cfg;
    memset(&g_st, 0, sizeof g_st);
    g_st.peer = -1;
    pthread_mutex_unlock(&g_mu);
}

inj_state_t inj_disarm(void)
{
    pthread_mutex_lock(&g_mu);
    g_cfg.action = INJ_OFF;
    inj_state_t s = g_st;
    for (int i = 0; i < g_ncopies; i++)
        free(g_copies[i]);
    g_ncopies = 0;
    pthread_mutex_unlock(&g_mu);
    return s;
}

/* Counts the call; returns the action to take now (INJ_OFF: none). */
static int count_call(int is_send, int peer, int64_t bytes)
{
    int act = INJ_OFF;
    pthread_mutex_lock(&g_mu);
    if (g_cfg.action != INJ_OFF && !g_st.fired &&
        (is_send ? g_cfg.count_sends : g_cfg.count_recvs) &&
        (g_cfg.peer < 0 || g_cfg.peer == peer) && bytes >= g_cfg.min_bytes &&
        ++g_st.calls == g_cfg.at_call) {
        act = g_cfg.action;
        g_st.fired = 1;
        g_st.peer = peer;
        g_st.bytes = bytes;
        g_st.t_fired = now_real();
    }
    pthread_mutex_unlock(&g_mu);
    return act;
}

/* INJ_MARK: the file appears only once complete (rename). */
static void mark(int peer)
{
    char tmp[300], line[96];
    snprintf(tmp, sizeof tmp, "%s.tmp", g_cfg.mark_path);
    int fd = open(tmp, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    int n = snprintf(line, sizeof line, "%.6f %d\n", g_st.t_fired, peer);
    if (fd < 0 || write(fd, line, (size_t)n) != n)
        perror("inject: mark file");
    if (fd >= 0)
        close(fd);
    rename(tmp, g_cfg.mark_path);
}

static void announce_signal(int sig, int peer)
{
    char line[400];
    int rank = -1;
    PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int n =
        sig ? snprintf(line, sizeof line,
                       "inject: rank %d pid %d raises signal %d (peer %d) at t=%.6f\n", rank,
                       (int)getpid(), sig, peer, g_st.t_fired)
            : snprintf(line, sizeof line, "inject: rank %d pid %d creates %s (peer %d) at t=%.6f\n",
                       rank, (int)getpid(), g_cfg.mark_path, peer, g_st.t_fired);
    /* write(2): no stdio lock is held when the signal stops or kills us */
    if (write(2, line, (size_t)n) < 0 ||
        (g_cfg.log_fd > 0 && write(g_cfg.log_fd, line, (size_t)n) < 0))
        return;
}

/* MPI_Isend and MPI_Issend (the executor's chunk sends between hosts with
 * XMESH_SYNC_SEND=1) count and act alike. */
static int send_hook(int sync, const void *buf, int count, MPI_Datatype dt, int dest, int tag,
                     MPI_Comm comm, MPI_Request *req)
{
    int tsize = 0;
    PMPI_Type_size(dt, &tsize);
    int64_t bytes = (int64_t)count * tsize;
    int act = count_call(1, dest, bytes);
    if (act == INJ_SIGNAL) {
        announce_signal(g_cfg.sig, dest);
        raise(g_cfg.sig);
    } else if (act == INJ_MARK) {
        announce_signal(0, dest);
        mark(dest);
    } else if (act == INJ_CORRUPT) {
        int64_t off = g_cfg.elem * (int64_t)g_cfg.elem_size + g_cfg.byte_in_elem;
        unsigned char *copy = malloc((size_t)bytes);
        if (copy && off < bytes && g_ncopies < 16) {
            memcpy(copy, buf, (size_t)bytes);
            copy[off] ^= g_cfg.xor_mask;
            pthread_mutex_lock(&g_mu);
            g_copies[g_ncopies++] = copy;
            g_st.tag = tag;
            pthread_mutex_unlock(&g_mu);
            return sync ? PMPI_Issend(copy, count, dt, dest, tag, comm, req)
                        : PMPI_Isend(copy, count, dt, dest, tag, comm, req);
        }
        free(copy);
        fprintf(stderr, "inject: cannot damage element %lld of a %lld-byte message\n",
                (long long)g_cfg.elem, (long long)bytes);
    }
    return sync ? PMPI_Issend(buf, count, dt, dest, tag, comm, req)
                : PMPI_Isend(buf, count, dt, dest, tag, comm, req);
}

int MPI_Isend(const void *buf, int count, MPI_Datatype dt, int dest, int tag, MPI_Comm comm,
              MPI_Request *req)
{
    return send_hook(0, buf, count, dt, dest, tag, comm, req);
}

int MPI_Issend(const void *buf, int count, MPI_Datatype dt, int dest, int tag, MPI_Comm comm,
               MPI_Request *req)
{
    return send_hook(1, buf, count, dt, dest, tag, comm, req);
}

int MPI_Irecv(void *buf, int count, MPI_Datatype dt, int source, int tag, MPI_Comm comm,
              MPI_Request *req)
{
    int tsize = 0;
    PMPI_Type_size(dt, &tsize);
    int act = count_call(0, source, (int64_t)count * tsize);
    if (act == INJ_SIGNAL) {
        announce_signal(g_cfg.sig, source);
        raise(g_cfg.sig);
    } else if (act == INJ_MARK) {
        announce_signal(0, source);
        mark(source);
    }
    return PMPI_Irecv(buf, count, dt, source, tag, comm, req);
}
