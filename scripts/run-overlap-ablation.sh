#!/usr/bin/env bash
# AxoNN-style overlap ablation inside a stage (issue 20 item 8, second and third bullets;
# docs/STRATEGY.md "Overlap ablation") on the emulated cluster (microbench/cluster/cluster.sh -p:
# 4 hosts x 2 ranks, each host its own CPUs and one shaped NIC):
#
#  1. GPT-2 (4 layers, 4 heads, C 256, T 64, batch 8, one microbatch: the overlap is inside the
#     stage, so no pipeline) on the same 8 ranks with the strategies megatron (2x4), 3d (2x2x2)
#     and axonn (2x2x2); rows: no overlap, then the switches of nn/overlap.h added one at a
#     time, cumulatively: bwd-input, defer-grad, prefetch, coll-matmul. Per row: step time
#     median [min, max], compute and boxing seconds, hidden fraction (share of the no-overlap
#     run's exposed communication that the row hides), ratio to megatron in the same row, and
#     a check that every row's losses equal the no-overlap losses (microbench/pipeline/
#     overlap_ablation.py);
#  2. eager-1F1B with weight-gradient delay over 2 stages that are 3-D meshes (1x2x2 each, 3d
#     strategy, 4 hosts x 2 ranks) against the signal bound: scripts/run-pipeline-ablation.sh
#     gpt3d (rows blocking, 1f1b, eager, eager+wdelay, signal; microbatches XMESH_OVA_PIPE_MB).
#
# NIC rate (XMESH_OVA_RATE, default 1000mbit per direction, burst 64kb): measured 2026-11-25,
# at 100 Mbit/s a no-overlap megatron step is 2.68 s of which 0.22 s compute (every row NIC-bound,
# nothing to hide behind); at 1 Gbit/s boxing is 0.52 s of a 0.73 s step, where hiding shows.
# BLAS runs one thread per rank (--blas-threads 1).
#
# Output: build/overlap-ablation/<time>/{overlap.md,overlap.json,overlap.png,*.log} and
# pipeline/gpt3d/{ablation.md,ablation.json,ablation.png}; the tables are printed.
#   scripts/run-overlap-ablation.sh              # the real run (about 8-10 minutes)
#   scripts/run-overlap-ablation.sh --quick      # 2 steps, no warmup, tiny part-1 model: a smoke test
# Environment: XMESH_OVA_RATE [1000mbit], XMESH_OVA_BURST [64kb], XMESH_OVA_STEPS [6],
#   XMESH_OVA_WARMUP [2], XMESH_OVA_PIPE_MB [4], XMESH_OVA_OUT, XMESH_OVA_PARTS ["1 2"], XMESH_OVA_STRATEGIES
#   [megatron:2x4,3d:2x2x2,axonn:2x2x2]. Without an emulated cluster (cluster.sh check fails)
#   both parts run on this host with mpirun and the times show no NIC bottleneck.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
root=$PWD
quick=0
[ "${1:-}" = --quick ] && quick=1
rate=${XMESH_OVA_RATE:-1000mbit}
burst=${XMESH_OVA_BURST:-64kb}
steps=${XMESH_OVA_STEPS:-6}
warmup=${XMESH_OVA_WARMUP:-2}
pmb=${XMESH_OVA_PIPE_MB:-4}
if [ $quick = 1 ]; then steps=2 warmup=0; fi
out=${XMESH_OVA_OUT:-$root/build/overlap-ablation/$(date -u +%Y%m%d-%H%M%S)}
strategies=${XMESH_OVA_STRATEGIES:-megatron:2x4,3d:2x2x2,axonn:2x2x2}
parts=" ${XMESH_OVA_PARTS:-1 2} "
hosts=4 pph=2

cmake --build build -j "${XMESH_JOBS:-2}" --target xmesh-train >/dev/null || {
    echo "run-overlap-ablation: build failed (configure build/ first)" >&2
    exit 1
}
train=$root/build/pipeline/xmesh-train
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
mkdir -p "$out"
incluster=1
why=$(microbench/cluster/cluster.sh check 2>&1) || incluster=0
[ $incluster = 1 ] || echo "run-overlap-ablation: no emulated cluster ($why); running on one host: times show no NIC bottleneck" >&2

model="--layers 4 --heads 4 --channels 256 --seq 64 --batch 8 --microbatches 1 --blas-threads 1"
[ $quick = 1 ] && model="--layers 2 --heads 4 --channels 32 --seq 16 --batch 8 --microbatches 1 --blas-threads 1"
cmd=(python3 "$root/microbench/pipeline/overlap_ablation.py" --train "$train"
    --model-args "$model" --strategies "$strategies" --steps "$steps" --warmup "$warmup"
    --label "GPT (4 layers, C 256, T 64, batch 8), $hosts hosts x $pph ranks, NIC $rate, CPUs pinned per host"
    --out "$out")
rc=0
if [[ $parts == *" 1 "* ]]; then
    echo "run-overlap-ablation: part 1, overlap switches ($strategies), results in $out" >&2
    if [ $incluster = 1 ]; then
        microbench/cluster/cluster.sh -q -p -H $hosts -d $pph -r "$rate" -b "$burst" -- "${cmd[@]}" || rc=1
    else
        "${cmd[@]}" --np $((hosts * pph)) || rc=1
    fi
fi
if [[ $parts == *" 2 "* ]]; then
    echo "run-overlap-ablation: part 2, eager-1F1B + weight delay over 2 stages of 1x2x2 (3d)" >&2
    XMESH_ABL_OUT=$out/pipeline XMESH_ABL_RATE_GPT=$rate XMESH_ABL_BURST=$burst \
        XMESH_ABL_STEPS=$steps XMESH_ABL_WARMUP=$warmup XMESH_ABL_MICROBATCHES=$pmb \
        scripts/run-pipeline-ablation.sh gpt3d || rc=1
fi
if [ -f "$out/pipeline/gpt3d/ablation.md" ]; then
    { echo; echo "## eager-1F1B + weight delay, 2 stages of 1x2x2 (3d), against signal"; echo
      cat "$out/pipeline/gpt3d/ablation.md"; } >> "$out/overlap.md"
fi
echo "run-overlap-ablation: results in $out (overlap.md, overlap.json, overlap.png)" >&2
exit $rc
