// BigGAN reference parity: a small BigGAN (residual blocks, conditional SyncBatchNorm with a
// shared class embedding, self-attention, projection D, spectral norm everywhere) trained 3
// steps with hinge loss and 2 D steps per G step at ZeRO stage 3 on N ranks must equal the
// same run at stage 0 on one rank (each rank runs that reference itself on MPI_COMM_SELF),
// in float64. The comparison covers every parameter of G and D, G's EMA, and every buffer:
// spectral-norm u vectors and BatchNorm running statistics.
//
// Tolerance: max|a - b| <= 1e-9 * max|b| per tensor. The runs differ only in summation
// order (per-rank partial sums of gradients and SyncBatchNorm statistics, ~1e-16 relative
// per reduction). Adam with beta1 0 divides by sqrt(v) on its first steps and the power
// iteration normalises, which amplify that to ~1e-12 at most (printed); a wrong reduction
// (a sum where an average belongs) changes the first update by O(1) relative, far above.
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

TrainConfig biggan_config(int stage) {
  TrainConfig c = parse_config(R"(
run: {seed: 11, dir: ""}
data: {source: synthetic, synthetic_size: 72}
train: {steps: 3, global_batch: 12, d_steps: 2, loss: hinge}
model: {arch: biggan, dtype: float64, ch: 4, d_ch: 4, z_dim: 8, shared_dim: 4, n_classes: 10,
        g_attn: 16, d_attn: 16}
optim:
  generator: {type: adam, lr: 1.0e-4, beta1: 0.0, beta2: 0.999}
  discriminator: {type: adam, lr: 4.0e-4, beta1: 0.0, beta2: 0.999}
ema: {enabled: true, decay: 0.9, start_step: 0}
)", "biggan-parity-test", {});
  c.g_sharding.stage = c.d_sharding.stage = stage;
  return c;
}

std::vector<std::pair<std::string, at::Tensor>> ema_of(Trainer& t) {
  EmaSwap swap(*t.ema());
  return t.generator().gather_full_parameters();
}

TEST(BigganParity, Stage3MatchesOneRankStage0InFloat64) {
  MpiCommunicator world(MPI_COMM_WORLD, 300.0), self(MPI_COMM_SELF, 300.0);
  Trainer sharded(biggan_config(3), world);
  Trainer reference(biggan_config(0), self);
  for (int i = 0; i < 3; ++i) {
    StepMetrics a = sharded.train_step(), b = reference.train_step();
    EXPECT_NEAR(a.loss_d, b.loss_d, 1e-9 * std::abs(b.loss_d)) << "step " << i;
    EXPECT_NEAR(a.loss_g, b.loss_g, 1e-9 * std::abs(b.loss_g)) << "step " << i;
    EXPECT_TRUE(std::isfinite(a.loss_d) && std::isfinite(a.loss_g));
  }
  const double g = max_rel_diff(sharded.generator().gather_full_parameters(),
                                reference.generator().gather_full_parameters(), "G");
  const double d = max_rel_diff(sharded.discriminator().gather_full_parameters(),
                                reference.discriminator().gather_full_parameters(), "D");
  const double gb = max_rel_diff(sharded.generator().named_buffers(), reference.generator().named_buffers(), "G buffers");
  const double db = max_rel_diff(sharded.discriminator().named_buffers(), reference.discriminator().named_buffers(), "D buffers");
  const double e = max_rel_diff(ema_of(sharded), ema_of(reference), "G EMA");
  // The buffers include spectral-norm u vectors and BatchNorm running statistics.
  int u = 0, running = 0;
  for (auto& [name, t] : sharded.discriminator().named_buffers()) u += name.find(".u") != std::string::npos;
  for (auto& [name, t] : sharded.generator().named_buffers()) running += name.find("running_mean") != std::string::npos;
  EXPECT_GT(u, 0);
  EXPECT_GT(running, 0);
  // The parameters moved, so equality is not trivial.
  auto init = Trainer(biggan_config(0), self).generator().gather_full_parameters();
  auto now = reference.generator().gather_full_parameters();
  double moved = 0;
  for (size_t i = 0; i < init.size(); ++i) moved = std::max(moved, (init[i].second - now[i].second).abs().max().item<double>());
  EXPECT_GT(moved, 1e-6);
  if (world.rank() == 0) {
    std::printf("[biggan parity] world size %d: max relative diff G %.3g, D %.3g, G buffers %.3g, D buffers %.3g, EMA %.3g (%d u vectors in D)\n",
                world.world_size(), g, d, gb, db, e, u);
  }
}

}  // namespace

}  // namespace SHARDGAN_UNITY_ID
