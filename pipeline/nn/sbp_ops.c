/* SBP layers (contracts and signature tables in sbp_ops.h). */
#include <cblas.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/sbp_ops.h"
#include "util/xmp_err.h"

#define NAX XMP_MAX_MESH_DIMS

/* ------------------------------------------------------------ rule helpers */

void xmp_rule_msg(char *err, size_t n, const char *op, const char *operand, const xmp_sbp_t *sbp,
                  int naxes, int axis, const char *fmt, ...)
{
    char spec[64];
    va_list ap;
    if (!err || !n)
        return;
    xmp_sbp_string(sbp, naxes, spec, sizeof spec);
    xmp_err_buf(err, n, "%s: operand %s '%s': mesh axis %d: ", op, operand, spec, axis);
    size_t k = strlen(err);
    if (k + 1 >= n) /* the prefix filled the buffer */
        return;
    va_start(ap, fmt);
    xmp_verr_buf(err + k, n - k, fmt, ap);
    va_end(ap);
}

int xmp_rule_operand(const char *op, const char *operand, int naxes, int nd, const xmp_sbp_t *sbp,
                     char *err, size_t n)
{
    for (int a = 0; a < naxes; a++) {
        xmp_sbp_t s = sbp[a];
        if (s.kind != XMP_S && s.kind != XMP_B && s.kind != XMP_P) {
            xmp_rule_msg(err, n, op, operand, sbp, naxes, a, "unknown SBP kind %d (no rule)",
                         (int)s.kind);
            return -1;
        }
        if (s.kind == XMP_S && (s.dim < 0 || s.dim >= nd)) {
            xmp_rule_msg(err, n, op, operand, sbp, naxes, a,
                         "S(%d) names no dim of a %d-dim tensor (no rule)", s.dim, nd);
            return -1;
        }
    }
    return 0;
}

/* ------------------------------------------------------------ contraction */

/* One operand of C = A . B: nfree free dims and ncon contracted dims, stored
 * free-first (con_first 0) or contracted-first (1). */
typedef struct {
    const xmp_tensor_t *t;
    int nfree, ncon, con_first;
} operand_t;

enum { CL_B, CL_P, CL_FREE, CL_CON };

static int classify(const operand_t *o, xmp_sbp_t s, int *idx)
{
    if (s.kind == XMP_B)
        return CL_B;
    if (s.kind == XMP_P)
        return CL_P;
    int d = s.dim, con = o->con_first ? d < o->ncon : d >= o->nfree;
    *idx = o->con_first ? (con ? d : d - o->ncon) : (con ? d - o->nfree : d);
    return con ? CL_CON : CL_FREE;
}

static xmp_sbp_t con_sbp(const operand_t *o, int c)
{
    return xmp_sbp_s(o->con_first ? c : o->nfree + c);
}

/* Per-axis deduction (sbp_ops.h table): targets ta, tb for A and B, and the
 * output SBP (output dims: A free dims, then B free dims). */
static void deduce(const operand_t *A, const operand_t *B, xmp_sbp_t sa, xmp_sbp_t sb,
                   xmp_sbp_t *ta, xmp_sbp_t *tb, xmp_sbp_t *out)
{
    int ia = 0, ib = 0;
    int ca = classify(A, sa, &ia), cb = classify(B, sb, &ib);
    *ta = sa;
    *tb = sb;
    if (ca == CL_FREE) {
        *tb = xmp_sbp_b();
        *out = xmp_sbp_s(ia);
    } else if (ca == CL_CON) {
        *tb = con_sbp(B, ia);
        *out = xmp_sbp_p();
    } else if (cb == CL_CON) { /* A B or P */
        *ta = con_sbp(A, ib);
        *out = xmp_sbp_p();
    } else if (cb == CL_FREE) {
        *ta = xmp_sbp_b();
        *out = xmp_sbp_s(A->nfree + ib);
    } else if (ca == CL_P && cb == CL_P) {
        *ta = xmp_sbp_b();
        *out = xmp_sbp_p();
    } else {
        *out = (ca == CL_P || cb == CL_P) ? xmp_sbp_p() : xmp_sbp_b();
    }
}

