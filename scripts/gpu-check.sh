#!/usr/bin/env bash
# Every check that needs a GPU, in one command (run it on a machine with one):
#   1. the `gpu` ctest entries (tests/test_gpu.cpp);
#   2. 200 demo steps (configs/fmnist-dcgan.yaml, synthetic-free: the real Fashion-MNIST)
#      with run.device=cuda on 1 rank at ZeRO stage 3 and stage 0: step time (median of
#      metrics.jsonl) and peak device memory (nvidia-smi, sampled every 0.2 s) beside the
#      ZeRO formula of the pre-flight (--dry-run); then at stage 3 with bfloat16 and float16
#      compute, and with the optimizer offloaded to CPU memory and to disk;
#   3. the same 200 steps on the CPU, and the first 5 steps' losses compared (tolerance below);
#   4. the stage-3 GPU checkpoint resumed on the CPU, and the CPU one on the GPU, for one step
#      each (layouts are device-free).
# Results go to $OUT/gpu-check (or build/gpu-check) as text and JSON lines.
#
# GPU_TESTS=0 skips step 1, DEMO_CELLS=0 steps 2-4;
# BIG_STEPS (default 5) sets the steps of the 1e9 cells (one fewer with offload).
#
#   5. (BIG=1, the default) the 1.03e9-parameter BigGAN of configs/biggan-1b.yaml on one GPU,
#      bfloat16 compute, 5 steps: step time and device memory beside the ZeRO formula;
#      and again with dist.blocking_wait (host-side waits): same losses, step times compared;
#   6. (BIG=1) the same model with Adam offloaded to pinned CPU memory (ZeRO-Offload), 4 steps
#      with offload.overlap_copies true and false: step time, and the optimizer's copy
#      (time_optimizer_io_s) and compute time. The updated parameters must be the same bits
#      either way, so the losses of the two runs must be equal (BIG_PAIRS=0 skips 5b and 6);
#   7. (AC=1, the default) activation checkpointing off and on, with cuDNN's deterministic
#      algorithms (run.deterministic): the same loss bits, and the caching allocator's peak
#      and the step times of both, at two BigGAN geometries (details at step 7 below).
#   8. (RANKS=N, N >= 2) NCCL between N ranks: tests/test_gpu_ranks under mpirun (the
#      collectives, ZeRO-3 against the CPU in float64, the timeout and abort), and the demo in
#      float64 on N ranks at stages 3 and 2 against 1 rank (steps 1-5 within 1e-9 relative),
#      then in float32. With fewer GPUs than ranks the ranks share them: NCCL 2.30 or later
#      and NCCL_MULTI_RANK_GPU_ENABLE=1 (docs/dev/gpu-bundle.md). GPUS=N is the old name.
#
# Build: uses $SHARDGAN_BUILD (default build/) when it has shardgan-train; otherwise
# configures build/ with the torch of SHARDGAN_PYTHON (default: .venv/bin/python, else
# /opt/torch/.venv/bin/python). On a machine without our Debian packages, source the env.sh
# of scripts/gpu-bundle.sh first: it sets SHARDGAN_BUILD, SHARDGAN_DATA (Fashion-MNIST's
# folder) and SHARDGAN_SINGLETON (1-rank cells start the binary itself, a singleton MPI
# process, instead of mpirun).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
R=${OUT:-build}/gpu-check
mkdir -p "$R"
log() { echo "$*" | tee -a "$R/summary.txt"; }
: > "$R/summary.txt"
if ! nvidia-smi -L > "$R/gpus.txt" 2>&1; then
  log "no GPU: nvidia-smi -L failed ($(head -1 "$R/gpus.txt")). Nothing here can run without one."
  exit 2
