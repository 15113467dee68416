/* Reusable CLI helpers of xmesh-train; contracts in apps/cli_util.h. */
#include "cli_util.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *g_cmd = "";

void xmp_cli_set_command(const char *cmd)
{
    g_cmd = cmd ? cmd : "";
}

int xmp_cli_error(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "xmesh-train%s%s: ", *g_cmd ? " " : "", g_cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return -1;
}

const char *xmp_cli_value(int argc, char **argv, int *i)
{
    if (*i + 1 >= argc) {
        xmp_cli_error("%s: missing value", argv[*i]);
        return NULL;
    }
    (*i)++;
    return argv[*i];
}

int xmp_cli_int(const char *flag, const char *s, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end != '\0' || errno == ERANGE)
        return xmp_cli_error("%s '%s': not an integer", flag, s);
    if (v < lo || v > hi)
        return xmp_cli_error("%s '%s': out of range [%ld, %ld]", flag, s, lo, hi);
    *out = (int)v;
    return 0;
}

int xmp_cli_u64(const char *flag, const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    if (*s == '-')
        return xmp_cli_error("%s '%s': must not be negative", flag, s);
    unsigned long long v = strtoull(s, &end, 0);
    if (end == s || *end != '\0' || errno == ERANGE)
        return xmp_cli_error("%s '%s': not an unsigned 64-bit integer", flag, s);
    *out = (uint64_t)v;
    return 0;
}

int xmp_cli_float(const char *flag, const char *s, double lo, double hi, float *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end != '\0' || errno == ERANGE || !isfinite(v))
        return xmp_cli_error("%s '%s': not a finite number", flag, s);
    if (v < lo || v > hi)
        return xmp_cli_error("%s '%s': out of range [%g, %g]", flag, s, lo, hi);
    *out = (float)v;
    return 0;
}

int xmp_cli_table(int argc, char **argv, int *i, const xmp_cli_flag_t *tab, size_t n)
{
    const char *a = argv[*i], *v;
    size_t k = 0;
    while (k < n && strcmp(a, tab[k].flag))
        k++;
    if (k == n)
        return 0;
    if (!(v = xmp_cli_value(argc, argv, i)))
        return -1;
    if (tab[k].ip && xmp_cli_int(a, v, tab[k].lo, tab[k].hi, tab[k].ip) != 0)
        return -1;
    if (tab[k].fp && xmp_cli_float(a, v, tab[k].flo, tab[k].fhi, tab[k].fp) != 0)
        return -1;
    if (tab[k].sp)
        *tab[k].sp = v;
    return 1;
}

double xmp_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- progress bar ---- */

void xmp_progress_init(xmp_progress_t *p, int total, int disable)
{
    p->enabled = !disable && isatty(STDERR_FILENO);
    p->total = total;
    p->t0 = xmp_now();
}

void xmp_progress_update(xmp_progress_t *p, int done, double loss, double tokens_per_s)
{
    if (!p->enabled)
        return;
    enum { W = 24 };
    char bar[W + 1];
    int fill = p->total > 0 ? (int)((long long)W * done / p->total) : W;
    for (int i = 0; i < W; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[W] = '\0';
    double el = xmp_now() - p->t0;
    double eta = done > 0 ? el / done * (p->total - done) : 0.0;
    int es = (int)(eta + 0.5);
    fprintf(stderr, "\r[%s] step %d/%d  loss %.4f  %.0f tok/s  ETA %d:%02d \033[K", bar, done,
            p->total, loss, tokens_per_s, es / 60, es % 60);
    fflush(stderr);
}

void xmp_progress_finish(xmp_progress_t *p)
{
    if (!p->enabled)
        return;
    fprintf(stderr, "\r\033[K");
    fflush(stderr);
}

/* ---- JSON ---- */

int xmp_json_open(xmp_json_t *j, const char *path)
{
    memset(j, 0, sizeof *j);
    j->f = fopen(path, "w");
    if (!j->f)
        return xmp_cli_error("--json '%s': cannot create: %s", path, strerror(errno));
    return 0;
}

static void jstring(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\')
            fprintf(f, "\\%c", *c);
        else if (*c < 0x20)
            fprintf(f, "\\u%04x", *c);
        else
            fputc(*c, f);
    }
    fputc('"', f);
}

