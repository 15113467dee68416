/*
 * Reusable pieces of xmesh-train's subcommands: flag value parsing with errors that name the
 * flag and the bad value, a wall clock, a terminal-only progress bar, a streaming JSON writer
 * and small statistics. Nothing here knows about a particular model.
 *
 * Error convention: parsers print "xmesh-train <cmd>: <flag> '<value>': <why>" to stderr and
 * return -1, leaving *out untouched; 0 on success.
 */
#ifndef XMP_APPS_CLI_UTIL_H
#define XMP_APPS_CLI_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Command name used in messages ("gpt", "tokenize", ...). */
void xmp_cli_set_command(const char *cmd);
/* Prints "xmesh-train <cmd>: <message>\n" to stderr; returns -1. */
int xmp_cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* For "--flag VALUE" at argv[*i]: returns argv[*i+1] and advances *i, or prints
 * "<flag>: missing value" and returns NULL. */
const char *xmp_cli_value(int argc, char **argv, int *i);
/* Integer in [lo, hi]. */
int xmp_cli_int(const char *flag, const char *s, long lo, long hi, int *out);
int xmp_cli_u64(const char *flag, const char *s, uint64_t *out);
/* Finite float in [lo, hi]. */
int xmp_cli_float(const char *flag, const char *s, double lo, double hi, float *out);

/* One "--flag VALUE" of a command's table: an integer in [lo, hi] into *ip, a finite float in
 * [flo, fhi] into *fp, or the string itself into *sp (one of the three set). */
typedef struct {
    const char *flag;
    int *ip;
    long lo, hi;
    float *fp;
    double flo, fhi;
    const char **sp;
} xmp_cli_flag_t;
/* argv[*i] against tab[0..n): 1 when it is one (its value parsed, *i advanced past it), 0 when
 * it is none, -1 on a missing or bad value (printed, as the parsers above). */
int xmp_cli_table(int argc, char **argv, int *i, const xmp_cli_flag_t *tab, size_t n);

/* Monotonic wall clock in seconds. */
double xmp_now(void);

/* Progress bar on stderr, drawn only when stderr is a terminal (isatty) and not disabled. */
typedef struct {
    int enabled;
    int total;
    double t0;
} xmp_progress_t;
void xmp_progress_init(xmp_progress_t *p, int total, int disable);
/* Redraws "[####....] step s/total loss L  N tok/s  ETA m:ss". */
void xmp_progress_update(xmp_progress_t *p, int done, double loss, double tokens_per_s);
/* Clears the bar line (call before printing the summary). */
void xmp_progress_finish(xmp_progress_t *p);

/* Streaming JSON writer. Usage: open; obj_begin(NULL); key_*(...); arr_begin("steps");
 * obj_begin(NULL) ... obj_end(); arr_end(); obj_end(); close. Non-finite numbers are written
 * as null. Errors (I/O) are sticky and reported by xmp_json_close. */
#define XMP_JSON_MAX_DEPTH 16
typedef struct {
    FILE *f;
    int depth;
    int count[XMP_JSON_MAX_DEPTH];
    int err;
} xmp_json_t;
int xmp_json_open(xmp_json_t *j, const char *path);
void xmp_json_obj_begin(xmp_json_t *j, const char *key);
void xmp_json_obj_end(xmp_json_t *j);
void xmp_json_arr_begin(xmp_json_t *j, const char *key);
void xmp_json_arr_end(xmp_json_t *j);
void xmp_json_int(xmp_json_t *j, const char *key, long long v);
void xmp_json_num(xmp_json_t *j, const char *key, double v);
/* An f32 value with the 7 significant digits a float holds (1e-4f prints as 0.0001). */
void xmp_json_f32(xmp_json_t *j, const char *key, float v);
void xmp_json_str(xmp_json_t *j, const char *key, const char *v);
void xmp_json_bool(xmp_json_t *j, const char *key, int v);
/* Flushes and closes; returns -1 (message printed) if any write failed. */
int xmp_json_close(xmp_json_t *j);

/* CPU time of the whole host (every core, every process, the kernel), core-seconds, from
 * /proc/stat (Linux; 10 ms ticks). On the emulated cluster every emulated host shares one
 * kernel, so this is the whole machine: what compute, transfers and the network emulation took
 * together, and what stayed idle. */
#define XMP_HOST_CPU_MAX 64
typedef struct {
    double user;    /* user + nice */
    double system;  /* system */
    double softirq; /* softirq + irq: the kernel's packet work lands here */
    double idle;    /* idle + iowait */
    double steal;   /* a virtual machine's: wanted to run, the hypervisor ran something else */
    int cores;      /* online CPUs */
    /* user + nice + system + irq + softirq of each of the first XMP_HOST_CPU_MAX cores (a step is
     * never shorter than the busiest core's busy seconds, whatever the other cores did) */
    double core_busy[XMP_HOST_CPU_MAX];
} xmp_host_cpu_t;
/* Reads the counters now; -1 where /proc/stat is not readable (then *c is zeroed). */
int xmp_host_cpu_now(xmp_host_cpu_t *c);
/* d = b - a (cores from b). */
void xmp_host_cpu_delta(const xmp_host_cpu_t *a, const xmp_host_cpu_t *b, xmp_host_cpu_t *d);

/* The pipeline figures of one step's JSON record, shared by the training commands so that
 * their step records carry the same fields. */
typedef struct {
    double compute_s;          /* rank 0: seconds in stage callbacks minus boxing */
    double boxing_s;           /* rank 0: seconds in SBP boxing collectives */
    double predicted_s;        /* simulator's prediction of the step (<= 0: none, omitted) */
    int nstages;               /* entries of the arrays below */
    const double *bubble;      /* per stage: idle fraction */
    const int *peak_mb;        /* per stage: peak microbatches with activations held */
    const int64_t *peak_bytes; /* per stage: peak activation bytes */
    const double *xmesh_cpu;   /* per stage (NULL: omitted): CPU seconds xmesh's progress and
                                * waits took on the stage's busiest rank in the step */
    const double *faults;      /* per stage (NULL: omitted): page faults of the step's driver
                                * run (getrusage ru_minflt + ru_majflt), the stage's largest */
    int64_t boxing_calls;      /* rank 0: nn/ collectives (boxing, SBP layers, reductions) */
    const double *cpu;         /* per stage (NULL: omitted): CPU seconds (user + system, every
                                * thread) of the step's driver run, the stage's largest */
    const double *stage_f;     /* per stage (NULL: omitted): measured seconds per microbatch of */
    const double *stage_i;     /* F, of I (or B) and of W (the stage's slowest rank): what */
    const double *stage_w;     /* the simulator takes as the stage costs */
    const xmp_host_cpu_t *host_cpu; /* NULL: omitted. CPU of the host rank 0 runs on during
                                     * the step (xmp_host_cpu_delta) */
} xmp_step_pipe_t;
/* Writes, into the current JSON object: compute_s, boxing_s, boxing_calls, predicted_s (when > 0),
 * bubble_per_stage, bubble (mean over stages), peak_activation_bytes,
 * peak_activation_microbatches, xmesh_cpu_s_per_stage, page_faults_per_stage, cpu_s_per_stage,
 * stage_costs_s {f, i, w: per stage} and host_cpu_s {user, system, softirq, idle, steal, cores,
 * busy_per_core} (when given). */
void xmp_json_step_pipeline(xmp_json_t *j, const xmp_step_pipe_t *p);

/* Median / min / max of n doubles (n >= 1; v is not modified). */
void xmp_stats(const double *v, size_t n, double *median, double *min, double *max);

#endif /* XMP_APPS_CLI_UTIL_H */