fi
log "machine: $(head -1 "$R/gpus.txt"); $(nproc) cores; $(date -u +%FT%TZ)"
PY=${SHARDGAN_PYTHON:-}
[ -z "$PY" ] && { [ -x .venv/bin/python ] && PY=$PWD/.venv/bin/python || PY=/opt/torch/.venv/bin/python; }
B=${SHARDGAN_BUILD:-build}
DATA=()
[ -n "${SHARDGAN_DATA:-}" ] && DATA=(--set data.path="$SHARDGAN_DATA")
launch() {  # np, arguments of shardgan-train; runs at most ${LAUNCH_TIMEOUT:-600} s
  local np=$1; shift
  if [ "$np" -eq 1 ] && [ -n "${SHARDGAN_SINGLETON:-}" ]; then
    timeout "${LAUNCH_TIMEOUT:-600}" "$B/shardgan-train" "$@"
  else
    timeout "${LAUNCH_TIMEOUT:-600}" mpirun -np "$np" --oversubscribe "$B/shardgan-train" "$@"
  fi
}
if [ -z "${SHARDGAN_BUILD:-}" ] && { [ ! -x build/shardgan-train ] || [ ! -x build/tests/test_gpu ]; }; then
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DSHARDGAN_PYTHON="$PY" > "$R/cmake.txt" 2>&1 \
    || { log "cmake failed: see $R/cmake.txt"; tail -20 "$R/cmake.txt"; exit 1; }
  cmake --build build -j "$(nproc)" --target shardgan-train shardgan_tests > "$R/build.txt" 2>&1 \
    || { log "build failed: see $R/build.txt"; tail -30 "$R/build.txt"; exit 1; }
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >> "$R/gpus.txt" 2>&1
"$B/shardgan-train" --version > "$R/version.txt" 2>&1
log "$(grep -iE 'torch|cuda|nccl' "$R/version.txt" | tr '\n' ';')"

fails=0
# 1. The gpu tests (GPU_TESTS=0 skips them).
if [ "${GPU_TESTS:-1}" = 1 ]; then
if [ -f "$B/CTestTestfile.cmake" ]; then
  (cd "$B" && ctest -L gpu --output-on-failure) > "$R/ctest-gpu.txt" 2>&1 && log "PASS: ctest -L gpu" \
    || { log "FAIL: ctest -L gpu (see $R/ctest-gpu.txt)"; fails=$((fails + 1)); }
  cp "$B/Testing/Temporary/LastTest.log" "$R/ctest-gpu-full.txt" 2>/dev/null
else  # a bundle: the test binary itself (a singleton MPI process, as ctest runs it with -np 1)
  "$B/tests/test_gpu" > "$R/ctest-gpu.txt" 2>&1 && log "PASS: test_gpu" \
    || { log "FAIL: test_gpu (see $R/ctest-gpu.txt)"; fails=$((fails + 1)); }
  cp "$R/ctest-gpu.txt" "$R/ctest-gpu-full.txt"
fi
grep -E "^\[ +(OK|FAILED|SKIPPED) +\]" "$R/ctest-gpu-full.txt" | tee -a "$R/summary.txt"
fi

