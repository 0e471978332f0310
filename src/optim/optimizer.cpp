#include "shardgan/optim/optimizer.h"

#include <chrono>

#include "shardgan/sharding/sharded_model.h"

namespace shardgan {

void ShardedOptimizer::step() {
  if (schedule_) lr_ = schedule_->lr_at(step_);
  ++step_;
  const auto t0 = std::chrono::steady_clock::now();
  update();
  update_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
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
