#pragma once
/// Learning-rate schedules, as pure functions of the step index (so that resuming from a
/// checkpoint needs only the optimizer's step count).
#include <cstdint>
#include <string>

namespace shardgan {

enum class LrScheduleKind { kConstant, kLinearWarmup, kCosine, kStep };
/// "constant", "linear_warmup", "cosine", "step".
const char* to_string(LrScheduleKind k);
/// Inverse of to_string; throws std::invalid_argument naming the accepted values.
LrScheduleKind parse_lr_schedule(const std::string& s);

/// Schedule options. `t` below is the 0-based index of the step about to be taken (the
/// optimizer's step_count() before it), and `base` the optimizer's base learning rate.
struct LrScheduleConfig {
  LrScheduleKind kind = LrScheduleKind::kConstant;
  /// linear_warmup, cosine, step: lr = base * (t + 1) / warmup_steps while t < warmup_steps
  /// (0: no warmup). Must be 0 for constant.
  int64_t warmup_steps = 0;
  /// cosine: lr = min_lr + (base - min_lr) * (1 + cos(pi * q)) / 2 with
  /// q = min(1, (t - warmup_steps) / (total_steps - warmup_steps)); needs total_steps > warmup_steps.
  int64_t total_steps = 0;
  double min_lr = 0.0;
  /// step: lr = base * gamma^floor((t - warmup_steps) / step_size) (PyTorch's StepLR).
  int64_t step_size = 0;
  double gamma = 0.1;
};

class LrSchedule {
 public:
  /// Throws std::invalid_argument (naming the field) for inconsistent options.
  LrSchedule(double base_lr, LrScheduleConfig cfg);
  /// Learning rate of the step with 0-based index t.
  double lr_at(int64_t t) const;
  double base_lr() const { return base_; }
  const LrScheduleConfig& config() const { return cfg_; }

 private:
  double base_;
  LrScheduleConfig cfg_;
};

}  // namespace shardgan
