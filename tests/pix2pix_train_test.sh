#!/usr/bin/env bash
# pix2pix (model.arch: pix2pix) end to end through shardgan-train: the U-Net's skips cross
# sharding units under the trainer's other features.
#   - A run resumed from its step-2 checkpoint equals the uninterrupted 4-step run, bit for
#     bit (2 ranks, ZeRO-3).
#   - Activation checkpointing, and disk offload of optimizer state, gradients and master
#     shards, leave it bit-identical.
#   - HSDP (4 ranks, 2 replica groups of 2) equals ZeRO-3 on 2 ranks within 1e-9 in float64.
#   - bfloat16 compute for both models (2 ranks) and stage 1 / stage 2 on 3 ranks train with
#     finite losses.
#   - shardgan-ckpt sample writes the A | G(A) | B grid from a checkpoint.
#   - Pairs in HDF5: `shardgan-data convert --paired` of Fashion-MNIST trains bit-identically
#     to the in-RAM edge pairs, and of a folder of A|B side-by-side images stores the left
#     halves as A and the right halves as B (read back with h5py); data.source paired reads
#     that folder and trains bit-identically to its converted file.
#   - A key set that has no effect (checkpoint.snapshot without checkpoint.async) is warned
#     about once in the job (rank 0; not again by the memory probe's stand-in world).
#   - Evaluation (with the FID classifier: the 5th argument, or <build>/fid/fmnist-classifier.h5
#     from the fid_classifier fixture; reported as not run without it): on the A|B folder it
#     scores Fashion-MNIST's edges, another task, so rank 0 warns once and the record carries
#     eval_set: fashion-mnist-edges; on the converted Fashion-MNIST pairs it does not warn.
#   - Configs it cannot take end every rank naming the key.
TRAIN=$1; CKPT=$2; SRC=$3; DATA=$4
CLASSIFIER=${5:-$(dirname "$TRAIN")/fid/fmnist-classifier.h5}
PY=${SHARDGAN_PYTHON:-python3}
source "$(dirname "$0")/lib.sh"
T=$(mktemp -d /tmp/shardgan-pix2pix.XXXXXX)
COMMON=(--set data.source=synthetic --set data.synthetic_size=48 --set train.global_batch=12
        --set train.log_every=1 --set train.sample_every=0 --set train.checkpoint_every=0
        --set run.seed=7 --set train.plots=false --set model.g_width=8 --set model.d_width=8)
P2P=("$SRC/configs/fmnist-pix2pix.yaml")
run() {  # run NAME NP STEPS ARGS...
  local name=$1 np=$2 steps=$3; shift 3
  timeout 600 "${MPIRUN[@]}" -np "$np" "$TRAIN" "${P2P[@]}" "${COMMON[@]}" --set train.steps="$steps" \
    --set run.dir="$T/$name" "$@" > "$T/$name.log" 2>&1
}
ckpt() { echo "$T/$1/checkpoints/step-$(printf %08d "$2")"; }
finite() {  # finite NAME: every logged loss of the run is finite
  python3 - "$T/$1/metrics.jsonl" <<'PY' && ok "$1: finite losses" || bad "$1: non-finite or missing losses"
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss_d"' in l]
sys.exit(0 if rows and all(math.isfinite(r[k]) for r in rows for k in ("loss_d", "loss_g", "loss_l1")) else 1)
PY
}

run straight 2 4 || bad "straight run: $(tail -3 "$T/straight.log")"
run resumed 2 2 --set train.checkpoint_every=2 || bad "first half: $(tail -3 "$T/resumed.log")"
run resumed 2 4 --resume "$T/resumed" || bad "resume: $(tail -3 "$T/resumed.log")"
same_checkpoint "$(ckpt straight 4)" "$(ckpt resumed 4)" "(resumed at step 2 against 4 straight steps)"
finite straight

run ac 2 4 --set sharding.generator.activation_checkpointing=true --set sharding.discriminator.activation_checkpointing=true \
  || bad "activation checkpointing run: $(tail -3 "$T/ac.log")"
