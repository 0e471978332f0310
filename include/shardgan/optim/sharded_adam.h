#pragma once
/// Adam (Kingma & Ba 2015) stepping only this rank's flat shards (ZeRO paper, Sec. 5.1:
/// each rank updates the optimizer state of the partition it owns).
#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "shardgan/optim/optimizer.h"

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
class ShardedAdam final : public ShardedOptimizer {
 public:
  /// Allocates exp_avg and exp_avg_sq (zeros, the shard's dtype) for every unit of `model`,
  /// which must outlive the optimizer. Throws std::invalid_argument on a bad hyperparameter.
  ShardedAdam(ShardedModel& model, AdamConfig cfg);

  /// Local: one Adam step on every unit's shard. Does not zero the gradients.
  void step() override;
  /// {"exp_avg", "exp_avg_sq"} of unit `unit`.
  std::vector<std::pair<std::string, at::Tensor>> unit_state(size_t unit) override;

  /// Per unit, first and second moments: 1-D, shard_numel() elements, shard dtype, CPU.
  std::vector<at::Tensor>& exp_avg() { return exp_avg_; }
  std::vector<at::Tensor>& exp_avg_sq() { return exp_avg_sq_; }
  const AdamConfig& config() const { return cfg_; }

 private:
  AdamConfig cfg_;
  std::vector<at::Tensor> exp_avg_, exp_avg_sq_;
};

}  // namespace shardgan
