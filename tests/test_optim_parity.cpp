// The sharded optimizers equal LibTorch's own (torch::optim::Adam, AdamW, SGD, RMSprop) on
// the same parameters and gradients over 100 steps in float64, both unsharded (stage 0 on
// one rank) and sharded (stages 1, 2 and 3 over every rank of the run), within 1e-12
// relative (0 reached: the same operations on the same numbers); the
// fused float32 path stays close to torch's float32 Adam; the schedules, the factory and
// the sharded EMA behave as documented.
#include <cmath>
#include <functional>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "shardgan/comm/mpi_communicator.h"
#include "shardgan/optim/factory.h"
#include "shardgan/optim/sharded_adam.h"
#include "shardgan/optim/sharded_ema.h"
#include "shardgan/optim/sharded_rmsprop.h"
#include "shardgan/optim/sharded_sgd.h"
#include "shardgan/sharding/sharded_model.h"

// The gtest files compile together in batches (tests/CMakeLists.txt): this file's names
// live in a namespace of its own.
namespace SHARDGAN_UNITY_ID {

using namespace shardgan;

namespace {

constexpr int kSteps = 100;
constexpr double kTol = 1e-12;

ShardingConfig sharding(int stage) {
  ShardingConfig c;
  c.stage = stage;
  return c;
}

// Two units (Linear 7->5 and 5->3, sizes that do not divide by 2, 3 or 4 ranks) and an
// unwrapped clone of their parameters for the reference optimizer.
struct Fixture {
  std::unique_ptr<ShardedModel> model;
  std::vector<at::Tensor> ref_params;  // named_parameters order, unit by unit
  std::vector<std::vector<int64_t>> unit_param_idx;

  Fixture(Communicator& comm, int stage, at::ScalarType dtype) {
    torch::manual_seed(3);
    model = std::make_unique<ShardedModel>("m", comm, sharding(stage));
    int64_t k = 0;
    for (auto [in, out] : {std::pair{7, 5}, std::pair{5, 3}}) {
      auto lin = torch::nn::Linear(torch::nn::LinearOptions(in, out));
      lin->to(dtype);
      std::vector<int64_t> idx;
      for (auto& p : lin->parameters()) {
        ref_params.push_back(p.detach().clone().requires_grad_(true));
        idx.push_back(k++);
      }
      unit_param_idx.push_back(idx);
      model->add_unit("lin" + std::to_string(in), lin.ptr(),
                      [lin](const at::Tensor& x) mutable { return lin->forward(x); });
    }
  }

  // The same gradient on every rank (seeded by step and unit): reference .grad and this
  // rank's part of the padded flat gradient.
  void set_gradients(int step) {
    auto& units = model->units();
    for (size_t u = 0; u < units.size(); ++u) {
      ShardedUnit& unit = *units[u];
      torch::manual_seed(1000 + 10 * step + static_cast<int64_t>(u));
      at::Tensor g = torch::randn({unit.numel()}, unit.shard().options());
      int64_t off = 0;
      for (int64_t pi : unit_param_idx[u]) {
        at::Tensor& p = ref_params[pi];
        p.mutable_grad() = g.narrow(0, off, p.numel()).view(p.sizes()).clone();
        off += p.numel();
      }
      at::Tensor padded = torch::zeros({unit.padded_numel()}, g.options());
      padded.narrow(0, 0, unit.numel()).copy_(g);
      unit.grad_shard().copy_(padded.narrow(0, unit.shard_offset(), unit.shard_numel()));
    }
  }

