#!/usr/bin/env python3
"""Exports pytorch-fid's FID Inception-v3 as a TorchScript feature network for shardgan.

  .venv/bin/python scripts/export_inception.py --weights pt_inception-2015-12-05-6726825d.pth -o inception.pt
  .venv/bin/python scripts/export_inception.py --random-weights --seed 1 -o inception-random.pt

The network is the one pytorch-fid computes FID with (Heusel et al. 2017; the 2015 TensorFlow
Inception graph ported to PyTorch): torchvision's Inception3 with 1008 outputs and no
auxiliary head, whose Mixed_5b-5d, 6b-6e and 7b-7c blocks average-pool without counting the
padding and whose last block max-pools in its pool branch, as the TensorFlow graph does. The
architecture is built here from torchvision's layers; nothing is downloaded. With --weights
the state dict of pytorch-fid's release file is loaded (its name carries the first 8 hex
digits of its SHA-256, 6726825d); only that file makes the figures comparable with papers.
With --random-weights the same architecture gets He-normal weights from --seed (see
random_weights_): the tests use it, because the pretrained weights cannot be downloaded on every
machine.

The archive holds the traced module and, as torch.jit.save's extra file
shardgan_manifest.json, its manifest (include/shardgan/eval/feature_network.h):
  input   images [B, 3, 299, 299] float32 in [0, 1]; shardgan maps its [-1, 1] images onto
          [0, 1], repeats grey images to 3 channels and resizes bilinearly (align_corners
          false, no antialias) to 299 x 299, as pytorch-fid's InceptionV3(resize_input=True)
          does; the module then scales to [-1, 1] (pytorch-fid's normalize_input);
  outputs (pool3 features [B, 2048], logits [B, 1008]): the 2048-d average-pooled features
          of FID, KID and precision/recall, and the logits of the Inception Score;
  weights_xxh3  xxh3-64 of the parameters' and buffers' bytes, sorted by name, which shardgan
          recomputes on load.

Needs torch, torchvision and xxhash (scripts/setup-dev.sh pins the versions the tests use).
"""
import argparse
import hashlib
import json
import sys

import torch
import torch.nn.functional as F
import torchvision
import xxhash
from torchvision.models.inception import Inception3, InceptionA, InceptionC, InceptionE

PYTORCH_FID_SHA256_PREFIX = "6726825d"


class FidInceptionA(InceptionA):
    """InceptionA whose pool branch averages over the valid pixels only."""

    def forward(self, x):
        b1 = self.branch1x1(x)
        b5 = self.branch5x5_2(self.branch5x5_1(x))
        b3 = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        bp = self.branch_pool(F.avg_pool2d(x, kernel_size=3, stride=1, padding=1, count_include_pad=False))
        return torch.cat([b1, b5, b3, bp], 1)


class FidInceptionC(InceptionC):
    """InceptionC whose pool branch averages over the valid pixels only."""

    def forward(self, x):
        b1 = self.branch1x1(x)
        b7 = self.branch7x7_3(self.branch7x7_2(self.branch7x7_1(x)))
        b7d = x
        for layer in (self.branch7x7dbl_1, self.branch7x7dbl_2, self.branch7x7dbl_3, self.branch7x7dbl_4,
                      self.branch7x7dbl_5):
            b7d = layer(b7d)
        bp = self.branch_pool(F.avg_pool2d(x, kernel_size=3, stride=1, padding=1, count_include_pad=False))
        return torch.cat([b1, b7, b7d, bp], 1)


class FidInceptionE(InceptionE):
    """InceptionE with the TensorFlow graph's pool branch: an average over the valid pixels
    (Mixed_7b) or a max (Mixed_7c)."""

    def __init__(self, in_channels, pool):
        super().__init__(in_channels)
        self.pool = pool

    def forward(self, x):
        b1 = self.branch1x1(x)
        b3 = self.branch3x3_1(x)
        b3 = torch.cat([self.branch3x3_2a(b3), self.branch3x3_2b(b3)], 1)
        b3d = self.branch3x3dbl_2(self.branch3x3dbl_1(x))
        b3d = torch.cat([self.branch3x3dbl_3a(b3d), self.branch3x3dbl_3b(b3d)], 1)
        if self.pool == "max":
            pooled = F.max_pool2d(x, kernel_size=3, stride=1, padding=1)
        else:
            pooled = F.avg_pool2d(x, kernel_size=3, stride=1, padding=1, count_include_pad=False)
        return torch.cat([b1, b3, b3d, self.branch_pool(pooled)], 1)


def random_weights_(net):
    """He-normal convolutions (fan-in, ReLU gain) and a N(0, 1/2048) output layer, with the
    BatchNorm layers left at the identity (running mean 0, variance 1): the activations keep
    their scale through the 94 layers, so the features of different images differ. torch's
    default initialization shrinks them about 3x a layer, to features that are all but
    equal."""
    for m in net.modules():
        if isinstance(m, torch.nn.Conv2d):
            torch.nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")
        elif isinstance(m, torch.nn.Linear):
            torch.nn.init.normal_(m.weight, std=m.in_features ** -0.5)
            torch.nn.init.zeros_(m.bias)


