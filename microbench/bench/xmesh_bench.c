/*
 * xmesh-bench: cross-mesh resharding microbenchmarks (paper 002 section 5.1
 * and 5.3.1) in the style of nccl-tests.
 *
 *   mpirun -np 20 xmesh-bench -s n-to-m -b 64M -n 5 -w 1 -J out.json
 *
 * Suites: n-to-m (Table 2 cases 1-9, Fig. 6), 1-to-m (Fig. 5 receiver
 * meshes), loadbalance (Fig. 8: naive / lb / ensemble), 2d (2-D block
 * layouts of a square f64 matrix between process grids, what HPC and
 * tensor-parallel codes do, against ScaLAPACK's pdgemr2d). Ranks are laid
 * out host-major (mpirun's default with --host h0:P,h1:P,...); every case
 * puts its source mesh on the first hosts and its destination mesh on the
 * next ones, so the two meshes never share a host. Ranks a case does not
 * use stay idle. Every iteration checks every destination element.
 * docs/BENCHMARKS.md defines every column.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "xm_api.h"
#include "xm_cost.h"
#include "xmesh/mpi.h"
#include "xmesh/ucx.h"

#define MAX_ROWS 4096
#define MAX_METHODS 16
#define MAX_CASES 32

/* ------------------------------------------------------------ options */

typedef struct {
    const char *suite;
    const char *methods; /* comma list or NULL: the suite's default */
    const char *cases;   /* comma list or NULL: all */
    int64_t minbytes, maxbytes, stepfactor;
    int iters, warmup, check;
    const char *json, *datprefix;
    int virtual_hosts;
    int real_hosts; /* -R: xmesh sees the real hosts, -V only places the meshes */
    int poll_us;
    int64_t calib_bytes;
    int barrier; /* end every timed iteration with MPI_Barrier (1) or a spinning one (2) */
    int plans;   /* xmesh plans created (and timed) per row */
    const char *transport; /* xmesh's transport: "mpi" or "ucx" (-T, XMESH_TRANSPORT) */
} opts_t;

/* --------------------------------------------------------------- cases */

typedef struct {
    const char *name;
    int src_mesh[2], dst_mesh[2];
    const char *src_spec, *dst_spec;
    /* 0: (2k,2k,k); 1: case 6 (3x,x,x/6); 2: 1-D vector (int32 elements);
     * 3, 4, 5: square f64 matrix n x n, (n-1)^2, (n+1)^2 on process grids */
    int shape_kind;
} case_def_t;

/* 2d-suite cases: meshes are process grids (rows, cols) over consecutive
 * ranks, not (hosts, devices per host). */
static int is_grid(const case_def_t *def)
{
    return def->shape_kind >= 3;
}

/* Paper 002 Table 2 (docs/BENCH_CASES.md). Tensor (1024,1024,512)
 * scaled to the requested bytes keeping its 2:2:1 aspect. */
static const case_def_t n_to_m_cases[] = {
    {"1", {2, 4}, {2, 4}, "S0RR", "S0RR", 0}, {"2", {2, 4}, {2, 4}, "RRR", "S0RR", 0},
    {"3", {2, 4}, {2, 4}, "RS0R", "S0RR", 0}, {"4", {2, 4}, {2, 4}, "RS01R", "S01RR", 0},
    {"5", {2, 4}, {2, 4}, "S1RR", "S0RR", 0}, {"6", {2, 4}, {3, 4}, "S0RR", "S0RR", 1},
    {"7", {1, 4}, {2, 4}, "S1RR", "RRR", 0},  {"8", {2, 3}, {3, 2}, "RRR", "RRR", 0},
    {"9", {2, 4}, {2, 4}, "RS0R", "RRS0", 0},
};
/* Paper 002 Fig. 5: one sender device, replicated vector. */
static const case_def_t one_to_m_cases[] = {
    {"1x1", {1, 1}, {1, 1}, "R", "R", 2}, {"1x2", {1, 1}, {1, 2}, "R", "R", 2},
    {"1x3", {1, 1}, {1, 3}, "R", "R", 2}, {"1x4", {1, 1}, {1, 4}, "R", "R", 2},
    {"2x2", {1, 1}, {2, 2}, "R", "R", 2}, {"3x2", {1, 1}, {3, 2}, "R", "R", 2},
    {"4x2", {1, 1}, {4, 2}, "R", "R", 2},
};

/* Chains of 1..8 hops: one sender, a replicated vector on H hosts of one
 * rank each (the chain crosses H NICs); with -b/-e and XMESH_CHUNK_BYTES it
 * sweeps the chunk count, for the chain model against the executor
 * (scripts/run-chain-model.sh). */
static const case_def_t chain_cases[] = {
    {"h1", {1, 1}, {1, 1}, "R", "R", 2}, {"h2", {1, 1}, {2, 1}, "R", "R", 2},
    {"h3", {1, 1}, {3, 1}, "R", "R", 2}, {"h4", {1, 1}, {4, 1}, "R", "R", 2},
    {"h5", {1, 1}, {5, 1}, "R", "R", 2}, {"h6", {1, 1}, {6, 1}, "R", "R", 2},
    {"h7", {1, 1}, {7, 1}, "R", "R", 2}, {"h8", {1, 1}, {8, 1}, "R", "R", 2},
};

/* 2-D block layouts of a square f64 matrix (4096^2 by default, -b scales
 * it) between process grids: reshaped grids, transposed roles (dim 0
 * moves from grid rows to grid columns), uneven sizes (4095: pdgemr2d's
 * ceil blocks agree with the numpy split; 4097 over 4: they do not) and
 * replicated destinations. The 8- and 16-rank grids run when the world
 * has room. */
static const case_def_t grid_cases[] = {
    {"2x2-4x1", {2, 2}, {4, 1}, "S0S1", "S0S1", 3},
    {"4x1-1x4", {4, 1}, {1, 4}, "S0S1", "S0S1", 3},
    {"2x2-2x2t", {2, 2}, {2, 2}, "S0S1", "S1S0", 3},
    {"1x4-2x2", {1, 4}, {2, 2}, "S0S1", "S0S1", 3},
    {"2x2-4x1-odd", {2, 2}, {4, 1}, "S0S1", "S0S1", 4},
    {"4x1-2x2-odd", {4, 1}, {2, 2}, "S0S1", "S0S1", 5},
    {"2x2-RR", {2, 2}, {2, 2}, "S0S1", "RR", 3},
    {"2x2-S0R", {2, 2}, {2, 2}, "S0S1", "S0R", 3},
    {"2x4-4x2", {2, 4}, {4, 2}, "S0S1", "S0S1", 3},
    {"8x1-2x4t", {8, 1}, {2, 4}, "S0S1", "S1S0", 3},
    {"4x4-2x8", {4, 4}, {2, 8}, "S0S1", "S0S1", 3},
};

typedef struct {
    const char *name;
    const case_def_t *cases;
    int ncases;
    const char *methods;
    int64_t bytes; /* default tensor bytes */
} suite_t;

static const suite_t suites[] = {
    {"n-to-m", n_to_m_cases, 9,
     "xmesh,sendrecv,sendrecv-allgather,mpi-bcast,mpi-sendrecv-allgather,mpi-alltoallv",
     64LL << 20},
    {"1-to-m", one_to_m_cases, 7,
     "xmesh,sendrecv,sendrecv-allgather,mpi-bcast,mpi-sendrecv-allgather,mpi-alltoallv",
     16LL << 20},
    {"loadbalance", n_to_m_cases, 9, "naive,lb,xmesh", 64LL << 20},
    {"chain", chain_cases, 8, "xmesh", 16LL << 20},
    {"2d", grid_cases, (int)(sizeof grid_cases / sizeof grid_cases[0]),
     "xmesh,mpi-alltoallv,scalapack-pdgemr2d", 128LL << 20},
};

