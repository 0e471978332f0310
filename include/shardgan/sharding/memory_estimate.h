#pragma once
/// Memory pre-flight: the bytes one rank will hold for a model's training state, computed
/// from parameter counts alone, before anything is allocated (like DeepSpeed's
/// estimate_zero3_model_states_mem_needs_all_live, deepspeed/runtime/zero/stage3.py).
///
/// Everything here is pure and local: no collective, no tensor, no MPI. Sizes are in bytes
/// unless a name says elements ("numel"). All counts are per rank.
///
/// Reference point, the ZeRO paper (Rajbhandari et al. 2020, Sec. 3 and 5): mixed-precision
/// Adam holds 2Ψ (fp16 params) + 2Ψ (fp16 grads) + KΨ (fp32 master, momentum, variance;
/// K = 12) = 16Ψ bytes, partitioned as 2Ψ + 2Ψ + KΨ/N (stage 1), 2Ψ + (2 + K)Ψ/N (stage 2)
/// and (4 + K)Ψ/N (stage 3). The estimate follows shardgan's code, which differs from the
/// paper in two places: gradients end in a master-dtype (fp32) gradient shard, kept beside
/// the low-precision flat gradient at stages 0-1 (+4Ψ, +4Ψ/N) and instead of an fp16 one at
/// stages 2-3 (+2Ψ/N); and stage 3 keeps no low-precision parameter shard (-2Ψ/N: it is
/// cast from the master shard when gathering). With bfloat16 compute and reduce, stage 3 is
/// thus exactly the paper's 16Ψ/N (plus padding); tests/test_memory_estimate.cpp checks all
/// four. DeepSpeed's estimator (largest layer + 18Ψ/N at stage 3) is coarser.
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace shardgan {

/// One model's shape and sharding setup, as the estimator needs them.
struct ModelMemorySpec {
  /// Unpadded parameter count T of every sharding unit (elements), in any order.
  std::vector<int64_t> unit_numels;
  /// When set (one list per unit, in the order of unit_numels): each unit's parameters'
  /// elements, laid out with flat_align as FlatParam lays them out (flat_layout.h). Empty:
  /// each unit is one run of unit_numels[i] elements, which is exact for flat_align 1.
  std::vector<std::vector<int64_t>> unit_param_numels;
  int64_t flat_align = 1;  ///< ShardingConfig::flat_align
  /// When it has 4 entries (stages 0-3): the bytes of optimizer state this rank holds in
  /// RAM at each stage (the caller derives them from the optimizer's own layout, e.g.
  /// reduced-precision states, and, offloaded, what stays in RAM beside the store),
  /// replacing optimizer_states * S * master bytes. The ring is added to it.
  std::vector<int64_t> optimizer_state_bytes_by_stage;
  /// When it has 4 entries: the bytes of optimizer state this rank's checkpoint shard holds
  /// at each stage, when checkpoints store it as held (8-bit states: codes, absmax and
  /// float32 elements), not as optimizer_states flat master-dtype tensors.
  std::vector<int64_t> checkpoint_state_bytes_by_stage;
  int world_size = 1;  ///< N, ranks sharing the model (>= 1)
  int stage = 3;       ///< ZeRO stage 0-3
  /// Bytes per element of the master dtype (the module's dtype: 4 float32, 8 float64), of
  /// the compute dtype (2 bfloat16/float16, 4, 8) and of the reduce dtype (2, 4, 8). Equal
  /// byte counts are taken to mean the same dtype, as they do for float32 / float64 masters.
  int master_bytes = 4;
  int compute_bytes = 4;
  int reduce_bytes = 4;
  /// Optimizer state tensors per element, each in the master dtype: Adam/AdamW 2; SGD 0,
  /// or 1 with momentum; RMSprop 1, +1 with momentum, +1 centered. See optimizer_states().
  int optimizer_states = 2;
  /// Optimizer state offloaded to disk (offload.<model>.optimizer: disk): it costs RAM only
  /// for the streaming ring, these bytes (offload.buffer_count * offload.buffer_bytes), and
  /// optimizer_states * S * master bytes go to disk instead. Negative: not offloaded (cpu
  /// offload keeps the state in host memory, which is RAM here, plus the ring). With
  /// offload the estimate is an upper bound, not the exact accounting: the ring is capped
  /// at the largest unit, and the cpu tier keeps a single staging buffer.
  int64_t offload_ring_bytes = -1;
  bool offload_to_disk = false;
  /// Parameter offload to disk (offload.<model>.param: disk, stage 3): the master shard
  /// (S * master bytes) goes to disk as well and costs no RAM between steps. With cpu it
  /// stays in host memory, which is RAM here, and nothing changes.
  bool offload_params_to_disk = false;
  /// Gradient offload to disk (offload.<model>.gradient: disk, stages 2-3): the gradient
  /// shard (S * master bytes) leaves RAM; only the reduce-scatter's buffers stay.
  bool offload_grads_to_disk = false;
  /// Gradient offload to either tier (offload.<model>.gradient: cpu or disk, stages 2-3):
  /// up to ShardedModel::kMaxGradWritesPending reduce-scatter outputs (S * reduce bytes
  /// each) wait for the gradient writer during backward.
  bool offload_grads = false;
  /// An EMA of the weights (the generator's): one more master-dtype shard.
  bool ema = false;
  /// ShardingConfig::reshard_after_forward. False keeps every unit gathered from forward
  /// to backward, so the whole model counts as gathered at stage 3.
  bool reshard_after_forward = true;
  /// ZeRO++ hpZ (ShardingConfig::hpz_partition_size, resolved: the ranks per secondary
  /// group, >= 1, dividing world_size; 1 is off): at stage 3 each unit keeps P / K
  /// compute-dtype elements between steps.
  int hpz_partition_size = 1;
  /// The model runs a backward with its parameters frozen (D during the G step): its units
  /// stay gathered until that backward ends, so the whole model counts as gathered.
  bool frozen_backward = false;
  // Gradient accumulation (micro-batches) changes nothing here: stages 0-1 keep the flat
  // gradient whether or not they accumulate, and stages 2-3 reduce every micro-step.
};

/// Bytes per rank for one model at one stage.
struct ModelMemoryEstimate {
  int stage = 0;
  int world_size = 1;
  int64_t numel = 0;              ///< Ψ = sum of T (elements)
  int64_t padded_numel = 0;       ///< sum of P = ceil(T/N)*N at stages 1-3; Ψ at stage 0
  int64_t padding_elements = 0;   ///< padded_numel - numel (MemoryStats::padding_elements)
  int64_t shard_numel = 0;        ///< sum of S = P/N (T at stage 0): elements this rank owns

  // Persistent (between steps). Each equals the code's own accounting exactly.
  int64_t param_bytes = 0;            ///< == MemoryStats::param_shard_bytes
  int64_t grad_bytes = 0;             ///< == MemoryStats::grad_shard_bytes
  int64_t optimizer_state_bytes = 0;  ///< == ShardedOptimizer::state_bytes()
  int64_t ema_bytes = 0;              ///< == sum of ShardedEma::unit_shard() bytes
  /// hpZ: sum over units of P / K * compute bytes (stage 3, K > 1), held from a unit's first
  /// gather after an update to the next update; == MemoryStats::secondary_param_bytes once
  /// every unit has been gathered since the model's last update.
  int64_t secondary_param_bytes = 0;
  /// The part of grad_bytes that ShardedModel::zero_grad() releases after each optimizer
  /// step (S * master bytes per unit, unless the shard aliases the flat gradient: stages
  /// 0-1 with the reduce dtype equal to the master's): held only during the model's own
  /// update. == MemoryStats::grad_released_bytes.
  int64_t grad_released_bytes = 0;

  // Transient (during forward/backward), stage-dependent bounds.
  int64_t gathered_unit_bytes = 0;  ///< stage 3: largest unit gathered, max P * compute; else 0
  int gathered_units = 0;           ///< stage 3: units gathered at once, at most (see below)
  /// Stage 3: bound on MemoryStats::peak_full_param_bytes: the gathered_units largest units.
  /// With reshard_after_forward and prefetch that is 3 (the unit computing, the one
  /// prefetched, and in backward the one being reduced; docs/design.md), else every unit.
  int64_t gathered_peak_bytes = 0;
  /// Stage 3: every unit gathered at once, sum of P * compute bytes (ShardedModel::
  /// begin_higher_order keeps them so: the shared D forward, R1); else 0.
  int64_t whole_gathered_bytes = 0;
  /// == MemoryStats::comm_buffer_bytes after a backward that synced gradients: 0 at stage
  /// 0 (in-place all-reduce), max S * reduce at stage 1 (reduce-scatter output), and
  /// max (P + S) * reduce at stages 2-3 (flat gradient + output).
  int64_t comm_buffer_bytes = 0;
  /// Bound on gradient buffers alive in backward beyond the persistent ones: one unit's
  /// autograd .grad (max T * compute), plus at stage 0 a master-dtype copy of the reduced
  /// gradient when the reduce dtype differs, at stage 1 ShardedModel::kMaxReducesInFlight
  /// reduce-scatter outputs, and at stages 2-3 one flat gradient being filled plus
  /// kMaxReducesInFlight (flat + output) pairs in flight, and with gradient offload
  /// grad_write_pending_bytes.
  int64_t grad_transient_bytes = 0;
  /// Gradient offload at stages 2-3: ShardedModel::kMaxGradWritesPending reduce-scatter
  /// outputs (max S * reduce bytes each) waiting for the model's gradient writer; 0
  /// otherwise. Part of grad_transient_bytes.
  int64_t grad_write_pending_bytes = 0;

  /// The model's state at its own update (the ZeRO paper's model states, with the EMA).
  int64_t persistent_bytes() const {
    return param_bytes + grad_bytes + optimizer_state_bytes + ema_bytes + secondary_param_bytes;
  }
  int64_t transient_bytes() const { return gathered_peak_bytes + grad_transient_bytes; }
  /// persistent + transient: an upper estimate of this model's state at its peak, without
  /// activations, allocator overhead, or the MPI library's own buffers.
  int64_t peak_bytes() const { return persistent_bytes() + transient_bytes(); }
};

/// What of one model is alive at once in one phase of a training step (which phase holds
/// what: shardgan/train/step_phases.h, from the objective's order of events).
struct ModelAlive {
  enum class Gathered { kNone, kWindow, kWhole };
  bool held = true;         ///< this rank holds the model (split placement: one of the two)
  bool grad_shard = false;  ///< its released gradient shards are allocated (grad_released_bytes)
  /// Stage 3: none, the rolling window of a forward or backward (gathered_peak_bytes), or
  /// every unit (whole_gathered_bytes). Below stage 3 the estimate has no gathered bytes.
  Gathered gathered = Gathered::kNone;
  bool grad_buffers = false;  ///< its backward computes parameter gradients (grad_transient_bytes)
};

/// Bytes per rank of one model's buffers alive as `a` says: 0 when not held, else
/// persistent_bytes() without the released gradient shards, plus grad_released_bytes when
/// a.grad_shard, the gathered bytes of a.gathered, and grad_transient_bytes when
/// a.grad_buffers. Local, pure.
int64_t alive_bytes(const ModelMemoryEstimate& e, const ModelAlive& a);

/// The count without the step's phases: both models' persistent_bytes(), of which the
/// released gradient shards count only for the larger, as if no phase held both. That
/// holds for the alternating update and for the simultaneous one with d_steps 1 and no
/// shared D forward; with the shared D forward or d_steps > 1, G's shards wait for G's
/// update while D's are allocated, and this under-counts by the smaller of the two.
/// The pre-flight counts the phases instead (shardgan/train/step_phases.h);
/// this stays as the reference the phase count is compared with.
int64_t gan_state_bytes(const ModelMemoryEstimate& g, const ModelMemoryEstimate& d);
/// gan_state_bytes() plus both models' transient bounds (the old count, as above).
int64_t gan_peak_bytes(const ModelMemoryEstimate& g, const ModelMemoryEstimate& d);

/// State tensors per element of shardgan's optimizers: "adam"/"adamw" 2, "sgd" 0 or 1
/// (momentum != 0), "rmsprop" 1 + (momentum > 0) + centered. Throws std::invalid_argument
/// naming an unknown type.
int optimizer_states(const std::string& type, double momentum = 0.0, bool centered = false);

/// The estimate for spec.stage. Throws std::invalid_argument, naming the field, for a stage
/// outside 0-3, world_size < 1, a byte size other than those listed, a negative numel or
/// negative optimizer_states.
ModelMemoryEstimate estimate_model_memory(const ModelMemorySpec& spec);

/// The estimate at stages 0, 1, 2 and 3 (spec.stage ignored), indexed by stage.
std::array<ModelMemoryEstimate, 4> estimate_all_stages(const ModelMemorySpec& spec);

/// The lowest stage (least communication) whose peak_bytes() is <= limit_bytes, or nullopt
/// when none fits (spec.stage ignored).
std::optional<int> lowest_fitting_stage(const ModelMemorySpec& spec, int64_t limit_bytes);

/// One line for logs and error messages, e.g. "stage 3, N=4, 1.2M params: params 4800000 B,
/// grads ..., peak 23456789 B (0.022 GiB)".
std::string describe(const ModelMemoryEstimate& e);

/// Host memory in bytes.
struct HostMemory {
  int64_t total_bytes = 0;      ///< MemTotal, or the cgroup limit when smaller
  int64_t available_bytes = 0;  ///< MemAvailable, or the cgroup's headroom when smaller
};

/// Reads /proc/meminfo (MemTotal, MemAvailable) and caps both by the cgroup v2 limit in
/// /sys/fs/cgroup/memory.max when it is a number smaller than MemTotal: total becomes the
/// limit, available at most limit - memory.current (0 if over). Host-wide, not per rank:
/// divide by the ranks on this host. Throws std::runtime_error naming /proc/meminfo if it
/// cannot be read or lacks either field. A missing or "max" cgroup file means no limit.
HostMemory read_host_memory();
/// The same with other files (tests). `cgroup_max` may name a missing file; memory.current
/// is looked for next to it.
HostMemory read_host_memory(const std::string& meminfo, const std::string& cgroup_max);

}  // namespace shardgan
