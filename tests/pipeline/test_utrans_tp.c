/*
 * U-Transformer tensor parallelism, under MPI (every rank of MPI_COMM_WORLD is one tp rank of a
 * 1 x tp mesh, tp = world size): for every one of the 13 layers, the channel-split layer
 * (xmp_ut_layer_create_tp, boxing through xmp_ut_tp_box_p_to_b) must equal the serial layer on
 * the same inputs, element by element: forward main and skip outputs, backward_input's main and
 * skip input gradients, and backward_weight's parameter gradients (each rank's local blocks
 * against the same blocks cut from the serial full gradient). Two head sizes make the attention
 * head-split at every level, or replicated where heads % tp != 0. Also: slice/unslice round
 * trip, and the refusals (groups % tp != 0, tp rank out of range, missing boxing function).
 * Replay with: mpiexec -n N test_utrans_tp --seed S
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/utransformer.h"
#include "models/utransformer_tp.h"
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
    CHECK(e <= 2e-6, "%s %s: max |tp - serial| %.3g (max |serial| %.3g) over %zu floats", layer,
          what, mx, ref, n);
    return e;
}

static void check_layer(const xmp_ut_config_t *cf, const xmp_ut_params_t *pp, xmp_mesh_t *mesh,
                        int tp, int layer, int n)
{
    const char *nm = xmp_ut_layer_name(layer);
    xmp_ut_tp_t t = {tp, g_rank, xmp_ut_tp_box_p_to_b, xmp_ut_tp_gather_channels, mesh};
    xmp_ut_layer_t *ls = xmp_ut_layer_create(cf, layer, n);
    xmp_ut_layer_t *lt = xmp_ut_layer_create_tp(cf, layer, n, &t);
    CHECK(ls && lt, "create %s: %s", nm, xmp_ut_last_error());
    if (!ls || !lt) {
        xmp_ut_layer_destroy(ls);
        xmp_ut_layer_destroy(lt);
        return;
    }
    size_t nw = pp->layer_count[layer], nlw = xmp_ut_layer_param_floats(lt),
           nx = xmp_ut_layer_in_floats(ls), ny = xmp_ut_layer_out_floats(ls),
           nsi = xmp_ut_layer_skip_in_floats(ls), nso = xmp_ut_layer_skip_out_floats(ls),
           nc = (size_t)n * XMP_UT_TOKENS * (size_t)cf->cond_dim;
    CHECK(xmp_ut_layer_out_floats(lt) == ny && xmp_ut_layer_in_floats(lt) == nx &&
              xmp_ut_layer_skip_in_floats(lt) == nsi && xmp_ut_layer_skip_out_floats(lt) == nso,
          "%s: tp layer edge sizes differ from the serial layer's", nm);
    CHECK(tp == 1 || nlw < nw || layer == XMP_UT_CONV_IN || layer >= XMP_UT_OUT,
          "%s: %zu local of %zu parameter floats: nothing split", nm, nlw, nw);
    float *all = malloc(pp->total * sizeof(float));
    xmp_ut_params_init(pp, 11, all);
    float *w = all + pp->layer_offset[layer];
    for (int k = 0; k < pp->ntensors; k++) /* non-trivial biases, gammas, betas */
        if (pp->t[k].layer == layer && pp->t[k].ndim == 1)
            for (size_t i = 0; i < pp->t[k].count; i++)
                all[pp->t[k].offset + i] += (float)(0.3 * (2.0 * urand() - 1.0));
    size_t tot = nx + nsi + nc + 3 * ny + 3 * nso + 2 * nx + 2 * nsi + 2 * nw + 3 * nlw + 8;
    float *buf = calloc(tot, sizeof(float));
    float *x = buf, *skip = x + nx, *cond = skip + nsi, *r = cond + nc, *y0 = r + ny, *y1 = y0 + ny,
          *rs = y1 + ny, *so0 = rs + nso, *so1 = so0 + nso, *dx0 = so1 + nso, *dx1 = dx0 + nx,
          *ds0 = dx1 + nx, *ds1 = ds0 + nsi, *dw0 = ds1 + nsi, *back = dw0 + nw, *wl = back + nw,
          *dwl = wl + nlw, *dw0l = dwl + nlw;
    fill(x, nx, 1.0);
    fill(skip, nsi, 1.0);
    fill(cond, nc, 1.0);
    fill(r, ny, 1.0);
    fill(rs, nso, 1.0);
    xmp_ut_layer_param_slice(lt, w, wl);
    /* unslice into a copy gives back the full tensors where this rank holds them */
    memcpy(back, w, nw * sizeof(float));
    xmp_ut_layer_param_unslice(lt, wl, back);
    CHECK(memcmp(back, w, nw * sizeof(float)) == 0, "%s: unslice(slice(w)) != w", nm);

    int rc = xmp_ut_layer_forward(ls, w, x, nsi ? skip : NULL, cond, y0, nso ? so0 : NULL);
    CHECK(rc == 0, "%s serial forward: %s", nm, xmp_ut_last_error());
    rc = xmp_ut_layer_forward(lt, wl, x, nsi ? skip : NULL, cond, y1, nso ? so1 : NULL);
    CHECK(rc == 0, "%s tp forward: %s", nm, xmp_ut_last_error());
    double e = cmp("y", nm, y1, y0, ny);
    if (nso)
        e = fmax(e, cmp("skip_out", nm, so1, so0, nso));
    rc = xmp_ut_layer_backward_input(ls, w, r, nso ? rs : NULL, layer ? dx0 : NULL,
                                     nsi ? ds0 : NULL);
    CHECK(rc == 0, "%s serial backward_input: %s", nm, xmp_ut_last_error());
    rc = xmp_ut_layer_backward_input(lt, wl, r, nso ? rs : NULL, layer ? dx1 : NULL,
                                     nsi ? ds1 : NULL);
    CHECK(rc == 0, "%s tp backward_input: %s", nm, xmp_ut_last_error());
    if (layer)
        e = fmax(e, cmp("dx", nm, dx1, dx0, nx));
    if (nsi)
        e = fmax(e, cmp("dskip_in", nm, ds1, ds0, nsi));
    rc = xmp_ut_layer_backward_weight(ls, dw0);
    CHECK(rc == 0, "%s serial backward_weight: %s", nm, xmp_ut_last_error());
    rc = xmp_ut_layer_backward_weight(lt, dwl);
    CHECK(rc == 0, "%s tp backward_weight: %s", nm, xmp_ut_last_error());
    xmp_ut_layer_param_slice(lt, dw0, dw0l);
    e = fmax(e, cmp("dw", nm, dwl, dw0l, nlw));
    if (g_rank == 0)
        printf("  tp %d %-8s params %6zu of %6zu local, attention %s, max scaled err %.2e\n", tp,
               nm, nlw, nw, xmp_ut_layer_attn_split(lt) ? "head-split" : "-/replicated", e);
    free(buf);
    free(all);
    xmp_ut_layer_destroy(ls);
    xmp_ut_layer_destroy(lt);
}

