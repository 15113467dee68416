#!/usr/bin/env python3
"""What the schedule alone allows at other NIC rates, from one overlap-ablation run.

For each microbatch count of an ablation.json (microbench/pipeline/ablation.py), takes the
signal row's measured stage costs and the blocking row's predicted transfer time per plan, scales
the transfer times by k (k = 1: the run's NIC rate; k = 2: half the rate) and simulates with
`xmesh-train schedule`: blocking (1F1B, receives posted at the wait) and eager-1F1B + weight
delay, each over signal (eager-1F1B + weight delay, no transfer time). Moving data costs no CPU
here: this is the schedule's own ceiling. Prints, per M, the fractions for each k and the best
eager + weight delay among the k where the simulated blocking row is at most --blocking-max.

  ceiling_sweep.py --train build/pipeline/xmesh-train DIR/ablation.json [--kmin 0.1 --kmax 3
      --kstep 0.1] [--blocking-max 0.75] [--json OUT]
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ablation  # noqa: E402  (the same directory)


def simulate(train, row, stages, mb, edges, costs, xfer):
    """ablation.py's simulation of a row's schedule; exits when xmesh-train refuses"""
    t = ablation.simulate(train, row, stages, mb, edges, costs, xfer)
    if t is None:
        sys.exit("ceiling_sweep: the schedule simulation failed (message above)")
    return t


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", required=True, help="path of xmesh-train")
    ap.add_argument("ablation", help="ablation.json of one configuration")
    ap.add_argument("--kmin", type=float, default=0.1)
    ap.add_argument("--kmax", type=float, default=3.0)
    ap.add_argument("--kstep", type=float, default=0.1)
    ap.add_argument("--blocking-max", type=float, default=0.75)
    ap.add_argument("--json", help="write the sweep here")
    a = ap.parse_args()
    if not (0 < a.kmin <= a.kmax and a.kstep > 0):
        sys.exit(f"ceiling_sweep: need 0 < --kmin <= --kmax and --kstep > 0 "
                 f"(got {a.kmin}, {a.kmax}, {a.kstep})")
    with open(a.ablation) as f:
        abl = json.load(f)
    ks = []
    k = a.kmin
    while k <= a.kmax + 1e-9:
        ks.append(round(k, 6))
        k += a.kstep
    out = {"ablation": a.ablation, "blocking_max": a.blocking_max, "sweeps": []}
    flags = dict(ablation.ROWS)  # the ablation's own rows: the same flags as its runs
    eager_wd, blocking = flags["eager+wdelay"], flags["blocking"]
    for mb in sorted({r["microbatches"] for r in abl["results"]}):
        rows = {r["row"]: r for r in abl["results"] if r["microbatches"] == mb}
        sig, blk = rows.get("signal"), rows.get("blocking")
        if not sig or not blk or "stage_costs_s" not in sig or "plan_predicted_s" not in blk:
            print(f"M={mb}: no signal stage costs or blocking plan predictions (an ablation "
                  f"from before 2026-11-29?)", file=sys.stderr)
            continue
        base = simulate(a.train, eager_wd, sig["stages"], mb, sig["edges"],
                        sig["stage_costs_s"], [0.0] * len(blk["plan_predicted_s"]))
        pts = []
        for k in ks:
            x = [k * v for v in blk["plan_predicted_s"]]
            b = base / simulate(a.train, blocking, sig["stages"], mb, sig["edges"],
                                sig["stage_costs_s"], x)
            e = base / simulate(a.train, eager_wd, sig["stages"], mb, sig["edges"],
                                sig["stage_costs_s"], x)
            pts.append({"k": k, "blocking": b, "eager_wdelay": e})
        ok = [p for p in pts if p["blocking"] <= a.blocking_max]
        best = max(ok, key=lambda p: p["eager_wdelay"]) if ok else None
        out["sweeps"].append({"microbatches": mb, "points": pts, "best": best})
        print(f"M={mb}: " + " ".join(f"x{p['k']:g} {p['blocking']:.2f}/{p['eager_wdelay']:.2f}"
                                     for p in pts))
        if best:
            print(f"M={mb}: best eager+wdelay where simulated blocking <= {a.blocking_max}: "
                  f"{best['eager_wdelay']:.3f} at x{best['k']:g} of the run's transfer "
                  f"times (blocking {best['blocking']:.3f})")
        else:
            print(f"M={mb}: simulated blocking above {a.blocking_max} at every k")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
