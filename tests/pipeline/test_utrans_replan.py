#!/usr/bin/env python3
"""xmesh-train utransformer --delay-wgrad re-plans after the first step (pipe/replan.h, shared
with gpt) and writes the same pipeline step fields as xmesh-train gpt.

Checks: a 2-stage tensor-parallel / data-parallel pipeline (1x2 -> 2x1) with eager-1f1b and
--delay-wgrad matches the serial reference (--check-serial) while re-planning exactly once
(--print-schedule shows the measured costs and the new schedule); without --delay-wgrad there is
no re-plan; every step record has exactly gpt's step keys (the rate key is images_per_s instead
of tokens_per_s), predicted_s from step 1 on, per-stage arrays of length 2 and non-zero peak
activation bytes.
usage: test_utrans_replan.py TRAIN MPIEXEC [MPIEXEC_FLAGS...]
"""
import json
import os
import subprocess
import sys
import tempfile

TRAIN = sys.argv[1]
MPI = sys.argv[2:]
failures = 0


def check(good, what):
    global failures
    print(("ok  " if good else "FAIL"), what)
    failures += not good


def run(n, args):
    cmd = MPI + ["-n", str(n), "--oversubscribe", TRAIN] + args
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
    if p.returncode != 0:
        print(p.stdout[-3000:])
    return p


with tempfile.TemporaryDirectory() as d:
    ut_js, gpt_js = os.path.join(d, "ut.json"), os.path.join(d, "gpt.json")
    ut = ["utransformer", "--base-channels", "4", "--batch", "8", "--microbatches", "4",
          "--stages", "2", "--stage-mesh", "1x2,2x1", "--schedule", "eager-1f1b", "--steps", "6",
          "--no-progress", "--print-schedule"]
    p = run(4, ut + ["--delay-wgrad", "--check-serial", "--json", ut_js])
    check(p.returncode == 0 and "check-serial: OK" in p.stdout,
          "utransformer 1x2 -> 2x1, eager-1f1b, --delay-wgrad: losses equal the serial reference")
    n = p.stdout.count("# re-planned with measured costs")
    after = p.stdout.split("# re-planned with measured costs", 1)[-1]
    check(n == 1 and "schedule eager-1f1b+dw S=2 M=4" in after,
          f"re-planned once after the first step ({n} times), new schedule printed")
    q = run(4, ut)
    check(q.returncode == 0 and "re-planned" not in q.stdout, "no re-plan without --delay-wgrad")
    g = run(4, ["gpt", "--heads", "4", "--channels", "32", "--seq", "16", "--batch", "4",
                "--layers", "2", "--steps", "2", "--stages", "2", "--stage-mesh", "1x2,2x1",
                "--microbatches", "2", "--schedule", "eager-1f1b", "--delay-wgrad",
                "--no-progress", "--json", gpt_js])
    check(g.returncode == 0, "gpt reference run for the step keys")
    if p.returncode == 0 and g.returncode == 0:
        us, gs = json.load(open(ut_js))["steps"], json.load(open(gpt_js))["steps"]
        gkeys = (set(gs[-1].keys()) - {"tokens_per_s"}) | {"images_per_s"}
        opt = {"predicted_s", "predicted_bubble"}  # predictions exist from the first re-plan on
        bad = [s["step"] for s in us if set(s.keys()) | opt != gkeys | opt]
        check(not bad and "predicted_s" in gkeys,
              f"step records have gpt's keys ({sorted(gkeys)}); steps differing: {bad}")
        check(len(us) == 6 and all("predicted_s" in s and s["predicted_s"] > 0 for s in us[1:]),
              "predicted_s on every step from step 1")
        check(all(len(s["bubble_per_stage"]) == 2 and len(s["peak_activation_microbatches"]) == 2
                  and len(s["peak_activation_bytes"]) == 2 and min(s["peak_activation_bytes"]) > 0
                  and s["compute_s"] > 0 and s["boxing_s"] >= 0 for s in us),
              "per-stage bubble, peak microbatches and bytes; compute and boxing seconds")
    # Peak activation memory is measured (bytes held by the SBP tapes, allocated when a
    # micro-batch's forward runs and freed after its weight gradients): with 8 micro-batches on 2
    # stages, 1F1B holds at most 2 on stage 0 where GPipe holds all 8, so its measured peak must be
    # well below GPipe's (not a formula: a regression to allocating every micro-batch up front
    # makes them equal).
    peaks = {}
    for sched in ("gpipe", "1f1b"):
        js = os.path.join(d, sched + ".json")
        r = run(2, ["utransformer", "--base-channels", "4", "--batch", "8", "--microbatches", "8",
                    "--stages", "2", "--schedule", sched, "--steps", "2", "--no-progress",
                    "--json", js])
        if r.returncode == 0:
            st = json.load(open(js))["steps"][-1]
            peaks[sched] = (st["peak_activation_microbatches"], st["peak_activation_bytes"])
    check(len(peaks) == 2 and peaks["gpipe"][0][0] == 8 and peaks["1f1b"][0][0] == 2
          and 0 < peaks["1f1b"][1][0] * 2 < peaks["gpipe"][1][0],
          f"measured peak activation bytes, 1f1b below gpipe on stage 0: {peaks}")
print(f"utrans replan: {'FAILED' if failures else 'passed'} ({failures} failures)")
sys.exit(1 if failures else 0)
