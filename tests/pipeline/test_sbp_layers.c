/* SBP layer norm and causal attention under MPI (nn/sbp_layers.h): for EVERY
 * SBP signature of the input over the meshes this rank count allows (1 to 4
 * axes), the gathered forward output and backward gradients equal the serial
 * kernels of nn/kernels.h element by element, the output SBPs follow the
 * rules, forbidden splits are refused naming the axis, and one mixed case per
 * mesh passes a finite-difference check of the SBP op itself.
 * Usage: test_sbp_layers [--seed S] [--op ln|attn|all]. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "nn/kernels.h"
#include "nn/sbp_layers.h"
#include "sbp_test_util.h"

static uint64_t g_seed = 20261125;
static int64_t g_checked;

static float *rand_array(int64_t n, float scale, float shift)
{
    float *a = malloc(sizeof(float) * (size_t)(n + 1));
    for (int64_t e = 0; e < n; e++)
        a[e] = shift + scale * urand();
    return a;
}

/* SBP option k of {B, P, S(0), ..., S(nd-1)}. */
static xmp_sbp_t option(int k)
{
    return k == 0 ? xmp_sbp_b() : k == 1 ? xmp_sbp_p() : xmp_sbp_s(k - 2);
}

/* Combination number c over naxes axes, nopt options per axis (axis 0 most significant). */
static void combo(int c, int naxes, int nopt, const int *opts, xmp_sbp_t *s)
{
    for (int a = XMP_MAX_MESH_DIMS - 1; a >= 0; a--)
        s[a] = xmp_sbp_b();
    for (int a = naxes - 1; a >= 0; a--) {
        s[a] = option(opts[c % nopt]);
        c /= nopt;
    }
}

/* Per axis one of opts[0..nopt-1] (option codes), uniformly; axes past naxes are B. */
static void rand_sbp_of(int naxes, int nopt, const int *opts, xmp_sbp_t *s)
{
    for (int a = 0; a < XMP_MAX_MESH_DIMS; a++)
        s[a] = a < naxes ? option(opts[irand(nopt)]) : xmp_sbp_b();
}

/* The pure deduction (one engine) must give the SBP the op produced. */
static void check_deduce(const char *what, const char *op, int nin, const int *nd,
                         const xmp_sbp_t *const *in, const xmp_tensor_t *out)
{
    xmp_sbp_t d[XMP_MAX_MESH_DIMS];
    char err[400];
    if (xmp_sbp_deduce(op, out->mesh->ndim, nin, nd, in, d, err, sizeof err)) {
        FAIL("%s: xmp_sbp_deduce refuses what the op ran: %s", what, err);
        return;
    }
    for (int a = 0; a < out->mesh->ndim; a++)
        if (!xmp_sbp_eq(d[a], out->sbp[a])) {
            FAIL("%s: xmp_sbp_deduce says axis %d differs from the op's output %s", what, a,
                 out->spec);
            return;
        }
}

/* Every element of the gathered t against ref (|d| <= tol (1 + |ref|)); and its SBP. */
static void compare(const char *what, const xmp_tensor_t *t, const float *ref,
                    const xmp_sbp_t *want_sbp, double tol)
{
    float *f = full_of(t);
    int64_t n = numel(t->ndim, t->shape);
    if (!t->mesh->member) {
        free(f);
        return;
    }
    for (int a = 0; want_sbp && a < t->mesh->ndim; a++)
        if (!xmp_sbp_eq(t->sbp[a], want_sbp[a])) {
            char ws[64];
            xmp_sbp_string(want_sbp, t->mesh->ndim, ws, sizeof ws);
            FAIL("%s: SBP %s, expected %s", what, t->spec, ws);
            break;
        }
    for (int64_t e = 0; e < n; e++) {
        if (!(fabs((double)f[e] - ref[e]) <= tol * (1.0 + fabs((double)ref[e])))) {
            FAIL("%s: element %lld = %.9g, serial %.9g", what, (long long)e, (double)f[e],
                 (double)ref[e]);
            break;
        }
    }
    g_checked += n;
    free(f);
}

