/*
 * ScaLAPACK's redistribution routine as a baseline of xmesh-bench's 2d
 * suite ("scalapack-pdgemr2d"): what an HPC code moving a distributed
 * matrix between two process grids calls today.
 *
 * Mapping. xmesh blocks are row-major; ScaLAPACK's local arrays are
 * column-major. A row-major n0 x n1 matrix is, byte for byte, the
 * column-major n1 x n0 matrix M^T, so each layout is described to
 * ScaLAPACK as M^T on a BLACS grid of nprow = (parts of dim 1) by
 * npcol = (parts of dim 0): the local blocks are then passed as they are,
 * no copy, LLD = the local extent of dim 1. Block sizes are ceil(n/p), so
 * each process holds one block: a block layout. That equals xmesh's
 * numpy-style split only when both give the same extents (4095 over 4:
 * yes; 4097 over 4: 1025,1024,1024,1024 vs 1025,1025,1025,1022: no), and
 * ScaLAPACK has one owner per element, so replicated layouts (R over a
 * mesh axis of size > 1) cannot be expressed either: such rows are "n/a".
 *
 * Contexts. pdgemr2d's last argument is a context that spans every process
 * of both grids, all of which must call it (the routine's own notes); here
 * a 1 x (|src| + |dst|) grid over the union of the two meshes. Processes
 * outside a grid pass a descriptor whose CTXT is -1. All three grids come
 * from Cblacs_gridmap over the BLACS system context (MPI_COMM_WORLD, whose
 * ranks are the BLACS process numbers); gridmap creates a communicator
 * over that context, so every world rank calls it, members or not.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

#ifdef XMESH_BENCH_HAVE_SCALAPACK
/* BLACS's C interface and ScaLAPACK's Fortran entry point (Debian's
 * libscalapack-openmpi: 32-bit integers). No header ships with them. */
void Cblacs_pinfo(int *mypnum, int *nprocs);
void Cblacs_get(int ctxt, int what, int *val);
void Cblacs_gridmap(int *ctxt, int *usermap, int ldumap, int nprow, int npcol);
void Cblacs_gridinfo(int ctxt, int *nprow, int *npcol, int *myrow, int *mycol);
void Cblacs_gridexit(int ctxt);
void Cblacs_exit(int notdone);
void pdgemr2d_(const int *m, const int *n, const double *a, const int *ia, const int *ja,
               const int *desca, double *b, const int *ib, const int *jb, const int *descb,
               const int *ictxt);
#endif

/* Descriptor fields (0-based C view of ScaLAPACK's DESC array). */
enum { DT_, CTXT_, M_, N_, MB_, NB_, RSRC_, CSRC_, LLD_, DLEN_ };

/* One layout as a BLACS grid: map[q * nprow + p] is the world rank at
 * grid row p (a block of dim 1) and column q (a block of dim 0). */
typedef struct {
    int nprow, npcol;
    int mb, nb; /* block sizes of M^T's rows (dim 1) and columns (dim 0) */
    int *map;
} grid_t;

struct bench_scalapack {
    const bench_world_t *w;
    const bench_case_t *c;
    int uctx, actx, bctx; /* -1 where this rank is not in the grid */
    int desca[DLEN_], descb[DLEN_];
    int m, n; /* of M^T: shape[1] x shape[0] */
};

static int used;

int bench_scalapack_built(void)
{
#ifdef XMESH_BENCH_HAVE_SCALAPACK
    return 1;
#else
    return 0;
#endif
}

/* Checks that `l` is a block layout ScaLAPACK can hold and fills g. 0 on
 * success; 1 (not expressible, reason in why) or -1 (out of memory). */
