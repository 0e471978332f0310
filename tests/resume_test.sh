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
"${MPIRUN[@]}" -np 2 "$TRAIN" "$SRC/configs/fmnist-dcgan.yaml" "${COMMON[@]}" --set train.steps=6 --set run.dir="$T/a" > "$T/a.log" 2>&1 \
  && ok "6 steps straight" || bad "6 steps straight: $(tail -5 "$T/a.log")"
"${MPIRUN[@]}" -np 2 "$TRAIN" "$SRC/configs/fmnist-dcgan.yaml" "${COMMON[@]}" --set train.steps=3 --set run.dir="$T/b" > "$T/b1.log" 2>&1 \
  && ok "3 steps" || bad "3 steps: $(tail -5 "$T/b1.log")"
"${MPIRUN[@]}" -np 2 "$TRAIN" "$SRC/configs/fmnist-dcgan.yaml" "${COMMON[@]}" --set train.steps=6 --set run.dir="$T/b" --resume "$T/b" > "$T/b2.log" 2>&1 \
  && ok "resume to 6 steps" || bad "resume: $(tail -5 "$T/b2.log")"
grep -q "resumed from $T/b/checkpoints/step-00000003 at step 3" "$T/b2.log" && ok "resumed at step 3" || bad "resume message missing"
for r in 00000 00001; do
  A=$T/a/checkpoints/step-00000006/rank-$r.h5; B=$T/b/checkpoints/step-00000006/rank-$r.h5
  for obj in /generator /discriminator /rng; do
    h5diff "$A" "$B" "$obj" "$obj" > "$T/diff.txt" 2>&1 && ok "rank $r $obj bitwise equal" \
      || bad "rank $r $obj differs: $(head -5 "$T/diff.txt")"
  done
done
# The comparison can fail: step 3 and step 6 differ.
h5diff -q "$T/b/checkpoints/step-00000003/rank-00000.h5" "$T/a/checkpoints/step-00000006/rank-00000.h5" /generator /generator > /dev/null 2>&1 \
  && bad "h5diff saw no difference between step 3 and step 6" || ok "h5diff detects a different state"
rm -rf "$T"
finish
