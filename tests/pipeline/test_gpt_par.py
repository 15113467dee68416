#!/usr/bin/env python3
"""Parallel GPT-2 (xmesh-train gpt under mpirun) against the serial reference.

Every run uses --check-serial: rank 0 also trains the serial model on the same
batches and the command fails unless the per-step losses agree within 1e-5
relative over steps 0-4 and 1e-4 up to step 19. Sets:
  mesh   one stage: DP 2x1, TP 1x2, DP x TP 2x2 (20 steps, padded vocabulary),
         refusal of 3 heads over tp 2, parameters after 3 steps vs serial
  s2/s3/s4  2, 3, 4 stages with mixed meshes: schedules x --delay-wgrad x comm
  signal runs in signal mode produce timing (no data moves) and a trace
usage: test_gpt_par.py SET TRAIN MPIEXEC [MPIEXEC_FLAGS...]
"""
import json
import os
import struct
import subprocess
import sys
import tempfile
from array import array

SET, TRAIN = sys.argv[1], sys.argv[2]
MPI = sys.argv[3:]
BASE = ["--heads", "4", "--channels", "32", "--seq", "16", "--batch", "4", "--no-progress"]
failures = 0


def run(n, args, expect_ok=True, quiet=False):
    global failures
    cmd = MPI + ["-n", str(n), "--oversubscribe", TRAIN, "gpt"] + BASE + args
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
    good = (p.returncode == 0) == expect_ok
    tail = [l for l in p.stdout.splitlines() if l.startswith(("check-serial", "gpt parallel", "MISMATCH", "xmesh-train"))]
    print(("ok  " if good else "FAIL"), " ".join(args), "|", " / ".join(tail[-3:]))
    if not good:
        failures += 1
        if not quiet:
            print(p.stdout[-3000:])
    return p


def load(path):
    b = open(path, "rb").read()
    a = array("f")
    a.frombytes(b[1024:])
    return struct.unpack("256i", b[:1024]), a


def matrix(n, layers, stage_args, combos):
    for sch, delay, comm in combos:
        args = ["--layers", str(layers), "--steps", "6", "--check-serial", "--microbatches", "4",
                "--schedule", sch, "--comm", comm] + stage_args + (["--delay-wgrad"] if delay else [])
        run(n, args)


def combos():
    c = [(s, d, "broadcast") for s in ("gpipe", "1f1b", "eager-1f1b") for d in (0, 1)]
    c += [(s, 1, comm) for s in ("1f1b", "eager-1f1b") for comm in ("sendrecv", "sendrecv-allgather", "blocking")]
    return c


if SET == "mesh":
    run(2, ["--layers", "2", "--steps", "6", "--check-serial", "--mesh", "2x1"])
    run(2, ["--layers", "2", "--steps", "6", "--check-serial", "--mesh", "1x2"])
    run(4, ["--layers", "2", "--steps", "20", "--check-serial", "--mesh", "2x2", "--vocab", "250",
            "--microbatches", "2"])
    run(3, ["--layers", "2", "--steps", "6", "--check-serial", "--dp", "3"])  # uneven: 4 rows over 3
    p = run(2, ["--layers", "2", "--steps", "2", "--mesh", "1x2", "--heads", "3", "--channels", "24"],
            expect_ok=False, quiet=True)
    if "3 heads cannot be split over tensor-parallel degree 2" not in p.stdout:
        print("FAIL: the refusal does not name heads and tp:\n" + p.stdout[-800:])
        failures += 1
    with tempfile.TemporaryDirectory() as d:
        par, ser = os.path.join(d, "par.bin"), os.path.join(d, "ser.bin")
        common = ["--layers", "2", "--steps", "3", "--vocab", "250"]
        run(4, common + ["--stages", "2", "--stage-mesh", "1x2,2x1", "--microbatches", "2", "--save", par])
        subprocess.run([TRAIN, "gpt", "--serial"] + BASE + common + ["--save", ser], check=True,
                       stdout=subprocess.DEVNULL)
        (h1, a), (h2, b) = load(par), load(ser)
        worst = max(abs(x - y) for x, y in zip(a, b))
        good = h1 == h2 and len(a) == len(b) and worst <= 2e-6
        print(("ok  " if good else "FAIL"), f"parameters after 3 steps vs serial: {len(a)} values, max abs diff {worst:.3g} (bound 2e-6)")
        failures += not good
elif SET == "s2":
    matrix(4, 4, ["--stages", "2", "--stage-mesh", "2x1,1x2"], combos())
elif SET == "s3":
    matrix(4, 4, ["--stages", "3", "--stage-mesh", "1x1,2x1,1x1"], combos())
    run(4, ["--layers", "2", "--steps", "20", "--check-serial", "--microbatches", "4", "--layout",
            "E|t*2|L", "--stage-mesh", "1x1,1x2,1x1", "--schedule", "eager-1f1b", "--delay-wgrad"])
