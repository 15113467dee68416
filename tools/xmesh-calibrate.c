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
 *
 * For the layout search (issue 21) it also times MPI all-reduce,
 * all-gather, reduce-scatter and all-to-all over groups of several
 * geometries (scheduler/xm_costmodel.h): inside one host (2, 4, .. R ranks,
 * alone and with every rank of the host in a group at once), across hosts
 * (one rank per host, 2, 4, .. H hosts, alone and with each of a host's R
 * ranks in a different cross-host group, all sharing the NIC: AxoNN's
 * concern, paper 001 section V) and whole hosts, and fits time = alpha +
 * beta * f(n, p) per kind and geometry (relative least squares). With
 * OpenBLAS it times sgemm for the training stack's layer shapes (GPT-2
 * linears, the U-Transformer's 3x3 convolutions as im2col GEMMs) with every
 * rank busy at once. Both go to the file's [collectives] and [compute]
 * sections. It also records which ranks share CPUs (`cpuset` records: ranks
 * whose affinity masks overlap, the cpus of their union) and, where a set
 * has more ranks than cpus, how much CPU a rank waiting in the trainer's
 * polling wait takes from the ranks that compute (`wait`, from sgemm timed
 * with half of each set computing and half polling, against all computing).
 */
#define _GNU_SOURCE /* sched_getaffinity, CPU_* */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <unistd.h>
#include <time.h>

#include "calibrate.h"

#ifdef XMESH_CALIBRATE_BLAS
#include <cblas.h>

#include "nn/kernels.h" /* the training stack's element-wise kernels (compiled in) */
#endif

static int rank, size;
static xmesh_ctx_t ctx;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: mpirun -np N xmesh-calibrate [options]\n"
            "Measures point-to-point, chain and all-gather times between ranks of one host\n"
            "and of different hosts, collectives over groups of several geometries and sgemm\n"
            "throughput, fits alpha (latency) + beta (s/byte) per class by least squares and\n"
            "writes a cluster file for xmesh-plan --cluster, xmesh-bench --cluster,\n"
            "XMESH_CLUSTER_FILE and the layout search (xmesh-train ... plan --cluster).\n"
            "  -o, --output FILE     write the cluster file\n"
            "  --json                one JSON object on stdout instead of the table\n"
            "  --min BYTES           smallest message (default 64K; K/M/G suffixes)\n"
            "  --max BYTES           largest message (default 8M)\n"
            "  --steps N             sizes in the geometric sweep (default 6, 2..%d)\n"
            "  --reps N              repetitions per size, median kept (default 3, 1..%d;\n"
            "                        collectives of <= 1 MiB at least 7)\n"
            "  --virtual-hosts K     hosts of K consecutive ranks (one machine; tests)\n"
            "  --skip LIST           leave out some of p2p,collectives,compute (comma list)\n"
            "collectives (all-reduce, all-gather, reduce-scatter, all-to-all; same sweep):\n"
            "  groups inside one host, one rank per host, whole hosts; alone and sharing\n"
            "  timed as the training stack runs them: MPI_Iallreduce, MPI_Iallgather,\n"
            "  MPI_Ireduce_scatter_block, all-to-all as MPI_Isend/MPI_Irecv pairs, polled with\n"
            "  MPI_Testall and sched_yield (nn/sbp.c xmp_wait)\n"
            "  --blocking-collectives  time MPI_Allreduce, MPI_Allgather, .. instead\n"
            "compute (sgemm via OpenBLAS, every rank busy at once; OPENBLAS_NUM_THREADS):\n"
            "  --gemm-tokens T       GPT rows (batch x sequence) of the linears (default 1024)\n"
            "  --gemm-hidden C       GPT channels (default 768)\n"
            "  --gemm-vocab V        GPT padded vocabulary of the output head (default 50304)\n"
            "  --conv-base C         U-Transformer base channels (default 8)\n"
            "  --gemm-shape MxNxK    one more shape (repeatable, up to %d)\n"
            "  -h, --help\n",
            MAX_SIZES, MAX_REPS, MAX_SHAPES);
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
    o->tokens = 1024;
    o->hidden = 768;
    o->vocab = 50304;
    o->conv_base = 8;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help"))
            return 1;
        if (!strcmp(a, "--json")) {
            o->json = 1;
            continue;
        }
        if (!strcmp(a, "--blocking-collectives")) {
            o->blocking = 1;
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
        } else if (!strcmp(a, "--gemm-tokens") || !strcmp(a, "--gemm-hidden") ||
                   !strcmp(a, "--gemm-vocab") || !strcmp(a, "--conv-base")) {
            if (*end || end == v || n < 1 || n > 1 << 20) {
                snprintf(err, errlen, "bad value '%s' for %s: expected an integer in [1, %d]", v, a,
                         1 << 20);
                return -1;
            }
            *(!strcmp(a, "--gemm-tokens")   ? &o->tokens
              : !strcmp(a, "--gemm-hidden") ? &o->hidden
              : !strcmp(a, "--gemm-vocab")  ? &o->vocab
                                            : &o->conv_base) = (int)n;
        } else if (!strcmp(a, "--gemm-shape")) {
            long long m, nn, k;
            char tail;
            if (o->nextra == MAX_SHAPES) {
                snprintf(err, errlen, "more than %d --gemm-shape options", MAX_SHAPES);
                return -1;
            }
            if (sscanf(v, "%lldx%lldx%lld%c", &m, &nn, &k, &tail) != 3 || m < 1 || nn < 1 ||
                k < 1 || m > 1 << 16 || nn > 1 << 16 || k > 1 << 16) {
                snprintf(err, errlen,
                         "bad value '%s' for --gemm-shape: expected MxNxK, each 1 .. 65536", v);
                return -1;
            }
            shape_t *sh = &o->extra[o->nextra++];
            sh->m = m;
            sh->n = nn;
            sh->k = k;
            snprintf(sh->label, sizeof sh->label, "user-%lldx%lldx%lld", m, nn, k);
        } else if (!strcmp(a, "--skip")) {
            char list[128];
            snprintf(list, sizeof list, "%s", v);
            for (char *save = NULL, *t = strtok_r(list, ",", &save); t;
                 t = strtok_r(NULL, ",", &save)) {
                if (!strcmp(t, "p2p"))
                    o->skip_p2p = 1;
                else if (!strcmp(t, "collectives"))
                    o->skip_coll = 1;
                else if (!strcmp(t, "compute"))
                    o->skip_compute = 1;
                else {
                    snprintf(err, errlen,
                             "bad value '%s' for --skip: '%s' is not p2p, collectives or compute",
                             v, t);
                    return -1;
                }
            }
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
        k->y[k->n++] = xmc_median(tt, o->reps);
    }
    k->ok = 1;
    k->fit_ok = xm_fit_linear(k->x, k->y, k->n, &k->fit) == XMESH_SUCCESS;
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

