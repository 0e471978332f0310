"""The float32 tolerance within which two systems' first losses must agree.

Derivation (also in docs/benchmarks-peers.md). shardgan and its PyTorch copy compute the same
function of the same weights, data and latents; in float32 they can differ only in the order
of additions (other kernels and blockings for other local batches, float64 vs float32 partial
sums, the order of gradient reductions over ranks) and in FMA contractions. For one sum of n
terms, the probabilistic rounding-error bound of Higham & Mary (2019, "A new approach to
probabilistic rounding error analysis", SIAM J. Sci. Comput. 41(5)) is

    |fl(sum x_i) - sum x_i|  <=  lambda * sqrt(n) * u * sum |x_i|,    u = 2^-24,

with probability at least 1 - 2 exp(-lambda^2 / 2) (lambda = 5: 1 - 7.5e-6) per sum. Two
orders of the same sum differ by at most twice that. Taking sum|x_i| ~ |sum x_i| (condition
number ~1) and adding the first-order relative errors of every reduction a loss passes
through, one step's loss carries a relative difference of at most

    r_1 = 2 * lambda * u * S,   S = sum over the reductions of sqrt(n)

where the reductions are, per layer of G and of D (both nets are on the path of both losses):
a convolution's fan-in C_in*k*k (C_in*(k/s)^2 for a transposed one), a linear layer's fan-in,
spectral norm's sigma = v W^T u^T (fan-in and fan-out), attention's two batched products
(C/8 and HW/4) and its softmax (HW/4), and the loss's mean over the batch. BatchNorm
statistics are summed in float64 by both systems and do not count. Step k's losses are
computed from parameters that k - 1 Adam updates have moved: Adam divides the gradient by
its own running RMS, so a relative gradient difference r becomes a parameter difference of
about lr * r, which moves the next loss by less than the forward's own rounding; to first
order each step adds one more r_1, and the tolerance for step k is

    |loss_a - loss_b|  <=  k * r_1 * max(1, |loss_b|).

Two things would break the model and are not in the benchmark: an Adam element whose
gradient is within rounding of zero but above eps (its first update is lr * sign(g), which
rounding can flip), and chaotic growth over many steps; hence only the first three steps are
compared.
"""
import math

import torch
import torch.nn as nn

U = 2.0 ** -24
LAMBDA = 5.0


def reduction_sqrt_sum(module, image_hw=32):
    """S of one network: the sum of sqrt(n) over its float32 reductions (see above)."""
    import models  # the PyTorch copy (benchmarks/peers/models.py)
    s = 0.0
    for m in module.modules():
        if isinstance(m, nn.ConvTranspose2d):
            k, st = m.kernel_size[0], m.stride[0]
            s += math.sqrt(m.in_channels * max(1, (k // st)) ** 2)
        elif isinstance(m, nn.Conv2d):
            s += math.sqrt(m.in_channels * m.kernel_size[0] * m.kernel_size[1])
        elif isinstance(m, models.SNBase):
            w = m.weight
            fan_in = w[0].numel() if w.dim() > 1 else 1
            if not isinstance(m, models.SNEmbedding):
                s += math.sqrt(fan_in)  # the layer's own product
            s += math.sqrt(fan_in) + math.sqrt(w.size(0))  # sigma = (v W^T) u^T
        elif isinstance(m, models.Attention):
            # theta^T phi (C/8), g beta^T and the softmax (HW/4). Attention runs at one
            # resolution; the largest, image_hw / 2, bounds it.
            hw = (image_hw // 2) ** 2
            s += math.sqrt(m.ch // 8) + 2 * math.sqrt(hw // 4)
    return s


def loss_rtol_step1(cfg):
    """r_1 for the model of a shardgan config (flat keys), from its PyTorch copy built on
    the meta device (no memory)."""
    import models
    with torch.device("meta"):
        g, d = models.build(cfg)
    batch = int(cfg["train.global_batch"])
    s = reduction_sqrt_sum(g) + reduction_sqrt_sum(d) + math.sqrt(batch)
    return 2.0 * LAMBDA * U * s, s


def within(a, b, step, r1):
    """Whether losses a and b of step `step` (1-based) agree: |a - b| <= step * r1 * max(1, |b|)."""
    return abs(a - b) <= step * r1 * max(1.0, abs(b))
