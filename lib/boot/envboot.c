/* Bootstrap from the environment (xm_envboot.h): a TCP star around rank 0.
 *
 * Rendezvous: rank 0 binds the port of XMESH_BOOTSTRAP on every local
 * address and accepts one connection per other rank; each sends a hello
 * (magic, rank, size, pid, host name). Rank 0 checks them (size agrees, no
 * rank twice), closes the listener and answers every connection with one
 * verdict frame: 0, or an error code and the message every rank reports.
 * After a conflict rank 0 keeps accepting until every rank it expects has
 * shown up (or the deadline), so that all of them hear why.
 *
 * All-gather: every rank sends a frame with its bytes to rank 0, which
 * answers with the concatenation (or an error frame naming the rank that
 * failed or never came). An error breaks the bootstrap for good (sticky).
 * Frames: {magic, status, length} then length bytes. */
#define _GNU_SOURCE /* accept4 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "xm_envboot.h"
#include "xm_oob.h"

#define HELLO_MAGIC 0x786d6231u /* "xmb1" */
#define FRAME_MAGIC 0x786d6632u /* "xmf2" */
#define MSG_LEN 640

struct xm_envboot {
    int rank, size;
    int *fds; /* rank 0: fds[q] for q >= 1; others: fds[0] to rank 0 */
    double timeout_s;
    char addr[300]; /* host:port, for messages */
    const char *source;
    int broken;
    xmesh_result_t broken_code;
    char broken_msg[MSG_LEN];
};

typedef struct {
    uint32_t magic;
    int32_t rank, size, pid;
    char host[64];
} hello_t;

typedef struct {
    uint32_t magic;
    int32_t status; /* 0 ok, else an xmesh_result_t */
    uint64_t len;
} frame_t;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Reads or writes exactly n bytes before the deadline (0: none). Returns 0,
 * -1 on error or end of file (errno set; 0 on end of file), -2 at the
 * deadline. */
static int io_full(int fd, void *buf, size_t n, double deadline, int wr)
{
    char *p = buf;
    while (n > 0) {
        int ms = -1;
        if (deadline > 0) {
            double left = deadline - now_s();
            if (left <= 0)
                return -2;
            ms = (int)(left * 1e3) + 1;
        }
        struct pollfd pf = {fd, (short)(wr ? POLLOUT : POLLIN), 0};
        int pr = poll(&pf, 1, ms);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr < 0)
            return -1;
        if (pr == 0)
            continue;
        ssize_t k = wr ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
            continue;
        if (k <= 0) {
            if (k == 0)
                errno = 0;
            return -1;
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static void set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL, 0);
    if (fl >= 0)
        fcntl(fd, F_SETFL, fl | O_NONBLOCK);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* Sends an error frame with msg (best effort). */
static void send_error(int fd, xmesh_result_t code, const char *msg, double deadline)
{
    frame_t f = {FRAME_MAGIC, (int32_t)code, strlen(msg) + 1};
    if (io_full(fd, &f, sizeof f, deadline, 1) == 0)
        io_full(fd, (void *)msg, f.len, deadline, 1);
}

/* Parses a decimal int in [lo, hi]; -1 when set but bad, 0 unset, 1 ok. */
static int env_int(const char *s, int lo, int hi, int *out)
{
    if (!s || !*s)
        return 0;
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || v < lo || v > hi)
        return -1;
    *out = (int)v;
    return 1;
}

/* Rank and size from the first source that sets both. */
static xmesh_result_t env_rank_size(int *rank, int *size, const char **source)
{
    static const char *const src[][3] = {
        {"XMESH_RANK", "XMESH_SIZE", "XMESH_RANK/XMESH_SIZE"},
        {"RANK", "WORLD_SIZE", "RANK/WORLD_SIZE (torchrun)"},
        {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_PROCID/SLURM_NTASKS (Slurm)"},
        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
         "OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE (mpirun as a launcher)"},
    };
    for (int i = 0; i < 4; i++) {
        const char *rs = i == 0 ? xm_param_str(src[i][0]) : getenv(src[i][0]);
        const char *ss = i == 0 ? xm_param_str(src[i][1]) : getenv(src[i][1]);
        if ((!rs || !*rs) && (!ss || !*ss))
            continue;
        int r = -1, s = -1;
        int okr = env_int(rs, 0, 1 << 24, &r), oks = env_int(ss, 1, 1 << 24, &s);
        if (okr != 1 || oks != 1 || r >= s)
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                          "bootstrap: %s = '%s' / '%s': need a rank in [0, size) and a size >= 1",
                          src[i][2], rs ? rs : "", ss ? ss : "");
        *rank = r;
        *size = s;
        *source = src[i][2];
        return XMESH_SUCCESS;
    }
    return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                  "bootstrap: no rank and world size in the environment: set XMESH_RANK and "
                  "XMESH_SIZE, launch with torchrun (RANK, WORLD_SIZE) or srun (SLURM_PROCID, "
                  "SLURM_NTASKS), or pass an xmesh_oob_t");
}