/* Local copy of a tensor's block, to check later that an op left its input alone. */
static float *snap(const xmp_tensor_t *t)
{
    float *c = malloc(sizeof(float) * (size_t)(t->lcount + 1));
    if (t->lcount)
        memcpy(c, t->data, sizeof(float) * (size_t)t->lcount);
    return c;
}

static void unchanged(const char *what, const xmp_tensor_t *t, float *copy)
{
    if (t->lcount && memcmp(copy, t->data, sizeof(float) * (size_t)t->lcount))
        FAIL("%s: an input was modified", what);
    free(copy);
}

static void check_fd(const char *what, int64_t e, double fd, float an)
{
    if (fabs(fd - an) > 3e-3 * (1.0 + fabs(fd)))
        FAIL("%s element %lld: finite difference %.6f, analytic %.6f", what, (long long)e, fd,
             (double)an);
}

/* ------------------------------------------------------------ layer norm */

enum { LB = 2, LT = 3, LC = 7 }; /* x (2, 3, 7): uneven pieces, empty ones on 8 ranks */

typedef struct {
    xmp_mesh_t *m;
    xmp_sbp_t sx[4], sw[4], sb[4], sg[4];
    float *X, *W, *Bi, *R;
} ln_case_t;

static const int64_t ln_xs[3] = {LB, LT, LC}, ln_ws[1] = {LC};

static double ln_eval(void *p)
{
    ln_case_t *c = p;
    xmp_tensor_t x, w, b, y;
    xmp_norm_cache_t cache;
    double L = 0;
    make(&x, c->m, 3, ln_xs, c->sx, c->X);
    make(&w, c->m, 1, ln_ws, c->sw, c->W);
    make(&b, c->m, 1, ln_ws, c->sb, c->Bi);
    if (xmp_layernorm_forward(&x, &w, &b, &y, &cache)) {
        FAIL("layernorm forward: %s", xmp_last_error());
    } else {
        L = objective(&y, c->R);
        xmp_tensor_free(&y);
        xmp_norm_cache_free(&cache);
    }
    xmp_tensor_free(&x);
    xmp_tensor_free(&w);
    xmp_tensor_free(&b);
    return L;
}