# 2./3. 200 demo steps per cell. Peak device memory: the largest `memory.used` nvidia-smi
# reports while the run lasts (includes the CUDA context, ~0.5 GiB).
STEPS=${STEPS:-200}
run_cell() {  # name, np, config, extra args...
  local name=$1 np=$2 cfg=$3; shift 3
  local dir="$R/$name" mon=""
  rm -rf "$dir"
  if [[ "$name" == cuda* ]]; then
    (while true; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; sleep 0.2; done) \
      > "$R/$name.mem" 2>/dev/null &
    mon=$!
  fi
  local t0=$SECONDS
  LAUNCH_TIMEOUT=${CELL_TIMEOUT:-300} launch "$np" "$cfg" --set run.dir="$dir" --set eval.enabled=false \
    --set train.plots=false "${DATA[@]}" "$@" > "$R/$name.log" 2>&1
  local rc=$?
  [ -n "$mon" ] && kill "$mon" 2>/dev/null
  log "$name: rc $rc after $((SECONDS - t0)) s"
  launch "$np" "$cfg" --set run.dir="$dir.dry" --dry-run "${DATA[@]}" "$@" > "$R/$name.dry.json" 2>/dev/null
  "$PY" - "$name" "$dir/metrics.jsonl" "$R/$name.mem" "$R/$name.dry.json" "$rc" >> "$R/cells.jsonl" <<'PY'
import json, statistics, sys, os
name, metrics, mem, dry, rc = sys.argv[1:6]
rows = [json.loads(l) for l in open(metrics)] if os.path.exists(metrics) else []
steps = [r["step_time_s"] for r in rows if "step_time_s" in r][2:]
def med(key):
    v = [r[key] for r in rows[2:] if key in r]
    return statistics.median(v) if v else None
peak = max((int(x) for x in open(mem) if x.strip().isdigit()), default=None) if os.path.exists(mem) else None
used = max((r["device_mem_used_bytes"] for r in rows if "device_mem_used_bytes" in r), default=None)
try:
    d = json.load(open(dry))
except Exception:
    d = {}
print(json.dumps({"cell": name, "rc": int(rc), "steps": len(rows), "median_step_s": statistics.median(steps) if steps else None,
                  "peak_device_mib": peak, "device_used_after_step_mib": used and used // 2**20,
                  "optimizer_s": med("time_optimizer_s"), "optimizer_io_s": med("time_optimizer_io_s"),
                  "losses": [[r.get("loss_d"), r.get("loss_g")] for r in rows],
                  "loss_d_last": rows[-1]["loss_d"] if rows else None, "preflight": d.get("per_rank", d)}))
PY
  [ $rc -eq 0 ] && log "PASS: $name" || { log "FAIL: $name exited $rc (see $R/$name.log)"; fails=$((fails + 1)); }
}
if [ "${DEMO_CELLS:-1}" = 1 ]; then  # DEMO_CELLS=0 skips steps 2-4 (the demo cells and the resumes)
DEMO=(configs/fmnist-dcgan.yaml --set train.steps="$STEPS" --set train.log_every=1)
run_cell cuda-stage3 1 "${DEMO[@]}" --set run.device=cuda --set sharding.generator.stage=3 --set sharding.discriminator.stage=3
run_cell cuda-stage0 1 "${DEMO[@]}" --set run.device=cuda --set sharding.generator.stage=0 --set sharding.discriminator.stage=0
run_cell cpu-stage3 1 "${DEMO[@]}" --set run.device=cpu --set sharding.generator.stage=3 --set sharding.discriminator.stage=3
# Mixed precision and offload on the GPU, same 200 steps at stage 3 (bounds: none; each must
# train without a non-finite step, which the summary's loss_d_last and the log show).
S3=(--set run.device=cuda --set sharding.generator.stage=3 --set sharding.discriminator.stage=3)
run_cell cuda-bf16 1 "${DEMO[@]}" "${S3[@]}" --set sharding.generator.compute_dtype=bfloat16 \
  --set sharding.discriminator.compute_dtype=bfloat16
run_cell cuda-fp16 1 "${DEMO[@]}" "${S3[@]}" --set sharding.generator.compute_dtype=float16 \
  --set sharding.discriminator.compute_dtype=float16
run_cell cuda-offload-cpu 1 "${DEMO[@]}" "${S3[@]}" --set offload.generator.optimizer=cpu \
  --set offload.discriminator.optimizer=cpu
run_cell cuda-offload-disk 1 "${DEMO[@]}" "${S3[@]}" --set offload.generator.optimizer=disk \
  --set offload.discriminator.optimizer=disk --set offload.generator.param=disk --set offload.discriminator.param=disk \
  --set ema.enabled=false
cat "$R/cells.jsonl" | tee -a "$R/summary.txt"

# Losses, first 5 steps, GPU against CPU. Both run the same float32 program on the same
# data, latents and initial weights (drawn on the host), so they differ only by rounding:
# cuDNN/cuBLAS sum in other orders (and cuDNN convolutions may use TF32, unit roundoff
# 2^-11 = 4.9e-4, where the CPU rounds at 2^-24). A hinge/BCE loss that is a mean over the
# batch inherits a relative error of about that roundoff times the depth of the network
# (4 layers each way): ~2e-3 at step 1, which the next updates can grow by the Adam step
# (lr 2e-4 per weight). Bound: |a - b| <= 1e-2 * max(1, |b|) for steps 1-5. A wrong device
# placement, a skipped reduction or different data differs by O(1) at step 1.
"$PY" - "$R/cuda-stage3/metrics.jsonl" "$R/cpu-stage3/metrics.jsonl" >> "$R/summary.txt" <<'PY' \
  && log "PASS: losses of steps 1-5 on cuda and cpu agree within 1e-2 relative" \
  || { log "FAIL: GPU and CPU losses differ (see $R/summary.txt)"; fails=$((fails + 1)); }
