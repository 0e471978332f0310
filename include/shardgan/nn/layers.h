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

}  // namespace shardgan