/* Runs one case; compares with the serial kernels; FD check if fd. */
static void ln_case(ln_case_t *c, int fd)
{
    const int64_t N = LB * LT, nx = N * LC;
    float *Y = calloc(nx, 4), *M = calloc(N, 4), *S = calloc(N, 4);
    float *DX = calloc(nx, 4), *DW = calloc(LC, 4), *DB = calloc(LC, 4);
    xmp_layernorm_fwd(Y, M, S, c->X, c->W, c->Bi, (size_t)N, LC);
    xmp_layernorm_bwd(DX, DW, DB, c->R, c->X, c->W, M, S, (size_t)N, LC);
    xmp_tensor_t x, w, b, y, dy, dx, dw, db;
    xmp_norm_cache_t cache;
    make(&x, c->m, 3, ln_xs, c->sx, c->X);
    make(&w, c->m, 1, ln_ws, c->sw, c->W);
    make(&b, c->m, 1, ln_ws, c->sb, c->Bi);
    make(&dy, c->m, 3, ln_xs, c->sg, c->R);
    char what[200], sw[32], sb[32], sg[32];
    xmp_sbp_string(c->sw, c->m->ndim, sw, sizeof sw);
    xmp_sbp_string(c->sb, c->m->ndim, sb, sizeof sb);
    xmp_sbp_string(c->sg, c->m->ndim, sg, sizeof sg);
    snprintf(what, sizeof what, "layernorm x %s w %s b %s dy %s", x.spec, sw, sb, sg);
    xmp_sbp_t ty[4], tw[4], tst[4];
    for (int a = 0; a < 4; a++) {
        int ax = a < c->m->ndim;
        xmp_sbp_t s = c->sx[a];
        ty[a] = ax && s.kind != XMP_P ? s : xmp_sbp_b();
        tw[a] = !ax                             ? xmp_sbp_b()
                : s.kind == XMP_S && s.dim == 2 ? xmp_sbp_s(0)
                : s.kind == XMP_S               ? xmp_sbp_p()
                                                : xmp_sbp_b();
        tst[a] = ax && s.kind == XMP_S && s.dim < 2 ? s : xmp_sbp_b();
    }
    float *kx = snap(&x), *kw = snap(&w), *kb = snap(&b), *kg = snap(&dy);
    if (xmp_layernorm_forward(&x, &w, &b, &y, &cache)) {
        FAIL("%s: forward: %s", what, xmp_last_error());
        free(kx), free(kw), free(kb), free(kg);
        goto out;
    }
    char w2[300];
    snprintf(w2, sizeof w2, "%s: y", what);
    compare(w2, &y, Y, ty, 1e-5);
    {
        int nd[3] = {3, 1, 1};
        const xmp_sbp_t *in[3] = {c->sx, c->sw, c->sb};
        check_deduce(what, "layernorm", 3, nd, in, &y);
    }
    snprintf(w2, sizeof w2, "%s: mean", what);
    compare(w2, &cache.mean, M, tst, 1e-5);
    snprintf(w2, sizeof w2, "%s: rstd", what);
    compare(w2, &cache.rstd, S, tst, 1e-5);
    if (xmp_layernorm_backward(&dy, &x, &w, &cache, &dx, &dw, &db)) {
        FAIL("%s: backward: %s", what, xmp_last_error());
        free(kx), free(kw), free(kb), free(kg);
    } else {
        snprintf(w2, sizeof w2, "%s: dx", what);
        compare(w2, &dx, DX, ty, 1e-5);
        snprintf(w2, sizeof w2, "%s: dw", what);
        compare(w2, &dw, DW, tw, 1e-5);
        snprintf(w2, sizeof w2, "%s: db", what);
        compare(w2, &db, DB, tw, 1e-5);
        unchanged(what, &x, kx), unchanged(what, &w, kw), unchanged(what, &b, kb);
        unchanged(what, &dy, kg);
        kx = kw = kb = kg = NULL;
        if (fd) {
            float *gx = full_of(&dx), *gw = full_of(&dw), *gb = full_of(&db);
            struct {
                float *arr, *an;
                int64_t n;
                const char *name;
            } v[3] = {{c->X, gx, nx, "dx"}, {c->W, gw, LC, "dw"}, {c->Bi, gb, LC, "db"}};
            for (int i = 0; i < 3; i++)
                for (int k = 0; k < 4; k++) {
                    int64_t e = irand((int)v[i].n);
                    float keep = v[i].arr[e], eps = 1e-2f;
                    v[i].arr[e] = keep + eps;
                    double lp = ln_eval(c);
                    v[i].arr[e] = keep - eps;
                    double lm = ln_eval(c);
                    v[i].arr[e] = keep;
                    snprintf(w2, sizeof w2, "%s: FD %s", what, v[i].name);
                    check_fd(w2, e, (lp - lm) / (2.0 * eps), v[i].an[e]);
                }
            if (g_rank == 0)
                printf("  FD check of %s: 12 elements\n", what);
            free(gx);
            free(gw);
            free(gb);
        }
        xmp_tensor_free(&dx);
        xmp_tensor_free(&dw);
        xmp_tensor_free(&db);
    }
    xmp_tensor_free(&y);
    xmp_norm_cache_free(&cache);
out:
    xmp_tensor_free(&x);
    xmp_tensor_free(&w);
    xmp_tensor_free(&b);
    xmp_tensor_free(&dy);
    free(Y);
    free(M);
    free(S);
    free(DX);
    free(DW);
    free(DB);
}

