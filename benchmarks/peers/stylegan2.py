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
        # sum_{i,k,l} (w[o,i,k,l] s[n,i])^2 = sum_i s[n,i]^2 sum_{k,l} w[o,i,k,l]^2: the same sum in
        # the order shardgan's src/models/stylegan2/layers.cpp takes it (no [N, O, I, k, k] tensor)
        d = (styles.square().matmul(weight.square().sum(dim=[2, 3]).t()) + 1e-8).rsqrt()
        x = x * d.reshape(n, o, 1, 1)
    return x


class SynthesisLayer(nn.Module):
    """noise_strength_shape (): the authors' 0-dim strength (shardgan's parameter too); (1,): the
    same value as a 1-element vector, which broadcasts identically (FSDP2's fully_shard refuses
    0-dim parameters; shardgan's checkpoints store it as [1]). const_noise: a noise_const buffer
    (shardgan has none)."""

    def __init__(self, cin, cout, w_dim, resolution, up=False, noise_strength_shape=(), const_noise=True):
        super().__init__()
        self.affine = FullyConnected(w_dim, cin, bias_init=1.0)
        self.weight = nn.Parameter(torch.randn(cout, cin, 3, 3))
        self.noise_strength = nn.Parameter(torch.zeros(list(noise_strength_shape)))
        self.bias = nn.Parameter(torch.zeros(cout))
        if const_noise:
            self.register_buffer("noise_const", torch.randn(resolution, resolution))
        self.weight_gain = 1.0 / math.sqrt(cin * 9)
        self.up, self.resolution = up, resolution

    def forward(self, x, w, noise="random"):
        """noise: "random", "const", None (none) or a tensor [N, 1, R, R] (given noise images)."""
        styles = self.affine(w)
        x = modulated_conv2d(x, self.weight * self.weight_gain, styles, demodulate=True, up=self.up)
        if isinstance(noise, torch.Tensor):
            x = x + noise * self.noise_strength
        elif noise == "random":
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

    def __init__(self, cin, cout, w_dim, resolution, img_channels, **layer_kw):
        super().__init__()
        self.resolution = resolution
        if cin == 0:
            self.const = nn.Parameter(torch.randn(cout, 4, 4))
            self.conv0 = None
        else:
            self.conv0 = SynthesisLayer(cin, cout, w_dim, resolution, up=True, **layer_kw)
        self.conv1 = SynthesisLayer(cout, cout, w_dim, resolution, **layer_kw)
        self.torgb = ToRGB(cout, w_dim, img_channels)
        self.num_conv = 1 if cin == 0 else 2

    def forward(self, x, img, ws, noise="random"):
        # ws: [N, num_conv + 1, w_dim]; the last one (toRGB's) is the next block's first.
        # noise: a mode for every layer, or a list of num_conv noise tensors (one per conv).
        n0, n1 = (noise[0], noise[-1]) if isinstance(noise, (list, tuple)) else (noise, noise)
        if self.conv0 is None:
            x = self.const.unsqueeze(0).expand(ws.shape[0], -1, -1, -1)
            x = self.conv1(x, ws[:, 0], n0)
        else:
            x = self.conv0(x, ws[:, 0], n0)
            x = self.conv1(x, ws[:, 1], n1)
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
        # True: w_avg takes the mean over the global batch (shardgan's MappingNetwork: float64
        # sums and count all-reduced over torch.distributed), not this process's mean
        self.w_avg_global = False
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
                if self.w_avg_global:
                    stats = torch.cat([x.detach().to(torch.float64).sum(0),
                                       torch.full([1], float(x.shape[0]), dtype=torch.float64, device=x.device)])
                    import torch.distributed as dist
                    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
                        dist.all_reduce(stats, op=dist.ReduceOp.SUM)
                    mean = (stats[:-1] / stats[-1]).to(self.w_avg.dtype)
                    self.w_avg.copy_(mean.lerp(self.w_avg, self.w_avg_beta))
                else:
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


