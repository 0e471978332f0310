#pragma once
/// SyncBatchNorm for NCHW tensors: batch statistics over the global batch across ranks
/// (Ioffe & Szegedy 2015; PyTorch's nn.SyncBatchNorm). Forward all-reduces per-channel
/// [sum, sum of squares, count]; backward all-reduces [sum dy, sum dy*xhat], so N ranks with
/// B/N samples each give the same result as one rank with B samples.
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "shardgan/comm/communicator.h"

namespace shardgan {

class SyncBatchNorm2dImpl : public torch::nn::Module {
 public:
  /// `comm` must outlive the module. `momentum` weights the new batch statistics in the
  /// running averages, as in torch.nn.BatchNorm2d.
  SyncBatchNorm2dImpl(int64_t channels, Communicator* comm, double eps = 1e-5,
                      double momentum = 0.1);

  /// x: [B, C, H, W], float32 or float64, CPU. In training mode this is a collective (one
  /// all-reduce of 2C+1 values in forward, one of 2C in backward) and updates the running
  /// statistics with the global unbiased variance. In eval mode it is local and uses them.
  at::Tensor forward(const at::Tensor& x);

  at::Tensor weight, bias, running_mean, running_var;

 private:
  int64_t channels_;
  Communicator* comm_;
  double eps_, momentum_;
};
TORCH_MODULE(SyncBatchNorm2d);

/// Functional SyncBatchNorm over NCHW tensors, for modules that keep their own parameters
/// and running statistics (BigGAN's class-conditional BN, Brock et al. 2019, Sec. 3 and
/// app. B; BigGAN-PyTorch's `ccbn` normalizes without affine parameters and applies a
/// per-sample gain and bias itself).
///  - x: [B, C, H, W], float32, float64 or bfloat16, CPU; the output has x's shape and dtype.
///  - weight, bias: [C] in x's dtype, or both undefined (non-affine: no scale or shift, and
///    no parameter gradients).
///  - running_mean, running_var: [C] buffers in any floating dtype (usually the master
///    dtype, float32 or float64, also under bfloat16 compute); updated in place in training
///    mode with the global mean and the global unbiased variance, weighted by `momentum`.
///  - training: batch statistics over the global batch. This is a collective on `comm`
///    (one all-reduce of 2C+1 float64 values in forward, one of 2C values in backward), so
///    every rank must call it in the same order. Otherwise local, using the running
///    statistics (cast to x's dtype), and `comm` may be null.
/// Throws c10::Error for a non-4-D x, statistics or affine parameters of the wrong size,
/// only one of weight/bias defined, or a null `comm` in training mode.
at::Tensor sync_batch_norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                           const at::Tensor& running_mean, const at::Tensor& running_var,
                           bool training, double eps, double momentum, Communicator* comm);

}  // namespace shardgan
