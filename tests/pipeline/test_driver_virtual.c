/*
 * Pipeline driver with virtual stages under MPI: R rank groups each run V model stages of a
 * toy chain (stage s: y = tanh(x . W_s), x = the sum of its in-edge activations, stage 0 the
 * microbatch data, loss = sum(y^2) / count on the last stage) plus a skip edge 0 -> S-1, with
 * every boundary an xmesh plan: between groups and between two stages of the same group (whose
 * meshes list the group's ranks in opposite orders, the activations leave in S(0), S(1) or B).
 * Each stage has its own callbacks and user pointer (cfg.stage_ops). Every schedule
 * (interleaved-1f1b, eager-interleaved-1f1b, zb-v, v-1f1b, each with and without the
 * weight-gradient delay) x comm mode must give, for two SGD steps, the loss and every element
 * of every stage's weight gradient of a one-process computation (f64) within 1e-12 relative
 * (signal mode, once per layout: it must run). The simulator's prediction through the driver
 * (xmp_driver_predict_costs, memory model with the toy's bytes per microbatch) must equal the
 * measured peak activations (microbatches and activation_bytes) of every rank.
 * Usage: test_driver_virtual (2 or 4 ranks; the layouts follow the rank count).
 */
#include "pipe/driver.h"
#include "toy_chain.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NR 6 /* rows per microbatch */
#define NC 5 /* features */
#define MAXS 8
#define MAXE 9
#define MAXM 8
#define LR 0.25

static int rank, nranks, failures;

typedef struct {
    int S, R, V, M, nedges;
    xmp_edge_cfg_t e[MAXE];
    int ranks[MAXS][4]; /* mesh of each stage */
    int k;              /* ranks per group */
} net_t;

typedef struct {
    const net_t *n;
    int s, idx; /* stage, my index in its mesh */
    double W[NC * NC], gW[NC * NC], last_gW[NC * NC];
    double x[MAXM][NR * NC], y[MAXM][NR * NC], gz[MAXM][NR * NC];
    int held;
} toy_t;

static double init_w(int s, int i, int j)
{
    return 0.5 * sin(0.7 + 5.0 * s + 3.0 * i + 1.7 * j);
}
static double init_x(int m, int i, int j)
{
    return 0.9 * cos(0.2 + 7.0 * m + 5.0 * i + 2.3 * j);
}

static void split(int n, int k, int p, int *o, int *c)
{
    int base = n / k, rem = n % k;
    *c = base + (p < rem);
    *o = p * base + (p < rem ? p : rem);
}

static void to_block(const toy_t *t, const char *spec, const double *v, double *out)
{
    int o, c;
    if (strcmp(spec, "B") == 0) {
        memcpy(out, v, sizeof(double) * NR * NC);
    } else if (strcmp(spec, "S(0)") == 0) {
        split(NR, t->n->k, t->idx, &o, &c);
        memcpy(out, v + o * NC, sizeof(double) * (size_t)c * NC);
    } else {
        split(NC, t->n->k, t->idx, &o, &c);
        for (int i = 0; i < NR; i++)
            for (int j = 0; j < c; j++)
                out[i * c + j] = v[i * NC + o + j];
    }
}

static int t_fwd(void *u, int mb, const void *const *in, void *const *out, double *loss)
{
    toy_t *t = u;
    const net_t *n = t->n;
    double *x = t->x[mb], *y = t->y[mb];
    int k = 0;
    for (int i = 0; i < NR * NC; i++)
        x[i] = t->s == 0 ? init_x(mb, i / NC, i % NC) : 0.0;
    for (int e = 0; e < n->nedges; e++)
        if (n->e[e].dst == t->s) {
            const double *v = in[k++];
            for (int i = 0; i < NR * NC; i++)
                x[i] += v[i];
        }
    layer_fwd(NR, NC, x, t->W, y);
    k = 0;
    for (int e = 0; e < n->nedges; e++)
        if (n->e[e].src == t->s)
            to_block(t, n->e[e].src_spec, y, out[k++]);
    if (t->s == n->S - 1 && t->idx == 0) { /* one rank of the group reports the loss */
        double l = 0;
        for (int i = 0; i < NR * NC; i++)
            l += y[i] * y[i];
        *loss += l / (NR * NC);
    }
    t->held++;
    return 0;
}

