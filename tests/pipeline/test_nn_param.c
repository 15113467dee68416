/*
 * The sharded-parameter engine (pipeline/nn/param.h) on a 2x2 mesh (4 ranks): for compute and
 * storage SBP pairs (ZeRO over both axes, a depth shard, an uneven split, an unsharded
 * parameter) every element of the compute copy and of the stored shard after init, of the
 * reduced gradient (the sum of every rank's partial contribution, in the storage SBP), of the
 * compute copy after an update of the shard and the all-gather (blocking and nonblocking),
 * the byte counts, and the refusal of bad arguments. Replay: test_nn_param --seed N
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/param.h"
#include "utrans_check.h"

static int same(const float *a, const float *b, size_t n, float tol)
{
    for (size_t i = 0; i < n; i++)
        if (fabsf(a[i] - b[i]) > tol * (1.0f + fabsf(b[i])))
            return 0;
    return 1;
}

/* One case: tensor rows x cols, compute SBP cs, storage SBP ss (NULL: none), nonblocking nb. */
static void one(xmp_mesh_t *mesh, int64_t rows, int64_t cols, const char *cs, const char *ss,
                int nb)
{
    const int64_t shape[2] = {rows, cols};
    const size_t n = (size_t)(rows * cols);
    xmp_sbp_t c[XMP_MAX_MESH_DIMS], s[XMP_MAX_MESH_DIMS], acc[XMP_MAX_MESH_DIMS];
    CHECK(xmp_sbp_parse(cs, 2, 2, c) == XMESH_SUCCESS, "parse %s", cs);
    if (ss)
        CHECK(xmp_sbp_parse(ss, 2, 2, s) == XMESH_SUCCESS, "parse %s", ss);
    xmp_param_acc_sbp(c, acc);
    float *full = malloc(n * sizeof(float)), *gv = malloc(n * sizeof(float));
    float *got = malloc(n * sizeof(float)), *want = malloc(n * sizeof(float));
    fill(full, n, 1.0);
    fill(gv, n, 1.0);
    xmp_param_t p;
    xmesh_result_t r = xmp_param_init(&p, mesh, 2, shape, c, ss ? s : NULL, full, 2, acc);
    CHECK(r == XMESH_SUCCESS, "%s store %s: init: %s", cs, ss ? ss : "-", xmp_last_error());
    if (r) {
        free(full), free(gv), free(got), free(want);
        return;
    }
    int sharded = ss && strcmp(cs, ss) != 0;
    CHECK(p.sharded == sharded, "%s store %s: sharded %d", cs, ss ? ss : "-", p.sharded);
    /* init: both forms hold the full tensor's blocks */
    CHECK(xmp_tensor_gather_full(&p.w, got) == XMESH_SUCCESS && same(got, full, n, 0),
          "%s: compute copy after init", cs);
    CHECK(xmp_tensor_gather_full(xmp_param_stored(&p), got) == XMESH_SUCCESS &&
              same(got, full, n, 0),
          "%s store %s: stored copy after init", cs, ss ? ss : "-");
    /* every rank contributes its partial term wt * gv over the P axes of the accumulator,
     * wt = product over those axes of (1 + its coordinate): the reduced gradient is
     * 3^(P axes) * gv (1 + 2 per axis of size 2), in the storage SBP */
    float wt = 1, sum = 1;
    xmp_sbp_t asb[XMP_MAX_MESH_DIMS];
    for (int a = 0; a < XMP_MAX_MESH_DIMS; a++) {
        asb[a] = acc[a].kind == XMP_P ? xmp_sbp_b() : acc[a];
        if (a < 2 && acc[a].kind == XMP_P)
            wt *= (float)(1 + mesh->coord[a]), sum *= 3;
    }
    {
        xmp_tensor_t d, t;
        for (size_t i = 0; i < n; i++)
            want[i] = wt * gv[i];
        /* the local block of a B-for-P twin holds this rank's term; d (P) takes the bytes */
        CHECK(xmp_tensor_alloc(&t, mesh, 2, shape, XMESH_F32, asb) == XMESH_SUCCESS &&
                  xmp_tensor_fill_from_full(&t, want) == XMESH_SUCCESS &&
                  xmp_tensor_alloc(&d, mesh, 2, shape, XMESH_F32, acc) == XMESH_SUCCESS &&
                  d.lcount == t.lcount,
              "contribution: %s", xmp_last_error());
        memcpy(d.data, t.data, (size_t)d.lcount * sizeof(float));
        xmp_tensor_free(&t);
        /* two contributions (half each): the first is taken, the second added */
        xmp_tensor_t d2;
        CHECK(xmp_tensor_alloc_like(&d2, &d) == XMESH_SUCCESS, "alloc d2");
        for (int64_t i = 0; i < d.lcount; i++) {
            xmp_f32(&d)[i] *= 0.5f;
            xmp_f32(&d2)[i] = xmp_f32(&d)[i];
        }
        xmp_tensor_free(&p.g); /* start empty: the first contribution is taken as it is */
        memset(&p.g, 0, sizeof p.g);
        CHECK(xmp_param_acc(&p, &d) == XMESH_SUCCESS && !d.mesh, "acc: %s", xmp_last_error());
        CHECK(xmp_param_acc(&p, &d2) == XMESH_SUCCESS && !d2.mesh, "acc: %s", xmp_last_error());
    }
    r = nb ? xmp_param_reduce_start(&p) : xmp_param_reduce(&p);
    if (!r && nb)
        r = xmp_param_reduce_wait(&p);
    CHECK(r == XMESH_SUCCESS, "reduce: %s", xmp_last_error());
    for (size_t i = 0; i < n; i++)
        want[i] = sum * gv[i];
    CHECK(p.r.lcount == xmp_param_stored(&p)->lcount, "r has %lld floats, stored %lld",
          (long long)p.r.lcount, (long long)xmp_param_stored(&p)->lcount);
    for (int a = 0; a < 2; a++)
        CHECK(xmp_sbp_eq(p.r.sbp[a], xmp_param_stored(&p)->sbp[a]), "r's SBP axis %d", a);
    CHECK(xmp_tensor_gather_full(&p.r, got) == XMESH_SUCCESS && same(got, want, n, 1e-6f),
          "%s store %s: reduced gradient != sum of the contributions", cs, ss ? ss : "-");
    /* update the shard (w -= 0.1 r), gather into the compute copy */
    xmp_tensor_t *st = xmp_param_stored(&p);
    for (int64_t i = 0; i < st->lcount; i++)
        xmp_f32(st)[i] -= 0.1f * xmp_f32(&p.r)[i];
    r = nb ? xmp_param_gather_start(&p) : xmp_param_gather(&p);
    if (!r && nb)
        r = xmp_param_gather_wait(&p);
    CHECK(r == XMESH_SUCCESS, "gather: %s", xmp_last_error());
    for (size_t i = 0; i < n; i++)
        want[i] = full[i] - 0.1f * sum * gv[i];
    CHECK(xmp_tensor_gather_full(&p.w, got) == XMESH_SUCCESS && same(got, want, n, 1e-6f),
          "%s store %s: compute copy after the update", cs, ss ? ss : "-");
    for (int a = 0; a < 2; a++)
        CHECK(xmp_sbp_eq(p.w.sbp[a], c[a]), "compute SBP changed on axis %d", a);
    xmp_param_zero_grad(&p, 0);
    CHECK(!p.r.mesh, "r not freed");
    for (int64_t i = 0; i < p.g.lcount; i++)
        CHECK(xmp_f32(&p.g)[i] == 0, "g not zeroed");
    xmp_param_bytes_t b = {0, 0, 0, 0};
    xmp_param_bytes(&p, &b);
    CHECK(b.param == 4 * xmp_param_stored(&p)->lcount && b.optimizer == 2 * b.param &&
              b.compute == 4 * p.w.lcount && b.grad == 4 * p.g.lcount,
          "bytes %lld %lld %lld %lld", (long long)b.param, (long long)b.optimizer,
          (long long)b.compute, (long long)b.grad);
    /* summed over the ranks, a sharded form holds each element once, its optimizer state too */
    long long tot = 0, mine = (long long)b.param;
    MPI_Allreduce(&mine, &tot, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (ss && strchr(ss, 'B') == NULL)
        CHECK(tot == 4LL * (long long)n, "%s: stored bytes over the ranks %lld, tensor %lld", ss,
              tot, 4LL * (long long)n);
    xmp_param_free(&p);
    CHECK(!p.w.mesh && !p.state[0], "free did not zero");
    free(full), free(gv), free(got), free(want);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int size;
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    uint64_t seed = 20261125;
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--seed"))
            seed = strtoull(argv[i + 1], NULL, 10);
    g_state = seed;
    if (g_rank == 0)
        printf("test_nn_param: seed %llu\n", (unsigned long long)seed);
    if (size != 4) {
        if (g_rank == 0)
            printf("test_nn_param needs 4 ranks, got %d\n", size);
        MPI_Finalize();
        return 1;
    }
    int shape[2] = {2, 2}, ranks[4] = {0, 1, 2, 3};
    xmp_mesh_t *mesh = NULL;
    CHECK(xmp_mesh_create(MPI_COMM_WORLD, NULL, 2, shape, ranks, &mesh) == XMESH_SUCCESS,
          "mesh: %s", xmp_last_error());
    static const struct {
        int64_t rows, cols;
        const char *c, *s;
    } cases[] = {
        {8, 6, "B,B", "S(0),S(1)"},    /* ZeRO over both axes */
        {7, 5, "B,B", "S(0),S(0)"},    /* uneven split of one dim over both axes */
        {8, 6, "B,S(1)", "S(0),S(1)"}, /* AxoNN's depth shard of a tensor-parallel weight */
        {5, 3, "S(1),B", "S(1),S(0)"}, /* split differently in both forms */
        {6, 4, "S(0),B", NULL},        /* not sharded: the compute copy is stored */
        {6, 4, "B,B", "B,B"},          /* the same SBP given: not sharded */
    };
    for (size_t k = 0; mesh && k < sizeof cases / sizeof cases[0]; k++)
        for (int nb = 0; nb < 2; nb++)
            one(mesh, cases[k].rows, cases[k].cols, cases[k].c, cases[k].s, nb);
    /* bad arguments: refused naming the value, *p left empty */
    xmp_param_t p;
    memset(&p, 0x5a, sizeof p);
    float full[4] = {0};
    int64_t sh[2] = {2, 2};
    xmp_sbp_t c[XMP_MAX_MESH_DIMS];
    xmp_sbp_parse("B,B", 2, 2, c);
    CHECK(xmp_param_init(&p, mesh, 2, sh, c, NULL, full, 3, NULL) == XMESH_ERR_INVALID_ARGUMENT &&
              strstr(xmp_last_error(), "nstate 3"),
          "nstate 3 accepted: '%s'", xmp_last_error());
    xmp_mesh_destroy(mesh);
    int any = 0;
    MPI_Allreduce(&g_fail, &any, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (g_rank == 0)
        printf("test_nn_param: %s (%d failures, seed %llu)\n", any ? "FAILED" : "OK", any,
               (unsigned long long)seed);
    MPI_Finalize();
    return any ? 1 : 0;
}
