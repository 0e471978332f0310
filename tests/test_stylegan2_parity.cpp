// StyleGAN2's training recipe under ZeRO, in float64 (model.arch stylegan2): a tiny
// paper256-shaped model (mapping depth 8, residual D with minibatch stddev, style mixing
// 0.9), non-saturating loss, lazy R1 as a D update of its own every 2nd step and path
// length as a G update of its own every 3rd step (steps 0-3: R1 on 0 and 2, path length on
// 0 and 3), Adam with the lazy correction (lr x c, betas^c).
//  - ShardedEqualsOneRankStage0: stages 0-3 with and without activation checkpointing on N
//    ranks equal stage 0 on one rank (each rank runs that reference on MPI_COMM_SELF):
//    every parameter and buffer (w_avg) of G and D, each step's losses, R1, path-length
//    penalty and running mean. Negative control (N >= 2, SHARDGAN_TEST_CONTROL=
//    pl_mean_per_rank, ctest stylegan2_parity_control_np2): each rank keeps its own
//    running mean of path lengths, as the authors' code does per process; the same bound
//    must then fail.
//  - PlainAutogradReferenceAgrees (1 rank): GanObjective's four updates against an
//    independent reference written here on tests/stylegan2_plain_reference.h (plain LibTorch
//    autograd over the whole batch, none of shardgan's model code) with its own Adam and its
//    own lazy correction, on the same latents, real images and path-length noise. Negative
//    control (SHARDGAN_TEST_CONTROL=r1_without_lazy_gain, ctest
//    stylegan2_parity_reference_control): R1 without its lazy factor must fail the bound.
// Tolerance: 1e-9 relative per tensor. The runs differ only in summation order (per-rank
// partial sums of gradients and of the path-length mean, ~1e-16 relative per reduction),
// which Adam with beta1 0 and the square roots of demodulation and path length amplify to
// ~1e-12 at most (printed); a wrong reduction changes the first update by O(1) relative.
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "shardgan/comm/mpi_communicator.h"
#include "shardgan/optim/factory.h"
#include "shardgan/optim/loss_scaler.h"
#include "shardgan/sharding/deferred.h"
#include "shardgan/train/objective.h"
#include "shardgan/train/trainer.h"
#include "shardgan/util/test_control.h"
#include "stylegan2_plain_reference.h"
#include "test_util.h"

