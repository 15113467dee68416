/*
 * Host topology from hwloc: GPUs, NICs and their PCI locality.
 *
 * One xm_topo_t describes one host (this machine, or an hwloc XML file for
 * tests and for machines described offline). It answers the questions the
 * backends and the cluster model ask: how many NICs does a host have (the
 * model's nics_per_host), which NIC is closest to a GPU on the PCI tree
 * (that NIC carries the GPU's cross-host traffic when NCCL picks by
 * locality), and which GPU of a set should send on a given NIC.
 *
 * Classification is by PCI ids, so it works on XML files without drivers:
 *   GPU = vendor 0x10de (NVIDIA) with class 0x0302 (3D) or 0x0300 (VGA);
 *   NIC = class 0x02xx (network controller: Ethernet 0x0200, InfiniBand 0x0207).
 * OS devices below a PCI device only supply names ("cuda3", "mlx5_0", "ib0").
 */
#ifndef XM_TOPO_H
#define XM_TOPO_H

#include <stdint.h>
#include <stdio.h>

#include "xmesh.h"

#define XM_TOPO_NAME_LEN 32

typedef struct xm_topo_gpu {
    char busid[16];              /* "0000:41:00.0" */
    char name[XM_TOPO_NAME_LEN]; /* CUDA OS device name ("cuda2") or "" */
    int cuda_index;              /* N of "cudaN", -1 if hwloc has no CUDA OS device */
    unsigned vendor, device;     /* PCI ids */
    int numa;                    /* NUMA node os index of the closest CPU side, -1 unknown */
    char cpuset[64];             /* closest CPUs as an hwloc list ("0-7") */
    int nic;                     /* index of the closest NIC, -1 without NICs */
    int nic_distance;            /* PCI tree hops to that NIC */
} xm_topo_gpu_t;

typedef struct xm_topo_nic {
    char busid[16];
    char name[XM_TOPO_NAME_LEN];   /* openfabrics name ("mlx5_0") if any, else net ("eth0") */
    char netdev[XM_TOPO_NAME_LEN]; /* network interface name ("ib0") or "" */
    unsigned class_id, vendor, device;
    int numa;
    char cpuset[64];
    int gpu;           /* index of the closest GPU, -1 without GPUs */
    int ngpus_closest; /* GPUs whose closest NIC is this one */
} xm_topo_nic_t;

typedef struct xm_topo {
    char hostname[64];
    uint64_t host_id; /* FNV-1a of hostname: equal on ranks of one host */
    int npus;         /* processing units */
    int nnuma;
    int ngpus;
    xm_topo_gpu_t *gpus; /* sorted by PCI bus id */
    int nnics;
    xm_topo_nic_t *nics; /* sorted by PCI bus id */
    int *gpu_nic_dist;   /* ngpus * nnics PCI tree hops, row per GPU */
    char source[256];    /* "this machine" or the XML path */
} xm_topo_t;

/* Loads the topology of this machine (xml_path NULL or "") or of an hwloc
 * XML file. On success *out owns everything (free with xm_topo_free). On
 * error (SYSTEM: hwloc failed, with the path in the message; NO_MEMORY)
 * *out is untouched. */
xmesh_result_t xm_topo_load(const char *xml_path, xm_topo_t **out);
void xm_topo_free(xm_topo_t *t);

static inline int xm_topo_nics(const xm_topo_t *t)
{
    return t ? t->nnics : 0;
}
static inline int xm_topo_gpus(const xm_topo_t *t)
{
    return t ? t->ngpus : 0;
}
/* The model needs at least one NIC per host even on a machine that shows
 * none (loopback-only containers): max(1, nnics). */
int xm_topo_nics_per_host(const xm_topo_t *t);
/* Closest NIC of GPU g (-1 when g is out of range or there is no NIC). */
int xm_topo_nic_for_gpu(const xm_topo_t *t, int g);
/* Closest GPU of NIC n (-1 when out of range or no GPU). */
int xm_topo_gpu_for_nic(const xm_topo_t *t, int n);
/* GPU index whose PCI bus id equals busid (case-insensitive; "0000:" domain
 * prefix optional, as CUDA prints 8- or 4-digit domains), -1 if none. */
int xm_topo_gpu_by_busid(const xm_topo_t *t, const char *busid);
/* Among n candidate GPU indices, the one closest to NIC nic (ties: the
 * earliest candidate). Lets a backend choose which replica inside a host
 * sends over a NIC. Returns -1 for n <= 0 or an invalid nic/candidate. */
int xm_topo_pick_sender(const xm_topo_t *t, const int *cand, int n, int nic);
/* Human-readable summary, one line per device. */
void xm_topo_print(const xm_topo_t *t, FILE *f);

/* The xmesh-info report (version, build, parameters, topology of topo_xml:
 * NULL = XMESH_TOPO_XML, else this machine; topo = 0 skips it) on out.
 * Returns 0, or 1 when the topology is unavailable. Exported from libxmesh
 * for the Python package (same build, not part of the public API). */
int xm_info_print(FILE *out, const char *topo_xml, int topo);

#endif /* XM_TOPO_H */
