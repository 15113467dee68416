#!/usr/bin/env bash
# tests/gpu/run.sh: the whole GPU check in one command, for a machine with
# one or more NVIDIA GPUs (one MPI rank per GPU):
#   1. builds xmesh with the NCCL backend for this GPU's architecture;
#   2. runs the GPU CTest tier (CPU parts, sm_90 compile check, device tests);
#   3. runs the GPU correctness matrix (the MPI matrix's kinds of cases,
#      partial sums and uneven splits included) and prints its table;
#   4. runs a broadcast bandwidth sweep, xmesh against ncclBroadcast
#      (nccl-tests style), prints the table and writes JSON.
# Results go to $XMESH_GPU_OUT (default build-gpu/results).
#
# Environment: XMESH_GPU_BUILD (build dir, default <repo>/build-gpu),
# XMESH_GPU_RANKS (default: number of GPUs), XMESH_MPIEXEC (launcher, default
# "mpiexec --oversubscribe -n <ranks>"; e.g. "srun -N2 --ntasks-per-node=8"
# for several nodes), XMESH_BENCH_MAX (largest sweep size, default 256M),
# XMESH_JOBS (build parallelism).
#
# On a machine without a GPU it refuses and runs nothing (exit 2).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  cat >&2 <<'MSG'
tests/gpu/run.sh: no NVIDIA GPU found (nvidia-smi is missing or cannot talk to a driver).
  This script builds the NCCL backend, runs the GPU correctness matrix and the
  broadcast bandwidth sweep; none of that can run without a GPU, so nothing was
  run. Without a GPU, `ctest -L gpu` still runs the CPU half of the GPU tier
  (device-independent plans, sm_90 compile check) and skips the device tests.
MSG
  exit 2
fi

ngpu=$(nvidia-smi -L | grep -c '^GPU ' || true)
if [ "$ngpu" -lt 1 ]; then
  echo "tests/gpu/run.sh: nvidia-smi lists no GPU; nothing was run." >&2
  exit 2
fi
cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n1 | tr -d ' .')
ranks=${XMESH_GPU_RANKS:-$ngpu}
build=${XMESH_GPU_BUILD:-$root/build-gpu}
out=${XMESH_GPU_OUT:-$build/results}
jobs=${XMESH_JOBS:-$(nproc)}
launch=${XMESH_MPIEXEC:-mpiexec --oversubscribe -n $ranks}
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
mkdir -p "$out"
step() { printf '\n==== %s ====\n' "$*"; }

step "GPUs"
nvidia-smi -L | tee "$out/gpus.txt"

step "build: $build (sm_$cc, $ranks rank(s))"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DXMESH_CUDA_ARCHITECTURES="$cc" \
      -DXMESH_GPU_TEST_RANKS="$ranks" | tee "$out/configure.txt"
if ! grep -q "NCCL/CUDA backend: ON" "$out/configure.txt"; then
  echo "tests/gpu/run.sh: CMake did not find CUDA + NCCL (see $out/configure.txt);" \
       "set CUDAToolkit_ROOT / NCCL_ROOT." >&2
  exit 1
fi
cmake --build "$build" -j "$jobs"
"$build/tools/xmesh-info" > "$out/xmesh-info.txt" || true

step "CTest, GPU tier"
ctest --test-dir "$build" -L gpu -E 'gpu.nccl_matrix' --output-on-failure | tee "$out/ctest.txt"

step "correctness matrix ($ranks rank(s), every element of every destination block)"
matrix_rc=0
$launch "$build/tests/gpu/test_nccl" | tee "$out/matrix.txt" || matrix_rc=$?

step "broadcast sweep: xmesh vs ncclBroadcast"
bench_rc=0
if [ "$ranks" -ge 2 ]; then
  $launch "$build/tests/gpu/xmesh-gpu-bcast-bench" -b 1K -e "${XMESH_BENCH_MAX:-256M}" -f 4 \
    -n 20 -w 5 -J "$out/bcast.json" | tee "$out/bcast.txt" || bench_rc=$?
else
  echo "only one rank: a broadcast needs a sender and a receiver GPU; sweep not run" |
    tee "$out/bcast.txt"
fi

step "summary"
printf '%-28s %s\n' "GPUs (ranks)" "$ngpu ($ranks)"
printf '%-28s %s\n' "correctness matrix" "$([ $matrix_rc = 0 ] && echo passed || echo "FAILED ($matrix_rc)")"
grep -E '^  ' "$out/matrix.txt" || true
printf '%-28s %s\n' "broadcast sweep" "$([ $bench_rc = 0 ] && echo "see table" || echo "FAILED ($bench_rc)")"
grep -vE '^#' "$out/bcast.txt" || true
echo "results in $out"
[ $matrix_rc = 0 ] && [ $bench_rc = 0 ]
