/* Distributed checkpoints (pipeline/ckpt) under MPI.
 *
 * 1. Matrix: random layouts (meshes of 1-4 axes over random subsets and
 *    orders of the ranks, S / B per axis, uneven and empty splits, storage
 *    SBPs, f32 and i32, 0-3 dims, empty tensors) saved on nA ranks and loaded on nB ranks
 *    into other random layouts (P destinations too), through xmesh plans and
 *    through direct reads, for (nA, nB) in {(W,W), (W,2), (W,4), (2,W),
 *    (1,W), (W,1), (3,W)} where W is the world size; every element checked;
 *    the shard files hold exactly the bytes of the tensors (unique data).
 * 2. keep K.
 * 3. Atomicity: a save stopped after some ranks wrote their shard
 *    (xmp_ckpt_test_crash_after) leaves the previous step loadable and the
 *    partial one ignored, and the next save removes it.
 * 4. Bad input: corrupted, truncated and missing shards, another format
 *    version, a corrupted manifest, another model (metadata), unknown
 *    tensor, shape and dtype mismatch, strict load, P tensors: each a
 *    failure on every rank with the expected message and the destination
 *    untouched.
 * Usage: test_ckpt [--seed S] [--trials N] [--keep-dir DIR]
 *        test_ckpt --save-only DIR STEP
 *   (--keep-dir: also save one small checkpoint to DIR and keep it, for
 *   the xmesh-ckpt info test; --save-only: that save and nothing else, for
 *   the crash test). */
#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xmesh/mpi.h>

#include "ckpt/ckpt.h"

#define TEST_FAIL_CAP 30
#include "test_report.h"

static int g_world;
static uint64_t g_seed = 20261125;

/* ---------------------------------------------------------------- random */

