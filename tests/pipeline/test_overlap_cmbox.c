/* Collective matmul, GEMM then collective (nn/overlap.h (e), xmp_linear_forward_box): on meshes
 * of 1..3 axes, Megatron's row-parallel (P -> B), column-parallel (S -> B gather), the 3-D
 * signature (P -> S over K with a shared split) and the add-target form (like): every element
 * of y against a serial reference (x w^T + b from the full arrays), coll-matmul on against off
 * bitwise, the GEMM's SBP (was) equal, and with coll-matmul on the box really ran in pieces
 * (more collective calls than off, where the plain path has any). Usage: test_overlap_cmbox
 * [--seed S] [--break] (--break flips the sign of one element of the on-result: must fail). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/overlap.h"
#include "nn/sbp_ops.h"
#include "test_report.h"

static int g_break;
static uint64_t g_seed = 7;

static float rnd(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}

static int64_t calls(void)
{
    xmp_comm_counts_t c;
    xmp_comm_counts(&c);
    int64_t n = 0;
    for (int k = 0; k < XMP_COLL_NKINDS; k++)
        n += c.calls[k];
    return n;
}

static void run(xmp_mesh_t *m, const char *xs, const char *ws, const char *bs, const char *ds,
                const char *likes)
{
    enum { B = 4, T = 8, C = 8, N = 12 };
    char what[256];
    snprintf(what, sizeof what, "mesh %d axes: x %s w %s b %s -> %s%s", m->ndim, xs, ws, bs,
             ds ? ds : "like ", likes ? likes : "");
    xmp_sbp_t sx[4], sw[4], sb[4], sd[4], sl[4];
    if (xmp_sbp_parse(xs, m->ndim, 3, sx) || xmp_sbp_parse(ws, m->ndim, 2, sw) ||
        xmp_sbp_parse(bs, m->ndim, 1, sb) || (ds && xmp_sbp_parse(ds, m->ndim, 3, sd)) ||
        (likes && xmp_sbp_parse(likes, m->ndim, 3, sl))) {
        EXPECT(0, "%s: parse: %s", what, xmp_last_error());
        return;
    }
    int64_t shx[3] = {B, T, C}, shw[2] = {N, C}, shb[1] = {N}, shy[3] = {B, T, N};
    float *fx = malloc(sizeof(float) * B * T * C), *fw = malloc(sizeof(float) * N * C),
          *fb = malloc(sizeof(float) * N), *ref = malloc(sizeof(float) * B * T * N),
          *got = malloc(sizeof(float) * B * T * N);
    uint64_t s = g_seed;
    for (int i = 0; i < B * T * C; i++)
        fx[i] = rnd(&s);
    for (int i = 0; i < N * C; i++)
        fw[i] = rnd(&s);
    for (int i = 0; i < N; i++)
        fb[i] = rnd(&s);
    for (int r = 0; r < B * T; r++)
        for (int n = 0; n < N; n++) {
            double a = fb[n];
            for (int k = 0; k < C; k++)
                a += (double)fx[r * C + k] * fw[n * C + k];
            ref[r * N + n] = (float)a;
        }
    xmp_tensor_t x, w, b, like = {0}, y[2];
    xmp_sbp_t was[2][XMP_MAX_MESH_DIMS];
    xmp_tensor_alloc(&x, m, 3, shx, XMESH_F32, sx);
    xmp_tensor_alloc(&w, m, 2, shw, XMESH_F32, sw);
    xmp_tensor_alloc(&b, m, 1, shb, XMESH_F32, sb);
    xmp_tensor_fill_from_full(&x, fx);
    xmp_tensor_fill_from_full(&w, fw);
    xmp_tensor_fill_from_full(&b, fb);
    if (likes)
        xmp_tensor_alloc(&like, m, 3, shy, XMESH_F32, sl);
    int64_t nc[2];
    for (int on = 0; on < 2; on++) {
        xmp_overlap_t ov = {0};
        ov.coll_matmul = on;
        int64_t c0 = calls();
        xmesh_result_t r = xmp_linear_forward_box(&ov, &x, &w, &b, ds ? sd : NULL,
                                                  likes ? &like : NULL, was[on], &y[on]);
        nc[on] = calls() - c0;
        if (r) {
            EXPECT(0, "%s: coll-matmul %d: %s", what, on, xmp_last_error());
            goto out;
        }
        if (on && g_break && g_rank == 0 && y[on].lcount)
            xmp_f32(&y[on])[0] = -xmp_f32(&y[on])[0];
        xmp_tensor_gather_full(&y[on], got);
        int bad = 0;
        for (int i = 0; i < B * T * N && bad < 3; i++)
            if (fabsf(got[i] - ref[i]) > 1e-5f * (1 + fabsf(ref[i]))) {
                EXPECT(0, "%s: coll-matmul %d: element %d: %g, serial %g", what, on, i, got[i],
                       ref[i]);
                bad++;
            }
    }
    EXPECT(y[0].lcount == y[1].lcount &&
               !memcmp(y[0].data, y[1].data, sizeof(float) * (size_t)y[0].lcount),
           "%s: coll-matmul on differs from off (bitwise)", what);
    for (int a = 0; a < m->ndim; a++)
        EXPECT(xmp_sbp_eq(was[0][a], was[1][a]) && xmp_sbp_eq(y[0].sbp[a], y[1].sbp[a]),
               "%s: axis %d: SBPs differ between on and off", what, a);
    EXPECT(nc[0] == 0 || nc[1] > nc[0], "%s: %lld calls on, %lld off: not in pieces", what,
           (long long)nc[1], (long long)nc[0]);
    if (g_rank == 0)
        printf("  %s: ok (collective calls off %lld, on %lld)\n", what, (long long)nc[0],
               (long long)nc[1]);
    xmp_tensor_free(&y[0]);
    xmp_tensor_free(&y[1]);
out:
    xmp_tensor_free(&x);
    xmp_tensor_free(&w);
    xmp_tensor_free(&b);
    xmp_tensor_free(&like);
    free(fx);
    free(fw);
    free(fb);
    free(ref);
    free(got);
}

int main(int argc, char **argv)
{
    int prov, size;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &prov);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seed") && i + 1 < argc)
            g_seed = strtoull(argv[i + 1], NULL, 0);
        if (!strcmp(argv[i], "--break"))
            g_break = 1;
    }
    if (g_rank == 0)
        printf("test_overlap_cmbox: %d ranks, seed %llu\n", size, (unsigned long long)g_seed);
    int ranks[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    xmp_mesh_t *m = NULL;
    if (size == 4) {
        int s22[2] = {2, 2}, s4 = 4;
        xmp_mesh_create(MPI_COMM_WORLD, NULL, 2, s22, ranks, &m);
        run(m, "S(0),S(2)", "B,S(1)", "B,B", "S(0),B", NULL); /* row-parallel */
        run(m, "S(0),B", "B,S(0)", "B,S(0)", "S(0),B", NULL); /* column + gather */
        run(m, "S(0),S(2)", "B,S(1)", "B,B", NULL, "S(0),B"); /* add target */
        run(m, "S(1),S(2)", "B,S(1)", "B,B", "S(1),B", NULL); /* pieces along T */
        xmp_mesh_destroy(m);
        xmp_mesh_create(MPI_COMM_WORLD, NULL, 1, &s4, ranks, &m);
        run(m, "S(2)", "S(1)", "B", "B", NULL); /* 4-rank all-reduce */
        xmp_mesh_destroy(m);
    } else if (size == 8) {
        int s222[3] = {2, 2, 2};
        xmp_mesh_create(MPI_COMM_WORLD, NULL, 3, s222, ranks, &m);
        run(m, "S(0),B,S(2)", "B,S(0),S(1)", "B,S(0),B", "S(0),S(2),S(2)", NULL); /* 3-D */
        run(m, "S(0),B,S(2)", "B,S(0),S(1)", "B,S(0),B", NULL, "S(0),S(2),S(2)");
        xmp_mesh_destroy(m);
    }
    int fails = 0;
    MPI_Allreduce(&g_fail, &fails, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (g_rank == 0)
        printf("test_overlap_cmbox: %s (%d failures)\n", fails ? "FAILED" : "ok", fails);
    MPI_Finalize();
    return fails ? 1 : 0;
}
