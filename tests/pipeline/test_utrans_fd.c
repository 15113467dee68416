/*
 * U-Transformer, one process: finite-difference checks of every composite layer (input, skip
 * and parameter gradients, through the split backward_input / backward_weight), of the whole
 * serial model's loss gradient, determinism and slicing of the shapes data and of the parameter
 * init, and bad-input errors. Replay with: test_utrans_fd --seed N
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/shapes_data.h"
#include "models/utransformer.h"
#include "utrans_check.h"

typedef struct {
    xmp_ut_layer_t *l;
    const float *w, *x, *skip, *cond, *r, *rs;
    float *y, *so;
    size_t ny, nso;
} probe_t;

/* L = sum y*r + sum skip_out*rs, in double */
static double probe_loss(probe_t *p)
{
    if (xmp_ut_layer_forward(p->l, p->w, p->x, p->skip, p->cond, p->y, p->so) != 0) {
        printf("forward failed: %s\n", xmp_last_error());
        exit(1);
    }
    double s = 0;
    for (size_t i = 0; i < p->ny; i++)
        s += (double)p->y[i] * p->r[i];
    for (size_t i = 0; i < p->nso; i++)
        s += (double)p->so[i] * p->rs[i];
    return s;
}

/* Compares the analytic gradient an[] of `count` floats of v with central differences on up to
 * `samples` coordinates; returns the relative error ||fd - an|| / ||an|| over the samples. */
static double fd_check(probe_t *p, float *v, const float *an, size_t count, int samples)
{
    double num = 0, den = 0;
    for (int k = 0; k < samples; k++) {
        size_t i = (size_t)(urand() * (double)count);
        float save = v[i];
        float h = 1e-2f * fmaxf(1.0f, fabsf(save));
        v[i] = save + h;
        double lp = probe_loss(p);
        v[i] = save - h;
        double lm = probe_loss(p);
        v[i] = save;
        double fd = (lp - lm) / (2.0 * (double)h);
        num += (fd - an[i]) * (fd - an[i]);
        den += (double)an[i] * an[i];
    }
    /* gradients that are exactly zero in theory (the key bias under softmax) get an absolute
     * floor instead of a relative error of noise */
    return sqrt(num) / fmax(sqrt(den), 1e-2 * sqrt((double)samples));
}

static void check_layer(const xmp_ut_config_t *cf, const xmp_ut_params_t *pp, int layer, int n)
{
    xmp_ut_layer_t *l = xmp_ut_layer_create(cf, layer, n);
    CHECK(l != NULL, "create %s: %s", xmp_ut_layer_name(layer), xmp_last_error());
    if (!l)
        return;
    size_t nw = pp->layer_count[layer], nx = xmp_ut_layer_in_floats(l),
           ny = xmp_ut_layer_out_floats(l), nsi = xmp_ut_layer_skip_in_floats(l),
           nso = xmp_ut_layer_skip_out_floats(l),
           nc = (size_t)n * XMP_UT_TOKENS * (size_t)cf->cond_dim;
    float *all = malloc(pp->total * sizeof(float));
    xmp_ut_params_init(pp, 7, all);
    float *w = all + pp->layer_offset[layer];
    /* non-trivial biases, gammas, betas */
    for (int k = 0; k < pp->ntensors; k++)
        if (pp->t[k].layer == layer && pp->t[k].ndim == 1)
            for (size_t i = 0; i < pp->t[k].count; i++)
                all[pp->t[k].offset + i] += (float)(0.3 * (2.0 * urand() - 1.0));
    float *x = malloc((nx + nsi + nc + 2 * ny + 2 * nso + nx + nsi + nw + 4) * sizeof(float));
    float *skip = x + nx, *cond = skip + nsi, *r = cond + nc, *y = r + ny, *rs = y + ny,
          *so = rs + nso, *dx = so + nso, *dsi = dx + nx, *dw = dsi + nsi;
    fill(x, nx, 1.0);
    fill(skip, nsi, 1.0);
    fill(cond, nc, 1.0);
    fill(r, ny, 1.0);
    fill(rs, nso, 1.0);
    probe_t p = {l, w, x, nsi ? skip : NULL, cond, r, rs, y, nso ? so : NULL, ny, nso};
    probe_loss(&p);
    memset(dx, 0, (nx + nsi + nw) * sizeof(float));
    int rc =
        xmp_ut_layer_backward_input(l, w, r, nso ? rs : NULL, layer ? dx : NULL, nsi ? dsi : NULL);
    CHECK(rc == 0, "%s backward_input: %s", xmp_ut_layer_name(layer), xmp_last_error());
    rc = xmp_ut_layer_backward_weight(l, dw);
    CHECK(rc == 0, "%s backward_weight: %s", xmp_ut_layer_name(layer), xmp_last_error());
    const double tol = 2e-2;
    if (layer > 0) {
        double e = fd_check(&p, x, dx, nx, 24);
        CHECK(e < tol, "%s dx rel err %.3g", xmp_ut_layer_name(layer), e);
        printf("  %-8s dx     rel err %.2e\n", xmp_ut_layer_name(layer), e);
    }
    if (nsi) {
        double e = fd_check(&p, skip, dsi, nsi, 24);
        CHECK(e < tol, "%s dskip rel err %.3g", xmp_ut_layer_name(layer), e);
        printf("  %-8s dskip  rel err %.2e\n", xmp_ut_layer_name(layer), e);
    }
    /* every parameter tensor of the layer, a few coordinates each */
    for (int k = 0; k < pp->ntensors; k++) {
        if (pp->t[k].layer != layer)
            continue;
        size_t off = pp->t[k].offset - pp->layer_offset[layer];
        double e = fd_check(&p, w + off, dw + off, pp->t[k].count, 6);
        CHECK(e < tol, "%s rel err %.3g", pp->t[k].name, e);
        if (e >= tol / 4)
            printf("  %-20s rel err %.2e\n", pp->t[k].name, e);
    }
    free(x);
    free(all);
    xmp_ut_layer_destroy(l);
}

