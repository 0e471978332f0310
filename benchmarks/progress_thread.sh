#!/usr/bin/env bash
# The MPI progress thread (dist.progress_thread) against none, on the BigGAN of
# configs/biggan-1b.yaml (width CH, stage STAGE, N ranks, bfloat16 compute and reduce), one
# run per setting, the settings interleaved ROUNDS times so that drift of the shared guest
# hits each alike. Prints one JSON line per run: median step time over steps 2..STEPS,
# exposed collective time (the compute thread inside a collective call), system and user
# seconds per step (rank 0, /proc), and whether the losses equal the run without the thread
# bit for bit (they must: only when data moves changes, not what).
#   benchmarks/progress_thread.sh [build dir] [out.jsonl]
#   env: CH (64), N (2), STAGE (3), STEPS (3), ROUNDS (1), INTERVALS ("off 200" : "off" is
#        no thread, a number the poll interval in microseconds)
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}; OUT=${2:-benchmarks/results/progress_thread.jsonl}
CH=${CH:-64}; N=${N:-2}; STAGE=${STAGE:-3}; STEPS=${STEPS:-3}; ROUNDS=${ROUNDS:-1}
INTERVALS=${INTERVALS:-"off 200"}
PY=${SHARDGAN_PYTHON:-.venv/bin/python}
[ "$(id -u)" -eq 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$(dirname "$OUT")"
WORK=${TMPDIR:-/tmp}/shardgan-progress-bench
rm -rf "$WORK"; mkdir -p "$WORK"
for round in $(seq 1 "$ROUNDS"); do
  for iv in $INTERVALS; do
    RUN=$WORK/r$round-$iv
    PT=(--set dist.progress_thread=false)
    [ "$iv" != off ] && PT=(--set dist.progress_thread=true --set dist.progress_interval_us="$iv")
    mpirun -np "$N" --oversubscribe "$BUILD/shardgan-train" configs/biggan-1b.yaml \
      --set model.ch="$CH" --set model.d_ch="$CH" \
      --set sharding.generator.stage="$STAGE" --set sharding.discriminator.stage="$STAGE" \
      --set train.steps="$STEPS" --set train.checkpoint_every=0 \
      "${PT[@]}" --set run.dir="$RUN" > "$RUN.log" 2>&1 \
      || { echo "run $RUN failed: $RUN.log" >&2; tail -5 "$RUN.log" >&2; exit 1; }
    "$PY" - "$RUN" "$CH" "$N" "$STAGE" "$iv" "$round" "$WORK/r1-off" <<'PY' | tee -a "$OUT"
import json, statistics, sys
run, ch, n, stage, iv, rnd, ref = sys.argv[1:8]
rows = [json.loads(l) for l in open(run + "/metrics.jsonl") if '"loss_d"' in l]
later = rows[1:] or rows
med = lambda k: statistics.median(r[k] for r in later)
losses = [(r["loss_d"], r["loss_g"]) for r in rows]
try:
    same = losses == [(r["loss_d"], r["loss_g"]) for r in (json.loads(l) for l in open(ref + "/metrics.jsonl")) if "loss_d" in r]
except OSError:
    same = None
mem = json.load(open(run + "/memory.json"))
print(json.dumps({"bench": "progress_thread", "ch": int(ch), "world_size": int(n), "stage": int(stage),
                  "progress_interval_us": None if iv == "off" else float(iv), "round": int(rnd),
                  "step_s": round(med("step_time_s"), 3), "exposed_comm_s": round(med("exposed_comm_s"), 3),
                  "system_s": round(med("system_s"), 3), "user_s": round(med("user_s"), 3),
                  "exposed_fraction": round(med("exposed_comm_s") / med("step_time_s"), 4),
                  "losses_equal_no_thread": same,
                  "vmhwm_gib": round(max(mem["peak_rss_bytes_per_rank"]) / 2**30, 3),
                  "steps": [round(r["step_time_s"], 3) for r in rows]}))
PY
    rm -rf "$RUN/checkpoints"
  done
done
