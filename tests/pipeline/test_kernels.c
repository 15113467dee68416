/*
 * Unit tests of pipeline/nn/kernels.c: finite-difference gradient checks of every backward,
 * the vocab-split pieces against the serial versions, AdamW against an independent double
 * reference, and the random number generators.
 *
 * Gradient checks: objective J = sum_i out_i * R_i with a fixed random R (so dout = R),
 * accumulated in double; central differences with h = 1e-2 on inputs of order 1.
 * Tolerance |fd - an| <= 2e-3 + 2e-2 |an|: the truncation error of the central difference is
 * O(h^2 f''') ~ 1e-4, the f32 rounding of the forward (~6e-8 relative per output, summed over
 * <= ~500 outputs) divided by 2h is ~1e-4; the margin covers both by 10x while a wrong
 * formula (missing term, wrong sign, factor 2) is off by far more.
 *
 * Usage: test_kernels [--seed N]  (the seed is printed; pass it to replay).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/kernels.h"

static int g_fail = 0;
static uint64_t g_rng;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                            \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
            g_fail++;                                                                              \
        }                                                                                          \
    } while (0)

static float urand(void) /* [-1, 1) */
{
    return (float)((xmp_splitmix64(&g_rng) >> 40) * (2.0 / 16777216.0) - 1.0);
}

static float *rnd(size_t n, float scale)
{
    float *p = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        p[i] = scale * urand();
    return p;
}

static float *zeros(size_t n)
{
    return calloc(n, sizeof(float));
}

static double dot(const float *a, const float *b, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)a[i] * b[i];
    return s;
}

/* ---- generic finite-difference driver ---- */

typedef double (*objective_fn)(void *ctx);

/* Compares an[i] with the central difference of obj w.r.t. x[i] for all i < n. */
static void fd_check(const char *name, objective_fn obj, void *ctx, float *x, const float *an,
                     size_t n)
{
    const float h = 1e-2f;
    int bad = 0;
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        float x0 = x[i];
        x[i] = x0 + h;
        double jp = obj(ctx);
        x[i] = x0 - h;
        double jm = obj(ctx);
        x[i] = x0;
        double fd = (jp - jm) / (2.0 * (double)h);
        double err = fabs(fd - an[i]);
        double tol = 2e-3 + 2e-2 * fabs(an[i]);
        if (err / tol > worst)
            worst = err / tol;
        if (err > tol && bad++ < 5)
            printf("FAIL %s[%zu]: analytic %.6g finite-difference %.6g\n", name, i, an[i], fd);
    }
    obj(ctx); /* leave the context's outputs at the unperturbed point */
    if (bad)
        g_fail++;
    printf("  %-26s %5zu entries  worst err/tol %.3f\n", name, n, worst);
}

/* ---- embeddings ---- */

typedef struct {
    int B, T, C, V;
    int *tok;
    float *wte, *wpe, *out, *R;
} emb_ctx;

static double emb_obj(void *p)
{
    emb_ctx *c = p;
    xmp_embed_range_fwd(c->out, c->tok, (size_t)c->B * c->T, c->wte, 0, c->V, c->C);
    xmp_pos_add_fwd(c->out, c->wpe, c->B, c->T, c->C);
    return dot(c->out, c->R, (size_t)c->B * c->T * c->C);
}

