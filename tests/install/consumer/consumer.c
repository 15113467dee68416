/* A user of the installed xmesh: public headers, library symbols, and a real
 * reshard through Open MPI (a singleton run: one rank whose source and
 * destination meshes overlap, so the plan is a local copy). */
#include <stdio.h>
#include <string.h>

#include <xmesh.h>
#include <xmesh/mpi.h>

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "consumer: check failed at line %d: %s (%s)\n", __LINE__, #cond,       \
                    xmesh_last_error());                                                           \
            fails++;                                                                               \
        }                                                                                          \
    } while (0)

int main(int argc, char **argv)
{
    int fails = 0, provided;
    xmesh_dtype_t t;
    CHECK(xmesh_dtype_parse("bf16", &t) == XMESH_SUCCESS && t == XMESH_BF16);
    CHECK(xmesh_dtype_size(XMESH_F64) == 8);
    CHECK(!strcmp(xmesh_result_string(XMESH_ERR_MISMATCH), "ranks passed different arguments"));
    CHECK(xmesh_dtype_parse("f128", &t) == XMESH_ERR_INVALID_ARGUMENT);
    CHECK(strstr(xmesh_last_error(), "f128") != NULL);
    CHECK(xmesh_mesh_destroy(NULL) == XMESH_SUCCESS);
    /* The version macros (generated <xmesh/config.h>) match the library. */
    char v[32];
    snprintf(v, sizeof v, "%d.%d.%d", XMESH_VERSION_MAJOR, XMESH_VERSION_MINOR,
             XMESH_VERSION_PATCH);
    CHECK(!strcmp(v, xmesh_version_string()) && !strcmp(XMESH_VERSION_STRING, v));
    CHECK(XMESH_VERSION_CODE ==
          XMESH_VERSION_MAJOR * 10000 + XMESH_VERSION_MINOR * 100 + XMESH_VERSION_PATCH);

    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    xmesh_ctx_t ctx = NULL;
    xmesh_mesh_t m = NULL;
    xmesh_plan_t plan = NULL;
    CHECK(xmesh_ctx_create_mpi(MPI_COMM_WORLD, NULL, &ctx) == XMESH_SUCCESS);
    int shape[1] = {1}, ranks[1] = {0};
    CHECK(xmesh_mesh_create(ctx, 1, shape, ranks, &m) == XMESH_SUCCESS);
    int64_t tshape[2] = {3, 5};
    xmesh_layout_t src = {2, tshape, XMESH_I32, m, "S0R"}, dst = {2, tshape, XMESH_I32, m, "B"};
    CHECK(xmesh_plan_create(ctx, &src, &dst, NULL, &plan) == XMESH_SUCCESS);
    int in[15], out[15 + 2];
    for (int i = 0; i < 15; i++)
        in[i] = 100 + i;
    memset(out, 0xee, sizeof out);
    CHECK(xmesh_reshard(plan, in, out + 1) == XMESH_SUCCESS);
    for (int i = 0; i < 15; i++)
        CHECK(out[1 + i] == 100 + i);
    CHECK(out[0] == (int)0xeeeeeeee && out[16] == (int)0xeeeeeeee);
    CHECK(xmesh_plan_destroy(plan) == XMESH_SUCCESS);
    CHECK(xmesh_mesh_destroy(m) == XMESH_SUCCESS);
    CHECK(xmesh_ctx_destroy(ctx) == XMESH_SUCCESS);
    MPI_Finalize();
    printf("consumer: xmesh %s, %d failed checks\n", xmesh_version_string(), fails);
    return fails != 0;
}
