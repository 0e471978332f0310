#pragma once
/// Exponential moving average of a model's weights, kept sharded like the weights
/// themselves: each rank averages only the shard it owns (no communication). BigGAN
/// (Brock et al. 2019, Sec. 4 and App. C) samples from the EMA of G with decay 0.9999,
/// starting at a given iteration (before it, the EMA copies the weights).
#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

namespace shardgan {

class ShardedModel;

struct EmaConfig {
  double decay = 0.9999;   ///< BigGAN's
  /// Steps before this one copy the weights instead of averaging (BigGAN's ema_start).
  int64_t start_step = 0;
};

class ShardedEma {
 public:
  /// Allocates one [S] tensor per unit, initialized to the current shard(). It is float32
  /// for bfloat16/float16 shards (a 0.9999 average does not move in 8 mantissa bits), else
  /// the shard's dtype; the shard's device. `model` must outlive the EMA. Throws
  /// std::invalid_argument for a decay outside [0, 1].
  ShardedEma(ShardedModel& model, EmaConfig cfg);

  /// Local. Call after the optimizer step numbered `step` (1-based, e.g. step_count()):
  /// ema = shard when step < start_step, else ema = decay*ema + (1-decay)*shard.
  void update(int64_t step);

  /// Copies the EMA into every unit's shard(), keeping the live weights aside (one more
  /// copy of the shards until swap_out), then calls ShardedModel::after_optimizer_step() so
  /// that the full parameters show it: a collective at stages 1 and 2 (all-gather), local
  /// at stages 0 and 3. Sample in between; the EMA itself is not changed.
  /// Throws std::logic_error if already swapped in, or if a stage-3 unit is gathered (its
  /// gathered copy would be stale): swap between steps.
  void swap_in();
  /// Puts the live weights back, bit for bit (collective at stages 1 and 2, as swap_in).
  /// Throws std::logic_error if not swapped in.
  void swap_out();
  /// Whether the EMA weights are currently swapped into the model.
  bool swapped() const { return swapped_; }

  /// Unit `unit`'s EMA: 1-D, shard_numel() elements; live (checkpoints read and write it,
  /// under the name "ema").
  at::Tensor& unit_shard(size_t unit) { return ema_.at(unit); }
  const EmaConfig& config() const { return cfg_; }

 private:
  ShardedModel& model_;
  EmaConfig cfg_;
  std::vector<at::Tensor> ema_;
  std::vector<at::Tensor> saved_;  // live shards while swapped in
  bool swapped_ = false;
};

/// RAII: swaps the EMA in for a scope (e.g. for sampling) and back out at its end.
class EmaSwap {
 public:
  explicit EmaSwap(ShardedEma& ema) : ema_(ema) { ema_.swap_in(); }
  ~EmaSwap() { ema_.swap_out(); }
  EmaSwap(const EmaSwap&) = delete;
  EmaSwap& operator=(const EmaSwap&) = delete;

 private:
  ShardedEma& ema_;
};

}  // namespace shardgan
