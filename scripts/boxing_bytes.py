#!/usr/bin/env python3
"""Boxing bytes per rank per step for GPT-2 124M shapes (docs/BOXING_BYTES.md).

Runs build/microbench/boxing-bytes/xmesh-boxing-bytes (one training step, one stage) for each
(strategy, mesh) at small sizes and scales the exact counts to GPT-2 124M:
  per block      = bytes(L=2, V=256) - bytes(L=1, V=256)             (exact per layer)
  fixed(Vp)      = bytes(L=1, V) - per block, affine in Vp: slope from V = 256 and 512,
                   checked exactly at V = 384 (the run fails if the check does not hold)
  step(L, Vp)    = fixed(256) + slope * (Vp - 256) + L * per block
for L = 12, Vp = 50304 (llm.c pads 50257 to a multiple of 128). Bytes are per rank, the
ring-equivalent convention of pipeline/nn/sbp.h; the maximum over ranks is reported.
Compares with (a) the analytic per-block formulas of docs/STRATEGY.md and (b) the layout search's
model (xmesh-train gpt plan --eval: boxing_bytes_per_rank of the real 12-layer configuration).
"""
import argparse, json, math, os, subprocess, sys

PHASES = ["forward", "backward", "grad_reduce", "storage_gather", "other"]
KINDS = ["allreduce", "allgather", "reduce_scatter", "alltoall"]
CONFIGS = [  # (ranks, strategy, mesh)
    (8, "dp", "8"), (8, "megatron", "2x4"), (8, "3d", "2x2x2"), (8, "axonn", "2x2x2"),
    (16, "dp", "16"), (16, "megatron", "4x4"), (16, "3d", "4x2x2"), (16, "axonn", "4x2x2"),
]


def run(args, n, strat, mesh, L, V):
    cmd = [args.mpirun, "-n", str(n), "--oversubscribe", args.exe, "--layers", str(L), "--heads",
           str(args.heads), "--channels", str(args.channels), "--vocab", str(V), "--batch",
           str(args.batch), "--seq", str(args.seq), "--strategy", strat, "--mesh", mesh]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OPENBLAS_NUM_THREADS="1")
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode:
        sys.exit("failed (%d): %s\n%s" % (p.returncode, " ".join(cmd), p.stderr[-2000:]))
    return json.loads(p.stdout)


def vec(d):
    """rank -> phase -> kind -> bytes"""
    return [[r[ph]["bytes"] for ph in PHASES] for r in d["per_rank"]]


def lin(a, b, fa, fb):
    return [[[fa * x + fb * y for x, y in zip(ka, kb)] for ka, kb in zip(pa, pb)]
            for pa, pb in zip(a, b)]


