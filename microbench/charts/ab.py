#!/usr/bin/env python3
"""Side-by-side table of xmesh-bench JSON results of the same cases under two or more
configurations (e.g. the executor before and after a change), joined by (suite, case,
bytes, method): median seconds [min, max] and t/LB per configuration, the ratio of each
configuration's median to the first one's, and whether their [min, max] intervals overlap.
Also the 1-to-m growth (largest receiver case over 1x1) per configuration.

usage: ab.py OUT_PREFIX LABEL=FILE.json[,FILE.json...] [LABEL=...]
writes OUT_PREFIX.md and OUT_PREFIX.json and prints the table
"""
import json
import sys


def rows_of(paths):
    out = {}
    for p in paths.split(","):
        with open(p) as f:
            d = json.load(f)
        extra = d.get("config", {}).get("closing_barrier", 0)
        for r in d["rows"]:
            if r.get("status") != "ok":
                continue
            key = (r["suite"], r["case"], r["bytes"], r["method"], extra)
            out[key] = r
    return out


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    prefix = sys.argv[1]
    confs = []
    for a in sys.argv[2:]:
        label, paths = a.split("=", 1)
        confs.append((label, rows_of(paths)))
    keys = sorted(set().union(*[set(c[1]) for c in confs]),
                  key=lambda k: (k[0], k[4], k[1].zfill(8), k[2], k[3]))
    base = confs[0][0]
    head = "| suite | barrier | case | " + " | ".join(
        f"{l}: s [min, max] (t/LB)" for l, _ in confs) + " | " + " | ".join(
        f"{l}/{base}" for l, _ in confs[1:]) + " |"
    lines = [head, "|---" * (3 + len(confs) + len(confs) - 1) + "|"]
    recs = []
    bar = {0: "none", 1: "MPI_Barrier", 2: "spinning"}
    for k in keys:
        cells, rec = [], {"suite": k[0], "case": k[1], "bytes": k[2], "method": k[3],
                          "barrier": bar.get(k[4], k[4])}
        for l, rows in confs:
            r = rows.get(k)
            if not r:
                cells.append("-")
                continue
            if r.get("wrong", 0):
                raise SystemExit(f"{l}: {k} has {r['wrong']} wrong elements")
            cells.append(f"{r['time_med_s']:.3f} [{r['time_min_s']:.3f}, {r['time_max_s']:.3f}] "
                         f"({r['time_over_lb']:.3f})")
            rec[l] = {"med": r["time_med_s"], "min": r["time_min_s"], "max": r["time_max_s"],
                      "t_over_lb": r["time_over_lb"], "lb": r["lower_bound_s"],
                      "pred_over_t": r.get("predicted_over_time")}
        for l, rows in confs[1:]:
            if base in rec and l in rec:
                ra = rec[l]["med"] / rec[base]["med"]
                sep = ("faster" if rec[l]["max"] < rec[base]["min"] else
                       "slower" if rec[l]["min"] > rec[base]["max"] else "tie")
                cells.append(f"{ra:.3f} ({sep})")
                rec[f"{l}/{base}"] = {"ratio": ra, "intervals": sep}
            else:
                cells.append("-")
        lines.append(f"| {k[0]} | {bar.get(k[4], k[4])} | {k[1]} | " + " | ".join(cells) + " |")
        recs.append(rec)
    for l, rows in confs:
        one = {k[1]: v for k, v in rows.items() if k[0] == "1-to-m" and k[3] == "xmesh"}
        if "1x1" in one and "4x2" in one:
            g = one["4x2"]["time_med_s"] / one["1x1"]["time_med_s"] - 1
            lines.append(f"\n{l}: 1-to-m growth 1x1 -> 4x2: {100 * g:+.1f}% "
                         f"({one['1x1']['time_med_s']:.3f} -> {one['4x2']['time_med_s']:.3f} s)")
    txt = "\n".join(lines) + "\n"
    with open(prefix + ".md", "w") as f:
        f.write(txt)
    with open(prefix + ".json", "w") as f:
        json.dump(recs, f, indent=1)
    print(txt)


if __name__ == "__main__":
    main()
