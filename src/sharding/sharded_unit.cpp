#include "shardgan/sharding/sharded_unit.h"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <unordered_map>
#include <stdexcept>

#include <torch/torch.h>

#include "shardgan/device/host_copy.h"
#include "shardgan/sharding/shard_source.h"
#include "shardgan/sharding/sharded_model.h"
#include "sharding/ownership.h"
#include "sharding/torch_internals.h"

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

int64_t nbytes(const at::Tensor& t) { return t.defined() ? t.numel() * t.element_size() : 0; }

// Adds the wall time of its scope to *sink (nothing when sink is null: a unit without a model).
class Timed {
 public:
  explicit Timed(double* sink) : sink_(sink), t0_(std::chrono::steady_clock::now()) {}
  ~Timed() {
    if (sink_) *sink_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }
  Timed(const Timed&) = delete;
  Timed& operator=(const Timed&) = delete;

 private:
  double* sink_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace

ShardedUnit::Forward ShardedUnit::single(SingleForward f) {
  return [f = std::move(f)](const TensorList& in) { return TensorList{f(in.at(0))}; };
}

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
  c10::optional<at::ScalarType> dtype;
  const std::string qualified = (owner_ ? owner_->name() + "." : std::string()) + name_ + ".";
  try {
    for (auto& kv : module_->named_parameters(/*recurse=*/true)) {
      const at::Tensor& p = kv.value();
      if (dtype && *dtype != p.scalar_type()) {
        throw std::invalid_argument("unit '" + name_ + "': parameter '" + kv.key() +
                                    "' has a different dtype from the unit's other parameters");
      }
      if (dtype && p.device() != device_) {
        throw std::invalid_argument("unit '" + name_ + "': parameter '" + kv.key() + "' is on " +
                                    p.device().str() + ", the unit's other parameters on " + device_.str());
      }
      device_ = p.device();
      // Throws, naming both owners, if another unit already owns this parameter.
      detail::claim_parameter(p, qualified + kv.key());
      dtype = p.scalar_type();
      slots_.push_back({kv.key(), p.sizes().vec(), numel_, p.numel(), p});
      numel_ += p.numel();
    }
  } catch (...) {
    for (auto& s : slots_) detail::release_parameter(s.param);
    throw;
  }
  master_dtype_ = dtype.value_or(at::kFloat);
  compute_dtype_ = cfg_.compute_dtype.value_or(master_dtype_);
  reduce_dtype_ = cfg_.reduce_dtype.value_or(master_dtype_);
  const int64_t n = comm_.world_size();
  if (cfg_.stage == 0) {
    padded_numel_ = shard_numel_ = numel_;
    shard_offset_ = 0;
  } else {
    shard_numel_ = (numel_ + n - 1) / n;
    padded_numel_ = shard_numel_ * n;
    shard_offset_ = shard_numel_ * comm_.rank();
  }
  const auto master_opts = torch::TensorOptions().dtype(master_dtype_).device(device_);
  const auto compute_opts = torch::TensorOptions().dtype(compute_dtype_).device(device_);
  const auto reduce_opts = torch::TensorOptions().dtype(reduce_dtype_).device(device_);
  const bool same_dtype = compute_dtype_ == master_dtype_;
  shard_aliases_full_ = same_dtype && cfg_.stage <= 2;
  if (cfg_.stage == 3) {
    // Deferred sharded init: copy only the owned range of each parameter into the master
    // shard. full_ gets untouched (so never resident) memory that is freed below, and the
    // parameters' own storage goes with set_data, so the build peaks at one unit + shard.
    shard_ = torch::zeros({shard_numel_}, master_opts);
    for (auto& s : slots_) {
      const int64_t lo = std::max(s.offset, shard_offset_);
      const int64_t hi = std::min(s.offset + s.numel, shard_offset_ + shard_numel_);
      if (lo >= hi) continue;
      shard_.narrow(0, lo - shard_offset_, hi - lo)
          .copy_(s.param.reshape({-1}).narrow(0, lo - s.offset, hi - lo));
    }
    full_ = torch::empty({padded_numel_}, compute_opts);
    for (auto& s : slots_) s.param.set_data(full_.narrow(0, s.offset, s.numel).view(s.shape));
  } else {
    at::Tensor master_full = torch::zeros({padded_numel_}, master_opts);
    for (auto& s : slots_) master_full.narrow(0, s.offset, s.numel).copy_(s.param.reshape({-1}));
    full_ = master_full.to(compute_dtype_);  // no copy when the dtypes agree
    for (auto& s : slots_) s.param.set_data(full_.narrow(0, s.offset, s.numel).view(s.shape));
    at::Tensor owned = master_full.narrow(0, shard_offset_, shard_numel_);
    shard_ = shard_aliases_full_ ? full_.narrow(0, shard_offset_, shard_numel_) : owned.clone();
  }
  if (cfg_.stage <= 1) {
    grad_flat_ = torch::zeros({padded_numel_}, reduce_opts);
    grad_shard_aliases_flat_ = reduce_dtype_ == master_dtype_;
  }
  // Not resident until the first gradient arrives (stage 2-3: built models hold shards only).
  grad_shard_ = grad_shard_aliases_flat_ ? grad_flat_.narrow(0, shard_offset_, shard_numel_)
                         : device_.is_cpu() ? detail::lazy_zeros(shard_numel_, master_dtype_)
                                            : torch::zeros({shard_numel_}, master_opts);
  gathered_ = cfg_.stage <= 2;
  if (cfg_.stage == 3) detail::free_storage(full_);
  for (auto& s : slots_) {
    if (!s.param.requires_grad()) continue;
    // Fires once the parameter's .grad for this backward pass is final: where DeepSpeed
    // and FSDP1 detect gradient readiness.
    accumulators_.push_back(detail::add_grad_ready_hook(s.param, [this] { on_param_grad_ready(); }));
  }
  register_live(this);
}