/* out = A . B with deduced SBPs; out allocated here. */
static xmesh_result_t contract(const operand_t *A, const operand_t *B, const char *op,
                               xmp_tensor_t *out)
{
    const xmp_mesh_t *m = A->t->mesh;
    xmp_sbp_t ta[NAX], tb[NAX], to[NAX];
    int64_t oshape[XMP_MAX_DIMS];
    int fa = A->con_first ? A->ncon : 0, fb = B->con_first ? B->ncon : 0;
    int ca = A->con_first ? 0 : A->nfree, cb = B->con_first ? 0 : B->nfree;
    xmesh_result_t r = xmp_same_mesh(A->t, B->t, op);
    if (r)
        return r;
    if (A->ncon != B->ncon || A->nfree + B->nfree > XMP_MAX_DIMS)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: %d vs %d contracted dims", op, A->ncon,
                       B->ncon);
    for (int c = 0; c < A->ncon; c++)
        if (A->t->shape[ca + c] != B->t->shape[cb + c])
            return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                           "%s: contracted dim %d has size %lld in '%s' and %lld in '%s'", op, c,
                           (long long)A->t->shape[ca + c], A->t->spec,
                           (long long)B->t->shape[cb + c], B->t->spec);
    for (int a = 0; a < NAX; a++)
        ta[a] = tb[a] = to[a] = xmp_sbp_b();
    for (int a = 0; a < m->ndim; a++)
        deduce(A, B, A->t->sbp[a], B->t->sbp[a], &ta[a], &tb[a], &to[a]);
    for (int f = 0; f < A->nfree; f++)
        oshape[f] = A->t->shape[fa + f];
    for (int f = 0; f < B->nfree; f++)
        oshape[A->nfree + f] = B->t->shape[fb + f];
    xmp_tensor_t xa, xb, o;
    memset(&xa, 0, sizeof xa);
    memset(&xb, 0, sizeof xb);
    /* an operand already in its target SBP is used as it is (no copy) */
    const xmp_tensor_t *pa = A->t, *pb = B->t;
    if (!xmp_tensor_sbp_is(A->t, ta)) {
        if ((r = xmp_box(A->t, ta, &xa)))
            return r;
        pa = &xa;
    }
    if (!xmp_tensor_sbp_is(B->t, tb)) {
        if ((r = xmp_box(B->t, tb, &xb)))
            goto out_free_a;
        pb = &xb;
    }
    int64_t M = 0, K = 0, N = 0, K2 = 0;
    if (m->member) {
        M = xmp_prod(pa->lshape, fa, fa + A->nfree), K = xmp_prod(pa->lshape, ca, ca + A->ncon);
        N = xmp_prod(pb->lshape, fb, fb + B->nfree), K2 = xmp_prod(pb->lshape, cb, cb + B->ncon);
    }
    /* sgemm with beta 0 writes every element of the output; an empty product leaves zeros */
    r = M && N && K
            ? xmp_tensor_alloc_uninit(&o, A->t->mesh, A->nfree + B->nfree, oshape, XMESH_F32, to)
            : xmp_tensor_alloc(&o, A->t->mesh, A->nfree + B->nfree, oshape, XMESH_F32, to);
    if (r)
        goto out_free_b;
    if (m->member) {
        if (K != K2 || M * N != o.lcount) {
            r = xmp_err(XMESH_ERR_INTERNAL, "%s: local blocks %lldx%lld . %lldx%lld -> %lld", op,
                        (long long)M, (long long)K, (long long)K2, (long long)N,
                        (long long)o.lcount);
            xmp_tensor_free(&o);
            goto out_free_b;
        }
        if (M && N && K)
            cblas_sgemm(CblasRowMajor, A->con_first ? CblasTrans : CblasNoTrans,
                        B->con_first ? CblasNoTrans : CblasTrans, (int)M, (int)N, (int)K, 1.0f,
                        xmp_f32(pa), A->con_first ? (int)M : (int)K, xmp_f32(pb),
                        B->con_first ? (int)N : (int)K, 0.0f, xmp_f32(&o), (int)N);
    }
    *out = o;
out_free_b:
    xmp_tensor_free(&xb);
