/* xmp_ckpt_open / xmp_ckpt_load: the manifest broadcast from rank 0, every
 * check before any destination byte is written, then per tensor either an
 * xmesh plan from the saved blocks (read by the ranks standing in for the
 * saved devices) to the destination layout, or direct reads of the file
 * ranges that intersect each destination block. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xmesh.h>

#include "ckpt/ckpt_internal.h"

xmesh_result_t ck_agree(MPI_Comm comm, xmesh_result_t rc);
xmesh_result_t ck_check_mesh(MPI_Comm comm, const char *name, const xmp_tensor_t *t);

/* ------------------------------------------------------------ open */

static xmesh_result_t read_text(const char *path, char **out, int64_t *len)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return ck_sys_err("open", path);
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return ck_sys_err("stat", path);
    }
    if (st.st_size > (1ll << 30)) {
        close(fd);
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: %lld bytes, too large for a manifest", path,
                       (long long)st.st_size);
    }
    char *t = malloc((size_t)st.st_size + 1);
    if (!t) {
        close(fd);
        return xmp_err(XMESH_ERR_NO_MEMORY, "%s: %lld bytes", path, (long long)st.st_size);
    }
    xmesh_result_t r = ck_pread_all(fd, t, (size_t)st.st_size, 0, path);
    close(fd);
    if (r) {
        free(t);
        return r;
    }
    t[st.st_size] = 0;
    if (strlen(t) != (size_t)st.st_size) {
        free(t);
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: contains a NUL byte (corrupted)", path);
    }
    *out = t;
    *len = st.st_size;
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_ckpt_open(MPI_Comm comm, const char *path, xmp_ckpt_t **out)
{
    int rank;
    MPI_Comm_rank(comm, &rank);
    xmesh_result_t r = XMESH_SUCCESS;
    char dir[CK_PATH_MAX] = {0}, mp[CK_PATH_MAX + 16];
    char *text = NULL;
    int64_t len = 0;
    xmp_ckpt_t *c = NULL;
    if (!path || !out)
        r = xmp_err(XMESH_ERR_INVALID_ARGUMENT, "xmp_ckpt_open: NULL argument");
    else if (strlen(path) > CK_PATH_MAX - 64)
        r = xmp_err(XMESH_ERR_INVALID_ARGUMENT, "xmp_ckpt_open: path too long: %s", path);
    if (!r && rank == 0) {
        struct stat st;
        snprintf(mp, sizeof mp, "%s/" CK_MANIFEST, path);
        if (stat(mp, &st) == 0) {
            snprintf(dir, sizeof dir, "%s", path);
        } else if (stat(path, &st) != 0) {
            r = ck_sys_err("checkpoint", path);
        } else {
            int64_t step;
            r = xmp_ckpt_latest(path, dir, sizeof dir, &step);
        }
        if (!r) {
            snprintf(mp, sizeof mp, "%s/" CK_MANIFEST, dir);
            r = read_text(mp, &text, &len);
        }
    }
    if ((r = ck_agree(comm, r)))
        return r;
    if ((r = xmp_bcast(dir, sizeof dir, MPI_CHAR, 0, comm, "checkpoint directory")) ||
        (r = xmp_bcast(&len, 1, MPI_INT64_T, 0, comm, "checkpoint manifest size")))
        return r;
    if (rank != 0 && !(text = malloc((size_t)len + 1)))
        r = xmp_err(XMESH_ERR_NO_MEMORY, "xmp_ckpt_open: %" PRId64 " bytes", len);
    if ((r = ck_agree(comm, r)))
        goto out;
    for (int64_t o = 0; o < len; o += 1 << 30) {
        int k = (int)(len - o < (1 << 30) ? len - o : (1 << 30));
        if ((r = xmp_bcast(text + o, k, MPI_CHAR, 0, comm, "checkpoint manifest")))
            goto out;
    }
    text[len] = 0;
    snprintf(mp, sizeof mp, "%s/" CK_MANIFEST, dir);
    c = calloc(1, sizeof *c);
    if (!c)
        r = xmp_err(XMESH_ERR_NO_MEMORY, "xmp_ckpt_open");
    else
        r = ck_manifest_parse(text, mp, c);
    if ((r = ck_agree(comm, r)))
        goto out;
    snprintf(c->dir, sizeof c->dir, "%s", dir);
    *out = c;
    c = NULL;
out:
    if (c) {
        ck_free_contents(c);
        free(c);
    }
    free(text);
    return r;
}

void xmp_ckpt_close(xmp_ckpt_t *c)
{
    if (!c)
        return;
    ck_free_contents(c);
    free(c);
}

