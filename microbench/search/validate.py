#!/usr/bin/env python3
"""Validation of the layout search's model on the emulated cluster (issue 21 item 4).

Runs every configuration of a space of GPT-2 layouts (pipeline splits, dp, megatron, 3d,
axonn (sharded storage), schedules, microbatch counts) with `xmesh-train gpt`, REPEATS times,
and compares the measured step times with the model's predictions (`xmesh-train gpt plan
--eval --json`) for the full model and its ablations:

  full            the model as the search uses it (calibrated cluster file when given)
  bandwidth       bandwidth-agnostic: collectives priced as if no other group shared the NIC
                  (--ablate share)
  no-overlap      without the overlap term (--ablate overlap): the configurations run with
                  --overlap defer-grad priced as if their reductions were waited one by one
  no-boundary     boundary transfers between stages cost 0 (--ablate boundary; Alpa-style)
  no-cpu-share    without CPU sharing between stages (--ablate cpu): the cluster file's
                  cpuset records ignored, every stage computes at the every-rank-busy rate
                  and collectives pay no sync wait
  no-step         compute from the kernel records alone (--ablate step): the cluster file's
                  gptstep record (a measured serial GPT-2 step) ignored
  nic-burst       the full model with the emulated NICs' token-bucket burst (--nic-burst, the
                  cluster file's nic_burst_bytes): a boundary transfer leaving an idle NIC
                  sends up to the burst at once. Scored beside the full model, not in it:
                  re-scored on the 2026-11-29 and 2026-12-02 runs it priced 1F1B below
                  GPipe where the runs measure them alike (docs/SEARCH.md, "Issue 40 item
                  2, continued")
  uncalibrated    the nominal model from the NIC rate alone (--nominal)

Repeats run as passes over the whole space (every configuration once, then again), and
with --calibrate the cluster is calibrated again after the runs: the model with that end
calibration is scored as "full, end calibration", and the ratio of its predictions to the
start's is reported as the calibration drift (the machine's speed can change during a run).

--measured PREVIOUS/validation.json re-scores the models against the measurements of an
earlier run (configurations matched by name; nothing is run), e.g. after a model change.

Metrics (per model): precision@5 (AxoNN, paper 001 section V: of the 5 configurations the
model ranks best, the fraction whose measured time is within 10% of the measured best or
among the measured top 5), Kendall tau-b between predicted and measured times, top-1 regret
(measured time of the predicted best over the measured best, minus 1), median relative
prediction error |pred - meas| / meas. Ties: configurations whose measured interval (min..max
over repeats of the per-run median step) overlaps the best's.

Outputs under OUT: validation.md (table), validation.json, validation.png (gnuplot: predicted vs
measured, log-log), runs/*.json and *.log.

Launch: $XMH_MPIRUN (inside microbench/cluster/cluster.sh) or mpirun --oversubscribe.
"""
import argparse
import itertools
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import time

MODELS = [
    ("full", []),
    ("bandwidth", ["--ablate", "share"]),
    ("no-overlap", ["--ablate", "overlap"]),
    ("no-boundary", ["--ablate", "boundary"]),
    ("no-cpu-share", ["--ablate", "cpu"]),
    ("no-step", ["--ablate", "step"]),
    ("nic-burst", []),
    ("uncalibrated", ["--nominal"]),
]


SCHEDULES = ["gpipe", "1f1b", "eager-1f1b"]


def model_dims(model_args):
    """(layers, heads, channels, batch) from the model's xmesh-train flags (the trainer's
    defaults where a flag is absent: see xmesh-train gpt --help)."""
    v = {"--layers": 4, "--heads": 4, "--channels": 128, "--batch": 16}
    t = shlex.split(model_args)
    for i, x in enumerate(t):
        if x in v and i + 1 < len(t):
            v[x] = int(t[i + 1])
    return v["--layers"], v["--heads"], v["--channels"], v["--batch"]


def layout_text(parts):
    """'E,t*3|t*3,L' for block counts [3, 3]: E on the first stage, L on the last."""
    st = ["t" if n == 1 else "t*%d" % n for n in parts]
    st[0] = "E," + st[0]
    st[-1] += ",L"
    return "|".join(st)