def search_bytes(args, n, strat, mesh, L):
    cmd = [args.train, "gpt", "plan", "--layers", str(L), "--heads", str(args.heads), "--channels",
           str(args.channels), "--vocab", str(args.vocab), "--max-seq", str(args.seq), "--batch",
           str(args.batch), "--seq", str(args.seq), "--ranks", str(n), "--eval", "--stage-mesh",
           mesh, "--strategy", strat, "--microbatches", "1", "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        sys.exit("search eval failed: %s\n%s" % (" ".join(cmd), p.stderr))
    return json.loads(p.stdout)["boxing_bytes_per_rank"]


def analytic_block(strat, mesh, C, m):
    """docs/STRATEGY.md 'Communication each built-in implies', per block, bytes (fp32), with the
    ring factors of its header kept. Returns (forward, backward, grad_reduce, storage_gather)."""
    sh = [int(x) for x in mesh.split("x")]
    f4 = 4.0
    W = 12 * C * C
    if strat == "dp":
        p = sh[0] if len(sh) == 1 else math.prod(sh)
        return 0, 0, f4 * 2 * (p - 1) / p * W, 0
    if strat == "megatron":
        t = sh[-1]
        d = math.prod(sh[:-1]) if len(sh) > 1 else 1
        a = f4 * 2 * 2 * (t - 1) / t * (m / d) * C
        return a, a, f4 * (2 * (d - 1) / d * W / t if d > 1 else 0), 0
    p0, p1, p2 = sh[-3:]
    q = math.sqrt(p1 * p2)
    a = f4 * 16 * m * C / (p0 * q)
    g = f4 * 2 * (p0 - 1) / p0 * W / (p1 * p2)
    if strat == "axonn":
        return a, a, g / 2, g / 2
    return a, a, g, 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--out", default="microbench/charts/results/boxing-bytes")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--channels", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--only", default="", help="comma list of 'N:strategy:mesh' (default: all)")
    ap.add_argument("--reuse", action="store_true",
                    help="no MPI runs: rebuild the tables from OUT/boxing-bytes.json")
    args = ap.parse_args()
    args.exe = os.path.join(args.build, "microbench/boxing-bytes/xmesh-boxing-bytes")
    args.train = os.path.join(args.build, "pipeline/xmesh-train")
    Vp = (args.vocab + 127) // 128 * 128
    m = args.batch * args.seq
    if args.reuse:
        with open(os.path.join(args.out, "boxing-bytes.json")) as f:
            write(args, json.load(f)["rows"], Vp)
        return
    configs = CONFIGS
    if args.only:
        configs = [(int(a), b, c) for a, b, c in (x.split(":") for x in args.only.split(","))]
    rows = []
    for n, strat, mesh in configs:
        r1 = vec(run(args, n, strat, mesh, 1, 256))
        r2 = vec(run(args, n, strat, mesh, 2, 256))
        r5 = vec(run(args, n, strat, mesh, 1, 512))
        r3 = vec(run(args, n, strat, mesh, 1, 384))
        blk = lin(r2, r1, 1, -1)
        fix256 = lin(r1, blk, 1, -1)
        slope = lin(lin(r5, blk, 1, -1), fix256, 1 / 256, -1 / 256)
        pred384 = lin(fix256, slope, 1, 128)
        chk = lin(lin(r3, blk, 1, -1), pred384, 1, -1)
        worst = max(abs(x) for rk in chk for ph in rk for x in ph)
        if worst > 1e-3:
            sys.exit("%s %s: bytes are not affine in the vocabulary (off by %g at V=384)" %
                     (strat, mesh, worst))
        step = lin(lin(fix256, slope, 1, Vp - 256), blk, 1, args.layers)
        nr = len(step)
        tot = [sum(sum(ph) for ph in rk) for rk in step]
        top = max(range(nr), key=lambda r: tot[r])
        ph_step = {PHASES[i]: sum(step[top][i]) for i in range(len(PHASES))}
        btot = [sum(sum(ph) for ph in rk) for rk in blk]
        btop = max(range(nr), key=lambda r: btot[r])
        ph_blk = {PHASES[i]: sum(blk[btop][i]) for i in range(len(PHASES))}
        blk_kinds = {PHASES[i]: dict(zip(KINDS, blk[btop][i])) for i in range(len(PHASES))}
        kinds = {k: sum(step[top][i][j] for i in range(len(PHASES)))
                 for j, k in enumerate(["allreduce", "allgather", "reduce_scatter", "alltoall"])}
        an = analytic_block(strat, mesh, args.channels, m)
        model = None
        row = dict(ranks=n, strategy=strat, mesh=mesh, step_bytes_max_rank=max(tot),
                   step_bytes_min_rank=min(tot), step_phases=ph_step, step_kinds=kinds,
                   block_phases_max_rank=ph_blk, block_rank=btop, step_rank=top,
                   block_phase_kinds=blk_kinds, per_rank_step=step, per_rank_block=blk,
                   analytic_block=dict(zip(PHASES[:4], an)), search_model_step=model,
                   ratio_search=max(tot) / model if model else None,
                   ratio_analytic_block={PHASES[i]: (ph_blk[PHASES[i]] / an[i] if an[i] else None)
                                         for i in range(4)})
        rows.append(row)
        print("%2d %-8s %-7s step %.4g B/rank" % (n, strat, mesh, max(tot)), file=sys.stderr)
    write(args, rows, Vp)


def add_model(args, r):
    """The search model's step (L layers), per block (L=2 minus L=1) and fixed part."""
    n, strat, mesh = r["ranks"], r["strategy"], r["mesh"]
    e1, e2 = search_bytes(args, n, strat, mesh, 1), search_bytes(args, n, strat, mesh, 2)
    model = search_bytes(args, n, strat, mesh, args.layers)
    r["search_model_step"] = model
    r["search_model_block"] = e2 - e1
    r["search_model_fixed"] = e1 - (e2 - e1)
    r["block_bytes_max_rank"] = sum(r["block_phases_max_rank"].values())
    r["fixed_bytes_max_rank"] = r["step_bytes_max_rank"] - args.layers * r["block_bytes_max_rank"]
    r["ratio_search"] = r["step_bytes_max_rank"] / model if model else None
    r["ratio_search_block"] = (r["block_bytes_max_rank"] / r["search_model_block"]
                               if r["search_model_block"] else None)


def write(args, rows, Vp):
    for r in rows:
        add_model(args, r)
    os.makedirs(args.out, exist_ok=True)
    res = dict(model=dict(layers=args.layers, heads=args.heads, channels=args.channels,
                          vocab=args.vocab, padded_vocab=Vp, batch=args.batch, seq=args.seq,
                          microbatches=1),
               method="per block = L2 - L1 at V=256; fixed part affine in Vp (V=256, 512; checked "
                      "at 384); step = fixed(Vp) + L * per block; bytes per rank, max over ranks",
               rows=rows)
    with open(os.path.join(args.out, "boxing-bytes.json"), "w") as f:
        json.dump(res, f, indent=1)
    mb = lambda x: "%.2f" % (x / 2**20) if x is not None else "-"
    rt = lambda x: "%.3f" % x if x is not None else "-"
    lines = ["Per step, %d layers (MiB per rank, the rank that sends most):\n" % args.layers,
             "| ranks | strategy | mesh | step | fwd act | bwd act | grad reduce | storage gather "
             "| search model | measured / model |", "|" + "---|" * 10]
    for r in rows:
        p = r["step_phases"]
        lines.append("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |"
                     % (r["ranks"], r["strategy"], r["mesh"], mb(r["step_bytes_max_rank"]),
                        mb(p["forward"]), mb(p["backward"]), mb(p["grad_reduce"]),
                        mb(p["storage_gather"]), mb(r["search_model_step"]), rt(r["ratio_search"])))
    lines += ["", "Per transformer block (MiB, the rank that sends most per block; analytic = docs/STRATEGY.md with ring "
              "factors; model = search, L=2 minus L=1) and the fixed part (embedding, head, loss):\n",
              "| ranks | strategy | mesh | fwd (analytic) | bwd (analytic) | grad+gather (analytic) "
              "| block | block model | measured / model | fixed | fixed model |", "|" + "---|" * 11]
    for r in rows:
        b, a = r["block_phases_max_rank"], r["analytic_block"]
        lines.append("| %d | %s | %s | %s (%s) | %s (%s) | %s (%s) | %s | %s | %s | %s | %s |"
                     % (r["ranks"], r["strategy"], r["mesh"], mb(b["forward"]), mb(a["forward"]),
                        mb(b["backward"]), mb(a["backward"]),
                        mb(b["grad_reduce"] + b["storage_gather"]),
                        mb(a["grad_reduce"] + a["storage_gather"]), mb(r["block_bytes_max_rank"]),
                        mb(r["search_model_block"]), rt(r["ratio_search_block"]),
                        mb(r["fixed_bytes_max_rank"]), mb(r["search_model_fixed"])))
    table = "\n".join(lines)
    with open(os.path.join(args.out, "boxing-bytes.md"), "w") as f:
        f.write(table + "\n")
    with open(os.path.join(args.out, "boxing-bytes.dat"), "w") as f:
        f.write("# config fwd bwd grad gather (MiB per rank per step)\n")
        for r in rows:
            p = r["step_phases"]
            f.write('"%s %s" %.4f %.4f %.4f %.4f\n' % (r["strategy"], r["mesh"], p["forward"] / 2**20,
                    p["backward"] / 2**20, p["grad_reduce"] / 2**20, p["storage_gather"] / 2**20))
    print(table)


if __name__ == "__main__":
    main()
