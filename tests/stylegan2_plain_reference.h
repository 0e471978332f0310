#pragma once
// An independent, plain-LibTorch (autograd only) StyleGAN2 G and D for parity tests of the
// stylegan2 family (include/shardgan/models/stylegan2.h). It shares no code with the family:
// every formula is written again here from torch ops, on a map of parameters named as
// ShardedModel::gather_full_parameters() names them ("<unit>.<param path>"). Where a second,
// equal formulation exists it is used on purpose, so that a parity test checks the math,
// not a copy of it:
//  - modulated convolution: the fused form (per-sample modulated and demodulated weights,
//    one grouped convolution) instead of the family's scale-conv-scale form;
//  - the transposed stride-2 convolution of an upsampling layer: zeros inserted, padded,
//    and a convolution with the spatially flipped kernel;
//  - image upsampling (zeros inserted, filter x4): one grouped conv_transpose2d of stride 2,
//    padding 1 with the [1, 3, 3, 1] filter x4;
//  - the label embedding: the embedding weight's column of the label instead of a one-hot
//    product (both exact).
// Every op is differentiable twice (R1 and path-length regularization). float32 and float64.
//
// Semantics mirrored from the family (stylegan2.h, src/models/stylegan2/):
//  - equalized learning rate: FC weight x lr_mul / sqrt(in), bias x lr_mul; conv weight x
//    1 / sqrt(in k k); lrelu = leaky_relu(0.2) x sqrt(2);
//  - G latents z [B, 2 z_dim + 3]: main latent, mixing latent, cutoff, noise seed, psi. ws[:, l]
//    comes from the mixing latent's w for l >= cutoff; the mixing mapping runs only when
//    some row has cutoff < num_ws (as the family's program);
//  - noise of the conv taking ws[:, l] (the noise layer l = the block's first ws index + j):
//    per sample, randn([r, r]) in float64 from a fresh CPU generator seeded with
//    splitmix64(splitmix64(seed) ^ l), cast to the compute dtype; always added (x strength);
//  - w_avg (the only buffer of the family that matters; there are no noise_const or filter
//    buffers): lerp(mean over the batch of the main latents' w (in float64), w_avg, beta),
//    updated in place right after the main mapping, under no_grad; a row with psi != 1 then
//    takes w_avg + psi (w - w_avg) for both of its ws (needs w_avg);
//  - D: mbstd over the whole given batch, groups of min(mbstd_group, B) consecutive samples
//    (sample j in group j / group); conditional D projects onto its own label mapping network
//    (d_mapping_layers, no w_avg), divided by sqrt(cmap_dim), cmap_dim = channels(4).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

