/* Private to pipeline/sched: helpers shared between schedule.c, sched_text.c,
 * sched_validate.c, sched_sim.c and sched_gen.c. Never installed. */
#ifndef XMP_SCHED_SCHED_PRIV_H
#define XMP_SCHED_SCHED_PRIV_H

#include <stddef.h>

#include "sched/schedule.h"

/* Comma-separated list of non-negative ints at q into a new array (caller frees); count
 * in *n. NULL on a malformed list or no memory. (sched_text.c) */
int *xmp_sched__parse_int_list(const char *q, int *n);

/* Action a formatted into buf (at least 32 bytes). (sched_validate.c) */
void xmp_sched__fmt_act(xmp_action_t a, char *buf);

/* Side of transfer action a on group g: 0 the sender, 1 the receiver. (sched_validate.c) */
int xmp_sched__act_side(const xmp_schedule_t *s, int g, xmp_action_t a);

/* The simulation engine behind xmp_sim_run and xmp_sched_dryrun; fill and max_pw as the
 * generators' weight-gradient fill uses them. (sched_sim.c) */
int xmp_sched__engine_run(const xmp_schedule_t *s, const xmp_sim_costs_t *c, int fill, int max_pw,
                          xmp_sim_result_t *res, char *err, size_t errlen);

#endif
