#include "shardgan/optim/sharded_adam.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include <torch/torch.h>

#include "shardgan/optim/blockwise_quant.h"
#include "shardgan/optim/reduced_state.h"
#include "shardgan/sharding/sharded_model.h"
#include "shardgan/util/test_control.h"

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

bool adam_stores_m(double beta1, bool device_is_cpu) { return beta1 != 0.0 || !device_is_cpu; }

namespace {

std::vector<StateParam> state_params(const ShardedUnit& u) {
  std::vector<StateParam> out;
  for (const auto& s : u.slots()) out.push_back({u.name() + "." + s.name, s.offset, s.numel});
  return out;
}

std::string unit_what(const ShardedUnit& u, const at::Tensor& p) {
  return "unit '" + u.name() + "' has " + std::string(c10::toString(p.scalar_type())) + " on " + p.device().str();
}

}  // namespace

ShardedAdam::ShardedAdam(ShardedModel& model, AdamConfig cfg)
    : ShardedOptimizer(model, cfg.lr), cfg_(cfg) {
  validate_adam_config(cfg);
  validate_state_policy(cfg.state);
  const bool int8 = cfg.state.dtype == StateDtype::kInt8;
  bool any_gpu = false;
  for (auto& u : model_.units()) any_gpu |= !u->shard().device().is_cpu();
  stores_m_ = adam_stores_m(cfg.beta1, !any_gpu);
  for (auto& u : model_.units()) {
    const at::Tensor& shard = u->shard();
    if ((cfg.param_copy != ParamCopy::kNone || reduced()) && !fused_ok(shard, u->grad_shard())) {
      const std::string what = reduced() ? std::string("Adam state_dtype ") + to_string(cfg.state.dtype) : "Adam param_copy";
      throw std::invalid_argument(what + " needs float32 CPU shards; " + unit_what(*u, shard));
    }
    // Control "state_dtype_unaligned" (tests/test_state_dtype_sharded.cpp) accepts an
    // unaligned layout, whose blocks straddle ranks, to show the parity test catches it.
    if (int8 && model_.config().flat_align != cfg.state.block && !test_control("state_dtype_unaligned")) {
      throw std::invalid_argument("Adam state_dtype int8 with blocks of " + std::to_string(cfg.state.block) +
                                  " needs the model's flat parameters aligned to the block (ShardingConfig::"
                                  "flat_align " + std::to_string(model_.config().flat_align) + "); unit '" +
                                  u->name() + "'");
    }
    layouts_.push_back(make_state_layout(state_params(*u), u->padded_numel(), u->shard_offset(), u->shard_numel(),
                                         cfg.state));
    const StateLayout& l = layouts_.back();
    if (!reduced()) {
      exp_avg_.push_back(stores_m_ ? torch::zeros_like(shard) : at::Tensor());
      exp_avg_sq_.push_back(torch::zeros_like(shard));
      m_red_.emplace_back();
      v_red_.emplace_back();
    } else {
      const auto f32 = torch::TensorOptions().dtype(at::kFloat);
      exp_avg_.push_back(stores_m_ ? torch::zeros({l.float32_numel}, f32) : at::Tensor());
      exp_avg_sq_.push_back(torch::zeros({l.float32_numel}, f32));
      auto make = [&](CodeMap map) {
        Reduced r;
        if (int8) {
          r.values = torch::full({l.reduced_numel}, static_cast<int64_t>(zero_code(map)), torch::kByte);
          r.absmax = torch::zeros({l.blocks}, f32);
        } else {
          r.values = torch::zeros({l.reduced_numel}, torch::kBFloat16);  // bits 0 are +0.0
        }
        return r;
      };
      m_red_.push_back(stores_m_ ? make(CodeMap::kSigned) : Reduced{});
      v_red_.push_back(make(CodeMap::kUnsigned));
    }
    if (cfg.param_copy != ParamCopy::kNone) {
      copies_.push_back(shard.to(copy_dtype(cfg.param_copy)));
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
    const AdamCoefficients c = adam_coefficients(lr_, cfg_.beta1, cfg_.beta2, cfg_.eps, wd, adamw, step_);
    if (reduced()) {
      update_runs(i, c);
      continue;
    }
    const bool floating = p.scalar_type() == at::kFloat || p.scalar_type() == at::kDouble;
    if (!copies_[i].defined() && floating && p.is_contiguous() && (!p.device().is_cpu() || torch_fused_)) {
      torch_fused.push_back(i);
      continue;
    }
    if (fused_ok(p, g)) {
      uint16_t* out = copies_[i].defined() ? static_cast<uint16_t*>(copies_[i].data_ptr()) : nullptr;
      float* m = exp_avg_[i].defined() ? exp_avg_[i].data_ptr<float>() : nullptr;
      fused_adam_step(p.data_ptr<float>(), g.data_ptr<float>(), m, exp_avg_sq_[i].data_ptr<float>(), p.numel(), c,
                      cfg_.param_copy, out, isa_);
      continue;
    }
    // m not stored (beta1 == 0): a zero m each step, which the update overwrites with g.
    at::Tensor m = exp_avg_[i].defined() ? exp_avg_[i] : torch::zeros_like(p);
    adam_torch_step(p, g, m, exp_avg_sq_[i], cfg_, lr_, step_);
  }
  if (!torch_fused.empty()) torch_fused_step(torch_fused);
}

void ShardedAdam::update_runs(size_t i, const AdamCoefficients& c) {
  ShardedUnit& u = *model_.units()[i];
  float* p = u.shard().data_ptr<float>();
  const float* g = u.grad_shard().data_ptr<float>();
  uint16_t* out = copies_[i].defined() ? static_cast<uint16_t*>(copies_[i].data_ptr()) : nullptr;
  float* m32 = exp_avg_[i].defined() ? exp_avg_[i].data_ptr<float>() : nullptr;
  float* v32 = exp_avg_sq_[i].data_ptr<float>();
  const Reduced& mr = m_red_[i];
  const Reduced& vr = v_red_[i];
  const int64_t block = cfg_.state.block;
  for (const StateRun& r : layouts_[i].runs) {
    float* pr = p + r.begin;
    const float* gr = g + r.begin;
    uint16_t* o = out ? out + r.begin : nullptr;
    if (!r.reduced) {
      fused_adam_step(pr, gr, m32 ? m32 + r.store_offset : nullptr, v32 + r.store_offset, r.numel, c, cfg_.param_copy,
                      o, isa_);
    } else if (cfg_.state.dtype == StateDtype::kBFloat16) {
      uint16_t* mb = mr.values.defined() ? static_cast<uint16_t*>(mr.values.data_ptr()) + r.store_offset : nullptr;
      fused_adam_bf16_step(pr, gr, mb, static_cast<uint16_t*>(vr.values.data_ptr()) + r.store_offset, r.numel, c,
                           cfg_.param_copy, o, isa_);
    } else {
      QuantizedState mq, vq;
      if (mr.values.defined()) {
        mq = {mr.values.data_ptr<uint8_t>() + r.store_offset, mr.absmax.data_ptr<float>() + r.block_offset};
      }
      vq = {vr.values.data_ptr<uint8_t>() + r.store_offset, vr.absmax.data_ptr<float>() + r.block_offset};
      nonfinite_blocks_ += fused_adam8_step(pr, gr, mq, vq, r.numel, block, c, cfg_.param_copy, o, isa_);
    }
  }
}

ReducedState ShardedAdam::stores(size_t unit, bool second) const {
  const Reduced& red = second ? v_red_.at(unit) : m_red_.at(unit);
  return {second ? exp_avg_sq_.at(unit) : exp_avg_.at(unit), red.values, red.absmax};
}

ReducedFormat ShardedAdam::format(bool second) const { return adam_state_format(cfg_.state, second, isa_); }

at::Tensor ShardedAdam::widen(size_t unit, bool second) {
  const ReducedState st = stores(unit, second);
  const int64_t S = model_.units().at(unit)->shard_numel();
  if (!st.f32.defined()) return torch::zeros({S}, torch::kFloat);  // m not stored: it reads as zeros
  return widen_state(layouts_.at(unit), S, format(second), st);
}

void ShardedAdam::narrow(size_t unit, bool second, const at::Tensor& values) {
  ReducedState st = stores(unit, second);
  if (st.f32.defined()) narrow_state(layouts_.at(unit), format(second), values, st);
}

std::vector<std::string> ShardedAdam::state_names() {
  if (stores_m_) return {"exp_avg", "exp_avg_sq"};
  return {"exp_avg_sq"};
}

void ShardedAdam::read_unit_state(size_t unit, const StateVisitor& fn) {
  if (!reduced()) return ShardedOptimizer::read_unit_state(unit, fn);
  for (const std::string& name : state_names()) {
    at::Tensor t = widen(unit, name == "exp_avg_sq");
    fn(name, t);
  }
}

void ShardedAdam::write_unit_state(size_t unit, const StateVisitor& fn) {
  if (!reduced()) return ShardedOptimizer::write_unit_state(unit, fn);
  for (const std::string& name : state_names()) {
    at::Tensor t = torch::zeros({model_.units().at(unit)->shard_numel()}, torch::kFloat);
    fn(name, t);
    narrow(unit, name == "exp_avg_sq", t);
  }
}

std::vector<ShardedOptimizer::RawState> ShardedAdam::raw_states() { return adam_raw_states(cfg_.state, stores_m_); }

int64_t ShardedAdam::raw_state_block() const { return adam_raw_state_block(cfg_.state); }

void ShardedAdam::read_unit_raw(size_t unit, const RawVisitor& fn) {
  if (cfg_.state.dtype != StateDtype::kInt8) return;
  for (const RawState& rs : raw_states()) {
    visit_raw_state(*model_.units().at(unit), layouts_[unit], cfg_.state.block, rs.name,
                    stores(unit, rs.name == "exp_avg_sq"), fn);
  }
}

void ShardedAdam::load_unit_state(size_t unit, StateSource& src) {
  if (cfg_.state.dtype != StateDtype::kInt8) return ShardedOptimizer::load_unit_state(unit, src);
  for (const RawState& rs : raw_states()) {
    if (!src.has(rs.name)) {
      throw std::runtime_error("it has no optimizer state '" + rs.name + "' (saved with another optimizer?)");
    }
    const bool second = rs.name == "exp_avg_sq";
    ReducedState st = stores(unit, second);
    load_raw_state(*model_.units().at(unit), layouts_[unit], format(second), rs.name, st, src);
  }
}

int64_t ShardedAdam::state_bytes() {
  int64_t b = 0;
  auto add = [&](const at::Tensor& t) { b += t.defined() ? t.numel() * t.element_size() : 0; };
  for (size_t i = 0; i < layouts_.size(); ++i) {
    for (const at::Tensor* t : {&exp_avg_[i], &exp_avg_sq_[i], &m_red_[i].values, &m_red_[i].absmax,
                                &v_red_[i].values, &v_red_[i].absmax}) {
      add(*t);
    }
  }
  return b;
}

std::shared_ptr<void> ShardedAdam::keep_frozen_state(size_t unit, const Ranges& ranges) {
  if (!reduced()) return ShardedOptimizer::keep_frozen_state(unit, ranges);
  // The raw stores: a float32 round trip of 8-bit blocks is not the identity.
  auto kept = std::make_shared<std::vector<ReducedState>>();
  for (bool second : {false, true}) {
    const ReducedState st = stores(unit, second);
    auto copy = [](const at::Tensor& t) { return t.defined() ? t.clone() : at::Tensor(); };
    kept->push_back({copy(st.f32), copy(st.values), copy(st.absmax)});
  }
  return kept;
}

void ShardedAdam::restore_frozen_state(size_t unit, const Ranges& ranges, const std::shared_ptr<void>& kept) {
  if (!reduced()) return ShardedOptimizer::restore_frozen_state(unit, ranges, kept);
  const auto& k = *std::static_pointer_cast<std::vector<ReducedState>>(kept);
  for (bool second : {false, true}) {
    ReducedState live = stores(unit, second);
    restore_state_ranges(layouts_[unit], cfg_.state.dtype, cfg_.state.block, ranges, k.at(second ? 1 : 0), live);
  }
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
    if (!exp_avg_[i].defined()) exp_avg_[i] = torch::zeros_like(shard);  // m not stored: torch's kernel needs one
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
  if (reduced()) {
    throw std::logic_error(std::string("ShardedAdam::unit_state: the states are stored in ") +
                           to_string(cfg_.state.dtype) + "; use read_unit_state");
  }
  if (!stores_m_) return {{"exp_avg_sq", exp_avg_sq_.at(unit)}};
  return {{"exp_avg", exp_avg_.at(unit)}, {"exp_avg_sq", exp_avg_sq_.at(unit)}};
}

}  // namespace shardgan
