#!/usr/bin/env python3
"""Pipeline schedules measured against the simulator (issue 23 item 6), for xmesh-train.

Two sub-commands:

  run     one rank-group count R: every schedule row x every microbatch count M, each an
          xmesh-train run with --json and --predict-memory; writes OUT/part-R<R>.json
          (launch: inside microbench/cluster/cluster.sh $XMH_MPIRUN and $XMH_NP are used,
          otherwise `mpirun --oversubscribe -np NP`)
  report  merges the part files of OUT into OUT/schedules.{md,json,tsv,png}

Rows (same model, rank groups, meshes and microbatch size in every row):
  1f1b              --schedule 1f1b
  eager-1f1b        --schedule eager-1f1b (warm-up 2(R-i)-1 forwards, sends ahead)
  eager-1f1b+wdelay --schedule eager-1f1b --delay-wgrad (weight-gradient part delayed)
  interleaved-1f1b  --virtual-stages 2 --schedule interleaved-1f1b (Megatron's order)
  zb-v              --virtual-stages 2 --schedule zb-v (V shape, split backward)

Per row, over the steps after --warmup (median [min, max]):
  bubble      the step's idle fraction, mean over rank groups (measured: 1 - busy / step
              time on each rank, from the step JSON's bubble_per_stage)
  tokens/s    (or images/s) units per step / step seconds
  peak act.   measured peak activation bytes per rank group (allocations, step JSON)
  predicted   the simulator's step seconds, bubble and peak bytes per group, from the previous
              step's measured stage costs and xmesh's plan predictions (predicted_s,
              predicted_bubble, predicted_peak_activation_bytes_per_group), and pred/meas
A run that xmesh-train refuses (the schedule does not fit M, R, V) becomes a row
"refused: <message>"; a run that fails otherwise "failed: <message>".
"""
import argparse
import glob
import json
import os
import shlex
import statistics
import subprocess
import sys

ROWS = [
    ("1f1b", ["--schedule", "1f1b"]),
    ("eager-1f1b", ["--schedule", "eager-1f1b"]),
    ("eager-1f1b+wdelay", ["--schedule", "eager-1f1b", "--delay-wgrad"]),
    ("interleaved-1f1b", ["--schedule", "interleaved-1f1b", "--virtual-stages", "2"]),
    ("zb-v", ["--schedule", "zb-v", "--virtual-stages", "2"]),
]


def med3(xs):
    """median, min, max of a non-empty list (None for an empty one)"""
    xs = [x for x in xs if isinstance(x, (int, float))]
    if not xs:
        return None
    return [statistics.median(xs), min(xs), max(xs)]


def group_of_stages(doc):
    """rank group of each model stage: the stage meshes' first ranks, numbered in order"""
    metas = (doc.get("pipeline") or {}).get("stage_meshes") or []
    firsts, groups = [], []
    for m in metas:
        r0 = m.get("rank0")
        if r0 not in firsts:
            firsts.append(r0)
        groups.append(firsts.index(r0))
    return groups


def per_group(vals, groups):
    """per-stage values -> per rank group (max over the group's stages)"""
    if not groups or len(groups) != len(vals):
        return list(vals)
    out = [0] * (max(groups) + 1)
    for v, g in zip(vals, groups):
        out[g] = max(out[g], v)
    return out


def summarize(doc, warmup, units_per_step):
    steps = doc.get("steps", [])
    use = steps[warmup:] if len(steps) > warmup else steps
    if not use:
        raise RuntimeError("no step records")
    groups = group_of_stages(doc)
    t = [s["step_seconds"] for s in use]
    out = {"steps_used": len(use), "step_s": med3(t)}
    out["rate"] = [units_per_step / out["step_s"][0], units_per_step / out["step_s"][2],
                   units_per_step / out["step_s"][1]]
    out["bubble"] = med3([s.get("bubble") for s in use])
    peaks = [per_group(s["peak_activation_bytes"], groups) for s in use if "peak_activation_bytes" in s]
    if peaks:
        ng = len(peaks[0])
        out["peak_bytes"] = [med3([p[g] for p in peaks]) for g in range(ng)]
    out["predicted_s"] = med3([s.get("predicted_s") for s in use])
    out["predicted_bubble"] = med3([s.get("predicted_bubble") for s in use])
    pp = [s["predicted_peak_activation_bytes_per_group"] for s in use
          if "predicted_peak_activation_bytes_per_group" in s]
    if pp:
        out["predicted_peak_bytes"] = [statistics.median(p[g] for p in pp) for g in range(len(pp[0]))]
    return out


def error_line(log_text):
    """the command's own error message (last 'xmesh-train' line), else the last line"""
    lines = [l.strip() for l in log_text.splitlines() if l.strip()]
    mine = [l for l in lines if l.startswith("xmesh-train")]
    return (mine[-1] if mine else (lines[-1] if lines else "no output"))[:300]


