#!/usr/bin/env bash
# Configures and builds shardgan in Release into build/ (ccache is used when present).
# Arguments, if any, are the targets to build (default: everything, tests included).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release > build.cmake.log 2>&1 || { cat build.cmake.log; exit 1; }
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build build -j "$(nproc)" "${targets[@]}"
