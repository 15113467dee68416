"""A two-stage pipeline whose stage meshes differ, on 8 processes, with
xmesh.torch carrying the activations forward and the gradients back.

Stage 0 on ranks 0-3, a 2x2 mesh (data parallel 2 x tensor parallel 2):
    H = tanh(X @ W0), X split by batch over "dp", W0 column-parallel over "tp"
    -> H is [Shard(0), Shard(1)].
Stage 1 on ranks 4-7, a 1-D mesh (tensor parallel 4):
    Y = H1 @ W1 with W1 row-parallel (Shard(0)) and H1 = H split by hidden
    features over all 4 ranks ([Shard(1)]), loss = sum(Y^2).
H -> H1 is a cross-mesh redistribution (different ranks, mesh shape and
placements): xmesh.torch.redistribute, whose backward moves dL/dH1 back to
stage 0's layout. Two microbatches accumulate gradients. Loss and both
weight gradients are checked against the same model in one process; exit
status 1 if they differ.

    mpirun -np 8 python python/examples/torch_pipeline.py
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

import xmesh.torch as xt

B, DIN, DH, DOUT, MICRO = 6, 5, 10, 3, 2  # DH = 10 over 4 ranks: torch.chunk 3, 3, 3, 1


def setup():
    env = os.environ
    if "RANK" not in env:
        env["RANK"], env["WORLD_SIZE"] = env["OMPI_COMM_WORLD_RANK"], env["OMPI_COMM_WORLD_SIZE"]
    env.setdefault("MASTER_ADDR", "127.0.0.1")
    env.setdefault("MASTER_PORT", "29542")
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    if dist.get_world_size() != 8:
        sys.exit("torch_pipeline: run with 8 processes")


def block(t, mesh, placements):
    if mesh.get_coordinate() is None:
        return torch.empty(0, dtype=t.dtype)
    shp, off = compute_local_shape_and_global_offset(t.shape, mesh, placements)
    return t[tuple(slice(o, o + s) for o, s in zip(off, shp))].clone()


def shard(t, mesh, placements, grad=False):
    local = block(t, mesh, placements)
    if grad:
        local.requires_grad_()
    return local, DTensor.from_local(local, mesh, placements, run_check=False, shape=t.shape, stride=t.stride())


def main():
    setup()
    rank = dist.get_rank()
    stage0 = DeviceMesh("cpu", [[0, 1], [2, 3]], mesh_dim_names=("dp", "tp"))
    stage1 = DeviceMesh("cpu", [4, 5, 6, 7], mesh_dim_names=("tp",))
    xt.init()
    g = torch.Generator().manual_seed(7)
    W0 = torch.randn(DIN, DH, generator=g, dtype=torch.float64)
    W1 = torch.randn(DH, DOUT, generator=g, dtype=torch.float64)
    Xs = [torch.randn(B, DIN, generator=g, dtype=torch.float64) for _ in range(MICRO)]

    # single-process reference
    W0r, W1r = W0.clone().requires_grad_(), W1.clone().requires_grad_()
    ref_loss = sum((torch.tanh(X @ W0r) @ W1r).pow(2).sum() for X in Xs)
    ref_loss.backward()

    # the pipeline
    w0_local, w0 = shard(W0, stage0, [Replicate(), Shard(1)], grad=True)
    w1_local, w1 = shard(W1, stage1, [Shard(0)], grad=True)
    total = torch.zeros((), dtype=torch.float64)
    for X in Xs:
        _, x = shard(X, stage0, [Shard(0), Replicate()])
        h = torch.tanh(x @ w0)  # stage 0: [Shard(0), Shard(1)] on the 2x2 mesh
        h1 = xt.redistribute(h, stage1, [Shard(1)])  # -> stage 1: hidden split over 4
        y = h1 @ w1  # Partial over stage 1
        if stage1.get_coordinate() is not None:
            loss = y.redistribute(stage1, [Replicate()]).to_local().pow(2).sum()
            loss.backward()  # stage 1's backward, then xmesh moves dL/dH to stage 0
            total = total + loss.detach()
        else:
            xt.nonmember_backward(h1)  # stage 0: receives dL/dH, then runs its own backward

    ok = True
    if stage1.get_coordinate() is not None:
        for what, good in (("loss", torch.allclose(total, ref_loss.detach(), rtol=1e-10)),
                           ("dW1", torch.allclose(w1_local.grad, block(W1r.grad, stage1, [Shard(0)]), rtol=1e-10))):
            ok &= good
            print(f"rank {rank}: {what} {'ok' if good else 'WRONG'}", flush=True) if not good else None
    if stage0.get_coordinate() is not None:
        # W0 is replicated over dp: torch's from_local backward sums the dp replicas' parts
        good = torch.allclose(w0_local.grad, block(W0r.grad, stage0, [Replicate(), Shard(1)]), rtol=1e-10)
        ok &= good
        if not good:
            print(f"rank {rank}: dW0 WRONG", flush=True)
    t = torch.tensor([0 if ok else 1])
    dist.all_reduce(t)
    if rank == 0:
        info = xt.cache_info()
        print(f"pipeline 2x2 (dp x tp) -> 4 (tp), {MICRO} microbatches: loss and gradients vs one process: "
              f"{'OK' if t.item() == 0 else 'WRONG'} (xmesh plans: {info.misses} made, {info.hits} reused)", flush=True)
    xt.shutdown()
    dist.destroy_process_group()
    return 0 if t.item() == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
