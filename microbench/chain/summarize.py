#!/usr/bin/env python3
"""Chain model against the executor (issue 25 item 4): reads the JSON of
`xmesh-bench -s chain` runs (one file per configuration) and writes a table
of the model's prediction over the measured median, per chain length H (NIC
hops) and chunk count K, with min/max, as markdown and JSON.

usage: summarize.py OUT_PREFIX LABEL=FILE.json [LABEL=FILE.json ...]
"""
import json
import statistics
import sys


def load(path):
    with open(path) as f:
        d = json.load(f)
    m = d["model"]
    # the resolved chunk (newer files); older ones have only the variable
    chunk = int(m.get("chunk_bytes") or m.get("XMESH_CHUNK_BYTES") or 262144)
    rows = []
    for r in d["rows"]:
        if r.get("status") != "ok" or r.get("method") != "xmesh":
            continue
        if r.get("wrong", 0):
            raise SystemExit("%s: case %s has wrong elements" % (path, r["case"]))
        H = int(r["case"][1:])
        K = max(1, -(-int(r["bytes"]) // chunk))
        pred = r.get("predicted_s")
        rows.append({"H": H, "K": K, "bytes": r["bytes"], "t_med": r["time_med_s"],
                     "t_min": r["time_min_s"], "t_max": r["time_max_s"], "pred": pred,
                     "pred_over_t": pred / r["time_med_s"] if pred else None})
    return chunk, rows


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    out = sys.argv[1]
    result, md = {}, []
    for arg in sys.argv[2:]:
        label, path = arg.split("=", 1)
        chunk, rows = load(path)
        result[label] = {"chunk_bytes": chunk, "rows": rows}
        Hs = sorted({r["H"] for r in rows})
        Ks = sorted({r["K"] for r in rows})
        md.append("### %s (chunk %d B)\n" % (label, chunk))
        md.append("predicted / measured median (measured median s [min, max]); rows: NIC hops H, "
                  "columns: chunks K\n")
        md.append("| H \\ K | " + " | ".join(str(k) for k in Ks) + " |")
        md.append("|---" * (len(Ks) + 1) + "|")
        for H in Hs:
            cells = []
            for K in Ks:
                r = [x for x in rows if x["H"] == H and x["K"] == K]
                if not r or r[0]["pred_over_t"] is None:
                    cells.append("-")
                    continue
                r = r[0]
                cells.append("%.3f (%.4f [%.4f, %.4f])" % (r["pred_over_t"], r["t_med"],
                                                            r["t_min"], r["t_max"]))
            md.append("| %d | " % H + " | ".join(cells) + " |")
        ratios = [r["pred_over_t"] for r in rows if r["pred_over_t"]]
        if ratios:
            within = sum(1 for x in ratios if abs(x - 1) <= 0.05)
            md.append("\npred/t: median %.3f, min %.3f, max %.3f; within 5%%: %d of %d\n" % (
                statistics.median(ratios), min(ratios), max(ratios), within, len(ratios)))
            result[label]["summary"] = {"median": statistics.median(ratios), "min": min(ratios),
                                        "max": max(ratios), "within_5pct": within,
                                        "n": len(ratios)}
    with open(out + ".json", "w") as f:
        json.dump(result, f, indent=1)
    with open(out + ".md", "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
