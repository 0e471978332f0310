// 8-bit Adam against float32 Adam on a tiny DCGAN: 50 alternating D and G steps with real
// backward passes (non-saturating loss, fresh latents and a fresh draw of the "real" batch
// each step), DCGAN's beta1 0.5. Each model's float32 twin takes the 8-bit run's gradients,
// so the two differ only by how m is stored (adam8_bound.h): every parameter stays within
// the worst-case bound from the signed map's resolution, the distances' spread matches the
// one that roundings spread evenly over the map's gaps predict, and a map of half the
// resolution exceeds that prediction (its gaps, hence its spread, double).
#include <gtest/gtest.h>
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "adam8_bound.h"
#include "shardgan/comm/local_communicator.h"
#include "shardgan/models/dcgan.h"
#include "shardgan/optim/blockwise_quant.h"
#include "shardgan/optim/fused_adam.h"
#include "test_util.h"

namespace shardgan {
namespace {

namespace F = torch::nn::functional;
using test_adam8::DriftVariance;

constexpr int64_t kBlock = 256;
constexpr int kSteps = 50;
constexpr double kLr = 2e-4, kBeta1 = 0.5, kEps = 1e-8;

std::vector<double> as_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// One unit's optimizer pair: the 8-bit run steps the unit's own flat parameters, the twin
// a float32 copy. `map` empty: the product's kernel (the signed map); otherwise the test's
// own loop stores m as the nearest value of `map` (ties low) times the block's absmax.
class UnitPair {
 public:
  UnitPair(const at::Tensor& shard, const std::vector<float>* map)
      : n_(shard.numel()), map_(map), pf_(shard.data_ptr<float>(), shard.data_ptr<float>() + n_),
        mf_(n_, 0.0f), vf_(n_, 0.0f), m_(n_, 0.0f), v_(n_, 0.0f), mc_(n_, zero_code(CodeMap::kSigned)),
        vc_(n_, zero_code(CodeMap::kUnsigned)), ma_(num_blocks(n_, kBlock), 0.0f), va_(ma_.size(), 0.0f),
        E_(n_, 0.0), bound_(n_, 0.0), var_(n_, kBeta1) {}

  void step(float* p, const float* g, int t, const std::vector<double>& fine) {
    const AdamCoefficients co = adam_coefficients(kLr, kBeta1, 0.0, kEps, 0.0, false, t);
    std::vector<float> stored(n_), absmax(n_), x(n_);
    for (int64_t i = 0; i < n_; ++i) {
      stored[i] = map_ ? m_[i] : code_map(CodeMap::kSigned)[mc_[i]] * ma_[i / kBlock];
      x[i] = std::fma(co.beta1, stored[i], co.one_minus_beta1 * g[i]);  // the new m before storage
    }
    block_absmax(stored, absmax);
    if (t > 1) {
      for (int64_t i = 0; i < n_; ++i) E_[i] = test_adam8::next_error(E_[i], kBeta1, fine, stored[i], absmax[i], mf_[i]);
    }
    if (!map_) {
      fused_adam8_step(p, g, {mc_.data(), ma_.data()}, {vc_.data(), va_.data()}, n_, kBlock, co);
    } else {
      reference_adam_step(p, g, m_.data(), v_.data(), n_, co);
      round_to_map();
    }
    reference_adam_step(pf_.data(), g, mf_.data(), vf_.data(), n_, co);
    std::vector<float> A(n_), c(n_), var(n_);
    block_absmax(x, A);
    for (int64_t i = 0; i < n_; ++i) {
      const double d = std::fabs(g[i]) + kEps, s = co.step_size;
      bound_[i] += test_adam8::bound_term(s, E_[i], mf_[i], d, p[i], pf_[i]);
      c[i] = static_cast<float>(s / d);
      const double G = A[i] == 0 ? 0.0 : A[i] * test_adam8::gap_width(fine, x[i] / A[i]);
      var[i] = static_cast<float>(G * G / 12);
    }
    var_.record(std::move(c), std::move(var));
  }

  // Per element: |p - p^f| / the worst-case bound, and (p - p^f) / the predicted sd.
  void ratios(const float* p, std::vector<double>& worst, std::vector<double>& z) const {
    const std::vector<double> sd = var_.sd();
    for (int64_t i = 0; i < n_; ++i) {
      const double dist = static_cast<double>(p[i]) - pf_[i];
      worst.push_back(std::fabs(dist) / bound_[i]);
      if (sd[i] > 0) z.push_back(dist / sd[i]);
    }
  }

 private:
  void block_absmax(const std::vector<float>& x, std::vector<float>& out) const {
    for (int64_t b = 0; b < n_; b += kBlock) {
      float A = 0;
      for (int64_t i = b; i < std::min(n_, b + kBlock); ++i) A = std::max(A, std::fabs(x[i]));
      for (int64_t i = b; i < std::min(n_, b + kBlock); ++i) out[i] = A;
    }
  }
  void round_to_map() {
    std::vector<float> A(n_);
    block_absmax(m_, A);
    for (int64_t i = 0; i < n_; ++i) {
      const float u = m_[i] / (A[i] == 0 ? 1.0f : A[i]);
      auto it = std::lower_bound(map_->begin(), map_->end(), u);
      if (it == map_->end() || (it != map_->begin() && u - *(it - 1) <= *it - u)) --it;
      m_[i] = *it * A[i];
    }
  }