ShardedUnit::~ShardedUnit() {
  unregister_live(this);
  // The accumulators may outlive us inside a graph that is still alive; drop our hooks.
  accumulators_.clear();
  for (auto& s : slots_) detail::release_parameter(s.param);
}

const at::Tensor& ShardedUnit::param(size_t slot) const {
  const ParamSlot& s = slots_.at(slot);
  if (cfg_.stage == 3 && (!gathered_ || prefetch_work_)) {
    throw std::logic_error("unit '" + name_ + "': parameter '" + s.name + "' is sharded (ZeRO stage 3) and not "
                           "gathered now; read it inside a FullParameters scope (summon_full_params)");
  }
  return s.param;
}

int64_t ShardedUnit::full_bytes_alive() const {
  if (cfg_.stage != 3 || !gathered_) return 0;
  return static_cast<int64_t>(detail::storage_nbytes(full_));
}

int64_t ShardedUnit::persistent_param_bytes() const {
  int64_t b = cfg_.stage <= 2 ? nbytes(full_) : 0;
  if (!shard_aliases_full_ && !source_) b += nbytes(shard_);
  return b;
}

void ShardedUnit::throw_offloaded() const {
  throw std::logic_error("unit '" + name_ + "': the master shard is offloaded (offload.<model>.param); use "
                         "master_shard() / set_master_shard()");
}

void ShardedUnit::offload_shard(ShardSource* source) {
  if (cfg_.stage != 3) {
    throw std::logic_error("unit '" + name_ + "': parameter offload needs ZeRO stage 3, not " + std::to_string(cfg_.stage));
  }
  if (source_) throw std::logic_error("unit '" + name_ + "': the master shard is offloaded already");
  if (!source) throw std::invalid_argument("unit '" + name_ + "': offload_shard needs a source");
  free_full();  // an all-gather in flight still reads shard_
  source->write_shard(index_, shard_);
  source_ = source;
  detail::free_storage(shard_);
}

at::Tensor ShardedUnit::master_shard() {
  if (!source_) return shard_;
  // The tier reads into host memory; a device shard goes on through the staging copy.
  at::Tensor t = torch::empty({shard_numel_}, torch::TensorOptions().dtype(master_dtype_));
  source_->read_shard(index_, t);
  if (!device_.is_cpu()) {
    at::Tensor d = torch::empty({shard_numel_}, t.options().device(device_));
    copy_from_host(t, d);
    return d;
  }
  return t;
}

void ShardedUnit::set_master_shard(const at::Tensor& values) {
  if (!source_) {
    shard_.copy_(values);
    return;
  }
  source_->write_shard(index_, values.scalar_type() == master_dtype_ ? values.contiguous() : values.to(master_dtype_));
}