def cmd_run(a):
    os.makedirs(a.out, exist_ok=True)
    np_ = a.np or int(os.environ.get("XMH_NP", "0"))
    if np_ <= 0:
        sys.exit("schedules: --np not given and $XMH_NP not set")
    if os.environ.get("XMH_MPIRUN"):
        launch = shlex.split(os.environ["XMH_MPIRUN"]) + ["-np", str(np_)]
    else:
        launch = ["mpirun", "--oversubscribe", "-np", str(np_)]
    rows = [r for r in ROWS if r[0] in a.rows.split(",")]
    results = []
    for mb in [int(x) for x in a.microbatches.split(",")]:
        for row, extra in rows:
            name = f"R{a.groups}-{row}-m{mb}".replace("+", "_")
            jpath = os.path.join(a.out, name + ".json")
            lpath = os.path.join(a.out, name + ".log")
            cmd = (launch + [a.train, a.model] + shlex.split(a.model_args) +
                   ["--stages", str(a.groups), "--stage-mesh", ",".join(["1x1"] * a.groups),
                    "--microbatches", str(mb), "--batch", str(mb * a.microbatch_size),
                    "--steps", str(a.steps), "--json", jpath, "--predict-memory", "--no-progress"] +
                   extra)
            rec = {"groups": a.groups, "row": row, "microbatches": mb,
                   "command": " ".join(shlex.quote(c) for c in cmd)}
            with open(lpath, "w") as log:
                log.write("$ " + rec["command"] + "\n")
                log.flush()
                try:
                    rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=a.timeout)
                except subprocess.TimeoutExpired:
                    rc = -1
                    log.write(f"xmesh-train: timed out after {a.timeout} s\n")
            text = open(lpath).read()
            if rc != 0 or not os.path.exists(jpath):
                msg = error_line(text)
                # a refusal is the command's own message before any step ran
                kind = "refused" if ("--schedule" in msg or "stage layout" in msg
                                     or "virtual" in msg) else "failed"
                rec[kind] = msg
                print(f"schedules: R={a.groups} {row} M={mb}: {kind}: {msg}", file=sys.stderr)
            else:
                try:
                    with open(jpath) as f:
                        doc = json.load(f)
                    units = mb * a.microbatch_size * a.units_per_sample
                    rec.update(summarize(doc, a.warmup, units))
                    print(f"schedules: R={a.groups} {row:18s} M={mb:<3d} {rec['rate'][0]:9.1f} "
                          f"{a.units}/s  bubble {rec['bubble'][0] if rec['bubble'] else float('nan'):.2f}",
                          file=sys.stderr)
                except (OSError, ValueError, KeyError, RuntimeError) as e:
                    rec["failed"] = f"bad step JSON: {e}"
            results.append(rec)
    part = {"groups": a.groups, "np": np_, "model": a.model, "model_args": a.model_args,
            "microbatch_size": a.microbatch_size, "units": a.units, "steps": a.steps,
            "warmup": a.warmup, "results": results}
    with open(os.path.join(a.out, f"part-R{a.groups}.json"), "w") as f:
        json.dump(part, f, indent=1)
    return 0


def fmt_b(b):
    if not isinstance(b, (int, float)):
        return "-"
    return f"{b / 1048576:.2f}M" if b >= 1048576 else f"{b / 1024:.0f}K"


def fmt_m3(m, f="{:.3f}"):
    if not m:
        return "-"
    return (f + " [" + f + ", " + f + "]").format(m[0], m[1], m[2])


def ratio(p, m):
    return f"{p / m:.2f}" if isinstance(p, (int, float)) and isinstance(m, (int, float)) and m > 0 else "-"


