"""Compares two checkpoints' full tensors through their index.h5 (h5py): every tensor of
A within RTOL of B, measured against the largest magnitude of its kind in B: one model's
parameters, one optimizer state, the EMA, or the buffers. Per kind, not per tensor: a
gradient that is zero in exact arithmetic (a conv bias before BatchNorm) leaves rounding
noise of ~1e-17 in both runs, whose relative difference says nothing.
The two checkpoints may come from different world sizes (split against shared placement),
so their rank files are not compared with each other. Each side must be whole on its own:
an index.h5, a non-empty set of rank-*.h5 files equal to the set its manifest names, and
every rank file its virtual datasets map (HDF5 reads a missing source as zeros, silently).
A NaN or an infinity in any compared tensor of either side fails, even where both sides
hold it in the same place: a run that diverged is not a match.
Exit 0 when every tensor is within, 1 otherwise (the reason printed); prints the worst
ratio |a - b| / scale.
  ckpt_close.py A_DIR B_DIR RTOL"""
import glob
import json
import os
import sys

import h5py
import numpy as np


def fail(msg):
    print(msg)
    sys.exit(1)


def tensors(path, side):
    index = f"{path}/index.h5"
    if not os.path.isfile(index):
        fail(f"checkpoint {side} '{path}': no index.h5")
    on_disk = {os.path.basename(p) for p in glob.glob(f"{path}/rank-*.h5")}
    if not on_disk:
        fail(f"checkpoint {side} '{path}': no rank-*.h5 files")
    out = {}
    with h5py.File(index, "r") as f:
        if "manifest.json" not in f:
            fail(f"checkpoint {side} '{path}': index.h5 has no /manifest.json")
        raw = f["manifest.json"][()]
        raw = raw[0] if isinstance(raw, np.ndarray) else raw
        named = {e["name"] for e in json.loads(raw.decode() if isinstance(raw, bytes) else raw)["files"]}
        if named != on_disk:
            fail(f"checkpoint {side} '{path}': rank files on disk {sorted(on_disk)} are not the manifest's "
                 f"{sorted(named)}")
        mapped = set()

        def visit(name, obj):
            if isinstance(obj, h5py.Dataset) and name.split("/")[0] in ("generator", "discriminator") \
                    and obj.dtype.kind == "f":
                if obj.is_virtual:
                    mapped.update(os.path.basename(s.file_name) for s in obj.virtual_sources())
                out[name] = np.asarray(obj[()], dtype=np.float64)
        f.visititems(visit)
    missing = mapped - on_disk
    if missing:
        fail(f"checkpoint {side} '{path}': the index maps rank files that are missing: {sorted(missing)}")
    for n, t in out.items():
        if not np.isfinite(t).all():
            fail(f"checkpoint {side} '{path}': {n} holds {int(np.isnan(t).sum())} NaN and "
                 f"{int(np.isinf(t).sum())} infinite values of {t.size}")
    return out


def kind(name):  # generator/params/x -> generator/params; generator/optim/exp_avg/x -> generator/optim/exp_avg
    parts = name.split("/")
    return "/".join(parts[:3] if parts[1] == "optim" else parts[:2])


a, b, rtol = tensors(sys.argv[1], "A"), tensors(sys.argv[2], "B"), float(sys.argv[3])
if set(a) != set(b) or not a:
    fail(f"tensors differ ({len(a)} in A, {len(b)} in B): {sorted(set(a) ^ set(b))[:5]}")
scale = {}
for n, t in b.items():
    scale[kind(n)] = max(scale.get(kind(n), 0.0), float(np.abs(t).max()) if t.size else 0.0)
worst, where = 0.0, ""
for n in a:
    if a[n].shape != b[n].shape:
        fail(f"shape differs: {n} {a[n].shape} against {b[n].shape}")
    s = scale[kind(n)] or 1.0
    r = float(np.abs(a[n] - b[n]).max()) / s if a[n].size else 0.0
    if r != r:  # cannot come from finite inputs; never let a NaN pass as "not above"
        fail(f"NaN difference at {n}")
    if r > worst:
        worst, where = r, n
print(f"max |a - b| / (largest |b| of its kind) {worst:.3g} at {where} over {len(a)} tensors")
sys.exit(0 if worst <= rtol else 1)
