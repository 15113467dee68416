#!/usr/bin/env python3
"""xmesh-train keeps freed memory (apps/main.c: glibc's mmap threshold raised, the heap never
trimmed), so a training step does not fault its buffers in again every step.

Runs the same GPT-2 training twice, with the default and with XMESH_KEEP_FREED=0, and checks
from the step records (--json): every loss equal in both runs (the setting changes where memory
comes from, never a result), and after the first two steps the default run's page faults per
step at most a tenth of glibc's defaults' (which must fault: at least MIN_FAULTS per step, so the
check can fail), and the JSON's train.keep_freed true and false. A bad XMESH_KEEP_FREED is refused
with a warning naming the value. Exit 77 (skipped) where the allocator refuses mallopt (ASan).
usage: test_keep_freed.py OUTDIR MPIEXEC NP_FLAG XMESH_TRAIN [mpiexec flags...]"""
import json
import os
import subprocess
import sys

MIN_FAULTS = 200


def run(out, mpi, npf, train, flags, env_val, tag):
    path = os.path.join(out, "keep_freed_%s.json" % tag)
    env = dict(os.environ)
    env.pop("GLIBC_TUNABLES", None)
    if env_val is not None:
        env["XMESH_KEEP_FREED"] = env_val
    else:
        env.pop("XMESH_KEEP_FREED", None)
    cmd = [mpi, npf, "2"] + flags + ["-x", "XMESH_KEEP_FREED"] * (env_val is not None) + [
        train, "gpt", "--layers", "2", "--heads", "4", "--channels", "128", "--seq", "64",
        "--batch", "8", "--stage-mesh", "2", "--steps", "6", "--blas-threads", "1",
        "--no-progress", "--json", path]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    if p.returncode != 0:
        print(p.stdout + p.stderr)
        sys.exit("keep_freed: run %s failed (status %d)" % (tag, p.returncode))
    with open(path) as f:
        d = json.load(f)
    return d["steps"], p.stderr, d.get("train", {}).get("keep_freed")


def main():
    out, mpi, npf, train = sys.argv[1:5]
    flags = sys.argv[5:]
    os.makedirs(out, exist_ok=True)
    keep, _, on = run(out, mpi, npf, train, flags, None, "default")
    if on is False:
        # a sanitizer's allocator refuses mallopt: there is nothing to keep (exit 77: skipped)
        print("keep_freed: SKIP: the allocator refused mallopt (train.keep_freed false; "
              "sanitizer build?)")
        sys.exit(77)
    plain, _, off = run(out, mpi, npf, train, flags, "0", "glibc")
    _, err, _ = run(out, mpi, npf, train, flags, "7", "bad")
    bad = 0
    if on is not True or off is not False:
        print("keep_freed: train.keep_freed %r by default, %r with XMESH_KEEP_FREED=0 (want "
              "true, false)" % (on, off))
        bad = 1
    if len(keep) != 6 or len(plain) != 6:
        sys.exit("keep_freed: expected 6 step records, got %d and %d" % (len(keep), len(plain)))
    for a, b in zip(keep, plain):
        if a["loss"] != b["loss"]:
            print("keep_freed: step %d loss %r (kept) != %r (glibc defaults)"
                  % (a["step"], a["loss"], b["loss"]))
            bad = 1
    fk = [s["page_faults_per_stage"][0] for s in keep]
    fp = [s["page_faults_per_stage"][0] for s in plain]
    print("page faults per step, kept:", fk)
    print("page faults per step, glibc defaults:", fp)
    for k, p in zip(fk[2:], fp[2:]):
        if p < MIN_FAULTS:
            print("keep_freed: glibc defaults faulted only %d pages in a step (want >= %d: the "
                  "check cannot tell the settings apart)" % (p, MIN_FAULTS))
            bad = 1
        if k > p / 10:
            print("keep_freed: %d page faults in a step with freed memory kept, against %d "
                  "with glibc defaults (want at most a tenth)" % (k, p))
            bad = 1
    if "XMESH_KEEP_FREED='7'" not in err:
        print("keep_freed: no warning naming XMESH_KEEP_FREED='7':\n" + err)
        bad = 1
    if not bad:
        print("keep_freed: OK (losses equal over 6 steps; faults per step %s kept vs %s)"
              % (fk[2:], fp[2:]))
    sys.exit(bad)


if __name__ == "__main__":
    main()
