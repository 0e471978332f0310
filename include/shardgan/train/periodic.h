#pragma once
/// What a training run does between steps: metrics lines, sample grids and the schedule of
/// checkpoints (the trainer's loop calls these; the GAN step itself is in objective.h).
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "shardgan/sharding/sharded_model.h"
#include "shardgan/train/objective.h"

namespace shardgan {

class ShardedEma;
struct TrainConfig;

class PeriodicActions {
 public:
  /// `cfg` and `comm` must outlive this object. Rank 0 of `comm` logs the config's warnings
  /// (TrainConfig::warnings: keys set that have no effect) once, here, unless `comm` is the
  /// memory probe's stand-in world (backend "shadow", built on every rank). Local.
  PeriodicActions(const TrainConfig& cfg, Communicator& comm);

  /// Whether step `step` (steps done) logs, samples or checkpoints. Local.
  bool log_due(int64_t step) const;
  bool sample_due(int64_t step) const;
  bool checkpoint_due(int64_t step) const;

  /// Local (rank 0 writes). Prints one line and appends one JSON object to
  /// <run>/metrics.jsonl, with the model-state bytes of G and D (this rank's accounting)
  /// and this process's peak RSS (VmHWM, bytes).
  void log_step(const StepMetrics& m, int64_t g_state_bytes, int64_t d_state_bytes) const;

  /// Local (rank 0 writes). Logs an evaluation record (Trainer::evaluate: step, fid,
  /// class_acc, fid_ema, class_acc_ema, eval_samples, eval_time_s) and appends it to
  /// <run>/metrics.jsonl as its own line.
  void log_eval(const nlohmann::json& record) const;

  /// Collective (G forward on every rank). Writes <run>/samples/samples-step-XXXXXXXX.png
  /// from G on `inputs` ({z, y} of the fixed sample batch), and samples-ema-step-*.png from
  /// G's EMA when `ema` is given; rank 0 writes the files. Sampling runs in train mode (as
  /// DCGAN's and BigGAN's reference code do for BatchNorm) and restores every buffer
  /// (BatchNorm running statistics, spectral-norm u vectors), so that it never changes
  /// training. `nrow` images per grid row (a class per row for conditional models).
  /// Returns the first grid's path.
  std::string write_samples(ShardedModel& g, ShardedEma* ema, const TensorList& inputs,
                            int64_t step, int nrow) const;

 private:
  const TrainConfig& cfg_;
  Communicator& comm_;
};

/// Collective (one all-gather). Gathers every rank's peak RSS (VmHWM) and, on rank 0,
/// logs it per rank and summed, and writes <run>/memory.json: world size, the measured
/// peak RSS per rank and summed (bytes), G's and D's model-state accounting on rank 0
/// (MemoryStats, bytes) and `preflight` (the estimate, may be null). The OS measurement
/// is the evidence; the accounting and the estimate are printed next to it. Returns the
/// peak RSS of every rank (bytes, index = rank), on every rank. `training_peak` (may be
/// empty) is gather_peak_rss() taken after the last training step and before the final
/// save, evaluation and sample grid; it is stored as peak_rss_bytes_per_rank_training.
std::vector<int64_t> report_memory(const TrainConfig& cfg, Communicator& comm, const MemoryStats& g,
                   const MemoryStats& d, const nlohmann::json& preflight,
                   const std::vector<int64_t>& training_peak = {});

/// Collective (one all-gather): every rank's peak RSS (VmHWM) so far, bytes, index = rank.
std::vector<int64_t> gather_peak_rss(Communicator& comm);

/// This process's peak resident set size (VmHWM from /proc/self/status), bytes; 0 if
/// unreadable.
int64_t peak_rss_bytes();

}  // namespace shardgan
