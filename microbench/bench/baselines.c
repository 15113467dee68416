/*
 * The two MPI-library baselines of xmesh-bench, run on the same ranks and
 * the same unit tasks as xmesh:
 *   mpi-bcast      one MPI_Bcast per unit task over an intercommunicator
 *                  from the task's sender to its receivers, tasks in order
 *                  (Open MPI: root to the receivers' leader, then a
 *                  broadcast inside the receiver group);
 *   mpi-ibcast     the same with MPI_Ibcast, all tasks in flight at once
 *                  (Open MPI's libnbc: the root sends to every receiver);
 *   mpi-sendrecv-allgather  Alpa's method with MPI: per unit task the
 *                  sender sends 1/k of the box to each of the k receivers
 *                  on a host, then those k run MPI_Iallgatherv among
 *                  themselves (a communicator per task and host);
 *   mpi-alltoallv  one MPI_Ialltoallv on the union of both meshes; every
 *                  receiver gets its boxes point-to-point from the sender.
 * Unit tasks come from xm_decompose() (the library's decomposer, linked
 * from its objects): the boxes where both layouts' blocks intersect.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "xm_cost.h"

struct bench_mpi_method {
    const bench_world_t *w;
    const bench_case_t *c;
    int alltoallv;   /* else bcast */
    int alpa;        /* mpi-sendrecv-allgather */
    int nonblocking; /* bcast: MPI_Ibcast all tasks at once (mpi-ibcast) */
    int *sender;     /* per task: world rank that sends it */
    /* bcast: per task the intercommunicator (MPI_COMM_NULL if not a member)
     * and the packed box buffer of this rank */
    MPI_Comm *inter;
    int32_t **box_buf;
    MPI_Request *reqs;
    /* sendrecv-allgather: per task the host communicator of this receiver
     * (in inter[]), its slice counts and displacements (k entries) and
     * this rank's slice index */
    int **acount, **adispl;
    int *aslice;
    /* alltoallv */
    MPI_Comm uni;
    int usize;
    int *uni_world; /* union rank -> world rank */
    int *scount, *sdispl, *rcount, *rdispl;
    int32_t *sbuf, *rbuf;
};

int bench_waitall(const bench_world_t *w, int n, MPI_Request *reqs)
{
    struct timespec ts = {0, (long)w->poll_us * 1000L};
    for (;;) {
        int done = 0;
        int rc = MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS)
            return rc;
        if (done)
            return MPI_SUCCESS;
        if (w->poll_us > 0)
            nanosleep(&ts, NULL);
    }
}

int bench_barrier(const bench_world_t *w, MPI_Comm comm)
{
    MPI_Request r;
    int rc = MPI_Ibarrier(comm, &r);
    return rc != MPI_SUCCESS ? rc : bench_waitall(w, 1, &r);
}

/* Walks the rows (last dim contiguous) of box inside block [blo, bhi);
 * elements of c->src.elem_size bytes. */
static void copy_box(const bench_case_t *c, char *block, const int64_t *blo, const int64_t *bhi,
                     const xm_box_t *box, char *buf, int unpack)
{
    int nd = c->ndim;
    size_t es = c->src.elem_size;
    int64_t idx[XM_MAX_DIMS], bstride[XM_MAX_DIMS];
    int64_t s = 1;
    for (int d = nd - 1; d >= 0; d--) {
        bstride[d] = s;
        s *= bhi[d] - blo[d];
        idx[d] = box->lo[d];
    }
    int64_t row = box->hi[nd - 1] - box->lo[nd - 1];
    if (row <= 0 || xm_box_volume(box, nd) == 0)
        return;
    size_t rowbytes = (size_t)row * es;
    for (;;) {
        int64_t off = 0;
        for (int d = 0; d < nd; d++)
            off += (idx[d] - blo[d]) * bstride[d];
        if (unpack)
            memcpy(block + (size_t)off * es, buf, rowbytes);
        else
            memcpy(buf, block + (size_t)off * es, rowbytes);
        buf += rowbytes;
        int d = nd - 2;
        for (; d >= 0; d--) {
            if (++idx[d] < box->hi[d])
                break;
            idx[d] = box->lo[d];
        }
        if (d < 0)
            break;
    }
}

void bench_pack(const bench_case_t *c, const void *block, const int64_t *blo, const int64_t *bhi,
                const xm_box_t *box, void *buf)
{
    copy_box(c, (char *)block, blo, bhi, box, buf, 0);
}

void bench_unpack(const bench_case_t *c, void *block, const int64_t *blo, const int64_t *bhi,
                  const xm_box_t *box, const void *buf)
{
    copy_box(c, block, blo, bhi, box, (char *)buf, 1);
}

