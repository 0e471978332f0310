#pragma once
/// Where each parameter of a sharding unit lives in its flat parameter, and how the flat
/// parameter is padded and split across ranks: the one definition FlatParam, the memory
/// pre-flight and the offload stores' sizes all use. No torch.
///
/// With alignment a (ShardingConfig::flat_align; 1 unless 8-bit optimizer states ask for
/// their block), parameter k starts at o_k = roundup(o_{k-1} + n_{k-1}, a), o_0 = 0, and
/// the data ends at E = o_last + n_last (E = T, the sum of the n_k, when a = 1). At stage 0
/// nothing is sharded: P = S = roundup(E, a). At stages 1-3 on N ranks each rank owns
/// S = roundup(ceil(E / N), a) elements and P = N * S, so shard boundaries are multiples
/// of a too (FSDP's FlatParameter pads only the end, Zhao et al. 2023, Sec. 3.2; the
/// per-tensor alignment is bitsandbytes' per-tensor blocks, Dettmers et al. 2022, Sec. 2).
#include <cstdint>
#include <vector>

namespace shardgan {

struct FlatLayout {
  std::vector<int64_t> offsets;  ///< first element of each parameter, ascending
  int64_t numel = 0;             ///< T: the parameters' elements (no padding)
  int64_t data_end = 0;          ///< E: one past the last parameter's last element
  int64_t padded_numel = 0;      ///< P: the flat parameter's length
  int64_t shard_numel = 0;       ///< S: elements each rank owns (P at stage 0)
  /// Elements that hold no parameter: P - T (the gaps between parameters and the tail).
  int64_t padding() const { return padded_numel - numel; }
};

/// The layout of parameters of `numels` elements (in order) with alignment `align` (>= 1)
/// on `world_size` ranks (>= 1) at ZeRO `stage` (0-3). Throws std::invalid_argument for
/// align < 1, world_size < 1 or a negative count.
FlatLayout make_flat_layout(const std::vector<int64_t>& numels, int64_t align, int world_size, int stage);

}  // namespace shardgan
