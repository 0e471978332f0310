#!/usr/bin/env python3
"""Reads a shardgan checkpoint's index with Debian's h5py (no shardgan code) and checks it.

Usage: ckpt_h5py_check.py CHECKPOINT_DIR [EXPECTED.h5]

Every virtual dataset in index.h5 must read as a full tensor of its recorded shape, and
each unsharded parameter must equal the concatenation of the rank files' flat slices the
manifest names. With EXPECTED.h5 (full tensors written by the trainer), every dataset in
it must be bit-identical to the index's dataset of the same path.
"""
import json
import sys

import h5py
import numpy as np


def main():
    ckpt = sys.argv[1]
    idx = h5py.File(f"{ckpt}/index.h5", "r")
    manifest = json.loads(idx["manifest.json"][()].decode())
    assert idx.attrs["schema_version"] == manifest["schema_version"] == 2
    n = 0

    def visit(name, obj):
        nonlocal n
        if isinstance(obj, h5py.Dataset) and obj.is_virtual:
            data = obj[...]
            assert data.shape == obj.shape, name
            n += 1

    idx.visititems(visit)
    # Rebuild each parameter from the rank files by hand and compare with the VDS.
    files = {}
    rebuilt = 0
    for model in manifest["models"]:
        for unit in model["units"]:
            flat = np.zeros(unit["numel"], dtype=model["dtype"])
            for sh in unit["shards"]:
                f = files.setdefault(sh["rank"], h5py.File(f"{ckpt}/rank-{sh['rank']:05d}.h5", "r"))
                part = f[f"{model['name']}/units/{unit['name']}/param_shard"][...]
                end = min(sh["offset"] + sh["numel"], unit["numel"])
                flat[sh["offset"]:end] = part[: end - sh["offset"]]
            for p in unit["params"]:
                want = flat[p["offset"]:p["offset"] + p["numel"]].reshape(p["shape"])
                got = idx[f"{model['name']}/params/{unit['name']}.{p['name']}"][...]
                assert np.array_equal(got, want), p["name"]
                rebuilt += 1
    checked = 0
    if len(sys.argv) > 2:
        exp = h5py.File(sys.argv[2], "r")

        def compare(name, obj):
            nonlocal checked
            if isinstance(obj, h5py.Dataset):
                got = idx[name][...]
                assert got.shape == obj.shape, f"{name}: shape {got.shape} != {obj.shape}"
                assert np.array_equal(got, obj[...]), f"{name}: values differ"
                checked += 1

        exp.visititems(compare)
        assert checked > 0
    assert n > 0 and rebuilt > 0, f"nothing compared: {n} virtual datasets, {rebuilt} parameters"
    extra = f"; {checked} equal the trainer's full tensors" if len(sys.argv) > 2 else ""
    print(f"h5py {h5py.__version__}: read {n} virtual datasets; {rebuilt} parameters rebuilt by hand "
          f"from the rank files equal them{extra}")


if __name__ == "__main__":
    main()
