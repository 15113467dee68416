#!/usr/bin/env bash
# Step time of f32 against bf16 stage boundaries (--boundary-dtype, docs/DTYPES.md) on the
# emulated cluster: GPT-2 of the pipeline ablation's gpt2 configuration (2 stages on 2 hosts
# x 2 ranks, stage meshes 2x1 -> 1x2, 4 layers, C 256, T 64, microbatches of 8 sequences,
# NIC XMESH_BDT_RATE [50mbit] so that a boundary tensor costs about a stage's forward), rows
# 1f1b and eager-1F1B + weight delay at M = 4 and 16, BLAS one thread per rank (the 4 ranks
# share this machine's cores). Writes build/boundary-dtype/<time>/{f32,bf16}/ (the ablation
# tables and JSON) and compare.{md,json}: median step time [min, max] per row and dtype, the
# bf16/f32 ratio, and the boundary bytes per step of each.
#
#   scripts/run-boundary-dtype.sh      Environment: XMESH_BDT_RATE [50mbit], XMESH_BDT_STEPS [8],
#   XMESH_BDT_WARMUP [2], XMESH_BDT_MICROBATCHES [4,16], XMESH_BDT_OUT
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
root=$PWD
rate=${XMESH_BDT_RATE:-50mbit}
steps=${XMESH_BDT_STEPS:-8}
warmup=${XMESH_BDT_WARMUP:-2}
mbl=${XMESH_BDT_MICROBATCHES:-4,16}
out=${XMESH_BDT_OUT:-$root/build/boundary-dtype/$(date -u +%Y%m%d-%H%M%S)}
scripts/install-deps.sh >/dev/null || exit 1
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null || exit 1
cmake --build build -j "${XMESH_JOBS:-2}" --target xmesh-train >/dev/null || {
    echo "run-boundary-dtype: build failed" >&2
    exit 1
}
why=$(microbench/cluster/cluster.sh check 2>&1) || {
    echo "run-boundary-dtype: no emulated cluster (${why#cluster.sh: SKIP: }): nothing to measure" >&2
    exit 77
}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$out"
model="--layers 4 --heads 4 --channels 256 --seq 64 --blas-threads 1 --no-progress"
for dt in f32 bf16; do
    echo "run-boundary-dtype: $dt boundaries, 2 hosts x 2 ranks, NIC $rate" >&2
    microbench/cluster/cluster.sh -q -H 2 -d 2 -r "$rate" -b 64kb -- \
        python3 microbench/pipeline/ablation.py --train "$root/build/pipeline/xmesh-train" \
        --model gpt --model-args "$model --boundary-dtype $dt" \
        --stage-args "--stages 2 --stage-mesh 2x1,1x2" --microbatch-size 8 \
        --units-per-sample 64 --units tokens --microbatches "$mbl" --rows 1f1b,eager+wdelay \
        --steps "$steps" --warmup "$warmup" --label "gpt2, $dt boundaries, NIC $rate" \
        --out "$out/$dt" >"$out/$dt.log" 2>&1 || {
        echo "run-boundary-dtype: $dt run failed, see $out/$dt.log" >&2
        exit 1
    }
done
python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
docs = {dt: json.load(open(os.path.join(out, dt, "ablation.json"))) for dt in ("f32", "bf16")}
bytes_ = {}
for dt in docs:
    # boundary bytes per step from the runs' own summaries
    for f in sorted(os.listdir(os.path.join(out, dt))):
        if f.endswith(".json") and f != "ablation.json":
            s = json.load(open(os.path.join(out, dt, f))).get("summary", {})
            if "boundary_bytes_per_step" in s:
                bytes_.setdefault(dt, {})[f] = s["boundary_bytes_per_step"]
rows = []
lines = ["| M | row | f32 step s [min, max] | bf16 step s [min, max] | bf16 / f32 | intervals |",
         "|---|---|---|---|---|---|"]
for r32 in docs["f32"]["results"]:
    m = [r for r in docs["bf16"]["results"]
         if r["row"] == r32["row"] and r["microbatches"] == r32["microbatches"]]
    if not m or "step_s_median" not in r32 or "step_s_median" not in m[0]:
        continue
    r16 = m[0]
    ratio = r16["step_s_median"] / r32["step_s_median"]
    sep = ("bf16 faster" if r16["step_s_max"] < r32["step_s_min"] else
           "f32 faster" if r32["step_s_max"] < r16["step_s_min"] else "overlap")
    rows.append({"M": r32["microbatches"], "row": r32["row"], "f32": r32, "bf16": r16,
                 "ratio": ratio, "intervals": sep})
    lines.append(f"| {r32['microbatches']} | {r32['row']} | {r32['step_s_median']:.3f} "
                 f"[{r32['step_s_min']:.3f}, {r32['step_s_max']:.3f}] | {r16['step_s_median']:.3f} "
                 f"[{r16['step_s_min']:.3f}, {r16['step_s_max']:.3f}] | {ratio:.3f} | {sep} |")
for dt, b in bytes_.items():
    vals = sorted(set(b.values()))
    lines.append(f"\n{dt}: boundary bytes per step (wire, all stages) {', '.join(str(v) for v in vals)}")
txt = "\n".join(lines) + "\n"
open(os.path.join(out, "compare.md"), "w").write(txt)
json.dump({"rows": rows, "boundary_bytes": bytes_}, open(os.path.join(out, "compare.json"), "w"), indent=1)
print(txt)
PY
echo "run-boundary-dtype: results in $out" >&2
