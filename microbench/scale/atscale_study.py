#!/usr/bin/env python3
"""At-scale study (issue 13 item 5): stage-boundary tensors of GPT models and
U-Transformer skips between two stage meshes of H x 8 devices (H = 2..64, up
to 1,024 devices), on clusters of 1-8 NICs of 100-400 Gb/s per host, planned
and simulated with xmesh-plan for every strategy it models and every
scheduler. Pure model: no MPI, nothing is transferred.

Writes OUT/atscale.tsv (one row per case x cluster x strategy x scheduler),
OUT/atscale_summary.txt and gnuplot charts OUT/*.png.

usage: microbench/scale/atscale_study.py [--build DIR] [--out DIR] [--quick]
       [--time-limit S]   (default out: microbench/charts/results/scale)

Model sizes, micro-batch, latent size and the compute rate are choices of
this script (see docs/SCALE.md "At-scale study"); compute times are FLOP
estimates, not measurements.
"""
import argparse
import json
import os
import subprocess
import sys
import time

SEQ = 1024  # GPT sequence length (paper Table 1 / Table 3)
PER_DEVICE_BATCH = 2  # weak scaling: sequences (images) per device and micro-batch (Table 1: B = 2)
STRONG_BATCH = 128  # strong scaling: a fixed micro-batch (GPT batch 1024 in 8 micro-batches)
REGIMES = ["weak", "strong"]
DEV_PER_HOST = 8
INTRA_GBPS = 2400  # NVLink-class intra-host link (300 GB/s)
LATENCY_US = 5
EFF_FLOPS = 150e12  # per device: ~50 % of an A100's 312 TFLOP/s f16 (an assumption)

# GPT sizes as in the Alpa paper's GPT table (hidden, layers); "gpt3" is the
# GPT-3 layer of the AlpaComm paper's Table 1 (H = 12288, 96 layers).
GPT = [("gpt2.6B", 2560, 32), ("gpt6.7B", 4096, 32), ("gpt15B", 5120, 48),
       ("gpt3-175B", 12288, 96)]
# Stage-to-stage layouts over a (hosts, 8) mesh, batch first:
#   dp-tp: data parallel over hosts, tensor parallel (replicated activation) in a host
#   dp:    pure data parallel over all devices
#   dp-tp->dp: the two stages use different parallel configs
GPT_SPECS = [("dp-tp", "S0RR", "S0RR"), ("dp", "S01RR", "S01RR"),
             ("dp-tp->dp", "S0RR", "S01RR")]
# U-Transformer skips at a 64 x 64 latent (our choice: the paper trains on
# 32 x 32 images and gives no latent size), base channels C (paper: 320..672).
UT_C = [320, 672]
UT_RES = 64
UT_SPECS = [("dp-tp", "S0RRR", "S0RRR"), ("dp", "S01RRR", "S01RRR")]
HOSTS = [2, 4, 8, 16, 32, 64]
# (NICs per host, Gb/s per NIC)
CLUSTERS = [(1, 100), (2, 100), (4, 100), (8, 100), (1, 200), (4, 200), (8, 200), (1, 400),
            (4, 400), (8, 400)]
QUICK_HOSTS = [2, 32]
QUICK_CLUSTERS = [(1, 100), (8, 400)]
STRATEGIES = ["broadcast", "sendrecv", "sendrecv-allgather", "global-allgather"]


def gpt_layer_fwd_flops(h, tokens):
    # per layer: QKV/out/MLP matmuls 24 h^2 per token, attention scores 4 S h
    return tokens * (24.0 * h * h + 4.0 * SEQ * h)


