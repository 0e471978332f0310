#!/usr/bin/env bash
# From a folder of one's own images to metrics, as docs/guides/own-dataset.md walks it:
# 2,000 Fashion-MNIST training images written as 64x64 PNGs in class folders
# (tests/make_image_folder.py) -> shardgan-data convert -> a DCGAN at model.image_size 64,
# ZeRO stage 3 on 2 ranks, evaluated on the random-weight TorchScript Inception
# (eval.features: torchscript) -> shardgan-ckpt fid with a classifier trained on that folder.
# Checks:
#  - the run's evaluation record has finite fid, kid, kid_std, precision, recall, is and is_std
#    for G and its EMA, no class fields, the network's description, kid_subset_size 16 and
#    paper_comparable false (random weights, under 50,000 samples);
#  - it resumes bit for bit: 4 steps straight equal 2, a checkpoint, a resume and 2 more
#    (same_checkpoint; those two runs leave evaluation off, which never changes training:
#    eval_train_test);
#  - shardgan-ckpt fid with the folder's classifier: finite metrics, its 10 classes;
#  - a missing network file is a config error naming eval.feature_network and the file, on
#    every rank, without a hang.
# Skips (77) without PIL, torchvision or xxhash in the Python.
TRAIN=$1; CKPT=$2; FID=$3; DATA=$4; SRC=$5; NET=$6
source "$(dirname "$0")/ckpt_lib.sh"
T=$(mktemp -d /tmp/shardgan-ownfolder.XXXXXX)
trap 'rm -rf "$T"' EXIT
py_has "$PY" PIL torchvision xxhash || { echo "SKIP: $PY has no PIL, torchvision or xxhash"; exit 77; }
if [ ! -f "$NET" ]; then
  mkdir -p "$(dirname "$NET")"
  $PY "$SRC/scripts/export_inception.py" --random-weights --seed 1 -o "$NET.tmp" && mv "$NET.tmp" "$NET" \
    || { bad "export_inception.py failed"; finish; exit 1; }
fi
t0=$SECONDS
$PY "$SRC/tests/make_image_folder.py" fmnist "$FMNIST" "$T/folder" 2000 \
  && ok "2000 PNGs in $(ls "$T/folder" | wc -l) class folders" || bad "make_image_folder.py"
"$DATA" convert "$T/folder" -o "$T/data.h5" --size 64 --channels 1 > "$T/convert.log" 2>&1 \
  && ok "converted: $(tail -1 "$T/convert.log" | cut -c1-160)" || bad "convert: $(tail -3 "$T/convert.log")"
CFG="$SRC/configs/fmnist-dcgan.yaml"
RUN=(--set data.source=hdf5 --set data.path="$T/data.h5" --set model.image_size=64 --set model.z_dim=32
     --set model.g_width=8 --set model.d_width=8 --set train.global_batch=16 --set train.sample_every=0
     --set train.checkpoint_every=2 --set train.plots=false --set ema.start_step=0 --set run.seed=3
     --set eval.enabled=true --set eval.features=torchscript --set eval.feature_network="$NET"
     --set eval.reference="$T/data.h5" --set eval.reference_samples=16 --set train.eval_samples=16
     --set eval.kid_subsets=10 --set train.eval_every=0)
"${MPIRUN[@]}" -np 2 "$TRAIN" "$CFG" "${RUN[@]}" --set train.steps=4 --set run.dir="$T/a" > "$T/a.log" 2>&1 \
  && ok "4 steps straight, ZeRO-3 on 2 ranks, 64x64" || bad "4 steps: $(tail -5 "$T/a.log")"
"${MPIRUN[@]}" -np 2 "$TRAIN" "$CFG" "${RUN[@]}" --set eval.enabled=false --set train.steps=2 --set run.dir="$T/b" \
  > "$T/b1.log" 2>&1 || bad "2 steps: $(tail -5 "$T/b1.log")"
"${MPIRUN[@]}" -np 2 "$TRAIN" "$CFG" "${RUN[@]}" --set eval.enabled=false --set train.steps=4 --set run.dir="$T/b" \
  --resume "$T/b" > "$T/b2.log" 2>&1 || bad "resume: $(tail -5 "$T/b2.log")"
grep -q "resumed from $T/b/checkpoints/step-00000002 at step 2" "$T/b2.log" && ok "resumed at step 2" || bad "no resume line"
same_checkpoint "$T/a/checkpoints/step-00000004" "$T/b/checkpoints/step-00000004" "(own folder)"
"$FID" train-classifier --data "$T/data.h5" -o "$T/cls.h5" --epochs 2 --min-accuracy 0.5 --threads 2 \
  > "$T/cls.log" 2>&1 && ok "classifier on the folder: $(grep "test accuracy" "$T/cls.log" | tail -1)" \
  || bad "train-classifier: $(tail -3 "$T/cls.log")"
"$CKPT" fid "$T/a" -n 64 --classifier "$T/cls.h5" --reference "$T/data.h5" --reference-samples 500 > "$T/cls.json" \
  2> "$T/cls.err" || bad "shardgan-ckpt fid --classifier: $(tail -3 "$T/cls.err")"
out=$($PY - "$T/a/metrics.jsonl" "$T/cls.json" <<'PYEOF' 2>&1
import json, math, sys
r = [json.loads(l) for l in open(sys.argv[1]) if '"fid"' in l][-1]
keys = [k + s for k in ("fid", "kid", "kid_std", "precision", "recall", "is", "is_std") for s in ("", "_ema")]
bad = [k for k in keys if not math.isfinite(r[k])]
assert "class_fractions" not in r and "class_acc" not in r, r
assert r["paper_comparable"] is False and r["kid_subset_size"] == 16, r
assert "pytorch-fid-inception-v3, random weights" in r["features"], r["features"]
c = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])
bad += [k for k in ("fid", "kid", "precision", "recall") if not math.isfinite(c[k])]
assert not bad, f"not finite: {bad}"
assert len(c["class_fractions"]) == 10 and "1x64x64, 10 classes" in c["features"], c
print(f"Inception (random weights): FID {r['fid']:.4g}, KID {r['kid']:.3g}, P {r['precision']:.2f}, "
      f"R {r['recall']:.2f}, IS {r['is']:.3f}; classifier: FID {c['fid']:.4g}, KID {c['kid']:.3g}")
PYEOF
) && ok "$out" || bad "$out"
expect_fail "missing network file" "eval.feature_network: feature network $T/none.pt: no such file" \
  "${MPIRUN[@]}" -np 2 "$TRAIN" "$CFG" "${RUN[@]}" --set eval.feature_network="$T/none.pt" --set train.steps=1 \
  --set run.dir="$T/e"
[ "$(grep -c "error on rank" "$T/out.txt")" -eq 2 ] && ok "missing network file: both ranks report it" \
  || bad "missing network file: $(grep -c "error on rank" "$T/out.txt") ranks reported it"
echo "whole entry: $((SECONDS - t0)) s"
finish
