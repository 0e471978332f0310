#!/usr/bin/env bash
# The PyTorch peer benchmark (docs/benchmarks-peers.md): shardgan, FSDP2 and DDP
# trained from the same step-0 checkpoint, one after the other, at N = 1, 2, 4 ranks.
#
#   benchmarks/peers/run.sh                         # every size in MODELS, N in NS
#   MODELS=dcgan NS="1 2" benchmarks/peers/run.sh   # a quick subset
#
# Environment (defaults in brackets):
#   MODELS    sizes to run, from: dcgan biggan60m biggan500m pix2pix stylegan2  [dcgan biggan60m]
#   NS        world sizes                                              [1 2 4]
#   STEPS     steps per run; step_s is the median of steps 3-10       [10]
#   SYSTEMS   shardgan fsdp2 ddp                                       [all three]
#   SG_STAGES shardgan's ZeRO stages (G and D alike)                   [0 2 3]
#   FSDP_STAGES  3: reshard_after_forward True, 2: False               [3 2]
#   OUT       results file                          [benchmarks/results/peers/peers.jsonl]
#   APPEND=1  append to OUT instead of starting it anew
#   BUILD     folder with shardgan-train and shardgan-data             [build]
#   CONFIGS   folder with fmnist-dcgan.yaml and biggan-1b.yaml         [configs]
#   WORK      scratch: data, step-0 checkpoints, run dirs, logs        [runs/peers]
#   PLOT      the plot's path, '' for none                    [docs/images/peers.png]
#   DEVICE    cpu, or cuda: shardgan with run.device=cuda, the peers on cuda:<local rank> over
#             NCCL with torch's fused Adam (one GPU per rank)                   [cpu]
#   TF32      cuda: 1 lets cuDNN convolutions use TF32 on both sides (the default), 0 keeps
#             them float32 (run.tf32 / torch.backends.cudnn.allow_tf32)               [1]
#   FMNIST    Fashion-MNIST's folder                  [/usr/share/datasets/fashion-mnist]
#   SHARDGAN_SINGLETON=1  1-rank shardgan runs start the binary itself, not mpirun (a machine
#             without Open MPI's launcher: scripts/gpu-bundle.sh)
#   WAIT_QUIET=S  before the first cell and each cell, wait up to S seconds for no
#             compiler (cc1plus) to run                                [0]
#   SG2_FSDP_DEFAULTS  stylegan2: after each FSDP2 stage-3 cell, one more attempt at FSDP2's
#             default settings (reshard_after_backward True), whose crash on path length's
#             double backward is recorded as a failed line with its error; 0 skips it    [1]
# Each cell's line says "quiet" or "contended" (a cc1plus ran before or after it) in `note`,
# and OUT.machine.txt gets `uptime` and the CPU at the start and the end.
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${SHARDGAN_PYTHON:-$PWD/.venv/bin/python}
BUILD=${BUILD:-build}
CONFIGS=${CONFIGS:-configs}
WORK=${WORK:-runs/peers}
OUT=${OUT:-benchmarks/results/peers/peers.jsonl}
MODELS=${MODELS:-dcgan biggan60m}
NS=${NS:-1 2 4}
STEPS=${STEPS:-10}
SYSTEMS=${SYSTEMS:-shardgan fsdp2 ddp}
SG_STAGES=${SG_STAGES:-0 2 3}
FSDP_STAGES=${FSDP_STAGES:-3 2}
PEERS=benchmarks/peers
DEVICE=${DEVICE:-cpu}
TF32=${TF32:-1}
FMNIST=${FMNIST:-/usr/share/datasets/fashion-mnist}
sg_train() {  # ranks, arguments of shardgan-train
  local n=$1; shift
  # --bind-to none: torchrun binds nothing, and mpirun's default binds 1 or 2 ranks to one
  # core each, where a 1-rank run's threads would share a core (shardgan then uses 1 thread).
  if [ "$n" -eq 1 ] && [ -n "${SHARDGAN_SINGLETON:-}" ]; then "$BUILD/shardgan-train" "$@"
  else mpirun -np "$n" --oversubscribe --bind-to none "$BUILD/shardgan-train" "$@"; fi
}
[ "$(id -u)" -eq 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export PYTHONWARNINGS=ignore::FutureWarning   # DDP's broadcast_buffers notice
unset OMP_NUM_THREADS                         # both sides pick cores / ranks themselves
mkdir -p "$WORK" "$(dirname "$OUT")"
[ "${APPEND:-0}" = 1 ] || { : > "$OUT"; : > "$OUT.machine.txt"; }

compiling() { pgrep -x cc1plus >/dev/null 2>&1; }
# Before the first cell and before each cell: wait up to WAIT_QUIET seconds for no compiler.
wait_quiet() {
  local waited=0
  while [ "${WAIT_QUIET:-0}" -gt 0 ] && compiling && [ "$waited" -lt "$WAIT_QUIET" ]; do sleep 30; waited=$((waited + 30)); done
  [ "$waited" -gt 0 ] && echo "[peers] waited ${waited}s for the compiler; $(compiling && echo 'still compiling' || echo quiet)"
  return 0
}
wait_quiet
machine() { echo "$1: $(date -Is) uptime:$(uptime) compiler: $(compiling && echo running || echo none)"; }
{ machine start; grep -m1 "model name" /proc/cpuinfo; echo "cores: $(nproc), $(free -g | awk '/Mem:/ {print $2}') GiB"
  "$BUILD/shardgan-train" --version 2>/dev/null | head -2; echo "binary: $BUILD/shardgan-train, $(stat -c %y "$BUILD/shardgan-train")"
  "$PY" -c 'import torch; print("peers: torch", torch.__version__, "over", "nccl" if "'"$DEVICE"'" == "cuda" else "gloo")'
  [ "$DEVICE" = cuda ] && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; } >> "$OUT.machine.txt"

DATA=$WORK/fmnist.h5
if [ ! -f "$DATA" ]; then
  "$BUILD/shardgan-data" convert "$FMNIST" -o "$DATA" || exit 1
fi
PAIRS=$WORK/fmnist-edges.h5   # pix2pix: images with their edge maps (convert --paired)
if [[ " $MODELS " == *" pix2pix"* ]] && [ ! -f "$PAIRS" ]; then
  "$BUILD/shardgan-data" convert --paired "$FMNIST" -o "$PAIRS" || exit 1
fi

# Common settings: the converted Fashion-MNIST read per rank (data.source hdf5), a line of
# metrics per step, nothing periodic, no EMA (the peers have none), float32 compute.
COMMON=(--set data.source=hdf5 --set train.log_every=1
        --set train.sample_every=0 --set train.checkpoint_every=0 --set train.keep_checkpoints=1
        --set train.plots=false --set ema.enabled=false --set run.device="$DEVICE"
        --set run.tf32="$([ "$TF32" = 1 ] && echo true || echo false)")
model_args() {  # config and --set arguments of a size
  case "$1" in
    dcgan) echo $CONFIGS/fmnist-dcgan.yaml ;;
    biggan60m|biggan500m)
      local ch=15; [ "$1" = biggan500m ] && ch=45
      # configs/biggan-1b.yaml's geometry at width ch, in float32 (model.dtype, compute auto):
      # ch 15: 59.2M parameters, ch 45: 514.5M. Global batch 4, d_steps 2, hinge, N02 init.
      # Separate real and fake D passes, as the PyTorch peers run them (peers/models.py), and
      # the MPI all-gather (node_shared_gather off), as the recorded results ran.
      echo $CONFIGS/biggan-1b.yaml --set model.ch=$ch --set model.d_ch=$ch --set train.d_joint_pass=false \
        --set sharding.generator.node_shared_gather=false --set sharding.discriminator.node_shared_gather=false \
        --set sharding.generator.compute_dtype=auto --set sharding.discriminator.compute_dtype=auto \
        --set sharding.generator.reduce_dtype=auto --set sharding.discriminator.reduce_dtype=auto ;;
    pix2pix) echo $CONFIGS/fmnist-pix2pix.yaml ;;
    stylegan2)
      # configs/fmnist-stylegan2.yaml at the cifar preset (conditional on the 10 classes, D
      # orig, mapping 2, D's label mapping 8, no style mixing), shrunk: 1x32x32 Fashion-MNIST,
      # z and w 64, channels min(1024 / r, 64) (0.59M parameters), global batch 16 with mbstd
      # group 4 (a divisor of the per-rank batch at N = 1, 2, 4), Adam lr 2.5e-3 betas (0, 0.99),
      # lazy R1 (gamma 0.01) and path length (weight 2, batch shrink 2) each every 2nd step:
      # steps 0 and 2 run D, D reg, G and G reg, step 1 runs D and G.
      echo $CONFIGS/fmnist-stylegan2.yaml --set model.preset=cifar --set model.channels=1 --set model.z_dim=64 \
        --set model.w_dim=64 --set model.channel_base=1024 --set model.channel_max=64 --set model.mbstd_group=4 \
        --set model.style_mixing=0 --set train.global_batch=16 --set train.r1_gamma=0.01 --set train.r1_every=2 \
        --set train.pl_weight=2 --set train.pl_every=2 --set train.pl_batch_shrink=2 --set augment.mode=none ;;
    *) echo "unknown model $1" >&2; return 1 ;;
  esac
}

