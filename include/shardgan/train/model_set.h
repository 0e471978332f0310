#pragma once
/// The trained state of one job: G and D (sharded, each on its own communicator), their
/// optimizers and loss scalers, G's EMA, and the groups the models run on (split
/// placement's G and D groups, HSDP replica groups, hpZ secondary groups). The Trainer
/// owns one and keeps only the loop; the step executor, the checkpoint manager and the
/// periodic actions read the models through it.
///
/// Construction is two-phase so that the data pipeline can be built between the two (it
/// needs this rank's group, and a missing dataset should fail before the models are built):
/// the constructor splits the groups, build() builds the models.
#include <array>
#include <map>
#include <string>
#include <memory>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "shardgan/checkpoint/checkpoint.h"
#include "shardgan/models/family.h"
#include "shardgan/optim/loss_scaler.h"
#include "shardgan/optim/optimizer.h"
#include "shardgan/optim/sharded_ema.h"
#include "shardgan/sharding/sharded_model.h"
#include "shardgan/train/config.h"
#include "shardgan/train/objective.h"  // TrainedModel
#include "shardgan/train/split_placement.h"

namespace shardgan {

/// Seconds spent in a step's parts, summed over the models this rank holds (CommTimes and
/// the optimizers' clocks; monotonic totals since construction).
struct ModelSetTimes {
  double collective_s = 0;     ///< waits for the models' collectives
  double offload_read_s = 0;   ///< parameter-offload reads on the compute thread
  double optimizer_s = 0;      ///< optimizer updates
  double optimizer_io_s = 0;   ///< the optimizers' offload tier I/O
  double offload_grad_s = 0;   ///< waits for gradient-offload writes
};

/// Collective bytes so far, as this rank's CommStats count them (sum of all-gather,
/// reduce-scatter, all-reduce, broadcast and all-to-all bytes).
struct ModelSetCommBytes {
  int64_t world = 0;        ///< the world communicator
  int64_t shard_group = 0;  ///< the models' HSDP shard groups (0 without HSDP)
  int64_t replicate = 0;    ///< the models' HSDP replica groups (0 without HSDP)
  int64_t secondary = 0;    ///< the hpZ secondary groups (0 without hpZ)
};

class ModelSet {
 public:
  /// Collective over `world` when any group is split: train.placement split (the G and D
  /// groups; ConfigError naming the key when the world size, placement.generator_ranks or
  /// the micro-batch does not allow it), then, per model this rank holds, the HSDP replica
  /// groups (sharding.<model>.replicate_degree != 1) and the hpZ secondary groups
  /// (sharding.<model>.hpz_partition_size != 1) over the ranks the model runs on (under
  /// split placement its group's only). Builds no model. `cfg`, `world` and `family` must
  /// outlive the set.
  ModelSet(const TrainConfig& cfg, Communicator& world, const ModelFamily& family);
  /// Destroys the EMA, then the models, then the optimizers (with parameter offload the
  /// models' units read master shards from the optimizer), then the groups.
  ~ModelSet();
  ModelSet(const ModelSet&) = delete;
  ModelSet& operator=(const ModelSet&) = delete;

  /// Collective (deferred sharded initialization: each unit is built, initialized and
  /// sharded in turn over the model's communicator; under split placement also one world
  /// all-reduce of the two models' sizes). Builds the models this rank holds with their
  /// optimizers (seeds cfg.seed + 1 for G, + 2 for D), both loss scalers and, with
  /// ema.enabled, G's EMA. With offload.param the optimizer's store is made first and each
  /// unit's master shard moves into it as the unit is built. Call once.
  void build();

  bool split() const { return split_ != nullptr; }
  bool holds_generator() const { return holds_g_; }
  bool holds_discriminator() const { return holds_d_; }
  /// The communicator of the real batches, SyncBatchNorm and evaluation: the world's, or
  /// under split placement this rank's group.
  Communicator& batch_comm() { return group_comm_ ? *group_comm_ : world_; }
  /// Split placement's transport, or nullptr under shared placement.
  SplitPlacement* split_placement() { return split_.get(); }