  // Collective at stage 3. Largest per-tensor max|mine - ref| / max|ref|.
  double max_rel_diff() {
    auto full = model->gather_full_parameters();
    EXPECT_EQ(full.size(), ref_params.size());
    double worst = 0;
    for (size_t i = 0; i < full.size() && i < ref_params.size(); ++i) {
      const at::Tensor ref = ref_params[i].detach();
      const double rel = ((full[i].second.view(ref.sizes()) - ref).abs().max() / ref.abs().max()).item<double>();
      worst = std::max(worst, rel);
    }
    return worst;
  }
};

using RefStep = std::function<void(int step)>;

// Runs kSteps of `ours` and of the torch optimizer made by `make_ref` on the same
// gradients, at stage 0 on one rank and at stages 1-3 over the world, and returns the
// worst relative difference.
double run_parity(const std::function<std::unique_ptr<ShardedOptimizer>(ShardedModel&)>& make_ours,
                  const std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>& make_ref,
                  at::ScalarType dtype = torch::kDouble,
                  const std::function<void(torch::optim::Optimizer&, int)>& before_ref_step = nullptr) {
  MpiCommunicator world(MPI_COMM_WORLD, 60.0), self(MPI_COMM_SELF, 60.0);
  double worst = 0;
  for (int stage : {0, 1, 2, 3}) {
    Fixture f(stage == 0 ? static_cast<Communicator&>(self) : world, stage, dtype);
    auto ours = make_ours(*f.model);
    auto ref = make_ref(f.ref_params);
    for (int s = 0; s < kSteps; ++s) {
      f.set_gradients(s);
      ours->step();
      f.model->after_optimizer_step();
      if (before_ref_step) before_ref_step(*ref, s);
      ref->step();
    }
    EXPECT_EQ(ours->step_count(), kSteps);
    const double d = f.max_rel_diff();
    if (world.rank() == 0) std::printf("  stage %d (%d rank(s)): max rel diff %.3g\n", stage, stage == 0 ? 1 : world.world_size(), d);
    worst = std::max(worst, d);
  }
  return worst;
}

TEST(OptimParity, AdamMatchesTorchAdam) {
  OptimizerConfig c;
  c.lr = 1e-2;
  c.weight_decay = 0.01;
  EXPECT_LE(run_parity([&](ShardedModel& m) { return make_optimizer(m, c); },
                       [&](std::vector<at::Tensor> p) {
                         return std::make_unique<torch::optim::Adam>(
                             p, torch::optim::AdamOptions(c.lr).betas({c.beta1, c.beta2}).eps(c.eps).weight_decay(c.weight_decay));
                       }),
            kTol);
}

TEST(OptimParity, AdamWMatchesTorchAdamW) {
  OptimizerConfig c;
  c.type = OptimizerType::kAdamW;
  c.lr = 3e-3;
  c.beta1 = 0.9;
  c.beta2 = 0.99;
  c.weight_decay = 0.1;
  EXPECT_LE(run_parity([&](ShardedModel& m) { return make_optimizer(m, c); },
                       [&](std::vector<at::Tensor> p) {
                         return std::make_unique<torch::optim::AdamW>(
                             p, torch::optim::AdamWOptions(c.lr).betas({c.beta1, c.beta2}).eps(c.eps).weight_decay(c.weight_decay));
                       }),
            kTol);
}

TEST(OptimParity, SgdMomentumMatchesTorchSgd) {
  OptimizerConfig c;
  c.type = OptimizerType::kSgd;
  c.lr = 1e-2;
  c.momentum = 0.9;
  c.dampening = 0.1;
  c.weight_decay = 1e-3;
  EXPECT_LE(run_parity([&](ShardedModel& m) { return make_optimizer(m, c); },
                       [&](std::vector<at::Tensor> p) {
                         return std::make_unique<torch::optim::SGD>(
                             p, torch::optim::SGDOptions(c.lr).momentum(c.momentum).dampening(c.dampening).weight_decay(c.weight_decay));
                       }),
            kTol);
}

TEST(OptimParity, SgdNesterovMatchesTorchSgd) {
  OptimizerConfig c;
  c.type = OptimizerType::kSgd;
  c.lr = 5e-3;
  c.momentum = 0.9;
  c.nesterov = true;
  EXPECT_LE(run_parity([&](ShardedModel& m) { return make_optimizer(m, c); },
                       [&](std::vector<at::Tensor> p) {
                         return std::make_unique<torch::optim::SGD>(
                             p, torch::optim::SGDOptions(c.lr).momentum(c.momentum).nesterov(true));
                       }),
            kTol);
}

TEST(OptimParity, PlainSgdMatchesTorchSgd) {
  OptimizerConfig c;
  c.type = OptimizerType::kSgd;
  c.lr = 1e-2;
  EXPECT_LE(run_parity([&](ShardedModel& m) { return make_optimizer(m, c); },
                       [&](std::vector<at::Tensor> p) {
                         return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(c.lr));
                       }),
            kTol);
}

TEST(OptimParity, RmspropMatchesTorchRmsprop) {
  OptimizerConfig c;
  c.type = OptimizerType::kRmsprop;
  c.lr = 1e-3;
  EXPECT_LE(run_parity([&](ShardedModel& m) { return make_optimizer(m, c); },
                       [&](std::vector<at::Tensor> p) {
                         return std::make_unique<torch::optim::RMSprop>(p, torch::optim::RMSpropOptions(c.lr).alpha(c.alpha).eps(c.eps));
                       }),
            kTol);
}

TEST(OptimParity, CenteredMomentumRmspropMatchesTorchRmsprop) {
  OptimizerConfig c;
  c.type = OptimizerType::kRmsprop;
  c.lr = 1e-3;
  c.alpha = 0.9;
  c.momentum = 0.5;
  c.centered = true;
  c.weight_decay = 1e-2;
  EXPECT_LE(run_parity([&](ShardedModel& m) { return make_optimizer(m, c); },
                       [&](std::vector<at::Tensor> p) {
                         return std::make_unique<torch::optim::RMSprop>(
                             p, torch::optim::RMSpropOptions(c.lr).alpha(c.alpha).eps(c.eps).momentum(c.momentum)
                                    .centered(true).weight_decay(c.weight_decay));
                       }),
            kTol);
}

// The schedule is applied by step(): torch's Adam with the same learning rate set before
// each step gives the same parameters.
TEST(OptimParity, CosineScheduleWithWarmupMatchesTorchAdamWithLrSetPerStep) {
  OptimizerConfig c;
  c.lr = 1e-2;
  c.schedule.kind = LrScheduleKind::kCosine;
  c.schedule.warmup_steps = 10;
  c.schedule.total_steps = 80;
  c.schedule.min_lr = 1e-4;
  LrSchedule sched(c.lr, c.schedule);
  EXPECT_LE(run_parity([&](ShardedModel& m) { return make_optimizer(m, c); },
                       [&](std::vector<at::Tensor> p) {
                         return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(c.lr).betas({c.beta1, c.beta2}));
                       },
                       torch::kDouble,
                       [&](torch::optim::Optimizer& o, int s) {
                         o.param_groups()[0].options().set_lr(sched.lr_at(s));
                       }),
            kTol);
}

