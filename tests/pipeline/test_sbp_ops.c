/* SBP layers under MPI: finite-difference gradients of every op with random
 * SBP signatures (uneven shapes; 1-D and 2-D meshes), and a 2-layer MLP with
 * cross-entropy under DP, TP and DPxTP against one process computing the
 * whole thing. Usage: test_sbp_ops [--seed S]. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "nn/sbp_layers.h"
#include "nn/sbp_ops.h"
#include "sbp_test_util.h"

static uint64_t g_seed = 4321;

static void grad_tensor(xmp_tensor_t *d, const xmp_tensor_t *out, const float *R)
{
    xmp_sbp_t g[XMP_MAX_MESH_DIMS];
    for (int a = 0; a < XMP_MAX_MESH_DIMS; a++)
        g[a] = xmp_sbp_grad(out->sbp[a]);
    make(d, out->mesh, out->ndim, out->shape, g, R);
}

static void check_grad(const char *what, double fd, float an)
{
    if (fabs(fd - an) > 3e-3 * (1.0 + fabs(fd)))
        FAIL("%s: finite difference %.6f, analytic %.6f", what, fd, (double)an);
}

/* ------------------------------------------------------------ linear FD */

typedef struct {
    xmp_mesh_t *m;
    int nx, nw;
    int64_t xs[4], ws[4];
    xmp_sbp_t sx[4], sw[4], sb[4];
    float *X, *W, *B, *R;
} lin_case_t;

static double lin_eval(lin_case_t *c, xmp_tensor_t *y_keep)
{
    xmp_tensor_t x, w, b, y;
    make(&x, c->m, c->nx, c->xs, c->sx, c->X);
    make(&w, c->m, c->nw, c->ws, c->sw, c->W);
    make(&b, c->m, c->nw - 1, c->ws, c->sb, c->B);
    double L = 0;
    if (xmp_linear_forward(&x, &w, &b, &y)) {
        FAIL("linear forward x %s w %s b %s: %s", x.spec, w.spec, b.spec, xmp_last_error());
    } else {
        L = objective(&y, c->R);
        if (y_keep)
            *y_keep = y;
        else
            xmp_tensor_free(&y);
    }
    xmp_tensor_free(&x);
    xmp_tensor_free(&w);
    xmp_tensor_free(&b);
    return L;
}

static void fd_check(const char *what, float *arr, int64_t n, const float *an,
                     double (*eval)(void *), void *ctx)
{
    const float eps = 1e-2f;
    for (int k = 0; k < 3 && n > 0; k++) {
        int64_t e = irand((int)n);
        float keep = arr[e];
        arr[e] = keep + eps;
        double lp = eval(ctx);
        arr[e] = keep - eps;
        double lm = eval(ctx);
        arr[e] = keep;
        char buf[200];
        snprintf(buf, sizeof buf, "%s element %lld", what, (long long)e);
        check_grad(buf, (lp - lm) / (2.0 * eps), an[e]);
    }
}

static double lin_eval_v(void *c)
{
    return lin_eval(c, NULL);
}