const char *xmp_ckpt_dir(const xmp_ckpt_t *c)
{
    return c->dir;
}
int64_t xmp_ckpt_step(const xmp_ckpt_t *c)
{
    return c->step;
}
int xmp_ckpt_saved_ranks(const xmp_ckpt_t *c)
{
    return c->nfiles;
}
const char *xmp_ckpt_meta(const xmp_ckpt_t *c, const char *key)
{
    for (int i = 0; key && i < c->nmeta; i++)
        if (strcmp(c->keys[i], key) == 0)
            return c->vals[i];
    return NULL;
}
int xmp_ckpt_meta_count(const xmp_ckpt_t *c)
{
    return c->nmeta;
}
void xmp_ckpt_meta_at(const xmp_ckpt_t *c, int i, const char **key, const char **value)
{
    *key = c->keys[i];
    *value = c->vals[i];
}
int xmp_ckpt_tensor_count(const xmp_ckpt_t *c)
{
    return c->ntensors;
}
void xmp_ckpt_tensor_info(const xmp_ckpt_t *c, int i, xmp_ckpt_tensor_info_t *info)
{
    const ck_tensor_t *t = &c->tensors[i];
    memset(info, 0, sizeof *info);
    info->name = t->name;
    info->dtype = t->dtype;
    info->ndim = t->ndim;
    memcpy(info->shape, t->shape, sizeof info->shape);
    info->mesh_ndim = t->mnd;
    memcpy(info->mesh_shape, t->mshape, sizeof info->mesh_shape);
    memcpy(info->sbp, t->sbp, sizeof info->sbp);
    memcpy(info->store, t->store, sizeof info->store);
    info->nblocks = t->nblocks;
    int64_t z[XMP_MAX_DIMS] = {0};
    info->bytes = ck_count(t->ndim, z, t->shape) * (int64_t)xmesh_dtype_size(t->dtype);
}
int xmp_ckpt_find(const xmp_ckpt_t *c, const char *name)
{
    for (int i = 0; name && i < c->ntensors; i++)
        if (strcmp(c->tensors[i].name, name) == 0)
            return i;
    return -1;
}
int xmp_ckpt_file_count(const xmp_ckpt_t *c)
{
    return c->nfiles;
}
void xmp_ckpt_file_info(const xmp_ckpt_t *c, int i, xmp_ckpt_file_info_t *info)
{
    info->name = c->files[i].name;
    info->size = c->files[i].size;
    info->crc32 = c->files[i].crc;
}

static xmesh_result_t verify_file(const xmp_ckpt_t *c, int i, int crc)
{
    char p[CK_PATH_MAX + 80];
    snprintf(p, sizeof p, "%s/%s", c->dir, c->files[i].name);
    int64_t size;
    uint32_t got = 0;
    if (crc) {
        xmesh_result_t r = ck_file_crc(p, &size, &got);
        if (r)
            return r;
    } else {
        struct stat st;
        if (stat(p, &st) != 0)
            return ck_sys_err("stat", p);
        size = st.st_size;
    }
    if (size != c->files[i].size)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                       "%s: %" PRId64 " bytes, the manifest says %" PRId64
                       " (truncated or replaced)",
                       p, size, c->files[i].size);
    if (crc && got != c->files[i].crc)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                       "%s: CRC32 0x%08" PRIx32 ", the manifest says 0x%08" PRIx32 " (corrupted)",
                       p, got, c->files[i].crc);
    return XMESH_SUCCESS;
}

xmesh_result_t xmp_ckpt_verify_file(const xmp_ckpt_t *c, int i)
{
    if (!c || i < 0 || i >= c->nfiles)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "xmp_ckpt_verify_file: no file %d", i);
    return verify_file(c, i, 1);
}

/* ------------------------------------------------------------ load */

static _Thread_local xmp_ckpt_load_info_t g_info;

void xmp_ckpt_last_load_info(xmp_ckpt_load_info_t *info)
{
    *info = g_info;
}

/* A destination layout as gathered from every rank. */
typedef struct {
    char name[XMP_CKPT_NAME_MAX];
    int32_t dtype, ndim, mnd, msize, rank;
    int32_t mshape[XMP_MAX_MESH_DIMS], sk[XMP_MAX_MESH_DIMS], sd[XMP_MAX_MESH_DIMS];
    int64_t shape[XMP_MAX_DIMS];
} dhdr_t;

typedef struct {
    const dhdr_t *h;
    const int32_t *ranks; /* h->msize ranks of comm, row-major */
    int mi;               /* tensor index in the manifest */
    int local;            /* index into this rank's tensors[], -1 if not passed here */
} dst_t;

/* Bytes of a record's rank list, padded so that the next record's header stays 8-byte
 * aligned in the gathered buffer. */
static size_t rank_bytes(int32_t msize)
{
    return ((size_t)msize * sizeof(int32_t) + 7) & ~(size_t)7;
}

static int cmp_dst(const void *a, const void *b)
{
    const dst_t *x = a, *y = b;
    int c = strcmp(x->h->name, y->h->name);
    return c ? c : x->h->rank - y->h->rank;
}

