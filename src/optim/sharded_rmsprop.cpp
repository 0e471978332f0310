#include "shardgan/optim/sharded_rmsprop.h"

#include <stdexcept>

#include <torch/torch.h>

#include "shardgan/sharding/sharded_model.h"

namespace shardgan {

ShardedRmsprop::ShardedRmsprop(ShardedModel& model, RmspropConfig cfg)
    : ShardedOptimizer(model, cfg.lr), cfg_(cfg) {
  if (!(cfg.lr >= 0)) throw std::invalid_argument("Invalid learning rate: " + std::to_string(cfg.lr));
  if (!(cfg.eps >= 0)) throw std::invalid_argument("Invalid epsilon value: " + std::to_string(cfg.eps));
  if (!(cfg.momentum >= 0)) throw std::invalid_argument("Invalid momentum value: " + std::to_string(cfg.momentum));
  if (!(cfg.weight_decay >= 0)) {
    throw std::invalid_argument("Invalid weight_decay value: " + std::to_string(cfg.weight_decay));
  }
  if (!(cfg.alpha >= 0)) throw std::invalid_argument("Invalid alpha value: " + std::to_string(cfg.alpha));
  for (auto& u : model_.units()) {
    sq_.push_back(torch::zeros_like(u->shard()));
    if (cfg.momentum > 0) buf_.push_back(torch::zeros_like(u->shard()));
    if (cfg.centered) gavg_.push_back(torch::zeros_like(u->shard()));
  }
}

void ShardedRmsprop::update() {
  torch::NoGradGuard no_grad;
  auto& units = model_.units();
  for (size_t i = 0; i < units.size(); ++i) {
    at::Tensor& p = units[i]->shard();
    at::Tensor grad = units[i]->grad_shard();
    if (cfg_.weight_decay != 0) grad = grad.add(p, cfg_.weight_decay);
    sq_[i].mul_(cfg_.alpha).addcmul_(grad, grad, 1 - cfg_.alpha);
    at::Tensor avg;
    if (cfg_.centered) {
      gavg_[i].mul_(cfg_.alpha).add_(grad, 1 - cfg_.alpha);
      avg = sq_[i].addcmul(gavg_[i], gavg_[i], -1).sqrt_().add_(cfg_.eps);
    } else {
      avg = sq_[i].sqrt().add_(cfg_.eps);
    }
    if (cfg_.momentum > 0) {
      buf_[i].mul_(cfg_.momentum).addcdiv_(grad, avg);
      p.add_(buf_[i], -lr_);
    } else {
      p.addcdiv_(grad, avg, -lr_);
    }
  }
}

std::vector<std::pair<std::string, at::Tensor>> ShardedRmsprop::unit_state(size_t unit) {
  std::vector<std::pair<std::string, at::Tensor>> s{{"square_avg", sq_.at(unit)}};
  if (cfg_.momentum > 0) s.emplace_back("momentum_buffer", buf_.at(unit));
  if (cfg_.centered) s.emplace_back("grad_avg", gavg_.at(unit));
  return s;
}

}  // namespace shardgan