static void test_embedding(void)
{
    printf("embedding\n");
    emb_ctx c = {.B = 2, .T = 5, .C = 6, .V = 11};
    size_t N = (size_t)c.B * c.T, n = N * c.C;
    c.tok = malloc(N * sizeof(int));
    for (size_t i = 0; i < N; i++)
        c.tok[i] = (int)(xmp_splitmix64(&g_rng) % (uint64_t)c.V);
    c.tok[1] = c.tok[0]; /* a repeated token exercises accumulation */
    c.wte = rnd((size_t)c.V * c.C, 1);
    c.wpe = rnd((size_t)c.T * c.C, 1);
    c.out = zeros(n);
    c.R = rnd(n, 1);
    float *dwte = zeros((size_t)c.V * c.C), *dwpe = zeros((size_t)c.T * c.C);
    xmp_embed_range_bwd(dwte, c.R, c.tok, N, 0, c.V, c.C);
    xmp_pos_add_bwd(dwpe, c.R, c.B, c.T, c.C);
    fd_check("embed dwte", emb_obj, &c, c.wte, dwte, (size_t)c.V * c.C);
    fd_check("pos dwpe", emb_obj, &c, c.wpe, dwpe, (size_t)c.T * c.C);

    /* vocab ranges: the partial lookups sum to the full one, exactly (one term is nonzero) */
    const int cuts[][4] = {{0, 4, 8, 11}, {0, 1, 10, 11}, {0, 5, 5, 11}};
    float *full = zeros(N * c.C), *part = zeros(N * c.C), *acc = zeros(N * c.C);
    xmp_embed_range_fwd(full, c.tok, N, c.wte, 0, c.V, c.C);
    for (int k = 0; k < 3; k++) {
        memset(acc, 0, N * c.C * sizeof(float));
        float *dsum = zeros((size_t)c.V * c.C);
        for (int r = 0; r < 3; r++) {
            int v0 = cuts[k][r], vl = cuts[k][r + 1] - v0;
            xmp_embed_range_fwd(part, c.tok, N, c.wte + (size_t)v0 * c.C, v0, vl, c.C);
            for (size_t i = 0; i < N * c.C; i++)
                acc[i] += part[i];
            /* backward of a range touches only its own rows */
            xmp_embed_range_bwd(dsum + (size_t)v0 * c.C, c.R, c.tok, N, v0, vl, c.C);
        }
        CHECK(!memcmp(acc, full, N * c.C * sizeof(float)), "range split %d: sum != full", k);
        CHECK(!memcmp(dsum, dwte, (size_t)c.V * c.C * sizeof(float)),
              "range split %d: scattered grads != full", k);
        free(dsum);
    }
    free(full), free(part), free(acc), free(dwte), free(dwpe);
    free(c.tok), free(c.wte), free(c.wpe), free(c.out), free(c.R);
}

/* ---- layernorm ---- */

typedef struct {
    size_t N;
    int C;
    float *x, *w, *b, *out, *mean, *rstd, *R;
} ln_ctx;

static double ln_obj(void *p)
{
    ln_ctx *c = p;
    xmp_layernorm_fwd(c->out, c->mean, c->rstd, c->x, c->w, c->b, c->N, c->C);
    return dot(c->out, c->R, c->N * c->C);
}

static void test_layernorm(void)
{
    printf("layernorm\n");
    ln_ctx c = {.N = 6, .C = 10};
    size_t n = c.N * c.C;
    c.x = rnd(n, 2);
    c.w = rnd(c.C, 1);
    c.b = rnd(c.C, 1);
    c.out = zeros(n), c.mean = zeros(c.N), c.rstd = zeros(c.N), c.R = rnd(n, 1);
    ln_obj(&c);
    float *dx = zeros(n), *dw = zeros(c.C), *db = zeros(c.C);
    xmp_layernorm_bwd(dx, dw, db, c.R, c.x, c.w, c.mean, c.rstd, c.N, c.C);
    fd_check("layernorm dinp", ln_obj, &c, c.x, dx, n);
    fd_check("layernorm dweight", ln_obj, &c, c.w, dw, c.C);
    fd_check("layernorm dbias", ln_obj, &c, c.b, db, c.C);
    /* split backward (NULL parts) gives the same numbers, and accumulates */
    float *dx2 = zeros(n), *dw2 = zeros(c.C), *db2 = zeros(c.C);
    xmp_layernorm_bwd(dx2, NULL, NULL, c.R, c.x, c.w, c.mean, c.rstd, c.N, c.C);
    xmp_layernorm_bwd(NULL, dw2, db2, c.R, c.x, c.w, c.mean, c.rstd, c.N, c.C);
    CHECK(!memcmp(dx, dx2, n * sizeof(float)) && !memcmp(dw, dw2, c.C * sizeof(float)) &&
              !memcmp(db, db2, c.C * sizeof(float)),
          "layernorm split backward differs");
    xmp_layernorm_bwd(dx2, NULL, NULL, c.R, c.x, c.w, c.mean, c.rstd, c.N, c.C);
    CHECK(fabsf(dx2[3] - 2 * dx[3]) <= 1e-6f * fabsf(dx[3]) + 1e-7f, "layernorm does not +=");
    free(dx), free(dw), free(db), free(dx2), free(dw2), free(db2);
    free(c.x), free(c.w), free(c.b), free(c.out), free(c.mean), free(c.rstd), free(c.R);
}

