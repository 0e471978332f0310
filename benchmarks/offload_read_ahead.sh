#!/usr/bin/env bash
# Parameter-offload read-ahead: the BigGAN of configs/biggan-3b-offload.yaml
# (master shards and Adam state on disk, O_DIRECT, bfloat16 compute) at width CH, ZeRO
# stage 3, N ranks, trained STEPS steps with sharding.*.read_ahead off and then on, one run
# after the other. Prints one JSON line per run: the median over steps 2.. of the step
# time and of the time the compute thread spent reading master shards (time_offload_read_s,
# metrics.jsonl: with the read-ahead, only the wait for a read the worker has not finished),
# the VmHWM per rank, and whether the losses agree; then the ratios.
# Not a timed test: run it on an idle machine.
#   benchmarks/offload_read_ahead.sh [build dir] [out jsonl]
# Environment: CH (16), N (2), STEPS (4), OFFLOAD_PATH (a scratch folder on disk).
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}; OUT=${2:-benchmarks/results/offload_read_ahead.jsonl}
CH=${CH:-16}; N=${N:-2}; STEPS=${STEPS:-4}
PY=${SHARDGAN_PYTHON:-.venv/bin/python}
[ "$(id -u)" -eq 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$(dirname "$OUT")"
WORK=${WORK:-runs/offload-read-ahead}   # on the project's disk, not a tmpfs: O_DIRECT reads
rm -rf "$WORK"; mkdir -p "$WORK"
for ra in false true; do
  mkdir -p "$WORK/offload-$ra"
  mpirun -np "$N" --oversubscribe "$BUILD/shardgan-train" configs/biggan-3b-offload.yaml \
    --set model.ch="$CH" --set model.d_ch="$CH" --set train.steps="$STEPS" \
    --set sharding.generator.read_ahead=$ra --set sharding.discriminator.read_ahead=$ra \
    --set offload.path="$WORK/offload-$ra" --set run.dir="$WORK/ra-$ra" > "$WORK/ra-$ra.log" 2>&1 \
    || { echo "run with read_ahead=$ra failed: $WORK/ra-$ra.log" >&2; exit 1; }
  rm -rf "$WORK/ra-$ra/checkpoints" "$WORK/offload-$ra"   # neither is needed after the run
done
"$PY" - "$WORK" "$OUT" "$CH" "$N" <<'PY'
import json, statistics, sys
work, out, ch, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
recs = {}
for ra in ("false", "true"):
    steps = [json.loads(l) for l in open(f"{work}/ra-{ra}/metrics.jsonl") if '"loss_d"' in l]
    mem = json.load(open(f"{work}/ra-{ra}/memory.json"))
    later = steps[1:]
    recs[ra] = {"bench": "offload_read_ahead", "read_ahead": ra == "true",
                "model": f"biggan-3b-offload geometry, ch {ch}", "world_size": n, "steps": len(steps),
                "step_s": statistics.median(r["step_time_s"] for r in later),
                "offload_read_s": statistics.median(r["time_offload_read_s"] for r in later),
                "collective_s": statistics.median(r["time_collective_s"] for r in later),
                "vmhwm_gib_per_rank": [b / 2**30 for b in mem["peak_rss_bytes_per_rank_training"]],
                "losses": [[r["loss_d"], r["loss_g"]] for r in steps]}
summary = {"bench": "offload_read_ahead_summary",
           "step_time_ratio": recs["true"]["step_s"] / recs["false"]["step_s"],
           "offload_read_ratio": recs["true"]["offload_read_s"] / max(recs["false"]["offload_read_s"], 1e-9),
           "losses_identical": recs["true"]["losses"] == recs["false"]["losses"]}
with open(out, "a") as f:
    for r in (recs["false"], recs["true"], summary):
        print(json.dumps(r))
        f.write(json.dumps(r) + "\n")
PY
