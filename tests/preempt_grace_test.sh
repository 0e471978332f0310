#!/usr/bin/env bash
# Preemption within a grace period (issue 22). A step is made slow (a wide DCGAN on a large
# batch: about 21 s per step on 2 ranks of the AVX2 2-core machine, 5.7 s on the AVX-512
# one), so that finishing it and then saving would overrun Slurm's grace period. The grace,
# train.preempt_grace_s, is 0.8 x the uninterrupted run's mean step time (at least 3 s):
# 1 s into a step, the rest of it (0.8 of a step and more) times the trainer's 1.25 safety
# factor, plus 1 s, cannot fit in what is left of the grace, whatever the machine's speed.
# 1. SIGUSR1 to mpirun (forwarded to every rank) 1 s into step 2: the ranks abandon step 2
#    at a unit boundary, save step 1 and exit 0 within the grace. The checkpoint verifies.
# 2. --resume auto from it to step 3 equals an uninterrupted 3-step run bit for bit
#    (models, optimizer state, EMA, RNG: the abandoned step's latents, data position,
#    BatchNorm statistics are given back).
# 3. A second signal ends the process at once (the handler restores the default action);
#    before, it was ignored and the step ran on.
# 4. Split placement (G on 1 of 3 ranks, simultaneous update, 4 micro-batches): the ranks
#    vote at every transfer between the groups instead of at unit boundaries. A signal 1 s
#    into a step (that of the step-1 metrics row, which the deferred step figures write
#    after step 2's work) abandons a step on every rank, saves the one before within the
#    grace, exits 0, and --resume auto reaches the uninterrupted split run bit for bit.
TRAIN=$1; CKPT=$2; SRC=$3
source "$(dirname "$0")/lib.sh"
T=$(mktemp -d /tmp/shardgan-grace.XXXXXX)
W=${GRACE_WIDTH:-192}; B=${GRACE_BATCH:-384}
ARGS=("$SRC/configs/fmnist-dcgan.yaml" --set data.source=synthetic --set data.synthetic_size=$((2 * B))
      --set train.global_batch=$B --set model.g_width=$W --set model.d_width=$W --set train.log_every=1
      --set train.sample_every=0 --set train.checkpoint_every=0 --set train.plots=false --set run.seed=3
      --set ema.start_step=0 --set dist.timeout_s=120)

grace_of() {  # grace_of RUN_DIR: 0.8 x the run's mean step time, at least 3 s
  grep -oE '"step_time_s": ?[0-9.]*' "$1/metrics.jsonl" | sed 's/.*: *//' \
    | awk '{ s += $1; n++ } END { g = 0.8 * s / n; if (g < 3) g = 3; printf "%.1f", g }'
}
signal_run() {  # signal_run NAME NP ARGS...: SIGUSR1 to mpirun 1 s after the step-1 metrics row; sets rc, took
  local name=$1 np=$2 pid t0; shift 2
  "${MPIRUN[@]}" -np "$np" "$TRAIN" "${ARGS[@]}" "$@" --set run.dir="$T/$name" > "$T/$name.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 900); do grep -qE '"step": ?1[,}]' "$T/$name/metrics.jsonl" 2>/dev/null && break; sleep 0.2; done
  sleep 1
  t0=$(date +%s.%N)
  kill -USR1 $pid
  wait $pid; rc=$?
  took=$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { printf "%.2f", a - b }')
}

timeout 400 "${MPIRUN[@]}" -np 2 "$TRAIN" "${ARGS[@]}" --set train.steps=3 --set run.dir="$T/a" > "$T/a.log" 2>&1 \
  && ok "uninterrupted 3 steps" || bad "uninterrupted run: $(tail -3 "$T/a.log")"
grep -oE '"step_time_s": ?[0-9.]*' "$T/a/metrics.jsonl" | head -3 | tr '\n' ' '; echo
GRACE=$(grace_of "$T/a")
echo "grace: $GRACE s"

# 1. The signal 1 s into step 2.
signal_run b 2 --set train.steps=3 --set train.preempt_grace_s=$GRACE
[ $rc -eq 0 ] && ok "exit 0 after the signal" || bad "exit $rc after the signal: $(tail -3 "$T/b.log")"
awk -v t="$took" -v g="$GRACE" 'BEGIN { exit !(t < g) }' && ok "saved and exited ${took} s after the signal (grace $GRACE s)" \
  || bad "took ${took} s, past the $GRACE s grace"