out_free_a:
    xmp_tensor_free(&xa);
    return r;
}

/* ----------------------------------------------------------------- linear */

/* Bias SBP for an output y (nb batch dims): S(j) where y is S(nb + j), P (holder only) where
 * y is P, B otherwise. */
static void bias_rule(int naxes, int nb, const xmp_sbp_t *ty, xmp_sbp_t *tb)
{
    xmp_sbp_all_b(tb);
    for (int a = 0; a < naxes; a++) {
        if (ty[a].kind == XMP_P)
            tb[a] = xmp_sbp_p();
        else if (ty[a].kind == XMP_S && ty[a].dim >= nb)
            tb[a] = xmp_sbp_s(ty[a].dim - nb);
    }
}

int xmp_rule_linear(int naxes, int nx, const xmp_sbp_t *sx, int nw, const xmp_sbp_t *sw,
                    xmp_sbp_t *tx, xmp_sbp_t *tw, xmp_sbp_t *ty, xmp_sbp_t *tb, char *err, size_t n)
{
    if (nx < 1 || nw < 2 || nx + nw - 2 > XMP_MAX_DIMS) {
        if (err && n)
            snprintf(err, n,
                     "linear: operands x (%d dims) and w (%d dims): no rule (x needs >= 1 dim, "
                     "w >= 2, y <= %d)",
                     nx, nw, XMP_MAX_DIMS);
        return -1;
    }
    if (xmp_rule_operand("linear", "x", naxes, nx, sx, err, n) ||
        xmp_rule_operand("linear", "w", naxes, nw, sw, err, n))
        return -1;
    operand_t A = {NULL, nx - 1, 1, 0}, B = {NULL, nw - 1, 1, 0};
    xmp_sbp_all_b(tx);
    xmp_sbp_all_b(tw);
    xmp_sbp_all_b(ty);
    for (int a = 0; a < naxes; a++)
        deduce(&A, &B, sx[a], sw[a], &tx[a], &tw[a], &ty[a]);
    if (tb)
        bias_rule(naxes, nx - 1, ty, tb);
    return 0;
}

xmesh_result_t xmp_linear_forward(const xmp_tensor_t *x, const xmp_tensor_t *w,
                                  const xmp_tensor_t *b, xmp_tensor_t *y)
{
    const char *op = "xmp_linear_forward";
    xmesh_result_t r;
    if ((r = xmp_check_f32(x, op, "x")) || (r = xmp_check_f32(w, op, "w")) ||
        (b && (r = xmp_check_f32(b, op, "b"))))
        return r;
    if (x->ndim < 1 || w->ndim < 2)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: x has %d dims, w %d (need >= 1, >= 2)", op,
                       x->ndim, w->ndim);
    int nb = x->ndim - 1, no = w->ndim - 1;
    if (b) {
        if (b->ndim != no || memcmp(b->shape, w->shape, sizeof(int64_t) * (size_t)no))
            return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: bias of %d dims does not match w", op,
                           b->ndim);
        if ((r = xmp_same_mesh(x, b, op)))
            return r;
    }
    operand_t A = {x, nb, 1, 0}, B = {w, no, 1, 0};
    xmp_tensor_t o;
    r = contract(&A, &B, op, &o);
    if (r || !b)
        goto out;
    xmp_sbp_t tbias[NAX];
    bias_rule(x->mesh->ndim, nb, o.sbp, tbias);
    xmp_tensor_t bb;
    r = xmp_box(b, tbias, &bb);
    if (r) {
        xmp_tensor_free(&o);
        return r;
    }
    if (x->mesh->member) {
        int64_t N = bb.lcount, M = N ? o.lcount / N : 0;
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++)
                xmp_f32(&o)[i * N + j] += xmp_f32(&bb)[j];
    }
    xmp_tensor_free(&bb);
out:
    if (!r)
        *y = o;
    return r;
}