elif SET == "s4":
    matrix(4, 4, ["--stages", "4"], combos()[:6] + [("eager-1f1b", 1, "blocking")])
elif SET == "signal":
    with tempfile.TemporaryDirectory() as d:
        js, tr = os.path.join(d, "s.json"), os.path.join(d, "t.json")
        run(4, ["--layers", "4", "--steps", "3", "--stages", "2", "--stage-mesh", "2x1,1x2",
                "--microbatches", "4", "--schedule", "eager-1f1b", "--delay-wgrad", "--comm", "signal",
                "--json", js, "--trace", tr])
        doc = json.load(open(js))
        steps = doc["steps"]
        good = len(steps) == 3 and all(s["step_seconds"] > 0 and len(s["bubble_per_stage"]) == 2 for s in steps) \
            and "predicted_s" in steps[-1]
        ev = json.load(open(tr))
        ev = ev["traceEvents"] if isinstance(ev, dict) else ev
        flows = {e.get("ph") for e in ev}
        good = good and {"s", "f"} <= flows
        print(("ok  " if good else "FAIL"), f"signal: {len(steps)} step records with timing and prediction; trace {len(ev)} events with flow arrows")
        failures += not good
        # the same with real transfers: every step record says what xmesh's progress and
        # waits took of each stage's CPU (xmesh_ctx_get_stats), > 0 where data moved
        run(4, ["--layers", "4", "--steps", "3", "--stages", "2", "--stage-mesh", "2x1,1x2",
                "--microbatches", "4", "--schedule", "eager-1f1b", "--delay-wgrad", "--comm",
                "broadcast", "--json", js])
        steps = json.load(open(js))["steps"]
        cpu = [s.get("xmesh_cpu_s_per_stage") for s in steps]
        good = len(steps) == 3 and all(c is not None and len(c) == 2 and min(c) >= 0 and max(c) > 0
                                       and max(c) < s["step_seconds"] * 2
                                       for c, s in zip(cpu, steps))
        print(("ok  " if good else "FAIL"), f"broadcast: xmesh CPU per stage and step {cpu}")
        failures += not good
        # stage costs, the stage graph, xmesh's plan predictions and the host's CPU in the
        # records; `xmesh-train schedule` fed with step k-1's stage costs and the plan
        # predictions gives step k's predicted_s (the same generator and simulator)
        run(4, ["--layers", "4", "--steps", "4", "--stages", "2", "--stage-mesh", "2x1,1x2",
                "--microbatches", "4", "--schedule", "1f1b", "--comm", "broadcast", "--json", js])
        doc = json.load(open(js))
        pipe, steps = doc["pipeline"], doc["steps"]
        good = pipe.get("edges") == [[0, 1]] and len(pipe.get("plan_predicted_s", [])) == 2 \
            and min(pipe["plan_predicted_s"]) > 0
        for st in steps:
            c, h = st.get("stage_costs_s") or {}, st.get("host_cpu_s") or {}
            good = good and all(len(c.get(k, [])) == 2 and min(c[k]) > 0 for k in "fiw")
            # every core-second of the step is user, system, softirq, idle or stolen by the
            # hypervisor (10 ms ticks)
            tot = sum(h.get(k, 0) for k in ("user", "system", "softirq", "idle", "steal"))
            want = h.get("cores", 0) * st["step_seconds"]
            good = good and h.get("cores", 0) >= 1 and abs(tot - want) <= 0.02 * h["cores"] + 0.1 * want
            # the cores' busy seconds add up to the host's (ticks of 10 ms per core)
            busy = h.get("user", 0) + h.get("system", 0) + h.get("softirq", 0)
            pc = h.get("busy_per_core", [])
            good = good and len(pc) == h.get("cores") and abs(sum(pc) - busy) <= 0.02 * len(pc) + 0.02
        sims = []
        for prev, st in zip(steps[1:], steps[2:]):
            c = prev["stage_costs_s"]
            cmd = [TRAIN, "schedule", "--schedule", "1f1b", "--stages", "2", "--microbatches", "4",
                   "--f", ",".join(map(repr, c["f"])), "--i", ",".join(map(repr, c["i"])),
                   "--w", ",".join(map(repr, c["w"])),
                   "--xfer", ",".join(map(repr, pipe["plan_predicted_s"])), "--json", js + ".sim"]
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            sim = json.load(open(js + ".sim"))["step_s"] if p.returncode == 0 else None
            sims.append((sim, st.get("predicted_s")))
            good = good and sim is not None and abs(sim - st["predicted_s"]) <= 1e-6 * st["predicted_s"]
        print(("ok  " if good else "FAIL"), f"stage costs, graph, plan predictions, host CPU; "
              f"schedule CLI vs the trainer's predicted_s {sims}")
        failures += not good
else:
    sys.exit(f"unknown set {SET}")
print(f"{SET}: {'FAILED' if failures else 'passed'} ({failures} failures)")
sys.exit(1 if failures else 0)
