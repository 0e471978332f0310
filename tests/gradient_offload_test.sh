#!/usr/bin/env bash
# Gradient offload (offload.<model>.gradient: cpu | disk) end to end through shardgan-train.
# Each reduced gradient shard is added into the offload tier as its reduce-scatter
# completes, and the offloaded Adam step reads it from there, so every run must end in the
# same checkpoint, bit for bit (h5diff, no tolerance: parameters, Adam moments, EMA, RNG),
# as the same run with no offload at all:
#   - DCGAN, 2 ranks, ZeRO-3, 2 micro-batches (the second reduction is read, added and
#     written back) and clipping at norm 0.5 (the norm read from the tier, the scaled
#     shards written back), with the gradient alone, and with the master shards too;
#   - G at stage 2 and D at stage 3, 3 ranks (padding on every unit);
#   - HSDP, 4 ranks in 2 replica groups (the replica average reads and writes the tier);
#   - bfloat16 compute and reduction for D (each bfloat16 sum scaled by 1/N as it is added
#     into the float32 shard in the tier);
#   - the conditional BigGAN, 2 ranks, with the R1 penalty (the double backward's
#     reductions go to the tier too).
# memory.json holds no gradient bytes with the disk tier; metrics.jsonl times the tier.
# A checkpoint written with gradient offload resumes without it, equal to a straight run.
# Bad combinations end every rank with a message naming the key.
# Negative control, in every run of this test: with SHARDGAN_TEST_CONTROL=
# grad_offload_stale_first (src/sharding/unit_collectives.cpp), accumulate_grad adds the first
# reduction of a step onto the tier's stale values (first ignored); the clipped 2-micro-batch
# case with the cpu tier must then differ from the run without offload. Run once by hand
# for every parity case, it failed each.
TRAIN=$1; CKPT=$2; SRC=$3
source "$(dirname "$0")/lib.sh"
T=$(mktemp -d /tmp/shardgan-gradoff.XXXXXX)
COMMON=(--set data.source=synthetic --set data.synthetic_size=72 --set train.global_batch=12
        --set train.log_every=1 --set train.sample_every=0 --set train.checkpoint_every=0
        --set run.seed=7 --set train.plots=false --set offload.buffer_bytes=1048576 --set offload.buffer_count=3)
DCGAN=("$SRC/configs/fmnist-dcgan.yaml" --set model.g_width=64 --set model.d_width=64 --set ema.enabled=false)
BIGGAN=("$SRC/configs/fmnist-biggan.yaml" --set model.ch=8 --set model.d_ch=8 --set model.z_dim=8
        --set model.shared_dim=8 --set ema.enabled=false)
# offload DEVICE [param]: optimizer state and gradients of both models on DEVICE (and the
# master shards with "param").
offload() {
  local m
  for m in generator discriminator; do
    echo --set offload.$m.optimizer=$1 --set offload.$m.gradient=$1
    [ "${2:-}" = param ] && echo --set offload.$m.param=$1
  done
}

run() {  # run NAME NP STEPS ARGS...: trains into $T/NAME
  local name=$1 np=$2 steps=$3; shift 3
  timeout 600 "${MPIRUN[@]}" -np "$np" "$TRAIN" "$@" "${COMMON[@]}" --set train.steps="$steps" \
    --set run.dir="$T/$name" > "$T/$name.log" 2>&1
}
ckpt() { echo "$T/$1/checkpoints/step-$(printf %08d "$2")"; }
same() {  # same A B STEP: the two runs' checkpoints at STEP are identical (lib.sh's
  # checkpoints_identical: the same non-empty set of rank files, no NaN or infinity, and
  # /generator, /discriminator and /rng bit for bit; under HSDP only replica group 0's files
  # hold the models, the other ranks' files /rng); prints what differs.
  checkpoints_identical "$(ckpt "$1" "$3")" "$(ckpt "$2" "$3")"
}

check_parity() {  # check_parity LABEL NP MODES ARGS...; MODES: "grad" and/or "param"
  local label=$1 np=$2 modes=$3; shift 3
  run "$label-none" "$np" 4 "$@" || { bad "$label: run without offload: $(tail -3 "$T/$label-none.log")"; return; }
  for mode in $modes; do
    for dev in cpu disk; do
      local what="gradient offload $dev" flags; flags=$(offload $dev)
      [ "$mode" = param ] && { what="gradient + parameter offload $dev"; flags=$(offload $dev param); }
      if ! run "$label-$mode-$dev" "$np" 4 "$@" $flags; then
        bad "$label $what: $(tail -3 "$T/$label-$mode-$dev.log")"; continue
      fi
      same "$label-none" "$label-$mode-$dev" 4 && ok "$label: $what is bit-identical to none" \
        || bad "$label: $what differs from none"
    done
  done
}

check_parity dcgan-z3-accum-clip 2 "grad param" "${DCGAN[@]}" --set train.micro_batches=2 --set train.grad_clip=0.5
check_parity dcgan-g2d3-np3 3 grad "${DCGAN[@]}" --set sharding.generator.stage=2
check_parity dcgan-hsdp-np4 4 grad "${DCGAN[@]}" --set sharding.generator.replicate_degree=2 \
  --set sharding.discriminator.replicate_degree=2
check_parity dcgan-d-bf16 2 grad "${DCGAN[@]}" --set sharding.discriminator.compute_dtype=bfloat16 \
  --set sharding.discriminator.reduce_dtype=bfloat16
