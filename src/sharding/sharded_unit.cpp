#include "shardgan/sharding/sharded_unit.h"

#include <stdexcept>

#include <torch/csrc/autograd/function_hook.h>
#include <torch/torch.h>

#include "shardgan/sharding/sharded_model.h"
#include "sharding/storage.h"

namespace shardgan {
namespace {

// Fires after a parameter's AccumulateGrad node ran, i.e. its .grad for this backward
// pass is final (the engine sums every contribution before running the node). This is
// where DeepSpeed and FSDP1 detect gradient readiness.
struct GradReadyHook final : torch::autograd::FunctionPostHook {
  explicit GradReadyHook(ShardedUnit* unit) : unit(unit) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    unit->on_param_grad_ready();
    return outputs;
  }
  ShardedUnit* unit;
};

}  // namespace

ShardedUnit::ShardedUnit(std::string name, std::shared_ptr<torch::nn::Module> module,
                         Forward forward, Communicator& comm, ShardingConfig cfg,
                         ShardedModel* owner)
    : name_(std::move(name)), module_(std::move(module)), forward_(std::move(forward)),
      comm_(comm), cfg_(cfg), owner_(owner) {
  if (cfg_.stage != 0 && cfg_.stage != 3) {
    throw std::invalid_argument("unit '" + name_ + "': ZeRO stage " + std::to_string(cfg_.stage) +
                                " is not supported yet (use 0 or 3)");
  }
  torch::NoGradGuard no_grad;
  auto named = module_->named_parameters(/*recurse=*/true);
  c10::optional<at::ScalarType> dtype;
  for (auto& kv : named) {
    const at::Tensor& p = kv.value();
    if (dtype && *dtype != p.scalar_type()) {
      throw std::invalid_argument("unit '" + name_ + "': parameter '" + kv.key() +
                                  "' has a different dtype from the unit's other parameters");
    }
    dtype = p.scalar_type();
    slots_.push_back({kv.key(), p.sizes().vec(), numel_, p.numel(), p});
    numel_ += p.numel();
  }
  if (!dtype) dtype = at::kFloat;
  const int64_t n = comm_.world_size();
  if (cfg_.stage == 0) {
    padded_numel_ = shard_numel_ = numel_;
    shard_offset_ = 0;
  } else {
    shard_numel_ = (numel_ + n - 1) / n;
    padded_numel_ = shard_numel_ * n;
    shard_offset_ = shard_numel_ * comm_.rank();
  }
  full_ = torch::zeros({padded_numel_}, torch::TensorOptions().dtype(*dtype));
  for (auto& s : slots_) {
    at::Tensor view = full_.narrow(0, s.offset, s.numel).view(s.shape);
    view.copy_(s.param);
    s.param.set_data(view);  // the parameter now lives inside the flat buffer
  }
  if (cfg_.stage == 0) {
    shard_ = full_;
  } else {
    shard_ = full_.narrow(0, shard_offset_, shard_numel_).clone();
    detail::free_storage(full_);
  }
  gathered_ = cfg_.stage == 0;
  grad_shard_ = torch::zeros_like(shard_);
  for (auto& s : slots_) {
    if (!s.param.requires_grad()) continue;
    auto acc = torch::autograd::impl::grad_accumulator(s.param);
    acc->add_post_hook(std::make_unique<GradReadyHook>(this));
    accumulators_.push_back(std::move(acc));
  }
}

ShardedUnit::~ShardedUnit() {
  // The accumulators may outlive us inside a graph that is still alive; drop our hooks.
  for (auto& acc : accumulators_) acc->post_hooks().clear();
}

int64_t ShardedUnit::full_bytes_alive() const {
  if (cfg_.stage == 0 || !gathered_) return 0;
  return static_cast<int64_t>(detail::storage_nbytes(full_));
}

void ShardedUnit::gather() {
  if (gathered_) return;
  detail::refill_storage(full_, static_cast<size_t>(padded_numel_) * full_.element_size());
  comm_.all_gather(full_, shard_);
  gathered_ = true;
  if (owner_) owner_->on_unit_gathered();
}

void ShardedUnit::free_full() {
  if (cfg_.stage == 0 || !gathered_) return;
  detail::free_storage(full_);
  gathered_ = false;
}

at::Tensor ShardedUnit::forward(const at::Tensor& x) {
  gather();
  at::Tensor y = forward_(x);
  if (y.requires_grad()) {
    y.register_hook([this](const at::Tensor&) { on_pre_backward(); });
  }
  if (cfg_.reshard_after_forward) free_full();
  return y;
}

void ShardedUnit::on_pre_backward() {
  if (backward_armed_) return;  // a second output of the same unit (e.g. D on real and fake)
  backward_armed_ = true;
  gather();
  pending_grads_ = 0;
  for (auto& s : slots_) pending_grads_ += s.param.requires_grad() ? 1 : 0;
  if (owner_) owner_->ensure_backward_callback();
}

void ShardedUnit::on_param_grad_ready() {
  if (!backward_armed_) return;
  if (--pending_grads_ > 0) return;
  reduce_gradients();
  free_full();
  backward_armed_ = false;
}

void ShardedUnit::finish_backward() {
  if (!backward_armed_) return;
  reduce_gradients();
  free_full();
  backward_armed_ = false;
}

void ShardedUnit::reduce_gradients() {
  bool any = false;
  for (auto& s : slots_) any = any || s.param.grad().defined();
  if (!any) return;
  at::Tensor flat = torch::zeros({padded_numel_}, full_.options());
  for (auto& s : slots_) {
    at::Tensor& g = s.param.mutable_grad();
    if (!g.defined()) continue;
    flat.narrow(0, s.offset, s.numel).copy_(g.reshape({-1}));
    g.reset();
  }
  if (cfg_.stage == 0) {
    comm_.all_reduce(flat, ReduceOp::kAvg);
    grad_shard_.add_(flat);
  } else {
    at::Tensor part = torch::empty({shard_numel_}, full_.options());
    comm_.reduce_scatter(part, flat, ReduceOp::kAvg);
    grad_shard_.add_(part);
  }
}

void ShardedUnit::set_requires_grad(bool on) {
  for (auto& s : slots_) s.param.requires_grad_(on);
}

at::Tensor ShardedUnit::gather_full_copy() {
  if (cfg_.stage == 0) return full_.narrow(0, 0, numel_).clone();
  at::Tensor full = torch::empty({padded_numel_}, full_.options());
  comm_.all_gather(full, shard_);
  return full.narrow(0, 0, numel_).clone();
}

}  // namespace shardgan
