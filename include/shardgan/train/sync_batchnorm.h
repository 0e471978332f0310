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

}  // namespace shardgan
