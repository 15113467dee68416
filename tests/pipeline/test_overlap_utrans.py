#!/usr/bin/env python3
"""Overlap must not change the numbers, U-Transformer (issue 20 items 4 and 7): xmesh-train
utransformer trains CASE for 5 steps with --overlap none, all and the case's single switches,
each with --check-serial (rank 0 also trains the serial model; the command exits non-zero
unless every step's loss agrees with it within 1e-5 relative). A run counts when it exits 0,
says 5 steps were compared with no mismatch and its --json holds 5 step losses; every variant's
losses must equal those of --overlap none within 1e-6 relative. --break adds 1e-5 relative to
one loss of the overlapped runs (the check must then fail).
usage: test_overlap_utrans.py CASE TRAIN MPIEXEC [--break]
"""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_harness import Harness, edit  # noqa: E402

CASE, TRAIN, MPI = sys.argv[1], sys.argv[2], sys.argv[3]
BREAK = "--break" in sys.argv[4:]
STEPS = 5
BASE = ["--base-channels", "4", "--batch", "4", "--no-progress",
        "--steps", str(STEPS), "--check-serial"]
# name: (ranks, flags, single switches run besides none and all, strategy edits (dp.zero))
CASES = {
    "megatron.2x2": (4, ["--stage-mesh", "2x2", "--strategy", "megatron"],
                     ["bwd-input", "coll-matmul", "defer-grad"], None),
    # block recomputation re-runs the fused conv + box steps before the backward
    "megatron.1x4": (4, ["--stage-mesh", "1x4", "--strategy", "megatron", "--recompute", "block",
                         "--microbatches", "2"], ["bwd-input"], None),
    "3d.2x2x2": (8, ["--stage-mesh", "2x2x2", "--strategy", "3d"], ["coll-matmul"], None),
    # sharded storage: weights stored split over the depth axis (prefetch gathers them)
    "axonn.2x2x2": (8, ["--stage-mesh", "2x2x2", "--strategy", "axonn"],
                    ["prefetch", "defer-grad"], None),
    # data-parallel compute, ZeRO-style storage split over both axes
    "dp.zero.2x2": (4, ["--stage-mesh", "2x2", "--microbatches", "2"], ["prefetch"], [
        "conv1.w = B,B store S(0),S(1)", "conv2.w = B,B store S(1),S(0)",
        "attn.q.w = B,B store S(0),S(0)", "gn.gamma = B,B store B,S(0)",
        "up.b = B,B store S(0),B"]),
    # 2 stages mixing strategies and meshes, eager-1F1B with the weight gradients delayed
    "pipe.axonn-dp.delay": (6, ["--stages", "2", "--stage-mesh", "2x1x2,1x2", "--stage-strategy",
                                "axonn,dp", "--microbatches", "2", "--schedule", "eager-1f1b",
                                "--delay-wgrad"], [], None),
}


H = Harness([MPI], TRAIN, "utransformer", BASE, timeout=50)
run = H.run


def losses(n, flags, ov, d):
    js = os.path.join(d, "run.json")
    if os.path.exists(js):
        os.remove(js)
    rc, out = run(n, flags + ["--overlap", ov, "--json", js])
    ok = rc == 0 and f"check-serial: OK (0 mismatching of {STEPS} steps compared)" in out
    if not ok:
        print(out[-4000:])
        sys.exit(f"FAIL: {CASE} --overlap {ov}: exit {rc} or the serial check did not pass")
    with open(js) as f:
        ls = [s["loss"] for s in json.load(f)["steps"]]
    if len(ls) != STEPS:
        sys.exit(f"FAIL: {CASE} --overlap {ov}: {len(ls)} steps, expected {STEPS}")
    return ls


n, flags, singles, edits = CASES[CASE]
with tempfile.TemporaryDirectory() as d:
    if edits:
        text = H.printed_strategy(n, flags + ["--strategy", "dp"])
        for e in edits:
            text = edit(text, e)
        path = os.path.join(d, "s.txt")
        open(path, "w").write(text)
        flags = flags + ["--strategy", path]
    ref = losses(n, flags, "none", d)
    bad = 0
    for ov in ["all"] + singles:
        got = losses(n, flags, ov, d)
        if BREAK:
            got[2] *= 1 + 1e-5
        rels = [abs(a - b) / max(abs(a), 1e-30) for a, b in zip(ref, got)]
        for i, rel in enumerate(rels):
            if rel > 1e-6:
                print(f"FAIL: {CASE} --overlap {ov}: step {i}: loss {got[i]!r} vs {ref[i]!r} "
                      f"(rel {rel:.3g})")
                bad = 1
        print(f"{CASE} --overlap {ov}: {len(got)} losses, max rel diff {max(rels):.3g}")
print("FAIL" if bad else "PASS", CASE)
sys.exit(1 if bad else 0)
