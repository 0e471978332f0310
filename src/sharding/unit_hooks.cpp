// A sharding unit's runtime hooks (unit_hooks.h; FSDP2's FSDPState): the forward wrapper,
// the pre-backward gather and prefetch, and the release once a unit's backward is done. The
// collectives they call are in unit_collectives.cpp; the flat parameter in flat_param.cpp.
#include "sharding/unit_hooks.h"

#include <algorithm>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

#include <torch/torch.h>

#include "shardgan/sharding/flat_param.h"
#include "shardgan/sharding/sharded_model.h"
#include "shardgan/sharding/sharded_unit.h"
#include "sharding/torch_internals.h"
#include "sharding/unit_collectives.h"

namespace shardgan {
namespace {

// Live units, each with a generation number: autograd nodes and tensor hooks that a unit
// puts into a graph hold (address, generation), never a bare `this`. A graph can outlive
// its unit (a user keeps a loss and destroys the model): its backward then finds the pair
// gone and throws std::logic_error instead of calling into freed memory (an address may be
// reused by a new unit, hence the generation).
std::mutex g_live_mu;
std::unordered_map<const ShardedUnit*, uint64_t> g_live;
uint64_t g_next_generation = 1;

void register_live(const ShardedUnit* u) {
  std::lock_guard<std::mutex> lk(g_live_mu);
  g_live[u] = g_next_generation++;
}

void unregister_live(const ShardedUnit* u) {
  std::lock_guard<std::mutex> lk(g_live_mu);
  g_live.erase(u);
}

uint64_t generation_of(const ShardedUnit* u) {
  std::lock_guard<std::mutex> lk(g_live_mu);
  auto it = g_live.find(u);
  return it == g_live.end() ? 0 : it->second;
}

// The unit behind (address, generation), or a std::logic_error naming `name`.
ShardedUnit* live_unit(int64_t addr, int64_t gen, const std::string& name) {
  auto* u = reinterpret_cast<ShardedUnit*>(addr);
  {
    std::lock_guard<std::mutex> lk(g_live_mu);
    auto it = g_live.find(u);
    if (it != g_live.end() && it->second == static_cast<uint64_t>(gen)) return u;
  }
  throw std::logic_error("sharding unit '" + name + "' was destroyed before the backward of a graph it built; "
                         "run backward (or drop the graph) before destroying the model");
}

// Identity on one unit input that requires grad. Its backward runs once the gradient of
// that input (for this use of it) is complete, i.e. once the unit's own backward is done
// with it; the unit counts these to know when its gathered parameters are no longer needed.
struct InputGradReady : torch::autograd::Function<InputGradReady> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, at::Tensor x, int64_t unit, int64_t gen,
                            std::string name) {
    ctx->saved_data["unit"] = unit;
    ctx->saved_data["gen"] = gen;
    ctx->saved_data["name"] = name;
    return x;  // returned as a view of x with this node as its grad_fn
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    live_unit(ctx->saved_data["unit"].toInt(), ctx->saved_data["gen"].toInt(),
              ctx->saved_data["name"].toStringRef())->on_input_grad_ready();
    return {grads[0], at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

namespace detail {
void register_live_unit(const ShardedUnit* u) { register_live(u); }
void unregister_live_unit(const ShardedUnit* u) { unregister_live(u); }

UnitHooks::UnitHooks(ShardedUnit& unit, const std::string& name, torch::nn::Module& module,
                     const CheckpointedForward& forward, FlatParam& flat, UnitCollectives& coll,
                     const ShardingConfig& cfg, ShardedModel* owner)
    : unit_(unit), name_(name), module_(module), forward_(forward), flat_(flat), coll_(coll), cfg_(cfg),
      owner_(owner) {
  for (auto& s : flat_.slots()) {
    if (!s.param.requires_grad()) continue;
    // Fires once the parameter's .grad for this backward pass is final: where DeepSpeed
    // and FSDP1 detect gradient readiness.
    accumulators_.push_back(add_grad_ready_hook(s.param, [this] { on_backward_part_done(); }));
  }
}

// The accumulators may outlive us inside a graph that is still alive: drop our hooks.
UnitHooks::~UnitHooks() { accumulators_.clear(); }

TensorList UnitHooks::forward(const TensorList& inputs) {
  if (plain_ && !coll_.gathered()) {
    throw std::logic_error("unit '" + name_ + "': plain (higher-order) forward needs the unit gathered; "
                           "call ShardedModel::begin_higher_order() first");
  }
  if (!plain_) {
    if (owner_) owner_->before_unit_forward();  // may throw (an abandoned step): nothing gathered yet
    coll_.gather();
    if (owner_) owner_->on_unit_forward(unit_);  // records the order, or prefetches the next
  }
  // The unit's registry generation, for the autograd hooks below (one lookup per forward).
  const int64_t gen = plain_ ? 0 : static_cast<int64_t>(generation_of(&unit_));
  const auto addr = reinterpret_cast<int64_t>(&unit_);
  TensorList in;
  in.reserve(inputs.size());
  for (const at::Tensor& x : inputs) {
    // Mixed precision: floating inputs are cast to the compute dtype at the unit boundary.
    at::Tensor t = x.defined() && x.is_floating_point() && x.scalar_type() != flat_.compute_dtype()
                       ? x.to(flat_.compute_dtype()) : x;
    if (!plain_ && t.defined() && t.requires_grad() && at::GradMode::is_enabled()) {
      t = InputGradReady::apply(t, addr, gen, name_);
      ++input_grads_expected_;
    }
    in.push_back(std::move(t));
  }
  TensorList out;
  if (!plain_ && cfg_.activation_checkpointing && at::GradMode::is_enabled()) {
    std::vector<at::Tensor> params;
    for (auto& s : flat_.slots()) {
      if (s.param.requires_grad()) params.push_back(s.param);
    }
    const bool graph = !params.empty() ||
                       std::any_of(in.begin(), in.end(), [](const at::Tensor& t) { return t.defined() && t.requires_grad(); });
    out = graph ? checkpointed_forward(forward_, module_, in, std::move(params),
                                       [addr, gen, name = name_] { live_unit(addr, gen, name)->gather(); },
                                       cfg_.checkpoint_segments)
                : forward_(in);
  } else {
    out = forward_(in);
  }
  if (plain_) return out;
  // Every rank runs the same unit forwards, so this, unlike which parameters got a
  // gradient, is the same on every rank: the unit takes part in the next reduction.
  if (at::GradMode::is_enabled() && flat_.trainable()) coll_.expect_reduce();
  bool any = false;
  for (at::Tensor& y : out) {
    if (!y.defined() || !y.requires_grad()) continue;
    any = true;
    y.register_hook([addr, gen, name = name_](const at::Tensor&) { live_unit(addr, gen, name)->on_pre_backward(); });
  }
  expects_backward_ = expects_backward_ || any;
  if (cfg_.reshard_after_forward) coll_.free_full();
  return out;
}

void UnitHooks::on_pre_backward() {
  if (backward_armed_) return;  // a second output of the same unit (e.g. D on real and fake)
  backward_armed_ = true;
  coll_.gather();
  // Backward runs the units in reverse of the recorded forward order: start the previous
  // unit's all-gather now, if its forward left it a backward to run.
  if (cfg_.prefetch && owner_) {
    ShardedUnit* prev = owner_->previous_in_order(unit_);
    if (prev && prev->expects_backward()) {
      prev->prefetch();
      ShardedUnit* before = owner_->previous_in_order(*prev);
      if (before && before->expects_backward()) owner_->read_ahead(*before);
    }
  }
  // Released once every trainable parameter has its gradient and every input that
  // required grad has its gradient: then no node of this unit's backward is left to run.
  pending_grads_ = input_grads_expected_;
  for (auto& s : flat_.slots()) pending_grads_ += s.param.requires_grad() ? 1 : 0;
  if (owner_) owner_->ensure_backward_callback();
}

void UnitHooks::on_backward_part_done() {
  if (!backward_armed_) return;
  if (--pending_grads_ > 0) return;
  if (owner_) {
    coll_.stage_gradients();  // local; the owner starts reductions in an order every rank shares
    coll_.free_full();
    owner_->on_unit_grads_staged();
  } else {
    unit_.reduce_gradients();
    coll_.free_full();
  }
  backward_armed_ = false;
  input_grads_expected_ = 0;
  expects_backward_ = false;
}

void UnitHooks::finish_backward() {
  expects_backward_ = false;
  input_grads_expected_ = 0;
  if (!backward_armed_) {
    coll_.free_full();  // a prefetch for a backward that did not reach this unit
    return;
  }
  coll_.stage_gradients();  // the owner's end-of-backward callback starts the reduction
  coll_.free_full();
  backward_armed_ = false;
}

void UnitHooks::reset() {
  backward_armed_ = false;
  expects_backward_ = false;
  pending_grads_ = 0;
  input_grads_expected_ = 0;
}

}  // namespace detail
}  // namespace shardgan
