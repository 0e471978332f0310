#include "shardgan/train/config.h"

#include <algorithm>
#include <cmath>
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

void require(bool ok, Reader& r, const std::string& key, const std::string& what) {
  r.require(ok, key, what);
}

ShardingConfig read_sharding(Reader& r, const std::string& who) {
  ShardingConfig c;
  const std::string k = "sharding." + who + ".stage";
  c.stage = r.get<int>(k, 3,
      "ZeRO stage of this model: 0 replicates everything, 1 shards optimizer state, 2 also gradients, 3 also "
      "parameters (gathered per unit)");
  require(c.stage >= 0 && c.stage <= 3, r, k, "must be 0, 1, 2 or 3");
  c.reshard_after_forward = r.get<bool>("sharding." + who + ".reshard_after_forward", true,
      "stage 3: free gathered parameters after forward and gather again for backward (FSDP's reshard_after_forward)");
  c.activation_checkpointing = r.get<bool>("sharding." + who + ".activation_checkpointing", false,
      "recompute each unit's forward in backward, keeping only its inputs (bit-identical results)");
  c.checkpoint_segments = r.get<bool>("sharding." + who + ".checkpoint_segments", false,
      "with activation checkpointing: also checkpoint the segments a model family marks inside a unit");
  require(!c.checkpoint_segments || c.activation_checkpointing, r, "sharding." + who + ".checkpoint_segments",
          "needs sharding." + who + ".activation_checkpointing: true (segments are checkpointed inside a "
          "checkpointed unit)");
  c.read_ahead = r.get<bool>("sharding." + who + ".read_ahead", true,
      "stage 3 with parameter offload: read the unit after next's master shard on a worker thread");
  c.node_shared_gather = r.get<bool>("sharding." + who + ".node_shared_gather", false,
      "stage 3 on the CPU, one host: gathered parameters live once per node in shared memory");
  for (const char* what : {"compute_dtype", "reduce_dtype"}) {
    const std::string key = "sharding." + who + "." + what;
    const std::string v = r.get<std::string>(
        key, "auto",
        std::string(what) == "compute_dtype"
            ? "mixed precision: dtype the gathered parameters are computed in (auto: the master dtype)"
            : "mixed precision: dtype gradients are reduced in (auto: the master dtype)");
    require(v == "auto" || v == "float32" || v == "float64" || v == "bfloat16" || v == "float16",
            r, key, "must be auto (the model dtype), float32, float64, bfloat16 or float16");
    c10::optional<at::ScalarType> t;
    if (v == "float32") t = at::kFloat;
    if (v == "float64") t = at::kDouble;
    if (v == "bfloat16") t = at::kBFloat16;
    if (v == "float16") t = at::kHalf;
    (std::string(what) == "compute_dtype" ? c.compute_dtype : c.reduce_dtype) = t;
  }
  // ZeRO++'s quantized collectives (comm/quantize.h).
  const std::string qw = "sharding." + who + ".quantized_weights", qg = "sharding." + who + ".quantized_gradients";
  const std::string w = r.get<std::string>(qw, "none",
      "stage 3: gather parameters as int8 blocks with a float32 scale each (ZeRO++ qwZ): none or int8");
  require(w == "none" || w == "int8", r, qw, "must be none or int8");
  require(w == "none" || c.stage == 3, r, qw, "needs sharding." + who + ".stage 3 (qwZ quantizes the per-unit "
          "all-gather of parameter shards)");
  c.quantized_weights_bits = w == "int8" ? 8 : 0;
  const std::string g = r.get<std::string>(qg, "none",
      "stages 2-3: reduce-scatter gradients as int8 or int4 blocks through an all-to-all, summed in float32 "
      "(ZeRO++ qgZ; under HSDP also the cross-replica average): none, int8 or int4");
  require(g == "none" || g == "int8" || g == "int4", r, qg, "must be none, int8 or int4");
  require(g == "none" || c.stage >= 2, r, qg, "needs sharding." + who + ".stage 2 or 3 (qgZ quantizes the "
          "reduce-scatter of every micro-batch's gradients)");
  c.quantized_gradients_bits = g == "none" ? 0 : g == "int8" ? 8 : 4;
  const std::string qb = "sharding." + who + ".quantization_block";
  c.quantization_block = r.get<int64_t>(qb, c.quantization_block,
      "elements per float32 scale of the quantized collectives");
  require(c.quantization_block >= 2 && c.quantization_block % 2 == 0 && c.quantization_block <= (int64_t{1} << 24),
          r, qb, "must be even, from 2 to 16777216");
  return c;
}

