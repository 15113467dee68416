/* SBP meshes and tensors: mesh communicators, local-block math, spec strings,
 * fill / gather helpers. Boxing is in boxing.c. */
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nn/sbp.h"

static _Thread_local double xmp_comm_s;

double xmp_comm_seconds(void)
{
    return xmp_comm_s;
}

void xmp_comm_seconds_add(double s)
{
    xmp_comm_s += s;
}

static _Thread_local xmp_comm_counts_t xmp_counts;

double xmp_comm_bytes(void)
{
    double t = 0;
    for (int k = 0; k < XMP_COLL_NKINDS; k++)
        t += xmp_counts.bytes[k];
    return t;
}

void xmp_comm_counts(xmp_comm_counts_t *out)
{
    if (out)
        *out = xmp_counts;
}

void xmp_comm_counts_reset(void)
{
    memset(&xmp_counts, 0, sizeof xmp_counts);
}

const char *xmp_coll_kind_name(int kind)
{
    static const char *const names[XMP_COLL_NKINDS] = {"allreduce", "allgather", "reduce_scatter",
                                                       "alltoall"};
    return kind >= 0 && kind < XMP_COLL_NKINDS ? names[kind] : NULL;
}

/* Adds one completed collective of kind on p ranks: payload raw bytes, bytes ring-equivalent. */
static void count_coll(int kind, int p, int64_t payload, double bytes)
{
    xmp_counts.calls[kind]++;
    xmp_counts.payload[kind] += payload;
    xmp_counts.bytes[kind] += p > 1 ? bytes : 0;
}

void xmp_comm_count_add(int kind, int p, int64_t payload, double bytes)
{
    if (kind >= 0 && kind < XMP_COLL_NKINDS)
        count_coll(kind, p, payload, bytes);
}

static _Thread_local int64_t xmp_mem_live, xmp_mem_peak;

int64_t xmp_mem_live_bytes(void)
{
    return xmp_mem_live;
}

int64_t xmp_mem_peak_bytes(void)
{
    return xmp_mem_peak;
}

void xmp_mem_peak_reset(void)
{
    xmp_mem_peak = xmp_mem_live;
}

void xmp_mem_track(int64_t delta)
{
    xmp_mem_live += delta;
    if (xmp_mem_live > xmp_mem_peak)
        xmp_mem_peak = xmp_mem_live;
}

/* Bytes of a tensor's local allocation (the same figure on alloc and on free). */
static int64_t alloc_bytes(const xmp_tensor_t *t)
{
    return (t->lcount ? t->lcount : 1) * 4;
}

/* ----------------------------------------------------------- collectives
 * Every collective of nn/ is posted nonblocking and waited here with a deadline
 * (XMESH_TIMEOUT_S, as lib/ reads it: default 300 s, 0 = no bound), while the
 * wait loop probes MPI_COMM_WORLD for failure notices (xmp_fail). A collective
 * that cannot be cancelled (MPI has no cancel for collectives) is abandoned on
 * error: its staging buffers are deliberately leaked so that a late peer can
 * never make MPI write into memory that was given back. */

static pthread_mutex_t g_fail_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int g_failed_rank = -1; /* world rank of the first failure known here */
static char g_failed_msg[XMP_NOTICE_BYTES];