xmesh_result_t xmp_linear_backward_input(const xmp_tensor_t *dy, const xmp_tensor_t *w,
                                         xmp_tensor_t *dx)
{
    const char *op = "xmp_linear_backward_input";
    xmesh_result_t r;
    if ((r = xmp_check_f32(dy, op, "dy")) || (r = xmp_check_f32(w, op, "w")))
        return r;
    int no = w->ndim - 1, nb = dy->ndim - no;
    if (no < 1 || nb < 0)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: dy has %d dims, w %d", op, dy->ndim,
                       w->ndim);
    operand_t A = {dy, nb, no, 0}, B = {w, 1, no, 1};
    return contract(&A, &B, op, dx);
}

xmesh_result_t xmp_linear_backward_weight(const xmp_tensor_t *dy, const xmp_tensor_t *x,
                                          xmp_tensor_t *dw, xmp_tensor_t *db)
{
    const char *op = "xmp_linear_backward_weight";
    xmesh_result_t r;
    if ((r = xmp_check_f32(dy, op, "dy")) || (r = xmp_check_f32(x, op, "x")))
        return r;
    int nb = x->ndim - 1, no = dy->ndim - nb;
    if (nb < 0 || no < 1)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: dy has %d dims, x %d", op, dy->ndim,
                       x->ndim);
    operand_t A = {dy, no, nb, 1}, B = {x, 1, nb, 1};
    xmp_tensor_t w;
    r = contract(&A, &B, op, &w);
    if (r || !db)
        goto out;
    /* db = sum of dy over batch dims: S(batch) -> P, S(nb+j) -> S(j), B, P */
    xmp_sbp_t s[NAX];
    for (int a = 0; a < NAX; a++)
        s[a] = xmp_sbp_b();
    for (int a = 0; a < dy->mesh->ndim; a++) {
        xmp_sbp_t t = dy->sbp[a];
        s[a] = t.kind != XMP_S ? t : t.dim < nb ? xmp_sbp_p() : xmp_sbp_s(t.dim - nb);
    }
    r = xmp_tensor_alloc(db, dy->mesh, no, dy->shape + nb, XMESH_F32, s);
    if (r) {
        xmp_tensor_free(&w);
        return r;
    }
    if (dy->mesh->member) {
        int64_t N = db->lcount, M = N ? dy->lcount / N : 0;
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++)
                xmp_f32(db)[j] += xmp_f32(dy)[i * N + j];
    }
out:
    if (!r)
        *dw = w;
    return r;
}

/* -------------------------------------------------------------------- add */

static xmp_sbp_t add_rule(xmp_sbp_t x, xmp_sbp_t y)
{
    if (xmp_sbp_eq(x, y))
        return x;
    if (x.kind == XMP_S)
        return x;
    if (y.kind == XMP_S)
        return y;
    return xmp_sbp_b(); /* B with P */
}

int xmp_rule_add(int naxes, int nd, const xmp_sbp_t *sx, const xmp_sbp_t *sy, xmp_sbp_t *tz,
                 char *err, size_t n)
{
    if (xmp_rule_operand("add", "x", naxes, nd, sx, err, n) ||
        xmp_rule_operand("add", "y", naxes, nd, sy, err, n))
        return -1;
    xmp_sbp_all_b(tz);
    for (int a = 0; a < naxes; a++)
        tz[a] = add_rule(sx[a], sy[a]);
    return 0;
}

xmesh_result_t xmp_add_forward(const xmp_tensor_t *x, const xmp_tensor_t *y, xmp_tensor_t *z)
{
    const char *op = "xmp_add_forward";
    xmesh_result_t r;
    if ((r = xmp_check_f32(x, op, "x")) || (r = xmp_check_f32(y, op, "y")) ||
        (r = xmp_same_mesh(x, y, op)))
        return r;
    if (x->ndim != y->ndim || memcmp(x->shape, y->shape, sizeof(int64_t) * (size_t)x->ndim))
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: shapes differ (%d vs %d dims)", op, x->ndim,
                       y->ndim);
    xmp_sbp_t t[NAX];
    char msg[400];
    if (xmp_rule_add(x->mesh->ndim, x->ndim, x->sbp, y->sbp, t, msg, sizeof msg))
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: %s", op, msg);
    xmp_tensor_t bx, by;
    r = xmp_box(x, t, &bx);
    if (r)
        return r;
    r = xmp_box(y, t, &by);
    if (r) {
        xmp_tensor_free(&bx);
        return r;
    }
    for (int64_t e = 0; e < bx.lcount; e++)
        xmp_f32(&bx)[e] += xmp_f32(&by)[e];
    xmp_tensor_free(&by);
    *z = bx;
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_add_backward(const xmp_tensor_t *dz, const xmp_tensor_t *x,
                                const xmp_tensor_t *y, xmp_tensor_t *dx, xmp_tensor_t *dy)
{
    xmesh_result_t r = XMESH_SUCCESS;
    if (dx && x)
        r = xmp_box_backward(dz, x->sbp, dx);
    if (!r && dy && y) {
        r = xmp_box_backward(dz, y->sbp, dy);
        if (r && dx && x)
            xmp_tensor_free(dx);
    }
    return r;
}

