#pragma once
/// A model split into sharding units that run in sequence (FSDP-style explicit wrapping:
/// the LibTorch C++ frontend has no module forward hooks, so units are wrapped by hand).
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "shardgan/sharding/sharded_unit.h"

namespace shardgan {

class NodeSharedPool;
class ReadAhead;
class TierWorker;

/// Bytes one rank holds for a model's training state, as the sharding layer counts them.
struct MemoryStats {
  int64_t param_shard_bytes = 0;      ///< parameters kept between steps: the full copy at
                                      ///< stages 0-2, the shard at 3, plus any separate
                                      ///< float32 master shard (mixed precision)
  int64_t grad_shard_bytes = 0;       ///< gradients at the model's update: the accumulated
                                      ///< flat gradient at stages 0-1, shards at 2-3
  int64_t grad_released_bytes = 0;    ///< the part of grad_shard_bytes that zero_grad()
                                      ///< releases (a gradient shard that does not alias
                                      ///< the flat gradient): held only from the first
                                      ///< reduction of a step to zero_grad()
  int64_t comm_buffer_bytes = 0;      ///< largest transient flat communication buffer seen
  int64_t optimizer_state_bytes = 0;  ///< filled in by the optimizer (ShardedAdam); with
                                      ///< offload, the host memory of its tier
  int64_t offloaded_bytes = 0;        ///< filled in by the optimizer: its state on disk
  int64_t full_param_bytes_alive = 0; ///< gathered full parameters right now
  int64_t peak_full_param_bytes = 0;  ///< most gathered bytes alive at once so far
  int64_t padding_elements = 0;       ///< zero padding of the flat parameters, P - T summed
                                      ///< over units (a rank holds at most this many extra)
  int64_t secondary_param_bytes = 0;  ///< hpZ: secondary blocks held now (P / K compute-dtype
                                      ///< elements per unit gathered since its last change)
  /// Parameter shards + gradient shards + optimizer state (the "model states" of ZeRO),
  /// and hpZ's secondary blocks.
  int64_t model_state_bytes() const {
    return param_shard_bytes + grad_shard_bytes + optimizer_state_bytes + secondary_param_bytes;
  }
};

/// Wall time this rank spent in a model's communication and parameter-offload reads
/// (seconds, cumulative since construction or the last reset). Collectives: all-gathers
/// started or waited for, reduce-scatters started or waited for, stage-0 all-reduces and
/// the stage 1-2 all-gather after a step. Offload reads: master shards read from the tier
/// to start an all-gather (parameter offload). Local bookkeeping; no communication.
struct CommTimes {
  double collective_s = 0;
  double offload_read_s = 0;
  /// Gradient offload: reduced gradient shards added into the tier (backward), and read
  /// from or written back to it for the vote, clipping, unscaling and the HSDP average.
  double offload_grad_s = 0;
};

class ShardedModel {
 public:
  /// `name` is "generator" or "discriminator" in the trainer; it prefixes log messages
  /// and checkpoint paths. `comm` must outlive the model.
  ShardedModel(std::string name, Communicator& comm, ShardingConfig cfg);
  ~ShardedModel();

  /// Runs a model's units on its inputs (e.g. {z, y} for a conditional G) and returns its
  /// outputs. It calls units through model.unit(name).forward(...) or model.units().
  using Program = std::function<TensorList(ShardedModel&, const TensorList&)>;

  /// Adds a unit (call identically on every rank; the order is the default program's and
  /// the initial prefetch order). The module's parameters are flattened and, at stage 3,
  /// sharded at once. Throws std::invalid_argument if a parameter of `module` already
  /// belongs to another unit of any model, or the unit name is taken, naming it.
  ShardedUnit& add_unit(std::string unit_name, std::shared_ptr<torch::nn::Module> module,
                        ShardedUnit::Forward forward);
  ShardedUnit& add_unit(std::string unit_name, std::shared_ptr<torch::nn::Module> module,
                        ShardedUnit::SingleForward forward);
  /// Sets the program that forward() runs; without one, forward() chains the units in
  /// registration order, each getting the previous unit's outputs.
  void set_program(Program program) { program_ = std::move(program); }