static int world_rank(void)
{
    int r = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

double xmp_timeout_s(void)
{
    double v = 300.0; /* the table's default; a refused value gets it too, with a warning */
    (void)xmesh_param_get_real("XMESH_TIMEOUT_S", &v);
    return v;
}

static void record_failure(int rank, const char *msg)
{
    pthread_mutex_lock(&g_fail_mu);
    if (atomic_load(&g_failed_rank) < 0) {
        snprintf(g_failed_msg, sizeof g_failed_msg, "%s", msg);
        atomic_store(&g_failed_rank, rank);
    }
    pthread_mutex_unlock(&g_fail_mu);
}

/* Consumes one pending failure notice, if any (matched probe: thread safe). */
static int poll_notice(void)
{
    if (atomic_load(&g_failed_rank) >= 0)
        return 1;
    int flag = 0, init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (!init || fin)
        return 0;
    MPI_Message msg;
    MPI_Status st;
    if (MPI_Improbe(MPI_ANY_SOURCE, XMP_FAIL_TAG, MPI_COMM_WORLD, &flag, &msg, &st) !=
            MPI_SUCCESS ||
        !flag)
        return 0;
    char buf[XMP_NOTICE_BYTES];
    memset(buf, 0, sizeof buf);
    MPI_Mrecv(buf, XMP_NOTICE_BYTES, MPI_CHAR, &msg, MPI_STATUS_IGNORE);
    buf[XMP_NOTICE_BYTES - 1] = 0;
    record_failure(st.MPI_SOURCE, buf);
    return 1;
}

int xmp_failed_rank(char *msg, size_t n)
{
    poll_notice();
    pthread_mutex_lock(&g_fail_mu);
    int r = atomic_load(&g_failed_rank);
    if (msg && n)
        snprintf(msg, n, "%s", r >= 0 ? g_failed_msg : "");
    pthread_mutex_unlock(&g_fail_mu);
    return r;
}

void xmp_fail_clear(void)
{
    pthread_mutex_lock(&g_fail_mu);
    atomic_store(&g_failed_rank, -1);
    g_failed_msg[0] = 0;
    pthread_mutex_unlock(&g_fail_mu);
}

xmesh_result_t xmp_fail(MPI_Comm comm, const char *msg)
{
    int me = world_rank(), n = 0;
    xmesh_result_t r = XMESH_SUCCESS;
    MPI_Group g, wg;
    record_failure(me, msg ? msg : "");
    if (comm == MPI_COMM_NULL)
        return XMESH_SUCCESS;
    MPI_Comm_group(comm, &g);
    MPI_Comm_group(MPI_COMM_WORLD, &wg);
    MPI_Group_size(g, &n);
    int *in = malloc(sizeof(int) * (size_t)(2 * n + 1));
    /* the sends may complete after we return (or never, to a dead peer): never freed */
    char *buf = calloc(XMP_NOTICE_BYTES, 1);
    if (!in || !buf) {
        free(in);
        free(buf);
        r = xmp_err(XMESH_ERR_NO_MEMORY, "xmp_fail: out of memory");
        goto out_groups;
    }
    snprintf(buf, XMP_NOTICE_BYTES, "%s", msg ? msg : "");
    for (int i = 0; i < n; i++)
        in[i] = i;
    MPI_Group_translate_ranks(g, n, in, wg, in + n);
    for (int i = 0; i < n; i++) {
        int w = in[n + i];
        MPI_Request q;
        if (w == MPI_UNDEFINED || w == me)
            continue;
        if (MPI_Isend(buf, XMP_NOTICE_BYTES, MPI_CHAR, w, XMP_FAIL_TAG, MPI_COMM_WORLD, &q) ==
            MPI_SUCCESS)
            MPI_Request_free(&q);
    }
    free(in);
out_groups:
    MPI_Group_free(&g);
    MPI_Group_free(&wg);
    return r;
}

/* " over world ranks 0,1,2,3" (the first 16) for messages. */
static void comm_ranks(MPI_Comm comm, char *out, size_t len)
{
    MPI_Group g, wg;
    int n = 0, in[16], w[16];
    out[0] = 0;
    if (comm == MPI_COMM_NULL)
        return;
    MPI_Comm_group(comm, &g);
    MPI_Comm_group(MPI_COMM_WORLD, &wg);
    MPI_Group_size(g, &n);
    int k = n < 16 ? n : 16;
    for (int i = 0; i < k; i++)
        in[i] = i;
    MPI_Group_translate_ranks(g, k, in, wg, w);
    size_t o = (size_t)snprintf(out, len, " over world ranks ");
    for (int i = 0; i < k && o < len; i++)
        o += (size_t)snprintf(out + o, len - o, "%s%d", i ? "," : "", w[i]);
    if (n > k && o < len)
        snprintf(out + o, len - o, ",... (%d ranks)", n);
    MPI_Group_free(&g);
    MPI_Group_free(&wg);
}

xmesh_result_t xmp_wait(MPI_Request *req, MPI_Comm comm, const char *what)
{
    return xmp_waitall(1, req, comm, what);
}

xmesh_result_t xmp_waitall(int nreq, MPI_Request *req, MPI_Comm comm, const char *what)
{
    double t0 = MPI_Wtime(), T = xmp_timeout_s();
    long it = 0, nap_ns = 0;
    xmesh_result_t r;
    char ranks[160], fmsg[XMP_NOTICE_BYTES];
    for (;;) {
        int done = 0, rc = MPI_Testall(nreq, req, &done, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) {
            char s[MPI_MAX_ERROR_STRING];
            int n = 0;
            MPI_Error_string(rc, s, &n);
            r = xmp_err(XMESH_ERR_REMOTE, "rank %d: %s failed: %s (MPI code %d)", world_rank(),
                        what, s, rc);
            break;
        }
        if (done) {
            r = XMESH_SUCCESS;
            break;
        }
        if ((it & 63) == 0 && poll_notice()) {
            int fr = xmp_failed_rank(fmsg, sizeof fmsg);
            comm_ranks(comm, ranks, sizeof ranks);
            if (fr == world_rank())
                r = xmp_err(XMESH_ERR_REMOTE,
                            "rank %d: %s%s abandoned: this rank failed earlier (%s)", fr, what,
                            ranks, fmsg);
            else
                r = xmp_err(XMESH_ERR_REMOTE, "rank %d: %s%s abandoned: rank %d failed (%s)",
                            world_rank(), what, ranks, fr, fmsg);
            break;
        }
        double el = MPI_Wtime() - t0;
        if (T > 0 && el >= T) {
            comm_ranks(comm, ranks, sizeof ranks);
            r = xmp_err(XMESH_ERR_TIMEOUT,
                        "rank %d: %s%s timed out after %.3g s (XMESH_TIMEOUT_S = %g): a peer "
                        "never arrived",
                        world_rank(), what, ranks, el, T);
            break;
        }
        /* Progress needs this rank to call MPI_Test (no progress thread): poll and yield
         * the core for the first second (collectives of several rounds on an oversubscribed
         * host: sleeping here doubled the time of test_sbp_layers on 8 ranks over 2 cores),
         * then sleep with back-off up to 1 ms so a stalled job costs little CPU. */
        it++;
        if (el < 1.0) {
            sched_yield();
        } else {
            nap_ns = nap_ns ? (nap_ns * 2 > 1000000 ? 1000000 : nap_ns * 2) : 20000;
            struct timespec ts = {0, nap_ns};
            nanosleep(&ts, NULL);
        }
    }
    xmp_comm_seconds_add(MPI_Wtime() - t0);
    return r;
}

static size_t type_size(MPI_Datatype ty)
{
    int s = 0;
    MPI_Type_size(ty, &s);
    return (size_t)s;
}

/* Staging of one collective: a block holding copies of the buffers and count arrays. Freed
 * after success; leaked when the collective is abandoned (see above). */
static void *stage(size_t bytes)
{
    return malloc(bytes ? bytes : 1);
}

static xmesh_result_t posted(int rc, const char *what)
{
    if (rc == MPI_SUCCESS)
        return XMESH_SUCCESS;
    char s[MPI_MAX_ERROR_STRING];
    int n = 0;
    MPI_Error_string(rc, s, &n);
    return xmp_err(XMESH_ERR_BACKEND, "%s: posting failed: %s (MPI code %d)", what, s, rc);
}

static xmesh_result_t known_failure(const char *what)
{
    char fmsg[XMP_NOTICE_BYTES];
    int fr = xmp_failed_rank(fmsg, sizeof fmsg);
    if (fr < 0)
        return XMESH_SUCCESS;
    return xmp_err(XMESH_ERR_REMOTE, "rank %d: %s not started: rank %d failed (%s)", world_rank(),
                   what, fr, fmsg);
}

/* The deadline all-reduce both wrappers below share: staged, in place, waited by xmp_wait. */
static xmesh_result_t allreduce_staged(void *buf, int count, MPI_Datatype ty, MPI_Op op,
                                       MPI_Comm comm, const char *what)
{
    size_t bytes = (size_t)count * type_size(ty);
    MPI_Request q;
    char w[200];
    snprintf(w, sizeof w, "MPI_Iallreduce (%s)", what);
    xmesh_result_t r = known_failure(w);
    if (r)
        return r;
    /* Out of place (send copy, receive half): with MPI_IN_PLACE Open MPI's libnbc takes its
     * binomial reduce + broadcast instead of the ring, 3.5x slower for GPT-2's gradients on
     * the emulated cluster (docs/SEARCH.md). */
    char *s = stage(2 * bytes);
    if (!s)
        return xmp_err(XMESH_ERR_NO_MEMORY, "%s: out of memory", w);
    memcpy(s, buf, bytes);
    if ((r = posted(MPI_Iallreduce(s, s + bytes, count, ty, op, comm, &q), w))) {
        free(s);
        return r;
    }
    if ((r = xmp_wait(&q, comm, w)))
        return r; /* abandoned: s stays allocated */
    memcpy(buf, s + bytes, bytes);
    free(s);
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_allreduce(void *buf, int count, MPI_Datatype ty, MPI_Op op, MPI_Comm comm,
                             const char *what)
{
    xmesh_result_t r = allreduce_staged(buf, count, ty, op, comm, what);
    if (r)
        return r;
    size_t bytes = (size_t)count * type_size(ty);
    int p = 1;
    MPI_Comm_size(comm, &p);
    count_coll(XMP_COLL_ALLREDUCE, p, (int64_t)bytes, 2.0 * (p - 1) / p * (double)bytes);
    return XMESH_SUCCESS;
}

/* Control messages (not boxing: never counted in xmp_comm_counts), with the deadline and the
 * failure notices of xmp_wait. */
xmesh_result_t xmp_agree(void *buf, int count, MPI_Datatype ty, MPI_Op op, MPI_Comm comm,
                         const char *what)
{
    return allreduce_staged(buf, count, ty, op, comm, what);
}

xmesh_result_t xmp_send(const void *buf, int count, MPI_Datatype ty, int dest, int tag,
                        MPI_Comm comm, const char *what)
{
    size_t bytes = (size_t)count * type_size(ty);
    MPI_Request q;
    char w[200];
    snprintf(w, sizeof w, "MPI_Isend to rank %d (%s)", dest, what);
    xmesh_result_t r = known_failure(w);
    if (r)
        return r;
    void *s = stage(bytes);
    if (!s)
        return xmp_err(XMESH_ERR_NO_MEMORY, "%s: out of memory", w);
    memcpy(s, buf, bytes);
    if ((r = posted(MPI_Isend(s, count, ty, dest, tag, comm, &q), w))) {
        free(s);
        return r;
    }
    if ((r = xmp_wait(&q, comm, w)))
        return r; /* abandoned: s stays allocated */
    free(s);
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_recv(void *buf, int count, MPI_Datatype ty, int src, int tag, MPI_Comm comm,
                        const char *what)
{
    size_t bytes = (size_t)count * type_size(ty);
    MPI_Request q;
    char w[200];
    snprintf(w, sizeof w, "MPI_Irecv from rank %d (%s)", src, what);
    xmesh_result_t r = known_failure(w);
    if (r)
        return r;
    void *s = stage(bytes);
    if (!s)
        return xmp_err(XMESH_ERR_NO_MEMORY, "%s: out of memory", w);
    if ((r = posted(MPI_Irecv(s, count, ty, src, tag, comm, &q), w))) {
        free(s);
        return r;
    }
    if ((r = xmp_wait(&q, comm, w)))
        return r; /* abandoned: MPI may still write s, which stays allocated */
    memcpy(buf, s, bytes);
    free(s);
    return XMESH_SUCCESS;
}

static int64_t extent(int n, const int *cnt, const int *dis)
{
    int64_t e = 0;
    for (int i = 0; i < n; i++)
        if (cnt[i] && (int64_t)dis[i] + cnt[i] > e)
            e = (int64_t)dis[i] + cnt[i];
    return e;
}

xmesh_result_t xmp_allgatherv(const void *sbuf, int scount, void *rbuf, const int *rcounts,
                              const int *rdispls, MPI_Datatype ty, MPI_Comm comm, const char *what)
{
    int n = 0;
    MPI_Request q;
    char w[200];
    snprintf(w, sizeof w, "MPI_Iallgatherv (%s)", what);
    xmesh_result_t r = known_failure(w);
    if (r)
        return r;
    MPI_Comm_size(comm, &n);
    size_t es = type_size(ty);
    int64_t re = extent(n, rcounts, rdispls);
    size_t ints = sizeof(int) * 2 * (size_t)n, sb = (size_t)scount * es, rb = (size_t)re * es;
    char *s = stage(ints + sb + rb);
    if (!s)
        return xmp_err(XMESH_ERR_NO_MEMORY, "%s: out of memory", w);
    int *c = (int *)s, *d = c + n;
    memcpy(c, rcounts, sizeof(int) * (size_t)n);
    memcpy(d, rdispls, sizeof(int) * (size_t)n);
    memcpy(s + ints, sbuf, sb);
    if ((r = posted(MPI_Iallgatherv(s + ints, scount, ty, s + ints + sb, c, d, ty, comm, &q), w))) {
        free(s);
        return r;
    }
    if ((r = xmp_wait(&q, comm, w)))
        return r;
    memcpy(rbuf, s + ints + sb, rb);
    free(s);
    int64_t tot = 0;
    for (int i = 0; i < n; i++)
        tot += rcounts[i];
    count_coll(XMP_COLL_ALLGATHER, n, (int64_t)sb, (double)(n - 1) / n * (double)tot * (double)es);
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_reduce_scatter(const void *sbuf, void *rbuf, const int *rcounts, MPI_Datatype ty,
                                  MPI_Op op, MPI_Comm comm, const char *what)
{
    int n = 0, me = 0;
    MPI_Request q;
    char w[200];
    snprintf(w, sizeof w, "MPI_Ireduce_scatter (%s)", what);
    xmesh_result_t r = known_failure(w);
    if (r)
        return r;
    MPI_Comm_size(comm, &n);
    MPI_Comm_rank(comm, &me);
    size_t es = type_size(ty);
    int64_t tot = 0;
    for (int i = 0; i < n; i++)
        tot += rcounts[i];
    size_t ints = sizeof(int) * (size_t)n, sb = (size_t)tot * es, rb = (size_t)rcounts[me] * es;
    char *s = stage(ints + sb + rb);
    if (!s)
        return xmp_err(XMESH_ERR_NO_MEMORY, "%s: out of memory", w);
    int *c = (int *)s;
    memcpy(c, rcounts, ints);
    memcpy(s + ints, sbuf, sb);
    if ((r = posted(MPI_Ireduce_scatter(s + ints, s + ints + sb, c, ty, op, comm, &q), w))) {
        free(s);
        return r;
    }
    if ((r = xmp_wait(&q, comm, w)))
        return r;
    memcpy(rbuf, s + ints + sb, rb);
    free(s);
    count_coll(XMP_COLL_REDUCE_SCATTER, n, (int64_t)sb, (double)(n - 1) / n * (double)sb);
    return XMESH_SUCCESS;
}

/* All-to-all of variable blocks as MPI_Isend / MPI_Irecv pairs on comm (tag XMP_A2A_TAG; the
 * comms of nn/ carry no other point-to-point traffic, and MPI keeps the order of messages
 * between two ranks, so consecutive calls never mix). Not MPI_Ialltoallv: with Open MPI
 * 4.1 (libnbc) it never completed on some ranks in test_boxing on 2x2 meshes (the mesh-wide
 * redistribution of shared splits, where most counts are zero) and then reported
 * MPI_ERR_TRUNCATE, while the same staged call made blocking passed. */
xmesh_result_t xmp_alltoallv(const void *sbuf, const int *scounts, const int *sdispls, void *rbuf,
                             const int *rcounts, const int *rdispls, MPI_Datatype ty, MPI_Comm comm,
                             const char *what)
{
    int n = 0, me = 0, k = 0;
    char w[200];
    snprintf(w, sizeof w, "all-to-all by MPI_Isend/MPI_Irecv (%s)", what);
    xmesh_result_t r = known_failure(w);
    if (r)
        return r;
    MPI_Comm_size(comm, &n);
    MPI_Comm_rank(comm, &me);
    size_t es = type_size(ty);
    int64_t se = extent(n, scounts, sdispls), re = extent(n, rcounts, rdispls);
    size_t reqb = sizeof(MPI_Request) * 2 * (size_t)n, sb = (size_t)se * es, rb = (size_t)re * es;
    char *s = stage(reqb + sb + rb);
    if (!s)
        return xmp_err(XMESH_ERR_NO_MEMORY, "%s: out of memory", w);
    MPI_Request *q = (MPI_Request *)s;
    char *sx = s + reqb, *rx = sx + sb;
    memcpy(sx, sbuf, sb);
    for (int p = 0; p < n && !r; p++)
        if (p != me && rcounts[p])
            r = posted(MPI_Irecv(rx + (size_t)rdispls[p] * es, rcounts[p], ty, p, XMP_A2A_TAG, comm,
                                 &q[k++]),
                       w);
    for (int i = 1; i < n && !r; i++) { /* start with the next rank: no hot spot */
        int p = (me + i) % n;
        if (scounts[p])
            r = posted(MPI_Isend(sx + (size_t)sdispls[p] * es, scounts[p], ty, p, XMP_A2A_TAG, comm,
                                 &q[k++]),
                       w);
    }
    if (!r && rcounts[me])
        memcpy(rx + (size_t)rdispls[me] * es, sx + (size_t)sdispls[me] * es,
               (size_t)rcounts[me] * es);
    if (r) /* posted requests may still complete into s: abandon it */
        return r;
    if ((r = xmp_waitall(k, q, comm, w)))
        return r;
    memcpy(rbuf, rx, rb);
    free(s);
    int64_t off = 0;
    for (int p = 0; p < n; p++)
        if (p != me)
            off += (int64_t)scounts[p] * (int64_t)es;
    count_coll(XMP_COLL_ALLTOALL, n, off, (double)off);
    return XMESH_SUCCESS;
}

/* ---------------------------------------------------------------- meshes */

xmesh_result_t xmp_mesh_create(MPI_Comm parent, xmesh_ctx_t ctx, int ndim, const int *shape,
                               const int *ranks, xmp_mesh_t **out)
{
    int prank, psize;
    if (!shape || !ranks || !out)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "xmp_mesh_create: %s is NULL",
                       !shape   ? "shape"
                       : !ranks ? "ranks"
                                : "out");
    if (ndim < 1 || ndim > XMP_MAX_MESH_DIMS)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "mesh ndim %d out of range [1, %d]", ndim,
                       XMP_MAX_MESH_DIMS);
    MPI_Comm_rank(parent, &prank);
    MPI_Comm_size(parent, &psize);
    int size = 1;
    for (int a = 0; a < ndim; a++) {
        if (shape[a] < 1)
            return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "mesh shape[%d] = %d, must be >= 1", a,
                           shape[a]);
        size *= shape[a];
    }
    if (size > psize)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "mesh of %d devices on a %d-rank communicator",
                       size, psize);
    int index = -1;
    for (int i = 0; i < size; i++) {
        if (ranks[i] < 0 || ranks[i] >= psize)
            return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "mesh rank %d (entry %d) out of [0, %d)",
                           ranks[i], i, psize);
        for (int j = 0; j < i; j++)
            if (ranks[j] == ranks[i])
                return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                               "mesh rank %d listed twice (entries %d and %d)", ranks[i], j, i);
        if (ranks[i] == prank)
            index = i;
    }
    /* The checks above see the same arguments on every rank; the ones below are local
     * (the ctx, memory), so the ranks agree on them before the first MPI_Comm_split: a rank
     * that returned early would leave the others blocked in it. */
    xmesh_result_t lr = XMESH_SUCCESS;
    xmp_mesh_t *m = NULL;
    if (ctx) {
        int cr = -1, cs = -1;
        xmesh_ctx_rank(ctx, &cr);
        xmesh_ctx_size(ctx, &cs);
        if (cr != prank || cs != psize)
            lr = xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                         "ctx (rank %d of %d) is not over the parent comm (rank %d of %d)", cr, cs,
                         prank, psize);
    }
    if (!lr) {
        m = calloc(1, sizeof *m);
        if (m)
            m->ranks = malloc(sizeof(int) * (size_t)size);
        if (!m || !m->ranks)
            lr = xmp_err(XMESH_ERR_NO_MEMORY, "xmp_mesh_create: out of memory");
    }
    int agree[2] = {lr ? 1 : 0, lr ? prank : -1};
    char keep[512];
    snprintf(keep, sizeof keep, "%s", xmp_last_error());
    xmesh_result_t ar = xmp_allreduce(agree, 2, MPI_INT, MPI_MAX, parent, "xmp_mesh_create");
    if (lr || ar || agree[0]) {
        if (m)
            free(m->ranks);
        free(m);
        if (lr)
            return xmp_err(lr, "%s", keep);
        if (ar)
            return ar;
        return xmp_err(XMESH_ERR_REMOTE,
                       "xmp_mesh_create: rank %d of the parent comm failed locally; no mesh "
                       "created",
                       agree[1]);
    }
    memcpy(m->ranks, ranks, sizeof(int) * (size_t)size);
    m->ndim = ndim;
    m->size = size;
    memcpy(m->shape, shape, sizeof(int) * (size_t)ndim);
    m->member = index >= 0;
    m->index = index;
    m->comm = MPI_COMM_NULL;
    for (int a = 0; a < XMP_MAX_MESH_DIMS; a++)
        m->axis[a] = MPI_COMM_NULL;
    if (index >= 0) {
        int i = index;
        for (int a = ndim - 1; a >= 0; a--) {
            m->coord[a] = i % shape[a];
            i /= shape[a];
        }
    }
    MPI_Comm_split(parent, m->member ? 0 : MPI_UNDEFINED, index, &m->comm);
    if (m->member) {
        for (int a = 0; a < ndim; a++) {
            /* colour: index with coordinate a zeroed; key: coordinate a */
            int stride = 1;
            for (int b = a + 1; b < ndim; b++)
                stride *= shape[b];
            int colour = index - m->coord[a] * stride;
            MPI_Comm_split(m->comm, colour, m->coord[a], &m->axis[a]);
        }
    }
    if (ctx) {
        xmesh_result_t r = xmesh_mesh_create(ctx, ndim, shape, ranks, &m->xmesh);
        if (r) {
            xmp_err(r, "xmesh_mesh_create: %s", xmesh_last_error());
            m->xmesh = NULL;
            xmp_mesh_destroy(m);
            return r;
        }
    }
    *out = m;
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_mesh_destroy(xmp_mesh_t *m)
{
    if (!m)
        return XMESH_SUCCESS;
    xmesh_result_t r = xmesh_mesh_destroy(m->xmesh);
    if (r)
        return xmp_err(r, "xmesh_mesh_destroy: %s", xmesh_last_error());
    for (int a = 0; a < XMP_MAX_MESH_DIMS; a++)
        if (m->axis[a] != MPI_COMM_NULL)
            MPI_Comm_free(&m->axis[a]);
    if (m->comm != MPI_COMM_NULL)
        MPI_Comm_free(&m->comm);
    free(m->ranks);
    free(m);
    return XMESH_SUCCESS;
}

