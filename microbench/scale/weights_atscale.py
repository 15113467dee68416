#!/usr/bin/env python3
"""Whole-model weight transfer at scale, by simulation (issue 35 item 6).

Writes the parameter list of a model as an `xmesh-plan --many` file (one
layout pair per tensor) and plans it as ONE plan of many tensors with the
library's own decomposer, scheduler and cost model: no MPI, nothing moves.
Reports plan time, predicted time, lower bound and bytes per NIC.

Cases (shapes and layouts: docs/WEIGHTS_ATSCALE.md says where each comes from):
  kimi-k2   Kimi-K2 (1.04T parameters, bf16) from 256 training GPUs
            (32 hosts x 8; experts split over hosts (EP 32) and each expert
            FSDP-split over the 8 GPUs of its host; every other weight FSDP
            S(0) over all 256) to 128 inference GPUs (16 hosts x 8; experts
            EP 128, attention and dense weights tensor parallel 8 inside a
            host and replicated over hosts, as DP-attention engines run).
  dsv3      DeepSeek-V3 (671B, bf16) from PP16 x EP16 (256 GPUs, 32 hosts x 8:
            pipeline stage = 2 hosts, experts split over the 16 GPUs of the
            stage) to TP32 x DP8 (256 other GPUs, 32 hosts x 8: 8 replicas
            of 4 hosts, every weight split 32 ways inside a replica).
            The layers of a kind are stacked into one tensor [L, ...] whose
            dim 0 is split over the pipeline axis: what lies on stage k is
            what PP would put there (array_split of the layers).

usage: microbench/scale/weights_atscale.py [--plan build/tools/xmesh-plan]
       [--out DIR] [--cases kimi-k2,dsv3] [--nics 8] [--nic-gbps 400]
       [--intra-gbps 3600] [--reps 3] [--list-only]
"""
import argparse
import json
import os
import subprocess
import sys
import time

# Kimi-K2 (Megatron Bridge KimiK2Provider; Kimi-K2-Instruct config.json):
KIMI = dict(layers=61, hidden=7168, ffn=18432, moe_ffn=2048, experts=384, shared=1,
            dense_layers=1, heads=64, q_lora=1536, kv_lora=512, nope=128, rope=64, v=128,
            vocab=163840)
# DeepSeek-V3 (DeepSeek-V3 technical report, config.json):
DSV3 = dict(layers=61, hidden=7168, ffn=18432, moe_ffn=2048, experts=256, shared=1,
            dense_layers=3, heads=128, q_lora=1536, kv_lora=512, nope=128, rope=64, v=128,
            vocab=129280)


def mla_tensors(m):
    """Per-layer attention and norm weights: (name, shape, kind) with kind
    one of col (output features split under TP), row (input features split),
    rep (replicated under TP), vocab."""
    h, H = m["hidden"], m["heads"]
    return [
        ("input_layernorm", [h], "rep"),
        ("q_a_proj", [m["q_lora"], h], "rep"),
        ("q_a_layernorm", [m["q_lora"]], "rep"),
        ("q_b_proj", [H * (m["nope"] + m["rope"]), m["q_lora"]], "col"),
        ("kv_a_proj_with_mqa", [m["kv_lora"] + m["rope"], h], "rep"),
        ("kv_a_layernorm", [m["kv_lora"]], "rep"),
        ("kv_b_proj", [H * (m["nope"] + m["v"]), m["kv_lora"]], "col"),
        ("o_proj", [h, H * m["v"]], "row"),
        ("post_attention_layernorm", [h], "rep"),
    ]


def mlp_tensors(m, moe):
    h = m["hidden"]
    if not moe:
        f = m["ffn"]
        return [("mlp.gate_proj", [f, h], "col"), ("mlp.up_proj", [f, h], "col"),
                ("mlp.down_proj", [h, f], "row")]
    E, f, fs = m["experts"], m["moe_ffn"], m["moe_ffn"] * m["shared"]
    return [
        ("mlp.gate.weight", [E, h], "rep"),
        ("mlp.gate.e_score_correction_bias", [E], "rep"),
        # Routed experts stacked [E, out, in] as grouped-GEMM trainers hold them.
        ("mlp.experts.gate_proj", [E, f, h], "ecol"),
        ("mlp.experts.up_proj", [E, f, h], "ecol"),
        ("mlp.experts.down_proj", [E, h, f], "erow"),
        ("mlp.shared_experts.gate_proj", [fs, h], "col"),
        ("mlp.shared_experts.up_proj", [fs, h], "col"),
        ("mlp.shared_experts.down_proj", [h, fs], "row"),
    ]


