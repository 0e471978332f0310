"""Compares two checkpoints' full tensors through their index.h5 (h5py): every tensor of
A within RTOL of B, measured against the largest magnitude of its kind in B: one model's
parameters, one optimizer state, the EMA, or the buffers. Per kind, not per tensor: a
gradient that is zero in exact arithmetic (a conv bias before BatchNorm) leaves rounding
noise of ~1e-17 in both runs, whose relative difference says nothing.
Exit 0 when every tensor is within, 1 otherwise; prints the worst ratio |a - b| / scale.
  ckpt_close.py A_DIR B_DIR RTOL"""
import sys

import h5py
import numpy as np


def tensors(path):
    out = {}
    with h5py.File(f"{path}/index.h5", "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset) and name.split("/")[0] in ("generator", "discriminator") \
                    and obj.dtype.kind == "f":
                out[name] = np.asarray(obj[()], dtype=np.float64)
        f.visititems(visit)
    return out


def kind(name):  # generator/params/x -> generator/params; generator/optim/exp_avg/x -> generator/optim/exp_avg
    parts = name.split("/")
    return "/".join(parts[:3] if parts[1] == "optim" else parts[:2])


a, b, rtol = tensors(sys.argv[1]), tensors(sys.argv[2]), float(sys.argv[3])
if set(a) != set(b) or not a:
    print("tensors differ:", sorted(set(a) ^ set(b))[:5])
    sys.exit(1)
scale = {}
for n, t in b.items():
    scale[kind(n)] = max(scale.get(kind(n), 0.0), float(np.abs(t).max()) if t.size else 0.0)
worst, where = 0.0, ""
for n in a:
    if a[n].shape != b[n].shape:
        print("shape differs:", n)
        sys.exit(1)
    s = scale[kind(n)] or 1.0
    r = float(np.abs(a[n] - b[n]).max()) / s if a[n].size else 0.0
    if r > worst:
        worst, where = r, n
print(f"max |a - b| / (largest |b| of its kind) {worst:.3g} at {where} over {len(a)} tensors")
sys.exit(0 if worst <= rtol else 1)
