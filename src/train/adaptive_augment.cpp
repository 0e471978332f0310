// ADA's state (augment.h, AdaptiveAugment): the per-pass draws and the heuristic that moves
// p (Karras et al. 2020, arXiv:2006.06676, Sec. 3; the authors' training loop's "ADA
// heuristic": every ada_interval steps, adjust = sign(r_t - target) * batch * interval /
// (ada_kimg * 1000)).
#include <cmath>
#include <limits>
#include <stdexcept>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "shardgan/train/augment.h"
#include "shardgan/util/splitmix64.h"

namespace shardgan {

AdaptiveAugment::AdaptiveAugment(const AugmentConfig& cfg, uint64_t seed, int64_t global_batch)
    : cfg_(cfg),
      strengths_(AugmentStrengths::of_pipe(cfg.pipe)),
      seed_(seed),
      global_batch_(global_batch),
      p_(cfg.p),
      last_rt_(std::numeric_limits<double>::quiet_NaN()) {
  if (global_batch <= 0) throw std::invalid_argument("AdaptiveAugment: global_batch must be > 0");
}

std::pair<at::Tensor, at::Tensor> AdaptiveAugment::draws(int64_t step, AugmentSite site, int64_t d_step) const {
  // A generator per pass, seeded from (run seed, step, site, D step): nothing to carry in a
  // checkpoint, and the same draws in every world size.
  uint64_t key = splitmix64(seed_ ^ 0xA5A5'0ADA'0000'0000ull);
  key = splitmix64(key ^ static_cast<uint64_t>(step));
  key = splitmix64(key ^ static_cast<uint64_t>(site));
  key = splitmix64(key ^ static_cast<uint64_t>(d_step));
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(key);
  const auto o = torch::TensorOptions().dtype(torch::kDouble);
  at::Tensor u = at::rand({global_batch_, augment_draw::kUniforms}, gen, o);
  at::Tensor z = at::randn({global_batch_, augment_draw::kNormals}, gen, o);
  return {u, z};
}

at::Tensor AdaptiveAugment::apply(const at::Tensor& x, const at::Tensor& u, const at::Tensor& z,
                                  AugmentSite site) const {
  augmented_.at(static_cast<size_t>(site)) += x.size(0);
  return augment_images(x, augment_matrices(strengths_, p_, u, z, x.size(1), x.size(2), x.size(3)));
}

bool AdaptiveAugment::after_step(int64_t steps_done, double sign_sum, double count) {
  sign_sum_ += sign_sum;
  sign_count_ += count;
  if (!cfg_.adaptive() || steps_done % cfg_.interval != 0) return false;
  // No real logits since the last adjustment (cannot happen in training): p stays.
  if (sign_count_ > 0) {
    last_rt_ = sign_sum_ / sign_count_;
    const double diff = last_rt_ - cfg_.target;
    const double dir = diff > 0 ? 1.0 : diff < 0 ? -1.0 : 0.0;
    const double speed =
        static_cast<double>(global_batch_ * cfg_.interval) / (cfg_.speed_kimg * 1000.0);
    p_ = std::max(p_ + dir * speed, 0.0);
  }
  sign_sum_ = 0;
  sign_count_ = 0;
  return true;
}

void AdaptiveAugment::put_state(std::map<std::string, double>& scalars) const {
  scalars["ada_p"] = p_;
  scalars["ada_sign_sum"] = sign_sum_;
  scalars["ada_sign_count"] = sign_count_;
  if (std::isfinite(last_rt_)) scalars["ada_rt"] = last_rt_;  // none before the first adjustment
}

void AdaptiveAugment::load_state(const std::map<std::string, double>& scalars) {
  auto get = [&](const char* k, double def) {
    const auto it = scalars.find(k);
    return it == scalars.end() ? def : it->second;
  };
  p_ = get("ada_p", cfg_.p);
  sign_sum_ = get("ada_sign_sum", 0.0);
  sign_count_ = get("ada_sign_count", 0.0);
  last_rt_ = get("ada_rt", std::numeric_limits<double>::quiet_NaN());
}

}  // namespace shardgan
