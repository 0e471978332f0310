#include "shardgan/optim/factory.h"

#include <cmath>
#include <stdexcept>
#include <string>

#include "shardgan/optim/offloaded_adam.h"
#include "shardgan/optim/sharded_adam.h"
#include "shardgan/optim/sharded_rmsprop.h"
#include "shardgan/optim/sharded_sgd.h"

namespace shardgan {

const char* to_string(OptimizerType t) {
  switch (t) {
    case OptimizerType::kAdam: return "adam";
    case OptimizerType::kAdamW: return "adamw";
    case OptimizerType::kSgd: return "sgd";
    case OptimizerType::kRmsprop: return "rmsprop";
  }
  return "?";
}

OptimizerType parse_optimizer_type(const std::string& s) {
  for (auto t : {OptimizerType::kAdam, OptimizerType::kAdamW, OptimizerType::kSgd, OptimizerType::kRmsprop}) {
    if (s == to_string(t)) return t;
  }
  throw std::invalid_argument("Invalid optimizer type '" + s + "': expected adam, adamw, sgd or rmsprop");
}

OptimizerConfig OptimizerConfig::dcgan() { return OptimizerConfig{}; }

OptimizerConfig OptimizerConfig::biggan_generator() {
  OptimizerConfig c;
  c.lr = 1e-4;
  c.beta1 = 0.0;
  c.beta2 = 0.999;
  return c;
}

OptimizerConfig OptimizerConfig::biggan_discriminator() {
  OptimizerConfig c = biggan_generator();
  c.lr = 4e-4;
  return c;
}

AdamConfig adam_config(const OptimizerConfig& cfg) {
  if (cfg.type != OptimizerType::kAdam && cfg.type != OptimizerType::kAdamW) {
    throw std::invalid_argument(std::string("adam_config: the optimizer is ") + to_string(cfg.type));
  }
  AdamConfig a;
  a.lr = cfg.lr;
  a.beta1 = cfg.beta1;
  a.beta2 = cfg.beta2;
  a.eps = cfg.eps;
  a.weight_decay = cfg.weight_decay;
  a.decoupled_weight_decay = cfg.type == OptimizerType::kAdamW;
  a.param_copy = cfg.param_copy;
  a.state = cfg.state;
  return a;
}

void resolve_state_float32(OptimizerConfig& cfg, const std::vector<std::string>& sparse_params) {
  std::vector<std::string> out;
  for (const std::string& g : cfg.state.float32) {
    if (g == "family") out.insert(out.end(), sparse_params.begin(), sparse_params.end());
    else out.push_back(g);
  }
  cfg.state.float32 = std::move(out);
}

OptimizerConfig lazy_corrected(OptimizerConfig cfg, double c) {
  if (!(c > 0 && c <= 1)) throw std::invalid_argument("lazy_corrected: c must be in (0, 1], not " + std::to_string(c));
  cfg.lr *= c;
  cfg.schedule.min_lr *= c;
  if (cfg.type == OptimizerType::kAdam || cfg.type == OptimizerType::kAdamW) {
    cfg.beta1 = std::pow(cfg.beta1, c);
    cfg.beta2 = std::pow(cfg.beta2, c);
  }
  return cfg;
}

std::unique_ptr<ShardedOptimizer> make_optimizer(ShardedModel& model, const OptimizerConfig& cfg) {
  std::unique_ptr<ShardedOptimizer> opt;
  if (cfg.param_copy != ParamCopy::kNone && cfg.type != OptimizerType::kAdam &&
      cfg.type != OptimizerType::kAdamW) {
    throw std::invalid_argument(std::string("param_copy is only supported by adam and adamw, not ") +
                                to_string(cfg.type));
  }
  if (cfg.offload.optimizer != OffloadDevice::kNone && cfg.type != OptimizerType::kAdam &&
      cfg.type != OptimizerType::kAdamW) {
    throw std::invalid_argument(std::string("optimizer offload supports adam and adamw, not ") + to_string(cfg.type));
  }
  if (cfg.state.dtype != StateDtype::kFloat32 && cfg.type != OptimizerType::kAdam && cfg.type != OptimizerType::kAdamW) {
    throw std::invalid_argument(std::string("state_dtype ") + to_string(cfg.state.dtype) +
                                " is only supported by adam and adamw, not " + to_string(cfg.type));
  }
  switch (cfg.type) {
    case OptimizerType::kAdam:
    case OptimizerType::kAdamW: {
      const AdamConfig a = adam_config(cfg);
      if (cfg.offload.optimizer != OffloadDevice::kNone) opt = std::make_unique<OffloadedAdam>(model, a, cfg.offload);
      else opt = std::make_unique<ShardedAdam>(model, a);
      break;
    }
    case OptimizerType::kSgd:
      opt = std::make_unique<ShardedSgd>(
          model, SgdConfig{cfg.lr, cfg.momentum, cfg.dampening, cfg.weight_decay, cfg.nesterov});
      break;
    case OptimizerType::kRmsprop:
      opt = std::make_unique<ShardedRmsprop>(
          model, RmspropConfig{cfg.lr, cfg.alpha, cfg.eps, cfg.weight_decay, cfg.momentum, cfg.centered});
      break;
  }
  opt->set_schedule(LrSchedule(cfg.lr, cfg.schedule));
  return opt;
}

}  // namespace shardgan
