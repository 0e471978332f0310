// ShardedAdam equals torch::optim::Adam on the same parameters, in float64, and stepping
// two halves of a flat parameter separately equals stepping it whole.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "shardgan/comm/mpi_communicator.h"
#include "shardgan/optim/sharded_adam.h"
#include "shardgan/sharding/sharded_model.h"
#include "test_util.h"

// The gtest files compile together in batches (tests/CMakeLists.txt): this file's names
// live in a namespace of its own.
namespace SHARDGAN_UNITY_ID {

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

// The promise in this file's header: Adam is elementwise, so stepping a flat parameter cut
// into two units (as two ranks' shards are) gives the same bits as stepping it whole, in
// float32 through the fused AVX kernel (70 = 8 * 8 + 6 elements whole, 42 and 28 in halves:
// the vector tails fall differently) and in float64 through the torch ops, with weight decay
// (L2 and decoupled). A kernel whose tail, or whose vector path, rounds differently from the
// other fails it.
TEST(ShardedAdam, SteppingTwoHalvesEqualsSteppingTheWhole) {
  MpiCommunicator self(MPI_COMM_SELF, 60.0);
  for (at::ScalarType dt : {at::kFloat, at::kDouble}) {
    for (bool adamw : {false, true}) {
      SCOPED_TRACE(std::string(c10::toString(dt)) + (adamw ? " adamw" : " adam"));
      torch::manual_seed(5);
      torch::nn::Linear a(13, 3), b(13, 2);  // 42 and 28 elements
      a->to(dt);
      b->to(dt);
      auto both = std::make_shared<torch::nn::Module>();
      both->register_module("a", a->clone());
      both->register_module("b", b->clone());
      ShardedModel whole("whole", self, sharding(0)), halves("halves", self, sharding(0));
      ShardedUnit& w = whole.add_unit("ab", both, [](const at::Tensor& x) { return x; });
      ShardedUnit& ha = halves.add_unit("a", a->clone(), [](const at::Tensor& x) { return x; });
      ShardedUnit& hb = halves.add_unit("b", b->clone(), [](const at::Tensor& x) { return x; });
      ASSERT_EQ(w.numel(), 70);
      ASSERT_EQ(ha.numel() + hb.numel(), 70);
      AdamConfig cfg{1e-2, 0.9, 0.999, 1e-8, 0.01, adamw};
      ShardedAdam ow(whole, cfg), oh(halves, cfg);
      for (int step = 0; step < 50; ++step) {
        const at::Tensor g = torch::randn({70}, torch::TensorOptions().dtype(dt));
        w.grad_shard().copy_(g);
        ha.grad_shard().copy_(g.narrow(0, 0, 42));
        hb.grad_shard().copy_(g.narrow(0, 42, 28));
        ow.step();
        oh.step();
      }
      const at::Tensor got = torch::cat({ha.shard(), hb.shard()});
      EXPECT_TRUE(torch::equal(w.shard(), got)) << "max diff " << (w.shard() - got).abs().max().item<double>();
      EXPECT_FALSE(torch::equal(w.shard(), torch::cat({a->weight.reshape({-1}), a->bias, b->weight.reshape({-1}), b->bias})))
          << "the parameters did not move";
    }
  }
}

}  // namespace

}  // namespace SHARDGAN_UNITY_ID
