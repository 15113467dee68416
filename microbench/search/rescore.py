#!/usr/bin/env python3
"""Re-scores the layout search's model against the measurements of earlier validation runs.

For every RUN directory given (one holding validation.json from validate.py and the cluster
file the run calibrated at its start, cluster-calibrated.txt), predicts each measured
configuration again with `xmesh-train gpt plan --eval --json` of --train (the full model only,
the run's own model flags and cluster file; --plan-args adds flags, e.g. an ablation) and
prints, per run, the metrics of validate.py (precision@5, Kendall tau-b, top-1 regret, median
error) and pred/meas grouped by stage count and schedule. Nothing is run on the cluster.

  rescore.py --train build/pipeline/xmesh-train RUN... [--json OUT.json] [--jobs 2]

--burst SIZE (tc units, e.g. 64kb: the emulated NIC's token bucket, XMESH_SV_BURST) prices
with a copy of each run's cluster file that has `nic_burst_bytes` (written under --workdir).

--json writes every prediction and the metrics, so two trees' models can be compared
(--compare OLD.json prints the metrics of both side by side).

A run still going (no validation.json yet) is re-assembled from what it has written: each
runs/cNN-rK.log's command line (the model and configuration flags) and cNN-rK.json's step
records (the median of the steps after --warmup, default 2 as the validation's; the
configuration's time the median of its repeats, as validate.py does).
"""
import argparse
import concurrent.futures
import glob
import json
import os
import re
import shlex
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from validate import metrics, tc_size, with_burst  # noqa: E402  (the validation's own)


def cluster_of(run):
    """The run's start calibration: RUN/cluster-calibrated.txt (its recorded path otherwise)."""
    p = os.path.join(run, "cluster-calibrated.txt")
    if os.path.exists(p):
        return p
    q = ""
    if os.path.exists(os.path.join(run, "validation.json")):
        with open(os.path.join(run, "validation.json")) as f:
            q = json.load(f).get("cluster_file", "")
    if q and os.path.exists(q):
        return q
    raise SystemExit("rescore: %s has no cluster-calibrated.txt and its cluster_file %r is "
                     "missing" % (run, q))


CFG_FLAGS = ("--layout", "--stage-mesh", "--stage-strategy", "--schedule", "--microbatches",
             "--overlap")


def assemble(run, warmup):
    """validation.json's fields from a run's runs/cNN-rK.{log,json} (a run still going)."""
    logs = sorted(glob.glob(os.path.join(run, "runs", "c*-r*.log")))
    per = {}
    model = None
    for log in logs:
        m = re.search(r"c(\d+)-r(\d+)\.log$", log)
        with open(log) as f:
            first = f.readline()
        if not m or not first.startswith("$ "):
            continue
        cmd = shlex.split(first[2:])
        if "gpt" not in cmd or "--layout" not in cmd:
            continue
        g = cmd.index("gpt")
        lay = cmd.index("--layout")
        model = model or " ".join(shlex.quote(x) for x in cmd[g + 1:lay])
        flags = []
        for k in CFG_FLAGS:
            if k in cmd:
                flags += [k, cmd[cmd.index(k) + 1]]
        try:
            with open(log[:-4] + ".json") as f:
                st = json.load(f).get("steps", [])[warmup:]
        except (OSError, ValueError):
            continue
        t = [x["step_seconds"] for x in st if x.get("step_seconds")]
        r = [x["predicted_s"] / x["step_seconds"] for x in st
             if x.get("predicted_s") and x.get("step_seconds")]
        if not t:
            continue
        e = per.setdefault(int(m.group(1)), {"flags": flags, "reps": [], "pm": []})
        e["reps"].append(statistics.median(t))
        e["pm"] += r
    if model is None:
        raise SystemExit("rescore: %s has neither validation.json nor runs/*.log with a "
                         "configuration" % run)
    cfgs = []
    for i, e in sorted(per.items()):
        d = dict(zip(e["flags"][0::2], e["flags"][1::2]))
        name = "%s / %s / %s / %s M%s%s" % (d["--layout"], d["--stage-mesh"],
                                             d["--stage-strategy"], d["--schedule"],
                                             d["--microbatches"],
                                             " / " + d["--overlap"] if "--overlap" in d else "")
        cfgs.append({"index": i, "name": name, "flags": e["flags"],
                     "measured_s": statistics.median(e["reps"]),
                     "measured_min_s": min(e["reps"]), "measured_max_s": max(e["reps"]),
                     "repeats_s": e["reps"],
                     "schedule_pred_over_meas": statistics.median(e["pm"]) if e["pm"] else None})
    return {"model_args": model, "hosts": 4, "ranks": 8, "rate_mbit": None,
            "configurations": cfgs}


def load_run(run, warmup):
    p = os.path.join(run, "validation.json")
    if os.path.exists(p):
        with open(p) as f:
            return json.load(f)
    return assemble(run, warmup)


def predict(train, doc, flags, cluster, extra):
    cmd = [train, "gpt", "plan", "--eval", "--json", "--ranks", str(doc.get("ranks", 8)),
           "--hosts", str(doc.get("hosts", 4))]
    cmd += shlex.split(doc["model_args"]) + list(flags) + ["--cluster", cluster] + extra
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return None
    return json.loads(p.stdout)["step_s"]