def ut_skips(c, res):
    """(name, channels, side) of the tensors crossing a 2-stage split after
    the middle block: the four long skips and the main activation."""
    return [("s1", c, res), ("s2", 2 * c, res // 2), ("s3", 4 * c, res // 4),
            ("s4", 4 * c, res // 8), ("main", 4 * c, res // 8)]


def ut_stage1_fwd_flops(c, res, images):
    """Forward FLOPs of the down half (conv_in, down1..4, midA, midB) per
    micro-batch: 3x3 convolutions only (attention left out: a lower
    estimate)."""
    def conv(ci, co, side):
        return 2.0 * 9 * ci * co * side * side
    f = conv(4, c, res)
    chans = [c, 2 * c, 4 * c, 4 * c]
    cin, side = c, res
    for lvl, co in enumerate(chans):
        f += conv(cin, co, side) + conv(co, co, side)  # block(cin -> co)
        if lvl < 3:
            f += conv(co, co, side // 2)  # stride-2 conv
            side //= 2
        cin = co
    f += 2 * (conv(4 * c, 4 * c, side) * 2)  # midA, midB blocks
    return f * images


def run_plan(plan, args, timeout=120):
    try:
        p = subprocess.run([plan] + args + ["--json", "--max-tasks", "0"],
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "timeout"
    if p.returncode != 0:
        return None, (p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1]
    return json.loads(p.stdout), None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--out", default="microbench/charts/results/scale")
    ap.add_argument("--quick", action="store_true", help="2 mesh sizes, 2 clusters")
    ap.add_argument("--time-limit", type=float, default=540.0,
                    help="stop starting new runs after this many seconds")
    a = ap.parse_args()
    plan = os.path.join(a.build, "tools", "xmesh-plan")
    if not os.access(plan, os.X_OK):
        sys.exit("atscale_study: %s not built" % plan)
    os.makedirs(a.out, exist_ok=True)
    hosts = QUICK_HOSTS if a.quick else HOSTS
    clusters = QUICK_CLUSTERS if a.quick else CLUSTERS

    # (model, tensor, shape of (H, B), layout, src, dst, forward FLOPs of (B)):
    # GPT: one layer's forward; U-Transformer: the down half's forward
    cases = []
    for name, h, layers in GPT:
        for lab, ss, ds in GPT_SPECS:
            cases.append((name, "act", lambda B, h=h: [B, SEQ, h], lab, ss, ds,
                          lambda B, h=h: gpt_layer_fwd_flops(h, B * SEQ)))
    for c in UT_C:
        for tname, ch, side in ut_skips(c, UT_RES):
            for lab, ss, ds in UT_SPECS:
                cases.append(("ut-C%d" % c, tname, lambda B, ch=ch, side=side: [B, ch, side, side],
                              lab, ss, ds, lambda B, c=c: ut_stage1_fwd_flops(c, UT_RES, B)))

    tsv = open(os.path.join(a.out, "atscale.tsv"), "w")
    cols = ["regime", "model", "tensor", "shape", "bytes", "layout", "src_spec", "dst_spec",
            "hosts_per_mesh",
            "devices", "nics", "gbps", "strategy", "scheduler", "unit_tasks", "lower_bound_s",
            "makespan_s", "ratio", "plan_ms", "decompose_ms", "stage_fwd_s_per_unit"]
    tsv.write("\t".join(cols) + "\n")
    unsupported = {}
    t_start = time.time()
    nruns = 0
    stopped = False
    for regime, (model, tensor, shape_of, lab, ss, ds, flops_of), H in (
            (g, c, h) for g in REGIMES for c in cases for h in hosts):
        B = PER_DEVICE_BATCH * DEV_PER_HOST * H if regime == "weak" else STRONG_BATCH
        shape = shape_of(B)
        nbytes = 2
        for x in shape:
            nbytes *= x
        # compute per device (the stage's 8H devices share the
        # micro-batch): GPT one layer's forward, U-Transformer the whole
        # down half's forward
        unit_fwd = flops_of(B) / (DEV_PER_HOST * H) / EFF_FLOPS
        for nics, gbps in clusters:
            for strat in STRATEGIES:
                if strat in unsupported:
                    continue
                if time.time() - t_start > a.time_limit:
                    stopped = True
                    break
                base = ["--shape", ",".join(map(str, shape)), "--dtype", "f16",
                        "--src-mesh", "%dx%d" % (H, DEV_PER_HOST), "--src-spec", ss,
                        "--dst-mesh", "%dx%d" % (H, DEV_PER_HOST), "--dst-spec", ds,
                        "--nic-gbps", str(gbps), "--nics-per-host", str(nics),
                        "--intra-gbps", str(INTRA_GBPS), "--latency-us", str(LATENCY_US),
                        "--strategy", strat]
                d, err = run_plan(plan, base + ["--scheduler", "all"])
                nruns += 1
                if d is None:
                    if "strategy" in err:
                        unsupported[strat] = err
                        continue
                    print("atscale_study: %s %s %s H=%d: %s" % (model, tensor, lab, H, err),
                          file=sys.stderr)
                    continue
                rows = [(r["scheduler"], d["unit_tasks"], r) for r in d["results"]]
                if strat == "broadcast":
                    # what plan creation does on small instances: the
                    # ensemble on split tasks when that is faster
                    s, err = run_plan(plan, base + ["--scheduler", "ensemble", "--split"])
                    nruns += 1
                    if s is not None:
                        rows.append(("ensemble+split", s["unit_tasks"], s))
                for sched, ntasks, r in rows:
                    lb = d["lower_bound_s"]  # the unsplit bound for every row
                    tsv.write("\t".join(str(v) for v in [
                        regime, model, tensor, "x".join(map(str, shape)), nbytes, lab, ss, ds, H,
                        2 * H * DEV_PER_HOST, nics, gbps, strat, sched, ntasks,
                        "%.6g" % lb, "%.6g" % r["makespan_s"],
                        "%.4f" % (r["makespan_s"] / lb if lb > 0 else 1.0),
                        "%.4g" % r["plan_ms"], "%.4g" % d.get("decompose_ms", 0.0),
                        "%.6g" % unit_fwd]) + "\n")
            if stopped:
                break
        if stopped:
            break
    tsv.close()
    elapsed = time.time() - t_start
    with open(os.path.join(a.out, "atscale_meta.txt"), "w") as f:
        f.write("runs %d, %.0f s, %s, load %s, stopped early: %s\n" % (
            nruns, elapsed, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            open("/proc/loadavg").read().split()[0], stopped))
        for s, e in unsupported.items():
            f.write("strategy %s not planned: %s\n" % (s, e))
    print("atscale_study: %d xmesh-plan runs in %.0f s%s" % (
        nruns, elapsed, " (time limit hit)" if stopped else ""))
    summarise(a.out)


def load(out):
    rows = []
    with open(os.path.join(out, "atscale.tsv")) as f:
        head = f.readline().rstrip("\n").split("\t")
        for line in f:
            v = dict(zip(head, line.rstrip("\n").split("\t")))
            for k in ("bytes", "hosts_per_mesh", "devices", "nics", "gbps", "unit_tasks"):
                v[k] = int(v[k])
            for k in ("lower_bound_s", "makespan_s", "ratio", "plan_ms", "decompose_ms",
                      "stage_fwd_s_per_unit"):
                v[k] = float(v[k])
            rows.append(v)
    return rows


def gnuplot(script):
    try:
        subprocess.run(["gnuplot"], input=script, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        print("atscale_study: gnuplot failed: %s" % e, file=sys.stderr)


def summarise(out):
    rows = load(out)
    summ = open(os.path.join(out, "atscale_summary.txt"), "w")

    def p(*x):
        print(*x, file=summ)

    # 1. ratio makespan / bound per strategy x scheduler
    p("# ratio makespan / lower bound over all cases and clusters")
    p("%-10s %-15s %6s %8s %8s %8s" % ("strategy", "scheduler", "n", "median", "max", "<=1.05"))
    keys = sorted({(r["strategy"], r["scheduler"]) for r in rows})
    for st, sc in keys:
        v = sorted(r["ratio"] for r in rows if r["strategy"] == st and r["scheduler"] == sc)
        p("%-10s %-15s %6d %8.3f %8.3f %8d" % (st, sc, len(v), v[len(v) // 2], v[-1],
                                              sum(x <= 1.05 for x in v)))
    # 2. planning time vs unit tasks
    p("\n# ensemble plan_ms (wall, loaded machine) by unit tasks")
    byn = {}
    for r in rows:
        if r["scheduler"] == "ensemble":
            byn.setdefault(r["unit_tasks"], []).append(r["plan_ms"] + r["decompose_ms"])
    for n in sorted(byn):
        v = sorted(byn[n])
        p("unit_tasks %6d: decompose+schedule median %.3f ms, max %.3f ms (%d runs)" % (
            n, v[len(v) // 2], v[-1], len(v)))
    # 3. strategy comparison: broadcast ensemble vs sendrecv ensemble
    p("\n# sendrecv / broadcast makespan (ensemble), per layout and cluster (median over models, H,"
      " regimes)")
    cmp = {}
    for r in rows:
        if r["scheduler"] != "ensemble":
            continue
        k = (r["regime"], r["model"], r["tensor"], r["layout"], r["hosts_per_mesh"], r["nics"],
             r["gbps"])
        cmp.setdefault(k, {})[r["strategy"]] = r["makespan_s"]
    agg = {}
    for k, v in cmp.items():
        if "broadcast" in v and "sendrecv" in v:
            agg.setdefault((k[3], k[5], k[6]), []).append(v["sendrecv"] / v["broadcast"])
    for k in sorted(agg):
        v = sorted(agg[k])
        p("layout %-10s %d NIC x %3d Gb/s: median %.2f, min %.2f, max %.2f" % (
            k[0], k[1], k[2], v[len(v) // 2], v[0], v[-1]))
    # 4. transfer vs compute (pipeline ablation estimate)
    p("\n# transfer per boundary (broadcast, ensemble+split) vs compute estimate")
    p("# GPT: layers of forward compute that hide one boundary transfer (forward pass)")
    best = {}
    for r in rows:
        if r["strategy"] != "broadcast" or r["scheduler"] not in ("ensemble", "ensemble+split"):
            continue
        k = (r["regime"], r["model"], r["tensor"], r["layout"], r["hosts_per_mesh"], r["nics"],
             r["gbps"])
        if k not in best or r["makespan_s"] < best[k]["makespan_s"]:
            best[k] = r
    for k in sorted(best):
        r = best[k]
        if not r["model"].startswith("gpt"):
            continue
        p("%-6s %-10s %-10s H=%2d %d NIC x %3d Gb/s: transfer %.3f ms, one layer fwd %.3f ms -> "
          "%.2f layers" % (r["regime"], r["model"], r["layout"], r["hosts_per_mesh"], r["nics"],
                           r["gbps"],
                           r["makespan_s"] * 1e3, r["stage_fwd_s_per_unit"] * 1e3,
                           r["makespan_s"] / r["stage_fwd_s_per_unit"]))
    p("# U-Transformer: all tensors crossing a 2-stage split (sum of per-tensor plans) vs the"
      " down half's forward (convs only)")
    ut = {}
    for k, r in best.items():
        if r["model"].startswith("ut"):
            kk = (r["regime"], r["model"], r["layout"], r["hosts_per_mesh"], r["nics"], r["gbps"])
            e = ut.setdefault(kk, [0.0, r["stage_fwd_s_per_unit"]])
            e[0] += r["makespan_s"]
    for k in sorted(ut):
        t, c = ut[k]
        p("%-6s %-8s %-6s H=%2d %d NIC x %3d Gb/s: transfer %.3f ms, stage fwd %.3f ms, ratio %.2f" % (
            k[0], k[1], k[2], k[3], k[4], k[5], t * 1e3, c * 1e3, t / c))
    summ.close()
    print(open(os.path.join(out, "atscale_summary.txt")).read())
    charts(out, rows, best, ut)


def charts(out, rows, best, ut):
    # A. GPT-15B boundary transfer at the largest mesh pair, per cluster:
    # per-host bytes do not change with H here (weak scaling), the host's
    # NICs and how many of them one task can use do.
    dat = os.path.join(out, "atscale_gpt15B.dat")
    hmax = max(r["hosts_per_mesh"] for r in rows)
    cl = sorted({(r["nics"], r["gbps"]) for r in rows}, key=lambda c: (c[0] * c[1], c[0]))
    series = [(lab, st, sc) for lab in ("dp-tp", "dp-tp->dp")
              for st, sc in (("broadcast", "ensemble"), ("broadcast", "ensemble+split"),
                             ("sendrecv", "ensemble"))]
    with open(dat, "w") as f:
        f.write("cluster\t" + "\t".join("%s %s %s" % x for x in series) + "\n")
        for nics, gbps in cl:
            vals = []
            for lab, st, sc in series:
                v = [r["makespan_s"] * 1e3 for r in rows
                     if r["regime"] == "weak" and r["model"] == "gpt15B" and r["layout"] == lab and
                     r["nics"] == nics and
                     r["gbps"] == gbps and r["strategy"] == st and r["scheduler"] == sc and
                     r["hosts_per_mesh"] == hmax]
                vals.append("%.6g" % v[0] if v else "NaN")
            f.write("%dx%d\t%s\n" % (nics, gbps, "\t".join(vals)))
    gnuplot("""set terminal pngcairo size 1000,560 font ",10" noenhanced
set output "%s/atscale_gpt15B.png"
set title "GPT-15B stage boundary between two %d x 8 meshes (%d x 1024 x 5120 f16, weak scaling): simulated transfer"
set xlabel "NICs per host x Gb/s per NIC"
set ylabel "ms per boundary (model)"
set logscale y
set datafile separator "\\t"
set datafile missing "NaN"
set key outside right top
set grid
plot for [i=2:%d] "%s" using i:xtic(1) with linespoints lw 2 pt 7 title columnhead(i)
""" % (out, hmax, PER_DEVICE_BATCH * DEV_PER_HOST * hmax, len(series) + 1, dat))
    # B. ratio per scheduler (broadcast) as box-ish: median and max
    dat = os.path.join(out, "atscale_ratio.dat")
    scheds = ["naive", "lb", "dfs", "greedy", "ensemble", "ensemble+split"]
    with open(dat, "w") as f:
        f.write("scheduler\tbroadcast median\tbroadcast max\tsendrecv median\tsendrecv max\n")
        for sc in scheds:
            vals = []
            for st in ("broadcast", "sendrecv"):
                v = sorted(r["ratio"] for r in rows if r["strategy"] == st and r["scheduler"] == sc)
                vals += [v[len(v) // 2], v[-1]] if v else ["NaN", "NaN"]
            f.write(sc + "\t" + "\t".join(str(x) for x in vals) + "\n")
    gnuplot("""set terminal pngcairo size 900,500 font ",11" noenhanced
set output "%s/atscale_ratio.png"
set title "makespan / lower bound over all at-scale cases (model)"
set style data histogram
set style histogram cluster gap 1
set style fill solid 0.8 border -1
set datafile separator "\\t"
set datafile missing "NaN"
set logscale y
set yrange [0.9:*]
set grid ytics
set key outside right top
plot "%s" using 2:xtic(1) title columnhead(2), "" using 3 title columnhead(3), \\
     "" using 4 title columnhead(4), "" using 5 title columnhead(5)
""" % (out, dat))
    # C. planning time vs unit tasks
    dat = os.path.join(out, "atscale_plantime.dat")
    with open(dat, "w") as f:
        for r in rows:
            if r["scheduler"] in ("ensemble", "ensemble+split"):
                f.write("%d %.6g %s\n" % (r["unit_tasks"], r["plan_ms"] + r["decompose_ms"],
                                          r["scheduler"]))
    gnuplot("""set terminal pngcairo size 800,500 font ",11" noenhanced
set output "%s/atscale_plantime.png"
set title "plan creation (decompose + ensemble), loaded 2-core machine"
set xlabel "unit tasks (after splitting)"
set ylabel "ms"
set logscale xy
set grid
plot "%s" using 1:(strcol(3) eq "ensemble" ? $2 : 1/0) with points pt 7 ps 0.6 title "ensemble", \\
     "" using 1:(strcol(3) eq "ensemble+split" ? $2 : 1/0) with points pt 6 ps 0.8 title "ensemble + split", \\
     20 with lines dashtype 2 title "20 ms search budget"
""" % (out, dat))
    # D. transfer / compute: GPT layers to hide one boundary, per model and cluster (H = 64)
    dat = os.path.join(out, "atscale_hide.dat")
    cl = sorted({(k[5], k[6]) for k in best}, key=lambda c: (c[0] * c[1], c[0]))
    cl = [c for c in cl if c in ((1, 100), (8, 100), (1, 400), (8, 400))] or cl
    with open(dat, "w") as f:
        f.write("case\t" + "\t".join("%d NIC x %d Gb/s" % c for c in cl) + "\n")
        hmax = max(k[4] for k in best)
        for model, _, _ in GPT:
            for lab, _, _ in GPT_SPECS:
                vals = []
                for c in cl:
                    r = best.get(("weak", model, "act", lab, hmax, c[0], c[1]))
                    vals.append("%.4g" % (r["makespan_s"] / r["stage_fwd_s_per_unit"]) if r
                                else "NaN")
                f.write("%s %s\t%s\n" % (model, lab, "\t".join(vals)))
        for k in sorted({(k[1], k[2]) for k in ut}):
            vals = []
            for c in cl:
                e = ut.get(("weak", k[0], k[1], hmax, c[0], c[1]))
                vals.append("%.4g" % (e[0] / e[1]) if e else "NaN")
            f.write("%s %s (vs stage)\t%s\n" % (k[0], k[1], "\t".join(vals)))
    gnuplot("""set terminal pngcairo size 1100,560 font ",10" noenhanced
set output "%s/atscale_hide.png"
set title "weak scaling, 1,024 devices: boundary transfer / forward compute (estimates; see docs/SCALE.md)"
set style data histogram
set style histogram cluster gap 1
set style fill solid 0.8 border -1
set datafile separator "\\t"
set datafile missing "NaN"
set logscale y
set grid ytics
set xtics rotate by -35
set key outside right top
plot for [i=2:%d] "%s" using i:xtic(1) title columnhead(i)
""" % (out, len(cl) + 1, dat))

    # E. strong scaling: a fixed micro-batch over growing stage meshes
    dat = os.path.join(out, "atscale_strong.dat")
    sel = [(1, 100), (8, 400)]
    with open(dat, "w") as f:
        head = ["devices"]
        for model in ("gpt15B", "ut-C672"):
            for c in sel:
                head.append("%s transfer %dx%d" % (model, c[0], c[1]))
            head.append("%s compute (%s, estimate)" % (
                model, "1 layer fwd" if model.startswith("gpt") else "down-half fwd, convs"))
        f.write("\t".join(head) + "\n")
        for H in sorted({k[4] for k in best}):
            vals = []
            for model in ("gpt15B", "ut-C672"):
                comp = "NaN"
                for c in sel:
                    if model.startswith("gpt"):
                        r = best.get(("strong", model, "act", "dp-tp", H, c[0], c[1]))
                        vals.append("%.6g" % (r["makespan_s"] * 1e3) if r else "NaN")
                        if r:
                            comp = "%.6g" % (r["stage_fwd_s_per_unit"] * 1e3)
                    else:
                        e = ut.get(("strong", model, "dp-tp", H, c[0], c[1]))
                        vals.append("%.6g" % (e[0] * 1e3) if e else "NaN")
                        if e:
                            comp = "%.6g" % (e[1] * 1e3)
                vals.append(comp)
            f.write("%d\t%s\n" % (2 * H * DEV_PER_HOST, "\t".join(vals)))
    gnuplot("""set terminal pngcairo size 1000,560 font ",10" noenhanced
set output "%s/atscale_strong.png"
set title "strong scaling (micro-batch %d, dp over hosts, tp 8 in a host): transfer per boundary vs forward compute (estimate)"
set xlabel "devices in both stage meshes (8 per host)"
set ylabel "ms"
set logscale xy
set datafile separator "\\t"
set datafile missing "NaN"
set key outside right top
set grid
plot "%s" using 1:2 with linespoints lw 2 lc 1 title columnhead(2), \\
     "" using 1:3 with linespoints lw 2 lc 2 title columnhead(3), \\
     "" using 1:4 with lines lw 2 lc 3 dashtype 2 title columnhead(4), \\
     "" using 1:5 with linespoints lw 2 lc 4 title columnhead(5), \\
     "" using 1:6 with linespoints lw 2 lc 6 title columnhead(6), \\
     "" using 1:7 with lines lw 2 lc 7 dashtype 2 title columnhead(7)
""" % (out, STRONG_BATCH, dat))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--summarise-only":
        summarise(sys.argv[2] if len(sys.argv) > 2 else "microbench/charts/results/scale")
    else:
        main()
