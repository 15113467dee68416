/*
 * Distributed checkpoints of SBP tensors that load into any layout.
 *
 * Design note
 * -----------
 * A checkpoint is a directory per step, ROOT/step-NNNNNNNN/, holding one
 * shard file per rank of the saving communicator (rank-RRRRR.bin) and a text
 * MANIFEST (format in docs/CHECKPOINT.md): format version, step, the caller's
 * metadata (key = value strings: model configuration, data-loader position,
 * RNG states, optimizer settings), one line per file (size, CRC32) and per
 * tensor its global shape, dtype, mesh shape, SBP, the SBP its blocks were
 * written in (the "file SBP": the storage SBP when the caller gave one, else
 * the tensor's own) and, per distinct block, which file holds it at which
 * byte offset.
 *
 * Unique data only: a tensor whose file SBP is B on some mesh axes has
 * identical blocks on the ranks that differ only on those axes; the rank at
 * coordinate 0 on every B axis writes the block, the others write nothing of
 * it. A tensor that is P on an axis has no block to write: it is refused
 * unless a storage SBP without P is given (then it is boxed first, which
 * sums the partial values). Every rank writes its own blocks in parallel;
 * only the block tables (a few hundred bytes per block) are gathered on rank
 * 0 for the manifest.
 *
 * Atomic saves: everything is written into ROOT/.step-NNNNNNNN.tmp/, each
 * file fsync'ed, the manifest written last (it carries its own CRC32), the
 * directory fsync'ed and renamed to ROOT/step-NNNNNNNN/, and ROOT fsync'ed.
 * A crash at any point leaves either no new step directory or a complete
 * one; earlier step directories are never touched until the new one is in
 * place, and only then are all but the newest `keep` removed. Leftover
 * .tmp directories are ignored by loads and removed by the next save.
 *
 * Loading into any layout: the destination tensors may live on other
 * meshes, SBPs and rank counts than the saved ones. For each tensor the
 * saved distinct blocks form a source layout on a mesh of U devices (the
 * saved mesh with its B axes collapsed to size 1, file SBP unchanged). When
 * U <= the ranks of comm and a context is given, U ranks stand in for the
 * saved devices (each source device placed on the rank whose destination
 * block overlaps it most, so a same-layout load moves nothing over the
 * network): each reads its block from the shard file and an xmesh plan
 * from that layout to the destination layout moves the data, one tensor at
 * a time. Otherwise (U > ranks, no context, or XMP_CKPT_LOAD_DIRECT) each
 * rank reads from the shard files exactly the byte ranges that intersect
 * its destination block ("direct" path). Neither path ever holds more than
 * the local blocks of one tensor beyond the destination copies.
 *
 * Nothing half-loaded: the manifest (CRC, version, syntax), the caller's
 * metadata expectations, every requested tensor (name, shape, dtype) and
 * every shard file (presence, size, CRC32; the files are checked in
 * parallel, round-robin over the ranks) are verified first; the data is then
 * loaded into staging buffers and copied into the destination tensors only
 * when every rank has loaded every tensor without error. Every check ends
 * with the same decision on every rank (an all-reduce of the error and the
 * message of the lowest failing rank), so no rank is left in a collective.
 * Cost: one extra copy of this rank's destination blocks while loading.
 *
 * Communicator contract: the meshes of all tensors are created over comm
 * (xmp_mesh_create(comm, ...): their rank lists are ranks of comm) and the
 * context passed to the load, when not NULL, is created over comm too.
 * Errors: xmesh_result_t; xmp_last_error() names the file, tensor or field.
 */
#ifndef XMP_CKPT_CKPT_H
#define XMP_CKPT_CKPT_H

#include <mpi.h>
#include <stdint.h>

#include <xmesh.h>

#include "nn/sbp.h"

