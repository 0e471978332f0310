#pragma once
/// Adam (Kingma & Ba 2015) and AdamW (Loshchilov & Hutter 2019) stepping only this rank's
/// flat shards (ZeRO paper, Sec. 5.1).
#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "shardgan/optim/fused_adam.h"
#include "shardgan/optim/optimizer.h"
#include "shardgan/optim/reduced_state.h"
#include "shardgan/optim/state_layout.h"

namespace shardgan {

class ShardedModel;

/// Adam options (DCGAN's defaults: Radford et al. 2016, Sec. 4).
struct AdamConfig {
  double lr = 2e-4;     ///< DCGAN's learning rate
  double beta1 = 0.5;   ///< DCGAN's beta1
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;            ///< L2 term (Adam) or decoupled decay (AdamW)
  bool decoupled_weight_decay = false;  ///< true: AdamW
  /// float32 shards only: also keep a bfloat16 or float16 copy of every shard, written by
  /// the fused kernel in the same pass (for a low-precision compute copy).
  ParamCopy param_copy = ParamCopy::kNone;
  /// The dtype m and v are stored in, per parameter (state_layout.h): float32 (the default:
  /// the shard's dtype, as torch::optim), bfloat16, or block-wise 8-bit. bfloat16 and int8
  /// need float32 CPU shards; int8 needs the model built with ShardingConfig::flat_align
  /// equal to state.block (so that sharded and unsharded steps quantize the same blocks).
  /// Its float32 globs are matched against "<unit>.<param>".
  StatePolicy state;
};

/// Whether Adam keeps m between steps for shards on `device_is_cpu`: not when beta1 == 0
/// on the CPU, where m is the current gradient (m = 0 * m + 1 * g) and the kernels start it
/// from zero each step (the BigGAN recipe, Brock et al. 2019, App. C). Torch's fused GPU
/// kernel needs the tensor, so GPU shards keep it.
bool adam_stores_m(double beta1, bool device_is_cpu);

/// Throws std::invalid_argument, naming the field and value, for a learning rate, beta,
/// epsilon or weight decay out of torch::optim::Adam's accepted range.
void validate_adam_config(const AdamConfig& cfg);

/// One Adam/AdamW step with torch ops on p, m and v (1-D, same length, dtype and device;
/// g read only), the same op sequence as torch::optim::Adam / AdamW in LibTorch 2.15 (and 1.13), for
/// shards the fused kernel does not take (float64, GPU). `step` is 1-based. Local.
void adam_torch_step(at::Tensor& p, const at::Tensor& g, at::Tensor& m, at::Tensor& v, const AdamConfig& cfg,
                     double lr, int64_t step);

/// The update is torch::optim::Adam's / AdamW's (LibTorch 2.15 and 1.13, no amsgrad), applied
/// element-wise to each unit's shard() with its grad_shard():
///   g' = g + wd*p (Adam) | p' = p*(1 - lr*wd) (AdamW)
///   m = beta1*m + (1-beta1)*g';  v = beta2*v + (1-beta2)*g'^2
///   p = p' - lr/(1-beta1^t) * m / (sqrt(v)/sqrt(1-beta2^t) + eps)
/// Contiguous float32 CPU shards go through the fused kernel (fused_adam.h); GPU shards
/// through torch's fused CUDA Adam (set_torch_fused); any other shard (float64 on the CPU)
/// through the same sequence of torch ops as torch::optim. With a reduced state dtype each
/// unit's shard is cut into runs (StateLayout): reduced runs go through fused_adam_bf16_step
/// or fused_adam8_step, float32 runs through fused_adam_step.
class ShardedAdam final : public ShardedOptimizer {
 public:
  /// Allocates the states (zeros; float32 policy: the shard's dtype and device) for every
  /// unit of `model`, which must outlive the optimizer. Throws std::invalid_argument on a
  /// bad hyperparameter or state policy, when param_copy or a reduced state dtype is asked
  /// for a shard that is not float32 on the CPU, or when int8 states meet a model whose
  /// flat_align is not state.block (naming the unit).
  ShardedAdam(ShardedModel& model, AdamConfig cfg);

