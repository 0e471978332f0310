#pragma once
/// Layers that LibTorch 1.13's CPU build lacks in some dtype.
#include <torch/nn/module.h>
#include <torch/nn/options/conv.h>
#include <torch/nn/pimpl.h>

namespace shardgan {

/// torch::nn::ConvTranspose2d with the same parameters ("weight" [in, out, k, k] and an
/// optional "bias" [out]) and the same default initialization, which also runs on bfloat16
/// and float16 CPU tensors: LibTorch 1.13 implements no 16-bit transposed convolution on
/// the CPU ("slow_conv_transpose2d_out_cpu not implemented for 'BFloat16'"), so for those
/// dtypes it computes in float32 and rounds the output once, as CPU autocast does for
/// unsupported ops. Gradients reach the 16-bit parameters through the casts.
class ConvTranspose2dImpl : public torch::nn::Module {
 public:
  explicit ConvTranspose2dImpl(torch::nn::ConvTranspose2dOptions options);
  /// x: [B, in, H, W] -> [B, out, H', W'], same dtype as x.
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight, bias;

 private:
  torch::nn::ConvTranspose2dOptions options_;
};
TORCH_MODULE(ConvTranspose2d);

/// 2-D convolution, stride 1, no bias: x [B, in, H, W], w [out, in, k, k] -> [B, out, H +
/// 2p - k + 1, W + 2p - k + 1], in x's dtype. Float32 and float64 go to at::conv2d. For
/// bfloat16 and float16 CPU tensors LibTorch 1.13 picks its im2col path with a naive 16-bit
/// gemm (slow_conv2d: a 1e9-parameter BigGAN step took over 6 minutes), so this computes in
/// float32 through oneDNN and rounds the output once, as CPU autocast does. A custom
/// autograd function saves the 16-bit x and w themselves, not float32 copies, so nothing
/// weight-sized stays alive from forward to backward (w remains a view of the sharding
/// unit's flat parameter) and the float32 copies are recomputed in backward. Local.
at::Tensor conv2d_lowp(const at::Tensor& x, const at::Tensor& w, int64_t padding);

}  // namespace shardgan
