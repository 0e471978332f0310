#include "shardgan/sharding/sharded_model.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <unordered_set>

#include <torch/torch.h>

#include "shardgan/comm/node_shared.h"
#include "shardgan/comm/hybrid_communicator.h"
#include "shardgan/comm/quantized_collectives.h"
#include "shardgan/offload/read_ahead.h"
#include "shardgan/offload/tier_worker.h"
#include "sharding/ownership.h"
#include "sharding/torch_internals.h"

namespace shardgan {

ShardedModel::ShardedModel(std::string name, Communicator& comm, ShardingConfig cfg)
    : name_(std::move(name)), comm_(comm), cfg_(cfg) {}

ShardedModel::~ShardedModel() {
  drain_read_ahead();
  try {
    drain_grad_writes();
  } catch (...) {  // destruction does not report a tier's error
  }
}

void ShardedModel::write_grad_async(std::function<void()> job) {
  if (!grad_writer_) grad_writer_ = std::make_unique<TierWorker>(&tier_mu_, kMaxGradWritesPending);
  grad_writer_->submit(std::move(job));
}

void ShardedModel::drain_grad_writes() {
  if (!grad_writer_) return;
  const auto t0 = std::chrono::steady_clock::now();
  grad_writer_->drain();
  times_.offload_grad_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

NodeSharedPool* ShardedModel::shared_pool() {
  if (shared_pool_checked_) return shared_pool_.get();
  shared_pool_checked_ = true;
  // Every rank evaluates the same conditions, so the collectives below run on all or none.
  const bool on_cpu = std::all_of(units_.begin(), units_.end(), [](const auto& u) { return u->device().is_cpu(); });
  if (!node_shared_gather_applies(cfg_, comm_.world_size(), comm_.replicate_degree(), on_cpu)) {
    return nullptr;
  }
  int64_t slot_bytes = 0;
  for (auto& u : units_) {
    slot_bytes = std::max(slot_bytes, u->padded_numel() * static_cast<int64_t>(c10::elementSize(u->compute_dtype())));
  }
  if (slot_bytes == 0 || !ranks_share_node(comm_)) return nullptr;
  shared_pool_ = std::make_unique<NodeSharedPool>(comm_, kSharedSlots, slot_bytes, name_);
  return shared_pool_.get();
}

namespace {

// Walks the autograd graph behind `outputs` and throws if a leaf that requires grad is
// neither a sharding unit's parameter nor one of `inputs`: such a parameter is used by the
// model but no unit owns it, so its gradient would never be averaged across ranks.
void check_all_parameters_owned(const std::string& model, const TensorList& inputs,
                                const TensorList& outputs) {
  std::unordered_set<const c10::TensorImpl*> input_impls;
  for (const auto& t : inputs) {
    if (t.defined()) input_impls.insert(t.unsafeGetTensorImpl());
  }
  detail::visit_graph_leaves(outputs, [&](const at::Tensor& v) {
    if (!detail::is_owned_parameter(v) && !input_impls.count(v.unsafeGetTensorImpl())) {
      std::string shape;
      for (auto d : v.sizes()) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
      throw std::invalid_argument("model '" + model + "': a parameter of shape [" + shape +
                                  "] is used in forward but belongs to no sharding unit; it "
                                  "would drift apart across ranks. Register its module in a unit");
    }
  });
}

}  // namespace

ShardedUnit& ShardedModel::add_unit(std::string unit_name,
                                    std::shared_ptr<torch::nn::Module> module,
                                    ShardedUnit::Forward forward) {
  for (auto& u : units_) {
    if (u->name() == unit_name) {
      throw std::invalid_argument("model '" + name_ + "': two units are named '" + unit_name + "'");
    }
  }
  units_.push_back(std::make_unique<ShardedUnit>(std::move(unit_name), std::move(module),
                                                 std::move(forward), comm_, cfg_, this));
  order_pos_.push_back(-1);
  return *units_.back();
}

ShardedUnit& ShardedModel::add_unit(std::string unit_name,
                                    std::shared_ptr<torch::nn::Module> module,
                                    ShardedUnit::SingleForward forward) {
  return add_unit(std::move(unit_name), std::move(module), ShardedUnit::single(std::move(forward)));
}

int64_t ShardedModel::numel() const {
  int64_t n = 0;
  for (auto& u : units_) n += u->numel();
  return n;
}

ShardedUnit& ShardedModel::unit(const std::string& unit_name) {
  for (auto& u : units_) {
    if (u->name() == unit_name) return *u;
  }
  throw std::out_of_range("model '" + name_ + "' has no unit '" + unit_name + "'");
}

c10::Device ShardedModel::device() const {
  return units_.empty() ? c10::Device(c10::kCPU) : units_.front()->device();
}

at::Tensor ShardedModel::forward(at::Tensor x) { return forward(TensorList{std::move(x)}).at(0); }

TensorList ShardedModel::forward(const TensorList& given) {
  // Inputs go to the model's device first, as FSDP's root pre-forward and DDP do: the data,
  // latents and labels are made on the host (so a run draws the same numbers on any device).
  const c10::Device dev = device();
  TensorList moved;
  const bool move = std::any_of(given.begin(), given.end(),
                                [&](const at::Tensor& t) { return t.defined() && t.device() != dev; });
  if (move) {
    moved.reserve(given.size());
    for (const auto& t : given) moved.push_back(t.defined() && t.device() != dev ? t.to(dev) : t);
  }
  const TensorList& inputs = move ? moved : given;
  recording_ = !recorded_ && !higher_order_;  // a plain pass records no execution order
  TensorList out;
  try {
    if (program_) {
      out = program_(*this, inputs);
    } else {
      out = inputs;
      for (auto& u : units_) out = u->forward(out);
    }
  } catch (...) {
    recording_ = false;
    drain_read_ahead();
    throw;
  }
  drain_read_ahead();  // normally empty: every unit read ahead in forward ran in it
  if (recording_) {
    recording_ = false;
    recorded_ = true;
    for (size_t i = 0; i < order_.size(); ++i) {
      if (order_pos_[order_[i]] < 0) order_pos_[order_[i]] = static_cast<ptrdiff_t>(i);
    }
  }
  const bool graph = std::any_of(out.begin(), out.end(),
                                 [](const at::Tensor& t) { return t.defined() && t.requires_grad(); });
  if (!ownership_checked_ && graph) {
    ownership_checked_ = true;
    check_all_parameters_owned(name_, inputs, out);
  }
  return out;
}

void ShardedModel::on_unit_forward(ShardedUnit& u) {
  if (recording_) {
    order_.push_back(u.index());
    // The default program runs units in registration order: prefetch as it will run.
    if (program_) return;
  } else if (!recorded_) {
    return;
  }
  if (!cfg_.prefetch) return;
  ShardedUnit* next = unit_at_offset(u, 1);
  if (!next) return;
  next->prefetch();
  if (ShardedUnit* after = unit_at_offset(u, 2)) read_ahead(*after);
}

ShardedUnit* ShardedModel::unit_at_offset(const ShardedUnit& u, ptrdiff_t offset) {
  if (!recorded_) {
    const ptrdiff_t i = static_cast<ptrdiff_t>(u.index()) + offset;
    return i >= 0 && i < static_cast<ptrdiff_t>(units_.size()) ? units_[i].get() : nullptr;
  }
  const ptrdiff_t pos = order_pos_[u.index()];
  if (pos < 0) return nullptr;
  const ptrdiff_t at = pos + offset;
  return at >= 0 && at < static_cast<ptrdiff_t>(order_.size()) ? units_[order_[at]].get() : nullptr;
}

void ShardedModel::read_ahead(ShardedUnit& u) {
  // A unit whose hpZ secondary block is held gathers from the group without its shard.
  if (!cfg_.read_ahead || u.stage() != 3 || !u.shard_offloaded() || u.gathered() || u.holds_secondary() ||
      (read_ahead_ && read_ahead_->contains(&u))) {
    return;
  }
  if (!read_ahead_) read_ahead_ = std::make_unique<ReadAhead>(&tier_mu_, kMaxReadsAhead);
  // The worker holds the tier lock around the read. Beyond kMaxReadsAhead nothing is queued.
  read_ahead_->start(&u, [&u] { return u.master_shard(); });
}

at::Tensor ShardedModel::read_master_shard(ShardedUnit& u) {
  if (read_ahead_ && read_ahead_->contains(&u)) {
    ++read_ahead_hits_;
    return read_ahead_->take(&u);  // rethrows the worker's OffloadError
  }
  std::lock_guard<std::mutex> lk(tier_mu_);
  return u.master_shard();
}

void ShardedModel::drain_read_ahead() {
  if (read_ahead_) read_ahead_->drain();  // drops values and errors
}

ShardedUnit* ShardedModel::previous_in_order(const ShardedUnit& u) { return unit_at_offset(u, -1); }

void ShardedModel::set_requires_grad(bool on) {
  for (auto& u : units_) u->set_requires_grad(on);
}

void ShardedModel::zero_grad() {
  finish_reduces();
  drain_grad_writes();  // a write still in flight would land after the flags are reset
  for (auto& u : units_) u->zero_grad();
}

void ShardedModel::set_release_grad_shards(bool on) {
  for (auto& u : units_) u->set_release_grad_shard(on);
}

void ShardedModel::set_gradient_sync(bool on) {
  for (auto& u : units_) u->set_gradient_sync(on);
}

void ShardedModel::reduce_across_replicas() {
  if (comm_.replicate_degree() == 1) return;
  finish_reduces();
  const auto t0 = std::chrono::steady_clock::now();
  auto* hybrid = cfg_.quantized_gradients_bits != 0 ? dynamic_cast<HybridCommunicator*>(&comm_) : nullptr;
  for (auto& u : units_) {
    if (u->stage() == 0 || !u->reduced()) continue;
    // With gradient offload, the shard comes from the tier and goes back (one unit at a time).
    u->with_grad_shard([&](at::Tensor& g) {
      if (hybrid) {
        // ZeRO++-style across replicas: quantized reduce-scatter, float32 sum, int8 gather.
        quantized_all_reduce_avg(hybrid->replicate_group(), g,
                                 QuantSpec{cfg_.quantized_gradients_bits, cfg_.quantization_block});
      } else {
        comm_.all_reduce_replicas(g, ReduceOp::kAvg);
      }
    }, true);
  }
  times_.collective_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void ShardedModel::set_secondary_group(Communicator* group) {
  if (group) {
    if (cfg_.stage != 3) {
      throw std::invalid_argument("model '" + name_ + "': hpZ (a secondary group) needs ZeRO stage 3, not " +
                                  std::to_string(cfg_.stage));
    }
    if (group->world_size() < 1 || comm_.world_size() % group->world_size() != 0) {
      throw std::invalid_argument("model '" + name_ + "': the hpZ secondary group has " +
                                  std::to_string(group->world_size()) + " ranks, which does not divide the " +
                                  std::to_string(comm_.world_size()) + " ranks sharding the model");
    }
  }
  for (auto& u : units_) {
    if (u->stage() == 3) u->after_optimizer_step();  // local at stage 3: drops the old group's blocks
  }
  secondary_ = group;
}

void ShardedModel::after_optimizer_step() {
  for (auto& u : units_) u->after_optimizer_step();
}

void ShardedModel::train(bool on) {
  for (auto& u : units_) u->module().train(on);
}

void ShardedModel::begin_higher_order() {
  higher_order_ = true;
  for (auto& u : units_) {
    u->gather();
    u->set_plain(true);
  }
  on_unit_gathered();
}

void ShardedModel::end_higher_order() {
  // Reverse unit order, as a backward reduces: the same on every rank.
  for (auto it = units_.rbegin(); it != units_.rend(); ++it) {
    (*it)->set_plain(false);
    (*it)->reduce_gradients();
  }
  next_reduce_ = 0;
  finish_reduces();
  for (auto& u : units_) u->free_full();
  higher_order_ = false;
}

void ShardedModel::abandon_step() {
  drain_read_ahead();
  try {
    drain_grad_writes();  // the step is abandoned: its gradients are dropped anyway
  } catch (...) {
  }
  for (auto& u : units_) u->set_plain(false);
  higher_order_ = false;
  recording_ = false;
  for (auto& u : units_) u->abandon();
  reducing_.clear();
  next_reduce_ = 0;
  callback_queued_ = false;
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
    m.grad_released_bytes += u->released_grad_bytes();
    m.comm_buffer_bytes = std::max(m.comm_buffer_bytes, u->peak_comm_buffer_bytes());
    m.full_param_bytes_alive += u->full_bytes_alive();
    m.padding_elements += u->padded_numel() - u->numel();
    m.secondary_param_bytes += u->secondary_bytes();
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

std::vector<size_t> ShardedModel::reduction_order() const {
  std::vector<size_t> seq;
  seq.reserve(units_.size());
  if (recorded_) {
    for (size_t i = order_.size(); i-- > 0;) {
      if (order_pos_[order_[i]] == static_cast<ptrdiff_t>(i)) seq.push_back(order_[i]);  // first run only
    }
  }
  for (size_t i = units_.size(); i-- > 0;) {
    if (!recorded_ || order_pos_[i] < 0) seq.push_back(i);
  }
  return seq;
}

void ShardedModel::start_reduces(bool flush) {
  const std::vector<size_t> seq = reduction_order();
  while (next_reduce_ < seq.size()) {
    ShardedUnit& u = *units_[seq[next_reduce_]];
    if (u.expects_reduce()) {
      if (!flush && !u.gradients_staged()) return;  // later units wait for this one
      u.start_reduce();
    }
    ++next_reduce_;
  }
  if (flush) next_reduce_ = 0;
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
  detail::queue_backward_callback([this] {
    for (auto it = units_.rbegin(); it != units_.rend(); ++it) (*it)->finish_backward();
    start_reduces(/*flush=*/true);
    finish_reduces();
    drain_read_ahead();
    callback_queued_ = false;
  });
}

}  // namespace shardgan

namespace shardgan {

FullParameters::FullParameters(ShardedModel& model) : model_(model) {
  for (auto& u : model_.units()) {
    if (u->stage() == 3 && !u->gathered()) {
      u->gather();
      gathered_.push_back(u.get());
    }
  }
}

FullParameters::~FullParameters() {
  for (ShardedUnit* u : gathered_) u->free_full();
}

}  // namespace shardgan
