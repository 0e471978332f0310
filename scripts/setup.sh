#!/usr/bin/env bash
# Installs what building and running shardgan needs, and nothing else (idempotent):
#  1. Debian packages; apt-get update runs once, and only when one is missing.
#  2. A virtual environment in .venv (git-ignored) with one pinned PyTorch wheel: shardgan
#     builds on the LibTorch inside it (CMake finds it through torch.utils.cmake_prefix_path).
#     Nothing Python runs at training time.
# What only the tests and benchmarks need (GoogleTest, Slurm and munge for the local-cluster
# test, h5py, numpy and PyYAML in .venv) is scripts/setup-dev.sh's, which scripts/test.sh runs.
# Without root: `scripts/setup.sh --no-system-packages` (or SHARDGAN_NO_SYSTEM_PACKAGES=1, which
# scripts/test.sh and scripts/demo.sh pass on) calls no apt-get and checks the build tools on
# PATH; CMake then finds each library where it is installed. SHARDGAN_PYTHON=a Python that
# already has torch 2.15 is used instead of making .venv. docs/install.md has the details.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/apt-install.sh
no_system_packages_flag "$@"
TORCH_VERSION=2.15.0   # the newest stable 2.x on the registry (2026-11-25); CUDA 13.2 build
# fontTools and Pillow: scripts/emoji-data.sh (real colour images from the emoji font below).
PY_PKGS=("torch==${TORCH_VERSION}" "fonttools==4.68.0" "pillow==13.0.0")
PKGS=(
  build-essential cmake ccache pkg-config
  libopenmpi-dev openmpi-bin
  libhdf5-dev hdf5-tools
  libspdlog-dev libfmt-dev
  libyaml-cpp-dev libcli11-dev nlohmann-json3-dev
  libstb-dev libxxhash-dev zlib1g-dev
  liburing-dev
  libgoogle-perftools-dev                 # tcmalloc: shardgan-train's allocator (memory reuse, docs/design.md)
  dataset-fashion-mnist
  gnuplot-nox                             # train.plots: the run's plots/*.png
  fonts-noto-color-emoji                  # colour training images (scripts/emoji-data.sh)
)
# A Python with venv and pip: the one on PATH, else Debian's.
if [ -z "${SHARDGAN_PYTHON:-}" ] && ! python3 -c "import venv, ensurepip" >/dev/null 2>&1; then
  PKGS+=(python3 python3-venv)
fi
apt_install setup "${PKGS[@]}"
if [ "${SHARDGAN_NO_SYSTEM_PACKAGES:-0}" = 1 ]; then
  need_commands setup cmake c++ mpicc mpirun pkg-config
  if [ -z "${SHARDGAN_PYTHON:-}" ] && ! python3 -c "import venv, ensurepip" >/dev/null 2>&1; then
    echo "[setup] error: python3 on PATH cannot make a venv (no venv/ensurepip), and SHARDGAN_PYTHON is not set." \
         "Use a Python that can (conda, pyenv, uv), or set SHARDGAN_PYTHON to one that has torch ${TORCH_VERSION}" >&2
    exit 1
  fi
fi

if [ -n "${SHARDGAN_PYTHON:-}" ]; then
  # A torch the user already has: no .venv. CMake builds on its LibTorch (scripts/build.sh
  # passes -DSHARDGAN_PYTHON).
  if ! v=$("$SHARDGAN_PYTHON" -c "import torch; print(torch.__version__)" 2>/dev/null); then
    echo "[setup] error: SHARDGAN_PYTHON=$SHARDGAN_PYTHON cannot import torch; install torch==${TORCH_VERSION} into it" >&2
    exit 1
  fi
  case "$v" in
    "${TORCH_VERSION}"*) echo "[setup] using torch $v from SHARDGAN_PYTHON=$SHARDGAN_PYTHON" ;;
    *) echo "[setup] warning: SHARDGAN_PYTHON has torch $v; shardgan is tested with ${TORCH_VERSION}" >&2 ;;
  esac
  exit 0
fi

VENV=.venv
want="${PY_PKGS[*]}"
if [ -x "$VENV/bin/python" ] && [ "$(cat "$VENV/.shardgan-pins" 2>/dev/null)" = "$want" ] &&
   "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
  echo "[setup] $VENV has torch ${TORCH_VERSION}"
else
  echo "[setup] creating $VENV with ${want} (about 5.4 GB: the CUDA build of torch and its NVIDIA libraries)"
  start=$(date +%s)
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  if ! "$VENV/bin/python" -m pip install -q "${PY_PKGS[@]}"; then
    echo "[setup] error: pip could not install ${want} into $VENV (see pip's message above)." >&2
    echo "[setup] shardgan builds on that torch wheel's LibTorch; check the network and the disk (df -h .)." >&2
    exit 1
  fi
  echo "$want" > "$VENV/.shardgan-pins"
  echo "[setup] $VENV ready in $(( $(date +%s) - start )) s"
fi
