/*
 * xmesh-plan's parts (private to tools/xmesh-plan*.c): the options and what the files share.
 * xmesh-plan.c: options, planning, output and main; plan_common.c: argument parsers, scheduler
 * options, clocks, sizes; plan_many.c: --many (one plan of many tensors).
 */
#ifndef XMESH_TOOLS_PLAN_H
#define XMESH_TOOLS_PLAN_H

#include <stdint.h>
#include <time.h>

#include "xm_api.h"
#include "xm_sched.h"

#define ALL_SCHEDULERS (-2)

typedef struct {
    int ndim;
    int64_t shape[XM_MAX_DIMS];
    const char *dtype;
    int src_ndim, src_shape[XM_MAX_MESH_DIMS];
    int dst_ndim, dst_shape[XM_MAX_MESH_DIMS];
    const char *src_spec, *dst_spec;
} problem_t;

typedef struct {
    problem_t pb;
    int have_shape, have_src_mesh, have_dst_mesh, have_src_spec, have_dst_spec, have_dtype;
    int overlap, json, all_cases, case_no, split, suggest;
    int scheduler; /* xmesh_scheduler_t or ALL_SCHEDULERS */
    xmesh_strategy_t strategy;
    double nic_gbps, nic_recv_gbps, intra_gbps, latency_us;
    int nics_per_host;
    const char *cluster_file; /* --cluster or XMESH_CLUSTER_FILE, "" if none */
    int64_t chunk_bytes, max_evals, max_tasks;
    double budget_ms;
    uint64_t seed;
    const char *trace;
    const char *many; /* --many FILE */
} opts_t;

/* plan_common.c */
/* Prints "xmesh-plan: <message> (see --help)" on stderr; returns 2 (bad arguments). */
int xpl_bad(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int xpl_parse_mesh(const char *flag, const char *s, int *ndim, int *shape);
int xpl_parse_shape(const char *s, int *ndim, int64_t *shape);
xm_sched_opts_t xpl_sched_opts(const opts_t *o, xmesh_scheduler_t kind);
double xpl_now_ms(clockid_t clk);
const char *xpl_human_bytes(double b, char *buf, size_t n);

/* plan_many.c */
int xpl_many_run(const opts_t *o);

#endif /* XMESH_TOOLS_PLAN_H */
