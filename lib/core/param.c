/* Every XMESH_* environment parameter, declared once (like NCCL_PARAM):
 * name, default and help in the table below; type and range in `types`;
 * typed accessors parse once, cache, and log when set (XMESH_DEBUG=INFO). */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xm_core.h"

static const xm_param_desc_t params[] = {
    {"XMESH_DEBUG", "", "log level: WARN, INFO or TRACE (errors are always recorded)"},
    {"XMESH_STRATEGY", "broadcast", "broadcast | sendrecv | sendrecv-allgather | global-allgather"},
    {"XMESH_SCHEDULER", "ensemble", "naive | lb | dfs | greedy | ensemble"},
    {"XMESH_CHUNK_BYTES", "0",
     "pipelining chunk of broadcast chains, bytes; 0 = auto: 65408 (synchronous chunks just below "
     "Open MPI's 64 KiB TCP eager limit) for the MPI executor with XMESH_SYNC_SEND=1, else 262144"},
    {"XMESH_SEND_AHEAD", "0",
     "MPI executor: chunk sends in flight per chain link (receives run a window ahead); 0 = auto: "
     "4 with XMESH_SYNC_SEND=1, else 2"},
    {"XMESH_FORWARD_AHEAD", "0",
     "MPI executor: the same on a link between hosts fed by a link between hosts (a chain's "
     "forwarders, paced by their input); 0 = auto: 4 with XMESH_SYNC_SEND=1, else 1"},
    {"XMESH_SYNC_SEND", "1",
     "MPI executor: 1 = chunk sends between hosts are synchronous (MPI_Issend): a chunk below the "
     "transport's eager limit leaves at once, whole and in order, and completes when the receiver "
     "has matched it, so sends in flight bound what waits at the receiver; 0 = MPI_Isend "
     "(rendezvous above the eager limit)"},
    {"XMESH_BUDGET_US", "20000", "scheduler time budget, microseconds"},
    {"XMESH_SEED", "1", "scheduler random seed"},
    {"XMESH_SPLIT", "1",
     "plan creation: 1 = cut the tasks of small instances into pieces (xm_taskset_split) when "
     "that lowers the model makespan by > 1 %; 0 = never"},
    {"XMESH_PACK_BYTES", "64M",
     "plans of many tensors: most bytes of one packed task (unit tasks of at most one chunk with "
     "the same holders and receivers, sharing chunks); 0 = no packing"},
    {"XMESH_CKPT_PLAN_BYTES", "1G",
     "checkpoint load (pipeline/ckpt): most tensor bytes one plan of many tensors moves (the "
     "saved blocks it reads are held in memory until it ends); 0 = one plan per tensor"},
    {"XMESH_PIPE_BUNDLE", "1",
     "pipeline driver: 1 = the tensors that cross one stage boundary in the same slot of the "
     "schedule (the U-Transformer's skips) move as one plan of many; 0 = one plan per edge and "
     "direction"},
    {"XMESH_TIMEOUT_S", "300", "timeout of blocking operations, seconds (0: none)"},
    {"XMESH_HOST_ID", "",
     "override this rank's host id (tests): an integer, or rank/N (N ranks per host); default: "
     "shared-memory split"},
    {"XMESH_NIC_GBPS", "10", "model: NIC bandwidth per direction, Gbit/s"},
    {"XMESH_NICS_PER_HOST", "1", "model: NICs per host"},
    {"XMESH_INTRA_GBPS", "800", "model: intra-host device-to-device bandwidth, Gbit/s"},
    {"XMESH_LATENCY_US", "5", "model: per-message latency, microseconds"},
    {"XMESH_CLUSTER_FILE", "",
     "model: cluster file (key = value lines) applied over the XMESH_* model values"},
    {"XMESH_TRACE", "", "write a Chrome trace-event JSON of each reshard to this path"},
    {"XMESH_CHECK", "0", "1: verify a checksum of every received box"},
    {"XMESH_TEST_CORRUPT", "",
     "tests only: with XMESH_CHECK=1, this rank flips a byte of the first chunk it receives"},
    {"XMESH_TOPO_XML", "", "hwloc XML file to use instead of this machine's topology"},
    {"XMESH_NCCL_MAX_COMMS", "8",
     "NCCL backend: most cached communicators per context (one per mesh pair)"},
    {"XMESH_ZERO_COPY", "0",
     "MPI executor: 1 = MPI reads/writes contiguous chunks in the caller's blocks directly (no "
     "staging copy); then after a failed reshard MPI may still touch the blocks"},
    {"XMESH_HOLD_LATE", "1",
     "MPI executor: 1 = a chain link to a rank on another host that starts the task only after "
     "an earlier one sends one synchronous chunk and the rest once that chunk is matched (sent "
     "ahead, they would share a NIC the schedule gave to the earlier task); 0 = send ahead at "
     "once"},
    {"XMESH_WAIT_NICE", "-10",
     "MPI executor: nice value a thread asks for while it drives a blocking xmesh_wait/"
     "xmesh_reshard (restored after; only ever raises its priority, needs CAP_SYS_NICE below "
     "the current value): forwarding ranks keep their cores against spinning or computing "
     "neighbours; 19 = never change"},
    {"XMESH_WAIT_BACKOFF_US", "200",
     "MPI executor: longest sleep, microseconds, of a thread driving a blocking xmesh_wait/"
     "xmesh_reshard between progress rounds that moved nothing (the sleeps double from 1 us "
     "after 16 yields): a forwarding rank notices a chunk at most this late"},
    {"XMESH_TRANSPORT", "mpi",
     "transport of programs that choose one at run time (xmesh-bench, tests): mpi | ucx"},
    {"XMESH_RANK", "",
     "bootstrap without MPI (xmesh_ctx_create_ucx): this process's rank; else torchrun's RANK, "
     "else Slurm's SLURM_PROCID"},
    {"XMESH_SIZE", "",
     "bootstrap without MPI: the number of ranks; else torchrun's WORLD_SIZE, else Slurm's "
     "SLURM_NTASKS"},
    {"XMESH_BOOTSTRAP", "",
     "bootstrap without MPI: host:port where rank 0 listens for the others; default MASTER_ADDR "
     "and MASTER_PORT + 1 (torchrun), else the first Slurm node"},
    {"XMESH_HOST", "",
     "bootstrap without MPI: this process's host name (ranks with equal names share a host); "
     "default: gethostname"},
    {"XMESH_UCX_NICS", "",
     "UCX runner: comma-separated network devices of every host (eth0,eth1 or mlx5_0:1,...); "
     "rank i of a host uses device i mod count, the NIC the plan's model gives it; empty: UCX's "
     "own choice"},
    {"XMESH_PROGRESS_THREAD", "1",
     "UCX runner: 1 = a progress thread moves transfers while the caller computes; 0 = they "
     "move only inside xmesh_reshard_start / xmesh_test / xmesh_wait"},
    {"XMESH_PROGRESS_NICE", "-10",
     "MPI executor: nice value the progress thread asks for (-20..19); below 0 needs "
     "CAP_SYS_NICE, else the thread keeps the process's value (logged at INFO)"},
    /* The training stack's (pipeline/), read through xmesh_param_get (include/xmesh.h). */
    {"XMP_OVERLAP", "none",
     "xmesh-train: overlap inside a stage, none, all or a comma list of bwd-input, defer-grad, "
     "prefetch, coll-matmul (pipeline/nn/overlap.h); an unknown name is an error"},
    {"XMESH_KEEP_FREED", "1",
     "xmesh-train: 1 = glibc keeps freed memory (mmap threshold raised, heap never trimmed) so a "
     "step does not fault its buffers in again; 0 = glibc's defaults; another value warns and "
     "uses 1; a GLIBC_TUNABLES naming glibc.malloc wins"},
    {"XMESH_CKPT_CRASH", "",
     "tests only: a checkpoint save stops as a crash would after the shards of ranks < N are "
     "written (N), or every rank _exit(86)s there (N:exit)"},
};

