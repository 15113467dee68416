/*
 * Pipeline driver under MPI with a toy model: stage s computes
 * y = tanh(x . W_s), x = sum of its in-edge activations (stage 0: the
 * microbatch data), loss = sum(y^2) / count on the last stage. Stages sit on
 * meshes of 1..3 ranks with different layouts at the boundaries; a "full"
 * stage computes all rows redundantly on every rank (inputs "B", outputs
 * sliced to their layout), a "rows" stage computes its S(0) block of rows and
 * all-reduces its weight gradient in R. Every schedule x delay_wgrad x comm
 * mode must give the per-step loss and the reduced weight gradients of a
 * one-process computation (f64 throughout) within 1e-5 relative (signal mode:
 * runs only). Usage: test_driver --graph a|b|c [--trace file]
 */
#include "pipe/driver.h"
#include "toy_chain.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NR 8 /* rows per microbatch */
#define NC 6 /* features */
#define MAXS 4
#define MAXE 6
#define MAXM 8

typedef struct {
    int stages;
    int mesh_n[MAXS];
    int mesh_r[MAXS][4];
    int rows_mode[MAXS];
    int nedges;
    xmp_edge_cfg_t e[MAXE];
    int M;
} graph_t;

static int rank, nranks, failures;

/* ---------------------------------------------------------------- toy stage */

typedef struct {
    const graph_t *g;
    int s, idx, k; /* stage, my index in its mesh, mesh size */
    int r0, nr;    /* my rows */
    MPI_Comm comm; /* the stage's ranks */
    double W[NC * NC], gW[NC * NC], last_gW[NC * NC];
    double x[MAXM][NR * NC], y[MAXM][NR * NC], gz[MAXM][NR * NC];
    int held;
    int signal, nonzero_in;      /* signal mode: inputs must stay zero */
    void (*progress)(void *arg); /* the driver's, during a step (set_progress) */
    void *progress_arg;
    int progress_calls; /* progress given and called during forwards */
} toy_t;

static double init_w(int s, int i, int j)
{
    return 0.45 * sin(1.0 + 7.0 * s + 3.0 * i + 1.3 * j);
}
static double init_x(int m, int i, int j)
{
    return 0.8 * cos(0.3 + 11.0 * m + 5.0 * i + 2.0 * j);
}

/* numpy.array_split block [o, o+c) of n over k parts, part p */
static void split(int n, int k, int p, int *o, int *c)
{
    int base = n / k, rem = n % k;
    *c = base + (p < rem);
    *o = p * base + (p < rem ? p : rem);
}

/* Edge e carries f(e) times its producer's output, and its consumer adds f(e) times what
 * arrives (and the gradients the same way back): edges differ, so an executor that hands one
 * edge's block to another computes wrong values. */
static double ef(int e)
{
    return 1.0 + 0.5 * e;
}

static int is_last(const toy_t *t)
{
    for (int e = 0; e < t->g->nedges; e++)
        if (t->g->e[e].src == t->s)
            return 0;
    return 1;
}

/* Copies the full NR x NC matrix v (or my rows, rows mode) into the local
 * block of `spec` on my stage's mesh. */
static void to_block(const toy_t *t, const char *spec, const double *v, double *out)
{
    int o, c;
    if (t->g->rows_mode[t->s] || strcmp(spec, "B") == 0 || strcmp(spec, "R") == 0) {
        memcpy(out, v, sizeof(double) * (size_t)(t->g->rows_mode[t->s] ? t->nr : NR) * NC);
    } else if (strcmp(spec, "S(0)") == 0) {
        split(NR, t->k, t->idx, &o, &c);
        memcpy(out, v + o * NC, sizeof(double) * (size_t)c * NC);
    } else { /* S(1) */
        split(NC, t->k, t->idx, &o, &c);
        for (int i = 0; i < NR; i++)
            for (int j = 0; j < c; j++)
                out[i * c + j] = v[i * NC + o + j];
    }
}

