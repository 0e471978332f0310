#!/usr/bin/env bash
# Sample quality at (about) equal wall time, simultaneous against alternating update, on one
# set of ranks: configs/fmnist-biggan.yaml on 2 ranks with its former d_steps 2 and EMA
# (decay 0.98 from step 300), pinned here so the recorded figures reproduce; the alternating run ALT_STEPS steps
# and the simultaneous run the same steps times RATIO (its measured images-per-second gain,
# docs/results.md#the-update-rule), so that both get about the same minutes. Evaluated at
# the end (FID and class accuracy of G and of the EMA on the project classifier). One
# line of JSON per run with its wall time. Not a timed test: run it on an idle machine.
#   benchmarks/paragan_fid.sh [build dir] [out jsonl]
# Environment: SEEDS ("1"), ALT_STEPS (2500), RATIO (1.13).
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}; OUT=${2:-benchmarks/results/paragan_fid.jsonl}
SEEDS=${SEEDS:-1}; ALT_STEPS=${ALT_STEPS:-2500}; RATIO=${RATIO:-1.13}
PY=${SHARDGAN_PYTHON:-.venv/bin/python}
[ "$(id -u)" -eq 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
[ -f runs/fmnist-classifier.h5 ] || { echo "runs/fmnist-classifier.h5 is missing: run scripts/demo.sh once" >&2; exit 1; }
WORK=${WORK:-runs/paragan-fid}; mkdir -p "$WORK" "$(dirname "$OUT")"
COMMIT=$(git rev-parse --short HEAD)
for seed in $SEEDS; do
  for upd in alternating simultaneous; do
    steps=$ALT_STEPS; [ $upd = simultaneous ] && steps=$("$PY" -c "print(round($ALT_STEPS * $RATIO))")
    name="$upd-seed$seed"; rm -rf "$WORK/$name"
    t0=$(date +%s.%N)
    mpirun -np 2 --bind-to none "$BUILD/shardgan-train" configs/fmnist-biggan.yaml --set train.update=$upd \
      --set train.d_steps=2 --set ema.decay=0.98 --set ema.start_step=300 --set train.eval_every=0 \
      --set run.seed="$seed" --set train.steps="$steps" --set train.checkpoint_every=0 --set train.sample_every=0 \
      --set eval.enabled=true --set eval.classifier=runs/fmnist-classifier.h5 --set run.dir="$WORK/$name" \
      > "$WORK/$name.log" 2>&1 || { echo "run $name failed: $WORK/$name.log" >&2; exit 1; }
    t1=$(date +%s.%N)
    "$PY" - "$WORK/$name" "$upd" "$seed" "$steps" "$t0" "$t1" "$COMMIT" <<'PY' | tee -a "$OUT"
import json, sys
d, upd, seed, steps, t0, t1, commit = sys.argv[1:]
ev = [json.loads(l) for l in open(f"{d}/metrics.jsonl") if '"fid' in l]
train_s = sum(json.loads(l)["step_time_s"] for l in open(f"{d}/metrics.jsonl") if '"loss_d"' in l)
print(json.dumps({"bench": "paragan_fid", "commit": commit, "update": upd, "seed": int(seed), "steps": int(steps),
                  "training_s": train_s, "run_wall_s": float(t1) - float(t0), "eval": ev[-1] if ev else None}))
PY
  done
done
