#pragma once
/// The GAN training loop: alternating D and G steps (DCGAN, Radford et al. 2016) with the
/// non-saturating loss (Goodfellow et al. 2014), both models sharded on their own.
#include <memory>
#include <string>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include "shardgan/checkpoint/checkpoint.h"
#include "shardgan/optim/loss_scaler.h"
#include "shardgan/optim/optimizer.h"
#include "shardgan/optim/sharded_ema.h"
#include "shardgan/sharding/sharded_model.h"
#include "shardgan/train/config.h"
#include "shardgan/train/data.h"

namespace shardgan {

/// Global-batch averages of one step (identical on every rank).
struct StepMetrics {
  int64_t step = 0;          ///< steps done after this one
  double loss_d = 0, loss_g = 0;
  double d_real = 0, d_fake = 0;  ///< mean D(x) and D(G(z)) as probabilities, D step
  double step_time_s = 0;         ///< wall time of the step on rank 0 (seconds)
  double grad_norm_d = 0, grad_norm_g = 0;  ///< global gradient norms (0 unless clipping)
  bool skipped_d = false, skipped_g = false;  ///< step skipped (float16 overflow, inf norm)
  double loss_scale_d = 1, loss_scale_g = 1;  ///< current loss scales (1 unless float16)
};

class Trainer {
 public:
  /// Builds G, D, their optimizers and the sampler. `images` ([N, 1, 32, 32], the model
  /// dtype) may be undefined: then the dataset named in the config is loaded (DataError
  /// if it is missing). Collective only in that every rank must construct it.
  Trainer(TrainConfig cfg, Communicator& comm, at::Tensor images = {});
  ~Trainer();

  /// Collective. One D step then one G step on the next global batch.
  StepMetrics train_step();

  /// Collective. Trains until step() == cfg.steps, logging, sampling and checkpointing
  /// as configured, and always saving a final checkpoint and sample grid.
  void run();

  /// Collective. Saves a checkpoint of the current state; returns its directory.
  std::string save();
  /// Collective. Restores from what `--resume` names (see resolve_checkpoint_dir).
  void resume(const std::string& path);
  /// Collective (G forward). Writes a PNG grid from the fixed latent batch (rank 0 writes),
  /// and a second one from G's EMA when ema.enabled. Returns the first grid's path.
  std::string write_samples();

  int64_t step() const { return counters_.step; }
  /// The generator's EMA, or nullptr when ema.enabled is false.
  ShardedEma* ema() { return ema_.get(); }
  ShardedModel& generator() { return *g_; }
  ShardedModel& discriminator() { return *d_; }
  /// Local accounting for one model, optimizer state included.
  MemoryStats memory_stats(ShardedModel& m) const;
  const TrainConfig& config() const { return cfg_; }

 private:
  /// Collective: unscale and vote (float16), clip, then step, post-step all-gather and
  /// zero the gradients of `m`. Returns whether the optimizer stepped.
  bool finish_step(ShardedModel& m, ShardedOptimizer& opt, DynamicLossScaler& scaler, double& norm);
  std::vector<ModelAndOptimizer> checkpoint_models();
  at::Tensor draw_noise();  // the whole global latent batch (same on every rank)
  at::Tensor local_micro(const at::Tensor& global, int64_t micro) const;  // this rank's part
  void log_step(const StepMetrics& m);

  TrainConfig cfg_;
  Communicator& comm_;
  at::Tensor images_;
  std::unique_ptr<DistributedSampler> sampler_;
  std::unique_ptr<ShardedModel> g_, d_;
  std::unique_ptr<ShardedOptimizer> opt_g_, opt_d_;
  std::unique_ptr<DynamicLossScaler> scaler_g_, scaler_d_;
  std::unique_ptr<ShardedEma> ema_;
  at::Generator noise_gen_;
  at::Tensor fixed_z_;
  TrainCounters counters_;
};

}  // namespace shardgan
