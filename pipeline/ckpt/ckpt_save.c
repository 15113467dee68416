/* xmp_ckpt_save: every rank writes its unique blocks into its own shard
 * file inside a temporary directory; rank 0 gathers the block tables,
 * writes the manifest and renames the directory into place. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_internal.h"

static int g_crash_after = -2; /* -2: not read from the environment yet */

void xmp_ckpt_test_crash_after(int nranks_written)
{
    g_crash_after = nranks_written < 0 ? -1 : nranks_written;
}

static int g_crash_exit;

static int crash_point(void)
{
    if (g_crash_after == -2) {
        char e[64] = "";
        (void)xmesh_param_get("XMESH_CKPT_CRASH", e, sizeof e, NULL); /* "" when too long */
        g_crash_after = *e ? atoi(e) : -1;
        g_crash_exit = strstr(e, ":exit") != NULL;
    }
    return g_crash_after;
}

/* Every rank ends with the same result: the error of the lowest failing rank
 * and its message. Collective over comm. */
xmesh_result_t ck_agree(MPI_Comm comm, xmesh_result_t rc)
{
    int rank, first, mine;
    MPI_Comm_rank(comm, &rank);
    mine = rc != XMESH_SUCCESS ? rank : INT_MAX;
    char msg[512];
    memset(msg, 0, sizeof msg);
    if (rc != XMESH_SUCCESS)
        snprintf(msg, sizeof msg, "%s", xmp_last_error());
    xmesh_result_t r;
    first = mine;
    /* every collective with the engine's deadline (nn/coll.h): a checkpoint never waits for a
     * rank that does not answer */
    if ((r = xmp_agree(&first, 1, MPI_INT, MPI_MIN, comm, "checkpoint status")))
        return r;
    if (first == INT_MAX)
        return XMESH_SUCCESS;
    int code = (int)rc;
    if ((r = xmp_bcast(msg, sizeof msg, MPI_CHAR, first, comm, "checkpoint error")) ||
        (r = xmp_bcast(&code, 1, MPI_INT, first, comm, "checkpoint error code")))
        return r;
    return xmp_err((xmesh_result_t)code, "%s", msg);
}

/* Checks that a tensor's mesh was created over comm (members only). */
xmesh_result_t ck_check_mesh(MPI_Comm comm, const char *name, const xmp_tensor_t *t)
{
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    const xmp_mesh_t *m = t->mesh;
    if (!m)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "tensor '%s': no mesh", name);
    if (m->ndim < 1 || m->ndim > XMP_MAX_MESH_DIMS || m->size > size)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                       "tensor '%s': mesh of %d devices does not fit the %d ranks of the "
                       "communicator",
                       name, m->size, size);
    for (int i = 0; i < m->size; i++)
        if (m->ranks[i] < 0 || m->ranks[i] >= size)
            return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                           "tensor '%s': mesh rank %d is not a rank of the communicator", name,
                           m->ranks[i]);
    if (m->member && m->ranks[m->index] != rank)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                       "tensor '%s': its mesh was not created over this communicator (mesh "
                       "device %d is rank %d, this is rank %d)",
                       name, m->index, m->ranks[m->index], rank);
    if (t->ndim < 0 || t->ndim > XMP_MAX_DIMS || xmesh_dtype_size(t->dtype) == 0)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "tensor '%s': bad ndim %d or dtype %d", name,
                       t->ndim, (int)t->dtype);
    return xmp_sbp_check(m, t->ndim, t->sbp, name);
}

/* One record per block written, sent to rank 0: the tensor's description,
 * which distinct block and where (about 420 bytes per block). */
typedef struct {
    char name[XMP_CKPT_NAME_MAX];
    int32_t dtype, ndim, mnd, block, file, rank;
    int32_t mshape[XMP_MAX_MESH_DIMS];
    int32_t sk[XMP_MAX_MESH_DIMS], sd[XMP_MAX_MESH_DIMS], tk[XMP_MAX_MESH_DIMS],
        td[XMP_MAX_MESH_DIMS];
    int64_t shape[XMP_MAX_DIMS], lo[XMP_MAX_DIMS], hi[XMP_MAX_DIMS];
    int64_t offset;
} rec_t;

static int cmp_rec(const void *a, const void *b)
{
    const rec_t *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : x->rank - y->rank;
}

static int rec_same_layout(const rec_t *a, const rec_t *b)
{
    if (a->dtype != b->dtype || a->ndim != b->ndim || a->mnd != b->mnd)
        return 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d])
            return 0;
    for (int x = 0; x < a->mnd; x++)
        if (a->mshape[x] != b->mshape[x] || a->sk[x] != b->sk[x] || a->tk[x] != b->tk[x] ||
            (a->sk[x] == XMP_S && a->sd[x] != b->sd[x]) ||
            (a->tk[x] == XMP_S && a->td[x] != b->td[x]))
            return 0;
    return 1;
}