  /// Collective (stage 3: one all-gather per unit). Runs the program. The first call
  /// records the order in which units actually ran; prefetch then follows that order
  /// (forward: the next unit; backward: the previous one). The first call with autograd
  /// on also checks that every parameter the outputs depend on belongs to a sharding unit
  /// (std::invalid_argument naming its shape otherwise: it would drift apart across ranks).
  /// Defined inputs on another device than device() are copied there first (FSDP's root
  /// pre-forward), so callers may pass host tensors to a model on a GPU.
  TensorList forward(const TensorList& inputs);
  /// The device the model's flat parameters live on (its first unit's; CPU when empty).
  c10::Device device() const;
  /// forward({x})[0].
  at::Tensor forward(at::Tensor x);

  /// The unit called `unit_name`; throws std::out_of_range naming it if there is none.
  ShardedUnit& unit(const std::string& unit_name);

  /// Local: freezes or unfreezes every parameter (BigGAN's frozen D during the G step).
  void set_requires_grad(bool on);
  /// Local: zeroes every unit's accumulated flat gradient (stages 0-1) and releases its
  /// gradient shard where that is a tensor of its own (stages 2-3, or a reduce dtype other
  /// than the master's): the next reduction, or a read of ShardedUnit::grad_shard(),
  /// allocates it again as zeros. The trainer calls it right after each optimizer step, so
  /// that the other model's step does not hold this model's gradients.
  void zero_grad();
  /// Local: off, zero_grad() zeroes the gradient shards instead of releasing them, so that
  /// they stay allocated between steps (the memory pre-flight's probe allocates them before
  /// it counts a step's transient bytes, which they are not).
  void set_release_grad_shards(bool on);
  /// Local: whether the next backward ends a gradient-accumulation step. Stages 0 and 1
  /// reduce only in such a backward; stages 2 and 3 reduce every micro-step anyway.
  void set_gradient_sync(bool on);
  /// Collective at stages 1 and 2 (one all-gather per unit). Call after every optimizer
  /// step so that every rank's full parameters hold the updated values.
  void after_optimizer_step();
  /// Hybrid sharding (comm().replicate_degree() > 1): finishes the reductions in flight,
  /// then all-reduces (average) the gradient shard of every unit that reduced since
  /// zero_grad() across the replica groups, in unit order. Collective over all ranks of
  /// all groups; call once per optimizer update, after the last backward and before the
  /// gradients are read (vote, clipping, step). A no-op without replica groups.
  void reduce_across_replicas();
  /// Local. Called at the start of every unit forward (not in plain, higher-order mode),
  /// identically on every rank: the trainer votes there on preemption (it may throw to
  /// abandon the step; see abandon_step). Empty: nothing.
  void set_unit_hook(std::function<void()> hook) { unit_hook_ = std::move(hook); }
  /// Collective only in completing the reductions and all-gathers already in flight,
  /// which every rank started alike. After an exception left a step half done (before any
  /// optimizer update): waits for them, frees every gathered unit, drops staged and
  /// accumulated gradients and the backward bookkeeping, so that the model is as after
  /// zero_grad() at a step boundary.
  void abandon_step();
  /// Local: train or eval mode on every unit's module.
  void train(bool on);
  /// ZeRO++ hpZ (ShardingConfig::hpz_partition_size): `group` is this rank's secondary
  /// group, K ranks of comm() (usually one node's), each holding a different group rank;
  /// K must divide comm().world_size(). From now on each stage-3 unit keeps block
  /// group.rank() of its first gather after a parameter change (P / K elements, compute
  /// dtype) and all-gathers later gathers inside `group` until after_optimizer_step(), which
  /// drops the blocks (so does set_master_shard). Whoever changes master shards must call
  /// after_optimizer_step() afterwards, as stages 1-2 already require. Call identically on
  /// every rank, before the first forward or between steps; nullptr turns it off. `group`
  /// must outlive the model. Local. Throws std::invalid_argument when K does not divide N or
  /// the model is not at stage 3 (naming the model).
  void set_secondary_group(Communicator* group);
  /// The hpZ secondary group, or nullptr.
  Communicator* secondary_group() const { return secondary_; }