static void test_layernorm(xmp_mesh_t *m)
{
    static const int xopt[5] = {0, 1, 2, 3, 4}, wopt[3] = {0, 1, 2};
    int ncombo = 1;
    for (int a = 0; a < m->ndim; a++)
        ncombo *= 5;
    ln_case_t c;
    memset(&c, 0, sizeof c);
    c.m = m;
    c.X = rand_array(LB * LT * LC, 2.0f, 0.3f);
    c.W = rand_array(LC, 0.5f, 1.0f);
    c.Bi = rand_array(LC, 0.5f, 0.0f);
    c.R = rand_array(LB * LT * LC, 1.0f, 0.0f);
    for (int k = 0; k < ncombo; k++) {
        combo(k, m->ndim, 5, xopt, c.sx);
        rand_sbp_of(m->ndim, 3, wopt, c.sw);
        rand_sbp_of(m->ndim, 3, wopt, c.sb);
        rand_sbp_of(m->ndim, 5, xopt, c.sg);
        ln_case(&c, 0);
    }
    /* FD: channel split on axis 0, rows on the others, P where there is a 4th axis */
    static const xmp_sbp_t mix[4] = {{XMP_S, 2}, {XMP_S, 0}, {XMP_S, 1}, {XMP_P, 0}};
    memcpy(c.sx, mix, sizeof mix);
    rand_sbp_of(m->ndim, 3, wopt, c.sw);
    rand_sbp_of(m->ndim, 3, wopt, c.sb);
    rand_sbp_of(m->ndim, 5, xopt, c.sg);
    ln_case(&c, 1);
    if (g_rank == 0)
        printf("  layernorm: %d x signatures on a %d-axis mesh checked\n", ncombo, m->ndim);
    free(c.X);
    free(c.W);
    free(c.Bi);
    free(c.R);
}

/* ------------------------------------------------------------- attention */

enum { AB = 2, AT = 5, ANH = 3, AHS = 2 }; /* qkv (2, 5, 3, 3, 2) */

static const int64_t at_qs[5] = {AB, AT, 3, ANH, AHS}, at_ys[4] = {AB, AT, ANH, AHS};

typedef struct {
    xmp_mesh_t *m;
    xmp_sbp_t sq[4], sg[4];
    float *Q, *R;
} at_case_t;

static double at_eval(void *p)
{
    at_case_t *c = p;
    xmp_tensor_t q, y;
    xmp_attn_cache_t cache;
    double L = 0;
    make(&q, c->m, 5, at_qs, c->sq, c->Q);
    if (xmp_attention_forward(&q, &y, &cache)) {
        FAIL("attention forward: %s", xmp_last_error());
    } else {
        L = objective(&y, c->R);
        xmp_tensor_free(&y);
        xmp_attn_cache_free(&cache);
    }
    xmp_tensor_free(&q);
    return L;
}

