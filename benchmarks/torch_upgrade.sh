#!/usr/bin/env bash
# Before/after the LibTorch move (1.13 to 2.15), on one machine, back to back: the same commands
# with two builds of shardgan-train (BEFORE: Debian's LibTorch 1.13, AFTER: the wheel's 2.x).
#   benchmarks/torch_upgrade.sh BEFORE_BUILD AFTER_BUILD [OUT=benchmarks/results/torch_upgrade] [PARTS="demo biggan big"]
# Parts (each writes JSON lines to OUT/upgrade.jsonl, one per build and part):
#  demo   - the demo DCGAN (configs/fmnist-dcgan.yaml, 2 ranks, DEMO_STEPS=1500 steps, FID every
#           500 on 2,000 images): median step time of the logged steps and the final FIDs;
#  biggan - the conditional BigGAN (configs/fmnist-biggan.yaml, 2 ranks) for WALL_S=300 seconds
#           of training, then SIGUSR1 (finish the step, checkpoint, exit 0): steps reached, and
#           FID and class accuracy of G and its EMA from shardgan-ckpt fid (10,000 images);
#  big    - configs/biggan-1b.yaml (1.03e9 parameters, stage 3, bf16 compute), BIG_STEPS=1 step:
#           step time and VmHWM per rank.
# Both builds score with one classifier (CLASSIFIER, trained by AFTER if missing), so the FIDs
# compare generators, not classifiers.
set -uo pipefail
BEFORE=${1:?BEFORE build dir}; AFTER=${2:?AFTER build dir}
OUT=${3:-benchmarks/results/torch_upgrade}; PARTS=${4:-demo biggan big}
PY=${SHARDGAN_PYTHON:-$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python}
DEMO_STEPS=${DEMO_STEPS:-1500}; WALL_S=${WALL_S:-300}; BIG_STEPS=${BIG_STEPS:-1}
CLASSIFIER=${CLASSIFIER:-runs/fmnist-classifier.h5}
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
mkdir -p "$OUT" runs
J="$OUT/upgrade.jsonl"
[ -f "$CLASSIFIER" ] || "$AFTER/shardgan-fid" train-classifier -o "$CLASSIFIER"

summarize() {  # build part run_dir wall_s [extra json]
  "$PY" - "$@" <<'PY'
import json, sys, statistics, os
build, part, run, wall = sys.argv[1:5]
extra = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {}
rows = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl"))]
steps = [r for r in rows if "step_time_s" in r]
evals = [r for r in rows if "fid" in r]
# The trainer writes every rank's VmHWM to memory.json at the end (not to metrics.jsonl).
mem_path = os.path.join(run, "memory.json")
mem = json.load(open(mem_path)) if os.path.exists(mem_path) else {}
out = {"build": build, "part": part, "wall_s": float(wall),
       "steps": max((r["step"] for r in steps), default=0),
       "step_s_median": statistics.median(r["step_time_s"] for r in steps) if steps else None,
       "step_s_first": steps[0]["step_time_s"] if steps else None}
if evals:
    out["fid_last"] = evals[-1].get("fid"); out["fid_ema_last"] = evals[-1].get("fid_ema")
    out["eval_step_last"] = evals[-1].get("step")
if "peak_rss_bytes_per_rank" in mem:
    out["vmhwm_gib_per_rank"] = [round(b / 2**30, 3) for b in mem["peak_rss_bytes_per_rank"]]
out.update(extra)
print(json.dumps(out))
PY
}

for part in $PARTS; do
  for tag in before after; do
    if [ $tag = before ]; then b=$BEFORE; else b=$AFTER; fi
    run="runs/upgrade-$part-$tag"; rm -rf "$run"
    t0=$(date +%s.%N)
    case $part in
      demo)
        mpirun -np 2 --oversubscribe "$b/shardgan-train" configs/fmnist-dcgan.yaml --set run.dir="$run" \
          --set train.steps="$DEMO_STEPS" --set eval.enabled=true --set eval.classifier="$CLASSIFIER" \
          --set train.plots=false > "$OUT/$part-$tag.log" 2>&1
        summarize "$tag" demo "$run" "$(echo "$(date +%s.%N) - $t0" | bc)" | tee -a "$J" ;;
      biggan)
        timeout -s USR1 "$WALL_S" mpirun -np 2 --oversubscribe "$b/shardgan-train" configs/fmnist-biggan.yaml \
          --set run.dir="$run" --set train.steps=100000 --set train.plots=false > "$OUT/$part-$tag.log" 2>&1
        wall=$(echo "$(date +%s.%N) - $t0" | bc)
        g=$("$AFTER/shardgan-ckpt" fid "$run" --classifier "$CLASSIFIER" 2>/dev/null | tail -1)
        e=$("$AFTER/shardgan-ckpt" fid "$run" --ema --classifier "$CLASSIFIER" 2>/dev/null | tail -1)
        summarize "$tag" biggan "$run" "$wall" "{\"ckpt_fid\": ${g:-null}, \"ckpt_fid_ema\": ${e:-null}}" | tee -a "$J" ;;
      big)
        mpirun -np 2 --oversubscribe "$b/shardgan-train" configs/biggan-1b.yaml --set run.dir="$run" \
          --set train.steps="$BIG_STEPS" --set train.sample_every=0 > "$OUT/$part-$tag.log" 2>&1
        summarize "$tag" big "$run" "$(echo "$(date +%s.%N) - $t0" | bc)" | tee -a "$J" ;;
    esac
  done
done