/* ------------------------------------------------------------ methods */

enum { M_XMESH = 0, M_MPI = 1, M_SCALAPACK = 2 };

typedef struct {
    const char *name;
    int mpi; /* M_MPI: baselines.c; M_SCALAPACK: scalapack.c; else xmesh */
    xmesh_strategy_t strategy;
    xmesh_scheduler_t scheduler;
    const char *help;
} method_t;

/* The paper's baselines balance senders greedily (section 5.1.2), hence
 * the lb scheduler for sendrecv and sendrecv-allgather. */
static const method_t methods[] = {
    {"xmesh", 0, XMESH_STRATEGY_BROADCAST, XMESH_SCHEDULER_ENSEMBLE,
     "broadcast chains + ensemble scheduler (paper's Ours)"},
    {"sendrecv", 0, XMESH_STRATEGY_SENDRECV, XMESH_SCHEDULER_LB, "one send/recv per receiver"},
    {"sendrecv-allgather", 0, XMESH_STRATEGY_SENDRECV_ALLGATHER, XMESH_SCHEDULER_LB,
     "1/k per receiver device + intra-host all-gather (Alpa)"},
    {"naive", 0, XMESH_STRATEGY_BROADCAST, XMESH_SCHEDULER_NAIVE,
     "broadcast, lowest sender, arbitrary order"},
    {"lb", 0, XMESH_STRATEGY_BROADCAST, XMESH_SCHEDULER_LB, "broadcast, balanced senders only"},
    {"dfs", 0, XMESH_STRATEGY_BROADCAST, XMESH_SCHEDULER_DFS, "broadcast, DFS scheduler"},
    {"greedy", 0, XMESH_STRATEGY_BROADCAST, XMESH_SCHEDULER_GREEDY,
     "broadcast, randomized greedy scheduler"},
    {"mpi-bcast", 1, XMESH_STRATEGY_UNSET, XMESH_SCHEDULER_UNSET,
     "MPI_Bcast per unit task over an intercommunicator, tasks in order"},
    {"mpi-ibcast", 1, XMESH_STRATEGY_UNSET, XMESH_SCHEDULER_UNSET,
     "MPI_Ibcast per unit task over an intercommunicator, all at once"},
    {"mpi-sendrecv-allgather", 1, XMESH_STRATEGY_UNSET, XMESH_SCHEDULER_UNSET,
     "Alpa with MPI: 1/k of each box per receiver device, then MPI_Iallgatherv per host"},
    {"mpi-alltoallv", 1, XMESH_STRATEGY_UNSET, XMESH_SCHEDULER_UNSET,
     "MPI_Ialltoallv over the union of both meshes"},
    {"scalapack-pdgemr2d", M_SCALAPACK, XMESH_STRATEGY_UNSET, XMESH_SCHEDULER_UNSET,
     "ScaLAPACK pdgemr2d, block-cyclic with block ceil(n/p) (2d suite)"},
};
#define NMETHODS ((int)(sizeof methods / sizeof methods[0]))

/* --------------------------------------------------------------- rows */

typedef struct {
    char suite[16], casename[32], method[32], status[24];
    int64_t bytes;
    int64_t req_bytes; /* the size of the sweep this row belongs to (-b .. -e) */
    char shape[64];
    double tmed, tmin, tmax, lb, pred;
    double plan_med, plan_min, plan_max; /* plan creation / baseline setup, s */
    int plans;                           /* how many were timed */
    char note[160];                      /* why a row did not run (n/a, not-built) */
    int iters;
    long long wrong;
    double *times;
} row_t;

static row_t rows[MAX_ROWS];
static int nrows;
static int casew = 8; /* width of the case column: the suite's longest name */
static bench_world_t W;
static opts_t O;

/* xmesh_oob_t.allgather over an MPI communicator (user). */
static int mpi_allgather(void *user, const void *send, void *recv, size_t bytes)
{
    return MPI_Allgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE,
                         *(MPI_Comm *)user) != MPI_SUCCESS;
}

static void usage(void)
{
    printf("usage: mpirun ... xmesh-bench [options]\n"
           "  -s suite     n-to-m | 1-to-m | loadbalance | 2d | chain | weights (default\n"
           "               n-to-m); weights: GPT-2's 148 tensors and 1,000 small ones, methods\n"
           "               many,serial,concurrent,alltoallv,ckpt-engine (docs/MANY.md)\n"
           "  -m methods   comma list (default: the suite's); known:\n");
    for (int i = 0; i < NMETHODS; i++)
        printf("                 %-20s %s\n", methods[i].name, methods[i].help);
    printf("  -C cases     comma list of case names (n-to-m: 1..9; 1-to-m: 1x1,1x2,...;\n"
           "               2d:");
    for (size_t i = 0; i < sizeof grid_cases / sizeof grid_cases[0]; i++)
        printf("%s%s", i ? "," : " ", grid_cases[i].name);
    printf(")\n"
           "  -b bytes     minimum tensor bytes (K/M/G suffixes; default: suite's; 2d: an\n"
           "               n x n f64 matrix, n = sqrt(bytes / 8), default 128M = 4096^2)\n"
           "  -e bytes     maximum tensor bytes (default: -b)\n"
           "  -f factor    multiplication factor between sizes (default 2)\n"
           "  -n iters     measured iterations (default 5)\n"
           "  -w iters     warm-up iterations (default 1)\n"
           "  -c 0|1       check every destination element (default 1)\n"
           "  -J file      write results as JSON\n"
           "  -D prefix    write gnuplot data PREFIX-SUITE.dat / PREFIX-SUITE-lb.dat\n"
           "  -V n         virtual hosts of n ranks (single-machine fallback; no NIC limit)\n"
           "  -R           with -V: the meshes are placed on the virtual hosts, but xmesh sees\n"
           "               the real ones (one machine = one host: every hop shared memory)\n"
           "  -P us        poll interval of the MPI baselines' waits (default 100)\n"
           "  -k bytes     calibration transfer size (default 8M; 0: skip)\n"
           "  -p n         xmesh plans created and timed per row (default 3; the last runs)\n"
           "  -B, --barrier  end every timed iteration with MPI_Barrier on all ranks, as an\n"
           "               application step would; the reported times include it\n"
           "  --spin-barrier  the same with a spinning barrier (MPI_Ibarrier, then MPI_Test in\n"
           "               a tight loop: the waiting ranks keep their cores busy)\n"
           "  -K, --cluster FILE  cost model from a cluster file (xmesh-calibrate -o FILE;\n"
           "               same as XMESH_CLUSTER_FILE): predictions and plans use it\n"
           "  -T, --transport mpi|ucx  transport of the xmesh rows (default XMESH_TRANSPORT,\n"
           "               else mpi); ucx: a UCX context bootstrapped through MPI_Allgather\n"
           "               (the baselines stay MPI)\n");
}

static int64_t parse_bytes(const char *s)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0)
        return -1;
    switch (*end) {
    case 'G':
    case 'g':
        v *= 1024; /* fall through */
    case 'M':
    case 'm':
        v *= 1024; /* fall through */
    case 'K':
    case 'k':
        v *= 1024;
        end++;
        break;
    case '\0':
        break;
    default:
        return -1;
    }
    return *end ? -1 : (int64_t)v;
}

static int in_list(const char *list, const char *name)
{
    if (!list)
        return 1;
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *q = strchr(p, ',');
        size_t len = q ? (size_t)(q - p) : strlen(p);
        if (len == n && !strncmp(p, name, n))
            return 1;
        if (!q)
            break;
        p = q + 1;
    }
    return 0;
}

/* ------------------------------------------------------------ world */

