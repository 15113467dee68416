/* SBP meshes and tensors: mesh communicators, local-block math, spec strings,
 * the fill helper. Boxing (and the gather helper, a boxing to all-broadcast) is in
 * boxing.c; the communication and memory counters in stats.c. */
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nn/sbp.h"

/* Bytes of a tensor's local allocation (the same figure on alloc and on free). */
static int64_t alloc_bytes(const xmp_tensor_t *t)
{
    return (t->lcount ? t->lcount : 1) * 4;
}

/* ---------------------------------------------------------------- meshes */

xmesh_result_t xmp_mesh_create(MPI_Comm parent, xmesh_ctx_t ctx, int ndim, const int *shape,
                               const int *ranks, xmp_mesh_t **out)
{
    int prank, psize;
    if (!shape || !ranks || !out)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "xmp_mesh_create: %s is NULL",
                       !shape   ? "shape"
                       : !ranks ? "ranks"
                                : "out");
    if (ndim < 1 || ndim > XMP_MAX_MESH_DIMS)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "mesh ndim %d out of range [1, %d]", ndim,
                       XMP_MAX_MESH_DIMS);
    MPI_Comm_rank(parent, &prank);
    MPI_Comm_size(parent, &psize);
    int size = 1;
    for (int a = 0; a < ndim; a++) {
        if (shape[a] < 1)
            return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "mesh shape[%d] = %d, must be >= 1", a,
                           shape[a]);
        size *= shape[a];
    }
    if (size > psize)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "mesh of %d devices on a %d-rank communicator",
                       size, psize);
    int index = -1;
    for (int i = 0; i < size; i++) {
        if (ranks[i] < 0 || ranks[i] >= psize)
            return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "mesh rank %d (entry %d) out of [0, %d)",
                           ranks[i], i, psize);
        for (int j = 0; j < i; j++)
            if (ranks[j] == ranks[i])
                return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                               "mesh rank %d listed twice (entries %d and %d)", ranks[i], j, i);
        if (ranks[i] == prank)
            index = i;
    }
    /* The checks above see the same arguments on every rank; the ones below are local
     * (the ctx, memory), so the ranks agree on them before the first MPI_Comm_split: a rank
     * that returned early would leave the others blocked in it. */
    xmesh_result_t lr = XMESH_SUCCESS;
    xmp_mesh_t *m = NULL;
    if (ctx) {
        int cr = -1, cs = -1;
        xmesh_ctx_rank(ctx, &cr);
        xmesh_ctx_size(ctx, &cs);
        if (cr != prank || cs != psize)
            lr = xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                         "ctx (rank %d of %d) is not over the parent comm (rank %d of %d)", cr, cs,
                         prank, psize);
    }
    if (!lr) {
        m = calloc(1, sizeof *m);
        if (m)
            m->ranks = malloc(sizeof(int) * (size_t)size);
        if (!m || !m->ranks)
            lr = xmp_err(XMESH_ERR_NO_MEMORY, "xmp_mesh_create: out of memory");
    }
    int agree[2] = {lr ? 1 : 0, lr ? prank : -1};
    char keep[512];
    snprintf(keep, sizeof keep, "%s", xmp_last_error());
    xmesh_result_t ar = xmp_allreduce(agree, 2, MPI_INT, MPI_MAX, parent, "xmp_mesh_create");
    if (lr || ar || agree[0]) {
        if (m)
            free(m->ranks);
        free(m);
        if (lr)
            return xmp_err(lr, "%s", keep);
        if (ar)
            return ar;
        return xmp_err(XMESH_ERR_REMOTE,
                       "xmp_mesh_create: rank %d of the parent comm failed locally; no mesh "
                       "created",
                       agree[1]);
    }
    memcpy(m->ranks, ranks, sizeof(int) * (size_t)size);
    m->ndim = ndim;
    m->size = size;
    memcpy(m->shape, shape, sizeof(int) * (size_t)ndim);
    m->member = index >= 0;
    m->index = index;
    m->comm = MPI_COMM_NULL;
    for (int a = 0; a < XMP_MAX_MESH_DIMS; a++)
        m->axis[a] = MPI_COMM_NULL;
    if (index >= 0) {
        int i = index;
        for (int a = ndim - 1; a >= 0; a--) {
            m->coord[a] = i % shape[a];
            i /= shape[a];
        }
    }
    MPI_Comm_split(parent, m->member ? 0 : MPI_UNDEFINED, index, &m->comm);
    if (m->member) {
        for (int a = 0; a < ndim; a++) {
            /* colour: index with coordinate a zeroed; key: coordinate a */
            int stride = 1;
            for (int b = a + 1; b < ndim; b++)
                stride *= shape[b];
            int colour = index - m->coord[a] * stride;
            MPI_Comm_split(m->comm, colour, m->coord[a], &m->axis[a]);
        }
    }
    if (ctx) {
        xmesh_result_t r = xmesh_mesh_create(ctx, ndim, shape, ranks, &m->xmesh);
        if (r) {
            xmp_err(r, "xmesh_mesh_create: %s", xmesh_last_error());
            m->xmesh = NULL;
            xmp_mesh_destroy(m);
            return r;
        }
    }
    *out = m;
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_mesh_destroy(xmp_mesh_t *m)
{
    if (!m)
        return XMESH_SUCCESS;
    xmesh_result_t r = xmesh_mesh_destroy(m->xmesh);
    if (r)
        return xmp_err(r, "xmesh_mesh_destroy: %s", xmesh_last_error());
    for (int a = 0; a < XMP_MAX_MESH_DIMS; a++)
        if (m->axis[a] != MPI_COMM_NULL)
            MPI_Comm_free(&m->axis[a]);
    if (m->comm != MPI_COMM_NULL)
        MPI_Comm_free(&m->comm);
    free(m->ranks);
    free(m);
    return XMESH_SUCCESS;
}

