#!/usr/bin/env bash
# Activation checkpointing at a batch where activations dominate: the BigGAN of
# CONFIG (configs/biggan-1b.yaml) at width CH (15: 59.4M parameters), float32 compute, global batch
# BATCH (32 per rank on 2 ranks), ZeRO stage 3, trained STEPS steps with
# sharding.*.activation_checkpointing off and then on, one run after the other. Prints one
# JSON line per run: peak RSS per rank after training (VmHWM, /proc, memory.json), the
# median step time over steps 2.., rank 0's minor faults and system seconds per step, the
# losses; then one line comparing the two (RSS ratio, step-time ratio, identical losses).
# Not a timed test: run it on an idle machine.
#   benchmarks/activation_checkpointing.sh [build dir] [out jsonl]
# Environment: CH (15), N (2), BATCH (64), STEPS (6), STAGE (3), CONFIG (configs/biggan-1b.yaml),
# SEGMENTS (false; true: the checkpointed run also sets sharding.*.checkpoint_segments),
# SET (more `key=value` overrides, space-separated; e.g. a 64x64 BigGAN-PyTorch geometry:
#   CONFIG=configs/fmnist-biggan.yaml SET="data.source=synthetic model.g_ch_mult=[16,16,8,4,2] ...").
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}; OUT=${2:-benchmarks/results/activation_checkpointing.jsonl}
CH=${CH:-15}; N=${N:-2}; BATCH=${BATCH:-64}; STEPS=${STEPS:-6}; STAGE=${STAGE:-3}
CONFIG=${CONFIG:-configs/biggan-1b.yaml}; SET=${SET:-}; SEGMENTS=${SEGMENTS:-false}
extra=(); for kv in $SET; do extra+=(--set "$kv"); done
PY=${SHARDGAN_PYTHON:-.venv/bin/python}
[ "$(id -u)" -eq 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$(dirname "$OUT")"
WORK=${TMPDIR:-/tmp}/shardgan-ac-bench
rm -rf "$WORK"; mkdir -p "$WORK"
for ac in false true; do
  seg=false; [ "$ac" = true ] && seg=$SEGMENTS
  mpirun -np "$N" --oversubscribe "$BUILD/shardgan-train" "$CONFIG" \
    --set model.ch="$CH" --set model.d_ch="$CH" \
    --set sharding.generator.compute_dtype=auto --set sharding.discriminator.compute_dtype=auto \
    --set sharding.generator.reduce_dtype=auto --set sharding.discriminator.reduce_dtype=auto \
    --set sharding.generator.stage="$STAGE" --set sharding.discriminator.stage="$STAGE" \
    --set sharding.generator.activation_checkpointing=$ac --set sharding.discriminator.activation_checkpointing=$ac \
    --set sharding.generator.checkpoint_segments=$seg --set sharding.discriminator.checkpoint_segments=$seg \
    --set train.global_batch="$BATCH" --set train.steps="$STEPS" --set train.checkpoint_every=0 --set train.log_every=1 \
    --set train.sample_every=0 --set data.synthetic_size="$BATCH" "${extra[@]}" --set run.dir="$WORK/ac-$ac" > "$WORK/ac-$ac.log" 2>&1 \
    || { echo "run with activation_checkpointing=$ac failed: $WORK/ac-$ac.log" >&2; exit 1; }
done
"$PY" - "$WORK" "$OUT" "$CH" "$N" "$BATCH" "$STAGE" "$CONFIG" "$SET" "$SEGMENTS" <<'PY'
import json, os, statistics, sys
work, out, ch, n, batch, stage = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
config, overrides, segments = os.path.basename(sys.argv[7]).removesuffix(".yaml"), sys.argv[8], sys.argv[9] == "true"
recs = {}
for ac in ("false", "true"):
    d = f"{work}/ac-{ac}"
    steps = [json.loads(l) for l in open(f"{d}/metrics.jsonl") if '"loss_d"' in l]
    mem = json.load(open(f"{d}/memory.json"))
    gib = [b / 2**30 for b in mem["peak_rss_bytes_per_rank_training"]]
    later = steps[1:]
    recs[ac] = {"bench": "activation_checkpointing", "activation_checkpointing": ac == "true",
                "checkpoint_segments": ac == "true" and segments,
                "model": f"{config} geometry, ch {ch}" + (f", {overrides}" if overrides else ""),
                "params": mem["preflight"]["generator_params"] + mem["preflight"]["discriminator_params"], "world_size": n, "stage": stage,
                "batch_per_rank": batch // n, "steps": len(steps),
                "step_s": statistics.median(r["step_time_s"] for r in later),
                "vmhwm_gib": max(gib), "vmhwm_gib_per_rank": gib,
                "vmhwm_gib_rank0_by_step": [r["peak_rss_bytes_rank0"] / 2**30 for r in steps],
                "minor_faults_per_step": statistics.median(r["minor_faults"] for r in later),
                "system_s_per_step": statistics.median(r["system_s"] for r in later),
                "losses": [[r["loss_d"], r["loss_g"]] for r in steps]}
summary = {"bench": "activation_checkpointing_summary",
           "vmhwm_ratio": recs["true"]["vmhwm_gib"] / recs["false"]["vmhwm_gib"],
           "step_time_ratio": recs["true"]["step_s"] / recs["false"]["step_s"],
           "losses_identical": recs["true"]["losses"] == recs["false"]["losses"]}
with open(out, "a") as f:
    for r in (recs["false"], recs["true"], summary):
        print(json.dumps(r))
        f.write(json.dumps(r) + "\n")
PY
