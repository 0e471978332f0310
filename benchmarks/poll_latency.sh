#!/usr/bin/env bash
# The latency poll_until (include/shardgan/util/poll.h) adds to a blocking collective on an
# idle rank: 2 ranks, rank 1 arrives 2 ms (+ 0-199 us) after rank 0 started waiting, and
# the figure is how much later than rank 1's arrival rank 0 returns (same node, one
# steady_clock). Runs tests/test_poll.cpp's latency cases: the default schedule through
# MpiCommunicator::barrier and a one-float all_reduce, a never-sleeping floor, the former
# 1 ms cap, and the sweep of sleep caps (at a 1 us timer slack and at Linux's default 50 us)
# behind the default. Prints the JSON lines (one per figure, with the CPU model) and appends
# them to OUT with the lscpu model line.
#   benchmarks/poll_latency.sh [build dir] [out.jsonl]
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}; OUT=${2:-benchmarks/results/poll_latency.jsonl}
[ "$(id -u)" -eq 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$(dirname "$OUT")"
echo "# $(lscpu | grep -m1 'Model name' | sed 's/  */ /g'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
mpirun -np 2 --oversubscribe "$BUILD/tests/test_poll" --gtest_also_run_disabled_tests \
  --gtest_filter='PollLatency.*' | grep '^{"bench": "poll_latency"' | tee -a "$OUT"