static void test_linear(xmp_mesh_t *m, int ncases)
{
    for (int it = 0; it < ncases; it++) {
        lin_case_t c;
        memset(&c, 0, sizeof c);
        c.m = m;
        int64_t K = 3 + irand(5);
        if (irand(2)) {
            c.nx = 2, c.xs[0] = 5, c.xs[1] = K;
        } else {
            c.nx = 3, c.xs[0] = 2, c.xs[1] = 3, c.xs[2] = K;
        }
        if (irand(2)) {
            c.nw = 2, c.ws[0] = 6, c.ws[1] = K;
        } else { /* QKV-like weight with two out dims */
            c.nw = 3, c.ws[0] = 3, c.ws[1] = 2, c.ws[2] = K;
        }
        rand_sbp(m, c.nx, 1, c.sx);
        rand_sbp(m, c.nw, 1, c.sw);
        rand_sbp(m, c.nw - 1, 1, c.sb);
        int64_t nx = numel(c.nx, c.xs), nw = numel(c.nw, c.ws), nb = numel(c.nw - 1, c.ws);
        int64_t ys[8], ny;
        memcpy(ys, c.xs, sizeof(int64_t) * (size_t)(c.nx - 1));
        memcpy(ys + c.nx - 1, c.ws, sizeof(int64_t) * (size_t)(c.nw - 1));
        ny = numel(c.nx + c.nw - 2, ys);
        c.X = malloc(sizeof(float) * (size_t)nx);
        c.W = malloc(sizeof(float) * (size_t)nw);
        c.B = malloc(sizeof(float) * (size_t)nb);
        c.R = malloc(sizeof(float) * (size_t)ny);
        for (int64_t e = 0; e < nx; e++)
            c.X[e] = urand();
        for (int64_t e = 0; e < nw; e++)
            c.W[e] = urand();
        for (int64_t e = 0; e < nb; e++)
            c.B[e] = urand();
        for (int64_t e = 0; e < ny; e++)
            c.R[e] = urand();
        xmp_tensor_t x, w, y, dy, dx, dw, db;
        lin_eval(&c, &y);
        { /* one engine: the pure deduction gives the SBP the op produced */
            int nd[3] = {c.nx, c.nw, c.nw - 1};
            const xmp_sbp_t *in[3] = {c.sx, c.sw, c.sb};
            xmp_sbp_t d[XMP_MAX_MESH_DIMS];
            char err[400];
            if (xmp_sbp_deduce("linear", m->ndim, 3, nd, in, d, err, sizeof err))
                FAIL("xmp_sbp_deduce refuses a linear the op ran: %s", err);
            for (int a = 0; a < m->ndim; a++)
                if (!xmp_sbp_eq(d[a], y.sbp[a]))
                    FAIL("xmp_sbp_deduce: linear axis %d differs from the op's output %s", a,
                         y.spec);
        }
        grad_tensor(&dy, &y, c.R);
        make(&x, m, c.nx, c.xs, c.sx, c.X);
        make(&w, m, c.nw, c.ws, c.sw, c.W);
        char what[320];
        snprintf(what, sizeof what, "linear x(%dd) %s w(%dd) %s -> y %s", c.nx, x.spec, c.nw,
                 w.spec, y.spec);
        if (xmp_linear_backward_input(&dy, &w, &dx) ||
            xmp_linear_backward_weight(&dy, &x, &dw, &db)) {
            FAIL("%s: backward: %s", what, xmp_last_error());
        } else {
            float *gx = full_of(&dx), *gw = full_of(&dw), *gb = full_of(&db);
            char w2[480];
            snprintf(w2, sizeof w2, "%s dX (%s)", what, dx.spec);
            fd_check(w2, c.X, nx, gx, lin_eval_v, &c);
            snprintf(w2, sizeof w2, "%s dW (%s)", what, dw.spec);
            fd_check(w2, c.W, nw, gw, lin_eval_v, &c);
            snprintf(w2, sizeof w2, "%s db (%s)", what, db.spec);
            fd_check(w2, c.B, nb, gb, lin_eval_v, &c);
            free(gx);
            free(gw);
            free(gb);
            xmp_tensor_free(&dx);
            xmp_tensor_free(&dw);
            xmp_tensor_free(&db);
        }
        xmp_tensor_free(&x);
        xmp_tensor_free(&w);
        xmp_tensor_free(&y);
        xmp_tensor_free(&dy);
        free(c.X);
        free(c.W);
        free(c.B);
        free(c.R);
    }
}

/* --------------------------------------------------- add, GELU: FD checks */

typedef struct {
    xmp_mesh_t *m;
    int64_t s[3];
    xmp_sbp_t sx[4], sy[4];
    float *X, *Y, *R;
    int gelu;
} ew_case_t;

static double ew_eval(void *p)
{
    ew_case_t *c = p;
    xmp_tensor_t x, y, z;
    double L = 0;
    make(&x, c->m, 3, c->s, c->sx, c->X);
    make(&y, c->m, 3, c->s, c->sy, c->Y);
    if (c->gelu ? xmp_gelu_forward(&x, &z) : xmp_add_forward(&x, &y, &z)) {
        FAIL("elementwise forward: %s", xmp_last_error());
    } else {
        L = objective(&z, c->R);
        xmp_tensor_free(&z);
    }
    xmp_tensor_free(&x);
    xmp_tensor_free(&y);
    return L;
}

