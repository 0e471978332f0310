// The reference for BigGAN's spectral-norm convolution (SNConv2d, src/models/biggan/layers.h),
// shared by the CPU test (test_biggan_layers.cpp) and the GPU test (test_gpu.cpp): plain
// LibTorch autograd of at::conv2d(x, W) / sigma + b, with the power iteration written out.
#pragma once

#include <torch/torch.h>

#include "models/biggan/layers.h"

namespace shardgan::test_util {

/// sigma = u' W v^T in plain autograd (W viewed as [out, in]), with v and u' from one power
/// iteration of u, held constant: the reference for SNConv2d, sharing none of its code.
/// `w` [out, in, k, k] and `u` [1, out] on one device, in one floating dtype.
inline at::Tensor plain_sigma(const at::Tensor& w, const at::Tensor& u) {
  const at::Tensor wm = w.reshape({w.size(0), -1});
  at::Tensor v, un;
  {
    torch::NoGradGuard g;
    v = at::mm(u, wm.detach());
    v = v / v.norm().clamp_min(biggan::kSnEps);
    un = at::mm(v, wm.detach().t());
    un = un / un.norm().clamp_min(biggan::kSnEps);
  }
  return at::mm(at::mm(v, wm.t()), un.t()).squeeze();
}

/// max |a - b| / max(floor, max |b|), in float64.
inline double rel_err(const at::Tensor& a, const at::Tensor& b, double floor = 1.0) {
  const at::Tensor bd = b.to(at::kDouble);
  return ((a.to(at::kDouble) - bd).abs().max() / bd.abs().max().clamp_min(floor)).item<double>();
}

/// What sn_conv_errors_float64 returns: rel_err of each result against plain autograd.
struct SnConvErrors {
  double output, x_grad, w_grad, bias_grad, double_backward;
};

/// SNConv2d(5 -> 4, 3x3, padding 1, bias) on `device` in float64, from seed 8: an orthogonal
/// W scaled by 1.7 (sigma 1.7, not the 1 of an orthogonal W: a lost 1 / sigma shows), a
/// bias uniform in [-1, 1].
inline biggan::SNConv2d sn_conv_float64(const c10::Device& device) {
  torch::manual_seed(8);
  biggan::SNConv2d conv(5, 4, 3, 1);
  biggan::init_weights(*conv, biggan::Init::kOrtho);
  conv->to(device, at::kDouble);
  torch::NoGradGuard g;
  conv->weight.mul_(1.7);
  conv->bias.uniform_(-1, 1);
  return conv;
}

/// sn_conv_float64(device) against plain autograd on `device`: the output, the gradients of
/// x, W and b, and an R1-style double backward (the W gradient of ||d sum(y * r) / dx||^2).
/// Seeds torch's generator.
inline SnConvErrors sn_conv_errors_float64(const c10::Device& device) {
  const auto f64 = torch::TensorOptions().dtype(torch::kDouble).device(device);
  biggan::SNConv2d conv = sn_conv_float64(device);
  const at::Tensor u0 = conv->u.clone();
  const at::Tensor x0 = torch::randn({2, 5, 6, 6}, f64), r = torch::randn({2, 4, 6, 6}, f64);
  // Ours: second order first (the R1 pattern), then first order from the same u.
  at::Tensor x = x0.clone().requires_grad_(true);
  at::Tensor y = conv->forward(x);
  const at::Tensor gx = torch::autograd::grad({(y * r).sum()}, {x}, {}, true, true)[0];
  gx.pow(2).sum().backward();
  const at::Tensor r1_w = conv->weight.grad().clone();
  conv->zero_grad();
  {
    torch::NoGradGuard g;
    conv->u.copy_(u0);
  }
  x = x0.clone().requires_grad_(true);
  y = conv->forward(x);
  (y * r).sum().backward();
  // Plain autograd.
  at::Tensor w = conv->weight.detach().clone().requires_grad_(true), b = conv->bias.detach().clone().requires_grad_(true);
  at::Tensor xr = x0.clone().requires_grad_(true);
  const at::Tensor yr = at::conv2d(xr, w, {}, 1, 1) / plain_sigma(w, u0) + b.view({1, -1, 1, 1});
  const auto ref = torch::autograd::grad({(yr * r).sum()}, {xr, w, b}, {}, true, true);
  const at::Tensor r1_ref = torch::autograd::grad({ref[0].pow(2).sum()}, {w})[0];
  return {rel_err(y.detach(), yr.detach()), rel_err(x.grad(), ref[0]), rel_err(conv->weight.grad(), ref[1]),
          rel_err(conv->bias.grad(), ref[2]), rel_err(r1_w, r1_ref)};
}

}  // namespace shardgan::test_util
