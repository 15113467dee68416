/*
 * Pipeline driver with a boundary dtype (driver.h, "Boundary dtype"): toy stages on a chain
 * write pseudo-random f32 activations (forward) and input gradients (backward_input), with
 * bf16 and f16 rounding ties, tiny and large values mixed in. Every element each consumer
 * receives (in[] and grad_out[]) must equal the producer's f32 value rounded to the wire dtype
 * by a reference conversion written here from the formats (bf16: round to nearest even on the
 * 16 dropped bits; f16: the compiler's _Float16 conversion, IEEE round to nearest even), then
 * widened to f32; with no boundary dtype (and an explicit f32 one) the values must arrive
 * unchanged. Also: the driver's boundary bytes halve against the f32 run, a per-edge
 * wire_dtype overrides the driver's, and a wire dtype that is not f32/f16/bf16 is refused
 * naming it. Graphs: 2 ranks (two 1-rank stages; zb-v with 4 stages on 2 groups, the edge 1>2
 * inside a group), 4 ranks (two 2-rank stages, S(0) -> S(1), the same zb-v on 2-rank groups,
 * and a 4-stage chain). Usage: test_driver_bdtype [--seed N]
 */
#include "pipe/driver.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NR 8 /* rows */
#define NC 6 /* columns */
#define MAXS 4
#define M 4 /* microbatches */

static int rank, nranks, failures;
static unsigned long long seed = 20261125ULL;

typedef struct {
    int stages;
    int mesh_n[MAXS];
    int mesh_r[MAXS][4];
    const char *spec[MAXS]; /* layout of the tensors on stage s's mesh (in and out edges) */
    int ngroups;            /* 0: one stage per group (1f1b); else the V map (zb-v, 2 groups) */
} graph_t;

/* ------------------------------------------------------------ reference rounding */