static int t_bin(void *u, int mb, const void *const *gout, void *const *gin)
{
    toy_t *t = u;
    const net_t *n = t->n;
    double gy[NR * NC], gx[NR * NC], *y = t->y[mb], *gz = t->gz[mb];
    for (int i = 0; i < NR * NC; i++)
        gy[i] = t->s == n->S - 1 ? 2.0 * y[i] / (NR * NC) : 0.0;
    int k = 0;
    for (int e = 0; e < n->nedges; e++)
        if (n->e[e].src == t->s) {
            const double *v = gout[k++];
            for (int i = 0; i < NR * NC; i++)
                gy[i] += v[i];
        }
    layer_bwd_input(NR, NC, y, gy, t->W, gz, gx);
    k = 0;
    for (int e = 0; e < n->nedges; e++)
        if (n->e[e].dst == t->s)
            memcpy(gin[k++], gx, sizeof(gx));
    return 0;
}

static int t_bw(void *u, int mb)
{
    toy_t *t = u;
    layer_bwd_weight(NR, NC, t->x[mb], t->gz[mb], t->gW);
    t->held--;
    return 0;
}

static int t_opt(void *u)
{
    toy_t *t = u;
    sgd_step(NC * NC, LR, t->W, t->gW, t->last_gW);
    return 0;
}

static int64_t t_bytes(void *u)
{
    toy_t *t = u;
    return (int64_t)t->held * 3 * NR * NC * (int64_t)sizeof(double);
}

/* The serial computation: loss[step], gW[step][stage]. */
typedef struct {
    double loss[2], gW[2][MAXS][NC * NC];
} ref_t;

static void reference(const net_t *n, ref_t *r)
{
    static double W[MAXS][NC * NC], x[MAXS][NR * NC], y[MAXS][NR * NC], gx[MAXS][NR * NC];
    for (int s = 0; s < n->S; s++)
        for (int i = 0; i < NC * NC; i++)
            W[s][i] = init_w(s, i / NC, i % NC);
    for (int step = 0; step < 2; step++) {
        double gW[MAXS][NC * NC];
        memset(gW, 0, sizeof(gW));
        r->loss[step] = 0;
        for (int m = 0; m < n->M; m++) {
            for (int s = 0; s < n->S; s++) {
                for (int i = 0; i < NR * NC; i++)
                    x[s][i] = s == 0 ? init_x(m, i / NC, i % NC) : 0.0;
                for (int e = 0; e < n->nedges; e++)
                    if (n->e[e].dst == s)
                        for (int i = 0; i < NR * NC; i++)
                            x[s][i] += y[n->e[e].src][i];
                layer_fwd(NR, NC, x[s], W[s], y[s]);
            }
            int L = n->S - 1;
            double l = 0;
            for (int i = 0; i < NR * NC; i++)
                l += y[L][i] * y[L][i];
            r->loss[step] += l / (NR * NC);
            for (int s = L; s >= 0; s--) {
                double gy[NR * NC], gz[NR * NC];
                for (int i = 0; i < NR * NC; i++)
                    gy[i] = s == L ? 2.0 * y[L][i] / (NR * NC) : 0.0;
                for (int e = 0; e < n->nedges; e++)
                    if (n->e[e].src == s)
                        for (int i = 0; i < NR * NC; i++)
                            gy[i] += gx[n->e[e].dst][i];
                layer_bwd_input(NR, NC, y[s], gy, W[s], gz, gx[s]);
                layer_bwd_weight(NR, NC, x[s], gz, gW[s]);
            }
        }
        for (int s = 0; s < n->S; s++)
            for (int i = 0; i < NC * NC; i++) {
                r->gW[step][s][i] = gW[s][i];
                W[s][i] -= LR * gW[s][i];
            }
    }
}

static const char *specs[3] = {"S(0)", "S(1)", "B"};

/* Chain 0>1>..>S-1 plus 0>S-1 (S >= 3); stage -> group by the schedule's map. */
static void make_net(net_t *n, const xmp_schedule_t *s, int R, int V, int M)
{
    memset(n, 0, sizeof(*n));
    n->S = R * V;
    n->R = R;
    n->V = V;
    n->M = M;
    n->k = nranks / R;
    for (int e = 0; e < s->nedges; e++) {
        xmp_edge_cfg_t *ec = &n->e[n->nedges++];
        ec->src = s->edges[e].src;
        ec->dst = s->edges[e].dst;
        ec->ndim = 2;
        ec->shape[0] = NR;
        ec->shape[1] = NC;
        ec->dtype = XMESH_F64;
        ec->src_spec = specs[e % 3];
        ec->dst_spec = "B";
        ec->grad_src_spec = "B";
        ec->grad_dst_spec = "B";
    }
    for (int st = 0; st < n->S; st++) {
        int g = s->stage_group[st], c = xmp_stage_chunk(s, st);
        for (int i = 0; i < n->k; i++) /* odd chunks list the group's ranks reversed */
            n->ranks[st][i] = g * n->k + (c % 2 ? n->k - 1 - i : i);
    }
}

