#!/bin/bash
# Fuzzes one reader of user input with libFuzzer. The targets and their input
# formats: tests/fuzz/*_fuzz.cpp; their replay in ctest: tests/fuzz_tests.cmake.
#
#   scripts/fuzz.sh TARGET SECONDS [LIBFUZZER_ARGS...]
#   scripts/fuzz.sh --build-only [TARGET...]
#
# TARGET: config, ckpt_index, ckpt_rankfile, hdf5_dataset, paired_folder, classifier.
# Builds TARGET_fuzz with clang++ (-fsanitize=fuzzer,address,undefined) in build-fuzz/ (a
# configure of this project with SHARDGAN_FUZZ=ON, tests and benchmarks off, ccache; the
# reader's sources are instrumented, the rest comes from build/libshardgan.a, so build the
# normal tree first), then runs it single-process for SECONDS on a working copy of
# tests/fuzz/corpus/<target> (build-fuzz/corpus/TARGET: the seeds plus what libFuzzer adds;
# the checked-in corpus is not touched) with -timeout=10 -rss_limit_mb=4096. Crashes,
# hangs and sanitizer reports are written to build-fuzz/findings/TARGET/ (crash-*,
# timeout-*, oom-*); add each to tests/fuzz/corpus/<target>/ once it is fixed. Prints
# libFuzzer's final stats: stat::number_of_executed_units (executions), the run's seconds
# and executions per second. Exit status: libFuzzer's (0: nothing found).
# Builds take /tmp/shardgan-build.lock (shared with the other builds of this checkout);
# SHARDGAN_FUZZ_NO_BUILD=1 runs the targets as last built.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${SHARDGAN_FUZZ_BUILD:-$ROOT/build-fuzz}
TARGETS=(config ckpt_index ckpt_rankfile hdf5_dataset paired_folder classifier)
JOBS=${JOBS:-2}

build() {
  if [ -n "${SHARDGAN_FUZZ_NO_BUILD:-}" ]; then return 0; fi  # the targets as they are
  if [ ! -f "$B/CMakeCache.txt" ]; then
    mkdir -p "$B"
    flock /tmp/shardgan-build.lock cmake -S "$ROOT" -B "$B" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DSHARDGAN_FUZZ=ON -DBUILD_TESTING=OFF \
      -DSHARDGAN_BUILD_BENCHMARKS=OFF -DSHARDGAN_WITH_TCMALLOC=OFF >"$B/configure.log" 2>&1 ||
      { tail -30 "$B/configure.log"; exit 1; }
  fi
  local t=()
  for x in "$@"; do t+=(--target "${x}_fuzz"); done
  flock /tmp/shardgan-build.lock cmake --build "$B" -j"$JOBS" "${t[@]}"
}

if [ "${1:-}" = --build-only ]; then
  shift
  [ $# -gt 0 ] || set -- "${TARGETS[@]}"
  build "$@"
  exit 0
fi
[ $# -ge 2 ] || { echo "usage: $0 TARGET SECONDS [LIBFUZZER_ARGS...] | --build-only [TARGET...]" >&2; exit 2; }
T=$1 SECS=$2; shift 2
[[ " ${TARGETS[*]} " == *" $T "* ]] || { echo "unknown target '$T' (${TARGETS[*]})" >&2; exit 2; }
build "$T" | tail -3
CORPUS=$B/corpus/$T FINDINGS=$B/findings/$T
mkdir -p "$CORPUS" "$FINDINGS"
cp -n "$ROOT/tests/fuzz/corpus/$T"/* "$CORPUS"/ 2>/dev/null || true
# One child at a time (-fork=1: a single fuzzing process, as -jobs=1 -workers=1, run under
# a parent that restarts it): Debian's HDF5 and stb_image are not hardened against crafted
# files and crash, abort or ask for terabytes within seconds, which would end a plain run at
# its first finding. In fork mode the run goes on; every artifact is then replayed and
# classified by the frame it fails in (triage below): only findings in shardgan's own frames
# (src/, tests/fuzz/) or in memory shardgan allocated count against the reader.
# allocator_may_return_null: a huge malloc returns NULL as glibc's does (HDF5 then fails
# with an error) instead of ending the run; -malloc_limit_mb likewise.
LOG=$B/fuzz-$T.log
START=$(date +%s)
set +e
# The sanitizers' reports go to FINDINGS/asan.PID and ubsan.PID as well: in fork mode the
# parent's log keeps only their first line.
# SHARDGAN_HDF5_PROBE_DEADLINE_S: the readers' forked HDF5 probe (include/shardgan/h5/probe.h)
# ends a child that spins after 5 s, inside libFuzzer's 10 s -timeout.
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1:symbolize=1:allocator_may_return_null=1:log_path=$FINDINGS/asan} \
UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1:log_path=$FINDINGS/ubsan} \
SHARDGAN_HDF5_PROBE_DEADLINE_S=${SHARDGAN_HDF5_PROBE_DEADLINE_S:-5} \
OMP_NUM_THREADS=1 "$B/${T}_fuzz" "$CORPUS" -fork=1 -ignore_crashes=1 -ignore_ooms=1 -ignore_timeouts=1 \
  -max_total_time="$SECS" -timeout=10 -rss_limit_mb=4096 -malloc_limit_mb=1048576 -max_len=262144 \
  -print_final_stats=1 -artifact_prefix="$FINDINGS/" "$@" >"$LOG" 2>&1
RC=$?
set -e
WALL=$(( $(date +%s) - START ))
# The parent's last status line: "#EXECS: cov: ... exec/s: ... oom/timeout/crash: O/T/C time: S ..."
LAST=$(grep -E '^#[0-9]+: cov:' "$LOG" | tail -1)
EXECS=$(echo "$LAST" | sed -E 's/^#([0-9]+):.*/\1/')
echo "$LAST"
echo "target $T: ${WALL} s wall, ${EXECS:-?} executions, $(( ${EXECS:-0} / (WALL > 0 ? WALL : 1) )) exec/s," \
     "corpus $(ls "$CORPUS" | wc -l) files, libFuzzer exit status $RC (log: $LOG)"
"$ROOT/tests/fuzz/triage.sh" "$B/${T}_fuzz" "$FINDINGS"
