/*
 * xmesh-bench -s weights: whole models between meshes (issue 35 item 5).
 *
 * Cases (bf16; the source mesh on the first 2 hosts x 4 ranks, the
 * destination mesh on the next 2 hosts x 4 ranks, host-major; with fewer
 * than 16 ranks both meshes lie on the first 8 ranks):
 *   gpt2-fsdp-tp4  GPT-2 124M's 148 parameter tensors, FSDP-style S(0) over
 *                  all 8 training ranks -> two inference replicas of TP 4
 *                  (mesh 2x4: replicas x TP; Megatron column splits for
 *                  c_attn and c_fc, row splits for the projections,
 *                  vocabulary-parallel wte, the rest replicated);
 *   gpt2-tp4-tp2   the same parameters from Megatron 2x4 (DP x TP 4) to
 *                  Megatron 4x2 (DP x TP 2);
 *   1000x4k        1,000 tensors of 4 KiB, S(0) over 8 -> S(0) over TP 4,
 *                  replicated over 2;
 *   1x4000k        one tensor of the same 4,000 KiB and layouts.
 * Methods, in the same run, each timed over the same iterations:
 *   many        one plan of many tensors (xmesh_reshard_many);
 *   serial      one plan per tensor, one reshard after another;
 *   concurrent  one plan per tensor, every reshard started, then all waited;
 *   alltoallv   one MPI_Alltoallv per tensor over the world (each box from
 *               a holder on the receiver's host when there is one);
 *   ckpt-engine checkpoint-engine style: each tensor gathered whole to one
 *               rank per source host (tensors dealt round-robin), then each
 *               such rank broadcasts its tensors in buckets of
 *               XMESH_BENCH_BUCKET_BYTES (default 64 MiB) to every
 *               destination rank, which keeps its slice;
 *   bound       the model lower bound of the whole (the many plan's).
 * Every method's result is checked element by element after its timed
 * iterations (-c 0: not). XMESH_BENCH_WEIGHTS_DIV=D divides every dim of
 * the GPT-2 shapes by D (quick checks on one machine).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "xm_api.h"
#include "xm_program.h"
#include "xmesh/mpi.h"

#define W_MAX_T 1024

typedef struct {
    char name[48];
    int ndim;
    int64_t shape[2];
    const char *src_spec, *dst_spec;
} wt_t;

typedef struct {
    const char *name;
    int src_mesh[2], dst_mesh[2];
    int n;
    wt_t *t;
} wcase_t;

/* Megatron role of a GPT-2 parameter. */
enum { R_REPL = 0, R_COL_W, R_COL_B, R_ROW_W, R_VOCAB };

