#!/usr/bin/env python3
"""The first N images of Fashion-MNIST's training split as a shardgan HDF5 file (data.source
hdf5: `imgs` uint8 [N, 1, 32, 32], `labels` int64 [N]), padded to 32x32 with black as the
fashion-mnist source pads them: a limited-data set (ADA's experiments, docs/results.md).

    .venv/bin/python scripts/fmnist_subset.py N OUT.h5 [FASHION_MNIST_DIR]
"""
import gzip
import sys

import h5py
import numpy as np


def read_idx(path, magic):
    with gzip.open(path, "rb") as f:
        data = f.read()
    if int.from_bytes(data[0:4], "big") != magic:
        sys.exit(f"{path}: not an idx file with magic {magic}")
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(magic & 0xFF)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * len(dims)).reshape(dims)


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    n, out = int(sys.argv[1]), sys.argv[2]
    root = sys.argv[3] if len(sys.argv) == 4 else "/usr/share/datasets/fashion-mnist"
    imgs = read_idx(f"{root}/train-images-idx3-ubyte.gz", 2051)[:n]
    labels = read_idx(f"{root}/train-labels-idx1-ubyte.gz", 2049)[:n].astype(np.int64)
    padded = np.zeros((len(imgs), 1, 32, 32), np.uint8)
    padded[:, 0, 2:30, 2:30] = imgs
    with h5py.File(out, "w") as f:
        f["imgs"] = padded
        f["labels"] = labels
        names = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                 "Ankle boot"]
        f.attrs["classes"] = np.array(names, dtype=h5py.string_dtype())
    print(f"wrote {out}: {len(imgs)} images [1, 32, 32] uint8, classes {np.bincount(labels).tolist()}")


if __name__ == "__main__":
    main()
