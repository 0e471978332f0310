#!/usr/bin/env bash
# Split placement: G's ranks write the sample grids (and evaluate) alone, and D's ranks wait
# for them explicitly (ctest split_eval_wait). With dist.timeout_s 3 and a sample grid that
# takes 4.5 s (the test-only switch slow_samples), a 3-rank split run (G on 1) trains to its
# end; before, D's ranks timed out in the next step's first transfer. Control: with
# eval.timeout_s 0 the same run must end on every rank, naming eval.timeout_s.
TRAIN=$1; CKPT=$2; SRC=$3
source "$(dirname "$0")/lib.sh"
T=$(mktemp -d /tmp/shardgan-evalwait.XXXXXX)
ARGS=("$SRC/configs/fmnist-biggan.yaml" --set model.ch=8 --set model.d_ch=8 --set model.z_dim=8 --set model.shared_dim=8
      --set eval.enabled=false --set data.source=synthetic --set data.synthetic_size=48 --set train.global_batch=12
      --set train.steps=4 --set train.log_every=1 --set train.sample_every=2 --set train.plots=false
      --set train.skip_memory_check=true --set train.checkpoint_every=0 --set dist.timeout_s=3
      --set train.placement=split --set placement.generator_ranks=1)
export SHARDGAN_TEST_CONTROL=slow_samples
if timeout 120 "${MPIRUN[@]}" -np 3 "$TRAIN" "${ARGS[@]}" --set run.dir="$T/wait" < /dev/null > "$T/wait.log" 2>&1; then
  rows=$(grep -c '"loss_d"' "$T/wait/metrics.jsonl")
  [ "$rows" = 4 ] && ok "sample grids of 4.5 s with dist.timeout_s 3: trained 4 steps, D's ranks waited" \
    || bad "trained but logged $rows rows"
else
  bad "D's ranks did not wait through the sample grid: $(grep -m2 -i "timeout\|error" "$T/wait.log")"
fi
if timeout 120 "${MPIRUN[@]}" -np 3 "$TRAIN" "${ARGS[@]}" --set eval.timeout_s=0 --set run.dir="$T/control" \
     < /dev/null > "$T/control.log" 2>&1; then
  bad "control (eval.timeout_s 0): the run did not time out"
else
  n=$(grep -c "raise eval.timeout_s" "$T/control.log")
  [ "$n" -ge 1 ] && ok "control (eval.timeout_s 0): the job ended, naming eval.timeout_s ($n ranks)" \
    || bad "control: ended without naming eval.timeout_s: $(grep -m2 -i "timeout\|error" "$T/control.log")"
fi
unset SHARDGAN_TEST_CONTROL
rm -rf "$T"
finish
