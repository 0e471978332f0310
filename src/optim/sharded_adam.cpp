#include "shardgan/optim/sharded_adam.h"

#include <cmath>
#include <stdexcept>

#include <torch/torch.h>

#include "shardgan/sharding/sharded_model.h"

namespace shardgan {

ShardedAdam::ShardedAdam(ShardedModel& model, AdamConfig cfg)
    : ShardedOptimizer(model, cfg.lr), cfg_(cfg) {
  if (!(cfg.lr >= 0)) throw std::invalid_argument("Invalid learning rate: " + std::to_string(cfg.lr));
  if (!(cfg.beta1 >= 0 && cfg.beta1 < 1) || !(cfg.beta2 >= 0 && cfg.beta2 < 1)) {
    throw std::invalid_argument("Invalid Adam betas: (" + std::to_string(cfg.beta1) + ", " +
                                std::to_string(cfg.beta2) + "), each must be in [0, 1)");
  }
  if (!(cfg.eps >= 0)) throw std::invalid_argument("Invalid epsilon value: " + std::to_string(cfg.eps));
  for (auto& u : model_.units()) {
    exp_avg_.push_back(torch::zeros_like(u->shard()));
    exp_avg_sq_.push_back(torch::zeros_like(u->shard()));
  }
}

void ShardedAdam::step() {
  torch::NoGradGuard no_grad;
  ++step_;
  const double bc1 = 1.0 - std::pow(cfg_.beta1, static_cast<double>(step_));
  const double bc2 = 1.0 - std::pow(cfg_.beta2, static_cast<double>(step_));
  const double step_size = lr_ / bc1;
  auto& units = model_.units();
  for (size_t i = 0; i < units.size(); ++i) {
    at::Tensor& p = units[i]->shard();
    const at::Tensor& g = units[i]->grad_shard();
    exp_avg_[i].mul_(cfg_.beta1).add_(g, 1.0 - cfg_.beta1);
    exp_avg_sq_[i].mul_(cfg_.beta2).addcmul_(g, g, 1.0 - cfg_.beta2);
    at::Tensor denom = (exp_avg_sq_[i].sqrt() / std::sqrt(bc2)).add_(cfg_.eps);
    p.addcdiv_(exp_avg_[i], denom, -step_size);
  }
}

std::vector<std::pair<std::string, at::Tensor>> ShardedAdam::unit_state(size_t unit) {
  return {{"exp_avg", exp_avg_.at(unit)}, {"exp_avg_sq", exp_avg_sq_.at(unit)}};
}

}  // namespace shardgan
