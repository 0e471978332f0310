// pix2pix (model.arch: pix2pix; Isola et al. 2017): the U-Net G and PatchGAN D, whose skip
// tensors cross sharding units.
//
// UNetParity: G at 32x32 (5 levels) in float64 on N ranks, at ZeRO stages 0-3, with and
// without activation checkpointing, one SGD step (lr 1, so the parameter change is the
// gradient) on the loss mean_b sum(G(A)_b * W_b) over a global batch of 8. The reference is
// a plain-autograd U-Net written here from the paper's appendix and the authors' code
// (conv2d, conv_transpose2d, batch_norm over the global batch, leaky_relu, relu, tanh and
// the skip concatenations, on the gathered initial parameters) that shares no code with
// the model, the sharding or the optimizer. What differs is the order of float64
// additions (per-rank partial sums, reductions): the bound is 1e-9 of the largest gradient
// element per tensor. Negative control (in the test): the reference with the skip of
// level 1 dropped (zeros in its place) must leave the bound.
//
// TrainerParity: 3 pix2pix steps (BCE + 100 L1, Adam, dropout on in 3 decoder units) on N
// ranks at stages 0-3, with and without activation checkpointing, against stage 0 on one
// rank (MPI_COMM_SELF), within 1e-9: the dropout masks follow the sample, not the rank.
//
// SkipLifetime (pix2pix_skip_lifetime): with activation checkpointing, the bytes alive
// after G's forward are the skips e_i once and the decoder outputs u_i once (what the next
// units keep as inputs) plus each unit's replay state (generator state, buffer snapshot),
// and backward replays every unit exactly once. Negative control:
// a program that hands the decoder a copy of each skip must exceed the bound.
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <c10/util/ThreadLocalDebugInfo.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "shardgan/comm/mpi_communicator.h"
#include "shardgan/eval/image_quality.h"
#include "shardgan/models/pix2pix.h"
#include "shardgan/optim/sharded_sgd.h"
#include "shardgan/sharding/activation_checkpoint.h"
#include "shardgan/sharding/deferred.h"
#include "shardgan/train/trainer.h"
#include "test_util.h"