static int toy_forward(void *u, int mb, const void *const *in, void *const *out, double *loss)
{
    toy_t *t = u;
    const graph_t *g = t->g;
    int nr = t->nr, kin = 0, kout = 0;
    double *x = t->x[mb], *y = t->y[mb];
    if (t->s == 0) {
        for (int i = 0; i < nr; i++)
            for (int j = 0; j < NC; j++)
                x[i * NC + j] = init_x(mb, t->r0 + i, j);
    } else {
        memset(x, 0, sizeof(double) * (size_t)nr * NC);
        for (int e = 0; e < g->nedges; e++)
            if (g->e[e].dst == t->s) {
                const double *v = in[kin++];
                for (int i = 0; i < nr * NC; i++) {
                    x[i] += ef(e) * v[i];
                    t->nonzero_in += t->signal && v[i] != 0.0;
                }
            }
    }
    for (int i = 0; i < nr; i++) {
        layer_fwd_row(NC, x + i * NC, t->W, y + i * NC);
        if (t->progress) { /* between "layers", as a model would */
            t->progress(t->progress_arg);
            t->progress_calls++;
        }
    }
    for (int e = 0; e < g->nedges; e++)
        if (g->e[e].src == t->s) {
            double ys[NR * NC];
            for (int i = 0; i < nr * NC; i++)
                ys[i] = ef(e) * y[i];
            to_block(t, g->e[e].src_spec, ys, out[kout++]);
        }
    if (is_last(t)) {
        double l = 0;
        for (int i = 0; i < nr * NC; i++)
            l += (double)y[i] * y[i];
        *loss += l / (NR * NC);
    }
    t->held++;
    return 0;
}

static int toy_bwd_input(void *u, int mb, const void *const *gout, void *const *gin)
{
    toy_t *t = u;
    const graph_t *g = t->g;
    int nr = t->nr, k = 0;
    double gy[NR * NC], gx[NR * NC];
    double *y = t->y[mb], *gz = t->gz[mb];
    memset(gy, 0, sizeof(gy));
    if (is_last(t)) {
        for (int i = 0; i < nr * NC; i++)
            gy[i] = 2.0 * y[i] / (NR * NC);
    }
    for (int e = 0; e < g->nedges; e++)
        if (g->e[e].src == t->s) {
            const double *v = gout[k++];
            for (int i = 0; i < nr * NC; i++)
                gy[i] += ef(e) * v[i];
        }
    layer_bwd_input(nr, NC, y, gy, t->W, gz, gx);
    k = 0;
    for (int e = 0; e < g->nedges; e++)
        if (g->e[e].dst == t->s) {
            double *o = gin[k++];
            for (int i = 0; i < nr * NC; i++)
                o[i] = ef(e) * gx[i];
        }
    return 0;
}

static int toy_bwd_weight(void *u, int mb)
{
    toy_t *t = u;
    layer_bwd_weight(t->nr, NC, t->x[mb], t->gz[mb], t->gW);
    t->held--;
    return 0;
}

static int toy_reduce(void *u)
{
    toy_t *t = u;
    if (t->g->rows_mode[t->s] && t->k > 1)
        MPI_Allreduce(MPI_IN_PLACE, t->gW, NC * NC, MPI_DOUBLE, MPI_SUM, t->comm);
    return 0;
}

#define LR 0.5
static int toy_step(void *u)
{
    toy_t *t = u;
    sgd_step(NC * NC, LR, t->W, t->gW, t->last_gW);
    return 0;
}

static void toy_set_progress(void *u, void (*fn)(void *arg), void *arg)
{
    toy_t *t = u;
    t->progress = fn;
    t->progress_arg = arg;
}

static int64_t toy_bytes(void *u)
{
    toy_t *t = u;
    return (int64_t)t->held * (int64_t)sizeof(double) * 3 * t->nr * NC;
}

/* ---------------------------------------------------------------- reference */

typedef struct {
    double W[MAXS][NC * NC];
    double loss[2];
    double gW[2][MAXS][NC * NC];
} ref_t;

