#pragma once
/// Dynamic loss scaling for float16 training (Micikevicius et al. 2018, Sec. 3.2), with
/// DeepSpeed's window and hysteresis (deepspeed/runtime/fp16/loss_scaler.py,
/// DynamicLossScaler) and the defaults of its fp16 config section.
#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

namespace shardgan {

class Communicator;
class ShardedModel;

struct LossScalerConfig {
  double init_scale = 65536.0;     ///< 2^16 (DeepSpeed initial_scale_power 16)
  double growth_factor = 2.0;      ///< scale *= growth_factor after a clean window
  double backoff_factor = 0.5;     ///< scale *= backoff_factor on an overflow (hysteresis spent)
  int64_t growth_interval = 1000;  ///< clean steps in a row before growing (loss_scale_window)
  int64_t hysteresis = 2;          ///< overflows absorbed before backing off (delayed shift)
  /// true: every clean step refills the hysteresis; false (DeepSpeed's default): only growth
  /// refills it.
  bool consecutive_hysteresis = false;
  double min_scale = 1.0;
  double max_scale = 16777216.0;   ///< 2^24
};

/// Active only when the compute dtype is float16; for bfloat16, float32 and float64 the
/// scale is 1, scale_loss is the identity, and unscale_and_vote steps every time without
/// any collective.
class DynamicLossScaler {
 public:
  /// Throws std::invalid_argument for a non-positive scale, factors outside (1, inf) for
  /// growth and (0, 1) for backoff, or growth_interval/hysteresis < 1.
  DynamicLossScaler(LossScalerConfig cfg, c10::ScalarType compute_dtype);

  bool enabled() const { return enabled_; }
  /// The current loss scale (1 when disabled).
  double scale() const { return enabled_ ? scale_ : 1.0; }
  /// loss * scale() (a new tensor; the loss itself when disabled).
  at::Tensor scale_loss(const at::Tensor& loss) const;

  /// Collective when enabled: exactly one all_reduce (MAX, one float32 element) on `comm`.
  /// Multiplies every grad_shard() of `models` by 1/scale(), checks them for inf/NaN,
  /// and takes the vote: any rank's overflow is everyone's. Then updates the scale
  /// (update()). Returns true when the optimizer should step, false when every rank must
  /// skip it (the gradients are then garbage; zero them). Local and always true when
  /// disabled.
  bool unscale_and_vote(const std::vector<ShardedModel*>& models, Communicator& comm);

  /// Local: the scale rule given the agreed overflow flag. On overflow, the hysteresis is
  /// spent first (one per overflow); when it is down to 1, scale *= backoff_factor
  /// (not below min_scale). After growth_interval clean steps since the last overflow (or
  /// the last growth), scale *= growth_factor (not above max_scale) and the hysteresis is
  /// refilled.
  void update(bool overflow);

  /// Steps skipped so far (overflows).
  int64_t skipped_steps() const { return skipped_; }

  /// State for checkpoints (TrainCounters::scalars): "loss_scale", "loss_scale_good_steps",
  /// "loss_scale_hysteresis", "loss_scale_skipped".
  std::vector<std::pair<std::string, double>> state() const;
  /// Restores what state() returned; unknown names are ignored, missing ones kept.
  void load_state(const std::vector<std::pair<std::string, double>>& s);

 private:
  LossScalerConfig cfg_;
  bool enabled_;
  double scale_;
  int64_t good_steps_ = 0;  // clean steps since the last overflow or growth
  int64_t hysteresis_left_;
  int64_t skipped_ = 0;
};

}  // namespace shardgan
