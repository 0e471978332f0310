#include "shardgan/sharding/sharded_model.h"

#include <algorithm>

#include <torch/csrc/autograd/engine.h>
#include <torch/torch.h>

namespace shardgan {

ShardedModel::ShardedModel(std::string name, Communicator& comm, ShardingConfig cfg)
    : name_(std::move(name)), comm_(comm), cfg_(cfg) {}

ShardedModel::~ShardedModel() = default;

ShardedUnit& ShardedModel::add_unit(std::string unit_name,
                                    std::shared_ptr<torch::nn::Module> module,
                                    ShardedUnit::Forward forward) {
  units_.push_back(std::make_unique<ShardedUnit>(std::move(unit_name), std::move(module),
                                                 std::move(forward), comm_, cfg_, this));
  return *units_.back();
}

at::Tensor ShardedModel::forward(at::Tensor x) {
  for (size_t i = 0; i < units_.size(); ++i) {
    units_[i]->gather();
    if (cfg_.prefetch && i + 1 < units_.size()) units_[i + 1]->prefetch();
    x = units_[i]->forward(x);
  }
  return x;
}

void ShardedModel::set_requires_grad(bool on) {
  for (auto& u : units_) u->set_requires_grad(on);
}

void ShardedModel::zero_grad() {
  finish_reduces();
  for (auto& u : units_) u->zero_grad();
}

void ShardedModel::set_gradient_sync(bool on) {
  for (auto& u : units_) u->set_gradient_sync(on);
}

void ShardedModel::after_optimizer_step() {
  for (auto& u : units_) u->after_optimizer_step();
}

void ShardedModel::train(bool on) {
  for (auto& u : units_) u->module().train(on);
}

std::vector<std::pair<std::string, at::Tensor>> ShardedModel::gather_full_parameters() {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& u : units_) {
    at::Tensor flat = u->gather_full_copy();
    for (auto& s : u->slots()) {
      out.emplace_back(u->name() + "." + s.name, flat.narrow(0, s.offset, s.numel).view(s.shape));
    }
  }
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> ShardedModel::named_buffers() {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& u : units_) {
    for (auto& kv : u->module().named_buffers(true)) {
      out.emplace_back(u->name() + "." + kv.key(), kv.value());
    }
  }
  return out;
}

MemoryStats ShardedModel::memory_stats() const {
  MemoryStats m;
  for (auto& u : units_) {
    m.param_shard_bytes += u->persistent_param_bytes();
    m.grad_shard_bytes += u->persistent_grad_bytes();
    m.comm_buffer_bytes = std::max(m.comm_buffer_bytes, u->peak_comm_buffer_bytes());
    m.full_param_bytes_alive += u->full_bytes_alive();
    m.padding_elements += u->padded_numel() - u->numel();
  }
  m.peak_full_param_bytes = std::max(peak_full_bytes_, m.full_param_bytes_alive);
  return m;
}

void ShardedModel::on_unit_gathered() {
  int64_t alive = 0;
  for (auto& u : units_) alive += u->full_bytes_alive();
  peak_full_bytes_ = std::max(peak_full_bytes_, alive);
}

void ShardedModel::before_reduce_start(ShardedUnit& u) {
  u.finish_reduce();  // a unit reduced twice in one step (micro-steps) keeps its order
  reducing_.erase(std::remove(reducing_.begin(), reducing_.end(), &u), reducing_.end());
  while (reducing_.size() >= kMaxReducesInFlight) {
    reducing_.front()->finish_reduce();
    reducing_.erase(reducing_.begin());
  }
}

void ShardedModel::on_reduce_started(ShardedUnit& u) {
  reducing_.push_back(&u);
  max_in_flight_ = std::max(max_in_flight_, reducing_.size());
}

void ShardedModel::finish_reduces() {
  for (ShardedUnit* u : reducing_) u->finish_reduce();
  reducing_.clear();
}

void ShardedModel::ensure_backward_callback() {
  if (callback_queued_) return;
  callback_queued_ = true;
  // Runs once the whole backward pass is done: reduce and free whatever is still armed,
  // in reverse forward order, which is the same on every rank.
  torch::autograd::Engine::get_default_engine().queue_callback([this] {
    for (auto it = units_.rbegin(); it != units_.rend(); ++it) (*it)->finish_backward();
    finish_reduces();
    callback_queued_ = false;
  });
}

}  // namespace shardgan
