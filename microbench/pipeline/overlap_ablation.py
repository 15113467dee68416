#!/usr/bin/env python3
"""AxoNN-style overlap ablation inside a stage (issue 20 item 8, second bullet).

Runs xmesh-train gpt once per (strategy, row) on the same ranks: the rows add the overlap
switches of nn/overlap.h one at a time, cumulatively:

  none                      --overlap none
  +bwd-input                --overlap bwd-input
  +defer-grad               --overlap bwd-input,defer-grad
  +prefetch                 --overlap bwd-input,defer-grad,prefetch
  +coll-matmul              --overlap bwd-input,defer-grad,prefetch,coll-matmul   (= all)

and reports per row the step time (median, min, max over the steps after --warmup), the
compute and boxing seconds of the step records, the hidden fraction and the ratio of the step
time to megatron's in the same row.

Hidden fraction of a row = 1 - exposed(row) / exposed(none of the same strategy), with
exposed = median(step_seconds - compute_s): the share of the communication time that the
no-overlap run exposes which the row hides (0 for the none row by definition; negative when a
row exposes more).

Launch: inside microbench/cluster/cluster.sh ($XMH_MPIRUN and $XMH_NP), otherwise
`mpirun --oversubscribe -np NP`. Writes overlap.md, overlap.json, overlap.tsv and overlap.png
(gnuplot, microbench/charts/bars.gp) under --out.
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys

ROWS = [
    ("none", "none"),
    ("+bwd-input", "bwd-input"),
    ("+defer-grad", "bwd-input,defer-grad"),
    ("+prefetch", "bwd-input,defer-grad,prefetch"),
    ("+coll-matmul", "bwd-input,defer-grad,prefetch,coll-matmul"),
]


def summarize(doc, warmup):
    steps = doc.get("steps", [])
    use = steps[warmup:] if len(steps) > warmup else steps
    if not use:
        raise RuntimeError("no step records")
    t = [s["step_seconds"] for s in use]
    comp = [s.get("compute_s", 0.0) for s in use]
    box = [s.get("boxing_s", 0.0) for s in use]
    return {
        "steps_used": len(use),
        "step_s_median": statistics.median(t),
        "step_s_min": min(t),
        "step_s_max": max(t),
        "compute_s_median": statistics.median(comp),
        "boxing_s_median": statistics.median(box),
        "exposed_s_median": statistics.median([a - b for a, b in zip(t, comp)]),
        "losses": [s["loss"] for s in steps],
    }


def run(a, launch, strat, mesh, row, ov):
    name = f"{strat}-{mesh}-{row}".replace("+", "")
    jpath = os.path.join(a.out, name + ".json")
    cmd = launch + [a.train, "gpt"] + shlex.split(a.model_args) + [
        "--stage-mesh", mesh, "--strategy", strat, "--overlap", ov, "--steps", str(a.steps),
        "--no-progress", "--json", jpath]
    with open(os.path.join(a.out, name + ".log"), "w") as log:
        log.write("$ " + " ".join(shlex.quote(c) for c in cmd) + "\n")
        log.flush()
        rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)
    if rc != 0:
        return None, f"exit {rc} (see {name}.log)"
    with open(jpath) as f:
        return json.load(f), None


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", required=True, help="path of xmesh-train")
    ap.add_argument("--model-args", default="", help="model/batch flags, one string")
    ap.add_argument("--strategies", default="megatron:2x4,3d:2x2x2,axonn:2x2x2",
                    help="STRATEGY:MESH,... (the first megatron one is the ratio's base)")
    ap.add_argument("--rows", default=",".join(r for r, _ in ROWS))
    ap.add_argument("--np", type=int, default=0, help="ranks (default $XMH_NP)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--label", default="")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    np_ = a.np or int(os.environ.get("XMH_NP", "0"))
    if np_ <= 0:
        sys.exit("overlap_ablation: --np not given and $XMH_NP not set")
    if os.environ.get("XMH_MPIRUN"):
        launch = shlex.split(os.environ["XMH_MPIRUN"]) + ["-np", str(np_)]
    else:
        launch = ["mpirun", "--oversubscribe", "-np", str(np_)]
    strats = [tuple(x.split(":")) for x in a.strategies.split(",")]
    rows = [r for r in ROWS if r[0] in a.rows.split(",")]
    if not rows or any(len(s) != 2 for s in strats):
        sys.exit(f"overlap_ablation: bad --rows '{a.rows}' or --strategies '{a.strategies}'")
    results, failed = [], 0
    for strat, mesh in strats:
        for row, ov in rows:
            doc, err = run(a, launch, strat, mesh, row, ov)
            rec = {"strategy": strat, "mesh": mesh, "row": row, "overlap": ov}
            if err:
                rec["error"] = err
                failed += 1
                print(f"overlap_ablation: {strat} {mesh} {row}: {err}", file=sys.stderr)
            else:
                rec.update(summarize(doc, a.warmup))
                print(f"overlap_ablation: {strat:9s} {mesh:7s} {row:13s} step "
                      f"{rec['step_s_median']:.3f} s [{rec['step_s_min']:.3f}, "
                      f"{rec['step_s_max']:.3f}]", file=sys.stderr)
            results.append(rec)
    # hidden fraction against the strategy's none row; ratio to megatron in the same row
    for r in results:
        if "error" in r:
            continue
        base = [b for b in results if b["strategy"] == r["strategy"] and b["mesh"] == r["mesh"]
                and b["row"] == "none" and "error" not in b]
        if base and base[0]["exposed_s_median"] > 0:
            r["hidden_fraction"] = 1 - r["exposed_s_median"] / base[0]["exposed_s_median"]
        meg = [b for b in results if b["strategy"] == "megatron" and b["row"] == r["row"]
               and "error" not in b]
        if meg:
            r["ratio_to_megatron"] = r["step_s_median"] / meg[0]["step_s_median"]
        # overlap must not change the numbers: losses equal to the none row
        if base and r["losses"] != base[0]["losses"]:
            d = max(abs(x - y) / max(abs(y), 1e-30) for x, y in zip(r["losses"], base[0]["losses"]))
            r["max_rel_loss_diff_vs_none"] = d
    doc = {"label": a.label, "ranks": np_, "steps": a.steps, "warmup": a.warmup,
           "model_args": a.model_args, "rows": results}
    with open(os.path.join(a.out, "overlap.json"), "w") as f:
        json.dump(doc, f, indent=1)
    nan = float("nan")
    lines = [f"{a.label}" if a.label else "", "",
             "| strategy | mesh | row | step s median [min, max] | compute s | boxing s | "
             "exposed s | hidden | / megatron |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['strategy']} | {r['mesh']} | {r['row']} | {r['error']} | | | | | |")
            continue
        lines.append(
            f"| {r['strategy']} | {r['mesh']} | {r['row']} | {r['step_s_median']:.3f} "
            f"[{r['step_s_min']:.3f}, {r['step_s_max']:.3f}] | {r['compute_s_median']:.3f} | "
            f"{r['boxing_s_median']:.3f} | {r['exposed_s_median']:.3f} | "
            f"{r.get('hidden_fraction', nan):.2f} | {r.get('ratio_to_megatron', nan):.2f} |")
    bad = [r for r in results if r.get("max_rel_loss_diff_vs_none", 0) > 1e-6]
    lines.append("")
    lines.append("Losses with overlap equal to none within 1e-6 relative: "
                 + ("yes" if not bad else "NO: " + ", ".join(
                     f"{r['strategy']} {r['row']} ({r['max_rel_loss_diff_vs_none']:.3g})"
                     for r in bad)))
    table = "\n".join(lines) + "\n"
    with open(os.path.join(a.out, "overlap.md"), "w") as f:
        f.write(table)
    print(table)
    with open(os.path.join(a.out, "overlap.tsv"), "w") as f:
        f.write("strategy\t" + "\t".join(r for r, _ in rows) + "\n")
        for strat, mesh in strats:
            vals = []
            for row, _ in rows:
                m = [r for r in results if r["strategy"] == strat and r["mesh"] == mesh
                     and r["row"] == row and "error" not in r]
                vals.append(f"{m[0]['step_s_median']:.4f}" if m else "NaN")
            f.write(f"{strat} {mesh}\t" + "\t".join(vals) + "\n")
    gp = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "charts", "bars.gp")
    png = os.path.join(a.out, "overlap.png")
    try:
        subprocess.call(["gnuplot", "-e", f"datafile='{a.out}/overlap.tsv'; outfile='{png}'; "
                         f"ncol={len(rows) + 1}; ylab='step time, median (s)'; "
                         f"ttl='{a.label or 'GPT'}: overlap switches added cumulatively'", gp])
    except OSError:
        print("overlap_ablation: gnuplot not found, no chart", file=sys.stderr)
    return 1 if failed or bad else 0


if __name__ == "__main__":
    sys.exit(main())