// The gtest files compile together in batches (tests/CMakeLists.txt): this file's names
// live in a namespace of its own.
namespace SHARDGAN_UNITY_ID {

using namespace shardgan;
using shardgan::test_util::max_rel_diff;

namespace {

using Named = std::vector<std::pair<std::string, at::Tensor>>;
constexpr int kSg2Steps = 4;
constexpr double kSg2Tol = 1e-9;

// Global batch 8: per-rank D batches of 8, 4 and 2 on 1, 2 and 4 ranks, each a multiple of
// the minibatch-stddev group 2, whose groups are then the same samples in every world size.
// The path-length batch is 4 (1 sample per rank on 4 ranks).
const char* const kSg2Yaml = R"(
run: {seed: 7, dir: ""}
data: {source: synthetic, synthetic_size: 64}
train: {steps: 4, global_batch: 8, loss: nonsaturating, r1_gamma: 0.5, r1_every: 2,
        pl_weight: 2.0, pl_every: 3, pl_batch_shrink: 2, pl_decay: 0.01}
model: {arch: stylegan2, preset: none, dtype: float64, image_size: 32, channels: 1, z_dim: 8, w_dim: 8,
        channel_base: 128, channel_max: 8, mapping_layers: 8, d_arch: resnet, mbstd_group: 2,
        style_mixing: 0.9}
optim:
  generator: {type: adam, lr: 2.5e-3, beta1: 0.0, beta2: 0.99, eps: 1.0e-8}
  discriminator: {type: adam, lr: 2.5e-3, beta1: 0.0, beta2: 0.99, eps: 1.0e-8}
)";

struct Sg2Run {
  std::vector<StepMetrics> steps;
  Named g, d, g_buffers, d_buffers;
};

Sg2Run sg2_train(Communicator& comm, int stage, bool checkpointing) {
  TrainConfig c = parse_config(kSg2Yaml, "stylegan2-parity-test", {});
  for (ShardingConfig* s : {&c.g_sharding, &c.d_sharding}) {
    s->stage = stage;
    s->activation_checkpointing = checkpointing;
  }
  Trainer t(std::move(c), comm);
  Sg2Run r;
  for (int i = 0; i < kSg2Steps; ++i) r.steps.push_back(t.train_step());
  r.g = t.generator().gather_full_parameters();
  r.d = t.discriminator().gather_full_parameters();
  r.g_buffers = t.generator().named_buffers();
  r.d_buffers = t.discriminator().named_buffers();
  return r;
}

// The worst relative difference of `a` from `b` over the step figures, parameters and
// buffers (asserting nothing: the caller holds it to the bound).
double sg2_worst(const Sg2Run& a, const Sg2Run& b) {
  constexpr double kAny = INFINITY;
  double worst = 0;
  for (size_t i = 0; i < a.steps.size(); ++i) {
    const StepMetrics &x = a.steps[i], &y = b.steps[i];
    const std::initializer_list<std::pair<double, double>> figures = {
        {x.loss_d, y.loss_d}, {x.loss_g, y.loss_g}, {x.r1, y.r1}, {x.pl, y.pl}, {x.pl_mean, y.pl_mean}};
    for (auto [u, v] : figures) {
      worst = std::max(worst, std::abs(u - v) / std::max(std::abs(v), 1e-300));
    }
  }
  worst = std::max(worst, max_rel_diff(a.g, b.g, "G", kAny));
  worst = std::max(worst, max_rel_diff(a.d, b.d, "D", kAny));
  worst = std::max(worst, max_rel_diff(a.g_buffers, b.g_buffers, "G buffers", kAny));
  worst = std::max(worst, max_rel_diff(a.d_buffers, b.d_buffers, "D buffers", kAny));
  return worst;
}

TEST(Stylegan2Parity, ShardedEqualsOneRankStage0) {
  MpiCommunicator world(MPI_COMM_WORLD, 300.0), self(MPI_COMM_SELF, 300.0);
  const Sg2Run ref = sg2_train(self, 0, false);
  // The recipe ran: R1 on steps 0 and 2, path length on 0 and 3, and the models moved.
  for (int i = 0; i < kSg2Steps; ++i) {
    EXPECT_EQ(ref.steps[i].r1 > 0, i % 2 == 0) << "step " << i << " R1 " << ref.steps[i].r1;
    EXPECT_EQ(ref.steps[i].pl > 0, i % 3 == 0) << "step " << i << " path length " << ref.steps[i].pl;
    EXPECT_TRUE(std::isfinite(ref.steps[i].loss_d) && std::isfinite(ref.steps[i].loss_g)) << "step " << i;
  }
  EXPECT_GT(ref.steps.back().pl_mean, 0);
  Trainer fresh(parse_config(kSg2Yaml, "stylegan2-parity-test", {}), self);
  const Named init = fresh.generator().gather_full_parameters();
  double moved = 0;
  for (size_t i = 0; i < init.size(); ++i) {
    moved = std::max(moved, (init[i].second - ref.g[i].second).abs().max().item<double>());
  }
  EXPECT_GT(moved, 1e-4);

  const bool control = test_control("pl_mean_per_rank");
  const int n = world.world_size();
  // All stages and both checkpointing settings on 2 ranks; on 1 and 4 ranks the stages whose
  // collectives differ most (2: reduce-scatter; 3: also all-gathers and the whole-model
  // gathers of the regularization updates), and under the control only stage 3.
  std::vector<int> stages = n == 2 ? std::vector<int>{0, 1, 2, 3} : std::vector<int>{2, 3};
  if (control) stages = {3};
  for (int stage : stages) {
    for (bool ac : {false, true}) {
      if (control && ac) continue;
      const Sg2Run run = sg2_train(world, stage, ac);
      const double worst = sg2_worst(run, ref);
      if (world.rank() == 0) {
        std::printf("[stylegan2 parity] N=%d stage %d%s: worst relative difference %.3g (%s %.0e)\n", n, stage,
                    ac ? " + activation checkpointing" : "", worst, control ? "must exceed" : "bound", kSg2Tol);
      }
      if (control && n >= 2) {
        EXPECT_GT(worst, kSg2Tol) << "pl_mean_per_rank passed the bound: the test cannot fail";
      } else {
        EXPECT_LE(worst, kSg2Tol) << "stage " << stage << (ac ? " with activation checkpointing" : "");
      }
    }
  }
}


// ---- The independent reference ----------------------------------------------------------

constexpr int64_t kSg2Batch = 8, kSg2PlBatch = 4;
constexpr double kSg2Gamma = 0.5, kSg2PlWeight = 2.0, kSg2PlDecay = 0.01, kSg2Lr = 2.5e-3, kSg2Beta2 = 0.99;
constexpr int kSg2R1Every = 2, kSg2PlEvery = 3;

// Adam as torch.optim.Adam (weight decay 0), beta1 and beta2 given.
struct Sg2RefAdam {
  Sg2RefAdam(double lr_, double beta1_, double beta2_) : lr(lr_), beta1(beta1_), beta2(beta2_) {}
  double lr, beta1, beta2, eps = 1e-8;
  int64_t t = 0;
  std::map<std::string, at::Tensor> m, v;
  void step(sg2_plain::Params& p, const std::map<std::string, at::Tensor>& g) {
    ++t;
    torch::NoGradGuard no_grad;
    const double bc1 = 1 - std::pow(beta1, static_cast<double>(t)), bc2 = 1 - std::pow(beta2, static_cast<double>(t));
    for (auto& [name, w] : p) {
      const at::Tensor grad = g.at(name);
      if (!m.count(name)) {
        m[name] = torch::zeros_like(w);
        v[name] = torch::zeros_like(w);
      }
      m[name] = m[name] * beta1 + grad * (1 - beta1);
      v[name] = v[name] * beta2 + grad * grad * (1 - beta2);
      w.sub_(m[name] / (v[name].sqrt() / std::sqrt(bc2) + eps) * (lr / bc1));
    }
  }
};

// d loss / d every parameter of `p` (zeros for those the loss does not reach).
std::map<std::string, at::Tensor> sg2_ref_grads(const at::Tensor& loss, const sg2_plain::Params& p) {
  std::vector<at::Tensor> leaves;
  for (auto& [name, w] : p) leaves.push_back(w);
  const auto grads = torch::autograd::grad({loss}, leaves, {}, false, false, /*allow_unused=*/true);
  std::map<std::string, at::Tensor> out;
  size_t i = 0;
  for (auto& [name, w] : p) {
    out[name] = grads[i].defined() ? grads[i] : torch::zeros_like(w);
    ++i;
  }
  return out;
}

struct Sg2Inputs {
  std::vector<at::Tensor> reals, latents, noises;  // in the order the objective asks for them
};

TEST(Stylegan2Parity, PlainAutogradReferenceAgrees) {
  MpiCommunicator world(MPI_COMM_WORLD, 300.0), self(MPI_COMM_SELF, 300.0);
  if (world.world_size() != 1) GTEST_SKIP() << "the reference runs on one rank (stylegan2_parity_np1)";
  const TrainConfig cfg = parse_config(kSg2Yaml, "stylegan2-parity-test", {});
  const ModelFamily& fam = *cfg.family;
  auto g = build_sharded_model(fam.generator(self), self, test_util::sharding(0), 11, at::kDouble);
  auto d = build_sharded_model(fam.discriminator(self), self, test_util::sharding(0), 12, at::kDouble);
  auto og = make_optimizer(*g, lazy_corrected(cfg.g_optim, lazy_regularization_ratio(cfg, true)));
  auto od = make_optimizer(*d, lazy_corrected(cfg.d_optim, lazy_regularization_ratio(cfg, false)));
  DynamicLossScaler sg(LossScalerConfig{}, at::kDouble), sd(LossScalerConfig{}, at::kDouble);
  sg2_plain::Params gp = sg2_plain::to_params(g->gather_full_parameters(), true);
  sg2_plain::Params dp = sg2_plain::to_params(d->gather_full_parameters(), true);
  at::Tensor w_avg;
  for (auto& [name, b] : g->named_buffers()) {
    if (name == "mapping.w_avg") w_avg = b.clone();
  }
  ASSERT_TRUE(w_avg.defined()) << "G has no buffer mapping.w_avg";

  GanObjective obj("nonsaturating", 1, 1, 0.0, self, kSg2Gamma, kSg2R1Every);
  obj.set_separate_regularization(true);
  obj.set_path_length({kSg2PlWeight, kSg2PlEvery, kSg2Batch / kSg2PlBatch, kSg2PlDecay});
  auto gen = at::detail::createCPUGenerator(21);
  Sg2Inputs used;
  StepInputs in;
  in.local = [](const at::Tensor& t, int64_t) { return t; };
  in.real = [&](int64_t) {
    used.reals.push_back(at::randn({kSg2Batch, 1, 32, 32}, gen, torch::TensorOptions().dtype(at::kDouble)).tanh());
    return TensorList{used.reals.back(), at::Tensor()};
  };
  in.latents = [&] {
    used.latents.push_back(fam.sample_latents(kSg2Batch, gen, at::kDouble));
    return TensorList{used.latents.back(), at::Tensor()};
  };
  in.normal = [&](at::IntArrayRef sizes, at::ScalarType dtype) {
    used.noises.push_back(at::randn(sizes, gen, torch::TensorOptions().dtype(dtype)));
    return used.noises.back();
  };
  std::vector<StepMetrics> ours;
  for (int i = 0; i < kSg2Steps; ++i) {
    in.step = i;
    ours.push_back(obj.step({g.get(), og.get(), &sg}, {d.get(), od.get(), &sd}, in));
  }
  ASSERT_EQ(used.latents.size(), 2u * kSg2Steps + 2u);  // D's and G's updates, and path length on steps 0 and 3
  ASSERT_EQ(used.noises.size(), 2u);

  // The reference: D's update, D reg (every 2nd step), G's update, G reg (every 3rd step),
  // each an Adam step with lr x c and betas^c, c = I / (I + 1).
  sg2_plain::Shape shape;
  shape.resolution = 32;
  shape.channels = 1;
  shape.z_dim = shape.w_dim = 8;
  shape.channel_base = 128;
  shape.channel_max = 8;
  shape.mapping_layers = 8;
  shape.mbstd_group = 2;
  const double cg = kSg2PlEvery / (kSg2PlEvery + 1.0), cd = kSg2R1Every / (kSg2R1Every + 1.0);
  Sg2RefAdam adam_g(kSg2Lr * cg, 0.0, std::pow(kSg2Beta2, cg)), adam_d(kSg2Lr * cd, 0.0, std::pow(kSg2Beta2, cd));
  size_t next_latent = 0, next_noise = 0;
  double pl_mean = 0;
  double worst = 0;
  auto figure = [&](double got, double want, const char* what, int step) {
    const double rel = std::abs(got - want) / std::max(std::abs(want), 1e-300);
    worst = std::max(worst, rel);
    if (world.rank() == 0 && rel > kSg2Tol) std::printf("[stylegan2 reference] step %d %s: %.17g vs %.17g\n", step, what, got, want);
  };
  for (int i = 0; i < kSg2Steps; ++i) {
    const at::Tensor& real = used.reals.at(static_cast<size_t>(i));
    at::Tensor fake;
    {
      torch::NoGradGuard no_grad;
      fake = sg2_plain::generator(gp, shape, used.latents.at(next_latent++), {}, &w_avg).images;
    }
    const at::Tensor loss_real = torch::softplus(-sg2_plain::discriminator(dp, shape, real, {})).mean();
    const at::Tensor loss_fake = torch::softplus(sg2_plain::discriminator(dp, shape, fake, {})).mean();
    adam_d.step(dp, sg2_ref_grads(loss_real + loss_fake, dp));
    figure(ours[i].loss_d, (loss_real + loss_fake).item<double>(), "loss_d", i);
    if (i % kSg2R1Every == 0) {
      at::Tensor x = real.detach().requires_grad_(true);
      const at::Tensor logits = sg2_plain::discriminator(dp, shape, x, {});
      const at::Tensor gx = torch::autograd::grad({logits.sum()}, {x}, {}, true, true)[0];
      const at::Tensor penalty = gx.square().flatten(1).sum(1).mean() * (kSg2Gamma / 2);
      adam_d.step(dp, sg2_ref_grads(penalty * kSg2R1Every, dp));
      figure(ours[i].r1, penalty.item<double>(), "r1", i);
    }
    const at::Tensor zg = used.latents.at(next_latent++);
    const at::Tensor loss_g =
        torch::softplus(-sg2_plain::discriminator(dp, shape, sg2_plain::generator(gp, shape, zg, {}, &w_avg).images, {}))
            .mean();
    adam_g.step(gp, sg2_ref_grads(loss_g, gp));
    figure(ours[i].loss_g, loss_g.item<double>(), "loss_g", i);
    if (i % kSg2PlEvery == 0) {
      const at::Tensor z = used.latents.at(next_latent++).narrow(0, 0, kSg2PlBatch);
      const sg2_plain::GOut out = sg2_plain::generator(gp, shape, z, {}, &w_avg);
      const at::Tensor u = used.noises.at(next_noise++) / 32.0;  // sqrt(H W)
      const at::Tensor gw = torch::autograd::grad({(out.images * u).sum()}, {out.ws}, {}, true, true)[0];
      const at::Tensor a = gw.square().sum(2).mean(1).sqrt();
      pl_mean += kSg2PlDecay * (a.mean().item<double>() - pl_mean);
      const at::Tensor penalty = (a - pl_mean).square().mean();
      adam_g.step(gp, sg2_ref_grads(penalty * (kSg2PlWeight * kSg2PlEvery), gp));
      figure(ours[i].pl, penalty.item<double>(), "pl", i);
    }
    figure(ours[i].pl_mean, pl_mean, "pl_mean", i);
  }
  auto as_named = [](const sg2_plain::Params& p, const Named& order) {
    Named out;
    for (auto& [name, t] : order) out.emplace_back(name, p.at(name).detach());
    return out;
  };
  const Named g_now = g->gather_full_parameters(), d_now = d->gather_full_parameters();
  worst = std::max(worst, max_rel_diff(g_now, as_named(gp, g_now), "G vs reference", INFINITY));
  worst = std::max(worst, max_rel_diff(d_now, as_named(dp, d_now), "D vs reference", INFINITY));
  for (auto& [name, b] : g->named_buffers()) {
    if (name == "mapping.w_avg") worst = std::max(worst, max_rel_diff({{name, b}}, {{name, w_avg}}, "w_avg", INFINITY));
  }
  const bool control = test_control("r1_without_lazy_gain");
  std::printf("[stylegan2 reference] 4 steps (R1 on 0 and 2, path length on 0 and 3): worst relative difference "
              "%.3g (%s %.0e)\n", worst, control ? "must exceed" : "bound", kSg2Tol);
  if (control) {
    EXPECT_GT(worst, kSg2Tol) << "r1_without_lazy_gain passed the bound: the test cannot fail";
  } else {
    EXPECT_LE(worst, kSg2Tol);
  }
}

}  // namespace

}  // namespace SHARDGAN_UNITY_ID