  int64_t n_;
  const std::vector<float>* map_;
  std::vector<float> pf_, mf_, vf_, m_, v_;
  std::vector<uint8_t> mc_, vc_;
  std::vector<float> ma_, va_;
  std::vector<double> E_, bound_;
  DriftVariance var_;
};

struct DriftResult {
  double worst = 0;  // max |p - p^f| / worst-case bound
  double rms_z = 0;  // root mean square of (p - p^f) / predicted sd
  size_t elements = 0;
};

// The tiny DCGAN trained 50 steps with m stored by `map` (nullptr: the product's kernel).
DriftResult run_gan(const std::vector<float>* map) {
  DcganConfig cfg;
  cfg.z_dim = 16;
  cfg.g_width = 16;
  cfg.d_width = 16;
  LocalCommunicator comm;
  auto g = build_generator(cfg, comm, test_util::sharding(0), 11);
  auto d = build_discriminator(cfg, comm, test_util::sharding(0), 12);
  const std::vector<double> fine = as_double({code_map(CodeMap::kSigned).begin(), code_map(CodeMap::kSigned).end()});
  std::vector<UnitPair> gp, dp;
  for (auto& u : g->units()) gp.emplace_back(u->shard(), map);
  for (auto& u : d->units()) dp.emplace_back(u->shard(), map);
  torch::manual_seed(3);
  // "Real" images: smooth random patterns in [-1, 1]; 16 of 256 each step.
  const at::Tensor pool = torch::tanh(3 * F::interpolate(torch::randn({256, 1, 8, 8}),
                                      F::InterpolateFuncOptions().size(std::vector<int64_t>{32, 32})
                                          .mode(torch::kBilinear).align_corners(false)));
  auto step_all = [&](ShardedModel& m, std::vector<UnitPair>& pairs, int t) {
    for (size_t k = 0; k < pairs.size(); ++k) {
      ShardedUnit& u = *m.units()[k];
      pairs[k].step(u.shard().data_ptr<float>(), u.grad_shard().data_ptr<float>(), t, fine);
    }
    m.zero_grad();
  };
  for (int t = 1; t <= kSteps; ++t) {
    const at::Tensor real = pool.index_select(0, torch::randint(256, {16}));
    at::Tensor fake;
    {
      torch::NoGradGuard no_grad;
      fake = g->forward(torch::randn({16, cfg.z_dim, 1, 1}));
    }
    (F::softplus(-d->forward(real)).mean() + F::softplus(d->forward(fake)).mean()).backward();
    step_all(*d, dp, t);
    d->set_requires_grad(false);
    F::softplus(-d->forward(g->forward(torch::randn({16, cfg.z_dim, 1, 1})))).mean().backward();
    d->set_requires_grad(true);
    step_all(*g, gp, t);
  }
  std::vector<double> worst, z;
  for (size_t k = 0; k < gp.size(); ++k) gp[k].ratios(g->units()[k]->shard().data_ptr<float>(), worst, z);
  for (size_t k = 0; k < dp.size(); ++k) dp[k].ratios(d->units()[k]->shard().data_ptr<float>(), worst, z);
  DriftResult r;
  for (double w : worst) r.worst = std::max(r.worst, w);
  double ss = 0;
  for (double v : z) ss += v * v;
  r.rms_z = std::sqrt(ss / static_cast<double>(z.size()));
  r.elements = z.size();
  return r;
}

TEST(Adam8Bound, TinyDcganWithinTheMapsResolutionAndAHalvedMapExceedsIt) {
  const auto& fine = code_map(CodeMap::kSigned);
  const int z = zero_code(CodeMap::kSigned);
  std::vector<float> coarse;  // every other value, counted from 0, both ends kept
  for (int k = 0; k < 256; ++k) {
    if ((k - z) % 2 == 0 || k == 0 || k == 255) coarse.push_back(fine[k]);
  }
  // One intra-op thread: convolutions this small spend most of their time in OpenMP
  // barriers when ctest runs another test beside this one (40x slower on 2 busy cores).
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const DriftResult eight = run_gan(nullptr);
  const DriftResult halved = run_gan(&coarse);
  at::set_num_threads(threads);
  std::printf("  8-bit: distance / worst-case bound at most %.4f; distance / predicted sd: rms %.3f over %zu "
              "elements\n  halved map: rms %.3f (against the full map's prediction)\n",
              eight.worst, eight.rms_z, eight.elements, halved.rms_z);
  ASSERT_GT(eight.elements, 50000u);
  EXPECT_LE(eight.worst, 1.0) << "the 8-bit run left its worst-case bound";
  EXPECT_GT(eight.rms_z, 0.75);
  EXPECT_LT(eight.rms_z, 1.3) << "the 8-bit run's distances spread wider than its map's gaps predict";
  EXPECT_GT(halved.rms_z, 1.3) << "a map of half the resolution stays within the prediction: the bound is too loose";
}

}  // namespace
}  // namespace shardgan
