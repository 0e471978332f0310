"""PyTorch copies of shardgan's DCGAN, BigGAN and pix2pix, for the peer benchmark.

Each model is a plain nn.Module whose direct children are shardgan's sharding units, with
the same names ("block0", "shared", "attn", "out", ...), so that `named_parameters()` and
`named_buffers()` give exactly the names of a shardgan checkpoint's tensors
(`<model>/params/<unit>.<param>`, `<model>/buffers/<unit>.<buffer>`). The peers shard
per unit (`fully_shard` on every child), as shardgan does.

The layers follow the C++ sources line by line, so that float32 results agree up to the
rounding of a different summation order:
  - src/models/dcgan/dcgan.cpp             DCGAN G and D
  - src/models/biggan/{biggan,layers}.cpp  BigGAN G and D, SN layers, CCBN, attention
  - src/models/pix2pix/pix2pix.cpp         the U-Net G (skips across units, per-sample seeded
                                           dropout) and the PatchGAN D
  - src/nn/sync_batchnorm.cpp              BatchNorm over the global batch
  - include/shardgan/nn/power_iteration.h  the power-iteration pause of D's fake pass
  - src/models/stylegan2/                  StyleGAN2: benchmarks/peers/stylegan2.py's layers in
                                           shardgan's units (stylegan2.build_shardgan)

torch.nn.SyncBatchNorm refuses CPU tensors, so SyncBatchNorm here is a port of shardgan's
autograd function over torch.distributed (gloo): float64 statistics, one all-reduce in
forward and one in backward, the same as the C++ one.
"""
import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

BN_EPS = 1e-5
BN_MOMENTUM = 0.1
SN_EPS = 1e-8

# ---------------------------------------------------------------- power-iteration pause
_pauses = 0


@contextlib.contextmanager
def power_iteration_pause():
    """While alive, spectral-norm layers use their stored u and leave it unchanged
    (shardgan::PowerIterationPause: D's fake pass of a D step)."""
    global _pauses
    _pauses += 1
    try:
        yield
    finally:
        _pauses -= 1


# ---------------------------------------------------------------- SyncBatchNorm
def _all_reduce_sum(t):
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


