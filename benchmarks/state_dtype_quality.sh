#!/usr/bin/env bash
# Sample quality with Adam's states in float32, int8 (block-wise 8-bit) and bfloat16, at
# equal steps: CONFIG as shipped on NP ranks, each dtype for both models
# (optim.<model>.state_dtype), SEEDS seeds each, evaluated once at the end (FID of G and of
# the EMA, and class accuracy, on the project classifier with 2,000 images). One line of
# JSON per run; then, per dtype, the mean and standard deviation over the seeds, and whether
# each mean lies within the float32 runs' mean +- 2 standard deviations.
# Not a timed test: run it on an idle machine.
#   benchmarks/state_dtype_quality.sh [build dir] [out jsonl]
# Environment: CONFIG (configs/fmnist-dcgan.yaml), SEEDS ("1 2 3"), DTYPES ("float32 int8
# bfloat16"), STEPS (the config's), NP (2), SET (more key=value overrides), WORK
# (runs/state-dtype-quality).
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}; OUT=${2:-benchmarks/results/state_dtype_quality.jsonl}
CONFIG=${CONFIG:-configs/fmnist-dcgan.yaml}; SEEDS=${SEEDS:-"1 2 3"}; DTYPES=${DTYPES:-"float32 int8 bfloat16"}
NP=${NP:-2}; WORK=${WORK:-runs/state-dtype-quality}
SET_ARGS=(); for kv in ${SET:-}; do SET_ARGS+=(--set "$kv"); done
[ -n "${STEPS:-}" ] && SET_ARGS+=(--set train.steps="$STEPS")
PY=${SHARDGAN_PYTHON:-.venv/bin/python}
[ "$(id -u)" -eq 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
[ -f runs/fmnist-classifier.h5 ] || "$BUILD/shardgan-fid" train-classifier -o runs/fmnist-classifier.h5 || exit 1
mkdir -p "$WORK" "$(dirname "$OUT")"
COMMIT=$(git rev-parse --short HEAD)
NAME=$(basename "$CONFIG" .yaml)
for seed in $SEEDS; do
  for dt in $DTYPES; do
    run="$NAME-$dt-seed$seed"; rm -rf "${WORK:?}/$run"
    t0=$(date +%s.%N)
    mpirun -np "$NP" --oversubscribe --bind-to none "$BUILD/shardgan-train" "$CONFIG" \
      --set optim.generator.state_dtype="$dt" --set optim.discriminator.state_dtype="$dt" \
      --set run.seed="$seed" --set train.eval_every=0 --set train.checkpoint_every=0 --set train.sample_every=0 \
      --set eval.enabled=true --set eval.classifier=runs/fmnist-classifier.h5 --set run.dir="$WORK/$run" \
      "${SET_ARGS[@]}" > "$WORK/$run.log" 2>&1 || { echo "run $run failed: $WORK/$run.log" >&2; exit 1; }
    t1=$(date +%s.%N)
    "$PY" - "$WORK/$run" "$NAME" "$dt" "$seed" "$t0" "$t1" "$COMMIT" "$NP" "${SET:-}" <<'PY' | tee -a "$OUT"
import json, sys
d, config, dt, seed, t0, t1, commit, np_, overrides = sys.argv[1:]
ev = [json.loads(l) for l in open(f"{d}/metrics.jsonl") if '"fid' in l]
mem = json.load(open(f"{d}/memory.json"))
states = {m: mem[f"{m}_accounting_rank0"]["optimizer_state_bytes"] for m in ("generator", "discriminator")}
print(json.dumps({"bench": "state_dtype_quality", "commit": commit, "config": config, "state_dtype": dt,
                  "world_size": int(np_), "seed": int(seed), "set": overrides.split(),
                  "run_wall_s": float(t1) - float(t0), "optimizer_state_bytes_rank0": states,
                  "peak_rss_bytes_per_rank": mem["peak_rss_bytes_per_rank"], "eval": ev[-1] if ev else None}))
PY
  done
done
"$PY" - "$OUT" "$COMMIT" "$NAME" <<'PY' | tee -a "$OUT"
import json, statistics, sys
out, commit, config = sys.argv[1:]
rows = [json.loads(l) for l in open(out)]
rows = [r for r in rows if r.get("bench") == "state_dtype_quality" and r["commit"] == commit and r["config"] == config
        and r["eval"]]
keys = [k for k in ("fid", "fid_ema", "class_acc", "class_acc_ema") if rows and k in rows[0]["eval"]]
stats = {}
for dt in sorted({r["state_dtype"] for r in rows}):
    rs = [r for r in rows if r["state_dtype"] == dt]
    stats[dt] = {k: (statistics.mean(r["eval"][k] for r in rs),
                     statistics.stdev(r["eval"][k] for r in rs) if len(rs) > 1 else 0.0) for k in keys}
    stats[dt]["seeds"] = len(rs)
ref = stats.get("float32")
for dt, s in stats.items():
    within = {k: abs(s[k][0] - ref[k][0]) <= 2 * ref[k][1] for k in keys} if ref else {}
    print(json.dumps({"bench": "state_dtype_quality_spread", "commit": commit, "config": config, "state_dtype": dt,
                      "seeds": s["seeds"], **{k: {"mean": s[k][0], "sd": s[k][1]} for k in keys},
                      "within_float32_spread": within}))
PY