static void at_case(at_case_t *c, int fd)
{
    const int64_t nq = AB * AT * 3 * ANH * AHS, ny = AB * AT * ANH * AHS;
    float *Y = calloc(ny, 4), *A = calloc(AB * ANH * AT * AT, 4), *DQ = calloc(nq, 4);
    float work[AT];
    xmp_attention_fwd(Y, NULL, A, c->Q, AB, AT, ANH, AHS);
    xmp_attention_bwd(DQ, c->R, c->Q, A, AB, AT, ANH, AHS, work);
    xmp_tensor_t q, y, dy, dq;
    xmp_attn_cache_t cache;
    make(&q, c->m, 5, at_qs, c->sq, c->Q);
    make(&dy, c->m, 4, at_ys, c->sg, c->R);
    char what[200], w2[300];
    snprintf(what, sizeof what, "attention qkv %s dy %s", q.spec, dy.spec);
    xmp_sbp_t ty[4], tq[4], ta[4];
    static const int ydim[5] = {0, 1, -1, 2, -1}, adim[5] = {0, 2, -1, 1, -1};
    for (int a = 0; a < 4; a++) {
        xmp_sbp_t s = a < c->m->ndim ? c->sq[a] : xmp_sbp_b();
        tq[a] = s.kind == XMP_P ? xmp_sbp_b() : s;
        ty[a] = s.kind == XMP_S ? xmp_sbp_s(ydim[s.dim]) : xmp_sbp_b();
        ta[a] = s.kind == XMP_S ? xmp_sbp_s(adim[s.dim]) : xmp_sbp_b();
    }
    float *kq = snap(&q), *kg = snap(&dy);
    if (xmp_attention_forward(&q, &y, &cache)) {
        FAIL("%s: forward: %s", what, xmp_last_error());
        free(kq), free(kg);
        goto out;
    }
    snprintf(w2, sizeof w2, "%s: y", what);
    compare(w2, &y, Y, ty, 1e-5);
    {
        int nd[1] = {5};
        const xmp_sbp_t *in[1] = {c->sq};
        check_deduce(what, "attention", 1, nd, in, &y);
    }
    snprintf(w2, sizeof w2, "%s: att", what);
    compare(w2, &cache.att, A, ta, 1e-5);
    if (xmp_attention_backward(&dy, &q, &cache, &dq)) {
        FAIL("%s: backward: %s", what, xmp_last_error());
        free(kq), free(kg);
    } else {
        snprintf(w2, sizeof w2, "%s: dqkv", what);
        compare(w2, &dq, DQ, tq, 1e-5);
        unchanged(what, &q, kq), unchanged(what, &dy, kg);
        kq = kg = NULL;
        if (fd) {
            float *g = full_of(&dq);
            for (int k = 0; k < 8; k++) {
                int64_t e = irand((int)nq);
                float keep = c->Q[e], eps = 1e-2f;
                c->Q[e] = keep + eps;
                double lp = at_eval(c);
                c->Q[e] = keep - eps;
                double lm = at_eval(c);
                c->Q[e] = keep;
                snprintf(w2, sizeof w2, "%s: FD dqkv", what);
                check_fd(w2, e, (lp - lm) / (2.0 * eps), g[e]);
            }
            if (g_rank == 0)
                printf("  FD check of %s: 8 elements\n", what);
            free(g);
        }
        xmp_tensor_free(&dq);
    }
    xmp_tensor_free(&y);
    xmp_attn_cache_free(&cache);
out:
    xmp_tensor_free(&q);
    xmp_tensor_free(&dy);
    free(Y);
    free(A);
    free(DQ);
}

/* S(2) and S(4) on each axis are refused naming the axis and the split; y untouched. */
static void at_refusals(xmp_mesh_t *m, const float *Q)
{
    for (int a = 0; a < m->ndim; a++)
        for (int d = 2; d <= 4; d += 2) {
            xmp_sbp_t s[4] = {xmp_sbp_b(), xmp_sbp_b(), xmp_sbp_b(), xmp_sbp_b()};
            s[a] = xmp_sbp_s(d);
            xmp_tensor_t q, y;
            xmp_attn_cache_t cache;
            memset(&y, 0x5a, sizeof y);
            memset(&cache, 0x5a, sizeof cache);
            xmp_tensor_t y0 = y;
            make(&q, m, 5, at_qs, s, Q);
            xmesh_result_t r = xmp_attention_forward(&q, &y, &cache);
            char ax[32], sd[16];
            snprintf(ax, sizeof ax, "mesh axis %d", a);
            snprintf(sd, sizeof sd, "S(%d)", d);
            const char *msg = xmp_last_error();
            if (r != XMESH_ERR_INVALID_ARGUMENT)
                FAIL("attention qkv %s: accepted (result %d), expected a refusal", q.spec, (int)r);
            else if (!strstr(msg, ax) || !strstr(msg, sd) || !strstr(msg, "no rule") ||
                     !strstr(msg, "qkv") || !strstr(msg, d == 2 ? "q/k/v index" : "head dim"))
                FAIL("attention qkv %s: refusal does not name axis, split and rule: %s", q.spec,
                     msg);
            else if (memcmp(&y, &y0, sizeof y))
                FAIL("attention qkv %s: y written on refusal", q.spec);
            xmp_tensor_free(&q);
        }
}

