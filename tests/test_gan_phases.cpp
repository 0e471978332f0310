// GAN-specific phases of the sharded models: G under no-grad gets no gradients and no
// reduce-scatter; a frozen D yields input gradients only, with no D reduce-scatter, and
// frees its gathered parameters when backward ends.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "shardgan/comm/mpi_communicator.h"
#include "shardgan/optim/sharded_adam.h"
#include "shardgan/sharding/wrap_policy.h"
#include "shardgan/models/dcgan.h"
#include "test_util.h"

// The gtest files compile together in batches (tests/CMakeLists.txt): this file's names
// live in a namespace of its own.
namespace SHARDGAN_UNITY_ID {

using namespace shardgan;
using shardgan::test_util::sharding;

namespace {


DcganConfig tiny() {
  DcganConfig c;
  c.z_dim = 8;
  c.g_width = 4;
  c.d_width = 4;
  c.dtype = at::kDouble;
  return c;
}

double grad_norm(ShardedModel& m) {
  double s = 0;
  for (auto& u : m.units()) s += u->grad_shard().norm().item<double>();
  return s;
}

TEST(GanPhases, NoGradForwardProducesNoGradientsOrReduction) {
  MpiCommunicator comm(MPI_COMM_WORLD, 60.0);
  auto g = build_generator(tiny(), comm, sharding(3), 1);
  comm.reset_stats();
  torch::NoGradGuard no_grad;
  at::Tensor out = g->forward(torch::randn({2, 8, 1, 1}, torch::kDouble));
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{2, 1, 32, 32}));
  EXPECT_EQ(comm.stats().reduce_scatter_calls, 0);
  EXPECT_EQ(comm.stats().all_gather_calls, 4);  // one per unit
  EXPECT_EQ(g->memory_stats().full_param_bytes_alive, 0);
}

TEST(GanPhases, FrozenDiscriminatorGivesInputGradientsOnly) {
  MpiCommunicator comm(MPI_COMM_WORLD, 60.0);
  auto d = build_discriminator(tiny(), comm, sharding(3), 2);
  d->set_requires_grad(false);
  at::Tensor x = torch::randn({4, 1, 32, 32}, torch::kDouble).requires_grad_(true);
  comm.reset_stats();
  d->forward(x).sum().backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_GT(x.grad().abs().sum().item<double>(), 0.0);
  EXPECT_EQ(comm.stats().reduce_scatter_calls, 0);
  EXPECT_EQ(comm.stats().all_gather_calls, 8);  // 4 units, gathered for forward and backward
  EXPECT_EQ(grad_norm(*d), 0.0);
  EXPECT_EQ(d->memory_stats().full_param_bytes_alive, 0);
  for (auto& u : d->units()) {
    for (auto& s : u->slots()) EXPECT_FALSE(s.param.grad().defined()) << s.name;
  }
}

TEST(GanPhases, TrainableDiscriminatorReduceScattersEachUnitOnceForTwoForwards) {
  MpiCommunicator comm(MPI_COMM_WORLD, 60.0);
  auto d = build_discriminator(tiny(), comm, sharding(3), 2);
  comm.reset_stats();
  at::Tensor real = torch::randn({4, 1, 32, 32}, torch::kDouble);
  at::Tensor fake = torch::randn({4, 1, 32, 32}, torch::kDouble);
  (d->forward(real).mean() - d->forward(fake).mean()).backward();
  EXPECT_EQ(comm.stats().reduce_scatter_calls, 4);  // one per unit, not per forward
  // Reduce-scatters overlap the rest of backward, at most two in flight, all done when
  // backward() returns.
  EXPECT_EQ(d->max_reduces_in_flight(), ShardedModel::kMaxReducesInFlight);
  for (auto& u : d->units()) EXPECT_FALSE(u->reduce_in_flight()) << u->name();
  EXPECT_GT(grad_norm(*d), 0.0);
  EXPECT_EQ(d->memory_stats().full_param_bytes_alive, 0);
}

}  // namespace