/* Greedy balance of paper 002 section 3.2 as the paper's baselines use it:
 * each task goes to the holder whose host has sent the fewest bytes so far
 * (ties: fewer bytes on the device, then lower rank). */
static void choose_senders(const bench_world_t *w, const bench_case_t *c, int *sender)
{
    double *host_load = calloc((size_t)w->nhosts, sizeof *host_load);
    double *dev_load = calloc((size_t)w->size, sizeof *dev_load);
    for (int t = 0; t < c->ts.ntasks; t++) {
        const xm_task_t *task = &c->ts.tasks[t];
        int best = -1;
        for (int j = 0; j < task->group_size; j++) {
            int d = c->ts.holders[task->holder_off + j];
            if (best < 0)
                best = d;
            else {
                double hd = host_load[w->host_of[d]], hb = host_load[w->host_of[best]];
                if (hd < hb || (hd == hb && dev_load[d] < dev_load[best]))
                    best = d;
            }
        }
        sender[t] = best;
        double load = (double)task->bytes * task->nrecv;
        host_load[w->host_of[best]] += load;
        dev_load[best] += load;
    }
    free(host_load);
    free(dev_load);
}

static int is_recv(const bench_case_t *c, const xm_task_t *t, int rank)
{
    for (int j = 0; j < t->nrecv; j++)
        if (c->ts.recvs[t->recv_off + j] == rank)
            return 1;
    return 0;
}

static int setup_bcast(bench_mpi_method_t *m)
{
    const bench_case_t *c = m->c;
    const bench_world_t *w = m->w;
    int nt = c->ts.ntasks;
    m->inter = malloc(sizeof *m->inter * (size_t)nt);
    m->box_buf = calloc((size_t)nt, sizeof *m->box_buf);
    m->reqs = malloc(sizeof *m->reqs * (size_t)(nt ? nt : 1));
    if (!m->inter || !m->box_buf || !m->reqs)
        return -1;
    for (int t = 0; t < nt; t++)
        m->inter[t] = MPI_COMM_NULL;
    int fail = 0;
    for (int t = 0; t < nt; t++) {
        const xm_task_t *task = &c->ts.tasks[t];
        int am_send = m->sender[t] == w->rank, am_recv = is_recv(c, task, w->rank);
        int color = am_send ? 0 : am_recv ? 1 : MPI_UNDEFINED;
        MPI_Comm local;
        if (MPI_Comm_split(MPI_COMM_WORLD, color, w->rank, &local) != MPI_SUCCESS)
            return -1;
        if (local == MPI_COMM_NULL)
            continue;
        int remote_leader = m->sender[t];
        if (am_send) {
            remote_leader = c->ts.recvs[task->recv_off];
            for (int j = 1; j < task->nrecv; j++)
                if (c->ts.recvs[task->recv_off + j] < remote_leader)
                    remote_leader = c->ts.recvs[task->recv_off + j];
        }
        int rc = MPI_Intercomm_create(local, 0, MPI_COMM_WORLD, remote_leader, 1000 + t % 30000,
                                      &m->inter[t]);
        MPI_Comm_free(&local);
        if (rc != MPI_SUCCESS)
            return -1;
        m->box_buf[t] = malloc((size_t)task->bytes > 0 ? (size_t)task->bytes : 4);
        fail |= !m->box_buf[t];
    }
    return fail ? -1 : 0;
}

/* Receivers of task t on `host` (consecutive: receivers are sorted by
 * host); returns their count and sets *first to the index of the first. */
static int host_group(const bench_world_t *w, const bench_case_t *c, const xm_task_t *t, int host,
                      int *first)
{
    int k = 0;
    *first = -1;
    for (int j = 0; j < t->nrecv; j++)
        if (w->host_of[c->ts.recvs[t->recv_off + j]] == host) {
            if (*first < 0)
                *first = j;
            k++;
        }
    return k;
}

