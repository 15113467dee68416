#!/usr/bin/env python3
"""GPT-2 stages driven by strategies (xmesh-train gpt --strategy / --stage-strategy).

A run case trains 5 steps under mpirun with --check-serial: rank 0 also trains the
serial model and the command exits non-zero unless every step's loss agrees within
1e-5 relative; the case passes on exit code 0 AND the "check-serial: OK" summary with
5 steps compared. A refusal case passes when the command fails and its message names
what it must (class, axis, rule). usage:
  test_gpt_strategy.py CASE TRAIN MPIEXEC [MPIEXEC_FLAGS...]
"""
import json
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_harness import Harness  # noqa: E402

CASE, TRAIN = sys.argv[1], sys.argv[2]
MPI = sys.argv[3:]
BASE = ["--heads", "4", "--channels", "32", "--seq", "16", "--batch", "4", "--no-progress",
        "--layers", "2"]

# name: (ranks, extra flags)
RUNS = {
    # one stage, every built-in on meshes of 1, 2, 3 and 4 axes
    "dp.4": (4, ["--stage-mesh", "4", "--strategy", "dp"]),
    "dp.2x2": (4, ["--stage-mesh", "2x2", "--strategy", "dp"]),
    "dp.2x2x2": (8, ["--stage-mesh", "2x2x2", "--strategy", "dp"]),
    "dp.2x1x2x2": (8, ["--stage-mesh", "2x1x2x2", "--strategy", "dp"]),
    "megatron.2": (2, ["--stage-mesh", "2", "--strategy", "megatron"]),
    "megatron.2x2": (4, ["--stage-mesh", "2x2", "--strategy", "megatron", "--vocab", "250"]),
    "megatron.2x2x2": (8, ["--stage-mesh", "2x2x2", "--strategy", "megatron"]),
    "megatron.2x1x2x2": (8, ["--stage-mesh", "2x1x2x2", "--strategy", "megatron"]),
    "3d.2": (2, ["--stage-mesh", "2", "--strategy", "3d"]),
    "3d.2x2": (4, ["--stage-mesh", "2x2", "--strategy", "3d"]),
    "3d.2x2x2": (8, ["--stage-mesh", "2x2x2", "--strategy", "3d", "--vocab", "250"]),
    "3d.1x2x2": (4, ["--stage-mesh", "1x2x2", "--strategy", "3d", "--microbatches", "2"]),
    "3d.3x1x2": (6, ["--stage-mesh", "3x1x2", "--strategy", "3d"]),  # uneven batch split
    "3d.2x1x2x2": (8, ["--stage-mesh", "2x1x2x2", "--strategy", "3d"]),
    # sharded storage: axonn (3d + weights stored split over the depth axis)
    "axonn.2x2x2": (8, ["--stage-mesh", "2x2x2", "--strategy", "axonn", "--vocab", "250"]),
    "axonn.1x2x2": (4, ["--stage-mesh", "1x2x2", "--strategy", "axonn"]),
    "axonn.2x1x2x2": (8, ["--stage-mesh", "2x1x2x2", "--strategy", "axonn", "--microbatches", "2"]),
    "pipe.axonn-axonn.tied": (8, ["--stage-mesh", "2x1x2,2x2x1", "--strategy", "axonn",
                                  "--microbatches", "2", "--schedule", "eager-1f1b"]),
    "pipe.axonn-megatron": (6, ["--stage-mesh", "2x1x2,1x2", "--stage-strategy", "axonn,megatron",
                                "--microbatches", "2"]),
    # pipelines of 2 and 3 stages mixing strategies and mesh shapes
    "pipe.3d-megatron": (8, ["--stage-mesh", "1x2x2,2x2", "--stage-strategy", "3d,megatron",
                             "--microbatches", "2"]),
    "pipe.dp-megatron-3d": (8, ["--stage-mesh", "2,1x2,2x1x2", "--stage-strategy",
                                "dp,megatron,3d", "--layers", "3", "--microbatches", "4", "--schedule",
                                "eager-1f1b", "--delay-wgrad"]),
    "pipe.3d-dp.4axes": (6, ["--stage-mesh", "1x1x2x2,2", "--stage-strategy", "3d,dp",
                             "--microbatches", "2", "--schedule", "gpipe"]),
    "pipe.megatron-3d.layout": (5, ["--layout", "E,t|t,L", "--stage-mesh", "1x1x1x1,2x1x2",
                                    "--stage-strategy", "megatron,3d", "--microbatches", "2"]),
    # every overlap switch (nn/overlap.h) against the serial model: 1-axis and 4-axis meshes,
    # sharded storage, pipelines of 2 and 3 stages
    "ov.megatron.2": (2, ["--stage-mesh", "2", "--strategy", "megatron", "--overlap", "all"]),
    "ov.3d.2x1x2x2": (8, ["--stage-mesh", "2x1x2x2", "--strategy", "3d", "--overlap", "all"]),
    "ov.axonn.2x2x2": (8, ["--stage-mesh", "2x2x2", "--strategy", "axonn", "--vocab", "250",
                           "--overlap", "all"]),
    "ov.pipe.3d-megatron": (8, ["--stage-mesh", "1x2x2,2x2", "--stage-strategy", "3d,megatron",
                                "--microbatches", "2", "--overlap", "all"]),
    "ov.pipe.dp-megatron-3d": (8, ["--stage-mesh", "2,1x2,2x1x2", "--stage-strategy",
                                   "dp,megatron,3d", "--layers", "3", "--microbatches", "4",
                                   "--schedule", "eager-1f1b", "--delay-wgrad", "--overlap", "all"]),
}

