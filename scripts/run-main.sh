#!/usr/bin/env bash
# The main job: installs missing packages, builds xmesh, then
#  - runs the emulated-cluster benchmark (scripts/run-bench.sh: n-to-m and
#    1-to-m suites on network namespaces with rate-limited NICs) when it is
#    present and this is root with namespace support;
#  - otherwise plans the paper's Table 2 cases with xmesh-plan (no MPI).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "${XMESH_JOBS:-2}"
if [ -x scripts/run-bench.sh ] && [ -z "${XMESH_PLAN_ONLY:-}" ]; then
  exec scripts/run-bench.sh "$@"
fi
echo "xmesh-plan over the paper's Table 2 cases (docs/BENCH_CASES.md):"
exec build/tools/xmesh-plan --all-cases "$@"
