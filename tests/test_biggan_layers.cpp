// BigGAN layers (src/models/biggan/layers.h): spectral norm against the SVD, attention
// identity at gamma = 0, class-conditional BN over the global batch, and the residual
// blocks in float32, float64 and bfloat16. The models are in test_biggan_model.cpp. Runs
// under mpirun with 1 and 2 ranks.
#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "models/biggan/layers.h"
#include "shardgan/comm/mpi_communicator.h"
#include "sn_conv_reference.h"

// The gtest files compile together in batches (tests/CMakeLists.txt): this file's names
// live in a namespace of its own.
namespace SHARDGAN_UNITY_ID {

using namespace shardgan;
using namespace shardgan::biggan;
using shardgan::test_util::plain_sigma;

namespace {

const at::ScalarType kDtypes[] = {at::kFloat, at::kDouble, at::kBFloat16};

// [out, in] with singular values 3, 1.5, 0.75, ... (ratio s2/s1 = 0.5), float64.
at::Tensor known_matrix(int64_t out, int64_t in) {
  auto q1 = std::get<0>(at::linalg_qr(torch::randn({out, out}, torch::kDouble)));
  auto q2 = std::get<0>(at::linalg_qr(torch::randn({in, in}, torch::kDouble)));
  const int64_t r = std::min(out, in);
  at::Tensor s = 3.0 * torch::pow(0.5, torch::arange(r, torch::kDouble));
  return q1.narrow(1, 0, r).mm(torch::diag(s)).mm(q2.narrow(1, 0, r).t());
}

double max_sv(const at::Tensor& w) {
  return at::linalg_svdvals(w.reshape({w.size(0), -1}).to(at::kDouble))[0].item<double>();
}

// float64: everything float64. bfloat16: mixed precision as the sharding layer does it,
// parameters bfloat16 and buffers (u, running statistics) left float32.
void cast_params(torch::nn::Module& m, at::ScalarType dt) {
  if (dt == at::kDouble) m.to(at::kDouble);
  if (dt != at::kBFloat16) return;
  torch::NoGradGuard g;
  for (auto& p : m.parameters()) p.set_data(p.detach().to(dt));
}

void set_weight(SNBase& m, const at::Tensor& w, at::ScalarType dt) {
  torch::NoGradGuard g;
  m.weight.set_data(w.reshape(m.weight.sizes()).to(dt).contiguous());
}

// Power iteration on W W^T: after k steps the estimate's relative error is at most
// tan^2(theta_0) (s2/s1)^(2k) = tan^2(theta_0) 2^-100 at k = 50, far below rounding, so the
// tolerance is rounding alone: a few ulps times the inner dimension (18), with margin.
double sn_tol(at::ScalarType dt) {
  return dt == at::kDouble ? 1e-12 : dt == at::kFloat ? 2e-5 : 2e-2;  // bf16: 2 * 2^-8 + ...
}

TEST(SpectralNorm, SigmaConvergesToLargestSingularValue) {
  torch::manual_seed(1);
  for (auto dt : kDtypes) {
    SNConv2d conv(2, 6, 3, 1);
    SNLinear lin(18, 6);
    cast_params(*conv, dt);
    cast_params(*lin, dt);
    set_weight(*conv, known_matrix(6, 18), dt);
    set_weight(*lin, known_matrix(6, 18), dt);
    {
      torch::NoGradGuard g;
      conv->bias.set_data(torch::zeros({6}, dt));
      lin->bias.set_data(torch::zeros({6}, dt));
    }
    at::Tensor x = torch::randn({2, 2, 5, 5}).to(dt), xl = torch::randn({2, 18}).to(dt);
    for (int i = 0; i < 50; ++i) {
      conv->forward(x);
      lin->forward(xl);
    }
    EXPECT_EQ(conv->u.scalar_type(), dt == at::kDouble ? at::kDouble : at::kFloat)
        << "u stays in the master dtype";
    for (SNBase* m : {static_cast<SNBase*>(conv.get()), static_cast<SNBase*>(lin.get())}) {
      const double s1 = max_sv(m->weight);
      const double got = m->last_sigma().to(at::kDouble).item<double>();
      EXPECT_NEAR(got, s1, sn_tol(dt) * s1) << dt;
      // W_bar = W / sigma has spectral norm 1.
      at::Tensor u = m->u.clone();
      auto wb = spectral_normalize(m->weight, u, false).first;
      EXPECT_NEAR(max_sv(wb), 1.0, 2 * sn_tol(dt)) << dt;
    }
  }
}

TEST(SpectralNorm, OneStepRelationAndUpdateOnlyInTraining) {
  torch::manual_seed(2);
  for (auto dt : kDtypes) {
    SNLinear lin(7, 5);
    init_weights(*lin, Init::kOrtho);
    { torch::NoGradGuard g; lin->weight.mul_(2.5); }
    cast_params(*lin, dt);
    at::Tensor u0 = lin->u.clone();
    at::Tensor u = lin->u.clone();
    auto [w_bar, sigma] = spectral_normalize(lin->weight, u, true);
    // W_bar * sigma == W, sigma > 0, u updated to normalize(v W^T), a unit vector.
    // Tolerance (rtol = atol): W / sigma and the product each round once, so the error is
    // at most 2 ulp: 2^-8 |W| in bfloat16 (4e-3: we allow 1e-2), 2^-23 |W| in float32
    // (1e-6), 2^-52 |W| in float64 (1e-14). A W_bar not divided by sigma misses by
    // |W| (sigma - 1) / sigma, over 50% here (the weight was scaled by 2.5).
    const double tol = dt == at::kBFloat16 ? 1e-2 : dt == at::kFloat ? 1e-6 : 1e-14;
    EXPECT_TRUE(torch::allclose((w_bar * sigma).to(at::kDouble), lin->weight.to(at::kDouble), tol, tol))
        << dt;
    EXPECT_GT(sigma.item<double>(), 0.0);
    EXPECT_NEAR(u.norm().item<double>(), 1.0, 1e-6);
    EXPECT_FALSE(torch::equal(u, u0));
    at::Tensor x = torch::randn({3, 7}).to(dt);
    lin->eval();
    lin->forward(x);
    EXPECT_TRUE(torch::equal(lin->u, u0)) << "eval mode must not update u";
    lin->train();
    lin->forward(x).sum().backward();
    EXPECT_FALSE(torch::equal(lin->u, u0)) << "training mode updates u";
    ASSERT_TRUE(lin->weight.grad().defined());
    EXPECT_TRUE(torch::isfinite(lin->weight.grad()).all().item<bool>());
  }
}

// At convergence, d sigma / dW = u v^T, so the gradient autograd takes with u and v held
// constant equals the true derivative of W / sigma(W): check it by central differences.
TEST(SpectralNorm, GradientMatchesFiniteDifferencesAtConvergence) {
  torch::manual_seed(3);
  SNLinear lin(4, 3);
  lin->to(at::kDouble);
  set_weight(*lin, known_matrix(3, 4), at::kDouble);
  for (int i = 0; i < 60; ++i) lin->forward(torch::zeros({1, 4}, torch::kDouble));
  at::Tensor r = torch::randn({3, 4}, torch::kDouble);
  at::Tensor u = lin->u.clone();
  at::Tensor w = lin->weight.detach().clone().requires_grad_(true);
  (spectral_normalize(w, u, false).first * r).sum().backward();
  auto f = [&](const at::Tensor& wt) {
    auto w64 = wt.clone();
    return (w64 / at::linalg_svdvals(w64)[0] * r).sum().item<double>();
  };
  const double h = 1e-6;
  for (int64_t i = 0; i < 12; ++i) {
    at::Tensor e = torch::zeros({12}, torch::kDouble);
    e[i] = h;
    e = e.view({3, 4});
    const double fd = (f(w.detach() + e) - f(w.detach() - e)) / (2 * h);
    EXPECT_NEAR(w.grad().view(-1)[i].item<double>(), fd, 1e-7) << i;
  }
}

// SNConv2d's one autograd function for conv(x, W) / sigma (sigma's gradient from the
// weight gradient) against plain LibTorch autograd of at::conv2d(x, W) / sigma, with the same
// power iteration written out, float64: the output, the gradients of x, W and the bias, and
// an R1-style double backward (the gradient in W of ||d sum(y * r) / dx||^2) within 1e-12
// relative. Only summation orders differ (~1e-16 each over ~100 terms); a missing sigma
// term is off by O(1): with dsigma dropped from the function (negative control, run once)
// the W gradient check fails. (The double backward's sigma term runs through dx / sigma,
// which autograd differentiates itself.) The check is tests/sn_conv_reference.h's, which
// test_gpu runs on cuda:0 as well.
TEST(SpectralNorm, ConvGradientsMatchPlainAutograd) {
  const test_util::SnConvErrors e = test_util::sn_conv_errors_float64(c10::Device(c10::kCPU));
  EXPECT_LE(e.output, 1e-12) << "output";
  EXPECT_LE(e.x_grad, 1e-12) << "x gradient";
  EXPECT_LE(e.w_grad, 1e-12) << "W gradient";
  EXPECT_LE(e.bias_grad, 1e-12) << "bias gradient";
  EXPECT_LE(e.double_backward, 1e-12) << "double backward";
}

// The same in bfloat16 (mixed precision: W and x bfloat16, u float32), where the function
// computes in float32 and rounds once: against plain autograd of the float32 conv of the
// same bfloat16 values divided by sigma, the output and the x and W gradients agree within
// two bfloat16 steps (2^-7) of their largest magnitude; the reference rounds nothing and
// ours rounds each result once (2^-9 relative) after float32 sums. Negative control, run
// once: with dx not divided by sigma in the function's backward, the x gradient check here
// and in the float64 test fail.
TEST(SpectralNorm, ConvGradientsMatchPlainAutogradInBfloat16) {
  torch::manual_seed(9);
  SNConv2d conv(6, 5, 3, 1, /*bias=*/false);
  init_weights(*conv, Init::kOrtho);
  {
    torch::NoGradGuard g;
    conv->weight.mul_(1.7);  // sigma 1.7, not the 1 of an orthogonal W: a lost 1 / sigma shows
  }
  cast_params(*conv, at::kBFloat16);
  const at::Tensor u0 = conv->u.clone();
  const at::Tensor x0 = torch::randn({2, 6, 7, 7}).to(at::kBFloat16);
  const at::Tensor r = torch::randn({2, 5, 7, 7});
  at::Tensor x = x0.clone().requires_grad_(true);
  const at::Tensor y = conv->forward(x);
  ASSERT_EQ(y.scalar_type(), at::kBFloat16);
  y.backward(r.to(at::kBFloat16));
  at::Tensor w = conv->weight.detach().to(at::kFloat).requires_grad_(true);
  const at::Tensor sigma = plain_sigma(w, u0);
  at::Tensor xr = x0.to(at::kFloat).requires_grad_(true);
  const at::Tensor yr = at::conv2d(xr, w, {}, 1, 1) / sigma;
  yr.backward(r.to(at::kBFloat16).to(at::kFloat));
  auto expect_close = [](const at::Tensor& a, const at::Tensor& ref, const char* what) {
    EXPECT_LE((a.to(at::kFloat) - ref).abs().max().item<double>(), ref.abs().max().item<double>() / 128) << what;
  };
  expect_close(y.detach(), yr.detach(), "output");
  expect_close(x.grad(), xr.grad(), "x gradient");
  expect_close(conv->weight.grad(), w.grad(), "W gradient");
}

TEST(Attention, IdentityAtZeroGammaAndGammaGetsGradient) {
  torch::manual_seed(4);
  for (auto dt : kDtypes) {
    Attention attn(16);
    init_weights(*attn, Init::kOrtho);
    cast_params(*attn, dt);
    at::Tensor x = torch::randn({2, 16, 8, 8}).to(dt).requires_grad_(true);
    at::Tensor y = attn->forward(x);
    EXPECT_EQ(y.scalar_type(), dt);
    EXPECT_TRUE(torch::equal(y, x)) << dt;
    (y * torch::randn_like(y)).sum().backward();
    ASSERT_TRUE(attn->gamma.grad().defined());
    EXPECT_NE(attn->gamma.grad().item<double>(), 0.0) << dt;
    EXPECT_TRUE(torch::isfinite(x.grad()).all().item<bool>());
  }
}

// Attention computes BigGAN-PyTorch's o(bmm(g, beta^T)) as o(bmm(beta, g^T)^T), so that
// softmax's backward gets a contiguous gradient. Against the reference composition, written
// here with plain ops on the same layers (eval mode: the power iteration does not advance
// between the two), in float64 with gamma 0.7: the output and the gradients of x and of
// every parameter agree within 1e-12 of their largest magnitude (the products are the same,
// summed in another order: ~1e-16 relative). Negative control, run once: without the final
// transpose (the same elements in another layout), the output check fails.
TEST(Attention, EqualsBigGanPyTorchsCompositionInFloat64) {
  torch::manual_seed(5);
  Attention attn(16);
  init_weights(*attn, Init::kOrtho);
  attn->to(at::kDouble);
  attn->eval();
  {
    torch::NoGradGuard g;
    attn->gamma.fill_(0.7);
  }
  const at::Tensor x0 = torch::randn({3, 16, 8, 8}, torch::kDouble);
  const at::Tensor r = torch::randn({3, 16, 8, 8}, torch::kDouble);
  auto grads = [&](const std::function<at::Tensor(const at::Tensor&)>& f) {
    attn->zero_grad();
    at::Tensor x = x0.clone().requires_grad_(true);
    const at::Tensor y = f(x);
    (y * r).sum().backward();
    std::vector<at::Tensor> out{y.detach(), x.grad().clone()};
    for (const auto& p : attn->parameters()) out.push_back(p.grad().clone());
    return out;
  };
  const auto ours = grads([&](const at::Tensor& x) { return attn->forward(x); });
  const auto ref = grads([&](const at::Tensor& x) {
    const int64_t b = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
    const at::Tensor th = attn->theta->forward(x).view({b, c / 8, h * w});
    const at::Tensor ph = at::max_pool2d(attn->phi->forward(x), {2, 2}).view({b, c / 8, h * w / 4});
    const at::Tensor gg = at::max_pool2d(attn->g->forward(x), {2, 2}).view({b, c / 2, h * w / 4});
    const at::Tensor beta = at::softmax(at::bmm(th.transpose(1, 2), ph), -1);
    const at::Tensor o = attn->o->forward(at::bmm(gg, beta.transpose(1, 2)).view({b, c / 2, h, w}));
    return x + attn->gamma * o;
  });
  ASSERT_EQ(ours.size(), ref.size());
  const char* names[] = {"output", "x gradient"};
  for (size_t i = 0; i < ours.size(); ++i) {
    const double scale = ref[i].abs().max().item<double>();
    ASSERT_GT(scale, 0.0) << i;
    EXPECT_LE((ours[i] - ref[i]).abs().max().item<double>(), 1e-12 * scale)
        << (i < 2 ? names[i] : "parameter gradient ") << (i < 2 ? "" : std::to_string(i - 2));
  }
}

// ccbn on N ranks with B/N samples each equals ccbn on one rank with all B (float64).
TEST(ClassConditionalBN, GlobalBatchStatistics) {
  MpiCommunicator world(MPI_COMM_WORLD, 60.0), self(MPI_COMM_SELF, 60.0);
  const int64_t n = world.world_size(), r = world.rank(), b = 4 * n;
  torch::manual_seed(5);
  CCBN full(6, 5, &self);
  init_weights(*full, Init::kOrtho);
  full->to(at::kDouble);
  CCBN part(6, 5, &world);
  part->to(at::kDouble);
  {
    torch::NoGradGuard g;
    auto dst = part->named_parameters();
    for (auto& p : full->named_parameters()) dst[p.key()].copy_(p.value());
    auto dstb = part->named_buffers();
    for (auto& bf : full->named_buffers()) dstb[bf.key()].copy_(bf.value());
  }
  at::Tensor x = torch::randn({b, 6, 3, 3}, torch::kDouble) * 2 + 1;
  at::Tensor c = torch::randn({b, 5}, torch::kDouble);
  at::Tensor dy = torch::randn({b, 6, 3, 3}, torch::kDouble);
  at::Tensor xf = x.clone().requires_grad_(true);
  at::Tensor yf = full->forward(xf, c);
  (yf * dy).sum().backward();
  at::Tensor xp = x.narrow(0, 4 * r, 4).clone().requires_grad_(true);
  at::Tensor yp = part->forward(xp, c.narrow(0, 4 * r, 4));
  (yp * dy.narrow(0, 4 * r, 4)).sum().backward();
  EXPECT_TRUE(torch::allclose(yp, yf.narrow(0, 4 * r, 4), 1e-12, 1e-12));
  EXPECT_TRUE(torch::allclose(xp.grad(), xf.grad().narrow(0, 4 * r, 4), 1e-12, 1e-12));
  EXPECT_TRUE(torch::allclose(part->running_var, full->running_var, 1e-12, 1e-12));
  EXPECT_TRUE(torch::allclose(part->running_mean, full->running_mean, 1e-12, 1e-12));
}

TEST(Blocks, ShapesAndBackwardInEveryDtype) {
  MpiCommunicator comm(MPI_COMM_WORLD, 60.0);
  torch::manual_seed(6);
  for (auto dt : kDtypes) {
    GBlock gb(16, 8, 10, true, &comm);
    DBlock db0(3, 8, false, true), db1(8, 8, true, false);
    for (torch::nn::Module* m : {static_cast<torch::nn::Module*>(gb.get()),
                                 static_cast<torch::nn::Module*>(db0.get()),
                                 static_cast<torch::nn::Module*>(db1.get())}) {
      init_weights(*m, Init::kOrtho);
      cast_params(*m, dt);
    }
    at::Tensor h = torch::randn({3, 16, 4, 4}).to(dt).requires_grad_(true);
    at::Tensor out = gb->forward(h, torch::randn({3, 10}).to(dt));
    EXPECT_EQ(out.sizes(), (std::vector<int64_t>{3, 8, 8, 8}));
    at::Tensor x = torch::randn({3, 3, 8, 8}).to(dt).requires_grad_(true);
    at::Tensor d = db1->forward(db0->forward(x));
    EXPECT_EQ(d.sizes(), (std::vector<int64_t>{3, 8, 4, 4}));
    (out.sum() + d.sum()).backward();
    EXPECT_EQ(out.scalar_type(), dt);
    EXPECT_TRUE(torch::isfinite(h.grad()).all().item<bool>()) << dt;
    EXPECT_TRUE(torch::isfinite(x.grad()).all().item<bool>()) << dt;
    EXPECT_EQ(gb->bn1->running_mean.scalar_type(), dt == at::kDouble ? at::kDouble : at::kFloat);
    for (auto& p : gb->parameters()) EXPECT_TRUE(p.grad().defined());
  }
}

// forward_upsampled(x) computes forward(upsample2(x)) without the upsampled input: a 3x3
// conv through the transposed conv of upsample_conv_kernel, a 1x1 conv before the upsampling.
// Outputs and the gradients of x, W and the bias must agree:
//  - float64: within 1e-12 of the largest magnitude. Only the summation order differs (54
//    products per output, and kernel sums of up to 4 weights), each rounding ~1e-16
//    relative; a wrong tap or kernel order is off by O(1).
//  - bfloat16 (mixed precision, u float32): both compute in float32 and round once to
//    bfloat16 (8 significant bits), so an element may land one bfloat16 step (2^-8
//    relative) on the other side; the bound is two steps of the largest magnitude.
// Negative control, run once: upsample_conv_kernel with w_0 and w_2 swapped fails every
// 3x3 case.
TEST(UpsampledConv, EqualsUpsampleThenConvInFloat64AndBfloat16) {
  for (auto dt : {at::kDouble, at::kBFloat16}) {
    for (int64_t k : {3, 1}) {
      torch::manual_seed(7);
      SNConv2d ref(6, 5, k, k / 2), fused(6, 5, k, k / 2);
      init_weights(*ref, Init::kOrtho);
      {
        torch::NoGradGuard g;
        ref->bias.uniform_(-1, 1);
        fused->weight.copy_(ref->weight);
        fused->bias.copy_(ref->bias);
        fused->u.copy_(ref->u);
      }
      cast_params(*ref, dt);
      cast_params(*fused, dt);
      const at::Tensor x0 = torch::randn({3, 6, 5, 7}).to(dt);
      at::Tensor xr = x0.clone().requires_grad_(true), xf = x0.clone().requires_grad_(true);
      const at::Tensor yr = ref->forward(at::upsample_nearest2d(xr, {10, 14}));
      const at::Tensor yf = fused->forward_upsampled(xf);
      ASSERT_EQ(yf.sizes(), (std::vector<int64_t>{3, 5, 10, 14}));
      EXPECT_EQ(yf.scalar_type(), dt);
      const at::Tensor gy = torch::randn(yr.sizes()).to(dt);
      yr.backward(gy);
      yf.backward(gy);
      const double rel = dt == at::kDouble ? 1e-12 : 2.0 / 256;
      auto expect_close = [&](const at::Tensor& a, const at::Tensor& b, const char* what) {
        const double scale = b.abs().max().item<double>();
        EXPECT_LE((a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>(), rel * scale)
            << what << " " << dt << " k " << k;
      };
      expect_close(yf, yr, "output");
      expect_close(xf.grad(), xr.grad(), "x gradient");
      expect_close(fused->weight.grad(), ref->weight.grad(), "W gradient");
      expect_close(fused->bias.grad(), ref->bias.grad(), "bias gradient");
    }
  }
  EXPECT_THROW(SNConv2d(4, 4, 3, 0)->forward_upsampled(torch::randn({1, 4, 4, 4})), c10::Error);
}

}  // namespace

}  // namespace SHARDGAN_UNITY_ID