static int same_dst(const dst_t *a, const dst_t *b)
{
    const dhdr_t *x = a->h, *y = b->h;
    if (x->dtype != y->dtype || x->ndim != y->ndim || x->mnd != y->mnd || x->msize != y->msize)
        return 0;
    for (int d = 0; d < x->ndim; d++)
        if (x->shape[d] != y->shape[d])
            return 0;
    for (int k = 0; k < x->mnd; k++)
        if (x->mshape[k] != y->mshape[k] || x->sk[k] != y->sk[k] ||
            (x->sk[k] == XMP_S && x->sd[k] != y->sd[k]))
            return 0;
    return memcmp(a->ranks, b->ranks, sizeof(int32_t) * (size_t)x->msize) == 0;
}

static void fmt_shape(char *buf, size_t n, int nd, const int64_t *s)
{
    size_t o = 0;
    o += (size_t)snprintf(buf + o, n - o, "[");
    for (int d = 0; d < nd && o < n; d++)
        o += (size_t)snprintf(buf + o, n - o, "%s%" PRId64, d ? "," : "", s[d]);
    if (o < n)
        snprintf(buf + o, n - o, "]");
}

/* Checks one destination tensor against the manifest. */
static xmesh_result_t check_against(const xmp_ckpt_t *c, dst_t *d)
{
    const dhdr_t *h = d->h;
    d->mi = xmp_ckpt_find(c, h->name);
    if (d->mi < 0)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                       "tensor '%s' is not in checkpoint %s (%d tensors there)", h->name, c->dir,
                       c->ntensors);
    const ck_tensor_t *t = &c->tensors[d->mi];
    int same = t->ndim == h->ndim;
    for (int k = 0; same && k < t->ndim; k++)
        same = t->shape[k] == h->shape[k];
    if (!same) {
        char a[160], b[160];
        fmt_shape(a, sizeof a, t->ndim, t->shape);
        fmt_shape(b, sizeof b, h->ndim, h->shape);
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                       "tensor '%s': checkpoint %s has shape %s, the destination %s", h->name,
                       c->dir, a, b);
    }
    if ((int)t->dtype != h->dtype)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                       "tensor '%s': checkpoint %s has dtype %s, the destination %s", h->name,
                       c->dir, xmesh_dtype_name(t->dtype),
                       xmesh_dtype_name((xmesh_dtype_t)h->dtype)
                           ? xmesh_dtype_name((xmesh_dtype_t)h->dtype)
                           : "unknown");
    return XMESH_SUCCESS;
}

/* Gathers the destination layouts of every rank and checks them; fills
 * *dsts (sorted by name, one per tensor) and *gbuf (owns the headers). */
