/*
 * One rank of a bootstrap test (started by xmesh-launch.py): creates a UCX
 * context from the environment and judges the outcome itself.
 *
 *   ucx_boot --expect ok [--data]        the context comes up; with --data a
 *                                        plan S(0) -> B over every rank moves
 *                                        data, every element checked
 *   ucx_boot --expect CODE --msg TEXT    creation fails with XMESH_ERR_CODE
 *                                        (e.g. MISMATCH) and a message that
 *                                        contains TEXT (repeatable: all)
 *   --max-s S     creation must return within S seconds (x XMESH_TEST_TIME_SCALE)
 *   --no-listener after a failure, nothing may accept connections on the
 *                 rendezvous port (XMESH_BOOTSTRAP or MASTER_PORT + 1), and
 *                 the process holds no more file descriptors than before
 * Prints PASS or FAIL with the rank, the result and the message; exit 0 on
 * PASS.
 */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "xmesh.h"
#include "xmesh/ucx.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int count_fds(void)
{
    int n = 0;
    for (int fd = 0; fd < 1024; fd++)
        n += fcntl(fd, F_GETFD) != -1;
    return n;
}

/* 1 when something accepts a TCP connection on 127.0.0.1:port. */
static int port_open(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int ok = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
    close(fd);
    return ok;
}

static int rendezvous_port(void)
{
    const char *b = getenv("XMESH_BOOTSTRAP");
    if (b && strrchr(b, ':'))
        return atoi(strrchr(b, ':') + 1);
    const char *mp = getenv("MASTER_PORT");
    return mp ? atoi(mp) + 1 : -1;
}

/* S(0) over every rank -> B on every rank: every element checked. */
static int move_data(xmesh_ctx_t ctx, char *why, size_t len)
{
    int rank, size;
    xmesh_ctx_rank(ctx, &rank);
    xmesh_ctx_size(ctx, &size);
    int *ranks = malloc(sizeof(int) * size), shape[1] = {size};
    for (int i = 0; i < size; i++)
        ranks[i] = i;
    xmesh_mesh_t m = NULL;
    xmesh_plan_t p = NULL;
    int64_t n = 1000 + 7 * size, lshape[1];
    int holds = 0, ok = 0;
    int32_t *src = NULL, *dst = malloc(sizeof(int32_t) * n);
    int64_t off[1];
    if (xmesh_mesh_create(ctx, 1, shape, ranks, &m))
        goto out;
    xmesh_layout_t sl = {1, &n, XMESH_I32, m, "S(0)"}, dl = {1, &n, XMESH_I32, m, "B"};
    if (xmesh_plan_create(ctx, &sl, &dl, NULL, &p))
        goto out;
    xmesh_layout_local_shape(&sl, rank, lshape, &holds);
    xmesh_layout_local_offset(&sl, rank, off, &holds);
    src = malloc(sizeof(int32_t) * (lshape[0] + 1));
    for (int64_t i = 0; i < lshape[0]; i++)
        src[i] = (int32_t)(3 * (off[0] + i) + 1);
    memset(dst, 0xff, sizeof(int32_t) * n);
    if (xmesh_reshard(p, src, dst))
        goto out;
    ok = 1;
    for (int64_t i = 0; i < n && ok; i++)
        if (dst[i] != (int32_t)(3 * i + 1)) {
            snprintf(why, len, "element %lld is %d, want %d", (long long)i, dst[i],
                     (int)(3 * i + 1));
            ok = 0;
        }
out:
    if (!ok && !*why)
        snprintf(why, len, "%s", xmesh_last_error());
    xmesh_plan_destroy(p);
    xmesh_mesh_destroy(m);
    free(ranks);
    free(src);
    free(dst);
    return ok;
}

