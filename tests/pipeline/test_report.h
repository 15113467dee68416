/* Failure reporting shared by the MPI tests in tests/pipeline/: every rank counts its failed
 * checks in g_fail and prints each as "[rank R] FAIL file:line: message". FAIL(fmt, ...) always
 * counts and prints the first TEST_FAIL_CAP (default 20; define it before including to change)
 * failures of a rank; EXPECT(cond, fmt, ...) counts and prints every failed condition;
 * OK(call) is FAIL unless call returns XMESH_SUCCESS, naming the call and xmp_last_error() (so
 * it needs nn/sbp.h included first). The test sets g_rank after MPI_Init and ends with a
 * non-zero exit code when any rank's g_fail is non-zero. Static definitions: included by one
 * test file each. */
#ifndef XMP_TEST_REPORT_H
#define XMP_TEST_REPORT_H

#include <stdio.h>

#ifndef TEST_FAIL_CAP
#define TEST_FAIL_CAP 20
#endif

static int g_rank, g_fail;

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        if (g_fail++ < TEST_FAIL_CAP) {                                                            \
            fprintf(stderr, "[rank %d] FAIL %s:%d: ", g_rank, __FILE__, __LINE__);                 \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
        }                                                                                          \
    } while (0)

#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            g_fail++;                                                                              \
            fprintf(stderr, "[rank %d] FAIL %s:%d: ", g_rank, __FILE__, __LINE__);                 \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
        }                                                                                          \
    } while (0)

#define OK(call)                                                                                   \
    do {                                                                                           \
        if ((call) != XMESH_SUCCESS)                                                               \
            FAIL("%s: %s", #call, xmp_last_error());                                               \
    } while (0)

#endif /* XMP_TEST_REPORT_H */
