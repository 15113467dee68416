#!/usr/bin/env python3
"""Pipeline overlap ablation (paper 002 Fig. 9) for xmesh-train.

Runs one xmesh-train configuration under several communication variants and
microbatch counts, and reports throughput, the fraction of the `signal` bound,
predicted versus measured step time and peak activation memory per stage.

Rows (same model, stages, meshes and batch in every row):
  blocking      1F1B, each boundary receive started only when needed and
                waited at once (no overlap of a transfer with compute)
  1f1b          1F1B, transfers started when the data exists, waited when
                needed (overlap without extra warm-up)
  eager         eager-1F1B (warm-up 2(S-i)-1 forwards)
  eager+wdelay  eager-1F1B with the weight-gradient part of the backward
                delayed behind the gradient send (--delay-wgrad)
  signal        eager-1F1B + wdelay with every boundary tensor replaced by a
                1-byte message: same dependencies, no data (upper bound)

Each run does `--steps` steps; the first `--warmup` are dropped; figures are
the median step time over the rest with min and max. Throughput = tokens (GPT)
or images (U-Transformer) per step / median step time. "of signal" = row
throughput / signal throughput at the same microbatch count.

Two bounds per row (a third table), from the step records: the schedule ceiling (the row's
schedule simulated by `xmesh-train schedule` with the signal row's stage costs and xmesh's
predicted transfer times, over signal simulated without transfer time) and the CPU ceiling
(signal's step over the busy seconds of the host's busiest core in the row's step), with the
host's CPU per step above signal's (user / system / softirq).

Launch: inside microbench/cluster/cluster.sh, $XMH_MPIRUN and $XMH_NP are used;
otherwise `mpirun --oversubscribe -np NP`.
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile

ROWS = [
    ("blocking", ["--schedule", "1f1b", "--comm", "blocking"]),
    ("1f1b", ["--schedule", "1f1b", "--comm", "broadcast"]),
    ("eager", ["--schedule", "eager-1f1b", "--comm", "broadcast"]),
    ("eager+wdelay", ["--schedule", "eager-1f1b", "--delay-wgrad", "--comm", "broadcast"]),
    ("signal", ["--schedule", "eager-1f1b", "--delay-wgrad", "--comm", "signal"]),
]


def first_key(d, keys, default=None):
    for k in keys:
        if isinstance(d, dict) and k in d and d[k] is not None:
            return d[k]
    return default


def summarize(doc, warmup, per_step_units):
    steps = doc.get("steps", [])
    use = steps[warmup:] if len(steps) > warmup else steps
    if not use:
        raise RuntimeError("no step records")
    t = [s["step_seconds"] for s in use]
    out = {
        "steps_used": len(use),
        "step_s_median": statistics.median(t),
        "step_s_min": min(t),
        "step_s_max": max(t),
    }
    out["throughput"] = per_step_units / out["step_s_median"]
    out["throughput_min"] = per_step_units / out["step_s_max"]
    out["throughput_max"] = per_step_units / out["step_s_min"]
    pred = [first_key(s, ["predicted_s", "predicted_step_s", "predicted_seconds"]) for s in use]
    pred = [p for p in pred if isinstance(p, (int, float)) and p > 0]
    if pred:
        out["predicted_s"] = statistics.median(pred)
        out["predicted_over_measured"] = out["predicted_s"] / out["step_s_median"]
    bub = [first_key(s, ["bubble", "bubble_fraction", "measured_bubble"]) for s in use]
    bub = [b for b in bub if isinstance(b, (int, float))]
    if bub:
        out["bubble"] = statistics.median(bub)
    # per stage: busy (compute) and idle seconds of the step, from its bubble
    # fraction (idle share of the stage's local step time)
    bps = [s.get("bubble_per_stage") for s in use]
    if bps and all(isinstance(b, list) and b for b in bps):
        ns = len(bps[0])
        busy = [statistics.median((1 - s["bubble_per_stage"][k]) * s["step_seconds"] for s in use)
                for k in range(ns)]
        out["stage_busy_s"] = busy
        out["busiest_stage"] = max(range(ns), key=lambda k: busy[k])
    # per stage: CPU seconds xmesh's progress thread and waits took (xmesh_ctx_get_stats)
    xc = [s.get("xmesh_cpu_s_per_stage") for s in use]
    if xc and all(isinstance(c, list) and c for c in xc):
        out["stage_xmesh_cpu_s"] = [statistics.median(c[k] for c in xc) for k in range(len(xc[0]))]
    # per stage: measured seconds per microbatch of F, I, W (the simulator's stage costs)
    sc = [s.get("stage_costs_s") for s in use]
    if sc and all(isinstance(c, dict) and c.get("f") for c in sc):
        out["stage_costs_s"] = {k: [statistics.median(c[k][j] for c in sc)
                                    for j in range(len(sc[0][k]))] for k in "fiw"}
    # the host's CPU during the step (rank 0's host: the whole machine on the emulated cluster)
    hc = [s.get("host_cpu_s") for s in use]
    if hc and all(isinstance(h, dict) and h.get("cores") for h in hc):
        out["host_cpu_s"] = {k: statistics.median(h[k] for h in hc)
                             for k in ("user", "system", "softirq", "idle")}
        out["host_cpu_s"]["busy"] = statistics.median(h["user"] + h["system"] + h["softirq"]
                                                      for h in hc)
        out["host_cores"] = hc[0]["cores"]
        if all(len(h.get("busy_per_core", [])) == hc[0]["cores"] for h in hc):
            out["host_core_busy_s"] = [statistics.median(h["busy_per_core"][k] for h in hc)
                                       for k in range(hc[0]["cores"])]
    pipe = doc.get("pipeline") or {}
    if pipe.get("edges") is not None and pipe.get("plan_predicted_s"):
        out["edges"] = pipe["edges"]
        out["plan_predicted_s"] = pipe["plan_predicted_s"]
        out["stages"] = pipe.get("stages")
    mem = [first_key(s, ["peak_activation_bytes", "peak_act_bytes", "peak_activations_bytes"])
           for s in use]
    mem = [m for m in mem if m is not None]
    if mem:
        out["peak_activation_bytes"] = mem[-1]
    return out


def run(args, launch, row, extra, mb, outdir):
    name = f"{row}-m{mb}".replace("+", "_")
    jpath = os.path.join(outdir, name + ".json")
    if args.microbatch_size:
        extra = extra + ["--batch", str(mb * args.microbatch_size)]
    cmd = launch + [args.train, args.model] + shlex.split(args.model_args) + \
        shlex.split(args.stage_args) + ["--microbatches", str(mb), "--steps", str(args.steps),
                                        "--json", jpath] + extra
    with open(os.path.join(outdir, name + ".log"), "w") as log:
        log.write("$ " + " ".join(shlex.quote(c) for c in cmd) + "\n")
        log.flush()
        rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)
    if rc != 0:
        return None, f"exit {rc} (see {name}.log)"
    with open(jpath) as f:
        return json.load(f), None


def simulate(train, extra, stages, mb, edges, costs, xfer):
    """Step seconds of the row's schedule (its --schedule, --delay-wgrad and, for --comm
    blocking, receives posted at the wait) simulated by `xmesh-train schedule` with the given
    stage costs and per-plan transfer seconds; None when the command fails."""
    sch = extra[extra.index("--schedule") + 1]
    cmd = [train, "schedule", "--schedule", sch, "--stages", str(stages), "--microbatches", str(mb),
           "--edges", ",".join(f"{a}>{b}" for a, b in edges),
           "--xfer", ",".join(repr(x) for x in xfer)]
    for k in "fiw":
        cmd += ["--" + k, ",".join(repr(x) for x in costs[k])]
    if "--delay-wgrad" in extra:
        cmd.append("--delay-wgrad")
    if "blocking" in extra:
        cmd.append("--blocking")
    with tempfile.TemporaryDirectory() as d:
        jp = os.path.join(d, "sim.json")
        p = subprocess.run(cmd + ["--json", jp], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
        if p.returncode != 0:
            print(f"ablation: schedule simulation failed: {p.stdout.strip()}", file=sys.stderr)
            return None
        with open(jp) as f:
            return json.load(f)["step_s"]


def ceilings(a, rows, results, mbs):
    """Per row, two bounds on its fraction of signal (issue 25 item 5):
    schedule ceiling: the row's schedule simulated with the signal row's stage costs (compute
      that nothing slowed down) and xmesh's predicted transfer times at this NIC rate, over the
      signal schedule simulated with the same costs and no transfer time: what the schedule
      allows when moving data costs no CPU;
    CPU ceiling: a step cannot be shorter than the busy seconds of the host's busiest core in
      it (nor than its busy core-seconds over its cores); signal's step over that floor bounds
      the fraction by what the row's compute and data movement took of the host's CPU."""
    extra_of = dict(rows)
    for mb in mbs:
        sig = [r for r in results if r["microbatches"] == mb and r["row"] == "signal"
               and "stage_costs_s" in r]
        if not sig:
            continue
        sig = sig[0]
        base = None
        if "edges" in sig:
            base = simulate(a.train, extra_of["signal"], sig["stages"], mb, sig["edges"],
                            sig["stage_costs_s"], [0.0] * len(sig["plan_predicted_s"]))
        for r in results:
            if r["microbatches"] != mb or "step_s_median" not in r:
                continue
            if base and "plan_predicted_s" in r and r["row"] != "signal":
                ceil = simulate(a.train, extra_of[r["row"]], r["stages"], mb, r["edges"],
                                sig["stage_costs_s"], r["plan_predicted_s"])
                if ceil:
                    r["schedule_ceiling_s"] = ceil
                    r["schedule_ceiling_of_signal"] = base / ceil
            if "host_cpu_s" in r:
                floor = r["host_cpu_s"]["busy"] / r["host_cores"]
                if r.get("host_core_busy_s"):  # the busiest core bounds the step too
                    floor = max(floor, max(r["host_core_busy_s"]))
                r["cpu_floor_s"] = floor
                r["host_busy_fraction"] = floor / r["step_s_median"]
                if floor > 0:
                    r["cpu_ceiling_of_signal"] = sig["step_s_median"] / floor
                if "host_cpu_s" in sig:
                    r["extra_cpu_s"] = {k: r["host_cpu_s"][k] - sig["host_cpu_s"][k]
                                        for k in ("user", "system", "softirq", "busy")}


def fmt_bytes(b):
    if isinstance(b, list):
        return "/".join(fmt_bytes(x) for x in b)
    if not isinstance(b, (int, float)):
        return "-"
    return f"{b / 1048576:.1f}M" if b >= 1048576 else f"{b / 1024:.0f}K"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", required=True, help="path of xmesh-train")
    ap.add_argument("--model", default="gpt", choices=["gpt", "utransformer"])
    ap.add_argument("--model-args", default="", help="model/batch flags, one string")
    ap.add_argument("--stage-args", default="", help="--stages/--stage-mesh/... flags, one string")
    ap.add_argument("--units-per-step", type=float, default=0,
                    help="tokens (batch*seq) or images (batch) per step (fixed batch)")
    ap.add_argument("--microbatch-size", type=int, default=0,
                    help="keep the microbatch size fixed: --batch = M * this (the paper's "
                         "Fig. 9 setting); throughput units per sample from --units-per-sample")
    ap.add_argument("--units-per-sample", type=float, default=1,
                    help="tokens per sample (seq) or 1 (images), with --microbatch-size")
    ap.add_argument("--units", default="tokens")
    ap.add_argument("--np", type=int, default=0, help="ranks (default $XMH_NP)")
    ap.add_argument("--microbatches", default="4,8")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rows", default=",".join(r for r, _ in ROWS))
    ap.add_argument("--label", default="")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if not a.units_per_step and not a.microbatch_size:
        sys.exit("ablation: give --units-per-step or --microbatch-size")
    os.makedirs(a.out, exist_ok=True)
    np_ = a.np or int(os.environ.get("XMH_NP", "0"))
    if np_ <= 0:
        sys.exit("ablation: --np not given and $XMH_NP not set")
    if os.environ.get("XMH_MPIRUN"):
        launch = shlex.split(os.environ["XMH_MPIRUN"]) + ["-np", str(np_)]
    else:
        launch = ["mpirun", "--oversubscribe", "-np", str(np_)]
    rows = [r for r in ROWS if r[0] in a.rows.split(",")]
    mbs = [int(x) for x in a.microbatches.split(",")]
    results = []
    failed = 0
    for mb in mbs:
        for row, extra in rows:
            doc, err = run(a, launch, row, extra, mb, a.out)
            rec = {"row": row, "microbatches": mb}
            if err:
                rec["error"] = err
                failed += 1
                print(f"ablation: {row} M={mb}: {err}", file=sys.stderr)
            else:
                units = (mb * a.microbatch_size * a.units_per_sample if a.microbatch_size
                         else a.units_per_step)
                rec.update(summarize(doc, a.warmup, units))
                rec["config"] = {k: doc.get(k) for k in ("model", "train", "pipeline")}
                print(f"ablation: {row:13s} M={mb:<3d} {rec['throughput']:10.1f} {a.units}/s "
                      f"(step {rec['step_s_median']:.3f} s [{rec['step_s_min']:.3f}, "
                      f"{rec['step_s_max']:.3f}])", file=sys.stderr)
            results.append(rec)
    # fraction of the signal bound per microbatch count
    for mb in mbs:
        sig = [r for r in results if r["microbatches"] == mb and r["row"] == "signal" and "throughput" in r]
        for r in results:
            if r["microbatches"] == mb and sig and "throughput" in r:
                r["of_signal"] = r["throughput"] / sig[0]["throughput"]
    # Distance to signal, split (issue 25 item 5): at the busiest stage of the
    # signal row, compute slowed down = its busy seconds in this row minus in
    # the signal row (CPU taken by progress threads, staging copies, polling
    # and the kernel's network work); the rest of the distance is idle time
    # at that stage: for eager+wdelay (the signal row's own schedule) exposed
    # transfer, for the other rows schedule bubble plus exposed transfer.
    for mb in mbs:
        sig = [r for r in results if r["microbatches"] == mb and r["row"] == "signal"
               and "stage_busy_s" in r]
        if not sig:
            continue
        k = sig[0]["busiest_stage"]
        for r in results:
            if r["microbatches"] != mb or "stage_busy_s" not in r or r["row"] == "signal":
                continue
            dist = r["step_s_median"] - sig[0]["step_s_median"]
            slow = r["stage_busy_s"][k] - sig[0]["stage_busy_s"][k]
            r["distance_s"] = dist
            r["compute_slowdown_s"] = slow
            r["idle_excess_s"] = dist - slow
            # of the slowdown, what xmesh's own threads took above signal's (the rest:
            # the kernel's network work, caches, the other ranks sharing the core)
            if "stage_xmesh_cpu_s" in r and "stage_xmesh_cpu_s" in sig[0]:
                r["xmesh_cpu_excess_s"] = r["stage_xmesh_cpu_s"][k] - sig[0]["stage_xmesh_cpu_s"][k]
    ceilings(a, rows, results, mbs)
    doc = {"label": a.label, "model": a.model, "model_args": a.model_args, "stage_args": a.stage_args,
           "units": a.units, "units_per_step": a.units_per_step, "steps": a.steps,
           "warmup": a.warmup, "np": np_, "results": results}
    with open(os.path.join(a.out, "ablation.json"), "w") as f:
        json.dump(doc, f, indent=1)
    # table
    mbs_note = f" --batch M*{a.microbatch_size}" if a.microbatch_size else ""
    lines = [f"**{a.label or a.model}** ({np_} ranks; `{a.model_args}{mbs_note} {a.stage_args}`; "
             f"median of {a.steps - a.warmup} steps after {a.warmup} warm-up, [min, max])", "",
             f"| M | row | {a.units}/s [min, max] | of signal | step s | predicted s (pred/meas) | bubble | peak act. per stage |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['microbatches']} | {r['row']} | failed: {r['error']} | | | | | |")
            continue
        pred = (f"{r['predicted_s']:.3f} ({r['predicted_over_measured']:.2f})"
                if "predicted_s" in r else "-")
        bub = f"{r['bubble']:.2f}" if "bubble" in r else "-"
        lines.append(
            f"| {r['microbatches']} | {r['row']} | {r['throughput']:.1f} [{r['throughput_min']:.1f}, "
            f"{r['throughput_max']:.1f}] | {r.get('of_signal', float('nan')):.2f} | "
            f"{r['step_s_median']:.3f} | {pred} | {bub} | {fmt_bytes(r.get('peak_activation_bytes'))} |")
    # targets: eager+wdelay >= 0.90 of signal where blocking <= 0.75, above eager and 1f1b
    lines.append("")
    for mb in mbs:
        get = {r["row"]: r for r in results if r["microbatches"] == mb and "of_signal" in r}
        if not all(k in get for k in ("blocking", "1f1b", "eager", "eager+wdelay", "signal")):
            continue
        b, e, w, o = (get["blocking"]["of_signal"], get["eager"]["of_signal"],
                      get["eager+wdelay"]["of_signal"], get["1f1b"]["of_signal"])
        ok_b = b <= 0.75
        ok_w = w >= 0.90
        above = get["eager+wdelay"]["throughput_min"] > max(get["eager"]["throughput_max"],
                                                            get["1f1b"]["throughput_max"])
        lines.append(f"- M={mb}: blocking {b:.3f} of signal ({'<= 0.75' if ok_b else '> 0.75'}), "
                     f"eager+wdelay {w:.3f} ({'met' if ok_w else 'missed'} >= 0.90), "
                     f"1f1b {o:.2f}, eager {e:.2f}; eager+wdelay above both with non-overlapping "
                     f"[min, max]: {'yes' if above else 'no'}")
    brk = [r for r in results if "distance_s" in r]
    if brk:
        lines += ["", "Distance to signal per row (step seconds): compute slowed down at the signal "
                  "row's busiest stage, and the rest (idle there: exposed transfer, plus schedule "
                  "bubble for rows whose schedule differs from signal's)", "",
                  "xmesh CPU: what xmesh's progress thread and waits took on that stage's busiest "
                  "rank above signal's (xmesh_ctx_get_stats), CPU that competes with compute",
                  "",
                  "| M | row | distance s | compute slowed s | idle excess s | xmesh CPU s |",
                  "|---|---|---|---|---|---|"]
        for r in brk:
            xc = r.get("xmesh_cpu_excess_s")
            lines.append(f"| {r['microbatches']} | {r['row']} | {r['distance_s']:.3f} | "
                         f"{r['compute_slowdown_s']:.3f} | {r['idle_excess_s']:.3f} | "
                         f"{'%.3f' % xc if xc is not None else '-'} |")
    cel = [r for r in results if "cpu_floor_s" in r or "schedule_ceiling_s" in r]
    if cel:
        lines += ["", "Bounds on each row's fraction of signal. Schedule ceiling: the row's schedule "
                  "simulated (`xmesh-train schedule`) with the signal row's stage costs and xmesh's "
                  "predicted transfer times, over signal simulated with no transfer time (moving "
                  "data costs no CPU). CPU ceiling: signal's step over the row's floor, the busy "
                  "seconds per step of the host's busiest core (at least its busy core-seconds over "
                  "its cores; a step is never shorter). Host busy: that floor over the row's step. Extra CPU: the host's core-seconds per step "
                  "above signal's (user / system / softirq): compute slowed down, xmesh, MPI and "
                  "the kernel's work for the (emulated) NICs together.", "",
                  "| M | row | of signal | schedule ceiling | CPU ceiling | host busy | "
                  "extra CPU core-s: user / system / softirq |",
                  "|---|---|---|---|---|---|---|"]
        for r in cel:
            sc = r.get("schedule_ceiling_of_signal")
            cc = r.get("cpu_ceiling_of_signal")
            hb = r.get("host_busy_fraction")
            ex = r.get("extra_cpu_s")
            lines.append(f"| {r['microbatches']} | {r['row']} | {r.get('of_signal', float('nan')):.2f} | "
                         f"{'%.2f' % sc if sc is not None else '-'} | "
                         f"{'%.2f' % cc if cc is not None else '-'} | "
                         f"{'%.0f%%' % (100 * hb) if hb is not None else '-'} | "
                         + (f"{ex['busy']:.3f}: {ex['user']:.3f} / {ex['system']:.3f} / "
                            f"{ex['softirq']:.3f} |" if ex else "- |"))
    table = "\n".join(lines) + "\n"
    with open(os.path.join(a.out, "ablation.md"), "w") as f:
        f.write(table)
    print(table)
    # chart data: one cluster per M, one bar per row (fraction of signal)
    with open(os.path.join(a.out, "ablation.tsv"), "w") as f:
        f.write("M\t" + "\t".join(r for r, _ in rows) + "\n")
        for mb in mbs:
            vals = []
            for row, _ in rows:
                m = [r for r in results if r["microbatches"] == mb and r["row"] == row and "of_signal" in r]
                vals.append(f"{m[0]['of_signal']:.4f}" if m else "NaN")
            f.write(f"M={mb}\t" + "\t".join(vals) + "\n")
    gp = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "charts", "bars.gp")
    png = os.path.join(a.out, "ablation.png")
    try:
        subprocess.call(["gnuplot", "-e", f"datafile='{a.out}/ablation.tsv'; outfile='{png}'; "
                         f"ncol={len(rows) + 1}; ylab='throughput / signal bound'; "
                         f"ttl='{a.label or a.model}: pipeline overlap ablation'; refline=0.9", gp])
    except OSError:
        print("ablation: gnuplot not found, no chart", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
