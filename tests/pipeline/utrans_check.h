/*
 * What the U-Transformer tests (test_utrans_fd.c, test_utrans_tp.c) share:
 * a CHECK that counts failures in g_fail (prefixed with the MPI rank once
 * the test sets g_rank >= 0) and a seeded uniform generator (g_state).
 */
#ifndef XMESH_TESTS_UTRANS_CHECK_H
#define XMESH_TESTS_UTRANS_CHECK_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

static int g_fail, g_rank = -1;
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            g_fail++;                                                                              \
            if (g_rank >= 0)                                                                       \
                printf("rank %d ", g_rank);                                                        \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                            \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
        }                                                                                          \
    } while (0)

static uint64_t g_state;
static inline double urand(void) /* [0, 1) */
{
    g_state = g_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(g_state >> 11) * (1.0 / 9007199254740992.0);
}
static inline void fill(float *p, size_t n, double scale)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (float)((2.0 * urand() - 1.0) * scale);
}

#endif
