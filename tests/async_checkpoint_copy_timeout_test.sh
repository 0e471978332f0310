#!/usr/bin/env bash
# checkpoint.async with the copy snapshot: the background write's bound, on 1 rank (where no
# peer's timeout would end the job).
#  1. A run commits step 2 (async, copy).
#  2. The run resumes to step 6 with dist.timeout_s 2, and its writer thread hangs
#     (SHARDGAN_TEST_CKPT_WRITE_DELAY_MS: 10 minutes before it writes step 4). The wait at
#     the step-6 save (or the check after a step, whichever comes first) must give up
#     dist.timeout_s + 2 s after the write started, and exit non-zero naming the write and
#     dist.timeout_s, within 25 s (no hang), with the step-2
#     checkpoint byte for byte as before and still the newest committed one.
# Under SHARDGAN_TEST_CONTROL=ckpt_copy_writer_unbounded the thread is awaited without a
# bound, as before, and this test must fail (ctest: ..._control, WILL_FAIL).
TRAIN=$1; CKPT=$2; SRC=$3
source "$(dirname "$0")/ckpt_lib.sh"
T=$(mktemp -d /tmp/shardgan-copy-timeout.XXXXXX)
ARGS=("$SRC/configs/fmnist-dcgan.yaml" "${SMALL[@]}" --set train.threads=1 --set train.plots=false
      --set train.checkpoint_every=2 --set train.keep_checkpoints=5 --set checkpoint.async=true
      --set checkpoint.snapshot=copy --set dist.timeout_s=2 --set run.dir="$T/run")
CK=$T/run/checkpoints

# 1. Step 2, committed.
timeout 120 "${MPIRUN[@]}" -np 1 --bind-to none "$TRAIN" "${ARGS[@]}" --set train.steps=2 > "$T/first.log" 2>&1 \
  && [ -d "$CK/step-00000002" ] && ok "step 2 committed" || bad "first run: $(tail -3 "$T/first.log")"
(cd "$CK/step-00000002" && md5sum ./*) > "$T/before.md5" 2> /dev/null

# 2. Resume to step 6; the write of step 4 hangs.
t0=$(date +%s.%N)
timeout 25 env SHARDGAN_TEST_CKPT_WRITE_DELAY_MS=600000 "${MPIRUN[@]}" -np 1 --bind-to none \
  -x SHARDGAN_TEST_CKPT_WRITE_DELAY_MS "$TRAIN" "${ARGS[@]}" --set train.steps=6 --resume auto > "$T/hang.log" 2>&1
rc=$?
secs=$(echo "$(date +%s.%N) - $t0" | bc)
[ $rc -ne 0 ] && [ $rc -ne 124 ] && ok "the run with a hanging write exited $rc after ${secs} s" \
  || bad "the run with a hanging write: exit $rc after ${secs} s (124: hung)"
grep -qE "resumed from .*step-00000002 at step 2" "$T/hang.log" && ok "resumed at step 2" \
  || bad "no resume at step 2: $(tail -3 "$T/hang.log")"
l0=$(grep -m1 "error on rank 0:" "$T/hang.log")
grep -qE "checkpoint save of step 4 .*copy snapshot\) did not finish within dist.timeout_s = 2 s" <<< "$l0" \
  && ok "rank 0: $(cut -c1-230 <<< "$l0")" || bad "rank 0 did not name the write's bound: '$l0' $(grep -i error "$T/hang.log" | head -3)"
# The previous checkpoint: unchanged and still the newest committed one.
(cd "$CK/step-00000002" && md5sum ./*) > "$T/after.md5" 2> /dev/null
[ -s "$T/before.md5" ] && cmp -s "$T/before.md5" "$T/after.md5" && ok "step 2's $(wc -l < "$T/after.md5") files unchanged" \
  || bad "step 2's files changed: $(diff "$T/before.md5" "$T/after.md5" | head -3)"
[ -z "$(compgen -G "$CK/step-*[0-9]" | grep -v step-00000002)" ] && ok "no later checkpoint committed" \
  || bad "committed: $(ls "$CK")"
pkill -f "$T/run" 2> /dev/null
rm -rf "$T"
finish
