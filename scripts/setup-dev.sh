#!/usr/bin/env bash
# Installs what only the tests and benchmarks need, on top of scripts/setup.sh (idempotent;
# scripts/test.sh runs both). A user's machine that only trains needs none of it:
#  - GoogleTest and Google Benchmark (the test and benchmark executables);
#  - slurmctld, slurmd, slurm-client and munge: tests/slurm_test.sh starts a throw-away
#    one-node cluster with them (scripts/slurm-local.sh). On a real cluster node these
#    daemons belong to the site; do not run this script there;
#  - iproute2 (tests/multihost_test.sh: network namespaces as hosts);
#  - h5py, numpy and PyYAML in .venv: the interop tests (h5py reads our checkpoints), the
#    fuzzers and the PyTorch peer benchmarks; scikit-image: the reference of the PSNR and
#    SSIM that image-to-image evaluation reports (tests/image_quality_check.py); torchvision
#    and xxhash: scripts/export_inception.py builds the FID Inception-v3 from torchvision's
#    layers (random weights in the tests) and writes its weights' hash. torchvision 0.29.2 is
#    the newest on PyPI and asks for torch >= 2.14; the check below imports it with the
#    project's torch 2.15.0 (pip must not replace that torch).
# --no-system-packages (or SHARDGAN_NO_SYSTEM_PACKAGES=1): no apt-get (docs/install.md); the
# Python packages go into SHARDGAN_PYTHON's environment when it is set, else into .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/apt-install.sh
no_system_packages_flag "$@"
PY_PKGS=("h5py==3.16.0" "numpy==2.4.6" "pyyaml==6.0.4" "scikit-image==0.26.0" "torchvision==0.29.2" "xxhash==4.1.0")
PY_CHECK='import h5py, numpy, yaml, skimage, xxhash, torch, torchvision
from torchvision.models.inception import Inception3
Inception3(num_classes=1008, aux_logits=False, init_weights=False)
assert torch.__version__.startswith("2.15.0"), torch.__version__' 
PKGS=(
  googletest libgtest-dev
  slurmctld slurmd slurm-client munge
  iproute2
)
apt_install setup-dev "${PKGS[@]}"

PY=${SHARDGAN_PYTHON:-.venv/bin/python}
[ -x "$PY" ] || { echo "[setup-dev] error: $PY missing; run scripts/setup.sh first" >&2; exit 1; }
VENV=$("$PY" -c "import sys; print(sys.prefix)")
want="${PY_PKGS[*]}"
if [ "$(cat "$VENV/.shardgan-dev-pins" 2>/dev/null)" = "$want" ] &&
   "$PY" -c "$PY_CHECK" >/dev/null 2>&1; then
  echo "[setup-dev] $VENV has ${want}"
else
  echo "[setup-dev] installing ${want} into $VENV"
  if ! "$PY" -m pip install -q "${PY_PKGS[@]}"; then
    echo "[setup-dev] error: pip could not install ${want} into $VENV (see pip's message above)" >&2
    exit 1
  fi
  if ! "$PY" -W ignore -c "$PY_CHECK"; then
    echo "[setup-dev] error: after installing ${want}, $VENV's Python cannot import them with torch 2.15.0" >&2
    exit 1
  fi
  echo "$want" > "$VENV/.shardgan-dev-pins" || echo "[setup-dev] note: cannot write $VENV/.shardgan-dev-pins"
fi