namespace sg2_plain {

/// Mirrors the fields of the family's StyleGan2Config that shape the networks.
struct Shape {
  int64_t resolution = 32, channels = 3, z_dim = 512, w_dim = 512, num_classes = 0;
  int64_t channel_base = 32768, channel_max = 512, mapping_layers = 8, mbstd_group = 4, mbstd_channels = 1;
  int64_t d_mapping_layers = 8;
  double mapping_lr_mult = 0.01, w_avg_beta = 0.995;
  std::string d_arch = "resnet";
};

/// Keys exactly as ShardedModel::gather_full_parameters() names them.
using Params = std::map<std::string, at::Tensor>;

struct GOut {
  at::Tensor images, ws;
};

/// channels(r) = min(channel_base / r, channel_max).
inline int64_t channels_at(const Shape& s, int64_t res) { return std::min(s.channel_base / res, s.channel_max); }

/// log2 of a power of two.
inline int64_t log2_exact(int64_t v) {
  int64_t l = 0;
  while ((int64_t{1} << (l + 1)) <= v) ++l;
  if ((int64_t{1} << l) != v) throw std::invalid_argument("sg2_plain: " + std::to_string(v) + " is not a power of two");
  return l;
}

/// 2 log2(R) - 2.
inline int64_t num_ws(const Shape& s) { return 2 * log2_exact(s.resolution) - 2; }

/// Params from a gather_full_parameters()-style list: each tensor cloned (detached), and
/// with requires_grad when asked.
inline Params to_params(const std::vector<std::pair<std::string, at::Tensor>>& named, bool requires_grad = false) {
  Params p;
  for (const auto& kv : named) {
    at::Tensor t = kv.second.detach().clone();
    if (requires_grad) t.requires_grad_(true);
    p.emplace(kv.first, t);
  }
  return p;
}

inline const at::Tensor& param(const Params& p, const std::string& name) {
  const auto it = p.find(name);
  if (it == p.end()) throw std::out_of_range("sg2_plain: no parameter '" + name + "'");
  return it->second;
}

// ---------------------------------------------------------------------------------------------
// Primitives

inline at::Tensor lrelu(const at::Tensor& x) { return at::leaky_relu(x, 0.2) * std::sqrt(2.0); }

/// x * rsqrt(mean(x^2 over dim 1) + 1e-8).
inline at::Tensor normalize_2nd_moment(const at::Tensor& x) {
  return x * (x.square().mean(1, /*keepdim=*/true) + 1e-8).rsqrt();
}

/// Equalized-lr fully connected layer "<name>.weight" [out, in], "<name>.bias" [out].
inline at::Tensor fully_connected(const Params& p, const std::string& name, const at::Tensor& x, double lr_mul,
                                  bool act) {
  const at::Tensor& w = param(p, name + ".weight");
  const at::Tensor& b = param(p, name + ".bias");
  const double gain = lr_mul / std::sqrt(static_cast<double>(w.size(1)));
  at::Tensor y = x.matmul((w * gain).t()) + b * lr_mul;
  return act ? lrelu(y) : y;
}

/// outer([1, 3, 3, 1], [1, 3, 3, 1]) / 64 in x's dtype and device.
inline at::Tensor fir4(const at::Tensor& like) {
  at::Tensor f = torch::tensor({1.0, 3.0, 3.0, 1.0}, torch::TensorOptions().dtype(at::kDouble));
  f = at::outer(f, f);
  f = f / f.sum();
  return f.to(like.device(), like.scalar_type());
}

/// Depthwise 4x4 filtering by fir4 * gain after zero padding (lo before, hi after) of both
/// spatial axes.
inline at::Tensor blur(const at::Tensor& x, int64_t lo, int64_t hi, double gain) {
  const int64_t c = x.size(1);
  const at::Tensor f = (fir4(x) * gain).expand({c, 1, 4, 4}).contiguous();
  const at::Tensor padded = at::constant_pad_nd(x, {lo, hi, lo, hi}, 0);
  const std::vector<int64_t> one{1, 1}, none{0, 0};
  return at::conv2d(padded, f, {}, one, none, one, c);
}

/// [N, C, H, W] -> [N, C, 2H, 2W] with x at the even positions, zeros elsewhere.
inline at::Tensor zero_insert(const at::Tensor& x) {
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  const at::Tensor cols = at::stack({x, at::zeros_like(x)}, -1).reshape({n, c, h, 2 * w});
  return at::stack({cols, at::zeros_like(cols)}, 3).reshape({n, c, 2 * h, 2 * w});
}

/// Image upsampling x2 (zeros inserted, then the filter x4 padded 2 before and 1 after), as
/// one grouped transposed convolution.
inline at::Tensor upsample_image(const at::Tensor& x) {
  const int64_t c = x.size(1);
  const at::Tensor f = (fir4(x) * 4.0).expand({c, 1, 4, 4}).contiguous();
  const std::vector<int64_t> two{2, 2}, one{1, 1}, none{0, 0};
  return at::conv_transpose2d(x, f, {}, two, one, none, c, one);
}

/// Modulated convolution, fused: per-sample weights weight[o, i] * styles[n, i],
/// demodulated by rsqrt(sum_{i,k,l} w'^2 + 1e-8) when asked, one grouped convolution over
/// the batch. up: the stride-2 transposed convolution (zeros inserted, padding k - 1 before
/// and k - 2 after, flipped kernel: [N, O, 2H + 1, 2W + 1]) then blur(1, 1, gain 4).
inline at::Tensor modulated_conv(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& styles,
                                 bool demodulate, bool up) {
  const int64_t n = x.size(0), i = x.size(1), h = x.size(2), w = x.size(3);
  const int64_t o = weight.size(0), k = weight.size(2);
  TORCH_CHECK(weight.size(1) == i, "sg2_plain: modulated conv: ", i, " input channels, weight ", weight.sizes());
  at::Tensor wm = weight.unsqueeze(0) * styles.reshape({n, 1, i, 1, 1});  // [N, O, I, k, k]
  if (demodulate) {
    const at::Tensor d = (wm.square().sum({2, 3, 4}) + 1e-8).rsqrt();  // [N, O]
    wm = wm * d.reshape({n, o, 1, 1, 1});
  }
  wm = wm.reshape({n * o, i, k, k});
  if (up) {
    const at::Tensor u = at::constant_pad_nd(zero_insert(x), {k - 1, k - 2, k - 1, k - 2}, 0);
    const std::vector<int64_t> one{1, 1}, none{0, 0};
    at::Tensor y = at::conv2d(u.reshape({1, n * i, u.size(2), u.size(3)}), wm.flip({2, 3}), {}, one, none, one, n);
    y = y.reshape({n, o, y.size(2), y.size(3)});
    return blur(y, 1, 1, 4.0);
  }
  const std::vector<int64_t> one{1, 1}, pad{k / 2, k / 2};
  const at::Tensor y = at::conv2d(x.reshape({1, n * i, h, w}), wm, {}, one, pad, one, n);
  return y.reshape({n, o, h, w});
}

/// splitmix64's finalizer.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

/// The generator seed of noise layer `layer` of a sample whose noise seed is `sample_seed`.
inline uint64_t noise_seed(int64_t sample_seed, int64_t layer) {
  return splitmix64(splitmix64(static_cast<uint64_t>(sample_seed)) ^ static_cast<uint64_t>(layer));
}

/// [N, 1, res, res] noise of layer `layer`, like `like` (dtype, device): sample n gets
/// randn([res, res]) (float64) from a CPU generator seeded with noise_seed(seeds[n], layer).
inline at::Tensor draw_noise(const at::Tensor& seeds, int64_t layer, int64_t res, const at::Tensor& like) {
  const at::Tensor s = seeds.to(at::kCPU, at::kLong).contiguous();
  const int64_t* sp = s.data_ptr<int64_t>();
  std::vector<at::Tensor> rows;
  for (int64_t n = 0; n < s.numel(); ++n) {
    at::Generator gen = at::detail::createCPUGenerator(noise_seed(sp[n], layer));
    rows.push_back(at::randn({res, res}, gen, torch::TensorOptions().dtype(at::kDouble)));
  }
  return at::stack(rows).unsqueeze(1).to(like.device(), like.scalar_type());
}

/// Mapping network "<pre>embed.*" (classes > 0), "<pre>fcs.<l>.*": concat(norm(z), norm(
/// embed(y))) through `layers` lrelu FC layers with lr multiplier `lr_mul`. z undefined
/// for D's label mapping.
inline at::Tensor mapping(const Params& p, const std::string& pre, const at::Tensor& z, const at::Tensor& y,
                          int64_t classes, int64_t layers, double lr_mul) {
  std::vector<at::Tensor> parts;
  if (z.defined()) parts.push_back(normalize_2nd_moment(z));
  if (classes > 0) {
    TORCH_CHECK(y.defined(), "sg2_plain: a conditional mapping needs labels");
    const at::Tensor& w = param(p, pre + "embed.weight");  // [w_dim, classes]
    const at::Tensor& b = param(p, pre + "embed.bias");
    const double gain = 1.0 / std::sqrt(static_cast<double>(w.size(1)));
    const at::Tensor e = w.index_select(1, y.to(w.device(), at::kLong)).t() * gain + b;
    parts.push_back(normalize_2nd_moment(e));
  }
  TORCH_CHECK(!parts.empty(), "sg2_plain: mapping without inputs");
  at::Tensor x = parts.size() == 1 ? parts[0] : at::cat(parts, 1);
  for (int64_t l = 0; l < layers; ++l) x = fully_connected(p, pre + "fcs." + std::to_string(l), x, lr_mul, true);
  return x;
}

// ---------------------------------------------------------------------------------------------
// G

/// One modulated 3x3 conv of G: "<name>.{weight, noise_strength, bias, affine.*}".
inline at::Tensor synthesis_layer(const Params& p, const std::string& name, const at::Tensor& x, const at::Tensor& w,
                                  const at::Tensor& noise, bool up) {
  const at::Tensor styles = fully_connected(p, name + ".affine", w, 1.0, false);
  const at::Tensor& weight = param(p, name + ".weight");
  const double gain = 1.0 / std::sqrt(static_cast<double>(weight.size(1) * 9));
  at::Tensor y = modulated_conv(x, weight * gain, styles, /*demodulate=*/true, up);
  y = y + noise * param(p, name + ".noise_strength");
  y = y + param(p, name + ".bias").reshape({1, -1, 1, 1});
  return lrelu(y);
}

/// G's toRGB "<name>.{weight, bias, affine.*}": styles / sqrt(in), not demodulated, linear.
inline at::Tensor to_rgb(const Params& p, const std::string& name, const at::Tensor& x, const at::Tensor& w) {
  const at::Tensor& weight = param(p, name + ".weight");
  const at::Tensor styles =
      fully_connected(p, name + ".affine", w, 1.0, false) * (1.0 / std::sqrt(static_cast<double>(weight.size(1))));
  return modulated_conv(x, weight, styles, /*demodulate=*/false, /*up=*/false) +
         param(p, name + ".bias").reshape({1, -1, 1, 1});
}

/// The synthesis network on ws [B, num_ws, w_dim] with the noise seeds int64 [B].
inline at::Tensor synthesis(const Params& g, const Shape& s, const at::Tensor& ws, const at::Tensor& seeds) {
  const int64_t batch = ws.size(0);
  at::Tensor x, img;
  int64_t wi = 0;
  for (int64_t res = 4; res <= s.resolution; res *= 2) {
    const std::string b = "b" + std::to_string(res) + ".";
    const int64_t nc = res == 4 ? 1 : 2;
    if (res == 4) {
      const at::Tensor c = param(g, b + "const");
      x = c.unsqueeze(0).expand({batch, -1, -1, -1});
      x = synthesis_layer(g, b + "conv1", x, ws.select(1, wi), draw_noise(seeds, wi, res, ws), false);
    } else {
      x = synthesis_layer(g, b + "conv0", x, ws.select(1, wi), draw_noise(seeds, wi, res, ws), true);
      x = synthesis_layer(g, b + "conv1", x, ws.select(1, wi + 1), draw_noise(seeds, wi + 1, res, ws), false);
    }
    const at::Tensor rgb = to_rgb(g, b + "torgb", x, ws.select(1, wi + nc));
    img = img.defined() ? upsample_image(img) + rgb : rgb;
    wi += nc;
  }
  return img;
}

/// G: see the file comment. y int64 [B] (conditional) or undefined; w_avg non-null: updated
/// in place (training mode).
inline GOut generator(const Params& g, const Shape& s, const at::Tensor& z, const at::Tensor& y, at::Tensor* w_avg) {
  const int64_t zd = s.z_dim, nws = num_ws(s);
  TORCH_CHECK(z.dim() == 2 && z.size(1) == 2 * zd + 3, "sg2_plain: z must be [B, ", 2 * zd + 3, "], not ", z.sizes());
  const at::Tensor ctrl = z.narrow(1, 2 * zd, 3).detach().to(at::kDouble);
  const at::Tensor psi = ctrl.select(1, 2);
  const at::Tensor cutoff = ctrl.select(1, 0).to(at::kLong), seeds = ctrl.select(1, 1).to(at::kLong);
  TORCH_CHECK(cutoff.ge(1).all().item<bool>() && cutoff.le(nws).all().item<bool>(),
              "sg2_plain: cutoffs must be in [1, ", nws, "]");
  const at::Tensor labels = s.num_classes > 0 ? y : at::Tensor();
  TORCH_CHECK(s.num_classes == 0 || labels.defined(), "sg2_plain: a conditional G needs y");
  at::Tensor w =
      mapping(g, "mapping.", z.narrow(1, 0, zd), labels, s.num_classes, s.mapping_layers, s.mapping_lr_mult);
  if (w_avg != nullptr && w_avg->defined() && s.w_avg_beta > 0) {
    torch::NoGradGuard no_grad;
    const at::Tensor mean = w.detach().to(at::kDouble).mean(0).to(w_avg->scalar_type());
    w_avg->copy_(at::lerp(mean, *w_avg, s.w_avg_beta));
  }
  // Truncation in W, rows with psi != 1 (w_avg + psi (w - w_avg)), on the updated w_avg.
  const bool truncate = psi.ne(1).any().item<bool>();
  TORCH_CHECK(!truncate || (w_avg != nullptr && w_avg->defined()), "sg2_plain: truncation needs w_avg");
  auto truncated = [&](const at::Tensor& v) {
    if (!truncate) return v;
    const at::Tensor avg = w_avg->detach().to(v.dtype()).unsqueeze(0);
    return avg + psi.to(v.dtype()).unsqueeze(1) * (v - avg);
  };
  w = truncated(w);
  at::Tensor ws;
  if (cutoff.lt(nws).any().item<bool>()) {
    const at::Tensor w2 = truncated(
        mapping(g, "mapping.", z.narrow(1, zd, zd), labels, s.num_classes, s.mapping_layers, s.mapping_lr_mult));
    const at::Tensor layer = at::arange(nws, torch::TensorOptions().dtype(at::kLong)).reshape({1, nws, 1});
    const at::Tensor from_mixing = layer.ge(cutoff.reshape({-1, 1, 1})).to(w.device());
    ws = at::where(from_mixing, w2.unsqueeze(1), w.unsqueeze(1));
  } else {
    ws = w.unsqueeze(1).expand({-1, nws, -1});
  }
  return {synthesis(g, s, ws, seeds), ws};
}

// ---------------------------------------------------------------------------------------------
// D

/// Equalized-lr conv "<name>.weight" [O, I, k, k] (and ".bias"): down = blur(p, p),
/// p = 1 + (k - 1) / 2, then stride 2 unpadded; else padding k / 2. Then bias, lrelu, x gain.
inline at::Tensor d_conv(const Params& p, const std::string& name, const at::Tensor& x, bool act, bool bias,
                         bool down, double gain = 1.0) {
  const at::Tensor& weight = param(p, name + ".weight");
  const int64_t k = weight.size(2);
  const at::Tensor w = weight * (1.0 / std::sqrt(static_cast<double>(weight.size(1) * k * k)));
  at::Tensor y;
  if (down) {
    const int64_t pad = 1 + (k - 1) / 2;
    const std::vector<int64_t> two{2, 2}, none{0, 0};
    y = at::conv2d(blur(x, pad, pad, 1.0), w, {}, two, none);
  } else {
    const std::vector<int64_t> one{1, 1}, half{k / 2, k / 2};
    y = at::conv2d(x, w, {}, one, half);
  }
  if (bias) y = y + param(p, name + ".bias").reshape({1, -1, 1, 1});
  if (act) y = lrelu(y);
  return gain == 1.0 ? y : y * gain;
}

/// Minibatch standard deviation: G = min(group, N) consecutive samples per group (sample j
/// in group j / G, as the family; the authors' code takes j mod (N / G)), F feature groups;
/// appends F channels.
inline at::Tensor minibatch_stddev(const at::Tensor& x, int64_t group, int64_t f) {
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  const int64_t g = std::min(group, n);
  TORCH_CHECK(g >= 1 && n % g == 0, "sg2_plain: batch ", n, " is not a multiple of the mbstd group ", g);
  TORCH_CHECK(f >= 1 && c % f == 0, "sg2_plain: ", c, " channels do not split into ", f, " mbstd groups");
  const int64_t m = n / g;
  std::vector<at::Tensor> per_group;
  for (int64_t k = 0; k < m; ++k) {
    at::Tensor y = x.narrow(0, k * g, g).reshape({g, f, c / f, h, w});  // samples k g .. k g + g - 1
    y = y - y.mean(0, /*keepdim=*/true);
    y = (y.square().mean(0) + 1e-8).sqrt();                            // [F, C/F, H, W]
    y = y.mean({1, 2, 3});                                             // [F]
    per_group.push_back(y.reshape({1, f, 1, 1}).expand({g, f, h, w}));
  }
  return at::cat({x, at::cat(per_group, 0)}, 1);
}

/// D: x [B, C, R, R], y int64 [B] (conditional) or undefined -> logits [B].
inline at::Tensor discriminator(const Params& d, const Shape& s, const at::Tensor& x, const at::Tensor& y) {
  TORCH_CHECK(x.dim() == 4 && x.size(1) == s.channels && x.size(2) == s.resolution && x.size(3) == s.resolution,
              "sg2_plain: D expects [B, ", s.channels, ", ", s.resolution, ", ", s.resolution, "], not ", x.sizes());
  const bool resnet = s.d_arch == "resnet";
  TORCH_CHECK(resnet || s.d_arch == "orig", "sg2_plain: d_arch ", s.d_arch);
  at::Tensor h = x;
  for (int64_t res = s.resolution; res >= 8; res /= 2) {
    const std::string b = "b" + std::to_string(res) + ".";
    if (res == s.resolution) h = d_conv(d, b + "fromrgb", h, true, true, false);
    if (resnet) {
      const double g = std::sqrt(0.5);
      const at::Tensor skip = d_conv(d, b + "skip", h, /*act=*/false, /*bias=*/false, /*down=*/true, g);
      const at::Tensor body = d_conv(d, b + "conv1", d_conv(d, b + "conv0", h, true, true, false), true, true, true, g);
      h = body + skip;
    } else {
      h = d_conv(d, b + "conv1", d_conv(d, b + "conv0", h, true, true, false), true, true, true);
    }
  }
  h = minibatch_stddev(h, s.mbstd_group, s.mbstd_channels);
  h = d_conv(d, "b4.conv", h, true, true, false);
  h = fully_connected(d, "b4.fc", h.flatten(1), 1.0, true);
  h = fully_connected(d, "b4.out", h, 1.0, false);
  if (s.num_classes > 0) {
    TORCH_CHECK(y.defined(), "sg2_plain: a conditional D needs y");
    const at::Tensor cmap = mapping(d, "mapping.", at::Tensor(), y, s.num_classes, s.d_mapping_layers,
                                    s.mapping_lr_mult);
    h = (h * cmap).sum(1) * (1.0 / std::sqrt(static_cast<double>(cmap.size(1))));
    return h;
  }
  return h.select(1, 0);
}

}  // namespace sg2_plain
