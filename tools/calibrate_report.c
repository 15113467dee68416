/* xmesh-calibrate: the outputs on rank 0 (calibrate.h): the table, the JSON, the cluster file. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "calibrate.h"

/* The model for the file's sections: every successful fit and shape. */
static xm_costmodel_t *to_model(const results_t *R)
{
    xm_costmodel_t *m = xm_costmodel_create();
    for (int i = 0; m && i < R->nc; i++) {
        const coll_res_t *c = &R->C[i];
        if (!c->fit_ok)
            continue;
        xm_coll_rec_t rec;
        memset(&rec, 0, sizeof rec);
        rec.kind = c->kind;
        rec.g = R->G[c->geom].g;
        rec.fit = c->fit;
        rec.min_bytes = c->x[0];
        rec.max_bytes = c->x[c->n - 1];
        if (xm_costmodel_add_coll(m, &rec))
            fprintf(stderr, "xmesh-calibrate: %s\n", xmesh_last_error());
        else if (c->n >= 2 && c->n <= XM_COLL_MAX_POINTS &&
                 xm_costmodel_set_points(m, rec.kind, &rec.g, c->n, c->x, c->y))
            fprintf(stderr, "xmesh-calibrate: %s\n", xmesh_last_error()); /* fit kept alone */
    }
    for (int i = 0; m && i < R->ns; i++) {
        xm_gemm_rec_t g;
        memset(&g, 0, sizeof g);
        g.m = R->S[i].s.m;
        g.n = R->S[i].s.n;
        g.k = R->S[i].s.k;
        g.busy = R->busy;
        g.seconds = R->S[i].seconds;
        memcpy(g.label, R->S[i].s.label, sizeof g.label);
        if (xm_costmodel_add_gemm(m, &g))
            fprintf(stderr, "xmesh-calibrate: %s\n", xmesh_last_error());
    }
    if (m && R->gemm_fit_ok) {
        m->has_gemm_fit = 1;
        m->gemm_fit = R->gemm_fit;
    }
    for (int k = 0; m && k < XM_ELT_NKINDS; k++)
        if (R->E[k].busy > 0 && xm_costmodel_set_elt(m, (xm_elt_t)k, &R->E[k]))
            fprintf(stderr, "xmesh-calibrate: %s\n", xmesh_last_error());
    if (m && R->step.busy > 0 && xmp_gptstep_set(m, &R->step))
        fprintf(stderr, "xmesh-calibrate: %s\n", xmesh_last_error());
    int *rk = R->nsets ? malloc((size_t)R->size * sizeof *rk) : NULL;
    for (int sidx = 0; m && rk && sidx < R->nsets; sidx++) {
        int n = 0;
        for (int r = 0; r < R->size; r++)
            if (R->set_of[r] == sidx)
                rk[n++] = r;
        if (xm_costmodel_add_cpuset(m, R->set_cpus[sidx], rk, n, R->set_wait[sidx]) ||
            xm_costmodel_set_cpuset_sync(m, m->ncpusets - 1, R->set_sync[sidx]))
            fprintf(stderr, "xmesh-calibrate: %s\n", xmesh_last_error());
    }
    free(rk);
    return m;
}

