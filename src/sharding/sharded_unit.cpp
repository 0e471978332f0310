// ShardedUnit: construction around its flat parameter (flat_param.cpp) and the collectives
// (FSDP2's FSDPParamGroup): all-gather with prefetch, gradient staging, reduce-scatter or
// all-reduce, and the all-gather after an optimizer step. The runtime hooks that decide
// when these run are in unit_hooks.cpp.
#include "shardgan/sharding/sharded_unit.h"

#include <algorithm>
#include <stdexcept>

#include <torch/torch.h>

#include "shardgan/comm/node_shared.h"
#include "shardgan/sharding/shard_source.h"
#include "shardgan/sharding/sharded_model.h"
#include "sharding/torch_internals.h"
#include "sharding/unit_runtime.h"

namespace shardgan {

using detail::nbytes;
using detail::Timed;

namespace {
// The node-shared all-gather in flight: this rank's block is published; wait() returns once
// every rank's block of the same gather is.
class SharedGatherWork final : public Work {
 public:
  SharedGatherWork(const NodeSharedPool& pool, int64_t seq, Communicator& comm)
      : pool_(pool), seq_(seq), comm_(comm) {}
  void wait() override {
    pool_.wait_published(seq_, comm_.timeout_s(), [this] { comm_.poll(); });
  }

 private:
  const NodeSharedPool& pool_;
  int64_t seq_;
  Communicator& comm_;
};
}  // namespace

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
                                      cfg_.compute_dtype);
  reduce_dtype_ = cfg_.reduce_dtype.value_or(flat_->master_dtype());
  const int64_t S = flat_->shard_numel(), P = flat_->padded_numel();
  if (cfg_.stage <= 1) {
    grad_flat_ = torch::zeros({P}, torch::TensorOptions().dtype(reduce_dtype_).device(flat_->device()));
    grad_shard_aliases_flat_ = reduce_dtype_ == flat_->master_dtype();
  }
  // Not resident until the first gradient arrives (stage 2-3: built models hold shards only).
  grad_shard_ = grad_shard_aliases_flat_ ? grad_flat_.narrow(0, flat_->shard_offset(), S)
                : flat_->device().is_cpu()
                    ? detail::lazy_zeros(S, flat_->master_dtype())
                    : torch::zeros({S}, torch::TensorOptions().dtype(flat_->master_dtype()).device(flat_->device()));
  gathered_ = cfg_.stage <= 2;
  for (auto& s : flat_->slots()) {
    if (!s.param.requires_grad()) continue;
    // Fires once the parameter's .grad for this backward pass is final: where DeepSpeed
    // and FSDP1 detect gradient readiness.
    accumulators_.push_back(detail::add_grad_ready_hook(s.param, [this] { on_param_grad_ready(); }));
  }
  detail::register_live_unit(this);
}

ShardedUnit::~ShardedUnit() {
  detail::unregister_live_unit(this);
  // The accumulators may outlive us inside a graph that is still alive; drop our hooks.
  accumulators_.clear();
  // The module may outlive us too: its parameters must not point into unmapped pages.
  if (shared_seq_ != 0 && gathered_) flat_->release_full();
}

const at::Tensor& ShardedUnit::param(size_t slot) const {
  const ParamSlot& s = flat_->slots().at(slot);
  if (cfg_.stage == 3 && (!gathered_ || prefetch_work_)) {
    throw std::logic_error("unit '" + name_ + "': parameter '" + s.name + "' is sharded (ZeRO stage 3) and not "
                           "gathered now; read it inside a FullParameters scope (summon_full_params)");
  }
  return s.param;
}

int64_t ShardedUnit::full_bytes_alive() const { return gathered_ ? flat_->full_bytes_alive() : 0; }

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

void ShardedUnit::set_master_shard(const at::Tensor& values) { flat_->set_master_shard(values); }

double* ShardedUnit::collective_sink() { return owner_ ? &owner_->comm_times().collective_s : nullptr; }

at::Tensor ShardedUnit::fill_own_block() {
  at::Tensor master;
  {
    Timed t(flat_->offloaded() && owner_ ? &owner_->comm_times().offload_read_s : nullptr);
    // With an owner, an offloaded shard comes through it: from the read-ahead started one
    // unit earlier, or read now with the tier serialized against the worker.
    master = flat_->offloaded() && owner_ ? owner_->read_master_shard(*this) : flat_->master_shard();
  }
  // Converted straight into this rank's block of the flat parameter: the all-gather then
  // runs in place, with no send buffer to allocate and no copy of it inside the backend.
  at::Tensor own = flat_->full().narrow(0, flat_->shard_offset(), flat_->shard_numel());
  own.copy_(master);
  return own;
}

