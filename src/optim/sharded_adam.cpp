#include "shardgan/optim/sharded_adam.h"

#include <cmath>
#include <stdexcept>

#include <torch/torch.h>

#include "shardgan/sharding/sharded_model.h"

namespace shardgan {

namespace {

bool fused_ok(const at::Tensor& p, const at::Tensor& g) {
  return p.scalar_type() == at::kFloat && g.scalar_type() == at::kFloat && p.device().is_cpu() &&
         g.device().is_cpu() && p.is_contiguous() && g.is_contiguous();
}

at::ScalarType copy_dtype(ParamCopy c) { return c == ParamCopy::kBFloat16 ? at::kBFloat16 : at::kHalf; }

}  // namespace

void validate_adam_config(const AdamConfig& cfg) {
  if (!(cfg.lr >= 0)) throw std::invalid_argument("Invalid learning rate: " + std::to_string(cfg.lr));
  if (!(cfg.beta1 >= 0 && cfg.beta1 < 1) || !(cfg.beta2 >= 0 && cfg.beta2 < 1)) {
    throw std::invalid_argument("Invalid Adam betas: (" + std::to_string(cfg.beta1) + ", " +
                                std::to_string(cfg.beta2) + "), each must be in [0, 1)");
  }
  if (!(cfg.eps >= 0)) throw std::invalid_argument("Invalid epsilon value: " + std::to_string(cfg.eps));
  if (!(cfg.weight_decay >= 0)) {
    throw std::invalid_argument("Invalid weight_decay value: " + std::to_string(cfg.weight_decay));
  }
}

ShardedAdam::ShardedAdam(ShardedModel& model, AdamConfig cfg)
    : ShardedOptimizer(model, cfg.lr), cfg_(cfg) {
  validate_adam_config(cfg);
  for (auto& u : model_.units()) {
    exp_avg_.push_back(torch::zeros_like(u->shard()));
    exp_avg_sq_.push_back(torch::zeros_like(u->shard()));
    if (cfg.param_copy != ParamCopy::kNone) {
      if (!fused_ok(u->shard(), u->grad_shard())) {
        throw std::invalid_argument("Adam param_copy needs float32 CPU shards; unit '" + u->name() +
                                    "' has " + std::string(c10::toString(u->shard().scalar_type())) +
                                    " on " + u->shard().device().str());
      }
      copies_.push_back(u->shard().to(copy_dtype(cfg.param_copy)));
    } else {
      copies_.emplace_back();
    }
  }
}

void ShardedAdam::update() {
  torch::NoGradGuard no_grad;
  const bool adamw = cfg_.decoupled_weight_decay;
  const double wd = cfg_.weight_decay;
  auto& units = model_.units();
  std::vector<size_t> torch_fused;
  for (size_t i = 0; i < units.size(); ++i) {
    at::Tensor& p = units[i]->shard();
    const at::Tensor& g = units[i]->grad_shard();
    const bool floating = p.scalar_type() == at::kFloat || p.scalar_type() == at::kDouble;
    if (!copies_[i].defined() && floating && p.is_contiguous() && (!p.device().is_cpu() || torch_fused_)) {
      torch_fused.push_back(i);
      continue;
    }
    if (fused_ok(p, g)) {
      const AdamCoefficients c =
          adam_coefficients(lr_, cfg_.beta1, cfg_.beta2, cfg_.eps, wd, adamw, step_);
      uint16_t* out = copies_[i].defined() ? static_cast<uint16_t*>(copies_[i].data_ptr()) : nullptr;
      fused_adam_step(p.data_ptr<float>(), g.data_ptr<float>(), exp_avg_[i].data_ptr<float>(),
                      exp_avg_sq_[i].data_ptr<float>(), p.numel(), c, cfg_.param_copy, out, isa_);
      continue;
    }
    adam_torch_step(p, g, exp_avg_[i], exp_avg_sq_[i], cfg_, lr_, step_);
  }
  if (!torch_fused.empty()) torch_fused_step(torch_fused);
}

void ShardedAdam::torch_fused_step(const std::vector<size_t>& which) {
  auto& units = model_.units();
  if (state_steps_.size() != units.size()) state_steps_.resize(units.size());
  std::vector<at::Tensor> p, g, m, v, steps;
  for (size_t i : which) {
    at::Tensor& shard = units[i]->shard();
    at::Tensor grad = units[i]->grad_shard();
    if (grad.scalar_type() != shard.scalar_type()) grad = grad.to(shard.scalar_type());
    // The kernel reads the step count from a float tensor on the parameters' device (the
    // caller increments it first, as torch.optim does); step_ already counts this step.
    if (!state_steps_[i].defined()) state_steps_[i] = at::zeros({}, shard.options().dtype(at::kFloat));
    p.push_back(shard);
    g.push_back(grad);
    m.push_back(exp_avg_[i]);
    v.push_back(exp_avg_sq_[i]);
    steps.push_back(state_steps_[i]);
  }
  // Every unit's step count set at once: two multi-tensor kernels on a GPU instead of one
  // small fill per unit (there is no _foreach_fill_). Exact: 0 + step, an integer below 2^24.
  at::_foreach_zero_(steps);
  at::_foreach_add_(steps, static_cast<double>(step_));
  // Same update as adam_torch_step: bias corrections from the step, eps added after
  // sqrt(v / bc2), L2 (Adam) or decoupled (AdamW) weight decay.
  if (cfg_.decoupled_weight_decay) {
    at::_fused_adamw_(p, g, m, v, /*max_exp_avg_sqs=*/{}, steps, lr_, cfg_.beta1, cfg_.beta2, cfg_.weight_decay,
                      cfg_.eps, /*amsgrad=*/false, /*maximize=*/false);
  } else {
    at::_fused_adam_(p, g, m, v, /*max_exp_avg_sqs=*/{}, steps, lr_, cfg_.beta1, cfg_.beta2, cfg_.weight_decay,
                     cfg_.eps, /*amsgrad=*/false, /*maximize=*/false);
  }
}

void adam_torch_step(at::Tensor& p, const at::Tensor& g, at::Tensor& m, at::Tensor& v, const AdamConfig& cfg,
                     double lr, int64_t step) {
  // torch::optim::Adam / AdamW (LibTorch 2.15, unchanged since 1.13), op for op.
  const double bc1 = 1.0 - std::pow(cfg.beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(cfg.beta2, static_cast<double>(step));
  at::Tensor grad = g;
  if (cfg.weight_decay != 0) {
    if (cfg.decoupled_weight_decay) p.mul_(1 - lr * cfg.weight_decay);
    else grad = grad.add(p, cfg.weight_decay);
  }
  m.mul_(cfg.beta1).add_(grad, 1.0 - cfg.beta1);
  v.mul_(cfg.beta2).addcmul_(grad, grad, 1.0 - cfg.beta2);
  at::Tensor denom = (v.sqrt() / std::sqrt(bc2)).add_(cfg.eps);
  p.addcdiv_(m, denom, -lr / bc1);
}

void ShardedAdam::after_frozen_restore(size_t unit) {
  if (copies_.at(unit).defined()) copies_[unit].copy_(model_.units().at(unit)->shard());
}

void ShardedAdam::set_param_copy(size_t unit, at::Tensor out) {
  if (cfg_.param_copy == ParamCopy::kNone) throw std::invalid_argument("set_param_copy: param_copy is off");
  const at::Tensor& s = model_.units().at(unit)->shard();
  if (!out.defined() || out.scalar_type() != copy_dtype(cfg_.param_copy) || !out.device().is_cpu() ||
      !out.is_contiguous() || out.numel() != s.numel()) {
    throw std::invalid_argument("set_param_copy: unit " + std::to_string(unit) + " needs a contiguous CPU " +
                                std::string(c10::toString(copy_dtype(cfg_.param_copy))) + " tensor of " +
                                std::to_string(s.numel()) + " elements");
  }
  copies_[unit] = std::move(out);
}

std::vector<std::pair<std::string, at::Tensor>> ShardedAdam::unit_state(size_t unit) {
  return {{"exp_avg", exp_avg_.at(unit)}, {"exp_avg_sq", exp_avg_sq_.at(unit)}};
}

}  // namespace shardgan
