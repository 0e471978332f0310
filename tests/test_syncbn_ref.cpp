// SyncBatchNorm against an independent reference (issue 10): ATen's own at::batch_norm on
// the concatenated global batch, which shares none of our code, plus a float64 gradient
// check by central differences. Run on 1, 2 and 3 ranks; each rank holds B/N samples.
//
// Tolerances, float64. Our statistics are E[x^2] - E[x]^2 summed per rank, ATen's a Welford
// pass: both are exact to ~1e-16 relative times the cancellation factor E[x^2]/Var(x)
// (here < 5: inputs have mean 0.5 and std >= 0.5) times sqrt of the reduction length
// (B*H*W = 120): about 1e-14. We allow 1e-12. A wrong reduction (local statistics, a
// missing all-reduce in backward, a sum where an average belongs) is an O(1) error on
// N >= 2 ranks. Negative control in the test (N >= 2): the same module on MPI_COMM_SELF,
// i.e. with every all-reduce missing (local statistics), must fail the same bounds.
// The gradient check uses h = 1e-5: truncation O(h^2 f''') ~ 1e-10 and rounding
// eps * |L| / h ~ 1e-16 * 1e2 / 1e-5 = 1e-9, so we allow 1e-7 relative.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "shardgan/comm/mpi_communicator.h"
#include "shardgan/nn/sync_batchnorm.h"

