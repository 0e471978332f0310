// ShardedUnit: builds its flat parameter (flat_param.cpp), collectives
// (unit_collectives.cpp) and runtime hooks (unit_hooks.cpp), and answers for them: the
// methods here check their arguments or pass the call to the part that does the work.
#include "shardgan/sharding/sharded_unit.h"

#include <stdexcept>

#include <torch/torch.h>

#include "shardgan/sharding/sharded_model.h"
#include "sharding/unit_collectives.h"
#include "sharding/unit_hooks.h"
#include "sharding/unit_runtime.h"

namespace shardgan {

ShardedUnit::ShardedUnit(std::string name, std::shared_ptr<torch::nn::Module> module,
                         Forward forward, Communicator& comm, ShardingConfig cfg,
                         ShardedModel* owner)
    : name_(std::move(name)), module_(std::move(module)), forward_(std::move(forward)),
      comm_(comm), cfg_(cfg), owner_(owner) {
  index_ = owner_ ? owner_->units().size() : 0;
  if (cfg_.stage < 0 || cfg_.stage > 3) {
    throw std::invalid_argument("unit '" + name_ + "': ZeRO stage " + std::to_string(cfg_.stage) +
                                " does not exist (use 0, 1, 2 or 3)");
  }
  torch::NoGradGuard no_grad;
  const std::string qualified = (owner_ ? owner_->name() + "." : std::string()) + name_ + ".";
  flat_ = std::make_unique<FlatParam>(name_, qualified, *module_, comm_.rank(), comm_.world_size(), cfg_.stage,
                                      cfg_.compute_dtype, cfg_.flat_align);
  coll_ = std::make_unique<detail::UnitCollectives>(*this, *flat_, comm_, cfg_, owner_);
  hooks_ = std::make_unique<detail::UnitHooks>(*this, name_, *module_, forward_, *flat_, *coll_, cfg_, owner_);
  detail::register_live_unit(this);
}

ShardedUnit::~ShardedUnit() { detail::unregister_live_unit(this); }

ShardedUnit::Forward ShardedUnit::single(SingleForward f) {
  return [f = std::move(f)](const TensorList& in) { return TensorList{f(in.at(0))}; };
}

TensorList ShardedUnit::forward(const TensorList& inputs) { return hooks_->forward(inputs); }

at::Tensor ShardedUnit::forward(const at::Tensor& x) { return forward(TensorList{x}).at(0); }

void ShardedUnit::gather() { coll_->gather(); }
void ShardedUnit::prefetch() { coll_->prefetch(); }
void ShardedUnit::free_full() { coll_->free_full(); }
bool ShardedUnit::gathered() const { return coll_->gathered(); }
void ShardedUnit::after_optimizer_step() { coll_->after_optimizer_step(); }
at::Tensor ShardedUnit::gather_full_copy() { return coll_->gather_full_copy(); }

bool ShardedUnit::trainable() const { return flat_->trainable(); }

void ShardedUnit::reduce_gradients() {
  if (!trainable()) return;  // frozen on every rank alike (set_requires_grad is symmetric)
  coll_->stage_gradients();
  coll_->start_reduce();
}

void ShardedUnit::stage_gradients() { coll_->stage_gradients(); }
void ShardedUnit::start_reduce() { coll_->start_reduce(); }
void ShardedUnit::finish_reduce() { coll_->finish_reduce(); }
void ShardedUnit::zero_grad() { coll_->zero_grad(); }
void ShardedUnit::set_release_grad_shard(bool on) { coll_->set_release_grad_shard(on); }
bool ShardedUnit::expects_reduce() const { return coll_->expects_reduce(); }
bool ShardedUnit::gradients_staged() const { return coll_->gradients_staged(); }
bool ShardedUnit::reduce_in_flight() const { return coll_->reduce_in_flight(); }
bool ShardedUnit::reduced() const { return coll_->reduced(); }
void ShardedUnit::set_gradient_sync(bool on) { coll_->set_gradient_sync(on); }
at::Tensor& ShardedUnit::grad_shard() {
  if (coll_->grad_sink()) {
    throw std::logic_error("unit '" + name_ + "': the gradient shard is offloaded (offload.<model>.gradient); use "
                           "with_grad_shard()");
  }
  return coll_->grad_shard();
}
bool ShardedUnit::grad_offloaded() const { return coll_->grad_sink() != nullptr; }
bool ShardedUnit::grad_in_tier() const { return coll_->grad_sink() ? coll_->grad_in_tier() : coll_->reduced(); }
void ShardedUnit::with_grad_shard(const std::function<void(at::Tensor&)>& fn, bool write) {
  if (!coll_->grad_sink()) {
    fn(coll_->grad_shard());
    return;
  }
  coll_->with_offloaded_grad(fn, write);
}

void ShardedUnit::offload_grad(GradSink* sink) {
  if (cfg_.stage < 2) {
    throw std::logic_error("unit '" + name_ + "': gradient offload needs ZeRO stage 2 or 3, not " +
                           std::to_string(cfg_.stage));
  }
  if (!sink) throw std::invalid_argument("unit '" + name_ + "': offload_grad needs a sink");
  if (coll_->grad_sink()) throw std::logic_error("unit '" + name_ + "': the gradient shard is offloaded already");
  if (coll_->reduce_in_flight() || coll_->reduced() || coll_->gradients_staged()) {
    throw std::logic_error("unit '" + name_ + "': offload_grad between zero_grad() and a backward, not after one");
  }
  coll_->set_grad_sink(sink);
}
int64_t ShardedUnit::persistent_grad_bytes() const { return coll_->persistent_grad_bytes(); }
int64_t ShardedUnit::released_grad_bytes() const { return coll_->released_grad_bytes(); }
int64_t ShardedUnit::peak_comm_buffer_bytes() const { return coll_->peak_comm_buffer_bytes(); }
bool ShardedUnit::holds_secondary() const { return coll_->holds_secondary(); }
int64_t ShardedUnit::secondary_bytes() const { return coll_->secondary_bytes(); }

void ShardedUnit::abandon() {
  hooks_->reset();
  coll_->abandon();
}

void ShardedUnit::set_requires_grad(bool on) {
  for (auto& s : flat_->slots()) s.param.requires_grad_(on);
}

void ShardedUnit::set_plain(bool on) { hooks_->set_plain(on); }

void ShardedUnit::on_pre_backward() { hooks_->on_pre_backward(); }
void ShardedUnit::on_param_grad_ready() { hooks_->on_backward_part_done(); }
void ShardedUnit::on_input_grad_ready() { hooks_->on_backward_part_done(); }
void ShardedUnit::finish_backward() { hooks_->finish_backward(); }
bool ShardedUnit::expects_backward() const { return hooks_->expects_backward(); }

const at::Tensor& ShardedUnit::param(size_t slot) const {
  const ParamSlot& s = flat_->slots().at(slot);
  if (cfg_.stage == 3 && (!coll_->gathered() || coll_->gather_in_flight())) {
    throw std::logic_error("unit '" + name_ + "': parameter '" + s.name + "' is sharded (ZeRO stage 3) and not "
                           "gathered now; read it inside a FullParameters scope (summon_full_params)");
  }
  return s.param;
}

int64_t ShardedUnit::full_bytes_alive() const { return coll_->gathered() ? flat_->full_bytes_alive() : 0; }

int64_t ShardedUnit::persistent_param_bytes() const { return flat_->persistent_bytes(); }

void ShardedUnit::throw_offloaded() const {
  throw std::logic_error("unit '" + name_ + "': the master shard is offloaded (offload.<model>.param); use "
                         "master_shard() / set_master_shard()");
}

void ShardedUnit::offload_shard(ShardSource* source) {
  if (cfg_.stage != 3) {
    throw std::logic_error("unit '" + name_ + "': parameter offload needs ZeRO stage 3, not " + std::to_string(cfg_.stage));
  }
  if (flat_->offloaded()) throw std::logic_error("unit '" + name_ + "': the master shard is offloaded already");
  if (!source) throw std::invalid_argument("unit '" + name_ + "': offload_shard needs a source");
  free_full();  // an all-gather in flight still reads the shard
  flat_->offload(source, index_);
}

at::Tensor ShardedUnit::master_shard() { return flat_->master_shard(); }

void ShardedUnit::set_master_shard(const at::Tensor& values) {
  coll_->drop_secondary();
  flat_->set_master_shard(values);
}

}  // namespace shardgan
