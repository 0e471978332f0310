#!/usr/bin/env bash
# scripts/sanitize.sh [asan|tsan] [CTEST_REGEX]
#   asan (the default; `scripts/sanitize.sh REGEX` still means asan): builds shardgan with
#        AddressSanitizer and UndefinedBehaviorSanitizer into build-asan/.
#   tsan: builds it with ThreadSanitizer into build-tsan/ and runs with OMP_NUM_THREADS=1
#        (LibTorch's OpenMP runtime is not instrumented, so its barriers are invisible to
#        TSan) and scripts/tsan.supp (reports from inside LibTorch, libgomp and Open MPI).
# Then runs the whole ctest suite there, or the tests matching CTEST_REGEX.
# SANITIZE_TARGETS="shardgan-train test_offload" builds only those targets (and what they
# link), for a run of a few tests: the instrumented build of everything is the slow part.
# Not part of CI: on 2 cores the instrumented build takes ~25 minutes and the suite runs
# 2-3x slower than in Release. CTEST_PARALLEL_LEVEL=2 (ctest's own variable) runs two tests
# at once. A build after a source file was added or removed recompiles every file: the
# precompiled header is rebuilt, and ccache then misses. Suppressions (scripts/sanitize.supp, scripts/tsan.supp) cover
# only reports from inside LibTorch and Open MPI, which are not built with the sanitizers;
# each says why.
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=asan
case "${1:-}" in
  asan|tsan) MODE=$1; shift ;;
esac
if [ "$MODE" = tsan ]; then
  SAN="-fsanitize=thread -fno-omit-frame-pointer"
  LINK="-fsanitize=thread"
else
  SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
  LINK="-fsanitize=address,undefined"
fi
B=build-$MODE
cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHARDGAN_BUILD_BENCHMARKS=OFF -DSHARDGAN_TEST_TIMEOUT_SCALE=4 -DSHARDGAN_WITH_TCMALLOC=OFF -DCMAKE_CXX_FLAGS="$SAN" \
  -DCMAKE_C_FLAGS="$SAN" -DCMAKE_EXE_LINKER_FLAGS="$LINK" > "$B.cmake.log" 2>&1 \
  || { cat "$B.cmake.log"; exit 1; }
targets=()
for t in ${SANITIZE_TARGETS:-}; do
  # A gtest file's name (test_offload) stands for shardgan_tests, the executable it is in.
  if grep -qs "shardgan_test($t)" tests/CMakeLists.txt tests/*_tests.cmake; then t=shardgan_tests; fi
  targets+=(--target "$t")
done
cmake --build "$B" -j "$(nproc)" "${targets[@]}"
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
SUPP="$(pwd)/scripts/sanitize.supp"
# detect_leaks=0: Open MPI and LibTorch keep process-lifetime allocations (MPI_Init's
# internal state, torch's operator registry) that LeakSanitizer reports at exit; they are
# not ours and not growing. ASan's other checks (overflows, use after free) stay on.
# allocator_may_return_null=1: HDF5 1.10 mallocs sizes it reads from a file and handles a
# NULL result as a corrupt file; the checkpoint fuzzer feeds it such sizes (an object
# header continuation of terabytes), which ASan would abort on by default instead of
# returning NULL as glibc does. The config fuzzer adds its own hard_rss_limit_mb (it cannot
# use ulimit -v under ASan, see tests/config_fuzz_test.py); a global limit would kill the
# collective tests above INT_MAX elements, which need about 8 GiB per rank by design.
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:halt_on_error=1:protect_shadow_gap=0:allocator_may_return_null=1"
export SHARDGAN_SANITIZE=1
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$SUPP"
if [ "$MODE" = tsan ]; then
  # halt_on_error: a race fails its test. second_deadlock_stack: both stacks of a lock-order report.
  # history_size=7: the longest access history, so that the stack of a race's earlier access can be
  # restored (a suppression can only match a stack TSan restored).
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:history_size=7:suppressions=$(pwd)/scripts/tsan.supp"
  export OMP_NUM_THREADS=1
  # Open MPI's memory patcher hooks madvise, which glibc calls while a thread exits, into
  # libfabric's memory monitor (btl ofi) after TSan has retired the thread: TSan then crashes
  # (SIGSEGV in MetaMap::GetSync). Without the patcher, Open MPI's registration cache is off,
  # which matters for RDMA only.
  export OMPI_MCA_memory=^patcher
fi
cd "$B"
# Every TIMEOUT is scaled by 4 (SHARDGAN_TEST_TIMEOUT_SCALE in tests/CMakeLists.txt).
ctest --output-on-failure ${1:+-R "$1"}
