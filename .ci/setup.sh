#!/usr/bin/env bash
# Sets up everything hvd_dcasgd needs on a fresh Debian machine, idempotently:
# Open MPI, Fashion-MNIST (the evidence's main task), an SSH server (for
# the emulated hosts of tests/cluster/hosts.sh) and strace (the tests' slow
# disk) from Debian's packages, a
# virtual environment in .venv with the CPU build of torch 2.13.0, mpi4py,
# this project (with its test extras) and Horovod 0.28.1 built for PyTorch +
# MPI.  HVD_DCASGD_WITHOUT_HOROVOD=1 skips
# Horovod (everything Horovod-specific is then skipped with a message).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! dpkg -s openmpi-bin libopenmpi-dev dataset-fashion-mnist openssh-server strace >/dev/null 2>&1; then
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq openmpi-bin libopenmpi-dev dataset-fashion-mnist openssh-server strace >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
# torch is pinned: this version's CPU build installs without a multi-GB download.
.venv/bin/pip install -q --disable-pip-version-check torch==2.13.0
.venv/bin/pip install -q --disable-pip-version-check -e '.[test]'

# Horovod 0.28.1, its last release, asks for C++14 where torch >= 2.1 needs
# C++17: compile it through a g++ that upgrades the standard.  About 6 minutes
# on 2 cores, once; later runs find it installed.
if [ "${HVD_DCASGD_WITHOUT_HOROVOD:-0}" != 1 ] && ! .venv/bin/python -c "import horovod.torch" 2>/dev/null; then
    .venv/bin/pip install -q --disable-pip-version-check packaging psutil pyyaml cloudpickle cffi wheel
    echo "hvd_dcasgd set-up: building Horovod 0.28.1 for PyTorch + MPI (about 6 minutes)"
    CXX="$PWD/.ci/cxx17/g++" HOROVOD_WITH_MPI=1 HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 \
        HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITHOUT_GLOO=1 HOROVOD_CPU_OPERATIONS=MPI MAKEFLAGS="-j$(nproc)" \
        .venv/bin/pip install -q --disable-pip-version-check --no-build-isolation --no-cache-dir horovod==0.28.1
fi
.venv/bin/python -c "from mpi4py import MPI; print('hvd_dcasgd set up:', MPI.Get_library_version().strip(chr(0)).splitlines()[0])"
