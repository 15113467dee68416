/* Every XMESH_* environment parameter, declared once (like NCCL_PARAM). */
#include <stdlib.h>
#include <string.h>

#include "xm_core.h"

static const xm_param_desc_t params[] = {
    {"XMESH_DEBUG", "", "log level: WARN, INFO or TRACE (errors are always recorded)"},
    {"XMESH_STRATEGY", "broadcast", "broadcast | sendrecv | sendrecv-allgather | global-allgather"},
    {"XMESH_SCHEDULER", "ensemble", "naive | lb | dfs | greedy | ensemble"},
    {"XMESH_CHUNK_BYTES", "262144", "pipelining chunk of broadcast chains, bytes"},
    {"XMESH_SEND_AHEAD", "2",
     "MPI executor: chunk sends in flight per chain link (receives run a window ahead)"},
    {"XMESH_BUDGET_US", "20000", "scheduler time budget, microseconds"},
    {"XMESH_SEED", "1", "scheduler random seed"},
    {"XMESH_TIMEOUT_S", "300", "timeout of blocking operations, seconds (0: none)"},
    {"XMESH_HOST_ID", "",
     "override this rank's host id (tests): an integer, or rank/N (N ranks per host); default: "
     "shared-memory split"},
    {"XMESH_NIC_GBPS", "10", "model: NIC bandwidth per direction, Gbit/s"},
    {"XMESH_NICS_PER_HOST", "1", "model: NICs per host"},
    {"XMESH_INTRA_GBPS", "800", "model: intra-host device-to-device bandwidth, Gbit/s"},
    {"XMESH_LATENCY_US", "5", "model: per-message latency, microseconds"},
    {"XMESH_CLUSTER_FILE", "",
     "model: cluster file (key = value lines) applied over the XMESH_* model values"},
    {"XMESH_TRACE", "", "write a Chrome trace-event JSON of each reshard to this path"},
    {"XMESH_CHECK", "0", "1: verify a checksum of every received box"},
    {"XMESH_TEST_CORRUPT", "",
     "tests only: with XMESH_CHECK=1, this rank flips a byte of the first chunk it receives"},
    {"XMESH_TOPO_XML", "", "hwloc XML file to use instead of this machine's topology"},
    {"XMESH_NCCL_MAX_COMMS", "8",
     "NCCL backend: most cached communicators per context (one per mesh pair)"},
    {"XMESH_ZERO_COPY", "0",
     "MPI executor: 1 = MPI reads/writes contiguous chunks in the caller's blocks directly (no "
     "staging copy); then after a failed reshard MPI may still touch the blocks"},
};

int xm_param_count(void)
{
    return (int)(sizeof params / sizeof params[0]);
}

const xm_param_desc_t *xm_param_get(int i)
{
    return i >= 0 && i < xm_param_count() ? &params[i] : NULL;
}

const char *xm_param_str(const char *name)
{
    const char *v = getenv(name);
    if (v && *v)
        return v;
    for (int i = 0; i < xm_param_count(); i++)
        if (!strcmp(params[i].name, name))
            return params[i].deflt;
    return "";
}

int64_t xm_param_i64(const char *name)
{
    return strtoll(xm_param_str(name), NULL, 0);
}

double xm_param_double(const char *name)
{
    return strtod(xm_param_str(name), NULL);
}