  /// Collective at stage 3 (one all-gather per unit, in unit order). Double backward
  /// through a sharded model, for gradient penalties (R1: Mescheder et al. 2018, Sec. 4;
  /// StyleGAN2's lazy R1, Karras et al. 2020, Sec. 3.1; WGAN-GP). A second-order pass
  /// (torch::autograd::grad(..., create_graph=true), then the backward of the penalty)
  /// reaches every parameter again after the first-order pass is done, so per-unit release
  /// cannot apply: from here to end_higher_order() every unit stays gathered and runs as a
  /// plain module (no release hooks, no prefetch). Costs the whole model in the compute
  /// dtype on every rank for that span (the price StyleGAN2's lazy regularization
  /// amortizes). DeepSpeed and FSDP have no such mode (DeepSpeed #3539, pytorch #172543).
  void begin_higher_order();
  /// Collective (every unit: its gradient reduction as in backward, then, at stage 3, its
  /// release). Ends begin_higher_order(): the parameters' .grad accumulated since then are
  /// reduced into the gradient shards (averaged over ranks; stages 0 and 1 accumulate
  /// locally unless gradient sync is on), exactly as a backward would.
  void end_higher_order();

  /// Collective at stage 3: every parameter, full and unsharded, as (qualified name, tensor).
  std::vector<std::pair<std::string, at::Tensor>> gather_full_parameters();
  /// Local: the modules' buffers (e.g. BatchNorm running stats), replicated on all ranks.
  std::vector<std::pair<std::string, at::Tensor>> named_buffers();

  /// Local accounting of this rank's bytes (optimizer_state_bytes left 0).
  MemoryStats memory_stats() const;

  const std::string& name() const { return name_; }
  /// Parameter elements of the whole model (unpadded, summed over units).
  int64_t numel() const;
  const ShardingConfig& config() const { return cfg_; }
  Communicator& comm() { return comm_; }
  std::vector<std::unique_ptr<ShardedUnit>>& units() { return units_; }

  /// Reduce-scatters in flight at once per model (DeepSpeed's overlap_comm with a bounded
  /// number of buckets): a bound on the flat gradient buffers alive during backward.
  static constexpr size_t kMaxReducesInFlight = 2;
  /// Gradient offload: reduced gradient shards queued for, or being added by, the gradient
  /// writer (write_grad_async); each holds its reduce-scatter output until written.
  static constexpr size_t kMaxGradWritesPending = 2;

  /// Units in the order the first forward ran them (empty before the first forward).
  const std::vector<size_t>& execution_order() const { return order_; }

