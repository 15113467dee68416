/*
 * What this xmesh is and what it sees: the report of xmesh-info, kept in the
 * library so every front end prints the same text (tools/xmesh-info.c and
 * the Python package's `python -m xmesh.info` both call xm_info_print).
 *
 *   library version; build configuration (compiler, build type, and the MPI,
 *   hwloc, CUDA and NCCL versions found at build time next to the versions
 *   loaded at run time); every XMESH_* parameter with its default, current
 *   value and help line; the topology of this machine from hwloc (GPUs,
 *   NICs, PCI locality) and the NICs-per-host figure the cluster model
 *   would take from it.
 *
 * Needs no MPI launch (MPI_Get_library_version works before MPI_Init), no GPU.
 */
#include <hwloc.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef XMESH_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

#include "xm_core.h"
#include "xm_topo.h"
#include "xmesh.h"

#ifndef XMESH_BUILD_TYPE
#define XMESH_BUILD_TYPE "unknown"
#endif
#ifndef XMESH_FOUND_MPI
#define XMESH_FOUND_MPI "unknown"
#endif
#ifndef XMESH_FOUND_HWLOC
#define XMESH_FOUND_HWLOC "unknown"
#endif
#ifndef XMESH_FOUND_CUDA
#define XMESH_FOUND_CUDA "not found"
#endif
#ifdef XMESH_HAVE_UCX
#include <ucp/api/ucp.h>
#endif
#ifndef XMESH_FOUND_UCX
#define XMESH_FOUND_UCX "not found"
#endif
#ifndef XMESH_FOUND_NCCL
#define XMESH_FOUND_NCCL "not found"
#endif
#ifndef XMESH_C_COMPILER
#define XMESH_C_COMPILER __VERSION__
#endif
#ifndef XMESH_CUDA_ARCHS
#define XMESH_CUDA_ARCHS "-"
#endif

static void print_build(FILE *out)
{
    char lib[MPI_MAX_LIBRARY_VERSION_STRING] = "";
    int len = 0;
    MPI_Get_library_version(lib, &len); /* allowed before MPI_Init */
    char *nl = strchr(lib, '\n');
    if (nl)
        *nl = 0;
    fprintf(out, "xmesh %s\n\n", xmesh_version_string());
    fprintf(out, "build\n");
    fprintf(out, "  %-22s %s\n", "build type", XMESH_BUILD_TYPE);
    fprintf(out, "  %-22s %s\n", "C compiler", XMESH_C_COMPILER);
    fprintf(out, "  %-22s MPI standard %s found (headers %d.%d); loaded: %s\n", "MPI",
            XMESH_FOUND_MPI, MPI_VERSION, MPI_SUBVERSION, lib);
    unsigned hv = hwloc_get_api_version();
    fprintf(out, "  %-22s found %s (headers: API 0x%x); loaded library: API 0x%x\n", "hwloc",
            XMESH_FOUND_HWLOC, (unsigned)HWLOC_API_VERSION, hv);
#ifdef XMESH_HAVE_UCX
    unsigned umaj = 0, umin = 0, urel = 0;
    ucp_get_version(&umaj, &umin, &urel);
    fprintf(out, "  %-22s yes: found %s (headers %d.%d); loaded %u.%u.%u (docs/UCX.md)\n",
            "UCX transport", XMESH_FOUND_UCX, UCP_API_MAJOR, UCP_API_MINOR, umaj, umin, urel);
#else
    fprintf(out, "  %-22s no (UCX not found at build time: libucx-dev)\n", "UCX transport");
#endif
#ifdef XMESH_HAVE_CUDA
    int rt = 0, drv = 0, ndev = 0, nv = 0;
    cudaRuntimeGetVersion(&rt);
    cudaError_t de = cudaDriverGetVersion(&drv);
    cudaError_t ce = cudaGetDeviceCount(&ndev);
    ncclGetVersion(&nv);
    fprintf(out, "  %-22s yes (kernels for sm %s)\n", "NCCL/CUDA backend", XMESH_CUDA_ARCHS);
    fprintf(out, "  %-22s found %s (CUDART %d); runtime %d.%d, driver %s\n", "CUDA",
            XMESH_FOUND_CUDA, CUDART_VERSION, rt / 1000, (rt % 1000) / 10,
            de == cudaSuccess && drv ? "present" : "none");
    if (de == cudaSuccess && drv)
        fprintf(out, "  %-22s %d.%d\n", "CUDA driver API", drv / 1000, (drv % 1000) / 10);
    fprintf(out, "  %-22s found %s (headers %d.%d.%d); loaded %d.%d.%d\n", "NCCL", XMESH_FOUND_NCCL,
            NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH, nv / 10000, (nv / 100) % 100, nv % 100);
    if (ce == cudaSuccess)
        fprintf(out, "  %-22s %d\n", "CUDA devices", ndev);
    else
        fprintf(out, "  %-22s 0 (%s)\n", "CUDA devices", cudaGetErrorString(ce));
    fprintf(out, "  %-22s %s\n", "GPU execution",
            "the NCCL path has not been executed on a GPU yet (docs/NCCL.md)");
#else
    fprintf(out, "  %-22s no (CUDA toolkit or NCCL not found at build time)\n",
            "NCCL/CUDA backend");
#endif
}

