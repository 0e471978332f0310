#include "shardgan/eval/image_quality.h"

#include <cmath>
#include <stdexcept>

#include <torch/torch.h>

namespace shardgan::eval {
namespace {

constexpr int64_t kWindow = 11;
constexpr double kSigma = 1.5, kK1 = 0.01, kK2 = 0.03;

// The normalized 11x11 Gaussian, [1, 1, 11, 11] float64 (skimage truncates at 3.5 sigma,
// which for sigma 1.5 is the same 11 taps).
at::Tensor gaussian_window() {
  at::Tensor x = torch::arange(kWindow, torch::kDouble) - (kWindow - 1) / 2.0;
  at::Tensor g = torch::exp(-x.pow(2) / (2 * kSigma * kSigma));
  g = g / g.sum();
  return torch::outer(g, g).view({1, 1, kWindow, kWindow});
}

}  // namespace

ImageScores image_scores(const at::Tensor& out, const at::Tensor& target) {
  if (out.dim() != 4 || out.sizes() != target.sizes()) {
    throw std::invalid_argument("image_scores: expects two [N, C, H, W] tensors of the same shape");
  }
  if (out.size(2) < kWindow || out.size(3) < kWindow) {
    throw std::invalid_argument("image_scores: SSIM needs images of at least 11x11 pixels");
  }
  torch::NoGradGuard no_grad;
  const at::Tensor a = out.to(at::kCPU, at::kDouble), b = target.to(at::kCPU, at::kDouble);
  ImageScores s;
  s.l1 = (a - b).abs().flatten(1).mean(1);
  const at::Tensor x = (a + 1) * 0.5, y = (b + 1) * 0.5;  // data range 1
  const at::Tensor mse = (x - y).pow(2).flatten(1).mean(1);
  s.psnr = 10.0 * torch::log10(1.0 / mse);
  // SSIM per channel: fold the channels into the batch and filter each alone.
  const int64_t n = x.size(0), c = x.size(1);
  const at::Tensor xs = x.reshape({n * c, 1, x.size(2), x.size(3)}), ys = y.reshape({n * c, 1, y.size(2), y.size(3)});
  const at::Tensor w = gaussian_window();
  auto filt = [&](const at::Tensor& t) { return at::conv2d(t, w); };  // valid region only
  const at::Tensor mx = filt(xs), my = filt(ys);
  const at::Tensor vx = filt(xs * xs) - mx * mx, vy = filt(ys * ys) - my * my, cxy = filt(xs * ys) - mx * my;
  const double c1 = kK1 * kK1, c2 = kK2 * kK2;
  const at::Tensor map = ((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx * mx + my * my + c1) * (vx + vy + c2));
  s.ssim = map.flatten(1).mean(1).view({n, c}).mean(1);
  return s;
}

}  // namespace shardgan::eval