def splits(L, S):
    """Up to two contiguous splits of L blocks over S stages, each stage >= 1 block: the
    balanced one (the extra blocks on the middle stages first, then the first, then the last:
    the first stage also holds the embedding and the last the head) and, when it exists, the
    same with one block moved off an end stage (the first, else the last) to its neighbour."""
    if S > L:
        return []
    base, rem = divmod(L, S)
    parts = [base] * S
    order = list(range(1, S - 1)) + [0, S - 1] if S > 2 else list(range(S))
    for i in order[:rem]:
        parts[i] += 1
    out = [parts]
    alt = list(parts)
    if S >= 2 and alt[0] > 1:
        alt[0] -= 1
        alt[1] += 1
        out.append(alt)
    elif S >= 3 and alt[-1] > 1:
        alt[-1] -= 1
        alt[-2] += 1
        out.append(alt)
    return out


def meshes(n):
    """Every ordered factorization of n ranks into 1 to 4 factors >= 2 ('8', '2x4', '4x2',
    '2x2x2', ...); ['1'] for one rank."""
    if n == 1:
        return [[1]]
    out = []

    def rec(rest, cur):
        if rest == 1:
            if 1 <= len(cur) <= 4:
                out.append(list(cur))
            return
        if len(cur) == 4:
            return
        for f in range(2, rest + 1):
            if rest % f == 0:
                rec(rest // f, cur + [f])

    rec(n, [])
    return sorted(out, key=lambda m: (len(m), m))


def prod(xs):
    r = 1
    for x in xs:
        r *= x
    return r


def stage_options(n, heads, Bm):
    """(mesh text, strategy) for a stage of n ranks at Bm rows per microbatch, in a fixed
    order: dp (every axis splits the batch rows), megatron (the last axis the tensor axis:
    it must divide the heads; the others data), 3d (any axes) and axonn (3 or 4 axes). The
    splits that only the model knows (3d's and axonn's) are left to `gpt plan --eval`, which
    drops what the trainer would refuse."""
    out = []
    for m in meshes(n):
        txt = "x".join(str(x) for x in m)
        if Bm % prod(m) == 0:
            out.append((txt, "dp"))
        if m != [1] and heads % m[-1] == 0 and Bm % prod(m[:-1]) == 0:
            out.append((txt, "megatron"))
        if m != [1]:
            out.append((txt, "3d"))
        if len(m) >= 3:
            out.append((txt, "axonn"))
    return out


def generate(model_args, ranks=8):
    """Every configuration of the space the model allows on `ranks` ranks, in a fixed order:
    stage counts S dividing the ranks with S <= layers; the splits of splits(); per stage
    count the stage options of stage_options() on every stage (homogeneous) and, for two
    stages, the first two options mixed both ways; one stage: 1f1b at M 1 and 2 (the
    schedule does not matter there); S >= 2: every schedule at M = S and 2S (1F1B kinds need M
    >= S); M must divide the batch."""
    L, heads, _, B = model_dims(model_args)
    cfgs = []
    for S in [s for s in range(1, ranks + 1) if ranks % s == 0 and s <= L]:
        n = ranks // S
        Ms = [1, 2] if S == 1 else [S, 2 * S]
        for parts in splits(L, S):
            lay = layout_text(parts)
            for M in Ms:
                if B % M:
                    continue
                opts = stage_options(n, heads, B // M)
                combos = [[o] * S for o in opts]
                if S == 2 and len(opts) >= 2 and parts == splits(L, S)[0]:
                    combos += [[opts[0], opts[1]], [opts[1], opts[0]]]
                for sched in (["1f1b"] if S == 1 else SCHEDULES):
                    for cb in combos:
                        cfgs.append((lay, ",".join(m for m, _ in cb),
                                     ",".join(st for _, st in cb), sched, M))
    return cfgs


def select(cfgs, size):
    """At most `size` configurations (0: all), spread over the stage counts (round robin),
    within a stage count over its (schedule, M) strata (round robin), within a stratum in an
    order that halves the gaps (first, middle, quarters, ...); returned in generation order."""
    if size <= 0 or size >= len(cfgs):
        return list(cfgs)
    strata = {}
    for i, c in enumerate(cfgs):
        strata.setdefault((c[0].count("|"), c[3], c[4]), []).append(i)

    def spread(ix):
        n, out, seen, k = len(ix), [], set(), 1
        while len(out) < n:
            for j in range(k):
                p = (2 * j + 1) * n // (2 * k) if k > 1 else 0
                if p not in seen:
                    seen.add(p)
                    out.append(ix[p])
            k *= 2
            if k > 2 * n:
                out += [x for q, x in enumerate(ix) if q not in seen]
                break
        return out

    # round robin over the stage counts, and within a stage count over its (schedule, M)
    def interleave(ix):  # the splits (layouts) of a stratum in turn
        lays, rank = [], {}
        for i in ix:
            lay = cfgs[i][0]
            if lay not in lays:
                lays.append(lay)
            rank[i] = sum(1 for j in ix if j < i and cfgs[j][0] == lay)
        return sorted(ix, key=lambda i: (rank[i], lays.index(cfgs[i][0])))

    by_s = {}
    for (S, sched, M), v in sorted(strata.items()):
        qs = by_s.setdefault(S, [])
        v = interleave(v)
        k = len(qs) % len(v)  # each stratum of a stage count starts elsewhere
        qs.append(spread(v[k:] + v[:k]))
    turn = {S: 0 for S in by_s}
    pick = set()
    while len(pick) < size:
        moved = False
        for S, qs in sorted(by_s.items()):
            live = [q for q in qs if q]
            if not live or len(pick) >= size:
                continue
            q = live[turn[S] % len(live)]
            turn[S] += 1
            pick.add(q.pop(0))
            moved = True
        if not moved:
            break
    return [cfgs[i] for i in sorted(pick)]


def space(model_args, size=0, ranks=8, accept=None):
    """The validation's configurations: the generated space (those `accept` takes, when
    given: the model's own checks; then select()ed to `size`), then five with --overlap
    defer-grad (one stage: 8 dp M1, 2x4 dp M1, 4x2 megatron M1, 2x2x2 3d M2; two stages dp,dp
    1f1b M2 on the balanced split) where the model has them."""
    L = model_dims(model_args)[0]
    cfgs = [c for c in generate(model_args, ranks) if accept is None or accept(c)]
    cfgs = select(cfgs, size)
    one = layout_text([L])
    for mesh, strat, M in [("8", "dp", 1), ("2x4", "dp", 1), ("4x2", "megatron", 1),
                           ("2x2x2", "3d", 2)]:
        if prod(int(x) for x in mesh.split("x")) == ranks:
            cfgs.append((one, mesh, strat, "1f1b", M, "defer-grad"))
    two = splits(L, 2)
    if two and ranks % 2 == 0:
        cfgs.append((layout_text(two[0]), "%d,%d" % (ranks // 2, ranks // 2), "dp,dp", "1f1b",
                     2, "defer-grad"))
    return cfgs


def space_legacy(layers):
    """The hand-written space of 2026-11-25..29 (43 configurations for 4 layers), kept to
    re-score those runs (--space legacy)."""
    L = layers
    one = "E,t*%d,L" % L
    two = ["E,t*%d|t*%d,L" % (L // 2, L - L // 2), "E,t|t*%d,L" % (L - 1)]
    four = "E," + "|".join(["t"] * L) + ",L" if L == 4 else None
    cfgs = []
    for mesh, strat in [("8", "dp"), ("4x2", "megatron"), ("2x4", "megatron"), ("2x4", "dp"),
                        ("2x2x2", "3d"), ("2x2x2", "axonn"), ("2x2x2", "megatron")]:
        cfgs.append((one, mesh, strat, "1f1b", 1))
        cfgs.append((one, mesh, strat, "1f1b", 2))
    for lay, meshes_ in [(two[0], [("4,4", "dp,dp"), ("2x2,2x2", "megatron,megatron"),
                                   ("4,2x2", "dp,megatron"), ("2x2,4", "megatron,dp")]),
                         (two[1], [("4,4", "dp,dp"), ("2x2,2x2", "megatron,megatron")])]:
        for mesh, strat in meshes_:
            for sched, M in [("1f1b", 2), ("gpipe", 4), ("eager-1f1b", 4)]:
                cfgs.append((lay, mesh, strat, sched, M))
    if four:
        for mesh, strat in [("2,2,2,2", "dp,dp,dp,dp"),
                            ("2,2,2,2", "megatron,megatron,megatron,megatron")]:
            for sched, M in [("1f1b", 4), ("gpipe", 4), ("eager-1f1b", 8)]:
                cfgs.append((four, mesh, strat, sched, M))
    for mesh, strat, M in [("8", "dp", 1), ("2x4", "dp", 1), ("4x2", "megatron", 1),
                           ("2x2x2", "3d", 2)]:
        cfgs.append((one, mesh, strat, "1f1b", M, "defer-grad"))
    cfgs.append((two[0], "4,4", "dp,dp", "1f1b", 2, "defer-grad"))
    return cfgs


def summary(cfgs):
    """One line: configurations per stage count, schedules, mesh axes and M values."""
    by = lambda f: ", ".join("%s: %d" % (k, v) for k, v in sorted(
        {k: sum(1 for c in cfgs if f(c) == k) for k in set(f(c) for c in cfgs)}.items()))
    return ("%d configurations; stages {%s}; schedules {%s}; mesh axes {%s}; M {%s}" %
            (len(cfgs), by(lambda c: c[0].count("|") + 1), by(lambda c: c[3]),
             by(lambda c: max(len(m.split("x")) for m in c[1].split(","))),
             by(lambda c: c[4])))


def tc_size(text):
    """Bytes of a tc size ('64kb', '256k', '1mb', '1500', '512kbit'): tc's units, k = 1024."""
    t = text.strip().lower()
    units = [("kbit", 1024 / 8), ("mbit", 1024 * 1024 / 8), ("gbit", 1024 ** 3 / 8),
             ("kb", 1024), ("mb", 1024 ** 2), ("gb", 1024 ** 3), ("k", 1024), ("m", 1024 ** 2),
             ("g", 1024 ** 3), ("bit", 1 / 8), ("b", 1), ("", 1)]
    for u, mul in units:
        if t.endswith(u):
            num = t[:len(t) - len(u)] if u else t
            try:
                v = float(num) * mul
            except ValueError:
                break
            if v >= 0:
                return v
            break
    raise ValueError("NIC burst %r: not a tc size (e.g. 64kb, 256k, 1500)" % text)


def with_burst(src, dst, burst):
    """Copies cluster file src to dst with the NIC's token-bucket burst (bytes) as its
    nic_burst_bytes (the base section, reopened by [cluster] after the records)."""
    with open(src) as f:
        text = "".join(x for x in f.read().splitlines(True)
                       if not x.split("#")[0].strip().startswith("nic_burst_bytes"))
    with open(dst, "w") as f:
        f.write(text if text.endswith("\n") or not text else text + "\n")
        f.write("\n[cluster]\n# the emulated NICs' token bucket (cluster.sh -b)\n"
                "nic_burst_bytes = %d\n" % round(burst))


def cfg_flags(c):
    lay, mesh, strat, sched, M = c[:5]
    f = ["--layout", lay, "--stage-mesh", mesh, "--stage-strategy", strat, "--schedule", sched,
         "--microbatches", str(M)]
    if len(c) > 5:
        f += ["--overlap", c[5]]
    return f


def cfg_name(c):
    lay, mesh, strat, sched, M = c[:5]
    return "%s / %s / %s / %s M%d%s" % (lay, mesh, strat, sched, M,
                                        " / " + c[5] if len(c) > 5 else "")


def md(s):
    return s.replace("|", "\\|")


def predict(a, c, extra, cluster):
    cmd = [a.train, "gpt", "plan", "--eval", "--json", "--ranks", str(a.ranks), "--hosts",
           str(a.hosts)]
    cmd += shlex.split(a.model_args) + cfg_flags(c) + extra
    if cluster:
        cmd += ["--cluster", cluster]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return None, p.stderr.strip()
    d = json.loads(p.stdout)
    return d, None


def run_one(a, launch, c, rep, outdir, idx):
    name = "c%02d-r%d" % (idx, rep)
    jpath = os.path.join(outdir, "runs", name + ".json")
    cmd = launch + [a.train, "gpt"] + shlex.split(a.model_args) + cfg_flags(c) + [
        "--steps", str(a.steps), "--blas-threads", "1", "--no-progress", "--json", jpath]
    with open(os.path.join(outdir, "runs", name + ".log"), "w") as log:
        log.write("$ " + " ".join(shlex.quote(x) for x in cmd) + "\n")
        log.flush()
        rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)
    if rc != 0:
        return None
    with open(jpath) as f:
        d = json.load(f)
    t = [s["step_seconds"] for s in d.get("steps", [])][a.warmup:]
    return statistics.median(t) if t else None


def trainer_ratio(outdir, idx, rep, warmup):
    """The trainer's own prediction over its measurement in run (idx, rep): each step record's
    predicted_s is the simulator (the same as the search's) fed the previous step's measured
    stage costs and xmesh's plan predictions, so predicted_s / step_seconds is the pricing of
    the schedule alone; the model's pred/meas over this ratio is the part of its error that
    its stage costs carry. Median over the kept steps that have one; None without any."""
    try:
        with open(os.path.join(outdir, "runs", "c%02d-r%d.json" % (idx, rep))) as f:
            st = json.load(f).get("steps", [])[warmup:]
    except (OSError, ValueError):
        return None
    r = [s["predicted_s"] / s["step_seconds"] for s in st
         if s.get("predicted_s") and s.get("step_seconds")]
    return statistics.median(r) if r else None


def kendall_tau_b(x, y):
    n = len(x)
    conc = disc = tx = ty = 0
    for i in range(n):
        for j in range(i + 1, n):
            dx = (x[i] > x[j]) - (x[i] < x[j])
            dy = (y[i] > y[j]) - (y[i] < y[j])
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                tx += 1
            elif dy == 0:
                ty += 1
            elif dx == dy:
                conc += 1
            else:
                disc += 1
    den = math.sqrt((conc + disc + tx) * (conc + disc + ty))
    return (conc - disc) / den if den > 0 else float("nan")


def metrics(pred, meas, k=5, lo=None, hi=None):
    """AxoNN's precision@5 (a pick of the model's top 5 counts when it is within 10% of the
    best or in the measured top 5), Kendall tau-b, top-1 regret, median error; with the
    repeats' [lo, hi], also precision@5 where a pick whose interval overlaps a measured top-5
    configuration's counts as in the top 5 (the runs cannot order them)."""
    idx = [i for i in range(len(meas)) if meas[i] is not None and pred[i] is not None]
    if len(idx) < 2:
        return {"configs": len(idx)}
    p = [pred[i] for i in idx]
    m = [meas[i] for i in idx]
    best = min(m)
    order_m = sorted(range(len(m)), key=lambda i: m[i])
    top_m = set(order_m[:k])
    order_p = sorted(range(len(p)), key=lambda i: p[i])
    kk = min(k, len(p))
    good = [i for i in order_p[:kk] if m[i] <= 1.1 * best or i in top_m]
    err = [abs(p[i] - m[i]) / m[i] for i in range(len(m))]
    tied = good
    if lo is not None and hi is not None:
        L = [lo[i] for i in idx]
        H = [hi[i] for i in idx]
        tied = [i for i in order_p[:kk]
                if i in good or any(L[i] <= H[j] and L[j] <= H[i] for j in top_m)]
    return {
        "configs": len(idx),
        "precision_at_5": len(good) / kk,
        "precision_at_5_ties": len(tied) / kk,
        "kendall_tau": kendall_tau_b(p, m),
        "top1_regret": m[order_p[0]] / best - 1,
        "median_error": statistics.median(err),
        "predicted_best": idx[order_p[0]],
        "measured_best": idx[order_m[0]],
    }


def calibrate(a, launch, name, logname):
    """Runs xmesh-calibrate into OUT/NAME; returns its path, or "" when it failed."""
    path = os.path.join(a.out, name)
    # 1 KiB .. 4 MiB: the gradients are all-reduced one tensor at a time (512 B biases to
    # 512 KiB wpe here), so the latency end matters as much as the bandwidth end
    cmd = launch + [a.calibrate, "-o", path, "--min", "1K", "--max", "4M", "--steps", "7",
                    "--reps", "2", "--gemm-hidden", "128", "--gemm-vocab", "256",
                    "--gemm-tokens", "256"]
    print("validate: calibrating: " + " ".join(cmd), file=sys.stderr)
    with open(os.path.join(a.out, logname), "w") as log:
        if subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT) != 0:
            print("validate: calibration failed (%s)" % logname, file=sys.stderr)
            return ""
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", default="", help="path of xmesh-train (not needed with --list)")
    ap.add_argument("--calibrate", default="", help="path of xmesh-calibrate (run it first)")
    ap.add_argument("--cluster", default="", help="a calibrated cluster file to use instead")
    ap.add_argument("--rate-mbit", type=float, default=0, help="NIC rate (uncalibrated model)")
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--model-args", default="--layers 4 --heads 4 --channels 128 --seq 64 "
                    "--batch 16")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-configs", type=int, default=0, help="first N configurations (0: all)")
    ap.add_argument("--only", default="", help="comma list of configuration indices to run "
                    "(the table's #; after --max-configs)")
    ap.add_argument("--measured", default="", help="validation.json of an earlier run: its "
                    "measurements instead of running (re-scores the models)")
    ap.add_argument("--no-end-calibration", dest="end_calibration", action="store_false",
                    help="do not calibrate again after the runs")
    ap.add_argument("--space", default="generated", choices=["generated", "legacy"],
                    help="generated (from the model, default) or legacy (the 4-layer space of "
                    "2026-11-25..29, to re-score those runs)")
    ap.add_argument("--space-size", type=int, default=0, help="at most this many generated "
                    "configurations, spread over stage counts, schedules and M (0: all)")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--list", action="store_true", help="print the space and exit: a dry run "
                    "(with --train, after the model's checks; without, before them)")
    ap.add_argument("--nic-burst", default="", help="the emulated NICs' token-bucket burst "
                    "(tc units: 64kb; cluster.sh -b): the nic-burst model's cluster file has it "
                    "as nic_burst_bytes (the simulator's boundary transfers)")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    try:
        burst = tc_size(a.nic_burst) if a.nic_burst else 0
    except ValueError as e:
        ap.error(str(e))
    # with xmesh-train at hand, the space is what the model accepts before the subset is
    # taken (3d and axonn depend on splits only the model knows)
    accept = (lambda c: predict(a, c, [], "")[0] is not None) if a.train else None
    cfgs = (space(a.model_args, a.space_size, a.ranks, accept) if a.space == "generated"
            else space_legacy(model_dims(a.model_args)[0]))
    if a.list:
        for i, c in enumerate(cfgs):
            print("%3d  %s" % (i, cfg_name(c)))
        print(summary(cfgs))
        return 0
    if not a.train or not a.out:
        ap.error("--train and --out are needed (except with --list)")
    os.makedirs(os.path.join(a.out, "runs"), exist_ok=True)
    np_ = a.ranks
    if os.environ.get("XMH_MPIRUN"):
        launch = shlex.split(os.environ["XMH_MPIRUN"]) + ["-np", str(np_)]
    else:
        launch = ["mpirun", "--oversubscribe", "-np", str(np_)]
    t0 = time.time()
    # cluster files: calibrated (full model) and the NIC rate alone (uncalibrated)
    rate = a.rate_mbit or float(os.environ.get("XMH_RATE_MBIT", "0") or 0)
    if a.measured and not rate:  # re-scoring outside the cluster: the measured run's NIC rate
        with open(a.measured) as f:
            rate = float(json.load(f).get("rate_mbit", 0) or 0)
    nominal_file = os.path.join(a.out, "cluster-nominal.txt")
    with open(nominal_file, "w") as f:
        f.write("# the NIC rate alone (uncalibrated model)\n")
        if rate > 0:
            f.write("nic_gbps = %g\n" % (rate / 1000.0))
    cal = a.cluster
    if not cal and a.calibrate:
        cal = calibrate(a, launch, "cluster-calibrated.txt", "calibrate.log")
    full_file = cal or nominal_file
    burst_file = ""
    if burst > 0:  # the NICs' token bucket: a copy of the full model's file with it
        burst_file = os.path.join(a.out, "cluster-burst.txt")
        with_burst(full_file, burst_file, burst)
    # keep the configurations the model accepts (the trainer runs the same checks)
    keep = []
    for c in cfgs:
        d, err = predict(a, c, [], full_file)
        if d is None:
            print("validate: skipped %s: %s" % (cfg_name(c), err), file=sys.stderr)
            continue
        keep.append(c)
    if a.max_configs:
        keep = keep[:a.max_configs]
    if a.only:
        keep = [keep[int(i)] for i in a.only.split(",") if int(i) < len(keep)]
    print("validate: %d configurations x %d repeats, %d steps (%d warm-up)" %
          (len(keep), a.repeats, a.steps, a.warmup), file=sys.stderr)
    preds = {name: [] for name, _ in MODELS}
    for c in keep:
        for name, extra in MODELS:
            f = nominal_file if name == "uncalibrated" else full_file
            if name == "nic-burst":
                f = burst_file
            d, err = predict(a, c, extra, f) if f else (None, "no --nic-burst")
            preds[name].append(d["step_s"] if d else None)
    meas, lo, hi = [], [], []
    t_runs = time.time()
    old = {}
    if a.measured:
        with open(a.measured) as f:
            prev = json.load(f)
        old = {x["name"]: x for x in prev["configurations"]}
        for k in ("steps", "warmup", "repeats", "rate_mbit"):
            setattr(a, k if k != "rate_mbit" else "rate_mbit", prev.get(k, getattr(a, k, 0)))
        rate = prev.get("rate_mbit", rate)
    # Repeats run as passes over the whole space (repeat k of every configuration, then
    # repeat k + 1), so a slow spell of the machine lands in one repeat of many
    # configurations, widening their intervals, rather than in every repeat of a few.
    runs = [[] for _ in keep]
    if a.measured:
        for i, c in enumerate(keep):
            x = old.get(cfg_name(c))
            runs[i] = x["repeats_s"] if x else [None]
    else:
        total = a.repeats * len(keep)
        for k in range(a.repeats):
            for i, c in enumerate(keep):
                runs[i].append(run_one(a, launch, c, k, a.out, i))
                done = k * len(keep) + i + 1
                el = time.time() - t_runs
                print("validate: pass %d %2d %-60s %s s predicted %.4g (%.0f s, about %.0f s "
                      "left)" % (k, i, cfg_name(c), "%.4g" % runs[i][-1] if runs[i][-1]
                                 else "FAILED", preds["full"][i] or -1, el,
                                 el / done * (total - done)), file=sys.stderr)
    # A second calibration after the runs: the machine's speed can drift over the run (a
    # shared VM); the model with the end calibration is scored too, and the two calibrations'
    # predictions are compared (drift = end / start, per configuration).
    drift = None
    if cal and not a.cluster and a.calibrate and not a.measured and a.end_calibration:
        end_file = calibrate(a, launch, "cluster-calibrated-end.txt", "calibrate-end.log")
        if end_file:
            preds["full, end calibration"] = [
                (lambda d: d[0]["step_s"] if d[0] else None)(predict(a, c, [], end_file))
                for c in keep]
            r = [e / s0 for e, s0 in zip(preds["full, end calibration"], preds["full"])
                 if e and s0]
            if r:
                drift = {"median": statistics.median(r), "min": min(r), "max": max(r)}
    # the schedule's pricing alone: the trainer's predictions from measured stage costs
    sched_pm = []
    for i in range(len(keep)):
        r = [trainer_ratio(a.out, i, k, a.warmup) for k in range(len(runs[i]))]
        r = [x for x in r if x is not None]
        if not r and a.measured:
            r = [x for x in [old.get(cfg_name(keep[i]), {}).get("schedule_pred_over_meas")]
                 if x is not None]
        sched_pm.append(statistics.median(r) if r else None)
    for r in runs:
        ok = [x for x in r if x is not None]
        meas.append(statistics.median(ok) if ok else None)
        lo.append(min(ok) if ok else None)
        hi.append(max(ok) if ok else None)
    res = {name: metrics(preds[name], meas, lo=lo, hi=hi) for name in preds}
    valid = [i for i in range(len(keep)) if meas[i] is not None]
    best = min(valid, key=lambda i: meas[i]) if valid else None
    ties = [i for i in valid if best is not None and lo[i] <= hi[best] and i != best]
    doc = {"measured_from": a.measured or None, "model_args": a.model_args, "hosts": a.hosts, "ranks": np_, "rate_mbit": rate,
           "nic_burst_bytes": burst, "steps": a.steps, "warmup": a.warmup, "repeats": a.repeats,
           "cluster_file": full_file, "calibrated": bool(cal), "seconds": time.time() - t0,
           "configurations": [{"index": i, "name": cfg_name(c), "flags": cfg_flags(c),
                               "measured_s": meas[i], "measured_min_s": lo[i],
                               "measured_max_s": hi[i], "repeats_s": runs[i],
                               "predicted_s": {n: preds[n][i] for n in preds},
                               "schedule_pred_over_meas": sched_pm[i],
                               "tie_with_best": i in ties}
                              for i, c in enumerate(keep)],
           "metrics": res, "ties_with_best": ties, "calibration_drift": drift,
           "targets": {"top1_regret": 0.05, "precision_at_5": 0.9, "kendall_tau": 0.8,
                       "median_error": 0.10}}
    with open(os.path.join(a.out, "validation.json"), "w") as f:
        json.dump(doc, f, indent=1)
    lines = ["# Layout search validation (%s)" % time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
             "",
             "%d GPT-2 configurations (%s) on %d hosts x %d ranks, NIC %s Mbit/s; %d repeats of %d "
             "steps (first %d dropped); model: %s%s." %
             (len(keep), a.model_args, a.hosts, np_ // a.hosts, rate or "?", a.repeats, a.steps,
              a.warmup, full_file, "" if cal else " (not calibrated: full = uncalibrated)"),
             "", "| model | precision@5 | precision@5, ties | Kendall tau | top-1 regret | "
             "median error |", "|---|---|---|---|---|---|"]
    for name in preds:
        m = res[name]
        if "precision_at_5" in m:
            lines.append("| %s | %.2f | %.2f | %.3f | %.1f%% | %.1f%% |" %
                         (name, m["precision_at_5"], m["precision_at_5_ties"], m["kendall_tau"],
                          100 * m["top1_regret"], 100 * m["median_error"]))
        else:
            lines.append("| %s | - | - | - | - | - |" % name)
    if drift:
        lines += ["", "Calibration drift (the end calibration's prediction / the start's, over "
                  "the configurations): median %.3f [%.3f, %.3f]." %
                  (drift["median"], drift["min"], drift["max"])]
    lines += ["", "Targets: regret <= 5%, precision@5 >= 0.9, tau >= 0.8, median error <= 10%. "
              "precision@5, ties: a pick whose [min, max] overlaps a measured top-5 "
              "configuration's also counts (not the target's definition).",
              "sched. p/m: the trainer's own prediction from the previous step's measured "
              "stage costs over the step (the same simulator: the schedule's pricing alone; "
              "pred/meas over it is what the model's stage costs add).",
              "", "| # | configuration | measured s [min, max] | predicted s | pred/meas | "
              "sched. p/m | tie |", "|---|---|---|---|---|---|---|"]
    for i, c in enumerate(keep):
        p = preds["full"][i]
        if meas[i] is None:
            lines.append("| %d | %s | failed | %s | - | - | |" % (i, md(cfg_name(c)), p))
            continue
        lines.append("| %d | %s | %.4g [%.4g, %.4g] | %.4g | %.2f | %s | %s |" %
                     (i, md(cfg_name(c)), meas[i], lo[i], hi[i], p or float("nan"),
                      (p / meas[i]) if p else float("nan"),
                      "%.2f" % sched_pm[i] if sched_pm[i] else "-",
                      "best" if i == best else ("tie" if i in ties else "")))
    with open(os.path.join(a.out, "validation.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    # chart
    dat = os.path.join(a.out, "validation.dat")
    with open(dat, "w") as f:
        for i in valid:
            f.write("%g %g %g %g\n" % (meas[i], preds["full"][i] or float("nan"),
                                       preds["uncalibrated"][i] or float("nan"), i))
    gp = os.path.join(a.out, "validation.gp")
    with open(gp, "w") as f:
        f.write('set terminal png size 900,700\nset output "%s"\n' %
                os.path.join(a.out, "validation.png"))
        f.write('set logscale xy\nset xlabel "measured step (s)"\nset ylabel "predicted step (s)"\n'
                'set key top left\nset grid\n'
                'plot "%s" u 1:2 w p pt 7 t "full model", "%s" u 1:3 w p pt 6 t "uncalibrated", '
                'x t "predicted = measured" lc rgb "gray"\n' % (dat, dat))
    if subprocess.call(["gnuplot", gp], stderr=subprocess.DEVNULL) != 0:
        print("validate: gnuplot failed or missing (validation.gp kept)", file=sys.stderr)
    return 0 if valid else 1


if __name__ == "__main__":
    sys.exit(main())