/* ------------------------------------------------------------------- SBP */

xmesh_result_t xmp_sbp_parse(const char *s, int mesh_ndim, int tensor_ndim, xmp_sbp_t *sbp)
{
    xmp_sbp_t tmp[XMP_MAX_MESH_DIMS];
    int a = 0;
    const char *p = s;
    if (!s || !sbp)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "xmp_sbp_parse: NULL argument");
    while (*p) {
        if (*p == ',' || *p == ' ') {
            p++;
            continue;
        }
        if (a >= mesh_ndim)
            return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "sbp '%s': more than %d tokens", s,
                           mesh_ndim);
        if (*p == 'B' || *p == 'P') {
            tmp[a++] = *p == 'B' ? xmp_sbp_b() : xmp_sbp_p();
            p++;
        } else {
            int d, n = 0;
            if (sscanf(p, "S(%d)%n", &d, &n) != 1 || n == 0)
                return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "sbp '%s': bad token at offset %d", s,
                               (int)(p - s));
            if (d < 0 || d >= tensor_ndim)
                return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                               "sbp '%s': split dim %d out of range (tensor has %d dims)", s, d,
                               tensor_ndim);
            tmp[a++] = xmp_sbp_s(d);
            p += n;
        }
    }
    if (a != mesh_ndim)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "sbp '%s': %d tokens for a %d-d mesh", s, a,
                       mesh_ndim);
    memcpy(sbp, tmp, sizeof(xmp_sbp_t) * (size_t)mesh_ndim);
    return XMESH_SUCCESS;
}