same_checkpoint "$(ckpt straight 4)" "$(ckpt ac 4)" "(activation checkpointing)"

m() { local x; for x in generator discriminator; do echo --set offload.$x.optimizer=disk --set offload.$x.param=disk \
  --set offload.$x.gradient=disk; done; }
run offload 2 4 $(m) || bad "offload run: $(tail -3 "$T/offload.log")"
same_checkpoint "$(ckpt straight 4)" "$(ckpt offload 4)" "(disk offload of state, gradients and parameters)"

F64=(--set model.dtype=float64)
run zero3-f64 2 3 "${F64[@]}" || bad "float64 ZeRO-3 run: $(tail -3 "$T/zero3-f64.log")"
run hsdp-f64 4 3 "${F64[@]}" --set sharding.generator.replicate_degree=2 --set sharding.discriminator.replicate_degree=2 \
  || bad "HSDP run: $(tail -3 "$T/hsdp-f64.log")"
checkpoints_within "$(ckpt hsdp-f64 3)" "$(ckpt zero3-f64 3)" 1e-9 "HSDP (4 ranks, 2 groups) against ZeRO-3 on 2 ranks, float64"

run bf16 2 3 --set sharding.generator.compute_dtype=bfloat16 --set sharding.discriminator.compute_dtype=bfloat16 \
  || bad "bfloat16 run: $(tail -3 "$T/bf16.log")"
finite bf16
run stages12 3 3 --set sharding.generator.stage=1 --set sharding.discriminator.stage=2 \
  || bad "stage 1/2 run: $(tail -3 "$T/stages12.log")"
finite stages12

"$CKPT" sample "$(ckpt straight 4)" -o "$T/grid.png" > "$T/sample.log" 2>&1 && [ -s "$T/grid.png" ] \
  && ok "shardgan-ckpt sample wrote the A | G(A) | B grid" || bad "sample: $(tail -3 "$T/sample.log")"

# Pairs in HDF5.
"$DATA" convert --paired "$FMNIST" -o "$T/pairs.h5" > "$T/convert.log" 2>&1 \
  && ok "convert --paired of Fashion-MNIST: $(head -1 "$T/convert.log")" || bad "convert --paired: $(tail -3 "$T/convert.log")"
run ram 2 4 --set data.source=fashion-mnist --set data.path="$FMNIST" || bad "in-RAM run: $(tail -3 "$T/ram.log")"
run h5 2 4 --set data.source=hdf5 --set data.path="$T/pairs.h5" || bad "HDF5 run: $(tail -3 "$T/h5.log")"
same_checkpoint "$(ckpt ram 4)" "$(ckpt h5 4)" "(pairs from HDF5 against the in-RAM edge pairs)"
"$DATA" convert "$FMNIST" -o "$T/plain.h5" > /dev/null 2>&1
if run plainh5 2 1 --set data.source=hdf5 --set data.path="$T/plain.h5"; then bad "a file without A: accepted"
else grep -q "no dataset 'A'" "$T/plainh5.log" && ok "a file without A: refused, naming it" \
  || bad "a file without A: $(tail -3 "$T/plainh5.log")"; fi
mkdir -p "$T/ab"
"$PY" - "$T/ab" <<'PY'
import sys
for i in range(12):  # 12 grey pairs of 32x32 halves: A = (i * 10 + x) % 256, B = (200 + 7 * i - y) % 256
    rows = [bytes([(i * 10 + x) % 256 for x in range(32)] + [(200 + 7 * i - y) % 256] * 32) for y in range(32)]
    open(f"{sys.argv[1]}/{i:02d}.pgm", "wb").write(b"P5 64 32 255\n" + b"".join(rows))
