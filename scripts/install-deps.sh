#!/usr/bin/env bash
# Installs what xmesh needs from Debian's archive, skipping what is already
# there. Run as root (or with sudo available). CUDA/NCCL are optional and not
# installed here: the NCCL backend is built when /usr/local/cuda has them.
# Then the Python package's virtual environment (scripts/python-venv.sh:
# scikit-build-core, numpy, mpi4py built against this Open MPI, pytest,
# ml_dtypes from PyPI); XMESH_NO_PYTHON=1 skips it.
set -euo pipefail
pkgs=(build-essential cmake pkg-config python3 python3-dev python3-venv python3-pip
      libopenmpi-dev openmpi-bin libucx-dev libhwloc-dev hwloc libcmocka-dev
      clang libclang-rt-14-dev clang-format valgrind
      gnuplot-nox iproute2 util-linux git procps
      libopenblas-dev libscalapack-openmpi-dev zlib1g-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#pkgs[@]} packages present"
else
  echo "install-deps: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if [ -z "${XMESH_NO_PYTHON:-}" ]; then
  "$(dirname "$0")"/python-venv.sh
fi
