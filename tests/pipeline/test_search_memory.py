#!/usr/bin/env python3
"""The search's memory model against a real run (issue 21 item 5).

Runs xmesh-train gpt for 2 steps under mpirun with --json, and `xmesh-train gpt plan
--eval --json` on the same configuration; per rank, the measured parameter, AdamW and
gradient bytes (plus the compute copies of sharded parameters) and the peak activation
bytes of its stage (the stage's allocations, over the steps) must agree with the
model's figure for that stage within 10%. usage:
  test_search_memory.py CASE TRAIN MPIEXEC [MPIEXEC_FLAGS...]
"""
import json
import os
import subprocess
import sys
import tempfile

CASE, TRAIN = sys.argv[1], sys.argv[2]
MPI = sys.argv[3:]
MODEL = ["--heads", "4", "--channels", "32", "--seq", "16", "--batch", "4", "--layers", "2"]
CASES = {
    "megatron.pipe": (4, ["--layout", "E,t|t,L", "--stage-mesh", "2,2", "--strategy", "megatron",
                          "--microbatches", "2"]),
    "3d.gpipe": (4, ["--stage-mesh", "2x2", "--strategy", "3d", "--microbatches", "2",
                     "--schedule", "gpipe"]),
    "mixed.eager": (4, ["--layout", "E,t|t,L", "--stage-mesh", "2,2", "--stage-strategy",
                        "dp,megatron", "--microbatches", "2", "--schedule", "eager-1f1b"]),
    "axonn": (8, ["--stage-mesh", "2x2x2", "--strategy", "axonn"]),
}
if CASE == "auto":
    # --strategy auto: the run takes the search's best (the same as `gpt plan --top 1` on the
    # same ranks and hosts) and trains it equal to the serial model.
    run = MPI + ["-n", "4", "--oversubscribe", TRAIN, "gpt"] + MODEL + [
        "--strategy", "auto", "--steps", "5", "--check-serial", "--no-progress"]
    r = subprocess.run(run, capture_output=True, text=True, timeout=100)
    out = r.stdout + r.stderr
    if r.returncode or "check-serial: OK" not in out:
        sys.exit("auto run failed (%d): %s\n%s" % (r.returncode, " ".join(run), out[-2000:]))
    line = [l for l in out.splitlines() if l.startswith("--strategy auto")]
    if not line:
        sys.exit("no '--strategy auto' line in:\n" + out[-2000:])
    pl = subprocess.run([TRAIN, "gpt", "plan", "--json", "--top", "1", "--ranks", "4", "--hosts",
                         "1"] + MODEL, capture_output=True, text=True, timeout=60)
    best = json.loads(pl.stdout)["configurations"][0]
    want = "--layout '%s' --stage-mesh %s --stage-strategy %s --schedule %s --microbatches %d" % (
        best["layout"], best["stage_mesh"], best["stage_strategy"], best["schedule"],
        best["microbatches"])
    if want not in line[0]:
        sys.exit("auto chose\n  %s\nthe plan's best is\n  %s" % (line[0], want))
    print(line[0])
    print("auto: the plan's best, trained equal to the serial model")
    sys.exit(0)
n, flags = CASES[CASE]
with tempfile.TemporaryDirectory() as d:
    js = os.path.join(d, "run.json")
    run = MPI + ["-n", str(n), "--oversubscribe", TRAIN, "gpt"] + MODEL + flags + [
        "--steps", "2", "--no-progress", "--json", js]
    r = subprocess.run(run, capture_output=True, text=True, timeout=100)
    if r.returncode:
        sys.exit("run failed (%d): %s\n%s" % (r.returncode, " ".join(run), r.stderr[-2000:]))
    meas = json.load(open(js))
    ev = [TRAIN, "gpt", "plan", "--eval", "--json", "--ranks", str(n)] + MODEL + flags
    r = subprocess.run(ev, capture_output=True, text=True, timeout=60)
    if r.returncode:
        sys.exit("plan --eval failed (%d): %s\n%s" % (r.returncode, " ".join(ev), r.stderr))
    model = json.loads(r.stdout)

peak = {}
for st in meas["steps"]:
    for s, b in enumerate(st["peak_activation_bytes"]):
        peak[s] = max(peak.get(s, 0), b)
bad = 0
for m in meas["summary"]["memory_per_rank"]:
    s = m["stage"]
    st = model["stages"][s]
    # The run's compute_param_bytes counts every parameter's compute form, also where it is
    # the stored tensor itself (unsharded), so the components are compared one by one, and
    # the total as stored + AdamW + gradients + activations (the compute copies of sharded
    # parameters, which the search adds, are the compute_param_bytes component).
    pairs = [("stored", m["param_bytes"], st["stored_param_bytes"]),
             ("adamw", m["optimizer_bytes"], 2 * st["stored_param_bytes"]),
             ("grads", m["grad_bytes"], st["grad_bytes"]),
             ("compute", m["compute_param_bytes"], st["compute_param_bytes"]),
             ("activations", peak[s], st["activation_bytes"])]
    tot_m = m["param_bytes"] + m["optimizer_bytes"] + m["grad_bytes"] + peak[s]
    tot_p = 3 * st["stored_param_bytes"] + st["grad_bytes"] + st["activation_bytes"]
    pairs.append(("total", tot_m, tot_p))
    line = []
    for name, meas_v, pred in pairs:
        err = abs(pred - meas_v) / meas_v if meas_v else (0 if pred == 0 else 1)
        line.append("%s %d/%.0f (%.1f%%)" % (name, meas_v, pred, 100 * err))
        if err > 0.10:
            bad += 1
    print("rank %d stage %d measured/model: %s" % (m["rank"], s, ", ".join(line)))
if bad:
    sys.exit("%s: %d figures off by more than 10%%" % (CASE, bad))
print("%s: memory model within 10%% on every rank and component" % CASE)
