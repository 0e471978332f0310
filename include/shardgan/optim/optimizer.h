#pragma once
/// Base class of optimizers that step on flat shards (ZeRO paper, Sec. 5.1: each rank
/// updates only the partition of the optimizer state it owns).
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace shardgan {

class ShardedModel;

class ShardedOptimizer {
 public:
  /// `model` must outlive the optimizer; its units must not change afterwards.
  ShardedOptimizer(ShardedModel& model, double lr) : model_(model), lr_(lr) {}
  virtual ~ShardedOptimizer() = default;

  /// Local (no communication): one update of every unit's shard() from its grad_shard().
  /// Does not zero the gradients.
  virtual void step() = 0;

  /// The state tensors of unit `unit`, by stable name ("exp_avg", "exp_avg_sq", ...): each
  /// 1-D, shard_numel() elements, on the shard's device. Checkpoints store them under these
  /// names, so a name must not change once released. The tensors are live: writing into
  /// them restores state.
  virtual std::vector<std::pair<std::string, at::Tensor>> unit_state(size_t unit) = 0;

  /// Optimizer steps taken (Adam's bias-correction count).
  int64_t step_count() const { return step_; }
  void set_step_count(int64_t s) { step_ = s; }
  /// Current learning rate; a schedule sets it before each step.
  double lr() const { return lr_; }
  void set_lr(double lr) { lr_ = lr; }
  /// Bytes of optimizer state this rank holds (sum over unit_state).
  int64_t state_bytes();
  ShardedModel& model() { return model_; }

 protected:
  ShardedModel& model_;
  int64_t step_ = 0;
  double lr_;
};

}  // namespace shardgan
