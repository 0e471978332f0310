#pragma once
/// Gradient offload at ZeRO stages 2 and 3 (ZeRO-Infinity, Rajbhandari et al. 2021,
/// Sec. 5.1: gradients, like parameters and optimizer state, live in host memory or on
/// NVMe; DeepSpeed streams the reduced fp32 gradient partitions to the swap files): a
/// unit's reduced gradient shard goes to an offload tier as its reduce-scatter completes,
/// instead of staying with the unit until the optimizer step. The tier implements this
/// interface; the optimizer that owns it reads the gradients from there in its step.
#include <cstddef>

#include <ATen/core/Tensor.h>

namespace shardgan {

class GradSink {
 public:
  virtual ~GradSink() = default;
  /// Local. Adds `reduced` (1-D, the unit's shard_numel() elements, any floating dtype,
  /// CPU, contiguous) times `scale`, converted to the master dtype, into the gradient
  /// shard of unit `unit` (its index in the model). With `first` the shard starts from
  /// zero instead of its stored values (it was released since the last step): the same
  /// operations, and so the same bits, as a resident shard allocated as zeros. Throws
  /// OffloadError (offload/direct_file.h) when the tier cannot be read or written.
  virtual void accumulate_grad(size_t unit, const at::Tensor& reduced, double scale, bool first) = 0;
  /// Local. Fills `dst` ([S], master dtype, CPU, contiguous) with unit `unit`'s stored
  /// gradient shard. Throws OffloadError as accumulate_grad.
  virtual void read_grad(size_t unit, at::Tensor& dst) = 0;
  /// Local. Replaces unit `unit`'s stored gradient shard with `src` (same shape and dtype).
  virtual void write_grad(size_t unit, const at::Tensor& src) = 0;
};

}  // namespace shardgan