/* ---- matmul ---- */

typedef struct {
    size_t N;
    int C, OC;
    float *x, *w, *b, *out, *R;
} mm_ctx;

static double mm_obj(void *p)
{
    mm_ctx *c = p;
    xmp_matmul_fwd(c->out, c->x, c->w, c->b, c->N, c->C, c->OC);
    return dot(c->out, c->R, c->N * c->OC);
}

static void test_matmul(void)
{
    printf("matmul\n");
    for (int with_bias = 1; with_bias >= 0; with_bias--) {
        mm_ctx c = {.N = 7, .C = 5, .OC = 9};
        c.x = rnd(c.N * c.C, 1);
        c.w = rnd((size_t)c.OC * c.C, 1);
        c.b = with_bias ? rnd(c.OC, 1) : NULL;
        c.out = zeros(c.N * c.OC);
        c.R = rnd(c.N * c.OC, 1);
        /* forward against the definition out = x . W^T + b */
        mm_obj(&c);
        double maxerr = 0;
        for (size_t n = 0; n < c.N; n++)
            for (int o = 0; o < c.OC; o++) {
                double s = with_bias ? c.b[o] : 0.0;
                for (int i = 0; i < c.C; i++)
                    s += (double)c.x[n * c.C + i] * c.w[(size_t)o * c.C + i];
                maxerr = fmax(maxerr, fabs(s - c.out[n * c.OC + o]));
            }
        CHECK(maxerr < 1e-5, "matmul forward off by %g", maxerr);
        float *dx = zeros(c.N * c.C), *dw = zeros((size_t)c.OC * c.C);
        float *db = with_bias ? zeros(c.OC) : NULL;
        xmp_matmul_bwd_input(dx, c.R, c.w, c.N, c.C, c.OC);
        xmp_matmul_bwd_weight(dw, db, c.R, c.x, c.N, c.C, c.OC);
        fd_check(with_bias ? "matmul dinp" : "matmul(nobias) dinp", mm_obj, &c, c.x, dx, c.N * c.C);
        fd_check(with_bias ? "matmul dweight" : "matmul(nobias) dweight", mm_obj, &c, c.w, dw,
                 (size_t)c.OC * c.C);
        if (with_bias)
            fd_check("matmul dbias", mm_obj, &c, c.b, db, c.OC);
        free(dx), free(dw), free(db), free(c.x), free(c.w), free(c.b), free(c.out), free(c.R);
    }
}

/* ---- attention ---- */

typedef struct {
    int B, T, NH, hs;
    float *qkv, *out, *att, *R;
} at_ctx;

static double at_obj(void *p)
{
    at_ctx *c = p;
    xmp_attention_fwd(c->out, NULL, c->att, c->qkv, c->B, c->T, c->NH, c->hs);
    return dot(c->out, c->R, (size_t)c->B * c->T * c->NH * c->hs);
}