static void split_range(int64_t n, int64_t k, int64_t i, int64_t *lo, int64_t *hi)
{
    /* numpy.array_split: the first n % k pieces have one more element */
    int64_t q = n / k, r = n % k;
    *lo = i * q + (i < r ? i : r);
    *hi = *lo + q + (i < r ? 1 : 0);
}

void xmp_block(const xmp_mesh_t *m, int ndim, const int64_t *shape, const xmp_sbp_t *sbp,
               const int *coord, int64_t *lo, int64_t *hi)
{
    for (int d = 0; d < ndim; d++) {
        int64_t k = 1, idx = 0;
        for (int a = 0; a < m->ndim; a++) /* ascending: lower axis major */
            if (sbp[a].kind == XMP_S && sbp[a].dim == d) {
                k *= m->shape[a];
                idx = idx * m->shape[a] + coord[a];
            }
        split_range(shape[d], k, idx, &lo[d], &hi[d]);
    }
}

xmesh_result_t xmp_sbp_check(const xmp_mesh_t *m, int ndim, const xmp_sbp_t *sbp, const char *what)
{
    for (int a = 0; a < m->ndim; a++) {
        if (sbp[a].kind != XMP_S && sbp[a].kind != XMP_B && sbp[a].kind != XMP_P)
            return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: mesh axis %d has unknown SBP kind %d",
                           what, a, (int)sbp[a].kind);
        if (sbp[a].kind == XMP_S && (sbp[a].dim < 0 || sbp[a].dim >= ndim))
            return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                           "%s: mesh axis %d: S(%d) split dim out of range (tensor has %d dims)",
                           what, a, sbp[a].dim, ndim);
    }
    return XMESH_SUCCESS;
}

