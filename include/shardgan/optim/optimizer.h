#pragma once
/// Base class of optimizers that step on flat shards (ZeRO paper, Rajbhandari et al. 2020,
/// Sec. 5.1: each rank updates only the partition of the optimizer state it owns). Every
/// optimizer here is local: step() reads each unit's grad_shard() and writes its shard(),
/// with no communication, so a sharded step is the unsharded step restricted to the owned
/// elements. Gradient clipping and loss scaling, which need a collective, come before it
/// (clip_grad.h, loss_scaler.h).
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "shardgan/optim/lr_schedule.h"

namespace shardgan {

class ShardedModel;

/// A checkpoint's optimizer states for one unit, parameter by parameter (load_checkpoint
/// implements it over the checkpoint's files). Parameters are indexed in the unit's slot
/// order; elements in each parameter's own order. Reads throw CheckpointError.
class StateSource {
 public:
  virtual ~StateSource() = default;
  /// Whether the checkpoint holds state `name`.
  virtual bool has(const std::string& name) const = 0;
  /// The absmax block of parameter `param`'s `name` when stored as 8-bit codes; 0 when its
  /// values are stored as float32.
  virtual int64_t block(const std::string& name, size_t param) = 0;
  /// Elements [lo, hi) of parameter `param`'s `name` as float32 (dequantized when 8-bit).
  virtual void read_values(const std::string& name, size_t param, int64_t lo, int64_t hi, float* out) = 0;
  /// 8-bit only, lo a multiple of block(name, param): the codes of elements [lo, hi) and
  /// the absmax of blocks [lo / block, ceil(hi / block)), as stored.
  virtual void read_raw(const std::string& name, size_t param, int64_t lo, int64_t hi, uint8_t* codes,
                        float* absmax) = 0;
};

class ShardedOptimizer {
 public:
  /// `model` must outlive the optimizer; its units must not change afterwards. `lr` is the
  /// base learning rate (the schedule's peak).
  ShardedOptimizer(ShardedModel& model, double lr) : model_(model), lr_(lr), base_lr_(lr) {}
  virtual ~ShardedOptimizer() = default;
  ShardedOptimizer(const ShardedOptimizer&) = delete;
  ShardedOptimizer& operator=(const ShardedOptimizer&) = delete;

  /// Local (no communication): one update of every unit's shard() from its grad_shard().
  /// Elements of parameters whose requires_grad is off (frozen inside a unit) keep their
  /// value and their state, as torch::optim leaves a parameter without a gradient: every
  /// optimizer steps through that mask, offloaded ones included.
  /// If a schedule is set, first sets lr() to schedule().lr_at(step_count()); then
  /// increments step_count() and updates. Does not zero the gradients. The model then
  /// needs ShardedModel::after_optimizer_step() (all-gather at stages 1-2, compute-dtype
  /// copy with mixed precision) before its next forward.
  void step();

  /// The state tensors of unit `unit`, by stable name ("exp_avg", "exp_avg_sq", ...): each
  /// 1-D, shard_numel() elements, on the shard's device. Checkpoints store them under these
  /// names, so a name must not change once released. The tensors are live: writing into
  /// them restores state.
  virtual std::vector<std::pair<std::string, at::Tensor>> unit_state(size_t unit) = 0;

  /// Called with a state's name and a 1-D tensor of shard_numel() elements.
  using StateVisitor = std::function<void(const std::string& name, at::Tensor& state)>;
  /// The names unit_state() uses, in its order (the same for every unit).
  virtual std::vector<std::string> state_names();
  /// Local. Calls fn once per state of unit `unit`, in state_names() order, with its
  /// values: the live tensor when the state is resident, a transient copy read from the
  /// offload tier otherwise (one unit at a time, never a whole model's state). Checkpoint
  /// saves go through here.
  virtual void read_unit_state(size_t unit, const StateVisitor& fn);
  /// Local. Calls fn once per state of unit `unit` with a tensor that fn fills (the live
  /// tensor, or a transient one that is then written to the offload tier). Checkpoint
  /// loads go through here.
  virtual void write_unit_state(size_t unit, const StateVisitor& fn);

