#!/usr/bin/env bash
# Builds xmesh and runs every test tier: format check, unit + MPI + cluster +
# GPU-skip + install tests (CTest), bounded fuzzing, and a sanitizer pass
# (ASan+UBSan over the unit, MPI and UCX tiers), ThreadSanitizer over the MPI
# and UCX tiers,
# plus valgrind memcheck of the unit tier, and the Python package (built
# into build-py/venv, pytest under mpirun -np 4 and 8). Installs missing
# Debian packages and the Python venv first. Exit status: 0 iff all passed.
#
#   scripts/run-tests.sh            everything (about 20-40 minutes on 2 cores)
#   XMESH_QUICK=1 scripts/run-tests.sh   main build, CTest and the Python package
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
jobs=${XMESH_JOBS:-2}
fuzz_seconds=${XMESH_FUZZ_SECONDS:-30}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Open MPI's own progress wants few cores; keep it quiet on 2-core machines.
export OMPI_MCA_rmaps_base_oversubscribe=1

step() { printf '\n==== %s ====\n' "$*"; }

step "dependencies"
scripts/install-deps.sh

step "format check (.clang-format)"
# Says so when it cannot run rather than passing silently.
if ! command -v clang-format >/dev/null 2>&1; then
  echo "format check NOT RUN: clang-format is not installed"
elif ! command -v git >/dev/null 2>&1; then
  echo "format check NOT RUN: git is not installed (the file list comes from git ls-files)"
elif ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  echo "format check NOT RUN: $root is not a git work tree (the file list comes from git ls-files)"
else
  mapfile -t srcs < <(git ls-files '*.c' '*.h' '*.cu')
  if [ ${#srcs[@]} -eq 0 ]; then
    echo "format check NOT RUN: git ls-files lists no C/CUDA sources"
  else
    clang-format --dry-run --Werror "${srcs[@]}"
    echo "clang-format: ${#srcs[@]} files clean"
  fi
fi

if [ -z "${XMESH_QUICK:-}" ]; then
  step "fuzzing (libFuzzer, ${fuzz_seconds}s per target)"
  cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DXMESH_FUZZ=ON -DXMESH_WITH_CUDA=OFF \
        -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build build-fuzz -j "$jobs" --target xmesh_fuzz_targets
  for f in build-fuzz/tests/fuzz/fuzz_*; do
    [ -x "$f" ] || continue
    name=$(basename "$f")
    corpus=$(mktemp -d)
    cp -r tests/fuzz/corpus/"${name#fuzz_}"/. "$corpus"/ 2>/dev/null || true
    echo "fuzz: $name for ${fuzz_seconds}s"
    "$f" -max_total_time="$fuzz_seconds" -print_final_stats=0 "$corpus" 2>&1 | tail -n 2
    rm -rf "$corpus"
  done

  step "sanitizers: ASan + UBSan over the unit and MPI tiers"
  cmake -S . -B build-asan -DXMESH_ASAN=ON -DXMESH_UBSAN=ON -DXMESH_WITH_CUDA=OFF \
        -DCMAKE_BUILD_TYPE=Debug >/dev/null
  cmake --build build-asan -j "$jobs"
  # Open MPI keeps some allocations until exit; leaks are checked by valgrind below.
  # XMESH_TEST_TIME_SCALE stretches the fault tests' timeouts and margins
  # (tests/reliability/fault.sh) for the slower instrumented builds.
  XMESH_TEST_TIME_SCALE=2 ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan -L 'unit|mpi|sched|ucx' -j "$jobs" --output-on-failure

  step "ThreadSanitizer over the MPI and UCX tiers"
  # The executor's progress thread, the callers that drive progress in
  # xmesh_wait / xmesh_test, and every MPI thread level. Shared memory only
  # (self,vader: the TCP BTL adds nothing here and more Open MPI noise);
  # tests/mpi/tsan.supp silences Open MPI's uninstrumented internals only.
  # About 3 minutes on 2 cores. The training stack (label pipeline) runs
  # under ASan+UBSan above; its threads are the same executor threads.
  cmake -S . -B build-tsan -DXMESH_TSAN=ON -DXMESH_WITH_CUDA=OFF \
        -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build build-tsan -j "$jobs"
  # UCX_MEM_EVENTS=no: UCX's memory hooks (libucm patches mmap/madvise) crash
  # under TSan's interceptors; the UCX tier needs no memory events on host memory.
  OMPI_MCA_btl=self,vader XMESH_TEST_TIME_SCALE=3 UCX_MEM_EVENTS=no \
    TSAN_OPTIONS="halt_on_error=1 exitcode=66 suppressions=$root/tests/mpi/tsan.supp" \
    ctest --test-dir build-tsan -L 'mpi|ucx' -LE pipeline -j "$jobs" --output-on-failure

  step "valgrind memcheck over the unit tier"
  cmake -S . -B build-vg -DXMESH_WITH_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug >/dev/null
  cmake --build build-vg -j "$jobs"
  for t in build-vg/tests/unit/test_*; do
    [ -x "$t" ] || continue
    echo "memcheck: $t"
    valgrind --quiet --error-exitcode=3 --leak-check=full --errors-for-leak-kinds=definite \
      "$t" >/dev/null
  done
fi

step "build (warnings are errors) and CTest: every tier"
cmake -S . -B build-ci -DXMESH_WERROR=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-ci -j "$jobs"
ctest --test-dir build-ci -j "$jobs" --output-on-failure

step "python package (pip install into build-py/venv, pytest under mpirun -np 4 and -np 8)"
if [ -n "${XMESH_NO_PYTHON:-}" ]; then
  echo "python package NOT RUN: XMESH_NO_PYTHON is set"
else
  scripts/python-tests.sh
fi