// float32 goes through the fused kernel, whose operation order differs from ATen's
// (FMA, multiply by 1/sqrt(bc2)): agreement is to float32 rounding accumulated over 100 steps
// (1.8e-7 relative reached).
TEST(OptimParity, FusedFloat32AdamStaysCloseToTorchFloat32Adam) {
  for (bool adamw : {false, true}) {
    OptimizerConfig c;
    c.type = adamw ? OptimizerType::kAdamW : OptimizerType::kAdam;
    c.lr = 1e-2;
    c.weight_decay = 0.01;
    const double d = run_parity(
        [&](ShardedModel& m) { return make_optimizer(m, c); },
        [&](std::vector<at::Tensor> p) -> std::unique_ptr<torch::optim::Optimizer> {
          if (adamw) return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(c.lr).betas({c.beta1, c.beta2}).weight_decay(c.weight_decay));
          return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(c.lr).betas({c.beta1, c.beta2}).weight_decay(c.weight_decay));
        },
        torch::kFloat);
    EXPECT_LE(d, 1e-6) << (adamw ? "adamw" : "adam");
  }
}

TEST(OptimParity, BFloat16CopyIsTheRoundedShard) {
  MpiCommunicator world(MPI_COMM_WORLD, 60.0);
  Fixture f(world, 3, torch::kFloat);
  OptimizerConfig c;
  c.param_copy = ParamCopy::kBFloat16;
  auto opt = make_optimizer(*f.model, c);
  auto& adam = dynamic_cast<ShardedAdam&>(*opt);
  for (int s = 0; s < 3; ++s) {
    f.set_gradients(s);
    opt->step();
    for (size_t u = 0; u < f.model->units().size(); ++u) {
      at::Tensor expect = f.model->units()[u]->shard().to(torch::kBFloat16);
      EXPECT_TRUE(torch::equal(adam.param_copy(u), expect)) << "unit " << u;
    }
  }
  at::Tensor target = torch::empty({f.model->units()[0]->shard_numel()}, torch::kBFloat16);
  adam.set_param_copy(0, target);
  f.set_gradients(3);
  opt->step();
  EXPECT_TRUE(torch::equal(target, f.model->units()[0]->shard().to(torch::kBFloat16)));
  EXPECT_THROW(adam.set_param_copy(1, torch::empty({1}, torch::kBFloat16)), std::invalid_argument);
  Fixture f64(world, 3, torch::kDouble);
  EXPECT_THROW(make_optimizer(*f64.model, c), std::invalid_argument);
}

