#!/usr/bin/env python3
"""Exports torchvision's VGG16 as a TorchScript feature network for precision and recall.

  .venv/bin/python scripts/export_vgg16.py --weights vgg16-397923af.pth -o vgg16.pt
  .venv/bin/python scripts/export_vgg16.py --random-weights --seed 1 -o vgg16-random.pt

Improved precision and recall (Kynkaanniemi et al. 2019, arXiv:1904.06991, section 4) compare
images in the feature space of VGG-16's second fully connected layer ("fc2", 4096-d, after
its ReLU), and StyleGAN2-ADA's pr50k3 does the same with its own VGG16 file. Set the file
this script writes as `eval.pr_feature_network` (or `shardgan-ckpt fid --pr-network`): FID,
KID and IS stay on `eval.features`, precision and recall move to VGG16 (docs/fid.md).

The network is torchvision's `vgg16` (Simonyan and Zisserman 2015, configuration D): the 13
convolutions, the 7x7 adaptive average pool and the first two fully connected layers with
their ReLUs (dropout is the identity in eval mode); the third layer (the 1000 ImageNet
logits) is left out. With --weights the state dict of torchvision's ImageNet release
(vgg16-397923af.pth, IMAGENET1K_V1; the name carries the first 8 hex digits of its SHA-256)
is loaded; nothing is downloaded. With --random-weights the same architecture gets
torchvision's own initialization from --seed: the tests use it, because the pretrained
weights cannot be downloaded on every machine.

The archive holds the traced module and, as torch.jit.save's extra file
shardgan_manifest.json, its manifest (include/shardgan/eval/feature_network.h):
  input   images [B, 3, 224, 224] float32 in [0, 1]; shardgan maps its [-1, 1] images onto
          [0, 1], repeats grey images to 3 channels and resizes bilinearly (align_corners
          false, no antialias) to 224 x 224; the module then normalizes with ImageNet's mean
          (0.485, 0.456, 0.406) and standard deviation (0.229, 0.224, 0.225), as
          torchvision's weights expect;
  outputs fc2 features [B, 4096], no logits;
  weights_xxh3  xxh3-64 of the parameters' and buffers' bytes, sorted by name, which shardgan
          recomputes on load.
Figures on this file are comparable with other figures on the same file, not with
StyleGAN2-ADA's pr50k3 (NVIDIA's vgg16.pt, a port of another VGG16's weights), which
shardgan also takes as it is.

Needs torch, torchvision and xxhash (scripts/setup-dev.sh pins the versions the tests use).
The file is about 0.5 GB (fc1 alone holds 103M of the 134M parameters).
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F
import torchvision

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export_inception import load_release_weights, save_with_manifest  # noqa: E402

TORCHVISION_VGG16_SHA256_PREFIX = "397923af"


class Vgg16Fc2(torch.nn.Module):
    """[B, 3, 224, 224] in [0, 1] -> fc2 features [B, 4096] (after ReLU)."""

    def __init__(self, net):
        super().__init__()
        self.features = net.features
        self.avgpool = net.avgpool
        self.fc1 = net.classifier[0]
        self.fc2 = net.classifier[3]
        self.register_buffer("mean", torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1))

    def forward(self, x):
        x = (x - self.mean) / self.std
        x = torch.flatten(self.avgpool(self.features(x)), 1)
        return F.relu(self.fc2(F.relu(self.fc1(x))))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--weights", help="torchvision's vgg16-397923af.pth (a state dict)")
    src.add_argument("--random-weights", action="store_true", help="torchvision's initialization (tests only)")
    p.add_argument("--seed", type=int, default=1, help="seed of --random-weights")
    p.add_argument("-o", "--output", required=True, help="TorchScript file to write")
    args = p.parse_args(argv)

    torch.manual_seed(args.seed)
    net = torchvision.models.vgg16(weights=None)  # torchvision's initialization, from the seed above
    manifest = {
        "format": "shardgan-feature-network",
        "version": 1,
        "architecture": "torchvision-vgg16-fc2",
        "input": {"range": [0.0, 1.0], "channels": 3, "size": [224, 224], "resize": "bilinear"},
        "outputs": {"features": 4096, "logits": 0},
        "exported_with": {"torch": torch.__version__, "torchvision": torchvision.__version__},
    }
    if args.weights:
        load_release_weights(net, args.weights, manifest, TORCHVISION_VGG16_SHA256_PREFIX, "export_vgg16")
    else:
        manifest["weights"] = f"random weights (torchvision's initialization, torch.manual_seed({args.seed}))"
    save_with_manifest(Vgg16Fc2(net), torch.rand(2, 3, 224, 224), manifest, args.output)


if __name__ == "__main__":
    main()
