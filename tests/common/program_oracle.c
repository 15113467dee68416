/* Test support of the per-rank program simulations: see program_oracle.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "program_oracle.h"

void po_world_init(const po_case_t *c, po_world_t *w)
{
    po_world_init_to(c, c->dt, w);
}

void po_world_init_to(const po_case_t *c, xmesh_dtype_t ddt, po_world_t *w)
{
    memset(w, 0, sizeof *w);
    w->ddt = ddt;
    assert_int_equal(xm_hostmap_default(c->src_shape, c->src_nd, c->dst_shape, c->dst_nd,
                                        c->overlap, &w->hosts, &w->sdevs, &w->ddevs),
                     XMESH_SUCCESS);
    xm_layout_t *src = &w->src, *dst = &w->dst;
    src->ndim = dst->ndim = c->ndim;
    src->elem_size = xmesh_dtype_size(c->dt);
    dst->elem_size = xmesh_dtype_size(ddt);
    for (int d = 0; d < c->ndim; d++)
        src->shape[d] = dst->shape[d] = c->shape[d];
    src->mesh.ndim = c->src_nd;
    dst->mesh.ndim = c->dst_nd;
    src->mesh.ndev = dst->mesh.ndev = 1;
    for (int a = 0; a < c->src_nd; a++)
        src->mesh.ndev *= src->mesh.shape[a] = c->src_shape[a];
    for (int a = 0; a < c->dst_nd; a++)
        dst->mesh.ndev *= dst->mesh.shape[a] = c->dst_shape[a];
    src->mesh.devs = w->sdevs;
    dst->mesh.devs = w->ddevs;
    if (xm_spec_parse(c->src_spec, c->ndim, c->src_nd, &src->spec) ||
        xm_spec_parse(c->dst_spec, c->ndim, c->dst_nd, &dst->spec))
        fail_msg("spec: %s", xmesh_last_error());
    if (xm_decompose(src, dst, &w->hosts, &w->ts))
        fail_msg("decompose: %s", xmesh_last_error());
}

void po_world_free(po_world_t *w)
{
    xm_taskset_free(&w->ts);
    xm_hostmap_free(&w->hosts);
    free(w->sdevs);
    free(w->ddevs);
}

xm_prog_in_t po_prog_in(const po_case_t *c, const po_world_t *w, const xm_schedule_t *s)
{
    xm_prog_in_t in = {.ts = &w->ts,
                       .sched = s,
                       .hosts = &w->hosts,
                       .src = &w->src,
                       .dst = &w->dst,
                       .strategy = c->strategy,
                       .dtype = c->dt,
                       .dst_dtype = w->ddt,
                       .chunk_bytes = c->chunk};
    return in;
}

void po_block_of(const xm_layout_t *l, int rank, po_blk_t *b)
{
    b->idx = xm_mesh_find(&l->mesh, rank);
    b->n = 0;
    if (b->idx < 0)
        return;
    xm_layout_block(l, b->idx, b->lo, b->hi);
    b->n = 1;
    for (int d = 0; d < l->ndim; d++)
        b->n *= b->hi[d] - b->lo[d];
}

int64_t po_global_index(const xm_layout_t *l, const po_blk_t *b, int64_t k)
{
    int64_t m[XM_MAX_DIMS], g = 0;
    for (int d = l->ndim - 1; d >= 0; d--) {
        int64_t e = b->hi[d] - b->lo[d];
        m[d] = b->lo[d] + k % e;
        k /= e;
    }
    for (int d = 0; d < l->ndim; d++)
        g = g * l->shape[d] + m[d];
    return g;
}

int po_partial_coord(const xm_layout_t *l, int i, int *G)
{
    int coord[XM_MAX_MESH_DIMS], p = 0, g = 1;
    xm_mesh_coord(&l->mesh, i, coord);
    for (int a = 0; a < l->mesh.ndim; a++)
        if (l->spec.partial_mask & (1u << a)) {
            p = p * l->mesh.shape[a] + coord[a];
            g *= l->mesh.shape[a];
        }
    *G = g;
    return p;
}

void po_store(xmesh_dtype_t dt, void *b, int64_t i, int64_t v)
{
    switch (dt) {
    case XMESH_U8:
    case XMESH_I8:
        ((uint8_t *)b)[i] = (uint8_t)(v & 0xff);
        break;
    case XMESH_I32:
        ((uint32_t *)b)[i] = (uint32_t)v;
        break;
    case XMESH_I64:
        ((int64_t *)b)[i] = v;
        break;
    case XMESH_F16:
        ((uint16_t *)b)[i] = xm_f32_to_f16((float)v);
        break;
    case XMESH_BF16:
        ((uint16_t *)b)[i] = xm_f32_to_bf16((float)v);
        break;
    case XMESH_F32:
        ((float *)b)[i] = (float)v;
        break;
    case XMESH_F64:
        ((double *)b)[i] = (double)v;
        break;
    default:
        fail_msg("po_store: unknown dtype %d", (int)dt);
    }
}
