// Hybrid sharding (HSDP, issue 23): N ranks as R replica groups of N / R, sharded inside a
// group and replicated across groups, must train exactly like stage 0 on one rank with the
// same global batch; a checkpoint saved with R groups resumes with another R and N.
//
// Tolerance: float64, max|a - b| <= 1e-9 * max|b| per tensor, as in test_parity. HSDP
// changes only the summation order of the gradient average (a reduce-scatter over G ranks,
// then an all-reduce over R groups: about 1e-16 relative per reduction) and of
// SyncBatchNorm's statistics; five Adam steps amplify that to about 1e-13 (printed below).
// A broken HSDP reduction (the cross-group all-reduce left out: each group keeps its own
// half-batch gradient) differs by about 1e-2 relative, so the bound separates the two.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "shardgan/comm/hybrid_communicator.h"
#include "shardgan/comm/mpi_communicator.h"
#include "shardgan/train/trainer.h"
#include "test_util.h"

// The gtest files compile together in batches (tests/CMakeLists.txt): this file's names
// live in a namespace of its own.
namespace SHARDGAN_UNITY_ID {

using namespace shardgan;
using shardgan::test_util::max_rel_diff;

namespace {

TrainConfig small_config(int stage, int replicate, const std::string& optim, std::vector<std::string> overrides = {}) {
  overrides.push_back("optim.generator.type=" + optim);
  overrides.push_back("optim.discriminator.type=" + optim);
  if (optim == "sgd") {
    overrides.push_back("optim.generator.momentum=0.9");
    overrides.push_back("optim.discriminator.momentum=0.9");
  }
  TrainConfig c = parse_config(R"(
run: {seed: 7, dir: ""}
data: {source: synthetic, synthetic_size: 72}
train: {steps: 5, global_batch: 24, micro_batches: 2, d_steps: 2, grad_clip: 0.5}
model: {dtype: float64, z_dim: 8, g_width: 4, d_width: 4}
)", "hsdp-test", overrides);
  c.g_sharding.stage = c.d_sharding.stage = stage;
  c.g_replicate_degree = c.d_replicate_degree = replicate;
  return c;
}

// The replica degrees > 1 that divide the world size.
std::vector<int> replica_degrees(int n) {
  std::vector<int> r;
  for (int d = 2; d <= n; ++d) {
    if (n % d == 0) r.push_back(d);
  }
  return r;
}

void expect_same_models(Trainer& a, Trainer& b, const std::string& what, double bound = 1e-9) {
  max_rel_diff(a.generator().gather_full_parameters(), b.generator().gather_full_parameters(), what + " G", bound);
  max_rel_diff(a.discriminator().gather_full_parameters(), b.discriminator().gather_full_parameters(), what + " D", bound);
  max_rel_diff(a.generator().named_buffers(), b.generator().named_buffers(), what + " G buffers", bound);
  max_rel_diff(a.discriminator().named_buffers(), b.discriminator().named_buffers(), what + " D buffers", bound);
}

class Hsdp : public ::testing::TestWithParam<std::tuple<int, std::string>> {};

TEST_P(Hsdp, MatchesOneRankStage0InFloat64) {
  MpiCommunicator world(MPI_COMM_WORLD, 120.0), self(MPI_COMM_SELF, 120.0);
  const auto [stage, optim] = GetParam();
  if (world.world_size() == 1) GTEST_SKIP() << "hybrid sharding needs 2 or more ranks";
  Trainer reference(small_config(0, 1, optim), self);
  std::vector<StepMetrics> mr;
  for (int i = 0; i < 5; ++i) mr.push_back(reference.train_step());
  for (int R : replica_degrees(world.world_size())) {
    const std::string what = "stage " + std::to_string(stage) + " " + optim + " R=" + std::to_string(R);
    Trainer hsdp(small_config(stage, R, optim), world);
    // The model is sharded over its group of N / R ranks, and the group is a real one.
    Communicator& gc = hsdp.generator().comm();
    ASSERT_EQ(gc.world_size(), world.world_size() / R) << what;
    ASSERT_EQ(gc.replicate_degree(), R) << what;
    ASSERT_EQ(gc.replica_rank(), world.rank() / gc.world_size()) << what;
    const auto& u = *hsdp.generator().units()[0];
    EXPECT_EQ(u.shard_numel(), (u.numel() + gc.world_size() - 1) / gc.world_size()) << what;
    int64_t replicate_bytes = 0, world_bytes = 0;
    // Gradient shards cross groups once per optimizer update, whatever the micro-batches
    // and the D step's two backwards: G's shards once, D's once per D step (float64).
    auto shard_numel = [](ShardedModel& mdl) {
      int64_t s = 0;
      for (auto& up : mdl.units()) s += up->shard_numel();
      return s;
    };
    const int64_t per_step = 8 * (shard_numel(hsdp.generator()) + 2 * shard_numel(hsdp.discriminator()));
    for (int i = 0; i < 5; ++i) {
      StepMetrics m = hsdp.train_step();
      EXPECT_EQ(m.comm_bytes_replicate, per_step) << what << " step " << i << ": one all-reduce per update";
      EXPECT_NEAR(m.loss_d, mr[i].loss_d, 1e-9 * std::abs(mr[i].loss_d)) << what << " step " << i;
      EXPECT_NEAR(m.loss_g, mr[i].loss_g, 1e-9 * std::abs(mr[i].loss_g)) << what << " step " << i;
      EXPECT_NEAR(m.grad_norm_d, mr[i].grad_norm_d, 1e-9 * mr[i].grad_norm_d) << what << " step " << i;
      replicate_bytes += m.comm_bytes_replicate;
      world_bytes += m.comm_bytes_world;
    }
    EXPECT_EQ(replicate_bytes, 5 * per_step) << what;
    EXPECT_GT(world_bytes, 0) << what << ": SyncBatchNorm runs over the world";
    expect_same_models(hsdp, reference, what);
    // Every replica group holds the same shard, bit for bit.
    for (ShardedModel* mdl : {&hsdp.generator(), &hsdp.discriminator()}) {
      for (auto& up : mdl->units()) {
        at::Tensor s = up->master_shard().clone(), mx = s.clone(), mn = s.clone();
        auto& h = static_cast<HybridCommunicator&>(mdl->comm());
        h.replicate_group().all_reduce(mx, ReduceOp::kMax);
        mn.neg_();
        h.replicate_group().all_reduce(mn, ReduceOp::kMax);
        EXPECT_TRUE(mx.equal(s) && mn.neg().equal(s)) << what << ": " << up->name() << " differs across groups";
      }
    }
  }
  if (world.rank() == 0) {
    std::printf("[hsdp] world size %d, stage %d, %s: parity within 1e-9 for R in {", world.world_size(), stage,
                optim.c_str());
    for (int R : replica_degrees(world.world_size())) std::printf(" %d", R);
    std::printf(" }\n");
  }
}

INSTANTIATE_TEST_SUITE_P(StagesAndOptimizers, Hsdp,
                         ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Values("adam", "sgd")));

// Saved with R = N groups (each rank a full replica), resumed with R = 1 (plain stage 3
// over every rank) and on one rank at stage 0: the same parameters and optimizer state. And
// resumed with the same layout, two more steps equal the uninterrupted run bit for bit.
TEST(HsdpCheckpoint, ResumesWithAnotherReplicaDegreeAndBitForBit) {
  MpiCommunicator world(MPI_COMM_WORLD, 120.0), self(MPI_COMM_SELF, 120.0);
  const int n = world.world_size();
  if (n == 1) GTEST_SKIP() << "hybrid sharding needs 2 or more ranks";
  const int R = replica_degrees(n).back();
  namespace fs = std::filesystem;
  const std::string dir = "/tmp/shardgan-hsdp-" + std::to_string(::getppid());
  if (world.rank() == 0) fs::remove_all(dir);
  world.barrier();
  TrainConfig c = small_config(3, R, "adam", {"run.dir=" + dir});
  Trainer a(c, world);
  a.train_step();
  a.train_step();
  const std::string ckpt = a.save();
  a.train_step();
  a.train_step();
  // Only replica group 0 wrote parameter shards; the others wrote their RNG state only.
  Trainer same(c, world);
  same.resume(ckpt);
  same.train_step();
  same.train_step();
  expect_same_models(same, a, "same layout, bit for bit", 0.0);
  Trainer plain(small_config(3, 1, "adam", {"run.dir=" + dir}), world);
  plain.resume(ckpt);
  Trainer one(small_config(0, 1, "adam", {"run.dir=" + dir}), self);
  one.resume(ckpt);
  EXPECT_EQ(plain.step(), 2);
  EXPECT_EQ(one.step(), 2);
  expect_same_models(plain, one, "R=1 on N ranks against one rank", 0.0);
  plain.train_step();
  one.train_step();
  expect_same_models(plain, one, "a step after the resume");
  world.barrier();
  if (world.rank() == 0) fs::remove_all(dir);
}

// Replica groups follow the launcher's nodes when they can, and bad degrees are refused.
TEST(HsdpLayoutTest, GroupsFollowNodesAndRefuseBadDegrees) {
  MpiCommunicator world(MPI_COMM_WORLD, 60.0);
  const int n = world.world_size(), r = world.rank();
  if (n < 2 || n % 2 != 0) GTEST_SKIP() << "needs an even world size";
  // Two "nodes" of n / 2 consecutive ranks, as Open MPI's --map-by slot gives.
  const std::pair<int, int> two_nodes{r % (n / 2), n / 2};
  HsdpLayout l = hsdp_layout(world, 0, two_nodes, "k");
  EXPECT_EQ(l.replicate_degree, 2);
  EXPECT_EQ(l.group_size, n / 2);
  EXPECT_EQ(l.group, r / (n / 2));
  EXPECT_TRUE(l.by_node);
  l = hsdp_layout(world, n, two_nodes, "k");
  EXPECT_EQ(l.by_node, n == 2);  // n groups of one rank: nodes only when a node holds one rank
  EXPECT_EQ(l.group, r);
  if (n >= 4) {
    // Round-robin placement (--map-by node): node = rank % 2, so a node's ranks are not
    // consecutive: auto refuses. (With 2 ranks, round robin and blocks coincide.)
    const std::pair<int, int> round_robin{r / 2, n / 2};
    EXPECT_THROW(hsdp_layout(world, 0, round_robin, "k"), std::invalid_argument);
  }
  EXPECT_THROW(hsdp_layout(world, 0, {-1, -1}, "k"), std::invalid_argument);
  EXPECT_THROW(hsdp_layout(world, n + 1, two_nodes, "k"), std::invalid_argument);
  try {
    hsdp_layout(world, n + 1, two_nodes, "sharding.generator.replicate_degree");
    ADD_FAILURE() << "no throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("sharding.generator.replicate_degree"), std::string::npos) << e.what();
  }
}

// srun's SLURM_STEP_TASKS_PER_NODE: "2(x3),1" = 2 tasks on nodes 0-2, 1 on node 3.
TEST(HsdpLayoutTest, ReadsSlurmTasksPerNode) {
  EXPECT_EQ(slurm_tasks_on_node("2", 0), 2);
  EXPECT_EQ(slurm_tasks_on_node("2", 1), -1);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 0), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 2), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 3), 1);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 4), -1);
  EXPECT_EQ(slurm_tasks_on_node("4,3(x2)", 2), 3);
  EXPECT_EQ(slurm_tasks_on_node(nullptr, 0), -1);
  EXPECT_EQ(slurm_tasks_on_node("2(x", 0), -1);
  EXPECT_EQ(slurm_tasks_on_node("x", 0), -1);
  EXPECT_EQ(slurm_tasks_on_node("2", -1), -1);
}

TEST(HsdpConfig, RefusesStageZeroAndNccl) {
  EXPECT_THROW(parse_config("sharding: {generator: {stage: 0, replicate_degree: 2}}\n", "t", {}), ConfigError);
  EXPECT_THROW(parse_config("sharding: {generator: {replicate_degree: 0.5}}\n", "t", {}), ConfigError);
  try {
    parse_config("sharding: {discriminator: {replicate_degree: 2}}\nrun: {device: cuda}\n", "t", {});
    ADD_FAILURE() << "replicate_degree 2 with NCCL (the default on cuda) was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("replicate_degree"), std::string::npos) << e.what();
  }
  EXPECT_EQ(parse_config("sharding: {generator: {replicate_degree: auto}}\n", "t", {}).g_replicate_degree, 0);
  EXPECT_EQ(parse_config("sharding: {discriminator: {replicate_degree: 4}}\n", "t", {}).d_replicate_degree, 4);
}

}  // namespace

}  // namespace SHARDGAN_UNITY_ID
