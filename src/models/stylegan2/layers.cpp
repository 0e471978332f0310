#include "models/stylegan2/layers.h"

#include <cmath>
#include <stdexcept>
#include <string>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "shardgan/nn/layers.h"
#include "shardgan/util/splitmix64.h"

namespace shardgan::stylegan2 {

const double kLreluGain = std::sqrt(2.0);

namespace {

at::Tensor lrelu(const at::Tensor& x) { return at::leaky_relu(x, kLreluSlope) * kLreluGain; }

// at::conv2d / conv_transpose2d; bfloat16 and float16 CPU tensors compute in float32 and round
// once (LibTorch's 16-bit CPU convolutions are slow and round partial sums, shardgan/nn/layers.h),
// through plain casts, so that the result stays differentiable twice.
at::Tensor conv2d_any(const at::Tensor& x, const at::Tensor& w, int64_t stride, int64_t padding, int64_t groups = 1) {
  if (computes_via_float32(x)) {
    return conv2d_any(x.to(at::kFloat), w.to(at::kFloat), stride, padding, groups).to(x.scalar_type());
  }
  return at::conv2d(x, w, {}, {stride, stride}, {padding, padding}, {1, 1}, groups);
}

at::Tensor conv_transposed_stride2(const at::Tensor& x, const at::Tensor& w) {
  if (computes_via_float32(x)) {
    return conv_transposed_stride2(x.to(at::kFloat), w.to(at::kFloat)).to(x.scalar_type());
  }
  return at::conv_transpose2d(x, w, {}, {2, 2});
}

}  // namespace

at::Tensor normalize_2nd_moment(const at::Tensor& x, double eps) {
  return x * (x.square().mean(1, /*keepdim=*/true) + eps).rsqrt();
}

at::Tensor fir_filter(const at::TensorOptions& o) {
  // Built in float64 on the CPU (at::tensor has no bfloat16 CPU path), then converted: the
  // taps k/64 with k in {1, 3, 9} are exact in every float dtype.
  at::Tensor f = at::tensor({1.0, 3.0, 3.0, 1.0}, at::TensorOptions().dtype(at::kDouble));
  f = at::outer(f, f);
  return (f / f.sum()).to(o);
}

at::Tensor blur(const at::Tensor& x, int64_t pad_lo, int64_t pad_hi, double gain) {
  const int64_t c = x.size(1);
  at::Tensor f = (fir_filter(x.options()) * gain).expand({c, 1, 4, 4});
  at::Tensor p = at::constant_pad_nd(x, {pad_lo, pad_hi, pad_lo, pad_hi}, 0);
  return conv2d_any(p, f, 1, 0, c);
}

at::Tensor upsample2d(const at::Tensor& x) {
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  // y[:, :, 2i, 2j] = x[:, :, i, j], zeros elsewhere: padding each pixel with one zero after
  // it along both axes (a functional form of the peer's strided assignment, the same values).
  at::Tensor y = at::constant_pad_nd(x.reshape({n, c, h, 1, w, 1}), {0, 1, 0, 0, 0, 1}, 0);
  return blur(y.reshape({n, c, 2 * h, 2 * w}), 2, 1, 4.0);
}

at::Tensor downsample2d(const at::Tensor& x) {
  using at::indexing::None;
  using at::indexing::Slice;
  return blur(x, 1, 1).index({Slice(), Slice(), Slice(None, None, 2), Slice(None, None, 2)});
}

at::Tensor modulated_conv2d(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& styles,
                            bool demodulate, bool up) {
  const int64_t n = x.size(0), o = weight.size(0), i = weight.size(1), k = weight.size(2);
  at::Tensor y = x * styles.reshape({n, i, 1, 1});
  if (up) {
    y = conv_transposed_stride2(y, weight.transpose(0, 1));
    y = blur(y, 1, 1, 4.0);
  } else {
    y = conv2d_any(y, weight, 1, k / 2);
  }
  if (demodulate) {
    // sum_{i,k,l} (w[o,i,k,l] s[n,i])^2 = sum_i s[n,i]^2 sum_{k,l} w[o,i,k,l]^2.
    at::Tensor d = (styles.square().matmul(weight.square().sum({2, 3}).t()) + 1e-8).rsqrt();
    y = y * d.reshape({n, o, 1, 1});
  }
  return y;
}

at::Tensor minibatch_stddev(const at::Tensor& x, int64_t group_size, int64_t num_channels) {
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  const int64_t g = std::min(group_size, n);
  if (g < 1 || n % g != 0) {
    throw std::invalid_argument("StyleGAN2 D: the batch of " + std::to_string(n) +
                                " is not a multiple of the minibatch-stddev group " + std::to_string(g) +
                                " (model.mbstd_group " + std::to_string(group_size) + ")");
  }
  if (num_channels < 1 || c % num_channels != 0) {
    throw std::invalid_argument("StyleGAN2 D: " + std::to_string(c) + " channels do not split into " +
                                std::to_string(num_channels) + " minibatch-stddev groups");
  }
  // Groups of g consecutive samples. The authors' code takes strided ones (sample i of a
  // batch of n is in group i mod n/g), whose members depend on the batch on each GPU; a
  // consecutive group is the same set of samples in any world size whose per-rank batch
  // is a multiple of g, and never mixes the fake and real halves of a joint D pass.
  at::Tensor y = x.reshape({-1, g, num_channels, c / num_channels, h, w});
  y = y - y.mean(1, /*keepdim=*/true);
  y = (y.square().mean(1) + 1e-8).sqrt();                   // [n/g, F, c/F, h, w]
  y = y.mean({2, 3, 4}).repeat_interleave(g, 0);            // [n, F]: each sample its group's
  y = y.reshape({n, num_channels, 1, 1}).expand({n, num_channels, h, w});
  return at::cat({x, y}, 1);
}

uint64_t noise_seed(int64_t sample_seed, int64_t layer) {
  return splitmix64(splitmix64(static_cast<uint64_t>(sample_seed)) ^ static_cast<uint64_t>(layer));
}

at::Tensor draw_noise(const at::Tensor& seeds, int64_t layer, int64_t resolution, const at::TensorOptions& o) {
  const at::Tensor s = seeds.to(at::kCPU, at::kLong).contiguous();
  const int64_t n = s.numel();
  const int64_t* p = s.data_ptr<int64_t>();
  at::Tensor out = at::empty({n, 1, resolution, resolution}, at::TensorOptions().dtype(at::kDouble));
  for (int64_t i = 0; i < n; ++i) {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(noise_seed(p[i], layer));
    out[i][0].copy_(at::randn({resolution, resolution}, gen, at::TensorOptions().dtype(at::kDouble)));
  }
  return out.to(o);
}

// ---------------------------------------------------------------------------------------------

FullyConnectedImpl::FullyConnectedImpl(int64_t in, int64_t out, double lr_mul, double bias_init, bool lrelu)
    : lr_mul_(lr_mul), bias_init_(bias_init), weight_gain_(lr_mul / std::sqrt(static_cast<double>(in))),
      lrelu_(lrelu) {
  weight = register_parameter("weight", torch::empty({out, in}));
  bias = register_parameter("bias", torch::empty({out}));
}

at::Tensor FullyConnectedImpl::forward(const at::Tensor& x) {
  at::Tensor y = at::linear(x, weight * weight_gain_, bias * lr_mul_);
  return lrelu_ ? lrelu(y) : y;
}

void FullyConnectedImpl::reset_parameters() {
  torch::NoGradGuard g;
  weight.normal_().div_(lr_mul_);
  bias.fill_(bias_init_);
}

Conv2dLayerImpl::Conv2dLayerImpl(int64_t in, int64_t out, int64_t kernel, bool with_bias, bool lrelu, bool down)
    : kernel_(kernel), weight_gain_(1.0 / std::sqrt(static_cast<double>(in * kernel * kernel))), lrelu_(lrelu),
      down_(down) {
  weight = register_parameter("weight", torch::empty({out, in, kernel, kernel}));
  if (with_bias) bias = register_parameter("bias", torch::empty({out}));
}

at::Tensor Conv2dLayerImpl::forward(const at::Tensor& x, double gain) {
  const at::Tensor w = weight * weight_gain_;
  at::Tensor y;
  if (down_) {  // the filter, then a stride-2 convolution: an even side halves exactly
    const int64_t p = 1 + (kernel_ - 1) / 2;
    y = conv2d_any(blur(x, p, p), w, 2, 0);
  } else {
    y = conv2d_any(x, w, 1, kernel_ / 2);
  }
  if (bias.defined()) y = y + bias.view({1, -1, 1, 1});
  if (lrelu_) y = lrelu(y);
  return gain == 1.0 ? y : y * gain;
}

void Conv2dLayerImpl::reset_parameters() {
  torch::NoGradGuard g;
  weight.normal_();
  if (bias.defined()) bias.zero_();
}

SynthesisLayerImpl::SynthesisLayerImpl(int64_t in, int64_t out, int64_t w_dim, int64_t resolution, bool up)
    : resolution_(resolution), weight_gain_(1.0 / std::sqrt(static_cast<double>(in * 9))), up_(up) {
  // The peer's order: own parameters first (weight, noise_strength, bias), then affine.
  weight = register_parameter("weight", torch::empty({out, in, 3, 3}));
  noise_strength = register_parameter("noise_strength", torch::empty({}));
  bias = register_parameter("bias", torch::empty({out}));
  affine = register_module("affine", FullyConnected(w_dim, in, 1.0, /*bias_init=*/1.0));
}

at::Tensor SynthesisLayerImpl::forward(const at::Tensor& x, const at::Tensor& w, const at::Tensor& noise) {
  const at::Tensor styles = affine->forward(w);
  at::Tensor y = modulated_conv2d(x, weight * weight_gain_, styles, /*demodulate=*/true, up_);
  if (noise.defined()) y = y + noise * noise_strength;
  y = y + bias.view({1, -1, 1, 1});
  return lrelu(y);
}

void SynthesisLayerImpl::reset_parameters() {
  torch::NoGradGuard g;
  weight.normal_();
  noise_strength.zero_();
  bias.zero_();
}

ToRGBImpl::ToRGBImpl(int64_t in, int64_t w_dim, int64_t channels)
    : weight_gain_(1.0 / std::sqrt(static_cast<double>(in))) {
  weight = register_parameter("weight", torch::empty({channels, in, 1, 1}));
  bias = register_parameter("bias", torch::empty({channels}));
  affine = register_module("affine", FullyConnected(w_dim, in, 1.0, /*bias_init=*/1.0));
}

at::Tensor ToRGBImpl::forward(const at::Tensor& x, const at::Tensor& w) {
  const at::Tensor styles = affine->forward(w) * weight_gain_;
  return modulated_conv2d(x, weight, styles, /*demodulate=*/false, /*up=*/false) + bias.view({1, -1, 1, 1});
}

void ToRGBImpl::reset_parameters() {
  torch::NoGradGuard g;
  weight.normal_();
  bias.zero_();
}

SynthesisBlockImpl::SynthesisBlockImpl(int64_t in, int64_t out, int64_t w_dim, int64_t resolution,
                                       int64_t channels)
    : in_(in) {
  if (in == 0) {
    const_input = register_parameter("const", torch::empty({out, 4, 4}));
  } else {
    conv0 = register_module("conv0", SynthesisLayer(in, out, w_dim, resolution, /*up=*/true));
  }
  conv1 = register_module("conv1", SynthesisLayer(out, out, w_dim, resolution, /*up=*/false));
  torgb = register_module("torgb", ToRGB(out, w_dim, channels));
}

std::pair<at::Tensor, at::Tensor> SynthesisBlockImpl::forward(const at::Tensor& x, const at::Tensor& img,
                                                              const at::Tensor& ws,
                                                              const std::vector<at::Tensor>& noise) {
  const int64_t nc = num_conv();
  TORCH_CHECK(ws.dim() == 3 && ws.size(1) == nc + 1, "StyleGAN2 synthesis block: ws must be [N, ", nc + 1,
              ", w_dim], not ", ws.sizes());
  TORCH_CHECK(static_cast<int64_t>(noise.size()) == nc, "StyleGAN2 synthesis block: ", nc, " noise inputs, not ",
              noise.size());
  at::Tensor h;
  if (in_ == 0) {
    h = const_input.unsqueeze(0).expand({ws.size(0), -1, -1, -1});
    h = conv1->forward(h, ws.select(1, 0), noise[0]);
  } else {
    h = conv0->forward(x, ws.select(1, 0), noise[0]);
    h = conv1->forward(h, ws.select(1, 1), noise[1]);
  }
  const at::Tensor y = torgb->forward(h, ws.select(1, nc));
  return {h, img.defined() ? upsample2d(img) + y : y};
}

void SynthesisBlockImpl::reset_parameters() {
  torch::NoGradGuard g;
  if (const_input.defined()) const_input.normal_();
}

MappingNetworkImpl::MappingNetworkImpl(int64_t z_dim, int64_t c_dim, int64_t w_dim, int64_t num_layers,
                                       double lr_mul, double w_avg_beta, Communicator* comm)
    : z_dim_(z_dim), c_dim_(c_dim), w_dim_(w_dim), w_avg_beta_(w_avg_beta), comm_(comm) {
  if (c_dim > 0) embed = register_module("embed", FullyConnected(c_dim, w_dim));
  fcs = register_module("fcs", torch::nn::ModuleList());
  int64_t in = z_dim + (c_dim > 0 ? w_dim : 0);
  for (int64_t i = 0; i < num_layers; ++i, in = w_dim) {
    fcs->push_back(FullyConnected(in, w_dim, lr_mul, /*bias_init=*/0.0, /*lrelu=*/true));
  }
  if (w_avg_beta > 0) w_avg = register_buffer("w_avg", torch::zeros({w_dim}));
}

at::Tensor MappingNetworkImpl::forward(const at::Tensor& z, const at::Tensor& y, bool update_w_avg) {
  std::vector<at::Tensor> parts;
  if (z_dim_ > 0) {
    if (!z.defined()) throw std::invalid_argument("StyleGAN2 mapping: needs z [N, " + std::to_string(z_dim_) + "]");
    parts.push_back(normalize_2nd_moment(z));
  }
  if (c_dim_ > 0) {
    if (!y.defined()) throw std::invalid_argument("StyleGAN2 mapping: a conditional model needs labels y int64 [N]");
    const at::Tensor onehot = at::one_hot(y.to(at::kLong), c_dim_).to(embed->weight.scalar_type());
    parts.push_back(normalize_2nd_moment(embed->forward(onehot)));
  }
  at::Tensor x = parts.size() == 1 ? parts[0] : at::cat(parts, 1);
  for (const auto& m : *fcs) x = m->as<FullyConnectedImpl>()->forward(x);
  if (w_avg.defined() && is_training() && update_w_avg) {
    torch::NoGradGuard g;
    // Sums and the count over the global batch, in float64 (the mean does not depend on
    // how the batch is split across ranks, up to rounding).
    at::Tensor stats = at::empty({w_dim_ + 1}, x.options().dtype(at::kDouble));
    stats.narrow(0, 0, w_dim_).copy_(x.detach().to(at::kDouble).sum(0));
    stats[w_dim_] = static_cast<double>(x.size(0));
    if (comm_) comm_->all_reduce(stats, ReduceOp::kSum);
    const at::Tensor mean = stats.narrow(0, 0, w_dim_) / stats[w_dim_];
    w_avg.copy_(mean.to(w_avg.scalar_type()).lerp(w_avg, w_avg_beta_));
  }
  return x;
}

DiscriminatorBlockImpl::DiscriminatorBlockImpl(bool first, int64_t tmp, int64_t out, int64_t channels,
                                               bool resnet) {
  if (first) fromrgb = register_module("fromrgb", Conv2dLayer(channels, tmp, 1));
  conv0 = register_module("conv0", Conv2dLayer(tmp, tmp, 3));
  conv1 = register_module("conv1", Conv2dLayer(tmp, out, 3, true, true, /*down=*/true));
  if (resnet) skip = register_module("skip", Conv2dLayer(tmp, out, 1, /*bias=*/false, /*lrelu=*/false, true));
}

at::Tensor DiscriminatorBlockImpl::forward(const at::Tensor& x) {
  const at::Tensor h = fromrgb ? fromrgb->forward(x) : x;
  if (skip) {
    const double g = std::sqrt(0.5);
    const at::Tensor y = skip->forward(h, g);
    return y + conv1->forward(conv0->forward(h), g);
  }
  return conv1->forward(conv0->forward(h));
}

DiscriminatorEpilogueImpl::DiscriminatorEpilogueImpl(int64_t c, int64_t cmap_dim, int64_t mbstd_group,
                                                     int64_t mbstd_channels)
    : cmap_dim_(cmap_dim), mbstd_group_(mbstd_group), mbstd_channels_(mbstd_channels) {
  conv = register_module("conv", Conv2dLayer(c + mbstd_channels, c, 3));
  fc = register_module("fc", FullyConnected(c * 16, c, 1.0, 0.0, /*lrelu=*/true));
  out = register_module("out", FullyConnected(c, cmap_dim > 0 ? cmap_dim : 1));
}

at::Tensor DiscriminatorEpilogueImpl::forward(const at::Tensor& x, const at::Tensor& cmap) {
  at::Tensor h = minibatch_stddev(x, mbstd_group_, mbstd_channels_);
  h = fc->forward(conv->forward(h).flatten(1));
  h = out->forward(h);
  if (cmap_dim_ > 0) {
    if (!cmap.defined()) throw std::invalid_argument("StyleGAN2 D: a conditional D needs its label mapping");
    h = (h * cmap).sum(1, /*keepdim=*/true) / std::sqrt(static_cast<double>(cmap_dim_));
  }
  return h.squeeze(1);
}

void initialize(torch::nn::Module& m) {
  for (const auto& mod : m.modules(/*include_self=*/true)) {
    if (auto* fc = dynamic_cast<FullyConnectedImpl*>(mod.get())) fc->reset_parameters();
    else if (auto* conv = dynamic_cast<Conv2dLayerImpl*>(mod.get())) conv->reset_parameters();
    else if (auto* layer = dynamic_cast<SynthesisLayerImpl*>(mod.get())) layer->reset_parameters();
    else if (auto* rgb = dynamic_cast<ToRGBImpl*>(mod.get())) rgb->reset_parameters();
    else if (auto* block = dynamic_cast<SynthesisBlockImpl*>(mod.get())) block->reset_parameters();
  }
}

}  // namespace shardgan::stylegan2
