// Hardening II (issue 22), run under mpirun at several world sizes:
// - a unit whose parameters get no gradient on some ranks (a branch chosen by the rank's
//   data) still takes part in every reduction, in the same order on every rank;
// - parameters frozen inside a unit (mixed requires_grad) keep their values and optimizer
//   state under every optimizer, with weight decay and momentum, offloaded Adam included.
// Both are compared with plain LibTorch autograd and torch::optim on unsharded copies.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "shardgan/comm/mpi_communicator.h"
#include "shardgan/optim/factory.h"
#include "shardgan/optim/optimizer.h"
#include "shardgan/sharding/sharded_model.h"
#include "shardgan/sharding/wrap_policy.h"
#include "shardgan/train/preemption.h"
#include "test_util.h"

// The gtest files compile together in batches (tests/CMakeLists.txt): this file's names
// live in a namespace of its own.
namespace SHARDGAN_UNITY_ID {

using namespace shardgan;
using shardgan::test_util::sharding;
namespace nn = torch::nn;

namespace {

// Gradient shards of every unit, all-gathered and unpadded.
std::vector<std::pair<std::string, at::Tensor>> grads_of(ShardedModel& m, Communicator& comm) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& u : m.units()) {
    at::Tensor full = u->stage() == 0 ? u->grad_shard().clone() : torch::empty({u->padded_numel()}, u->grad_shard().options());
    if (u->stage() != 0) comm.all_gather(full, u->grad_shard());
    out.emplace_back(u->name(), full.narrow(0, 0, u->numel()));
  }
  return out;
}

at::Tensor flat_grads(nn::Module& m) {
  std::vector<at::Tensor> g;
  for (auto& p : m.parameters()) g.push_back(p.grad().defined() ? p.grad().reshape({-1}) : torch::zeros({p.numel()}, p.options()));
  return torch::cat(g);
}

// "trunk" then "branch"; the branch unit applies its Linear only when the rank's flag is
// positive, and passes h through otherwise, so on those ranks none of its parameters gets a
// gradient while its input still does (the unit's backward runs, its reduction is due).
class RankBranch : public ::testing::TestWithParam<int> {};

TEST_P(RankBranch, EveryRankReducesEveryUnitInTheSameOrder) {
  MpiCommunicator world(MPI_COMM_WORLD, 60.0);
  const int n = world.world_size(), local = 2;
  auto make = [] {
    torch::manual_seed(31);
    nn::Linear trunk(4, 6), branch(6, 6);
    trunk->to(torch::kDouble);
    branch->to(torch::kDouble);
    return std::make_pair(trunk, branch);
  };
  auto apply_branch = [](nn::Linear& b, const at::Tensor& h, const at::Tensor& flag) {
    return flag.sum().item<double>() > 0 ? torch::tanh(b->forward(h)) : h * 2;
  };
  torch::manual_seed(32);
  const at::Tensor x = torch::randn({n * local, 4}, torch::kDouble);
  auto flag_of = [](int r) { return torch::full({1}, r % 2 == 0 ? 1.0 : -1.0, torch::kDouble); };
  // Reference: plain autograd over every rank's slice, losses averaged as the ranks do.
  auto [rt, rb] = make();
  at::Tensor total = torch::zeros({}, torch::kDouble);
  for (int r = 0; r < n; ++r) {
    at::Tensor h = rt->forward(x.narrow(0, r * local, local));
    total = total + apply_branch(rb, h, flag_of(r)).pow(2).mean();
  }
  (total / n).backward();
  const std::vector<std::pair<std::string, at::Tensor>> want = {{"trunk", flat_grads(*rt)}, {"branch", flat_grads(*rb)}};

  auto [st, sb] = make();
  ShardedModel m("m", world, sharding(GetParam()));
  m.add_unit("trunk", st.ptr(), [st = st](const at::Tensor& t) mutable { return st->forward(t); });
  m.add_unit("branch", sb.ptr(), [sb = sb, apply_branch](const TensorList& in) mutable {
    return TensorList{apply_branch(sb, in.at(0), in.at(1))};
  });
  m.set_program([](ShardedModel& mm, const TensorList& in) {
    at::Tensor h = mm.unit("trunk").forward(in.at(0));
    return mm.unit("branch").forward(TensorList{h, in.at(1)});
  });
  for (int step = 0; step < 2; ++step) {  // twice: the second backward follows the recorded order
    m.zero_grad();
    m.forward(TensorList{x.narrow(0, world.rank() * local, local), flag_of(world.rank())}).at(0).pow(2).mean().backward();
    // Summation order only: the average of N rank-partial sums against one sum, in float64
    // (a handful of roundings of about 1.1e-16 relative each).
    test_util::max_rel_diff(grads_of(m, world), want, "stage " + std::to_string(GetParam()), 1e-12);
  }
  EXPECT_EQ(m.memory_stats().full_param_bytes_alive, 0) << "a unit stayed gathered after backward";
}

