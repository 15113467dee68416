/* Allocation accounting (nn/sbp.h, contract D), one process: live and peak bytes follow every
 * xmp_tensor_alloc / free exactly, moved tensors (data handed to the caller) are not counted
 * twice, layer calls return to the same live count once their outputs are freed, a linear
 * forward and a GELU backward whose operands need no boxing allocate only their output, peak reset,
 * xmp_mem_track for other buffers, non-members count nothing, and the counters are per
 * thread. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "nn/sbp_layers.h"
#include "nn/sbp_ops.h"

static int g_fail;

#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            g_fail++;                                                                              \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                   \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
        }                                                                                          \
    } while (0)

static xmp_mesh_t *g_mesh;

static void *other_thread(void *arg)
{
    int64_t *seen = arg;
    xmp_sbp_t b = xmp_sbp_b();
    int64_t s[1] = {1000};
    xmp_tensor_t t;
    seen[0] = xmp_mem_live_bytes();
    xmp_tensor_alloc(&t, g_mesh, 1, s, XMESH_F32, &b);
    seen[1] = xmp_mem_live_bytes();
    xmp_tensor_free(&t);
    seen[2] = xmp_mem_live_bytes();
    return NULL;
}

int main(int argc, char **argv)
{
    int provided, zero = 0, one = 1;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    xmp_mesh_t *m = NULL, *other = NULL;
    if (xmp_mesh_create(MPI_COMM_SELF, NULL, 1, &one, &zero, &m)) {
        fprintf(stderr, "mesh: %s\n", xmp_last_error());
        return 1;
    }
    g_mesh = m;
    EXPECT(xmp_mem_live_bytes() == 0 && xmp_mem_peak_bytes() == 0, "start: live %lld peak %lld",
           (long long)xmp_mem_live_bytes(), (long long)xmp_mem_peak_bytes());
    xmp_sbp_t b[4] = {xmp_sbp_b(), xmp_sbp_b(), xmp_sbp_b(), xmp_sbp_b()};
    int64_t s1[2] = {3, 5}, s2[1] = {7}, s0[1] = {0};
    xmp_tensor_t a, c, e;
    xmp_tensor_alloc(&a, m, 2, s1, XMESH_F32, b);
    EXPECT(xmp_mem_live_bytes() == 60, "after 3x5 f32: live %lld", (long long)xmp_mem_live_bytes());
    xmp_tensor_alloc(&c, m, 1, s2, XMESH_I32, b);
    EXPECT(xmp_mem_live_bytes() == 88 && xmp_mem_peak_bytes() == 88, "after +7 i32: %lld / %lld",
           (long long)xmp_mem_live_bytes(), (long long)xmp_mem_peak_bytes());
    xmp_tensor_alloc(&e, m, 1, s0, XMESH_F32, b); /* empty block: one element allocated */
    EXPECT(xmp_mem_live_bytes() == 92, "after empty: %lld", (long long)xmp_mem_live_bytes());
    xmp_tensor_free(&a);
    xmp_tensor_free(&a); /* second free of a freed tensor: no change */
    EXPECT(xmp_mem_live_bytes() == 32 && xmp_mem_peak_bytes() == 92, "after free: %lld / %lld",
           (long long)xmp_mem_live_bytes(), (long long)xmp_mem_peak_bytes());
    xmp_mem_peak_reset();
    EXPECT(xmp_mem_peak_bytes() == 32, "peak after reset %lld", (long long)xmp_mem_peak_bytes());
    xmp_mem_track(1000);
    xmp_mem_track(-1000);
    EXPECT(xmp_mem_live_bytes() == 32 && xmp_mem_peak_bytes() == 1032, "track: %lld / %lld",
           (long long)xmp_mem_live_bytes(), (long long)xmp_mem_peak_bytes());
    xmp_tensor_free(&c);
    xmp_tensor_free(&e);
    EXPECT(xmp_mem_live_bytes() == 0, "all freed: live %lld", (long long)xmp_mem_live_bytes());

    /* moved outputs: layer norm forward + backward; live while held = outputs + cache */
    int64_t xs[2] = {4, 6}, ws[1] = {6};
    xmp_tensor_t x, w, bb, y, dx, dw, db;
    xmp_norm_cache_t cache;
    xmp_tensor_alloc(&x, m, 2, xs, XMESH_F32, b);
    xmp_tensor_alloc(&w, m, 1, ws, XMESH_F32, b);
    xmp_tensor_alloc(&bb, m, 1, ws, XMESH_F32, b);
    for (int i = 0; i < 24; i++)
        xmp_f32(&x)[i] = (float)(i % 5);
    for (int i = 0; i < 6; i++)
        xmp_f32(&w)[i] = 1.0f;
    int64_t base = xmp_mem_live_bytes();
    xmp_mem_peak_reset();
    if (xmp_layernorm_forward(&x, &w, &bb, &y, &cache))
        EXPECT(0, "layernorm forward: %s", xmp_last_error());
    EXPECT(xmp_mem_live_bytes() == base + 96 + 16 + 16, "y + mean + rstd held: %lld over base",
           (long long)(xmp_mem_live_bytes() - base));
    EXPECT(xmp_mem_peak_bytes() >= xmp_mem_live_bytes() + 96, "peak %lld counts the boxed copies",
           (long long)(xmp_mem_peak_bytes() - base));
    if (xmp_layernorm_backward(&y, &x, &w, &cache, &dx, &dw, &db))
        EXPECT(0, "layernorm backward: %s", xmp_last_error());
    EXPECT(xmp_mem_live_bytes() == base + 128 + 96 + 24 + 24, "+ dx dw db: %lld",
           (long long)(xmp_mem_live_bytes() - base));
    xmp_tensor_free(&y);
    xmp_tensor_free(&dx);
    xmp_tensor_free(&dw);
    xmp_tensor_free(&db);
    xmp_norm_cache_free(&cache);
    EXPECT(xmp_mem_live_bytes() == base, "outputs freed: %lld over base",
           (long long)(xmp_mem_live_bytes() - base));
    /* operands already in the SBP a product or an element-wise backward needs are read in
     * place: a linear forward (x, w replicated) and a GELU backward (dy, x replicated) peak at
     * exactly their output, and the output's values are right */
    int64_t lw[2] = {3, 6};
    xmp_tensor_t wl, yl, dg;
    xmp_tensor_alloc(&wl, m, 2, lw, XMESH_F32, b);
    for (int i = 0; i < 18; i++)
        xmp_f32(&wl)[i] = (float)(i % 4) - 1.0f;
    base = xmp_mem_live_bytes();
    xmp_mem_peak_reset();
    if (xmp_linear_forward(&x, &wl, NULL, &yl))
        EXPECT(0, "linear forward: %s", xmp_last_error());
    EXPECT(xmp_mem_peak_bytes() - base == 48 && xmp_mem_live_bytes() - base == 48,
           "linear forward: peak %lld, live %lld over base (want the 48 B output only)",
           (long long)(xmp_mem_peak_bytes() - base), (long long)(xmp_mem_live_bytes() - base));
    int bad = 0;
    for (int r = 0; r < 4; r++)
        for (int o = 0; o < 3; o++) {
            float want = 0;
            for (int k = 0; k < 6; k++)
                want += xmp_f32(&x)[r * 6 + k] * xmp_f32(&wl)[o * 6 + k];
            bad += yl.data == NULL || xmp_f32(&yl)[r * 3 + o] != want;
        }
    EXPECT(bad == 0, "linear forward: %d of 12 elements wrong", bad);
    xmp_tensor_free(&yl);
    base = xmp_mem_live_bytes();
    xmp_mem_peak_reset();
    if (xmp_gelu_backward(&x, &x, &dg))
        EXPECT(0, "gelu backward: %s", xmp_last_error());
    EXPECT(xmp_mem_peak_bytes() - base == 96 && xmp_mem_live_bytes() - base == 96,
           "gelu backward: peak %lld, live %lld over base (want the 96 B dx only)",
           (long long)(xmp_mem_peak_bytes() - base), (long long)(xmp_mem_live_bytes() - base));
    xmp_tensor_free(&dg);
    xmp_tensor_free(&wl);
    /* cross-entropy hands its dlogits over (moved, not copied) */
    int64_t ts[1] = {4};
    xmp_tensor_t tg, dl;
    float loss;
    xmp_tensor_alloc(&tg, m, 1, ts, XMESH_I32, b);
    base = xmp_mem_live_bytes();
    if (xmp_cross_entropy(&x, &tg, 6, &loss, &dl))
        EXPECT(0, "cross entropy: %s", xmp_last_error());
    EXPECT(xmp_mem_live_bytes() == base + 96, "dlogits held: %lld",
           (long long)(xmp_mem_live_bytes() - base));
    xmp_tensor_free(&dl);
    EXPECT(xmp_mem_live_bytes() == base, "dlogits freed: %lld",
           (long long)(xmp_mem_live_bytes() - base));
    xmp_tensor_free(&tg);
    xmp_tensor_free(&x);
    xmp_tensor_free(&w);
    xmp_tensor_free(&bb);
    EXPECT(xmp_mem_live_bytes() == 0, "end: live %lld", (long long)xmp_mem_live_bytes());

    /* a tensor on a mesh this rank is not in holds nothing and counts nothing */
    if (!xmp_mesh_create(MPI_COMM_SELF, NULL, 1, &one, &zero, &other)) {
        other->member = 0; /* pretend: the accounting follows the data, not the mesh */
        xmp_tensor_t n;
        xmp_tensor_alloc(&n, other, 2, s1, XMESH_F32, b);
        EXPECT(xmp_mem_live_bytes() == 0 && n.data == NULL, "non-member: live %lld",
               (long long)xmp_mem_live_bytes());
        xmp_tensor_free(&n);
        other->member = 1;
        xmp_mesh_destroy(other);
    }

    /* per thread: another thread's allocations do not move this thread's counters */
    int64_t seen[3] = {-1, -1, -1};
    xmp_mem_track(500);
    pthread_t th;
    pthread_create(&th, NULL, other_thread, seen);
    pthread_join(th, NULL);
    EXPECT(seen[0] == 0 && seen[1] == 4000 && seen[2] == 0, "other thread saw %lld %lld %lld",
           (long long)seen[0], (long long)seen[1], (long long)seen[2]);
    EXPECT(xmp_mem_live_bytes() == 500, "this thread after the other: %lld",
           (long long)xmp_mem_live_bytes());
    xmp_mem_track(-500);
    xmp_mesh_destroy(m);
    printf("test_sbp_mem: %s (%d failures)\n", g_fail ? "FAILED" : "ok", g_fail);
    MPI_Finalize();
    return g_fail ? 1 : 0;
}
