/* Table 2 of the AlpaComm paper; case 6 uses (3072, 1024, 170) so that it
 * divides evenly (the paper padded (1024, 1024, 512)). */
#include "xm_cases.h"

const xm_paper_case_t xm_table2[XM_TABLE2_NCASES] = {
    {{1024, 1024, 512}, {2, 4}, {2, 4}, "S0RR", "S0RR"},
    {{1024, 1024, 512}, {2, 4}, {2, 4}, "RRR", "S0RR"},
    {{1024, 1024, 512}, {2, 4}, {2, 4}, "RS0R", "S0RR"},
    {{1024, 1024, 512}, {2, 4}, {2, 4}, "RS01R", "S01RR"},
    {{1024, 1024, 512}, {2, 4}, {2, 4}, "S1RR", "S0RR"},
    {{3072, 1024, 170}, {2, 4}, {3, 4}, "S0RR", "S0RR"},
    {{1024, 1024, 512}, {1, 4}, {2, 4}, "S1RR", "RRR"},
    {{1024, 1024, 512}, {2, 3}, {3, 2}, "RRR", "RRR"},
    {{1024, 1024, 512}, {2, 4}, {2, 4}, "RS0R", "RRS0"},
};
