#!/usr/bin/env python3
"""xmesh-train --boundary-dtype (issue 22 item 5): a 2-stage run of `model` (gpt or ut) with
bf16 (or f16) boundaries against the same run with f32 boundaries. Both must exit 0 and
complete; the per-step losses of the 16-bit run must be within 1e-2 relative of the f32 run's
(rounding the stage-boundary activations and gradients to 16 bits changes the numbers, so they
are not equal: at least one step must differ, which shows the rounding happened), and the
boundary bytes per step in the JSON summary (the driver's wire bytes and the plans'
bytes_cross_host, every rank its own host through XMESH_HOST_ID=rank/1) must be half the f32
run's and nonzero. Usage: test_bdtype_train.py gpt|ut bf16|f16 XMESH_TRAIN MPIEXEC"""
import json
import os
import subprocess
import sys
import tempfile

MODELS = {
    "gpt": ["gpt", "--layers", "2", "--channels", "64", "--lr", "1e-3"],
    "ut": ["utransformer", "--base-channels", "4", "--batch", "4"],
}
STEPS = 5
RTOL = 1e-2


def run(exe, mpiexec, model, dtype, out):
    cmd = [mpiexec, "-n", "2", "--oversubscribe", exe] + MODELS[model] + [
        "--stages", "2", "--microbatches", "2", "--steps", str(STEPS), "--no-progress",
        "--boundary-dtype", dtype, "--json", out]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OPENBLAS_NUM_THREADS="1", XMESH_HOST_ID="rank/1")
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=120)
    if p.returncode != 0:
        sys.exit("FAIL: %s exited %d:\n%s" % (" ".join(cmd), p.returncode, p.stdout[-3000:]))
    with open(out) as f:
        return json.load(f)


def main():
    model, dtype, exe, mpiexec = sys.argv[1:5]
    with tempfile.TemporaryDirectory() as tmp:
        ref = run(exe, mpiexec, model, "f32", os.path.join(tmp, "f32.json"))
        low = run(exe, mpiexec, model, dtype, os.path.join(tmp, dtype + ".json"))
    bad = []
    for name, j, want in (("f32", ref, "f32"), (dtype, low, dtype)):
        if j["pipeline"]["boundary_dtype"] != want:
            bad.append("%s run: pipeline.boundary_dtype %r" % (name, j["pipeline"]["boundary_dtype"]))
        if not j["summary"]["completed"] or len(j["steps"]) != STEPS:
            bad.append("%s run: completed %r, %d steps" % (name, j["summary"]["completed"],
                                                          len(j["steps"])))
    la = [s["loss"] for s in ref["steps"]]
    lb = [s["loss"] for s in low["steps"]]
    for k, (a, b) in enumerate(zip(la, lb)):
        rel = abs(b - a) / abs(a)
        print("step %d: loss f32 %.8f %s %.8f (rel %.2e)" % (k, a, dtype, b, rel))
        if not rel <= RTOL:
            bad.append("step %d: loss %s %.8f vs f32 %.8f, rel %.2e > %g" % (k, dtype, b, a, rel, RTOL))
    if la == lb:
        bad.append("the %s run's losses equal the f32 run's bit for bit: no rounding happened" % dtype)
    for key in ("boundary_bytes_per_step", "boundary_cross_host_bytes_per_step"):
        a, b = ref["summary"].get(key), low["summary"].get(key)
        print("%s: f32 %s %s %s" % (key, a, dtype, b))
        if not a or not b or 2 * b != a:
            bad.append("%s: f32 %r, %s %r (want half, nonzero)" % (key, a, dtype, b))
    if bad:
        sys.exit("FAIL:\n  " + "\n  ".join(bad))
    print("OK")


if __name__ == "__main__":
    main()
