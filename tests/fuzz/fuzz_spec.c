/* Fuzzes the sharding-spec parser: byte 0 picks the tensor ndim, byte 1 the
 * mesh ndim, the rest is the string. A parsed spec must print and parse back
 * to itself in both notations; a rejected one must leave its output alone. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "xm_core.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2 || size > 256)
        return 0;
    int ndim = data[0] % (XM_MAX_DIMS + 2) - 1;       /* -1 .. 8 */
    int mesh_ndim = data[1] % (XM_MAX_MESH_DIMS + 2); /* 0 .. 5 */
    char s[256];
    memcpy(s, data + 2, size - 2);
    s[size - 2] = '\0';
    xm_spec_t sp, back, guard;
    memset(&sp, 0xa5, sizeof sp);
    guard = sp;
    if (xm_spec_parse(s, ndim, mesh_ndim, &sp)) {
        if (memcmp(&sp, &guard, sizeof sp))
            abort(); /* output changed on error */
        return 0;
    }
    char buf[128];
    if (xm_spec_format_sbp(&sp, buf, sizeof buf) >= 0) {
        if (xm_spec_parse(buf, ndim, mesh_ndim, &back) || !xm_spec_equal(&sp, &back))
            abort();
    }
    if (!sp.partial_mask) {
        xm_spec_format_gspmd(&sp, buf, sizeof buf);
        if (xm_spec_parse(buf, ndim, mesh_ndim, &back) || !xm_spec_equal(&sp, &back))
            abort();
    }
    return 0;
}
