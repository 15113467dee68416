/* The nn/ byte counter (xmp_comm_counts, docs/BOXING_BYTES.md): exact counts of known boxes
 * P->B, S->B, P->S, S(i)->S(j) on a 1-axis mesh of every rank (2 or 4 ranks, uneven splits
 * on 4), and P,P->B,B on a 2x2 mesh (4 ranks); every boxed value is also checked element by
 * element against the full tensor. Exit 0 only when everything matched. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/sbp.h"

static int g_fail, g_rank;
#define FAIL(...)                                                                                  \
    do {                                                                                           \
        fprintf(stderr, "rank %d: FAIL %s:%d: ", g_rank, __FILE__, __LINE__);                      \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fprintf(stderr, "\n");                                                                     \
        g_fail = 1;                                                                                \
    } while (0)

enum { R = 6, C = 10 };

/* piece i of n split by numpy.array_split into k pieces */
static int piece(int n, int k, int i)
{
    return n / k + (i < n % k);
}

static void expect(const char *name, const xmp_comm_counts_t *a, const xmp_comm_counts_t *b,
                   int kind, int64_t calls, int64_t payload, double bytes)
{
    for (int k = 0; k < XMP_COLL_NKINDS; k++) {
        int64_t dc = b->calls[k] - a->calls[k], dp = b->payload[k] - a->payload[k];
        double db = b->bytes[k] - a->bytes[k];
        int64_t ec = k == kind ? calls : 0, ep = k == kind ? payload : 0;
        double eb = k == kind ? bytes : 0;
        if (dc != ec || dp != ep || fabs(db - eb) > 1e-9)
            FAIL("%s: %s: calls %lld payload %lld bytes %.3f, expected %lld %lld %.3f", name,
                 xmp_coll_kind_name(k), (long long)dc, (long long)dp, db, (long long)ec,
                 (long long)ep, eb);
    }
}

/* Boxes a (R, C) tensor src -> dst on m, checks the value and the counts. */
static void box_case(xmp_mesh_t *m, const char *name, const xmp_sbp_t *src, const xmp_sbp_t *dst,
                     int kind, int64_t calls, int64_t payload, double bytes)
{
    float full[R * C], got[R * C];
    for (int i = 0; i < R * C; i++)
        full[i] = (float)(i * 3 + 1);
    int64_t shape[2] = {R, C};
    xmp_tensor_t x, y;
    memset(&y, 0, sizeof y);
    if (xmp_tensor_alloc(&x, m, 2, shape, XMESH_F32, src) || xmp_tensor_fill_from_full(&x, full)) {
        FAIL("%s: alloc/fill: %s", name, xmp_last_error());
        return;
    }
    xmp_comm_counts_t a, b;
    xmp_comm_counts(&a);
    double t0 = xmp_comm_bytes();
    if (xmp_box(&x, dst, &y)) {
        FAIL("%s: box: %s", name, xmp_last_error());
        xmp_tensor_free(&x);
        return;
    }
    xmp_comm_counts(&b);
    double t1 = xmp_comm_bytes();
    expect(name, &a, &b, kind, calls, payload, bytes);
    if (fabs((t1 - t0) - bytes) > 1e-9)
        FAIL("%s: xmp_comm_bytes grew by %.3f, expected %.3f", name, t1 - t0, bytes);
    if (xmp_tensor_gather_full(&y, got))
        FAIL("%s: gather: %s", name, xmp_last_error());
    else
        for (int i = 0; i < R * C; i++)
            if (got[i] != full[i]) {
                FAIL("%s: element %d is %g, expected %g", name, i, got[i], full[i]);
                break;
            }
    xmp_tensor_free(&x);
    xmp_tensor_free(&y);
}

int main(int argc, char **argv)
{
    int provided, n;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    int *ranks = malloc(sizeof(int) * (size_t)n);
    for (int i = 0; i < n; i++)
        ranks[i] = i;
    xmp_mesh_t *m = NULL;
    if (xmp_mesh_create(MPI_COMM_WORLD, NULL, 1, &n, ranks, &m)) {
        FAIL("mesh: %s", xmp_last_error());
        goto done;
    }
    {
        const double p = n, full = (double)R * C * 4;
        const int me = g_rank;
        xmp_sbp_t P = xmp_sbp_p(), B = xmp_sbp_b(), S0 = xmp_sbp_s(0), S1 = xmp_sbp_s(1);
        box_case(m, "P->B", &P, &B, XMP_COLL_ALLREDUCE, 1, (int64_t)full, 2 * (p - 1) / p * full);
        box_case(m, "S(0)->B", &S0, &B, XMP_COLL_ALLGATHER, 1, (int64_t)piece(R, n, me) * C * 4,
                 (p - 1) / p * full);
        box_case(m, "S(1)->B", &S1, &B, XMP_COLL_ALLGATHER, 1, (int64_t)R * piece(C, n, me) * 4,
                 (p - 1) / p * full);
        box_case(m, "P->S(0)", &P, &S0, XMP_COLL_REDUCE_SCATTER, 1, (int64_t)full,
                 (p - 1) / p * full);
        /* S(0)->S(1): my rows x the other ranks' columns leave this rank */
        int64_t off = (int64_t)piece(R, n, me) * (C - piece(C, n, me)) * 4;
        box_case(m, "S(0)->S(1)", &S0, &S1, XMP_COLL_ALLTOALL, 1, off, (double)off);
        box_case(m, "B->S(1)", &B, &S1, XMP_COLL_ALLREDUCE, 0, 0, 0); /* local slice */
    }
    xmp_mesh_destroy(m);
    m = NULL;
    if (n == 4) { /* 2x2: P,P -> B,B is one all-reduce per axis, each on 2 ranks */
        int sh[2] = {2, 2};
        if (xmp_mesh_create(MPI_COMM_WORLD, NULL, 2, sh, ranks, &m)) {
            FAIL("mesh 2x2: %s", xmp_last_error());
            goto done;
        }
        const double full = (double)R * C * 4;
        xmp_sbp_t PP[2] = {xmp_sbp_p(), xmp_sbp_p()}, BB[2] = {xmp_sbp_b(), xmp_sbp_b()};
        box_case(m, "2x2 P,P->B,B", PP, BB, XMP_COLL_ALLREDUCE, 2, (int64_t)(2 * full),
                 2 * (2 * 0.5 * full));
        /* S(0),S(1) -> B,B: two all-gathers, the first (axis 1, pass order ascending) of my
         * column piece into a row block, the second of the row block into the whole */
        xmp_sbp_t SS[2] = {xmp_sbp_s(0), xmp_sbp_s(1)};
        box_case(m, "2x2 S(0),S(1)->B,B", SS, BB, XMP_COLL_ALLGATHER, 2,
                 (int64_t)(R / 2 * C / 2 * 4 + R / 2 * C * 4), 0.5 * (R / 2 * C * 4) + 0.5 * full);
        xmp_mesh_destroy(m);
        m = NULL;
    }
done:
    free(ranks);
    int any = 0;
    MPI_Allreduce(&g_fail, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (g_rank == 0)
        printf("test_comm_bytes on %d ranks: %s\n", n, any ? "FAILED" : "ok");
    MPI_Finalize();
    return any ? 1 : 0;
}