static void reference(const graph_t *g, ref_t *r)
{
    for (int s = 0; s < g->stages; s++)
        for (int i = 0; i < NC; i++)
            for (int j = 0; j < NC; j++)
                r->W[s][i * NC + j] = init_w(s, i, j);
    for (int step = 0; step < 2; step++) {
        double gW[MAXS][NC * NC];
        memset(gW, 0, sizeof(gW));
        r->loss[step] = 0;
        for (int m = 0; m < g->M; m++) {
            static double x[MAXS][NR * NC], y[MAXS][NR * NC], gx[MAXS][NR * NC];
            for (int s = 0; s < g->stages; s++) {
                for (int i = 0; i < NR * NC; i++)
                    x[s][i] = s == 0 ? init_x(m, i / NC, i % NC) : 0.0;
                for (int e = 0; e < g->nedges; e++)
                    if (g->e[e].dst == s)
                        for (int i = 0; i < NR * NC; i++)
                            x[s][i] += ef(e) * ef(e) * y[g->e[e].src][i];
                layer_fwd(NR, NC, x[s], r->W[s], y[s]);
            }
            int L = g->stages - 1;
            for (int i = 0; i < NR * NC; i++)
                r->loss[step] += y[L][i] * y[L][i] / (NR * NC);
            for (int s = L; s >= 0; s--) {
                double gy[NR * NC], gz[NR * NC];
                for (int i = 0; i < NR * NC; i++)
                    gy[i] = s == L ? 2.0 * y[L][i] / (NR * NC) : 0.0;
                for (int e = 0; e < g->nedges; e++)
                    if (g->e[e].src == s)
                        for (int i = 0; i < NR * NC; i++)
                            gy[i] += ef(e) * ef(e) * gx[g->e[e].dst][i];
                layer_bwd_input(NR, NC, y[s], gy, r->W[s], gz, gx[s]);
                for (int l = 0; l < NC; l++)
                    for (int j = 0; j < NC; j++)
                        for (int i = 0; i < NR; i++)
                            gW[s][l * NC + j] += x[s][i * NC + l] * gz[i * NC + j];
            }
        }
        for (int s = 0; s < g->stages; s++)
            for (int i = 0; i < NC * NC; i++) {
                r->gW[step][s][i] = gW[s][i];
                r->W[s][i] -= LR * gW[s][i];
            }
    }
}

/* ------------------------------------------------------------------- graphs */

static void edge(graph_t *g, int src, int dst, const char *ss, const char *ds, const char *gs,
                 const char *gd)
{
    xmp_edge_cfg_t *e = &g->e[g->nedges++];
    memset(e, 0, sizeof(*e));
    e->src = src;
    e->dst = dst;
    e->ndim = 2;
    e->shape[0] = NR;
    e->shape[1] = NC;
    e->dtype = XMESH_F64;
    e->src_spec = ss;
    e->dst_spec = ds;
    e->grad_src_spec = gs;
    e->grad_dst_spec = gd;
}

static void stage(graph_t *g, int s, int rows, int n, const int *r)
{
    g->mesh_n[s] = n;
    g->rows_mode[s] = rows;
    memcpy(g->mesh_r[s], r, sizeof(int) * (size_t)n);
}