/* ------------------------------------------------------------------- SBP */

xmesh_result_t xmp_sbp_parse(const char *s, int mesh_ndim, int tensor_ndim, xmp_sbp_t *sbp)
{
    xmp_sbp_t tmp[XMP_MAX_MESH_DIMS];
    int a = 0;
    const char *p = s;
    if (!s || !sbp)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "xmp_sbp_parse: NULL argument");
    while (*p) {
        if (*p == ',' || *p == ' ') {
            p++;
            continue;
        }
        if (a >= mesh_ndim)
            return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "sbp '%s': more than %d tokens", s,
                           mesh_ndim);
        if (*p == 'B' || *p == 'P') {
            tmp[a++] = *p == 'B' ? xmp_sbp_b() : xmp_sbp_p();
            p++;
        } else {
            int d, n = 0;
            if (sscanf(p, "S(%d)%n", &d, &n) != 1 || n == 0)
                return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "sbp '%s': bad token at offset %d", s,
                               (int)(p - s));
            if (d < 0 || d >= tensor_ndim)
                return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                               "sbp '%s': split dim %d out of range (tensor has %d dims)", s, d,
                               tensor_ndim);
            tmp[a++] = xmp_sbp_s(d);
            p += n;
        }
    }
    if (a != mesh_ndim)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "sbp '%s': %d tokens for a %d-d mesh", s, a,
                       mesh_ndim);
    memcpy(sbp, tmp, sizeof(xmp_sbp_t) * (size_t)mesh_ndim);
    return XMESH_SUCCESS;
}

static void split_range(int64_t n, int64_t k, int64_t i, int64_t *lo, int64_t *hi)
{
    /* numpy.array_split: the first n % k pieces have one more element */
    int64_t q = n / k, r = n % k;
    *lo = i * q + (i < r ? i : r);
    *hi = *lo + q + (i < r ? 1 : 0);
}

void xmp_block(const xmp_mesh_t *m, int ndim, const int64_t *shape, const xmp_sbp_t *sbp,
               const int *coord, int64_t *lo, int64_t *hi)
{
    for (int d = 0; d < ndim; d++) {
        int64_t k = 1, idx = 0;
        for (int a = 0; a < m->ndim; a++) /* ascending: lower axis major */
            if (sbp[a].kind == XMP_S && sbp[a].dim == d) {
                k *= m->shape[a];
                idx = idx * m->shape[a] + coord[a];
            }
        split_range(shape[d], k, idx, &lo[d], &hi[d]);
    }
}

