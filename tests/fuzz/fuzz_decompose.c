/* Fuzzes the decomposer: the input picks meshes, shape and specs. Either a
 * clear error comes back or the invariants hold: task boxes are non-empty,
 * disjoint and tile the tensor, and every holder's block contains its box.
 * A shape byte >= 192 picks a huge dim (INT64_MAX >> (byte - 192)), so the
 * fuzzer reaches shapes whose byte size overflows 64 bits (zero dims
 * counted as 1): those must be refused with INVALID_ARGUMENT naming the
 * shape. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xm_core.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int take(const uint8_t **p, const uint8_t *end, int mod)
{
    if (*p >= end)
        return 0;
    return *(*p)++ % mod;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *p = data, *end = data + size;
    xm_layout_t l[2];
    int devs[2][81]; /* up to 4 mesh axes of 3 */
    memset(l, 0, sizeof l);
    int nd = take(&p, end, 5);
    int64_t shape[XM_MAX_DIMS];
    for (int d = 0; d < nd; d++) {
        int v = take(&p, end, 256);
        shape[d] = v < 192 ? v % 12 : INT64_MAX >> (v - 192);
    }
    int64_t want_bytes = 2, zero = 0, over = 0; /* elem_size 2, computed here on its own */
    for (int d = 0; d < nd; d++) {
        zero |= shape[d] == 0;
        over |= __builtin_mul_overflow(want_bytes, shape[d] ? shape[d] : 1, &want_bytes);
    }
    for (int side = 0; side < 2; side++) {
        xm_layout_t *x = &l[side];
        x->ndim = nd;
        x->elem_size = 2;
        for (int d = 0; d < nd; d++)
            x->shape[d] = shape[d];
        x->mesh.ndim = 1 + take(&p, end, 4);
        x->mesh.ndev = 1;
        for (int a = 0; a < x->mesh.ndim; a++) {
            x->mesh.shape[a] = 1 + take(&p, end, 3);
            x->mesh.ndev *= x->mesh.shape[a];
        }
        for (int i = 0; i < x->mesh.ndev; i++)
            devs[side][i] = side * 81 + i;
        x->mesh.devs = devs[side];
        char spec[64];
        int n = 0;
        for (int a = 0; a < x->mesh.ndim; a++) {
            int what = take(&p, end, 3 + (side == 0));
            if (a)
                spec[n++] = ',';
            if (what == 1)
                n += snprintf(spec + n, sizeof spec - n, "S(%d)", take(&p, end, 6));
            else if (what == 3)
                spec[n++] = 'P';
            else
                spec[n++] = 'B';
        }
        spec[n] = '\0';
        if (xm_spec_parse(spec, nd, x->mesh.ndim, &x->spec))
            return 0; /* a clear error: fine */
    }
    xm_taskset_t ts;
    xmesh_result_t r = xm_decompose(&l[0], &l[1], NULL, &ts);
    if (over) {
        /* too large: refused, naming the shape */
        if (r != XMESH_ERR_INVALID_ARGUMENT || !strstr(xmesh_last_error(), "exceeds 64 bits"))
            abort();
        return 0;
    }
    if (r)
        return 0;
    if (ts.bytes_total != (zero ? 0 : want_bytes))
        abort();
    int64_t total = 1, sum = 0;
    for (int d = 0; d < nd && !zero; d++)
        total *= shape[d]; /* fits: want_bytes did */
    if (zero)
        total = 0;
    for (int t = 0; t < ts.ntasks; t++) {
        const xm_task_t *k = &ts.tasks[t];
        int64_t v = xm_box_volume(&k->box, nd);
        if (v <= 0 || k->nrecv <= 0 || k->ngroups * k->group_size <= 0)
            abort();
        sum += v;
        for (int h = 0; h < k->ngroups * k->group_size; h++) {
            int64_t lo[XM_MAX_DIMS], hi[XM_MAX_DIMS];
            xm_layout_block(&l[0], ts.holders[k->holder_off + h], lo, hi);
            for (int d = 0; d < nd; d++)
                if (k->box.lo[d] < lo[d] || k->box.hi[d] > hi[d])
                    abort();
        }
        for (int u = 0; u < t; u++) { /* disjoint */
            int overlap = 1;
            for (int d = 0; d < nd && overlap; d++)
                overlap =
                    k->box.lo[d] < ts.tasks[u].box.hi[d] && ts.tasks[u].box.lo[d] < k->box.hi[d];
            if (overlap)
                abort();
        }
    }
    if (sum != total)
        abort();
    xm_taskset_free(&ts);
    return 0;
}
