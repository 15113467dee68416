/* The trainer's entry point (trainer.h): the serial or the parallel loop. */
#include "trainer_priv.h"

int xmp_train_run(const xmp_train_opts_t *o, const xmp_train_model_t *m)
{
    if (o->sample_every && !m->sample)
        return xmp_cli_error("--sample-every %d: the %s model does not generate text",
                             o->sample_every, m->name),
               2;
    return o->serial ? xmp_tr_run_serial(o, m) : xmp_tr_run_parallel(o, m);
}
