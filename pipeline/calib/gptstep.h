/*
 * The measured GPT-2 training step of a calibration ([compute] `gptstep L C NH T ROWS V BUSY
 * SECONDS` in a cluster file): a whole training step of the serial GPT-2 (models/gpt2_serial.c:
 * forward, backward, AdamW; the trainer's kernels with everything between them), timed by
 * xmesh-calibrate with every rank busy at once. The layout search (search/) prices the same
 * model from the kernel records and scales its compute by the ratio: what the kernels timed one
 * by one in a loop miss of a real step (caches, the glue between them).
 *
 * The library's cost model (scheduler/xm_costmodel.h) knows no model: it keeps the line as a
 * NAMEstep record (xm_steprec_t); this file gives it its fields and checks them. Errors are the
 * library's (xmesh_last_error), naming the line and the field.
 */
#ifndef XMP_CALIB_GPTSTEP_H
#define XMP_CALIB_GPTSTEP_H

#include <mpi.h>
#include <stdint.h>

#include "xm_costmodel.h"

typedef struct xmp_gptstep {
    int layers, channels, heads, seq, rows, vocab; /* the probe model; rows = batch B */
    int busy;                                      /* ranks per host at once; 0: absent */
    double seconds;                                /* one step, > 0 */
    int line;                                      /* line in the file (0: not from a file) */
} xmp_gptstep_t;

/* The model's gptstep record into *out: SUCCESS with out->busy 0 when it has none (or m is
 * NULL); INVALID_ARGUMENT naming the line and field when the record is malformed (*out then
 * zeroed). */
xmesh_result_t xmp_gptstep_get(const xm_costmodel_t *m, xmp_gptstep_t *out);
/* Checks r and sets it as the model's gptstep record (one per model): INVALID_ARGUMENT naming
 * the bad field, or for a second record; m unchanged on error. */
xmesh_result_t xmp_gptstep_set(xm_costmodel_t *m, const xmp_gptstep_t *r);

/* xm_costmodel_parse / xm_costmodel_load, then the gptstep record checked (a malformed record is
 * an error, as for every other record); *out untouched on error. */
xmesh_result_t xmp_costmodel_parse(const char *text, xm_costmodel_t **out);
xmesh_result_t xmp_costmodel_load(const char *path, xm_costmodel_t **out);

/* The probe (gptstep_probe.c, built where OpenBLAS is: xmesh-calibrate): one training step
 * (forward, backward, AdamW) of the serial GPT-2 on every rank of comm at once, repetitions of
 * steps run back to back for at least sustain_s each, the slowest rank's median (median_max:
 * the calibrator's, collective over comm): 2 layers of `hidden` channels, heads of 32 channels,
 * sequence min(tokens, 64), min(tokens, 256) rows, vocabulary min(vocab, 4 hidden). busy: ranks
 * per host running it at once (the record's field). Collective. 0 with *out set, or -1 (out->busy
 * 0; a line on stderr from rank 0) when the model could not be set up or a step failed. */
int xmp_gptstep_probe(MPI_Comm comm, int64_t hidden, int64_t tokens, int64_t vocab, int reps,
                      double sustain_s, int busy, double (*median_max)(double *t, int n),
                      xmp_gptstep_t *out);

#endif /* XMP_CALIB_GPTSTEP_H */
