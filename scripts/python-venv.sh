#!/usr/bin/env bash
# Creates (once) the virtual environment the Python package is built and
# tested in, and installs its PyPI packages into it: scikit-build-core,
# numpy, mpi4py (compiled here against the system Open MPI, never a binary
# wheel), pytest, ml_dtypes (bfloat16) and torch (for xmesh.torch and its
# tests: about 4 GB with its CUDA libraries, downloaded once into pip's
# cache). A venv, because Debian's python3
# refuses system-wide pip installs (PEP 668). Reruns are instant: a stamp
# records what was installed, and pip only runs when that changes.
#
#   scripts/python-venv.sh [VENV]     default build-py/venv
#   XMESH_PY_PYTHON=/path/to/python3  the interpreter (default: Debian's /usr/bin/python3)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-build-py/venv}
py=${XMESH_PY_PYTHON:-}
if [ -z "$py" ]; then
  if [ -x /usr/bin/python3 ]; then py=/usr/bin/python3; else py=$(command -v python3); fi
fi
pkgs=(scikit-build-core numpy pytest ml_dtypes torch)  # and mpi4py, below
# The stamp: interpreter, its version, the package list, mpicc's MPI.
want="$("$py" -c 'import sys; print(sys.executable, sys.version.split()[0])') ${pkgs[*]} mpi4py/$(mpicc --showme:version 2>&1 | head -n1)"
stamp=$venv/.xmesh-deps
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "python-venv: $venv up to date"
  exit 0
fi
if [ ! -x "$venv/bin/python" ]; then
  echo "python-venv: creating $venv with $py"
  "$py" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
# Debian 12's venv pip (23.0) predates some config-settings handling the
# build uses; take a current one from PyPI first.
"${pip[@]}" install --upgrade pip
"${pip[@]}" install "${pkgs[@]}"
# mpi4py from source against the MPI on PATH (mpicc): a binary wheel could
# bring another MPI than the one libxmesh links. The build takes a few
# minutes once; pip caches the wheel.
"${pip[@]}" install --no-binary mpi4py mpi4py
"$venv/bin/python" - <<'PY'
from mpi4py import MPI  # noqa: F401 (proves the build loads)
import mpi4py, numpy, ml_dtypes, torch
print("python-venv: mpi4py", mpi4py.__version__, "numpy", numpy.__version__, "ml_dtypes", ml_dtypes.__version__,
      "torch", torch.__version__)
PY
echo "$want" > "$stamp"
