#!/usr/bin/env bash
# Builds NCCL from NVIDIA's public source for one GPU architecture, small enough to travel
# to a GPU machine that has no network (the project's device machines take 64 MiB of files;
# the torch wheel's libnccl.so.2 is 252 MB with kernels for every GPU generation).
#
# Why: NCCL 2.30 added several ranks per GPU (NCCL_MULTI_RANK_GPU_ENABLE=1); the GPU
# machines carry torch 2.11 with NCCL 2.28.9, which refuses a second rank on one GPU.
#
# Usage: scripts/build-nccl.sh [OUT]       (default OUT: build-nccl/, git-ignored)
#   NCCL_SRC   a git repository of NVIDIA/nccl, or an unpacked source tree of release NCCL_TAG
#              (default: clone https://github.com/NVIDIA/nccl)
#   NCCL_TAG   the release tag (default v2.30.7-1, the torch 2.15 wheel's NCCL)
#   NCCL_ARCH  the compute capability (default 90: H100 and H200)
#   CUDA_HOME  the toolkit (default /usr/local/cuda)
#   NCCL_JOBS  parallel compile jobs (default: all cores)
#   NCCL_XZ    0: no OUT/libnccl.so.2.xz
#   NCCL_LOG   make's output (default: a temporary file, shown on failure)
# Writes OUT/lib/libnccl.so.2 (stripped), OUT/include/nccl.h, OUT/libnccl.so.2.xz and
# OUT/build-info.txt (tag, commit, architecture, sizes, build time).
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-build-nccl}")
tag=${NCCL_TAG:-v2.30.7-1}
arch=${NCCL_ARCH:-90}
cuda=${CUDA_HOME:-/usr/local/cuda}
[ -x "$cuda/bin/nvcc" ] || { echo "build-nccl: no nvcc under $cuda (set CUDA_HOME)" >&2; exit 1; }
src=${NCCL_SRC:-}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
if [ -z "$src" ]; then
  git clone -q --depth 1 --branch "$tag" https://github.com/NVIDIA/nccl "$work/repo.git" ||
    { echo "build-nccl: cannot clone NVIDIA/nccl at $tag (set NCCL_SRC to a local copy)" >&2; exit 1; }
  src="$work/repo.git"
fi
mkdir -p "$work/nccl"
if gitdir=$(git -C "$src" rev-parse --absolute-git-dir 2>/dev/null); then  # a work tree or a bare mirror
  commit=$(git --git-dir="$gitdir" rev-parse "$tag^{commit}")
  git --git-dir="$gitdir" archive "$tag" | tar -C "$work/nccl" -xf -
elif [ -f "$src/Makefile" ] && [ -d "$src/src" ]; then  # an unpacked release (a machine without git or network)
  commit="unknown (source tree $src, taken as $tag)"
  cp -r "$src"/. "$work/nccl/"
else
  echo "build-nccl: $src is neither a git repository of NVIDIA/nccl nor an unpacked source tree" >&2; exit 1
fi
echo "[build-nccl] NCCL $tag ($commit) for sm_$arch with $("$cuda/bin/nvcc" --version | grep -o 'release [0-9.]*')"
# The CUDA toolkit ships its own (older) nccl.h and nccl_device/ headers; with the toolkit's
# include folder ahead of NCCL's, they shadow the ones being built (same include guards,
# other macros). Give make the toolkit's headers without NCCL's.
mkdir -p "$work/cuda-include"
for f in "$cuda"/include/*; do
  case $(basename "$f") in nccl*) ;; *) ln -s "$f" "$work/cuda-include/" ;; esac
done
start=$(date +%s)
make -C "$work/nccl" -j "${NCCL_JOBS:-$(nproc)}" src.build CUDA_HOME="$cuda" CUDA_INC="$work/cuda-include" BUILDDIR="$work/out" \
  NVCC_GENCODE="-gencode=arch=compute_${arch},code=sm_${arch}" > "${NCCL_LOG:-$work/make.log}" 2>&1 ||
  { tail -30 "${NCCL_LOG:-$work/make.log}" >&2; echo "build-nccl: make failed" >&2; exit 1; }
took=$(( $(date +%s) - start ))
mkdir -p "$out/lib" "$out/include"
lib=$(ls "$work"/out/lib/libnccl.so.2.* | head -1)
cp -L "$lib" "$out/lib/libnccl.so.2"
command -v strip > /dev/null && strip --strip-unneeded "$out/lib/libnccl.so.2"
cp "$work"/out/include/nccl*.h "$out/include/"
# NCCL_XZ=0 skips the compressed copy (building on the GPU machine itself, nothing travels).
xzs=0
if [ "${NCCL_XZ:-1}" = 1 ]; then
  xz -T0 -6 -k -c "$out/lib/libnccl.so.2" > "$out/libnccl.so.2.xz"
  xzs=$(stat -c %s "$out/libnccl.so.2.xz")
fi
so=$(stat -c %s "$out/lib/libnccl.so.2")
{
  echo "tag: $tag"
  echo "commit: $commit"
  echo "arch: sm_$arch"
  echo "nvcc: $("$cuda/bin/nvcc" --version | grep -o 'release [0-9.,]* V[0-9.]*')"
  echo "libnccl.so.2 bytes (stripped): $so"
  echo "libnccl.so.2.xz bytes: $xzs"
  echo "fits 64 MiB: $([ "$xzs" -le $((64 << 20)) ] && echo yes || echo no)"
  echo "build seconds ($(nproc) cores): $took"
} | tee "$out/build-info.txt"
