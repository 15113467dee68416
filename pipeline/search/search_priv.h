/* Private to pipeline/search: helpers shared by search.c and search_ut.c. */
#ifndef XMP_SEARCH_SEARCH_PRIV_H
#define XMP_SEARCH_SEARCH_PRIV_H

#include <stddef.h>
#include <stdint.h>

#include "xm_sched.h"

/* Predicted seconds of moving a tensor (nd, dims; f32) from a mesh (nda, sha) on ranks ra..
 * with spec sa to a mesh (ndb, shb) on ranks rb.. with spec sb, on nranks ranks placed in order
 * on `hosts` hosts: xmesh's decomposer, the greedy scheduler (max_evals, 0: 2000) and its
 * simulated makespan with the rates of cluster (NULL: defaults). 0, or -1 with err. */
int xmp_search__plan_seconds(int nranks, int hosts, const xm_cluster_t *cluster, int max_evals,
                             int nd, const int64_t *dims, int nda, const int *sha, int ra,
                             const char *sa, int ndb, const int *shb, int rb, const char *sb,
                             double *out, char *err, size_t errlen);

#endif