void xmc_print_table(const opts_t *o, const results_t *R)
{
    const klass_t *K = R->K;
    printf("# xmesh-calibrate: %d ranks on %d hosts; sizes %lld .. %lld bytes in %d steps, "
           "median of %d\n",
           R->size, R->nhosts, (long long)o->minb, (long long)o->maxb, o->steps, o->reps);
    printf("# time = alpha + beta * bytes, least squares; Gbit/s = 8 / beta\n");
    printf("%-16s %11s %11s %10s %8s %10s  %s\n", "class", "alpha(us)", "beta(ns/B)", "Gbit/s",
           "R^2", "worst_rel", "what");
    for (int c = 0; c < NCLASS; c++) {
        if (!K[c].ok) {
            printf("%-16s %11s %11s %10s %8s %10s  not measured: %s\n", xmc_cname[c], "-", "-", "-",
                   "-", "-", K[c].why);
            continue;
        }
        if (!K[c].fit_ok) {
            printf("%-16s fit failed\n", xmc_cname[c]);
            continue;
        }
        printf("%-16s %11.2f %11.4f %10.4g %8.5f %10.4f  %s\n", xmc_cname[c], K[c].fit.alpha * 1e6,
               K[c].fit.beta * 1e9, xmc_gbps(&K[c]), K[c].fit.r2, K[c].fit.worst_rel, xmc_chelp[c]);
    }
    printf("# points (bytes: seconds)\n");
    for (int c = 0; c < NCLASS; c++) {
        if (!K[c].ok)
            continue;
        printf("#   %-16s", xmc_cname[c]);
        for (int i = 0; i < K[c].n; i++)
            printf(" %.0f:%.6f", K[c].x[i], K[c].y[i]);
        printf("\n");
    }
    if (o->skip_coll)
        printf("# collectives: skipped (--skip)\n");
    else if (R->coll_why[0])
        printf("# collectives: not measured: %s\n", R->coll_why);
    else {
        printf("# collectives: time = alpha + beta * f(n, p), relative least squares;\n"
               "# f = 2(p-1)/p n (allreduce), (p-1)/p n (allgather, reduce_scatter, alltoall);"
               " bus Gbit/s = 8 / beta\n");
        printf("%-15s %4s %4s %5s %5s %11s %11s %9s %8s %9s  %s\n", "kind", "p", "rph", "hosts",
               "share", "alpha(us)", "beta(ns/B)", "busGbit/s", "R^2", "worst_rel", "geometry");
        for (int i = 0; i < R->nc; i++) {
            const coll_res_t *c = &R->C[i];
            const geom_t *g = &R->G[c->geom];
            printf("%-15s %4d %4d %5d %5d ", xm_coll_name(c->kind), g->g.group_size,
                   g->g.ranks_per_host, g->g.hosts, g->g.share);
            if (!c->fit_ok)
                printf("not fitted: %s\n", c->why);
            else
                printf("%11.2f %11.4f %9.4g %8.5f %9.4f  %s\n", c->fit.alpha * 1e6,
                       c->fit.beta * 1e9, c->fit.beta > 0 ? 8 / c->fit.beta / 1e9 : NAN, c->fit.r2,
                       c->fit.worst_rel, g->what);
            printf("#   points (bytes:seconds)");
            for (int i2 = 0; i2 < c->n; i2++)
                printf(" %.0f:%.6f", c->x[i2], c->y[i2]);
            printf("\n");
        }
    }
    if (o->skip_compute)
        printf("# compute: skipped (--skip)\n");
    else if (!R->ns)
        printf("# compute: not measured: %s\n", R->gemm_why);
    else {
        printf("# compute: sgemm C(m x n) = A(m x k) . B(k x n), %d ranks per host at once, "
               "slowest rank's median\n",
               R->busy);
        printf("%-28s %7s %7s %7s %12s %9s\n", "shape", "m", "n", "k", "ms", "GFLOP/s");
        for (int i = 0; i < R->ns; i++)
            printf("%-28s %7lld %7lld %7lld %12.4f %9.2f\n", R->S[i].s.label,
                   (long long)R->S[i].s.m, (long long)R->S[i].s.n, (long long)R->S[i].s.k,
                   R->S[i].seconds * 1e3, xmc_flops(&R->S[i].s) / R->S[i].seconds / 1e9);
        if (R->gemm_fit_ok)
            printf("# sgemm fit time = alpha + beta * 2mnk: alpha %.2f us, %.4g GFLOP/s, R^2 "
                   "%.5f, worst_rel %.4f\n",
                   R->gemm_fit.alpha * 1e6, R->gemm_fit.beta > 0 ? 1e-9 / R->gemm_fit.beta : NAN,
                   R->gemm_fit.r2, R->gemm_fit.worst_rel);
        for (int k = 0; k < XM_ELT_NKINDS; k++)
            if (R->E[k].busy > 0)
                printf("# eltwise %-10s fwd %8.3f ns/unit  bwd %8.3f ns/unit (%d busy)\n",
                       xm_elt_name((xm_elt_t)k), R->E[k].fwd * 1e9, R->E[k].bwd * 1e9,
                       R->E[k].busy);
        if (R->step.busy > 0)
            printf("# gptstep (serial GPT-2, L %d C %d NH %d T %d B %d V %d): %.3f ms a step "
                   "(%d busy)\n",
                   R->step.layers, R->step.channels, R->step.heads, R->step.seq, R->step.rows,
                   R->step.vocab, R->step.seconds * 1e3, R->step.busy);
        for (int c = 0; c < R->nsets; c++)
            printf("# cpuset %d: %d ranks on %d cpus, a polling rank takes %.2f of a computing "
                   "rank's cpu; a 2-rank collective waits %.3f ms more while others compute\n",
                   c, R->set_n[c], R->set_cpus[c], R->set_wait[c], R->set_sync[c] * 1e3);
    }
}

