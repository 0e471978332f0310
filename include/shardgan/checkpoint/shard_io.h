#pragma once
/// Reading and writing the files of a sharded checkpoint (schema 2), without torch or MPI:
/// the trainer, the offline resharder and the shardgan-ckpt tool all go through here.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "shardgan/h5/h5.h"
#include "shardgan/checkpoint/manifest.h"

namespace shardgan::ckpt {

h5::DType parse_dtype(const std::string& name);  ///< "float32" -> kF32; throws

/// Writes one rank file and records a checksum of every dataset it writes.
class RankFileWriter {
 public:
  RankFileWriter(const std::string& dir, int rank, int64_t block_bytes = kDefaultBlockBytes);
  /// Writes dataset `path` and hashes the bytes written.
  void write(const std::string& path, h5::DType dt, const std::vector<int64_t>& shape, const void* data);
  h5::File& file() { return file_; }
  /// Flushes, closes and fsyncs the file; returns its entry (name, size, checksums).
  FileEntry finish();

 private:
  std::string dir_;
  int64_t block_bytes_;
  FileEntry entry_;
  h5::File file_;
};

/// Writes `dir`/index.h5: the root attributes (schema_version, world_size, step, epoch,
/// batch_in_epoch, config, scalar.<name>), /manifest.json, and one virtual dataset per
/// tensor mapping the rank files' slices. Flushes and fsyncs it.
void write_index(const std::string& dir, const Manifest& m);

/// Writes the trainer state of `m` as root attributes of `f` (format, schema_version,
/// world_size, step, epoch, batch_in_epoch, config, scalar.<name>): the one definition
/// shared by the index and by consolidated files.
void write_root_attributes(h5::File& f, const Manifest& m, const std::string& format);

/// A full tensor of a checkpoint, as the index presents it.
struct TensorRef {
  const ModelEntry* model = nullptr;
  std::string kind;       ///< "param_shard", "optim/<state>", an extra, or "buffer"
  size_t unit = 0;        ///< unit index (not for buffers)
  size_t item = 0;        ///< param index within the unit, or buffer index
  std::string path;       ///< path in the index (<model>/params/<name>, ...)
  std::vector<int64_t> shape;
  std::string dtype;
  int64_t numel() const;
};

/// Opens a committed checkpoint for reading: the index is read and checked on
/// construction; rank files are opened on first use, after checking that they exist and
/// have the committed size. Every read is checked against the recorded checksums (the
/// blocks it touches), so a corrupted byte is an error, never a wrong value. Errors are
/// CheckpointError naming the directory, the rank and the file, and saying what to do.
/// Before HDF5 opens the index or a rank file in this process, a forked child reads its
/// metadata (h5/probe.h, under SHARDGAN_HDF5_PROBE_DEADLINE_S), so that a file that
/// crashes or hangs the HDF5 library is a CheckpointError too. Construct readers where no
/// other thread is inside HDF5 (at start-up, in the tools).
class CheckpointReader {
 public:
  explicit CheckpointReader(std::string dir);
  ~CheckpointReader();
  const Manifest& manifest() const { return m_; }
  const std::string& dir() const { return dir_; }

  /// Global flat elements [lo, hi) (hi <= the unit's numel) of state `kind` of `unit`,
  /// gathered from whichever rank files hold them, with hyperslab reads.
  void read_flat(const ModelEntry& model, const UnitEntry& unit, const std::string& kind,
                 int64_t lo, int64_t hi, void* out);
  /// A whole dataset of one rank file, verified.
  void read_dataset(int rank, const std::string& path, void* out, int64_t numel);
  /// Elements [start, start + count) of a 1-D dataset of rank file `rank`, verified.
  void read_verified(int rank, const std::string& path, int64_t start, int64_t count, void* out);
  /// Raw optimizer states (ModelEntry::raw_states), parameter by parameter:
  /// the absmax block of parameter `param` of `unit` in state `state` when it is stored as
  /// 8-bit codes; 0 when it is stored as float32, or when `state` is not a raw state.
  int64_t raw_block(const ModelEntry& model, const UnitEntry& unit, size_t param, const std::string& state);
  /// Elements [lo, hi) (the parameter's own element order) of optimizer state `state` of
  /// parameter `param` as float32: read from the flat dataset (a float32 model), or
  /// gathered from the raw parts and dequantized (code map times the block's absmax).
  void read_param_state(const ModelEntry& model, const UnitEntry& unit, size_t param, const std::string& state,
                        int64_t lo, int64_t hi, float* out);
  /// 8-bit parts only (raw_block > 0), lo a multiple of the block: the codes of elements
  /// [lo, hi) and the absmax of blocks [lo / block, ceil(hi / block)), as stored.
  void read_param_raw(const ModelEntry& model, const UnitEntry& unit, size_t param, const std::string& state,
                      int64_t lo, int64_t hi, uint8_t* codes, float* absmax);
  /// One full tensor (streamed from the shards that hold it; raw optimizer states
  /// dequantized to float32).
  void read_tensor(const TensorRef& t, void* out);

  /// Every tensor: parameters, optimizer states, extras, then buffers, model by model.
  std::vector<TensorRef> tensors() const;
  /// Which ranks hold which flat elements of a tensor: (rank, first, last+1) in the
  /// tensor's own flattened index space.
  std::vector<std::tuple<int, int64_t, int64_t>> holders(const TensorRef& t) const;

  /// Checks everything: every file is there with its committed size, every dataset has
  /// its recorded length and checksums, and every unit's range [0, T) is covered. Returns
  /// one line per problem (empty when the checkpoint is sound). Never throws for a bad
  /// checkpoint.
  std::vector<std::string> verify_all();

 private:
  h5::File& file(int rank);
  [[noreturn]] void fail_file(int rank, const std::string& what) const;

  std::string dir_;
  Manifest m_;
  std::map<int, std::unique_ptr<h5::File>> files_;
  bool probe_files_ = true;  // false in verify_all, which reads each file in a child anyway
};

/// Reads the schema_version attribute of a checkpoint directory's index (or of
/// rank-00000.h5 for a schema-1 checkpoint without one); -1 if neither can be read.
int64_t checkpoint_schema_version(const std::string& dir);

}  // namespace shardgan::ckpt
