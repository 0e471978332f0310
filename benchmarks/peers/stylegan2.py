"""A plain-PyTorch StyleGAN2 (Karras et al. 2020, arXiv:1912.04958) for the peer benchmark and
for the parameter counts of docs/models.md.

Written from the papers and the authors' published configurations (the layer shapes and
constants noted in stylegan2-ada-pytorch's training/networks.py and train.py, read for facts
only: that code is under NVIDIA's non-commercial licence and none of it is copied here):

Generator
  - mapping: z (and, conditional, an embedding of the one-hot class) each normalized by its
    second moment, concatenated, then `mapping_layers` fully connected layers of w_dim with
    leaky ReLU (0.2, gain sqrt 2) and learning-rate multiplier 0.01; w_avg tracked
    (beta 0.995) for truncation.
  - synthesis ('skip'): a learned 4x4 constant, then per resolution 4..R a block of
    modulated 3x3 convolutions with weight demodulation (the first upsampling by 2 from 8 on),
    per-layer noise with a learned strength, and a toRGB (modulated 1x1, no demodulation)
    whose image is added to the upsampled image of the previous resolution.
    channels(res) = min(channel_base // res, channel_max).
  - equalized learning rate: weights drawn N(0, 1) (/ lr multiplier), scaled at run time by
    lr_mul / sqrt(fan_in).
Discriminator ('resnet', or 'orig' without the skips)
  - per resolution R..8: fromRGB (1x1, first block only), conv 3x3, conv 3x3 with
    downsampling by 2, and a 1x1 skip without bias (resnet; both branches x sqrt(0.5));
  - epilogue at 4x4: minibatch standard deviation (group min(G, N), one channel), conv 3x3,
    fully connected 16C -> C, output C -> 1, or -> cmap_dim with a projection on the class
    mapped by its own mapping network (embedding + 8 layers, lr multiplier 0.01).
Resampling uses the [1, 3, 3, 1] filter (upsampling: transposed stride-2 zero insertion and
the filter x4; downsampling: the filter, then stride 2).

    .venv/bin/python benchmarks/peers/stylegan2.py   # parameter counts of the presets

Not here yet: the fp16 layers and conv_clamp of the authors' code (shardgan computes in
float32 or bf16 per its own config), the fused modulated convolution (a speed path). Not yet
wired into train_peer.py and run.sh: shardgan has no StyleGAN2 family to compare with yet.
The counts it prints (paper256: G 24,767,458, D 24,001,089; cifar with 10 classes: G
20,215,315, D 23,089,664) agree with a separate per-layer derivation from the same layer
tables; no total printed by the authors' code was found to compare with.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

LRELU_GAIN = math.sqrt(2.0)


def normalize_2nd_moment(x, eps=1e-8):
    return x * (x.square().mean(dim=1, keepdim=True) + eps).rsqrt()


def _filter(device=None, dtype=None):
    f = torch.tensor([1.0, 3.0, 3.0, 1.0], device=device, dtype=dtype)
    f = torch.outer(f, f)
    return f / f.sum()


def blur(x, pad, gain=1.0):
    """Depthwise [1,3,3,1] filter with zero padding (pad_lo, pad_hi) on both axes."""
    c = x.shape[1]
    f = (_filter(x.device, x.dtype) * gain).expand(c, 1, 4, 4)
    x = F.pad(x, [pad[0], pad[1], pad[0], pad[1]])
    return F.conv2d(x, f, groups=c)


def upsample2d(x):
    """x2: zeros inserted, then the filter x4 (keeps the mean)."""
    n, c, h, w = x.shape
    y = x.new_zeros(n, c, h * 2, w * 2)
    y[:, :, ::2, ::2] = x
    return blur(y, (2, 1), gain=4.0)


def downsample2d(x):
    """/2: the filter, then every second pixel."""
    return blur(x, (1, 1))[:, :, ::2, ::2]


class FullyConnected(nn.Module):
    def __init__(self, fan_in, fan_out, lr_mul=1.0, bias_init=0.0, activation="linear"):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(fan_out, fan_in) / lr_mul)
        self.bias = nn.Parameter(torch.full([fan_out], float(bias_init)))
        self.weight_gain = lr_mul / math.sqrt(fan_in)
        self.bias_gain = lr_mul
        self.activation = activation

    def forward(self, x):
        x = F.linear(x, self.weight * self.weight_gain, self.bias * self.bias_gain)
        return F.leaky_relu(x, 0.2) * LRELU_GAIN if self.activation == "lrelu" else x


class Conv2d(nn.Module):
    """Equalized-lr conv with optional [1,3,3,1] down-sampling (D's layers)."""

    def __init__(self, cin, cout, k, bias=True, activation="lrelu", down=False):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(cout, cin, k, k))
        self.bias = nn.Parameter(torch.zeros(cout)) if bias else None
        self.weight_gain = 1.0 / math.sqrt(cin * k * k)
        self.activation, self.down, self.k = activation, down, k

    def forward(self, x, gain=1.0):
        w = self.weight * self.weight_gain
        if self.down:
            # the filter then a stride-2 conv, padded so that an even input halves exactly
            p = 1 + (self.k - 1) // 2
            x = blur(x, (p, p))
            x = F.conv2d(x, w, stride=2)
        else:
            x = F.conv2d(x, w, padding=self.k // 2)
        if self.bias is not None:
            x = x + self.bias.view(1, -1, 1, 1)
        if self.activation == "lrelu":
            x = F.leaky_relu(x, 0.2) * LRELU_GAIN
        return x * gain


def modulated_conv2d(x, weight, styles, demodulate=True, up=False):
    """Per-sample modulation of `weight` [O, I, k, k] by `styles` [N, I], demodulated.
    The non-fused form: scale the input, one shared conv, scale the output."""
    n = x.shape[0]
    o, i, k, _ = weight.shape
    x = x * styles.view(n, i, 1, 1)
    if up:
        # transposed conv, stride 2, then the filter x4
        x = F.conv_transpose2d(x, weight.transpose(0, 1), stride=2)
        x = blur(x, (1, 1), gain=4.0)
    else:
        x = F.conv2d(x, weight, padding=k // 2)
    if demodulate:
        d = ((weight.unsqueeze(0) * styles.view(n, 1, i, 1, 1)).square().sum(dim=[2, 3, 4]) + 1e-8).rsqrt()
        x = x * d.view(n, o, 1, 1)
    return x


class SynthesisLayer(nn.Module):
    def __init__(self, cin, cout, w_dim, resolution, up=False):
        super().__init__()
        self.affine = FullyConnected(w_dim, cin, bias_init=1.0)
        self.weight = nn.Parameter(torch.randn(cout, cin, 3, 3))
        self.noise_strength = nn.Parameter(torch.zeros([]))
        self.bias = nn.Parameter(torch.zeros(cout))
        self.register_buffer("noise_const", torch.randn(resolution, resolution))
        self.weight_gain = 1.0 / math.sqrt(cin * 9)
        self.up, self.resolution = up, resolution

    def forward(self, x, w, noise="random"):
        styles = self.affine(w)
        x = modulated_conv2d(x, self.weight * self.weight_gain, styles, demodulate=True, up=self.up)
        if noise == "random":
            x = x + torch.randn(x.shape[0], 1, self.resolution, self.resolution, dtype=x.dtype) * self.noise_strength
        elif noise == "const":
            x = x + self.noise_const * self.noise_strength
        x = x + self.bias.view(1, -1, 1, 1)
        return F.leaky_relu(x, 0.2) * LRELU_GAIN


class ToRGB(nn.Module):
    def __init__(self, cin, w_dim, img_channels):
        super().__init__()
        self.affine = FullyConnected(w_dim, cin, bias_init=1.0)
        self.weight = nn.Parameter(torch.randn(img_channels, cin, 1, 1))
        self.bias = nn.Parameter(torch.zeros(img_channels))
        self.weight_gain = 1.0 / math.sqrt(cin)

    def forward(self, x, w):
        styles = self.affine(w) * self.weight_gain
        x = modulated_conv2d(x, self.weight, styles, demodulate=False)
        return x + self.bias.view(1, -1, 1, 1)


class SynthesisBlock(nn.Module):
    """One resolution: (const at 4x4 |) conv0 (up) -> conv1 -> toRGB, image skip."""

    def __init__(self, cin, cout, w_dim, resolution, img_channels):
        super().__init__()
        self.resolution = resolution
        if cin == 0:
            self.const = nn.Parameter(torch.randn(cout, 4, 4))
            self.conv0 = None
        else:
            self.conv0 = SynthesisLayer(cin, cout, w_dim, resolution, up=True)
        self.conv1 = SynthesisLayer(cout, cout, w_dim, resolution)
        self.torgb = ToRGB(cout, w_dim, img_channels)
        self.num_conv = 1 if cin == 0 else 2

    def forward(self, x, img, ws, noise="random"):
        # ws: [N, num_conv + 1, w_dim]; the last one (toRGB's) is the next block's first
        if self.conv0 is None:
            x = self.const.unsqueeze(0).expand(ws.shape[0], -1, -1, -1)
            x = self.conv1(x, ws[:, 0], noise)
        else:
            x = self.conv0(x, ws[:, 0], noise)
            x = self.conv1(x, ws[:, 1], noise)
        y = self.torgb(x, ws[:, self.num_conv])
        img = y if img is None else upsample2d(img) + y
        return x, img


class Mapping(nn.Module):
    def __init__(self, z_dim, c_dim, w_dim, num_layers, lr_mul=0.01, w_avg_beta=0.995):
        super().__init__()
        self.z_dim, self.c_dim, self.w_dim = z_dim, c_dim, w_dim
        self.embed = FullyConnected(c_dim, w_dim) if c_dim > 0 else None
        fan_in = (z_dim if z_dim > 0 else 0) + (w_dim if c_dim > 0 else 0)
        dims = [fan_in] + [w_dim] * num_layers
        self.fcs = nn.ModuleList(FullyConnected(dims[i], dims[i + 1], lr_mul, activation="lrelu")
                                 for i in range(num_layers))
        self.w_avg_beta = w_avg_beta
        if w_avg_beta is not None:
            self.register_buffer("w_avg", torch.zeros(w_dim))

    def forward(self, z, c=None, update_w_avg=True):
        parts = []
        if self.z_dim > 0:
            parts.append(normalize_2nd_moment(z))
        if self.c_dim > 0:
            parts.append(normalize_2nd_moment(self.embed(c)))
        x = torch.cat(parts, dim=1)
        for fc in self.fcs:
            x = fc(x)
        if self.w_avg_beta is not None and self.training and update_w_avg:
            with torch.no_grad():
                self.w_avg.copy_(x.detach().mean(0).lerp(self.w_avg, self.w_avg_beta))
        return x


def channels(res, channel_base, channel_max):
    return min(channel_base // res, channel_max)


class Generator(nn.Module):
    def __init__(self, resolution, z_dim=512, w_dim=512, c_dim=0, img_channels=3, mapping_layers=8,
                 channel_base=32768, channel_max=512):
        super().__init__()
        log2 = int(math.log2(resolution))
        assert 2 ** log2 == resolution and resolution >= 4, resolution
        self.resolutions = [2 ** i for i in range(2, log2 + 1)]
        self.mapping = Mapping(z_dim, c_dim, w_dim, mapping_layers)
        self.blocks = nn.ModuleList()
        for res in self.resolutions:
            cin = 0 if res == 4 else channels(res // 2, channel_base, channel_max)
            self.blocks.append(SynthesisBlock(cin, channels(res, channel_base, channel_max), w_dim, res,
                                              img_channels))
        self.num_ws = sum(b.num_conv for b in self.blocks) + 1

    def synthesis(self, ws, noise="random"):
        x = img = None
        i = 0
        for b in self.blocks:
            x, img = b(x, img, ws[:, i:i + b.num_conv + 1], noise)
            i += b.num_conv
        return img

    def forward(self, z, c=None, truncation=1.0, noise="random"):
        w = self.mapping(z, c)
        if truncation != 1.0:
            w = self.mapping.w_avg.lerp(w, truncation)
        ws = w.unsqueeze(1).expand(-1, self.num_ws, -1)
        return self.synthesis(ws, noise)


class DiscriminatorBlock(nn.Module):
    def __init__(self, first, tmp, cout, img_channels, architecture):
        super().__init__()
        self.fromrgb = Conv2d(img_channels, tmp, 1) if first else None  # 'resnet'/'orig': first block only
        self.conv0 = Conv2d(tmp, tmp, 3)
        self.conv1 = Conv2d(tmp, cout, 3, down=True)
        self.skip = Conv2d(tmp, cout, 1, bias=False, activation="linear", down=True) if architecture == "resnet" \
            else None

    def forward(self, x, img):
        if self.fromrgb is not None:
            x = self.fromrgb(img)
        if self.skip is not None:
            y = self.skip(x, gain=math.sqrt(0.5))
            return y + self.conv1(self.conv0(x), gain=math.sqrt(0.5))
        return self.conv1(self.conv0(x))


def minibatch_std(x, group_size, num_channels=1):
    n, c, h, w = x.shape
    g = min(group_size, n)
    assert n % g == 0, f"batch {n} not divisible by the group {g}"
    # Groups of g consecutive samples, as shardgan's family takes them (the authors' code
    # takes strided groups, whose members change with the batch per GPU).
    y = x.reshape(-1, g, num_channels, c // num_channels, h, w)
    y = y - y.mean(dim=1, keepdim=True)
    y = (y.square().mean(dim=1) + 1e-8).sqrt()
    y = y.mean(dim=[2, 3, 4]).repeat_interleave(g, dim=0)
    y = y.reshape(n, num_channels, 1, 1).expand(n, num_channels, h, w)
    return torch.cat([x, y], dim=1)


class Discriminator(nn.Module):
    def __init__(self, resolution, c_dim=0, img_channels=3, channel_base=32768, channel_max=512, mbstd_group=4,
                 architecture="resnet", cmap_dim=None):
        super().__init__()
        log2 = int(math.log2(resolution))
        self.blocks = nn.ModuleList()
        for i, res in enumerate(2 ** j for j in range(log2, 2, -1)):
            self.blocks.append(DiscriminatorBlock(i == 0, channels(res, channel_base, channel_max),
                                                  channels(res // 2, channel_base, channel_max), img_channels,
                                                  architecture))
        c4 = channels(4, channel_base, channel_max)
        self.cmap_dim = (cmap_dim or c4) if c_dim > 0 else 0
        self.mapping = Mapping(0, c_dim, self.cmap_dim, 8, w_avg_beta=None) if c_dim > 0 else None
        self.mbstd_group = mbstd_group
        self.conv = Conv2d(c4 + 1, c4, 3)
        self.fc = FullyConnected(c4 * 16, c4, activation="lrelu")
        self.out = FullyConnected(c4, self.cmap_dim if c_dim > 0 else 1)

    def forward(self, img, c=None):
        x = None
        for b in self.blocks:
            x = b(x, img)
        x = minibatch_std(x, self.mbstd_group)
        x = self.fc(self.conv(x).flatten(1))
        x = self.out(x)
        if self.mapping is not None:
            cmap = self.mapping(None, c)
            x = (x * cmap).sum(dim=1, keepdim=True) / math.sqrt(self.cmap_dim)
        return x


# The authors' configurations (stylegan2-ada-pytorch train.py): channel_base = fmaps x 32768,
# channel_max 512; paper256: fmaps 0.5, mapping 8, resnet D; cifar: fmaps 1, mapping 2,
# 'orig' D, conditional on 10 classes.
PRESETS = {
    "paper256": dict(g=dict(resolution=256, mapping_layers=8, channel_base=16384),
                     d=dict(resolution=256, channel_base=16384, mbstd_group=8, architecture="resnet")),
    "cifar": dict(g=dict(resolution=32, c_dim=10, mapping_layers=2, channel_base=32768),
                  d=dict(resolution=32, c_dim=10, channel_base=32768, mbstd_group=32, architecture="orig")),
}


def count(module):
    return sum(p.numel() for p in module.parameters())


def main():
    for name, p in PRESETS.items():
        g, d = Generator(**p["g"]), Discriminator(**p["d"])
        print(f"{name}: G {count(g):,} (mapping {count(g.mapping):,}), D {count(d):,}, num_ws {g.num_ws}")


if __name__ == "__main__":
    main()
