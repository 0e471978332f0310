"""The memory floor of any activation checkpointing at BigGAN's 64x64 geometry: one layer.

G's last block at 64x64 (BigGAN-PyTorch geometry, ch 32) upsamples 128 channels from 32x32
and convolves them to 64 (conv1). No checkpointing can hold less than this one layer's
forward and backward at once. This measures it in a fresh process, with PyTorch's own CPU
kernels (the same LibTorch build and oneDNN as shardgan), one thread, as the growth of the
peak RSS (ru_maxrss) over the held input. Prints one JSON line.

    .venv/bin/python benchmarks/layer_peak.py [batch per rank, default 32] [channels_last] [fused]

With `channels_last` the input and the layer are in channels-last memory format (NHWC),
which oneDNN computes without reordering the activations to its blocked layout. With
`fused` the layer is computed as shardgan's model.fused_upsample computes it: one
transposed convolution of the low-resolution input with the 4x4 kernel
[w2, w1 + w2, w0 + w1, w0] along each axis (biggan::upsample_conv_kernel), so the
upsampled input is never made.
"""
import json
import resource
import sys

import torch


def maxrss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main():
    batch = int(sys.argv[1]) if len(sys.argv) > 1 else 32
    channels_last = "channels_last" in sys.argv[2:]
    fused = "fused" in sys.argv[2:]
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    torch.set_num_threads(1)
    conv = torch.nn.Conv2d(128, 64, 3, padding=1).to(memory_format=fmt)
    F = torch.nn.functional
    fold = lambda w, d: torch.stack([w.select(d, 2), w.select(d, 1) + w.select(d, 2),
                                     w.select(d, 0) + w.select(d, 1), w.select(d, 0)], d)
    if fused:
        layer = lambda t: F.conv_transpose2d(t, fold(fold(conv.weight, 2), 3).transpose(0, 1).contiguous(),
                                             conv.bias, stride=2, padding=1)
    else:
        layer = lambda t: conv(F.interpolate(t, scale_factor=2))  # nearest, as upsample2
    layer(torch.randn(2, 128, 32, 32).to(memory_format=fmt)).sum().backward()  # one-time allocations first
    x = torch.randn(batch, 128, 32, 32).to(memory_format=fmt).requires_grad_()
    base = maxrss_mib()
    y = layer(x)
    fwd = maxrss_mib()
    y.backward(torch.randn_like(y))
    bwd = maxrss_mib()
    mib = lambda n: n * 4 / 2**20
    print(json.dumps({
        "bench": "layer_peak", "layer": "upsample x2 + conv3x3 128->64 at 64x64", "batch": batch,
        "torch": torch.__version__, "threads": 1, "memory_format": "channels_last" if channels_last else "contiguous",
        "fused_upsample": fused,
        "input_mib": mib(x.numel()), "upsampled_mib": mib(4 * x.numel()), "output_mib": mib(y.numel()),
        "peak_growth_forward_mib": fwd - base, "peak_growth_forward_backward_mib": bwd - base,
    }))


if __name__ == "__main__":
    main()