static int world_init(void)
{
    MPI_Comm_rank(MPI_COMM_WORLD, &W.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &W.size);
    W.virtual_hosts = O.virtual_hosts;
    W.poll_us = O.poll_us;
    W.host_of = malloc(sizeof(int) * (size_t)W.size);
    char *names = calloc((size_t)W.size, MPI_MAX_PROCESSOR_NAME);
    char me[MPI_MAX_PROCESSOR_NAME] = {0};
    int len = 0;
    if (!W.host_of || !names)
        return -1;
    MPI_Get_processor_name(me, &len);
    MPI_Allgather(me, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names, MPI_MAX_PROCESSOR_NAME, MPI_CHAR,
                  MPI_COMM_WORLD);
    W.nhosts = 0;
    for (int r = 0; r < W.size; r++) {
        if (W.virtual_hosts > 0) {
            W.host_of[r] = r / W.virtual_hosts;
        } else {
            int h = -1;
            for (int q = 0; q < r && h < 0; q++)
                if (!strcmp(names + (size_t)q * MPI_MAX_PROCESSOR_NAME,
                            names + (size_t)r * MPI_MAX_PROCESSOR_NAME))
                    h = W.host_of[q];
            W.host_of[r] = h >= 0 ? h : W.nhosts;
        }
        if (W.host_of[r] + 1 > W.nhosts)
            W.nhosts = W.host_of[r] + 1;
    }
    free(names);
    W.host_off = calloc((size_t)W.nhosts + 1, sizeof(int));
    W.host_ranks = malloc(sizeof(int) * (size_t)W.size);
    if (!W.host_off || !W.host_ranks)
        return -1;
    for (int r = 0; r < W.size; r++)
        W.host_off[W.host_of[r] + 1]++;
    for (int h = 0; h < W.nhosts; h++)
        W.host_off[h + 1] += W.host_off[h];
    int *fill = calloc((size_t)W.nhosts, sizeof(int));
    if (!fill)
        return -1;
    for (int r = 0; r < W.size; r++)
        W.host_ranks[W.host_off[W.host_of[r]] + fill[W.host_of[r]]++] = r;
    free(fill);
    return 0;
}

/* ------------------------------------------------------------- values */

/* The value every element of the global tensor carries: a hash of its
 * linear index, so a misplaced box is caught, not only a missing one. */
static inline int32_t elem_value(int64_t g)
{
    uint64_t x = (uint64_t)g * 0x9E3779B97F4A7C15ull;
    return (int32_t)(x >> 32);
}

/* Fills (check == 0) or counts mismatches of (check == 1) the local block
 * [lo, hi) of a tensor of `shape`. f64 tensors carry the same integers as
 * doubles (exact), so they are compared exactly too. */
static long long block_values(const bench_case_t *c, void *blkv, const int64_t *lo,
                              const int64_t *hi, int check)
{
    int32_t *blk = c->src.elem_size == 4 ? blkv : NULL;
    double *fblk = c->src.elem_size == 8 ? blkv : NULL;
    int nd = c->ndim;
    int64_t gstride[XM_MAX_DIMS], idx[XM_MAX_DIMS];
    int64_t s = 1;
    for (int d = nd - 1; d >= 0; d--) {
        gstride[d] = s;
        s *= c->shape[d];
        idx[d] = lo[d];
        if (hi[d] <= lo[d])
            return 0;
    }
    int64_t row = hi[nd - 1] - lo[nd - 1];
    long long wrong = 0;
    for (;;) {
        int64_t g = 0;
        for (int d = 0; d < nd; d++)
            g += idx[d] * gstride[d];
        if (fblk && check) {
            for (int64_t i = 0; i < row; i++)
                wrong += fblk[i] != (double)elem_value(g + i);
        } else if (fblk) {
            for (int64_t i = 0; i < row; i++)
                fblk[i] = (double)elem_value(g + i);
        } else if (check) {
            for (int64_t i = 0; i < row; i++)
                wrong += blk[i] != elem_value(g + i);
        } else {
            for (int64_t i = 0; i < row; i++)
                blk[i] = elem_value(g + i);
        }
        if (fblk)
            fblk += row;
        else
            blk += row;
        int d = nd - 2;
        for (; d >= 0; d--) {
            if (++idx[d] < hi[d])
                break;
            idx[d] = lo[d];
        }
        if (d < 0)
            break;
    }
    return wrong;
}

/* --------------------------------------------------------------- cases */

static void case_shape(const case_def_t *def, int64_t bytes, bench_case_t *c)
{
    int64_t elems = bytes / 4;
    if (is_grid(def)) {
        /* n x n f64 = bytes; at least 16 so a 16-way grid has no empty
         * block; kinds 4 and 5 are one row and column short / over. */
        int64_t n = (int64_t)llround(sqrt((double)bytes / 8.0));
        if (n < 16)
            n = 16;
        n += def->shape_kind == 4 ? -1 : def->shape_kind == 5 ? 1 : 0;
        c->ndim = 2;
        c->shape[0] = c->shape[1] = n;
    } else if (def->shape_kind == 2) {
        c->ndim = 1;
        c->shape[0] = elems > 0 ? elems : 1;
    } else if (def->shape_kind == 1) {
        /* Case 6: (3072, 1024, 170) has aspect 18:6:1 and divides by 2 and
         * 3 on dim 0; keep both properties. */
        int64_t x = (int64_t)llround(cbrt(2.0 * (double)elems) / 12.0) * 12;
        if (x < 12)
            x = 12;
        c->ndim = 3;
        c->shape[0] = 3 * x;
        c->shape[1] = x;
        c->shape[2] = x / 6;
    } else {
        int64_t k = (int64_t)llround(cbrt((double)elems / 4.0) / 8.0) * 8;
        if (k < 8)
            k = 8;
        c->ndim = 3;
        c->shape[0] = 2 * k;
        c->shape[1] = 2 * k;
        c->shape[2] = k;
    }
}

static void case_free(bench_case_t *c)
{
    xm_taskset_free(&c->ts);
    free(c->src_ranks);
    free(c->dst_ranks);
    memset(c, 0, sizeof *c);
}

/* Meshes as (hosts, devices per host): mesh row h is host h (source) or
 * host src_mesh[0] + h (destination). 1 if the world is too small. */
static int host_place(const case_def_t *def, bench_case_t *c, char *why, size_t whylen)
{
    int need_hosts = def->src_mesh[0] + def->dst_mesh[0];
    if (need_hosts > W.nhosts) {
        snprintf(why, whylen, "needs %d hosts, have %d", need_hosts, W.nhosts);
        return 1;
    }
    for (int side = 0; side < 2; side++) {
        const int *mesh = side ? def->dst_mesh : def->src_mesh;
        int *out = side ? c->dst_ranks : c->src_ranks;
        int h0 = side ? def->src_mesh[0] : 0;
        for (int h = 0; h < mesh[0]; h++) {
            int have = W.host_off[h0 + h + 1] - W.host_off[h0 + h];
            if (mesh[1] > have) {
                snprintf(why, whylen, "needs %d ranks on host %d, have %d", mesh[1], h0 + h, have);
                return 1;
            }
            for (int d = 0; d < mesh[1]; d++)
                out[h * mesh[1] + d] = W.host_ranks[W.host_off[h0 + h] + d];
        }
    }
    return 0;
}

/* Meshes as process grids (2d suite): the source grid takes the first
 * rows*cols ranks in host-major order, row-major over the grid, as an MPI
 * code numbering its grid by rank would; the destination grid starts on
 * the first host the source does not touch, so the meshes share no host.
 * 1 if the world is too small. */
