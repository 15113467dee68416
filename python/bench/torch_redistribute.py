"""xmesh.torch against PyTorch's own routes, on 8 processes (gloo, CPU).

1. Same mesh (8 ranks, 1-D): xmesh.torch.redistribute vs DTensor.redistribute
   for S(0) -> S(1), S(0) -> R and P -> S(0) of one [rows, cols] f32 tensor.
2. Across meshes: a GPT-2 124M-shaped state dict, FSDP Shard(0) on ranks 0-3
   -> TP-4 (column / row / vocabulary parallel, norms and biases as torch
   TP keeps them) on ranks 4-7: xmesh.torch.redistribute_state_dict vs the
   route PyTorch users take today, full_tensor() on the source mesh, a
   broadcast to the target ranks, distribute_tensor on the target mesh.

A figure is the wall time of one whole operation on the slowest rank (a
barrier before each iteration, the maximum over ranks after), after the
warm-up (which makes xmesh's plans); median, min and max over --iters. Every
result is checked once against the source. Prints a table and, with --json,
writes the figures.

    torchrun --standalone --nproc-per-node 8 python/bench/torch_redistribute.py
        [--rows 4096 --cols 1024] [--scale 1.0] [--iters 10] [--warmup 2] [--json out.json]
    mpirun -np 8 python python/bench/torch_redistribute.py [same options]
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

import xmesh.torch as xt


def setup():
    env = os.environ
    if "RANK" not in env:
        env["RANK"], env["WORLD_SIZE"] = env["OMPI_COMM_WORLD_RANK"], env["OMPI_COMM_WORLD_SIZE"]
    env.setdefault("MASTER_ADDR", "127.0.0.1")
    env.setdefault("MASTER_PORT", "29543")
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    if dist.get_world_size() != 8:
        sys.exit("torch_redistribute: run with 8 processes")


def block(t, mesh, placements):
    if mesh.get_coordinate() is None:
        return torch.empty(0, dtype=t.dtype)
    shp, off = compute_local_shape_and_global_offset(t.shape, mesh, placements)
    return t[tuple(slice(o, o + s) for o, s in zip(off, shp))].clone()


def dtensor(t, mesh, placements):
    local = block(t, mesh, [Replicate() if isinstance(p, Partial) else p for p in placements])
    if any(isinstance(p, Partial) for p in placements) and mesh.get_coordinate() is not None:
        local = local / mesh.size()  # partial sums that add up to t
    return DTensor.from_local(local.contiguous(), mesh, placements, run_check=False, shape=t.shape, stride=t.stride())


def timed(fn, iters, warmup):
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        out.append(t.item())
    return {"median_s": statistics.median(out), "min_s": min(out), "max_s": max(out), "iters": iters}


def check(out, full, mesh, placements, what):
    if mesh.get_coordinate() is None:
        return 0
    want = block(full, mesh, placements)
    return 0 if torch.allclose(out.to_local(), want, rtol=1e-5, atol=1e-5) else print(f"{what}: WRONG") or 1


def gpt2_shapes(scale):
    V, C, T, L = int(50257 * scale) or 1, 768, 1024, 12
    C = max(4, int(C * scale ** 0.5) // 4 * 4)
    s = {"wte": (V, C), "wpe": (T, C)}
    for i in range(L):
        p = f"h.{i}."
        s.update({p + "ln_1.weight": (C,), p + "ln_1.bias": (C,), p + "attn.c_attn.weight": (3 * C, C), p + "attn.c_attn.bias": (3 * C,),
                  p + "attn.c_proj.weight": (C, C), p + "attn.c_proj.bias": (C,), p + "ln_2.weight": (C,), p + "ln_2.bias": (C,),
                  p + "mlp.c_fc.weight": (4 * C, C), p + "mlp.c_fc.bias": (4 * C,), p + "mlp.c_proj.weight": (C, 4 * C), p + "mlp.c_proj.bias": (C,)})
    s.update({"ln_f.weight": (C,), "ln_f.bias": (C,)})
    return s


def tp_placements(name, _t=None):
    if name == "wte" or "c_attn" in name or "c_fc" in name:
        return [Shard(0)]  # vocabulary / column parallel ([out, in] weights, their biases)
    if name.endswith("c_proj.weight"):
        return [Shard(1)]  # row parallel
    return [Replicate()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=1024)
    ap.add_argument("--scale", type=float, default=1.0, help="GPT-2 shapes scaled (1.0: 124M parameters)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--json")
    a = ap.parse_args()
    setup()
    rank = dist.get_rank()
    xt.init()
    xt.set_cache_size(1024)  # the whole state dict planned once (a plan per tensor of each layout)
    results, wrong = [], 0
    world = DeviceMesh("cpu", list(range(8)))
    g = torch.Generator().manual_seed(3)
    full = torch.randn(a.rows, a.cols, generator=g)
    for name, sp, dp in [("S(0)->S(1)", [Shard(0)], [Shard(1)]), ("S(0)->R", [Shard(0)], [Replicate()]), ("P->S(0)", [Partial()], [Shard(0)])]:
        src = dtensor(full, world, sp)
        wrong += check(xt.redistribute(src, world, dp), full, world, dp, "xmesh " + name)
        wrong += check(src.redistribute(world, dp), full, world, dp, "torch " + name)
        for who, fn in (("xmesh.torch", lambda: xt.redistribute(src, world, dp)), ("DTensor.redistribute", lambda: src.redistribute(world, dp))):
            r = timed(fn, a.iters, a.warmup)
            r.update(case=f"same mesh 8: {name} [{a.rows}, {a.cols}] f32", method=who, bytes=full.numel() * 4)
            results.append(r)

    trainer, engine = DeviceMesh("cpu", [0, 1, 2, 3]), DeviceMesh("cpu", [4, 5, 6, 7])
    shapes = gpt2_shapes(a.scale)
    fulls = {n: torch.randn(s, generator=g) for n, s in shapes.items()}
    sd = {n: dtensor(t, trainer, [Shard(0)]) for n, t in fulls.items()}
    nbytes = sum(t.numel() for t in fulls.values()) * 4
    out = xt.redistribute_state_dict(sd, engine, tp_placements)
    for n, t in out.items():
        wrong += check(t, fulls[n], engine, tp_placements(n), "xmesh state dict " + n)

    def torch_route():
        res = {}
        for n, d in sd.items():
            f = d.full_tensor() if trainer.get_coordinate() is not None else torch.empty(shapes[n])
            dist.broadcast(f, src=0)  # the trainer's rank 0 to everyone (users: to the engine ranks)
            res[n] = distribute_tensor(f, engine, tp_placements(n)) if engine.get_coordinate() is not None else None
        return res

    res = torch_route()
    for n, t in res.items():
        if t is not None:
            wrong += check(t, fulls[n], engine, tp_placements(n), "torch route " + n)
    case = f"GPT-2 124M x{a.scale:g} state dict ({len(shapes)} tensors, {nbytes / 2**20:.1f} MiB): S(0) on 0-3 -> TP 4 on 4-7"
    for who, fn in (("xmesh.torch", lambda: xt.redistribute_state_dict(sd, engine, tp_placements)), ("full_tensor+distribute_tensor", torch_route)):
        r = timed(fn, a.iters, a.warmup)
        r.update(case=case, method=who, bytes=nbytes)
        results.append(r)

    t = torch.tensor([wrong])
    dist.all_reduce(t)
    if rank == 0:
        print(f"{'case':<86} {'method':<30} {'median s':>9} {'min s':>9} {'max s':>9}")
        for r in results:
            print(f"{r['case']:<86} {r['method']:<30} {r['median_s']:9.4f} {r['min_s']:9.4f} {r['max_s']:9.4f}")
        print(f"wrong results: {t.item()}")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"results": results, "wrong": int(t.item()), "torch": torch.__version__, "args": vars(a)}, f, indent=1)
            print(f"json: {a.json}")
    xt.shutdown()
    dist.destroy_process_group()
    return 0 if t.item() == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
