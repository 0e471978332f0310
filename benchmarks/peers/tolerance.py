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

StyleGAN2 (benchmarks/peers/stylegan2.py's layers): a fully connected layer's fan-in, a
convolution's C_in k^2 (plus the 16 taps of the [1,3,3,1] filter before a strided one), a
modulated convolution's C_in k^2 (C_in (k/2)^2 + 16 taps when it upsamples) and its
demodulation (k^2 and C_in), the image upsampling's 16 taps, the second-moment
normalizations (z_dim, w_dim), minibatch stddev (the group twice, C H W) and the class
projection (cmap_dim). A step has up to four Adam updates (D, D reg, G, G reg); each is
normalized by Adam as above, so the same k * r_1 bounds the losses.

The regularization penalties (reg_rtol_step1) are functions of a gradient: R1 = gamma/2
mean |dD/dx|^2, path length = mean (a - m)^2 with a = |d sum(G u)/dw| (per ws, rms). The
gradient passes through the net's forward (S_fwd) and its backward to the input, whose
reductions are the fan-outs (S_bwd: C_out k^2 per convolution, a layer's fan-out, and for a
modulated convolution the H W of its style gradient); squaring doubles the relative error;
then the squared norm (C H W for R1, num_ws w_dim for path length, and sum(G u): C H W) and
the batch mean add theirs:

    r_R1 = 2 lambda u (2 (S_fwd(D) + S_bwd(D)) + sqrt(C H W) + sqrt(B))
    r_PL = 2 lambda u (2 (S_fwd(G) + S_bwd(G)) + 2 sqrt(C H W) + sqrt(num_ws w_dim) + sqrt(B / shrink))

These penalties are sums of squares, not differences (a - m has m ~ 0.01 mean(a) in the
first steps), so their tolerance is relative to their own size: |a - b| <= k r |b| at step k;
pl_mean (m, moved by mean(a)) takes r_PL too.

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


def _sg2_sqrt_sums(module, image_hw=32):
    """(S_fwd, S_bwd) of a StyleGAN2 network (benchmarks/peers/stylegan2.py layers); see above."""
    import stylegan2 as sg
    fwd = bwd = 0.0
    for m in module.modules():
        if isinstance(m, sg.FullyConnected):
            fwd += math.sqrt(m.weight.shape[1])
            bwd += math.sqrt(m.weight.shape[0])
        elif isinstance(m, sg.Conv2d):
            o, i, k, _ = m.weight.shape
            fwd += math.sqrt(i * k * k) + (4.0 if m.down else 0.0)
            bwd += math.sqrt(o * k * k) + (4.0 if m.down else 0.0)
        elif isinstance(m, sg.SynthesisLayer):
            o, i, k, _ = m.weight.shape
            fwd += (math.sqrt(i * (k // 2 + 1) ** 2) + 4.0 if m.up else math.sqrt(i * k * k)) + math.sqrt(k * k) \
                + math.sqrt(i)
            bwd += math.sqrt(o * k * k) + (4.0 if m.up else 0.0) + math.sqrt(o) + m.resolution
        elif isinstance(m, sg.ToRGB):
            o, i = m.weight.shape[:2]
            fwd += math.sqrt(i)
            bwd += math.sqrt(o) + 4.0  # + the style gradient over H W (bounded by the block's)
        elif isinstance(m, sg.SynthesisBlock):
            if m.conv0 is not None:  # the image's upsampling
                fwd += 4.0
                bwd += 4.0
        elif isinstance(m, sg.Mapping):
            s = (math.sqrt(m.z_dim) if m.z_dim > 0 else 0.0) + (math.sqrt(m.w_dim) if m.c_dim > 0 else 0.0)
            fwd += s
            bwd += s
        elif isinstance(m, sg.DiscriminatorEpilogue):
            c = m.conv.weight.shape[1] - m.mbstd_channels
            s = 2 * math.sqrt(m.mbstd_group) + math.sqrt(c * 16) + (math.sqrt(m.cmap_dim) if m.cmap_dim else 0.0)
            fwd += s
            bwd += s
    return fwd, bwd


def reduction_sqrt_sum(module, image_hw=32):
    """S of one network: the sum of sqrt(n) over its float32 reductions (see above)."""
    import models  # the PyTorch copy (benchmarks/peers/models.py)
    import stylegan2 as sg
    if any(isinstance(m, (sg.ShardganGenerator, sg.ShardganDiscriminator)) for m in module.modules()):
        return _sg2_sqrt_sums(module, image_hw)[0]
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


def reg_rtol_step1(cfg):
    """{"r1": r_R1, "pl": r_PL, "pl_mean": r_PL} of a StyleGAN2 config (see above): the relative
    tolerance of each regularization figure at step 1 (step k: k times it)."""
    import models
    with torch.device("meta"):
        g, d = models.build(cfg)
    batch = int(cfg["train.global_batch"])
    chw = int(cfg["model.channels"]) * int(cfg["model.image_size"]) ** 2
    gf, gb = _sg2_sqrt_sums(g)
    df, db = _sg2_sqrt_sums(d)
    r1 = 2 * (df + db) + math.sqrt(chw) + math.sqrt(batch)
    pl = 2 * (gf + gb) + 2 * math.sqrt(chw) + math.sqrt(g.num_ws * int(cfg["model.w_dim"])) + \
        math.sqrt(batch // int(cfg.get("train.pl_batch_shrink", 2)))
    c = 2.0 * LAMBDA * U
    return {"r1": c * r1, "pl": c * pl, "pl_mean": c * pl}


def within(a, b, step, r1):
    """Whether losses a and b of step `step` (1-based) agree: |a - b| <= step * r1 * max(1, |b|)."""
    return abs(a - b) <= step * r1 * max(1.0, abs(b))