/* ------------------------------------------------------------------ types */

/* How each typed parameter is parsed and its valid range. A row of the table
 * above with no entry here is a string. Integers are decimal; byte sizes are
 * decimal with an optional binary suffix K, M or G (256K = 262144); reals are
 * strtod numbers. A value that does not parse or is out of range is refused:
 * one warning on stderr naming the variable, the value and the default that
 * is used instead (never an error, never a silently truncated number). */
typedef enum { KIND_STR = 0, KIND_INT, KIND_BYTES, KIND_REAL } kind_t;

typedef struct {
    const char *name;
    kind_t kind;
    int64_t imin, imax; /* KIND_INT, KIND_BYTES: inclusive range */
    double rmin;        /* KIND_REAL: lower bound ... */
    int rmin_open;      /* ... exclusive when set */
} ptype_t;

static const ptype_t types[] = {
    {"XMESH_CHUNK_BYTES", KIND_BYTES, 0, INT64_MAX, 0, 0},
    {"XMESH_SEND_AHEAD", KIND_INT, 0, 1 << 20, 0, 0},
    {"XMESH_FORWARD_AHEAD", KIND_INT, 0, 1 << 20, 0, 0},
    {"XMESH_BUDGET_US", KIND_INT, 0, INT64_MAX, 0, 0},
    {"XMESH_SEED", KIND_INT, INT64_MIN, INT64_MAX, 0, 0},
    {"XMESH_SPLIT", KIND_INT, 0, 1, 0, 0},
    {"XMESH_PACK_BYTES", KIND_BYTES, 0, INT64_MAX, 0, 0},
    {"XMESH_CKPT_PLAN_BYTES", KIND_BYTES, 0, INT64_MAX, 0, 0},
    {"XMESH_PIPE_BUNDLE", KIND_INT, 0, 1, 0, 0},
    {"XMESH_TIMEOUT_S", KIND_REAL, 0, 0, 0, 0},
    {"XMESH_NIC_GBPS", KIND_REAL, 0, 0, 0, 1},
    {"XMESH_NICS_PER_HOST", KIND_INT, 1, 1 << 16, 0, 0},
    {"XMESH_INTRA_GBPS", KIND_REAL, 0, 0, 0, 1},
    {"XMESH_LATENCY_US", KIND_REAL, 0, 0, 0, 0},
    {"XMESH_CHECK", KIND_INT, 0, 1, 0, 0},
    {"XMESH_NCCL_MAX_COMMS", KIND_INT, 1, 1 << 16, 0, 0},
    {"XMESH_PROGRESS_NICE", KIND_INT, -20, 19, 0, 0},
    {"XMESH_WAIT_NICE", KIND_INT, -20, 19, 0, 0},
    {"XMESH_WAIT_BACKOFF_US", KIND_INT, 1, 1000000, 0, 0},
    {"XMESH_SYNC_SEND", KIND_INT, 0, 1, 0, 0},
    {"XMESH_HOLD_LATE", KIND_INT, 0, 1, 0, 0},
    {"XMESH_PROGRESS_THREAD", KIND_INT, 0, 1, 0, 0},
};