static int setup_alpa(bench_mpi_method_t *m)
{
    const bench_case_t *c = m->c;
    const bench_world_t *w = m->w;
    int nt = c->ts.ntasks;
    m->inter = malloc(sizeof *m->inter * (size_t)(nt ? nt : 1));
    m->box_buf = calloc((size_t)(nt ? nt : 1), sizeof *m->box_buf);
    m->acount = calloc((size_t)(nt ? nt : 1), sizeof *m->acount);
    m->adispl = calloc((size_t)(nt ? nt : 1), sizeof *m->adispl);
    m->aslice = calloc((size_t)(nt ? nt : 1), sizeof *m->aslice);
    /* at most one request per receiver per task on the sender side */
    int64_t nreq = 1;
    for (int t = 0; t < nt; t++)
        nreq += c->ts.tasks[t].nrecv + 1;
    m->reqs = malloc(sizeof *m->reqs * (size_t)nreq);
    if (!m->inter || !m->box_buf || !m->acount || !m->adispl || !m->aslice || !m->reqs)
        return -1;
    for (int t = 0; t < nt; t++)
        m->inter[t] = MPI_COMM_NULL;
    int fail = 0, myhost = w->host_of[w->rank];
    for (int t = 0; t < nt; t++) {
        const xm_task_t *task = &c->ts.tasks[t];
        int am_recv = is_recv(c, task, w->rank);
        if (MPI_Comm_split(MPI_COMM_WORLD, am_recv ? myhost : MPI_UNDEFINED, w->rank,
                           &m->inter[t]) != MPI_SUCCESS)
            return -1;
        int64_t e = task->bytes / 4;
        if (am_recv) {
            int first, k = host_group(w, c, task, myhost, &first);
            m->acount[t] = malloc(sizeof(int) * (size_t)k);
            m->adispl[t] = malloc(sizeof(int) * (size_t)k);
            fail |= !m->acount[t] || !m->adispl[t];
            for (int j = 0; j < k && !fail; j++) {
                int64_t lo, hi;
                xm_split(e, k, j, &lo, &hi);
                m->adispl[t][j] = (int)lo;
                m->acount[t][j] = (int)(hi - lo);
                if (c->ts.recvs[task->recv_off + first + j] == w->rank)
                    m->aslice[t] = j;
            }
        }
        if (am_recv || m->sender[t] == w->rank) {
            m->box_buf[t] = malloc((size_t)(e > 0 ? e : 1) * 4);
            fail |= !m->box_buf[t];
        }
    }
    return fail ? -1 : 0;
}

static int setup_alltoallv(bench_mpi_method_t *m)
{
    const bench_case_t *c = m->c;
    const bench_world_t *w = m->w;
    int member = c->src_index >= 0 || c->dst_index >= 0;
    if (MPI_Comm_split(MPI_COMM_WORLD, member ? 0 : MPI_UNDEFINED, w->rank, &m->uni) != MPI_SUCCESS)
        return -1;
    if (!member)
        return 0;
    MPI_Comm_size(m->uni, &m->usize);
    int n = m->usize;
    m->uni_world = malloc(sizeof(int) * (size_t)n);
    m->scount = calloc((size_t)n, sizeof(int));
    m->sdispl = calloc((size_t)n, sizeof(int));
    m->rcount = calloc((size_t)n, sizeof(int));
    m->rdispl = calloc((size_t)n, sizeof(int));
    if (!m->uni_world || !m->scount || !m->sdispl || !m->rcount || !m->rdispl)
        return -1;
    MPI_Allgather(&w->rank, 1, MPI_INT, m->uni_world, 1, MPI_INT, m->uni);
    int64_t stot = 0, rtot = 0;
    for (int u = 0; u < n; u++) {
        int peer = m->uni_world[u];
        int64_t s = 0, r = 0;
        for (int t = 0; t < c->ts.ntasks; t++) {
            const xm_task_t *task = &c->ts.tasks[t];
            int64_t e = task->bytes / 4;
            if (m->sender[t] == w->rank && is_recv(c, task, peer))
                s += e;
            if (m->sender[t] == peer && is_recv(c, task, w->rank))
                r += e;
        }
        if (stot + s > INT32_MAX || rtot + r > INT32_MAX)
            return -1;
        m->sdispl[u] = (int)stot;
        m->scount[u] = (int)s;
        m->rdispl[u] = (int)rtot;
        m->rcount[u] = (int)r;
        stot += s;
        rtot += r;
    }
    m->sbuf = malloc((size_t)(stot ? stot : 1) * 4);
    m->rbuf = malloc((size_t)(rtot ? rtot : 1) * 4);
    return m->sbuf && m->rbuf ? 0 : -1;
}