import json, sys
a = {r["step"]: r for r in map(json.loads, open(sys.argv[1]))}
b = {r["step"]: r for r in map(json.loads, open(sys.argv[2]))}
bad = 0
for s in sorted(set(a) & set(b))[:5]:
    for k in ("loss_d", "loss_g"):
        d = abs(a[s][k] - b[s][k]); tol = 1e-2 * max(1.0, abs(b[s][k]))
        print(f"step {s} {k}: cuda {a[s][k]:.6f} cpu {b[s][k]:.6f} diff {d:.2e} tol {tol:.2e}")
        bad += d > tol
last = max(set(a) & set(b), default=None)
if last is not None:
    print(f"step {last} (no bound: chaotic after many updates): loss_d cuda {a[last]['loss_d']:.4f} cpu {b[last]['loss_d']:.4f}")
sys.exit(1 if bad or last is None else 0)
PY

# 4. The stage-3 GPU checkpoint resumed on the CPU, one more step.
launch 1 configs/fmnist-dcgan.yaml --set run.dir="$R/cpu-resume" --set run.device=cpu "${DATA[@]}" \
  --set sharding.generator.stage=3 --set sharding.discriminator.stage=3 --set eval.enabled=false \
  --set train.steps=$((STEPS + 1)) --resume "$R/cuda-stage3" > "$R/cpu-resume.log" 2>&1 \
  && log "PASS: the GPU checkpoint resumed on the CPU" \
  || { log "FAIL: resuming the GPU checkpoint on the CPU (see $R/cpu-resume.log)"; fails=$((fails + 1)); }
launch 1 configs/fmnist-dcgan.yaml --set run.dir="$R/cuda-resume" --set run.device=cuda "${DATA[@]}" \
  --set sharding.generator.stage=3 --set sharding.discriminator.stage=3 --set eval.enabled=false \
  --set train.steps=$((STEPS + 1)) --resume "$R/cpu-stage3" > "$R/cuda-resume.log" 2>&1 \
  && log "PASS: the CPU checkpoint resumed on the GPU" \
  || { log "FAIL: resuming the CPU checkpoint on the GPU (see $R/cuda-resume.log)"; fails=$((fails + 1)); }

fi  # DEMO_CELLS
same_losses() {  # what, cell a, cell b: every step's (loss_d, loss_g) the same bits
  "$PY" - "$R/$2/metrics.jsonl" "$R/$3/metrics.jsonl" "$2" "$3" >> "$R/summary.txt" <<'PY' \
    && log "PASS: $1 give the same losses" || { log "FAIL: $1 changed the losses (see $R/summary.txt)"; fails=$((fails + 1)); }
import json, sys
a, b = ([(r["loss_d"], r["loss_g"], r.get("step_time_s")) for r in map(json.loads, open(f))] for f in sys.argv[1:3])
print(sys.argv[3], "(loss_d, loss_g, step_time_s):", a); print(sys.argv[4], ":", b)
sys.exit(0 if a and [x[:2] for x in a] == [x[:2] for x in b] else 1)
PY
}
# 5. The 1.03e9 BigGAN on one GPU (synthetic data, bfloat16 compute, float32 master state).
if [ "${BIG:-1}" = 1 ]; then
  : >> "$R/cells.jsonl"  # none yet with DEMO_CELLS=0
  big_cell() {  # name, extra args: one cell, its line shown; its 12 GB checkpoint removed
    local name=$1; shift
    mv "$R/cells.jsonl" "$R/cells.jsonl.demo"
    CELL_TIMEOUT=${BIG_TIMEOUT:-240} run_cell "$name" 1 configs/biggan-1b.yaml --set run.device=cuda \
      --set train.global_batch="${BIG_BATCH:-8}" "$@"
    cat "$R/cells.jsonl" | tee -a "$R/summary.txt"; cat "$R/cells.jsonl" >> "$R/cells.jsonl.demo"
    mv "$R/cells.jsonl.demo" "$R/cells.jsonl"
    rm -rf "$R/$name/checkpoints"
  }
  big_cell cuda-biggan-1b --set train.steps="${BIG_STEPS:-5}"
  if [ "${BIG_PAIRS:-1}" = 1 ]; then  # BIG_PAIRS=0: only the cell above
  # 5b. The same with dist.blocking_wait (the host waits for every all-gather and
  # reduce-scatter, as before device-side waits): the same kernels in the same stream
  # order, so the same loss bits; the step times compare the two waits.
  big_cell cuda-biggan-1b-blocking-wait --set train.steps="${BIG_STEPS:-5}" --set dist.blocking_wait=true
  same_losses "device-side and host-side waits" cuda-biggan-1b cuda-biggan-1b-blocking-wait
  # 6. ZeRO-Offload on the GPU: overlapped against synchronous copies, same bits.
  for ov in true false; do
    big_cell "cuda-biggan-1b-offload-overlap-$ov" --set train.steps=$((${BIG_STEPS:-5} - 1)) \
      --set offload.generator.optimizer=cpu --set offload.discriminator.optimizer=cpu --set offload.overlap_copies=$ov
  done
  same_losses "offload with and without overlapped copies" cuda-biggan-1b-offload-overlap-true \
    cuda-biggan-1b-offload-overlap-false
  fi  # BIG_PAIRS
