#!/usr/bin/env bash
# The Colossal-AI pix2pix feature table, reproduced on shardgan: the 57M-parameter pix2pix
# (U-Net G 54.4M + 70x70 PatchGAN D 2.8M) at 256x256, 3 channels, batch 1 per rank, on
# synthetic pairs made by upscaling 32x32 synthetic images to 256x256 (stated as such: the
# facades cannot be fetched here; A is each image's Sobel edge map). Rows: baseline (1 rank,
# stage 0), data parallel (2 ranks), bfloat16 compute, gradient accumulation of 4,
# clipping at norm 2, and ZeRO stages 1, 2, 3 on 2 ranks (stage 3 also on 1 rank).
# Seconds per epoch of 400 pairs (facades' size) are extrapolated from the median of timed
# steps (train.log_every 1, the first WARMUP steps dropped) as 400 / global batch * step.
# One JSON line per row with the peak RSS per rank (VmHWM). Not a timed test.
#   benchmarks/pix2pix_features.sh [build dir] [out jsonl]
# Environment: STEPS (6), WARMUP (2), ROWS (all).
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}; OUT=${2:-benchmarks/results/pix2pix_features.jsonl}
STEPS=${STEPS:-6}; WARMUP=${WARMUP:-2}
PY=${SHARDGAN_PYTHON:-.venv/bin/python}
[ "$(id -u)" -eq 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
WORK=${WORK:-runs/pix2pix-features}; mkdir -p "$WORK" "$(dirname "$OUT")"
COMMIT=$(git rev-parse --short HEAD)
BASE=(configs/fmnist-pix2pix.yaml --set data.source=synthetic --set data.synthetic_size=64 --set model.image_size=256
      --set model.in_channels=3 --set model.channels=3 --set model.d_layers=3 --set train.log_every=1
      --set train.sample_every=0 --set train.checkpoint_every=0 --set train.plots=false --set train.memory_probe=false
      --set train.steps="$STEPS")
both() { echo --set sharding.generator.$1 --set sharding.discriminator.$1; }
declare -A ARGS NP
NP[baseline]=1; ARGS[baseline]="--set train.global_batch=1 $(both stage=0)"
NP[data_parallel]=2; ARGS[data_parallel]="--set train.global_batch=2 $(both stage=0)"
NP[bf16]=1; ARGS[bf16]="--set train.global_batch=1 $(both stage=0) $(both compute_dtype=bfloat16)"
NP[accumulation4]=1; ARGS[accumulation4]="--set train.global_batch=4 --set train.micro_batches=4 $(both stage=0)"
NP[clip2]=1; ARGS[clip2]="--set train.global_batch=1 --set train.grad_clip=2 $(both stage=0)"
NP[zero1]=2; ARGS[zero1]="--set train.global_batch=2 $(both stage=1)"
NP[zero2]=2; ARGS[zero2]="--set train.global_batch=2 $(both stage=2)"
NP[zero3]=2; ARGS[zero3]="--set train.global_batch=2 $(both stage=3)"
NP[zero3_1rank]=1; ARGS[zero3_1rank]="--set train.global_batch=1 $(both stage=3)"
ROWS=${ROWS:-baseline data_parallel bf16 accumulation4 clip2 zero1 zero2 zero3 zero3_1rank}
for row in $ROWS; do
  dir="$WORK/$row"; rm -rf "$dir"
  # shellcheck disable=SC2086
  mpirun -np "${NP[$row]}" --oversubscribe --bind-to none "$BUILD/shardgan-train" "${BASE[@]}" ${ARGS[$row]} \
    --set run.dir="$dir" > "$dir.log" 2>&1 || { echo "row $row failed: $dir.log" >&2; continue; }
  "$PY" - "$dir" "$row" "${NP[$row]}" "$WARMUP" "$COMMIT" "$dir.log" <<'PY' | tee -a "$OUT"
import json, re, sys
d, row, np_, warmup, commit, log = sys.argv[1:]
m = [json.loads(l) for l in open(f"{d}/metrics.jsonl") if '"loss_d"' in l]
t = sorted(r["step_time_s"] for r in m[int(warmup):])
med = t[len(t) // 2]
gb = {"accumulation4": 4}.get(row, int(np_))
hwm = re.search(r"peak RSS \(VmHWM\) per rank: \[([^\]]*)\] GiB", open(log).read())
print(json.dumps({"bench": "pix2pix_features", "commit": commit, "row": row, "ranks": int(np_), "global_batch": gb,
                  "steps_timed": len(t), "median_step_s": med, "epoch_s_400_pairs": med * 400 / gb,
                  "vmhwm_gib_per_rank": [float(x) for x in hwm.group(1).split(",")] if hwm else None,
                  "loss_d_last": m[-1]["loss_d"], "loss_g_last": m[-1]["loss_g"]}))
PY
done
