#!/usr/bin/env python3
"""The loop features of the one trainer (apps/trainer.h) against the serial reference.

usage: test_train_loop.py CASE TRAIN MPIEXEC

Each case runs one model with --grad-accum, --grad-clip, --warmup/--lr-decay/--lr-min-frac in a
parallel layout under --check-serial (every step's loss against the serial reference trained on
rank 0 with the same loop: 1e-5 relative over steps 0-4, 1e-4 to step 19), and the serial run
alone with --json. It passes only when the parallel run exits 0 with the check, and per step:
  - the learning rate of both runs equals the schedule computed here (llm.c's warm-up, then
    cosine or linear decay reaching lr * lr_min_frac at the last step);
  - the global gradient norm of the parallel run (all-reduced over every stage and rank, each
    distinct element once) equals the serial norm (same tolerances), and clipping was active
    (some norm above --grad-clip, so a wrong norm changes the update and the losses);
  - the losses of both JSON files agree (same tolerances);
  - GPT: the text sampled through the stages (forwards only, llm.c's seeded sampling or
    --sample-greedy) after every --sample-every-th step and the last equals the serial text;
  - the validation losses (forwards only on the held-out split, after every --val-every-th step
    and the last) are on exactly those steps in both runs and agree (same tolerances).
"""
import json
import math
import os
import subprocess
import sys
import tempfile

CASE, TRAIN, MPIEXEC = sys.argv[1], sys.argv[2], sys.argv[3]

SAMPLE = ["--sample-every", "3", "--sample-len", "10"]
GPT = ["gpt", "--layers", "2", "--channels", "64", "--lr", "1e-3"] + SAMPLE
GPT3 = ["gpt", "--layers", "3", "--channels", "64", "--lr", "1e-3", "--sample-greedy"] + SAMPLE
UT = ["utransformer", "--base-channels", "4", "--batch", "4"]
LOOP_COS = ["--grad-accum", "2", "--warmup", "2", "--lr-decay", "cosine", "--lr-min-frac", "0.1",
            "--val-every", "2", "--val-steps", "2"]
LOOP_LIN = ["--grad-accum", "3", "--warmup", "1", "--lr-decay", "linear", "--lr-min-frac", "0.2",
            "--val-every", "3", "--val-steps", "1"]

# name: (ranks, model flags, clip, loop flags, parallel layout flags, steps)
CASES = {
    # two stages, data parallel then tensor parallel (the boundary crosses mesh shapes)
    "gpt.pipe_dp_tp": (4, GPT, 0.5, LOOP_COS, ["--stage-mesh", "2x1,1x2", "--microbatches", "2"], 6),
    # one stage, megatron 2x2 (replicated norms and biases on the tp axis counted once)
    "gpt.megatron_2x2": (4, GPT, 0.5, LOOP_LIN, ["--stage-mesh", "2x2"], 6),
    # axonn: weights stored sharded over the depth axis (norm counted by shard)
    "gpt.axonn_1x2x2": (4, GPT, 0.5, LOOP_COS, ["--stage-mesh", "1x2x2", "--strategy", "axonn"], 6),
    # three stages, tied wte on different stages (the shared gradient counted once), 20 steps
    "gpt.pipe3_20": (3, GPT3, 0.5, LOOP_COS, ["--stages", "3", "--microbatches", "2",
                                           "--schedule", "eager-1f1b", "--delay-wgrad"], 20),
    "ut.pipe_tp_dp": (4, UT, 0.05, LOOP_COS, ["--stage-mesh", "1x2,2x1", "--microbatches", "2"], 6),
    "ut.s3dp_20": (4, UT, 0.05, LOOP_LIN, ["--stages", "3", "--stage-dp", "2,1,1",
                                          "--microbatches", "2", "--schedule", "gpipe"], 20),
}


def run(cmd):
    print("+", " ".join(cmd), flush=True)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OPENBLAS_NUM_THREADS="1")
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=240, env=env)
    return p.returncode, p.stdout