/* separator, indentation and key for the next value */
static void jprefix(xmp_json_t *j, const char *key)
{
    if (j->depth > 0) {
        if (j->count[j->depth - 1]++ > 0)
            fputc(',', j->f);
        fputc('\n', j->f);
        for (int i = 0; i < j->depth; i++)
            fputs("  ", j->f);
    }
    if (key) {
        jstring(j->f, key);
        fputs(": ", j->f);
    }
}

static void jopen(xmp_json_t *j, const char *key, char c)
{
    jprefix(j, key);
    fputc(c, j->f);
    if (j->depth < XMP_JSON_MAX_DEPTH)
        j->count[j->depth] = 0;
    else
        j->err = 1;
    j->depth++;
}

static void jclose(xmp_json_t *j, char c)
{
    j->depth--;
    if (j->depth < XMP_JSON_MAX_DEPTH && j->count[j->depth] > 0) {
        fputc('\n', j->f);
        for (int i = 0; i < j->depth; i++)
            fputs("  ", j->f);
    }
    fputc(c, j->f);
    if (j->depth == 0)
        fputc('\n', j->f);
}

void xmp_json_obj_begin(xmp_json_t *j, const char *key)
{
    jopen(j, key, '{');
}

void xmp_json_obj_end(xmp_json_t *j)
{
    jclose(j, '}');
}

void xmp_json_arr_begin(xmp_json_t *j, const char *key)
{
    jopen(j, key, '[');
}

void xmp_json_arr_end(xmp_json_t *j)
{
    jclose(j, ']');
}

void xmp_json_int(xmp_json_t *j, const char *key, long long v)
{
    jprefix(j, key);
    fprintf(j->f, "%lld", v);
}

void xmp_json_num(xmp_json_t *j, const char *key, double v)
{
    jprefix(j, key);
    if (isfinite(v))
        fprintf(j->f, "%.9g", v);
    else
        fputs("null", j->f);
}

void xmp_json_f32(xmp_json_t *j, const char *key, float v)
{
    jprefix(j, key);
    if (isfinite(v))
        fprintf(j->f, "%.7g", (double)v);
    else
        fputs("null", j->f);
}

void xmp_json_str(xmp_json_t *j, const char *key, const char *v)
{
    jprefix(j, key);
    if (v)
        jstring(j->f, v);
    else
        fputs("null", j->f);
}

void xmp_json_bool(xmp_json_t *j, const char *key, int v)
{
    jprefix(j, key);
    fputs(v ? "true" : "false", j->f);
}

int xmp_json_close(xmp_json_t *j)
{
    if (!j->f)
        return 0;
    int bad = j->err || ferror(j->f) || j->depth != 0;
    if (fclose(j->f) != 0)
        bad = 1;
    j->f = NULL;
    return bad ? xmp_cli_error("--json: write failed or unbalanced document") : 0;
}

/* ---- statistics ---- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void xmp_stats(const double *v, size_t n, double *median, double *min, double *max)
{
    double *s = malloc(n * sizeof(double));
    if (!s) {
        *median = *min = *max = NAN;
        return;
    }
    memcpy(s, v, n * sizeof(double));
    qsort(s, n, sizeof(double), cmp_double);
    *min = s[0];
    *max = s[n - 1];
    *median = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
    free(s);
}

/* An optional per-stage array (v NULL: omitted), as whole numbers when whole. */
static void per_stage(xmp_json_t *j, const char *key, const double *v, int n, int whole)
{
    if (!v)
        return;
    xmp_json_arr_begin(j, key);
    for (int k = 0; k < n; k++) {
        if (whole)
            xmp_json_int(j, NULL, (long long)v[k]);
        else
            xmp_json_num(j, NULL, v[k]);
    }
    xmp_json_arr_end(j);
}

