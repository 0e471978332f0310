#!/usr/bin/env bash
# scripts/emoji-data.sh on Debian's Noto Color Emoji, for the first 500 glyphs
# (SHARDGAN_EMOJI_LIMIT; all 3,926 take about 40 s more on the 2-core guests). Checks:
#  - the font holds 3,926 colour bitmaps of 136x128 (what docs/data.md states);
#  - emoji-32.h5 and emoji-64.h5 hold 500 images [3, S, S] uint8, one class;
#  - the glyphs were composited over white and padded, centred, to a square: the top row of
#    every image is white (the padding) and so, at the median, is the pixel at row 2,
#    column 0 (transparent in the bitmap);
#  - the images are not blank: under 80% of the pixels are white;
#  - a 2-rank ZeRO-3 DCGAN at 64x64 in colour trains 2 steps on emoji-64.h5, no NaN or
#    infinity in its checkpoint.
# emoji_data_control (SHARDGAN_TEST_CONTROL=emoji_no_composite: alpha dropped, not
# composited) must fail the white-pixel check. Skips (77) without the font or fontTools.
TRAIN=$1; SRC=$2
source "$(dirname "$0")/ckpt_lib.sh"
FONT=${SHARDGAN_EMOJI_FONT:-/usr/share/fonts/truetype/noto/NotoColorEmoji.ttf}
[ -f "$FONT" ] || { echo "SKIP: no $FONT (scripts/setup.sh installs fonts-noto-color-emoji)"; exit 77; }
py_has "$PY" fontTools PIL || { echo "SKIP: $PY has no fontTools or Pillow (scripts/setup.sh installs them)"; exit 77; }
T=$(mktemp -d /tmp/shardgan-emoji-test.XXXXXX)
trap 'rm -rf "$T"' EXIT
t0=$SECONDS
out=$($PY - "$FONT" <<'PYEOF' 2>&1
import io, sys
from collections import Counter
from fontTools.ttLib import TTFont
from PIL import Image
glyphs = TTFont(sys.argv[1], lazy=True)["CBDT"].strikeData[0]
sizes = Counter(Image.open(io.BytesIO(g.imageData)).size for g in glyphs.values())
assert len(glyphs) == 3926 and sizes == Counter({(136, 128): 3926}), (len(glyphs), sizes)
print(f"the font holds {len(glyphs)} bitmaps of 136x128")
PYEOF
) && ok "$out" || bad "$out"
SHARDGAN_EMOJI_LIMIT=500 bash "$SRC/scripts/emoji-data.sh" "$T/data" "$(dirname "$TRAIN")" > "$T/emoji.log" 2>&1 \
  && ok "emoji-data.sh: $(head -1 "$T/emoji.log" | cut -c1-40)... $(tail -1 "$T/emoji.log")" \
  || bad "emoji-data.sh: $(tail -3 "$T/emoji.log")"
for size in 32 64; do
  out=$($PY - "$T/data/emoji-$size.h5" "$size" <<'PYEOF' 2>&1
import sys
import h5py, numpy as np
f = h5py.File(sys.argv[1], "r")
s = int(sys.argv[2])
x = f["imgs"][()]
assert x.shape == (500, 3, s, s) and x.dtype == np.uint8, (x.shape, x.dtype)
assert len(set(f["labels"][()].tolist())) == 1, "one class"
top = x[:, :, 0, :].min()
corner = float(np.median(x[:, :, 2, 0]))
white = float((x.min(axis=1) >= 250).mean())
assert top >= 250, f"top row not white: min {top}"
assert corner >= 250, f"pixel (2, 0) not white at the median: {corner} (alpha not composited over white?)"
assert white < 0.8, f"{white:.0%} of the pixels are white"
print(f"{s}x{s}: 500 images, top row white, pixel (2, 0) median {corner:.0f}, {white:.0%} white pixels")
PYEOF
  ) && ok "$out" || bad "$out"
done
"${MPIRUN[@]}" -np 2 "$TRAIN" "$SRC/configs/fmnist-dcgan.yaml" --set data.source=hdf5 --set data.path="$T/data/emoji-64.h5" \
  --set model.image_size=64 --set model.channels=3 --set model.z_dim=16 --set model.g_width=8 --set model.d_width=8 \
  --set train.global_batch=8 --set train.steps=2 --set train.checkpoint_every=2 --set train.sample_every=0 \
  --set train.plots=false --set eval.enabled=false --set run.dir="$T/r" > "$T/r.log" 2>&1 \
  && ok "2 ranks: DCGAN-64 in colour trains 2 steps on emoji-64.h5" || bad "training: $(tail -5 "$T/r.log")"
ck="$T/r/checkpoints/step-00000002"
if [ -z "$(rank_files "$ck")" ]; then bad "no rank files in $ck"
elif out=$(nonfinite_in "$ck"); then ok "no NaN or infinity in the checkpoint"
else bad "NaN or infinity: $(head -3 <<< "$out" | tr '\n' ' ')"; fi
echo "whole entry: $((SECONDS - t0)) s"
finish
