#!/usr/bin/env python3
"""Virtual stages and recomputation in the GPT-2 model (issue 23), through xmesh-train gpt.

Every run uses --check-serial: rank 0 also trains the serial model on the same batches and the
command exits non-zero unless every step's loss agrees within 1e-5 relative (steps 0-4) and 1e-4
(to step 19). Each case passes on exit code 0 AND on the data: the parameters after the run
(--save, gathered from every stage) equal the serial run's within 2e-6 (tied wte included: on the
V shape the embedding and the head stage share group 0), and the step JSON has one record per step.
Sets:
  r2   2 rank groups x 2 chunks, mixed meshes (4 ranks): every new schedule x recompute
  r3   3 groups x 2 chunks (5 ranks), r4: 4 groups x 2 chunks (6 ranks)
  long 20 steps (1e-4 over 20) with zb-v + block recomputation
  cap  --max-activation-bytes: a cap between the recomputing and the plain peak makes the
       schedule recompute and the measured peak (every step, every stage) stays under it; a cap
       below the smallest reachable peak is refused, naming it
  bad  refusals: --stage-groups naming a missing group, groups of unequal mesh sizes
usage: test_vstage.py SET TRAIN MPIEXEC [MPIEXEC_FLAGS...]
"""
import json
import os
import re
import subprocess
import sys
import tempfile
from array import array

SET, TRAIN = sys.argv[1], sys.argv[2]
MPI = sys.argv[3:]
BASE = ["--heads", "4", "--channels", "32", "--seq", "16", "--no-progress", "--vocab", "250"]
failures = 0


def fail(msg):
    global failures
    failures += 1
    print("FAIL " + msg)


def load(path):
    b = open(path, "rb").read()
    a = array("f")
    a.frombytes(b[1024:])
    return b[:1024], a


def run(n, args, expect_ok=True, steps=5, params=True):
    """One parallel run; checks exit code, per-step JSON and the final parameters vs serial."""
    with tempfile.TemporaryDirectory() as d:
        par, ser, js = os.path.join(d, "par.bin"), os.path.join(d, "ser.bin"), os.path.join(d, "s.json")
        extra = ["--steps", str(steps)] + (["--check-serial", "--save", par, "--json", js] if expect_ok else [])
        cmd = MPI + ["-n", str(n), "--oversubscribe", TRAIN, "gpt"] + BASE + args + extra
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
        tail = [l for l in p.stdout.splitlines() if l.startswith(("check-serial", "MISMATCH", "xmesh-train", "schedule"))]
        print(("ok  " if (p.returncode == 0) == expect_ok else "FAIL"), " ".join(args), "|", " / ".join(tail[-3:]))
        if (p.returncode == 0) != expect_ok:
            fail("exit code %d\n%s" % (p.returncode, p.stdout[-3000:]))
            return p, None
        if not expect_ok:
            return p, None
        if "check-serial: OK" not in p.stdout:
            fail("no check-serial verdict")
        rec = json.load(open(js))
        if len(rec["steps"]) != steps:
            fail("%d step records, expected %d" % (len(rec["steps"]), steps))
        if params:
            model = [a for a in args if a in ("--layers",)]
            li = args.index("--layers")
            sargs = ["--layers", args[li + 1], "--batch", args[args.index("--batch") + 1]]
            subprocess.run([TRAIN, "gpt", "--serial"] + BASE + sargs + ["--steps", str(steps), "--save", ser],
                           check=True, stdout=subprocess.DEVNULL)
            (h1, a), (h2, b) = load(par), load(ser)
            worst = max(abs(x - y) for x, y in zip(a, b)) if len(a) == len(b) else float("inf")
            if h1 != h2 or len(a) != len(b) or not worst <= 2e-6:
                fail("parameters differ from serial (max |diff| %g)" % worst)
        return p, rec


NEW = ["interleaved-1f1b", "eager-interleaved-1f1b", "zb-v", "v-1f1b", "dualpipe-v"]


def matrix(n, R, meshes, layers, M, recs):
    for sch in NEW:
        for rec in recs:
            mb = M if sch != "dualpipe-v" else max(M, 2 * R)
            args = ["--layers", str(layers), "--batch", str(mb), "--microbatches", str(mb),
                    "--schedule", sch, "--stages", str(R), "--virtual-stages", "2",
                    "--stage-mesh", meshes, "--recompute", rec]
            if sch in ("interleaved-1f1b", "v-1f1b") and rec == "block":
                args.append("--delay-wgrad")
            run(n, args)


if SET == "r2":
    matrix(4, 2, "1x2,2x1", 4, 4, ["none", "block", "selective"])
elif SET == "r3":
    matrix(5, 3, "2,1x2,1", 6, 6, ["none", "block"])
elif SET == "r4":
    matrix(6, 4, "2,1,1x2,1", 8, 4, ["none", "selective"])
