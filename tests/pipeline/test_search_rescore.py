#!/usr/bin/env python3
"""microbench/search/rescore.py's pieces that need no trainer (issue 40 item 2): a run still
going re-assembled from its runs/cNN-rK.{log,json} (names, flags, medians after the warm-up,
the schedule's pred/meas), tc sizes, and the cluster file copy with nic_burst_bytes."""
import json
import os
import sys
import tempfile

ROOT = sys.argv[1]
sys.path.insert(0, os.path.join(ROOT, "microbench", "search"))
import rescore  # noqa: E402
import validate  # noqa: E402

fails = []


def check(ok, msg):
    if not ok:
        fails.append(msg)


def write_run(d, idx, rep, flags, steps):
    cmd = ("$ mpirun -np 8 /x/xmesh-train gpt --layers 4 --heads 6 --channels 192 --seq 64 "
           "--batch 16 " + " ".join("'%s'" % f if "|" in f else f for f in flags) +
           " --steps 6 --json x\n")
    with open(os.path.join(d, "runs", "c%02d-r%d.log" % (idx, rep)), "w") as f:
        f.write(cmd + "noise\n")
    with open(os.path.join(d, "runs", "c%02d-r%d.json" % (idx, rep)), "w") as f:
        json.dump({"steps": [{"step_seconds": s, "predicted_s": p} for s, p in steps]}, f)


with tempfile.TemporaryDirectory() as d:
    os.makedirs(os.path.join(d, "runs"))
    a = ["--layout", "E,t|t,L", "--stage-mesh", "4,4", "--stage-strategy", "dp,dp",
         "--schedule", "gpipe", "--microbatches", "4"]
    b = ["--layout", "E,t*2,L", "--stage-mesh", "8", "--stage-strategy", "dp", "--schedule",
         "1f1b", "--microbatches", "1", "--overlap", "defer-grad"]
    # warm-up 2: repeat 0 keeps 0.3, 0.5, 0.4 -> 0.4; repeat 1 0.6, 0.6, 0.2 -> 0.6
    write_run(d, 0, 0, a, [(9, 1), (9, 1), (0.3, 0.3), (0.5, 0.25), (0.4, 0.4)])
    write_run(d, 0, 1, a, [(9, 1), (9, 1), (0.6, 0.3), (0.6, 0.3), (0.2, 0.2)])
    write_run(d, 3, 0, b, [(9, 1), (9, 1), (1.0, None), (2.0, None), (3.0, None)])
    doc = rescore.load_run(d, 2)
    check(doc["model_args"] == "--layers 4 --heads 6 --channels 192 --seq 64 --batch 16",
          "model args %r" % doc["model_args"])
    c = doc["configurations"]
    check(len(c) == 2, "%d configurations" % len(c))
    if len(c) == 2:
        check(c[0]["name"] == validate.cfg_name(("E,t|t,L", "4,4", "dp,dp", "gpipe", 4)),
              "name %r" % c[0]["name"])
        check(c[0]["flags"] == a, "flags %r" % c[0]["flags"])
        check(c[0]["repeats_s"] == [0.4, 0.6] and c[0]["measured_s"] == 0.5 and
              c[0]["measured_min_s"] == 0.4 and c[0]["measured_max_s"] == 0.6,
              "repeats %r measured %r" % (c[0]["repeats_s"], c[0]["measured_s"]))
        # pred/meas of the kept steps: 1, 0.5, 1, 0.5, 0.5, 1 -> median 0.75
        check(abs(c[0]["schedule_pred_over_meas"] - 0.75) < 1e-12,
              "sched p/m %r" % c[0]["schedule_pred_over_meas"])
        check(c[1]["index"] == 3 and c[1]["flags"] == b and c[1]["measured_s"] == 2.0 and
              c[1]["schedule_pred_over_meas"] is None and c[1]["name"].endswith(" / defer-grad"),
              "second %r" % c[1])
    # a directory with neither: a clear error naming it
    e = os.path.join(d, "empty")
    os.makedirs(os.path.join(e, "runs"))
    try:
        rescore.load_run(e, 2)
        check(False, "empty run accepted")
    except SystemExit as x:
        check(e in str(x), "message %s" % x)
    # tc sizes and the burst copy
    for t, v in (("64kb", 65536), ("256k", 262144), ("1500", 1500), ("512kbit", 65536)):
        check(validate.tc_size(t) == v, "tc_size(%s) = %r" % (t, validate.tc_size(t)))
    try:
        validate.tc_size("fast")
        check(False, "tc_size('fast') accepted")
    except ValueError as x:
        check("'fast'" in str(x), "message %s" % x)
    src, dst = os.path.join(d, "c.txt"), os.path.join(d, "c2.txt")
    with open(src, "w") as f:
        f.write("nic_gbps = 0.2\nnic_burst_bytes = 1  # old\n[compute]\ncpuset 1 0-1 0.1\n")
    validate.with_burst(src, dst, 65536)
    with open(dst) as f:
        text = f.read()
    check("nic_burst_bytes = 1" not in text and text.count("nic_burst_bytes") == 1 and
          text.rstrip().endswith("[cluster]\n# the emulated NICs' token bucket (cluster.sh -b)\n"
                                 "nic_burst_bytes = 65536".rstrip()) and "cpuset 1 0-1 0.1" in text,
          "burst copy:\n%s" % text)

for m in fails:
    print("FAIL", m)
print("pipeline.search.rescore: %s" % ("OK" if not fails else "%d failures" % len(fails)))
sys.exit(1 if fails else 0)
