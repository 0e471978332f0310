#!/usr/bin/env bash
# Failures end cleanly (issue 10), on NP ranks (2 and 3 in ctest):
#  - an uninterrupted reference run, started with `--resume auto` in an empty run dir
#    (which must start fresh);
#  - preemption: SIGTERM to one rank only (NP = 2) or SIGUSR1 to mpirun, which forwards it
#    to every rank (NP = 3), mid-run. Every rank finishes the step, a checkpoint is saved,
#    the job exits 0; `--resume auto` continues, and the final state equals the reference
#    bit for bit (shardgan-ckpt diff --rtol 0: every value identical);
#  - kill -9 of the last rank mid-run: the job ends (within 60 s), `--resume auto` continues
#    from the last periodic checkpoint and again reaches the reference bit for bit;
#  - an exception on one rank (rank 0 cannot write its sample grid: run.dir/samples is a
#    file): every rank ends within 60 s, non-zero, with a message naming rank 0 and the cause;
#  - NaN/Inf (optim.discriminator.lr = 1e38: after D's first Adam step its weights are
#    ~1e38, and the G update of that same step 1 already overflows float32 through D):
#    train.on_nonfinite=abort ends the job naming the step and the model; skip leaves D's
#    parameters and optimizer state untouched (the checkpoints of skipped steps 2 and 3
#    are equal for both models) and counts the skips in metrics.jsonl, until more than
#    train.max_nonfinite_steps = 3 in a row (step 4) end it.
TRAIN=$1; CKPT=$2; SRC=$3; NP=${4:-2}
source "$(dirname "$0")/ckpt_lib.sh"
T=$(mktemp -d /tmp/shardgan-fault.XXXXXX)
CFG="$SRC/configs/fmnist-dcgan.yaml"
STEPS=60
RUN=("${SMALL[@]}" --set model.g_width=24 --set model.d_width=24 --set train.steps=$STEPS
     --set train.checkpoint_every=8 --set train.keep_checkpoints=20)
LAST=$((NP - 1))

rank_pid() {  # rank_pid MPIRUN_PID RANK: the PID of that rank among mpirun's children
  local p
  for _ in $(seq 1 3000); do
    for p in $(pgrep -P "$1"); do
      [ "$(tr '\0' '\n' < /proc/$p/environ 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')" = "$2" ] && { echo "$p"; return; }
    done
    sleep 0.01
  done
}
wait_for_step() {  # wait_for_step RUN_DIR STEP: until metrics.jsonl reaches STEP (60 s)
  for _ in $(seq 1 6000); do
    [ -f "$1/metrics.jsonl" ] && [ "$(wc -l < "$1/metrics.jsonl")" -ge "$2" ] && return 0
    sleep 0.01
  done
  return 1
}
same_as_reference() {  # same_as_reference NAME RUN_DIR
  local fin=$2/checkpoints/step-000000$STEPS
  "$CKPT" diff "$T/ref/checkpoints/step-000000$STEPS" "$fin" --rtol 0 > "$T/d.txt" 2>&1 \
    && ok "$1: step $STEPS equals the uninterrupted run bit for bit ($(grep -c . "$T/d.txt") lines of diff, all 0)" \
    || bad "$1: differs from the uninterrupted run: $(grep -v ' 0  *0 ' "$T/d.txt" | head -3)"
}

# Reference, through --resume auto on an empty run dir.
"${MPIRUN[@]}" -np "$NP" "$TRAIN" "$CFG" "${RUN[@]}" --set run.dir="$T/ref" --resume auto > "$T/ref.log" 2>&1 \
  && grep -q "no committed checkpoint under $T/ref; starting fresh" "$T/ref.log" \
  && ok "--resume auto on an empty run dir starts fresh and trains $STEPS steps" || bad "reference: $(tail -5 "$T/ref.log")"

# Preemption.
if [ "$NP" -eq 2 ]; then SIG=TERM; WHO="rank 1 only"; else SIG=USR1; WHO="mpirun (forwarded to every rank)"; fi
"${MPIRUN[@]}" -np "$NP" "$TRAIN" "$CFG" "${RUN[@]}" --set run.dir="$T/pre" > "$T/pre.log" 2>&1 &
MPI_PID=$!
victim=$(rank_pid $MPI_PID 1)
wait_for_step "$T/pre" 5
if [ "$NP" -eq 2 ]; then kill -$SIG "$victim"; else kill -$SIG $MPI_PID; fi
t0=$SECONDS
wait $MPI_PID; rc=$?
got=$(sed -n "s/.*received SIG$SIG (preemption): finished step \([0-9]*\) on every rank.*/\1/p" "$T/pre.log")
[ $rc -eq 0 ] && [ -n "$got" ] && [ "$got" -lt $STEPS ] && [ -f "$T/pre/checkpoints/step-$(printf %08d "$got")/index.h5" ] \
  && ok "SIG$SIG to $WHO: exit 0 after $((SECONDS - t0)) s, step $got finished and saved" \
  || bad "SIG$SIG: exit $rc, step '$got': $(tail -5 "$T/pre.log")"
