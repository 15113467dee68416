/* xmesh-plan --many (plan.h): one plan of many tensors. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "xm_api.h"
#include "xm_cases.h"
#include "xm_cluster_file.h"
#include "xm_cost.h"
#include "xm_sched.h"

#include "plan.h"

typedef struct {
    int n, cap;
    xm_layout_t *src, *dst;
    xmesh_dtype_t *sdt, *ddt;
    int *line; /* line number in the file */
} many_t;

static void many_free(many_t *m)
{
    free(m->src);
    free(m->dst);
    free(m->sdt);
    free(m->ddt);
    free(m->line);
    memset(m, 0, sizeof *m);
}

/* One line "SHAPE DTYPE SRC-MESH SRC-SPEC DST-MESH DST-SPEC [DST-DTYPE]"
 * into tensor m->n (meshes' devices set later). 0 or 2 (message printed). */
static int many_line(const char *file, int ln, char *text, many_t *m)
{
    char *tok[8], *save = NULL;
    int nt = 0;
    for (char *t = strtok_r(text, " \t\r\n", &save); t && nt < 8;
         t = strtok_r(NULL, " \t\r\n", &save))
        tok[nt++] = t;
    if (nt != 6 && nt != 7)
        return xpl_bad(
            "--many %s line %d: %d fields, expected SHAPE DTYPE SRC-MESH SRC-SPEC DST-MESH "
            "DST-SPEC [DST-DTYPE]",
            file, ln, nt);
    if (m->n == m->cap) {
        int c = m->cap ? 2 * m->cap : 64;
        xm_layout_t *s = realloc(m->src, sizeof *s * c),
                    *d = s ? realloc(m->dst, sizeof *d * c) : 0;
        if (s)
            m->src = s;
        if (d)
            m->dst = d;
        xmesh_dtype_t *a = realloc(m->sdt, sizeof *a * c);
        if (a)
            m->sdt = a;
        xmesh_dtype_t *b = realloc(m->ddt, sizeof *b * c);
        if (b)
            m->ddt = b;
        int *l = realloc(m->line, sizeof *l * c);
        if (l)
            m->line = l;
        if (!s || !d || !a || !b || !l) {
            fprintf(stderr, "xmesh-plan: out of memory\n");
            return 1;
        }
        m->cap = c;
    }
    int k = m->n, rc, nd = 0;
    int64_t shape[XM_MAX_DIMS];
    if (strcmp(tok[0], "-") && (rc = xpl_parse_shape(tok[0], &nd, shape)))
        return xpl_bad("--many %s line %d: shape '%s'", file, ln, tok[0]);
    if (xmesh_dtype_parse(tok[1], &m->sdt[k]))
        return xpl_bad("--many %s line %d: dtype '%s': %s", file, ln, tok[1], xmesh_last_error());
    m->ddt[k] = m->sdt[k];
    if (nt == 7 && xmesh_dtype_parse(tok[6], &m->ddt[k]))
        return xpl_bad("--many %s line %d: dtype '%s': %s", file, ln, tok[6], xmesh_last_error());
    if (!xm_dtype_pair_ok(m->sdt[k], m->ddt[k]))
        return xpl_bad("--many %s line %d: no conversion from %s to %s (f16, bf16, f32 only)", file,
                       ln, tok[1], tok[6]);
    for (int s = 0; s < 2; s++) {
        xm_layout_t *l = s ? &m->dst[k] : &m->src[k];
        memset(l, 0, sizeof *l);
        l->ndim = nd;
        memcpy(l->shape, shape, sizeof(int64_t) * nd);
        l->elem_size = xmesh_dtype_size(s ? m->ddt[k] : m->sdt[k]);
        const char *mesh = tok[s ? 4 : 2], *spec = tok[s ? 5 : 3];
        if ((rc = xpl_parse_mesh(s ? "--many dst mesh" : "--many src mesh", mesh, &l->mesh.ndim,
                                 l->mesh.shape)))
            return xpl_bad("--many %s line %d: mesh '%s'", file, ln, mesh);
        l->mesh.ndev = 1;
        for (int a = 0; a < l->mesh.ndim; a++)
            l->mesh.ndev *= l->mesh.shape[a];
        if (xm_spec_parse(spec, nd, l->mesh.ndim, &l->spec))
            return xpl_bad("--many %s line %d: spec '%s': %s", file, ln, spec, xmesh_last_error());
    }
    m->line[k] = ln;
    m->n++;
    return 0;
}

static int many_read(const char *file, many_t *m)
{
    memset(m, 0, sizeof *m);
    FILE *f = strcmp(file, "-") ? fopen(file, "r") : stdin;
    if (!f)
        return xpl_bad("--many: cannot open '%s': %s", file, strerror(errno));
    char buf[1024];
    int ln = 0, rc = 0;
    while (!rc && fgets(buf, sizeof buf, f)) {
        ln++;
        char *h = strchr(buf, '#');
        if (h)
            *h = 0;
        char *p = buf;
        while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')
            p++;
        if (*p)
            rc = many_line(file, ln, p, m);
    }
    if (f != stdin)
        fclose(f);
    if (!rc && m->n == 0)
        rc = xpl_bad("--many %s: no layout pairs", file);
    return rc;
}

