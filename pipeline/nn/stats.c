/* The thread-local counters of nn/sbp.h: communication seconds, collectives by kind, live and
 * peak tensor memory. Apart from sbp.c so that the collectives (coll.c) count into them without
 * depending on the tensors. */
#include <stdint.h>
#include <string.h>

#include "nn/sbp.h"

static _Thread_local double xmp_comm_s;

double xmp_comm_seconds(void)
{
    return xmp_comm_s;
}

void xmp_comm_seconds_add(double s)
{
    xmp_comm_s += s;
}

static _Thread_local xmp_comm_counts_t xmp_counts;

double xmp_comm_bytes(void)
{
    double t = 0;
    for (int k = 0; k < XMP_COLL_NKINDS; k++)
        t += xmp_counts.bytes[k];
    return t;
}

void xmp_comm_counts(xmp_comm_counts_t *out)
{
    if (out)
        *out = xmp_counts;
}

void xmp_comm_counts_reset(void)
{
    memset(&xmp_counts, 0, sizeof xmp_counts);
}

const char *xmp_coll_kind_name(int kind)
{
    static const char *const names[XMP_COLL_NKINDS] = {"allreduce", "allgather", "reduce_scatter",
                                                       "alltoall"};
    return kind >= 0 && kind < XMP_COLL_NKINDS ? names[kind] : NULL;
}

/* Adds one completed collective of kind on p ranks: payload raw bytes, bytes ring-equivalent. */
static void count_coll(int kind, int p, int64_t payload, double bytes)
{
    xmp_counts.calls[kind]++;
    xmp_counts.payload[kind] += payload;
    xmp_counts.bytes[kind] += p > 1 ? bytes : 0;
}

void xmp_comm_count_add(int kind, int p, int64_t payload, double bytes)
{
    if (kind >= 0 && kind < XMP_COLL_NKINDS)
        count_coll(kind, p, payload, bytes);
}

static _Thread_local int64_t xmp_mem_live, xmp_mem_peak;

int64_t xmp_mem_live_bytes(void)
{
    return xmp_mem_live;
}

int64_t xmp_mem_peak_bytes(void)
{
    return xmp_mem_peak;
}

void xmp_mem_peak_reset(void)
{
    xmp_mem_peak = xmp_mem_live;
}

void xmp_mem_track(int64_t delta)
{
    xmp_mem_live += delta;
    if (xmp_mem_live > xmp_mem_peak)
        xmp_mem_peak = xmp_mem_live;
}
