#pragma once
/// One sharding unit: a submodule whose parameters are flattened into one flat parameter
/// and, at ZeRO stage 3, partitioned across ranks (ZeRO paper, Rajbhandari et al. 2020,
/// Sec. 5; PyTorch FSDP's FlatParameter, Zhao et al. 2023, Sec. 3.2).
///
/// Flat layout: the unit's parameters, in named_parameters() order, are concatenated into
/// a flat buffer of T elements, zero-padded to P = ceil(T / N) * N for world size N. Rank r
/// owns elements [r * S, (r + 1) * S) with S = P / N. At stage 0 nothing is padded or
/// sharded: the rank "owns" all T elements (S = P = T).
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "shardgan/comm/communicator.h"
#include "shardgan/sharding/flat_param.h"
#include "shardgan/sharding/sharding_config.h"

namespace shardgan {

class GradSink;
class ShardedModel;
class ShardSource;
namespace detail {
class UnitCollectives;
class UnitHooks;
}  // namespace detail

class ShardedUnit {
 public:
  /// Runs the unit's module: the activation plus any conditioning tensors in, one or more
  /// tensors out; shapes are the module's own.
  using Forward = std::function<TensorList(const TensorList&)>;
  /// The common case of one tensor in and one out.
  using SingleForward = std::function<at::Tensor(const at::Tensor&)>;
  /// Adapts a SingleForward (inputs[0] in, one output).
  static Forward single(SingleForward f);

  /// Where each original parameter lives inside the flat parameter (flat_param.h).
  using ParamSlot = FlatParam::Slot;

  /// Flattens `module`'s parameters (which must share one dtype and one device, and be
  /// identical on every rank) and keeps this rank's shard. Every buffer of the unit (flat
  /// parameter, shard, gradients) lives on that device. Collective at stage 3 only in
  /// that it must be built on every rank in the same order. Throws std::invalid_argument
  /// for an unsupported stage or mixed dtypes.
  ShardedUnit(std::string name, std::shared_ptr<torch::nn::Module> module, Forward forward,
              Communicator& comm, ShardingConfig cfg, ShardedModel* owner);
  ~ShardedUnit();
  ShardedUnit(const ShardedUnit&) = delete;
  ShardedUnit& operator=(const ShardedUnit&) = delete;

  /// Collective at stage 3 (all-gather). Gathers the full parameters, casts every floating
  /// input to the compute dtype, runs the module, and frees the parameters again if
  /// reshard_after_forward. When an output requires grad, it arms the pre-backward gather
  /// and the release after backward: the unit is reduced and freed once every trainable
  /// parameter has its gradient and every input that requires grad has its gradient (a
  /// frozen unit is thus freed as soon as its input gradient is computed).
  TensorList forward(const TensorList& inputs);
  /// forward({x})[0].
  at::Tensor forward(const at::Tensor& x);

  /// Collective at stage 3: all-gathers the flat parameter (no-op if already gathered or
  /// at stage 0).
  void gather();
  /// Collective at stage 3, non-blocking: starts the all-gather that gather() would do and
  /// returns at once; gather() then only waits for it. No-op if gathered or not stage 3.
  void prefetch();
  /// Frees the gathered flat parameter (stage 3; waits for a prefetch in flight). Local.
  void free_full();
  /// Collective unless deferred: adds the parameters' .grad into one flat buffer in the
  /// reduce dtype and releases them. Stages 2 and 3 then reduce-scatter (average) it into
  /// grad_shard() right away; stages 0 and 1 keep accumulating locally until a backward
  /// with gradient sync on (the accumulation boundary), then all-reduce (0) or
  /// reduce-scatter (1). A parameter that got no gradient on this rank (a data-dependent
  /// branch) contributes zeros: the unit always takes part in the collective, as FSDP
  /// does. Skipped only when no parameter requires grad (a frozen unit: the same on
  /// every rank, since freezing is a local call every rank makes).
  void reduce_gradients();
  /// Local: adds the parameters' .grad into the flat gradient buffer and releases them
  /// (a no-op for a frozen unit). start_reduce() then sends it.
  void stage_gradients();
  /// Collective (see reduce_gradients): reduces what stage_gradients() staged, or zeros
  /// when nothing was staged on this rank.
  void start_reduce();
  /// Whether the unit's parameters take part in the next reduction: a forward with
  /// autograd on reached a trainable parameter of it, or a gradient was staged.
  bool expects_reduce() const;
  /// Whether stage_gradients() staged a gradient that start_reduce() has not sent yet.
  bool gradients_staged() const;
  /// Whether some parameter of the unit requires grad or holds one.
  bool trainable() const;
  /// Waits for this unit's reduce-scatter in flight, if any, and adds its result into
  /// grad_shard(). Local apart from the MPI wait.
  void finish_reduce();
  /// Whether a reduce-scatter of this unit is in flight.
  bool reduce_in_flight() const;
  /// Whether a reduction completed into grad_shard() since the last zero_grad() (the same
  /// on every rank: units reduce alike, see reduce_gradients). Local.
  bool reduced() const;
  /// Whether the next backward ends a gradient-accumulation step (stages 0 and 1 reduce
  /// only then; like DDP's no_sync). Local.
  void set_gradient_sync(bool on);
  /// Collective at stages 1 and 2 (all-gather of the updated owned slices into the full
  /// parameters); copies master to compute dtype at stage 0 with mixed precision; no-op at
  /// stage 3. Call after every optimizer step.
  void after_optimizer_step();
  /// Local: zeroes any accumulated flat gradient, and zeroes the gradient shard where it
  /// aliases that, else releases it (see ShardedModel::zero_grad).
  void zero_grad();
  /// Local: whether zero_grad() releases a gradient shard of its own (default) or zeroes it
  /// (see ShardedModel::set_release_grad_shards).
  void set_release_grad_shard(bool on);
  /// See ShardedModel::abandon_step: completes collectives in flight, frees the gathered
  /// parameters, drops gradients and backward state.
  void abandon();

