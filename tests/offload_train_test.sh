#!/usr/bin/env bash
# Optimizer and parameter offload end to end through shardgan-train (issue 9). Every run
# with offload.<model>.optimizer cpu or disk, and at stage 3 also with
# offload.<model>.param on the same device, must end in the same checkpoint, bit for bit
# (h5diff, no tolerance, every parameter and Adam moment), as the same run without:
# DCGAN on 1, 2 and 3 ranks (stage 3, and G at 2 with D at 1), a small BigGAN on 1 and 3
# ranks. Checkpoints saved with disk offload (optimizer, and optimizer + parameters) resume
# without it and the other way round, equal to an uninterrupted run. A missing
# offload.path and bad combinations end every rank with a message naming the path or key,
# and leave the previous checkpoint intact.
TRAIN=$1; CKPT=$2; SRC=$3
source "$(dirname "$0")/lib.sh"
T=$(mktemp -d /tmp/shardgan-offload.XXXXXX)
# Small rings (1 MiB, the least the config takes): the D and G units span many chunks.
COMMON=(--set data.source=synthetic --set data.synthetic_size=72 --set train.global_batch=12
        --set train.log_every=1 --set train.sample_every=0 --set train.checkpoint_every=0
        --set run.seed=7 --set train.plots=false --set offload.buffer_bytes=1048576 --set offload.buffer_count=3)
# The generator's EMA reads its master shards, so every run that parameter offload is
# compared with (or resumed from) runs without it.
DCGAN=("$SRC/configs/fmnist-dcgan.yaml" --set model.g_width=64 --set model.d_width=64 --set ema.enabled=false)
BIGGAN=("$SRC/configs/fmnist-biggan.yaml" --set model.ch=8 --set model.d_ch=8 --set model.z_dim=8
        --set model.shared_dim=8 --set ema.start_step=0)
both() { echo --set offload.generator.optimizer=$1 --set offload.discriminator.optimizer=$1; }
params() { echo $(both $1) --set offload.generator.param=$1 --set offload.discriminator.param=$1; }

# run NAME NP STEPS ARGS...: trains into $T/NAME.
run() {
  local name=$1 np=$2 steps=$3; shift 3
  timeout 600 "${MPIRUN[@]}" -np "$np" "$TRAIN" "$@" "${COMMON[@]}" --set train.steps="$steps" \
    --set run.dir="$T/$name" > "$T/$name.log" 2>&1
}
ckpt() { echo "$T/$1/checkpoints/step-$(printf %08d "$2")"; }
# same A B STEP NP: the two runs' checkpoints at STEP hold the same NP rank files, equal bit
# for bit in models, optimizer states and RNG, with no NaN or infinity on either side
# (checkpoints_identical, lib.sh); prints the failed checks.
same() {
  local a b n; a=$(ckpt "$1" "$3"); b=$(ckpt "$2" "$3")
  n=$(rank_files "$a" | wc -l)
  [ "$n" -eq "$4" ] || { echo "  $n rank files in $a, expected $4"; return 1; }
  checkpoints_identical "$a" "$b"
}

check_parity() {  # check_parity LABEL NP MODES ARGS...; MODES: "opt" or "opt param" (stage 3)
  local label=$1 np=$2 modes=$3; shift 3
  run "$label-none" "$np" 5 "$@" || { bad "$label: run without offload: $(tail -3 "$T/$label-none.log")"; return; }
  for mode in $modes; do
    for dev in cpu disk; do
      local what="optimizer offload $dev" flags; flags=$(both $dev)
      [ "$mode" = param ] && { what="optimizer + parameter offload $dev"; flags=$(params $dev); }
      if ! run "$label-$mode-$dev" "$np" 5 "$@" $flags; then
        bad "$label $what: $(tail -3 "$T/$label-$mode-$dev.log")"; continue
      fi
      same "$label-none" "$label-$mode-$dev" 5 "$np" && ok "$label: $what is bit-identical to none" \
        || bad "$label: $what differs from none"
    done
  done
}

for np in 1 2 3; do
  check_parity "dcgan-z3-np$np" $np "opt param" "${DCGAN[@]}"
done
check_parity "dcgan-g2d1-np2" 2 opt "${DCGAN[@]}" --set sharding.generator.stage=2 --set sharding.discriminator.stage=1
check_parity "biggan-np1" 1 "opt param" "${BIGGAN[@]}" --set ema.enabled=false
check_parity "biggan-np3" 3 "opt param" "${BIGGAN[@]}" --set ema.enabled=false

# The disk tier logs its file (rank 0 logs at info level), and removes it at a normal exit.
grep -q "offload: generator optimizer state on disk, $T/dcgan-z3-np2-opt-disk/offload/generator.rank0.offload" \
  "$T/dcgan-z3-np2-opt-disk.log" && ok "the disk tier names its per-rank file" || bad "no offload file in the log"