/* First host of a Slurm node list: "node[03-05,7],other" -> "node03". */
static void slurm_first_node(const char *list, char *out, size_t len)
{
    size_t o = 0;
    const char *p = list;
    while (*p && *p != ',' && *p != '[' && o + 1 < len)
        out[o++] = *p++;
    if (*p == '[') {
        p++;
        while (*p && *p != '-' && *p != ',' && *p != ']' && o + 1 < len)
            out[o++] = *p++;
    }
    out[o] = '\0';
}

/* Rendezvous host and port. */
static xmesh_result_t env_address(char *host, size_t hlen, int *port)
{
    const char *b = xm_param_str("XMESH_BOOTSTRAP");
    if (b && *b) {
        const char *c = strrchr(b, ':');
        int p = 0;
        if (!c || c == b || env_int(c + 1, 1, 65535, &p) != 1 || (size_t)(c - b) >= hlen)
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                          "XMESH_BOOTSTRAP '%s': expected host:port with a port in [1, 65535]", b);
        memcpy(host, b, (size_t)(c - b));
        host[c - b] = '\0';
        *port = p;
        return XMESH_SUCCESS;
    }
    const char *ma = getenv("MASTER_ADDR"), *mp = getenv("MASTER_PORT");
    if (ma && *ma) {
        int p = 0;
        if (env_int(mp, 1, 65534, &p) != 1)
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                          "bootstrap: MASTER_ADDR is set but MASTER_PORT '%s' is not a port in [1, "
                          "65534] (xmesh listens on MASTER_PORT + 1; or set XMESH_BOOTSTRAP)",
                          mp ? mp : "");
        snprintf(host, hlen, "%s", ma);
        *port = p + 1; /* MASTER_PORT itself is torchrun's store */
        return XMESH_SUCCESS;
    }
    const char *nl = getenv("SLURM_STEP_NODELIST");
    if (!nl || !*nl)
        nl = getenv("SLURM_JOB_NODELIST");
    const char *job = getenv("SLURM_JOB_ID");
    if (nl && *nl && job && *job) {
        slurm_first_node(nl, host, hlen);
        *port = 29600 + (int)(strtoul(job, NULL, 10) % 1000);
        return XMESH_SUCCESS;
    }
    return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                  "bootstrap: no rendezvous address: set XMESH_BOOTSTRAP=host:port (rank 0's "
                  "host) or MASTER_ADDR and MASTER_PORT");
}

/* ------------------------------------------------------------- rank 0 */

typedef struct {
    int fd;
    hello_t h;
} peer_t;

static xmesh_result_t root_listen(int port, int *out)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return XM_ERR(XMESH_ERR_SYSTEM, "bootstrap: socket: %s", strerror(errno));
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    sa.sin_port = htons((uint16_t)port);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 1024) != 0) {
        int e = errno;
        close(fd);
        return XM_ERR(XMESH_ERR_SYSTEM,
                      "bootstrap: rank 0 cannot listen on port %d: %s (another job's port? set "
                      "XMESH_BOOTSTRAP or MASTER_PORT)",
                      port, strerror(e));
    }
    set_nonblock(fd);
    *out = fd;
    return XMESH_SUCCESS;
}

/* Appends "a, b, c" (ranks with !seen) to buf; returns how many. */
static int list_missing(const char *seen, int size, char *buf, size_t len)
{
    int n = 0;
    size_t o = strlen(buf);
    for (int q = 1; q < size; q++)
        if (!seen[q]) {
            if (n < 16 && o + 16 < len)
                o += (size_t)snprintf(buf + o, len - o, "%s%d", n ? ", " : "", q);
            else if (n == 16 && o + 8 < len)
                o += (size_t)snprintf(buf + o, len - o, ", ...");
            n++;
        }
    return n;
}

