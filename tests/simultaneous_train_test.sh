#!/usr/bin/env bash
# train.update: simultaneous (ParaGAN's update) end to end through shardgan-train, on one
# set of ranks (placement shared): it composes with the rest of the trainer.
#   - A run resumed from its step-2 checkpoint equals the uninterrupted 4-step run, bit for
#     bit (DCGAN, 2 ranks, ZeRO-3).
#   - Disk offload of optimizer state, gradients and master shards leaves it bit-identical.
#   - The conditional BigGAN with d_steps 2, 2 micro-batches, R1 and the EMA, at stage 2 on
#     3 ranks and under HSDP on 4, trains with finite losses.
#   - It is not the alternating run (the two updates differ).
#   - A bad value ends every rank naming the key.
TRAIN=$1; CKPT=$2; SRC=$3
source "$(dirname "$0")/lib.sh"
T=$(mktemp -d /tmp/shardgan-simul.XXXXXX)
COMMON=(--set data.source=synthetic --set data.synthetic_size=72
        --set train.log_every=1 --set train.sample_every=0 --set train.checkpoint_every=0
        --set run.seed=7 --set train.plots=false)
DCGAN=("$SRC/configs/fmnist-dcgan.yaml" --set train.global_batch=12 --set model.g_width=64 --set model.d_width=64 --set ema.enabled=false
       --set train.update=simultaneous)
BIGGAN=("$SRC/configs/fmnist-biggan.yaml" --set train.global_batch=12 --set model.ch=8 --set model.d_ch=8 --set model.z_dim=8
        --set model.shared_dim=8 --set ema.start_step=0 --set train.update=simultaneous)
run() {  # run NAME NP STEPS ARGS...
  local name=$1 np=$2 steps=$3; shift 3
  timeout 600 "${MPIRUN[@]}" -np "$np" "$TRAIN" "$@" "${COMMON[@]}" --set train.steps="$steps" \
    --set run.dir="$T/$name" > "$T/$name.log" 2>&1
}
ckpt() { echo "$T/$1/checkpoints/step-$(printf %08d "$2")"; }

run straight 2 4 "${DCGAN[@]}" || bad "straight run: $(tail -3 "$T/straight.log")"
run resumed 2 2 "${DCGAN[@]}" --set train.checkpoint_every=2 || bad "first half: $(tail -3 "$T/resumed.log")"
timeout 600 "${MPIRUN[@]}" -np 2 "$TRAIN" "${DCGAN[@]}" "${COMMON[@]}" --set train.steps=4 --set run.dir="$T/resumed" \
  --resume "$T/resumed" > "$T/resumed-2.log" 2>&1 || bad "resume: $(tail -3 "$T/resumed-2.log")"
same_checkpoint "$(ckpt straight 4)" "$(ckpt resumed 4)" "(resumed at step 2 against 4 straight steps)"

m() { local x; for x in generator discriminator; do echo --set offload.$x.optimizer=disk --set offload.$x.param=disk \
  --set offload.$x.gradient=disk; done; }
run offload 2 4 "${DCGAN[@]}" $(m) || bad "offload run: $(tail -3 "$T/offload.log")"
same_checkpoint "$(ckpt straight 4)" "$(ckpt offload 4)" "(disk offload of state, gradients and parameters)"

run alternating 2 4 "${DCGAN[@]}" --set train.update=alternating || bad "alternating run: $(tail -3 "$T/alternating.log")"
h5diff "$(ckpt straight 4)/rank-00000.h5" "$(ckpt alternating 4)/rank-00000.h5" /generator /generator > /dev/null 2>&1 \
  && bad "simultaneous and alternating runs ended equal" || ok "simultaneous and alternating runs differ"

finite() {  # finite NAME: every step's losses are finite numbers
  "${SHARDGAN_PYTHON:-python3}" - "$T/$1/metrics.jsonl" <<'PY'
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss_d"' in l]
sys.exit(0 if rows and all(math.isfinite(r["loss_d"]) and math.isfinite(r["loss_g"]) for r in rows) else 1)
PY
}
for spec in "biggan-s2-np3 3 --set sharding.generator.stage=2 --set sharding.discriminator.stage=2" \
            "biggan-hsdp-np4 4 --set train.global_batch=16 --set sharding.generator.replicate_degree=2 --set sharding.discriminator.replicate_degree=2"; do
  set -- $spec; name=$1; np=$2; shift 2
  if run "$name" "$np" 3 "${BIGGAN[@]}" --set train.d_steps=2 --set train.micro_batches=2 --set train.r1_gamma=0.1 "$@"; then
    finite "$name" && ok "$name: d_steps 2, 2 micro-batches, R1, EMA: 3 steps with finite losses" \
      || bad "$name: non-finite losses"
  else
    bad "$name: $(tail -3 "$T/$name.log")"
  fi
done

timeout 120 "${MPIRUN[@]}" -np 2 "$TRAIN" "${DCGAN[@]}" "${COMMON[@]}" --set train.steps=1 --set train.update=async \
  --set run.dir="$T/err" > "$T/err.log" 2>&1 && bad "train.update=async accepted" \
  || { [ "$(grep -c "'train.update'.*must be alternating or simultaneous" "$T/err.log")" -ge 2 ] \
       && ok "train.update: both ranks name the key" || bad "train.update: $(grep -m2 -i error "$T/err.log")"; }
rm -rf "$T"
finish
