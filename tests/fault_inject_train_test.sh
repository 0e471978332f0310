#!/usr/bin/env bash
# The offload step and the checkpoint save under injected I/O faults (issue 22). The disk
# tier's DirectFile reads SHARDGAN_TEST_IO_FAULTS (direct_file.h, IoFaultPlan):
# 1. Retryable faults (short transfers with a misaligned remainder, EAGAIN, a busy submit)
#    on every rank: the run must end in the same checkpoint, bit for bit, as a clean run.
# 2. A fatal EIO on rank 1 only, after the step-2 checkpoint: every rank ends, non-zero,
#    within the timeout, the message names the offload file, and the step-2 checkpoint
#    still verifies (no step after it was committed).
# A checkpoint save whose HDF5 writes fail on one rank (EFBIG, a real write error) is
# ckpt_save_failure_test.sh.
TRAIN=$1; CKPT=$2; SRC=$3
source "$(dirname "$0")/lib.sh"
T=$(mktemp -d /tmp/shardgan-fault.XXXXXX)
ARGS=("$SRC/configs/fmnist-dcgan.yaml" --set data.source=synthetic --set data.synthetic_size=72
      --set train.global_batch=12 --set train.log_every=1 --set train.sample_every=0 --set run.seed=7
      --set train.plots=false --set model.g_width=64 --set model.d_width=64 --set ema.enabled=false
      --set offload.buffer_bytes=1048576 --set offload.buffer_count=3 --set dist.timeout_s=60
      --set offload.generator.optimizer=disk --set offload.discriminator.optimizer=disk
      --set offload.generator.param=disk --set offload.discriminator.param=disk)
ckpt() { echo "$T/$1/checkpoints/step-$(printf %08d "$2")"; }

timeout 300 "${MPIRUN[@]}" -np 2 "$TRAIN" "${ARGS[@]}" --set train.steps=4 --set run.dir="$T/clean" > "$T/clean.log" 2>&1 \
  && ok "clean run with disk offload" || bad "clean run: $(tail -3 "$T/clean.log")"

# 1. Retryable faults on every rank.
timeout 300 "${MPIRUN[@]}" -np 2 -x SHARDGAN_TEST_IO_FAULTS="c2=short,c5=eagain,c9=short,c14=eagain,c20=short,s3=ebusy,s11=ebusy" \
  "$TRAIN" "${ARGS[@]}" --set train.steps=4 --set run.dir="$T/retry" > "$T/retry.log" 2>&1 \
  && ok "retryable faults: the run completes" || bad "retryable faults: $(tail -3 "$T/retry.log")"
same=1
for r in 00000 00001; do
  for obj in /generator /discriminator; do
    h5diff "$(ckpt clean 4)/rank-$r.h5" "$(ckpt retry 4)/rank-$r.h5" $obj $obj > "$T/diff.txt" 2>&1 || { same=0; head -3 "$T/diff.txt"; }
  done
done
[ $same = 1 ] && ok "retried I/O gives the clean run's checkpoint, bit for bit" || bad "retried I/O changed the result"
n=$(grep -c "injected I/O fault" "$T/retry.log")
[ "$n" -eq 14 ] && ok "all 7 planned faults fired on both ranks ($n)" || bad "$n injected faults reported, want 14"

# 2. A fatal EIO on rank 1 late in the run: completion 1000 of rank 1 falls in step 5 (about
#    200 per step here), after the step-2 and step-4 saves.
t0=$SECONDS
timeout 300 "${MPIRUN[@]}" -np 1 "$TRAIN" "${ARGS[@]}" --set train.steps=6 --set train.checkpoint_every=2 --set run.dir="$T/eio" : \
  -np 1 -x SHARDGAN_TEST_IO_FAULTS="c${EIO_AT:-1000}=eio" "$TRAIN" "${ARGS[@]}" --set train.steps=6 --set train.checkpoint_every=2 \
  --set run.dir="$T/eio" > "$T/eio.log" 2>&1
rc=$?
if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then bad "fatal EIO: exit $rc (0: the fault never fired; 124: hung)"
else ok "fatal EIO on rank 1: exit $rc after $((SECONDS - t0)) s"; fi
grep -q "error on rank 1: offload file '.*\.offload': .* failed: Input/output error (errno 5)" "$T/eio.log" \
  && ok "the message names the offload file and the error" || bad "EIO message: $(grep -m2 error "$T/eio.log")"
last=$(ls "$T/eio/checkpoints" 2>/dev/null | grep -v '\.' | sort | tail -1)
[ -n "$last" ] && [ "$last" != "step-00000006" ] && "$CKPT" verify "$T/eio/checkpoints/$last" > "$T/verify.txt" 2>&1 \
  && ok "the last committed checkpoint ($last) verifies" || bad "no intact checkpoint: '$last' $(tail -2 "$T/verify.txt")"
[ -n "${KEEP:-}" ] || rm -rf "$T"; echo "T=$T"
finish