bench_mpi_method_t *bench_mpi_setup(const bench_world_t *w, const bench_case_t *c,
                                    const char *method)
{
    bench_mpi_method_t *m = calloc(1, sizeof *m);
    int ok = m != NULL;
    if (m) {
        m->w = w;
        m->c = c;
        m->alltoallv = !strcmp(method, "mpi-alltoallv");
        m->nonblocking = !strcmp(method, "mpi-ibcast");
        m->alpa = !strcmp(method, "mpi-sendrecv-allgather");
        m->uni = MPI_COMM_NULL;
        m->sender = malloc(sizeof(int) * (size_t)(c->ts.ntasks ? c->ts.ntasks : 1));
        ok = m->sender != NULL;
    }
    /* Every rank must take part in the communicator constructors, so the
     * allocation result is agreed first. */
    int all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all_ok) {
        bench_mpi_free(m);
        return NULL;
    }
    choose_senders(w, c, m->sender);
    ok = (m->alltoallv ? setup_alltoallv(m) : m->alpa ? setup_alpa(m) : setup_bcast(m)) == 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all_ok) {
        if (w->rank == 0)
            fprintf(stderr, "xmesh-bench: %s: setup failed for case %s\n", method, c->name);
        bench_mpi_free(m);
        return NULL;
    }
    return m;
}

/* Blocking MPI_Bcast per task in the global task order: each rank walks
 * the tasks it belongs to in that order, so the lowest unfinished task
 * always has all its members inside it (no deadlock), while tasks with
 * disjoint members run at the same time. */
static int run_bcast_blocking(bench_mpi_method_t *m, const void *src, void *dst)
{
    const bench_case_t *c = m->c;
    for (int t = 0; t < c->ts.ntasks; t++) {
        if (m->inter[t] == MPI_COMM_NULL)
            continue;
        const xm_task_t *task = &c->ts.tasks[t];
        int count = (int)(task->bytes / 4);
        int send = m->sender[t] == m->w->rank;
        if (send)
            bench_pack(c, src, c->src_lo, c->src_hi, &task->box, m->box_buf[t]);
        if (MPI_Bcast(m->box_buf[t], count, MPI_INT, send ? MPI_ROOT : 0, m->inter[t]) !=
            MPI_SUCCESS)
            return -1;
        if (!send)
            bench_unpack(c, dst, c->dst_lo, c->dst_hi, &task->box, m->box_buf[t]);
    }
    return 0;
}

static int run_bcast(bench_mpi_method_t *m, const void *src, void *dst)
{
    const bench_case_t *c = m->c;
    if (!m->nonblocking)
        return run_bcast_blocking(m, src, dst);
    int n = 0;
    for (int t = 0; t < c->ts.ntasks; t++) {
        if (m->inter[t] == MPI_COMM_NULL)
            continue;
        const xm_task_t *task = &c->ts.tasks[t];
        int count = (int)(task->bytes / 4);
        int root;
        if (m->sender[t] == m->w->rank) {
            bench_pack(c, src, c->src_lo, c->src_hi, &task->box, m->box_buf[t]);
            root = MPI_ROOT;
        } else {
            root = 0;
        }
        if (MPI_Ibcast(m->box_buf[t], count, MPI_INT, root, m->inter[t], &m->reqs[n++]) !=
            MPI_SUCCESS)
            return -1;
    }
    if (bench_waitall(m->w, n, m->reqs) != MPI_SUCCESS)
        return -1;
    for (int t = 0; t < c->ts.ntasks; t++)
        if (m->inter[t] != MPI_COMM_NULL && m->sender[t] != m->w->rank)
            bench_unpack(c, dst, c->dst_lo, c->dst_hi, &c->ts.tasks[t].box, m->box_buf[t]);
    return 0;
}

static int run_alltoallv(bench_mpi_method_t *m, const void *src, void *dst)
{
    const bench_case_t *c = m->c;
    if (m->uni == MPI_COMM_NULL)
        return 0;
    int me = m->w->rank;
    for (int u = 0; u < m->usize; u++) {
        int peer = m->uni_world[u];
        int32_t *p = m->sbuf + m->sdispl[u];
        for (int t = 0; t < c->ts.ntasks && m->scount[u]; t++) {
            const xm_task_t *task = &c->ts.tasks[t];
            if (m->sender[t] == me && is_recv(c, task, peer)) {
                bench_pack(c, src, c->src_lo, c->src_hi, &task->box, p);
                p += task->bytes / 4;
            }
        }
    }
    MPI_Request r;
    if (MPI_Ialltoallv(m->sbuf, m->scount, m->sdispl, MPI_INT, m->rbuf, m->rcount, m->rdispl,
                       MPI_INT, m->uni, &r) != MPI_SUCCESS)
        return -1;
    if (bench_waitall(m->w, 1, &r) != MPI_SUCCESS)
        return -1;
    for (int u = 0; u < m->usize; u++) {
        int peer = m->uni_world[u];
        const int32_t *p = m->rbuf + m->rdispl[u];
        for (int t = 0; t < c->ts.ntasks && m->rcount[u]; t++) {
            const xm_task_t *task = &c->ts.tasks[t];
            if (m->sender[t] == peer && is_recv(c, task, me)) {
                bench_unpack(c, dst, c->dst_lo, c->dst_hi, &task->box, p);
                p += task->bytes / 4;
            }
        }
    }
    return 0;
}

