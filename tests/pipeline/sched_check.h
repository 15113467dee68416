/* Scaffolding shared by the one-process schedule tests (test_schedule.c, test_sched_virtual.c,
 * test_sched_base.c): CHECK(cond, fmt, ...) counts every check in `checks` and every failed one
 * in `failures`, printing "FAIL file:line: cond: message"; err is the generators' and parser's
 * message buffer; roundtrip(s) formats s, parses the text back and checks that the copy
 * formats to the same text and has the same dimensions (stages, groups, microbatches, edges,
 * recomputation), stage -> group map and every group's actions, byte for byte. The test exits
 * non-zero when failures > 0. Static definitions: included by one test file each. */
#ifndef XMP_TEST_SCHED_CHECK_H
#define XMP_TEST_SCHED_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched/schedule.h"

static int failures, checks;
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        checks++;                                                                                  \
        if (!(cond)) {                                                                             \
            failures++;                                                                            \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                        \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
        }                                                                                          \
    } while (0)

static char err[4096];

static inline void roundtrip(const xmp_schedule_t *s)
{
    char *t1 = xmp_sched_format(s), *t2 = NULL;
    xmp_schedule_t *p = NULL;
    CHECK(t1 != NULL, "format %s", s->name);
    int r = t1 ? xmp_sched_parse(t1, &p, err, sizeof(err)) : -1;
    CHECK(r == 0, "parse %s: %s", s->name, err);
    if (r == 0) {
        t2 = xmp_sched_format(p);
        CHECK(t2 && strcmp(t1, t2) == 0, "roundtrip differs:\n%s\n---\n%s", t1, t2 ? t2 : "");
        CHECK(p->nstages == s->nstages && p->ngroups == s->ngroups && p->nmb == s->nmb &&
                  p->nedges == s->nedges && p->recompute == s->recompute &&
                  p->recompute_frac == s->recompute_frac,
              "dims of %s", s->name);
        for (int st = 0; st < s->nstages && st < p->nstages; st++)
            CHECK(p->stage_group[st] == s->stage_group[st], "%s: map stage %d", s->name, st);
        for (int i = 0; i < s->ngroups && i < p->ngroups; i++) {
            CHECK(p->len[i] == s->len[i], "%s: group %d len", s->name, i);
            for (int j = 0; j < s->len[i] && j < p->len[i]; j++)
                CHECK(memcmp(&p->acts[i][j], &s->acts[i][j], sizeof(xmp_action_t)) == 0,
                      "%s: group %d action %d", s->name, i, j);
        }
    }
    free(t1);
    free(t2);
    xmp_sched_destroy(p);
}

#endif /* XMP_TEST_SCHED_CHECK_H */
