#!/usr/bin/env bash
# Builds the Python package into the venv (scripts/python-venv.sh) and runs
# its tests under mpirun with 4 and 8 ranks, plus `python -m xmesh.info`,
# then xmesh.torch's tests and examples (scripts/python-torch-tests.sh).
# The CMake build directory is kept (build-py/cmake), so reruns rebuild
# only what changed. Exit status 0 iff everything passed.
#
#   scripts/python-tests.sh                 build, install, test
#   XMESH_PY_SEED=123 scripts/python-tests.sh    replay a seed
set -euo pipefail
cd "$(dirname "$0")/.."
venv=build-py/venv
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
scripts/python-venv.sh "$venv"
py=$PWD/$venv/bin/python

echo "python: pip install . (scikit-build-core, build dir build-py/cmake)"
"$py" -m pip --disable-pip-version-check -q install --no-deps --no-build-isolation \
  -Cbuild-dir=build-py/cmake .

echo "python: python -m xmesh.info"
info=$(cd /tmp && "$py" -m xmesh.info --no-topo)
echo "$info" | head -n 1
echo "$info" | grep -q '^xmesh [0-9]' || { echo "python -m xmesh.info printed no version line"; exit 1; }
echo "$info" | grep -q 'XMESH_CHUNK_BYTES' || { echo "python -m xmesh.info printed no parameters"; exit 1; }
# Same report as the C tool: the parameter table (build type and test hooks
# differ between the two builds by design) must match line for line.
cinfo=${XMESH_PY_INFO:-}
for c in build-ci/tools/xmesh-info build/tools/xmesh-info; do
  [ -n "$cinfo" ] || { [ -x "$c" ] && cinfo=$c; } || true
done
if [ -n "$cinfo" ]; then
  params() { awk '/^parameters /{p=1} /^test hooks/{p=0} p'; }
  if ! diff <(echo "$info" | params) <("$cinfo" --no-topo | params); then
    echo "python -m xmesh.info and $cinfo print different parameter tables"; exit 1
  fi
  echo "python: parameter table identical to $cinfo's"
else
  echo "python: no xmesh-info built here (build-ci/, build/): comparison NOT RUN"
fi

# Tests run from /tmp so `import xmesh` is the installed package, not python/.
tests=$PWD/python/tests
# A hung collective must not hang CI: the library's own timeout, then mpirun's.
export XMESH_TIMEOUT_S=${XMESH_TIMEOUT_S:-60} XMESH_PY_SEED=${XMESH_PY_SEED:-}
# Each rank's report goes to its own file; rank 0's is shown, and every
# rank's in full when the run fails.
out=$PWD/build-py/pytest
mkdir -p "$out"
run() { # np thread-level
  echo "python: pytest under mpirun -np $1 (MPI thread level $2)"
  local dir=$out/np$1-$2 rc=0
  rm -rf "$dir"
  (cd /tmp && MPI4PY_RC_THREAD_LEVEL=$2 timeout 300 mpirun -np "$1" --oversubscribe \
     --output-filename "$dir" -x MPI4PY_RC_THREAD_LEVEL -x XMESH_TIMEOUT_S -x XMESH_PY_SEED \
     "$py" -m pytest -q --color=no -p no:cacheprovider -o faulthandler_timeout=120 "$tests") >"$dir.log" 2>&1 || rc=$?
  local reports=("$dir"/1/rank.*/stdout)
  if [ "$rc" -ne 0 ]; then
    cat "$dir.log"
    for f in "${reports[@]}"; do echo "---- $f"; cat "$f"; done
    echo "python: FAILED under mpirun -np $1 ($2), exit $rc"
    return 1
  fi
  cat "$dir"/1/rank.0/stdout
  echo "python: every rank: $(tail -qn 1 "${reports[@]}" | sed 's/ in [0-9.]*s$//' | sort | uniq -c | tr -s ' ' | paste -sd ';')"
}
run 4 multiple
run 8 funneled
run 4 single
run 8 serialized
echo "python: the example, mpirun -np 4 python python/examples/redistribute.py"
ex=$(cd /tmp && timeout 120 mpirun -np 4 --oversubscribe "$py" "$OLDPWD/python/examples/redistribute.py" 2>&1) ||
  { echo "$ex"; echo "python: the example FAILED"; exit 1; }
echo "$ex" | grep -E '^[0-9]+ unit tasks' || { echo "$ex"; echo "python: the example printed no summary"; exit 1; }
# (ranks' lines may interleave in mpirun's output: look for the verdict, not a whole line)
if ! echo "$ex" | grep -q 'scheduler [a-z-]*: OK' || echo "$ex" | grep -q ': WRONG'; then
  echo "$ex"; echo "python: the example's check FAILED"; exit 1
fi
# ctx.plan_many over UCX without MPI: Context.from_env() in processes the
# UCX tier's launcher starts (no mpirun, no mpi4py).
if (cd /tmp && "$py" -c 'import sys, xmesh._lib as l; sys.exit(l.ctx_create_ucx is None)'); then
  echo "python: plan_many over UCX (xmesh.Context.from_env), tests/ucx/xmesh-launch.py -n 4"
  useed=${XMESH_PY_SEED:-$RANDOM}
  ux=$(cd /tmp && XMESH_PY_SEED=$useed timeout 200 "$py" "$OLDPWD/tests/ucx/xmesh-launch.py" -n 4 --hosts 2 \
         --timeout 180 -- "$py" "$OLDPWD/python/tests/ucx_many.py" 2>&1) ||
    { echo "$ux"; echo "python: plan_many over UCX FAILED (XMESH_PY_SEED=$useed replays)"; exit 1; }
  echo "$ux" | grep -c ': ok: ' | sed 's/^/python: UCX checks passed (ranks x tests): /'
else
  echo "python: libxmesh without UCX: plan_many over UCX NOT RUN"
fi
# xmesh.torch: its own pytest suite and examples, 4 and 8 processes, under
# torchrun (no MPI: UCX through the process group) and mpirun (mpi4py).
echo "python: xmesh.torch (scripts/python-torch-tests.sh)"
scripts/python-torch-tests.sh
echo "python: all passed"
