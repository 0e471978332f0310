#!/usr/bin/env bash
# Runs on a GPU machine without network or our packages (docs/dev/gpu-bundle.md), from the
# checkout's root, with the bundle of scripts/gpu-bundle.sh beside it:
#   1. unpacks the bundle (env.sh);
#   2. builds NCCL from the bundle's nccl-src.tar.xz (scripts/build-nccl.sh, sm_90) in the
#      background, at low priority (so step times of this run are not figures to report);
#   3. scripts/gpu-check.sh on 1 rank with the machine's own NCCL (BIG_PAIRS=0 by default);
#   4. with the NCCL built preloaded (LD_PRELOAD) and NCCL_MULTI_RANK_GPU_ENABLE=1, its
#      multi-rank part (RANKS, default 2), then tests/test_gpu_ranks on RANKS_MORE (4) ranks;
#   5. packs the results without checkpoints into $OUT/gpu-results.tgz, with the summaries
#      beside it (a device machine returns at most 8 files).
# Usage: bash scripts/gpu-bundle-run.sh [BUNDLE]     (default .gpubundle)
# ONE=0 skips step 3; ONE_TIMEOUT, RANKS_TIMEOUT bound steps 3 and 4, NCCL_WAIT the wait for the
# NCCL build after step 3 (seconds).
set -uo pipefail
cd "$(dirname "$0")/.."
bundle=$(realpath "${1:-.gpubundle}")
out=${OUT:-/tmp/gpu-out}
res=/tmp/gpu-results
rm -rf "$res"; mkdir -p "$res" "$out"
exec > >(tee "$res/run.log") 2>&1
echo "[run] $(date -u +%FT%TZ) $(nproc) cores; $(nvidia-smi -L 2>&1 | head -1)"
# shellcheck disable=SC1091
source "$bundle/env.sh"
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
nccl=/tmp/nccl-out
if [ -f "$bundle/nccl-src.tar.xz" ]; then
  ( mkdir -p /tmp/nccl-src && tar -C /tmp/nccl-src -xJf "$bundle/nccl-src.tar.xz" &&
    NCCL_SRC=/tmp/nccl-src NCCL_JOBS=${NCCL_JOBS:-12} NCCL_XZ=0 NCCL_LOG="$res/nccl-make.log" \
      nice -n "${NCCL_NICE:-19}" bash scripts/build-nccl.sh "$nccl" ) \
    > "$res/nccl-build.log" 2>&1 &
  nccl_pid=$!
else
  nccl_pid=""
  echo "[run] no nccl-src.tar.xz in the bundle: the multi-rank part needs NCCL 2.30 and will be skipped"
fi
if [ "${ONE:-1}" = 1 ]; then
  OUT=$res/one BIG_PAIRS=${BIG_PAIRS:-0} timeout "${ONE_TIMEOUT:-330}" bash scripts/gpu-check.sh
  echo "[run] gpu-check on 1 rank: exit $?"
fi
if [ -n "$nccl_pid" ]; then
  for _ in $(seq "${NCCL_WAIT:-300}"); do kill -0 "$nccl_pid" 2> /dev/null || break; sleep 1; done
  if kill -0 "$nccl_pid" 2> /dev/null; then
    echo "[run] NCCL build still running after ${NCCL_WAIT:-300} s more: stopped"; pkill -f scripts/build-nccl.sh; pkill -x make; pkill -f nvcc; kill "$nccl_pid"
  fi
  wait "$nccl_pid"; echo "[run] NCCL build: exit $?"
  cat "$nccl/build-info.txt" 2>/dev/null || tail -20 "$res/nccl-build.log"
fi
if [ -f "$nccl/lib/libnccl.so.2" ]; then
  export LD_PRELOAD=$nccl/lib/libnccl.so.2 NCCL_MULTI_RANK_GPU_ENABLE=1
  echo "[run] $("$SHARDGAN_BUILD/shardgan-train" --version 2>&1 | grep -i nccl)"
  OUT=$res/ranks RANKS=${RANKS:-2} GPU_TESTS=0 DEMO_CELLS=0 BIG=0 AC=0 timeout "${RANKS_TIMEOUT:-240}" \
    bash scripts/gpu-check.sh
  echo "[run] gpu-check on ${RANKS:-2} ranks: exit $?"
  n=${RANKS_MORE:-4}
  timeout "${RANKS_MORE_TIMEOUT:-60}" mpirun -np "$n" --oversubscribe "$SHARDGAN_BUILD/tests/test_gpu_ranks" \
    --gtest_filter=-GpuRanks.TimeoutAbortsTheCommunicator > "$res/gpu-ranks-np$n.txt" 2>&1
  echo "[run] test_gpu_ranks on $n ranks: exit $?"
  grep -E "^\[ +(OK|FAILED|SKIPPED) +\]" "$res/gpu-ranks-np$n.txt" | sort -u
  unset LD_PRELOAD
fi
echo "[run] $(date -u +%FT%TZ) done"
tar -C "$res" --exclude=checkpoints --exclude='*.h5' --exclude='*.dry' -czf "$out/gpu-results.tgz" .
cp "$res/run.log" "$out/"
for p in one ranks; do
  [ -f "$res/$p/gpu-check/summary.txt" ] && cp "$res/$p/gpu-check/summary.txt" "$out/summary-$p.txt"
done
ls -la "$out"
