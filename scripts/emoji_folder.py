#!/usr/bin/env python3
"""Writes the colour emoji bitmaps of Noto Color Emoji as an ImageFolder of square RGB PNGs.

  .venv/bin/python scripts/emoji_folder.py /usr/share/fonts/truetype/noto/NotoColorEmoji.ttf OUT

Debian's fonts-noto-color-emoji (Apache-2.0) stores each glyph as a PNG in the font's CBDT
table: 3,926 bitmaps of 136 x 128 pixels (width x height), palette PNGs with transparency.
fontTools reads the table (TTFont(path)["CBDT"].strikeData: one strike, glyph name ->
bitmap, whose imageData is the PNG's bytes). For each glyph, in the order of the glyph
names, this script
  1. composites the bitmap over white (RGBA, alpha blending; transparent pixels become
     255, 255, 255);
  2. pads it with white to a square of side max(width, height), centred (136 x 136: 4 rows
     above and 4 below);
  3. writes OUT/emoji/NNNNN.png (RGB, one class).
`shardgan-data convert OUT --size S --channels 3` then resizes the squares to S x S
(scripts/emoji-data.sh does both, at 32 and 64 pixels; docs/data.md). Needs fontTools and
Pillow (scripts/setup.sh pins them in .venv).
"""
import argparse
import io
import os
import sys


def composite_square(im, skip_composite=False):
    """A glyph's PIL image as a square RGB image: over white, padded with white, centred."""
    from PIL import Image
    im = im.convert("RGBA")
    if skip_composite:  # negative control: alpha dropped, transparent pixels keep their colour
        flat = im.convert("RGB")
    else:
        flat = Image.new("RGB", im.size, (255, 255, 255))
        flat.paste(im, mask=im.getchannel("A"))
    side = max(im.size)
    square = Image.new("RGB", (side, side), (255, 255, 255))
    square.paste(flat, ((side - im.size[0]) // 2, (side - im.size[1]) // 2))
    return square


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("font", help="NotoColorEmoji.ttf (Debian: /usr/share/fonts/truetype/noto/)")
    ap.add_argument("out", help="folder to write; its emoji/ subfolder must not exist yet")
    ap.add_argument("--limit", type=int, default=0, help="the first N glyphs only (0: all)")
    args = ap.parse_args()
    try:
        from fontTools.ttLib import TTFont
    except ImportError:
        sys.exit("emoji_folder.py: this Python has no fontTools; scripts/setup.sh installs it into .venv "
                 "(or: pip install fonttools==4.68.0 pillow==13.0.0)")
    if not os.path.isfile(args.font):
        sys.exit(f"emoji_folder.py: {args.font}: no such file; on Debian, apt-get install fonts-noto-color-emoji "
                 "(scripts/setup.sh does)")
    font = TTFont(args.font, lazy=True)
    if "CBDT" not in font:
        sys.exit(f"emoji_folder.py: {args.font} has no CBDT table (colour bitmaps); use Noto Color Emoji")
    strikes = font["CBDT"].strikeData
    glyphs = strikes[0]
    names = sorted(glyphs)
    if args.limit > 0:
        names = names[:args.limit]
    folder = os.path.join(args.out, "emoji")
    os.makedirs(folder)
    skip = os.environ.get("SHARDGAN_TEST_CONTROL") == "emoji_no_composite"
    sizes = {}
    from PIL import Image
    for i, name in enumerate(names):
        im = Image.open(io.BytesIO(glyphs[name].imageData))
        sizes[im.size] = sizes.get(im.size, 0) + 1
        composite_square(im, skip).save(os.path.join(folder, f"{i:05d}.png"), compress_level=1)
    shapes = ", ".join(f"{n} of {w}x{h}" for (w, h), n in sorted(sizes.items()))
    print(f"wrote {len(names)} glyphs of {args.font} ({shapes}) to {folder} as squares over white")


if __name__ == "__main__":
    main()
