#!/usr/bin/env bash
# The domain classifier on a dataset other than Fashion-MNIST: 4 classes of coloured shapes at
# 3x64x64 (tests/make_image_folder.py) converted with shardgan-data. Checks:
#  - `shardgan-fid train-classifier --data FILE.h5` trains on it (images 9 mod 10 held out)
#    above 0.9 test accuracy and records image_shape 3x64x64 and num_classes 4;
#  - a 2-rank DCGAN at model.image_size 64 with 3 channels evaluates with it: finite FID,
#    KID, precision/recall, 4 class fractions summing to 1, and the network's description;
#  - the Fashion-MNIST classifier (1x32x32) on that model is refused naming the file and the
#    image shapes, non-zero on every rank, without a hang.
TRAIN=$1; FID=$2; DATA=$3; SRC=$4; FMNIST_CLASSIFIER=$5
source "$(dirname "$0")/ckpt_lib.sh"
T=$(mktemp -d /tmp/shardgan-anyds.XXXXXX)
trap 'rm -rf "$T"' EXIT
$PY -c "import PIL" 2> /dev/null || { echo "SKIP: $PY cannot import PIL"; exit 77; }
$PY "$SRC/tests/make_image_folder.py" shapes "$T/shapes" 60 || { bad "make_image_folder.py"; finish; exit 1; }
"$DATA" convert "$T/shapes" -o "$T/shapes.h5" --size 64 --channels 3 > "$T/convert.log" 2>&1 \
  && ok "converted: $(tail -1 "$T/convert.log" | cut -c1-160)" || bad "convert: $(tail -3 "$T/convert.log")"
"$FID" train-classifier --data "$T/shapes.h5" -o "$T/cls.h5" --epochs 5 --batch 16 --min-accuracy 0.9 --threads 2 \
  > "$T/cls.log" 2>&1 && ok "classifier: $(grep "test accuracy" "$T/cls.log" | tail -1)" \
  || bad "train-classifier: $(tail -3 "$T/cls.log")"
$PY -c "
import h5py, sys
f = h5py.File(sys.argv[1], 'r')
shape = f.attrs['image_shape']
shape = shape.decode() if isinstance(shape, bytes) else shape
assert shape == '3x64x64' and f.attrs['num_classes'] == 4, dict(f.attrs)
" "$T/cls.h5" && ok "the file records image_shape 3x64x64 and num_classes 4" || bad "classifier attributes"
CFG="$SRC/configs/fmnist-dcgan.yaml"
RUN=(--set data.source=hdf5 --set data.path="$T/shapes.h5" --set model.image_size=64 --set model.channels=3
     --set model.z_dim=16 --set model.g_width=8 --set model.d_width=8 --set train.global_batch=8 --set train.steps=2
     --set train.checkpoint_every=0 --set train.sample_every=0 --set train.plots=false --set ema.start_step=0
     --set eval.enabled=true --set eval.reference="$T/shapes.h5" --set train.eval_samples=64
     --set eval.kid_subsets=10)
"${MPIRUN[@]}" -np 2 "$TRAIN" "$CFG" "${RUN[@]}" --set eval.classifier="$T/cls.h5" --set run.dir="$T/r" \
  > "$T/r.log" 2>&1 && ok "2 ranks: DCGAN-64 colour trains and evaluates" || bad "run: $(tail -5 "$T/r.log")"
out=$($PY - "$T/r/metrics.jsonl" <<'PYEOF' 2>&1
import json, math, sys
r = [json.loads(l) for l in open(sys.argv[1]) if '"fid"' in l][-1]
for k in ("fid", "kid", "precision", "recall", "fid_ema"):
    assert math.isfinite(r[k]), (k, r)
assert len(r["class_fractions"]) == 4 and abs(sum(r["class_fractions"]) - 1) < 1e-12, r["class_fractions"]
assert "3x64x64, 4 classes" in r["features"] and r["paper_comparable"] is False, r["features"]
print(f"record: FID {r['fid']:.4g}, KID {r['kid']:.3g}, class fractions {[round(x, 3) for x in r['class_fractions']]}")
PYEOF
) && ok "$out" || bad "$out"
expect_fail "the Fashion-MNIST classifier on 3x64x64 images" "images of 3x64x64" \
  "${MPIRUN[@]}" -np 2 "$TRAIN" "$CFG" "${RUN[@]}" --set eval.classifier="$FMNIST_CLASSIFIER" --set run.dir="$T/e"
grep -qF "$FMNIST_CLASSIFIER" "$T/out.txt" && ok "the refusal names $FMNIST_CLASSIFIER" || bad "refusal does not name the file"
finish
