#pragma once
/// One options struct for every optimizer, and the factory the trainer calls once per
/// model (TTUR, Heusel et al. 2017: G and D get their own learning rates and betas).
#include <memory>
#include <string>
#include <vector>

#include "shardgan/offload/offload_config.h"
#include "shardgan/optim/fused_adam.h"
#include "shardgan/optim/lr_schedule.h"
#include "shardgan/optim/optimizer.h"
#include "shardgan/optim/sharded_adam.h"
#include "shardgan/optim/state_layout.h"

namespace shardgan {

class ShardedModel;

enum class OptimizerType { kAdam, kAdamW, kSgd, kRmsprop };
/// "adam", "adamw", "sgd", "rmsprop".
const char* to_string(OptimizerType t);
/// Inverse of to_string; throws std::invalid_argument naming the accepted values.
OptimizerType parse_optimizer_type(const std::string& s);

/// Per-model optimizer options (YAML: optim.generator.*, optim.discriminator.*). A field
/// that the chosen type does not use is ignored. Changing a field after make_optimizer has
/// no effect on the optimizer made.
struct OptimizerConfig {
  OptimizerType type = OptimizerType::kAdam;
  double lr = 2e-4;            ///< base learning rate (all types)
  double beta1 = 0.5;          ///< adam, adamw
  double beta2 = 0.999;        ///< adam, adamw
  double eps = 1e-8;           ///< adam, adamw, rmsprop
  double weight_decay = 0.0;   ///< all: L2 (adam, sgd, rmsprop) or decoupled (adamw)
  double momentum = 0.0;       ///< sgd, rmsprop
  double dampening = 0.0;      ///< sgd
  bool nesterov = false;       ///< sgd
  double alpha = 0.99;         ///< rmsprop
  bool centered = false;       ///< rmsprop
  LrScheduleConfig schedule;   ///< all
  /// adam, adamw on float32 CPU shards: bfloat16/float16 copy written by the fused kernel.
  ParamCopy param_copy = ParamCopy::kNone;
  /// offload.<model>.* and the shared offload.* keys: adam and adamw only (offloaded_adam.h).
  OffloadConfig offload;
  /// adam, adamw: optim.<model>.state_dtype, state_block, state_min_numel, state_float32.
  /// An entry "family" in state.float32 stands for the model family's sparse-gradient
  /// parameters (resolve_state_float32); the default is just that entry.
  StatePolicy state = [] {
    StatePolicy p;
    p.float32 = {"family"};
    return p;
  }();

  /// DCGAN (Radford et al. 2016, Sec. 4): Adam, lr 2e-4, betas (0.5, 0.999).
  static OptimizerConfig dcgan();
  /// BigGAN (Brock et al. 2019, Sec. 3 and App. C): Adam, betas (0, 0.999), lr 1e-4 for G
  /// and 4e-4 for D.
  static OptimizerConfig biggan_generator();
  static OptimizerConfig biggan_discriminator();
};

/// Replaces each "family" entry of cfg.state.float32 by `sparse_params` (ModelSpec::
/// sparse_params: the family's class embeddings). The optimizer and the pre-flight both
/// call it, so they agree on which states stay float32.
void resolve_state_float32(OptimizerConfig& cfg, const std::vector<std::string>& sparse_params);

/// `cfg` with StyleGAN2's lazy regularization correction `c` in (0, 1] (Karras et al. 2020,
/// arXiv:1912.04958, Appendix B: an optimizer that also takes a regularization update every
/// I-th step, c = I / (I + 1)): lr and schedule.min_lr multiplied by c, and for adam and
/// adamw beta1 and beta2 raised to the power c. Throws std::invalid_argument for c outside
/// (0, 1]. Local, pure.
OptimizerConfig lazy_corrected(OptimizerConfig cfg, double c);

/// Builds the optimizer for `model` (which must outlive it), with the schedule set: an
/// OffloadedAdam when offload.optimizer is cpu or disk. Throws std::invalid_argument naming
/// the bad field and value, OffloadError (naming the path) when the disk tier cannot be set up.
std::unique_ptr<ShardedOptimizer> make_optimizer(ShardedModel& model, const OptimizerConfig& cfg);
/// The AdamConfig of an adam or adamw OptimizerConfig (the hyperparameters and param_copy).
/// Throws std::invalid_argument for another type.
AdamConfig adam_config(const OptimizerConfig& cfg);

}  // namespace shardgan
