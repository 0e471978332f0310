#!/usr/bin/env bash
# Memory scaling at real scale: BigGAN (configs/biggan-1b.yaml, bfloat16 compute, float32
# masters and Adam) swept over model width x world size x ZeRO stage (both models at the
# same stage). Each cell first runs the memory pre-flight (--dry-run); a cell the pre-flight
# refuses is recorded as refused with its estimate; the others train 1 step (1 D + 1 G
# update) and report the peak RSS (VmHWM) of every rank, measured by the OS, next to the
# sharding layer's accounting, the pre-flight estimate and the ZeRO formula
# (mixed-precision Adam, Rajbhandari et al. 2020, Sec. 5: 16, 4 + 12/N, 2 + 14/N and 16/N
# bytes per parameter at stages 0-3). Prints one JSON object per cell, then the largest model that trained at
# each stage per world size. Not a timed test: step times share the machine's 2 cores.
#   benchmarks/biggan_scale.sh [build dir] [out dir] ["ch list"] ["N list"] ["stage list"]
# SWEEP_APPEND=1 appends to an existing biggan_scale.jsonl (a long sweep run in parts);
# SWEEP_NOTE is stored in each row (e.g. which build ran it). SWEEP_SET adds --set
# arguments to every cell, e.g. SWEEP_SET="train.skip_memory_check=true" to train a cell the
# pre-flight would refuse (the row then says so in "preflight_skipped").
set -uo pipefail
PY=${SHARDGAN_PYTHON:-$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python}   # made by scripts/setup.sh
BUILD=${1:-build}; OUT=${2:-benchmarks/results/biggan}
CHS=${3:-"16 32 45 64"}; NS=${4:-"1 2 4"}; STAGES=${5:-"0 1 2 3"}
mkdir -p "$OUT"
[ "$(id -u)" -eq 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
J=$OUT/biggan_scale.jsonl
[ "${SWEEP_APPEND:-0}" = 1 ] || : > "$J"
CFG=configs/biggan-1b.yaml
for ch in $CHS; do
  for np in $NS; do
    for stage in $STAGES; do
      RUN=${TMPDIR:-/tmp}/shardgan-biggan-scale/run-ch$ch-np$np-s$stage  # logs and run dirs stay out of $OUT
      mkdir -p "$(dirname "$RUN")"
      rm -rf "$RUN"
      SET=(--set model.ch=$ch --set model.d_ch=$ch --set sharding.generator.stage=$stage
           --set sharding.discriminator.stage=$stage --set train.steps=1 --set train.d_steps=1
           --set train.global_batch=4 --set ema.enabled=false --set run.dir="$RUN")
      for kv in ${SWEEP_SET:-}; do SET+=(--set "$kv"); done
      mpirun -np "$np" --oversubscribe "$BUILD/shardgan-train" "$CFG" "${SET[@]}" --dry-run > "$RUN.dry.json" 2> "$RUN.dry.err"
      start=$(date +%s.%N)
      mpirun -np "$np" --oversubscribe "$BUILD/shardgan-train" "$CFG" "${SET[@]}" > "$RUN.log" 2>&1
      rc=$?
      wall=$(echo "$(date +%s.%N) - $start" | bc)
      "$PY" - "$RUN" "$ch" "$np" "$stage" "$rc" "$wall" <<'PY' | tee -a "$J"
import json, os, re, sys
run, ch, np_, stage, rc, wall = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
dry = json.load(open(run + ".dry.json"))
params = dry["generator_params"] + dry["discriminator_params"]
cell = {"ch": ch, "params": params, "world_size": np_, "stage": stage, "note": os.environ.get("SWEEP_NOTE", ""),
        # ZeRO paper, Sec. 5, mixed-precision Adam (K = 12): 16P, 4P + 12P/N, 2P + 14P/N, 16P/N.
        "zero_formula_bytes_per_rank": {0: 16 * params, 1: 4 * params + 12 * params // np_,
                                        2: 2 * params + 14 * params // np_, 3: 16 * params // np_}[stage],
        "preflight_peak_bytes_per_rank": dry["per_rank"][f"stage{stage}"]["total_peak_bytes"],
        "preflight_state_bytes_per_rank": sum(dry["per_rank"][f"stage{stage}"][m][k]
            for m in ("generator", "discriminator") for k in ("params_bytes", "grads_bytes", "optimizer_state_bytes"))}
# What the pre-flight checks (estimate x margin x ranks) against the memory available then;
# with SWEEP_SET="train.skip_memory_check=true" a cell it would refuse still trains.
cell["preflight_checked_bytes_node"] = dry["configured"]["node_bytes_checked"]
cell["available_bytes"] = dry["node_memory"]["available_bytes"]
cell["preflight_admits"] = cell["preflight_checked_bytes_node"] <= cell["available_bytes"]
# The probe's prediction of VmHWM per rank (train.memory_probe; absent without it).
pred = dry["configured"].get("predicted")
if pred:
    cell["predicted_vmhwm_bytes_per_rank"] = pred["vmhwm_bytes_per_rank"]
    cell["predicted_terms"] = pred
    cell["probe"] = dry.get("probe")
cell["preflight_skipped"] = "skip_memory_check=true" in os.environ.get("SWEEP_SET", "")
log = open(run + ".log", errors="replace").read()
if "memory pre-flight" in log:
    cell["result"] = "refused by pre-flight"
elif rc != 0:
    cell["result"] = f"failed (exit {rc})"
    cell["log_tail"] = log[-300:]
else:
    mem = json.load(open(run + "/memory.json"))
    g, d = mem["generator_accounting_rank0"], mem["discriminator_accounting_rank0"]
    times = [float(x) for x in re.findall(r"([0-9.]+) s/step", log)]
    cell.update({"result": "trained", "peak_rss_bytes_per_rank": mem["peak_rss_bytes_per_rank"],
                 # VmHWM before the final checkpoint save (the line above includes it)
                 "peak_rss_training_bytes_per_rank": mem.get("peak_rss_bytes_per_rank_training"),
                 "peak_rss_bytes_sum": mem["peak_rss_bytes_sum"],
                 "accounting_model_state_bytes_rank0": g["model_state_bytes"] + d["model_state_bytes"],
                 "step_time_s": times[-1] if times else None, "wall_s": round(wall, 1)})
    if pred:  # measured over predicted, the largest rank (the target is within +-10%)
        cell["vmhwm_over_predicted"] = round(max(cell["peak_rss_bytes_per_rank"]) / pred["vmhwm_bytes_per_rank"], 4)
print(json.dumps(cell))
PY
      rm -rf "$RUN"  # checkpoints of 1e9 parameters are large; the JSON keeps the numbers
    done
  done
done
"$PY" - "$J" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for n in sorted({r["world_size"] for r in rows}):
    for s in range(4):
        ok = [r["params"] for r in rows if r["world_size"] == n and r["stage"] == s and r["result"] == "trained"]
        print(json.dumps({"world_size": n, "stage": s, "largest_trained_params": max(ok) if ok else 0}))
PY