#ifdef __cplusplus
extern "C" {
#endif

#define XMP_CKPT_FORMAT_VERSION 1
#define XMP_CKPT_NAME_MAX 128 /* tensor names and metadata keys: < this, no blanks */

/* One tensor to save or load. name: unique, 1..127 printable non-blank
 * characters. t: the tensor (every member of its mesh passes it; ranks that
 * are not members may pass it or leave it out). store: NULL, or
 * t->mesh->ndim SBPs to write the blocks in (e.g. S(0) on a data-parallel
 * axis where t is B, so every replica writes a slice); ignored on load. */
typedef struct {
    const char *name;
    xmp_tensor_t *t;
    const xmp_sbp_t *store;
} xmp_ckpt_tensor_t;

typedef struct {
    const char *key;   /* 1..127 printable non-blank characters */
    const char *value; /* any string (newlines and backslashes are escaped) */
} xmp_ckpt_kv_t;

/* Collective over comm. Writes ROOT/step-<step>/ (ROOT is created when
 * missing) from the tensors each rank passes (ranks may pass different
 * lists: each passes the tensors whose mesh it belongs to; tensors with a
 * storage SBP other than their own are boxed, so every member of such a
 * tensor's mesh must pass it, in the same relative order), then deletes all
 * but `keep` step directories of ROOT: this one and the keep - 1 newest
 * others (keep <= 0: keep all), after writing ROOT/LATEST (the name of this
 * step directory, replaced atomically).
 * meta: nmeta entries (read by rank 0 only; others may pass NULL, 0).
 * An existing directory for the same step is replaced (atomically: the new
 * one is complete before the old one is removed).
 * On error: the same result on every rank, the message naming the bad
 * tensor / file; no new step directory exists and older ones are intact.
 * Tensors are only read. */
xmesh_result_t xmp_ckpt_save(MPI_Comm comm, const char *root, int64_t step,
                             const xmp_ckpt_tensor_t *tensors, int n, const xmp_ckpt_kv_t *meta,
                             int nmeta, int keep);

/* An opened checkpoint (its parsed manifest). Opaque; the same on every
 * rank of the comm it was opened on. */
typedef struct xmp_ckpt xmp_ckpt_t;

/* Collective over comm: rank 0 reads the manifest and broadcasts it; every
 * rank parses it. path: a step directory (holding MANIFEST) or a ROOT, in
 * which case xmp_ckpt_latest(ROOT) is opened. Checks the
 * manifest's CRC, format version and syntax (not the shard files: loads
 * do). *out is owned by the caller (xmp_ckpt_close). */
xmesh_result_t xmp_ckpt_open(MPI_Comm comm, const char *path, xmp_ckpt_t **out);
void xmp_ckpt_close(xmp_ckpt_t *c); /* NULL-safe */

/* Local queries of an opened checkpoint. */
const char *xmp_ckpt_dir(const xmp_ckpt_t *c); /* the step directory */
int64_t xmp_ckpt_step(const xmp_ckpt_t *c);
int xmp_ckpt_saved_ranks(const xmp_ckpt_t *c); /* ranks (= shard files) of the save */
/* Metadata value of key, NULL when absent. */
const char *xmp_ckpt_meta(const xmp_ckpt_t *c, const char *key);
int xmp_ckpt_meta_count(const xmp_ckpt_t *c);
void xmp_ckpt_meta_at(const xmp_ckpt_t *c, int i, const char **key, const char **value);

/* Metadata as numbers. Errors (XMESH_ERR_INVALID_ARGUMENT) name the
 * manifest, the key and the value: missing, not a number, trailing text.
 * *out is untouched on error. */
xmesh_result_t xmp_ckpt_meta_i64(const xmp_ckpt_t *c, const char *key, int64_t *out);
xmesh_result_t xmp_ckpt_meta_f64(const xmp_ckpt_t *c, const char *key, double *out);
/* An integer in [lo, hi] (the range is named in the error), and an f32. */
xmesh_result_t xmp_ckpt_meta_int(const xmp_ckpt_t *c, const char *key, int lo, int hi, int *out);
xmesh_result_t xmp_ckpt_meta_f32(const xmp_ckpt_t *c, const char *key, float *out);

/* A growable metadata list that owns its strings, for building the meta
 * argument of xmp_ckpt_save: start from {0}; setf replaces the value of a
 * key already set (keeps its position); free releases everything. */
typedef struct {
    xmp_ckpt_kv_t *kv;
    int n, cap;
} xmp_ckpt_metalist_t;
xmesh_result_t xmp_ckpt_metalist_setf(xmp_ckpt_metalist_t *m, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void xmp_ckpt_metalist_free(xmp_ckpt_metalist_t *m);

typedef struct {
    const char *name;
    xmesh_dtype_t dtype;
    int ndim;
    int64_t shape[XMP_MAX_DIMS];
    int mesh_ndim;
    int mesh_shape[XMP_MAX_MESH_DIMS];
    xmp_sbp_t sbp[XMP_MAX_MESH_DIMS];   /* SBP of the tensor when saved */
    xmp_sbp_t store[XMP_MAX_MESH_DIMS]; /* SBP its blocks were written in */
    int nblocks;                        /* distinct blocks written */
    int64_t bytes;                      /* prod(shape) * dtype size */
} xmp_ckpt_tensor_info_t;
int xmp_ckpt_tensor_count(const xmp_ckpt_t *c);
/* Fills *info for tensor i (0 <= i < count); name points into c. */
void xmp_ckpt_tensor_info(const xmp_ckpt_t *c, int i, xmp_ckpt_tensor_info_t *info);
/* Index of the tensor called name, -1 when absent. */
int xmp_ckpt_find(const xmp_ckpt_t *c, const char *name);

typedef struct {
    const char *name; /* file name inside the step directory */
    int64_t size;
    uint32_t crc32;
} xmp_ckpt_file_info_t;
int xmp_ckpt_file_count(const xmp_ckpt_t *c);
void xmp_ckpt_file_info(const xmp_ckpt_t *c, int i, xmp_ckpt_file_info_t *info);

/* Local: checks presence, size and CRC32 of shard file i. On mismatch
 * returns an error naming the file and both values. */
xmesh_result_t xmp_ckpt_verify_file(const xmp_ckpt_t *c, int i);

#define XMP_CKPT_STRICT 1u         /* every tensor of the checkpoint must be requested */
#define XMP_CKPT_LOAD_DIRECT 2u    /* never use xmesh plans: read intersecting ranges */
#define XMP_CKPT_LOAD_NO_VERIFY 4u /* skip the shard CRC pass (sizes are still checked) */

/* Collective over comm (the comm c was opened on). Loads the tensors each
 * rank passes (every member of a destination mesh passes that tensor; the
 * destination layouts are gathered, so lists may differ between ranks, but
 * two ranks passing the same name must pass the same layout) from c into
 * their current layouts: t->mesh, t->sbp (B, S; P axes get the value on
 * coordinate 0 and zeros elsewhere), t->data of members overwritten.
 * ctx: NULL or a context over comm (then the plan path may be used).
 * expect: nexpect metadata entries that must equal the manifest's
 * ("another model": the error names the key and both values).
 * flags: XMP_CKPT_* above.
 * On error: the same result on every rank, the message naming the file,
 * tensor or field, and no destination tensor was written. */
xmesh_result_t xmp_ckpt_load(MPI_Comm comm, xmesh_ctx_t ctx, const xmp_ckpt_t *c,
                             const xmp_ckpt_tensor_t *tensors, int n, const xmp_ckpt_kv_t *expect,
                             int nexpect, unsigned flags);

/* What the last xmp_ckpt_load of this thread did on this rank (also after
 * an error: what it had done until then). */
typedef struct {
    int tensors_plan;      /* tensors moved by xmesh plans */
    int tensors_direct;    /* tensors read directly by their destination ranks */
    int64_t bytes_read;    /* tensor bytes this rank read from shard files */
    int64_t bytes_checked; /* shard bytes this rank read for the CRC pass */
    int plans;             /* plans of many tensors that moved the tensors_plan tensors (at
                            * most XMESH_CKPT_PLAN_BYTES tensor bytes each) */
} xmp_ckpt_load_info_t;
void xmp_ckpt_last_load_info(xmp_ckpt_load_info_t *info);

/* Local: the step directory ROOT/LATEST names when it holds a MANIFEST (the
 * last completed save), else the complete step directory (one holding
 * MANIFEST; .tmp directories ignored) of the highest step. Writes its path to path (n bytes) and
 * its step to *step. XMESH_ERR_INVALID_ARGUMENT naming root when there is none. */
xmesh_result_t xmp_ckpt_latest(const char *root, char *path, size_t n, int64_t *step);

/* Test hook (also XMESH_CKPT_CRASH=N in the environment): when >= 0, a save
 * stops as a crash would right after the shard files of ranks < N are
 * written (ranks >= N write nothing), leaving its .tmp directory behind and
 * returning XMESH_ERR_INTERNAL "simulated crash" on every rank. -1: off.
 * XMESH_CKPT_CRASH=N:exit makes every rank _exit(86) there instead. */
void xmp_ckpt_test_crash_after(int nranks_written);

#ifdef __cplusplus
}
#endif
#endif /* XMP_CKPT_CKPT_H */
