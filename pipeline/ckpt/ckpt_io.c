/* Checkpoint files: paths, atomic directory operations, CRC32 (zlib),
 * manifest text (write and parse). Format: docs/CHECKPOINT.md. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "ckpt/ckpt_internal.h"

/* ------------------------------------------------------------ strings */

int ck_name_ok(const char *s)
{
    if (!s || !*s || strlen(s) >= XMP_CKPT_NAME_MAX)
        return 0;
    for (const char *p = s; *p; p++)
        if (*p <= ' ' || *p == 0x7f)
            return 0;
    return 1;
}

void ck_buf_printf(ck_buf_t *b, const char *fmt, ...)
{
    va_list ap;
    for (;;) {
        size_t room = b->cap - b->len;
        va_start(ap, fmt);
        int k = b->data ? vsnprintf(b->data + b->len, room, fmt, ap) : -1;
        va_end(ap);
        if (k >= 0 && (size_t)k < room) {
            b->len += (size_t)k;
            return;
        }
        size_t ncap = b->cap ? b->cap * 2 : 4096;
        while (k >= 0 && ncap - b->len <= (size_t)k)
            ncap *= 2;
        char *nd = realloc(b->data, ncap);
        if (!nd) {
            b->oom = 1;
            return;
        }
        b->data = nd;
        b->cap = ncap;
    }
}

static void put_list(ck_buf_t *b, int n, const int64_t *v)
{
    if (n == 0) {
        ck_buf_printf(b, "-");
        return;
    }
    for (int i = 0; i < n; i++)
        ck_buf_printf(b, "%s%" PRId64, i ? "," : "", v[i]);
}

static void put_escaped(ck_buf_t *b, const char *s)
{
    for (const char *p = s; *p; p++) {
        if (*p == '\\')
            ck_buf_printf(b, "\\\\");
        else if (*p == '\n')
            ck_buf_printf(b, "\\n");
        else if (*p == '\r')
            ck_buf_printf(b, "\\r");
        else
            ck_buf_printf(b, "%c", *p);
    }
}

/* ------------------------------------------------------------ geometry */

void ck_collapsed(const ck_tensor_t *t, int *cshape)
{
    for (int a = 0; a < t->mnd; a++)
        cshape[a] = t->store[a].kind == XMP_S ? t->mshape[a] : 1;
}

int64_t ck_nblocks(const ck_tensor_t *t)
{
    int cs[XMP_MAX_MESH_DIMS];
    int64_t u = 1;
    ck_collapsed(t, cs);
    for (int a = 0; a < t->mnd; a++)
        u *= cs[a];
    return u;
}

void ck_coords(const int *shape, int nd, int64_t i, int *c)
{
    for (int a = nd - 1; a >= 0; a--) {
        c[a] = (int)(i % shape[a]);
        i /= shape[a];
    }
}

void ck_block(int mnd, const int *mshape, int nd, const int64_t *shape, const xmp_sbp_t *sbp,
              const int *coord, int64_t *lo, int64_t *hi)
{
    for (int d = 0; d < nd; d++) {
        int64_t k = 1, idx = 0;
        for (int a = 0; a < mnd; a++)
            if (sbp[a].kind == XMP_S && sbp[a].dim == d) {
                k *= mshape[a];
                idx = idx * mshape[a] + coord[a];
            }
        int64_t q = shape[d] / k, r = shape[d] % k;
        lo[d] = idx * q + (idx < r ? idx : r);
        hi[d] = lo[d] + q + (idx < r ? 1 : 0);
    }
}

int64_t ck_count(int nd, const int64_t *lo, const int64_t *hi)
{
    int64_t n = 1;
    for (int d = 0; d < nd; d++)
        n *= hi[d] - lo[d];
    return n;
}

/* ------------------------------------------------------------ files */

xmesh_result_t ck_sys_err(const char *what, const char *path)
{
    return xmp_err(XMESH_ERR_SYSTEM, "%s %s: %s (errno %d)", what, path, strerror(errno), errno);
}

