#!/usr/bin/env python3
"""Writes an ImageFolder (one subfolder of PNGs per class) for the end-to-end tests.

  make_image_folder.py shapes OUT N_PER_CLASS     colour 64x64: 4 classes of coloured shapes
  make_image_folder.py fmnist FMNIST_DIR OUT N    grey 64x64: the first N Fashion-MNIST training
                                                  images (28x28, bilinear to 64x64), one folder
                                                  per class name
"""
import gzip
import os
import sys

import numpy as np
from PIL import Image

FMNIST_CLASSES = ["t-shirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag",
                  "ankle-boot"]


def shapes(out, n):
    rng = np.random.default_rng(1)
    colours = [(220, 40, 40), (40, 200, 60), (40, 70, 230), (230, 210, 40)]
    yy, xx = np.mgrid[0:64, 0:64]
    for k in range(4):
        os.makedirs(os.path.join(out, f"class{k}"), exist_ok=True)
        for i in range(n):
            img = rng.integers(0, 40, size=(64, 64, 3)).astype(np.float64)
            cy, cx = rng.integers(16, 48, size=2)
            if k == 0:
                mask = (yy - cy) ** 2 + (xx - cx) ** 2 < 12 ** 2
            elif k == 1:
                mask = (abs(yy - cy) < 10) & (abs(xx - cx) < 10)
            elif k == 2:
                mask = abs(yy - cy) < 4
            else:
                mask = abs(xx - cx) < 4
            img[mask] = colours[k]
            Image.fromarray(img.astype(np.uint8), "RGB").save(os.path.join(out, f"class{k}", f"{i:04d}.png"))


def fmnist(src, out, n):
    with gzip.open(os.path.join(src, "train-images-idx3-ubyte.gz")) as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 28, 28)[:n]
    with gzip.open(os.path.join(src, "train-labels-idx1-ubyte.gz")) as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8)[:n]
    for name in FMNIST_CLASSES:
        os.makedirs(os.path.join(out, name), exist_ok=True)
    for i, (img, label) in enumerate(zip(images, labels)):
        Image.fromarray(img, "L").resize((64, 64), Image.BILINEAR).save(
            os.path.join(out, FMNIST_CLASSES[label], f"{i:05d}.png"))


if __name__ == "__main__":
    if sys.argv[1] == "shapes":
        shapes(sys.argv[2], int(sys.argv[3]))
    else:
        fmnist(sys.argv[2], sys.argv[3], int(sys.argv[4]))
