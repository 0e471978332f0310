#!/usr/bin/env bash
# ZeRO stage 3 against stage 0 on the same model, run back to back ROUNDS times: the BigGAN
# of configs/biggan-1b.yaml at width CH (default 32: 262.3M parameters, the largest whose
# stage 0 fits 2 ranks on a 24 GiB machine), N ranks, STEPS steps. Prints one JSON line per
# run: median step time over steps 2..STEPS, exposed collective time, the losses and the
# largest rank's VmHWM. The issue-21 target: stage 3 at most 1.05x stage 0.
#   benchmarks/stage3_vs_stage0.sh [build dir] [out.jsonl]     env: CH, N, STEPS, ROUNDS
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}; OUT=${2:-benchmarks/results/stage3_vs_stage0.jsonl}
CH=${CH:-32}; N=${N:-2}; STEPS=${STEPS:-4}; ROUNDS=${ROUNDS:-2}
PY=${SHARDGAN_PYTHON:-.venv/bin/python}
[ "$(id -u)" -eq 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
WORK=${TMPDIR:-/tmp}/shardgan-stage3-vs-0
mkdir -p "$WORK" "$(dirname "$OUT")"
for round in $(seq 1 "$ROUNDS"); do
  for st in 0 3; do
    R=$WORK/s$st-r$round; rm -rf "$R"
    mpirun -np "$N" --oversubscribe "$BUILD/shardgan-train" configs/biggan-1b.yaml \
      --set model.ch="$CH" --set model.d_ch="$CH" --set sharding.generator.stage=$st \
      --set sharding.discriminator.stage=$st --set train.steps="$STEPS" --set run.dir="$R" > "$R.log" 2>&1 \
      || { echo "stage $st failed: $R.log" >&2; exit 1; }
    "$PY" - "$R" "$st" "$round" "$N" <<'PY' | tee -a "$OUT"
import json, statistics, sys
run, st, rnd, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
r = [json.loads(l) for l in open(run + "/metrics.jsonl") if '"loss_d"' in l]
m = json.load(open(run + "/memory.json"))
params = m["preflight"]["generator_params"] + m["preflight"]["discriminator_params"] if m.get("preflight") else None
print(json.dumps({"bench": "stage3_vs_stage0", "params": params, "world_size": n, "stage": st, "round": rnd,
                  "step_s": round(statistics.median(x["step_time_s"] for x in r[1:]), 3),
                  "steps": [round(x["step_time_s"], 2) for x in r],
                  "exposed_comm_s": round(statistics.median(x["exposed_comm_s"] for x in r[1:]), 3),
                  "losses": [(x["loss_d"], x["loss_g"]) for x in r],
                  "vmhwm_gib": round(max(m["peak_rss_bytes_per_rank"]) / 2**30, 3)}))
PY
    rm -rf "$R/checkpoints"
  done
done
