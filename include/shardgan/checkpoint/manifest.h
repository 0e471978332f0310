#pragma once
/// The index of a sharded checkpoint (schema 2): what every rank file holds, where each
/// tensor's elements live, and the checksums. Torch-free, so the shardgan-ckpt tool and the
/// trainer share it. docs/checkpoints.md describes the on-disk layout.
///
/// Flat sharding: each unit's parameters are concatenated into one flat parameter of
/// `numel` (T) elements. A rank file stores one contiguous range of it per unit (and the
/// same range of every optimizer state and extra state) as 1-D datasets. A tensor's
/// elements are the range [offset, offset + numel) of its unit's flat parameter.
#include <algorithm>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace shardgan {

/// A checkpoint that cannot be written or loaded; the message names the directory, the
/// rank and file, what is wrong, and what to do.
class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace shardgan

namespace shardgan::ckpt {

/// The on-disk schema this build writes and reads (1: per-rank files only, no index).
inline constexpr int64_t kSchemaVersion = 2;

inline constexpr const char* kIndexFile = "index.h5";
inline constexpr const char* kFormatName = "shardgan-checkpoint";
/// Checksums cover blocks of this many bytes of each dataset, so that a rank reading a
/// slice verifies only the blocks it touches.
inline constexpr int64_t kDefaultBlockBytes = int64_t{1} << 20;

struct ParamEntry {
  std::string name;            ///< name within the unit's module ("0.weight")
  std::vector<int64_t> shape;  ///< original shape
  int64_t offset = 0;          ///< first element in the unit's flat parameter
  int64_t numel = 0;
};

/// One rank file's part of a unit: its 1-D datasets hold flat elements [offset, offset +
/// numel); elements at or beyond the unit's numel are zero padding.
struct ShardEntry {
  int rank = 0;
  int64_t offset = 0;
  int64_t numel = 0;
};

struct UnitEntry {
  std::string name;
  int64_t numel = 0;         ///< T
  int64_t padded_numel = 0;  ///< P at save time (informational)
  std::vector<ParamEntry> params;
  std::vector<ShardEntry> shards;  ///< together they cover [0, data_end())
  /// One past the last parameter element: T, unless the parameters were aligned in the
  /// flat parameter (ShardingConfig::flat_align), which leaves zero gaps between them.
  int64_t data_end() const {
    int64_t e = params.empty() ? numel : 0;
    for (const auto& p : params) e = std::max(e, p.offset + p.numel);
    return e;
  }
};

struct BufferEntry {
  std::string name;  ///< qualified "<unit>.<name in module>"
  std::vector<int64_t> shape;
  std::string dtype;
  int rank = 0;      ///< the rank file holding it (replicated state is written once)
};

struct ModelEntry {
  std::string name;   ///< "generator", "discriminator"
  int stage = 0;      ///< ZeRO stage at save time
  std::string dtype;  ///< dtype of the flat parameter and its states ("float32", ...)
  int64_t optim_step = 0;
  std::vector<std::string> optim_states;  ///< flat states, e.g. exp_avg, exp_avg_sq
  /// States stored per parameter as the optimizer holds them (8-bit states: codes and
  /// absmax, or float32 for parameters kept in float32), not as flat datasets: see
  /// raw_state_dataset. Empty for float32 and bfloat16 states.
  std::vector<std::string> raw_states;
  /// Per raw state, its code map: "signed" or "unsigned" (bitsandbytes' create_dynamic_map,
  /// blockwise_quant.h).
  std::vector<std::string> raw_state_maps;
  int64_t raw_state_block = 0;  ///< elements per absmax of the raw states
  std::vector<std::string> extras;        ///< e.g. ema
  std::vector<UnitEntry> units;
  std::vector<BufferEntry> buffers;
};

struct DatasetEntry {
  std::string dtype;
  int64_t numel = 0;
  std::vector<uint64_t> xxh3;  ///< XXH3_64bits of each block of block_bytes bytes
};

struct FileEntry {
  int rank = 0;
  std::string name;   ///< relative to the checkpoint directory
  int64_t bytes = 0;  ///< file size at commit (a shorter file is truncated)
  std::map<std::string, DatasetEntry> datasets;  ///< by path inside the file
};

struct Manifest {
  int64_t schema_version = 0;
  int64_t world_size = 0;
  int64_t step = 0, epoch = 0, batch_in_epoch = 0;
  std::map<std::string, double> scalars;
  std::string config;  ///< the resolved YAML the run used
  int64_t block_bytes = kDefaultBlockBytes;
  std::vector<ModelEntry> models;
  std::vector<FileEntry> files;  ///< one per rank, by rank

  const ModelEntry* model(const std::string& name) const;
  const FileEntry& file(int rank) const;  ///< throws std::out_of_range
};

/// JSON text of `m` (stored in the index as the string dataset /manifest.json).
std::string to_json(const Manifest& m);
/// Parses to_json's output; throws std::runtime_error naming `where` on malformed text.
Manifest manifest_from_json(const std::string& text, const std::string& where);

/// Paths of a unit's 1-D datasets inside a rank file. `kind` is "param_shard",
/// "optim/<state>" or an extra's name.
std::string unit_dataset(const std::string& model, const std::string& unit, const std::string& kind);
/// Path of one part of a raw optimizer state in a rank file: the elements of parameter
/// `param` (its name in the unit) that the rank owns, <unit>/optim_raw/<state>/<param>.<part>
/// with `part` "codes" (uint8, one per element), "absmax" (float32, one per block of
/// raw_state_block elements counted from the parameter's first element) or "float32".
std::string raw_state_dataset(const std::string& model, const std::string& unit, const std::string& state,
                              const std::string& param, const std::string& part);
/// Path of a full tensor in the index (and in a consolidated file): <model>/params/<p>,
/// <model>/optim/<state>/<p>, <model>/<extra>/<p>.
std::string index_path(const std::string& model, const std::string& kind, const std::string& qualified);
std::string rank_file_name(int rank);
/// The per-unit states a model stores: "param_shard", "optim/<state>"..., extras...
std::vector<std::string> state_kinds(const ModelEntry& m);

/// A box (start, count per dimension) of an N-D tensor.
struct Box {
  std::vector<int64_t> start, count;
};
/// Decomposes the row-major flat range [lo, hi) of a tensor of `shape` into at most
/// 2 * rank - 1 boxes (partial first row, full middle rows, partial last row, recursively),
/// in flat order.
std::vector<Box> flat_range_boxes(const std::vector<int64_t>& shape, int64_t lo, int64_t hi);

/// XXH3_64bits of each block of `block_bytes` bytes of `data` (`bytes` long).
std::vector<uint64_t> block_hashes(const void* data, int64_t bytes, int64_t block_bytes);
uint64_t xxh3(const void* data, int64_t bytes);

}  // namespace shardgan::ckpt
