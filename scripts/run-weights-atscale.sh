#!/usr/bin/env bash
# Whole-model weight transfer at scale, by simulation (issue 35 item 6;
# docs/WEIGHTS_ATSCALE.md): Kimi-K2 (256 -> 128 GPUs) and DeepSeek-V3
# (PP16 x EP16 -> TP32 x DP8), bf16, 8 NICs of 400 Gbit/s per host, each
# model as ONE plan of many tensors with the library's planner and cost model
# (xmesh-plan --many; no MPI, nothing moves). Prints a table and writes
# OUT/weights_atscale.{json,md} and the --many files.
#
#   scripts/run-weights-atscale.sh [OUT]     default build/weights-atscale
# Extra arguments after OUT go to microbench/scale/weights_atscale.py
# (--chunks, --latency-us, --reps, --cases).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/weights-atscale}
shift || true
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "${XMESH_JOBS:-2}" --target xmesh-plan >/dev/null
exec python3 microbench/scale/weights_atscale.py --plan build/tools/xmesh-plan --out "$out" "$@"