def group_key(name):
    """('4 st', '1f1b', 'M4', 'dp') from 'E,t|t|t|t,L / 2,2,2,2 / dp,dp,dp,dp / 1f1b M4'."""
    parts = [x.strip() for x in name.split(" / ")]
    S = parts[0].count("|") + 1
    sched, m = parts[3].split()
    strat = parts[2].split(",")[0]
    return S, sched, m, strat, parts[1]


def score(run, train, extra, jobs, burst, workdir, warmup):
    doc = load_run(run, warmup)
    cl = cluster_of(run)
    if burst:
        os.makedirs(workdir, exist_ok=True)
        dst = os.path.join(workdir, run.strip("/").replace("/", "+") + ".txt")
        with_burst(cl, dst, burst)
        cl = dst
    cfgs = [c for c in doc["configurations"] if c.get("measured_s")]
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as ex:
        pred = list(ex.map(lambda c: predict(train, doc, c["flags"], cl, extra), cfgs))
    meas = [c["measured_s"] for c in cfgs]
    lo = [c.get("measured_min_s") for c in cfgs]
    hi = [c.get("measured_max_s") for c in cfgs]
    m = metrics(pred, meas, lo=lo if None not in lo else None, hi=hi if None not in hi else None)
    rows = [{"name": c["name"], "measured_s": c["measured_s"], "predicted_s": p,
             "sched_pm": c.get("schedule_pred_over_meas")} for c, p in zip(cfgs, pred)]
    return {"run": run, "cluster": cl, "model_args": doc["model_args"],
            "rate_mbit": doc.get("rate_mbit"), "metrics": m, "rows": rows}


def fmt_metrics(m):
    if "precision_at_5" not in m:
        return "P@5 -  tau -  regret -  med.err -"
    return "P@5 %.2f  tau %.3f  regret %4.1f%%  med.err %4.1f%%" % (
        m["precision_at_5"], m["kendall_tau"], 100 * m["top1_regret"], 100 * m["median_error"])


def by_group(rows):
    """pred/meas per (stages, schedule): median [min, max] and count."""
    g = {}
    for r in rows:
        if not r["predicted_s"]:
            continue
        S, sched, _, _, _ = group_key(r["name"])
        g.setdefault((S, sched if S > 1 else "-"), []).append(r["predicted_s"] / r["measured_s"])
    return {k: v for k, v in sorted(g.items())}


def report(res, old=None):
    print("== %s (%s, %s Mbit/s)" % (res["run"], res["model_args"], res["rate_mbit"]))
    print("   now    " + fmt_metrics(res["metrics"]))
    if old:
        print("   before " + fmt_metrics(old["metrics"]))
    oldg = by_group(old["rows"]) if old else {}
    for k, v in by_group(res["rows"]).items():
        s = "   S=%d %-10s n=%2d pred/meas median %.2f [%.2f, %.2f]" % (
            k[0], k[1], len(v), statistics.median(v), min(v), max(v))
        if k in oldg:
            o = oldg[k]
            s += "   before %.2f [%.2f, %.2f]" % (statistics.median(o), min(o), max(o))
        print(s)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="run directories (validation.json, cluster file)")
    ap.add_argument("--train", required=True, help="path of xmesh-train")
    ap.add_argument("--plan-args", default="", help="extra flags for every prediction")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", default="", help="write the predictions and metrics here")
    ap.add_argument("--compare", default="", help="a --json of an earlier re-score to compare")
    ap.add_argument("--rows", action="store_true", help="print every configuration's pred/meas")
    ap.add_argument("--burst", default="", help="NIC token-bucket burst (tc units: 64kb; "
                    "default none) priced for every run")
    ap.add_argument("--warmup", type=int, default=2, help="steps dropped per run when a run "
                    "is re-assembled from runs/ (no validation.json yet)")
    ap.add_argument("--workdir", default="/tmp/rescore-clusters",
                    help="where the cluster files with a burst are written")
    a = ap.parse_args()
    old = {}
    if a.compare:
        with open(a.compare) as f:
            old = {r["run"]: r for r in json.load(f)}
    out = []
    for run in a.runs:
        res = score(run, a.train, shlex.split(a.plan_args), a.jobs,
                    tc_size(a.burst) if a.burst else 0, a.workdir, a.warmup)
        out.append(res)
        report(res, old.get(run))
        if a.rows:
            o = {r["name"]: r for r in old.get(run, {}).get("rows", [])}
            for r in res["rows"]:
                p = r["predicted_s"]
                b = o.get(r["name"], {}).get("predicted_s")
                print("     %-60s meas %.4f pred %s p/m %s%s%s" % (
                    r["name"], r["measured_s"], "%.4f" % p if p else "-",
                    "%.2f" % (p / r["measured_s"]) if p else "-",
                    "  before %.2f" % (b / r["measured_s"]) if b else "",
                    "  sched %.2f" % r["sched_pm"] if r["sched_pm"] else ""))
        sys.stdout.flush()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
