#pragma once
/// The GAN training loop: alternating D and G steps (DCGAN, Radford et al. 2016) with the
/// non-saturating loss (Goodfellow et al. 2014), both models sharded on their own.
#include <memory>
#include <string>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include "shardgan/checkpoint/checkpoint.h"
#include "shardgan/optim/sharded_adam.h"
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
  /// Collective (G forward). Writes a PNG grid from the fixed latent batch (rank 0 writes).
  std::string write_samples();

  int64_t step() const { return counters_.step; }
  ShardedModel& generator() { return *g_; }
  ShardedModel& discriminator() { return *d_; }
  /// Local accounting for one model, optimizer state included.
  MemoryStats memory_stats(ShardedModel& m) const;
  const TrainConfig& config() const { return cfg_; }

 private:
  at::Tensor draw_noise();  // the whole global latent batch (same on every rank)
  at::Tensor local_micro(const at::Tensor& global, int64_t micro) const;  // this rank's part
  void log_step(const StepMetrics& m);

  TrainConfig cfg_;
  Communicator& comm_;
  at::Tensor images_;
  std::unique_ptr<DistributedSampler> sampler_;
  std::unique_ptr<ShardedModel> g_, d_;
  std::unique_ptr<ShardedOptimizer> opt_g_, opt_d_;
  at::Generator noise_gen_;
  at::Tensor fixed_z_;
  TrainCounters counters_;
};

}  // namespace shardgan
