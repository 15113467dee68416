/* Fuzzes the cluster-file parser: any text either applies cleanly (and the
 * model stays valid: positive bandwidths, >= 1 NIC) or is rejected with the
 * cluster left exactly as it was. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "xm_cluster_file.h"

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
    if (xm_cluster_parse(text, &c)) {
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