/* Names in the XMESH_ namespace that belong to scripts and tests, not to
 * the library: never reported as misspelt. XMESH_PY: the Python package's
 * scripts and tests (XMESH_PY_PYTHON, XMESH_PY_SEED, XMESH_PY_LIBRARY). */
static const char *const foreign_prefixes[] = {"XMESH_TEST_", "XMESH_BENCH", "XMESH_GPU_",
                                               "XMESH_REL_",  "XMESH_FUZZ",  "XMESH_PIPE",
                                               "XMESH_TRAIN", "XMESH_PY"};
static const char *const foreign_names[] = {"XMESH_QUICK",   "XMESH_JOBS",      "XMESH_PLAN_ONLY",
                                            "XMESH_MPIEXEC", "XMESH_FAULT_DST", "XMESH_NO_PYTHON"};

#define NPARAMS (sizeof params / sizeof params[0])

/* Parsed state of one parameter (cached). */
typedef struct {
    int loaded;
    char *raw; /* the environment string it was parsed from, NULL if unset */
    const char *str;
    int64_t i;
    double r;
    int from_env; /* the value came from the environment */
} slot_t;

/* typed[]: the cached accessors' values, loaded once and then never changed
 * (xm_param_reset aside), so a string they return stays valid. byname[]:
 * the by-name lookups, reloaded when the environment string changes; they
 * only hand out copies of numbers. */
static slot_t typed[NPARAMS], byname[NPARAMS];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t env_once = PTHREAD_ONCE_INIT;