static void check_refusals(int tp, xmp_mesh_t *mesh)
{
    xmp_ut_config_t c;
    xmp_ut_config_init(&c, 6, 3, 0); /* groups 3: not a multiple of 2 or 4 */
    xmp_ut_tp_t t = {tp, g_rank, xmp_ut_tp_box_p_to_b, xmp_ut_tp_gather_channels, mesh};
    if (tp > 1) {
        CHECK(xmp_ut_tp_check(&c, tp) != 0, "groups 3 over tp %d accepted", tp);
        char want[64];
        snprintf(want, sizeof want, "degree %d", tp);
        CHECK(strstr(xmp_ut_last_error(), "groups 3") && strstr(xmp_ut_last_error(), want),
              "message '%s' does not name groups 3 and tp %d", xmp_ut_last_error(), tp);
        CHECK(xmp_ut_layer_create_tp(&c, XMP_UT_DOWN1, 2, &t) == NULL,
              "layer with groups 3 over tp %d created", tp);
    }
    xmp_ut_config_init(&c, 8, 4, 0);
    xmp_ut_tp_t bad = {tp, tp, xmp_ut_tp_box_p_to_b, xmp_ut_tp_gather_channels, mesh};
    CHECK(xmp_ut_layer_create_tp(&c, XMP_UT_MID_A, 2, &bad) == NULL &&
              strstr(xmp_ut_last_error(), "rank"),
          "tp rank %d of %d accepted", tp, tp);
    if (tp > 1) {
        xmp_ut_tp_t nobox = {tp, g_rank, xmp_ut_tp_box_p_to_b, NULL, mesh};
        CHECK(xmp_ut_layer_create_tp(&c, XMP_UT_MID_A, 2, &nobox) == NULL,
              "tp %d without a boxing function accepted", tp);
    }
    CHECK(xmp_ut_tp_check(&c, 0) != 0, "tp 0 accepted");
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
        printf("test_utrans_tp: tp %d, seed %llu\n", size, (unsigned long long)seed);
    int *ranks = malloc(sizeof(int) * (size_t)size);
    for (int i = 0; i < size; i++)
        ranks[i] = i;
    int shape[2] = {1, size};
    xmp_mesh_t *mesh = NULL;
    if (xmp_mesh_create(MPI_COMM_WORLD, NULL, 2, shape, ranks, &mesh) != XMESH_SUCCESS) {
        printf("mesh: %s\n", xmp_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    /* head_dim 0 (= C): 1, 2, 4 heads at levels 1-3, so tp 2 replicates level 1's attention;
     * head_dim C/4: 4, 8, 16 heads, every attention head-split */
    const int head_dims[2] = {0, 2};
    for (int h = 0; h < 2; h++) {
        xmp_ut_config_t c;
        if (xmp_ut_config_init(&c, 8, 4, head_dims[h]) != 0) {
            printf("config: %s\n", xmp_ut_last_error());
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        xmp_ut_params_t pp;
        xmp_ut_params_layout(&c, &pp);
        if (g_rank == 0)
            printf("C 8, groups 4, head_dim %d:\n", c.head_dim);
        for (int l = 0; l < XMP_UT_LAYERS; l++) {
            g_state = seed * 1000003ull + (uint64_t)(h * 100 + l); /* the same on every rank */
            check_layer(&c, &pp, mesh, size, l, 2);
        }
    }
    check_refusals(size, mesh);
    int all = 0;
    MPI_Allreduce(&g_fail, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (g_rank == 0)
        printf("%s (%d failures, seed %llu)\n", all ? "FAILED" : "OK", all,
               (unsigned long long)seed);
    xmp_mesh_destroy(mesh);
    free(ranks);
    MPI_Finalize();
    return all ? 1 : 0;
}
