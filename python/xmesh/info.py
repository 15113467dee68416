"""``python -m xmesh.info [--topo FILE.xml] [--no-topo]``: what ``xmesh-info`` prints.

The report is the library's own (xm_info_print in lib/topo/info.c, the
function tools/xmesh-info.c calls): library version, build configuration,
the MPI/hwloc/CUDA/NCCL versions found at build time and loaded at run
time, every XMESH_* parameter, and the hwloc topology. Needs no mpirun.
"""

import ctypes
import sys

from . import _lib

USAGE = (
    "usage: python -m xmesh.info [--topo FILE.xml] [--no-topo]\n"
    "  --topo FILE  describe the topology of an hwloc XML file (default: XMESH_TOPO_XML, else this machine)\n"
    "  --no-topo    skip the topology\n"
)


def report(topo_xml=None, topo=True):
    """Prints the report on the process's standard output; returns its exit code."""
    sys.stdout.flush()
    c_stdout = ctypes.c_void_p.in_dll(ctypes.CDLL(None), "stdout")
    xml = topo_xml.encode() if topo_xml is not None else None
    return _lib.info_print(c_stdout, xml, 1 if topo else 0)


def main(argv=None):
    args = sys.argv[1:] if argv is None else list(argv)
    xml, topo, i = None, True, 0
    while i < len(args):
        a = args[i]
        if a == "--topo" and i + 1 < len(args):
            xml = args[i + 1]
            i += 1
        elif a == "--no-topo":
            topo = False
        elif a in ("-h", "--help"):
            sys.stdout.write(USAGE)
            return 0
        else:
            sys.stderr.write(USAGE)
            return 2
        i += 1
    return report(xml, topo)


if __name__ == "__main__":
    sys.exit(main())
