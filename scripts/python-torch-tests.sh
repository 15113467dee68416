#!/usr/bin/env bash
# Runs xmesh.torch's tests (python/tests_torch) with 4 and 8 processes (gloo,
# CPU) and the torch examples (python/examples/torch_*.py) with 8, against
# the package installed in the venv (scripts/python-tests.sh installs it),
# under both launchers by default. Exit status 0 iff everything passed.
#
#   scripts/python-torch-tests.sh [--launcher "torchrun mpirun"] [--np "4 8"]
#
# torchrun (`torchrun --standalone --nproc-per-node N`): no MPI at all; the
#   first xmesh.torch call makes a UCX context whose addresses are exchanged
#   through the default process group's all-gather (xmesh_ctx_create_ucx
#   with the OOB callback in xmesh/torch.py). Needs a libxmesh with UCX.
#   The whole suite (every placement pair included) and both examples.
# mpirun: torch.distributed is initialised from Open MPI's rank variables
#   and xmesh's context comes from mpi4py (XMESH_TORCH_BOOTSTRAP=mpi). To
#   keep the step within a few minutes on 2 cores, the all-pairs test
#   (test_every_placement_pair, the heaviest) runs under torchrun only;
#   mpirun runs the rest of the suite (a sample of pairs through the other
#   tests) and both examples.
# A libxmesh without UCX runs mpirun only (torchrun is reported NOT RUN).
set -euo pipefail
cd "$(dirname "$0")/.."
launchers="torchrun mpirun" nps="4 8"
while [ $# -gt 0 ]; do
  case "$1" in
    --launcher) launchers=$2; shift 2 ;;
    --np) nps=$2; shift 2 ;;
    *) echo "usage: $0 [--launcher \"torchrun mpirun\"] [--np \"4 8\"]"; exit 2 ;;
  esac
done
venv=build-py/venv
py=$PWD/$venv/bin/python
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export XMESH_TIMEOUT_S=${XMESH_TIMEOUT_S:-60} XMESH_PY_SEED=${XMESH_PY_SEED:-}
if ! "$py" -c 'import torch' 2>/dev/null; then
  echo "python-torch: torch is not installed in $venv (scripts/python-venv.sh installs it)"; exit 1
fi
port=$((29500 + RANDOM % 2000))
launch() { # np, then the python command line
  local np=$1; shift
  port=$((port + 1))
  case "$launcher" in
    mpirun) XMESH_TORCH_BOOTSTRAP=mpi timeout 600 mpirun -np "$np" --oversubscribe -x MASTER_ADDR=127.0.0.1 \
              -x MASTER_PORT=$port -x XMESH_TORCH_BOOTSTRAP -x XMESH_TIMEOUT_S -x XMESH_PY_SEED -x OMP_NUM_THREADS=1 "$py" "$@" ;;
    torchrun) OMP_NUM_THREADS=1 XMESH_TORCH_BOOTSTRAP=oob timeout 600 "$py" -m torch.distributed.run --standalone \
              --nproc-per-node "$np" "$@" ;;
    *) echo "python-torch: unknown launcher $launcher"; return 2 ;;
  esac
}
tests=$PWD/python/tests_torch
out=$PWD/build-py/pytest-torch
mkdir -p "$out"
for launcher in $launchers; do
  t0=$SECONDS
  case "$launcher" in
    torchrun)
      if ! (cd /tmp && "$py" -c 'import sys, xmesh._lib as l; sys.exit(l.ctx_create_ucx is None)'); then
        echo "python-torch: libxmesh without UCX (no xmesh_ctx_create_ucx): torchrun NOT RUN"; continue
      fi
      sel=() ;;
    mpirun) sel=(-k "not test_every_placement_pair") ;;  # all pairs: under torchrun only (see above)
    *) echo "python-torch: unknown launcher $launcher"; exit 2 ;;
  esac
  for np in $nps; do
    echo "python-torch: pytest under $launcher with $np processes"
    log=$out/np$np-$launcher.log rc=0
    (cd /tmp && launch "$np" -m pytest -q --color=no -p no:cacheprovider -o faulthandler_timeout=240 ${sel[@]+"${sel[@]}"} "$tests") >"$log" 2>&1 || rc=$?
    if [ "$rc" -ne 0 ]; then
      cat "$log"; echo "python-torch: FAILED under $launcher -np $np, exit $rc"; exit 1
    fi
    grep -m1 -E "seed [0-9]+" "$log" | sed 's/rank [0-9]* of/ranks:/' || true
    # (not anchored: ranks' lines may interleave in mpirun's output)
    echo "python-torch: every rank: $(grep -oE '[0-9]+ (passed|failed)[a-z0-9, ]* in [0-9.]+s' "$log" | sed 's/ in [0-9.]*s$//' | sort | uniq -c | tr -s ' ' | paste -sd ';')"
  done
  for ex in python/examples/torch_*.py; do
    [ -e "$ex" ] || continue
    echo "python-torch: example $ex under $launcher with 8 processes"
    rc=0
    o=$(cd /tmp && launch 8 "$OLDPWD/$ex" 2>&1) || rc=$?
    if [ "$rc" -ne 0 ] || ! echo "$o" | grep -q ': OK'; then
      echo "$o"; echo "python-torch: example $ex FAILED (exit $rc)"; exit 1
    fi
    echo "$o" | grep ': OK' | head -n 3
  done
  echo "python-torch: $launcher done in $((SECONDS - t0)) s"
done
echo "python-torch: all passed"
