#!/usr/bin/env bash
# A non-finite G loss under split placement (ctest split_nonfinite): D's ranks compute G's
# loss, so their verdict must reach G's ranks, which then skip G's update as the shared
# placement does. The test-only fault g_loss_inf_logit makes one logit of G's hinge loss
# +inf at every step: the loss is -inf while its gradient stays finite. Split (G on 1 of 3
# ranks) must equal shared on 2 within 1e-9 (G untouched, D trained), for the alternating
# update and the simultaneous one with the shared D forward, and log nonfinite_g at every
# step. With CONTROL=1 (ctest split_nonfinite_control) D's side drops its verdict
# (split_drop_g_verdict): G updates under split, and both comparisons must fail.
TRAIN=$1; CKPT=$2; SRC=$3; CONTROL=${4:-0}
source "$(dirname "$0")/lib.sh"
PY=$LIB_PY
T=$(mktemp -d /tmp/shardgan-nonfinite.XXXXXX)
ARGS=("$SRC/configs/fmnist-biggan.yaml" --set model.ch=8 --set model.d_ch=8 --set model.z_dim=8 --set model.shared_dim=8
      --set eval.enabled=false --set data.source=synthetic --set data.synthetic_size=48 --set train.global_batch=12
      --set train.micro_batches=2 --set train.steps=2 --set train.log_every=1 --set model.dtype=float64
      --set train.sample_every=0 --set train.plots=false --set train.skip_memory_check=true --set run.seed=3
      --set train.loss=hinge --set train.on_nonfinite=skip --set train.max_nonfinite_steps=10
      --set train.checkpoint_every=2)
FAULT=g_loss_inf_logit; [ "$CONTROL" = 1 ] && FAULT=g_loss_inf_logit,split_drop_g_verdict
close_ok=0
for U in "alternating" "simultaneous --set train.shared_d_forward=true"; do
  name=${U%% *}
  # shellcheck disable=SC2086
  SHARDGAN_TEST_CONTROL=$FAULT timeout 120 "${MPIRUN[@]}" -np 2 "$TRAIN" "${ARGS[@]}" --set train.update=$U \
    --set run.dir="$T/shared-$name" < /dev/null > "$T/shared-$name.log" 2>&1 || bad "shared $name: $(tail -3 "$T/shared-$name.log")"
  # shellcheck disable=SC2086
  SHARDGAN_TEST_CONTROL=$FAULT timeout 120 "${MPIRUN[@]}" -np 3 "$TRAIN" "${ARGS[@]}" --set train.update=$U \
    --set train.placement=split --set placement.generator_ranks=1 \
    --set run.dir="$T/split-$name" < /dev/null > "$T/split-$name.log" 2>&1 || bad "split $name: $(tail -3 "$T/split-$name.log")"
  for p in shared split; do
    [ "$CONTROL" = 1 ] && continue  # without D's verdict G's ranks log no skip: the comparison is the check
    n=$("$PY" -c "import json,sys; print(json.loads(open(sys.argv[1]).readlines()[-1]).get('nonfinite_steps'))" \
        "$T/$p-$name/metrics.jsonl" 2>/dev/null)
    [ "$n" = 2 ] && ok "$name, $p: nonfinite_steps 2 after 2 steps (G skipped at both)" || bad "$name, $p: nonfinite_steps ${n:-missing} after 2 steps"
  done
  if out=$("$PY" "$(dirname "$0")/ckpt_close.py" "$T/split-$name/checkpoints/step-00000002" \
             "$T/shared-$name/checkpoints/step-00000002" 1e-9 2>&1); then
    close_ok=$((close_ok + 1)); [ "$CONTROL" = 1 ] || ok "$name: split equals shared (G skipped on both): $out"
  else
    [ "$CONTROL" = 1 ] && ok "$name, control: split differs from shared without D's verdict: $out" \
                         || bad "$name: split differs from shared: $out"
  fi
done
[ "$CONTROL" = 1 ] && [ "$close_ok" -ne 0 ] && bad "control: $close_ok comparisons passed without D's verdict"
rm -rf "$T"
finish