static void test_attention(void)
{
    printf("attention\n");
    at_ctx c = {.B = 2, .T = 5, .NH = 3, .hs = 4};
    size_t C = (size_t)c.NH * c.hs, n3 = (size_t)c.B * c.T * 3 * C, n = (size_t)c.B * c.T * C;
    size_t na = (size_t)c.B * c.NH * c.T * c.T;
    c.qkv = rnd(n3, 1.5f);
    c.out = zeros(n), c.att = zeros(na), c.R = rnd(n, 1);
    at_obj(&c);
    float *dqkv = zeros(n3), *work = zeros((size_t)c.T);
    xmp_attention_bwd(dqkv, c.R, c.qkv, c.att, c.B, c.T, c.NH, c.hs, work);
    fd_check("attention dqkv", at_obj, &c, c.qkv, dqkv, n3);
    /* softmax rows sum to 1 over t2 <= t, zero above the diagonal; preatt is optional */
    float *pre = zeros(na), *out2 = zeros(n), *att2 = zeros(na);
    xmp_attention_fwd(out2, pre, att2, c.qkv, c.B, c.T, c.NH, c.hs);
    CHECK(!memcmp(out2, c.out, n * sizeof(float)), "attention out depends on preatt");
    for (size_t r = 0; r < na / c.T; r++) {
        int t = (int)(r % c.T);
        double s = 0;
        for (int t2 = 0; t2 < c.T; t2++) {
            s += c.att[r * c.T + t2];
            if (t2 > t)
                CHECK(c.att[r * c.T + t2] == 0.0f && pre[r * c.T + t2] == 0.0f,
                      "attention: nonzero above the diagonal at row %zu col %d", r, t2);
        }
        CHECK(fabs(s - 1.0) < 1e-5, "attention row %zu sums to %g", r, s);
    }
    /* a head subset (tensor-parallel rank) computes the same as those heads of the full call:
     * build qkv for heads {1,2} only */
    int NHl = 2, h0 = 1;
    size_t Cl = (size_t)NHl * c.hs;
    float *qkvl = zeros((size_t)c.B * c.T * 3 * Cl), *outl = zeros((size_t)c.B * c.T * Cl);
    float *attl = zeros((size_t)c.B * NHl * c.T * c.T);
    for (int bt = 0; bt < c.B * c.T; bt++)
        for (int k = 0; k < 3; k++)
            memcpy(qkvl + (size_t)bt * 3 * Cl + k * Cl,
                   c.qkv + (size_t)bt * 3 * C + k * C + (size_t)h0 * c.hs, Cl * sizeof(float));
    xmp_attention_fwd(outl, NULL, attl, qkvl, c.B, c.T, NHl, c.hs);
    int same = 1;
    for (int bt = 0; bt < c.B * c.T; bt++)
        same &= !memcmp(outl + (size_t)bt * Cl, c.out + (size_t)bt * C + (size_t)h0 * c.hs,
                        Cl * sizeof(float));
    CHECK(same, "attention over a head subset differs from the full call");
    free(qkvl), free(outl), free(attl), free(pre), free(out2), free(att2);
    free(dqkv), free(work), free(c.qkv), free(c.out), free(c.att), free(c.R);
}

/* ---- pointwise ---- */

typedef struct {
    size_t n;
    float *x, *y, *out, *R;
    int which;
} pw_ctx;

static double pw_obj(void *p)
{
    pw_ctx *c = p;
    if (c->which == 0)
        xmp_gelu_fwd(c->out, c->x, c->n);
    else
        xmp_residual_fwd(c->out, c->x, c->y, c->n);
    return dot(c->out, c->R, c->n);
}

static void test_pointwise(void)
{
    printf("gelu, residual\n");
    pw_ctx c = {.n = 64};
    c.x = rnd(c.n, 4);
    c.y = rnd(c.n, 1);
    c.out = zeros(c.n), c.R = rnd(c.n, 1);
    float *dx = zeros(c.n), *dy = zeros(c.n);
    xmp_gelu_bwd(dx, c.x, c.R, c.n);
    c.which = 0;
    fd_check("gelu dinp", pw_obj, &c, c.x, dx, c.n);
    /* reference values of the tanh form */
    float v[3] = {-1.0f, 0.5f, 3.0f}, g[3];
    xmp_gelu_fwd(g, v, 3);
    const double ref[3] = {-0.15880800939, 0.34571400983, 2.99636260792};
    for (int i = 0; i < 3; i++)
        CHECK(fabs(g[i] - ref[i]) < 1e-6, "gelu(%g) = %.9g, expected %.9g", v[i], g[i], ref[i]);
    memset(dx, 0, c.n * sizeof(float));
    xmp_residual_bwd(dx, dy, c.R, c.n);
    c.which = 1;
    fd_check("residual da", pw_obj, &c, c.x, dx, c.n);
    fd_check("residual db", pw_obj, &c, c.y, dy, c.n);
    free(dx), free(dy), free(c.x), free(c.y), free(c.out), free(c.R);
}

/* ---- cross-entropy ---- */

typedef struct {
    size_t N;
    int V, Vp;
    int *tg;
    float *logits, *probs, *losses, *dl;
} ce_ctx;

static double ce_obj(void *p)
{
    ce_ctx *c = p;
    xmp_softmax_fwd(c->probs, c->logits, c->N, c->V, c->Vp);
    xmp_crossentropy_fwd(c->losses, c->probs, c->tg, c->N, c->Vp);
    return dot(c->losses, c->dl, c->N);
}

