#!/usr/bin/env bash
# Training step time and peak RSS with the optimizer state in memory, in the cpu tier and
# on disk, for the same run (2 ranks, stage 3, synthetic data so that the loader is not
# measured). Prints one JSON object per setting; the step time is the median over the
# steps after the first 5 (metrics.jsonl's step_time_s, log_every 1).
#   benchmarks/offload_overhead.sh BUILD_DIR OUT_DIR STEPS WIDTH [NP] [GLOBAL_BATCH]
set -euo pipefail
PY=${SHARDGAN_PYTHON:-$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python}   # made by scripts/setup.sh
BUILD=$1; OUT=$2; STEPS=$3; WIDTH=$4; NP=${5:-2}; BATCH=${6:-32}
SRC=$(cd "$(dirname "$0")/.." && pwd)
[ "$(id -u)" -eq 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$OUT"
for dev in none cpu disk none; do  # "none" twice: the spread between its two runs is the noise
  dir="$OUT/w$WIDTH-$dev-$RANDOM"
  mpirun --oversubscribe -np "$NP" "$BUILD/shardgan-train" "$SRC/configs/fmnist-dcgan.yaml" \
    --set model.g_width="$WIDTH" --set model.d_width="$WIDTH" --set data.source=synthetic --set train.global_batch="$BATCH" \
    --set data.synthetic_size=2048 --set train.steps="$STEPS" --set train.log_every=1 \
    --set train.sample_every=0 --set train.checkpoint_every=0 --set train.plots=false \
    --set offload.generator.optimizer=$dev --set offload.discriminator.optimizer=$dev \
    --set run.dir="$dir" > "$dir.log" 2>&1
  "$PY" - "$dir" "$dev" "$WIDTH" "$NP" "$BATCH" <<'PY'
import json, sys, statistics
d, dev, width, np_ = sys.argv[1:5]
rows = [json.loads(l) for l in open(d + "/metrics.jsonl") if '"step_time_s"' in l]
t = statistics.median(r["step_time_s"] for r in rows[5:])
mem = json.load(open(d + "/memory.json"))
g = mem["generator_accounting_rank0"]; dd = mem["discriminator_accounting_rank0"]
print(json.dumps({"benchmark": "offload_overhead", "offload": dev, "width": int(width), "ranks": int(np_),
                  "global_batch": int(sys.argv[5]),
                  "steps_timed": len(rows) - 5, "median_step_s": t,
                  "peak_rss_bytes_per_rank": mem["peak_rss_bytes_per_rank"],
                  "optimizer_ram_bytes_rank0": g["optimizer_state_bytes"] + dd["optimizer_state_bytes"],
                  "offloaded_bytes_rank0": g["offloaded_bytes"] + dd["offloaded_bytes"]}))
PY
  rm -rf "$dir"
done