double* ShardedUnit::collective_sink() { return owner_ ? &owner_->comm_times().collective_s : nullptr; }

at::Tensor ShardedUnit::gather_source() {
  at::Tensor master;
  {
    Timed t(source_ && owner_ ? &owner_->comm_times().offload_read_s : nullptr);
    master = master_shard();
  }
  return master.scalar_type() == compute_dtype_ ? master : master.to(compute_dtype_);
}

int64_t ShardedUnit::persistent_grad_bytes() const {
  return nbytes(grad_flat_) + (grad_shard_aliases_flat_ ? 0 : nbytes(grad_shard_));
}

void ShardedUnit::prefetch() {
  if (cfg_.stage != 3 || gathered_) return;
  detail::refill_storage(full_, static_cast<size_t>(padded_numel_) * full_.element_size());
  prefetch_src_ = gather_source();  // with parameter offload, read from the tier here
  Timed t(collective_sink());
  prefetch_work_ = comm_.all_gather_async(full_, prefetch_src_);
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
  detail::refill_storage(full_, static_cast<size_t>(padded_numel_) * full_.element_size());
  at::Tensor src = gather_source();
  {
    Timed t(collective_sink());
    comm_.all_gather(full_, src);
  }
  gathered_ = true;
  if (owner_) owner_->on_unit_gathered();
}

void ShardedUnit::free_full() {
  if (cfg_.stage != 3 || !gathered_) return;
  gather();  // an all-gather in flight still writes into full_: let it finish first
  detail::free_storage(full_);
  gathered_ = false;
}

at::Tensor ShardedUnit::forward(const at::Tensor& x) { return forward(TensorList{x}).at(0); }

TensorList ShardedUnit::forward(const TensorList& inputs) {
  if (plain_ && !gathered_) {
    throw std::logic_error("unit '" + name_ + "': plain (higher-order) forward needs the unit gathered; "
                           "call ShardedModel::begin_higher_order() first");
  }
  if (!plain_) {
    if (owner_) owner_->before_unit_forward();  // may throw (an abandoned step): nothing gathered yet
    gather();
    if (owner_) owner_->on_unit_forward(*this);  // records the order, or prefetches the next
  }
  // This unit's registry generation, for the autograd hooks below (one lookup per forward).
  const int64_t gen = plain_ ? 0 : static_cast<int64_t>(generation_of(this));
  TensorList in;
  in.reserve(inputs.size());
  for (const at::Tensor& x : inputs) {
    // Mixed precision: floating inputs are cast to the compute dtype at the unit boundary.
    at::Tensor t = x.defined() && x.is_floating_point() && x.scalar_type() != compute_dtype_
                       ? x.to(compute_dtype_) : x;
    if (!plain_ && t.defined() && t.requires_grad() && at::GradMode::is_enabled()) {
      t = InputGradReady::apply(t, reinterpret_cast<int64_t>(this), gen, name_);
      ++input_grads_expected_;
    }
    in.push_back(std::move(t));
  }
  TensorList out = forward_(in);
  if (plain_) return out;
  // Every rank runs the same unit forwards, so this, unlike which parameters got a
  // gradient, is the same on every rank: the unit takes part in the next reduction.
  if (at::GradMode::is_enabled() && trainable()) expects_reduce_ = true;
  bool any = false;
  for (at::Tensor& y : out) {
    if (!y.defined() || !y.requires_grad()) continue;
    any = true;
    y.register_hook([addr = reinterpret_cast<int64_t>(this), gen, name = name_](const at::Tensor&) {
      live_unit(addr, gen, name)->on_pre_backward();
    });
  }
  expects_backward_ = expects_backward_ || any;
  if (cfg_.reshard_after_forward) free_full();
  return out;
}

