/*
 * The U-Transformer's layers on SBP tensors (models/utransformer_sbp.h), under MPI: every rank
 * of MPI_COMM_WORLD is one device of a 1 x tp stage mesh (tp = world size) and, on 4 ranks, also
 * of a 2 x 2 (dp x tp) mesh. For every one of the 13 layers and both built-in strategies (dp,
 * megatron), the SBP layer must equal the serial layer (models/utransformer.h) on the same
 * inputs, element by element: forward main and skip outputs, backward_input's main and skip
 * input gradients, and the parameter gradients after the data-parallel reduction, all gathered
 * to full. Two head sizes make the attention head-split at every level, or replicated (by the
 * strategy's explicit per-layer lines) where heads % tp != 0. Also: megatron really splits
 * (fewer local parameter bytes), the strategy text round trip, and the refusals before anything
 * runs (heads % pieces, a missing class, bad lines). Group norm with 1 group makes every group
 * span the tp ranks (statistics all-reduced).
 * Replay with: mpiexec -n N test_utrans_tp --seed S
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/utransformer.h"
#include "models/utransformer_sbp.h"
#include "utrans_check.h"

/* Max |a - b| over n floats must be <= tol * (1 + max |b|); returns the scaled error. */
static double cmp(const char *what, const char *layer, const float *a, const float *b, size_t n)
{
    double mx = 0, ref = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= mx)) /* NaN propagates */
            mx = d;
        if (fabs(b[i]) > ref)
            ref = fabs(b[i]);
    }
    double e = mx / (1.0 + ref);
    CHECK(e <= 2e-6, "%s %s: max |sbp - serial| %.3g (max |serial| %.3g) over %zu floats", layer,
          what, mx, ref, n);
    return e;
}