fi
# 7. (AC=1, the default) Activation checkpointing on the GPU, 1 rank, stage 3,
# float32, synthetic data, run.deterministic (cuDNN's and cuBLAS's deterministic algorithms,
# so that the replay and the first forward pick the same kernels): each geometry with
# sharding.*.activation_checkpointing off and then on (with checkpoint_segments). The losses
# must be the same bits; the caching allocator's peak of live tensor bytes
# (device_mem_peak_allocated_bytes, torch.cuda.max_memory_allocated(), the largest over the
# steps after the first, which also holds the set-up) and the median step time (steps 2..)
# are compared in ac-gpu.jsonl:
#  - BigGAN-PyTorch's 64x64 geometry (12.9M parameters, fused upsampling, channels-last) at
#    AC_BATCH (32) per rank, as benchmarks/activation_checkpointing.sh runs it on the CPU;
#  - the deep 59.4M geometry (configs/biggan-1b.yaml at ch 15) at AC_DEEP_BATCH (128).
if [ "${AC:-1}" = 1 ]; then
  AC_COMMON=(--set run.device=cuda --set run.deterministic=true --set train.steps="${AC_STEPS:-6}" --set train.log_every=1
    --set train.checkpoint_every=0 --set train.sample_every=0 --set data.source=synthetic
    --set sharding.generator.stage=3 --set sharding.discriminator.stage=3
    --set sharding.generator.compute_dtype=auto --set sharding.discriminator.compute_dtype=auto
    --set sharding.generator.reduce_dtype=auto --set sharding.discriminator.reduce_dtype=auto)
  ac_pair() {  # name, batch, config and overrides...
    local name=$1 batch=$2; shift 2
    for ac in false true; do
      run_cell "cuda-ac-$name-$ac" 1 "$@" "${AC_COMMON[@]}" --set train.global_batch="$batch" \
        --set data.synthetic_size="$batch" \
        --set sharding.generator.activation_checkpointing=$ac --set sharding.discriminator.activation_checkpointing=$ac \
        --set sharding.generator.checkpoint_segments=$ac --set sharding.discriminator.checkpoint_segments=$ac
      rm -rf "$R/cuda-ac-$name-$ac/checkpoints" "$R/cuda-ac-$name-$ac.dry"
    done
    same_losses "activation checkpointing off and on ($name, batch $batch)" "cuda-ac-$name-false" "cuda-ac-$name-true"
    "$PY" - "$R/cuda-ac-$name-false/metrics.jsonl" "$R/cuda-ac-$name-true/metrics.jsonl" "$name" "$batch" \
      <<'PY' | tee -a "$R/ac-gpu.jsonl" "$R/summary.txt"
import json, statistics, sys
off, on = ([json.loads(l) for l in open(f) if '"loss_d"' in l] for f in sys.argv[1:3])
def summary(rows):
    return {"peak_allocated_gib": max(r.get("device_mem_peak_allocated_bytes", -1) for r in rows[1:]) / 2**30,
            "device_used_gib": max(r.get("device_mem_used_bytes", -1) for r in rows) / 2**30,
            "step_s": statistics.median(r["step_time_s"] for r in rows[1:])}
a, b = summary(off), summary(on)
print(json.dumps({"bench": "activation_checkpointing_gpu", "geometry": sys.argv[3], "batch_per_rank": int(sys.argv[4]),
                  "off": a, "on": b, "peak_ratio": b["peak_allocated_gib"] / a["peak_allocated_gib"],
                  "step_ratio": b["step_s"] / a["step_s"],
                  "same_losses": [(r["loss_d"], r["loss_g"]) for r in off] == [(r["loss_d"], r["loss_g"]) for r in on]}))
PY
  }
  ac_pair 64x64 "${AC_BATCH:-32}" configs/fmnist-biggan.yaml --set model.ch=32 --set model.d_ch=32 \
    --set model.g_ch_mult=[16,16,8,4,2] --set model.d_ch_mult=[1,2,4,8,16] --set model.g_attn=32 --set model.d_attn=32 \
    --set model.z_dim=120 --set model.channels_last=true --set model.fused_upsample=true
  ac_pair deep59m "${AC_DEEP_BATCH:-128}" configs/biggan-1b.yaml --set model.ch=15 --set model.d_ch=15