static int make_graph(char name, graph_t *g)
{
    memset(g, 0, sizeof(*g));
    if (name == 'a') { /* 4 ranks: S(0) on 2 -> B on 1; skip 0 -> 2 S(1) -> B */
        g->stages = 3;
        g->M = 4;
        stage(g, 0, 0, 2, (int[]){0, 1});
        stage(g, 1, 0, 1, (int[]){2});
        stage(g, 2, 0, 1, (int[]){3});
        edge(g, 0, 1, "S(0)", "B", "B", "B");
        edge(g, 1, 2, "B", "B", NULL, NULL);
        edge(g, 0, 2, "S(1)", "B", "B", "B");
        return 4;
    }
    if (name == 'b') { /* 4 ranks: B on 1 -> S(0) on 3 (uneven rows, reduced grads) */
        g->stages = 2;
        g->M = 3;
        stage(g, 0, 0, 1, (int[]){0});
        stage(g, 1, 1, 3, (int[]){1, 2, 3});
        edge(g, 0, 1, "B", "S(0)", "S(0)", "B");
        return 4;
    }
    if (name == 'c') { /* 6 ranks: 4 stages, 2-rank meshes, skip 0 -> 3 */
        g->stages = 4;
        g->M = 5;
        stage(g, 0, 0, 2, (int[]){0, 1});
        stage(g, 1, 0, 1, (int[]){2});
        stage(g, 2, 1, 2, (int[]){3, 4});
        stage(g, 3, 0, 1, (int[]){5});
        edge(g, 0, 1, "S(0)", "B", "B", "B");
        edge(g, 1, 2, "B", "S(0)", "S(0)", "B");
        edge(g, 2, 3, "S(0)", "B", "B", "S(0)");
        edge(g, 0, 3, "S(1)", "B", "B", "B");
        return 6;
    }
    if (name == 'd') { /* 4 ranks: three tensors cross one boundary in the same slot */
        g->stages = 2;
        g->M = 4;
        stage(g, 0, 0, 2, (int[]){0, 1});
        stage(g, 1, 1, 2, (int[]){2, 3});
        edge(g, 0, 1, "S(0)", "S(0)", "S(0)", "B");
        edge(g, 0, 1, "S(1)", "S(0)", "S(0)", "B");
        edge(g, 0, 1, "B", "S(0)", "S(0)", "B");
        return 4;
    }
    return -1;
}

/* xmesh plans the driver should make for g: the edges between one pair of stages share a plan
 * of many per direction (every generated schedule starts them after the same forward and
 * backward, and waits for them before the same ones); XMESH_PIPE_BUNDLE=0: one per edge and
 * direction. */
static int want_plans(const graph_t *g)
{
    int64_t on = 1;
    xmesh_param_get_int("XMESH_PIPE_BUNDLE", &on);
    int n = 0;
    for (int e = 0; e < g->nedges; e++) {
        int first = 1;
        for (int f = 0; f < e && on; f++)
            if (g->e[f].src == g->e[e].src && g->e[f].dst == g->e[e].dst)
                first = 0;
        n += 2 * first;
    }
    return n;
}

static int close_enough(double a, double b, double scale)
{
    return fabs(a - b) <= 1e-5 * fmax(fabs(b), 1e-2 * scale);
}