static xmesh_result_t root_rendezvous(xm_envboot_t *b, int port, double t0)
{
    int lfd = -1, npeers = 0, cap = b->size + 8;
    xmesh_result_t r = root_listen(port, &lfd);
    if (r)
        return r;
    peer_t *peers = calloc((size_t)cap, sizeof *peers);
    char *seen = calloc((size_t)b->size + 1, 1);
    char msg[MSG_LEN] = "";
    xmesh_result_t code = XMESH_SUCCESS;
    if (!peers || !seen) {
        r = XM_ERR(XMESH_ERR_NO_MEMORY, "bootstrap: out of memory for %d ranks", b->size);
        goto out_close;
    }
    /* Rank 0 answers a little before the others give up on it. */
    double margin = b->timeout_s > 10 ? 1.0 : b->timeout_s * 0.1;
    double deadline = b->timeout_s > 0 ? t0 + b->timeout_s - margin : 0;
    int nseen = 0;
    /* After a conflict, stop once as many processes came as rank 0 expects. */
    while (nseen < b->size - 1 && !(code && npeers >= b->size - 1)) {
        int ms = 200;
        if (deadline > 0) {
            double left = deadline - now_s();
            if (left <= 0)
                break;
            ms = left < 0.2 ? (int)(left * 1e3) + 1 : 200;
        }
        struct pollfd pf = {lfd, POLLIN, 0};
        if (poll(&pf, 1, ms) <= 0)
            continue;
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        set_nonblock(fd);
        hello_t h;
        double hd = now_s() + 5;
        if (deadline > 0 && hd > deadline)
            hd = deadline;
        if (io_full(fd, &h, sizeof h, hd, 0) != 0 || h.magic != HELLO_MAGIC) {
            close(fd); /* not one of ours (a port scan, another program) */
            continue;
        }
        h.host[sizeof h.host - 1] = '\0';
        if (npeers == cap) {
            close(fd);
            continue;
        }
        peers[npeers].fd = fd;
        peers[npeers++].h = h;
        if (h.size != b->size) {
            if (!code) {
                code = XMESH_ERR_MISMATCH;
                snprintf(msg, sizeof msg,
                         "bootstrap: rank %d (pid %d on %s) says the world has %d ranks, rank 0 "
                         "says %d (%s)",
                         h.rank, h.pid, h.host, h.size, b->size, b->source);
            }
            if (h.rank >= 1 && h.rank < b->size && !seen[h.rank]) {
                seen[h.rank] = 1;
                nseen++;
            }
            continue;
        }
        if (h.rank < 1 || h.rank >= b->size)
            continue; /* rank 0 twice: caught below by the other rank 0's own rendezvous */
        if (seen[h.rank]) {
            if (!code) {
                code = XMESH_ERR_MISMATCH;
                const hello_t *o = NULL;
                for (int i = 0; i < npeers - 1; i++)
                    if (peers[i].h.rank == h.rank)
                        o = &peers[i].h;
                snprintf(msg, sizeof msg,
                         "bootstrap: two processes claim rank %d: pid %d on %s and pid %d on %s",
                         h.rank, o ? o->pid : -1, o ? o->host : "?", h.pid, h.host);
            }
            continue;
        }
        seen[h.rank] = 1;
        nseen++;
    }
    close(lfd); /* never left listening, whatever the verdict */
    lfd = -1;
    if (nseen < b->size - 1 && !(code && npeers >= b->size - 1)) {
        char miss[256] = "";
        int n = list_missing(seen, b->size, miss, sizeof miss);
        char prev[200];
        snprintf(prev, sizeof prev, "%s", msg);
        snprintf(msg, sizeof msg,
                 "bootstrap: %d of %d ranks never connected to rank 0 at %s within %.3g s: "
                 "rank%s %s missing%s%s",
                 n, b->size, b->addr, b->timeout_s, n > 1 ? "s" : "", miss, *prev ? "; " : "",
                 prev);
        if (!code)
            code = XMESH_ERR_TIMEOUT;
    }
    double vd = now_s() + 5;
    if (code) {
        for (int i = 0; i < npeers; i++)
            send_error(peers[i].fd, code, msg, vd);
        r = XM_ERR(code, "%s", msg);
        goto out_close;
    }
    for (int i = 0; i < npeers; i++) {
        b->fds[peers[i].h.rank] = peers[i].fd;
        peers[i].fd = -1;
        frame_t f = {FRAME_MAGIC, 0, 0};
        if (io_full(b->fds[peers[i].h.rank], &f, sizeof f, vd, 1) != 0) {
            r = XM_ERR(XMESH_ERR_SYSTEM, "bootstrap: rank %d vanished during the rendezvous",
                       peers[i].h.rank);
            goto out_close;
        }
    }
    r = XMESH_SUCCESS;
out_close:
    if (lfd >= 0)
        close(lfd);
    for (int i = 0; peers && i < npeers; i++)
        if (peers[i].fd >= 0)
            close(peers[i].fd);
    free(peers);
    free(seen);
    return r;
}