xmesh_result_t xmp_sbp_check(const xmp_mesh_t *m, int ndim, const xmp_sbp_t *sbp, const char *what)
{
    for (int a = 0; a < m->ndim; a++) {
        if (sbp[a].kind != XMP_S && sbp[a].kind != XMP_B && sbp[a].kind != XMP_P)
            return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: mesh axis %d has unknown SBP kind %d",
                           what, a, (int)sbp[a].kind);
        if (sbp[a].kind == XMP_S && (sbp[a].dim < 0 || sbp[a].dim >= ndim))
            return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                           "%s: mesh axis %d: S(%d) split dim out of range (tensor has %d dims)",
                           what, a, sbp[a].dim, ndim);
    }
    return XMESH_SUCCESS;
}

void xmp_sbp_string(const xmp_sbp_t *sbp, int mesh_ndim, char *buf, size_t n)
{
    size_t o = 0;
    buf[0] = 0;
    for (int a = 0; a < mesh_ndim && o < n; a++) {
        const char *sep = a ? "," : "";
        if (sbp[a].kind == XMP_S)
            o += (size_t)snprintf(buf + o, n - o, "%sS(%d)", sep, sbp[a].dim);
        else
            o += (size_t)snprintf(buf + o, n - o, "%s%c", sep, sbp[a].kind == XMP_B ? 'B' : 'P');
    }
}

static xmesh_result_t tensor_alloc(xmp_tensor_t *t, xmp_mesh_t *mesh, int ndim,
                                   const int64_t *shape, xmesh_dtype_t dtype, const xmp_sbp_t *sbp,
                                   int zero)
{
    if (!t || !mesh || !sbp || (ndim && !shape))
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "xmp_tensor_alloc: NULL argument");
    if (ndim < 0 || ndim > XMP_MAX_DIMS)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "tensor ndim %d out of range [0, %d]", ndim,
                       XMP_MAX_DIMS);
    for (int d = 0; d < ndim; d++)
        if (shape[d] < 0)
            return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "tensor shape[%d] = %lld is negative", d,
                           (long long)shape[d]);
    if (dtype != XMESH_F32 && dtype != XMESH_I32)
        return xmp_err(XMESH_ERR_UNSUPPORTED, "tensor dtype %s: only f32 and i32",
                       xmesh_dtype_name(dtype) ? xmesh_dtype_name(dtype) : "unknown");
    xmesh_result_t r = xmp_sbp_check(mesh, ndim, sbp, "xmp_tensor_alloc");
    if (r)
        return r;
    xmp_tensor_t n;
    memset(&n, 0, sizeof n);
    n.ndim = ndim;
    n.dtype = dtype;
    n.mesh = mesh;
    for (int d = 0; d < ndim; d++)
        n.shape[d] = shape[d];
    memcpy(n.sbp, sbp, sizeof(xmp_sbp_t) * (size_t)mesh->ndim);
    xmp_sbp_string(sbp, mesh->ndim, n.spec, sizeof n.spec);
    n.lcount = 0;
    if (mesh->member) {
        int64_t lo[XMP_MAX_DIMS], hi[XMP_MAX_DIMS];
        xmp_block(mesh, ndim, shape, sbp, mesh->coord, lo, hi);
        n.lcount = 1;
        for (int d = 0; d < ndim; d++) {
            n.loff[d] = lo[d];
            n.lshape[d] = hi[d] - lo[d];
            n.lcount *= n.lshape[d];
        }
        size_t ne = (size_t)(n.lcount ? n.lcount : 1);
        n.data = zero ? calloc(ne, 4) : malloc(ne * 4);
        if (!n.data)
            return xmp_err(XMESH_ERR_NO_MEMORY, "xmp_tensor_alloc: %lld elements",
                           (long long)n.lcount);
    }
    if (n.data)
        xmp_mem_track(alloc_bytes(&n));
    *t = n;
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_tensor_alloc(xmp_tensor_t *t, xmp_mesh_t *mesh, int ndim, const int64_t *shape,
                                xmesh_dtype_t dtype, const xmp_sbp_t *sbp)
{
    return tensor_alloc(t, mesh, ndim, shape, dtype, sbp, 1);
}

