// Units with several inputs and outputs, programs that run units out of registration order,
// release of a frozen model in backward, parameter ownership, FullParameters, and deferred
// sharded initialization. Run under mpirun at several world sizes.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "shardgan/comm/local_communicator.h"
#include "shardgan/comm/mpi_communicator.h"
#include "shardgan/models/dcgan.h"
#include "shardgan/sharding/deferred.h"
#include "test_util.h"
#include "shardgan/models/biggan.h"

// The gtest files compile together in batches (tests/CMakeLists.txt): this file's names
// live in a namespace of its own.
namespace SHARDGAN_UNITY_ID {

using namespace shardgan;
using shardgan::test_util::sharding;
namespace nn = torch::nn;

namespace {

// A conditional toy: "embed" maps labels to a vector that every "block" consumes together
// with the activation (BigGAN's shared embedding); blocks return {h, aux}.
struct Block : nn::Module {
  Block(int64_t w, int64_t e) : lin(register_module("lin", nn::Linear(w, w))),
                                cond(register_module("cond", nn::Linear(e, w))) {}
  nn::Linear lin, cond;
};

ModelSpec toy_spec(int64_t blocks, int64_t w = 6, int64_t e = 3, bool reverse = false) {
  ModelSpec s{"toy", {}, {}};
  s.units.push_back({"embed", [=](bool) {
                       auto emb = nn::Embedding(5, e);
                       return BuiltUnit{emb.ptr(), [emb](const TensorList& in) mutable {
                                          return TensorList{emb->forward(in.at(0))};
                                        }};
                     }});
  for (int64_t i = 0; i < blocks; ++i) {
    s.units.push_back({"block" + std::to_string(i), [=](bool) {
                         auto b = std::make_shared<Block>(w, e);
                         return BuiltUnit{b, [b](const TensorList& in) {
                                            at::Tensor h = torch::tanh(b->lin->forward(in.at(0)) + b->cond->forward(in.at(1)));
                                            return TensorList{h, h.sum(1)};
                                          }};
                       }});
  }
  s.program = [blocks, reverse](ShardedModel& m, const TensorList& in) {
    at::Tensor emb = m.unit("embed").forward(TensorList{in.at(1)}).at(0);
    at::Tensor h = in.at(0), aux = torch::zeros({in.at(0).size(0)}, in.at(0).options());
    for (int64_t k = 0; k < blocks; ++k) {
      const int64_t i = reverse ? blocks - 1 - k : k;
      TensorList out = m.unit("block" + std::to_string(i)).forward(TensorList{h, emb});
      h = out.at(0);
      aux = aux + out.at(1);
    }
    return TensorList{h, aux};
  };
  return s;
}

std::vector<std::pair<std::string, at::Tensor>> grads_of(ShardedModel& m, Communicator& comm) {
  // The averaged gradient shards, gathered into full flat tensors per unit.
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& u : m.units()) {
    at::Tensor full = torch::empty({u->padded_numel()}, u->grad_shard().options());
    if (u->stage() == 0) full = u->grad_shard().clone();
    else comm.all_gather(full, u->grad_shard());
    out.emplace_back(u->name(), full.narrow(0, 0, u->numel()));
  }
  return out;
}

TEST(Units, MultiInputMultiOutputGradientsMatchPlainAutograd) {
  MpiCommunicator world(MPI_COMM_WORLD, 60.0);
  LocalCommunicator self;
  const int n = world.world_size();
  const int64_t per_rank = 2, batch = per_rank * n;
  auto sharded = build_sharded_model(toy_spec(3), world, sharding(3), 11, at::kDouble);
  // Reference: the same units built unsharded on one rank, run by plain LibTorch autograd
  // on the whole batch (no reduction code involved: one rank, stage 0, the mean loss).
  auto ref = build_sharded_model(toy_spec(3), self, sharding(0), 11, at::kDouble);
  auto gen = at::detail::createCPUGenerator(5);
  at::Tensor x = at::randn({batch, 6}, gen, torch::kDouble), y = at::randint(5, {batch}, gen, torch::kLong);
  auto loss = [](const TensorList& o) { return o.at(0).pow(2).mean() + o.at(1).mean(); };
  loss(ref->forward(TensorList{x, y})).backward();
  TensorList mine{x.narrow(0, world.rank() * per_rank, per_rank), y.narrow(0, world.rank() * per_rank, per_rank)};
  loss(sharded->forward(mine)).backward();  // the per-rank mean; reduce-scatter averages
  auto a = grads_of(*sharded, world), b = grads_of(*ref, self);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    // float64, a handful of sums: rounding only (2^-52 relative per op, tens of ops).
    const double scale = b[i].second.abs().max().item<double>();
    EXPECT_GT(scale, 0.0) << a[i].first;
    EXPECT_LE((a[i].second - b[i].second).abs().max().item<double>(), 1e-13 * scale) << a[i].first;
  }
  EXPECT_EQ(sharded->memory_stats().full_param_bytes_alive, 0);
}

