/* xmesh-calibrate: what its parts share (calibrate.h): the class names, medians, rates. */
#include <math.h>
#include <stdlib.h>

#include "calibrate.h"

const char *const xmc_cname[NCLASS] = {"p2p-intra", "p2p-inter", "chain", "allgather",
                                       "allgather-intra"};
const char *const xmc_chelp[NCLASS] = {
    "ping-pong, two ranks of one host (one way)", "ping-pong, hosts 0 and 1 (one way)",
    "xmesh broadcast chain, one rank -> one per other host",
    "MPI_Allgather, first rank of every host", "MPI_Allgather, ranks of host 0"};

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double xmc_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double xmc_gbps(const klass_t *k)
{
    return k->fit_ok && k->fit.beta > 0 ? 8 / k->fit.beta / 1e9 : NAN;
}

double xmc_flops(const shape_t *s)
{
    return 2.0 * (double)s->m * (double)s->n * (double)s->k;
}