static void json_num(const char *k, double v, int comma)
{
    if (isfinite(v))
        printf("\"%s\":%.9g%s", k, v, comma ? "," : "");
    else
        printf("\"%s\":null%s", k, comma ? "," : "");
}

void xmc_print_json(const opts_t *o, const results_t *R, const xm_cluster_t *cl)
{
    const klass_t *K = R->K;
    printf("{\"ranks\":%d,\"hosts\":%d,\"min_bytes\":%lld,\"max_bytes\":%lld,\"steps\":%d,"
           "\"reps\":%d,\"classes\":{",
           R->size, R->nhosts, (long long)o->minb, (long long)o->maxb, o->steps, o->reps);
    for (int c = 0; c < NCLASS; c++) {
        printf("%s\"%s\":{\"measured\":%s,", c ? "," : "", xmc_cname[c],
               K[c].ok ? "true" : "false");
        if (!K[c].ok || !K[c].fit_ok) {
            printf("\"why\":\"%s\"}", K[c].ok ? "fit failed" : K[c].why);
            continue;
        }
        json_num("alpha_s", K[c].fit.alpha, 1);
        json_num("beta_s_per_byte", K[c].fit.beta, 1);
        json_num("gbps", xmc_gbps(&K[c]), 1);
        json_num("r2", K[c].fit.r2, 1);
        json_num("worst_rel_residual", K[c].fit.worst_rel, 1);
        printf("\"points\":[");
        for (int i = 0; i < K[c].n; i++)
            printf("%s[%.0f,%.9g]", i ? "," : "", K[c].x[i], K[c].y[i]);
        printf("]}");
    }
    printf("},\"collectives\":[");
    for (int i = 0; i < R->nc; i++) {
        const coll_res_t *c = &R->C[i];
        const geom_t *g = &R->G[c->geom];
        printf("%s{\"kind\":\"%s\",\"p\":%d,\"ranks_per_host\":%d,\"hosts\":%d,\"share\":%d,"
               "\"geometry\":\"%s\",\"fitted\":%s,",
               i ? "," : "", xm_coll_name(c->kind), g->g.group_size, g->g.ranks_per_host,
               g->g.hosts, g->g.share, g->what, c->fit_ok ? "true" : "false");
        if (c->fit_ok) {
            json_num("alpha_s", c->fit.alpha, 1);
            json_num("beta_s_per_byte", c->fit.beta, 1);
            json_num("r2", c->fit.r2, 1);
            json_num("worst_rel_residual", c->fit.worst_rel, 1);
        } else {
            printf("\"why\":\"");
            for (const char *q = c->why; *q; q++)
                if (*q != '"' && *q != '\\' && (unsigned char)*q >= ' ')
                    putchar(*q);
            printf("\",");
        }
        printf("\"points\":[");
        for (int j = 0; j < c->n; j++)
            printf("%s[%.0f,%.9g]", j ? "," : "", c->x[j], c->y[j]);
        printf("]}");
    }
    printf("],\"compute\":{\"busy\":%d,\"shapes\":[", R->busy);
    for (int i = 0; i < R->ns; i++) {
        printf("%s{\"label\":\"%s\",\"m\":%lld,\"n\":%lld,\"k\":%lld,", i ? "," : "",
               R->S[i].s.label, (long long)R->S[i].s.m, (long long)R->S[i].s.n,
               (long long)R->S[i].s.k);
        json_num("seconds", R->S[i].seconds, 1);
        json_num("gflops", xmc_flops(&R->S[i].s) / R->S[i].seconds / 1e9, 0);
        printf("}");
    }
    printf("],\"fit\":");
    if (R->gemm_fit_ok) {
        printf("{");
        json_num("alpha_s", R->gemm_fit.alpha, 1);
        json_num("beta_s_per_flop", R->gemm_fit.beta, 1);
        json_num("r2", R->gemm_fit.r2, 1);
        json_num("worst_rel_residual", R->gemm_fit.worst_rel, 0);
        printf("}");
    } else {
        printf("null");
    }
    printf(",\"why\":\"%s\"}", o->skip_compute ? "skipped" : R->ns ? "" : R->gemm_why);
    printf(",\"model\":{");
    json_num("nic_gbps", cl->nic_send_Bps * 8 / 1e9, 1);
    json_num("intra_gbps", cl->intra_Bps * 8 / 1e9, 1);
    json_num("latency_us", cl->latency_s * 1e6, 0);
    printf("},\"output\":");
    if (o->out)
        printf("\"%s\"}\n", o->out);
    else
        printf("null}\n");
}