static xmesh_result_t gather_dsts(MPI_Comm comm, const xmp_ckpt_t *c, const xmp_ckpt_tensor_t *ts,
                                  int n, unsigned flags, char **gbuf, dst_t **dsts, int *ndst)
{
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    xmesh_result_t r = XMESH_SUCCESS;
    size_t mybytes = 0;
    for (int i = 0; i < n; i++)
        mybytes += sizeof(dhdr_t) + rank_bytes(ts[i].t->mesh->size);
    char *mine = calloc(mybytes ? mybytes : 1, 1);
    int *counts = calloc((size_t)size, sizeof(int)), *displs = calloc((size_t)size, sizeof(int));
    char *all = NULL, *seen = NULL;
    dst_t *v = NULL;
    int nv = 0;
    if (!mine || !counts || !displs)
        r = xmp_err(XMESH_ERR_NO_MEMORY, "xmp_ckpt_load: layouts");
    else if (mybytes > INT_MAX)
        r = xmp_err(XMESH_ERR_UNSUPPORTED, "xmp_ckpt_load: %zu bytes of layouts", mybytes);
    if ((r = ck_agree(comm, r)))
        goto fail;
    size_t o = 0;
    for (int i = 0; i < n; i++) {
        const xmp_tensor_t *t = ts[i].t;
        dhdr_t h;
        memset(&h, 0, sizeof h);
        snprintf(h.name, sizeof h.name, "%s", ts[i].name);
        h.dtype = (int32_t)t->dtype;
        h.ndim = t->ndim;
        h.mnd = t->mesh->ndim;
        h.msize = t->mesh->size;
        h.rank = rank;
        for (int d = 0; d < t->ndim; d++)
            h.shape[d] = t->shape[d];
        for (int a = 0; a < h.mnd; a++) {
            h.mshape[a] = t->mesh->shape[a];
            h.sk[a] = (int32_t)t->sbp[a].kind;
            h.sd[a] = t->sbp[a].kind == XMP_S ? t->sbp[a].dim : 0;
        }
        memcpy(mine + o, &h, sizeof h);
        o += sizeof h;
        size_t next = o + rank_bytes(h.msize); /* padding stays zero (calloc) */
        for (int k = 0; k < h.msize; k++) {
            int32_t rk = t->mesh->ranks[k];
            memcpy(mine + o, &rk, sizeof rk);
            o += sizeof rk;
        }
        o = next;
    }
    int mb = (int)mybytes;
    if ((r = xmp_allgather(&mb, 1, counts, MPI_INT, comm, "checkpoint layout sizes")))
        goto fail;
    int64_t total = 0;
    for (int p = 0; p < size; p++) {
        displs[p] = (int)total;
        total += counts[p];
    }
    if (total > INT_MAX)
        r = xmp_err(XMESH_ERR_UNSUPPORTED, "xmp_ckpt_load: %" PRId64 " bytes of layouts", total);
    else if (!(all = malloc((size_t)(total ? total : 1))))
        r = xmp_err(XMESH_ERR_NO_MEMORY, "xmp_ckpt_load: %" PRId64 " bytes of layouts", total);
    if ((r = ck_agree(comm, r)))
        goto fail;
    if ((r = xmp_allgatherv_ctl(mine, mb, all, counts, displs, MPI_BYTE, comm,
                                "checkpoint layouts")))
        goto fail;

    /* every rank now holds every layout: the checks below decide the same
     * everywhere */
    int nrec = 0;
    for (int64_t q = 0; q < total; nrec++) {
        dhdr_t h;
        memcpy(&h, all + q, sizeof h);
        q += (int64_t)(sizeof h + rank_bytes(h.msize));
    }
    v = calloc((size_t)(nrec ? nrec : 1), sizeof *v);
    seen = calloc((size_t)size, 1);
    if (!v || !seen) {
        r = xmp_err(XMESH_ERR_NO_MEMORY, "xmp_ckpt_load: %d layouts", nrec);
        goto fail_local;
    }
    for (int64_t q = 0, i = 0; q < total; i++) {
        v[i].h = (const dhdr_t *)(void *)(all + q);
        v[i].ranks = (const int32_t *)(void *)(all + q + (int64_t)sizeof(dhdr_t));
        v[i].local = -1;
        q += (int64_t)(sizeof(dhdr_t) + rank_bytes(v[i].h->msize));
    }
    qsort(v, (size_t)nrec, sizeof *v, cmp_dst);
    for (int i = 0, j; i < nrec && !r; i = j) {
        memset(seen, 0, (size_t)size);
        int local = -1;
        for (j = i; j < nrec && strcmp(v[j].h->name, v[i].h->name) == 0; j++) {
            if (!same_dst(&v[i], &v[j])) {
                r = xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                            "tensor '%s': ranks %d and %d pass different destination layouts",
                            v[i].h->name, v[i].h->rank, v[j].h->rank);
                break;
            }
            seen[v[j].h->rank] = 1;
            if (v[j].h->rank == rank)
                for (int k = 0; k < n; k++)
                    if (strcmp(ts[k].name, v[j].h->name) == 0)
                        local = k;
        }
        if (r)
            break;
        for (int k = 0; k < v[i].h->msize; k++)
            if (!seen[v[i].ranks[k]]) {
                r = xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                            "tensor '%s': rank %d is a member of its destination mesh but did "
                            "not pass it",
                            v[i].h->name, v[i].ranks[k]);
                break;
            }
        if (r)
            break;
        v[nv] = v[i];
        v[nv].local = local;
        if ((r = check_against(c, &v[nv])))
            break;
        nv++;
    }
    if (!r && (flags & XMP_CKPT_STRICT)) {
        for (int m = 0; m < c->ntensors && !r; m++) {
            int found = 0;
            for (int i = 0; i < nv && !found; i++)
                found = v[i].mi == m;
            if (!found)
                r = xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                            "checkpoint %s: tensor '%s' has no destination (strict load: every "
                            "saved tensor must be loaded)",
                            c->dir, c->tensors[m].name);
        }
    }
fail_local:
    if ((r = ck_agree(comm, r)))
        goto fail;
    free(mine);
    free(counts);
    free(displs);
    free(seen);
    *gbuf = all;
    *dsts = v;
    *ndst = nv;
    return XMESH_SUCCESS;
fail:
    free(mine);
    free(counts);
    free(displs);
    free(seen);
    free(all);
    free(v);
    return r;
}

typedef struct {
    const xmp_ckpt_t *c;
    int *fds;
} files_t;

static xmesh_result_t file_fd(files_t *f, int i, int *fd, char *path, size_t n)
{
    snprintf(path, n, "%s/%s", f->c->dir, f->c->files[i].name);
    if (f->fds[i] < 0) {
        f->fds[i] = open(path, O_RDONLY);
        if (f->fds[i] < 0)
            return ck_sys_err("open", path);
    }
    *fd = f->fds[i];
    return XMESH_SUCCESS;
}

/* Reads the intersection of saved block k (in its file) with the
 * destination block [dlo, dlo + dext) into dst (dense, shape dext). */
