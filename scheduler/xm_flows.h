/*
 * Flows (scheduler/flows.c): unit tasks with the same holder and receiver
 * NIC sets grouped into one planning task, so searches scale with the
 * host-level problem rather than with the unit-task count.
 */
#ifndef XM_FLOWS_H
#define XM_FLOWS_H

#include "xm_sched_impl.h"

typedef struct xm_flows {
    int nflows;
    /* One task per flow: holders and receivers of its first member (the
     * arrays are the unit task set's, shared), bytes summed over members. */
    xm_taskset_t ts;
    int *member_off; /* nflows + 1 */
    int *members;    /* unit task ids, each flow's in ascending order */
} xm_flows_t;

/* Groups p's tasks into flows (see flows.c). Linear in the size of the task
 * set plus a sort of each task's NIC lists. On error *out is untouched. */
xmesh_result_t xm_flows_build(const xm_prep_t *p, xm_flows_t *out);
void xm_flows_free(xm_flows_t *f);

/* A flow plan (forder: permutation of flows; fhosts: option host per flow)
 * as a unit-task plan: order[ntasks] lists every flow's members back to
 * back, hosts[t] = the flow's host. */
void xm_flows_expand(const xm_flows_t *f, const int *forder, const int *fhosts, int *order,
                     int *hosts);

#endif /* XM_FLOWS_H */
