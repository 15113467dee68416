#!/usr/bin/env python3
"""Predicted vs measured time of every (case, method) row of xmesh-bench
JSON files (issue 13 item 2, docs/COSTMODEL.md).

  compare.py RUN.json [RUN.json ...] [--out DIR]

Prints, and writes to DIR/costmodel.md: one row per (suite, case, method)
with predicted_s, the measured time_med_s and the relative error
|pred - meas| / meas; the median relative error and Spearman's rank
correlation over all pairs, and the same per method. Writes
DIR/costmodel.dat (predicted, measured, method index) and, when gnuplot is
found, DIR/costmodel-scatter.png (log-log, with the line pred = meas).
"""
import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys


def ranks(v):
    """Average ranks (1-based) of the values, ties sharing their mean rank."""
    order = sorted(range(len(v)), key=lambda i: v[i])
    r = [0.0] * len(v)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return r


def spearman(x, y):
    """Pearson correlation of the ranks (handles ties); None below 3 points."""
    if len(x) < 3:
        return None
    rx, ry = ranks(x), ranks(y)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return None
    return sxy / (sxx * syy) ** 0.5


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("json", nargs="+")
    ap.add_argument("--out", default=".")
    a = ap.parse_args()
    rows, skipped = [], []
    for path in a.json:
        with open(path) as f:
            doc = json.load(f)
        for r in doc["rows"]:
            key = "%s/%s/%s" % (r["suite"], r["case"], r["method"])
            if r["status"] != "ok":
                skipped.append((key, r["status"]))
                continue
            if r.get("predicted_s") is None or r.get("time_med_s") is None:
                skipped.append((key, "no prediction"))
                continue
            rows.append(dict(suite=r["suite"], case=r["case"], method=r["method"],
                             bytes=r["bytes"], iters=r["iters"], pred=r["predicted_s"],
                             meas=r["time_med_s"]))
    if not rows:
        print("compare: no rows with both a prediction and a time", file=sys.stderr)
        return 1
    for r in rows:
        r["err"] = abs(r["pred"] - r["meas"]) / r["meas"]
    methods = sorted({r["method"] for r in rows})
    out = []
    med = statistics.median(r["err"] for r in rows)
    rho = spearman([r["pred"] for r in rows], [r["meas"] for r in rows])
    iters = sorted({r["iters"] for r in rows})
    out.append("Pairs: %d (case, method) rows with a prediction and a measured time "
               "(iterations per row: %s)." % (len(rows), ", ".join(map(str, iters))))
    out.append("")
    out.append("**Median relative error %.1f%%, Spearman rank correlation %s** "
               "(targets: <= 10%%, >= 0.95)." % (100 * med, "%.3f" % rho if rho is not None else "n/a"))
    out.append("")
    out.append("| method | pairs | median rel. error | worst rel. error | Spearman | median pred/meas |")
    out.append("|---|---|---|---|---|---|")
    for m in methods:
        rs = [r for r in rows if r["method"] == m]
        rh = spearman([r["pred"] for r in rs], [r["meas"] for r in rs])
        out.append("| %s | %d | %.1f%% | %.1f%% | %s | %.3f |" % (
            m, len(rs), 100 * statistics.median(r["err"] for r in rs),
            100 * max(r["err"] for r in rs), "%.3f" % rh if rh is not None else "n/a",
            statistics.median(r["pred"] / r["meas"] for r in rs)))
    out.append("")
    out.append("| suite | case | method | bytes | predicted (s) | measured (s) | pred/meas | rel. error |")
    out.append("|---|---|---|---|---|---|---|---|")
    for r in rows:
        out.append("| %s | %s | %s | %d | %.4f | %.4f | %.3f | %.1f%% |" % (
            r["suite"], r["case"], r["method"], r["bytes"], r["pred"], r["meas"],
            r["pred"] / r["meas"], 100 * r["err"]))
    if skipped:
        out.append("")
        out.append("Rows left out: " + ", ".join("%s (%s)" % s for s in skipped) + ".")
    text = "\n".join(out) + "\n"
    print(text)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "costmodel.md"), "w") as f:
        f.write(text)
    dat = os.path.join(a.out, "costmodel.dat")
    with open(dat, "w") as f:
        for i, m in enumerate(methods):
            f.write("# method %d %s\n" % (i, m))
            for r in rows:
                if r["method"] == m:
                    f.write("%.6g\t%.6g\t%s/%s\n" % (r["meas"], r["pred"], r["suite"], r["case"]))
            f.write("\n\n")
    if shutil.which("gnuplot"):
        png = os.path.join(a.out, "costmodel-scatter.png")
        lo = min(min(r["pred"], r["meas"]) for r in rows) / 1.5
        hi = max(max(r["pred"], r["meas"]) for r in rows) * 1.5
        tics, dec = [], 10.0 ** math.floor(math.log10(lo))
        while dec <= hi:
            tics += [m * dec for m in (1, 2, 3, 5) if lo <= m * dec <= hi]
            dec *= 10
        ticlist = ", ".join("'%g' %g" % (t, t) for t in tics)
        plots = ", ".join("'%s' index %d using 1:2 with points pt %d ps 1.3 title '%s'" % (
            dat, i, (i % 12) + 1, m) for i, m in enumerate(methods))
        script = """
set terminal pngcairo size 900,700 noenhanced
set output '%s'
set logscale xy
set xrange [%g:%g]
set yrange [%g:%g]
set xtics (%s)
set ytics (%s)
set xlabel 'measured time (s)'
set ylabel 'predicted time (s)'
set title 'xmesh cost model: predicted vs measured (median rel. error %.1f%%, Spearman %s)'
set key top left
set grid
plot x title 'predicted = measured' lc rgb 'gray' dt 2, x*1.1 notitle lc rgb '#cccccc' dt 3, x/1.1 notitle lc rgb '#cccccc' dt 3, %s
""" % (png, lo, hi, lo, hi, ticlist, ticlist, 100 * med, "%.3f" % rho if rho is not None else "n/a", plots)
        p = subprocess.run(["gnuplot"], input=script, text=True, capture_output=True)
        if p.returncode:
            print("compare: gnuplot failed: " + p.stderr, file=sys.stderr)
        else:
            print("chart: " + png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