int xm_param_count(void)
{
    return (int)NPARAMS;
}

const xm_param_desc_t *xm_param_get(int i)
{
    return i >= 0 && i < xm_param_count() ? &params[i] : NULL;
}

int xm_param_find(const char *name)
{
    for (int i = 0; name && i < xm_param_count(); i++)
        if (!strcmp(params[i].name, name))
            return i;
    return -1;
}

static const ptype_t *type_of(const char *name)
{
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (!strcmp(types[i].name, name))
            return &types[i];
    return NULL;
}

xmesh_result_t xm_param_parse_int(const char *s, int bytes, int64_t *out)
{
    if (!s || !*s)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "'' is empty");
    const char *p = s;
    while (*p == ' ' || *p == '\t')
        p++;
    if (!((*p >= '0' && *p <= '9') || ((*p == '-' || *p == '+') && p[1] >= '0' && p[1] <= '9')))
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "'%s' is not a decimal number", s);
    char *end;
    errno = 0;
    long long v = strtoll(p, &end, 10);
    if (errno == ERANGE)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "'%s' does not fit in 64 bits", s);
    int64_t mul = 1;
    if (bytes && *end) {
        switch (*end) {
        case 'k':
        case 'K':
            mul = (int64_t)1 << 10;
            break;
        case 'm':
        case 'M':
            mul = (int64_t)1 << 20;
            break;
        case 'g':
        case 'G':
            mul = (int64_t)1 << 30;
            break;
        default:
            mul = 0;
        }
        if (mul) {
            end++;
            if (*end == 'i' && end[1] == 'B')
                end += 2; /* KiB, MiB, GiB */
        }
    }
    if (*end || !mul)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "'%s' is not a %s", s,
                      bytes ? "byte size (digits, optional suffix K, M or G = 2^10, 2^20, 2^30)"
                            : "decimal integer");
    int64_t r;
    if (__builtin_mul_overflow((int64_t)v, mul, &r))
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "'%s' does not fit in 64 bits", s);
    *out = r;
    return XMESH_SUCCESS;
}

/* Parses s as the kind of t and checks the range; on error the message (in
 * xmesh_last_error) names the problem, the value is not written. */
static xmesh_result_t parse_typed(const ptype_t *t, const char *s, int64_t *i, double *r)
{
    xmesh_result_t rc;
    if (t->kind == KIND_INT || t->kind == KIND_BYTES) {
        int64_t v;
        if ((rc = xm_param_parse_int(s, t->kind == KIND_BYTES, &v)))
            return rc;
        if (v < t->imin || v > t->imax)
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%lld is out of range [%lld, %lld]",
                          (long long)v, (long long)t->imin, (long long)t->imax);
        *i = v;
        *r = (double)v;
        return XMESH_SUCCESS;
    }
    char *end;
    errno = 0;
    double v = s && *s ? strtod(s, &end) : 0;
    if (!s || !*s || *end || errno == ERANGE || !isfinite(v))
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "'%s' is not a finite number", s ? s : "");
    if (t->rmin_open ? !(v > t->rmin) : !(v >= t->rmin))
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%g must be %s %g", v,
                      t->rmin_open ? ">" : ">=", t->rmin);
    *r = v;
    *i = (int64_t)v;
    return XMESH_SUCCESS;
}

