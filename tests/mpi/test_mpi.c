/*
 * MPI tier: correctness matrix of the MPI executor. Run under
 * `mpiexec -n N --oversubscribe test_mpi [--cases K] [--per-host H]`.
 *
 * Every destination element is checked against the value expected at its
 * global index (the value encodes the index), guard bytes around every
 * destination block must stay untouched and source blocks unchanged. Ranks
 * pretend to sit on hosts of H ranks (params.host_id = rank / H).
 * Randomized cases print their seed; XMESH_TEST_SEED replays.
 */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#ifdef XMESH_TEST_UCX /* the same matrix over UCX without MPI (tests/ucx) */
#include "mpi_shim.h"
#else
#include <mpi.h>

#include "xmesh/mpi.h"
#endif
#include "xmesh.h"

#define GUARD 64
#define GUARD_BYTE 0xA5

static int g_rank, g_size, g_pass, g_fail, g_verbose;

static void report(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Collective: a check passes only if it passed on every rank. */
static void report(int ok, const char *fmt, ...)
{
    int all = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (all)
        g_pass++;
    else
        g_fail++;
    if (g_rank == 0 && (!all || g_verbose)) {
        va_list ap;
        va_start(ap, fmt);
        printf("%s: ", all ? "ok" : "FAIL");
        vprintf(fmt, ap);
        printf("\n");
        va_end(ap);
        fflush(stdout);
    }
}

/* --------------------------------------------------------------- values */

static uint64_t rng_state;
static uint64_t rnd(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static int rndi(int n)
{
    return n > 0 ? (int)(rnd() % (uint64_t)n) : 0;
}

static uint16_t f2h(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000, ax = x & 0x7fffffffu;
    if (ax < 0x38800000u) /* tests only use values exact in f16; tiny -> 0 */
        return (uint16_t)sign;
    return (uint16_t)(sign | ((ax >> 13) - (112u << 10)));
}
static float h2f(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0)
        bits = sign; /* never produced by the tests */
    else if (exp == 0x1f)
        bits = sign | 0x7f800000u | (man << 13);
    else
        bits = sign | ((exp + 112) << 23) | (man << 13);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
static uint16_t f2bf(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    return (uint16_t)(x >> 16); /* values are exact in bf16 */
}
static float bf2f(uint16_t h)
{
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static int is_int(xmesh_dtype_t t)
{
    return t == XMESH_U8 || t == XMESH_I8 || t == XMESH_I32 || t == XMESH_I64;
}

/* Expected value at global linear index i: exact in the dtype. */
static double expect_val(xmesh_dtype_t t, int64_t i)
{
    switch (t) {
    case XMESH_U8:
        return (double)(i % 251);
    case XMESH_I8:
        return (double)(i % 251 - 125);
    case XMESH_I32:
        return (double)(i % 1000003 - 500000);
    case XMESH_I64:
        return (double)(i * 7 - 3000);
    case XMESH_F16:
        return (i % 512) * 0.25 - 32;
    case XMESH_BF16:
        return (i % 128) * 0.5 - 16;
    case XMESH_F32:
        return (i % 65536) * 0.5;
    default:
        return i * 0.25;
    }
}

/* Partial value held by partial group g of G: the G parts sum exactly to
 * expect_val (integers wrap modulo the dtype's width). */
static double partial_val(xmesh_dtype_t t, int64_t i, int g, int G)
{
    double v = expect_val(t, i);
    double d = is_int(t) ? 3 : t == XMESH_BF16 ? 0.5 : 0.25;
    return g == 0 ? v - (G - 1) * d : d;
}

static void store(xmesh_dtype_t t, void *p, double v)
{
    switch (t) {
    case XMESH_U8: {
        uint8_t x = (uint8_t)(int64_t)v;
        memcpy(p, &x, 1);
        break;
    }
    case XMESH_I8: {
        uint8_t x = (uint8_t)(int64_t)v;
        memcpy(p, &x, 1);
        break;
    }
    case XMESH_I32: {
        int32_t x = (int32_t)v;
        memcpy(p, &x, 4);
        break;
    }
    case XMESH_I64: {
        int64_t x = (int64_t)v;
        memcpy(p, &x, 8);
        break;
    }
    case XMESH_F16: {
        uint16_t x = f2h((float)v);
        memcpy(p, &x, 2);
        break;
    }
    case XMESH_BF16: {
        uint16_t x = f2bf((float)v);
        memcpy(p, &x, 2);
        break;
    }
    case XMESH_F32: {
        float x = (float)v;
        memcpy(p, &x, 4);
        break;
    }
    default:
        memcpy(p, &v, 8);
        break;
    }
}

static double load(xmesh_dtype_t t, const void *p)
{
    switch (t) {
    case XMESH_U8:
        return *(const uint8_t *)p;
    case XMESH_I8:
        return *(const int8_t *)p;
    case XMESH_I32: {
        int32_t x;
        memcpy(&x, p, 4);
        return x;
    }
    case XMESH_I64: {
        int64_t x;
        memcpy(&x, p, 8);
        return (double)x;
    }
    case XMESH_F16: {
        uint16_t x;
        memcpy(&x, p, 2);
        return h2f(x);
    }
    case XMESH_BF16: {
        uint16_t x;
        memcpy(&x, p, 2);
        return bf2f(x);
    }
    case XMESH_F32: {
        float x;
        memcpy(&x, p, 4);
        return x;
    }
    default: {
        double x;
        memcpy(&x, p, 8);
        return x;
    }
    }
}

static int same(xmesh_dtype_t t, double a, double b)
{
    if (t == XMESH_U8)
        return (uint8_t)(int64_t)a == (uint8_t)(int64_t)b;
    if (t == XMESH_I8)
        return (int8_t)(uint8_t)(int64_t)a == (int8_t)(uint8_t)(int64_t)b;
    if (is_int(t))
        return a == b;
    return fabs(a - b) <= 1e-6 * (fabs(b) > 1 ? fabs(b) : 1);
}

/* ---------------------------------------------------------------- cases */

typedef struct {
    int ndim;
    int64_t shape[8];
    xmesh_dtype_t dtype;
    int sm_ndim, sm_shape[4], sm_ranks[64];
    int dm_ndim, dm_shape[4], dm_ranks[64];
    char sspec[64], dspec[64];
    unsigned pmask; /* P mesh axes of the source (tests fill the partial groups) */
    xmesh_strategy_t strategy;
    xmesh_scheduler_t scheduler;
    int64_t chunk_bytes;
    int ssplit, dsplit; /* xmesh_split_t of each side */
} tcase_t;

typedef struct {
    xmesh_mesh_t sm, dm;
    xmesh_layout_t sl, dl;
    xmesh_plan_t plan;
    void *src, *src_copy;
    unsigned char *dst_raw; /* GUARD + block + GUARD */
    size_t src_bytes, dst_bytes;
    int64_t src_shape[8], src_off[8], dst_shape[8], dst_off[8];
    int hold_src, hold_dst;
    int src_index;
    char ref_why[200]; /* the library's block disagrees with ref_block (empty: agrees) */
} tstate_t;

static xmesh_ctx_t g_ctx;

static void describe(const tcase_t *c, char *buf, size_t len)
{
    int o = snprintf(buf, len, "%s shape=[", xmesh_dtype_name(c->dtype));
    for (int d = 0; d < c->ndim; d++)
        o += snprintf(buf + o, len - o, "%s%lld", d ? "," : "", (long long)c->shape[d]);
    o += snprintf(buf + o, len - o, "] src(");
    for (int a = 0; a < c->sm_ndim; a++)
        o += snprintf(buf + o, len - o, "%s%d", a ? "x" : "", c->sm_shape[a]);
    o += snprintf(buf + o, len - o, ";r%d..) %s -> dst(", c->sm_ranks[0], c->sspec);
    for (int a = 0; a < c->dm_ndim; a++)
        o += snprintf(buf + o, len - o, "%s%d", a ? "x" : "", c->dm_shape[a]);
    snprintf(buf + o, len - o, ";r%d..) %s %s/%s chunk=%lld split=%s->%s", c->dm_ranks[0], c->dspec,
             xmesh_strategy_name(c->strategy), xmesh_scheduler_name(c->scheduler),
             (long long)c->chunk_bytes, c->ssplit ? "torch" : "numpy",
             c->dsplit ? "torch" : "numpy");
}

static int64_t prod(const int64_t *s, int n)
{
    int64_t v = 1;
    for (int d = 0; d < n; d++)
        v *= s[d];
    return v;
}

/* Global linear index of local element k of a block. */
static int64_t global_index(const tcase_t *c, const int64_t *bshape, const int64_t *boff, int64_t k)
{
    int64_t idx[8], g = 0;
    for (int d = c->ndim - 1; d >= 0; d--) {
        idx[d] = k % bshape[d];
        k /= bshape[d];
    }
    for (int d = 0; d < c->ndim; d++)
        g = g * c->shape[d] + boff[d] + idx[d];
    return g;
}

/* ------------------------------------------------ independent block math
 * The test's own answer to "which block does this rank hold", from the spec
 * string, the mesh and numpy.array_split (or torch.chunk, axis by axis, for
 * a torch-split side), sharing no code with the library:
 * the matrix places and checks every element by these offsets, and any
 * disagreement with xmesh_layout_local_shape/offset is a failure. */

/* Mesh axes splitting each tensor dim, major first; returns 0 if the spec is
 * not one this test writes. SBP: one token per mesh axis, "S(d)", "B" or
 * "P"; several axes on one dim: the lower axis is major. GSPMD: one token
 * per tensor dim, "R" or "S" + axis digits (major first), commas optional. */
static int ref_axes(const char *spec, int ndim, int mesh_ndim, int naxes[8], int axes[8][4])
{
    memset(naxes, 0, sizeof(int) * 8);
    int sbp = strchr(spec, '(') || strchr(spec, 'B') || strchr(spec, 'P');
    const char *p = spec;
    if (sbp) {
        for (int a = 0; a < mesh_ndim; a++) {
            if (p[0] == 'S' && p[1] == '(') {
                int d = (int)strtol(p + 2, (char **)&p, 10);
                if (*p++ != ')' || d < 0 || d >= ndim)
                    return 0;
                axes[d][naxes[d]++] = a; /* axes visited in ascending order */
            } else if (*p == 'B' || *p == 'P') {
                p++;
            } else {
                return 0;
            }
            if (*p == ',')
                p++;
        }
        return *p == '\0';
    }
    for (int d = 0; d < ndim; d++) {
        if (*p == 'R') {
            p++;
        } else if (*p == 'S') {
            for (p++; *p >= '0' && *p <= '9'; p++)
                axes[d][naxes[d]++] = *p - '0';
        } else {
            return 0;
        }
        if (*p == ',')
            p++;
    }
    return *p == '\0';
}

/* Offset and extent of rank's block; returns 0 if rank is not in the mesh
 * (or the spec is foreign: then *ok = 0). */
static int ref_block(const tcase_t *c, int src_side, int rank, int64_t *off, int64_t *ext, int *ok)
{
    int mnd = src_side ? c->sm_ndim : c->dm_ndim;
    const int *mshape = src_side ? c->sm_shape : c->dm_shape;
    const int *ranks = src_side ? c->sm_ranks : c->dm_ranks;
    int n = 1, idx = -1, coord[4];
    for (int a = 0; a < mnd; a++)
        n *= mshape[a];
    for (int i = 0; i < n; i++)
        if (ranks[i] == rank)
            idx = i;
    int naxes[8], axes[8][4];
    *ok = ref_axes(src_side ? c->sspec : c->dspec, c->ndim, mnd, naxes, axes);
    if (idx < 0 || !*ok)
        return 0;
    for (int a = mnd - 1, i = idx; a >= 0; a--) {
        coord[a] = i % mshape[a];
        i /= mshape[a];
    }
    int torch = src_side ? c->ssplit : c->dsplit;
    for (int d = 0; d < c->ndim && torch; d++) {
        /* torch.chunk by each axis in turn, major first, of what the
         * previous axis left: pieces of ceil(len / k), the last ones short
         * or empty */
        off[d] = 0;
        ext[d] = c->shape[d];
        for (int q = 0; q < naxes[d]; q++) {
            int64_t k = mshape[axes[d][q]], j = coord[axes[d][q]];
            int64_t piece = (ext[d] + k - 1) / k, start = j * piece;
            if (start > ext[d])
                start = ext[d];
            int64_t stop = start + piece > ext[d] ? ext[d] : start + piece;
            off[d] += start;
            ext[d] = stop - start;
        }
    }
    for (int d = 0; d < c->ndim && !torch; d++) {
        int64_t k = 1, j = 0;
        for (int q = 0; q < naxes[d]; q++) {
            k *= mshape[axes[d][q]];
            j = j * mshape[axes[d][q]] + coord[axes[d][q]];
        }
        /* array_split: the first n % k pieces are one longer */
        int64_t len = c->shape[d], small = len / k, big = len % k;
        off[d] = j * small + (j < big ? j : big);
        ext[d] = small + (j < big ? 1 : 0);
    }
    return 1;
}

/* Replaces the library's offsets/extents in s by ref_block's, noting any
 * disagreement in s->ref_why. */
static void use_ref_blocks(const tcase_t *c, tstate_t *s)
{
    for (int side = 0; side < 2; side++) {
        int64_t off[8] = {0}, ext[8] = {0};
        int ok, holds = ref_block(c, side == 0, g_rank, off, ext, &ok);
        int64_t *loff = side == 0 ? s->src_off : s->dst_off;
        int64_t *lext = side == 0 ? s->src_shape : s->dst_shape;
        int lholds = side == 0 ? s->hold_src : s->hold_dst;
        if (!ok) {
            snprintf(s->ref_why, sizeof s->ref_why, "rank %d: test cannot read spec '%s'", g_rank,
                     side == 0 ? c->sspec : c->dspec);
            continue;
        }
        int same_block = holds == lholds;
        for (int d = 0; holds && same_block && d < c->ndim; d++)
            same_block = off[d] == loff[d] && ext[d] == lext[d];
        if (!same_block && !s->ref_why[0])
            snprintf(s->ref_why, sizeof s->ref_why,
                     "rank %d: library's %s block (holds %d) differs from the test's own "
                     "array_split block (holds %d)",
                     g_rank, side == 0 ? "source" : "destination", lholds, holds);
        for (int d = 0; d < c->ndim; d++) {
            loff[d] = off[d];
            lext[d] = ext[d];
        }
    }
}

static int partial_group_of(const tcase_t *c, int index, int *G)
{
    int coord[4], i = index, g = 0;
    for (int a = c->sm_ndim - 1; a >= 0; a--) {
        coord[a] = i % c->sm_shape[a];
        i /= c->sm_shape[a];
    }
    *G = 1;
    for (int a = 0; a < c->sm_ndim; a++)
        if (c->pmask & (1u << a)) {
            g = g * c->sm_shape[a] + coord[a];
            *G *= c->sm_shape[a];
        }
    return g;
}

/* Collective: meshes, plan, buffers. Returns the plan_create result. */
static xmesh_result_t setup(const tcase_t *c, tstate_t *s)
{
    memset(s, 0, sizeof *s);
    if (xmesh_mesh_create(g_ctx, c->sm_ndim, c->sm_shape, c->sm_ranks, &s->sm) ||
        xmesh_mesh_create(g_ctx, c->dm_ndim, c->dm_shape, c->dm_ranks, &s->dm)) {
        fprintf(stderr, "rank %d: mesh_create: %s\n", g_rank, xmesh_last_error());
        return XMESH_ERR_INTERNAL;
    }
    s->sl = (xmesh_layout_t){c->ndim, c->shape, c->dtype, s->sm, c->sspec, c->ssplit};
    s->dl = (xmesh_layout_t){c->ndim, c->shape, c->dtype, s->dm, c->dspec, c->dsplit};
    xmesh_plan_params_t pp = XMESH_PLAN_PARAMS_INITIALIZER;
    pp.strategy = c->strategy;
    pp.scheduler = c->scheduler;
    pp.chunk_bytes = c->chunk_bytes;
    pp.budget_us = 1000;
    pp.timeout_s = 60;
    xmesh_result_t r = xmesh_plan_create(g_ctx, &s->sl, &s->dl, &pp, &s->plan);
    if (r)
        return r;
    size_t es = xmesh_dtype_size(c->dtype);
    xmesh_layout_local_shape(&s->sl, g_rank, s->src_shape, &s->hold_src);
    xmesh_layout_local_offset(&s->sl, g_rank, s->src_off, &s->hold_src);
    xmesh_layout_local_shape(&s->dl, g_rank, s->dst_shape, &s->hold_dst);
    xmesh_layout_local_offset(&s->dl, g_rank, s->dst_off, &s->hold_dst);
    use_ref_blocks(c, s); /* place and check by the test's own block math */
    s->src_bytes = s->hold_src ? (size_t)prod(s->src_shape, c->ndim) * es : 0;
    s->dst_bytes = s->hold_dst ? (size_t)prod(s->dst_shape, c->ndim) * es : 0;
    s->src_index = -1;
    for (int i = 0;
         i < prod((int64_t[]){c->sm_shape[0], c->sm_shape[1], c->sm_shape[2], c->sm_shape[3]},
                  c->sm_ndim);
         i++)
        if (c->sm_ranks[i] == g_rank)
            s->src_index = i;
    if (s->hold_src) {
        s->src = malloc(s->src_bytes + 1);
        s->src_copy = malloc(s->src_bytes + 1);
        int G, g = partial_group_of(c, s->src_index, &G);
        int64_t n = prod(s->src_shape, c->ndim);
        for (int64_t k = 0; k < n; k++)
            store(c->dtype, (char *)s->src + k * es,
                  partial_val(c->dtype, global_index(c, s->src_shape, s->src_off, k), g, G));
        memcpy(s->src_copy, s->src, s->src_bytes);
    }
    s->dst_raw = malloc(s->dst_bytes + 2 * GUARD);
    return XMESH_SUCCESS;
}

static void fill_dst(tstate_t *s)
{
    memset(s->dst_raw, GUARD_BYTE, s->dst_bytes + 2 * GUARD);
}

static void *dst_ptr(tstate_t *s)
{
    return s->hold_dst ? s->dst_raw + GUARD : NULL;
}

/* Local check of a finished reshard; returns the number of bad elements. */
static int64_t check_dst(const tcase_t *c, tstate_t *s, char *why, size_t len)
{
    size_t es = xmesh_dtype_size(c->dtype);
    int64_t bad = 0;
    for (int i = 0; i < GUARD; i++)
        if (s->dst_raw[i] != GUARD_BYTE || s->dst_raw[GUARD + s->dst_bytes + i] != GUARD_BYTE) {
            if (!bad)
                snprintf(why, len, "rank %d: guard byte %d around dst written", g_rank, i);
            bad++;
        }
    if (s->hold_src && memcmp(s->src, s->src_copy, s->src_bytes)) {
        if (!bad)
            snprintf(why, len, "rank %d: source block modified", g_rank);
        bad++;
    }
    if (s->ref_why[0]) {
        if (!bad)
            snprintf(why, len, "%s", s->ref_why);
        bad++;
    }
    if (!s->hold_dst)
        return bad;
    int64_t n = prod(s->dst_shape, c->ndim);
    for (int64_t k = 0; k < n; k++) {
        int64_t gi = global_index(c, s->dst_shape, s->dst_off, k);
        double want = expect_val(c->dtype, gi), got = load(c->dtype, s->dst_raw + GUARD + k * es);
        if (!same(c->dtype, got, want)) {
            if (!bad)
                snprintf(why, len, "rank %d: dst element %lld (global %lld) = %g, want %g", g_rank,
                         (long long)k, (long long)gi, got, want);
            bad++;
        }
    }
    return bad;
}

static void teardown(tstate_t *s)
{
    if (s->plan && xmesh_plan_destroy(s->plan))
        fprintf(stderr, "rank %d: plan_destroy: %s\n", g_rank, xmesh_last_error());
    xmesh_mesh_destroy(s->sm);
    xmesh_mesh_destroy(s->dm);
    free(s->src);
    free(s->src_copy);
    free(s->dst_raw);
    memset(s, 0, sizeof *s);
}

/* One full case: plan, reshard, check every element. */
static void run_case(const tcase_t *c, const char *tag)
{
    char desc[512], why[256] = "";
    describe(c, desc, sizeof desc);
    tstate_t s;
    xmesh_result_t r = setup(c, &s);
    int ok = r == XMESH_SUCCESS;
    if (!ok)
        snprintf(why, sizeof why, "rank %d: plan_create: %s", g_rank, xmesh_last_error());
    if (ok) {
        fill_dst(&s);
        r = xmesh_reshard(s.plan, s.src, dst_ptr(&s));
        if (r) {
            snprintf(why, sizeof why, "rank %d: reshard: %s: %s", g_rank, xmesh_result_string(r),
                     xmesh_last_error());
            ok = 0;
        } else {
            ok = check_dst(c, &s, why, sizeof why) == 0;
        }
    }
    if (!ok)
        fprintf(stderr, "%s [%s] %s\n", tag, desc, why);
    report(ok, "%s %s", tag, desc);
    teardown(&s);
}

/* ---------------------------------------------------------- generators */

static const char *strategies[] = {"broadcast", "sendrecv", "sendrecv-allgather",
                                   "global-allgather"};

/* Random SBP spec over a mesh of mesh_ndim axes for a tensor of ndim dims. */
static void random_spec(char *buf, int ndim, int mesh_ndim, int allow_p, unsigned *pmask)
{
    int o = 0;
    *pmask = 0;
    for (int a = 0; a < mesh_ndim; a++) {
        int k = rndi(ndim + 2 + (allow_p ? 1 : 0));
        if (k < ndim)
            o += sprintf(buf + o, "%sS(%d)", a ? "," : "", k);
        else if (k < ndim + 2 || !allow_p)
            o += sprintf(buf + o, "%sB", a ? "," : "");
        else {
            o += sprintf(buf + o, "%sP", a ? "," : "");
            *pmask |= 1u << a;
        }
    }
    if (ndim == 0 && !*pmask) {
        /* 0-d tensors: only B/P tokens are meaningful; already so */
    }
}

static void random_mesh(int *ndim, int *shape, int *ranks, int maxdev, const int *pool, int npool)
{
    int n;
    do {
        *ndim = 1 + rndi(3);
        n = 1;
        for (int a = 0; a < *ndim; a++) {
            shape[a] = 1 + rndi(3);
            n *= shape[a];
        }
    } while (n > maxdev || n > npool);
    int *perm = malloc(sizeof(int) * npool);
    memcpy(perm, pool, sizeof(int) * npool);
    /* keep some locality: mostly consecutive ranks, sometimes shuffled */
    if (rndi(3) == 0)
        for (int i = npool - 1; i > 0; i--) {
            int j = rndi(i + 1), t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
    for (int i = 0; i < n; i++)
        ranks[i] = perm[i];
    free(perm);
}

static void random_case(tcase_t *c)
{
    memset(c, 0, sizeof *c);
    c->ndim = rndi(4); /* 0..3 dims */
    for (int d = 0; d < c->ndim; d++)
        c->shape[d] = rndi(6) == 0 ? 1 + rndi(2) : 1 + rndi(9); /* small, uneven, empty shards */
    c->dtype = (xmesh_dtype_t)rndi(XMESH_DTYPE_COUNT_);
    int pool[64], n = g_size > 64 ? 64 : g_size;
    for (int i = 0; i < n; i++)
        pool[i] = i;
    int overlap = rndi(3) == 0 || n < 2;
    if (overlap) {
        random_mesh(&c->sm_ndim, c->sm_shape, c->sm_ranks, n, pool, n);
        random_mesh(&c->dm_ndim, c->dm_shape, c->dm_ranks, n, pool, n);
    } else {
        int half = n / 2 > 0 ? n / 2 : 1;
        random_mesh(&c->sm_ndim, c->sm_shape, c->sm_ranks, half, pool, half);
        random_mesh(&c->dm_ndim, c->dm_shape, c->dm_ranks, n - half, pool + half, n - half);
    }
    random_spec(c->sspec, c->ndim, c->sm_ndim, 1, &c->pmask);
    unsigned dummy;
    random_spec(c->dspec, c->ndim, c->dm_ndim, 0, &dummy);
    c->strategy = (xmesh_strategy_t)rndi(4);
    c->scheduler = (xmesh_scheduler_t)rndi(XMESH_SCHEDULER_COUNT_);
    int k = rndi(4);
    c->chunk_bytes = k == 0 ? 1 + rndi(8) : k == 1 ? 16 + rndi(64) : k == 2 ? 256 : 1 << 20;
    if (rndi(8) == 0) { /* larger boxes: many chunks per step, window wrap-around, staging */
        for (int d = 0; d < c->ndim; d++)
            c->shape[d] = 1 + rndi(40);
        c->chunk_bytes = 64 + rndi(4096);
    }
    c->ssplit = rndi(2) ? XMESH_SPLIT_TORCH : XMESH_SPLIT_NUMPY;
    c->dsplit = rndi(2) ? XMESH_SPLIT_TORCH : XMESH_SPLIT_NUMPY;
}

/* ------------------------------------------------------- special tests */

static void fixed_case(tcase_t *c, const char *shape, xmesh_dtype_t dt, const char *smesh,
                       int sbase, const char *sspec, const char *dmesh, int dbase,
                       const char *dspec)
{
    memset(c, 0, sizeof *c);
    c->ndim = 0;
    for (const char *p = shape; *p;) {
        c->shape[c->ndim++] = strtoll(p, (char **)&p, 10);
        if (*p == ',')
            p++;
    }
    c->dtype = dt;
    int n = 1;
    c->sm_ndim = 0;
    for (const char *p = smesh; *p;) {
        c->sm_shape[c->sm_ndim] = (int)strtol(p, (char **)&p, 10);
        n *= c->sm_shape[c->sm_ndim++];
        if (*p == 'x')
            p++;
    }
    for (int i = 0; i < n; i++)
        c->sm_ranks[i] = sbase + i;
    n = 1;
    c->dm_ndim = 0;
    for (const char *p = dmesh; *p;) {
        c->dm_shape[c->dm_ndim] = (int)strtol(p, (char **)&p, 10);
        n *= c->dm_shape[c->dm_ndim++];
        if (*p == 'x')
            p++;
    }
    for (int i = 0; i < n; i++)
        c->dm_ranks[i] = dbase + i;
    snprintf(c->sspec, sizeof c->sspec, "%s", sspec);
    snprintf(c->dspec, sizeof c->dspec, "%s", dspec);
    c->pmask = 0;
    /* P axes from the SBP string: token index of each "P" */
    int axis = 0;
    for (const char *p = sspec; *p; p++) {
        if (*p == ',')
            axis++;
        if (*p == 'P')
            c->pmask |= 1u << axis;
    }
    c->strategy = XMESH_STRATEGY_BROADCAST;
    c->scheduler = XMESH_SCHEDULER_ENSEMBLE;
    c->chunk_bytes = 1 << 20;
}

static void test_reuse_and_concurrency(void)
{
    if (g_size < 2)
        return;
    int h = g_size / 2;
    char ms[16], md[16];
    snprintf(ms, sizeof ms, "%d", h);
    snprintf(md, sizeof md, "%d", g_size - h);
    tcase_t a, b;
    fixed_case(&a, "37,5", XMESH_F32, ms, 0, "S(0)", md, h, "S(1)");
    a.chunk_bytes = 64;
    fixed_case(&b, "11,13", XMESH_I32, md, h, "S(1)", ms, 0, "S(0)");
    b.chunk_bytes = 100;
    char why[256] = "";
    tstate_t sa, sb;
    int ok = !setup(&a, &sa) && !setup(&b, &sb);
    /* plan reuse: 100 reshards, dst scrambled before each */
    for (int it = 0; ok && it < 100; it++) {
        fill_dst(&sa);
        xmesh_result_t r = xmesh_reshard(sa.plan, sa.src, dst_ptr(&sa));
        if (r) {
            snprintf(why, sizeof why, "reuse %d: %s", it, xmesh_last_error());
            ok = 0;
        } else if (check_dst(&a, &sa, why, sizeof why)) {
            ok = 0;
        }
    }
    report(ok, "plan reuse x100 %s", why);
    /* two plans in flight at once, finished in either order */
    for (int it = 0; it < 4; it++) {
        fill_dst(&sa);
        fill_dst(&sb);
        xmesh_request_t ra, rb;
        int okk = !xmesh_reshard_start(sa.plan, sa.src, dst_ptr(&sa), &ra) &&
                  !xmesh_reshard_start(sb.plan, sb.src, dst_ptr(&sb), &rb);
        if (okk && (it & 1)) {
            okk = !xmesh_wait(rb) && !xmesh_wait(ra);
        } else if (okk) {
            xmesh_result_t x;
            while ((x = xmesh_test(ra)) == XMESH_IN_PROGRESS)
                usleep(100);
            okk = !x && !xmesh_wait(rb);
        }
        okk = okk && !check_dst(&a, &sa, why, sizeof why) && !check_dst(&b, &sb, why, sizeof why);
        report(okk, "two plans in flight (round %d) %s", it, why);
    }
    /* request reuse and destroy while in flight */
    {
        fill_dst(&sa);
        xmesh_request_t rq;
        int okk = !xmesh_reshard_start(sa.plan, sa.src, dst_ptr(&sa), &rq);
        xmesh_result_t d = xmesh_plan_destroy(sa.plan);
        xmesh_result_t again =
            xmesh_reshard_start(sa.plan, sa.src, dst_ptr(&sa), &(xmesh_request_t){0});
        okk = okk && d == XMESH_ERR_INVALID_USAGE && again == XMESH_ERR_INVALID_USAGE;
        okk = okk && !xmesh_wait(rq);
        xmesh_result_t w2 = xmesh_wait(rq);
        xmesh_result_t t2 = xmesh_test(rq);
        okk = okk && w2 == XMESH_ERR_INVALID_USAGE && t2 == XMESH_ERR_INVALID_USAGE;
        okk = okk && !check_dst(&a, &sa, why, sizeof why);
        report(okk, "destroy in flight / second start / request reused rejected (%d %d %d %d)", d,
               again, w2, t2);
    }
    /* bad input: NULL dst on a rank that holds a block, dst untouched */
    {
        fill_dst(&sb);
        int okk = 1;
        if (sb.hold_dst && sb.dst_bytes) {
            xmesh_result_t r = xmesh_reshard(sb.plan, sb.src, NULL);
            okk = r == XMESH_ERR_INVALID_ARGUMENT;
            for (size_t i = 0; i < sb.dst_bytes + 2 * GUARD; i++)
                okk &= sb.dst_raw[i] == GUARD_BYTE;
        }
        if (sb.hold_src && sb.src_bytes) {
            xmesh_result_t r = xmesh_reshard(sb.plan, NULL, dst_ptr(&sb));
            okk &= r == XMESH_ERR_INVALID_ARGUMENT;
        }
        okk = okk && !xmesh_reshard(sb.plan, sb.src, dst_ptr(&sb)) &&
              !check_dst(&b, &sb, why, sizeof why);
        report(okk, "NULL buffer rejected, destination untouched, then a good run %s", why);
    }
    teardown(&sa);
    teardown(&sb);
}

static void test_nonblocking(void)
{
    if (g_size < 2)
        return;
    int h = g_size / 2;
    char ms[16], md[16];
    snprintf(ms, sizeof ms, "%d", h);
    snprintf(md, sizeof md, "%d", g_size - h);
    tcase_t a;
    fixed_case(&a, "512,256", XMESH_F64, ms, 0, "S(0)", md, h, "B");
    a.chunk_bytes = 4096;
    tstate_t s;
    char why[256] = "";
    int ok = !setup(&a, &s);
    fill_dst(&s);
    xmesh_request_t rq;
    ok = ok && !xmesh_reshard_start(s.plan, s.src, dst_ptr(&s), &rq);
    int polls = 0;
    xmesh_result_t r = XMESH_IN_PROGRESS;
    while (ok && (r = xmesh_test(rq)) == XMESH_IN_PROGRESS) {
        polls++;
        usleep(200); /* the caller computes; the progress thread moves data */
    }
    ok = ok && r == XMESH_SUCCESS && !check_dst(&a, &s, why, sizeof why);
    report(ok, "nonblocking start/test (%d polls) %s", polls, why);
    teardown(&s);
}

static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
           1e-6 * (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

/* A rank waiting for a late peer must sleep, not spin: rank 0 starts its
 * side 0.5 s late; rank 1's process CPU time while waiting stays low. */
static void test_idle_wait(void)
{
    if (g_size < 2)
        return;
    tcase_t c;
    fixed_case(&c, "1000", XMESH_F32, "1", 0, "S(0)", "1", 1, "S(0)");
    tstate_t s;
    char why[256] = "";
    int ok = !setup(&c, &s);
    fill_dst(&s);
    double cpu = 0, wall = 0;
    if (ok && g_rank == 0)
        usleep(500000);
    if (ok) {
        double c0 = cpu_seconds(), w0 = MPI_Wtime();
        ok = !xmesh_reshard(s.plan, s.src, dst_ptr(&s)) && !check_dst(&c, &s, why, sizeof why);
        cpu = cpu_seconds() - c0;
        wall = MPI_Wtime() - w0;
    }
    if (g_rank == 1)
        ok = ok && cpu < 0.25 * wall + 0.02;
    double cw[2] = {cpu, wall};
    MPI_Bcast(cw, 2, MPI_DOUBLE, 1, MPI_COMM_WORLD);
    report(ok, "waiting for a late peer sleeps (rank 1: %.3f s CPU in %.3f s) %s", cw[0], cw[1],
           why);
    teardown(&s);
}

static void test_mismatch(void)
{
    if (g_size < 2)
        return;
    tcase_t c;
    fixed_case(&c, "8,8", XMESH_F32, "1", 0, "S(0)", "1", 1, "B");
    if (g_rank == 1)
        c.shape[1] = 9;
    tstate_t s;
    xmesh_result_t r = setup(&c, &s);
    report(r == XMESH_ERR_MISMATCH,
           "MISMATCH on every rank when one rank passes another shape "
           "(got %s: %s)",
           xmesh_result_string(r), xmesh_last_error());
    s.plan = NULL;
    teardown(&s);
    /* one rank fails locally: it gets its own error, the others REMOTE */
    fixed_case(&c, "8,8", XMESH_F32, "1", 0, "S(0)", "1", 1, "B");
    if (g_rank == 1)
        snprintf(c.sspec, sizeof c.sspec, "S(7)");
    r = setup(&c, &s);
    report(g_rank == 1 ? r == XMESH_ERR_INVALID_ARGUMENT : r == XMESH_ERR_REMOTE,
           "local failure -> INVALID_ARGUMENT there, REMOTE elsewhere (got %s)",
           xmesh_result_string(r));
    s.plan = NULL;
    teardown(&s);
}

/* Task splitting in plan creation (issue 14 item 5). With one rank per
 * host, a tensor replicated on 3 hosts goes to 4 hosts in 4 equal row
 * blocks: whole tasks need 2 rounds on some sender host (1.5 x the bound),
 * pieces of the 4 tasks spread over the 3 senders reach the bound. Plan
 * creation must pick the pieces (more unit tasks, prediction near the
 * bound) and the executor must deliver them, every element checked; with
 * XMESH_SPLIT=0 it keeps the 4 whole tasks. Needs 7 ranks, 1 per host. */
static void test_split(int per_host)
{
    if (g_size < 7 || per_host != 1)
        return;
    for (int off = 0; off < 2; off++) {
        if (off)
            setenv("XMESH_SPLIT", "0", 1);
        for (int st = 0; st < 4; st++) {
            tcase_t c;
            fixed_case(&c, "256,256", XMESH_F32, "3", 0, "B", "4", 3, "S(0)");
            c.strategy = (xmesh_strategy_t)st;
            c.chunk_bytes = 16384;
            char desc[512], why[256] = "";
            describe(&c, desc, sizeof desc);
            tstate_t s;
            xmesh_plan_info_t info;
            memset(&info, 0, sizeof info);
            xmesh_result_t r = setup(&c, &s);
            int ok = r == XMESH_SUCCESS && xmesh_plan_get_info(s.plan, &info) == XMESH_SUCCESS;
            if (!ok)
                snprintf(why, sizeof why, "rank %d: plan_create: %s", g_rank, xmesh_last_error());
            /* the broadcast model must choose the pieces; the others only
             * have to move the right bytes whichever set they chose */
            int want_split = !off && c.strategy == XMESH_STRATEGY_BROADCAST;
            if (ok && want_split &&
                (info.unit_tasks <= 4 || info.predicted_s > 1.05 * info.lower_bound_s)) {
                snprintf(why, sizeof why,
                         "rank %d: %d unit tasks, predicted %.3g s vs bound %.3g s: "
                         "pieces not used",
                         g_rank, info.unit_tasks, info.predicted_s, info.lower_bound_s);
                ok = 0;
            }
            if (ok && off && info.unit_tasks != 4) {
                snprintf(why, sizeof why, "rank %d: XMESH_SPLIT=0 but %d unit tasks", g_rank,
                         info.unit_tasks);
                ok = 0;
            }
            for (int rep = 0; ok && rep < 2; rep++) {
                fill_dst(&s);
                if ((r = xmesh_reshard(s.plan, s.src, dst_ptr(&s)))) {
                    snprintf(why, sizeof why, "rank %d: reshard: %s: %s", g_rank,
                             xmesh_result_string(r), xmesh_last_error());
                    ok = 0;
                } else {
                    ok = check_dst(&c, &s, why, sizeof why) == 0;
                }
            }
            if (!ok)
                fprintf(stderr, "fixed-split [%s] %s\n", desc, why);
            report(ok, "fixed-split%s %s: %d unit tasks, predicted / bound %.3f", off ? "-off" : "",
                   desc, info.unit_tasks,
                   info.lower_bound_s > 0 ? info.predicted_s / info.lower_bound_s : 0.0);
            teardown(&s);
        }
    }
    unsetenv("XMESH_SPLIT");
}

static void test_timeout(void)
{
    if (g_size < 2)
        return;
    /* rank 0 sends to rank 1, but rank 0 never calls reshard: rank 1 must
     * time out naming rank 0. */
    tcase_t c;
    fixed_case(&c, "64", XMESH_I32, "1", 0, "S(0)", "1", 1, "S(0)");
    tstate_t s;
    xmesh_plan_params_t pp = XMESH_PLAN_PARAMS_INITIALIZER;
    (void)pp;
    int ok = !setup(&c, &s);
    /* setup() uses timeout 60 s: make a short-timeout plan instead */
    xmesh_plan_t p2 = NULL;
    pp.timeout_s = 0.3;
    ok = ok && !xmesh_plan_create(g_ctx, &s.sl, &s.dl, &pp, &p2);
    if (ok && g_rank == 1) {
        fill_dst(&s);
        double t0 = MPI_Wtime();
        xmesh_result_t r = xmesh_reshard(p2, NULL, dst_ptr(&s));
        double dt = MPI_Wtime() - t0;
        ok = r == XMESH_ERR_TIMEOUT && strstr(xmesh_last_error(), "rank 0") && dt < 3.0;
        if (!ok)
            fprintf(stderr, "timeout test: %s after %.2f s: %s\n", xmesh_result_string(r), dt,
                    xmesh_last_error());
        /* the plan is now unusable, and says so */
        xmesh_request_t rq;
        ok = ok && xmesh_reshard_start(p2, NULL, dst_ptr(&s), &rq) == XMESH_ERR_INVALID_USAGE;
    }
    report(ok, "timeout names the peer and the plan refuses further use");
    MPI_Barrier(MPI_COMM_WORLD);
    xmesh_plan_destroy(p2);
    teardown(&s);
}

static void test_trace(void)
{
    if (g_size < 2)
        return;
    char path[256];
    snprintf(path, sizeof path, "/tmp/xmesh_test_trace_%d.json", (int)getpid());
    MPI_Bcast(path, sizeof path, MPI_CHAR, 0, MPI_COMM_WORLD);
    setenv("XMESH_TRACE", path, 1);
    tcase_t c;
    fixed_case(&c, "64,32", XMESH_F32, "1", 0, "S(0)", "1", 1, "B");
    c.chunk_bytes = 1024;
    tstate_t s;
    int ok = !setup(&c, &s);
    unsetenv("XMESH_TRACE");
    fill_dst(&s);
    ok = ok && !xmesh_reshard(s.plan, s.src, dst_ptr(&s));
    if (ok && g_rank == 0) {
        FILE *f = fopen(path, "r");
        char buf[1 << 16];
        size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        buf[n] = 0;
        if (f)
            fclose(f);
        ok = f && strstr(buf, "\"traceEvents\"") && strstr(buf, "\"send t0 c0\"") &&
             strstr(buf, "\"recv t0 c0\"") && strstr(buf, "\"task 0\"");
        unlink(path);
    }
    report(ok, "XMESH_TRACE writes a merged Chrome trace with task/send/recv events");
    teardown(&s);
}

static void test_checksum(void)
{
    if (g_size < 2)
        return;
    tcase_t c;
    fixed_case(&c, "33,9", XMESH_F32, "1", 0, "S(0)", "1", 1, "S(1)");
    c.chunk_bytes = 40;
    char why[256] = "";
    tstate_t s;
    setenv("XMESH_CHECK", "1", 1);
    int ok = !setup(&c, &s);
    fill_dst(&s);
    ok = ok && !xmesh_reshard(s.plan, s.src, dst_ptr(&s)) && !check_dst(&c, &s, why, sizeof why);
    report(ok, "XMESH_CHECK=1: clean data verifies %s", why);
    teardown(&s);
#ifndef XMESH_TEST_HOOKS
    /* XMESH_TEST_CORRUPT is compiled only into test builds (XMESH_TEST_HOOKS) */
    if (g_rank == 0)
        printf("SKIP: XMESH_CHECK=1 corruption check: library built without XMESH_TEST_HOOKS\n");
    unsetenv("XMESH_CHECK");
    return;
#endif
    /* rank 1 damages the first chunk it receives: it must say so */
    setenv("XMESH_TEST_CORRUPT", "1", 1);
    ok = !setup(&c, &s);
    fill_dst(&s);
    xmesh_result_t r = ok ? xmesh_reshard(s.plan, s.src, dst_ptr(&s)) : XMESH_ERR_INTERNAL;
    if (g_rank == 1)
        ok = r == XMESH_ERR_BACKEND && strstr(xmesh_last_error(), "XMESH_CHECK") &&
             strstr(xmesh_last_error(), "rank 0") && strstr(xmesh_last_error(), "(0,0)");
    else
        ok = r == XMESH_SUCCESS;
    if (!ok)
        fprintf(stderr, "rank %d: corruption test: %s: %s\n", g_rank, xmesh_result_string(r),
                xmesh_last_error());
    report(ok, "XMESH_CHECK=1 catches a corrupted chunk and names peer and element");
    unsetenv("XMESH_TEST_CORRUPT");
    unsetenv("XMESH_CHECK");
    teardown(&s);
}

static long rss_kib(void)
{
    long pages = 0, rss = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &rss) != 2)
            rss = 0;
        fclose(f);
    }
    return rss * (sysconf(_SC_PAGESIZE) / 1024);
}

static int count_fds(void)
{
    int n = 0;
    for (int fd = 0; fd < 4096; fd++)
        n += fcntl(fd, F_GETFD) != -1;
    return n;
}

/* Soak: n reshards over a rotating set of plans (every strategy, a P case,
 * an overlapping case), every result checked; resident memory and open
 * file descriptors must not grow over the second half.  The first half is
 * warm-up: the transports' memory pools (UCX grows its pools lazily) and a
 * sanitizer's shadow memory settle there; a per-reshard leak still grows
 * linearly through the second half, so it is caught there. */
static void test_soak(int n)
{
    if (n <= 0 || g_size < 2)
        return;
    int h = g_size / 2;
    char ms[16], md[16], mall[16];
    snprintf(ms, sizeof ms, "%d", h);
    snprintf(md, sizeof md, "%d", g_size - h);
    snprintf(mall, sizeof mall, "%d", g_size);
    enum { NP = 6 };
    tcase_t c[NP];
    tstate_t s[NP];
    for (int i = 0; i < 4; i++) {
        fixed_case(&c[i], "37,11", XMESH_F32, ms, 0, "S(0)", md, h, "S(1)");
        c[i].strategy = (xmesh_strategy_t)i;
        c[i].chunk_bytes = 512;
    }
    fixed_case(&c[4], "19,7", XMESH_BF16, ms, 0, "P", md, h, "B");
    c[4].chunk_bytes = 100;
    fixed_case(&c[5], "23,9", XMESH_I64, mall, 0, "S(1)", mall, 0, "S(0)");
    int ok = 1;
    char why[256] = "";
    for (int i = 0; i < NP; i++)
        ok &= !setup(&c[i], &s[i]);
    long rss0 = 0, fd0 = 0;
    double t0 = MPI_Wtime();
    for (int it = 0; ok && it < n; it++) {
        int i = it % NP;
        fill_dst(&s[i]);
        xmesh_result_t r = xmesh_reshard(s[i].plan, s[i].src, dst_ptr(&s[i]));
        if (r) {
            snprintf(why, sizeof why, "rank %d: soak %d: %s", g_rank, it, xmesh_last_error());
            ok = 0;
        } else if (check_dst(&c[i], &s[i], why, sizeof why)) {
            ok = 0;
        }
        if (it == n / 2) {
            rss0 = rss_kib();
            fd0 = count_fds();
        }
    }
    long rss1 = rss_kib(), fd1 = count_fds();
    /* a little slack for allocator noise; a per-reshard leak grows linearly */
    int grow_ok = rss1 - rss0 < 2048 && fd1 == fd0;
    if (!grow_ok)
        fprintf(stderr, "rank %d: soak: RSS %ld -> %ld KiB, fds %ld -> %ld\n", g_rank, rss0, rss1,
                fd0, fd1);
    long v[2] = {rss1 - rss0, fd1 - fd0}, mx[2];
    MPI_Allreduce(v, mx, 2, MPI_LONG, MPI_MAX, MPI_COMM_WORLD);
    report(
        ok && grow_ok,
        "soak: %d reshards over %d plans in %.1f s, all checked; max growth over the second half: "
        "RSS %ld KiB, fds %ld %s",
        n, NP, MPI_Wtime() - t0, mx[0], mx[1], why);
    if (g_rank == 0)
        printf("soak: %d reshards, RSS growth %ld KiB, fd growth %ld (max over ranks)\n", n, mx[0],
               mx[1]);
    for (int i = 0; i < NP; i++)
        teardown(&s[i]);
}

/* ------------------------------------------------------------------ main */

int main(int argc, char **argv)
{
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    int ncases = 100, per_host = 2, soak = 0, split_only = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--cases") && i + 1 < argc)
            ncases = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--per-host") && i + 1 < argc)
            per_host = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--soak") && i + 1 < argc)
            soak = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--split-only")) {
            split_only = 1;
            ncases = 0;
        } else if (!strcmp(argv[i], "-v"))
            g_verbose = 1;
    }
    uint64_t seed = (uint64_t)time(NULL);
    const char *env = getenv("XMESH_TEST_SEED");
    if (env && *env)
        seed = strtoull(env, NULL, 0);
    MPI_Bcast(&seed, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    if (g_rank == 0)
        printf("test_mpi%s: %d ranks, %d per fake host, %d random cases, seed %llu "
               "(XMESH_TEST_SEED=%llu replays)\n",
#ifdef XMESH_TEST_UCX
               " over UCX",
#else
               "",
#endif
               g_size, per_host, ncases, (unsigned long long)seed, (unsigned long long)seed);
    xmesh_ctx_params_t cp = XMESH_CTX_PARAMS_INITIALIZER;
    cp.host_id = g_rank / per_host;
    if (xmesh_ctx_create_mpi(MPI_COMM_WORLD, &cp, &g_ctx)) {
        fprintf(stderr, "rank %d: ctx_create: %s\n", g_rank, xmesh_last_error());
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int host = -1;
    xmesh_ctx_host(g_ctx, g_rank, &host);
    report(host == g_rank / per_host, "host override: rank %d on host %d", g_rank, host);

    test_split(per_host);
    /* Fixed cases: the paper's examples and corner cases. */
    tcase_t c;
    if (g_size >= 2 && !split_only) {
        int h = g_size / 2;
        char ms[16], md[16];
        snprintf(ms, sizeof ms, "%d", h);
        snprintf(md, sizeof md, "%d", g_size - h);
        for (int st = 0; st < 4; st++)
            for (int dt = 0; dt < XMESH_DTYPE_COUNT_; dt++) {
                fixed_case(&c, "13,7,3", (xmesh_dtype_t)dt, ms, 0, "S(0)", md, h, "S(2)");
                c.strategy = (xmesh_strategy_t)st;
                c.chunk_bytes = 8;
                run_case(&c, "fixed-dtype");
            }
        /* P source: sum of partials over all ranks of the source mesh */
        for (int st = 0; st < 4; st++)
            for (int dt = 0; dt < XMESH_DTYPE_COUNT_; dt++) {
                fixed_case(&c, "9,10", (xmesh_dtype_t)dt, ms, 0, "P", md, h, "S(1)");
                c.strategy = (xmesh_strategy_t)st;
                c.chunk_bytes = dt % 2 ? 16 : 1 << 20;
                run_case(&c, "fixed-partial");
            }
        /* overlapping meshes: the same ranks on both sides */
        snprintf(ms, sizeof ms, "%d", g_size);
        for (int st = 0; st < 4; st++) {
            fixed_case(&c, "10,6", XMESH_I64, ms, 0, "S(0)", ms, 0, "S(1)");
            c.strategy = (xmesh_strategy_t)st;
            c.chunk_bytes = 24;
            run_case(&c, "fixed-overlap");
            fixed_case(&c, "10,6", XMESH_F32, ms, 0, "P", ms, 0, "S(0)");
            c.strategy = (xmesh_strategy_t)st;
            run_case(&c, "fixed-overlap-partial");
        }
        /* empty shards: more shards than elements */
        if (g_size >= 4) {
            fixed_case(&c, "1,3", XMESH_U8, "2", 0, "S(0)", "2", 2, "S(0)");
            run_case(&c, "fixed-empty");
        }
        /* torch.chunk shards (ceil-sized, empty trailing ones) to and from
         * numpy.array_split shards, partial sums too; g_size + 2 rows over
         * g_size (4: 2,2,2,0 vs 2,2,1,1) or g_size / 2 ranks */
        if (g_size >= 4) {
            char rows[32], all[16], lo[16], hi[16];
            snprintf(rows, sizeof rows, "%d,3,2", g_size + 2);
            snprintf(all, sizeof all, "%d", g_size);
            snprintf(lo, sizeof lo, "%d", h);
            snprintf(hi, sizeof hi, "%d", g_size - h);
            for (int dir = 0; dir < 4; dir++) {
                int same = dir >= 2;
                fixed_case(&c, rows, XMESH_F32, same ? all : lo, 0, "S(0)", same ? all : hi,
                           same ? 0 : h, "S(0)");
                c.ssplit = dir % 2 ? XMESH_SPLIT_TORCH : XMESH_SPLIT_NUMPY;
                c.dsplit = dir % 2 ? XMESH_SPLIT_NUMPY : XMESH_SPLIT_TORCH;
                run_case(&c, "fixed-torch-split");
                fixed_case(&c, rows, XMESH_I32, same ? all : lo, 0, "P", same ? all : hi,
                           same ? 0 : h, "S(0)");
                c.dsplit = XMESH_SPLIT_TORCH;
                c.strategy = (xmesh_strategy_t)dir;
                run_case(&c, "fixed-torch-partial");
            }
        }
        /* 0-d tensor */
        fixed_case(&c, "", XMESH_F64, "1", 0, "", "1", g_size - 1, "");
        c.ndim = 0;
        snprintf(c.sspec, sizeof c.sspec, "B");
        snprintf(c.dspec, sizeof c.dspec, "B");
        run_case(&c, "fixed-0d");
    }
    if (g_size >= 8 && !split_only) {
        /* paper Table 2 case 4 shape (scaled): RS01R -> S01RR, (2,4) -> (2,4) */
        for (int st = 0; st < 4; st++) {
            fixed_case(&c, "16,16,8", XMESH_I32, "2x2", 0, "RS01R", "2x2", 4, "S01RR");
            c.strategy = (xmesh_strategy_t)st;
            c.chunk_bytes = 512;
            run_case(&c, "fixed-table2-4");
        }
        for (int sc = 0; sc < XMESH_SCHEDULER_COUNT_; sc++) {
            fixed_case(&c, "16,16,8", XMESH_F32, "2x2", 0, "S(0),B", "2x2", 4, "B,S(1)");
            c.scheduler = (xmesh_scheduler_t)sc;
            c.chunk_bytes = 300;
            run_case(&c, "fixed-scheduler");
        }
        /* torch's nested chunking of one dim by two axes (10 rows over 2x2:
         * 3,2,3,2; numpy's single cut: 3,3,2,2), disjoint and same mesh */
        for (int same = 0; same < 2; same++) {
            fixed_case(&c, "10,3", XMESH_I64, "2x2", 0, "S(0),S(0)", "2x2", same ? 0 : 4,
                       "S(0),S(0)");
            c.dsplit = XMESH_SPLIT_TORCH;
            c.chunk_bytes = 40;
            run_case(&c, "fixed-torch-nested");
            fixed_case(&c, "7,6", XMESH_F64, "2x2", 0, "S10R", "2x2", same ? 0 : 4, "S(1),S(0)");
            c.ssplit = XMESH_SPLIT_TORCH;
            c.dsplit = XMESH_SPLIT_TORCH;
            run_case(&c, "fixed-torch-nested-2");
        }
    }

    test_soak(soak);
    if (!split_only) {
        test_reuse_and_concurrency();
        test_nonblocking();
        test_mismatch();
        test_timeout();
        test_trace();
        test_checksum();
        test_idle_wait();
    }

    rng_state = seed;
    for (int i = 0; i < ncases; i++) {
        random_case(&c);
        char tag[64];
        snprintf(tag, sizeof tag, "random-%d", i);
        run_case(&c, tag);
    }
    (void)strategies;

    int rc = xmesh_ctx_destroy(g_ctx);
    report(rc == 0, "ctx destroy");
    if (g_rank == 0) {
        printf("test_mpi (%d ranks, seed %llu): %d passed, %d failed\n", g_size,
               (unsigned long long)seed, g_pass, g_fail);
        fflush(stdout);
    }
    MPI_Finalize();
    return g_fail ? 1 : 0;
}