static void test_elementwise(xmp_mesh_t *m, int ncases)
{
    for (int it = 0; it < ncases; it++) {
        ew_case_t c = {m, {3, 5, 2}, {{0}}, {{0}}, NULL, NULL, NULL, it & 1};
        rand_sbp(m, 3, 1, c.sx);
        rand_sbp(m, 3, 1, c.sy);
        int64_t n = 30;
        c.X = malloc(sizeof(float) * 30);
        c.Y = malloc(sizeof(float) * 30);
        c.R = malloc(sizeof(float) * 30);
        for (int e = 0; e < n; e++) {
            c.X[e] = 2 * urand();
            c.Y[e] = urand();
            c.R[e] = urand();
        }
        xmp_tensor_t x, y, z, dz, dx, dy;
        make(&x, m, 3, c.s, c.sx, c.X);
        make(&y, m, 3, c.s, c.sy, c.Y);
        char what[320];
        if (c.gelu ? xmp_gelu_forward(&x, &z) : xmp_add_forward(&x, &y, &z)) {
            FAIL("forward: %s", xmp_last_error());
            continue;
        }
        snprintf(what, sizeof what, "%s x %s y %s -> %s", c.gelu ? "gelu" : "add", x.spec, y.spec,
                 z.spec);
        grad_tensor(&dz, &z, c.R);
        if (c.gelu) {
            OK(xmp_gelu_backward(&dz, &x, &dx));
            float *gx = full_of(&dx);
            fd_check(what, c.X, n, gx, ew_eval, &c);
            free(gx);
        } else {
            OK(xmp_add_backward(&dz, &x, &y, &dx, &dy));
            float *gx = full_of(&dx), *gy = full_of(&dy);
            fd_check(what, c.X, n, gx, ew_eval, &c);
            fd_check(what, c.Y, n, gy, ew_eval, &c);
            for (int a = 0; a < m->ndim; a++)
                if (!xmp_sbp_eq(dx.sbp[a], xmp_sbp_grad(x.sbp[a])))
                    FAIL("%s: dx SBP %s", what, dx.spec);
            free(gx);
            free(gy);
            xmp_tensor_free(&dy);
        }
        xmp_tensor_free(&dx);
        xmp_tensor_free(&dz);
        xmp_tensor_free(&z);
        xmp_tensor_free(&x);
        xmp_tensor_free(&y);
        free(c.X);
        free(c.Y);
        free(c.R);
    }
}

/* -------------------------------------------------------------- embedding */

typedef struct {
    xmp_mesh_t *m;
    int64_t ts[2], ws[2];
    xmp_sbp_t st[4], sw[4];
    int32_t *tok;
    float *W, *R;
} emb_case_t;

static void make_tok(xmp_tensor_t *t, xmp_mesh_t *m, const int64_t *shape, const xmp_sbp_t *s,
                     const int32_t *full)
{
    OK(xmp_tensor_alloc(t, m, 2, shape, XMESH_I32, s));
    xmp_tensor_fill_from_full(t, full);
}

static double emb_eval(void *p)
{
    emb_case_t *c = p;
    xmp_tensor_t t, w, o;
    double L = 0;
    make_tok(&t, c->m, c->ts, c->st, c->tok);
    make(&w, c->m, 2, c->ws, c->sw, c->W);
    if (xmp_embedding_forward(&t, &w, &o)) {
        FAIL("embedding forward: %s", xmp_last_error());
    } else {
        L = objective(&o, c->R);
        xmp_tensor_free(&o);
    }
    xmp_tensor_free(&t);
    xmp_tensor_free(&w);
    return L;
}

