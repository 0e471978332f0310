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
///
/// Reduced state dtypes (optim.<model>.state_dtype bfloat16 or int8, float32 shards): the
/// store holds m and v as bfloat16 bits or 8-bit codes at each element's shard position (2
/// or 1 bytes per element), so the disk reads and writes the quantized bytes. The int8
/// absmax (4 bytes per block) and the states of parameters kept in float32 (StateLayout)
/// stay in RAM. The step walks each chunk's StateLayout runs with ShardedAdam's kernels,
/// and chunks and copy blocks start on 8-bit block boundaries, so the states and
/// parameters equal ShardedAdam's with the same policy bit for bit.
/// offload.<model>.gradient_dtype bfloat16 keeps the offloaded gradient shards in 16 bits;
/// the step widens each chunk to float32 (exact).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "shardgan/offload/offload_config.h"
#include "shardgan/optim/optimizer.h"
#include "shardgan/optim/reduced_state.h"
#include "shardgan/optim/sharded_adam.h"
#include "shardgan/sharding/grad_sink.h"
#include "shardgan/sharding/shard_source.h"

namespace shardgan {

class OffloadStore;
class ShardedUnit;
struct AdamCoefficients;

/// The arrays of OffloadedAdam's store for one model, in the store's order, with the bytes
/// of one shard element in each: the master shard (offload.param), m (when stored: see
/// adam_stores_m), v, the gradient shard (offload.gradient, in offload.gradient_dtype).
/// One source for the store and the disk pre-flight. -1: the array is not there.
struct OffloadArrays {
  int param = -1, m = -1, v = -1, grad = -1;
  std::vector<int64_t> elem_bytes;  ///< per array, bytes per shard element
  /// Bytes per shard element over all arrays.
  int64_t bytes_per_element() const;
};
/// `master_bytes`: the shards' element size (4 float32, 8 float64). States in `state`'s
/// element size (state_element_bytes; the master size for kFloat32).
OffloadArrays offload_arrays(const OffloadConfig& offload, bool stores_m, StateDtype state, int64_t master_bytes);

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
  /// shard's dtype, CPU; reduced states widened or dequantized to float32) and passes them
  /// to fn. Local; reads from disk.
  void read_unit_state(size_t unit, const StateVisitor& fn) override;
  /// Passes fn two transient tensors to fill, then streams them into the tier (reduced
  /// states rounded or requantized, as ShardedAdam::write_unit_state). Local.
  void write_unit_state(size_t unit, const StateVisitor& fn) override;
  /// int8: as ShardedAdam's, over the store's codes of one unit at a time (read into a
  /// transient [S] tensor) and the resident absmax and float32 states.
  std::vector<RawState> raw_states() override;
  int64_t raw_state_block() const override;
  void read_unit_raw(size_t unit, const RawVisitor& fn) override;
  void load_unit_state(size_t unit, StateSource& src) override;
  /// Host bytes the tier holds (the ring; plus the arrays for cpu), plus the reduced
  /// states' resident absmax and float32 elements.
  int64_t state_bytes() override;
  /// int8: blocks whose new m or v was not finite, summed over steps (ShardedAdam's count).
  int64_t nonfinite_blocks() const { return nonfinite_blocks_; }
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
  /// The layout of unit `unit`'s shard (reduced policies; its reduced runs' store_offset is
  /// the shard position, where the store keeps them).
  const StateLayout& layout(size_t unit) const { return layouts_.at(unit); }
  /// Seconds the last step spent waiting for the disk or copying, and in the kernel.
  double last_step_io_s() const { return io_s_; }
  double last_step_compute_s() const { return compute_s_; }
  double update_io_seconds() const override { return io_total_s_; }

 protected:
  void update() override;
  std::shared_ptr<void> keep_frozen_state(size_t unit, const Ranges& ranges) override;
  void restore_frozen_state(size_t unit, const Ranges& ranges, const std::shared_ptr<void>& kept) override;

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
  /// Reduced policies: one step on elements [lo, lo + n) of unit `unit`'s shard, p and g at
  /// element lo (float32), m (nullptr when not stored) and v at element lo of the store's
  /// arrays, run by run of the unit's StateLayout.
  void step_runs(size_t unit, int64_t lo, int64_t n, float* p, const float* g, void* m, void* v,
                 const AdamCoefficients& c);
  bool reduced() const { return cfg_.state.dtype != StateDtype::kFloat32; }
  /// Unit `unit`'s m (`second` false) or v: the resident parts, and `values` as given.
  ReducedState stores(size_t unit, bool second, at::Tensor values) const;
  ReducedFormat format(bool second) const;
  /// The store's array of m or v for unit `unit`, whole ([S], kByte or kBFloat16), or back.
  at::Tensor read_state_array(size_t unit, bool second);
  void write_state_array(size_t unit, bool second, const at::Tensor& values);
  /// The zero state: the 8-bit map's zero code (bfloat16: bits 0) over every unit.
  void clear_reduced_arrays();

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
  int64_t block_numel_ = 0;     // offload.copy_block_bytes in elements of dtype_ (whole 8-bit blocks)
  OffloadArrays arrays_;
  at::ScalarType state_dtype_ = at::kFloat;  // the store's m and v: dtype_, kBFloat16 or kByte
  at::ScalarType grad_dtype_ = at::kFloat;   // the store's gradient: dtype_ or kBFloat16
  int grad32_scratch_ = -1;     // staging slice widening a bfloat16 gradient, or -1
  CpuIsa isa_ = best_cpu_isa();
  int64_t nonfinite_blocks_ = 0;
  std::vector<StateLayout> layouts_;      // reduced policies, per unit (set by adopt_unit)
  std::vector<ReducedState> m_res_, v_res_;  // reduced policies: resident float32 runs and absmax
  double io_s_ = 0, compute_s_ = 0, io_total_s_ = 0;
};

}  // namespace shardgan