TEST(LrSchedule, ValuesAtTheDocumentedSteps) {
  LrScheduleConfig w;
  w.kind = LrScheduleKind::kLinearWarmup;
  w.warmup_steps = 4;
  LrSchedule lw(1.0, w);
  EXPECT_DOUBLE_EQ(lw.lr_at(0), 0.25);
  EXPECT_DOUBLE_EQ(lw.lr_at(3), 1.0);
  EXPECT_DOUBLE_EQ(lw.lr_at(100), 1.0);

  LrScheduleConfig cs;
  cs.kind = LrScheduleKind::kCosine;
  cs.total_steps = 100;
  LrSchedule cos(2.0, cs);
  EXPECT_DOUBLE_EQ(cos.lr_at(0), 2.0);
  EXPECT_NEAR(cos.lr_at(50), 1.0, 1e-15);
  EXPECT_NEAR(cos.lr_at(100), 0.0, 1e-15);
  EXPECT_NEAR(cos.lr_at(1000), 0.0, 1e-15);

  LrScheduleConfig st;
  st.kind = LrScheduleKind::kStep;
  st.step_size = 10;
  st.gamma = 0.5;
  LrSchedule step(1.0, st);
  EXPECT_DOUBLE_EQ(step.lr_at(9), 1.0);
  EXPECT_DOUBLE_EQ(step.lr_at(10), 0.5);
  EXPECT_DOUBLE_EQ(step.lr_at(25), 0.25);

  EXPECT_DOUBLE_EQ(LrSchedule(3.0, LrScheduleConfig{}).lr_at(12345), 3.0);
  EXPECT_EQ(parse_lr_schedule("cosine"), LrScheduleKind::kCosine);
  EXPECT_THROW(parse_lr_schedule("exp"), std::invalid_argument);
  LrScheduleConfig bad;
  bad.kind = LrScheduleKind::kCosine;  // total_steps missing
  EXPECT_THROW(LrSchedule(1.0, bad), std::invalid_argument);
  bad = LrScheduleConfig{};
  bad.warmup_steps = 3;  // constant with warmup
  EXPECT_THROW(LrSchedule(1.0, bad), std::invalid_argument);
}

TEST(OptimFactory, MakesEachTypeWithItsStateNamesAndValidates) {
  MpiCommunicator self(MPI_COMM_SELF, 60.0);
  Fixture f(self, 0, torch::kFloat);
  struct Case {
    OptimizerType type;
    std::vector<std::string> names;
  };
  for (const Case& k : {Case{OptimizerType::kAdam, {"exp_avg", "exp_avg_sq"}},
                        Case{OptimizerType::kAdamW, {"exp_avg", "exp_avg_sq"}},
                        Case{OptimizerType::kSgd, {"momentum_buffer"}},
                        Case{OptimizerType::kRmsprop, {"square_avg", "momentum_buffer", "grad_avg"}}}) {
    OptimizerConfig c;
    c.type = k.type;
    c.momentum = 0.9;
    c.centered = true;
    auto o = make_optimizer(*f.model, c);
    EXPECT_STREQ(o->type_name(), to_string(k.type));
    EXPECT_EQ(parse_optimizer_type(to_string(k.type)), k.type);
    auto st = o->unit_state(1);
    ASSERT_EQ(st.size(), k.names.size());
    for (size_t i = 0; i < st.size(); ++i) {
      EXPECT_EQ(st[i].first, k.names[i]);
      EXPECT_EQ(st[i].second.numel(), f.model->units()[1]->shard_numel());
    }
    EXPECT_EQ(o->state_bytes(), static_cast<int64_t>(k.names.size()) * (f.model->units()[0]->shard_numel() +
                                                                        f.model->units()[1]->shard_numel()) * 4);
  }
  EXPECT_THROW(parse_optimizer_type("adagrad"), std::invalid_argument);
  OptimizerConfig bad;
  bad.lr = -1;
  EXPECT_THROW(make_optimizer(*f.model, bad), std::invalid_argument);
  bad = OptimizerConfig{};
  bad.beta2 = 1.0;
  EXPECT_THROW(make_optimizer(*f.model, bad), std::invalid_argument);
  bad = OptimizerConfig{};
  bad.type = OptimizerType::kSgd;
  bad.nesterov = true;  // without momentum
  EXPECT_THROW(make_optimizer(*f.model, bad), std::invalid_argument);
  // TTUR presets.
  EXPECT_DOUBLE_EQ(OptimizerConfig::biggan_generator().lr, 1e-4);
  EXPECT_DOUBLE_EQ(OptimizerConfig::biggan_discriminator().lr, 4e-4);
  EXPECT_DOUBLE_EQ(OptimizerConfig::biggan_discriminator().beta1, 0.0);
}