/* The cluster file text; fills the fitted values into *cl (for the JSON).
 * Returns -1 if nothing could be fitted. */
int xmc_write_file(const opts_t *o, const results_t *R, xm_cluster_t *cl, FILE *f)
{
    const klass_t *K = R->K;
    time_t now = time(NULL);
    char ts[64];
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    fprintf(f,
            "# cluster file written by xmesh-calibrate at %s\n"
            "# %d ranks on %d hosts; sizes %lld .. %lld bytes, %d steps, median of %d\n"
            "# collectives timed %s\n"
            "# fits: time = alpha + beta * bytes (least squares); each class below as\n"
            "# class: alpha_us beta_ns_per_byte gbps r2 worst_rel_residual points\n",
            ts, R->size, R->nhosts, (long long)o->minb, (long long)o->maxb, o->steps, o->reps,
            o->blocking ? "blocking (--blocking-collectives: MPI_Allreduce, ..)"
                        : "as the trainer runs them (MPI_Iallreduce, .., polled)");
    for (int c = 0; c < NCLASS; c++) {
        if (K[c].ok && K[c].fit_ok)
            fprintf(f, "#   %s: %.4f %.6f %.6g %.6f %.6f %d\n", xmc_cname[c], K[c].fit.alpha * 1e6,
                    K[c].fit.beta * 1e9, xmc_gbps(&K[c]), K[c].fit.r2, K[c].fit.worst_rel, K[c].n);
        else
            fprintf(f, "#   %s: not measured (%s)\n", xmc_cname[c],
                    K[c].ok ? "fit failed" : K[c].why);
    }
    int wrote = 0;
    const klass_t *in = &K[C_P2P_INTER], *ia = &K[C_P2P_INTRA];
    if (in->ok && in->fit_ok && in->fit.beta > 0) {
        double lat = in->fit.alpha > 0 ? in->fit.alpha * 1e6 : 0;
        fprintf(f, "nic_gbps = %.6g   # 8 / beta(p2p-inter)\n", xmc_gbps(in));
        fprintf(f, "latency_us = %.6g   # alpha(p2p-inter)%s\n", lat,
                in->fit.alpha > 0 ? "" : ", fitted below 0: clamped");
        cl->nic_send_Bps = cl->nic_recv_Bps = xmc_gbps(in) * 1e9 / 8;
        cl->latency_s = lat * 1e-6;
        wrote++;
    } else {
        fprintf(f, "# nic_gbps, latency_us: not fitted (p2p-inter %s)\n",
                in->ok ? "slope not positive" : in->why);
    }
    if (ia->ok && ia->fit_ok && ia->fit.beta > 0) {
        fprintf(f, "intra_gbps = %.6g   # 8 / beta(p2p-intra)\n", xmc_gbps(ia));
        cl->intra_Bps = xmc_gbps(ia) * 1e9 / 8;
        wrote++;
    } else {
        fprintf(f, "# intra_gbps: not fitted (p2p-intra %s)\n",
                ia->ok ? "slope not positive" : ia->why);
    }
    xm_costmodel_t *m = to_model(R);
    if (!m) {
        fprintf(stderr, "xmesh-calibrate: out of memory for the cost model\n");
        return -1;
    }
    if (xm_costmodel_write(m, f))
        fprintf(stderr, "xmesh-calibrate: %s\n", xmesh_last_error());
    wrote += m->ncoll + m->ngemm;
    xm_costmodel_destroy(m);
    for (int i = 0; i < R->nc; i++)
        if (!R->C[i].fit_ok) {
            const xm_coll_geom_t *g = &R->G[R->C[i].geom].g;
            fprintf(f, "# not fitted: %s p %d ranks_per_host %d hosts %d share %d: %s\n",
                    xm_coll_name(R->C[i].kind), g->group_size, g->ranks_per_host, g->hosts,
                    g->share, R->C[i].why);
        }
    if (!o->skip_compute && !R->ns)
        fprintf(f, "# compute not measured: %s\n", R->gemm_why);
    return wrote ? 0 : -1;
}
