/*
 * The memory model's per-group base (xmp_sim_costs_t.base_bytes, xmp_gen_opts_t.base_bytes;
 * issue 23 follow-up): bytes a group holds at its peaks besides the microbatches' activations.
 * One process, exact values:
 *   - 1F1B, S = 4, M = 8, act 100 B per stage, base[g] = 1000 (S - g): group g peaks at
 *     100 (S - g) + base[g] (the plain peak w * act plus the base), and without base at
 *     100 (S - g) (NULL base changes nothing);
 *   - the cap counts the base: with base, a cap of the plain 1F1B peak + base is met without
 *     recomputation; a cap 1 B below it makes the generator choose another schedule (recomputing
 *     or a shallower warm-up) whose modelled peak (with base) is under the cap; a cap below the
 * base is refused naming a smallest peak that is at least the largest base.
 */
#include "sched/schedule.h"
#include "sched_check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { S = 4, M = 8 };
static double one[3 * S], act[S], ckpt[S], base[S];

/* The modelled peak of s per group (with or without the base) into peak[]; 0 or -1. */
static int sim(const xmp_schedule_t *s, const double *b, double *peak)
{
    xmp_sim_costs_t co;
    xmp_sim_result_t res;
    memset(&co, 0, sizeof co);
    co.f = one;
    co.i = one + S;
    co.w = one + 2 * S;
    co.act_bytes = act;
    co.ckpt_bytes = ckpt;
    co.selective_keep = 0.5;
    co.base_bytes = b;
    int r = xmp_sim_run(s, &co, &res, err, sizeof err);
    for (int g = 0; r == 0 && g < S; g++)
        peak[g] = res.peak_bytes[g];
    xmp_sim_result_free(&res);
    return r == 0 ? 0 : -1;
}

static double maxof(const double *v)
{
    double m = v[0];
    for (int g = 1; g < S; g++)
        m = v[g] > m ? v[g] : m;
    return m;
}

int main(void)
{
    for (int k = 0; k < 3 * S; k++)
        one[k] = 1;
    for (int g = 0; g < S; g++) {
        act[g] = 100;
        ckpt[g] = 10;
        base[g] = 1000.0 * (S - g);
    }
    xmp_gen_opts_t o;
    memset(&o, 0, sizeof o);
    xmp_schedule_t *s = NULL;
    CHECK(xmp_sched_generate_named("1f1b", S, 1, M, &o, &s, err, sizeof err) == 0, "%s", err);
    double p0[S], p1[S];
    CHECK(s && sim(s, NULL, p0) == 0 && sim(s, base, p1) == 0, "%s", err);
    for (int g = 0; s && g < S; g++) {
        double plain = 100.0 * (S - g);
        CHECK(fabs(p0[g] - plain) < 1e-9, "group %d: peak %g without base, expected %g", g, p0[g],
              plain);
        CHECK(fabs(p1[g] - (plain + base[g])) < 1e-9, "group %d: peak %g with base, expected %g", g,
              p1[g], plain + base[g]);
    }
    xmp_sched_destroy(s);

    /* the cap counts the base */
    o.act_bytes = act;
    o.ckpt_bytes = ckpt;
    o.selective_keep = 0.5;
    o.base_bytes = base;
    const double fit = maxof(p1); /* the plain 1F1B peak with base: group 0, 400 + 4000 */
    o.max_act_bytes = fit;
    s = NULL;
    CHECK(xmp_sched_generate_named("1f1b", S, 1, M, &o, &s, err, sizeof err) == 0, "cap %g: %s",
          fit, err);
    double pc[S];
    if (s) {
        CHECK(s->recompute == XMP_RECOMPUTE_NONE, "cap %g: recompute %s, none expected", fit,
              xmp_recompute_name(s->recompute));
        CHECK(sim(s, base, pc) == 0 && maxof(pc) <= fit, "cap %g: modelled peak %g", fit,
              maxof(pc));
    }
    xmp_sched_destroy(s);
    o.max_act_bytes = fit - 1; /* group 0 must hold less than its 4 microbatches of 100 B */
    s = NULL;
    CHECK(xmp_sched_generate_named("1f1b", S, 1, M, &o, &s, err, sizeof err) == 0, "cap %g: %s",
          fit - 1, err);
    if (s) {
        CHECK(sim(s, base, pc) == 0 && maxof(pc) <= fit - 1, "cap %g: modelled peak %g", fit - 1,
              maxof(pc));
        printf("cap %g: %s, recompute %s, warm-up %d, modelled peak %g\n", fit - 1, s->name,
               xmp_recompute_name(s->recompute), s->max_inflight[0], maxof(pc));
    }
    xmp_sched_destroy(s);
    o.max_act_bytes = 3999; /* below group 0's base */
    s = NULL;
    int r = xmp_sched_generate_named("1f1b", S, 1, M, &o, &s, err, sizeof err);
    CHECK(r != 0 && s == NULL, "cap 3999 below the base 4000 accepted");
    const char *m = strstr(err, "smallest modelled peak is ");
    double least = m ? atof(m + strlen("smallest modelled peak is ")) : -1;
    CHECK(r != 0 && least >= base[0], "refusal '%s' names %g, not >= the base %g", err, least,
          base[0]);
    printf("cap 3999: %s\n", err);
    printf("%d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