static void test_embedding(xmp_mesh_t *m, int ncases)
{
    for (int it = 0; it < ncases; it++) {
        emb_case_t c = {m, {3, 4}, {7, 5}, {{0}}, {{0}}, NULL, NULL, NULL};
        rand_sbp(m, 2, 0, c.st);
        rand_sbp(m, 2, 1, c.sw);
        c.tok = malloc(sizeof(int32_t) * 12);
        c.W = malloc(sizeof(float) * 35);
        c.R = malloc(sizeof(float) * 60);
        for (int e = 0; e < 12; e++)
            c.tok[e] = irand(7);
        for (int e = 0; e < 35; e++)
            c.W[e] = urand();
        for (int e = 0; e < 60; e++)
            c.R[e] = urand();
        xmp_tensor_t t, w, o, d, dw;
        make_tok(&t, m, c.ts, c.st, c.tok);
        make(&w, m, 2, c.ws, c.sw, c.W);
        if (xmp_embedding_forward(&t, &w, &o)) {
            FAIL("embedding forward: %s", xmp_last_error());
            continue;
        }
        char what[320];
        snprintf(what, sizeof what, "embedding tok %s table %s -> %s", t.spec, w.spec, o.spec);
        float *of = full_of(&o); /* value check: rows of the table */
        for (int i = 0; i < 12; i++)
            for (int j = 0; j < 5; j++)
                if (fabsf(of[i * 5 + j] - c.W[c.tok[i] * 5 + j]) > 1e-6f)
                    FAIL("%s: out[%d][%d] = %g, table %g", what, i, j, of[i * 5 + j],
                         c.W[c.tok[i] * 5 + j]);
        free(of);
        grad_tensor(&d, &o, c.R);
        OK(xmp_embedding_backward(&d, &t, &w, &dw));
        float *g = full_of(&dw);
        fd_check(what, c.W, 35, g, emb_eval, &c);
        /* contract: dtable S where the table is S, P where only the tokens are split, B
         * elsewhere (no all-reduce inside the backward); values: the serial scatter-add */
        for (int a = 0; a < m->ndim; a++) {
            xmp_sbp_t want = c.sw[a].kind == XMP_S   ? c.sw[a]
                             : c.st[a].kind == XMP_S ? xmp_sbp_p()
                                                     : xmp_sbp_b();
            if (!xmp_sbp_eq(dw.sbp[a], want))
                FAIL("%s: dtable SBP %s, axis %d should be %s", what, dw.spec, a,
                     want.kind == XMP_S   ? "S"
                     : want.kind == XMP_P ? "P"
                                          : "B");
        }
        float ref[35] = {0};
        for (int i = 0; i < 12; i++)
            for (int j = 0; j < 5; j++)
                ref[c.tok[i] * 5 + j] += c.R[i * 5 + j];
        for (int e = 0; e < 35; e++)
            if (fabsf(g[e] - ref[e]) > 1e-5f * (1.0f + fabsf(ref[e]))) {
                FAIL("%s: dtable[%d] = %g, serial %g", what, e, g[e], ref[e]);
                break;
            }
        free(g);
        xmp_tensor_free(&dw);
        xmp_tensor_free(&d);
        xmp_tensor_free(&o);
        xmp_tensor_free(&t);
        xmp_tensor_free(&w);
        free(c.tok);
        free(c.W);
        free(c.R);
    }
}

/* ---------------------------------------------------------- cross-entropy */

typedef struct {
    xmp_mesh_t *m;
    int64_t ls[3], ts[2], V;
    xmp_sbp_t sl[4], st[4];
    float *X;
    int32_t *tgt;
} ce_case_t;

static double ce_eval(void *p)
{
    ce_case_t *c = p;
    xmp_tensor_t l, t;
    float loss = 0;
    make(&l, c->m, 3, c->ls, c->sl, c->X);
    make_tok(&t, c->m, c->ts, c->st, c->tgt);
    if (xmp_cross_entropy(&l, &t, c->V, &loss, NULL))
        FAIL("cross-entropy: %s", xmp_last_error());
    xmp_tensor_free(&l);
    xmp_tensor_free(&t);
    return loss;
}

