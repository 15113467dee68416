/*
 * U-Transformer compute kernels: see unet_kernels.h for the contracts. Matrix products go to
 * cblas_sgemm; everything else is plain loops. Reductions (group-norm statistics, softmax sums,
 * loss) accumulate in double so that the result does not depend on the block size a rank holds
 * beyond f32 rounding of the inputs.
 */
#include "nn/unet_kernels.h"
#include "nn/error.h"

#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define XMP_UNET_EINVAL (-1) /* == XMESH_ERR_INVALID_ARGUMENT */
#define XMP_UNET_GN_EPS 1e-5

/* Records a message naming the bad value (nn/error.h) and returns XMP_UNET_EINVAL. */
static int unet_fail(const char *fn, const char *fmt, ...)
{
    char msg[448];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: %s", fn, msg);
    return XMP_UNET_EINVAL;
}

/* Re-raises the message an inner validation just recorded, under the caller's name. */
static int unet_fail_nested(const char *fn)
{
    return unet_fail(fn, "bad geometry (%s)", xmp_last_error());
}

/* Checks that every name=value pair in dims is >= 1 and that their product fits in an int (BLAS
 * dimensions and leading dimensions are ints). Returns 0 or fails naming the value. */
static int unet_check_dims(const char *fn, int count, const char *const *names, const int *dims)
{
    long long prod = 1;
    for (int i = 0; i < count; i++) {
        if (dims[i] < 1)
            return unet_fail(fn, "%s = %d, must be >= 1", names[i], dims[i]);
        prod *= dims[i];
        if (prod > INT_MAX)
            return unet_fail(fn, "%s: the tensor has more than INT_MAX elements", names[i]);
    }
    return 0;
}

/* Fails naming `what` when a * b * c floats would not be indexable by an int. */
static int unet_check_prod(const char *fn, const char *what, long long a, long long b, long long c)
{
    if (a * b > INT_MAX || a * b * c > INT_MAX)
        return unet_fail(fn, "%s of %lld x %lld x %lld floats exceeds INT_MAX", what, a, b, c);
    return 0;
}