static uint32_t f2u(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}
static float u2f(uint32_t u)
{
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* f32 -> bf16 -> f32, round to nearest even on the dropped 16 bits (finite inputs). */
static float ref_bf16(float x)
{
    uint32_t u = f2u(x), low = u & 0xffffu, keep = u & 0xffff0000u;
    uint32_t lsb = (u >> 16) & 1u;
    if (low > 0x8000u || (low == 0x8000u && lsb))
        keep += 0x10000u;
    return u2f(keep);
}

static float ref_round(xmesh_dtype_t wire, float x)
{
    if (wire == XMESH_BF16)
        return ref_bf16(x);
#ifdef __FLT16_MANT_DIG__
    if (wire == XMESH_F16)
        return (float)(_Float16)x;
#endif
    return x;
}

/* ------------------------------------------------------------------ values */

static uint64_t mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* The f32 value a producer writes at (i, j) of edge e's tensor of microbatch mb, step, dir. */
static float value(int dir, int e, int step, int mb, int i, int j)
{
    uint64_t h =
        mix(seed ^ mix((uint64_t)(((((dir * 8 + e) * 8 + step) * 16 + mb) * 64 + i) * 64 + j)));
    uint32_t sign = (uint32_t)(h & 1) << 31;
    uint32_t ex = 127 - 20 + (uint32_t)((h >> 1) % 36); /* 2^-20 .. 2^15: f16 normal/subnormal */
    uint32_t man = (uint32_t)(h >> 8) & 0x7fffffu;
    switch ((h >> 40) % 6) {
    case 0: /* bf16 tie */
        man = (man & 0x7f0000u) | 0x8000u;
        break;
    case 1: /* f16 tie (13 dropped bits) */
        man = (man & 0x7fe000u) | 0x1000u;
        break;
    default:
        break;
    }
    return u2f(sign | ex << 23 | man);
}

/* This rank's block of a [NR, NC] tensor in spec ("S(0)", "S(1)", "B") over k ranks, index idx */
static void block(const char *spec, int k, int idx, int *r0, int *nr, int *c0, int *nc)
{
    *r0 = *c0 = 0;
    *nr = NR;
    *nc = NC;
    if (!strcmp(spec, "S(0)")) {
        *nr = NR / k;
        *r0 = idx * *nr;
    } else if (!strcmp(spec, "S(1)")) {
        *nc = NC / k;
        *c0 = idx * *nc;
    }
}

/* ------------------------------------------------------------------ toy stage */

typedef struct {
    const graph_t *g;
    int s, idx, k, step;
    xmesh_dtype_t wire_in, wire_out; /* wire dtype of the in-edge and of the out-edge */
    long checked, bad;
} toy_t;

static void fill(const toy_t *t, int dir, int e, int mb, float *out)
{
    int r0, nr, c0, nc;
    block(t->g->spec[t->s], t->k, t->idx, &r0, &nr, &c0, &nc);
    for (int i = 0; i < nr; i++)
        for (int j = 0; j < nc; j++)
            out[i * nc + j] = value(dir, e, t->step, mb, r0 + i, c0 + j);
}

static void check(toy_t *t, int dir, int e, int mb, xmesh_dtype_t wire, const float *in)
{
    int r0, nr, c0, nc;
    block(t->g->spec[t->s], t->k, t->idx, &r0, &nr, &c0, &nc);
    for (int i = 0; i < nr; i++)
        for (int j = 0; j < nc; j++) {
            float want = ref_round(wire, value(dir, e, t->step, mb, r0 + i, c0 + j));
            float got = in[i * nc + j];
            t->checked++;
            if (f2u(got) != f2u(want)) {
                if (t->bad++ < 5)
                    fprintf(stderr,
                            "FAIL rank %d stage %d %s e%d mb %d (%d,%d): got %.9g (0x%08x) want "
                            "%.9g (0x%08x) [%s]\n",
                            rank, t->s, dir ? "grad" : "act", e, mb, r0 + i, c0 + j, got, f2u(got),
                            want, f2u(want), xmesh_dtype_name(wire));
            }
        }
}

static int toy_forward(void *u, int mb, const void *const *in, void *const *out, double *loss)
{
    toy_t *t = u;
    (void)loss;
    if (t->s > 0)
        check(t, XMP_DIR_ACT, t->s - 1, mb, t->wire_in, in[0]);
    if (t->s < t->g->stages - 1)
        fill(t, XMP_DIR_ACT, t->s, mb, out[0]);
    return 0;
}

static int toy_bwd_input(void *u, int mb, const void *const *grad_out, void *const *grad_in)
{
    toy_t *t = u;
    if (t->s < t->g->stages - 1)
        check(t, XMP_DIR_GRAD, t->s, mb, t->wire_out, grad_out[0]);
    if (t->s > 0)
        fill(t, XMP_DIR_GRAD, t->s - 1, mb, grad_in[0]);
    return 0;
}

/* ------------------------------------------------------------------ cases */

/* Runs 2 steps of 1f1b in `mode` with cfg.boundary_dtype = bd and, when per_edge, edge 0's
 * wire_dtype = XMESH_F16 (overriding bd); returns the driver's wire bytes per step (-1 on
 * failure) and the cross-host bytes in *xhost. */
static int64_t run_case(xmesh_ctx_t ctx, const graph_t *g, xmesh_dtype_t bd, int per_edge, int mode,
                        int64_t *xhost)
{
    int S = g->stages, E = S - 1;
    xmp_sedge_t se[MAXS];
    xmp_edge_cfg_t ec[MAXS];
    xmp_stage_mesh_t meshes[MAXS];
    memset(ec, 0, sizeof ec);
    for (int e = 0; e < E; e++) {
        se[e].src = ec[e].src = e;
        se[e].dst = ec[e].dst = e + 1;
        ec[e].ndim = 2;
        ec[e].shape[0] = NR;
        ec[e].shape[1] = NC;
        ec[e].dtype = XMESH_F32;
        ec[e].src_spec = g->spec[e];
        ec[e].dst_spec = g->spec[e + 1];
    }
    if (per_edge)
        ec[0].wire_dtype = XMESH_F16;
    char err[1024];
    xmp_gen_opts_t o = {0};
    xmp_schedule_t *s = NULL;
    int64_t wire = -1;
    int gen = g->ngroups ? xmp_sched_generate_map(XMP_SCHED_ZB_V, S, g->ngroups, NULL, M, E, se, &o,
                                                  &s, err, sizeof err)
                         : xmp_sched_generate(XMP_SCHED_1F1B, S, M, E, se, &o, &s, err, sizeof err);
    if (gen != 0) {
        fprintf(stderr, "FAIL generate: %s\n", err);
        failures++;
        return -1;
    }
    toy_t toys[MAXS]; /* one per model stage; toys[st].s == st when this rank runs st */
    xmp_stage_ops_t ops[MAXS];
    memset(toys, 0, sizeof toys);
    memset(ops, 0, sizeof ops);
    xmesh_dtype_t bdw = bd == XMESH_U8 ? XMESH_F32 : bd;
    for (int st = 0; st < S; st++) {
        toy_t *t = &toys[st];
        meshes[st].ndim = 1;
        meshes[st].shape[0] = g->mesh_n[st];
        meshes[st].ranks = g->mesh_r[st];
        t->g = g;
        t->s = -1;
        for (int k = 0; k < g->mesh_n[st]; k++)
            if (g->mesh_r[st][k] == rank) {
                t->s = st;
                t->idx = k;
                t->k = g->mesh_n[st];
            }
        t->wire_in = st > 0 ? (per_edge && st - 1 == 0 ? XMESH_F16 : bdw) : XMESH_F32;
        t->wire_out = st < S - 1 ? (per_edge && st == 0 ? XMESH_F16 : bdw) : XMESH_F32;
        ops[st].user = t;
        ops[st].forward = toy_forward;
        ops[st].backward_input = toy_bwd_input;
    }
    xmp_driver_cfg_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.comm = MPI_COMM_WORLD;
    cfg.ctx = ctx;
    cfg.nstages = S;
    cfg.meshes = meshes;
    cfg.nedges = E;
    cfg.edges = ec;
    cfg.sched = s;
    cfg.mode = mode;
    cfg.boundary_dtype = bd;
    cfg.stage_ops = ops; /* also for one stage per group: the driver reads its own stages' */
    xmp_driver_t *d = NULL;
    if (xmp_driver_create(&cfg, &d, err, sizeof err) != XMESH_SUCCESS) {
        fprintf(stderr, "FAIL rank %d create: %s\n", rank, err);
        failures++;
        goto out;
    }
    for (int step = 0; step < 2; step++) {
        xmp_step_stats_t st;
        for (int k = 0; k < S; k++)
            toys[k].step = step;
        if (xmp_driver_step(d, &st) != XMESH_SUCCESS) {
            fprintf(stderr, "FAIL rank %d step: %s\n", rank, xmp_driver_error(d));
            failures++;
            break;
        }
    }
    /* every element of every received block of both steps was checked */
    for (int k = 0; k < S; k++) {
        toy_t *t = &toys[k];
        if (t->s < 0)
            continue;
        int r0, nr, c0, nc;
        block(g->spec[t->s], t->k, t->idx, &r0, &nr, &c0, &nc);
        long want = 2L * M * nr * nc * ((t->s > 0) + (t->s < S - 1));
        if (t->checked != want) {
            fprintf(stderr, "FAIL rank %d stage %d: %ld elements checked, want %ld\n", rank, t->s,
                    t->checked, want);
            failures++;
        }
        if (t->bad) {
            fprintf(stderr,
                    "FAIL rank %d stage %d: %ld of %ld elements differ (boundary %s, mode %s)\n",
                    rank, t->s, t->bad, t->checked, bd == XMESH_U8 ? "unset" : xmesh_dtype_name(bd),
                    xmp_comm_mode_name(mode));
            failures++;
        }
    }
    if (d && xmp_driver_boundary_bytes(d, &wire, xhost) != XMESH_SUCCESS) {
        fprintf(stderr, "FAIL boundary bytes: %s\n", xmp_driver_error(d));
        failures++;
        wire = -1;
    }
out:
    xmp_driver_destroy(d);
    xmp_sched_destroy(s);
    return wire;
}

/* A wire dtype that is not f32/f16/bf16: refused naming it, nothing created. */
static void refusal(xmesh_ctx_t ctx, const graph_t *g)
{
    xmp_sedge_t se = {0, 1};
    xmp_edge_cfg_t ec;
    memset(&ec, 0, sizeof ec);
    ec.src = 0;
    ec.dst = 1;
    ec.ndim = 2;
    ec.shape[0] = NR;
    ec.shape[1] = NC;
    ec.dtype = XMESH_F32;
    ec.src_spec = g->spec[0];
    ec.dst_spec = g->spec[1];
    xmp_stage_mesh_t meshes[2];
    for (int st = 0; st < 2; st++) {
        meshes[st].ndim = 1;
        meshes[st].shape[0] = g->mesh_n[st];
        meshes[st].ranks = g->mesh_r[st];
    }
    char err[1024] = "";
    xmp_gen_opts_t o = {0};
    xmp_schedule_t *s = NULL;
    if (xmp_sched_generate(XMP_SCHED_1F1B, 2, M, 1, &se, &o, &s, err, sizeof err) != 0) {
        failures++;
        return;
    }
    xmp_driver_cfg_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.comm = MPI_COMM_WORLD;
    cfg.ctx = ctx;
    cfg.nstages = 2;
    cfg.meshes = meshes;
    cfg.nedges = 1;
    cfg.edges = &ec;
    cfg.sched = s;
    cfg.boundary_dtype = XMESH_I32;
    xmp_driver_t *d = (xmp_driver_t *)&cfg; /* must stay untouched */
    xmesh_result_t r = xmp_driver_create(&cfg, &d, err, sizeof err);
    if (r != XMESH_ERR_INVALID_ARGUMENT || d != (xmp_driver_t *)&cfg || !strstr(err, "i32")) {
        fprintf(stderr, "FAIL rank %d: boundary dtype i32: result %d, message '%s'\n", rank, (int)r,
                err);
        failures++;
        if (r == XMESH_SUCCESS)
            xmp_driver_destroy(d);
    } else if (rank == 0) {
        printf("refused as expected: %s\n", err);
    }
    xmp_sched_destroy(s);
}

static void run_graph(xmesh_ctx_t ctx, const graph_t *g, const char *name)
{
    static const int modes[] = {XMP_COMM_BROADCAST, XMP_COMM_SENDRECV, XMP_COMM_BLOCKING};
    for (size_t mi = 0; mi < sizeof modes / sizeof modes[0]; mi++) {
        int mode = modes[mi];
        int64_t x0 = 0, x32 = 0, xb = 0, xh = 0, xe = 0;
        int64_t w0 = run_case(ctx, g, XMESH_U8, 0, mode, &x0);    /* unset: the default path */
        int64_t w32 = run_case(ctx, g, XMESH_F32, 0, mode, &x32); /* f32: no conversion */
        int64_t wb = run_case(ctx, g, XMESH_BF16, 0, mode, &xb);
#ifdef __FLT16_MANT_DIG__
        int64_t wh = run_case(ctx, g, XMESH_F16, 0, mode, &xh);
#else
        int64_t wh = wb;
        xh = xb;
#endif
        int64_t we = run_case(ctx, g, XMESH_BF16, 1, mode, &xe); /* edge 0 f16, others bf16 */
        int64_t full = 2LL * (g->stages - 1) * M * NR * NC * 4;
        if (w0 != full || w32 != full || wb != full / 2 || wh != full / 2 || we != full / 2) {
            fprintf(stderr,
                    "FAIL rank %d %s %s: wire bytes %lld %lld %lld %lld %lld, want %lld for "
                    "f32 and %lld for 16-bit\n",
                    rank, name, xmp_comm_mode_name(mode), (long long)w0, (long long)w32,
                    (long long)wb, (long long)wh, (long long)we, (long long)full,
                    (long long)full / 2);
            failures++;
        }
        if (x0 != x32 || 2 * xb != x0 || 2 * xh != x0 || 2 * xe != x0) {
            fprintf(stderr,
                    "FAIL rank %d %s %s: cross-host bytes %lld %lld %lld %lld %lld (16-bit: "
                    "half of f32)\n",
                    rank, name, xmp_comm_mode_name(mode), (long long)x0, (long long)x32,
                    (long long)xb, (long long)xh, (long long)xe);
            failures++;
        }
        if (rank == 0)
            printf("%s %s: wire bytes/step f32 %lld bf16 %lld; cross-host f32 %lld bf16 %lld\n",
                   name, xmp_comm_mode_name(mode), (long long)w0, (long long)wb, (long long)x0,
                   (long long)xb);
    }
}

int main(int argc, char **argv)
{
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--seed"))
            seed = strtoull(argv[++i], NULL, 10);
    if (rank == 0) {
        printf("seed %llu\n", seed);
#ifndef __FLT16_MANT_DIG__
        printf("no _Float16: f16 not checked\n");
#endif
    }
    xmesh_ctx_t ctx = NULL;
    if (xmesh_ctx_create_mpi(MPI_COMM_WORLD, NULL, &ctx) != XMESH_SUCCESS) {
        fprintf(stderr, "ctx: %s\n", xmesh_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (nranks == 2) {
        graph_t g = {2, {1, 1}, {{0}, {1}}, {"S(0)", "B"}, 0};
        run_graph(ctx, &g, "2x1-rank");
        /* V shape: stages 0,3 on rank 0 and 1,2 on rank 1; edge 1>2 stays on rank 1 */
        graph_t v = {4, {1, 1, 1, 1}, {{0}, {1}, {1}, {0}}, {"B", "B", "B", "B"}, 2};
        run_graph(ctx, &v, "zb-v 4 stages on 2 ranks");
        refusal(ctx, &g);
    } else if (nranks == 4) {
        graph_t a = {2, {2, 2}, {{0, 1}, {2, 3}}, {"S(0)", "S(1)"}, 0};
        run_graph(ctx, &a, "2x2-rank S(0)->S(1)");
        graph_t b = {4, {1, 1, 1, 1}, {{0}, {1}, {2}, {3}}, {"B", "B", "B", "B"}, 0};
        run_graph(ctx, &b, "4-stage chain");
        graph_t v = {
            4, {2, 2, 2, 2}, {{0, 1}, {2, 3}, {3, 2}, {1, 0}}, {"S(0)", "S(1)", "S(0)", "B"}, 2};
        run_graph(ctx, &v, "zb-v 4 stages on 2x2 ranks");
        refusal(ctx, &a);
    } else {
        if (rank == 0)
            fprintf(stderr, "run on 2 or 4 ranks (got %d)\n", nranks);
        failures++;
    }
    int all = 0;
    MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0)
        printf("%s: %d failures\n", all ? "FAILED" : "OK", all);
    xmesh_ctx_destroy(ctx);
    MPI_Finalize();
    return all ? 1 : 0;
}