static xmesh_result_t read_intersection(files_t *f, const ck_tensor_t *t, const ck_block_t *k,
                                        const int64_t *dlo, const int64_t *dext, char *dst)
{
    int nd = t->ndim;
    size_t esz = xmesh_dtype_size(t->dtype);
    int64_t a[XMP_MAX_DIMS] = {0}, ext[XMP_MAX_DIMS] = {0}, sext[XMP_MAX_DIMS] = {0};
    for (int d = 0; d < nd; d++) {
        int64_t lo = k->lo[d] > dlo[d] ? k->lo[d] : dlo[d];
        int64_t hi = k->hi[d] < dlo[d] + dext[d] ? k->hi[d] : dlo[d] + dext[d];
        if (hi <= lo)
            return XMESH_SUCCESS;
        a[d] = lo;
        ext[d] = hi - lo;
        sext[d] = k->hi[d] - k->lo[d];
    }
    char path[CK_PATH_MAX + 80];
    int fd;
    xmesh_result_t r = file_fd(f, k->file, &fd, path, sizeof path);
    if (r)
        return r;
    if (nd == 0) {
        g_info.bytes_read += (int64_t)esz;
        return ck_pread_all(fd, dst, esz, k->offset, path);
    }
    /* contiguous run: the innermost dims that both blocks hold in full */
    int m = nd - 1;
    int64_t run = ext[m];
    while (m > 0 && ext[m] == sext[m] && ext[m] == dext[m]) {
        m--;
        run *= ext[m];
    }
    int64_t idx[XMP_MAX_DIMS] = {0};
    for (;;) {
        int64_t so = 0, dof = 0;
        for (int d = 0; d < nd; d++) {
            int64_t p = a[d] + (d < m ? idx[d] : 0);
            so = so * sext[d] + (p - k->lo[d]);
            dof = dof * dext[d] + (p - dlo[d]);
        }
        r = ck_pread_all(fd, dst + dof * (int64_t)esz, (size_t)run * esz,
                         k->offset + so * (int64_t)esz, path);
        g_info.bytes_read += run * (int64_t)esz;
        if (r)
            return r;
        int d = m - 1;
        for (; d >= 0; d--) {
            if (++idx[d] < ext[d])
                break;
            idx[d] = 0;
        }
        if (d < 0)
            break;
    }
    return XMESH_SUCCESS;
}

/* Ranks standing in for the U saved blocks: block u goes to the unused rank
 * whose destination block overlaps it most (lowest rank on ties). */
static void place_sources(const ck_tensor_t *t, const dst_t *d, int size, int *src_ranks)
{
    int64_t(*dlo)[XMP_MAX_DIMS] = calloc((size_t)size, sizeof *dlo);
    int64_t(*dhi)[XMP_MAX_DIMS] = calloc((size_t)size, sizeof *dhi);
    char *in = calloc((size_t)size, 1), *used = calloc((size_t)size, 1);
    if (!dlo || !dhi || !in || !used) {
        for (int u = 0; u < t->nblocks; u++)
            src_ranks[u] = u;
        goto out;
    }
    xmp_sbp_t sbp[XMP_MAX_MESH_DIMS];
    for (int a = 0; a < d->h->mnd; a++) {
        sbp[a].kind = (xmp_sbp_kind_t)d->h->sk[a];
        sbp[a].dim = d->h->sd[a];
    }
    for (int k = 0; k < d->h->msize; k++) {
        int co[XMP_MAX_MESH_DIMS], rk = d->ranks[k];
        ck_coords(d->h->mshape, d->h->mnd, k, co);
        ck_block(d->h->mnd, d->h->mshape, t->ndim, t->shape, sbp, co, dlo[rk], dhi[rk]);
        in[rk] = 1;
    }
    for (int u = 0; u < t->nblocks; u++) {
        const ck_block_t *b = &t->blocks[u];
        int best = -1;
        int64_t bestv = -1;
        for (int rk = 0; rk < size; rk++) {
            if (used[rk])
                continue;
            int64_t vol = in[rk] ? 1 : 0;
            for (int k = 0; k < t->ndim && vol; k++) {
                int64_t lo = b->lo[k] > dlo[rk][k] ? b->lo[k] : dlo[rk][k];
                int64_t hi = b->hi[k] < dhi[rk][k] ? b->hi[k] : dhi[rk][k];
                vol *= hi > lo ? hi - lo : 0;
            }
            if (vol > bestv) {
                bestv = vol;
                best = rk;
            }
        }
        used[best] = 1;
        src_ranks[u] = best;
    }
out:
    free(dlo);
    free(dhi);
    free(in);
    free(used);
}

/* One tensor's part of a plan of many: its meshes, layouts and this rank's saved block. */
typedef struct {
    xmesh_mesh_t sm, dm;
    int *src_ranks, *dranks;
    char sspec[64], dspec[64];
    char *src; /* this rank's saved block (NULL: it holds none) */
} part_t;

static void part_free(part_t *p)
{
    xmesh_mesh_destroy(p->sm);
    xmesh_mesh_destroy(p->dm);
    free(p->src_ranks);
    free(p->dranks);
    free(p->src);
}

/* Meshes and specs of destination d's tensor t in pp; reads this rank's saved block. Local:
 * the caller agrees on the outcome. */
