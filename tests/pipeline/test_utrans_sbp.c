/*
 * SBP forms of the U-Transformer layers (nn/sbp_conv.h), under MPI on every rank of
 * MPI_COMM_WORLD (1, 2 or 4 ranks): for each op and a list of SBP signatures on a 1-D mesh (and
 * a 2x2 mesh on 4 ranks), the parallel forward output and every backward gradient, gathered to
 * full, equal the single-process kernels of nn/unet_kernels.h element by element (max |diff|
 * <= 2e-5 (1 + max |ref|)), group norm also where a group spans ranks (statistics all-reduced);
 * a central finite difference of L = sum(y * r) through the SBP forward
 * matches the SBP backward on sampled coordinates; and the impossible splits are refused with
 * their message (spatial split, heads not divisible, channel-split concat). Replay: mpiexec -n N
 * test_utrans_sbp --seed S
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/sbp_conv.h"
#include "nn/sbp_ops.h"
#include "nn/unet_kernels.h"
#include "utrans_check.h"

static xmp_mesh_t *g_mesh;

static size_t numel(int nd, const int64_t *s)
{
    size_t n = 1;
    for (int i = 0; i < nd; i++)
        n *= (size_t)s[i];
    return n;
}

/* A tensor of the given SBP holding my block of full. */
static xmp_tensor_t mk(int nd, const int64_t *shape, const char *sbp, const float *full)
{
    xmp_tensor_t t;
    xmp_sbp_t s[XMP_MAX_MESH_DIMS];
    memset(&t, 0, sizeof t);
    if (xmp_sbp_parse(sbp, g_mesh->ndim, nd, s) != XMESH_SUCCESS ||
        xmp_tensor_alloc(&t, g_mesh, nd, shape, XMESH_F32, s) != XMESH_SUCCESS ||
        xmp_tensor_fill_from_full(&t, full) != XMESH_SUCCESS) {
        printf("mk %s: %s\n", sbp, xmp_last_error());
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    return t;
}

static void cmp(const char *what, const char *sig, const xmp_tensor_t *t, const float *ref)
{
    size_t n = numel(t->ndim, t->shape);
    float *f = malloc(n * sizeof(float));
    if (xmp_tensor_gather_full(t, f) != XMESH_SUCCESS) {
        CHECK(0, "%s [%s]: gather: %s", what, sig, xmp_last_error());
        free(f);
        return;
    }
    double mx = 0, rf = 0;
    size_t worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)f[i] - ref[i]);
        if (!(d <= mx))
            mx = d, worst = i;
        rf = fmax(rf, fabs(ref[i]));
    }
    CHECK(mx <= 2e-5 * (1 + rf),
          "%s [%s]: max |sbp - serial| %.3g at %zu (%g vs %g), max |ref| %.3g, %zu elements", what,
          sig, mx, worst, f[worst], ref[worst], rf, n);
    free(f);
}

static float *rnd(size_t n)
{
    float *p = malloc(n * sizeof(float));
    fill(p, n, 1.0);
    return p;
}

static double dot_full(const xmp_tensor_t *y, const float *r)
{
    size_t n = numel(y->ndim, y->shape);
    float *f = malloc(n * sizeof(float));
    double s = 0;
    xmp_tensor_gather_full(y, f);
    for (size_t i = 0; i < n; i++)
        s += (double)f[i] * r[i];
    free(f);
    return s;
}

/* Central finite differences of L(full) = sum(op(full) * r) at 6 sampled coordinates against
 * the analytic gradient an (full). eval refills the operand from full and runs the forward. */
typedef double (*eval_fn)(void *ctx, const float *full);
static void fd(const char *what, const char *sig, eval_fn eval, void *ctx, float *full, size_t n,
               const float *an)
{
    double num = 0, den = 0;
    for (int k = 0; k < 6; k++) {
        size_t i = (size_t)(urand() * (double)n) % n;
        float keep = full[i];
        const float eps = 1e-2f;
        full[i] = keep + eps;
        double lp = eval(ctx, full);
        full[i] = keep - eps;
        double lm = eval(ctx, full);
        full[i] = keep;
        double g = (lp - lm) / (2.0 * eps);
        num += (g - an[i]) * (g - an[i]);
        den += (double)an[i] * an[i];
    }
    double e = sqrt(num) / fmax(sqrt(den), 1e-2);
    CHECK(e <= 2e-2, "%s [%s]: finite difference vs backward: relative error %.3g", what, sig, e);
}