int64_t ShardedUnit::persistent_grad_bytes() const {
  return nbytes(grad_flat_) + (grad_shard_aliases_flat_ ? 0 : nbytes(grad_shard_));
}

std::unique_ptr<Work> ShardedUnit::start_shared_gather() {
  NodeSharedPool* pool = cfg_.node_shared_gather && owner_ ? owner_->shared_pool() : nullptr;
  if (!pool || flat_->padded_numel() == 0) return nullptr;
  const int64_t seq = owner_->next_shared_seq();
  // Symmetric on every rank: gathers and releases run in the same program order.
  if (pool->held_here(seq)) {
    owner_->count_shared_fallback();
    return nullptr;
  }
  owner_->take_shared_seq();
  {
    Timed t(collective_sink());
    pool->wait_free(seq, comm_.timeout_s(), [this] { comm_.poll(); });
  }
  flat_->attach_full(pool->data(pool->slot_of(seq)));
  fill_own_block();
  pool->publish(seq);
  shared_seq_ = seq;
  return std::make_unique<SharedGatherWork>(*pool, seq, comm_);
}

void ShardedUnit::prefetch() {
  if (cfg_.stage != 3 || gathered_) return;
  if ((prefetch_work_ = start_shared_gather())) {
    gathered_ = true;
    owner_->on_unit_gathered();
    return;
  }
  flat_->allocate_full();
  prefetch_src_ = fill_own_block();  // with parameter offload, read from the tier here
  Timed t(collective_sink());
  prefetch_work_ = comm_.all_gather_async(flat_->full(), prefetch_src_);
  gathered_ = true;
  if (owner_) owner_->on_unit_gathered();
}

void ShardedUnit::gather() {
  if (prefetch_work_) {
    Timed t(collective_sink());
    prefetch_work_->wait();
    prefetch_work_.reset();
    prefetch_src_ = at::Tensor();
  }
  if (gathered_) return;
  if (std::unique_ptr<Work> w = start_shared_gather()) {
    {
      Timed t(collective_sink());
      w->wait();
    }
    gathered_ = true;
    owner_->on_unit_gathered();
    return;
  }
  flat_->allocate_full();
  at::Tensor src = fill_own_block();
  {
    Timed t(collective_sink());
    comm_.all_gather(flat_->full(), src);
  }
  gathered_ = true;
  if (owner_) owner_->on_unit_gathered();
}

void ShardedUnit::free_full() {
  if (cfg_.stage != 3 || !gathered_) return;
  gather();  // an all-gather in flight still writes into the flat parameter: let it finish first
  flat_->release_full();
  if (shared_seq_ != 0) {
    owner_->shared_pool()->release(shared_seq_);
    shared_seq_ = 0;
  }
  gathered_ = false;
}


bool ShardedUnit::trainable() const {
  for (auto& s : flat_->slots()) {
    if (s.param.requires_grad() || s.param.grad().defined()) return true;
  }
  return false;
}

void ShardedUnit::reduce_gradients() {
  if (!trainable()) return;  // frozen on every rank alike (set_requires_grad is symmetric)
  stage_gradients();
  start_reduce();
}

void ShardedUnit::stage_gradients() {
  if (!trainable()) return;
  const bool persistent = cfg_.stage <= 1;
  // A fresh buffer (stages 2-3) takes the first gradients by copy, not by adding them to
  // zeros: one pass instead of a fill and an add. Only slots without a gradient and the
  // padding are zeroed.
  const bool fresh = !staged_ && !persistent;
  if (!staged_) {
    staged_flat_ = persistent ? grad_flat_
                              : torch::empty({flat_->padded_numel()},
                                             torch::TensorOptions().dtype(reduce_dtype_).device(flat_->device()));
    if (!persistent) peak_comm_bytes_ = std::max(peak_comm_bytes_, nbytes(staged_flat_));
    staged_ = true;
    expects_reduce_ = true;  // a staged gradient is always reduced
  }
  for (auto& s : flat_->slots()) {
    at::Tensor& g = s.param.mutable_grad();
    at::Tensor dst = staged_flat_.narrow(0, s.offset, s.numel);
    if (!g.defined()) {  // unused on this rank: its part stays zero, as in FSDP
      if (fresh) dst.zero_();
      continue;
    }
    if (fresh) {
      dst.copy_(g.reshape({-1}));
    } else {
      dst.add_(g.reshape({-1}));
    }
    g.reset();
  }
  if (fresh) staged_flat_.narrow(0, flat_->numel(), flat_->padded_numel() - flat_->numel()).zero_();
}