TEST(Units, PrefetchFollowsTheRecordedExecutionOrder) {
  MpiCommunicator world(MPI_COMM_WORLD, 60.0);
  auto m = build_sharded_model(toy_spec(3, 6, 3, /*reverse=*/true), world, sharding(3), 3, at::kDouble);
  TensorList in{torch::randn({2, 6}, torch::kDouble), torch::zeros({2}, torch::kLong)};
  torch::NoGradGuard no_grad;
  m->forward(in);
  // Registration order is embed, block0, block1, block2; the program ran embed, block2,
  // block1, block0.
  EXPECT_EQ(m->execution_order(), (std::vector<size_t>{0, 3, 2, 1}));
  // On the next pass, running block2 must prefetch block1 (the next in the recorded order),
  // not block0 (the next registered).
  m->unit("embed").forward(TensorList{in[1]});
  m->unit("block2").forward(TensorList{in[0], torch::zeros({2, 3}, torch::kDouble)});
  EXPECT_TRUE(m->unit("block1").gathered());
  EXPECT_FALSE(m->unit("block0").gathered());
  for (auto& u : m->units()) u->free_full();
}

TEST(Units, FrozenModelIsReleasedUnitByUnitInBackward) {
  MpiCommunicator world(MPI_COMM_WORLD, 60.0);
  const int64_t units = 6;
  auto d = build_sharded_model(toy_spec(units - 1), world, sharding(3), 4, at::kDouble);
  d->set_requires_grad(false);
  int64_t largest = 0;
  for (auto& u : d->units()) largest = std::max(largest, u->padded_numel() * 8);
  at::Tensor x = torch::randn({2, 6}, torch::kDouble).requires_grad_(true);
  TensorList in{x, torch::zeros({2}, torch::kLong)};
  { torch::NoGradGuard g; d->forward(in); }  // records the order
  // Count the gathered bytes as backward proceeds: the largest value must stay within three
  // units (the one computing, the one prefetched, one finishing), as in the D step. Before
  // units were released on their input gradient, all six stayed gathered until the end.
  int64_t worst = 0;
  TensorList out = d->forward(in);
  out[0].register_hook([&](const at::Tensor&) { worst = std::max(worst, d->memory_stats().full_param_bytes_alive); });
  x.register_hook([&](const at::Tensor&) { worst = std::max(worst, d->memory_stats().full_param_bytes_alive); });
  (out[0].pow(2).mean() + out[1].mean()).backward();
  ASSERT_TRUE(x.grad().defined());
  const int64_t peak = d->memory_stats().peak_full_param_bytes;
  EXPECT_LE(peak, 3 * largest) << "a frozen model stayed gathered through backward";
  EXPECT_GT(peak, 0);
  EXPECT_LE(worst, 3 * largest);
  EXPECT_EQ(d->memory_stats().full_param_bytes_alive, 0);
}

