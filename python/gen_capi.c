/*
 * Writes python/xmesh/_capi.py for the Python package at build time: every
 * constant the binding needs (result codes with their names and texts,
 * enum counts, limits, parameter-struct magic and sentinels) and the size
 * and field offsets of each struct the binding mirrors with ctypes, all
 * taken by the compiler from include/xmesh.h and <mpi.h>. Nothing in the
 * package is copied from the header by hand; xmesh/_lib.py refuses to load
 * when its ctypes structs disagree with the offsets written here.
 *
 * usage: xmesh_py_gen OUT.py MPI_LIBRARY
 */
#include <mpi.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "xmesh.h"
#include "xmesh/mpi.h"

/* A Python string literal (the texts are plain ASCII; escape what matters). */
static void pystr(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fputc('\\', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

#define FIELD(f, type, name)                                                                       \
    fprintf(f, "        %-14s %zu,\n", "\"" #name "\":", offsetof(type, name))

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: xmesh_py_gen OUT.py MPI_LIBRARY\n");
        return 2;
    }
    FILE *f = fopen(argv[1], "w");
    if (!f) {
        perror(argv[1]);
        return 1;
    }
    fprintf(f, "# Generated at build time by python/gen_capi.c from include/xmesh.h: do not "
               "edit.\n\n");
    fprintf(f, "VERSION = ");
    pystr(f, XMESH_VERSION_STRING);
    fprintf(f, "\nVERSION_CODE = %d\n", XMESH_VERSION_CODE);
#ifdef XMESH_HAVE_CUDA
    fprintf(f, "HAVE_CUDA = True\n");
#else
    fprintf(f, "HAVE_CUDA = False\n");
#endif
    fprintf(f, "\n# (name, value, text) of every xmesh_result_t, from XMESH_RESULT_LIST.\n");
    fprintf(f, "RESULTS = (\n");
#define XMESH_PY_RESULT_(name, value, text)                                                        \
    fprintf(f, "    (\"%s\", %d, ", #name, (int)(value));                                          \
    pystr(f, text);                                                                                \
    fprintf(f, "),\n");
    XMESH_RESULT_LIST(XMESH_PY_RESULT_)
#undef XMESH_PY_RESULT_
    fprintf(f, ")\n\n");
    fprintf(f, "SUCCESS = %d\nIN_PROGRESS = %d\n", XMESH_SUCCESS, XMESH_IN_PROGRESS);
    fprintf(f, "DTYPE_COUNT = %d\n", XMESH_DTYPE_COUNT_);
    fprintf(f, "STRATEGY_COUNT = %d\nSTRATEGY_UNSET = %d\n", XMESH_STRATEGY_COUNT_,
            XMESH_STRATEGY_UNSET);
    fprintf(f, "SCHEDULER_COUNT = %d\nSCHEDULER_UNSET = %d\n", XMESH_SCHEDULER_COUNT_,
            XMESH_SCHEDULER_UNSET);
    fprintf(f, "MAX_TENSOR_DIMS = %d\nMAX_MESH_DIMS = %d\n", XMESH_MAX_TENSOR_DIMS,
            XMESH_MAX_MESH_DIMS);
    fprintf(f, "SPLIT_NUMPY = %d\nSPLIT_TORCH = %d\n", XMESH_SPLIT_NUMPY, XMESH_SPLIT_TORCH);
    fprintf(f, "PARAMS_MAGIC = %u\n", (unsigned)XMESH_PARAMS_MAGIC);
    fprintf(f, "UNSET_INT = %d\nUNSET_I64 = %lld\nUNSET_DOUBLE = %.17g\n", XMESH_UNSET_INT,
            (long long)XMESH_UNSET_I64, XMESH_UNSET_DOUBLE);
    fprintf(f, "\n# MPI_Comm of the MPI xmesh was built with (a pointer in Open MPI, an int in "
               "MPICH).\n");
    fprintf(f, "MPI_COMM_SIZE = %zu\n", sizeof(MPI_Comm));
    fprintf(f, "MPI_LIBRARY = ");
    pystr(f, argv[2]);
    fprintf(f, "\nENUM_SIZE = %zu\n", sizeof(xmesh_result_t));

    fprintf(f, "\n# sizeof and field offsets of the structs _lib.py mirrors.\n");
    fprintf(f, "SIZEOF = {\n");
    fprintf(f, "    \"xmesh_layout_t\": %zu,\n", sizeof(xmesh_layout_t));
    fprintf(f, "    \"xmesh_plan_params_t\": %zu,\n", sizeof(xmesh_plan_params_t));
    fprintf(f, "    \"xmesh_plan_info_t\": %zu,\n", sizeof(xmesh_plan_info_t));
    fprintf(f, "}\nOFFSETOF = {\n");
    fprintf(f, "    \"xmesh_layout_t\": {\n");
    FIELD(f, xmesh_layout_t, ndim);
    FIELD(f, xmesh_layout_t, shape);
    FIELD(f, xmesh_layout_t, dtype);
    FIELD(f, xmesh_layout_t, mesh);
    FIELD(f, xmesh_layout_t, sharding);
    FIELD(f, xmesh_layout_t, split);
    fprintf(f, "    },\n    \"xmesh_plan_params_t\": {\n");
    FIELD(f, xmesh_plan_params_t, size);
    FIELD(f, xmesh_plan_params_t, magic);
    FIELD(f, xmesh_plan_params_t, version);
    FIELD(f, xmesh_plan_params_t, strategy);
    FIELD(f, xmesh_plan_params_t, scheduler);
    FIELD(f, xmesh_plan_params_t, chunk_bytes);
    FIELD(f, xmesh_plan_params_t, budget_us);
    FIELD(f, xmesh_plan_params_t, seed);
    FIELD(f, xmesh_plan_params_t, timeout_s);
    fprintf(f, "    },\n    \"xmesh_plan_info_t\": {\n");
    FIELD(f, xmesh_plan_info_t, unit_tasks);
    FIELD(f, xmesh_plan_info_t, bytes_total);
    FIELD(f, xmesh_plan_info_t, bytes_cross_host);
    FIELD(f, xmesh_plan_info_t, lower_bound_s);
    FIELD(f, xmesh_plan_info_t, predicted_s);
    FIELD(f, xmesh_plan_info_t, strategy);
    FIELD(f, xmesh_plan_info_t, scheduler);
    FIELD(f, xmesh_plan_info_t, chunk_bytes);
    FIELD(f, xmesh_plan_info_t, tensors);
    FIELD(f, xmesh_plan_info_t, scheduled_tasks);
    fprintf(f, "    },\n}\n");
    if (fclose(f)) {
        perror(argv[1]);
        return 1;
    }
    return 0;
}
