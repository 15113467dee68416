/* xmesh-ckpt: offline checkpoint tool.
 *   xmesh-ckpt info DIR     manifest summary and shard verification
 *                           (DIR: a step directory or a root of steps)
 *   xmesh-ckpt convert ...  not built yet (needs the GPT model: --to-llmc
 *                           / --from-llmc come with the trainer wiring)
 * Exit status: 0 when everything verified, 1 on a bad checkpoint, 2 on
 * usage errors. Runs as a single process (or under mpirun: rank 0 prints). */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "ckpt/ckpt.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: xmesh-ckpt info DIR\n"
               "       xmesh-ckpt convert DIR --to-llmc FILE      (not implemented yet)\n"
               "       xmesh-ckpt convert --from-llmc FILE --layout ... DIR   (not implemented "
               "yet)\n"
               "DIR: a step directory (holding MANIFEST) or a directory of step-N directories\n"
               "(the newest complete one is used).\n");
}

static void fmt_sbp(const xmp_sbp_t *s, int n, char *buf, size_t len)
{
    xmp_sbp_string(s, n, buf, len);
}

static int info(const char *path)
{
    xmp_ckpt_t *c = NULL;
    if (xmp_ckpt_open(MPI_COMM_SELF, path, &c) != XMESH_SUCCESS) {
        fprintf(stderr, "xmesh-ckpt: %s\n", xmp_last_error());
        return 1;
    }
    printf("checkpoint  %s\n", xmp_ckpt_dir(c));
    printf("format      %d\n", XMP_CKPT_FORMAT_VERSION);
    printf("step        %" PRId64 "\n", xmp_ckpt_step(c));
    printf("saved ranks %d\n", xmp_ckpt_saved_ranks(c));
    printf("metadata    %d entries\n", xmp_ckpt_meta_count(c));
    for (int i = 0; i < xmp_ckpt_meta_count(c); i++) {
        const char *k, *v;
        xmp_ckpt_meta_at(c, i, &k, &v);
        printf("  %-28s %s\n", k, v);
    }
    int64_t total = 0;
    printf("tensors     %d\n", xmp_ckpt_tensor_count(c));
    printf("  %-28s %-5s %-20s %-10s %-18s %-18s %7s %12s\n", "name", "dtype", "shape", "mesh",
           "sbp", "stored as", "blocks", "bytes");
    for (int i = 0; i < xmp_ckpt_tensor_count(c); i++) {
        xmp_ckpt_tensor_info_t t;
        char shape[96] = "", mesh[48] = "", sbp[64], st[64];
        size_t o = 0;
        xmp_ckpt_tensor_info(c, i, &t);
        for (int d = 0; d < t.ndim && o < sizeof shape; d++)
            o += (size_t)snprintf(shape + o, sizeof shape - o, "%s%" PRId64, d ? "x" : "",
                                  t.shape[d]);
        if (t.ndim == 0)
            snprintf(shape, sizeof shape, "scalar");
        o = 0;
        for (int a = 0; a < t.mesh_ndim && o < sizeof mesh; a++)
            o += (size_t)snprintf(mesh + o, sizeof mesh - o, "%s%d", a ? "x" : "", t.mesh_shape[a]);
        fmt_sbp(t.sbp, t.mesh_ndim, sbp, sizeof sbp);
        fmt_sbp(t.store, t.mesh_ndim, st, sizeof st);
        printf("  %-28s %-5s %-20s %-10s %-18s %-18s %7d %12" PRId64 "\n", t.name,
               xmesh_dtype_name(t.dtype), shape, mesh, sbp, st, t.nblocks, t.bytes);
        total += t.bytes;
    }
    printf("tensor bytes %" PRId64 "\n", total);
    int bad = 0;
    int64_t fbytes = 0;
    printf("files       %d\n", xmp_ckpt_file_count(c));
    for (int i = 0; i < xmp_ckpt_file_count(c); i++) {
        xmp_ckpt_file_info_t f;
        xmp_ckpt_file_info(c, i, &f);
        xmesh_result_t r = xmp_ckpt_verify_file(c, i);
        printf("  %-20s %12" PRId64 " bytes  crc32 0x%08" PRIx32 "  %s\n", f.name, f.size, f.crc32,
               r ? "BAD" : "ok");
        if (r) {
            printf("    %s\n", xmp_last_error());
            bad++;
        }
        fbytes += f.size;
    }
    printf("file bytes  %" PRId64 "\n", fbytes);
    printf("verify      %s\n", bad ? "FAILED" : "ok");
    xmp_ckpt_close(c);
    return bad ? 1 : 0;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, rc = 2;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (argc >= 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
        if (rank == 0)
            usage(stdout);
        rc = 0;
    } else if (argc == 3 && strcmp(argv[1], "info") == 0) {
        rc = rank == 0 ? info(argv[2]) : 0;
    } else if (argc >= 2 && strcmp(argv[1], "convert") == 0) {
        if (rank == 0)
            fprintf(stderr, "xmesh-ckpt: convert (--to-llmc / --from-llmc) is not implemented "
                            "yet: it needs the GPT model's tensor names and layouts, which the "
                            "trainer wiring provides\n");
        rc = 2;
    } else {
        if (rank == 0)
            usage(stderr);
    }
    MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Finalize();
    return rc;
}
