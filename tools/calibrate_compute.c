/* xmesh-calibrate: compute (calibrate.h): sgemm of the layer shapes, and the training stack's
 * probes (its element-wise kernels, pipeline/calib's GPT-2 step), every rank at once. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calibrate.h"

#ifdef XMESH_CALIBRATE_BLAS
#include <cblas.h>

#include "nn/kernels.h" /* the training stack's element-wise kernels (compiled in) */
#endif

#ifdef XMESH_CALIBRATE_BLAS
static int this_rank(void)
{
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}
#endif

int xmc_build_shapes(const opts_t *o, shape_t *S)
{
    int n = 0;
    int64_t T = o->tokens, C = o->hidden, V = o->vocab, B = o->conv_base;
    /* GPT-2 linears, out = in . W^T (rows T, llm.c's layout), and the
     * weight gradient of the MLP (dW = dout^T . in: 4C x C over T) */
    const struct {
        int64_t m, n, k;
        const char *label;
    } gpt[] = {{T, 3 * C, C, "gpt-qkv"},        {T, C, C, "gpt-attn-proj"},
               {T, 4 * C, C, "gpt-fc"},         {T, C, 4 * C, "gpt-fc-proj"},
               {4 * C, C, T, "gpt-fc-dweight"}, {T, V, C, "gpt-lm-head"}};
    for (size_t i = 0; i < sizeof gpt / sizeof *gpt; i++) {
        S[n] = (shape_t){gpt[i].m, gpt[i].n, gpt[i].k, ""};
        snprintf(S[n++].label, XM_GEMM_LABEL, "%s", gpt[i].label);
    }
    /* U-Transformer 3x3 convolutions per sample as im2col GEMMs
     * (pipeline/nn/unet_kernels.c): weights (oc, ic*9) . cols (ic*9, oh*ow) */
    const struct {
        int64_t ic, oc, hw;
    } conv[] = {{3, B, 32}, {B, B, 32}, {2 * B, 2 * B, 16}, {4 * B, 4 * B, 8}, {8 * B, 4 * B, 4}};
    for (size_t i = 0; i < sizeof conv / sizeof *conv; i++) {
        S[n] = (shape_t){conv[i].oc, conv[i].hw * conv[i].hw, conv[i].ic * 9, ""};
        snprintf(S[n++].label, XM_GEMM_LABEL, "conv3x3-%lldx%lld-%lldto%lld", (long long)conv[i].hw,
                 (long long)conv[i].hw, (long long)conv[i].ic, (long long)conv[i].oc);
    }
    for (int i = 0; i < o->nextra && n < MAX_SHAPES; i++)
        S[n++] = o->extra[i];
    /* drop repeated shapes (small settings make some coincide) */
    int m = 0;
    for (int i = 0; i < n; i++) {
        int dup = 0;
        for (int j = 0; j < m && !dup; j++)
            dup = S[j].m == S[i].m && S[j].n == S[i].n && S[j].k == S[i].k;
        if (!dup)
            S[m++] = S[i];
    }
    return m;
}

/* Every rank runs the same sgemm at once; the slowest rank's median. 0
 * shapes when built without OpenBLAS (*why says so). */