int main(int argc, char **argv)
{
    const char *expect = "ok", *msgs[8];
    int nmsg = 0, data = 0, no_listener = 0;
    double max_s = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--expect") && i + 1 < argc)
            expect = argv[++i];
        else if (!strcmp(argv[i], "--msg") && i + 1 < argc && nmsg < 8)
            msgs[nmsg++] = argv[++i];
        else if (!strcmp(argv[i], "--max-s") && i + 1 < argc)
            max_s = atof(argv[++i]);
        else if (!strcmp(argv[i], "--data"))
            data = 1;
        else if (!strcmp(argv[i], "--no-listener"))
            no_listener = 1;
    }
    const char *sc = getenv("XMESH_TEST_TIME_SCALE");
    if (sc && atof(sc) > 0)
        max_s *= atof(sc);
    const char *who = getenv("RANK")           ? getenv("RANK")
                      : getenv("SLURM_PROCID") ? getenv("SLURM_PROCID")
                      : getenv("XMESH_RANK")   ? getenv("XMESH_RANK")
                                               : "?";
    int fd0 = count_fds();
    xmesh_ctx_t ctx = NULL;
    double t0 = now_s();
    xmesh_result_t r = xmesh_ctx_create_ucx(NULL, NULL, &ctx);
    double dt = now_s() - t0;
    char msg[1024], why[512] = "";
    snprintf(msg, sizeof msg, "%s", xmesh_last_error());
    int ok = 1;
    if (!strcmp(expect, "ok")) {
        if (r) {
            ok = 0;
            snprintf(why, sizeof why, "context creation failed");
        } else if (data && !move_data(ctx, why, sizeof why)) {
            ok = 0;
        }
        if (ctx && xmesh_ctx_destroy(ctx)) {
            ok = 0;
            snprintf(why, sizeof why, "ctx_destroy: %s", xmesh_last_error());
        }
    } else {
        char want[64];
        snprintf(want, sizeof want, "XMESH_ERR_%s", expect);
        if (strcmp(xmesh_result_string(r), xmesh_result_string(XMESH_SUCCESS)) == 0 || ctx) {
            ok = 0;
            snprintf(why, sizeof why, "creation succeeded, expected %s", want);
            xmesh_ctx_destroy(ctx);
        }
        /* the code by name: compare with the table */
        static const struct {
            const char *name;
            xmesh_result_t code;
        } codes[] = {{"INVALID_ARGUMENT", XMESH_ERR_INVALID_ARGUMENT},
                     {"MISMATCH", XMESH_ERR_MISMATCH},
                     {"TIMEOUT", XMESH_ERR_TIMEOUT},
                     {"REMOTE", XMESH_ERR_REMOTE},
                     {"SYSTEM", XMESH_ERR_SYSTEM}};
        int found = 0;
        for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
            if (!strcmp(codes[i].name, expect)) {
                found = 1;
                if (ok && r != codes[i].code) {
                    ok = 0;
                    snprintf(why, sizeof why, "got %s, expected %s", xmesh_result_string(r),
                             xmesh_result_string(codes[i].code));
                }
            }
        if (!found) {
            ok = 0;
            snprintf(why, sizeof why, "unknown --expect %s", expect);
        }
        for (int i = 0; ok && i < nmsg; i++)
            if (!strstr(msg, msgs[i])) {
                ok = 0;
                snprintf(why, sizeof why, "message lacks '%s'", msgs[i]);
            }
        if (ok && no_listener) {
            int port = rendezvous_port();
            if (port > 0 && port_open(port)) {
                ok = 0;
                snprintf(why, sizeof why, "port %d still accepts connections", port);
            }
            int fd1 = count_fds();
            if (ok && fd1 != fd0) {
                ok = 0;
                snprintf(why, sizeof why, "%d file descriptors before, %d after", fd0, fd1);
            }
        }
    }
    if (ok && max_s > 0 && dt > max_s) {
        ok = 0;
        snprintf(why, sizeof why, "took %.2f s, more than %.2f s", dt, max_s);
    }
    printf("%s rank %s: %s after %.2f s: %s%s%s\n", ok ? "PASS" : "FAIL", who,
           xmesh_result_string(r), dt, r ? msg : "context up", *why ? " -- " : "", why);
    fflush(stdout);
    return ok ? 0 : 1;
}
