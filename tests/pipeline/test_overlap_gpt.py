#!/usr/bin/env python3
"""Overlap must not change the numbers: xmesh-train gpt trains CASE with --overlap none and with
--overlap all and with each switch alone (coll-matmul: the forward GEMMs cut into pieces whose
collectives overlap the next piece, nn/overlap.h (e)); every step's loss (from --json)
must equal the reference within 1e-6 relative, and the run must exit 0 with the asked number of
steps. --break adds 1e-5 to one loss of the overlapped run (the check must then fail).
usage: test_overlap_gpt.py CASE TRAIN MPIEXEC [--break]
"""
import json
import os
import subprocess
import sys
import tempfile

CASE, TRAIN, MPI = sys.argv[1], sys.argv[2], sys.argv[3]
BREAK = "--break" in sys.argv[4:]
BASE = ["gpt", "--heads", "4", "--channels", "32", "--seq", "16", "--batch", "4",
        "--no-progress", "--layers", "2", "--steps", "5"]
CASES = {
    "megatron.2x2": (4, ["--stage-mesh", "2x2", "--strategy", "megatron"]),
    "3d.1x2x2": (4, ["--stage-mesh", "1x2x2", "--strategy", "3d", "--microbatches", "2"]),
    "axonn.2x1x2": (4, ["--stage-mesh", "2x1x2", "--strategy", "axonn"]),
    "megatron.1x4": (4, ["--stage-mesh", "1x4", "--strategy", "megatron"]),
    "3d.2x2x2": (8, ["--stage-mesh", "2x2x2", "--strategy", "3d", "--batch", "8"]),
    "pipe.3d-megatron": (6, ["--stage-mesh", "1x2x2,2", "--stage-strategy", "3d,megatron",
                             "--microbatches", "2"]),
    "pipe.megatron-axonn.delay": (6, ["--stage-mesh", "2,2x1x2", "--stage-strategy",
                                      "megatron,axonn", "--microbatches", "4", "--schedule",
                                      "eager-1f1b", "--delay-wgrad"]),
}
STEPS = 5


def losses(np_, flags, ov):
    with tempfile.TemporaryDirectory() as d:
        js = os.path.join(d, "run.json")
        cmd = [MPI, "-n", str(np_), "--oversubscribe", TRAIN] + BASE + flags + [
            "--overlap", ov, "--json", js]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=100)
        if p.returncode != 0:
            sys.exit(f"FAIL: --overlap {ov}: exit {p.returncode}\n{p.stdout}\n{p.stderr}")
        with open(js) as f:
            rec = json.load(f)
    ls = [s["loss"] for s in rec["steps"]]
    if len(ls) != STEPS:
        sys.exit(f"FAIL: --overlap {ov}: {len(ls)} steps, expected {STEPS}")
    return ls


np_, flags = CASES[CASE]
ref = losses(np_, flags, "none")
variants = ["all", "bwd-input", "defer-grad", "prefetch", "coll-matmul"]
bad = 0
for ov in variants:
    got = losses(np_, flags, ov)
    if BREAK:
        got[2] += 1e-5
    for i, (a, b) in enumerate(zip(ref, got)):
        rel = abs(a - b) / max(abs(a), 1e-30)
        if rel > 1e-6:
            print(f"FAIL: {CASE} --overlap {ov}: step {i}: loss {b!r} vs {a!r} (rel {rel:.3g})")
            bad = 1
    print(f"{CASE} --overlap {ov}: {len(got)} losses, max rel diff "
          f"{max(abs(a - b) / abs(a) for a, b in zip(ref, got)):.3g}")
sys.exit(1 if bad else 0)