def model_tensors(m):
    out = [("model.embed_tokens", [m["vocab"], m["hidden"]], "vocab")]
    for layer in range(m["layers"]):
        moe = layer >= m["dense_layers"]
        for name, shape, kind in mla_tensors(m) + mlp_tensors(m, moe):
            out.append((f"model.layers.{layer}.{name}", shape, kind))
    out.append(("model.norm", [m["hidden"]], "rep"))
    out.append(("lm_head", [m["vocab"], m["hidden"]], "vocab"))
    return out


def gspmd(nd, splits):
    """GSPMD spec of an nd-dim tensor: splits maps tensor dim -> mesh axes."""
    return "".join("S" + "".join(str(a) for a in splits[d]) if d in splits else "R"
                   for d in range(nd))


def kimi_lines(m):
    """256 GPUs (32x8) -> 128 GPUs (16x8). Source: experts EP over hosts
    (dim 0 over axis 0) and FSDP inside the host (dim 1 over axis 1); every
    other weight FSDP S(0) over all 256 (dim 0 over axes 0,1).
    Destination: experts EP 128 (dim 0 over axes 0,1); attention and dense
    weights TP 8 in a host (col: dim 0, row: dim 1 over axis 1), replicated
    over hosts; the vocabulary split 8 ways in a host."""
    lines = []
    for name, shape, kind in model_tensors(m):
        nd = len(shape)
        if kind in ("ecol", "erow"):
            src = gspmd(nd, {0: [0], 1: [1]})
            dst = gspmd(nd, {0: [0, 1]})
        else:
            src = gspmd(nd, {0: [0, 1]})
            if kind in ("col", "vocab"):
                dst = gspmd(nd, {0: [1]})
            elif kind == "row":
                dst = gspmd(nd, {1: [1]})
            else:
                dst = gspmd(nd, {})
        lines.append((name, shape, "32x8", src, "16x8", dst))
    return lines


def dsv3_lines(m):
    """PP16 x EP16 (32 hosts x 8) -> TP32 x DP8 (32 other hosts x 8).
    The first line (the embedding) fixes the devices: 32x8 on each side; later
    meshes reuse them in row-major order: 16x2x8 = (stage, host of the stage,
    GPU) and 8x4x8 = (replica, host of the replica, GPU).
    Layers of one kind are stacked [L, ...], dim 0 split over the stage axis."""
    lines = []
    h, v = m["hidden"], m["vocab"]
    # Embedding on stage 0 and head on stage 15 in a real PP run; here both
    # FSDP-free and replicated over their stage's 16 GPUs is the usual choice.
    # The 32x8 meshes of the first line only define the devices: the
    # embedding is written as held by its stage (stacked dim trick does not
    # apply), so it is replicated over the first stage's two hosts.
    lines.append(("model.embed_tokens", [1, v, h], "16x2x8", "S0RR", "8x4x8", "RS12R"))
    lines.insert(0, ("(device definition) model.norm", [h], "32x8", "R", "32x8", "R"))
    L, nd = m["layers"], m["dense_layers"]
    kinds = {}
    for layer in range(L):
        moe = layer >= nd
        for name, shape, kind in mla_tensors(m) + mlp_tensors(m, moe):
            key = ("moe." if moe and name.startswith("mlp.") else "") + name
            kinds.setdefault(key, [shape, kind, 0])[2] += 1
    for name, (shape, kind, count) in kinds.items():
        full = [count] + shape
        n = len(full)
        if kind in ("ecol", "erow"):
            src = gspmd(n, {0: [0], 1: [1, 2]})  # stage, experts over the stage's 16 GPUs
            dst = gspmd(n, {2: [1, 2]} if kind == "ecol" else {3: [1, 2]})
        else:
            src = gspmd(n, {0: [0]})  # replicated over the stage's 16 GPUs
            if kind in ("col", "vocab"):
                dst = gspmd(n, {1: [1, 2]})
            elif kind == "row":
                dst = gspmd(n, {2: [1, 2]})
            else:
                dst = gspmd(n, {})
        lines.append((f"layers.{name} x{count}", full, "16x2x8", src, "8x4x8", dst))
    lines.append(("lm_head", [1, v, h], "16x2x8", "S0RR", "8x4x8", "RS12R"))
    return lines


