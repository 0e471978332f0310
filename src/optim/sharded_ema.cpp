#include "shardgan/optim/sharded_ema.h"

#include <stdexcept>

#include <torch/torch.h>

#include "shardgan/sharding/sharded_model.h"

namespace shardgan {

ShardedEma::ShardedEma(ShardedModel& model, EmaConfig cfg) : model_(model), cfg_(cfg) {
  if (!(cfg.decay >= 0 && cfg.decay <= 1)) {
    throw std::invalid_argument("Invalid EMA decay: " + std::to_string(cfg.decay) + ", must be in [0, 1]");
  }
  torch::NoGradGuard no_grad;
  for (auto& u : model_.units()) {
    const at::Tensor& s = u->shard();
    const bool low = s.scalar_type() == at::kHalf || s.scalar_type() == at::kBFloat16;
    ema_.push_back(s.to(low ? at::kFloat : s.scalar_type(), /*non_blocking=*/false, /*copy=*/true));
  }
}

void ShardedEma::update(int64_t step) {
  torch::NoGradGuard no_grad;
  if (swapped_) throw std::logic_error("ShardedEma::update while the EMA is swapped into the model");
  auto& units = model_.units();
  for (size_t i = 0; i < units.size(); ++i) {
    const at::Tensor& p = units[i]->shard();
    if (step < cfg_.start_step) {
      ema_[i].copy_(p);
    } else {
      // BigGAN's form: ema*decay + p*(1 - decay).
      ema_[i].mul_(cfg_.decay).add_(p.to(ema_[i].scalar_type()), 1.0 - cfg_.decay);
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