/* ------------------------------------------------------------ collectives */

/* 2, 4, 8, .. below max, then max (max >= 2). */
static int pow2_list(int max, int *out)
{
    int n = 0;
    for (int v = 2; v < max; v *= 2)
        out[n++] = v;
    if (max >= 2)
        out[n++] = max;
    return n;
}

static void add_geom(geom_t *G, int *ng, int p, int rph, int hosts, int share, int color,
                     const char *what)
{
    if (*ng == MAX_GEOMS)
        return;
    geom_t *g = &G[(*ng)++];
    g->g = (xm_coll_geom_t){p, rph, hosts, share};
    g->ngroups = share;
    g->color = color;
    snprintf(g->what, sizeof g->what, "%s", what);
}

/* The geometries, the same on every rank (from the host map). R: ranks
 * every host has (the smallest host's count), H: hosts. */
static int build_geoms(geom_t *G)
{
    int H = ctx->hosts.nhosts, R = size;
    for (int h = 0; h < H; h++) {
        int c = 0;
        while (host_rank(h, c) >= 0)
            c++;
        if (c < R)
            R = c;
    }
    int me = ctx->hosts.host_of[rank], k = 0;
    while (host_rank(me, k) != rank)
        k++; /* my index on my host */
    int ng = 0, list[64], n;
    /* inside host 0: p = 2, 4, .. R; alone, then R / p groups at once */
    n = pow2_list(R, list);
    for (int i = 0; i < n; i++) {
        int p = list[i];
        add_geom(G, &ng, p, p, 1, 1, me == 0 && k < p ? 0 : MPI_UNDEFINED,
                 "ranks of host 0, alone");
        if (R / p >= 2)
            add_geom(G, &ng, p, p, 1, R / p, me == 0 && k < R / p * p ? k / p : MPI_UNDEFINED,
                     "groups of host 0, all at once");
    }
    /* one rank per host: hosts 0 .. h-1; alone, then each of the R ranks
     * of a host in its own group, all at once (R groups share each NIC) */
    n = pow2_list(H, list);
    for (int i = 0; i < n; i++) {
        int h = list[i];
        add_geom(G, &ng, h, 1, h, 1, me < h && k == 0 ? 0 : MPI_UNDEFINED,
                 "first rank of each host, alone");
        if (R >= 2)
            add_geom(G, &ng, h, 1, h, R, me < h && k < R ? k : MPI_UNDEFINED,
                     "k-th rank of each host, R groups sharing each NIC");
    }
    /* whole hosts (R ranks each) */
    if (R >= 2)
        for (int i = 0; i < n; i++) {
            int h = list[i];
            add_geom(G, &ng, R * h, R, h, 1, me < h && k < R ? 0 : MPI_UNDEFINED,
                     "all ranks of hosts 0..h-1");
        }
    return ng;
}

