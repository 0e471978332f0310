#include "shardgan/optim/loss_scaler.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include <torch/torch.h>

#include "shardgan/comm/communicator.h"
#include "shardgan/optim/fused_adam.h"
#include "shardgan/sharding/sharded_model.h"

namespace shardgan {

DynamicLossScaler::DynamicLossScaler(LossScalerConfig cfg, c10::ScalarType compute_dtype)
    : cfg_(cfg), enabled_(compute_dtype == c10::kHalf), scale_(cfg.init_scale),
      hysteresis_left_(cfg.hysteresis) {
  auto bad = [](const std::string& w) { throw std::invalid_argument("Invalid loss scaler option: " + w); };
  if (!(cfg.init_scale > 0)) bad("init_scale " + std::to_string(cfg.init_scale) + " <= 0");
  if (!(cfg.growth_factor > 1)) bad("growth_factor " + std::to_string(cfg.growth_factor) + " <= 1");
  if (!(cfg.backoff_factor > 0 && cfg.backoff_factor < 1)) {
    bad("backoff_factor " + std::to_string(cfg.backoff_factor) + " not in (0, 1)");
  }
  if (cfg.growth_interval < 1) bad("growth_interval " + std::to_string(cfg.growth_interval) + " < 1");
  if (cfg.hysteresis < 1) bad("hysteresis " + std::to_string(cfg.hysteresis) + " < 1");
  if (!(cfg.min_scale > 0 && cfg.min_scale <= cfg.max_scale)) bad("need 0 < min_scale <= max_scale");
}

at::Tensor DynamicLossScaler::scale_loss(const at::Tensor& loss) const {
  return enabled_ ? loss * scale_ : loss;
}

bool DynamicLossScaler::unscale_and_vote(const std::vector<ShardedModel*>& models, Communicator& comm) {
  if (!enabled_) return true;
  torch::NoGradGuard no_grad;
  const double inv = 1.0 / scale_;
  bool finite = true;
  for (ShardedModel* m : models) {
    for (auto& u : m->units()) {
      u->with_grad_shard([&](at::Tensor& g) {  // offloaded: read from the tier and written back
        if (g.scalar_type() == at::kFloat && g.device().is_cpu() && g.is_contiguous()) {
          finite &= scale_and_check_finite(g.data_ptr<float>(), g.numel(), static_cast<float>(inv));
        } else {
          finite &= g.isfinite().all().item<bool>();
          g.mul_(inv);
        }
      }, true);
    }
  }
  at::Tensor vote = torch::full({1}, finite ? 0.0f : 1.0f, torch::kFloat);
  comm.all_reduce(vote, ReduceOp::kMax);
  const bool overflow = vote.item<float>() != 0.0f;
  update(overflow);
  return !overflow;
}

void DynamicLossScaler::update(bool overflow) {
  if (overflow) {
    ++skipped_;
    good_steps_ = 0;
    if (cfg_.hysteresis == 1 || hysteresis_left_ <= 1) {
      scale_ = std::max(scale_ * cfg_.backoff_factor, cfg_.min_scale);
    } else {
      --hysteresis_left_;
    }
    return;
  }
  if (cfg_.consecutive_hysteresis) hysteresis_left_ = cfg_.hysteresis;
  if (++good_steps_ >= cfg_.growth_interval) {
    hysteresis_left_ = cfg_.hysteresis;
    scale_ = std::min(scale_ * cfg_.growth_factor, cfg_.max_scale);
    good_steps_ = 0;
  }
}

std::vector<std::pair<std::string, double>> DynamicLossScaler::state() const {
  return {{"loss_scale", scale_},
          {"loss_scale_good_steps", static_cast<double>(good_steps_)},
          {"loss_scale_hysteresis", static_cast<double>(hysteresis_left_)},
          {"loss_scale_skipped", static_cast<double>(skipped_)}};
}

void DynamicLossScaler::load_state(const std::vector<std::pair<std::string, double>>& s) {
  for (auto& [k, v] : s) {
    if (k == "loss_scale") scale_ = v;
    else if (k == "loss_scale_good_steps") good_steps_ = static_cast<int64_t>(v);
    else if (k == "loss_scale_hysteresis") hysteresis_left_ = static_cast<int64_t>(v);
    else if (k == "loss_scale_skipped") skipped_ = static_cast<int64_t>(v);
  }
}

}  // namespace shardgan