LONG = {
    "long.3d.2x2x2": (8, ["--stage-mesh", "2x2x2", "--strategy", "3d"]),
    "long.ov.axonn-megatron": (6, ["--stage-mesh", "2x1x2,1x2", "--stage-strategy",
                                   "axonn,megatron", "--microbatches", "2", "--overlap", "all"]),
    "long.axonn-megatron": (6, ["--stage-mesh", "2x1x2,1x2", "--stage-strategy", "axonn,megatron",
                                "--microbatches", "2", "--schedule", "eager-1f1b",
                                "--delay-wgrad"]),
}

# name: (ranks, flags, built-in, class lines replacing the built-in's): layers beyond the
# built-ins: channel-split layer norm (statistics all-reduced), sequence-split attention,
# split layer-norm weights and wpe, a vocabulary split over two axes.
CUSTOM = {
    "custom.channel_layernorm": (4, ["--stage-mesh", "2x2"], "megatron", [
        "act.x = S(0),S(2)", "ln1.w = B,S(0)", "ln2.b = B,S(0)", "wpe = B,S(1)"]),
    "custom.sequence_attention": (8, ["--stage-mesh", "2x2x2"], "3d", [
        "act.qkv = S(0),S(1),S(3)", "act.x = S(0),S(2),S(1)", "lnf.w = B,B,S(0)"]),
    # ZeRO-style: data-parallel compute, storage split over both axes (wte, fc.w, wpe, ln1.w)
    "custom.zero": (4, ["--stage-mesh", "2x2", "--microbatches", "2"], "dp", [
        "wte = B,B store S(0),S(1)", "fc.w = B,B store S(0),S(0)", "wpe = B,B store S(1),S(0)",
        "ln1.w = B,B store B,S(0)"]),
    "custom.pipeline_sequence": (6, ["--stage-mesh", "2x2,1x2", "--microbatches", "2"], "dp", [
        "act.qkv = S(1),S(3)", "act.x = S(1),S(1)", "act.logits = S(2),S(2)"]),
}

