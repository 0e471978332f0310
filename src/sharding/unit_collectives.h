#pragma once
// The collectives of one sharding unit and the buffers they own (FSDP2's FSDPParamGroup:
// unshard, wait_for_unshard, reshard and the reduce-scatter of foreach_reduce): the
// all-gather of the flat parameter (through the communicator, or into a node-shared slot)
// and its prefetch, gradient staging, the reduce-scatter or all-reduce, and the all-gather
// after an optimizer step. Private to ShardedUnit, which owns one beside its FlatParam
// (the handle: shard, padding, views) and its UnitHooks (unit_hooks.h: when these run).
// The public contracts are on ShardedUnit's methods of the same names (sharded_unit.h).
#include <cstdint>
#include <functional>
#include <memory>

#include <ATen/core/Tensor.h>

#include "shardgan/comm/communicator.h"
#include "shardgan/sharding/sharding_config.h"

namespace shardgan {

class FlatParam;
class GradSink;
class ShardedModel;
class ShardedUnit;

namespace detail {

/// An all-gather in flight into the flat parameter (FSDP2's AllGatherResult): the handle
/// (Communicator's, or the node-shared wait) and the send buffer it reads, this rank's
/// block of the flat parameter (undefined for a node-shared gather, which sends nothing).
struct AllGatherState {
  std::unique_ptr<Work> work;
  at::Tensor send;
};

/// A reduce-scatter in flight: the handle and its buffers, both in the reduce dtype on the
/// unit's device.
struct ReduceScatterState {
  std::unique_ptr<Work> work;
  at::Tensor in;   ///< P elements: the staged flat gradient
  at::Tensor out;  ///< S elements: this rank's reduced slice
};

class UnitCollectives {
 public:
  /// `unit` is the owner of `flat` (the model's callbacks take it); `owner` may be null
  /// (a unit without a model: nothing is timed, no pool, no bound on reductions in flight).
  UnitCollectives(ShardedUnit& unit, FlatParam& flat, Communicator& comm, const ShardingConfig& cfg,
                  ShardedModel* owner);
  /// Drops the flat parameter's pointer into a node-shared slot still held: the module may
  /// outlive the unit, and its parameters must not point into pages that are unmapped.
  ~UnitCollectives();
  UnitCollectives(const UnitCollectives&) = delete;
  UnitCollectives& operator=(const UnitCollectives&) = delete;

  // Parameters.
  void prefetch();
  void gather();
  void free_full();
  bool gathered() const { return gathered_; }
  /// Whether an all-gather into the flat parameter is in flight (its values not there yet).
  bool gather_in_flight() const { return static_cast<bool>(gather_.work); }
  void after_optimizer_step();
  at::Tensor gather_full_copy();

  // Gradients.
  void stage_gradients();
  void start_reduce();
  void finish_reduce();
  void zero_grad();
  /// ShardedUnit::abandon's part: frees the gathered parameters, drops the staged and the
  /// parameters' gradients, and zeroes the shard after a reduction in flight completes.
  void abandon();
  /// A forward with autograd on reached a trainable parameter: the next reduction includes
  /// this unit (ShardedUnit::expects_reduce).
  void expect_reduce() { expects_reduce_ = true; }
  bool expects_reduce() const { return expects_reduce_; }
  bool gradients_staged() const { return staged_; }
  bool reduce_in_flight() const { return static_cast<bool>(reduce_.work); }
  bool reduced() const { return reduced_; }
  void set_gradient_sync(bool on) { sync_ = on; }
  void set_release_grad_shard(bool on) { release_grad_shard_ = on; }
  /// The gradient shard; allocated (zeros) here when released (see zero_grad).
  at::Tensor& grad_shard();
  /// Gradient offload (ShardedUnit::offload_grad): reductions go into `sink`'s shard of
  /// this unit (its index in the model) from now on.
  void set_grad_sink(GradSink* sink);
  GradSink* grad_sink() const { return grad_sink_; }
  bool grad_in_tier() const { return grad_in_tier_; }
  /// ShardedUnit::with_grad_shard for an offloaded gradient.
  void with_offloaded_grad(const std::function<void(at::Tensor&)>& fn, bool write);
  int64_t persistent_grad_bytes() const;
  int64_t released_grad_bytes() const;
  int64_t peak_comm_buffer_bytes() const { return peak_comm_bytes_; }

