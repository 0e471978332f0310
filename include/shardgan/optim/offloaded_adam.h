#pragma once
/// Adam / AdamW with its state (exp_avg, exp_avg_sq) offloaded to host memory or disk:
/// ZeRO-Offload's CPU optimizer (Ren et al. 2021, Sec. 4.1: state and step on the CPU) and
/// ZeRO-Infinity's NVMe tier (Rajbhandari et al. 2021, Sec. 5.1), for the shards this rank
/// owns (ZeRO paper, Sec. 5.1).
///
/// The step updates each unit's shard block by block. The gradient and parameter slices
/// are copied into staging buffers (host-to-host here; device-to-host in a CUDA build, the
/// same torch copy), the fused kernel updates them with the block's moments, and the
/// parameters are copied back into the unit's shard. With offload.overlap_copies (the
/// default), the copies are non-blocking through the pinned buffers, ordered by
/// DeviceEvents (no-ops on the CPU, where copies are synchronous), in blocks of
/// offload.copy_block_bytes:
///   - cpu tier: the moments stay in host memory, so the staging ring is cut into slots
///     and one pipeline runs across every chunk and unit: the next blocks' gradients come
///     down, and earlier blocks' parameters go back, while the CPU steps block k. Copies
///     down and up run on two copy streams of their own (CopyStream), which a GPU serves
///     with separate copy engines;
///   - disk tier: the store's ring streams chunks (chunk k+1 read and chunk k-1 written
///     while chunk k is updated), and the blocks pipeline within a chunk, which waits for
///     its last copy before the store reuses its buffers.
/// Every element sees the operations ShardedAdam applies, so a run with offload is
/// bit-identical to one without (tests/test_offload.cpp; on CUDA shards, tests/test_gpu.cpp).
///
/// Without parameter offload the master parameters stay in the unit's shard (gradients
/// too): only the optimizer state leaves. With it (`offload.<model>.param`, stage 3; the
/// same device as the optimizer state), the float32 master shard joins the moments in the
/// store and the units read it from here (ShardSource) when they start an all-gather;
/// the step then updates it in the ring, in place. With gradient offload
/// (`offload.<model>.gradient`, stages 2 and 3, the same device again), each unit's
/// reduced gradient shard is added into the store as its reduce-scatter completes
/// (GradSink), so the shards (4 bytes per parameter per rank at float32, over the world
/// size) are not held from backward to the step; the step reads them from the ring
/// beside the moments and does not write them back. Otherwise they stay with the units.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "shardgan/offload/offload_config.h"
#include "shardgan/optim/optimizer.h"
#include "shardgan/optim/sharded_adam.h"
#include "shardgan/sharding/grad_sink.h"
#include "shardgan/sharding/shard_source.h"

namespace shardgan {

class OffloadStore;
class ShardedUnit;
struct AdamCoefficients;

class OffloadedAdam final : public ShardedOptimizer, public ShardSource, public GradSink {
 public:
  /// Builds the store for `model`'s units on offload.optimizer's device (cpu or disk; the
  /// disk file is `<offload.path>/<model>.rank<R>.offload`, reserved here). Moments start
  /// at zero. With offload.param, moves every unit's master shard into the store
  /// (ShardedUnit::offload_shard), one unit at a time; the optimizer must then outlive
  /// every use of the model. Throws std::invalid_argument for a bad hyperparameter (as
  /// ShardedAdam), for offload.optimizer none, for param_copy, for shards that are not
  /// float32 or float64 on the CPU, or for offload.param other than none or
  /// offload.optimizer's device, or below stage 3, or for offload.gradient other than none
  /// or offload.optimizer's device, or below stage 2; OffloadError naming the path when
  /// the disk tier cannot be set up. With offload.gradient, hands every unit the store as
  /// its GradSink (ShardedUnit::offload_grad): build the optimizer before any backward.
  OffloadedAdam(ShardedModel& model, AdamConfig cfg, const OffloadConfig& offload);
  /// A streamed build: `model` has no units yet. The store is made for units of
  /// `unit_shard_numels` shard elements of `dtype` (float32 or float64); each unit is then
  /// handed to adopt_unit() as it is added (populate_sharded_model), so that with
  /// offload.param its master shard leaves RAM before the next unit is built, and no rank
  /// ever holds all its master shards. Throws as the constructor above.
  OffloadedAdam(ShardedModel& model, AdamConfig cfg, const OffloadConfig& offload,
                std::vector<int64_t> unit_shard_numels, at::ScalarType dtype);
  /// Local. Checks the model's unit `u` (its index, shard size and dtype against the
  /// store's) and offloads its master shard (offload.param) and its gradient
  /// (offload.gradient) into the store. The constructor without unit sizes calls it for
  /// every unit. Throws std::invalid_argument naming the unit on a mismatch.
  void adopt_unit(ShardedUnit& u);
  ~OffloadedAdam() override;