  // Called by units from autograd hooks. Not for users.
  void on_unit_gathered();
  /// A unit forward (not plain) is about to run: calls the unit hook.
  void before_unit_forward() {
    if (unit_hook_) unit_hook_();
  }
  /// A unit's forward is starting: records the order (first pass) or prefetches the next.
  void on_unit_forward(ShardedUnit& u);
  /// The unit that ran before `u` in the recorded order, or nullptr.
  ShardedUnit* previous_in_order(const ShardedUnit& u);
  void ensure_backward_callback();
  void before_reduce_start(ShardedUnit& u);
  /// A unit's gradients are staged: starts every staged reduction that is next in the
  /// reduction order (reverse of the recorded forward order, over units that expect a
  /// reduction), so that every rank issues its collectives in the same order even when
  /// their backward graphs differ (a data-dependent branch).
  void on_unit_grads_staged() { start_reduces(false); }
  void on_reduce_started(ShardedUnit& u);
  /// Waits for every reduce-scatter in flight, oldest first (the end-of-backward callback
  /// does this, so gradients are complete when backward() returns).
  void finish_reduces();
  /// node_shared_gather: slots in the model's node-shared pool (a gather reuses the slot of
  /// the gather kSharedSlots before it once every rank released that one).
  static constexpr int kSharedSlots = 4;
  /// node_shared_gather: the model's pool, created at the first call (a collective: every
  /// rank makes it at the same gather), or nullptr when the option is off, the model is not
  /// a stage-3 CPU model on several ranks of one host, or under HSDP. Not for users.
  NodeSharedPool* shared_pool();
  /// Whether a model with `cfg` on `world_size` ranks, `replicate_degree` replica groups
  /// (HSDP; 1: none) and CPU (`on_cpu`) or GPU tensors gets a node-shared pool, provided its
  /// ranks share one node (ranks_share_node, a collective, checked by shared_pool()) and it
  /// has parameters. The memory pre-flight asks the same. Local.
  static bool node_shared_gather_applies(const ShardingConfig& cfg, int world_size, int replicate_degree,
                                         bool on_cpu) {
    return cfg.node_shared_gather && cfg.stage == 3 && world_size >= 2 && replicate_degree == 1 && on_cpu;
  }
  /// The number the next gather through the pool gets (1, 2, ...: the same on every rank),
  /// and taking it. A gather that falls back does not take one, so the gathers that used a
  /// slot are exactly every kSharedSlots-th number. Not for users.
  int64_t next_shared_seq() const { return shared_seq_ + 1; }
  void take_shared_seq() { ++shared_seq_; }
  /// Gathers that fell back to the communicator because this rank still held their slot.
  int64_t shared_gather_fallbacks() const { return shared_fallbacks_; }
  void count_shared_fallback() { ++shared_fallbacks_; }
  /// Most reduce-scatters that were in flight at once so far (<= kMaxReducesInFlight).
  size_t max_reduces_in_flight() const { return max_in_flight_; }
  /// Time spent in collectives and offload reads (the units add to it). Local.
  CommTimes& comm_times() { return times_; }

  /// Local. Parameter offload read-ahead (ShardingConfig::read_ahead): queues a read of
  /// `u`'s master shard from its tier and returns at once. The reads run on the model's one
  /// read-ahead thread (ReadAhead, made at the first read-ahead), in the order they were
  /// queued, each with the tier lock held. A no-op unless `u` is a stage-3 unit whose shard
  /// is offloaded, not gathered, holds no hpZ block and is not already being read, and
  /// fewer than kMaxReadsAhead reads are held (beyond that, `u`'s shard is read when its
  /// gather needs it). Never waits for a read. A read's error is not thrown here: it goes
  /// to read_master_shard(), or is dropped by drain_read_ahead().
  void read_ahead(ShardedUnit& u);
  /// Reads queued, running or done and not taken, at most, per model: with prefetch, a
  /// read is started two units before its gather and taken one unit before, so one is
  /// held at a time in a forward or a backward.
  static constexpr size_t kMaxReadsAhead = 2;
  /// Not for users: the lock that serializes the offload tier between the read-ahead
  /// thread, the gradient writer thread and the compute thread (gradient offload writes
  /// the tier during backward).
  std::mutex& tier_mutex() { return tier_mu_; }
  /// Not for users (gradient offload): runs `job` on the model's gradient writer thread
  /// (a TierWorker, made at the first call; not the read-ahead's), under the tier lock,
  /// after every job submitted before it; waits while kMaxGradWritesPending are pending. Rethrows the error of
  /// an earlier job (once), and then does not queue `job`.
  void write_grad_async(std::function<void()> job);
  /// Local: waits until every gradient write submitted so far is in the tier (timed as
  /// CommTimes::offload_grad_s); rethrows the first error of one (once). Whatever reads or
  /// steps the gradient tier calls it first (the optimizer step, with_grad_shard, zero_grad).
  void drain_grad_writes();
  /// Local: `u`'s master shard ([S], master dtype, CPU), taken from its read-ahead (waiting
  /// for it while queued or running) when one is held, else read now on this thread. Reads
  /// of the tier are serialized, so the tier sees one reader at a time. Rethrows the tier's
  /// OffloadError, whichever thread read it.
  at::Tensor read_master_shard(ShardedUnit& u);
  /// Local: drops every read-ahead that was not taken (the end of a forward or backward,
  /// abandon_step, destruction): reads not begun never run, the running one is waited
  /// for, values and errors are discarded, so that no read is in flight when the optimizer
  /// writes the tier. Throws nothing.
  void drain_read_ahead();
  /// Master shards taken from a read-ahead so far (for tests and logs).
  int64_t read_ahead_hits() const { return read_ahead_hits_; }

