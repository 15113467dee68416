/*
 * xmesh-calibrate: fits the cost model of the cluster it runs on.
 *
 *   mpirun -np N xmesh-calibrate [-o FILE] [--json] [options]
 *
 * Hosts are the xmesh context's (MPI shared-memory split, XMESH_HOST_ID, or
 * --virtual-hosts K: rank / K). Over a geometric sweep of sizes it times
 *   p2p-intra   ping-pong between two ranks of one host (half a round trip)
 *   p2p-inter   ping-pong between the first ranks of hosts 0 and 1
 *   chain       one rank to one rank on every other host, the way the
 *               executor runs it: an xmesh plan (R -> R, broadcast chain)
 *   allgather   MPI_Allgather over the first rank of every host (x = the
 *               bytes each rank ends with), and over the ranks of host 0
 *               (allgather-intra)
 * and fits time = alpha + beta * bytes per class by least squares (AutoDDL,
 * paper 000 section 3.2), reporting R^2 and the worst relative residual.
 * The cluster file (scheduler/xm_cluster_file.h) takes nic_gbps = 8 /
 * beta(p2p-inter), latency_us = alpha(p2p-inter) and intra_gbps = 8 /
 * beta(p2p-intra); every fit is also written there as a comment. Each
 * point is the median over --reps repetitions, each timed from a barrier to
 * the slowest rank (max over ranks).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "xm_api.h"
#include "xm_cost.h"
#include "xmesh/mpi.h"

#define MAX_SIZES 32
#define MAX_REPS 64

enum { C_P2P_INTRA, C_P2P_INTER, C_CHAIN, C_AG_INTER, C_AG_INTRA, NCLASS };
static const char *cname[NCLASS] = {"p2p-intra", "p2p-inter", "chain", "allgather",
                                    "allgather-intra"};
static const char *chelp[NCLASS] = {
    "ping-pong, two ranks of one host (one way)", "ping-pong, hosts 0 and 1 (one way)",
    "xmesh broadcast chain, one rank -> one per other host",
    "MPI_Allgather, first rank of every host", "MPI_Allgather, ranks of host 0"};

typedef struct {
    int64_t minb, maxb;
    int steps, reps, vhosts, json;
    const char *out;
} opts_t;

typedef struct {
    int ok; /* measured */
    char why[128];
    int n;
    double x[MAX_SIZES], y[MAX_SIZES];
    xm_fit_t fit;
    int fit_ok;
} klass_t;

static int rank, size;
static xmesh_ctx_t ctx;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: mpirun -np N xmesh-calibrate [options]\n"
            "Measures point-to-point, chain and all-gather times between ranks of one host\n"
            "and of different hosts, fits alpha (latency) + beta (s/byte) per class by least\n"
            "squares and writes a cluster file for xmesh-plan --cluster, xmesh-bench --cluster\n"
            "and XMESH_CLUSTER_FILE.\n"
            "  -o, --output FILE     write the cluster file\n"
            "  --json                one JSON object on stdout instead of the table\n"
            "  --min BYTES           smallest message (default 64K; K/M/G suffixes)\n"
            "  --max BYTES           largest message (default 8M)\n"
            "  --steps N             sizes in the geometric sweep (default 6, 2..%d)\n"
            "  --reps N              repetitions per size, median kept (default 3, 1..%d)\n"
            "  --virtual-hosts K     hosts of K consecutive ranks (one machine; tests)\n"
            "  -h, --help\n",
            MAX_SIZES, MAX_REPS);
}

static int64_t parse_bytes(const char *s)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !(v > 0))
        return -1;
    if (*end == 'K' || *end == 'k')
        v *= 1024, end++;
    else if (*end == 'M' || *end == 'm')
        v *= 1024 * 1024, end++;
    else if (*end == 'G' || *end == 'g')
        v *= 1024.0 * 1024 * 1024, end++;
    if (*end || v > (double)(1LL << 31) - 1 || v < 4)
        return -1;
    return (int64_t)v;
}