PY
"$DATA" convert --paired "$T/ab" -o "$T/ab.h5" --size 32 --channels 1 > "$T/ab.log" 2>&1 || bad "convert --paired folder: $(tail -3 "$T/ab.log")"
"$PY" - "$T/ab.h5" <<'PY' && ok "convert --paired of an A|B folder: A = left halves, B = right halves" || bad "A|B folder contents"
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], "r")
a, b = f["A"][()], f["B"][()]
assert a.shape == b.shape == (12, 1, 32, 32), (a.shape, b.shape)
for i in range(12):
    assert (a[i, 0] == (np.arange(32)[None, :] + i * 10) % 256).all(), i
    assert (b[i, 0] == (200 + 7 * i - np.arange(32)[:, None]) % 256).all(), i
assert (f["imgs"][()] == b).all()
PY
# data.source paired reads the folder itself, as the converted file gives it.
# (With a key that has no effect, checkpoint.snapshot without async: warned about once, on rank 0.)
run folder 2 2 --set data.source=paired --set data.path="$T/ab" --set checkpoint.snapshot=copy \
  || bad "data.source paired: $(tail -3 "$T/folder.log")"
n=$(grep -c "key 'checkpoint.snapshot' is set to copy but has no effect" "$T/folder.log")
[ "$n" -eq 1 ] && ok "a key set that has no effect: one warning" || bad "checkpoint.snapshot without async: $n warnings"
run folderh5 2 2 --set data.source=hdf5 --set data.path="$T/ab.h5" || bad "its HDF5: $(tail -3 "$T/folderh5.log")"
same_checkpoint "$(ckpt folder 2)" "$(ckpt folderh5 2)" "(data.source paired against its converted file)"

# Evaluating on data that is not Fashion-MNIST's pairs: one warning, and the records' eval_set.
if [ -s "$CLASSIFIER" ]; then
  EV=(--set eval.enabled=true --set eval.classifier="$CLASSIFIER" --set train.eval_samples=8)
  run evalab 2 1 --set data.source=paired --set data.path="$T/ab" "${EV[@]}" || bad "eval on the folder: $(tail -3 "$T/evalab.log")"
  n=$(grep -c "scores another task" "$T/evalab.log")
  [ "$n" -eq 1 ] && grep -q "data.source paired" "$T/evalab.log" && ok "eval on an A|B folder: one warning that it scores another task" \
    || bad "eval on an A|B folder: $n warnings: $(grep "another task" "$T/evalab.log" | head -2)"
  "$PY" - "$T/evalab/metrics.jsonl" <<'PY' && ok "eval on an A|B folder: the record carries eval_set fashion-mnist-edges" \
    || bad "eval on an A|B folder: no eval_set in the record"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"fid"' in l]
sys.exit(0 if rows and all(r.get("eval_set") == "fashion-mnist-edges" for r in rows) else 1)
PY
  run evalh5 2 1 --set data.source=hdf5 --set data.path="$T/pairs.h5" "${EV[@]}" || bad "eval on the pairs: $(tail -3 "$T/evalh5.log")"
  grep -q '"eval_set":"fashion-mnist-edges"' "$T/evalh5/metrics.jsonl" && ! grep -q "another task" "$T/evalh5.log" \
    && ok "eval on Fashion-MNIST's converted pairs: no warning, eval_set fashion-mnist-edges" \
    || bad "eval on Fashion-MNIST's converted pairs: $(grep "another task" "$T/evalh5.log" | head -1)"
else
  echo "NOT RUN: the evaluation-set checks need the FID classifier ($CLASSIFIER; the fid_classifier fixture)"
fi

refused() {  # refused NAME KEY ARGS...: fails on both ranks naming KEY
  local name=$1 key=$2; shift 2
  if run "$name" 2 1 "$@"; then bad "$name: accepted"; return; fi
  [ "$(grep -c "$key" "$T/$name.log")" -ge 2 ] && ok "$name: refused on both ranks naming $key" \
    || bad "$name: the error does not name $key on both ranks: $(tail -3 "$T/$name.log")"
}
refused simultaneous train.update --set train.update=simultaneous
P2P=("$SRC/configs/fmnist-dcgan.yaml")  # a noise-to-image model takes no L1 term
refused l1-dcgan train.l1_weight --set train.l1_weight=100
refused paired-dcgan data.source --set data.source=paired --set data.path="$T/ab"
rm -rf "$T"
finish