static xmesh_result_t part_init(MPI_Comm comm, xmesh_ctx_t ctx, files_t *f, const ck_tensor_t *t,
                                const dst_t *d, part_t *pp)
{
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    pp->src_ranks = malloc(sizeof(int) * (size_t)t->nblocks);
    pp->dranks = malloc(sizeof(int) * (size_t)d->h->msize);
    if (!pp->src_ranks || !pp->dranks)
        return xmp_err(XMESH_ERR_NO_MEMORY, "tensor '%s': plan", t->name);
    int cs[XMP_MAX_MESH_DIMS];
    ck_collapsed(t, cs);
    place_sources(t, d, size, pp->src_ranks);
    xmp_sbp_t dsbp[XMP_MAX_MESH_DIMS];
    for (int a = 0; a < d->h->mnd; a++) {
        /* P destinations are loaded as B, then zeroed off the holder */
        dsbp[a].kind = d->h->sk[a] == XMP_P ? XMP_B : (xmp_sbp_kind_t)d->h->sk[a];
        dsbp[a].dim = d->h->sd[a];
    }
    for (int k = 0; k < d->h->msize; k++)
        pp->dranks[k] = d->ranks[k];
    xmp_sbp_string(t->store, t->mnd, pp->sspec, sizeof pp->sspec);
    xmp_sbp_string(dsbp, d->h->mnd, pp->dspec, sizeof pp->dspec);
    xmesh_result_t r;
    if ((r = xmesh_mesh_create(ctx, t->mnd, cs, pp->src_ranks, &pp->sm)) ||
        (r = xmesh_mesh_create(ctx, d->h->mnd, d->h->mshape, pp->dranks, &pp->dm)))
        return xmp_err(r, "tensor '%s': xmesh mesh: %s", t->name, xmesh_last_error());
    size_t esz = xmesh_dtype_size(t->dtype);
    for (int u = 0; u < t->nblocks; u++) {
        if (pp->src_ranks[u] != rank)
            continue;
        const ck_block_t *b = &t->blocks[u];
        int64_t bytes = ck_count(t->ndim, b->lo, b->hi) * (int64_t)esz;
        if (!(pp->src = calloc((size_t)(bytes ? bytes : 1), 1)))
            return xmp_err(XMESH_ERR_NO_MEMORY, "tensor '%s': %" PRId64 " bytes", t->name, bytes);
        char path[CK_PATH_MAX + 80];
        int fd;
        if (bytes && !(r = file_fd(f, b->file, &fd, path, sizeof path)))
            r = ck_pread_all(fd, pp->src, (size_t)bytes, b->offset, path);
        g_info.bytes_read += bytes;
        if (r)
            return r;
    }
    return XMESH_SUCCESS;
}

/* Plan path for the k destinations ds[0..k) (stage[i]: this rank's staging block of ds[i],
 * NULL where it holds none): one plan of many tensors moves every saved block of the batch.
 * Collective over ctx; the same result on every rank. */
static xmesh_result_t load_plans(MPI_Comm comm, xmesh_ctx_t ctx, files_t *f, const dst_t *const *ds,
                                 void *const *stage, int k)
{
    const xmp_ckpt_t *c = f->c;
    xmesh_result_t r = XMESH_SUCCESS, rl = XMESH_SUCCESS;
    part_t *pp = calloc((size_t)k, sizeof *pp);
    xmesh_layout_t *sl = calloc((size_t)k, sizeof *sl), *dl = calloc((size_t)k, sizeof *dl);
    const void **srcs = calloc((size_t)k, sizeof *srcs);
    xmesh_plan_t plan = NULL;
    if (!pp || !sl || !dl || !srcs)
        rl = xmp_err(XMESH_ERR_NO_MEMORY, "checkpoint load: plan of %d tensors", k);
    for (int i = 0; i < k && !rl; i++) {
        const ck_tensor_t *t = &c->tensors[ds[i]->mi];
        rl = part_init(comm, ctx, f, t, ds[i], &pp[i]);
        sl[i] = (xmesh_layout_t){t->ndim, t->shape, t->dtype, pp[i].sm, pp[i].sspec};
        dl[i] = (xmesh_layout_t){t->ndim, t->shape, t->dtype, pp[i].dm, pp[i].dspec};
        srcs[i] = pp[i].src;
    }
    /* a failed read still leaves every rank agreeing before anything moves */
    if ((rl = ck_agree(comm, rl)))
        goto out;
    r = xmesh_plan_create_many(ctx, k, sl, dl, NULL, &plan);
    if (r) {
        const ck_tensor_t *t = &c->tensors[ds[0]->mi];
        rl = k == 1 ? xmp_err(r, "tensor '%s': xmesh plan %s -> %s: %s", t->name, pp[0].sspec,
                              pp[0].dspec, xmesh_last_error())
                    : xmp_err(r, "checkpoint load: xmesh plan of %d tensors (from '%s'): %s", k,
                              t->name, xmesh_last_error());
    }
    if ((rl = ck_agree(comm, rl)))
        goto out;
    g_info.plans++;
    r = xmesh_reshard_many(plan, srcs, stage);
    if (r)
        rl = xmp_err(r, "checkpoint load: reshard of %d tensors (from '%s'): %s", k,
                     c->tensors[ds[0]->mi].name, xmesh_last_error());
out:
    xmesh_plan_destroy(plan);
    for (int i = 0; pp && i < k; i++)
        part_free(&pp[i]);
    free(pp);
    free(sl);
    free(dl);
    free(srcs);
    return rl;
}