static int parse(int argc, char **argv, opts_t *o, char *err, size_t errlen)
{
    o->minb = 64 << 10;
    o->maxb = 8 << 20;
    o->steps = 6;
    o->reps = 3;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help"))
            return 1;
        if (!strcmp(a, "--json")) {
            o->json = 1;
            continue;
        }
        if (i + 1 >= argc) {
            snprintf(err, errlen, "unknown option or missing value: '%s'", a);
            return -1;
        }
        const char *v = argv[++i];
        char *end;
        long n = strtol(v, &end, 10);
        if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            o->out = v;
        } else if (!strcmp(a, "--min") || !strcmp(a, "--max")) {
            int64_t b = parse_bytes(v);
            if (b < 0) {
                snprintf(err, errlen, "bad value '%s' for %s: expected 4 .. 2G bytes", v, a);
                return -1;
            }
            *(a[3] == 'i' ? &o->minb : &o->maxb) = b;
        } else if (!strcmp(a, "--steps") || !strcmp(a, "--reps") || !strcmp(a, "--virtual-hosts")) {
            int lo = !strcmp(a, "--steps") ? 2 : 1;
            int hi = !strcmp(a, "--steps") ? MAX_SIZES : !strcmp(a, "--reps") ? MAX_REPS : 1 << 20;
            if (*end || end == v || n < lo || n > hi) {
                snprintf(err, errlen, "bad value '%s' for %s: expected an integer in [%d, %d]", v,
                         a, lo, hi);
                return -1;
            }
            *(!strcmp(a, "--steps")  ? &o->steps
              : !strcmp(a, "--reps") ? &o->reps
                                     : &o->vhosts) = (int)n;
        } else {
            snprintf(err, errlen, "unknown option '%s'", a);
            return -1;
        }
    }
    if (o->maxb <= o->minb) {
        snprintf(err, errlen, "--max %lld must be larger than --min %lld", (long long)o->maxb,
                 (long long)o->minb);
        return -1;
    }
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Slowest rank's time since t0 (collective). */
static double since(double t0)
{
    double t = MPI_Wtime() - t0, m = 0;
    MPI_Allreduce(&t, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return m;
}

/* The k-th rank (ascending) of host h, -1 if none. */
static int host_rank(int h, int k)
{
    for (int r = 0; r < size; r++)
        if (ctx->hosts.host_of[r] == h && k-- == 0)
            return r;
    return -1;
}

static void pingpong(int a, int b, char *buf, int64_t bytes)
{
    if (rank == a) {
        MPI_Send(buf, (int)bytes, MPI_BYTE, b, 1, MPI_COMM_WORLD);
        MPI_Recv(buf, (int)bytes, MPI_BYTE, b, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else if (rank == b) {
        MPI_Recv(buf, (int)bytes, MPI_BYTE, a, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Send(buf, (int)bytes, MPI_BYTE, a, 2, MPI_COMM_WORLD);
    }
}

/* One class over the sweep: op(bytes) per repetition. */
typedef int (*op_fn)(int64_t bytes, void *arg, double *t);

static int op_p2p(int64_t bytes, void *arg, double *t)
{
    int *ab = arg;
    char *buf = (char *)(ab + 2);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    pingpong(ab[0], ab[1], buf, bytes);
    *t = since(t0) / 2;
    return 0;
}

typedef struct {
    MPI_Comm comm; /* NULL for non-members */
    int n;
    char *sbuf, *rbuf;
} ag_t;

static int op_ag(int64_t bytes, void *arg, double *t)
{
    ag_t *g = arg;
    int per = (int)(bytes / g->n);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    if (g->comm != MPI_COMM_NULL)
        MPI_Allgather(g->sbuf, per, MPI_BYTE, g->rbuf, per, MPI_BYTE, g->comm);
    *t = since(t0);
    return 0;
}

typedef struct {
    xmesh_mesh_t sm, dm;
    int src, ndst, *dst, in_src, in_dst;
    char *buf;
} chain_t;

static int op_chain(int64_t bytes, void *arg, double *t)
{
    chain_t *c = arg;
    int64_t n = bytes / 4;
    xmesh_layout_t sl = {1, &n, XMESH_I32, c->sm, "R"}, dl = {1, &n, XMESH_I32, c->dm, "R"};
    xmesh_plan_params_t pp = XMESH_PLAN_PARAMS_INITIALIZER;
    pp.strategy = XMESH_STRATEGY_BROADCAST;
    xmesh_plan_t plan;
    xmesh_result_t r = xmesh_plan_create(ctx, &sl, &dl, &pp, &plan);
    if (r) {
        if (rank == 0)
            fprintf(stderr, "xmesh-calibrate: chain plan: %s\n", xmesh_last_error());
        return -1;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    r = xmesh_reshard(plan, c->in_src ? c->buf : NULL, c->in_dst ? c->buf : NULL);
    *t = since(t0);
    int bad = r != XMESH_SUCCESS, any = 0;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    xmesh_plan_destroy(plan);
    if (any && rank == 0)
        fprintf(stderr, "xmesh-calibrate: chain reshard failed\n");
    return any ? -1 : 0;
}

static void run_class(klass_t *k, const opts_t *o, op_fn op, void *arg)
{
    double tt[MAX_REPS];
    k->n = 0;
    for (int s = 0; s < o->steps; s++) {
        double f = (double)s / (o->steps - 1);
        int64_t b = (int64_t)llround((double)o->minb * pow((double)o->maxb / o->minb, f));
        b = b / 64 * 64 > 0 ? b / 64 * 64 : 64; /* divisible by every rank count we use */
        double tw;
        if (op(b, arg, &tw)) /* warm-up */
            return;
        for (int r = 0; r < o->reps; r++)
            if (op(b, arg, &tt[r]))
                return;
        k->x[k->n] = (double)b;
        k->y[k->n++] = median(tt, o->reps);
    }
    k->ok = 1;
    k->fit_ok = xm_fit_linear(k->x, k->y, k->n, &k->fit) == XMESH_SUCCESS;
}

static double gbps(const klass_t *k)
{
    return k->fit_ok && k->fit.beta > 0 ? 8 / k->fit.beta / 1e9 : NAN;
}

static void measure(const opts_t *o, klass_t *K)
{
    int H = ctx->hosts.nhosts;
    char *buf = malloc((size_t)o->maxb + 2 * sizeof(int) + 64);
    char *rbuf = malloc((size_t)o->maxb + 64);
    if (!buf || !rbuf) {
        fprintf(stderr, "xmesh-calibrate: rank %d: out of memory for %lld bytes\n", rank,
                (long long)o->maxb);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    memset(buf, 0x5a, (size_t)o->maxb + 2 * sizeof(int) + 64);
    /* point to point */
    for (int c = C_P2P_INTRA; c <= C_P2P_INTER; c++) {
        int a = -1, b = -1;
        if (c == C_P2P_INTRA) {
            for (int h = 0; h < H && a < 0; h++)
                if (host_rank(h, 1) >= 0)
                    a = host_rank(h, 0), b = host_rank(h, 1);
        } else if (H >= 2) {
            a = host_rank(0, 0), b = host_rank(1, 0);
        }
        if (a < 0) {
            snprintf(K[c].why, sizeof K[c].why, "%s",
                     c == C_P2P_INTRA ? "no host has two ranks" : "one host only");
            continue;
        }
        int *ab = (int *)buf;
        ab[0] = a;
        ab[1] = b;
        run_class(&K[c], o, op_p2p, ab);
    }
    /* chain, the executor's way */
    if (H >= 2) {
        chain_t ch;
        memset(&ch, 0, sizeof ch);
        ch.src = host_rank(0, 0);
        ch.dst = malloc(sizeof(int) * (size_t)H);
        for (int h = 1; h < H; h++)
            ch.dst[ch.ndst++] = host_rank(h, 0);
        int one[1] = {1}, shp[1] = {ch.ndst};
        ch.in_src = rank == ch.src;
        for (int i = 0; i < ch.ndst; i++)
            ch.in_dst |= rank == ch.dst[i];
        ch.buf = rbuf;
        if (!xmesh_mesh_create(ctx, 1, one, &ch.src, &ch.sm) &&
            !xmesh_mesh_create(ctx, 1, shp, ch.dst, &ch.dm))
            run_class(&K[C_CHAIN], o, op_chain, &ch);
        else
            snprintf(K[C_CHAIN].why, sizeof K[C_CHAIN].why, "mesh: %s", xmesh_last_error());
        if (ch.sm)
            xmesh_mesh_destroy(ch.sm);
        if (ch.dm)
            xmesh_mesh_destroy(ch.dm);
        free(ch.dst);
    } else {
        snprintf(K[C_CHAIN].why, sizeof K[C_CHAIN].why, "one host only");
    }
    /* all-gathers */
    for (int c = C_AG_INTER; c <= C_AG_INTRA; c++) {
        ag_t g = {MPI_COMM_NULL, 0, buf + 64, rbuf};
        int member = c == C_AG_INTER ? host_rank(ctx->hosts.host_of[rank], 0) == rank
                                     : ctx->hosts.host_of[rank] == 0;
        g.n = 0;
        for (int r = 0; r < size; r++)
            g.n += c == C_AG_INTER ? host_rank(ctx->hosts.host_of[r], 0) == r
                                   : ctx->hosts.host_of[r] == 0;
        MPI_Comm_split(MPI_COMM_WORLD, member ? 0 : MPI_UNDEFINED, rank, &g.comm);
        if (g.n < 2)
            snprintf(K[c].why, sizeof K[c].why, "%s",
                     c == C_AG_INTER ? "one host only" : "host 0 has one rank");
        else
            run_class(&K[c], o, op_ag, &g);
        if (g.comm != MPI_COMM_NULL)
            MPI_Comm_free(&g.comm);
    }
    free(buf);
    free(rbuf);
}

static void print_table(const opts_t *o, const klass_t *K)
{
    printf("# xmesh-calibrate: %d ranks on %d hosts; sizes %lld .. %lld bytes in %d steps, "
           "median of %d\n",
           size, ctx->hosts.nhosts, (long long)o->minb, (long long)o->maxb, o->steps, o->reps);
    printf("# time = alpha + beta * bytes, least squares; Gbit/s = 8 / beta\n");
    printf("%-16s %11s %11s %10s %8s %10s  %s\n", "class", "alpha(us)", "beta(ns/B)", "Gbit/s",
           "R^2", "worst_rel", "what");
    for (int c = 0; c < NCLASS; c++) {
        if (!K[c].ok) {
            printf("%-16s %11s %11s %10s %8s %10s  not measured: %s\n", cname[c], "-", "-", "-",
                   "-", "-", K[c].why);
            continue;
        }
        if (!K[c].fit_ok) {
            printf("%-16s fit failed\n", cname[c]);
            continue;
        }
        printf("%-16s %11.2f %11.4f %10.4g %8.5f %10.4f  %s\n", cname[c], K[c].fit.alpha * 1e6,
               K[c].fit.beta * 1e9, gbps(&K[c]), K[c].fit.r2, K[c].fit.worst_rel, chelp[c]);
    }
    printf("# points (bytes: seconds)\n");
    for (int c = 0; c < NCLASS; c++) {
        if (!K[c].ok)
            continue;
        printf("#   %-16s", cname[c]);
        for (int i = 0; i < K[c].n; i++)
            printf(" %.0f:%.6f", K[c].x[i], K[c].y[i]);
        printf("\n");
    }
}

static void json_num(const char *k, double v, int comma)
{
    if (isfinite(v))
        printf("\"%s\":%.9g%s", k, v, comma ? "," : "");
    else
        printf("\"%s\":null%s", k, comma ? "," : "");
}

static void print_json(const opts_t *o, const klass_t *K, const xm_cluster_t *cl)
{
    printf("{\"ranks\":%d,\"hosts\":%d,\"min_bytes\":%lld,\"max_bytes\":%lld,\"steps\":%d,"
           "\"reps\":%d,\"classes\":{",
           size, ctx->hosts.nhosts, (long long)o->minb, (long long)o->maxb, o->steps, o->reps);
    for (int c = 0; c < NCLASS; c++) {
        printf("%s\"%s\":{\"measured\":%s,", c ? "," : "", cname[c], K[c].ok ? "true" : "false");
        if (!K[c].ok || !K[c].fit_ok) {
            printf("\"why\":\"%s\"}", K[c].ok ? "fit failed" : K[c].why);
            continue;
        }
        json_num("alpha_s", K[c].fit.alpha, 1);
        json_num("beta_s_per_byte", K[c].fit.beta, 1);
        json_num("gbps", gbps(&K[c]), 1);
        json_num("r2", K[c].fit.r2, 1);
        json_num("worst_rel_residual", K[c].fit.worst_rel, 1);
        printf("\"points\":[");
        for (int i = 0; i < K[c].n; i++)
            printf("%s[%.0f,%.9g]", i ? "," : "", K[c].x[i], K[c].y[i]);
        printf("]}");
    }
    printf("},\"model\":{");
    json_num("nic_gbps", cl->nic_send_Bps * 8 / 1e9, 1);
    json_num("intra_gbps", cl->intra_Bps * 8 / 1e9, 1);
    json_num("latency_us", cl->latency_s * 1e6, 0);
    printf("},\"output\":");
    if (o->out)
        printf("\"%s\"}\n", o->out);
    else
        printf("null}\n");
}

/* The cluster file text; fills the fitted values into *cl (for the JSON).
 * Returns -1 if nothing could be fitted. */
static int write_file(const opts_t *o, const klass_t *K, xm_cluster_t *cl, FILE *f)
{
    time_t now = time(NULL);
    char ts[64];
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    fprintf(f,
            "# cluster file written by xmesh-calibrate at %s\n"
            "# %d ranks on %d hosts; sizes %lld .. %lld bytes, %d steps, median of %d\n"
            "# fits: time = alpha + beta * bytes (least squares); each class below as\n"
            "# class: alpha_us beta_ns_per_byte gbps r2 worst_rel_residual points\n",
            ts, size, ctx->hosts.nhosts, (long long)o->minb, (long long)o->maxb, o->steps, o->reps);
    for (int c = 0; c < NCLASS; c++) {
        if (K[c].ok && K[c].fit_ok)
            fprintf(f, "#   %s: %.4f %.6f %.6g %.6f %.6f %d\n", cname[c], K[c].fit.alpha * 1e6,
                    K[c].fit.beta * 1e9, gbps(&K[c]), K[c].fit.r2, K[c].fit.worst_rel, K[c].n);
        else
            fprintf(f, "#   %s: not measured (%s)\n", cname[c], K[c].ok ? "fit failed" : K[c].why);
    }
    int wrote = 0;
    const klass_t *in = &K[C_P2P_INTER], *ia = &K[C_P2P_INTRA];
    if (in->ok && in->fit_ok && in->fit.beta > 0) {
        double lat = in->fit.alpha > 0 ? in->fit.alpha * 1e6 : 0;
        fprintf(f, "nic_gbps = %.6g   # 8 / beta(p2p-inter)\n", gbps(in));
        fprintf(f, "latency_us = %.6g   # alpha(p2p-inter)%s\n", lat,
                in->fit.alpha > 0 ? "" : ", fitted below 0: clamped");
        cl->nic_send_Bps = cl->nic_recv_Bps = gbps(in) * 1e9 / 8;
        cl->latency_s = lat * 1e-6;
        wrote++;
    } else {
        fprintf(f, "# nic_gbps, latency_us: not fitted (p2p-inter %s)\n",
                in->ok ? "slope not positive" : in->why);
    }
    if (ia->ok && ia->fit_ok && ia->fit.beta > 0) {
        fprintf(f, "intra_gbps = %.6g   # 8 / beta(p2p-intra)\n", gbps(ia));
        cl->intra_Bps = gbps(ia) * 1e9 / 8;
        wrote++;
    } else {
        fprintf(f, "# intra_gbps: not fitted (p2p-intra %s)\n",
                ia->ok ? "slope not positive" : ia->why);
    }
    return wrote ? 0 : -1;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    opts_t o;
    memset(&o, 0, sizeof o);
    char err[256] = "";
    int pr = parse(argc, argv, &o, err, sizeof err);
    if (pr) {
        if (rank == 0) {
            if (pr < 0)
                fprintf(stderr, "xmesh-calibrate: %s (see --help)\n", err);
            else
                usage(stdout);
        }
        MPI_Finalize();
        return pr < 0 ? 2 : 0;
    }
    if (size < 2) {
        if (rank == 0)
            fprintf(stderr, "xmesh-calibrate: needs at least 2 ranks (mpirun -np N), got %d\n",
                    size);
        MPI_Finalize();
        return 2;
    }
    xmesh_ctx_params_t cp = XMESH_CTX_PARAMS_INITIALIZER;
    if (o.vhosts > 0)
        cp.host_id = rank / o.vhosts;
    if (xmesh_ctx_create_mpi(MPI_COMM_WORLD, &cp, &ctx)) {
        if (rank == 0)
            fprintf(stderr, "xmesh-calibrate: context: %s\n", xmesh_last_error());
        MPI_Finalize();
        return 1;
    }
    klass_t K[NCLASS];
    memset(K, 0, sizeof K);
    measure(&o, K);
    int rc = 0;
    if (rank == 0) {
        xm_cluster_t cl;
        memset(&cl, 0, sizeof cl);
        xm_cluster_t dflt;
        if (!xm_cluster_init(&dflt, &ctx->hosts)) {
            cl.nic_send_Bps = cl.nic_recv_Bps = dflt.nic_send_Bps;
            cl.intra_Bps = dflt.intra_Bps;
            cl.latency_s = dflt.latency_s;
            xm_cluster_free(&dflt);
        }
        FILE *f = o.out ? fopen(o.out, "w") : NULL;
        if (o.out && !f) {
            fprintf(stderr, "xmesh-calibrate: cannot write '%s': %s\n", o.out, strerror(errno));
            rc = 1;
        }
        FILE *sink = f ? f : fopen("/dev/null", "w");
        if (sink && write_file(&o, K, &cl, sink)) {
            fprintf(stderr, "xmesh-calibrate: nothing could be fitted (see the table)\n");
            rc = 1;
        }
        if (sink)
            fclose(sink);
        if (o.json)
            print_json(&o, K, &cl);
        else {
            print_table(&o, K);
            if (f)
                printf("# cluster file written to %s\n", o.out);
        }
    }
    MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
    xmesh_ctx_destroy(ctx);
    MPI_Finalize();
    return rc;
}