/* Completes the requests the way nn/sbp.c's xmp_wait does: MPI_Testall, yielding the core
 * between polls (no progress thread; ranks share cores on an oversubscribed host). */
static int poll_all(int n, MPI_Request *q)
{
    for (;;) {
        int done = 0, rc = MPI_Testall(n, q, &done, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS || done)
            return rc;
        sched_yield();
    }
}

/* One collective of the sweep. Default: the calls the training stack makes (nn/sbp.c,
 * nn/boxing.c): nonblocking collectives (Open MPI's libnbc, whose algorithms and times differ
 * from the blocking ones: on 4 emulated hosts x 2 ranks at 200 Mbit/s the GPT-2 (L4 C128)
 * gradient list all-reduced one tensor at a time took 0.95 s with MPI_Iallreduce against
 * 0.27 s with MPI_Allreduce), all-to-all as MPI_Isend/MPI_Irecv pairs. blocking: the MPI_
 * blocking calls (--blocking-collectives). */
static int run_coll(xm_coll_t kind, int p, MPI_Comm comm, void *sb, void *rb, int64_t bytes,
                    int blocking)
{
    if (comm == MPI_COMM_NULL)
        return MPI_SUCCESS;
    int per = (int)(bytes / p);
    if (blocking) {
        switch (kind) {
        case XM_COLL_ALLREDUCE:
            return MPI_Allreduce(sb, rb, (int)(bytes / 4), MPI_FLOAT, MPI_SUM, comm);
        case XM_COLL_ALLGATHER:
            return MPI_Allgather(sb, per, MPI_BYTE, rb, per, MPI_BYTE, comm);
        case XM_COLL_REDUCE_SCATTER:
            return MPI_Reduce_scatter_block(sb, rb, per / 4, MPI_FLOAT, MPI_SUM, comm);
        default:
            return MPI_Alltoall(sb, per, MPI_BYTE, rb, per, MPI_BYTE, comm);
        }
    }
    MPI_Request q[2 * 64];
    int nq = 1, rc, me = 0;
    switch (kind) {
    case XM_COLL_ALLREDUCE:
        rc = MPI_Iallreduce(sb, rb, (int)(bytes / 4), MPI_FLOAT, MPI_SUM, comm, q);
        break;
    case XM_COLL_ALLGATHER:
        rc = MPI_Iallgather(sb, per, MPI_BYTE, rb, per, MPI_BYTE, comm, q);
        break;
    case XM_COLL_REDUCE_SCATTER:
        rc = MPI_Ireduce_scatter_block(sb, rb, per / 4, MPI_FLOAT, MPI_SUM, comm, q);
        break;
    default:
        if (p > 64)
            return MPI_Alltoall(sb, per, MPI_BYTE, rb, per, MPI_BYTE, comm);
        MPI_Comm_rank(comm, &me);
        nq = 0;
        rc = MPI_SUCCESS;
        for (int k = 0; k < p && rc == MPI_SUCCESS; k++) {
            if (k == me)
                continue;
            rc = MPI_Irecv((char *)rb + (size_t)k * per, per, MPI_BYTE, k, 7411, comm, &q[nq++]);
            if (rc == MPI_SUCCESS)
                rc =
                    MPI_Isend((char *)sb + (size_t)k * per, per, MPI_BYTE, k, 7411, comm, &q[nq++]);
        }
        if (rc == MPI_SUCCESS)
            memcpy((char *)rb + (size_t)me * per, (char *)sb + (size_t)me * per, (size_t)per);
        break;
    }
    if (rc != MPI_SUCCESS)
        return rc;
    return poll_all(nq, q);
}