static int unet_check_ptr(const char *fn, const char *name, const void *p)
{
    if (p == NULL)
        return unet_fail(fn, "%s is NULL", name);
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Convolution                                                                               */
/* ---------------------------------------------------------------------------------------- */

static int conv_out(int in, int k, int stride, int pad)
{
    return (in + 2 * pad - k) / stride + 1;
}

/* Validates the im2col geometry of one image. Returns 0 or fails naming the value. */
static int conv_check_geom(const char *fn, int c, int h, int w, int kh, int kw, int stride, int pad)
{
    static const char *const names[] = {"channels", "h", "w", "kh", "kw", "stride"};
    const int dims[] = {c, h, w, kh, kw, stride};
    for (int i = 0; i < 6; i++)
        if (dims[i] < 1)
            return unet_fail(fn, "%s = %d, must be >= 1", names[i], dims[i]);
    if (pad < 0)
        return unet_fail(fn, "pad = %d, must be >= 0", pad);
    if (kh > h + 2 * pad || kw > w + 2 * pad)
        return unet_fail(fn, "kernel %dx%d larger than the padded input %dx%d (pad %d)", kh, kw,
                         h + 2 * pad, w + 2 * pad, pad);
    long long rows = (long long)c * kh * kw;
    long long cols = (long long)conv_out(h, kh, stride, pad) * conv_out(w, kw, stride, pad);
    if (rows * cols > INT_MAX || (long long)c * h * w > INT_MAX)
        return unet_fail(fn, "im2col of %d channels %dx%d, kernel %dx%d exceeds INT_MAX floats", c,
                         h, w, kh, kw);
    return 0;
}

int xmp_unet_conv2d_init(xmp_unet_conv2d_t *c, int n, int ic, int h, int w, int oc, int kh, int kw,
                         int stride, int pad)
{
    static const char fn[] = "xmp_unet_conv2d_init";
    int rc = unet_check_ptr(fn, "c", c);
    if (rc)
        return rc;
    if (n < 1)
        return unet_fail(fn, "n = %d, must be >= 1", n);
    if (oc < 1)
        return unet_fail(fn, "oc = %d, must be >= 1", oc);
    rc = conv_check_geom(fn, ic, h, w, kh, kw, stride, pad);
    if (rc)
        return rc;
    int oh = conv_out(h, kh, stride, pad), ow = conv_out(w, kw, stride, pad);
    if ((long long)oc * ic * kh * kw > INT_MAX || (long long)oc * oh * ow > INT_MAX)
        return unet_fail(fn, "oc = %d: weight or output exceeds INT_MAX floats", oc);
    *c = (xmp_unet_conv2d_t){.n = n,
                             .ic = ic,
                             .h = h,
                             .w = w,
                             .oc = oc,
                             .kh = kh,
                             .kw = kw,
                             .stride = stride,
                             .pad = pad,
                             .oh = oh,
                             .ow = ow};
    return 0;
}

/* A 1x1 stride-1 unpadded conv is a plain matrix product with the image itself as "col". */
static int conv_is_pointwise(const xmp_unet_conv2d_t *c)
{
    return c->kh == 1 && c->kw == 1 && c->stride == 1 && c->pad == 0;
}

size_t xmp_unet_conv2d_col_floats(const xmp_unet_conv2d_t *c)
{
    if (c == NULL || conv_is_pointwise(c))
        return 0;
    return (size_t)c->ic * c->kh * c->kw * c->oh * c->ow;
}

/* Re-validates a geometry struct (it may have been filled by hand) and the pointers. */
static int conv_check(const char *fn, const xmp_unet_conv2d_t *c, const void *a, const char *an,
                      const void *b, const char *bn, const void *d, const char *dn,
                      const float *col)
{
    xmp_unet_conv2d_t t;
    int rc = unet_check_ptr(fn, "geometry", c);
    if (rc)
        return rc;
    rc = xmp_unet_conv2d_init(&t, c->n, c->ic, c->h, c->w, c->oc, c->kh, c->kw, c->stride, c->pad);
    if (rc)
        return unet_fail_nested(fn);
    if (t.oh != c->oh || t.ow != c->ow)
        return unet_fail(fn, "geometry has oh x ow = %dx%d, expected %dx%d", c->oh, c->ow, t.oh,
                         t.ow);
    if ((rc = unet_check_ptr(fn, an, a)) || (rc = unet_check_ptr(fn, bn, b)) ||
        (rc = unet_check_ptr(fn, dn, d)))
        return rc;
    if (!conv_is_pointwise(c) && col == NULL)
        return unet_fail(fn, "col scratch is NULL (need %zu floats)",
                         xmp_unet_conv2d_col_floats(c));
    return 0;
}

static void im2col_run(const float *x, int c, int h, int w, int kh, int kw, int stride, int pad,
                       float *col)
{
    int oh = conv_out(h, kh, stride, pad), ow = conv_out(w, kw, stride, pad);
    for (int ci = 0; ci < c; ci++)
        for (int i = 0; i < kh; i++)
            for (int j = 0; j < kw; j++) {
                float *row = col + ((size_t)(ci * kh + i) * kw + j) * oh * ow;
                const float *img = x + (size_t)ci * h * w;
                for (int oy = 0; oy < oh; oy++) {
                    int iy = oy * stride - pad + i;
                    float *dst = row + (size_t)oy * ow;
                    if (iy < 0 || iy >= h) {
                        memset(dst, 0, sizeof(float) * (size_t)ow);
                        continue;
                    }
                    for (int ox = 0; ox < ow; ox++) {
                        int ix = ox * stride - pad + j;
                        dst[ox] = (ix >= 0 && ix < w) ? img[(size_t)iy * w + ix] : 0.0f;
                    }
                }
            }
}

static void col2im_run(const float *col, int c, int h, int w, int kh, int kw, int stride, int pad,
                       float *x)
{
    int oh = conv_out(h, kh, stride, pad), ow = conv_out(w, kw, stride, pad);
    for (int ci = 0; ci < c; ci++)
        for (int i = 0; i < kh; i++)
            for (int j = 0; j < kw; j++) {
                const float *row = col + ((size_t)(ci * kh + i) * kw + j) * oh * ow;
                float *img = x + (size_t)ci * h * w;
                for (int oy = 0; oy < oh; oy++) {
                    int iy = oy * stride - pad + i;
                    if (iy < 0 || iy >= h)
                        continue;
                    const float *src = row + (size_t)oy * ow;
                    for (int ox = 0; ox < ow; ox++) {
                        int ix = ox * stride - pad + j;
                        if (ix >= 0 && ix < w)
                            img[(size_t)iy * w + ix] += src[ox];
                    }
                }
            }
}

int xmp_unet_im2col(const float *x, int c, int h, int w, int kh, int kw, int stride, int pad,
                    float *col)
{
    static const char fn[] = "xmp_unet_im2col";
    int rc;
    if ((rc = conv_check_geom(fn, c, h, w, kh, kw, stride, pad)) ||
        (rc = unet_check_ptr(fn, "x", x)) || (rc = unet_check_ptr(fn, "col", col)))
        return rc;
    im2col_run(x, c, h, w, kh, kw, stride, pad, col);
    return 0;
}

int xmp_unet_col2im(const float *col, int c, int h, int w, int kh, int kw, int stride, int pad,
                    float *x)
{
    static const char fn[] = "xmp_unet_col2im";
    int rc;
    if ((rc = conv_check_geom(fn, c, h, w, kh, kw, stride, pad)) ||
        (rc = unet_check_ptr(fn, "col", col)) || (rc = unet_check_ptr(fn, "x", x)))
        return rc;
    col2im_run(col, c, h, w, kh, kw, stride, pad, x);
    return 0;
}

/* The (ic*kh*kw, oh*ow) column matrix of sample i: the image itself for a pointwise conv. */
static const float *conv_cols(const xmp_unet_conv2d_t *c, const float *x, int i, float *col)
{
    const float *xi = x + (size_t)i * c->ic * c->h * c->w;
    if (conv_is_pointwise(c))
        return xi;
    im2col_run(xi, c->ic, c->h, c->w, c->kh, c->kw, c->stride, c->pad, col);
    return col;
}

int xmp_unet_conv2d_forward(const xmp_unet_conv2d_t *c, const float *x, const float *wt,
                            const float *bias, float *y, float *col)
{
    int rc = conv_check("xmp_unet_conv2d_forward", c, x, "x", wt, "wt", y, "y", col);
    if (rc)
        return rc;
    int k = c->ic * c->kh * c->kw, p = c->oh * c->ow;
    for (int i = 0; i < c->n; i++) {
        const float *cols = conv_cols(c, x, i, col);
        float *yi = y + (size_t)i * c->oc * p;
        float beta = 0.0f;
        if (bias != NULL) {
            for (int o = 0; o < c->oc; o++)
                for (int q = 0; q < p; q++)
                    yi[(size_t)o * p + q] = bias[o];
            beta = 1.0f;
        }
        /* y_i (oc, p) = W (oc, k) * cols (k, p) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, c->oc, p, k, 1.0f, wt, k, cols, p,
                    beta, yi, p);
    }
    return 0;
}

int xmp_unet_conv2d_backward_input(const xmp_unet_conv2d_t *c, const float *dy, const float *wt,
                                   float *dx, float *col)
{
    int rc = conv_check("xmp_unet_conv2d_backward_input", c, dy, "dy", wt, "wt", dx, "dx", col);
    if (rc)
        return rc;
    int k = c->ic * c->kh * c->kw, p = c->oh * c->ow;
    for (int i = 0; i < c->n; i++) {
        const float *dyi = dy + (size_t)i * c->oc * p;
        float *dxi = dx + (size_t)i * c->ic * c->h * c->w;
        if (conv_is_pointwise(c)) {
            /* dx_i (ic, p) += W^T (ic, oc) * dy_i (oc, p) */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, k, p, c->oc, 1.0f, wt, k, dyi, p,
                        1.0f, dxi, p);
            continue;
        }
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, k, p, c->oc, 1.0f, wt, k, dyi, p, 0.0f,
                    col, p);
        col2im_run(col, c->ic, c->h, c->w, c->kh, c->kw, c->stride, c->pad, dxi);
    }
    return 0;
}