static void test_crossentropy(void)
{
    printf("softmax cross-entropy (serial and vocab-split)\n");
    ce_ctx c = {.N = 5, .V = 21, .Vp = 24};
    size_t n = c.N * (size_t)c.Vp;
    c.tg = malloc(c.N * sizeof(int));
    for (size_t i = 0; i < c.N; i++)
        c.tg[i] = (int)(xmp_splitmix64(&g_rng) % (uint64_t)c.V);
    c.tg[0] = c.V - 1; /* target in the last real column */
    c.logits = rnd(n, 3);
    for (size_t i = 0; i < c.N; i++)
        for (int j = c.V; j < c.Vp; j++)
            c.logits[i * c.Vp + j] = 50.0f; /* padded logits must be ignored */
    c.probs = zeros(n), c.losses = zeros(c.N), c.dl = rnd(c.N, 1);
    ce_obj(&c);
    float *dlog = zeros(n);
    xmp_crossentropy_softmax_bwd(dlog, c.dl, c.probs, c.tg, c.N, c.V, c.Vp);
    fd_check("crossentropy dlogits", ce_obj, &c, c.logits, dlog, n);
    for (size_t i = 0; i < c.N; i++)
        for (int j = c.V; j < c.Vp; j++)
            CHECK(c.probs[i * c.Vp + j] == 0.0f && dlog[i * c.Vp + j] == 0.0f,
                  "padded column %d not ignored", j);

    /* vocab-split: ranges combined by hand must equal the serial loss and gradient */
    const int cuts[][4] = {{0, 8, 16, 24}, {0, 5, 17, 24}, {0, 20, 22, 24}};
    float *gmax = zeros(c.N), *gsum = zeros(c.N), *tl = zeros(c.N), *loss = zeros(c.N);
    float *part = zeros(c.N), *dsplit = zeros(n);
    for (int k = 0; k < 3; k++) {
        float *loc[3];
        int v0[3], vl[3];
        for (int r = 0; r < 3; r++) {
            v0[r] = cuts[k][r];
            vl[r] = cuts[k][r + 1] - v0[r];
            loc[r] = zeros(c.N * (size_t)vl[r]);
            for (size_t i = 0; i < c.N; i++)
                memcpy(loc[r] + i * vl[r], c.logits + i * c.Vp + v0[r], vl[r] * sizeof(float));
        }
        for (size_t i = 0; i < c.N; i++)
            gmax[i] = -INFINITY, gsum[i] = 0, tl[i] = 0;
        for (int r = 0; r < 3; r++) { /* "allreduce max" */
            xmp_xent_local_max(part, loc[r], c.N, v0[r], vl[r], c.V);
            for (size_t i = 0; i < c.N; i++)
                gmax[i] = fmaxf(gmax[i], part[i]);
        }
        for (int r = 0; r < 3; r++) { /* "allreduce sum" of exp sums and target logits */
            xmp_xent_local_sumexp(part, loc[r], gmax, c.N, v0[r], vl[r], c.V);
            for (size_t i = 0; i < c.N; i++)
                gsum[i] += part[i];
            xmp_xent_local_target(part, loc[r], c.tg, c.N, v0[r], vl[r]);
            for (size_t i = 0; i < c.N; i++)
                tl[i] += part[i];
        }
        xmp_xent_losses(loss, gmax, gsum, tl, c.N);
        for (size_t i = 0; i < c.N; i++)
            CHECK(fabsf(loss[i] - c.losses[i]) <= 1e-5f * (1 + fabsf(c.losses[i])),
                  "split %d row %zu: loss %.8g vs serial %.8g", k, i, loss[i], c.losses[i]);
        memset(dsplit, 0, n * sizeof(float));
        for (int r = 0; r < 3; r++) {
            float *dl = zeros(c.N * (size_t)vl[r]);
            xmp_xent_local_bwd(dl, loc[r], gmax, gsum, c.tg, c.dl, c.N, v0[r], vl[r], c.V);
            for (size_t i = 0; i < c.N; i++)
                memcpy(dsplit + i * c.Vp + v0[r], dl + i * vl[r], vl[r] * sizeof(float));
            free(dl);
            free(loc[r]);
        }
        double maxerr = 0;
        for (size_t i = 0; i < n; i++)
            maxerr = fmax(maxerr, fabs(dsplit[i] - dlog[i]));
        CHECK(maxerr < 1e-6, "split %d: dlogits differ by %g", k, maxerr);
    }
    free(gmax), free(gsum), free(tl), free(loss), free(part), free(dsplit), free(dlog);
    free(c.tg), free(c.logits), free(c.probs), free(c.losses), free(c.dl);
}

