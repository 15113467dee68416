/* The GPT-2 step probe of the calibration (gptstep.h): the serial GPT-2 (models/gpt2.h), the
 * trainer's kernels, timed on every rank at once. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calib/gptstep.h"
#include "models/gpt2.h"

#define PROBE_MAX_REPS 64

int xmp_gptstep_probe(MPI_Comm comm, int64_t hidden, int64_t tokens, int64_t vocab, int reps,
                      double sustain_s, int busy, double (*median_max)(double *t, int n),
                      xmp_gptstep_t *out)
{
    int rank = 0;
    MPI_Comm_rank(comm, &rank);
    memset(out, 0, sizeof *out);
    /* bounded so that the probe stays a few seconds and a few hundred MB at GPT-2 124M's
     * defaults (C 768, V 50304): at most 256 rows and a vocabulary of at most 4C (the factor is
     * a ratio of the same model measured and priced, so any size the search can price serves;
     * these keep the head from dominating a 2-layer model) */
    const int creps = reps < 1 ? 1 : reps > PROBE_MAX_REPS ? PROBE_MAX_REPS : reps;
    int C = (int)hidden, T = tokens < 64 ? (int)tokens : 64;
    int rows = tokens < 256 ? (int)tokens : 256, V = (int)vocab;
    if (V > 4 * C)
        V = 4 * C;
    int NH = C / 32 > 0 ? C / 32 : 1, B = rows / T > 0 ? rows / T : 1;
    while (C % NH)
        NH--;
    xmp_gpt2_config_t cfg = {T, V, xmp_gpt2_pad_vocab(V, 128), 2, NH, C};
    xmp_gpt2_t m;
    memset(&m, 0, sizeof m);
    int *in = malloc((size_t)(B * T) * sizeof(int)), *tg = malloc((size_t)(B * T) * sizeof(int));
    int ok = in && tg && xmp_gpt2_init_random(&m, &cfg, 1234 + (uint64_t)rank) == 0;
    for (int i = 0; ok && i < B * T; i++) {
        in[i] = (i * 7 + rank) % V;
        tg[i] = (i * 11 + 3) % V;
    }
    double tt[PROBE_MAX_REPS];
    int step = 0, all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm);
    if (all_ok) {
        MPI_Barrier(comm);
        for (int rep = -1; rep < creps; rep++) { /* rep -1: warm-up */
            double t0 = MPI_Wtime(), t;
            int calls = 0;
            do {
                if (xmp_gpt2_forward(&m, in, tg, B, T) != 0)
                    ok = 0;
                xmp_gpt2_zero_grad(&m);
                if (!ok || xmp_gpt2_backward(&m) != 0 ||
                    xmp_gpt2_update(&m, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.0f, ++step) != 0)
                    ok = 0;
                calls++;
            } while (ok && (t = MPI_Wtime() - t0) < sustain_s);
            if (rep >= 0)
                tt[rep] = ok ? t / calls : 0;
        }
        double sec = median_max(tt, creps); /* collective: every rank calls it */
        MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm);
        if (all_ok)
            *out = (xmp_gptstep_t){2, C, NH, T, B, V, busy, sec, 0};
        else if (rank == 0)
            fprintf(stderr, "xmesh-calibrate: the GPT-2 step probe failed on some rank "
                            "(memory?); no gptstep record\n");
    } else if (rank == 0) {
        fprintf(stderr, "xmesh-calibrate: the GPT-2 step probe could not be set up (memory); "
                        "no gptstep record\n");
    }
    xmp_gpt2_free(&m);
    free(in);
    free(tg);
    return out->busy > 0 ? 0 : -1;
}