// The gtest files compile together in batches (tests/CMakeLists.txt): this file's names
// live in a namespace of its own.
namespace SHARDGAN_UNITY_ID {

using namespace shardgan;
using shardgan::test_util::max_rel_diff;

namespace {

using Named = std::vector<std::pair<std::string, at::Tensor>>;
constexpr int64_t kGlobal = 8;

Pix2PixConfig small_config(int64_t dropout_blocks) {
  Pix2PixConfig c;
  c.image_size = 32;
  c.g_width = 4;
  c.d_width = 4;
  c.d_layers = 2;
  c.dropout_blocks = dropout_blocks;
  return c;
}

at::Tensor param(const Named& p, const std::string& name) {
  for (auto& [n, t] : p) {
    if (n == name) return t;
  }
  throw std::out_of_range("no parameter " + name);
}

// The plain-autograd U-Net on the global batch; `drop_skip` >= 0 replaces that level's skip
// with zeros (the negative control).
at::Tensor reference_unet(const Named& p, const at::Tensor& a, int64_t L, int64_t drop_skip = -1) {
  auto bn = [&](const at::Tensor& x, const std::string& prefix) {
    return at::batch_norm(x, param(p, prefix + ".weight"), param(p, prefix + ".bias"), {}, {}, true, 0.1, 1e-5, false);
  };
  std::vector<at::Tensor> e;
  at::Tensor h = a;
  for (int64_t i = 0; i < L; ++i) {
    const std::string u = "enc" + std::to_string(i);
    at::Tensor x = i == 0 ? h : at::leaky_relu(h, 0.2);
    x = at::conv2d(x, param(p, u + (i == 0 ? ".0.weight" : ".1.weight")), {}, 2, 1);
    if (i > 0 && i < L - 1) x = bn(x, u + ".2");
    e.push_back(x);
    h = x;
  }
  at::Tensor up;
  for (int64_t i = L - 1; i >= 0; --i) {
    const std::string u = "dec" + std::to_string(i);
    at::Tensor skip = i == drop_skip ? torch::zeros_like(e[i]) : e[i];
    at::Tensor x = i == L - 1 ? skip : at::cat({skip, up}, 1);
    x = at::relu(x);
    x = at::conv_transpose2d(x, param(p, u + ".1.weight"), i == 0 ? param(p, u + ".1.bias") : at::Tensor(), 2, 1);
    up = i == 0 ? at::tanh(x) : bn(x, u + ".2");
  }
  return up;
}

at::Tensor local_rows(const at::Tensor& global, const Communicator& c) {
  const int64_t n = global.size(0) / c.world_size();
  return global.narrow(0, c.rank() * n, n);
}

TEST(Pix2PixModel, ParameterCountsOfThePaper) {
  // The authors' unet_256 (ngf 64) and basic D (ndf 64, 3 layers) on 3-channel A and B:
  // their print_network reports 54.414 M and 2.769 M (exactly 54,413,955 and 2,768,705 by
  // a re-typed copy of networks.py counted with PyTorch).
  MpiCommunicator self(MPI_COMM_SELF, 300.0);
  Pix2PixConfig c;
  c.image_size = 256;
  c.in_channels = c.channels = 3;
  auto family = make_pix2pix_family(c);
  int64_t g = 0, d = 0;
  for (int64_t n : unit_numels(family->generator(self))) g += n;
  for (int64_t n : unit_numels(family->discriminator(self))) d += n;
  EXPECT_EQ(g, 54413955);
  EXPECT_EQ(d, 2768705);
  EXPECT_EQ(unit_numels(family->generator(self)).size(), 16u);  // 8 encoder and 8 decoder units
}

TEST(Pix2PixModel, LatentsAreSeedsThatTruncationRefuses) {
  auto family = make_pix2pix_family(small_config(0));
  EXPECT_FALSE(family->gaussian_latents());
  at::Generator gen = at::detail::createCPUGenerator(3);
  EXPECT_EQ(family->sample_truncated_latents(4, gen, at::kFloat, 0).size(0), 4);
  try {
    family->sample_truncated_latents(4, gen, at::kFloat, 1.0);
    ADD_FAILURE() << "truncated pix2pix seeds";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("pix2pix"), std::string::npos) << e.what();
  }
}

TEST(Pix2PixModel, TestDropoutFollowsTheKey) {
  // In eval mode, z (the dropout seeds) changes G's output only with model.test_dropout.
  MpiCommunicator self(MPI_COMM_SELF, 300.0);
  torch::manual_seed(2);
  const at::Tensor a = torch::rand({2, 1, 32, 32}, torch::kDouble) * 2 - 1;
  for (bool test_dropout : {true, false}) {
    Pix2PixConfig c = small_config(3);
    c.test_dropout = test_dropout;
    auto g = build_sharded_model(make_pix2pix_family(c)->generator(self), self, test_util::sharding(0), 7, at::kDouble);
    g->train(false);
    torch::NoGradGuard no_grad;
    const at::Tensor o1 = g->forward({torch::tensor({1, 2}, torch::kLong), a}).at(0);
    const at::Tensor o2 = g->forward({torch::tensor({3, 4}, torch::kLong), a}).at(0);
    EXPECT_EQ(torch::equal(o1, o2), !test_dropout) << "test_dropout " << test_dropout;
  }
}

TEST(Pix2PixParity, UNetMatchesPlainAutogradReference) {
  MpiCommunicator world(MPI_COMM_WORLD, 300.0);
  auto family = make_pix2pix_family(small_config(0));
  torch::manual_seed(5);
  const at::Tensor a = torch::rand({kGlobal, 1, 32, 32}, torch::kDouble) * 2 - 1;
  const at::Tensor w = torch::randn({kGlobal, 1, 32, 32}, torch::kDouble);
  const at::Tensor z = torch::randint(1000, {kGlobal}, torch::kLong);
  double worst = 0, control = 1e300;
  for (int stage = 0; stage <= 3; ++stage) {
    for (bool ac : {false, true}) {
      ShardingConfig sc = test_util::sharding(stage);
      sc.activation_checkpointing = ac;
      auto g = build_sharded_model(family->generator(world), world, sc, 7, at::kDouble);
      const Named p0 = g->gather_full_parameters();
      SgdConfig sgd;
      sgd.lr = 1.0;
      ShardedSgd opt(*g, sgd);
      at::Tensor out = g->forward({local_rows(z, world), local_rows(a, world)}).at(0);
      ((out * local_rows(w, world)).sum() / out.size(0)).backward();
      opt.step();
      g->after_optimizer_step();
      const Named p1 = g->gather_full_parameters();
      Named grad;
      for (size_t i = 0; i < p0.size(); ++i) grad.emplace_back(p0[i].first, p0[i].second - p1[i].second);
      // The reference, on leaves holding the same initial values.
      Named leaves;
      std::vector<at::Tensor> xs;
      for (auto& [n, t] : p0) {
        leaves.emplace_back(n, t.detach().clone().requires_grad_(true));
        xs.push_back(leaves.back().second);
      }
      auto ref_grads = [&](int64_t drop) {
        at::Tensor o = reference_unet(leaves, a, 5, drop);
        auto gs = torch::autograd::grad({(o * w).sum() / kGlobal}, xs);
        Named r;
        for (size_t i = 0; i < gs.size(); ++i) r.emplace_back(p0[i].first, gs[i]);
        return r;
      };
      const std::string what = "stage " + std::to_string(stage) + (ac ? " +AC" : "");
      worst = std::max(worst, max_rel_diff(grad, ref_grads(-1), what));
      if (stage == 0 && !ac) {  // negative control: a dropped skip must leave the bound
        const Named broken = ref_grads(1);
        double most = 0;
        for (size_t i = 0; i < grad.size(); ++i) {
          most = std::max(most, ((grad[i].second - broken[i].second).abs().max() /
                                 broken[i].second.abs().max().clamp_min(1e-300)).item<double>());
        }
        control = most;
        EXPECT_GT(control, 1e-6) << "the reference without the level-1 skip agrees: the check cannot fail";
      }
    }
  }
  if (world.rank() == 0) {
    std::printf("[pix2pix U-Net parity] world size %d: max relative gradient diff %.3g over stages 0-3 with and "
                "without activation checkpointing (bound 1e-9); negative control (skip 1 dropped) %.3g\n",
                world.world_size(), worst, control);
  }
}

TrainConfig trainer_config(int stage, bool ac) {
  TrainConfig c = parse_config(R"(
run: {seed: 13, dir: ""}
data: {source: synthetic, synthetic_size: 48}
train: {steps: 3, global_batch: 8}
model: {arch: pix2pix, dtype: float64, image_size: 32, g_width: 4, d_width: 4, d_layers: 2}
optim:
  generator: {type: adam, lr: 2.0e-4, beta1: 0.5, beta2: 0.999}
  discriminator: {type: adam, lr: 2.0e-4, beta1: 0.5, beta2: 0.999}
)", "pix2pix-parity-test", {});
  c.g_sharding.stage = c.d_sharding.stage = stage;
  c.g_sharding.activation_checkpointing = c.d_sharding.activation_checkpointing = ac;
  return c;
}

TEST(Pix2PixParity, TrainerMatchesOneRankStage0) {
  MpiCommunicator world(MPI_COMM_WORLD, 300.0), self(MPI_COMM_SELF, 300.0);
  Trainer reference(trainer_config(0, false), self);
  std::vector<StepMetrics> ref;
  for (int i = 0; i < 3; ++i) ref.push_back(reference.train_step());
  EXPECT_GT(ref.back().loss_l1, 0);
  const Named rg = reference.generator().gather_full_parameters();
  const Named rd = reference.discriminator().gather_full_parameters();
  double worst = 0;
  for (int stage = 0; stage <= 3; ++stage) {
    for (bool ac : {false, true}) {
      Trainer t(trainer_config(stage, ac), world);
      const std::string what = "stage " + std::to_string(stage) + (ac ? " +AC" : "");
      for (int i = 0; i < 3; ++i) {
        const StepMetrics m = t.train_step();
        EXPECT_NEAR(m.loss_d, ref[i].loss_d, 1e-9 * std::abs(ref[i].loss_d)) << what << " step " << i;
        EXPECT_NEAR(m.loss_g, ref[i].loss_g, 1e-9 * std::abs(ref[i].loss_g)) << what << " step " << i;
        EXPECT_NEAR(m.loss_l1, ref[i].loss_l1, 1e-9 * std::abs(ref[i].loss_l1)) << what << " step " << i;
      }
      worst = std::max(worst, max_rel_diff(t.generator().gather_full_parameters(), rg, what + " G"));
      worst = std::max(worst, max_rel_diff(t.discriminator().gather_full_parameters(), rd, what + " D"));
      worst = std::max(worst, max_rel_diff(t.generator().named_buffers(), reference.generator().named_buffers(),
                                           what + " G buffers"));
    }
  }
  // The parameters moved, so equality is not trivial.
  auto init = Trainer(trainer_config(0, false), self).generator().gather_full_parameters();
  double moved = 0;
  for (size_t i = 0; i < init.size(); ++i) moved = std::max(moved, (init[i].second - rg[i].second).abs().max().item<double>());
  EXPECT_GT(moved, 1e-5);
  if (world.rank() == 0) {
    std::printf("[pix2pix trainer parity] world size %d: max relative diff %.3g (G, D, G buffers; stages 0-3, "
                "with and without activation checkpointing; bound 1e-9)\n", world.world_size(), worst);
  }
}

// Bytes allocated minus freed on the CPU while installed (c10's memory-reporting hook).
struct LiveBytes final : c10::MemoryReportingInfoBase {
  std::atomic<int64_t> current{0};
  void reportMemoryUsage(void*, int64_t size, size_t, size_t, c10::Device device) override {
    if (device.is_cpu()) current += size;
  }
  bool memoryProfilingEnabled() const override { return true; }
};

struct Lifetime {
  int64_t live_after_forward = 0, expected = 0, skips = 0;
  std::vector<int> replays;  // per unit, forwards during backward
};

// G with every unit checkpointed; `copy_skips` hands each decoder a copy of its skip.
Lifetime measure_lifetime(Communicator& comm, int stage, bool copy_skips) {
  auto family = make_pix2pix_family(small_config(3));
  ModelSpec spec = family->generator(comm);
  auto replays = std::make_shared<std::vector<int>>(spec.units.size(), 0);
  for (size_t k = 0; k < spec.units.size(); ++k) {  // count each unit's replays
    auto make = spec.units[k].make;
    spec.units[k].make = [make, replays, k](bool init) {
      BuiltUnit b = make(init);
      auto f = b.forward;
      b.forward = [f, replays, k](const TensorList& in) {
        if (recomputing_activations()) ++(*replays)[k];
        return f(in);
      };
      return b;
    };
  }
  const int64_t L = 5;
  if (copy_skips) {
    spec.program = [L](ShardedModel& m, const TensorList& in) -> TensorList {
      std::vector<at::Tensor> e;
      at::Tensor h = in[1];
      for (int64_t i = 0; i < L; ++i) e.push_back(h = m.unit("enc" + std::to_string(i)).forward(TensorList{h})[0]);
      at::Tensor u;
      for (int64_t i = L - 1; i >= 0; --i) {
        u = m.unit("dec" + std::to_string(i)).forward(TensorList{e[i].clone(), u, in[0]})[0];
      }
      return {u};
    };
  }
  ShardingConfig sc = test_util::sharding(stage);
  sc.activation_checkpointing = true;
  sc.prefetch = false;
  auto g = build_sharded_model(spec, comm, sc, 7, at::kDouble);
  torch::manual_seed(1);
  const at::Tensor a = torch::rand({4, 1, 32, 32}, torch::kDouble) * 2 - 1;
  const at::Tensor z = torch::randint(1000, {4}, torch::kLong);
  Lifetime r;
  // e_i [4, E_i, 32 / 2^(i+1), ...] and u_i [4, E_{i-1} or 1, 32 / 2^i, ...], float64.
  for (int64_t i = 0; i < L; ++i) {
    const int64_t side = 32 >> (i + 1), ei = 4 * std::min<int64_t>(int64_t{1} << i, 8);
    r.skips += 4 * ei * side * side * 8;
    const int64_t ui = i == 0 ? 1 : 4 * std::min<int64_t>(int64_t{1} << (i - 1), 8);
    r.expected += 4 * ui * (2 * side) * (2 * side) * 8;
  }
  r.expected += r.skips;
  // What each checkpointed unit keeps to replay its forward exactly (activation_checkpoint.h):
  // the CPU generator's state and a snapshot of its buffers (BatchNorm's running statistics).
  const int64_t rng_state = at::detail::getDefaultCPUGenerator().get_state().nbytes();
  r.expected += static_cast<int64_t>(g->units().size()) * rng_state;
  for (auto& kv : g->named_buffers()) r.expected += kv.second.nbytes();
  at::Tensor out;
  {
    auto rep = std::make_shared<LiveBytes>();
    c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, rep);
    out = g->forward({z, a}).at(0);
    r.live_after_forward = rep->current.load();
  }
  out.sum().backward();
  r.replays = *replays;
  return r;
}