static int close_enough(double a, double b, double scale)
{
    return fabs(a - b) <= 1e-12 * fmax(fabs(b), 1e-3 * scale) + 1e-300;
}

static void run_case(xmesh_ctx_t ctx, const char *name, int R, int V, int M, int mode)
{
    char err[2048];
    xmp_schedule_t *s = NULL;
    int cases = 0;
    /* the schedule over the chain plus the skip edge: generate_map with the kind's map */
    xmp_schedule_t *chain = NULL;
    if (xmp_sched_generate_named(name, R, V, M, NULL, &chain, err, sizeof(err)) != 0) {
        if (rank == 0)
            fprintf(stderr, "FAIL generate %s R=%d V=%d M=%d: %s\n", name, R, V, M, err);
        failures++;
        return;
    }
    int S = R * V, ne = 0;
    xmp_sedge_t se[MAXE];
    ne = xmp_sched_chain_edges(S, se);
    if (S >= 3) {
        se[ne].src = 0;
        se[ne++].dst = S - 1;
    }
    xmp_gen_opts_t o;
    memset(&o, 0, sizeof(o));
    char base[64];
    snprintf(base, sizeof(base), "%s", name);
    char *plus = strstr(base, "+dw");
    if (plus) {
        *plus = '\0';
        o.delay_wgrad = 1;
    }
    int kind = xmp_sched_kind_parse(base);
    if (xmp_sched_generate_map(kind, S, R, chain->stage_group, M, ne, se, &o, &s, err,
                               sizeof(err)) != 0) {
        if (rank == 0)
            fprintf(stderr, "FAIL generate %s with skip edge: %s\n", name, err);
        failures++;
        xmp_sched_destroy(chain);
        return;
    }
    xmp_sched_destroy(chain);
    net_t n;
    make_net(&n, s, R, V, M);
    ref_t ref;
    reference(&n, &ref);
    toy_t *toys = calloc((size_t)S, sizeof(toy_t));
    xmp_stage_ops_t ops[MAXS];
    xmp_stage_mesh_t meshes[MAXS];
    memset(ops, 0, sizeof(ops));
    for (int st = 0; st < S; st++) {
        meshes[st].ndim = 1;
        meshes[st].shape[0] = n.k;
        meshes[st].ranks = n.ranks[st];
        toys[st].n = &n;
        toys[st].s = st;
        for (int i = 0; i < n.k; i++)
            if (n.ranks[st][i] == rank)
                toys[st].idx = i;
        for (int i = 0; i < NC * NC; i++)
            toys[st].W[i] = init_w(st, i / NC, i % NC);
        if (s->stage_group[st] != rank / n.k)
            continue; /* not mine: leave the entry zero */
        ops[st].user = &toys[st];
        ops[st].forward = t_fwd;
        ops[st].backward_input = t_bin;
        ops[st].backward_weight = t_bw;
        ops[st].optimizer_step = t_opt;
        ops[st].activation_bytes = t_bytes;
    }
    xmp_driver_cfg_t cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.comm = MPI_COMM_WORLD;
    cfg.ctx = ctx;
    cfg.nstages = S;
    cfg.meshes = meshes;
    cfg.nedges = n.nedges;
    cfg.edges = n.e;
    cfg.sched = s;
    cfg.mode = mode;
    cfg.stage_ops = ops;
    xmp_driver_t *d = NULL;
    if (xmp_driver_create(&cfg, &d, err, sizeof(err)) != XMESH_SUCCESS) {
        fprintf(stderr, "FAIL rank %d create %s R=%d V=%d %s: %s\n", rank, s->name, R, V,
                xmp_comm_mode_name(mode), err);
        failures++;
        goto out;
    }
    int mine[MAXS], nm = xmp_driver_stages(d, mine, MAXS), last_peak_mb = 0;
    int64_t last_peak_bytes = 0;
    if (nm != V || xmp_driver_group(d) != rank / n.k) {
        fprintf(stderr, "FAIL rank %d: %d stages on group %d\n", rank, nm, xmp_driver_group(d));
        failures++;
    }
    for (int step = 0; step < 2; step++) {
        xmp_step_stats_t st;
        memset(&st, 0, sizeof(st));
        if (xmp_driver_step(d, &st) != XMESH_SUCCESS) {
            fprintf(stderr, "FAIL rank %d step %s %s: %s\n", rank, s->name,
                    xmp_comm_mode_name(mode), xmp_driver_error(d));
            failures++;
            break;
        }
        last_peak_mb = st.peak_act_mb;
        last_peak_bytes = st.peak_act_bytes;
        double loss = 0;
        MPI_Allreduce(&st.loss, &loss, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        if (mode == XMP_COMM_SIGNAL)
            continue; /* timing only: the inputs are zeros */
        if (!close_enough(loss, ref.loss[step], 0)) {
            fprintf(stderr, "FAIL rank %d %s %s step %d: loss %.17g expected %.17g\n", rank,
                    s->name, xmp_comm_mode_name(mode), step, loss, ref.loss[step]);
            failures++;
        }
        if (st.peak_act_mb < 1 || st.peak_act_mb > s->max_inflight[rank / n.k] + V * M ||
            st.peak_act_bytes < (int64_t)3 * NR * NC * 8) {
            fprintf(stderr, "FAIL rank %d %s: peak %d microbatches, %lld bytes\n", rank, s->name,
                    st.peak_act_mb, (long long)st.peak_act_bytes);
            failures++;
        }
        for (int c = 0; c < nm; c++) {
            const toy_t *t = &toys[mine[c]];
            double scale = 0;
            for (int i = 0; i < NC * NC; i++)
                scale = fmax(scale, fabs(ref.gW[step][t->s][i]));
            for (int i = 0; i < NC * NC; i++) {
                cases++;
                if (!close_enough(t->last_gW[i], ref.gW[step][t->s][i], scale)) {
                    fprintf(stderr,
                            "FAIL rank %d %s %s step %d stage %d: gW[%d] %.17g expected %.17g\n",
                            rank, s->name, xmp_comm_mode_name(mode), step, t->s, i, t->last_gW[i],
                            ref.gW[step][t->s][i]);
                    failures++;
                    break;
                }
            }
        }
    }
    if (d != NULL && failures == 0) {
        /* the simulator's memory model with the toy's bytes per microbatch predicts the
         * measured peak of activation_bytes exactly (no recomputation, held F -> B or W) */
        double f[MAXS], act[MAXS];
        for (int k = 0; k < S; k++) {
            f[k] = 1e-4;
            act[k] = 3.0 * NR * NC * sizeof(double);
        }
        xmp_sim_costs_t c;
        memset(&c, 0, sizeof(c));
        c.f = c.i = c.w = f;
        c.act_bytes = act;
        xmp_sim_result_t res;
        if (xmp_driver_predict_costs(d, &c, &res) != XMESH_SUCCESS) {
            fprintf(stderr, "FAIL rank %d predict: %s\n", rank, xmp_driver_error(d));
            failures++;
        } else {
            int g = xmp_driver_group(d);
            if (res.peak_act[g] != last_peak_mb ||
                fabs(res.peak_bytes[g] - (double)last_peak_bytes) > 0.5) {
                fprintf(stderr,
                        "FAIL rank %d %s: predicted peak %d mb %.0f B, measured %d mb %lld B\n",
                        rank, s->name, res.peak_act[g], res.peak_bytes[g], last_peak_mb,
                        (long long)last_peak_bytes);
                failures++;
            }
            xmp_sim_result_free(&res);
        }
    }
    if (rank == 0)
        printf("%-28s R=%d V=%d M=%d %-9s: loss %.12f %.12f, %d gradient elements checked on rank "
               "0\n",
               s->name, R, V, M, xmp_comm_mode_name(mode), ref.loss[0], ref.loss[1], cases);
out:
    if (xmp_driver_destroy(d) != XMESH_SUCCESS) {
        fprintf(stderr, "FAIL destroy\n");
        failures++;
    }
    free(toys);
    xmp_sched_destroy(s);
}

/* Refusals: several stages on a group without stage_ops; two stages of a group on different
 * ranks. */
static void refusals(xmesh_ctx_t ctx)
{
    char err[1024];
    xmp_schedule_t *s = NULL;
    if (xmp_sched_generate_named("interleaved-1f1b", 2, 2, 2, NULL, &s, err, sizeof(err)) != 0) {
        failures++;
        return;
    }
    net_t n;
    make_net(&n, s, 2, 2, 2);
    xmp_stage_mesh_t meshes[MAXS];
    for (int st = 0; st < 4; st++) {
        meshes[st].ndim = 1;
        meshes[st].shape[0] = n.k;
        meshes[st].ranks = n.ranks[st];
    }
    xmp_driver_cfg_t cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.comm = MPI_COMM_WORLD;
    cfg.ctx = ctx;
    cfg.nstages = 4;
    cfg.meshes = meshes;
    cfg.nedges = n.nedges;
    cfg.edges = n.e;
    cfg.sched = s;
    xmp_driver_t *d = NULL;
    err[0] = '\0';
    if (xmp_driver_create(&cfg, &d, err, sizeof(err)) == XMESH_SUCCESS ||
        !strstr(err, "set cfg.stage_ops") || d != NULL) {
        fprintf(stderr, "FAIL rank %d: no stage_ops accepted (%s)\n", rank, err);
        failures++;
        xmp_driver_destroy(d);
        d = NULL;
    }
    xmp_stage_ops_t ops[MAXS];
    memset(ops, 0, sizeof(ops));
    cfg.stage_ops = ops;
    int other[4] = {0, 1, 2, 3};
    meshes[2].ranks = other + n.k; /* stage 2 (group 0) on group 1's ranks */
    err[0] = '\0';
    if (xmp_driver_create(&cfg, &d, err, sizeof(err)) == XMESH_SUCCESS ||
        !strstr(err, "share group 0 but not their ranks")) {
        fprintf(stderr, "FAIL rank %d: mismatched group meshes accepted (%s)\n", rank, err);
        failures++;
        xmp_driver_destroy(d);
    }
    if (rank == 0)
        printf("refusal: %s\n", err);
    xmp_sched_destroy(s);
}

int main(int argc, char **argv)
{
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    xmesh_ctx_t ctx;
    if (xmesh_ctx_create_mpi(MPI_COMM_WORLD, NULL, &ctx) != XMESH_SUCCESS) {
        fprintf(stderr, "ctx: %s\n", xmesh_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    struct {
        int R, V, M;
    } lay2[] = {{2, 2, 4}, {1, 2, 3}, {1, 3, 2}, {2, 3, 2}},
      lay4[] = {{2, 2, 4}, {4, 2, 4}, {2, 3, 2}, {1, 2, 3}};
    const char *names[] = {"interleaved-1f1b",
                           "eager-interleaved-1f1b+dw",
                           "interleaved-1f1b+dw",
                           "zb-v",
                           "zb-v+dw",
                           "v-1f1b",
                           "v-1f1b+dw",
                           "dualpipe-v"};
    const int modes[] = {XMP_COMM_BROADCAST, XMP_COMM_SENDRECV, XMP_COMM_BLOCKING, XMP_COMM_SIGNAL};
    if (nranks != 2 && nranks != 4) {
        if (rank == 0)
            fprintf(stderr, "run on 2 or 4 ranks\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    for (int l = 0; l < 4; l++) {
        int R = nranks == 2 ? lay2[l].R : lay4[l].R, V = nranks == 2 ? lay2[l].V : lay4[l].V;
        int M = nranks == 2 ? lay2[l].M : lay4[l].M;
        for (int k = 0; k < 8; k++) {
            int vshape = strncmp(names[k], "zb-v", 4) == 0 || strncmp(names[k], "v-1f1b", 6) == 0 ||
                         strncmp(names[k], "dualpipe", 8) == 0;
            if (vshape && V != 2)
                continue;
            if (k == 7 && M < 2 * R)
                continue;
            for (int mi = 0; mi < 4; mi++) {
                if (mi > 0 && k % 2 == 1)
                    continue; /* every other schedule under the default mode only (time) */
                if (mi == 3 && k > 0)
                    continue; /* signal mode (runs, nothing to compare) once per layout */
                run_case(ctx, names[k], R, V, M, modes[mi]);
            }
        }
    }
    refusals(ctx);
    int all = 0;
    MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    xmesh_ctx_destroy(ctx);
    if (rank == 0)
        printf("%s (%d failures)\n", all ? "FAILED" : "all virtual-stage driver tests passed", all);
    MPI_Finalize();
    return all ? 1 : 0;
}
