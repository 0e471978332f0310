#pragma once
// A three-unit model of linear layers (37 -> 64 -> 64 -> 5, tanh between), built from seed 3
// on every rank: the small stage-3 model the gather tests compare bit for bit.
#include <string>

#include <torch/torch.h>

#include "shardgan/sharding/sharded_model.h"

namespace shardgan::test_util {

struct ThreeLinearNet {
  ThreeLinearNet(Communicator& comm, const ShardingConfig& cfg, const std::string& name = "generator")
      : model(name, comm, cfg) {
    torch::manual_seed(3);
    a = torch::nn::Linear(37, 64);
    b = torch::nn::Linear(64, 64);
    c = torch::nn::Linear(64, 5);
    model.add_unit("a", a.ptr(), [this](const at::Tensor& x) { return torch::tanh(a->forward(x)); });
    model.add_unit("b", b.ptr(), [this](const at::Tensor& x) { return torch::tanh(b->forward(x)); });
    model.add_unit("c", c.ptr(), [this](const at::Tensor& x) { return c->forward(x); });
  }
  torch::nn::Linear a{nullptr}, b{nullptr}, c{nullptr};
  ShardedModel model;
};

}  // namespace shardgan::test_util
