"""Compares two 8-bit PNG images pixel by pixel (stdlib zlib + NumPy; no PIL).

Usage: png_diff.py A.png B.png MAX_ABS MAX_FRACTION
Exit 0 if both have the same size and channels, no pixel differs by more than MAX_ABS
gray levels, and at most MAX_FRACTION of the values differ at all; else exit 1.
Prints "max |a-b| = D over F of the values".
"""
import struct
import sys
import zlib

import numpy as np


def read_png(path):
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        sys.exit(f"{path}: not a PNG")
    pos, idat, w = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            if depth != 8 or interlace or ctype not in (0, 2, 6):
                sys.exit(f"{path}: only 8-bit non-interlaced gray/RGB/RGBA is supported")
            ch = {0: 1, 2: 3, 6: 4}[ctype]
        elif kind == b"IDAT":
            idat += body
    raw = zlib.decompress(idat)
    stride = w * ch
    out = np.zeros((h, stride), np.int32)
    prev = np.zeros(stride, np.int32)
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = np.frombuffer(raw, np.uint8, stride, y * (stride + 1) + 1).astype(np.int32)
        cur = np.zeros(stride, np.int32)
        for x in range(stride):  # the five PNG filters (RFC 2083, Sec. 6)
            a = cur[x - ch] if x >= ch else 0
            b = prev[x]
            c = prev[x - ch] if x >= ch else 0
            if f == 0: p = 0
            elif f == 1: p = a
            elif f == 2: p = b
            elif f == 3: p = (a + b) // 2
            else:
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                p = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
            cur[x] = (line[x] + p) & 255
        out[y] = cur
        prev = cur
    return out.reshape(h, w, ch)


a, b = read_png(sys.argv[1]), read_png(sys.argv[2])
max_abs, max_frac = int(sys.argv[3]), float(sys.argv[4])
if a.shape != b.shape:
    print(f"shapes differ: {a.shape} vs {b.shape}")
    sys.exit(1)
d = np.abs(a - b)
frac = float((d > 0).mean())
print(f"max |a-b| = {int(d.max())} gray levels over {frac:.4%} of the values")
sys.exit(0 if d.max() <= max_abs and frac <= max_frac else 1)
