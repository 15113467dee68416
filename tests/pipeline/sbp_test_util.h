/* Scaffolding shared by the SBP tensor tests (test_overlap.c, test_overlap_conv.c,
 * test_sbp_ops.c, test_sbp_layers.c): failure reporting (test_report.h), one seeded random
 * stream that every rank draws identically (the test sets g_state = its seed after parsing
 * --seed, so every rank builds the same cases), random SBP signatures and tensors, and a
 * bitwise element-by-element comparison of two tensors. Static definitions: included by one
 * test file each, after the nn/ headers the test needs. */
#ifndef XMP_TEST_SBP_TEST_UTIL_H
#define XMP_TEST_SBP_TEST_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/sbp.h"
#include "test_report.h"

static uint64_t g_state;

/* splitmix64 over g_state. */
static inline uint64_t next_u64(void)
{
    uint64_t z = (g_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1). */
static inline float urand(void)
{
    return (float)((next_u64() >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}

/* Uniform in [0, n). */
static inline int irand(int n)
{
    return (int)(next_u64() % (uint64_t)n);
}

static inline int64_t numel(int nd, const int64_t *s)
{
    int64_t v = 1;
    for (int d = 0; d < nd; d++)
        v *= s[d];
    return v;
}

/* Per mesh axis one of S(0..nsplit-1), B, and P when allow_p, uniformly; axes past the mesh's
 * are B. */
static inline void rand_sbp(const xmp_mesh_t *m, int nsplit, int allow_p, xmp_sbp_t *s)
{
    for (int a = 0; a < XMP_MAX_MESH_DIMS; a++)
        s[a] = xmp_sbp_b();
    for (int a = 0; a < m->ndim; a++) {
        int k = irand(nsplit + 1 + allow_p);
        s[a] = k < nsplit ? xmp_sbp_s(k) : k == nsplit ? xmp_sbp_b() : xmp_sbp_p();
    }
}

/* A random F32 tensor of this shape and SBP: every rank draws the same full array from the
 * shared stream (urand per element, row-major) and keeps its block. */
static inline void rand_tensor(xmp_tensor_t *t, xmp_mesh_t *m, int nd, const int64_t *shape,
                               const xmp_sbp_t *s)
{
    int64_t n = numel(nd, shape);
    float *f = malloc(sizeof(float) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++)
        f[i] = urand();
    OK(xmp_tensor_alloc(t, m, nd, shape, XMESH_F32, s));
    OK(xmp_tensor_fill_from_full(t, f));
    free(f);
}

/* An F32 tensor of this shape and SBP holding my block of the full array full. */
static inline void make(xmp_tensor_t *t, xmp_mesh_t *m, int nd, const int64_t *shape,
                        const xmp_sbp_t *s, const float *full)
{
    OK(xmp_tensor_alloc(t, m, nd, shape, XMESH_F32, s));
    OK(xmp_tensor_fill_from_full(t, full));
}

/* The full array of t, gathered (calloc'd, one spare element; the caller frees it). */
static inline float *full_of(const xmp_tensor_t *t)
{
    float *f = calloc((size_t)numel(t->ndim, t->shape) + 1, sizeof(float));
    OK(xmp_tensor_gather_full(t, f));
    return f;
}

/* L = sum(out * R) in double, from the gathered output (the finite-difference objective). */
static inline double objective(const xmp_tensor_t *out, const float *R)
{
    float *f = full_of(out);
    double s = 0;
    for (int64_t e = 0; e < numel(out->ndim, out->shape); e++)
        s += (double)f[e] * R[e];
    free(f);
    return s;
}

/* MPI_Init, g_rank, the world size (returned); --seed S sets *seed and --break sets *brk
 * (when brk is not NULL); rank 0 prints "name: seed S, N ranks" (replay with --seed S); the
 * shared stream starts at *seed. */
static inline int sbp_test_start(int *argc, char ***argv, const char *name, uint64_t *seed,
                                 int *brk)
{
    int n;
    MPI_Init(argc, argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    for (int i = 1; i < *argc; i++) {
        if (!strcmp((*argv)[i], "--seed") && i + 1 < *argc)
            *seed = strtoull((*argv)[++i], NULL, 10);
        else if (brk && !strcmp((*argv)[i], "--break"))
            *brk = 1;
    }
    if (g_rank == 0)
        printf("%s: seed %llu, %d ranks\n", name, (unsigned long long)*seed, n);
    g_state = *seed;
    return n;
}

/* Same SBP, same local block, same bits: every local element compared with memcmp; FAILs at
 * the first difference naming what, trial, the SBP, the element and both values. */
static inline void same(const xmp_tensor_t *a, const xmp_tensor_t *b, const char *what, int trial)
{
    char sa[64], sb[64];
    xmp_sbp_string(a->sbp, a->mesh->ndim, sa, sizeof sa);
    xmp_sbp_string(b->sbp, b->mesh->ndim, sb, sizeof sb);
    if (strcmp(sa, sb) || a->lcount != b->lcount) {
        FAIL("%s trial %d: SBP %s vs %s, %lld vs %lld elements", what, trial, sa, sb,
             (long long)a->lcount, (long long)b->lcount);
        return;
    }
    for (int64_t e = 0; e < a->lcount; e++)
        if (memcmp(xmp_f32(a) + e, xmp_f32(b) + e, 4)) {
            FAIL("%s trial %d (%s): element %lld: %.9g vs %.9g", what, trial, sa, (long long)e,
                 xmp_f32(a)[e], xmp_f32(b)[e]);
            return;
        }
}

#endif /* XMP_TEST_SBP_TEST_UTIL_H */
