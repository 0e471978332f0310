// ZeRO++ hpZ (ShardedModel::set_secondary_group, sharding.<model>.hpz_partition_size) under
// mpirun at 2 and 4 ranks, secondary groups of 2 consecutive ranks:
//  - a three-unit model with bfloat16 compute and float32 masters, run as a GAN runs D (two
//    forwards and a backward per step, then a no-grad forward after the Adam update): the
//    same bits as without hpZ, plain and with qwZ (a gather only moves bytes, so a wrong or
//    stale block shows); the world all-gathers only each unit's first gather after an
//    update, the rest go through the secondary group;
//  - the secondary blocks' bytes equal the memory estimate's, and after_optimizer_step()
//    drops them;
//  - skipping after_optimizer_step() after an update (the contract's broken case) serves
//    stale parameters: the outputs differ from the reference. This is the case that shows
//    the bit comparison can fail.
//  - set_secondary_group refuses a model below stage 3, naming it.
// Negative control, run once: keeping block (rank + 1) % K instead of block rank in
// keep_secondary fails SameBitsAsTheWorldGather at 4 ranks.
#include <mpi.h>

#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "shardgan/comm/mpi_communicator.h"
#include "shardgan/optim/sharded_adam.h"
#include "shardgan/sharding/memory_estimate.h"
#include "shardgan/sharding/sharded_model.h"
#include "test_util.h"
#include "three_linear_net.h"