state() { compiling && echo contended || echo quiet; }

for model in $MODELS; do
  read -r -a MARGS <<< "$(model_args "$model")" || exit 1
  data=$DATA; [[ $model == pix2pix* ]] && data=$PAIRS
  MARGS+=(--set data.path="$data")
  CK=$WORK/$model/step0/checkpoints/step-00000000
  if [ ! -f "$CK/index.h5" ]; then   # shardgan's step 0: the initial weights of every run
    rm -rf "$WORK/$model/step0"; mkdir -p "$WORK/$model"
    sg_train 1 "${MARGS[@]}" "${COMMON[@]}" --set run.dir="$WORK/$model/step0" \
      --set train.steps=0 --set sharding.generator.stage=0 --set sharding.discriminator.stage=0 \
      > "$WORK/$model/step0.log" 2>&1 || { echo "[peers] $model: step-0 checkpoint failed (see $WORK/$model/step0.log)"; exit 1; }
  fi
  for n in $NS; do
    for sys in $SYSTEMS; do
      case $sys in shardgan) stages=$SG_STAGES ;; fsdp2) stages=$FSDP_STAGES ;; ddp) stages=0 ;; esac
      cells=""
      for st in $stages; do
        cells+=" $st"
        # StyleGAN2 under FSDP2: the working cell (path length under set_reshard_after_backward
        # False), then FSDP2's default settings, which crash (docs/results.md#stylegan2-fsdp2)
        [ "$sys" = fsdp2 ] && [[ $model == stylegan2* ]] && [ "$st" = 3 ] && [ "${SG2_FSDP_DEFAULTS:-1}" = 1 ] \
          && cells+=" $st:defaults"
      done
      for cell in $cells; do
        st=${cell%%:*}
        variant=""; extra=()
        [ "$cell" != "$st" ] && { variant=-${cell#*:}; extra=(--fsdp-defaults); }
        tag=$model-$sys-n$n-s$st$variant
        log=$WORK/$model/$tag.log
        wait_quiet
        rec=$WORK/$model/$tag.json
        rm -f "$rec"
        before=$(state)
        # On a GPU: the device's memory in use (nvidia-smi, every 0.2 s) while the cell runs;
        # its largest value goes in the cell's line as gpu_peak_mib (the context included).
        mon=""
        if [ "$DEVICE" = cuda ]; then
          nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > "$WORK/$model/$tag.gpu" 2>/dev/null &
          mon=$!
        fi
        t0=$(date +%s)
        if [ "$sys" = shardgan ]; then
          run=$WORK/$model/$tag
          rm -rf "$run"
          sg_train "$n" "${MARGS[@]}" "${COMMON[@]}" \
            --set run.dir="$run" --set train.steps="$STEPS" \
            --set sharding.generator.stage="$st" --set sharding.discriminator.stage="$st" > "$log" 2>&1
          rc=$?
          [ $rc -eq 0 ] && "$PY" $PEERS/collect_shardgan.py "$run" --ckpt "$CK" --model "$model" --stage "$st" \
            --world-size "$n" --out "$rec" > /dev/null
          rm -rf "$run/checkpoints"   # the final checkpoint (12 bytes per parameter) is not needed
        else
          # torchrun sets OMP_NUM_THREADS=1 unless it is set; the peer then raises the
          # thread count itself, but an OpenMP runtime started at 1 thread ran the 2-thread
          # N = 1 DCGAN step 20x slower beside a compiler (3.3 s against 0.13 s), so it
          # starts at the count the peer will use: cores / ranks, as shardgan.
          OMP_NUM_THREADS=$(( $(nproc) / n > 0 ? $(nproc) / n : 1 )) \
          "$PY" -m torch.distributed.run --standalone --nproc_per_node "$n" $PEERS/train_peer.py \
            --ckpt "$CK" --data "$data" --system "$sys" --stage "$st" --steps "$STEPS" --model "$model" \
            --out "$rec" --device "$DEVICE" --tf32 "$TF32" "${extra[@]}" > "$log" 2>&1
          rc=$?
        fi
        after=$(state)
        [ -n "$mon" ] && kill "$mon" 2>/dev/null
        # the cell's line, with the machine state before and after it in `note`
        [ -s "$rec" ] && "$PY" -c 'import json, os, sys; r = json.loads(open(sys.argv[1]).readline()); r["note"] = sys.argv[2]
g = sys.argv[3]
if os.path.exists(g): r["gpu_peak_mib"] = max((int(x) for x in open(g) if x.strip().isdigit()), default=None)
print(json.dumps(r))' \
          "$rec" "$([ "$before$after" = quietquiet ] && echo quiet || echo "contended (cc1plus running: $before/$after)")" \
          "$WORK/$model/$tag.gpu" >> "$OUT"
        echo "[peers] $tag: exit $rc, $(( $(date +%s) - t0 )) s, $(state)$( [ $rc -ne 0 ] && echo "; log: $log")"
        # a cell that wrote no line (a crash): a failed line with the error from its log (the
        # signal, Python's fatal error and the innermost frame of train_peer.py that faulthandler
        # printed)
        [ -s "$rec" ] || "$PY" - "$sys" "$model" "$n" "$st" "$rc" "$log" "$variant" >> "$OUT" <<'PY'
import json, re, sys
sys_, model, n, st, rc, log, variant = sys.argv[1:]
lines = open(log, errors="replace").read().splitlines() if log else []
err = []
for pat in (r"exitcode\s*:\s*-?\d+.*\((SIG\w+)\)", r"(Fatal Python error: .*)", r'(File ".*train_peer\.py", line \d+ in \w+)',
            r"(\w+Error: .*)"):
    m = next((re.search(pat, l) for l in lines if re.search(pat, l) and "ChildFailedError" not in l), None)
    if m:
        err.append(m.group(1).strip())
rec = {"system": sys_, "model": model, "world_size": int(n), "stage": int(st), "failed": True, "exit": int(rc),
       "error": "; ".join(err) or "exit %s" % rc, "log": log}
if variant == "-defaults":
    rec["fsdp"] = ("fully_shard per unit, reshard_after_forward=True; default settings for the regularization "
                   "updates (reshard_after_backward=True)")
print(json.dumps(rec))
PY
      done
    done
  done
done
machine end >> "$OUT.machine.txt"
"$PY" $PEERS/compare.py "$OUT"
"$PY" $PEERS/report.py "$OUT" --plot "${PLOT-docs/images/peers.png}"