  // hpZ (ShardedModel::set_secondary_group).
  bool holds_secondary() const { return secondary_.defined(); }
  int64_t secondary_bytes() const;
  /// Drops the secondary block: the master shard changed (or is about to).
  void drop_secondary();

 private:
  ShardedUnit& unit_;
  FlatParam& flat_;
  Communicator& comm_;
  const ShardingConfig& cfg_;
  ShardedModel* owner_;

  // Parameters.
  bool gathered_ = false;  // the flat parameter has (or an all-gather in flight will have) its values
  AllGatherState gather_;  // prefetch in flight
  int64_t shared_seq_ = 0;  // node_shared_gather: the model's gather number in use, or 0
  // hpZ: block secondary->rank() of the gathered flat parameter (P / K elements, compute
  // dtype) since the unit's first gather after its last change, or undefined.
  at::Tensor secondary_;
  bool keep_secondary_ = false;  // the world gather in flight (gather_) fills secondary_ when waited for

  // Gradients.
  at::ScalarType reduce_dtype_;
  // S elements, master dtype. Aliases grad_flat_ (stages 0-1, reduce dtype == master), or
  // is a tensor of its own that zero_grad() releases and the first reduction (or a read
  // through grad_shard()) allocates again: undefined between a model's optimizer step and
  // its next backward.
  at::Tensor grad_shard_;
  at::Tensor grad_flat_;   // P elements, reduce dtype; persistent at stages 0 and 1
  bool grad_shard_aliases_flat_ = false;
  bool release_grad_shard_ = true;  // zero_grad() frees a shard of its own (else zeroes it)
  bool sync_ = true;
  bool reduced_ = false;         // see ShardedUnit::reduced()
  bool staged_ = false;          // staged_flat_ holds this step's flat gradient
  bool expects_reduce_ = false;  // see ShardedUnit::expects_reduce()
  at::Tensor staged_flat_;       // P elements, reduce dtype (grad_flat_ at stages 0-1)
  GradSink* grad_sink_ = nullptr;  // gradient offload: where reductions go
  bool grad_in_tier_ = false;      // a reduction was added into the sink since zero_grad()
  ReduceScatterState reduce_;    // in flight
  int64_t peak_comm_bytes_ = 0;

  /// Stage 3, after allocate_full(): writes the master shard (read from the source when
  /// offloaded) in the compute dtype into this rank's block of the flat parameter and
  /// returns that block, the send buffer of an in-place all-gather.
  at::Tensor fill_own_block();
  /// This rank's master shard: the flat parameter's, or with parameter offload the owner's
  /// read from the tier (timed as offload_read_s).
  at::Tensor read_master();
  /// node_shared_gather: maps the flat parameter onto a slot of the model's node-shared
  /// pool and publishes this rank's block; the returned work waits for the other ranks'
  /// blocks. nullptr (the caller all-gathers through the communicator) without a pool, for
  /// a unit without parameters, or when this rank still holds the slot itself.
  std::unique_ptr<Work> start_shared_gather();
  /// qwZ: quantizes this rank's master shard, starts the int8 all-gather and returns a
  /// handle whose wait() dequantizes every block into the gathered flat parameter.
  std::unique_ptr<Work> start_quantized_gather();
  /// The gather has its values (or will, once gather_ completes): tell the model.
  void mark_gathered();
  /// hpZ: the model's secondary group at stage 3, or nullptr.
  Communicator* secondary_group() const;
  /// hpZ: with the secondary block held, allocates the flat parameter, copies the block
  /// into its place and starts the all-gather inside the secondary group; else nullptr.
  std::unique_ptr<Work> start_secondary_gather();
  /// hpZ: after a world gather completed, keeps this rank's secondary block of it.
  void keep_secondary();
  /// Whether the reduce-scatter sums and finish_reduce() scales by 1/N instead (see there).
  bool avg_on_accumulate() const;
  /// Where collective time goes: the owner's CommTimes, or nowhere without an owner.
  double* collective_sink();
};

}  // namespace detail
}  // namespace shardgan
