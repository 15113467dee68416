/*
 * The few MPI calls of the MPI tier's test programs (tests/mpi/test_mpi.c,
 * tests/mpi/test_many_mpi.c),
 * over the bootstrap without MPI, so that the same correctness matrix runs
 * over UCX in processes that never call MPI_Init (started by
 * tests/ucx/xmesh-launch.py). The test's own collectives (reporting, seed
 * broadcast, barriers) use the environment bootstrap's all-gather
 * (lib/boot), and xmesh_ctx_create_mpi(MPI_COMM_WORLD, ...) becomes
 * xmesh_ctx_create_ucx with that all-gather as the caller's xmesh_oob_t:
 * the callback path of the context. Test code only; never installed.
 */
#ifndef XMESH_TEST_MPI_SHIM_H
#define XMESH_TEST_MPI_SHIM_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "xm_envboot.h"
#include "xm_oob.h"
#include "xmesh.h"
#include "xmesh/ucx.h"

typedef int MPI_Comm;
typedef int MPI_Datatype;
typedef int MPI_Op;
#define MPI_COMM_WORLD 0
#define MPI_THREAD_SINGLE 0 /* the level does not matter without MPI */
#define MPI_THREAD_FUNNELED 1
#define MPI_THREAD_SERIALIZED 2
#define MPI_THREAD_MULTIPLE 3
enum { MPI_INT = 1, MPI_LONG, MPI_DOUBLE, MPI_CHAR, MPI_UINT64_T, MPI_UNSIGNED_LONG_LONG };
enum { MPI_MIN = 1, MPI_MAX };

static xmesh_oob_t shim_oob;
static xm_envboot_t *shim_boot;

static inline size_t shim_size(MPI_Datatype t)
{
    return t == MPI_INT ? sizeof(int) : t == MPI_CHAR ? 1 : 8;
}

static inline void shim_die(const char *what)
{
    fprintf(stderr, "mpi_shim: %s: %s\n", what, xmesh_last_error());
    fflush(stderr);
    _exit(2);
}

static inline int MPI_Init_thread(int *argc, char ***argv, int req, int *prov)
{
    (void)argc;
    (void)argv;
    if (xm_envboot_create(60, &shim_boot, &shim_oob))
        shim_die("bootstrap");
    *prov = req;
    return 0;
}

static inline int MPI_Comm_rank(MPI_Comm c, int *r)
{
    (void)c;
    *r = shim_oob.rank;
    return 0;
}

static inline int MPI_Comm_size(MPI_Comm c, int *s)
{
    (void)c;
    *s = shim_oob.size;
    return 0;
}

static inline double MPI_Wtime(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static inline int MPI_Bcast(void *buf, int count, MPI_Datatype t, int root, MPI_Comm c)
{
    (void)c;
    if (xm_oob_bcast(&shim_oob, buf, (size_t)count * shim_size(t), root, "test bcast"))
        shim_die("MPI_Bcast");
    return 0;
}

static inline int MPI_Barrier(MPI_Comm c)
{
    char b = 0;
    return MPI_Bcast(&b, 1, MPI_CHAR, 0, c);
}

#define SHIM_REDUCE(T)                                                                             \
    for (int i = 0; i < count; i++) {                                                              \
        T v = ((const T *)all)[i];                                                                 \
        for (int q = 1; q < shim_oob.size; q++) {                                                  \
            T w = ((const T *)(all + (size_t)q * n))[i];                                           \
            v = op == MPI_MIN ? (w < v ? w : v) : (w > v ? w : v);                                 \
        }                                                                                          \
        ((T *)recv)[i] = v;                                                                        \
    }

static inline int MPI_Allreduce(const void *send, void *recv, int count, MPI_Datatype t, MPI_Op op,
                                MPI_Comm c)
{
    (void)c;
    size_t n = (size_t)count * shim_size(t);
    char *all = malloc(n * (size_t)shim_oob.size);
    if (!all || xm_oob_allgather(&shim_oob, send, all, n, "test allreduce"))
        shim_die("MPI_Allreduce");
    if (t == MPI_INT)
        SHIM_REDUCE(int)
    else if (t == MPI_LONG)
        SHIM_REDUCE(long)
    else if (t == MPI_DOUBLE)
        SHIM_REDUCE(double)
    else
        SHIM_REDUCE(uint64_t)
    free(all);
    return 0;
}

static inline int MPI_Abort(MPI_Comm c, int code)
{
    (void)c;
    fflush(stdout);
    _exit(code);
}

static inline int MPI_Finalize(void)
{
    /* Everyone is done with the bootstrap before rank 0 closes it. */
    MPI_Barrier(MPI_COMM_WORLD);
    xm_envboot_destroy(shim_boot);
    return 0;
}

#define xmesh_ctx_create_mpi(comm, params, out) xmesh_ctx_create_ucx(&shim_oob, (params), (out))

#endif /* XMESH_TEST_MPI_SHIM_H */