// The gtest files compile together in batches (tests/CMakeLists.txt): this file's names
// live in a namespace of its own.
namespace SHARDGAN_UNITY_ID {

using namespace shardgan;

namespace {

constexpr int64_t kB = 6, kC = 3, kH = 4, kW = 5;
constexpr double kEps = 1e-5, kMomentum = 0.1;
const auto kF64 = torch::TensorOptions().dtype(torch::kDouble);

struct Inputs {
  at::Tensor x, dy, weight, bias;  // global batch (every rank draws the same)
};

Inputs make_inputs() {
  torch::manual_seed(7);
  Inputs in;
  // Per-channel means and scales differ, so the statistics matter per channel.
  in.x = torch::randn({kB, kC, kH, kW}, kF64) * torch::tensor({0.5, 1.0, 2.0}, kF64).view({1, kC, 1, 1}) + 0.5;
  in.dy = torch::randn({kB, kC, kH, kW}, kF64);
  in.weight = torch::rand({kC}, kF64) + 0.5;
  in.bias = torch::randn({kC}, kF64);
  return in;
}

double rel(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / std::max(b.abs().max().item<double>(), 1e-300);
}

class SyncBnRef : public ::testing::Test {
 protected:
  MpiCommunicator comm{MPI_COMM_WORLD, 60.0};
  int n = comm.world_size(), r = comm.rank();
  int64_t local = kB / n;
  at::Tensor mine(const at::Tensor& global) const { return global.narrow(0, r * local, local).contiguous(); }
  void SetUp() override { ASSERT_EQ(kB % n, 0) << "run on 1, 2, 3 or 6 ranks"; }
};

TEST_F(SyncBnRef, ForwardBackwardAndRunningStatsMatchAtenOnTheGlobalBatch) {
  const Inputs in = make_inputs();
  // Reference: one process, the whole batch, ATen's batch norm with autograd.
  at::Tensor xr = in.x.clone().requires_grad_(true);
  at::Tensor wr = in.weight.clone().requires_grad_(true), br = in.bias.clone().requires_grad_(true);
  at::Tensor rm_ref = torch::full({kC}, 0.2, kF64), rv_ref = torch::full({kC}, 1.5, kF64);
  at::Tensor yr = at::batch_norm(xr, wr, br, rm_ref, rv_ref, /*training=*/true, kMomentum, kEps,
                                 /*cudnn_enabled=*/false);
  yr.backward(in.dy);

  // Ours: this rank's B/N samples, the module in float64.
  SyncBatchNorm2d bn(kC, &comm, kEps, kMomentum);
  bn->to(torch::kDouble);
  {
    torch::NoGradGuard g;
    bn->weight.copy_(in.weight);
    bn->bias.copy_(in.bias);
    bn->running_mean.fill_(0.2);
    bn->running_var.fill_(1.5);
  }
  at::Tensor x = mine(in.x).requires_grad_(true);
  at::Tensor y = bn->forward(x);
  y.backward(mine(in.dy));

  EXPECT_LE(rel(y, mine(yr.detach())), 1e-12) << "output";
  EXPECT_LE(rel(x.grad(), mine(xr.grad())), 1e-12) << "input gradient";
  // Parameter gradients are per-rank partial sums; the data-parallel reduction adds them.
  at::Tensor dw = bn->weight.grad().clone(), db = bn->bias.grad().clone();
  comm.all_reduce(dw, ReduceOp::kSum);
  comm.all_reduce(db, ReduceOp::kSum);
  EXPECT_LE(rel(dw, wr.grad()), 1e-12) << "weight gradient";
  EXPECT_LE(rel(db, br.grad()), 1e-12) << "bias gradient";
  // Running statistics: the global mean and the global unbiased variance, as ATen keeps them.
  EXPECT_LE(rel(bn->running_mean, rm_ref), 1e-12) << "running mean";
  EXPECT_LE(rel(bn->running_var, rv_ref), 1e-12) << "running variance";

  if (n >= 2) {  // negative control: local statistics (no all-reduce) must fail the bounds
    MpiCommunicator self(MPI_COMM_SELF, 60.0);
    SyncBatchNorm2d local_bn(kC, &self, kEps, kMomentum);
    local_bn->to(torch::kDouble);
    {
      torch::NoGradGuard g;
      local_bn->weight.copy_(in.weight);
      local_bn->bias.copy_(in.bias);
    }
    at::Tensor xl = mine(in.x).requires_grad_(true);
    at::Tensor yl = local_bn->forward(xl);
    yl.backward(mine(in.dy));
    EXPECT_GT(rel(yl, mine(yr.detach())), 1e-12) << "local statistics passed the output bound";
    EXPECT_GT(rel(xl.grad(), mine(xr.grad())), 1e-12) << "local statistics passed the input-gradient bound";
  }

  // Eval mode uses the running statistics, as ATen's does.
  bn->eval();
  at::Tensor ye = bn->forward(mine(in.x));
  at::Tensor ye_ref = at::batch_norm(in.x, in.weight, in.bias, rm_ref, rv_ref, false, kMomentum, kEps, false);
  EXPECT_LE(rel(ye, mine(ye_ref)), 1e-12) << "eval output";
}

// The functional, non-affine form (the path of BigGAN's class-conditional BN), float64.
TEST_F(SyncBnRef, NonAffineFunctionalMatchesAten) {
  const Inputs in = make_inputs();
  at::Tensor xr = in.x.clone().requires_grad_(true);
  at::Tensor rm_ref = torch::zeros({kC}, kF64), rv_ref = torch::ones({kC}, kF64);
  at::Tensor yr = at::batch_norm(xr, {}, {}, rm_ref, rv_ref, true, kMomentum, kEps, false);
  yr.backward(in.dy);
  at::Tensor rm = torch::zeros({kC}, kF64), rv = torch::ones({kC}, kF64);
  at::Tensor x = mine(in.x).requires_grad_(true);
  at::Tensor y = sync_batch_norm(x, {}, {}, rm, rv, true, kEps, kMomentum, &comm);
  y.backward(mine(in.dy));
  EXPECT_LE(rel(y, mine(yr.detach())), 1e-12);
  EXPECT_LE(rel(x.grad(), mine(xr.grad())), 1e-12);
  EXPECT_LE(rel(rm, rm_ref), 1e-12);
  EXPECT_LE(rel(rv, rv_ref), 1e-12);
}

// Float64 gradient check of the distributed op: L = sum over ranks of <dy, y>. For random
// directions v (of x, weight and bias), the analytic <grad, v> summed over ranks must equal
// (L(p + h v) - L(p - h v)) / 2h, where every forward is the collective op itself.
TEST_F(SyncBnRef, GradcheckCentralDifferences) {
  const Inputs in = make_inputs();
  torch::manual_seed(11);
  const at::Tensor vx = torch::randn({kB, kC, kH, kW}, kF64), vw = torch::randn({kC}, kF64),
                   vb = torch::randn({kC}, kF64);
  auto loss = [&](const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
    at::Tensor rm = torch::zeros({kC}, kF64), rv = torch::ones({kC}, kF64);
    at::Tensor l = (sync_batch_norm(x, w, b, rm, rv, true, kEps, kMomentum, &comm) * mine(in.dy)).sum().reshape({1});
    at::Tensor total = l.detach().clone();
    comm.all_reduce(total, ReduceOp::kSum);
    return std::make_pair(l, total.item<double>());
  };
  at::Tensor x = mine(in.x).requires_grad_(true);
  at::Tensor w = in.weight.clone().requires_grad_(true), b = in.bias.clone().requires_grad_(true);
  auto [l, total] = loss(x, w, b);
  l.backward();
  at::Tensor analytic = torch::stack({(x.grad() * mine(vx)).sum(), (w.grad() * vw).sum(), (b.grad() * vb).sum()});
  comm.all_reduce(analytic, ReduceOp::kSum);
  const double h = 1e-5;
  torch::NoGradGuard g;
  const std::vector<std::tuple<const char*, at::Tensor, at::Tensor, at::Tensor>> dirs = {
      {"x", mine(vx), torch::zeros({kC}, kF64), torch::zeros({kC}, kF64)},
      {"weight", torch::zeros_like(mine(vx)), vw, torch::zeros({kC}, kF64)},
      {"bias", torch::zeros_like(mine(vx)), torch::zeros({kC}, kF64), vb}};
  for (size_t i = 0; i < dirs.size(); ++i) {
    const auto& [name, dx, dw, db] = dirs[i];
    const double plus = loss(mine(in.x) + h * dx, in.weight + h * dw, in.bias + h * db).second;
    const double minus = loss(mine(in.x) - h * dx, in.weight - h * dw, in.bias - h * db).second;
    const double numeric = (plus - minus) / (2 * h), want = analytic[i].item<double>();
    EXPECT_NEAR(want, numeric, 1e-7 * std::max(1.0, std::abs(numeric))) << "direction " << name << " (loss " << total << ")";
  }
}

}  // namespace

}  // namespace SHARDGAN_UNITY_ID
