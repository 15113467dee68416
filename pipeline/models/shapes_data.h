/*
 * Synthetic denoising task for the U-Transformer: 32x32 RGB images of 1 to 3 filled shapes
 * (circle, rectangle, triangle) in random colours on black, generated on the fly.
 *
 * Sample number i of step s is the image with global index s * global_batch + i; everything
 * about it (shapes, colours, noise) comes from a random stream keyed by (seed, global index), so
 * a data-parallel rank generates exactly its own slice and gets the same data as one process.
 *
 *   input  (3, 32, 32)  clean image + sigma * N(0, 1) noise
 *   target (4, 32, 32)  clean image (3 channels, values in [0, 1]) and the shape mask (1 where
 *                       any shape covers the pixel, else 0)
 *   cond   (16, D)      conditioning tokens: token t < number of shapes describes shape t with
 *                       features f = (1, circle, rect, triangle, r, g, b, cx, cy, size) mapped
 *                       by a fixed random embedding E (10 x D) plus a positional embedding P[t];
 *                       the other tokens are P[t] alone. E and P depend on the seed only.
 */
#ifndef XMP_MODELS_SHAPES_DATA_H
#define XMP_MODELS_SHAPES_DATA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define XMP_SHAPES_FEATURES 10

typedef struct {
    uint64_t seed;
    int cond_dim; /* D */
    float sigma;  /* noise standard deviation */
    float *embed; /* E (10, D) then P (16, D) */
} xmp_shapes_t;

/* Prepares the generator (allocates the embeddings). Returns 0, or -1 naming the bad value
 * (cond_dim < 1, sigma < 0 or not finite) or on out of memory (xmp_last_error()). */
int xmp_shapes_init(xmp_shapes_t *s, uint64_t seed, int cond_dim, float sigma);
void xmp_shapes_free(xmp_shapes_t *s);

/* Generates images first .. first + n - 1 of step `step` of a run with global_batch images per
 * step. Any of input (n,3,32,32), target (n,4,32,32), cond (n,16,D) may be NULL. Overwrites. */
void xmp_shapes_batch(const xmp_shapes_t *s, long step, int global_batch, int first, int n,
                      float *input, float *target, float *cond);

#ifdef __cplusplus
}
#endif

#endif /* XMP_MODELS_SHAPES_DATA_H */
