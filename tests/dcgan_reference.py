#!/usr/bin/env python3
"""The DCGAN of Radford et al. 2016 (arXiv:1511.06434, figure 1) re-typed in plain PyTorch, as
PyTorch's examples/dcgan types it at 64x64 (nz, ngf, ndf, nc), generalized to 2^k pixels by
adding or removing a stride-2 block. It shares no code with src/models/dcgan/dcgan.cpp.

  dcgan_reference.py SIZE NZ NGF NDF NC [SIZE NZ NGF NDF NC ...]
prints "g <parameters> d <parameters>" per case (one Python start for all of them) and checks
that G maps [2, nz, 1, 1] to [2, nc, SIZE, SIZE] and D that to [2, 1, 1, 1].
"""
import sys

import torch
from torch import nn


def generator(size, nz, ngf, nc):
    blocks = size.bit_length() - 3  # stride-2 steps between 4x4 and the image
    width = ngf * 2 ** (blocks - 1)
    layers = [nn.ConvTranspose2d(nz, width, 4, 1, 0, bias=False), nn.BatchNorm2d(width), nn.ReLU(True)]
    for _ in range(blocks - 1):
        layers += [nn.ConvTranspose2d(width, width // 2, 4, 2, 1, bias=False), nn.BatchNorm2d(width // 2),
                   nn.ReLU(True)]
        width //= 2
    layers += [nn.ConvTranspose2d(ngf, nc, 4, 2, 1, bias=False), nn.Tanh()]
    return nn.Sequential(*layers)


def discriminator(size, ndf, nc):
    blocks = size.bit_length() - 3
    layers = [nn.Conv2d(nc, ndf, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True)]
    width = ndf
    for _ in range(blocks - 1):
        layers += [nn.Conv2d(width, width * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(width * 2),
                   nn.LeakyReLU(0.2, inplace=True)]
        width *= 2
    layers += [nn.Conv2d(width, 1, 4, 1, 0, bias=False)]
    return nn.Sequential(*layers)


def main():
    args = [int(a) for a in sys.argv[1:]]
    for i in range(0, len(args), 5):
        size, nz, ngf, ndf, nc = args[i:i + 5]
        g, d = generator(size, nz, ngf, nc), discriminator(size, ndf, nc)
        with torch.no_grad():
            img = g(torch.randn(2, nz, 1, 1))
            assert img.shape == (2, nc, size, size), img.shape
            assert d(img).shape == (2, 1, 1, 1), d(img).shape
        count = lambda m: sum(p.numel() for p in m.parameters())
        print(f"g {count(g)} d {count(d)}")


if __name__ == "__main__":
    main()
