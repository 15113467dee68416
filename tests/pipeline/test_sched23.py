#!/usr/bin/env python3
"""Issue 23 follow-ups through xmesh-train (small, <= 4 ranks).

Sets:
  vloop  GPT-2 with virtual stages (2 rank groups x 2 chunks, mixed meshes) and the loop
         features that need every chunk of every rank: --grad-clip (global gradient norm over
         every chunk of every rank, clipped), --val-every (validation through the same
         forwards-only driver step), --sample-every (text generated through the stages).
         --check-serial compares every step's loss, gradient norm, validation loss and sample
         with the serial run (the command exits non-zero on any mismatch); the test also
         checks exit 0, the verdict, and that the step JSON holds a gradient norm on every
         step (above the clip on some, so the clipping acts), validation losses and samples
         exactly on the due steps. The U-Transformer likewise (--grad-clip, --val-every; it
         generates no text).
  ucap   U-Transformer --max-activation-bytes (measured by the trainer's probe): a cap below
         the smallest reachable peak is refused naming it (a number above the cap); a cap
         between the block-recomputing and the plain measured peak runs with recomputation
         chosen, the measured peak (every step, every stage) under it, and every step's loss
         equal to the serial run's (--check-serial: the probe steps change nothing); both
         with and without virtual stages; and eager-1f1b --delay-wgrad (re-planned after step
         0) under a cap of 3/4 of its plain peak stays under it on every step.
usage: test_sched23.py SET TRAIN MPIEXEC
"""
import json
import os
import re
import subprocess
import sys
import tempfile

SET, TRAIN = sys.argv[1], sys.argv[2]
MPI = sys.argv[3:]
failures = 0


def fail(msg):
    global failures
    failures += 1
    print("FAIL " + msg)


def run(n, model, args, steps):
    with tempfile.TemporaryDirectory() as d:
        js = os.path.join(d, "s.json")
        cmd = MPI + ["-n", str(n), "--oversubscribe", TRAIN, model] + args + \
            ["--steps", str(steps), "--no-progress", "--json", js]
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
        rec = json.load(open(js)) if p.returncode == 0 and os.path.exists(js) else None
        return p, rec


if SET == "vloop":
    BASE = ["--heads", "4", "--channels", "32", "--seq", "16", "--vocab", "250", "--layers", "4",
            "--batch", "4", "--microbatches", "4", "--stages", "2", "--virtual-stages", "2",
            "--stage-mesh", "1x2,2x1", "--check-serial"]
    clip, steps, ve, se = 0.5, 6, 2, 3
    for sch, extra in [("interleaved-1f1b", []), ("zb-v", ["--sample-greedy"]),
                       ("eager-interleaved-1f1b", ["--recompute", "block"]),
                       ("zb-v", ["--delay-wgrad"])]:
        args = BASE + ["--schedule", sch, "--grad-clip", str(clip), "--val-every", str(ve),
                       "--val-steps", "2", "--sample-every", str(se), "--sample-len", "8"] + extra
        p, rec = run(4, "gpt", args, steps)
        ok = p.returncode == 0 and "check-serial: OK" in p.stdout and rec is not None
        print(("ok  " if ok else "FAIL"), sch, " ".join(extra))
        if not ok:
            fail("%s %s: exit %d\n%s" % (sch, extra, p.returncode, p.stdout[-3000:]))
            continue
        st = rec["steps"]
        if len(st) != steps:
            fail("%d step records, expected %d" % (len(st), steps))
            continue
        norms = [s.get("grad_norm") for s in st]
        if not all(isinstance(x, float) and x > 0 for x in norms):
            fail("gradient norms missing: %s" % norms)
        elif not any(x > clip for x in norms):
            fail("no step's norm above the clip %g (clipping not exercised): %s" % (clip, norms))
        for k, s in enumerate(st):
            vdue = (k + 1) % ve == 0 or k == steps - 1
            sdue = (k + 1) % se == 0 or k == steps - 1
            if vdue != ("val_loss" in s):
                fail("step %d: val_loss %s, due %s" % (k, s.get("val_loss"), vdue))
            if sdue != ("sample" in s) or (sdue and len(s["sample"]) != 8):
                fail("step %d: sample %r, due %s" % (k, s.get("sample"), sdue))
        print("   norms", " ".join("%.4f" % x for x in norms))
    # the U-Transformer (no text sampling): gradient norm over every chunk, validation
    UB = ["--base-channels", "4", "--batch", "8", "--microbatches", "4", "--stages", "2",
          "--virtual-stages", "2", "--stage-mesh", "1x2,2x1", "--check-serial"]
    uclip = 0.05
    for sch in ["interleaved-1f1b", "zb-v"]:
        p, rec = run(4, "utransformer", UB + ["--schedule", sch, "--grad-clip", str(uclip),
                                              "--val-every", str(ve), "--val-steps", "2"], 5)
        ok = p.returncode == 0 and "check-serial: OK" in p.stdout and rec is not None
        print(("ok  " if ok else "FAIL"), "utransformer", sch)
        if not ok:
            fail("utransformer %s: exit %d\n%s" % (sch, p.returncode, p.stdout[-3000:]))
            continue
        st = rec["steps"]
        norms = [s.get("grad_norm") for s in st]
        if len(st) != 5 or not all(isinstance(x, float) and x > uclip for x in norms):
            fail("utransformer: %d records, norms %s (all above the clip expected)" % (len(st), norms))
        for k, s in enumerate(st):
            if ((k + 1) % ve == 0 or k == 4) != ("val_loss" in s):
                fail("utransformer step %d: val_loss %s" % (k, s.get("val_loss")))