static int layout_grid(const xm_layout_t *l, const char *side, grid_t *g, char *why, size_t wl)
{
    int axis_of[2] = {-1, -1}, parts[2] = {1, 1};
    int used_axis[XM_MAX_MESH_DIMS] = {0};
    memset(g, 0, sizeof *g);
    if (l->ndim != 2 || l->elem_size != 8) {
        snprintf(why, wl, "%s: needs a 2-D f64 matrix", side);
        return 1;
    }
    if (l->spec.partial_mask) {
        snprintf(why, wl, "%s: partial values", side);
        return 1;
    }
    for (int d = 0; d < 2; d++) {
        if (l->spec.naxes[d] > 1) {
            snprintf(why, wl, "%s: dim %d split over %d mesh axes", side, d, l->spec.naxes[d]);
            return 1;
        }
        if (l->spec.naxes[d] == 1) {
            axis_of[d] = l->spec.axes[d][0];
            parts[d] = l->mesh.shape[axis_of[d]];
            used_axis[axis_of[d]] = 1;
        }
    }
    for (int a = 0; a < l->mesh.ndim; a++)
        if (!used_axis[a] && l->mesh.shape[a] > 1) {
            snprintf(why, wl,
                     "%s: replicated over mesh axis %d; pdgemr2d has one owner per element", side,
                     a);
            return 1;
        }
    int64_t bs[2];
    for (int d = 0; d < 2; d++) {
        int64_t n = l->shape[d], k = parts[d];
        bs[d] = (n + k - 1) / k;
        for (int64_t i = 0; i < k; i++) {
            int64_t lo, hi, clo = i * bs[d], chi = (i + 1) * bs[d];
            xm_split(n, k, i, &lo, &hi);
            if (chi > n)
                chi = n;
            if (clo > n)
                clo = n;
            if (lo != clo || hi != chi) {
                snprintf(why, wl,
                         "%s: dim %d = %lld over %lld parts: numpy-style split is not "
                         "ceil(n/p) blocks",
                         side, d, (long long)n, (long long)k);
                return 1;
            }
        }
        if (bs[d] > 0x7fffffff || n > 0x7fffffff) {
            snprintf(why, wl, "%s: dim %d = %lld exceeds ScaLAPACK's int", side, d, (long long)n);
            return 1;
        }
    }
    g->nprow = parts[1];
    g->npcol = parts[0];
    g->mb = (int)(bs[1] > 0 ? bs[1] : 1);
    g->nb = (int)(bs[0] > 0 ? bs[0] : 1);
    g->map = malloc(sizeof(int) * (size_t)(g->nprow * g->npcol));
    if (!g->map)
        return -1;
    /* Row-major index of a mesh coordinate; axes that split nothing have
     * size 1 (checked above), so their coordinate is 0. */
    int stride[XM_MAX_MESH_DIMS], s = 1;
    for (int a = l->mesh.ndim - 1; a >= 0; a--) {
        stride[a] = s;
        s *= l->mesh.shape[a];
    }
    for (int q = 0; q < g->npcol; q++)
        for (int p = 0; p < g->nprow; p++) {
            int idx = 0;
            if (axis_of[1] >= 0)
                idx += p * stride[axis_of[1]];
            if (axis_of[0] >= 0)
                idx += q * stride[axis_of[0]];
            g->map[q * g->nprow + p] = l->mesh.devs[idx];
        }
    return 0;
}

