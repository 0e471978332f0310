// GAN-specific phases of the sharded models: G under no-grad gets no gradients and no
// reduce-scatter; a frozen D yields input gradients only, with no D reduce-scatter, and
// frees its gathered parameters when backward ends.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "shardgan/comm/mpi_communicator.h"
#include "shardgan/train/dcgan.h"

using namespace shardgan;

namespace {

ShardingConfig sharding(int stage) {
  ShardingConfig c;
  c.stage = stage;
  return c;
}

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
  EXPECT_GT(grad_norm(*d), 0.0);
  EXPECT_EQ(d->memory_stats().full_param_bytes_alive, 0);
}

}  // namespace
