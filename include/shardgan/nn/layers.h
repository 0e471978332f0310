#pragma once
/// 16-bit convolutions computed in float32 on CPUs without native bfloat16 arithmetic.
/// Measured on one thread of the project's machines (AMD EPYC, AVX2, no AVX512-BF16 or AMX;
/// benchmarks/bench_torch_cpu, LibTorch 2.15): a 3x3 conv at 256 channels runs at 86 GFLOP/s
/// in float32 through oneDNN and 0.8 GFLOP/s in bfloat16, and a bfloat16 transposed conv 6x
/// slower than float32. LibTorch 1.13 had no 16-bit transposed convolution on the CPU at all.
#include <torch/nn/module.h>
#include <torch/nn/options/conv.h>
#include <torch/nn/pimpl.h>

namespace shardgan {

/// torch::nn::ConvTranspose2d with the same parameters ("weight" [in, out, k, k] and an
/// optional "bias" [out]) and the same default initialization, which also runs on bfloat16
/// and float16 CPU tensors: for those dtypes it computes in float32 and rounds the output
/// once, as CPU autocast does for ops without a fast 16-bit kernel (see above). Gradients
/// reach the 16-bit parameters through the casts.
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

/// torch::nn::Conv2d with the same parameters ("weight" [out, in, k, k], optional "bias"
/// [out]) and default initialization, whose forward is conv2d_lowp(): float32 inside for
/// bfloat16 and float16 CPU tensors. LibTorch 2.15's own 16-bit CPU convolution is not only
/// about 100x slower on CPUs without native bfloat16, its backward also rounds partial sums:
/// measured against the float32 result rounded once, 46% of a small conv's weight-gradient
/// elements differ, by up to 0.72 relative (0.17 in 1.13). Only dilation 1 and groups 1.
class Conv2dImpl : public torch::nn::Module {
 public:
  explicit Conv2dImpl(torch::nn::Conv2dOptions options);
  /// x: [B, in, H, W] -> [B, out, H', W'], same dtype as x.
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight, bias;

 private:
  int64_t stride_, padding_;
};
TORCH_MODULE(Conv2d);

/// Whether the 16-bit CPU path of conv2d_lowp() (and ConvTranspose2d) applies to x: a
/// bfloat16 or float16 tensor on the CPU, which those compute in float32 and round once.
/// Local.
bool computes_via_float32(const at::Tensor& x);

/// 2-D convolution, square stride and padding, dilation 1: x [B, in, H, W], w [out, in, k, k],
/// bias [out] or undefined -> [B, out, (H + 2p - k) / s + 1, (W + 2p - k) / s + 1], in x's
/// dtype. Float32 and float64 go to at::conv2d. For bfloat16 and float16 CPU tensors LibTorch's 16-bit CPU path is about 100x slower than
/// float32 on CPUs without native bfloat16 (above; in 1.13 a 1e9-parameter BigGAN step took
/// over 6 minutes), so this computes in float32 through oneDNN and rounds the output once,
/// as CPU autocast does. A custom
/// autograd function saves the 16-bit x and w themselves, not float32 copies, so nothing
/// weight-sized stays alive from forward to backward (w remains a view of the sharding
/// unit's flat parameter) and the float32 copies are recomputed in backward. Local.
/// `w_float`, optional: w converted to float32 (same shape and values; no gradient flows
/// into it), which a 16-bit forward then uses instead of converting w again, e.g. the copy
/// spectral norm's power iteration made. Ignored unless it is float32.
/// Throws c10::Error on mismatched shapes (as at::conv2d).
at::Tensor conv2d_lowp(const at::Tensor& x, const at::Tensor& w, int64_t padding, int64_t stride = 1,
                       const at::Tensor& bias = {}, const at::Tensor& w_float = {});

}  // namespace shardgan
