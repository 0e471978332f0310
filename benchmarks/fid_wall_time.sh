#!/usr/bin/env bash
# FID against wall time for the three Fashion-MNIST GANs as shipped, on 2 ranks (ZeRO-3),
# one after the other: the DCGAN demo (configs/fmnist-dcgan.yaml), the conditional BigGAN
# (configs/fmnist-biggan.yaml) and the StyleGAN2 `fmnist` preset
# (configs/fmnist-stylegan2.yaml), each with its evaluations on (FID of G and of its EMA on
# the project classifier, 2,000 samples against t10k). Wall time
# is read from each run's log: seconds from its first line (start-up and the memory
# pre-flight included) to each evaluation's line, evaluations included. One JSON line per
# run; benchmarks/fid_wall_time_plot.py draws the curves. Not a timed test: run it on an
# idle machine.
#   benchmarks/fid_wall_time.sh [build dir] [out jsonl]
# Environment: RUNS ("dcgan biggan stylegan2": the runs to train; every run whose log is
# in WORK is reported), WORK (runs/fid-wall-time), DCGAN_EVAL_EVERY (750),
# BIGGAN_EVAL_EVERY (725); the StyleGAN2 config's own eval_every (600) is used.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}; OUT=${2:-benchmarks/results/fid_wall_time.jsonl}
RUNS=${RUNS:-"dcgan biggan stylegan2"}
PY=${SHARDGAN_PYTHON:-.venv/bin/python}
[ "$(id -u)" -eq 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
[ -f runs/fmnist-classifier.h5 ] || { echo "runs/fmnist-classifier.h5 is missing: run scripts/demo.sh once" >&2; exit 1; }
WORK=${WORK:-runs/fid-wall-time}; mkdir -p "$WORK" "$(dirname "$OUT")"
config_of() { case $1 in dcgan) echo configs/fmnist-dcgan.yaml ;; biggan) echo configs/fmnist-biggan.yaml ;;
                         stylegan2) echo configs/fmnist-stylegan2.yaml ;; *) return 1 ;; esac; }
args_of() { case $1 in dcgan) echo "--set train.eval_every=${DCGAN_EVAL_EVERY:-750}" ;;
                       biggan) echo "--set train.eval_every=${BIGGAN_EVAL_EVERY:-725}" ;; *) echo "" ;; esac; }
for name in $RUNS; do
  cfg=$(config_of "$name") || { echo "unknown run '$name' (dcgan, biggan, stylegan2)" >&2; exit 2; }
  rm -rf "${WORK:?}/$name"
  # shellcheck disable=SC2046
  mpirun -np 2 --bind-to none "$BUILD/shardgan-train" "$cfg" --set run.dir="$WORK/$name" \
    --set eval.enabled=true --set eval.classifier=runs/fmnist-classifier.h5 $(args_of "$name") \
    < /dev/null > "$WORK/$name.log" 2>&1 || { echo "run $name failed: $WORK/$name.log" >&2; exit 1; }
done
COMMIT=$(git rev-parse --short HEAD)
CPU=$(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')
for name in dcgan biggan stylegan2; do
  [ -f "$WORK/$name.log" ] || continue
  "$PY" - "$WORK/$name.log" "$name" "$(config_of "$name")" "$COMMIT" "$CPU" <<'PY' | tee -a "$OUT"
import json, re, sys
log, name, config, commit, cpu = sys.argv[1:6]
stamp = re.compile(r"^\[(\d\d):(\d\d):(\d\d\.\d+)\]")
ev, ema = re.compile(r"eval step (\d+): FID ([0-9.]+)"), re.compile(r"; EMA: FID ([0-9.]+)")
t0, last, day, points, done = None, None, 0.0, [], None
for line in open(log):
    m = stamp.match(line)
    if not m:
        continue
    t = int(m[1]) * 3600 + int(m[2]) * 60 + float(m[3])
    if last is not None and t + day < last:
        day += 86400.0  # past midnight
    t += day
    last = t
    t0 = t if t0 is None else t0
    e = ev.search(line)
    if e:
        a = ema.search(line)  # the first: untruncated (a truncated evaluation has its own line)
        points.append({"wall_s": round(t - t0, 1), "step": int(e[1]), "fid": float(e[2]),
                       "fid_ema": float(a[1]) if a else None})
    if "done: step" in line:
        done = round(t - t0, 1)
print(json.dumps({"bench": "fid_wall_time", "commit": commit, "cpu": cpu, "run": name, "config": config,
                  "ranks": 2, "wall_s": done, "points": points}))
PY
done
