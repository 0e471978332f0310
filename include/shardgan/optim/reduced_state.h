#pragma once
/// One Adam state (m or v) of one unit stored under a reduced policy (state_layout.h), and
/// what both Adam optimizers do with it outside the step: the float32 view checkpoints and
/// `shardgan-ckpt` read, and the raw per-parameter parts that 8-bit checkpoints store.
/// ShardedAdam holds the stores in RAM; OffloadedAdam reads the reduced values of one unit
/// out of its offload store into a transient tensor and lends the same functions a view.
/// All local, on CPU tensors.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "shardgan/optim/blockwise_quant.h"
#include "shardgan/optim/optimizer.h"
#include "shardgan/optim/state_layout.h"

namespace shardgan {

class ShardedUnit;

/// A unit's stores of one state. Indices come from the StateLayout's runs: a float32 run's
/// elements at f32[store_offset ...], a reduced run's at values[store_offset ...] and, int8,
/// its blocks at absmax[block_offset ...].
struct ReducedState {
  at::Tensor f32;     ///< float32, the float32 runs' elements
  at::Tensor values;  ///< bfloat16 (bits as kBFloat16) or 8-bit codes (kByte)
  at::Tensor absmax;  ///< int8: float32, one per block
};

/// What a reduced state needs to be read: the policy's dtype and block, the state's code map
/// (m signed, v unsigned) and the kernel path.
struct ReducedFormat {
  StateDtype dtype = StateDtype::kInt8;
  int64_t block = 256;
  CodeMap map = CodeMap::kSigned;
  CpuIsa isa = best_cpu_isa();
};

/// The format of an Adam state under `policy`: m (second false) on the signed map, v on
/// the unsigned one, read by the kernel path `isa`.
inline ReducedFormat adam_state_format(const StatePolicy& policy, bool second, CpuIsa isa) {
  return {policy.dtype, policy.block, second ? CodeMap::kUnsigned : CodeMap::kSigned, isa};
}

/// The Adam states a checkpoint stores raw (as held): with int8 states exp_avg (when m is
/// stored) and exp_avg_sq; none with float32 or bfloat16 states.
std::vector<ShardedOptimizer::RawState> adam_raw_states(const StatePolicy& policy, bool stores_m);

/// The block of the raw states: policy.block with int8 states, else 0.
inline int64_t adam_raw_state_block(const StatePolicy& policy) {
  return policy.dtype == StateDtype::kInt8 ? policy.block : 0;
}

/// The state as float32 ([shard_numel], CPU): bfloat16 widened (exact), int8 dequantized.
at::Tensor widen_state(const StateLayout& l, int64_t shard_numel, const ReducedFormat& f, const ReducedState& s);
/// The inverse: `values` ([shard_numel], any float dtype) rounded to bfloat16 or quantized in
/// the layout's blocks (not the stored bits again in general), written into `s`.
void narrow_state(const StateLayout& l, const ReducedFormat& f, const at::Tensor& values, ReducedState& s);

/// int8: for every parameter of `u` with elements in its shard, calls fn(state, parameter,
/// part, values) with views of the parts holding them: "codes" and "absmax" (one per block
/// counted from the parameter's first element), or "float32" for a parameter kept in float32.
void visit_raw_state(const ShardedUnit& u, const StateLayout& l, int64_t block, const std::string& state,
                     const ReducedState& s, const ShardedOptimizer::RawVisitor& fn);
/// int8: fills `s` from a checkpoint, parameter by parameter: the stored bits where `src`
/// holds the parameter's state in blocks of `block` (a bit-exact resume), otherwise float32
/// values requantized in this layout's blocks. Throws what src throws.
void load_raw_state(const ShardedUnit& u, const StateLayout& l, const ReducedFormat& f, const std::string& state,
                    ReducedState& s, StateSource& src);

/// Puts the elements at shard-local `ranges` of `kept` back into `live` (both of layout `l`):
/// float32 runs' values, reduced runs' values and, int8, the absmax of every block those
/// ranges touch (a frozen parameter's blocks hold only its elements and the zero padding
/// after it, so whole blocks go back).
void restore_state_ranges(const StateLayout& l, StateDtype d, int64_t block,
                          const std::vector<std::pair<int64_t, int64_t>>& ranges, const ReducedState& kept,
                          ReducedState& live);

}  // namespace shardgan
