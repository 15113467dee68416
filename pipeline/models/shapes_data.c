/* Synthetic shapes denoising data (see shapes_data.h). */
#include "models/shapes_data.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "models/utransformer.h"

int xmp_ut__fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

typedef struct {
    uint64_t key, ctr;
} rng_t;

static uint64_t mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void rng_seed(rng_t *r, uint64_t seed, uint64_t stream)
{
    r->key = mix64(seed ^ mix64(stream));
    r->ctr = 0;
}

/* uniform in [0, 1) with 53 bits */
static double unif(rng_t *r)
{
    r->ctr++;
    return (double)(mix64(r->key + r->ctr * 0xd1b54a32d192ed03ull) >> 11) *
           (1.0 / 9007199254740992.0);
}

static double gauss(rng_t *r)
{
    double u1 = unif(r), u2 = unif(r);
    if (u1 < 1e-300)
        u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

int xmp_shapes_init(xmp_shapes_t *s, uint64_t seed, int cond_dim, float sigma)
{
    if (cond_dim < 1)
        return xmp_ut__fail("shapes: cond_dim %d must be >= 1", cond_dim);
    if (!(sigma >= 0.0f) || !isfinite(sigma))
        return xmp_ut__fail("shapes: noise sigma %g must be finite and >= 0", (double)sigma);
    size_t n = (size_t)(XMP_SHAPES_FEATURES + XMP_UT_TOKENS) * (size_t)cond_dim;
    float *e = malloc(n * sizeof *e);
    if (!e)
        return xmp_ut__fail("shapes: out of memory for %zu floats", n);
    rng_t r;
    rng_seed(&r, seed, 0x454d4245ull); /* the embeddings' own stream */
    for (size_t i = 0; i < n; i++)
        e[i] = (float)(0.5 * gauss(&r));
    s->seed = seed;
    s->cond_dim = cond_dim;
    s->sigma = sigma;
    s->embed = e;
    return 0;
}

void xmp_shapes_free(xmp_shapes_t *s)
{
    if (!s)
        return;
    free(s->embed);
    s->embed = NULL;
}

static int inside(int cls, double cx, double cy, double r, double px, double py)
{
    double dx = px - cx, dy = py - cy;
    switch (cls) {
    case 0:
        return dx * dx + dy * dy <= r * r;
    case 1:
        return fabs(dx) <= r && fabs(dy) <= 0.7 * r;
    default: { /* apex up at cy - r, base at cy + r */
        double t = (py - (cy - r)) / (2.0 * r);
        return t >= 0.0 && t <= 1.0 && fabs(dx) <= r * t;
    }
    }
}

static void one_image(const xmp_shapes_t *s, uint64_t gidx, float *in, float *tg, float *cond)
{
    enum { S = 32, HW = 32 * 32 };
    const int D = s->cond_dim;
    float img[4 * HW];
    double feat[3][XMP_SHAPES_FEATURES];
    rng_t r;
    rng_seed(&r, s->seed, 0x10000ull + gidx);
    memset(img, 0, sizeof img);
    int ns = 1 + (int)(unif(&r) * 3.0);
    for (int k = 0; k < ns; k++) {
        int cls = (int)(unif(&r) * 3.0);
        double col[3] = {0.2 + 0.8 * unif(&r), 0.2 + 0.8 * unif(&r), 0.2 + 0.8 * unif(&r)};
        double rad = 4.0 + 6.0 * unif(&r);
        double cx = rad + (S - 2.0 * rad) * unif(&r), cy = rad + (S - 2.0 * rad) * unif(&r);
        for (int y = 0; y < S; y++)
            for (int x = 0; x < S; x++)
                if (inside(cls, cx, cy, rad, x + 0.5, y + 0.5)) {
                    for (int c = 0; c < 3; c++)
                        img[c * HW + y * S + x] = (float)col[c];
                    img[3 * HW + y * S + x] = 1.0f;
                }
        double f[XMP_SHAPES_FEATURES] = {1.0,    cls == 0, cls == 1, cls == 2, col[0],
                                         col[1], col[2],   cx / S,   cy / S,   rad / 10.0};
        memcpy(feat[k], f, sizeof f);
    }
    if (tg)
        memcpy(tg, img, sizeof img);
    /* the noise comes after the shapes in the same stream: same draws whatever is requested */
    for (int i = 0; i < 3 * HW; i++) {
        float z = (float)gauss(&r);
        if (in)
            in[i] = img[i] + s->sigma * z;
    }
    if (cond) {
        const float *E = s->embed, *P = s->embed + (size_t)XMP_SHAPES_FEATURES * D;
        for (int t = 0; t < XMP_UT_TOKENS; t++)
            for (int d = 0; d < D; d++) {
                double v = P[(size_t)t * D + d];
                if (t < ns)
                    for (int f = 0; f < XMP_SHAPES_FEATURES; f++)
                        v += feat[t][f] * E[(size_t)f * D + d];
                cond[(size_t)t * D + d] = (float)v;
            }
    }
}

void xmp_shapes_batch(const xmp_shapes_t *s, long step, int global_batch, int first, int n,
                      float *input, float *target, float *cond)
{
    const size_t HW = 32 * 32, D = (size_t)s->cond_dim;
    for (int i = 0; i < n; i++) {
        uint64_t g = (uint64_t)step * (uint64_t)global_batch + (uint64_t)(first + i);
        one_image(s, g, input ? input + (size_t)i * 3 * HW : NULL,
                  target ? target + (size_t)i * 4 * HW : NULL,
                  cond ? cond + (size_t)i * XMP_UT_TOKENS * D : NULL);
    }
}
