#!/usr/bin/env bash
# Gradient offload at scale: the BigGAN of configs/biggan-3b-offload.yaml (master shards and
# Adam state on disk, O_DIRECT, bfloat16 compute, ZeRO stage 3) at width CH, N ranks, STEPS
# steps, with offload.<model>.gradient none and then disk, one run after the other. Prints
# one JSON line per run: the median over steps 2.. of the step time, of the gradient tier's
# time outside the optimizer step (time_offload_grad_s: reduced shards added into the tier
# in backward, read for the finiteness vote) and of the optimizer's I/O, the VmHWM per rank,
# the offload files' bytes, and whether the losses agree; then the VmHWM drop per rank
# against the formula (the larger model's float32 gradient shard, 4 bytes x its parameters
# / N: G's and D's shards are never held at once).
# Not a timed test: run it on an idle machine.
#   benchmarks/gradient_offload.sh [build dir] [out jsonl]
# Environment: CH (32), N (2), STEPS (3), WORK (a scratch folder on a local disk).
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}; OUT=${2:-benchmarks/results/gradient_offload.jsonl}
CH=${CH:-32}; N=${N:-2}; STEPS=${STEPS:-3}
PY=${SHARDGAN_PYTHON:-.venv/bin/python}
[ "$(id -u)" -eq 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$(dirname "$OUT")"
WORK=${WORK:-runs/gradient-offload}   # on the project's disk, not a tmpfs: O_DIRECT
rm -rf "$WORK"; mkdir -p "$WORK"
for g in none disk; do
  mkdir -p "$WORK/offload-$g"
  mpirun -np "$N" --oversubscribe --bind-to none "$BUILD/shardgan-train" configs/biggan-3b-offload.yaml \
    --set model.ch="$CH" --set model.d_ch="$CH" --set train.steps="$STEPS" \
    --set offload.generator.gradient=$g --set offload.discriminator.gradient=$g \
    --set offload.path="$WORK/offload-$g" --set run.dir="$WORK/grad-$g" > "$WORK/grad-$g.log" 2>&1 \
    || { echo "run with gradient offload $g failed: $WORK/grad-$g.log" >&2; exit 1; }
  rm -rf "$WORK/grad-$g/checkpoints" "$WORK/offload-$g"   # neither is needed after the run
done
"$PY" - "$WORK" "$OUT" "$CH" "$N" "$(git rev-parse --short HEAD)" <<'PY'
import json, re, statistics, sys
work, out, ch, n, commit = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
recs = {}
for g in ("none", "disk"):
    steps = [json.loads(l) for l in open(f"{work}/grad-{g}/metrics.jsonl") if '"loss_d"' in l]
    mem = json.load(open(f"{work}/grad-{g}/memory.json"))
    log = open(f"{work}/grad-{g}.log").read()
    gib = [float(x) for x in re.findall(r"offload: \w+ optimizer state[^(]*\(([0-9.]+) GiB", log)]
    later = steps[1:] or steps
    recs[g] = {"bench": "gradient_offload", "gradient": g, "commit": commit,
               "model": f"biggan-3b-offload geometry, ch {ch}", "world_size": n, "steps": len(steps),
               "step_s": statistics.median(r["step_time_s"] for r in later),
               "offload_grad_s": statistics.median(r.get("time_offload_grad_s", 0) for r in later),
               "optimizer_io_s": statistics.median(r["time_optimizer_io_s"] for r in later),
               "vmhwm_gib_per_rank": [b / 2**30 for b in mem["peak_rss_bytes_per_rank_training"]],
               "offload_files_gib_rank0": sum(gib),
               "losses": [[r["loss_d"], r["loss_g"]] for r in steps]}
m = re.search(r"G (\d+) parameters, D (\d+) parameters", open(f"{work}/grad-none.log").read())
params = {"generator": int(m.group(1)), "discriminator": int(m.group(2))} if m else {}
for r in recs.values():
    r["params"] = sum(params.values())
drop = [a - b for a, b in zip(recs["none"]["vmhwm_gib_per_rank"], recs["disk"]["vmhwm_gib_per_rank"])]
summary = {"bench": "gradient_offload_summary", "commit": commit,
           "vmhwm_drop_gib_per_rank": drop,
           "formula_gib_per_rank": 4 * max(params.values()) / n / 2**30 if params else None,
           "step_time_ratio": recs["disk"]["step_s"] / recs["none"]["step_s"],
           "losses_identical": recs["disk"]["losses"] == recs["none"]["losses"]}
with open(out, "a") as f:
    for r in (recs["none"], recs["disk"], summary):
        print(json.dumps(r))
        f.write(json.dumps(r) + "\n")
PY
