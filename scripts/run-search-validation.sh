#!/usr/bin/env bash
# Validation of the layout search's model (issue 21 item 4; docs/SEARCH.md "Validation") on
# the emulated cluster: 4 hosts x 2 ranks (microbench/cluster/cluster.sh -p: CPUs per host),
# NIC rate XMESH_SV_RATE, BLAS one thread per rank. Calibrates the cluster (xmesh-calibrate),
# then runs every GPT-2 configuration of a space generated from the model (stage counts
# dividing the 8 ranks up to the layer count, splits of its layers, stage meshes of 1-4 axes,
# dp, megatron where its tensor axis divides the heads, 3d, axonn with sharded storage, every
# schedule, M = S and 2S; microbench/search/validate.py, `--list` prints it) REPEATS
# times and reports precision@5, Kendall tau, top-1 regret, median prediction error,
# predicted/measured per configuration and ties, for the model and its ablations.
# Writes build/search-validation/<time>/{validation.md,validation.json,validation.png,runs/}.
#
#   scripts/run-search-validation.sh
# Environment (defaults in brackets; the default run is planned for about 15 minutes on a 2-core
# quiet machine: calibration ~60 s + ~45 configurations x 3 repeats x (launch ~5 s + 6 steps,
# the first 2 dropped: medians of 2 kept steps varied more);
# the tiny check below took 80 s on a loaded one):
#   XMESH_SV_STEPS [6]  XMESH_SV_WARMUP [2]  XMESH_SV_REPEATS [3]
#   XMESH_SV_MAX_CONFIGS [0 = all]  XMESH_SV_RATE [200mbit]  XMESH_SV_BURST [64kb] (the NICs'
#     token bucket, cluster.sh -b; also written as nic_burst_bytes into the nic-burst model's
#     cluster file, validate.py --nic-burst)
#   XMESH_SV_ONLY (comma list of configuration indices, the table's #: a subset)
#   XMESH_SV_MODEL ["--layers 4 --heads 4 --channels 128 --seq 64 --batch 16"]
#   XMESH_SV_SPACE_SIZE [40] (generated configurations kept, spread over stage counts,
#     schedules and M; 0: all) plus five with --overlap defer-grad
#   XMESH_SV_SPACE [generated] (legacy: the hand-written 4-layer space of 2026-11-25..29)
#   XMESH_SV_LIST=1: print the space and exit (a dry run: no build, no cluster; after the
#     model's checks when build/pipeline/xmesh-train exists)
#   XMESH_SV_CALIBRATE [1] (0: no calibration; the full model is then the nominal one)
#   XMESH_SV_CLUSTER (a calibrated cluster file to use instead of calibrating)
#   XMESH_SV_OUT [build/search-validation/<time>]
# A tiny check: XMESH_SV_MAX_CONFIGS=2 XMESH_SV_REPEATS=1 XMESH_SV_STEPS=2 XMESH_SV_WARMUP=0
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
root=$PWD
out=${XMESH_SV_OUT:-$root/build/search-validation/$(date -u +%Y%m%d-%H%M%S)}
rate=${XMESH_SV_RATE:-200mbit}
burst=${XMESH_SV_BURST:-64kb}
model=${XMESH_SV_MODEL:---layers 4 --heads 4 --channels 128 --seq 64 --batch 16}
space=(--space "${XMESH_SV_SPACE:-generated}" --space-size "${XMESH_SV_SPACE_SIZE:-40}")
if [ "${XMESH_SV_LIST:-0}" = 1 ]; then
    # with a built xmesh-train, the space the model accepts (what the run would take)
    train=()
    [ -x "$root/build/pipeline/xmesh-train" ] && train=(--train "$root/build/pipeline/xmesh-train")
    exec python3 "$root/microbench/search/validate.py" --list --model-args "$model" "${space[@]}" \
        "${train[@]}"
fi

cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null || exit 1
cmake --build build -j "${XMESH_JOBS:-2}" --target xmesh-train xmesh-calibrate >/dev/null || {
    echo "run-search-validation: build failed" >&2
    exit 1
}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
mkdir -p "$out"
args=(python3 "$root/microbench/search/validate.py" --train "$root/build/pipeline/xmesh-train"
      --hosts 4 --model-args "$model" --steps "${XMESH_SV_STEPS:-6}"
      --warmup "${XMESH_SV_WARMUP:-2}" --repeats "${XMESH_SV_REPEATS:-3}"
      --max-configs "${XMESH_SV_MAX_CONFIGS:-0}" --only "${XMESH_SV_ONLY:-}" --out "$out"
      --nic-burst "$burst"
      "${space[@]}")
if [ -n "${XMESH_SV_CLUSTER:-}" ]; then
    args+=(--cluster "$XMESH_SV_CLUSTER")
elif [ "${XMESH_SV_CALIBRATE:-1}" = 1 ]; then
    args+=(--calibrate "$root/build/tools/xmesh-calibrate")
fi
if why=$(microbench/cluster/cluster.sh check 2>&1); then
    echo "run-search-validation: 4 hosts x 2 ranks, NIC $rate, output $out" >&2
    microbench/cluster/cluster.sh -q -p -H 4 -d 2 -r "$rate" -b "$burst" -- "${args[@]}"
else
    echo "run-search-validation: no emulated cluster ($why); one host, mpirun --oversubscribe:" \
         "the NIC does not matter and the numbers do not validate the model" >&2
    "${args[@]}" --rate-mbit 0
fi
rc=$?
echo "run-search-validation: results in $out" >&2
exit $rc
