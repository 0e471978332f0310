#pragma once
// A two-unit model (Linear 16 -> hidden, tanh; Linear hidden -> 4) at ZeRO-3 in float64 with
// ShardedAdam, the same initial weights on every rank and device (torch seed 11): the GPU
// tests compare it on CUDA with NCCL against the CPU with MPI (test_gpu.cpp,
// test_gpu_ranks.cpp).
#include <memory>

#include <torch/torch.h>

#include "shardgan/optim/sharded_adam.h"
#include "shardgan/sharding/sharded_model.h"
#include "test_util.h"

namespace shardgan::test_util {

struct TwoUnitModel {
  torch::nn::Linear a{nullptr}, b{nullptr};
  std::unique_ptr<ShardedModel> model;
  std::unique_ptr<ShardedAdam> opt;
  /// Builds both units on the host from seed 11, moves them to `dev` in float64 and shards
  /// them over `comm` at stage 3 (a collective). Adam: lr 1e-2, betas (0.5, 0.999).
  TwoUnitModel(Communicator& comm, c10::Device dev, int64_t hidden = 8) {
    torch::manual_seed(11);
    a = torch::nn::Linear(torch::nn::LinearOptions(16, hidden));
    b = torch::nn::Linear(torch::nn::LinearOptions(hidden, 4));
    a->to(dev, at::kDouble);
    b->to(dev, at::kDouble);
    model = std::make_unique<ShardedModel>("m", comm, sharding(3));
    auto fa = a, fb = b;
    model->add_unit("a", a.ptr(), [fa](const at::Tensor& x) mutable { return torch::tanh(fa->forward(x)); });
    model->add_unit("b", b.ptr(), [fb](const at::Tensor& x) mutable { return fb->forward(x); });
    opt = std::make_unique<ShardedAdam>(*model, AdamConfig{1e-2, 0.5, 0.999, 1e-8});
  }
  /// One step on this rank's micro-batch x [B, 16] (float64, any device): loss sum(y^2).
  void step(const at::Tensor& x) {
    model->zero_grad();
    model->forward(x).square().sum().backward();
    opt->step();
  }
};

}  // namespace shardgan::test_util
