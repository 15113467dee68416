/* The paper's Table 2 benchmark cases (docs/BENCH_CASES.md), shared by
 * xmesh-plan, the scheduler benchmark and the tests. */
#ifndef XM_CASES_H
#define XM_CASES_H

#include <stdint.h>

typedef struct xm_paper_case {
    int64_t shape[3];    /* int32 tensor */
    int src[2], dst[2];  /* meshes (hosts, devices per host) */
    const char *ss, *ds; /* GSPMD specs */
} xm_paper_case_t;

#define XM_TABLE2_NCASES 9
extern const xm_paper_case_t xm_table2[XM_TABLE2_NCASES];

#endif
