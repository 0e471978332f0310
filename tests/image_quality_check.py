"""Compares shardgan's image scores (written by test_pix2pix's ImageQuality case) with
scikit-image's on the same images: L1 on the [-1, 1] scale, PSNR and SSIM on [0, 1]."""
import sys

import numpy as np
from skimage.metrics import peak_signal_noise_ratio, structural_similarity

d = sys.argv[1]
shape = (3, 3, 32, 32)
out = np.fromfile(f"{d}/out.f64").reshape(shape)
target = np.fromfile(f"{d}/target.f64").reshape(shape)
ours = np.fromfile(f"{d}/scores.f64").reshape(3, 3)  # rows: l1, psnr, ssim; one column per image
worst = 0.0
for i in range(shape[0]):
    o, t = (out[i] + 1) / 2, (target[i] + 1) / 2
    ref = [np.abs(out[i] - target[i]).mean(),
           peak_signal_noise_ratio(t, o, data_range=1.0),
           structural_similarity(t, o, gaussian_weights=True, sigma=1.5, use_sample_covariance=False,
                                 data_range=1.0, channel_axis=0)]
    for k, name in enumerate(["l1", "psnr", "ssim"]):
        rel = abs(ours[k, i] - ref[k]) / abs(ref[k])
        worst = max(worst, rel)
        print(f"image {i} {name}: shardgan {ours[k, i]:.12f} scikit-image {ref[k]:.12f} rel {rel:.2e}")
        if rel > 1e-9:
            sys.exit(f"FAIL: {name} of image {i} differs by {rel:.3g} relative (bound 1e-9)")
print(f"OK: max relative difference {worst:.2e} (bound 1e-9)")