/* Rank 0: builds the manifest from the records and file infos. */
static xmesh_result_t build_manifest(xmp_ckpt_t *c, rec_t *recs, int nrec)
{
    qsort(recs, (size_t)nrec, sizeof *recs, cmp_rec);
    int nt = 0;
    for (int i = 0; i < nrec; i++)
        if (i == 0 || strcmp(recs[i].name, recs[i - 1].name) != 0)
            nt++;
    c->tensors = calloc((size_t)(nt ? nt : 1), sizeof *c->tensors);
    if (!c->tensors)
        return xmp_err(XMESH_ERR_NO_MEMORY, "manifest: %d tensors", nt);
    for (int i = 0, j; i < nrec; i = j) {
        ck_tensor_t *t = &c->tensors[c->ntensors++];
        const rec_t *r0 = &recs[i];
        snprintf(t->name, sizeof t->name, "%s", r0->name);
        t->dtype = (xmesh_dtype_t)r0->dtype;
        t->ndim = r0->ndim;
        t->mnd = r0->mnd;
        memcpy(t->shape, r0->shape, sizeof t->shape);
        for (int a = 0; a < t->mnd; a++) {
            t->mshape[a] = r0->mshape[a];
            t->sbp[a].kind = (xmp_sbp_kind_t)r0->sk[a];
            t->sbp[a].dim = r0->sd[a];
            t->store[a].kind = (xmp_sbp_kind_t)r0->tk[a];
            t->store[a].dim = r0->td[a];
        }
        int64_t nb = ck_nblocks(t);
        t->nblocks = (int)nb;
        t->blocks = malloc(sizeof *t->blocks * (size_t)(nb ? nb : 1));
        if (!t->blocks)
            return xmp_err(XMESH_ERR_NO_MEMORY, "manifest: tensor '%s'", t->name);
        for (int u = 0; u < nb; u++)
            t->blocks[u].file = -1;
        for (j = i; j < nrec && strcmp(recs[j].name, r0->name) == 0; j++) {
            const rec_t *r = &recs[j];
            if (!rec_same_layout(r0, r))
                return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                               "tensor '%s': ranks %d and %d pass different layouts (shape, "
                               "dtype, mesh or SBP)",
                               t->name, r0->rank, r->rank);
            if (r->block < 0)
                continue;
            if (r->block >= nb || t->blocks[r->block].file >= 0)
                return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                               "tensor '%s': block %d written twice (ranks %d and %d): are two "
                               "meshes using the same name?",
                               t->name, r->block, t->blocks[r->block].file, r->rank);
            ck_block_t *k = &t->blocks[r->block];
            k->file = r->file;
            k->offset = r->offset;
            memcpy(k->lo, r->lo, sizeof k->lo);
            memcpy(k->hi, r->hi, sizeof k->hi);
        }
        for (int u = 0; u < nb; u++)
            if (t->blocks[u].file < 0)
                return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                               "tensor '%s': no rank wrote block %d of %" PRId64
                               " (a member of its mesh did not pass it)",
                               t->name, u, nb);
    }
    return XMESH_SUCCESS;
}

