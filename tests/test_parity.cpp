// Reference parity: ZeRO stage 3 on N ranks must give the same G and D as stage 0 on one
// rank with the same global batch. Each rank also runs the one-rank reference itself, on
// MPI_COMM_SELF, and compares.
//
// Tolerance: float64, max|a - b| <= 1e-9 * max|b| per tensor. What differs between the runs
// is only summation order (per-rank partial sums of gradients and SyncBatchNorm
// statistics), about 1e-16 relative per reduction; five Adam steps, whose first steps
// divide m by sqrt(v), amplify that to about 1e-13 at most here (printed below).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "shardgan/comm/mpi_communicator.h"
#include "shardgan/train/trainer.h"
#include "test_util.h"

// The gtest files compile together in batches (tests/CMakeLists.txt): this file's names
// live in a namespace of its own.
namespace SHARDGAN_UNITY_ID {

using namespace shardgan;
using shardgan::test_util::max_rel_diff;

namespace {

TrainConfig small_config(int stage, std::vector<std::string> overrides = {}) {
  TrainConfig c = parse_config(R"(
run: {seed: 7, dir: ""}
data: {source: synthetic, synthetic_size: 72}
train: {steps: 5, global_batch: 12}
model: {dtype: float64, z_dim: 8, g_width: 4, d_width: 4}
)", "parity-test", overrides);
  c.g_sharding.stage = c.d_sharding.stage = stage;
  return c;
}

TEST(Parity, Stage3MatchesOneRankStage0InFloat64) {
  MpiCommunicator world(MPI_COMM_WORLD, 120.0), self(MPI_COMM_SELF, 120.0);
  Trainer sharded(small_config(3), world);
  Trainer reference(small_config(0), self);
  std::vector<StepMetrics> ms, mr;
  for (int i = 0; i < 5; ++i) ms.push_back(sharded.train_step());
  for (int i = 0; i < 5; ++i) mr.push_back(reference.train_step());
  for (int i = 0; i < 5; ++i) {
    EXPECT_NEAR(ms[i].loss_d, mr[i].loss_d, 1e-9 * std::abs(mr[i].loss_d)) << "step " << i;
    EXPECT_NEAR(ms[i].loss_g, mr[i].loss_g, 1e-9 * std::abs(mr[i].loss_g)) << "step " << i;
  }
  const double g = max_rel_diff(sharded.generator().gather_full_parameters(),
                                reference.generator().gather_full_parameters());
  const double d = max_rel_diff(sharded.discriminator().gather_full_parameters(),
                                reference.discriminator().gather_full_parameters());
  const double gb = max_rel_diff(sharded.generator().named_buffers(), reference.generator().named_buffers());
  const double db = max_rel_diff(sharded.discriminator().named_buffers(), reference.discriminator().named_buffers());
  // The parameters did move, so equality is not trivial.
  auto init = Trainer(small_config(0), self).generator().gather_full_parameters();
  EXPECT_GT((init[0].second - reference.generator().gather_full_parameters()[0].second).abs().max().item<double>(), 1e-5);
  if (world.rank() == 0) {
    std::printf("[parity] world size %d: max relative diff G %.3g, D %.3g, G buffers %.3g, D buffers %.3g\n",
                world.world_size(), g, d, gb, db);
  }
}

TEST(Memory, Stage3HoldsOneNthOfStage0ModelStates) {
  MpiCommunicator world(MPI_COMM_WORLD, 120.0);
  // float32: 16 bytes per parameter with Adam.
  const std::vector<std::string> o{"model.dtype=float32", "model.g_width=16"};
  TrainConfig c0 = small_config(0, o), c3 = small_config(3, o);
  Trainer t0(c0, world), t3(c3, world);
  const int n = world.world_size();
  for (auto pick : {0, 1}) {
    auto& m0 = pick ? t0.discriminator() : t0.generator();
    auto& m3 = pick ? t3.discriminator() : t3.generator();
    MemoryStats s0 = t0.memory_stats(m0), s3 = t3.memory_stats(m3);
    const double ideal = static_cast<double>(s0.model_state_bytes()) / n;
    const double pad_bytes = 16.0 * s3.padding_elements;
    EXPECT_EQ(s0.model_state_bytes() % 16, 0);
    EXPECT_GE(s3.model_state_bytes(), ideal - 1e-9);
    EXPECT_LE(s3.model_state_bytes(), 1.05 * ideal + pad_bytes) << m3.name();
    if (world.rank() == 0) {
      std::printf("[memory] %s N=%d: stage0 %lld B, stage3 %lld B (ideal %.0f, padding %lld elements)\n",
                  m3.name().c_str(), n, (long long)s0.model_state_bytes(), (long long)s3.model_state_bytes(),
                  ideal, (long long)s3.padding_elements);
    }
  }
  t3.train_step();
  // After a step no unit holds gathered parameters, but some were gathered during it.
  EXPECT_EQ(t3.memory_stats(t3.generator()).full_param_bytes_alive, 0);
  EXPECT_EQ(t3.memory_stats(t3.discriminator()).full_param_bytes_alive, 0);
  EXPECT_GT(t3.memory_stats(t3.generator()).peak_full_param_bytes, 0);
}

}  // namespace

}  // namespace SHARDGAN_UNITY_ID