// A unit whose first layer is frozen and whose last layer trains (issue 10): its trainable
// gradients are complete before the backward reaches the frozen layer, which still needs
// its weight to pass the gradient on to the unit's input. The unit must stay gathered
// until that input gradient exists (it counts input gradients as well as parameter
// gradients). Compared with plain autograd on unsharded copies at stage 3.
TEST(Units, PartlyFrozenUnitKeepsItsFrozenWeightForTheInputGradient) {
  MpiCommunicator world(MPI_COMM_WORLD, 60.0);
  auto make = [] {
    torch::manual_seed(21);
    nn::Linear first(4, 6);
    nn::Sequential mixed(nn::Linear(6, 6), nn::Functional([](const at::Tensor& t) { return torch::tanh(t); }), nn::Linear(6, 3));
    first->to(torch::kDouble);
    mixed->to(torch::kDouble);
    for (auto& p : mixed[0]->parameters()) p.requires_grad_(false);  // frozen, first in the unit
    return std::make_pair(first, mixed);
  };
  const int64_t global = 6, local = global / world.world_size();
  torch::manual_seed(22);
  const at::Tensor x = torch::randn({global, 4}, torch::kDouble);
  // Reference: plain autograd, whole batch.
  auto [rf, rm] = make();
  rm->forward(rf->forward(x)).pow(2).mean().backward();
  std::vector<at::Tensor> want_first, want_mixed;
  for (auto& p : rf->parameters()) want_first.push_back(p.grad().reshape({-1}));
  for (auto& p : rm->parameters()) {
    want_mixed.push_back(p.grad().defined() ? p.grad().reshape({-1}) : torch::zeros({p.numel()}, torch::kDouble));
  }
  // Sharded, stage 3.
  auto [sf, sm] = make();
  ShardedModel m("m", world, sharding(3));
  m.add_unit("first", sf.ptr(), [sf = sf](const at::Tensor& t) mutable { return sf->forward(t); });
  m.add_unit("mixed", sm.ptr(), [sm = sm](const at::Tensor& t) mutable { return sm->forward(t); });
  m.forward(x.narrow(0, world.rank() * local, local)).pow(2).mean().backward();
  auto got = grads_of(m, world);
  const double tol = 1e-12;  // summation order only (the rank-partial gradient average)
  test_util::max_rel_diff({{"first", got[0].second}, {"mixed", got[1].second}},
                          {{"first", torch::cat(want_first)}, {"mixed", torch::cat(want_mixed)}}, "partly frozen", tol);
  EXPECT_EQ(m.memory_stats().full_param_bytes_alive, 0) << "a unit stayed gathered after backward";
}

TEST(Units, ParameterInTwoUnitsIsAnErrorNamingIt) {
  MpiCommunicator world(MPI_COMM_WORLD, 60.0);
  ShardedModel m("twice", world, sharding(3));
  auto lin = nn::Linear(3, 3);
  m.add_unit("a", lin.ptr(), ShardedUnit::SingleForward([lin](const at::Tensor& x) mutable { return lin->forward(x); }));
  try {
    m.add_unit("b", lin.ptr(), ShardedUnit::SingleForward([lin](const at::Tensor& x) mutable { return lin->forward(x); }));
    FAIL() << "a parameter in two units was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("twice.b.weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("twice.a.weight"), std::string::npos) << e.what();
  }
}

TEST(Units, ParameterInNoUnitIsAnErrorOnFirstForward) {
  MpiCommunicator world(MPI_COMM_WORLD, 60.0);
  ModelSpec s = toy_spec(1);
  auto stray = torch::randn({6}, torch::kDouble).requires_grad_(true);  // belongs to no unit
  auto inner = s.program;
  s.program = [inner, stray](ShardedModel& m, const TensorList& in) {
    TensorList o = inner(m, in);
    return TensorList{o[0] * stray, o[1]};
  };
  auto m = build_sharded_model(s, world, sharding(3), 1, at::kDouble);
  TensorList in{torch::randn({2, 6}, torch::kDouble), torch::zeros({2}, torch::kLong)};
  try {
    m->forward(in);
    FAIL() << "a parameter outside every unit was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[6]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("no sharding unit"), std::string::npos) << e.what();
  }
  for (auto& u : m->units()) u->free_full();
}

