#pragma once
/// Offload options, with DeepSpeed's names (`offload_optimizer` / `offload_param`, device
/// `cpu` or `nvme`): ZeRO-Offload (Ren et al. 2021, Sec. 4) keeps the optimizer state and
/// runs the optimizer step on the CPU; ZeRO-Infinity (Rajbhandari et al. 2021, Sec. 5)
/// moves it to NVMe, streamed through bounded, overlapped buffers. No torch here.
#include <cstdint>
#include <string>

namespace shardgan {

/// Where a kind of training state lives between steps.
enum class OffloadDevice {
  kNone,  ///< with the model (device memory; RAM on this CPU-only build)
  kCpu,   ///< host memory (pinned where CUDA is present), stepped there by the fused CPU Adam
  kDisk,  ///< per-rank files under OffloadConfig::path, O_DIRECT reads and writes via io_uring
};
/// "none", "cpu", "disk".
const char* to_string(OffloadDevice d);
/// Inverse of to_string; throws std::invalid_argument naming the accepted values.
OffloadDevice parse_offload_device(const std::string& s);

/// The dtype offloaded gradient shards are kept in (offload.<model>.gradient_dtype).
enum class OffloadGradDtype {
  kMaster,    ///< the master dtype (float32): the default, bit-identical to gradients in RAM
  kBFloat16,  ///< bfloat16, rounded to nearest even as each reduced shard is added
};
/// "master", "bfloat16".
const char* to_string(OffloadGradDtype d);
/// Inverse of to_string (also accepts "float32" for the master dtype); throws
/// std::invalid_argument naming the accepted values.
OffloadGradDtype parse_offload_grad_dtype(const std::string& s);

/// Per-model offload settings (YAML: offload.generator.*, offload.discriminator.*; the
/// path and buffer keys are shared by both models).
struct OffloadConfig {
  /// offload.<model>.optimizer: Adam's exp_avg and exp_avg_sq (adam and adamw only).
  OffloadDevice optimizer = OffloadDevice::kNone;
  /// offload.<model>.param: the float32 master parameter shards (ZeRO stage 3 only, on
  /// the same device as `optimizer`: OffloadedAdam keeps both in one store).
  OffloadDevice param = OffloadDevice::kNone;
  /// offload.<model>.gradient: the reduced gradient shards (ZeRO stages 2 and 3, on the
  /// same device as `optimizer`: OffloadedAdam reads them in its step). Each unit's shard
  /// goes to the store as its reduce-scatter completes, so peak RAM no longer grows with
  /// the gradient shard (ZeRO-Infinity offloads gradients too, Sec. 5.1).
  OffloadDevice gradient = OffloadDevice::kNone;
  /// offload.<model>.gradient_dtype: the offloaded gradient shards in the master dtype or
  /// in bfloat16 (2 bytes per element instead of 4; needs `gradient` and float32 shards).
  /// A shard accumulated over micro-batches is rounded after each addition.
  OffloadGradDtype gradient_dtype = OffloadGradDtype::kMaster;
  /// offload.path: an existing folder for the disk tier's files (one per rank and model).
  /// Empty in the config: the trainer uses (and creates) `<run.dir>/offload`.
  std::string path;
  /// offload.buffer_bytes: bytes of one streaming buffer (a multiple of 4096, >= 1 MiB).
  int64_t buffer_bytes = int64_t{16} << 20;
  /// offload.buffer_count: buffers in the ring (>= 2). The disk tier's RAM is at most
  /// buffer_count * buffer_bytes, whatever the model size.
  int64_t buffer_count = 4;
  /// offload.queue_depth: io_uring submission queue entries (1 to 4096).
  int64_t queue_depth = 32;
  /// offload.overlap_copies: with shards on a GPU, stage each chunk of the optimizer step
  /// through the pinned buffers in blocks of copy_block_bytes, so that the device-to-host
  /// copy of block k+1 and the host-to-device copy of block k-1's updated parameters run
  /// while the CPU Adam steps block k (ZeRO-Offload, Ren et al. 2021, Sec. 4). False: one
  /// synchronous copy per chunk each way. Results are the same bits either way.
  bool overlap_copies = true;
  /// offload.copy_block_bytes: bytes of one such block (a multiple of 4096, >= 4096).
  /// cpu tier: the staging ring (offload.buffer_bytes over the staged arrays, 8 MiB at the
  /// defaults) is cut into slots of this size, at most half of it, and one pipeline runs
  /// across chunks and units. disk tier: blocks are cut within each chunk of the ring, and
  /// the first block of every chunk is copied before any compute.
  int64_t copy_block_bytes = int64_t{2} << 20;

  bool any() const {
    return optimizer != OffloadDevice::kNone || param != OffloadDevice::kNone || gradient != OffloadDevice::kNone;
  }
};

}  // namespace shardgan
