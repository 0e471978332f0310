#!/usr/bin/env python3
"""The Python side of ctest torchscript_metrics (tests/test_torchscript_metrics.cpp).

  torchscript_ref.py variants NET.pt OUTDIR   files that shardgan must refuse, made from NET.pt
  torchscript_ref.py features NET.pt DIR...   features/logits of each DIR's images through NET.pt
  torchscript_ref.py metrics DIR              FID, KID, precision/recall and IS in float64

`features` adapts the images as the manifest's input contract says (feature_network.h):
[-1, 1] mapped onto input.range, grey repeated to 3 channels, then
torch.nn.functional.interpolate(mode="bilinear", align_corners=False) to input.size, and runs
the module with torch.jit.load: it shares no code with shardgan's C++. `variants` rewrites
the archive's zip entries without torch. `metrics` is an
independent float64 numpy computation: FID from numpy.linalg.eigh square roots, KID and IS
from feature_metrics_ref.py (which has no code in common with src/eval either), and
precision/recall from float64 Gram-form distances; the number of distances within 1e-9
relative of a radius (where the Gram form's rounding could decide) is reported as near_ties.
Arrays are raw little-endian files described by DIR/meta.txt ("key value" lines).
"""
import json
import os
import struct
import sys
import zipfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import feature_metrics_ref as fm  # noqa: E402

MANIFEST = "shardgan_manifest.json"


def load_with_manifest(path):
    import torch
    extra = {MANIFEST: ""}
    module = torch.jit.load(path, map_location="cpu", _extra_files=extra)
    return module, json.loads(extra[MANIFEST])


def variants(src, out):
    """Rewrites the archive's zip entries (no torch needed): without the manifest; with one
    float of the largest weight changed under the original manifest; and with the manifest
    claiming another output width, an input size the network cannot take (32 x 32, no
    resize) and no resize at 299."""
    zin = zipfile.ZipFile(src)
    names = zin.namelist()
    manifest_name = next(n for n in names if n.endswith("extra/" + MANIFEST))
    manifest = json.loads(zin.read(manifest_name))
    largest = max((n for n in names if "/data/" in n), key=lambda n: zin.getinfo(n).file_size)

    def write(name, manifest_of=None, change_weight=False):
        with zipfile.ZipFile(os.path.join(out, name), "w", zipfile.ZIP_STORED) as zout:
            for n in names:
                if n == manifest_name and manifest_of is None:
                    continue
                b = zin.read(n)
                if n == manifest_name:
                    b = json.dumps(manifest_of).encode()
                elif n == largest and change_weight:
                    b = struct.pack("<f", struct.unpack("<f", b[:4])[0] + 1e-3) + b[4:]
                zout.writestr(n, b)

    write("no_manifest.pt")
    write("tampered.pt", manifest, change_weight=True)
    for name, change in (("wide.pt", lambda m: m["outputs"].update(features=1000)),
                         ("small.pt", lambda m: m["input"].update(size=[32, 32], resize="none")),
                         ("fixed299.pt", lambda m: m["input"].update(resize="none"))):
        m = json.loads(json.dumps(manifest))
        change(m)
        write(name, m)


def read_meta(directory):
    meta = {}
    with open(os.path.join(directory, "meta.txt")) as f:
        for line in f:
            key, value = line.split()
            meta[key] = int(value)
    return meta


def features(path, directories):
    module, manifest = load_with_manifest(path)
    for directory in directories:
        features_of(module, manifest, directory)


def features_of(module, manifest, directory):
    import torch
    import torch.nn.functional as F
    meta = read_meta(directory)
    shape = (meta["n"], meta["channels"], meta["height"], meta["width"])
    x = torch.from_numpy(np.fromfile(os.path.join(directory, "images.f32"), dtype="<f4").reshape(shape))
    lo, hi = manifest["input"]["range"]
    if (lo, hi) != (-1.0, 1.0):
        x = (x + 1) * ((hi - lo) / 2) + lo
    if x.shape[1] == 1 and manifest["input"]["channels"] == 3:
        x = x.repeat(1, 3, 1, 1)
    size = tuple(manifest["input"]["size"])
    if manifest["input"]["resize"] == "bilinear" and tuple(x.shape[2:]) != size:
        x = F.interpolate(x, size=size, mode="bilinear", align_corners=False)
    with torch.no_grad():
        out = module(x.contiguous())
    feats, logits = (out[0], out[1]) if isinstance(out, tuple) else (out, None)
    feats.double().numpy().astype("<f8").tofile(os.path.join(directory, "features_py.f64"))
    if logits is not None:
        logits.double().numpy().astype("<f8").tofile(os.path.join(directory, "logits_py.f64"))


def sqrtm_psd(a):
    w, v = np.linalg.eigh(a)
    return (v * np.sqrt(np.clip(w, 0, None))) @ v.T


def fid(real, fake):
    mu_r, mu_f = real.mean(axis=0), fake.mean(axis=0)
    s_r, s_f = np.cov(real, rowvar=False), np.cov(fake, rowvar=False)
    root = sqrtm_psd(s_r)
    cross = sqrtm_psd(root @ s_f @ root)
    return float(((mu_r - mu_f) ** 2).sum() + np.trace(s_r) + np.trace(s_f) - 2 * np.trace(cross))


def gram_d2(a, b):
    return (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * (a @ b.T)


def precision_recall(real, fake, k):
    ties = 0
    radii = []
    for s in (real, fake):
        d2 = gram_d2(s, s)
        np.fill_diagonal(d2, np.inf)
        radii.append(np.sort(d2, axis=1)[:, k - 1])
    out = []
    for queries, points, r in ((fake, real, radii[0]), (real, fake, radii[1])):
        d2 = gram_d2(queries, points)
        ties += int(np.sum(np.abs(d2 - r[None, :]) <= 1e-9 * np.abs(r[None, :])))
        out.append(float(np.mean(np.any(d2 <= r[None, :], axis=1))))
    return out[0], out[1], ties


def metrics(directory):
    meta = read_meta(directory)
    d = meta["width"]
    real = fm.load(directory, "real.f64", "<f8", (meta["n_real"], d))
    fake = fm.load(directory, "fake.f64", "<f8", (meta["n_fake"], d))
    real_idx = fm.load(directory, "kid_real.i64", "<i8", (meta["subsets"], meta["subset_real"]))
    fake_idx = fm.load(directory, "kid_fake.i64", "<i8", (meta["subsets"], meta["subset_fake"]))
    logits = fm.load(directory, "logits.f64", "<f8", (meta["n_logits"], meta["classes"]))
    kid_mean, kid_std = fm.kid(real, fake, real_idx, fake_idx)
    precision, recall, ties = precision_recall(real, fake, meta["k"])
    is_mean, is_std = fm.inception_score(logits, meta["splits"])
    results = {"fid": fid(real, fake), "kid_mean": kid_mean, "kid_std": kid_std, "precision": precision,
               "recall": recall, "near_ties": ties, "is_mean": is_mean, "is_std": is_std}
    with open(os.path.join(directory, "ref.txt"), "w") as f:
        for name, value in results.items():
            f.write(f"{name} {value:.17g}\n")


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "variants":
        variants(sys.argv[2], sys.argv[3])
    elif cmd == "features":
        features(sys.argv[2], sys.argv[3:])
    elif cmd == "metrics":
        metrics(sys.argv[2])
    else:
        raise SystemExit(f"unknown command {cmd}")
