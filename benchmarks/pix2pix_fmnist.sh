#!/usr/bin/env bash
# Edges -> image on Fashion-MNIST (configs/fmnist-pix2pix.yaml, 2 ranks, ZeRO-3): pix2pix
# (cGAN + 100 L1) against the same U-Net trained on L1 alone (train.adversarial_weight 0,
# the paper's "L1" row) and against the identity (the edge map A itself scored as the
# output). Each trained run is scored at its end on the 10,000 held-out t10k pairs by
# `shardgan-ckpt eval` (L1 on [-1, 1], PSNR and SSIM on [0, 1], FID and class coverage on
# the project classifier). One JSON line per row. Not a timed test: run it on an idle machine.
#   benchmarks/pix2pix_fmnist.sh [build dir] [out jsonl]
# Environment: STEPS (800, about 5 minutes per run on the 2-core guest), SEEDS ("1").
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}; OUT=${2:-benchmarks/results/pix2pix_fmnist.jsonl}
STEPS=${STEPS:-800}; SEEDS=${SEEDS:-1}
PY=${SHARDGAN_PYTHON:-.venv/bin/python}
[ "$(id -u)" -eq 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
[ -f runs/fmnist-classifier.h5 ] || { echo "runs/fmnist-classifier.h5 is missing: run scripts/demo.sh once" >&2; exit 1; }
WORK=${WORK:-runs/pix2pix-fmnist}; mkdir -p "$WORK" "$(dirname "$OUT")"
COMMIT=$(git rev-parse --short HEAD)
row() {  # row NAME SEED RUN_DIR WALL_S EVAL_JSON
  "$PY" - "$@" "$COMMIT" "$STEPS" <<'PY' | tee -a "$OUT"
import json, sys
name, seed, d, wall, ev, commit, steps = sys.argv[1:]
ev = json.loads(ev)
steps_s = [json.loads(l)["step_time_s"] for l in open(f"{d}/metrics.jsonl") if '"loss_d"' in l] if d != "-" else []
print(json.dumps({"bench": "pix2pix_fmnist", "commit": commit, "row": name, "seed": int(seed),
                  "steps": int(steps) if d != "-" else 0, "run_wall_s": float(wall),
                  "median_step_s": sorted(steps_s)[len(steps_s) // 2] if steps_s else None,
                  "l1": ev.get("l1"), "psnr": ev.get("psnr"), "ssim": ev.get("ssim"), "fid": ev.get("fid"),
                  "class_fractions": ev.get("class_fractions"), "eval_samples": ev.get("samples")}))
PY
}
for seed in $SEEDS; do
  for name in pix2pix l1; do
    adv=1; [ $name = l1 ] && adv=0
    dir="$WORK/$name-seed$seed"; rm -rf "$dir"
    t0=$(date +%s.%N)
    mpirun -np 2 --bind-to none "$BUILD/shardgan-train" configs/fmnist-pix2pix.yaml --set run.seed="$seed" \
      --set train.steps="$STEPS" --set train.adversarial_weight=$adv --set train.checkpoint_every=0 \
      --set train.sample_every=0 --set run.dir="$dir" > "$dir.log" 2>&1 || { echo "run $dir failed: $dir.log" >&2; exit 1; }
    t1=$(date +%s.%N)
    ev=$("$BUILD/shardgan-ckpt" eval "$dir" -n 10000 --classifier runs/fmnist-classifier.h5) || exit 1
    row "$name" "$seed" "$dir" "$("$PY" -c "print($t1 - $t0)")" "$ev"
    if [ $name = pix2pix ] && [ "$seed" = "$(echo $SEEDS | cut -d' ' -f1)" ]; then
      ev=$("$BUILD/shardgan-ckpt" eval "$dir" -n 10000 --identity --classifier runs/fmnist-classifier.h5) || exit 1
      row identity "$seed" - 0 "$ev"
    fi
  done
done