class _SyncBatchNormFn(torch.autograd.Function):
    """src/nn/sync_batchnorm.cpp, SyncBatchNormFn."""

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum):
        c = x.size(1)
        dims = [0, 2, 3]
        xd = x.to(torch.float64)
        stats = torch.empty(2 * c + 1, dtype=torch.float64, device=x.device)
        stats[:c].copy_(xd.sum(dims))
        stats[c:2 * c].copy_((xd * xd).sum(dims))
        stats[2 * c] = float(x.numel() // c)
        _all_reduce_sum(stats)
        n = stats[2 * c].item()
        mean = stats[:c] / n
        var = (stats[c:2 * c] / n - mean * mean).clamp_min(0.0)
        invstd = (var + eps).rsqrt()
        with torch.no_grad():
            running_mean.mul_(1.0 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
            unbias = n / (n - 1) if n > 1 else 1.0
            running_var.mul_(1.0 - momentum).add_(var.to(running_var.dtype), alpha=momentum * unbias)
        shape = (1, c, 1, 1)
        mean_x = mean.to(x.dtype).view(shape)
        invstd_x = invstd.to(x.dtype).view(shape)
        xhat = (x - mean_x) * invstd_x
        affine = weight is not None
        ctx.save_for_backward(xhat, invstd_x, weight if affine else None)
        ctx.n = n
        ctx.affine = affine
        if not affine:
            return xhat
        return xhat * weight.view(shape) + bias.view(shape)

    @staticmethod
    def backward(ctx, dy):
        xhat, invstd, weight = ctx.saved_tensors
        dy = dy.contiguous()
        n = ctx.n
        c = xhat.size(1)
        dims = [0, 2, 3]
        sum_dy = dy.sum(dims)
        sum_dy_xhat = (dy * xhat).sum(dims)
        red = torch.cat([sum_dy, sum_dy_xhat])
        _all_reduce_sum(red)
        shape = (1, c, 1, 1)
        mean_dy = (red[:c] / n).view(shape)
        mean_dy_xhat = (red[c:] / n).view(shape)
        scale = invstd * weight.view(shape) if ctx.affine else invstd
        dx = (dy - mean_dy - xhat * mean_dy_xhat) * scale
        dweight = sum_dy_xhat if ctx.affine else None
        dbias = sum_dy if ctx.affine else None
        return dx, dweight, dbias, None, None, None, None


def sync_batch_norm(x, weight, bias, running_mean, running_var, training, eps=BN_EPS, momentum=BN_MOMENTUM):
    if not training:
        shape = (1, x.size(1), 1, 1)
        out = (x - running_mean.to(x.dtype).view(shape)) * (running_var.to(x.dtype).view(shape) + eps).rsqrt()
        if weight is not None:
            out = out * weight.view(shape) + bias.view(shape)
        return out
    return _SyncBatchNormFn.apply(x.contiguous(), weight, bias, running_mean, running_var, eps, momentum)


class SyncBatchNorm2d(nn.Module):
    """shardgan::SyncBatchNorm2d: affine, weight 1, bias 0, running statistics."""

    def __init__(self, c, eps=BN_EPS, momentum=BN_MOMENTUM):
        super().__init__()
        self.eps, self.momentum = eps, momentum
        self.weight = nn.Parameter(torch.ones(c))
        self.bias = nn.Parameter(torch.zeros(c))
        self.register_buffer("running_mean", torch.zeros(c))
        self.register_buffer("running_var", torch.ones(c))

    def forward(self, x):
        return sync_batch_norm(x, self.weight, self.bias, self.running_mean, self.running_var,
                               self.training, self.eps, self.momentum)


# ---------------------------------------------------------------- DCGAN
class Unit(nn.Sequential):
    """A sharding unit of the DCGAN: a Sequential, so parameter names are '<i>.weight'."""


def dcgan_generator(z_dim, w, ch):
    g = nn.Module()
    up = lambda i, o, s, p: nn.ConvTranspose2d(i, o, 4, stride=s, padding=p, bias=False)
    g.add_module("block0", Unit(up(z_dim, 4 * w, 1, 0), SyncBatchNorm2d(4 * w), nn.ReLU()))
    g.add_module("block1", Unit(up(4 * w, 2 * w, 2, 1), SyncBatchNorm2d(2 * w), nn.ReLU()))
    g.add_module("block2", Unit(up(2 * w, w, 2, 1), SyncBatchNorm2d(w), nn.ReLU()))
    g.add_module("out", Unit(up(w, ch, 2, 1), nn.Tanh()))
    return DcganProgram(g, ["block0", "block1", "block2", "out"])


def dcgan_discriminator(w, ch):
    d = nn.Module()
    down = lambda i, o, s, p: nn.Conv2d(i, o, 4, stride=s, padding=p, bias=False)
    lrelu = lambda: nn.LeakyReLU(0.2)
    d.add_module("block0", Unit(down(ch, w, 2, 1), lrelu()))
    d.add_module("block1", Unit(down(w, 2 * w, 2, 1), SyncBatchNorm2d(2 * w), lrelu()))
    d.add_module("block2", Unit(down(2 * w, 4 * w, 2, 1), SyncBatchNorm2d(4 * w), lrelu()))
    d.add_module("out", Unit(down(4 * w, 1, 1, 0), nn.Flatten()))
    return DcganProgram(d, ["block0", "block1", "block2", "out"])


class DcganProgram(nn.Module):
    """Runs the units in order; forward(x, y) ignores y (unconditional)."""

    def __init__(self, holder, order):
        super().__init__()
        for name in order:
            self.add_module(name, getattr(holder, name))
        self.order = order

    def units(self):
        return [getattr(self, n) for n in self.order]

    def forward(self, x, y=None):
        for name in self.order:
            x = getattr(self, name)(x)
        return x


# ---------------------------------------------------------------- BigGAN layers
def _normalize_row(x, eps):
    return x / x.norm(2, dim=1, keepdim=True).clamp_min(eps)


class SNBase(nn.Module):
    """Spectral norm as src/models/biggan/layers.cpp spectral_sigma: one power iteration per
    training forward (unless paused), sigma = v W^T u'^T differentiable in W."""

    def sigma(self):
        w = self.weight.reshape(self.weight.size(0), -1)
        u = self.u
        with torch.no_grad():
            wm = w.detach().to(u.dtype)
            v = _normalize_row(u @ wm, SN_EPS)
            u_new = _normalize_row(v @ wm.t(), SN_EPS)
            if self.training and _pauses == 0:
                u.copy_(u_new)
        dt = torch.promote_types(self.weight.dtype, torch.float32)
        wd = w if w.dtype == dt else w.to(dt)
        return ((v.to(dt) @ wd.t()) @ u_new.to(dt).t()).squeeze()


class SNConv2d(SNBase):
    def __init__(self, i, o, k, p, bias=True):
        super().__init__()
        self.padding = p
        self.weight = nn.Parameter(torch.empty(o, i, k, k))
        self.bias = nn.Parameter(torch.empty(o)) if bias else None
        self.register_buffer("u", torch.randn(1, o))

    def forward(self, x):
        y = F.conv2d(x, self.weight, None, 1, self.padding) / self.sigma()
        return y + self.bias.view(1, -1, 1, 1) if self.bias is not None else y


class SNLinear(SNBase):
    def __init__(self, i, o, bias=True):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(o, i))
        self.bias = nn.Parameter(torch.empty(o)) if bias else None
        self.register_buffer("u", torch.randn(1, o))

    def forward(self, x):
        y = F.linear(x, self.weight) / self.sigma()
        return y + self.bias if self.bias is not None else y


class SNEmbedding(SNBase):
    def __init__(self, n, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n, dim))
        self.register_buffer("u", torch.randn(1, n))

    def forward(self, y):
        return F.embedding(y, self.weight) / self.sigma()