void ShardedUnit::start_reduce() {
  if (!staged_) stage_gradients();  // nothing arrived on this rank: reduce zeros
  if (!staged_) return;             // no trainable parameter
  at::Tensor flat = std::move(staged_flat_);
  staged_flat_ = at::Tensor();
  staged_ = false;
  expects_reduce_ = false;
  const bool persistent = cfg_.stage <= 1;
  if (persistent && !sync_) return;  // accumulate locally until the boundary (DDP no_sync)
  if (cfg_.stage == 0) {
    {
      Timed t(collective_sink());
      comm_.all_reduce(flat, ReduceOp::kAvg);
    }
    if (!grad_shard_aliases_flat_) grad_shard_.add_(flat.to(flat_->master_dtype()));
    return;
  }
  // Start the reduce-scatter and return: it overlaps the rest of backward. The owner
  // bounds how many are in flight and finishes them all before backward returns.
  if (owner_) owner_->before_reduce_start(*this);
  reduce_in_ = flat;
  reduce_out_ = torch::empty({flat_->shard_numel()}, flat.options());
  peak_comm_bytes_ = std::max(peak_comm_bytes_, nbytes(reduce_out_) + (persistent ? 0 : nbytes(flat)));
  {
    Timed t(collective_sink());
    reduce_work_ = comm_.reduce_scatter_async(reduce_out_, reduce_in_, avg_on_accumulate() ? ReduceOp::kSum : ReduceOp::kAvg);
  }
  if (owner_) owner_->on_reduce_started(*this);
}

bool ShardedUnit::avg_on_accumulate() const {
  // A 16-bit reduction into a wider gradient shard: reduce the sum and scale by 1/N while
  // adding it into the shard, so the average takes no pass of its own. For a power-of-two
  // N the scaling is exact in both dtypes, so the shard gets the same bits as from an
  // averaged reduction (halving a 16-bit sum rounds nothing, short of subnormals).
  const int n = comm_.world_size();
  return !grad_shard_aliases_flat_ && (n & (n - 1)) == 0 &&
         (reduce_dtype_ == at::kBFloat16 || reduce_dtype_ == at::kHalf) &&
         c10::elementSize(flat_->master_dtype()) > c10::elementSize(reduce_dtype_);
}

void ShardedUnit::finish_reduce() {
  if (!reduce_work_) return;
  {
    Timed t(collective_sink());
    reduce_work_->wait();
  }
  reduce_work_.reset();
  reduced_ = true;
  if (grad_shard_aliases_flat_) {
    grad_shard_.copy_(reduce_out_);  // stage 1: the owned slice of the accumulated flat gradient
  } else {
    const double scale = avg_on_accumulate() ? 1.0 / comm_.world_size() : 1.0;
    grad_shard_.add_(reduce_out_.to(flat_->master_dtype()), scale);
  }
  reduce_in_ = at::Tensor();
  reduce_out_ = at::Tensor();
}

void ShardedUnit::after_optimizer_step() {
  torch::NoGradGuard no_grad;
  if (cfg_.stage == 3) return;  // the next gather reads the updated shard
  at::Tensor& shard = flat_->shard();
  if (cfg_.stage == 0) {
    if (!flat_->shard_aliases_full()) flat_->full().copy_(shard);
    return;
  }
  Timed t(collective_sink());
  comm_.all_gather(flat_->full(), flat_->shard_aliases_full() ? shard : shard.to(flat_->compute_dtype()));
}

void ShardedUnit::zero_grad() {
  finish_reduce();
  reduced_ = false;
  if (grad_flat_.defined()) grad_flat_.zero_();
  grad_shard_.zero_();
}

void ShardedUnit::abandon() {
  free_full();  // waits for a prefetch in flight
  backward_armed_ = false;
  expects_backward_ = false;
  expects_reduce_ = false;
  pending_grads_ = 0;
  input_grads_expected_ = 0;
  staged_ = false;
  staged_flat_ = at::Tensor();
  for (auto& s : flat_->slots()) s.param.mutable_grad().reset();
  zero_grad();  // completes a reduce-scatter in flight first
}

void ShardedUnit::set_requires_grad(bool on) {
  for (auto& s : flat_->slots()) s.param.requires_grad_(on);
}

at::Tensor ShardedUnit::gather_full_copy() {
  const int64_t T = flat_->numel();
  if (cfg_.stage == 0) return (flat_->shard_aliases_full() ? flat_->full() : flat_->shard()).narrow(0, 0, T).clone();
  at::Tensor full = torch::empty({flat_->padded_numel()},
                                 torch::TensorOptions().dtype(flat_->master_dtype()).device(flat_->device()));
  comm_.all_gather(full, flat_->master_shard());
  return full.narrow(0, 0, T).clone();
}


}  // namespace shardgan