/* Edit distance, for "did you mean". Names are short. */
static int distance(const char *a, const char *b)
{
    int la = (int)strlen(a), lb = (int)strlen(b);
    if (la > 63 || lb > 63)
        return 99;
    int row[64];
    for (int j = 0; j <= lb; j++)
        row[j] = j;
    for (int i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = i;
        for (int j = 1; j <= lb; j++) {
            int up = row[j];
            int best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

int xm_param_is_foreign(const char *name)
{
    for (size_t i = 0; i < sizeof foreign_prefixes / sizeof foreign_prefixes[0]; i++)
        if (!strncmp(name, foreign_prefixes[i], strlen(foreign_prefixes[i])))
            return 1;
    for (size_t i = 0; i < sizeof foreign_names / sizeof foreign_names[0]; i++)
        if (!strcmp(name, foreign_names[i]))
            return 1;
    return 0;
}

int xm_param_check_env(FILE *f)
{
    extern char **environ;
    int unknown = 0;
    for (char **e = environ; e && *e; e++) {
        if (strncmp(*e, "XMESH_", 6))
            continue;
        char name[128];
        size_t n = strcspn(*e, "=");
        if (n >= sizeof name)
            n = sizeof name - 1;
        memcpy(name, *e, n);
        name[n] = '\0';
        if (xm_param_find(name) >= 0 || xm_param_is_foreign(name))
            continue;
        int best = -1, bd = 99;
        for (int i = 0; i < xm_param_count(); i++) {
            int d = distance(name, params[i].name);
            if (d < bd) {
                bd = d;
                best = i;
            }
        }
        if (f)
            fprintf(f,
                    "xmesh WARN %s is set but is not an xmesh parameter (ignored)%s%s%s; "
                    "`xmesh-info` lists them\n",
                    name, best >= 0 && bd <= 3 ? ": did you mean " : "",
                    best >= 0 && bd <= 3 ? params[best].name : "", best >= 0 && bd <= 3 ? "?" : "");
        unknown++;
    }
    return unknown;
}

static void check_env_once(void)
{
    xm_param_check_env(stderr);
}

/* Fills slot idx from value s (NULL: unset). Returns the warning to print
 * after unlocking in warn (empty: none). */
static void load_slot(slot_t *sl, int idx, const char *s, char *warn, size_t wlen)
{
    const xm_param_desc_t *d = &params[idx];
    const ptype_t *t = type_of(d->name);
    free(sl->raw);
    sl->raw = s ? strdup(s) : NULL;
    sl->loaded = 1;
    sl->from_env = 0;
    sl->str = d->deflt;
    sl->i = 0;
    sl->r = 0;
    warn[0] = '\0';
    if (!t) {
        if (sl->raw && *sl->raw) {
            sl->str = sl->raw;
            sl->from_env = 1;
        }
        return;
    }
    /* The default is trusted (a unit test parses every one). */
    if (*d->deflt)
        (void)parse_typed(t, d->deflt, &sl->i, &sl->r);
    if (!s || !*s)
        return;
    char saved[1024];
    snprintf(saved, sizeof saved, "%s", xmesh_last_error());
    int64_t i;
    double r;
    if (parse_typed(t, s, &i, &r)) {
        snprintf(warn, wlen, "xmesh WARN %s=%s refused: %s; using the default %s", d->name, s,
                 xmesh_last_error(), *d->deflt ? d->deflt : "(none)");
    } else {
        sl->i = i;
        sl->r = r;
        sl->str = sl->raw;
        sl->from_env = 1;
    }
    /* Parsing must not disturb the caller's last error. */
    snprintf(xm_error_buffer(), 1024, "%s", saved);
}

/* Typed (refresh = 0: loaded once) or by-name (refresh = 1: reloaded when
 * the environment string changed) value of row idx, copied into *out under
 * the lock. */
static void resolve(int idx, int refresh, slot_t *out)
{
    char warn[1200];
    int logset = 0;
    pthread_once(&env_once, check_env_once);
    pthread_mutex_lock(&mu);
    slot_t *sl = refresh ? &byname[idx] : &typed[idx];
    const char *s = getenv(params[idx].name);
    int changed =
        !sl->loaded || (refresh && ((s == NULL) != (sl->raw == NULL) || (s && strcmp(s, sl->raw))));
    warn[0] = '\0';
    if (changed) {
        load_slot(sl, idx, s, warn, sizeof warn);
        logset = sl->from_env;
    }
    *out = *sl;
    if (refresh)
        out->raw = NULL, out->str = NULL; /* may change under a later call */
    pthread_mutex_unlock(&mu);
    if (*warn)
        fprintf(stderr, "%s\n", warn);
    if (logset)
        XM_INFO("%s set by environment to %s", params[idx].name, s);
}

static int must_find(const char *name)
{
    int idx = xm_param_find(name);
    if (idx < 0) { /* a programming error: the accessor names an undeclared row */
        fprintf(stderr, "xmesh: internal error: parameter %s is not declared in param.c\n", name);
        abort();
    }
    return idx;
}

/* Typed accessors, each bound to a declared row (see xm_core.h). */
#define XM_PARAM_DEFINE(fn, ctype, field, env)                                                     \
    ctype xm_param_##fn(void)                                                                      \
    {                                                                                              \
        slot_t v;                                                                                  \
        resolve(must_find(env), 0, &v);                                                            \
        return (ctype)v.field;                                                                     \
    }
XM_PARAM_DEFINE(strategy, const char *, str, "XMESH_STRATEGY")
XM_PARAM_DEFINE(scheduler, const char *, str, "XMESH_SCHEDULER")
static int64_t xm_param_chunk_bytes_raw(void);
static int64_t xm_param_send_ahead_raw(void);
static int64_t xm_param_forward_ahead_raw(void);
XM_PARAM_DEFINE(chunk_bytes_raw, int64_t, i, "XMESH_CHUNK_BYTES")
XM_PARAM_DEFINE(send_ahead_raw, int64_t, i, "XMESH_SEND_AHEAD")
XM_PARAM_DEFINE(forward_ahead_raw, int64_t, i, "XMESH_FORWARD_AHEAD")
XM_PARAM_DEFINE(sync_send, int64_t, i, "XMESH_SYNC_SEND")

/* The chain pipeline's settings, 0 = auto resolved by XMESH_SYNC_SEND (see the
 * table): measured on the emulated cluster (docs/EXECUTOR.md), synchronous
 * chunks of 65408 bytes with 4 in flight per link cut a chain's fill to one
 * small chunk per hop; rendezvous chunks want 256 KiB to cover their
 * handshake, 2 in flight at a head and 1 on forwarders. */
int64_t xm_param_chunk_bytes_for(int mpi)
{
    int64_t v = xm_param_chunk_bytes_raw();
    if (v > 0)
        return v;
    return mpi && xm_param_sync_send() ? XM_SYNC_CHUNK_BYTES : 262144;
}
int64_t xm_param_chunk_bytes(void)
{
    return xm_param_chunk_bytes_for(1);
}
int64_t xm_param_send_ahead(void)
{
    int64_t v = xm_param_send_ahead_raw();
    return v > 0 ? v : xm_param_sync_send() ? 4 : 2;
}
int64_t xm_param_forward_ahead(void)
{
    int64_t v = xm_param_forward_ahead_raw();
    return v > 0 ? v : xm_param_sync_send() ? 4 : 1;
}
XM_PARAM_DEFINE(budget_us, int64_t, i, "XMESH_BUDGET_US")
XM_PARAM_DEFINE(seed, int64_t, i, "XMESH_SEED")
XM_PARAM_DEFINE(timeout_s, double, r, "XMESH_TIMEOUT_S")
XM_PARAM_DEFINE(nic_gbps, double, r, "XMESH_NIC_GBPS")
XM_PARAM_DEFINE(nics_per_host, int64_t, i, "XMESH_NICS_PER_HOST")
XM_PARAM_DEFINE(intra_gbps, double, r, "XMESH_INTRA_GBPS")
XM_PARAM_DEFINE(latency_us, double, r, "XMESH_LATENCY_US")
XM_PARAM_DEFINE(cluster_file, const char *, str, "XMESH_CLUSTER_FILE")
XM_PARAM_DEFINE(topo_xml, const char *, str, "XMESH_TOPO_XML")
XM_PARAM_DEFINE(nccl_max_comms, int64_t, i, "XMESH_NCCL_MAX_COMMS")
#undef XM_PARAM_DEFINE

int xm_param_is_set(const char *name)
{
    int idx = xm_param_find(name);
    slot_t v;
    if (idx < 0)
        return 0;
    resolve(idx, 1, &v);
    return v.from_env;
}

/* ------------------------------------------- untyped accessors (by name) */

/* The lookups below re-read the environment at each call (tests change
 * XMESH_CHECK/XMESH_TRACE between plans) but parse and warn only when the
 * string changed. Declared names get their typed validation. */

const char *xm_param_str(const char *name)
{
    int idx = xm_param_find(name);
    if (idx < 0) {
        const char *v = getenv(name);
        return v && *v ? v : "";
    }
    slot_t sl;
    resolve(idx, 1, &sl); /* warnings, logging */
    const char *v = getenv(name);
    return v && *v ? v : params[idx].deflt;
}

int64_t xm_param_i64(const char *name)
{
    int idx = xm_param_find(name);
    if (idx < 0) {
        int64_t v = 0;
        const char *s = getenv(name);
        return s && *s && !xm_param_parse_int(s, 0, &v) ? v : 0;
    }
    slot_t sl;
    resolve(idx, 1, &sl);
    if (type_of(name))
        return sl.i;
    int64_t v = 0; /* a string row read as a number: best effort */
    (void)xm_param_parse_int(xm_param_str(name), 0, &v);
    return v;
}

double xm_param_double(const char *name)
{
    int idx = xm_param_find(name);
    if (idx < 0) {
        const char *s = getenv(name);
        return s && *s ? strtod(s, NULL) : 0;
    }
    slot_t sl;
    resolve(idx, 1, &sl);
    return type_of(name) ? sl.r : strtod(xm_param_str(name), NULL);
}

void xm_param_reset(void)
{
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < NPARAMS; i++) {
        free(typed[i].raw);
        free(byname[i].raw);
        memset(&typed[i], 0, sizeof typed[i]);
        memset(&byname[i], 0, sizeof byname[i]);
    }
    pthread_mutex_unlock(&mu);
}

const char *xm_param_kind_name(const char *name)
{
    const ptype_t *t = type_of(name);
    if (!t)
        return "string";
    return t->kind == KIND_INT ? "integer" : t->kind == KIND_BYTES ? "bytes" : "real";
}

/* ------------------------------------------- public by-name reads (xmesh.h) */

/* The declared row of name, or an INVALID_ARGUMENT naming it (-1). */
static int public_row(const char *fn, const char *name)
{
    if (!name) {
        XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s: name is NULL", fn);
        return -1;
    }
    int idx = xm_param_find(name);
    if (idx < 0)
        XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
               "%s: '%s' is not a declared parameter (`xmesh-info` lists them)", fn, name);
    return idx;
}

xmesh_result_t xmesh_param_get(const char *name, char *value, size_t len, int *from_env)
{
    int idx = public_row("xmesh_param_get", name);
    if (idx < 0)
        return XMESH_ERR_INVALID_ARGUMENT;
    if (!value)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xmesh_param_get(%s): value is NULL", name);
    slot_t sl;
    resolve(idx, 1, &sl); /* parses, warns about a refused value, logs */
    xmesh_result_t r = XMESH_SUCCESS;
    size_t need;
    pthread_mutex_lock(&mu);
    /* byname[idx].str: its own copy of the environment string, or the default */
    const char *v = byname[idx].str ? byname[idx].str : params[idx].deflt;
    need = strlen(v) + 1;
    if (need <= len)
        memcpy(value, v, need);
    pthread_mutex_unlock(&mu);
    if (need > len)
        r = XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                   "xmesh_param_get(%s): the value needs %zu bytes, the buffer has %zu", name, need,
                   len);
    else if (from_env)
        *from_env = sl.from_env;
    return r;
}

/* Integer (ints = 1) or numeric value of a typed row into *i / *r. */
static xmesh_result_t public_number(const char *fn, const char *name, int ints, int64_t *i,
                                    double *r)
{
    int idx = public_row(fn, name);
    if (idx < 0)
        return XMESH_ERR_INVALID_ARGUMENT;
    if (!(ints ? (void *)i : (void *)r))
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s(%s): value is NULL", fn, name);
    const ptype_t *t = type_of(name);
    if (!t || (ints && t->kind == KIND_REAL))
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "%s(%s): a %s parameter (read it with %s)", fn,
                      name, xm_param_kind_name(name),
                      t ? "xmesh_param_get_real" : "xmesh_param_get");
    slot_t sl;
    resolve(idx, 1, &sl);
    if (ints)
        *i = sl.i;
    else
        *r = t->kind == KIND_REAL ? sl.r : (double)sl.i;
    return XMESH_SUCCESS;
}

xmesh_result_t xmesh_param_get_int(const char *name, int64_t *value)
{
    return public_number("xmesh_param_get_int", name, 1, value, NULL);
}

xmesh_result_t xmesh_param_get_real(const char *name, double *value)
{
    return public_number("xmesh_param_get_real", name, 0, NULL, value);
}