int xmp_unet_conv2d_backward_weight(const xmp_unet_conv2d_t *c, const float *x, const float *dy,
                                    float *dwt, float *dbias, float *col)
{
    int rc = conv_check("xmp_unet_conv2d_backward_weight", c, x, "x", dy, "dy", dwt, "dwt", col);
    if (rc)
        return rc;
    int k = c->ic * c->kh * c->kw, p = c->oh * c->ow;
    for (int i = 0; i < c->n; i++) {
        const float *cols = conv_cols(c, x, i, col);
        const float *dyi = dy + (size_t)i * c->oc * p;
        /* dW (oc, k) += dy_i (oc, p) * cols^T (p, k) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, c->oc, k, p, 1.0f, dyi, p, cols, p,
                    1.0f, dwt, k);
        if (dbias != NULL)
            for (int o = 0; o < c->oc; o++) {
                double s = 0.0;
                for (int q = 0; q < p; q++)
                    s += dyi[(size_t)o * p + q];
                dbias[o] += (float)s;
            }
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Group norm, SiLU, up-sampling, concat, add                                                */
/* ---------------------------------------------------------------------------------------- */

static int gn_check(const char *fn, int n, int c, int hw, int g)
{
    static const char *const names[] = {"n", "c", "hw"};
    int rc = unet_check_dims(fn, 3, names, (const int[]){n, c, hw});
    if (rc)
        return rc;
    if (g < 1 || c % g != 0)
        return unet_fail(fn, "groups g = %d must be >= 1 and divide c = %d", g, c);
    return 0;
}

int xmp_unet_groupnorm_forward(int n, int c, int hw, int g, const float *x, const float *gamma,
                               const float *beta, float *y, float *mean, float *rstd)
{
    static const char fn[] = "xmp_unet_groupnorm_forward";
    int rc;
    if ((rc = gn_check(fn, n, c, hw, g)) || (rc = unet_check_ptr(fn, "x", x)) ||
        (rc = unet_check_ptr(fn, "gamma", gamma)) || (rc = unet_check_ptr(fn, "beta", beta)) ||
        (rc = unet_check_ptr(fn, "y", y)) || (rc = unet_check_ptr(fn, "mean", mean)) ||
        (rc = unet_check_ptr(fn, "rstd", rstd)))
        return rc;
    int cg = c / g;
    size_t m = (size_t)cg * hw;
    for (int i = 0; i < n; i++)
        for (int gi = 0; gi < g; gi++) {
            size_t off = ((size_t)i * c + (size_t)gi * cg) * hw;
            const float *xg = x + off;
            double s = 0.0, ss = 0.0;
            for (size_t e = 0; e < m; e++)
                s += xg[e];
            double mu = s / (double)m;
            for (size_t e = 0; e < m; e++) {
                double d = xg[e] - mu;
                ss += d * d;
            }
            double r = 1.0 / sqrt(ss / (double)m + XMP_UNET_GN_EPS);
            mean[(size_t)i * g + gi] = (float)mu;
            rstd[(size_t)i * g + gi] = (float)r;
            for (int cc = 0; cc < cg; cc++) {
                int ch = gi * cg + cc;
                float a = (float)r * gamma[ch];
                float b = beta[ch] - (float)mu * a;
                const float *xc = xg + (size_t)cc * hw;
                float *yc = y + off + (size_t)cc * hw;
                for (int e = 0; e < hw; e++)
                    yc[e] = xc[e] * a + b;
            }
        }
    return 0;
}

int xmp_unet_groupnorm_backward(int n, int c, int hw, int g, const float *x, const float *dy,
                                const float *gamma, const float *mean, const float *rstd, float *dx,
                                float *dgamma, float *dbeta)
{
    static const char fn[] = "xmp_unet_groupnorm_backward";
    int rc;
    if ((rc = gn_check(fn, n, c, hw, g)) || (rc = unet_check_ptr(fn, "x", x)) ||
        (rc = unet_check_ptr(fn, "dy", dy)) || (rc = unet_check_ptr(fn, "mean", mean)) ||
        (rc = unet_check_ptr(fn, "rstd", rstd)))
        return rc;
    if (dx != NULL && (rc = unet_check_ptr(fn, "gamma", gamma)))
        return rc;
    int cg = c / g;
    double m = (double)cg * hw;
    for (int i = 0; i < n; i++)
        for (int gi = 0; gi < g; gi++) {
            size_t off = ((size_t)i * c + (size_t)gi * cg) * hw;
            double mu = mean[(size_t)i * g + gi], r = rstd[(size_t)i * g + gi];
            /* a = mean(dxhat), b = mean(dxhat * xhat), with dxhat = dy * gamma */
            double a = 0.0, b = 0.0;
            for (int cc = 0; cc < cg; cc++) {
                int ch = gi * cg + cc;
                const float *xc = x + off + (size_t)cc * hw, *dc = dy + off + (size_t)cc * hw;
                double sdy = 0.0, sdyx = 0.0;
                for (int e = 0; e < hw; e++) {
                    double xh = (xc[e] - mu) * r;
                    sdy += dc[e];
                    sdyx += dc[e] * xh;
                }
                if (dgamma != NULL)
                    dgamma[ch] += (float)sdyx;
                if (dbeta != NULL)
                    dbeta[ch] += (float)sdy;
                if (dx != NULL) {
                    a += gamma[ch] * sdy;
                    b += gamma[ch] * sdyx;
                }
            }
            if (dx == NULL)
                continue;
            a /= m;
            b /= m;
            for (int cc = 0; cc < cg; cc++) {
                int ch = gi * cg + cc;
                const float *xc = x + off + (size_t)cc * hw, *dc = dy + off + (size_t)cc * hw;
                float *dxc = dx + off + (size_t)cc * hw;
                for (int e = 0; e < hw; e++) {
                    double xh = (xc[e] - mu) * r;
                    dxc[e] += (float)(r * (gamma[ch] * (double)dc[e] - a - xh * b));
                }
            }
        }
    return 0;
}

static float unet_sigmoid(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

int xmp_unet_silu_forward(size_t count, const float *x, float *y)
{
    static const char fn[] = "xmp_unet_silu_forward";
    int rc;
    if ((rc = unet_check_ptr(fn, "x", x)) || (rc = unet_check_ptr(fn, "y", y)))
        return rc;
    for (size_t i = 0; i < count; i++)
        y[i] = x[i] * unet_sigmoid(x[i]);
    return 0;
}

int xmp_unet_silu_backward(size_t count, const float *x, const float *dy, float *dx)
{
    static const char fn[] = "xmp_unet_silu_backward";
    int rc;
    if ((rc = unet_check_ptr(fn, "x", x)) || (rc = unet_check_ptr(fn, "dy", dy)) ||
        (rc = unet_check_ptr(fn, "dx", dx)))
        return rc;
    for (size_t i = 0; i < count; i++) {
        float s = unet_sigmoid(x[i]);
        dx[i] += dy[i] * s * (1.0f + x[i] * (1.0f - s));
    }
    return 0;
}

static int nchw_check(const char *fn, int n, int c, int h, int w, int up)
{
    static const char *const names[] = {"n", "c", "h", "w"};
    int rc = unet_check_dims(fn, 4, names, (const int[]){n, c, h, w});
    if (rc)
        return rc;
    if ((long long)n * c * h * w * (up ? 4 : 1) > INT_MAX)
        return unet_fail(fn, "output of %dx%dx%dx%d (x%d) exceeds INT_MAX floats", n, c, h, w,
                         up ? 4 : 1);
    return 0;
}

int xmp_unet_upsample2x_forward(int n, int c, int h, int w, const float *x, float *y)
{
    static const char fn[] = "xmp_unet_upsample2x_forward";
    int rc;
    if ((rc = nchw_check(fn, n, c, h, w, 1)) || (rc = unet_check_ptr(fn, "x", x)) ||
        (rc = unet_check_ptr(fn, "y", y)))
        return rc;
    size_t planes = (size_t)n * c;
    int w2 = 2 * w;
    for (size_t pl = 0; pl < planes; pl++) {
        const float *xp = x + pl * h * w;
        float *yp = y + pl * 4 * h * w;
        for (int yy = 0; yy < 2 * h; yy++)
            for (int xx = 0; xx < w2; xx++)
                yp[(size_t)yy * w2 + xx] = xp[(size_t)(yy / 2) * w + xx / 2];
    }
    return 0;
}

int xmp_unet_upsample2x_backward(int n, int c, int h, int w, const float *dy, float *dx)
{
    static const char fn[] = "xmp_unet_upsample2x_backward";
    int rc;
    if ((rc = nchw_check(fn, n, c, h, w, 1)) || (rc = unet_check_ptr(fn, "dy", dy)) ||
        (rc = unet_check_ptr(fn, "dx", dx)))
        return rc;
    size_t planes = (size_t)n * c;
    int w2 = 2 * w;
    for (size_t pl = 0; pl < planes; pl++) {
        const float *dyp = dy + pl * 4 * h * w;
        float *dxp = dx + pl * h * w;
        for (int yy = 0; yy < h; yy++)
            for (int xx = 0; xx < w; xx++) {
                const float *d = dyp + (size_t)(2 * yy) * w2 + 2 * xx;
                dxp[(size_t)yy * w + xx] += (d[0] + d[1]) + (d[w2] + d[w2 + 1]);
            }
    }
    return 0;
}

static int concat_check(const char *fn, int n, int ca, int cb, int hw)
{
    static const char *const names[] = {"n", "ca + cb", "hw"};
    if (ca < 1 || cb < 1)
        return unet_fail(fn, "ca = %d, cb = %d: both must be >= 1", ca, cb);
    return unet_check_dims(fn, 3, names, (const int[]){n, ca + cb, hw});
}

int xmp_unet_concat_forward(int n, int ca, int cb, int hw, const float *a, const float *b, float *y)
{
    static const char fn[] = "xmp_unet_concat_forward";
    int rc;
    if ((rc = concat_check(fn, n, ca, cb, hw)) || (rc = unet_check_ptr(fn, "a", a)) ||
        (rc = unet_check_ptr(fn, "b", b)) || (rc = unet_check_ptr(fn, "y", y)))
        return rc;
    size_t sa = (size_t)ca * hw, sb = (size_t)cb * hw;
    for (int i = 0; i < n; i++) {
        float *yi = y + (size_t)i * (sa + sb);
        memcpy(yi, a + (size_t)i * sa, sizeof(float) * sa);
        memcpy(yi + sa, b + (size_t)i * sb, sizeof(float) * sb);
    }
    return 0;
}

int xmp_unet_concat_backward(int n, int ca, int cb, int hw, const float *dy, float *da, float *db)
{
    static const char fn[] = "xmp_unet_concat_backward";
    int rc;
    if ((rc = concat_check(fn, n, ca, cb, hw)) || (rc = unet_check_ptr(fn, "dy", dy)))
        return rc;
    size_t sa = (size_t)ca * hw, sb = (size_t)cb * hw;
    for (int i = 0; i < n; i++) {
        const float *dyi = dy + (size_t)i * (sa + sb);
        if (da != NULL)
            for (size_t e = 0; e < sa; e++)
                da[(size_t)i * sa + e] += dyi[e];
        if (db != NULL)
            for (size_t e = 0; e < sb; e++)
                db[(size_t)i * sb + e] += dyi[sa + e];
    }
    return 0;
}

int xmp_unet_add_forward(size_t count, const float *a, const float *b, float *y)
{
    static const char fn[] = "xmp_unet_add_forward";
    int rc;
    if ((rc = unet_check_ptr(fn, "a", a)) || (rc = unet_check_ptr(fn, "b", b)) ||
        (rc = unet_check_ptr(fn, "y", y)))
        return rc;
    for (size_t i = 0; i < count; i++)
        y[i] = a[i] + b[i];
    return 0;
}

int xmp_unet_add_backward(size_t count, const float *dy, float *da, float *db)
{
    int rc = unet_check_ptr("xmp_unet_add_backward", "dy", dy);
    if (rc)
        return rc;
    for (size_t i = 0; i < count; i++) {
        if (da != NULL)
            da[i] += dy[i];
        if (db != NULL)
            db[i] += dy[i];
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Attention                                                                                 */
/* ---------------------------------------------------------------------------------------- */

/* dst (n, cols, rows) (=|+=) transpose of each src (n, rows, cols) block. */
static void batched_transpose(int n, int rows, int cols, const float *src, float *dst, int acc)
{
    size_t blk = (size_t)rows * cols;
    for (int i = 0; i < n; i++) {
        const float *s = src + (size_t)i * blk;
        float *d = dst + (size_t)i * blk;
        for (int r = 0; r < rows; r++)
            for (int cc = 0; cc < cols; cc++) {
                float v = s[(size_t)r * cols + cc];
                float *o = d + (size_t)cc * rows + r;
                *o = acc ? *o + v : v;
            }
    }
}

static int layout_check(const char *fn, int n, int c, int hw, const void *in, const char *inn,
                        const void *out, const char *outn)
{
    static const char *const names[] = {"n", "c", "hw"};
    int rc;
    if ((rc = unet_check_dims(fn, 3, names, (const int[]){n, c, hw})) ||
        (rc = unet_check_ptr(fn, inn, in)) || (rc = unet_check_ptr(fn, outn, out)))
        return rc;
    return 0;
}

int xmp_unet_nchw_to_tokens(int n, int c, int hw, const float *x, float *t)
{
    int rc = layout_check("xmp_unet_nchw_to_tokens", n, c, hw, x, "x", t, "t");
    if (rc)
        return rc;
    batched_transpose(n, c, hw, x, t, 0);
    return 0;
}

int xmp_unet_tokens_to_nchw(int n, int c, int hw, const float *t, float *x)
{
    int rc = layout_check("xmp_unet_tokens_to_nchw", n, c, hw, t, "t", x, "x");
    if (rc)
        return rc;
    batched_transpose(n, hw, c, t, x, 0);
    return 0;
}

int xmp_unet_nchw_to_tokens_backward(int n, int c, int hw, const float *dt, float *dx)
{
    int rc = layout_check("xmp_unet_nchw_to_tokens_backward", n, c, hw, dt, "dt", dx, "dx");
    if (rc)
        return rc;
    batched_transpose(n, hw, c, dt, dx, 1);
    return 0;
}

int xmp_unet_tokens_to_nchw_backward(int n, int c, int hw, const float *dx, float *dt)
{
    int rc = layout_check("xmp_unet_tokens_to_nchw_backward", n, c, hw, dx, "dx", dt, "dt");
    if (rc)
        return rc;
    batched_transpose(n, c, hw, dx, dt, 1);
    return 0;
}

static int linear_check(const char *fn, int m, int ic, int oc, const void *a, const char *an,
                        const void *b, const char *bn, const void *d, const char *dn)
{
    int rc;
    if (m < 1 || ic < 1 || oc < 1)
        return unet_fail(fn, "m = %d, ic = %d, oc = %d: all must be >= 1", m, ic, oc);
    if ((rc = unet_check_prod(fn, "x", m, ic, 1)) || (rc = unet_check_prod(fn, "wt", oc, ic, 1)) ||
        (rc = unet_check_prod(fn, "y", m, oc, 1)) || (rc = unet_check_ptr(fn, an, a)) ||
        (rc = unet_check_ptr(fn, bn, b)) || (rc = unet_check_ptr(fn, dn, d)))
        return rc;
    return 0;
}

int xmp_unet_linear_forward(int m, int ic, int oc, const float *x, const float *wt,
                            const float *bias, float *y)
{
    int rc = linear_check("xmp_unet_linear_forward", m, ic, oc, x, "x", wt, "wt", y, "y");
    if (rc)
        return rc;
    float beta = 0.0f;
    if (bias != NULL) {
        for (int r = 0; r < m; r++)
            memcpy(y + (size_t)r * oc, bias, sizeof(float) * (size_t)oc);
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, oc, ic, 1.0f, x, ic, wt, ic, beta, y,
                oc);
    return 0;
}

int xmp_unet_linear_backward_input(int m, int ic, int oc, const float *dy, const float *wt,
                                   float *dx)
{
    int rc =
        linear_check("xmp_unet_linear_backward_input", m, ic, oc, dy, "dy", wt, "wt", dx, "dx");
    if (rc)
        return rc;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, ic, oc, 1.0f, dy, oc, wt, ic, 1.0f,
                dx, ic);
    return 0;
}

int xmp_unet_linear_backward_weight(int m, int ic, int oc, const float *x, const float *dy,
                                    float *dwt, float *dbias)
{
    int rc =
        linear_check("xmp_unet_linear_backward_weight", m, ic, oc, x, "x", dy, "dy", dwt, "dwt");
    if (rc)
        return rc;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, oc, ic, m, 1.0f, dy, oc, x, ic, 1.0f, dwt,
                ic);
    if (dbias != NULL)
        for (int o = 0; o < oc; o++) {
            double s = 0.0;
            for (int r = 0; r < m; r++)
                s += dy[(size_t)r * oc + o];
            dbias[o] += (float)s;
        }
    return 0;
}

int xmp_unet_attn_init(xmp_unet_attn_t *a, int n, int tq, int tk, int heads, int head_dim)
{
    static const char fn[] = "xmp_unet_attn_init";
    static const char *const names[] = {"n", "tq", "tk", "heads", "head_dim"};
    int rc = unet_check_ptr(fn, "a", a);
    if (rc)
        return rc;
    for (int i = 0; i < 5; i++) {
        int v = (const int[]){n, tq, tk, heads, head_dim}[i];
        if (v < 1)
            return unet_fail(fn, "%s = %d, must be >= 1", names[i], v);
    }
    /* q, k, v, out and the saved probabilities must be indexable by int (BLAS) */
    long long c = (long long)heads * head_dim;
    if ((rc = unet_check_prod(fn, "q/out", n, tq, c)) ||
        (rc = unet_check_prod(fn, "k/v", n, tk, c)) ||
        (rc = unet_check_prod(fn, "probs", (long long)n * heads, tq, tk)))
        return rc;
    *a = (xmp_unet_attn_t){.n = n, .tq = tq, .tk = tk, .heads = heads, .head_dim = head_dim};
    return 0;
}

size_t xmp_unet_attn_probs_floats(const xmp_unet_attn_t *a)
{
    return a == NULL ? 0 : (size_t)a->n * a->heads * a->tq * a->tk;
}

size_t xmp_unet_attn_scratch_floats(const xmp_unet_attn_t *a)
{
    return a == NULL ? 0 : (size_t)a->tq * a->tk;
}

static int attn_check(const char *fn, const xmp_unet_attn_t *a)
{
    xmp_unet_attn_t t;
    int rc = unet_check_ptr(fn, "geometry", a);
    if (rc)
        return rc;
    if (xmp_unet_attn_init(&t, a->n, a->tq, a->tk, a->heads, a->head_dim))
        return unet_fail_nested(fn);
    return 0;
}

/* In-place row softmax of s (rows, cols), computed in double. */
static void softmax_rows(float *s, int rows, int cols)
{
    for (int r = 0; r < rows; r++) {
        float *row = s + (size_t)r * cols;
        float mx = row[0];
        for (int j = 1; j < cols; j++)
            mx = row[j] > mx ? row[j] : mx;
        double sum = 0.0;
        for (int j = 0; j < cols; j++) {
            float e = expf(row[j] - mx);
            row[j] = e;
            sum += e;
        }
        float inv = (float)(1.0 / sum);
        for (int j = 0; j < cols; j++)
            row[j] *= inv;
    }
}

int xmp_unet_attn_forward(const xmp_unet_attn_t *a, const float *q, const float *k, const float *v,
                          float *out, float *probs)
{
    static const char fn[] = "xmp_unet_attn_forward";
    int rc;
    if ((rc = attn_check(fn, a)) || (rc = unet_check_ptr(fn, "q", q)) ||
        (rc = unet_check_ptr(fn, "k", k)) || (rc = unet_check_ptr(fn, "v", v)) ||
        (rc = unet_check_ptr(fn, "out", out)) || (rc = unet_check_ptr(fn, "probs", probs)))
        return rc;
    int d = a->head_dim, c = a->heads * d, tq = a->tq, tk = a->tk;
    float scale = (float)(1.0 / sqrt((double)d));
    for (int i = 0; i < a->n; i++)
        for (int h = 0; h < a->heads; h++) {
            const float *qh = q + (size_t)i * tq * c + (size_t)h * d;
            const float *kh = k + (size_t)i * tk * c + (size_t)h * d;
            const float *vh = v + (size_t)i * tk * c + (size_t)h * d;
            float *oh = out + (size_t)i * tq * c + (size_t)h * d;
            float *p = probs + ((size_t)i * a->heads + h) * tq * tk;
            /* S (tq, tk) = scale * Qh Kh^T; P = softmax(S); Oh (tq, d) = P Vh */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, tq, tk, d, scale, qh, c, kh, c,
                        0.0f, p, tk);
            softmax_rows(p, tq, tk);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, tq, d, tk, 1.0f, p, tk, vh, c,
                        0.0f, oh, c);
        }
    return 0;
}

int xmp_unet_attn_backward(const xmp_unet_attn_t *a, const float *q, const float *k, const float *v,
                           const float *probs, const float *dout, float *dq, float *dk, float *dv,
                           float *scratch)
{
    static const char fn[] = "xmp_unet_attn_backward";
    int rc;
    if ((rc = attn_check(fn, a)) || (rc = unet_check_ptr(fn, "q", q)) ||
        (rc = unet_check_ptr(fn, "k", k)) || (rc = unet_check_ptr(fn, "v", v)) ||
        (rc = unet_check_ptr(fn, "probs", probs)) || (rc = unet_check_ptr(fn, "dout", dout)) ||
        (rc = unet_check_ptr(fn, "dq", dq)) || (rc = unet_check_ptr(fn, "dk", dk)) ||
        (rc = unet_check_ptr(fn, "dv", dv)) || (rc = unet_check_ptr(fn, "scratch", scratch)))
        return rc;
    int d = a->head_dim, c = a->heads * d, tq = a->tq, tk = a->tk;
    float scale = (float)(1.0 / sqrt((double)d));
    for (int i = 0; i < a->n; i++)
        for (int h = 0; h < a->heads; h++) {
            size_t qo = (size_t)i * tq * c + (size_t)h * d, ko = (size_t)i * tk * c + (size_t)h * d;
            const float *p = probs + ((size_t)i * a->heads + h) * tq * tk;
            float *ds = scratch;
            /* dVh (tk, d) += P^T dOh */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, tk, d, tq, 1.0f, p, tk, dout + qo,
                        c, 1.0f, dv + ko, c);
            /* dP (tq, tk) = dOh Vh^T, then dS = P o (dP - rowsum(P o dP)) in place */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, tq, tk, d, 1.0f, dout + qo, c,
                        v + ko, c, 0.0f, ds, tk);
            for (int r = 0; r < tq; r++) {
                const float *pr = p + (size_t)r * tk;
                float *dr = ds + (size_t)r * tk;
                double dot = 0.0;
                for (int j = 0; j < tk; j++)
                    dot += (double)pr[j] * dr[j];
                for (int j = 0; j < tk; j++)
                    dr[j] = pr[j] * (dr[j] - (float)dot);
            }
            /* dQh (tq, d) += scale dS Kh; dKh (tk, d) += scale dS^T Qh */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, tq, d, tk, scale, ds, tk, k + ko,
                        c, 1.0f, dq + qo, c);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, tk, d, tq, scale, ds, tk, q + qo,
                        c, 1.0f, dk + ko, c);
        }
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Loss and optimizer                                                                        */
/* ---------------------------------------------------------------------------------------- */

