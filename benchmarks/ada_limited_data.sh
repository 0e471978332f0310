#!/usr/bin/env bash
# ADA's headline claim on limited data (Karras et al. 2020, arXiv:2006.06676, Fig. 1), at the
# scale of this machine: configs/fmnist-stylegan2.yaml on the first 2,000 Fashion-MNIST
# training images (scripts/fmnist_subset.py), the same steps with ADA (augment.mode ada,
# bgc) and without, per seed. Each run logs r_t, p and the FID of G and of its EMA
# (project classifier, 2,000 images against t10k) every EVAL_EVERY steps; one line of JSON
# per run with its curve, then benchmarks/ada_limited_data_plot.py draws r_t, p and FID over
# steps. The two runs of a seed train side by side, one rank each (one thread each), so
# that both see the same machine load. Not a timed test: run it on an idle machine.
#   benchmarks/ada_limited_data.sh [build dir] [out jsonl]
# Environment: SEEDS ("1 2"), STEPS (800), EVAL_EVERY (200), IMAGES (2000), SPEED_KIMG (20:
# the authors' 500 kimg is for runs of thousands of kimg), WORK (runs/ada-limited).
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}; OUT=${2:-benchmarks/results/ada_limited_data.jsonl}
SEEDS=${SEEDS:-"1 2"}; STEPS=${STEPS:-800}; EVAL_EVERY=${EVAL_EVERY:-200}; IMAGES=${IMAGES:-2000}
SPEED_KIMG=${SPEED_KIMG:-20}
PY=${SHARDGAN_PYTHON:-.venv/bin/python}
[ "$(id -u)" -eq 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
[ -f runs/fmnist-classifier.h5 ] || { echo "runs/fmnist-classifier.h5 is missing: run scripts/demo.sh once" >&2; exit 1; }
WORK=${WORK:-runs/ada-limited}; mkdir -p "$WORK" "$(dirname "$OUT")"
DATA="$WORK/fmnist-$IMAGES.h5"
[ -f "$DATA" ] || "$PY" scripts/fmnist_subset.py "$IMAGES" "$DATA" || exit 1
COMMIT=$(git rev-parse --short HEAD)
run() {  # run NAME SEED ARGS...
  local name=$1 seed=$2; shift 2
  rm -rf "${WORK:?}/$name"
  mpirun -np 1 --bind-to none "$BUILD/shardgan-train" configs/fmnist-stylegan2.yaml \
    --set data.source=hdf5 --set data.path="$DATA" --set run.seed="$seed" --set train.steps="$STEPS" \
    --set train.threads=1 --set train.log_every=10 --set train.sample_every=0 --set train.checkpoint_every=0 \
    --set train.final_checkpoint=false --set eval.enabled=true --set train.eval_every="$EVAL_EVERY" \
    --set eval.classifier=runs/fmnist-classifier.h5 --set run.dir="$WORK/$name" "$@" > "$WORK/$name.log" 2>&1
}
for seed in $SEEDS; do
  run "noada-seed$seed" "$seed" & a=$!
  run "ada-seed$seed" "$seed" --set augment.mode=ada --set augment.speed_kimg="$SPEED_KIMG" & b=$!
  wait $a || { echo "run noada-seed$seed failed: $WORK/noada-seed$seed.log" >&2; exit 1; }
  wait $b || { echo "run ada-seed$seed failed: $WORK/ada-seed$seed.log" >&2; exit 1; }
  for mode in noada ada; do
    "$PY" - "$WORK/$mode-seed$seed" "$mode" "$seed" "$COMMIT" "$IMAGES" "$SPEED_KIMG" <<'PY' | tee -a "$OUT"
import json, sys
d, mode, seed, commit, images, speed = sys.argv[1:]
rows = [json.loads(l) for l in open(f"{d}/metrics.jsonl")]
train = [r for r in rows if "loss_d" in r]
ev = [r for r in rows if "fid" in r]
print(json.dumps({"bench": "ada_limited_data", "commit": commit, "mode": mode, "seed": int(seed),
                  "images": int(images), "speed_kimg": float(speed), "steps": train[-1]["step"],
                  "r_t": [[r["step"], r["r_t"]] for r in train],
                  "p": [[r["step"], r.get("ada_p", 0.0)] for r in train],
                  "fid": [[r["step"], r["fid"], r.get("fid_ema")] for r in ev],
                  "training_s": sum(r["step_time_s"] for r in train)}))
PY
  done
done