// The sharded EMA equals the EMA of the full (gathered) parameters, computed here on every
// rank; swapping it in shows the EMA weights, swapping out restores the live ones exactly.
// StyleGAN2-ADA's half-life form (ema_kimg, ema_rampup): the decays its configurations give,
// worked out by hand from beta = 0.5^(batch / max(n, 1e-8)).
TEST(ShardedEma, HalfLifeInImagesAsStyleGan2Ada) {
  EmaConfig paper256;
  paper256.half_life_kimg = 20;
  paper256.batch = 64;
  EXPECT_NEAR(paper256.decay_at(1), 0.997784, 1e-6);  // 0.5^(64 / 20000), no ramp-up
  EXPECT_EQ(paper256.decay_at(1), paper256.decay_at(100000));
  EmaConfig cifar = paper256;
  cifar.half_life_kimg = 500;
  cifar.rampup = 0.05;
  EXPECT_EQ(cifar.decay_at(1), 0.0);  // no image seen yet: the EMA copies the weights
  EXPECT_NEAR(cifar.decay_at(1000000 / 64 + 1), 0.999113, 1e-6);  // 1 Mimg seen: n = 50,000
  EXPECT_NEAR(cifar.decay_at(10000000 / 64 + 2), 0.999911, 1e-6);  // ramped up: n = 500,000
  EmaConfig biggan;
  EXPECT_EQ(biggan.decay_at(7), biggan.decay);
}

TEST(ShardedEma, EqualsTheEmaOfTheFullParametersAndSwapsExactly) {
  MpiCommunicator world(MPI_COMM_WORLD, 60.0);
  for (int stage : {0, 2, 3}) {
  SCOPED_TRACE("stage " + std::to_string(stage));
  Fixture f(world, stage, torch::kDouble);
  auto opt = make_optimizer(*f.model, OptimizerConfig{});
  EmaConfig ec;
  ec.decay = 0.9;
  ec.start_step = 3;
  ShardedEma ema(*f.model, ec);
  std::vector<at::Tensor> ref;
  for (auto& [n, t] : f.model->gather_full_parameters()) ref.push_back(t.clone());
  for (int s = 0; s < 10; ++s) {
    f.set_gradients(s);
    opt->step();
    f.model->after_optimizer_step();
    ema.update(opt->step_count());
    auto full = f.model->gather_full_parameters();
    for (size_t i = 0; i < ref.size(); ++i) {
      if (opt->step_count() < ec.start_step) ref[i].copy_(full[i].second);
      else ref[i].mul_(ec.decay).add_(full[i].second, 1 - ec.decay);
    }
  }
  std::vector<at::Tensor> live;
  for (auto& [n, t] : f.model->gather_full_parameters()) live.push_back(t.clone());
  {
    EmaSwap in(ema);
    EXPECT_TRUE(ema.swapped());
    auto full = f.model->gather_full_parameters();
    for (size_t i = 0; i < ref.size(); ++i) {
      EXPECT_TRUE(torch::allclose(full[i].second, ref[i], 1e-14, 0)) << full[i].first;
    }
    EXPECT_THROW(ema.update(11), std::logic_error);
  }
  EXPECT_FALSE(ema.swapped());
  auto back = f.model->gather_full_parameters();
  for (size_t i = 0; i < live.size(); ++i) EXPECT_TRUE(torch::equal(back[i].second, live[i]));
  EXPECT_EQ(ema.unit_shard(0).numel(), f.model->units()[0]->shard_numel());
  EXPECT_THROW(ShardedEma(*f.model, EmaConfig{1.5, 0}), std::invalid_argument);
  }
}

}  // namespace

}  // namespace SHARDGAN_UNITY_ID
