/* Scaffolding shared by the failure/timeout tests (test_overlap_fail.c, test_sbp_fail.c,
 * test_gpt_fail.c): 4 ranks, XMESH_TIMEOUT_S = T set by the caller. fail_test_init starts MPI
 * (MPI_THREAD_MULTIPLE), sets g_rank and returns T, or ends the process with exit code 1 (after
 * MPI_Finalize) when the world is not 4 ranks or T is not in (0, max_T] (max_T <= 0: no upper
 * bound; XMESH_TIMEOUT_S unset counts as 0). fail_mesh builds a mesh over world ranks 0..3 or
 * aborts (the harness itself failed, not the code under test). fail_test_finish sums g_fail over
 * the world, prints the verdict on rank 0, finalizes MPI and returns the exit code. Nobody calls
 * MPI_Abort on a checked failure: every rank reaches MPI_Finalize. Static definitions: included
 * by one test file each. */
#ifndef XMP_TEST_FAIL_TEST_H
#define XMP_TEST_FAIL_TEST_H

#include <stdio.h>
#include <stdlib.h>

#include "nn/sbp.h"
#include "test_report.h"

/* A timed-out call returned after el seconds: within [T, T + 2.5 s] (50 ms of clock slack
 * below T). */
#define EXPECT_TIMEOUT_WINDOW(el, T)                                                               \
    EXPECT((el) >= (T)-0.05 && (el) <= (T) + 2.5, "returned after %.3f s, expected [%g, %g]",      \
           (el), (T), (T) + 2.5)

static inline double fail_test_init(int *argc, char ***argv, const char *name, double max_T)
{
    int provided, size;
    MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const char *te = getenv("XMESH_TIMEOUT_S");
    double T = te && *te ? xmp_timeout_s() : 0; /* the value nn/ itself uses */
    if (size != 4 || !(T > 0) || (max_T > 0 && T > max_T)) {
        if (!g_rank) {
            if (max_T > 0)
                fprintf(stderr, "%s: needs 4 ranks and 0 < XMESH_TIMEOUT_S <= %g (%d ranks, %g)\n",
                        name, max_T, size, T);
            else
                fprintf(stderr, "%s: needs 4 ranks and XMESH_TIMEOUT_S > 0 (%d ranks, %g)\n", name,
                        size, T);
        }
        MPI_Finalize();
        exit(1);
    }
    if (!g_rank)
        printf("%s: 4 ranks, XMESH_TIMEOUT_S = %g\n", name, T);
    return T;
}

static inline xmp_mesh_t *fail_mesh(int nd, const int *shape)
{
    int ranks[4] = {0, 1, 2, 3};
    xmp_mesh_t *m = NULL;
    if (xmp_mesh_create(MPI_COMM_WORLD, NULL, nd, shape, ranks, &m)) {
        fprintf(stderr, "[rank %d] mesh: %s\n", g_rank, xmp_last_error());
        MPI_Abort(MPI_COMM_WORLD, 2); /* the test harness itself, not nn/ */
    }
    return m;
}

static inline int fail_test_finish(const char *name)
{
    int fails = 0;
    MPI_Allreduce(&g_fail, &fails, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (!g_rank)
        printf("%s: %s (%d failures)\n", name, fails ? "FAILED" : "ok", fails);
    MPI_Finalize();
    return fails ? 1 : 0;
}

#endif /* XMP_TEST_FAIL_TEST_H */
