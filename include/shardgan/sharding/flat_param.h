#pragma once
/// The flat parameter of one sharding unit: flattening, padding, this rank's shard, the
/// module's parameters as views of the gathered buffer, and that buffer's storage (FSDP's
/// FlatParameter, Zhao et al. 2023, Sec. 3.2; FSDP2's FSDPParam). No collectives: the unit
/// (sharded_unit.h) gathers into full() and reduces gradients; the runtime hooks decide when.
///
/// Layout (flat_layout.h): the module's parameters, in named_parameters() order, are
/// concatenated into T elements, each starting at a multiple of the alignment (1: back to
/// back), and zero-padded to P = N * S for world size N; rank r owns elements
/// [r * S, (r + 1) * S). With alignment 1, S = ceil(T / N), and at stage 0 nothing is
/// padded or sharded (S = P = T).
#include <cstdint>
#include <string>
#include <vector>

#include <torch/nn/module.h>

namespace shardgan {

class ShardSource;

class FlatParam {
 public:
  /// Where each original parameter lives inside the flat parameter.
  struct Slot {
    std::string name;             ///< name within the unit's module
    std::vector<int64_t> shape;   ///< original shape
    int64_t offset = 0;           ///< first element in the flat parameter
    int64_t numel = 0;            ///< elements
    at::Tensor param;             ///< the module's parameter (a view of full())
  };

  /// Flattens `module`'s parameters (one dtype and one device; identical on every rank),
  /// claims them for `qualified` + name (ownership.h), and keeps this rank's shard
  /// (rank `rank` of `world_size`) in the master dtype, on the parameters' device. The
  /// gathered buffer full() is in `compute_dtype` (undefined: the master dtype); at stage 3
  /// its storage is freed on return. Local. Throws std::invalid_argument naming `unit` and
  /// the parameter for mixed dtypes or devices, or a parameter another unit owns.
  /// `align` (>= 1): ShardingConfig::flat_align.
  FlatParam(const std::string& unit, const std::string& qualified, torch::nn::Module& module, int rank,
            int world_size, int stage, c10::optional<at::ScalarType> compute_dtype, int64_t align = 1);
  /// Releases the ownership claims. Does not throw.
  ~FlatParam();
  FlatParam(const FlatParam&) = delete;
  FlatParam& operator=(const FlatParam&) = delete;

  int64_t numel() const { return numel_; }                ///< T
  /// E: one past the last parameter's last element (T unless aligned); [E, P) is padding.
  int64_t data_end() const { return data_end_; }
  int64_t padded_numel() const { return padded_numel_; }  ///< P
  int64_t shard_numel() const { return shard_numel_; }    ///< S
  int64_t shard_offset() const { return shard_offset_; }  ///< first owned element
  at::ScalarType master_dtype() const { return master_dtype_; }
  at::ScalarType compute_dtype() const { return compute_dtype_; }
  c10::Device device() const { return device_; }
  const std::vector<Slot>& slots() const { return slots_; }
  /// Whether some parameter requires grad or holds one (a frozen unit: neither). Local.
  bool trainable() const;

  /// The gathered flat parameter: P elements, compute dtype; the parameters are views of it.
  /// At stage 3 its storage exists only between allocate_full() and release_full().
  at::Tensor& full() { return full_; }
  /// This rank's master shard: S elements, master dtype. Aliases the owned slice of full()
  /// when stage <= 2 and the dtypes agree (shard_aliases_full()). Undefined memory once
  /// offloaded (offload()).
  at::Tensor& shard() { return shard_; }
  bool shard_aliases_full() const { return shard_aliases_full_; }

  /// Stage 3: gives full() fresh, uninitialized memory (the storage's allocator), keeping
  /// every view valid. Local.
  void allocate_full();
  /// Stage 3: points full() at `external` (padded_numel() elements of the compute dtype,
  /// owned by the caller, e.g. a node-shared buffer) instead of allocating. Local.
  void attach_full(void* external);
  /// Stage 3: frees full()'s memory (FSDP's untyped_storage().resize_(0)). Local.
  void release_full();
  /// Bytes behind full() now at stage 3; 0 at stages 0-2 (persistent, counted below).
  int64_t full_bytes_alive() const;
  /// Bytes kept between steps: full() at stages 0-2, plus a separate master shard unless
  /// it aliases full() or is offloaded.
  int64_t persistent_bytes() const;

  /// Parameter offload: writes the shard to `source` as unit `index` and frees it here.
  /// Local; the caller has freed full() (no all-gather may read the shard).
  void offload(ShardSource* source, size_t index);
  bool offloaded() const { return source_ != nullptr; }
  /// The master shard's values ([S], master dtype, device()): shard() itself when
  /// resident; read from the tier (through the host staging copy for a device shard) when
  /// offloaded. Local.
  at::Tensor master_shard();
  /// Overwrites the master shard (resident or offloaded) with `values` ([S], any floating
  /// dtype, converted). Local.
  void set_master_shard(const at::Tensor& values);

 private:
  std::vector<Slot> slots_;
  int64_t numel_ = 0, data_end_ = 0, padded_numel_ = 0, shard_numel_ = 0, shard_offset_ = 0;
  int stage_ = 3;
  at::ScalarType master_dtype_ = at::kFloat, compute_dtype_ = at::kFloat;
  c10::Device device_ = c10::Device(c10::kCPU);
  at::Tensor full_, shard_;
  bool shard_aliases_full_ = false;
  ShardSource* source_ = nullptr;
  size_t source_index_ = 0;
};

}  // namespace shardgan