def lr_at(step, lr, steps, warmup, decay, frac):
    if step < warmup:
        return lr * (step + 1) / warmup
    if decay == "none" or steps - warmup <= 1:
        return lr
    r = (step - warmup) / (steps - warmup - 1)
    lo = lr * frac
    if decay == "cosine":
        return lo + 0.5 * (1 + math.cos(math.pi * r)) * (lr - lo)
    return lr - (lr - lo) * r


def flag(flags, name, default):
    return flags[flags.index(name) + 1] if name in flags else default


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def main():
    n, model, clip, loop, layout, steps = CASES[CASE]
    common = model + loop + ["--grad-clip", str(clip), "--steps", str(steps), "--no-progress"]
    lr0 = float(flag(model, "--lr", "1e-4" if model[0] == "gpt" else "0.05"))
    warm, decay, frac = int(flag(loop, "--warmup", 0)), flag(loop, "--lr-decay", "none"), \
        float(flag(loop, "--lr-min-frac", 0))
    fails = []
    with tempfile.TemporaryDirectory() as d:
        js, jp = os.path.join(d, "s.json"), os.path.join(d, "p.json")
        rc, out = run([TRAIN] + common + ["--serial", "--json", js])
        if rc != 0:
            sys.exit("serial run failed:\n" + out[-3000:])
        rc, out = run([MPIEXEC, "-n", str(n), "--oversubscribe", TRAIN] + common + layout +
                      ["--check-serial", "--json", jp])
        if rc != 0 or f"check-serial: OK (0 mismatching of {min(steps, 20)} steps compared)" not in out:
            print(out[-4000:])
            fails.append(f"parallel run: exit {rc} or no check-serial OK")
        else:
            s, p = json.load(open(js))["steps"], json.load(open(jp))["steps"]
            if len(s) != steps or len(p) != steps:
                fails.append(f"step records: serial {len(s)}, parallel {len(p)}, want {steps}")
            clipped = 0
            for k, (a, b) in enumerate(zip(s, p)):
                tol = 1e-5 if k < 5 else 1e-4
                want = lr_at(k, lr0, steps, warm, decay, frac)
                for name, r in (("serial", a), ("parallel", b)):
                    if rel(r["lr"], want) > 1e-6:
                        fails.append(f"step {k}: {name} lr {r['lr']} != schedule {want}")
                if rel(b["grad_norm"], a["grad_norm"]) > tol:
                    fails.append(f"step {k}: grad_norm parallel {b['grad_norm']:.9g} serial "
                                 f"{a['grad_norm']:.9g}")
                if rel(b["loss"], a["loss"]) > tol:
                    fails.append(f"step {k}: loss parallel {b['loss']:.9g} serial {a['loss']:.9g}")
                clipped += a["grad_norm"] > clip
                ve = int(flag(loop, "--val-every", 0))
                due = ve > 0 and ((k + 1) % ve == 0 or k == steps - 1)
                if due != ("val_loss" in a) or due != ("val_loss" in b):
                    fails.append(f"step {k}: val_loss present serial {'val_loss' in a} "
                                 f"parallel {'val_loss' in b}, due {due}")
                se = int(flag(model, "--sample-every", 0))
                sdue = se > 0 and ((k + 1) % se == 0 or k == steps - 1)
                if sdue != ("sample" in a) or sdue != ("sample" in b):
                    fails.append(f"step {k}: sample present serial {'sample' in a} parallel "
                                 f"{'sample' in b}, due {sdue}")
                elif sdue and (a["sample"] != b["sample"] or len(a["sample"]) != 10):
                    fails.append(f"step {k}: sample parallel {b['sample']!r} serial {a['sample']!r}")
                if due and "val_loss" in a and "val_loss" in b and rel(b["val_loss"], a["val_loss"]) > tol:
                    fails.append(f"step {k}: val_loss parallel {b['val_loss']:.9g} serial "
                                 f"{a['val_loss']:.9g}")
            if clipped == 0:
                fails.append(f"no step had a gradient norm above --grad-clip {clip}: the clip "
                             "is not exercised")
            print(f"{CASE}: {steps} steps, lr and grad_norm per step equal, {clipped} clipped")
    for f in fails:
        print("FAIL:", f)
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