xmesh_result_t ck_write_all(int fd, const void *p, size_t n, const char *path)
{
    const char *c = p;
    while (n) {
        ssize_t k = write(fd, c, n > (1u << 30) ? (1u << 30) : n);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return ck_sys_err("write", path);
        }
        c += k;
        n -= (size_t)k;
    }
    return XMESH_SUCCESS;
}

xmesh_result_t ck_pread_all(int fd, void *p, size_t n, int64_t off, const char *path)
{
    char *c = p;
    while (n) {
        ssize_t k = pread(fd, c, n > (1u << 30) ? (1u << 30) : n, (off_t)off);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return ck_sys_err("read", path);
        }
        if (k == 0)
            return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                           "%s: unexpected end of file at byte %" PRId64 " (truncated?)", path,
                           off);
        c += k;
        n -= (size_t)k;
        off += k;
    }
    return XMESH_SUCCESS;
}

xmesh_result_t ck_fsync_path(const char *path, int dir)
{
    int fd = open(path, dir ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
    if (fd < 0)
        return ck_sys_err("open", path);
    if (fsync(fd) != 0 && errno != EINVAL) {
        xmesh_result_t r = ck_sys_err("fsync", path);
        close(fd);
        return r;
    }
    close(fd);
    return XMESH_SUCCESS;
}

xmesh_result_t ck_mkdirs(const char *path)
{
    char tmp[CK_PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "path too long: %s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
            return ck_sys_err("mkdir", tmp);
        *p = '/';
    }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
        return ck_sys_err("mkdir", tmp);
    return XMESH_SUCCESS;
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p) != 0 && errno != ENOENT ? -1 : 0;
}

xmesh_result_t ck_rmtree(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return errno == ENOENT ? XMESH_SUCCESS : ck_sys_err("stat", path);
    if (nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS) != 0)
        return ck_sys_err("remove", path);
    return XMESH_SUCCESS;
}

int ck_parse_step_name(const char *name, int64_t *step)
{
    if (strncmp(name, "step-", 5) != 0 || !name[5])
        return 0;
    int64_t v = 0;
    for (const char *p = name + 5; *p; p++) {
        if (*p < '0' || *p > '9' || v > INT64_MAX / 10 - 10)
            return 0;
        v = v * 10 + (*p - '0');
    }
    *step = v;
    return 1;
}

xmesh_result_t xmp_ckpt_latest(const char *root, char *path, size_t n, int64_t *step)
{
    if (!root || !path || !step)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "xmp_ckpt_latest: NULL argument");
    /* ROOT/LATEST names the step directory of the last completed save (a run
     * resumed from an earlier step saves steps below older ones) */
    char m[CK_PATH_MAX];
    int64_t best = -1;
    if (snprintf(m, sizeof m, "%s/" CK_LATEST, root) < (int)sizeof m) {
        FILE *f = fopen(m, "r");
        char line[64] = "";
        if (f) {
            if (!fgets(line, sizeof line, f))
                line[0] = 0;
            fclose(f);
            line[strcspn(line, "\n")] = 0;
            struct stat st;
            int64_t s;
            if (ck_parse_step_name(line, &s) &&
                snprintf(m, sizeof m, "%s/%s/" CK_MANIFEST, root, line) < (int)sizeof m &&
                stat(m, &st) == 0 && S_ISREG(st.st_mode))
                best = s;
        }
    }
    DIR *d = best >= 0 ? NULL : opendir(root);
    if (!d && best < 0)
        return ck_sys_err("open checkpoint directory", root);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        int64_t s;
        struct stat st;
        if (!ck_parse_step_name(e->d_name, &s) || s <= best)
            continue;
        if (snprintf(m, sizeof m, "%s/%s/MANIFEST", root, e->d_name) >= (int)sizeof m)
            continue;
        if (stat(m, &st) == 0 && S_ISREG(st.st_mode))
            best = s;
    }
    if (d)
        closedir(d);
    if (best < 0)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                       "%s: no checkpoint (no step-N directory with a MANIFEST)", root);
    if (snprintf(path, n, "%s/" CK_STEP_FMT, root, best) >= (int)n)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "path too long: %s", root);
    *step = best;
    return XMESH_SUCCESS;
}