static int grid_place(const case_def_t *def, bench_case_t *c, char *why, size_t whylen)
{
    int h = 0;
    for (int side = 0; side < 2; side++) {
        const int *mesh = side ? def->dst_mesh : def->src_mesh;
        int *out = side ? c->dst_ranks : c->src_ranks;
        int need = mesh[0] * mesh[1], got = 0;
        for (; h < W.nhosts && got < need; h++)
            for (int k = W.host_off[h]; k < W.host_off[h + 1] && got < need; k++)
                out[got++] = W.host_ranks[k];
        if (got < need) {
            snprintf(why, whylen,
                     "needs %d + %d ranks on separate hosts, have %d ranks on %d hosts",
                     def->src_mesh[0] * def->src_mesh[1], def->dst_mesh[0] * def->dst_mesh[1],
                     W.size, W.nhosts);
            return 1;
        }
    }
    return 0;
}

/* Maps a case onto the world. Returns 1 if the world is too small (with a
 * reason in why), -1 on error, 0 on success. */
static int case_build(const case_def_t *def, int64_t bytes, bench_case_t *c, char *why,
                      size_t whylen)
{
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "%s", def->name);
    case_shape(def, bytes, c);
    c->src_mesh[0] = def->src_mesh[0];
    c->src_mesh[1] = def->src_mesh[1];
    c->dst_mesh[0] = def->dst_mesh[0];
    c->dst_mesh[1] = def->dst_mesh[1];
    c->src_spec = def->src_spec;
    c->dst_spec = def->dst_spec;
    int ns = def->src_mesh[0] * def->src_mesh[1], nd = def->dst_mesh[0] * def->dst_mesh[1];
    c->src_ranks = malloc(sizeof(int) * (size_t)ns);
    c->dst_ranks = malloc(sizeof(int) * (size_t)nd);
    if (!c->src_ranks || !c->dst_ranks)
        return -1;
    int rc = is_grid(def) ? grid_place(def, c, why, whylen) : host_place(def, c, why, whylen);
    if (rc)
        return rc;
    xm_layout_t *ls[2] = {&c->src, &c->dst};
    for (int side = 0; side < 2; side++) {
        xm_layout_t *l = ls[side];
        const int *mesh = side ? def->dst_mesh : def->src_mesh;
        l->ndim = c->ndim;
        for (int d = 0; d < c->ndim; d++)
            l->shape[d] = c->shape[d];
        l->elem_size = is_grid(def) ? 8 : 4;
        l->mesh.ndim = 2;
        l->mesh.shape[0] = mesh[0];
        l->mesh.shape[1] = mesh[1];
        l->mesh.ndev = mesh[0] * mesh[1];
        l->mesh.devs = side ? c->dst_ranks : c->src_ranks;
        if (xm_spec_parse(side ? def->dst_spec : def->src_spec, c->ndim, 2, &l->spec)) {
            snprintf(why, whylen, "spec: %s", xmesh_last_error());
            return -1;
        }
    }
    xm_hostmap_t hm = {W.size, W.nhosts, W.host_of};
    if (xm_decompose(&c->src, &c->dst, &hm, &c->ts)) {
        snprintf(why, whylen, "decompose: %s", xmesh_last_error());
        return -1;
    }
    c->src_index = xm_mesh_find(&c->src.mesh, W.rank);
    c->dst_index = xm_mesh_find(&c->dst.mesh, W.rank);
    c->src_elems = c->dst_elems = 0;
    if (c->src_index >= 0) {
        xm_layout_block(&c->src, c->src_index, c->src_lo, c->src_hi);
        c->src_elems = 1;
        for (int d = 0; d < c->ndim; d++)
            c->src_elems *= c->src_hi[d] - c->src_lo[d];
    }
    if (c->dst_index >= 0) {
        xm_layout_block(&c->dst, c->dst_index, c->dst_lo, c->dst_hi);
        c->dst_elems = 1;
        for (int d = 0; d < c->ndim; d++)
            c->dst_elems *= c->dst_hi[d] - c->dst_lo[d];
    }
    return 0;
}

/* -------------------------------------------------------- xmesh method */

typedef struct {
    xmesh_ctx_t ctx;
    int available; /* the context could be made */
    char why[256]; /* why not, for the header */
} xmesh_state_t;

static xmesh_state_t X;

typedef struct {
    xmesh_mesh_t sm, dm;
    xmesh_plan_t plan;
    xmesh_plan_info_t info;
} xplan_t;

static void xplan_free(xplan_t *p)
{
    if (p->plan)
        xmesh_plan_destroy(p->plan);
    if (p->sm)
        xmesh_mesh_destroy(p->sm);
    if (p->dm)
        xmesh_mesh_destroy(p->dm);
    memset(p, 0, sizeof *p);
}

/* Collective. Returns the xmesh result (identical on every rank since plan
 * creation agrees across ranks). */
static xmesh_result_t xplan_make(const bench_case_t *c, const method_t *m, xplan_t *p)
{
    memset(p, 0, sizeof *p);
    if (!X.available)
        return XMESH_ERR_UNSUPPORTED;
    xmesh_result_t r = xmesh_mesh_create(X.ctx, 2, c->src_mesh, c->src_ranks, &p->sm);
    if (!r)
        r = xmesh_mesh_create(X.ctx, 2, c->dst_mesh, c->dst_ranks, &p->dm);
    if (r) {
        xplan_free(p);
        return r;
    }
    xmesh_dtype_t dt = c->src.elem_size == 8 ? XMESH_F64 : XMESH_I32;
    xmesh_layout_t sl = {c->ndim, c->shape, dt, p->sm, c->src_spec};
    xmesh_layout_t dl = {c->ndim, c->shape, dt, p->dm, c->dst_spec};
    xmesh_plan_params_t pp = XMESH_PLAN_PARAMS_INITIALIZER;
    pp.strategy = m ? m->strategy : XMESH_STRATEGY_UNSET;
    pp.scheduler = m ? m->scheduler : XMESH_SCHEDULER_UNSET;
    r = xmesh_plan_create(X.ctx, &sl, &dl, &pp, &p->plan);
    if (!r)
        r = xmesh_plan_get_info(p->plan, &p->info);
    if (r)
        xplan_free(p);
    return r;
}

/* ------------------------------------------------------------- running */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int64_t cur_req_bytes; /* size of the sweep being run */

static row_t *new_row(const char *suite, const bench_case_t *c, const char *method)
{
    if (nrows >= MAX_ROWS)
        return NULL;
    row_t *r = &rows[nrows++];
    memset(r, 0, sizeof *r);
    snprintf(r->suite, sizeof r->suite, "%s", suite);
    snprintf(r->casename, sizeof r->casename, "%s", c->name);
    snprintf(r->method, sizeof r->method, "%s", method);
    r->bytes = (int64_t)c->src.elem_size;
    r->req_bytes = cur_req_bytes;
    int n = 0;
    for (int d = 0; d < c->ndim; d++) {
        r->bytes *= c->shape[d];
        n += snprintf(r->shape + n, sizeof r->shape - (size_t)n, "%s%lld", d ? "x" : "",
                      (long long)c->shape[d]);
    }
    r->lb = r->pred = NAN;
    r->tmed = r->tmin = r->tmax = NAN;
    r->plan_med = r->plan_min = r->plan_max = NAN;
    return r;
}

static void print_row(const row_t *r)
{
    if (W.rank)
        return;
    printf("%*s %-22s %11lld", casew, r->casename, r->method, (long long)r->bytes);
    if (strcmp(r->status, "ok") && strcmp(r->status, "WRONG")) {
        printf("   %s%s%s%s\n", r->status, r->note[0] ? " (" : "", r->note, r->note[0] ? ")" : "");
        fflush(stdout);
        return;
    }
    double algbw = r->bytes / r->tmed / 1e6;
    printf(" %8.3f %8.3f %8.3f %8.2f", r->tmed, r->tmin, r->tmax, algbw);
    if (isnan(r->lb))
        printf(" %7s", "-");
    else
        printf(" %7.3f", r->tmed / r->lb);
    if (isnan(r->pred))
        printf(" %8s %7s", "-", "-");
    else
        printf(" %8.3f %7.3f", r->pred, r->pred / r->tmed);
    if (isnan(r->plan_med))
        printf(" %8s", "-");
    else
        printf(" %8.4f", r->plan_med);
    printf(" %7lld%s\n", r->wrong, strcmp(r->status, "ok") ? "  WRONG" : "");
    fflush(stdout);
}

