#!/usr/bin/env bash
# kill -9 during a save: a 2-rank run checkpoints every step; as soon as a save is under
# way (a step-*.tmp directory exists), one rank is killed with SIGKILL. If the save still
# finished first (the .tmp directory is gone), the round is retried, up to 5 launches. The
# newest committed checkpoint must still verify, and --resume must pick it and train on.
# Three rounds: rank 1, rank 0 (which commits), rank 1 again.
TRAIN=$1; CKPT=$2; SRC=$3
source "$(dirname "$0")/ckpt_lib.sh"
T=$(mktemp -d /tmp/shardgan-ckpt-kill.XXXXXX)
CFG="$SRC/configs/fmnist-dcgan.yaml"
# A bigger model than the other tests (19 MB per checkpoint), so that a save takes a while.
BIG=(--set data.source=synthetic --set data.synthetic_size=96 --set train.global_batch=4
     --set model.g_width=64 --set model.d_width=64 --set train.sample_every=0 --set train.log_every=50
     --set train.checkpoint_every=1 --set train.keep_checkpoints=2 --set run.dir="$T/run")
CK=$T/run/checkpoints
RESUME=()
for round in 1 2 3; do
  victim=$(( round == 2 ? 0 : 1 ))
  hit=""
  for launch in 1 2 3 4 5; do
    "${MPIRUN[@]}" -np 2 "$TRAIN" "$CFG" "${BIG[@]}" --set train.steps=100000 "${RESUME[@]}" > "$T/run$round.log" 2>&1 &
    MPI_PID=$!
    vpid=""
    for _ in $(seq 1 3000); do  # find the victim among mpirun's children (up to 30 s)
      for p in $(pgrep -P $MPI_PID); do
        [ "$(tr '\0' '\n' < /proc/$p/environ 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')" = "$victim" ] && vpid=$p
      done
      [ -n "$vpid" ] && break
      sleep 0.01
    done
    for _ in $(seq 1 20000); do  # poll with builtins only, so the kill follows at once
      if compgen -G "$CK/step-*[0-9]" > /dev/null && compgen -G "$CK/step-*.tmp" > /dev/null; then
        kill -9 "$vpid"
        break
      fi
      sleep 0.002
    done
    timeout 60 tail --pid=$MPI_PID -f /dev/null
    wait $MPI_PID 2>/dev/null
    hit=$(compgen -G "$CK/step-*.tmp" | head -1)
    [ -n "$hit" ] && break
    RESUME=(--resume "$T/run")
  done
  [ -n "$hit" ] && ok "round $round: rank $victim got SIGKILL while $(basename "$hit") was being written (launch $launch)" \
    || bad "round $round: no kill landed inside a save in 5 launches"
  "$CKPT" verify "$T/run" > "$T/v.txt" 2>&1 && ok "round $round: newest committed checkpoint verifies: $(cut -c1-110 "$T/v.txt")" \
    || bad "round $round: verify failed: $(cat "$T/v.txt")"
  RESUME=(--resume "$T/run")
done
last=$(compgen -G "$CK/step-*[0-9]" | sort | tail -1)
step=$((10#${last##*step-}))
"${MPIRUN[@]}" -np 2 "$TRAIN" "$CFG" "${BIG[@]}" --set train.checkpoint_every=0 --set train.steps=$((step + 1)) \
  --resume "$T/run" > "$T/final.log" 2>&1 && grep -q "resumed from $last at step $step" "$T/final.log" \
  && ok "resume picks $(basename "$last") and trains a step" || bad "final resume: $(tail -5 "$T/final.log")"
[ -z "$(compgen -G "$CK/*.tmp")" ] && ok "the next save removed the interrupted save's .tmp directory" \
  || bad "leftover: $(compgen -G "$CK/*.tmp")"
rm -rf "$T"
finish
