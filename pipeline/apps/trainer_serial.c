/* The trainer's serial loop, also the --check-serial reference on rank 0. */
#include "trainer_priv.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "nn/overlap.h"
#include "nn/sbp.h"
#include "pipe/replan.h"

/* Mean validation loss of the serial model over --val-steps batches. */
static int serial_val(const xmp_train_opts_t *o, const xmp_train_model_t *m, double *out)
{
    double sum = 0, l = 0;
    if (!m->serial_val)
        return xmp_train_fail("--val-every: the %s model has no validation split", m->name);
    for (int k = 0; k < o->val_steps; k++) {
        if (m->serial_val(m->user, k, &l) != 0)
            return -1;
        sum += l;
    }
    *out = sum / o->val_steps;
    return 0;
}

/* The serial reference's per-step losses and validation losses (NAN where none) for
 * --check-serial on rank 0. */
int xmp_tr_serial_losses(const xmp_train_opts_t *o, const xmp_train_model_t *m, int steps,
                         double *out, double *vout, double *gout, char *sout)
{
    int64_t np = 0;
    if (m->serial_open(m->user, &np) != 0)
        return -1;
    int rc = 0;
    for (int step = 0; step < steps && rc == 0; step++) {
        double gn = 0;
        if (m->set_lr)
            m->set_lr(m->user, xmp_train_lr(o, step));
        rc = m->serial_step(m->user, step, &out[step], &gn);
        gout[step] = gn;
        vout[step] = NAN;
        if (rc == 0 && xmp_tr_val_due(o, step))
            rc = serial_val(o, m, &vout[step]);
        if (rc == 0 && xmp_tr_sample_due(o, step))
            rc = m->sample(m->user, NULL, NULL, sout + (size_t)step * (o->sample_len + 1),
                           (size_t)o->sample_len + 1);
    }
    m->serial_close(m->user);
    (void)o;
    return rc;
}

int xmp_tr_run_serial(const xmp_train_opts_t *o, const xmp_train_model_t *m)
{
    int64_t np = 0;
    int ok = 0;
    train_log_t log;
    if (m->serial_open(m->user, &np) != 0) {
        xmp_cli_error("%s", xmp_last_error());
        return 1;
    }
    if (xmp_tr_log_open(&log, o, m, "serial", np, NULL, NULL, NULL) != 0) {
        m->serial_close(m->user);
        return 1;
    }
    for (int step = 0; step < o->steps; step++) {
        double t0 = xmp_now(), loss = 0, gn = 0;
        float lr = xmp_train_lr(o, step);
        if (m->set_lr)
            m->set_lr(m->user, lr);
        if (m->serial_step(m->user, step, &loss, &gn) != 0) {
            xmp_cli_error("training stopped at step %d: %s", step, xmp_last_error());
            break;
        }
        double dt = xmp_now() - t0, val = NAN;
        if (xmp_tr_val_due(o, step) && serial_val(o, m, &val) != 0) {
            xmp_cli_error("validation after step %d: %s", step, xmp_last_error());
            break;
        }
        char *text = NULL;
        if (xmp_tr_sample_due(o, step)) {
            if (!(text = malloc((size_t)o->sample_len + 1)) ||
                m->sample(m->user, NULL, NULL, text, (size_t)o->sample_len + 1) != 0) {
                xmp_cli_error("sampling after step %d: %s", step,
                              text ? xmp_last_error() : "out of memory");
                free(text);
                break;
            }
        }
        xmp_tr_log_record(&log, step, loss, dt, NULL, lr, gn, val, text);
        free(text);
        if (!isfinite(loss)) {
            xmp_cli_error("training stopped: loss is %f at step %d", loss, step);
            break;
        }
        ok = step == o->steps - 1;
    }
    double med, mn, mx;
    int skip;
    xmp_tr_log_summary(&log, ok, &med, &mn, &mx, &skip);
    if (xmp_tr_log_close(&log, med, mn, mx, skip) != 0)
        ok = 0;
    if (ok && m->serial_finish && m->serial_finish(m->user) != 0)
        ok = 0;
    m->serial_close(m->user);
    return ok ? 0 : 1;
}