static void test_cross_entropy(xmp_mesh_t *m, int ncases)
{
    for (int it = 0; it < ncases; it++) {
        ce_case_t c = {m, {3, 4, 9}, {3, 4}, 7, {{0}}, {{0}}, NULL, NULL};
        rand_sbp(m, 3, 1, c.sl);
        rand_sbp(m, 2, 0, c.st);
        c.X = malloc(sizeof(float) * 108);
        c.tgt = malloc(sizeof(int32_t) * 12);
        for (int e = 0; e < 108; e++)
            c.X[e] = 3 * urand();
        for (int e = 0; e < 12; e++)
            c.tgt[e] = irand(7);
        double ref = 0; /* serial reference in double */
        for (int i = 0; i < 12; i++) {
            double mx = -1e30, s = 0;
            for (int j = 0; j < 7; j++)
                mx = fmax(mx, c.X[i * 9 + j]);
            for (int j = 0; j < 7; j++)
                s += exp(c.X[i * 9 + j] - mx);
            ref += log(s) + mx - c.X[i * 9 + c.tgt[i]];
        }
        ref /= 12;
        xmp_tensor_t l, t, dl;
        float loss = 0;
        make(&l, m, 3, c.ls, c.sl, c.X);
        make_tok(&t, m, c.ts, c.st, c.tgt);
        char what[320];
        snprintf(what, sizeof what, "cross-entropy logits %s targets %s", l.spec, t.spec);
        if (xmp_cross_entropy(&l, &t, c.V, &loss, &dl)) {
            FAIL("%s: %s", what, xmp_last_error());
            continue;
        }
        if (fabs(loss - ref) > 1e-5 * (1 + fabs(ref)))
            FAIL("%s: loss %.7f, reference %.7f", what, loss, ref);
        float *g = full_of(&dl);
        for (int i = 0; i < 12; i++)
            for (int j = 7; j < 9; j++)
                if (g[i * 9 + j] != 0.0f)
                    FAIL("%s: padded column %d has gradient %g", what, j, g[i * 9 + j]);
        fd_check(what, c.X, 108, g, ce_eval, &c);
        free(g);
        xmp_tensor_free(&dl);
        xmp_tensor_free(&l);
        xmp_tensor_free(&t);
        free(c.X);
        free(c.tgt);
    }
}

/* --------------------------------------------------------------- MLP test */

enum { MB = 4, MT = 3, MC = 5, MH = 8, MV = 7 };

typedef struct {
    float loss;
    float *g[5]; /* dX, dW1, db1, dW2, db2 (full) */
} mlp_out_t;

static const int64_t XS[3] = {MB, MT, MC}, W1S[2] = {MH, MC}, W2S[2] = {MV, MH}, TS[2] = {MB, MT};

static void mlp_run(xmp_mesh_t *m, const xmp_sbp_t *const *s, const float *const *full,
                    const int32_t *tg, mlp_out_t *o)
{
    /* s: X, W1, b1, W2, b2, targets */
    xmp_tensor_t x, w1, b1, w2, b2, t, h, g, lg, dlg, dg, dh, gr[5];
    make(&x, m, 3, XS, s[0], full[0]);
    make(&w1, m, 2, W1S, s[1], full[1]);
    make(&b1, m, 1, W1S, s[2], full[2]);
    make(&w2, m, 2, W2S, s[3], full[3]);
    make(&b2, m, 1, W2S, s[4], full[4]);
    make_tok(&t, m, TS, s[5], tg);
    OK(xmp_linear_forward(&x, &w1, &b1, &h));
    OK(xmp_gelu_forward(&h, &g));
    OK(xmp_linear_forward(&g, &w2, &b2, &lg));
    OK(xmp_cross_entropy(&lg, &t, MV, &o->loss, &dlg));
    OK(xmp_linear_backward_input(&dlg, &w2, &dg));
    OK(xmp_linear_backward_weight(&dlg, &g, &gr[3], &gr[4]));
    OK(xmp_gelu_backward(&dg, &h, &dh));
    OK(xmp_linear_backward_input(&dh, &w1, &gr[0]));
    OK(xmp_linear_backward_weight(&dh, &x, &gr[1], &gr[2]));
    for (int i = 0; i < 5; i++) {
        o->g[i] = full_of(&gr[i]); /* P gradients summed (P -> B) */
        xmp_tensor_free(&gr[i]);
    }
    xmp_tensor_t *all[] = {&x, &w1, &b1, &w2, &b2, &t, &h, &g, &lg, &dlg, &dg, &dh};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        xmp_tensor_free(all[i]);
}

