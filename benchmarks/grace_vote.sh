#!/usr/bin/env bash
# What train.preempt_grace_s costs when no signal comes: with a grace period the ranks
# vote, inside the step, on abandoning it (Trainer::grace_vote). Shared placement votes at
# every unit forward; the vote is pipelined (posted at one unit as a non-blocking
# all-gather, read at the next), so no rank waits for it. This runs the shipped DCGAN on
# synthetic data (CONFIG: another shipped config) at ZeRO stage 3 on NP ranks (default 2; the most unit forwards per step), with
# preempt_grace_s 0 and 60, alternating the two REPS times, and prints one JSON line per
# run with the mean step time of steps 6.. (metrics.jsonl's step_time_s) and the CPU model.
#   benchmarks/grace_vote.sh [shardgan-train] [steps] [reps] [out.jsonl]
set -uo pipefail
cd "$(dirname "$0")/.."
TRAIN=${1:-build/shardgan-train}; STEPS=${2:-60}; REPS=${3:-3}; OUT=${4:-benchmarks/results/grace_vote.jsonl}; NP=${NP:-2}
CONFIG=${CONFIG:-configs/fmnist-dcgan.yaml}  # e.g. configs/fmnist-biggan.yaml: more units per step
[ "$(id -u)" -eq 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
PY=.venv/bin/python; [ -x "$PY" ] || PY=python3
CPU=$(lscpu | grep -m1 'Model name' | sed 's/Model name: *//')
COMMIT=$("$TRAIN" --version 2>/dev/null | head -1 | sed -n "s/.*(\(.*\)).*/\1/p")  # the binary's build commit
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
mkdir -p "$(dirname "$OUT")"
for rep in $(seq 1 "$REPS"); do
  for grace in 0 60; do
    dir=$TMP/g$grace-$rep
    mpirun -np "$NP" --oversubscribe "$TRAIN" "$CONFIG" --set data.source=synthetic --set eval.enabled=false \
      --set run.dir="$dir" --set train.steps="$STEPS" --set sharding.generator.stage=3 \
      --set sharding.discriminator.stage=3 --set train.preempt_grace_s=$grace --set train.log_every=1 \
      --set train.checkpoint_every=0 --set train.final_checkpoint=false --set train.sample_every=0 \
      > "$dir.log" 2>&1 < /dev/null || { echo "run failed: $dir.log" >&2; tail -20 "$dir.log" >&2; exit 1; }
    "$PY" - "$dir/metrics.jsonl" "$grace" "$rep" "$CPU" "$COMMIT" "$NP" "$CONFIG" <<'PYEOF' | tee -a "$OUT"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"step_time_s"' in l]
t = [r["step_time_s"] for r in rows if r.get("step", 0) > 5]
print(json.dumps({"bench": "grace_vote", "preempt_grace_s": float(sys.argv[2]), "rep": int(sys.argv[3]), "ranks": int(sys.argv[6]), "config": sys.argv[7],
                  "steps": len(t), "mean_step_s": sum(t) / len(t), "cpu": sys.argv[4], "commit": sys.argv[5]}))
PYEOF
  done
done
