#include "shardgan/optim/sharded_sgd.h"

#include <stdexcept>

#include <torch/torch.h>

#include "shardgan/sharding/sharded_model.h"

namespace shardgan {

ShardedSgd::ShardedSgd(ShardedModel& model, SgdConfig cfg) : ShardedOptimizer(model, cfg.lr), cfg_(cfg) {
  if (!(cfg.lr >= 0)) throw std::invalid_argument("Invalid learning rate: " + std::to_string(cfg.lr));
  if (!(cfg.momentum >= 0)) throw std::invalid_argument("Invalid momentum value: " + std::to_string(cfg.momentum));
  if (!(cfg.weight_decay >= 0)) {
    throw std::invalid_argument("Invalid weight_decay value: " + std::to_string(cfg.weight_decay));
  }
  if (cfg.nesterov && (cfg.momentum <= 0 || cfg.dampening != 0)) {
    throw std::invalid_argument("Nesterov momentum requires a momentum and zero dampening (momentum " +
                                std::to_string(cfg.momentum) + ", dampening " + std::to_string(cfg.dampening) + ")");
  }
  if (cfg.momentum != 0) {
    for (auto& u : model_.units()) buf_.push_back(torch::zeros_like(u->shard()));
  }
}

void ShardedSgd::update() {
  torch::NoGradGuard no_grad;
  auto& units = model_.units();
  for (size_t i = 0; i < units.size(); ++i) {
    at::Tensor& p = units[i]->shard();
    at::Tensor d_p = units[i]->grad_shard();
    if (cfg_.weight_decay != 0) d_p = d_p.add(p, cfg_.weight_decay);
    if (cfg_.momentum != 0) {
      at::Tensor& buf = buf_[i];
      // torch creates the buffer as a clone of the first gradient; step 1 is that step
      // (also after a resume, where the buffer comes from the checkpoint).
      if (step_ == 1) buf.copy_(d_p);
      else buf.mul_(cfg_.momentum).add_(d_p, 1 - cfg_.dampening);
      d_p = cfg_.nesterov ? d_p.add(buf, cfg_.momentum) : buf;
    }
    p.add_(d_p, -lr_);
  }
}

std::vector<std::pair<std::string, at::Tensor>> ShardedSgd::unit_state(size_t unit) {
  if (cfg_.momentum == 0) return {};
  return {{"momentum_buffer", buf_.at(unit)}};
}

}  // namespace shardgan