static void test_attention(xmp_mesh_t *m)
{
    static const int qopt[5] = {0, 1, 2, 3, 5}, gopt[6] = {0, 1, 2, 3, 4, 5};
    int ncombo = 1;
    for (int a = 0; a < m->ndim; a++)
        ncombo *= 5;
    at_case_t c;
    memset(&c, 0, sizeof c);
    c.m = m;
    c.Q = rand_array(AB * AT * 3 * ANH * AHS, 1.5f, 0.0f);
    c.R = rand_array(AB * AT * ANH * AHS, 1.0f, 0.0f);
    for (int k = 0; k < ncombo; k++) {
        combo(k, m->ndim, 5, qopt, c.sq);
        rand_sbp_of(m->ndim, 6, gopt, c.sg);
        at_case(&c, 0);
    }
    at_refusals(m, c.Q);
    static const xmp_sbp_t mix[4] = {{XMP_S, 1}, {XMP_S, 3}, {XMP_S, 0}, {XMP_P, 0}};
    memcpy(c.sq, mix, sizeof mix);
    rand_sbp_of(m->ndim, 6, gopt, c.sg);
    at_case(&c, 1);
    if (g_rank == 0)
        printf("  attention: %d qkv signatures on a %d-axis mesh checked, S(2)/S(4) refused\n",
               ncombo, m->ndim);
    free(c.Q);
    free(c.R);
}

int main(int argc, char **argv)
{
    int provided, size;
    const char *which = "all";
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    openblas_set_num_threads(1);
    for (int i = 1; i + 1 < argc; i++) {
        if (!strcmp(argv[i], "--seed"))
            g_seed = strtoull(argv[i + 1], NULL, 0);
        if (!strcmp(argv[i], "--op"))
            which = argv[i + 1];
    }
    if (g_rank == 0)
        printf("test_sbp_layers: %d ranks, op %s, seed %llu (replay: --seed %llu)\n", size, which,
               (unsigned long long)g_seed, (unsigned long long)g_seed);
    g_state = g_seed; /* same stream on every rank: same cases everywhere */
    /* meshes: every factorisation used by the issue for this rank count */
    static const int shapes[][5] = {{1, 2}, {1, 3},       {2, 2, 2},
                                    {1, 4}, {3, 2, 2, 2}, {4, 2, 1, 2, 2}};
    int ranks[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        int nd = shapes[i][0], n = 1;
        for (int a = 0; a < nd; a++)
            n *= shapes[i][1 + a];
        if (n != size)
            continue;
        xmp_mesh_t *m = NULL;
        OK(xmp_mesh_create(MPI_COMM_WORLD, NULL, nd, shapes[i] + 1, ranks, &m));
        if (!m)
            break;
        if (g_rank == 0)
            printf(" mesh of %d axes\n", nd);
        if (!strcmp(which, "all") || !strcmp(which, "ln"))
            test_layernorm(m);
        if (!strcmp(which, "all") || !strcmp(which, "attn"))
            test_attention(m);
        xmp_mesh_destroy(m);
    }
    if (size == 3) { /* a mesh of 2 (ranks 2, 0) that rank 1 is not in: it returns at once */
        int two = 2, rk[2] = {2, 0};
        xmp_mesh_t *m = NULL;
        OK(xmp_mesh_create(MPI_COMM_WORLD, NULL, 1, &two, rk, &m));
        if (m) {
            if (g_rank == 0)
                printf(" mesh of 2 of the 3 ranks (rank 1 not a member)\n");
            if (!strcmp(which, "all") || !strcmp(which, "ln"))
                test_layernorm(m);
            if (!strcmp(which, "all") || !strcmp(which, "attn"))
                test_attention(m);
            xmp_mesh_destroy(m);
        }
    }
    int fails = 0;
    long long checked = 0, mine = g_checked;
    MPI_Allreduce(&g_fail, &fails, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(&mine, &checked, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (g_rank == 0)
        printf("test_sbp_layers: %s (%d failures, %lld elements compared over all ranks)\n",
               fails ? "FAILED" : "ok", fails, checked);
    MPI_Finalize();
    return fails || checked == 0 ? 1 : 0;
}