/* fd against the analytic gradient held in the tensor grad (gathered to full here). */
static void fd_tensor(const char *what, const char *sig, eval_fn eval, void *ctx, float *full,
                      size_t n, const xmp_tensor_t *grad)
{
    float *an = malloc(n * sizeof(float));
    if (xmp_tensor_gather_full(grad, an) != XMESH_SUCCESS) {
        CHECK(0, "%s [%s]: gather: %s", what, sig, xmp_last_error());
        free(an);
        return;
    }
    fd(what, sig, eval, ctx, full, n, an);
    free(an);
}

/* The output gradient of y: y's shape, the gradient SBP of y's (a P output's gradient is B),
 * my block of full. */
static xmp_tensor_t mk_grad(const xmp_tensor_t *y, const float *full)
{
    xmp_tensor_t t;
    xmp_sbp_t gs[XMP_MAX_MESH_DIMS];
    memset(&t, 0, sizeof t);
    for (int a = 0; a < XMP_MAX_MESH_DIMS; a++)
        gs[a] = xmp_sbp_grad(y->sbp[a]);
    if (xmp_tensor_alloc(&t, g_mesh, y->ndim, y->shape, XMESH_F32, gs) != XMESH_SUCCESS ||
        xmp_tensor_fill_from_full(&t, full) != XMESH_SUCCESS) {
        printf("mk_grad: %s\n", xmp_last_error());
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    return t;
}

static void expect_refusal(xmesh_result_t r, const char *needle, const char *what)
{
    CHECK(r != XMESH_SUCCESS && strstr(xmp_last_error(), needle),
          "%s: expected a refusal containing '%s', got %d '%s'", what, needle, (int)r,
          xmp_last_error());
}

/* ------------------------------------------------------------------ conv */

typedef struct {
    int64_t xs[4], ws[4], bs[1];
    const char *sx, *sw, *sb;
    const float *w, *b;
    const float *r;
    int stride;
} conv_ctx_t;

static double conv_eval_x(void *c_, const float *xf)
{
    conv_ctx_t *c = c_;
    xmp_tensor_t x = mk(4, c->xs, c->sx, xf), w = mk(4, c->ws, c->sw, c->w),
                 b = mk(1, c->bs, c->sb, c->b), y;
    double l = 0;
    if (xmp_conv2d_forward(&x, &w, &b, c->stride, 1, &y) == XMESH_SUCCESS) {
        l = dot_full(&y, c->r);
        xmp_tensor_free(&y);
    }
    xmp_tensor_free(&x);
    xmp_tensor_free(&w);
    xmp_tensor_free(&b);
    return l;
}

/* L as a function of the full weight (x fixed in ctx->w, which then holds the input). */
static double conv_eval_w(void *c_, const float *wf)
{
    conv_ctx_t *c = c_;
    xmp_tensor_t x = mk(4, c->xs, c->sx, c->w), w = mk(4, c->ws, c->sw, wf),
                 b = mk(1, c->bs, c->sb, c->b), y;
    double l = 0;
    if (xmp_conv2d_forward(&x, &w, &b, c->stride, 1, &y) == XMESH_SUCCESS) {
        l = dot_full(&y, c->r);
        xmp_tensor_free(&y);
    }
    xmp_tensor_free(&x);
    xmp_tensor_free(&w);
    xmp_tensor_free(&b);
    return l;
}

static void test_conv(const char *sx, const char *sw, const char *sbias, int stride, int dofd)
{
    char sig[96];
    snprintf(sig, sizeof sig, "x %s w %s b %s stride %d", sx, sw, sbias, stride);
    const int N = 4, CI = 4, CO = 6, H = 6, W = 6;
    xmp_unet_conv2d_t c;
    xmp_unet_conv2d_init(&c, N, CI, H, W, CO, 3, 3, stride, 1);
    int64_t xs[4] = {N, CI, H, W}, ws[4] = {CO, CI, 3, 3}, bs[1] = {CO};
    int64_t ys[4] = {N, CO, c.oh, c.ow};
    size_t nx = numel(4, xs), nw = numel(4, ws), ny = numel(4, ys);
    float *xf = rnd(nx), *wf = rnd(nw), *bf = rnd(CO), *dyf = rnd(ny);
    float *yr = calloc(ny, 4), *dxr = calloc(nx, 4), *dwr = calloc(nw, 4), *dbr = calloc(CO, 4);
    float *col = malloc(xmp_unet_conv2d_col_floats(&c) * 4 + 4);
    xmp_unet_conv2d_forward(&c, xf, wf, bf, yr, col);
    xmp_unet_conv2d_backward_input(&c, dyf, wf, dxr, col);
    xmp_unet_conv2d_backward_weight(&c, xf, dyf, dwr, dbr, col);
    xmp_tensor_t x = mk(4, xs, sx, xf), w = mk(4, ws, sw, wf), b = mk(1, bs, sbias, bf), y, dx, dw,
                 db;
    xmesh_result_t r = xmp_conv2d_forward(&x, &w, &b, stride, 1, &y);
    CHECK(r == XMESH_SUCCESS, "conv forward [%s]: %s", sig, xmp_last_error());
    if (r == XMESH_SUCCESS) {
        cmp("conv y", sig, &y, yr);
        /* dy with y's SBP (a P output's gradient is B) */
        xmp_tensor_t dy = mk_grad(&y, dyf);
        r = xmp_conv2d_backward_input(&dy, &x, &w, stride, 1, &dx);
        CHECK(r == XMESH_SUCCESS, "conv backward input [%s]: %s", sig, xmp_last_error());
        if (r == XMESH_SUCCESS) {
            cmp("conv dx", sig, &dx, dxr);
            if (dofd) {
                conv_ctx_t cc = {{N, CI, H, W}, {CO, CI, 3, 3}, {CO}, sx, sw, sbias, wf, bf,
                                 dyf,           stride};
                fd_tensor("conv dx", sig, conv_eval_x, &cc, xf, nx, &dx);
            }
            xmp_tensor_free(&dx);
        }
        r = xmp_conv2d_backward_weight(&dy, &x, &w, stride, 1, &dw, &db);
        CHECK(r == XMESH_SUCCESS, "conv backward weight [%s]: %s", sig, xmp_last_error());
        if (r == XMESH_SUCCESS) {
            cmp("conv dw", sig, &dw, dwr);
            cmp("conv db", sig, &db, dbr);
            if (dofd) {
                conv_ctx_t cc = {{N, CI, H, W}, {CO, CI, 3, 3}, {CO}, sx, sw, sbias, xf, bf,
                                 dyf,           stride};
                fd_tensor("conv dw", sig, conv_eval_w, &cc, wf, nw, &dw);
            }
            xmp_tensor_free(&dw);
            xmp_tensor_free(&db);
        }
        xmp_tensor_free(&dy);
        xmp_tensor_free(&y);
    }
    xmp_tensor_free(&x);
    xmp_tensor_free(&w);
    xmp_tensor_free(&b);
    free(xf), free(wf), free(bf), free(dyf), free(yr), free(dxr), free(dwr), free(dbr), free(col);
}

/* ------------------------------------------------------------ group norm */

typedef struct {
    int64_t xs[4], cs[1];
    const char *sx, *sg;
    const float *g, *b, *r;
    int groups;
} gn_ctx_t;

static double gn_eval_x(void *c_, const float *xf)
{
    gn_ctx_t *c = c_;
    xmp_tensor_t x = mk(4, c->xs, c->sx, xf), g = mk(1, c->cs, c->sg, c->g),
                 b = mk(1, c->cs, c->sg, c->b), y;
    xmp_gn_cache_t cache;
    double l = 0;
    if (xmp_groupnorm_forward(&x, &g, &b, c->groups, &y, &cache) == XMESH_SUCCESS) {
        l = dot_full(&y, c->r);
        xmp_tensor_free(&y);
        xmp_gn_cache_free(&cache);
    }
    xmp_tensor_free(&x);
    xmp_tensor_free(&g);
    xmp_tensor_free(&b);
    return l;
}

static void test_gn(const char *sx, const char *sg, int groups, int dofd)
{
    char sig[96];
    snprintf(sig, sizeof sig, "x %s gamma %s groups %d", sx, sg, groups);
    const int N = 4, C = 8, H = 4, W = 4;
    int64_t xs[4] = {N, C, H, W}, cs[1] = {C};
    size_t nx = numel(4, xs);
    float *xf = rnd(nx), *gf = rnd(C), *bf = rnd(C), *dyf = rnd(nx);
    float *yr = calloc(nx, 4), *dxr = calloc(nx, 4), *dgr = calloc(C, 4), *dbr = calloc(C, 4);
    float *mu = malloc((size_t)N * groups * 4), *rs = malloc((size_t)N * groups * 4);
    xmp_unet_groupnorm_forward(N, C, H * W, groups, xf, gf, bf, yr, mu, rs);
    xmp_unet_groupnorm_backward(N, C, H * W, groups, xf, dyf, gf, mu, rs, dxr, dgr, dbr);
    xmp_tensor_t x = mk(4, xs, sx, xf), g = mk(1, cs, sg, gf), b = mk(1, cs, sg, bf), y, dx, dg, db;
    xmp_gn_cache_t cache;
    xmesh_result_t r = xmp_groupnorm_forward(&x, &g, &b, groups, &y, &cache);
    CHECK(r == XMESH_SUCCESS, "gn forward [%s]: %s", sig, xmp_last_error());
    if (r == XMESH_SUCCESS) {
        cmp("gn y", sig, &y, yr);
        xmp_tensor_t dy = mk(4, xs, y.spec, dyf);
        r = xmp_groupnorm_backward(&dy, &x, &g, groups, &cache, &dx, NULL, NULL);
        CHECK(r == XMESH_SUCCESS, "gn backward input [%s]: %s", sig, xmp_last_error());
        if (r == XMESH_SUCCESS) {
            cmp("gn dx", sig, &dx, dxr);
            if (dofd) {
                gn_ctx_t cc = {{N, C, H, W}, {C}, sx, sg, gf, bf, dyf, groups};
                fd_tensor("gn dx", sig, gn_eval_x, &cc, xf, nx, &dx);
            }
            xmp_tensor_free(&dx);
        }
        r = xmp_groupnorm_backward(&dy, &x, &g, groups, &cache, NULL, &dg, &db);
        CHECK(r == XMESH_SUCCESS, "gn backward weight [%s]: %s", sig, xmp_last_error());
        if (r == XMESH_SUCCESS) {
            cmp("gn dgamma", sig, &dg, dgr);
            cmp("gn dbeta", sig, &db, dbr);
            xmp_tensor_free(&dg);
            xmp_tensor_free(&db);
        }
        xmp_tensor_free(&dy);
        xmp_tensor_free(&y);
        xmp_gn_cache_free(&cache);
    }
    xmp_tensor_free(&x);
    xmp_tensor_free(&g);
    xmp_tensor_free(&b);
    free(xf), free(gf), free(bf), free(dyf), free(yr), free(dxr), free(dgr), free(dbr);
    free(mu), free(rs);
}

/* ---------------------------------------- SiLU, up-sampling, concat, tokens */

typedef struct {
    int op; /* 0 silu, 1 upsample, 2 tokens */
    int64_t xs[4];
    const char *sx;
    const float *r;
} ew_ctx_t;

static xmesh_result_t ew_fwd(int op, const xmp_tensor_t *x, xmp_tensor_t *y)
{
    if (op == 0)
        return xmp_silu_forward(x, y);
    if (op == 1)
        return xmp_upsample2x_forward(x, y);
    return xmp_to_tokens_forward(x, y);
}

static xmesh_result_t ew_bwd(int op, const xmp_tensor_t *dy, const xmp_tensor_t *x,
                             xmp_tensor_t *dx)
{
    if (op == 0)
        return xmp_silu_backward(dy, x, dx);
    if (op == 1)
        return xmp_upsample2x_backward(dy, x, dx);
    return xmp_to_tokens_backward(dy, x, dx);
}

static double ew_eval(void *c_, const float *xf)
{
    ew_ctx_t *c = c_;
    xmp_tensor_t x = mk(4, c->xs, c->sx, xf), y;
    double l = 0;
    if (ew_fwd(c->op, &x, &y) == XMESH_SUCCESS) {
        l = dot_full(&y, c->r);
        xmp_tensor_free(&y);
    }
    xmp_tensor_free(&x);
    return l;
}

static void test_ew(int op, const char *sx, int dofd)
{
    static const char *names[3] = {"silu", "upsample2x", "to_tokens"};
    char sig[64], what[64];
    snprintf(sig, sizeof sig, "x %s", sx);
    const int N = 4, C = 4, H = 3, W = 3;
    int64_t xs[4] = {N, C, H, W};
    int64_t ys[4] = {N, C, op == 1 ? 2 * H : H, op == 1 ? 2 * W : W};
    size_t nx = numel(4, xs), ny = numel(4, ys);
    float *xf = rnd(nx), *dyf = rnd(ny), *yr = calloc(ny, 4), *dxr = calloc(nx, 4);
    if (op == 0) {
        xmp_unet_silu_forward(nx, xf, yr);
        xmp_unet_silu_backward(nx, xf, dyf, dxr);
    } else if (op == 1) {
        xmp_unet_upsample2x_forward(N, C, H, W, xf, yr);
        xmp_unet_upsample2x_backward(N, C, H, W, dyf, dxr);
    } else {
        xmp_unet_nchw_to_tokens(N, C, H * W, xf, yr);
        xmp_unet_nchw_to_tokens_backward(N, C, H * W, dyf, dxr);
    }
    xmp_tensor_t x = mk(4, xs, sx, xf), y, dx;
    xmesh_result_t r = ew_fwd(op, &x, &y);
    snprintf(what, sizeof what, "%s forward", names[op]);
    CHECK(r == XMESH_SUCCESS, "%s [%s]: %s", what, sig, xmp_last_error());
    if (r == XMESH_SUCCESS) {
        cmp(what, sig, &y, yr);
        xmp_tensor_t dy = mk_grad(&y, dyf);
        r = ew_bwd(op, &dy, &x, &dx);
        snprintf(what, sizeof what, "%s backward", names[op]);
        CHECK(r == XMESH_SUCCESS, "%s [%s]: %s", what, sig, xmp_last_error());
        if (r == XMESH_SUCCESS) {
            cmp(what, sig, &dx, dxr);
            if (op == 2) { /* and back: from_tokens forward/backward invert the layout change */
                xmp_tensor_t z, dt;
                CHECK(xmp_from_tokens_forward(&y, H, W, &z) == XMESH_SUCCESS,
                      "from_tokens [%s]: %s", sig, xmp_last_error());
                cmp("from_tokens forward", sig, &z, xf);
                CHECK(xmp_from_tokens_backward(&dx, &y, H, W, &dt) == XMESH_SUCCESS,
                      "from_tokens backward [%s]: %s", sig, xmp_last_error());
                float *tr = calloc(ny, 4);
                xmp_unet_tokens_to_nchw_backward(N, C, H * W, dxr, tr);
                cmp("from_tokens backward", sig, &dt, tr);
                free(tr);
                xmp_tensor_free(&z);
                xmp_tensor_free(&dt);
            }
            if (dofd) {
                ew_ctx_t cc = {op, {N, C, H, W}, sx, dyf};
                fd_tensor(names[op], sig, ew_eval, &cc, xf, nx, &dx);
            }
            xmp_tensor_free(&dx);
        }
        xmp_tensor_free(&dy);
        xmp_tensor_free(&y);
    }
    xmp_tensor_free(&x);
    free(xf), free(dyf), free(yr), free(dxr);
}

static void test_concat(const char *sa, const char *sb)
{
    char sig[64];
    snprintf(sig, sizeof sig, "a %s b %s", sa, sb);
    const int N = 4, CA = 3, CB = 2, HW = 4;
    int64_t as[4] = {N, CA, 2, 2}, bs[4] = {N, CB, 2, 2}, ys[4] = {N, CA + CB, 2, 2};
    size_t na = numel(4, as), nb = numel(4, bs), ny = numel(4, ys);
    float *af = rnd(na), *bf = rnd(nb), *dyf = rnd(ny), *yr = calloc(ny, 4), *dar = calloc(na, 4),
          *dbr = calloc(nb, 4);
    xmp_unet_concat_forward(N, CA, CB, HW, af, bf, yr);
    xmp_unet_concat_backward(N, CA, CB, HW, dyf, dar, dbr);
    xmp_tensor_t a = mk(4, as, sa, af), b = mk(4, bs, sb, bf), y, da, db;
    xmesh_result_t r = xmp_concat_forward(&a, &b, &y);
    CHECK(r == XMESH_SUCCESS, "concat [%s]: %s", sig, xmp_last_error());
    if (r == XMESH_SUCCESS) {
        cmp("concat y", sig, &y, yr);
        xmp_tensor_t dy = mk_grad(&y, dyf);
        r = xmp_concat_backward(&dy, &a, &b, &da, &db);
        CHECK(r == XMESH_SUCCESS, "concat backward [%s]: %s", sig, xmp_last_error());
        if (r == XMESH_SUCCESS) {
            cmp("concat da", sig, &da, dar);
            cmp("concat db", sig, &db, dbr);
            xmp_tensor_free(&da);
            xmp_tensor_free(&db);
        }
        xmp_tensor_free(&dy);
        xmp_tensor_free(&y);
    }
    xmp_tensor_free(&a);
    xmp_tensor_free(&b);
    free(af), free(bf), free(dyf), free(yr), free(dar), free(dbr);
}

/* -------------------------------------------------------------- attention */

typedef struct {
    int64_t qs[3], ks[3];
    const char *sq, *sk;
    const float *k, *v, *r;
    int hd;
} mha_ctx_t;

static double mha_eval_q(void *c_, const float *qf)
{
    mha_ctx_t *c = c_;
    xmp_tensor_t q = mk(3, c->qs, c->sq, qf), k = mk(3, c->ks, c->sk, c->k),
                 v = mk(3, c->ks, c->sk, c->v), o;
    xmp_mha_cache_t cache;
    double l = 0;
    if (xmp_mha_forward(&q, &k, &v, c->hd, &o, &cache) == XMESH_SUCCESS) {
        l = dot_full(&o, c->r);
        xmp_tensor_free(&o);
        xmp_mha_cache_free(&cache);
    }
    xmp_tensor_free(&q);
    xmp_tensor_free(&k);
    xmp_tensor_free(&v);
    return l;
}

static void test_mha(const char *sq, const char *sk, int dofd)
{
    char sig[64];
    snprintf(sig, sizeof sig, "q %s k,v %s", sq, sk);
    const int N = 2, TQ = 8, TK = 5, HEADS = 4, HD = 2, C = HEADS * HD;
    int64_t qs[3] = {N, TQ, C}, ks[3] = {N, TK, C};
    size_t nq = numel(3, qs), nk = numel(3, ks);
    float *qf = rnd(nq), *kf = rnd(nk), *vf = rnd(nk), *dof = rnd(nq);
    float *orf = calloc(nq, 4), *pr = calloc((size_t)N * HEADS * TQ * TK, 4), *dqr = calloc(nq, 4),
          *dkr = calloc(nk, 4), *dvr = calloc(nk, 4), *scr = calloc((size_t)TQ * TK, 4);
    xmp_unet_attn_t at;
    xmp_unet_attn_init(&at, N, TQ, TK, HEADS, HD);
    xmp_unet_attn_forward(&at, qf, kf, vf, orf, pr);
    xmp_unet_attn_backward(&at, qf, kf, vf, pr, dof, dqr, dkr, dvr, scr);
    xmp_tensor_t q = mk(3, qs, sq, qf), k = mk(3, ks, sk, kf), v = mk(3, ks, sk, vf), o, dq, dk, dv;
    xmp_mha_cache_t cache;
    xmesh_result_t r = xmp_mha_forward(&q, &k, &v, HD, &o, &cache);
    CHECK(r == XMESH_SUCCESS, "mha forward [%s]: %s", sig, xmp_last_error());
    if (r == XMESH_SUCCESS) {
        cmp("mha out", sig, &o, orf);
        xmp_tensor_t dout = mk(3, qs, o.spec, dof);
        r = xmp_mha_backward(&dout, &q, &k, &v, HD, &cache, &dq, &dk, &dv);
        CHECK(r == XMESH_SUCCESS, "mha backward [%s]: %s", sig, xmp_last_error());
        if (r == XMESH_SUCCESS) {
            cmp("mha dq", sig, &dq, dqr);
            cmp("mha dk", sig, &dk, dkr);
            cmp("mha dv", sig, &dv, dvr);
            if (dofd) {
                mha_ctx_t cc = {{N, TQ, C}, {N, TK, C}, sq, sk, kf, vf, dof, HD};
                fd_tensor("mha dq", sig, mha_eval_q, &cc, qf, nq, &dq);
            }
            xmp_tensor_free(&dq);
            xmp_tensor_free(&dk);
            xmp_tensor_free(&dv);
        }
        xmp_tensor_free(&dout);
        xmp_tensor_free(&o);
        xmp_mha_cache_free(&cache);
    }
    xmp_tensor_free(&q);
    xmp_tensor_free(&k);
    xmp_tensor_free(&v);
    free(qf), free(kf), free(vf), free(dof), free(orf), free(pr), free(dqr), free(dkr), free(dvr);
    free(scr);
}

/* -------------------------------------------------------------- refusals */

static void test_refusals(int p)
{
    int64_t xs[4] = {2, 4, 4, 4}, ws[4] = {4, 4, 3, 3}, cs[1] = {4};
    float *z = calloc(4096, 4);
    xmp_tensor_t x = mk(4, xs, "S(2)", z), w = mk(4, ws, "B", z), g = mk(1, cs, "B", z), y;
    xmp_gn_cache_t gc;
    expect_refusal(xmp_conv2d_forward(&x, &w, NULL, 1, 1, &y), "spatial split needs halo",
                   "conv x S(2)");
    expect_refusal(xmp_upsample2x_forward(&x, &y), "spatial split", "upsample x S(2)");
    expect_refusal(xmp_groupnorm_forward(&x, &g, &g, 2, &y, &gc), "spatial split", "gn x S(2)");
    xmp_tensor_free(&x);
    x = mk(4, xs, "S(1)", z);
    xmp_tensor_t b = mk(4, xs, "B", z);
    expect_refusal(xmp_concat_forward(&x, &b, &y), "channel pieces", "concat a S(1)");
    xmp_tensor_free(&x);
    xmp_tensor_free(&b);
    xmp_tensor_free(&w);
    xmp_tensor_free(&g);
    /* 3 heads of 2 channels (C 6) split over p = 2 or 4 pieces */
    int64_t qs[3] = {2, 4, 6};
    xmp_tensor_t q = mk(3, qs, "S(2)", z), k = mk(3, qs, "S(2)", z);
    xmp_mha_cache_t mc;
    expect_refusal(xmp_mha_forward(&q, &k, &k, 2, &y, &mc), "heads are not divisible",
                   "mha 3 heads over S(2)");
    (void)p;
    xmp_tensor_free(&q);
    xmp_tensor_free(&k);
    free(z);
}

int main(int argc, char **argv)
{
    int size;
    uint64_t seed = 20261125;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--seed"))
            seed = strtoull(argv[i + 1], NULL, 10);
    if (g_rank == 0)
        printf("test_utrans_sbp: %d ranks, seed %llu\n", size, (unsigned long long)seed);
    g_state = seed; /* the same stream on every rank: the same full tensors */
    int *ranks = malloc((size_t)size * sizeof(int));
    for (int i = 0; i < size; i++)
        ranks[i] = i;
    int nmesh = size == 4 ? 2 : 1;
    for (int mi = 0; mi < nmesh; mi++) {
        int shape1[1] = {size}, shape2[2] = {2, 2};
        if (xmp_mesh_create(MPI_COMM_WORLD, NULL, mi ? 2 : 1, mi ? shape2 : shape1, ranks,
                            &g_mesh) != XMESH_SUCCESS) {
            printf("mesh: %s\n", xmp_last_error());
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
        if (mi == 0) {
            for (int st = 1; st <= 2; st++) {
                test_conv("S(0)", "B", "B", st, st == 1);
                test_conv("B", "S(0)", "S(0)", st, st == 2);
                test_conv("S(1)", "S(1)", "B", st, 1);
                test_conv("B", "S(1)", "B", st, 0);
                test_conv("P", "B", "B", st, 0);
                test_conv("B", "P", "B", st, 0);
                test_conv("B", "B", "B", st, 0);
            }
            test_gn("S(0)", "B", 4, 1);
            test_gn("S(1)", "B", 4, 1);
            test_gn("S(1)", "S(0)", 4, 0);
            test_gn("S(1)", "B", 1, 1); /* a group spans ranks: statistics all-reduced */
            test_gn("S(1)", "S(0)", 2, 1);
            test_gn("B", "B", 2, 0);
            test_gn("P", "B", 4, 0);
            const char *ews[4] = {"S(0)", "S(1)", "B", "P"};
            for (int op = 0; op < 3; op++)
                for (int k = 0; k < 4; k++)
                    test_ew(op, ews[k], k == 1);
            test_concat("S(0)", "S(0)");
            test_concat("B", "S(0)");
            test_concat("P", "B");
            test_concat("B", "B");
            test_mha("S(0)", "S(0)", 1);
            test_mha("S(2)", "S(2)", 1);
            test_mha("S(2)", "B", 0);
            test_mha("S(1)", "B", 1);
            test_mha("B", "S(0)", 0);
            test_mha("P", "B", 0);
            if (size > 1)
                test_refusals(size);
        } else {
            test_conv("S(0),B", "B,S(0)", "B,S(0)", 1, 1);
            test_conv("S(0),S(1)", "B,S(1)", "B,B", 2, 1);
            test_conv("S(1),B", "S(1),S(0)", "B,B", 1, 0);
            test_gn("S(0),S(1)", "B,S(0)", 4, 1);
            test_gn("S(1),S(1)", "B,B", 4, 0);
            test_gn("S(1),S(1)", "B,S(0)", 2, 1); /* 4 pieces, 2 groups: spanning */
            test_gn("S(0),S(1)", "B,B", 1, 1);
            test_ew(0, "S(0),P", 0);
            test_ew(1, "S(1),S(0)", 0);
            test_ew(2, "S(0),S(1)", 0);
            test_concat("S(0),B", "B,B");
            test_mha("S(0),S(2)", "B,S(2)", 1);
            test_mha("S(2),S(2)", "B,B", 0);
        }
        xmp_mesh_destroy(g_mesh);
    }
    int all = 0;
    MPI_Allreduce(&g_fail, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (g_rank == 0)
        printf("test_utrans_sbp: %s (%d failures, seed %llu)\n", all ? "FAILED" : "OK", all,
               (unsigned long long)seed);
    free(ranks);
    MPI_Finalize();
    return all ? 1 : 0;
}