check_parity biggan-r1-np2 2 grad "${BIGGAN[@]}" --set train.r1_gamma=0.1

# The negative control: the first reduction of each step added onto the tier's stale
# values must make the parity check fail (a run that did not finish does not count).
# shellcheck disable=SC2046
if (export SHARDGAN_TEST_CONTROL=grad_offload_stale_first
    run dcgan-control 2 4 "${DCGAN[@]}" --set train.micro_batches=2 --set train.grad_clip=0.5 $(offload cpu)); then
  out=$(same dcgan-z3-accum-clip-none dcgan-control 4) && bad "negative control (grad_offload_stale_first): parity still holds" \
    || { grep -q "differs" <<< "$out" && ok "negative control (grad_offload_stale_first) fails the parity check: $(head -1 <<< "$out" | cut -c1-160)" \
           || bad "negative control: failed for another reason: $(head -3 <<< "$out")"; }
else
  bad "negative control run: $(tail -3 "$T/dcgan-control.log")"
fi

# Clipping took effect, so its path through the tier was exercised: the same run unclipped
# ends elsewhere.
run dcgan-z3-accum-noclip 2 4 "${DCGAN[@]}" --set train.micro_batches=2 \
  && ! same dcgan-z3-accum-clip-none dcgan-z3-accum-noclip 4 > /dev/null \
  && ok "clipping at 0.5 changed the run (the clipped path was taken)" || bad "clipping at 0.5 changed nothing"

# The disk tier: no gradient bytes resident (both models at stage 3), and the tier's time
# in the metrics; without it, the gradient shards are counted.
[ "$(grep -c '"grad_shard_bytes": 0,' "$T/dcgan-z3-accum-clip-grad-disk/memory.json")" = 2 ] \
  && [ "$(grep -c '"grad_shard_bytes": 0,' "$T/dcgan-z3-accum-clip-none/memory.json")" = 0 ] \
  && ok "memory.json: no resident gradient bytes with the disk tier, some without" \
  || bad "memory.json grad_shard_bytes: $(grep grad_shard_bytes "$T/dcgan-z3-accum-clip-grad-disk/memory.json")"
grep -qE '"time_offload_grad_s":0\.[0-9]*[1-9]' "$T/dcgan-z3-accum-clip-grad-disk/metrics.jsonl" \
  && ok "metrics.jsonl times the gradient tier" || bad "no time_offload_grad_s > 0 in metrics.jsonl"
grep -q "offload: generator optimizer state, gradients on disk" "$T/dcgan-z3-accum-clip-grad-disk.log" \
  && ok "the log names the gradients among the disk tier's contents" || bad "log: $(grep -m1 'offload:' "$T/dcgan-z3-accum-clip-grad-disk.log")"
# The dry run counts each tier on disk: 3 arrays (2 moments + gradient) of S floats.
timeout 300 "${MPIRUN[@]}" -np 2 "$TRAIN" "${DCGAN[@]}" "${COMMON[@]}" $(offload disk) --set run.dir="$T/dry" \
  --dry-run > "$T/dry.json" 2> "$T/dry.err" \
  && grep -q '"offload_disk_bytes"' "$T/dry.json" && ok "--dry-run reports offload_disk_bytes" \
  || bad "--dry-run: $(tail -3 "$T/dry.err")"

# Resume: 2 steps with gradient offload on disk, then 2 more without, equal to 4 straight.
run resume 2 2 "${DCGAN[@]}" --set train.micro_batches=2 --set train.grad_clip=0.5 $(offload disk) \
  --set train.checkpoint_every=2 || bad "resume: the first 2 steps: $(tail -3 "$T/resume.log")"
timeout 600 "${MPIRUN[@]}" -np 2 "$TRAIN" "${DCGAN[@]}" "${COMMON[@]}" --set train.micro_batches=2 \
  --set train.grad_clip=0.5 --set train.steps=4 --set run.dir="$T/resume" --resume "$T/resume" > "$T/resume-2.log" 2>&1 \
  || bad "resume: $(tail -3 "$T/resume-2.log")"
same dcgan-z3-accum-clip-none resume 4 && ok "gradient disk offload -> none: resumed run bit-identical to 4 straight steps" \
  || bad "the resumed run differs"

expect_key() {  # expect_key KEY TEXT ARGS...
  local key=$1 text=$2; shift 2
  timeout 120 "${MPIRUN[@]}" -np 2 "$TRAIN" "${DCGAN[@]}" "${COMMON[@]}" --set train.steps=1 --set run.dir="$T/err" "$@" \
    > "$T/err.log" 2>&1 && { bad "$key: accepted"; return; }
  [ "$(grep -c "'$key'.*$text" "$T/err.log")" -ge 2 ] && ok "$key: both ranks: $text" \
    || bad "$key: $(grep -m2 -i "error" "$T/err.log")"
}
expect_key offload.generator.gradient "needs sharding.generator.stage 2 or 3" \
  --set offload.generator.optimizer=disk --set offload.generator.gradient=disk --set sharding.generator.stage=1
expect_key offload.discriminator.gradient "needs offload.discriminator.optimizer on the same device" \
  --set offload.discriminator.optimizer=disk --set offload.discriminator.gradient=cpu
expect_key offload.generator.gradient "needs offload.generator.optimizer on the same device" \
  --set offload.generator.gradient=disk
expect_key offload.generator.gradient "expected none, cpu or disk" --set offload.generator.gradient=nvme
rm -rf "$T"
finish
