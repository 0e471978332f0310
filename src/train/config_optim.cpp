// The optim, ema and loss_scale sections of the training configuration
// (config_sections.h): each model's optimizer and learning-rate schedule, G's EMA, and the
// dynamic loss scale of float16 compute.
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "shardgan/optim/fused_adam.h"
#include "shardgan/optim/state_layout.h"

#include "shardgan/train/config_sections.h"

namespace shardgan::config_sections {
namespace {

OptimizerConfig read_model_optim(Reader& r, const std::string& who, int64_t steps) {
  OptimizerConfig c = OptimizerConfig::dcgan();
  const std::string p = "optim." + who + ".";
  const std::string type = r.get<std::string>(p + "type", "adam", "optimizer: adam, adamw, sgd or rmsprop");
  try {
    c.type = parse_optimizer_type(type);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(r.source() + ": key '" + p + "type' " + e.what());
  }
  c.lr = r.get<double>(p + "lr", c.lr, "learning rate");
  require(c.lr > 0, r, p + "lr", "must be > 0");
  c.beta1 = r.get<double>(p + "beta1", c.beta1, "Adam/AdamW first-moment decay");
  require(c.beta1 >= 0 && c.beta1 < 1, r, p + "beta1", "must be in [0, 1)");
  c.beta2 = r.get<double>(p + "beta2", c.beta2, "Adam/AdamW second-moment decay");
  require(c.beta2 >= 0 && c.beta2 < 1, r, p + "beta2", "must be in [0, 1)");
  c.eps = r.get<double>(p + "eps", c.eps, "Adam/AdamW/RMSprop denominator epsilon");
  require(c.eps >= 0, r, p + "eps", "must be >= 0");
  c.weight_decay = r.get<double>(p + "weight_decay", c.weight_decay,
      "weight decay (L2 for adam/sgd/rmsprop, decoupled for adamw)");
  require(c.weight_decay >= 0, r, p + "weight_decay", "must be >= 0");
  c.momentum = r.get<double>(p + "momentum", c.momentum, "SGD/RMSprop momentum");
  require(c.momentum >= 0 && c.momentum < 1, r, p + "momentum", "must be in [0, 1)");
  c.dampening = r.get<double>(p + "dampening", c.dampening, "SGD dampening");
  require(c.dampening >= 0 && c.dampening <= 1, r, p + "dampening", "must be in [0, 1]");
  c.nesterov = r.get<bool>(p + "nesterov", c.nesterov, "SGD Nesterov momentum");
  require(!c.nesterov || c.type != OptimizerType::kSgd || (c.momentum > 0 && c.dampening == 0), r,
          p + "nesterov", "needs momentum > 0 and dampening 0");
  c.alpha = r.get<double>(p + "alpha", c.alpha, "RMSprop smoothing constant");
  require(c.alpha >= 0 && c.alpha < 1, r, p + "alpha", "must be in [0, 1)");
  c.centered = r.get<bool>(p + "centered", c.centered, "RMSprop: normalize by the centered second moment");
  const std::string sched = r.get<std::string>(p + "schedule", "constant",
      "learning-rate schedule: constant, linear_warmup (warm-up, then constant), cosine or step; all but constant "
      "start with warmup_steps of linear warm-up");
  try {
    c.schedule.kind = parse_lr_schedule(sched);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(r.source() + ": key '" + p + "schedule' " + e.what());
  }
  c.schedule.warmup_steps = r.get<int64_t>(p + "warmup_steps", 0, "steps of linear warm-up from 0 to lr");
  require(c.schedule.warmup_steps >= 0, r, p + "warmup_steps", "must be >= 0");
  // Defaults to train.steps; pin it when a run is resumed with a different train.steps.
  c.schedule.total_steps = r.get<int64_t>(p + "total_steps", steps,
      "steps the schedule spans (defaults to train.steps; pin it when resuming with another train.steps)");
  require(c.schedule.total_steps >= 0, r, p + "total_steps", "must be >= 0");
  c.schedule.min_lr = r.get<double>(p + "min_lr", 0.0, "the cosine schedule's final learning rate");
  require(c.schedule.min_lr >= 0, r, p + "min_lr", "must be >= 0");
  c.schedule.step_size = r.get<int64_t>(p + "step_size", 0, "step schedule: steps between decays");
  require(c.schedule.step_size >= 0, r, p + "step_size", "must be >= 0");
  c.schedule.gamma = r.get<double>(p + "gamma", 0.1, "step schedule: factor applied every step_size steps");
  require(c.schedule.gamma > 0, r, p + "gamma", "must be > 0");
  const bool adam = c.type == OptimizerType::kAdam || c.type == OptimizerType::kAdamW;
  const std::string sd = r.get<std::string>(p + "state_dtype", "float32",
      "dtype Adam's m and v are stored in: float32, bfloat16 (round to nearest even) or int8 (block-wise dynamic "
      "8-bit, Dettmers et al. 2022); with beta1 0 on the CPU, m is not stored in any of them");
  try {
    c.state.dtype = parse_state_dtype(sd);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(r.source() + ": key '" + p + "state_dtype' " + e.what());
  }
  require(adam || c.state.dtype == StateDtype::kFloat32, r, p + "state_dtype",
          "must be float32 unless optim." + who + ".type is adam or adamw");
  c.state.block = r.get<int64_t>(p + "state_block", c.state.block,
      "int8 states: elements per float32 absmax block (bitsandbytes' 256); parameters are aligned to it in the "
      "flat parameter");
  require(c.state.block >= 1 && c.state.block <= kMaxStateBlock, r, p + "state_block",
          "must be 1 to " + std::to_string(kMaxStateBlock));
  c.state.min_numel = r.get<int64_t>(p + "state_min_numel", c.state.min_numel,
      "parameters with fewer elements keep float32 states (bitsandbytes' min_8bit_size)");
  require(c.state.min_numel >= 0, r, p + "state_min_numel", "must be >= 0");
  c.state.float32 = r.get<std::vector<std::string>>(p + "state_float32", {"family"},
      "globs of '<unit>.<param>' names whose states stay float32; the entry 'family' stands for the model family's "
      "sparse-gradient parameters (BigGAN: the class embeddings)");
  const bool lowp = c.state.dtype != StateDtype::kFloat32;
  r.warn_if_ignored(c.state.dtype != StateDtype::kInt8, p + "state_block", "has no effect unless state_dtype is int8");
  r.warn_if_ignored(!lowp, p + "state_min_numel", "has no effect when state_dtype is float32");
  r.warn_if_ignored(!lowp, p + "state_float32", "has no effect when state_dtype is float32");
  try {
    LrSchedule check(c.lr, c.schedule);  // validates the schedule's fields
  } catch (const std::invalid_argument& e) {
    throw ConfigError(r.source() + ": optim." + who + " schedule: " + e.what());
  }
  return c;
}

}  // namespace

void read_optim(Reader& r, TrainConfig& c) {
  c.g_optim = read_model_optim(r, "generator", c.steps);
  c.d_optim = read_model_optim(r, "discriminator", c.steps);
  // 8-bit blocks never span two parameters or two ranks: the flat parameter aligns every
  // parameter and shard boundary to the block (flat_layout.h), and only then.
  for (auto [oc, sc] : {std::pair{&c.g_optim, &c.g_sharding}, std::pair{&c.d_optim, &c.d_sharding}}) {
    sc->flat_align = oc->state.dtype == StateDtype::kInt8 ? oc->state.block : 1;
  }
}

void read_ema(Reader& r, TrainConfig& c) {
  c.ema_enabled = r.get<bool>("ema.enabled", c.ema_enabled,
      "keep a sharded EMA of G's parameters, and sample and evaluate it too");
  c.ema.half_life_kimg = r.get<double>("ema.half_life_kimg", c.ema.half_life_kimg,
      "StyleGAN2-ADA's ema_kimg: the EMA's half-life in thousands of images, in place of ema.decay (0: use "
      "ema.decay; paper256 20, cifar 500)");
  require(c.ema.half_life_kimg >= 0 && std::isfinite(c.ema.half_life_kimg), r, "ema.half_life_kimg",
          "must be a finite value >= 0 (0 = use ema.decay)");
  c.ema.rampup = r.get<double>("ema.rampup", c.ema.rampup,
      "StyleGAN2-ADA's ema_rampup: the half-life is at most this fraction of the images seen (cifar 0.05; 0: off)");
  require(c.ema.rampup >= 0 && std::isfinite(c.ema.rampup), r, "ema.rampup", "must be a finite value >= 0 (0 = off)");
  r.warn_if_ignored(c.ema.half_life_kimg == 0, "ema.rampup", "has no effect with ema.half_life_kimg 0");
  c.ema.batch = c.global_batch;
  c.ema.decay = r.get<double>("ema.decay", c.ema.decay, "EMA decay per step");
  require(c.ema.decay >= 0 && c.ema.decay <= 1, r, "ema.decay", "must be in [0, 1]");
  r.warn_if_ignored(c.ema.half_life_kimg > 0, "ema.decay", "has no effect with ema.half_life_kimg above 0");
  c.ema.start_step = r.get<int64_t>("ema.start_step", c.ema.start_step,
      "step at which the EMA starts (before: a copy of G)");
  require(c.ema.start_step >= 0, r, "ema.start_step", "must be >= 0");
  require(!c.ema_enabled || c.g_optim.offload.param == OffloadDevice::kNone, r, "ema.enabled",
          "cannot be true with offload.generator.param: the EMA reads and swaps the generator's master shards, "
          "which live in the offload tier (set ema.enabled: false, or offload.generator.param: none)");
}

void read_loss_scale(Reader& r, TrainConfig& c) {
  c.loss_scale.init_scale = r.get<double>("loss_scale.init_scale", c.loss_scale.init_scale,
      "initial dynamic loss scale (float16 compute only)");
  require(c.loss_scale.init_scale > 0, r, "loss_scale.init_scale", "must be > 0");
  c.loss_scale.growth_interval = r.get<int64_t>("loss_scale.growth_interval", c.loss_scale.growth_interval,
      "overflow-free steps before the loss scale doubles");
  require(c.loss_scale.growth_interval >= 1, r, "loss_scale.growth_interval", "must be >= 1");
  c.loss_scale.hysteresis = r.get<int64_t>("loss_scale.hysteresis", c.loss_scale.hysteresis,
      "overflows tolerated before the loss scale halves");
  require(c.loss_scale.hysteresis >= 1, r, "loss_scale.hysteresis", "must be >= 1");
}

}  // namespace shardgan::config_sections