static double median_sorted(const double *s, int n)
{
    return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

/* Fills med/min/max from n samples (n >= 1). */
static void stats(const double *v, int n, double *med, double *mn, double *mx)
{
    double *s = malloc(sizeof(double) * (size_t)n);
    if (!s) {
        *med = *mn = *mx = NAN;
        return;
    }
    memcpy(s, v, sizeof(double) * (size_t)n);
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    *mn = s[0];
    *mx = s[n - 1];
    *med = median_sorted(s, n);
    free(s);
}

/* Seconds from a common barrier to the slowest rank's end of a setup step
 * (collective). */
static double since_all(double t0)
{
    double t = MPI_Wtime() - t0, tmax = 0;
    MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return tmax;
}

static int model_cluster(xm_cluster_t *cl);

/* The state one method needs for a case, made before the first iteration. */
typedef struct {
    xplan_t xp;
    bench_mpi_method_t *mm;
    bench_scalapack_t *sl;
} prepared_t;

/* Builds the method's state and times it: xmesh plans O.plans times (the
 * last one is kept), a baseline's setup once. Collective. 0 on success;
 * otherwise row->status is set and nothing is kept. */
static int prepare(bench_case_t *c, const method_t *m, row_t *row, prepared_t *pm)
{
    memset(pm, 0, sizeof *pm);
    double times[64];
    int n = 0;
    if (m->mpi == M_MPI) {
        bench_barrier(&W, MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        pm->mm = bench_mpi_setup(&W, c, m->name);
        times[n++] = since_all(t0);
        if (!pm->mm) {
            snprintf(row->status, sizeof row->status, "setup-failed");
            return -1;
        }
        xm_cluster_t cl;
        if (!model_cluster(&cl)) {
            row->pred = bench_mpi_predict(pm->mm, &cl);
            xm_cluster_free(&cl);
        }
    } else if (m->mpi == M_SCALAPACK) {
        bench_barrier(&W, MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        pm->sl = bench_scalapack_setup(&W, c, row->status, sizeof row->status, row->note,
                                       sizeof row->note);
        times[n++] = since_all(t0);
        if (!pm->sl)
            return -1;
        /* pdgemr2d: point-to-point messages between all block owners,
         * in flight together: the all-to-all model */
        xm_cluster_t cl;
        int *snd = malloc(sizeof(int) * (size_t)(c->ts.ntasks + 1));
        if (snd && !model_cluster(&cl)) {
            for (int t = 0; t < c->ts.ntasks; t++)
                snd[t] = c->ts.holders[c->ts.tasks[t].holder_off];
            row->pred = xm_cost_mpi(&c->ts, &cl, snd, XM_COST_MPI_ALLTOALLV);
            xm_cluster_free(&cl);
        }
        free(snd);
    } else {
        int nplans = O.plans < 1 ? 1 : O.plans > 64 ? 64 : O.plans;
        for (int k = 0; k < nplans; k++) {
            if (k)
                xplan_free(&pm->xp);
            bench_barrier(&W, MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            xmesh_result_t r = xplan_make(c, m, &pm->xp);
            times[n++] = since_all(t0);
            if (r) {
                snprintf(row->status, sizeof row->status, "%s",
                         r == XMESH_ERR_UNSUPPORTED ? "unsupported" : xmesh_result_string(r));
                if (W.rank == 0 && X.available)
                    fprintf(stderr, "xmesh-bench: case %s %s: plan: %s\n", c->name, m->name,
                            xmesh_last_error());
                return -1;
            }
        }
        row->pred = pm->xp.info.predicted_s;
        if (isnan(row->lb))
            row->lb = pm->xp.info.lower_bound_s;
    }
    row->plans = n;
    stats(times, n, &row->plan_med, &row->plan_min, &row->plan_max);
    return 0;
}

static void release(prepared_t *pm)
{
    bench_mpi_free(pm->mm);
    bench_scalapack_free(pm->sl);
    xplan_free(&pm->xp);
}

/* Runs one method on one case: warm-up + measured iterations, each timed
 * from a common barrier to the last rank's completion (with -B: to the end
 * of a closing MPI_Barrier on all ranks) and checked. Collective over the
 * world. */
static void run_method(const char *suite, bench_case_t *c, const method_t *m, void *src, void *dst,
                       double lb)
{
    row_t *row = new_row(suite, c, m->name);
    if (!row)
        return;
    row->lb = lb;
    prepared_t pm;
    if (prepare(c, m, row, &pm)) {
        print_row(row);
        return;
    }
    int total = O.warmup + O.iters;
    row->times = calloc((size_t)(O.iters > 0 ? O.iters : 1), sizeof(double));
    long long wrong_total = 0;
    int failed = 0;
    for (int it = 0; it < total && !failed; it++) {
        if (O.check && dst)
            memset(dst, 0xA5, (size_t)c->dst_elems * c->dst.elem_size);
        bench_barrier(&W, MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        int err = 0;
        if (pm.mm) {
            err = bench_mpi_run(pm.mm, src, dst) != 0;
        } else if (pm.sl) {
            err = bench_scalapack_run(pm.sl, src, dst) != 0;
        } else {
            xmesh_result_t r = xmesh_reshard(pm.xp.plan, c->src_index >= 0 ? src : NULL,
                                             c->dst_index >= 0 ? dst : NULL);
            if (r) {
                fprintf(stderr, "xmesh-bench: rank %d case %s %s: reshard: %s: %s\n", W.rank,
                        c->name, m->name, xmesh_result_string(r), xmesh_last_error());
                err = 1;
            }
        }
        /* Application-style: the step ends when every rank has passed a
         * plain MPI_Barrier (not the bench's polling one). */
        if (O.barrier == 1)
            MPI_Barrier(MPI_COMM_WORLD);
        else if (O.barrier == 2) { /* spinning: MPI_Test in a tight loop, no sleep */
            MPI_Request br;
            int done = 0;
            MPI_Ibarrier(MPI_COMM_WORLD, &br);
            while (!done)
                MPI_Test(&br, &done, MPI_STATUS_IGNORE);
        }
        double t = MPI_Wtime() - t0, tmax = 0;
        int anyerr = 0;
        MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        MPI_Allreduce(&err, &anyerr, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        if (anyerr) {
            failed = 1;
            break;
        }
        if (O.check) {
            long long w = c->dst_index >= 0 ? block_values(c, dst, c->dst_lo, c->dst_hi, 1) : 0;
            long long wsum = 0;
            MPI_Allreduce(&w, &wsum, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
            wrong_total += wsum;
        }
        if (it >= O.warmup && row->times)
            row->times[it - O.warmup] = tmax;
    }
    if (failed) {
        snprintf(row->status, sizeof row->status, "error");
    } else if (O.iters > 0 && row->times) {
        row->iters = O.iters;
        stats(row->times, O.iters, &row->tmed, &row->tmin, &row->tmax);
        row->wrong = wrong_total;
        snprintf(row->status, sizeof row->status, "%s", wrong_total ? "WRONG" : "ok");
    } else {
        snprintf(row->status, sizeof row->status, "no-iterations");
    }
    print_row(row);
    release(&pm);
}

/* The library's cluster model over the world's hosts (XMESH_* parameters
 * and XMESH_CLUSTER_FILE, as plans see it). 0 on success. */
static int model_cluster(xm_cluster_t *cl)
{
    xm_hostmap_t hm = {W.size, W.nhosts, W.host_of};
    return xm_cluster_from_env(cl, &hm, xm_param_chunk_bytes()) ? -1 : 0;
}

/* The same bound from the library's model over the bench's own unit tasks,
 * for runs where no xmesh plan can be made (e.g. a library without the
 * MPI executor). NAN if the model cannot be built. */
static double model_lower_bound(const bench_case_t *c)
{
    xm_cluster_t cl;
    if (model_cluster(&cl))
        return NAN;
    double lb = xm_lower_bound(&c->ts, &cl);
    xm_cluster_free(&cl);
    return lb;
}

static void run_case(const suite_t *s, const case_def_t *def, int64_t bytes)
{
    bench_case_t c;
    char why[256] = "";
    int rc = case_build(def, bytes, &c, why, sizeof why);
    int worst = 0;
    MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (worst) {
        if (W.rank == 0)
            printf("%*s %-22s %11s   skipped: %s\n", casew, def->name, "*", "-", why);
        case_free(&c);
        return;
    }
    void *src = c.src_elems ? malloc((size_t)c.src_elems * c.src.elem_size) : NULL;
    void *dst = c.dst_elems ? malloc((size_t)c.dst_elems * c.dst.elem_size) : NULL;
    int ok = (!c.src_elems || src) && (!c.dst_elems || dst), all = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all) {
        if (W.rank == 0)
            printf("%*s %-22s %11s   skipped: out of memory\n", casew, def->name, "*", "-");
        goto out_free;
    }
    if (src)
        block_values(&c, src, c.src_lo, c.src_hi, 0);
    /* The lower bound belongs to the case, not the method: take it from a
     * default xmesh plan when the library can plan. */
    double lb = NAN;
    xplan_t xp;
    if (xplan_make(&c, NULL, &xp) == XMESH_SUCCESS) {
        lb = xp.info.lower_bound_s;
        xplan_free(&xp);
    } else {
        lb = model_lower_bound(&c);
    }
    for (int i = 0; i < NMETHODS; i++) {
        const char *list = O.methods ? O.methods : s->methods;
        if (in_list(list, methods[i].name))
            run_method(s->name, &c, &methods[i], src, dst, lb);
    }
out_free:
    free(src);
    free(dst);
    case_free(&c);
}

/* -------------------------------------------------------------- output */

static void json_str(FILE *f, const char *k, const char *v, int comma)
{
    fprintf(f, "\"%s\": \"%s\"%s", k, v, comma ? ", " : "");
}

static void json_num(FILE *f, const char *k, double v, int comma)
{
    if (isnan(v) || isinf(v))
        fprintf(f, "\"%s\": null%s", k, comma ? ", " : "");
    else
        fprintf(f, "\"%s\": %.6g%s", k, v, comma ? ", " : "");
}

static void write_json(const char *path, const bench_calib_t *cal)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "xmesh-bench: cannot write %s: %s\n", path, strerror(errno));
        return;
    }
    fprintf(f, "{\n  \"bench\": \"xmesh-bench\", \"xmesh_version\": \"%s\",\n",
            xmesh_version_string());
    fprintf(f,
            "  \"config\": {\"ranks\": %d, \"hosts\": %d, \"virtual_hosts\": %d, "
            "\"iters\": %d, \"warmup\": %d, \"check\": %d, \"closing_barrier\": %d, "
            "\"plans_per_row\": %d, \"scalapack_built\": %d, \"transport\": \"%s\",\n"
            "             \"timing\": \"%s\"},\n",
            W.size, W.nhosts, W.virtual_hosts, O.iters, O.warmup, O.check, O.barrier, O.plans,
            bench_scalapack_built(), O.transport,
            O.barrier == 2 ? "common barrier to the end of a closing spinning barrier on all ranks "
                             "(included)"
            : O.barrier
                ? "common barrier to the end of a closing MPI_Barrier on all ranks (included)"
                : "common barrier to the last rank done");
    fprintf(f, "  \"calibration\": {");
    json_num(f, "nominal_mbit", cal->nominal_mbit, 1);
    json_num(f, "one_mbit", cal->one_mbit, 1);
    json_num(f, "shared_mbit", cal->shared_mbit, 1);
    json_num(f, "ring_mbit", cal->ring_mbit, 1);
    json_num(f, "intra_mbit", cal->intra_mbit, 0);
    fprintf(f, "},\n  \"model\": {");
    const char *envs[] = {"XMESH_NIC_GBPS", "XMESH_NICS_PER_HOST", "XMESH_INTRA_GBPS",
                          "XMESH_LATENCY_US", "XMESH_CHUNK_BYTES"};
    for (int i = 0; i < 5; i++) {
        const char *v = getenv(envs[i]);
        json_str(f, envs[i], v ? v : "", 1);
    }
    /* what the MPI executor ran with (0 / unset = auto, resolved) */
    json_num(f, "chunk_bytes", (double)xm_param_chunk_bytes(), 1);
    json_num(f, "send_ahead", (double)xm_param_send_ahead(), 1);
    json_num(f, "forward_ahead", (double)xm_param_forward_ahead(), 1);
    json_num(f, "sync_send", (double)xm_param_sync_send(), 0);
    fprintf(f, "},\n  \"rows\": [\n");
    for (int i = 0; i < nrows; i++) {
        const row_t *r = &rows[i];
        fprintf(f, "    {");
        json_str(f, "suite", r->suite, 1);
        json_str(f, "case", r->casename, 1);
        json_str(f, "method", r->method, 1);
        json_str(f, "status", r->status, 1);
        json_str(f, "note", r->note, 1);
        json_str(f, "shape", r->shape, 1);
        fprintf(f, "\"bytes\": %lld, \"iters\": %d, ", (long long)r->bytes, r->iters);
        json_num(f, "time_med_s", r->tmed, 1);
        json_num(f, "time_min_s", r->tmin, 1);
        json_num(f, "time_max_s", r->tmax, 1);
        json_num(f, "algbw_MBps", r->bytes / r->tmed / 1e6, 1);
        json_num(f, "lower_bound_s", r->lb, 1);
        json_num(f, "time_over_lb", r->tmed / r->lb, 1);
        json_num(f, "predicted_s", r->pred, 1);
        json_num(f, "predicted_over_time", r->pred / r->tmed, 1);
        fprintf(f, "\"plans\": %d, ", r->plans);
        json_num(f, "plan_med_s", r->plan_med, 1);
        json_num(f, "plan_min_s", r->plan_min, 1);
        json_num(f, "plan_max_s", r->plan_max, 1);
        fprintf(f, "\"wrong\": %lld, \"times_s\": [", r->wrong);
        for (int k = 0; k < r->iters && r->times; k++)
            fprintf(f, "%s%.6g", k ? ", " : "", r->times[k]);
        fprintf(f, "]}%s\n", i + 1 < nrows ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
    fclose(f);
    printf("# JSON written to %s\n", path);
}

/* gnuplot data: one line per case, one column per method; median seconds
 * and median / lower bound. Only the largest size of the sweep. */
static void write_dat(const char *prefix, const char *suite)
{
    const char *mnames[MAX_METHODS];
    const char *cnames[MAX_CASES];
    int nm = 0, nc = 0;
    int64_t maxbytes = 0;
    for (int i = 0; i < nrows; i++)
        if (!strcmp(rows[i].suite, suite) && rows[i].req_bytes > maxbytes)
            maxbytes = rows[i].req_bytes;
    for (int i = 0; i < nrows; i++) {
        const row_t *r = &rows[i];
        if (strcmp(r->suite, suite))
            continue;
        int k;
        for (k = 0; k < nm && strcmp(mnames[k], r->method); k++)
            ;
        if (k == nm && nm < MAX_METHODS)
            mnames[nm++] = r->method;
        for (k = 0; k < nc && strcmp(cnames[k], r->casename); k++)
            ;
        if (k == nc && nc < MAX_CASES)
            cnames[nc++] = r->casename;
    }
    if (!nm)
        return;
    for (int kind = 0; kind < 2; kind++) {
        char path[1024];
        snprintf(path, sizeof path, "%s-%s%s.dat", prefix, suite, kind ? "-lb" : "");
        FILE *f = fopen(path, "w");
        if (!f) {
            fprintf(stderr, "xmesh-bench: cannot write %s: %s\n", path, strerror(errno));
            continue;
        }
        fprintf(f, "case");
        for (int m = 0; m < nm; m++)
            fprintf(f, "\t%s", mnames[m]);
        fprintf(f, "\n");
        for (int cc = 0; cc < nc; cc++) {
            fprintf(f, "%s", cnames[cc]);
            for (int m = 0; m < nm; m++) {
                double v = NAN;
                for (int i = 0; i < nrows; i++) {
                    const row_t *r = &rows[i];
                    if (!strcmp(r->suite, suite) && !strcmp(r->method, mnames[m]) &&
                        !strcmp(r->casename, cnames[cc]) && r->req_bytes == maxbytes &&
                        !strcmp(r->status, "ok"))
                        v = kind ? r->tmed / r->lb : r->tmed;
                }
                if (isnan(v))
                    fprintf(f, "\tNaN");
                else
                    fprintf(f, "\t%.6g", v);
            }
            fprintf(f, "\n");
        }
        fclose(f);
        printf("# gnuplot data written to %s\n", path);
    }
}

/* ---------------------------------------------------------------- main */

static void print_calib(const bench_calib_t *c)
{
    if (W.rank)
        return;
    printf("# calibration (raw MPI point-to-point, %lld-byte transfers, best of 2):\n",
           (long long)O.calib_bytes);
    if (W.virtual_hosts > 0 && O.calib_bytes > 0)
        printf("#   virtual hosts: every transfer below is shared memory; no NIC to calibrate\n");
    if (O.calib_bytes == 0) {
        printf("#   skipped (-k 0)\n");
    } else if (c->one_mbit < 0) {
        printf("#   one host only: no NIC to calibrate\n");
    } else if (c->nominal_mbit > 0) {
        double pct = 100 * c->one_mbit / c->nominal_mbit;
        printf("#   1 transfer host0->host1     %9.1f Mbit/s = %5.1f%% of nominal %.0f Mbit/s"
               "  [%s >= 90%%]\n",
               c->one_mbit, pct, c->nominal_mbit, pct >= 90 ? "OK" : "LOW");
    } else {
        printf("#   1 transfer host0->host1     %9.1f Mbit/s (nominal rate unknown: "
               "XMESH_NIC_GBPS unset)\n",
               c->one_mbit);
    }
    if (c->shared_mbit > 0)
        printf("#   2 transfers out of host0    %9.1f Mbit/s each (%.2f of one transfer; "
               "expect 0.5)\n",
               c->shared_mbit, c->shared_mbit / c->one_mbit);
    if (c->ring_mbit > 0)
        printf("#   ring over %2d hosts          %9.1f Mbit/s each (%.2f of one transfer; "
               "expect 1.0: full duplex)\n",
               W.nhosts, c->ring_mbit, c->ring_mbit / c->one_mbit);
    if (c->intra_mbit > 0)
        printf("#   intra-host dev0->dev1       %9.1f Mbit/s (%.1fx one NIC transfer)\n",
               c->intra_mbit, c->one_mbit > 0 ? c->intra_mbit / c->one_mbit : 0);
}

int main(int argc, char **argv)
{
    /* xmesh's MPI executor runs a progress thread: it needs
     * MPI_THREAD_MULTIPLE (the baselines then run at the same level). */
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    O.suite = "n-to-m";
    O.minbytes = O.maxbytes = -1;
    O.stepfactor = 2;
    O.iters = 5;
    O.warmup = 1;
    O.check = 1;
    O.poll_us = 100;
    O.calib_bytes = 8 << 20;
    O.plans = 3;
    static const struct option longopts[] = {{"barrier", no_argument, NULL, 'B'},
                                             {"spin-barrier", no_argument, NULL, 'S'},
                                             {"help", no_argument, NULL, 'h'},
                                             {"cluster", required_argument, NULL, 'K'},
                                             {"transport", required_argument, NULL, 'T'},
                                             {NULL, 0, NULL, 0}};
    int opt, bad = 0, help = 0;
    char badmsg[128] = "";
    while ((opt = getopt_long(argc, argv, "s:m:C:b:e:f:n:w:c:J:D:V:P:k:p:K:T:BRh", longopts,
                              NULL)) != -1) {
        switch (opt) {
        case 'B':
            O.barrier = 1;
            break;
        case 'S':
            O.barrier = 2;
            break;
        case 'T':
            O.transport = optarg;
            break;
        case 'K':
            /* the library reads it when it builds a plan's cluster model */
            setenv("XMESH_CLUSTER_FILE", optarg, 1);
            break;
        case 'p':
            O.plans = atoi(optarg);
            if (O.plans < 1 || O.plans > 64) {
                snprintf(badmsg, sizeof badmsg, ": -p '%s': plans per row must be 1..64", optarg);
                bad = 1;
            }
            break;
        case 's':
            O.suite = optarg;
            break;
        case 'm':
            O.methods = optarg;
            break;
        case 'C':
            O.cases = optarg;
            break;
        case 'b':
            bad |= (O.minbytes = parse_bytes(optarg)) < 0;
            break;
        case 'e':
            bad |= (O.maxbytes = parse_bytes(optarg)) < 0;
            break;
        case 'f':
            bad |= (O.stepfactor = atoll(optarg)) < 2;
            break;
        case 'n':
            bad |= (O.iters = atoi(optarg)) < 0;
            break;
        case 'w':
            bad |= (O.warmup = atoi(optarg)) < 0;
            break;
        case 'c':
            O.check = atoi(optarg) != 0;
            break;
        case 'J':
            O.json = optarg;
            break;
        case 'D':
            O.datprefix = optarg;
            break;
        case 'V':
            bad |= (O.virtual_hosts = atoi(optarg)) < 1;
            break;
        case 'R':
            O.real_hosts = 1;
            break;
        case 'P':
            bad |= (O.poll_us = atoi(optarg)) < 0;
            break;
        case 'k':
            bad |= (O.calib_bytes = parse_bytes(optarg)) < 0;
            break;
        case 'h':
            help = 1;
            break;
        default:
            bad = 1;
        }
    }
    if (!O.transport)
        O.transport = xm_param_str("XMESH_TRANSPORT");
    if (strcmp(O.transport, "mpi") && strcmp(O.transport, "ucx")) {
        snprintf(badmsg, sizeof badmsg, ": transport '%.40s' is not mpi or ucx", O.transport);
        bad = 1;
    }
    if (O.real_hosts && O.virtual_hosts < 1) {
        snprintf(badmsg, sizeof badmsg, ": -R needs -V n (it only changes what -V does)");
        bad = 1;
    }
    const suite_t *suite = NULL;
    for (size_t i = 0; i < sizeof suites / sizeof suites[0]; i++)
        if (!strcmp(suites[i].name, O.suite))
            suite = &suites[i];
    /* weights (weights.c): whole models, its own cases and methods */
    static const suite_t weights_suite = {"weights", NULL, 0, "", 0};
    int weights = !strcmp(O.suite, "weights");
    if (weights) {
        suite = &weights_suite;
        if (O.minbytes < 0)
            O.minbytes = 0;
    }
    int rank0 = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank0);
    if (help || bad || !suite || optind < argc) {
        if (rank0 == 0) {
            if (!help)
                fprintf(stderr, "xmesh-bench: bad arguments%s%s%s\n", badmsg,
                        suite ? "" : ": unknown suite ", suite ? "" : O.suite);
            usage();
        }
        MPI_Finalize();
        return help ? 0 : 2;
    }
    if (O.methods && !weights) {
        for (const char *p = O.methods; *p;) {
            const char *q = strchr(p, ',');
            size_t len = q ? (size_t)(q - p) : strlen(p);
            int found = 0;
            for (int i = 0; i < NMETHODS; i++)
                found |= strlen(methods[i].name) == len && !strncmp(methods[i].name, p, len);
            if (!found) {
                if (rank0 == 0)
                    fprintf(stderr, "xmesh-bench: unknown method '%.*s' (-h lists them)\n",
                            (int)len, p);
                MPI_Finalize();
                return 2;
            }
            if (!q)
                break;
            p = q + 1;
        }
    }
    for (int i = 0; i < suite->ncases; i++)
        if ((int)strlen(suite->cases[i].name) > casew)
            casew = (int)strlen(suite->cases[i].name);
    if (O.minbytes < 0)
        O.minbytes = suite->bytes;
    if (O.maxbytes < 0)
        O.maxbytes = O.minbytes;
    if (world_init()) {
        fprintf(stderr, "xmesh-bench: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }

    bench_calib_t cal;
    memset(&cal, 0, sizeof cal);
    cal.one_mbit = cal.shared_mbit = cal.ring_mbit = cal.intra_mbit = -1;
    if (O.calib_bytes > 0)
        bench_calibrate(&W, O.calib_bytes, &cal);
    /* The model's intra-host rate: the measured one unless the user set it
     * (same value on every rank: the measurement is reduced). */
    if (!getenv("XMESH_INTRA_GBPS") && cal.intra_mbit > 0) {
        char v[32];
        snprintf(v, sizeof v, "%.3f", cal.intra_mbit / 1000);
        setenv("XMESH_INTRA_GBPS", v, 1);
    }

    {
        xmesh_ctx_params_t cp = XMESH_CTX_PARAMS_INITIALIZER;
        if (O.virtual_hosts > 0 && !O.real_hosts)
            cp.host_id = W.rank / O.virtual_hosts;
        xmesh_result_t r;
        if (!strcmp(O.transport, "ucx")) {
            /* An MPI communicator is one caller's all-gather among others. */
            static MPI_Comm world;
            world = MPI_COMM_WORLD;
            xmesh_oob_t oob = {W.rank, W.size, mpi_allgather, &world};
            r = xmesh_ctx_create_ucx(&oob, &cp, &X.ctx);
        } else {
            r = xmesh_ctx_create_mpi(MPI_COMM_WORLD, &cp, &X.ctx);
        }
        X.available = r == XMESH_SUCCESS;
        if (r)
            snprintf(X.why, sizeof X.why, "xmesh_ctx_create_%s: %s: %s", O.transport,
                     xmesh_result_string(r), xmesh_last_error());
    }

    if (weights) {
        int wrc = 2;
        if (X.available) {
            if (W.rank == 0) {
                printf("# xmesh-bench  suite weights  xmesh %s\n", xmesh_version_string());
                print_calib(&cal);
            }
            bench_weights_opts_t wo = {O.iters, O.warmup, O.check, O.json, O.cases, O.methods};
            wrc = bench_weights(&W, X.ctx, &wo);
            xmesh_ctx_destroy(X.ctx);
        } else if (W.rank == 0) {
            fprintf(stderr, "xmesh-bench: %s\n", X.why);
        }
        MPI_Finalize();
        return wrc;
    }
    if (W.rank == 0) {
        printf("# xmesh-bench  suite %s  xmesh %s  transport %s\n", suite->name,
               xmesh_version_string(), O.transport);
        if (!X.available)
            printf("# xmesh rows unsupported: %s\n", X.why);
        printf("# ranks %d  hosts %d%s  iters %d  warm-up %d  check %s\n", W.size, W.nhosts,
               W.virtual_hosts > 0 ? " (virtual: one machine, no NIC limit)" : "", O.iters,
               O.warmup, O.check ? "on" : "off");
        print_calib(&cal);
        const char *g = getenv("XMESH_NIC_GBPS"), *in = getenv("XMESH_INTRA_GBPS");
        printf("# model: NIC %s Gbit/s per direction, intra-host %s Gbit/s\n", g ? g : "(default)",
               in ? in : "(default)");
        xm_cluster_t cl;
        const char *cf = getenv("XMESH_CLUSTER_FILE");
        if (cf && *cf && !model_cluster(&cl)) {
            printf("# cluster file %s: NIC %.4g Gbit/s, intra-host %.4g Gbit/s, latency %.4g us "
                   "(overrides the above)\n",
                   cf, cl.nic_send_Bps * 8 / 1e9, cl.intra_Bps * 8 / 1e9, cl.latency_s * 1e6);
            xm_cluster_free(&cl);
        } else if (cf && *cf) {
            printf("# cluster file %s: %s\n", cf, xmesh_last_error());
        }
        if (O.barrier)
            printf("# time: seconds from a common barrier to the end of a closing %s on "
                   "all ranks, INCLUDED\n#   (application-style %s; median, min, max over "
                   "iterations)\n",
                   O.barrier == 2 ? "spinning barrier" : "MPI_Barrier",
                   O.barrier == 2 ? "--spin-barrier" : "-B");
        else
            printf("# time: seconds from a common barrier to the last rank done (median, min, max "
                   "over iterations)\n");
        printf("# algbw: tensor bytes / median time, MB/s (1e6); t/LB: "
               "median / model lower bound; pred: the method's modelled time (xm_cost.h), "
               "pred/t\n#   its ratio\n"
               "# plan: seconds to create the xmesh plan (meshes + xmesh_plan_create, median of "
               "%d)\n#   or a baseline's setup (communicators, BLACS grids; once), max over "
               "ranks\n",
               O.plans);
        const char *ml = O.methods ? O.methods : suite->methods;
        if (in_list(ml, "scalapack-pdgemr2d") && !bench_scalapack_built())
            printf("# scalapack-pdgemr2d: not built (ScaLAPACK not found at configure time, or "
                   "XMESH_BENCH_SCALAPACK=OFF; Debian: libscalapack-openmpi-dev)\n");
        printf("#\n%*s %-22s %11s %8s %8s %8s %8s %7s %8s %7s %8s %7s\n", casew, "case", "method",
               "bytes", "med(s)", "min(s)", "max(s)", "algbw", "t/LB", "pred(s)", "pred/t",
               "plan(s)", "#wrong");
        fflush(stdout);
    }
    for (int64_t bytes = O.minbytes; bytes <= O.maxbytes; bytes *= O.stepfactor) {
        cur_req_bytes = bytes;
        for (int i = 0; i < suite->ncases; i++)
            if (in_list(O.cases, suite->cases[i].name))
                run_case(suite, &suite->cases[i], bytes);
        if (bytes == 0)
            break;
    }
    long long wrong = 0;
    int errors = 0;
    for (int i = 0; i < nrows; i++) {
        wrong += rows[i].wrong;
        errors += !strcmp(rows[i].status, "error") || !strcmp(rows[i].status, "setup-failed");
    }
    if (W.rank == 0) {
        printf("# wrong elements: %lld %s; failed rows: %d\n", wrong, wrong ? "WRONG" : "OK",
               errors);
        if (O.json)
            write_json(O.json, &cal);
        if (O.datprefix)
            write_dat(O.datprefix, suite->name);
    }
    if (X.available && X.ctx)
        xmesh_ctx_destroy(X.ctx);
    bench_scalapack_finalize();
    for (int i = 0; i < nrows; i++)
        free(rows[i].times);
    MPI_Finalize();
    return wrong || errors ? 1 : 0;
}