fi
# 8. NCCL between ranks.
RANKS=${RANKS:-${GPUS:-1}}
if [ "$RANKS" -ge 2 ]; then
  log "NCCL between $RANKS ranks on $(grep -c '^GPU' "$R/gpus.txt") GPU(s); NCCL_MULTI_RANK_GPU_ENABLE=${NCCL_MULTI_RANK_GPU_ENABLE:-unset}"
  ranks_test() {  # name, gtest filter
    timeout "${LAUNCH_TIMEOUT:-600}" mpirun -np "$RANKS" --oversubscribe "$B/tests/test_gpu_ranks" \
      --gtest_filter="$2" > "$R/$1.txt" 2>&1 && log "PASS: $1 ($RANKS ranks)" \
      || { log "FAIL: $1 ($RANKS ranks; see $R/$1.txt)"; fails=$((fails + 1)); }
    grep -E "^\[ +(OK|FAILED|SKIPPED) +\]|\[ gpu \]" "$R/$1.txt" | sort -u | tee -a "$R/summary.txt"
  }
  ranks_test gpu-ranks "-GpuRanks.TimeoutAbortsTheCommunicator"
  ranks_test gpu-ranks-timeout "GpuRanks.TimeoutAbortsTheCommunicator"
  F64=(configs/fmnist-dcgan.yaml --set train.steps="${RANKS_STEPS:-10}" --set train.log_every=1 --set run.device=cuda
    --set model.dtype=float64 --set run.tf32=false --set train.checkpoint_every=0 --set train.sample_every=0)
  run_cell cuda-f64-np1-stage3 1 "${F64[@]}"
  for st in 3 2; do
    run_cell "cuda-f64-np$RANKS-stage$st" "$RANKS" "${F64[@]}" --set sharding.generator.stage=$st \
      --set sharding.discriminator.stage=$st
    "$PY" - "$R/cuda-f64-np1-stage3/metrics.jsonl" "$R/cuda-f64-np$RANKS-stage$st/metrics.jsonl" >> "$R/summary.txt" <<'PY' \
      && log "PASS: float64 losses of steps 1-5, $RANKS ranks at stage $st against 1 rank, within 1e-9" \
      || { log "FAIL: $RANKS ranks at stage $st against 1 rank (see $R/summary.txt)"; fails=$((fails + 1)); }
import json, sys
a, b = ({r["step"]: r for r in map(json.loads, open(f)) if "loss_d" in r} for f in sys.argv[1:3])
steps = sorted(set(a) & set(b))[:5]
bad = 0
for s in steps:
    for k in ("loss_d", "loss_g"):
        d = abs(a[s][k] - b[s][k]); tol = 1e-9 * max(1.0, abs(a[s][k]))
        print(f"step {s} {k}: 1 rank {a[s][k]!r} N ranks {b[s][k]!r} diff {d:.2e}")
        bad += d > tol
sys.exit(1 if bad or len(steps) < 5 else 0)
PY
  done
  run_cell "cuda-f32-np$RANKS-stage3" "$RANKS" configs/fmnist-dcgan.yaml --set train.log_every=1 \
    --set run.device=cuda --set train.steps="${RANKS_F32_STEPS:-100}"
  tail -4 "$R/cells.jsonl" >> "$R/summary.txt"
fi
log "$fails failed"
[ $fails -eq 0 ]