bench_scalapack_t *bench_scalapack_setup(const bench_world_t *w, const bench_case_t *c,
                                         char *status, size_t status_len, char *why, size_t why_len)
{
    grid_t ga, gb;
    memset(&ga, 0, sizeof ga);
    memset(&gb, 0, sizeof gb);
    bench_scalapack_t *s = NULL;
    if (!bench_scalapack_built()) {
        snprintf(status, status_len, "not-built");
        snprintf(why, why_len, "xmesh-bench was configured without ScaLAPACK");
        return NULL;
    }
    int rc = layout_grid(&c->src, "source", &ga, why, why_len);
    if (!rc)
        rc = layout_grid(&c->dst, "destination", &gb, why, why_len);
    /* rc depends on the case alone except for out-of-memory: agree. */
    int worst = 0;
    MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (worst < 0 || rc < 0) {
        snprintf(status, status_len, "setup-failed");
        snprintf(why, why_len, "out of memory");
        goto out_free_grids;
    }
    if (rc) {
        snprintf(status, status_len, "n/a");
        goto out_free_grids;
    }
#ifdef XMESH_BENCH_HAVE_SCALAPACK
    s = calloc(1, sizeof *s);
    int nu = ga.nprow * ga.npcol + gb.nprow * gb.npcol;
    int *umap = malloc(sizeof(int) * (size_t)nu);
    int ok = s && umap, all = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all) {
        free(umap);
        snprintf(status, status_len, "setup-failed");
        snprintf(why, why_len, "out of memory");
        goto out_free_s;
    }
    s->w = w;
    s->c = c;
    /* The union, deduplicated (the bench's meshes are disjoint, but a
     * rank in both would appear twice and make gridmap fail). */
    int k = 0;
    for (int i = 0; i < ga.nprow * ga.npcol; i++)
        umap[k++] = ga.map[i];
    for (int i = 0; i < gb.nprow * gb.npcol; i++) {
        int dup = 0;
        for (int j = 0; j < k && !dup; j++)
            dup = umap[j] == gb.map[i];
        if (!dup)
            umap[k++] = gb.map[i];
    }
    int me, np, sys;
    Cblacs_pinfo(&me, &np);
    Cblacs_get(-1, 0, &sys);
    used = 1;
    s->uctx = s->actx = s->bctx = sys;
    Cblacs_gridmap(&s->uctx, umap, 1, 1, k);
    Cblacs_gridmap(&s->actx, ga.map, ga.nprow, ga.nprow, ga.npcol);
    Cblacs_gridmap(&s->bctx, gb.map, gb.nprow, gb.nprow, gb.npcol);
    free(umap);
    s->m = (int)c->shape[1];
    s->n = (int)c->shape[0];
    /* Descriptors; a rank outside a grid passes CTXT = -1. Sanity: BLACS
     * must have put this rank where the map says. */
    int bad = 0;
    const grid_t *gs[2] = {&ga, &gb};
    int *ctx[2] = {&s->actx, &s->bctx}, *desc[2] = {s->desca, s->descb};
    int index[2] = {c->src_index, c->dst_index};
    for (int side = 0; side < 2; side++) {
        int *d = desc[side];
        const grid_t *g = gs[side];
        memset(d, 0, sizeof(int) * DLEN_);
        d[DT_] = 1;
        d[CTXT_] = *ctx[side] >= 0 ? *ctx[side] : -1;
        d[M_] = s->m;
        d[N_] = s->n;
        d[MB_] = g->mb;
        d[NB_] = g->nb;
        d[LLD_] = 1;
        if ((*ctx[side] >= 0) != (index[side] >= 0)) {
            bad = 1;
            continue;
        }
        if (*ctx[side] < 0)
            continue;
        int pr, pc, myr, myc;
        Cblacs_gridinfo(*ctx[side], &pr, &pc, &myr, &myc);
        if (pr != g->nprow || pc != g->npcol || g->map[myc * g->nprow + myr] != w->rank)
            bad = 1;
        const int64_t *lo = side ? c->dst_lo : c->src_lo, *hi = side ? c->dst_hi : c->src_hi;
        if (hi[1] - lo[1] > 1)
            d[LLD_] = (int)(hi[1] - lo[1]);
    }
    all = 0;
    MPI_Allreduce(&bad, &all, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (all) {
        snprintf(status, status_len, "setup-failed");
        snprintf(why, why_len, "BLACS grids do not match the meshes");
        bench_scalapack_free(s);
        s = NULL;
    }
    goto out_free_grids;
out_free_s:
    free(s);
    s = NULL;
#else
    (void)w;
#endif
out_free_grids:
    free(ga.map);
    free(gb.map);
    return s;
}

int bench_scalapack_run(bench_scalapack_t *s, const double *src, double *dst)
{
#ifdef XMESH_BENCH_HAVE_SCALAPACK
    if (s->uctx < 0)
        return 0;
    double dummy_a = 0, dummy_b = 0;
    const int one = 1;
    pdgemr2d_(&s->m, &s->n, src ? src : &dummy_a, &one, &one, s->desca, dst ? dst : &dummy_b, &one,
              &one, s->descb, &s->uctx);
    return 0;
#else
    (void)s;
    (void)src;
    (void)dst;
    return -1;
#endif
}

void bench_scalapack_free(bench_scalapack_t *s)
{
    if (!s)
        return;
#ifdef XMESH_BENCH_HAVE_SCALAPACK
    if (s->actx >= 0)
        Cblacs_gridexit(s->actx);
    if (s->bctx >= 0)
        Cblacs_gridexit(s->bctx);
    if (s->uctx >= 0)
        Cblacs_gridexit(s->uctx);
#endif
    free(s);
}

void bench_scalapack_finalize(void)
{
#ifdef XMESH_BENCH_HAVE_SCALAPACK
    if (used)
        Cblacs_exit(1);
#endif
    used = 0;
}