static void test_mlp(xmp_mesh_t *serial, xmp_mesh_t *m1, xmp_mesh_t *m2)
{
    static const int64_t n[5] = {MB * MT * MC, MH * MC, MH, MV * MH, MV};
    float *full[5];
    int32_t tg[MB * MT];
    for (int i = 0; i < 5; i++) {
        full[i] = malloc(sizeof(float) * (size_t)n[i]);
        for (int64_t e = 0; e < n[i]; e++)
            full[i][e] = urand();
    }
    for (int e = 0; e < MB * MT; e++)
        tg[e] = irand(MV);
    xmp_sbp_t B[4] = {xmp_sbp_b(), xmp_sbp_b(), xmp_sbp_b(), xmp_sbp_b()};
    const xmp_sbp_t *sser[6] = {B, B, B, B, B, B};
    mlp_out_t ref, got;
    mlp_run(serial, sser, (const float *const *)full, tg, &ref);
    xmp_sbp_t S0[4] = {xmp_sbp_s(0)}, S1[4] = {xmp_sbp_s(1)};
    /* DP: data S(0), weights B. TP: column split W1 (S(0)), row split W2 (S(1)). */
    const xmp_sbp_t *dp[6] = {S0, B, B, B, B, S0};
    const xmp_sbp_t *tp[6] = {B, S0, S0, S1, B, B};
    xmp_sbp_t x2[4] = {xmp_sbp_s(0), xmp_sbp_b()}, w12[4] = {xmp_sbp_b(), xmp_sbp_s(0)};
    xmp_sbp_t w22[4] = {xmp_sbp_b(), xmp_sbp_s(1)};
    const xmp_sbp_t *dptp[6] = {x2, w12, w12, w22, B, x2};
    struct {
        const char *name;
        xmp_mesh_t *m;
        const xmp_sbp_t *const *s;
    } cfg[3] = {{"DP", m1, dp}, {"TP", m1, tp}, {"DPxTP", m2, dptp}};
    const char *gname[5] = {"dX", "dW1", "db1", "dW2", "db2"};
    for (int c = 0; c < 3; c++) {
        if (!cfg[c].m)
            continue;
        mlp_run(cfg[c].m, cfg[c].s, (const float *const *)full, tg, &got);
        if (cfg[c].m->member) {
            if (fabsf(got.loss - ref.loss) > 1e-5f * fabsf(ref.loss))
                FAIL("MLP %s: loss %.8f, serial %.8f", cfg[c].name, got.loss, ref.loss);
            for (int i = 0; i < 5; i++)
                for (int64_t e = 0; e < n[i]; e++)
                    if (fabsf(got.g[i][e] - ref.g[i][e]) > 1e-5f * (fabsf(ref.g[i][e]) + 1e-2f)) {
                        FAIL("MLP %s: %s[%lld] = %.8g, serial %.8g", cfg[c].name, gname[i],
                             (long long)e, got.g[i][e], ref.g[i][e]);
                        break;
                    }
        }
        for (int i = 0; i < 5; i++)
            free(got.g[i]);
    }
    if (g_rank == 0)
        printf("  MLP loss %.6f (serial) checked under DP, TP%s\n", ref.loss, m2 ? ", DPxTP" : "");
    for (int i = 0; i < 5; i++) {
        free(ref.g[i]);
        free(full[i]);
    }
}

int main(int argc, char **argv)
{
    int provided, size;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    openblas_set_num_threads(1);
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--seed"))
            g_seed = strtoull(argv[i + 1], NULL, 0);
    if (g_rank == 0)
        printf("test_sbp_ops: %d ranks, seed %llu (replay: --seed %llu)\n", size,
               (unsigned long long)g_seed, (unsigned long long)g_seed);
    g_state = g_seed; /* same stream on every rank: same cases everywhere */
    int all[6] = {0, 1, 2, 3, 4, 5}, zero = 0, one = 1;
    xmp_mesh_t *serial = NULL, *m1 = NULL, *m2 = NULL;
    OK(xmp_mesh_create(MPI_COMM_SELF, NULL, 1, &one, &zero, &serial));
    OK(xmp_mesh_create(MPI_COMM_WORLD, NULL, 1, &size, all, &m1));
    if (size == 4 || size == 6) {
        int s2[2] = {2, size / 2};
        OK(xmp_mesh_create(MPI_COMM_WORLD, NULL, 2, s2, all, &m2));
    }
    xmp_mesh_t *meshes[2] = {m1, m2};
    for (int i = 0; i < 2; i++) {
        if (!meshes[i])
            continue;
        test_linear(meshes[i], 12);
        test_elementwise(meshes[i], 8);
        test_embedding(meshes[i], 6);
        test_cross_entropy(meshes[i], 6);
    }
    test_mlp(serial, m1, m2);
    xmp_mesh_destroy(m2);
    xmp_mesh_destroy(m1);
    xmp_mesh_destroy(serial);
    int fails = 0;
    MPI_Allreduce(&g_fail, &fails, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (g_rank == 0)
        printf("test_sbp_ops: %s (%d failures)\n", fails ? "FAILED" : "ok", fails);
    MPI_Finalize();
    return fails ? 1 : 0;
}