class CCBN(nn.Module):
    def __init__(self, c, cond_dim):
        super().__init__()
        self.gain = SNLinear(cond_dim, c, bias=False)
        self.bias = SNLinear(cond_dim, c, bias=False)
        self.register_buffer("running_mean", torch.zeros(c))
        self.register_buffer("running_var", torch.ones(c))

    def forward(self, x, cond):
        b = x.size(0)
        xhat = sync_batch_norm(x, None, None, self.running_mean, self.running_var, self.training)
        g = (self.gain(cond) + 1.0).view(b, -1, 1, 1)
        s = self.bias(cond).view(b, -1, 1, 1)
        return xhat * g + s


class Attention(nn.Module):
    def __init__(self, ch):
        super().__init__()
        self.ch = ch
        self.theta = SNConv2d(ch, ch // 8, 1, 0, False)
        self.phi = SNConv2d(ch, ch // 8, 1, 0, False)
        self.g = SNConv2d(ch, ch // 2, 1, 0, False)
        self.o = SNConv2d(ch // 2, ch, 1, 0, False)
        self.gamma = nn.Parameter(torch.zeros(1))

    def forward(self, x):
        b, _, h, w = x.shape
        hw, ch = h * w, self.ch
        th = self.theta(x).view(b, ch // 8, hw)
        ph = F.max_pool2d(self.phi(x), [2, 2]).view(b, ch // 8, hw // 4)
        gg = F.max_pool2d(self.g(x), [2, 2]).view(b, ch // 2, hw // 4)
        beta = torch.softmax(torch.bmm(th.transpose(1, 2), ph), -1)
        out = self.o(torch.bmm(gg, beta.transpose(1, 2)).view(b, ch // 2, h, w))
        return x + self.gamma * out


def _up2(x):
    return F.interpolate(x, size=(2 * x.size(2), 2 * x.size(3)), mode="nearest")


class GBlock(nn.Module):
    def __init__(self, i, o, cond_dim, upsample):
        super().__init__()
        self.upsample = upsample
        self.conv1 = SNConv2d(i, o, 3, 1)
        self.conv2 = SNConv2d(o, o, 3, 1)
        self.conv_sc = SNConv2d(i, o, 1, 0) if (i != o or upsample) else None
        self.bn1 = CCBN(i, cond_dim)
        self.bn2 = CCBN(o, cond_dim)

    def forward(self, x, cond):
        h = F.relu(self.bn1(x, cond))
        if self.upsample:
            h, x = _up2(h), _up2(x)
        h = self.conv1(h)
        h = self.conv2(F.relu(self.bn2(h, cond)))
        if self.conv_sc is not None:
            x = self.conv_sc(x)
        return h + x


class DBlock(nn.Module):
    def __init__(self, i, o, preactivation, downsample):
        super().__init__()
        self.pre, self.down = preactivation, downsample
        self.conv1 = SNConv2d(i, o, 3, 1)
        self.conv2 = SNConv2d(o, o, 3, 1)
        self.conv_sc = SNConv2d(i, o, 1, 0) if (i != o or downsample) else None

    def forward(self, x):
        h = F.relu(x) if self.pre else x
        h = self.conv2(F.relu(self.conv1(h)))
        if self.down:
            h = F.avg_pool2d(h, [2, 2])
        sc = x
        if self.pre:
            if self.conv_sc is not None:
                sc = self.conv_sc(sc)
            if self.down:
                sc = F.avg_pool2d(sc, [2, 2])
        else:
            if self.down:
                sc = F.avg_pool2d(sc, [2, 2])
            if self.conv_sc is not None:
                sc = self.conv_sc(sc)
        return h + sc


class GOut(nn.Module):
    def __init__(self, ch, channels):
        super().__init__()
        self.bn = SyncBatchNorm2d(ch)
        self.conv = SNConv2d(ch, channels, 3, 1)

    def forward(self, x):
        return torch.tanh(self.conv(F.relu(self.bn(x))))


class DOut(nn.Module):
    def __init__(self, ch, n_classes):
        super().__init__()
        self.linear = SNLinear(ch, 1)
        self.embed = SNEmbedding(n_classes, ch)

    def forward(self, x, y):
        h = F.relu(x).sum([2, 3])
        out = self.linear(h).squeeze(1)
        return out + (self.embed(y) * h).sum(1)


class LinearUnit(SNLinear):
    """G's "linear" unit: an SNLinear chunk -> C0*16 (checkpoint names "linear.weight",
    "linear.bias", "linear.u") whose output is viewed as [B, C0, 4, 4]."""

    def __init__(self, chunk, c0):
        super().__init__(chunk, c0 * 16)
        self.c0 = c0

    def forward(self, z):
        h = super().forward(z)
        return h.view(h.size(0), self.c0, 4, 4)


class BigGanG(nn.Module):
    """src/models/biggan/biggan.cpp BigGanFamily::generator."""

    def __init__(self, c):
        super().__init__()
        L = len(c["g_ch_mult"])
        self.chunk = c["z_dim"] // L
        cond_dim = c["shared_dim"] + self.chunk
        self.add_module("shared", SNEmbedding(c["n_classes"], c["shared_dim"]))
        c0 = c["ch"] * c["g_ch_mult"][0]
        self.add_module("linear", LinearUnit(self.chunk, c0))
        self.steps, self.order = [], ["shared", "linear"]
        n = 0
        for r in range(L - 1):
            out = c["ch"] * c["g_ch_mult"][r + 1]
            for j in range(c["g_blocks_per_res"] + 1):
                i = c["ch"] * c["g_ch_mult"][r] if j == 0 else out
                name = f"block{n}"
                n += 1
                self.add_module(name, GBlock(i, out, cond_dim, j == 0))
                self.steps.append((name, r + 1))
            if c["g_attn"] == (4 << (r + 1)):
                self.add_module("attn", Attention(out))
                self.steps.append(("attn", -1))
        self.add_module("out", GOut(c["ch"] * c["g_ch_mult"][-1], c["channels"]))
        self.order += [s for s, _ in self.steps] + ["out"]

    def units(self):
        return [getattr(self, n) for n in self.order]

    def forward(self, z, y):
        shared = self.shared(y)
        zs = z.split(self.chunk, 1)
        h = self.linear(zs[0])
        conds = {}
        for name, k in self.steps:
            if k < 0:
                h = getattr(self, name)(h)
                continue
            if k not in conds:
                conds[k] = torch.cat([shared, zs[k].to(shared.dtype)], 1)
            h = getattr(self, name)(h, conds[k])
        return self.out(h)


class BigGanD(nn.Module):
    """src/models/biggan/biggan.cpp BigGanFamily::discriminator."""

    def __init__(self, c):
        super().__init__()
        L = len(c["g_ch_mult"])
        res = 4 << (L - 1)
        self.order = []
        n, i, attn_placed = 0, c["channels"], False
        for k in range(L):
            out = c["d_ch"] * c["d_ch_mult"][k]
            down_group = k + 1 < L
            out_res = (res >> (k + 1)) if down_group else 4
            for j in range(c["d_blocks_per_res"] + 1):
                name = f"block{n}"
                self.add_module(name, DBlock(i if j == 0 else out, out, n > 0, down_group and j == 0))
                n += 1
                self.order.append(name)
            i = out
            if not attn_placed and c["d_attn"] == out_res:
                attn_placed = True
                self.add_module("attn", Attention(out))
                self.order.append("attn")
        self.add_module("out", DOut(i, c["n_classes"]))

    def units(self):
        return [getattr(self, n) for n in self.order + ["out"]]

    def forward(self, x, y):
        h = x
        for name in self.order:
            h = getattr(self, name)(h)
        return self.out(h, y)


# ---------------------------------------------------------------- pix2pix
_M64 = (1 << 64) - 1


def _mix64(x):
    """src/models/pix2pix/pix2pix.cpp mix64 (splitmix64's finalizer), on unsigned 64 bits."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def seeded_dropout(h, seeds, salt, p):
    """pix2pix.cpp seeded_dropout: sample b's mask from a generator seeded with
    mix64(seeds[b] ^ mix64(salt)), bernoulli(1 - p) in float32, scaled by 1 / (1 - p)."""
    mask = torch.empty(h.shape, dtype=torch.float32)
    for b, s in enumerate(seeds.cpu().tolist()):
        g = torch.Generator().manual_seed(_mix64((s & _M64) ^ _mix64(salt)))
        mask[b].bernoulli_(1.0 - p, generator=g)
    return h * mask.to(h.device, h.dtype) * (1.0 / (1.0 - p))


class Pix2PixG(nn.Module):
    """src/models/pix2pix/pix2pix.cpp generator_spec: units enc0..enc(L-1), dec(L-1)..dec0."""

    def __init__(self, size, w, cin, cout, dropout, dropout_blocks):
        super().__init__()
        L = size.bit_length() - 1
        ew = lambda i: w * min(1 << i, 8)
        conv = lambda i, o: nn.Conv2d(i, o, 4, stride=2, padding=1, bias=False)
        for i in range(L):
            mods = ([] if i == 0 else [nn.LeakyReLU(0.2)]) + [conv(cin if i == 0 else ew(i - 1), ew(i))]
            if 0 < i < L - 1:
                mods.append(SyncBatchNorm2d(ew(i)))
            self.add_module(f"enc{i}", Unit(*mods))
        self.drop = {}
        for i in range(L - 1, -1, -1):
            cin_d = ew(i) if i == L - 1 else 2 * ew(i)
            cout_d = cout if i == 0 else ew(i - 1)
            up = nn.ConvTranspose2d(cin_d, cout_d, 4, stride=2, padding=1, bias=i == 0)
            self.add_module(f"dec{i}", Unit(nn.ReLU(), up, nn.Tanh() if i == 0 else SyncBatchNorm2d(cout_d)))
            self.drop[i] = dropout if (L - 1 - i) < dropout_blocks and i > 0 else 0.0
        self.L = L

    def units(self):
        return [getattr(self, f"enc{i}") for i in range(self.L)] + \
               [getattr(self, f"dec{i}") for i in range(self.L - 1, -1, -1)]

    def forward(self, z, a):
        e, h = [], a
        for i in range(self.L):
            h = getattr(self, f"enc{i}")(h)
            e.append(h)
        u = None
        for i in range(self.L - 1, -1, -1):
            x = e[i] if u is None else torch.cat([e[i], u], 1)
            u = getattr(self, f"dec{i}")(x)
            if self.drop[i] > 0:
                u = seeded_dropout(u, z, i, self.drop[i])
        return u


class Pix2PixD(nn.Module):
    """pix2pix.cpp discriminator_spec: the PatchGAN on cat(A, x), units block0..block<n>, out."""

    def __init__(self, w, layers, cin, cx):
        super().__init__()
        self.add_module("block0", Unit(nn.Conv2d(cin + cx, w, 4, stride=2, padding=1, bias=True), nn.LeakyReLU(0.2)))
        width = w
        for k in range(1, layers + 1):
            out = w * min(1 << k, 8)
            self.add_module(f"block{k}", Unit(nn.Conv2d(width, out, 4, stride=2 if k < layers else 1, padding=1,
                                                        bias=False), SyncBatchNorm2d(out), nn.LeakyReLU(0.2)))
            width = out
        self.add_module("out", Unit(nn.Conv2d(width, 1, 4, stride=1, padding=1, bias=True)))
        self.n = layers

    def units(self):
        return [getattr(self, f"block{k}") for k in range(self.n + 1)] + [self.out]

    def forward(self, x, a):
        h = torch.cat([a.to(x.dtype), x], 1)
        for k in range(self.n + 1):
            h = getattr(self, f"block{k}")(h)
        return self.out(h)


def build(cfg):
    """(G, D) for a shardgan config dict (flat keys, as the checkpoint's `config` attribute)."""
    arch = cfg.get("model.arch", "dcgan")
    if arch == "dcgan":
        z, ch = int(cfg["model.z_dim"]), int(cfg["model.channels"])
        return (dcgan_generator(z, int(cfg["model.g_width"]), ch),
                dcgan_discriminator(int(cfg["model.d_width"]), ch))
    if arch == "biggan":
        c = {k: cfg["model." + k] for k in ("ch", "d_ch", "g_ch_mult", "d_ch_mult", "g_blocks_per_res",
                                           "d_blocks_per_res", "g_attn", "d_attn", "z_dim", "shared_dim",
                                           "n_classes", "channels")}
        return BigGanG(c), BigGanD(c)
    if arch == "pix2pix":
        m = lambda k: int(cfg["model." + k])
        return (Pix2PixG(m("image_size"), m("g_width"), m("in_channels"), m("channels"), float(cfg["model.dropout"]),
                         m("dropout_blocks")),
                Pix2PixD(m("d_width"), m("d_layers"), m("in_channels"), m("channels")))
    if arch == "stylegan2":  # benchmarks/peers/stylegan2.py in shardgan's unit layout
        import stylegan2
        return stylegan2.build_shardgan(cfg)
    raise ValueError(f"model.arch {arch}: only dcgan, biggan, pix2pix and stylegan2")
