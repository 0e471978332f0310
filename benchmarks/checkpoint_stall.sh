#!/usr/bin/env bash
# The training stall per checkpoint save, synchronous against checkpoint.async (fork and copy
# snapshots): the BigGAN of configs/biggan-1b.yaml at width CH (64: 1.03e9 parameters; 32:
# 262M), N ranks, ZeRO-3, a save after each of SAVES steps (the final save, synchronous in
# every mode, is not counted). Prints one JSON line per mode: the stall of each periodic save
# (from the trainer's log), its mean as a share of the median step, the step times, the
# background write time, the run's wall time, the largest rank's VmHWM and the node's peak
# memory in use (MemTotal - MemAvailable, sampled every 0.2 s: a fork snapshot's copied pages
# are outside the ranks' RSS). The pre-flight counts a fork snapshot's worst case (every page
# rewritten before the child has written it), which does not fit 1e9 on 2 ranks in 24 GiB:
# MODES other than sync run with train.skip_memory_check: true, and the measured peak says
# what it really cost.
#   benchmarks/checkpoint_stall.sh [build dir] [out.jsonl]     env: CH, N, SAVES, MODES
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}; OUT=${2:-benchmarks/results/checkpoint_stall.jsonl}
CH=${CH:-64}; N=${N:-2}; SAVES=${SAVES:-5}; MODES=${MODES:-sync fork}
PY=${SHARDGAN_PYTHON:-.venv/bin/python}
[ "$(id -u)" -eq 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
WORK=${WORK:-/tmp/shardgan-checkpoint-stall}
mkdir -p "$WORK" "$(dirname "$OUT")"
COMMIT=$(git rev-parse --short HEAD)
for mode in $MODES; do
  R=$WORK/ch$CH-$mode; rm -rf "$R"
  ASYNC=(--set checkpoint.async=false)
  [ "$mode" != sync ] && ASYNC=(--set checkpoint.async=true --set checkpoint.snapshot="$mode" --set train.skip_memory_check=true)
  ( while :; do awk '/MemTotal/{t=$2} /MemAvailable/{a=$2} END{print t-a}' /proc/meminfo; sleep 0.2; done ) > "$R.mem" &
  MEM_PID=$!
  t0=$(date +%s.%N)
  mpirun -np "$N" --oversubscribe --bind-to none "$BUILD/shardgan-train" configs/biggan-1b.yaml \
    --set model.ch="$CH" --set model.d_ch="$CH" --set train.steps=$((SAVES + 1)) --set train.checkpoint_every=1 \
    --set train.keep_checkpoints=2 "${ASYNC[@]}" --set run.dir="$R" > "$R.log" 2>&1 \
    || { kill $MEM_PID; echo "$mode failed: $R.log" >&2; exit 1; }
  t1=$(date +%s.%N)
  kill $MEM_PID
  "$PY" - "$R" "$mode" "$N" "$CH" "$SAVES" "$COMMIT" "$(echo "$t1 - $t0" | bc)" <<'PY' | tee -a "$OUT"
import json, re, statistics, sys
run, mode, n, ch, saves, commit, wall = sys.argv[1:8]
saves = int(saves)
log = open(run + ".log").read()
if mode == "sync":
    stalls = [float(x) for x in re.findall(r"saved step \d+: [\d.]+ MB on rank 0, training stalled ([\d.]+) s", log)][:saves]
else:
    stalls = [float(x) for x in re.findall(r"saving step \d+ in the background \(\w+ snapshot\): training stalled ([\d.]+) s", log)]
waits = re.findall(r"(\d+) waited for the previous write \(([\d.]+) s\); writing took ([\d.]+) s", log)
r = [json.loads(l) for l in open(run + "/metrics.jsonl") if '"loss_d"' in l]
m = json.load(open(run + "/memory.json"))
mem = [int(x) for x in open(run + ".mem").read().split()]
step = statistics.median(x["step_time_s"] for x in r[1:])
print(json.dumps({"bench": "checkpoint_stall", "commit": commit, "mode": mode, "world_size": int(n), "ch": int(ch),
                  "params": sum(int(x) for x in re.search(r"G (\d+) parameters, D (\d+) parameters", log).groups()),
                  "stall_s": [round(s, 3) for s in stalls], "mean_stall_s": round(statistics.mean(stalls), 3),
                  "median_step_s": round(step, 2), "stall_share_of_step": round(statistics.mean(stalls) / step, 4),
                  "steps_s": [round(x["step_time_s"], 2) for x in r],
                  "waits": int(waits[0][0]) if waits else 0, "waited_s": float(waits[0][1]) if waits else 0.0,
                  "background_write_s": float(waits[0][2]) if waits else 0.0,
                  "wall_s": round(float(wall), 1), "vmhwm_gib": round(max(m["peak_rss_bytes_per_rank"]) / 2**30, 3),
                  "node_mem_in_use_peak_gib": round(max(mem) / 2**20, 2),
                  "losses": [(x["loss_d"], x["loss_g"]) for x in r]}))
PY
  rm -rf "$R/checkpoints"
done