 private:
  std::string name_;
  Communicator& comm_;
  ShardingConfig cfg_;
  Communicator* secondary_ = nullptr;  // hpZ
  std::vector<std::unique_ptr<ShardedUnit>> units_;
  Program program_;
  std::vector<size_t> order_;            // recorded execution order (unit indices)
  std::vector<ptrdiff_t> order_pos_;     // unit index -> first position in order_, or -1
  bool recording_ = false, recorded_ = false, ownership_checked_ = false;
  bool callback_queued_ = false;
  bool higher_order_ = false;  // between begin_higher_order() and end_higher_order()
  std::function<void()> unit_hook_;
  size_t next_reduce_ = 0;  // position in reduction_order() of the next unit to reduce
  /// Reverse of the first-forward order; units the recorded forward did not run come last.
  std::vector<size_t> reduction_order() const;
  /// Starts reductions in reduction_order() while the next one is staged; with `flush`,
  /// also those not staged (zeros on this rank), then starts the next backward afresh.
  void start_reduces(bool flush);
  std::vector<ShardedUnit*> reducing_;  // units with a reduce-scatter in flight, oldest first
  size_t max_in_flight_ = 0;
  int64_t peak_full_bytes_ = 0;
  CommTimes times_;
  std::mutex tier_mu_;  // one user of the offload tier at a time (a worker or the compute thread)
  // Below tier_mu_ and units_: destroyed (threads joined) before them.
  std::unique_ptr<ReadAhead> read_ahead_;   // made at the first read-ahead; uses tier_mu_
  std::unique_ptr<TierWorker> grad_writer_;  // made at the first gradient write; uses tier_mu_
  int64_t read_ahead_hits_ = 0;
  /// The unit `offset` places after (negative: before) `u`'s first run in the recorded
  /// order, or in registration order before the first forward; nullptr past either end.
  ShardedUnit* unit_at_offset(const ShardedUnit& u, ptrdiff_t offset);
  std::unique_ptr<NodeSharedPool> shared_pool_;  // after units_: destroyed before them
  bool shared_pool_checked_ = false;
  int64_t shared_seq_ = 0, shared_fallbacks_ = 0;
};

/// FSDP's summon_full_params (read-only, scoped): while it lives, every unit of the model
/// holds its full parameters, so that code outside forward (sampling helpers, an orthogonal
/// regularizer, export) can read the modules' parameters as ordinary tensors.
///
/// Construction is a collective at stage 3 (one all-gather per unit that is not already
/// gathered; every rank must construct it at the same point); destruction is local and
/// frees what construction gathered. Memory: the whole model in the compute dtype on every
/// rank, so do not use it on a model that does not fit replicated. Writes into the
/// gathered parameters are not written back to the shards at stage 3 (they are discarded).
///
/// Outside such a scope (and outside a unit's forward/backward) a stage-3 parameter has no
/// memory behind it: its storage's data pointer is null, never a pointer to freed or stale
/// memory, so a direct read faults at once instead of returning old values. Read
/// parameters through ShardedUnit::param(), which throws std::logic_error when the unit
/// is not gathered, or inside a FullParameters scope.
class FullParameters {
 public:
  explicit FullParameters(ShardedModel& model);
  ~FullParameters();
  FullParameters(const FullParameters&) = delete;
  FullParameters& operator=(const FullParameters&) = delete;

 private:
  ShardedModel& model_;
  std::vector<ShardedUnit*> gathered_;
};

}  // namespace shardgan