static int cmp_i64_desc(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

xmesh_result_t ck_set_latest(const char *root, int64_t step)
{
    char p[CK_PATH_MAX], t[CK_PATH_MAX + 8], line[64];
    snprintf(p, sizeof p, "%s/" CK_LATEST, root);
    snprintf(t, sizeof t, "%s.tmp", p);
    int n = snprintf(line, sizeof line, CK_STEP_FMT "\n", step);
    int fd = open(t, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    if (fd < 0)
        return ck_sys_err("create", t);
    xmesh_result_t r = ck_write_all(fd, line, (size_t)n, t);
    if (!r && fsync(fd) != 0)
        r = ck_sys_err("fsync", t);
    close(fd);
    if (!r && rename(t, p) != 0)
        r = ck_sys_err("rename into", p);
    if (!r)
        r = ck_fsync_path(root, 1);
    return r;
}

xmesh_result_t ck_keep(const char *root, int keep, int64_t current)
{
    if (keep <= 0)
        return XMESH_SUCCESS;
    DIR *d = opendir(root);
    if (!d)
        return ck_sys_err("open checkpoint directory", root);
    int64_t *steps = NULL;
    int ns = 0, cap = 0;
    struct dirent *e;
    xmesh_result_t r = XMESH_SUCCESS;
    while ((e = readdir(d))) {
        int64_t s;
        if (!ck_parse_step_name(e->d_name, &s) || s == current)
            continue;
        if (ns == cap) {
            cap = cap ? cap * 2 : 16;
            int64_t *nsv = realloc(steps, sizeof *steps * (size_t)cap);
            if (!nsv) {
                r = xmp_err(XMESH_ERR_NO_MEMORY, "keep: listing %s", root);
                goto out;
            }
            steps = nsv;
        }
        steps[ns++] = s;
    }
    if (ns > 1) /* steps is NULL when nothing was listed */
        qsort(steps, (size_t)ns, sizeof *steps, cmp_i64_desc);
    for (int i = keep - 1; i < ns && !r; i++) { /* the current one counts as one */
        char p[CK_PATH_MAX];
        snprintf(p, sizeof p, "%s/" CK_STEP_FMT, root, steps[i]);
        r = ck_rmtree(p);
    }
out:
    closedir(d);
    free(steps);
    return r;
}

xmesh_result_t ck_file_crc(const char *path, int64_t *size, uint32_t *crc)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return ck_sys_err("open", path);
    size_t cap = 1 << 20;
    unsigned char *buf = malloc(cap);
    if (!buf) {
        close(fd);
        return xmp_err(XMESH_ERR_NO_MEMORY, "%s: read buffer", path);
    }
    uLong c = crc32(0L, Z_NULL, 0);
    int64_t total = 0;
    xmesh_result_t r = XMESH_SUCCESS;
    for (;;) {
        ssize_t k = read(fd, buf, cap);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            r = ck_sys_err("read", path);
            break;
        }
        if (k == 0)
            break;
        c = crc32(c, buf, (uInt)k);
        total += k;
    }
    free(buf);
    close(fd);
    if (!r) {
        *size = total;
        *crc = (uint32_t)c;
    }
    return r;
}

uint32_t ck_crc(uint32_t c, const void *p, size_t n)
{
    const unsigned char *b = p;
    while (n) {
        uInt k = n > (1u << 30) ? (1u << 30) : (uInt)n;
        c = (uint32_t)crc32(c, b, k);
        b += k;
        n -= k;
    }
    return c;
}

/* ------------------------------------------------------------ manifest */

