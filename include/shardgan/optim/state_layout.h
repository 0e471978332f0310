#pragma once
/// Where each element of a unit's shard keeps its optimizer state when the states are stored
/// in a reduced dtype (optim.<model>.state_dtype): which runs of the shard use the reduced
/// dtype and which keep float32, and where each run lives in its store. Pure bookkeeping on
/// element offsets; no torch.
///
/// The rules (bitsandbytes' practice: its optimizers' `min_8bit_size`, 4096, and the
/// per-parameter 32-bit override its docs suggest for embeddings):
/// - a parameter with fewer than `min_numel` elements, or whose qualified name matches one
///   of the `float32` globs (fnmatch), keeps float32 states;
/// - 8-bit blocks are per parameter: each parameter's run starts a new block. Together with
///   a flat layout whose parameter offsets and shard boundaries are multiples of the block
///   (FlatParam's alignment), no block spans two parameters or two ranks, so a sharded
///   8-bit step equals the unsharded one bit for bit.
/// Elements between two parameters (alignment padding) and after the last one belong to
/// the parameter before them.
#include <cstdint>
#include <string>
#include <vector>

namespace shardgan {

/// The dtype optimizer states are stored in (optim.<model>.state_dtype).
enum class StateDtype { kFloat32, kBFloat16, kInt8 };
/// "float32", "bfloat16", "int8".
const char* to_string(StateDtype d);
/// Inverse of to_string; throws std::invalid_argument naming the accepted values.
StateDtype parse_state_dtype(const std::string& s);
/// Bytes per element of one state in `d` (int8: the code byte only; absmax comes per block).
int64_t state_element_bytes(StateDtype d);

/// The per-model policy: optim.<model>.state_dtype, state_block, state_min_numel,
/// state_float32.
struct StatePolicy {
  StateDtype dtype = StateDtype::kFloat32;
  int64_t block = 256;          ///< int8: elements per absmax block (bitsandbytes' 256)
  int64_t min_numel = 4096;     ///< smaller parameters keep float32 states
  std::vector<std::string> float32;  ///< globs of qualified parameter names kept in float32
};

/// Throws std::invalid_argument, naming the field, for block outside [1, 4096] or a
/// negative min_numel.
void validate_state_policy(const StatePolicy& p);

/// One parameter of a unit, as the flat parameter holds it.
struct StateParam {
  std::string name;    ///< qualified name (for the globs and for messages)
  int64_t offset = 0;  ///< first element in the flat parameter
  int64_t numel = 0;
};

/// A run of the shard whose elements share one storage kind.
struct StateRun {
  int64_t begin = 0;         ///< first element, shard-local
  int64_t numel = 0;
  bool reduced = false;      ///< stored in the policy's dtype (else float32)
  int64_t store_offset = 0;  ///< first element in its store (the reduced or the float32 one)
  int64_t block_offset = 0;  ///< int8: index of its first absmax block in the reduced store
};

/// The layout of one unit's shard.
struct StateLayout {
  std::vector<StateRun> runs;    ///< in shard order, covering [0, shard_numel) exactly
  int64_t reduced_numel = 0;     ///< elements in the reduced store
  int64_t float32_numel = 0;     ///< elements in the float32 store
  int64_t blocks = 0;            ///< int8: absmax values per state
  /// Bytes of one state (m or v) for this shard: reduced elements, absmax, float32 elements.
  int64_t state_bytes(StateDtype d) const;
  /// Bytes of one state that stay in RAM when the reduced elements live in an offload store
  /// (OffloadedAdam): the absmax and the float32 elements; none for kFloat32, whose whole
  /// shard is in the store.
  int64_t resident_bytes(StateDtype d) const;
};

/// Builds the layout of the shard [shard_offset, shard_offset + shard_numel) of a flat
/// parameter of `padded_numel` elements holding `params` (ascending offsets). With kFloat32
/// the whole shard is one float32 run. Adjacent runs of the same kind are merged (8-bit runs
/// only where the earlier one is a whole number of blocks, so blocks keep their start).
/// Throws std::invalid_argument for offsets that are not ascending or outside the flat
/// parameter.
StateLayout make_state_layout(const std::vector<StateParam>& params, int64_t padded_numel, int64_t shard_offset,
                              int64_t shard_numel, const StatePolicy& policy);

}  // namespace shardgan
