#include "shardgan/data/edges.h"

#include <algorithm>
#include <stdexcept>

#include <torch/torch.h>

namespace shardgan::data {

at::Tensor sobel_edges(const at::Tensor& images, int64_t channels) {
  if (images.dim() != 4 || !images.is_floating_point() || channels < 1) {
    throw std::invalid_argument("sobel_edges: expects floating images [N, C, H, W] and channels >= 1");
  }
  torch::NoGradGuard no_grad;
  const auto f32 = torch::TensorOptions().dtype(at::kFloat);
  const at::Tensor kx = torch::tensor({-1.0f, 0.0f, 1.0f, -2.0f, 0.0f, 2.0f, -1.0f, 0.0f, 1.0f}, f32).view({1, 1, 3, 3});
  const at::Tensor ky = kx.transpose(2, 3).contiguous();
  const at::Tensor k = torch::cat({kx, ky}, 0);  // [2, 1, 3, 3]
  const int64_t n = images.size(0), h = images.size(2), w = images.size(3);
  at::Tensor out = torch::empty({n, channels, h, w}, images.options());
  constexpr int64_t kChunk = 4096;
  for (int64_t b = 0; b < n; b += kChunk) {
    const int64_t m = std::min(kChunk, n - b);
    at::Tensor x = (images.narrow(0, b, m).to(at::kFloat).mean(1, true) + 1.0) * 0.5;  // [m, 1, H, W] in [0, 1]
    at::Tensor g = at::conv2d(x, k, {}, 1, 1);                                         // [m, 2, H, W]
    at::Tensor mag = (g.narrow(1, 0, 1).pow(2) + g.narrow(1, 1, 1).pow(2)).sqrt();
    at::Tensor edges = torch::where(mag > kEdgeThreshold, 1.0f, -1.0f);
    out.narrow(0, b, m).copy_(edges.expand({m, channels, h, w}));
  }
  return out;
}

}  // namespace shardgan::data