CASES = {"kimi-k2": (KIMI, kimi_lines), "dsv3": (DSV3, dsv3_lines)}


def write_many(path, lines):
    with open(path, "w") as f:
        for name, shape, sm, ss, dm, ds in lines:
            f.write(f"# {name}\n{','.join(map(str, shape))} bf16 {sm} {ss} {dm} {ds}\n")


def run_plan(a, path, chunk):
    """One xmesh-plan --many run: its JSON plus the process's wall and CPU seconds."""
    before = os.times()
    t0 = time.monotonic()
    p = subprocess.run([a.plan, "--many", path, "--json", "--nics-per-host", str(a.nics),
                        "--nic-gbps", str(a.nic_gbps), "--intra-gbps", str(a.intra_gbps),
                        "--latency-us", str(a.latency_us), "--chunk-bytes", str(chunk)],
                       capture_output=True, text=True)
    wall = time.monotonic() - t0
    after = os.times()
    if p.returncode:
        sys.exit(f"{path}: xmesh-plan failed ({p.returncode}): {p.stderr.strip()}")
    j = json.loads(p.stdout)
    j["process_wall_s"] = wall
    j["process_cpu_s"] = (after.children_user - before.children_user +
                          after.children_system - before.children_system)
    return j


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--plan", default="build/tools/xmesh-plan")
    ap.add_argument("--out", default="build/weights-atscale")
    ap.add_argument("--cases", default="kimi-k2,dsv3")
    ap.add_argument("--nics", type=int, default=8)
    ap.add_argument("--nic-gbps", type=float, default=400)
    ap.add_argument("--intra-gbps", type=float, default=3600)
    ap.add_argument("--latency-us", type=float, default=5)
    ap.add_argument("--chunks", default="262144,1048576,4194304",
                    help="pipelining chunk sizes in bytes, comma-separated")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--list-only", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    results = []
    for case in a.cases.split(","):
        m, gen = CASES[case]
        lines = gen(m)
        params = 0
        for l in lines:
            if not l[0].startswith("("):
                n = 1
                for d in l[1]:
                    n *= d
                params += n
        path = os.path.join(a.out, f"{case}.many")
        write_many(path, lines)
        print(f"{case}: {len(lines)} tensors, {params / 1e9:.1f}B parameters -> {path}",
              flush=True)
        if a.list_only:
            continue
        for chunk in (int(c) for c in a.chunks.split(",")):
            runs = sorted((run_plan(a, path, chunk) for _ in range(a.reps)),
                          key=lambda j: j["plan_ms"])
            med = dict(runs[len(runs) // 2])
            med.update(case=case, params=params, chunk=chunk,
                       plan_ms_min=runs[0]["plan_ms"], plan_ms_max=runs[-1]["plan_ms"])
            results.append(med)
            print(f"  chunk {chunk >> 10} KiB: bound {med['lower_bound_s']:.3f} s, predicted "
                  f"{med['predicted_s']:.3f} s ({med['ratio']:.3f}x), plan "
                  f"{med['plan_ms'] / 1e3:.2f} s", flush=True)
    with open(os.path.join(a.out, "weights_atscale.json"), "w") as f:
        json.dump(results, f, indent=1)
    hdr = ("| case | tensors | unit tasks (scheduled) | chunk | plan s (decompose s) | lower bound s "
           "| predicted s | ratio | one plan per tensor s | busiest NIC recv: s, GiB | "
           "most sent by a NIC GiB |")
    rows = [hdr, "|" + "---|" * (hdr.count("|") - 1)]
    for r in results:
        rows.append(
            f"| {r['case']} | {r['tensors']} | {r['unit_tasks']:,} ({r['scheduled_tasks']:,}) | "
            f"{r['chunk'] >> 10} KiB | {r['plan_ms'] / 1e3:.2f} ({r['decompose_ms'] / 1e3:.2f}) | "
            f"{r['lower_bound_s']:.3f} | {r['predicted_s']:.3f} | {r['ratio']:.3f} | "
            f"{r['per_tensor_serial_s']:.3f} | {r['busiest_recv_s']:.3f}, "
            f"{r['most_recv_bytes'] / 2**30:.2f} | {r['most_send_bytes'] / 2**30:.2f} |")
    table = "\n".join(rows) + "\n"
    with open(os.path.join(a.out, "weights_atscale.md"), "w") as f:
        f.write(table)
    print(table)


if __name__ == "__main__":
    main()
