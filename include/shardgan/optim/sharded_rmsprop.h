#pragma once
/// RMSprop (Tieleman & Hinton 2012; centered form from Graves 2013) stepping only this
/// rank's flat shards.
#include <vector>

#include <ATen/core/Tensor.h>

#include "shardgan/optim/optimizer.h"

namespace shardgan {

struct RmspropConfig {
  double lr = 1e-2;
  double alpha = 0.99;  ///< smoothing constant of the squared-gradient average
  double eps = 1e-8;
  double weight_decay = 0.0;
  double momentum = 0.0;
  bool centered = false;
};

/// torch::optim::RMSprop's update (LibTorch 2.15 and 1.13):
///   g' = g + wd*p;  sq = alpha*sq + (1-alpha)*g'^2
///   centered: ga = alpha*ga + (1-alpha)*g';  avg = sqrt(sq - ga^2) + eps,  else sqrt(sq) + eps
///   momentum > 0: buf = momentum*buf + g'/avg; p -= lr*buf,  else p -= lr*g'/avg
class ShardedRmsprop final : public ShardedOptimizer {
 public:
  /// Allocates the state (zeros, shard dtype and device). Throws std::invalid_argument on a
  /// bad hyperparameter.
  ShardedRmsprop(ShardedModel& model, RmspropConfig cfg);
  /// {"square_avg"}, plus "momentum_buffer" when momentum > 0 and "grad_avg" when centered.
  std::vector<std::pair<std::string, at::Tensor>> unit_state(size_t unit) override;
  const char* type_name() const override { return "rmsprop"; }
  const RmspropConfig& config() const { return cfg_; }

 protected:
  void update() override;

 private:
  RmspropConfig cfg_;
  std::vector<at::Tensor> sq_, buf_, gavg_;
};

}  // namespace shardgan