static xmesh_result_t validate(MPI_Comm comm, const char *root, const xmp_ckpt_tensor_t *ts, int n,
                               const xmp_ckpt_kv_t *meta, int nmeta, int rank)
{
    if (!root || !*root)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "xmp_ckpt_save: no directory");
    if (strlen(root) > CK_PATH_MAX - 64)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "xmp_ckpt_save: path too long: %s", root);
    if (n < 0 || (n && !ts))
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "xmp_ckpt_save: %d tensors", n);
    for (int i = 0; i < n; i++) {
        if (!ck_name_ok(ts[i].name))
            return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                           "tensor %d: name '%s' must be 1..%d printable characters without "
                           "blanks",
                           i, ts[i].name ? ts[i].name : "(null)", XMP_CKPT_NAME_MAX - 1);
        for (int j = 0; j < i; j++)
            if (strcmp(ts[i].name, ts[j].name) == 0)
                return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "tensor name '%s' passed twice",
                               ts[i].name);
        if (!ts[i].t)
            return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "tensor '%s': NULL tensor", ts[i].name);
        xmesh_result_t r = ck_check_mesh(comm, ts[i].name, ts[i].t);
        if (r)
            return r;
        const xmp_tensor_t *t = ts[i].t;
        if (ts[i].store && (r = xmp_sbp_check(t->mesh, t->ndim, ts[i].store, ts[i].name)))
            return r;
        const xmp_sbp_t *f = ts[i].store ? ts[i].store : t->sbp;
        for (int a = 0; a < t->mesh->ndim; a++)
            if (f[a].kind == XMP_P)
                return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                               "tensor '%s': %s SBP is P (partial sums) on mesh axis %d: a "
                               "checkpoint holds values, give a storage SBP without P (B or S)",
                               ts[i].name, ts[i].store ? "storage" : "its", a);
        if (t->mesh->member && t->lcount > 0 && !t->data)
            return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "tensor '%s': no data", ts[i].name);
    }
    if (rank == 0) {
        if (nmeta < 0 || (nmeta && !meta))
            return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "xmp_ckpt_save: %d metadata entries", nmeta);
        for (int i = 0; i < nmeta; i++) {
            if (!ck_name_ok(meta[i].key) || !meta[i].value)
                return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                               "metadata %d: key '%s' must be 1..%d printable characters "
                               "without blanks, value not NULL",
                               i, meta[i].key ? meta[i].key : "(null)", XMP_CKPT_NAME_MAX - 1);
            for (int j = 0; j < i; j++)
                if (strcmp(meta[i].key, meta[j].key) == 0)
                    return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "metadata key '%s' given twice",
                                   meta[i].key);
        }
    }
    return XMESH_SUCCESS;
}

/* Writes this rank's shard; fills one record per tensor it passes. */
static xmesh_result_t write_shard(const char *path, int rank, const xmp_ckpt_tensor_t *ts, int n,
                                  xmp_tensor_t *boxed, rec_t *recs, int *nrec, int64_t *size,
                                  uint32_t *crc)
{
    int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    if (fd < 0)
        return ck_sys_err("create", path);
    xmesh_result_t r = XMESH_SUCCESS;
    int64_t off = 0;
    uint32_t c = ck_crc(0, NULL, 0);
    *nrec = 0;
    for (int i = 0; i < n && !r; i++) {
        const xmp_tensor_t *t = ts[i].t;
        const xmp_mesh_t *m = t->mesh;
        if (!m->member)
            continue;
        const xmp_tensor_t *w = boxed[i].mesh ? &boxed[i] : t;
        const xmp_sbp_t *f = ts[i].store ? ts[i].store : t->sbp;
        int writer = 1, u = 0;
        for (int a = 0; a < m->ndim; a++) {
            if (f[a].kind == XMP_S)
                u = u * m->shape[a] + m->coord[a];
            else if (m->coord[a] != 0)
                writer = 0;
        }
        if (!writer)
            continue; /* a replica: the rank at coordinate 0 of the B axes writes it */
        rec_t *rc = &recs[(*nrec)++];
        memset(rc, 0, sizeof *rc);
        snprintf(rc->name, sizeof rc->name, "%s", ts[i].name);
        rc->dtype = (int32_t)t->dtype;
        rc->ndim = t->ndim;
        rc->mnd = m->ndim;
        rc->rank = rank;
        rc->block = -1;
        for (int d = 0; d < t->ndim; d++)
            rc->shape[d] = t->shape[d];
        for (int a = 0; a < m->ndim; a++) {
            rc->mshape[a] = m->shape[a];
            rc->sk[a] = (int32_t)t->sbp[a].kind;
            rc->sd[a] = t->sbp[a].kind == XMP_S ? t->sbp[a].dim : 0;
            rc->tk[a] = (int32_t)f[a].kind;
            rc->td[a] = f[a].kind == XMP_S ? f[a].dim : 0;
        }
        size_t bytes = (size_t)w->lcount * xmesh_dtype_size(t->dtype);
        rc->block = u;
        rc->file = rank;
        rc->offset = off;
        for (int d = 0; d < t->ndim; d++) {
            rc->lo[d] = w->loff[d];
            rc->hi[d] = w->loff[d] + w->lshape[d];
        }
        if (bytes) {
            r = ck_write_all(fd, w->data, bytes, path);
            c = ck_crc(c, w->data, bytes);
            off += (int64_t)bytes;
        }
    }
    if (!r && fsync(fd) != 0)
        r = ck_sys_err("fsync", path);
    if (close(fd) != 0 && !r)
        r = ck_sys_err("close", path);
    *size = off;
    *crc = c;
    return r;
}

