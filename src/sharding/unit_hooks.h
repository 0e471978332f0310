#pragma once
// The runtime hooks of one sharding unit (FSDP2's FSDPState and the pre/post-forward and
// backward hooks of FSDPParamGroup): the forward wrapper, the pre-backward gather and
// prefetch, and the release and gradient staging once the unit's backward is done. They
// decide when the collectives (unit_collectives.h) run. Private to ShardedUnit; the public
// contracts are on its methods (sharded_unit.h).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "shardgan/sharding/sharding_config.h"
#include "sharding/unit_runtime.h"

namespace torch::nn {
class Module;
}

namespace shardgan {

class FlatParam;
class ShardedModel;
class ShardedUnit;

namespace detail {

class UnitCollectives;

class UnitHooks {
 public:
  /// Registers a gradient-ready hook on every trainable parameter of `flat`. The references
  /// are the unit's own members and outlive this object.
  UnitHooks(ShardedUnit& unit, const std::string& name, torch::nn::Module& module,
            const CheckpointedForward& forward, FlatParam& flat, UnitCollectives& coll,
            const ShardingConfig& cfg, ShardedModel* owner);
  /// Drops the gradient-ready hooks: a graph may outlive the unit.
  ~UnitHooks();
  UnitHooks(const UnitHooks&) = delete;
  UnitHooks& operator=(const UnitHooks&) = delete;

  /// ShardedUnit::forward.
  TensorList forward(const TensorList& inputs);
  /// The first output gradient of this backward reached the unit: gather, prefetch the
  /// previous unit, and count what must arrive before the unit is done.
  void on_pre_backward();
  /// A trainable parameter's gradient, or an input's, is final.
  void on_backward_part_done();
  /// ShardedUnit::finish_backward.
  void finish_backward();
  /// ShardedUnit::abandon's part: forgets the backward in progress.
  void reset();
  /// Whether the last forward left this unit a backward to run.
  bool expects_backward() const { return expects_backward_; }
  void set_plain(bool on) { plain_ = on; }

 private:
  ShardedUnit& unit_;
  const std::string& name_;
  torch::nn::Module& module_;
  const CheckpointedForward& forward_;
  FlatParam& flat_;
  UnitCollectives& coll_;
  const ShardingConfig& cfg_;
  ShardedModel* owner_;

  std::vector<std::shared_ptr<void>> accumulators_;  // gradient-ready hooks (GradReadyHookHandle)
  bool expects_backward_ = false;  // last forward's output required grad
  bool backward_armed_ = false;
  bool plain_ = false;
  int pending_grads_ = 0;
  int input_grads_expected_ = 0;  // inputs that required grad in forwards since the last backward
};

}  // namespace detail
}  // namespace shardgan
