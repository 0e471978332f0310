// The fused Adam kernel against its reference loop: every path this CPU supports (AVX-512,
// AVX2, scalar), one and two threads, every length tail, Adam and AdamW, with and without
// the 16-bit parameter copy, must agree bit for bit (the stated bound is 0 ulp). The
// float64 form of the loop equals torch::optim::Adam/AdamW; and the float32 kernel's
// distance from the float64 update is printed and bounded.
#include <cmath>
#include <cstring>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "shardgan/optim/fused_adam.h"

// The gtest files compile together in batches (tests/CMakeLists.txt): this file's names
// live in a namespace of its own.
namespace SHARDGAN_UNITY_ID {

using namespace shardgan;

namespace {

// Distance in units in the last place between two floats of the same sign class
// (monotonic integer mapping of IEEE floats).
int64_t ulp_distance(float a, float b) {
  auto key = [](float f) {
    int32_t i;
    std::memcpy(&i, &f, 4);
    return i < 0 ? static_cast<int64_t>(INT32_MIN) - i : static_cast<int64_t>(i);
  };
  return std::llabs(key(a) - key(b));
}

struct State {
  std::vector<float> p, g, m, v;
  std::vector<uint16_t> copy;
};

// Values spanning the range Adam sees: gradients from 1e-30 to 1e3 with zeros, parameters
// around 1, state from earlier steps.
State make_state(int64_t n, uint64_t seed) {
  torch::manual_seed(static_cast<int64_t>(seed));
  at::Tensor g = torch::randn({n}) * torch::pow(10.0, torch::randint(-30, 4, {n}).to(torch::kFloat));
  g.masked_fill_(torch::rand({n}) < 0.05, 0.0);
  at::Tensor p = torch::randn({n});
  at::Tensor m = torch::randn({n}) * 0.1;
  at::Tensor v = torch::rand({n}) * 0.01;
  v.masked_fill_(torch::rand({n}) < 0.05, 0.0);
  auto vec = [](const at::Tensor& t) { return std::vector<float>(t.data_ptr<float>(), t.data_ptr<float>() + t.numel()); };
  return State{vec(p), vec(g), vec(m), vec(v), std::vector<uint16_t>(n)};
}

void expect_bitwise(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  int64_t worst = 0, at = -1;
  for (size_t i = 0; i < a.size(); ++i) {
    const int64_t d = ulp_distance(a[i], b[i]);
    if (d > worst) worst = d, at = static_cast<int64_t>(i);
  }
  EXPECT_EQ(worst, 0) << what << ": " << worst << " ulp at element " << at;
}

TEST(FusedAdamKernel, EveryPathEqualsTheReferenceLoopBitForBit) {
  std::vector<CpuIsa> isas;
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (cpu_supports(isa)) isas.push_back(isa);
  }
  std::printf("  best path here: %s; testing %zu path(s)\n", to_string(best_cpu_isa()), isas.size());
  int cases = 0;
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{15}, int64_t{16}, int64_t{17}, int64_t{1000}, int64_t{200003}}) {
    for (int mode = 0; mode < 3; ++mode) {  // plain, L2 (Adam), decoupled (AdamW)
      for (ParamCopy copy : {ParamCopy::kNone, ParamCopy::kBFloat16, ParamCopy::kFloat16}) {
        const AdamCoefficients c = adam_coefficients(1e-3, 0.9, 0.999, 1e-8, mode ? 0.01 : 0.0, mode == 2, 7);
        State ref = make_state(n, 17 + n + mode);
        const State init = ref;
        reference_adam_step(ref.p.data(), ref.g.data(), ref.m.data(), ref.v.data(), n, c, copy, ref.copy.data());
        for (CpuIsa isa : isas) {
          for (int threads : {1, 2}) {
            State s = init;
            fused_adam_step(s.p.data(), s.g.data(), s.m.data(), s.v.data(), n, c, copy, s.copy.data(), isa, threads);
            const std::string what = std::string(to_string(isa)) + " n=" + std::to_string(n) + " mode=" +
                                     std::to_string(mode) + " threads=" + std::to_string(threads);
            expect_bitwise(s.p, ref.p, what + " p");
            expect_bitwise(s.m, ref.m, what + " m");
            expect_bitwise(s.v, ref.v, what + " v");
            if (copy != ParamCopy::kNone) {
              EXPECT_EQ(s.copy, ref.copy) << what << " copy";
            }
            EXPECT_EQ(s.g, init.g) << what << " g must not change";
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_GT(cases, 0);
}

// The reference loop's 16-bit copies are ATen's own conversions (round to nearest even).
TEST(FusedAdamKernel, SixteenBitCopiesAreAtenConversions) {
  torch::manual_seed(5);
  at::Tensor x = torch::cat({torch::randn({4096}) * 1e3, torch::randn({4096}) * 1e-6,
                             torch::tensor({0.0f, -0.0f, 65504.0f, 65520.0f, 1e10f, -1e10f, 6e-8f, 1e-40f,
                                            INFINITY, -INFINITY, NAN})});
  const float* xp = x.data_ptr<float>();
  at::Tensor bf = x.to(torch::kBFloat16), hf = x.to(torch::kHalf);
  for (int64_t i = 0; i < x.numel(); ++i) {
    uint16_t b, h;
    std::memcpy(&b, static_cast<const char*>(bf.data_ptr()) + 2 * i, 2);
    std::memcpy(&h, static_cast<const char*>(hf.data_ptr()) + 2 * i, 2);
    if (std::isnan(xp[i])) {  // any NaN is fine (ATen's AVX-512 path gives 0xFFFF, c10 0x7FC0)
      EXPECT_EQ(float_to_bf16_bits(xp[i]) & 0x7F80, 0x7F80);
      EXPECT_NE(float_to_bf16_bits(xp[i]) & 0x7F, 0);
      EXPECT_EQ(float_to_fp16_bits(xp[i]) & 0x7C00, 0x7C00);
      EXPECT_NE(float_to_fp16_bits(xp[i]) & 0x3FF, 0);
    } else {
      EXPECT_EQ(float_to_bf16_bits(xp[i]), b) << xp[i];
      EXPECT_EQ(float_to_fp16_bits(xp[i]), h) << xp[i];
    }
  }
}

// The operation sequence is torch's: in float64 the loop equals torch::optim::Adam/AdamW.
TEST(FusedAdamKernel, Float64ReferenceLoopEqualsTorchAdam) {
  for (bool decoupled : {false, true}) {
    torch::manual_seed(9);
    at::Tensor p0 = torch::randn({513}, torch::kDouble);
    at::Tensor p = p0.clone().requires_grad_(true);
    std::unique_ptr<torch::optim::Optimizer> ref;
    if (decoupled) ref = std::make_unique<torch::optim::AdamW>(std::vector<at::Tensor>{p}, torch::optim::AdamWOptions(1e-2).betas({0.5, 0.99}).weight_decay(0.05));
    else ref = std::make_unique<torch::optim::Adam>(std::vector<at::Tensor>{p}, torch::optim::AdamOptions(1e-2).betas({0.5, 0.99}).weight_decay(0.05));
    at::Tensor q = p0.clone(), m = torch::zeros_like(q), v = torch::zeros_like(q);
    for (int s = 1; s <= 100; ++s) {
      at::Tensor g = torch::randn({513}, torch::kDouble);
      p.mutable_grad() = g.clone();
      ref->step();
      reference_adam_step_f64(q.data_ptr<double>(), g.data_ptr<double>(), m.data_ptr<double>(), v.data_ptr<double>(),
                              q.numel(), 1e-2, 0.5, 0.99, 1e-8, 0.05, decoupled, s);
    }
    const double rel = ((q - p.detach()).abs().max() / p.detach().abs().max()).item<double>();
    EXPECT_LE(rel, 1e-12) << (decoupled ? "adamw" : "adam");
  }
}

// How far one float32 step lands from the exact step (computed in float64), in units of
// u = 2^-24 times the size of the terms (ulp of the result is meaningless where m's two
// terms cancel), plus one float32 subnormal step t = 2^-149 for results that underflow.
// docs/optimizers.md derives the bounds asserted here: |dm| <= 3u(b1|m|+c1|g|) + t,
// |dv| <= 4u v + t, |dp| <= u(|p| + 12 s M/d) + t with M = b1|m|+c1|g|, s = lr/bc1.
TEST(FusedAdamKernel, Float32StepIsWithinTheStatedBoundOfTheExactStep) {
  const int64_t n = 200000;
  State s = make_state(n, 99);
  const State init = s;
  std::vector<double> p(s.p.begin(), s.p.end()), g(s.g.begin(), s.g.end()), m(s.m.begin(), s.m.end()),
      v(s.v.begin(), s.v.end());
  const double lr = 1e-3, b1 = 0.9, b2 = 0.999, eps = 1e-8, u = std::ldexp(1.0, -24), t = std::ldexp(1.0, -149);
  const int64_t step = 7;
  const double ss = lr / (1 - std::pow(b1, step)), isb = 1 / std::sqrt(1 - std::pow(b2, step));
  fused_adam_step(s.p.data(), s.g.data(), s.m.data(), s.v.data(), n, adam_coefficients(lr, b1, b2, eps, 0, false, step));
  reference_adam_step_f64(p.data(), g.data(), m.data(), v.data(), n, lr, b1, b2, eps, 0, false, step);
  double em = 0, ev = 0, ep = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double gi = init.g[i], M = b1 * std::abs(init.m[i]) + (1 - b1) * std::abs(gi);
    em = std::max(em, std::abs(s.m[i] - m[i]) / (u * M + t));
    ev = std::max(ev, std::abs(s.v[i] - v[i]) / (u * v[i] + t));
    const double d = std::sqrt(v[i]) * isb + eps;
    ep = std::max(ep, std::abs(s.p[i] - p[i]) / (u * (std::abs(init.p[i]) + ss * M / d) + t));
  }
  std::printf("  float32 kernel vs exact step: |dm| <= %.2f u M, |dv| <= %.2f u v, |dp| <= %.2f u (|p| + sM/d)\n",
              em, ev, ep);
  EXPECT_LE(em, 3.0);
  EXPECT_LE(ev, 4.0);
  EXPECT_LE(ep, 12.0);
}

TEST(FusedAdamKernel, ScaleCheckAndSumOfSquares) {
  std::vector<float> x(100001, 2.0f);
  EXPECT_TRUE(scale_and_check_finite(x.data(), static_cast<int64_t>(x.size()), 0.5f));
  EXPECT_EQ(x[100000], 1.0f);
  EXPECT_DOUBLE_EQ(sum_of_squares(x.data(), static_cast<int64_t>(x.size())), 100001.0);
  x[77777] = INFINITY;
  EXPECT_FALSE(scale_and_check_finite(x.data(), static_cast<int64_t>(x.size()), 1.0f));
  x[77777] = NAN;
  EXPECT_FALSE(scale_and_check_finite(x.data(), 77778, 1.0f));
  EXPECT_TRUE(scale_and_check_finite(x.data(), 77777, 1.0f));
  EXPECT_THROW(adam_coefficients(1e-3, 0.9, 0.999, 1e-8, 0, false, 0), std::invalid_argument);
}

}  // namespace

}  // namespace SHARDGAN_UNITY_ID
