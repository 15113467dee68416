/*
 * xmesh-info: what this xmesh is and what it sees.
 *
 *   library version; build configuration (compiler, build type, and the MPI,
 *   hwloc, CUDA and NCCL versions found at build time next to the versions
 *   loaded at run time); every XMESH_* parameter with its default, current
 *   value and help line; the topology of this machine from hwloc (GPUs,
 *   NICs, PCI locality) and the NICs-per-host figure the cluster model
 *   would take from it.
 *
 * usage: xmesh-info [--topo FILE.xml] [--no-topo]
 * Needs no MPI launch, no GPU; queries the libraries directly. The report
 * itself is xm_info_print (lib/topo/info.c), which the Python package's
 * `python -m xmesh.info` calls too.
 */
#include <stdio.h>
#include <string.h>

#include "xm_topo.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: xmesh-info [--topo FILE.xml] [--no-topo]\n"
               "  --topo FILE  describe the topology of an hwloc XML file (default: "
               "XMESH_TOPO_XML, else this machine)\n"
               "  --no-topo    skip the topology\n");
}

int main(int argc, char **argv)
{
    const char *xml = NULL; /* NULL: XMESH_TOPO_XML, else this machine */
    int topo = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--topo") && i + 1 < argc) {
            xml = argv[++i];
        } else if (!strcmp(argv[i], "--no-topo")) {
            topo = 0;
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }
    return xm_info_print(stdout, xml, topo);
}
