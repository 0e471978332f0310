#!/usr/bin/env bash
# Bad input ends the job on every rank, within the timeout, with a message naming the cause.
TRAIN=$1; BIN=$2; SRC=$3
source "$(dirname "$0")/lib.sh"
T=$(mktemp -d /tmp/shardgan-errors.XXXXXX)
CFG="$SRC/configs/fmnist-dcgan.yaml"

expect_failure() {  # name, expected text, command...
  local name=$1 want=$2; shift 2
  local t0=$SECONDS
  timeout 90 "$@" > "$T/out.txt" 2>&1
  local rc=$? took=$((SECONDS - t0))
  if [ $rc -eq 0 ]; then bad "$name: exited 0"; return; fi
  if [ $rc -eq 124 ]; then bad "$name: hung (killed by timeout after 90 s)"; return; fi
  grep -qF -- "$want" "$T/out.txt" && ok "$name: exit $rc after ${took}s, names the cause" \
    || bad "$name: exit $rc but no '$want' in: $(tail -5 "$T/out.txt")"
}

expect_failure "missing dataset" "/nonexistent/fmnist/train-images-idx3-ubyte.gz' does not exist" \
  "${MPIRUN[@]}" -np 2 "$TRAIN" "$CFG" --set data.path=/nonexistent/fmnist --set run.dir="$T/r1"
expect_failure "unknown config key" "unknown config key 'train.stepz'" \
  "${MPIRUN[@]}" -np 2 "$TRAIN" "$CFG" --set train.stepz=5 --set run.dir="$T/r2"
expect_failure "bad config value" "key 'train.steps' has value 'many'" \
  "${MPIRUN[@]}" -np 2 "$TRAIN" "$CFG" --set train.steps=many --set run.dir="$T/r3"
expect_failure "missing config file" "cannot open config file '/nonexistent.yaml'" \
  "${MPIRUN[@]}" -np 2 "$TRAIN" /nonexistent.yaml
expect_failure "collective never joined" "all_reduce (rank 0 of 2, numel 1000, dtype Float, 4000 bytes) timed out after 2 s" \
  "${MPIRUN[@]}" -np 2 "$BIN/comm_hang" 2
# Issue 22: a rank that fails with a collective in flight ends the job at once; its
# MpiWork used to wait out dist.timeout_s (here 600 s) in its destructor first.
t0=$SECONDS
expect_failure "failure with a collective in flight" "injected failure with a reduce-scatter in flight" \
  "${MPIRUN[@]}" -np 2 "$BIN/comm_hang" 600 inflight
[ $((SECONDS - t0)) -lt 60 ] && ok "failure in flight: the job ended within 60 s" \
  || bad "failure in flight: took $((SECONDS - t0)) s (over 60)"
# A global batch that 3 ranks cannot split: --dry-run refuses it as the run would (it passed).
expect_failure "global batch on 3 ranks, --dry-run" "train.global_batch 16 must divide evenly by train.micro_batches (1) x the world size (3)" \
  "${MPIRUN[@]}" -np 3 "$TRAIN" "$CFG" --set data.source=synthetic --set train.global_batch=16 --set run.dir="$T/r6" --dry-run
expect_failure "resume from nothing" "no checkpoint there" \
  "${MPIRUN[@]}" -np 2 "$TRAIN" "$CFG" --set data.source=synthetic --set run.dir="$T/r4" --resume "$T/none"
expect_failure "float16 compute on CPU" "compute_dtype=float16 needs a GPU" \
  "${MPIRUN[@]}" -np 2 "$TRAIN" "$CFG" --set data.source=synthetic --set sharding.generator.compute_dtype=float16 --set run.dir="$T/r5"
expect_failure "unknown optimizer" "optim.discriminator.type" \
  "${MPIRUN[@]}" -np 2 "$TRAIN" "$CFG" --set optim.discriminator.type=lion --set run.dir="$T/r6"
rm -rf "$T"
finish