  /// Toggles requires_grad on every parameter (a frozen unit yields input gradients only).
  void set_requires_grad(bool on);

  /// Local. Plain mode (for double backward; see ShardedModel::begin_higher_order): forward
  /// only casts the inputs and runs the module, with no gather, no release and no
  /// backward hooks, so the parameters must already be gathered and stay so.
  void set_plain(bool on);

  const std::string& name() const { return name_; }
  /// Position of this unit in its model's forward order.
  size_t index() const { return index_; }
  int64_t numel() const { return flat_->numel(); }                ///< T, unpadded elements
  int64_t padded_numel() const { return flat_->padded_numel(); }  ///< P
  /// E: one past the last parameter (T unless ShardingConfig::flat_align > 1).
  int64_t data_end() const { return flat_->data_end(); }
  int64_t shard_numel() const { return flat_->shard_numel(); }    ///< S, elements this rank owns
  int64_t shard_offset() const { return flat_->shard_offset(); }  ///< first owned flat element
  int stage() const { return cfg_.stage; }
  /// The device of the unit's parameters (CPU for a unit without parameters).
  c10::Device device() const { return flat_->device(); }
  /// This rank's part of the flat master parameter: 1-D, S elements, the master dtype, on
  /// device().
  /// The optimizer updates it in place. Without mixed precision it aliases the full
  /// parameters at stages 0-2 (the owned slice), and is its own tensor at stage 3. Throws
  /// std::logic_error naming the unit once the shard is offloaded (offload_shard): use
  /// master_shard() / set_master_shard() then.
  at::Tensor& shard() {
    if (flat_->offloaded()) throw_offloaded();
    return flat_->shard();
  }
  /// Stage 3 parameter offload: writes the master shard to `source` (shard_source.h), which
  /// keeps it from now on, and frees it here. Gathers then read it from the source; the
  /// optimizer owning the source updates it there. Local. Throws std::logic_error below
  /// stage 3 or if already offloaded.
  void offload_shard(ShardSource* source);
  /// Whether the master shard lives in an offload tier (offload_shard).
  bool shard_offloaded() const { return flat_->offloaded(); }
  /// The master shard's values ([S], master dtype, CPU): shard() itself when resident, a
  /// transient copy read from the tier when offloaded. Local.
  at::Tensor master_shard();
  /// Overwrites the master shard (resident or offloaded) with `values` ([S], any floating
  /// dtype, converted), and drops the hpZ secondary block. Local.
  void set_master_shard(const at::Tensor& values);
  /// dtype of the master shard (of the module as built).
  at::ScalarType master_dtype() const { return flat_->master_dtype(); }
  /// dtype of the gathered parameters (ShardingConfig::compute_dtype, else the master's).
  at::ScalarType compute_dtype() const { return flat_->compute_dtype(); }
  /// The averaged gradient for shard(): same shape, dtype and device. Allocated here as
  /// zeros when zero_grad() has released it and no reduction has arrived since. Throws
  /// std::logic_error naming the unit once the gradient is offloaded (offload_grad): use
  /// with_grad_shard() then.
  at::Tensor& grad_shard();
  /// Gradient offload (stages 2 and 3): from now on each completed reduction is added into
  /// the unit's gradient shard in `sink` (grad_sink.h) instead of a resident tensor, so the
  /// shard is never held in memory between the reduce-scatter and the optimizer step. The
  /// optimizer owning the sink reads it there. Local. Throws std::logic_error below stage
  /// 2, if already offloaded, or while a reduction is in flight or completed (call it
  /// between zero_grad() and the next backward).
  void offload_grad(GradSink* sink);
  /// Whether the gradient shard lives in an offload tier (offload_grad).
  bool grad_offloaded() const;
  /// With gradient offload: whether a reduction has been added into the tier since the
  /// last zero_grad() (else the shard is zero and the tier holds stale values). Equals
  /// reduced() for a unit whose gradients are not offloaded.
  bool grad_in_tier() const;
  /// Passes fn the gradient shard ([S], master dtype, on device()): grad_shard() itself
  /// when resident, else a transient copy read from the tier (zeros if nothing was
  /// reduced into it since zero_grad()), stored back when `write`. The way for clipping,
  /// unscaling, the finiteness vote and the HSDP average to reach an offloaded gradient.
  /// Local (fn may run collectives, called alike on every rank); reads and writes the disk.
  void with_grad_shard(const std::function<void(at::Tensor&)>& fn, bool write);
  /// Bytes this rank keeps between steps for parameters (full copy at stages 0-2, the
  /// shard at stage 3, plus a separate master shard with mixed precision).
  int64_t persistent_param_bytes() const;
  /// Bytes this rank holds for gradients at the model's update (the accumulated flat
  /// gradient at stages 0 and 1, plus a separate gradient shard, counted also while
  /// zero_grad() has it released).
  int64_t persistent_grad_bytes() const;
  /// The part of persistent_grad_bytes() that zero_grad() releases: the gradient shard when
  /// it is a tensor of its own, else 0.
  int64_t released_grad_bytes() const;
  /// Largest transient communication buffer allocated so far (bytes).
  int64_t peak_comm_buffer_bytes() const;
  /// hpZ (ShardedModel::set_secondary_group): whether this rank holds the unit's secondary
  /// block, so that its next gather stays inside the secondary group; and its bytes
  /// (P / K compute-dtype elements, 0 when not held). Local.
  bool holds_secondary() const;
  int64_t secondary_bytes() const;
  const std::vector<ParamSlot>& slots() const { return flat_->slots(); }
  /// Parameter `slot` of the module (original shape, compute dtype) when its memory is
  /// there: always at stages 0-2, while gathered at stage 3 (in forward/backward or inside
  /// a FullParameters scope). Throws std::logic_error naming the unit and parameter when it
  /// was freed, instead of touching memory that is not there. Local.
  const at::Tensor& param(size_t slot) const;
  torch::nn::Module& module() { return *module_; }
  /// Whether the flat parameter holds (or an all-gather in flight will hold) the full
  /// parameters: always at stages 0-2.
  bool gathered() const;
  /// Bytes currently held by the gathered flat parameter at stage 3 (0 when freed, and at
  /// stages 0-2, where the full parameters are persistent).
  int64_t full_bytes_alive() const;