  /// null when this rank does not hold the model (split placement) or before build().
  ShardedModel* generator() { return g_.get(); }
  ShardedModel* discriminator() { return d_.get(); }
  ShardedOptimizer* generator_optimizer() { return opt_g_.get(); }
  /// G's EMA, or nullptr without ema.enabled (or on D's ranks).
  ShardedEma* ema() { return ema_.get(); }
  /// What a step executor runs: {model, optimizer, scaler}; model and optimizer are null
  /// for the model this rank does not hold.
  TrainedModel generator_side() { return {g_.get(), opt_g_.get(), scaler_g_.get()}; }
  TrainedModel discriminator_side() { return {d_.get(), opt_d_.get(), scaler_d_.get()}; }
  /// The models this rank holds, G first.
  std::vector<ShardedModel*> held();

  /// Both models' parameter counts, on every rank (whichever it holds); 0 before build().
  int64_t generator_numel() const { return g_numel_; }
  int64_t discriminator_numel() const { return d_numel_; }

  /// Local accounting of a model this set holds, optimizer state included; zeros for a
  /// null model (one this rank does not hold).
  MemoryStats memory_stats(ShardedModel* m) const;
  MemoryStats generator_stats() const { return memory_stats(g_.get()); }
  MemoryStats discriminator_stats() const { return memory_stats(d_.get()); }

  /// Local. Monotonic totals; a step's figures are the difference around it.
  ModelSetTimes times() const;
  ModelSetCommBytes comm_bytes() const;

  /// What a checkpoint saves and loads: the models this rank holds with their optimizers
  /// (G's EMA as the extra "ema"); under split placement D is led by D's lowest rank.
  std::vector<ModelAndOptimizer> checkpoint_models();
  /// The loss scalers' state as checkpoint scalars named "g.<key>" and "d.<key>".
  void put_scaler_state(std::map<std::string, double>& scalars) const;
  /// Restores the loss scalers from put_scaler_state's scalars (missing keys keep defaults).
  void load_scaler_state(const std::map<std::string, double>& scalars);

  /// Local. Copies of the named buffers of the models this rank holds, G's then D's (what
  /// an abandoned step gives back, train.preempt_grace_s).
  std::vector<at::Tensor> clone_buffers();
  /// Local. Clears each held model's half-done step (ShardedModel::abandon_step) and copies
  /// `buffers` (from clone_buffers) back. Throws std::out_of_range on a short list.
  void abandon_step(const std::vector<at::Tensor>& buffers);

 private:
  /// train.placement split: checks the config against the world size, splits off this
  /// rank's group and returns whether this rank holds G (ConfigError naming the key).
  bool make_split_placement();
  std::pair<std::unique_ptr<ShardedModel>, std::unique_ptr<ShardedOptimizer>> build_model_and_optimizer(
      const ModelSpec& spec, Communicator& comm, const ShardingConfig& sc, const OptimizerConfig& oc, uint64_t seed);
  Communicator& g_comm() { return g_comm_ ? *g_comm_ : batch_comm(); }
  Communicator& d_comm() { return d_comm_ ? *d_comm_ : batch_comm(); }

  const TrainConfig& cfg_;
  Communicator& world_;
  const ModelFamily& family_;
  bool holds_g_ = true, holds_d_ = true;
  // Declared before the models so that they are destroyed after them.
  std::unique_ptr<Communicator> group_comm_;       // split placement: this rank's group
  std::unique_ptr<SplitPlacement> split_;          // split placement's transport
  std::unique_ptr<Communicator> g_comm_, d_comm_;  // HSDP groups
  std::unique_ptr<Communicator> g_hpz_, d_hpz_;    // hpZ secondary groups
  std::unique_ptr<ShardedOptimizer> opt_g_, opt_d_;
  std::unique_ptr<ShardedModel> g_, d_;
  std::unique_ptr<DynamicLossScaler> scaler_g_, scaler_d_;
  std::unique_ptr<ShardedEma> ema_;
  int64_t g_numel_ = 0, d_numel_ = 0;
};

}  // namespace shardgan