namespace {

torch::nn::Sequential chain() {
  namespace nn = torch::nn;
  torch::manual_seed(4);
  nn::Sequential s(nn::Conv2d(nn::Conv2dOptions(1, 4, 3).padding(1)), nn::ReLU(),
                   nn::Conv2d(nn::Conv2dOptions(4, 8, 3).padding(1)), nn::ReLU(),
                   nn::ConvTranspose2d(nn::ConvTranspose2dOptions(8, 2, 2).stride(2)), nn::Flatten(),
                   nn::Linear(2 * 16 * 16, 3));
  s->to(torch::kDouble);
  return s;
}

TEST(WrapPolicy, ByTypeAndBySizeGiveTheSameFunction) {
  MpiCommunicator comm(MPI_COMM_WORLD, 60.0);
  at::Tensor x = torch::randn({2, 1, 8, 8}, torch::kDouble);
  // Reference: the plain Sequential, unsharded.
  at::Tensor want = chain()->forward(x);
  ShardedModel by_type("m", comm, sharding(3)), by_size("m", comm, sharding(3)), whole("m", comm, sharding(3));
  EXPECT_EQ(wrap_sequential(by_type, chain(), WrapPolicy{{"Conv2d", "Linear"}, 0}), 3u);  // Conv2d starts units
  EXPECT_EQ(by_type.units()[0]->name(), "u0-1");
  EXPECT_EQ(by_type.units()[1]->name(), "u2-5");
  // Sizes 40, 0, 296 | 0, 66, 0, 1539: a unit closes once it reaches 300 elements.
  EXPECT_EQ(wrap_sequential(by_size, chain(), WrapPolicy{{}, 300}), 2u);
  EXPECT_EQ(by_size.units()[0]->name(), "u0-2");
  EXPECT_EQ(wrap_sequential(whole, chain(), WrapPolicy{}), 1u);
  for (ShardedModel* m : {&by_type, &by_size, &whole}) {
    at::Tensor got = m->forward(x);
    EXPECT_TRUE(torch::allclose(got, want, 1e-12, 1e-12));
  }
}

}  // namespace

namespace {

TEST(GanPhases, GatherDOncePolicyGathersEachUnitOncePerStep) {
  MpiCommunicator comm(MPI_COMM_WORLD, 60.0);
  ShardingConfig keep = sharding(3);
  keep.reshard_after_forward = false;  // "gather D once": real and fake share one gather
  auto d = build_discriminator(tiny(), comm, keep, 2);
  comm.reset_stats();
  at::Tensor real = torch::randn({4, 1, 32, 32}, torch::kDouble);
  at::Tensor fake = torch::randn({4, 1, 32, 32}, torch::kDouble);
  (d->forward(real).mean() - d->forward(fake).mean()).backward();
  EXPECT_EQ(comm.stats().all_gather_calls, 4);  // once per unit (the default gathers 12 times)
  EXPECT_EQ(comm.stats().reduce_scatter_calls, 4);
  EXPECT_EQ(d->memory_stats().full_param_bytes_alive, 0);  // freed after its reduction
}

TEST(GanPhases, FrozenParameterInsideAUnitStaysUnchanged) {
  MpiCommunicator comm(MPI_COMM_WORLD, 60.0);
  namespace nn = torch::nn;
  torch::manual_seed(8);
  nn::Sequential seq(nn::Linear(6, 5), nn::Tanh(), nn::Linear(5, 1));
  seq->to(torch::kDouble);
  seq[0]->as<nn::Linear>()->bias.requires_grad_(false);  // frozen before wrapping
  ShardedModel m("m", comm, sharding(3));
  wrap_sequential(m, seq, WrapPolicy{});
  ASSERT_EQ(m.units().size(), 1u);
  auto before = m.gather_full_parameters();
  ShardedAdam opt(m, AdamConfig{1e-2, 0.9, 0.999, 1e-8});
  for (int i = 0; i < 3; ++i) {
    m.forward(torch::randn({4, 6}, torch::kDouble)).pow(2).mean().backward();
    opt.step();
    m.after_optimizer_step();
    m.zero_grad();
  }
  auto after = m.gather_full_parameters();
  for (size_t i = 0; i < after.size(); ++i) {
    const bool frozen = after[i].first == "u0-2.0.bias";
    EXPECT_EQ(torch::equal(before[i].second, after[i].second), frozen) << after[i].first;
  }
}

}  // namespace

}  // namespace SHARDGAN_UNITY_ID
