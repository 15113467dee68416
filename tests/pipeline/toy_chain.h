/* The toy stage math shared by the pipeline-driver tests (test_driver.c, test_driver_virtual.c):
 * one layer y = tanh(x . W) on nr x nc row-major blocks (W nc x nc), its backward and the SGD
 * step. Each sum runs in one fixed order (the same in the stage callbacks and in a test's own
 * serial reference), so equal inputs give equal bits. Static definitions: included by one test
 * file each. */
#ifndef XMP_TEST_TOY_CHAIN_H
#define XMP_TEST_TOY_CHAIN_H

#include <math.h>

/* One row: y[j] = tanh(sum_l x[l] W[l][j]). */
static inline void layer_fwd_row(int nc, const double *x, const double *W, double *y)
{
    for (int j = 0; j < nc; j++) {
        double z = 0;
        for (int l = 0; l < nc; l++)
            z += x[l] * W[l * nc + j];
        y[j] = tanh(z);
    }
}

/* nr rows of layer_fwd_row. */
static inline void layer_fwd(int nr, int nc, const double *x, const double *W, double *y)
{
    for (int i = 0; i < nr; i++)
        layer_fwd_row(nc, x + i * nc, W, y + i * nc);
}

/* From the output gradient gy: gz = gy (1 - y^2) (kept for the weight gradient) and the input
 * gradient gx = gz . W^T. */
static inline void layer_bwd_input(int nr, int nc, const double *y, const double *gy,
                                   const double *W, double *gz, double *gx)
{
    for (int i = 0; i < nr * nc; i++)
        gz[i] = gy[i] * (1.0 - y[i] * y[i]);
    for (int i = 0; i < nr; i++)
        for (int l = 0; l < nc; l++) {
            double a = 0;
            for (int j = 0; j < nc; j++)
                a += gz[i * nc + j] * W[l * nc + j];
            gx[i * nc + l] = a;
        }
}

/* gW += x^T . gz (each element's sum over the nr rows first, then added). */
static inline void layer_bwd_weight(int nr, int nc, const double *x, const double *gz, double *gW)
{
    for (int l = 0; l < nc; l++)
        for (int j = 0; j < nc; j++) {
            double a = 0;
            for (int i = 0; i < nr; i++)
                a += x[i * nc + l] * gz[i * nc + j];
            gW[l * nc + j] += a;
        }
}

/* W -= lr gW; last = gW; gW = 0 (n elements). */
static inline void sgd_step(int n, double lr, double *W, double *gW, double *last)
{
    for (int i = 0; i < n; i++) {
        W[i] -= lr * gW[i];
        last[i] = gW[i];
        gW[i] = 0;
    }
}

#endif /* XMP_TEST_TOY_CHAIN_H */
