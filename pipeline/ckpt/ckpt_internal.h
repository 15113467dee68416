/* Private to pipeline/ckpt: the parsed manifest and file helpers. */
#ifndef XMP_CKPT_INTERNAL_H
#define XMP_CKPT_INTERNAL_H

#include <inttypes.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt/ckpt.h"

#define CK_PATH_MAX 4096
#define CK_STEP_FMT "step-%08" PRId64
#define CK_MANIFEST "MANIFEST"
#define CK_LATEST "LATEST"
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define CK_HOST_ORDER "big"
#else
#define CK_HOST_ORDER "little"
#endif

typedef struct {
    int file; /* index into files, -1 while unset */
    int64_t offset;
    int64_t lo[XMP_MAX_DIMS], hi[XMP_MAX_DIMS];
} ck_block_t;

typedef struct {
    char name[XMP_CKPT_NAME_MAX];
    xmesh_dtype_t dtype;
    int ndim;
    int64_t shape[XMP_MAX_DIMS];
    int mnd;
    int mshape[XMP_MAX_MESH_DIMS];
    xmp_sbp_t sbp[XMP_MAX_MESH_DIMS];
    xmp_sbp_t store[XMP_MAX_MESH_DIMS]; /* file SBP (no P) */
    int nblocks;                        /* prod of the mesh axes that are S in store */
    ck_block_t *blocks;                 /* by distinct-block index (row-major, B axes size 1) */
} ck_tensor_t;

typedef struct {
    char name[64];
    int64_t size;
    uint32_t crc;
} ck_file_t;

struct xmp_ckpt {
    char dir[CK_PATH_MAX];
    int64_t step;
    int nmeta;
    char **keys, **vals;
    int nfiles;
    ck_file_t *files;
    int ntensors;
    ck_tensor_t *tensors;
};

typedef struct {
    char *data;
    size_t len, cap;
    int oom;
} ck_buf_t;

int ck_name_ok(const char *s);
void ck_buf_printf(ck_buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Geometry: mesh with the B axes of store collapsed to 1; distinct blocks. */
void ck_collapsed(const ck_tensor_t *t, int *cshape);
int64_t ck_nblocks(const ck_tensor_t *t);
void ck_coords(const int *shape, int nd, int64_t i, int *c);
void ck_block(int mnd, const int *mshape, int nd, const int64_t *shape, const xmp_sbp_t *sbp,
              const int *coord, int64_t *lo, int64_t *hi);
int64_t ck_count(int nd, const int64_t *lo, const int64_t *hi);

/* Files. Errors name the path and errno. */
xmesh_result_t ck_sys_err(const char *what, const char *path);
xmesh_result_t ck_write_all(int fd, const void *p, size_t n, const char *path);
xmesh_result_t ck_pread_all(int fd, void *p, size_t n, int64_t off, const char *path);
xmesh_result_t ck_fsync_path(const char *path, int dir);
xmesh_result_t ck_mkdirs(const char *path);
xmesh_result_t ck_rmtree(const char *path);
int ck_parse_step_name(const char *name, int64_t *step);
/* Removes all step directories but `current` and the keep - 1 newest others. */
xmesh_result_t ck_keep(const char *root, int keep, int64_t current);
/* ROOT/LATEST := step-<step>, atomically (temporary file, rename). */
xmesh_result_t ck_set_latest(const char *root, int64_t step);
xmesh_result_t ck_file_crc(const char *path, int64_t *size, uint32_t *crc);
uint32_t ck_crc(uint32_t c, const void *p, size_t n);

/* Manifest text (docs/CHECKPOINT.md). parse modifies text; on error c is
 * left empty (nothing to free). */
void ck_manifest_write(ck_buf_t *b, const xmp_ckpt_t *c);
xmesh_result_t ck_manifest_parse(char *text, const char *path, xmp_ckpt_t *c);
void ck_free_contents(xmp_ckpt_t *c);

#endif
