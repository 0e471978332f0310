// Gradients of a ZeRO-3 sharded model against plain LibTorch autograd (issue 10): the
// reference is the same network built from torch::nn modules only (torch::nn::BatchNorm2d
// where the sharded model has our SyncBatchNorm), run unsharded on one process over the
// whole global batch. It shares none of our code: no flattening, no stage-0 path, no
// gradient reduction. Run on 1, 2 and 3 ranks, float64.
//
// The sharded gradient of each parameter is its reduce-scattered (averaged) flat shard,
// all-gathered here and cut at the unit's parameter offsets. Tolerance 1e-12 relative to
// the tensor's largest gradient: only summation order differs (per-rank partial sums of
// ~100 terms in the reduction and in SyncBatchNorm's statistics, ~1e-16 each). Negative
// control, in the test on N >= 2: rank 1's loss scaled by 2 (its gradient contribution
// doubled, as a sum where an average belongs would) must fail the same bound.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "shardgan/comm/mpi_communicator.h"
#include "shardgan/nn/sync_batchnorm.h"
#include "shardgan/sharding/sharded_model.h"

// The gtest files compile together in batches (tests/CMakeLists.txt): this file's names
// live in a namespace of its own.
namespace SHARDGAN_UNITY_ID {

using namespace shardgan;
namespace nn = torch::nn;

namespace {

constexpr int64_t kGlobalBatch = 12;  // divides by 1, 2 and 3 ranks

// Embedding -> Linear -> ConvTranspose+BN -> Conv+BN -> Conv: four units. `bn` makes the
// BatchNorm of channel count c: ours (SyncBatchNorm) or torch's. Convolutions in front of
// BatchNorm have no bias: its gradient is analytically zero, so only rounding noise
// would be compared.
template <typename MakeBn>
std::vector<std::pair<std::string, nn::Sequential>> blocks(MakeBn bn) {
  torch::manual_seed(5);
  std::vector<std::pair<std::string, nn::Sequential>> b;
  b.emplace_back("embed", nn::Sequential(nn::Embedding(10, 16), nn::Linear(16, 32),
                                         nn::Functional([](const at::Tensor& x) { return x.view({-1, 2, 4, 4}); })));
  b.emplace_back("up", nn::Sequential(nn::ConvTranspose2d(nn::ConvTranspose2dOptions(2, 4, 4).stride(2).padding(1).bias(false)),
                                      bn(4), nn::ReLU()));
  b.emplace_back("conv", nn::Sequential(nn::Conv2d(nn::Conv2dOptions(4, 6, 3).padding(1).bias(false)), bn(6),
                                        nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2))));
  b.emplace_back("head", nn::Sequential(nn::Conv2d(nn::Conv2dOptions(6, 1, 8)), nn::Flatten()));
  for (auto& [name, s] : b) s->to(torch::kDouble);
  return b;
}

struct Batch {
  at::Tensor labels, target;
};

Batch make_batch() {
  auto gen = at::detail::createCPUGenerator(99);
  return {at::randint(0, 10, {kGlobalBatch}, gen, torch::TensorOptions().dtype(at::kLong)),
          at::randn({kGlobalBatch}, gen, torch::TensorOptions().dtype(at::kDouble))};
}

// Reference: name -> gradient, plain autograd over the whole batch.
std::vector<std::pair<std::string, at::Tensor>> reference_grads(const Batch& b) {
  auto net = blocks([](int64_t c) { return nn::AnyModule(nn::BatchNorm2d(c)); });
  at::Tensor x = b.labels;
  for (auto& [name, s] : net) x = s->forward(x);
  (x.view(-1) - b.target).pow(2).mean().backward();
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& [name, s] : net) {
    for (auto& p : s->named_parameters()) out.emplace_back(name + "." + p.key(), p.value().grad().clone());
  }
  return out;
}

// Sharded, stage 3: name -> full gradient, all-gathered from the shards.
std::vector<std::pair<std::string, at::Tensor>> sharded_grads(MpiCommunicator& comm, MpiCommunicator& bn_comm,
                                                              const Batch& b, double rank1_loss_scale) {
  ShardingConfig cfg;
  cfg.stage = 3;
  ShardedModel model("m", comm, cfg);
  auto net = blocks([&](int64_t c) { return nn::AnyModule(SyncBatchNorm2d(c, &bn_comm)); });
  for (auto& [name, s] : net) {
    model.add_unit(name, s.ptr(), [s = s](const at::Tensor& x) mutable { return s->forward(x); });
  }
  const int64_t local = kGlobalBatch / comm.world_size(), start = comm.rank() * local;
  at::Tensor out = model.forward(b.labels.narrow(0, start, local)).view(-1);
  const double scale = comm.rank() == 1 ? rank1_loss_scale : 1.0;
  ((out - b.target.narrow(0, start, local)).pow(2).mean() * scale).backward();
  std::vector<std::pair<std::string, at::Tensor>> grads;
  for (auto& u : model.units()) {
    at::Tensor full = torch::empty({u->padded_numel()}, u->grad_shard().options());
    comm.all_gather(full, u->grad_shard());
    for (const auto& s : u->slots()) {
      grads.emplace_back(u->name() + "." + s.name, full.narrow(0, s.offset, s.numel).view(s.shape).clone());
    }
  }
  return grads;
}

double worst_rel(const std::vector<std::pair<std::string, at::Tensor>>& got,
                 const std::vector<std::pair<std::string, at::Tensor>>& want, bool expect_within, double tol) {
  EXPECT_EQ(got.size(), want.size());
  double worst = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i].first);
    const double scale = want[i].second.abs().max().item<double>();
    const double rel = (got[i].second - want[i].second).abs().max().item<double>() / std::max(scale, 1e-300);
    if (expect_within) {
      EXPECT_LE(rel, tol) << got[i].first << " (largest reference gradient " << scale << ")";
    }
    worst = std::max(worst, rel);
  }
  return worst;
}

TEST(GradRef, Stage3GradientsMatchPlainAutograd) {
  MpiCommunicator comm(MPI_COMM_WORLD, 60.0), bn_comm(MPI_COMM_WORLD, 60.0);
  const Batch b = make_batch();
  const auto want = reference_grads(b);
  ASSERT_EQ(want.size(), 11u);  // embedding, linear w+b, 2 x (conv w, BN w+b), head w+b
  const double tol = 1e-12;
  const double worst = worst_rel(sharded_grads(comm, bn_comm, b, 1.0), want, true, tol);
  if (comm.rank() == 0) std::printf("[grad_ref] N=%d: worst relative difference %.3g (tolerance %.0e)\n", comm.world_size(), worst, tol);
  if (comm.world_size() >= 2) {
    const double broken = worst_rel(sharded_grads(comm, bn_comm, b, 2.0), want, false, tol);
    EXPECT_GT(broken, tol) << "rank 1's gradient doubled passed the bound: the test cannot fail";
    if (comm.rank() == 0) std::printf("[grad_ref] N=%d, rank 1 gradient x2: worst %.3g (must exceed %.0e)\n", comm.world_size(), broken, tol);
  }
}

}  // namespace

}  // namespace SHARDGAN_UNITY_ID