TEST(Units, FullParametersScopeAndFreedParametersThrow) {
  MpiCommunicator world(MPI_COMM_WORLD, 60.0);
  auto m = build_sharded_model(toy_spec(2), world, sharding(3), 2, at::kDouble);
  ShardedUnit& u0 = m->unit("block0");
  // Freed: no memory behind it (a null data pointer, never freed memory), and the checked
  // accessor refuses.
  EXPECT_EQ(u0.slots()[0].param.storage().data(), nullptr);
  EXPECT_THROW(u0.param(0), std::logic_error);
  auto expected = m->gather_full_parameters();
  {
    FullParameters full(*m);
    size_t i = 0;
    for (auto& u : m->units()) {
      for (auto& s : u->slots()) {
        EXPECT_TRUE(torch::equal(s.param, expected[i].second)) << expected[i].first;
        ++i;
      }
    }
    EXPECT_NO_THROW(u0.param(0));
  }
  EXPECT_EQ(m->memory_stats().full_param_bytes_alive, 0);
  EXPECT_THROW(u0.param(0), std::logic_error);
}

TEST(Units, DeferredInitDependsOnSeedAndUnitOnly) {
  MpiCommunicator world(MPI_COMM_WORLD, 60.0);
  LocalCommunicator self;
  DcganConfig c;
  c.z_dim = 8; c.g_width = 4; c.dtype = at::kDouble;
  auto sharded = build_generator(c, world, sharding(3), 21);
  auto ref = build_generator(c, self, sharding(0), 21);
  auto a = sharded->gather_full_parameters(), b = ref->gather_full_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << a[i].first;
  // Another seed gives other values; another unit of the same seed its own stream.
  auto other = build_generator(c, self, sharding(0), 22)->gather_full_parameters();
  EXPECT_FALSE(torch::equal(other[0].second, b[0].second));
  EXPECT_NE(unit_seed(21, "block0"), unit_seed(21, "block1"));
}

}  // namespace


namespace {

// The real BigGAN D (spectral norm, residual blocks, attention, projection) at stage 3:
// in the D step (real and fake each with its own backward, as GanObjective runs them) and in
// the G step (frozen, input gradients only) no more than three units may be gathered at
// once. One backward through both forwards held every unit (the engine finishes the fake
// path first): 1142816 B gathered against a bound of 469248 B here.
TEST(Units, BigganDiscriminatorHoldsAtMostThreeUnitsInBackward) {
  MpiCommunicator world(MPI_COMM_WORLD, 60.0);
  BigGanConfig c;
  c.ch = c.d_ch = 8;
  c.z_dim = 8;
  c.shared_dim = 8;
  c.d_blocks_per_res = 1;
  auto fam = make_biggan_family(c);
  auto d = build_sharded_model(fam->discriminator(world), world, sharding(3), 1, at::kDouble);
  int64_t largest = 0;
  for (auto& u : d->units()) largest = std::max(largest, u->padded_numel() * 8);
  at::Tensor y = torch::zeros({2}, torch::kLong);
  at::Tensor real = torch::randn({2, 1, 32, 32}, torch::kDouble);
  at::Tensor fake = torch::randn({2, 1, 32, 32}, torch::kDouble);
  d->forward(TensorList{real, y}).at(0).mean().backward();
  (-d->forward(TensorList{fake, y}).at(0).mean()).backward();
  EXPECT_EQ(d->memory_stats().full_param_bytes_alive, 0);
  EXPECT_LE(d->memory_stats().peak_full_param_bytes, 3 * largest) << "D step";
  d->zero_grad();
  d->set_requires_grad(false);
  at::Tensor x = fake.clone().requires_grad_(true);
  d->forward(TensorList{x, y}).at(0).mean().backward();
  EXPECT_TRUE(x.grad().defined());
  EXPECT_LE(d->memory_stats().peak_full_param_bytes, 3 * largest) << "G step";
  if (world.rank() == 0) {
    std::printf("[biggan D] %zu units, largest %lld B, peak gathered %lld B\n", d->units().size(),
                (long long)largest, (long long)d->memory_stats().peak_full_param_bytes);
  }
}

}  // namespace

}  // namespace SHARDGAN_UNITY_ID