void xmp_sbp_string(const xmp_sbp_t *sbp, int mesh_ndim, char *buf, size_t n)
{
    size_t o = 0;
    buf[0] = 0;
    for (int a = 0; a < mesh_ndim && o < n; a++) {
        const char *sep = a ? "," : "";
        if (sbp[a].kind == XMP_S)
            o += (size_t)snprintf(buf + o, n - o, "%sS(%d)", sep, sbp[a].dim);
        else
            o += (size_t)snprintf(buf + o, n - o, "%s%c", sep, sbp[a].kind == XMP_B ? 'B' : 'P');
    }
}

static xmesh_result_t tensor_alloc(xmp_tensor_t *t, xmp_mesh_t *mesh, int ndim,
                                   const int64_t *shape, xmesh_dtype_t dtype, const xmp_sbp_t *sbp,
                                   int zero)
{
    if (!t || !mesh || !sbp || (ndim && !shape))
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "xmp_tensor_alloc: NULL argument");
    if (ndim < 0 || ndim > XMP_MAX_DIMS)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "tensor ndim %d out of range [0, %d]", ndim,
                       XMP_MAX_DIMS);
    for (int d = 0; d < ndim; d++)
        if (shape[d] < 0)
            return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "tensor shape[%d] = %lld is negative", d,
                           (long long)shape[d]);
    if (dtype != XMESH_F32 && dtype != XMESH_I32)
        return xmp_err(XMESH_ERR_UNSUPPORTED, "tensor dtype %s: only f32 and i32",
                       xmesh_dtype_name(dtype) ? xmesh_dtype_name(dtype) : "unknown");
    xmesh_result_t r = xmp_sbp_check(mesh, ndim, sbp, "xmp_tensor_alloc");
    if (r)
        return r;
    xmp_tensor_t n;
    memset(&n, 0, sizeof n);
    n.ndim = ndim;
    n.dtype = dtype;
    n.mesh = mesh;
    for (int d = 0; d < ndim; d++)
        n.shape[d] = shape[d];
    memcpy(n.sbp, sbp, sizeof(xmp_sbp_t) * (size_t)mesh->ndim);
    xmp_sbp_string(sbp, mesh->ndim, n.spec, sizeof n.spec);
    n.lcount = 0;
    if (mesh->member) {
        int64_t lo[XMP_MAX_DIMS], hi[XMP_MAX_DIMS];
        xmp_block(mesh, ndim, shape, sbp, mesh->coord, lo, hi);
        n.lcount = 1;
        for (int d = 0; d < ndim; d++) {
            n.loff[d] = lo[d];
            n.lshape[d] = hi[d] - lo[d];
            n.lcount *= n.lshape[d];
        }
        size_t ne = (size_t)(n.lcount ? n.lcount : 1);
        n.data = zero ? calloc(ne, 4) : malloc(ne * 4);
        if (!n.data)
            return xmp_err(XMESH_ERR_NO_MEMORY, "xmp_tensor_alloc: %lld elements",
                           (long long)n.lcount);
    }
    if (n.data)
        xmp_mem_track(alloc_bytes(&n));
    *t = n;
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_tensor_alloc(xmp_tensor_t *t, xmp_mesh_t *mesh, int ndim, const int64_t *shape,
                                xmesh_dtype_t dtype, const xmp_sbp_t *sbp)
{
    return tensor_alloc(t, mesh, ndim, shape, dtype, sbp, 1);
}

