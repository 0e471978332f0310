#!/usr/bin/env bash
# The largest offloaded run with 8-bit Adam states and bfloat16 gradients on disk
# (configs/biggan-5b-int8-offload.yaml, 5.01e9 parameters, 2 ranks), and its resume:
#   1. the disk's O_DIRECT bandwidth with dd (two writers, then two readers, 4 GiB each);
#   2. a straight run of 3 steps without a checkpoint;
#   3. a run of 2 steps that saves, `shardgan-ckpt verify` of that checkpoint, and a resume
#      from it for the 3rd step.
# Prints JSON lines: per run the losses, step times, optimizer step and I/O times, VmHWM per
# rank, the offload files and the checkpoint's bytes; then whether the 3rd step's losses of
# the resumed run equal the straight run's, and the fraction of the disk's O_DIRECT
# bandwidth the optimizer step reaches (its reads and writes, from the arrays' bytes per
# parameter, against dd's rates). With BITWISE=1 the straight run also saves at step 3 and
# the resumed one too, and `shardgan-ckpt diff --rtol 0` compares them (needs the disk for
# two checkpoints: use it with a smaller geometry, e.g. SETS="--set model.g_blocks_per_res=18
# --set model.d_blocks_per_res=7" for about 1e9 parameters).
# Not a timed test: run it on an idle machine, with the free disk the pre-flight asks for.
#   benchmarks/offload_int8_resume.sh [build dir] [out jsonl]
# Environment: CONFIG, N (2), SETS (extra --set options), WORK (a folder on a local disk),
# BITWISE (0).
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}; OUT=${2:-benchmarks/results/offload_int8_resume.jsonl}
CONFIG=${CONFIG:-configs/biggan-5b-int8-offload.yaml}; N=${N:-2}; BITWISE=${BITWISE:-0}
read -r -a EXTRA <<< "${SETS:-}"
PY=${SHARDGAN_PYTHON:-.venv/bin/python}
[ "$(id -u)" -eq 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$(dirname "$OUT")"
WORK=${WORK:-runs/offload-int8-resume}   # on the project's disk, not a tmpfs: O_DIRECT
rm -rf "$WORK"; mkdir -p "$WORK"

# 1. The disk, as the offload tier uses it: O_DIRECT, 16 MiB requests, two streams at once.
dd_rate() {  # prints GB/s of two concurrent dd runs of 4 GiB each
  local t0 t1
  t0=$(date +%s.%N)
  "$@" 0 & "$@" 1 & wait
  t1=$(date +%s.%N)
  echo "8589934592 / ($t1 - $t0) / 1000000000" | bc -l
}
wr() { dd if=/dev/zero of="$WORK/dd.$1" bs=16M count=256 oflag=direct status=none; }
rd() { dd if="$WORK/dd.$1" of=/dev/null bs=16M iflag=direct status=none; }
WRITE_GBS=$(dd_rate wr); READ_GBS=$(dd_rate rd); rm -f "$WORK"/dd.*

run() {  # NAME STEPS FINAL_CHECKPOINT [extra args]
  local name=$1 steps=$2 final=$3; shift 3
  mkdir -p "$WORK/offload"
  /usr/bin/time -v mpirun -np "$N" --oversubscribe --bind-to none "$BUILD/shardgan-train" "$CONFIG" "${EXTRA[@]}" \
    --set train.steps="$steps" --set train.final_checkpoint="$final" --set offload.path="$WORK/offload" \
    --set run.dir="$WORK/run" "$@" > "$WORK/$name.log" 2>&1 < /dev/null \
    || { echo "run $name failed: $WORK/$name.log" >&2; exit 1; }
  cp "$WORK/run/metrics.jsonl" "$WORK/$name.metrics.jsonl"
  cp "$WORK/run/memory.json" "$WORK/$name.memory.json"
}
ckpt_bytes() { du -sb "$1" | cut -f1; }

# 2. Straight: 3 steps (with BITWISE=1, and its checkpoint at step 3).
run straight 3 "$([ "$BITWISE" = 1 ] && echo true || echo false)"
STRAIGHT_CKPT=0
if [ "$BITWISE" = 1 ]; then
  mv "$WORK/run/checkpoints/step-00000003" "$WORK/straight-step3"
  STRAIGHT_CKPT=$(ckpt_bytes "$WORK/straight-step3")
fi
rm -rf "$WORK/run"
# 3. Two steps and a checkpoint, verified, then the 3rd step from it.
run saved 2 true
CKPT=$WORK/run/checkpoints/step-00000002
SAVED_CKPT=$(ckpt_bytes "$CKPT")
t0=$(date +%s.%N)
"$BUILD/shardgan-ckpt" verify "$CKPT" > "$WORK/verify.log" 2>&1; VERIFY=$?
VERIFY_S=$(echo "$(date +%s.%N) - $t0" | bc)
run resumed 3 "$([ "$BITWISE" = 1 ] && echo true || echo false)" --resume "$CKPT"
DIFF=-1
if [ "$BITWISE" = 1 ]; then
  "$BUILD/shardgan-ckpt" diff "$WORK/straight-step3" "$WORK/run/checkpoints/step-00000003" --rtol 0 \
    > "$WORK/diff.log" 2>&1; DIFF=$?
fi

"$PY" - "$WORK" "$OUT" "$N" "$(git rev-parse --short HEAD)" "$WRITE_GBS" "$READ_GBS" "$VERIFY" "$VERIFY_S" \
       "$SAVED_CKPT" "$STRAIGHT_CKPT" "$DIFF" "$CONFIG" "${SETS:-}" <<'PY'
import json, re, statistics, sys
(work, out, n, commit, wgbs, rgbs, verify, verify_s, saved_ckpt, straight_ckpt, diff, config,
 sets) = sys.argv[1:14]
n, wgbs, rgbs = int(n), float(wgbs), float(rgbs)
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
recs = {}
for name in ("straight", "saved", "resumed"):
    steps = [json.loads(l) for l in open(f"{work}/{name}.metrics.jsonl") if '"loss_d"' in l]
    mem = json.load(open(f"{work}/{name}.memory.json"))
    log = open(f"{work}/{name}.log").read()
    files = [float(x) for x in re.findall(r"offload: \w+ optimizer state[^(]*\(([0-9.]+) GiB", log)]
    params = re.search(r"G (\d+) parameters, D (\d+) parameters", log)
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([0-9:.]+)", log)
    recs[name] = {
        "bench": "offload_int8_resume", "run": name, "commit": commit, "cpu": cpu, "config": config, "sets": sets,
        "world_size": n,
        "params": int(params.group(1)) + int(params.group(2)) if params else None,
        "steps": [r["step"] for r in steps],
        "losses": [[r["loss_d"], r["loss_g"]] for r in steps],
        "step_s": [r["step_time_s"] for r in steps],
        "optimizer_s": [r.get("time_optimizer_s") for r in steps],
        "optimizer_io_s": [r.get("time_optimizer_io_s") for r in steps],
        "vmhwm_gib_per_rank": [b / 2**30 for b in mem["peak_rss_bytes_per_rank"]],
        "offload_files_gib_per_rank": sum(files) / n if files else None,
        "preflight_disk": {k: mem["preflight"]["disk"][k] for k in ("offload_bytes", "checkpoint_bytes")},
        "wall": wall.group(1) if wall else None}
s, r = recs["straight"], recs["resumed"]
params = s["params"] or 0
# The optimizer step's disk traffic per parameter (both models, offload_arrays): reads the
# master 4, v's codes 1 and the bfloat16 gradient 2; writes the master 4 and the codes 1.
read_b, write_b = 7 * params, 5 * params
last = len(s["optimizer_s"]) - 1
opt_s = statistics.mean(x for x in s["optimizer_s"][1:] if x) if last > 0 else s["optimizer_s"][0]
ideal = read_b / (rgbs * 1e9) + write_b / (wgbs * 1e9)
summary = {"bench": "offload_int8_resume_summary", "commit": commit, "cpu": cpu,
           "dd_write_gbs": wgbs, "dd_read_gbs": rgbs,
           "checkpoint_bytes": int(saved_ckpt), "checkpoint_verify_ok": verify == "0",
           "checkpoint_verify_s": float(verify_s),
           "step3_losses_equal": bool(s["losses"][2:3]) and s["losses"][2:3] == r["losses"][-1:],
           "step3_straight": s["losses"][2:3], "step3_resumed": r["losses"][-1:],
           "optimizer_read_gb": read_b / 1e9, "optimizer_write_gb": write_b / 1e9,
           "optimizer_step_s_steps_2_on": opt_s,
           "disk_bandwidth_fraction": ideal / opt_s if opt_s else None}
if straight_ckpt != "0":
    summary["bitwise_diff_exit"] = int(diff)
    summary["checkpoints_identical"] = diff == "0"
with open(out, "a") as f:
    for rec in (recs["straight"], recs["saved"], recs["resumed"], summary):
        print(json.dumps(rec))
        f.write(json.dumps(rec) + "\n")
PY
