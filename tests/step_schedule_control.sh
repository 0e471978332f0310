#!/usr/bin/env bash
# The split step's schedule check in a real run (ctest step_schedule_control): with the
# test-only control split_schedule_reorder, D's ranks declare their step schedule with two
# transfers swapped (what a reordered loop on one side would do). Every rank must end
# before the first step's transfers, naming the schedule, with no checkpoint written;
# without the control the same run trains (the check does not refuse a good schedule).
TRAIN=$1; CKPT=$2; SRC=$3
source "$(dirname "$0")/lib.sh"
T=$(mktemp -d /tmp/shardgan-schedule.XXXXXX)
ARGS=("$SRC/configs/fmnist-biggan.yaml" --set model.ch=8 --set model.d_ch=8 --set model.z_dim=8 --set model.shared_dim=8
      --set eval.enabled=false --set data.source=synthetic --set data.synthetic_size=48 --set train.global_batch=12
      --set train.micro_batches=2 --set train.d_steps=2 --set train.steps=2 --set train.log_every=1
      --set train.sample_every=0 --set train.plots=false --set train.skip_memory_check=true
      --set train.placement=split --set placement.generator_ranks=1 --set train.checkpoint_every=1)
for update in alternating simultaneous; do
  if SHARDGAN_TEST_CONTROL=split_schedule_reorder timeout 120 "${MPIRUN[@]}" -np 3 "$TRAIN" "${ARGS[@]}" \
       --set train.update=$update --set run.dir="$T/bad-$update" > "$T/bad-$update.log" 2>&1; then
    bad "$update: a reordered schedule on D's side trained"
  else
    n=$(grep -c "step schedules differ" "$T/bad-$update.log")
    [ "$n" -ge 3 ] && ok "$update: all 3 ranks refuse the reordered schedule ($n messages)" \
      || bad "$update: $n ranks name the schedule: $(grep -m3 -i error "$T/bad-$update.log")"
    ls "$T/bad-$update/checkpoints"/step-* > /dev/null 2>&1 && bad "$update: a checkpoint was written" \
      || ok "$update: no step ran (no checkpoint)"
  fi
done
timeout 120 "${MPIRUN[@]}" -np 3 "$TRAIN" "${ARGS[@]}" --set run.dir="$T/good" > "$T/good.log" 2>&1 \
  && ok "the same split run without the control trains" || bad "without the control: $(tail -3 "$T/good.log")"
rm -rf "$T"
finish