/* The whole model: loss gradient for a few parameters of every layer. */
static void check_model(const xmp_ut_config_t *cf, int n)
{
    xmp_ut_model_t m;
    int rc = xmp_ut_model_init(&m, cf, n, 11);
    CHECK(rc == 0, "model init: %s", xmp_last_error());
    if (rc)
        return;
    xmp_shapes_t sh;
    xmp_shapes_init(&sh, 3, cf->cond_dim, 0.3f);
    size_t HW = 32 * 32, D = (size_t)cf->cond_dim;
    float *in = malloc((size_t)n * (3 + 4) * HW * sizeof(float) +
                       (size_t)n * XMP_UT_TOKENS * D * sizeof(float));
    float *tg = in + (size_t)n * 3 * HW, *cond = tg + (size_t)n * 4 * HW;
    xmp_shapes_batch(&sh, 0, n, 0, n, in, tg, cond);
    xmp_ut_model_forward(&m, in, cond, tg);
    xmp_ut_model_backward(&m, tg);
    double worst = 0;
    for (int k = 0; k < m.layout.ntensors; k++) {
        if (m.layout.t[k].ndim == 1 && k % 3)
            continue;
        size_t i = m.layout.t[k].offset + (size_t)(urand() * (double)m.layout.t[k].count);
        float save = m.params[i], h = 1e-2f * fmaxf(1.0f, fabsf(save));
        m.params[i] = save + h;
        xmp_ut_model_forward(&m, in, cond, tg);
        double lp = m.loss;
        m.params[i] = save - h;
        xmp_ut_model_forward(&m, in, cond, tg);
        double lm = m.loss;
        m.params[i] = save;
        double fd = (lp - lm) / (2.0 * h), an = m.grads[i];
        double err = fabs(fd - an) / fmax(fabs(an), 1e-4);
        if (fabs(fd - an) > 1e-6 && err > worst)
            worst = err;
        CHECK(fabs(fd - an) <= 5e-2 * fabs(an) + 2e-6, "model %s[%zu]: fd %.6g analytic %.6g",
              m.layout.t[k].name, i - m.layout.t[k].offset, fd, an);
    }
    printf("  model: worst relative error %.2e over %d tensors, %zu parameters\n", worst,
           m.layout.ntensors, m.layout.total);
    free(in);
    xmp_shapes_free(&sh);
    xmp_ut_model_free(&m);
}

static void check_data(void)
{
    const int D = 16, G = 6;
    xmp_shapes_t a, b;
    CHECK(xmp_shapes_init(&a, 5, D, 0.3f) == 0, "shapes init");
    CHECK(xmp_shapes_init(&b, 5, D, 0.3f) == 0, "shapes init");
    size_t HW = 1024, per = (3 + 4) * HW + XMP_UT_TOKENS * D;
    float *full = malloc(2 * per * G * sizeof(float)), *part = full + per * G;
    xmp_shapes_batch(&a, 3, G, 0, G, full, full + 3 * HW * G, full + 7 * HW * G);
    /* images 2..4 alone must equal the slice of the full batch */
    xmp_shapes_batch(&b, 3, G, 2, 3, part, part + 3 * HW * 3, part + 7 * HW * 3);
    CHECK(!memcmp(part, full + 2 * 3 * HW, 3 * 3 * HW * sizeof(float)), "input slice differs");
    CHECK(!memcmp(part + 9 * HW, full + 3 * HW * G + 2 * 4 * HW, 3 * 4 * HW * sizeof(float)),
          "target slice differs");
    CHECK(!memcmp(part + 21 * HW, full + 7 * HW * G + 2 * XMP_UT_TOKENS * D,
                  3 * XMP_UT_TOKENS * D * sizeof(float)),
          "cond slice differs");
    /* target: values in [0,1], mask 0/1 and covering something, input differs from clean */
    int masked = 0, bad = 0;
    for (size_t i = 0; i < 4 * HW * G; i++) {
        float v = full[3 * HW * G + i];
        bad += !(v >= 0.0f && v <= 1.0f);
    }
    for (int n = 0; n < G; n++)
        for (size_t i = 0; i < HW; i++) {
            float m = full[3 * HW * G + (size_t)n * 4 * HW + 3 * HW + i];
            bad += m != 0.0f && m != 1.0f;
            masked += m == 1.0f;
        }
    CHECK(!bad, "%d target values out of range", bad);
    CHECK(masked > 16 * G, "only %d masked pixels in %d images", masked, G);
    /* another step gives other images */
    xmp_shapes_batch(&b, 4, G, 0, 1, part, NULL, NULL);
    CHECK(memcmp(part, full, 3 * HW * sizeof(float)) != 0, "step 4 repeats step 3");
    /* bad input */
    xmp_shapes_t c;
    CHECK(xmp_shapes_init(&c, 1, 0, 0.3f) == -1 && strstr(xmp_last_error(), "cond_dim 0"),
          "cond_dim 0 accepted or message '%s'", xmp_last_error());
    CHECK(xmp_shapes_init(&c, 1, 4, -1.0f) == -1 && strstr(xmp_last_error(), "sigma -1"),
          "sigma -1 accepted or message '%s'", xmp_last_error());
    free(full);
    xmp_shapes_free(&a);
    xmp_shapes_free(&b);
}

