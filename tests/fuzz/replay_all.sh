#!/bin/bash
# ctest fuzz_regression (tests/fuzz_tests.cmake): replays corpora with the gcc-built
# drivers (tests/fuzz/driver_main.cpp).
#   replay_all.sh DRIVER CORPUS_DIR [DRIVER CORPUS_DIR ...]
# Each corpus folder's files whose names start with "seed-" are the seeds: the reader must
# accept every one of them (--min-accepted), the others (findings, mutated files) must only
# not crash. Exits non-zero at the first driver that fails or crashes.
set -u
[ $# -ge 2 ] && [ $(($# % 2)) -eq 0 ] || { echo "usage: $0 DRIVER CORPUS_DIR [DRIVER CORPUS_DIR ...]" >&2; exit 2; }
total=0
while [ $# -gt 0 ]; do
  driver=$1 corpus=$2; shift 2
  seeds=$(find "$corpus" -maxdepth 1 -type f -name 'seed-*' | wc -l)
  echo "== $(basename "$driver"): $corpus ($(find "$corpus" -maxdepth 1 -type f | wc -l) inputs, $seeds seeds)"
  out=$("$driver" --min-accepted "$seeds" "$corpus" 2>&1)
  rc=$?
  echo "$out" | tail -n 3
  if [ $rc -ne 0 ]; then
    echo "$out" | tail -n 30
    echo "FAIL: $(basename "$driver") exited with status $rc on $corpus"
    exit 1
  fi
  total=$((total + $(find "$corpus" -maxdepth 1 -type f | wc -l)))
done
echo "PASS: $total corpus entries replayed without a crash"
