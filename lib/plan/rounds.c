/* Lockstep rounds of a per-rank program (xm_program.h): what a transport
 * that moves a round's messages together (NCCL groups) posts in each round. */
#include <stdlib.h>
#include <string.h>

#include "xm_program.h"

static int64_t first_round(const xm_pstep_t *s)
{
    return s->prev >= 0 ? s->rin : s->rout;
}

static int64_t last_round(const xm_pstep_t *s)
{
    return (s->next >= 0 || s->prev < 0 ? s->rout : s->rin) + s->nchunks - 1;
}

typedef struct {
    int64_t first;
    int step;
} key_t_;

static int cmp_key(const void *a, const void *b)
{
    const key_t_ *x = a, *y = b;
    if (x->first != y->first)
        return x->first < y->first ? -1 : 1;
    return (x->step > y->step) - (x->step < y->step);
}

xmesh_result_t xm_rounds_init(const xm_program_t *p, xm_rounds_it_t *it)
{
    memset(it, 0, sizeof *it);
    key_t_ *k = malloc(sizeof *k * (p->nsteps + 1));
    it->order = malloc(sizeof(int) * (p->nsteps + 1));
    it->active = malloc(sizeof(int) * (p->nsteps + 1));
    if (!k || !it->order || !it->active) {
        free(k);
        xm_rounds_free(it);
        return XM_ERR(XMESH_ERR_NO_MEMORY, "program: out of memory for %d steps", p->nsteps);
    }
    for (int i = 0; i < p->nsteps; i++)
        if (p->steps[i].nchunks > 0)
            k[it->norder++] = (key_t_){first_round(&p->steps[i]), i};
    qsort(k, it->norder, sizeof *k, cmp_key);
    for (int i = 0; i < it->norder; i++)
        it->order[i] = k[i].step;
    free(k);
    return XMESH_SUCCESS;
}

void xm_rounds_free(xm_rounds_it_t *it)
{
    free(it->order);
    free(it->active);
    free(it->ops);
    memset(it, 0, sizeof *it);
}

static void emit(xm_rounds_it_t *it, int *n, int step, const xm_pop_t *o, int phase, int64_t c)
{
    it->ops[(*n)++] = (xm_rop_t){.step = step,
                                 .kind = o->kind,
                                 .blk = o->blk,
                                 .dt = o->dt,
                                 .phase = (unsigned char)phase,
                                 .slot = (unsigned char)(c % 2),
                                 .chunk = c};
}

/* Ops of step s in round t for one phase. */
static void step_ops(const xm_pstep_t *s, int si, int64_t t, int phase, xm_rounds_it_t *it, int *n)
{
    int has_recv = s->prev >= 0, has_send = s->next >= 0;
    int64_t cr = t - s->rin, cs = t - s->rout;
    int recv_ok = has_recv && cr >= 0 && cr < s->nchunks;
    int send_ok = cs >= 0 && cs < s->nchunks; /* also: no messages at all */
    int last = s->nops - (has_send ? 1 : 0);  /* ops before the SEND */
    if (phase == 0 && (has_send || !has_recv) && send_ok)
        for (int i = has_recv; i < last; i++)
            emit(it, n, si, &s->ops[i], 0, cs);
    if (phase == 1) {
        if (recv_ok)
            emit(it, n, si, &s->ops[0], 1, cr);
        if (has_send && send_ok)
            emit(it, n, si, &s->ops[s->nops - 1], 1, cs);
    }
    if (phase == 2 && !has_send && recv_ok)
        for (int i = 1; i < s->nops; i++)
            emit(it, n, si, &s->ops[i], 2, cr);
}

int xm_rounds_next(const xm_program_t *p, xm_rounds_it_t *it, int64_t *round, const xm_rop_t **ops)
{
    /* drop finished steps; skip to the next round with an active step */
    int k = 0;
    for (int i = 0; i < it->nactive; i++)
        if (last_round(&p->steps[it->active[i]]) >= it->t)
            it->active[k++] = it->active[i];
    it->nactive = k;
    if (!it->nactive) {
        if (it->next == it->norder)
            return 0;
        int64_t f = first_round(&p->steps[it->order[it->next]]);
        if (f > it->t)
            it->t = f;
    }
    int grown = 0;
    while (it->next < it->norder && first_round(&p->steps[it->order[it->next]]) <= it->t) {
        it->active[it->nactive++] = it->order[it->next++];
        grown = 1;
    }
    if (grown) { /* step order inside a round: the group's send order */
        for (int i = 1; i < it->nactive; i++) {
            int v = it->active[i], j = i;
            while (j > 0 && it->active[j - 1] > v) {
                it->active[j] = it->active[j - 1];
                j--;
            }
            it->active[j] = v;
        }
    }
    if (it->cap < it->nactive * XM_POPS_MAX) {
        int cap = 2 * it->nactive * XM_POPS_MAX;
        xm_rop_t *o = realloc(it->ops, sizeof *o * cap);
        if (!o)
            return -1;
        it->ops = o;
        it->cap = cap;
    }
    int n = 0;
    for (int phase = 0; phase < 3; phase++)
        for (int i = 0; i < it->nactive; i++)
            step_ops(&p->steps[it->active[i]], it->active[i], it->t, phase, it, &n);
    *round = it->t++;
    *ops = it->ops;
    if (!n) /* cannot happen: an active step works in every round of its span */
        return xm_rounds_next(p, it, round, ops);
    return n;
}