# name: (ranks, extra flags, strategy: a built-in name, or "file:EDIT" for a file made
# from the printed 1-axis megatron strategy with EDIT applied, needles of the message).
# "@N" in a needle is the number of lines of the printed text plus 1.
REFUSALS = {
    "refuse.unknown_class": (2, ["--stage-mesh", "2"], "file:append extra.w = B",
                             [":@N: unknown class 'extra.w' (known: wte wpe"]),
    "refuse.missing_class": (2, ["--stage-mesh", "2"], "file:drop act.gelu",
                             [": class 'act.gelu' missing (strategy 'megatron' must give it)"]),
    "refuse.axis_count": (4, ["--stage-mesh", "2x2"], "file:none",
                          ["stage 0: ", ": strategy 'megatron' has axes=1, the stage mesh has 2 axes"]),
    "refuse.bad_sbp": (2, ["--stage-mesh", "2"], "file:set wte = S(x)",
                       [":2: class 'wte': SBP axis 0: bad SBP 'S(x)'"]),
    "refuse.param_dim": (2, ["--stage-mesh", "2"], "file:set fc.b = S(1)",
                         ["stage 0: class fc.b", "mesh axis 0: S(1) but fc.b has 1 dims"]),
    "refuse.rule_partial_x": (2, ["--stage-mesh", "2"], "file:set act.x = P", [
        "stage 0: class act.x: mesh axis 0: P: missing SBP rule 'partial residual stream'"]),
    "refuse.rule_attention": (2, ["--stage-mesh", "2"], "file:set act.qkv = S(2)", [
        "stage 0: class act.qkv: attention: operand qkv 'S(2)': mesh axis 0: S(2) splits the "
        "q/k/v index dim: no rule"]),
    "refuse.rule_attention_hs": (2, ["--stage-mesh", "2"], "file:set act.qkv = S(4)", [
        "stage 0: class act.qkv: attention: operand qkv 'S(4)': mesh axis 0: S(4) splits the "
        "head dim hs: no rule"]),
    "refuse.rule_partial_param": (2, ["--stage-mesh", "2"], "file:set qkv.w = P", [
        "stage 0: class qkv.w: mesh axis 0: P: missing SBP rule 'partial parameter'"]),
    "refuse.heads": (8, ["--stage-mesh", "1x2x4"], "3d", [
        "stage 0: 4 heads cannot be split over tensor-parallel degree 8",
        "class act.qkv splits the heads over mesh axes 1,2"]),
    "refuse.axonn": (4, ["--stage-mesh", "2x2"], "axonn", [
        "built-in strategy 'axonn' needs a mesh of 3 or 4 axes", "this mesh has 2"]),
    "refuse.store_partial": (2, ["--stage-mesh", "2"], "file:set fc.w = S(0) store P", [
        "stage 0: class fc.w: mesh axis 0: storage P: missing SBP rule 'partial storage'"]),
    "refuse.store_activation": (2, ["--stage-mesh", "2"], "file:set act.fch = S(2) store B", [
        "stage 0: class act.fch", "a storage SBP is for parameters only"]),
    "refuse.unknown_name": (2, ["--stage-mesh", "2"], "nosuch", [
        "strategy 'nosuch': no such file and no built-in of that name (built-ins: dp, megatron, 3d, axonn)"]),
    "refuse.stage_count": (4, ["--stage-mesh", "2,2", "--stages", "2", "--stage-strategy"],
                           "dp,dp,dp", ["--stage-strategy 'dp,dp,dp' has 3 entries for 2 stages"]),
}


H = Harness(MPI, TRAIN, "gpt", BASE)
run, printed_strategy, check_run = H.run, H.printed_strategy, H.check_run


if CASE in RUNS:
    n, flags = RUNS[CASE]
    ok = check_run(n, flags)
elif CASE in LONG:
    # 20 steps: 1e-5 relative for steps 0-4, 1e-4 up to step 19 (the --check-serial rule)
    n, flags = LONG[CASE]
    ok = check_run(n, flags, steps=20)
elif CASE in CUSTOM:
    # A built-in, printed, edited and loaded back from a file.
    n, flags, base, edits = CUSTOM[CASE]
    text = printed_strategy(n, flags + ["--strategy", base])
    for e in edits:
        cls = e.split("=")[0].strip()
        lines = text.splitlines()
        assert any(l.split("=")[0].strip() == cls for l in lines), cls
        text = "\n".join(e if l.split("=")[0].strip() == cls else l for l in lines) + "\n"
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "s.txt")
        open(path, "w").write(text)
        print(text)
        ok = check_run(n, flags + ["--strategy", path])