  /// Collective at stage 3: the full flat parameter without its tail padding (data_end()
  /// elements, a new tensor; slots() give each parameter's place in it).
  at::Tensor gather_full_copy();

  // Backward bookkeeping, called from autograd hooks. Not for users.
  void on_pre_backward();
  void on_param_grad_ready();
  void on_input_grad_ready();
  /// End of a backward pass: reduces and frees a unit whose gradients did not all arrive.
  void finish_backward();
  /// Whether the last forward left this unit a backward to run (backward prefetch).
  bool expects_backward() const;

 private:
  // Split as FSDP2 splits its runtime (../shared/STYLE.md): the flat-parameter handle
  // (flat_param.h: shard, padding, views), the collectives with their buffers and work in
  // flight (unit_collectives.cpp), and the runtime hooks (unit_hooks.cpp). This class
  // owns the three and is the interface the model and users see.
  std::string name_;
  std::shared_ptr<torch::nn::Module> module_;
  Forward forward_;
  Communicator& comm_;
  ShardingConfig cfg_;
  ShardedModel* owner_;
  size_t index_ = 0;  // position in the owner's units (forward order)
  // Destroyed in reverse: the hooks first (a graph may outlive the unit), then the
  // collectives (a node-shared slot's pointer), then the flat parameter.
  std::unique_ptr<FlatParam> flat_;
  std::unique_ptr<detail::UnitCollectives> coll_;
  std::unique_ptr<detail::UnitHooks> hooks_;

  [[noreturn]] void throw_offloaded() const;
};

}  // namespace shardgan
