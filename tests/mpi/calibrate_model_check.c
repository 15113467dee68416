/* Part of mpi.calibrate: loads the cluster file xmesh-calibrate wrote
 * through the search's API (xmp_costmodel_load) and checks what the search
 * will rely on: every collective kind has a record inside one host and
 * across hosts, each with finite values and R^2 <= 1; each record predicts
 * its own geometry (its measured time at its largest size when the file has
 * its points, else alpha + beta f there) or, with a slope of 0 from timing
 * noise, is not used; no fit is negative; every sgemm shape
 * predicts its measured time, every element-wise kernel has a rate; a geometry not measured (p 8
 * across 8 hosts) gets a figure from the nearest record, or "not calibrated" when no record of that
 * kind across hosts is usable.
 *
 * usage: calibrate_model_check FILE [--no-compute]
 * exit 0 when every check holds, 1 otherwise (the failures printed). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calib/gptstep.h" /* the training stack's GPT-2 step record */
#include "xm_costmodel.h"

static int failures;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            printf("FAIL: " __VA_ARGS__);                                                          \
            printf("\n");                                                                          \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: calibrate_model_check FILE [--no-compute]\n");
        return 2;
    }
    int want_compute = !(argc > 2 && !strcmp(argv[2], "--no-compute"));
    xm_costmodel_t *m = NULL;
    if (xmp_costmodel_load(argv[1], &m)) {
        printf("FAIL: %s: %s\n", argv[1], xmesh_last_error());
        return 1;
    }
    int intra[XM_COLL_NKINDS] = {0}, cross[XM_COLL_NKINDS] = {0},
        cross_usable[XM_COLL_NKINDS] = {0};
    for (int i = 0; i < m->ncoll; i++) {
        const xm_coll_rec_t *r = &m->coll[i];
        const char *kn = xm_coll_name(r->kind);
        (r->g.hosts > 1 ? cross : intra)[r->kind]++;
        if (r->g.hosts > 1 && r->fit.beta > 0)
            cross_usable[r->kind]++;
        CHECK(isfinite(r->fit.alpha) && isfinite(r->fit.beta) && isfinite(r->fit.r2) &&
                  r->fit.r2 <= 1 + 1e-9 && isfinite(r->fit.worst_rel) && r->fit.n >= 2,
              "line %d %s: values alpha %g beta %g r2 %g worst_rel %g points %d", r->line, kn,
              r->fit.alpha, r->fit.beta, r->fit.r2, r->fit.worst_rel, r->fit.n);
        /* the fit is constrained: never a negative latency or slope, whatever the timings */
        CHECK(r->fit.alpha >= 0 && r->fit.beta >= 0, "line %d %s: alpha %g beta %g, negative",
              r->line, kn, r->fit.alpha, r->fit.beta);
        xm_cost_pred_t p;
        xmesh_result_t e = xm_cost_collective(m, r->kind, &r->g, r->max_bytes, &p);
        /* A slope of 0 (a flat sweep: timing noise on a shared machine) leaves the record
         * unused, measured points or not; which branch a run takes depends on its timings, so
         * each is checked for what it must do, none is required. */
        if (r->npts >= 2 && r->fit.beta > 0) { /* measured points: its own largest point */
            double want = r->py[r->npts - 1];
            CHECK(r->px[r->npts - 1] == r->max_bytes && e == XMESH_SUCCESS && p.exact &&
                      fabs(p.seconds - want) <= 1e-12 * want,
                  "line %d %s p %d: predicted %g (exact %d, rc %d: %s), measured %g at %g bytes",
                  r->line, kn, r->g.group_size, p.seconds, p.exact, e,
                  e ? xmesh_last_error() : p.basis, want, r->px[r->npts - 1]);
        } else if (r->fit.beta > 0) {
            double want = (r->fit.alpha > 0 ? r->fit.alpha : 0) +
                          r->fit.beta * xm_coll_volume(r->kind, r->max_bytes, r->g.group_size);
            CHECK(e == XMESH_SUCCESS && p.exact && fabs(p.seconds - want) <= 1e-12 * want,
                  "line %d %s p %d: predicted %g (exact %d, rc %d: %s), expected %g", r->line, kn,
                  r->g.group_size, p.seconds, p.exact, e, e ? xmesh_last_error() : p.basis, want);
        } else {
            CHECK(e != XMESH_SUCCESS || !p.exact,
                  "line %d %s: slope %g <= 0 but the record was used as exact", r->line, kn,
                  r->fit.beta);
            printf("note: line %d %s p %d: slope %g <= 0 (timing noise): not used\n", r->line, kn,
                   r->g.group_size, r->fit.beta);
        }
    }
    for (int k = 0; k < XM_COLL_NKINDS; k++) {
        const char *kn = xm_coll_name((xm_coll_t)k);
        CHECK(intra[k] > 0, "no %s record inside one host", kn);
        CHECK(cross[k] > 0, "no %s record across hosts", kn);
        xm_coll_geom_t g8 = {8, 1, 8, 1};
        xm_cost_pred_t p;
        xmesh_result_t e = xm_cost_collective(m, (xm_coll_t)k, &g8, 1 << 20, &p);
        if (cross_usable[k])
            CHECK(e == XMESH_SUCCESS && !p.exact && isfinite(p.seconds) && p.seconds > 0,
                  "%s p 8 over 8 hosts: rc %d seconds %g exact %d", kn, e, p.seconds, p.exact);
        else
            CHECK(e == XMESH_ERR_UNSUPPORTED && strstr(xmesh_last_error(), "not calibrated"),
                  "%s across hosts: no usable record, but rc %d", kn, e);
        if (!e)
            printf("%s p 8 over 8 hosts, 1 MiB: %.6g s from %s\n", kn, p.seconds, p.basis);
    }
    if (want_compute) {
        CHECK(m->ngemm > 0, "no sgemm shape in [compute]");
        for (int i = 0; i < m->ngemm; i++) {
            const xm_gemm_rec_t *g = &m->gemm[i];
            xm_cost_pred_t p;
            xmesh_result_t e = xm_cost_gemm(m, g->m, g->n, g->k, &p);
            CHECK(e == XMESH_SUCCESS && p.exact && p.seconds == g->seconds && g->busy >= 1,
                  "sgemm %s: rc %d predicted %g, measured %g", g->label, e, p.seconds, g->seconds);
        }
        CHECK(m->has_gemm_fit && isfinite(m->gemm_fit.r2) && m->gemm_fit.r2 <= 1 + 1e-9,
              "sgemm fit missing or R^2 not finite");
        for (int k = 0; k < XM_ELT_NKINDS; k++)
            CHECK(m->elt[k].busy >= 1 && m->elt[k].fwd > 0 && isfinite(m->elt[k].bwd),
                  "eltwise %s: busy %d fwd %g bwd %g", xm_elt_name((xm_elt_t)k), m->elt[k].busy,
                  m->elt[k].fwd, m->elt[k].bwd);
        xmp_gptstep_t gv;
        const xmp_gptstep_t *g = &gv;
        (void)xmp_gptstep_get(m, &gv);
        CHECK(g->busy >= 1 && g->layers == 2 && g->channels >= 1 && g->channels % g->heads == 0 &&
                  g->seconds > 0 && isfinite(g->seconds),
              "gptstep: busy %d layers %d channels %d heads %d seconds %g", g->busy, g->layers,
              g->channels, g->heads, g->seconds);
    }
    printf("%s: %d collective records, %d sgemm shapes, %d failure(s)\n", argv[1], m->ncoll,
           m->ngemm, failures);
    xm_costmodel_destroy(m);
    return failures ? 1 : 0;
}
