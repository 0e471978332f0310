#!/usr/bin/env bash
# configs/biggan-64.yaml and configs/biggan-128.yaml on a converted folder: colour shapes
# (tests/make_image_folder.py, 4 classes) -> shardgan-data convert at 64 and at 128 -> each
# preset for 2 steps on 2 ranks at ZeRO-3, at width ch = d_ch = 8 (the presets' own 64 and
# 96 are for GPUs), with its checkpoint; a model.n_classes smaller than the file's
# labels is refused naming the key. Skips (77) without PIL in the Python.
TRAIN=$1; DATA=$2; SRC=$3
source "$(dirname "$0")/ckpt_lib.sh"
T=$(mktemp -d /tmp/shardgan-bigganpresets.XXXXXX)
trap 'rm -rf "$T"' EXIT
$PY -c "import PIL" 2> /dev/null || { echo "SKIP: $PY cannot import PIL"; exit 77; }
$PY "$SRC/tests/make_image_folder.py" shapes "$T/shapes" 8 || { bad "make_image_folder.py"; finish; exit 1; }
for res in 64 128; do
  "$DATA" convert "$T/shapes" -o "$T/shapes$res.h5" --size $res --channels 3 > "$T/convert$res.log" 2>&1 \
    && ok "converted at $res: $(tail -1 "$T/convert$res.log" | cut -c1-120)" \
    || bad "convert at $res: $(tail -3 "$T/convert$res.log")"
  RUN=("$SRC/configs/biggan-$res.yaml" --set data.path="$T/shapes$res.h5" --set model.n_classes=4
       --set model.ch=8 --set model.d_ch=8 --set model.shared_dim=16 --set train.global_batch=4
       --set train.steps=2 --set train.checkpoint_every=2 --set train.sample_every=0 --set train.plots=false
       --set train.log_every=1)
  "${MPIRUN[@]}" -np 2 "$TRAIN" "${RUN[@]}" --set run.dir="$T/r$res" > "$T/r$res.log" 2>&1 \
    && [ -d "$T/r$res/checkpoints/step-00000002" ] \
    && ok "biggan-$res: 2 steps on 2 ranks, ZeRO-3, checkpoint at step 2" \
    || bad "biggan-$res: $(tail -5 "$T/r$res.log")"
done
expect_fail "model.n_classes 2 on a 4-class file" "model.n_classes" \
  "${MPIRUN[@]}" -np 2 "$TRAIN" "${RUN[@]}" --set model.n_classes=2 --set run.dir="$T/e"
finish
