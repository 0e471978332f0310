#!/usr/bin/env python3
"""The Python side of TorchScriptMetrics.StyleGan2AdaDetector (tests/test_torchscript_metrics.cpp).

  stylegan2_detector_ref.py OUTDIR DIR...

NVIDIA's inception-2015-12-05.pt cannot be downloaded here, so OUTDIR/detector.pt is a small
network written here with the same TorchScript interface, `forward(img, return_features,
use_fp16, no_output_bias)`: uint8 [B, 3, H, W] images at any size, resized inside the module,
mapped to [-1, 1[ as (x - 128) / 128, features with return_features=True, otherwise the
softmax of the output layer (without its bias when no_output_bias=True). It asserts that its
input is uint8, as StyleGAN2-ADA feeds it. OUTDIR/plain.pt has neither a manifest nor that
interface. For each DIR's images (DIR/meta.txt, DIR/images.f32 in [-1, 1]) it writes the
features and the probabilities as StyleGAN2-ADA's metric_utils.py computes them:
`(x * 127.5 + 128).clamp(0, 255).to(torch.uint8)`, grey repeated to 3 channels, then the
detector with return_features=True, and with no_output_bias=True (the Inception Score's).

NVIDIA's vgg16.pt (StyleGAN2-ADA's precision/recall) cannot be downloaded either:
OUTDIR/vgg16.pt is a small stand-in with its interface, `forward(img, resize_images,
return_lpips, return_features)`, called as metrics/precision_recall.py calls it (the same
uint8 pixels, return_features=True, resize_images at its default, true); each DIR gets its
features as DIR/features_vgg_py.f64. OUTDIR/vgg16_coarse.pt is the same interface with 4
features.
"""
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F


class Detector(torch.nn.Module):
    def __init__(self, width: int = 256, classes: int = 1008, size: int = 75):
        super().__init__()
        self.width = width
        self.size = size
        self.layers = torch.nn.Sequential(
            torch.nn.Conv2d(3, 32, 3, stride=2), torch.nn.ReLU(),
            torch.nn.Conv2d(32, 64, 3, stride=2), torch.nn.ReLU(),
            torch.nn.Conv2d(64, width, 3, stride=2), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1))
        self.output = torch.nn.Linear(width, classes)

    def forward(self, img: torch.Tensor, return_features: bool = False, use_fp16: bool = False,
                no_output_bias: bool = False) -> torch.Tensor:
        assert img.dtype == torch.uint8, "the detector takes uint8 pixels"
        assert img.shape[1] == 3, "the detector takes 3 channels"
        x = F.interpolate(img.to(torch.float32), size=(self.size, self.size), mode="bilinear",
                          align_corners=False)
        x = (x - 128.0) / 128.0
        features = self.layers(x).reshape(-1, self.width)
        if return_features:
            return features
        if no_output_bias:
            logits = F.linear(features, self.output.weight)
        else:
            logits = self.output(features)
        return F.softmax(logits, dim=1)


class Vgg16Standin(torch.nn.Module):
    """Not VGG16: a small network with vgg16.pt's TorchScript interface. It resizes to 32 x 32
    (the real file: 224) when resize_images is true."""

    def __init__(self, width: int = 128, size: int = 32):
        super().__init__()
        self.width = width
        self.size = size
        self.layers = torch.nn.Sequential(
            torch.nn.Conv2d(3, 32, 3, stride=2), torch.nn.ReLU(),
            torch.nn.Conv2d(32, width, 3, stride=2), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(2))
        self.fc = torch.nn.Linear(4 * width, width)

    def forward(self, img: torch.Tensor, resize_images: bool = True, return_lpips: bool = False,
                return_features: bool = False) -> torch.Tensor:
        assert img.shape[1] == 3, "the detector takes 3 channels"
        x = img.to(torch.float32)
        if resize_images:
            x = F.interpolate(x, size=(self.size, self.size), mode="area")
        x = (x - 127.5) / 127.5
        features = F.relu(self.fc(self.layers(x).flatten(1)))
        if return_lpips:
            return features / features.square().sum(dim=1, keepdim=True).sqrt().clamp(min=1e-8)
        return features


class Plain(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1)


def main(out, directories):
    torch.manual_seed(3)
    det = Detector()
    for m in det.layers:
        if isinstance(m, torch.nn.Conv2d):
            torch.nn.init.kaiming_normal_(m.weight)
    torch.nn.init.normal_(det.output.weight, std=0.05)
    det = torch.jit.script(det.eval())
    det.save(os.path.join(out, "detector.pt"))
    torch.jit.script(Plain()).save(os.path.join(out, "plain.pt"))
    vgg = Vgg16Standin()
    for m in vgg.layers:
        if isinstance(m, torch.nn.Conv2d):
            torch.nn.init.kaiming_normal_(m.weight)
    vgg = torch.jit.script(vgg.eval())
    vgg.save(os.path.join(out, "vgg16.pt"))
    # A coarse one (4 features), under which generated and real images share neighbourhoods,
    # so that precision and recall are neither 0 nor 1 (tests/pr_network_test.sh).
    torch.manual_seed(4)
    torch.jit.script(Vgg16Standin(width=4).eval()).save(os.path.join(out, "vgg16_coarse.pt"))
    for directory in directories:
        meta = {}
        with open(os.path.join(directory, "meta.txt")) as f:
            for line in f:
                key, value = line.split()
                meta[key] = int(value)
        shape = (meta["n"], meta["channels"], meta["height"], meta["width"])
        x = torch.from_numpy(np.fromfile(os.path.join(directory, "images.f32"), dtype="<f4").reshape(shape))
        img = (x * 127.5 + 128).clamp(0, 255).to(torch.uint8)
        if img.shape[1] == 1:
            img = img.repeat([1, 3, 1, 1])
        with torch.no_grad():
            feats = det(img, return_features=True)
            probs = det(img, no_output_bias=True)
        feats.double().numpy().astype("<f8").tofile(os.path.join(directory, "features_py.f64"))
        with torch.no_grad():
            vgg.forward(img, return_features=True).double().numpy().astype("<f8").tofile(
                os.path.join(directory, "features_vgg_py.f64"))
        probs.double().numpy().astype("<f8").tofile(os.path.join(directory, "probs_py.f64"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
