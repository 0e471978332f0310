// OffloadedAdam's states outside the step: the float32 view checkpoints read and write, the
// raw 8-bit parts, the frozen ranges kept across a step, and the bytes it holds
// (include/shardgan/optim/offloaded_adam.h).
#include <cstring>
#include <stdexcept>

#include <torch/torch.h>

#include "shardgan/offload/state_store.h"
#include "shardgan/optim/blockwise_quant.h"
#include "shardgan/optim/offloaded_adam.h"
#include "shardgan/sharding/sharded_model.h"
#include "optim/offload_array_io.h"

namespace shardgan {

using offload_io::read_array;
using offload_io::view;
using offload_io::write_array;

std::vector<std::pair<std::string, at::Tensor>> OffloadedAdam::unit_state(size_t) {
  throw std::logic_error("the optimizer state of " + model_.name() +
                         " is offloaded; read it with read_unit_state / write_unit_state");
}

ReducedState OffloadedAdam::stores(size_t unit, bool second, at::Tensor values) const {
  const ReducedState& r = second ? v_res_.at(unit) : m_res_.at(unit);
  return {r.f32, std::move(values), r.absmax};
}

ReducedFormat OffloadedAdam::format(bool second) const { return adam_state_format(cfg_.state, second, isa_); }

at::Tensor OffloadedAdam::read_state_array(size_t unit, bool second) {
  model_.drain_grad_writes();  // the gradient writer must not share the ring with this read
  at::Tensor t = torch::empty({model_.units().at(unit)->shard_numel()}, torch::TensorOptions().dtype(state_dtype_));
  read_array(*store_, unit, second ? arrays_.v : arrays_.m, state_dtype_, t);
  return t;
}

void OffloadedAdam::write_state_array(size_t unit, bool second, const at::Tensor& values) {
  model_.drain_grad_writes();
  write_array(*store_, unit, second ? arrays_.v : arrays_.m, state_dtype_, values);
}

void OffloadedAdam::read_unit_state(size_t unit, const StateVisitor& fn) {
  model_.drain_grad_writes();  // the writer must not share the ring with this read
  const int64_t n = model_.units().at(unit)->shard_numel();
  if (reduced()) {
    for (const std::string& name : state_names()) {
      const bool second = name == "exp_avg_sq";
      at::Tensor t = widen_state(layouts_.at(unit), n, format(second), stores(unit, second, read_state_array(unit, second)));
      fn(name, t);
    }
    return;
  }
  at::Tensor m = moments_ == 2 ? torch::empty({n}, torch::TensorOptions().dtype(dtype_)) : at::Tensor();
  at::Tensor v = torch::empty({n}, torch::TensorOptions().dtype(dtype_));
  const int a = moment_array_, va = v_array();
  store_->stream({unit}, OffloadStore::Mode::kRead, [&](const OffloadStore::Chunk& c) {
    if (m.defined()) m.narrow(0, c.offset, c.numel).copy_(view(c.data[a], c.numel, dtype_));
    v.narrow(0, c.offset, c.numel).copy_(view(c.data[va], c.numel, dtype_));
  }, ((1u << moments_) - 1) << a);
  if (m.defined()) fn("exp_avg", m);
  fn("exp_avg_sq", v);
}

namespace {
// A fresh reduced array: the 8-bit zero code (padding keeps it, as in ShardedAdam), or +0.0.
at::Tensor fresh_reduced(int64_t n, StateDtype d, bool second) {
  if (d == StateDtype::kInt8) {
    return torch::full({n}, static_cast<int64_t>(zero_code(second ? CodeMap::kUnsigned : CodeMap::kSigned)), torch::kByte);
  }
  return torch::zeros({n}, torch::kBFloat16);
}
}  // namespace

void OffloadedAdam::write_unit_state(size_t unit, const StateVisitor& fn) {
  model_.drain_grad_writes();
  const int64_t n = model_.units().at(unit)->shard_numel();
  if (reduced()) {
    for (const std::string& name : state_names()) {
      const bool second = name == "exp_avg_sq";
      at::Tensor t = torch::zeros({n}, torch::kFloat);
      fn(name, t);
      ReducedState st = stores(unit, second, fresh_reduced(n, cfg_.state.dtype, second));
      narrow_state(layouts_.at(unit), format(second), t, st);
      write_state_array(unit, second, st.values);
    }
    return;
  }
  at::Tensor m = moments_ == 2 ? torch::empty({n}, torch::TensorOptions().dtype(dtype_)) : at::Tensor();
  at::Tensor v = torch::empty({n}, torch::TensorOptions().dtype(dtype_));
  if (m.defined()) fn("exp_avg", m);
  fn("exp_avg_sq", v);
  const int a = moment_array_, va = v_array();
  store_->stream({unit}, OffloadStore::Mode::kWrite, [&](const OffloadStore::Chunk& c) {
    if (m.defined()) view(c.data[a], c.numel, dtype_).copy_(m.narrow(0, c.offset, c.numel));
    view(c.data[va], c.numel, dtype_).copy_(v.narrow(0, c.offset, c.numel));
  }, ((1u << moments_) - 1) << a);
}

std::vector<ShardedOptimizer::RawState> OffloadedAdam::raw_states() {
  return adam_raw_states(cfg_.state, moments_ == 2);
}

int64_t OffloadedAdam::raw_state_block() const { return adam_raw_state_block(cfg_.state); }

void OffloadedAdam::read_unit_raw(size_t unit, const RawVisitor& fn) {
  if (cfg_.state.dtype != StateDtype::kInt8) return;
  model_.drain_grad_writes();
  for (const RawState& rs : raw_states()) {
    const bool second = rs.name == "exp_avg_sq";
    visit_raw_state(*model_.units().at(unit), layouts_.at(unit), cfg_.state.block, rs.name,
                    stores(unit, second, read_state_array(unit, second)), fn);
  }
}

void OffloadedAdam::load_unit_state(size_t unit, StateSource& src) {
  if (cfg_.state.dtype != StateDtype::kInt8) return ShardedOptimizer::load_unit_state(unit, src);
  model_.drain_grad_writes();
  const int64_t n = model_.units().at(unit)->shard_numel();
  for (const RawState& rs : raw_states()) {
    if (!src.has(rs.name)) {
      throw std::runtime_error("it has no optimizer state '" + rs.name + "' (saved with another optimizer?)");
    }
    const bool second = rs.name == "exp_avg_sq";
    ReducedState st = stores(unit, second, fresh_reduced(n, cfg_.state.dtype, second));
    load_raw_state(*model_.units().at(unit), layouts_.at(unit), format(second), rs.name, st, src);
    write_state_array(unit, second, st.values);
  }
}

std::shared_ptr<void> OffloadedAdam::keep_frozen_state(size_t unit, const Ranges& ranges) {
  if (!reduced()) return ShardedOptimizer::keep_frozen_state(unit, ranges);
  // The stored bits (a float32 round trip of 8-bit blocks is not the identity).
  auto kept = std::make_shared<std::vector<ReducedState>>();
  for (const std::string& name : state_names()) {
    const bool second = name == "exp_avg_sq";
    const ReducedState& r = second ? v_res_.at(unit) : m_res_.at(unit);
    kept->push_back({r.f32.clone(), read_state_array(unit, second), r.absmax.defined() ? r.absmax.clone() : at::Tensor()});
  }
  return kept;
}

void OffloadedAdam::restore_frozen_state(size_t unit, const Ranges& ranges, const std::shared_ptr<void>& kept) {
  if (!reduced()) return ShardedOptimizer::restore_frozen_state(unit, ranges, kept);
  const auto& k = *std::static_pointer_cast<std::vector<ReducedState>>(kept);
  size_t i = 0;
  for (const std::string& name : state_names()) {
    const bool second = name == "exp_avg_sq";
    ReducedState live = stores(unit, second, read_state_array(unit, second));
    restore_state_ranges(layouts_.at(unit), cfg_.state.dtype, cfg_.state.block, ranges, k.at(i++), live);
    write_state_array(unit, second, live.values);
  }
}

int64_t OffloadedAdam::state_bytes() {
  int64_t b = store_->ram_bytes();
  for (const auto* res : {&m_res_, &v_res_}) {
    for (const ReducedState& r : *res) {
      for (const at::Tensor* t : {&r.f32, &r.absmax}) b += t->defined() ? t->numel() * t->element_size() : 0;
    }
  }
  return b;
}

int64_t OffloadedAdam::offloaded_bytes() { return store_->disk_bytes(); }

}  // namespace shardgan