xmesh_result_t xmp_tensor_alloc_uninit(xmp_tensor_t *t, xmp_mesh_t *mesh, int ndim,
                                       const int64_t *shape, xmesh_dtype_t dtype,
                                       const xmp_sbp_t *sbp)
{
    return tensor_alloc(t, mesh, ndim, shape, dtype, sbp, 0);
}

xmesh_result_t xmp_tensor_alloc_like(xmp_tensor_t *out, const xmp_tensor_t *t)
{
    return xmp_tensor_alloc(out, t->mesh, t->ndim, t->shape, t->dtype, t->sbp);
}

void xmp_tensor_free(xmp_tensor_t *t)
{
    if (!t)
        return;
    if (t->data)
        xmp_mem_track(-alloc_bytes(t));
    free(t->data);
    t->data = NULL;
    t->lcount = 0;
}

xmesh_result_t xmp_tensor_layout(const xmp_tensor_t *t, xmesh_layout_t *l)
{
    if (!t->mesh->xmesh)
        return xmp_err(XMESH_ERR_INVALID_USAGE, "tensor '%s': its mesh has no xmesh mesh (no ctx)",
                       t->spec);
    l->ndim = t->ndim;
    l->shape = t->shape;
    l->dtype = t->dtype;
    l->mesh = t->mesh->xmesh;
    l->sharding = t->spec;
    l->split = XMESH_SPLIT_NUMPY;
    return XMESH_SUCCESS;
}

