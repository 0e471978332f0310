#!/usr/bin/env bash
# ParaGAN's update rules and placements (train.update alternating | simultaneous,
# train.placement shared | split with half the ranks for G) on the same model, ranks and
# data: the conditional BigGAN of configs/fmnist-biggan.yaml (d_steps 2 and 1) and a wider
# one (ch WIDE_CH), each at N = 2 and 4 (4 ranks share the 2 cores here), STEPS steps each.
# Prints one JSON line per run: the median images per second over steps 3.. (global batch
# / step time, as metrics.jsonl reports it), the VmHWM per rank, and under split each
# group's median busy and idle seconds per step and the bytes between the groups (with
# the formula's); then, per run, the ratio of its images per second to alternating/shared.
# Split runs go once per value of DEFERS (placement.defer_figures: true waits for a step's
# world figures after the next step, false at its end, G then waiting for D's update).
# Not a timed test: run it on an idle machine.
#   benchmarks/paragan.sh [build dir] [out jsonl]
# Environment: STEPS (20), NS ("2 4"), WIDE_CH (32), DSTEPS ("2 1"), PLACEMENTS ("shared split"),
# DEFERS ("true false"), MODELS ("fmnist wide").
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}; OUT=${2:-benchmarks/results/paragan.jsonl}
STEPS=${STEPS:-20}; NS=${NS:-"2 4"}; WIDE_CH=${WIDE_CH:-32}; DSTEPS=${DSTEPS:-"2 1"}
PLACEMENTS=${PLACEMENTS:-"shared split"}; DEFERS=${DEFERS:-"true false"}; MODELS=${MODELS:-"fmnist wide"}
PY=${SHARDGAN_PYTHON:-.venv/bin/python}
[ "$(id -u)" -eq 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$(dirname "$OUT")"
WORK=${WORK:-runs/paragan}
rm -rf "$WORK"; mkdir -p "$WORK"
COMMIT=$(git rev-parse --short HEAD)
for model in $MODELS; do
  extra=(); [ "$model" != fmnist ] && { model="wide-ch$WIDE_CH"; extra=(--set model.ch="$WIDE_CH" --set model.d_ch="$WIDE_CH"); }
  for ds in $DSTEPS; do
    for n in $NS; do
     for pl in $PLACEMENTS; do
      for upd in alternating simultaneous; do
       for defer in $([ "$pl" = split ] && echo "$DEFERS" || echo true); do
        name="$model-d$ds-np$n-$pl-$upd$([ "$defer" = false ] && echo -nodefer)"
        mpirun -np "$n" --oversubscribe --bind-to none "$BUILD/shardgan-train" configs/fmnist-biggan.yaml "${extra[@]}" \
          --set train.placement=$pl --set placement.generator_ranks=0.5 \
          --set placement.defer_figures=$defer --set train.update=$upd --set train.d_steps="$ds" \
          --set train.steps="$STEPS" --set train.sample_every=0 \
          --set train.checkpoint_every=0 --set train.plots=false --set eval.enabled=false --set train.log_every=1 \
          --set run.dir="$WORK/$name" > "$WORK/$name.log" 2>&1 || { echo "run $name failed: $WORK/$name.log" >&2; exit 1; }
        rm -rf "$WORK/$name/checkpoints"
        "$PY" - "$WORK/$name" "$name" "$model" "$ds" "$n" "$upd" "$COMMIT" "$pl" "$defer" <<'PY' | tee -a "$OUT"
import json, statistics, sys
d, name, model, ds, n, upd, commit, pl, defer = sys.argv[1:]
rows = [json.loads(l) for l in open(f"{d}/metrics.jsonl") if '"loss_d"' in l]
mem = json.load(open(f"{d}/memory.json"))
later = rows[2:] or rows
med = lambda k: statistics.median(r[k] for r in later)
out = {"bench": "paragan", "commit": commit, "model": model, "d_steps": int(ds), "world_size": int(n),
       "update": upd, "placement": pl, "steps": len(rows), "images_per_s": med("images_per_s"),
       "step_s": med("step_time_s"), "vmhwm_gib_per_rank": [b / 2**30 for b in mem["peak_rss_bytes_per_rank"]]}
if pl == "split":
    out["defer_figures"] = defer == "true"
    for k in ("busy_g_s", "idle_g_s", "busy_d_s", "idle_d_s", "bytes_between_groups", "bytes_between_groups_formula"):
        out[k] = med(k)
print(json.dumps(out))
PY
       done
      done
     done
    done
  done
done
"$PY" - "$OUT" "$COMMIT" <<'PY' | tee -a "$OUT"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"bench": "paragan"' in l and sys.argv[2] in l]
by = {(r["model"], r["d_steps"], r["world_size"], r.get("placement", "shared"), r["update"],
       r.get("defer_figures", True)): r for r in rows}
for (m, ds, n, pl, u, defer), r in sorted(by.items()):
    base = by.get((m, ds, n, "shared", "alternating", True))
    if base is None or (pl, u) == ("shared", "alternating"):
        continue
    print(json.dumps({"bench": "paragan_ratio", "commit": sys.argv[2], "model": m, "d_steps": ds, "world_size": n,
                      "placement": pl, "update": u, **({"defer_figures": defer} if pl == "split" else {}),
                      "images_per_s_over_alternating_shared": r["images_per_s"] / base["images_per_s"]}))
PY
