#pragma once
/// Parameter offload at ZeRO stage 3 (ZeRO-Infinity, Rajbhandari et al. 2021, Sec. 5.1;
/// DeepSpeed's offload_param): a unit's master shard lives in an offload tier (host memory
/// or disk) between steps instead of with the unit. The tier implements this interface;
/// the unit reads its shard from it when it starts an all-gather (ShardedUnit::prefetch
/// or gather) and never keeps it. The optimizer that owns the tier updates it in place.
#include <cstddef>

#include <ATen/core/Tensor.h>

namespace shardgan {

class ShardSource {
 public:
  virtual ~ShardSource() = default;
  /// Local. Fills `dst` (1-D, the unit's shard_numel() elements, its master dtype, CPU,
  /// contiguous) with the master shard of unit `unit` (its index in the model). Throws
  /// OffloadError (offload/direct_file.h) when the tier cannot be read.
  virtual void read_shard(size_t unit, at::Tensor& dst) = 0;
  /// Local. Replaces the master shard of unit `unit` with `src` (same shape and dtype).
  virtual void write_shard(size_t unit, const at::Tensor& src) = 0;
};

}  // namespace shardgan
