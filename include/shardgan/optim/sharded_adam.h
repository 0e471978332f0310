#pragma once
/// Adam (Kingma & Ba 2015) stepping only this rank's flat shards (ZeRO paper, Sec. 5.1:
/// each rank updates the optimizer state of the partition it owns).
#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

namespace shardgan {

class ShardedModel;

struct AdamConfig {
  double lr = 2e-4;     ///< DCGAN's learning rate
  double beta1 = 0.5;   ///< DCGAN's beta1
  double beta2 = 0.999;
  double eps = 1e-8;
};

/// The update is torch::optim::Adam's (LibTorch 1.13, no weight decay, no amsgrad), applied
/// element-wise to each unit's shard() with its grad_shard(), so a sharded step is exactly
/// the unsharded step restricted to the owned elements.
class ShardedAdam {
 public:
  /// Allocates exp_avg and exp_avg_sq (zeros, the shard's dtype) for every unit of `model`,
  /// which must outlive the optimizer. Throws std::invalid_argument on a bad hyperparameter.
  ShardedAdam(ShardedModel& model, AdamConfig cfg);

  /// Local: one Adam step on every unit's shard. Does not zero the gradients.
  void step();

  /// Number of steps taken (the bias-correction step count).
  int64_t step_count() const { return step_; }
  void set_step_count(int64_t s) { step_ = s; }
  /// Per unit, first and second moments: 1-D, shard_numel() elements, shard dtype, CPU.
  std::vector<at::Tensor>& exp_avg() { return exp_avg_; }
  std::vector<at::Tensor>& exp_avg_sq() { return exp_avg_sq_; }
  /// Bytes of optimizer state this rank holds.
  int64_t state_bytes() const;
  const AdamConfig& config() const { return cfg_; }

 private:
  ShardedModel& model_;
  AdamConfig cfg_;
  int64_t step_ = 0;
  std::vector<at::Tensor> exp_avg_, exp_avg_sq_;
};

}  // namespace shardgan