static xmp_tensor_t wrap(xmp_mesh_t *m, int ndim, const int64_t *shape, const float *full)
{
    xmp_tensor_t t;
    xmp_sbp_t s[XMP_MAX_MESH_DIMS] = {xmp_sbp_s(0), xmp_sbp_b(), xmp_sbp_b(), xmp_sbp_b()};
    memset(&t, 0, sizeof t);
    if (xmp_tensor_alloc(&t, m, ndim, shape, XMESH_F32, s) != XMESH_SUCCESS ||
        xmp_tensor_fill_from_full(&t, full) != XMESH_SUCCESS) {
        printf("wrap: %s\n", xmp_last_error());
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    return t;
}

static void gather(const xmp_tensor_t *t, float *full, size_t n, const char *what)
{
    size_t k = 1;
    for (int d = 0; d < t->ndim; d++)
        k *= (size_t)t->shape[d];
    CHECK(k == n && xmp_tensor_gather_full(t, full) == XMESH_SUCCESS, "gather %s: %s", what,
          xmp_last_error());
}

static void check_layer(const xmp_ut_config_t *cf, const xmp_ut_params_t *pp, xmp_mesh_t *mesh,
                        const xmp_ut_strategy_t *st, int layer, int n)
{
    const char *nm = xmp_ut_layer_name(layer);
    xmp_ut_layer_t *ls = xmp_ut_layer_create(cf, layer, n);
    CHECK(ls != NULL, "create %s: %s", nm, xmp_last_error());
    if (!ls)
        return;
    size_t nw = pp->layer_count[layer], nx = xmp_ut_layer_in_floats(ls),
           ny = xmp_ut_layer_out_floats(ls), nsi = xmp_ut_layer_skip_in_floats(ls),
           nso = xmp_ut_layer_skip_out_floats(ls),
           nc = (size_t)n * XMP_UT_TOKENS * (size_t)cf->cond_dim;
    float *all = malloc(pp->total * sizeof(float));
    xmp_ut_params_init(pp, 11, all);
    float *w = all + pp->layer_offset[layer];
    for (int k = 0; k < pp->ntensors; k++) /* non-trivial biases, gammas, betas */
        if (pp->t[k].layer == layer && pp->t[k].ndim == 1)
            for (size_t i = 0; i < pp->t[k].count; i++)
                all[pp->t[k].offset + i] += (float)(0.3 * (2.0 * urand() - 1.0));
    size_t tot = nx + nsi + nc + 3 * ny + 3 * nso + 2 * nx + 2 * nsi + 2 * nw + 8;
    float *buf = calloc(tot, sizeof(float));
    float *x = buf, *skip = x + nx, *cond = skip + nsi, *r = cond + nc, *y0 = r + ny, *y1 = y0 + ny,
          *rs = y1 + ny, *so0 = rs + nso, *so1 = so0 + nso, *dx0 = so1 + nso, *dx1 = dx0 + nx,
          *ds0 = dx1 + nx, *ds1 = ds0 + nsi, *dw0 = ds1 + nsi, *dw1 = dw0 + nw;
    fill(x, nx, 1.0);
    fill(skip, nsi, 1.0);
    fill(cond, nc, 1.0);
    fill(r, ny, 1.0);
    fill(rs, nso, 1.0);
    xmp_ut_slayer_t *sl = xmp_ut_slayer_create(cf, layer, n, mesh, st, w);
    CHECK(sl != NULL, "create SBP %s: %s", nm, xmp_last_error());
    int ci[3], co[3], ck[3], cs[3];
    xmp_ut_layer_in_shape(cf, layer, ci);
    xmp_ut_layer_out_shape(cf, layer, co);
    xmp_ut_layer_skip_shape(cf, layer, cs);
    xmp_ut_layer_skip_shape(cf, xmp_ut_skip_source(layer), ck);
    int64_t si[4] = {n, ci[0], ci[1], ci[2]}, so[4] = {n, co[0], co[1], co[2]},
            sk[4] = {n, ck[0], ck[1], ck[2]}, ss[4] = {n, cs[0], cs[1], cs[2]},
            sc[3] = {n, XMP_UT_TOKENS, cf->cond_dim};
    xmp_tensor_t tx = wrap(mesh, 4, si, x), tc = wrap(mesh, 3, sc, cond), tk, tdy, tds, dx, dsi;
    memset(&tk, 0, sizeof tk);
    memset(&tds, 0, sizeof tds);
    memset(&dx, 0, sizeof dx);
    memset(&dsi, 0, sizeof dsi);
    if (nsi)
        tk = wrap(mesh, 4, sk, skip);
    tdy = wrap(mesh, 4, so, r);
    if (nso)
        tds = wrap(mesh, 4, ss, rs);
    double e = 0;
    int rc = xmp_ut_layer_forward(ls, w, x, nsi ? skip : NULL, cond, y0, nso ? so0 : NULL);
    CHECK(rc == 0, "%s serial forward: %s", nm, xmp_last_error());
    rc = xmp_ut_layer_backward_input(ls, w, r, nso ? rs : NULL, layer ? dx0 : NULL,
                                     nsi ? ds0 : NULL);
    CHECK(rc == 0, "%s serial backward_input: %s", nm, xmp_last_error());
    rc = xmp_ut_layer_backward_weight(ls, dw0);
    CHECK(rc == 0, "%s serial backward_weight: %s", nm, xmp_last_error());
    if (sl) {
        xmp_ut_tape_t *tape = NULL;
        const xmp_tensor_t *ty = NULL, *tso = NULL;
        rc = xmp_ut_slayer_forward(sl, &tx, nsi ? &tk : NULL, &tc, &tape, &ty, &tso);
        CHECK(rc == 0, "%s SBP forward: %s", nm, xmp_last_error());
        if (rc == 0) {
            gather(ty, y1, ny, "y");
            e = cmp("y", nm, y1, y0, ny);
            if (nso) {
                gather(tso, so1, nso, "skip_out");
                e = fmax(e, cmp("skip_out", nm, so1, so0, nso));
            }
            rc = xmp_ut_slayer_backward_input(sl, tape, &tdy, nso ? &tds : NULL, layer ? &dx : NULL,
                                              nsi ? &dsi : NULL);
            CHECK(rc == 0, "%s SBP backward_input: %s", nm, xmp_last_error());
            if (rc == 0 && layer) {
                gather(&dx, dx1, nx, "dx");
                e = fmax(e, cmp("dx", nm, dx1, dx0, nx));
            }
            if (rc == 0 && nsi) {
                gather(&dsi, ds1, nsi, "dskip_in");
                e = fmax(e, cmp("dskip_in", nm, ds1, ds0, nsi));
            }
            rc = xmp_ut_slayer_backward_weight(sl, tape);
            CHECK(rc == 0, "%s SBP backward_weight: %s", nm, xmp_last_error());
            rc = xmp_ut_slayer_reduce(sl);
            CHECK(rc == 0, "%s SBP reduce: %s", nm, xmp_last_error());
            rc = xmp_ut_slayer_gather_grads(sl, dw1);
            CHECK(rc == 0, "%s SBP gradients: %s", nm, xmp_last_error());
            e = fmax(e, cmp("dw", nm, dw1, dw0, nw));
        } else {
            xmp_ut_tape_free(tape);
        }
        long long pb = xmp_ut_slayer_param_bytes(sl);
        if (!strcmp(st->name, "megatron") && mesh->shape[1] > 1)
            CHECK(layer == XMP_UT_CONV_IN || layer >= XMP_UT_OUT || pb < (long long)(nw * 4),
                  "%s megatron: %lld local of %zu parameter bytes: nothing split", nm, pb, nw * 4);
        if (g_rank == 0)
            printf("  %-8s %dx%d %-8s params %7lld of %7zu bytes local, max scaled err %.2e\n",
                   st->name, mesh->shape[0], mesh->shape[1], nm, pb, nw * 4, e);
    }
    xmp_tensor_free(&tx);
    xmp_tensor_free(&tc);
    xmp_tensor_free(&tk);
    xmp_tensor_free(&tdy);
    xmp_tensor_free(&tds);
    xmp_tensor_free(&dx);
    xmp_tensor_free(&dsi);
    xmp_ut_slayer_destroy(sl);
    free(buf);
    free(all);
    xmp_ut_layer_destroy(ls);
}

/* parse through nn/strategy.h, messages into the model's last error */
static char g_perr[512];
static int parse(const char *text, xmp_ut_strategy_t *s)
{
    return xmp_strategy_parse(text, "test", s, g_perr, sizeof g_perr);
}

static void check_refusals(int tp)
{
    xmp_ut_config_t c;
    static xmp_ut_strategy_t s;
    char text[16384], err[256];
    int shape[2] = {1, tp};
    xmp_ut_config_init(&c, 8, 4, 0); /* heads 1, 2, 4 */
    /* heads split regardless of divisibility: refused, naming the heads */
    CHECK(xmp_ut_strategy_builtin(&c, "dp", 2, shape, text, sizeof text, err, sizeof err) == 0,
          "dp text: %s", err);
    strcat(text, "down1.attn.q.w = B,S(0)\n");
    CHECK(parse(text, &s) == 0, "parse: %s", g_perr);
    for (int i = 0; i < s.n; i++) /* activations whole on axis 1: q.w S(0) splits the heads */
        if (!strcmp(s.e[i].cls, "act.block"))
            s.e[i].sbp[1] = xmp_sbp_b();
    if (tp > 1)
        CHECK(xmp_ut_strategy_check(&s, &c, 0, XMP_UT_LAYERS - 1, shape) != 0 &&
                  strstr(xmp_last_error(), "heads 1 not divisible"),
              "1 head split over %d: '%s'", tp, xmp_last_error());
    CHECK(parse("strategy x axes=2\nconv.w = B,B\n", &s) == 0 &&
              xmp_ut_strategy_check(&s, &c, 0, 0, shape) != 0 && strstr(xmp_last_error(), "act.x"),
          "missing act.x accepted: '%s'", xmp_last_error());
    CHECK(xmp_ut_strategy_builtin(&c, "dp", 2, shape, text, sizeof text, err, sizeof err) == 0,
          "dp text: %s", err);
    strcat(text, "down1.conv1.W = B,B\n"); /* a typo must not pass silently */
    CHECK(parse(text, &s) == 0 && xmp_ut_strategy_check(&s, &c, 0, XMP_UT_LAYERS - 1, shape) != 0 &&
              strstr(xmp_last_error(), "unknown class 'down1.conv1.W'"),
          "unknown class accepted: '%s'", xmp_last_error());
    CHECK(parse("strategy x axes=2\nconv.w = B,Q\n", &s) != 0 && strstr(g_perr, ":2"),
          "bad SBP token accepted: '%s'", g_perr);
    CHECK(xmp_ut_strategy_load("dp", &c, 3, NULL, &s) == 0 && s.naxes == 3, "dp on 3 axes: %s",
          xmp_last_error());
    /* rules: a spatial split of a feature map, a channel split into the up layers' concat, a
     * storage SBP on an activation: refused naming class, axis and rule */
    CHECK(xmp_ut_strategy_builtin(&c, "dp", 2, shape, text, sizeof text, err, sizeof err) == 0,
          "dp text: %s", err);
    strcat(text, "act.block = S(0),S(2)\n");
    CHECK(parse(text, &s) != 0 ||
              (xmp_ut_strategy_check(&s, &c, 0, XMP_UT_LAYERS - 1, shape) != 0 &&
               strstr(xmp_last_error(), "act.block") && strstr(xmp_last_error(), "mesh axis 1") &&
               strstr(xmp_last_error(), "halo")),
          "spatial split accepted: '%s'", xmp_last_error());
    CHECK(xmp_ut_strategy_builtin(&c, "dp", 2, shape, text, sizeof text, err, sizeof err) == 0,
          "dp text: %s", err);
    strcat(text, "up2.act.x = S(0),S(1)\n");
    CHECK(parse(text, &s) == 0 && xmp_ut_strategy_check(&s, &c, 0, XMP_UT_LAYERS - 1, shape) != 0 &&
              strstr(xmp_last_error(), "concat") && strstr(xmp_last_error(), "mesh axis 1"),
          "channel split into concat accepted: '%s'", xmp_last_error());
    CHECK(parse("strategy x axes=2\nact.x = S(0),B store B,B\n", &s) == 0 &&
              xmp_ut_strategy_check(&s, &c, 0, 0, shape) != 0 &&
              strstr(xmp_last_error(), "storage SBP"),
          "storage SBP of an activation accepted: '%s'", xmp_last_error());
    /* text round trip through nn/strategy.h */
    static xmp_ut_strategy_t a, b;
    char t2[16384];
    CHECK(xmp_ut_strategy_load("axonn", &c, 3, NULL, &a) == 0 &&
              xmp_strategy_format(&a, t2, sizeof t2) < (int)sizeof t2 && parse(t2, &b) == 0 &&
              xmp_strategy_equal(&a, &b),
          "axonn text does not round-trip: %s %s", xmp_last_error(), g_perr);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int size;
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    uint64_t seed = 20261124;
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--seed"))
            seed = strtoull(argv[i + 1], NULL, 10);
    if (g_rank == 0)
        printf("test_utrans_tp: %d ranks, seed %llu\n", size, (unsigned long long)seed);
    int *ranks = malloc((size_t)size * sizeof(int));
    for (int i = 0; i < size; i++)
        ranks[i] = i;
    /* head_dim 0 (= C): 1, 2, 4 heads at levels 1-3, so tp 2 replicates level 1's attention;
     * head_dim C/4: 4, 8, 16 heads, every attention head-split */
    const int head_dims[3] = {0, 2, 2}, groups[3] = {4, 4, 1}; /* groups 1: spans ranks */
    int nmesh = size == 4 ? 2 : 1;
    for (int mi = 0; mi < nmesh; mi++) {
        int shape[2] = {mi ? 2 : 1, mi ? 2 : size};
        xmp_mesh_t *mesh = NULL;
        if (xmp_mesh_create(MPI_COMM_WORLD, NULL, 2, shape, ranks, &mesh) != XMESH_SUCCESS) {
            printf("mesh: %s\n", xmp_last_error());
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        for (int h = 0; h < 3; h++)
            for (int sgi = 0; sgi < 2; sgi++) {
                xmp_ut_config_t c;
                xmp_ut_strategy_t st;
                if (xmp_ut_config_init(&c, 8, groups[h], head_dims[h]) != 0 ||
                    xmp_ut_strategy_load(sgi ? "megatron" : "dp", &c, 2, shape, &st) != 0 ||
                    xmp_ut_strategy_check(&st, &c, 0, XMP_UT_LAYERS - 1, shape) != 0) {
                    printf("config/strategy: %s\n", xmp_last_error());
                    MPI_Abort(MPI_COMM_WORLD, 1);
                }
                if (sgi == 0 && h >= 1)
                    continue; /* dp does not depend on the heads or groups */
                xmp_ut_params_t pp;
                xmp_ut_params_layout(&c, &pp);
                if (g_rank == 0)
                    printf("C 8, groups %d, head_dim %d, strategy %s on %dx%d:\n", c.groups,
                           c.head_dim, st.name, shape[0], shape[1]);
                for (int l = 0; l < XMP_UT_LAYERS; l++) {
                    g_state = seed * 1000003ull + (uint64_t)(h * 100 + l); /* same on all ranks */
                    check_layer(&c, &pp, mesh, &st, l, 2);
                }
            }
        xmp_mesh_destroy(mesh);
    }
    check_refusals(size);
    int all = 0;
    MPI_Allreduce(&g_fail, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (g_rank == 0)
        printf("test_utrans_tp: %s (%d failures, seed %llu)\n", all ? "FAILED" : "OK", all,
               (unsigned long long)seed);
    free(ranks);
    MPI_Finalize();
    return all ? 1 : 0;
}