elif SET == "ucap":
    for R, meshes, vs, sch in [(2, "1x1,1x1", [], "1f1b"), (2, "1x1,1x1", ["--virtual-stages", "2"], "interleaved-1f1b")]:
        common = ["--base-channels", "4", "--batch", "8", "--microbatches", "4", "--stages", str(R),
                  "--stage-mesh", meshes, "--schedule", sch] + vs
        peaks = {}
        for rc_ in ["none", "block"]:
            p, rec = run(R, "utransformer", common + ["--recompute", rc_], 3)
            if rec is None:
                fail("%s --recompute %s: exit %d\n%s" % (sch, rc_, p.returncode, p.stdout[-2000:]))
                break
            peaks[rc_] = max(max(s["peak_activation_bytes"]) for s in rec["steps"])
        if len(peaks) != 2:
            continue
        print("%s %s: measured peak plain %d, block %d" % (sch, " ".join(vs), peaks["none"], peaks["block"]))
        if not peaks["block"] < peaks["none"]:
            fail("block recomputation does not lower the measured peak")
            continue
        cap = (peaks["block"] + peaks["none"]) // 2
        # --check-serial: the trainer's probe steps (forwards only, and one backward without
        # R and O whose gradients are zeroed) leave the training unchanged
        p, rec = run(R, "utransformer", common + ["--max-activation-bytes", str(cap), "--check-serial"], 3)
        if rec is not None and "check-serial: OK" not in p.stdout:
            fail("cap run: no check-serial verdict\n" + p.stdout[-1500:])
        if rec is None:
            fail("cap %d (between block and plain) refused or failed: exit %d\n%s" % (cap, p.returncode, p.stdout[-2000:]))
        else:
            worst = max(max(s["peak_activation_bytes"]) for s in rec["steps"])
            chosen = ([None] + list(re.finditer(r"schedule \S+: recompute (\w+)", p.stdout)))[-1]
            print("   cap %d: measured peak %d, %s" % (cap, worst, chosen.group(0) if chosen else "?"))
            if not chosen or chosen.group(1) == "none":
                fail("a cap below the plain peak did not choose recomputation:\n" + p.stdout[-1500:])
            if not worst <= cap:
                fail("measured peak %d over the cap %d" % (worst, cap))
        p, rec = run(R, "utransformer", common + ["--max-activation-bytes", "1000"], 2)
        m = re.search(r"smallest[^0-9]*([0-9][0-9.e+]*)", p.stdout)
        print("   cap 1000: exit %d, %s" % (p.returncode, m.group(0) if m else "no smallest cap named"))
        if p.returncode == 0:
            fail("cap 1000 was not refused")
        elif not m:
            fail("the refusal does not name the smallest cap:\n" + p.stdout[-1500:])
        elif not float(m.group(1)) > 1000:
            fail("the smallest cap named (%s) is not above the refused cap" % m.group(1))
    # --delay-wgrad re-plans after step 0 with the measured costs: under the same cap
    dw = ["--base-channels", "4", "--batch", "8", "--microbatches", "4", "--stages", "2",
          "--stage-mesh", "1x1,1x1", "--schedule", "eager-1f1b", "--delay-wgrad"]
    p, rec = run(2, "utransformer", dw, 4)
    if rec is None:
        fail("eager-1f1b --delay-wgrad: exit %d\n%s" % (p.returncode, p.stdout[-2000:]))
    else:
        plain = max(max(s["peak_activation_bytes"]) for s in rec["steps"])
        cap = plain * 3 // 4
        p, rec = run(2, "utransformer", dw + ["--max-activation-bytes", str(cap), "--check-serial"], 4)
        if rec is None or "check-serial: OK" not in p.stdout:
            fail("eager-1f1b --delay-wgrad, cap %d (3/4 of the plain peak %d): exit %d\n%s"
                 % (cap, plain, p.returncode, p.stdout[-2000:]))
        else:
            per = [max(s["peak_activation_bytes"]) for s in rec["steps"]]
            print("eager-1f1b --delay-wgrad: plain peak %d, cap %d: measured per step %s" % (plain, cap, per))
            if not all(x <= cap for x in per):
                fail("measured peaks %s over the cap %d (after re-planning)" % (per, cap))
else:
    sys.exit("unknown set " + SET)
print("%d failure(s)" % failures)
sys.exit(1 if failures else 0)