elif CASE == "memory.axonn":
    # Parameter + optimizer bytes per rank from the JSON, against the count from the printed
    # strategies (storage SBP where given, numpy.array_split blocks, lower axis major): 3d
    # and axonn on the same 2x2x2 mesh; axonn must store less on every rank.
    mesh, L, C, NH, V, T = [2, 2, 2], 2, 32, 4, 256, 1024
    shapes = {"wte": [V, C], "wpe": [T, C], "qkv.w": [3, NH, C // NH, C], "qkv.b": [3, NH, C // NH],
              "attproj.w": [C, C], "fc.w": [4 * C, C], "fc.b": [4 * C], "fcproj.w": [C, 4 * C]}
    per_layer = {"ln1.w", "ln1.b", "qkv.w", "qkv.b", "attproj.w", "attproj.b", "ln2.w", "ln2.b",
                 "fc.w", "fc.b", "fcproj.w", "fcproj.b"}

    def parse(text):
        out = {}
        for line in text.splitlines():
            if "=" not in line or line.startswith(("strategy", "#")):
                continue
            cls, rest = [x.strip() for x in line.split("=", 1)]
            parts = rest.split("store")
            out[cls] = [re.findall(r"S\(\d\)|B|P", p) for p in parts]
        return out

    def local(shape, sbp, coord):
        n = 1
        for d, size in enumerate(shape):
            axes = [a for a, v in enumerate(sbp) if v == f"S({d})"]
            k, idx = 1, 0
            for a in axes:
                k *= mesh[a]
                idx = idx * mesh[a] + coord[a]
            n *= size // k + (1 if idx < size % k else 0)
        return n

    def expected(st, coord):
        stored = compute = 0
        for cls, sb in st.items():
            if cls.startswith("act."):
                continue
            shape = shapes.get(cls, [C])
            mult = L if cls in per_layer else 1
            compute += 4 * mult * local(shape, sb[0], coord)
            stored += 4 * mult * local(shape, sb[-1], coord)
        return stored, compute

    ok = True
    got = {}
    with tempfile.TemporaryDirectory() as d:
        for name in ("3d", "axonn"):
            flags = ["--stage-mesh", "2x2x2", "--strategy", name]
            st = parse(printed_strategy(8, flags))
            js = os.path.join(d, name + ".json")
            rc, out = run(8, flags + ["--steps", "2", "--json", js])
            if rc != 0:
                print(out[-3000:])
                ok = False
                continue
            recs = json.load(open(js))["summary"]["memory_per_rank"]
            got[name] = recs
            for r in recs:
                coord = [r["rank"] // 4, r["rank"] // 2 % 2, r["rank"] % 2]
                stored, compute = expected(st, coord)
                good = (r["param_bytes"] == stored and r["optimizer_bytes"] == 2 * stored and
                        r["compute_param_bytes"] == compute and r["grad_bytes"] == compute)
                print(("ok  " if good else "FAIL"), name, r, "expected stored", stored,
                      "compute", compute)
                ok = ok and good
    ok = ok and len(got) == 2 and all(
        a["param_bytes"] < b["param_bytes"] for a, b in zip(got["axonn"], got["3d"]))
elif CASE == "print.roundtrip":
    # The printed 3d strategy, written to a file and loaded back, trains the same.
    flags = ["--stage-mesh", "2x1x2"]
    text = printed_strategy(4, flags + ["--strategy", "3d"])
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "s.txt")
        open(path, "w").write(text)
        again = printed_strategy(4, flags + ["--strategy", path])
        ok = again == text and "fc.w         = B,S(0),S(1)" in text
        if not ok:
            print("printed texts differ or lack fc.w:\n" + text + "\n---\n" + again)
        ok = ok and check_run(4, flags + ["--strategy", path])
elif CASE in REFUSALS:
    n, flags, spec, needles = REFUSALS[CASE]
    with tempfile.TemporaryDirectory() as d:
        arg = spec
        if spec.startswith("file:"):
            text = printed_strategy(2, ["--stage-mesh", "2", "--strategy", "megatron"])
            lines = text.splitlines()
            edit = spec[5:]
            if edit.startswith("append "):
                lines.append(edit[7:])
            elif edit.startswith("drop "):
                lines = [l for l in lines if l.split("=")[0].strip() != edit[5:]]
            elif edit.startswith("set "):
                cls = edit[4:].split("=")[0].strip()
                assert any(l.split("=")[0].strip() == cls for l in lines), cls
                lines = [edit[4:] if l.split("=")[0].strip() == cls else l for l in lines]
            needles = [x.replace("@N", str(len(lines))) for x in needles]
            arg = os.path.join(d, "s.txt")
            open(arg, "w").write("\n".join(lines) + "\n")
        if "--stage-strategy" not in flags:
            flags = flags + ["--strategy"]
        rc, out = run(n, flags + [arg, "--steps", "1"])
        missing = [x for x in needles if x not in out]
        ok = rc != 0 and not missing
        if not ok:
            print(f"rc {rc}, missing {missing}:\n" + out[-3000:])
else:
    sys.exit(f"unknown case {CASE}")
print(f"{CASE}: {'passed' if ok else 'FAILED'}")
sys.exit(0 if ok else 1)
