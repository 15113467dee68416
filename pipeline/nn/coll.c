/* The deadline engine of pipeline/ (nn/coll.h): failure notices, liveness pings, the one wait
 * loop, and every collective of the training stack posted nonblocking and waited there. */
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nn/coll.h"
#include "nn/sbp.h"

/* ------------------------------------------------------- failure record
 * Process-wide (one job per process): the first failure known here (its sender, its culprit,
 * its text) and which world ranks have posted a notice (for xmp_end_job). */

static pthread_mutex_t g_fail_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int g_failed_rank = -1; /* world rank of the first failure known here */
static int g_culprit = -1;
static char g_failed_msg[XMP_NOTICE_BYTES];
static unsigned char *g_posted; /* world size flags: that rank posted a notice */
static int g_nworld;

/* On the wire a notice is the failed rank it reports (int32: the sender, or the rank whose
 * failure it relays), the culprit (int32), then the text. */
#define NOTICE_WIRE (8 + XMP_NOTICE_BYTES)

static int world_rank(void)
{
    int r = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

static int mpi_usable(void)
{
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    return init && !fin;
}

double xmp_timeout_s(void)
{
    double t = 300.0;
    if (xmesh_ctx_get_timeout(NULL, &t) != XMESH_SUCCESS || !(t >= 0))
        return 300.0;
    return t;
}

double xmp_grace_s(void)
{
    double T = xmp_timeout_s(), g = T / 4;
    if (T <= 0 || g > 2.0)
        return 2.0;
    return g < 0.5 ? 0.5 : g;
}

/* Caller holds g_fail_mu. */
static void mark_posted(int rank)
{
    if (!g_posted) {
        MPI_Comm_size(MPI_COMM_WORLD, &g_nworld);
        g_posted = calloc((size_t)g_nworld, 1); /* lives as long as the process */
    }
    if (g_posted && rank >= 0 && rank < g_nworld)
        g_posted[rank] = 1;
}

static void record_failure(int rank, int culprit, const char *msg)
{
    pthread_mutex_lock(&g_fail_mu);
    if (atomic_load(&g_failed_rank) < 0) {
        snprintf(g_failed_msg, sizeof g_failed_msg, "%s", msg);
        g_culprit = culprit;
        atomic_store(&g_failed_rank, rank);
    }
    pthread_mutex_unlock(&g_fail_mu);
}

/* What this process waits for now: the world ranks of the communicator of the engine wait in
 * progress (none: n 0). A pong carries it, so a rank diagnosing a timeout can follow a chain
 * of waits (it waits for rank 1, which waits for rank 3) to the rank that does not answer. */
#define PONG_RANKS 64
static pthread_mutex_t g_wait_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_wait_n, g_wait_ranks[PONG_RANKS];

static void set_waiting(const int *w, int n)
{
    pthread_mutex_lock(&g_wait_mu);
    g_wait_n = n < PONG_RANKS ? n : PONG_RANKS;
    if (w && g_wait_n > 0)
        memcpy(g_wait_ranks, w, sizeof(int) * (size_t)g_wait_n);
    else
        g_wait_n = 0;
    pthread_mutex_unlock(&g_wait_mu);
}

/* Answers every pending ping (matched probes: thread safe). A pong is the ping's two ints
 * (pinger, probe id), the count and the world ranks this process waits for; sent from a block
 * that is never freed: the pinger may be gone. */
static void serve_pings(void)
{
    for (;;) {
        int flag = 0;
        MPI_Message msg;
        MPI_Status st;
        if (MPI_Improbe(MPI_ANY_SOURCE, XMP_PING_TAG, MPI_COMM_WORLD, &flag, &msg, &st) !=
                MPI_SUCCESS ||
            !flag)
            return;
        int *b = calloc(3 + PONG_RANKS, sizeof(int)), dummy[2];
        MPI_Mrecv(b ? b : dummy, 2, MPI_INT, &msg, MPI_STATUS_IGNORE);
        if (!b)
            continue;
        pthread_mutex_lock(&g_wait_mu);
        b[2] = g_wait_n;
        memcpy(b + 3, g_wait_ranks, sizeof(int) * (size_t)g_wait_n);
        pthread_mutex_unlock(&g_wait_mu);
        MPI_Request q;
        if (MPI_Isend(b, 3 + PONG_RANKS, MPI_INT, st.MPI_SOURCE, XMP_PONG_TAG, MPI_COMM_WORLD,
                      &q) == MPI_SUCCESS)
            MPI_Request_free(&q);
    }
}

/* Reads every pending notice and answers pings. Returns 1 when a failure is known. */
static int poll_notice(void)
{
    if (!mpi_usable())
        return atomic_load(&g_failed_rank) >= 0;
    serve_pings();
    for (;;) {
        int flag = 0;
        MPI_Message msg;
        MPI_Status st;
        if (MPI_Improbe(MPI_ANY_SOURCE, XMP_FAIL_TAG, MPI_COMM_WORLD, &flag, &msg, &st) !=
                MPI_SUCCESS ||
            !flag)
            break;
        char buf[NOTICE_WIRE];
        int32_t origin, culprit;
        memset(buf, 0, sizeof buf);
        MPI_Mrecv(buf, NOTICE_WIRE, MPI_BYTE, &msg, MPI_STATUS_IGNORE);
        buf[NOTICE_WIRE - 1] = 0;
        memcpy(&origin, buf, 4);
        memcpy(&culprit, buf + 4, 4);
        record_failure(origin, culprit, buf + 8);
        pthread_mutex_lock(&g_fail_mu);
        mark_posted(st.MPI_SOURCE);
        pthread_mutex_unlock(&g_fail_mu);
    }
    return atomic_load(&g_failed_rank) >= 0;
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

int xmp_failure_culprit(void)
{
    poll_notice();
    pthread_mutex_lock(&g_fail_mu);
    int c = atomic_load(&g_failed_rank) >= 0 ? g_culprit : -1;
    pthread_mutex_unlock(&g_fail_mu);
    return c;
}

void xmp_fail_clear(void)
{
    pthread_mutex_lock(&g_fail_mu);
    atomic_store(&g_failed_rank, -1);
    g_culprit = -1;
    g_failed_msg[0] = 0;
    if (g_posted)
        memset(g_posted, 0, (size_t)g_nworld);
    pthread_mutex_unlock(&g_fail_mu);
}

/* World ranks of comm's members into w[0..n) (malloc'd, caller frees); n = size; NULL on
 * failure. */
static int *world_ranks(MPI_Comm comm, int *n)
{
    MPI_Group g, wg;
    *n = 0;
    if (comm == MPI_COMM_NULL)
        return NULL;
    MPI_Comm_group(comm, &g);
    MPI_Comm_group(MPI_COMM_WORLD, &wg);
    MPI_Group_size(g, n);
    int *in = malloc(sizeof(int) * (size_t)(2 * *n + 1));
    if (in) {
        for (int i = 0; i < *n; i++)
            in[i] = i;
        MPI_Group_translate_ranks(g, *n, in, wg, in + *n);
        memmove(in, in + *n, sizeof(int) * (size_t)*n);
    }
    MPI_Group_free(&g);
    MPI_Group_free(&wg);
    return in;
}

/* Records a failure of world rank origin and sends its notice to every other rank of comm. */
static xmesh_result_t post_notice(MPI_Comm comm, int origin, int culprit, const char *msg)
{
    int me = world_rank(), n = 0;
    record_failure(origin, culprit, msg ? msg : "");
    pthread_mutex_lock(&g_fail_mu);
    mark_posted(me);
    pthread_mutex_unlock(&g_fail_mu);
    if (comm == MPI_COMM_NULL)
        return XMESH_SUCCESS;
    int *w = world_ranks(comm, &n);
    /* the sends may complete after we return (or never, to a stopped peer): never freed */
    char *buf = calloc(NOTICE_WIRE, 1);
    if (!w || !buf) {
        free(w);
        free(buf);
        return xmp_err(XMESH_ERR_NO_MEMORY, "xmp_fail: out of memory");
    }
    int32_t o = origin, c = culprit;
    memcpy(buf, &o, 4);
    memcpy(buf + 4, &c, 4);
    snprintf(buf + 8, XMP_NOTICE_BYTES, "%s", msg ? msg : "");
    for (int i = 0; i < n; i++) {
        MPI_Request q;
        if (w[i] == MPI_UNDEFINED || w[i] == me)
            continue;
        if (MPI_Isend(buf, NOTICE_WIRE, MPI_BYTE, w[i], XMP_FAIL_TAG, MPI_COMM_WORLD, &q) ==
            MPI_SUCCESS)
            MPI_Request_free(&q);
    }
    free(w);
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_fail_blame(MPI_Comm comm, int culprit, const char *msg)
{
    return post_notice(comm, world_rank(), culprit, msg);
}

xmesh_result_t xmp_fail(MPI_Comm comm, const char *msg)
{
    return xmp_fail_blame(comm, world_rank(), msg);
}

static void nap(long *ns)
{
    *ns = *ns ? (*ns * 2 > 1000000 ? 1000000 : *ns * 2) : 20000;
    struct timespec ts = {0, *ns};
    nanosleep(&ts, NULL);
}

/* Sends a ping to world rank w (the block is never freed: a stopped peer never takes it). */
static void ping(int w, int me, int id)
{
    int *b = malloc(2 * sizeof(int));
    MPI_Request q;
    if (!b)
        return;
    b[0] = me;
    b[1] = id;
    if (MPI_Isend(b, 2, MPI_INT, w, XMP_PING_TAG, MPI_COMM_WORLD, &q) == MPI_SUCCESS)
        MPI_Request_free(&q);
}

int xmp_diagnose(MPI_Comm comm, double grace, int *silent, int *via, int max)
{
    static _Atomic int next_id = 1;
    int me = world_rank(), n = 0, nw = 0, id = atomic_fetch_add(&next_id, 1);
    MPI_Comm_size(MPI_COMM_WORLD, &nw);
    int *w = world_ranks(comm, &n);
    /* per world rank: 0 not asked, 1 asked, 2 answered; from: whose wait led to it (-1: comm) */
    char *state = calloc((size_t)nw, 1);
    int *from = malloc(sizeof(int) * (size_t)nw);
    if (!w || !state || !from) {
        free(w);
        free(state);
        free(from);
        return 0;
    }
    int left = 0;
    for (int i = 0; i < n; i++) {
        if (w[i] == me || w[i] == MPI_UNDEFINED || w[i] < 0 || w[i] >= nw || state[w[i]])
            continue;
        state[w[i]] = 1;
        from[w[i]] = -1;
        left++;
        ping(w[i], me, id);
    }
    double t0 = MPI_Wtime();
    long ns = 0;
    while (left > 0 && MPI_Wtime() - t0 < grace) {
        poll_notice(); /* answers the others' pings too: they may be diagnosing as well */
        int flag = 0;
        MPI_Message msg;
        MPI_Status st;
        if (MPI_Improbe(MPI_ANY_SOURCE, XMP_PONG_TAG, MPI_COMM_WORLD, &flag, &msg, &st) !=
                MPI_SUCCESS ||
            !flag) {
            nap(&ns);
            continue;
        }
        int b[3 + PONG_RANKS], s = st.MPI_SOURCE;
        memset(b, 0, sizeof b);
        MPI_Mrecv(b, 3 + PONG_RANKS, MPI_INT, &msg, MPI_STATUS_IGNORE);
        if (b[0] != me || b[1] != id || s < 0 || s >= nw || state[s] != 1)
            continue; /* the answer to an earlier diagnosis */
        state[s] = 2;
        left--;
        /* it is alive but waits itself: ask the ranks it waits for too */
        for (int i = 0; i < b[2] && i < PONG_RANKS; i++) {
            int r = b[3 + i];
            if (r < 0 || r >= nw || r == me || state[r])
                continue;
            state[r] = 1;
            from[r] = s;
            left++;
            ping(r, me, id);
        }
    }
    int k = 0;
    for (int r = 0; r < nw; r++) /* increasing world rank */
        if (state[r] == 1) {
            if (k < max) {
                silent[k] = r;
                if (via)
                    via[k] = from[r];
            }
            k++;
        }
    free(w);
    free(state);
    free(from);
    return k;
}

int xmp_fail_here(MPI_Comm comm, const char *msg)
{
    if (xmp_failed_rank(NULL, 0) >= 0)
        return xmp_failure_culprit();
    int silent[1], me = world_rank();
    int k = xmp_diagnose(comm, xmp_grace_s(), silent, NULL, 1);
    if (xmp_failed_rank(NULL, 0) >= 0) /* someone else concluded meanwhile */
        return xmp_failure_culprit();
    (void)xmp_fail_blame(comm, k > 0 ? silent[0] : me, msg);
    return xmp_failure_culprit();
}

void xmp_end_job(int code)
{
    double T = xmp_timeout_s(), lim = T < 1 ? (T <= 0 ? 30 : 1) : T > 30 ? 30 : T;
    double t0 = MPI_Wtime();
    long ns = 0;
    fflush(stdout);
    fflush(stderr);
    /* say it to every other rank (they count the ranks that have) unless done already */
    int me = world_rank(), culprit = xmp_failure_culprit(), mine = 0;
    pthread_mutex_lock(&g_fail_mu);
    mine = g_posted && me < g_nworld && g_posted[me];
    pthread_mutex_unlock(&g_fail_mu);
    if (!mine) { /* relays the failure known here: the same report on every rank */
        char msg[XMP_NOTICE_BYTES];
        int fr = xmp_failed_rank(msg, sizeof msg);
        if (fr < 0) {
            fr = me;
            snprintf(msg, sizeof msg, "rank %d ends the job", me);
        }
        (void)post_notice(MPI_COMM_WORLD, fr, culprit >= 0 ? culprit : fr, msg);
    }
    for (;;) {
        poll_notice();
        int missing = 0;
        culprit = xmp_failure_culprit();
        pthread_mutex_lock(&g_fail_mu);
        for (int r = 0; g_posted && r < g_nworld; r++)
            if (!g_posted[r] && r != culprit)
                missing++;
        pthread_mutex_unlock(&g_fail_mu);
        if (!missing || MPI_Wtime() - t0 >= lim)
            break;
        nap(&ns);
    }
    /* the last rank to post may still be writing its line: give its output a moment */
    struct timespec ts = {0, 200000000};
    nanosleep(&ts, NULL);
    fflush(stdout);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    exit(code); /* MPI_Abort does not return; for the compiler */
}

/* ------------------------------------------------------------------ waits */

/* " over world ranks 0,1,2,3" (the first 16) for messages. */
static void comm_ranks(MPI_Comm comm, char *out, size_t len)
{
    int n = 0;
    int *w = world_ranks(comm, &n);
    out[0] = 0;
    if (!w)
        return;
    int k = n < 16 ? n : 16;
    size_t o = (size_t)snprintf(out, len, " over world ranks ");
    for (int i = 0; i < k && o < len; i++)
        o += (size_t)snprintf(out + o, len - o, "%s%d", i ? "," : "", w[i]);
    if (n > k && o < len)
        snprintf(out + o, len - o, ",... (%d ranks)", n);
    free(w);
}

/* ": rank 3 does not answer", ": rank 3 does not answer (rank 1 waits for it)", ": ranks 2,3
 * do not answer", ": every rank of it answers (one is waiting elsewhere)". */
static void silent_text(const int *s, const int *via, int k, char *out, size_t len)
{
    if (k == 0) {
        snprintf(out, len, ": every rank of it answers (one is waiting elsewhere)");
        return;
    }
    size_t o = (size_t)snprintf(out, len, ": rank%s ", k > 1 ? "s" : "");
    for (int i = 0; i < k && i < 8 && o < len; i++)
        o += (size_t)snprintf(out + o, len - o, "%s%d", i ? "," : "", s[i]);
    if (o < len)
        o += (size_t)snprintf(out + o, len - o, "%s %s", k > 8 ? ",..." : "",
                              k > 1 ? "do not answer" : "does not answer");
    if (k == 1 && via[0] >= 0 && o < len)
        snprintf(out + o, len - o, " (rank %d waits for it)", via[0]);
}

xmesh_result_t xmp_wait(MPI_Request *req, MPI_Comm comm, const char *what)
{
    return xmp_waitall(1, req, comm, what);
}

xmesh_result_t xmp_waitall(int nreq, MPI_Request *req, MPI_Comm comm, const char *what)
{
    double t0 = MPI_Wtime(), T = xmp_timeout_s(), t_poll = t0;
    long it = 0, ns = 0;
    xmesh_result_t r;
    char ranks[160], fmsg[XMP_NOTICE_BYTES];
    int registered = 0;
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
        /* notices and pings every 10 ms (and at once): a rank diagnosing a timeout waits for
         * this answer, also on a loaded host where 64 rounds of sched_yield took long */
        double now = MPI_Wtime();
        int poll = it == 0 || now - t_poll >= 0.01;
        if (poll)
            t_poll = now;
        if (poll && !registered && now - t0 >= 0.01) {
            /* a wait that lasts: say what it waits for to whoever asks (serve_pings) */
            int nmem = 0, *mem = world_ranks(comm, &nmem);
            set_waiting(mem, nmem);
            free(mem);
            registered = 1;
        }
        if (poll && poll_notice()) {
            int fr = xmp_failed_rank(fmsg, sizeof fmsg), c = xmp_failure_culprit();
            comm_ranks(comm, ranks, sizeof ranks);
            if (fr == world_rank())
                r = xmp_err(XMESH_ERR_REMOTE,
                            "rank %d: %s%s abandoned: this rank failed earlier (%s)", fr, what,
                            ranks, fmsg);
            else if (c >= 0 && c != fr)
                r = xmp_err(XMESH_ERR_REMOTE,
                            "rank %d: %s%s abandoned: rank %d does not answer (found by rank "
                            "%d: %s)",
                            world_rank(), what, ranks, c, fr, fmsg);
            else
                r = xmp_err(XMESH_ERR_REMOTE, "rank %d: %s%s abandoned: rank %d failed (%s)",
                            world_rank(), what, ranks, fr, fmsg);
            break;
        }
        double el = MPI_Wtime() - t0;
        if (T > 0 && el >= T) {
            int silent[16], via[16];
            int k = xmp_diagnose(comm, xmp_grace_s(), silent, via, 16);
            char st[200];
            silent_text(silent, via, k, st, sizeof st);
            comm_ranks(comm, ranks, sizeof ranks);
            r = xmp_err(XMESH_ERR_TIMEOUT,
                        "rank %d: %s%s timed out after %.3g s (XMESH_TIMEOUT_S = %g)%s",
                        world_rank(), what, ranks, el, T, st);
            break;
        }
        /* Progress needs this rank to call MPI_Test (no progress thread): poll and yield
         * the core for the first second (collectives of several rounds on an oversubscribed
         * host: sleeping here doubled the time of test_sbp_layers on 8 ranks over 2 cores),
         * then sleep with back-off up to 1 ms so a stalled job costs little CPU. */
        it++;
        if (el < 1.0)
            sched_yield();
        else
            nap(&ns);
    }
    if (registered)
        set_waiting(NULL, 0);
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
    int c = xmp_failure_culprit();
    if (c >= 0 && c != fr)
        return xmp_err(XMESH_ERR_REMOTE,
                       "rank %d: %s not started: rank %d does not answer (found by rank %d: %s)",
                       world_rank(), what, c, fr, fmsg);
    return xmp_err(XMESH_ERR_REMOTE, "rank %d: %s not started: rank %d failed (%s)", world_rank(),
                   what, fr, fmsg);
}

/* The name of a collective in messages: "MPI_Isend to rank 3 (what)". */
#define NAME_LEN 200

/* Names a collective into w (NAME_LEN bytes) and returns the failure already known here, if any
 * (known_failure): a collective is not started after one. */
static xmesh_result_t named(char *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static xmesh_result_t named(char *w, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w, NAME_LEN, fmt, ap);
    va_end(ap);
    return known_failure(w);
}

/* Posting (rc: the MPI_I* call's) and waiting (xmp_wait) of one staged request q. When posting
 * fails the stage s is freed; when the wait fails the collective is abandoned and s stays
 * allocated (MPI may still read or write it). */
static xmesh_result_t post_wait(int rc, MPI_Request *q, MPI_Comm comm, const char *w, void *s)
{
    xmesh_result_t r = posted(rc, w);
    if (r) {
        free(s);
        return r;
    }
    return xmp_wait(q, comm, w);
}

/* The deadline all-reduce both wrappers below share: staged, in place, waited by xmp_wait. */
static xmesh_result_t allreduce_staged(void *buf, int count, MPI_Datatype ty, MPI_Op op,
                                       MPI_Comm comm, const char *what)
{
    size_t bytes = (size_t)count * type_size(ty);
    MPI_Request q;
    char w[NAME_LEN];
    xmesh_result_t r = named(w, "MPI_Iallreduce (%s)", what);
    if (r)
        return r;
    /* Out of place (send copy, receive half): with MPI_IN_PLACE Open MPI's libnbc takes its
     * binomial reduce + broadcast instead of the ring, 3.5x slower for GPT-2's gradients on
     * the emulated cluster (docs/SEARCH.md). */
    char *s = stage(2 * bytes);
    if (!s)
        return xmp_err(XMESH_ERR_NO_MEMORY, "%s: out of memory", w);
    memcpy(s, buf, bytes);
    if ((r = post_wait(MPI_Iallreduce(s, s + bytes, count, ty, op, comm, &q), &q, comm, w, s)))
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
    xmp_comm_count_add(XMP_COLL_ALLREDUCE, p, (int64_t)bytes, 2.0 * (p - 1) / p * (double)bytes);
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
    char w[NAME_LEN];
    xmesh_result_t r = named(w, "MPI_Isend to rank %d (%s)", dest, what);
    if (r)
        return r;
    void *s = stage(bytes);
    if (!s)
        return xmp_err(XMESH_ERR_NO_MEMORY, "%s: out of memory", w);
    memcpy(s, buf, bytes);
    if ((r = post_wait(MPI_Isend(s, count, ty, dest, tag, comm, &q), &q, comm, w, s)))
        return r; /* abandoned: s stays allocated */
    free(s);
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_recv(void *buf, int count, MPI_Datatype ty, int src, int tag, MPI_Comm comm,
                        const char *what)
{
    size_t bytes = (size_t)count * type_size(ty);
    MPI_Request q;
    char w[NAME_LEN];
    xmesh_result_t r = named(w, "MPI_Irecv from rank %d (%s)", src, what);
    if (r)
        return r;
    void *s = stage(bytes);
    if (!s)
        return xmp_err(XMESH_ERR_NO_MEMORY, "%s: out of memory", w);
    if ((r = post_wait(MPI_Irecv(s, count, ty, src, tag, comm, &q), &q, comm, w, s)))
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

static xmesh_result_t allgatherv_staged(const void *sbuf, int scount, void *rbuf,
                                        const int *rcounts, const int *rdispls, MPI_Datatype ty,
                                        MPI_Comm comm, const char *what, int counted)
{
    int n = 0;
    MPI_Request q;
    char w[NAME_LEN];
    xmesh_result_t r = named(w, "MPI_Iallgatherv (%s)", what);
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
    if ((r = post_wait(MPI_Iallgatherv(s + ints, scount, ty, s + ints + sb, c, d, ty, comm, &q), &q,
                       comm, w, s)))
        return r;
    memcpy(rbuf, s + ints + sb, rb);
    free(s);
    if (!counted)
        return XMESH_SUCCESS;
    int64_t tot = 0;
    for (int i = 0; i < n; i++)
        tot += rcounts[i];
    xmp_comm_count_add(XMP_COLL_ALLGATHER, n, (int64_t)sb,
                       (double)(n - 1) / n * (double)tot * (double)es);
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_allgatherv(const void *sbuf, int scount, void *rbuf, const int *rcounts,
                              const int *rdispls, MPI_Datatype ty, MPI_Comm comm, const char *what)
{
    return allgatherv_staged(sbuf, scount, rbuf, rcounts, rdispls, ty, comm, what, 1);
}

xmesh_result_t xmp_allgatherv_ctl(const void *sbuf, int scount, void *rbuf, const int *rcounts,
                                  const int *rdispls, MPI_Datatype ty, MPI_Comm comm,
                                  const char *what)
{
    return allgatherv_staged(sbuf, scount, rbuf, rcounts, rdispls, ty, comm, what, 0);
}

xmesh_result_t xmp_allgather(const void *sbuf, int count, void *rbuf, MPI_Datatype ty,
                             MPI_Comm comm, const char *what)
{
    int n = 0;
    MPI_Comm_size(comm, &n);
    int *cd = malloc(sizeof(int) * 2 * (size_t)n);
    if (!cd)
        return xmp_err(XMESH_ERR_NO_MEMORY, "MPI_Iallgatherv (%s): out of memory", what);
    for (int i = 0; i < n; i++) {
        cd[i] = count;
        cd[n + i] = i * count;
    }
    xmesh_result_t r = allgatherv_staged(sbuf, count, rbuf, cd, cd + n, ty, comm, what, 0);
    free(cd);
    return r;
}

xmesh_result_t xmp_reduce_scatter(const void *sbuf, void *rbuf, const int *rcounts, MPI_Datatype ty,
                                  MPI_Op op, MPI_Comm comm, const char *what)
{
    int n = 0, me = 0;
    MPI_Request q;
    char w[NAME_LEN];
    xmesh_result_t r = named(w, "MPI_Ireduce_scatter (%s)", what);
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
    if ((r = post_wait(MPI_Ireduce_scatter(s + ints, s + ints + sb, c, ty, op, comm, &q), &q, comm,
                       w, s)))
        return r;
    memcpy(rbuf, s + ints + sb, rb);
    free(s);
    xmp_comm_count_add(XMP_COLL_REDUCE_SCATTER, n, (int64_t)sb, (double)(n - 1) / n * (double)sb);
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
    char w[NAME_LEN];
    xmesh_result_t r = named(w, "all-to-all by MPI_Isend/MPI_Irecv (%s)", what);
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
    xmp_comm_count_add(XMP_COLL_ALLTOALL, n, off, (double)off);
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_barrier(MPI_Comm comm, const char *what)
{
    MPI_Request q;
    char w[NAME_LEN];
    xmesh_result_t r = named(w, "MPI_Ibarrier (%s)", what);
    if (r)
        return r;
    return post_wait(MPI_Ibarrier(comm, &q), &q, comm, w, NULL);
}

xmesh_result_t xmp_bcast(void *buf, int count, MPI_Datatype ty, int root, MPI_Comm comm,
                         const char *what)
{
    size_t bytes = (size_t)count * type_size(ty);
    MPI_Request q;
    char w[NAME_LEN];
    xmesh_result_t r = named(w, "MPI_Ibcast from rank %d (%s)", root, what);
    if (r)
        return r;
    char *s = stage(bytes);
    if (!s)
        return xmp_err(XMESH_ERR_NO_MEMORY, "%s: out of memory", w);
    memcpy(s, buf, bytes);
    if ((r = post_wait(MPI_Ibcast(s, count, ty, root, comm, &q), &q, comm, w, s)))
        return r; /* abandoned: s stays allocated */
    memcpy(buf, s, bytes);
    free(s);
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_gatherv(const void *sbuf, int scount, void *rbuf, const int *rcounts,
                           const int *rdispls, MPI_Datatype ty, int root, MPI_Comm comm,
                           const char *what)
{
    int n = 0, me = 0;
    MPI_Request q;
    char w[NAME_LEN];
    xmesh_result_t r = named(w, "MPI_Igatherv to rank %d (%s)", root, what);
    if (r)
        return r;
    MPI_Comm_size(comm, &n);
    MPI_Comm_rank(comm, &me);
    size_t es = type_size(ty);
    int64_t re = me == root ? extent(n, rcounts, rdispls) : 0;
    size_t ints = me == root ? sizeof(int) * 2 * (size_t)n : 0, sb = (size_t)scount * es,
           rb = (size_t)re * es;
    char *s = stage(ints + sb + rb);
    if (!s)
        return xmp_err(XMESH_ERR_NO_MEMORY, "%s: out of memory", w);
    int *c = (int *)s, *d = c + n;
    if (me == root) {
        memcpy(c, rcounts, sizeof(int) * (size_t)n);
        memcpy(d, rdispls, sizeof(int) * (size_t)n);
    }
    memcpy(s + ints, sbuf, sb);
    if ((r = post_wait(MPI_Igatherv(s + ints, scount, ty, s + ints + sb, me == root ? c : NULL,
                                    me == root ? d : NULL, ty, root, comm, &q),
                       &q, comm, w, s)))
        return r;
    if (me == root)
        memcpy(rbuf, s + ints + sb, rb);
    free(s);
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_gather(const void *sbuf, int count, void *rbuf, MPI_Datatype ty, int root,
                          MPI_Comm comm, const char *what)
{
    int n = 0, me = 0;
    MPI_Comm_size(comm, &n);
    MPI_Comm_rank(comm, &me);
    int *cd = NULL;
    if (me == root && !(cd = malloc(sizeof(int) * 2 * (size_t)n)))
        return xmp_err(XMESH_ERR_NO_MEMORY, "MPI_Igatherv (%s): out of memory", what);
    for (int i = 0; cd && i < n; i++) {
        cd[i] = count;
        cd[n + i] = i * count;
    }
    xmesh_result_t r = xmp_gatherv(sbuf, count, rbuf, cd, cd ? cd + n : NULL, ty, root, comm, what);
    free(cd);
    return r;
}
