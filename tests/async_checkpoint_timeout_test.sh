#!/usr/bin/env bash
# checkpoint.async, fork snapshot: the writer's bound (issue 58), on 2 ranks.
#  1. A run commits step 2 (async, fork).
#  2. The run resumes to step 6 with dist.timeout_s 4, and rank 1's writer child hangs
#     (SHARDGAN_TEST_CKPT_WRITE_DELAY_MS: 10 minutes before it writes; rank 1 only, through
#     mpirun's MPMD syntax). Rank 1 must kill its writer after 4 s, and every rank must exit
#     non-zero naming the checkpoint write: rank 1 the writer's timeout, rank 0 the save that
#     failed on rank 1. Within 60 s (no hang), with no writer process left, and the step-2
#     checkpoint byte for byte as before and still the newest committed one, verifying.
# Under SHARDGAN_TEST_CONTROL=ckpt_writer_ignores_timeout the writer is awaited without a
# deadline, as before the fix, and this test must fail (ctest: ..._control, WILL_FAIL).
TRAIN=$1; CKPT=$2; SRC=$3
source "$(dirname "$0")/ckpt_lib.sh"
T=$(mktemp -d /tmp/shardgan-async-timeout.XXXXXX)
ARGS=("$SRC/configs/fmnist-dcgan.yaml" "${SMALL[@]}" --set train.threads=1 --set train.plots=false
      --set train.checkpoint_every=2 --set train.keep_checkpoints=5 --set checkpoint.async=true
      --set checkpoint.snapshot=fork --set dist.timeout_s=4 --set run.dir="$T/run")
CK=$T/run/checkpoints

# 1. Step 2, committed.
timeout 120 "${MPIRUN[@]}" -np 2 --bind-to none "$TRAIN" "${ARGS[@]}" --set train.steps=2 > "$T/first.log" 2>&1 \
  && [ -d "$CK/step-00000002" ] && ok "step 2 committed" || bad "first run: $(tail -3 "$T/first.log")"
(cd "$CK/step-00000002" && md5sum ./*) > "$T/before.md5" 2> /dev/null

# 2. Resume to step 6; rank 1's writer hangs at the save of step 4.
t0=$(date +%s.%N)
timeout 120 "${MPIRUN[@]}" --bind-to none -np 1 "$TRAIN" "${ARGS[@]}" --set train.steps=6 --resume auto \
  : -np 1 env SHARDGAN_TEST_CKPT_WRITE_DELAY_MS=600000 "$TRAIN" "${ARGS[@]}" --set train.steps=6 --resume auto \
  > "$T/hang.log" 2>&1
rc=$?
secs=$(echo "$(date +%s.%N) - $t0" | bc)
[ $rc -ne 0 ] && [ $rc -ne 124 ] && ok "the run with a hanging writer exited $rc after ${secs} s" \
  || bad "the run with a hanging writer: exit $rc after ${secs} s (124: hung)"
(( $(echo "$secs < 60" | bc) )) && ok "ended within 60 s" || bad "took ${secs} s"
grep -qE "resumed from .*step-00000002 at step 2" "$T/hang.log" && ok "resumed at step 2" \
  || bad "no resume at step 2: $(tail -3 "$T/hang.log")"
l1=$(grep -m1 "shardgan-train: error on rank 1:" "$T/hang.log")
l0=$(grep -m1 "shardgan-train: error on rank 0:" "$T/hang.log")
grep -qE "checkpoint save of step 4 .*checkpoint writer process \(pid [0-9]+\) did not finish within dist.timeout_s = 4 s" <<< "$l1" \
  && ok "rank 1: $(cut -c1-230 <<< "$l1")" || bad "rank 1 did not name its writer's timeout: '$l1' $(grep -i error "$T/hang.log" | head -3)"
grep -qE "checkpoint save of step 4 .*failed on rank 1 " <<< "$l0" \
  && ok "rank 0: $(cut -c1-200 <<< "$l0")" || bad "rank 0 did not name the failed write: '$l0'"
sleep 1
left=$(pgrep -f "$T/run" | tr '\n' ' ')
[ -z "$left" ] && ok "no writer process left" || bad "processes left: $left"
# The previous checkpoint: unchanged, still the newest committed one, and it verifies.
(cd "$CK/step-00000002" && md5sum ./*) > "$T/after.md5" 2> /dev/null
[ -s "$T/before.md5" ] && cmp -s "$T/before.md5" "$T/after.md5" && ok "step 2's $(wc -l < "$T/after.md5") files unchanged" \
  || bad "step 2's files changed: $(diff "$T/before.md5" "$T/after.md5" | head -3)"
[ -z "$(compgen -G "$CK/step-*[0-9]" | grep -v step-00000002)" ] && ok "no later checkpoint committed" \
  || bad "committed: $(ls "$CK")"
"$CKPT" verify "$T/run" > "$T/v.txt" 2>&1 && grep -q "step-00000002" "$T/v.txt" \
  && ok "the newest committed checkpoint verifies: $(head -1 "$T/v.txt" | cut -c1-100)" || bad "verify: $(cat "$T/v.txt")"
rm -rf "$T"
finish