void ShardedUnit::on_pre_backward() {
  if (backward_armed_) return;  // a second output of the same unit (e.g. D on real and fake)
  backward_armed_ = true;
  gather();
  // Backward runs the units in reverse of the recorded forward order: start the previous
  // unit's all-gather now, if its forward left it a backward to run.
  if (cfg_.prefetch && owner_) {
    ShardedUnit* prev = owner_->previous_in_order(*this);
    if (prev && prev->expects_backward_) prev->prefetch();
  }
  // Released once every trainable parameter has its gradient and every input that
  // required grad has its gradient: then no node of this unit's backward is left to run.
  pending_grads_ = input_grads_expected_;
  for (auto& s : slots_) pending_grads_ += s.param.requires_grad() ? 1 : 0;
  if (owner_) owner_->ensure_backward_callback();
}

void ShardedUnit::on_param_grad_ready() { on_backward_part_done(); }

void ShardedUnit::on_input_grad_ready() { on_backward_part_done(); }

void ShardedUnit::on_backward_part_done() {
  if (!backward_armed_) return;
  if (--pending_grads_ > 0) return;
  if (owner_) {
    stage_gradients();  // local; the owner starts reductions in an order every rank shares
    free_full();
    owner_->on_unit_grads_staged();
  } else {
    reduce_gradients();
    free_full();
  }
  backward_armed_ = false;
  input_grads_expected_ = 0;
  expects_backward_ = false;
}

void ShardedUnit::finish_backward() {
  expects_backward_ = false;
  input_grads_expected_ = 0;
  if (!backward_armed_) {
    free_full();  // a prefetch for a backward that did not reach this unit
    return;
  }
  stage_gradients();  // the owner's end-of-backward callback starts the reduction
  free_full();
  backward_armed_ = false;
}

bool ShardedUnit::trainable() const {
  for (auto& s : slots_) {
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
  if (!staged_) {
    staged_flat_ = persistent ? grad_flat_
                              : torch::zeros({padded_numel_}, torch::TensorOptions().dtype(reduce_dtype_).device(device_));
    if (!persistent) peak_comm_bytes_ = std::max(peak_comm_bytes_, nbytes(staged_flat_));
    staged_ = true;
    expects_reduce_ = true;  // a staged gradient is always reduced
  }
  for (auto& s : slots_) {
    at::Tensor& g = s.param.mutable_grad();
    if (!g.defined()) continue;  // unused on this rank: its part stays zero, as in FSDP
    staged_flat_.narrow(0, s.offset, s.numel).add_(g.reshape({-1}));
    g.reset();
  }
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
    if (!grad_shard_aliases_flat_) grad_shard_.add_(flat.to(master_dtype_));
    return;
  }
  // Start the reduce-scatter and return: it overlaps the rest of backward. The owner
  // bounds how many are in flight and finishes them all before backward returns.
  if (owner_) owner_->before_reduce_start(*this);
  reduce_in_ = flat;
  reduce_out_ = torch::empty({shard_numel_}, flat.options());
  peak_comm_bytes_ = std::max(peak_comm_bytes_, nbytes(reduce_out_) + (persistent ? 0 : nbytes(flat)));
  {
    Timed t(collective_sink());
    reduce_work_ = comm_.reduce_scatter_async(reduce_out_, reduce_in_, ReduceOp::kAvg);
  }
  if (owner_) owner_->on_reduce_started(*this);
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
    grad_shard_.add_(reduce_out_.to(master_dtype_));
  }
  reduce_in_ = at::Tensor();
  reduce_out_ = at::Tensor();
}

void ShardedUnit::after_optimizer_step() {
  torch::NoGradGuard no_grad;
  if (cfg_.stage == 3) return;  // the next gather reads the updated shard
  if (cfg_.stage == 0) {
    if (!shard_aliases_full_) full_.copy_(shard_);
    return;
  }
  Timed t(collective_sink());
  comm_.all_gather(full_, shard_aliases_full_ ? shard_ : shard_.to(compute_dtype_));
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
  for (auto& s : slots_) s.param.mutable_grad().reset();
  zero_grad();  // completes a reduce-scatter in flight first
}

void ShardedUnit::set_requires_grad(bool on) {
  for (auto& s : slots_) s.param.requires_grad_(on);
}

at::Tensor ShardedUnit::gather_full_copy() {
  if (cfg_.stage == 0) return (shard_aliases_full_ ? full_ : shard_).narrow(0, 0, numel_).clone();
  at::Tensor full = torch::empty({padded_numel_}, shard_.options());
  comm_.all_gather(full, master_shard());
  return full.narrow(0, 0, numel_).clone();
}

}  // namespace shardgan
