#!/usr/bin/env bash
# Installs the Debian packages shardgan needs (idempotent). apt-get update runs once,
# and only when something is missing.
set -euo pipefail
PKGS=(
  build-essential cmake ccache pkg-config
  libtorch-dev
  libopenmpi-dev openmpi-bin
  libhdf5-dev hdf5-tools
  libspdlog-dev libfmt-dev
  libyaml-cpp-dev libcli11-dev nlohmann-json3-dev
  libstb-dev libxxhash-dev zlib1g-dev
  liburing-dev
  googletest libgtest-dev libbenchmark-dev
  dataset-fashion-mnist
  python3-h5py python3-numpy python3-torch python3-yaml gnuplot-nox
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[setup] installing: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "[setup] all packages present"
fi