int xmc_measure_gemm(const opts_t *o, gemm_res_t *res, char *why, size_t whylen)
{
    const int creps = COMPUTE_REPS(o);
#ifdef XMESH_CALIBRATE_BLAS
    shape_t S[MAX_SHAPES + 16];
    int ns = xmc_build_shapes(o, S);
    size_t na = 0, nb = 0, nc = 0;
    for (int i = 0; i < ns; i++) {
        size_t a = (size_t)(S[i].m * S[i].k), b = (size_t)(S[i].k * S[i].n),
               c = (size_t)(S[i].m * S[i].n);
        na = a > na ? a : na;
        nb = b > nb ? b : nb;
        nc = c > nc ? c : nc;
    }
    float *A = malloc(na * sizeof *A), *Bm = malloc(nb * sizeof *Bm), *Cm = malloc(nc * 4);
    if (!A || !Bm || !Cm) {
        fprintf(stderr, "xmesh-calibrate: rank %d: out of memory for the sgemm shapes\n",
                this_rank());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (size_t i = 0; i < na; i++)
        A[i] = (float)((i % 7) + 1) * 0.125f;
    for (size_t i = 0; i < nb; i++)
        Bm[i] = (float)((i % 5) + 1) * 0.25f;
    double tt[MAX_REPS];
    for (int i = 0; i < ns; i++) {
        int m = (int)S[i].m, n = (int)S[i].n, k = (int)S[i].k;
        MPI_Barrier(MPI_COMM_WORLD);
        for (int rep = -1; rep < creps; rep++) { /* rep -1: warm-up */
            int calls = 0;
            double t0 = MPI_Wtime(), t;
            do {
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, A, k, Bm, n,
                            0.0f, Cm, n);
                calls++;
            } while ((t = MPI_Wtime() - t0) < SUSTAIN_S);
            if (rep >= 0)
                tt[rep] = t / calls;
        }
        double mine = xmc_median(tt, creps), worst = 0;
        MPI_Allreduce(&mine, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        res[i].s = S[i];
        res[i].seconds = worst;
    }
    free(A);
    free(Bm);
    free(Cm);
    (void)why;
    (void)whylen;
    return ns;
#else
    (void)o;
    (void)res;
    snprintf(why, whylen, "built without OpenBLAS (pkg-config openblas not found)");
    return 0;
#endif
}

/* The training stack's element-wise kernels (nn/kernels.c), every rank at once, forward and
 * backward each repeated for SUSTAIN_S per repetition, the slowest rank's median per unit
 * (xm_costmodel.h): rows N = --gemm-tokens, channels C = --gemm-hidden,
 * vocabulary --gemm-vocab, attention over sequences of T = min(N, 256) with heads of 32 channels
 * (NH = C / 32, at least 1). Without OpenBLAS nothing (the kernels use it). */
static double elt_median_max(double *t, int n)
{
    double mine = xmc_median(t, n), worst = 0;
    MPI_Allreduce(&mine, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return worst;
}

void xmc_measure_elt(const opts_t *o, int busy, xm_elt_rec_t *E)
{
    const int creps = COMPUTE_REPS(o);
    memset(E, 0, sizeof(xm_elt_rec_t) * XM_ELT_NKINDS);
#ifdef XMESH_CALIBRATE_BLAS
    int64_t N = o->tokens, C = o->hidden, V = o->vocab, T = N < 256 ? N : 256, hs = 32;
    int64_t NH = C / hs > 0 ? C / hs : 1, Bt = N / T > 0 ? N / T : 1, C4 = 4 * C;
    size_t big = (size_t)(N * C4 > N * V ? N * C4 : N * V);
    size_t att = (size_t)(Bt * NH * T * T), qkv = (size_t)(Bt * T * 3 * NH * hs);
    big = big > att ? big : att;
    big = big > qkv ? big : qkv;
    float *x = malloc(big * 4), *y = malloc(big * 4), *dy = malloc(big * 4), *dx = malloc(big * 4),
          *a = malloc(big * 4), *st = malloc((size_t)(N + T + 4 * C4 + 8) * 4 * 2);
    int *tg = malloc((size_t)N * sizeof(int));
    if (!x || !y || !dy || !dx || !a || !st || !tg) {
        fprintf(stderr, "xmesh-calibrate: rank %d: out of memory for the element-wise kernels\n",
                this_rank());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (size_t i = 0; i < big; i++) {
        x[i] = (float)((int)(i % 13) - 6) * 0.1f;
        dy[i] = (float)((int)(i % 7) - 3) * 0.01f;
        dx[i] = 0;
    }
    for (int64_t i = 0; i < N; i++)
        tg[i] = (int)(i % V);
    float *w = st, *bb = st + C4, *mu = st + 2 * C4, *rs = mu + N, *work = rs + N;
    for (int64_t i = 0; i < C4; i++)
        w[i] = 1, bb[i] = 0;
    double tf[MAX_REPS], tb[MAX_REPS];
    for (int k = 0; k < XM_ELT_NKINDS; k++) {
        double units = 0;
        MPI_Barrier(MPI_COMM_WORLD);
        for (int rep = -1; rep < creps; rep++) {  /* rep -1: warm-up */
            for (int ph = 0; ph < 2; ph++) {      /* forward, then backward */
                if (ph == 1 && k == XM_ELT_ADAMW) /* no backward */
                    break;
                double tw = MPI_Wtime(), t;
                int calls = 0;
                do {
                    switch ((xm_elt_t)k) {
                    case XM_ELT_GELU:
                        units = (double)(N * C4);
                        if (!ph)
                            xmp_gelu_fwd(y, x, (size_t)(N * C4));
                        else
                            xmp_gelu_bwd(dx, x, dy, (size_t)(N * C4));
                        break;
                    case XM_ELT_LAYERNORM:
                        units = (double)(N * C);
                        if (!ph)
                            xmp_layernorm_fwd(y, mu, rs, x, w, bb, (size_t)N, (int)C);
                        else
                            xmp_layernorm_bwd(dx, a, a + C, dy, x, w, mu, rs, (size_t)N, (int)C);
                        break;
                    case XM_ELT_ATTENTION:
                        units = (double)(Bt * NH * T * T * hs);
                        if (!ph)
                            xmp_attention_fwd(y, NULL, a, x, (int)Bt, (int)T, (int)NH, (int)hs);
                        else
                            xmp_attention_bwd(dx, dy, x, a, (int)Bt, (int)T, (int)NH, (int)hs,
                                              work);
                        break;
                    case XM_ELT_XENT:
                        units = (double)(N * V);
                        if (!ph) {
                            xmp_softmax_fwd(a, x, (size_t)N, (int)V, (int)V);
                            xmp_crossentropy_fwd(y, a, tg, (size_t)N, (int)V);
                        } else {
                            for (int64_t i = 0; i < N; i++)
                                dy[i] = 1.0f / (float)N;
                            xmp_crossentropy_softmax_bwd(dx, dy, a, tg, (size_t)N, (int)V, (int)V);
                        }
                        break;
                    case XM_ELT_RESIDUAL:
                        units = (double)(N * C);
                        if (!ph)
                            xmp_residual_fwd(y, x, a, (size_t)(N * C));
                        else
                            xmp_residual_bwd(dx, a, dy, (size_t)(N * C));
                        break;
                    default: /* adamw: one step over N x 4C parameters */
                        units = (double)(N * C4);
                        xmp_adamw(y, dy, a, dx, (size_t)(N * C4), 1e-4f, 0.9f, 0.95f, 1e-8f, 0.0f,
                                  1);
                        break;
                    }
                    calls++;
                } while ((t = MPI_Wtime() - tw) < SUSTAIN_S);
                if (rep >= 0)
                    (ph ? tb : tf)[rep] = t / calls;
                /* keep values bounded (outside the timing) */
                for (size_t i = 0; i < big; i += 64)
                    dx[i] = 0, a[i] = a[i] != a[i] ? 0 : a[i];
            }
        }
        E[k].busy = busy;
        E[k].fwd = elt_median_max(tf, creps) / units;
        E[k].bwd = k == XM_ELT_ADAMW ? 0 : elt_median_max(tb, creps) / units;
    }
    free(x);
    free(y);
    free(dy);
    free(dx);
    free(a);
    free(st);
    free(tg);
#else
    (void)o;
    (void)busy;
#endif
}

/* The GPT-2 step probe of the training stack (pipeline/calib/gptstep.h), timed like the kernels
 * above. G->busy stays 0 when not measured (without OpenBLAS: never). */
void xmc_measure_gptstep(const opts_t *o, int busy, xmp_gptstep_t *G)
{
    memset(G, 0, sizeof *G);
#ifdef XMESH_CALIBRATE_BLAS
    (void)xmp_gptstep_probe(MPI_COMM_WORLD, o->hidden, o->tokens, o->vocab, COMPUTE_REPS(o),
                            SUSTAIN_S, busy, elt_median_max, G);
#else
    (void)o;
    (void)busy;
#endif
}
