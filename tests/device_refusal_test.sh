#!/usr/bin/env bash
# Issue 20: a device the run cannot use is refused on every rank, within seconds, with a
# message that names the key, and a non-zero exit. Two ranks; each case checks that both
# ranks printed their own error line.
TRAIN=$1; SRC=$2
source "$(dirname "$0")/lib.sh"
T=$(mktemp -d /tmp/shardgan-device.XXXXXX)
CFG="$SRC/configs/fmnist-dcgan.yaml"

refused() {  # name, expected text, extra args...
  local name=$1 want=$2; shift 2
  local t0=$SECONDS
  timeout 60 "${MPIRUN[@]}" -np 2 "$TRAIN" "$CFG" --set data.source=synthetic --set run.dir="$T/run" "$@" \
    > "$T/out.txt" 2>&1
  local rc=$? took=$((SECONDS - t0))
  if [ $rc -eq 0 ]; then bad "$name: exited 0"; return; fi
  if [ $rc -eq 124 ]; then bad "$name: hung (killed after 60 s)"; return; fi
  local ranks
  ranks=$(grep -F -- "$want" "$T/out.txt" | grep -o "error on rank [0-9]*" | sort -u | wc -l)
  if [ "$ranks" -eq 2 ] && [ $took -le 30 ]; then
    ok "$name: both ranks refused with '$want' (exit $rc, ${took}s)"
  else
    bad "$name: $ranks of 2 ranks printed '$want' (exit $rc, ${took}s): $(tail -4 "$T/out.txt")"
  fi
}

refused "NCCL on the CPU" "dist.backend" --set dist.backend=nccl
refused "MPI with run.device=cuda" "mpi needs run.device=cpu" --set run.device=cuda --set dist.backend=mpi
refused "unknown device" "run.device" --set run.device=tpu
if command -v nvidia-smi > /dev/null && nvidia-smi -L 2>/dev/null | grep -q GPU; then
  echo "SKIP: run.device=cuda without a GPU (this machine has one)"
else
  refused "run.device=cuda without a GPU" "no GPU is visible" --set run.device=cuda
fi
rm -rf "$T"
finish