"${MPIRUN[@]}" -np "$NP" "$TRAIN" "$CFG" "${RUN[@]}" --set run.dir="$T/pre" --resume auto > "$T/pre2.log" 2>&1 \
  && grep -q "resumed from .*step-$(printf %08d "$got") at step $got" "$T/pre2.log" \
  && ok "--resume auto continues from step $got" || bad "resume after SIG$SIG: $(tail -5 "$T/pre2.log")"
same_as_reference "preempted by SIG$SIG and resumed" "$T/pre"

# kill -9 of the last rank mid-run.
"${MPIRUN[@]}" -np "$NP" "$TRAIN" "$CFG" "${RUN[@]}" --set run.dir="$T/kill" > "$T/kill.log" 2>&1 &
MPI_PID=$!
victim=$(rank_pid $MPI_PID $LAST)
wait_for_step "$T/kill" 19
kill -9 "$victim"
t0=$SECONDS
timeout 60 tail --pid=$MPI_PID -f /dev/null
wait $MPI_PID; rc=$?
[ $rc -ne 0 ] && [ $((SECONDS - t0)) -lt 60 ] && ok "kill -9 of rank $LAST: the job ended (exit $rc) after $((SECONDS - t0)) s" \
  || bad "kill -9: exit $rc after $((SECONDS - t0)) s"
"${MPIRUN[@]}" -np "$NP" "$TRAIN" "$CFG" "${RUN[@]}" --set run.dir="$T/kill" --resume auto > "$T/kill2.log" 2>&1 \
  && grep -q "resumed from .*step-000000[0-9]* at step" "$T/kill2.log" \
  && ok "after kill -9, --resume auto: $(grep -o 'resumed from .*' "$T/kill2.log" | sed "s|$T/||")" \
  || bad "resume after kill -9: $(tail -5 "$T/kill2.log")"
same_as_reference "killed with -9 and resumed" "$T/kill"

# An exception on rank 0 only.
mkdir -p "$T/exc" && touch "$T/exc/samples"
t0=$SECONDS
timeout 120 "${MPIRUN[@]}" -np "$NP" "$TRAIN" "$CFG" "${RUN[@]}" --set train.sample_every=3 --set run.dir="$T/exc" > "$T/exc.log" 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $((SECONDS - t0)) -lt 60 ] && grep -q "error on rank 0: .*samples" "$T/exc.log" \
  && ok "exception on rank 0: every rank ended (exit $rc) in $((SECONDS - t0)) s: $(grep -o 'error on rank 0: .*' "$T/exc.log" | head -1 | cut -c1-120)" \
  || bad "exception on rank 0: exit $rc after $((SECONDS - t0)) s: $(tail -5 "$T/exc.log")"

# NaN / Inf.
NAN=(--set optim.discriminator.lr=1e38 --set train.checkpoint_every=1)
expect_fail "on_nonfinite=abort" "step 1: a NaN or Inf in the generator" \
  "${MPIRUN[@]}" -np "$NP" "$TRAIN" "$CFG" "${RUN[@]}" "${NAN[@]}" --set train.on_nonfinite=abort --set run.dir="$T/nan1"
[ "$(grep -c "train.on_nonfinite is abort" "$T/out.txt")" -eq "$NP" ] && ok "abort: all $NP ranks name the cause" \
  || bad "abort: $(grep -c "train.on_nonfinite is abort" "$T/out.txt") of $NP ranks named it"
expect_fail "skip, then max_nonfinite_steps" "step 4: a NaN or Inf in the discriminator and the generator's loss or gradients (all ranks agreed); that is 4 such steps in a row, more than train.max_nonfinite_steps = 3" \
  "${MPIRUN[@]}" -np "$NP" "$TRAIN" "$CFG" "${RUN[@]}" "${NAN[@]}" --set train.max_nonfinite_steps=3 --set run.dir="$T/nan2"
C=$T/nan2/checkpoints
if [ -d "$C/step-00000002" ] && [ -d "$C/step-00000003" ] && [ ! -d "$C/step-00000004" ]; then
  "$CKPT" diff "$C/step-00000002" "$C/step-00000003" > "$T/nd.txt" 2>&1
  # Every parameter and Adam-state row of both models must be 0 between two skipped steps.
  awk '$1 ~ /^(generator|discriminator)\/(params|optim)\// && ($3 != 0 || $4 != 0) {bad=1} END {exit bad}' "$T/nd.txt" \
    && grep -q "^discriminator/params" "$T/nd.txt" && grep -q "^generator/optim" "$T/nd.txt" \
    && ok "skip: parameters and optimizer state of G and D are untouched between skipped steps 2 and 3" \
    || bad "skip changed a model: $(awk '$3 != 0' "$T/nd.txt" | head -3)"
else
  bad "skip: expected checkpoints of steps 2 and 3 and none of step 4: $(ls "$C" 2>&1)"
fi
grep -q '"nonfinite_steps":3' "$T/nan2/metrics.jsonl" && ok "metrics.jsonl counts the skipped steps" \
  || bad "no nonfinite_steps count: $(tail -2 "$T/nan2/metrics.jsonl")"
rm -rf "$T"
finish