/* Phase 1: every sender sends each receiver its 1/k slice (all tasks in
 * flight). Phase 2: each host's receivers of a task all-gather the slices.
 * Packing and unpacking are inside, as for every method. */
static int run_alpa(bench_mpi_method_t *m, const void *src, void *dst)
{
    const bench_case_t *c = m->c;
    const bench_world_t *w = m->w;
    int n = 0;
    for (int t = 0; t < c->ts.ntasks; t++) {
        const xm_task_t *task = &c->ts.tasks[t];
        int tag = t % 32000;
        if (m->sender[t] == w->rank) {
            bench_pack(c, src, c->src_lo, c->src_hi, &task->box, m->box_buf[t]);
            int64_t e = task->bytes / 4;
            for (int j = 0; j < task->nrecv;) {
                int first, r = c->ts.recvs[task->recv_off + j];
                int k = host_group(w, c, task, w->host_of[r], &first);
                for (int q = 0; q < k; q++) {
                    int64_t lo, hi;
                    xm_split(e, k, q, &lo, &hi);
                    if (MPI_Isend(m->box_buf[t] + lo, (int)(hi - lo), MPI_INT,
                                  c->ts.recvs[task->recv_off + first + q], tag, MPI_COMM_WORLD,
                                  &m->reqs[n++]) != MPI_SUCCESS)
                        return -1;
                }
                j = first + k;
            }
        }
        if (m->inter[t] != MPI_COMM_NULL) {
            int j = m->aslice[t];
            if (MPI_Irecv(m->box_buf[t] + m->adispl[t][j], m->acount[t][j], MPI_INT, m->sender[t],
                          tag, MPI_COMM_WORLD, &m->reqs[n++]) != MPI_SUCCESS)
                return -1;
        }
    }
    if (bench_waitall(w, n, m->reqs) != MPI_SUCCESS)
        return -1;
    n = 0;
    for (int t = 0; t < c->ts.ntasks; t++)
        if (m->inter[t] != MPI_COMM_NULL &&
            MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, m->box_buf[t], m->acount[t],
                            m->adispl[t], MPI_INT, m->inter[t], &m->reqs[n++]) != MPI_SUCCESS)
            return -1;
    if (bench_waitall(w, n, m->reqs) != MPI_SUCCESS)
        return -1;
    for (int t = 0; t < c->ts.ntasks; t++)
        if (m->inter[t] != MPI_COMM_NULL)
            bench_unpack(c, dst, c->dst_lo, c->dst_hi, &c->ts.tasks[t].box, m->box_buf[t]);
    return 0;
}

int bench_mpi_run(bench_mpi_method_t *m, const void *src, void *dst)
{
    if (m->alltoallv)
        return run_alltoallv(m, src, dst);
    return m->alpa ? run_alpa(m, src, dst) : run_bcast(m, src, dst);
}

double bench_mpi_predict(const bench_mpi_method_t *m, const xm_cluster_t *c)
{
    xm_cost_mpi_t k = m->alltoallv     ? XM_COST_MPI_ALLTOALLV
                      : m->alpa        ? XM_COST_MPI_SENDRECV_ALLGATHER
                      : m->nonblocking ? XM_COST_MPI_IBCAST
                                       : XM_COST_MPI_BCAST;
    return xm_cost_mpi(&m->c->ts, c, m->sender, k);
}

void bench_mpi_free(bench_mpi_method_t *m)
{
    if (!m)
        return;
    if (m->inter) {
        for (int t = 0; t < m->c->ts.ntasks; t++)
            if (m->inter[t] != MPI_COMM_NULL)
                MPI_Comm_free(&m->inter[t]);
        free(m->inter);
    }
    if (m->box_buf) {
        for (int t = 0; t < m->c->ts.ntasks; t++)
            free(m->box_buf[t]);
        free(m->box_buf);
    }
    if (m->acount) {
        for (int t = 0; t < m->c->ts.ntasks; t++) {
            free(m->acount[t]);
            free(m->adispl[t]);
        }
    }
    free(m->acount);
    free(m->adispl);
    free(m->aslice);
    if (m->uni != MPI_COMM_NULL)
        MPI_Comm_free(&m->uni);
    free(m->reqs);
    free(m->sender);
    free(m->uni_world);
    free(m->scount);
    free(m->sdispl);
    free(m->rcount);
    free(m->rdispl);
    free(m->sbuf);
    free(m->rbuf);
    free(m);
}
