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
  /// StyleGAN2-ADA's form (its training loop's ema_kimg and ema_rampup; Karras et al. 2020,
  /// arXiv:2006.06676): above 0, the decay is set by a half-life in images instead of
  /// `decay`: step t (1-based) uses beta = 0.5^(batch / max(n, 1e-8)) with n =
  /// half_life_kimg * 1000, or with rampup > 0 the smaller of that and rampup * (t - 1) *
  /// batch, the images seen before the step (so the first step copies the weights).
  double half_life_kimg = 0;
  double rampup = 0;   ///< ramp-up of the half-life, as a fraction of the images seen (0: off)
  int64_t batch = 0;   ///< images per step (train.global_batch); needed with half_life_kimg
  /// The decay step `step` (1-based) applies: `decay`, or the half-life form above. Pure.
  double decay_at(int64_t step) const;
};

class ShardedEma {
 public:
  /// Allocates one [S] tensor per unit, initialized to the current shard(). It is float32
  /// for bfloat16/float16 shards (a 0.9999 average does not move in 8 mantissa bits), else
  /// the shard's dtype; the shard's device. `model` must outlive the EMA. Throws
  /// std::invalid_argument for a decay outside [0, 1], a negative half-life or ramp-up, or a
  /// half-life without a batch > 0.
  ShardedEma(ShardedModel& model, EmaConfig cfg);

  /// Local. Call after training step `step` (1-based: the steps done): ema = shard when
  /// step < start_step, else ema = d*ema + (1-d)*shard with d = config().decay_at(step).
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