void xmp_json_step_pipeline(xmp_json_t *j, const xmp_step_pipe_t *p)
{
    xmp_json_num(j, "compute_s", p->compute_s);
    xmp_json_num(j, "boxing_s", p->boxing_s);
    xmp_json_int(j, "boxing_calls", (long long)p->boxing_calls);
    if (p->predicted_s > 0)
        xmp_json_num(j, "predicted_s", p->predicted_s);
    double bsum = 0;
    xmp_json_arr_begin(j, "bubble_per_stage");
    for (int k = 0; k < p->nstages; k++) {
        xmp_json_num(j, NULL, p->bubble[k]);
        bsum += p->bubble[k];
    }
    xmp_json_arr_end(j);
    xmp_json_num(j, "bubble", p->nstages ? bsum / p->nstages : 0);
    xmp_json_arr_begin(j, "peak_activation_bytes");
    for (int k = 0; k < p->nstages; k++)
        xmp_json_int(j, NULL, (long long)p->peak_bytes[k]);
    xmp_json_arr_end(j);
    xmp_json_arr_begin(j, "peak_activation_microbatches");
    for (int k = 0; k < p->nstages; k++)
        xmp_json_int(j, NULL, p->peak_mb[k]);
    xmp_json_arr_end(j);
    per_stage(j, "xmesh_cpu_s_per_stage", p->xmesh_cpu, p->nstages, 0);
    per_stage(j, "page_faults_per_stage", p->faults, p->nstages, 1);
    per_stage(j, "cpu_s_per_stage", p->cpu, p->nstages, 0);
    if (p->stage_f && p->stage_i && p->stage_w) {
        xmp_json_obj_begin(j, "stage_costs_s");
        per_stage(j, "f", p->stage_f, p->nstages, 0);
        per_stage(j, "i", p->stage_i, p->nstages, 0);
        per_stage(j, "w", p->stage_w, p->nstages, 0);
        xmp_json_obj_end(j);
    }
    if (p->host_cpu) {
        xmp_json_obj_begin(j, "host_cpu_s");
        xmp_json_num(j, "user", p->host_cpu->user);
        xmp_json_num(j, "system", p->host_cpu->system);
        xmp_json_num(j, "softirq", p->host_cpu->softirq);
        xmp_json_num(j, "idle", p->host_cpu->idle);
        xmp_json_num(j, "steal", p->host_cpu->steal);
        xmp_json_int(j, "cores", p->host_cpu->cores);
        xmp_json_arr_begin(j, "busy_per_core");
        for (int k = 0; k < p->host_cpu->cores && k < XMP_HOST_CPU_MAX; k++)
            xmp_json_num(j, NULL, p->host_cpu->core_busy[k]);
        xmp_json_arr_end(j);
        xmp_json_obj_end(j);
    }
}

int xmp_host_cpu_now(xmp_host_cpu_t *c)
{
    memset(c, 0, sizeof *c);
    FILE *f = fopen("/proc/stat", "r");
    if (!f)
        return -1;
    char line[512];
    unsigned long long v[8] = {0};
    int got = 0, cores = 0;
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "cpu ", 4))
            got = sscanf(line + 4, "%llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2],
                         &v[3], &v[4], &v[5], &v[6], &v[7]) >= 7;
        else if (!strncmp(line, "cpu", 3) && line[3] >= '0' && line[3] <= '9') {
            unsigned long long w[7] = {0};
            int id = -1;
            if (sscanf(line + 3, "%d %llu %llu %llu %llu %llu %llu %llu", &id, &w[0], &w[1], &w[2],
                       &w[3], &w[4], &w[5], &w[6]) == 8 &&
                id >= 0 && id < XMP_HOST_CPU_MAX)
                c->core_busy[id] = (double)(w[0] + w[1] + w[2] + w[5] + w[6]);
            cores++;
        }
    }
    fclose(f);
    long hz = sysconf(_SC_CLK_TCK);
    if (!got || cores == 0 || hz <= 0)
        return -1;
    /* user nice system idle iowait irq softirq steal */
    c->user = (double)(v[0] + v[1]) / (double)hz;
    c->system = (double)v[2] / (double)hz;
    c->idle = (double)(v[3] + v[4]) / (double)hz;
    c->softirq = (double)(v[5] + v[6]) / (double)hz;
    c->steal = (double)v[7] / (double)hz;
    c->cores = cores;
    for (int k = 0; k < XMP_HOST_CPU_MAX; k++)
        c->core_busy[k] /= (double)hz;
    return 0;
}

void xmp_host_cpu_delta(const xmp_host_cpu_t *a, const xmp_host_cpu_t *b, xmp_host_cpu_t *d)
{
    d->user = b->user - a->user;
    d->system = b->system - a->system;
    d->softirq = b->softirq - a->softirq;
    d->idle = b->idle - a->idle;
    d->steal = b->steal - a->steal;
    d->cores = b->cores;
    for (int k = 0; k < XMP_HOST_CPU_MAX; k++)
        d->core_busy[k] = b->core_busy[k] - a->core_busy[k];
}
