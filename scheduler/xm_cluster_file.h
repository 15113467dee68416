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
 *   nic_burst_bytes = 65536  # token-bucket burst of each NIC (>= 0; default 0: none)
 *
 * Keys not given keep the cluster's current values.
 *
 * Sections (issue 21): a line "[name]" starts a section; the lines before
 * the first header, and those after "[cluster]", are the keys above.
 * "[collectives]" and "[compute]" hold the calibrated records of
 * xm_costmodel.h (checked here too: a malformed record is an error for
 * every reader); sections of any other name are skipped, so files of later
 * versions still load. Readers from before sections existed reject a file
 * that has any (line "[...]" is not of the form key = value).
 */
#ifndef XM_CLUSTER_FILE_H
#define XM_CLUSTER_FILE_H

#include "xm_sched.h"

/* Applies the settings in text (NUL-terminated) to *c. On error returns
 * INVALID_ARGUMENT naming the line, key and value, and leaves *c unchanged. */
xmesh_result_t xm_cluster_parse(const char *text, xm_cluster_t *c);
/* Reads a file and applies it like xm_cluster_parse(). */
xmesh_result_t xm_cluster_load(const char *path, xm_cluster_t *c);

struct xm_costmodel;
/* Both readers' parser: base keys applied to *c (NULL: checked only),
 * records of known sections added to *m (NULL: checked only, in a scratch
 * model, so duplicates are refused either way). On error *c is unchanged;
 * *m may hold the records before the bad line (xm_costmodel_parse parses
 * into a fresh model and drops it). */
xmesh_result_t xm_clusterfile_parse(const char *text, xm_cluster_t *c, struct xm_costmodel *m);
/* Reads a cluster file (at most 1 MiB, no NUL bytes) into *text (the caller
 * frees it); *text untouched on error. */
xmesh_result_t xm_clusterfile_read(const char *path, char **text);

#endif
