#!/usr/bin/env bash
# Configures and builds shardgan in Release into build/ (ccache is used when present).
# Arguments, if any, are the targets to build (default: everything, tests included).
set -euo pipefail
cd "$(dirname "$0")/.."
# SHARDGAN_PYTHON (a Python with torch, instead of .venv's) and SHARDGAN_CMAKE_ARGS (more -D
# options, such as the header-only stb and xxHash folders of docs/install.md) reach CMake.
args=(-DCMAKE_BUILD_TYPE=Release)
[ -z "${SHARDGAN_PYTHON:-}" ] || args+=("-DSHARDGAN_PYTHON=$SHARDGAN_PYTHON")
read -r -a extra <<< "${SHARDGAN_CMAKE_ARGS:-}"
args+=("${extra[@]}")
cmake -S . -B build "${args[@]}" > build.cmake.log 2>&1 || { cat build.cmake.log; exit 1; }
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build build -j "$(nproc)" "${targets[@]}"