void ck_manifest_write(ck_buf_t *b, const xmp_ckpt_t *c)
{
    char sbp[64], st[64];
    ck_buf_printf(b, "xmesh-checkpoint %d\n", XMP_CKPT_FORMAT_VERSION);
    ck_buf_printf(b, "byteorder %s\n", CK_HOST_ORDER);
    ck_buf_printf(b, "step %" PRId64 "\n", c->step);
    ck_buf_printf(b, "ranks %d\n", c->nfiles);
    for (int i = 0; i < c->nmeta; i++) {
        ck_buf_printf(b, "meta %s ", c->keys[i]);
        put_escaped(b, c->vals[i]);
        ck_buf_printf(b, "\n");
    }
    for (int i = 0; i < c->nfiles; i++)
        ck_buf_printf(b, "file %d %s %" PRId64 " 0x%08" PRIx32 "\n", i, c->files[i].name,
                      c->files[i].size, c->files[i].crc);
    for (int i = 0; i < c->ntensors; i++) {
        const ck_tensor_t *t = &c->tensors[i];
        int64_t ms[XMP_MAX_MESH_DIMS];
        for (int a = 0; a < t->mnd; a++)
            ms[a] = t->mshape[a];
        xmp_sbp_string(t->sbp, t->mnd, sbp, sizeof sbp);
        xmp_sbp_string(t->store, t->mnd, st, sizeof st);
        ck_buf_printf(b, "tensor %s %s ", t->name, xmesh_dtype_name(t->dtype));
        put_list(b, t->ndim, t->shape);
        ck_buf_printf(b, " ");
        put_list(b, t->mnd, ms);
        ck_buf_printf(b, " %s %s %d\n", sbp, st, t->nblocks);
        for (int u = 0; u < t->nblocks; u++) {
            const ck_block_t *k = &t->blocks[u];
            ck_buf_printf(b, "block %d %d %" PRId64 " ", u, k->file, k->offset);
            put_list(b, t->ndim, k->lo);
            ck_buf_printf(b, " ");
            put_list(b, t->ndim, k->hi);
            ck_buf_printf(b, "\n");
        }
    }
    uint32_t crc = ck_crc(0, b->data, b->len);
    ck_buf_printf(b, "end 0x%08" PRIx32 "\n", crc);
}

void ck_free_contents(xmp_ckpt_t *c)
{
    for (int i = 0; i < c->nmeta; i++) {
        free(c->keys[i]);
        free(c->vals[i]);
    }
    free(c->keys);
    free(c->vals);
    free(c->files);
    for (int i = 0; i < c->ntensors; i++)
        free(c->tensors[i].blocks);
    free(c->tensors);
    memset(c, 0, sizeof *c);
}

/* Parsing: the input is one NUL-terminated text; errors name the manifest
 * path and the line number. */
typedef struct {
    const char *path;
    int line;
} pctx_t;

