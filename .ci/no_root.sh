#!/usr/bin/env bash
# The set-up without root and without apt, as on a cluster: a virtual
# environment, mpi4py compiled against the MPI found on PATH (a `module load
# openmpi`, conda's, or here the system's), this package with TensorBoard and
# scikit-learn, then the Fashion-MNIST example at a small size on 2 workers.
#
#   bash .ci/no_root.sh [VENV]        # default VENV: a new folder under /tmp
#
# Needs: python3 (3.9+) with venv, mpicc and mpirun on PATH, a C compiler,
# the Fashion-MNIST files (FASHION_MNIST_DIR, default Debian's folder).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-$(mktemp -d /tmp/hvd_dcasgd-no-root.XXXXXX)/venv}"
DATA="${FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}"
command -v mpicc >/dev/null || { echo "no_root.sh: no mpicc on PATH (module load openmpi?)" >&2; exit 1; }
echo "no_root.sh: MPI $(command -v mpicc); venv $VENV"

python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check torch==2.13.0     # the same pin as .ci/setup.sh
"$VENV/bin/pip" install -q --disable-pip-version-check --no-binary=mpi4py --no-cache-dir "mpi4py>=4"
"$VENV/bin/pip" install -q --disable-pip-version-check ".[metrics,examples]"
"$VENV/bin/python" -c "from mpi4py import MPI; print('no_root.sh: mpi4py built for', MPI.Get_library_version().strip(chr(0)).splitlines()[0])"

root=()
if [ "$(id -u)" -eq 0 ]; then root=(--allow-run-as-root); fi
cd "$(mktemp -d)"   # not the checkout: the installed package is what runs
mpirun "${root[@]}" --oversubscribe -np 3 "$VENV/bin/python" "$OLDPWD/examples/pytorch_fashion_mnist.py" \
    --data "$DATA" --epochs 1 --train-size 2000 --test-size 500
