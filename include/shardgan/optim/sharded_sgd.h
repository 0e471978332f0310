#pragma once
/// SGD with momentum and Nesterov momentum (Sutskever et al. 2013, in PyTorch's form)
/// stepping only this rank's flat shards.
#include <vector>

#include <ATen/core/Tensor.h>

#include "shardgan/optim/optimizer.h"

namespace shardgan {

struct SgdConfig {
  double lr = 1e-2;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;  ///< needs momentum > 0 and dampening == 0 (as torch)
};

/// torch::optim::SGD's update (LibTorch 2.15 and 1.13):
///   g' = g + wd*p
///   buf = g' on the first step, else momentum*buf + (1-dampening)*g'
///   d = g' + momentum*buf (Nesterov) | buf;   p -= lr*d
/// Without momentum there is no state and d = g'.
class ShardedSgd final : public ShardedOptimizer {
 public:
  /// Allocates momentum_buffer (zeros, shard dtype and device) per unit when momentum != 0.
  /// Throws std::invalid_argument on a bad hyperparameter.
  ShardedSgd(ShardedModel& model, SgdConfig cfg);
  /// {"momentum_buffer"} when momentum != 0, else nothing.
  std::vector<std::pair<std::string, at::Tensor>> unit_state(size_t unit) override;
  const char* type_name() const override { return "sgd"; }
  const SgdConfig& config() const { return cfg_; }

 protected:
  void update() override;

 private:
  SgdConfig cfg_;
  std::vector<at::Tensor> buf_;
};

}  // namespace shardgan