/* ---- AdamW ---- */

static void test_adamw(void)
{
    printf("adamw\n");
    const size_t n = 50;
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    float *p = rnd(n, 1), *m = zeros(n), *v = zeros(n);
    double *rp = malloc(n * sizeof(double)), *rm = calloc(n, sizeof(double)),
           *rv = calloc(n, sizeof(double));
    for (size_t i = 0; i < n; i++)
        rp[i] = p[i];
    double maxerr = 0;
    for (int t = 1; t <= 4; t++) {
        float *g = rnd(n, 1);
        xmp_adamw(p, g, m, v, n, lr, b1, b2, eps, wd, t);
        for (size_t i = 0; i < n; i++) {
            rm[i] = b1 * rm[i] + (1 - (double)b1) * g[i];
            rv[i] = b2 * rv[i] + (1 - (double)b2) * g[i] * g[i];
            double mh = rm[i] / (1 - pow(b1, t)), vh = rv[i] / (1 - pow(b2, t));
            rp[i] -= lr * (mh / (sqrt(vh) + eps) + wd * rp[i]);
            maxerr = fmax(maxerr, fabs(rp[i] - p[i]));
        }
        free(g);
    }
    CHECK(maxerr < 1e-5, "adamw differs from the double reference by %g", maxerr);
    free(p), free(m), free(v), free(rp), free(rm), free(rv);
}

/* ---- random numbers ---- */

static void test_rng(void)
{
    printf("rng\n");
    xmp_mt19937_t r;
    xmp_mt19937_seed(&r, 5489);
    uint32_t x = 0;
    for (int i = 0; i < 10000; i++)
        x = xmp_mt19937_u32(&r);
    CHECK(x == 4123659995u, "mt19937(5489) 10000th output %u, expected 4123659995", x);
    xmp_mt19937_seed(&r, 137);
    x = xmp_mt19937_u32(&r);
    CHECK(x == 4053805790u, "mt19937(137) first output %u, expected 4053805790", x);
    int perm[100], seen[100] = {0};
    for (int i = 0; i < 100; i++)
        perm[i] = i;
    xmp_mt19937_permute(perm, 100, &r);
    int moved = 0;
    for (int i = 0; i < 100; i++)
        seen[perm[i]]++, moved += perm[i] != i;
    for (int i = 0; i < 100; i++)
        CHECK(seen[i] == 1, "permutation holds %d %d times", i, seen[i]);
    CHECK(moved > 50, "permutation moved only %d of 100", moved);

    /* normal: moments, and shard slices equal the full tensor */
    const size_t n = 200000;
    float *full = malloc(n * sizeof(float));
    xmp_normal_fill(full, n, 7, 3, 0, 1.0f);
    double s = 0, s2 = 0;
    for (size_t i = 0; i < n; i++)
        s += full[i], s2 += (double)full[i] * full[i];
    double mean = s / n, sd = sqrt(s2 / n - mean * mean);
    CHECK(fabs(mean) < 0.01 && fabs(sd - 1) < 0.01, "normal mean %g sd %g", mean, sd);
    float slice[1000];
    xmp_normal_fill(slice, 1000, 7, 3, 12345, 1.0f);
    CHECK(!memcmp(slice, full + 12345, sizeof slice), "normal slice differs from full tensor");
    xmp_normal_fill(slice, 10, 7, 4, 0, 1.0f);
    CHECK(memcmp(slice, full, 10 * sizeof(float)) != 0, "streams 3 and 4 coincide");
    free(full);
}

int main(int argc, char **argv)
{
    uint64_t seed = 20240326;
    if (argc == 3 && !strcmp(argv[1], "--seed"))
        seed = strtoull(argv[2], NULL, 0);
    printf("test_kernels: seed %llu (replay with --seed %llu)\n", (unsigned long long)seed,
           (unsigned long long)seed);
    g_rng = seed;
    test_embedding();
    test_layernorm();
    test_matmul();
    test_attention();
    test_pointwise();
    test_crossentropy();
    test_adamw();
    test_rng();
    printf("%s: %d failure(s)\n", g_fail ? "FAILED" : "OK", g_fail);
    return g_fail ? 1 : 0;
}
