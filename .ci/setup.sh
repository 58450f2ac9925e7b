#!/usr/bin/env bash
# Sets up everything hvd_dcasgd needs on a fresh Debian machine, idempotently:
# Open MPI from Debian's packages, a virtual environment in .venv with the CPU
# build of torch 2.13.0, mpi4py, and this project (with its test extras).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! dpkg -s openmpi-bin libopenmpi-dev >/dev/null 2>&1; then
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq openmpi-bin libopenmpi-dev >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
# torch is pinned: this version's CPU build installs without a multi-GB download.
.venv/bin/pip install -q --disable-pip-version-check torch==2.13.0
.venv/bin/pip install -q --disable-pip-version-check -e '.[test]'
.venv/bin/python -c "from mpi4py import MPI; print('hvd_dcasgd set up:', MPI.Get_library_version().strip(chr(0)).splitlines()[0])"
