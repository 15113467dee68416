/* `xmesh-train schedule`: one pipeline schedule simulated with given stage and transfer costs
 * (no MPI, no model): the step the schedule itself allows. The same generator and options as the
 * trainer (with --delay-wgrad the re-plan's: pipe/replan.h), the same simulator (sched/). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"
#include "commands.h"
#include "models/stage_layout.h"
#include "pipe/replan.h"
#include "sched/schedule.h"

static void schedule_usage(void)
{
    printf(
        "usage: xmesh-train schedule --schedule NAME --stages S --microbatches M\n"
        "         --f LIST --i LIST --w LIST [--xfer LIST] [--edges E] [--delay-wgrad]\n"
        "         [--blocking] [--own-links] [--render] [--json FILE]\n"
        "  Simulates one step of the schedule (gpipe, 1f1b, eager-1f1b; one stage per rank\n"
        "  group) with the given costs and prints the step seconds and each stage's bubble.\n"
        "  --f/--i/--w  seconds per microbatch of each stage's forward, input-gradient and\n"
        "               weight-gradient work (a whole backward costs i + w): S comma-separated\n"
        "               values, or one for every stage (xmesh-train's step JSON stage_costs_s)\n"
        "  --xfer       seconds of one transfer of each plan, in plan order (edge 0 activation,\n"
        "               edge 0 gradient, edge 1 activation, ...), or one for every plan\n"
        "               (default 0; the step JSON's pipeline.plan_predicted_s)\n"
        "  --edges      the stage graph, 'src>dst' comma-separated (default the chain\n"
        "               0>1>...>S-1; the step JSON's pipeline.edges)\n"
        "  --delay-wgrad  W delayed and placed as xmesh-train places it after its first step\n"
        "               (the stages' mean costs, the activation transfers' mean time)\n"
        "  --blocking   receivers post each transfer at its wait (xmesh-train --comm blocking)\n"
        "  --own-links  every plan its own link; by default the transfers out of a stage share\n"
        "               its NICs (one at a time) and so do those into it, as in xmesh-train\n"
        "  --render     the simulated timeline as text\n"
        "  --json FILE  {schedule, stages, microbatches, step_s, bubble_per_stage,\n"
        "               busy_s_per_stage}\n");
}

/* n comma-separated seconds >= 0 into v, or one value copied n times. */
static int cost_list(const char *flag, const char *s, int n, double *v)
{
    int k = 0;
    const char *p = s;
    while (*p) {
        char *end;
        double x = strtod(p, &end);
        if (end == p || (*end && *end != ',') || !(x >= 0) || x > 1e6) {
            xmp_cli_error("%s '%s': entry %d is not a number of seconds in [0, 1e6]", flag, s,
                          k + 1);
            return -1;
        }
        if (k == n) {
            xmp_cli_error("%s '%s': more than the %d values expected", flag, s, n);
            return -1;
        }
        v[k++] = x;
        p = *end ? end + 1 : end;
    }
    if (k == 1)
        for (int j = 1; j < n; j++)
            v[j] = v[0];
    else if (k != n) {
        xmp_cli_error("%s '%s': %d values, expected %d (or one for all)", flag, s, k, n);
        return -1;
    }
    return 0;
}

static int edge_list(const char *s, int S, xmp_sedge_t *e, int cap, int *n)
{
    int k = 0;
    const char *p = s;
    while (*p) {
        int a, b, used = 0;
        if (sscanf(p, "%d>%d%n", &a, &b, &used) != 2 || (p[used] && p[used] != ',') || a < 0 ||
            b < 0 || a >= S || b >= S || a == b) {
            xmp_cli_error("--edges '%s': entry %d is not 'src>dst' with two different stages "
                          "in 0..%d",
                          s, k + 1, S - 1);
            return -1;
        }
        if (k == cap) {
            xmp_cli_error("--edges '%s': more than %d edges", s, cap);
            return -1;
        }
        e[k].src = a;
        e[k].dst = b;
        k++;
        p += used + (p[used] == ',');
    }
    if (k == 0) {
        xmp_cli_error("--edges '%s': no edge", s);
        return -1;
    }
    *n = k;
    return 0;
}

#define MAX_EDGES (4 * XMP_MAX_STAGES)

