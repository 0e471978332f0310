#pragma once
/// Adam (Kingma & Ba 2015) and AdamW (Loshchilov & Hutter 2019) stepping only this rank's
/// flat shards (ZeRO paper, Sec. 5.1).
#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "shardgan/optim/fused_adam.h"
#include "shardgan/optim/optimizer.h"

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
};

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
/// through the same sequence of torch ops as torch::optim.
class ShardedAdam final : public ShardedOptimizer {
 public:
  /// Allocates exp_avg and exp_avg_sq (zeros, the shard's dtype and device) for every unit
  /// of `model`, which must outlive the optimizer. Throws std::invalid_argument on a bad
  /// hyperparameter, or when param_copy is asked for a shard that is not float32 on the CPU.
  ShardedAdam(ShardedModel& model, AdamConfig cfg);

  /// {"exp_avg", "exp_avg_sq"} of unit `unit`.
  std::vector<std::pair<std::string, at::Tensor>> unit_state(size_t unit) override;
  const char* type_name() const override { return cfg_.decoupled_weight_decay ? "adamw" : "adam"; }

  /// Per unit, first and second moments: 1-D, shard_numel() elements, shard dtype, device.
  std::vector<at::Tensor>& exp_avg() { return exp_avg_; }
  std::vector<at::Tensor>& exp_avg_sq() { return exp_avg_sq_; }
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

 private:
  AdamConfig cfg_;
  CpuIsa isa_ = best_cpu_isa();
  bool torch_fused_ = false;
  std::vector<at::Tensor> exp_avg_, exp_avg_sq_, copies_;
  std::vector<at::Tensor> state_steps_;  // per unit, a 0-d float32 tensor on its device (torch fused Adam)
  /// Steps units `which` with at::_fused_adam(w)_.
  void torch_fused_step(const std::vector<size_t>& which);
};

}  // namespace shardgan