#define PERR(pc, ...) perr_(pc, __VA_ARGS__)
static xmesh_result_t perr_(const pctx_t *pc, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static xmesh_result_t perr_(const pctx_t *pc, const char *fmt, ...)
{
    char m[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    return xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s line %d: %s", pc->path, pc->line, m);
}

static int parse_i64(const char *s, int64_t *v)
{
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (errno || end == s || *end)
        return 0;
    *v = x;
    return 1;
}

/* "a,b,c" or "-" (empty) into at most max values; returns count or -1. */
static int parse_list(const char *s, int64_t *v, int max)
{
    if (strcmp(s, "-") == 0)
        return 0;
    int n = 0;
    char tmp[512];
    if (snprintf(tmp, sizeof tmp, "%s", s) >= (int)sizeof tmp)
        return -1;
    char *save = NULL;
    for (char *tok = strtok_r(tmp, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (n == max || !parse_i64(tok, &v[n]))
            return -1;
        n++;
    }
    return n;
}

static char *unescape(const char *s)
{
    size_t n = strlen(s);
    char *o = malloc(n + 1), *q = o;
    if (!o)
        return NULL;
    for (const char *p = s; *p; p++) {
        if (*p == '\\' && p[1]) {
            p++;
            *q++ = *p == 'n' ? '\n' : *p == 'r' ? '\r' : *p;
        } else {
            *q++ = *p;
        }
    }
    *q = 0;
    return o;
}

static int split_ws(char *line, char **tok, int max)
{
    int n = 0;
    char *save = NULL;
    for (char *t = strtok_r(line, " ", &save); t && n < max; t = strtok_r(NULL, " ", &save))
        tok[n++] = t;
    return n;
}

static xmesh_result_t check_tensor(const pctx_t *pc, const xmp_ckpt_t *c, const ck_tensor_t *t)
{
    int cs[XMP_MAX_MESH_DIMS];
    size_t esz = xmesh_dtype_size(t->dtype);
    ck_collapsed(t, cs);
    for (int u = 0; u < t->nblocks; u++) {
        const ck_block_t *k = &t->blocks[u];
        int co[XMP_MAX_MESH_DIMS];
        int64_t lo[XMP_MAX_DIMS], hi[XMP_MAX_DIMS];
        if (k->file < 0)
            return PERR(pc, "tensor '%s': block %d missing", t->name, u);
        ck_coords(cs, t->mnd, u, co);
        ck_block(t->mnd, cs, t->ndim, t->shape, t->store, co, lo, hi);
        for (int d = 0; d < t->ndim; d++)
            if (lo[d] != k->lo[d] || hi[d] != k->hi[d])
                return PERR(pc,
                            "tensor '%s': block %d dim %d is [%" PRId64 ",%" PRId64
                            "), its layout gives [%" PRId64 ",%" PRId64 ")",
                            t->name, u, d, k->lo[d], k->hi[d], lo[d], hi[d]);
        int64_t bytes = ck_count(t->ndim, lo, hi) * (int64_t)esz;
        if (k->offset < 0 || k->offset + bytes > c->files[k->file].size)
            return PERR(pc,
                        "tensor '%s': block %d (%" PRId64 " bytes at offset %" PRId64
                        ") lies outside %s (%" PRId64 " bytes)",
                        t->name, u, bytes, k->offset, c->files[k->file].name,
                        c->files[k->file].size);
    }
    return XMESH_SUCCESS;
}

xmesh_result_t ck_manifest_parse(char *text, const char *path, xmp_ckpt_t *c)
{
    pctx_t pc = {path, 1};
    xmesh_result_t r = XMESH_SUCCESS;
    memset(c, 0, sizeof *c);
    /* header: magic and version first, so another version gets its own message */
    int ver = 0;
    if (sscanf(text, "xmesh-checkpoint %d", &ver) != 1)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                       "%s: not an xmesh checkpoint manifest (first line is not "
                       "'xmesh-checkpoint <version>')",
                       path);
    if (ver != XMP_CKPT_FORMAT_VERSION)
        return xmp_err(XMESH_ERR_UNSUPPORTED, "%s: format version %d, this build reads version %d",
                       path, ver, XMP_CKPT_FORMAT_VERSION);
    /* CRC of everything before the "end" line */
    char *end = strstr(text, "\nend ");
    uint32_t want;
    if (!end || sscanf(end + 5, "0x%" SCNx32, &want) != 1)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                       "%s: no 'end <crc32>' line (truncated manifest?)", path);
    uint32_t got = ck_crc(0, text, (size_t)(end + 1 - text));
    if (got != want)
        return xmp_err(XMESH_ERR_INVALID_ARGUMENT,
                       "%s: CRC32 0x%08" PRIx32 ", its end line says 0x%08" PRIx32
                       " (corrupted manifest)",
                       path, got, want);
    end[1] = 0;

    int nfiles = -1, ti = -1, have_step = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save), pc.line++) {
        if (pc.line == 1)
            continue;
        char *tok[12];
        if (strncmp(line, "meta ", 5) == 0) {
            char *key = line + 5, *sp = strchr(key, ' ');
            if (!sp)
                return r = PERR(&pc, "meta line without a value"), ck_free_contents(c), r;
            *sp = 0;
            char **nk = realloc(c->keys, sizeof(char *) * (size_t)(c->nmeta + 1));
            if (nk)
                c->keys = nk;
            char **nv = realloc(c->vals, sizeof(char *) * (size_t)(c->nmeta + 1));
            if (nv)
                c->vals = nv;
            if (!nk || !nv)
                goto oom;
            c->keys[c->nmeta] = strdup(key);
            c->vals[c->nmeta] = unescape(sp + 1);
            c->nmeta++;
            if (!c->keys[c->nmeta - 1] || !c->vals[c->nmeta - 1])
                goto oom;
            continue;
        }
        int nt = split_ws(line, tok, 12);
        if (nt == 0)
            continue;
        if (strcmp(tok[0], "byteorder") == 0 && nt == 2) {
            if (strcmp(tok[1], CK_HOST_ORDER) != 0)
                return r = PERR(&pc, "byte order '%s', this machine is '%s'", tok[1],
                                CK_HOST_ORDER),
                       ck_free_contents(c), r;
        } else if (strcmp(tok[0], "step") == 0 && nt == 2 && parse_i64(tok[1], &c->step)) {
            have_step = 1;
        } else if (strcmp(tok[0], "ranks") == 0 && nt == 2) {
            int64_t v;
            if (!parse_i64(tok[1], &v) || v < 1 || v > (1 << 24) || c->files)
                return r = PERR(&pc, "bad ranks '%s'", tok[1]), ck_free_contents(c), r;
            nfiles = (int)v;
            c->files = calloc((size_t)nfiles, sizeof *c->files);
            if (!c->files)
                goto oom;
            for (int i = 0; i < nfiles; i++)
                c->files[i].size = -1;
        } else if (strcmp(tok[0], "file") == 0 && nt == 5) {
            int64_t i, sz;
            unsigned long crc;
            char *e;
            if (!c->files || !parse_i64(tok[1], &i) || i < 0 || i >= nfiles ||
                c->files[i].size >= 0 || !parse_i64(tok[3], &sz) || sz < 0 ||
                strlen(tok[2]) >= sizeof c->files[i].name || strchr(tok[2], '/'))
                return r = PERR(&pc, "bad file line"), ck_free_contents(c), r;
            crc = strtoul(tok[4], &e, 16);
            if (*e || crc > 0xfffffffful)
                return r = PERR(&pc, "bad CRC32 '%s'", tok[4]), ck_free_contents(c), r;
            snprintf(c->files[i].name, sizeof c->files[i].name, "%s", tok[2]);
            c->files[i].size = sz;
            c->files[i].crc = (uint32_t)crc;
        } else if (strcmp(tok[0], "tensor") == 0 && nt == 8) {
            if (ti >= 0 && (r = check_tensor(&pc, c, &c->tensors[ti])))
                return ck_free_contents(c), r;
            ck_tensor_t *nts = realloc(c->tensors, sizeof *nts * (size_t)(c->ntensors + 1));
            if (!nts)
                goto oom;
            c->tensors = nts;
            ck_tensor_t *t = &c->tensors[c->ntensors++];
            memset(t, 0, sizeof *t);
            ti = c->ntensors - 1;
            int64_t ms[XMP_MAX_MESH_DIMS], nb;
            if (!ck_name_ok(tok[1]))
                return r = PERR(&pc, "bad tensor name '%s'", tok[1]), ck_free_contents(c), r;
            snprintf(t->name, sizeof t->name, "%s", tok[1]);
            if (xmesh_dtype_parse(tok[2], &t->dtype) != XMESH_SUCCESS)
                return r = PERR(&pc, "tensor '%s': unknown dtype '%s'", t->name, tok[2]),
                       ck_free_contents(c), r;
            t->ndim = parse_list(tok[3], t->shape, XMP_MAX_DIMS);
            t->mnd = parse_list(tok[4], ms, XMP_MAX_MESH_DIMS);
            if (t->ndim < 0 || t->mnd < 1)
                return r = PERR(&pc, "tensor '%s': bad shape '%s' or mesh '%s'", t->name, tok[3],
                                tok[4]),
                       ck_free_contents(c), r;
            for (int d = 0; d < t->ndim; d++)
                if (t->shape[d] < 0)
                    return r = PERR(&pc, "tensor '%s': negative shape", t->name),
                           ck_free_contents(c), r;
            for (int a = 0; a < t->mnd; a++) {
                if (ms[a] < 1 || ms[a] > (1 << 24))
                    return r = PERR(&pc, "tensor '%s': bad mesh '%s'", t->name, tok[4]),
                           ck_free_contents(c), r;
                t->mshape[a] = (int)ms[a];
            }
            if (xmp_sbp_parse(tok[5], t->mnd, t->ndim, t->sbp) ||
                xmp_sbp_parse(tok[6], t->mnd, t->ndim, t->store))
                return r = PERR(&pc, "tensor '%s': bad SBP '%s' / '%s': %s", t->name, tok[5],
                                tok[6], xmp_last_error()),
                       ck_free_contents(c), r;
            for (int a = 0; a < t->mnd; a++)
                if (t->store[a].kind == XMP_P)
                    return r = PERR(&pc, "tensor '%s': file SBP has P", t->name),
                           ck_free_contents(c), r;
            if (!parse_i64(tok[7], &nb) || nb != ck_nblocks(t))
                return r = PERR(&pc, "tensor '%s': %s blocks, its layout has %" PRId64, t->name,
                                tok[7], ck_nblocks(t)),
                       ck_free_contents(c), r;
            t->nblocks = (int)nb;
            t->blocks = malloc(sizeof *t->blocks * (size_t)(nb ? nb : 1));
            if (!t->blocks)
                goto oom;
            for (int u = 0; u < t->nblocks; u++)
                t->blocks[u].file = -1;
        } else if (strcmp(tok[0], "block") == 0 && nt == 6 && ti >= 0) {
            ck_tensor_t *t = &c->tensors[ti];
            int64_t u, f;
            ck_block_t k;
            if (!parse_i64(tok[1], &u) || u < 0 || u >= t->nblocks || t->blocks[u].file >= 0 ||
                !parse_i64(tok[2], &f) || f < 0 || f >= nfiles || c->files[f].size < 0 ||
                !parse_i64(tok[3], &k.offset) ||
                parse_list(tok[4], k.lo, XMP_MAX_DIMS) != t->ndim ||
                parse_list(tok[5], k.hi, XMP_MAX_DIMS) != t->ndim)
                return r = PERR(&pc, "tensor '%s': bad block line", t->name), ck_free_contents(c),
                       r;
            k.file = (int)f;
            t->blocks[u] = k;
        } else {
            return r = PERR(&pc, "unexpected line '%s'", tok[0]), ck_free_contents(c), r;
        }
    }
    if (ti >= 0 && (r = check_tensor(&pc, c, &c->tensors[ti])))
        return ck_free_contents(c), r;
    if (!have_step || nfiles < 0)
        return r = xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: no %s line", path,
                           !have_step ? "step" : "ranks"),
               ck_free_contents(c), r;
    for (int i = 0; i < nfiles; i++)
        if (c->files[i].size < 0)
            return r = xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: no line for file %d", path, i),
                   ck_free_contents(c), r;
    c->nfiles = nfiles;
    for (int i = 0; i < c->ntensors; i++)
        for (int j = 0; j < i; j++)
            if (strcmp(c->tensors[i].name, c->tensors[j].name) == 0)
                return r = xmp_err(XMESH_ERR_INVALID_ARGUMENT, "%s: tensor '%s' listed twice", path,
                                   c->tensors[i].name),
                       ck_free_contents(c), r;
    return XMESH_SUCCESS;
oom:
    ck_free_contents(c);
    return xmp_err(XMESH_ERR_NO_MEMORY, "%s: out of memory while parsing", path);
}
