// The optimizer-side collectives, run at 1 to 4 ranks:
// - global-norm clipping over stage-3, stage-1 and stage-0 models equals torch's clip_grad_norm_ on
//   the unsharded gradients, with one all-reduce, and flags a non-finite norm on every rank;
// - the dynamic loss scaler skips exactly the steps in which some rank overflowed, and its
//   scale follows the window/hysteresis rule.
#include <cmath>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "shardgan/comm/mpi_communicator.h"
#include "shardgan/optim/clip_grad.h"
#include "shardgan/optim/loss_scaler.h"
#include "shardgan/optim/sharded_sgd.h"
#include "shardgan/sharding/sharded_model.h"
#include "test_util.h"

// The gtest files compile together in batches (tests/CMakeLists.txt): this file's names
// live in a namespace of its own.
namespace SHARDGAN_UNITY_ID {

using namespace shardgan;
using shardgan::test_util::sharding;

namespace {


std::unique_ptr<ShardedModel> make_model(Communicator& comm, int stage, at::ScalarType dtype, int64_t seed) {
  torch::manual_seed(seed);
  auto m = std::make_unique<ShardedModel>("stage" + std::to_string(stage), comm, sharding(stage));
  for (auto [in, out] : {std::pair{11, 5}, std::pair{5, 3}}) {
    auto lin = torch::nn::Linear(torch::nn::LinearOptions(in, out));
    lin->to(dtype);
    m->add_unit("lin" + std::to_string(in), lin.ptr(), [lin](const at::Tensor& x) mutable { return lin->forward(x); });
  }
  return m;
}

// Full flat gradient of each unit (identical on all ranks, seeded), and this rank's part of it.
std::vector<at::Tensor> set_full_gradients(ShardedModel& m, int64_t seed, double scale) {
  std::vector<at::Tensor> full;
  torch::manual_seed(seed);
  for (auto& u : m.units()) {
    at::Tensor g = torch::randn({u->numel()}, u->shard().options()) * scale;
    at::Tensor padded = torch::zeros({u->padded_numel()}, g.options());
    padded.narrow(0, 0, u->numel()).copy_(g);
    u->grad_shard().copy_(padded.narrow(0, u->shard_offset(), u->shard_numel()));
    full.push_back(g);
  }
  return full;
}

// Collective: the unit's full gradient assembled from the shards.
at::Tensor gather_grad(ShardedUnit& u, Communicator& comm) {
  if (u.stage() == 0) return u.grad_shard().clone();
  at::Tensor full = torch::empty({u.padded_numel()}, u.grad_shard().options());
  comm.all_gather(full, u.grad_shard());
  return full.narrow(0, 0, u.numel());
}

TEST(ClipGradNorm, ShardedEqualsUnshardedClipGradNorm) {
  MpiCommunicator world(MPI_COMM_WORLD, 60.0);
  for (double max_norm : {0.5, 1e6}) {  // clipped, and not
    auto sharded = make_model(world, 3, torch::kDouble, 1);
    auto replicated = make_model(world, 0, torch::kDouble, 2);
    auto stage1 = make_model(world, 1, torch::kDouble, 3);
    auto fa = set_full_gradients(*sharded, 10, 0.3);
    auto fb = set_full_gradients(*replicated, 11, 0.2);
    auto fc = set_full_gradients(*stage1, 12, 0.1);
    // Reference: torch on the unsharded gradients (as parameters with .grad).
    std::vector<at::Tensor> ref;
    for (auto* f : {&fa, &fb, &fc}) {
      for (auto& g : *f) {
        at::Tensor p = torch::zeros_like(g).requires_grad_(true);
        p.mutable_grad() = g.clone();
        ref.push_back(p);
      }
    }
    const double ref_norm = torch::nn::utils::clip_grad_norm_(ref, max_norm);

    world.reset_stats();
    ClipResult r = clip_grad_norm({sharded.get(), replicated.get(), stage1.get()}, max_norm, world);
    EXPECT_EQ(world.stats().all_reduce_calls, 1);
    EXPECT_TRUE(r.finite);
    EXPECT_NEAR(r.total_norm, ref_norm, 1e-13 * ref_norm);
    EXPECT_EQ(r.clipped, max_norm < ref_norm);

    size_t k = 0;
    double worst = 0;
    for (ShardedModel* m : {sharded.get(), replicated.get(), stage1.get()}) {
      for (auto& u : m->units()) {
        at::Tensor mine = gather_grad(*u, world);
        const at::Tensor& want = ref[k++].grad();
        worst = std::max(worst, ((mine - want).abs().max() / want.abs().max()).item<double>());
      }
    }
    EXPECT_LE(worst, 1e-13);
    if (world.rank() == 0) {
      std::printf("  %d rank(s), max_norm %g: norm %.17g vs torch %.17g, grads max rel diff %.3g\n",
                  world.world_size(), max_norm, r.total_norm, ref_norm, worst);
    }
  }
}

TEST(ClipGradNorm, NonFiniteNormIsReportedOnEveryRankAndNothingIsScaled) {
  MpiCommunicator world(MPI_COMM_WORLD, 60.0);
  auto m = make_model(world, 3, torch::kFloat, 3);
  set_full_gradients(*m, 12, 1.0);
  // Only the last rank sees a NaN (in its own shard).
  if (world.rank() == world.world_size() - 1) m->units()[0]->grad_shard()[0] = NAN;
  at::Tensor before = m->units()[1]->grad_shard().clone();
  ClipResult r = clip_grad_norm({m.get()}, 1e-3, world);
  EXPECT_FALSE(r.finite);
  EXPECT_FALSE(r.clipped);
  EXPECT_TRUE(torch::equal(before, m->units()[1]->grad_shard()));
  EXPECT_THROW(clip_grad_norm({m.get()}, 0.0, world), std::invalid_argument);
}

// The scale rule written out independently, step by step, for the test's options.
struct ExpectedScaler {
  double scale;
  int64_t good = 0, hyst;
  ExpectedScaler(double s, int64_t h) : scale(s), hyst(h) {}
  void step(bool overflow, int64_t window, int64_t hysteresis) {
    if (overflow) {
      good = 0;
      if (hyst > 1) --hyst;
      else scale = std::max(1.0, scale / 2);
    } else if (++good == window) {
      good = 0;
      hyst = hysteresis;
      scale *= 2;
    }
  }
};

TEST(DynamicLossScaler, SkipsExactlyTheStepsInWhichAnyRankOverflowed) {
  MpiCommunicator world(MPI_COMM_WORLD, 60.0);
  const int n = world.world_size(), rank = world.rank();
  auto m = make_model(world, 3, torch::kFloat, 4);
  ShardedSgd opt(*m, SgdConfig{0.1});
  LossScalerConfig sc;
  sc.init_scale = 1024;
  sc.growth_interval = 3;
  sc.hysteresis = 2;
  DynamicLossScaler scaler(sc, torch::kHalf);
  ASSERT_TRUE(scaler.enabled());
  ExpectedScaler expect(sc.init_scale, sc.hysteresis);

  // Step s overflows on rank (s % 5) when s % 4 == 1 or s in {6, 7, 8} (a burst that
  // spends the hysteresis), on every rank at s == 20.
  auto overflow_on = [&](int s, int r) {
    if (s == 20) return true;
    if (s == 6 || s == 7 || s == 8) return r == (s % n);
    return s % 4 == 1 && r == (s % 5) % n;
  };
  int64_t steps_taken = 0;
  for (int s = 0; s < 30; ++s) {
    set_full_gradients(*m, 100 + s, scaler.scale());  // "scaled" gradients
    if (overflow_on(s, rank)) m->units()[s % 2]->grad_shard()[0] = (s % 3 == 0) ? NAN : INFINITY;
    bool any = false;
    for (int r = 0; r < n; ++r) any |= overflow_on(s, r);

    at::Tensor before = m->units()[1]->shard().clone();
    world.reset_stats();
    const bool step = scaler.unscale_and_vote({m.get()}, world);
    EXPECT_EQ(world.stats().all_reduce_calls, 1) << "step " << s;
    EXPECT_EQ(step, !any) << "step " << s << " rank " << rank;
    if (step) {
      opt.step();
      ++steps_taken;
      EXPECT_FALSE(torch::equal(before, m->units()[1]->shard()));
    }
    m->zero_grad();
    expect.step(any, sc.growth_interval, sc.hysteresis);
    EXPECT_DOUBLE_EQ(scaler.scale(), expect.scale) << "after step " << s;
  }
  EXPECT_EQ(opt.step_count(), steps_taken);
  EXPECT_EQ(scaler.skipped_steps(), 30 - steps_taken);
  if (rank == 0) std::printf("  %d rank(s): %lld of 30 steps taken, final scale %g\n", n,
                             static_cast<long long>(steps_taken), scaler.scale());
}

TEST(DynamicLossScaler, UnscalesGradientsExactly) {
  MpiCommunicator world(MPI_COMM_WORLD, 60.0);
  auto m = make_model(world, 3, torch::kFloat, 5);
  DynamicLossScaler scaler(LossScalerConfig{}, torch::kHalf);
  set_full_gradients(*m, 7, 1.0);
  std::vector<at::Tensor> want;
  for (auto& u : m->units()) want.push_back(u->grad_shard().clone());
  set_full_gradients(*m, 7, scaler.scale());
  EXPECT_TRUE(scaler.unscale_and_vote({m.get()}, world));
  for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(torch::equal(m->units()[i]->grad_shard(), want[i]));
  EXPECT_TRUE(torch::equal(scaler.scale_loss(torch::ones({1})), torch::full({1}, 65536.0f)));
}

TEST(DynamicLossScaler, InactiveForBFloat16AndFloat32) {
  MpiCommunicator world(MPI_COMM_WORLD, 60.0);
  auto m = make_model(world, 3, torch::kFloat, 6);
  for (auto dt : {torch::kBFloat16, torch::kFloat, torch::kDouble}) {
    DynamicLossScaler scaler(LossScalerConfig{}, dt);
    EXPECT_FALSE(scaler.enabled());
    EXPECT_EQ(scaler.scale(), 1.0);
    set_full_gradients(*m, 8, 1.0);
    at::Tensor before = m->units()[0]->grad_shard().clone();
    world.reset_stats();
    EXPECT_TRUE(scaler.unscale_and_vote({m.get()}, world));
    EXPECT_EQ(world.stats().all_reduce_calls, 0);
    EXPECT_TRUE(torch::equal(before, m->units()[0]->grad_shard()));
  }
}

TEST(DynamicLossScaler, StateRoundTripsAndOptionsAreValidated) {
  DynamicLossScaler a(LossScalerConfig{}, torch::kHalf), b(LossScalerConfig{}, torch::kHalf);
  a.update(true);
  a.update(true);  // hysteresis 2: the second overflow backs off
  a.update(false);
  EXPECT_EQ(a.scale(), 32768.0);
  b.load_state(a.state());
  EXPECT_EQ(b.scale(), a.scale());
  EXPECT_EQ(b.skipped_steps(), 2);
  b.update(true);  // hysteresis is still spent (DeepSpeed refills it only on growth)
  EXPECT_EQ(b.scale(), 16384.0);
  LossScalerConfig bad;
  bad.backoff_factor = 1.5;
  EXPECT_THROW(DynamicLossScaler(bad, torch::kHalf), std::invalid_argument);
  bad = LossScalerConfig{};
  bad.growth_interval = 0;
  EXPECT_THROW(DynamicLossScaler(bad, torch::kHalf), std::invalid_argument);
}

}  // namespace

}  // namespace SHARDGAN_UNITY_ID
