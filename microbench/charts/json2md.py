#!/usr/bin/env python3
"""Markdown tables from xmesh-bench JSON files (for docs and reports).

usage: json2md.py RESULT.json [...]
One table per suite and size: a row per case, a column per method, each
cell "median s (t/LB)"; a status word where the row did not run. Then the
calibration line of the first file.
"""
import json
import sys


def main(paths):
    for p in paths:
        with open(p) as f:
            d = json.load(f)
        rows = d["rows"]
        keys = []
        for r in rows:
            k = (r["suite"], r.get("shape", ""))
            if r["suite"] not in [x[0] for x in keys]:
                keys.append(k)
        for suite, _ in keys:
            rs = [r for r in rows if r["suite"] == suite]
            methods, cases = [], []
            for r in rs:
                if r["method"] not in methods:
                    methods.append(r["method"])
                if r["case"] not in cases:
                    cases.append(r["case"])
            shapes = {r["case"]: r["shape"] for r in rs}
            barrier = (", each ending with a closing MPI_Barrier (included)"
                       if d["config"].get("closing_barrier") else "")
            print(f"\n**{suite}** ({d['config']['ranks']} ranks on {d['config']['hosts']} hosts, "
                  f"{d['config']['iters']} iterations after {d['config']['warmup']} warm-up"
                  f"{barrier}; cells: median seconds (median / lower bound))\n")
            print("| case | shape | " + " | ".join(methods) + " |")
            print("|---|---|" + "---|" * len(methods))
            for c in cases:
                cells = []
                for m in methods:
                    r = next((x for x in rs if x["case"] == c and x["method"] == m), None)
                    if not r:
                        cells.append("")
                    elif r["status"] != "ok":
                        cells.append(r["status"])
                    else:
                        lb = r.get("time_over_lb")
                        cells.append(f"{r['time_med_s']:.3f} ({lb:.2f})" if lb else
                                     f"{r['time_med_s']:.3f}")
                print(f"| {c} | {shapes[c]} | " + " | ".join(cells) + " |")
            plans = [r for r in rs if r["method"] == "xmesh" and r.get("plan_med_s") is not None]
            if plans:
                print("\nxmesh plan creation, median (min-max) s: " + ", ".join(
                    f"{r['case']}: {r['plan_med_s']:.4f} ({r['plan_min_s']:.4f}-"
                    f"{r['plan_max_s']:.4f})" for r in plans))
            lbs = [r for r in rs if r["method"] == "xmesh" and r.get("predicted_s")]
            if lbs:
                print("\nxmesh prediction / measured: " + ", ".join(
                    f"{r['case']}: {r['predicted_over_time']:.2f}" for r in lbs))
        cal = d["calibration"]
        if cal.get("one_mbit") and cal.get("nominal_mbit"):
            print(f"\nCalibration: one transfer {cal['one_mbit']:.1f} Mbit/s of nominal "
                  f"{cal['nominal_mbit']:.0f} ({100 * cal['one_mbit'] / cal['nominal_mbit']:.1f}%), "
                  f"two sharing a NIC {cal['shared_mbit']:.1f} each, ring {cal['ring_mbit']:.1f}, "
                  f"intra-host {cal['intra_mbit']:.0f} Mbit/s.")


if __name__ == "__main__":
    main(sys.argv[1:])
