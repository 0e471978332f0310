#!/usr/bin/env bash
# ZeRO++ hpZ in training (sharding.<model>.hpz_partition_size): 4 ranks, ZeRO-3 DCGAN with
# bfloat16 compute, the EMA (swapped into G for every sample grid) and checkpoints at steps
# 2 and 4, secondary groups of 2 ranks, against the same run without hpZ:
#  - the losses and both checkpoints are bit-identical (plain, and with qwZ on both sides):
#    hpZ only moves the same bytes another way;
#  - the world carries fewer bytes (comm_bytes_world) and the secondary groups the rest
#    (comm_bytes_secondary > 0);
#  - a run resumed with hpZ from the plain run's step-2 checkpoint ends with the plain run's
#    step-4 checkpoint, bit for bit (checkpoints do not depend on hpZ);
#  - --dry-run counts the secondary blocks (hpz_secondary_bytes) at stage 3;
#  - bad settings are refused on every rank, naming the key.
# Negative control, in every run of this test: with SHARDGAN_TEST_CONTROL=hpz_keep_secondary
# (src/sharding/unit_collectives.cpp), after_optimizer_step keeps the secondary blocks
# (drop_secondary() left out), so the next forward gathers the pre-step parameters from
# them; comparing that run with the plain one must fail (the losses from step 2 on and the
# step-2 and step-4 checkpoints differ).
TRAIN=$1; CKPT=$2; SRC=$3
source "$(dirname "$0")/ckpt_lib.sh"
T=$(mktemp -d /tmp/shardgan-hpz.XXXXXX)
BASE=("$SRC/configs/fmnist-dcgan.yaml" --set model.z_dim=16 --set model.g_width=16 --set model.d_width=16
      --set data.source=synthetic --set data.synthetic_size=96 --set train.global_batch=16 --set train.threads=1
      --set train.log_every=1 --set train.sample_every=2 --set train.checkpoint_every=2 --set train.plots=false
      --set run.seed=41 --set train.steps=4 --set ema.enabled=true --set ema.start_step=0
      --set sharding.generator.compute_dtype=bfloat16 --set sharding.discriminator.compute_dtype=bfloat16)
hpz() {  # hpz K: the --set pairs for both models
  echo "--set sharding.generator.hpz_partition_size=$1 --set sharding.discriminator.hpz_partition_size=$1"
}
qwz="--set sharding.generator.quantized_weights=int8 --set sharding.discriminator.quantized_weights=int8"
run() {  # run NAME ARGS...
  local name=$1; shift
  timeout 300 "${MPIRUN[@]}" -np 4 --bind-to none "$TRAIN" "${BASE[@]}" "$@" --set run.dir="$T/$name" > "$T/$name.log" 2>&1
}
compare() {  # compare A B LABEL: losses and both checkpoints bit for bit, bytes moved
  "$PY" - "$T/$1/metrics.jsonl" "$T/$2/metrics.jsonl" > "$T/c.txt" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
same = len(a) == len(b) == 4 and all(x[k] == y[k] for x, y in zip(a, b) for k in ("loss_d", "loss_g"))
wa, wb = sum(x["comm_bytes_world"] for x in a), sum(y["comm_bytes_world"] for y in b)
sa = sum(x.get("comm_bytes_secondary", 0) for x in a)
print(f"losses {'identical' if same else 'DIFFER'} over {len(a)} steps; rank 0 moved {wa / wb:.3f} of the world bytes "
      f"without hpZ ({wa:,} against {wb:,}) and {sa:,} bytes in its secondary group")
sys.exit(0 if same and wa < wb and sa > 0 else 1)
PY
  [ $? -eq 0 ] && ok "$3: $(cat "$T/c.txt")" || bad "$3: $(cat "$T/c.txt")"
  for s in 00000002 00000004; do
    same_checkpoint "$T/$1/checkpoints/step-$s" "$T/$2/checkpoints/step-$s" "($3, step ${s##*0})"
  done
}
run plain || bad "plain run: $(tail -3 "$T/plain.log")"
# shellcheck disable=SC2046
run hpz $(hpz 2) || bad "hpZ run: $(tail -3 "$T/hpz.log")"
grep -q "hpZ, secondary groups of 2 ranks" "$T/hpz.log" && ok "the log names the secondary groups" \
  || bad "no hpZ line in the log: $(grep -m2 -i hpz "$T/hpz.log")"