/* ------------------------------------------------------------------- GELU */

#define GELU_C 0.7978845608028654f /* sqrt(2 / pi) */

int xmp_rule_gelu(int naxes, int nd, const xmp_sbp_t *sx, xmp_sbp_t *ty, char *err, size_t n)
{
    if (xmp_rule_operand("gelu", "x", naxes, nd, sx, err, n))
        return -1;
    for (int a = 0; a < NAX; a++)
        ty[a] = a < naxes && sx[a].kind != XMP_P ? sx[a] : xmp_sbp_b();
    return 0;
}

static xmesh_result_t no_p(const xmp_tensor_t *x, xmp_sbp_t *t, const char *op)
{
    char msg[400];
    if (xmp_rule_gelu(x->mesh->ndim, x->ndim, x->sbp, t, msg, sizeof msg))
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: %s", op, msg);
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_gelu_forward(const xmp_tensor_t *x, xmp_tensor_t *y)
{
    xmesh_result_t r = xmp_check_f32(x, "xmp_gelu_forward", "x");
    xmp_sbp_t t[NAX];
    if (r || (r = no_p(x, t, "xmp_gelu_forward")))
        return r;
    r = xmp_box(x, t, y);
    if (r)
        return r;
    float *p = xmp_f32(y);
    for (int64_t e = 0; e < y->lcount; e++) {
        float v = p[e];
        p[e] = 0.5f * v * (1.0f + tanhf(GELU_C * (v + 0.044715f * v * v * v)));
    }
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_gelu_backward(const xmp_tensor_t *dy, const xmp_tensor_t *x, xmp_tensor_t *dx)
{
    xmesh_result_t r;
    if ((r = xmp_check_f32(dy, "xmp_gelu_backward", "dy")) ||
        (r = xmp_check_f32(x, "xmp_gelu_backward", "x")))
        return r;
    xmp_sbp_t t[NAX];
    xmp_tensor_t bx = {0};
    if ((r = no_p(x, t, "xmp_gelu_backward")))
        return r;
    /* operands already in the target SBP are read where they are (no boxed copy) */
    const xmp_tensor_t *px = x;
    if (!xmp_tensor_sbp_is(x, t)) {
        if ((r = xmp_box(x, t, &bx)))
            return r;
        px = &bx;
    }
    int dy_there = xmp_tensor_sbp_is(dy, t);
    xmp_tensor_t o; /* dx last, so dx may be dy */
    r = dy_there ? xmp_tensor_alloc_uninit(&o, dy->mesh, dy->ndim, dy->shape, dy->dtype, dy->sbp)
                 : xmp_box(dy, t, &o);
    if (!r) {
        float *g = xmp_f32(&o), *p = xmp_f32(px);
        const float *d = dy_there ? xmp_f32(dy) : g;
        for (int64_t e = 0; e < o.lcount; e++) {
            float v = p[e], u = GELU_C * (v + 0.044715f * v * v * v), th = tanhf(u);
            float du = GELU_C * (1.0f + 3.0f * 0.044715f * v * v);
            g[e] = d[e] * (0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * du);
        }
        *dx = o;
    }
    xmp_tensor_free(&bx);
    return r;
}

/* -------------------------------------------------------------- embedding */

int xmp_rule_embedding(int naxes, int nt, const xmp_sbp_t *stok, int ntab, const xmp_sbp_t *stab,
                       xmp_sbp_t *tt, xmp_sbp_t *tw, xmp_sbp_t *to, char *err, size_t n)
{
    if (ntab != 2 || nt + 1 > XMP_MAX_DIMS) {
        if (err && n)
            snprintf(err, n,
                     "embedding: operand table has %d dims, tok %d: no rule (table (V, C), out "
                     "<= %d dims)",
                     ntab, nt, XMP_MAX_DIMS);
        return -1;
    }
    if (xmp_rule_operand("embedding", "tok", naxes, nt, stok, err, n) ||
        xmp_rule_operand("embedding", "table", naxes, 2, stab, err, n))
        return -1;
    xmp_sbp_all_b(tt);
    xmp_sbp_all_b(tw);
    xmp_sbp_all_b(to);
    for (int a = 0; a < naxes; a++) {
        xmp_sbp_t st = stok[a], sw = stab[a];
        if (st.kind == XMP_P) {
            xmp_rule_msg(err, n, "embedding", "tok", stok, naxes, a,
                         "token ids are P: no rule (ids are not partial sums; use B or S(d))");
            return -1;
        }
        tt[a] = st;
        tw[a] = sw;
        if (sw.kind == XMP_S) {
            tt[a] = xmp_sbp_b();
            to[a] = sw.dim == 0 ? xmp_sbp_p() : xmp_sbp_s(nt);
        } else if (st.kind == XMP_S) {
            tw[a] = xmp_sbp_b();
            to[a] = st;
        } else {
            to[a] = sw; /* B or P */
        }
    }
    return 0;
}

/* Per-axis targets for tokens and table, and the output SBP. */
static xmesh_result_t emb_deduce(const xmp_tensor_t *tok, const xmp_tensor_t *tab, xmp_sbp_t *tt,
                                 xmp_sbp_t *tw, xmp_sbp_t *to, const char *op)
{
    char msg[400];
    if (xmp_rule_embedding(tok->mesh->ndim, tok->ndim, tok->sbp, tab->ndim, tab->sbp, tt, tw, to,
                           msg, sizeof msg))
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: %s", op, msg);
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_embedding_forward(const xmp_tensor_t *tok, const xmp_tensor_t *table,
                                     xmp_tensor_t *out)
{
    const char *op = "xmp_embedding_forward";
    xmesh_result_t r;
    if (!tok || tok->dtype != XMESH_I32)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: token ids must be i32", op);
    if ((r = xmp_check_f32(table, op, "table")) || (r = xmp_same_mesh(tok, table, op)))
        return r;
    if (table->ndim != 2 || tok->ndim + 1 > XMP_MAX_DIMS)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: table has %d dims, expected 2", op,
                       table->ndim);
    xmp_sbp_t tt[NAX], tw[NAX], to[NAX];
    if ((r = emb_deduce(tok, table, tt, tw, to, op)))
        return r;
    for (int64_t e = 0; e < tok->lcount; e++) {
        int32_t v = ((const int32_t *)tok->data)[e];
        if (v < 0 || v >= table->shape[0])
            return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: token id %d out of [0, %lld)", op, v,
                           (long long)table->shape[0]);
    }
    xmp_tensor_t bt, bw, o;
    int64_t oshape[XMP_MAX_DIMS];
    memcpy(oshape, tok->shape, sizeof(int64_t) * (size_t)tok->ndim);
    oshape[tok->ndim] = table->shape[1];
    if ((r = xmp_box(tok, tt, &bt)))
        return r;
    if ((r = xmp_box(table, tw, &bw)))
        goto out_free_t;
    if ((r = xmp_tensor_alloc(&o, tok->mesh, tok->ndim + 1, oshape, XMESH_F32, to)))
        goto out_free_w;
    int64_t C = bw.lshape[1], v0 = bw.loff[0], vn = bw.lshape[0];
    for (int64_t i = 0; i < bt.lcount; i++) {
        int64_t v = ((const int32_t *)bt.data)[i] - v0;
        if (v >= 0 && v < vn)
            memcpy(xmp_f32(&o) + i * C, xmp_f32(&bw) + v * C, sizeof(float) * (size_t)C);
    }
    *out = o;
out_free_w:
    xmp_tensor_free(&bw);
out_free_t:
    xmp_tensor_free(&bt);
    return r;
}

xmesh_result_t xmp_embedding_backward(const xmp_tensor_t *dout, const xmp_tensor_t *tok,
                                      const xmp_tensor_t *table, xmp_tensor_t *dtable)
{
    const char *op = "xmp_embedding_backward";
    xmesh_result_t r;
    if ((r = xmp_check_f32(dout, op, "dout")) || (r = xmp_check_f32(table, op, "table")))
        return r;
    xmp_sbp_t tt[NAX], tw[NAX], to[NAX], tg[NAX], gw[NAX];
    if ((r = emb_deduce(tok, table, tt, tw, to, op)))
        return r;
    for (int a = 0; a < NAX; a++) {
        tg[a] = xmp_sbp_grad(to[a]);
        /* gradient SBP of the used table: S stays; B gets P where tokens were split */
        gw[a] = tw[a].kind == XMP_S ? tw[a] : (tt[a].kind == XMP_S ? xmp_sbp_p() : xmp_sbp_b());
    }
    xmp_tensor_t bt, bd, g;
    if ((r = xmp_box(tok, tt, &bt)))
        return r;
    if ((r = xmp_box(dout, tg, &bd)))
        goto out_free_t;
    if ((r = xmp_tensor_alloc(&g, table->mesh, 2, table->shape, XMESH_F32, gw)))
        goto out_free_d;
    int64_t C = g.lshape[1], v0 = g.loff[0], vn = g.lshape[0];
    for (int64_t i = 0; i < bt.lcount; i++) {
        int64_t v = ((const int32_t *)bt.data)[i] - v0;
        if (v >= 0 && v < vn)
            for (int64_t c = 0; c < C; c++)
                xmp_f32(&g)[v * C + c] += xmp_f32(&bd)[i * C + c];
    }
    /* The contract (sbp_ops.h): S where the table was split, P where the tokens were split
     * and the table was not (each rank holds the rows its own tokens touched), B elsewhere
     * (also where the table was P: the gradient of a partial is the full gradient). No
     * reduction here: the caller boxes P -> B once per step, not once per microbatch. */
    *dtable = g;
out_free_d:
    xmp_tensor_free(&bd);
out_free_t:
    xmp_tensor_free(&bt);
    return r;
}

/* ---------------------------------------------------------- cross-entropy */

int xmp_rule_cross_entropy(int naxes, int nl, const xmp_sbp_t *sl, const xmp_sbp_t *st,
                           xmp_sbp_t *tl, xmp_sbp_t *tt, char *err, size_t n)
{
    int nr = nl - 1;
    if (nl < 1) {
        if (err && n)
            snprintf(err, n, "cross_entropy: operand logits has %d dims: no rule (rows..., V)", nl);
        return -1;
    }
    if (xmp_rule_operand("cross_entropy", "logits", naxes, nl, sl, err, n) ||
        (st && xmp_rule_operand("cross_entropy", "targets", naxes, nr, st, err, n)))
        return -1;
    xmp_sbp_all_b(tl);
    xmp_sbp_all_b(tt);
    for (int a = 0; a < naxes; a++) {
        if (st && st[a].kind == XMP_P) {
            xmp_rule_msg(err, n, "cross_entropy", "targets", st, naxes, a,
                         "target ids are P: no rule (ids are not partial sums; use B or S(d))");
            return -1;
        }
        tl[a] = sl[a].kind == XMP_P ? xmp_sbp_s(nr) : sl[a];
        tt[a] = tl[a].kind == XMP_S && tl[a].dim < nr ? tl[a] : xmp_sbp_b();
    }
    return 0;
}

xmesh_result_t xmp_cross_entropy(const xmp_tensor_t *logits, const xmp_tensor_t *targets, int64_t V,
                                 float *loss, xmp_tensor_t *dlogits)
{
    const char *op = "xmp_cross_entropy";
    xmesh_result_t r;
    if ((r = xmp_check_f32(logits, op, "logits")))
        return r;
    if (!targets || targets->dtype != XMESH_I32 || !loss)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: targets must be i32, loss non-NULL", op);
    if ((r = xmp_same_mesh(logits, targets, op)))
        return r;
    int nr = logits->ndim - 1;
    const xmp_mesh_t *m = logits->mesh;
    if (nr < 0 || targets->ndim != nr ||
        memcmp(targets->shape, logits->shape, sizeof(int64_t) * (size_t)nr))
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: targets shape does not match logits rows",
                       op);
    if (V < 1 || V > logits->shape[nr])
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: V = %lld out of [1, %lld]", op,
                       (long long)V, (long long)logits->shape[nr]);
    xmp_sbp_t tl[NAX], tt[NAX];
    char msg[400];
    if (xmp_rule_cross_entropy(m->ndim, logits->ndim, logits->sbp, targets->sbp, tl, tt, msg,
                               sizeof msg))
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: %s", op, msg);
    xmp_tensor_t L, T;
    if ((r = xmp_box(logits, tl, &L)))
        return r;
    if ((r = xmp_box(targets, tt, &T))) {
        xmp_tensor_free(&L);
        return r;
    }
    int64_t R = xmp_prod(L.lshape, 0, nr), Vl = L.lshape[nr], v0 = L.loff[nr],
            N = xmp_prod(L.shape, 0, nr);
    float *buf = calloc((size_t)(3 * R + 1), sizeof(float));
    double total = 0;
    if (!buf) {
        r = xmp_err(XMESH_ERR_NO_MEMORY, "%s: out of memory", op);
        goto out_free;
    }
    float *mx = buf, *se = buf + R; /* se[2i]: sum-exp, se[2i+1]: target logit */
    const float *x = xmp_f32(&L);
    const int32_t *tg = (const int32_t *)T.data;
    for (int64_t i = 0; i < R; i++) {
        mx[i] = -INFINITY;
        for (int64_t j = 0; j < Vl && v0 + j < V; j++)
            mx[i] = fmaxf(mx[i], x[i * Vl + j]);
    }
    for (int a = 0; a < m->ndim && m->member && !r; a++)
        if (tl[a].kind == XMP_S && tl[a].dim == nr)
            r = xmp_allreduce(mx, (int)R, MPI_FLOAT, MPI_MAX, m->axis[a],
                              "xmp_cross_entropy row max");
    if (r)
        goto out_free;
    for (int64_t i = 0; i < R; i++) {
        float s = 0;
        for (int64_t j = 0; j < Vl && v0 + j < V; j++)
            s += expf(x[i * Vl + j] - mx[i]);
        se[2 * i] = s;
        int64_t t = tg[i] - v0;
        se[2 * i + 1] = t >= 0 && t < Vl ? x[i * Vl + t] : 0.0f;
    }
    for (int a = 0; a < m->ndim && m->member && !r; a++)
        if (tl[a].kind == XMP_S && tl[a].dim == nr)
            r = xmp_allreduce(se, (int)(2 * R), MPI_FLOAT, MPI_SUM, m->axis[a],
                              "xmp_cross_entropy sum-exp and target logit");
    if (r)
        goto out_free;
    for (int64_t i = 0; i < R; i++)
        total += logf(se[2 * i]) + mx[i] - se[2 * i + 1];
    for (int a = 0; a < m->ndim && m->member && !r; a++)
        if (tl[a].kind == XMP_S && tl[a].dim < nr)
            r = xmp_allreduce(&total, 1, MPI_DOUBLE, MPI_SUM, m->axis[a], "xmp_cross_entropy loss");
    if (r)
        goto out_free;
    *loss = (float)(total / (double)(N ? N : 1));
    if (dlogits) {
        float inv = 1.0f / (float)(N ? N : 1);
        for (int64_t i = 0; i < R; i++)
            for (int64_t j = 0; j < Vl; j++) {
                float g = 0;
                if (v0 + j < V)
                    g = expf(x[i * Vl + j] - mx[i]) / se[2 * i] - (v0 + j == tg[i] ? 1.0f : 0.0f);
                xmp_f32(&L)[i * Vl + j] = g * inv;
            }
        *dlogits = L;
        L.data = NULL;
    }
out_free:
    free(buf);
    xmp_tensor_free(&T);
    xmp_tensor_free(&L);
    return r;
}