xmesh_result_t xmp_tensor_alloc_uninit(xmp_tensor_t *t, xmp_mesh_t *mesh, int ndim,
                                       const int64_t *shape, xmesh_dtype_t dtype,
                                       const xmp_sbp_t *sbp)
{
    return tensor_alloc(t, mesh, ndim, shape, dtype, sbp, 0);
}

xmesh_result_t xmp_tensor_alloc_like(xmp_tensor_t *out, const xmp_tensor_t *t)
{
    return xmp_tensor_alloc(out, t->mesh, t->ndim, t->shape, t->dtype, t->sbp);
}

void xmp_tensor_free(xmp_tensor_t *t)
{
    if (!t)
        return;
    if (t->data)
        xmp_mem_track(-alloc_bytes(t));
    free(t->data);
    t->data = NULL;
    t->lcount = 0;
}

xmesh_result_t xmp_tensor_layout(const xmp_tensor_t *t, xmesh_layout_t *l)
{
    if (!t->mesh->xmesh)
        return xmp_err(XMESH_ERR_INVALID_USAGE, "tensor '%s': its mesh has no xmesh mesh (no ctx)",
                       t->spec);
    l->ndim = t->ndim;
    l->shape = t->shape;
    l->dtype = t->dtype;
    l->mesh = t->mesh->xmesh;
    l->sharding = t->spec;
    l->split = XMESH_SPLIT_NUMPY;
    return XMESH_SUCCESS;
}

/* Strided n-d copy of a box of extent ext from src (shape ss, at lo_s) to dst
 * (shape ds, at lo_d); elements of esz bytes. */
void xmp_copy_box(int ndim, const int64_t *ext, const void *src, const int64_t *ss,
                  const int64_t *lo_s, void *dst, const int64_t *ds, const int64_t *lo_d,
                  size_t esz)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= ext[d];
    if (n == 0)
        return;
    if (ndim == 0) {
        memcpy(dst, src, esz);
        return;
    }
    int64_t idx[XMP_MAX_DIMS] = {0};
    int64_t rows = n / ext[ndim - 1];
    size_t row_bytes = (size_t)ext[ndim - 1] * esz;
    for (int64_t r = 0; r < rows; r++) {
        int64_t so = 0, dof = 0;
        for (int d = 0; d < ndim; d++) {
            so = so * ss[d] + lo_s[d] + idx[d];
            dof = dof * ds[d] + lo_d[d] + idx[d];
        }
        memcpy((char *)dst + dof * (int64_t)esz, (const char *)src + so * (int64_t)esz, row_bytes);
        for (int d = ndim - 2; d >= 0; d--) {
            if (++idx[d] < ext[d])
                break;
            idx[d] = 0;
        }
    }
}

xmesh_result_t xmp_tensor_fill_from_full(xmp_tensor_t *t, const void *full)
{
    if (!t->mesh->member)
        return XMESH_SUCCESS;
    for (int a = 0; a < t->mesh->ndim; a++)
        if (t->sbp[a].kind == XMP_P && t->mesh->coord[a] != 0) {
            memset(t->data, 0, (size_t)t->lcount * 4);
            return XMESH_SUCCESS;
        }
    int64_t zero[XMP_MAX_DIMS] = {0};
    xmp_copy_box(t->ndim, t->lshape, full, t->shape, t->loff, t->data, t->lshape, zero, 4);
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_check_f32(const xmp_tensor_t *t, const char *op, const char *name)
{
    if (!t)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: %s is NULL", op, name);
    if (t->dtype != XMESH_F32)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: %s has dtype %s, expected f32", op, name,
                       xmesh_dtype_name(t->dtype));
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_same_mesh(const xmp_tensor_t *a, const xmp_tensor_t *b, const char *op)
{
    if (a->mesh != b->mesh)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: operands '%s' and '%s' on different meshes",
                       op, a->spec, b->spec);
    return XMESH_SUCCESS;
}

void xmp_sbp_all_b(xmp_sbp_t *s)
{
    for (int a = 0; a < XMP_MAX_MESH_DIMS; a++)
        s[a] = xmp_sbp_b();
}

int64_t xmp_prod(const int64_t *s, int lo, int hi)
{
    int64_t v = 1;
    for (int d = lo; d < hi; d++)
        v *= s[d];
    return v;
}
