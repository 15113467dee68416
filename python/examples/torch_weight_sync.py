"""RL-style weight sync with xmesh.torch, on 8 processes: the trainer holds an
FSDP-style Shard(0) state dict on ranks 0-3; the inference engine wants it
tensor-parallel over 4 ranks (4-7), column-parallel projections split by
output features (Shard(0) of a [out, in] weight), row-parallel ones by input
features (Shard(1)), the vocabulary-parallel embedding by rows, norms
replicated. Every element on the inference side is checked against the
trainer's tensors; exit status 1 if one is wrong.

    mpirun -np 8 python python/examples/torch_weight_sync.py      # or
    torchrun --nproc-per-node 8 python/examples/torch_weight_sync.py   (MPI-free bootstrap)
"""

import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

import xmesh.torch as xt


def setup():
    env = os.environ
    if "RANK" not in env:  # under mpirun
        env["RANK"], env["WORLD_SIZE"] = env["OMPI_COMM_WORLD_RANK"], env["OMPI_COMM_WORLD_SIZE"]
    env.setdefault("MASTER_ADDR", "127.0.0.1")
    env.setdefault("MASTER_PORT", "29541")
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    if dist.get_world_size() != 8:
        sys.exit("torch_weight_sync: run with 8 processes")


# A small decoder's parameter names and shapes (uneven over 4 on purpose:
# vocabulary 50 -> torch.chunk 13, 13, 13, 11; hidden 36, ffn 90).
VOCAB, D, FFN, LAYERS = 50, 36, 90, 2
COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROW = ("o_proj", "down_proj")


def shapes():
    out = {"embed_tokens.weight": (VOCAB, D)}
    for i in range(LAYERS):
        p = f"layers.{i}."
        out.update({
            p + "input_layernorm.weight": (D,),
            p + "q_proj.weight": (D, D), p + "k_proj.weight": (D, D), p + "v_proj.weight": (D, D),
            p + "o_proj.weight": (D, D),
            p + "gate_proj.weight": (FFN, D), p + "up_proj.weight": (FFN, D), p + "down_proj.weight": (D, FFN),
        })
    out["norm.weight"] = (D,)
    out["lm_head.weight"] = (VOCAB, D)
    return out


def inference_placements(name, _t):
    """What a TP inference engine keeps of each weight."""
    if any(k in name for k in COLUMN) or name.startswith(("embed_tokens", "lm_head")):
        return [Shard(0)]
    if any(k in name for k in ROW):
        return [Shard(1)]
    return [Replicate()]


def main():
    setup()
    rank = dist.get_rank()
    trainer = DeviceMesh("cpu", [0, 1, 2, 3])  # FSDP: Shard(0) over 4
    engine = DeviceMesh("cpu", [4, 5, 6, 7])  # TP 4
    xt.init()
    g = torch.Generator().manual_seed(1234)
    full = {n: torch.randn(s, generator=g) for n, s in shapes().items()}  # the trainer's weights
    sd = {}
    for n, t in full.items():  # each trainer rank's FSDP shard (torch.chunk rows), no communication
        if trainer.get_coordinate() is not None:
            shp, off = compute_local_shape_and_global_offset(t.shape, trainer, [Shard(0)])
            local = t[tuple(slice(o, o + s) for o, s in zip(off, shp))].clone()
        else:
            local = torch.empty(0)
        sd[n] = DTensor.from_local(local, trainer, [Shard(0)], run_check=False, shape=t.shape, stride=t.stride())

    wrong = 0
    for step in range(3):  # a sync per RL iteration: planned once, then cached
        for n in full:  # the trainer's update
            if sd[n].to_local().numel():
                sd[n].to_local().add_(0.5)
            full[n] += 0.5
        t0 = time.perf_counter()
        out = xt.redistribute_state_dict(sd, engine, inference_placements)
        dt = time.perf_counter() - t0
        for n, t in out.items():
            if engine.get_coordinate() is None:
                continue
            shp, off = compute_local_shape_and_global_offset(t.shape, engine, t.placements)
            want = full[n][tuple(slice(o, o + s) for o, s in zip(off, shp))]
            if not torch.equal(t.to_local(), want):
                wrong += 1
                print(f"rank {rank}: step {step}: {n} {list(t.placements)} WRONG", flush=True)
        if rank == 4:
            print(f"step {step}: {len(out)} tensors synced in {dt * 1e3:.1f} ms (plan cache {tuple(xt.cache_info())})", flush=True)
    t = torch.tensor([wrong])
    dist.all_reduce(t)
    if rank == 0:
        print(f"weight sync Shard(0) on ranks 0-3 -> TP 4 on ranks 4-7: {'OK' if t.item() == 0 else 'WRONG'}", flush=True)
    xt.shutdown()
    dist.destroy_process_group()
    return 0 if t.item() == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