// `key`: an integer >= 1 (default 1), or auto, returned as 0 (one group per node).
int read_group_count(Reader& r, const std::string& key, const char* meaning, const std::string& what) {
  const std::string v = r.get<std::string>(key, "1", meaning);
  if (v == "auto") return 0;
  char* end = nullptr;
  const long x = std::strtol(v.c_str(), &end, 10);
  require(!v.empty() && *end == '\0' && x >= 1 && x <= 1 << 20, r, key, "must be auto (one group per node) or " + what);
  return static_cast<int>(x);
}

// sharding.<who>.replicate_degree: an integer >= 1, or auto (0: one group per node).
int read_replicate_degree(Reader& r, const std::string& who, const ShardingConfig& sc) {
  const std::string key = "sharding." + who + ".replicate_degree";
  const int R = read_group_count(r, key,
      "hybrid sharding (HSDP): replica groups; the model is sharded inside a group and replicated across groups (auto: "
      "one group per node)",
      "an integer >= 1 (the number of replica groups)");
  require(R == 1 || sc.stage >= 1, r, key,
          "needs sharding." + who + ".stage 1, 2 or 3: stage 0 already replicates everything on every rank");
  return R;
}

// sharding.<who>.hpz_partition_size: an integer >= 1 (1: off), or auto (0: one group per node).
void read_hpz(Reader& r, const std::string& who, ShardingConfig& sc, int replicate_degree) {
  const std::string key = "sharding." + who + ".hpz_partition_size";
  const int K = read_group_count(r, key,
      "stage 3, ZeRO++ hpZ: ranks of a secondary group (usually a node's) that keeps a copy of each gathered unit "
      "split K ways, so that its later gathers until the next update stay in the group (1: off; auto: one group per "
      "node)",
      "an integer >= 1 (ranks per secondary group; 1 turns hpZ off)");
  require(K == 1 || sc.stage == 3, r, key,
          "needs sharding." + who + ".stage 3: hpZ keeps a secondary copy of the parameters that stage 3 gathers");
  require(K == 1 || replicate_degree == 1, r, key,
          "cannot be combined with sharding." + who + ".replicate_degree (HSDP already keeps the gathers inside a "
          "replica group; set one of them to 1)");
  sc.hpz_partition_size = K;
}

OptimizerConfig read_optim(Reader& r, const std::string& who, int64_t steps) {
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
  shared.path = r.get<std::string>(
      "offload.path", "", "folder for the disk tier's files, one per rank and model (empty: <run.dir>/offload)");
  shared.buffer_bytes = r.get<int64_t>("offload.buffer_bytes", shared.buffer_bytes,
      "bytes of one streaming buffer of the offload ring");
  require(shared.buffer_bytes >= (int64_t{1} << 20) && shared.buffer_bytes <= (int64_t{1} << 34) &&
              shared.buffer_bytes % 4096 == 0,
          r, "offload.buffer_bytes", "must be a multiple of 4096 from 1048576 (1 MiB) to 17179869184 (16 GiB)");
  shared.buffer_count = r.get<int64_t>("offload.buffer_count", shared.buffer_count,
      "buffers in the offload ring; the disk tier's RAM is at most buffer_count x buffer_bytes");
  require(shared.buffer_count >= 2 && shared.buffer_count <= 64, r, "offload.buffer_count", "must be 2 to 64");
  shared.queue_depth = r.get<int64_t>("offload.queue_depth", shared.queue_depth, "io_uring submission queue entries");
  require(shared.queue_depth >= 1 && shared.queue_depth <= 4096, r, "offload.queue_depth", "must be 1 to 4096");
  shared.overlap_copies = r.get<bool>("offload.overlap_copies", shared.overlap_copies,
      "with shards on a GPU: overlap device-host copies with the CPU Adam step (same bits)");
  shared.copy_block_bytes = r.get<int64_t>("offload.copy_block_bytes", shared.copy_block_bytes,
      "bytes of one overlapped copy block");
  require(shared.copy_block_bytes >= 4096 && shared.copy_block_bytes <= (int64_t{1} << 34) &&
              shared.copy_block_bytes % 4096 == 0,
          r, "offload.copy_block_bytes", "must be a multiple of 4096 from 4096 to 17179869184 (16 GiB)");
  for (auto [who, oc, sc] : {std::tuple{"generator", &c.g_optim, &c.g_sharding},
                             std::tuple{"discriminator", &c.d_optim, &c.d_sharding}}) {
    OffloadConfig o = shared;
    const std::string w = who;
    for (auto [what, dst] : {std::pair{"optimizer", &o.optimizer}, std::pair{"param", &o.param},
                             std::pair{"gradient", &o.gradient}}) {
      const std::string key = "offload." + w + "." + what;
      try {
        *dst = parse_offload_device(r.get<std::string>(
            key, "none", "offload this model's optimizer state / master parameters / reduced gradient shards: none, cpu or disk"));
      } catch (const std::invalid_argument& e) {
        throw ConfigError(r.source() + ": key '" + key + "' " + e.what());
      }
    }
    require(o.optimizer == OffloadDevice::kNone || oc->type == OptimizerType::kAdam || oc->type == OptimizerType::kAdamW,
            r, "offload." + w + ".optimizer",
            "needs optim." + w + ".type adam or adamw: the offloaded step is the fused CPU Adam");
    require(o.param == OffloadDevice::kNone || sc->stage == 3, r, "offload." + w + ".param",
            "needs sharding." + w + ".stage 3: parameter offload moves parameter shards, which only stage 3 keeps");
    require(o.param == OffloadDevice::kNone || o.param == o.optimizer, r, "offload." + w + ".param",
            "needs offload." + w + ".optimizer on the same device (" + to_string(o.param) +
                "): the master shard and its Adam moments share one store");
    require(o.gradient == OffloadDevice::kNone || sc->stage >= 2, r, "offload." + w + ".gradient",
            "needs sharding." + w + ".stage 2 or 3: gradient offload moves gradient shards, which stages 0 and 1 do not keep");
    require(o.gradient == OffloadDevice::kNone || o.gradient == o.optimizer, r, "offload." + w + ".gradient",
            "needs offload." + w + ".optimizer on the same device (" + to_string(o.gradient) +
                "): the offloaded Adam step reads the gradient beside its moments");
    oc->offload = o;
  }
}

}  // namespace