static void check_config_and_init(void)
{
    xmp_ut_config_t c;
    memset(&c, 0x5a, sizeof c);
    xmp_ut_config_t before = c;
    CHECK(xmp_ut_config_init(&c, 8, 3, 0) == -1 && strstr(xmp_last_error(), "groups 3"),
          "groups 3 of C 8: '%s'", xmp_last_error());
    CHECK(xmp_ut_config_init(&c, 8, 0, 5) == -1 && strstr(xmp_last_error(), "head_dim 5"),
          "head_dim 5 of C 8: '%s'", xmp_last_error());
    CHECK(!memcmp(&c, &before, sizeof c), "failed config_init changed the config");
    CHECK(xmp_ut_config_init(&c, 8, 0, 0) == 0 && c.groups == 4 && c.head_dim == 8 &&
              c.cond_dim == 32,
          "defaults for C 8");
    CHECK(xmp_ut_layer_create(&c, 13, 1) == NULL && strstr(xmp_last_error(), "layer 13"),
          "layer 13: '%s'", xmp_last_error());
    /* skip wiring: up1 <- down4 ... up4 <- down1, and shapes agree */
    for (int l = XMP_UT_UP1; l <= XMP_UT_UP4; l++) {
        int s = xmp_ut_skip_source(l), sh[3], in[3];
        CHECK(s == XMP_UT_DOWN4 - (l - XMP_UT_UP1) && xmp_ut_skip_dest(s) == l, "skip of %d", l);
        xmp_ut_layer_skip_shape(&c, s, sh);
        xmp_ut_layer_in_shape(&c, l, in);
        CHECK(sh[1] == in[1] && sh[2] == in[2], "skip %d spatial size %d vs %d", l, sh[1], in[1]);
    }
    for (int l = 0; l + 1 < XMP_UT_LAYERS; l++) {
        int o[3], i[3];
        xmp_ut_layer_out_shape(&c, l, o);
        xmp_ut_layer_in_shape(&c, l + 1, i);
        CHECK(!memcmp(o, i, sizeof o), "layer %d out != layer %d in", l, l + 1);
    }
    /* init: tensor k is the same whether generated alone or with all; seed changes it */
    xmp_ut_params_t p;
    xmp_ut_params_layout(&c, &p);
    float *a = malloc(p.total * sizeof(float)), *b = malloc(p.total * sizeof(float));
    xmp_ut_params_init(&p, 9, a);
    int k = 3;
    while (p.t[k].ndim < 2)
        k++;
    xmp_ut_tensor_init(&p, k, 9, b);
    CHECK(!memcmp(a + p.t[k].offset, b, p.t[k].count * sizeof(float)), "tensor init differs");
    xmp_ut_tensor_init(&p, k, 10, b);
    CHECK(memcmp(a + p.t[k].offset, b, p.t[k].count * sizeof(float)) != 0, "seed ignored");
    size_t sum = 0;
    for (int l = 0; l < XMP_UT_LAYERS; l++) {
        CHECK(p.layer_offset[l] == sum, "layer %d offset", l);
        sum += p.layer_count[l];
    }
    CHECK(sum == p.total, "layer counts sum %zu != total %zu", sum, p.total);
    free(a);
    free(b);
}

int main(int argc, char **argv)
{
    uint64_t seed = 12345;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--seed") && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 10);
    printf("test_utrans_fd seed %llu (replay: --seed %llu)\n", (unsigned long long)seed,
           (unsigned long long)seed);
    g_state = seed;
    check_config_and_init();
    check_data();
    xmp_ut_config_t cf;
    xmp_ut_config_init(&cf, 4, 2, 2); /* C 4: 2 groups, heads of 2 channels */
    xmp_ut_params_t pp;
    xmp_ut_params_layout(&cf, &pp);
    for (int l = 0; l < XMP_UT_LAYERS; l++)
        check_layer(&cf, &pp, l, 2);
    check_model(&cf, 2);
    printf(g_fail ? "FAILED (%d checks)\n" : "OK\n", g_fail);
    return g_fail ? 1 : 0;
}
