/* Cluster model (issue 3 item 1): hosts, NICs, bandwidths, latency. */
#include <stdlib.h>
#include <string.h>

#include "xm_sched.h"

xmesh_result_t xm_cluster_init(xm_cluster_t *c, const xm_hostmap_t *hosts)
{
    if (!c || !hosts)
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xm_cluster_init: %s is NULL",
                      !c ? "cluster" : "hosts");
    if (hosts->ndev < 0 || hosts->nhosts < 0 || (hosts->ndev > 0 && !hosts->host_of))
        return XM_ERR(XMESH_ERR_INVALID_ARGUMENT, "xm_cluster_init: bad host map (%d devices)",
                      hosts->ndev);
    for (int i = 0; i < hosts->ndev; i++)
        if (hosts->host_of[i] < 0 || hosts->host_of[i] >= hosts->nhosts)
            return XM_ERR(XMESH_ERR_INVALID_ARGUMENT,
                          "xm_cluster_init: device %d on host %d, outside [0, %d)", i,
                          hosts->host_of[i], hosts->nhosts);
    int *h = malloc(sizeof *h * (hosts->ndev > 0 ? hosts->ndev : 1));
    if (!h)
        return XM_ERR(XMESH_ERR_NO_MEMORY, "xm_cluster_init: out of memory");
    if (hosts->ndev > 0)
        memcpy(h, hosts->host_of, sizeof *h * hosts->ndev);
    memset(c, 0, sizeof *c);
    c->hosts.ndev = hosts->ndev;
    c->hosts.nhosts = hosts->nhosts;
    c->hosts.host_of = h;
    c->nics_per_host = 1;
    c->nic_send_Bps = 10e9 / 8;
    c->nic_recv_Bps = 10e9 / 8;
    c->intra_Bps = 100e9;
    c->latency_s = 5e-6;
    c->chunk_bytes = 1 << 20;
    c->send_ahead = 1;
    c->forward_ahead = 1;
    c->sync_send = 0;
    return XMESH_SUCCESS;
}

void xm_cluster_free(xm_cluster_t *c)
{
    if (!c)
        return;
    free(c->hosts.host_of);
    memset(c, 0, sizeof *c);
}

/* Local index of dev among the devices of its host (ascending ids). */
static int local_index(const xm_cluster_t *c, int dev)
{
    int h = c->hosts.host_of[dev], k = 0;
    for (int i = 0; i < dev; i++)
        k += c->hosts.host_of[i] == h;
    return k;
}

int xm_cluster_nic_of(const xm_cluster_t *c, int dev)
{
    if (!c || dev < 0 || dev >= c->hosts.ndev)
        return -1;
    int n = c->nics_per_host > 0 ? c->nics_per_host : 1;
    return c->hosts.host_of[dev] * n + local_index(c, dev) % n;
}