static int64_t tensor_bytes(const ck_tensor_t *t)
{
    int64_t n = (int64_t)xmesh_dtype_size(t->dtype);
    for (int d = 0; d < t->ndim; d++)
        n *= t->shape[d];
    return n;
}

/* Destinations ds[0..k) moved by plans of many tensors in manifest order, each plan carrying
 * at most XMESH_CKPT_PLAN_BYTES tensor bytes (at least one tensor; 0: one plan per tensor),
 * so the saved blocks held in memory at once stay within that budget. Collective. */
static xmesh_result_t load_batches(MPI_Comm comm, xmesh_ctx_t ctx, files_t *f,
                                   const dst_t *const *ds, void *const *stage, int k)
{
    int64_t budget;
    if (xmesh_param_get_int("XMESH_CKPT_PLAN_BYTES", &budget) != XMESH_SUCCESS)
        budget = 0;
    xmesh_result_t r = XMESH_SUCCESS;
    for (int i = 0; i < k && !r;) {
        int j = i + 1;
        int64_t bytes = tensor_bytes(&f->c->tensors[ds[i]->mi]);
        while (j < k && budget > 0 && bytes + tensor_bytes(&f->c->tensors[ds[j]->mi]) <= budget)
            bytes += tensor_bytes(&f->c->tensors[ds[j++]->mi]);
        g_info.tensors_plan += j - i;
        r = load_plans(comm, ctx, f, ds + i, stage + i, j - i);
        i = j;
    }
    return r;
}