INSTANTIATE_TEST_SUITE_P(Stages, RankBranch, ::testing::Values(0, 1, 2, 3));

// Frozen elements: one unit holding Linear(5, 6), Tanh, Linear(6, 3); it trains two steps
// with everything trainable (so Adam's moments and SGD's momentum are non-zero), then
// layer 0's bias and layer 2's weight are frozen for three more steps. Weight decay is on.
struct FrozenCase {
  std::string name;
  OptimizerConfig cfg;
  std::function<std::shared_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)> reference;
};

std::vector<FrozenCase> frozen_cases() {
  std::vector<FrozenCase> cases;
  OptimizerConfig adam;
  adam.type = OptimizerType::kAdam;
  adam.lr = 1e-2, adam.beta1 = 0.9, adam.beta2 = 0.999, adam.eps = 1e-8, adam.weight_decay = 0.1;
  auto adam_ref = [adam](bool decoupled) {
    return [adam, decoupled](std::vector<at::Tensor> ps) -> std::shared_ptr<torch::optim::Optimizer> {
      if (decoupled) {
        return std::make_shared<torch::optim::AdamW>(
            ps, torch::optim::AdamWOptions(adam.lr).betas({adam.beta1, adam.beta2}).eps(adam.eps).weight_decay(adam.weight_decay));
      }
      return std::make_shared<torch::optim::Adam>(
          ps, torch::optim::AdamOptions(adam.lr).betas({adam.beta1, adam.beta2}).eps(adam.eps).weight_decay(adam.weight_decay));
    };
  };
  cases.push_back({"adam", adam, adam_ref(false)});
  OptimizerConfig adamw = adam;
  adamw.type = OptimizerType::kAdamW;
  cases.push_back({"adamw", adamw, adam_ref(true)});
  OptimizerConfig sgd;
  sgd.type = OptimizerType::kSgd;
  sgd.lr = 5e-2, sgd.momentum = 0.9, sgd.weight_decay = 0.1;
  cases.push_back({"sgd_momentum", sgd, [sgd](std::vector<at::Tensor> ps) -> std::shared_ptr<torch::optim::Optimizer> {
                     return std::make_shared<torch::optim::SGD>(
                         ps, torch::optim::SGDOptions(sgd.lr).momentum(sgd.momentum).weight_decay(sgd.weight_decay));
                   }});
  OptimizerConfig rms;
  rms.type = OptimizerType::kRmsprop;
  rms.lr = 1e-2, rms.momentum = 0.5, rms.weight_decay = 0.1, rms.alpha = 0.99, rms.eps = 1e-8;
  cases.push_back({"rmsprop", rms, [rms](std::vector<at::Tensor> ps) -> std::shared_ptr<torch::optim::Optimizer> {
                     return std::make_shared<torch::optim::RMSprop>(
                         ps, torch::optim::RMSpropOptions(rms.lr).momentum(rms.momentum).weight_decay(rms.weight_decay)
                                 .alpha(rms.alpha).eps(rms.eps));
                   }});
  OptimizerConfig off = adam;
  off.offload.optimizer = OffloadDevice::kCpu;
  cases.push_back({"adam_offload_cpu", off, adam_ref(false)});
  OptimizerConfig offp = off;
  offp.offload.param = OffloadDevice::kCpu;
  cases.push_back({"adam_offload_param_cpu", offp, adam_ref(false)});
  OptimizerConfig disk = adam;
  disk.offload.optimizer = OffloadDevice::kDisk;
  disk.offload.buffer_bytes = 1 << 20;
  cases.push_back({"adam_offload_disk", disk, adam_ref(false)});
  return cases;
}

class FrozenMask : public ::testing::TestWithParam<int> {};

