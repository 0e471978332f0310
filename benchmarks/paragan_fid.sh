#!/usr/bin/env bash
# Sample quality at (about) equal wall time, simultaneous against alternating update:
# configs/fmnist-biggan.yaml as shipped on NP ranks with placement PLACEMENT; the
# alternating run ALT_STEPS steps and the simultaneous run the same steps times RATIO (its
# measured images-per-second gain, docs/results.md#the-update-rule), so that both get about
# the same minutes; or, with TIME_S > 0, every run trains until TIME_S seconds have passed
# (train.time_limit_s) and the steps are what each reached. Evaluated at the end (FID and class accuracy of
# G and of the EMA on the project classifier, 2,000 images). One line of JSON per run with
# its wall time; then, per update, the mean and standard deviation over the seeds.
# Not a timed test: run it on an idle machine.
#   benchmarks/paragan_fid.sh [build dir] [out jsonl]
# Environment: SEEDS ("1"), ALT_STEPS (3400), RATIO (1.3), TIME_S (0), NP (2), PLACEMENT (shared),
# UPDATES ("alternating simultaneous"), SET (more `key=value` overrides for every run, e.g.
# "model.channels_last=true"), WORK (runs/paragan-fid).
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}; OUT=${2:-benchmarks/results/paragan_fid.jsonl}
SEEDS=${SEEDS:-1}; ALT_STEPS=${ALT_STEPS:-3400}; RATIO=${RATIO:-1.3}; NP=${NP:-2}; PLACEMENT=${PLACEMENT:-shared}
UPDATES=${UPDATES:-"alternating simultaneous"}
SET_ARGS=(); for kv in ${SET:-}; do SET_ARGS+=(--set "$kv"); done
TIME_S=${TIME_S:-0}
[ "$TIME_S" != 0 ] && SET_ARGS+=(--set train.time_limit_s="$TIME_S")
PY=${SHARDGAN_PYTHON:-.venv/bin/python}
[ "$(id -u)" -eq 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
[ -f runs/fmnist-classifier.h5 ] || { echo "runs/fmnist-classifier.h5 is missing: run scripts/demo.sh once" >&2; exit 1; }
WORK=${WORK:-runs/paragan-fid}; mkdir -p "$WORK" "$(dirname "$OUT")"
COMMIT=$(git rev-parse --short HEAD)
for seed in $SEEDS; do
  for upd in $UPDATES; do
    steps=$ALT_STEPS; [ $upd = simultaneous ] && steps=$("$PY" -c "print(round($ALT_STEPS * $RATIO))")
    [ "$TIME_S" != 0 ] && steps=1000000  # the time limit ends the run
    name="$PLACEMENT-np$NP-$upd-seed$seed"; rm -rf "$WORK/$name"
    t0=$(date +%s.%N)
    mpirun -np "$NP" --oversubscribe --bind-to none "$BUILD/shardgan-train" configs/fmnist-biggan.yaml --set train.update=$upd \
      --set train.placement="$PLACEMENT" --set train.eval_every=0 \
      --set run.seed="$seed" --set train.steps="$steps" --set train.checkpoint_every=0 --set train.sample_every=0 \
      --set eval.enabled=true --set eval.classifier=runs/fmnist-classifier.h5 --set run.dir="$WORK/$name" "${SET_ARGS[@]}" \
      > "$WORK/$name.log" 2>&1 || { echo "run $name failed: $WORK/$name.log" >&2; exit 1; }
    t1=$(date +%s.%N)
    "$PY" - "$WORK/$name" "$upd" "$seed" "$steps" "$t0" "$t1" "$COMMIT" "$PLACEMENT" "$NP" "${SET:-}" <<'PY' | tee -a "$OUT"
import json, sys
d, upd, seed, steps, t0, t1, commit, placement, np_, overrides = sys.argv[1:]
ev = [json.loads(l) for l in open(f"{d}/metrics.jsonl") if '"fid' in l]
train_s = sum(json.loads(l)["step_time_s"] for l in open(f"{d}/metrics.jsonl") if '"loss_d"' in l)
print(json.dumps({"bench": "paragan_fid", "commit": commit, "update": upd, "placement": placement,
                  "world_size": int(np_), "seed": int(seed), "steps": ev[-1]["step"] if ev else int(steps),
                  "set": overrides.split(), "training_s": train_s, "run_wall_s": float(t1) - float(t0),
                  "eval": ev[-1] if ev else None}))
PY
  done
done
"$PY" - "$OUT" "$COMMIT" "$PLACEMENT" "$NP" <<'PY' | tee -a "$OUT"
import json, statistics, sys
out, commit, placement, np_ = sys.argv[1:]
rows = [json.loads(l) for l in open(out)]
rows = [r for r in rows if r.get("bench") == "paragan_fid" and r["commit"] == commit and r.get("placement") == placement
        and r.get("world_size") == int(np_) and r["eval"]]
for upd in sorted({r["update"] for r in rows}):
    rs = [r for r in rows if r["update"] == upd]
    summary = {"bench": "paragan_fid_spread", "commit": commit, "update": upd, "placement": placement,
               "world_size": int(np_), "seeds": [r["seed"] for r in rs], "run_wall_s": [r["run_wall_s"] for r in rs]}
    for k in ("fid", "fid_ema", "class_acc", "class_acc_ema", "fid_trunc", "fid_ema_trunc", "class_acc_trunc",
              "class_acc_ema_trunc"):
        v = [r["eval"][k] for r in rs if k in r["eval"]]
        if v:
            summary[k] = {"mean": statistics.mean(v), "sd": statistics.stdev(v) if len(v) > 1 else 0.0, "all": v}
    print(json.dumps(summary))
PY
