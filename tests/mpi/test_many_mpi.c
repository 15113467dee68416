/*
 * MPI tier: plans of many tensors. Run under
 * `mpiexec -n N --oversubscribe test_many_mpi [--cases K] [--per-host H]
 *  [--level single|funneled|serialized|multiple] [-v]`.
 *
 * Random plans of 1-64 tensors, each with its own shape (0-3 dims, empty
 * tensors and empty shards, uneven dims), dtype pair (equal dtypes of every
 * kind and the converting pairs among f32, f16 and bf16), GSPMD or SBP
 * shardings (partial sums at sources), and meshes (random ranks of the
 * world, 1-D or 2-D; source and destination meshes overlap or not, every
 * tensor its own pair): the plan of many moves every tensor, then one plan
 * per tensor moves each again, and both results must equal, element by
 * element, each other and the value expected at every global index; guard
 * bytes around every destination block stay untouched and sources
 * unchanged. Then the refusals: ranks that pass a different n or a
 * different layout at index k get XMESH_ERR_MISMATCH naming it on every
 * rank; a NULL block where the rank holds one and NULL arrays are refused
 * naming the index with nothing moved. Ranks pretend to sit on hosts of H
 * ranks. The seed is printed; XMESH_TEST_SEED replays.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef XMESH_TEST_UCX /* the same cases over UCX without MPI (tests/ucx) */
#include "mpi_shim.h"
#else
#include <mpi.h>

#include "xmesh/mpi.h"
#endif
#include "xmesh.h"

#define GUARD 32
#define GUARD_BYTE 0xA5
#define MAX_T 64

static int g_rank, g_size, g_pass, g_fail, g_verbose;
static xmesh_ctx_t g_ctx;