  /// Throws std::logic_error: the state is not resident. Use read_unit_state and
  /// write_unit_state.
  std::vector<std::pair<std::string, at::Tensor>> unit_state(size_t unit) override;
  /// {"exp_avg", "exp_avg_sq"}, or {"exp_avg_sq"} with beta1 0 (m is the gradient then,
  /// and is not stored: adam_stores_m; the step runs on the CPU whatever the shards' device).
  std::vector<std::string> state_names() override {
    if (moments_ == 1) return {"exp_avg_sq"};
    return {"exp_avg", "exp_avg_sq"};
  }
  /// Streams unit `unit`'s moments out of the tier into two transient tensors ([S], the
  /// shard's dtype, CPU) and passes them to fn. Local; reads from disk.
  void read_unit_state(size_t unit, const StateVisitor& fn) override;
  /// Passes fn two transient tensors to fill, then streams them into the tier. Local.
  void write_unit_state(size_t unit, const StateVisitor& fn) override;
  /// Host bytes the tier holds (the ring; plus the moments for cpu).
  int64_t state_bytes() override;
  /// Bytes of the disk file (0 for cpu).
  int64_t offloaded_bytes() override;
  /// Whether the master shards live in the store too (offload.param).
  bool params_offloaded() const { return param_array_ >= 0; }
  /// ShardSource (parameter offload): streams unit `unit`'s master shard out of, or into,
  /// the store (the master array alone). Local; reads or writes the disk.
  void read_shard(size_t unit, at::Tensor& dst) override;
  void write_shard(size_t unit, const at::Tensor& src) override;
  /// Whether the gradient shards go to the store too (offload.gradient).
  bool grads_offloaded() const { return grad_array_ >= 0; }
  /// GradSink (gradient offload): adds a reduced shard into the store chunk by chunk
  /// (read, add, write; first: zero, add, write), or reads or replaces it. Local; the
  /// caller holds the model's tier lock. Throws std::logic_error without gradient offload.
  void accumulate_grad(size_t unit, const at::Tensor& reduced, double scale, bool first) override;
  void read_grad(size_t unit, at::Tensor& dst) override;
  void write_grad(size_t unit, const at::Tensor& src) override;
  const char* type_name() const override { return cfg_.decoupled_weight_decay ? "adamw" : "adam"; }
  OffloadStore& store() { return *store_; }
  /// Seconds the last step spent waiting for the disk or copying, and in the kernel.
  double last_step_io_s() const { return io_s_; }
  double last_step_compute_s() const { return compute_s_; }
  double update_io_seconds() const override { return io_total_s_; }

 protected:
  void update() override;

 private:
  /// Validates the config and the offload keys against the model's stage, and makes the
  /// store for units of `numel` shard elements of dtype_.
  void init(const OffloadConfig& offload, std::vector<int64_t> numel);
  /// The step on the cpu tier: one pipeline of copy blocks across chunks and units.
  /// Returns the seconds spent in the kernel.
  double update_in_memory(const AdamCoefficients& c);
  /// The step on the disk tier: chunk by chunk through the store's ring, blocks within a
  /// chunk. Returns the seconds spent in the kernel.
  double update_streamed(const AdamCoefficients& c);
  /// One Adam step on a block: the fused kernel for float32, ShardedAdam's torch ops for
  /// float64. Host tensors of dtype_, numel equal; m undefined when it is not stored.
  void adam_block(at::Tensor& p, const at::Tensor& g, at::Tensor& m, at::Tensor& v, const AdamCoefficients& c);

  AdamConfig cfg_;
  std::unique_ptr<OffloadStore> store_;
  at::ScalarType dtype_;
  int param_array_ = -1;  // store array of the master shard (parameter offload), or -1
  int moment_array_ = 0;  // store array of the first moment kept: exp_avg, or exp_avg_sq
  int moments_ = 2;       // 2, or 1 when m is not stored (beta1 0: adam_stores_m)
  int v_array() const { return moment_array_ + moments_ - 1; }
  int grad_array_ = -1;   // store array of the gradient shard (gradient offload), or -1
  int grad_scratch_ = 0;  // staging slice of the gradient, or -1 when it is an array
  int param_scratch_ = 1; // staging slice of the parameters, or -1 when they are an array
  bool overlap_ = true;         // offload.overlap_copies
  int64_t block_numel_ = 0;     // offload.copy_block_bytes in elements of dtype_
  double io_s_ = 0, compute_s_ = 0, io_total_s_ = 0;
};

}  // namespace shardgan