static void add_t(wcase_t *c, const char *name, int ndim, int64_t d0, int64_t d1, int role,
                  int fsdp_src, int tp_dst_axis)
{
    (void)tp_dst_axis;
    wt_t *t = &c->t[c->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = d1;
    static const char *tp2[] = {"B,B", "B,S(1)", "B,S(0)", "B,S(0)", "B,S(0)"};
    static const char *tp1[] = {"B,B", "B,B", "B,S(0)", "B,B", "B,B"};
    /* 1-D tensors: column biases split, the rest replicated */
    const char *dst = ndim == 2 ? tp2[role] : tp1[role];
    t->dst_spec = dst;
    t->src_spec = fsdp_src ? "S(0),S(0)" : dst;
}

static int64_t dv(int64_t x, int64_t div)
{
    return x / div > 0 ? x / div : 1;
}

/* GPT-2 124M (HF layout, Conv1D weights [in, out]): 148 tensors. */
static void gpt2(wcase_t *c, int fsdp_src, int64_t div)
{
    int64_t E = dv(768, div), V = dv(50257, div), P = dv(1024, div);
    add_t(c, "wte", 2, V, E, R_VOCAB, fsdp_src, 1);
    add_t(c, "wpe", 2, P, E, R_REPL, fsdp_src, 1);
    for (int l = 0; l < 12; l++) {
        char n[48];
#define L(s) (snprintf(n, sizeof n, "h.%d.%s", l, s), n)
        add_t(c, L("ln_1.weight"), 1, E, 0, R_REPL, fsdp_src, 1);
        add_t(c, L("ln_1.bias"), 1, E, 0, R_REPL, fsdp_src, 1);
        add_t(c, L("attn.c_attn.weight"), 2, E, 3 * E, R_COL_W, fsdp_src, 1);
        add_t(c, L("attn.c_attn.bias"), 1, 3 * E, 0, R_COL_B, fsdp_src, 1);
        add_t(c, L("attn.c_proj.weight"), 2, E, E, R_ROW_W, fsdp_src, 1);
        add_t(c, L("attn.c_proj.bias"), 1, E, 0, R_REPL, fsdp_src, 1);
        add_t(c, L("ln_2.weight"), 1, E, 0, R_REPL, fsdp_src, 1);
        add_t(c, L("ln_2.bias"), 1, E, 0, R_REPL, fsdp_src, 1);
        add_t(c, L("mlp.c_fc.weight"), 2, E, 4 * E, R_COL_W, fsdp_src, 1);
        add_t(c, L("mlp.c_fc.bias"), 1, 4 * E, 0, R_COL_B, fsdp_src, 1);
        add_t(c, L("mlp.c_proj.weight"), 2, 4 * E, E, R_ROW_W, fsdp_src, 1);
        add_t(c, L("mlp.c_proj.bias"), 1, E, 0, R_REPL, fsdp_src, 1);
#undef L
    }
    add_t(c, "ln_f.weight", 1, E, 0, R_REPL, fsdp_src, 1);
    add_t(c, "ln_f.bias", 1, E, 0, R_REPL, fsdp_src, 1);
}

static int make_case(const char *name, int64_t div, wcase_t *c)
{
    memset(c, 0, sizeof *c);
    c->name = name;
    c->t = calloc(W_MAX_T, sizeof *c->t);
    if (!c->t)
        return -1;
    c->src_mesh[0] = c->dst_mesh[0] = 2;
    c->src_mesh[1] = c->dst_mesh[1] = 4;
    if (!strcmp(name, "gpt2-fsdp-tp4")) {
        gpt2(c, 1, div);
    } else if (!strcmp(name, "gpt2-tp4-tp2")) {
        gpt2(c, 0, div);
        /* source: the same Megatron splits over TP 4 (axis 1); destination 4x2 */
        c->dst_mesh[0] = 4;
        c->dst_mesh[1] = 2;
    } else if (!strcmp(name, "1000x4k") || !strcmp(name, "1x4000k")) {
        int n = name[0] == '1' && name[1] == 'x' ? 1 : 1000;
        for (int k = 0; k < n; k++) {
            wt_t *t = &c->t[c->n++];
            snprintf(t->name, sizeof t->name, "t%d", k);
            t->ndim = 1;
            t->shape[0] = n == 1 ? 2048 * 1000 : 2048;
            t->src_spec = "S(0),S(0)";
            t->dst_spec = "B,S(0)";
        }
    } else {
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------ values */

static uint16_t g_tab[97]; /* bf16 of 1..97: exact */

static inline uint16_t want(int k, int64_t g)
{
    return g_tab[(g * 7 + k * 13) % 97];
}

typedef struct {
    int n;
    xmesh_layout_t *src, *dst;
    int64_t (*slo)[2], (*sext)[2], (*dlo)[2], (*dext)[2];
    int *sholds, *dholds;
    uint16_t **sb, **db;
    const void **sp;
    void **dp;
    int64_t bytes;
} wdata_t;

static int64_t vol(const int64_t *ext, int nd)
{
    int64_t v = 1;
    for (int d = 0; d < nd; d++)
        v *= ext[d];
    return v;
}

static void fill_src(const wcase_t *c, wdata_t *D)
{
    for (int k = 0; k < c->n; k++) {
        const wt_t *t = &c->t[k];
        if (!D->sholds[k])
            continue;
        int64_t e1 = t->ndim == 2 ? D->sext[k][1] : 1, n1 = t->ndim == 2 ? t->shape[1] : 1;
        int64_t l1 = t->ndim == 2 ? D->slo[k][1] : 0;
        for (int64_t i = 0; i < D->sext[k][0]; i++)
            for (int64_t j = 0; j < e1; j++)
                D->sb[k][i * e1 + j] = want(k, (D->slo[k][0] + i) * n1 + l1 + j);
    }
}

static void clear_dst(const wcase_t *c, wdata_t *D)
{
    for (int k = 0; k < c->n; k++)
        if (D->dholds[k])
            memset(D->db[k], 0, sizeof(uint16_t) * vol(D->dext[k], c->t[k].ndim));
}

static long long check_dst(const wcase_t *c, const wdata_t *D)
{
    long long wrong = 0;
    for (int k = 0; k < c->n; k++) {
        const wt_t *t = &c->t[k];
        if (!D->dholds[k])
            continue;
        int64_t e1 = t->ndim == 2 ? D->dext[k][1] : 1, n1 = t->ndim == 2 ? t->shape[1] : 1;
        int64_t l1 = t->ndim == 2 ? D->dlo[k][1] : 0;
        for (int64_t i = 0; i < D->dext[k][0]; i++)
            for (int64_t j = 0; j < e1; j++)
                wrong += D->db[k][i * e1 + j] != want(k, (D->dlo[k][0] + i) * n1 + l1 + j);
    }
    return wrong;
}

/* ------------------------------------------------------------ alltoallv */

typedef struct {
    int *scount, *sdispl, *rcount, *rdispl; /* bytes per world rank */
    int nsend, nrecv;                       /* boxes */
    xm_geom_t *sg, *rg;                     /* in the blocks, in buffer order */
    int64_t *soff, *roff, *sn, *rn;         /* buffer byte offset and elements per box */
    char *sbuf, *rbuf;
} a2a_t;

typedef struct {
    a2a_t *t; /* per tensor */
} a2a_all_t;

/* The boxes this rank sends / receives for one tensor: each receiver gets
 * each box from a holder on its own host when there is one, else holder
 * (receiver mod replicas), the way a hand-written exchange would. */
static int a2a_setup(const bench_world_t *w, xmesh_plan_t one, int k, const wdata_t *D, a2a_t *a)
{
    memset(a, 0, sizeof *a);
    xm_taskset_t ts;
    const xm_hostmap_t *hm = &one->ctx->hosts;
    if (xm_decompose(&one->src, &one->dst, hm, &ts))
        return -1;
    int P = w->size, me = w->rank;
    a->scount = calloc(P, sizeof(int));
    a->sdispl = calloc(P, sizeof(int));
    a->rcount = calloc(P, sizeof(int));
    a->rdispl = calloc(P, sizeof(int));
    int cap = 0;
    for (int t = 0; t < ts.ntasks; t++)
        cap += ts.tasks[t].nrecv;
    a->sg = calloc(cap + 1, sizeof *a->sg);
    a->rg = calloc(cap + 1, sizeof *a->rg);
    a->soff = calloc(cap + 1, sizeof(int64_t));
    a->roff = calloc(cap + 1, sizeof(int64_t));
    a->sn = calloc(cap + 1, sizeof(int64_t));
    a->rn = calloc(cap + 1, sizeof(int64_t));
    int *spass = calloc(P, sizeof(int)), *rpass = calloc(P, sizeof(int));
    int nd = one->src.ndim;
    int64_t slo[2] = {0}, shi[2] = {0}, dlo[2] = {0}, dhi[2] = {0};
    for (int d = 0; d < nd; d++) {
        slo[d] = D->slo[k][d];
        shi[d] = D->slo[k][d] + D->sext[k][d];
        dlo[d] = D->dlo[k][d];
        dhi[d] = D->dlo[k][d] + D->dext[k][d];
    }
    /* two passes: counts per peer, then boxes in (peer, task) order */
    for (int pass = 0; pass < 2; pass++) {
        int64_t stot = 0, rtot = 0;
        if (pass == 1) {
            for (int r = 0; r < P; r++) {
                a->sdispl[r] = (int)stot;
                a->rdispl[r] = (int)rtot;
                stot += a->scount[r];
                rtot += a->rcount[r];
                spass[r] = a->sdispl[r];
                rpass[r] = a->rdispl[r];
            }
            a->sbuf = malloc(stot + 1);
            a->rbuf = malloc(rtot + 1);
        }
        for (int t = 0; t < ts.ntasks; t++) {
            const xm_task_t *tk = &ts.tasks[t];
            int gs = tk->group_size;
            const int *H = ts.holders + tk->holder_off, *R = ts.recvs + tk->recv_off;
            int64_t n = xm_box_volume(&tk->box, nd), b = n * 2;
            for (int i = 0; i < tk->nrecv; i++) {
                int r = R[i], s = H[r % gs];
                for (int j = 0; j < gs; j++)
                    if (hm->host_of[H[j]] == hm->host_of[r]) {
                        s = H[j];
                        break;
                    }
                for (int j = 0; j < gs; j++)
                    if (H[j] == r)
                        s = r;
                if (pass == 0) {
                    if (s == me)
                        a->scount[r] += (int)b;
                    if (r == me)
                        a->rcount[s] += (int)b;
                    continue;
                }
                if (s == me) {
                    xm_geom_init(&a->sg[a->nsend], nd, slo, shi, &tk->box);
                    a->soff[a->nsend] = spass[r];
                    a->sn[a->nsend++] = n;
                    spass[r] += (int)b;
                }
                if (r == me) {
                    xm_geom_init(&a->rg[a->nrecv], nd, dlo, dhi, &tk->box);
                    a->roff[a->nrecv] = rpass[s];
                    a->rn[a->nrecv++] = n;
                    rpass[s] += (int)b;
                }
            }
        }
    }
    free(spass);
    free(rpass);
    xm_taskset_free(&ts);
    return 0;
}

static int a2a_run(a2a_t *a, const void *src, void *dst)
{
    for (int i = 0; i < a->nsend; i++)
        xm_geom_copy(XM_COPY_PACK, &a->sg[i], XMESH_BF16, (void *)src, a->sbuf + a->soff[i], 0,
                     a->sn[i]);
    if (MPI_Alltoallv(a->sbuf, a->scount, a->sdispl, MPI_BYTE, a->rbuf, a->rcount, a->rdispl,
                      MPI_BYTE, MPI_COMM_WORLD) != MPI_SUCCESS)
        return -1;
    for (int i = 0; i < a->nrecv; i++)
        xm_geom_copy(XM_COPY_UNPACK, &a->rg[i], XMESH_BF16, dst, a->rbuf + a->roff[i], 0, a->rn[i]);
    return 0;
}

static void a2a_free(a2a_t *a)
{
    free(a->scount);
    free(a->sdispl);
    free(a->rcount);
    free(a->rdispl);
    free(a->sg);
    free(a->rg);
    free(a->soff);
    free(a->roff);
    free(a->sn);
    free(a->rn);
    free(a->sbuf);
    free(a->rbuf);
}

/* ------------------------------------------------------- ckpt-engine */

typedef struct {
    int nleaders, *leader;  /* one rank per source host (its lowest) */
    int *owner;             /* per tensor: index of its leader */
    MPI_Comm *comm;         /* per leader: it (root 0) + the destination ranks */
    int64_t *foff;          /* per tensor: byte offset of its full image in its bucket */
    int *bucket;            /* per tensor: its bucket (global numbering) */
    int nbuckets, *bleader; /* per bucket: leader index */
    int64_t *bbytes;        /* per bucket */
    char **bbuf;            /* leader: its buckets; NULL elsewhere */
    char *rbuf;             /* destination ranks: one bucket */
    int64_t maxb;
    /* phase 1: this rank's sends (tensor, block) and the leader's receives */
    int nsend, *send_k;
    int nrecv, *recv_k, *recv_pos;
    char **recv_buf;
    int64_t *recv_n;
} ckpt_t;

static int in_mesh(const int *ranks, int n, int r)
{
    for (int i = 0; i < n; i++)
        if (ranks[i] == r)
            return i;
    return -1;
}

/* Whether mesh position i is the first one holding its block (replicas
 * send once). */
static int first_replica(const xm_layout_t *l, int i)
{
    int64_t lo[XM_MAX_DIMS], hi[XM_MAX_DIMS], lo2[XM_MAX_DIMS], hi2[XM_MAX_DIMS];
    xm_layout_block(l, i, lo, hi);
    for (int j = 0; j < i; j++) {
        xm_layout_block(l, j, lo2, hi2);
        if (!memcmp(lo, lo2, sizeof(int64_t) * l->ndim) &&
            !memcmp(hi, hi2, sizeof(int64_t) * l->ndim))
            return 0;
    }
    return 1;
}

static int ckpt_setup(const bench_world_t *w, const wcase_t *c, xmesh_plan_t many,
                      const int *sranks, int ns, const int *dranks, int nd_, ckpt_t *e)
{
    memset(e, 0, sizeof *e);
    const xm_hostmap_t *hm = &many->ctx->hosts;
    e->leader = calloc(ns, sizeof(int));
    for (int i = 0; i < ns; i++) {
        int r = sranks[i], have = 0;
        for (int j = 0; j < e->nleaders; j++)
            if (hm->host_of[e->leader[j]] == hm->host_of[r]) {
                if (r < e->leader[j])
                    e->leader[j] = r;
                have = 1;
            }
        if (!have)
            e->leader[e->nleaders++] = r;
    }
    int64_t bucket = 64ll << 20;
    const char *bb = getenv("XMESH_BENCH_BUCKET_BYTES");
    if (bb && atoll(bb) > 0)
        bucket = atoll(bb);
    e->owner = calloc(c->n, sizeof(int));
    e->foff = calloc(c->n, sizeof(int64_t));
    e->bucket = calloc(c->n, sizeof(int));
    e->bleader = calloc(c->n + 1, sizeof(int));
    e->bbytes = calloc(c->n + 1, sizeof(int64_t));
    for (int k = 0; k < c->n; k++)
        e->owner[k] = k % e->nleaders;
    /* buckets: per leader, its tensors in order, <= bucket bytes (a larger
     * tensor is a bucket of its own) */
    for (int L = 0; L < e->nleaders; L++) {
        int cur = -1;
        for (int k = 0; k < c->n; k++) {
            if (e->owner[k] != L)
                continue;
            int64_t b = vol(c->t[k].shape, c->t[k].ndim) * 2;
            if (cur < 0 || (e->bbytes[cur] + b > bucket && e->bbytes[cur] > 0)) {
                cur = e->nbuckets++;
                e->bleader[cur] = L;
            }
            e->bucket[k] = cur;
            e->foff[k] = e->bbytes[cur];
            e->bbytes[cur] += (b + 63) / 64 * 64;
        }
    }
    for (int b = 0; b < e->nbuckets; b++)
        if (e->bbytes[b] > e->maxb)
            e->maxb = e->bbytes[b];
    int me = w->rank, isdst = in_mesh(dranks, nd_, me) >= 0;
    e->bbuf = calloc(e->nbuckets + 1, sizeof(char *));
    for (int b = 0; b < e->nbuckets; b++)
        if (e->leader[e->bleader[b]] == me)
            e->bbuf[b] = malloc(e->bbytes[b] + 1);
    if (isdst)
        e->rbuf = malloc(e->maxb + 1);
    e->comm = calloc(e->nleaders, sizeof(MPI_Comm));
    for (int L = 0; L < e->nleaders; L++) {
        int member = isdst || e->leader[L] == me;
        MPI_Comm_split(MPI_COMM_WORLD, member ? 0 : MPI_UNDEFINED, e->leader[L] == me ? -1 : me,
                       &e->comm[L]);
    }
    /* phase 1 lists */
    e->send_k = calloc(c->n + 1, sizeof(int));
    int cap = 0;
    for (int k = 0; k < c->n; k++)
        cap += many->srcs[k].mesh.ndev;
    e->recv_k = calloc(cap + 1, sizeof(int));
    e->recv_pos = calloc(cap + 1, sizeof(int));
    e->recv_buf = calloc(cap + 1, sizeof(char *));
    e->recv_n = calloc(cap + 1, sizeof(int64_t));
    for (int k = 0; k < c->n; k++) {
        const xm_layout_t *l = &many->srcs[k];
        int own = e->leader[e->owner[k]];
        for (int i = 0; i < l->mesh.ndev; i++) {
            if (!first_replica(l, i) || xm_layout_block_volume(l, i) == 0)
                continue;
            int r = l->mesh.devs[i];
            if (r == me && r != own)
                e->send_k[e->nsend++] = k;
            if (own == me) {
                int q = e->nrecv++;
                e->recv_k[q] = k;
                e->recv_pos[q] = i;
                e->recv_n[q] = xm_layout_block_volume(l, i);
                e->recv_buf[q] = r == me ? NULL : malloc(e->recv_n[q] * 2 + 1);
            }
        }
    }
    return 0;
}

static int ckpt_run(ckpt_t *e, const wcase_t *c, xmesh_plan_t many, const wdata_t *D,
                    const bench_world_t *w)
{
    int me = w->rank;
    MPI_Request *rq = malloc(sizeof *rq * (e->nsend + e->nrecv + 1));
    int nr = 0;
    /* 1. gather each tensor whole on its owner */
    for (int q = 0; q < e->nrecv; q++) {
        int k = e->recv_k[q];
        const xm_layout_t *l = &many->srcs[k];
        int r = l->mesh.devs[e->recv_pos[q]];
        if (r != me)
            MPI_Irecv(e->recv_buf[q], (int)(e->recv_n[q] * 2), MPI_BYTE, r, k % 30000,
                      MPI_COMM_WORLD, &rq[nr++]);
    }
    for (int s = 0; s < e->nsend; s++) {
        int k = e->send_k[s];
        MPI_Isend(D->sb[k], (int)(vol(D->sext[k], c->t[k].ndim) * 2), MPI_BYTE,
                  e->leader[e->owner[k]], k % 30000, MPI_COMM_WORLD, &rq[nr++]);
    }
    bench_waitall(w, nr, rq);
    free(rq);
    for (int q = 0; q < e->nrecv; q++) {
        int k = e->recv_k[q];
        const xm_layout_t *l = &many->srcs[k];
        int64_t lo[XM_MAX_DIMS], hi[XM_MAX_DIMS], zero[XM_MAX_DIMS] = {0};
        xm_layout_block(l, e->recv_pos[q], lo, hi);
        xm_box_t box;
        memset(&box, 0, sizeof box);
        for (int d = 0; d < l->ndim; d++) {
            box.lo[d] = lo[d];
            box.hi[d] = hi[d];
        }
        xm_geom_t g;
        xm_geom_init(&g, l->ndim, zero, l->shape, &box);
        const void *blk = e->recv_buf[q] ? (const void *)e->recv_buf[q] : (const void *)D->sb[k];
        xm_geom_copy(XM_COPY_UNPACK, &g, XMESH_BF16, e->bbuf[e->bucket[k]] + e->foff[k],
                     (void *)blk, 0, e->recv_n[q]);
    }
    /* 2. every owner broadcasts its buckets; destination ranks keep their slices */
    for (int b = 0; b < e->nbuckets; b++) {
        int L = e->bleader[b];
        if (e->comm[L] == MPI_COMM_NULL)
            continue;
        char *buf = e->leader[L] == me ? e->bbuf[b] : e->rbuf;
        if (MPI_Bcast(buf, (int)e->bbytes[b], MPI_BYTE, 0, e->comm[L]) != MPI_SUCCESS)
            return -1;
        for (int k = 0; k < c->n; k++) {
            if (e->bucket[k] != b || !D->dholds[k])
                continue;
            const xm_layout_t *l = &many->dsts[k];
            int64_t zero[XM_MAX_DIMS] = {0};
            xm_box_t box;
            memset(&box, 0, sizeof box);
            for (int d = 0; d < l->ndim; d++) {
                box.lo[d] = D->dlo[k][d];
                box.hi[d] = D->dlo[k][d] + D->dext[k][d];
            }
            xm_geom_t g;
            xm_geom_init(&g, l->ndim, zero, l->shape, &box);
            xm_geom_copy(XM_COPY_PACK, &g, XMESH_BF16, buf + e->foff[k], D->db[k], 0,
                         vol(D->dext[k], l->ndim));
        }
    }
    return 0;
}

static void ckpt_free(ckpt_t *e, const wcase_t *c)
{
    (void)c;
    for (int L = 0; L < e->nleaders; L++)
        if (e->comm[L] != MPI_COMM_NULL)
            MPI_Comm_free(&e->comm[L]);
    for (int b = 0; b < e->nbuckets; b++)
        free(e->bbuf[b]);
    for (int q = 0; q < e->nrecv; q++)
        free(e->recv_buf[q]);
    free(e->comm);
    free(e->bbuf);
    free(e->rbuf);
    free(e->leader);
    free(e->owner);
    free(e->foff);
    free(e->bucket);
    free(e->bleader);
    free(e->bbytes);
    free(e->send_k);
    free(e->recv_k);
    free(e->recv_pos);
    free(e->recv_buf);
    free(e->recv_n);
}

/* ------------------------------------------------------------ harness */

typedef struct {
    char cs[24], method[16];
    int tensors;
    int64_t bytes;
    double med, min, max, lb, pred, plan_s;
    long long wrong;
    int ok;
} wrow_t;

static wrow_t g_rows[64];
static int g_nrows;

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

enum { M_MANY = 0, M_SERIAL, M_CONC, M_A2A, M_CKPT, M_N };
static const char *const mnames[M_N] = {"many", "serial", "concurrent", "alltoallv", "ckpt-engine"};

typedef struct {
    const wcase_t *c;
    wdata_t *D;
    xmesh_plan_t many, *one;
    a2a_t *a2a;
    ckpt_t *ck;
    const bench_world_t *w;
} wrun_t;

static int run_once(wrun_t *R, int m)
{
    const wcase_t *c = R->c;
    wdata_t *D = R->D;
    int rc = 0;
    switch (m) {
    case M_MANY:
        rc = xmesh_reshard_many(R->many, D->sp, D->dp) != XMESH_SUCCESS;
        break;
    case M_SERIAL:
        for (int k = 0; k < c->n && !rc; k++)
            rc = xmesh_reshard(R->one[k], D->sp[k], D->dp[k]) != XMESH_SUCCESS;
        break;
    case M_CONC: {
        xmesh_request_t *q = malloc(sizeof *q * c->n);
        int started = 0;
        for (int k = 0; k < c->n && !rc; k++, started++)
            rc = xmesh_reshard_start(R->one[k], D->sp[k], D->dp[k], &q[k]) != XMESH_SUCCESS;
        if (rc)
            started--;
        for (int k = 0; k < started; k++)
            rc |= xmesh_wait(q[k]) != XMESH_SUCCESS;
        free(q);
        break;
    }
    case M_A2A:
        for (int k = 0; k < c->n && !rc; k++)
            rc = a2a_run(&R->a2a[k], D->sp[k], D->dp[k]);
        break;
    default:
        rc = ckpt_run(R->ck, c, R->many, D, R->w);
    }
    if (rc)
        fprintf(stderr, "xmesh-bench weights: rank %d: %s: %s\n", R->w->rank, mnames[m],
                xmesh_last_error());
    return rc;
}

static void time_method(wrun_t *R, int m, const bench_weights_opts_t *o, wrow_t *row)
{
    const bench_world_t *w = R->w;
    int n = o->iters > 0 ? o->iters : 1, bad = 0;
    double *t = calloc(n, sizeof(double));
    for (int i = 0; i < o->warmup; i++)
        bad |= run_once(R, m);
    for (int i = 0; i < n; i++) {
        if (i == n - 1) /* the checked result is the last timed run's own */
            clear_dst(R->c, R->D);
        bench_barrier(w, MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        bad |= run_once(R, m);
        double dt = MPI_Wtime() - t0;
        MPI_Allreduce(&dt, &t[i], 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    }
    long long wrong = o->check ? check_dst(R->c, R->D) : 0, all = 0;
    MPI_Allreduce(&wrong, &all, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    int ok = !bad, allok = 0;
    MPI_Allreduce(&ok, &allok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    qsort(t, n, sizeof(double), cmp_d);
    row->med = n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
    row->min = t[0];
    row->max = t[n - 1];
    row->wrong = all;
    row->ok = allok;
    free(t);
}

static void print_row(const wrow_t *r)
{
    char pred[16] = "-", plan[16] = "-", tlb[16] = "-";
    if (!isnan(r->pred))
        snprintf(pred, sizeof pred, "%.4g", r->pred);
    if (!isnan(r->plan_s))
        snprintf(plan, sizeof plan, "%.4g", r->plan_s);
    if (r->lb > 0 && !isnan(r->med))
        snprintf(tlb, sizeof tlb, "%.3f", r->med / r->lb);
    if (!strcmp(r->method, "bound"))
        printf("%-14s %-12s %5d %11lld %9.4g %9s %9s %7s %9s %9s %7s\n", r->cs, r->method,
               r->tensors, (long long)r->bytes, r->lb, "-", "-", "1.000", pred, "-", "-");
    else
        printf("%-14s %-12s %5d %11lld %9.4g %9.4g %9.4g %7s %9s %9s %7lld%s\n", r->cs, r->method,
               r->tensors, (long long)r->bytes, r->med, r->min, r->max, tlb, pred, plan, r->wrong,
               r->ok ? "" : " ERROR");
    fflush(stdout);
}

static int in_csv(const char *list, const char *name)
{
    if (!list)
        return 1;
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *q = strchr(p, ',');
        size_t len = q ? (size_t)(q - p) : strlen(p);
        if (len == n && !strncmp(p, name, n))
            return 1;
        if (!q)
            break;
        p = q + 1;
    }
    return 0;
}

/* Ranks of both meshes: host-major, source on the first 8, destination on
 * the next 8 (or the same 8 when the world has fewer than 16). */
static void place(const bench_world_t *w, int *sr, int *dr)
{
    for (int i = 0; i < 8; i++) {
        sr[i] = w->host_ranks[i % w->size];
        dr[i] = w->host_ranks[(w->size >= 16 ? 8 + i : i) % w->size];
    }
}

static void run_case(const bench_world_t *w, xmesh_ctx_t ctx, const wcase_t *c,
                     const bench_weights_opts_t *o)
{
    int sr[8], dr[8], me = w->rank;
    place(w, sr, dr);
    xmesh_mesh_t A, B;
    xmesh_mesh_create(ctx, 2, c->src_mesh, sr, &A);
    xmesh_mesh_create(ctx, 2, c->dst_mesh, dr, &B);
    wdata_t D;
    memset(&D, 0, sizeof D);
    int n = c->n;
    D.n = n;
    D.src = calloc(n, sizeof *D.src);
    D.dst = calloc(n, sizeof *D.dst);
    D.slo = calloc(n, sizeof *D.slo);
    D.sext = calloc(n, sizeof *D.sext);
    D.dlo = calloc(n, sizeof *D.dlo);
    D.dext = calloc(n, sizeof *D.dext);
    D.sholds = calloc(n, sizeof(int));
    D.dholds = calloc(n, sizeof(int));
    D.sb = calloc(n, sizeof *D.sb);
    D.db = calloc(n, sizeof *D.db);
    D.sp = calloc(n, sizeof *D.sp);
    D.dp = calloc(n, sizeof *D.dp);
    for (int k = 0; k < n; k++) {
        const wt_t *t = &c->t[k];
        D.src[k] = (xmesh_layout_t){t->ndim, t->shape, XMESH_BF16, A, t->src_spec};
        D.dst[k] = (xmesh_layout_t){t->ndim, t->shape, XMESH_BF16, B, t->dst_spec};
        xmesh_layout_local_shape(&D.src[k], me, D.sext[k], &D.sholds[k]);
        xmesh_layout_local_offset(&D.src[k], me, D.slo[k], &D.sholds[k]);
        xmesh_layout_local_shape(&D.dst[k], me, D.dext[k], &D.dholds[k]);
        xmesh_layout_local_offset(&D.dst[k], me, D.dlo[k], &D.dholds[k]);
        if (D.sholds[k])
            D.sp[k] = D.sb[k] = malloc(sizeof(uint16_t) * vol(D.sext[k], t->ndim) + 2);
        if (D.dholds[k])
            D.dp[k] = D.db[k] = malloc(sizeof(uint16_t) * vol(D.dext[k], t->ndim) + 2);
        D.bytes += vol(t->shape, t->ndim) * 2;
    }
    fill_src(c, &D);
    wrun_t R = {.c = c, .D = &D, .w = w};
    /* plans (timed: creation, max over ranks) */
    double t0 = MPI_Wtime();
    xmesh_result_t r = xmesh_plan_create_many(ctx, n, D.src, D.dst, NULL, &R.many);
    double many_plan = MPI_Wtime() - t0, mp = 0;
    MPI_Allreduce(&many_plan, &mp, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (r) {
        if (me == 0)
            fprintf(stderr, "xmesh-bench weights: %s: plan of many: %s\n", c->name,
                    xmesh_last_error());
        return;
    }
    xmesh_plan_info_t info;
    xmesh_plan_get_info(R.many, &info);
    R.one = calloc(n, sizeof *R.one);
    double ones_pred = 0, op = 0;
    t0 = MPI_Wtime();
    for (int k = 0; k < n; k++) {
        if (xmesh_plan_create(ctx, &D.src[k], &D.dst[k], NULL, &R.one[k]))
            fprintf(stderr, "rank %d: plan of tensor %d: %s\n", me, k, xmesh_last_error());
        xmesh_plan_info_t i1;
        xmesh_plan_get_info(R.one[k], &i1);
        ones_pred += i1.predicted_s;
    }
    double ones_plan = MPI_Wtime() - t0;
    MPI_Allreduce(&ones_plan, &op, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    int want[M_N];
    for (int m = 0; m < M_N; m++)
        want[m] = in_csv(o->methods, mnames[m]);
    a2a_t *a2a = NULL;
    ckpt_t ck;
    memset(&ck, 0, sizeof ck);
    double a2a_setup_s = NAN, ck_setup_s = NAN;
    if (want[M_A2A]) {
        t0 = MPI_Wtime();
        a2a = calloc(n, sizeof *a2a);
        for (int k = 0; k < n; k++)
            a2a_setup(w, R.one[k], k, &D, &a2a[k]);
        a2a_setup_s = MPI_Wtime() - t0;
        R.a2a = a2a;
    }
    if (want[M_CKPT] && n > 0) {
        t0 = MPI_Wtime();
        ckpt_setup(w, c, R.many, sr, 8, dr, 8, &ck);
        ck_setup_s = MPI_Wtime() - t0;
        R.ck = &ck;
    }
    double setup[M_N] = {mp, op, op, a2a_setup_s, ck_setup_s};
    double pred[M_N] = {info.predicted_s, ones_pred, NAN, NAN, NAN};
    wrow_t *b = &g_rows[g_nrows++];
    memset(b, 0, sizeof *b);
    snprintf(b->cs, sizeof b->cs, "%s", c->name);
    snprintf(b->method, sizeof b->method, "bound");
    b->tensors = n;
    b->bytes = D.bytes;
    b->lb = info.lower_bound_s;
    b->pred = NAN;
    b->med = b->min = b->max = NAN;
    b->plan_s = NAN;
    b->ok = 1;
    if (me == 0) {
        printf("# %s: %d tensors, %lld bytes; the plan of many: %d unit tasks in %d scheduled "
               "tasks, lower bound %.4g s, predicted %.4g s\n",
               c->name, n, (long long)D.bytes, info.unit_tasks, info.scheduled_tasks,
               info.lower_bound_s, info.predicted_s);
        print_row(b);
    }
    for (int m = 0; m < M_N; m++) {
        if (!want[m])
            continue;
        wrow_t *row = &g_rows[g_nrows++];
        memset(row, 0, sizeof *row);
        snprintf(row->cs, sizeof row->cs, "%s", c->name);
        snprintf(row->method, sizeof row->method, "%s", mnames[m]);
        row->tensors = n;
        row->bytes = D.bytes;
        row->lb = info.lower_bound_s;
        row->pred = pred[m];
        row->plan_s = setup[m];
        time_method(&R, m, o, row);
        if (me == 0)
            print_row(row);
    }
    for (int k = 0; k < n; k++) {
        xmesh_plan_destroy(R.one[k]);
        if (a2a)
            a2a_free(&a2a[k]);
        free(D.sb[k]);
        free(D.db[k]);
    }
    if (R.ck)
        ckpt_free(&ck, c);
    free(a2a);
    free(R.one);
    xmesh_plan_destroy(R.many);
    xmesh_mesh_destroy(A);
    xmesh_mesh_destroy(B);
    free(D.src);
    free(D.dst);
    free(D.slo);
    free(D.sext);
    free(D.dlo);
    free(D.dext);
    free(D.sholds);
    free(D.dholds);
    free(D.sb);
    free(D.db);
    free(D.sp);
    free(D.dp);
}

static const wrow_t *find_row(const char *cs, const char *m)
{
    for (int i = 0; i < g_nrows; i++)
        if (!strcmp(g_rows[i].cs, cs) && !strcmp(g_rows[i].method, m))
            return &g_rows[i];
    return NULL;
}

static void targets(void)
{
    printf("# targets (issue 35):\n");
    for (int i = 0; i < g_nrows; i++) {
        const wrow_t *r = &g_rows[i];
        if (strcmp(r->method, "many"))
            continue;
        printf("#   %-14s many / bound = %.3f (target <= 1.05)", r->cs,
               r->lb > 0 ? r->med / r->lb : 0);
        double best = INFINITY;
        const char *bn = "-";
        for (int m = M_SERIAL; m < M_N; m++) {
            const wrow_t *q = find_row(r->cs, mnames[m]);
            if (q && q->med < best) {
                best = q->med;
                bn = q->method;
            }
        }
        if (isfinite(best)) {
            const wrow_t *q = find_row(r->cs, bn);
            printf("; best per-tensor method %s %.3fx slower (target >= 1.3; intervals %s)", bn,
                   best / r->med, q->min > r->max ? "apart" : "overlap");
        }
        printf("\n");
    }
    const wrow_t *k = find_row("1000x4k", "many"), *one = find_row("1x4000k", "many");
    if (k && one)
        printf("#   1000 x 4 KiB / one tensor of the same bytes = %.2f (target <= 2)\n",
               k->med / one->med);
}

static void write_json(const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "xmesh-bench weights: cannot write %s\n", path);
        return;
    }
    fprintf(f, "{\"suite\": \"weights\", \"rows\": [\n");
    for (int i = 0; i < g_nrows; i++) {
        const wrow_t *r = &g_rows[i];
        fprintf(f,
                "  {\"case\": \"%s\", \"method\": \"%s\", \"tensors\": %d, \"bytes\": %lld, "
                "\"median_s\": %s%.9g%s, \"min_s\": %s%.9g%s, \"max_s\": %s%.9g%s, "
                "\"lower_bound_s\": %.9g, \"predicted_s\": %s%.9g%s, \"setup_s\": %s%.9g%s, "
                "\"wrong\": %lld, \"ok\": %s}%s\n",
                r->cs, r->method, r->tensors, (long long)r->bytes, isnan(r->med) ? "\"" : "",
                isnan(r->med) ? 0.0 : r->med, isnan(r->med) ? "\"" : "", isnan(r->min) ? "\"" : "",
                isnan(r->min) ? 0.0 : r->min, isnan(r->min) ? "\"" : "", isnan(r->max) ? "\"" : "",
                isnan(r->max) ? 0.0 : r->max, isnan(r->max) ? "\"" : "", r->lb,
                isnan(r->pred) ? "\"" : "", isnan(r->pred) ? 0.0 : r->pred,
                isnan(r->pred) ? "\"" : "", isnan(r->plan_s) ? "\"" : "",
                isnan(r->plan_s) ? 0.0 : r->plan_s, isnan(r->plan_s) ? "\"" : "", r->wrong,
                r->ok ? "true" : "false", i + 1 < g_nrows ? "," : "");
    }
    fprintf(f, "]}\n");
    fclose(f);
}

int bench_weights(const bench_world_t *w, xmesh_ctx_t ctx, const bench_weights_opts_t *o)
{
    for (int i = 0; i < 97; i++) {
        float v = (float)(i + 1);
        xmesh_convert(XMESH_BF16, &g_tab[i], XMESH_F32, &v, 1);
    }
    int64_t div = 1;
    const char *dvs = getenv("XMESH_BENCH_WEIGHTS_DIV");
    if (dvs && atoll(dvs) > 1)
        div = atoll(dvs);
    if (w->size < 8) {
        if (w->rank == 0)
            fprintf(stderr, "xmesh-bench -s weights: needs >= 8 ranks (16 for disjoint meshes)\n");
        return 2;
    }
    if (w->rank == 0) {
        printf("# weights: %s meshes (%d ranks, %d hosts)%s; bf16; time = seconds from a common "
               "barrier to the last rank done\n",
               w->size >= 16 ? "disjoint 2x4 -> 2x4" : "OVERLAPPING (fewer than 16 ranks)", w->size,
               w->nhosts, div > 1 ? "; GPT-2 dims divided by XMESH_BENCH_WEIGHTS_DIV" : "");
        printf("# t/LB: median / the plan of many's lower bound; pred: modelled time (many: the "
               "plan's; serial: sum of per-tensor plans'); setup: plan creation / baseline setup, "
               "s\n");
        printf("%-14s %-12s %5s %11s %9s %9s %9s %7s %9s %9s %7s\n", "case", "method", "n", "bytes",
               "med(s)", "min(s)", "max(s)", "t/LB", "pred(s)", "setup(s)", "#wrong");
    }
    static const char *const cases[] = {"gpt2-fsdp-tp4", "gpt2-tp4-tp2", "1000x4k", "1x4000k"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (!in_csv(o->cases, cases[i]))
            continue;
        wcase_t c;
        if (make_case(cases[i], div, &c) == 0)
            run_case(w, ctx, &c, o);
        free(c.t);
    }
    long long wrong = 0;
    int bad = 0;
    for (int i = 0; i < g_nrows; i++) {
        wrong += g_rows[i].wrong;
        bad += !g_rows[i].ok;
    }
    if (w->rank == 0) {
        targets();
        printf("# wrong elements: %lld %s; failed rows: %d\n", wrong, wrong ? "WRONG" : "OK", bad);
        if (o->json)
            write_json(o->json);
    }
    return wrong || bad ? 1 : 0;
}
