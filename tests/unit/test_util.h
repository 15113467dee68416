/* Small helpers shared by the unit tests: a seeded PRNG. */
#ifndef XM_TEST_UTIL_H
#define XM_TEST_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* Seed from XMESH_TEST_SEED or the clock; always printed so a failure can be
 * replayed. */
static inline uint64_t xt_seed(const char *test)
{
    const char *s = getenv("XMESH_TEST_SEED");
    uint64_t seed = s && *s ? strtoull(s, NULL, 0) : (uint64_t)time(NULL);
    printf("[%s] seed %llu (replay with XMESH_TEST_SEED=%llu)\n", test, (unsigned long long)seed,
           (unsigned long long)seed);
    fflush(stdout);
    return seed ? seed : 1;
}

static inline uint64_t xt_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

/* Uniform in [lo, hi]. */
static inline int xt_range(uint64_t *s, int lo, int hi)
{
    return lo + (int)(xt_next(s) % (uint64_t)(hi - lo + 1));
}

#endif
