#include "shardgan/optim/sharded_ema.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include <torch/torch.h>

#include "shardgan/sharding/sharded_model.h"

namespace shardgan {

ShardedEma::ShardedEma(ShardedModel& model, EmaConfig cfg) : model_(model), cfg_(cfg) {
  if (!(cfg.decay >= 0 && cfg.decay <= 1)) {
    throw std::invalid_argument("Invalid EMA decay: " + std::to_string(cfg.decay) + ", must be in [0, 1]");
  }
  if (!(cfg.half_life_kimg >= 0) || !(cfg.rampup >= 0) || (cfg.half_life_kimg > 0 && cfg.batch < 1)) {
    throw std::invalid_argument("Invalid EMA half-life " + std::to_string(cfg.half_life_kimg) + " kimg, ramp-up " +
                                std::to_string(cfg.rampup) + " or batch " + std::to_string(cfg.batch) +
                                ": need a half-life and ramp-up >= 0, and a batch >= 1 with a half-life");
  }
  torch::NoGradGuard no_grad;
  for (auto& u : model_.units()) {
    const at::Tensor& s = u->shard();
    const bool low = s.scalar_type() == at::kHalf || s.scalar_type() == at::kBFloat16;
    ema_.push_back(s.to(low ? at::kFloat : s.scalar_type(), /*non_blocking=*/false, /*copy=*/true));
  }
}

double EmaConfig::decay_at(int64_t step) const {
  if (half_life_kimg <= 0) return decay;
  const double b = static_cast<double>(batch);
  double n = half_life_kimg * 1000.0;
  if (rampup > 0) n = std::min(n, static_cast<double>(step - 1) * b * rampup);
  return std::pow(0.5, b / std::max(n, 1e-8));
}

void ShardedEma::update(int64_t step) {
  torch::NoGradGuard no_grad;
  if (swapped_) throw std::logic_error("ShardedEma::update while the EMA is swapped into the model");
  auto& units = model_.units();
  const double decay = cfg_.decay_at(step);
  for (size_t i = 0; i < units.size(); ++i) {
    const at::Tensor& p = units[i]->shard();
    if (step < cfg_.start_step) {
      ema_[i].copy_(p);
    } else {
      // BigGAN's form: ema*decay + p*(1 - decay).
      ema_[i].mul_(decay).add_(p.to(ema_[i].scalar_type()), 1.0 - decay);
    }
  }
}

void ShardedEma::swap_in() {
  torch::NoGradGuard no_grad;
  if (swapped_) throw std::logic_error("ShardedEma::swap_in: the EMA is already swapped in");
  auto& units = model_.units();
  for (auto& u : units) {
    if (u->stage() == 3 && u->gathered()) {
      throw std::logic_error("ShardedEma::swap_in: unit '" + u->name() + "' of '" + model_.name() +
                             "' is gathered; swap between steps, when no unit is");
    }
  }
  saved_.clear();
  for (size_t i = 0; i < units.size(); ++i) {
    at::Tensor& p = units[i]->shard();
    saved_.push_back(p.clone());
    p.copy_(ema_[i]);
  }
  model_.after_optimizer_step();  // stages 1-2: all-gather; mixed precision: compute copy
  swapped_ = true;
}

void ShardedEma::swap_out() {
  torch::NoGradGuard no_grad;
  if (!swapped_) throw std::logic_error("ShardedEma::swap_out: the EMA is not swapped in");
  auto& units = model_.units();
  for (size_t i = 0; i < units.size(); ++i) units[i]->shard().copy_(saved_[i]);
  model_.after_optimizer_step();
  saved_.clear();
  swapped_ = false;
}

}  // namespace shardgan