TEST_P(FrozenMask, FrozenElementsKeepValueAndStateUnderEveryOptimizer) {
  MpiCommunicator world(MPI_COMM_WORLD, 60.0);
  const int stage = GetParam(), n = world.world_size(), local = 2;
  const std::string tmp = "frozen_mask_tmp.rank" + std::to_string(world.rank());
  std::filesystem::create_directories(tmp);
  auto make = [] {
    torch::manual_seed(41);
    nn::Sequential seq(nn::Linear(5, 6), nn::Tanh(), nn::Linear(6, 3));
    seq->to(torch::kDouble);
    return seq;
  };
  auto freeze = [](nn::Sequential& seq) {
    seq[0]->as<nn::Linear>()->bias.requires_grad_(false);
    seq[2]->as<nn::Linear>()->weight.requires_grad_(false);
  };
  torch::manual_seed(42);
  std::vector<at::Tensor> batches;
  for (int s = 0; s < 5; ++s) batches.push_back(torch::randn({n * local, 5}, torch::kDouble));
  for (FrozenCase c : frozen_cases()) {
    if (c.cfg.offload.param != OffloadDevice::kNone && stage != 3) continue;  // parameter offload is stage 3 only
    if (c.cfg.offload.optimizer == OffloadDevice::kDisk) c.cfg.offload.path = tmp;
    SCOPED_TRACE(c.name + ", stage " + std::to_string(stage));
    // Reference: torch::optim on the whole batch; frozen parameters get no gradient, so
    // torch leaves them (and their state) alone.
    nn::Sequential ref = make();
    auto opt_ref = c.reference(ref->parameters());
    // Sharded.
    nn::Sequential seq = make();
    ShardedModel m("m", world, sharding(stage));
    wrap_sequential(m, seq, WrapPolicy{});
    ASSERT_EQ(m.units().size(), 1u);
    auto opt = make_optimizer(m, c.cfg);
    std::vector<std::pair<std::string, at::Tensor>> at_freeze;
    for (int s = 0; s < 5; ++s) {
      if (s == 2) {
        freeze(ref);
        freeze(seq);
        at_freeze = m.gather_full_parameters();
      }
      opt_ref->zero_grad();  // set_to_none: a frozen parameter has no gradient
      ref->forward(batches[s]).pow(2).mean().backward();
      opt_ref->step();
      m.forward(batches[s].narrow(0, world.rank() * local, local)).pow(2).mean().backward();
      opt->step();
      m.after_optimizer_step();
      m.zero_grad();
    }
    auto got = m.gather_full_parameters();
    std::vector<std::pair<std::string, at::Tensor>> want;
    for (auto& kv : ref->named_parameters()) want.emplace_back("u0-2." + kv.key(), kv.value().detach());
    // Float64, five steps: the sharded gradient is an average of N partial means, which
    // differs from the one-sum mean by a few ulps; Adam and RMSprop divide by sqrt of a
    // second moment >= (1 - beta2) g^2, which amplifies it by no more than ~1/(1 - beta2)^.5
    // = 32. 1e-12 is over 100x that bound and far below one step's movement (>= 1e-4).
    test_util::max_rel_diff(got, want, c.name, 1e-12);
    for (size_t i = 0; i < got.size(); ++i) {
      const bool frozen = got[i].first == "u0-2.0.bias" || got[i].first == "u0-2.2.weight";
      EXPECT_EQ(torch::equal(at_freeze[i].second, got[i].second), frozen) << got[i].first;
    }
  }
  std::filesystem::remove_all(tmp);
}

INSTANTIATE_TEST_SUITE_P(Stages, FrozenMask, ::testing::Values(0, 2, 3));

// The grace-period rule (preemption.h): abandon when the grace left is under 1.25 x (rest
// of the step + a save) + 1 s, or when no step length is known yet; never without a signal.
TEST(PreemptGrace, AbandonsOnlyWhenTheRestOfTheStepAndASaveDoNotFit) {
  EXPECT_FALSE(must_abandon_step(20, -1, 30, 1, 2));  // no signal
  EXPECT_TRUE(must_abandon_step(20, 0.5, 30, 1, 2));  // 19.5 s left < 1.25 x 31 + 1
  EXPECT_FALSE(must_abandon_step(120, 1, 30, 1, 2));  // 119 s left > 1.25 x 31 + 1 = 39.75
  EXPECT_TRUE(must_abandon_step(120, 90, 30, 1, 2));  // 30 s left now
  EXPECT_FALSE(must_abandon_step(20, 1, 30, 29, 2));  // 1 s of the step and 2 s of save: 4.75 s needed
  EXPECT_TRUE(must_abandon_step(1000, 0, 0, 0, 0));   // the first step: its length is unknown
}

// A graph that outlives its unit (issue 22): the unit's autograd hooks used to hold a
// bare `this`, so this backward called into freed memory (ASan: heap-use-after-free). It
// must throw a std::logic_error-derived message naming the unit instead.
TEST(Lifetime, BackwardAfterTheModelIsDestroyedThrowsNamingTheUnit) {
  MpiCommunicator self(MPI_COMM_SELF, 60.0);
  for (int stage : {0, 3}) {
    at::Tensor loss;
    {
      torch::manual_seed(1);
      nn::Linear a(4, 3), b(3, 2);
      ShardedModel m("m", self, sharding(stage));
      m.add_unit("a", a.ptr(), [a](const at::Tensor& t) mutable { return a->forward(t); });
      m.add_unit("b", b.ptr(), [b](const at::Tensor& t) mutable { return b->forward(t); });
      loss = m.forward(torch::randn({5, 4})).pow(2).sum();
    }  // the model and its units are gone; the graph behind `loss` is not
    try {
      loss.backward();
      ADD_FAILURE() << "stage " << stage << ": backward through destroyed units did not throw";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("sharding unit 'b' was destroyed before the backward"), std::string::npos)
          << e.what();
    }
  }
}

}  // namespace

}  // namespace SHARDGAN_UNITY_ID
