#!/usr/bin/env python3
"""xmesh-plan --many FILE end to end: 1,000 tensors of 4 KiB are planned as
packed tasks priced like one tensor of the same bytes (and far below one
plan per tensor); a mixed file (converting dtypes, a scalar, another mesh
shape on the same devices) sums its bytes; XMESH_PACK_BYTES=0 packs nothing;
bad files exit 2 naming the line and the value."""
import json
import os
import subprocess
import sys

exe, outdir = sys.argv[1], sys.argv[2]
os.makedirs(outdir, exist_ok=True)


def run(*args, rc=0, env=None):
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run([exe, *args], capture_output=True, text=True, env=e)
    if p.returncode != rc:
        sys.exit(f"{args}: exit {p.returncode}, expected {rc}\n{p.stdout}\n{p.stderr}")
    return p


def write(name, lines):
    path = os.path.join(outdir, name)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


ev = ["--max-evals", "20000"]
k = write("many_1k.txt", ["# 1,000 tensors of 4 KiB"] + ["1024 f32 2x4 S(0),S(0) 2x4 B,S(0)"] * 1000)
d = json.loads(run("--many", k, "--json", *ev).stdout)
assert d["tensors"] == 1000 and d["unit_tasks"] == 8000, d
assert d["bytes_total"] == 1000 * 4096, d
assert 1 <= d["scheduled_tasks"] <= 16 and d["packed_tasks"] >= 1 and d["pieces"] >= 7000, d
assert 0 < d["lower_bound_s"] <= d["predicted_s"] * (1 + 1e-9), d
one = json.loads(run("--shape", "1024000", "--dtype", "f32", "--src-mesh", "2x4", "--src-spec",
                     "S(0),S(0)", "--dst-mesh", "2x4", "--dst-spec", "B,S(0)", "--json", *ev).stdout)
assert d["predicted_s"] <= 2 * one["makespan_s"], (d["predicted_s"], one["makespan_s"])
assert d["per_tensor_serial_s"] > 5 * d["predicted_s"], d

# packing off: every unit task scheduled on its own, the same bytes
n = json.loads(run("--many", k, "--json", *ev, env={"XMESH_PACK_BYTES": "0"}).stdout)
assert n["packed_tasks"] == 0 and n["scheduled_tasks"] == n["unit_tasks"] == 8000, n
assert n["bytes_total"] == d["bytes_total"] and n["predicted_s"] > d["predicted_s"], (n, d)

mixed = write("many_mixed.txt", [
    "768,2304 bf16 2x4 S(0),S(0) 2x4 B,S(1)   # c_attn.weight",
    "2304 bf16 2x4 S(0),S(0) 2x4 B,S(0)",
    "768 f32 2x4 S(0),S(0) 2x4 B,B bf16       # converting",
    "- f32 2x4 B,B 4x2 B,B                    # a scalar, the 8 devices as 4x2",
    "0,5 i32 2x4 S(0),B 2x4 B,S(0)            # empty",
    "3,5 f32 2x4 P,B 2x4 S(0),B",
])
m = json.loads(run("--many", mixed, "--json", *ev).stdout)
want = 768 * 2304 * 2 + 2304 * 2 + 768 * 4 + 4 + 0 + 15 * 4
assert m["tensors"] == 6 and m["bytes_total"] == want, (m, want)
assert m["lower_bound_s"] <= m["predicted_s"] * (1 + 1e-9), m
txt = run("--many", mixed, *ev).stdout
assert "plan of 6 tensors" in txt and "lower bound" in txt and "per-tensor plans" in txt, txt

for lines, word in [(["8 f32 2x4 S(0),B 2x4"], "line 1: 5 fields"),
                    (["8 f32 2x4 S(0),B 2x4 B,B", "8 f32 2x4 S(7),B 2x4 B,B"], "S(7)"),
                    (["8 q9 2x4 S(0),B 2x4 B,B"], "'q9'"),
                    (["8 i32 2x4 S(0),B 2x4 B,B f32"], "no conversion"),
                    (["8 f32 2x2 S(0),B 2x4 B,B", "8 f32 2x4 S(0),B 2x4 B,B"], "line 2"),
                    (["# nothing"], "no layout pairs")]:
    p = run("--many", write("bad.txt", lines), rc=2)
    assert word in p.stderr, (lines, p.stderr)
p = run("--many", os.path.join(outdir, "missing.txt"), rc=2)
assert "cannot open" in p.stderr, p.stderr
assert "--many FILE" in run("--help").stdout
print("xmesh-plan --many checks passed")
