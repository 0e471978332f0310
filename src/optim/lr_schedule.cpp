#include "shardgan/optim/lr_schedule.h"

#include <cmath>
#include <stdexcept>

namespace shardgan {

const char* to_string(LrScheduleKind k) {
  switch (k) {
    case LrScheduleKind::kConstant: return "constant";
    case LrScheduleKind::kLinearWarmup: return "linear_warmup";
    case LrScheduleKind::kCosine: return "cosine";
    case LrScheduleKind::kStep: return "step";
  }
  return "?";
}

LrScheduleKind parse_lr_schedule(const std::string& s) {
  for (auto k : {LrScheduleKind::kConstant, LrScheduleKind::kLinearWarmup, LrScheduleKind::kCosine,
                 LrScheduleKind::kStep}) {
    if (s == to_string(k)) return k;
  }
  throw std::invalid_argument("Invalid learning-rate schedule '" + s +
                              "': expected constant, linear_warmup, cosine or step");
}

LrSchedule::LrSchedule(double base_lr, LrScheduleConfig cfg) : base_(base_lr), cfg_(cfg) {
  auto bad = [](const std::string& what) { throw std::invalid_argument("Invalid schedule: " + what); };
  if (cfg.warmup_steps < 0) bad("warmup_steps " + std::to_string(cfg.warmup_steps) + " < 0");
  if (cfg.kind == LrScheduleKind::kConstant && cfg.warmup_steps != 0) {
    bad("warmup_steps " + std::to_string(cfg.warmup_steps) + " with the constant schedule (use linear_warmup)");
  }
  if (cfg.kind == LrScheduleKind::kCosine && cfg.total_steps <= cfg.warmup_steps) {
    bad("cosine needs total_steps (" + std::to_string(cfg.total_steps) + ") > warmup_steps (" +
        std::to_string(cfg.warmup_steps) + ")");
  }
  if (cfg.kind == LrScheduleKind::kCosine && !(cfg.min_lr >= 0 && cfg.min_lr <= base_lr)) {
    bad("min_lr " + std::to_string(cfg.min_lr) + " must be in [0, lr]");
  }
  if (cfg.kind == LrScheduleKind::kStep && cfg.step_size < 1) {
    bad("step needs step_size >= 1, got " + std::to_string(cfg.step_size));
  }
  if (cfg.kind == LrScheduleKind::kStep && !(cfg.gamma > 0)) bad("gamma " + std::to_string(cfg.gamma) + " <= 0");
}

double LrSchedule::lr_at(int64_t t) const {
  const int64_t w = cfg_.warmup_steps;
  if (t < w) return base_ * static_cast<double>(t + 1) / static_cast<double>(w);
  switch (cfg_.kind) {
    case LrScheduleKind::kConstant:
    case LrScheduleKind::kLinearWarmup: return base_;
    case LrScheduleKind::kCosine: {
      const double q = std::min(1.0, static_cast<double>(t - w) / static_cast<double>(cfg_.total_steps - w));
      return cfg_.min_lr + (base_ - cfg_.min_lr) * 0.5 * (1.0 + std::cos(M_PI * q));
    }
    case LrScheduleKind::kStep:
      return base_ * std::pow(cfg_.gamma, static_cast<double>((t - w) / cfg_.step_size));
  }
  return base_;
}

}  // namespace shardgan