[ -z "$(ls -A "$T/dcgan-z3-np2-opt-disk/offload")" ] && ok "offload files removed at exit" \
  || bad "offload files left: $(ls "$T/dcgan-z3-np2-opt-disk/offload")"
grep -qE '"offloaded_bytes": [1-9]' "$T/dcgan-z3-np2-opt-disk/memory.json" && ok "memory.json reports offloaded_bytes" \
  || bad "memory.json: $(grep offloaded "$T/dcgan-z3-np2-opt-disk/memory.json")"
# With parameter offload the master shards leave RAM: both models' param_shard_bytes are 0
# at stage 3 (gathered units are transient), against a positive count without offload.
[ "$(grep -c '"param_shard_bytes": 0,' "$T/dcgan-z3-np2-param-disk/memory.json")" = 2 ] \
  && [ "$(grep -c '"param_shard_bytes": 0,' "$T/dcgan-z3-np2-opt-disk/memory.json")" = 0 ] \
  && ok "parameter offload: memory.json reports no resident parameter bytes" \
  || bad "parameter offload memory.json: $(grep param_shard_bytes "$T/dcgan-z3-np2-param-disk/memory.json")"

# Resume across offload settings, both ways, equal to 5 steps straight without offload.
# resume_across NAME LABEL FIRST SECOND: 3 steps with the flags FIRST, resumed to 5 with SECOND.
resume_across() {
  local name=$1 label=$2 first=$3 second=$4
  run "$name" 2 3 "${DCGAN[@]}" $first --set train.checkpoint_every=3 || bad "$label: the first 3 steps"
  timeout 600 "${MPIRUN[@]}" -np 2 "$TRAIN" "${DCGAN[@]}" "${COMMON[@]}" $second --set train.steps=5 \
    --set run.dir="$T/$name" --resume "$T/$name" > "$T/$name-2.log" 2>&1 \
    || bad "$label: the resume: $(tail -3 "$T/$name-2.log")"
  same dcgan-z3-np2-none "$name" 5 2 && ok "$label: resumed run bit-identical to 5 straight steps" \
    || bad "$label: the resumed run differs"
}
resume_across resume-a "optimizer + parameter disk offload -> none" "$(params disk)" ""
resume_across resume-b "none -> optimizer disk offload" "" "$(both disk)"
resume_across resume-c "none -> optimizer + parameter disk offload" "" "$(params disk)"

# Errors: every rank names the path or key, exits non-zero, and the checkpoint is intact.
before=$(cd "$(ckpt resume-b 5)" && sha256sum ./* | sha256sum)
timeout 300 "${MPIRUN[@]}" -np 2 "$TRAIN" "${DCGAN[@]}" "${COMMON[@]}" $(both disk) --set offload.path=/nonexistent/offload \
  --set train.steps=7 --set run.dir="$T/resume-b" --resume "$T/resume-b" > "$T/err-path.log" 2>&1 \
  && bad "a missing offload.path was accepted" || ok "a missing offload.path exits non-zero"
[ "$(grep -c "offload.path '/nonexistent/offload' does not exist" "$T/err-path.log")" -ge 2 ] \
  && ok "both ranks name the missing offload.path" || bad "missing path message: $(grep -m3 -i error "$T/err-path.log")"
after=$(cd "$(ckpt resume-b 5)" && sha256sum ./* | sha256sum)
[ "$before" = "$after" ] && "$CKPT" verify "$(ckpt resume-b 5)" > /dev/null 2>&1 \
  && ok "the previous checkpoint is intact and verifies" || bad "the previous checkpoint changed"
expect_key() {  # expect_key KEY TEXT ARGS...
  local key=$1 text=$2; shift 2
  timeout 120 "${MPIRUN[@]}" -np 2 "$TRAIN" "${DCGAN[@]}" "${COMMON[@]}" --set train.steps=1 --set run.dir="$T/err" "$@" \
    > "$T/err.log" 2>&1 && { bad "$key: accepted"; return; }
  [ "$(grep -c "'$key'.*$text" "$T/err.log")" -ge 2 ] && ok "$key: both ranks: $text" \
    || bad "$key: $(grep -m2 -i "error" "$T/err.log")"
}
expect_key offload.generator.param "needs sharding.generator.stage 3" --set offload.generator.param=disk \
  --set sharding.generator.stage=2
expect_key offload.discriminator.optimizer "needs optim.discriminator.type adam or adamw" \
  --set offload.discriminator.optimizer=cpu --set optim.discriminator.type=sgd
expect_key offload.generator.optimizer "expected none, cpu or disk" --set offload.generator.optimizer=nvme
expect_key offload.discriminator.param "needs offload.discriminator.optimizer on the same device" \
  --set offload.discriminator.param=disk --set offload.discriminator.optimizer=cpu
expect_key ema.enabled "cannot be true with offload.generator.param" $(params cpu) --set ema.enabled=true
rm -rf "$T"
finish
