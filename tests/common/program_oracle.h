/*
 * Test support shared by the CPU simulations of the per-rank program
 * (tests/unit/test_program.c, tests/gpu/test_devplan.c): a resharding case,
 * the layouts, host map and task set it stands for, each rank's block, the
 * global row-major index of a local element (from which each test computes
 * the value the element must hold) and storing a small integer in any
 * dtype. The value functions, the simulators and the checks stay in the
 * tests themselves.
 */
#ifndef XMESH_TESTS_PROGRAM_ORACLE_H
#define XMESH_TESTS_PROGRAM_ORACLE_H

#include <stdint.h>

#include "xm_program.h"

/* One resharding: a tensor, its source and destination meshes and specs. */
typedef struct {
    int ndim;
    int64_t shape[XM_MAX_DIMS];
    xmesh_dtype_t dt;
    int src_nd, src_shape[XM_MAX_MESH_DIMS];
    const char *src_spec;
    int dst_nd, dst_shape[XM_MAX_MESH_DIMS];
    const char *dst_spec;
    int overlap;
    int64_t chunk;
    xmesh_strategy_t strategy;
} po_case_t;

/* What a case stands for: default host map, both layouts, the task set. */
typedef struct {
    xm_hostmap_t hosts;
    int *sdevs, *ddevs;
    xm_layout_t src, dst;
    xm_taskset_t ts;
    xmesh_dtype_t ddt; /* the destination's dtype: c->dt unless converting */
} po_world_t;

/* Builds w from c; a cmocka failure on any error. */
void po_world_init(const po_case_t *c, po_world_t *w);
/* The same for a converting plan: the destination holds ddt. */
void po_world_init_to(const po_case_t *c, xmesh_dtype_t ddt, po_world_t *w);
void po_world_free(po_world_t *w);

/* The program compiler's input for case c on w with schedule s (the
 * destination dtype is w->ddt). */
xm_prog_in_t po_prog_in(const po_case_t *c, const po_world_t *w, const xm_schedule_t *s);

/* The block of a rank in a layout: bounds, element count, mesh index
 * (idx < 0 and n == 0 when the rank is not on the mesh). */
typedef struct {
    int64_t lo[XM_MAX_DIMS], hi[XM_MAX_DIMS], n;
    int idx;
} po_blk_t;

void po_block_of(const xm_layout_t *l, int rank, po_blk_t *b);

/* Global row-major index of local element k of block b. */
int64_t po_global_index(const xm_layout_t *l, const po_blk_t *b, int64_t k);

/* Partial-sum group of mesh index i (row-major over the P axes); *G is
 * the number of groups. */
int po_partial_coord(const xm_layout_t *l, int i, int *G);

/* Stores small integer v as element i of a dtype array (integer types
 * wrap; a cmocka failure on an unknown dtype). */
void po_store(xmesh_dtype_t dt, void *b, int64_t i, int64_t v);

#endif
