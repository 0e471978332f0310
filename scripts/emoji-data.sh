#!/usr/bin/env bash
# Real colour images no one here drew: the 3,926 colour bitmaps of Noto Color Emoji (Debian's
# fonts-noto-color-emoji, Apache-2.0) as shardgan HDF5 files at 32 and 64 pixels, for the
# colour configs (docs/data.md#colour-emoji).
#   scripts/emoji-data.sh [OUT_DIR] [BUILD_DIR]    # defaults: data, build (of the repository)
# writes OUT_DIR/emoji-32.h5 and OUT_DIR/emoji-64.h5 (one class). scripts/emoji_folder.py
# composites each glyph over white and pads it to a centred square; `shardgan-data convert`
# resizes the squares. SHARDGAN_EMOJI_FONT names another copy of NotoColorEmoji.ttf;
# SHARDGAN_EMOJI_LIMIT=N keeps the first N glyphs only (quick trials, the tests).
# Needs scripts/setup.sh's font, fontTools and Pillow, and a built shardgan-data.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$(realpath -m "${1:-$ROOT/data}")
BUILD=$(realpath -m "${2:-$ROOT/build}")
PY=${SHARDGAN_PYTHON:-$ROOT/.venv/bin/python}
FONT=${SHARDGAN_EMOJI_FONT:-/usr/share/fonts/truetype/noto/NotoColorEmoji.ttf}
[ -x "$BUILD/shardgan-data" ] || { echo "emoji-data.sh: $BUILD/shardgan-data not found; run scripts/build.sh" >&2; exit 1; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/shardgan-emoji.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
limit=()
[ -z "${SHARDGAN_EMOJI_LIMIT:-}" ] || limit=(--limit "$SHARDGAN_EMOJI_LIMIT")
"$PY" "$ROOT/scripts/emoji_folder.py" "$FONT" "$tmp" "${limit[@]}"
mkdir -p "$OUT"
for size in 32 64; do
  "$BUILD/shardgan-data" convert "$tmp" -o "$OUT/emoji-$size.h5" --size "$size" --channels 3
done