namespace {
TrainConfig read_config(Reader& r, const std::string& source);
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
  return read_config(r, source);
}

namespace {

TrainConfig read_config(Reader& r, const std::string& source) {
  TrainConfig c;
  c.source = source;
  c.run_dir = r.get<std::string>("run.dir", c.run_dir, "run folder: samples, metrics.jsonl, plots, checkpoints, log");
  c.seed = r.get<uint64_t>("run.seed", c.seed, "seed of parameters, latents and data order");
  c.device = r.get<std::string>("run.device", c.device, "cpu or cuda (each rank computes on cuda:<local rank>)");
  require(c.device == "cpu" || c.device == "cuda", r, "run.device", "must be cpu or cuda");
  require(c.device != "cuda" || cuda_compiled_in(), r, "run.device",
          "cuda needs a build with the CUDA runtime compiled in (this one has none: CMake found no cudart); use "
          "run.device=cpu");
  c.tf32 = r.get<bool>("run.tf32", c.tf32,
      "cuda only: cuDNN convolutions may compute float32 in TF32 (PyTorch's default)");
  c.deterministic = r.get<bool>("run.deterministic", c.deterministic,
      "torch's deterministic algorithms (for bit-for-bit comparisons on a GPU; slower)");
  c.data_source = r.get<std::string>("data.source", c.data_source,
      "fashion-mnist (idx files, in RAM), synthetic, hdf5 (read per rank in chunks), or paired (a folder of "
      "pix2pix A|B images, in RAM)");
  require(c.data_source == "fashion-mnist" || c.data_source == "synthetic" || c.data_source == "hdf5" ||
              c.data_source == "paired",
          r, "data.source", "must be 'fashion-mnist', 'synthetic', 'hdf5' or 'paired'");
  c.data_path = r.get<std::string>("data.path", c.data_path,
      "the Fashion-MNIST folder, the .h5 file for data.source hdf5, or the folder of A|B images for paired");
  c.synthetic_size = r.get<int64_t>("data.synthetic_size", c.synthetic_size, "images in the synthetic dataset");
  require(c.synthetic_size > 0, r, "data.synthetic_size", "must be > 0");
  c.prefetch_batches = r.get<int64_t>("data.prefetch_batches", c.prefetch_batches,
      "hdf5 read-ahead queue, in micro-batches");
  require(c.prefetch_batches >= 1 && c.prefetch_batches <= 1024, r, "data.prefetch_batches", "must be 1 to 1024");
  c.steps = r.get<int64_t>("train.steps", c.steps,
      "total training steps (each: train.d_steps D updates, then one G update)");
  require(c.steps >= 0, r, "train.steps", "must be >= 0");
  c.global_batch = r.get<int64_t>("train.global_batch", c.global_batch, "images per step over all ranks, split evenly");
  require(c.global_batch > 0, r, "train.global_batch", "must be > 0");
  c.micro_batches = r.get<int64_t>("train.micro_batches", c.micro_batches,
      "gradient accumulation: micro-batches per step (divides the global batch)");
  require(c.micro_batches > 0 && c.global_batch % c.micro_batches == 0, r, "train.micro_batches",
          "must be > 0 and divide train.global_batch");
  c.log_every = r.get<int64_t>("train.log_every", c.log_every, "steps between log lines and metrics.jsonl records");
  require(c.log_every > 0, r, "train.log_every", "must be > 0");
  c.sample_every = r.get<int64_t>("train.sample_every", c.sample_every,
      "steps between sample grids (0: only at the end)");
  require(c.sample_every >= 0, r, "train.sample_every", "must be >= 0");
  c.checkpoint_every = r.get<int64_t>("train.checkpoint_every", c.checkpoint_every,
      "steps between checkpoints (0: only at the end)");
  require(c.checkpoint_every >= 0, r, "train.checkpoint_every", "must be >= 0");
  c.keep_checkpoints = r.get<int64_t>("train.keep_checkpoints", c.keep_checkpoints,
      "newest committed checkpoints kept");
  require(c.keep_checkpoints >= 1, r, "train.keep_checkpoints", "must be >= 1");
  c.final_checkpoint = r.get<bool>("train.final_checkpoint", c.final_checkpoint,
      "save a checkpoint at the end of the run (false: only the periodic and preemption saves)");
  c.threads = r.get<int64_t>("train.threads", c.threads, "torch threads per rank (0: the node's cores / local ranks)");
  require(c.threads >= 0 && c.threads <= 1024, r, "train.threads", "must be 0 (cores / ranks) to 1024");
  std::string dtype = r.get<std::string>(
      "model.dtype", "float32", "dtype of the master parameters and optimizer state: float32 or float64");
  require(dtype == "float32" || dtype == "float64", r, "model.dtype", "must be float32 or float64");
  c.model_dtype = dtype == "float64" ? at::kDouble : at::kFloat;
  c.family = make_family(r);
  c.d_steps = r.get<int64_t>("train.d_steps", c.d_steps, "D updates per G update (BigGAN uses 2)");
  require(c.d_steps >= 1, r, "train.d_steps", "must be >= 1 (D steps per G step)");
  c.d_joint_pass = r.get<bool>("train.d_joint_pass", c.d_joint_pass,
      "D sees fake and real images of a micro-batch in one forward and backward (BigGAN-PyTorch's G_D)");
  c.update = r.get<std::string>("train.update", c.update,
      "alternating (D's steps, then G against the updated D) or simultaneous (ParaGAN: G and D each against the "
      "other's weights of before the step; one G forward serves both)");
  require(c.update == "alternating" || c.update == "simultaneous", r, "train.update",
          "must be alternating or simultaneous");
  c.shared_d_forward = r.get<bool>("train.shared_d_forward", c.shared_d_forward,
      "train.update simultaneous: one D forward on the fakes serves G's image gradient and D's fake term (D "
      "gathered whole for that pass at stage 3, as for R1); false: two forwards, D released unit by unit");
  c.placement = r.get<std::string>("train.placement", c.placement,
      "shared (G and D each sharded over every rank) or split (ParaGAN: ranks [0, K) hold only G, the rest only "
      "D; only images and their gradients cross)");
  require(c.placement == "shared" || c.placement == "split", r, "train.placement", "must be shared or split");
  c.generator_ranks = r.get<double>("placement.generator_ranks", c.generator_ranks,
      "train.placement split: G's ranks K, a count >= 1 or a fraction in (0, 1) of the world size");
  require(c.generator_ranks > 0 && std::isfinite(c.generator_ranks) &&
              (c.generator_ranks < 1 || c.generator_ranks == std::floor(c.generator_ranks)),
          r, "placement.generator_ranks", "must be a whole number of ranks >= 1 or a fraction in (0, 1)");
  c.defer_figures = r.get<bool>("placement.defer_figures", c.defer_figures,
      "train.placement split: true waits for a step's losses, NaN/Inf verdicts and preemption votes after the next "
      "step (neither group waits for the other; logs, aborts and stops come a step later); false at its end");
  c.loss = r.get<std::string>("train.loss", c.loss,
      "nonsaturating (DCGAN, pix2pix's vanilla), hinge (BigGAN) or least_squares (LSGAN)");
  require(c.loss == "nonsaturating" || c.loss == "hinge" || c.loss == "least_squares", r, "train.loss",
          "must be nonsaturating (DCGAN), hinge (BigGAN) or least_squares (LSGAN)");
  const bool paired = c.family->condition_channels() > 0;
  c.l1_weight = r.get<double>("train.l1_weight", paired ? 100.0 : 0.0,
      "image-to-image models: weight of the L1 term mean|G(A) - B| in G's loss (pix2pix: 100)");
  require(c.l1_weight >= 0 && std::isfinite(c.l1_weight), r, "train.l1_weight", "must be >= 0");
  c.adversarial_weight = r.get<double>("train.adversarial_weight", c.adversarial_weight,
      "image-to-image models: weight of the adversarial term in G's loss (0: G trains on L1 alone, the paper's L1 "
      "baseline; D still trains)");
  require(c.adversarial_weight >= 0 && std::isfinite(c.adversarial_weight), r, "train.adversarial_weight", "must be >= 0");
  require(paired || c.adversarial_weight == 1, r, "train.adversarial_weight",
          "needs an image-to-image model (model.arch: pix2pix); set it to 1");
  require(paired || c.l1_weight == 0, r, "train.l1_weight",
          "needs an image-to-image model (model.arch: pix2pix); set it to 0");
  require(paired || c.data_source != "paired", r, "data.source",
          "paired needs an image-to-image model (model.arch: pix2pix)");
  require(c.data_source != "paired" || c.family->condition_channels() == c.family->image_shape().channels, r,
          "model.in_channels", "must equal model.channels with data.source paired (A and B halves of one image)");
  c.aux_class_weight = r.get<double>("train.aux_class_weight", c.aux_class_weight,
      "AC-GAN: weight of the cross-entropy of D's class head, on real images in D's loss and on G's images "
      "in G's loss (0: off)");
  require(c.aux_class_weight >= 0 && std::isfinite(c.aux_class_weight), r, "train.aux_class_weight", "must be >= 0");
  require(c.aux_class_weight == 0 || c.family->discriminator_classifies(), r, "train.aux_class_weight",
          "needs a discriminator with a class head (model.arch biggan with model.d_class_head: true); set it to 0");
  require(!c.family->discriminator_classifies() || c.aux_class_weight > 0, r, "model.d_class_head",
          "adds a class head to D that only train.aux_class_weight > 0 trains: set that weight, or remove the head");
  require(!paired || c.update == "alternating", r, "train.update",
          "must be alternating for an image-to-image model (model.arch pix2pix): G's pass trains on the pairs of "
          "D's update");

  c.skip_memory_check = r.get<bool>("train.skip_memory_check", c.skip_memory_check,
      "skip the memory pre-flight that refuses a config that would not fit");
  c.skip_disk_check = r.get<bool>("train.skip_disk_check", c.skip_disk_check,
      "skip the disk pre-flight that refuses a run whose offload files or checkpoints would not fit on their disk");
  c.memory_probe = r.get<bool>("train.memory_probe", c.memory_probe,
      "the pre-flight measures one step's transient memory on a stand-in world (CPU, no HSDP)");
  c.r1_gamma = r.get<double>("train.r1_gamma", c.r1_gamma, "R1 penalty weight on real images (0: off)");
  require(c.r1_gamma >= 0, r, "train.r1_gamma", "must be >= 0 (0 = off)");
  c.r1_every = r.get<int64_t>("train.r1_every", c.r1_every, "lazy R1: every k-th D update (StyleGAN2: 16)");
  require(c.r1_every >= 1, r, "train.r1_every", "must be >= 1");
  c.on_nonfinite = r.get<std::string>("train.on_nonfinite", c.on_nonfinite,
      "a NaN/Inf in a model's loss or gradients: skip that update, or abort the job");
  require(c.on_nonfinite == "skip" || c.on_nonfinite == "abort", r, "train.on_nonfinite",
          "must be skip or abort");
  c.max_nonfinite_steps = r.get<int64_t>("train.max_nonfinite_steps", c.max_nonfinite_steps,
      "skipped steps in a row before the job ends anyway");
  require(c.max_nonfinite_steps >= 1, r, "train.max_nonfinite_steps", "must be >= 1");
  c.preempt_grace_s = r.get<double>("train.preempt_grace_s", c.preempt_grace_s,
      "seconds between a preemption signal and the kill (0: finish the step, then save)");
  require(c.preempt_grace_s >= 0, r, "train.preempt_grace_s", "must be >= 0 (seconds; 0 = off)");
  c.time_limit_s = r.get<double>("train.time_limit_s", c.time_limit_s,
      "stop after the first step that ends this many seconds into training, then evaluate, save and "
      "sample as at train.steps (0: off; runs of equal wall time)");
  require(c.time_limit_s >= 0, r, "train.time_limit_s", "must be >= 0 (seconds; 0 = off)");
  c.eval_enabled = r.get<bool>("eval.enabled", c.eval_enabled,
      "compute FID and class accuracy (needs eval.classifier)");
  c.eval_every = r.get<int64_t>("train.eval_every", c.eval_every,
      "steps between evaluations (0: only at the end, if eval.enabled)");
  require(c.eval_every >= 0, r, "train.eval_every", "must be >= 0 (0 = only at the end)");
  c.eval_samples = r.get<int64_t>("train.eval_samples", c.eval_samples,
      "generated images per evaluation, split over ranks");
  require(c.eval_samples >= 2 && c.eval_samples <= 10000000, r, "train.eval_samples", "must be 2 to 1e7");
  c.eval_classifier = r.get<std::string>("eval.classifier", c.eval_classifier,
      "the classifier file from `shardgan-fid train-classifier`");
  c.eval_reference = r.get<std::string>("eval.reference", c.eval_reference,
      "Fashion-MNIST folder whose t10k split gives the real feature statistics");
  c.eval_truncation = r.get<double>("eval.truncation", c.eval_truncation,
      "evaluations also score G and its EMA on latents with |z| above this redrawn (BigGAN's "
      "truncation trick, Brock et al. 2019, section 3.1: fidelity for variety; 0: off)");
  require(c.eval_truncation == 0 || c.eval_truncation >= 0.05, r, "eval.truncation",
          "must be 0 (off) or at least 0.05");
  require(c.eval_truncation == 0 || c.family->gaussian_latents(), r, "eval.truncation",
          "must be 0 (off) for model.arch pix2pix, whose latents are dropout seeds, not Gaussian");
  c.plots = r.get<bool>("train.plots", c.plots, "write plots/*.png with gnuplot (warns once if gnuplot is missing)");
  c.g_sharding = read_sharding(r, "generator");
  c.d_sharding = read_sharding(r, "discriminator");
  c.g_replicate_degree = read_replicate_degree(r, "generator", c.g_sharding);
  c.d_replicate_degree = read_replicate_degree(r, "discriminator", c.d_sharding);
  read_hpz(r, "generator", c.g_sharding, c.g_replicate_degree);
  read_hpz(r, "discriminator", c.d_sharding, c.d_replicate_degree);
  c.g_optim = read_optim(r, "generator", c.steps);
  c.d_optim = read_optim(r, "discriminator", c.steps);
  read_offload(r, c);
  c.grad_clip = r.get<double>("train.grad_clip", c.grad_clip, "global gradient-norm bound per model (0: off)");
  require(c.grad_clip >= 0, r, "train.grad_clip", "must be >= 0 (0 = off)");
  c.ema_enabled = r.get<bool>("ema.enabled", c.ema_enabled,
      "keep a sharded EMA of G's parameters, and sample and evaluate it too");
  c.ema.decay = r.get<double>("ema.decay", c.ema.decay, "EMA decay per step");
  require(c.ema.decay >= 0 && c.ema.decay <= 1, r, "ema.decay", "must be in [0, 1]");
  c.ema.start_step = r.get<int64_t>("ema.start_step", c.ema.start_step,
      "step at which the EMA starts (before: a copy of G)");
  require(c.ema.start_step >= 0, r, "ema.start_step", "must be >= 0");
  require(!c.ema_enabled || c.g_optim.offload.param == OffloadDevice::kNone, r, "ema.enabled",
          "cannot be true with offload.generator.param: the EMA reads and swaps the generator's master shards, "
          "which live in the offload tier (set ema.enabled: false, or offload.generator.param: none)");
  c.loss_scale.init_scale = r.get<double>("loss_scale.init_scale", c.loss_scale.init_scale,
      "initial dynamic loss scale (float16 compute only)");
  require(c.loss_scale.init_scale > 0, r, "loss_scale.init_scale", "must be > 0");
  c.loss_scale.growth_interval = r.get<int64_t>("loss_scale.growth_interval", c.loss_scale.growth_interval,
      "overflow-free steps before the loss scale doubles");
  require(c.loss_scale.growth_interval >= 1, r, "loss_scale.growth_interval", "must be >= 1");
  c.loss_scale.hysteresis = r.get<int64_t>("loss_scale.hysteresis", c.loss_scale.hysteresis,
      "overflows tolerated before the loss scale halves");
  require(c.loss_scale.hysteresis >= 1, r, "loss_scale.hysteresis", "must be >= 1");
  c.backend = r.get<std::string>(
      "dist.backend", c.device == "cuda" ? "nccl" : "mpi",
      "mpi (host tensors; the default with run.device cpu) or nccl (GPU tensors; the default with run.device cuda)");
  require(c.backend == "mpi" || c.backend == "nccl", r, "dist.backend", "must be mpi or nccl");
  require(c.backend != "nccl" || c.device == "cuda", r, "dist.backend",
          "nccl needs run.device=cuda: NCCL moves GPU tensors only (use dist.backend=mpi on cpu)");
  require(c.backend != "mpi" || c.device == "cpu", r, "dist.backend",
          "mpi needs run.device=cpu: the MPI backend moves host tensors only (use dist.backend=nccl, the default "
          "on cuda)");
  c.timeout_s = r.get<double>("dist.timeout_s", c.timeout_s,
      "timeout of every collective, in seconds; a rank that waits longer ends the job");
  // At most about 31 years: longer ones overflow the clock's deadline arithmetic.
  require(c.timeout_s > 0 && c.timeout_s <= 1e9, r, "dist.timeout_s", "must be > 0 and at most 1e9 (seconds)");
  c.blocking_wait = r.get<bool>("dist.blocking_wait", c.blocking_wait,
      "nccl only: waits block the host until the collective finished");
  require(!c.blocking_wait || c.backend == "nccl", r, "dist.blocking_wait",
          "needs dist.backend nccl: the MPI backend always waits on the host (set it to false)");
  c.progress_thread = r.get<bool>("dist.progress_thread", c.progress_thread,
      "mpi only: a helper thread drives in-flight collectives during compute");
  require(!c.progress_thread || c.backend == "mpi", r, "dist.progress_thread",
          "needs dist.backend mpi: NCCL progresses on its own streams (set it to false)");
  c.progress_interval_us = r.get<double>("dist.progress_interval_us", c.progress_interval_us,
      "progress thread polling interval, in microseconds");
  require(c.progress_interval_us >= 1 && c.progress_interval_us <= 1e6, r, "dist.progress_interval_us",
          "must be 1 to 1e6 (microseconds)");
  for (auto [who, sc] : {std::pair{"generator", &c.g_sharding}, std::pair{"discriminator", &c.d_sharding}}) {
    require(sc->quantized_gradients_bits == 0 || c.backend == "mpi", r,
            std::string("sharding.") + who + ".quantized_gradients",
            "needs dist.backend mpi: the NCCL backend has no all-to-all yet (set it to none)");
  }
  c.checkpoint_async = r.get<bool>("checkpoint.async", c.checkpoint_async,
      "write checkpoints in the background: training waits only for a snapshot (at most one save in flight)");
  require(!c.checkpoint_async || c.backend == "mpi", r, "checkpoint.async",
          "needs dist.backend mpi: the background commit needs a communicator of its own, which the NCCL "
          "backend cannot split off yet (set checkpoint.async: false)");
  for (const auto* o : {&c.g_optim.offload, &c.d_optim.offload}) {
    require(!c.checkpoint_async || !o->any(), r, "checkpoint.async",
            "cannot be true with offload.<model>.optimizer or .param: the snapshot would read the offloaded "
            "state back into memory (set checkpoint.async: false)");
  }
  c.checkpoint_snapshot = r.get<std::string>("checkpoint.snapshot", c.checkpoint_snapshot,
      "with checkpoint.async: fork (a copy-on-write child process writes the files) or copy (host staging "
      "buffers as big as the rank's checkpoint, written by a thread)");
  require(c.checkpoint_snapshot == "fork" || c.checkpoint_snapshot == "copy", r, "checkpoint.snapshot",
          "must be fork or copy");
  for (auto [who, R] : {std::pair{"generator", c.g_replicate_degree}, std::pair{"discriminator", c.d_replicate_degree}}) {
    require(R == 1 || c.backend == "mpi", r, std::string("sharding.") + who + ".replicate_degree",
            "> 1 needs dist.backend mpi: the NCCL communicator cannot split into replica groups yet");
  }
  for (auto [who, K] : {std::pair{"generator", c.g_sharding.hpz_partition_size},
                        std::pair{"discriminator", c.d_sharding.hpz_partition_size}}) {
    require(K == 1 || c.backend == "mpi", r, std::string("sharding.") + who + ".hpz_partition_size",
            "needs dist.backend mpi: the NCCL communicator cannot split into secondary groups yet (set it to 1)");
  }
  if (c.placement == "split") {
    for (auto [who, K] : {std::pair{"generator", c.g_sharding.hpz_partition_size},
                          std::pair{"discriminator", c.d_sharding.hpz_partition_size}}) {
      require(K != 0, r, std::string("sharding.") + who + ".hpz_partition_size",
              "auto (one secondary group per node) is not taken with train.placement split: give the secondary "
              "group's size in ranks, a divisor of the model's group (or 1 for off)");
    }
    require(c.backend == "mpi", r, "train.placement",
            "split needs dist.backend mpi: the images cross between the groups point to point, which the NCCL "
            "backend does not offer yet (set train.placement: shared)");
    for (auto [who, R] : {std::pair{"generator", c.g_replicate_degree},
                          std::pair{"discriminator", c.d_replicate_degree}}) {
      require(R != 0, r, std::string("sharding.") + who + ".replicate_degree",
              "auto (one replica group per node) is not taken with train.placement split: give the number of "
              "replica groups of the model's ranks, a divisor of them (or 1 for off)");
    }
  }
  r.check_all_known();
  c.resolved_yaml = r.resolved();
  c.resolved_nested_yaml = r.resolved_nested_yaml();
  return c;
}

std::string md_cell(std::string s) {
  for (size_t i = 0; (i = s.find('|', i)) != std::string::npos; i += 2) s.replace(i, 1, "\\|");
  return s;
}

}  // namespace

