/*
 * The transport-agnostic half of running a program step: an op of a step
 * over the caller's blocks (one block per tensor of the plan; a packed step
 * visits the pieces of several tensors in one chunk), and where a chunk
 * starts in global coordinates (XMESH_CHECK's report). Shared by the MPI
 * runner (lib/mpi/exec.c) and the UCX runner (lib/ucx/exec.c).
 */
#include <stdio.h>

#include "xm_program.h"

size_t xm_pop_buf_es(const xm_pstep_t *s, const xm_pop_t *o)
{
    if (o->kind == XM_POP_TO_ACC || o->kind == XM_POP_ADD_ACC)
        return xmesh_dtype_size(xm_dtype_acc(s->sdt));
    return xmesh_dtype_size((xmesh_dtype_t)o->dt);
}

/* Op o of step s between the blocks of tensor k (geometries sg, dg) and
 * buf, over the box-linear elements [a, a + cnt) of that box. */
static void piece_op(const void *const *srcs, void *const *dsts, int k, const xm_geom_t *sg,
                     const xm_geom_t *dg, const xm_pstep_t *s, const xm_pop_t *o, char *buf,
                     int64_t a, int64_t cnt)
{
    char *src = (char *)srcs[k], *dst = dsts[k];
    switch (o->kind) {
    case XM_POP_PACK:
        xm_geom_copy_cv(XM_COPY_PACK, o->blk ? dg : sg, o->blk ? s->ddt : s->sdt,
                        (xmesh_dtype_t)o->dt, o->blk ? dst : src, buf, a, cnt);
        break;
    case XM_POP_TO_ACC:
    case XM_POP_ADD_ACC:
        xm_geom_copy(o->kind == XM_POP_TO_ACC ? XM_COPY_TO_ACC : XM_COPY_ADD_ACC, sg, s->sdt, src,
                     buf, a, cnt);
        break;
    case XM_POP_UNPACK:
        xm_geom_copy_cv(XM_COPY_UNPACK, dg, s->ddt, (xmesh_dtype_t)o->dt, dst, buf, a, cnt);
        break;
    case XM_POP_COPY:
        xm_geom_copy2_cv(sg, s->sdt, src, dg, s->ddt, dst, a, cnt);
        break;
    default:
        break;
    }
}

void xm_step_block_op(const xm_program_t *p, const void *const *srcs, void *const *dsts,
                      const xm_pstep_t *s, const xm_pop_t *o, char *buf, int64_t a, int64_t cnt)
{
    if (!s->npieces) {
        piece_op(srcs, dsts, s->tensor, &s->sg, &s->dg, s, o, buf, a, cnt);
        return;
    }
    size_t bes = xm_pop_buf_es(s, o);
    const xm_ppiece_t *pc = xm_pstep_piece_first(p, s, a);
    const xm_ppiece_t *end = p->pieces + s->piece_off + s->npieces;
    for (; pc < end && pc->off < a + cnt; pc++) {
        int64_t lo = a > pc->off ? a : pc->off;
        int64_t hi = a + cnt < pc->off + pc->n ? a + cnt : pc->off + pc->n;
        if (hi > lo)
            piece_op(srcs, dsts, pc->tensor, &pc->sg, &pc->dg, s, o,
                     buf ? buf + (lo - a) * (int64_t)bes : NULL, lo - pc->off, hi - lo);
    }
}

void xm_step_where(const xm_program_t *p, const xm_taskset_t *ts, int ntensors, const xm_pstep_t *s,
                   int64_t a, char *at, size_t len)
{
    const xm_box_t *b = &ts->tasks[s->task].box;
    int nd = xm_task_ndim(ts, &ts->tasks[s->task]);
    int o = 0;
    int64_t rem = a, idx[XM_MAX_DIMS];
    if (len)
        at[0] = '\0';
    if (len < 32)
        return;
    if (s->npieces) { /* a packed step: the tensor and its own box */
        const xm_ppiece_t *pc = xm_pstep_piece_first(p, s, a);
        const xm_piece_t *tp =
            &ts->pieces[ts->tasks[s->task].pack_off + (int)(pc - p->pieces - s->piece_off)];
        b = &tp->box;
        nd = ts->tmeta[tp->tensor].ndim;
        rem = a - pc->off;
        o = snprintf(at, len, "tensor %d: ", tp->tensor);
    } else if (ntensors > 1) {
        o = snprintf(at, len, "tensor %d: ", s->tensor);
    }
    for (int d = nd - 1; d >= 0; d--) {
        int64_t e = b->hi[d] - b->lo[d];
        idx[d] = b->lo[d] + rem % e;
        rem /= e;
    }
    for (int d = 0; d < nd && o < (int)len - 24; d++)
        o += snprintf(at + o, len - (size_t)o, "%s%lld", d ? "," : "", (long long)idx[d]);
}