/* Rank 0: removes leftovers of interrupted saves (.step-*.tmp). */
static void remove_stale_tmp(const char *root)
{
    char p[CK_PATH_MAX];
    for (int pass = 0; pass < 1; pass++) {
        DIR *d = opendir(root);
        if (!d)
            return;
        struct dirent *e;
        while ((e = readdir(d))) {
            size_t l = strlen(e->d_name);
            if (strncmp(e->d_name, ".step-", 6) == 0 && l > 4 &&
                strcmp(e->d_name + l - 4, ".tmp") == 0) {
                snprintf(p, sizeof p, "%s/%s", root, e->d_name);
                ck_rmtree(p);
            }
        }
        closedir(d);
    }
}

xmesh_result_t xmp_ckpt_save(MPI_Comm comm, const char *root, int64_t step,
                             const xmp_ckpt_tensor_t *tensors, int n, const xmp_ckpt_kv_t *meta,
                             int nmeta, int keep)
{
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    xmesh_result_t r = validate(comm, root, tensors, n, meta, nmeta, rank);
    if (!r && step < 0)
        r = xmp_err(XMESH_ERR_INVALID_ARGUMENT, "xmp_ckpt_save: step %" PRId64 " < 0", step);
    if ((r = ck_agree(comm, r)))
        return r;

    xmp_tensor_t *boxed = calloc((size_t)(n ? n : 1), sizeof *boxed);
    rec_t *recs = calloc((size_t)(n ? n : 1), sizeof *recs);
    rec_t *all = NULL;
    int *counts = NULL, *displs = NULL;
    int64_t *finfo = NULL;
    xmp_ckpt_t man;
    ck_buf_t buf = {0};
    memset(&man, 0, sizeof man);
    char tmp[CK_PATH_MAX], fin[CK_PATH_MAX], shard[CK_PATH_MAX + 32];
    snprintf(tmp, sizeof tmp, "%s/.step-%08" PRId64 ".tmp", root, step);
    snprintf(fin, sizeof fin, "%s/" CK_STEP_FMT, root, step);
    snprintf(shard, sizeof shard, "%s/rank-%05d.bin", tmp, rank);
    if (!boxed || !recs)
        r = xmp_err(XMESH_ERR_NO_MEMORY, "xmp_ckpt_save: %d tensors", n);
    if ((r = ck_agree(comm, r)))
        goto out;

    /* storage SBPs: box (collective over each tensor's mesh) */
    for (int i = 0; i < n; i++) {
        const xmp_tensor_t *t = tensors[i].t;
        int differs = 0;
        if (!tensors[i].store || !t->mesh->member)
            continue;
        for (int a = 0; a < t->mesh->ndim; a++)
            differs |= !xmp_sbp_eq(t->sbp[a], tensors[i].store[a]);
        if (differs) {
            xmesh_result_t rb = xmp_box(t, tensors[i].store, &boxed[i]);
            if (rb && !r)
                r = xmp_err(rb, "tensor '%s': boxing to its storage SBP: %s", tensors[i].name,
                            xmp_last_error());
        }
    }
    if ((r = ck_agree(comm, r)))
        goto out;

    if (rank == 0) {
        r = ck_mkdirs(root);
        if (!r) {
            remove_stale_tmp(root);
            if (mkdir(tmp, 0755) != 0)
                r = ck_sys_err("mkdir", tmp);
        }
    }
    if ((r = ck_agree(comm, r)))
        goto out;

    int crash = crash_point(), nrec = 0;
    int64_t fsize = 0;
    uint32_t fcrc = 0;
    if (crash < 0 || rank < crash)
        r = write_shard(shard, rank, tensors, n, boxed, recs, &nrec, &fsize, &fcrc);
    if ((r = ck_agree(comm, r)))
        goto out;
    if (crash >= 0) {
        if (g_crash_exit) {
            fprintf(stderr,
                    "xmp_ckpt_save: XMESH_CKPT_CRASH: rank %d exits after the shards of "
                    "ranks < %d\n",
                    rank, crash);
            _exit(86); /* as a killed process: no cleanup, no MPI_Finalize */
        }
        r = xmp_err(XMESH_ERR_INTERNAL,
                    "simulated crash (XMESH_CKPT_CRASH=%d) after the shards of ranks < %d were "
                    "written to %s",
                    crash, crash, tmp);
        goto out;
    }

    /* block tables and file infos to rank 0 */
    int64_t mine[2] = {fsize, (int64_t)fcrc};
    int nbytes = nrec * (int)sizeof(rec_t);
    if (rank == 0) {
        counts = calloc((size_t)size, sizeof *counts);
        displs = calloc((size_t)size, sizeof *displs);
        finfo = calloc((size_t)size * 2, sizeof *finfo);
    }
    if ((r = xmp_gather(&nbytes, 1, counts, MPI_INT, 0, comm, "checkpoint table sizes")) ||
        (r = xmp_gather(mine, 2, finfo, MPI_INT64_T, 0, comm, "checkpoint file infos")))
        goto out;
    int64_t total = 0;
    if (rank == 0) {
        for (int p = 0; p < size; p++) {
            displs[p] = (int)total;
            total += counts[p];
        }
        if (total > INT_MAX)
            r = xmp_err(XMESH_ERR_UNSUPPORTED,
                        "xmp_ckpt_save: block tables of %" PRId64
                        " bytes (too many tensors x ranks)",
                        total);
        else if (!(all = malloc((size_t)(total ? total : 1))))
            r = xmp_err(XMESH_ERR_NO_MEMORY, "xmp_ckpt_save: block tables");
    }
    if ((r = ck_agree(comm, r)))
        goto out;
    if ((r = xmp_gatherv(recs, nbytes, all, counts, displs, MPI_BYTE, 0, comm,
                         "checkpoint block tables")))
        goto out;

    if (rank == 0 && !r) {
        man.step = step;
        man.nfiles = size;
        man.files = calloc((size_t)size, sizeof *man.files);
        man.nmeta = nmeta;
        man.keys = calloc((size_t)(nmeta ? nmeta : 1), sizeof(char *));
        man.vals = calloc((size_t)(nmeta ? nmeta : 1), sizeof(char *));
        if (!man.files || !man.keys || !man.vals)
            r = xmp_err(XMESH_ERR_NO_MEMORY, "xmp_ckpt_save: manifest");
        for (int i = 0; i < nmeta && !r; i++) {
            man.keys[i] = (char *)meta[i].key; /* borrowed, reset before freeing */
            man.vals[i] = (char *)meta[i].value;
        }
        for (int p = 0; p < size && !r; p++) {
            snprintf(man.files[p].name, sizeof man.files[p].name, "rank-%05d.bin", p);
            man.files[p].size = finfo[2 * p];
            man.files[p].crc = (uint32_t)finfo[2 * p + 1];
        }
        if (!r)
            r = build_manifest(&man, all, (int)(total / (int64_t)sizeof(rec_t)));
        if (!r) {
            ck_manifest_write(&buf, &man);
            if (buf.oom)
                r = xmp_err(XMESH_ERR_NO_MEMORY, "xmp_ckpt_save: manifest text");
        }
        if (!r) {
            char mp[CK_PATH_MAX + 32];
            snprintf(mp, sizeof mp, "%s/" CK_MANIFEST, tmp);
            int fd = open(mp, O_CREAT | O_WRONLY | O_TRUNC, 0644);
            if (fd < 0) {
                r = ck_sys_err("create", mp);
            } else {
                r = ck_write_all(fd, buf.data, buf.len, mp);
                if (!r && fsync(fd) != 0)
                    r = ck_sys_err("fsync", mp);
                if (close(fd) != 0 && !r)
                    r = ck_sys_err("close", mp);
            }
        }
        if (!r)
            r = ck_fsync_path(tmp, 1);
        if (!r) {
            struct stat st;
            if (stat(fin, &st) == 0) {
                /* same step saved again: swap atomically, then drop the old one */
                if (renameat2(AT_FDCWD, tmp, AT_FDCWD, fin, RENAME_EXCHANGE) != 0)
                    r = ck_sys_err("rename (exchange) into", fin);
                else
                    r = ck_rmtree(tmp);
            } else if (rename(tmp, fin) != 0) {
                r = ck_sys_err("rename into", fin);
            }
        }
        if (!r)
            r = ck_fsync_path(root, 1);
        if (!r)
            r = ck_set_latest(root, step);
        if (!r) {
            xmesh_result_t rk = ck_keep(root, keep, step);
            if (rk)
                fprintf(stderr, "xmp_ckpt_save: warning: keep %d: %s\n", keep, xmp_last_error());
        }
        for (int i = 0; i < man.nmeta && man.keys; i++)
            man.keys[i] = man.vals[i] = NULL;
    }
    r = ck_agree(comm, r);
    if (r && rank == 0)
        ck_rmtree(tmp);
out:
    for (int i = 0; i < n && boxed; i++)
        xmp_tensor_free(&boxed[i]);
    if (man.keys) {
        for (int i = 0; i < man.nmeta; i++)
            man.keys[i] = man.vals[i] = NULL;
    }
    ck_free_contents(&man);
    free(buf.data);
    free(boxed);
    free(recs);
    free(all);
    free(counts);
    free(displs);
    free(finfo);
    return r;
}