std::string config_reference_markdown() {
  struct Row {
    ConfigKeyInfo info;
    std::vector<std::pair<std::string, std::string>> arch_defaults;  // (arch, default)
  };
  std::map<std::string, Row> rows;
  std::vector<std::string> order;
  const std::vector<std::string>& archs = model_archs();
  for (const std::string& arch : archs) {
    Reader r({{"model.arch", arch}}, "(reference)");
    read_config(r, "(reference)");
    for (const std::string& key : r.read_order()) {
      auto [it, first] = rows.try_emplace(key);
      if (first) {
        order.push_back(key);
        it->second.info = r.keys().at(key);
      }
      it->second.arch_defaults.emplace_back(arch, r.keys().at(key).default_text);
    }
  }
  // Sections in the order they first appear; keys keep their read order inside a section
  // (BigGAN's model.* keys join DCGAN's instead of opening a second "model" section).
  std::vector<std::string> sections;
  for (const std::string& key : order) {
    const std::string head = key.substr(0, key.find('.'));
    if (std::find(sections.begin(), sections.end(), head) == sections.end()) sections.push_back(head);
  }
  auto section_index = [&](const std::string& key) {
    return std::find(sections.begin(), sections.end(), key.substr(0, key.find('.'))) - sections.begin();
  };
  std::stable_sort(order.begin(), order.end(),
                   [&](const std::string& a, const std::string& b) { return section_index(a) < section_index(b); });
  std::ostringstream md;
  md << "# Configuration reference\n\n"
     << "<!-- Generated by `shardgan-train --config-reference` from the config reader itself; do not edit by\n"
     << "     hand. The test config_reference fails when this page and the reader disagree. -->\n\n"
     << "Every key `shardgan-train` accepts, with its type, default, the rules it is checked against and what it\n"
     << "means. A config is one YAML file of sections (`train: {steps: 600}`); `--set key=value` overrides any\n"
     << "key with its dotted name (`--set train.steps=200`). `shardgan-train --print-config CONFIG [--set ...]`\n"
     << "prints the fully resolved config, defaults included, as YAML that reads back to the same run. An\n"
     << "unknown key is an error that suggests the nearest known one. Keys under `sharding`, `optim` and\n"
     << "`offload` exist once for `generator` and once for `discriminator`; each model has its own values.\n"
     << "The `model.*` keys depend on `model.arch`: a key marked with a family is read only for it.\n";
  std::string section;
  for (const std::string& key : order) {
    const Row& row = rows.at(key);
    const std::string head = key.substr(0, key.find('.'));
    if (head != section) {
      section = head;
      md << "\n## " << section << "\n\n| key | type | default | rules | meaning |\n|---|---|---|---|---|\n";
    }
    std::string def;
    bool same = true;
    for (auto& [a, d] : row.arch_defaults) same = same && d == row.arch_defaults.front().second;
    auto shown = [&](const std::string& d) { return d.empty() ? std::string("(empty)") : "`" + d + "`"; };
    if (same) {
      def = shown(row.arch_defaults.front().second);
    } else {
      for (auto& [a, d] : row.arch_defaults) def += (def.empty() ? "" : "; ") + a + ": " + shown(d);
    }
    std::string meaning = row.info.meaning;
    if (row.arch_defaults.size() < archs.size()) {
      std::string only;
      for (auto& [a, d] : row.arch_defaults) only += (only.empty() ? "" : ", ") + a;
      meaning = "(" + only + ") " + meaning;
    }
    std::string rules;
    for (auto& rule : row.info.rules) rules += (rules.empty() ? "" : "; ") + rule;
    md << "| `" << key << "` | " << row.info.type << " | " << md_cell(def) << " | " << md_cell(rules) << " | "
       << md_cell(meaning) << " |\n";
  }
  return md.str();
}

int split_generator_ranks(const TrainConfig& cfg, int world_size) {
  if (cfg.generator_ranks >= 1) return static_cast<int>(cfg.generator_ranks);
  return std::clamp(static_cast<int>(std::lround(cfg.generator_ranks * world_size)), 1, std::max(world_size - 1, 1));
}

TrainConfig load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path);
  if (!in) throw ConfigError("cannot open config file '" + path + "': check the path");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_config(ss.str(), path, overrides);
}

}  // namespace shardgan