compare hpz plain "hpZ"
# The negative control: stale secondary blocks must make the comparison fail (a run that
# did not finish does not count).
# shellcheck disable=SC2046
if (export SHARDGAN_TEST_CONTROL=hpz_keep_secondary; run hpz-control $(hpz 2)); then
  out=$(compare hpz-control plain "control" 2>&1)
  if grep -q "^FAIL: control: losses DIFFER" <<< "$out" && grep -q "^FAIL: rank .* differs (control, step 2)" <<< "$out"; then
    ok "negative control (hpz_keep_secondary) fails the comparison: $(grep -c '^FAIL' <<< "$out") checks, e.g. $(grep -m1 '^FAIL: rank' <<< "$out" | cut -c7-120)"
  else
    bad "negative control (hpz_keep_secondary) not caught by the losses and the step-2 checkpoint: $(grep '^FAIL' <<< "$out" | head -3)"
  fi
else
  bad "negative control run: $(tail -3 "$T/hpz-control.log")"
fi
# shellcheck disable=SC2086
run qwz $qwz || bad "qwZ run: $(tail -3 "$T/qwz.log")"
# shellcheck disable=SC2046,SC2086
run qwz-hpz $qwz $(hpz 2) || bad "qwZ + hpZ run: $(tail -3 "$T/qwz-hpz.log")"
compare qwz-hpz qwz "qwZ + hpZ against qwZ"
# Resume with hpZ from the plain run's step 2.
# shellcheck disable=SC2046
timeout 300 "${MPIRUN[@]}" -np 4 --bind-to none "$TRAIN" "${BASE[@]}" $(hpz 2) --set run.dir="$T/resumed" \
  --resume "$T/plain/checkpoints/step-00000002" > "$T/resumed.log" 2>&1 || bad "resume: $(tail -3 "$T/resumed.log")"
same_checkpoint "$T/resumed/checkpoints/step-00000004" "$T/plain/checkpoints/step-00000004" "(hpZ resumed from plain)"
# The pre-flight counts the blocks: P / K bfloat16 elements per unit, at stage 3 only.
# shellcheck disable=SC2046
"${MPIRUN[@]}" -np 4 "$TRAIN" "${BASE[@]}" $(hpz 2) --set run.dir="$T/dry" --dry-run > "$T/dry.json" 2> "$T/dry.err" \
  || bad "dry run: $(tail -3 "$T/dry.err")"
"$PY" - "$T/dry.json" > "$T/d.txt" 2>&1 <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
s3 = j["per_rank"]["stage3"]
g, d = s3["generator"]["hpz_secondary_bytes"], s3["discriminator"]["hpz_secondary_bytes"]
# P / 2 bfloat16 elements per unit, P padded to 4: about the parameter count itself, in bytes.
ok = abs(g - j["generator_params"]) <= 4 * 8 and abs(d - j["discriminator_params"]) <= 4 * 8
ok = ok and j["per_rank"]["stage2"]["generator"]["hpz_secondary_bytes"] == 0
print(f"stage 3 secondary blocks: G {g:,} B for {j['generator_params']:,} parameters, D {d:,} B for "
      f"{j['discriminator_params']:,}; none at stage 2")
sys.exit(0 if ok else 1)
PY
[ $? -eq 0 ] && ok "--dry-run: $(cat "$T/d.txt")" || bad "--dry-run: $(cat "$T/d.txt")"
expect_fail "K not dividing N" "sharding.generator.hpz_partition_size' is 3" "${MPIRUN[@]}" -np 4 "$TRAIN" "${BASE[@]}" \
  --set sharding.generator.hpz_partition_size=3 --set run.dir="$T/e1"
[ "$(grep -c "hpz_partition_size' is 3" "$T/out.txt")" -ge 4 ] && ok "every rank refused" \
  || bad "not every rank refused: $(grep -c "hpz_partition_size' is 3" "$T/out.txt") messages"
expect_fail "hpZ at stage 2" "sharding.discriminator.hpz_partition_size" "${MPIRUN[@]}" -np 1 "$TRAIN" "${BASE[@]}" \
  --set sharding.discriminator.stage=2 --set sharding.discriminator.hpz_partition_size=2 --set run.dir="$T/e2"
expect_fail "hpZ with HSDP" "sharding.generator.hpz_partition_size" "${MPIRUN[@]}" -np 1 "$TRAIN" "${BASE[@]}" \
  --set sharding.generator.replicate_degree=2 --set sharding.generator.hpz_partition_size=2 --set run.dir="$T/e3"
expect_fail "not a number" "sharding.generator.hpz_partition_size" "${MPIRUN[@]}" -np 1 "$TRAIN" "${BASE[@]}" \
  --set sharding.generator.hpz_partition_size=node --set run.dir="$T/e4"
rm -rf "$T"
finish
