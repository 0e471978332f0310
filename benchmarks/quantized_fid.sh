#!/usr/bin/env bash
# The demo (configs/fmnist-dcgan.yaml: DCGAN on Fashion-MNIST, 2 ranks, ZeRO-3, 1500 steps)
# trained plain and with ZeRO++'s quantized collectives on (int8 weights, GBITS gradients, for
# G and D), for each seed in SEEDS: the final FID of G and of its EMA (2,000 samples, the
# project's classifier), so the quantized runs can be compared with the plain runs' own
# spread over seeds. One JSON line per run.
#   benchmarks/quantized_fid.sh [build dir] [out.jsonl]      env: SEEDS ("1 2 3"), GBITS (int4)
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}; OUT=${2:-benchmarks/results/quantized_fid.jsonl}
SEEDS=${SEEDS:-1 2 3}; GBITS=${GBITS:-int4}
[ "$(id -u)" -eq 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
WORK=${WORK:-/tmp/shardgan-quantized-fid}; mkdir -p "$WORK" "$(dirname "$OUT")"
COMMIT=$(git rev-parse --short HEAD)
CLASSIFIER=runs/fmnist-classifier.h5  # as scripts/demo.sh makes it
[ -f "$CLASSIFIER" ] || { mkdir -p runs; "$BUILD/shardgan-fid" train-classifier -o "$CLASSIFIER"; }
for seed in $SEEDS; do
  for mode in plain quantized; do
    Q=()
    [ $mode = quantized ] && for m in generator discriminator; do
      Q+=(--set sharding.$m.quantized_weights=int8 --set sharding.$m.quantized_gradients=$GBITS)
    done
    R=$WORK/$mode-s$seed; rm -rf "$R"
    mpirun -np 2 --bind-to none "$BUILD/shardgan-train" configs/fmnist-dcgan.yaml --set run.seed=$seed --set train.steps=1500 --set train.eval_every=500 \
      --set train.plots=false --set eval.enabled=true --set eval.classifier="$CLASSIFIER" "${Q[@]}" --set run.dir="$R" > "$R.log" 2>&1 || { echo "$mode seed $seed failed: $R.log" >&2; exit 1; }
    python3 - "$R" "$mode" "$seed" "$COMMIT" "$GBITS" <<'PY' | tee -a "$OUT"
import json, sys
run, mode, seed, commit, gbits = sys.argv[1:]
rows = [json.loads(l) for l in open(run + "/metrics.jsonl")]
ev = [r for r in rows if "fid" in r][-1]
steps = [r for r in rows if "step_time_s" in r]
print(json.dumps({"bench": "quantized_fid", "commit": commit, "mode": mode, "gradient_bits": gbits, "seed": int(seed),
                  "step": ev["step"], "fid": round(ev["fid"], 2), "fid_ema": round(ev.get("fid_ema", float("nan")), 2),
                  "mean_step_s": round(sum(r["step_time_s"] for r in steps) / len(steps), 4),
                  "comm_bytes_world_per_step": round(sum(r.get("comm_bytes_world", 0) for r in steps) / len(steps))}))
PY
    rm -rf "$R/checkpoints"
  done
done