// The gtest files compile together in batches (tests/CMakeLists.txt): this file's names
// live in a namespace of its own.
namespace SHARDGAN_UNITY_ID {

using namespace shardgan;

namespace {

constexpr int kGroup = 2;  // ranks per secondary group

struct Net : test_util::ThreeLinearNet {
  Net(Communicator& comm, int qw_bits) : ThreeLinearNet(comm, cfg(qw_bits), "discriminator") {}
  static ShardingConfig cfg(int qw_bits) {
    ShardingConfig s = test_util::sharding(3);
    s.compute_dtype = at::kBFloat16;
    s.quantized_weights_bits = qw_bits;
    return s;
  }
};

std::unique_ptr<Communicator> secondary(MpiCommunicator& world) {
  return world.split(world.rank() / kGroup, world.rank() % kGroup);
}

// Runs `steps` D-like steps on both nets: two forwards (real, fake) and one backward, the
// update, after_optimizer_step (unless `skip_after_step` for the hpZ net), then a no-grad
// forward. Returns whether every output agreed bit for bit.
bool run_steps(Net& ref, Net& hpz, int steps, bool skip_after_step = false) {
  ShardedAdam opt_ref(ref.model, AdamConfig{1e-2}), opt_hpz(hpz.model, AdamConfig{1e-2});
  torch::manual_seed(100 + ref.model.comm().rank());
  bool same = true;
  for (int step = 0; step < steps; ++step) {
    at::Tensor real = torch::randn({6, 37}), fake = torch::randn({6, 37});
    for (Net* n : {&ref, &hpz}) {
      n->model.zero_grad();
      at::Tensor yr = n->model.forward(TensorList{real}).at(0);
      at::Tensor yf = n->model.forward(TensorList{fake}).at(0);
      (yr.to(at::kFloat).square().sum() - yf.to(at::kFloat).sum()).backward();
    }
    opt_ref.step();
    opt_hpz.step();
    ref.model.after_optimizer_step();
    if (!skip_after_step) hpz.model.after_optimizer_step();
    torch::NoGradGuard no_grad;
    at::Tensor ya = ref.model.forward(TensorList{real}).at(0), yb = hpz.model.forward(TensorList{real}).at(0);
    same = same && torch::equal(ya, yb);
  }
  return same;
}

class Hpz : public ::testing::TestWithParam<int> {};  // qwZ bits: 0 or 8

TEST_P(Hpz, SameBitsAsTheWorldGather) {
  MpiCommunicator comm_ref(MPI_COMM_WORLD, 60.0), comm_hpz(MPI_COMM_WORLD, 60.0);
  if (comm_ref.world_size() % kGroup != 0) GTEST_SKIP() << "needs an even world size";
  std::unique_ptr<Communicator> group = secondary(comm_hpz);
  Net ref(comm_ref, GetParam()), hpz(comm_hpz, GetParam());
  hpz.model.set_secondary_group(group.get());
  comm_ref.reset_stats();
  comm_hpz.reset_stats();
  const int steps = 3;
  EXPECT_TRUE(run_steps(ref, hpz, steps)) << "outputs differ from the world gather's";
  for (size_t u = 0; u < 3; ++u) {
    EXPECT_TRUE(torch::equal(ref.model.units()[u]->shard(), hpz.model.units()[u]->shard())) << "unit " << u;
  }
  // Over the world: each unit's first gather of each parameter version (steps + 1 of them),
  // one call each (qwZ's all-gather is one call too). Everything else in the group.
  const int64_t world_gathers = 3 * (steps + 1);
  const CommStats& w = comm_hpz.stats();
  const int64_t world_calls = w.all_gather_calls;
  EXPECT_EQ(world_calls, world_gathers);
  EXPECT_GT(comm_ref.stats().all_gather_calls, world_gathers);
  EXPECT_EQ(group->stats().all_gather_calls + world_calls, comm_ref.stats().all_gather_calls)
      << "every gather the reference made is made once, over the world or in the group";
  EXPECT_EQ(w.reduce_scatter_calls + w.all_to_all_calls,
            comm_ref.stats().reduce_scatter_calls + comm_ref.stats().all_to_all_calls)
      << "gradients still reduce over the world";
}

TEST_P(Hpz, SecondaryBytesMatchTheEstimateAndDropAtTheUpdate) {
  MpiCommunicator comm(MPI_COMM_WORLD, 60.0);
  if (comm.world_size() % kGroup != 0) GTEST_SKIP() << "needs an even world size";
  std::unique_ptr<Communicator> group = secondary(comm);
  Net n(comm, GetParam());
  n.model.set_secondary_group(group.get());
  EXPECT_EQ(n.model.memory_stats().secondary_param_bytes, 0);
  {
    torch::NoGradGuard no_grad;
    n.model.forward(TensorList{torch::randn({2, 37})});
  }
  ModelMemorySpec spec;
  for (auto& u : n.model.units()) spec.unit_numels.push_back(u->numel());
  spec.world_size = comm.world_size();
  spec.stage = 3;
  spec.compute_bytes = 2;
  spec.hpz_partition_size = kGroup;
  const ModelMemoryEstimate e = estimate_model_memory(spec);
  EXPECT_GT(e.secondary_param_bytes, 0);
  EXPECT_EQ(n.model.memory_stats().secondary_param_bytes, e.secondary_param_bytes);
  for (auto& u : n.model.units()) EXPECT_TRUE(u->holds_secondary()) << u->name();
  n.model.after_optimizer_step();
  EXPECT_EQ(n.model.memory_stats().secondary_param_bytes, 0);
  spec.hpz_partition_size = 1;
  EXPECT_EQ(estimate_model_memory(spec).secondary_param_bytes, 0);
}

// The contract: whoever changes the master shards calls after_optimizer_step(). Without it
// the gathers after the update still come from the old version's blocks.
TEST_P(Hpz, SkippingAfterOptimizerStepServesStaleParameters) {
  MpiCommunicator comm_ref(MPI_COMM_WORLD, 60.0), comm_hpz(MPI_COMM_WORLD, 60.0);
  if (comm_ref.world_size() % kGroup != 0) GTEST_SKIP() << "needs an even world size";
  std::unique_ptr<Communicator> group = secondary(comm_hpz);
  Net ref(comm_ref, GetParam()), hpz(comm_hpz, GetParam());
  hpz.model.set_secondary_group(group.get());
  EXPECT_FALSE(run_steps(ref, hpz, 1, /*skip_after_step=*/true));
}

INSTANTIATE_TEST_SUITE_P(QuantizedWeights, Hpz, ::testing::Values(0, 8),
                         [](const auto& info) { return info.param ? "qwZ" : "plain"; });

TEST(HpzRefusal, BelowStage3NamesTheModel) {
  MpiCommunicator comm(MPI_COMM_WORLD, 60.0);
  std::unique_ptr<Communicator> group = comm.split(0, comm.rank());
  ShardedModel m("generator", comm, test_util::sharding(2));
  try {
    m.set_secondary_group(group.get());
    ADD_FAILURE() << "stage 2 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("model 'generator'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("stage 3"), std::string::npos) << e.what();
  }
}

}  // namespace

}  // namespace SHARDGAN_UNITY_ID
