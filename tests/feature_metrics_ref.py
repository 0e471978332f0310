#!/usr/bin/env python3
"""Independent float64 reference for KID, improved precision/recall and the Inception Score.

Used by tests/test_feature_metrics.cpp (ctest kid_pr_is): it shares no code with
src/eval/feature_metrics.cpp and is written from the papers' definitions with numpy only.

  KID (Binkowski et al. 2018, arXiv:1801.01401): per subset, the unbiased MMD^2 U-statistic
      mean_{i != j} k(x_i, x_j) + mean_{i != j} k(y_i, y_j) - 2 mean_{i, j} k(x_i, y_j)
  with k(a, b) = (a.b / d + 1)^3, averaged over the subsets given in the input (population
  std, ddof = 0).
  Precision/recall (Kynkaanniemi et al. 2019, arXiv:1904.06991): radius of a point = distance
  to its k-th nearest neighbour in its own set, itself excluded; a sample is inside a
  manifold if its distance to some point is <= that point's radius. Distances here are the
  squared differences summed directly (not the Gram form the C++ uses).
  IS (Salimans et al. 2016, arXiv:1606.03498): exp(mean KL(p(y|x) || p(y))) per split of
  consecutive rows [s N / S, (s + 1) N / S), population std over splits.

Usage: feature_metrics_ref.py DIR. DIR holds meta.txt ("key value" lines) and the raw
little-endian arrays real.f64, fake.f64 [N, d], kid_real.i64, kid_fake.i64 [S, m] and
logits.f64 [N_l, C]; the results go to DIR/ref.txt as "name value" lines (%.17g).
"""
import os
import sys

import numpy as np


def read_meta(path):
    meta = {}
    with open(path) as f:
        for line in f:
            key, value = line.split()
            meta[key] = int(value)
    return meta


def load(directory, name, dtype, shape):
    a = np.fromfile(os.path.join(directory, name), dtype=dtype)
    if a.size != shape[0] * shape[1]:
        raise SystemExit(f"{name}: {a.size} values, expected {shape}")
    return a.reshape(shape)


def kid(real, fake, real_idx, fake_idx):
    d = real.shape[1]
    values = []
    for r_sel, f_sel in zip(real_idx, fake_idx):
        x = real[r_sel]
        y = fake[f_sel]
        m, n = len(x), len(y)
        kxx = (x @ x.T / d + 1.0) ** 3
        kyy = (y @ y.T / d + 1.0) ** 3
        kxy = (x @ y.T / d + 1.0) ** 3
        off_x = ~np.eye(m, dtype=bool)
        off_y = ~np.eye(n, dtype=bool)
        values.append(kxx[off_x].mean() + kyy[off_y].mean() - 2.0 * kxy.mean())
    values = np.asarray(values, dtype=np.float64)
    return values.mean(), values.std(ddof=0)


def squared_distances(a, b, chunk=32):
    """Pairwise sum_k (a_ik - b_jk)^2, [len(a), len(b)], in row chunks."""
    out = np.empty((len(a), len(b)), dtype=np.float64)
    for start in range(0, len(a), chunk):
        diff = a[start:start + chunk, None, :] - b[None, :, :]
        out[start:start + chunk] = np.einsum("ijk,ijk->ij", diff, diff)
    return out


def kth_radius_sq(a, k):
    d2 = squared_distances(a, a)
    np.fill_diagonal(d2, np.inf)  # exclude the point itself
    return np.sort(d2, axis=1)[:, k - 1]


def inside_fraction(queries, points, radii_sq):
    d2 = squared_distances(queries, points)
    return float(np.mean(np.any(d2 <= radii_sq[None, :], axis=1)))


def precision_recall(real, fake, k):
    precision = inside_fraction(fake, real, kth_radius_sq(real, k))
    recall = inside_fraction(real, fake, kth_radius_sq(fake, k))
    return precision, recall


def inception_score(logits, splits):
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    p = np.exp(log_p)
    n = len(logits)
    scores = []
    for s in range(splits):
        part_p = p[s * n // splits:(s + 1) * n // splits]
        part_log_p = log_p[s * n // splits:(s + 1) * n // splits]
        marginal = part_p.mean(axis=0)
        with np.errstate(divide="ignore", invalid="ignore"):
            kl_terms = np.where(part_p > 0, part_p * (part_log_p - np.log(marginal)[None, :]), 0.0)
        scores.append(np.exp(kl_terms.sum(axis=1).mean()))
    scores = np.asarray(scores, dtype=np.float64)
    return scores.mean(), scores.std(ddof=0)


def main():
    directory = sys.argv[1]
    meta = read_meta(os.path.join(directory, "meta.txt"))
    d = meta["width"]
    real = load(directory, "real.f64", "<f8", (meta["n_real"], d))
    fake = load(directory, "fake.f64", "<f8", (meta["n_fake"], d))
    real_idx = load(directory, "kid_real.i64", "<i8", (meta["subsets"], meta["subset_real"]))
    fake_idx = load(directory, "kid_fake.i64", "<i8", (meta["subsets"], meta["subset_fake"]))
    logits = load(directory, "logits.f64", "<f8", (meta["n_logits"], meta["classes"]))

    kid_mean, kid_std = kid(real, fake, real_idx, fake_idx)
    precision, recall = precision_recall(real, fake, meta["k"])
    is_mean, is_std = inception_score(logits, meta["splits"])
    results = {"kid_mean": kid_mean, "kid_std": kid_std, "precision": precision, "recall": recall,
               "is_mean": is_mean, "is_std": is_std}
    with open(os.path.join(directory, "ref.txt"), "w") as f:
        for name, value in results.items():
            f.write(f"{name} {value:.17g}\n")


if __name__ == "__main__":
    main()