TEST(Pix2PixSkipLifetime, EachSkipHeldOnceAndReplayedOnce) {
  MpiCommunicator world(MPI_COMM_WORLD, 300.0);
  for (int stage : {0, 3}) {
    const Lifetime ok = measure_lifetime(world, stage, false);
    const Lifetime copied = measure_lifetime(world, stage, true);
    // Slack: a quarter of the skips' bytes either way; a second copy of every skip adds all
    // of them.
    const int64_t bound = ok.expected + ok.skips / 4;
    EXPECT_LE(ok.live_after_forward, bound) << "stage " << stage;
    EXPECT_GE(ok.live_after_forward, ok.expected - ok.skips / 4) << "stage " << stage;
    EXPECT_GT(copied.live_after_forward, bound) << "stage " << stage << ": the negative control passes";
    for (size_t k = 0; k < ok.replays.size(); ++k) EXPECT_EQ(ok.replays[k], 1) << "unit " << k << " stage " << stage;
    if (world.rank() == 0) {
      std::printf("[pix2pix skip lifetime] stage %d: %lld bytes alive after G's forward, expected %lld "
                  "(skips %lld + decoder outputs + replay state), bound %lld; with a copy of each skip %lld\n",
                  stage, (long long)ok.live_after_forward, (long long)ok.expected, (long long)ok.skips,
                  (long long)bound, (long long)copied.live_after_forward);
    }
  }
}