/* ---------------------------------------------------------- the others */

static xmesh_result_t peer_rendezvous(xm_envboot_t *b, const char *host, int port, double t0)
{
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    double deadline = b->timeout_s > 0 ? t0 + b->timeout_s : 0;
    char last[200] = "no attempt";
    int fd = -1;
    while (fd < 0) {
        if (deadline > 0 && now_s() >= deadline)
            return XM_ERR(XMESH_ERR_TIMEOUT,
                          "bootstrap: rank %d cannot reach rank 0 at %s within %.3g s (last "
                          "error: %s); is rank 0 running, and XMESH_BOOTSTRAP/MASTER_ADDR right?",
                          b->rank, b->addr, b->timeout_s, last);
        struct addrinfo hints, *ai = NULL;
        memset(&hints, 0, sizeof hints);
        hints.ai_family = AF_INET;
        hints.ai_socktype = SOCK_STREAM;
        int g = getaddrinfo(host, ps, &hints, &ai);
        if (g) {
            snprintf(last, sizeof last, "cannot resolve '%s': %s", host, gai_strerror(g));
        } else {
            fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
            if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
                snprintf(last, sizeof last, "%s", strerror(errno));
                close(fd);
                fd = -1;
            }
            freeaddrinfo(ai);
        }
        if (fd < 0) {
            struct timespec ts = {0, 100 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    set_nonblock(fd);
    hello_t h;
    memset(&h, 0, sizeof h);
    h.magic = HELLO_MAGIC;
    h.rank = b->rank;
    h.size = b->size;
    h.pid = (int32_t)getpid();
    xm_oob_hostname(h.host, sizeof h.host);
    frame_t f;
    /* The verdict comes when every rank has shown up: wait the whole timeout. */
    double vd = deadline > 0 ? deadline + 1.0 : 0;
    int rc = io_full(fd, &h, sizeof h, deadline, 1);
    if (rc == 0)
        rc = io_full(fd, &f, sizeof f, vd, 0);
    if (rc != 0) {
        int e = errno;
        close(fd);
        if (rc == -2)
            return XM_ERR(XMESH_ERR_TIMEOUT,
                          "bootstrap: rank %d reached rank 0 at %s, which did not answer within "
                          "%.3g s",
                          b->rank, b->addr, b->timeout_s);
        return XM_ERR(XMESH_ERR_SYSTEM,
                      "bootstrap: rank %d: rank 0 at %s closed the connection during the "
                      "rendezvous (%s)",
                      b->rank, b->addr, e ? strerror(e) : "end of file");
    }
    if (f.magic != FRAME_MAGIC) {
        close(fd);
        return XM_ERR(XMESH_ERR_SYSTEM, "bootstrap: rank %d: %s answered with garbage: not xmesh",
                      b->rank, b->addr);
    }
    if (f.status) {
        char msg[MSG_LEN] = "";
        size_t n = f.len < sizeof msg ? f.len : sizeof msg - 1;
        io_full(fd, msg, n, now_s() + 5, 0);
        msg[sizeof msg - 1] = '\0';
        close(fd);
        return XM_ERR((xmesh_result_t)f.status, "%s (rank %d, told by rank 0)", msg, b->rank);
    }
    b->fds[0] = fd;
    return XMESH_SUCCESS;
}

/* ----------------------------------------------------------- all-gather */

static int fail_sticky(xm_envboot_t *b, xmesh_result_t code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail_sticky(xm_envboot_t *b, xmesh_result_t code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->broken_msg, sizeof b->broken_msg, fmt, ap);
    va_end(ap);
    b->broken = 1;
    b->broken_code = code;
    XM_ERR(code, "%s", b->broken_msg);
    return (int)code ? (int)code : -1;
}

static int root_allgather(xm_envboot_t *b, const void *send, void *recv, size_t bytes)
{
    char *out = recv;
    memcpy(out, send, bytes);
    char *got = calloc((size_t)b->size, 1);
    if (!got)
        return fail_sticky(b, XMESH_ERR_NO_MEMORY, "bootstrap: out of memory");
    double deadline = b->timeout_s > 0 ? now_s() + b->timeout_s : 0;
    int ngot = 0, bad = -1;
    xmesh_result_t code = XMESH_SUCCESS;
    char msg[MSG_LEN] = "";
    struct pollfd *pf = calloc((size_t)b->size, sizeof *pf);
    if (!pf) {
        free(got);
        return fail_sticky(b, XMESH_ERR_NO_MEMORY, "bootstrap: out of memory");
    }
    while (ngot < b->size - 1 && !code) {
        int n = 0;
        for (int q = 1; q < b->size; q++)
            if (!got[q])
                pf[n++] = (struct pollfd){b->fds[q], POLLIN, 0};
        int ms = -1;
        if (deadline > 0) {
            double left = deadline - now_s();
            if (left <= 0) {
                char miss[256] = "";
                int k = list_missing(got, b->size, miss, sizeof miss);
                code = XMESH_ERR_TIMEOUT;
                snprintf(msg, sizeof msg,
                         "bootstrap: rank%s %s did not join an out-of-band all-gather within "
                         "%.3g s (stopped or busy elsewhere?)",
                         k > 1 ? "s" : "", miss, b->timeout_s);
                break;
            }
            ms = (int)(left * 1e3) + 1;
        }
        int pr = poll(pf, (nfds_t)n, ms);
        if (pr <= 0)
            continue;
        for (int i = 0; i < n && !code; i++) {
            if (!pf[i].revents)
                continue;
            int q = 1;
            while (b->fds[q] != pf[i].fd)
                q++;
            frame_t f;
            double d = now_s() + 5; /* a frame that started arrives promptly */
            if (io_full(b->fds[q], &f, sizeof f, d, 0) != 0 || f.magic != FRAME_MAGIC) {
                code = XMESH_ERR_REMOTE;
                bad = q;
                snprintf(msg, sizeof msg,
                         "bootstrap: rank %d closed its connection to rank 0 (the process "
                         "died or destroyed its context early)",
                         q);
                break;
            }
            if (f.len != bytes) {
                code = XMESH_ERR_MISMATCH;
                snprintf(msg, sizeof msg,
                         "bootstrap: rank %d passed %llu bytes to an all-gather, rank 0 %zu "
                         "(ranks called different collectives)",
                         q, (unsigned long long)f.len, bytes);
                break;
            }
            if (io_full(b->fds[q], out + (size_t)q * bytes, bytes, d, 0) != 0) {
                code = XMESH_ERR_REMOTE;
                bad = q;
                snprintf(msg, sizeof msg, "bootstrap: rank %d died in an all-gather", q);
                break;
            }
            got[q] = 1;
            ngot++;
        }
    }
    free(pf);
    free(got);
    double sd = now_s() + 5;
    if (code) {
        for (int q = 1; q < b->size; q++)
            if (q != bad)
                send_error(b->fds[q], code, msg, sd);
        return fail_sticky(b, code, "%s", msg);
    }
    frame_t f = {FRAME_MAGIC, 0, bytes * (uint64_t)b->size};
    for (int q = 1; q < b->size; q++)
        if (io_full(b->fds[q], &f, sizeof f, sd, 1) != 0 ||
            io_full(b->fds[q], out, f.len, sd + 60, 1) != 0)
            return fail_sticky(b, XMESH_ERR_REMOTE,
                               "bootstrap: rank %d vanished while rank 0 sent an all-gather's "
                               "result",
                               q);
    return 0;
}

static int peer_allgather(xm_envboot_t *b, const void *send, void *recv, size_t bytes)
{
    int fd = b->fds[0];
    frame_t f = {FRAME_MAGIC, 0, bytes};
    double d = now_s() + 60;
    if (io_full(fd, &f, sizeof f, d, 1) != 0 || io_full(fd, (void *)send, bytes, d, 1) != 0)
        return fail_sticky(b, XMESH_ERR_REMOTE,
                           "bootstrap: rank %d lost its connection to rank 0 (rank 0 died?)",
                           b->rank);
    /* Rank 0 answers once everyone came, or with an error at its deadline. */
    double wd = b->timeout_s > 0 ? now_s() + b->timeout_s + 2.0 : 0;
    int rc = io_full(fd, &f, sizeof f, wd, 0);
    if (rc == -2)
        return fail_sticky(b, XMESH_ERR_TIMEOUT,
                           "bootstrap: rank %d: rank 0 did not answer an out-of-band all-gather "
                           "within %.3g s",
                           b->rank, b->timeout_s + 2.0);
    if (rc != 0 || f.magic != FRAME_MAGIC)
        return fail_sticky(b, XMESH_ERR_REMOTE,
                           "bootstrap: rank %d lost its connection to rank 0 (rank 0 died?)",
                           b->rank);
    if (f.status) {
        char msg[MSG_LEN] = "";
        size_t n = f.len < sizeof msg ? f.len : sizeof msg - 1;
        io_full(fd, msg, n, now_s() + 5, 0);
        msg[sizeof msg - 1] = '\0';
        return fail_sticky(b, (xmesh_result_t)f.status, "%s (rank %d, told by rank 0)", msg,
                           b->rank);
    }
    if (f.len != bytes * (uint64_t)b->size)
        return fail_sticky(b, XMESH_ERR_MISMATCH,
                           "bootstrap: rank %d expected %zu bytes from an all-gather, rank 0 sent "
                           "%llu",
                           b->rank, bytes * (size_t)b->size, (unsigned long long)f.len);
    if (io_full(fd, recv, f.len, now_s() + 60, 0) != 0)
        return fail_sticky(b, XMESH_ERR_REMOTE, "bootstrap: rank %d: rank 0 died in an all-gather",
                           b->rank);
    return 0;
}

static int envboot_allgather(void *user, const void *send, void *recv, size_t bytes)
{
    xm_envboot_t *b = user;
    if (b->broken) {
        XM_ERR(b->broken_code, "%s", b->broken_msg);
        return (int)b->broken_code;
    }
    if (b->size == 1) {
        memcpy(recv, send, bytes);
        return 0;
    }
    return b->rank == 0 ? root_allgather(b, send, recv, bytes)
                        : peer_allgather(b, send, recv, bytes);
}

/* ---------------------------------------------------------------- API */

xmesh_result_t xm_envboot_create(double timeout_s, xm_envboot_t **out, xmesh_oob_t *oob)
{
    int rank = 0, size = 0, port = 0;
    const char *source = NULL;
    char host[256] = "";
    xmesh_result_t r = env_rank_size(&rank, &size, &source);
    if (r)
        return r;
    if (size > 1 && (r = env_address(host, sizeof host, &port)))
        return r;
    xm_envboot_t *b = calloc(1, sizeof *b);
    int *fds = malloc(sizeof(int) * (size_t)size);
    if (!b || !fds) {
        free(b);
        free(fds);
        return XM_ERR(XMESH_ERR_NO_MEMORY, "bootstrap: out of memory");
    }
    for (int q = 0; q < size; q++)
        fds[q] = -1;
    b->rank = rank;
    b->size = size;
    b->fds = fds;
    b->source = source;
    b->timeout_s = timeout_s > 0 ? timeout_s : 300;
    snprintf(b->addr, sizeof b->addr, "%s:%d", host, port);
    double t0 = now_s();
    XM_INFO("bootstrap: rank %d of %d (%s), rendezvous %s", rank, size, source, b->addr);
    if (size > 1) {
        r = rank == 0 ? root_rendezvous(b, port, t0) : peer_rendezvous(b, host, port, t0);
        if (r) {
            xm_envboot_destroy(b);
            return r;
        }
    }
    oob->rank = rank;
    oob->size = size;
    oob->allgather = envboot_allgather;
    oob->user = b;
    *out = b;
    return XMESH_SUCCESS;
}

void xm_envboot_destroy(xm_envboot_t *b)
{
    if (!b)
        return;
    for (int q = 0; q < b->size; q++)
        if (b->fds[q] >= 0)
            close(b->fds[q]);
    free(b->fds);
    free(b);
}

const char *xm_envboot_source(const xm_envboot_t *b)
{
    return b ? b->source : "";
}