# ---- shardgan's layout (src/models/stylegan2/stylegan2.cpp), for the peer benchmark ------------
# The same layers as above, as shardgan's units: G "mapping", "b4", ..., "b<R>"; D "b<R>", ...,
# "b8", "mapping" (conditional), "b4" (the epilogue), so that the checkpoint's names are the
# module names. Noise comes from the latents' per-sample seeds, bit for bit as shardgan's.

_MASK64 = (1 << 64) - 1
SEED_LIMIT = 1 << 24  # noise seeds are integers in [0, 2^24) (exact in float32)


def splitmix64(x):
    """include/shardgan/util/splitmix64.h, on Python ints modulo 2^64."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def noise_seed(sample_seed, layer):
    """src/models/stylegan2/layers.cpp noise_seed: splitmix64(splitmix64(seed) ^ layer)."""
    return splitmix64(splitmix64(sample_seed & _MASK64) ^ (layer & _MASK64))


def draw_noise(seeds, layer, resolution, dtype, device=None):
    """layers.cpp draw_noise: sample i gets randn([R, R]) in float64 from a fresh CPU generator
    seeded with noise_seed(seeds[i], layer) (mt19937, as at::make_generator<CPUGeneratorImpl>),
    then the whole [N, 1, R, R] is cast to `dtype`."""
    s = seeds.to("cpu", torch.int64).tolist()
    out = torch.empty(len(s), 1, resolution, resolution, dtype=torch.float64)
    for i, v in enumerate(s):
        g = torch.Generator().manual_seed(noise_seed(v, layer))
        out[i, 0].copy_(torch.randn((resolution, resolution), generator=g, dtype=torch.float64))
    return out.to(device=device, dtype=dtype)


class ShardganGenerator(nn.Module):
    """shardgan's StyleGAN2 G program (generator_spec): forward(z [B, 2 z_dim + 3], y int64 [B])
    -> (images [B, C, R, R], ws [B, num_ws, w_dim]). z's columns: main latent, mixing latent,
    cutoff, noise seed, psi (stylegan2.h). Style mixing (a cutoff < num_ws) and truncation
    (psi != 1) are refused: the peer benchmark runs the cifar preset, which has neither."""

    def __init__(self, resolution, z_dim, w_dim, c_dim, img_channels, mapping_layers, channel_base, channel_max,
                 mapping_lr_mult=0.01, w_avg_beta=0.995):
        super().__init__()
        self.z_dim, self.c_dim, self.resolution = z_dim, c_dim, resolution
        self.mapping = Mapping(z_dim, c_dim, w_dim, mapping_layers, lr_mul=mapping_lr_mult,
                               w_avg_beta=w_avg_beta if w_avg_beta > 0 else None)
        self.mapping.w_avg_global = True
        self.order, self.steps = ["mapping"], []
        w_index = 0
        res = 4
        while res <= resolution:
            cin = 0 if res == 4 else channels(res // 2, channel_base, channel_max)
            name = f"b{res}"
            self.add_module(name, SynthesisBlock(cin, channels(res, channel_base, channel_max), w_dim, res,
                                                 img_channels, noise_strength_shape=(1,), const_noise=False))
            nc = 1 if res == 4 else 2
            self.order.append(name)
            self.steps.append((name, w_index, nc, res))
            w_index += nc
            res *= 2
        self.num_ws = w_index + 1

    def units(self):
        return [getattr(self, n) for n in self.order]

    def forward(self, z, y=None):
        zd = self.z_dim
        ctrl = z[:, 2 * zd:2 * zd + 3].detach().to(torch.float64)
        if bool((ctrl[:, 0] != self.num_ws).any()) or bool((ctrl[:, 2] != 1).any()):
            raise ValueError("ShardganGenerator: style mixing and truncation are not matched")
        seeds = ctrl[:, 1].to(torch.int64)
        c = F.one_hot(y.to(torch.int64), self.c_dim).to(z.dtype) if self.c_dim > 0 else None
        w = self.mapping(z[:, :zd], c)
        ws = w.unsqueeze(1).expand(-1, self.num_ws, -1)
        x = img = None
        for name, wi, nc, res in self.steps:
            noise = [draw_noise(seeds, wi + j, res, ws.dtype, ws.device) for j in range(nc)]
            x, img = getattr(self, name)(x, img, ws[:, wi:wi + nc + 1], noise)
        return img, ws


class DiscriminatorEpilogue(nn.Module):
    """D's 4x4 epilogue as shardgan's unit "b4": minibatch stddev, conv, fc, out, projection."""

    def __init__(self, c4, cmap_dim, mbstd_group, mbstd_channels=1):
        super().__init__()
        self.conv = Conv2d(c4 + mbstd_channels, c4, 3)
        self.fc = FullyConnected(c4 * 16, c4, activation="lrelu")
        self.out = FullyConnected(c4, cmap_dim if cmap_dim > 0 else 1)
        self.cmap_dim, self.mbstd_group, self.mbstd_channels = cmap_dim, mbstd_group, mbstd_channels

    def forward(self, x, cmap=None):
        h = minibatch_std(x, self.mbstd_group, self.mbstd_channels)
        h = self.out(self.fc(self.conv(h).flatten(1)))
        if self.cmap_dim > 0:
            h = (h * cmap).sum(dim=1, keepdim=True) / math.sqrt(self.cmap_dim)
        return h.squeeze(1)


class ShardganDiscriminator(nn.Module):
    """shardgan's StyleGAN2 D program (discriminator_spec): forward(x, y) -> logits [B]."""

    def __init__(self, resolution, c_dim, img_channels, channel_base, channel_max, mbstd_group, architecture,
                 mapping_lr_mult=0.01, d_mapping_layers=8, mbstd_channels=1):
        super().__init__()
        self.c_dim, self.order = c_dim, []
        res = resolution
        while res >= 8:
            name = f"b{res}"
            self.add_module(name, DiscriminatorBlock(res == resolution, channels(res, channel_base, channel_max),
                                                     channels(res // 2, channel_base, channel_max), img_channels,
                                                     architecture))
            self.order.append(name)
            res //= 2
        self.blocks_order = list(self.order)
        c4 = channels(4, channel_base, channel_max)
        cmap_dim = c4 if c_dim > 0 else 0
        if c_dim > 0:
            self.mapping = Mapping(0, c_dim, cmap_dim, d_mapping_layers, lr_mul=mapping_lr_mult, w_avg_beta=None)
            self.order.append("mapping")
        self.b4 = DiscriminatorEpilogue(c4, cmap_dim, mbstd_group, mbstd_channels)
        self.order.append("b4")

    def units(self):
        return [getattr(self, n) for n in self.order]

    def forward(self, x, y=None):
        h = x
        for name in self.blocks_order:
            h = getattr(self, name)(None, h) if name == self.blocks_order[0] else getattr(self, name)(h, None)
        cmap = None
        if self.c_dim > 0:
            cmap = self.mapping(None, F.one_hot(y.to(torch.int64), self.c_dim).to(h.dtype))
        return self.b4(h, cmap)


def build_shardgan(cfg):
    """(G, D) in shardgan's layout for a shardgan config (flat keys, as a checkpoint's resolved
    `config`): model.{image_size, channels, z_dim, w_dim, n_classes, channel_base, channel_max,
    mapping_layers, d_arch, mbstd_group}; the fixed fields (mapping lr multiplier 0.01, w_avg
    beta 0.995, D's label mapping depth 8, one mbstd channel) are StyleGan2Config's."""
    m = lambda k: int(cfg["model." + k])
    if float(cfg.get("model.style_mixing", 0)) != 0:
        raise SystemExit("stylegan2: only model.style_mixing 0 is matched (the cifar preset)")
    g = ShardganGenerator(m("image_size"), m("z_dim"), m("w_dim"), m("n_classes"), m("channels"),
                          m("mapping_layers"), m("channel_base"), m("channel_max"))
    d = ShardganDiscriminator(m("image_size"), m("n_classes"), m("channels"), m("channel_base"), m("channel_max"),
                              m("mbstd_group"), cfg["model.d_arch"])
    return g, d


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