static void many_json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++)
        fprintf(f, *s == '"' || *s == '\\' ? "\\%c" : "%c", *s);
    fputc('"', f);
}

/* The plan of the whole, as plan creation makes it (lib/plan/api.c): the
 * union decomposition with packing, one schedule (task splitting as
 * XMESH_SPLIT), its lower bound and simulated makespan; and the model time
 * of one plan per tensor, one after another. */
int xpl_many_run(const opts_t *o)
{
    many_t m;
    int rc = many_read(o->many, &m);
    if (rc) {
        many_free(&m);
        return rc;
    }
    xm_hostmap_t hm;
    int *sdevs = NULL, *ddevs = NULL, *key = NULL;
    xm_taskset_t ts;
    xm_cluster_t cl;
    xm_schedule_t sc;
    memset(&ts, 0, sizeof ts);
    memset(&cl, 0, sizeof cl);
    memset(&sc, 0, sizeof sc);
    if (xm_hostmap_default(m.src[0].mesh.shape, m.src[0].mesh.ndim, m.dst[0].mesh.shape,
                           m.dst[0].mesh.ndim, o->overlap, &hm, &sdevs, &ddevs)) {
        fprintf(stderr, "xmesh-plan: %s\n", xmesh_last_error());
        many_free(&m);
        return 1;
    }
    for (int k = 0; k < m.n && !rc; k++) {
        if (m.src[k].mesh.ndev > m.src[0].mesh.ndev || m.dst[k].mesh.ndev > m.dst[0].mesh.ndev)
            rc = xpl_bad("--many %s line %d: a mesh has more devices than the first line's",
                         o->many, m.line[k]);
        m.src[k].mesh.devs = sdevs;
        m.dst[k].mesh.devs = ddevs;
    }
    key = malloc(sizeof(int) * m.n);
    if (!rc && !key) {
        fprintf(stderr, "xmesh-plan: out of memory\n");
        rc = 1;
    }
    for (int k = 0; !rc && k < m.n; k++)
        key[k] = (int)m.sdt[k] * XMESH_DTYPE_COUNT_ + (int)m.ddt[k];
    if (!rc && xm_cluster_init(&cl, &hm)) {
        fprintf(stderr, "xmesh-plan: %s\n", xmesh_last_error());
        rc = 1;
    }
    cl.nics_per_host = o->nics_per_host;
    cl.nic_send_Bps = o->nic_gbps * 1e9 / 8;
    cl.nic_recv_Bps = o->nic_recv_gbps * 1e9 / 8;
    cl.intra_Bps = o->intra_gbps * 1e9 / 8;
    cl.latency_s = o->latency_us * 1e-6;
    cl.chunk_bytes = o->chunk_bytes;
    int64_t pack_limit = xm_param_i64("XMESH_PACK_BYTES");
    int64_t pack_max = pack_limit > 0 && o->strategy != XMESH_STRATEGY_SENDRECV_ALLGATHER &&
                               o->strategy != XMESH_STRATEGY_GLOBAL_ALLGATHER
                           ? o->chunk_bytes
                           : 0;
    xm_sched_opts_t so =
        xpl_sched_opts(o, o->scheduler == ALL_SCHEDULERS ? XMESH_SCHEDULER_ENSEMBLE
                                                         : (xmesh_scheduler_t)o->scheduler);
    int split = o->split || xm_param_i64("XMESH_SPLIT") != 0, used = 0, units = 0, packed = 0;
    double t0 = xpl_now_ms(CLOCK_MONOTONIC), t1 = t0, t2 = t0;
    if (!rc) {
        xmesh_result_t r =
            xm_decompose_many(m.n, m.src, m.dst, key, &hm, pack_max, pack_limit, &ts);
        t1 = xpl_now_ms(CLOCK_MONOTONIC);
        if (r)
            rc = r == XMESH_ERR_INVALID_ARGUMENT ? xpl_bad("%s", xmesh_last_error()) : 1;
        else if ((r = xm_schedule_plan(&ts, &cl, &so, split, &sc, &used)))
            rc = 1;
        t2 = xpl_now_ms(CLOCK_MONOTONIC);
        if (r && rc == 1)
            fprintf(stderr, "xmesh-plan: planning failed: %s\n", xmesh_last_error());
    }
    /* one plan per tensor, one after another (the same model) */
    double serial = 0;
    int serial_ok = 1;
    for (int k = 0; !rc && k < m.n; k++) {
        xm_taskset_t one;
        xm_schedule_t s1;
        if (xm_decompose_many(1, &m.src[k], &m.dst[k], NULL, &hm, 0, 0, &one)) {
            serial_ok = 0;
            break;
        }
        if (one.ntasks == 0) {
            xm_taskset_free(&one);
            continue;
        }
        if (xm_schedule_plan(&one, &cl, &so, split, &s1, NULL)) {
            xm_taskset_free(&one);
            serial_ok = 0;
            break;
        }
        serial += s1.makespan_s;
        xm_schedule_free(&s1);
        xm_taskset_free(&one);
    }
    /* The busiest NIC of the plan of many (simulated busy seconds per
     * direction) and the most bytes any NIC sends or receives. */
    xm_sim_result_t sim = {0};
    double send_busy = 0, recv_busy = 0, send_bytes = 0, recv_bytes = 0;
    int send_nic = -1, recv_nic = -1;
    if (!rc && ts.ntasks > 0) {
        if (xm_simulate(&ts, &cl, &sc, &sim, NULL)) {
            fprintf(stderr, "xmesh-plan: simulation failed: %s\n", xmesh_last_error());
            rc = 1;
        }
        for (int n = 0; !rc && n < sim.nnics; n++) {
            if (sim.nic_send_busy_s[n] > send_busy)
                send_busy = sim.nic_send_busy_s[n], send_nic = n;
            if (sim.nic_recv_busy_s[n] > recv_busy)
                recv_busy = sim.nic_recv_busy_s[n], recv_nic = n;
            if (sim.nic_send_bytes[n] > send_bytes)
                send_bytes = sim.nic_send_bytes[n];
            if (sim.nic_recv_bytes[n] > recv_bytes)
                recv_bytes = sim.nic_recv_bytes[n];
        }
    }
    if (!rc) {
        for (int t = 0; t < ts.ntasks; t++) {
            units += ts.tasks[t].npack ? ts.tasks[t].npack : 1;
            packed += ts.tasks[t].npack > 0;
        }
        double lb = sc.lower_bound_s, pr = sc.makespan_s;
        if (o->json) {
            printf("{\"many\": ");
            many_json_str(stdout, o->many);
            printf(", \"tensors\": %d, \"unit_tasks\": %d, \"scheduled_tasks\": %d, "
                   "\"packed_tasks\": %d, \"pieces\": %d, \"bytes_total\": %lld, "
                   "\"bytes_cross_host\": %lld, \"lower_bound_s\": %.9g, \"predicted_s\": "
                   "%.9g, \"ratio\": %.6g, \"per_tensor_serial_s\": %.9g, \"split\": %d, "
                   "\"scheduler\": \"%s\", \"strategy\": \"%s\", \"chunk_bytes\": %lld, "
                   "\"pack_bytes\": %lld, \"decompose_ms\": %.3f, \"plan_ms\": %.3f, "
                   "\"nics\": %d, \"busiest_send_nic\": %d, \"busiest_send_s\": %.9g, "
                   "\"most_send_bytes\": %.6g, \"busiest_recv_nic\": %d, "
                   "\"busiest_recv_s\": %.9g, \"most_recv_bytes\": %.6g}\n",
                   m.n, units, ts.ntasks, packed, ts.npieces, (long long)ts.bytes_total,
                   (long long)ts.bytes_cross_host, lb, pr, lb > 0 ? pr / lb : 1.0,
                   serial_ok ? serial : -1.0, used, xmesh_scheduler_name(so.kind),
                   xmesh_strategy_name(o->strategy), (long long)o->chunk_bytes,
                   (long long)pack_limit, t1 - t0, t2 - t0, sim.nnics, send_nic, send_busy,
                   send_bytes, recv_nic, recv_busy, recv_bytes);
        } else {
            char b1[32], b2[32];
            printf("plan of %d tensors from %s (%s, %s)\n", m.n, o->many,
                   xmesh_scheduler_name(so.kind), xmesh_strategy_name(o->strategy));
            printf("  unit tasks          %d (%d scheduled: %d packed tasks carry %d pieces)%s\n",
                   units, ts.ntasks, packed, ts.npieces, used ? ", split" : "");
            printf("  bytes               %s total, %s across host NICs\n",
                   xpl_human_bytes((double)ts.bytes_total, b1, sizeof b1),
                   xpl_human_bytes((double)ts.bytes_cross_host, b2, sizeof b2));
            printf("  lower bound         %.6g s\n", lb);
            printf("  predicted           %.6g s (%.3fx the bound)\n", pr, lb > 0 ? pr / lb : 1.0);
            if (serial_ok)
                printf("  per-tensor plans    %.6g s one after another (%.2fx the plan of many)\n",
                       serial, pr > 0 ? serial / pr : 1.0);
            printf("  planning            %.2f ms (decompose %.2f ms)\n", t2 - t0, t1 - t0);
            if (sim.nnics > 0)
                printf("  busiest NIC         send %.6g s (NIC %d; most bytes sent by a NIC %s), "
                       "receive %.6g s (NIC %d; most received %s)\n",
                       send_busy, send_nic, xpl_human_bytes(send_bytes, b1, sizeof b1), recv_busy,
                       recv_nic, xpl_human_bytes(recv_bytes, b2, sizeof b2));
        }
    }
    xm_sim_result_free(&sim);
    xm_schedule_free(&sc);
    xm_taskset_free(&ts);
    xm_cluster_free(&cl);
    xm_hostmap_free(&hm);
    free(sdevs);
    free(ddevs);
    free(key);
    many_free(&m);
    return rc;
}