def cmd_report(a):
    parts = []
    for p in sorted(glob.glob(os.path.join(a.out, "part-R*.json"))):
        with open(p) as f:
            parts.append(json.load(f))
    if not parts:
        sys.exit(f"schedules: no part-R*.json under {a.out}")
    parts.sort(key=lambda p: p["groups"])
    units = parts[0]["units"]
    doc = {"command": a.command, "environment": a.env, "parts": parts}
    with open(os.path.join(a.out, "schedules.json"), "w") as f:
        json.dump(doc, f, indent=1)
    p0 = parts[0]
    lines = [f"# Pipeline schedules, measured and predicted ({p0['model']})", "",
             f"- command: `{a.command}`",
             f"- environment: {a.env}",
             f"- model: `{p0['model_args']}`, microbatches of {p0['microbatch_size']} samples "
             f"(--batch = M x {p0['microbatch_size']}), one rank per group (stage meshes 1x1)",
             f"- figures: median [min, max] over {p0['steps'] - p0['warmup']} steps after "
             f"{p0['warmup']} warm-up steps; peak activation bytes per rank group (measured "
             f"allocations, median); predicted = the simulator (previous step's stage costs)", ""]
    hdr = (f"| R | M | schedule | bubble | {units}/s | step s | pred. step s (p/m) | pred. bubble "
           f"| peak act. per group | pred. peak per group (p/m) |")
    lines += [hdr, "|" + "---|" * 10]
    tsv_rows = []
    for part in parts:
        for r in part["results"]:
            head = f"| {r['groups']} | {r['microbatches']} | {r['row']} |"
            if "refused" in r or "failed" in r:
                k = "refused" if "refused" in r else "failed"
                lines.append(head + f" {k}: {r[k].replace('|', '/')} | | | | | | |")
                continue
            ps, pb, pk = r.get("predicted_s"), r.get("predicted_bubble"), r.get("predicted_peak_bytes")
            peaks = r.get("peak_bytes") or []
            pk_txt = "-"
            if pk:
                pk_txt = " / ".join(f"{fmt_b(p)} ({ratio(p, m[0] if m else None)})"
                                    for p, m in zip(pk, peaks + [None] * len(pk)))
            lines.append(
                head + f" {fmt_m3(r['bubble'], '{:.2f}')} | {fmt_m3(r['rate'], '{:.0f}')} | "
                f"{fmt_m3(r['step_s'])} | "
                + (f"{ps[0]:.3f} ({ratio(ps[0], r['step_s'][0])})" if ps else "-") + " | "
                + (f"{pb[0]:.2f}" if pb else "-") + " | "
                + (" / ".join(f"{fmt_b(m[0])} [{fmt_b(m[1])}, {fmt_b(m[2])}]" for m in peaks) or "-")
                + f" | {pk_txt} |")
            tsv_rows.append(r)
    lines.append("")
    lines.append("Columns: R rank groups (pipeline ranks), M microbatches per step; bubble: idle "
                 "fraction of the step, mean over groups; step s: measured step seconds; pred. "
                 "step s: simulator (p/m = predicted / measured); peak act.: measured peak "
                 "activation bytes of each rank group (all its chunks), with [min, max] over "
                 "steps; pred. peak: the simulator's memory model (p/m per group).")
    table = "\n".join(lines) + "\n"
    with open(os.path.join(a.out, "schedules.md"), "w") as f:
        f.write(table)
    print(table)
    # chart: one cluster per (R, M), one bar per schedule: units/s (NaN: refused / failed)
    names = [n for n, _ in ROWS if any(r["row"] == n for part in parts for r in part["results"])]
    cases = []
    for part in parts:
        for r in part["results"]:
            c = f"R={r['groups']} M={r['microbatches']}"
            if c not in cases:
                cases.append(c)
    tsv = os.path.join(a.out, "schedules.tsv")
    with open(tsv, "w") as f:
        f.write("case\t" + "\t".join(names) + "\n")
        for c in cases:
            vals = []
            for n in names:
                m = [r for part in parts for r in part["results"]
                     if f"R={r['groups']} M={r['microbatches']}" == c and r["row"] == n and "rate" in r]
                vals.append(f"{m[0]['rate'][0]:.2f}" if m else "NaN")
            f.write(c + "\t" + "\t".join(vals) + "\n")
    gp = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "charts", "bars.gp")
    png = os.path.join(a.out, "schedules.png")
    try:
        subprocess.call(["gnuplot", "-e", f"datafile='{tsv}'; outfile='{png}'; ncol={len(names) + 1}; "
                         f"ylab='{units}/s (median)'; ttl='{p0['model']}: pipeline schedules'", gp])
    except OSError:
        print("schedules: gnuplot not found, no chart", file=sys.stderr)
    bad = sum(1 for part in parts for r in part["results"] if "failed" in r)
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--train", required=True, help="path of xmesh-train")
    r.add_argument("--model", default="gpt", choices=["gpt", "utransformer"])
    r.add_argument("--model-args", default="", help="model flags, one string")
    r.add_argument("--groups", type=int, required=True, help="rank groups R (--stages R)")
    r.add_argument("--microbatch-size", type=int, required=True, help="--batch = M x this")
    r.add_argument("--units-per-sample", type=float, default=1, help="tokens per sample (seq) or 1")
    r.add_argument("--units", default="tokens")
    r.add_argument("--np", type=int, default=0, help="ranks (default $XMH_NP)")
    r.add_argument("--microbatches", default="4,8")
    r.add_argument("--steps", type=int, default=6)
    r.add_argument("--warmup", type=int, default=2)
    r.add_argument("--rows", default=",".join(n for n, _ in ROWS))
    r.add_argument("--timeout", type=int, default=300, help="seconds per run")
    r.add_argument("--out", required=True)
    p = sub.add_parser("report")
    p.add_argument("--out", required=True)
    p.add_argument("--command", default="")
    p.add_argument("--env", default="")
    a = ap.parse_args()
    return cmd_run(a) if a.cmd == "run" else cmd_report(a)


if __name__ == "__main__":
    sys.exit(main())