xmesh_result_t xmp_ckpt_load(MPI_Comm comm, xmesh_ctx_t ctx, const xmp_ckpt_t *c,
                             const xmp_ckpt_tensor_t *tensors, int n, const xmp_ckpt_kv_t *expect,
                             int nexpect, unsigned flags)
{
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    xmesh_result_t r = XMESH_SUCCESS;
    char *gbuf = NULL;
    dst_t *dsts = NULL;
    int ndst = 0;
    void **stage = NULL, **pst = NULL;
    const dst_t **pds = NULL;
    files_t files = {c, NULL};

    memset(&g_info, 0, sizeof g_info);

    /* 1. arguments and metadata (local, then agreed) */
    if (!c)
        r = xmp_err(XMESH_ERR_INVALID_ARGUMENT, "xmp_ckpt_load: no checkpoint");
    else if (n < 0 || (n && !tensors) || nexpect < 0 || (nexpect && !expect))
        r = xmp_err(XMESH_ERR_INVALID_ARGUMENT, "xmp_ckpt_load: %d tensors, %d expectations", n,
                    nexpect);
    else if (flags & ~(unsigned)(XMP_CKPT_STRICT | XMP_CKPT_LOAD_DIRECT | XMP_CKPT_LOAD_NO_VERIFY))
        r = xmp_err(XMESH_ERR_INVALID_ARGUMENT, "xmp_ckpt_load: unknown flags 0x%x", flags);
    if (ctx && !r) {
        int cs = -1;
        xmesh_ctx_size(ctx, &cs);
        if (cs != size)
            r = xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                        "xmp_ckpt_load: the context has %d ranks, the communicator %d", cs, size);
    }
    for (int i = 0; i < n && !r; i++) {
        if (!ck_name_ok(tensors[i].name))
            r = xmp_err(XMESH_ERR_INVALID_ARGUMENT, "tensor %d: bad name '%s'", i,
                        tensors[i].name ? tensors[i].name : "(null)");
        else if (!tensors[i].t)
            r = xmp_err(XMESH_ERR_INVALID_ARGUMENT, "tensor '%s': NULL tensor", tensors[i].name);
        else
            r = ck_check_mesh(comm, tensors[i].name, tensors[i].t);
        for (int j = 0; j < i && !r; j++)
            if (strcmp(tensors[i].name, tensors[j].name) == 0)
                r = xmp_err(XMESH_ERR_INVALID_ARGUMENT, "tensor name '%s' passed twice",
                            tensors[i].name);
        if (!r && tensors[i].t->mesh->member && tensors[i].t->lcount > 0 && !tensors[i].t->data)
            r = xmp_err(XMESH_ERR_INVALID_ARGUMENT, "tensor '%s': no data", tensors[i].name);
    }
    for (int i = 0; i < nexpect && !r; i++) {
        const char *have = expect[i].key ? xmp_ckpt_meta(c, expect[i].key) : NULL;
        if (!expect[i].key || !expect[i].value)
            r = xmp_err(XMESH_ERR_INVALID_ARGUMENT, "xmp_ckpt_load: expectation %d is NULL", i);
        else if (!have)
            r = xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                        "%s/" CK_MANIFEST ": metadata '%s' is missing, expected '%s'", c->dir,
                        expect[i].key, expect[i].value);
        else if (strcmp(have, expect[i].value) != 0)
            r = xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                        "%s/" CK_MANIFEST ": metadata '%s' is '%s', expected '%s' (a checkpoint "
                        "of another model or configuration?)",
                        c->dir, expect[i].key, have, expect[i].value);
    }
    if ((r = ck_agree(comm, r)))
        return r;

    /* 2. destination layouts against the manifest */
    if ((r = gather_dsts(comm, c, tensors, n, flags, &gbuf, &dsts, &ndst)))
        return r;

    /* 3. shard files: presence, size, CRC32, spread over the ranks */
    for (int i = rank; i < c->nfiles && !r; i += size) {
        r = verify_file(c, i, !(flags & XMP_CKPT_LOAD_NO_VERIFY));
        if (!r && !(flags & XMP_CKPT_LOAD_NO_VERIFY))
            g_info.bytes_checked += c->files[i].size;
    }
    if ((r = ck_agree(comm, r)))
        goto out;

    /* 4. staging buffers: the destination blocks, written last */
    stage = calloc((size_t)(n ? n : 1), sizeof *stage);
    files.fds = malloc(sizeof(int) * (size_t)(c->nfiles ? c->nfiles : 1));
    if (!stage || !files.fds)
        r = xmp_err(XMESH_ERR_NO_MEMORY, "xmp_ckpt_load: %d tensors", n);
    for (int i = 0; files.fds && i < c->nfiles; i++)
        files.fds[i] = -1;
    for (int i = 0; i < n && !r; i++) {
        const xmp_tensor_t *t = tensors[i].t;
        if (!t->mesh->member)
            continue;
        size_t bytes = (size_t)t->lcount * xmesh_dtype_size(t->dtype);
        if (!(stage[i] = calloc(bytes ? bytes : 1, 1)))
            r = xmp_err(XMESH_ERR_NO_MEMORY, "tensor '%s': staging %zu bytes", tensors[i].name,
                        bytes);
    }
    if ((r = ck_agree(comm, r)))
        goto out;

    /* 5. tensors whose saved blocks fit the ranks: plans of many (one while they fit
     * XMESH_CKPT_PLAN_BYTES); the others: each destination rank reads its own block */
    pds = malloc(sizeof *pds * (size_t)(ndst ? ndst : 1));
    pst = malloc(sizeof *pst * (size_t)(ndst ? ndst : 1));
    if (!pds || !pst)
        r = xmp_err(XMESH_ERR_NO_MEMORY, "xmp_ckpt_load: %d tensors", ndst);
    if ((r = ck_agree(comm, r)))
        goto out;
    int npl = 0;
    for (int g = 0; g < ndst && !r; g++) {
        const dst_t *d = &dsts[g];
        const ck_tensor_t *t = &c->tensors[d->mi];
        void *st = d->local >= 0 && tensors[d->local].t->mesh->member ? stage[d->local] : NULL;
        if (ctx && !(flags & XMP_CKPT_LOAD_DIRECT) && t->nblocks <= size) {
            pds[npl] = d;
            pst[npl++] = st;
            continue;
        }
        g_info.tensors_direct++;
        const xmp_tensor_t *dt = st ? tensors[d->local].t : NULL;
        for (int u = 0; dt && u < t->nblocks && !r; u++)
            r = read_intersection(&files, t, &t->blocks[u], dt->loff, dt->lshape, st);
        r = ck_agree(comm, r);
    }
    if (!r && npl)
        r = ck_agree(comm, load_batches(comm, ctx, &files, pds, pst, npl));
    if (r)
        goto out;

    /* 6. every rank has every block: commit */
    for (int i = 0; i < n; i++) {
        xmp_tensor_t *t = tensors[i].t;
        if (!t->mesh->member)
            continue;
        int holder = 1;
        for (int a = 0; a < t->mesh->ndim; a++)
            if (t->sbp[a].kind == XMP_P && t->mesh->coord[a] != 0)
                holder = 0;
        size_t bytes = (size_t)t->lcount * xmesh_dtype_size(t->dtype);
        if (!bytes)
            continue;
        if (holder)
            memcpy(t->data, stage[i], bytes);
        else
            memset(t->data, 0, bytes);
    }
out:
    for (int i = 0; stage && i < n; i++)
        free(stage[i]);
    free(stage);
    for (int i = 0; files.fds && i < c->nfiles; i++)
        if (files.fds[i] >= 0)
            close(files.fds[i]);
    free(files.fds);
    free(pds);
    free(pst);
    free(gbuf);
    free(dsts);
    return r;
}