int xmp_cmd_schedule(int argc, char **argv)
{
    xmp_cli_set_command("schedule");
    const char *name = NULL, *fs = NULL, *is = NULL, *ws = NULL, *xs = NULL, *es = NULL,
               *json = NULL;
    int S = 0, M = 0, delay = 0, blocking = 0, render = 0, own_links = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            schedule_usage();
            return 0;
        } else if (!strcmp(a, "--delay-wgrad")) {
            delay = 1;
        } else if (!strcmp(a, "--blocking")) {
            blocking = 1;
        } else if (!strcmp(a, "--render")) {
            render = 1;
        } else if (!strcmp(a, "--own-links")) {
            own_links = 1;
        } else if (!strcmp(a, "--schedule") || !strcmp(a, "--stages") ||
                   !strcmp(a, "--microbatches") || !strcmp(a, "--f") || !strcmp(a, "--i") ||
                   !strcmp(a, "--w") || !strcmp(a, "--xfer") || !strcmp(a, "--edges") ||
                   !strcmp(a, "--json")) {
            if (!(v = xmp_cli_value(argc, argv, &i)))
                return 2;
            if (!strcmp(a, "--schedule"))
                name = v;
            else if (!strcmp(a, "--stages")) {
                if (xmp_cli_int(a, v, 1, XMP_MAX_STAGES, &S) != 0)
                    return 2;
            } else if (!strcmp(a, "--microbatches")) {
                if (xmp_cli_int(a, v, 1, 100000, &M) != 0)
                    return 2;
            } else if (!strcmp(a, "--f"))
                fs = v;
            else if (!strcmp(a, "--i"))
                is = v;
            else if (!strcmp(a, "--w"))
                ws = v;
            else if (!strcmp(a, "--xfer"))
                xs = v;
            else if (!strcmp(a, "--edges"))
                es = v;
            else
                json = v;
        } else {
            xmp_cli_error("unknown flag '%s' (see --help)", a);
            return 2;
        }
    }
    if (!name || !S || !M || !fs || !is || !ws) {
        xmp_cli_error("--schedule, --stages, --microbatches, --f, --i and --w are required "
                      "(see --help)");
        return 2;
    }
    int kind = xmp_sched_kind_parse(name);
    if (kind < 0 || xmp_sched_kind_virtual(kind)) {
        xmp_cli_error("--schedule '%s': %s", name,
                      kind < 0 ? "unknown (gpipe, 1f1b, eager-1f1b)"
                               : "places several stages on a rank group; this command simulates "
                                 "one stage per group (gpipe, 1f1b, eager-1f1b)");
        return 2;
    }
    xmp_sedge_t edges[MAX_EDGES];
    int ne = 0;
    if (es) {
        if (edge_list(es, S, edges, MAX_EDGES, &ne) != 0)
            return 2;
    } else {
        ne = xmp_sched_chain_edges(S, edges);
    }
    double f[XMP_MAX_STAGES], fi[XMP_MAX_STAGES], fw[XMP_MAX_STAGES], x[2 * MAX_EDGES] = {0};
    if (cost_list("--f", fs, S, f) || cost_list("--i", is, S, fi) || cost_list("--w", ws, S, fw))
        return 2;
    if (xs && ne == 0) {
        xmp_cli_error("--xfer '%s': the stage graph has no edge (--stages 1)", xs);
        return 2;
    }
    if (xs && cost_list("--xfer", xs, 2 * ne, x))
        return 2;
    /* the trainer's options: unit costs without the delay, the re-plan's with it */
    xmp_gen_opts_t go;
    memset(&go, 0, sizeof go);
    go.max_pending_w = S;
    if (delay) {
        double act = 0;
        for (int e = 0; e < ne; e++)
            act += x[xmp_plan_index(e, XMP_DIR_ACT)] / ne;
        xmp_replan_t rp;
        memset(&rp, 0, sizeof rp);
        rp.f = f;
        rp.i = fi;
        rp.w = fw;
        rp.xfer = act;
        xmp_pipe_replan_opts(&rp, S, &go);
    }
    char err[1024];
    xmp_schedule_t *sched = NULL;
    if (xmp_sched_generate(kind, S, M, ne, edges, &go, &sched, err, sizeof err) != 0) {
        xmp_cli_error("%s", err);
        return 2;
    }
    xmp_sim_costs_t sc;
    memset(&sc, 0, sizeof sc);
    sc.f = f;
    sc.i = fi;
    sc.w = fw;
    sc.xfer = x;
    sc.late_recv = blocking;
    sc.share_nic = !own_links;
    xmp_sim_result_t res;
    memset(&res, 0, sizeof res);
    int rc = 1;
    int sr = xmp_sim_run(sched, &sc, &res, err, sizeof err);
    if (sr < 0) {
        xmp_cli_error("%s", err);
        goto out;
    }
    if (sr == 1) {
        xmp_cli_error("the schedule deadlocks in the simulator: %s", res.msg);
        goto out;
    }
    if (json) {
        xmp_json_t j;
        if (xmp_json_open(&j, json) != 0)
            goto out;
        xmp_json_obj_begin(&j, NULL);
        xmp_json_str(&j, "schedule", xmp_sched_kind_name(kind));
        xmp_json_bool(&j, "delay_wgrad", delay);
        xmp_json_bool(&j, "blocking", blocking);
        xmp_json_int(&j, "stages", S);
        xmp_json_int(&j, "microbatches", M);
        xmp_json_num(&j, "step_s", res.step_s);
        xmp_json_arr_begin(&j, "bubble_per_stage");
        for (int g = 0; g < res.nstages; g++)
            xmp_json_num(&j, NULL, res.bubble[g]);
        xmp_json_arr_end(&j);
        xmp_json_arr_begin(&j, "busy_s_per_stage");
        for (int g = 0; g < res.nstages; g++)
            xmp_json_num(&j, NULL, res.busy_s[g]);
        xmp_json_arr_end(&j);
        xmp_json_obj_end(&j);
        if (xmp_json_close(&j) != 0)
            goto out;
    }
    printf("schedule %s%s%s S=%d M=%d: step %.6f s, bubble", xmp_sched_kind_name(kind),
           delay ? "+dw" : "", blocking ? " (blocking)" : "", S, M, res.step_s);
    for (int g = 0; g < res.nstages; g++)
        printf(" %.3f", res.bubble[g]);
    printf("\n");
    if (render)
        xmp_sim_render(sched, &res, 100, stdout);
    rc = 0;
out:
    xmp_sim_result_free(&res);
    xmp_sched_destroy(sched);
    return rc;
}