  /// Float32 policy: {"exp_avg", "exp_avg_sq"} of unit `unit` (without "exp_avg" when m is
  /// not stored), live. Reduced policies: throws std::logic_error (the stores are not
  /// shard-shaped; read_unit_state gives float32 views).
  std::vector<std::pair<std::string, at::Tensor>> unit_state(size_t unit) override;
  std::vector<std::string> state_names() override;
  /// Reduced policies: fn gets a transient float32 tensor of shard_numel() elements, the
  /// states widened (bfloat16, exact) or dequantized (int8; checkpoints use
  /// read_unit_raw instead). Float32: the live tensors.
  void read_unit_state(size_t unit, const StateVisitor& fn) override;
  /// Reduced policies: fn fills a transient float32 tensor, which is then rounded to
  /// bfloat16 (exact for values that came from bfloat16) or requantized in the unit's
  /// blocks (int8: not the stored bits again in general). Float32: the live tensors.
  void write_unit_state(size_t unit, const StateVisitor& fn) override;
  int64_t state_bytes() override;
  /// int8: checkpoints store m (when stored) and v as held: per parameter, its codes and
  /// absmax (or float32 for parameters kept in float32), so a resume is bit-exact at any
  /// world size and stage with the same block. Other dtypes: none.
  std::vector<RawState> raw_states() override;
  int64_t raw_state_block() const override;
  void read_unit_raw(size_t unit, const RawVisitor& fn) override;
  /// int8: the stored bits where the checkpoint holds this parameter in the same block
  /// size; otherwise float32 values (a float32 checkpoint, another block or a parameter
  /// kept in float32 there), requantized here. Other dtypes: the default.
  void load_unit_state(size_t unit, StateSource& src) override;
  const char* type_name() const override { return cfg_.decoupled_weight_decay ? "adamw" : "adam"; }

  /// Per unit, the float32 store of m and v: float32 policy, 1-D shard_numel() elements in
  /// the shard's dtype and device (m undefined when not stored); reduced policies, the
  /// StateLayout's float32 runs, concatenated (float32_numel elements).
  std::vector<at::Tensor>& exp_avg() { return exp_avg_; }
  std::vector<at::Tensor>& exp_avg_sq() { return exp_avg_sq_; }
  /// The layout of unit `unit`'s shard (one float32 run under the float32 policy).
  const StateLayout& layout(size_t unit) const { return layouts_.at(unit); }
  /// Whether m is kept between steps (adam_stores_m for the model's device).
  bool stores_m() const { return stores_m_; }
  /// int8: blocks whose new m or v was not finite, summed over steps (their absmax is NaN,
  /// so the block's states read NaN, as float32 states would hold NaN).
  int64_t nonfinite_blocks() const { return nonfinite_blocks_; }
  /// The low-precision copy of unit `unit`'s shard (bfloat16 or float16, [S], CPU), current
  /// after every step and at construction; undefined when param_copy is kNone.
  at::Tensor& param_copy(size_t unit) { return copies_.at(unit); }
  /// Points unit `unit`'s copy at `out` instead (e.g. the owned slice of a compute-dtype
  /// full parameter), so the kernel writes there directly. `out`: contiguous CPU, the
  /// config's param_copy dtype, shard_numel() elements; kept alive by the optimizer.
  /// Throws std::invalid_argument otherwise, or when param_copy is kNone.
  void set_param_copy(size_t unit, at::Tensor out);
  const AdamConfig& config() const { return cfg_; }
  /// Kernel path used for float32 CPU shards (default: best_cpu_isa(); tests force others).
  void set_isa(CpuIsa isa) { isa_ = isa; }
  /// Shards on a GPU are stepped by torch's fused Adam (`at::_fused_adam_` /
  /// `at::_fused_adamw_`, the kernel of torch.optim.Adam(fused=True)), all units in one call.
  /// Tests set this to send float32/float64 CPU shards there too (torch has a CPU kernel),
  /// so the call is checked where no GPU is.
  void set_torch_fused(bool on) { torch_fused_ = on; }

 protected:
  void update() override;
  void after_frozen_restore(size_t unit) override;
  std::shared_ptr<void> keep_frozen_state(size_t unit, const Ranges& ranges) override;
  void restore_frozen_state(size_t unit, const Ranges& ranges, const std::shared_ptr<void>& kept) override;

 private:
  /// The reduced-precision store of one state of one unit: bfloat16 bits (kBFloat16, [L])
  /// or int8 codes (kByte, [L]) with float32 absmax ([blocks]).
  struct Reduced {
    at::Tensor values, absmax;
  };
  AdamConfig cfg_;
  CpuIsa isa_ = best_cpu_isa();
  bool torch_fused_ = false;
  bool stores_m_ = true;
  int64_t nonfinite_blocks_ = 0;
  std::vector<StateLayout> layouts_;
  std::vector<Reduced> m_red_, v_red_;
  std::vector<at::Tensor> exp_avg_, exp_avg_sq_, copies_;
  bool reduced() const { return cfg_.state.dtype != StateDtype::kFloat32; }
  /// Steps unit `i` run by run (reduced policies).
  void update_runs(size_t i, const AdamCoefficients& c);
  /// Handles on unit `unit`'s stores of m (`second` false) or v, and their format.
  ReducedState stores(size_t unit, bool second) const;
  ReducedFormat format(bool second) const;
  /// Reduced policies: the unit's m (`second` false) or v as float32 [S], or back.
  at::Tensor widen(size_t unit, bool second);
  void narrow(size_t unit, bool second, const at::Tensor& values);
  std::vector<at::Tensor> state_steps_;  // per unit, a 0-d float32 tensor on its device (torch fused Adam)
  /// Steps units `which` with at::_fused_adam(w)_.
  void torch_fused_step(const std::vector<size_t>& which);
};

}  // namespace shardgan
