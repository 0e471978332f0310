#!/usr/bin/env bash
# Resume: on 2 ranks, 6 steps straight must equal 3 steps, a checkpoint, a resume and 3 more
# steps, bit for bit (h5diff with no tolerance over every model tensor, the Adam state and
# the RNG state of the final checkpoints).
TRAIN=$1; SRC=$3
source "$(dirname "$0")/lib.sh"
T=$(mktemp -d /tmp/shardgan-resume.XXXXXX)
COMMON=(--set data.source=synthetic --set data.synthetic_size=96 --set train.global_batch=16
        --set model.z_dim=16 --set model.g_width=8 --set model.d_width=8 --set train.log_every=1
        --set train.sample_every=0 --set train.checkpoint_every=0 --set run.seed=11)
# Scenario "zero3": the shipped config's ZeRO-3, Adam and EMA. Scenario "mixed": G at
# stage 2 and D at stage 1, bfloat16 compute, 2 micro-batches, gradient clipping, AdamW with
# a cosine schedule for G and RMSprop for D.
MIXED=(--set sharding.generator.stage=2 --set sharding.discriminator.stage=1
       --set sharding.generator.compute_dtype=bfloat16 --set sharding.discriminator.compute_dtype=bfloat16
       --set train.micro_batches=2 --set train.grad_clip=1.0 --set optim.generator.type=adamw
       --set optim.generator.weight_decay=0.01 --set optim.generator.schedule=cosine --set optim.generator.total_steps=6
       --set optim.discriminator.type=rmsprop --set optim.discriminator.lr=1e-4 --set ema.start_step=2)
for scenario in zero3 mixed; do
  EXTRA=(); [ $scenario = mixed ] && EXTRA=("${MIXED[@]}")
  S=$T/$scenario; mkdir -p "$S"; echo "== scenario $scenario"
  "${MPIRUN[@]}" -np 2 "$TRAIN" "$SRC/configs/fmnist-dcgan.yaml" "${COMMON[@]}" "${EXTRA[@]}" --set train.steps=6 --set run.dir="$S/a" > "$S/a.log" 2>&1 \
    && ok "6 steps straight" || bad "6 steps straight: $(tail -5 "$S/a.log")"
  "${MPIRUN[@]}" -np 2 "$TRAIN" "$SRC/configs/fmnist-dcgan.yaml" "${COMMON[@]}" "${EXTRA[@]}" --set train.steps=3 --set run.dir="$S/b" > "$S/b1.log" 2>&1 \
    && ok "3 steps" || bad "3 steps: $(tail -5 "$S/b1.log")"
  "${MPIRUN[@]}" -np 2 "$TRAIN" "$SRC/configs/fmnist-dcgan.yaml" "${COMMON[@]}" "${EXTRA[@]}" --set train.steps=6 --set run.dir="$S/b" --resume "$S/b" > "$S/b2.log" 2>&1 \
    && ok "resume to 6 steps" || bad "resume: $(tail -5 "$S/b2.log")"
  grep -q "resumed from $S/b/checkpoints/step-00000003 at step 3" "$S/b2.log" && ok "resumed at step 3" || bad "resume message missing"
  # Both rank files, bit for bit, and no NaN or infinity on either side (lib.sh).
  same_checkpoint "$S/a/checkpoints/step-00000006" "$S/b/checkpoints/step-00000006" "($scenario)"
  # The comparison can fail: step 3 and step 6 differ.
  h5diff -q "$S/b/checkpoints/step-00000003/rank-00000.h5" "$S/a/checkpoints/step-00000006/rank-00000.h5" /generator /generator > /dev/null 2>&1 \
    && bad "h5diff saw no difference between step 3 and step 6" || ok "h5diff detects a different state"
done
rm -rf "$T"
finish