static void print_params(FILE *out)
{
    int w = 0;
    for (int i = 0; i < xm_param_count(); i++) {
        int l = (int)strlen(xm_param_get(i)->name);
        if (l > w)
            w = l;
    }
    fprintf(out, "\nparameters (environment; \"-\" = unset, the default applies; a value that does "
                 "not parse is refused with a warning and the default applies)\n");
    fprintf(out, "  %-*s  %-8s %-12s %-12s %s\n", w, "name", "kind", "default", "current",
            "meaning");
    for (int i = 0; i < xm_param_count(); i++) {
        const xm_param_desc_t *p = xm_param_get(i);
        const char *v = getenv(p->name);
        char cur[160];
        if (!v || !*v)
            snprintf(cur, sizeof cur, "-");
        else if (strcmp(xm_param_kind_name(p->name), "string") && !xm_param_is_set(p->name))
            snprintf(cur, sizeof cur, "%s (refused)", v);
        else
            snprintf(cur, sizeof cur, "%s", v);
        fprintf(out, "  %-*s  %-8s %-12s %-12s %s\n", w, p->name, xm_param_kind_name(p->name),
                *p->deflt ? p->deflt : "\"\"", cur, p->help);
    }
    fprintf(out, "\nunknown XMESH_* variables in the environment (misspelt? ignored by xmesh)\n");
    if (!xm_param_check_env(NULL))
        fprintf(out, "  none\n");
    else
        xm_param_check_env(out);
#ifdef XMESH_TEST_HOOKS
    fprintf(out, "\ntest hooks: compiled in (XMESH_TEST_CORRUPT works; a test build)\n");
#else
    fprintf(out, "\ntest hooks: not compiled in (XMESH_TEST_CORRUPT is ignored)\n");
#endif
}

static int print_topo(FILE *out, const char *xml)
{
    xm_topo_t *t = NULL;
    fprintf(out, "\ntopology\n");
    if (xm_topo_load(xml, &t) != XMESH_SUCCESS) {
        fprintf(out, "  unavailable: %s\n", xmesh_last_error());
        return 1;
    }
    xm_topo_print(t, out);
    fprintf(out, "  cluster model: %d NIC(s) per host from hwloc", xm_topo_nics_per_host(t));
    if (xm_param_is_set("XMESH_NICS_PER_HOST"))
        fprintf(out, " (XMESH_NICS_PER_HOST=%lld overrides it)",
                (long long)xm_param_nics_per_host());
    fprintf(out, "\n");
    for (int g = 0; g < t->ngpus; g++)
        fprintf(out, "  gpu %d sends through nic %d (%s)\n", g, t->gpus[g].nic,
                t->gpus[g].nic >= 0 ? t->nics[t->gpus[g].nic].name : "-");
    xm_topo_free(t);
    return 0;
}

int xm_info_print(FILE *out, const char *topo_xml, int topo)
{
    if (!topo_xml)
        topo_xml = xm_param_topo_xml();
    print_build(out);
    print_params(out);
    int rc = topo ? print_topo(out, topo_xml && *topo_xml ? topo_xml : NULL) : 0;
    fflush(out);
    return rc;
}
