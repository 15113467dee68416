/*
 * Cluster files: the scheduler's cluster model as text, so a model fitted
 * from measurements (or written by hand) can be given to xmesh-plan and to
 * plans (XMESH_CLUSTER_FILE). One `key = value` per line, '#' comments:
 *
 *   nic_gbps       = 10      # both directions (or nic_send_gbps / nic_recv_gbps)
 *   nics_per_host  = 1
 *   intra_gbps     = 800
 *   latency_us     = 5
 *   chunk_bytes    = 1048576
 *
 * Keys not given keep the cluster's current values.
 */
#ifndef XM_CLUSTER_FILE_H
#define XM_CLUSTER_FILE_H

#include "xm_sched.h"

/* Applies the settings in text (NUL-terminated) to *c. On error returns
 * INVALID_ARGUMENT naming the line, key and value, and leaves *c unchanged. */
xmesh_result_t xm_cluster_parse(const char *text, xm_cluster_t *c);
/* Reads a file and applies it like xm_cluster_parse(). */
xmesh_result_t xm_cluster_load(const char *path, xm_cluster_t *c);

#endif
