#include "shardgan/optim/optimizer.h"

#include <algorithm>
#include <chrono>
#include <map>

#include <torch/torch.h>

#include "shardgan/sharding/sharded_model.h"

namespace shardgan {
namespace {

// Ranges [lo, hi) of unit u's shard (shard-local elements) that belong to parameters with
// requires_grad off at this step.
std::vector<std::pair<int64_t, int64_t>> frozen_ranges(const ShardedUnit& u) {
  std::vector<std::pair<int64_t, int64_t>> out;
  const int64_t s0 = u.shard_offset(), s1 = s0 + u.shard_numel();
  for (const auto& s : u.slots()) {
    if (s.param.requires_grad()) continue;
    const int64_t lo = std::max(s.offset, s0), hi = std::min(s.offset + s.numel, s1);
    if (lo < hi) out.emplace_back(lo - s0, hi - s0);
  }
  return out;
}

// The values of `t` in `ranges`, cloned (1-D, concatenated).
at::Tensor take(const at::Tensor& t, const std::vector<std::pair<int64_t, int64_t>>& ranges) {
  std::vector<at::Tensor> parts;
  for (auto [lo, hi] : ranges) parts.push_back(t.narrow(0, lo, hi - lo));
  return torch::cat(parts).clone();
}

// Writes `saved` (from take) back into `t` at `ranges`.
void put(at::Tensor& t, const at::Tensor& saved, const std::vector<std::pair<int64_t, int64_t>>& ranges) {
  int64_t k = 0;
  for (auto [lo, hi] : ranges) {
    t.narrow(0, lo, hi - lo).copy_(saved.narrow(0, k, hi - lo));
    k += hi - lo;
  }
}

}  // namespace

void ShardedOptimizer::step() {
  if (schedule_) lr_ = schedule_->lr_at(step_);
  ++step_;
  const auto t0 = std::chrono::steady_clock::now();
  // Frozen elements inside a flat parameter (a unit with mixed requires_grad): torch::optim
  // skips a parameter without a gradient, leaving its value and its state untouched, but
  // the kernels below step whole shards (weight decay, Adam's moments and SGD's momentum
  // would move the frozen elements). So every optimizer, offloaded ones included, steps
  // through this mask: the frozen ranges of value and state are kept and put back.
  struct Kept {
    size_t unit;
    Ranges ranges;
    at::Tensor value;
    std::shared_ptr<void> state;
  };
  std::vector<Kept> kept;
  torch::NoGradGuard no_grad;
  auto& units = model_.units();
  bool drained = false;
  for (size_t i = 0; i < units.size(); ++i) {
    auto ranges = frozen_ranges(*units[i]);
    if (ranges.empty()) continue;
    if (!drained) {
      // An offloaded master shard or state is read here, outside the tier lock: no
      // gradient write or read-ahead may be using the tier meanwhile.
      model_.drain_grad_writes();
      model_.drain_read_ahead();
      drained = true;
    }
    Kept k{i, ranges, take(units[i]->master_shard(), ranges), {}};
    k.state = keep_frozen_state(i, ranges);
    kept.push_back(std::move(k));
  }
  update();
  for (Kept& k : kept) {
    ShardedUnit& u = *units[k.unit];
    if (u.shard_offloaded()) {
      at::Tensor v = u.master_shard();
      put(v, k.value, k.ranges);
      u.set_master_shard(v);
    } else {
      put(u.shard(), k.value, k.ranges);
    }
    restore_frozen_state(k.unit, k.ranges, k.state);
    after_frozen_restore(k.unit);
  }
  update_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::shared_ptr<void> ShardedOptimizer::keep_frozen_state(size_t unit, const Ranges& ranges) {
  auto kept = std::make_shared<std::map<std::string, at::Tensor>>();
  read_unit_state(unit, [&](const std::string& name, at::Tensor& st) { (*kept)[name] = take(st, ranges); });
  return kept;
}

void ShardedOptimizer::restore_frozen_state(size_t unit, const Ranges& ranges, const std::shared_ptr<void>& kept) {
  const auto& saved = *std::static_pointer_cast<std::map<std::string, at::Tensor>>(kept);
  std::map<std::string, at::Tensor> now;  // full copies: a tier's write needs every element
  read_unit_state(unit, [&](const std::string& name, at::Tensor& st) { now[name] = st.clone(); });
  write_unit_state(unit, [&](const std::string& name, at::Tensor& st) {
    at::Tensor& v = now.at(name);
    put(v, saved.at(name), ranges);
    st.copy_(v);
  });
}

void ShardedOptimizer::load_unit_state(size_t unit, StateSource& src) {
  const ShardedUnit& u = *model_.units().at(unit);
  const int64_t s0 = u.shard_offset(), S = u.shard_numel();
  write_unit_state(unit, [&](const std::string& name, at::Tensor& st) {
    if (!src.has(name)) throw std::runtime_error("it has no optimizer state '" + name + "' (saved with another optimizer?)");
    at::Tensor c = torch::zeros({S}, torch::kFloat);
    for (size_t k = 0; k < u.slots().size(); ++k) {
      const auto& sl = u.slots()[k];
      const int64_t a = std::max(s0, sl.offset), b = std::min(s0 + S, sl.offset + sl.numel);
      if (a < b) src.read_values(name, k, a - sl.offset, b - sl.offset, c.data_ptr<float>() + (a - s0));
    }
    st.copy_(c);
  });
}

int64_t ShardedOptimizer::state_bytes() {
  int64_t b = 0;
  for (size_t i = 0; i < model_.units().size(); ++i) {
    for (auto& kv : unit_state(i)) b += kv.second.numel() * kv.second.element_size();
  }
  return b;
}

std::vector<std::string> ShardedOptimizer::state_names() {
  std::vector<std::string> names;
  if (!model_.units().empty()) {
    for (auto& kv : unit_state(0)) names.push_back(kv.first);
  }
  return names;
}

void ShardedOptimizer::read_unit_state(size_t unit, const StateVisitor& fn) {
  for (auto& kv : unit_state(unit)) fn(kv.first, kv.second);
}

void ShardedOptimizer::write_unit_state(size_t unit, const StateVisitor& fn) {
  for (auto& kv : unit_state(unit)) fn(kv.first, kv.second);
}

}  // namespace shardgan