/* Times every kind over every geometry; results on every rank (the times
 * are world maxima). Returns the number of results. */
#define SMALL_BYTES (1 << 20)
#define SMALL_REPS 7
static int measure_coll(const opts_t *o, geom_t *G, int ng, coll_res_t *res)
{
    int64_t cap = o->maxb + 4LL * size;
    float *sb = malloc((size_t)cap), *rb = malloc((size_t)cap);
    if (!sb || !rb) {
        fprintf(stderr, "xmesh-calibrate: rank %d: out of memory for %lld bytes\n", rank,
                (long long)cap);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (int64_t i = 0; i < cap / 4; i++)
        sb[i] = 1.0f, rb[i] = 0.0f;
    int nr = 0;
    double tt[MAX_REPS];
    for (int gi = 0; gi < ng; gi++) {
        const geom_t *g = &G[gi];
        int p = g->g.group_size;
        MPI_Comm comm;
        MPI_Comm_split(MPI_COMM_WORLD, g->color, rank, &comm);
        for (int kind = 0; kind < XM_COLL_NKINDS; kind++) {
            coll_res_t *r = &res[nr++];
            memset(r, 0, sizeof *r);
            r->kind = (xm_coll_t)kind;
            r->geom = gi;
            int bad = 0;
            for (int st = 0; st < o->steps && !bad; st++) {
                double f = (double)st / (o->steps - 1);
                int64_t b = (int64_t)llround((double)o->minb * pow((double)o->maxb / o->minb, f));
                int64_t unit = 4LL * p; /* whole floats per rank */
                b = b / unit * unit > 0 ? b / unit * unit : unit;
                /* small and middle sizes cost little and are the most exposed to a scheduling
                 * outlier on shared cores: at least SMALL_REPS of them (with 2, one 6 ms
                 * outlier made a 1 KiB all-reduce of 0.2 ms read 6 ms, and every small
                 * gradient with it; two calibrations with 2 repetitions above 64 KiB read a
                 * 256 KiB all-reduce over 8 ranks on 4 hosts as 16 and 29 ms, and the search's
                 * dp gradient reduction as 0.24 and 0.39 s against 0.25 s measured) */
                int reps = b <= SMALL_BYTES && o->reps < SMALL_REPS ? SMALL_REPS : o->reps;
                for (int rep = -1; rep < reps && !bad; rep++) {
                    MPI_Barrier(MPI_COMM_WORLD);
                    double t0 = MPI_Wtime();
                    int e =
                        run_coll((xm_coll_t)kind, p, comm, sb, rb, b, o->blocking) != MPI_SUCCESS;
                    double t = since(t0);
                    MPI_Allreduce(&e, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
                    if (rep >= 0)
                        tt[rep] = t; /* rep -1: warm-up */
                }
                if (bad)
                    snprintf(r->why, sizeof r->why, "MPI error at %lld bytes", (long long)b);
                r->x[r->n] = (double)b;
                r->y[r->n++] = xmc_median(tt, reps);
            }
            if (bad)
                continue;
            if (xm_coll_fit(r->kind, p, r->x, r->y, r->n, &r->fit) == XMESH_SUCCESS)
                r->fit_ok = 1;
            else
                snprintf(r->why, sizeof r->why, "fit refused: %s", xmesh_last_error());
        }
        if (comm != MPI_COMM_NULL)
            MPI_Comm_free(&comm);
    }
    free(sb);
    free(rb);
    return nr;
}

/* Ranks per host that ran sgemm at once: the largest host's count. */
static int busy_per_host(void)
{
    int best = 0;
    for (int h = 0; h < ctx->hosts.nhosts; h++) {
        int c = 0;
        while (host_rank(h, c) >= 0)
            c++;
        best = c > best ? c : best;
    }
    return best;
}

/* CPU sets: ranks whose affinity masks overlap are one set (union-find on rank 0), its cpus
 * the union's count. Then, when a set has more ranks than cpus, the wait weight: every rank
 * times a sustained sgemm (the gpt-fc shape) with all ranks computing, then with the
 * even-positioned ranks of each set computing while the others wait as a pipeline stage waits
 * for its next input: in xmesh_reshard on a transfer from a computing rank, which that rank
 * sends when its timing ends (the executor's blocking wait, XMESH_WAIT_NICE and all; ranks left
 * without a partner poll an MPI_Ibarrier as nn/'s xmp_wait does). A computing rank's share of a
 * cpu is
 * s = min(1, k/n) t_all / t_half; with n_b computing and n_w polling, s = k / (n_b + w n_w)
 * gives w (clamped to [0, 1]; 0 when s >= 1: the pollers left the computing ranks a whole
 * cpu each). Rank 0 gets the results. */
#ifdef XMESH_CALIBRATE_BLAS
/* The sync seconds of each over-subscribed set of at least 3 ranks (xm_cpuset_t): its first
 * two ranks (positions 0 and 1) run SYNC_ITERS rounds of about 1 ms of sgemm followed by a 1 KiB
 * all-reduce between them (posted and polled as the trainer does), while the set's other ranks
 * compute until they finish; the same rounds without the all-reduce; and the all-reduces alone
 * while the others wait polling. sync = (with - without - alone) / SYNC_ITERS: what a small
 * collective costs beyond its own time because its partner runs only when the scheduler hands
 * it a cpu the computing ranks also want (medians of 3 repetitions). Collective. */
#define SYNC_ITERS 60
static void measure_sync(const int *set_of, const int *pos, const int *n, const int *cpus,
                         double *sync)
{
    int pair = pos[rank] < 2 && n[set_of[rank]] >= 3 && n[set_of[rank]] > cpus[set_of[rank]];
    MPI_Comm pc = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, pair ? set_of[rank] : MPI_UNDEFINED, rank, &pc);
    const int M = 128, N = 256, K = 128;
    float *A = calloc((size_t)M * K, sizeof *A), *B = calloc((size_t)K * N, sizeof *B),
          *C = calloc((size_t)M * N, sizeof *C), x[256] = {0}, y[256];
    if (!A || !B || !C) {
        fprintf(stderr, "xmesh-calibrate: rank %d: out of memory\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int c = 0; c < 4; c++)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, A, K, B, N, 0.0f, C,
                    N);
    double one = (MPI_Wtime() - t0) / 4, worst = one;
    MPI_Allreduce(&one, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    int calls = worst > 0 ? (int)ceil(1e-3 / worst) : 8;
    calls = calls < 1 ? 1 : calls > 1000 ? 1000 : calls;
    double t[3][3];
    for (int mode = 0; mode < 3; mode++) /* 0: sgemm + all-reduce, 1: sgemm, 2: all-reduce */
        for (int rep = 0; rep < 3; rep++) {
            MPI_Barrier(MPI_COMM_WORLD);
            MPI_Request q;
            if (pair) {
                double t1 = MPI_Wtime();
                for (int i = 0; i < SYNC_ITERS; i++) {
                    for (int c = 0; mode < 2 && c < calls; c++)
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, A, K,
                                    B, N, 0.0f, C, N);
                    if (mode != 1) {
                        MPI_Request a;
                        MPI_Iallreduce(x, y, 256, MPI_FLOAT, MPI_SUM, pc, &a);
                        poll_all(1, &a);
                    }
                }
                double mine = MPI_Wtime() - t1;
                MPI_Allreduce(&mine, &t[mode][rep], 1, MPI_DOUBLE, MPI_MAX, pc);
                MPI_Ibarrier(MPI_COMM_WORLD, &q);
                poll_all(1, &q);
            } else {
                /* the others compute while the pairs run (mode 2: wait polling, as in a bubble) */
                MPI_Ibarrier(MPI_COMM_WORLD, &q);
                for (int done = 0; !done;) {
                    if (mode < 2)
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, A, K,
                                    B, N, 0.0f, C, N);
                    else
                        sched_yield();
                    MPI_Test(&q, &done, MPI_STATUS_IGNORE);
                }
            }
        }
    double mine = 0;
    if (pair && pos[rank] == 0) {
        double with = xmc_median(t[0], 3), without = xmc_median(t[1], 3),
               alone = xmc_median(t[2], 3);
        mine = (with - without - alone) / SYNC_ITERS;
        mine = mine > 0 ? mine : 0;
    }
    double *all = rank == 0 ? calloc((size_t)size, sizeof *all) : NULL;
    MPI_Gather(&mine, 1, MPI_DOUBLE, all, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    if (rank == 0 && all)
        for (int r = 0; r < size; r++)
            if (pos[r] == 0 && n[set_of[r]] >= 3 && n[set_of[r]] > cpus[set_of[r]])
                sync[set_of[r]] = all[r];
    free(all);
    if (pc != MPI_COMM_NULL)
        MPI_Comm_free(&pc);
    free(A);
    free(B);
    free(C);
}
#endif

static void measure_cpusets(results_t *R)
{
    cpu_set_t mine;
    CPU_ZERO(&mine);
    if (sched_getaffinity(0, sizeof mine, &mine) != 0) {
        int c = (int)sysconf(_SC_NPROCESSORS_ONLN);
        for (int i = 0; i < c && i < CPU_SETSIZE; i++)
            CPU_SET(i, &mine);
    }
    cpu_set_t *all = malloc((size_t)size * sizeof *all);
    int *set_of = malloc((size_t)size * sizeof *set_of);
    if (!all || !set_of) {
        fprintf(stderr, "xmesh-calibrate: rank %d: out of memory\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Allgather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE,
                  MPI_COMM_WORLD);
    /* union-find over overlapping masks (every rank computes the same) */
    for (int r = 0; r < size; r++)
        set_of[r] = r;
    for (int a = 0; a < size; a++)
        for (int b = a + 1; b < size; b++) {
            cpu_set_t x;
            CPU_AND(&x, &all[a], &all[b]);
            if (CPU_COUNT(&x) == 0)
                continue;
            int ra = a, rb = b;
            while (set_of[ra] != ra)
                ra = set_of[ra];
            while (set_of[rb] != rb)
                rb = set_of[rb];
            if (ra != rb)
                set_of[ra > rb ? ra : rb] = ra < rb ? ra : rb;
        }
    int nsets = 0, *root_idx = malloc((size_t)size * sizeof *root_idx);
    int *cpus = calloc((size_t)size, sizeof *cpus), *n = calloc((size_t)size, sizeof *n);
    double *wait = calloc((size_t)size, sizeof *wait), *sync = calloc((size_t)size, sizeof *sync);
    if (!root_idx || !cpus || !n || !wait || !sync) {
        fprintf(stderr, "xmesh-calibrate: rank %d: out of memory\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (int r = 0; r < size; r++)
        root_idx[r] = -1;
    int *pos = malloc((size_t)size * sizeof *pos); /* position of a rank within its set */
    if (!pos) {
        fprintf(stderr, "xmesh-calibrate: rank %d: out of memory\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (int r = 0; r < size; r++) { /* roots first: set_of still holds the parents */
        int t = r;
        while (set_of[t] != t)
            t = set_of[t];
        pos[r] = t;
    }
    for (int r = 0; r < size; r++) {
        int t = pos[r];
        if (root_idx[t] < 0)
            root_idx[t] = nsets++;
        set_of[r] = root_idx[t];
    }
    for (int r = 0; r < size; r++)
        pos[r] = n[set_of[r]]++;
    for (int sidx = 0; sidx < nsets; sidx++) {
        cpu_set_t u;
        CPU_ZERO(&u);
        for (int r = 0; r < size; r++)
            if (set_of[r] == sidx)
                CPU_OR(&u, &u, &all[r]);
        cpus[sidx] = CPU_COUNT(&u) > 0 ? CPU_COUNT(&u) : 1;
    }
    int over = 0;
    for (int sidx = 0; sidx < nsets; sidx++)
        over |= n[sidx] > cpus[sidx] && n[sidx] >= 2;
#ifdef XMESH_CALIBRATE_BLAS
    if (over) {
        const int M = 256, N = 512, K = 128, reps = 5;
        float *A = calloc((size_t)M * K, sizeof *A), *B = calloc((size_t)K * N, sizeof *B),
              *C = calloc((size_t)M * N, sizeof *C);
        if (!A || !B || !C) {
            fprintf(stderr, "xmesh-calibrate: rank %d: out of memory\n", rank);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        double tm[2] = {0, 0};
        int computes_half = pos[rank] % 2 == 0;
        /* the transfers the waiting ranks wait on: k-th waiting rank <- k-th computing rank */
        int nwt = 0, ncp = 0, *wr = malloc((size_t)size * sizeof *wr),
            *cr = malloc((size_t)size * sizeof *cr);
        if (!wr || !cr) {
            fprintf(stderr, "xmesh-calibrate: rank %d: out of memory\n", rank);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        for (int r = 0; r < size; r++) {
            if (pos[r] % 2)
                wr[nwt++] = r;
            else
                cr[ncp++] = r;
        }
        xmesh_mesh_t wsm = NULL, wdm = NULL;
        xmesh_plan_t wplan = NULL;
        int64_t wn = (int64_t)nwt * 16;
        float wbuf[16] = {0};
        int in_src = 0, in_dst = 0;
        for (int k = 0; k < nwt; k++) {
            in_src |= cr[k] == rank;
            in_dst |= wr[k] == rank;
        }
        if (nwt > 0 && (xmesh_mesh_create(ctx, 1, &nwt, cr, &wsm) ||
                        xmesh_mesh_create(ctx, 1, &nwt, wr, &wdm))) {
            fprintf(stderr, "xmesh-calibrate: rank %d: cpu wait meshes: %s\n", rank,
                    xmesh_last_error());
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        if (nwt > 0) {
            xmesh_layout_t sl = {1, &wn, XMESH_F32, wsm, "S0"}, dl = {1, &wn, XMESH_F32, wdm, "S0"};
            if (xmesh_plan_create(ctx, &sl, &dl, NULL, &wplan)) {
                fprintf(stderr, "xmesh-calibrate: rank %d: cpu wait plan: %s\n", rank,
                        xmesh_last_error());
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
        }
        for (int phase = 0; phase < 2; phase++) {
            int computing = phase == 0 || computes_half;
            double tt[16];
            for (int rep = 0; rep < reps; rep++) {
                MPI_Barrier(MPI_COMM_WORLD);
                if (computing) { /* 4 x SUSTAIN_S a repetition */
                    int calls = 0;
                    double t1 = MPI_Wtime(), t;
                    do {
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, A, K,
                                    B, N, 0.0f, C, N);
                        calls++;
                    } while ((t = MPI_Wtime() - t1) < 4 * SUSTAIN_S);
                    tt[rep] = t / calls;
                }
                /* phase 1: the waiting ranks sit in xmesh_reshard until their partner is done */
                if (phase == 1 && wplan && (in_src || in_dst) &&
                    xmesh_reshard(wplan, in_src ? wbuf : NULL, in_dst ? wbuf : NULL)) {
                    fprintf(stderr, "xmesh-calibrate: rank %d: cpu wait transfer: %s\n", rank,
                            xmesh_last_error());
                    MPI_Abort(MPI_COMM_WORLD, 1);
                }
                MPI_Request q;
                MPI_Ibarrier(MPI_COMM_WORLD, &q);
                poll_all(1, &q); /* ranks without a partner wait here */
            }
            tm[phase] = computing ? xmc_median(tt, reps) : 0;
        }
        if (wplan)
            xmesh_plan_destroy(wplan);
        if (wsm)
            xmesh_mesh_destroy(wsm);
        if (wdm)
            xmesh_mesh_destroy(wdm);
        free(wr);
        free(cr);
        double *ta = rank == 0 ? malloc((size_t)size * 2 * sizeof *ta) : NULL;
        MPI_Gather(tm, 2, MPI_DOUBLE, ta, 2, MPI_DOUBLE, 0, MPI_COMM_WORLD);
        if (rank == 0) {
            for (int sidx = 0; sidx < nsets; sidx++) {
                double k = cpus[sidx], nn = n[sidx];
                if (nn <= k || nn < 2)
                    continue;
                double nb = (double)((n[sidx] + 1) / 2), nw = nn - nb; /* even positions compute */
                double ra[64], rh[64];
                int m = 0;
                for (int r = 0; r < size && m < 64; r++)
                    if (set_of[r] == sidx && pos[r] % 2 == 0 && ta[2 * r] > 0 &&
                        ta[2 * r + 1] > 0) {
                        ra[m] = ta[2 * r];
                        rh[m] = ta[2 * r + 1];
                        m++;
                    }
                if (m == 0)
                    continue;
                double t_all = xmc_median(ra, m), t_half = xmc_median(rh, m);
                double share = fmin(1.0, k / nn) * t_all / t_half, w = 0;
                if (share < 1 && nw > 0)
                    w = (k / share - nb) / nw;
                wait[sidx] = w < 0 ? 0 : w > 1 ? 1 : w;
            }
            free(ta);
        }
        free(A);
        free(B);
        free(C);
        measure_sync(set_of, pos, n, cpus, sync);
    }
#endif
    (void)over; /* read only where the BLAS probe is built */
    free(pos);
    free(root_idx);
    free(all);
    if (rank == 0) {
        R->nsets = nsets;
        R->set_of = set_of;
        R->set_cpus = cpus;
        R->set_n = n;
        R->set_wait = wait;
        R->set_sync = sync;
    } else {
        free(sync);
        free(set_of);
        free(cpus);
        free(n);
        free(wait);
    }
}

/* time = alpha + beta * 2mnk over every shape, relative least squares. */
static void fit_gemm(results_t *R)
{
    double x[MAX_SHAPES + 16], y[MAX_SHAPES + 16], w[MAX_SHAPES + 16];
    for (int i = 0; i < R->ns; i++) {
        x[i] = xmc_flops(&R->S[i].s);
        y[i] = R->S[i].seconds;
        w[i] = y[i] > 0 ? 1 / (y[i] * y[i]) : 0;
    }
    R->gemm_fit_ok = R->ns >= 2 && xm_fit_weighted(x, y, w, R->ns, &R->gemm_fit) == 0;
}

int main(int argc, char **argv)
{
    /* the trainer's thread level: with MPI_THREAD_MULTIPLE xmesh runs a progress thread per
     * rank, which takes CPU from the ranks that compute while transfers are in flight */
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
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
    results_t *R = calloc(1, sizeof *R);
    if (!R) {
        fprintf(stderr, "xmesh-calibrate: rank %d: out of memory\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    R->size = size;
    R->nhosts = ctx->hosts.nhosts;
    if (o.skip_p2p)
        for (int c = 0; c < NCLASS; c++)
            snprintf(R->K[c].why, sizeof R->K[c].why, "skipped (--skip p2p)");
    else
        measure(&o, R->K);
    if (!o.skip_coll) {
        R->ng = build_geoms(R->G);
        R->C = calloc((size_t)R->ng * XM_COLL_NKINDS + 1, sizeof *R->C);
        if (!R->C) {
            fprintf(stderr, "xmesh-calibrate: rank %d: out of memory\n", rank);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        if (R->ng)
            R->nc = measure_coll(&o, R->G, R->ng, R->C);
        else
            snprintf(R->coll_why, sizeof R->coll_why, "no group of 2 ranks");
    }
    if (!o.skip_compute) {
        R->busy = busy_per_host();
        R->ns = xmc_measure_gemm(&o, R->S, R->gemm_why, sizeof R->gemm_why);
        fit_gemm(R);
        xmc_measure_elt(&o, R->busy, R->E);
        xmc_measure_gptstep(&o, R->busy, &R->step);
        measure_cpusets(R);
    }
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
        if (sink && xmc_write_file(&o, R, &cl, sink)) {
            fprintf(stderr, "xmesh-calibrate: nothing could be fitted (see the table)\n");
            rc = 1;
        }
        if (sink)
            fclose(sink);
        if (o.json)
            xmc_print_json(&o, R, &cl);
        else {
            xmc_print_table(&o, R);
            if (f)
                printf("# cluster file written to %s\n", o.out);
        }
    }
    MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
    free(R->C);
    free(R->set_of);
    free(R->set_cpus);
    free(R->set_n);
    free(R->set_wait);
    free(R->set_sync);
    free(R);
    xmesh_ctx_destroy(ctx);
    MPI_Finalize();
    return rc;
}
