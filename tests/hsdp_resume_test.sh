#!/usr/bin/env bash
# HSDP checkpoints at another world size (issue 23): a checkpoint keeps the full-sharding
# layout whatever replicate_degree wrote it, so it resumes at any N and any R.
#  1. 6 steps at N = 4 with R = 2 (2 replica groups of 2), checkpoints every 3 steps; the
#     step-3 checkpoint resumed at N = 2 and at N = 3 with full sharding (R = 1) to step 6
#     equals the uninterrupted run within 1e-9 relative per tensor (shardgan-ckpt diff:
#     parameters, optimizer state, EMA). float64 DCGAN at ZeRO-3; only the reduction order
#     differs (measured 1.3e-15 and 1.5e-15).
#  2. The other way: 6 steps at N = 2 with R = 1, resumed from step 3 at N = 4 with R = 2.
# The comparison can fail: step 3 against step 6 differs (max rel 1.6).
TRAIN=$1; CKPT=$2; SRC=$3
source "$(dirname "$0")/lib.sh"
T=$(mktemp -d /tmp/shardgan-hsdp-resume.XXXXXX)
C=("$SRC/configs/fmnist-dcgan.yaml" --set data.source=synthetic --set data.synthetic_size=128
   --set train.global_batch=24 --set model.z_dim=16 --set model.g_width=8 --set model.d_width=8
   --set model.dtype=float64 --set train.log_every=1 --set train.sample_every=0 --set run.seed=5
   --set train.plots=false --set train.checkpoint_every=3 --set train.keep_checkpoints=10)
hsdp() { echo --set sharding.generator.replicate_degree=$1 --set sharding.discriminator.replicate_degree=$1; }
run() {  # run NAME NP R [args...]
  local name=$1 np=$2 r=$3; shift 3
  timeout 300 "${MPIRUN[@]}" -np "$np" "$TRAIN" "${C[@]}" $(hsdp "$r") --set train.steps=6 --set run.dir="$T/$name" "$@" \
    > "$T/$name.log" 2>&1 && ok "$name: N = $np, R = $r" || bad "$name: $(tail -3 "$T/$name.log")"
}
run hsdp4 4 2
for np in 2 3; do
  run "full$np" "$np" 1 --resume "$T/hsdp4/checkpoints/step-00000003"
  checkpoints_within "$T/hsdp4/checkpoints/step-00000006" "$T/full$np/checkpoints/step-00000006" 1e-9 \
    "R = 2 at N = 4 resumed with R = 1 at N = $np"
done
run full2b 2 1
run hsdp4b 4 2 --resume "$T/full2b/checkpoints/step-00000003"
checkpoints_within "$T/full2b/checkpoints/step-00000006" "$T/hsdp4b/checkpoints/step-00000006" 1e-9 \
  "R = 1 at N = 2 resumed with R = 2 at N = 4"
"$CKPT" diff "$T/hsdp4/checkpoints/step-00000003" "$T/full2/checkpoints/step-00000006" --rtol 1e-9 > /dev/null 2>&1 \
  && bad "the comparison saw no difference between step 3 and step 6" || ok "the comparison detects a different state"
rm -rf "$T"
finish