static void run_case(xmesh_ctx_t ctx, const graph_t *g, const ref_t *ref, int kind, int dw,
                     int mode, const char *trace)
{
    xmp_sedge_t se[MAXE];
    for (int e = 0; e < g->nedges; e++) {
        se[e].src = g->e[e].src;
        se[e].dst = g->e[e].dst;
    }
    char err[1024];
    xmp_gen_opts_t o = {0};
    o.delay_wgrad = dw;
    xmp_schedule_t *s = NULL;
    if (xmp_sched_generate(kind, g->stages, g->M, g->nedges, se, &o, &s, err, sizeof(err)) != 0) {
        if (rank == 0)
            fprintf(stderr, "FAIL generate: %s\n", err);
        failures++;
        return;
    }
    xmp_stage_mesh_t meshes[MAXS];
    toy_t t;
    memset(&t, 0, sizeof(t));
    t.g = g;
    t.s = -1;
    t.signal = mode == XMP_COMM_SIGNAL;
    for (int st = 0; st < g->stages; st++) {
        meshes[st].ndim = 1;
        meshes[st].shape[0] = g->mesh_n[st];
        meshes[st].ranks = g->mesh_r[st];
        for (int k = 0; k < g->mesh_n[st]; k++)
            if (g->mesh_r[st][k] == rank) {
                t.s = st;
                t.idx = k;
                t.k = g->mesh_n[st];
            }
    }
    MPI_Comm_split(MPI_COMM_WORLD, t.s < 0 ? MPI_UNDEFINED : t.s, rank, &t.comm);
    if (t.s >= 0) {
        if (g->rows_mode[t.s])
            split(NR, t.k, t.idx, &t.r0, &t.nr);
        else
            t.nr = NR;
        for (int i = 0; i < NC; i++)
            for (int j = 0; j < NC; j++)
                t.W[i * NC + j] = init_w(t.s, i, j);
    }
    xmp_driver_cfg_t cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.comm = MPI_COMM_WORLD;
    cfg.ctx = ctx;
    cfg.nstages = g->stages;
    cfg.meshes = meshes;
    cfg.nedges = g->nedges;
    cfg.edges = g->e;
    cfg.sched = s;
    cfg.mode = mode;
    cfg.trace = trace != NULL;
    cfg.ops.user = &t;
    cfg.ops.forward = toy_forward;
    cfg.ops.backward_input = toy_bwd_input;
    cfg.ops.backward_weight = toy_bwd_weight;
    cfg.ops.reduce_grads = toy_reduce;
    cfg.ops.optimizer_step = toy_step;
    cfg.ops.activation_bytes = toy_bytes;
    cfg.ops.set_progress = toy_set_progress;
    xmp_driver_t *d = NULL;
    xmesh_result_t r = xmp_driver_create(&cfg, &d, err, sizeof(err));
    if (r != XMESH_SUCCESS) {
        fprintf(stderr, "FAIL rank %d create %s %s: %s\n", rank, s->name, xmp_comm_mode_name(mode),
                err);
        failures++;
        goto out;
    }
    if (xmp_driver_plans(d) != want_plans(g)) {
        fprintf(stderr, "FAIL rank %d %s %s: %d xmesh plans for %d edges, want %d\n", rank, s->name,
                xmp_comm_mode_name(mode), xmp_driver_plans(d), g->nedges, want_plans(g));
        failures++;
    }
    for (int step = 0; step < 2; step++) {
        xmp_step_stats_t st;
        r = xmp_driver_step(d, &st);
        if (r != XMESH_SUCCESS) {
            fprintf(stderr, "FAIL rank %d step %s %s: %s\n", rank, s->name,
                    xmp_comm_mode_name(mode), xmp_driver_error(d));
            failures++;
            break;
        }
        /* progress is handed over explicitly for the step and taken back after it */
        if (t.progress != NULL || (t.s >= 0 && t.nr > 0 && t.progress_calls == 0)) {
            fprintf(stderr, "FAIL rank %d %s: progress %s after the step, %d calls\n", rank,
                    s->name, t.progress ? "still set" : "unset", t.progress_calls);
            failures++;
        }
        double loss = 0;
        MPI_Allreduce(&st.loss, &loss, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        if (t.s >= 0 && st.peak_act_mb != s->max_inflight[t.s] && !dw) {
            fprintf(stderr, "FAIL rank %d %s: peak activations %d, bound %d\n", rank, s->name,
                    st.peak_act_mb, s->max_inflight[t.s]);
            failures++;
        }
        if (mode == XMP_COMM_SIGNAL || t.s < 0)
            continue;
        if (!close_enough(loss, ref->loss[step], 0)) {
            fprintf(stderr, "FAIL rank %d %s %s step %d: loss %.9g expected %.9g\n", rank, s->name,
                    xmp_comm_mode_name(mode), step, loss, ref->loss[step]);
            failures++;
        }
        double scale = 0;
        for (int i = 0; i < NC * NC; i++)
            scale = fmax(scale, fabs(ref->gW[step][t.s][i]));
        for (int i = 0; i < NC * NC; i++)
            if (!close_enough(t.last_gW[i], ref->gW[step][t.s][i], scale)) {
                fprintf(stderr, "FAIL rank %d %s %s step %d stage %d: gW[%d] %.9g expected %.9g\n",
                        rank, s->name, xmp_comm_mode_name(mode), step, t.s, i, t.last_gW[i],
                        ref->gW[step][t.s][i]);
                failures++;
                break;
            }
    }
    if (trace && failures == 0) {
        xmp_sim_result_t res;
        double f[MAXS], c1[MAXS];
        for (int i = 0; i < MAXS; i++)
            f[i] = c1[i] = 1e-4;
        if (xmp_driver_predict(d, f, c1, c1, &res) == XMESH_SUCCESS) {
            if (rank == 0)
                xmp_sim_render(s, &res, 64, stdout);
            xmp_sim_result_free(&res);
        } else {
            fprintf(stderr, "FAIL predict: %s\n", xmp_driver_error(d));
            failures++;
        }
        if (xmp_driver_write_trace(d, trace) != XMESH_SUCCESS) {
            fprintf(stderr, "FAIL trace: %s\n", xmp_driver_error(d));
            failures++;
        } else if (rank == 0) {
            FILE *f2 = fopen(trace, "r");
            static char buf[1 << 20];
            size_t n = f2 ? fread(buf, 1, sizeof(buf) - 1, f2) : 0;
            buf[n] = '\0';
            if (f2)
                fclose(f2);
            if (buf[0] != '[' || !strstr(buf, "\"ph\":\"s\"") || !strstr(buf, "\"ph\":\"f\"") ||
                !strstr(buf, "\"name\":\"F0\"") || !strstr(buf, "\"pid\":3")) {
                fprintf(stderr, "FAIL trace content\n");
                failures++;
            }
        }
    }
    if (t.nonzero_in) {
        fprintf(stderr, "FAIL rank %d %s signal: %d input values arrived\n", rank, s->name,
                t.nonzero_in);
        failures++;
    }
out:
    if (xmp_driver_destroy(d) != XMESH_SUCCESS) {
        fprintf(stderr, "FAIL destroy\n");
        failures++;
    }
    if (t.comm != MPI_COMM_NULL)
        MPI_Comm_free(&t.comm);
    xmp_sched_destroy(s);
}

int main(int argc, char **argv)
{
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    const char *graphs = "ab", *trace = NULL;
    for (int i = 1; i + 1 < argc; i++) {
        if (strcmp(argv[i], "--graph") == 0)
            graphs = argv[++i];
        else if (strcmp(argv[i], "--trace") == 0)
            trace = argv[++i];
    }
    xmesh_ctx_t ctx;
    if (xmesh_ctx_create_mpi(MPI_COMM_WORLD, NULL, &ctx) != XMESH_SUCCESS) {
        fprintf(stderr, "ctx: %s\n", xmesh_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (const char *gp = graphs; *gp; gp++) {
        graph_t g;
        int need = make_graph(*gp, &g);
        if (need != nranks) {
            if (rank == 0)
                fprintf(stderr, "graph %c needs %d ranks, have %d\n", *gp, need, nranks);
            failures++;
            continue;
        }
        ref_t ref;
        reference(&g, &ref);
        int cases = 0;
        for (int kind = 0; kind < 3; kind++)
            for (int dw = 0; dw < 2; dw++)
                for (int mode = 0; mode < XMP_COMM_COUNT_; mode++) {
                    int tr = trace && kind == XMP_SCHED_EAGER_1F1B && dw && mode == 0;
                    run_case(ctx, &g, &ref, kind, dw, mode, tr ? trace : NULL);
                    cases++;
                }
        if (rank == 0)
            printf("graph %c: %d cases (3 schedules x delay_wgrad x %d modes), loss %.6f %.6f\n",
                   *gp, cases, XMP_COMM_COUNT_, ref.loss[0], ref.loss[1]);
    }
    int all = 0;
    MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    xmesh_ctx_destroy(ctx);
    if (rank == 0)
        printf("%s (%d failures)\n", all ? "FAILED" : "all driver tests passed", all);
    MPI_Finalize();
    return all ? 1 : 0;
}