/* Collective: a check passes only if it passed on every rank. */
static void report(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
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

static uint64_t rng;
static uint64_t rnd(void)
{
    uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static int rndi(int lo, int hi) /* [lo, hi] */
{
    return lo + (int)(rnd() % (uint64_t)(hi - lo + 1));
}

/* ------------------------------------------------------------ values */

/* The value of element g of tensor k at the destination: a small integer,
 * exact in every dtype (bf16 keeps 8 significant bits). Partial sums:
 * group p of G holds part(k, g, p, G); the parts sum to it exactly. */
static int64_t want(int k, int64_t g)
{
    return (g * 7 + k * 13) % 97 + 1;
}
static int64_t part(int k, int64_t g, int p, int G)
{
    if (G == 1)
        return want(k, g);
    int64_t s = 0;
    for (int q = 0; q < G - 1; q++)
        s += (g + q * 3 + k) % 5;
    return p < G - 1 ? (g + p * 3 + k) % 5 : want(k, g) - s;
}

static void store(xmesh_dtype_t dt, void *b, int64_t i, int64_t v)
{
    float f = (float)v;
    switch (dt) {
    case XMESH_U8:
    case XMESH_I8:
        ((uint8_t *)b)[i] = (uint8_t)v;
        break;
    case XMESH_I32:
        ((int32_t *)b)[i] = (int32_t)v;
        break;
    case XMESH_I64:
        ((int64_t *)b)[i] = v;
        break;
    case XMESH_F32:
        ((float *)b)[i] = f;
        break;
    case XMESH_F64:
        ((double *)b)[i] = (double)v;
        break;
    default: /* f16, bf16: through the library's own converter */
        xmesh_convert(dt, (char *)b + 2 * i, XMESH_F32, &f, 1);
        break;
    }
}

static int64_t load(xmesh_dtype_t dt, const void *b, int64_t i)
{
    float f;
    switch (dt) {
    case XMESH_U8:
        return ((const uint8_t *)b)[i];
    case XMESH_I8:
        return ((const int8_t *)b)[i];
    case XMESH_I32:
        return ((const int32_t *)b)[i];
    case XMESH_I64:
        return ((const int64_t *)b)[i];
    case XMESH_F32:
        return (int64_t)((const float *)b)[i];
    case XMESH_F64:
        return (int64_t)((const double *)b)[i];
    default:
        xmesh_convert(XMESH_F32, &f, dt, (const char *)b + 2 * i, 1);
        return (int64_t)f;
    }
}

/* ------------------------------------------------------------ cases */

typedef struct {
    int ndim;
    int64_t shape[3];
    xmesh_dtype_t sdt, ddt;
    int mesh_ndim[2], mesh_shape[2][2], ranks[2][64];
    char spec[2][64];
    int partial_groups; /* source partial groups (P axes) */
    xmesh_mesh_t mesh[2];
    xmesh_layout_t lay[2];
    /* this rank's blocks */
    int holds[2];
    int64_t lo[2][3], ext[2][3], vol[2];
    int group;                      /* this rank's partial group at the source */
    char *src, *dst_many, *dst_one; /* dst_*: GUARD bytes each side */
} tcase_t;

static const xmesh_dtype_t same_dts[] = {XMESH_U8,  XMESH_I8,   XMESH_I32, XMESH_I64,
                                         XMESH_F16, XMESH_BF16, XMESH_F32, XMESH_F64};
static const xmesh_dtype_t cvt_dts[] = {XMESH_F32, XMESH_F16, XMESH_BF16};

/* A random mesh of the world (distinct ranks), 1-D or 2-D. */
static void rand_mesh(tcase_t *t, int side)
{
    int nd = rndi(1, 2), n;
    do {
        t->mesh_shape[side][0] = rndi(1, g_size);
        t->mesh_shape[side][1] = nd == 2 ? rndi(1, 3) : 1;
        n = t->mesh_shape[side][0] * t->mesh_shape[side][1];
    } while (n > g_size);
    t->mesh_ndim[side] = nd;
    int perm[64];
    for (int i = 0; i < g_size; i++)
        perm[i] = i;
    for (int i = g_size - 1; i > 0; i--) {
        int j = rndi(0, i), v = perm[i];
        perm[i] = perm[j];
        perm[j] = v;
    }
    memcpy(t->ranks[side], perm, sizeof(int) * n);
}

/* A random sharding: each mesh axis splits a dim, replicates or (sources
 * of float/i32 tensors only) holds partial sums; written as SBP, or as
 * GSPMD when it has no P (and at random). */
static void rand_spec(tcase_t *t, int side, int allow_p)
{
    int nax = t->mesh_ndim[side], use[2];
    int groups = 1;
    for (int a = 0; a < nax; a++) {
        int c = rndi(0, 5);
        if (c == 5 && allow_p && t->mesh_shape[side][a] > 1)
            use[a] = -2; /* P */
        else if (c >= 3 || t->ndim == 0)
            use[a] = -1; /* B / R */
        else
            use[a] = rndi(0, t->ndim - 1);
        if (use[a] == -2)
            groups *= t->mesh_shape[side][a];
    }
    if (side == 0)
        t->partial_groups = groups;
    int has_p = groups > 1;
    char *s = t->spec[side];
    s[0] = 0;
    if (!has_p && rndi(0, 1)) { /* GSPMD: per dim the axes splitting it, ascending */
        for (int d = 0; d < t->ndim; d++) {
            int any = 0;
            for (int a = 0; a < nax; a++)
                if (use[a] == d) {
                    if (!any)
                        strcat(s, "S");
                    any = 1;
                    char b[4];
                    snprintf(b, sizeof b, "%d", a);
                    strcat(s, b);
                }
            if (!any)
                strcat(s, "R");
        }
        return;
    }
    for (int a = 0; a < nax; a++) {
        char b[16];
        if (use[a] == -2)
            snprintf(b, sizeof b, "P");
        else if (use[a] == -1)
            snprintf(b, sizeof b, "B");
        else
            snprintf(b, sizeof b, "S(%d)", use[a]);
        if (a)
            strcat(s, ",");
        strcat(s, b);
    }
}

/* tmpl: NULL, or a case whose meshes this one takes (plans where many
 * tensors share a mesh pair: their small unit tasks get packed). */
static void make_case(tcase_t *t, const tcase_t *tmpl)
{
    memset(t, 0, sizeof *t);
    t->ndim = rndi(0, 3);
    for (int d = 0; d < t->ndim; d++)
        t->shape[d] = rndi(0, 9) == 0 ? 0 : rndi(1, 9);
    if (rndi(0, 2) == 0) {
        t->sdt = cvt_dts[rndi(0, 2)];
        t->ddt = cvt_dts[rndi(0, 2)];
    } else {
        t->sdt = t->ddt = same_dts[rndi(0, 7)];
    }
    int allow_p = t->sdt == XMESH_F32 || t->sdt == XMESH_F64 || t->sdt == XMESH_I32 ||
                  t->sdt == XMESH_BF16 || t->sdt == XMESH_F16;
    rand_mesh(t, 0);
    rand_mesh(t, 1);
    if (tmpl) {
        memcpy(t->mesh_ndim, tmpl->mesh_ndim, sizeof t->mesh_ndim);
        memcpy(t->mesh_shape, tmpl->mesh_shape, sizeof t->mesh_shape);
        memcpy(t->ranks, tmpl->ranks, sizeof t->ranks);
    }
    rand_spec(t, 0, allow_p);
    rand_spec(t, 1, 0);
}

static size_t esz(xmesh_dtype_t dt)
{
    return xmesh_dtype_size(dt);
}

/* Meshes, layouts, blocks and their source values. */
static int setup_case(tcase_t *t, int k)
{
    for (int s = 0; s < 2; s++) {
        if (xmesh_mesh_create(g_ctx, t->mesh_ndim[s], t->mesh_shape[s], t->ranks[s], &t->mesh[s]))
            return -1;
        t->lay[s] =
            (xmesh_layout_t){t->ndim, t->shape, s ? t->ddt : t->sdt, t->mesh[s], t->spec[s]};
        if (xmesh_layout_local_shape(&t->lay[s], g_rank, t->ext[s], &t->holds[s]) ||
            xmesh_layout_local_offset(&t->lay[s], g_rank, t->lo[s], &t->holds[s]))
            return -1;
        t->vol[s] = 1;
        for (int d = 0; d < t->ndim; d++)
            t->vol[s] *= t->ext[s][d];
        if (!t->holds[s])
            t->vol[s] = 0;
    }
    /* partial group of this rank: mixed radix over the P axes, as SBP
     * defines it (any numbering works: the parts sum to the value) */
    t->group = 0;
    int G = t->partial_groups;
    if (G > 1 && t->holds[0]) {
        int idx = -1, n = t->mesh_shape[0][0] * t->mesh_shape[0][1];
        for (int i = 0; i < n; i++)
            if (t->ranks[0][i] == g_rank)
                idx = i;
        int coord[2] = {idx / t->mesh_shape[0][1], idx % t->mesh_shape[0][1]};
        if (t->mesh_ndim[0] == 1)
            coord[0] = idx;
        /* P axes in order, from the spec text */
        int a = 0, g = 0;
        for (const char *c = t->spec[0]; *c; c++) {
            if (*c == ',')
                a++;
            if (*c == 'P')
                g = g * t->mesh_shape[0][a] + coord[a];
        }
        t->group = g;
    }
    t->src = malloc(t->vol[0] * esz(t->sdt) + 1);
    size_t db = t->vol[1] * esz(t->ddt) + 2 * GUARD;
    t->dst_many = malloc(db);
    t->dst_one = malloc(db);
    if (!t->src || !t->dst_many || !t->dst_one)
        return -1;
    memset(t->dst_many, GUARD_BYTE, db);
    memset(t->dst_one, GUARD_BYTE, db);
    /* source values at their global indices */
    for (int64_t e = 0; e < t->vol[0]; e++) {
        int64_t rem = e, g = 0, idx[3];
        for (int d = t->ndim - 1; d >= 0; d--) {
            idx[d] = t->lo[0][d] + rem % t->ext[0][d];
            rem /= t->ext[0][d];
        }
        for (int d = 0; d < t->ndim; d++)
            g = g * t->shape[d] + idx[d];
        store(t->sdt, t->src, e, part(k, g, t->group, G));
    }
    return 0;
}

/* Every destination element equals the expected value; guards intact. */
static int check_dst(const tcase_t *t, int k, const char *dst, char *why, size_t len)
{
    for (int i = 0; i < GUARD; i++)
        if ((unsigned char)dst[i] != GUARD_BYTE ||
            (unsigned char)dst[GUARD + t->vol[1] * esz(t->ddt) + i] != GUARD_BYTE) {
            snprintf(why, len, "tensor %d: guard byte %d overwritten", k, i);
            return 0;
        }
    for (int64_t e = 0; e < t->vol[1]; e++) {
        int64_t rem = e, g = 0, idx[3];
        for (int d = t->ndim - 1; d >= 0; d--) {
            idx[d] = t->lo[1][d] + rem % t->ext[1][d];
            rem /= t->ext[1][d];
        }
        for (int d = 0; d < t->ndim; d++)
            g = g * t->shape[d] + idx[d];
        int64_t w = want(k, g);
        if (t->ddt == XMESH_U8)
            w &= 0xff;
        int64_t got = load(t->ddt, dst + GUARD, e);
        if (got != w) {
            snprintf(why, len, "tensor %d (%s): element %lld (global %lld) = %lld, want %lld", k,
                     t->spec[1], (long long)e, (long long)g, (long long)got, (long long)w);
            return 0;
        }
    }
    return 1;
}

static void free_case(tcase_t *t)
{
    xmesh_mesh_destroy(t->mesh[0]);
    xmesh_mesh_destroy(t->mesh[1]);
    free(t->src);
    free(t->dst_many);
    free(t->dst_one);
}

static void describe(const tcase_t *t, int k)
{
    if (g_rank != 0 || !g_verbose)
        return;
    printf("  tensor %d: [", k);
    for (int d = 0; d < t->ndim; d++)
        printf("%s%lld", d ? "," : "", (long long)t->shape[d]);
    printf("] %s->%s %s on %dx%d -> %s on %dx%d\n", xmesh_dtype_name(t->sdt),
           xmesh_dtype_name(t->ddt), t->spec[0], t->mesh_shape[0][0], t->mesh_shape[0][1],
           t->spec[1], t->mesh_shape[1][0], t->mesh_shape[1][1]);
}

/* One random plan of n tensors: many vs one plan per tensor vs expected. */
static void run_case(int c, tcase_t *ts)
{
    int n = rndi(1, MAX_T);
    if (rndi(0, 3) == 0)
        n = rndi(1, 4);
    int ok = 1;
    char why[512] = "";
    xmesh_layout_t src[MAX_T], dst[MAX_T];
    const void *sp[MAX_T];
    void *dm[MAX_T], *d1[MAX_T];
    /* half the cases: every tensor on one of two mesh pairs */
    tcase_t pairs[2];
    int shared = rndi(0, 1);
    make_case(&pairs[0], NULL);
    make_case(&pairs[1], NULL);
    for (int k = 0; k < n; k++) {
        make_case(&ts[k], shared ? &pairs[rndi(0, 1)] : NULL);
        describe(&ts[k], k);
        if (setup_case(&ts[k], k)) {
            ok = 0;
            snprintf(why, sizeof why, "tensor %d: setup: %s", k, xmesh_last_error());
        }
        src[k] = ts[k].lay[0];
        dst[k] = ts[k].lay[1];
        sp[k] = ts[k].holds[0] ? ts[k].src : NULL;
        dm[k] = ts[k].holds[1] ? ts[k].dst_many + GUARD : NULL;
        d1[k] = ts[k].holds[1] ? ts[k].dst_one + GUARD : NULL;
    }
    report(ok, "case %d: setup of %d tensors %s", c, n, why);
    xmesh_plan_t plan = NULL;
    xmesh_result_t r = xmesh_plan_create_many(g_ctx, n, src, dst, NULL, &plan);
    report(r == XMESH_SUCCESS, "case %d: plan of %d tensors: %s", c, n,
           r ? xmesh_last_error() : "created");
    xmesh_plan_info_t info;
    memset(&info, 0, sizeof info);
    if (!r) {
        /* alternate the entry points: blocking, or start then test/wait */
        if (c % 2) {
            r = xmesh_reshard_many(plan, sp, dm);
        } else {
            xmesh_request_t q;
            r = xmesh_reshard_many_start(plan, sp, dm, &q);
            if (!r)
                do
                    r = xmesh_test(q);
                while (r == XMESH_IN_PROGRESS);
        }
        if (r)
            fprintf(stderr, "rank %d: case %d: %s\n", g_rank, c, xmesh_last_error());
        report(r == XMESH_SUCCESS, "case %d: reshard of %d tensors: %s", c, n,
               r ? xmesh_last_error() : "done");
        xmesh_plan_get_info(plan, &info);
    }
    /* one plan per tensor */
    int64_t bytes = 0, cross = 0;
    int one_ok = 1;
    for (int k = 0; k < n; k++) {
        xmesh_plan_t p1;
        xmesh_result_t q = xmesh_plan_create(g_ctx, &src[k], &dst[k], NULL, &p1);
        if (!q) {
            q = xmesh_reshard(p1, sp[k], d1[k]);
            xmesh_plan_info_t i1;
            xmesh_plan_get_info(p1, &i1);
            bytes += i1.bytes_total;
            cross += i1.bytes_cross_host;
            xmesh_plan_destroy(p1);
        }
        if (q && one_ok) {
            one_ok = 0;
            snprintf(why, sizeof why, "tensor %d alone: %s", k, xmesh_last_error());
        }
    }
    report(one_ok, "case %d: one plan per tensor %s", c, one_ok ? "" : why);
    if (!r) {
        /* the prediction is not below the bound (rounding only: the bound
         * holds for chunks of a few bytes too, docs/LOWER_BOUND.md) */
        report(info.tensors == n && info.bytes_total == bytes && info.bytes_cross_host == cross &&
                   info.predicted_s >= info.lower_bound_s * (1 - 1e-9),
               "case %d: info: %d tensors, %lld bytes (sum %lld), cross %lld (sum %lld), "
               "%d unit tasks in %d scheduled, bound %.3g s, predicted %.3g s",
               c, info.tensors, (long long)info.bytes_total, (long long)bytes,
               (long long)info.bytes_cross_host, (long long)cross, info.unit_tasks,
               info.scheduled_tasks, info.lower_bound_s, info.predicted_s);
    }
    /* element by element: many == expected, one == expected, many == one */
    ok = 1;
    for (int k = 0; k < n && ok; k++) {
        const tcase_t *t = &ts[k];
        size_t db = t->vol[1] * esz(t->ddt) + 2 * GUARD;
        if (!check_dst(t, k, t->dst_many, why, sizeof why))
            ok = 0;
        else if (!check_dst(t, k, t->dst_one, why, sizeof why))
            ok = 0, strcat(why, " (one plan per tensor)");
        else if (memcmp(t->dst_many, t->dst_one, db))
            ok = 0, snprintf(why, sizeof why, "tensor %d: many != one, bitwise", k);
        /* sources unchanged */
        for (int64_t e = 0; e < t->vol[0] && ok; e++) {
            int64_t rem = e, g = 0, idx[3];
            for (int d = t->ndim - 1; d >= 0; d--) {
                idx[d] = t->lo[0][d] + rem % t->ext[0][d];
                rem /= t->ext[0][d];
            }
            for (int d = 0; d < t->ndim; d++)
                g = g * t->shape[d] + idx[d];
            int64_t w = part(k, g, t->group, t->partial_groups);
            char tmp[8];
            store(t->sdt, tmp, 0, w);
            if (memcmp(tmp, t->src + e * esz(t->sdt), esz(t->sdt)))
                ok = 0, snprintf(why, sizeof why, "tensor %d: source element %lld changed", k,
                                 (long long)e);
        }
    }
    report(ok, "case %d: %d tensors element by element %s", c, n, ok ? "" : why);
    xmesh_plan_destroy(plan);
    for (int k = 0; k < n; k++)
        free_case(&ts[k]);
}

/* ------------------------------------------------------------ refusals */

static int has(const char *needle)
{
    return strstr(xmesh_last_error(), needle) != NULL;
}

static void run_refusals(void)
{
    if (g_size < 2) { /* one rank cannot disagree with itself */
        report(1, "refusals across ranks: skipped with one rank");
        return;
    }
    int shape[1] = {g_size}, ranks[64];
    for (int i = 0; i < g_size; i++)
        ranks[i] = i;
    int rev[64];
    for (int i = 0; i < g_size; i++)
        rev[i] = g_size - 1 - i;
    xmesh_mesh_t all, back;
    xmesh_mesh_create(g_ctx, 1, shape, ranks, &all);
    xmesh_mesh_create(g_ctx, 1, shape, rev, &back);
    int64_t s0[2] = {2 * g_size, 3}, s1[1] = {5}, s2[2] = {g_size, g_size};
    xmesh_layout_t src[3] = {{2, s0, XMESH_F32, all, "S0R"},
                             {1, s1, XMESH_BF16, back, "B"},
                             {2, s2, XMESH_I32, all, "RS0"}};
    xmesh_layout_t dst[3] = {{2, s0, XMESH_F32, back, "RS0"},
                             {1, s1, XMESH_F32, all, "S0"},
                             {2, s2, XMESH_I32, back, "S0R"}};
    xmesh_plan_t plan = (xmesh_plan_t)0x77;

    /* rank 0 passes one tensor fewer */
    xmesh_result_t r = xmesh_plan_create_many(g_ctx, g_rank == 0 ? 2 : 3, src, dst, NULL, &plan);
    report(r == XMESH_ERR_MISMATCH && has("numbers of tensors") && plan == (xmesh_plan_t)0x77,
           "n differs across ranks: %d '%s'", (int)r, xmesh_last_error());
    /* rank 0 passes another sharding for tensor 2, then another dtype for tensor 1 */
    src[2].sharding = g_rank == 0 ? "S0R" : "RS0";
    r = xmesh_plan_create_many(g_ctx, 3, src, dst, NULL, &plan);
    report(r == XMESH_ERR_MISMATCH && has("tensor 2:") && plan == (xmesh_plan_t)0x77,
           "layout of tensor 2 differs across ranks: %d '%s'", (int)r, xmesh_last_error());
    src[2].sharding = "RS0";
    dst[1].dtype = g_rank == g_size - 1 ? XMESH_F16 : XMESH_F32;
    r = xmesh_plan_create_many(g_ctx, 3, src, dst, NULL, &plan);
    report(r == XMESH_ERR_MISMATCH && has("tensor 1:") && plan == (xmesh_plan_t)0x77,
           "dtype of tensor 1 differs across ranks: %d '%s'", (int)r, xmesh_last_error());
    dst[1].dtype = XMESH_F32;
    /* a bad layout on one rank only: that rank names it, the others REMOTE */
    dst[0].sharding = g_rank == 0 ? "S0S0" : "RS0";
    r = xmesh_plan_create_many(g_ctx, 3, src, dst, NULL, &plan);
    report(g_rank == 0 ? r == XMESH_ERR_INVALID_ARGUMENT && has("tensor 0:")
                       : r == XMESH_ERR_REMOTE,
           "bad layout of tensor 0 on rank 0: %d '%s'", (int)r, xmesh_last_error());
    dst[0].sharding = "RS0";
    r = xmesh_plan_create_many(g_ctx, 0, src, dst, NULL, &plan);
    report(r == XMESH_ERR_INVALID_ARGUMENT && has("n = 0"), "n = 0: %d '%s'", (int)r,
           xmesh_last_error());
    r = xmesh_plan_create_many(g_ctx, 3, src, NULL, NULL, &plan);
    report(r == XMESH_ERR_INVALID_ARGUMENT && has("destination layout array is NULL"),
           "NULL array: %d '%s'", (int)r, xmesh_last_error());

    /* a good plan; every rank holds a source block of tensor 0 */
    r = xmesh_plan_create_many(g_ctx, 3, src, dst, NULL, &plan);
    report(r == XMESH_SUCCESS, "plan of 3: %s", r ? xmesh_last_error() : "created");
    if (r)
        return;
    float b0[6], d0[2 * 64 * 3];
    uint16_t b1[5];
    float d1[5];
    int32_t b2[64], d2[64];
    for (int i = 0; i < 6; i++)
        b0[i] = (float)i;
    for (int i = 0; i < 5; i++)
        b1[i] = 0;
    for (int i = 0; i < g_size; i++)
        b2[i] = i;
    const void *sp[3] = {NULL, b1, b2};
    void *dp[3] = {d0, d1, d2};
    memset(d0, 0x5a, sizeof d0);
    unsigned char keep[sizeof d0];
    memcpy(keep, d0, sizeof d0);
    r = xmesh_reshard_many(plan, sp, dp);
    report(r == XMESH_ERR_INVALID_ARGUMENT && has("tensor 0: src_locals[0] is NULL") &&
               !memcmp(keep, d0, sizeof d0),
           "NULL block where the rank holds one: %d '%s'", (int)r, xmesh_last_error());
    r = xmesh_reshard_many(plan, NULL, dp);
    report(r == XMESH_ERR_INVALID_ARGUMENT && has("src_locals is NULL"),
           "NULL source array: %d '%s'", (int)r, xmesh_last_error());
    /* the plan still works after the refusals */
    sp[0] = b0;
    r = xmesh_reshard_many(plan, sp, dp);
    int ok = r == XMESH_SUCCESS;
    /* tensor 0: S0R on `all` -> RS0 on `back`: this rank (mesh index
     * size-1-rank on back) holds column (size - 1 - rank) % 3 share */
    int64_t ext[2], off[2];
    int holds;
    xmesh_layout_local_shape(&dst[0], g_rank, ext, &holds);
    xmesh_layout_local_offset(&dst[0], g_rank, off, &holds);
    for (int64_t i = 0; ok && i < ext[0]; i++)
        for (int64_t j = 0; ok && j < ext[1]; j++) {
            int64_t row = off[0] + i, col = off[1] + j;
            /* row r lives on rank r / 2 as element (r % 2) * 3 + col */
            ok = d0[i * ext[1] + j] == (float)((row % 2) * 3 + col);
        }
    report(ok, "plan of 3 after refusals: %s", r ? xmesh_last_error() : "data checked");
    xmesh_plan_destroy(plan);
    xmesh_mesh_destroy(all);
    xmesh_mesh_destroy(back);
}

int main(int argc, char **argv)
{
    int cases = 20, per_host = 2, level = MPI_THREAD_MULTIPLE, provided;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--cases") && i + 1 < argc)
            cases = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--per-host") && i + 1 < argc)
            per_host = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-v"))
            g_verbose = 1;
        else if (!strcmp(argv[i], "--level") && i + 1 < argc) {
            const char *l = argv[++i];
            level = !strcmp(l, "single")       ? MPI_THREAD_SINGLE
                    : !strcmp(l, "funneled")   ? MPI_THREAD_FUNNELED
                    : !strcmp(l, "serialized") ? MPI_THREAD_SERIALIZED
                                               : MPI_THREAD_MULTIPLE;
        }
    }
    MPI_Init_thread(&argc, &argv, level, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    if (g_size > 64) {
        if (g_rank == 0)
            fprintf(stderr, "test_many_mpi: at most 64 ranks\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    xmesh_ctx_params_t cp = XMESH_CTX_PARAMS_INITIALIZER;
    cp.host_id = g_rank / (per_host > 0 ? per_host : 1);
    if (xmesh_ctx_create_mpi(MPI_COMM_WORLD, &cp, &g_ctx)) {
        fprintf(stderr, "rank %d: %s\n", g_rank, xmesh_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    const char *s = getenv("XMESH_TEST_SEED");
    unsigned long long seed = s && *s ? strtoull(s, NULL, 0) : (unsigned long long)time(NULL);
    MPI_Bcast(&seed, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
    if (g_rank == 0) {
        printf("test_many_mpi%s: %d ranks, %d per host, %d cases, seed %llu (replay with "
               "XMESH_TEST_SEED=%llu)\n",
#ifdef XMESH_TEST_UCX
               " over UCX",
#else
               "",
#endif
               g_size, per_host, cases, seed, seed);
        fflush(stdout);
    }
    rng = seed;
    tcase_t *ts = calloc(MAX_T, sizeof *ts);
    for (int c = 0; c < cases; c++)
        run_case(c, ts);
    run_refusals();
    free(ts);
    xmesh_ctx_destroy(g_ctx);
    if (g_rank == 0)
        printf("test_many_mpi: %d passed, %d failed (seed %llu)\n", g_pass, g_fail, seed);
    MPI_Finalize();
    return g_fail ? 1 : 0;
}