def fid_inception_v3():
    net = Inception3(num_classes=1008, aux_logits=False, init_weights=False)
    net.Mixed_5b = FidInceptionA(192, pool_features=32)
    net.Mixed_5c = FidInceptionA(256, pool_features=64)
    net.Mixed_5d = FidInceptionA(288, pool_features=64)
    net.Mixed_6b = FidInceptionC(768, channels_7x7=128)
    net.Mixed_6c = FidInceptionC(768, channels_7x7=160)
    net.Mixed_6d = FidInceptionC(768, channels_7x7=160)
    net.Mixed_6e = FidInceptionC(768, channels_7x7=192)
    net.Mixed_7b = FidInceptionE(1280, pool="avg")
    net.Mixed_7c = FidInceptionE(2048, pool="max")
    return net


class FeatureNetwork(torch.nn.Module):
    """[B, 3, 299, 299] in [0, 1] -> (pool3 features [B, 2048], logits [B, 1008])."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x):
        n = self.net
        x = 2 * x - 1
        for layer in (n.Conv2d_1a_3x3, n.Conv2d_2a_3x3, n.Conv2d_2b_3x3, n.maxpool1, n.Conv2d_3b_1x1,
                      n.Conv2d_4a_3x3, n.maxpool2, n.Mixed_5b, n.Mixed_5c, n.Mixed_5d, n.Mixed_6a, n.Mixed_6b,
                      n.Mixed_6c, n.Mixed_6d, n.Mixed_6e, n.Mixed_7a, n.Mixed_7b, n.Mixed_7c):
            x = layer(x)
        features = torch.flatten(n.avgpool(x), 1)
        return features, n.fc(features)


def weights_xxh3(module):
    """xxh3-64 of every parameter's and buffer's bytes, in the order of their names."""
    tensors = dict(module.named_parameters())
    tensors.update(module.named_buffers())
    h = xxhash.xxh3_64()
    for name in sorted(tensors):
        h.update(tensors[name].detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def load_release_weights(net, path, manifest, sha256_prefix, tool, comparable=None):
    """Loads the state dict at `path` into `net` and records it in `manifest` (its name and
    SHA-256); `comparable` goes into the manifest when the file's SHA-256 starts with
    `sha256_prefix` (the release's), else `tool` warns on stderr."""
    digest = sha256_of(path)
    net.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    manifest["weights"] = f"{path.rsplit('/', 1)[-1]} (sha256 {digest})"
    manifest["weights_sha256"] = digest
    if digest.startswith(sha256_prefix):
        if comparable:
            manifest["comparable"] = comparable
    else:
        print(f"{tool}: {path} is not the release file (its sha256 does not start with {sha256_prefix})"
              + ("; the figures will not be comparable with papers" if comparable else ""), file=sys.stderr)


def save_with_manifest(model, example, manifest, output):
    """Traces `model` (eval mode) on `example`, records the weights' xxh3 in `manifest` and
    saves the TorchScript archive with the manifest as shardgan_manifest.json."""
    with torch.no_grad():
        traced = torch.jit.trace(model.eval(), example, check_trace=False)
    manifest["weights_xxh3"] = weights_xxh3(traced)
    torch.jit.save(traced, output, _extra_files={"shardgan_manifest.json": json.dumps(manifest, indent=1)})
    print(f"wrote {output}: {manifest['architecture']}, {manifest['weights']}, weights xxh3 "
          f"{manifest['weights_xxh3']}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--weights", help="pytorch-fid's pt_inception-2015-12-05-6726825d.pth (a state dict)")
    src.add_argument("--random-weights", action="store_true", help="He-normal random weights (tests only)")
    p.add_argument("--seed", type=int, default=1, help="seed of --random-weights")
    p.add_argument("-o", "--output", required=True, help="TorchScript file to write")
    args = p.parse_args(argv)

    torch.manual_seed(args.seed)
    net = fid_inception_v3()
    manifest = {
        "format": "shardgan-feature-network",
        "version": 1,
        "architecture": "pytorch-fid-inception-v3",
        "input": {"range": [0.0, 1.0], "channels": 3, "size": [299, 299], "resize": "bilinear"},
        "outputs": {"features": 2048, "logits": 1008},
        "exported_with": {"torch": torch.__version__, "torchvision": torchvision.__version__},
    }
    if args.weights:
        load_release_weights(net, args.weights, manifest, PYTORCH_FID_SHA256_PREFIX, "export_inception",
                             comparable="pytorch-fid")
    else:
        random_weights_(net)
        manifest["weights"] = f"random weights (He-normal, torch.manual_seed({args.seed}))"
    save_with_manifest(FeatureNetwork(net), torch.rand(2, 3, 299, 299), manifest, args.output)


if __name__ == "__main__":
    main()