static int mse_check(const char *fn, double denom, const void *y, const void *t)
{
    int rc;
    if (!(denom > 0.0) || !isfinite(denom))
        return unet_fail(fn, "denom = %g, must be finite and > 0", denom);
    if ((rc = unet_check_ptr(fn, "y", y)) || (rc = unet_check_ptr(fn, "target", t)))
        return rc;
    return 0;
}

int xmp_unet_mse_forward(size_t count, double denom, const float *y, const float *target,
                         double *loss)
{
    static const char fn[] = "xmp_unet_mse_forward";
    int rc;
    if ((rc = mse_check(fn, denom, y, target)) || (rc = unet_check_ptr(fn, "loss", loss)))
        return rc;
    double s = 0.0;
    for (size_t i = 0; i < count; i++) {
        double d = (double)y[i] - target[i];
        s += d * d;
    }
    *loss = s / denom;
    return 0;
}

int xmp_unet_mse_backward(size_t count, double denom, const float *y, const float *target,
                          float *dy)
{
    static const char fn[] = "xmp_unet_mse_backward";
    int rc;
    if ((rc = mse_check(fn, denom, y, target)) || (rc = unet_check_ptr(fn, "dy", dy)))
        return rc;
    float f = (float)(2.0 / denom);
    for (size_t i = 0; i < count; i++)
        dy[i] += f * (y[i] - target[i]);
    return 0;
}

int xmp_unet_sgd_nesterov(size_t count, float lr, float mu, float wd, float *p, float *v,
                          const float *grad)
{
    static const char fn[] = "xmp_unet_sgd_nesterov";
    int rc;
    if (!(lr >= 0.0f) || !isfinite(lr))
        return unet_fail(fn, "lr = %g, must be finite and >= 0", (double)lr);
    if (!(mu >= 0.0f) || !isfinite(mu))
        return unet_fail(fn, "mu = %g, must be finite and >= 0", (double)mu);
    if (!(wd >= 0.0f) || !isfinite(wd))
        return unet_fail(fn, "wd = %g, must be finite and >= 0", (double)wd);
    if ((rc = unet_check_ptr(fn, "p", p)) || (rc = unet_check_ptr(fn, "v", v)) ||
        (rc = unet_check_ptr(fn, "grad", grad)))
        return rc;
    for (size_t i = 0; i < count; i++) {
        float g = grad[i] + wd * p[i];
        v[i] = mu * v[i] + g;
        p[i] -= lr * (g + mu * v[i]);
    }
    return 0;
}
