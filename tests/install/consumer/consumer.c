/* A user of the installed xmesh: public headers, library symbols, behaviour. */
#include <stdio.h>
#include <string.h>

#include <xmesh.h>
#include <xmesh/mpi.h>

int main(void)
{
    xmesh_dtype_t t;
    int fails = 0;
    fails += xmesh_dtype_parse("bf16", &t) != XMESH_SUCCESS || t != XMESH_BF16;
    fails += xmesh_dtype_size(XMESH_F64) != 8;
    fails += strcmp(xmesh_result_string(XMESH_ERR_MISMATCH), "ranks passed different arguments");
    fails += xmesh_dtype_parse("f128", &t) != XMESH_ERR_INVALID_ARGUMENT;
    fails += strstr(xmesh_last_error(), "f128") == NULL;
    fails += xmesh_mesh_destroy(NULL) != XMESH_SUCCESS;
    printf("consumer: xmesh %s, %d failed checks\n", xmesh_version_string(), fails);
    return fails != 0;
}
