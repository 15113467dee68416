/* Fuzzes the cluster-file parser: any text either applies cleanly (and the
 * model stays valid: positive bandwidths, >= 1 NIC) or is rejected with the
 * cluster left exactly as it was. The cost-model reader (xm_costmodel.h)
 * accepts exactly the same texts, and every record it keeps predicts a
 * finite time at its own geometry or refuses cleanly. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <math.h>

#include "xm_cluster_file.h"
#include "xm_costmodel.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    memcpy(text, data, size);
    text[size] = '\0';
    int host_of[2] = {0, 1};
    xm_hostmap_t hm = {.ndev = 2, .nhosts = 2, .host_of = host_of};
    xm_cluster_t c;
    if (xm_cluster_init(&c, &hm))
        abort();
    xm_cluster_t before = c;
    xm_costmodel_t *m = NULL;
    int cm_ok = xm_costmodel_parse(text, &m) == XMESH_SUCCESS;
    for (int i = 0; cm_ok && i < m->ncoll; i++) {
        xm_cost_pred_t p;
        const xm_coll_rec_t *r = &m->coll[i];
        if (!xm_cost_collective(m, r->kind, &r->g, r->min_bytes, &p) && !isfinite(p.seconds))
            abort();
    }
    for (int i = 0; cm_ok && i < m->ngemm; i++) {
        xm_cost_pred_t p;
        if (xm_cost_gemm(m, m->gemm[i].m, m->gemm[i].n, m->gemm[i].k, &p) || !isfinite(p.seconds))
            abort();
    }
    xm_costmodel_destroy(m);
    int cl_ok = xm_cluster_parse(text, &c) == XMESH_SUCCESS;
    if (cl_ok != cm_ok)
        abort();
    if (!cl_ok) {
        if (memcmp(&c, &before, sizeof c))
            abort();
    } else if (!(c.nic_send_Bps > 0 && c.nic_recv_Bps > 0 && c.intra_Bps > 0 &&
                 c.nics_per_host >= 1 && c.latency_s >= 0 && c.chunk_bytes >= 1)) {
        abort();
    }
    xm_cluster_free(&c);
    free(text);
    return 0;
}