  /// A state a checkpoint stores as held (8-bit codes and absmax per parameter) instead
  /// of as a flat float32 tensor, with its code map.
  struct RawState {
    std::string name;
    bool signed_map = true;  ///< CodeMap::kSigned (m) or kUnsigned (v)
  };
  /// The states of state_names() that checkpoints store raw (none by default).
  virtual std::vector<RawState> raw_states() { return {}; }
  /// Elements per absmax block of the raw states (0 without raw states).
  virtual int64_t raw_state_block() const { return 0; }
  /// Called with a raw state's name, a parameter (slot index), the part ("codes", uint8;
  /// "absmax", float32, one per block counted from the parameter's first element; or
  /// "float32" for a parameter whose state is not quantized) and its values.
  using RawVisitor = std::function<void(const std::string& state, size_t param, const std::string& part,
                                        const at::Tensor& values)>;
  /// Local. For every raw state and every parameter with elements in this rank's shard of
  /// unit `unit`: the parts holding those elements, as stored (views, valid during fn).
  virtual void read_unit_raw(size_t unit, const RawVisitor& fn) {}
  /// Local. Restores unit `unit`'s states from `src` when either side stores raw states.
  /// The default fills write_unit_state's tensors parameter by parameter with float32
  /// values (padding 0). Throws CheckpointError (from src) or std::runtime_error naming a
  /// state the checkpoint lacks.
  virtual void load_unit_state(size_t unit, StateSource& src);

  /// "adam", "adamw", "sgd" or "rmsprop".
  virtual const char* type_name() const = 0;

  /// Optimizer steps taken (Adam's bias-correction count; the schedule's position).
  /// Restore it from a checkpoint with set_step_count.
  int64_t step_count() const { return step_; }
  void set_step_count(int64_t s) { step_ = s; }
  /// Learning rate of the last step (or the base rate before the first). With a schedule,
  /// step() overwrites whatever set_lr() put here.
  double lr() const { return lr_; }
  void set_lr(double lr) { lr_ = lr; }
  /// The base learning rate given at construction.
  double base_lr() const { return base_lr_; }
  /// Sets the learning-rate schedule applied by step() (relative to base_lr()).
  void set_schedule(const LrSchedule& s) { schedule_ = s; }
  const std::optional<LrSchedule>& schedule() const { return schedule_; }
  /// Bytes of optimizer state this rank holds in memory (sum over unit_state; for an
  /// offloaded optimizer, the host memory its tier uses).
  virtual int64_t state_bytes();
  /// Bytes of optimizer state this rank keeps on disk (0 unless offloaded to disk).
  virtual int64_t offloaded_bytes() { return 0; }
  ShardedModel& model() { return model_; }
  /// Wall seconds spent in update() since construction: the optimizer step's compute and,
  /// when offloaded, its I/O. Local bookkeeping.
  double update_seconds() const { return update_s_; }
  /// Of update_seconds(), the seconds spent waiting for the offload tier or staging copies
  /// (0 unless offloaded).
  virtual double update_io_seconds() const { return 0; }

 protected:
  /// The update itself: step_count() is already the 1-based index of this step and lr() its
  /// learning rate.
  virtual void update() = 0;
  /// Called after the frozen elements of unit `unit`'s shard were put back: an optimizer
  /// that keeps a derived copy of the shard (Adam's 16-bit param_copy) refreshes it.
  virtual void after_frozen_restore(size_t unit) {}
  /// Shard-local [lo, hi) ranges of frozen elements.
  using Ranges = std::vector<std::pair<int64_t, int64_t>>;
  /// Before update(): keeps what restore_frozen_state needs to put the state of unit
  /// `unit` at `ranges` back as it was. The default copies those elements of every state
  /// through read_unit_state; an optimizer whose stored bits do not survive a float32
  /// round trip (8-bit states) keeps its raw stores instead.
  virtual std::shared_ptr<void> keep_frozen_state(size_t unit, const Ranges& ranges);
  /// After update(): puts the kept state back at `ranges` (the default: through
  /// read_unit_state and write_unit_state).
  virtual void restore_frozen_state(size_t unit, const Ranges& ranges, const std::shared_ptr<void>& kept);

  ShardedModel& model_;
  int64_t step_ = 0;
  double lr_;
  double base_lr_;
  std::optional<LrSchedule> schedule_;
  double update_s_ = 0;
};

}  // namespace shardgan
