#!/usr/bin/env bash
# Pipeline schedules on the emulated cluster (issue 23 item 6; docs/SCHEDULES.md "Measured"):
# xmesh-train with 1F1B, eager-1F1B, eager-1F1B + weight-gradient delay, interleaved 1F1B
# (2 chunks per rank) and ZB-V (V shape, 2 chunks per rank), at 2 and 4 rank groups (one rank
# per emulated host, one host per group) and microbatch counts M, with the simulator's
# predicted step time, bubble and peak activation memory beside the measured ones.
#
#   scripts/run-schedules.sh [gpt] [ut]      (default: gpt)
#
# Writes build/schedules/<time>/{schedules.md,schedules.json,schedules.png} (+ per-run logs and
# step JSON under <config>/) and prints the table.
# Environment:
#   XMESH_SCHED_GROUPS [2,4]        rank groups R
#   XMESH_SCHED_MICROBATCHES [4,8]  microbatch counts M
#   XMESH_SCHED_ROWS [all]          e.g. 1f1b,zb-v
#   XMESH_SCHED_STEPS [8] XMESH_SCHED_WARMUP [2]   steps per run, dropped warm-up steps
#   XMESH_SCHED_RATE [100mbit] XMESH_SCHED_BURST [64kb]   NIC of each emulated host
#   XMESH_SCHED_GPT ["--layers 8 --heads 4 --channels 128 --seq 64"] XMESH_SCHED_GPT_MBS [4]
#   XMESH_SCHED_UT ["--base-channels 8 --lr 0.005"] XMESH_SCHED_UT_MBS [2]
#   XMESH_SCHED_ONE_HOST=1          skip the emulated cluster (one host, no NIC limit)
#   XMESH_SCHED_OUT                 output folder
# BLAS runs one thread per rank (--blas-threads 1).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
root=$PWD
groups=${XMESH_SCHED_GROUPS:-2,4}
mbl=${XMESH_SCHED_MICROBATCHES:-4,8}
rows=${XMESH_SCHED_ROWS:-1f1b,eager-1f1b,eager-1f1b+wdelay,interleaved-1f1b,zb-v}
steps=${XMESH_SCHED_STEPS:-8}
warmup=${XMESH_SCHED_WARMUP:-2}
rate=${XMESH_SCHED_RATE:-100mbit}
burst=${XMESH_SCHED_BURST:-64kb}
gpt_model="${XMESH_SCHED_GPT:---layers 8 --heads 4 --channels 128 --seq 64} --blas-threads 1"
gpt_mbs=${XMESH_SCHED_GPT_MBS:-4}
ut_model="${XMESH_SCHED_UT:---base-channels 8 --lr 0.005} --blas-threads 1"
ut_mbs=${XMESH_SCHED_UT_MBS:-2}
out=${XMESH_SCHED_OUT:-$root/build/schedules/$(date -u +%Y%m%d-%H%M%S)}
configs=${*:-gpt}
invocation="scripts/run-schedules.sh ${*:-}"
for v in XMESH_SCHED_GROUPS XMESH_SCHED_MICROBATCHES XMESH_SCHED_ROWS XMESH_SCHED_STEPS \
    XMESH_SCHED_WARMUP XMESH_SCHED_RATE XMESH_SCHED_BURST XMESH_SCHED_GPT XMESH_SCHED_GPT_MBS \
    XMESH_SCHED_UT XMESH_SCHED_UT_MBS XMESH_SCHED_ONE_HOST; do
    [ -n "${!v:-}" ] && invocation="$v='${!v}' $invocation"
done

for c in $configs; do
    case $c in gpt | ut) ;; *)
        echo "run-schedules: unknown config '$c' (gpt, ut)" >&2
        exit 2
        ;;
    esac
done
scripts/install-deps.sh >/dev/null || exit 1
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null || exit 1
cmake --build build -j "${XMESH_JOBS:-2}" --target xmesh-train >/dev/null || {
    echo "run-schedules: build failed" >&2
    exit 1
}
train=$root/build/pipeline/xmesh-train
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
mkdir -p "$out"

incluster=1
if [ "${XMESH_SCHED_ONE_HOST:-0}" = 1 ]; then
    incluster=0
    echo "run-schedules: XMESH_SCHED_ONE_HOST=1: running on one host: times show no NIC bottleneck" >&2
else
    why=$(microbench/cluster/cluster.sh check 2>&1) || incluster=0
    [ $incluster = 1 ] || echo "run-schedules: no emulated cluster ($why); running on one host: times show no NIC bottleneck" >&2
fi
cores=$(nproc 2>/dev/null || echo '?')

rc=0
for c in $configs; do
    if [ "$c" = gpt ]; then
        model=gpt margs=$gpt_model mbs=$gpt_mbs ups=$(echo "$gpt_model" | sed -n 's/.*--seq \([0-9]*\).*/\1/p') units=tokens
        [ -n "$ups" ] || ups=1024
    else
        model=utransformer margs=$ut_model mbs=$ut_mbs ups=1 units=images
    fi
    cdir=$out/$c
    mkdir -p "$cdir"
    for R in ${groups//,/ }; do
        cmd=(python3 "$root/microbench/pipeline/schedules.py" run --train "$train" --model "$model"
            --model-args "$margs" --groups "$R" --microbatch-size "$mbs" --units-per-sample "$ups"
            --units "$units" --microbatches "$mbl" --steps "$steps" --warmup "$warmup"
            --rows "$rows" --out "$cdir")
        if [ $incluster = 1 ]; then
            echo "run-schedules: $c, R=$R ($R hosts x 1 rank, NIC $rate)" >&2
            microbench/cluster/cluster.sh -q -p -H "$R" -d 1 -r "$rate" -b "$burst" -- "${cmd[@]}" || rc=1
        else
            echo "run-schedules: $c, R=$R ($R ranks on one host)" >&2
            "${cmd[@]}" --np "$R" || rc=1
        fi
    done
    if [ $incluster = 1 ]; then
        env="emulated cluster: R hosts x 1 rank per host, CPUs pinned per host (cluster.sh -p), NIC $rate (burst $burst) per host; machine $cores cores; BLAS 1 thread per rank"
    else
        env="ONE HOST (no emulated cluster): R ranks on one machine, no NIC limit; machine $cores cores; BLAS 1 thread per rank"
    fi
    python3 "$root/microbench/pipeline/schedules.py" report --out "$cdir" \
        --command "$invocation" --env "$env" || rc=1
    for f in schedules.md schedules.json schedules.png; do
        [ -f "$cdir/$f" ] && cp "$cdir/$f" "$out/${c}-$f"
    done
done
echo "run-schedules: results in $out" >&2
exit $rc
