#include "shardgan/train/config.h"

#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include <yaml-cpp/yaml.h>

#include "shardgan/device/device.h"
#include "shardgan/models/family.h"

namespace shardgan {
namespace {

using Flat = std::map<std::string, std::string>;

// A config has about 80 nodes. Aliases can make a small file a huge tree ("billion laughs":
// each level refers twice to the one before), which would take forever to walk.
constexpr size_t kMaxNodes = 10000;

void flatten(const YAML::Node& node, const std::string& prefix, Flat& out,
             const std::string& source, size_t& visited) {
  if (++visited > kMaxNodes) {
    throw ConfigError(source + ": more than " + std::to_string(kMaxNodes) + " keys and values (near key '" +
                      prefix + "'); are aliases expanding it?");
  }
  if (node.IsMap() && node.size() == 0 && !prefix.empty()) {
    // Kept, so that "key: {}" is a bad value of the key instead of silently meaning its
    // default; an empty section ("ema: {}") is allowed (ConfigReader::check_all_known).
    if (out.count(prefix)) throw ConfigError(source + ": key '" + prefix + "' is set twice; keep one");
    out[prefix] = "{}";
    return;
  }
  if (node.IsMap()) {
    std::set<std::string> keys;
    for (auto it = node.begin(); it != node.end(); ++it) {
      std::string key = it->first.as<std::string>();
      const std::string full = prefix.empty() ? key : prefix + "." + key;
      // yaml-cpp keeps both entries of a duplicate key, and the later one would silently win.
      if (!keys.insert(key).second) {
        throw ConfigError(source + ": key '" + full + "' appears twice in the same map; keep one");
      }
      flatten(it->second, full, out, source, visited);
    }
    return;
  }
  if (out.count(prefix)) {  // e.g. "train.steps: 1" beside "train: {steps: 2}"
    throw ConfigError(source + ": key '" + prefix + "' is set twice; keep one");
  }
  if (node.IsScalar()) {
    out[prefix] = node.Scalar();
  } else if (node.IsNull()) {
    out[prefix] = "";
  } else if (node.IsSequence()) {
    YAML::Emitter e;  // kept as YAML text; the reader parses it as a list
    e << YAML::Flow << node;
    out[prefix] = e.c_str();
  } else {
    throw ConfigError(source + ": key '" + prefix + "' must be a scalar, a list or a map");
  }
}

using Reader = ConfigReader;

void require(bool ok, const Reader& r, const std::string& key, const std::string& what) {
  r.require(ok, key, what);
}

ShardingConfig read_sharding(Reader& r, const std::string& who) {
  ShardingConfig c;
  const std::string k = "sharding." + who + ".stage";
  c.stage = r.get<int>(k, 3);
  require(c.stage >= 0 && c.stage <= 3, r, k, "must be 0, 1, 2 or 3");
  c.reshard_after_forward = r.get<bool>("sharding." + who + ".reshard_after_forward", true);
  c.activation_checkpointing = r.get<bool>("sharding." + who + ".activation_checkpointing", false);
  c.checkpoint_segments = r.get<bool>("sharding." + who + ".checkpoint_segments", false);
  require(!c.checkpoint_segments || c.activation_checkpointing, r, "sharding." + who + ".checkpoint_segments",
          "needs sharding." + who + ".activation_checkpointing: true (segments are checkpointed inside a "
          "checkpointed unit)");
  c.read_ahead = r.get<bool>("sharding." + who + ".read_ahead", true);
  c.node_shared_gather = r.get<bool>("sharding." + who + ".node_shared_gather", false);
  for (const char* what : {"compute_dtype", "reduce_dtype"}) {
    const std::string key = "sharding." + who + "." + what;
    const std::string v = r.get<std::string>(key, "auto");
    require(v == "auto" || v == "float32" || v == "float64" || v == "bfloat16" || v == "float16",
            r, key, "must be auto (the model dtype), float32, float64, bfloat16 or float16");
    c10::optional<at::ScalarType> t;
    if (v == "float32") t = at::kFloat;
    if (v == "float64") t = at::kDouble;
    if (v == "bfloat16") t = at::kBFloat16;
    if (v == "float16") t = at::kHalf;
    (std::string(what) == "compute_dtype" ? c.compute_dtype : c.reduce_dtype) = t;
  }
  return c;
}

// sharding.<who>.replicate_degree: an integer >= 1, or auto (0: one group per node).
int read_replicate_degree(Reader& r, const std::string& who, const ShardingConfig& sc) {
  const std::string key = "sharding." + who + ".replicate_degree";
  const std::string v = r.get<std::string>(key, "1");
  int R = 0;
  if (v != "auto") {
    char* end = nullptr;
    const long x = std::strtol(v.c_str(), &end, 10);
    require(!v.empty() && *end == '\0' && x >= 1 && x <= 1 << 20, r, key,
            "must be auto (one replica group per node) or an integer >= 1 (the number of replica groups)");
    R = static_cast<int>(x);
  }
  require(R == 1 || sc.stage >= 1, r, key,
          "needs sharding." + who + ".stage 1, 2 or 3: stage 0 already replicates everything on every rank");
  return R;
}

OptimizerConfig read_optim(Reader& r, const std::string& who, int64_t steps) {
  OptimizerConfig c = OptimizerConfig::dcgan();
  const std::string p = "optim." + who + ".";
  const std::string type = r.get<std::string>(p + "type", "adam");
  try {
    c.type = parse_optimizer_type(type);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(r.source() + ": key '" + p + "type' " + e.what());
  }
  c.lr = r.get<double>(p + "lr", c.lr);
  require(c.lr > 0, r, p + "lr", "must be > 0");
  c.beta1 = r.get<double>(p + "beta1", c.beta1);
  require(c.beta1 >= 0 && c.beta1 < 1, r, p + "beta1", "must be in [0, 1)");
  c.beta2 = r.get<double>(p + "beta2", c.beta2);
  require(c.beta2 >= 0 && c.beta2 < 1, r, p + "beta2", "must be in [0, 1)");
  c.eps = r.get<double>(p + "eps", c.eps);
  require(c.eps >= 0, r, p + "eps", "must be >= 0");
  c.weight_decay = r.get<double>(p + "weight_decay", c.weight_decay);
  require(c.weight_decay >= 0, r, p + "weight_decay", "must be >= 0");
  c.momentum = r.get<double>(p + "momentum", c.momentum);
  require(c.momentum >= 0 && c.momentum < 1, r, p + "momentum", "must be in [0, 1)");
  c.dampening = r.get<double>(p + "dampening", c.dampening);
  require(c.dampening >= 0 && c.dampening <= 1, r, p + "dampening", "must be in [0, 1]");
  c.nesterov = r.get<bool>(p + "nesterov", c.nesterov);
  require(!c.nesterov || c.type != OptimizerType::kSgd || (c.momentum > 0 && c.dampening == 0), r,
          p + "nesterov", "needs momentum > 0 and dampening 0");
  c.alpha = r.get<double>(p + "alpha", c.alpha);
  require(c.alpha >= 0 && c.alpha < 1, r, p + "alpha", "must be in [0, 1)");
  c.centered = r.get<bool>(p + "centered", c.centered);
  const std::string sched = r.get<std::string>(p + "schedule", "constant");
  try {
    c.schedule.kind = parse_lr_schedule(sched);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(r.source() + ": key '" + p + "schedule' " + e.what());
  }
  c.schedule.warmup_steps = r.get<int64_t>(p + "warmup_steps", 0);
  require(c.schedule.warmup_steps >= 0, r, p + "warmup_steps", "must be >= 0");
  // Defaults to train.steps; pin it when a run is resumed with a different train.steps.
  c.schedule.total_steps = r.get<int64_t>(p + "total_steps", steps);
  require(c.schedule.total_steps >= 0, r, p + "total_steps", "must be >= 0");
  c.schedule.min_lr = r.get<double>(p + "min_lr", 0.0);
  require(c.schedule.min_lr >= 0, r, p + "min_lr", "must be >= 0");
  c.schedule.step_size = r.get<int64_t>(p + "step_size", 0);
  require(c.schedule.step_size >= 0, r, p + "step_size", "must be >= 0");
  c.schedule.gamma = r.get<double>(p + "gamma", 0.1);
  require(c.schedule.gamma > 0, r, p + "gamma", "must be > 0");
  try {
    LrSchedule check(c.lr, c.schedule);  // validates the schedule's fields
  } catch (const std::invalid_argument& e) {
    throw ConfigError(r.source() + ": optim." + who + " schedule: " + e.what());
  }
  return c;
}

// offload.path and the ring settings are shared; offload.<model>.{optimizer,param} are not.
void read_offload(Reader& r, TrainConfig& c) {
  OffloadConfig shared;
  shared.path = r.get<std::string>("offload.path", "");
  shared.buffer_bytes = r.get<int64_t>("offload.buffer_bytes", shared.buffer_bytes);
  require(shared.buffer_bytes >= (int64_t{1} << 20) && shared.buffer_bytes <= (int64_t{1} << 34) &&
              shared.buffer_bytes % 4096 == 0,
          r, "offload.buffer_bytes", "must be a multiple of 4096 from 1048576 (1 MiB) to 17179869184 (16 GiB)");
  shared.buffer_count = r.get<int64_t>("offload.buffer_count", shared.buffer_count);
  require(shared.buffer_count >= 2 && shared.buffer_count <= 64, r, "offload.buffer_count", "must be 2 to 64");
  shared.queue_depth = r.get<int64_t>("offload.queue_depth", shared.queue_depth);
  require(shared.queue_depth >= 1 && shared.queue_depth <= 4096, r, "offload.queue_depth", "must be 1 to 4096");
  shared.overlap_copies = r.get<bool>("offload.overlap_copies", shared.overlap_copies);
  shared.copy_block_bytes = r.get<int64_t>("offload.copy_block_bytes", shared.copy_block_bytes);
  require(shared.copy_block_bytes >= 4096 && shared.copy_block_bytes <= (int64_t{1} << 34) &&
              shared.copy_block_bytes % 4096 == 0,
          r, "offload.copy_block_bytes", "must be a multiple of 4096 from 4096 to 17179869184 (16 GiB)");
  for (auto [who, oc, sc] : {std::tuple{"generator", &c.g_optim, &c.g_sharding},
                             std::tuple{"discriminator", &c.d_optim, &c.d_sharding}}) {
    OffloadConfig o = shared;
    const std::string w = who;
    for (auto [what, dst] : {std::pair{"optimizer", &o.optimizer}, std::pair{"param", &o.param}}) {
      const std::string key = "offload." + w + "." + what;
      try {
        *dst = parse_offload_device(r.get<std::string>(key, "none"));
      } catch (const std::invalid_argument& e) {
        throw ConfigError(r.source() + ": key '" + key + "' " + e.what());
      }
    }
    require(o.optimizer == OffloadDevice::kNone || oc->type == OptimizerType::kAdam || oc->type == OptimizerType::kAdamW,
            r, "offload." + w + ".optimizer",
            "needs optim." + w + ".type adam or adamw (the offloaded step is the fused CPU Adam), not " +
                to_string(oc->type));
    require(o.param == OffloadDevice::kNone || sc->stage == 3, r, "offload." + w + ".param",
            "needs sharding." + w + ".stage 3: parameter offload moves parameter shards, which only stage 3 keeps");
    require(o.param == OffloadDevice::kNone || o.param == o.optimizer, r, "offload." + w + ".param",
            "needs offload." + w + ".optimizer on the same device (" + to_string(o.param) +
                "): the master shard and its Adam moments share one store");
    oc->offload = o;
  }
}

}  // namespace

TrainConfig parse_config(const std::string& yaml_text, const std::string& source,
                         const std::vector<std::string>& overrides) {
  Flat flat;
  try {
    // YAML::Load would read the first document and silently drop any after a "---".
    const std::vector<YAML::Node> docs = YAML::LoadAll(yaml_text);
    if (docs.size() > 1) {
      throw ConfigError(source + ": holds " + std::to_string(docs.size()) +
                        " YAML documents (separated by ---); a config is one document");
    }
    const YAML::Node root = docs.empty() ? YAML::Node() : docs[0];
    if (!root.IsNull()) {
      if (!root.IsMap()) throw ConfigError(source + ": the top level must be a map of sections");
      size_t visited = 0;
      flatten(root, "", flat, source, visited);
    }
  } catch (const YAML::Exception& e) {
    throw ConfigError(source + ": YAML error: " + e.what());
  }
  for (const auto& o : overrides) {
    auto eq = o.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw ConfigError("--set '" + o + "': expected key=value, e.g. train.steps=200");
    }
    flat[o.substr(0, eq)] = o.substr(eq + 1);
  }
  Reader r(flat, source);
  TrainConfig c;
  c.source = source;
  c.run_dir = r.get<std::string>("run.dir", c.run_dir);
  c.seed = r.get<uint64_t>("run.seed", c.seed);
  c.device = r.get<std::string>("run.device", c.device);
  require(c.device == "cpu" || c.device == "cuda", r, "run.device", "must be cpu or cuda");
  require(c.device != "cuda" || cuda_compiled_in(), r, "run.device",
          "is cuda, but this build has no CUDA runtime compiled in (CMake found no cudart); use run.device=cpu");
  c.tf32 = r.get<bool>("run.tf32", c.tf32);
  c.deterministic = r.get<bool>("run.deterministic", c.deterministic);
  c.data_source = r.get<std::string>("data.source", c.data_source);
  require(c.data_source == "fashion-mnist" || c.data_source == "synthetic" || c.data_source == "hdf5", r,
          "data.source", "must be 'fashion-mnist', 'synthetic' or 'hdf5'");
  c.data_path = r.get<std::string>("data.path", c.data_path);
  c.synthetic_size = r.get<int64_t>("data.synthetic_size", c.synthetic_size);
  require(c.synthetic_size > 0, r, "data.synthetic_size", "must be > 0");
  c.prefetch_batches = r.get<int64_t>("data.prefetch_batches", c.prefetch_batches);
  require(c.prefetch_batches >= 1 && c.prefetch_batches <= 1024, r, "data.prefetch_batches", "must be 1 to 1024");
  c.steps = r.get<int64_t>("train.steps", c.steps);
  require(c.steps >= 0, r, "train.steps", "must be >= 0");
  c.global_batch = r.get<int64_t>("train.global_batch", c.global_batch);
  require(c.global_batch > 0, r, "train.global_batch", "must be > 0");
  c.micro_batches = r.get<int64_t>("train.micro_batches", c.micro_batches);
  require(c.micro_batches > 0 && c.global_batch % c.micro_batches == 0, r, "train.micro_batches",
          "must be > 0 and divide train.global_batch");
  c.log_every = r.get<int64_t>("train.log_every", c.log_every);
  require(c.log_every > 0, r, "train.log_every", "must be > 0");
  c.sample_every = r.get<int64_t>("train.sample_every", c.sample_every);
  require(c.sample_every >= 0, r, "train.sample_every", "must be >= 0");
  c.checkpoint_every = r.get<int64_t>("train.checkpoint_every", c.checkpoint_every);
  require(c.checkpoint_every >= 0, r, "train.checkpoint_every", "must be >= 0");
  c.keep_checkpoints = r.get<int64_t>("train.keep_checkpoints", c.keep_checkpoints);
  require(c.keep_checkpoints >= 1, r, "train.keep_checkpoints", "must be >= 1");
  c.threads = r.get<int64_t>("train.threads", c.threads);
  require(c.threads >= 0 && c.threads <= 1024, r, "train.threads", "must be 0 (cores / ranks) to 1024");
  std::string dtype = r.get<std::string>("model.dtype", "float32");
  require(dtype == "float32" || dtype == "float64", r, "model.dtype", "must be float32 or float64");
  c.model_dtype = dtype == "float64" ? at::kDouble : at::kFloat;
  c.family = make_family(r);
  c.d_steps = r.get<int64_t>("train.d_steps", c.d_steps);
  require(c.d_steps >= 1, r, "train.d_steps", "must be >= 1 (D steps per G step)");
  c.d_joint_pass = r.get<bool>("train.d_joint_pass", c.d_joint_pass);
  c.loss = r.get<std::string>("train.loss", c.loss);
  require(c.loss == "nonsaturating" || c.loss == "hinge", r, "train.loss",
          "must be nonsaturating (DCGAN) or hinge (BigGAN)");
  c.skip_memory_check = r.get<bool>("train.skip_memory_check", c.skip_memory_check);
  c.memory_probe = r.get<bool>("train.memory_probe", c.memory_probe);
  c.r1_gamma = r.get<double>("train.r1_gamma", c.r1_gamma);
  require(c.r1_gamma >= 0, r, "train.r1_gamma", "must be >= 0 (0 = off)");
  c.r1_every = r.get<int64_t>("train.r1_every", c.r1_every);
  require(c.r1_every >= 1, r, "train.r1_every", "must be >= 1");
  c.on_nonfinite = r.get<std::string>("train.on_nonfinite", c.on_nonfinite);
  require(c.on_nonfinite == "skip" || c.on_nonfinite == "abort", r, "train.on_nonfinite",
          "must be skip or abort");
  c.max_nonfinite_steps = r.get<int64_t>("train.max_nonfinite_steps", c.max_nonfinite_steps);
  require(c.max_nonfinite_steps >= 1, r, "train.max_nonfinite_steps", "must be >= 1");
  c.preempt_grace_s = r.get<double>("train.preempt_grace_s", c.preempt_grace_s);
  require(c.preempt_grace_s >= 0, r, "train.preempt_grace_s", "must be >= 0 (seconds; 0 = off)");
  c.eval_enabled = r.get<bool>("eval.enabled", c.eval_enabled);
  c.eval_every = r.get<int64_t>("train.eval_every", c.eval_every);
  require(c.eval_every >= 0, r, "train.eval_every", "must be >= 0 (0 = only at the end)");
  c.eval_samples = r.get<int64_t>("train.eval_samples", c.eval_samples);
  require(c.eval_samples >= 2 && c.eval_samples <= 10000000, r, "train.eval_samples", "must be 2 to 1e7");
  c.eval_classifier = r.get<std::string>("eval.classifier", c.eval_classifier);
  c.eval_reference = r.get<std::string>("eval.reference", c.eval_reference);
  c.plots = r.get<bool>("train.plots", c.plots);
  c.g_sharding = read_sharding(r, "generator");
  c.d_sharding = read_sharding(r, "discriminator");
  c.g_replicate_degree = read_replicate_degree(r, "generator", c.g_sharding);
  c.d_replicate_degree = read_replicate_degree(r, "discriminator", c.d_sharding);
  c.g_optim = read_optim(r, "generator", c.steps);
  c.d_optim = read_optim(r, "discriminator", c.steps);
  read_offload(r, c);
  c.grad_clip = r.get<double>("train.grad_clip", c.grad_clip);
  require(c.grad_clip >= 0, r, "train.grad_clip", "must be >= 0 (0 = off)");
  c.ema_enabled = r.get<bool>("ema.enabled", c.ema_enabled);
  c.ema.decay = r.get<double>("ema.decay", c.ema.decay);
  require(c.ema.decay >= 0 && c.ema.decay <= 1, r, "ema.decay", "must be in [0, 1]");
  c.ema.start_step = r.get<int64_t>("ema.start_step", c.ema.start_step);
  require(c.ema.start_step >= 0, r, "ema.start_step", "must be >= 0");
  require(!c.ema_enabled || c.g_optim.offload.param == OffloadDevice::kNone, r, "ema.enabled",
          "cannot be true with offload.generator.param: the EMA reads and swaps the generator's master shards, "
          "which live in the offload tier (set ema.enabled: false, or offload.generator.param: none)");
  c.loss_scale.init_scale = r.get<double>("loss_scale.init_scale", c.loss_scale.init_scale);
  require(c.loss_scale.init_scale > 0, r, "loss_scale.init_scale", "must be > 0");
  c.loss_scale.growth_interval = r.get<int64_t>("loss_scale.growth_interval", c.loss_scale.growth_interval);
  require(c.loss_scale.growth_interval >= 1, r, "loss_scale.growth_interval", "must be >= 1");
  c.loss_scale.hysteresis = r.get<int64_t>("loss_scale.hysteresis", c.loss_scale.hysteresis);
  require(c.loss_scale.hysteresis >= 1, r, "loss_scale.hysteresis", "must be >= 1");
  c.backend = r.get<std::string>("dist.backend", c.device == "cuda" ? "nccl" : "mpi");
  require(c.backend == "mpi" || c.backend == "nccl", r, "dist.backend", "must be mpi or nccl");
  require(c.backend != "nccl" || c.device == "cuda", r, "dist.backend",
          "nccl needs run.device=cuda: NCCL moves GPU tensors only (use dist.backend=mpi on cpu)");
  require(c.backend != "mpi" || c.device == "cpu", r, "dist.backend",
          "mpi needs run.device=cpu: the MPI backend moves host tensors only (use dist.backend=nccl, the default "
          "on cuda)");
  c.timeout_s = r.get<double>("dist.timeout_s", c.timeout_s);
  // At most about 31 years: longer ones overflow the clock's deadline arithmetic.
  require(c.timeout_s > 0 && c.timeout_s <= 1e9, r, "dist.timeout_s", "must be > 0 and at most 1e9 (seconds)");
  c.blocking_wait = r.get<bool>("dist.blocking_wait", c.blocking_wait);
  require(!c.blocking_wait || c.backend == "nccl", r, "dist.blocking_wait",
          "needs dist.backend nccl: the MPI backend always waits on the host (set it to false)");
  c.progress_thread = r.get<bool>("dist.progress_thread", c.progress_thread);
  require(!c.progress_thread || c.backend == "mpi", r, "dist.progress_thread",
          "needs dist.backend mpi: NCCL progresses on its own streams (set it to false)");
  c.progress_interval_us = r.get<double>("dist.progress_interval_us", c.progress_interval_us);
  require(c.progress_interval_us >= 1 && c.progress_interval_us <= 1e6, r, "dist.progress_interval_us",
          "must be 1 to 1e6 (microseconds)");
  for (auto [who, R] : {std::pair{"generator", c.g_replicate_degree}, std::pair{"discriminator", c.d_replicate_degree}}) {
    require(R == 1 || c.backend == "mpi", r, std::string("sharding.") + who + ".replicate_degree",
            "> 1 needs dist.backend mpi: the NCCL communicator cannot split into replica groups yet");
  }
  r.check_all_known();
  c.resolved_yaml = r.resolved();
  return c;
}

TrainConfig load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path);
  if (!in) throw ConfigError("cannot open config file '" + path + "': check the path");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_config(ss.str(), path, overrides);
}

}  // namespace shardgan