grep -q "abandoned step 2" "$T/b.log" && ok "step 2 was abandoned" || bad "no abandoned step: $(grep -m3 -i preempt "$T/b.log")"
"$CKPT" verify "$T/b/checkpoints/step-00000001" > "$T/v.txt" 2>&1 && ok "the step-1 checkpoint verifies" || bad "verify: $(tail -3 "$T/v.txt")"
[ ! -e "$T/b/checkpoints/step-00000002" ] && ok "no step-2 checkpoint" || bad "a step-2 checkpoint exists"

# 2. Resume to step 3: equal to the uninterrupted run, bit for bit.
timeout 400 "${MPIRUN[@]}" -np 2 "$TRAIN" "${ARGS[@]}" --set train.steps=3 --set run.dir="$T/b" --resume auto > "$T/c.log" 2>&1 \
  && ok "resumed to step 3" || bad "resume: $(tail -3 "$T/c.log")"
same_checkpoint "$T/a/checkpoints/step-00000003" "$T/b/checkpoints/step-00000003"

# 3. A second SIGTERM ends the process (one rank, no grace: the first lets the step run on).
OMPI_MCA_ess_singleton_isolated=1 "$TRAIN" "${ARGS[@]}" --set train.global_batch=64 --set data.synthetic_size=128 \
  --set train.steps=3 --set run.dir="$T/e" > "$T/e.log" 2>&1 &
pid=$!
for _ in $(seq 1 300); do grep -qE '"step": ?1[,}]' "$T/e/metrics.jsonl" 2>/dev/null && break; sleep 0.2; done
kill -TERM $pid; sleep 1; t0=$SECONDS; kill -TERM $pid
wait $pid; rc=$?
[ $rc -eq 143 ] && [ $((SECONDS - t0)) -le 3 ] && ok "a second SIGTERM ended the process at once (exit 143)" \
  || bad "second SIGTERM: exit $rc after $((SECONDS - t0)) s"
# 4. Split placement.
SPLIT=(--set train.placement=split --set placement.generator_ranks=1 --set train.update=simultaneous
       --set train.micro_batches=4 --set train.steps=4)
timeout 600 "${MPIRUN[@]}" -np 3 "$TRAIN" "${ARGS[@]}" "${SPLIT[@]}" --set run.dir="$T/sa" > "$T/sa.log" 2>&1 \
  && ok "split: uninterrupted 4 steps" || bad "split uninterrupted run: $(tail -3 "$T/sa.log")"
GRACE=$(grace_of "$T/sa")
echo "split grace: $GRACE s"
signal_run sb 3 "${SPLIT[@]}" --set train.preempt_grace_s=$GRACE
n=$(sed -n 's/.*preemption: abandoned step \([0-9]*\).*/\1/p' "$T/sb.log" | head -1)
if [ $rc -eq 0 ] && [ -n "$n" ]; then
  ok "split: step $n abandoned on every rank, exit 0"
  awk -v t="$took" -v g="$GRACE" 'BEGIN { exit !(t < g) }' && ok "split: saved and exited ${took} s after the signal (grace $GRACE s)" \
    || bad "split: took ${took} s, past the $GRACE s grace"
  prev=$(printf %08d $((n - 1)))
  "$CKPT" verify "$T/sb/checkpoints/step-$prev" > "$T/v.txt" 2>&1 && ok "split: the step-$((n - 1)) checkpoint verifies" \
    || bad "split verify: $(tail -3 "$T/v.txt")"
  [ ! -e "$T/sb/checkpoints/step-$(printf %08d "$n")" ] && ok "split: no step-$n checkpoint" || bad "split: a step-$n checkpoint exists"
  rows=$(grep -oE '"step": ?[0-9]+' "$T/sb/metrics.jsonl" | sed 's/.*: *//' | tr '\n' ' ')
  [ "$rows" = "$(seq -s ' ' 1 $((n - 1))) " ] && ok "split: metrics rows $rows(the step in flight logged before the save)" \
    || bad "split: metrics rows '$rows', not 1..$((n - 1))"
  timeout 600 "${MPIRUN[@]}" -np 3 "$TRAIN" "${ARGS[@]}" "${SPLIT[@]}" --set run.dir="$T/sb" --resume auto > "$T/sc.log" 2>&1 \
    && ok "split: resumed to step 4" || bad "split resume: $(tail -3 "$T/sc.log")"
  same_checkpoint "$T/sa/checkpoints/step-00000004" "$T/sb/checkpoints/step-00000004" "(split, abandoned step $n and resumed)"
else
  bad "split: exit $rc, abandoned step '$n': $(grep -m3 -i preempt "$T/sb.log")"
fi
rm -rf "$T"
finish