/* Strided n-d copy of a box of extent ext from src (shape ss, at lo_s) to dst
 * (shape ds, at lo_d); elements of esz bytes. */
void xmp_copy_box(int ndim, const int64_t *ext, const void *src, const int64_t *ss,
                  const int64_t *lo_s, void *dst, const int64_t *ds, const int64_t *lo_d,
                  size_t esz)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= ext[d];
    if (n == 0)
        return;
    if (ndim == 0) {
        memcpy(dst, src, esz);
        return;
    }
    int64_t idx[XMP_MAX_DIMS] = {0};
    int64_t rows = n / ext[ndim - 1];
    size_t row_bytes = (size_t)ext[ndim - 1] * esz;
    for (int64_t r = 0; r < rows; r++) {
        int64_t so = 0, dof = 0;
        for (int d = 0; d < ndim; d++) {
            so = so * ss[d] + lo_s[d] + idx[d];
            dof = dof * ds[d] + lo_d[d] + idx[d];
        }
        memcpy((char *)dst + dof * (int64_t)esz, (const char *)src + so * (int64_t)esz, row_bytes);
        for (int d = ndim - 2; d >= 0; d--) {
            if (++idx[d] < ext[d])
                break;
            idx[d] = 0;
        }
    }
}

xmesh_result_t xmp_tensor_fill_from_full(xmp_tensor_t *t, const void *full)
{
    if (!t->mesh->member)
        return XMESH_SUCCESS;
    for (int a = 0; a < t->mesh->ndim; a++)
        if (t->sbp[a].kind == XMP_P && t->mesh->coord[a] != 0) {
            memset(t->data, 0, (size_t)t->lcount * 4);
            return XMESH_SUCCESS;
        }
    int64_t zero[XMP_MAX_DIMS] = {0};
    xmp_copy_box(t->ndim, t->lshape, full, t->shape, t->loff, t->data, t->lshape, zero, 4);
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_tensor_gather_full(const xmp_tensor_t *t, void *full)
{
    xmp_sbp_t allb[XMP_MAX_MESH_DIMS];
    xmp_tensor_t y;
    for (int a = 0; a < t->mesh->ndim; a++)
        allb[a] = xmp_sbp_b();
    xmesh_result_t r = xmp_box(t, allb, &y);
    if (r)
        return r;
    if (t->mesh->member)
        memcpy(full, y.data, (size_t)y.lcount * 4);
    xmp_tensor_free(&y);
    return XMESH_SUCCESS;
}