// Writes images and our scores for tests/image_quality_check.py (scikit-image's PSNR and
// SSIM) when IMAGE_QUALITY_DIR is set; otherwise checks the scores' fixed points.
TEST(ImageQuality, ScoresForScikitImage) {
  torch::manual_seed(9);
  const at::Tensor t = torch::rand({3, 3, 32, 32}, torch::kDouble) * 2 - 1;
  const at::Tensor o = (t + 0.2 * torch::randn_like(t)).clamp(-1, 1);
  const eval::ImageScores s = eval::image_scores(o, t), same = eval::image_scores(t, t);
  EXPECT_NEAR(same.ssim.min().item<double>(), 1.0, 1e-12);
  EXPECT_EQ(same.l1.max().item<double>(), 0.0);
  EXPECT_TRUE(std::isinf(same.psnr.min().item<double>()));
  const char* dir = std::getenv("IMAGE_QUALITY_DIR");
  if (!dir) return;
  auto dump = [&](const std::string& name, const at::Tensor& x) {
    at::Tensor c = x.contiguous().to(at::kDouble);
    std::ofstream(std::string(dir) + "/" + name, std::ios::binary)
        .write(reinterpret_cast<const char*>(c.data_ptr<double>()), c.numel() * 8);
  };
  dump("out.f64", o);
  dump("target.f64", t);
  dump("scores.f64", torch::stack({s.l1, s.psnr, s.ssim}));
}

}  // namespace

}  // namespace SHARDGAN_UNITY_ID
