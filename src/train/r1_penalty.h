#pragma once
// The R1 penalty's forward (Mescheder et al. 2018, Eq. 9), shared by R1 folded into D's
// update (GanObjective::d_real_pass) and R1 as an update of its own (GanObjective::d_reg).
// Private to src/train.
#include <functional>

#include <ATen/core/Tensor.h>

#include "shardgan/sharding/sharded_unit.h"

namespace shardgan {

class ShardedModel;

/// D's forward on the real micro-batch `real` ({x, y}) with x a fresh leaf, and the penalty
/// (gamma / 2) mean_i |d sum(D(x)) / dx_i|^2 (per-sample squared norm, averaged over the
/// local batch) with its graph kept (create_graph), so that a backward through it
/// differentiates D's parameters a second time. `out` is D's outputs, `logits` its logits
/// [B] in `md`. Local. The caller holds D gathered whole (ShardedModel::begin_higher_order)
/// from before this call to that backward. With `augment` (ADA), D sees augment(x): the
/// penalty is on the gradient with respect to the images before their augmentation.
struct R1Forward {
  TensorList out;
  at::Tensor logits, penalty;
};
R1Forward r1_forward(ShardedModel& d, const TensorList& real, at::ScalarType md, double gamma,
                     const std::function<at::Tensor(const at::Tensor&)>& augment = {});

}  // namespace shardgan
