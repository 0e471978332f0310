#!/usr/bin/env bash
# Sweeps ZeRO stages 0-3 over world sizes 1, 2, 4 and 8 (mpirun --oversubscribe) with
# bench_memory_scaling, writes JSON lines and a PNG plot (gnuplot), and prints the
# stage-3 / stage-0 step-time ratio per world size. The HSDP cells add stages 1-3
# at N = 4 and 8 with 2 replica groups (replicate_degree=2: sharded over N/2 ranks). Usage:
#   benchmarks/memory_scaling.sh [build dir] [out dir] [extra key=value overrides...]
set -euo pipefail
PY=${SHARDGAN_PYTHON:-$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python}   # made by scripts/setup.sh
BUILD=${1:-build}; OUT=${2:-benchmarks/results}; shift $(( $# > 2 ? 2 : $# ))
mkdir -p "$OUT"
[ "$(id -u)" -eq 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
J=$OUT/memory_scaling.jsonl
: > "$J"
for np in 1 2 4 8; do
  for stage in 0 1 2 3; do
    mpirun -np "$np" --oversubscribe "$BUILD/benchmarks/bench_memory_scaling" "$stage" "$@" | grep "^{" | tee -a "$J"
  done
done
for np in 4 8; do
  for stage in 1 2 3; do
    mpirun -np "$np" --oversubscribe "$BUILD/benchmarks/bench_memory_scaling" "$stage" replicate_degree=2 "$@" | grep "^{" | tee -a "$J"
  done
done
"$PY" - "$J" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {(r["world_size"], r["stage"]): r for r in rows if r.get("replicate_degree", 1) == 1}
for n in sorted({r["world_size"] for r in rows}):
    if (n, 0) in by and (n, 3) in by:
        print(json.dumps({"world_size": n, "stage3_over_stage0_step_time":
              round(by[(n, 3)]["step_time_s_median"] / by[(n, 0)]["step_time_s_median"], 3)}))
PY
if command -v gnuplot > /dev/null; then
  for stage in 0 1 2 3; do
    "$PY" -c "import json,sys; [print(r['world_size'], r['model_state_bytes_per_rank']/2**20, r['formula_bytes_per_rank']/2**20, r['peak_rss_bytes']/2**20) for r in map(json.loads, open('$J')) if r['stage']==$stage and r.get('replicate_degree', 1) == 1]" > "$OUT/stage$stage.dat"
  done
  gnuplot <<GP
set terminal png size 900,560
set output "$OUT/memory_scaling.png"
set title "shardgan: model-state MiB per rank (points) vs ZeRO formula (lines)"
set xlabel "world size N"; set ylabel "MiB per rank"; set logscale xy 2; set key outside
plot for [s=0:3] sprintf("$OUT/stage%d.dat", s) using 1:2 with points pt 7 ps 1.5 title sprintf("stage %d", s), \
     for [s=0:3] sprintf("$OUT/stage%d.dat", s) using 1:3 with lines dt 2 notitle
GP
  echo "plot: $OUT/memory_scaling.png"
fi