static uint64_t g_rng;
static uint64_t rnd(void)
{
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static int rndi(int n)
{
    return (int)(rnd() % (uint64_t)n);
}

/* element i of tensor tag: 32 random bits (any f32 / i32 pattern but NaN) */
static uint32_t val(uint64_t tag, int64_t i)
{
    uint64_t z = g_seed * 0x9e3779b97f4a7c15ull + tag * 0xbf58476d1ce4e5b9ull + (uint64_t)i;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    uint32_t v = (uint32_t)z;
    if ((v & 0x7f800000u) == 0x7f800000u) /* keep f32 comparisons exact: no NaN/inf */
        v &= 0xbfffffffu;
    return v;
}
#define SENTINEL 0x7fc0dead /* never produced by val() */

/* ---------------------------------------------------------------- layouts */

typedef struct {
    int ndim, mshape[4], ranks[16], size;
    int tnd;
    int64_t shape[8];
    xmesh_dtype_t dtype;
    xmp_sbp_t sbp[4], store[4];
    int has_store;
} lay_t;

/* Random mesh over a random subset (random order) of n ranks; the tensor
 * shape is given. allow_p: P allowed on some axis (destinations only). */
static void rand_layout(lay_t *L, int n, int allow_p)
{
    int total;
    do {
        L->ndim = 1 + rndi(4);
        total = 1;
        for (int a = 0; a < L->ndim; a++) {
            L->mshape[a] = 1 + rndi(n < 4 ? n : 4);
            total *= L->mshape[a];
        }
    } while (total > n);
    L->size = total;
    int perm[16];
    for (int i = 0; i < n; i++)
        perm[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j = rndi(i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int i = 0; i < total; i++)
        L->ranks[i] = perm[i];
    L->has_store = rndi(3) == 0;
    for (int a = 0; a < L->ndim; a++) {
        int k = rndi(10);
        if (L->tnd > 0 && k < 6)
            L->sbp[a] = xmp_sbp_s(rndi(L->tnd));
        else if (allow_p && k == 9)
            L->sbp[a] = xmp_sbp_p();
        else
            L->sbp[a] = xmp_sbp_b();
        L->store[a] = L->sbp[a];
        if (L->has_store && L->tnd > 0 && L->sbp[a].kind == XMP_B && rndi(2))
            L->store[a] = xmp_sbp_s(rndi(L->tnd));
    }
}

static void lay_str(const lay_t *L, char *buf, size_t n)
{
    char s[64], st[64];
    xmp_sbp_string(L->sbp, L->ndim, s, sizeof s);
    xmp_sbp_string(L->store, L->ndim, st, sizeof st);
    size_t o = (size_t)snprintf(buf, n, "mesh ");
    for (int a = 0; a < L->ndim; a++)
        o += (size_t)snprintf(buf + o, n - o, "%s%d", a ? "x" : "", L->mshape[a]);
    snprintf(buf + o, n - o, " sbp %s%s%s", s, L->has_store ? " store " : "",
             L->has_store ? st : "");
}

static int64_t gindex(const xmp_tensor_t *t, int64_t li)
{
    int64_t g = 0, rem = li, idx[8];
    for (int d = t->ndim - 1; d >= 0; d--) {
        idx[d] = t->lshape[d] ? rem % t->lshape[d] : 0;
        rem = t->lshape[d] ? rem / t->lshape[d] : 0;
    }
    for (int d = 0; d < t->ndim; d++)
        g = g * t->shape[d] + t->loff[d] + idx[d];
    return g;
}

static void fill(xmp_tensor_t *t, uint64_t tag)
{
    uint32_t *p = t->data;
    for (int64_t i = 0; i < t->lcount; i++)
        p[i] = val(tag, gindex(t, i));
}

static void fill_sentinel(xmp_tensor_t *t)
{
    uint32_t *p = t->data;
    for (int64_t i = 0; i < t->lcount; i++)
        p[i] = SENTINEL;
}

/* every element of t equal to val(tag) (or 0 off the holder of a P axis) */
static int64_t check(const xmp_tensor_t *t, uint64_t tag)
{
    int zero = 0;
    for (int a = 0; a < t->mesh->ndim; a++)
        if (t->sbp[a].kind == XMP_P && t->mesh->coord[a] != 0)
            zero = 1;
    const uint32_t *p = t->data;
    int64_t bad = 0;
    for (int64_t i = 0; i < t->lcount; i++) {
        uint32_t want = zero ? 0u : val(tag, gindex(t, i));
        if (p[i] != want && bad++ < 3)
            FAIL("tensor element %" PRId64 " (global %" PRId64 "): 0x%08x, want 0x%08x", i,
                 gindex(t, i), p[i], want);
    }
    return bad;
}

static int untouched(const xmp_tensor_t *t)
{
    const uint32_t *p = t->data;
    for (int64_t i = 0; i < t->lcount; i++)
        if (p[i] != SENTINEL)
            return 0;
    return 1;
}

static MPI_Comm sub_comm(int n)
{
    MPI_Comm c;
    MPI_Comm_split(MPI_COMM_WORLD, g_rank < n ? 0 : MPI_UNDEFINED, g_rank, &c);
    return c;
}

static int64_t dir_bytes(const char *dir)
{
    DIR *d = opendir(dir);
    int64_t s = 0;
    struct dirent *e;
    if (!d)
        return -1;
    while ((e = readdir(d))) {
        char p[1200];
        struct stat st;
        if (strncmp(e->d_name, "rank-", 5) != 0)
            continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (stat(p, &st) == 0)
            s += st.st_size;
    }
    closedir(d);
    return s;
}

static char g_root[512];
static int g_plan_tensors, g_direct_tensors;

/* ---------------------------------------------------------------- 1. matrix */

#define NT 3

/* The NT meshes and tensors of layouts L on comm (zeroed first; FAIL on a setup error). */
static void make_set(MPI_Comm comm, const lay_t *L, xmp_mesh_t **m, xmp_tensor_t *t)
{
    memset(t, 0, sizeof(xmp_tensor_t) * NT);
    for (int i = 0; i < NT; i++) {
        m[i] = NULL;
        if (xmp_mesh_create(comm, NULL, L[i].ndim, L[i].mshape, L[i].ranks, &m[i]) ||
            xmp_tensor_alloc(&t[i], m[i], L[i].tnd, L[i].shape, L[i].dtype, L[i].sbp))
            FAIL("setup: %s", xmp_last_error());
    }
}

static void matrix_case(int nA, int nB, int trial, unsigned flags)
{
    lay_t A[NT], B[NT];
    for (int i = 0; i < NT; i++) {
        A[i].tnd = rndi(8) == 0 ? 0 : 1 + rndi(3);
        for (int d = 0; d < A[i].tnd; d++)
            A[i].shape[d] = rndi(40) == 0 ? 0 : rndi(9) == 0 ? 1 + rndi(2) : 1 + rndi(9);
        A[i].dtype = rndi(2) ? XMESH_F32 : XMESH_I32;
        rand_layout(&A[i], nA, 0);
        B[i].tnd = A[i].tnd;
        memcpy(B[i].shape, A[i].shape, sizeof B[i].shape);
        B[i].dtype = A[i].dtype;
        rand_layout(&B[i], nB, 1);
    }
    char root[700];
    snprintf(root, sizeof root, "%s/matrix-%d-%d-%d", g_root, nA, nB, trial);
    char names[NT][16];
    uint64_t tag0 = (uint64_t)trial * 1000 + (uint64_t)nA * 10 + (uint64_t)nB;
    int64_t bytes = 0;
    for (int i = 0; i < NT; i++) {
        snprintf(names[i], sizeof names[i], "t%d.w", i);
        int64_t n = 1;
        for (int d = 0; d < A[i].tnd; d++)
            n *= A[i].shape[d];
        bytes += n * 4;
    }
    xmesh_result_t r = XMESH_SUCCESS;
    MPI_Comm ca = sub_comm(nA), cb = sub_comm(nB);
    if (ca != MPI_COMM_NULL) {
        xmp_mesh_t *m[NT] = {0};
        xmp_tensor_t t[NT];
        xmp_ckpt_tensor_t ts[NT];
        int nts = 0;
        make_set(ca, A, m, t);
        for (int i = 0; i < NT; i++) {
            fill(&t[i], tag0 * 8 + (uint64_t)i);
            if (m[i]->member) { /* non-members leave the tensor out */
                ts[nts].name = names[i];
                ts[nts].t = &t[i];
                ts[nts].store = A[i].has_store ? A[i].store : NULL;
                nts++;
            }
        }
        xmp_ckpt_kv_t meta[2] = {{"model", "matrix"}, {"note", "line1\nline2 \\ end"}};
        r = xmp_ckpt_save(ca, root, trial, ts, nts, meta, 2, 0);
        if (r)
            FAIL("save nA=%d trial %d: %s", nA, trial, xmp_last_error());
        for (int i = 0; i < NT; i++) {
            xmp_tensor_free(&t[i]);
            xmp_mesh_destroy(m[i]);
        }
        MPI_Comm_free(&ca);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (g_rank == 0 && !r) {
        char d[800];
        snprintf(d, sizeof d, "%s/step-%08d", root, trial);
        int64_t fb = dir_bytes(d);
        if (fb != bytes)
            FAIL("nA=%d trial %d: shard files hold %" PRId64 " bytes, the tensors %" PRId64
                 " (unique data only)",
                 nA, trial, fb, bytes);
    }
    if (cb != MPI_COMM_NULL) {
        xmesh_ctx_t ctx = NULL;
        xmp_ckpt_t *c = NULL;
        if (xmesh_ctx_create_mpi(cb, NULL, &ctx))
            FAIL("ctx: %s", xmesh_last_error());
        r = xmp_ckpt_open(cb, root, &c);
        if (r) {
            FAIL("open: %s", xmp_last_error());
        } else {
            if (xmp_ckpt_step(c) != trial || !xmp_ckpt_meta(c, "note") ||
                strcmp(xmp_ckpt_meta(c, "note"), "line1\nline2 \\ end") != 0)
                FAIL("manifest step %" PRId64 " / metadata 'note' wrong", xmp_ckpt_step(c));
            xmp_mesh_t *m[NT] = {0};
            xmp_tensor_t t[NT];
            xmp_ckpt_tensor_t ts[NT];
            int nts = 0;
            make_set(cb, B, m, t);
            for (int i = 0; i < NT; i++) {
                fill_sentinel(&t[i]);
                if (m[i]->member || rndi(2)) { /* non-members may pass it too */
                    ts[nts].name = names[i];
                    ts[nts].t = &t[i];
                    ts[nts].store = NULL;
                    nts++;
                }
            }
            xmp_ckpt_kv_t expect[1] = {{"model", "matrix"}};
            r = xmp_ckpt_load(cb, (flags & XMP_CKPT_LOAD_DIRECT) ? NULL : ctx, c, ts, nts, expect,
                              1, flags | XMP_CKPT_STRICT);
            if (r)
                FAIL("load: %s", xmp_last_error());
            /* who read what: plans for the tensors whose saved blocks fit
             * the ranks (each saved block read once, by one rank), direct
             * reads otherwise (each rank exactly its destination block) */
            xmp_ckpt_load_info_t li;
            xmp_ckpt_last_load_info(&li);
            int want_plan = 0, big_plans = 0;
            int64_t budget = 0, small_bytes = 0;
            xmesh_param_get_int("XMESH_CKPT_PLAN_BYTES", &budget);
            int64_t plan_bytes = 0, direct_mine = 0, sum[2], mine[2];
            for (int i = 0; i < NT; i++) {
                int u = 1;
                int64_t nb = 4;
                for (int a = 0; a < A[i].ndim; a++)
                    u *= A[i].store[a].kind == XMP_S ? A[i].mshape[a] : 1;
                for (int d = 0; d < A[i].tnd; d++)
                    nb *= A[i].shape[d];
                if (!(flags & XMP_CKPT_LOAD_DIRECT) && u <= nB) {
                    want_plan++;
                    plan_bytes += nb;
                    big_plans += nb > budget;
                    small_bytes += nb > budget ? 0 : nb;
                } else if (m[i]->member) {
                    direct_mine += t[i].lcount * 4;
                }
            }
            mine[0] = li.bytes_read;
            mine[1] = direct_mine;
            MPI_Allreduce(mine, sum, 2, MPI_INT64_T, MPI_SUM, cb);
            /* plans of many: one while the tensors fit XMESH_CKPT_PLAN_BYTES, one per tensor
             * at 0 */
            /* a tensor above the budget has a plan of its own; the others fill plans of at
             * most the budget */
            int min_plans = !want_plan    ? 0
                            : budget <= 0 ? want_plan
                                          : big_plans + (int)((small_bytes + budget - 1) / budget);
            int max_plans = budget <= 0 || budget >= plan_bytes ? min_plans : want_plan;
            if (!r && (li.plans < min_plans || li.plans > max_plans))
                FAIL("nA=%d nB=%d trial %d: %d tensors (%" PRId64 " bytes) by %d plans, want "
                     "%d..%d (XMESH_CKPT_PLAN_BYTES %" PRId64 ")",
                     nA, nB, trial, want_plan, plan_bytes, li.plans, min_plans, max_plans, budget);
            if (!r && (li.tensors_plan != want_plan || li.tensors_direct != NT - want_plan ||
                       sum[0] != plan_bytes + sum[1]))
                FAIL("nA=%d nB=%d trial %d: %d tensors by plan (want %d), %d direct; %" PRId64
                     " bytes read by all ranks, want %" PRId64,
                     nA, nB, trial, li.tensors_plan, want_plan, li.tensors_direct, sum[0],
                     plan_bytes + sum[1]);
            g_plan_tensors += li.tensors_plan;
            g_direct_tensors += li.tensors_direct;
            for (int i = 0; i < NT; i++) {
                if (!r && check(&t[i], tag0 * 8 + (uint64_t)i)) {
                    char la[160], lb[160];
                    lay_str(&A[i], la, sizeof la);
                    lay_str(&B[i], lb, sizeof lb);
                    FAIL("nA=%d nB=%d trial %d tensor %d (%s dims", nA, nB, trial, i,
                         xmesh_dtype_name(B[i].dtype));
                    FAIL("   saved %s -> loaded %s, flags %u", la, lb, flags);
                }
                xmp_tensor_free(&t[i]);
                xmp_mesh_destroy(m[i]);
            }
            xmp_ckpt_close(c);
        }
        xmesh_ctx_destroy(ctx);
        MPI_Comm_free(&cb);
    }
    /* the rndi() calls above ran on cb ranks only: resynchronise the stream */
    MPI_Bcast(&g_rng, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
}

/* ---------------------------------------------------------------- helpers */

/* A small checkpoint's two tensors on one mesh of the world: w (6 x cols, dtype dt, SBP sw)
 * and b (7, F32, SBP sb); the mesh has nd axes of the given shape over ranks. */
typedef struct {
    xmp_mesh_t *m;
    xmp_tensor_t w, b;
} small_t;

static void pair_make(small_t *s, int nd, const int *shape, const int *ranks, const xmp_sbp_t *sw,
                      const xmp_sbp_t *sb, int64_t cols, xmesh_dtype_t dt)
{
    int64_t ws[2] = {6, cols}, bs[1] = {7};
    if (xmp_mesh_create(MPI_COMM_WORLD, NULL, nd, shape, ranks, &s->m) ||
        xmp_tensor_alloc(&s->w, s->m, 2, ws, dt, sw) ||
        xmp_tensor_alloc(&s->b, s->m, 1, bs, XMESH_F32, sb))
        FAIL("small setup: %s", xmp_last_error());
}

static void small_free(small_t *s)
{
    xmp_tensor_free(&s->w);
    xmp_tensor_free(&s->b);
    xmp_mesh_destroy(s->m);
}

/* The saved layout: w B,S(0) and b S(0),B on a 2 x world/2 mesh (1 x world below 4 ranks),
 * holding step step_tag's values. */
static void small_make(small_t *s, int64_t cols, xmesh_dtype_t dt, int step_tag)
{
    int shape[2] = {g_world >= 4 ? 2 : 1, g_world >= 4 ? g_world / 2 : g_world};
    int ranks[16];
    for (int i = 0; i < shape[0] * shape[1]; i++)
        ranks[i] = i;
    xmp_sbp_t sw[2] = {xmp_sbp_b(), xmp_sbp_s(0)}, sb[2] = {xmp_sbp_s(0), xmp_sbp_b()};
    pair_make(s, 2, shape, ranks, sw, sb, cols, dt);
    fill(&s->w, 900000 + (uint64_t)step_tag * 2);
    fill(&s->b, 900001 + (uint64_t)step_tag * 2);
}

static xmesh_result_t small_save(const char *root, int64_t step, int keep)
{
    small_t s;
    small_make(&s, 5, XMESH_F32, (int)step);
    xmp_ckpt_tensor_t ts[2] = {{"w", &s.w, NULL}, {"b", &s.b, NULL}};
    xmp_ckpt_kv_t meta[2] = {{"model", "tiny"}, {"data.pos", "123"}};
    xmesh_result_t r = xmp_ckpt_save(MPI_COMM_WORLD, root, step, ts, 2, meta, 2, keep);
    small_free(&s);
    return r;
}

/* Loads root into a fresh 1-axis layout (S(1) / B) and checks it holds
 * step `step`'s values. */
static xmesh_result_t small_load_check(const char *root, int64_t step)
{
    xmp_ckpt_t *c = NULL;
    xmesh_result_t r = xmp_ckpt_open(MPI_COMM_WORLD, root, &c);
    if (r)
        return r;
    if (xmp_ckpt_step(c) != step)
        FAIL("%s: opened step %" PRId64 ", want %" PRId64, root, xmp_ckpt_step(c), step);
    int shape[1] = {g_world}, ranks[16];
    for (int i = 0; i < g_world; i++)
        ranks[i] = g_world - 1 - i;
    small_t s;
    xmp_sbp_t sw[1] = {xmp_sbp_s(1)}, sb[1] = {xmp_sbp_b()};
    pair_make(&s, 1, shape, ranks, sw, sb, 5, XMESH_F32);
    xmp_ckpt_tensor_t ts[2] = {{"w", &s.w, NULL}, {"b", &s.b, NULL}};
    r = xmp_ckpt_load(MPI_COMM_WORLD, NULL, c, ts, 2, NULL, 0, XMP_CKPT_STRICT);
    if (!r) {
        check(&s.w, 900000 + (uint64_t)step * 2);
        check(&s.b, 900001 + (uint64_t)step * 2);
    }
    small_free(&s);
    xmp_ckpt_close(c);
    return r;
}

static int exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

/* ---------------------------------------------------------------- 2, 3 */

static void test_keep(void)
{
    char root[700], p[800];
    snprintf(root, sizeof root, "%s/keep", g_root);
    for (int s = 1; s <= 5; s++)
        if (small_save(root, s, 2))
            FAIL("keep: save %d: %s", s, xmp_last_error());
    if (g_rank == 0)
        for (int s = 1; s <= 5; s++) {
            snprintf(p, sizeof p, "%s/step-%08d", root, s);
            if (exists(p) != (s >= 4))
                FAIL("keep 2: %s %s", p, exists(p) ? "still exists" : "missing");
        }
    char lp[800];
    int64_t ls = -1;
    if (g_rank == 0 && (xmp_ckpt_latest(root, lp, sizeof lp, &ls) || ls != 5))
        FAIL("keep: latest is %" PRId64 ", want 5", ls);
    if (small_load_check(root, 5))
        FAIL("keep: load: %s", xmp_last_error());
    /* the same step saved again replaces it */
    if (small_save(root, 5, 2) || small_load_check(root, 5))
        FAIL("keep: resave step 5: %s", xmp_last_error());
    /* a run resumed from an earlier step: step 3 saved after 4 and 5 is the
     * latest (ROOT/LATEST), kept with the newest other one (5) */
    if (small_save(root, 3, 2) || small_load_check(root, 3))
        FAIL("keep: save step 3 after 5: %s", xmp_last_error());
    if (g_rank == 0)
        for (int s = 3; s <= 5; s++) {
            snprintf(p, sizeof p, "%s/step-%08d", root, s);
            if (exists(p) != (s != 4))
                FAIL("keep 2 after saving step 3: %s %s", p, exists(p) ? "exists" : "missing");
        }
    /* without LATEST: the highest step */
    snprintf(p, sizeof p, "%s/LATEST", root);
    MPI_Barrier(MPI_COMM_WORLD);
    if (g_rank == 0 && unlink(p) != 0)
        FAIL("keep: no %s", p);
    MPI_Barrier(MPI_COMM_WORLD);
    if (small_load_check(root, 5))
        FAIL("keep: load without LATEST: %s", xmp_last_error());
    MPI_Barrier(MPI_COMM_WORLD);
}

static void test_atomic(void)
{
    char root[700], p[800];
    snprintf(root, sizeof root, "%s/atomic", g_root);
    if (small_save(root, 10, 0))
        FAIL("atomic: save 10: %s", xmp_last_error());
    int crash_after = g_world / 2;
    xmp_ckpt_test_crash_after(crash_after);
    xmesh_result_t r = small_save(root, 11, 0);
    xmp_ckpt_test_crash_after(-1);
    if (r != XMESH_ERR_INTERNAL || !strstr(xmp_last_error(), "simulated crash"))
        FAIL("atomic: interrupted save returned %d '%s'", (int)r, xmp_last_error());
    MPI_Barrier(MPI_COMM_WORLD);
    if (g_rank == 0) {
        snprintf(p, sizeof p, "%s/.step-00000011.tmp/rank-00000.bin", root);
        if (crash_after > 0 && !exists(p))
            FAIL("atomic: the interrupted save left no partial shard %s (test proves nothing)", p);
        snprintf(p, sizeof p, "%s/step-00000011", root);
        if (exists(p))
            FAIL("atomic: %s exists after an interrupted save", p);
    }
    /* the previous checkpoint loads, the partial one is ignored */
    if (small_load_check(root, 10))
        FAIL("atomic: load after crash: %s", xmp_last_error());
    /* the next save removes the leftovers */
    if (small_save(root, 12, 0) || small_load_check(root, 12))
        FAIL("atomic: save 12: %s", xmp_last_error());
    MPI_Barrier(MPI_COMM_WORLD);
    snprintf(p, sizeof p, "%s/.step-00000011.tmp", root);
    if (g_rank == 0 && exists(p))
        FAIL("atomic: %s not removed by the next save", p);
}

/* metadata builder and typed getters */
static void test_meta(void)
{
    char root[700];
    snprintf(root, sizeof root, "%s/meta", g_root);
    xmp_ckpt_metalist_t ml = {0};
    xmesh_result_t r = XMESH_SUCCESS;
    for (int i = 0; i < 20 && !r; i++) /* grows past the first capacity */
        r = xmp_ckpt_metalist_setf(&ml, i ? "filler" : "model", "%s%d", i ? "x" : "tiny", i);
    char key[32];
    for (int i = 0; i < 20 && !r; i++) {
        snprintf(key, sizeof key, "k%02d", i);
        r = xmp_ckpt_metalist_setf(&ml, key, "%d", i * 7);
    }
    if (!r)
        r = xmp_ckpt_metalist_setf(&ml, "model", "tiny"); /* replaced in place */
    if (!r)
        r = xmp_ckpt_metalist_setf(&ml, "lr", "%.17g", 3e-4);
    if (!r)
        r = xmp_ckpt_metalist_setf(&ml, "rng", "%llu:%d", 0xfedcba9876543210ull, -5);
    if (r || ml.n != 24 || strcmp(ml.kv[0].key, "model") || strcmp(ml.kv[0].value, "tiny") ||
        strcmp(ml.kv[1].value, "x19"))
        FAIL("metalist: %d entries, first '%s'='%s': %s", ml.n, ml.n ? ml.kv[0].key : "",
             ml.n ? ml.kv[0].value : "", xmp_last_error());
    if (xmp_ckpt_metalist_setf(&ml, "bad key", "1") == XMESH_SUCCESS)
        FAIL("metalist: a key with a blank accepted");
    small_t sm;
    small_make(&sm, 5, XMESH_F32, 1);
    xmp_ckpt_tensor_t ts[2] = {{"w", &sm.w, NULL}, {"b", &sm.b, NULL}};
    if (xmp_ckpt_save(MPI_COMM_WORLD, root, 1, ts, 2, ml.kv, ml.n, 0))
        FAIL("meta save: %s", xmp_last_error());
    small_free(&sm);
    xmp_ckpt_metalist_free(&ml);
    xmp_ckpt_t *c = NULL;
    if (xmp_ckpt_open(MPI_COMM_WORLD, root, &c)) {
        FAIL("meta open: %s", xmp_last_error());
        return;
    }
    int64_t v = -1;
    double lr = 0;
    if (xmp_ckpt_meta_count(c) != 24 || xmp_ckpt_meta_i64(c, "k13", &v) || v != 91 ||
        xmp_ckpt_meta_f64(c, "lr", &lr) || lr != 3e-4 ||
        strcmp(xmp_ckpt_meta(c, "rng"), "18364758544493064720:-5") != 0)
        FAIL("meta: %d entries, k13 = %" PRId64 ", lr = %g, rng = %s: %s", xmp_ckpt_meta_count(c),
             v, lr, xmp_ckpt_meta(c, "rng"), xmp_last_error());
    v = 42;
    if (xmp_ckpt_meta_i64(c, "filler", &v) == XMESH_SUCCESS || v != 42 ||
        !strstr(xmp_last_error(), "metadata 'filler' = 'x19' is not an integer"))
        FAIL("meta: non-integer: '%s'", xmp_last_error());
    if (xmp_ckpt_meta_f64(c, "absent", &lr) == XMESH_SUCCESS ||
        !strstr(xmp_last_error(), "no metadata 'absent'"))
        FAIL("meta: missing key: '%s'", xmp_last_error());
    xmp_ckpt_close(c);
}

/* ---------------------------------------------------------------- 4 */

/* expects the same failure on every rank, msg containing both strings, and
 * the destination untouched */
static void expect_fail(const char *what, xmesh_result_t r, const char *s1, const char *s2,
                        const xmp_tensor_t *w, const xmp_tensor_t *b)
{
    int mn, mx, v = (int)r;
    MPI_Allreduce(&v, &mn, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&v, &mx, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (r == XMESH_SUCCESS || mn != mx)
        FAIL("%s: result %d (min %d max %d over ranks), want the same failure everywhere", what, v,
             mn, mx);
    if ((s1 && !strstr(xmp_last_error(), s1)) || (s2 && !strstr(xmp_last_error(), s2)))
        FAIL("%s: message '%s' lacks '%s' / '%s'", what, xmp_last_error(), s1 ? s1 : "",
             s2 ? s2 : "");
    if ((w && !untouched(w)) || (b && !untouched(b)))
        FAIL("%s: destination written", what);
    if (g_rank == 0 && getenv("TEST_CKPT_VERBOSE"))
        printf("  %-22s -> %s\n", what, xmp_last_error());
}

/* The default destination: w B,S(1) and b B,S(0) on a 1 x world mesh, sentinel-filled. */
static void dst_make(small_t *d, int64_t cols, xmesh_dtype_t dt)
{
    int shape[2] = {1, g_world}, ranks[16];
    for (int i = 0; i < g_world; i++)
        ranks[i] = i;
    xmp_sbp_t sw[2] = {xmp_sbp_b(), xmp_sbp_s(1)}, sb[2] = {xmp_sbp_b(), xmp_sbp_s(0)};
    pair_make(d, 2, shape, ranks, sw, sb, cols, dt);
    fill_sentinel(&d->w);
    fill_sentinel(&d->b);
}

/* loads root (step dir or root) into the default destination */
static xmesh_result_t try_load(const char *root, small_t *d, const char *wname,
                               const xmp_ckpt_kv_t *expect, int nexpect, unsigned flags,
                               xmesh_ctx_t ctx)
{
    xmp_ckpt_t *c = NULL;
    xmesh_result_t r = xmp_ckpt_open(MPI_COMM_WORLD, root, &c);
    if (r)
        return r;
    xmp_ckpt_tensor_t ts[2] = {{wname, &d->w, NULL}, {"b", &d->b, NULL}};
    r = xmp_ckpt_load(MPI_COMM_WORLD, ctx, c, ts, 2, expect, nexpect, flags);
    xmp_ckpt_close(c);
    return r;
}

static void mutate(const char *path, int how)
{
    if (g_rank == 0) {
        if (how == 0) { /* flip one byte in the middle */
            int fd = open(path, O_RDWR);
            struct stat st;
            unsigned char ch;
            fstat(fd, &st);
            off_t o = st.st_size / 2;
            if (pread(fd, &ch, 1, o) != 1)
                FAIL("mutate: read %s", path);
            ch ^= 0x10;
            if (pwrite(fd, &ch, 1, o) != 1)
                FAIL("mutate: write %s", path);
            close(fd);
        } else if (how == 1) { /* drop the last 4 bytes */
            struct stat st;
            stat(path, &st);
            if (truncate(path, st.st_size - 4) != 0)
                FAIL("mutate: truncate %s", path);
        } else {
            unlink(path);
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

static void rewrite_manifest(const char *path, const char *from, const char *to)
{
    if (g_rank == 0) {
        FILE *f = fopen(path, "rb");
        char buf[65536];
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = 0;
        char *p = strstr(buf, from);
        if (!p) {
            FAIL("rewrite: '%s' not in %s", from, path);
        } else {
            char out[70000];
            snprintf(out, sizeof out, "%.*s%s%s", (int)(p - buf), buf, to, p + strlen(from));
            f = fopen(path, "wb");
            fputs(out, f);
            fclose(f);
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

static void test_bad(xmesh_ctx_t ctx)
{
    char root[700], step[800], p[900];
    small_t d;
    int target = g_world > 1 ? 1 : 0;
    for (int kase = 0; kase < 10; kase++) {
        snprintf(root, sizeof root, "%s/bad%d", g_root, kase);
        snprintf(step, sizeof step, "%s/step-00000003", root);
        if (small_save(root, 3, 0))
            FAIL("bad: save: %s", xmp_last_error());
        dst_make(&d, kase == 7 ? 4 : 5, kase == 8 ? XMESH_I32 : XMESH_F32);
        xmp_ckpt_kv_t model = {"model", kase == 5 ? "gpt2" : "tiny"};
        snprintf(p, sizeof p, "%s/rank-%05d.bin", step, target);
        unsigned fl = kase % 2 ? XMP_CKPT_LOAD_DIRECT : 0;
        char mp[900];
        snprintf(mp, sizeof mp, "%s/MANIFEST", step);
        xmesh_result_t r;
        switch (kase) {
        case 0:
            mutate(p, 0);
            r = try_load(root, &d, "w", &model, 1, fl, ctx);
            expect_fail("corrupted shard", r, p + strlen(root), "CRC32", &d.w, &d.b);
            break;
        case 1:
            mutate(p, 1);
            r = try_load(root, &d, "w", &model, 1, fl, ctx);
            expect_fail("truncated shard", r, p + strlen(root), "the manifest says", &d.w, &d.b);
            /* without the CRC pass the sizes are still checked */
            r = try_load(root, &d, "w", &model, 1, fl | XMP_CKPT_LOAD_NO_VERIFY, ctx);
            expect_fail("truncated, no CRC", r, p + strlen(root), "the manifest says", &d.w, &d.b);
            break;
        case 2:
            mutate(p, 2);
            r = try_load(step, &d, "w", &model, 1, fl, ctx);
            expect_fail("missing shard", r, p + strlen(root), "No such file", &d.w, &d.b);
            break;
        case 3:
            rewrite_manifest(mp, "xmesh-checkpoint 1", "xmesh-checkpoint 2");
            r = try_load(root, &d, "w", &model, 1, fl, ctx);
            expect_fail("format version", r, "MANIFEST: format version 2", "reads version 1", &d.w,
                        &d.b);
            break;
        case 4:
            rewrite_manifest(mp, "data.pos 123", "data.pos 124");
            r = try_load(root, &d, "w", &model, 1, fl, ctx);
            expect_fail("corrupted manifest", r, "MANIFEST: CRC32", "corrupted manifest", &d.w,
                        &d.b);
            break;
        case 5:
            r = try_load(root, &d, "w", &model, 1, fl, ctx);
            expect_fail("another model", r, "metadata 'model' is 'tiny', expected 'gpt2'", NULL,
                        &d.w, &d.b);
            break;
        case 6:
            r = try_load(root, &d, "w_typo", &model, 1, fl, ctx);
            expect_fail("unknown tensor", r, "tensor 'w_typo' is not in checkpoint", NULL, &d.w,
                        &d.b);
            break;
        case 7:
            r = try_load(root, &d, "w", &model, 1, fl, ctx);
            expect_fail("shape mismatch", r, "tensor 'w'", "shape [6,5], the destination [6,4]",
                        &d.w, &d.b);
            break;
        case 8:
            r = try_load(root, &d, "w", &model, 1, fl, ctx);
            expect_fail("dtype mismatch", r, "tensor 'w'", "dtype f32, the destination i32", &d.w,
                        &d.b);
            break;
        case 9: {
            /* strict: a saved tensor without destination */
            xmp_ckpt_t *c = NULL;
            r = xmp_ckpt_open(MPI_COMM_WORLD, root, &c);
            if (!r) {
                xmp_ckpt_tensor_t ts[1] = {{"b", &d.b, NULL}};
                r = xmp_ckpt_load(MPI_COMM_WORLD, ctx, c, ts, 1, NULL, 0, XMP_CKPT_STRICT);
                xmp_ckpt_close(c);
            }
            expect_fail("strict load", r, "tensor 'w' has no destination", NULL, &d.w, &d.b);
            break;
        }
        }
        /* the good case really loads: the same destination, no mutation (case 6
         * without the CRC pass: nothing checksummed) */
        if (kase >= 5 && kase <= 6) {
            fill_sentinel(&d.w);
            unsigned f2 = fl | (kase == 6 ? XMP_CKPT_LOAD_NO_VERIFY : 0);
            r = try_load(root, &d, "w", NULL, 0, f2, ctx);
            if (r || check(&d.w, 900000 + 6) || check(&d.b, 900001 + 6))
                FAIL("bad case %d: the unmutated load fails: %s", kase, xmp_last_error());
            xmp_ckpt_load_info_t li;
            int64_t checked;
            xmp_ckpt_last_load_info(&li);
            MPI_Allreduce(&li.bytes_checked, &checked, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
            if ((kase == 6) != (checked == 0))
                FAIL("bad case %d: %" PRId64 " bytes checksummed by all ranks (flags %u)", kase,
                     checked, f2);
        }
        small_free(&d);
    }
    /* destination lists that do not fit together */
    if (g_world > 1) {
        snprintf(root, sizeof root, "%s/lists", g_root);
        if (small_save(root, 3, 0))
            FAIL("lists: save: %s", xmp_last_error());
        dst_make(&d, 5, XMESH_F32);
        xmp_ckpt_t *c = NULL;
        xmesh_result_t r = xmp_ckpt_open(MPI_COMM_WORLD, root, &c);
        if (!r) {
            /* rank 0 swaps the names: two layouts under one name */
            xmp_ckpt_tensor_t ts[2] = {{"w", &d.w, NULL}, {"b", &d.b, NULL}};
            if (g_rank == 0) {
                ts[0].name = "b";
                ts[1].name = "w";
            }
            r = xmp_ckpt_load(MPI_COMM_WORLD, ctx, c, ts, 2, NULL, 0, 0);
            expect_fail("layouts differ", r, "pass different destination layouts", NULL, &d.w,
                        &d.b);
            /* rank 1 leaves out a tensor of a mesh it belongs to */
            xmp_ckpt_tensor_t t2[2] = {{"b", &d.b, NULL}, {"w", &d.w, NULL}};
            r = xmp_ckpt_load(MPI_COMM_WORLD, ctx, c, t2, g_rank == 1 ? 1 : 2, NULL, 0, 0);
            expect_fail("member left out", r, "tensor 'w': rank 1 is a member", "did not pass it",
                        &d.w, &d.b);
            xmp_ckpt_close(c);
        } else {
            FAIL("lists: open: %s", xmp_last_error());
        }
        small_free(&d);
    }
    /* bad names on save: nothing written */
    {
        xmp_tensor_t *none = NULL;
        small_t s;
        small_make(&s, 5, XMESH_F32, 1);
        xmp_ckpt_tensor_t ts[2] = {{"w", &s.w, NULL}, {"w", &s.b, NULL}};
        snprintf(root, sizeof root, "%s/names", g_root);
        xmesh_result_t r = xmp_ckpt_save(MPI_COMM_WORLD, root, 1, ts, 2, NULL, 0, 0);
        expect_fail("duplicate name", r, "tensor name 'w' passed twice", NULL, none, none);
        ts[1].name = "b b";
        r = xmp_ckpt_save(MPI_COMM_WORLD, root, 1, ts, 2, NULL, 0, 0);
        expect_fail("blank in name", r, "name 'b b'", "without blanks", none, none);
        snprintf(p, sizeof p, "%s/step-00000001", root);
        if (g_rank == 0 && exists(p))
            FAIL("bad names: %s written", p);
        small_free(&s);
    }
    /* P tensors are refused (nothing written) unless a storage SBP without P */
    {
        int shape[1] = {g_world}, ranks[16];
        for (int i = 0; i < g_world; i++)
            ranks[i] = i;
        xmp_mesh_t *m;
        xmp_tensor_t t;
        xmp_sbp_t sp[1] = {xmp_sbp_p()}, st[1] = {xmp_sbp_s(0)};
        int64_t s[1] = {9};
        xmp_mesh_create(MPI_COMM_WORLD, NULL, 1, shape, ranks, &m);
        xmp_tensor_alloc(&t, m, 1, s, XMESH_F32, sp);
        fill(&t, 4242);
        if (m->coord[0] != 0) /* P: the value on coordinate 0, zero partials elsewhere */
            memset(t.data, 0, (size_t)t.lcount * 4);
        snprintf(root, sizeof root, "%s/partial", g_root);
        xmp_ckpt_tensor_t ts[1] = {{"p", &t, NULL}};
        xmesh_result_t r = xmp_ckpt_save(MPI_COMM_WORLD, root, 1, ts, 1, NULL, 0, 0);
        expect_fail("P tensor", r, "tensor 'p'", "P (partial sums) on mesh axis 0", NULL, NULL);
        snprintf(p, sizeof p, "%s/step-00000001", root);
        if (g_rank == 0 && exists(p))
            FAIL("P tensor: %s written", p);
        /* with storage S(0): boxed (summed over the ranks) and saved */
        ts[0].store = st;
        r = xmp_ckpt_save(MPI_COMM_WORLD, root, 1, ts, 1, NULL, 0, 0);
        if (r)
            FAIL("P tensor with storage S(0): %s", xmp_last_error());
        xmp_tensor_t q;
        xmp_sbp_t sb[1] = {xmp_sbp_b()};
        xmp_tensor_alloc(&q, m, 1, s, XMESH_F32, sb);
        xmp_ckpt_t *c = NULL;
        if (!r && !xmp_ckpt_open(MPI_COMM_WORLD, root, &c)) {
            xmp_ckpt_tensor_t tl[1] = {{"p", &q, NULL}};
            if (xmp_ckpt_load(MPI_COMM_WORLD, ctx, c, tl, 1, NULL, 0, 0))
                FAIL("P load: %s", xmp_last_error());
            float *v = q.data;
            for (int i = 0; i < 9; i++) { /* sum of W partials, W - 1 of them zero */
                uint32_t u = val(4242, i);
                float want;
                memcpy(&want, &u, 4);
                if (v[i] != want)
                    FAIL("P tensor summed element %d: %g, want %g", i, (double)v[i], (double)want);
            }
            xmp_ckpt_close(c);
        }
        xmp_tensor_free(&q);
        xmp_tensor_free(&t);
        xmp_mesh_destroy(m);
    }
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_world);
    int trials = 6;
    const char *keep_dir = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc)
            g_seed = strtoull(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--trials") == 0 && i + 1 < argc)
            trials = atoi(argv[++i]);
        else if (strcmp(argv[i], "--keep-dir") == 0 && i + 1 < argc)
            keep_dir = argv[++i];
        else if (strcmp(argv[i], "--save-only") == 0 && i + 2 < argc) {
            /* one small save of step S into DIR, nothing else (for the crash test) */
            const char *dir = argv[++i];
            int64_t step = atoll(argv[++i]);
            xmesh_result_t r = small_save(dir, step, 0);
            if (r && g_rank == 0)
                fprintf(stderr, "test_ckpt --save-only: %s\n", xmp_last_error());
            MPI_Finalize();
            return r ? 1 : 0;
        }
    }
    if (g_world > 16) {
        if (g_rank == 0)
            fprintf(stderr, "test_ckpt: at most 16 ranks\n");
        MPI_Finalize();
        return 2;
    }
    g_rng = g_seed;
    if (g_rank == 0) {
        printf("test_ckpt: %d ranks, seed %" PRIu64 " (replay: --seed %" PRIu64 ")\n", g_world,
               g_seed, g_seed);
        const char *td = getenv("TMPDIR");
        snprintf(g_root, sizeof g_root, "%s/xmesh-ckpt-test-XXXXXX", td && *td ? td : "/tmp");
        if (!mkdtemp(g_root)) {
            perror("mkdtemp");
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    MPI_Bcast(g_root, sizeof g_root, MPI_CHAR, 0, MPI_COMM_WORLD);

    int pairs[7][2] = {{g_world, g_world}, {g_world, 2}, {g_world, 4}, {2, g_world},
                       {1, g_world},       {g_world, 1}, {3, g_world}};
    int ncases = 0;
    for (int k = 0; k < 7; k++) {
        int nA = pairs[k][0], nB = pairs[k][1];
        if (nA > g_world || nB > g_world)
            continue;
        for (int t = 0; t < trials; t++) {
            matrix_case(nA, nB, t * 2, 0);
            matrix_case(nA, nB, t * 2 + 1, XMP_CKPT_LOAD_DIRECT);
            ncases += 2;
        }
    }
    if (g_rank == 0)
        printf("matrix: %d save/load cases x %d tensors (rank 0: %d loaded by xmesh plans, %d by "
               "direct reads)\n",
               ncases, NT, g_plan_tensors, g_direct_tensors);
    test_keep();
    test_atomic();
    test_meta();
    xmesh_ctx_t ctx = NULL;
    xmesh_ctx_create_mpi(MPI_COMM_WORLD, NULL, &ctx);
    test_bad(ctx);
    xmesh_ctx_destroy(ctx);
    if (keep_dir && small_save(keep_dir, 7, 0))
        FAIL("--keep-dir %s: %s", keep_dir, xmp_last_error());

    int fails = g_fail, total;
    MPI_Allreduce(&fails, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    if (g_rank == 0) {
        if (!total) {
            char cmd[600];
            snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_root);
            if (system(cmd) != 0)
                fprintf(stderr, "could not remove %s\n", g_root);
        }
        printf("test_ckpt: %s (%d failures, seed %" PRIu64 ")%s%s\n", total ? "FAILED" : "OK",
               total, g_seed, total ? ", files kept in " : "", total ? g_root : "");
    }
    MPI_Finalize();
    return total ? 1 : 0;
}