elif SET == "long":
    run(4, ["--layers", "4", "--batch", "4", "--microbatches", "4", "--schedule", "zb-v", "--stages", "2",
            "--virtual-stages", "2", "--stage-mesh", "2x1,1x2", "--recompute", "block"], steps=20)
    # an explicit --layout with a stage -> group list
    run(4, ["--layers", "4", "--batch", "4", "--microbatches", "4", "--schedule", "interleaved-1f1b",
            "--layout", "E,t|t|t|t,L", "--stage-groups", "0,1,0,1", "--stage-mesh", "2,2",
            "--stages", "2"])
elif SET == "cap":
    common = ["--layers", "4", "--batch", "4", "--microbatches", "4", "--schedule", "interleaved-1f1b",
              "--stages", "2", "--virtual-stages", "2", "--stage-mesh", "2,1x2"]
    _, plain = run(4, common, params=False)
    _, blk = run(4, common + ["--recompute", "block"], params=False)
    peak_plain = max(max(s["peak_activation_bytes"]) for s in plain["steps"])
    peak_blk = max(max(s["peak_activation_bytes"]) for s in blk["steps"])
    print("measured peak: plain %d, block recomputation %d" % (peak_plain, peak_blk))
    if not peak_blk < peak_plain:
        fail("block recomputation does not lower the measured peak")
    cap = (peak_blk + peak_plain) // 2
    p, rec = run(4, common + ["--max-activation-bytes", str(cap)])
    if rec:
        if "recompute none" in p.stdout:
            fail("a cap below the plain peak did not change the schedule")
        worst = max(max(s["peak_activation_bytes"]) for s in rec["steps"])
        print("cap %d: measured peak %d" % (cap, worst))
        if not worst <= cap:
            fail("measured peak %d over the cap %d" % (worst, cap))
    p, _ = run(4, common + ["--max-activation-bytes", "1000"], expect_ok=False)
    m = re.search(r"smallest[^0-9]*([0-9.e+]+)", p.stdout)
    if not m:
        fail("the refusal does not name the smallest cap:\n" + p.stdout[-800:])
elif SET.startswith("ut"):
    # U-Transformer (13 layers, skip edges between stages; on the V shape down and up layers of
    # one group exchange skips locally): --check-serial compares every step's loss (1e-5 to
    # step 5, 1e-4 to step 10) and the command exits non-zero on a mismatch.
    R = int(SET[2:])
    n, meshes = {2: (4, "1x2,2x1"), 3: (5, "2x1,1x2,1x1"), 4: (6, "2x1,1x1,1x2,1x1")}[R]
    recs = {2: ["none", "block", "selective"], 3: ["none", "block"], 4: ["none", "selective"]}[R]
    peaks = {}
    for sch, rec in [(a, b) for a in NEW for b in recs]:
        M = 2 * R if sch == "dualpipe-v" else (R if R > 2 else 4)
        args = ["--recompute", rec, "--base-channels", "4", "--steps", "10", "--check-serial", "--no-progress",
                "--batch", str(2 * M), "--microbatches", str(M), "--schedule", sch, "--stages", str(R),
                "--virtual-stages", "2", "--stage-mesh", meshes]
        if sch == "zb-v":
            args.append("--delay-wgrad")
        with tempfile.TemporaryDirectory() as d:
            js = os.path.join(d, "u.json")
            cmd = MPI + ["-n", str(n), "--oversubscribe", TRAIN, "utransformer"] + args + ["--json", js]
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
            good = p.returncode == 0 and "check-serial: OK" in p.stdout and \
                len(json.load(open(js))["steps"]) == 10 if os.path.exists(js) else False
            print(("ok  " if good else "FAIL"), " ".join(args))
            if not good:
                fail("utransformer exit %d\n%s" % (p.returncode, p.stdout[-3000:]))
                continue
            peaks[(sch, rec)] = max(max(st["peak_activation_bytes"]) for st in json.load(open(js))["steps"])
    # recomputation lowers the measured peak (measured allocations, nn/sbp.h)
    for sch in NEW:
        for rec in recs[1:]:
            if (sch, rec) in peaks and (sch, "none") in peaks:
                print("  %s %s: measured peak %d (none: %d)" % (sch, rec, peaks[(sch, rec)], peaks[(sch, "none")]))
                if not peaks[(sch, rec)] < peaks[(sch, "none")]:
                    fail("%s --recompute %s does not lower the measured peak" % (sch, rec))
elif SET == "bad":
    p, _ = run(4, ["--layers", "4", "--batch", "4", "--microbatches", "4", "--schedule", "interleaved-1f1b",
                   "--layout", "E,t|t|t|t,L", "--stage-groups", "0,0,0,0", "--stage-mesh", "2,2",
                   "--stages", "2"], expect_ok=False)
    if "group 1" not in p.stdout:
        fail("the refusal does not name the unused group:\n" + p.stdout[-800:])
    p, _ = run(4, ["--layers", "4", "--batch", "4", "--microbatches", "4", "--schedule", "interleaved-1f1b",
                   "--stages", "2", "--virtual-stages", "2", "--stage-mesh", "2,1,1,2"], expect_ok=False)
    if "same size" not in p.stdout:
        fail("the refusal does not name the unequal meshes:\n" + p.stdout[-800:])
else:
    sys.exit("unknown set " + SET)
print("%d failure(s)" % failures)
sys.exit(1 if failures else 0)
